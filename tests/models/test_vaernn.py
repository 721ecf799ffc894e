"""VAE-RNN (thesis 4.4.1) against a hand-written reference, and under every objective.

The reference writes eq. 4.11-4.16 out with raw weight matrices in float64: the GRU cell
``d_t = GRU(d_{t-1}, x_{t-1})`` (``d_0 = 0``, ``x_0 = 0``), the prior ``p(z_t | d_t)``, the
emission ``p(x_t | z_t)`` or ``p(x_t | z_t, d_t)`` and the inference network
``q(z_t | x_t, d_t)``, each an MLP with one hidden layer (leaky ReLU 1/3 clipped at +-3) and
standard deviations ``min_scale + softplus(.)``.
"""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam

from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models.vaernn import VAERNN
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


def gaussian_net(net, h):
    """``(loc, min_scale + softplus(.))`` of one hidden layer ``act(W h + b)``."""
    hid = act(lin(net.hidden, h))
    return lin(net.head.loc, hid), net.head.min_scale + softplus(lin(net.head.raw_scale, hid))


def vaernn_reference(m, x, zs, skip, likelihood):
    """Per step (log p(x_t | z_t (,d_t)), log p(z_t | d_t), log q(z_t | x_t, d_t)), one sequence."""
    T, D = x.shape
    h = torch.zeros(m.d_dim)
    u = torch.cat([torch.zeros(1, D), x[:-1]])  # u_t = x_{t-1}
    terms = []
    for t in range(T):
        h = gru_cell(m.deterministic.rnn, u[t], h)  # eq. 4.11: d_t = f(d_{t-1}, u_t)
        p_loc, p_scale = gaussian_net(m.prior, h)  # eq. 4.12: p(z_t | d_t)
        q_loc, q_scale = gaussian_net(m.posterior, torch.cat([x[t], h]))  # eq. 4.15
        feats = torch.cat([zs[t], h]) if skip else zs[t]  # p(x_t | z_t, d_t) or p(x_t | z_t)
        if likelihood == "bernoulli":
            log_px = bernoulli_logpmf(x[t], lin(m.emitter[2], act(lin(m.emitter[0], feats))))
        else:
            hid = act(lin(m.emitter[0][0], feats))
            head = m.emitter[1]
            log_px = normal_logpdf(
                x[t], lin(head.loc, hid), head.min_scale + softplus(lin(head.raw_scale, hid))
            )
        terms.append(
            (log_px, normal_logpdf(zs[t], p_loc, p_scale), normal_logpdf(zs[t], q_loc, q_scale))
        )
    return terms


def tiny(skip=False, likelihood="bernoulli", **kw):
    torch.manual_seed(0)
    return VAERNN(4, d_dim=5, z_dim=3, hidden_dim=6, skip=skip, likelihood=likelihood, **kw)


def ragged(likelihood, B=3, T=6, D=4, lengths=(6, 4, 1), seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    if likelihood == "bernoulli":
        x = (torch.rand(B, T, D, generator=g) < 0.4).double()
    else:
        x = torch.randn(B, T, D, generator=g)
    return x * mask.unsqueeze(-1), mask


def traces(m, x, mask):
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    return guide_tr, model_tr


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("skip", [False, True])
def test_site_log_densities_match_reference(skip, likelihood):
    m = tiny(skip, likelihood)
    randomize(m)
    x, mask = ragged(likelihood)
    guide_tr, model_tr = traces(m, x, mask)
    for b in range(3):
        L = int(mask[b].sum())
        zs = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][b] for t in range(L)])
        expected = vaernn_reference(m, x[b, :L], zs, skip, likelihood)
        for t in range(6):
            z = guide_tr.nodes[f"z_{t + 1}"]["value"]
            got = (
                model_tr.nodes[f"x_{t + 1}"]["fn"].log_prob(x[:, t])[b],
                model_tr.nodes[f"z_{t + 1}"]["fn"].log_prob(z)[b],
                guide_tr.nodes[f"z_{t + 1}"]["fn"].log_prob(z)[b],
            )
            if t < L:
                for g, e in zip(got, expected[t]):
                    assert abs(g.item() - e.item()) <= 1e-10 * max(1.0, abs(e.item())), (b, t)
            else:  # padded steps contribute exactly zero
                assert all(g.item() == 0.0 for g in got)


@pytest.mark.parametrize("skip", [False, True])
def test_trace_elbo_is_the_sum_of_reference_terms(skip):
    """Trace_ELBO's loss is -sum_b sum_t (log p(x_t|.) + log p(z_t|d_t) - log q(z_t|x_t,d_t))
    at the guide's draw (the same seed gives the same draw)."""
    m = tiny(skip)
    randomize(m)
    x, mask = ragged("bernoulli")
    pyro.set_rng_seed(11)
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    pyro.set_rng_seed(11)
    loss = Trace_ELBO().differentiable_loss(m.model, m.guide, x, mask)
    expected = 0.0
    for b in range(3):
        L = int(mask[b].sum())
        zs = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][b] for t in range(L)])
        expected = expected - sum(
            px + pz - qz for px, pz, qz in vaernn_reference(m, x[b, :L], zs, skip, "bernoulli")
        )
    assert abs(loss.item() - expected.item()) <= 1e-10 * abs(expected.item())


