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
    elements excluded, 0 for a fully masked step).
``kalman_log_likelihood(*model, method="auto") -> Tensor``
    log p(x_{1:T}) ``(...)``, the filter's ``log_likelihoods.sum(-1)`` without its other
    outputs (its ``"auto"`` steady-state form: :mod:`~pyro_seq.ops.kalman_blocked`).
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
depth and the sequential form is faster). Both agree to rounding. ``"auto"`` first tries
the steady-state path of :mod:`pyro_seq.ops.kalman_steady` (time-invariant parameters shared
by the batch, no mask, no autograd, ``T >= PARALLEL_THRESHOLD``): the Riccati recursion on
the Cholesky factor of the joint predictive covariance of (x_t, z_t) until its fixed point,
then the means in blocks with one block-Toeplitz product per level; it falls back to the
forms above where a filtered covariance is singular or no steady state is reached.

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
  exact since Sigma_t A^T vanishes on its null space; see
  :func:`~pyro_seq.ops.linalg.psd_solve`). Values are
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
  ``steady_state_tol=0`` always runs every step (measured speed: docs/benchmarks.rst, section
  "Kalman filtering and smoothing").

Modules
-------
This module holds the public API and chooses between the two forms; the work is done in
:mod:`~pyro_seq.ops.lgssm` (parameter bundle, argument checks, the prepared model),
:mod:`~pyro_seq.ops.kalman_steps` (per-step formulas shared by both forms),
:mod:`~pyro_seq.ops.kalman_sequential` (loops over time), :mod:`~pyro_seq.ops.kalman_parallel`
(associative scans), :mod:`~pyro_seq.ops.kalman_steady` and
:mod:`~pyro_seq.ops.kalman_blocked` (the steady-state paths of ``"auto"``) and
:mod:`~pyro_seq.ops.linalg` (batched linear algebra). ``COV_TOL_EPS`` and
``covariance_problem`` (defined in :mod:`~pyro_seq.ops.lgssm`) are importable from here.

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

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from pyro_seq.ops.kalman_parallel import affine_scan, backward_scan, covariance_scan
from pyro_seq.ops.kalman_sequential import (
    backward_covariance_pass,
    backward_mean_pass,
    covariance_pass,
    mean_pass,
)
from pyro_seq.ops.kalman_steady import (
    SteadyStateCache,
    steady_applicable,
    steady_filter,
    steady_log_likelihood,
    steady_smoother,
)
from pyro_seq.ops.kalman_steps import (  # the one-step API is public here
    KalmanStep,
    a_sigma,
    backward_coefficients,
    kalman_predict,
    kalman_update,
    mean_coefficients,
    predicted_means,
    smoother_coefficients,
    step_log_likelihoods,
)
from pyro_seq.ops.lgssm import (  # noqa: F401
    COV_TOL_EPS,
    LGSSMParams,
    PreparedLGSSM,
    cat_time,
    check_devices,
    covariance_problem,
    prepare,
    slice_time,
    validate_parameters,
)
from pyro_seq.ops.linalg import broadcast_shapes, jitter_cholesky, mv
from pyro_seq.pyro_internals import default_validate_args
from pyro_seq.validation import check_device

__all__ = [
    "KalmanFilterResult",
    "KalmanSmootherResult",
    "KalmanSampleResult",
    "kalman_filter",
    "kalman_log_likelihood",
    "kalman_smoother",
    "kalman_sample",
    "LGSSMSample",
    "lgssm_sample",
    "PARALLEL_THRESHOLD",
    "STEADY_STATE_TOL",
    "SteadyStateCache",
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
# Argument preparation (pyro_seq.ops.lgssm)
# ---------------------------------------------------------------------------------------


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
) -> PreparedLGSSM:
    """:func:`~pyro_seq.ops.lgssm.prepare` on the arguments of the public functions, with
    ``validate_args=None`` read from ``torch.distributions`` (module docstring)."""
    if validate_args is None:
        validate_args = default_validate_args()
    params = LGSSMParams(
        initial_loc,
        initial_cov,
        transition_matrix,
        transition_cov,
        observation_matrix,
        observation_cov,
        control_matrix,
    )
    return prepare(observations, params, controls, mask, nan_as_missing, validate_args)


