"""Long sequences (Pyro users report GaussianHMM.rsample going wrong beyond ~1e4 steps and
a Cholesky failure in its sequential tensordot, Pyro #2017).

T = 1e5 in float32 and float64, for a time-varying model (no steady-state shortcut) and a
time-invariant one: log-likelihood, smoothing and posterior sampling stay finite and
float32 agrees with float64 within tolerances derived from eps32 = 1.19e-7 and T:

* smoothed/filtered means and covariances: the filter and RTS recursions are contractive
  here (spectral radius of A_t <= 0.9), so a rounding error made at one step decays
  instead of accumulating over T: per step about k eps32 relative with k ~ 10 flops per
  entry (S = 2), times at most 1 / (1 - 0.9) = 10 of accumulation, i.e. 100 eps32 = 1.2e-5
  relative to the largest entry, independent of T (measured: <= 4 eps32).
* log p(x_{1:T}) = sum_t ll_t: each term has a relative error of about k eps32 (k ~ 10),
  and they add up with at most that size each, so |ll32 - ll64| <= 10 eps32 sum_t |ll_t|
  (linear in T; 0.19 here, against float32's own resolution of ~0.008 at 1.6e5;
  measured: 1e-3 to 3e-3).

The default run uses ``method="auto"`` (the parallel scan; each test about 1 s on a shared
2-core machine). The sequential loops at T = 1e5 are marked slow (smoother + FFBS in both
dtypes: 25 s time-varying, 11 s time-invariant); a T = 1e4 sequential version (2.4 s)
runs by default. Posterior sample moments are checked at T = 1e4 (0.9-1.7 s).
"""

import math

import pytest
import torch

from pyro_seq.ops import kalman_sample, kalman_smoother
from tests.ops.test_kalman import random_model

EPS32 = torch.finfo(torch.float32).eps


def _model(T, time_varying, seed=0):
    p = random_model(S=2, D=1, T=T if time_varying else 1, time_varying=time_varying, seed=seed)
    x = torch.randn(T, 1, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return p, x


def _check_long(T, time_varying, method):
    p, x = _model(T, time_varying)
    out = {}
    for dtype in (torch.float64, torch.float32):
        pd = {k: v.to(dtype) for k, v in p.items()}
        s = kalman_smoother(x.to(dtype), **pd, method=method)
        z = kalman_sample(x.to(dtype), **pd, sample_shape=(2,), method=method).samples
        for t in list(s[:4]) + list(s.filtered) + [z]:
            assert t.dtype == dtype and torch.isfinite(t).all()
        out[dtype] = s
    s32, s64 = out[torch.float32], out[torch.float64]
    pairs = [
        (s32.means, s64.means),
        (s32.covs, s64.covs),
        (s32.cross_covs, s64.cross_covs),
        (s32.filtered.means, s64.filtered.means),
        (s32.filtered.covs, s64.filtered.covs),
    ]
    for a, b in pairs:
        assert (a.double() - b).abs().max() <= 100 * EPS32 * b.abs().max()
    ll64 = s64.filtered.log_likelihoods
    ll32 = s32.filtered.log_likelihoods.sum().double()
    assert abs(ll32 - ll64.sum()) <= 10 * EPS32 * ll64.abs().sum()


@pytest.mark.parametrize("time_varying", [True, False], ids=["time_varying", "time_invariant"])
def test_long_sequence_float32_matches_float64(time_varying):
    _check_long(100_000, time_varying, "auto")


@pytest.mark.slow
@pytest.mark.parametrize("time_varying", [True, False], ids=["time_varying", "time_invariant"])
def test_long_sequence_sequential(time_varying):
    _check_long(100_000, time_varying, "sequential")


def test_long_sequence_sequential_short():
    """Default-run stand-in for the slow test above (T = 1e4, same tolerances)."""
    _check_long(10_000, True, "sequential")


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_posterior_sample_moments_long_sequence(method):
    """N = 400 FFBS draws at T = 1e4 (time-varying model) against the smoothed moments.

    Per entry (T S = 2e4 of them): the sample mean within 5.5 standard errors
    sqrt(var / N), and the sample variance ratio s^2 / var within 5.5 sqrt(2 / (N - 1))
    of 1 (normal approximation to chi^2_{N-1}); Bonferroni over 2e4 entries gives a
    family-wise false-alarm probability about 2e4 * 3.8e-8 = 8e-4 for each check.
    Pooled, for systematic errors: on every 50th step (posterior correlation between them
    below 0.9^50 = 5e-3, so the 200 points are independent), the mean of the squared
    z-scores of the means is 1 +- 5 sqrt(2 / 200), and the mean variance ratio is
    1 +- 5 sqrt(2 / (N - 1)) / sqrt(200).
    """
    T, N = 10_000, 400
    p, x = _model(T, True, seed=3)
    s = kalman_smoother(x, **p, method=method)
    torch.manual_seed(0)
    z = kalman_sample(x, **p, sample_shape=(N,), method=method).samples  # (N, T, S)
    assert torch.isfinite(z).all()
    var = s.covs.diagonal(dim1=-2, dim2=-1)  # (T, S)
    zscore = (z.mean(0) - s.means) / (var / N).sqrt()
    ratio = z.var(0) / var
    assert zscore.abs().max() <= 5.5
    assert (ratio - 1).abs().max() <= 5.5 * math.sqrt(2 / (N - 1))
    thin = slice(0, T, 50)
    n = len(range(0, T, 50))
    assert abs(zscore[thin, 0].pow(2).mean() - 1) <= 5 * math.sqrt(2 / n)
    assert abs(ratio[thin, 0].mean() - 1) <= 5 * math.sqrt(2 / (N - 1)) / math.sqrt(n)
    # lag-one covariance of the draws against the smoother's cross covariances, pooled
    # the same way (standard error of a sample covariance: sqrt((s_aa s_bb + s_ab^2) / N))
    zc = z - z.mean(0)
    emp = (zc[:, 1:, 0] * zc[:, :-1, 0]).sum(0) / (N - 1)
    cross = s.cross_covs[:, 0, 0]
    se = ((var[1:, 0] * var[:-1, 0] + cross**2) / N).sqrt()
    assert ((emp - cross) / se)[thin].pow(2).mean() <= 1 + 5 * math.sqrt(2 / n)
