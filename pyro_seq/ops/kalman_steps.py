r"""The per-step formulas of the Kalman filter and RTS smoother (thesis Sec. 3.4.1) that the
sequential passes (:mod:`~pyro_seq.ops.kalman_sequential`) and the parallel scans
(:mod:`~pyro_seq.ops.kalman_parallel`) share; :mod:`pyro_seq.ops.kalman` combines them.

Each works on all steps of a :class:`~pyro_seq.ops.lgssm.PreparedLGSSM` at once: the gain
and the measurement update on covariances (:func:`kalman_gain`, :func:`measurement_update`),
the affine form mu_t = F_t mu_{t-1} + g_t of the mean recursion (:func:`mean_coefficients`),
the predicted moments (:func:`predicted_covs`, :func:`predicted_means`), the log-likelihood
terms of eq. 3.12 (:func:`step_log_likelihoods`) and the coefficients of the backward
recursions (:func:`backward_coefficients` for sampling, :func:`smoother_coefficients` and
:func:`a_sigma` for smoothing). ``f`` below is a filter result with the fields of
:class:`~pyro_seq.ops.kalman.KalmanFilterResult`.
"""

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from pyro_seq.ops.lgssm import PreparedLGSSM, at_time, cat_time, slice_time
from pyro_seq.ops.linalg import (
    checked_cholesky,
    fused_addmm,
    mv,
    psd_cholesky,
    psd_solve,
    repeat_last,
    rounding_scale,
    sym,
    tri_solve_lower,
    tri_solve_lower_transposed,
    trsv,
)

__all__ = [
    "KalmanStep",
    "a_sigma",
    "backward_coefficients",
    "kalman_gain",
    "kalman_predict",
    "kalman_update",
    "mean_coefficients",
    "measurement_update",
    "predicted_covs",
    "predicted_means",
    "smoother_coefficients",
    "step_log_likelihoods",
]


_LOG_2PI = math.log(2 * math.pi)


# ---------------------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------------------


def kalman_gain(P: Tensor, C: Tensor, R: Tensor):
    """Cholesky factor L of the innovation covariance C P C^T + R (eq. 3.12) and the Kalman
    gain K = P C^T (C P C^T + R)^{-1} (by ``cholesky_solve``). P (..., S, S), C (..., D, S),
    R (..., D, D) -> L (..., D, D), K (..., S, D)."""
    CP = C @ P
    L = checked_cholesky(sym(CP @ C.mT + R), "innovation covariance C P C^T + R")
    return L, torch.cholesky_solve(CP, L).mT


def measurement_update(P: Tensor, C: Tensor, R: Tensor):
    """Measurement step of thesis Sec. 3.4.1 on covariances only.

    P (..., S, S) predicted Sigma_{t|t-1}; C (..., D, S); R (..., D, D).
    Returns ``(L, K, Sigma)``: L (..., D, D) Cholesky factor of the innovation covariance
    C P C^T + R (eq. 3.12), K (..., S, D) the Kalman gain P C^T (C P C^T + R)^{-1}, and the
    filtered covariance in Joseph form (I - K C) P (I - K C)^T + K R K^T.
    """
    L, K = kalman_gain(P, C, R)
    IKC = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device) - K @ C
    Sigma = IKC @ P @ IKC.mT + K @ R @ K.mT
    return L, K, sym(Sigma)


