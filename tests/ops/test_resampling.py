import math

import pytest
import torch

from pyro_seq.ops.resampling import (
    RESAMPLING_SCHEMES,
    effective_sample_size,
    log_mean_exp,
    normalize_log_weights,
    resample,
)


def offspring_counts(ancestors, K):
    """(K, B) ancestors -> (K, B) number of offspring of each particle."""
    counts = torch.zeros(K, ancestors.shape[1], dtype=torch.float64)
    return counts.scatter_add_(0, ancestors, torch.ones_like(counts))


def test_log_mean_exp_matches_direct():
    x = torch.randn(5, 7, dtype=torch.float64)
    for dim in (0, 1, -1):
        expected = x.exp().mean(dim).log()
        assert torch.allclose(log_mean_exp(x, dim), expected, atol=1e-12)
    assert log_mean_exp(x, 1, keepdim=True).shape == (5, 1)
    # stable for huge values where the direct formula overflows
    big = torch.tensor([1000.0, 1000.0, 1000.0 + math.log(4.0)], dtype=torch.float64)
    assert torch.allclose(
        log_mean_exp(big, 0), torch.tensor(1000.0 + math.log(2.0), dtype=torch.float64)
    )
    assert torch.isneginf(log_mean_exp(torch.full((3,), -math.inf), 0))


def test_normalize_log_weights():
    lw = torch.randn(6, 4, dtype=torch.float64) * 10
    w = normalize_log_weights(lw).exp()
    assert torch.allclose(w.sum(0), torch.ones(4, dtype=torch.float64))
    assert torch.allclose(w, torch.softmax(lw, 0))


def test_ess_closed_forms():
    K = 10
    # equal weights -> K, for any additive constant
    assert torch.allclose(
        effective_sample_size(torch.full((K, 3), -123.4)), torch.full((3,), float(K))
    )
    # one particle with all the weight -> 1
    lw = torch.full((K,), -math.inf)
    lw[3] = 2.0
    assert torch.allclose(effective_sample_size(lw), torch.tensor(1.0))
    # m particles with weight a, K-m with weight b: (m a + (K-m) b)^2 / (m a^2 + (K-m) b^2)
    a, b, m = 3.0, 0.5, 4
    w = torch.tensor([a] * m + [b] * (K - m), dtype=torch.float64)
    expected = (m * a + (K - m) * b) ** 2 / (m * a**2 + (K - m) * b**2)
    assert torch.allclose(
        effective_sample_size(w.log()), torch.tensor(expected, dtype=torch.float64)
    )
    # general: 1 / sum(normalized^2), along another dim
    lw = torch.randn(3, K, dtype=torch.float64)
    wn = torch.softmax(lw, -1)
    assert torch.allclose(effective_sample_size(lw, dim=1), 1.0 / (wn**2).sum(-1))


@pytest.mark.parametrize("scheme", RESAMPLING_SCHEMES)
def test_resample_shapes_and_range(scheme):
    g = torch.Generator().manual_seed(0)
    lw = torch.randn(7, 2, 3)
    anc = resample(lw, scheme, generator=g)
    assert anc.shape == (7, 2, 3) and anc.dtype == torch.long
    assert anc.min() >= 0 and anc.max() < 7
    # no gradient flows, even if the log-weights require grad
    lw_req = lw.clone().requires_grad_()
    assert not resample(lw_req, scheme).requires_grad
    # a 1-d input (no batch dims) works too
    assert resample(torch.zeros(5), scheme).shape == (5,)
    # zero-weight particles are never chosen
    lw0 = torch.randn(6, 50)
    lw0[2] = -math.inf
    assert (resample(lw0, scheme, generator=g) != 2).all()
    # reproducible with a generator
    a1 = resample(lw, scheme, generator=torch.Generator().manual_seed(5))
    a2 = resample(lw, scheme, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a1, a2)


def test_resample_rejects_bad_input():
    with pytest.raises(ValueError):
        resample(torch.zeros(3, 2), "residual-typo")
    with pytest.raises(ValueError):
        resample(torch.full((3, 2), -math.inf), "systematic")


