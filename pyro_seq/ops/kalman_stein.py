r"""The smoothed covariances of the steady-state path without a loop over time (thesis Sec.
3.4.1, RTS smoother; used by :func:`pyro_seq.ops.kalman_steady.steady_smoother`).

The backward RTS recursion on covariances is a Stein recursion,

    Sigma_{t|T} = Pc_t + J_t Sigma_{t+1|T} J_t^T,   Sigma_{T|T} = Sigma_T,

with Pc_t = Sigma_t - J_t A Sigma_t. After the filter's steady state, J_t = J and
Pc_t = Pc are constant from t = u - 1 on, so at distance j from the end

    X_j = J^j Sigma_T J^{j T} + sum_{i < j} J^i Pc J^{i T},

all j at once from the powers of J (doubling) and a cumulative sum; X_j settles to the
fixed point of the recursion and repeats down to u - 1. Before u - 1, J_t varies: written
for the row-major vectorisation vec(X), the step is vec(X_t) = (J_t (x) J_t) vec(X_{t+1}) +
vec(Pc_t), a linear recursion in S^2 dimensions that
:func:`~pyro_seq.ops.blocked_recursions.varying_recursion` solves in blocks (for S <= 8, where the
S^2 x S^2 Kronecker products stay small). Both replace about three operations per step of
:func:`~pyro_seq.ops.kalman_sequential.backward_covariance_pass`, which stays the reference
and the fallback.
"""

from typing import Optional

import torch
from torch import Tensor

from pyro_seq.ops.blocked_recursions import BLOCK, varying_recursion

__all__ = ["KRONECKER_MAX_STATE", "steady_smoothed_covariances"]

#: Largest state size for which the time-varying stretch runs in Kronecker form.
KRONECKER_MAX_STATE = 8

#: Distance between two settling tests of X_j (two consecutive passes: settled).
_TEST_EVERY = 4


def _powers(J: Tensor, n: int) -> Tensor:
    """J^0 .. J^{n-1} ``(n, S, S)`` by doubling: O(log n) batched products."""
    P = torch.stack([torch.eye(J.shape[-1], dtype=J.dtype, device=J.device), J])
    while P.shape[0] < n:
        P = torch.cat([P, P @ (P[-1] @ J)], 0)
    return P[:n]


def steady_smoothed_covariances(
    J: Tensor, Pc: Tensor, last: Tensor, T: int, tol: float
) -> Optional[Tensor]:
    """Sigma_{t|T} for t = 0..T-1 (module docstring): ``J``, ``Pc`` ``(u, S, S)`` the distinct
    coefficients (entry u - 1 stands for every t >= u - 1), ``last`` ``(S, S)`` the filtered
    Sigma_{T-1} (0-based), ``tol`` the settling tolerance in absolute units relative to the
    largest entry (as the filter's steady-state test). Returns ``(T, S, S)``, exactly
    symmetric, or None where the constant stretch does not settle within the distances
    computed or S exceeds :data:`KRONECKER_MAX_STATE` (the caller runs the loop).
    """
    u, S = J.shape[0], J.shape[-1]
    if S > KRONECKER_MAX_STATE:
        return None
    length = T - u  # distances 1..length cover t = T-2 .. u-1
    n = min(length, max(64, 4 * u)) + 1
    P = _powers(J[-1], n)  # (n, S, S)
    terms = P @ Pc[-1] @ P.mT
    X = P @ last @ P.mT
    X[1:] += torch.cumsum(terms[:-1], 0)  # X_j, j = 0 .. n - 1
    if n - 1 < length:  # the stretch goes on beyond n - 1: it must have settled
        j_test = torch.arange(_TEST_EVERY, n, _TEST_EVERY, device=J.device)
        gap = torch.sub(X[j_test], X[j_test - 1]).abs_().amax((-2, -1))
        ok = (gap <= tol * X[j_test].abs().amax((-2, -1))).tolist()
        settle = next((i for i in range(1, len(ok)) if ok[i - 1] and ok[i]), None)
        if settle is None:
            return None
        j_end = int(j_test[settle])
        X = torch.cat([X[: j_end + 1], X[j_end].expand(length - j_end, S, S)], 0)
    late = X.flip(0)  # t = u - 1 .. T - 1
    if u == 1:
        out = late
    else:
        # t = u - 2 .. 0 backwards, as a forward recursion in tau = u - 2 - t on vec(X)
        steps = u - 1
        nb = -(-steps // BLOCK)
        Jr = J[: u - 1].flip(0)
        F = torch.einsum("tia,tjb->tijab", Jr, Jr).reshape(steps, S * S, S * S)
        g = Pc[: u - 1].flip(0).reshape(steps, S * S, 1)
        g[0] += F[0] @ late[0].reshape(S * S, 1)
        pad = nb * BLOCK - steps
        if pad:
            F = torch.cat([F, F[-1:].expand(pad, S * S, S * S)], 0)
            g = torch.cat([g, g.new_zeros(pad, S * S, 1)], 0)
        y = g.view(nb, BLOCK, S * S, 1)
        varying_recursion(F.reshape(nb, BLOCK, S * S, S * S), y)
        head = y.reshape(nb * BLOCK, S, S)[:steps].flip(0)
        out = torch.cat([head, late], 0)
    return 0.5 * (out + out.mT)
