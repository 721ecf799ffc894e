"""Bad and special inputs of the ops Kalman functions: non-finite observations (refused, or
NaN as missing on request), T = 0, invalid covariances under ``validate_args``, and NaN
placeholders at masked positions (values and gradients must stay finite: PyTorch's
where/mask gradient trap, Pyro #2654)."""

import math

import pytest
import torch

from pyro_seq.ops import kalman_filter, kalman_sample, kalman_smoother, lgssm_sample
from tests.dense_gaussian import block, condition_z, log_marginal, observed_index
from tests.ops.test_kalman import METHODS, dense_of, observations, random_model

F64 = torch.float64
FUNCTIONS = [kalman_filter, kalman_smoother, kalman_sample]


def assert_rel(a, b, rtol=1e-9):
    """|a - b| <= rtol * max|b| entrywise (relative to the reference's scale)."""
    b = b.to(a.dtype)
    assert (a - b).abs().max() <= rtol * max(float(b.abs().max()), 1e-300), (a, b)


# ---------------------------------------------------------------------------------------
# 1. non-finite observations


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("method", METHODS)
def test_nan_without_mask_is_refused_naming_the_mask_argument(fn, method):
    T, S, D = 5, 2, 2
    p = random_model(S, D, T, seed=1)
    x = observations(T, D, batch=(2,))
    x[1, 3, 0] = math.nan
    with pytest.raises(
        ValueError,
        match=r"NaN at an observed position \(first at index "
        r"\(1, 3, 0\)\).*`mask` argument.*nan_as_missing=True",
    ):
        fn(x, **p, method=method)
    # the same NaN at an observed position of a given mask is refused as well
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[0, 3] = False
    with pytest.raises(ValueError, match="`mask` argument"):
        fn(x, **p, mask=mask, method=method)
    mask[1, 3] = False  # now masked: accepted
    fn(x, **p, mask=mask, method=method)


@pytest.mark.parametrize("value", [math.inf, -math.inf])
@pytest.mark.parametrize("nan_as_missing", [False, True])
def test_infinite_observations_are_refused(value, nan_as_missing):
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, seed=2)
    x = observations(T, D)
    x[2, 1] = value
    for fn in FUNCTIONS:
        with pytest.raises(
            ValueError,
            match=rf"observations contain {value} at an observed "
            r"position \(first at index \(2, 1\)\).*\+inf/-inf",
        ):
            fn(x, **p, nan_as_missing=nan_as_missing)
    mask = torch.ones(T, D, dtype=torch.bool)
    mask[2, 1] = False
    out = kalman_smoother(x, **p, mask=mask, nan_as_missing=nan_as_missing)
    assert torch.isfinite(out.means).all() and torch.isfinite(out.filtered.log_likelihoods).all()