def _stratified_count_variance(w, K):
    """Exact variance of stratified offspring counts: a sum over strata j of independent
    Bernoulli(p_jk) with p_jk = K * |[c_{k-1}, c_k) cap [j/K, (j+1)/K)|."""
    c = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(w, 0)])
    lo_s = torch.arange(K, dtype=torch.float64) / K
    hi_s = lo_s + 1.0 / K
    lo = torch.maximum(c[:-1, None], lo_s[None])
    hi = torch.minimum(c[1:, None], hi_s[None])
    p = (K * (hi - lo)).clamp(0, 1)  # (particles, strata)
    return (p * (1 - p)).sum(1)


@pytest.mark.parametrize("scheme", RESAMPLING_SCHEMES)
def test_offspring_counts_are_unbiased(scheme):
    """E[#offspring_k] = K w_k, checked with N independent replicates (batch dim)."""
    K, N = 8, 20000
    torch.manual_seed(1)
    w = torch.softmax(torch.randn(K, dtype=torch.float64) * 1.5, 0)
    lw = w.log().unsqueeze(-1).expand(K, N)
    counts = offspring_counts(resample(lw, scheme, generator=torch.Generator().manual_seed(2)), K)
    assert torch.all(counts.sum(0) == K)
    mean = counts.mean(1)
    target = K * w
    if scheme == "multinomial":
        var = K * w * (1 - w)  # Multinomial(K, w) marginal variance
    elif scheme == "systematic":
        f = target - target.floor()  # count = floor(K w) + Bernoulli(frac(K w))
        var = f * (1 - f)
    else:
        var = _stratified_count_variance(w, K)
    se = (var / N).sqrt()
    # 4 standard errors per particle (8 comparisons; per-comparison false alarm ~6e-5)
    assert torch.all((mean - target).abs() <= 4 * se + 1e-12), (mean, target, se)
    # the empirical variance matches the closed form; SE of a sample variance is
    # sqrt((mu4 - sigma^4) / N), with the fourth central moment mu4 estimated from the sample
    emp_var = counts.var(1)
    mu4 = ((counts - mean[:, None]) ** 4).mean(1)
    se_var = ((mu4 - emp_var**2).clamp(min=0) / N).sqrt()
    assert torch.all((emp_var - var).abs() <= 5 * se_var + 1e-9), (emp_var, var, se_var)


@pytest.mark.parametrize("scheme", ["systematic", "stratified"])
def test_low_variance_count_bounds(scheme):
    """Systematic: count_k in {floor(K w_k), ceil(K w_k)}. Stratified: the interval of length w_k
    meets at most ceil(K w_k) + 1 strata and fully contains at least floor(K w_k) - 1."""
    K, N = 16, 2000
    torch.manual_seed(3)
    w = torch.softmax(torch.randn(K, N, dtype=torch.float64) * 2, 0)
    counts = offspring_counts(
        resample(w.log(), scheme, generator=torch.Generator().manual_seed(4)), K
    )
    target = K * w
    slack = 0 if scheme == "systematic" else 1
    assert torch.all(counts >= target.floor() - slack - 1e-9)
    assert torch.all(counts <= target.ceil() + slack + 1e-9)
    if scheme == "stratified":
        # the slack is really needed for stratified (so the bound above is tight): some counts
        # fall outside [floor, ceil]
        assert torch.any((counts < target.floor() - 1e-9) | (counts > target.ceil() + 1e-9))


def test_degenerate_weights_resample_single_particle():
    K = 5
    lw = torch.full((K, 4), -math.inf)
    lw[2] = 0.0
    for scheme in RESAMPLING_SCHEMES:
        assert torch.all(resample(lw, scheme) == 2)


def test_default_scheme_and_deprecated_alias():
    """The scheme is ``resampling``, default "systematic"; ``scheme=`` still works for one
    release and emits a FutureWarning naming ``resampling``."""
    lw = torch.randn(9, 40, dtype=torch.float64)

    def draw(*args, **kw):
        return resample(lw, *args, generator=torch.Generator().manual_seed(3), **kw)

    assert torch.equal(draw(), draw(resampling="systematic"))
    assert torch.equal(draw(), draw("systematic"))  # positional, as before
    assert not torch.equal(draw(), draw(resampling="multinomial"))  # the default is not multinomial
    for name in RESAMPLING_SCHEMES:
        with pytest.warns(FutureWarning, match="`scheme` is deprecated.*use `resampling`"):
            assert torch.equal(draw(scheme=name), draw(resampling=name))
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="both"):
        draw(resampling="multinomial", scheme="stratified")
    with pytest.raises(ValueError, match="resampling"):
        draw(resampling="residual")
