r"""The data side of the Kalman filter for a time-invariant linear-Gaussian state-space model
after the steady state of its Riccati recursion, in a blocked time layout (thesis eqs.
3.11-3.12; used by :mod:`~pyro_seq.ops.kalman_steady` for ``method="auto"``: the filter,
the smoother's forward pass and :func:`pyro_seq.ops.kalman.kalman_log_likelihood`).

With the gains of :func:`~pyro_seq.ops.kalman_steady.joint_covariance_pass` (constant from
the steady state on) the one-step predictions s_t = mu_{t+1|t} follow a linear recursion

    s_t = Fp_t s_{t-1} + G_t x_t,  Fp_t = A (I - K_t C),  G_t = A K_t,  s_{-1} = mu_{1|0},

the innovations are r_t = x_t - C s_{t-1}, the filtered means mu_t = mu_{t|t-1} + K_t r_t,
and log p(x_t | x_{1:t-1}) = -``||L_t^{-1} r_t||^2`` / 2 - log det L_t - D log(2 pi) / 2
(L_t L_t^T the innovation covariance). Most of the work is a few products of small constant matrices
with all n T observations at once.

Every data-side tensor is in the feature-first blocked layout of
:mod:`~pyro_seq.ops.blocked_recursions` (entry ``[:, j, b, i]`` is step b k + j of sequence
i): the steps before the steady state by
:func:`~pyro_seq.ops.blocked_recursions.varying_recursion`, the rest by
:func:`~pyro_seq.ops.blocked_recursions.blocked_recursion`.
"""

import math
from typing import NamedTuple

import torch
from torch import Tensor

from pyro_seq.ops.blocked_recursions import (
    BLOCK,
    blocks_to_steps,
    from_blocks,
    piecewise_blocked,
    steps_to_blocks,
    to_blocks,
)
from pyro_seq.ops.lgssm import PreparedLGSSM

__all__ = [
    "BlockedFilter",
    "blocked_filter",
    "blocked_filter_rows",
    "blocked_log_likelihood",
    "step_log_det",
]

_LOG_2PI = math.log(2 * math.pi)


