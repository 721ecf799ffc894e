"""The DMM guide's fused recursion (:func:`pyro_seq.nn.combiner_scan`) and its use by the DMM
guide: values and gradients against the per-step loop, and the fall-backs to the loop."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO

from pyro_seq.distributions import PresampledValue
from pyro_seq.infer import IWAE
from pyro_seq.models import DMM
from pyro_seq.nn import Combiner, GatedTransition, combiner_scan, residual_combiner_scan


def _inputs(B=3, T=5, Z=4, H=6, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    comb = Combiner(Z, H, min_scale=1e-3).to(dtype)
    z0 = torch.randn(B, Z, dtype=dtype, requires_grad=True)
    a = torch.randn(B, T, H, dtype=dtype, requires_grad=True)
    eps = torch.randn(B, T, Z, dtype=dtype)
    return comb, z0, a, eps


def _loop(comb, z0, a, eps):
    """The reference: Combiner step by step, z_t = loc_t + eps_t * scale_t."""
    z_prev, out = z0, []
    for t in range(a.shape[1]):
        loc, scale = comb(z_prev, a[:, t])
        z_prev = loc + eps[:, t] * scale
        out.append((loc, scale, z_prev))
    return tuple(torch.stack(v, 1) for v in zip(*out))


def test_values_equal_the_combiner_loop():
    comb, z0, a, eps = _inputs()
    w_h, b_h = comb.stacked_heads()
    fused = combiner_scan(
        z0, a, eps, comb.z_to_hidden.weight, comb.z_to_hidden.bias, w_h, b_h, comb.min_scale
    )
    for got, want in zip(fused, _loop(comb, z0, a, eps)):
        assert torch.allclose(got, want, rtol=0, atol=1e-13)


def test_gradients_equal_autograd_of_the_loop():
    comb, z0, a, eps = _inputs(seed=1)
    w = torch.randn(3, 5, 4, 3, dtype=torch.float64)  # a loss using loc, scale and z

    def loss(outputs):
        return sum((w[..., i] * v.sin()).sum() for i, v in enumerate(outputs))

    params = [z0, a] + list(comb.parameters())
    g_loop = torch.autograd.grad(loss(_loop(comb, z0, a, eps)), params)
    w_h, b_h = comb.stacked_heads()
    fused = combiner_scan(
        z0, a, eps, comb.z_to_hidden.weight, comb.z_to_hidden.bias, w_h, b_h, comb.min_scale
    )
    g_fused = torch.autograd.grad(loss(fused), params)
    for got, want in zip(g_fused, g_loop):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("lengths", [None, [2, 4, 1]], ids=["full", "ragged"])
def test_gradcheck(lengths):
    comb, z0, a, eps = _inputs(B=3, T=4, Z=2, H=3, seed=2)
    lengths = None if lengths is None else torch.tensor(lengths)
    w_h, b_h = comb.stacked_heads()
    args = (
        z0,
        a,
        comb.z_to_hidden.weight.detach().requires_grad_(),
        comb.z_to_hidden.bias.detach().requires_grad_(),
        w_h.detach().requires_grad_(),
        b_h.detach().requires_grad_(),
    )
    assert torch.autograd.gradcheck(
        lambda z0, a, wz, bz, wh, bh: combiner_scan(z0, a, eps, wz, bz, wh, bh, 1e-3, lengths),
        args,
    )


def test_shape_errors():
    comb, z0, a, eps = _inputs()
    w_h, b_h = comb.stacked_heads()
    with pytest.raises(ValueError, match="inconsistent shapes"):
        combiner_scan(
            z0[:2], a, eps, comb.z_to_hidden.weight, comb.z_to_hidden.bias, w_h, b_h, 1e-3
        )


LENGTHS = torch.tensor([3, 5, 1, 5])  # unsorted, with ties and a one-step row


def _ragged_scan(comb, z0, a, eps, lengths):
    w_h, b_h = comb.stacked_heads()
    return combiner_scan(
        z0, a, eps, comb.z_to_hidden.weight, comb.z_to_hidden.bias, w_h, b_h, 1e-3, lengths
    )


def test_ragged_values_equal_the_loop_on_real_steps_and_fill_the_padding():
    """With lengths, the real steps are the loop's (each row's recursion is its own) and every
    padded step holds loc 0, scale 1, z = eps (a finite value no score reads); the caller's
    noise is not written to."""
    comb, z0, a, eps = _inputs(B=4, T=5, seed=3)
    eps_before = eps.clone()
    fused = _ragged_scan(comb, z0, a, eps, LENGTHS)
    real = torch.arange(5) < LENGTHS.unsqueeze(-1)
    for got, want in zip(fused, _loop(comb, z0, a, eps)):
        assert torch.allclose(got[real], want[real], rtol=0, atol=1e-13)
    loc, scale, z = fused
    assert torch.equal(loc[~real], torch.zeros_like(loc[~real]))
    assert torch.equal(scale[~real], torch.ones_like(scale[~real]))
    assert torch.equal(z[~real], eps[~real])
    assert torch.equal(eps, eps_before)


def test_ragged_gradients_equal_the_loop_with_the_padding_masked():
    """A loss that reads only the real steps (as the masked sites do) has the loop's gradients
    for every input and weight; rows longer than others still pass their gradient back to
    z_0 through all their steps."""
    comb, z0, a, eps = _inputs(B=4, T=5, seed=4)
    real = (torch.arange(5) < LENGTHS.unsqueeze(-1)).unsqueeze(-1).double()
    w = torch.randn(4, 5, 4, 3, dtype=torch.float64)

    def loss(outputs):
        return sum((w[..., i] * v.sin() * real).sum() for i, v in enumerate(outputs))

    params = [z0, a] + list(comb.parameters())
    g_loop = torch.autograd.grad(loss(_loop(comb, z0, a, eps)), params)
    g_fused = torch.autograd.grad(loss(_ragged_scan(comb, z0, a, eps, LENGTHS)), params)
    for got, want in zip(g_fused, g_loop):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    padded_a_grad = g_fused[1][~real.squeeze(-1).bool()]
    assert padded_a_grad.shape == (6, 6) and not padded_a_grad.any()


@pytest.mark.parametrize(
    "lengths",
    [
        torch.tensor([3, 5, 0, 5]),
        torch.tensor([3, 6, 1, 5]),
        torch.tensor([3, 5, 1]),
        torch.tensor([3.0, 5.0, 1.0, 5.0]),
    ],
)
def test_lengths_errors(lengths):
    comb, z0, a, eps = _inputs(B=4, T=5)
    with pytest.raises(ValueError, match="lengths must be"):
        _ragged_scan(comb, z0, a, eps, lengths)


def _residual_inputs(B=4, T=5, Z=3, H=6, Hg=7, seed=0):
    torch.manual_seed(seed)
    comb = Combiner(Z, H).double()
    trans = GatedTransition(Z, Hg).double()
    with torch.no_grad():  # away from the identity start, so every branch matters
        for p in list(comb.parameters()) + list(trans.parameters()):
            p.add_(0.5 * torch.randn_like(p))
    z0 = torch.randn(B, Z, dtype=torch.float64, requires_grad=True)
    zp0 = torch.randn(B, Z, dtype=torch.float64, requires_grad=True)
    a = torch.randn(B, T, H, dtype=torch.float64, requires_grad=True)
    eps = torch.randn(B, T, Z, dtype=torch.float64)
    return comb, trans, z0, zp0, a, eps


def _residual_loop(comb, trans, z0, zp0, a, eps):
    """The reference: DMM.guide_step with Res_q, the combiner's loc plus the transition's mean
    at z_{t-1} (at the model's z_0 for the first step)."""
    z_prev, out = z0, []
    for t in range(a.shape[1]):
        loc, scale = comb(z_prev, a[:, t])
        loc = loc + trans(zp0 if t == 0 else z_prev)[0]
        z_prev = loc + eps[:, t] * scale
        out.append((loc, scale, z_prev))
    return tuple(torch.stack(v, 1) for v in zip(*out))


@pytest.mark.parametrize("lengths", [None, [3, 5, 1, 5]], ids=["full", "ragged"])
def test_residual_scan_values_and_gradients_equal_the_loop(lengths):
    comb, trans, z0, zp0, a, eps = _residual_inputs(seed=6)
    T = a.shape[1]
    lengths = None if lengths is None else torch.tensor(lengths)
    real = torch.ones(4, T, dtype=torch.bool)
    if lengths is not None:
        real = torch.arange(T) < lengths.unsqueeze(-1)
    fused = residual_combiner_scan(z0, zp0, a, eps, comb, trans, lengths)
    loop = _residual_loop(comb, trans, z0, zp0, a, eps)
    for got, want in zip(fused, loop):
        assert torch.allclose(got[real], want[real], rtol=0, atol=1e-13)
    w = torch.randn(3, *eps.shape, dtype=torch.float64) * real.unsqueeze(-1)

    def loss(outputs):
        return sum((w[i] * v.sin()).sum() for i, v in enumerate(outputs))

    params = [z0, zp0, a] + list(comb.parameters()) + list(trans.parameters())
    g_fused = torch.autograd.grad(loss(fused), params, allow_unused=True)
    g_loop = torch.autograd.grad(loss(loop), params, allow_unused=True)
    for got, want in zip(g_fused, g_loop):
        if want is None:  # the transition's scale layer: Res_q reads only its mean
            assert got is None or not got.any()
            continue
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)


