r"""Exact inference in linear-Gaussian state-space models (thesis Sec. 3.4, eqs. 3.4-3.12).

Pure torch, no Pyro state. The model (column vectors, thesis eqs. 3.4-3.7)::

    z_1 ~ N(mu_{1|0}, Sigma_{1|0})
    z_t = A_t z_{t-1} + B_t u_t + eps_t,   eps_t   ~ N(0, Q_t)      t = 2..T   (3.4, 3.6)
    x_t = C_t z_t + delta_t,               delta_t ~ N(0, R_t)      t = 1..T   (3.5, 3.7)

Public API (stable; other modules such as EM build on these names)
-------------------------------------------------------------------
All functions take the same leading arguments, written ``*model`` below::

    observations,        # (..., T, D)      x_{1:T}; entries at masked positions are ignored (may be NaN)
    initial_loc,         # (..., S)         mu_{1|0}
    initial_cov,         # (..., S, S)      Sigma_{1|0}
    transition_matrix,   # (..., [T|1,] S, S)   A_t   (entry t is the transition INTO step t; entry 0 unused)
    transition_cov,      # (..., [T|1,] S, S)   Q_t   (same indexing as A_t)
    observation_matrix,  # (..., [T|1,] D, S)   C_t
    observation_cov,     # (..., [T|1,] D, D)   R_t
    control_matrix=None, # (..., [T|1,] S, U)   B_t   (None with ``controls`` given: B_t = I, u_t is an offset)
    controls=None,       # (..., T, U)          u_t   (entry 0 unused, like A_t)
    mask=None,           # bool (..., T) per step or (..., T, D) per element; True = observed

and, keyword-only, ``nan_as_missing=False``, ``steady_state_tol=STEADY_STATE_TOL`` (not for
``lgssm_sample``) and ``validate_args=None`` (see "Argument checks" below).

Shapes align from the right as in Pyro's ``GaussianHMM``: for a matrix parameter the
dimension just left of the two matrix dimensions is time (size T or 1) when present, and
everything left of it is batch; a bare ``(S, S)`` matrix is constant in time and batch.
Batch dimensions of all arguments broadcast. A mask is read as per-element when its last
two dimensions are ``(T, D)`` (or ``(T, 1)`` with T > 1); otherwise it must end in ``T``
(per step). The only ambiguous shape, a per-step mask ``(..., T, T)`` with ``T == D``, is
read per element; write it as ``mask[..., None].expand(..., T, D)``.

``kalman_filter(*model, method="auto") -> KalmanFilterResult``
    fields ``means (..., T, S)`` mu_t, ``covs (..., T, S, S)`` Sigma_t (filtered, eq. 3.11),
    ``predicted_means (..., T, S)`` mu_{t|t-1}, ``predicted_covs (..., T, S, S)``
    Sigma_{t|t-1}, ``log_likelihoods (..., T)`` log p(x_t | x_{1:t-1}) (eq. 3.12; masked
    elements excluded, 0 for a fully masked step). ``log_likelihoods.sum(-1)`` is
    log p(x_{1:T}).
``kalman_smoother(*model, method="auto") -> KalmanSmootherResult``
    fields ``means (..., T, S)`` mu_{t|T}, ``covs (..., T, S, S)`` Sigma_{t|T} (RTS),
    ``cross_covs (..., T-1, S, S)`` entry t (0-based) = Cov(z_{t+1}, z_t | x_{1:T}),
    ``gains (..., T-1, S, S)`` J_t = Sigma_t A_{t+1}^T Sigma_{t+1|t}^{-1},
    ``filtered`` the :class:`KalmanFilterResult`.
``kalman_sample(*model, sample_shape=(), noise=None, method="auto") -> KalmanSampleResult``
    forward-filtering backward-sampling; fields ``samples (*sample_shape, ..., T, S)``
    reparameterized draws of z_{1:T} | x_{1:T}, ``filtered`` the filter result.
    ``noise`` (optional, standard normal of the samples' shape) fixes the randomness.

``lgssm_sample(initial_loc, ..., observation_cov, control_matrix=None, controls=None, num_steps=None, sample_shape=(), noise=None, method="auto") -> LGSSMSample``
    joint prior draws (eqs. 3.4-3.5); fields ``states (*sample_shape, ..., T, S)`` and
    ``observations (*sample_shape, ..., T, D)``.

``psd_sqrt(M) -> Tensor``: a Cholesky-like factor of a positive *semi*-definite matrix.

``method``: ``"sequential"`` (loop over time), ``"parallel"`` (associative scan of
depth O(log T), Sarkka & Garcia-Fernandez 2021, see :mod:`pyro_seq.ops.kalman_parallel`) or
``"auto"`` (parallel when ``T >= PARALLEL_THRESHOLD``, except on CPU with state dimension
``S >= PARALLEL_MAX_STATE_CPU``, where the scan's extra O(S^3) work outweighs its shorter
depth and the sequential form is faster). Both agree to rounding.

Numerics
--------
* Innovation covariances are factorised by Cholesky; no covariance is ever inverted.
  Sequential form: with L L^T = C P C^T + R and W = L^{-1} C P, the filtered covariance
  is the Schur complement ``P - W^T W`` (equal to the Joseph form for the optimal gain, at
  a third of its cost), the RTS gain J comes from ``cholesky_solve`` with the Cholesky
  factor of Sigma_{t+1|t}, and the smoothed covariances follow
  ``Sigma_{t|T} = (Sigma_t - J A Sigma_t) + J Sigma_{t+1|T} J^T``. A predicted covariance
  Sigma_{t+1|t} that is singular to working precision (singular Q with a singular A or
  initial covariance, e.g. a deterministic component; precision relative to the largest
  predicted covariance up to t + 1, whose rounding a Schur complement inherits) is never
  inverted: there J is the
  minimum-norm solution of J Sigma_{t+1|t} = Sigma_t A^T (pseudo-inverse on its range,
  exact since Sigma_t A^T vanishes on its null space; see ``_psd_solve``). Values are
  exact there; gradients of smoothed quantities along perturbations that change the rank
  (e.g. giving a known component a variance) are those of the constant-rank
  pseudo-inverse, not the one-sided derivative (log-likelihood gradients are unaffected:
  the filter needs no such solve). A noise-free *contracting* direction (``|eigenvalue of A|
  < 1``) whose filtered variance decays to rounding makes any RTS recursion ill-conditioned
  (errors grow like ``|a|^{-t}`` backwards); model such a component with a tiny noise instead. The parallel form builds
  its scan elements in Joseph form and combines them with the Sarkka & Garcia-Fernandez
  operator; FFBS uses the Joseph-form backward covariance
  ``(I-JA) Sigma (I-JA)^T + J Q J^T`` (PSD by construction, as sampling factors it). All
  returned covariances are exactly symmetric.
* A matrix that is not positive definite where it must be raises ``ValueError`` naming
  it instead of producing NaN. Tested finite and exact for covariance eigenvalues in
  [1e-6, 1e6] in float64; in float32 keep the condition number of the innovation and
  predicted covariances below ~1e5 (eigenvalues in about [1e-2, 1e3]).
* The covariance recursions do not depend on the data, so they run with the batch shape
  of the *parameters and mask* only; data-dependent work is a linear recursion in the
  means (mu_t = F_t mu_{t-1} + g_t), evaluated with the data batch folded into matrix
  columns. A batch of sequences sharing parameters therefore pays for one Riccati
  recursion.
* Steady state: with time-invariant parameters shared by the batch, no mask and no
  autograd, the Riccati recursion converges geometrically to a fixed point. Once the
  filtered covariance changes by at most ``STEADY_STATE_TOL`` machine epsilons (max-abs,
  relative to its largest entry) at two consecutive checks four steps apart, it has reached
  that fixed point to rounding and the remaining steps reuse it (the convergence test of
  statsmodels' Kalman filter, made relative). The backward RTS covariance recursion does
  the same over the stretch where its coefficients are exact repeats. The rounding noise
  of the full recursion is of the same order, so results agree with it to rounding. The
  tolerance is the keyword argument ``steady_state_tol`` of :func:`kalman_filter`,
  :func:`kalman_smoother` and :func:`kalman_sample` (default ``STEADY_STATE_TOL`` = 8);
  ``steady_state_tol=0`` always runs every step. Measured speed: ``benchmarks/kalman.py`` / ``benchmarks/results/kalman.json``.

Argument checks
---------------
* T = 0 raises ``ValueError``.
* Devices (always checked, no host synchronisation): every tensor argument must be on the
  device of ``initial_loc``; one elsewhere raises ``ValueError`` naming it and both devices
  (nothing is copied between devices for you).
* Observations: every observed entry must be finite (one reduction over ``observations``).
  NaN at an observed position raises ``ValueError`` naming the ``mask`` argument; +inf/-inf
  are refused likewise. ``nan_as_missing=True`` treats every NaN entry as an unobserved
  element (combined with ``mask`` by "and"; +inf/-inf are still refused); the mask then has
  the data's batch shape, so the covariance recursion runs per sequence.
* ``validate_args`` (default None: ``torch.distributions.Distribution._validate_args``, on
  unless disabled, e.g. by ``pyro.enable_validation(False)``): all parameters finite,
  ``initial_cov`` and ``transition_cov`` symmetric positive *semi*-definite (a singular Q,
  e.g. noise on a velocity only, or Q = 0, is accepted), ``observation_cov`` symmetric
  positive definite; symmetric means max|M - M^T| <= sqrt(eps) max|M|. Violations raise
  ``ValueError`` naming the argument; nothing is symmetrised silently. The checks cost a few
  reductions and one Cholesky per distinct covariance matrix, outside all loops.

Missing data (thesis Sec. 3.4.2)
--------------------------------
A masked element i of x_t is given zero weight by zeroing row i of C_t, replacing row and
column i of R_t by the unit vector e_i and setting the residual to 0. The innovation
covariance becomes block diagonal with a 1 for that element, so the gain column is zero
and its likelihood factor is the constant N(0; 0, 1), which is removed. This equals
deleting the rows of C_t and R_t (Durbin & Koopman 2012) without permuting anything; a
fully masked step propagates the prediction (mu_t = mu_{t|t-1}, Sigma_t = Sigma_{t|t-1}).
"""

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from pyro_seq.validation import as_bool_mask, check_device

