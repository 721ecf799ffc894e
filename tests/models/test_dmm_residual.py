"""DMM with the Res_q guide (thesis 4.8.1, eq. 5.12 form) against a hand-written reference.

``mu^(q)_t = mu^(p)(z_{t-1}) + W_l h_t`` with ``mu^(p)`` the gated-transition mean at the
guide's own ``z_{t-1}`` (the model's ``z_0`` at ``t = 1``); the scale is the combiner's. The
reference below writes the gated transition, the combiner, the ReLU RNN / tanh MLP encoders and
the emitter out with raw weight matrices (the style of ``test_reference_elbo.dmm_reference``).
"""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import Adam

from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models.dmm import DMM
from tests.models.reference import (
    bernoulli_logpmf,
    lin,
    normal_logpdf,
    randomize,
    relu_rnn_cell,
    softplus,
)
from tests.models.test_reference_elbo import dmm_reference

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def transition_ref(tr, z_prev):
    """Gated transition (Krishnan et al. 2017, eq. 8), written out."""
    gate = torch.sigmoid(lin(tr.gate, torch.relu(lin(tr.gate_hidden, z_prev))))
    prop = lin(tr.proposal, torch.relu(lin(tr.proposal_hidden, z_prev)))
    loc = (1 - gate) * lin(tr.linear, z_prev) + gate * prop
    return loc, tr.min_scale + softplus(lin(tr.raw_scale, torch.relu(prop)))


def dmm_residual_reference(m, x, zs, inference="smoothing"):
    """Per step (log p(x_t|z_t), log p(z_t|z_{t-1}), log q(z_t|z_{t-1},a_t)) of one sequence."""
    T, _ = x.shape
    if inference == "smoothing":
        a, g = [None] * T, m.encoder.h0
        for t in reversed(range(T)):  # eq. 4.8 (ReLU RNN), learned a_{T+1}
            g = relu_rnn_cell(m.encoder.rnn, x[t], g)
            a[t] = g
    else:  # Fig. 4.2b: a_t = tanh(W_2 tanh(W_1 x_t + b_1) + b_2)
        enc = m.encoder
        a = [torch.tanh(lin(enc[2], torch.tanh(lin(enc[0], x[t])))) for t in range(T)]
    cb, e = m.combiner, m.emitter
    terms, z_prev, zq_prev = [], m.z_0, m.z_q_0
    for t in range(T):
        p_loc, p_scale = transition_ref(m.transition, z_prev)
        hc = 0.5 * (torch.tanh(lin(cb.z_to_hidden, zq_prev)) + a[t])
        # Res_q: the prior mean at the guide's z_{t-1} (z_0 at the first step) plus the residual
        q_loc = transition_ref(m.transition, z_prev)[0] + lin(cb.loc, hc)
        q_scale = cb.min_scale + softplus(lin(cb.raw_scale, hc))
        logits = lin(e[4], torch.relu(lin(e[2], torch.relu(lin(e[0], zs[t])))))
        terms.append(
            (
                bernoulli_logpmf(x[t], logits),
                normal_logpdf(zs[t], p_loc, p_scale),
                normal_logpdf(zs[t], q_loc, q_scale),
            )
        )
        z_prev = zq_prev = zs[t]
    return terms


def tiny(inference="smoothing", likelihood="bernoulli", **kw):
    torch.manual_seed(0)
    return DMM(
        5,
        z_dim=3,
        transition_dim=6,
        emission_dim=4,
        rnn_dim=4,
        inference=inference,
        likelihood=likelihood,
        **kw,
    )


