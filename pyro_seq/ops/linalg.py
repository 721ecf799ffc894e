r"""Batched linear algebra of the Kalman ops (:mod:`pyro_seq.ops.kalman` and its passes,
:mod:`pyro_seq.ops.nonlinear`). Pure torch, no Pyro state.

* Products: :func:`sym` (exact symmetrisation), :func:`mv` and :func:`trsv` (matrix-vector
  products and triangular solves that fold the data batch into matrix columns, so parameters
  shared by a batch of sequences are never expanded and copied over it), :func:`fold_columns`
  (the same folding for a whole time series), :func:`fused_addmm` and :func:`step_addmm`
  (``bias + X @ Y`` in one ``addmm`` / ``baddbmm`` kernel where the shapes allow it).
* Factorisations: :func:`checked_cholesky` (a ``ValueError`` instead of NaN),
  :func:`jitter_cholesky` (positive *semi*-definite matrices such as a zero process noise,
  with a growing diagonal jitter), :func:`psd_cholesky` and :func:`psd_solve` (solves with a
  positive semi-definite matrix that may be singular: its pseudo-inverse where it is
  rank-deficient to working precision, never an inverse of a singular matrix).
* Shapes and messages: :func:`broadcast_shapes`, :func:`repeat_last`, :func:`batch_index`.
"""

from typing import Optional

import torch
from torch import Tensor

__all__ = [
    "PSD_ROUNDING",
    "batch_index",
    "broadcast_shapes",
    "checked_cholesky",
    "fold_columns",
    "fused_addmm",
    "fused_kernel",
    "jitter_cholesky",
    "mv",
    "psd_cholesky",
    "psd_solve",
    "repeat_last",
    "rounding_scale",
    "step_addmm",
    "sym",
    "tri_solve_lower",
    "tri_solve_lower_transposed",
    "trsv",
]


# ---------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------


def broadcast_shapes(*shapes) -> torch.Size:
    """Plain-Python ``torch.broadcast_shapes`` (the torch version is slow for tiny calls)."""
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s, n - len(s)):
            if d != 1:
                if out[i] != 1 and out[i] != d:
                    raise ValueError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
                out[i] = d
    return torch.Size(out)


def repeat_last(x: Tensor, n: int, dim: int = 0, copy: bool = False) -> Tensor:
    """``x`` extended to ``n`` entries along ``dim`` by repeating its last entry (``x`` itself
    where it has n or more, unless ``copy``: then never an alias of ``x``)."""
    m = x.shape[dim]
    if m >= n:
        return x.clone() if copy else x
    shape = list(x.shape)
    shape[dim] = n - m
    return torch.cat([x, x.narrow(dim, m - 1, 1).expand(shape)], dim)


def batch_index(bad: Tensor) -> str:
    """The message suffix ``" at index (i, j)"`` (batch and time dims) of the first True entry
    of ``bad``, or ``""`` for a 0-dim ``bad``."""
    if bad.dim() == 0:
        return ""
    return f" at index {tuple(int(i) for i in bad.nonzero()[0])}"


# ---------------------------------------------------------------------------------------
# Products (the data batch folded into matrix columns)
# ---------------------------------------------------------------------------------------


def sym(M: Tensor) -> Tensor:
    """Exact symmetrisation ``(M + M^T) / 2`` of square matrices ``M (..., n, n)``."""
    return 0.5 * (M + M.mT)


def _fold(M: Tensor, v: Tensor, op):
    """Apply ``op(M', V')`` (a batched ``(..., n, k) x (..., k, c) -> (..., n, c)`` operation)
    to matrices M ``(mb..., n, k)`` and vectors v ``(vb..., k)``, returning ``(b..., n)``.

    Batch dims where M has size 1 and v does not (typically: data batch against shared
    parameters) are folded into the column dimension c, so M is never expanded and copied
    over the data batch; a batch of sequences costs one matrix-matrix product per matrix.
    """
    nb = max(M.dim() - 2, v.dim() - 1)
    M = M.reshape((1,) * (nb - (M.dim() - 2)) + M.shape)
    v = v.reshape((1,) * (nb - (v.dim() - 1)) + v.shape)
    data = [i for i in range(nb) if M.shape[i] == 1 and v.shape[i] > 1]
    if not data:
        return op(M, v.unsqueeze(-1)).squeeze(-1)
    keep = [i for i in range(nb) if M.shape[i] != 1 or v.shape[i] <= 1]
    sizes = tuple(v.shape[i] for i in data)
    vp = v.permute(keep + [nb] + data)
    vp = vp.reshape(vp.shape[: len(keep) + 1] + (-1,))
    Mp = M.reshape(tuple(M.shape[i] for i in keep) + M.shape[-2:])
    out = op(Mp, vp)
    out = out.reshape(out.shape[:-1] + sizes)
    order = keep + [nb] + data
    return out.permute([order.index(i) for i in range(nb + 1)])


