r"""Gaussian filters and smoothers for non-linear state-space models with Gaussian noise.

Model (thesis Sec. 3.5.1.1)::

    z_1 ~ N(initial_loc, initial_cov)
    z_t = f(z_{t-1}, t) + eps_t,   eps_t   ~ N(0, Q_t)      (t = 1, ..., T-1, 0-based)
    x_t = h(z_t, t)     + delta_t, delta_t ~ N(0, R_t)      (t = 0, ..., T-1, 0-based)

``f`` (``transition_fn``) and ``h`` (``observation_fn``) are arbitrary (differentiable, for the
EKF) torch functions called as ``f(z, t)`` and ``h(z, t)`` with ``z`` of shape ``(..., S)`` and a
Python ``int`` ``t`` (the 0-based index of the step being *entered*: ``f(z, t)`` maps
``z_{t-1}`` to the mean of ``z_t``, as for the transition parameters of
:class:`~pyro_seq.distributions.LinearGaussianSSM`, whose entry 0 is unused). Control inputs
``u_t`` of the thesis' ``f(z_{t-1}, u_t)`` are captured by closing over them and indexing with
``t``. Both functions must act independently on every leading (batch) index of ``z`` and
broadcast over extra leading dims (the UKF passes sigma points with one extra leading dim).

Algorithms:

* :func:`extended_kalman_filter`/:func:`extended_kalman_smoother` (EKF, thesis Sec. 3.5.1.1):
  linearize ``f`` around the previous filtered mean ``mu_{t-1}`` (Jacobian ``F_t``) and ``h``
  around the predicted mean ``mu_{t|t-1}`` (Jacobian ``G_t``), then apply the Kalman filter
  (thesis Sec. 3.4.1) and RTS smoother to the linearized model. Jacobians come from forward-mode
  autodiff (``torch.func.jvp`` vectorized with ``torch.func.vmap``) unless given explicitly.
* :func:`unscented_kalman_filter`/:func:`unscented_kalman_smoother` (UKF, thesis Sec. 3.5.1.2;
  Julier & Uhlmann 1997, Wan & van der Merwe 2001; unscented RTS smoother of Sarkka 2008):
  propagate ``2S+1`` sigma points through ``f`` and ``h`` and moment-match a Gaussian.
  :func:`unscented_weights` documents ``alpha``, ``beta``, ``kappa``.

Both are instances of one *Gaussian filter*: a prediction step gives the predicted moments
``mu_{t|t-1}, Sigma_{t|t-1}`` and the cross-covariance ``D_t = Cov(z_{t-1}, z_t | x_{1:t-1})``;
an update step gives the predicted observation mean ``xhat_t``, ``Cov(z_t, x_t | x_{1:t-1})``
and ``Cov(x_t | x_{1:t-1})``, from which the measurement update (thesis Sec. 3.4.1)::

    S_t  = Cov(x_t | x_{1:t-1}) = P_xx + R_t,   L_t = chol(S_t)
    W_t  = L_t^{-1} Cov(z_t, x_t)^T               (so K_t = W_t^T L_t^{-1})
    mu_t = mu_{t|t-1} + W_t^T L_t^{-1} (x_t - xhat_t)
    Sigma_t = Sigma_{t|t-1} - W_t^T W_t            (= Sigma_{t|t-1} - K_t S_t K_t^T, symmetric)
    log p(x_t | x_{1:t-1}) ~= log N(x_t; xhat_t, S_t)               (approximate eq. 3.12)

and the general Gaussian RTS smoother (Sarkka 2008, which reduces to the thesis' RTS smoother
of Sec. 3.4.1 for a linear model)::

    J_t      = D_{t+1} Sigma_{t+1|t}^{-1}
    mu_{t|T} = mu_t + J_t (mu_{t+1|T} - mu_{t+1|t})
    Sigma_{t|T} = Sigma_t + J_t (Sigma_{t+1|T} - Sigma_{t+1|t}) J_t^T
    Cov(z_{t+1}, z_t | x_{1:T}) = Sigma_{t+1|T} J_t^T

For a linear-Gaussian model (``f(z) = A z + b``, ``h(z) = C z``) both the EKF and the UKF are
exactly the Kalman filter / RTS smoother.

Missing data (thesis Sec. 3.4.2): ``mask`` of shape ``(..., T)`` per step or ``(..., T, D)``
per element (True = observed; read as in :mod:`pyro_seq.ops.kalman`: per element when its last
two dims are ``(T, D)`` or ``(T, 1)``). A missing step skips the measurement update
(``mu_t = mu_{t|t-1}``, ``Sigma_t = Sigma_{t|t-1}``) and contributes 0 to the log-likelihood; a
missing element drops its row of the observation model (its column of ``Cov(z_t, x_t)``, its
row/column of ``Cov(x_t)`` and ``R_t``). Masked entries of ``x`` may hold anything (even NaN);
NaN or +-inf at an observed entry raises ``ValueError`` (as in :mod:`pyro_seq.ops.kalman`).

Parameter shapes (``S`` state dim, ``D`` observation dim; ``...`` batch dims that broadcast):
``x (..., T, D)``, ``initial_loc (..., S)``, ``initial_cov (..., S, S)``, ``transition_cov`` either
``(S, S)`` (constant) or ``(..., T or 1, S, S)`` (the dim left of the matrix dims is time, entry 0
unused), ``observation_cov`` ``(D, D)`` or ``(..., T or 1, D, D)``. All covariances are handled
through Cholesky factors and triangular solves; no covariance is inverted explicitly.
"""