def ragged(B=2, T=6, D=5, lengths=(6, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(B, T, D, generator=g) < 0.4).double()
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


def site_terms(m, x, mask):
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    out = []
    for t in range(x.shape[1]):
        z = guide_tr.nodes[f"z_{t + 1}"]["value"]
        out.append(
            (
                model_tr.nodes[f"x_{t + 1}"]["fn"].log_prob(x[:, t]),
                model_tr.nodes[f"z_{t + 1}"]["fn"].log_prob(z),
                guide_tr.nodes[f"z_{t + 1}"]["fn"].log_prob(z),
                z,
            )
        )
    return out


@pytest.mark.parametrize("inference", ["smoothing", "filtering"])
def test_residual_site_log_densities_match_reference(inference):
    m = tiny(inference, residual=True)
    randomize(m)
    x, mask = ragged()
    got = site_terms(m, x, mask)
    for b in range(2):
        L = int(mask[b].sum())
        zs = torch.stack([got[t][3][b] for t in range(L)])
        expected = dmm_residual_reference(m, x[b, :L], zs, inference)
        for t in range(x.shape[1]):
            values = [g[b] for g in got[t][:3]]
            if t < L:
                for g, e in zip(values, expected[t]):
                    assert abs(g.item() - e.item()) <= 1e-10 * max(1.0, abs(e.item())), (b, t, g, e)
            else:  # padded steps contribute exactly zero
                assert all(v.item() == 0.0 for v in values)


def test_residual_guide_mean_is_prior_mean_plus_combiner():
    """The guide mean moves by exactly mu^(p)(z_{t-1}) relative to residual=False (same weights)."""
    plain, res = tiny(residual=False), tiny(residual=True)
    randomize(plain)
    res.load_state_dict(plain.state_dict())
    x, mask = ragged(lengths=(6, 6))
    zs = {f"z_{t + 1}": 0.7 * torch.randn(2, 3) for t in range(6)}

    def locs(m):
        tr = poutine.trace(poutine.condition(m.guide, data=zs)).get_trace(x, mask)
        return [tr.nodes[f"z_{t + 1}"]["fn"].base_dist.base_dist for t in range(6)]

    for t, (p, r) in enumerate(zip(locs(plain), locs(res))):
        z_prev = plain.z_0 if t == 0 else zs[f"z_{t}"]
        shift = transition_ref(plain.transition, z_prev)[0]
        assert torch.allclose(r.loc, p.loc + shift, atol=1e-12, rtol=0)
        assert torch.equal(r.scale, p.scale)  # the variance is not residual (thesis 5.3)
        assert (r.loc - p.loc).abs().max() > 1e-3  # the shift is not trivially zero


def test_default_is_residual_false_and_unchanged():
    """DMM() and DMM(residual=False): same parameters, bit-identical loss and gradients, and
    both still match the reference of the original DMM (test_reference_elbo.dmm_reference)."""
    default, explicit = tiny(), tiny(residual=False)
    assert default.residual is False
    randomize(default)
    randomize(explicit)
    assert default.state_dict().keys() == explicit.state_dict().keys()
    x, mask = ragged()
    results = []
    for m in (default, explicit):
        pyro.set_rng_seed(5)
        loss = Trace_ELBO().differentiable_loss(m.model, m.guide, x, mask)
        grads = torch.autograd.grad(loss, list(m.parameters()))
        results.append((loss, grads))
    assert results[0][0].item() == results[1][0].item()
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.equal(a, b)
    got = site_terms(default, x, mask)
    for b in range(2):
        L = int(mask[b].sum())
        zs = torch.stack([got[t][3][b] for t in range(L)])
        for t, expected in enumerate(dmm_reference(default, x[b, :L], zs)):
            for g, e in zip(got[t][:3], expected):
                assert abs(g[b].item() - e.item()) <= 1e-10 * max(1.0, abs(e.item()))


def test_residual_must_be_bool():
    with pytest.raises(ValueError, match="residual must be True or False"):
        tiny(residual="yes")


OBJECTIVES = {
    "trace_elbo": lambda: Trace_ELBO(),
    "iwae4": lambda: IWAE(num_particles=4, max_plate_nesting=1),
    "fivo4": lambda: FIVO(num_particles=4, resample="always"),
}


@pytest.mark.parametrize("inference", ["smoothing", "filtering"])
@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_residual_svi_step_finite_with_gradients_for_every_parameter(
    objective, likelihood, inference
):
    m = tiny(inference, likelihood, residual=True)
    x, mask = ragged(B=3, T=7, lengths=(7, 5, 2))
    if likelihood == "gaussian":
        x = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)) * mask.unsqueeze(-1)
    # the gradients of one step (SVI.step zeroes them after its update, so read them here) ...
    loss = OBJECTIVES[objective]().loss_and_grads(m.model, m.guide, x, mask)
    assert torch.isfinite(torch.tensor(loss))
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    # ... and the SVI step itself
    m.zero_grad()
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-3}), loss=OBJECTIVES[objective]())
    assert torch.isfinite(torch.tensor(svi.step(x, mask)))
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_fivo_prior_reuse_keeps_bound_and_gradients(monkeypatch):
    """Under FIVO the model step reuses the transition the Res_q guide step computed at the same
    z_{t-1}; with the reuse disabled the bound and every gradient must be the same."""
    m = tiny("filtering", residual=True)
    x, mask = ragged(B=3, T=7, lengths=(7, 5, 3))
    results = []
    for reuse in (True, False):
        if not reuse:
            monkeypatch.setattr("pyro_seq.models.dmm.prior_from_guide", lambda state, t: None)
        calls = []
        original = m.transition.forward
        monkeypatch.setattr(m.transition, "forward", lambda *a: calls.append(1) or original(*a))
        pyro.set_rng_seed(3)
        loss = FIVO(num_particles=4, resample="always").differentiable_loss(
            m.model, m.guide, x, mask
        )
        grads = torch.autograd.grad(loss, list(m.parameters()))
        monkeypatch.undo()
        results.append((loss.item(), grads, len(calls)))
    # step 1 cannot reuse (guide's z_0 parameter vs the model's expanded state): 7 + 1 calls
    assert results[0][2] == 8 and results[1][2] == 14
    assert abs(results[0][0] - results[1][0]) <= 1e-10 * abs(results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
