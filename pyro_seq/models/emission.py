"""Observation layers shared by the architectures: a network plus a likelihood family.

Families of :func:`make_emission` (``D = obs_dim``):

* ``"bernoulli"``: ``p(x_t | .) = prod_d Bernoulli(x_td; sigmoid(l_d))``; params: logits
  ``(..., D)``.
* ``"gaussian"``: ``p(x_t | .) = prod_d N(x_td; mu_d, s_d^2)``; params: ``(loc, scale)``, each
  ``(..., D)``.
* ``"gmm"``: a mixture of ``K`` diagonal Gaussians (VRNN-GMM, Chung et al. 2015),
  eq. (1) of :mod:`pyro_seq.distributions.mixture`; params: ``(logits, loc, scale)`` with
  shapes ``(..., K)``, ``(..., K*D)``, ``(..., K*D)``. Locs and scales are kept flat (component
  major: entry ``k*D + d`` is component ``k``, dim ``d``) so that every params tensor has the
  layout ``(..., [T,] F)`` that :func:`stack_params` and
  :func:`pyro_seq.models.base.time_steps` rely on; :func:`gmm_likelihood` reshapes them.

Missing data inside sequences: :func:`masked_log_prob` scores only the observed elements of
``x_t`` and :class:`ObservedElements` wraps a likelihood so that a site scores that::

    log p(x_O) = sum_{d in O} log p(x_d)                 (factorised families)          (1)
    log p(x_O) = logsumexp_k [log pi_k + sum_{d in O} log N(x_d; mu_kd, s_kd^2)]  (gmm)  (2)
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import Distribution, Independent

from pyro_seq.distributions.mixture import DiagonalNormalMixture, broadcast_element_mask
from pyro_seq.nn import MLP, GaussianHead

LIKELIHOODS = ("bernoulli", "gaussian", "gmm")

#: A sample shape, as torch's distributions take it.
_Shape = Union[torch.Size, List[int], Tuple[int, ...]]


def bernoulli_likelihood(logits: torch.Tensor) -> TorchDistribution:
    """``p(x_t | .) = prod_d Bernoulli(x_td; sigmoid(logits_d))``, event dim 1."""
    return dist.Bernoulli(logits=logits, validate_args=False).to_event(1)


def gaussian_likelihood(params: Tuple[torch.Tensor, torch.Tensor]) -> TorchDistribution:
    """``p(x_t | .) = prod_d N(x_td; loc_d, scale_d^2)``, event dim 1."""
    loc, scale = params
    return dist.Normal(loc, scale).to_event(1)


def gmm_likelihood(
    params: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> DiagonalNormalMixture:
    """Mixture of diagonal Gaussians from flat params: a :class:`DiagonalNormalMixture`.

    :param tuple params: ``(logits, loc, scale)`` of shapes ``(..., K)``, ``(..., K*D)``,
        ``(..., K*D)`` (component major); ``K`` is read from ``logits``.
    :returns: distribution with batch shape ``(...)`` and event shape ``(D,)``.
    """
    logits, loc, scale = params
    K = logits.shape[-1]
    if loc.shape[-1] % K or scale.shape[-1] != loc.shape[-1]:
        raise ValueError(
            f"gmm params: loc {tuple(loc.shape)} and scale {tuple(scale.shape)} must "
            f"both end in K*D with K = {K} (the size of logits)"
        )
    D = loc.shape[-1] // K
    return DiagonalNormalMixture(logits, loc.unflatten(-1, (K, D)), scale.unflatten(-1, (K, D)))


class GMMHead(nn.Module):
    """Mixture parameters from features: ``(..., in_dim) -> ((..., K), (..., K*D), (..., K*D))``.

    Logits are a linear map; locs and scales come from a :class:`~pyro_seq.nn.GaussianHead` of
    size ``K*D``, so every component's standard deviation is at least ``min_scale``.
    """

    def __init__(
        self, in_dim: int, obs_dim: int, num_components: int, min_scale: float = 1e-3
    ) -> None:
        super().__init__()
        self.num_components, self.obs_dim = num_components, obs_dim
        self.logits = nn.Linear(in_dim, num_components)
        self.gaussian = GaussianHead(in_dim, num_components * obs_dim, min_scale)

    def forward(self, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loc, scale = self.gaussian(h)
        return self.logits(h), loc, scale


EMISSION_OPTIONS = ("num_components", "min_scale")
INPUT_ALIASES = ("control_dim", "num_actions", "inputs", "input_size", "u_dim")


def check_emission_options(owner: str, options: Dict[str, Any], takes_inputs: bool) -> None:
    """Refuse keyword options a model passes on to :func:`make_emission` that it does not take.

    :param str owner: the model's name, for the message.
    :param dict options: the model's extra keyword arguments.
    :param bool takes_inputs: whether the model takes known inputs (``input_dim``).
    :raises TypeError: one sentence naming the unknown options and the ones the emission takes
        (and where known inputs go when an option names them, e.g. ``control_dim``).
    """
    unknown = sorted(k for k in options if k not in EMISSION_OPTIONS)
    if not unknown:
        return
    hint = ""
    if any(k in INPUT_ALIASES for k in unknown):
        hint = (
            f"; known inputs per step are given to {owner} as input_dim"
            if takes_inputs
            else f"; {owner} takes no known inputs (DMM, SRNN, VRNN take input_dim, the KVAE "
            "control_dim, the GTM-SM num_actions)"
        )
    raise TypeError(
        f"{owner} got unknown option(s) {unknown}: besides its own arguments it passes only "
        f"{', '.join(EMISSION_OPTIONS)} on to the emission (make_emission){hint}"
    )


def make_emission(
    likelihood: str,
    in_dim: int,
    hidden_dims: Sequence[int],
    obs_dim: int,
    activation: str = "relu",
    num_components: Optional[int] = None,
    min_scale: float = 1e-3,
) -> Tuple[nn.Module, Callable[[Any], TorchDistribution]]:
    """Return ``(network, likelihood_fn)`` for ``"bernoulli"``, ``"gaussian"`` or ``"gmm"``.

    The network maps features ``(..., in_dim)`` to the likelihood's parameters (see the module
    docstring for their shapes); the likelihood function maps those to a distribution with
    event shape ``(obs_dim,)``.

    :param int num_components: ``K`` for ``"gmm"`` (required there, not accepted otherwise).
    :param float min_scale: floor on the standard deviations of ``"gaussian"`` and ``"gmm"``.
    """
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
    if likelihood != "gmm" and num_components is not None:
        raise ValueError(
            f"num_components applies to likelihood 'gmm' only, got it with {likelihood!r}"
        )
    if likelihood == "bernoulli":
        return MLP(in_dim, hidden_dims, obs_dim, activation), bernoulli_likelihood
    body = MLP(in_dim, hidden_dims[:-1], hidden_dims[-1], activation, activate_output=True)
    if likelihood == "gaussian":
        return nn.Sequential(
            body, GaussianHead(hidden_dims[-1], obs_dim, min_scale)
        ), gaussian_likelihood
    if (
        isinstance(num_components, bool)
        or not isinstance(num_components, int)
        or num_components < 1
    ):
        raise ValueError(
            f"likelihood 'gmm' needs num_components, a positive int; got {num_components!r}"
        )
    head = GMMHead(hidden_dims[-1], obs_dim, num_components, min_scale)
    return nn.Sequential(body, head), gmm_likelihood


def stack_params(
    params: Sequence[Union[torch.Tensor, Tuple[torch.Tensor, ...]]],
) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Stack per-step emission parameters along time (dim 1): tensors or tuples of tensors."""
    if torch.is_tensor(params[0]):  # one layout per call: every entry is a tensor
        return torch.stack(params, 1)  # type: ignore[arg-type]
    return tuple(torch.stack(p, 1) for p in zip(*params))


