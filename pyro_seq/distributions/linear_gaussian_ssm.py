r"""Linear-Gaussian state-space model as a Pyro distribution over observation sequences.

The generative model (thesis eqs. 3.4-3.8, column vectors)::

    z_1 ~ N(initial_loc, initial_cov)
    z_t = A_t z_{t-1} + B_t u_t + eps_t,  eps_t ~ N(0, Q_t)          (3.4, 3.6)
    x_t = C_t z_t + d_t + delta_t,        delta_t ~ N(0, R_t)        (3.5, 3.7)

with an optional observation offset ``d_t`` (Pyro's ``GaussianHMM`` calls it the mean of
``observation_dist``; the thesis has ``d_t = 0``). ``LinearGaussianSSM`` is the marginal
p(x_{1:T}) with z integrated out exactly by the Kalman filter (eq. 3.12); all inference is
delegated to :mod:`pyro_seq.ops.kalman`, this class handles shapes, masks, validation and
Pyro's distribution protocol. The offset is exact to handle at this level: p(x | d) is the
offset-free model evaluated at ``x - d``.

Missing data (thesis Sec. 3.4.2) come in two explicit kinds that cannot be confused:

* ``observation_mask``: per element, bool ``(..., T, D)``, True = observed;
* ``step_mask``: per time step, bool ``(..., T)``, True = step observed.

Both may be given (they are combined with ``and``). With ``nan_as_missing=True`` NaN entries of
the observations are treated as missing as well. Masked entries may hold any value, NaN
included; they are replaced by zeros (``torch.where``) before any arithmetic, so neither the
value nor the gradients can be poisoned by them (Pyro issue #2654).
"""

from typing import Any, Dict, Optional, Tuple

import torch
from pyro.distributions import GaussianHMM, constraints
from pyro.distributions.torch_distribution import TorchDistribution
from torch import Tensor
from torch.distributions import Distribution
from torch.types import _size

from pyro_seq.distributions.lgssm_hmm import (
    LGSSMFilterResult,
    LGSSMForecast,
    conjugate_update,
    from_gaussian_hmm,
    prefix_condition,
)
from pyro_seq.distributions.lgssm_inference import (
    LGSSMInference,
    expand_mask,
    resolve_masks,
    time_size,
)
from pyro_seq.ops.kalman import kalman_log_likelihood, lgssm_sample
from pyro_seq.ops.lgssm import LGSSMParams
from pyro_seq.ops.lgssm import check_devices as _check_devices
from pyro_seq.ops.lgssm import covariance_ok as _covariance_ok
from pyro_seq.ops.lgssm import validate_parameters as _validate_parameters
from pyro_seq.ops.linalg import broadcast_shapes as _broadcast_shapes
from pyro_seq.pyro_internals import default_validate_args

__all__ = ["LinearGaussianSSM", "LGSSMFilterResult", "LGSSMForecast"]


class _Covariance(constraints.Constraint):
    """Symmetric positive (semi-)definite matrices with the tolerances of
    :func:`pyro_seq.ops.kalman.covariance_problem` (``torch``'s own constraints use an absolute
    1e-6 symmetry tolerance and reject singular PSD matrices whose smallest eigenvalue rounds
    below 0)."""

    event_dim = 2

    def __init__(self, definite: bool) -> None:
        self.definite = definite
        super().__init__()

    def check(self, value: Tensor) -> Tensor:
        return _covariance_ok(value, self.definite)


_PARAM_NAMES = (
    "initial_loc",
    "initial_cov",
    "transition_matrix",
    "transition_cov",
    "observation_matrix",
    "observation_cov",
    "control_matrix",
    "controls",
    "observation_offset",
)