def test_skip_connection_changes_only_the_emission():
    """skip=True feeds d_t to the emitter: its input grows by d_dim, the rest is unchanged."""
    a, b = tiny(False), tiny(True)
    assert a.emitter[0].in_features == 3 and b.emitter[0].in_features == 3 + 5

    def shapes(m):
        return {k: v.shape for k, v in m.state_dict().items() if not k.startswith("emitter")}

    assert shapes(a) == shapes(b)


def test_time_parallel_scoring_equals_the_step_loop():
    """Replay (time-parallel) and condition (step by step) give the same model log-densities."""
    m = tiny(True, "gaussian")
    x, mask = ragged("gaussian")
    guide_tr, model_tr = traces(m, x, mask)
    data = {f"z_{t + 1}": guide_tr.nodes[f"z_{t + 1}"]["value"] for t in range(6)}
    loop_tr = poutine.trace(poutine.condition(m.model, data=data)).get_trace(x, mask)
    model_tr.compute_log_prob()
    loop_tr.compute_log_prob()
    for t in range(6):
        for name in (f"z_{t + 1}", f"x_{t + 1}"):
            assert torch.allclose(
                model_tr.nodes[name]["log_prob"],
                loop_tr.nodes[name]["log_prob"],
                rtol=1e-12,
                atol=1e-12,
            ), name


OBJECTIVES = {
    "trace_elbo": lambda: Trace_ELBO(),
    "meanfield_elbo": lambda: TraceMeanField_ELBO(),
    "iwae4": lambda: IWAE(num_particles=4, max_plate_nesting=1),
    "iwae4_dreg": lambda: IWAE(num_particles=4, max_plate_nesting=1, gradient_estimator="dreg"),
    "fivo4": lambda: FIVO(num_particles=4, resample="always"),
}


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_svi_step_finite_with_gradients_for_every_parameter(objective, likelihood, skip):
    m = tiny(skip, likelihood)
    x, mask = ragged(likelihood, T=7, lengths=(7, 5, 2))
    # the gradients of one step (SVI.step zeroes them after its update, so read them here) ...
    loss = OBJECTIVES[objective]().loss_and_grads(m.model, m.guide, x, mask)
    assert math.isfinite(loss)
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    # ... and the SVI step itself
    m.zero_grad()
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-3}), loss=OBJECTIVES[objective]())
    assert math.isfinite(svi.step(x, mask))
    assert all(torch.isfinite(p).all() for p in m.parameters())


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_padded_steps_contribute_nothing(objective):
    """Garbage in the padding changes no loss, and a padded batch is the sum of its sequences."""
    m = tiny(True)
    x, mask = ragged("bernoulli")
    garbage = torch.where(mask.unsqueeze(-1), x, torch.ones_like(x))
    losses = []
    for data in (x, garbage):
        pyro.set_rng_seed(4)
        losses.append(OBJECTIVES[objective]().loss(m.model, m.guide, data, mask))
    assert losses[0] == losses[1]
    if objective in ("trace_elbo", "meanfield_elbo"):  # one particle: the per-step terms
        guide_tr, model_tr = traces(m, x, mask)
        guide_tr.compute_log_prob()
        model_tr.compute_log_prob()
        for t in range(6):
            for tr, name in (
                (model_tr, f"x_{t + 1}"),
                (model_tr, f"z_{t + 1}"),
                (guide_tr, f"z_{t + 1}"),
            ):
                lp = tr.nodes[name]["log_prob"]
                assert bool((lp[~mask[:, t]] == 0).all()) and bool((lp[mask[:, t]] != 0).all())


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_generate_shapes(skip, likelihood):
    m = tiny(skip, likelihood)
    x, params = m.generate(2, 5)
    assert x.shape == (2, 5, 4)
    if likelihood == "bernoulli":
        assert params.shape == (2, 5, 4) and set(x.unique().tolist()) <= {0.0, 1.0}
    else:
        assert [p.shape for p in params] == [(2, 5, 4)] * 2 and bool((params[1] > 0).all())
    with pytest.raises(ValueError, match="num_steps"):
        m.generate(2, 0)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="likelihood"):
        VAERNN(4, likelihood="poisson")
    with pytest.raises(ValueError, match="skip"):
        VAERNN(4, skip="yes")
    with pytest.raises(ValueError, match="z_dim"):
        VAERNN(4, z_dim=0)
    with pytest.raises(ValueError, match="variance"):
        VAERNN(4, d_dim=3, z_dim=2, hidden_dim=3, variance="exp")
    with pytest.raises(ValueError, match="activation"):
        VAERNN(4, d_dim=3, z_dim=2, hidden_dim=3, activation="swish")


def test_emission_kwargs_reach_make_emission(monkeypatch):
    """Extra keyword arguments (e.g. num_components of a "gmm" family) go to make_emission."""
    import pyro_seq.models.vaernn as module

    seen = {}
    original = module.make_emission

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args)

    monkeypatch.setattr(module, "make_emission", spy)
    VAERNN(4, d_dim=3, z_dim=2, hidden_dim=3, num_components=5)
    assert seen == {"num_components": 5}