def mean_coefficients(mdl: PreparedLGSSM, K: Tensor):
    """Affine form of the mean recursion, mu_t = F_t mu_{t-1} + g_t (thesis 3.4.1).

    With predicted mean mu_{t|t-1} = A_t mu_{t-1} + b_t and update
    mu_t = mu_{t|t-1} + K_t (x_t - C_t mu_{t|t-1}):
    F_t = A_t - K_t (C_t A_t), g_t = b_t - K_t C_t b_t + K_t x_t, and for t = 1
    g_1 = mu_{1|0} - K_1 C_1 mu_{1|0} + K_1 x_1 (F_1 is not used). K: (pb, T, S, D).
    Returns F (pb, T|1, S, S) and g (b, T, S). With C_t A_t constant, K_t (C A) for all t
    is one ``(T*S, D) x (D, S)`` GEMM.
    """
    T, D, S = mdl.T, mdl.D, mdl.S
    CA = mdl.C @ mdl.A
    if CA.shape[:-2].numel() == 1:
        CA = CA.reshape(D, S)
    F = mdl.A - K @ CA  # (pb, T, S, S)
    g = mv(K, mdl.x)  # (b, T, S)
    C0, K0 = at_time(mdl.C, 0, 2), at_time(K, 0, 2)
    g0 = g[..., :1, :] + (mdl.init_loc - mv(K0, mv(C0, mdl.init_loc))).unsqueeze(-2)
    if T == 1:
        return F, g0
    g_rest = g[..., 1:, :]
    if mdl.b is not None:
        b = slice_time(mdl.b, 1, None, 1)
        Kb = mv(slice_time(K, 1, None, 2), mv(slice_time(mdl.C, 1, None, 2), b))
        g_rest = g_rest + (b - Kb)
    return F, cat_time(g0, g_rest, 1, T)


def predicted_covs(mdl: PreparedLGSSM, covs: Tensor) -> Tensor:
    """Sigma_{t|t-1} = A_t Sigma_{t-1} A_t^T + Q_t (t >= 2), Sigma_{1|0} for t = 1.
    (pb, T, S, S)."""
    T = mdl.T
    first = mdl.init_cov.unsqueeze(-3)
    if T == 1:
        return first
    A = slice_time(mdl.A, 1, None, 2)
    Q = slice_time(mdl.Q, 1, None, 2)
    rest = sym(A @ covs[..., :-1, :, :] @ A.mT + Q)
    return cat_time(first, rest, 2, T)


def predicted_means(mdl: PreparedLGSSM, means: Tensor) -> Tensor:
    """mu_{t|t-1} = A_t mu_{t-1} + B_t u_t (t >= 2), mu_{1|0} for t = 1. (b, T, S)."""
    T = mdl.T
    first = mdl.init_loc.unsqueeze(-2)
    if T == 1:
        return first
    rest = mv(slice_time(mdl.A, 1, None, 2), means[..., :-1, :])
    if mdl.b is not None:
        rest = rest + slice_time(mdl.b, 1, None, 1)
    return cat_time(first, rest, 1, T)


def step_log_likelihoods(mdl: PreparedLGSSM, pred_means: Tensor, L: Tensor) -> Tensor:
    """log N(x_t; C_t mu_{t|t-1}, C_t Sigma_{t|t-1} C_t^T + R_t) over observed elements
    (eq. 3.12)."""
    r = mdl.x - mv(mdl.C, pred_means)
    v = trsv(L, r)
    half_logdet = L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    n = mdl.num_obs if mdl.num_obs is not None else mdl.D
    return -0.5 * v.pow(2).sum(-1) - half_logdet - 0.5 * _LOG_2PI * n


# ---------------------------------------------------------------------------------------
# Backward pass
# ---------------------------------------------------------------------------------------


