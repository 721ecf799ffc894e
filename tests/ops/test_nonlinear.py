import math

import pytest
import torch

from pyro_seq.ops.kalman import kalman_filter, kalman_smoother
from pyro_seq.ops.nonlinear import (
    extended_kalman_filter,
    extended_kalman_smoother,
    jacobian,
    sigma_points,
    unscented_kalman_filter,
    unscented_kalman_smoother,
    unscented_weights,
)

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


# ---------------------------------------------------------------------------------------------
# dense float64 reference: stack z_{1:T}, x_{1:T} into one Gaussian and condition


def _mvn_logpdf(x, mean, cov):
    if x.numel() == 0:
        return torch.zeros((), dtype=x.dtype)
    return torch.distributions.MultivariateNormal(mean, covariance_matrix=cov).log_prob(x)


def dense_lgssm(A, b, Q, C, R, m0, P0, x, observed):
    """Exact filtered/smoothed moments and per-step log-likelihoods of the LGSSM
    z_0 ~ N(m0, P0), z_t = A_t z_{t-1} + b_t + N(0, Q_t), x_t = C z_t + N(0, R), by conditioning
    the joint Gaussian of the stacked sequence. A: (T,S,S), b: (T,S), Q: (T,S,S) (entry 0 unused),
    x: (T,D), observed: (T,) bool. Single sequence, no batch."""
    T, D = x.shape
    S = m0.shape[-1]
    # z = mu + L e with e ~ N(0, blockdiag(P0, Q_1, ..., Q_{T-1}))
    mu = [m0]
    for t in range(1, T):
        mu.append(A[t] @ mu[-1] + b[t])
    mu = torch.cat(mu)
    dt = m0.dtype
    L = torch.zeros(T * S, T * S, dtype=dt)
    for s in range(T):
        M = torch.eye(S, dtype=dt)
        for t in range(s, T):
            if t > s:
                M = A[t] @ M
            L[t * S : (t + 1) * S, s * S : (s + 1) * S] = M
    Se = torch.block_diag(P0, *[Q[t] for t in range(1, T)])
    Szz = L @ Se @ L.T
    Cbig = torch.block_diag(*[C] * T)
    Rbig = torch.block_diag(*[R] * T)
    mx = Cbig @ mu
    Sxx = Cbig @ Szz @ Cbig.T + Rbig
    Szx = Szz @ Cbig.T
    xf = x.reshape(-1)

    def condition(upto):
        rows = torch.cat(
            [torch.arange(t * D, (t + 1) * D) for t in range(upto) if observed[t]]
            or [torch.zeros(0, dtype=torch.long)]
        )
        if rows.numel() == 0:
            return mu, Szz, torch.zeros((), dtype=dt)
        Soo = Sxx[rows][:, rows]
        K = torch.linalg.solve(Soo, Szx[:, rows].T).T
        m = mu + K @ (xf[rows] - mx[rows])
        P = Szz - K @ Szx[:, rows].T
        return m, P, _mvn_logpdf(xf[rows], mx[rows], Soo)

    fm, fP, lls = [], [], []
    prev = torch.zeros((), dtype=dt)
    for t in range(T):
        m, P, ll = condition(t + 1)
        fm.append(m[t * S : (t + 1) * S])
        fP.append(P[t * S : (t + 1) * S, t * S : (t + 1) * S])
        lls.append(ll - prev)
        prev = ll
    m, P, _ = condition(T)
    sm = m.reshape(T, S)
    sP = torch.stack([P[t * S : (t + 1) * S, t * S : (t + 1) * S] for t in range(T)])
    cross = (
        torch.stack([P[(t + 1) * S : (t + 2) * S, t * S : (t + 1) * S] for t in range(T - 1)])
        if T > 1
        else torch.zeros(0, S, S, dtype=dt)
    )
    return dict(
        filter_means=torch.stack(fm),
        filter_covs=torch.stack(fP),
        log_likelihoods=torch.stack(lls),
        smooth_means=sm,
        smooth_covs=sP,
        cross_covs=cross,
    )


def random_spd(n, scale=1.0, generator=None):
    M = torch.randn(n, n, generator=generator)
    return scale * (M @ M.T / n + 0.5 * torch.eye(n))