class LinearGaussianSSM(LGSSMInference, TorchDistribution):
    r"""Exact linear-Gaussian state-space model p(x_{1:T}) (thesis Sec. 3.4).

    Event shape ``(T, obs_dim)``; batch shape broadcasts the batch dimensions of all
    arguments. Shapes align from the right as in Pyro's ``GaussianHMM``: for a matrix
    parameter the dimension just left of the matrix dims is time (size T or 1) if present,
    and everything left of it is batch. Transition parameters (A, Q, B u) at time entry t
    describe the transition *into* step t, so entry 0 is unused.

    :param initial_loc: mu_{1|0}, ``(..., S)``.
    :param initial_cov: Sigma_{1|0}, ``(..., S, S)`` symmetric positive *semi*-definite
        (a singular one, e.g. a known initial state, is allowed: the filter never factorises
        it alone).
    :param transition_matrix: A_t, ``(..., [T|1,] S, S)``.
    :param transition_cov: Q_t, ``(..., [T|1,] S, S)`` symmetric positive *semi*-definite
        (e.g. noise-free components). The RTS smoother and FFBS factorise the predicted
        covariance A_t Sigma_{t-1} A_t^T + Q_t; if that is singular they raise a
        ``ValueError`` naming it.
    :param observation_matrix: C_t, ``(..., [T|1,] D, S)``.
    :param observation_cov: R_t, ``(..., [T|1,] D, D)`` symmetric positive definite (so that
        every innovation covariance C P C^T + R of eq. 3.12 is, and p(x) has a density).
    :param control_matrix: B_t, ``(..., [T|1,] S, U)`` or None.
    :param controls: u_t, ``(..., T|1, U)``; with ``control_matrix=None`` the controls are
        added to the state directly (U = S).
    :param int num_steps: T >= 1; needed only when no argument has a time dimension of size T.
        If omitted and all parameters are constant in time, the event shape is ``(1, D)``
        and :meth:`log_prob`, :meth:`filter`, :meth:`smooth` accept any length (as with
        ``GaussianHMM``), while :meth:`rsample` needs ``num_steps``.
    :param observation_mask: per-element mask, bool ``(..., T, D)`` (or ``(..., T, 1)``),
        True = observed. Masked entries are marginalised out of :meth:`log_prob` (thesis
        Sec. 3.4.2: the rows of C_t and R_t are deleted); they may hold any value, including
        NaN. Also the default mask of :meth:`filter`, :meth:`smooth`,
        :meth:`sample_posterior` and :meth:`predict`. For backward compatibility a per-step
        mask ``(..., T)`` is still accepted here when its shape cannot be per element; a
        mask ending in ``(D, D)`` with ``T == D`` (or T unknown) is refused as ambiguous.
    :param step_mask: per-step mask, bool ``(..., T)`` (or a scalar), True = step observed;
        combined with ``observation_mask`` by ``and``. When it is given,
        ``observation_mask`` is always read per element.
    :param observation_offset: d_t, ``(..., T|1, D)`` or ``(D,)`` (time-constant), added to
        the mean of x_t: x_t = C_t z_t + d_t + delta_t. None means 0.
    :param bool nan_as_missing: treat NaN observations as missing (combined with the masks
        by ``and``). Off by default: NaN at an unmasked entry is an error under
        ``validate_args``, since it usually means corrupted data.
    :param str method: ``"auto"``, ``"sequential"`` or ``"parallel"`` (see
        :func:`pyro_seq.ops.kalman_filter`). With ``"auto"``, time-invariant parameters, no
        mask and no gradient, the filter takes its steady-state path, whose covariance side
        does not depend on the observations: the instance keeps it
        (:class:`~pyro_seq.ops.SteadyStateCache`, keyed on the parameters' values), so that
        later ``log_prob``, ``filter``, ``smooth`` and ``sample_posterior`` calls on other
        observations run only the data side (same results).

    Validation (``validate_args``, on by default as for every torch distribution): every
    parameter must be finite, covariances symmetric to ````pyro_seq.ops.kalman.COV_TOL_EPS```` machine epsilons
    relative (they are never symmetrised silently) and positive (semi-)definite as above;
    observations must be finite wherever they are not masked (NaN or +-inf at an observed
    entry raises a ``ValueError`` naming ``observation_mask``). Shapes and ``T >= 1`` are
    always checked.

    Drop-in for Pyro's ``GaussianHMM`` (see :meth:`from_gaussian_hmm` for the parameter map):
    ``duration``, ``log_prob``, ``rsample``, ``rsample_posterior``, ``filter`` (the final-state
    ``MultivariateNormal``, which here also carries every step), ``prefix_condition`` and
    ``conjugate_update`` behave as GaussianHMM's; the last one refuses masked models.

    Example::

        d = LinearGaussianSSM(mu0, P0, A, Q, C, R, num_steps=100)
        with pyro.plate("sequences", x.shape[0]):
            pyro.sample("x", d, obs=x)
    """

    has_rsample = True
    support = constraints.independent(constraints.real, 2)

    @property
    def arg_constraints(self) -> Dict[str, constraints.Constraint]:
        cons = {
            "initial_loc": constraints.real_vector,
            "initial_cov": _Covariance(definite=False),
            "transition_matrix": constraints.independent(constraints.real, 2),
            "transition_cov": _Covariance(definite=False),
            "observation_matrix": constraints.independent(constraints.real, 2),
            "observation_cov": _Covariance(definite=True),
        }
        if self.__dict__.get("control_matrix") is not None:
            cons["control_matrix"] = constraints.independent(constraints.real, 2)
        if self.__dict__.get("controls") is not None:
            cons["controls"] = constraints.independent(constraints.real, 2)
        if self.__dict__.get("observation_offset") is not None:
            cons["observation_offset"] = constraints.real_vector
        return cons

    def __init__(
        self,
        initial_loc: Tensor,
        initial_cov: Tensor,
        transition_matrix: Tensor,
        transition_cov: Tensor,
        observation_matrix: Tensor,
        observation_cov: Tensor,
        control_matrix: Optional[Tensor] = None,
        controls: Optional[Tensor] = None,
        num_steps: Optional[int] = None,
        observation_mask: Optional[Tensor] = None,
        validate_args: Optional[bool] = None,
        method: str = "auto",
        *,
        step_mask: Optional[Tensor] = None,
        observation_offset: Optional[Tensor] = None,
        nan_as_missing: bool = False,
    ) -> None:
        S = initial_loc.shape[-1]
        D = observation_matrix.shape[-2]
        if observation_matrix.shape[-1] != S:
            raise ValueError(f"observation_matrix must end in (D, {S})")
        if observation_offset is not None and observation_offset.shape[-1] != D:
            raise ValueError(
                f"observation_offset must end in D = {D}; got {tuple(observation_offset.shape)}"
            )
        if num_steps is not None and (int(num_steps) != num_steps or num_steps < 1):
            raise ValueError(f"num_steps must be a positive integer (T >= 1); got {num_steps}")
        # one device for every tensor (always checked: no host synchronisation)
        _check_devices(
            ("initial_loc", initial_loc),
            ("initial_cov", initial_cov),
            ("transition_matrix", transition_matrix),
            ("transition_cov", transition_cov),
            ("observation_matrix", observation_matrix),
            ("observation_cov", observation_cov),
            ("control_matrix", control_matrix),
            ("controls", controls),
            ("observation_offset", observation_offset),
            ("observation_mask", observation_mask),
            ("step_mask", step_mask),
        )
        self.initial_loc = initial_loc
        self.initial_cov = initial_cov
        self.transition_matrix = transition_matrix
        self.transition_cov = transition_cov
        self.observation_matrix = observation_matrix
        self.observation_cov = observation_cov
        self.control_matrix = control_matrix
        self.controls = controls
        self.observation_offset = observation_offset
        self.nan_as_missing = bool(nan_as_missing)
        self.hidden_dim = S
        self.obs_dim = D
        self.method = method

        named = [
            ("transition_matrix", transition_matrix, 2),
            ("transition_cov", transition_cov, 2),
            ("observation_matrix", observation_matrix, 2),
            ("observation_cov", observation_cov, 2),
            ("control_matrix", control_matrix, 2),
            ("controls", controls, 1),
            ("observation_offset", observation_offset, 1),
        ]
        for name, p, ev in named:
            if time_size(p, ev) == 0:
                raise ValueError(f"{name} has a time dimension of size 0; T must be >= 1")
        sizes = [s for s in (time_size(p, ev) for _, p, ev in named) if s is not None and s > 1]
        if num_steps is None and sizes:
            num_steps = sizes[0]
        mask, num_steps = resolve_masks(observation_mask, step_mask, num_steps, D)
        if num_steps == 0:
            raise ValueError("the masks have a time dimension of size 0; T must be >= 1")
        for s in sizes:
            if s != num_steps:
                raise ValueError(f"time dimensions disagree: {s} vs num_steps={num_steps}")
        if mask is not None and num_steps is not None:
            mask = expand_mask(mask, num_steps, D, "the mask")
        self.num_steps = num_steps
        self.observation_mask = mask  # None or bool (..., T, D) ((..., 1, 1) if T is unknown)

        def bshape(p, event_ndim):
            if p is None:
                return ()
            return p.shape[: max(p.dim() - event_ndim - 1, 0)]

        batch_shape = _broadcast_shapes(
            initial_loc.shape[:-1],
            initial_cov.shape[:-2],
            bshape(transition_matrix, 2),
            bshape(transition_cov, 2),
            bshape(observation_matrix, 2),
            bshape(observation_cov, 2),
            bshape(control_matrix, 2),
            bshape(controls, 1),
            bshape(observation_offset, 1),
            bshape(mask, 1),
        )
        event_shape = torch.Size((num_steps if num_steps is not None else 1, D))
        validate = validate_args if validate_args is not None else default_validate_args()
        if validate:
            self._validate_parameters()
        # the parameters were validated above with messages that name the problem
        super().__init__(batch_shape, event_shape, validate_args=False)
        self._validate_args = bool(validate)

    @property
    def duration(self) -> Optional[int]:
        """T, the length of the time axis ``event_shape[0]``, or None when the model is
        constant in time and no ``num_steps`` was given (the event shape ``(1, D)`` then
        broadcasts to any length), as ``GaussianHMM.duration``."""
        return self.num_steps

    def _validate_parameters(self):
        """The Kalman ops' parameter checks (one validator, the same messages)."""
        _validate_parameters(
            *self.params, self.controls, ("observation_offset", self.observation_offset)
        )

    @classmethod
    def from_scale_tril(
        cls,
        initial_loc: Tensor,
        initial_scale_tril: Tensor,
        transition_matrix: Tensor,
        transition_scale_tril: Tensor,
        observation_matrix: Tensor,
        observation_scale_tril: Tensor,
        **kwargs: Any,
    ) -> "LinearGaussianSSM":
        """Build from lower-triangular square roots ``L`` of the covariances (``cov = L L^T``).

        A convenience for parameterisations that learn Cholesky factors (any real lower
        triangle gives a valid PSD covariance, so no constraint is needed); the recursions then
        run on ``L L^T`` as with the main constructor. Shapes as for the constructor, with each
        ``*_scale_tril`` shaped like the covariance it replaces. Other keywords are passed on.
        """

        def cov(L):
            L = L.tril()
            return L @ L.transpose(-1, -2)

        return cls(
            initial_loc,
            cov(initial_scale_tril),
            transition_matrix,
            cov(transition_scale_tril),
            observation_matrix,
            cov(observation_scale_tril),
            **kwargs,
        )

    @classmethod
    def from_gaussian_hmm(
        cls, hmm: GaussianHMM, num_steps: Optional[int] = None, **kwargs: Any
    ) -> "LinearGaussianSSM":
        r"""The same distribution as a Pyro :class:`~pyro.distributions.GaussianHMM`.

        ``GaussianHMM(initial_dist, transition_matrix, transition_dist, observation_matrix,
        observation_dist)`` is the row-vector model (its docstring)::

            z_0 ~ initial_dist                                  (not observed)
            z_t = z_{t-1} @ M_t + e_t,   e_t ~ transition_dist_t   = N(b_t, Q_t)   t = 1..T
            x_t = z_t @ H_t + v_t,       v_t ~ observation_dist_t  = N(d_t, R_t)

        In the column-vector form of eqs. 3.4-3.5 this is ``A_t = M_t^T``, ``C_t = H_t^T``,
        state offsets ``b_t`` (``controls`` with ``control_matrix=None``), observation offsets
        ``d_t`` and, because its first observation is of z_1 = z_0 M_1 + e_1,

            mu_{1|0} = M_1^T mu_0 + b_1,    Sigma_{1|0} = M_1^T Sigma_0 M_1 + Q_1,

        with (mu_0, Sigma_0) the moments of ``initial_dist``; entries t >= 2 of M, Q, b are the
        transitions into z_t, the time entries of this class (entry 0 unused). GaussianHMM
        keeps only the Gaussian factors (information vectors and precisions) of its
        arguments; A, C, Q, R and the offsets are recovered from them (block
        ``[z_{t-1}, z_t]`` of the transition precision is ``-M P``, ``P = Q^{-1}``), which is
        exact up to rounding (one Cholesky inverse per precision). Diagonal-normal noise
        (``Independent(Normal)``) is read exactly.

        :param hmm: a :class:`pyro.distributions.GaussianHMM`.
        :param int num_steps: T; default ``hmm.duration``, else the length of its time
            dimension (homogeneous HMMs then accept any length, as GaussianHMM does).
        :param kwargs: passed on to the constructor (``observation_mask``, ``method``, ...).
        :returns: a :class:`LinearGaussianSSM` with ``batch_shape == hmm.batch_shape`` and
            ``log_prob``, filter and posterior equal to the HMM's.
        """
        return from_gaussian_hmm(cls, hmm, num_steps, **kwargs)

    # ----------------------------------------------------------------------------------
    # Pyro / torch distribution protocol
    # ----------------------------------------------------------------------------------

    def expand(
        self, batch_shape: _size, _instance: Optional["LinearGaussianSSM"] = None
    ) -> "LinearGaussianSSM":
        new = self._get_checked_instance(LinearGaussianSSM, _instance)
        batch_shape = torch.Size(batch_shape)
        for name in _PARAM_NAMES + (
            "num_steps",
            "observation_mask",
            "hidden_dim",
            "obs_dim",
            "method",
            "nan_as_missing",
        ):
            setattr(new, name, getattr(self, name))
        # parameters stay unexpanded (all computations broadcast); results are expanded
        super(LinearGaussianSSM, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self.__dict__.get("_validate_args")
        return new

    @property
    def params(self) -> LGSSMParams:
        """The parameters as one :class:`~pyro_seq.ops.lgssm.LGSSMParams` (the controls and
        the observation offset are not parameters of the bundle)."""
        return LGSSMParams(
            self.initial_loc,
            self.initial_cov,
            self.transition_matrix,
            self.transition_cov,
            self.observation_matrix,
            self.observation_cov,
            self.control_matrix,
        )

    def log_prob(self, value: Tensor) -> Tensor:
        """Exact log p(x_{1:T}) = sum_t log p(x_t | x_{1:t-1}) (thesis eq. 3.12), over the
        observed entries. ``value`` ``(..., T, D)`` -> ``broadcast(batch_shape, ...)``.
        Differentiable in every parameter and in ``value`` (gradient 0 at masked entries)."""
        x, mask = self._data(value)
        ll = kalman_log_likelihood(x, **self._inference_params(), mask=mask, method=self.method)
        return ll.expand(self._out_batch(value))

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        """Reparameterized draws of x_{1:T}: ``sample_shape + batch_shape + (T, D)``.
        The observation mask is ignored (every entry is drawn)."""
        return self.rsample_with_states(sample_shape)[1]

    def rsample_with_states(self, sample_shape: _size = torch.Size()) -> Tuple[Tensor, Tensor]:
        """Joint reparameterized draws ``(states, observations)`` of shapes
        ``sample_shape + batch_shape + (T, S)`` and ``sample_shape + batch_shape + (T, D)``
        (thesis eqs. 3.4-3.5, see :func:`pyro_seq.ops.lgssm_sample`)."""
        if self.num_steps is None:
            raise ValueError("sampling a time-homogeneous LinearGaussianSSM needs num_steps")
        shape = torch.Size(sample_shape) + self.batch_shape
        T, S, D = self.num_steps, self.hidden_dim, self.obs_dim
        dtype, device = self.initial_loc.dtype, self.initial_loc.device
        noise = (
            torch.randn(shape + (T, S), dtype=dtype, device=device),
            torch.randn(shape + (T, D), dtype=dtype, device=device),
        )
        out = lgssm_sample(**self._params(), num_steps=T, noise=noise, method=self.method)
        x = out.observations
        if self.observation_offset is not None:
            x = x + self.observation_offset
        return out.states.expand(shape + (T, S)), x.expand(shape + (T, D))

    # ----------------------------------------------------------------------------------
    # GaussianHMM's conditioning members
    # ----------------------------------------------------------------------------------

    def prefix_condition(self, data: Tensor) -> "LinearGaussianSSM":
        """p(x_{t+1:T} | x_{1:t}) for ``data = x_{1:t}`` ``(..., t, D)``, 1 <= t < T, as
        ``GaussianHMM.prefix_condition``: a :class:`LinearGaussianSSM` with event shape
        ``(T - t, D)`` and batch shape ``broadcast(batch_shape, data.shape[:-2])``.

        The conditional is the same model started from the filter's one-step prediction,
        ``initial_loc = m_{t+1|t}``, ``initial_cov = P_{t+1|t}`` (thesis eq. 3.11), with every
        time-varying parameter, control, offset and the constructor's mask cut to steps
        t+1..T (entry t, the transition into step t+1, becomes the unused entry 0). The
        constructor's mask over steps 1..t applies to ``data``.
        """
        return prefix_condition(self, data, LinearGaussianSSM)

    def conjugate_update(self, other: Distribution) -> Tuple["LinearGaussianSSM", Tensor]:
        r"""Fuse a Gaussian likelihood of the observations, as ``GaussianHMM.conjugate_update``:
        returns ``(updated, log_normalizer)`` with

            self.log_prob(x) + other.log_prob(x) == updated.log_prob(x) + log_normalizer.

        ``other`` is ``Independent(Normal, 2)`` or ``Independent(MultivariateNormal, 1)`` with
        event shape ``(T, D)``: independent factors g_t(x_t) = N(x_t; l_t, G_t). The product
        is again a linear-Gaussian state-space model (the family is closed under it):

        * ``log_normalizer`` = log N(l; E x, Cov x + diag_t G_t), the ``log_prob`` of ``l``
          under this model with observation noise R_t + G_t (thesis eq. 3.12);
        * x_t | z_t has R'_t = R_t - R_t (R_t + G_t)^{-1} R_t, C'_t = G_t (R_t + G_t)^{-1} C_t,
          d'_t = d_t + R_t (R_t + G_t)^{-1} (l_t - d_t) (product of two Gaussians in x_t);
        * z follows its posterior given the pseudo-observations l_t ~ N(C_t z_t + d_t,
          R_t + G_t), written forward: with the backward information filter
          p(l_{t:T} | z_t) ∝ exp(-z^T Λ_t z / 2 + η_t^T z) and N_t = I + Q_t Λ_t,
          A'_t = N_t^{-1} A_t, Q'_t = N_t^{-1} Q_t, state offsets N_t^{-1} (B_t u_t + Q_t η_t)
          (``controls`` of the result, ``control_matrix=None``), and likewise the initial
          state. This is the prior-times-likelihood update with singular Q_t or Λ_t allowed.

        The result has time-varying parameters of length T (``other``'s when ``duration`` is
        None) and batch shape ``broadcast(batch_shape, other.batch_shape)``.
        """
        return conjugate_update(self, other, LinearGaussianSSM)
