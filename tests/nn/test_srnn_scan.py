"""The SRNN guide's fused recursion (:func:`pyro_seq.nn.srnn_guide_scan`) and its use by the
SRNN guide: values and gradients against the per-step loop of ``GaussianMLP``, ELBOs and
parameter gradients against the SRNN's step loop, and the fall-backs to the loop."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import nn

from pyro_seq.distributions import PresampledValue
from pyro_seq.models import SRNN
from pyro_seq.nn import GaussianMLP, srnn_guide_scan
from pyro_seq.nn.mlp import ACTIVATIONS

F64 = torch.float64


def _inputs(B=3, T=6, Z=3, H=5, C=4, activation="clipped_leaky_relu", variance="softplus", seed=0):
    """Posterior and prior MLPs, contexts a, d, a start z0 and noise; the contexts are scaled so
    that the hidden units visit every piece of the clipped leaky ReLU (below -9, the leaky part,
    the identity, above 3)."""
    torch.manual_seed(seed)
    post = GaussianMLP(Z, C, H, Z, activation, 1e-3, variance).to(F64)
    prior = GaussianMLP(Z, C, H + 1, Z, activation, 1e-3, variance).to(F64)
    a = (12 * torch.randn(B, T, C, dtype=F64)).requires_grad_()
    d = (12 * torch.randn(B, T, C, dtype=F64)).requires_grad_()
    z0 = torch.randn(B, Z, dtype=F64, requires_grad=True)
    eps = torch.randn(B, T, Z, dtype=F64)
    return post, prior, a, d, z0, eps


def _loop(post, prior, a, d, z0, eps, residual):
    """The reference: the arithmetic of ``SRNN.guide_step``, GaussianMLP step by step."""
    cq, cp = post.project_context(a), prior.project_context(d)
    wq, wp = post.step_weights(), prior.step_weights()
    z_prev, out = z0, []
    for t in range(eps.shape[1]):
        loc, scale = post(z_prev, cq[:, t], wq)
        step = []
        if residual:
            p_loc, p_scale = prior(z_prev, cp[:, t], wp)
            loc = loc + p_loc
            step = [p_loc, p_scale]
        z_prev = loc + eps[:, t] * scale
        out.append([loc, scale, z_prev] + step)
    return tuple(torch.stack(v, 1) for v in zip(*out))


def _fused(post, prior, a, d, z0, eps, residual):
    q = (post.project_context(a),) + post.step_weights()
    p = (prior.project_context(d),) + prior.step_weights() if residual else None
    return srnn_guide_scan(z0, eps, q, p, post.activation, post.head.min_scale, post.head.variance)


CASES = [
    (residual, activation, variance)
    for residual in (True, False)
    for activation in sorted(ACTIVATIONS)
    for variance in ("softplus", "log")
]


@pytest.mark.parametrize("residual,activation,variance", CASES)
def test_values_and_gradients_equal_the_gaussian_mlp_loop(residual, activation, variance):
    post, prior, a, d, z0, eps = _inputs(activation=activation, variance=variance)
    want = _loop(post, prior, a, d, z0, eps, residual)
    got = _fused(post, prior, a, d, z0, eps, residual)
    assert len(got) == (5 if residual else 3)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=0, atol=1e-12)
    weights = torch.randn(len(got), *eps.shape, dtype=F64)  # a loss reading every output

    def loss(outputs):
        return sum((w * v.sin()).sum() for w, v in zip(weights, outputs))

    params = [z0, a, d] + list(post.parameters()) + list(prior.parameters())
    g_loop = torch.autograd.grad(loss(want), params, allow_unused=True)
    g_fused = torch.autograd.grad(loss(got), params, allow_unused=True)
    for g, w in zip(g_fused, g_loop):
        if w is None:  # the prior without Res_q
            assert g is None or not g.any()
            continue
        assert torch.allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("used", [(2,), (4,), (0, 3)])
def test_gradients_when_some_outputs_are_unused(used):
    """Outputs that get no gradient (None in the backward pass) count as zero."""
    post, prior, a, d, z0, eps = _inputs(seed=5)
    params = [z0, a, d] + list(post.parameters()) + list(prior.parameters())
    grads = []
    for run in (_loop, _fused):
        outputs = run(post, prior, a, d, z0, eps, True)
        loss = sum(outputs[i].square().sum() for i in used)
        grads.append(torch.autograd.grad(loss, params, allow_unused=True))
    for g, w in zip(*grads):
        if w is None:
            assert g is None or not g.any()
        else:
            assert torch.allclose(g, w, rtol=1e-10, atol=1e-12)


def test_the_hidden_units_visit_every_piece_of_the_activation():
    """The inputs above exercise the clipped leaky ReLU's four pieces (else the gradient tests
    would not test its derivative)."""
    post, prior, a, d, z0, eps = _inputs()
    seen = []
    for mlp in (post, prior):
        mlp.activation.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    _loop(post, prior, a, d, z0, eps, True)
    u = torch.cat([v.flatten() for v in seen])
    for low, high in ((-float("inf"), -9), (-9, 0), (0, 3), (3, float("inf"))):
        assert ((u > low) & (u < high)).sum() >= 5, (low, high)


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("variance", ["softplus", "log"])
@pytest.mark.parametrize("lengths", [None, [2, 4, 1]], ids=["full", "ragged"])
def test_gradcheck(residual, variance, lengths):
    post, prior, a, d, z0, eps = _inputs(B=3, T=4, Z=2, H=3, C=2, variance=variance, seed=2)
    lengths = None if lengths is None else torch.tensor(lengths)
    cq = post.project_context(a).detach().requires_grad_()
    cp = prior.project_context(d).detach().requires_grad_()
    wq = [w.detach().requires_grad_() for w in post.step_weights()]
    wp = [w.detach().requires_grad_() for w in prior.step_weights()]
    act = post.activation

    def fn(z0, cq, wzq, whq, bhq, cp, wzp, whp, bhp):
        p = (cp, wzp, whp, bhp) if residual else None
        return srnn_guide_scan(z0, eps, (cq, wzq, whq, bhq), p, act, 1e-3, variance, lengths)

    assert torch.autograd.gradcheck(fn, (z0, cq, *wq, cp, *wp))


LENGTHS = torch.tensor([4, 6, 1, 6])  # unsorted, with a tie and a one-step row
#: rows already in the scan's order (no permutation), and every row full
SORTED_LENGTHS, FULL_LENGTHS = torch.tensor([6, 6, 4, 1]), torch.tensor([6, 6, 6, 6])


@pytest.mark.parametrize("residual,variance", [(True, "softplus"), (False, "log"), (True, "log")])
@pytest.mark.parametrize(
    "lengths", [LENGTHS, SORTED_LENGTHS, FULL_LENGTHS], ids=["unsorted", "sorted", "full"]
)
def test_ragged_values_and_gradients_equal_the_loop_on_real_steps(residual, variance, lengths):
    """With lengths, the real steps are the loop's; padded steps hold loc 0, scale 1, z = eps
    (prior 0 and 1); a loss reading the real steps only (as the masked sites do) has the loop's
    gradients, and gradients reaching the padding are ignored. Rows that are already in the
    scan's order (decreasing lengths, or all full) skip the permutation, with the same results."""
    post, prior, a, d, z0, eps = _inputs(B=4, variance=variance, seed=7)
    want = _loop(post, prior, a, d, z0, eps, residual)
    q = (post.project_context(a),) + post.step_weights()
    p = (prior.project_context(d),) + prior.step_weights() if residual else None
    got = srnn_guide_scan(z0, eps, q, p, post.activation, 1e-3, variance, lengths)
    real = torch.arange(6) < lengths.unsqueeze(-1)
    for g, w in zip(got, want):
        assert torch.allclose(g[real], w[real], rtol=0, atol=1e-12)
    fills = [0.0, 1.0, None, 0.0, 1.0]
    for g, fill in zip(got, fills):
        pad = g[~real]
        assert torch.equal(pad, eps[~real] if fill is None else torch.full_like(pad, fill))
    weights = torch.randn(len(got), *eps.shape, dtype=F64) * real.unsqueeze(-1)

    def loss(outputs):
        return sum((w * v.sin()).sum() for w, v in zip(weights, outputs))

    params = [z0, a, d] + list(post.parameters()) + list(prior.parameters())
    g_loop = torch.autograd.grad(loss(want), params, allow_unused=True)
    g_fused = torch.autograd.grad(loss(got), params, allow_unused=True, retain_graph=True)
    for g, w in zip(g_fused, g_loop):
        if w is None:
            assert g is None or not g.any()
            continue
        assert torch.allclose(g, w, rtol=1e-10, atol=1e-12)
    # a loss on the padding alone gives no gradient to anything
    pad_loss = sum((v.sin() * ~real.unsqueeze(-1)).sum() for v in got)
    for g in torch.autograd.grad(pad_loss, params, allow_unused=True):
        assert g is None or not g.any()