import math
from typing import NamedTuple

import torch

from pyro_seq.ops.lgssm import element_mask, observed_finite
from pyro_seq.ops.linalg import broadcast_shapes, jitter_cholesky, psd_solve, sym

__all__ = [
    "GaussianFilterResult",
    "GaussianSmootherResult",
    "extended_kalman_filter",
    "extended_kalman_smoother",
    "gaussian_rts_smoother",
    "jacobian",
    "sigma_points",
    "unscented_kalman_filter",
    "unscented_kalman_smoother",
    "unscented_weights",
]


class GaussianFilterResult(NamedTuple):
    """Output of :func:`extended_kalman_filter` / :func:`unscented_kalman_filter`.

    :ivar means: filtered means ``mu_t = E[z_t | x_{1:t}]``, ``(..., T, S)``.
    :ivar covs: filtered covariances ``Sigma_t``, ``(..., T, S, S)``.
    :ivar predicted_means: ``mu_{t|t-1}`` (entry 0 is ``initial_loc``), ``(..., T, S)``.
    :ivar predicted_covs: ``Sigma_{t|t-1}`` (entry 0 is ``initial_cov``), ``(..., T, S, S)``.
    :ivar log_likelihoods: approximate ``log p(x_t | x_{1:t-1})`` (eq. 3.12 with the
        linearized / unscented moments; 0 at masked steps), ``(..., T)``.
    :ivar predicted_cross_covs: ``D_t = Cov(z_{t-1}, z_t | x_{1:t-1})`` (entry 0 is zero),
        ``(..., T, S, S)``; what the RTS smoother needs.

    The first five fields are those of :class:`pyro_seq.ops.kalman.KalmanFilterResult`.
    """

    means: torch.Tensor
    covs: torch.Tensor
    predicted_means: torch.Tensor
    predicted_covs: torch.Tensor
    log_likelihoods: torch.Tensor
    predicted_cross_covs: torch.Tensor