def random_lgssm(S=3, D=2, T=6, batch=(), seed=0, time_varying=False):
    g = torch.Generator().manual_seed(seed)
    A = 0.9 * torch.linalg.qr(torch.randn(S, S, generator=g))[0]
    if time_varying:
        A = A + 0.1 * torch.randn(T, S, S, generator=g)
    else:
        A = A.expand(T, S, S)
    b = 0.3 * torch.randn(T, S, generator=g)
    Q = (
        torch.stack([random_spd(S, 0.3, g) for _ in range(T)])
        if time_varying
        else random_spd(S, 0.3, g)
    )
    C = torch.randn(D, S, generator=g)
    R = random_spd(D, 0.5, g)
    m0 = torch.randn(batch + (S,), generator=g)
    P0 = random_spd(S, 1.0, g)
    x = torch.randn(batch + (T, D), generator=g) * 2
    return A, b, Q, C, R, m0, P0, x


def linear_fns(A, b, C):
    f = lambda z, t: (A[t] @ z.unsqueeze(-1)).squeeze(-1) + b[t]  # noqa: E731
    h = lambda z, t: (C @ z.unsqueeze(-1)).squeeze(-1)  # noqa: E731
    return f, h


def Q_for_filter(Q, T):
    return Q if Q.dim() == 3 else Q  # (T, S, S) time-varying or (S, S) constant


def Q_dense(Q, T):
    return Q if Q.dim() == 3 else Q.expand(T, *Q.shape)


FILTERS = {
    "ekf": (extended_kalman_filter, extended_kalman_smoother, {}),
    "ukf": (unscented_kalman_filter, unscented_kalman_smoother, {}),
    "ukf_julier": (
        unscented_kalman_filter,
        unscented_kalman_smoother,
        dict(alpha=1.0, beta=0.0, kappa=0.5),
    ),
    "ukf_small_alpha": (
        unscented_kalman_filter,
        unscented_kalman_smoother,
        dict(alpha=0.3, beta=2.0, kappa=1.0),
    ),
}


@pytest.mark.parametrize("name", list(FILTERS))
@pytest.mark.parametrize("time_varying", [False, True])
def test_linear_model_equals_exact_kalman(name, time_varying):
    """On a linear-Gaussian model the EKF and UKF (and their smoothers) are the exact Kalman
    filter / RTS smoother: compare with conditioning the stacked dense Gaussian."""
    filt, smooth, kw = FILTERS[name]
    T = 6
    A, b, Q, C, R, m0, P0, x = random_lgssm(T=T, time_varying=time_varying, seed=1)
    observed = torch.tensor([True, True, False, True, False, True])
    f, h = linear_fns(A, b, C)
    ref = dense_lgssm(A, b, Q_dense(Q, T), C, R, m0, P0, x, observed)
    fr = filt(x, f, h, m0, P0, Q, R, mask=observed, **kw)
    assert torch.allclose(fr.means, ref["filter_means"], atol=1e-9)
    assert torch.allclose(fr.covs, ref["filter_covs"], atol=1e-9)
    assert torch.allclose(fr.log_likelihoods, ref["log_likelihoods"], atol=1e-9)
    assert fr.log_likelihoods[2] == 0 and fr.log_likelihoods[4] == 0
    sr = smooth(x, f, h, m0, P0, Q, R, mask=observed, **kw)
    assert torch.allclose(sr.means, ref["smooth_means"], atol=1e-9)
    assert torch.allclose(sr.covs, ref["smooth_covs"], atol=1e-9)
    assert torch.allclose(sr.cross_covs, ref["cross_covs"], atol=1e-9)
    assert sr.cross_covs.shape == (T - 1, 3, 3)


