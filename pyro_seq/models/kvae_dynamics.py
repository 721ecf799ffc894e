r"""The linear-Gaussian half of the KVAE (:mod:`pyro_seq.models.kvae`; thesis Ch. 6, Fraccaro et
al. 2017): the dynamics network that gives the mixture weights ``alpha_t(a_{0:t-1})``, the
matrices ``gamma_t = (A_t, B_t, C_t)`` of thesis eq. 6.10, one Kalman filter step before and
after ``a_t``, the filter of the encodings with missing steps (thesis 6.4, eqs. 6.12-6.13) and
the smoother-sample terms of thesis eq. 6.8.

:class:`~pyro_seq.models.kvae.KVAE` inherits :class:`KVAEDynamics`; the equations are in the
docstring of :mod:`pyro_seq.models.kvae`.
"""

from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

import pyro.distributions as dist
import torch
import torch.nn as nn

from pyro_seq.ops.kalman import (
    kalman_filter,
    kalman_predict,
    kalman_smoother,
    kalman_update,
    psd_sqrt,
)
from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.ops.linalg import mv as _mv
from pyro_seq.validation import validate_inputs, validate_mask

__all__ = ["DynamicsNetwork", "KVAEDynamics", "KVAEFilterResult"]


class KVAEFilterResult(dict):
    """What :meth:`~pyro_seq.models.kvae.KVAE.filter_encodings` returns (a dict with attribute
    access).

    ``a (batch, T, a_dim)``: the encodings used (observed ones, and at missing steps the
    filter's predictions); ``A (batch, T, S, S)``, ``B`` (or None), ``C (batch, T, a_dim, S)``:
    the estimated ``gamma_t``; ``alpha (batch, T, K)``; ``filtered`` and (with
    ``smooth=True``) ``smoothed``: :class:`~pyro_seq.ops.KalmanFilterResult` /
    :class:`~pyro_seq.ops.KalmanSmootherResult` of the LGSSM with those matrices;
    ``a_filtered``, ``a_smoothed (batch, T, a_dim)``: ``C_t E[z_t | ...]``.
    """

    if TYPE_CHECKING:  # the entries, as attributes

        def __getattr__(self, name: str) -> Any: ...

    else:
        __getattr__ = dict.__getitem__