class GaussianSmootherResult(NamedTuple):
    """Output of :func:`extended_kalman_smoother` / :func:`unscented_kalman_smoother`.

    :ivar means: smoothed means ``mu_{t|T}``, ``(..., T, S)``.
    :ivar covs: smoothed covariances ``Sigma_{t|T}``, ``(..., T, S, S)``.
    :ivar cross_covs: ``Cov(z_{t+1}, z_t | x_{1:T})``, ``(..., T-1, S, S)``.
    :ivar gains: smoother gains ``J_t``, ``(..., T-1, S, S)``.
    :ivar filtered: the :class:`GaussianFilterResult` the smoother started from (its
        ``log_likelihoods`` are the per-step terms).

    Same fields as :class:`pyro_seq.ops.kalman.KalmanSmootherResult`.
    """

    means: torch.Tensor
    covs: torch.Tensor
    cross_covs: torch.Tensor
    gains: torch.Tensor
    filtered: GaussianFilterResult


# ---------------------------------------------------------------------------------------------
# small linear-algebra helpers


def _mT(P):
    return P.transpose(-1, -2)


_EKF_HINT = (
    "; for the EKF this usually means f or h is not differentiable at the current "
    "mean (e.g. sqrt at 0); try the UKF"
)


def _cholesky(P, what):
    """Cholesky factor of a symmetric PSD matrix (the shared jitter-Cholesky of
    :func:`pyro_seq.ops.linalg.jitter_cholesky`: a tiny relative jitter for numerically
    semi-definite inputs, a clear error for NaN/inf or indefinite ones)."""
    return jitter_cholesky(P, what, _EKF_HINT)


def _time_slice(param, t, num_matrix_dims):
    """Entry ``t`` of a parameter that is constant (``param.dim() == num_matrix_dims``) or has a
    time dim (size T or 1) just left of its matrix dims."""
    if param.dim() <= num_matrix_dims:
        return param
    time_dim = param.dim() - num_matrix_dims - 1
    idx = t if param.shape[time_dim] > 1 else 0
    return param.select(time_dim, idx)


def _param_batch_shape(param, num_matrix_dims):
    return param.shape[: max(param.dim() - num_matrix_dims - 1, 0)]


def _stack(tensors, dim):
    return torch.stack(torch.broadcast_tensors(*tensors), dim=dim)


def _prepare(x, mask, initial_loc, initial_cov, transition_cov, observation_cov):
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., T, D), got {tuple(x.shape)}")
    T, D = x.shape[-2:]
    if T == 0:
        raise ValueError(
            f"x has T = 0 time steps (shape {tuple(x.shape)}); the filters need T >= 1"
        )
    if mask is not None:
        mask = element_mask(mask, T, D, x.shape[:-2])  # (..., T, D)
    mask = observed_finite(x, mask, nan_as_missing=False)  # NaN/inf only where masked
    if mask is None:
        mask = torch.ones(x.shape, dtype=torch.bool, device=x.device)
    for name, p, k in (
        ("transition_cov", transition_cov, 2),
        ("observation_cov", observation_cov, 2),
    ):
        if p.dim() > k and p.shape[-k - 1] not in (1, T):
            raise ValueError(
                f"{name}: time dim (dim -3) must have size 1 or T={T}, got {tuple(p.shape)}"
            )
    batch_shape = broadcast_shapes(
        x.shape[:-2],
        mask.shape[:-2],
        initial_loc.shape[:-1],
        initial_cov.shape[:-2],
        _param_batch_shape(transition_cov, 2),
        _param_batch_shape(observation_cov, 2),
    )
    S = initial_loc.shape[-1]
    m0 = initial_loc.expand(batch_shape + (S,))
    P0 = initial_cov.expand(batch_shape + (S, S))
    # masked entries may be NaN: replace them so that they cannot leak into values or grads
    x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return T, mask, m0, P0, x


