r"""The arguments of the linear-Gaussian state-space model (thesis Sec. 3.4, eqs. 3.4-3.7):
the parameter bundle, the argument checks and the canonical form the Kalman passes run on.

* :class:`LGSSMParams`: the parameters mu_{1|0}, Sigma_{1|0}, A_t, Q_t, C_t, R_t, B_t as the
  functions of :mod:`pyro_seq.ops.kalman` take them (``kalman_filter(x, **params._asdict())``).
* :func:`prepare`: checks, broadcasts and masks observations and parameters into a
  :class:`PreparedLGSSM` (time dimensions present, batch dimensions aligned, masked rows of
  C_t and R_t replaced as in thesis Sec. 3.4.2), the one input of the sequential
  (:mod:`~pyro_seq.ops.kalman_sequential`) and parallel (:mod:`~pyro_seq.ops.kalman_parallel`)
  passes and of their shared formulas (:mod:`~pyro_seq.ops.kalman_steps`).
* Checks (the rules of "Argument checks" in :mod:`pyro_seq.ops.kalman`): :func:`check_devices`,
  :func:`validate_parameters`, :func:`covariance_problem` and :func:`covariance_ok` (tolerances
  :data:`COV_TOL_EPS`), :func:`element_mask`, :func:`observed_finite`.
* Time layout (a time dimension of size T or 1 just left of the event dimensions):
  :func:`at_time`, :func:`slice_time`, :func:`cat_time`.
"""

import math
from typing import NamedTuple, Optional, overload

import torch
from torch import Tensor

from pyro_seq.ops.linalg import batch_index, broadcast_shapes
from pyro_seq.validation import all_finite, as_bool_mask, check_device

__all__ = [
    "COV_TOL_EPS",
    "LGSSMParams",
    "PreparedLGSSM",
    "at_time",
    "cat_time",
    "check_devices",
    "covariance_ok",
    "covariance_problem",
    "element_mask",
    "observed_finite",
    "prepare",
    "slice_time",
    "validate_parameters",
]


# ---------------------------------------------------------------------------------------
# Parameters and the prepared model
# ---------------------------------------------------------------------------------------


class LGSSMParams(NamedTuple):
    """The parameters of a linear-Gaussian state-space model (thesis eqs. 3.4-3.7), named and
    shaped as the functions of :mod:`pyro_seq.ops.kalman` take them.

    ``initial_loc (..., S)`` mu_{1|0}, ``initial_cov (..., S, S)`` Sigma_{1|0},
    ``transition_matrix (..., [T|1,] S, S)`` A_t and ``transition_cov`` Q_t (entry t is the
    transition into step t), ``observation_matrix (..., [T|1,] D, S)`` C_t,
    ``observation_cov (..., [T|1,] D, D)`` R_t, ``control_matrix (..., [T|1,] S, U)`` B_t or
    None (with ``controls`` given and B_t None, u_t is added to the state directly).
    ``params._asdict()`` gives the keyword arguments of those functions.
    """

    initial_loc: Tensor
    initial_cov: Tensor
    transition_matrix: Tensor
    transition_cov: Tensor
    observation_matrix: Tensor
    observation_cov: Tensor
    control_matrix: Optional[Tensor] = None


class PreparedLGSSM(NamedTuple):
    """The canonical form of a model and its observations that the Kalman passes run on
    (made by :func:`prepare`). Time dims are present (size T or 1); batch dims may differ
    in size but have equal length in every field (aligned with size-1 dims)."""

    x: Tensor  # (xb, T, D), zero where masked
    mask: Optional[Tensor]  # bool (mb, T, D) or None
    init_loc: Tensor  # (b, S)
    init_cov: Tensor  # (b, S, S)
    A: Tensor  # (b, Ta, S, S)
    Q: Tensor  # (b, Tq, S, S)
    b: Optional[Tensor]  # (b, Tb, S)
    C: Tensor  # (b, Tc, D, S), masked rows zero
    R: Tensor  # (b, Tr, D, D), masked rows/cols = unit vectors
    num_obs: Optional[Tensor]  # (mb, T) number of observed elements, None if unmasked
    batch_shape: torch.Size  # full broadcast batch shape
    param_batch_shape: torch.Size  # batch shape of parameters and mask (covariance pass)
    T: int
    S: int
    D: int