def _matmul(M: Tensor, V: Tensor) -> Tensor:
    return M @ V


def mv(M: Tensor, v: Tensor) -> Tensor:
    """Batched matrix-vector product ``M (..., n, k) @ v (..., k) -> (..., n)``, with the batch
    dims where M has size 1 and v does not folded into matrix columns (M is never expanded)."""
    return _fold(M, v, _matmul)


def trsv(L: Tensor, v: Tensor) -> Tensor:
    """``L^{-1} v`` for lower-triangular L ``(..., n, n)`` and vectors v ``(..., n)``."""
    return _fold(L, v, tri_solve_lower)


def fold_columns(M: Tensor, v: Tensor, *others: Tensor):
    """Fold the batch dims where the matrices M ``(mb..., T, S, S)`` have size 1 but the
    vectors v ``(vb..., T, S)`` do not into columns: returns ``(M', V', unfold, *others')``
    with ``M' (kb..., T, S, S)``, ``V' (kb..., T, S, N)`` and
    ``unfold(V'') -> (b..., T, S)``; ``others`` (matrices batched like M) are reshaped as M."""
    nb = max([M.dim() - 3, v.dim() - 2] + [o.dim() - 3 for o in others])
    # others: a list of the reshaped matrices from here on
    M, *others = [m.reshape((1,) * (nb - (m.dim() - 3)) + m.shape) for m in (M, *others)]  # type: ignore[assignment]
    v = v.reshape((1,) * (nb - (v.dim() - 2)) + v.shape)
    data = [i for i in range(nb) if M.shape[i] == 1 and v.shape[i] > 1]
    if any(o.shape[i] != 1 for o in others for i in data):
        M = M.expand(broadcast_shapes(M.shape[:-3], *(o.shape[:-3] for o in others)) + M.shape[-3:])
        data = [i for i in range(nb) if M.shape[i] == 1 and v.shape[i] > 1]
    keep = [i for i in range(nb) if i not in data]
    sizes = tuple(v.shape[i] for i in data)
    kshape = tuple(max([M.shape[i], v.shape[i]] + [o.shape[i] for o in others]) for i in keep)

    def squeeze(m):
        m = m.reshape(tuple(m.shape[i] for i in keep) + m.shape[-3:])
        return m.expand(kshape + m.shape[-3:])

    vp = v.permute(keep + [nb, nb + 1] + data)
    vp = vp.expand(kshape + vp.shape[len(keep) :]).reshape(kshape + v.shape[-2:] + (-1,))
    order = keep + [nb, nb + 1] + data

    def unfold(V: Tensor) -> Tensor:
        V = V.reshape(V.shape[:-1] + sizes)
        return V.permute([order.index(i) for i in range(nb + 2)])

    def restore(m: Tensor) -> Tensor:  # (kb..., T, S, S) -> (nb dims with 1 at data dims)
        shape = tuple(1 if i in data else kshape[keep.index(i)] for i in range(nb))
        return m.reshape(shape + m.shape[-3:])

    unfold.restore = restore  # type: ignore[attr-defined]  # a function attribute
    return (squeeze(M), vp, unfold) + tuple(squeeze(o) for o in others)


def tri_solve_lower(L: Tensor, V: Tensor) -> Tensor:
    """``L^{-1} V`` for lower-triangular L ``(..., n, n)`` and V ``(..., n, k)`` (batch
    dims broadcast)."""
    if V.shape[:-2] != L.shape[:-2]:
        shape = broadcast_shapes(L.shape[:-2], V.shape[:-2])
        L, V = L.expand(shape + L.shape[-2:]), V.expand(shape + V.shape[-2:])
    return torch.linalg.solve_triangular(L, V, upper=False)


def tri_solve_lower_transposed(L: Tensor, V: Tensor) -> Tensor:
    """``L^{-T} V`` for lower-triangular L."""
    if V.shape[:-2] != L.shape[:-2]:
        shape = broadcast_shapes(L.shape[:-2], V.shape[:-2])
        L, V = L.expand(shape + L.shape[-2:]), V.expand(shape + V.shape[-2:])
    return torch.linalg.solve_triangular(L.mT, V, upper=True)


def fused_kernel(bias: Tensor, X: Tensor, Y: Tensor):
    """``torch.addmm`` or ``torch.baddbmm`` when they compute ``bias + X @ Y`` for these
    shapes without broadcasting, else None."""
    if X.dim() == 2 and Y.dim() == 2 and bias.dim() <= 2:
        return torch.addmm
    if (
        X.dim() == 3
        and Y.dim() == 3
        and bias.dim() == 3
        and bias.shape[0] == X.shape[0] == Y.shape[0]
    ):
        return torch.baddbmm
    return None