def backward_coefficients(mdl: PreparedLGSSM, f):
    """RTS gains and backward conditionals p(z_t | z_{t+1}, x_{1:t}) = N(J_t z_{t+1} + h_t, Pc_t).

    J_t = Sigma_t A_{t+1}^T Sigma_{t+1|t}^{-1} (via Cholesky of Sigma_{t+1|t}; the
    minimum-norm solution by :func:`~pyro_seq.ops.linalg.psd_solve` where it is rank-deficient),
    h_t = mu_t - J_t mu_{t+1|t},
    Pc_t = (I - J_t A_{t+1}) Sigma_t (I - J_t A_{t+1})^T + J_t Q_{t+1} J_t^T (Joseph form).
    Shapes: J, Pc (pb, T-1, S, S); h (b, T-1, S).
    """
    S = mdl.S
    A = slice_time(mdl.A, 1, None, 2)
    Q = slice_time(mdl.Q, 1, None, 2)
    Sig = f.covs[..., :-1, :, :]
    J = psd_solve(
        f.predicted_covs[..., 1:, :, :],
        A @ Sig,
        "predicted covariance Sigma_{t+1|t}",
        scale=rounding_scale(f.predicted_covs)[..., 1:],
    ).mT
    IJA = torch.eye(S, dtype=J.dtype, device=J.device) - J @ A
    Pc = sym(IJA @ Sig @ IJA.mT + J @ Q @ J.mT)
    h = f.means[..., :-1, :] - mv(J, f.predicted_means[..., 1:, :])
    return J, h, Pc


def a_sigma(mdl: PreparedLGSSM, Sig: Tensor) -> Tensor:
    """A_{t+1} Sigma_t for Sig = filtered covs[:-1]."""
    A = slice_time(mdl.A, 1, None, 2)
    if A.shape[:-2].numel() == 1:
        # Sigma_t is exactly symmetric: A Sigma_t = (Sigma_t A^T)^T, one (T*S, S) x (S, S) GEMM
        return (Sig @ A.reshape(A.shape[-2:]).mT).mT
    return A @ Sig


def smoother_coefficients(
    mdl: PreparedLGSSM,
    f,
    ASig: Optional[Tensor],
    backward_covs: bool,
    steady_from: Optional[int] = None,
):
    """RTS gains for smoothing (cheaper variants of :func:`backward_coefficients`).

    With L_t L_t^T = Sigma_{t+1|t} (Cholesky) and A_{t+1} Sigma_t (``ASig``, reused from
    the sequential filter when given): J_t = Sigma_t A_{t+1}^T Sigma_{t+1|t}^{-1} by one
    ``cholesky_solve``, h_t = mu_t - J_t mu_{t+1|t}. With ``backward_covs`` (for the
    parallel scan) also Pc_t = Sigma_t - J_t Sigma_{t+1|t} J_t^T in the exactly symmetric
    Schur-complement form Sigma_t - G_t^T G_t, G_t = L_t^{-1} A_{t+1} Sigma_t, and
    J_t = G_t^T L_t^{-1}; otherwise Pc is None. (FFBS keeps the Joseph form, whose
    PSD-by-construction Pc_t is factored for sampling.) With a filter in steady state from
    step ``steady_from`` on, J_t repeats from there and is computed once. Where some
    Sigma_{t+1|t} is rank-deficient to working precision, J_t = Sigma_t A_{t+1}^T
    Sigma_{t+1|t}^+ by :func:`~pyro_seq.ops.linalg.psd_solve` and
    Pc_t = Sigma_t - J_t A_{t+1} Sigma_t.
    """
    T1 = mdl.T - 1
    u = T1 if steady_from is None or backward_covs else min(steady_from + 1, T1)
    Sig = f.covs[..., :u, :, :]
    P = f.predicted_covs[..., 1 : u + 1, :, :]
    what = "predicted covariance Sigma_{t+1|t}"
    scale = rounding_scale(f.predicted_covs[..., : u + 1, :, :])[..., 1:]
    Lp, deficient = factor = psd_cholesky(P, what, scale)
    if ASig is None:
        ASig = a_sigma(mdl, Sig)
    else:
        ASig = ASig[..., :u, :, :]
    Pc = None
    if backward_covs and deficient is None:
        G = tri_solve_lower(Lp, ASig)
        J = tri_solve_lower_transposed(Lp, G).mT
        Pc = sym(fused_addmm(Sig, G.mT, G, alpha=-1.0))
    else:
        J = repeat_last(psd_solve(P, ASig, what, factor, scale).mT, T1, -3)
        if backward_covs:  # rank-deficient Sigma_{t+1|t}: Pc = Sigma_t - J_t A_{t+1} Sigma_t
            Pc = sym(fused_addmm(Sig, J, ASig, alpha=-1.0))
    h = f.means[..., :-1, :] - mv(J, f.predicted_means[..., 1:, :])
    return J, h, Pc