def test_residual_scan_gradcheck():
    """gradcheck on a ragged batch, the weights passed through ``functional_call``."""
    comb, trans, z0, zp0, a, eps = _residual_inputs(B=3, T=4, Z=2, H=3, Hg=3, seed=7)
    lengths = torch.tensor([2, 4, 1])
    scan = _ScanModule(comb, trans)
    names = [n for n, _ in scan.named_parameters()]

    def fn(z0, zp0, a, *weights):
        params = dict(zip(names, weights))
        return torch.func.functional_call(scan, params, (z0, zp0, a, eps, lengths))

    weights = [p.detach().clone().requires_grad_() for p in scan.parameters()]
    assert torch.autograd.gradcheck(fn, (z0, zp0, a, *weights))


class _ScanModule(torch.nn.Module):
    def __init__(self, comb, trans):
        super().__init__()
        self.comb, self.trans = comb, trans

    def forward(self, z0, zp0, a, eps, lengths):
        return residual_combiner_scan(z0, zp0, a, eps, self.comb, self.trans, lengths)


def test_presampled_value_draws_its_value_and_refuses_other_shapes():
    base = pyro.distributions.Normal(torch.zeros(3, 2), 1.0).to_event(1)
    value = torch.randn(3, 2, requires_grad=True)
    d = PresampledValue(base, value, base.log_prob(value))
    assert d.rsample() is value
    assert torch.equal(d.sample(), value.detach()) and not d.sample().requires_grad
    assert d.log_prob(value) is d.log_prob_value
    assert d.expand((3,)) is d
    with pytest.raises(RuntimeError, match="sample_shape"):
        d.rsample((2,))
    with pytest.raises(RuntimeError, match="cannot be expanded"):
        d.expand((4, 3))
    q = pyro.distributions.Normal(torch.ones(3, 2), 2.0).to_event(1)
    kl = torch.distributions.kl_divergence(d, q)
    assert torch.allclose(kl, torch.distributions.kl_divergence(base, q))