# the former private name of pyro_seq.ops.lgssm.validate_parameters (tests/test_device.py)
_validate_parameters = validate_parameters


# ---------------------------------------------------------------------------------------
# Dispatch between the sequential and the parallel form
# ---------------------------------------------------------------------------------------


def _resolve_method(method: str, mdl: PreparedLGSSM) -> str:
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


def _filter(
    mdl: PreparedLGSSM,
    method: str,
    steady_state_tol: float = 0.0,
    cache: Optional[SteadyStateCache] = None,
):
    """Run the filter on a prepared model. Returns ``(KalmanFilterResult, ASig, steady_from)``
    unexpanded, ``ASig`` the products A_{t+1} Sigma_t of the sequential pass (None otherwise)
    and ``steady_from`` as in :func:`covariance_pass` (T for the parallel form)."""
    ASig, steady_from = None, mdl.T
    if method == "auto" and steady_applicable(mdl, steady_state_tol, PARALLEL_THRESHOLD):
        fast = steady_filter(mdl, steady_state_tol, cache)
        if fast is not None:
            return KalmanFilterResult(*fast[:5]), fast[5], fast[6]
    if _resolve_method(method, mdl) == "parallel":
        pcovs, covs, L, K = covariance_scan(mdl)
        F, g = mean_coefficients(mdl, K)
        means = affine_scan(F, g)
    else:
        pcovs, covs, L, K, ASig, steady_from = covariance_pass(mdl, steady_state_tol)
        F, g = mean_coefficients(mdl, K)
        means = mean_pass(F, g)
    pmeans = predicted_means(mdl, means)
    ll = step_log_likelihoods(mdl, pmeans, L)
    return KalmanFilterResult(means, covs, pmeans, pcovs, ll), ASig, steady_from


def _expand_filter(res: KalmanFilterResult, batch: torch.Size) -> KalmanFilterResult:
    return KalmanFilterResult(
        _expand(res.means, batch, 2),
        _expand(res.covs, batch, 3),
        _expand(res.predicted_means, batch, 2),
        _expand(res.predicted_covs, batch, 3),
        _expand(res.log_likelihoods, batch, 1),
    )