class DynamicsNetwork(nn.Module):
    """``alpha_t(a_{0:t-1})``: ``d_t = LSTM(a_{t-1}, d_{t-1})``, ``alpha_t = softmax(W d_t + b)``.

    ``W`` and ``b`` start at zero (uniform mixture weights). Shapes: :meth:`step`
    ``(..., a_dim), ((..., H), (..., H)) -> (..., K), ((..., H), (..., H))``; :meth:`sequence`
    ``(..., T, a_dim) -> (..., T, K)`` (inputs ``a_{0:T-1}``).
    """

    def __init__(self, a_dim: int, num_modes: int, hidden_dim: int = 50) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.lstm = nn.LSTM(a_dim, hidden_dim, batch_first=True)
        self.out = nn.Linear(hidden_dim, num_modes)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def initial(
        self, like: torch.Tensor, batch_shape: Sequence[int]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        zeros = like.new_zeros(tuple(batch_shape) + (self.hidden_dim,))
        return zeros, zeros

    def step(
        self, a_prev: torch.Tensor, hidden: Tuple[torch.Tensor, torch.Tensor]
    ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        h, c = hidden
        lead = broadcast_shapes(a_prev.shape[:-1], h.shape[:-1], c.shape[:-1])
        flat = [v.expand(lead + v.shape[-1:]).reshape(1, -1, v.shape[-1]) for v in (a_prev, h, c)]
        out, (h, c) = self.lstm(flat[0].transpose(0, 1), (flat[1], flat[2]))
        h = h.reshape(lead + (self.hidden_dim,))
        c = c.reshape(lead + (self.hidden_dim,))
        return torch.softmax(self.out(h), -1), (h, c)

    def sequence(self, a_prev: torch.Tensor) -> torch.Tensor:
        lead, (T, A) = a_prev.shape[:-2], a_prev.shape[-2:]
        out, _ = self.lstm(a_prev.reshape(-1, T, A))
        return torch.softmax(self.out(out), -1).reshape(lead + (T, -1))


class KVAEDynamics:
    """The KVAE's LGSSM with the mixed matrices ``gamma_t`` of thesis eq. 6.10, a part of
    :class:`~pyro_seq.models.kvae.KVAE` (which builds the dynamics network ``dynamics``, the
    start code ``a0``, the base matrices ``A_modes``, ``B_modes``, ``C_modes`` and the buffers
    ``Q``, ``R``, ``init_loc``, ``init_cov``)."""

    # set by KVAE's constructor
    a_dim: int
    z_dim: int
    control_dim: int
    dynamics_frozen: bool
    dynamics: DynamicsNetwork
    a0: torch.Tensor  #: ``(a_dim,)``: the learned starting code ``a_0``
    A_modes: torch.Tensor  #: ``(K, z_dim, z_dim)``: ``A^(k)``
    B_modes: Optional[torch.Tensor]  #: ``(K, z_dim, U)``: ``B^(k)`` (None without controls)
    C_modes: torch.Tensor  #: ``(K, a_dim, z_dim)``: ``C^(k)``
    Q: torch.Tensor
    R: torch.Tensor
    init_loc: torch.Tensor
    init_cov: torch.Tensor

    def mix(self, alpha: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """``(A_t, B_t, C_t)`` of eq. 6.10 from weights ``alpha (..., K)`` (B_t None without
        controls): ``(..., S, S)``, ``(..., S, U)``, ``(..., a_dim, S)``."""
        A = torch.einsum("...k,kij->...ij", alpha, self.A_modes)
        C = torch.einsum("...k,kij->...ij", alpha, self.C_modes)
        B = None if self.B_modes is None else torch.einsum("...k,kij->...ij", alpha, self.B_modes)
        return A, B, C

    def _dynamics_step(self, a_prev, hidden):
        if self.dynamics_frozen:
            with torch.no_grad():
                alpha, hidden = self.dynamics.step(
                    a_prev.detach(), tuple(h.detach() for h in hidden)
                )
            return alpha, hidden
        return self.dynamics.step(a_prev, hidden)

    def _dynamics_sequence(self, a_prev):
        if self.dynamics_frozen:
            with torch.no_grad():
                return self.dynamics.sequence(a_prev.detach())
        return self.dynamics.sequence(a_prev)

    def _predict(self, m, P, prev, hidden, t, u_t=None):
        """One step of the LGSSM before ``a_t`` is seen: ``gamma_t`` from the dynamics network
        (input ``a_{t-1}``), the prediction (eq. 3.11; none at t = 0, where the moments are the
        prior's) and the predictive of ``a_t``. Returns ``(alpha, hidden, m_pred, P_pred, step)``
        with ``step`` a :class:`~pyro_seq.ops.KalmanStep`."""
        alpha, hidden = self._dynamics_step(prev, hidden)
        A_t, B_t, C_t = self.mix(alpha)
        if t > 0:
            offset = None if B_t is None else _mv(B_t, u_t)
            m, P = kalman_predict(m, P, A_t, self.Q, offset)
        return alpha, hidden, m, P, kalman_update(m, P, C_t, self.R)

    @staticmethod
    def _absorb(step, m_pred, P_pred, a, ok):
        """The filtered moments after ``a_t`` where ``ok`` (bool, batch shape), the predicted
        ones elsewhere; and the encoding passed on (``a_t``, or the prediction ``C_t
        mu_{t|t-1}`` where missing). Returns ``(m, P, a_used)``."""
        keep = ok.reshape(ok.shape + (1,))
        a_used = torch.where(keep, a, step.loc)
        return (
            torch.where(keep, step.mean(a), m_pred),
            torch.where(keep.unsqueeze(-1), step.cov, P_pred),
            a_used,
        )

    def _check_steps_and_inputs(self, shape, observed_steps, inputs, like):
        """``observed_steps`` as a bool ``(batch, T)`` tensor and ``inputs`` checked by the
        package's validator (:func:`~pyro_seq.validation.validate_inputs`: the messages of the
        Pyro programs), in ``like``'s dtype; controls are known at every step, so all must be
        finite."""
        seen = validate_mask(
            observed_steps, tuple(shape), device=like.device, name="observed_steps"
        )
        every = torch.ones(tuple(shape), dtype=torch.bool, device=like.device)
        inputs = validate_inputs(
            inputs, tuple(shape), self.control_dim, every, like.dtype, like.device
        )
        return seen, inputs

    @torch.no_grad()
    def filter_encodings(
        self,
        a: torch.Tensor,
        observed_steps: torch.Tensor,
        inputs: Optional[torch.Tensor] = None,
        smooth: bool = True,
    ) -> "KVAEFilterResult":
        r"""The LGSSM of the KVAE on encodings with missing steps, gamma estimated recursively
        (thesis 6.4, eq. 6.12-6.13).

        Forward pass: at step t the dynamics network gives ``gamma_t`` from ``a_{0:t-1}``; an
        observed step uses its encoding ``a_t`` (and updates the filter), a missing step uses
        the predicted encoding ``a_hat_t = C_t mu_{t|t-1}`` (the mean of eq. 6.13, where the
        thesis draws a sample) as the input of the dynamics network at ``t + 1``. Then, with
        ``smooth=True``, the RTS smoother runs with the estimated ``A_t, B_t, C_t`` (exact given
        them, as the thesis notes).

        :param a: encodings ``(batch, T, a_dim)`` (e.g. the encoder means), finite at observed
            steps; any values at missing steps.
        :param observed_steps: bool ``(batch, T)`` (or exactly 0/1), True where ``a_t`` is
            observed.
        :param inputs: controls ``u_{1:T}`` ``(batch, T, control_dim)``, required exactly when
            ``control_dim > 0`` (entry 0 unused: ``B_t u_t`` enters the prediction from t = 2,
            eq. 6.1); None otherwise.
        :returns: :class:`KVAEFilterResult`.
        :raises ValueError: naming the argument: ``a`` of the wrong shape or non-finite at an
            observed step, ``observed_steps`` not ``(batch, T)`` 0/1, ``inputs`` missing,
            unexpected, of the wrong shape or non-finite (the messages of the Pyro programs).
        """
        if (
            not torch.is_tensor(a)
            or a.dim() != 3
            or a.shape[-1] != self.a_dim
            or not a.is_floating_point()
        ):
            raise ValueError(
                f"a must be a floating-point tensor of shape (batch, T, a_dim = "
                f"{self.a_dim}), got "
                f"{tuple(a.shape) if torch.is_tensor(a) else type(a).__name__}"
            )
        B, T, _ = a.shape
        observed_steps, inputs = self._check_steps_and_inputs((B, T), observed_steps, inputs, a)
        bad = ~torch.isfinite(a).all(-1) & observed_steps
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"a has a non-finite value at an observed step (sequence {b}, step "
                f"{t}); mark the step unobserved in observed_steps or give a finite "
                f"encoding"
            )
        m, P = self.init_loc.expand(B, self.z_dim), self.init_cov.expand(B, self.z_dim, self.z_dim)
        prev = self.a0.expand(B, self.a_dim)
        hidden = self.dynamics.initial(a, (B,))
        used, alphas = [], []
        for t in range(T):
            u_t = None if inputs is None else inputs[:, t]
            alpha, hidden, m, P, step = self._predict(m, P, prev, hidden, t, u_t)
            m, P, prev = self._absorb(step, m, P, a[:, t], observed_steps[:, t])
            used.append(prev)
            alphas.append(alpha)
        a_used, alpha = torch.stack(used, 1), torch.stack(alphas, 1)
        A_t, B_t, C_t = self.mix(alpha)
        args = (
            a_used,
            self.init_loc,
            self.init_cov,
            A_t,
            self.Q,
            C_t,
            self.R,
            B_t,
            inputs,
            observed_steps,
        )
        out = KVAEFilterResult(a=a_used, alpha=alpha, A=A_t, B=B_t, C=C_t)
        if smooth:
            sm = kalman_smoother(*args, validate_args=False)
            out.update(filtered=sm.filtered, smoothed=sm, a_smoothed=_mv(C_t, sm.means))
            f = sm.filtered
        else:
            f = kalman_filter(*args, validate_args=False)
            out.update(filtered=f, smoothed=None, a_smoothed=None)
        out["a_filtered"] = _mv(C_t, f.means)
        return out

    def _smoother_sample_terms(self, a, A_t, B_t, C_t, u, step_mask):
        r"""Per-step terms of eq. 6.8, ``log p(a|z) + log p(z) - log p(z|a)`` at one
        reparameterised draw ``z ~ p(z | a)`` (forward filtering, backward sampling), ``(..., T)``.

        Step t carries ``log p(a_t | z_t) + log p(z_t | z_{t-1}) - log p(z_t | z_{t+1}, a_{1:t})``
        (the last step: ``- log p(z_T | a_{1:T})``); their sum over a sequence is ``log p(a)`` for
        every z. Padded steps are filtered as missing, and their terms are added to the
        sequence's last real step, so that the masked sites still sum to ``log p(a_{1:L})``.
        """
        sm = kalman_smoother(
            a,
            self.init_loc,
            self.init_cov,
            A_t,
            self.Q,
            C_t,
            self.R,
            B_t,
            u,
            step_mask,
            validate_args=False,
        )
        f = sm.filtered
        noise = torch.randn_like(f.means)
        T = a.shape[-2]
        z = [None] * T
        z[T - 1] = f.means[..., -1, :] + _mv(psd_sqrt(f.covs[..., -1, :, :]), noise[..., -1, :])
        cond = [None] * T
        cond[T - 1] = (f.means[..., -1, :], f.covs[..., -1, :, :])
        for t in range(T - 2, -1, -1):
            J = sm.gains[..., t, :, :]
            loc = f.means[..., t, :] + _mv(J, z[t + 1] - f.predicted_means[..., t + 1, :])
            cov = f.covs[..., t, :, :] - J @ f.predicted_covs[..., t + 1, :, :] @ J.mT
            cov = 0.5 * (cov + cov.mT)
            z[t] = loc + _mv(psd_sqrt(cov), noise[..., t, :])
            cond[t] = (loc, cov)
        zs = torch.stack(z, -2)
        jitter = 1e-9 * torch.eye(self.z_dim, dtype=a.dtype, device=a.device)
        terms = []
        for t in range(T):
            obs = dist.MultivariateNormal(
                _mv(C_t[..., t, :, :], zs[..., t, :]), covariance_matrix=self.R
            ).log_prob(a[..., t, :])
            obs = torch.where(step_mask[..., t], obs, torch.zeros_like(obs))
            if t == 0:
                prior = dist.MultivariateNormal(self.init_loc, self.init_cov).log_prob(
                    zs[..., 0, :]
                )
            else:
                mean = _mv(A_t[..., t, :, :], zs[..., t - 1, :])
                if B_t is not None:
                    mean = mean + _mv(B_t[..., t, :, :], u[..., t, :])
                prior = dist.MultivariateNormal(mean, covariance_matrix=self.Q).log_prob(
                    zs[..., t, :]
                )
            post = dist.MultivariateNormal(cond[t][0], covariance_matrix=cond[t][1] + jitter)
            terms.append(obs + prior - post.log_prob(zs[..., t, :]))
        terms = torch.stack(terms, -1)
        # move the terms of padded steps onto each sequence's last real step
        lengths = step_mask.long().sum(-1, keepdim=True)  # (..., 1)
        tail = torch.flip(torch.cumsum(torch.flip(terms, [-1]), -1), [-1])  # sum_{s >= t}
        idx = torch.arange(T, device=a.device)
        last = idx == (lengths - 1)
        return torch.where(last, tail, terms)