@pytest.mark.parametrize("lengths", [[4, 6, 0, 6], [4, 7, 1, 6], [4, 6, 1], [4.0, 6.0, 1.0, 6.0]])
def test_ragged_lengths_errors(lengths):
    post, prior, a, d, z0, eps = _inputs(B=4)
    q = (post.project_context(a),) + post.step_weights()
    with pytest.raises(ValueError, match="lengths must be"):
        srnn_guide_scan(z0, eps, q, None, post.activation, lengths=torch.tensor(lengths))


def test_errors_name_the_argument():
    post, prior, a, d, z0, eps = _inputs()
    q = (post.project_context(a),) + post.step_weights()
    with pytest.raises(ValueError, match="z0"):
        srnn_guide_scan(z0[:2], eps, q)
    with pytest.raises(ValueError, match="inconsistent prior shapes"):
        srnn_guide_scan(z0, eps, q, (q[0][:, :2],) + q[1:])
    with pytest.raises(ValueError, match="activation"):
        srnn_guide_scan(z0, eps, q, activation=nn.Sigmoid())
    with pytest.raises(ValueError, match="no steps"):
        srnn_guide_scan(z0, eps[:, :0], (q[0][:, :0],) + q[1:])
    with pytest.raises(ValueError, match="variance"):
        srnn_guide_scan(z0, eps, q, variance="exp")