def _smooth(
    mdl: PreparedLGSSM,
    f: KalmanFilterResult,
    method: str,
    ASig: Optional[Tensor] = None,
    steady_from: Optional[int] = None,
    steady_state_tol: float = 0.0,
    cache: Optional[SteadyStateCache] = None,
):
    T = mdl.T
    if T == 1:
        empty = f.covs[..., :0, :, :]
        return f.means, f.covs, empty, empty
    if (
        method == "auto"
        and ASig is not None
        and steady_from is not None
        and steady_from < T
        and steady_applicable(mdl, steady_state_tol, PARALLEL_THRESHOLD)
    ):
        fast = steady_smoother(mdl, f, ASig, steady_from, steady_state_tol, cache)
        if fast is not None:
            return fast
        ASig = None  # the general smoother below recomputes A Sigma_t for all t
    parallel = _resolve_method(method, mdl) == "parallel"
    J, h, Pc = smoother_coefficients(mdl, f, ASig, backward_covs=parallel, steady_from=steady_from)
    mT, PT = f.means[..., -1, :], f.covs[..., -1, :, :]
    if parallel:
        means, covs = backward_scan(J, h, Pc, mT, PT)
    else:
        if ASig is None:
            ASig = a_sigma(mdl, f.covs[..., :-1, :, :])
        means = backward_mean_pass(J, h, mT)
        covs = backward_covariance_pass(J, f.covs, ASig, steady_from, steady_state_tol)
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
    steady_state_cache: Optional[SteadyStateCache] = None,
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
    :param steady_state_cache: a :class:`~pyro_seq.ops.kalman_steady.SteadyStateCache`
        that keeps the observation-independent covariance side of the steady-state path
        for later calls with the same parameter values (same results; see its docstring).
    :returns: :class:`KalmanFilterResult` with fields of shape ``batch + (T, S)``,
        ``batch + (T, S, S)``, ``batch + (T, S)``, ``batch + (T, S, S)``, ``batch + (T,)``
        where ``batch`` broadcasts all batch dimensions.
    """
    mdl = _prepare(
        observations,
        initial_loc,
        initial_cov,
        transition_matrix,
        transition_cov,
        observation_matrix,
        observation_cov,
        control_matrix,
        controls,
        mask,
        nan_as_missing,
        validate_args,
    )
    res, _, _ = _filter(mdl, method, steady_state_tol, steady_state_cache)
    return _expand_filter(res, mdl.batch_shape)


def kalman_log_likelihood(
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
    steady_state_cache: Optional[SteadyStateCache] = None,
) -> Tensor:
    """log p(x_{1:T}) = sum_t log p(x_t | x_{1:t-1}) (thesis eq. 3.12): the arguments and
    value of :func:`kalman_filter`'s ``log_likelihoods.sum(-1)``, shape ``batch``. Without
    the filter's other outputs, ``"auto"`` can run the blocked steady-state form of
    :mod:`~pyro_seq.ops.kalman_blocked` (time-invariant parameters shared by the batch, no
    mask or autograd); elsewhere it is the filter's sum. ``steady_state_cache``: as for
    :func:`kalman_filter`."""
    mdl = _prepare(
        observations,
        initial_loc,
        initial_cov,
        transition_matrix,
        transition_cov,
        observation_matrix,
        observation_cov,
        control_matrix,
        controls,
        mask,
        nan_as_missing,
        validate_args,
    )
    if method == "auto" and steady_applicable(mdl, steady_state_tol, PARALLEL_THRESHOLD):
        ll = steady_log_likelihood(mdl, steady_state_tol, steady_state_cache)
        if ll is not None:
            return ll.expand(mdl.batch_shape)
    res, _, _ = _filter(mdl, method, steady_state_tol, steady_state_cache)
    return res.log_likelihoods.sum(-1).expand(mdl.batch_shape)


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
    steady_state_cache: Optional[SteadyStateCache] = None,
) -> KalmanSmootherResult:
    r"""Rauch-Tung-Striebel smoother (thesis Sec. 3.4.1, smoothing) with lag-one covariances.

    mu_{t|T} = mu_t + J_t (mu_{t+1|T} - mu_{t+1|t}),
    Sigma_{t|T} = Sigma_t + J_t (Sigma_{t+1|T} - Sigma_{t+1|t}) J_t^T,
    J_t = Sigma_t A_{t+1}^T Sigma_{t+1|t}^{-1}; computed as
    Sigma_{t|T} = J_t Sigma_{t+1|T} J_t^T + Pc_t with the PSD Joseph-form backward
    covariance Pc_t = (I - J_t A_{t+1}) Sigma_t (I - J_t A_{t+1})^T + J_t Q_{t+1} J_t^T
    (algebraically identical). Cross covariance Cov(z_{t+1}, z_t | x) = Sigma_{t+1|T} J_t^T.

    Arguments as :func:`kalman_filter` (``steady_state_cache`` also keeps the smoother's
    gains and covariances). Where Sigma_{t+1|t} is singular to working
    precision, J_t is the minimum-norm solution of J_t Sigma_{t+1|t} = Sigma_t A_{t+1}^T
    (no inverse of the singular matrix; exact, see the module docstring).

    :returns: :class:`KalmanSmootherResult`: ``means batch + (T, S)``,
        ``covs batch + (T, S, S)``, ``cross_covs batch + (T-1, S, S)``,
        ``gains batch + (T-1, S, S)``, ``filtered`` (:class:`KalmanFilterResult`).
    """
    mdl = _prepare(
        observations,
        initial_loc,
        initial_cov,
        transition_matrix,
        transition_cov,
        observation_matrix,
        observation_cov,
        control_matrix,
        controls,
        mask,
        nan_as_missing,
        validate_args,
    )
    f, ASig, steady_from = _filter(mdl, method, steady_state_tol, steady_state_cache)
    means, covs, cross, J = _smooth(
        mdl, f, method, ASig, steady_from, steady_state_tol, steady_state_cache
    )
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
    steady_state_cache: Optional[SteadyStateCache] = None,
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
    mdl = _prepare(
        observations,
        initial_loc,
        initial_cov,
        transition_matrix,
        transition_cov,
        observation_matrix,
        observation_cov,
        control_matrix,
        controls,
        mask,
        nan_as_missing,
        validate_args,
    )
    f, _, _ = _filter(mdl, method, steady_state_tol, steady_state_cache)
    samples = _sample(mdl, f, sample_shape, noise, method)
    return KalmanSampleResult(samples, _expand_filter(f, mdl.batch_shape))


def _sample(mdl: PreparedLGSSM, f: KalmanFilterResult, sample_shape, noise, method) -> Tensor:
    sample_shape = torch.Size(sample_shape)
    T, S = mdl.T, mdl.S
    shape = sample_shape + mdl.batch_shape + (T, S)
    if noise is None:
        noise = torch.randn(shape, dtype=f.means.dtype, device=f.means.device)
    elif noise.shape != shape:
        raise ValueError(f"noise must have shape {tuple(shape)}; got {tuple(noise.shape)}")
    check_device("noise", noise, f.means.device, "the model's parameters are")
    LT = psd_sqrt(f.covs[..., -1, :, :])
    zT = f.means[..., -1, :] + mv(LT, noise[..., -1, :])
    if T == 1:
        return zT.unsqueeze(-2)
    J, h, Pc = backward_coefficients(mdl, f)
    g = h + mv(psd_sqrt(Pc), noise[..., :-1, :])
    if _resolve_method(method, mdl) == "parallel":
        z, _ = backward_scan(J, g, None, zT, None)
    else:
        z = backward_mean_pass(J, g, zT)
    return z


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
    sizes = [
        p.shape[-3]
        for p in (
            transition_matrix,
            transition_cov,
            observation_matrix,
            observation_cov,
            control_matrix,
        )
        if p is not None and p.dim() > 2
    ]
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
    mdl = _prepare(
        dummy,
        initial_loc,
        initial_cov,
        transition_matrix,
        transition_cov,
        observation_matrix,
        observation_cov,
        control_matrix,
        controls,
        validate_args=validate_args,
    )
    batch = mdl.param_batch_shape
    if noise is None:
        e = torch.randn(
            sample_shape + batch + (T, S), dtype=initial_loc.dtype, device=initial_loc.device
        )
        f = torch.randn(
            sample_shape + batch + (T, D), dtype=initial_loc.dtype, device=initial_loc.device
        )
    else:
        e, f = noise
        check_devices(("initial_loc", initial_loc), ("noise[0]", e), ("noise[1]", f))
    g0 = mdl.init_loc + mv(psd_sqrt(mdl.init_cov), e[..., 0, :])
    if T > 1:
        rest = mv(psd_sqrt(slice_time(mdl.Q, 1, None, 2)), e[..., 1:, :])
        if mdl.b is not None:
            rest = rest + slice_time(mdl.b, 1, None, 1)
        g = cat_time(g0.unsqueeze(-2), rest, 1, T)
    else:
        g = g0.unsqueeze(-2)
    F = mdl.A.expand(mdl.A.shape[:-3] + (T, S, S))
    if _resolve_method(method, mdl) == "parallel":
        z = affine_scan(F, g)
    else:
        z = mean_pass(F, g)
    x = mv(mdl.C, z) + mv(psd_sqrt(mdl.R), f)
    out = broadcast_shapes(sample_shape + batch, z.shape[:-2], x.shape[:-2])
    return LGSSMSample(z.expand(out + (T, S)), x.expand(out + (T, D)))


def psd_sqrt(M: Tensor) -> Tensor:
    """A lower-triangular factor L with L L^T = M for positive *semi*-definite M (..., n, n).

    :func:`~pyro_seq.ops.linalg.jitter_cholesky`: Cholesky, with a growing diagonal jitter for
    the matrices where it fails (singular, e.g. a zero transition noise); an exactly zero matrix
    gets L = 0.
    Raises ``ValueError`` if M is not PSD or not finite. Used only for drawing samples,
    where the jitter (relative 1e-16..1e-11 in float64) is immaterial.
    """
    return jitter_cholesky(M, "matrix")
