r"""The Wiener-process prior on latent sequences (Bayer & Osendorfer 2014, sec. 3.3).

Sec. 3.3 puts the prior not on :math:`z_{1:T}` but on a linear image of it, the *difference
map*

.. math:: g_W(z_{1:T}) = (z_1 - z_0,\; z_2 - z_1,\; \dots,\; z_T - z_{T-1}),
    \qquad g_W(z_{1:T}) \sim \mathcal{N}(0, \sigma^2 I).

**The start point.** The paper writes :math:`g_W(z_{1:T}) = (z_0, z_1 - z_0, \dots, z_T -
z_{T-1})`, which has :math:`T + 1` entries for :math:`T` arguments. Here :math:`z_0` is a
*known* start point (``z0``, zero by default: a Wiener process starts at 0 at time 0) and not a
random variable, so :math:`g_W` is a square map of :math:`z_{1:T}` with entries :math:`z_t -
z_{t-1}`; with :math:`z_0 = 0` its first entry is :math:`z_1` itself, the form
:math:`(z_1, z_2 - z_1, \dots)`. With unit increments this is exactly the paper's Gaussian process
:math:`z^{(i)}_t \sim \mathcal{GP}(0, \min(r, t))` on :math:`t \in \{1, \dots, T\}`, independently
for each latent dimension :math:`i`: :math:`z_t = z_0 + \sum_{s \le t} \epsilon_s` gives
:math:`\mathrm{Cov}(z_r, z_t) = \sigma^2 \min(r, t)` (tested against the dense Gaussian).

**Per-step form.** :math:`g_W` is lower bidiagonal with unit diagonal, so its Jacobian
determinant is 1 and the density of :math:`z_{1:T}` is the density of its increments:

.. math:: p(z_{1:T}) = \prod_{t=1}^T \mathcal{N}(z_t - z_{t-1}; 0, \sigma^2 I)
    = \prod_{t=1}^T \mathcal{N}(z_t; z_{t-1}, \sigma^2 I),

a Gaussian random walk. :func:`wiener_transition` is the factor :math:`p(z_t | z_{t-1})`, the
form the step protocol of :mod:`pyro_seq.models.base` samples one step at a time (STORN,
VRAE); :class:`WienerProcess` is the whole-sequence density over ``(T, Z)``.

**KL divergence (sec. 3.3).** For a recognition model with diagonal covariance,
:math:`q(z_{1:T}) = \prod_t \mathcal{N}(z_t; \mu_t, \mathrm{diag}\, s_t^2)`, the paper computes
:math:`KL(q \| p)` in the transformed space: :math:`g_W` maps :math:`q` to a Gaussian over the
increments with mean :math:`m_t = \mu_t - \mu_{t-1}` (:math:`\mu_0 = z_0`) and, per latent
dimension, the *banded* (tridiagonal) covariance :math:`S = D\,\mathrm{diag}(s^2)\,D^\top`,
:math:`S_{tt} = s_t^2 + s_{t-1}^2` (:math:`s_0 = 0`), :math:`S_{t,t-1} = -s_{t-1}^2`; since
:math:`g_W` is invertible, :math:`KL(q\|p) = KL(\mathcal{N}(m, S)\,\|\,\mathcal{N}(0, \sigma^2
I))` ("the KL divergence from a white Gaussian"), and with :math:`\log|S| = \sum_t \log s_t^2`
(:math:`|D| = 1`) the Gaussian KL of sec. 3.3 becomes a sum of per-step terms

.. math:: KL = \sum_{t=1}^T \sum_i \frac12\Big[\frac{s_{t,i}^2 + s_{t-1,i}^2 + (\mu_{t,i} -
    \mu_{t-1,i})^2}{\sigma_i^2} - 1 + \log \sigma_i^2 - \log s_{t,i}^2\Big],

linear in :math:`T` instead of the cubic cost of the dense form (:func:`kl_diagonal_normal_wiener`;
tested against the dense closed form with :math:`\Sigma_p = \sigma^2 \min(r, t)`). Each term
involves steps :math:`t` and :math:`t - 1` only, so the KL of a prefix :math:`z_{1:L}` is the
sum of the first :math:`L` terms (the ``mask`` argument).
"""