def _fill_value(base, value):
    """A value inside ``base.support`` to put at unobserved entries (0 where allowed)."""
    zero = torch.zeros((), dtype=value.dtype, device=value.device)
    try:
        ok = bool(base.support.check(zero).all())
    except (NotImplementedError, RuntimeError):
        ok = True
    return zero if ok else base.mean.detach()


def masked_log_prob(
    fn: Distribution, value: torch.Tensor, element_mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``log p(observed elements of value)`` under ``fn``: eq. (1) or (2); shape ``fn.batch_shape``.

    :param fn: a distribution with event shape ``(D,)``: ``Independent(base, 1)`` of a
        factorised family (Bernoulli, Normal, ...), a :class:`DiagonalNormalMixture`, or
        anything with a ``masked_log_prob(value, element_mask)`` method.
    :param torch.Tensor value: ``(..., D)``; entries where ``element_mask`` is False may hold
        anything (NaN included): they reach neither the result nor its gradients.
    :param element_mask: bool tensor broadcastable to ``value``'s shape (True = observed), or
        None (all observed: ``fn.log_prob(value)``). A row with nothing observed scores 0.
    :returns: ``(...)``, batch dims broadcast as in ``fn.log_prob``.
    :raises ValueError: an unsupported ``fn``, a non-bool mask or a mask of the wrong size.
    """
    if element_mask is None:
        return fn.log_prob(value)
    if len(fn.event_shape) != 1:
        raise ValueError(f"masked_log_prob needs event shape (D,), got {tuple(fn.event_shape)}")
    broadcast_element_mask(element_mask, fn.event_shape[0])
    if hasattr(fn, "masked_log_prob"):
        return fn.masked_log_prob(value, element_mask)
    if isinstance(fn, Independent) and fn.reinterpreted_batch_ndims == 1:
        base = fn.base_dist
        safe = torch.where(element_mask, value, _fill_value(base, value))
        terms = base.log_prob(safe)
        return torch.where(element_mask, terms, torch.zeros_like(terms)).sum(-1)
    raise ValueError(
        f"masked_log_prob supports Independent(base, 1) and DiagonalNormalMixture "
        f"(or a masked_log_prob method), got {type(fn).__name__}"
    )


class ObservedElements(TorchDistribution):
    """``fn`` scored on the observed elements only: ``log_prob(v) = masked_log_prob(fn, v, mask)``.

    Same batch and event shape as ``fn``; sampling, support and moments are ``fn``'s. Use as
    ``pyro.sample(name, ObservedElements(fn, m).mask(step_mask), obs=x_t)``.

    :param fn: a distribution accepted by :func:`masked_log_prob`, event shape ``(D,)``.
    :param torch.Tensor element_mask: bool, broadcastable to ``fn.batch_shape + (D,)``
        (True = observed).
    """

    arg_constraints = {}

    def __init__(self, fn: TorchDistribution, element_mask: torch.Tensor) -> None:
        if len(fn.event_shape) != 1:
            raise ValueError(
                f"ObservedElements needs event shape (D,), got {tuple(fn.event_shape)}"
            )
        self.fn = fn
        self.element_mask = broadcast_element_mask(element_mask, fn.event_shape[0])
        super().__init__(fn.batch_shape, fn.event_shape, validate_args=False)

    @property
    def support(self) -> Any:
        return self.fn.support

    @property  # the wrapped distribution's flag (torch declares a class attribute)
    def has_rsample(self) -> bool:  # type: ignore[override]
        return self.fn.has_rsample

    def sample(self, sample_shape: _Shape = torch.Size()) -> torch.Tensor:
        return self.fn.sample(sample_shape)

    def rsample(self, sample_shape: _Shape = torch.Size()) -> torch.Tensor:
        return self.fn.rsample(sample_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return masked_log_prob(self.fn, value, self.element_mask)

    @property
    def mean(self) -> torch.Tensor:
        return self.fn.mean

    @property
    def variance(self) -> torch.Tensor:
        return self.fn.variance

    def expand(
        self, batch_shape: Sequence[int], _instance: Optional["ObservedElements"] = None
    ) -> "ObservedElements":
        batch_shape = torch.Size(batch_shape)
        if batch_shape == self.batch_shape:
            return self
        return ObservedElements(self.fn.expand(batch_shape), self.element_mask)
