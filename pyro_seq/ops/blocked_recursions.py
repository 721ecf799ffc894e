r"""Linear recursions y_t = F_t y_{t-1} + g_t over many steps and columns at once, in the
*blocked* time layout ``(F, k, nb, n)``: entry ``[:, j, b, i]`` is step t = b k + j of column
i (T padded to nb k). Used by the steady-state Kalman paths (:mod:`~pyro_seq.ops.kalman_blocked`,
:mod:`~pyro_seq.ops.kalman_stein`).

Tall, thin products (n T rows, a few columns) are several times slower with the steps as
rows than as columns, so the blocked layout is feature-first: a constant matrix acts on every
step with one product ``(F', F) @ (F, k nb n)``, and the j-th steps of all blocks, ``[:, j]``,
form one matrix ``(F, nb n)``.

* :func:`blocked_recursion`: constant F, in k - 1 products inside all blocks at once, the
  blocks joined by the same recursion with F^k over the block ends (O(log_k T) levels).
* :func:`varying_recursion`: time-varying F_t in time order, batched over blocks.
* :func:`piecewise_recursion`: rows in, rows out, F_t varying on a stretch at the start or
  the end and constant elsewhere (the steady-state filter and smoother means).
"""

from typing import Optional

import torch
from torch import Tensor

__all__ = [
    "BLOCK",
    "blocked_recursion",
    "blocks_to_steps",
    "from_blocks",
    "piecewise_blocked",
    "piecewise_recursion",
    "steps_to_blocks",
    "to_blocks",
    "varying_recursion",
]

#: Steps per block (k); the block-local solution costs k - 1 products.
BLOCK = 8

#: Recursions over at most this many steps run as a plain loop.
_LOOP_MAX = 16


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


def blocks_to_steps(y: Tensor, b0: int, b1: int) -> Tensor:
    """Blocks ``b0..b1-1`` of ``y (F, k, nb, n)`` in time order: ``((b1 - b0) k, F, n)``."""
    F, k, _, n = y.shape
    return y[:, :, b0:b1].permute(2, 1, 0, 3).reshape((b1 - b0) * k, F, n)


def steps_to_blocks(y: Tensor, h: Tensor, b0: int = 0) -> None:
    """Write ``h (m k, F, n)`` (time order) into blocks ``b0..b0+m-1`` of ``y (F, k, nb, n)``."""
    F, k, _, n = y.shape
    m = h.shape[0] // k
    y[:, :, b0 : b0 + m] = h.view(m, k, F, n).permute(2, 1, 0, 3)


def piecewise_blocked(
    varying: Tensor, y: Tensor, T: int, y0: Optional[Tensor] = None, at_end: bool = False
) -> Tensor:
    """:func:`piecewise_recursion` in place on the blocked layout: ``y (S, k, nb, n)`` holds
    g on entry and y on return, ``y0 (S, n)``, T the number of real steps."""
    S, k, nb, n = y.shape
    m = varying.shape[0]
    if not at_end:
        b0, b1 = 0, min(-(-m // k), nb)  # blocks with a varying step
        steps = torch.arange(b1 * k, device=y.device).clamp_(max=m - 1)
    else:
        b0, b1 = min((T - m) // k, nb), nb
        steps = (torch.arange(b0 * k, b1 * k, device=y.device) - (T - m)).clamp_(0, m - 1)
    start = y0
    if b0 > 0:  # a constant stretch first
        blocked_recursion(varying[0], y[:, :, :b0], start)
        start = y[:, k - 1, b0 - 1]
    part = blocks_to_steps(y, b0, b1)
    Fs = varying[steps]
    if start is not None:
        part[0].addmm_(Fs[0], start)
    varying_recursion(Fs.view(b1 - b0, k, S, S), part.view(b1 - b0, k, S, n))
    steps_to_blocks(y, part, b0)
    if b1 < nb:  # a constant stretch last
        blocked_recursion(varying[-1], y[:, :, b1:], part[-1])
    return y


def piecewise_recursion(
    varying: Tensor, g: Tensor, y0: Optional[Tensor] = None, at_end: bool = False
) -> Tensor:
    """y_t = F_t y_{t-1} + g_t (column form; y_{-1} = ``y0`` or 0) in row layout, for
    coefficients that vary on a stretch and are constant elsewhere: ``g (n, T, S)``,
    ``y0 (n, S)``, ``varying (m, S, S)``. With ``at_end=False`` F_t = ``varying[min(t,
    m - 1)]`` (the first m steps vary, the last entry repeats); with ``at_end=True``
    F_t = ``varying[t - (T - m)]`` for the last m steps and ``varying[0]`` before them.
    Returns ``(n, T, S)``.

    The data go to the blocked layout once (:func:`to_blocks`); the blocks holding varying
    steps run through :func:`varying_recursion`, the others through
    :func:`blocked_recursion` (:func:`piecewise_blocked`).
    """
    T = g.shape[1]
    y = piecewise_blocked(varying, to_blocks(g), T, None if y0 is None else y0.mT, at_end)
    return from_blocks(y, T)