def _measurement_update(m_pred, P_pred, x_t, obs_mean, P_zx, P_xx, R, observed):
    """Gaussian measurement update (thesis Sec. 3.4.1) from predicted observation moments.

    Shapes: ``m_pred (..., S)``, ``P_pred (..., S, S)``, ``x_t, obs_mean (..., D)``,
    ``P_zx (..., S, D)``, ``P_xx, R (..., D, D)``, ``observed (..., D)`` bool.
    Returns ``(m, P, log_lik)``.

    A missing element i is removed from the update without reshaping (thesis Sec. 3.4.2):
    column i of ``P_zx``, row/column i of ``P_xx`` and the residual are zeroed and row/column i
    of ``R`` replaced by ``e_i``, which makes the gain column 0 and adds the constant
    ``log N(0; 0, 1)``, subtracted again below.
    """
    D = x_t.shape[-1]
    obs = observed.to(P_xx.dtype)
    both = obs.unsqueeze(-1) * obs.unsqueeze(-2)
    P_zx = P_zx * obs.unsqueeze(-2)
    R = R * both + torch.diag_embed(1 - obs)
    S_t = sym(P_xx * both + R)
    L = _cholesky(S_t, "the innovation covariance C Sigma_{t|t-1} C^T + R")
    r = ((x_t - obs_mean) * obs).unsqueeze(-1)  # (..., D, 1)
    batch = broadcast_shapes(L.shape[:-2], r.shape[:-2], P_zx.shape[:-2])
    L = L.expand(batch + (D, D))
    W = torch.linalg.solve_triangular(L, _mT(P_zx).expand(batch + (D, P_zx.shape[-2])), upper=False)
    v = torch.linalg.solve_triangular(L, r.expand(batch + (D, 1)), upper=False)
    m = m_pred + (_mT(W) @ v).squeeze(-1)
    P = sym(P_pred - _mT(W) @ W)
    log_lik = (
        -0.5 * v.squeeze(-1).pow(2).sum(-1)
        - L.diagonal(dim1=-1, dim2=-2).log().sum(-1)
        - 0.5 * obs.sum(-1) * math.log(2 * math.pi)
    )
    # fully missing steps: exactly the prediction (also guards against rounding)
    any_obs = observed.any(-1)
    m = torch.where(any_obs.unsqueeze(-1), m, m_pred)
    P = torch.where(any_obs.unsqueeze(-1).unsqueeze(-1), P, P_pred)
    log_lik = torch.where(
        any_obs, log_lik, torch.zeros((), dtype=log_lik.dtype, device=log_lik.device)
    )
    return m, P, log_lik


def _run_gaussian_filter(
    predict, update, x, mask, initial_loc, initial_cov, transition_cov, observation_cov
):
    """Shared forward pass. ``predict(m, P, t) -> (m_pred, P_pred_without_Q, D)`` and
    ``update(m_pred, P_pred, t) -> (obs_mean, P_zx, P_xx_without_R)``."""
    T, mask, m, P, x = _prepare(x, mask, initial_loc, initial_cov, transition_cov, observation_cov)
    means, covs, pmeans, pcovs, pcross, lls = [], [], [], [], [], []
    for t in range(T):
        if t == 0:
            m_pred, P_pred = m, P
            D = torch.zeros_like(P)
        else:
            m_pred, P_pred, D = predict(m, P, t)
            P_pred = sym(P_pred + _time_slice(transition_cov, t, 2))
        obs_mean, P_zx, P_xx = update(m_pred, P_pred, t)
        R = _time_slice(observation_cov, t, 2)
        m, P, ll = _measurement_update(
            m_pred, P_pred, x[..., t, :], obs_mean, P_zx, P_xx, R, mask[..., t, :]
        )
        means.append(m)
        covs.append(P)
        pmeans.append(m_pred)
        pcovs.append(P_pred)
        pcross.append(D)
        lls.append(ll)
    return GaussianFilterResult(
        _stack(means, -2),
        _stack(covs, -3),
        _stack(pmeans, -2),
        _stack(pcovs, -3),
        _stack(lls, -1),
        _stack(pcross, -3),
    )