def fused_addmm(
    bias: Tensor, X: Tensor, Y: Tensor, beta: float = 1.0, alpha: float = 1.0
) -> Tensor:
    """``beta * bias + alpha * X @ Y`` in one fused kernel where the shapes allow it."""
    kernel = fused_kernel(bias, X, Y)
    if kernel is not None:
        return kernel(bias, X, Y, beta=beta, alpha=alpha)
    XY = X @ Y
    return (bias if beta == 1.0 else beta * bias) + (XY if alpha == 1.0 else alpha * XY)


def step_addmm(M: Tensor, V: Tensor):
    """The kernel for ``V_t + M_t @ v`` in a per-step loop (``v`` shaped like ``V_t``),
    chosen once for the loop: :func:`fused_kernel` where it applies, else :func:`fused_addmm`."""
    return fused_kernel(V, M, V) or fused_addmm


# ---------------------------------------------------------------------------------------
# Cholesky factors and solves with positive (semi-)definite matrices
# ---------------------------------------------------------------------------------------


def checked_cholesky(M: Tensor, what: str) -> Tensor:
    """Cholesky factor; a clear ``ValueError`` instead of NaN when M is not positive definite."""
    L, info = torch.linalg.cholesky_ex(M)
    if bool((info != 0).any()):
        raise ValueError(
            f"{what} is not positive definite (Cholesky failed); check the covariances for "
            "NaN/inf, negative eigenvalues or a condition number beyond the dtype's range"
        )
    return L


def jitter_cholesky(M: Tensor, what: str, hint: str = "") -> Tensor:
    """Cholesky factor of a symmetric positive semi-definite M (..., n, n), the one
    jitter-Cholesky of :mod:`pyro_seq.ops` (also used by :mod:`pyro_seq.ops.nonlinear`).

    Matrices where plain Cholesky fails are retried, alone, with M + eps 10^k max|diag M| I
    for k = 0..5; an exactly zero matrix gets L = 0. ``ValueError`` naming ``what`` (followed
    by ``hint``) if M has NaN/inf entries or is still not factorisable (not PSD).
    """
    L, info = torch.linalg.cholesky_ex(M)
    bad = info != 0
    if not bool(bad.any()):
        return L
    if not bool(torch.isfinite(M).all()):
        raise ValueError(f"{what} has non-finite entries (NaN/inf){hint}")
    n = M.shape[-1]
    eye = torch.eye(n, dtype=M.dtype, device=M.device)
    scale = M.diagonal(dim1=-2, dim2=-1).abs().amax(-1)
    zero = (M == 0).flatten(-2).all(-1)
    eps = torch.finfo(M.dtype).eps
    # the failed entries are replaced by I first, so that no NaN reaches values or gradients
    L = torch.linalg.cholesky(torch.where(bad[..., None, None], eye, M))
    remaining = bad & ~zero
    L = torch.where(zero[..., None, None], torch.zeros_like(L), L)
    for k in range(6):
        if not bool(remaining.any()):
            return L
        jitter = (eps * 10.0**k) * scale
        trial = torch.where(remaining[..., None, None], M + jitter[..., None, None] * eye, eye)
        Lk, infok = torch.linalg.cholesky_ex(trial)
        ok = remaining & (infok == 0)
        L = torch.where(ok[..., None, None], Lk, L)
        remaining = remaining & ~ok
    if bool(remaining.any()):
        raise ValueError(
            f"{what} is not positive semi-definite (Cholesky failed even with a jitter of "
            f"1e5 eps times its largest diagonal entry){hint}"
        )
    return L


def rounding_scale(predicted_covs: Tensor) -> Tensor:
    """Largest entry of Sigma_{s|s-1} over s <= t, per step: (..., T, n, n) -> (..., T).

    A computed Sigma_{t|t-1} carries rounding of the largest covariance it descends from (a
    filtered covariance is the Schur complement P - W^T W of its prior P), which can be far
    above eps times its own size: a rank-one prior 1e4 v v^T leaves entries of ~1e4 eps
    where the exact Sigma_{t+1|t} is singular and of size 1e-2."""
    m = predicted_covs.detach().abs().amax((-2, -1))
    return torch.cummax(m, dim=-1).values


#: A rank-deficient matrix that must be PSD is refused when its smallest eigenvalue is below
#: ``-PSD_ROUNDING`` times its largest: far beyond rounding even of a computed Schur complement.
PSD_ROUNDING = 1e-6


