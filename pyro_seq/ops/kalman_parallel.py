r"""Parallel-in-time Kalman filtering, smoothing and sampling by associative scans.

Sarkka & Garcia-Fernandez (2021), "Temporal parallelization of Bayesian smoothers",
IEEE TAC 66(1). Each recursion of :mod:`pyro_seq.ops.kalman` is written as a prefix
"sum" under an associative operator and evaluated with an odd/even scan of depth
O(log T) (2 log2 T rounds of batched tensor operations, about 2T applications in all).

Three scans are used (functions are internal building blocks of
:func:`pyro_seq.ops.kalman.kalman_filter` / ``kalman_smoother`` / ``kalman_sample`` with
``method="parallel"``; the public entry points are those functions):

* :func:`covariance_scan`: the filtering elements of Sarkka & Garcia-Fernandez (their
  Lemmas 7-8) restricted to the data-independent parts ``(A, C, J)``: element t encodes
  p(z_t | z_{t-1}, x_t) = N(A z_{t-1} + ., C) and the information J of x_t about z_{t-1};
  the prefix up to t has C = Sigma_t (filtered covariance, thesis eq. 3.11).
* :func:`affine_scan`: the filtered means obey the linear recursion
  mu_t = F_t mu_{t-1} + g_t once the gains are known; prefixes of affine maps compose as
  (F2, g2) o (F1, g1) = (F2 F1, F2 g1 + g2).
* :func:`backward_scan`: the RTS smoother / FFBS backward recursion
  z_t = J_t z_{t+1} + h_t + noise(Pc_t) composed from the end (Sarkka & Garcia-Fernandez,
  smoothing elements): (E, g, L) o (E', g', L') = (E E', E g' + g, E L' E^T + L).

Only the covariance scan needs linear solves, and it runs with the batch shape of the
parameters and mask, not of the data.
"""

from typing import Callable, List, Optional, Sequence

import torch
from torch import Tensor

from pyro_seq.ops.kalman_steps import kalman_gain, measurement_update, predicted_covs
from pyro_seq.ops.lgssm import PreparedLGSSM, at_time, cat_time, slice_time
from pyro_seq.ops.linalg import broadcast_shapes, fold_columns, sym

__all__ = ["associative_scan", "covariance_scan", "affine_scan", "backward_scan"]


def _cat0(a: Tensor, b: Tensor) -> Tensor:
    shape = broadcast_shapes(a.shape[1:], b.shape[1:])
    return torch.cat([a.expand(a.shape[:1] + shape), b.expand(b.shape[:1] + shape)], 0)


def _interleave(even: Tensor, odd: Tensor) -> Tensor:
    shape = broadcast_shapes(even.shape[1:], odd.shape[1:])
    even = even.expand(even.shape[:1] + shape)
    odd = odd.expand(odd.shape[:1] + shape)
    n = odd.shape[0]
    out = torch.stack([even[:n], odd], 1).flatten(0, 1)
    if even.shape[0] > n:
        out = torch.cat([out, even[n:]], 0)
    return out


def _scan0(combine: Callable, elems: List[Tensor]) -> List[Tensor]:
    T = elems[0].shape[0]
    if T == 1:
        return elems
    n = T // 2
    pairs = combine([e[0 : 2 * n : 2] for e in elems], [e[1 : 2 * n : 2] for e in elems])
    odd = _scan0(combine, pairs)  # prefixes ending at 1, 3, ..., 2n-1
    rest = [e[2::2] for e in elems]  # elements 2, 4, ...
    m = rest[0].shape[0]
    if m > 0:
        tail = combine([o[:m] for o in odd], rest)
        even = [_cat0(e[:1], tl) for e, tl in zip(elems, tail)]
    else:
        even = [e[:1] for e in elems]
    return [_interleave(ev, od) for ev, od in zip(even, odd)]


def associative_scan(
    combine: Callable[[List[Tensor], List[Tensor]], List[Tensor]],
    elems: Sequence[Tensor],
    event_ndims: Sequence[int],
    reverse: bool = False,
) -> List[Tensor]:
    """Inclusive prefix scan ``out_t = e_1 * e_2 * ... * e_t`` under an associative ``combine``.

    :param combine: ``combine(earlier, later) -> combined``, each a list of tensors with
        the time dimension first (dim 0) followed by broadcastable batch and event dims.
    :param elems: tensors of shape ``batch_i + (T,) + event_i`` (batch shapes broadcast).
    :param event_ndims: number of event dims of each tensor (time is just left of them).
    :param reverse: scan from the end (``out_t = e_T * ... * e_t`` with ``combine(later,
        earlier)``).
    :returns: list of tensors ``batch + (T,) + event_i`` (batch broadcast), depth O(log T).
    """
    nb = max(e.dim() - k - 1 for e, k in zip(elems, event_ndims))
    moved = []
    for e, k in zip(elems, event_ndims):
        e = e.reshape((1,) * (nb - (e.dim() - k - 1)) + e.shape)
        e = e.movedim(nb, 0)
        moved.append(e.flip(0) if reverse else e)
    out = _scan0(combine, moved)
    return [(o.flip(0) if reverse else o).movedim(0, nb) for o in out]


