r"""Bootstrap particle filter with ESS-based adaptive resampling (thesis Sec. 3.5.1.4).

The bootstrap filter uses the transition prior as proposal, ``q(z_t | z_{t-1}, x_t) =
p(z_t | z_{t-1})``, so the incremental importance weight (eq. 3.18) is the emission density
``alpha_t = p(x_t | z_t)``. With normalized weights ``Wbar_{t-1}`` carried into step ``t``
(``1/K`` right after a resampling step) the likelihood estimate is

.. math::

    \hat p(x_{1:T}) = \prod_{t=1}^T \sum_{k=1}^K \bar W^{(k)}_{t-1} \alpha^{(k)}_t ,

which is unbiased, ``E[p-hat] = p(x_{1:T})``, for any resampling scheme with
``E[#offspring] = K w`` and any adaptive resampling rule (Del Moral 2004; Doucet & Johansen
2008). When resampling at every step ``Wbar = 1/K`` and this is exactly eq. (3.20),
``prod_t (1/K) sum_k w_t^{(k)}``; with no resampling at all it is plain sequential importance
sampling. ``log p-hat`` is biased low (Jensen), only ``p-hat`` itself is unbiased.

Resampling before propagating to step ``t`` follows the criterion ``resample`` (the vocabulary
of :mod:`pyro_seq.ops.resampling`): ``"ess"`` resamples whenever the effective sample size
(Liu & Chen 1998, thesis Sec. 3.5.1.4) of the weights of step ``t-1`` falls below
``ess_threshold * K`` (the thesis suggests ``0.7``), independently for every batch element;
``"always"`` resamples before every step ``t >= 1`` (eq. 3.20 in its plain form) and
``"never"`` gives sequential importance sampling. The scheme is ``resampling`` (default
``"systematic"``).

Shapes: **particles first**, as in :mod:`pyro_seq.ops.resampling`: ``K`` particles, batch shape
``batch``, ``T`` steps, state dim ``S``.

Gradients: particles are drawn with ``rsample`` when the distribution supports it, and weights
keep their graph, but ancestor indices carry no gradient (see :mod:`pyro_seq.ops.resampling`), so
the gradient of ``log p-hat`` ignores the resampling term and is biased (as in FIVO).
"""

import math
import warnings
from typing import NamedTuple

import torch

from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.ops.resampling import (
    DEFAULT_RESAMPLING,
    check_resampling_args,
    deprecated_alias,
    effective_sample_size,
    normalize_log_weights,
)
from pyro_seq.ops.resampling import (
    resample as _resample,
)

__all__ = [
    "ParticleFilterResult",
    "additive_gaussian",
    "ancestral_paths",
    "bootstrap_particle_filter",
]


class ParticleFilterResult(NamedTuple):
    """Output of :func:`bootstrap_particle_filter`.

    :ivar particles: filtered particles ``z_t^{(k)}``, ``(K, *batch, T, S)``.
    :ivar log_weights: normalized log-weights ``log W_t^{(k)}`` of the filtered particles
        (``logsumexp`` over ``K`` is 0), ``(K, *batch, T)``. ``sum_k W_t^{(k)} g(z_t^{(k)})``
        estimates ``E[g(z_t) | x_{1:t}]``.
    :ivar ancestors: ``(K, *batch, T)`` long; ``ancestors[k, ..., t]`` is the index of the particle
        at step ``t-1`` that particle ``k`` at step ``t`` was propagated from (identity where
        no resampling happened; entry ``t = 0`` is ``k``).
    :ivar log_likelihood_increments: ``log sum_k Wbar_{t-1}^{(k)} alpha_t^{(k)}`` (0 at masked
        steps), ``(*batch, T)``.
    :ivar log_likelihood: ``log p-hat(x_{1:T})`` (eq. 3.20), ``(*batch,)``.
    :ivar ess: effective sample size of the filtered weights at each step, ``(*batch, T)``.
    :ivar resampled: whether resampling happened before step ``t``, bool ``(*batch, T)``.
    """

    particles: torch.Tensor
    log_weights: torch.Tensor
    ancestors: torch.Tensor
    log_likelihood_increments: torch.Tensor
    log_likelihood: torch.Tensor
    ess: torch.Tensor
    resampled: torch.Tensor

    @property
    def weights(self):
        """Normalized weights ``exp(log_weights)``, ``(K, *batch, T)``."""
        return self.log_weights.exp()

    def mean(self):
        """Filtered means ``sum_k W_t^{(k)} z_t^{(k)}``, ``(*batch, T, S)``."""
        return (self.weights.unsqueeze(-1) * self.particles).sum(0)


