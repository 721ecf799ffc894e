"""A time-parallel SRNN model run replayed against its guide's trace takes ``d_{1:T}``, its
prior projection and the Res_q guide's per-step priors from the guide's state
(``models.base``, "Sharing with the guide"). Sharing must not change any log-density or
gradient, and must not happen when the guide ran on other inputs, with other weights (even
weights written through ``p.data``, as ``ClippedAdam`` does) or in another grad mode, or when
the replayed latent values are not the guide's samples."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.infer import LatentScale
from pyro_seq.models import SRNN

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def _model(**kwargs):
    torch.manual_seed(0)
    return SRNN(5, d_dim=6, z_dim=3, hidden_dim=7, **kwargs)


def _batch():
    g = torch.Generator().manual_seed(1)
    mask = torch.arange(6) < torch.tensor([6, 4, 1]).unsqueeze(-1)
    x = (torch.rand(3, 6, 5, generator=g) < 0.4).double() * mask.unsqueeze(-1)
    return x, mask


def _count_calls(monkeypatch, m):
    """Calls of the deterministic GRU and of the prior network (per program run)."""
    calls = {"deterministic": 0, "prior": 0}
    for name in calls:
        module = getattr(m, name)
        original = module.forward

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, "forward", counted)
    return calls


def _loss_and_grads(m, x, mask, share, wrap=None):
    if not share:
        m.shared_with_guide = ()  # instance attribute: this model recomputes everything
    model, guide = (m.model, m.guide) if wrap is None else (wrap(m.model), wrap(m.guide))
    pyro.set_rng_seed(3)
    m.zero_grad()
    loss = Trace_ELBO(max_plate_nesting=1).differentiable_loss(model, guide, x, mask)
    loss.backward()
    if not share:
        del m.shared_with_guide
    return loss.item(), [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("annealed", [False, True])
def test_sharing_keeps_the_elbo_and_its_gradients(monkeypatch, residual, annealed):
    m = _model(residual=residual)
    x, mask = _batch()
    wrap = LatentScale(0.3) if annealed else None
    calls = _count_calls(monkeypatch, m)
    loss_a, grads_a = _loss_and_grads(m, x, mask, True, wrap)
    shared_calls = dict(calls)
    calls.update(deterministic=0, prior=0)
    loss_b, grads_b = _loss_and_grads(m, x, mask, False, wrap)
    # d once instead of twice; the model's time-parallel prior is the guide's (Res_q)
    assert shared_calls["deterministic"] == 1 and calls["deterministic"] == 2
    if residual:
        # the fused guide scan (nn.srnn_guide_scan) reads the prior's weights without calling
        # the module; unshared, the model's time-parallel prior calls it once
        assert shared_calls["prior"] == 0 and calls["prior"] == 1
    else:
        assert shared_calls["prior"] == calls["prior"] == 1
    assert loss_a == pytest.approx(loss_b, rel=1e-12, abs=1e-12)
    for a, b in zip(grads_a, grads_b):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def _replayed_log_probs(m, guide_trace, x, mask):
    tr = poutine.trace(poutine.replay(m.model, trace=guide_trace)).get_trace(x, mask)
    tr.compute_log_prob()
    return {n: s["log_prob"] for n, s in tr.nodes.items() if n.startswith(("z_", "x_"))}


def _recomputed_log_probs(m, guide_trace, x, mask):
    m.shared_with_guide = ()
    try:
        return _replayed_log_probs(m, guide_trace, x, mask)
    finally:
        del m.shared_with_guide


def _assert_same(a, b):
    assert list(a) == list(b)
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-12, atol=1e-12), name


def test_weights_changed_through_data_are_not_stale(monkeypatch):
    """An optimizer that writes ``p.data`` (no version bump) between guide and model: the
    model scores with the new weights, as if nothing were shared."""
    m = _model()
    x, mask = _batch()
    g = poutine.trace(m.guide).get_trace(x, mask)
    m.deterministic.rnn.weight_hh_l0.data.add_(0.1)
    m.prior.first.bias.data.add_(0.1)
    calls = _count_calls(monkeypatch, m)
    shared = _replayed_log_probs(m, g, x, mask)
    assert calls["deterministic"] == 1  # recomputed, not taken from the guide
    _assert_same(shared, _recomputed_log_probs(m, g, x, mask))


def test_other_inputs_are_not_shared(monkeypatch):
    m = _model()
    x, mask = _batch()
    g = poutine.trace(m.guide).get_trace(x, mask)
    y = x.clone()
    y[0, 0] = 1 - y[0, 0]
    calls = _count_calls(monkeypatch, m)
    shared = _replayed_log_probs(m, g, y, mask)
    assert calls["deterministic"] == 1
    _assert_same(shared, _recomputed_log_probs(m, g, y, mask))


def test_grad_mode_must_match(monkeypatch):
    """A guide run without gradients must not hand the model a ``d`` without history."""
    m = _model()
    x, mask = _batch()
    with torch.no_grad():
        g = poutine.trace(m.guide).get_trace(x, mask)
    calls = _count_calls(monkeypatch, m)
    tr = poutine.trace(poutine.replay(m.model, trace=g)).get_trace(x, mask)
    assert calls["deterministic"] == 1
    tr.compute_log_prob()
    assert tr.nodes["x_1"]["log_prob"].requires_grad


def test_replayed_values_not_the_guide_samples_use_a_fresh_prior(monkeypatch):
    """A trace whose latent values were replaced after the guide ran: d is still shared (it
    does not depend on z) but the prior is evaluated at the replayed values."""
    m = _model()
    x, mask = _batch()
    g = poutine.trace(m.guide).get_trace(x, mask)
    g.nodes["z_3"]["value"] = g.nodes["z_3"]["value"] + 0.5
    calls = _count_calls(monkeypatch, m)
    shared = _replayed_log_probs(m, g, x, mask)
    assert calls["deterministic"] == 0 and calls["prior"] == 1
    _assert_same(shared, _recomputed_log_probs(m, g, x, mask))


@pytest.mark.parametrize("vectorized", ["iwae", "trace_elbo"])
def test_the_res_q_priors_are_shared_under_a_particle_plate(monkeypatch, vectorized):
    """Under the vectorised particle plate (IWAE, Trace_ELBO with vectorised particles) the
    model also reuses the fused guide's priors: no prior network call, and the loss and every
    gradient of the recomputing model."""
    from pyro_seq.infer import IWAE

    m = _model(residual=True)
    x, mask = _batch()

    def run(share):
        if not share:
            m.shared_with_guide = ()
        if vectorized == "iwae":
            elbo = IWAE(num_particles=3, max_plate_nesting=1)
        else:
            elbo = Trace_ELBO(num_particles=3, vectorize_particles=True, max_plate_nesting=1)
        pyro.set_rng_seed(3)
        m.zero_grad()
        loss = elbo.differentiable_loss(m.model, m.guide, x, mask)
        loss.backward()
        if not share:
            del m.shared_with_guide
        return loss.item(), [p.grad.clone() for p in m.parameters()]

    calls = _count_calls(monkeypatch, m)
    loss_a, grads_a = run(True)
    shared_prior_calls = calls["prior"]
    loss_b, grads_b = run(False)
    assert shared_prior_calls == 0 and calls["prior"] == 1
    assert loss_a == pytest.approx(loss_b, rel=1e-12, abs=1e-12)
    for a, b in zip(grads_a, grads_b):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
