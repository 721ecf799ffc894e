r"""Linear-Gaussian state-space model as a Pyro distribution over observation sequences.

The generative model (thesis eqs. 3.4-3.8, column vectors)::

    z_1 ~ N(initial_loc, initial_cov)
    z_t = A_t z_{t-1} + B_t u_t + eps_t,  eps_t ~ N(0, Q_t)    (3.4)
    x_t = C_t z_t + delta_t,              delta_t ~ N(0, R_t)  (3.5)

``LinearGaussianSSM`` is the marginal p(x_{1:T}) with z integrated out exactly by the Kalman
filter (eq. 3.12); all inference is delegated to :mod:`pyro_seq.ops.kalman`, this class only
handles shapes and Pyro's distribution protocol.
"""

from typing import NamedTuple, Optional

import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import TorchDistribution
from torch import Tensor

from pyro_seq.ops.kalman import (
    KalmanFilterResult,
    KalmanSmootherResult,
    _broadcast_shapes,
    _element_mask,
    kalman_filter,
    kalman_sample,
    kalman_smoother,
    lgssm_sample,
)

__all__ = ["LinearGaussianSSM", "LGSSMForecast"]


class LGSSMForecast(NamedTuple):
    """Forecast of ``steps`` future steps given x_{1:T} (thesis Sec. 3.4.2).

    ``means (..., steps, D)`` and ``covs (..., steps, D, D)`` of p(x_{T+k} | x_{1:T});
    ``state_means (..., steps, S)`` and ``state_covs (..., steps, S, S)`` of p(z_{T+k} | x_{1:T}).
    """

    means: Tensor
    covs: Tensor
    state_means: Tensor
    state_covs: Tensor


def _time_size(p: Optional[Tensor], event_ndim: int) -> Optional[int]:
    if p is None or p.dim() <= event_ndim:
        return None
    return p.shape[-event_ndim - 1]