def gaussian_rts_smoother(filtered):
    """General Gaussian Rauch-Tung-Striebel smoother (thesis Sec. 3.4.1; Sarkka 2008 for the
    unscented case) from a filter's output.

    ``J_t = D_{t+1} Sigma_{t+1|t}^{-1}``, ``mu_{t|T} = mu_t + J_t (mu_{t+1|T} - mu_{t+1|t})``,
    ``Sigma_{t|T} = Sigma_t + J_t (Sigma_{t+1|T} - Sigma_{t+1|t}) J_t^T`` and
    ``Cov(z_{t+1}, z_t | x) = Sigma_{t+1|T} J_t^T``, where ``D_{t+1} = Cov(z_t, z_{t+1} | x_{1:t})``
    (``A Sigma_t`` transposed for a linear model, ``Sigma_t F^T`` for the EKF, sigma-point
    cross-covariance for the UKF).

    :param GaussianFilterResult filtered: with ``means (..., T, S)`` etc.
    :returns: :class:`GaussianSmootherResult`.
    """
    T = filtered.means.shape[-2]
    m_s = filtered.means[..., T - 1, :]
    P_s = filtered.covs[..., T - 1, :, :]
    means, covs, cross, gains = [m_s], [P_s], [], []
    for t in range(T - 2, -1, -1):
        m_f, P_f = filtered.means[..., t, :], filtered.covs[..., t, :, :]
        m_p = filtered.predicted_means[..., t + 1, :]
        P_p = filtered.predicted_covs[..., t + 1, :, :]
        D = filtered.predicted_cross_covs[..., t + 1, :, :]
        # D P_p^+ (P_p symmetric; pseudo-inverse only where P_p is rank-deficient)
        J = _mT(psd_solve(P_p, _mT(D), "the predicted covariance Sigma_{t+1|t}"))
        cross.append(P_s @ _mT(J))
        m_s = m_f + (J @ (m_s - m_p).unsqueeze(-1)).squeeze(-1)
        P_s = sym(P_f + J @ (P_s - P_p) @ _mT(J))
        means.append(m_s)
        covs.append(P_s)
        gains.append(J)
    S = filtered.means.shape[-1]
    empty = filtered.covs[..., :0, :, :]
    return GaussianSmootherResult(
        _stack(means[::-1], -2),
        _stack(covs[::-1], -3),
        _stack(cross[::-1], -3) if cross else empty.reshape(empty.shape[:-2] + (S, S)),
        _stack(gains[::-1], -3) if gains else empty.reshape(empty.shape[:-2] + (S, S)),
        filtered,
    )


# ---------------------------------------------------------------------------------------------
# extended Kalman filter


def jacobian(fn, z, t):
    """Batched Jacobian ``d fn(z, t)_i / d z_j`` of a function acting independently on every
    leading index of ``z``, by forward-mode autodiff (one ``jvp`` per input coordinate,
    vectorized with ``torch.func.vmap``). Differentiable w.r.t. tensors captured by ``fn``.

    :param callable fn: ``(..., S) -> (..., D)``.
    :param torch.Tensor z: ``(..., S)``.
    :param int t: forwarded to ``fn``.
    :returns: ``(value, jac)`` with ``value (..., D)`` and ``jac (..., D, S)``.
    """
    S = z.shape[-1]
    eye = torch.eye(S, dtype=z.dtype, device=z.device)
    tangents = eye.reshape((S,) + (1,) * (z.dim() - 1) + (S,)).expand((S,) + z.shape)

    def column(v):
        return torch.func.jvp(lambda zz: fn(zz, t), (z,), (v,))[1]

    cols = torch.func.vmap(column)(tangents)  # (S, ..., D)
    return fn(z, t), cols.movedim(0, -1)


