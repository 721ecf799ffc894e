"""Brute-force float64 reference for linear-Gaussian state-space models.

The whole sequence is stacked into one joint Gaussian over ``(z_1..z_T, x_1..x_T)`` (thesis
eq. 3.8): with w = (z_1 - mu_{1|0}, eps_2, .., eps_T) ~ N(0, blockdiag(Sigma_{1|0}, Q_2..Q_T)),
z = G (w + c) where G = (I - shift(A))^{-1} and c = (mu_{1|0}, b_2, .., b_T); x = blockdiag(C) z
+ delta. Everything else is plain Gaussian conditioning on a chosen subset of the entries of
x, so filtering (condition on a prefix), smoothing (condition on everything observed) and
missing data (condition only on observed entries = deleting rows) all come from one formula.
It is O((T (S + D))^3), meant for small T in tests. Reusable by any test in the repo.
"""

import math
from typing import NamedTuple, Optional

import torch


class DenseLGSSM(NamedTuple):
    mean_z: torch.Tensor  # (T*S,)
    mean_x: torch.Tensor  # (T*D,)
    cov_zz: torch.Tensor  # (T*S, T*S)
    cov_xz: torch.Tensor  # (T*D, T*S)
    cov_xx: torch.Tensor  # (T*D, T*D)
    T: int
    S: int
    D: int


def _per_step(p, T, event_ndim):
    p = torch.as_tensor(p)
    if p.dim() == event_ndim:
        p = p.unsqueeze(0)
    return p.expand((T,) + p.shape[1:])


def dense_lgssm(init_loc, init_cov, A, Q, C, R, T, offsets=None) -> DenseLGSSM:
    """Joint moments of an unbatched LGSSM.

    ``A``, ``Q``: ``(S, S)`` or ``(T|1, S, S)`` (entry 0 unused); ``C`` ``(D, S)`` or
    ``(T|1, D, S)``; ``R`` ``(D, D)`` or ``(T|1, D, D)``; ``offsets`` ``(T, S)`` = B_t u_t or
    None (entry 0 unused).
    """
    init_loc = init_loc.double()
    S = init_loc.shape[-1]
    A = _per_step(A, T, 2).double()
    Q = _per_step(Q, T, 2).double()
    C = _per_step(C, T, 2).double()
    R = _per_step(R, T, 2).double()
    D = C.shape[-2]
    n = T * S
    shift = torch.zeros(n, n, dtype=torch.float64)
    W = torch.zeros(n, n, dtype=torch.float64)
    c = torch.zeros(n, dtype=torch.float64)
    W[:S, :S] = init_cov.double()
    c[:S] = init_loc
    for t in range(1, T):
        shift[t * S : (t + 1) * S, (t - 1) * S : t * S] = A[t]
        W[t * S : (t + 1) * S, t * S : (t + 1) * S] = Q[t]
        if offsets is not None:
            c[t * S : (t + 1) * S] = offsets[t].double()
    G = torch.linalg.inv(torch.eye(n, dtype=torch.float64) - shift)
    mean_z = G @ c
    cov_zz = G @ W @ G.T
    Cb = torch.block_diag(*C)
    Rb = torch.block_diag(*R)
    mean_x = Cb @ mean_z
    cov_xz = Cb @ cov_zz
    cov_xx = Cb @ cov_zz @ Cb.T + Rb
    return DenseLGSSM(mean_z, mean_x, cov_zz, cov_xz, 0.5 * (cov_xx + cov_xx.T), T, S, D)


def observed_index(
    dense: DenseLGSSM, mask: Optional[torch.Tensor] = None, upto: Optional[int] = None
):
    """Flat indices of the entries of x that are conditioned on.

    ``mask``: bool ``(T,)`` or ``(T, D)`` (True = observed) or None; ``upto``: only steps
    ``t < upto`` (0-based), i.e. a prefix x_{1:upto}.
    """
    T, D = dense.T, dense.D
    m = torch.ones(T, D, dtype=torch.bool)
    if mask is not None:
        mask = torch.as_tensor(mask, dtype=torch.bool)
        m = m & (mask if mask.dim() == 2 else mask[:, None])
    if upto is not None:
        m[upto:] = False
    return m.reshape(-1).nonzero().squeeze(-1)


def log_marginal(dense: DenseLGSSM, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """log N(x[idx]; mean_x[idx], cov_xx[idx, idx]) for x of shape (T, D)."""
    if idx.numel() == 0:
        return torch.zeros((), dtype=torch.float64)
    xf = x.reshape(-1).double()[idx]
    mu = dense.mean_x[idx]
    cov = dense.cov_xx[idx][:, idx]
    L = torch.linalg.cholesky(cov)
    v = torch.linalg.solve_triangular(L, (xf - mu)[:, None], upper=False)[:, 0]
    return -0.5 * v @ v - L.diagonal().log().sum() - 0.5 * idx.numel() * math.log(2 * math.pi)


def condition_z(dense: DenseLGSSM, x: torch.Tensor, idx: torch.Tensor):
    """Mean ``(T, S)`` and covariance ``(T*S, T*S)`` of z_{1:T} given the entries x[idx]."""
    if idx.numel() == 0:
        return dense.mean_z.reshape(dense.T, dense.S), dense.cov_zz
    xf = x.reshape(-1).double()[idx]
    Sxx = dense.cov_xx[idx][:, idx]
    Sxz = dense.cov_xz[idx]
    gain = torch.linalg.solve(Sxx, Sxz).T  # (TS, n)
    mean = dense.mean_z + gain @ (xf - dense.mean_x[idx])
    cov = dense.cov_zz - gain @ Sxz
    return mean.reshape(dense.T, dense.S), 0.5 * (cov + cov.T)


def block(cov: torch.Tensor, S: int, t: int, s: int) -> torch.Tensor:
    """Block (t, s) of a (T*S, T*S) covariance: Cov(z_t, z_s)."""
    return cov[t * S : (t + 1) * S, s * S : (s + 1) * S]


def condition_x(dense: DenseLGSSM, x: torch.Tensor, idx: torch.Tensor, target: torch.Tensor):
    """Mean and covariance of the entries x[target] given the entries x[idx]."""
    mu_t = dense.mean_x[target]
    S_tt = dense.cov_xx[target][:, target]
    if idx.numel() == 0:
        return mu_t, S_tt
    xf = x.reshape(-1).double()[idx]
    S_oo = dense.cov_xx[idx][:, idx]
    S_to = dense.cov_xx[target][:, idx]
    gain = torch.linalg.solve(S_oo, S_to.T).T
    mean = mu_t + gain @ (xf - dense.mean_x[idx])
    cov = S_tt - gain @ S_to.T
    return mean, 0.5 * (cov + cov.T)