# ---------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------


def _with_time(p: Tensor, event_ndim: int, T: int, name: str) -> Tensor:
    if p.dim() == event_ndim:
        p = p.unsqueeze(0)
    size = p.shape[-event_ndim - 1]
    if size not in (1, T):
        raise ValueError(
            f"{name}: time dimension (just left of the {event_ndim} event dims) has size "
            f"{size}, expected 1 or T={T}; got shape {tuple(p.shape)}"
        )
    return p


def element_mask(mask: Tensor, T: int, D: int, x_batch: Optional[torch.Size] = None) -> Tensor:
    """Convert a per-step ``(..., T)`` or per-element ``(..., T, D|1)`` mask to ``(..., T, D)``.

    A mask whose last two dims are ``(T, D)`` is per element. Non-boolean masks must hold
    exactly 0 and 1 (a cast would read 0.5 as observed). With ``T == D`` a per-step mask
    ``(*x_batch, T)`` of a batch whose last dim is ``T`` has the shape of a per-element one: that
    case is refused (pass ``(..., T, 1)`` or the expanded ``(..., T, D)`` mask).
    """
    mask = as_bool_mask(mask)
    elementwise = mask.dim() >= 2 and mask.shape[-2] == T
    if elementwise and mask.shape[-1] == D:
        step_batch = tuple(mask.shape[:-1])
        if (
            T == D
            and x_batch is not None
            and 0 < len(step_batch) <= len(x_batch)
            and tuple(x_batch[len(x_batch) - len(step_batch) :]) == step_batch
        ):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} is ambiguous: with T == D == {T} and "
                f"observations of batch shape {tuple(x_batch)} it reads both as a per-step mask "
                "(..., T) and as a per-element mask (..., T, D); pass a per-step mask as "
                "mask[..., None] (shape (..., T, 1)) or a per-element mask expanded to the "
                "observations' full shape (..., T, D)"
            )
        return mask
    if elementwise and mask.shape[-1] == 1 and T != 1:
        return mask.expand(mask.shape[:-1] + (D,))
    if mask.shape[-1:] != (T,):
        raise ValueError(f"mask must have shape (..., T) or (..., T, D); got {tuple(mask.shape)}")
    return mask.unsqueeze(-1).expand(mask.shape + (D,))


def observed_finite(x: Tensor, mask: Optional[Tensor], nan_as_missing: bool) -> Optional[Tensor]:
    """The element mask ``(..., T, D)`` (or None: all observed) after checking that every
    observed entry of ``x`` is finite. One reduction over ``x`` when it is all finite.

    With ``nan_as_missing`` NaN entries become unobserved (combined with ``mask`` by "and");
    +inf/-inf at an observed position are refused in either case."""
    if all_finite(x):
        return mask
    nonfinite = ~torch.isfinite(x)
    observed = mask
    if nan_as_missing:
        seen = ~torch.isnan(x)
        observed = seen if mask is None else mask & seen
    bad = nonfinite if observed is None else nonfinite & observed
    if bool(bad.any()):
        idx = tuple(bad.nonzero()[0].tolist())
        value = float(x.detach().expand(bad.shape)[idx])
        if math.isnan(value):
            raise ValueError(
                f"observations contain NaN at an observed position (first at index {idx}); "
                "mark missing entries with the `mask` argument (bool, True = observed) or pass "
                "nan_as_missing=True to treat every NaN as missing"
            )
        raise ValueError(
            f"observations contain {value} at an observed position (first at index {idx}); "
            "+inf/-inf are not valid observations (nan_as_missing=True does not cover them): "
            "mark the entry missing with the `mask` argument (bool, True = observed)"
        )
    return observed


#: Tolerance, in machine epsilons of the dtype, of the covariance checks under ``validate_args``
#: (:func:`covariance_problem`): symmetric means ``max |M - M^T| <= COV_TOL_EPS eps max |M|``;
#: positive semi-definite means ``M + COV_TOL_EPS eps max |M| I`` has a Cholesky factor, i.e. no
#: eigenvalue below about ``-COV_TOL_EPS eps max |M|`` (rounding of a singular PSD matrix).
COV_TOL_EPS = 1000.0


