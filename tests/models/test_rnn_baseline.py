"""RNNBaseline: every objective is the exact log-likelihood of a deterministic RNN.

The reference writes the GRU cell (Cho et al. 2014, torch's gate order r, z, n) and the emission
MLP out with raw weight matrices, in float64: ``log p(x) = sum_t log p(x_t | d_t)``,
``d_t = GRU(d_{t-1}, x_{t-1})``, ``d_0 = 0``, ``x_0 = 0``. With no latent site the model/guide
pair must give exactly ``-sum_b log p(x^(b))`` (value and gradient) under Trace_ELBO,
TraceMeanField_ELBO, IWAE(K) vectorized and looped, IWAE with DReG, and FIVO(K).
"""

import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam
from pyro.poutine.util import site_is_subsample

from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models.rnn_baseline import RNNBaseline
from tests.models.reference import (
    act,
    bernoulli_logpmf,
    gru_cell,
    lin,
    normal_logpdf,
    randomize,
    softplus,
)

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def reference_log_p(m, x, likelihood):
    """``log p(x_{1:T})`` of one unpadded sequence ``x (T, D)``, written from the equations."""
    T, D = x.shape
    h = torch.zeros(m.deterministic.rnn.hidden_size)
    u = torch.cat([torch.zeros(1, D), x[:-1]])  # u_t = x_{t-1}, x_0 = 0
    total = x.new_zeros(())
    for t in range(T):
        h = gru_cell(m.deterministic.rnn, u[t], h)  # d_t = GRU(d_{t-1}, u_t), d_0 = 0
        if likelihood == "bernoulli":  # logits = W_2 act(W_1 d_t + b_1) + b_2
            total = total + bernoulli_logpmf(x[t], lin(m.emitter[2], act(lin(m.emitter[0], h))))
        else:  # loc, 1e-3 + softplus(.) of act(W_1 d_t)
            hid = act(lin(m.emitter[0][0], h))
            head = m.emitter[1]
            scale = head.min_scale + softplus(lin(head.raw_scale, hid))
            total = total + normal_logpdf(x[t], lin(head.loc, hid), scale)
    return total


def tiny(likelihood="bernoulli", **kw):
    torch.manual_seed(0)
    m = RNNBaseline(4, d_dim=5, hidden_dim=6, likelihood=likelihood, **kw)
    randomize(m)
    return m


def ragged(likelihood, B=3, T=6, D=4, lengths=(6, 4, 1)):
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    if likelihood == "bernoulli":
        x = (torch.rand(B, T, D, generator=g) < 0.4).double()
    else:
        x = torch.randn(B, T, D, generator=g)
    return x * mask.unsqueeze(-1), mask


def reference_total(m, x, mask, likelihood):
    return sum(
        reference_log_p(m, x[b, : int(mask[b].sum())], likelihood) for b in range(x.shape[0])
    )


OBJECTIVES = {
    "trace_elbo": lambda: Trace_ELBO(),
    "meanfield_elbo": lambda: TraceMeanField_ELBO(),
    "iwae3_vectorized": lambda: IWAE(num_particles=3, max_plate_nesting=1),
    "iwae3_looped": lambda: IWAE(num_particles=3, vectorize_particles=False),
    "iwae3_dreg": lambda: IWAE(num_particles=3, max_plate_nesting=1, gradient_estimator="dreg"),
    "fivo3_ess": lambda: FIVO(num_particles=3),
    "fivo3_always": lambda: FIVO(num_particles=3, resample="always"),
}


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_log_likelihood_matches_reference(likelihood):
    m = tiny(likelihood)
    x, mask = ragged(likelihood)
    got = m.log_likelihood(x, mask)
    assert got.shape == (3,)
    for b in range(3):
        expected = reference_log_p(m, x[b, : int(mask[b].sum())], likelihood)
        assert abs(got[b].item() - expected.item()) <= 1e-10 * abs(expected.item()), b
    # padding content is ignored, and a sequence alone gives its own value
    garbage = torch.where(mask.unsqueeze(-1), x, torch.ones_like(x))
    assert torch.equal(m.log_likelihood(garbage, mask), got)
    alone = m.log_likelihood(x[1:2, :4])
    assert abs(alone.item() - got[1].item()) <= 1e-12 * abs(got[1].item())


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_every_objective_is_the_exact_log_likelihood(objective, likelihood):
    """Loss = -log p(x) at 1e-10 (float64) and its gradient = the reference's gradient."""
    m = tiny(likelihood)
    x, mask = ragged(likelihood)
    params = list(m.parameters())
    expected = -reference_total(m, x, mask, likelihood)
    expected_grads = torch.autograd.grad(expected, params)
    elbo = OBJECTIVES[objective]()
    loss = elbo.differentiable_loss(m.model, m.guide, x, mask)
    tol = 1e-10 * abs(expected.item())
    assert abs(loss.item() - expected.item()) <= tol, (loss.item(), expected.item())
    assert abs(elbo.loss(m.model, m.guide, x, mask) - expected.item()) <= tol
    grads = torch.autograd.grad(loss, params)
    for (name, _), g, e in zip(m.named_parameters(), grads, expected_grads):
        assert torch.allclose(g, e, rtol=1e-10, atol=1e-12), name
        assert e.abs().sum() > 0, name  # every parameter matters