def extended_kalman_filter(
    x,
    transition_fn,
    observation_fn,
    initial_loc,
    initial_cov,
    transition_cov,
    observation_cov,
    mask=None,
    transition_jacobian=None,
    observation_jacobian=None,
):
    """Extended Kalman filter (thesis Sec. 3.5.1.1).

    Prediction linearizes ``f`` at the previous filtered mean,
    ``mu_{t|t-1} = f(mu_{t-1}, t)``, ``Sigma_{t|t-1} = F_t Sigma_{t-1} F_t^T + Q_t`` with
    ``F_t = df/dz |_{mu_{t-1}}``; the measurement step linearizes ``h`` at ``mu_{t|t-1}``
    (``G_t = dh/dz``) and applies the Kalman update of Sec. 3.4.1; ``log_likelihoods`` are
    ``log N(x_t; h(mu_{t|t-1}), G_t Sigma_{t|t-1} G_t^T + R_t)`` (eq. 3.12 for the linearized
    model). Exact Kalman filter when ``f`` and ``h`` are affine.

    :param torch.Tensor x: observations ``(..., T, D)``.
    :param callable transition_fn: ``f(z, t)``, ``(..., S) -> (..., S)``, mean of ``z_t`` given
        ``z_{t-1} = z`` (called for ``t = 1..T-1``).
    :param callable observation_fn: ``h(z, t)``, ``(..., S) -> (..., D)`` (``t = 0..T-1``).
    :param torch.Tensor initial_loc: ``mu_{1|0}``, ``(..., S)``.
    :param torch.Tensor initial_cov: ``Sigma_{1|0}``, ``(..., S, S)``.
    :param torch.Tensor transition_cov: ``Q``, ``(S, S)`` or ``(..., T|1, S, S)``.
    :param torch.Tensor observation_cov: ``R``, ``(D, D)`` or ``(..., T|1, D, D)``.
    :param torch.Tensor mask: optional bool ``(..., T)`` per step or ``(..., T, D)`` per
        element, True where observed.
    :param callable transition_jacobian: optional ``(z, t) -> (..., S, S)``; default autodiff.
    :param callable observation_jacobian: optional ``(z, t) -> (..., D, S)``; default autodiff.
    :returns: :class:`GaussianFilterResult`.
    """

    def lin(fn, jac_fn, z, t):
        if jac_fn is None:
            return jacobian(fn, z, t)
        return fn(z, t), jac_fn(z, t)

    def predict(m, P, t):
        fm, F = lin(transition_fn, transition_jacobian, m, t)
        D = P @ _mT(F)  # Cov(z_{t-1}, z_t) of the linearized model
        return fm, F @ D, D

    def update(m_pred, P_pred, t):
        hm, G = lin(observation_fn, observation_jacobian, m_pred, t)
        P_zx = P_pred @ _mT(G)
        return hm, P_zx, G @ P_zx

    return _run_gaussian_filter(
        predict, update, x, mask, initial_loc, initial_cov, transition_cov, observation_cov
    )


def extended_kalman_smoother(
    x,
    transition_fn,
    observation_fn,
    initial_loc,
    initial_cov,
    transition_cov,
    observation_cov,
    mask=None,
    transition_jacobian=None,
    observation_jacobian=None,
):
    """Extended RTS smoother: :func:`extended_kalman_filter` followed by
    :func:`gaussian_rts_smoother` with ``J_t = Sigma_t F_{t+1}^T Sigma_{t+1|t}^{-1}`` (the
    thesis' smoother gain of Sec. 3.4.1 with ``A_{t+1}`` replaced by the Jacobian ``F_{t+1}``).
    Arguments as for :func:`extended_kalman_filter`.

    :returns: :class:`GaussianSmootherResult` (``means (..., T, S)``, ``covs (..., T, S, S)``,
        ``cross_covs (..., T-1, S, S)``).
    """
    filtered = extended_kalman_filter(
        x,
        transition_fn,
        observation_fn,
        initial_loc,
        initial_cov,
        transition_cov,
        observation_cov,
        mask=mask,
        transition_jacobian=transition_jacobian,
        observation_jacobian=observation_jacobian,
    )
    return gaussian_rts_smoother(filtered)