def covariance_ok(M: Tensor, definite: bool) -> Tensor:
    """Per-matrix bool ``(...)``: ``M (..., n, n)`` finite, symmetric and positive (semi-)definite
    to the tolerances of :data:`COV_TOL_EPS`. Never symmetrises."""
    Md = M.detach()
    n = M.shape[-1]
    eye = torch.eye(n, dtype=M.dtype, device=M.device)
    finite = torch.isfinite(Md).all(-1).all(-1)
    Md = torch.where(finite[..., None, None], Md, eye)
    tol = COV_TOL_EPS * torch.finfo(M.dtype).eps
    scale = Md.abs().amax((-2, -1))
    symmetric = (Md - Md.mT).abs().amax((-2, -1)) <= tol * scale
    if not definite:
        jitter = tol * torch.where(scale > 0, scale, torch.ones_like(scale))
        Md = Md + jitter[..., None, None] * eye
    return finite & symmetric & (torch.linalg.cholesky_ex(Md).info == 0)


def covariance_problem(M: Tensor, definite: bool) -> Optional[str]:
    """Why ``M (..., n, n)`` is not a valid covariance (the package's one covariance check), or
    None. ``definite``: positive definite (an observation covariance); otherwise positive
    semi-definite (a singular process noise or initial covariance is legitimate). Tolerances:
    :data:`~pyro_seq.ops.lgssm.COV_TOL_EPS`. The message names the first offending matrix of a
    batch.
    """
    Md = M.detach()
    finite = torch.isfinite(Md).all(-1).all(-1)
    if not bool(finite.all()):
        return f"contains NaN or inf{batch_index(~finite)}"
    tol = COV_TOL_EPS * torch.finfo(M.dtype).eps
    asym = (Md - Md.mT).abs().amax((-2, -1))
    bound = tol * Md.abs().amax((-2, -1))
    bad = asym > bound
    if bool(bad.any()):
        i = tuple(bad.nonzero()[0]) if bad.dim() else ()
        return (
            f"is not symmetric{batch_index(bad)}: max |M - M^T| = {float(asym[i]):.3g} exceeds "
            f"{float(bound[i]):.3g} (= {COV_TOL_EPS:g} eps x max |M|); covariances are not "
            "symmetrised for you, pass 0.5 * (M + M.mT) if the asymmetry is rounding"
        )
    bad = ~covariance_ok(M, definite)
    if not bool(bad.any()):
        return None
    i = tuple(bad.nonzero()[0]) if bad.dim() else ()
    lam_min = float(torch.linalg.eigvalsh(Md[i]).min())
    kind = "definite" if definite else "semi-definite"
    return (
        f"is not positive {kind}{batch_index(bad)} (Cholesky failed; smallest eigenvalue "
        f"{lam_min:.3g})"
    )


def check_devices(*named):
    """Every tensor among the ``(name, tensor)`` pairs on the device of the first one (None
    entries are skipped): a ``ValueError`` naming the argument and both devices, rather than a
    silent copy or a RuntimeError deep inside a recursion."""
    ref_name = ref = None
    for name, t in named:
        if not torch.is_tensor(t):
            continue
        if ref is None:
            ref_name, ref = name, t.device
        else:
            check_device(name, t, ref, f"{ref_name} is")


