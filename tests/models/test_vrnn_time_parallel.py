"""The VRNN's time-parallel model (``VRNN.model_step`` with ``t = slice(None)``): replayed
against its guide's trace, the model takes ``d_{1:T}`` from the guide's record (the guide
computed them at the same samples ``z_{<t}``) or recomputes them, and scores every step at once.
The step loop stays the reference: sites, log-densities, ELBO and gradients must equal it in
float64 (Trace_ELBO and IWAE's vectorised particles), and the record must not be used when the
weights changed after the guide ran."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.infer import IWAE, LatentScale
from pyro_seq.models import VRNN
from tests.models.reference import count_forward_calls, ragged_batch

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py

VARIANTS = {
    "filtering-lstm": dict(inference="filtering", cell="lstm"),
    "smoothing-gru": dict(inference="smoothing", cell="gru"),
    "inputs-lstm": dict(inference="filtering", cell="lstm", input_dim=2),
    "gaussian-gru": dict(inference="smoothing", cell="gru", likelihood="gaussian"),
}


def _model(variant):
    torch.manual_seed(0)
    m = VRNN(5, d_dim=6, z_dim=3, hidden_dim=7, feature_dim=4, **VARIANTS[variant])
    with torch.no_grad():  # weights large enough that every step's terms differ
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m


def _batch(variant):
    likelihood = VARIANTS[variant].get("likelihood", "bernoulli")
    x, mask = ragged_batch(likelihood, B=4, T=6, D=5, lengths=(6, 2, 4, 1), seed=1)
    kw = {}
    if VARIANTS[variant].get("input_dim"):
        kw["inputs"] = torch.randn(4, 6, 2, generator=torch.Generator().manual_seed(2))
    return x, mask, kw


class _StepLoop:
    """The model with ``time_parallel`` off (an instance attribute): the reference path."""

    def __init__(self, m):
        self.m = m

    def __enter__(self):
        self.m.time_parallel = False

    def __exit__(self, *exc):
        del self.m.time_parallel


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_replayed_model_scores_every_step_as_the_step_loop(variant, monkeypatch):
    """The same sites with the same log-densities; the model runs no recurrence step when it
    takes d from the guide, and T - 1 steps plus d_1 when it recomputes them."""
    m = _model(variant)
    x, mask, kw = _batch(variant)
    pyro.set_rng_seed(4)
    guide_tr = poutine.trace(m.guide).get_trace(x, mask, **kw)
    calls = count_forward_calls(monkeypatch, m.recurrence)
    shared = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask, **kw)
    shared_calls = len(calls)
    m.shared_with_guide = ()  # recompute d in the time-parallel path
    try:
        recomputed = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask, **kw)
    finally:
        del m.shared_with_guide
    recompute_calls = len(calls) - shared_calls
    with _StepLoop(m):
        loop = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask, **kw)
    # d_1 comes from _first_hidden (one call) in the model's init either way
    assert shared_calls == 1 and recompute_calls == 1 + (x.shape[1] - 1)
    names = [n for n in loop.nodes if n.startswith(("z_", "x_"))]
    for tr in (shared, recomputed, loop):
        tr.compute_log_prob()
        assert [n for n in tr.nodes if n.startswith(("z_", "x_"))] == names
    for name in names:
        want = loop.nodes[name]["log_prob"]
        for tr in (shared, recomputed):
            assert torch.allclose(tr.nodes[name]["log_prob"], want, rtol=1e-12, atol=1e-12), name


def _assert_same_log_probs(parallel, loop, shape=None):
    parallel.compute_log_prob()
    loop.compute_log_prob()
    for name, site in loop.nodes.items():
        if name.startswith(("z_", "x_")):
            got = parallel.nodes[name]["log_prob"]
            assert shape is None or got.shape == shape
            assert torch.allclose(got, site["log_prob"], rtol=1e-12, atol=1e-12), name


def _loss_and_grads(m, x, mask, kw, elbo, wrap=None):
    model, guide = (m.model, m.guide) if wrap is None else (wrap(m.model), wrap(m.guide))
    pyro.set_rng_seed(5)
    m.zero_grad()
    loss = elbo.differentiable_loss(model, guide, x, mask, **kw)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize(
    "objective", ["trace_elbo", "annealed", "iwae3", "vectorized3"], ids=lambda s: s
)
def test_elbo_and_gradients_equal_the_step_loop(variant, objective):
    m = _model(variant)
    x, mask, kw = _batch(variant)
    wrap = LatentScale(0.3) if objective == "annealed" else None
    if objective == "iwae3":
        elbo = IWAE(num_particles=3, max_plate_nesting=1)
    elif objective == "vectorized3":
        elbo = Trace_ELBO(num_particles=3, vectorize_particles=True, max_plate_nesting=1)
    else:
        elbo = Trace_ELBO(max_plate_nesting=1)
    loss, grads = _loss_and_grads(m, x, mask, kw, elbo, wrap)
    with _StepLoop(m):
        loss_ref, grads_ref = _loss_and_grads(m, x, mask, kw, elbo, wrap)
    assert loss == pytest.approx(loss_ref, rel=1e-11, abs=1e-11)
    for a, b in zip(grads, grads_ref):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("variant", ["filtering-lstm", "smoothing-gru"])
def test_the_record_serves_under_a_vectorised_particle_plate(variant, monkeypatch):
    """Under the particle plate of IWAE and vectorised ELBOs the replayed model also takes d
    from the guide (one recurrence call: its own d_1), with the step loop's log-densities."""
    m = _model(variant)
    x, mask, kw = _batch(variant)
    pyro.set_rng_seed(7)
    with pyro.plate("num_particles_vectorized", 3, dim=-2):
        guide_tr = poutine.trace(m.guide).get_trace(x, mask)
        calls = count_forward_calls(monkeypatch, m.recurrence)
        parallel = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
        assert len(calls) == 1
        with _StepLoop(m):
            loop = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    _assert_same_log_probs(parallel, loop, shape=(3, 4))


