"""DiagonalNormalMixture against torch's MixtureSameFamily, brute-force integrals and samples."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.distributions import (
    Categorical,
    Independent,
    MixtureSameFamily,
    MultivariateNormal,
    Normal,
)

from pyro_seq.distributions import DiagonalNormalMixture


def _random_mixture(batch=(3,), K=4, D=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch + (K,), generator=g)
    loc = 2 * torch.randn(batch + (K, D), generator=g)
    scale = 0.3 + torch.rand(batch + (K, D), generator=g)
    return logits, loc, scale


def _torch_reference(logits, loc, scale):
    """The same mixture built from torch's own classes (an independent implementation)."""
    return MixtureSameFamily(Categorical(logits=logits), Independent(Normal(loc, scale), 1))


def test_shapes_and_log_prob_equal_torch_mixture(float64):
    logits, loc, scale = _random_mixture()
    d = DiagonalNormalMixture(logits, loc, scale)
    assert d.batch_shape == (3,) and d.event_shape == (5,) and d.num_components == 4
    x = torch.randn(2, 3, 5)
    ref = _torch_reference(logits, loc, scale).log_prob(x)
    assert d.log_prob(x).shape == (2, 3)
    torch.testing.assert_close(d.log_prob(x), ref, rtol=1e-12, atol=0)


def test_single_component_is_the_diagonal_gaussian(float64):
    loc, scale = torch.randn(3, 1, 4), torch.rand(3, 1, 4) + 0.2
    d = DiagonalNormalMixture(torch.randn(3, 1), loc, scale)
    x = torch.randn(3, 4)
    ref = Normal(loc[:, 0], scale[:, 0]).log_prob(x).sum(-1)
    torch.testing.assert_close(d.log_prob(x), ref, rtol=1e-12, atol=0)


def test_density_integrates_to_one_in_two_dimensions(float64):
    """Brute force: a Riemann sum of exp(log p) over a grid covering every component."""
    logits, loc, scale = _random_mixture(batch=(), K=3, D=2, seed=1)
    d = DiagonalNormalMixture(logits, loc, scale)
    lo, hi = (loc - 10 * scale).min().item(), (loc + 10 * scale).max().item()
    grid = torch.linspace(lo, hi, 1201)
    h = grid[1] - grid[0]
    xx = torch.stack(torch.meshgrid(grid, grid, indexing="ij"), -1)
    total = d.log_prob(xx).exp().sum() * h * h
    assert abs(total.item() - 1) < 1e-9


def test_mean_and_variance_equal_torch_mixture(float64):
    logits, loc, scale = _random_mixture()
    d, ref = DiagonalNormalMixture(logits, loc, scale), _torch_reference(logits, loc, scale)
    torch.testing.assert_close(d.mean, ref.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d.variance, ref.variance, rtol=1e-12, atol=1e-12)


def test_samples_match_moments_and_cdf():
    """Sample mean/variance within 5 standard errors; P(x_d < c) against the closed-form CDF."""
    logits, loc, scale = _random_mixture(batch=(2,), K=3, D=3, seed=2)
    d = DiagonalNormalMixture(logits, loc, scale)
    n = 40000
    x = d.sample((n,))
    assert x.shape == (n, 2, 3) and not x.requires_grad
    mean, var = d.mean, d.variance
    se_mean = (var / n).sqrt()
    assert ((x.mean(0) - mean).abs() < 5 * se_mean).all()
    fourth = ((x - mean) ** 4).mean(0)  # SE of the sample variance
    se_var = ((fourth - var**2) / n).sqrt()
    assert ((x.var(0) - var).abs() < 5 * se_var).all()
    c = mean  # a threshold in the bulk
    w = torch.softmax(logits, -1).unsqueeze(-1)
    cdf = (w * Normal(loc, scale).cdf(c.unsqueeze(-2))).sum(-2)
    frac = (x < c).double().mean(0)
    se = (cdf * (1 - cdf) / n).sqrt()
    assert ((frac - cdf).abs() < 5 * se).all()