def validate_parameters(initial_loc, initial_cov, A, Q, C, R, control_matrix, controls, *extra):
    """``validate_args`` checks (outside all loops; one host synchronisation when they pass):
    every tensor on the device of ``initial_loc`` (:func:`check_devices`); all parameters
    finite; ``initial_cov``, ``transition_cov`` symmetric and positive *semi*-definite (a
    singular Q, e.g. noise on the velocity only, is legitimate); ``observation_cov`` symmetric
    and positive definite (:func:`covariance_problem`, tolerances :data:`COV_TOL_EPS`; nothing
    is symmetrised silently). ``extra``: more ``(name, tensor)`` pairs that must be finite."""
    check_devices(
        ("initial_loc", initial_loc),
        ("initial_cov", initial_cov),
        ("transition_matrix", A),
        ("transition_cov", Q),
        ("observation_matrix", C),
        ("observation_cov", R),
        ("control_matrix", control_matrix),
        ("controls", controls),
        *extra,
    )
    finite = [
        (n, p)
        for n, p in (
            ("initial_loc", initial_loc),
            ("transition_matrix", A),
            ("observation_matrix", C),
            ("control_matrix", control_matrix),
            ("controls", controls),
        )
        + tuple(extra)
        if p is not None
    ]
    covs = [
        (n, M, d)
        for n, M, d in (
            ("initial_cov", initial_cov, False),
            ("transition_cov", Q, False),
            ("observation_cov", R, True),
        )
        if M is not None
    ]
    checks = [torch.isfinite(p).all() for _, p in finite]
    checks += [covariance_ok(M, definite).all() for _, M, definite in covs]
    if bool(torch.stack(checks).all()):
        return
    for (name, _p), ok in zip(finite, checks):
        if not bool(ok):
            raise ValueError(f"{name} contains NaN or inf")
    for name, M, definite in covs:
        problem = covariance_problem(M, definite)
        if problem is not None:
            raise ValueError(f"{name} {problem}")


# ---------------------------------------------------------------------------------------
# Preparation
# ---------------------------------------------------------------------------------------


@overload
def _pad_batch(p: Tensor, event_ndim: int, ndim: int) -> Tensor: ...


@overload
def _pad_batch(p: Optional[Tensor], event_ndim: int, ndim: int) -> Optional[Tensor]: ...


def _pad_batch(p: Optional[Tensor], event_ndim: int, ndim: int) -> Optional[Tensor]:
    if p is None:
        return None
    missing = ndim - (p.dim() - event_ndim)
    return p.reshape((1,) * missing + p.shape) if missing > 0 else p