# --- the SRNN guide ---------------------------------------------------------------------------


def _srnn(**options):
    return SRNN(6, d_dim=5, z_dim=3, hidden_dim=8, **options).double()


def _batch():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 7, 6, generator=g) < 0.3).double()
    mask = torch.arange(7) < torch.tensor([7, 5, 2]).unsqueeze(-1)  # padded steps
    return x * mask.unsqueeze(-1), mask


def _fused_sites(fn, x, mask):
    tr = poutine.trace(fn).get_trace(x, mask)
    return [isinstance(tr.nodes[f"z_{t}"]["fn"].base_dist, PresampledValue) for t in range(1, 8)]


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("inference", ["smoothing", "filtering"])
@pytest.mark.parametrize("variance", ["softplus", "log"])
@pytest.mark.parametrize("elbo", [Trace_ELBO, TraceMeanField_ELBO])
def test_srnn_guide_scan_gives_the_step_loops_loss_and_gradients(
    residual, inference, variance, elbo, monkeypatch
):
    """Same seed: the fused guide draws the same noise, so the loss and every parameter
    gradient equal those of the step loop (float64)."""
    x, mask = _batch()
    m = _srnn(residual=residual, inference=inference, variance=variance)
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(SRNN, "guide_scan", lambda self, state, x, mask: False)
        assert all(_fused_sites(m.guide, x, mask)) == fused
        pyro.set_rng_seed(3)
        m.zero_grad()
        loss = elbo().differentiable_loss(m.model, m.guide, x, mask)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    (l1, g1), (l2, g2) = results
    assert torch.allclose(l1, l2, rtol=1e-12, atol=0)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_the_model_reuses_the_priors_of_the_fused_guide(monkeypatch):
    """With Res_q the time-parallel model takes p(z_t | z_{t-1}, d_t) from the fused guide's
    record: the prior MLP's forward never runs in a Trace_ELBO loss (the scan uses its weights
    directly), and the loss equals the ELBO of the same guide trace scored by a model that
    recomputes the prior (replayed against the trace without the guide's state)."""
    x, mask = _batch()
    m = _srnn()
    calls = []
    forward = GaussianMLP.forward

    def counting(self, *args, **kwargs):
        if self is m.prior:
            calls.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GaussianMLP, "forward", counting)
    pyro.set_rng_seed(4)
    loss = Trace_ELBO().loss(m.model, m.guide, x, mask)
    assert calls == []
    pyro.set_rng_seed(4)
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    stripped = guide_tr.copy()
    stripped.remove_node("_RETURN")  # the guide's state and its record
    model_tr = poutine.trace(poutine.replay(m.model, trace=stripped)).get_trace(x, mask)
    assert len(calls) > 0  # this model computed the prior itself
    model_tr.compute_log_prob()
    guide_tr.compute_log_prob()
    elbo = sum(
        site["log_prob_sum"] for site in model_tr.nodes.values() if site["type"] == "sample"
    ) - sum(site["log_prob_sum"] for site in guide_tr.nodes.values() if site["type"] == "sample")
    assert abs(loss + elbo.item()) <= 1e-10 * abs(loss)


