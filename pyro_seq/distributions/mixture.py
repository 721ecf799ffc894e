"""A finite mixture of diagonal Gaussians: the observation layer of VRNN-GMM.

:class:`DiagonalNormalMixture` is the emission family ``"gmm"`` of
:func:`pyro_seq.models.emission.make_emission` (Chung et al. 2015, "A Recurrent Latent Variable
Model for Sequential Data", VRNN-GMM). With mixture weights ``pi = softmax(logits)``,
component means ``mu_k`` and standard deviations ``s_k`` (vectors of size ``D``)::

    p(x) = sum_k pi_k prod_d N(x_d; mu_kd, s_kd^2)                                      (1)
    log p(x) = logsumexp_k [log pi_k + sum_d log N(x_d; mu_kd, s_kd^2)]                 (2)

Because every component factorises over dimensions, the marginal of any subset ``O`` of the
dimensions is again a mixture with the *same* weights::

    log p(x_O) = logsumexp_k [log pi_k + sum_{d in O} log N(x_d; mu_kd, s_kd^2)]        (3)

which :meth:`DiagonalNormalMixture.masked_log_prob` evaluates (missing data inside sequences).
Moments::

    E[x] = sum_k pi_k mu_k                                                               (4)
    Var[x_d] = sum_k pi_k (s_kd^2 + (mu_kd - E[x_d])^2)                                  (5)

Sampling draws a component and then a Gaussian; it is not reparameterizable (there is no
``rsample``), which is fine for an observation distribution.
"""

from typing import Optional, Sequence, Union

import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import constraints
from torch.types import _size

from pyro_seq.ops.linalg import broadcast_shapes

__all__ = ["DiagonalNormalMixture", "broadcast_element_mask"]

_HALF_LOG_2PI = 0.5 * torch.log(torch.tensor(2.0 * torch.pi, dtype=torch.float64)).item()


def broadcast_element_mask(element_mask: torch.Tensor, event_size: int) -> torch.Tensor:
    """Check an element mask: a bool tensor whose last dim is ``event_size`` or 1 (or a 0-dim).

    :param element_mask: bool tensor broadcastable to ``(..., event_size)``, True = observed.
    :param int event_size: size ``D`` of the event dimension.
    :returns: ``element_mask`` unchanged.
    :raises ValueError: not a bool tensor, or a last dim other than ``event_size`` or 1.
    """
    if not torch.is_tensor(element_mask) or element_mask.dtype != torch.bool:
        raise ValueError(
            f"element_mask must be a bool tensor, got "
            f"{getattr(element_mask, 'dtype', type(element_mask).__name__)}"
        )
    if element_mask.dim() > 0 and element_mask.shape[-1] not in (1, event_size):
        raise ValueError(
            f"element_mask's last dim must be {event_size} (the event size) or 1, "
            f"got shape {tuple(element_mask.shape)}"
        )
    return element_mask