class LinearGaussianSSM(TorchDistribution):
    r"""Exact linear-Gaussian state-space model p(x_{1:T}) (thesis Sec. 3.4).

    Event shape ``(T, obs_dim)``; batch shape broadcasts the batch dimensions of all
    arguments. Shapes align from the right as in Pyro's ``GaussianHMM``: for a matrix
    parameter the dimension just left of the matrix dims is time (size T or 1) if present,
    and everything left of it is batch. Transition parameters (A, Q, B u) at time entry t
    describe the transition *into* step t, so entry 0 is unused.

    :param initial_loc: mu_{1|0}, ``(..., S)``.
    :param initial_cov: Sigma_{1|0}, ``(..., S, S)`` positive definite.
    :param transition_matrix: A_t, ``(..., [T|1,] S, S)``.
    :param transition_cov: Q_t, ``(..., [T|1,] S, S)`` positive semi-definite.
    :param observation_matrix: C_t, ``(..., [T|1,] D, S)``.
    :param observation_cov: R_t, ``(..., [T|1,] D, D)`` positive definite.
    :param control_matrix: B_t, ``(..., [T|1,] S, U)`` or None.
    :param controls: u_t, ``(..., T, U)``; with ``control_matrix=None`` the controls are
        added to the state directly (U = S).
    :param int num_steps: T; needed only when no argument has a time dimension of size T.
        If omitted and all parameters are constant in time, the event shape is ``(1, D)``
        and :meth:`log_prob`, :meth:`filter`, :meth:`smooth` accept any length (as with
        ``GaussianHMM``), while :meth:`rsample` needs ``num_steps``.
    :param observation_mask: bool ``(..., T)`` (per step) or ``(..., T, D)`` (per element),
        True = observed. Masked entries are marginalised out of :meth:`log_prob` (thesis
        Sec. 3.4.2); they may hold any value, including NaN. Default for the ``filter``,
        ``smooth``, ``sample_posterior`` and ``predict`` methods too.
    :param str method: ``"auto"``, ``"sequential"`` or ``"parallel"`` (see
        :func:`pyro_seq.ops.kalman_filter`).

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
            "initial_cov": constraints.positive_definite,
            "transition_matrix": constraints.independent(constraints.real, 2),
            "transition_cov": constraints.positive_semidefinite,
            "observation_matrix": constraints.independent(constraints.real, 2),
            "observation_cov": constraints.positive_definite,
        }
        if self.__dict__.get("control_matrix") is not None:
            cons["control_matrix"] = constraints.independent(constraints.real, 2)
        if self.__dict__.get("controls") is not None:
            cons["controls"] = constraints.independent(constraints.real, 2)
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
    ):
        S = initial_loc.shape[-1]
        D = observation_matrix.shape[-2]
        if observation_matrix.shape[-1] != S:
            raise ValueError(f"observation_matrix must end in (D, {S})")
        self.initial_loc = initial_loc
        self.initial_cov = initial_cov
        self.transition_matrix = transition_matrix
        self.transition_cov = transition_cov
        self.observation_matrix = observation_matrix
        self.observation_cov = observation_cov
        self.control_matrix = control_matrix
        self.controls = controls
        self.hidden_dim = S
        self.obs_dim = D
        self.method = method

        sizes = [
            _time_size(p, 2)
            for p in (transition_matrix, transition_cov, observation_matrix, observation_cov,
                      control_matrix)
        ] + [_time_size(controls, 1)]
        sizes = [s for s in sizes if s is not None and s > 1]
        if num_steps is None and sizes:
            num_steps = sizes[0]
        if observation_mask is not None:
            observation_mask = torch.as_tensor(observation_mask, dtype=torch.bool)
            if num_steps is None:
                elementwise = observation_mask.dim() >= 2 and observation_mask.shape[-1] in (D, 1)
                num_steps = observation_mask.shape[-2 if elementwise else -1]
            observation_mask = _element_mask(observation_mask, num_steps, D)
        for s in sizes:
            if s != num_steps:
                raise ValueError(f"time dimensions disagree: {s} vs num_steps={num_steps}")
        self.num_steps = num_steps
        self.observation_mask = observation_mask  # None or bool (..., T, D)

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
            bshape(observation_mask, 1),
        )
        event_shape = torch.Size((num_steps if num_steps is not None else 1, D))
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    @classmethod
    def from_scale_tril(cls, initial_loc, initial_scale_tril, transition_matrix,
                        transition_scale_tril, observation_matrix, observation_scale_tril, **kwargs):
        """Build from lower-triangular square roots ``L`` of the covariances (``cov = L L^T``).

        A convenience for parameterisations that learn Cholesky factors (any real lower
        triangle gives a valid PSD covariance, so no constraint is needed); the recursions then
        run on ``L L^T`` as with the main constructor. Shapes as for the constructor, with each
        ``*_scale_tril`` shaped like the covariance it replaces. Other keywords are passed on.
        """
        def cov(L):
            L = L.tril()
            return L @ L.transpose(-1, -2)

        return cls(initial_loc, cov(initial_scale_tril), transition_matrix, cov(transition_scale_tril),
                   observation_matrix, cov(observation_scale_tril), **kwargs)

    # ----------------------------------------------------------------------------------
    # Pyro / torch distribution protocol
    # ----------------------------------------------------------------------------------

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(LinearGaussianSSM, _instance)
        batch_shape = torch.Size(batch_shape)
        for name in ("initial_loc", "initial_cov", "transition_matrix", "transition_cov",
                     "observation_matrix", "observation_cov", "control_matrix", "controls",
                     "num_steps", "observation_mask", "hidden_dim", "obs_dim", "method"):
            setattr(new, name, getattr(self, name))
        # parameters stay unexpanded (all computations broadcast); results are expanded
        super(LinearGaussianSSM, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self.__dict__.get("_validate_args")
        return new

    def _params(self):
        return dict(
            initial_loc=self.initial_loc,
            initial_cov=self.initial_cov,
            transition_matrix=self.transition_matrix,
            transition_cov=self.transition_cov,
            observation_matrix=self.observation_matrix,
            observation_cov=self.observation_cov,
            control_matrix=self.control_matrix,
            controls=self.controls,
        )

    def _mask_for(self, value: Tensor, observation_mask):
        mask = self.observation_mask if observation_mask is None else observation_mask
        if mask is None:
            return None
        return _element_mask(torch.as_tensor(mask, dtype=torch.bool), value.shape[-2], self.obs_dim)

    def _check(self, value: Tensor, mask):
        if value.dim() < 2 or value.shape[-1] != self.obs_dim:
            raise ValueError(f"expected observations of shape (..., T, {self.obs_dim})")
        if self.num_steps is not None and value.shape[-2] != self.num_steps:
            raise ValueError(f"expected {self.num_steps} time steps, got {value.shape[-2]}")
        if self._validate_args:
            v = value if mask is None else torch.where(mask, value, torch.zeros_like(value))
            if self.num_steps is not None:
                self._validate_sample(v)
            elif not bool(self.support.check(v).all()):
                raise ValueError("observations must be finite reals (outside masked entries)")

    def _out_batch(self, value: Tensor):
        return _broadcast_shapes(self.batch_shape, value.shape[:-2])

    def log_prob(self, value: Tensor) -> Tensor:
        """Exact log p(x_{1:T}) = sum_t log p(x_t | x_{1:t-1}) (thesis eq. 3.12), over the
        observed entries. ``value`` ``(..., T, D)`` -> ``broadcast(batch_shape, ...)``.
        Differentiable in every parameter and in ``value``."""
        mask = self._mask_for(value, None)
        self._check(value, mask)
        res = kalman_filter(value, **self._params(), mask=mask, method=self.method)
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
        noise = (torch.randn(shape + (T, S), dtype=dtype, device=device),
                 torch.randn(shape + (T, D), dtype=dtype, device=device))
        out = lgssm_sample(**self._params(), num_steps=T, noise=noise, method=self.method)
        return out.states.expand(shape + (T, S)), out.observations.expand(shape + (T, D))

    # ----------------------------------------------------------------------------------
    # Inference
    # ----------------------------------------------------------------------------------

    def filter(self, x: Tensor, observation_mask: Optional[Tensor] = None) -> KalmanFilterResult:
        """Kalman filter (thesis eq. 3.11): filtered/predicted moments and per-step
        log-likelihoods, see :class:`pyro_seq.ops.KalmanFilterResult`. ``x`` ``(..., T, D)``;
        ``observation_mask`` overrides the constructor's mask."""
        mask = self._mask_for(x, observation_mask)
        self._check(x, mask)
        res = kalman_filter(x, **self._params(), mask=mask, method=self.method)
        return _expand_filter(res, self._out_batch(x))

    def smooth(self, x: Tensor, observation_mask: Optional[Tensor] = None) -> KalmanSmootherResult:
        """RTS smoother: smoothed means ``(..., T, S)``, covs ``(..., T, S, S)``,
        ``cross_covs`` Cov(z_{t+1}, z_t | x) ``(..., T-1, S, S)``, see
        :class:`pyro_seq.ops.KalmanSmootherResult`."""
        mask = self._mask_for(x, observation_mask)
        self._check(x, mask)
        res = kalman_smoother(x, **self._params(), mask=mask, method=self.method)
        batch = self._out_batch(x)
        return KalmanSmootherResult(
            *(_expand_to(r, batch, 3 if i else 2) for i, r in enumerate(res[:4])),
            _expand_filter(res.filtered, batch),
        )

    def sample_posterior(self, x: Tensor, sample_shape=torch.Size(),
                         observation_mask: Optional[Tensor] = None, noise=None) -> Tensor:
        """Reparameterized draws of z_{1:T} ~ p(z_{1:T} | x_{1:T}) by forward-filtering
        backward-sampling: ``sample_shape + batch + (T, S)``."""
        mask = self._mask_for(x, observation_mask)
        self._check(x, mask)
        sample_shape = torch.Size(sample_shape)
        batch = self._out_batch(x)
        T = x.shape[-2]
        x = x.expand(batch + x.shape[-2:])
        if noise is None:
            noise = torch.randn(sample_shape + batch + (T, self.hidden_dim), dtype=x.dtype,
                                device=x.device)
        res = kalman_sample(x, **self._params(), mask=mask, sample_shape=sample_shape,
                            noise=noise, method=self.method)
        return res.samples

    def predict(self, x: Tensor, steps: int, observation_mask: Optional[Tensor] = None
                ) -> LGSSMForecast:
        """Forecast ``steps`` future observations by treating them as missing (thesis
        Sec. 3.4.2): p(x_{T+k} | x_{1:T}) = N(C m_{T+k}, C P_{T+k} C^T + R) with m, P the
        filter's predictions. Time-varying parameters/controls must cover T + steps
        entries (i.e. ``num_steps == x.shape[-2] + steps``). Returns :class:`LGSSMForecast`.
        """
        T_obs = x.shape[-2]
        T = T_obs + steps
        if self.num_steps is not None and self.num_steps not in (T,):
            if any(_time_size(p, 2) not in (None, 1) for p in (
                    self.transition_matrix, self.transition_cov, self.observation_matrix,
                    self.observation_cov, self.control_matrix)) or self.controls is not None:
                raise ValueError(
                    f"time-varying parameters cover {self.num_steps} steps; predict needs "
                    f"x.shape[-2] + steps = {T}"
                )
        mask = observation_mask
        if mask is None and self.observation_mask is not None:
            if self.observation_mask.shape[-2] == T_obs:
                mask = self.observation_mask
        if mask is not None:
            mask = _element_mask(torch.as_tensor(mask, dtype=torch.bool), T_obs, self.obs_dim)
        else:
            mask = torch.ones(T_obs, self.obs_dim, dtype=torch.bool, device=x.device)
        future = torch.zeros(mask.shape[:-2] + (steps, self.obs_dim), dtype=torch.bool,
                             device=x.device)
        mask = torch.cat([mask, future], -2)
        xp = torch.cat([x, x.new_zeros(x.shape[:-2] + (steps, self.obs_dim))], -2)
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
        covs = C @ P @ C.mT + R
        covs = 0.5 * (covs + covs.mT)
        batch = _broadcast_shapes(self.batch_shape, x.shape[:-2], means.shape[:-2])
        return LGSSMForecast(
            _expand_to(means, batch, 2), _expand_to(covs, batch, 3),
            _expand_to(m, batch, 2), _expand_to(P, batch, 3),
        )


def _expand_filter(res: KalmanFilterResult, batch) -> KalmanFilterResult:
    return KalmanFilterResult(*(_expand_to(r, batch, n) for r, n in zip(res, (2, 3, 2, 3, 1))))


def _expand_to(t: Tensor, batch, event_ndim: int) -> Tensor:
    ev = t.shape[t.dim() - event_ndim :]
    return t.expand(torch.Size(batch) + ev)