def test_sample_picks_one_component_per_draw():
    """With tiny scales every draw lies next to one of the component means (and all occur)."""
    loc = torch.tensor([[-5.0, 1.0], [0.0, 0.0], [7.0, -3.0]])
    d = DiagonalNormalMixture(torch.zeros(3), loc, torch.full((3, 2), 1e-4))
    x = d.sample((3000,))
    dist_to = (x.unsqueeze(-2) - loc).norm(dim=-1)  # (n, 3)
    assert (dist_to.min(-1).values < 1e-2).all()
    counts = torch.bincount(dist_to.argmin(-1), minlength=3).double()
    se = math.sqrt(3000 * (1 / 3) * (2 / 3))
    assert ((counts - 1000).abs() < 5 * se).all()


def test_sample_shape_may_be_a_list_or_tuple_as_in_torch():
    d = DiagonalNormalMixture(torch.zeros(2, 3), torch.zeros(2, 3, 4), torch.ones(2, 3, 4))
    for shape in ([5], (5,), torch.Size([5])):
        torch.manual_seed(0)
        x = d.sample(shape)
        assert x.shape == (5, 2, 4)
    torch.manual_seed(0)
    assert torch.equal(d.sample([5]), x)  # the same draws whatever the sequence type


def test_no_rsample_and_support():
    d = DiagonalNormalMixture(*_random_mixture())
    assert not d.has_rsample
    with pytest.raises(NotImplementedError):
        d.rsample()
    assert d.support is dist.constraints.real_vector


def test_expand_and_broadcasting(float64):
    logits, loc, scale = _random_mixture(batch=(3,))
    d = DiagonalNormalMixture(logits, loc, scale)
    e = d.expand((2, 3))
    assert e.batch_shape == (2, 3) and e.event_shape == (5,)
    x = torch.randn(2, 3, 5)
    torch.testing.assert_close(e.log_prob(x), d.log_prob(x), rtol=0, atol=0)
    assert e.sample().shape == (2, 3, 5)
    # parameters broadcast: shared components, batched logits
    b = DiagonalNormalMixture(torch.randn(6, 4), loc[0], scale[0])
    assert b.batch_shape == (6,)
    ref = _torch_reference(b.logits, loc[0].expand(6, 4, 5), scale[0].expand(6, 4, 5))
    y = torch.randn(6, 5)
    torch.testing.assert_close(b.log_prob(y), ref.log_prob(y), rtol=1e-12, atol=0)


def test_bad_shapes_raise():
    logits, loc, scale = _random_mixture()
    with pytest.raises(ValueError, match="components"):
        DiagonalNormalMixture(logits[..., :3], loc, scale)
    with pytest.raises(ValueError, match="loc"):
        DiagonalNormalMixture(logits, loc, scale[..., :2])
    with pytest.raises(ValueError, match="needs logits"):
        DiagonalNormalMixture(logits, loc[0, 0], scale)
    with pytest.raises(ValueError):  # argument validation: scale > 0
        DiagonalNormalMixture(logits, loc, -scale, validate_args=True)


def test_masked_log_prob_all_true_equals_log_prob_and_all_false_is_zero(float64):
    d = DiagonalNormalMixture(*_random_mixture())
    x = torch.randn(3, 5)
    full = d.masked_log_prob(x, torch.ones(5, dtype=torch.bool))
    assert (full - d.log_prob(x)).abs().max() <= 1e-12 * d.log_prob(x).abs().max()
    assert torch.equal(d.masked_log_prob(x, None), d.log_prob(x))
    none = d.masked_log_prob(x, torch.zeros(3, 5, dtype=torch.bool))
    assert torch.equal(none, torch.zeros(3))