def _apply(M: Tensor, y: Tensor, steps: Tensor) -> Tensor:
    """M_t y_t for all steps of ``y (q, k, nb, n)``, M_t = ``M[steps[t]]`` on the head blocks
    (``len(steps)`` steps) and ``M[-1]`` after them: ``M (u, p, q)`` -> ``(p, k, nb, n)``."""
    q, k, nb, n = y.shape
    out = (M[-1] @ y.view(q, -1)).view(-1, k, nb, n)
    steps_to_blocks(out, torch.bmm(M[steps], blocks_to_steps(y, 0, steps.shape[0] // k)))
    return out


class BlockedFilter(NamedTuple):
    """The data side of the steady-state filter in the blocked layout ``(F, k, nb, n)``:
    ``pmeans`` mu_{t|t-1} ``(S, ...)``, ``innovations`` r_t = x_t - C mu_{t|t-1} ``(D, ...)``,
    ``sq`` ``||L_t^{-1} r_t||^2`` ``(k, nb, n)`` (0 at the padding steps) and ``steps`` the index
    of the distinct coefficients of each head step."""

    pmeans: Tensor
    innovations: Tensor
    sq: Tensor
    steps: Tensor


def blocked_filter(mdl: PreparedLGSSM, L: Tensor, K: Tensor) -> BlockedFilter:
    """Predicted means, innovations and squared whitened innovations (module docstring) for
    a time-invariant model with the gains of
    :func:`~pyro_seq.ops.kalman_steady.joint_covariance_pass`: ``L (u, D, D)``,
    ``K (u, S, D)``, entry u - 1 standing for every later step. State offsets b_t
    (``mdl.b``, shared by the batch) enter as mu_{t+1|t} = A mu_t + b_{t+1}."""
    T, S, D = mdl.T, mdl.S, mdl.D
    u = K.shape[0]
    A, C = mdl.A.reshape(S, S), mdl.C.reshape(D, S)
    x = mdl.x.reshape(-1, T, D)
    n = x.shape[0]
    k = BLOCK
    X = to_blocks(x, k)  # (D, k, nb, n)
    nb = X.shape[2]
    bh = min(-(-u // k), nb)  # blocks holding a step t < u
    steps = torch.arange(bh * k, device=x.device).clamp_(max=u - 1)
    G = A @ K  # (u, S, D)
    Fp = A - G @ C  # (u, S, S)
    m0 = mdl.init_loc.reshape(S, 1)

    # s_t = mu_{t+1|t} = Fp_t s_{t-1} + G_t x_t (+ b_{t+1}), s_{-1} = mu_{1|0}, with Fp_t
    # varying up to the steady state (piecewise_blocked)
    s = _apply(G, X, steps)
    if mdl.b is not None:
        b = mdl.b.reshape(-1, S).expand(T, S)
        s += to_blocks(torch.cat([b[1:], b[:1]], 0).unsqueeze(0), k)  # b_{t+1}; last unused
    piecewise_blocked(Fp, s, T, m0.expand(S, n))

    # mu_{t|t-1} = s_{t-1}, innovations r_t = x_t - C mu_{t|t-1}, whitened by L_t^{-1}
    P = torch.empty_like(s)
    P[:, 1:] = s[:, :-1]
    P[:, 0, 1:] = s[:, k - 1, :-1]
    P[:, 0, 0] = m0
    r = torch.addmm(X.view(D, -1), C, P.view(S, -1), alpha=-1.0).view(D, k, nb, n)
    eye = torch.eye(D, dtype=x.dtype, device=x.device)
    v = _apply(torch.linalg.solve_triangular(L, eye, upper=False), r, steps)
    sq = v.square_().sum(0)  # (k, nb, n)
    last = T - (nb - 1) * k  # steps of the last block that are not padding
    if last < k:
        sq[last:, -1] = 0.0
    return BlockedFilter(P, r, sq, steps)


def step_log_det(L: Tensor, T: int) -> Tensor:
    """log det L_t for t = 0..T-1 from the distinct ``L (u, D, D)`` (entry u - 1 repeats)."""
    log_det = L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return torch.cat([log_det, log_det[-1:].expand(T - log_det.shape[0])])


def blocked_log_likelihood(mdl: PreparedLGSSM, L: Tensor, K: Tensor) -> Tensor:
    """log p(x_{1:T}) (thesis eq. 3.12) of every sequence, ``(...)``, from
    :func:`blocked_filter`."""
    T, D = mdl.T, mdl.D
    sq = blocked_filter(mdl, L, K).sq
    total = step_log_det(L, T).sum()
    ll = sq.sum((0, 1)).mul_(-0.5).sub_(total + 0.5 * _LOG_2PI * D * T)
    return ll.reshape(mdl.x.shape[:-2])


def blocked_filter_rows(mdl: PreparedLGSSM, L: Tensor, K: Tensor):
    """The filter's data side in row layout: ``(means, pmeans, log_likelihoods)`` of shapes
    ``(n, T, S)``, ``(n, T, S)``, ``(n, T)`` (mu_t = mu_{t|t-1} + K_t r_t, eq. 3.11; the
    terms of eq. 3.12)."""
    T, D = mdl.T, mdl.D
    f = blocked_filter(mdl, L, K)
    means = f.pmeans + _apply(K, f.innovations, f.steps)
    k, nb, n = f.sq.shape
    ll = f.sq.mul_(-0.5).sub_(0.5 * _LOG_2PI * D)
    ll = ll.permute(2, 1, 0).reshape(n, nb * k)[:, :T] - step_log_det(L, T)
    return from_blocks(means, T), from_blocks(f.pmeans, T), ll