@pytest.mark.parametrize("objective", ["trace_elbo", "iwae3_dreg", "fivo3_always"])
def test_svi_step_on_the_exact_likelihood(objective):
    m = tiny()
    x, mask = ragged("bernoulli")
    before = m.log_likelihood(x, mask).sum().item()
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-2}), loss=OBJECTIVES[objective]())
    loss = svi.step(x, mask)
    assert abs(loss + before) <= 1e-10 * abs(before)
    assert m.log_likelihood(x, mask).sum().item() > before  # one step up the exact likelihood


def test_the_programs_have_only_observation_sites():
    m = tiny()
    x, mask = ragged("bernoulli")
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    guide_sites = [
        n for n, s in guide_tr.nodes.items() if s["type"] == "sample" and not site_is_subsample(s)
    ]
    assert guide_sites == []
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    sites = [
        n for n, s in model_tr.nodes.items() if s["type"] == "sample" and not site_is_subsample(s)
    ]
    assert sites == [f"x_{t + 1}" for t in range(6)]
    assert all(model_tr.nodes[n]["is_observed"] for n in sites)
    # step-by-step (no replay: deferred emission) and time-parallel (replay) runs agree
    plain_tr = poutine.trace(m.model).get_trace(x, mask)
    for n in sites:
        a = model_tr.nodes[n]["fn"].log_prob(model_tr.nodes[n]["value"])
        b = plain_tr.nodes[n]["fn"].log_prob(plain_tr.nodes[n]["value"])
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), n


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_generate_shapes(cell, likelihood):
    m = RNNBaseline(4, d_dim=5, hidden_dim=6, cell=cell, likelihood=likelihood)
    x, params = m.generate(3, 7)
    assert x.shape == (3, 7, 4)
    if likelihood == "bernoulli":
        assert params.shape == (3, 7, 4) and set(x.unique().tolist()) <= {0.0, 1.0}
    else:
        assert [p.shape for p in params] == [(3, 7, 4)] * 2 and bool((params[1] > 0).all())
    # the emission parameters of generate are those the model scores for the same x
    d = m._deterministic_states(x, torch.ones(3, 7, dtype=torch.bool))
    replayed = m.emitter(d)
    if likelihood == "bernoulli":
        assert torch.allclose(replayed, params, atol=1e-10)
    else:
        assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(replayed, params))


def test_bad_options_raise():
    with pytest.raises(ValueError, match="likelihood"):
        RNNBaseline(4, likelihood="poisson")
    with pytest.raises(ValueError, match="cell"):
        RNNBaseline(4, cell="transformer")
    with pytest.raises(ValueError, match="d_dim"):
        RNNBaseline(4, d_dim=0)
    with pytest.raises(ValueError, match="num_steps"):
        RNNBaseline(4, d_dim=3, hidden_dim=3).generate(2, 0)
    with pytest.raises(ValueError, match="binary|0/1"):
        RNNBaseline(4, d_dim=3, hidden_dim=3).log_likelihood(torch.full((1, 2, 4), 0.5))


@pytest.mark.parametrize("method", ["iwae", "smc"])
def test_likelihood_estimators_return_the_exact_value(method):
    """estimate_log_likelihood (IWAE or SMC, chunked particles) is exact for a no-latent model."""
    from pyro_seq.infer import estimate_log_likelihood

    m = tiny("gaussian")
    x, mask = ragged("gaussian")
    est = estimate_log_likelihood(
        m.model,
        m.guide,
        (x, mask),
        method=method,
        num_particles=4,
        particles_per_pass=2 if method == "iwae" else None,
    )
    exact = m.log_likelihood(x, mask)
    assert torch.allclose(est.per_sequence, exact.detach(), rtol=1e-12, atol=0)


def test_emission_kwargs_reach_make_emission(monkeypatch):
    """Extra keyword arguments (e.g. num_components of a "gmm" family) go to make_emission."""
    import pyro_seq.models.rnn_baseline as module

    seen = {}
    original = module.make_emission

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args)

    monkeypatch.setattr(module, "make_emission", spy)
    RNNBaseline(4, d_dim=3, hidden_dim=3, num_components=5)
    assert seen == {"num_components": 5}


def test_training_evaluation_reports_zero_kl_and_the_exact_value():
    """pyro_seq.train's elbo_terms / evaluate_bound work on a program without latent sites."""
    from pyro_seq.train.evaluate import elbo_terms, evaluate_bound

    m = tiny()
    x, mask = ragged("bernoulli")
    exact = m.log_likelihood(x, mask)
    terms = elbo_terms(m, x, mask)
    assert torch.equal(terms["kl"], torch.zeros(3))
    assert torch.allclose(terms["elbo"], exact, rtol=1e-12, atol=0)
    # evaluate_bound pads with SequenceLoader's float32 default, so compare in float32
    m32 = m.float()
    exact32 = m32.log_likelihood(x.float(), mask).sum().item()
    seqs = [x[b, : int(mask[b].sum())].float() for b in range(3)]
    result = evaluate_bound(m32, seqs, batch_size=2)
    assert abs(result["total"] - exact32) <= 1e-6 * abs(exact32)
    assert result["num_steps"] == 11 and result["kl_per_step"] == 0.0