def test_masked_log_prob_is_the_marginal_of_the_observed_dims(float64):
    """Against torch's mixture of full-covariance Gaussians on the observed dims (closed-form
    marginal of a Gaussian mixture: same weights, each component's marginal)."""
    logits, loc, scale = _random_mixture(batch=(4,), K=3, D=5, seed=3)
    d = DiagonalNormalMixture(logits, loc, scale)
    x = torch.randn(4, 5)
    masks = torch.tensor(
        [[1, 0, 1, 1, 0], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]]
    ).bool()
    got = d.masked_log_prob(x, masks)
    for b in range(4):
        obs = masks[b].nonzero().squeeze(-1)
        cov = torch.diag_embed(scale[b][:, obs] ** 2)
        ref = MixtureSameFamily(
            Categorical(logits=logits[b]), MultivariateNormal(loc[b][:, obs], covariance_matrix=cov)
        )
        torch.testing.assert_close(got[b], ref.log_prob(x[b, obs]), rtol=1e-12, atol=0)


def test_masked_log_prob_equals_numerical_integral_over_a_missing_dim(float64):
    """log p(x_0, x_2) = log ∫ p(x_0, x_1, x_2) dx_1, by a fine Riemann sum over x_1."""
    logits, loc, scale = _random_mixture(batch=(), K=3, D=3, seed=4)
    d = DiagonalNormalMixture(logits, loc, scale)
    x = torch.tensor([0.3, float("nan"), -1.2])
    lo, hi = (
        (loc[:, 1] - 12 * scale[:, 1]).min().item(),
        (loc[:, 1] + 12 * scale[:, 1]).max().item(),
    )
    grid = torch.linspace(lo, hi, 20001)
    pts = x.repeat(len(grid), 1)
    pts[:, 1] = grid
    integral = torch.logsumexp(d.log_prob(pts), 0) + math.log(grid[1] - grid[0])
    got = d.masked_log_prob(x, torch.tensor([True, False, True]))
    assert abs(got.item() - integral.item()) < 1e-10 * abs(integral.item()) + 1e-12


def test_nan_at_masked_entries_reaches_neither_value_nor_gradients(float64):
    logits, loc, scale = (t.clone().requires_grad_() for t in _random_mixture(batch=(3,)))
    x = torch.randn(3, 5)
    mask = torch.rand(3, 5, generator=torch.Generator().manual_seed(5)) < 0.5
    mask[0] = False  # a row with nothing observed
    x_nan = torch.where(mask, x, torch.full_like(x, float("nan"))).requires_grad_()
    d = DiagonalNormalMixture(logits, loc, scale)
    lp = d.masked_log_prob(x_nan, mask)
    assert torch.isfinite(lp).all() and lp[0] == 0
    grads = torch.autograd.grad(lp.sum(), (logits, loc, scale, x_nan))
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[3][~mask] == 0).all() and (
        grads[1][~mask.unsqueeze(-2).expand_as(loc)] == 0
    ).all()
    # the same value as with finite (arbitrary) numbers at the masked entries
    torch.testing.assert_close(lp, d.masked_log_prob(x + 100 * (~mask), mask), rtol=0, atol=0)


def test_masked_log_prob_bad_masks_raise():
    d = DiagonalNormalMixture(*_random_mixture())
    x = torch.randn(3, 5)
    with pytest.raises(ValueError, match="bool"):
        d.masked_log_prob(x, torch.ones(3, 5))
    with pytest.raises(ValueError, match="last dim"):
        d.masked_log_prob(x, torch.ones(3, 4, dtype=torch.bool))


def test_in_a_pyro_site_with_plate():
    """A site with this observation distribution scores log_prob through Pyro's trace."""
    logits, loc, scale = _random_mixture(batch=(3,))
    x = torch.randn(3, 5)

    def model():
        with pyro.plate("b", 3):
            pyro.sample("x", DiagonalNormalMixture(logits, loc, scale), obs=x)

    tr = pyro.poutine.trace(model).get_trace()
    tr.compute_log_prob()
    torch.testing.assert_close(
        tr.nodes["x"]["log_prob"], _torch_reference(logits, loc, scale).log_prob(x)
    )