# ---------------------------------------------------------------------------------------------
# unscented Kalman filter


def unscented_weights(state_dim, alpha=1.0, beta=2.0, kappa=0.0, dtype=torch.float64, device=None):
    """Weights of the scaled unscented transform (Julier & Uhlmann 1997; Wan & van der Merwe 2001).

    With ``n = state_dim`` and ``lambda = alpha^2 (n + kappa) - n`` the ``2n+1`` sigma points are
    ``m`` and ``m +/- sqrt(n + lambda) L[:, i]`` (``L L^T = P``), with mean weights
    ``Wm_0 = lambda / (n + lambda)``, covariance weight ``Wc_0 = Wm_0 + 1 - alpha^2 + beta`` and
    ``Wm_i = Wc_i = 1 / (2 (n + lambda))``.

    * ``alpha`` (``0 < alpha <= 1``) sets the spread of the points around the mean (small values
      keep them local; very small values give large negative ``Wm_0`` and lose accuracy in
      float32).
    * ``beta`` adds prior knowledge of the distribution's kurtosis to the central point's
      covariance weight; ``beta = 2`` is optimal for Gaussians.
    * ``kappa`` is a secondary scaling (``n + kappa > 0``); ``kappa = 3 - n`` matches the fourth
      moment of a Gaussian in 1-D (Julier & Uhlmann), ``kappa = 0`` is common.

    The defaults ``alpha=1, beta=2, kappa=0`` give ``lambda = 0``: ``2n`` equally weighted points
    at distance ``sqrt(n)`` (the cubature rule) plus a central point with ``Wc_0 = 2`` that only
    enters covariances. All covariance weights are then non-negative, so predicted covariances
    stay positive semi-definite. Any setting with ``n + lambda > 0`` is exact for affine maps.

    :returns: ``(wm, wc, scale)``: tensors ``(2n+1,)`` and the float ``sqrt(n + lambda)``.
    """
    n = state_dim
    lam = alpha**2 * (n + kappa) - n
    if n + lam <= 0:
        raise ValueError(f"unscented transform needs n + lambda > 0, got n={n}, lambda={lam}")
    wm = torch.full((2 * n + 1,), 0.5 / (n + lam), dtype=dtype, device=device)
    wc = wm.clone()
    wm[0] = lam / (n + lam)
    wc[0] = lam / (n + lam) + 1 - alpha**2 + beta
    return wm, wc, math.sqrt(n + lam)


def sigma_points(mean, cov, scale):
    """Sigma points ``[m, m + scale L[:, i], m - scale L[:, i]]`` with ``L = chol(cov)``.

    :param torch.Tensor mean: ``(..., n)``.
    :param torch.Tensor cov: ``(..., n, n)``.
    :param float scale: ``sqrt(n + lambda)`` from :func:`unscented_weights`.
    :returns: ``(2n+1, ..., n)`` (sigma points along a new leading dim).
    """
    L = _cholesky(cov, "the covariance of the sigma points")
    offsets = scale * _mT(L)  # row i = scale * L[:, i]
    offsets = offsets.movedim(-2, 0)  # (n, ..., n)
    mean = mean.expand(offsets.shape[1:])
    return torch.cat([mean.unsqueeze(0), mean + offsets, mean - offsets], dim=0)


def _weighted_cov(wc, a, b):
    """``sum_i wc_i a_i b_i^T`` for ``a (N, ..., p)``, ``b (N, ..., q)`` -> ``(..., p, q)``."""
    wc = wc.reshape((-1,) + (1,) * (a.dim() - 1))
    return torch.einsum("n...p,n...q->...pq", wc * a, b)


def _weighted_mean(wm, a):
    return (wm.reshape((-1,) + (1,) * (a.dim() - 1)) * a).sum(0)