def additive_gaussian(fn, cov):
    """Wrap ``fn(z, t)`` with additive Gaussian noise: returns ``(z, t) ->
    MultivariateNormal(fn(z, t), cov_t)``, the model of :mod:`pyro_seq.ops.nonlinear`, so the same
    ``f``, ``h``, ``Q``, ``R`` drive the EKF/UKF and the particle filter.

    :param callable fn: ``(..., S) -> (..., D)``.
    :param torch.Tensor cov: ``(D, D)`` or ``(..., T|1, D, D)`` (time dim just left of the matrix
        dims, as in :mod:`pyro_seq.ops.nonlinear`); must be positive definite.
    """
    scale_tril = torch.linalg.cholesky(cov)

    def dist(z, t):
        L = scale_tril
        if L.dim() > 2:
            L = L.select(-3, t if L.shape[-3] > 1 else 0)
        return torch.distributions.MultivariateNormal(fn(z, t), scale_tril=L)

    return dist


def _sample(dist):
    return dist.rsample() if dist.has_rsample else dist.sample()


def bootstrap_particle_filter(
    x,
    initial_dist,
    transition_fn,
    observation_fn,
    num_particles,
    mask=None,
    resample="ess",
    ess_threshold=0.5,
    resampling=DEFAULT_RESAMPLING,
    generator=None,
    *,
    resample_threshold=None,
    resampling_scheme=None,
):
    """Bootstrap particle filter (thesis Sec. 3.5.1.4) with an unbiased likelihood estimate.

    :param torch.Tensor x: observations ``(*batch, T, D)``.
    :param torch.distributions.Distribution initial_dist: ``p(z_1)``, event shape ``(S,)``, batch
        shape broadcastable to ``batch``.
    :param callable transition_fn: ``(z_prev, t) -> Distribution`` of ``z_t`` given
        ``z_prev = z_{t-1}`` of shape ``(K, *batch, S)``, for ``t = 1..T-1`` (0-based; the step
        being entered); its samples must have shape ``(K, *batch, S)``.
    :param callable observation_fn: ``(z, t) -> Distribution`` of ``x_t`` given ``z_t``; its
        ``log_prob(x_t)`` with ``x_t (*batch, D)`` must have shape ``(K, *batch)``.
    :param int num_particles: ``K``.
    :param torch.Tensor mask: optional bool ``(*batch, T)``, True where ``x_t`` is observed;
        missing steps have ``alpha_t = 1`` (masked entries of ``x`` may be NaN).
    :param str resample: the criterion: ``"ess"`` (resample before step ``t`` when
        ``ESS_{t-1} < ess_threshold * K``), ``"always"`` (before every step ``t >= 1``, eq. 3.20
        in its plain form) or ``"never"`` (sequential importance sampling).
    :param float ess_threshold: fraction of ``K`` in ``[0, 1]`` (``"ess"`` only).
    :param str resampling: the scheme, ``"systematic"`` (default), ``"stratified"`` or
        ``"multinomial"``; see :func:`pyro_seq.ops.resampling.resample`.
    :param torch.Generator generator: for the resampling draws only; particle draws use the
        global RNG (seed it with ``torch.manual_seed``).
    :param float resample_threshold: deprecated (FutureWarning); ``t >= 1`` is
        ``resample="always"``, ``t <= 0`` is ``resample="never"``, otherwise
        ``resample="ess", ess_threshold=t``.
    :param str resampling_scheme: deprecated alias of ``resampling`` (FutureWarning).
    :returns: :class:`ParticleFilterResult`.
    :raises ValueError: for an unknown criterion or scheme, a threshold outside ``[0, 1]`` or a
        non-positive ``num_particles``.
    """
    name = "bootstrap_particle_filter"
    if resample_threshold is not None:
        warnings.warn(
            f"{name}: `resample_threshold` is deprecated and will be removed in the next release; "
            'use `resample` ("ess", "always", "never") and `ess_threshold` instead',
            FutureWarning,
            stacklevel=2,
        )
        t = float(resample_threshold)
        if resample != "ess" or ess_threshold != 0.5:
            raise ValueError(
                f"{name}: pass either `resample`/`ess_threshold` or their deprecated "
                f"alias `resample_threshold`, not both"
            )
        if t >= 1:
            resample = "always"
        elif t <= 0:
            resample = "never"
        else:
            ess_threshold = t
    resampling = deprecated_alias(
        name, "resampling_scheme", resampling_scheme, "resampling", resampling, DEFAULT_RESAMPLING
    )
    check_resampling_args(resample, ess_threshold, resampling, where=name)
    if isinstance(num_particles, bool) or int(num_particles) != num_particles or num_particles < 1:
        raise ValueError(f"{name}: num_particles must be a positive integer, got {num_particles!r}")
    K = int(num_particles)
    T = x.shape[-2]
    batch_shape = x.shape[:-2]
    if mask is None:
        mask = torch.ones(batch_shape + (T,), dtype=torch.bool, device=x.device)
    mask = mask.to(torch.bool)
    batch_shape = broadcast_shapes(batch_shape, mask.shape[:-1], initial_dist.batch_shape)
    mask = mask.expand(batch_shape + (T,))
    x = torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device))

    z = _sample(initial_dist.expand((K,) + batch_shape))  # (K, *batch, S)
    log_W = None
    identity = (
        torch.arange(K, device=x.device)
        .reshape((K,) + (1,) * len(batch_shape))
        .expand((K,) + batch_shape)
    )
    particles, log_weights, ancestors, increments, esses, flags = [], [], [], [], [], []
    for t in range(T):
        if t == 0:
            log_W_bar = torch.full((K,) + batch_shape, -math.log(K), dtype=x.dtype, device=x.device)
            anc = identity
            flag = torch.zeros(batch_shape, dtype=torch.bool, device=x.device)
        else:
            if resample == "always":
                flag = torch.ones(batch_shape, dtype=torch.bool, device=x.device)
            elif resample == "never":
                flag = torch.zeros(batch_shape, dtype=torch.bool, device=x.device)
            else:
                flag = esses[-1] < ess_threshold * K
            if bool(flag.any()):
                drawn = _resample(log_W, resampling, generator=generator)
                anc = torch.where(flag, drawn, identity)
                z = torch.gather(z, 0, anc.unsqueeze(-1).expand(z.shape))
                log_W_bar = torch.where(flag, torch.full_like(log_W, -math.log(K)), log_W)
            else:
                anc, log_W_bar = identity, log_W
            z = _sample(transition_fn(z, t))
        log_alpha = observation_fn(z, t).log_prob(x[..., t, :])
        log_alpha = torch.where(
            mask[..., t], log_alpha, torch.zeros((), dtype=log_alpha.dtype, device=x.device)
        )
        log_W_unnorm = log_W_bar + log_alpha
        # exactly 0 at masked steps (where log_W_bar is already normalized)
        zero = torch.zeros((), dtype=log_W_unnorm.dtype, device=x.device)
        increments.append(torch.where(mask[..., t], torch.logsumexp(log_W_unnorm, 0), zero))
        log_W = normalize_log_weights(log_W_unnorm, 0)
        particles.append(z)
        log_weights.append(log_W)
        ancestors.append(anc)
        esses.append(effective_sample_size(log_W.detach(), 0))
        flags.append(flag)
    increments = torch.stack(increments, -1)
    return ParticleFilterResult(
        particles=torch.stack(particles, -2),
        log_weights=torch.stack(log_weights, -1),
        ancestors=torch.stack(ancestors, -1),
        log_likelihood_increments=increments,
        log_likelihood=increments.sum(-1),
        ess=torch.stack(esses, -1),
        resampled=torch.stack(flags, -1),
    )


def ancestral_paths(particles, ancestors):
    """Trace every final particle back through its ancestors (the genealogy of the particle
    system), giving ``K`` trajectories ``z_{1:T}^{(k)}`` that, weighted by the final weights,
    approximate the joint smoothing distribution ``p(z_{1:T} | x_{1:T})`` (thesis Sec. 3.5.1.4;
    degenerate for ``t << T`` because of path coalescence).

    :param torch.Tensor particles: ``(K, *batch, T, S)``.
    :param torch.LongTensor ancestors: ``(K, *batch, T)``.
    :returns: ``(K, *batch, T, S)``; ``out[k, ..., t]`` is the step-``t`` ancestor of the final
        particle ``k``.
    """
    K, T = particles.shape[0], particles.shape[-2]
    idx = torch.arange(K, device=ancestors.device)
    idx = idx.reshape((K,) + (1,) * (ancestors.dim() - 2)).expand(ancestors.shape[:-1])
    out = [None] * T
    for t in range(T - 1, -1, -1):
        zt = particles[..., t, :]
        out[t] = torch.gather(zt, 0, idx.unsqueeze(-1).expand(zt.shape))
        if t > 0:
            idx = torch.gather(ancestors[..., t], 0, idx)
    return torch.stack(out, -2)