from typing import Optional, Union

import torch
from pyro.distributions import Normal
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import Independent, constraints, register_kl
from torch.distributions.utils import broadcast_all
from torch.types import _size

from pyro_seq.ops.linalg import broadcast_shapes

__all__ = ["WienerProcess", "kl_diagonal_normal_wiener", "wiener_increments", "wiener_transition"]


def wiener_increments(z: torch.Tensor, z0: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""The difference map :math:`g_W(z_{1:T}) = (z_1 - z_0, \dots, z_T - z_{T-1})` (sec. 3.3).

    :param torch.Tensor z: ``(..., T, Z)``, time at dim -2.
    :param torch.Tensor z0: start point ``(..., Z)`` (broadcast); None: zero.
    :returns: increments ``(..., T, Z)``.
    """
    if z0 is None:
        z0 = torch.zeros_like(z[..., 0, :])
    first = z0.unsqueeze(-2)
    shape = broadcast_shapes(z.shape[:-2], first.shape[:-2])
    T, Z = z.shape[-2:]
    previous = torch.cat(
        [first.expand(shape + (1, Z)), z[..., :-1, :].expand(shape + (T - 1, Z))], dim=-2
    )
    return z - previous


def wiener_transition(
    z_prev: torch.Tensor, scale: Union[float, torch.Tensor] = 1.0
) -> TorchDistribution:
    r""":math:`p(z_t | z_{t-1}) = \mathcal{N}(z_t; z_{t-1}, \sigma^2 I)`: one factor of the Wiener
    prior (module docstring; unit increments :math:`\sigma = 1` as sec. 3.3).

    The product of these factors over :math:`t = 1..T` (with :math:`z_0` the start point) is the
    density of :class:`WienerProcess`, since :math:`g_W` has Jacobian determinant 1.

    :param torch.Tensor z_prev: :math:`z_{t-1}`, ``(..., Z)``.
    :param scale: :math:`\sigma > 0`, a float or a tensor broadcastable to ``z_prev``.
    :returns: a distribution with event shape ``(Z,)``.
    """
    if not torch.is_tensor(scale) and not scale > 0:
        raise ValueError(f"the Wiener increment scale must be > 0, got {scale}")
    return Normal(z_prev, torch.ones_like(z_prev) * scale).to_event(1)


class WienerProcess(TorchDistribution):
    r"""A Wiener process observed at :math:`t = 1..T`: :math:`z_t = z_0 + \sum_{s \le t}
    \epsilon_s`, :math:`\epsilon_s \sim \mathcal{N}(0, \mathrm{diag}\,\sigma^2)` (sec. 3.3).

    Equivalently, each latent dimension :math:`i` is the Gaussian process
    :math:`\mathcal{N}(z_{0,i}\mathbf{1}, \sigma_i^2 [\min(r, t)]_{r,t=1}^T)`.

    :param int num_steps: :math:`T \ge 1`.
    :param torch.Tensor z0: start point, ``(..., Z)``; the batch shape is ``z0.shape[:-1]``
        broadcast with ``scale``.
    :param scale: increment standard deviation :math:`\sigma > 0` (float or tensor
        broadcastable to ``z0``); 1 in the paper.

    Event shape ``(T, Z)``; ``log_prob(z)`` is :math:`\sum_{t,i} \log \mathcal{N}((g_W z)_{t,i};
    0, \sigma_i^2)` (Jacobian 1). ``rsample`` is reparameterized (a cumulative sum of scaled
    standard normals).
    """

    arg_constraints = {"z0": constraints.real_vector, "scale": constraints.positive}
    support = constraints.independent(constraints.real, 2)
    has_rsample = True

    def __init__(
        self,
        num_steps: int,
        z0: torch.Tensor,
        scale: Union[float, torch.Tensor] = 1.0,
        validate_args: Optional[bool] = None,
    ) -> None:
        if int(num_steps) != num_steps or num_steps < 1:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps}")
        if z0.dim() < 1:
            raise ValueError("z0 must have a latent dimension: shape (..., Z)")
        if not torch.is_tensor(scale) and not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.num_steps = int(num_steps)
        self.z0, self.scale = broadcast_all(z0, scale)
        super().__init__(
            self.z0.shape[:-1],
            (self.num_steps, self.z0.shape[-1]),  # type: ignore[arg-type]  # torch.Size()s it
            validate_args=validate_args,
        )

    def expand(
        self, batch_shape: _size, _instance: Optional["WienerProcess"] = None
    ) -> "WienerProcess":
        batch_shape = torch.Size(batch_shape)
        shape = batch_shape + self.z0.shape[-1:]
        return WienerProcess(
            self.num_steps, self.z0.expand(shape), self.scale.expand(shape), validate_args=False
        )

    @property
    def mean(self) -> torch.Tensor:
        return self.z0.unsqueeze(-2).expand(self.batch_shape + self.event_shape)

    @property
    def variance(self) -> torch.Tensor:
        t = torch.arange(1, self.num_steps + 1, dtype=self.scale.dtype, device=self.scale.device)
        return t.unsqueeze(-1) * self.scale.unsqueeze(-2) ** 2

    def rsample(self, sample_shape: _size = torch.Size()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.z0.dtype, device=self.z0.device)
        return self.z0.unsqueeze(-2) + torch.cumsum(self.scale.unsqueeze(-2) * eps, dim=-2)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        increments = wiener_increments(value, self.z0)
        return Normal(0.0, self.scale.unsqueeze(-2)).log_prob(increments).sum((-2, -1))


def kl_diagonal_normal_wiener(
    loc: torch.Tensor,
    scale: torch.Tensor,
    z0: Optional[torch.Tensor] = None,
    prior_scale: Union[float, torch.Tensor] = 1.0,
    mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    r""":math:`KL(q \| p)` of :math:`q = \prod_t \mathcal{N}(\mu_t, \mathrm{diag}\, s_t^2)` from the
    Wiener prior, via :math:`g_W` as sec. 3.3 describes (module docstring, per-step terms).

    :param torch.Tensor loc: :math:`\mu_{1:T}`, ``(..., T, Z)``.
    :param torch.Tensor scale: :math:`s_{1:T} > 0`, ``(..., T, Z)``.
    :param torch.Tensor z0: the prior's start point ``(..., Z)``; None: zero.
    :param prior_scale: increment standard deviation :math:`\sigma` (float or ``(..., Z)``).
    :param torch.Tensor mask: optional bool ``(..., T)`` prefix mask: the KL of :math:`z_{1:L}`
        for each sequence of length :math:`L` (padded steps contribute exactly 0).
    :returns: ``(...)``, summed over time and latent dimensions.
    """
    loc, scale = torch.broadcast_tensors(loc, scale)
    if not torch.is_tensor(prior_scale):
        prior_scale = torch.as_tensor(prior_scale, dtype=loc.dtype, device=loc.device)
    var_prior = (prior_scale**2).unsqueeze(-2) if prior_scale.dim() else prior_scale**2
    var = scale**2
    var_prev = torch.cat([torch.zeros_like(var[..., :1, :]), var[..., :-1, :]], dim=-2)
    mean_increment = wiener_increments(loc, z0)  # m = g_W(mu) - (z0, 0, ..., 0)
    terms = 0.5 * (
        (var + var_prev + mean_increment**2) / var_prior
        - 1.0
        + torch.log(var_prior)
        - torch.log(var)
    )
    terms = terms.sum(-1)  # (..., T)
    if mask is not None:
        terms = terms.masked_fill(~mask.bool(), 0.0)
    return terms.sum(-1)


@register_kl(Independent, WienerProcess)
def _kl_independent_normal_wiener(q, p):
    """``kl_divergence(Normal(loc, scale).to_event(2), WienerProcess(...))`` over ``(T, Z)``."""
    base = q.base_dist
    if (
        not isinstance(base, torch.distributions.Normal)
        or q.reinterpreted_batch_ndims != 2
        or q.event_shape != p.event_shape
    ):
        raise NotImplementedError(
            "KL from a Wiener process is implemented for a diagonal Normal "
            "with event shape (T, Z) only"
        )
    return kl_diagonal_normal_wiener(base.loc, base.scale, p.z0, p.scale)
