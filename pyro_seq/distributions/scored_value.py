"""A distribution paired with a value whose log-density was computed in a batch.

Used by time-parallel scoring (:mod:`pyro_seq.models.base`): when all latent values of a
sequence are known, the log-densities of every step are computed by one batched call, and each
per-step site carries a :class:`ScoredValue` that returns its slice for that very value
(identity, not equality, is checked) and defers everything else to the per-step distribution.
:class:`PresampledValue` is the same for a guide site whose value was drawn ahead, in a batch:
its draw *is* that value.
"""

from typing import Callable, Optional, Tuple, Union

import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import kl_divergence, register_kl
from torch.distributions.constraints import Constraint
from torch.distributions.distribution import Distribution
from torch.types import _size


class ScoredValue(TorchDistribution):
    """``base`` with ``log_prob(value) = log_prob_value`` precomputed for one ``value`` object.

    :param base: the per-step distribution (sampling, support, shapes, other values), or a
        ``like`` distribution and a zero-argument function that builds it (``(like, make)``):
        then ``base`` is built on first use only, and ``like`` (e.g. the first step's
        distribution) gives the batch and event shapes and ``has_rsample``. Scoring the known
        value needs no ``base``, so a site scored inside an ELBO never builds it (building a
        torch distribution per step, with its argument checks and broadcasting, costs about
        as much as the batched evaluation it replaces).
    :param torch.Tensor value: the value whose log-density is known.
    :param torch.Tensor log_prob_value: ``base.log_prob(value)``, shape ``base.batch_shape``
        (up to broadcasting), computed elsewhere (e.g. as a slice of a batched evaluation).
    """

    arg_constraints = {}

    def __init__(
        self,
        base: Union[Distribution, Tuple[Distribution, Callable[[], Distribution]]],
        value: torch.Tensor,
        log_prob_value: torch.Tensor,
    ) -> None:
        self._base: Optional[Distribution]
        self._make_base: Optional[Callable[[], Distribution]]
        if isinstance(base, tuple):
            like, self._make_base = base
            self._base = None
        else:
            like, self._base, self._make_base = base, base, None
        self._has_rsample = like.has_rsample
        self.value, self.log_prob_value = value, log_prob_value
        super().__init__(like.batch_shape, like.event_shape, validate_args=False)

    @property
    def base(self) -> Distribution:
        if self._base is None:
            self._base = self._make_base()  # type: ignore[misc]  # set whenever _base is None
        return self._base

    @property
    def support(self) -> Optional[Constraint]:
        return self.base.support

    @property
    def has_rsample(self) -> bool:  # type: ignore[override]  # read-only, as in Pyro
        return self._has_rsample

    def sample(self, sample_shape: _size = ()) -> torch.Tensor:
        return self.base.sample(sample_shape)

    def rsample(self, sample_shape: _size = ()) -> torch.Tensor:
        return self.base.rsample(sample_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if value is self.value:
            return self.log_prob_value
        return self.base.log_prob(value)

    @property
    def mean(self) -> torch.Tensor:
        return self.base.mean

    @property
    def variance(self) -> torch.Tensor:
        return self.base.variance

    def expand(self, batch_shape: _size, _instance: None = None) -> "ScoredValue":
        """Keep the precomputed score: Pyro's plates call ``expand`` on every site, usually
        to the shape the distribution already has."""
        batch_shape = torch.Size(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        return ScoredValue(
            self.base.expand(batch_shape), self.value, self.log_prob_value.expand(batch_shape)
        )


class PresampledValue(ScoredValue):
    """A :class:`ScoredValue` whose draw is its value: a guide site whose reparameterised sample
    was computed ahead for every step at once (e.g. by :func:`pyro_seq.nn.combiner_scan`).

    ``rsample()`` returns ``value`` itself (with its autograd graph) and ``sample()`` its
    detached copy; draws with a ``sample_shape`` and expansion to another batch shape are
    refused, since they would need values that were not drawn.
    """

    def sample(self, sample_shape: _size = ()) -> torch.Tensor:
        self._check_shape(sample_shape)
        return self.value.detach()

    def rsample(self, sample_shape: _size = ()) -> torch.Tensor:
        self._check_shape(sample_shape)
        return self.value

    def _check_shape(self, sample_shape: _size) -> None:
        if tuple(sample_shape) != ():
            raise RuntimeError("PresampledValue holds one draw; sample_shape must be ()")

    def expand(self, batch_shape: _size, _instance: None = None) -> "PresampledValue":
        if torch.Size(batch_shape) == self.batch_shape:
            return self
        raise RuntimeError(
            f"PresampledValue of batch shape {tuple(self.batch_shape)} cannot be "
            f"expanded to {tuple(batch_shape)}: its value was drawn for its own shape"
        )


@register_kl(Distribution, ScoredValue)
def _kl_scored_value(p, q):
    return kl_divergence(p, q.base)


@register_kl(ScoredValue, Distribution)
def _kl_from_scored_value(p, q):
    return kl_divergence(p.base, q)


@register_kl(ScoredValue, ScoredValue)
def _kl_scored_values(p, q):
    return kl_divergence(p.base, q.base)
