"""Scanned guides under the vectorised particle plate of a Pyro ELBO (module docstring of
:mod:`pyro_seq.models.base`): a model with ``guide_scan_particles = True`` draws every step
ahead with noise ``(K, batch, Z)`` per step, in the step loop's order, so for the same seed the
Trace_ELBO(num_particles=K, vectorize_particles=True) and IWAE(K) losses and every parameter
gradient equal the step loop's (float64, ragged masks); FIVO keeps its step loop.
"""

from contextlib import ExitStack

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO

from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models import DMM, SRNN, STORN, VAERNN, VOSP, VRAE
from tests.models.reference import ragged_batch as reference_batch

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py

K = 3


def ragged_batch(**sizes):
    return reference_batch("bernoulli", **sizes)


BUILDS = {
    "dmm": lambda: DMM(5, z_dim=3, transition_dim=4, emission_dim=4, rnn_dim=4),
    "dmm_res_q": lambda: DMM(
        5, z_dim=3, transition_dim=4, emission_dim=4, rnn_dim=4, residual=True
    ),
    "srnn": lambda: SRNN(5, d_dim=4, z_dim=3, hidden_dim=4),
    "srnn_no_res_q": lambda: SRNN(5, d_dim=4, z_dim=3, hidden_dim=4, residual=False),
    "storn": lambda: STORN(5, z_dim=3, rnn_dim=6, emission_dim=7, prior="wiener"),
    "vosp": lambda: VOSP(5, z_dim=3, rnn_dim=6, emission_dim=7, prior="wiener"),
    "vrae": lambda: VRAE(5, z_dim=3, encoder_dim=4, decoder_dim=6, emission_dim=7),
    "vaernn": lambda: VAERNN(5, d_dim=4, z_dim=3, hidden_dim=4),
}

#: objective, and the particle shape the guide scan gets under it
OBJECTIVES = {
    "trace_elbo": (
        lambda: Trace_ELBO(num_particles=K, vectorize_particles=True, max_plate_nesting=1),
        (K,),
    ),
    # a free dim between particles and batch: draws (K, 1, batch, Z), as the loop's
    "trace_elbo_nesting_2": (
        lambda: Trace_ELBO(num_particles=K, vectorize_particles=True, max_plate_nesting=2),
        (K, 1),
    ),
    "iwae": (lambda: IWAE(num_particles=K, max_plate_nesting=1), (K,)),
}


def counting(m, monkeypatch):
    """Count the calls of ``m.guide_scan`` that drew the sites (returned True), with the
    particle shape each got."""
    calls = []
    scan = type(m).guide_scan

    def wrapped(self, state, x, mask, particles=()):
        done = scan(self, state, x, mask, particles=particles)
        if done:
            calls.append(particles)
        return done

    monkeypatch.setattr(type(m), "guide_scan", wrapped)
    return calls


def loss_and_grads(m, objective, x, mask, seed=3):
    pyro.set_rng_seed(seed)
    m.zero_grad()
    loss = objective.differentiable_loss(m.model, m.guide, x, mask)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in m.parameters()]


def assert_equal_runs(scanned, looped):
    (l1, g1), (l2, g2) = scanned, looped
    assert abs(l1 - l2) <= 1e-10 * max(1.0, abs(l2)), (l1, l2)
    assert len(g1) == len(g2)
    for a, b in zip(g1, g2):
        assert torch.isfinite(a).all()
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-10), (a - b).abs().max()


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("name", sorted(BUILDS))
def test_scan_under_particles_equals_the_step_loop(name, objective, monkeypatch):
    torch.manual_seed(0)
    m = BUILDS[name]().double()
    x, mask = ragged_batch()
    make, shape = OBJECTIVES[objective]
    calls = counting(m, monkeypatch)
    scanned = loss_and_grads(m, make(), x, mask)
    assert calls == [shape]  # the guide drew every step at once, with the particles in front
    with monkeypatch.context() as patch:
        patch.setattr(type(m), "guide_scan_particles", False)  # the step loop's guide
        looped = loss_and_grads(m, make(), x, mask)
    assert calls == [shape]
    assert_equal_runs(scanned, looped)
    assert any(g.abs().sum() > 0 for g in scanned[1])


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_fivo_keeps_the_step_loop(name, monkeypatch):
    torch.manual_seed(0)
    m = BUILDS[name]().double()
    x, mask = ragged_batch()
    calls = counting(m, monkeypatch)
    pyro.set_rng_seed(1)
    loss = FIVO(num_particles=K).differentiable_loss(m.model, m.guide, x, mask)
    assert torch.isfinite(loss) and calls == []


@pytest.mark.parametrize("name", ["storn", "dmm", "srnn"])
def test_other_plates_and_handlers_keep_the_step_loop(name, monkeypatch):
    """Only the ELBO's particle plate, alone, admits the scan: a plate of another name, two
    particle plates, or a condition under the particle plate run the step loop."""
    m = BUILDS[name]().double()
    x, mask = ragged_batch()
    calls = counting(m, monkeypatch)
    zs = {f"z_{t}": torch.zeros(2, 4, 3) for t in range(1, x.shape[1] + 1)}

    def under(*plates, condition=False):
        guide = poutine.condition(m.guide, data=zs) if condition else m.guide
        with ExitStack() as stack:
            for plate_name, dim in plates:
                stack.enter_context(pyro.plate(plate_name, 2, dim=dim))
            poutine.trace(guide).get_trace(x, mask)

    particle = ("num_particles_vectorized", -2)
    under(particle)
    assert calls == [(2,)]
    under(("other", -2))
    under(particle, ("num_particles_vectorized_2", -3))
    under(particle, condition=True)
    assert calls == [(2,)]
