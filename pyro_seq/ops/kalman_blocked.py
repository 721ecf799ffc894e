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

Such tall, thin products are several times slower with the n T steps as rows than with
them as columns, so every data-side tensor here is feature-first in the *blocked* layout
``(F, k, nb, n)``: entry ``[:, j, b, i]`` is step t = b k + j of sequence i (T padded to
nb k). A constant matrix acts on every step with one product ``(F', F) @ (F, k nb n)``, and
the slice of all blocks' j-th steps, ``[:, j]``, is one matrix ``(F, nb n)``, so
:func:`blocked_recursion` solves the recursion inside all blocks with k - 1 products and
joins the blocks by the same recursion with F^k over the block ends (O(log_k T) levels).
"""

import math
from typing import Optional

import torch
from torch import Tensor

from pyro_seq.ops.kalman_steady import joint_covariance_pass
from pyro_seq.ops.lgssm import PreparedLGSSM

__all__ = [
    "blocked_recursion",
    "from_blocks",
    "steady_log_likelihood",
    "to_blocks",
    "varying_recursion",
]

#: Steps per block (k); the block-local solution costs k - 1 products.
BLOCK = 8

#: Recursions over at most this many steps run as a plain loop.
_LOOP_MAX = 16

_LOG_2PI = math.log(2 * math.pi)


def to_blocks(x: Tensor, k: int = BLOCK) -> Tensor:
    """``(n, T, F)`` -> the blocked layout ``(F, k, nb, n)``, nb = ceil(T / k), with zeros
    for the padding steps t >= T (module docstring)."""
    n, T, F = x.shape
    nb = -(-T // k)
    if nb * k != T:
        x = torch.cat([x, x.new_zeros(n, nb * k - T, F)], 1)
    return x.reshape(n, nb, k, F).permute(3, 2, 1, 0).contiguous()


def from_blocks(y: Tensor, T: int) -> Tensor:
    """The inverse of :func:`to_blocks`: ``(F, k, nb, n)`` -> ``(n, T, F)``."""
    F, k, nb, n = y.shape
    return y.permute(3, 2, 1, 0).reshape(n, nb * k, F)[:, :T]


def blocked_recursion(F: Tensor, g: Tensor, y0: Optional[Tensor] = None) -> Tensor:
    """y_t = F y_{t-1} + g_t for all steps, in place: F ``(S, S)``, g ``(S, k, nb, n)`` in the
    blocked layout (a view is fine), y0 ``(S, n)`` the state before step 0 (None: 0).
    Returns ``g``, now holding y.

    Inside every block at once y_j = F y_{j-1} + g_j (k - 1 products); the block ends
    E_b = F^k E_{b-1} + y_{b, k-1} are the same recursion over nb steps (solved by this
    function in its own blocked layout, or a loop when short), and step j of block b gets
    F^{j+1} E_{b-1}.
    """
    S, k, nb, n = g.shape
    if y0 is not None:
        g[:, 0, 0].addmm_(F, y0)
    cols = g.view(S, k, nb * n).unbind(1)  # step j of every block: (S, nb n)
    for j in range(1, k):
        cols[j].addmm_(F, cols[j - 1])
    if nb == 1:
        return g
    powers = [F]
    for _ in range(k - 1):
        powers.append(F @ powers[-1])
    ends = g[:, k - 1, :-1]  # (S, nb - 1, n): the local block ends, E_{-1} = 0
    if nb - 1 <= _LOOP_MAX:
        E = ends.clone(memory_format=torch.contiguous_format)
        Es = E.unbind(1)
        for b in range(1, nb - 1):
            Es[b].addmm_(powers[-1], Es[b - 1])
    else:
        E = from_blocks(blocked_recursion(powers[-1], to_blocks(ends.permute(2, 1, 0), k)), nb - 1)
        E = E.permute(2, 1, 0).contiguous()
    # Pw[(a, j), c] = (F^{j+1})[a, c]
    Pw = torch.stack(powers, 1).reshape(S * k, S)
    g[:, :, 1:] += (Pw @ E.view(S, (nb - 1) * n)).view(S, k, nb - 1, n)
    return g


def varying_recursion(F: Tensor, y: Tensor) -> Tensor:
    """y_t = F_t y_{t-1} + g_t with y_{-1} = 0, in place, for blocks in time order:
    F ``(nb, k, S, S)`` (entry ``[b, j]`` is F_t for t = b k + j), y ``(nb, k, S, n)``
    holding g on entry and y on return.

    Inside all blocks at once (k - 1 batched products), the products Pi_{b, j} =
    F_{b k + j} ... F_{b k} likewise, the block ends E_b = y_{b, k-1} + Pi_{b, k-1} E_{b-1}
    by a loop over the blocks, and y_{b, j} += Pi_{b, j} E_{b-1}.
    """
    nb, k = F.shape[:2]
    ys, Fs = y.unbind(1), F.unbind(1)
    for j in range(1, k):
        ys[j].baddbmm_(Fs[j], ys[j - 1])
    if nb == 1:
        return y
    Pi = [Fs[0]]
    for j in range(1, k):
        Pi.append(torch.bmm(Fs[j], Pi[-1]))
    last, Pk = ys[k - 1].unbind(0), Pi[-1].unbind(0)
    ends = [last[0]]
    for b in range(1, nb - 1):
        ends.append(torch.addmm(last[b], Pk[b], ends[-1]))
    Pis = torch.stack(Pi, 1)  # (nb, k, S, S)
    y[1:] += Pis[1:] @ torch.stack(ends).unsqueeze(1)
    return y


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
