"""The VAE-RNN inside an ELBO (thesis 4.4.1): the guide draws every ``z_t`` at once
(``VAERNN.guide_scan`` of :class:`~pyro_seq.models.storn.RecognitionScan`) and the
replayed model takes ``d_{1:T}`` from the guide's run. The step loop (``time_parallel`` off) and
the recomputing model (``shared_with_guide = ()``) stay the references: for the same seed the
latent values, the Trace_ELBO and IWAE losses and every parameter gradient agree in float64 on
ragged batches, and the GRU runs once per ELBO evaluation instead of twice."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.infer import IWAE
from pyro_seq.models import VAERNN
from tests.models.reference import count_forward_calls, ragged_batch

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def _model(**options):
    torch.manual_seed(0)
    m = VAERNN(5, d_dim=6, z_dim=3, hidden_dim=7, **options)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m


def _elbo(name):
    if name == "iwae3":
        return IWAE(num_particles=3, max_plate_nesting=1)
    if name == "vectorized3":
        return Trace_ELBO(num_particles=3, vectorize_particles=True, max_plate_nesting=1)
    return Trace_ELBO(max_plate_nesting=1)


def _loss_and_grads(m, x, mask, elbo, **overrides):
    for k, v in overrides.items():
        setattr(m, k, v)  # instance attributes over the class declarations
    try:
        pyro.set_rng_seed(3)
        m.zero_grad()
        loss = elbo.differentiable_loss(m.model, m.guide, x, mask)
        loss.backward()
    finally:
        for k in overrides:
            delattr(m, k)
    return loss.item(), [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("objective", ["trace_elbo", "iwae3", "vectorized3"])
def test_scan_and_sharing_give_the_step_loops_loss_and_gradients(
    skip, likelihood, objective, monkeypatch
):
    m = _model(skip=skip, likelihood=likelihood)
    x, mask = ragged_batch(likelihood, B=4, T=6, D=5, lengths=(6, 2, 4, 1), seed=1)
    elbo = _elbo(objective)
    calls = count_forward_calls(monkeypatch, m.deterministic)
    fast = _loss_and_grads(m, x, mask, elbo)
    fast_calls = len(calls)
    unshared = _loss_and_grads(m, x, mask, elbo, shared_with_guide=())
    unshared_calls = len(calls) - fast_calls
    loop = _loss_and_grads(m, x, mask, elbo, time_parallel=False)
    assert fast_calls == 1 and unshared_calls == 2  # the GRU once instead of twice
    for loss, grads in (fast, unshared):
        assert loss == pytest.approx(loop[0], rel=1e-11, abs=1e-11)
        for a, b in zip(grads, loop[1]):
            assert torch.allclose(a, b, rtol=1e-9, atol=1e-11)


def test_the_scan_draws_the_step_loops_values():
    """Same seed, same latent values and guide log-densities, one site per step."""
    m = _model()
    x, mask = ragged_batch("bernoulli", B=4, T=6, D=5, lengths=(6, 2, 4, 1), seed=2)
    traces = []
    for parallel in (True, False):
        if not parallel:
            m.time_parallel = False
        pyro.set_rng_seed(4)
        tr = poutine.trace(m.guide).get_trace(x, mask)
        if not parallel:
            del m.time_parallel
        tr.compute_log_prob()
        traces.append(tr)
    scan, loop = traces
    names = [n for n in loop.nodes if n.startswith("z_")]
    assert names == [f"z_{t + 1}" for t in range(6)]
    assert [n for n in scan.nodes if n.startswith("z_")] == names
    for n in names:
        assert torch.equal(scan.nodes[n]["value"], loop.nodes[n]["value"])
        assert torch.allclose(scan.nodes[n]["log_prob"], loop.nodes[n]["log_prob"], atol=1e-12)