__all__ = [
    "KalmanFilterResult",
    "KalmanSmootherResult",
    "KalmanSampleResult",
    "kalman_filter",
    "kalman_smoother",
    "kalman_sample",
    "LGSSMSample",
    "lgssm_sample",
    "PARALLEL_THRESHOLD",
    "STEADY_STATE_TOL",
    "psd_sqrt",
    "KalmanStep",
    "kalman_predict",
    "kalman_update",
]

#: ``method="auto"`` uses the parallel scan for sequences at least this long.
PARALLEL_THRESHOLD = 32

#: On CPU ``method="auto"`` stays sequential from this state dimension on: the scan's
#: O(S^3) combines cost several times the sequential flops, which dominate at large S.
PARALLEL_MAX_STATE_CPU = 16
#: Default of the ``steady_state_tol`` argument: the steady-state test of the sequential
#: covariance recursions, in machine epsilons (see Numerics in the module docstring); 0
#: disables it. Only the default value: pass the argument to change it per call.
STEADY_STATE_TOL = 8.0
#: Steps between two steady-state tests.
_STEADY_CHECK_EVERY = 4

_LOG_2PI = math.log(2 * math.pi)


class KalmanFilterResult(NamedTuple):
    """Filtered moments (thesis eq. 3.11) and per-step log-likelihood terms (eq. 3.12).

    ``means (..., T, S)``, ``covs (..., T, S, S)``: p(z_t | x_{1:t}) = N(means_t, covs_t).
    ``predicted_means (..., T, S)``, ``predicted_covs (..., T, S, S)``: p(z_t | x_{1:t-1})
    (entry 0 is the prior N(mu_{1|0}, Sigma_{1|0})).
    ``log_likelihoods (..., T)``: log p(x_t | x_{1:t-1}) over the observed elements.
    """

    means: Tensor
    covs: Tensor
    predicted_means: Tensor
    predicted_covs: Tensor
    log_likelihoods: Tensor


class KalmanSmootherResult(NamedTuple):
    """RTS-smoothed moments p(z_t | x_{1:T}) (thesis Sec. 3.4.1, smoothing).

    ``means (..., T, S)``, ``covs (..., T, S, S)``; ``cross_covs (..., T-1, S, S)`` with
    entry t = Cov(z_{t+1}, z_t | x_{1:T}) = covs_{t+1} J_t^T (needed by EM);
    ``gains (..., T-1, S, S)`` the smoother gains J_t; ``filtered`` the filter result.
    """

    means: Tensor
    covs: Tensor
    cross_covs: Tensor
    gains: Tensor
    filtered: KalmanFilterResult


class LGSSMSample(NamedTuple):
    """Joint draws from the LGSSM prior: ``states (*sample_shape, ..., T, S)`` z_{1:T} and
    ``observations (*sample_shape, ..., T, D)`` x_{1:T}."""

    states: Tensor
    observations: Tensor


class KalmanSampleResult(NamedTuple):
    """Forward-filtering backward-sampling output.

    ``samples (*sample_shape, ..., T, S)``: draws of z_{1:T} ~ p(z_{1:T} | x_{1:T}),
    differentiable in all parameters and observations (reparameterized).
    ``filtered``: the :class:`KalmanFilterResult` the draws were conditioned on.
    """

    samples: Tensor
    filtered: KalmanFilterResult


# ---------------------------------------------------------------------------------------
# Argument preparation
# ---------------------------------------------------------------------------------------