def psd_cholesky(P: Tensor, what: str, scale: Optional[Tensor] = None):
    """Cholesky factors of symmetric PSD matrices P (..., n, n) that may be singular.

    Returns ``(L, deficient)``. ``deficient`` (bool ``(...)``) marks the matrices that are
    rank-deficient to working precision: Cholesky fails or a pivot l_ii^2 is at most
    10 n eps max(max_i P_ii, scale) (the size of its rounding error; ``scale`` (...), the
    magnitude P was computed from, see :func:`rounding_scale`); it is None when there are
    none (the common case, which costs one Cholesky and one reduction). L is the Cholesky
    factor of P where not deficient and of I where deficient.
    """
    L, info = torch.linalg.cholesky_ex(P)
    n = P.shape[-1]
    tol = 10.0 * n * torch.finfo(P.dtype).eps
    d2 = L.diagonal(dim1=-2, dim2=-1).detach().pow(2).amin(-1)
    size = P.detach().diagonal(dim1=-2, dim2=-1).amax(-1)
    if scale is not None:
        size = torch.maximum(size, scale)
    deficient = (info != 0) | ~(d2 > tol * size)
    if not bool(deficient.any()):
        return L, None
    if not bool(torch.isfinite(P).all()):
        raise ValueError(f"{what} has non-finite entries (NaN/inf)")
    eye = torch.eye(n, dtype=P.dtype, device=P.device)
    return torch.linalg.cholesky(torch.where(deficient[..., None, None], eye, P)), deficient


def psd_solve(
    P: Tensor, X: Tensor, what: str, factor=None, scale: Optional[Tensor] = None
) -> Tensor:
    """Y = P^+ X for symmetric positive semi-definite P (..., n, n), X (..., n, k).

    When range(X) lies in range(P), as for the RTS gain system
    Sigma_{t+1|t} J_t^T = A_{t+1} Sigma_t (a null vector v of Sigma_{t+1|t} has
    v^T A Sigma A^T v = 0, hence Sigma A^T v = 0), this is the minimum-norm exact solution;
    the component of J_t on the null space is immaterial since the smoothed increments
    z_{t+1} - mu_{t+1|t} lie in range(Sigma_{t+1|t}). Positive definite P: ``cholesky_solve``.
    Rank-deficient P (see :func:`psd_cholesky`): the pseudo-inverse by the symmetric
    eigendecomposition, eigenvalues below 10 n eps of the largest treated as 0 (its gradient
    is the constant-rank pseudo-inverse derivative, finite); a singular P is never
    inverted; ``scale`` as for :func:`psd_cholesky` (eigenvalues up to 10 n eps scale are
    rounding too). ``factor``: the result of ``psd_cholesky(P, what, scale)`` when already
    computed.
    Eigenvalues within 10 times the size of the most negative one of 0 are rounding and are
    treated as 0 (see the comment in the code). ``ValueError`` naming the batch index if P is
    not PSD (an eigenvalue below -1e-6 times the largest)."""
    L, deficient = factor if factor is not None else psd_cholesky(P, what, scale)
    if X.shape[:-2] != L.shape[:-2]:
        shape = broadcast_shapes(X.shape[:-2], L.shape[:-2])
        X, L = X.expand(shape + X.shape[-2:]), L.expand(shape + L.shape[-2:])
        if deficient is not None:
            P, deficient = P.expand(shape + P.shape[-2:]), deficient.expand(shape)
            if scale is not None:
                scale = scale.expand(shape)
    Y = torch.cholesky_solve(X, L)
    if deficient is None:
        return Y
    n = P.shape[-1]
    tol = 10.0 * n * torch.finfo(P.dtype).eps
    Pd = torch.where(deficient[..., None, None], P, torch.eye(n, dtype=P.dtype, device=P.device))
    w = torch.linalg.eigvalsh(Pd.detach())
    top = w[..., -1].abs().clamp_min(torch.finfo(P.dtype).tiny)
    bad = w[..., 0] < -PSD_ROUNDING * top
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{what} is not positive semi-definite{batch_index(bad)} (smallest eigenvalue "
            f"{float(w[first][0]):.3g}, largest {float(w[first][-1]):.3g}); check the covariances"
        )
    # A computed Sigma_{t+1|t} carries rounding of the scale it was computed from (e.g. a
    # Schur complement of a much larger prior covariance), which can exceed tol times its own
    # largest eigenvalue: its negative eigenvalues measure that rounding, so every eigenvalue
    # within 10 times their size of 0 is treated as 0 (never inverted, whatever its sign).
    noise = (-w[..., 0]).clamp_min(0.0)
    rtol = torch.maximum(torch.full_like(top, tol), 10.0 * noise / top)
    if scale is not None:
        rtol = torch.maximum(rtol, tol * scale / top)
    Yp = torch.linalg.pinv(Pd, rtol=rtol, hermitian=True) @ X
    return torch.where(deficient[..., None, None], Yp, Y)