# ---------------------------------------------------------------------------------------
# Filtering covariances
# ---------------------------------------------------------------------------------------


def _combine_filter(earlier: List[Tensor], later: List[Tensor]) -> List[Tensor]:
    """Sarkka & Garcia-Fernandez (2021) filtering operator on packed elements [A | C | J]:

    A_ij = A_j (I + C_i J_j)^{-1} A_i,  C_ij = A_j (I + C_i J_j)^{-1} C_i A_j^T + C_j,
    J_ij = A_i^T (I + J_j C_i)^{-1} J_j A_i + J_i,
    using one LU solve with M = I + C_i J_j (and A_i^T M^{-T} = (M^{-1} A_i)^T).
    """
    (Pi,), (Pj,) = earlier, later
    S = Pi.shape[-2]
    Ai, Ci, Ji = Pi[..., :S], Pi[..., S : 2 * S], Pi[..., 2 * S :]
    Aj, Cj, Jj = Pj[..., :S], Pj[..., S : 2 * S], Pj[..., 2 * S :]
    M = Ci @ Jj
    M.diagonal(dim1=-2, dim2=-1).add_(1.0)
    Y = torch.linalg.solve(M, Pi[..., : 2 * S])  # [M^{-1} A_i | M^{-1} C_i]
    X = Aj @ Y
    C = X[..., S:] @ Aj.mT + Cj
    J = Y[..., :S].mT @ (Jj @ Ai) + Ji
    return [torch.cat([X[..., :S], C, J], -1)]


def covariance_scan(mdl: PreparedLGSSM):
    """Filtered covariances by a parallel scan, then the batched measurement update.

    Elements (thesis eqs. 3.6-3.7 per step): for t = 1, A = 0, C = Sigma_1 (measurement
    update of Sigma_{1|0}), J = 0; for t >= 2 with S_t = C_t Q_t C_t^T + R_t,
    K_t = Q_t C_t^T S_t^{-1}: A = (I - K_t C_t) A_t, C = (I - K_t C_t) Q_t (Joseph form),
    J = A_t^T C_t^T S_t^{-1} C_t A_t. The prefix C is Sigma_t; from it
    Sigma_{t|t-1} = A_t Sigma_{t-1} A_t^T + Q_t and the gains K_t and innovation Cholesky
    factors are computed for all t in one batch.

    :returns: ``(predicted_covs, covs, innovation_cholesky, gains)`` of shapes
        ``pb + (T, S, S)``, ``pb + (T, S, S)``, ``pb + (T, D, D)``, ``pb + (T, S, D)``
        where ``pb`` is the parameter/mask batch shape.
    """
    T, S = mdl.T, mdl.S
    C0, R0 = at_time(mdl.C, 0, 2), at_time(mdl.R, 0, 2)
    _, _, Sigma1 = measurement_update(mdl.init_cov, C0, R0)
    if T > 1:
        At = slice_time(mdl.A, 1, None, 2)
        Qt = slice_time(mdl.Q, 1, None, 2)
        Ct = slice_time(mdl.C, 1, None, 2)
        Rt = slice_time(mdl.R, 1, None, 2)
        L, K, Ce = measurement_update(Qt, Ct, Rt)
        eye = torch.eye(S, dtype=K.dtype, device=K.device)
        Ae = (eye - K @ Ct) @ At
        W = torch.linalg.solve_triangular(L, Ct @ At, upper=False)
        Je = W.mT @ W
        zero = torch.zeros((1, S, S), dtype=Ae.dtype, device=Ae.device)
        first = torch.cat(torch.broadcast_tensors(zero, Sigma1.unsqueeze(-3), zero), -1)
        rest = torch.cat(torch.broadcast_tensors(Ae, Ce, Je), -1)
        (packed,) = associative_scan(_combine_filter, [cat_time(first, rest, 2, T)], [2])
        prefix_C = sym(packed[..., S : 2 * S])
    else:
        prefix_C = Sigma1.unsqueeze(-3)
    pcovs = predicted_covs(mdl, prefix_C)
    L, K = kalman_gain(pcovs, mdl.C, mdl.R)
    return pcovs, prefix_C, L, K