class _Model(NamedTuple):
    """Canonical internal form. Time dims are present (size T or 1); batch dims may differ
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


def _broadcast_shapes(*shapes) -> torch.Size:
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


def _element_mask(mask: Tensor, T: int, D: int, x_batch: Optional[torch.Size] = None) -> Tensor:
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
        if (T == D and x_batch is not None and 0 < len(step_batch) <= len(x_batch)
                and tuple(x_batch[len(x_batch) - len(step_batch):]) == step_batch):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} is ambiguous: with T == D == {T} and "
                f"observations of batch shape {tuple(x_batch)} it reads both as a per-step mask "
                "(..., T) and as a per-element mask (..., T, D); pass a per-step mask as "
                "mask[..., None] (shape (..., T, 1)) or a per-element mask expanded to the "
                "observations' full shape (..., T, D)")
        return mask
    if elementwise and mask.shape[-1] == 1 and T != 1:
        return mask.expand(mask.shape[:-1] + (D,))
    if mask.shape[-1:] != (T,):
        raise ValueError(f"mask must have shape (..., T) or (..., T, D); got {tuple(mask.shape)}")
    return mask.unsqueeze(-1).expand(mask.shape + (D,))


def _observed_finite(x: Tensor, mask: Optional[Tensor], nan_as_missing: bool) -> Optional[Tensor]:
    """The element mask ``(..., T, D)`` (or None: all observed) after checking that every
    observed entry of ``x`` is finite. One reduction over ``x`` when it is all finite.

    With ``nan_as_missing`` NaN entries become unobserved (combined with ``mask`` by "and");
    +inf/-inf at an observed position are refused in either case."""
    if bool(torch.isfinite(x).all()):
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


def _covariance_ok(M: Tensor, definite: bool) -> Tensor:
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


def _batch_index(bad: Tensor) -> str:
    """`` at index (i, j)`` (batch and time dims) of the first True entry of ``bad``, or ''."""
    if bad.dim() == 0:
        return ""
    return f" at index {tuple(int(i) for i in bad.nonzero()[0])}"


def covariance_problem(M: Tensor, definite: bool) -> Optional[str]:
    """Why ``M (..., n, n)`` is not a valid covariance (the package's one covariance check), or
    None. ``definite``: positive definite (an observation covariance); otherwise positive
    semi-definite (a singular process noise or initial covariance is legitimate). Tolerances:
    :data:`COV_TOL_EPS`. The message names the first offending matrix of a batch.
    """
    Md = M.detach()
    finite = torch.isfinite(Md).all(-1).all(-1)
    if not bool(finite.all()):
        return f"contains NaN or inf{_batch_index(~finite)}"
    tol = COV_TOL_EPS * torch.finfo(M.dtype).eps
    asym = (Md - Md.mT).abs().amax((-2, -1))
    bound = tol * Md.abs().amax((-2, -1))
    bad = asym > bound
    if bool(bad.any()):
        i = tuple(bad.nonzero()[0]) if bad.dim() else ()
        return (f"is not symmetric{_batch_index(bad)}: max |M - M^T| = {float(asym[i]):.3g} exceeds "
                f"{float(bound[i]):.3g} (= {COV_TOL_EPS:g} eps x max |M|); covariances are not "
                "symmetrised for you, pass 0.5 * (M + M.mT) if the asymmetry is rounding")
    bad = ~_covariance_ok(M, definite)
    if not bool(bad.any()):
        return None
    i = tuple(bad.nonzero()[0]) if bad.dim() else ()
    lam_min = float(torch.linalg.eigvalsh(Md[i]).min())
    kind = "definite" if definite else "semi-definite"
    return (f"is not positive {kind}{_batch_index(bad)} (Cholesky failed; smallest eigenvalue "
            f"{lam_min:.3g})")


def _check_devices(*named):
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


def _validate_parameters(initial_loc, initial_cov, A, Q, C, R, control_matrix, controls, *extra):
    """``validate_args`` checks (outside all loops; one host synchronisation when they pass):
    every tensor on the device of ``initial_loc`` (:func:`_check_devices`); all parameters finite; ``initial_cov``, ``transition_cov`` symmetric and positive
    *semi*-definite (a singular Q, e.g. noise on the velocity only, is legitimate);
    ``observation_cov`` symmetric and positive definite (:func:`covariance_problem`, tolerances
    :data:`COV_TOL_EPS`; nothing is symmetrised silently). ``extra``: more ``(name, tensor)``
    pairs that must be finite."""
    _check_devices(("initial_loc", initial_loc), ("initial_cov", initial_cov),
                   ("transition_matrix", A), ("transition_cov", Q), ("observation_matrix", C),
                   ("observation_cov", R), ("control_matrix", control_matrix),
                   ("controls", controls), *extra)
    finite = [(n, p) for n, p in (("initial_loc", initial_loc), ("transition_matrix", A),
                                   ("observation_matrix", C), ("control_matrix", control_matrix),
                                   ("controls", controls)) + tuple(extra) if p is not None]
    covs = [(n, M, d) for n, M, d in (("initial_cov", initial_cov, False),
                                      ("transition_cov", Q, False),
                                      ("observation_cov", R, True)) if M is not None]
    checks = [torch.isfinite(p).all() for _, p in finite]
    checks += [_covariance_ok(M, definite).all() for _, M, definite in covs]
    if bool(torch.stack(checks).all()):
        return
    for (name, p), ok in zip(finite, checks):
        if not bool(ok):
            raise ValueError(f"{name} contains NaN or inf")
    for name, M, definite in covs:
        problem = covariance_problem(M, definite)
        if problem is not None:
            raise ValueError(f"{name} {problem}")


def _pad_batch(p: Optional[Tensor], event_ndim: int, ndim: int) -> Optional[Tensor]:
    if p is None:
        return None
    missing = ndim - (p.dim() - event_ndim)
    return p.reshape((1,) * missing + p.shape) if missing > 0 else p


def _prepare(
    observations,
    initial_loc,
    initial_cov,
    transition_matrix,
    transition_cov,
    observation_matrix,
    observation_cov,
    control_matrix=None,
    controls=None,
    mask=None,
    nan_as_missing: bool = False,
    validate_args: Optional[bool] = None,
) -> _Model:
    x = observations
    _check_devices(("initial_loc", initial_loc), ("initial_cov", initial_cov),
                   ("transition_matrix", transition_matrix), ("transition_cov", transition_cov),
                   ("observation_matrix", observation_matrix), ("observation_cov", observation_cov),
                   ("control_matrix", control_matrix), ("controls", controls),
                   ("observations", observations), ("mask", mask))
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
    if validate_args is None:
        validate_args = torch.distributions.Distribution._validate_args
    if validate_args:
        _validate_parameters(initial_loc, initial_cov, A, Q, C, R, control_matrix, controls)
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

    m = None if mask is None else _element_mask(mask, T, D, x.shape[:-2])
    m = _observed_finite(x, m, nan_as_missing)
    num_obs = None
    if m is not None:
        num_obs = m.sum(-1).to(x.dtype)
        C = C * m.unsqueeze(-1).to(C.dtype)
        pair = m.unsqueeze(-1) & m.unsqueeze(-2)
        eye = torch.eye(D, dtype=R.dtype, device=R.device)
        R = torch.where(pair, R, eye)
        # where, not a product: a NaN placeholder must reach neither values nor gradients
        x = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))

    param_batch = _broadcast_shapes(
        initial_loc.shape[:-1],
        initial_cov.shape[:-2],
        A.shape[:-3],
        Q.shape[:-3],
        C.shape[:-3],
        R.shape[:-3],
        b.shape[:-2] if b is not None else (),
        m.shape[:-2] if m is not None else (),
    )
    batch = _broadcast_shapes(param_batch, x.shape[:-2])
    n = len(batch)
    return _Model(
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
# Shared numerical kernels (used by both the sequential and the parallel forms)
# ---------------------------------------------------------------------------------------


def _sym(M: Tensor) -> Tensor:
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


def _fold_columns(M: Tensor, v: Tensor, *others: Tensor):
    """Fold the batch dims where the matrices M ``(mb..., T, S, S)`` have size 1 but the
    vectors v ``(vb..., T, S)`` do not into columns: returns ``(M', V', unfold, *others')``
    with ``M' (kb..., T, S, S)``, ``V' (kb..., T, S, N)`` and
    ``unfold(V'') -> (b..., T, S)``; ``others`` (matrices batched like M) are reshaped as M."""
    nb = max([M.dim() - 3, v.dim() - 2] + [o.dim() - 3 for o in others])
    M, *others = [m.reshape((1,) * (nb - (m.dim() - 3)) + m.shape) for m in (M, *others)]
    v = v.reshape((1,) * (nb - (v.dim() - 2)) + v.shape)
    data = [i for i in range(nb) if M.shape[i] == 1 and v.shape[i] > 1]
    if any(o.shape[i] != 1 for o in others for i in data):
        M = M.expand(_broadcast_shapes(M.shape[:-3], *(o.shape[:-3] for o in others))
                     + M.shape[-3:])
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

    unfold.restore = restore
    return (squeeze(M), vp, unfold) + tuple(squeeze(o) for o in others)


def _matmul(M: Tensor, V: Tensor) -> Tensor:
    return M @ V


def _mv(M: Tensor, v: Tensor) -> Tensor:
    """Batched matrix-vector product ``M (..., n, k) @ v (..., k) -> (..., n)`` (see _fold)."""
    return _fold(M, v, _matmul)


def _tri_solve_lower(L: Tensor, V: Tensor) -> Tensor:
    if V.shape[:-2] != L.shape[:-2]:
        shape = _broadcast_shapes(L.shape[:-2], V.shape[:-2])
        L, V = L.expand(shape + L.shape[-2:]), V.expand(shape + V.shape[-2:])
    return torch.linalg.solve_triangular(L, V, upper=False)


def _trsv(L: Tensor, v: Tensor) -> Tensor:
    """``L^{-1} v`` for lower-triangular L ``(..., n, n)`` and vectors v ``(..., n)``."""
    return _fold(L, v, _tri_solve_lower)


def _at(p: Tensor, t, event_ndim: int) -> Tensor:
    """Entry t of the time dimension of p (size T or 1)."""
    dim = p.dim() - event_ndim - 1
    return p.select(dim, t if p.shape[dim] > 1 else 0)


def _slice_time(p: Tensor, start: int, stop: Optional[int], event_ndim: int) -> Tensor:
    """p[..., start:stop, <event>] along time, leaving a size-1 time dim untouched."""
    dim = p.dim() - event_ndim - 1
    if p.shape[dim] == 1:
        return p
    return p.narrow(dim, start, (stop if stop is not None else p.shape[dim]) - start)


def _cholesky(M: Tensor, what: str) -> Tensor:
    """Cholesky factor; a clear ``ValueError`` instead of NaN when M is not positive definite."""
    L, info = torch.linalg.cholesky_ex(M)
    if bool((info != 0).any()):
        raise ValueError(
            f"{what} is not positive definite (Cholesky failed); check the covariances for "
            "NaN/inf, negative eigenvalues or a condition number beyond the dtype's range"
        )
    return L


def psd_sqrt(M: Tensor) -> Tensor:
    """A lower-triangular factor L with L L^T = M for positive *semi*-definite M (..., n, n).

    :func:`_jitter_cholesky`: Cholesky, with a growing diagonal jitter for the matrices where
    it fails (singular, e.g. a zero transition noise); an exactly zero matrix gets L = 0.
    Raises ``ValueError`` if M is not PSD or not finite. Used only for drawing samples,
    where the jitter (relative 1e-16..1e-11 in float64) is immaterial.
    """
    return _jitter_cholesky(M, "matrix")


def _jitter_cholesky(M: Tensor, what: str, hint: str = "") -> Tensor:
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


def _rounding_scale(predicted_covs: Tensor) -> Tensor:
    """Largest entry of Sigma_{s|s-1} over s <= t, per step: (..., T, n, n) -> (..., T).

    A computed Sigma_{t|t-1} carries rounding of the largest covariance it descends from (a
    filtered covariance is the Schur complement P - W^T W of its prior P), which can be far
    above eps times its own size: a rank-one prior 1e4 v v^T leaves entries of ~1e4 eps
    where the exact Sigma_{t+1|t} is singular and of size 1e-2."""
    m = predicted_covs.detach().abs().amax((-2, -1))
    return torch.cummax(m, dim=-1).values


def _psd_cholesky(P: Tensor, what: str, scale: Optional[Tensor] = None):
    """Cholesky factors of symmetric PSD matrices P (..., n, n) that may be singular.

    Returns ``(L, deficient)``. ``deficient`` (bool ``(...)``) marks the matrices that are
    rank-deficient to working precision: Cholesky fails or a pivot l_ii^2 is at most
    10 n eps max(max_i P_ii, scale) (the size of its rounding error; ``scale`` (...), the
    magnitude P was computed from, see :func:`_rounding_scale`); it is None when there are
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


def _psd_solve(P: Tensor, X: Tensor, what: str, factor=None,
               scale: Optional[Tensor] = None) -> Tensor:
    """Y = P^+ X for symmetric positive semi-definite P (..., n, n), X (..., n, k).

    When range(X) lies in range(P), as for the RTS gain system
    Sigma_{t+1|t} J_t^T = A_{t+1} Sigma_t (a null vector v of Sigma_{t+1|t} has
    v^T A Sigma A^T v = 0, hence Sigma A^T v = 0), this is the minimum-norm exact solution;
    the component of J_t on the null space is immaterial since the smoothed increments
    z_{t+1} - mu_{t+1|t} lie in range(Sigma_{t+1|t}). Positive definite P: ``cholesky_solve``.
    Rank-deficient P (see :func:`_psd_cholesky`): the pseudo-inverse by the symmetric
    eigendecomposition, eigenvalues below 10 n eps of the largest treated as 0 (its gradient
    is the constant-rank pseudo-inverse derivative, finite); a singular P is never
    inverted; ``scale`` as for :func:`_psd_cholesky` (eigenvalues up to 10 n eps scale are
    rounding too). ``factor``: the result of ``_psd_cholesky(P, what, scale)`` when already
    computed.
    Eigenvalues within 10 times the size of the most negative one of 0 are rounding and are
    treated as 0 (see the comment in the code). ``ValueError`` naming the batch index if P is
    not PSD (an eigenvalue below -1e-6 times the largest)."""
    L, deficient = factor if factor is not None else _psd_cholesky(P, what, scale)
    if X.shape[:-2] != L.shape[:-2]:
        shape = _broadcast_shapes(X.shape[:-2], L.shape[:-2])
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
    bad = w[..., 0] < -_PSD_ROUNDING * top
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{what} is not positive semi-definite{_batch_index(bad)} (smallest eigenvalue "
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


#: A rank-deficient matrix that must be PSD is refused when its smallest eigenvalue is below
#: ``-_PSD_ROUNDING`` times its largest: far beyond rounding even of a computed Schur complement.
_PSD_ROUNDING = 1e-6


def _gain(P: Tensor, C: Tensor, R: Tensor):
    """Cholesky factor L of the innovation covariance C P C^T + R (eq. 3.12) and the Kalman
    gain K = P C^T (C P C^T + R)^{-1} (by ``cholesky_solve``). P (..., S, S), C (..., D, S),
    R (..., D, D) -> L (..., D, D), K (..., S, D)."""
    CP = C @ P
    L = _cholesky(_sym(CP @ C.mT + R), "innovation covariance C P C^T + R")
    return L, torch.cholesky_solve(CP, L).mT


def _measurement_update(P: Tensor, C: Tensor, R: Tensor):
    """Measurement step of thesis Sec. 3.4.1 on covariances only.

    P (..., S, S) predicted Sigma_{t|t-1}; C (..., D, S); R (..., D, D).
    Returns ``(L, K, Sigma)``: L (..., D, D) Cholesky factor of the innovation covariance
    C P C^T + R (eq. 3.12), K (..., S, D) the Kalman gain P C^T (C P C^T + R)^{-1}, and the
    filtered covariance in Joseph form (I - K C) P (I - K C)^T + K R K^T.
    """
    L, K = _gain(P, C, R)
    IKC = torch.eye(P.shape[-1], dtype=P.dtype, device=P.device) - K @ C
    Sigma = IKC @ P @ IKC.mT + K @ R @ K.mT
    return L, K, _sym(Sigma)


def _mean_coefficients(mdl: _Model, K: Tensor):
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
    g = _mv(K, mdl.x)  # (b, T, S)
    C0, K0 = _at(mdl.C, 0, 2), _at(K, 0, 2)
    g0 = g[..., :1, :] + (mdl.init_loc - _mv(K0, _mv(C0, mdl.init_loc))).unsqueeze(-2)
    if T == 1:
        return F, g0
    g_rest = g[..., 1:, :]
    if mdl.b is not None:
        b = _slice_time(mdl.b, 1, None, 1)
        g_rest = g_rest + (b - _mv(_slice_time(K, 1, None, 2), _mv(_slice_time(mdl.C, 1, None, 2), b)))
    return F, _cat_time(g0, g_rest, 1, T)


def _cat_time(first: Tensor, rest: Tensor, event_ndim: int, T: int) -> Tensor:
    """Concatenate a time-1 ``first`` and a time-(T-1 or 1) ``rest`` into a time-T tensor,
    broadcasting their batch dimensions."""
    ev = first.shape[first.dim() - event_ndim :]
    batch = _broadcast_shapes(
        first.shape[: first.dim() - event_ndim - 1], rest.shape[: rest.dim() - event_ndim - 1]
    )
    return torch.cat(
        [first.expand(batch + (1,) + ev), rest.expand(batch + (T - 1,) + ev)], dim=-event_ndim - 1
    )


def _predicted_covs(mdl: _Model, covs: Tensor) -> Tensor:
    """Sigma_{t|t-1} = A_t Sigma_{t-1} A_t^T + Q_t (t >= 2), Sigma_{1|0} for t = 1. (pb, T, S, S)."""
    T, S = mdl.T, mdl.S
    first = mdl.init_cov.unsqueeze(-3)
    if T == 1:
        return first
    A = _slice_time(mdl.A, 1, None, 2)
    Q = _slice_time(mdl.Q, 1, None, 2)
    rest = _sym(A @ covs[..., :-1, :, :] @ A.mT + Q)
    return _cat_time(first, rest, 2, T)


def _predicted_means(mdl: _Model, means: Tensor) -> Tensor:
    """mu_{t|t-1} = A_t mu_{t-1} + B_t u_t (t >= 2), mu_{1|0} for t = 1. (b, T, S)."""
    T, S = mdl.T, mdl.S
    first = mdl.init_loc.unsqueeze(-2)
    if T == 1:
        return first
    rest = _mv(_slice_time(mdl.A, 1, None, 2), means[..., :-1, :])
    if mdl.b is not None:
        rest = rest + _slice_time(mdl.b, 1, None, 1)
    return _cat_time(first, rest, 1, T)


def _log_likelihoods(mdl: _Model, pred_means: Tensor, L: Tensor) -> Tensor:
    """log N(x_t; C_t mu_{t|t-1}, C_t Sigma_{t|t-1} C_t^T + R_t) over observed elements (eq. 3.12)."""
    r = mdl.x - _mv(mdl.C, pred_means)
    v = _trsv(L, r)
    half_logdet = L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    n = mdl.num_obs if mdl.num_obs is not None else mdl.D
    return -0.5 * v.pow(2).sum(-1) - half_logdet - 0.5 * _LOG_2PI * n


def _flat_time_entries(p: Tensor, batch: torch.Size, T: int, event_ndim: int):
    """The T entries of p ``(b..., T|1, *event)`` along time, each expanded to ``batch`` and
    flattened to ``(n, *event)``, or to ``event`` alone when ``batch`` has one element
    (so that per-step products are plain ``mm`` / ``addmm`` calls without broadcasting)."""
    dim = p.dim() - event_ndim - 1
    p = p.expand(batch + p.shape[dim:])
    n = batch.numel()
    p = p.reshape(((n,) if n != 1 else ()) + p.shape[dim:])
    tdim = p.dim() - event_ndim - 1
    if p.shape[tdim] == 1:
        return [p.select(tdim, 0)] * T
    return list(p.unbind(tdim))


def _fused_kernel(bias: Tensor, X: Tensor, Y: Tensor):
    """``torch.addmm`` or ``torch.baddbmm`` when they compute ``bias + X @ Y`` for these
    shapes without broadcasting, else None."""
    if X.dim() == 2 and Y.dim() == 2 and bias.dim() <= 2:
        return torch.addmm
    if X.dim() == 3 and Y.dim() == 3 and bias.dim() == 3 and bias.shape[0] == X.shape[0] == Y.shape[0]:
        return torch.baddbmm
    return None


def _addmm(bias: Tensor, X: Tensor, Y: Tensor, beta: float = 1.0, alpha: float = 1.0) -> Tensor:
    """``beta * bias + alpha * X @ Y`` in one fused kernel where the shapes allow it."""
    kernel = _fused_kernel(bias, X, Y)
    if kernel is not None:
        return kernel(bias, X, Y, beta=beta, alpha=alpha)
    XY = X @ Y
    return (bias if beta == 1.0 else beta * bias) + (XY if alpha == 1.0 else alpha * XY)


def _step_addmm(M: Tensor, V: Tensor):
    """The kernel for ``V_t + M_t @ v`` in a per-step loop (``v`` shaped like ``V_t``),
    chosen once for the loop: :func:`_fused_kernel` where it applies, else :func:`_addmm`."""
    return _fused_kernel(V, M, V) or _addmm


def _covariance_pass_sequential(mdl: _Model, steady_state_tol: float = 0.0):
    """Riccati recursion of thesis Sec. 3.4.1 (prediction + measurement step), looped over t.

    Per step, with L L^T = C P C^T + R (Cholesky) and W = L^{-1} C P (triangular solve),
    the measurement update is Sigma = P - W^T W, the Schur-complement form (equal to the
    Joseph form (I-KC) P (I-KC)^T + K R K^T for the optimal gain, at a third of its cost),
    symmetrised exactly. The prediction and the next step's C P come from one product:
    [A; C A] Sigma A^T + [Q; C Q] = [Sigma_{t+1|t}; C Sigma_{t+1|t}]. The loop carries
    halves (H = M / 2, so that the exact symmetrisation M_sym = H + H^T is a single add;
    halving is exact in binary floating point) and runs 7 kernels per step on the
    covariance batch flattened to one dimension (plain 2-D products when the parameters
    are shared). The predicted covariances are symmetrised after the loop in one batched
    add (inside the loop Sigma's symmetrisation absorbs P's rounding asymmetry), the gains
    K_t = W_t^T L_t^{-1} are formed for all t at once, and Cholesky failures are checked
    once at the end.

    :returns: ``(predicted_covs, covs, L, K, ASig, steady_from)``, ``ASig``
        ``(cb, T-1, S, S)`` with entry t = A_{t+1} Sigma_t (reused by the smoother), or None
        for T = 1; every covariance-side quantity of step t >= ``steady_from`` (T when the
        steady-state shortcut was not taken) repeats that of step ``steady_from``.
    """
    T, S, D = mdl.T, mdl.S, mdl.D
    cb = _broadcast_shapes(mdl.init_cov.shape[:-2], mdl.A.shape[:-3], mdl.Q.shape[:-3],
                           mdl.C.shape[:-3], mdl.R.shape[:-3])
    n = cb.numel()
    lead = (n,) if n != 1 else ()
    C0 = _flat_time_entries(mdl.C, cb, 1, 2)[0]
    Cs, Rs = _flat_time_entries(mdl.C, cb, T, 2), _flat_time_entries(mdl.R, cb, T, 2)
    CTs = [c.mT for c in Cs] if mdl.C.shape[-3] > 1 else [Cs[0].mT] * T
    if T > 1:
        # blocks [A_t; C_t A_t] and [Q_t; C_t Q_t] for all t (one small product when constant)
        CA, CQ = mdl.C @ mdl.A, mdl.C @ mdl.Q
        Ab = mdl.A.expand(CA.shape[:-2] + mdl.A.shape[-2:])
        Qb = mdl.Q.expand(CQ.shape[:-2] + mdl.Q.shape[-2:])
        AB = torch.cat([Ab, CA], -2)
        QB = torch.cat([Qb, CQ], -2)
        ABs, QBs = _flat_time_entries(AB, cb, T, 2), _flat_time_entries(QB, cb, T, 2)
        As = _flat_time_entries(mdl.A, cb, T, 2)
        ATs = [a.mT for a in As] if mdl.A.shape[-3] > 1 else [As[0].mT] * T
    P0 = mdl.init_cov.expand(cb + (S, S)).reshape(lead + (S, S))
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (mdl.init_cov, mdl.A, mdl.Q, mdl.C, mdl.R))
    if n == 1 and T > 1 and not needs_grad:
        return _covariance_loop_2d_nograd(mdl, P0, C0, Cs, Rs, CTs, ABs, QBs, ATs, cb,
                                          steady_state_tol)
    Ph = 0.5 * P0
    CPh = 0.5 * (C0 @ P0)
    Phs, Ls, Whs, covs, infos, ASigs = [Ph], [], [], [], [], []
    solve = torch.linalg.solve_triangular
    cholesky_ex = torch.linalg.cholesky_ex
    two_d = n == 1
    addmm = torch.addmm if two_d else torch.baddbmm
    mm = torch.mm if two_d else torch.bmm
    for t in range(T):
        if t > 0:
            Y = mm(ABs[t], Sigma)  # [A; C A] Sigma
            Z = addmm(QBs[t], Y, ATs[t], beta=0.5, alpha=0.5)  # [P; C P] / 2
            Ph, CPh = Z[..., :S, :], Z[..., S:, :]
            ASigs.append(Y[..., :S, :])
            Phs.append(Ph)
        L, info = cholesky_ex(addmm(Rs[t], CPh, CTs[t], alpha=2.0))
        Wh = solve(L, CPh, upper=False)  # W / 2
        H = addmm(Ph, Wh.mT, Wh, alpha=-2.0)  # (P - W^T W) / 2
        Sigma = H + H.mT
        Ls.append(L)
        Whs.append(Wh)
        infos.append(info)
        covs.append(Sigma)
    if bool((torch.stack(infos) != 0).any()):
        raise ValueError(
            "innovation covariance C P C^T + R is not positive definite (Cholesky failed); "
            "check the covariances for NaN/inf, negative eigenvalues or a condition number "
            "beyond the dtype's range"
        )
    tdim = 1 if n != 1 else 0

    def stack(xs):
        out = torch.stack(xs, tdim)
        return out.reshape(cb + out.shape[tdim:])

    L, Wh = stack(Ls), stack(Whs)
    K = _tri_solve_lower_T(L, Wh).mT * 2.0
    Ph = stack(Phs)
    pcovs = Ph + Ph.mT
    pcovs[..., 0, :, :] = mdl.init_cov.expand(cb + (S, S))  # entry 0 is the input itself
    return pcovs, stack(covs), L, K, (stack(ASigs) if T > 1 else None), T


def _covariance_loop_2d_nograd(mdl, P0, C0, Cs, Rs, CTs, ABs, QBs, ATs, cb, steady_state_tol):
    """The loop of :func:`_covariance_pass_sequential` for shared parameters without
    autograd: identical kernels, but each writes straight into its slot of the stacked
    result (``out=``), which saves the per-step allocations and the final stacking copies."""
    T, S, D = mdl.T, mdl.S, mdl.D
    kw = dict(dtype=P0.dtype, device=P0.device)
    Z = torch.empty((T, S + D, S), **kw)  # [P; C P] / 2
    Y = torch.empty((T, S + D, S), **kw)  # [A; C A] Sigma_{t-1} (entry 0 unused)
    Lb = torch.empty((T, D, D), **kw)
    info = torch.empty((T,), dtype=torch.int32, device=P0.device)
    Wh = torch.empty((T, D, S), **kw)
    covs = torch.empty((T, S, S), **kw)
    torch.mul(P0, 0.5, out=Z[0, :S])
    torch.mm(C0, P0, out=Z[0, S:])
    Z[0, S:].mul_(0.5)
    addmm, mm, add = torch.addmm, torch.mm, torch.add
    solve, cholesky_ex = torch.linalg.solve_triangular, torch.linalg.cholesky_ex
    Zs, Ys, Ls, Whs, Cv = Z.unbind(0), Y.unbind(0), Lb.unbind(0), Wh.unbind(0), covs.unbind(0)
    infos = info.unbind(0)
    Sigma = None
    steady = steady_state_tol > 0 and all(
        p.shape[-3] == 1 for p in (mdl.A, mdl.Q, mdl.C, mdl.R))
    settled, steady_from = 0, T
    for t in range(T):
        Zt = Zs[t]
        if t > 0:
            mm(ABs[t], Sigma, out=Ys[t])
            addmm(QBs[t], Ys[t], ATs[t], beta=0.5, alpha=0.5, out=Zt)
        Ph, CPh = Zt[:S], Zt[S:]
        cholesky_ex(addmm(Rs[t], CPh, CTs[t], alpha=2.0), out=(Ls[t], infos[t]))
        solve(Ls[t], CPh, upper=False, out=Whs[t])
        H = addmm(Ph, Whs[t].mT, Whs[t], alpha=-2.0)
        Sigma = add(H, H.mT, out=Cv[t])
        if steady and t > 0 and t % _STEADY_CHECK_EVERY == 0:
            settled = settled + 1 if _settled(Sigma, Cv[t - 1], steady_state_tol) else 0
            if settled == 2 and t + 1 < T:  # fixed point reached: the rest repeats step t
                for buf in (Z, Y, Lb, info, Wh, covs):
                    buf[t + 1:] = buf[t]
                steady_from = t
                break
    if bool((info != 0).any()):
        raise ValueError(
            "innovation covariance C P C^T + R is not positive definite (Cholesky failed); "
            "check the covariances for NaN/inf, negative eigenvalues or a condition number "
            "beyond the dtype's range"
        )
    u = min(steady_from + 1, T)  # distinct steps
    K = _repeat_last(_tri_solve_lower_T(Lb[:u], Wh[:u]).mT * 2.0, T, 0)
    Ph = Z[:u, :S]
    pcovs = _repeat_last(Ph + Ph.mT, T, 0)
    pcovs[0] = P0
    r = lambda x: x.reshape(cb + x.shape)  # noqa: E731
    return r(pcovs), r(covs), r(Lb), r(K), r(Y[1:, :S]), steady_from


def _repeat_last(x: Tensor, n: int, dim: int = 0) -> Tensor:
    """``x`` extended to ``n`` entries along ``dim`` by repeating its last entry."""
    m = x.shape[dim]
    if m >= n:
        return x
    shape = list(x.shape)
    shape[dim] = n - m
    return torch.cat([x, x.narrow(dim, m - 1, 1).expand(shape)], dim)


def _settled(new: Tensor, old: Tensor, steady_state_tol: float) -> bool:
    """Whether ``new`` equals ``old`` to ``steady_state_tol`` epsilons of its largest entry."""
    tol = steady_state_tol * torch.finfo(new.dtype).eps
    return float(torch.sub(new, old).abs_().max()) <= tol * float(new.abs().max())


def _tri_solve_lower_T(L: Tensor, V: Tensor) -> Tensor:
    """``L^{-T} V`` for lower-triangular L."""
    if V.shape[:-2] != L.shape[:-2]:
        shape = _broadcast_shapes(L.shape[:-2], V.shape[:-2])
        L, V = L.expand(shape + L.shape[-2:]), V.expand(shape + V.shape[-2:])
    return torch.linalg.solve_triangular(L.mT, V, upper=True)


def _mean_pass_sequential(F: Tensor, g: Tensor) -> Tensor:
    """mu_t = F_t mu_{t-1} + g_t looped over t; F (pb, T|1, S, S), g (b, T, S) -> (b, T, S).
    The data batch is folded into matrix columns (see ``_fold_columns``)."""
    T = g.shape[-2]
    F = F.expand(F.shape[:-3] + (T,) + F.shape[-2:])
    Fp, G, unfold = _fold_columns(F, g)
    Fs, Gs = Fp.unbind(-3), G.unbind(-3)
    addmm = _step_addmm(Fs[0], Gs[0])
    m = Gs[0]
    out = [m]
    for t in range(1, T):
        m = addmm(Gs[t], Fs[t], m)
        out.append(m)
    return unfold(torch.stack(out, dim=-3))


def _resolve_method(method: str, mdl: _Model) -> str:
    if method == "auto":
        if mdl.T < PARALLEL_THRESHOLD:
            return "sequential"
        if mdl.x.device.type == "cpu" and mdl.S >= PARALLEL_MAX_STATE_CPU:
            return "sequential"
        return "parallel"
    if method not in ("sequential", "parallel"):
        raise ValueError(f"method must be 'auto', 'sequential' or 'parallel'; got {method!r}")
    return method


def _expand(t: Tensor, batch: torch.Size, event_ndim: int) -> Tensor:
    return t.expand(batch + t.shape[t.dim() - event_ndim :])


def _filter(mdl: _Model, method: str, steady_state_tol: float = 0.0):
    """Run the filter on a prepared model. Returns ``(KalmanFilterResult, ASig, steady_from)``
    unexpanded, ``ASig`` the products A_{t+1} Sigma_t of the sequential pass (None otherwise)
    and ``steady_from`` as in :func:`_covariance_pass_sequential` (T for the parallel form)."""
    ASig, steady_from = None, mdl.T
    if _resolve_method(method, mdl) == "parallel":
        from pyro_seq.ops.kalman_parallel import covariance_scan, affine_scan

        pcovs, covs, L, K = covariance_scan(mdl)
        F, g = _mean_coefficients(mdl, K)
        means = affine_scan(F, g)
    else:
        pcovs, covs, L, K, ASig, steady_from = _covariance_pass_sequential(mdl, steady_state_tol)
        F, g = _mean_coefficients(mdl, K)
        means = _mean_pass_sequential(F, g)
    pmeans = _predicted_means(mdl, means)
    ll = _log_likelihoods(mdl, pmeans, L)
    return KalmanFilterResult(means, covs, pmeans, pcovs, ll), ASig, steady_from


def _expand_filter(res: KalmanFilterResult, batch: torch.Size) -> KalmanFilterResult:
    return KalmanFilterResult(
        _expand(res.means, batch, 2),
        _expand(res.covs, batch, 3),
        _expand(res.predicted_means, batch, 2),
        _expand(res.predicted_covs, batch, 3),
        _expand(res.log_likelihoods, batch, 1),
    )


def _backward_coefficients(mdl: _Model, f: KalmanFilterResult):
    """RTS gains and backward conditionals p(z_t | z_{t+1}, x_{1:t}) = N(J_t z_{t+1} + h_t, Pc_t).

    J_t = Sigma_t A_{t+1}^T Sigma_{t+1|t}^{-1} (via Cholesky of Sigma_{t+1|t}; the
    minimum-norm solution by :func:`_psd_solve` where it is rank-deficient),
    h_t = mu_t - J_t mu_{t+1|t},
    Pc_t = (I - J_t A_{t+1}) Sigma_t (I - J_t A_{t+1})^T + J_t Q_{t+1} J_t^T (Joseph form).
    Shapes: J, Pc (pb, T-1, S, S); h (b, T-1, S).
    """
    S = mdl.S
    A = _slice_time(mdl.A, 1, None, 2)
    Q = _slice_time(mdl.Q, 1, None, 2)
    Sig = f.covs[..., :-1, :, :]
    J = _psd_solve(f.predicted_covs[..., 1:, :, :], A @ Sig,
                   "predicted covariance Sigma_{t+1|t}",
                   scale=_rounding_scale(f.predicted_covs)[..., 1:]).mT
    IJA = torch.eye(S, dtype=J.dtype, device=J.device) - J @ A
    Pc = _sym(IJA @ Sig @ IJA.mT + J @ Q @ J.mT)
    h = f.means[..., :-1, :] - _mv(J, f.predicted_means[..., 1:, :])
    return J, h, Pc


def _a_sigma(mdl: _Model, Sig: Tensor) -> Tensor:
    """A_{t+1} Sigma_t for Sig = filtered covs[:-1]."""
    A = _slice_time(mdl.A, 1, None, 2)
    if A.shape[:-2].numel() == 1:
        # Sigma_t is exactly symmetric: A Sigma_t = (Sigma_t A^T)^T, one (T*S, S) x (S, S) GEMM
        return (Sig @ A.reshape(A.shape[-2:]).mT).mT
    return A @ Sig


def _smoother_coefficients(mdl: _Model, f: KalmanFilterResult, ASig: Optional[Tensor],
                           backward_covs: bool, steady_from: Optional[int] = None):
    """RTS gains for smoothing (cheaper variants of :func:`_backward_coefficients`).

    With L_t L_t^T = Sigma_{t+1|t} (Cholesky) and A_{t+1} Sigma_t (``ASig``, reused from
    the sequential filter when given): J_t = Sigma_t A_{t+1}^T Sigma_{t+1|t}^{-1} by one
    ``cholesky_solve``, h_t = mu_t - J_t mu_{t+1|t}. With ``backward_covs`` (for the
    parallel scan) also Pc_t = Sigma_t - J_t Sigma_{t+1|t} J_t^T in the exactly symmetric
    Schur-complement form Sigma_t - G_t^T G_t, G_t = L_t^{-1} A_{t+1} Sigma_t, and
    J_t = G_t^T L_t^{-1}; otherwise Pc is None. (FFBS keeps the Joseph form, whose
    PSD-by-construction Pc_t is factored for sampling.) With a filter in steady state from
    step ``steady_from`` on, J_t repeats from there and is computed once. Where some
    Sigma_{t+1|t} is rank-deficient to working precision, J_t = Sigma_t A_{t+1}^T
    Sigma_{t+1|t}^+ by :func:`_psd_solve` and Pc_t = Sigma_t - J_t A_{t+1} Sigma_t.
    """
    T1 = mdl.T - 1
    u = T1 if steady_from is None or backward_covs else min(steady_from + 1, T1)
    Sig = f.covs[..., :u, :, :]
    P = f.predicted_covs[..., 1:u + 1, :, :]
    what = "predicted covariance Sigma_{t+1|t}"
    scale = _rounding_scale(f.predicted_covs[..., :u + 1, :, :])[..., 1:]
    Lp, deficient = factor = _psd_cholesky(P, what, scale)
    if ASig is None:
        ASig = _a_sigma(mdl, Sig)
    else:
        ASig = ASig[..., :u, :, :]
    Pc = None
    if backward_covs and deficient is None:
        G = _tri_solve_lower(Lp, ASig)
        J = _tri_solve_lower_T(Lp, G).mT
        Pc = _sym(_addmm(Sig, G.mT, G, alpha=-1.0))
    else:
        J = _repeat_last(_psd_solve(P, ASig, what, factor, scale).mT, T1, -3)
        if backward_covs:  # rank-deficient Sigma_{t+1|t}: Pc = Sigma_t - J_t A_{t+1} Sigma_t
            Pc = _sym(_addmm(Sig, J, ASig, alpha=-1.0))
    h = f.means[..., :-1, :] - _mv(J, f.predicted_means[..., 1:, :])
    return J, h, Pc


def _smooth_sequential_covs(J: Tensor, covs: Tensor, ASig: Tensor,
                            repeat_from: Optional[int] = None,
                            steady_state_tol: float = 0.0) -> Tensor:
    """Backward RTS loop on covariances, Sigma_{t|T} = Pc_t + J_t Sigma_{t+1|T} J_t^T from
    Sigma_{T|T} = Sigma_T, with Pc_t = Sigma_t - J_t A_{t+1} Sigma_t (= Sigma_t - J_t
    Sigma_{t+1|t} J_t^T) formed for all t at once. The loop carries halves and runs two
    kernels per step on the covariance batch flattened to one dimension; the results are
    symmetrised exactly in one batched add (H + H^T). When J_t and Pc_t repeat exactly for
    t >= ``repeat_from`` (a filter in steady state) the loop stops once Sigma_{t|T} has
    settled there (``steady_state_tol``) and repeats it down to ``repeat_from``.
    J, ASig (pb, T-1, S, S), covs (pb, T, S, S) -> (pb, T, S, S)."""
    T1 = J.shape[-3]
    if repeat_from is None:
        repeat_from = T1
    u = min(repeat_from + 1, T1)  # distinct coefficients
    Pch = _addmm(covs[..., :u, :, :], J[..., :u, :, :], ASig[..., :u, :, :],
                 beta=0.5, alpha=-0.5)  # Pc / 2
    cb = _broadcast_shapes(J.shape[:-3], covs.shape[:-3], Pch.shape[:-3])
    Js = _flat_time_entries(J, cb, T1, 2)
    Pchs = _flat_time_entries(Pch, cb, u, 2)
    Pchs += Pchs[-1:] * (T1 - u)
    n = cb.numel()
    two_d = n == 1
    addmm = torch.addmm if two_d else torch.baddbmm
    mm = torch.mm if two_d else torch.bmm
    X = 0.5 * _flat_time_entries(covs[..., -1:, :, :], cb, 1, 2)[0]
    out = [X]
    settled, t = 0, T1 - 1
    while t >= 0:
        Jt = Js[t]
        X_new = addmm(Pchs[t], mm(Jt, X), Jt.mT)
        if t >= repeat_from and (T1 - t) % _STEADY_CHECK_EVERY == 0:
            settled = settled + 1 if _settled(X_new, X, steady_state_tol) else 0
        X = X_new
        out.append(X)
        if settled == 2:  # settled with constant coefficients: repeat down to repeat_from
            out.extend([X] * (t - repeat_from))
            t, settled = repeat_from - 1, 0
            continue
        t -= 1
    tdim = 1 if n != 1 else 0
    res = torch.stack(out[::-1], tdim)
    res = res.reshape(cb + res.shape[tdim:])
    return res + res.mT


def _smooth(mdl: _Model, f: KalmanFilterResult, method: str, ASig: Optional[Tensor] = None,
            steady_from: Optional[int] = None, steady_state_tol: float = 0.0):
    T = mdl.T
    if T == 1:
        empty = f.covs[..., :0, :, :]
        return f.means, f.covs, empty, empty
    parallel = _resolve_method(method, mdl) == "parallel"
    J, h, Pc = _smoother_coefficients(mdl, f, ASig, backward_covs=parallel,
                                      steady_from=steady_from)
    mT, PT = f.means[..., -1, :], f.covs[..., -1, :, :]
    if parallel:
        from pyro_seq.ops.kalman_parallel import backward_scan

        means, covs = backward_scan(J, h, Pc, mT, PT)
    else:
        if ASig is None:
            ASig = _a_sigma(mdl, f.covs[..., :-1, :, :])
        means = _smooth_sequential_means(J, h, mT)
        covs = _smooth_sequential_covs(J, f.covs, ASig, steady_from, steady_state_tol)
    cross = covs[..., 1:, :, :] @ J.mT
    return means, covs, cross, J


# ---------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------


def kalman_filter(
    observations: Tensor,
    initial_loc: Tensor,
    initial_cov: Tensor,
    transition_matrix: Tensor,
    transition_cov: Tensor,
    observation_matrix: Tensor,
    observation_cov: Tensor,
    control_matrix: Optional[Tensor] = None,
    controls: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    method: str = "auto",
    *,
    nan_as_missing: bool = False,
    steady_state_tol: float = STEADY_STATE_TOL,
    validate_args: Optional[bool] = None,
) -> KalmanFilterResult:
    r"""Kalman filter (thesis Sec. 3.4.1, eq. 3.11) with log-likelihood terms (eq. 3.12).

    Prediction step: mu_{t|t-1} = A_t mu_{t-1} + B_t u_t,
    Sigma_{t|t-1} = A_t Sigma_{t-1} A_t^T + Q_t. Measurement step:
    K_t = Sigma_{t|t-1} C_t^T (C_t Sigma_{t|t-1} C_t^T + R_t)^{-1},
    mu_t = mu_{t|t-1} + K_t (x_t - C_t mu_{t|t-1}), Sigma_t = Sigma_{t|t-1} - W^T W
    (Schur complement, W = L^{-1} C Sigma_{t|t-1}; see the module docstring).
    Missing data per thesis Sec. 3.4.2 (see module docstring).

    :param observations: ``(..., T, D)``.
    :param initial_loc: ``(..., S)`` mu_{1|0}; ``initial_cov`` ``(..., S, S)`` Sigma_{1|0}.
    :param transition_matrix: A_t ``(..., [T|1,] S, S)``; ``transition_cov`` Q_t likewise.
        Entry t is the transition into step t (entry 0 unused).
    :param observation_matrix: C_t ``(..., [T|1,] D, S)``; ``observation_cov`` R_t
        ``(..., [T|1,] D, D)``.
    :param control_matrix: B_t ``(..., [T|1,] S, U)`` or None; ``controls`` u_t
        ``(..., T, U)`` (with ``control_matrix=None``, u_t is added to the state directly).
    :param mask: bool ``(..., T)`` or ``(..., T, D)``, True where observed.
    :param method: ``"auto"``, ``"sequential"`` or ``"parallel"``.
    :param nan_as_missing: treat NaN entries of ``observations`` as unobserved elements
        (and-ed with ``mask``). Otherwise NaN or +-inf at an observed entry is an error.
    :param steady_state_tol: steady-state test of the sequential recursions in machine
        epsilons (module docstring, Numerics); 0 runs every step.
    :param validate_args: check the parameters (finite; covariances symmetric, Q and
        Sigma_{1|0} PSD, R PD); None follows ``torch.distributions.Distribution``.
    :returns: :class:`KalmanFilterResult` with fields of shape ``batch + (T, S)``,
        ``batch + (T, S, S)``, ``batch + (T, S)``, ``batch + (T, S, S)``, ``batch + (T,)``
        where ``batch`` broadcasts all batch dimensions.
    """
    mdl = _prepare(observations, initial_loc, initial_cov, transition_matrix, transition_cov,
                   observation_matrix, observation_cov, control_matrix, controls, mask,
                   nan_as_missing, validate_args)
    res, _, _ = _filter(mdl, method, steady_state_tol)
    return _expand_filter(res, mdl.batch_shape)


def kalman_smoother(
    observations: Tensor,
    initial_loc: Tensor,
    initial_cov: Tensor,
    transition_matrix: Tensor,
    transition_cov: Tensor,
    observation_matrix: Tensor,
    observation_cov: Tensor,
    control_matrix: Optional[Tensor] = None,
    controls: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    method: str = "auto",
    *,
    nan_as_missing: bool = False,
    steady_state_tol: float = STEADY_STATE_TOL,
    validate_args: Optional[bool] = None,
) -> KalmanSmootherResult:
    r"""Rauch-Tung-Striebel smoother (thesis Sec. 3.4.1, smoothing) with lag-one covariances.

    mu_{t|T} = mu_t + J_t (mu_{t+1|T} - mu_{t+1|t}),
    Sigma_{t|T} = Sigma_t + J_t (Sigma_{t+1|T} - Sigma_{t+1|t}) J_t^T,
    J_t = Sigma_t A_{t+1}^T Sigma_{t+1|t}^{-1}; computed as
    Sigma_{t|T} = J_t Sigma_{t+1|T} J_t^T + Pc_t with the PSD Joseph-form backward
    covariance Pc_t = (I - J_t A_{t+1}) Sigma_t (I - J_t A_{t+1})^T + J_t Q_{t+1} J_t^T
    (algebraically identical). Cross covariance Cov(z_{t+1}, z_t | x) = Sigma_{t+1|T} J_t^T.

    Arguments as :func:`kalman_filter`. Where Sigma_{t+1|t} is singular to working
    precision, J_t is the minimum-norm solution of J_t Sigma_{t+1|t} = Sigma_t A_{t+1}^T
    (no inverse of the singular matrix; exact, see the module docstring).

    :returns: :class:`KalmanSmootherResult`: ``means batch + (T, S)``,
        ``covs batch + (T, S, S)``, ``cross_covs batch + (T-1, S, S)``,
        ``gains batch + (T-1, S, S)``, ``filtered`` (:class:`KalmanFilterResult`).
    """
    mdl = _prepare(observations, initial_loc, initial_cov, transition_matrix, transition_cov,
                   observation_matrix, observation_cov, control_matrix, controls, mask,
                   nan_as_missing, validate_args)
    f, ASig, steady_from = _filter(mdl, method, steady_state_tol)
    means, covs, cross, J = _smooth(mdl, f, method, ASig, steady_from, steady_state_tol)
    batch = mdl.batch_shape
    return KalmanSmootherResult(
        _expand(means, batch, 2),
        _expand(covs, batch, 3),
        _expand(cross, batch, 3),
        _expand(J, batch, 3),
        _expand_filter(f, batch),
    )


def kalman_sample(
    observations: Tensor,
    initial_loc: Tensor,
    initial_cov: Tensor,
    transition_matrix: Tensor,
    transition_cov: Tensor,
    observation_matrix: Tensor,
    observation_cov: Tensor,
    control_matrix: Optional[Tensor] = None,
    controls: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    sample_shape=torch.Size(),
    noise: Optional[Tensor] = None,
    method: str = "auto",
    *,
    nan_as_missing: bool = False,
    steady_state_tol: float = STEADY_STATE_TOL,
    validate_args: Optional[bool] = None,
) -> KalmanSampleResult:
    r"""Forward-filtering backward-sampling: reparameterized draws of z_{1:T} | x_{1:T}.

    After the Kalman filter (eq. 3.11), z_T = mu_T + chol(Sigma_T) e_T and, backwards,
    z_t = mu_t + J_t (z_{t+1} - mu_{t+1|t}) + chol(Pc_t) e_t with e_t ~ N(0, I), J_t and
    Pc_t the RTS gain and backward covariance of :func:`kalman_smoother` (Pc_t is factored
    by :func:`psd_sqrt`, so a singular Q_t such as the ball example's Q = 0 is fine).

    Arguments as :func:`kalman_filter`, plus ``sample_shape`` and ``noise`` (standard
    normal of shape ``sample_shape + batch + (T, S)``; drawn with torch's RNG if None).

    :returns: :class:`KalmanSampleResult` with ``samples`` of shape
        ``sample_shape + batch + (T, S)`` and the ``filtered`` result.
    """
    mdl = _prepare(observations, initial_loc, initial_cov, transition_matrix, transition_cov,
                   observation_matrix, observation_cov, control_matrix, controls, mask,
                   nan_as_missing, validate_args)
    f, _, _ = _filter(mdl, method, steady_state_tol)
    samples = _sample(mdl, f, sample_shape, noise, method)
    return KalmanSampleResult(samples, _expand_filter(f, mdl.batch_shape))


def _sample(mdl: _Model, f: KalmanFilterResult, sample_shape, noise, method) -> Tensor:
    sample_shape = torch.Size(sample_shape)
    T, S = mdl.T, mdl.S
    shape = sample_shape + mdl.batch_shape + (T, S)
    if noise is None:
        noise = torch.randn(shape, dtype=f.means.dtype, device=f.means.device)
    elif noise.shape != shape:
        raise ValueError(f"noise must have shape {tuple(shape)}; got {tuple(noise.shape)}")
    check_device("noise", noise, f.means.device, "the model's parameters are")
    LT = psd_sqrt(f.covs[..., -1, :, :])
    zT = f.means[..., -1, :] + _mv(LT, noise[..., -1, :])
    if T == 1:
        return zT.unsqueeze(-2)
    J, h, Pc = _backward_coefficients(mdl, f)
    g = h + _mv(psd_sqrt(Pc), noise[..., :-1, :])
    if _resolve_method(method, mdl) == "parallel":
        from pyro_seq.ops.kalman_parallel import backward_scan

        z, _ = backward_scan(J, g, None, zT, None)
    else:
        z = _smooth_sequential_means(J, g, zT)
    return z


def _smooth_sequential_means(J, g, zT):
    """Backward loop z_t = J_t z_{t+1} + g_t from z_T; J (pb, T-1, S, S), g (b, T-1, S)."""
    T1 = J.shape[-3]
    gT = zT.unsqueeze(-2)
    batch = _broadcast_shapes(g.shape[:-2], gT.shape[:-2])
    gg = torch.cat([g.expand(batch + g.shape[-2:]), gT.expand(batch + gT.shape[-2:])], -2)
    Ep, G, unfold = _fold_columns(J, gg)  # J has T-1 entries, gg has T (only batch dims matter)
    Es, Gs = Ep.unbind(-3), G.unbind(-3)
    addmm = _step_addmm(Es[0], Gs[0])
    z = Gs[T1]
    out = [z]
    for t in range(T1 - 1, -1, -1):
        z = addmm(Gs[t], Es[t], z)
        out.append(z)
    return unfold(torch.stack(out[::-1], dim=-3))


def lgssm_sample(
    initial_loc: Tensor,
    initial_cov: Tensor,
    transition_matrix: Tensor,
    transition_cov: Tensor,
    observation_matrix: Tensor,
    observation_cov: Tensor,
    control_matrix: Optional[Tensor] = None,
    controls: Optional[Tensor] = None,
    num_steps: Optional[int] = None,
    sample_shape=torch.Size(),
    noise=None,
    method: str = "auto",
    *,
    validate_args: Optional[bool] = None,
) -> LGSSMSample:
    r"""Reparameterized joint draws of (z_{1:T}, x_{1:T}) from the LGSSM (thesis eqs. 3.4-3.8).

    z_1 = mu_{1|0} + chol(Sigma_{1|0}) e_1, z_t = A_t z_{t-1} + B_t u_t + chol(Q_t) e_t,
    x_t = C_t z_t + chol(R_t) f_t with e, f standard normal; covariances are factored by
    :func:`psd_sqrt`, so singular Q_t (deterministic dynamics) is allowed.

    Parameters as :func:`kalman_filter` (no observations); ``num_steps`` T is required when
    no parameter or control has a time dimension of size T. ``noise``: optional pair
    ``(e, f)`` of shapes ``sample_shape + batch + (T, S)`` and ``sample_shape + batch + (T, D)``
    (any shapes that broadcast against the parameters' batch shape are accepted; the
    result then has their broadcast batch shape). ``validate_args`` as for
    :func:`kalman_filter`.
    :returns: :class:`LGSSMSample` ``(states, observations)``.
    """
    sample_shape = torch.Size(sample_shape)
    sizes = [p.shape[-3] for p in (transition_matrix, transition_cov, observation_matrix,
                                   observation_cov, control_matrix) if p is not None and p.dim() > 2]
    if controls is not None:
        sizes.append(controls.shape[-2])
    if num_steps is None:
        if not sizes:
            raise ValueError("num_steps is required when no argument has a time dimension")
        T = max(sizes)
    else:
        T = int(num_steps)
    if T < 1:
        raise ValueError(f"lgssm_sample needs num_steps T >= 1; got T = {T}")
    S, D = initial_loc.shape[-1], observation_matrix.shape[-2]
    dummy = initial_loc.new_zeros(()).expand(T, D)
    mdl = _prepare(dummy, initial_loc, initial_cov, transition_matrix, transition_cov,
                   observation_matrix, observation_cov, control_matrix, controls,
                   validate_args=validate_args)
    batch = mdl.param_batch_shape
    if noise is None:
        e = torch.randn(sample_shape + batch + (T, S), dtype=initial_loc.dtype,
                        device=initial_loc.device)
        f = torch.randn(sample_shape + batch + (T, D), dtype=initial_loc.dtype,
                        device=initial_loc.device)
    else:
        e, f = noise
        _check_devices(("initial_loc", initial_loc), ("noise[0]", e), ("noise[1]", f))
    g0 = mdl.init_loc + _mv(psd_sqrt(mdl.init_cov), e[..., 0, :])
    if T > 1:
        rest = _mv(psd_sqrt(_slice_time(mdl.Q, 1, None, 2)), e[..., 1:, :])
        if mdl.b is not None:
            rest = rest + _slice_time(mdl.b, 1, None, 1)
        g = _cat_time(g0.unsqueeze(-2), rest, 1, T)
    else:
        g = g0.unsqueeze(-2)
    F = mdl.A.expand(mdl.A.shape[:-3] + (T, S, S))
    if _resolve_method(method, mdl) == "parallel":
        from pyro_seq.ops.kalman_parallel import affine_scan

        z = affine_scan(F, g)
    else:
        z = _mean_pass_sequential(F, g)
    x = _mv(mdl.C, z) + _mv(psd_sqrt(mdl.R), f)
    out = _broadcast_shapes(sample_shape + batch, z.shape[:-2], x.shape[:-2])
    return LGSSMSample(z.expand(out + (T, S)), x.expand(out + (T, D)))


# ---------------------------------------------------------------------------------------
# One step at a time (models whose parameters at step t depend on earlier observations)
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
        return self.pred_mean + _mv(self.gain, observation - self.loc)


def kalman_predict(mean: Tensor, cov: Tensor, transition_matrix: Tensor, transition_cov: Tensor,
                   offset: Optional[Tensor] = None):
    """Prediction step (thesis eq. 3.11): mu_{t|t-1} = A_t mu_{t-1} + b_t,
    Sigma_{t|t-1} = A_t Sigma_{t-1} A_t^T + Q_t.

    :param mean: ``(..., S)``; ``cov`` ``(..., S, S)``; ``transition_matrix`` A_t and
        ``transition_cov`` Q_t ``(..., S, S)``; ``offset`` b_t = B_t u_t ``(..., S)`` or None.
        Batch dimensions broadcast.
    :returns: ``(mean, cov)`` of p(z_t | x_{1:t-1}).
    """
    m = _mv(transition_matrix, mean)
    if offset is not None:
        m = m + offset
    return m, _sym(transition_matrix @ cov @ transition_matrix.mT + transition_cov)


def kalman_update(pred_mean: Tensor, pred_cov: Tensor, observation_matrix: Tensor,
                  observation_cov: Tensor) -> KalmanStep:
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
    L, K, Sigma = _measurement_update(pred_cov, observation_matrix, observation_cov)
    return KalmanStep(pred_mean, _mv(observation_matrix, pred_mean), L, K, Sigma)
