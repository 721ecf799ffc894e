"""Time-parallel STORN, VOSP and VRAE (Bayer & Osendorfer (2014), sec. 3.1-3.3) against the
step loop.

The recognition models of the three read ``x`` only, so the guide draws every ``z_t`` at once
(:func:`~pyro_seq.models.storn.draw_recognition`), and with every ``z_t`` known the generating
RNN runs once over the sequence (:meth:`~pyro_seq.models.storn.StepRNN.sequence`, for the tanh
cell of eq. (2) a ragged scan with a hand-written backward pass). The reference is the step
loop with every recurrent network evaluated by :meth:`StepRNN.step` (``torch.rnn_tanh_cell`` /
``torch.gru_cell``), one step at a time: for the same seed, the Trace_ELBO loss and every
parameter gradient agree in float64, on ragged batches.
"""

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO

from pyro_seq.distributions import PresampledValue
from pyro_seq.infer import IWAE
from pyro_seq.models import STORN, VOSP, VRAE
from pyro_seq.models.storn import StepRNN
from tests.models.reference import ragged_batch

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def stepwise_sequence(self, u, h0, lengths=None):
    """Reference for :meth:`StepRNN.sequence`: :meth:`StepRNN.step` once per step."""
    h, out = h0, []
    for u_t in u.unbind(-2):
        h = self.step(u_t, h)
        out.append(h)
    return torch.stack(out, -2)


# ----------------------------------------------------------------- the ragged tanh scan
@pytest.mark.parametrize("lead", [(), (3,)])
def test_tanh_sequence_equals_torch_rnn_on_real_steps(lead):
    """Values and gradients (inputs, h0, all four weights) equal ``nn.RNN`` on the real
    steps; padded steps are zero and get no gradient."""
    torch.manual_seed(0)
    r = StepRNN(4, 6, "tanh")
    lengths = torch.tensor([7, 3, 1, 5])
    u = torch.randn(*lead, 4, 7, 4, requires_grad=True)
    h0 = torch.randn(4, 6, requires_grad=True)
    real = (torch.arange(7) < lengths.unsqueeze(-1)).unsqueeze(-1)
    out = r.sequence(u, h0, lengths)
    N = u[..., 0, 0].numel()
    ref, _ = r.rnn(u.reshape(N, 7, 4), h0.expand(*lead, 4, 6).reshape(1, N, 6).contiguous())
    ref = ref.reshape(out.shape)
    assert torch.equal(out * ~real, torch.zeros_like(out))
    assert torch.allclose(out, ref * real, rtol=0, atol=1e-14)
    w = torch.randn(out.shape)
    wrt = [u, h0, *r.parameters()]
    got = torch.autograd.grad((out * w).sum(), wrt)
    expected = torch.autograd.grad((ref * real * w).sum(), wrt)
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, rtol=0, atol=1e-13)
    assert torch.allclose(r.sequence(u, h0), ref, rtol=0, atol=1e-14)  # no lengths: all steps


def test_tanh_sequence_rows_without_real_steps():
    """A row of length 0 gives zeros and no gradient; the other rows are unaffected."""
    torch.manual_seed(2)
    r = StepRNN(3, 4, "tanh")
    u = torch.randn(3, 5, 3, requires_grad=True)
    h0 = torch.randn(3, 4, requires_grad=True)
    out = r.sequence(u, h0, torch.tensor([5, 0, 2]))
    ref = r.sequence(u[[0, 2]], h0[[0, 2]], torch.tensor([5, 2]))
    assert torch.equal(out[1], torch.zeros(5, 4)) and torch.equal(out[[0, 2]], ref)
    du, dh0 = torch.autograd.grad(out.sum(), [u, h0])
    assert torch.equal(du[1], torch.zeros(5, 3)) and torch.equal(dh0[1], torch.zeros(4))
    none = r.sequence(u, h0, torch.zeros(3, dtype=torch.long))
    assert torch.equal(none, torch.zeros(3, 5, 4))
    assert torch.equal(torch.autograd.grad(none.sum(), h0)[0], torch.zeros(3, 4))


def test_tanh_sequence_gradcheck():
    torch.manual_seed(1)
    r = StepRNN(3, 4, "tanh")
    lengths = torch.tensor([4, 2, 3])
    u = torch.randn(3, 4, 3, requires_grad=True)
    h0 = torch.randn(3, 4, requires_grad=True)
    names = [name for name, _ in r.named_parameters()]
    weights = tuple(p.detach().clone().requires_grad_() for p in r.parameters())

    class Sequence(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.r = r

        def forward(self, u, h0):
            return self.r.sequence(u, h0, lengths)

    def fn(u, h0, *weights):
        params = {f"r.{name}": w for name, w in zip(names, weights)}
        return torch.func.functional_call(Sequence(), params, (u, h0))

    assert torch.autograd.gradcheck(fn, (u, h0) + weights)


# ----------------------------------------------------------------- models against the loop
def storn(prior, cell, likelihood):
    return STORN(
        5, z_dim=3, rnn_dim=6, emission_dim=7, prior=prior, cell=cell, likelihood=likelihood
    )


def vosp(prior, cell, likelihood):
    return VOSP(
        5, z_dim=3, rnn_dim=6, emission_dim=7, prior=prior, cell=cell, likelihood=likelihood
    )


def vrae(prior, cell, likelihood):
    return VRAE(
        5,
        z_dim=3,
        encoder_dim=4,
        decoder_dim=6,
        emission_dim=7,
        prior=prior,
        cell=cell,
        likelihood=likelihood,
    )


CASES = [
    (build, prior, cell, likelihood)
    for build in (storn, vosp, vrae)
    for prior, cell, likelihood in (
        ("white", "tanh", "bernoulli"),
        ("wiener", "tanh", "bernoulli"),
        ("wiener", "gru", "gaussian"),
        ("white", "gru", "gaussian"),
    )
]


def loss_and_grads(m, objective, x, mask, seed=3):
    pyro.set_rng_seed(seed)
    m.zero_grad()
    loss = objective.differentiable_loss(m.model, m.guide, x, mask)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in m.parameters()]