@pytest.mark.parametrize("method", METHODS)
def test_nan_as_missing_marginalises_the_nan_entries(method):
    """NaN entries become unobserved elements, and-ed with the given mask: filter, smoother
    and log-likelihood equal the dense float64 reference conditioned only on the remaining
    entries (exact identities, 1e-9 relative), per sequence of a batch."""
    T, S, D, B = 6, 3, 3, 2
    p = random_model(S, D, T, time_varying=True, controls=True, seed=3)
    x = observations(T, D, batch=(B,), seed=4)
    gen = torch.Generator().manual_seed(5)
    x = x.masked_fill(torch.rand(B, T, D, generator=gen) < 0.3, math.nan)
    x[0, 2] = math.nan  # a fully missing step
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4] = False  # a masked step (its finite entries must be ignored too)
    s = kalman_smoother(x, **p, mask=mask, nan_as_missing=True, method=method)
    dense = dense_of(p, T)
    for i in range(B):
        observed = ~torch.isnan(x[i]) & mask[i, :, None]
        idx = observed_index(dense, observed)
        xi = torch.nan_to_num(x[i])  # the reference never reads the unobserved entries
        mean, cov = condition_z(dense, xi, idx)
        assert_rel(s.means[i], mean)
        for t in range(T):
            assert_rel(s.covs[i, t], block(cov, S, t, t))
            fmean, fcov = condition_z(dense, xi, observed_index(dense, observed, upto=t + 1))
            assert_rel(s.filtered.means[i, t], fmean[t])
            assert_rel(s.filtered.covs[i, t], block(fcov, S, t, t))
        assert_rel(s.filtered.log_likelihoods[i].sum(), log_marginal(dense, xi, idx))
    assert torch.all(s.filtered.log_likelihoods[0, 2] == 0)
    # the same as passing the and-ed mask explicitly
    explicit = kalman_smoother(x, **p, mask=~torch.isnan(x) & mask[..., None], method=method)
    for a, b in zip(list(s[:4]) + list(s.filtered), list(explicit[:4]) + list(explicit.filtered)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------
# 2. T = 0


def test_zero_steps_are_refused():
    p = random_model(2, 2, 1, seed=6)
    x = torch.zeros(3, 0, 2, dtype=F64)
    for fn in FUNCTIONS:
        with pytest.raises(
            ValueError,
            match=r"observations have T = 0 time steps \(shape "
            r"\(3, 0, 2\)\).*need T >= 1",
        ):
            fn(x, **p)
    with pytest.raises(ValueError, match="lgssm_sample needs num_steps T >= 1; got T = 0"):
        lgssm_sample(**p, num_steps=0)


# ---------------------------------------------------------------------------------------
# 3. invalid covariances under validate_args


def _bad_covariances():
    S, D = 3, 2
    eye_s = torch.eye(S, dtype=F64)
    asym = eye_s.clone()
    asym[0, 1] = 0.3  # the lower triangle alone would look fine to Cholesky
    indefinite = torch.diag(torch.tensor([1.0, -0.1, 2.0], dtype=F64))
    singular_r = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=F64)
    nan_cov = eye_s.clone()
    nan_cov[1, 1] = math.nan
    return [
        (
            "transition_cov",
            asym,
            r"transition_cov is not symmetric( at index \(\d+,\))?: max "
            r"\|M - M\^T\| = 0.3 exceeds 2.22e-13 \(= 1000 eps x max \|M\|\); "
            r"covariances are not symmetrised for you",
        ),
        ("initial_cov", asym, "initial_cov is not symmetric"),
        (
            "observation_cov",
            torch.tensor([[1.0, 0.0], [0.5, 1.0]], dtype=F64),
            "observation_cov is not symmetric",
        ),
        (
            "transition_cov",
            indefinite,
            r"transition_cov is not positive semi-definite( at index "
            r"\(\d+,\))? \(Cholesky failed; smallest eigenvalue -0.1\)",
        ),
        ("initial_cov", indefinite, "initial_cov is not positive semi-definite"),
        (
            "observation_cov",
            singular_r,
            r"observation_cov is not positive definite( at index "
            r"\(\d+,\))? \(Cholesky failed; smallest eigenvalue",
        ),
        ("observation_cov", -torch.eye(D, dtype=F64), "observation_cov is not positive definite"),
        ("transition_cov", nan_cov, "transition_cov contains NaN or inf"),
    ]


@pytest.mark.parametrize("name,value,message", _bad_covariances())
def test_invalid_covariances_are_refused(name, value, message):
    T, S, D = 5, 3, 2
    p = random_model(S, D, T, seed=7)
    x = observations(T, D)
    for fn in FUNCTIONS:
        for method in METHODS:
            with pytest.raises(ValueError, match=message):
                fn(x, **{**p, name: value}, method=method)
    with pytest.raises(ValueError, match=message):
        lgssm_sample(**{**p, name: value}, num_steps=T)
    # a time-varying parameter: one bad entry among T good ones is found as well
    if name != "initial_cov":
        good = p[name].expand(T, *p[name].shape).clone()
        good[3] = value
        with pytest.raises(ValueError, match=message):
            kalman_filter(x, **{**p, name: good})


def test_validation_default_follows_torch_distributions():
    """validate_args=None follows Distribution._validate_args (on unless disabled); an
    asymmetric Q is then used as given (only its lower triangle is read by the Cholesky
    factorisations), so the result differs from its symmetrised version."""
    T, S, D = 5, 3, 2
    p = random_model(S, D, T, seed=8)
    x = observations(T, D)
    Q = p["transition_cov"].clone()
    Q[0, 2] += 0.05
    with pytest.raises(ValueError, match="transition_cov is not symmetric"):
        kalman_filter(x, **{**p, "transition_cov": Q})
    old = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        off = kalman_filter(x, **{**p, "transition_cov": Q})
    finally:
        torch.distributions.Distribution.set_default_validate_args(old)
    explicit = kalman_filter(x, **{**p, "transition_cov": Q}, validate_args=False)
    assert torch.equal(off.log_likelihoods, explicit.log_likelihoods)
    with pytest.raises(ValueError, match="transition_cov is not symmetric"):
        kalman_filter(x, **{**p, "transition_cov": Q}, validate_args=True)