# ---------------------------------------------------------------------------------------
# One step at a time (public through :mod:`pyro_seq.ops.kalman`:
# models whose parameters at step t depend on earlier observations)
# ---------------------------------------------------------------------------------------


class KalmanStep(NamedTuple):
    """One measurement step of the Kalman filter (thesis Sec. 3.4.1), before the observation.

    ``pred_mean (..., S)``: mu_{t|t-1}. ``loc (..., D)``, ``scale_tril (..., D, D)``: the
    one-step predictive p(x_t | x_{1:t-1}) = N(C_t mu_{t|t-1}, C_t Sigma_{t|t-1} C_t^T + R_t) of
    eq. 3.12, as a location and the Cholesky factor of its covariance. ``gain (..., S, D)``:
    K_t. ``cov (..., S, S)``: the filtered Sigma_t (it does not depend on x_t).
    :meth:`mean` gives the filtered mu_t once x_t is known.
    """

    pred_mean: Tensor
    loc: Tensor
    scale_tril: Tensor
    gain: Tensor
    cov: Tensor

    def mean(self, observation: Tensor) -> Tensor:
        """Filtered mean mu_t = mu_{t|t-1} + K_t (x_t - C_t mu_{t|t-1}) ``(..., S)``."""
        return self.pred_mean + mv(self.gain, observation - self.loc)


def kalman_predict(
    mean: Tensor,
    cov: Tensor,
    transition_matrix: Tensor,
    transition_cov: Tensor,
    offset: Optional[Tensor] = None,
):
    """Prediction step (thesis eq. 3.11): mu_{t|t-1} = A_t mu_{t-1} + b_t,
    Sigma_{t|t-1} = A_t Sigma_{t-1} A_t^T + Q_t.

    :param mean: ``(..., S)``; ``cov`` ``(..., S, S)``; ``transition_matrix`` A_t and
        ``transition_cov`` Q_t ``(..., S, S)``; ``offset`` b_t = B_t u_t ``(..., S)`` or None.
        Batch dimensions broadcast.
    :returns: ``(mean, cov)`` of p(z_t | x_{1:t-1}).
    """
    m = mv(transition_matrix, mean)
    if offset is not None:
        m = m + offset
    return m, sym(transition_matrix @ cov @ transition_matrix.mT + transition_cov)


def kalman_update(
    pred_mean: Tensor, pred_cov: Tensor, observation_matrix: Tensor, observation_cov: Tensor
) -> KalmanStep:
    """Measurement step (thesis eq. 3.11) up to the observation: K_t = Sigma_{t|t-1} C_t^T S_t^{-1}
    with S_t = C_t Sigma_{t|t-1} C_t^T + R_t, Sigma_t in Joseph form
    (I - K C) Sigma_{t|t-1} (I - K C)^T + K R K^T (PSD by construction), and the predictive
    of x_t; ``.mean(x_t)`` completes it (split so that a model can sample x_t from the
    predictive first).

    :param pred_mean: ``(..., S)``; ``pred_cov`` ``(..., S, S)``; ``observation_matrix`` C_t
        ``(..., D, S)``; ``observation_cov`` R_t ``(..., D, D)`` positive definite. Batch
        dimensions broadcast.
    :returns: :class:`KalmanStep`.
    :raises ValueError: the innovation covariance S_t is not positive definite.
    """
    L, K, Sigma = measurement_update(pred_cov, observation_matrix, observation_cov)
    return KalmanStep(pred_mean, mv(observation_matrix, pred_mean), L, K, Sigma)