def run_both(m, objective, x, mask, monkeypatch):
    """(loss, grads) time-parallel, then of the reference step loop."""
    parallel = loss_and_grads(m, objective, x, mask)
    with monkeypatch.context() as patch:
        patch.setattr(StepRNN, "sequence", stepwise_sequence)
        patch.setattr(m, "time_parallel", False)
        stepwise = loss_and_grads(m, objective, x, mask)
    return parallel, stepwise


def assert_equal_runs(parallel, stepwise):
    (l1, g1), (l2, g2) = parallel, stepwise
    assert abs(l1 - l2) <= 1e-10 * max(1.0, abs(l2)), (l1, l2)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-10), (a - b).abs().max()
        assert torch.isfinite(a).all()


@pytest.mark.parametrize("build,prior,cell,likelihood", CASES)
def test_trace_elbo_loss_and_gradients_equal_the_step_loop(
    build, prior, cell, likelihood, monkeypatch
):
    """Same seed, ragged batch: loss and every parameter gradient of the time-parallel run
    (batched guide draws, one RNN call, one emission call) equal the step loop's."""
    torch.manual_seed(0)
    m = build(prior, cell, likelihood).double()
    x, mask = ragged_batch(likelihood)
    parallel, stepwise = run_both(m, Trace_ELBO(), x, mask, monkeypatch)
    assert_equal_runs(parallel, stepwise)
    assert parallel[1][0].abs().sum() > 0


@pytest.mark.parametrize("build", [storn, vosp, vrae])
def test_vectorized_particles_equal_the_step_loop(build, monkeypatch):
    """IWAE with a plate the scan does not handle (the ELBOs' particle plate is: tests/models/test_guide_scan_particles.py): the guide keeps its step loop (a plate the scan does not handle (the ELBOs' particle plate is: tests/models/test_guide_scan_particles.py) is not a
    plain guide stack), the model scores all steps at once with the lengths broadcast over
    the particles; loss and gradients equal the step loop's."""
    torch.manual_seed(0)
    m = build("wiener", "tanh", "bernoulli").double()
    x, mask = ragged_batch("bernoulli")
    iwae = IWAE(num_particles=3, max_plate_nesting=1)
    assert_equal_runs(*run_both(m, iwae, x, mask, monkeypatch))


@pytest.mark.parametrize("build", [storn, vosp, vrae])
def test_guide_draws_every_step_at_once_only_under_plain_handlers(build):
    """The plain guide emits presampled sites with the step loop's values for the same seed;
    under a condition, a replay, a plate the scan does not handle (the ELBOs' particle plate is: tests/models/test_guide_scan_particles.py) or with ``time_parallel`` off it runs the
    step loop."""
    m = build("white", "tanh", "bernoulli").double()
    x, mask = ragged_batch("bernoulli")
    T = x.shape[1]

    def trace(fn, seed=5):
        pyro.set_rng_seed(seed)
        return poutine.trace(fn).get_trace(x, mask)

    def presampled(tr):
        return [
            isinstance(tr.nodes[f"z_{t}"]["fn"].base_dist, PresampledValue) for t in range(1, T + 1)
        ]

    fused = trace(m.guide)
    assert all(presampled(fused))
    m.time_parallel = False
    loop = trace(m.guide)
    m.time_parallel = True
    assert not any(presampled(loop))
    for t in range(1, T + 1):
        a, b = fused.nodes[f"z_{t}"]["value"], loop.nodes[f"z_{t}"]["value"]
        assert torch.allclose(a, b, rtol=0, atol=1e-14), t
    fused.compute_log_prob()
    loop.compute_log_prob()
    for t in range(1, T + 1):
        a, b = fused.nodes[f"z_{t}"]["log_prob"], loop.nodes[f"z_{t}"]["log_prob"]
        assert torch.allclose(a, b, rtol=0, atol=1e-12), t
        assert torch.equal(a[~mask[:, t - 1]], torch.zeros_like(a[~mask[:, t - 1]]))
    zs = {f"z_{t}": torch.zeros(4, 3) for t in range(1, T + 1)}
    assert not any(presampled(trace(poutine.condition(m.guide, data=zs))))
    assert not any(presampled(trace(poutine.replay(m.guide, trace=fused))))

    def particles(*args):
        with pyro.plate("another_plate", 2, dim=-2):
            return m.guide(*args)

    assert not any(presampled(trace(particles)))
