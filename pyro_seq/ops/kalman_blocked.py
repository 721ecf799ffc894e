r"""The log-likelihood of a time-invariant linear-Gaussian state-space model after the
steady state of its Riccati recursion, with the data in a blocked time layout (thesis eq.
3.12; used by :func:`pyro_seq.ops.kalman.kalman_log_likelihood` with ``method="auto"``).

log p(x_{1:T}) needs only the one-step predictions mu_{t+1|t} = s_t, a linear recursion

    s_t = Fp_t s_{t-1} + G_t x_t,  Fp_t = A (I - K_t C),  G_t = A K_t,  s_{-1} = mu_{1|0},

and the whitened innovations v_t = L_t^{-1} (x_t - C s_{t-1}) (L_t L_t^T the innovation
covariance): log p(x_{1:T}) = sum_t -|v_t|^2 / 2 - log|L_t| - D log(2 pi) / 2. The gains come
from :func:`~pyro_seq.ops.kalman_steady.joint_covariance_pass` and are constant from its
steady state on, so most of the work is a few products of small constant matrices with all
n T observations at once.

Every data-side tensor is in the feature-first blocked layout of
:mod:`~pyro_seq.ops.blocked_recursions` (entry ``[:, j, b, i]`` is step b k + j of sequence
i): the steps before the steady state by
:func:`~pyro_seq.ops.blocked_recursions.varying_recursion`, the rest by
:func:`~pyro_seq.ops.blocked_recursions.blocked_recursion`.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from pyro_seq.ops.blocked_recursions import (
    BLOCK,
    blocked_recursion,
    to_blocks,
    varying_recursion,
)
from pyro_seq.ops.kalman_steady import joint_covariance_pass
from pyro_seq.ops.lgssm import PreparedLGSSM

__all__ = ["steady_log_likelihood"]

_LOG_2PI = math.log(2 * math.pi)


def _head_to_time(y: Tensor, bh: int) -> Tensor:
    """The first ``bh`` blocks of ``y (F, k, nb, n)`` in time order: ``(bh k, F, n)``."""
    F, k, _, n = y.shape
    return y[:, :, :bh].permute(2, 1, 0, 3).reshape(bh * k, F, n)


def _time_to_head(y: Tensor, h: Tensor) -> None:
    """Write ``h (bh k, F, n)`` (time order) into the first blocks of ``y (F, k, nb, n)``."""
    F, k, _, n = y.shape
    bh = h.shape[0] // k
    y[:, :, :bh] = h.view(bh, k, F, n).permute(2, 1, 0, 3)


def steady_log_likelihood(mdl: PreparedLGSSM, steady_state_tol: float) -> Optional[Tensor]:
    """log p(x_{1:T}) (thesis eq. 3.12) of every sequence, for a model where
    :func:`~pyro_seq.ops.kalman_steady.steady_applicable` holds and there are no state
    offsets (``mdl.b is None``): ``mdl.x (..., T, D)`` -> ``(...)``.

    :returns: None where :func:`~pyro_seq.ops.kalman_steady.joint_covariance_pass` fails or
        reaches no steady state before T (the caller then runs the general filter).
    """
    res = joint_covariance_pass(mdl, steady_state_tol)
    if res is None or res[-1] >= mdl.T:
        return None
    _, _, L, K, steady_from = res
    T, S, D = mdl.T, mdl.S, mdl.D
    u = steady_from + 1  # K[t], L[t] for t < u; entry u - 1 from then on
    A, C = mdl.A.reshape(S, S), mdl.C.reshape(D, S)
    xb = mdl.x.shape[:-2]
    x = mdl.x.reshape(-1, T, D)
    n = x.shape[0]
    k = BLOCK
    X = to_blocks(x, k)  # (D, k, nb, n)
    nb = X.shape[2]
    bh = min(-(-u // k), nb)  # blocks holding a step t < u
    th = bh * k
    steps = torch.arange(th, device=x.device).clamp_(max=u - 1)
    G = A @ K  # (u, S, D)
    Fp = A - G @ C  # (u, S, S)

    # s_t = Fp_t s_{t-1} + G_t x_t: the first bh blocks (time-varying coefficients) in time
    # order by varying_recursion, the rest by blocked_recursion with the constant ones
    s = (G[-1] @ X.view(D, -1)).view(S, k, nb, n)
    head = torch.bmm(G[steps], _head_to_time(X, bh))  # (th, S, n)
    head[0].addmm_(Fp[0], mdl.init_loc.reshape(S, 1).expand(S, n))
    varying_recursion(Fp[steps].view(bh, k, S, S), head.view(bh, k, S, n))
    _time_to_head(s, head)
    if bh < nb:
        blocked_recursion(Fp[-1], s[:, :, bh:], head[-1])

    # innovations r_t = x_t - C s_{t-1} (s_{-1} = mu_{1|0}), whitened by L_t^{-1}
    Cs = (C @ s.view(S, -1)).view(D, k, nb, n)
    r = X
    r[:, 1:] -= Cs[:, :-1]
    r[:, 0, 1:] -= Cs[:, k - 1, :-1]
    r[:, 0, 0] -= (C @ mdl.init_loc.reshape(S, 1)).expand(D, n)
    eye = torch.eye(D, dtype=x.dtype, device=x.device)
    Linv = torch.linalg.solve_triangular(L, eye, upper=False)  # (u, D, D)
    v = (Linv[-1] @ r.view(D, -1)).view(D, k, nb, n)
    _time_to_head(v, torch.bmm(Linv[steps], _head_to_time(r, bh)))
    sq = v.view(D, -1).pow(2).sum(0).view(k, nb, n)
    last = T - (nb - 1) * k  # steps of the last block that are not padding
    if last < k:
        sq[last:, -1] = 0.0
    log_det = L.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # (u,)
    total_log_det = log_det[:-1].sum() + (T - u + 1) * log_det[-1]
    ll = sq.sum((0, 1)).mul_(-0.5).sub_(total_log_det + 0.5 * _LOG_2PI * D * T)
    return ll.reshape(xb)