def test_legitimate_covariances_are_accepted():
    """PSD-but-singular Q (noise on one component only, or Q = 0), a singular initial
    covariance (a known component) and rounding-level asymmetry (1e-14 relative, far below
    sqrt(eps64) = 1.5e-8) pass validation."""
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, seed=9)
    x = observations(T, D)
    Q_velocity = torch.diag(torch.tensor([0.0, 0.0, 0.3], dtype=F64))
    P0 = torch.diag(torch.tensor([1.0, 0.0, 2.0], dtype=F64))
    R = p["observation_cov"].clone()
    R[0, 1] += 1e-14 * float(R.abs().max())
    for kw in (
        dict(transition_cov=Q_velocity),
        dict(transition_cov=torch.zeros(S, S, dtype=F64)),
        dict(initial_cov=P0),
        dict(observation_cov=R),
    ):
        for method in METHODS:
            s = kalman_smoother(x, **{**p, **kw}, method=method, validate_args=True)
            assert torch.isfinite(s.means).all() and torch.isfinite(s.covs).all()


def test_non_finite_parameters_are_refused():
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, controls=True, seed=10)
    x = observations(T, D)
    for name in (
        "initial_loc",
        "transition_matrix",
        "observation_matrix",
        "control_matrix",
        "controls",
    ):
        bad = p[name].clone(memory_format=torch.contiguous_format)
        bad.view(-1)[0] = math.inf
        with pytest.raises(ValueError, match=f"{name} contains NaN or inf"):
            kalman_filter(x, **{**p, name: bad})


# ---------------------------------------------------------------------------------------
# 4. NaN placeholders at masked positions: finite values and gradients


def _grad_args(T, S, D, seed):
    p = random_model(S, D, T, time_varying=True, controls=True, seed=seed)
    return {k: v.clone().requires_grad_() for k, v in p.items()}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["step", "element"])
def test_nan_placeholders_do_not_poison_gradients(method, kind):
    """Observations hold NaN at every masked entry. Log-likelihood, filtered/smoothed
    moments and FFBS samples are finite, the gradients of their sum with respect to every
    parameter (A, Q, C, R, mu_{1|0}, Sigma_{1|0}, B, u) and the observations are finite,
    and they equal (bit for bit) those with 0 in place of the NaN; the observation
    gradient is exactly 0 at masked entries."""
    T, S, D = 7, 3, 2
    p = _grad_args(T, S, D, seed=11)
    x0 = observations(T, D, seed=12)
    gen = torch.Generator().manual_seed(13)
    if kind == "step":
        mask = torch.tensor([True, False, True, True, False, False, True])
        emask = mask[:, None].expand(T, D)
    else:
        mask = emask = torch.rand(T, D, generator=gen) < 0.6
        mask[3] = False
    noise = torch.randn(2, T, S, generator=gen, dtype=F64)

    def run(fill):
        x = x0.masked_fill(~emask, fill).requires_grad_()
        s = kalman_smoother(x, **p, mask=mask, method=method)
        z = kalman_sample(x, **p, mask=mask, sample_shape=(2,), noise=noise, method=method)
        outs = list(s[:4]) + list(s.filtered) + [z.samples]
        for o in outs:
            assert torch.isfinite(o).all()
        total = sum(o.sum() for o in outs)
        grads = torch.autograd.grad(total, list(p.values()) + [x])
        return outs, grads

    outs_nan, grads_nan = run(math.nan)
    outs_zero, grads_zero = run(0.0)
    for name, g in zip(list(p) + ["observations"], grads_nan):
        assert torch.isfinite(g).all(), name
        assert g.abs().sum() > 0, name
    for a, b in zip(outs_nan + list(grads_nan), outs_zero + list(grads_zero)):
        assert torch.equal(a, b)
    assert torch.all(grads_nan[-1][~emask] == 0)


@pytest.mark.parametrize("method", METHODS)
def test_nan_as_missing_gradients_are_finite(method):
    T, S, D = 6, 2, 2
    p = _grad_args(T, S, D, seed=14)
    x = observations(T, D, seed=15)
    x[1, 0] = x[4] = math.nan
    x.requires_grad_()
    ll = kalman_filter(x, **p, nan_as_missing=True, method=method).log_likelihoods.sum()
    grads = torch.autograd.grad(ll, list(p.values()) + [x])
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[-1][1, 0] == 0 and torch.all(grads[-1][4] == 0)


@pytest.mark.parametrize("method", METHODS)
def test_without_validation_the_recursion_still_fails_clearly(method):
    """validate_args=False skips the parameter checks; an indefinite R then surfaces as the
    innovation covariance's Cholesky failure, a ValueError rather than NaN."""
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, seed=16)
    x = observations(T, D)
    with pytest.raises(
        ValueError,
        match=r"innovation covariance C P C\^T \+ R is not positive "
        r"definite \(Cholesky failed\)",
    ):
        kalman_filter(
            x,
            **{**p, "observation_cov": -torch.eye(D, dtype=F64)},
            method=method,
            validate_args=False,
        )
