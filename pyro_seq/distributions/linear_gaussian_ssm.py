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

from typing import Optional

import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import TorchDistribution
from torch import Tensor

from pyro_seq.distributions.lgssm_hmm import (
    LGSSMFilterResult,
    LGSSMForecast,
    conjugate_update,
    expand_filter,
    expand_to,
    from_gaussian_hmm,
    prefix_condition,
)
from pyro_seq.ops.kalman import (
    KalmanSmootherResult,
    kalman_filter,
    kalman_sample,
    kalman_smoother,
    lgssm_sample,
)
from pyro_seq.ops.lgssm import LGSSMParams
from pyro_seq.ops.lgssm import check_devices as _check_devices
from pyro_seq.ops.lgssm import covariance_ok as _covariance_ok
from pyro_seq.ops.lgssm import validate_parameters as _validate_parameters
from pyro_seq.ops.linalg import broadcast_shapes as _broadcast_shapes
from pyro_seq.pyro_internals import default_validate_args
from pyro_seq.validation import as_bool_mask, check_device

__all__ = ["LinearGaussianSSM", "LGSSMFilterResult", "LGSSMForecast"]


def _time_size(p: Optional[Tensor], event_ndim: int) -> Optional[int]:
    if p is None or p.dim() <= event_ndim:
        return None
    return p.shape[-event_ndim - 1]


class _Covariance(constraints.Constraint):
    """Symmetric positive (semi-)definite matrices with the tolerances of
    :func:`pyro_seq.ops.kalman.covariance_problem` (``torch``'s own constraints use an absolute
    1e-6 symmetry tolerance and reject singular PSD matrices whose smallest eigenvalue rounds
    below 0)."""

    event_dim = 2

    def __init__(self, definite: bool):
        self.definite = definite
        super().__init__()

    def check(self, value):
        return _covariance_ok(value, self.definite)


def _resolve_masks(observation_mask, step_mask, T: Optional[int], D: int):
    """Combine a per-element ``observation_mask`` and a per-step ``step_mask`` into one bool
    mask ``(..., T|1, D|1)`` (True = observed), or None. Returns ``(mask, T)``, with ``T``
    taken from the masks when it was None.

    ``observation_mask`` is per element, ``(..., T, D)`` (a last dimension of 1 broadcasts
    over D). For backward compatibility a per-step mask ``(..., T)`` is still accepted in
    ``observation_mask`` when ``step_mask`` is None and its shape cannot be read per element.
    The one shape that reads both ways, last two dimensions ``(D, D)`` with ``T == D`` (or T
    not known yet), is refused unless ``step_mask`` is given, which makes ``observation_mask``
    per element.
    """
    parts = []
    if step_mask is not None:
        s = as_bool_mask(step_mask, "step_mask")
        if s.dim() == 0:
            s = s.reshape(1)  # broadcasts over time
        elif T is None:
            T = s.shape[-1]
        elif s.shape[-1] != T:
            raise ValueError(
                f"step_mask must have shape (..., T) = (..., {T}) (one flag per time step); got "
                f"{tuple(s.shape)}. Per-element masks go in observation_mask."
            )
        parts.append(s.unsqueeze(-1))
    if observation_mask is not None:
        m = as_bool_mask(observation_mask, "observation_mask")
        strict = step_mask is not None
        elementwise = m.dim() >= 2 and m.shape[-1] in (D, 1) and (T is None or m.shape[-2] == T)
        if (
            elementwise
            and not strict
            and D > 1
            and tuple(m.shape[-2:]) == (D, D)
            and T in (None, D)
        ):
            raise ValueError(
                f"observation_mask of shape {tuple(m.shape)} is ambiguous: with T == D == {D} it "
                "reads both as a per-element mask (..., T, D) and as a per-step mask (..., T). "
                "Pass a per-step mask as step_mask=mask; for a per-element mask pass "
                "step_mask=True (all steps observed) alongside observation_mask=mask."
            )
        if elementwise:
            T = m.shape[-2] if T is None else T
            parts.append(m)
        elif not strict and m.dim() >= 1 and (T is None or m.shape[-1] == T):
            T = m.shape[-1] if T is None else T
            parts.append(m.unsqueeze(-1))  # legacy per-step mask
        else:
            t = "T" if T is None else T
            raise ValueError(
                f"observation_mask must have shape (..., T, D) = (..., {t}, {D}) (per element); "
                f"got {tuple(m.shape)}. Per-step masks (..., T) go in step_mask."
            )
    if not parts:
        return None, T
    mask = parts[0] if len(parts) == 1 else parts[0] & parts[1]
    return mask, T