# ---------------------------------------------------------------------------------------
# Linear recursions in the means
# ---------------------------------------------------------------------------------------


def _combine_affine(earlier: List[Tensor], later: List[Tensor]) -> List[Tensor]:
    """(F2, G2) o (F1, G1) = (F2 F1, F2 G1 + G2) on packed [F | G] (G: vectors as columns)."""
    (P1,), (P2,) = earlier, later
    S = P2.shape[-2]
    X = P2[..., :S] @ P1
    return [torch.cat([X[..., :S], X[..., S:] + P2[..., S:]], -1)]


def _combine_affine_cov(earlier: List[Tensor], later: List[Tensor]) -> List[Tensor]:
    """(E2, L2, G2) o (E1, L1, G1) = (E2 E1, E2 L1 E2^T + L2, E2 G1 + G2) on packed [E | L | G]."""
    (P1,), (P2,) = earlier, later
    S = P2.shape[-2]
    E2 = P2[..., :S]
    X = E2 @ P1
    L = X[..., S : 2 * S] @ E2.mT + P2[..., S : 2 * S]
    return [torch.cat([X[..., :S], L, X[..., 2 * S :] + P2[..., 2 * S :]], -1)]


def affine_scan(F: Tensor, g: Tensor) -> Tensor:
    """All prefixes of mu_t = F_t mu_{t-1} + g_t with F_1 ignored (mu_1 = g_1).

    :param F: ``pb + (T, S, S)``; :param g: ``b + (T, S)``. :returns: ``b + (T, S)``.
    """
    S = F.shape[-1]
    F = torch.cat([torch.zeros_like(F[..., :1, :, :]), F[..., 1:, :, :]], -3)
    Fp, G, unfold = fold_columns(F, g)
    (packed,) = associative_scan(_combine_affine, [torch.cat([Fp, G], -1)], [2])
    return unfold(packed[..., S:])


def backward_scan(J: Tensor, h: Tensor, Pc: Optional[Tensor], zT: Tensor, PT: Optional[Tensor]):
    """All suffixes of the backward recursion z_t = J_t z_{t+1} + h_t (+ noise of cov Pc_t).

    RTS smoother (``Pc`` given): returns smoothed means ``b + (T, S)`` and covariances
    ``pb + (T, S, S)`` with Sigma_{t|T} = J_t Sigma_{t+1|T} J_t^T + Pc_t, starting from
    (``zT`` = mu_T, ``PT`` = Sigma_T). FFBS (``Pc=None``, noise already inside ``h``):
    returns the sample path ``b + (T, S)`` and None.

    :param J: ``pb + (T-1, S, S)``; :param h: ``b + (T-1, S)``; :param Pc: ``pb + (T-1, S, S)``.
    """
    S = J.shape[-1]
    zero = torch.zeros((1, S, S), dtype=J.dtype, device=J.device)
    E = torch.cat([J, zero.expand(J.shape[:-3] + (1, S, S))], -3)
    g = _cat_time_end(h, zT)
    if Pc is None:
        Ep, G, unfold = fold_columns(E, g)
        (packed,) = associative_scan(_combine_affine, [torch.cat([Ep, G], -1)], [2], reverse=True)
        return unfold(packed[..., S:]), None
    assert PT is not None  # the smoother passes PT with Pc
    L = _cat_time_end(Pc, PT, 2)
    Ep, G, unfold, Lp = fold_columns(E, g, L)
    (packed,) = associative_scan(
        _combine_affine_cov, [torch.cat([Ep, Lp, G], -1)], [2], reverse=True
    )
    return unfold(packed[..., 2 * S :]), unfold.restore(sym(packed[..., S : 2 * S]))


def _cat_time_end(rest: Tensor, last: Tensor, event_ndim: int = 1) -> Tensor:
    last = last.unsqueeze(-event_ndim - 1)
    ev = rest.shape[rest.dim() - event_ndim :]
    batch = broadcast_shapes(
        rest.shape[: rest.dim() - event_ndim - 1], last.shape[: last.dim() - event_ndim - 1]
    )
    n = rest.shape[-event_ndim - 1]
    return torch.cat(
        [rest.expand(batch + (n,) + ev), last.expand(batch + (1,) + ev)], -event_ndim - 1
    )