def prepare(
    observations: Tensor,
    params: LGSSMParams,
    controls: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    nan_as_missing: bool = False,
    validate_args: bool = False,
) -> PreparedLGSSM:
    """Check, broadcast and mask the arguments of the Kalman functions (their shapes and
    rules: module docstring of :mod:`pyro_seq.ops.kalman`) into a :class:`PreparedLGSSM`.

    Masked elements (``mask``, and NaN entries with ``nan_as_missing``) get zero rows of C_t,
    unit rows and columns of R_t and zero residuals (thesis Sec. 3.4.2); ``controls`` u_t
    become the state offsets b_t = B_t u_t. ``validate_args``: run
    :func:`validate_parameters` (the callers resolve None, see
    :func:`pyro_seq.ops.kalman.kalman_filter`). ``ValueError`` for T = 0, a tensor on another
    device, shapes that do not fit, a non-finite observed entry or an invalid parameter.
    """
    (
        initial_loc,
        initial_cov,
        transition_matrix,
        transition_cov,
        observation_matrix,
        observation_cov,
        control_matrix,
    ) = params
    x = observations
    check_devices(
        ("initial_loc", initial_loc),
        ("initial_cov", initial_cov),
        ("transition_matrix", transition_matrix),
        ("transition_cov", transition_cov),
        ("observation_matrix", observation_matrix),
        ("observation_cov", observation_cov),
        ("control_matrix", control_matrix),
        ("controls", controls),
        ("observations", observations),
        ("mask", mask),
    )
    if x.dim() < 2:
        raise ValueError(f"observations must have shape (..., T, D); got {tuple(x.shape)}")
    T, D = x.shape[-2:]
    if T == 0:
        raise ValueError(
            f"observations have T = 0 time steps (shape {tuple(x.shape)}); the Kalman filter, "
            "smoother and samplers need T >= 1"
        )
    S = initial_loc.shape[-1]
    if initial_cov.shape[-2:] != (S, S):
        raise ValueError(f"initial_cov must end in ({S}, {S}); got {tuple(initial_cov.shape)}")
    A = _with_time(transition_matrix, 2, T, "transition_matrix")
    Q = _with_time(transition_cov, 2, T, "transition_cov")
    C = _with_time(observation_matrix, 2, T, "observation_matrix")
    R = _with_time(observation_cov, 2, T, "observation_cov")
    if A.shape[-2:] != (S, S) or Q.shape[-2:] != (S, S):
        raise ValueError("transition_matrix and transition_cov must end in (S, S)")
    if C.shape[-2:] != (D, S):
        raise ValueError(f"observation_matrix must end in ({D}, {S}); got {tuple(C.shape)}")
    if R.shape[-2:] != (D, D):
        raise ValueError(f"observation_cov must end in ({D}, {D}); got {tuple(R.shape)}")
    if validate_args:
        validate_parameters(initial_loc, initial_cov, A, Q, C, R, control_matrix, controls)
    b = None
    if controls is not None:
        u = controls
        if u.dim() < 2 or u.shape[-2] not in (1, T):
            raise ValueError(f"controls must have shape (..., T, U); got {tuple(u.shape)}")
        if control_matrix is None:
            if u.shape[-1] != S:
                raise ValueError("controls without control_matrix are state offsets (..., T, S)")
            b = u
        else:
            Bm = _with_time(control_matrix, 2, T, "control_matrix")
            if Bm.shape[-2] != S or Bm.shape[-1] != u.shape[-1]:
                raise ValueError(f"control_matrix must end in ({S}, U={u.shape[-1]})")
            b = (Bm @ u.unsqueeze(-1)).squeeze(-1)
    elif control_matrix is not None:
        raise ValueError("control_matrix given without controls")

    m = None if mask is None else element_mask(mask, T, D, x.shape[:-2])
    m = observed_finite(x, m, nan_as_missing)
    num_obs = None
    if m is not None:
        num_obs = m.sum(-1).to(x.dtype)
        C = C * m.unsqueeze(-1).to(C.dtype)
        pair = m.unsqueeze(-1) & m.unsqueeze(-2)
        eye = torch.eye(D, dtype=R.dtype, device=R.device)
        R = torch.where(pair, R, eye)
        # where, not a product: a NaN placeholder must reach neither values nor gradients
        x = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))

    param_batch = broadcast_shapes(
        initial_loc.shape[:-1],
        initial_cov.shape[:-2],
        A.shape[:-3],
        Q.shape[:-3],
        C.shape[:-3],
        R.shape[:-3],
        b.shape[:-2] if b is not None else (),
        m.shape[:-2] if m is not None else (),
    )
    batch = broadcast_shapes(param_batch, x.shape[:-2])
    n = len(batch)
    return PreparedLGSSM(
        x=_pad_batch(x, 2, n),
        mask=_pad_batch(m, 2, n),
        init_loc=_pad_batch(initial_loc, 1, n),
        init_cov=_pad_batch(initial_cov, 2, n),
        A=_pad_batch(A, 3, n),
        Q=_pad_batch(Q, 3, n),
        b=_pad_batch(b, 2, n),
        C=_pad_batch(C, 3, n),
        R=_pad_batch(R, 3, n),
        num_obs=_pad_batch(num_obs, 1, n),
        batch_shape=batch,
        param_batch_shape=param_batch,
        T=T,
        S=S,
        D=D,
    )


# ---------------------------------------------------------------------------------------
# Time layout
# ---------------------------------------------------------------------------------------


def at_time(p: Tensor, t, event_ndim: int) -> Tensor:
    """Entry t of the time dimension of p (size T or 1)."""
    dim = p.dim() - event_ndim - 1
    return p.select(dim, t if p.shape[dim] > 1 else 0)


def slice_time(p: Tensor, start: int, stop: Optional[int], event_ndim: int) -> Tensor:
    """p[..., start:stop, <event>] along time, leaving a size-1 time dim untouched."""
    dim = p.dim() - event_ndim - 1
    if p.shape[dim] == 1:
        return p
    return p.narrow(dim, start, (stop if stop is not None else p.shape[dim]) - start)


def cat_time(first: Tensor, rest: Tensor, event_ndim: int, T: int) -> Tensor:
    """Concatenate a time-1 ``first`` and a time-(T-1 or 1) ``rest`` into a time-T tensor,
    broadcasting their batch dimensions."""
    ev = first.shape[first.dim() - event_ndim :]
    batch = broadcast_shapes(
        first.shape[: first.dim() - event_ndim - 1], rest.shape[: rest.dim() - event_ndim - 1]
    )
    return torch.cat(
        [first.expand(batch + (1,) + ev), rest.expand(batch + (T - 1,) + ev)], dim=-event_ndim - 1
    )