def _unscented_transform(fn, m, P, t, wm, wc, scale):
    """Moments of ``fn(z, t)`` for ``z ~ N(m, P)`` by sigma points: ``(mean, Cov(y), Cov(z, y))``."""
    chi = sigma_points(m, P, scale)
    Y = fn(chi, t)
    chi = chi.expand(Y.shape[:-1] + chi.shape[-1:])
    mean = _weighted_mean(wm, Y)
    dY = Y - mean
    return mean, _weighted_cov(wc, dY, dY), _weighted_cov(wc, chi - chi[0], dY)


def unscented_kalman_filter(
    x,
    transition_fn,
    observation_fn,
    initial_loc,
    initial_cov,
    transition_cov,
    observation_cov,
    mask=None,
    alpha=1.0,
    beta=2.0,
    kappa=0.0,
):
    """Unscented Kalman filter (thesis Sec. 3.5.1.2).

    Prediction: sigma points ``chi`` of ``N(mu_{t-1}, Sigma_{t-1})``, ``Y = f(chi, t)``,
    ``mu_{t|t-1} = sum Wm_i Y_i``, ``Sigma_{t|t-1} = sum Wc_i (Y_i - mu)(Y_i - mu)^T + Q_t`` and
    ``D_t = sum Wc_i (chi_i - mu_{t-1})(Y_i - mu_{t|t-1})^T``. Measurement: sigma points of
    ``N(mu_{t|t-1}, Sigma_{t|t-1})`` through ``h`` give ``xhat_t``, ``Cov(x_t)`` and
    ``Cov(z_t, x_t)``, then the Gaussian update of Sec. 3.4.1 (see the module docstring). No
    derivatives of ``f``, ``h`` are needed (they may be non-differentiable); gradients w.r.t.
    parameters captured by ``f``, ``h`` flow through the sigma points.

    ``f`` and ``h`` receive sigma points of shape ``(2S+1, ..., S)`` and must broadcast over
    that extra leading dim. Arguments as for :func:`extended_kalman_filter`; ``alpha``, ``beta``,
    ``kappa`` are documented in :func:`unscented_weights`.

    :returns: :class:`GaussianFilterResult`.
    """
    S = initial_loc.shape[-1]
    wm, wc, scale = unscented_weights(
        S, alpha, beta, kappa, dtype=initial_loc.dtype, device=initial_loc.device
    )

    def predict(m, P, t):
        return _unscented_transform(transition_fn, m, P, t, wm, wc, scale)

    def update(m_pred, P_pred, t):
        obs_mean, obs_cov, cross = _unscented_transform(
            observation_fn, m_pred, P_pred, t, wm, wc, scale
        )
        return obs_mean, cross, obs_cov

    return _run_gaussian_filter(
        predict, update, x, mask, initial_loc, initial_cov, transition_cov, observation_cov
    )


def unscented_kalman_smoother(
    x,
    transition_fn,
    observation_fn,
    initial_loc,
    initial_cov,
    transition_cov,
    observation_cov,
    mask=None,
    alpha=1.0,
    beta=2.0,
    kappa=0.0,
):
    """Unscented RTS smoother (Sarkka 2008; thesis Sec. 3.5.1.2): :func:`unscented_kalman_filter`
    followed by :func:`gaussian_rts_smoother`, whose gain uses the sigma-point cross-covariance
    ``D_{t+1} = Cov(z_t, z_{t+1} | x_{1:t})`` stored by the filter. Arguments as for
    :func:`unscented_kalman_filter`.

    :returns: :class:`GaussianSmootherResult`.
    """
    filtered = unscented_kalman_filter(
        x,
        transition_fn,
        observation_fn,
        initial_loc,
        initial_cov,
        transition_cov,
        observation_cov,
        mask=mask,
        alpha=alpha,
        beta=beta,
        kappa=kappa,
    )
    return gaussian_rts_smoother(filtered)
