r"""Inference in :class:`~pyro_seq.distributions.linear_gaussian_ssm.LinearGaussianSSM` given
observations x_{1:T} (thesis Sec. 3.4): the Kalman filter (thesis eq. 3.11), the RTS smoother,
posterior draws by forward-filtering backward-sampling and forecasts, with the missing data of
thesis Sec. 3.4.2.

Missing data come in two explicit kinds, a per-element ``observation_mask`` ``(..., T, D)`` and a
per-step ``step_mask`` ``(..., T)`` (True = observed), combined with ``and``
(:func:`resolve_masks`); masked entries are replaced by zeros before any arithmetic, so that a
NaN there reaches neither values nor gradients. The class inherits :class:`LGSSMInference`; the
model is in the docstring of :mod:`pyro_seq.distributions.linear_gaussian_ssm`.
"""

from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch.types import _size

from pyro_seq.distributions.lgssm_hmm import (
    LGSSMFilterResult,
    LGSSMForecast,
    expand_filter,
    expand_to,
)
from pyro_seq.ops.kalman import (
    KalmanSmootherResult,
    SteadyStateCache,
    kalman_filter,
    kalman_sample,
    kalman_smoother,
)
from pyro_seq.ops.lgssm import LGSSMParams
from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.validation import all_finite, as_bool_mask, check_device

__all__ = ["LGSSMInference", "expand_mask", "resolve_masks", "time_size"]


def time_size(p: Optional[Tensor], event_ndim: int) -> Optional[int]:
    """The length of the time dimension of a parameter ``p`` ``(..., [T,] *event)`` with
    ``event_ndim`` event dimensions (the one just left of them), or None when ``p`` is None or
    has no time dimension."""
    if p is None or p.dim() <= event_ndim:
        return None
    return p.shape[-event_ndim - 1]


def resolve_masks(
    observation_mask: Optional[Tensor], step_mask: Optional[Tensor], T: Optional[int], D: int
) -> Tuple[Optional[Tensor], Optional[int]]:
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


def expand_mask(mask: Tensor, T: int, D: int, name: str = "mask") -> Tensor:
    """A mask ``(..., T|1, D|1)`` from :func:`resolve_masks` expanded to ``(..., T, D)``.

    :raises ValueError: naming ``name``, when its time dimension is neither 1 nor ``T``.
    """
    if mask.shape[-2] not in (1, T):
        raise ValueError(f"{name} covers {mask.shape[-2]} time steps, the observations {T}")
    return mask.expand(mask.shape[:-2] + (T, D))


_DEFAULT = object()  # "use the constructor's value"


class LGSSMInference:
    """Filtering, smoothing, posterior draws and forecasts of a
    :class:`~pyro_seq.distributions.linear_gaussian_ssm.LinearGaussianSSM` given observations
    x_{1:T} ``(..., T, D)``, and the check of those observations and their masks (a part of the
    class, whose constructor sets the parameters below)."""

    # set by LinearGaussianSSM's constructor
    initial_loc: Tensor
    transition_matrix: Tensor
    transition_cov: Tensor
    observation_matrix: Tensor
    observation_cov: Tensor
    control_matrix: Optional[Tensor]
    controls: Optional[Tensor]
    observation_offset: Optional[Tensor]
    observation_mask: Optional[Tensor]
    num_steps: Optional[int]
    hidden_dim: int
    obs_dim: int
    method: str
    nan_as_missing: bool
    _validate_args: bool

    if TYPE_CHECKING:  # the parameter bundle and the torch distribution's batch shape

        @property
        def params(self) -> LGSSMParams: ...

        @property
        def batch_shape(self) -> torch.Size: ...

    def _params(self) -> Dict[str, Any]:
        # validated once at construction (or switched off by the user): not again per call
        return dict(self.params._asdict(), controls=self.controls, validate_args=False)

    def _inference_params(self) -> Dict[str, Any]:
        """:meth:`_params` and this instance's :class:`~pyro_seq.ops.SteadyStateCache`: the
        Riccati recursion of a time-invariant model does not depend on the observations, so
        it runs once per instance (as ``GaussianHMM`` builds its factors once); the cache
        compares the parameters' values on every call, results are unchanged."""
        cache = self.__dict__.get("_steady_cache")
        if cache is None:
            cache = self.__dict__["_steady_cache"] = SteadyStateCache()
        return dict(self._params(), steady_state_cache=cache)

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
        observation_mask: Optional[Tensor] = None,
        step_mask: Optional[Tensor] = None,
        num_steps: Any = _DEFAULT,
        default_mask: Any = _DEFAULT,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Check ``x (..., T, D)`` and resolve its mask (``num_steps`` and ``default_mask``
        default to the constructor's; :meth:`predict` passes others). Returns ``(x', mask)``:
        ``x'`` has zeros at masked entries (``torch.where``, so a NaN there reaches neither
        values nor gradients) and the offset d_t subtracted; ``mask`` bool ``(..., T, D)`` or
        None."""
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
            mask, _ = resolve_masks(observation_mask, step_mask, T, D)
        if mask is not None:
            mask = expand_mask(mask, T, D)
        if self.nan_as_missing:
            nan = torch.isnan(x)
            if bool(nan.any()):
                mask = ~nan if mask is None else mask & ~nan
        if self._validate_args and not all_finite(x):
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

    def _out_batch(self, value: Tensor) -> torch.Size:
        return broadcast_shapes(self.batch_shape, value.shape[:-2])

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
        res = kalman_filter(xc, **self._inference_params(), mask=mask, method=self.method)
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
        res = kalman_smoother(xc, **self._inference_params(), mask=mask, method=self.method)
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
        sample_shape: _size = torch.Size(),
        observation_mask: Optional[Tensor] = None,
        noise: Optional[Tensor] = None,
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
            **self._inference_params(),
            mask=mask,
            sample_shape=sample_shape,
            noise=noise,
            method=self.method,
        )
        return res.samples

    def rsample_posterior(
        self, value: Tensor, sample_shape: _size = torch.Size(), noise: Optional[Tensor] = None
    ) -> Tensor:
        """Reparameterized draws of z_{1:T} given x_{1:T}, with the signature and shapes of
        Pyro's ``GaussianHMM.rsample_posterior(value, sample_shape)``: returns
        ``sample_shape + broadcast(batch_shape, value.shape[:-2]) + (T, S)``. Unlike
        GaussianHMM there is no z_0 to drop (this class starts at z_1; see
        :meth:`~pyro_seq.distributions.linear_gaussian_ssm.LinearGaussianSSM.from_gaussian_hmm`),
        and the constructor's masks apply. Same as :meth:`sample_posterior`."""
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
                    time_size(p, 2) not in (None, 1)
                    for p in (
                        self.transition_matrix,
                        self.transition_cov,
                        self.observation_matrix,
                        self.observation_cov,
                        self.control_matrix,
                    )
                )
                or self.controls is not None
                or time_size(self.observation_offset, 1) not in (None, 1)
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
        batch = broadcast_shapes(self.batch_shape, x.shape[:-2], means.shape[:-2])
        return LGSSMForecast(
            expand_to(means, batch, 2),
            expand_to(covs, batch, 3),
            expand_to(m, batch, 2),
            expand_to(P, batch, 3),
        )