def _dmm(inference="smoothing", residual=False, **options):
    return DMM(
        6,
        z_dim=3,
        transition_dim=8,
        emission_dim=8,
        rnn_dim=8,
        inference=inference,
        residual=residual,
        **options,
    ).double()


def _batch():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 7, 6, generator=g) < 0.3).double()
    mask = torch.arange(7) < torch.tensor([7, 5, 2]).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


def _without_scan(monkeypatch):
    monkeypatch.setattr(DMM, "guide_scan", lambda self, state, x, mask: False)


@pytest.mark.parametrize("inference", ["smoothing", "filtering"])
@pytest.mark.parametrize("elbo", [Trace_ELBO, TraceMeanField_ELBO])
@pytest.mark.parametrize("residual", [False, True], ids=["combiner", "res_q"])
def test_dmm_guide_scan_gives_the_step_loops_loss_and_gradients(
    inference, elbo, residual, monkeypatch
):
    """Same seed: the fused guide draws the same values, so the loss and every parameter
    gradient equal those of the step loop (float64), with and without Res_q."""
    x, mask = _batch()
    m = _dmm(inference, residual=residual)
    results = []
    for fused in (True, False):
        if not fused:
            _without_scan(monkeypatch)
        pyro.set_rng_seed(3)
        m.zero_grad()
        guide_tr = poutine.trace(m.guide).get_trace(x, mask)
        assert all(
            isinstance(guide_tr.nodes[f"z_{t}"]["fn"].base_dist, PresampledValue) == fused
            for t in range(1, 8)
        )
        pyro.set_rng_seed(3)
        loss = elbo().differentiable_loss(m.model, m.guide, x, mask)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    (l1, g1), (l2, g2) = results
    assert torch.allclose(l1, l2, rtol=1e-12)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_dmm_guide_scan_falls_back_to_the_loop():
    """Under a replay, a condition, a plate the scan does not handle (the ELBOs' particle plate
    is: tests/models/test_guide_scan_particles.py) or with Res_q and known inputs the step loop
    runs."""
    x, mask = _batch()
    m = _dmm()

    def fused_sites(fn):
        tr = poutine.trace(fn).get_trace(x, mask)
        return [
            isinstance(tr.nodes[f"z_{t}"]["fn"].base_dist, PresampledValue) for t in range(1, 8)
        ]

    assert all(fused_sites(m.guide))
    zs = {f"z_{t}": torch.zeros(3, 3, dtype=torch.float64) for t in range(1, 8)}
    assert not any(fused_sites(poutine.condition(m.guide, data=zs)))
    ref = poutine.trace(m.guide).get_trace(x, mask)
    assert not any(fused_sites(poutine.replay(m.guide, trace=ref)))

    def particles(*args):
        with pyro.plate("another_plate", 2, dim=-2):
            return m.guide(*args)

    assert not any(fused_sites(particles))
    assert all(fused_sites(_dmm(residual=True).guide))
    inputs = torch.randn(3, 7, 2, dtype=torch.float64)
    with_inputs = _dmm(residual=True, input_dim=2)
    tr = poutine.trace(with_inputs.guide).get_trace(x, mask, inputs=inputs)
    assert not any(
        isinstance(tr.nodes[f"z_{t}"]["fn"].base_dist, PresampledValue) for t in range(1, 8)
    )


def test_dmm_iwae_vectorized_trains():
    x, mask = _batch()
    m = _dmm()
    loss = IWAE(num_particles=3).differentiable_loss(m.model, m.guide, x, mask)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_scored_value_builds_its_distribution_only_when_used():
    like = pyro.distributions.Normal(torch.zeros(3, 2), 1.0).to_event(1)
    built = []

    def make():
        built.append(1)
        return pyro.distributions.Normal(torch.ones(3, 2), 2.0).to_event(1)

    from pyro_seq.distributions import ScoredValue

    value = torch.randn(3, 2)
    d = ScoredValue((like, make), value, torch.zeros(3))
    assert d.batch_shape == (3,) and d.event_shape == (2,) and d.has_rsample
    assert d.log_prob(value) is d.log_prob_value and built == []
    other = torch.randn(3, 2)
    assert torch.allclose(d.log_prob(other), make().log_prob(other)) and len(built) == 2
    assert torch.equal(d.mean, torch.ones(3, 2)) and len(built) == 2  # built once, then kept