class DiagonalNormalMixture(TorchDistribution):
    """Mixture of ``K`` diagonal Gaussians, eq. (1); batch shape ``(...)``, event shape ``(D,)``.

    :param torch.Tensor logits: unnormalised log mixture weights, ``(..., K)``.
    :param torch.Tensor loc: component means, ``(..., K, D)``.
    :param torch.Tensor scale: component standard deviations (> 0), ``(..., K, D)``.

    The batch shape is the broadcast of ``logits.shape[:-1]``, ``loc.shape[:-2]`` and
    ``scale.shape[:-2]``.
    """

    arg_constraints = {
        "logits": constraints.real_vector,
        "loc": constraints.independent(constraints.real, 2),
        "scale": constraints.independent(constraints.positive, 2),
    }
    support = constraints.real_vector
    has_rsample = False

    def __init__(
        self,
        logits: torch.Tensor,
        loc: torch.Tensor,
        scale: torch.Tensor,
        validate_args: Optional[bool] = None,
    ) -> None:
        if logits.dim() < 1 or loc.dim() < 2 or scale.dim() < 2:
            raise ValueError(
                "DiagonalNormalMixture needs logits (..., K), loc and scale "
                f"(..., K, D); got shapes {tuple(logits.shape)}, {tuple(loc.shape)}, "
                f"{tuple(scale.shape)}"
            )
        K = logits.shape[-1]
        if loc.shape[-2] != K or scale.shape[-2] != K or loc.shape[-1] != scale.shape[-1]:
            raise ValueError(
                f"DiagonalNormalMixture: {K} components in logits {tuple(logits.shape)} "
                f"but loc {tuple(loc.shape)} and scale {tuple(scale.shape)} "
                "(need (..., K, D) for both)"
            )
        batch_shape = broadcast_shapes(logits.shape[:-1], loc.shape[:-2], scale.shape[:-2])
        D = loc.shape[-1]
        self.logits = logits.expand(batch_shape + (K,))
        self.loc = loc.expand(batch_shape + (K, D))
        self.scale = scale.expand(batch_shape + (K, D))
        super().__init__(batch_shape, torch.Size((D,)), validate_args=validate_args)

    @property
    def num_components(self) -> int:
        return self.logits.shape[-1]

    @property
    def log_weights(self) -> torch.Tensor:
        """``log pi_k``, ``(..., K)`` (normalised)."""
        return torch.log_softmax(self.logits, dim=-1)

    def _element_log_probs(self, value: torch.Tensor) -> torch.Tensor:
        """``log N(x_d; mu_kd, s_kd^2)`` for every component and dim: ``(..., K, D)``."""
        z = (value.unsqueeze(-2) - self.loc) / self.scale
        return -0.5 * z * z - self.scale.log() - _HALF_LOG_2PI

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Eq. (2): ``value (..., D) -> (...)`` (batch dims broadcast with ``batch_shape``)."""
        if self._validate_args:
            self._validate_sample(value)
        terms = self._element_log_probs(value).sum(-1)
        return torch.logsumexp(self.log_weights + terms, dim=-1)

    def masked_log_prob(
        self, value: torch.Tensor, element_mask: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Eq. (3): ``log p(observed elements of value)``, shape ``(...)``.

        :param torch.Tensor value: ``(..., D)``; entries where ``element_mask`` is False may
            hold anything (NaN included): they reach neither the result nor its gradients.
        :param element_mask: bool, broadcastable to ``value``'s shape, True = observed;
            None = all observed (then this equals :meth:`log_prob`). A row with no observed
            element scores exactly 0 (the log-density of the empty marginal).
        """
        if element_mask is None:
            return self.log_prob(value)
        broadcast_element_mask(element_mask, self.event_shape[0])
        safe = torch.where(
            element_mask, value, torch.zeros((), dtype=value.dtype, device=value.device)
        )
        if self._validate_args:
            self._validate_sample(safe)
        terms = self._element_log_probs(safe)
        terms = torch.where(element_mask.unsqueeze(-2), terms, torch.zeros_like(terms)).sum(-1)
        result = torch.logsumexp(self.log_weights + terms, dim=-1)
        # logsumexp_k log pi_k is 0 only up to rounding; make the empty marginal exactly 0
        return torch.where(element_mask.any(-1), result, torch.zeros_like(result))

    def sample(self, sample_shape: Union[torch.Size, Sequence[int]] = torch.Size()) -> torch.Tensor:
        """Draw ``k ~ Categorical(pi)`` then ``x ~ N(mu_k, diag(s_k^2))``:
        ``sample_shape + batch_shape + (D,)`` (``sample_shape`` any sequence of ints, as for
        torch's distributions)."""
        sample_shape = torch.Size(sample_shape)
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            k = torch.distributions.Categorical(logits=self.logits).sample(sample_shape)
            index = k[..., None, None].expand(shape[:-1] + (1, shape[-1]))
            loc = self.loc.expand(sample_shape + self.loc.shape).gather(-2, index).squeeze(-2)
            scale = self.scale.expand(sample_shape + self.scale.shape).gather(-2, index).squeeze(-2)
            return loc + scale * torch.randn(shape, dtype=loc.dtype, device=loc.device)

    @property
    def mean(self) -> torch.Tensor:
        """Eq. (4), ``(..., D)``."""
        return (self.log_weights.exp().unsqueeze(-1) * self.loc).sum(-2)

    @property
    def variance(self) -> torch.Tensor:
        """Eq. (5), ``(..., D)``."""
        w = self.log_weights.exp().unsqueeze(-1)
        return (w * (self.scale**2 + (self.loc - self.mean.unsqueeze(-2)) ** 2)).sum(-2)

    def expand(
        self, batch_shape: _size, _instance: Optional["DiagonalNormalMixture"] = None
    ) -> "DiagonalNormalMixture":
        batch_shape = torch.Size(batch_shape)
        K, D = self.loc.shape[-2:]
        new = self._get_checked_instance(DiagonalNormalMixture, _instance)
        new.logits = self.logits.expand(batch_shape + (K,))
        new.loc = self.loc.expand(batch_shape + (K, D))
        new.scale = self.scale.expand(batch_shape + (K, D))
        super(DiagonalNormalMixture, new).__init__(
            batch_shape, self.event_shape, validate_args=False
        )
        new._validate_args = self._validate_args
        return new