def test_srnn_guide_scan_falls_back_to_the_loop():
    """Under a replay, a condition or a plate the scan does not handle (the ELBOs' particle plate is: tests/models/test_guide_scan_particles.py) the step loop runs, and with an
    activation the scan does not know."""
    x, mask = _batch()
    m = _srnn()
    assert all(_fused_sites(m.guide, x, mask))
    zs = {f"z_{t}": torch.zeros(3, 3, dtype=F64) for t in range(1, 8)}
    assert not any(_fused_sites(poutine.condition(m.guide, data=zs), x, mask))
    ref = poutine.trace(m.guide).get_trace(x, mask)
    assert not any(_fused_sites(poutine.replay(m.guide, trace=ref), x, mask))

    def particles(*args):
        with pyro.plate("another_plate", 2, dim=-2):
            return m.guide(*args)

    assert not any(_fused_sites(particles, x, mask))
    other = _srnn()
    other.posterior.activation = nn.Sigmoid()
    assert not any(_fused_sites(other.guide, x, mask))
    other = _srnn()
    other.prior.head.min_scale = 1e-2  # the prior's floor differs from the posterior's
    assert not any(_fused_sites(other.guide, x, mask))


def test_srnn_guide_scan_draws_its_noise_through_normal_rsample(monkeypatch):
    """The noise comes from one ``Normal.rsample`` per step, as in the step loop, so a patched
    standard-normal draw (the speed benchmark's fixed noise) reaches the fused guide too."""
    import torch.distributions.normal as torch_normal

    x, mask = _batch()
    m = _srnn()
    noise = iter(torch.randn(7, 3, 3, dtype=F64).unbind(0))
    drawn = []

    def draw(shape, dtype, device):
        drawn.append(next(noise))
        return drawn[-1]

    monkeypatch.setattr(torch_normal, "_standard_normal", draw)
    tr = poutine.trace(m.guide).get_trace(x, mask)
    assert len(drawn) == 7
    for t in range(7):
        site = tr.nodes[f"z_{t + 1}"]
        assert isinstance(site["fn"].base_dist, PresampledValue)
        normal = site["fn"].base_dist.base.base_dist  # Normal(loc_t, scale_t)
        want = normal.loc + drawn[t] * normal.scale
        assert torch.allclose(site["value"], want, rtol=0, atol=1e-14)
