"""Properties of :class:`LinearGaussianSSM` and the Kalman ops under random models (float64).

Models are drawn with covariance eigenvalues anywhere in [1e-6, 1e6] (so condition numbers up
to 1e12), random orthogonal eigenvectors, a transition of spectral norm at most 1, random
observation matrices, optional controls, time-varying noise and per-element missing data.

* filtered and smoothed covariances are exactly symmetric and positive semi-definite (to
  rounding of their largest eigenvalue); filtered ones also for singular (PSD) initial and
  transition covariances, which are accepted;
* smoothed means of singular models equal the dense reference (this found the smoother
  refusing, or silently inverting rounding, where a large singular prior leaves rounding in
  a singular Sigma_{t+1|t}: tests/ops/test_kalman_singular.py has the regression);
* ``log_prob`` equals the dense joint-Gaussian reference of ``tests/dense_gaussian.py`` within a
  tolerance proportional to the condition number of the observations' covariance;
* smoothing never increases a marginal variance over filtering;
* the sequential and parallel forms agree;
* a broken parameter (NaN, asymmetric, indefinite covariance) is a ValueError naming it.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pyro_seq.distributions import LinearGaussianSSM
from pyro_seq.ops.kalman import kalman_filter, kalman_smoother
from tests.dense_gaussian import condition_z, dense_lgssm, log_marginal, observed_index

from .support import assert_finite, expect_documented

pytestmark = pytest.mark.fuzz

EPS = torch.finfo(torch.float64).eps


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _orthogonal(n, g):
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _cov(log10_eigs, g):
    """A symmetric PD matrix with eigenvalues 10**log10_eigs (exactly symmetric)."""
    U = _orthogonal(len(log10_eigs), g)
    M = U @ torch.diag(10.0 ** torch.tensor(log10_eigs, dtype=torch.float64)) @ U.T
    return 0.5 * (M + M.T)


def _log_eigs(n, singular=False):
    """log10 of ``n`` eigenvalues in [-6, 6]; with ``singular`` some may be -inf (exact 0)."""
    value = st.floats(-6.0, 6.0)
    if singular:
        value = st.one_of(value, value, st.just(-math.inf))
    return st.lists(value, min_size=n, max_size=n)


@st.composite
def models(draw, singular=False):
    """``(params, x, mask, T)`` of an unbatched LGSSM; params keyed as the constructor's.
    ``singular``: the initial and transition covariances may be singular (PSD, accepted)."""
    S, D, T = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    g = _generator(draw(st.integers(0, 2**31 - 1)))
    time_varying = draw(st.booleans())
    nQ = T if time_varying else 1
    A = torch.randn(S, S, generator=g, dtype=torch.float64)
    A = A / torch.linalg.matrix_norm(A, 2).clamp_min(1e-12) * draw(st.floats(0.0, 1.0))
    C = torch.randn(D, S, generator=g, dtype=torch.float64) * 10 ** draw(st.floats(-2, 2))
    P0 = _cov(draw(_log_eigs(S, singular)), g)
    Q = torch.stack([_cov(draw(_log_eigs(S, singular)), g) for _ in range(nQ)])
    R = torch.stack([_cov(draw(_log_eigs(D)), g) for _ in range(nQ)])
    params = dict(
        initial_loc=torch.randn(S, generator=g, dtype=torch.float64),
        initial_cov=P0,
        transition_matrix=A,
        transition_cov=Q if time_varying else Q[0],
        observation_matrix=C,
        observation_cov=R if time_varying else R[0],
        controls=(
            torch.randn(T, S, generator=g, dtype=torch.float64) if draw(st.booleans()) else None
        ),
    )
    # observations of the model's own scale (a draw from it), or plain standard normal ones
    dense = _dense(params, T)
    if draw(st.booleans()):
        L = torch.linalg.cholesky(dense.cov_xx)
        x = dense.mean_x + L @ torch.randn(T * D, generator=g, dtype=torch.float64)
    else:
        x = torch.randn(T * D, generator=g, dtype=torch.float64)
    x = x.reshape(T, D)
    mask = None
    if draw(st.booleans()):
        mask = torch.rand(T, D, generator=g) < draw(st.sampled_from([0.3, 0.7, 0.9]))
    return params, x, mask, T


def _dense(params, T):
    return dense_lgssm(
        params["initial_loc"],
        params["initial_cov"],
        params["transition_matrix"],
        params["transition_cov"],
        params["observation_matrix"],
        params["observation_cov"],
        T,
        offsets=params["controls"],
    )


def _cond(M):
    e = torch.linalg.eigvalsh(M)
    return float(e.max() / e.min().clamp_min(1e-300))


def _assert_symmetric_psd(name, covs, scale=None):
    """Exactly symmetric; no eigenvalue below -100 eps times ``scale`` (default: the matrix's
    largest eigenvalue; eigvalsh itself is accurate to a few eps of it)."""
    assert torch.equal(covs, covs.mT), f"{name} not exactly symmetric"
    eig = torch.linalg.eigvalsh(covs)
    if scale is None:
        scale = eig.abs().amax(-1)
    assert bool((eig.amin(-1) >= -100 * EPS * scale).all()), (
        f"{name} not PSD: smallest eigenvalues {eig.amin(-1)} vs scale {scale}"
    )


METHODS = st.sampled_from(["sequential", "parallel"])


@given(st.one_of(models(), models(singular=True)), METHODS)
def test_log_prob_equals_the_dense_reference(model, method):
    params, x, mask, T = model
    d = LinearGaussianSSM(
        **params,
        num_steps=T,
        observation_mask=mask,
        method=method,
        step_mask=None if mask is None else torch.tensor(True),
    )
    lp = d.log_prob(x)
    assert lp.shape == () and lp.dtype == torch.float64
    assert_finite("log_prob", lp)
    dense = _dense(params, T)
    idx = observed_index(dense, mask)
    ref = log_marginal(dense, x, idx)
    if idx.numel() == 0:
        assert float(lp) == 0.0
        return
    kappa = _cond(dense.cov_xx[idx][:, idx])
    # error of both sides ~ eps * cond * (size of the terms), the quadratic form included
    tol = 100 * EPS * max(kappa, 1.0) * (1.0 + abs(float(ref)) + idx.numel())
    assert abs(float(lp) - float(ref)) <= tol, (float(lp), float(ref), kappa)


@given(models(singular=True), METHODS)
def test_filtered_covariances_are_psd_also_for_singular_models(model, method):
    # singular initial and transition covariances are accepted (PSD); the filter never
    # factorises them alone. Rounding is relative to the largest predicted covariance (the
    # Schur complement P - W^T W cancels from that size).
    params, x, mask, T = model
    f = kalman_filter(x, **params, mask=mask, method=method)
    for name, v in [
        ("filtered means", f.means),
        ("log_likelihoods", f.log_likelihoods),
        ("filtered covs", f.covs),
        ("predicted covs", f.predicted_covs),
    ]:
        assert_finite(name, v)
    scale = f.predicted_covs.abs().amax()
    _assert_symmetric_psd("filtered covs", f.covs, scale)
    _assert_symmetric_psd("predicted covs", f.predicted_covs, scale)


@given(models(), METHODS)
def test_smoothed_covariances_are_psd_and_smoothing_never_increases_variance(model, method):
    params, x, mask, T = model
    sm = kalman_smoother(x, **params, mask=mask, method=method)
    f = sm.filtered
    for name, v in [
        ("filtered means", f.means),
        ("smoothed means", sm.means),
        ("log_likelihoods", f.log_likelihoods),
    ]:
        assert_finite(name, v)
    for name, covs in [
        ("filtered covs", f.covs),
        ("predicted covs", f.predicted_covs),
        ("smoothed covs", sm.covs),
    ]:
        assert_finite(name, covs)
        _assert_symmetric_psd(name, covs)
    var_f = f.covs.diagonal(dim1=-2, dim2=-1)
    var_s = sm.covs.diagonal(dim1=-2, dim2=-1)
    # the RTS gains solve with the predicted covariances: rounding of eps times their condition
    # number, relative to the largest filtered entry (measured: at most ~1.5 of that)
    eig = torch.linalg.eigvalsh(f.predicted_covs)
    kappa = float((eig[..., -1] / eig[..., 0]).max())
    scale = f.covs.abs().amax((-2, -1), keepdim=True).squeeze(-1)
    slack = 1e-9 * var_f.abs() + 100 * EPS * kappa * scale
    assert bool((var_s <= var_f + slack).all()), (var_s - var_f, slack)
    # the last smoothed step is the last filtered one
    assert torch.allclose(sm.covs[-1], f.covs[-1], rtol=1e-9, atol=0)
    # the filter alone gives the same filtered moments
    alone = kalman_filter(x, **params, mask=mask, method=method)
    assert torch.allclose(alone.covs, f.covs, rtol=1e-9, atol=1e-12 * float(scale.max()))


@given(models(singular=True), METHODS)
def test_smoothing_singular_models_matches_the_dense_reference(model, method):
    # Singular P0 / Q (exact zero eigenvalues) next to eigenvalues up to 1e6: the RTS gain
    # solves with a singular Sigma_{t+1|t}. T <= 6 keeps the backward amplification of a
    # contracting noise-free direction (module docstring of pyro_seq.ops.kalman) small.
    # Measured over 600 derandomised examples: max relative error 7.4e-7 (median 2e-16);
    # before the fix 1% refused and one 1.6e59.
    params, x, mask, T = model
    sm = kalman_smoother(x, **params, mask=mask, method=method)
    dense = _dense(params, T)
    mean, _ = condition_z(dense, x, observed_index(dense, mask))
    assert_finite("smoothed means", sm.means)
    assert_finite("smoothed covs", sm.covs)
    err = float((sm.means - mean).abs().max())
    assert err <= 1e-5 * float(mean.abs().max()) + 1e-12, (err, float(mean.abs().max()))


@given(models())
def test_sequential_and_parallel_forms_agree(model):
    params, x, mask, T = model
    seq = kalman_filter(x, **params, mask=mask, method="sequential")
    par = kalman_filter(x, **params, mask=mask, method="parallel")
    dense = _dense(params, T)
    idx = observed_index(dense, mask)
    kappa = _cond(dense.cov_xx[idx][:, idx]) if idx.numel() else 1.0
    total = float(seq.log_likelihoods.sum())
    tol = 1e3 * EPS * max(kappa, 1.0) * (1.0 + abs(total) + x.numel())
    assert abs(float(par.log_likelihoods.sum()) - total) <= tol


# --- broken parameters -------------------------------------------------------------------------

BREAKS = ["nan", "inf", "asymmetric", "indefinite", "singular_R"]


@given(
    models(),
    st.sampled_from(
        [
            "initial_cov",
            "transition_cov",
            "observation_cov",
            "transition_matrix",
            "observation_matrix",
            "initial_loc",
        ]
    ),
    st.sampled_from(BREAKS),
    st.booleans(),
)
def test_a_broken_parameter_is_refused_naming_it(model, name, how, through_distribution):
    params, x, mask, T = model
    p = params[name].clone()
    is_cov = name.endswith("_cov")
    if how in ("nan", "inf") or not is_cov:
        p.view(-1)[0] = float("nan") if how == "nan" else float("inf")
        expected = rf"^{name} (contains NaN or inf)"
    elif how == "asymmetric":
        if p.shape[-1] == 1:  # a 1x1 matrix is symmetric: make it negative instead
            p = -p
            expected = rf"^{name} is not positive"
        else:
            p[..., 0, -1] += 1e-3 * float(p.abs().max()) + 1.0
            expected = rf"^{name} is not symmetric"
    elif how == "indefinite":
        p = p - 2 * torch.linalg.eigvalsh(p).amax(-1)[..., None, None] * torch.eye(
            p.shape[-1], dtype=p.dtype
        )
        p = 0.5 * (p + p.mT)
        expected = rf"^{name} is not positive"
    else:  # singular: allowed for initial/transition covariances, refused for R
        p = torch.zeros_like(p)
        expected = rf"^{name} is not positive definite" if name == "observation_cov" else None
    params = dict(params, **{name: p})
    try:
        if through_distribution:
            out = LinearGaussianSSM(**params, num_steps=T).log_prob(x)
        else:
            out = kalman_filter(x, **params, mask=mask).log_likelihoods
    except Exception as e:  # noqa: BLE001
        assert expected is not None, f"valid singular {name} refused: {e}"
        expect_documented(e, expected)
        return
    assert expected is None, f"broken {name} ({how}) accepted"
    assert_finite("log_prob", out)


@given(models(), st.sampled_from(["nan", "inf", "-inf"]))
def test_non_finite_observations_need_a_mask(model, value):
    params, x, mask, T = model
    x = x.clone()
    x[0, 0] = float(value)
    observed = mask is None or bool(mask[0, 0])
    try:
        out = LinearGaussianSSM(
            **params,
            num_steps=T,
            observation_mask=mask,
            step_mask=None if mask is None else torch.tensor(True),
        ).log_prob(x)
    except Exception as e:  # noqa: BLE001
        assert observed, f"masked {value} refused: {e}"
        expect_documented(e, r"^observations contain .* value\(s\) at entries that are not masked")
        return
    assert not observed
    assert_finite("log_prob", out)