def _expand_mask(mask: Tensor, T: int, D: int, name: str = "mask") -> Tensor:
    if mask.shape[-2] not in (1, T):
        raise ValueError(f"{name} covers {mask.shape[-2]} time steps, the observations {T}")
    return mask.expand(mask.shape[:-2] + (T, D))


_DEFAULT = object()  # "use the constructor's value"

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


class LinearGaussianSSM(TorchDistribution):
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
        :func:`pyro_seq.ops.kalman_filter`).

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
    def arg_constraints(self):
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
        validate_args=None,
        method: str = "auto",
        *,
        step_mask: Optional[Tensor] = None,
        observation_offset: Optional[Tensor] = None,
        nan_as_missing: bool = False,
    ):
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
            if _time_size(p, ev) == 0:
                raise ValueError(f"{name} has a time dimension of size 0; T must be >= 1")
        sizes = [s for s in (_time_size(p, ev) for _, p, ev in named) if s is not None and s > 1]
        if num_steps is None and sizes:
            num_steps = sizes[0]
        mask, num_steps = _resolve_masks(observation_mask, step_mask, num_steps, D)
        if num_steps == 0:
            raise ValueError("the masks have a time dimension of size 0; T must be >= 1")
        for s in sizes:
            if s != num_steps:
                raise ValueError(f"time dimensions disagree: {s} vs num_steps={num_steps}")
        if mask is not None and num_steps is not None:
            mask = _expand_mask(mask, num_steps, D, "the mask")
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
        initial_loc,
        initial_scale_tril,
        transition_matrix,
        transition_scale_tril,
        observation_matrix,
        observation_scale_tril,
        **kwargs,
    ):
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
    def from_gaussian_hmm(cls, hmm, num_steps: Optional[int] = None, **kwargs):
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

    def expand(self, batch_shape, _instance=None):
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

    def _params(self):
        # validated once at construction (or switched off by the user): not again per call
        return dict(self.params._asdict(), controls=self.controls, validate_args=False)

    def _offset(self, start: int, stop: int) -> Optional[Tensor]:
        """d_t for steps ``start..stop-1``, ``(..., stop-start|1, D)``, or None."""
        d = self.observation_offset
        if d is None:
            return None
        if d.dim() == 1 or d.shape[-2] == 1:
            return d
        if d.shape[-2] < stop:
            raise ValueError(f"observation_offset covers {d.shape[-2]} steps, {stop} are needed")
        return d[..., start:stop, :]

    def _data(
        self,
        x: Tensor,
        observation_mask=None,
        step_mask=None,
        num_steps=_DEFAULT,
        default_mask=_DEFAULT,
    ):
        """Check ``x (..., T, D)`` and resolve its mask (``num_steps`` and ``default_mask``
        default to the constructor's; :meth:`predict` passes others). Returns ``(x', mask)``: ``x'`` has
        zeros at masked entries (``torch.where``, so a NaN there reaches neither values nor
        gradients) and the offset d_t subtracted; ``mask`` bool ``(..., T, D)`` or None."""
        D = self.obs_dim
        if not torch.is_tensor(x) or x.dim() < 2 or x.shape[-1] != D:
            shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
            raise ValueError(f"expected observations of shape (..., T, {D}); got {shape}")
        T = x.shape[-2]
        if T == 0:
            raise ValueError(
                "observations have no time steps (T = 0); LinearGaussianSSM needs T >= 1"
            )
        device = self.initial_loc.device
        check_device("observations", x, device, "the LinearGaussianSSM's parameters are")
        for name, m in (("observation_mask", observation_mask), ("step_mask", step_mask)):
            check_device(name, m, device, "the LinearGaussianSSM's parameters are")
        num_steps = self.num_steps if num_steps is _DEFAULT else num_steps
        if num_steps is not None and T != num_steps:
            raise ValueError(f"expected {num_steps} time steps, got {T}")
        if observation_mask is None and step_mask is None:
            mask = self.observation_mask if default_mask is _DEFAULT else default_mask
        else:
            mask, _ = _resolve_masks(observation_mask, step_mask, T, D)
        if mask is not None:
            mask = _expand_mask(mask, T, D)
        if self.nan_as_missing:
            nan = torch.isnan(x)
            if bool(nan.any()):
                mask = ~nan if mask is None else mask & ~nan
        if self._validate_args:
            bad = ~torch.isfinite(x)
            if mask is not None:
                bad = bad & mask
            if bool(bad.any()):
                n_nan = int((torch.isnan(x) & bad).sum())
                n_inf = int(bad.sum()) - n_nan
                first = tuple(int(i) for i in bad.nonzero()[0])
                what = " and ".join(
                    s
                    for s in (f"{n_nan} NaN" if n_nan else "", f"{n_inf} infinite" if n_inf else "")
                    if s
                )
                raise ValueError(
                    f"observations contain {what} value(s) at entries that are not masked "
                    f"(first at index {first}). Mark missing entries with observation_mask "
                    "(bool (..., T, D), True = observed, e.g. observation_mask=~torch.isnan(x)) or "
                    "step_mask (bool (..., T)), or construct with nan_as_missing=True to treat "
                    "NaN as missing; infinite values are never valid observations."
                )
        if mask is not None:
            x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
            mask = mask.expand(x.shape)  # the full shape: the ops cannot misread it per step
        d = self._offset(0, T)
        if d is not None:
            x = x - d
        return x, mask

    def _out_batch(self, value: Tensor):
        return _broadcast_shapes(self.batch_shape, value.shape[:-2])

    def log_prob(self, value: Tensor) -> Tensor:
        """Exact log p(x_{1:T}) = sum_t log p(x_t | x_{1:t-1}) (thesis eq. 3.12), over the
        observed entries. ``value`` ``(..., T, D)`` -> ``broadcast(batch_shape, ...)``.
        Differentiable in every parameter and in ``value`` (gradient 0 at masked entries)."""
        x, mask = self._data(value)
        res = kalman_filter(x, **self._params(), mask=mask, method=self.method)
        return res.log_likelihoods.sum(-1).expand(self._out_batch(value))

    def rsample(self, sample_shape=torch.Size()) -> Tensor:
        """Reparameterized draws of x_{1:T}: ``sample_shape + batch_shape + (T, D)``.
        The observation mask is ignored (every entry is drawn)."""
        return self.rsample_with_states(sample_shape)[1]

    def rsample_with_states(self, sample_shape=torch.Size()):
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
    # Inference
    # ----------------------------------------------------------------------------------

    def filter(
        self,
        x: Tensor,
        observation_mask: Optional[Tensor] = None,
        step_mask: Optional[Tensor] = None,
    ) -> LGSSMFilterResult:
        """Kalman filter (thesis eq. 3.11). As ``GaussianHMM.filter(value)`` it returns the
        posterior of the final state p(z_T | x_{1:T}), a ``MultivariateNormal`` with batch shape
        ``broadcast(batch_shape, x.shape[:-2])``; the returned :class:`LGSSMFilterResult` also
        has every step's filtered/predicted moments and log-likelihoods (``.means``, ``.covs``,
        ... of :class:`pyro_seq.ops.KalmanFilterResult`). ``x`` ``(..., T, D)``;
        ``observation_mask`` ``(..., T, D)`` / ``step_mask`` ``(..., T)`` replace the
        constructor's masks when either is given."""
        xc, mask = self._data(x, observation_mask, step_mask)
        res = kalman_filter(xc, **self._params(), mask=mask, method=self.method)
        return LGSSMFilterResult(
            expand_filter(res, self._out_batch(x)), validate_args=self._validate_args
        )

    def smooth(
        self,
        x: Tensor,
        observation_mask: Optional[Tensor] = None,
        step_mask: Optional[Tensor] = None,
    ) -> KalmanSmootherResult:
        """RTS smoother: smoothed means ``(..., T, S)``, covs ``(..., T, S, S)``,
        ``cross_covs`` Cov(z_{t+1}, z_t | x) ``(..., T-1, S, S)``, see
        :class:`pyro_seq.ops.KalmanSmootherResult`. Masks as in :meth:`filter`."""
        xc, mask = self._data(x, observation_mask, step_mask)
        res = kalman_smoother(xc, **self._params(), mask=mask, method=self.method)
        batch = self._out_batch(x)
        means, covs, cross_covs, gains = (
            expand_to(r, batch, 3 if i else 2) for i, r in enumerate(res[:4])
        )
        return KalmanSmootherResult(
            means, covs, cross_covs, gains, expand_filter(res.filtered, batch)
        )

    def sample_posterior(
        self,
        x: Tensor,
        sample_shape=torch.Size(),
        observation_mask: Optional[Tensor] = None,
        noise=None,
        step_mask: Optional[Tensor] = None,
    ) -> Tensor:
        """Reparameterized draws of z_{1:T} ~ p(z_{1:T} | x_{1:T}) by forward-filtering
        backward-sampling: ``sample_shape + batch + (T, S)``. ``noise`` (standard normal of
        that shape) fixes the randomness; masks as in :meth:`filter`."""
        xc, mask = self._data(x, observation_mask, step_mask)
        sample_shape = torch.Size(sample_shape)
        batch = self._out_batch(x)
        T = x.shape[-2]
        xc = xc.expand(batch + xc.shape[-2:])
        if noise is None:
            noise = torch.randn(
                sample_shape + batch + (T, self.hidden_dim), dtype=xc.dtype, device=xc.device
            )
        res = kalman_sample(
            xc,
            **self._params(),
            mask=mask,
            sample_shape=sample_shape,
            noise=noise,
            method=self.method,
        )
        return res.samples

    def rsample_posterior(self, value: Tensor, sample_shape=torch.Size(), noise=None) -> Tensor:
        """Reparameterized draws of z_{1:T} given x_{1:T}, with the signature and shapes of
        Pyro's ``GaussianHMM.rsample_posterior(value, sample_shape)``: returns
        ``sample_shape + broadcast(batch_shape, value.shape[:-2]) + (T, S)``. Unlike
        GaussianHMM there is no z_0 to drop (this class starts at z_1; see
        :meth:`from_gaussian_hmm`), and the constructor's masks apply. Same as
        :meth:`sample_posterior`."""
        return self.sample_posterior(value, sample_shape, noise=noise)

    def predict(
        self,
        x: Tensor,
        steps: int,
        observation_mask: Optional[Tensor] = None,
        step_mask: Optional[Tensor] = None,
    ) -> LGSSMForecast:
        """Forecast ``steps`` future observations by treating them as missing (thesis
        Sec. 3.4.2): p(x_{T+k} | x_{1:T}) = N(C m_{T+k} + d_{T+k}, C P_{T+k} C^T + R) with m,
        P the filter's predictions. Time-varying parameters/controls/offsets must cover
        T + steps entries (i.e. ``num_steps == x.shape[-2] + steps``). Masks as in
        :meth:`filter` (the constructor's mask is used when it covers x's T steps).
        Returns :class:`LGSSMForecast`.
        """
        if int(steps) != steps or steps < 1:
            raise ValueError(f"steps must be a positive integer; got {steps}")
        if x.dim() < 2 or x.shape[-1] != self.obs_dim:
            raise ValueError(
                f"expected observations of shape (..., T, {self.obs_dim}); got {tuple(x.shape)}"
            )
        T_obs = x.shape[-2]
        T = T_obs + steps
        if self.num_steps is not None and self.num_steps != T:
            if (
                any(
                    _time_size(p, 2) not in (None, 1)
                    for p in (
                        self.transition_matrix,
                        self.transition_cov,
                        self.observation_matrix,
                        self.observation_cov,
                        self.control_matrix,
                    )
                )
                or self.controls is not None
                or _time_size(self.observation_offset, 1) not in (None, 1)
            ):
                raise ValueError(
                    f"time-varying parameters cover {self.num_steps} steps; predict needs "
                    f"x.shape[-2] + steps = {T}"
                )
        base = self.observation_mask
        if (
            observation_mask is None
            and step_mask is None
            and base is not None
            and base.shape[-2] not in (1, T_obs)
        ):
            base = None  # the constructor's mask covers another length (e.g. T + steps)
        xc, mask = self._data(x, observation_mask, step_mask, num_steps=None, default_mask=base)
        if mask is None:
            mask = torch.ones(T_obs, self.obs_dim, dtype=torch.bool, device=x.device)
        future = torch.zeros(
            mask.shape[:-2] + (steps, self.obs_dim), dtype=torch.bool, device=x.device
        )
        mask = torch.cat([mask, future], -2)
        xp = torch.cat([xc, xc.new_zeros(xc.shape[:-2] + (steps, self.obs_dim))], -2)
        res = kalman_filter(xp, **self._params(), mask=mask, method=self.method)
        m = res.means[..., T_obs:, :]
        P = res.covs[..., T_obs:, :, :]
        C = self.observation_matrix
        R = self.observation_cov
        if C.dim() > 2 and C.shape[-3] > 1:
            C = C[..., T_obs:, :, :]
        if R.dim() > 2 and R.shape[-3] > 1:
            R = R[..., T_obs:, :, :]
        means = (C @ m.unsqueeze(-1)).squeeze(-1)
        d = self._offset(T_obs, T)
        if d is not None:
            means = means + d
        covs = C @ P @ C.mT + R
        covs = 0.5 * (covs + covs.mT)
        batch = _broadcast_shapes(self.batch_shape, x.shape[:-2], means.shape[:-2])
        return LGSSMForecast(
            expand_to(means, batch, 2),
            expand_to(covs, batch, 3),
            expand_to(m, batch, 2),
            expand_to(P, batch, 3),
        )

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

    def conjugate_update(self, other):
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