def test_batched_parameters_and_nan_in_masked_steps():
    T, B = 5, 4
    A, b, Q, C, R, m0, P0, x = random_lgssm(T=T, batch=(B,), seed=2)
    mask = torch.rand(B, T, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[:, 0] = True
    x = torch.where(mask.unsqueeze(-1), x, torch.full_like(x, math.nan))
    f, h = linear_fns(A, b, C)
    for _filt, smooth, kw in FILTERS.values():
        sr = smooth(x, f, h, m0, P0, Q, R, mask=mask, **kw)
        assert sr.means.shape == (B, T, 3) and sr.covs.shape == (B, T, 3, 3)
        assert sr.filtered.log_likelihoods.shape == (B, T)
        assert torch.isfinite(sr.means).all() and torch.isfinite(sr.filtered.log_likelihoods).all()
        for i in range(B):
            ref = dense_lgssm(
                A, b, Q.expand(T, 3, 3), C, R, m0[i], P0, torch.nan_to_num(x[i]), mask[i]
            )
            assert torch.allclose(sr.means[i], ref["smooth_means"], atol=1e-9)
            assert torch.allclose(sr.filtered.covs[i], ref["filter_covs"], atol=1e-9)
            assert torch.allclose(sr.filtered.log_likelihoods[i], ref["log_likelihoods"], atol=1e-9)


def test_single_step():
    A, b, Q, C, R, m0, P0, x = random_lgssm(T=1, seed=3)
    f, h = linear_fns(A, b, C)
    ref = dense_lgssm(A, b, Q.expand(1, 3, 3), C, R, m0, P0, x, torch.tensor([True]))
    sr = unscented_kalman_smoother(x, f, h, m0, P0, Q, R)
    assert sr.cross_covs.shape == (0, 3, 3)
    assert torch.allclose(sr.means, ref["smooth_means"]) and torch.allclose(
        sr.covs, ref["smooth_covs"]
    )


@pytest.mark.parametrize("filt", [extended_kalman_filter, unscented_kalman_filter])
def test_gradients_match_dense_reference(filt):
    """d log p(x) / d(A, C, R) through the EKF's forward-mode Jacobians and the UKF's sigma
    points equals the gradient of the dense Gaussian log-likelihood."""
    T = 4
    A, b, Q, C, R, m0, P0, x = random_lgssm(T=T, seed=4)
    observed = torch.ones(T, dtype=torch.bool)

    def loss_filter(A0, C0, R0):
        A_ = A0.expand(T, 3, 3)
        f, h = linear_fns(A_, b, C0)
        return filt(x, f, h, m0, P0, Q, R0).log_likelihoods.sum()

    def loss_dense(A0, C0, R0):
        return dense_lgssm(A0.expand(T, 3, 3), b, Q.expand(T, 3, 3), C0, R0, m0, P0, x, observed)[
            "log_likelihoods"
        ].sum()

    args = [A[0].clone().requires_grad_(), C.clone().requires_grad_(), R.clone().requires_grad_()]
    g1 = torch.autograd.grad(loss_filter(*args), args)
    g2 = torch.autograd.grad(loss_dense(*args), args)
    for a, c in zip(g1, g2):
        assert torch.allclose(a, c, atol=1e-8)


def test_jacobian_matches_autograd():
    W = torch.randn(4, 3)

    def fn(z, t):
        return torch.tanh(z @ W.T) * (t + 1) + z.sum(-1, keepdim=True) ** 2

    z = torch.randn(5, 3)
    value, J = jacobian(fn, z, 2)
    assert J.shape == (5, 4, 3)
    for i in range(5):
        Ji = torch.autograd.functional.jacobian(lambda zz: fn(zz, 2), z[i])
        assert torch.allclose(J[i], Ji)
    assert torch.allclose(value, fn(z, 2))


def test_explicit_jacobians_are_used():
    """Passing analytic Jacobians gives the same result as autodiff."""
    T = 5
    g = torch.Generator().manual_seed(5)
    x = torch.randn(T, 2, generator=g)
    f = lambda z, t: z + 0.1 * torch.sin(z)  # noqa: E731
    fj = lambda z, t: torch.diag_embed(1 + 0.1 * torch.cos(z))  # noqa: E731
    h = lambda z, t: z**3 / 3  # noqa: E731
    hj = lambda z, t: torch.diag_embed(z**2)  # noqa: E731
    args = (x, f, h, torch.ones(2), torch.eye(2), 0.1 * torch.eye(2), 0.5 * torch.eye(2))
    r1 = extended_kalman_smoother(*args)
    r2 = extended_kalman_smoother(*args, transition_jacobian=fj, observation_jacobian=hj)
    assert torch.allclose(r1.means, r2.means) and torch.allclose(r1.covs, r2.covs)
    assert torch.allclose(r1.filtered.log_likelihoods, r2.filtered.log_likelihoods)


def test_unscented_transform_moments_of_a_square():
    """For z ~ N(m, P) in 1-D, E[z^2] = m^2 + P and Var[z^2] = 4 m^2 P + 2 P^2. The unscented
    transform with alpha=1, beta=2, kappa=0 reproduces both exactly (beta=2 is what makes the
    variance exact); the EKF gets the mean wrong by P."""
    m, P, Rv = 1.3, 0.7, 0.2
    x = torch.tensor([[0.5]])
    sq = lambda z, t: z**2  # noqa: E731
    ukf = unscented_kalman_filter(
        x, None, sq, torch.tensor([m]), torch.tensor([[P]]), torch.eye(1), torch.tensor([[Rv]])
    )
    ll_exact_moments = torch.distributions.Normal(
        m**2 + P, math.sqrt(4 * m**2 * P + 2 * P**2 + Rv)
    ).log_prob(x[0, 0])
    assert torch.allclose(ukf.log_likelihoods[0], ll_exact_moments)
    ekf = extended_kalman_filter(
        x, None, sq, torch.tensor([m]), torch.tensor([[P]]), torch.eye(1), torch.tensor([[Rv]])
    )
    ll_ekf = torch.distributions.Normal(m**2, math.sqrt(4 * m**2 * P + Rv)).log_prob(x[0, 0])
    assert torch.allclose(ekf.log_likelihoods[0], ll_ekf)
    # Cov(z, z^2) = 2 m P, so the UKF's gain is 2 m P / (Var + R)
    K = 2 * m * P / (4 * m**2 * P + 2 * P**2 + Rv)
    assert torch.allclose(ukf.means[0, 0], torch.tensor(m + K * (0.5 - m**2 - P)))


def test_unscented_weights_and_sigma_points():
    for n, (a, b, k) in [(3, (1.0, 2.0, 0.0)), (4, (0.5, 2.0, 1.0)), (2, (1.0, 0.0, 1.0))]:
        wm, wc, scale = unscented_weights(n, a, b, k)
        assert wm.shape == (2 * n + 1,)
        assert torch.allclose(wm.sum(), torch.tensor(1.0))
        lam = a**2 * (n + k) - n
        assert math.isclose(scale**2, n + lam)
        assert math.isclose(wc[0].item() - wm[0].item(), 1 - a**2 + b, abs_tol=1e-12)
        m = torch.randn(2, n)
        P = torch.stack([random_spd(n), random_spd(n, 2.0)])
        X = sigma_points(m, P, scale)
        assert X.shape == (2 * n + 1, 2, n)
        mean = (wm[:, None, None] * X).sum(0)
        d = X - m
        cov = torch.einsum("i,i...p,i...q->...pq", wm, d, d)  # wm == wc off the centre, d_0 = 0
        assert torch.allclose(mean, m) and torch.allclose(cov, P)
    with pytest.raises(ValueError):
        unscented_weights(2, alpha=1.0, kappa=-2.0)


def test_nonlinear_filters_track_a_pendulum():
    """A non-linear pendulum observed through sin(angle): the UKF/EKF smoothed RMSE of the
    angle is far below the RMSE of the prior mean (sanity of the non-linear path), smoothing
    improves on filtering, and the approximate log-likelihood is finite."""
    torch.manual_seed(0)
    dt, T, qc = 0.05, 80, 0.05
    g = 9.81

    def f(z, t):
        th, w = z[..., 0], z[..., 1]
        return torch.stack([th + w * dt, w - g * torch.sin(th) * dt], -1)

    def h(z, t):
        return torch.sin(z[..., :1])

    Q = torch.tensor([[qc * dt**3 / 3, qc * dt**2 / 2], [qc * dt**2 / 2, qc * dt]])
    R = torch.tensor([[0.1**2]])
    z = torch.tensor([1.2, 0.0])
    zs, xs = [], []
    Lq = torch.linalg.cholesky(Q)
    for t in range(T):
        if t > 0:
            z = f(z, t) + Lq @ torch.randn(2)
        zs.append(z)
        xs.append(h(z, t) + 0.1 * torch.randn(1))
    zs, xs = torch.stack(zs), torch.stack(xs)
    m0, P0 = torch.tensor([1.0, 0.0]), torch.diag(torch.tensor([0.1, 0.1]))
    for smoother in (extended_kalman_smoother, unscented_kalman_smoother):
        sr = smoother(xs, f, h, m0, P0, Q, R)
        rmse_s = (sr.means[:, 0] - zs[:, 0]).pow(2).mean().sqrt()
        rmse_f = (sr.filtered.means[:, 0] - zs[:, 0]).pow(2).mean().sqrt()
        assert rmse_s < rmse_f < 0.2, (smoother.__name__, rmse_s, rmse_f)
        assert torch.isfinite(sr.filtered.log_likelihoods).all()


@pytest.mark.parametrize("name", list(FILTERS))
def test_linear_model_equals_ops_kalman_with_element_masks(name):
    """UKF/EKF on a linear model with batch dims, time-varying A and Q, controls as offsets
    and per-element masks equal :mod:`pyro_seq.ops.kalman` (filter, smoother, likelihood)."""
    filt, smooth, kw = FILTERS[name]
    T, S, D, B = 7, 3, 2, 4
    g = torch.Generator().manual_seed(11)
    A = 0.8 * torch.linalg.qr(torch.randn(S, S, generator=g))[0] + 0.1 * torch.randn(
        T, S, S, generator=g
    )
    Q = torch.stack([random_spd(S, 0.2, g) for _ in range(T)])
    C = torch.randn(D, S, generator=g)
    R = random_spd(D, 0.4, g)
    u = torch.randn(B, T, S, generator=g)
    m0 = torch.randn(B, S, generator=g)
    P0 = random_spd(S, 1.0, g)
    x = torch.randn(B, T, D, generator=g)
    mask = torch.rand(B, T, D, generator=g) > 0.35
    mask[0, 2] = False  # a fully missing step
    xn = torch.where(mask, x, torch.full_like(x, math.nan))

    def f(z, t):  # z: (..., B, S); the control u_t is an offset
        return (A[t] @ z.unsqueeze(-1)).squeeze(-1) + u[:, t]

    def h(z, t):
        return (C @ z.unsqueeze(-1)).squeeze(-1)

    ref = kalman_smoother(x, m0, P0, A, Q, C, R, controls=u, mask=mask, method="sequential")
    sr = smooth(xn, f, h, m0, P0, Q, R, mask=mask, **kw)
    assert torch.allclose(sr.filtered.means, ref.filtered.means, atol=1e-9)
    assert torch.allclose(sr.filtered.covs, ref.filtered.covs, atol=1e-9)
    assert torch.allclose(sr.filtered.predicted_covs, ref.filtered.predicted_covs, atol=1e-9)
    assert torch.allclose(sr.filtered.log_likelihoods, ref.filtered.log_likelihoods, atol=1e-9)
    assert sr.filtered.log_likelihoods[0, 2] == 0
    assert torch.allclose(sr.means, ref.means, atol=1e-9)
    assert torch.allclose(sr.covs, ref.covs, atol=1e-9)
    assert torch.allclose(sr.cross_covs, ref.cross_covs, atol=1e-9)
    assert torch.allclose(sr.gains, ref.gains, atol=1e-9)
    fr = filt(xn, f, h, m0, P0, Q, R, mask=mask, **kw)
    kf = kalman_filter(x, m0, P0, A, Q, C, R, controls=u, mask=mask)
    assert torch.allclose(fr.means, kf.means, atol=1e-9)
    assert torch.allclose(fr.log_likelihoods, kf.log_likelihoods, atol=1e-9)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_observed_entries_and_zero_steps_are_refused(value):
    """NaN/inf at an observed entry: a ValueError naming the mask argument (the check of
    :mod:`pyro_seq.ops.kalman`), accepted once the entry is masked; T = 0 is refused."""
    T = 5
    A, b, Q, C, R, m0, P0, x = random_lgssm(T=T, seed=4)
    f, h = linear_fns(A, b, C)
    x = x.clone()
    x[2, 1] = value
    mask = torch.ones(T, x.shape[-1], dtype=torch.bool)
    for filt, smooth, kw in FILTERS.values():
        with pytest.raises(
            ValueError,
            match=r"at an observed position \(first at index \(2, 1\)\)"
            r".*`mask` argument",
        ):
            filt(x, f, h, m0, P0, Q, R, **kw)
        mask[2, 1] = False
        sr = smooth(x, f, h, m0, P0, Q, R, mask=mask, **kw)
        assert torch.isfinite(sr.means).all() and torch.isfinite(sr.filtered.log_likelihoods).all()
        mask[2, 1] = True
        with pytest.raises(ValueError, match="T = 0"):
            filt(x[:0], f, h, m0, P0, Q, R, **kw)