def test_weights_changed_after_the_guide_are_not_stale(monkeypatch):
    """An optimizer that writes ``p.data`` between guide and model (ClippedAdam does): the
    model recomputes d with the new weights instead of reusing the guide's."""
    m = _model("filtering-lstm")
    x, mask, kw = _batch("filtering-lstm")
    pyro.set_rng_seed(6)
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    m.recurrence.cell.weight_hh.data.add_(0.1)
    calls = count_forward_calls(monkeypatch, m.recurrence)
    parallel = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    assert len(calls) == x.shape[1]  # recomputed: d_1 and T - 1 steps
    with _StepLoop(m):
        loop = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    _assert_same_log_probs(parallel, loop)


@pytest.mark.parametrize("per_element", [False, True])
def test_missing_observations_score_as_the_step_loop(per_element):
    """With ``observed=`` (missing entries inside the sequences) the time-parallel model scores
    the observed entries only, as the step loop does: the same Trace_ELBO and gradients."""
    m = _model("filtering-lstm")
    x, mask, _ = _batch("filtering-lstm")
    g = torch.Generator().manual_seed(9)
    shape = x.shape if per_element else x.shape[:2]
    observed = torch.rand(shape, generator=g) < 0.7
    x = torch.where(observed if per_element else observed.unsqueeze(-1), x, float("nan"))

    def run(loop):
        if loop:
            m.time_parallel = False
        try:
            pyro.set_rng_seed(8)
            m.zero_grad()
            loss = Trace_ELBO(max_plate_nesting=1).differentiable_loss(
                m.model, m.guide, x, mask, observed=observed
            )
            loss.backward()
        finally:
            if loop:
                del m.time_parallel
        return loss.item(), [p.grad.clone() for p in m.parameters()]

    (loss, grads), (loss_ref, grads_ref) = run(False), run(True)
    assert loss == pytest.approx(loss_ref, rel=1e-11)
    for a, b in zip(grads, grads_ref):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-11)
