"""Log-weight arithmetic and resampling schemes for particle methods (pure torch).

Shape convention (shared with :mod:`pyro_seq.ops.particle_filter`, the FIVO objective and
:meth:`pyro_seq.ops.state.SequenceState.resample`): **particles come first**. Log-weights have
shape ``(K, *batch)`` where ``K`` is the number of particles; ancestor indices returned by
:func:`resample` have the same shape, and ``ancestors[k, b]`` is the index (along the particle
dimension) of the particle that the new particle ``k`` of batch element ``b`` is a copy of, so
that ``new = value.gather(0, ancestors)`` (see :func:`pyro_seq.ops.state.gather_particles`).

Resampling (thesis Sec. 3.5.1.4; Doucet & Johansen 2008) draws ``K`` ancestor indices such that
the expected number of offspring of particle ``k`` is ``K * w_k`` for normalized weights
``w_k``. Indices are integers, so **no gradient flows through resampling**: an objective that
differentiates through a resampled particle system (FIVO) ignores the score-function term of the
resampling distribution. This gives a biased gradient estimate of the objective, a bias that
Maddison et al. (2017), Le et al. (2018) and Naesseth et al. (2018) accept because the omitted
term has very high variance (thesis Sec. 4.3.2).

Schemes:

* ``"multinomial"``: ``K`` i.i.d. draws from ``Categorical(w)``. Offspring counts are
  ``Multinomial(K, w)``, variance ``K w_k (1 - w_k)``.
* ``"stratified"``: one uniform per stratum, ``u_k = (k + U_k) / K`` with independent
  ``U_k ~ U[0, 1)``, mapped through the inverse CDF of ``w``. Offspring counts lie within
  ``floor(K w_k) - 1`` and ``ceil(K w_k) + 1``.
* ``"systematic"``: as stratified but with a single uniform ``U`` shared by all strata,
  ``u_k = (k + U) / K``. Offspring counts are ``floor(K w_k)`` or ``ceil(K w_k)`` (the lowest
  variance of the three; not independent across particles).

All three are unbiased: ``E[#offspring of k] = K w_k``.
"""

import math

import torch

__all__ = ["RESAMPLING_SCHEMES", "effective_sample_size", "log_mean_exp", "normalize_log_weights", "resample"]

RESAMPLING_SCHEMES = ("multinomial", "stratified", "systematic")


def log_mean_exp(x, dim=0, keepdim=False):
    """Numerically stable ``log(mean(exp(x), dim))``.

    This is the log of the per-step likelihood estimate ``(1/K) sum_k w_k`` of eq. (3.20) when
    ``x`` holds log incremental weights with particles along ``dim``.

    :param torch.Tensor x: any shape; entries may be ``-inf`` (an all ``-inf`` slice gives
        ``-inf``).
    :param int dim: the dimension to average over.
    :param bool keepdim: keep ``dim`` with size 1.
    :returns: ``x`` reduced over ``dim``: ``logsumexp(x, dim) - log(x.shape[dim])``.
    """
    n = x.shape[dim]
    return torch.logsumexp(x, dim=dim, keepdim=keepdim) - math.log(n)


def normalize_log_weights(log_weights, dim=0):
    """Log of the normalized weights ``w_k / sum_j w_j`` (i.e. ``log_softmax``).

    :param torch.Tensor log_weights: unnormalized log-weights, particles along ``dim``.
    :returns: tensor of the same shape whose ``exp`` sums to one along ``dim``.
    """
    return log_weights - torch.logsumexp(log_weights, dim=dim, keepdim=True)


def effective_sample_size(log_weights, dim=0):
    """Effective sample size ``1 / sum_k wtilde_k^2`` of the normalized weights (Liu & Chen 1998;
    thesis Sec. 3.5.1.4, the ``R_eff`` criterion for adaptive resampling).

    Computed in log space as ``exp(2 logsumexp(l) - logsumexp(2 l))`` for unnormalized log-weights
    ``l``, so it is invariant to adding a constant to ``log_weights``. It lies in ``[1, K]``:
    ``K`` for equal weights, ``1`` when a single particle carries all the weight.

    :param torch.Tensor log_weights: unnormalized log-weights of shape ``(K, *batch)`` (particles
        along ``dim``).
    :param int dim: the particle dimension.
    :returns: tensor of shape ``batch`` (``log_weights`` with ``dim`` removed).
    """
    return torch.exp(
        2 * torch.logsumexp(log_weights, dim=dim) - torch.logsumexp(2 * log_weights, dim=dim)
    )


def resample(log_weights, scheme="multinomial", generator=None):
    """Draw ancestor indices with ``E[#offspring of particle k] = K * w_k``.

    :param torch.Tensor log_weights: unnormalized log-weights of shape ``(K, *batch)``,
        particles first (``*batch`` may be empty or several dims). Normalization is done here.
        Rows that are all ``-inf`` are not allowed (there is nothing to resample from).
    :param str scheme: ``"multinomial"``, ``"stratified"`` or ``"systematic"`` (see the module
        docstring for their offspring-count guarantees).
    :param torch.Generator generator: optional random generator (on ``log_weights.device``) for
        reproducible draws; the global RNG is used otherwise.
    :returns: ``torch.LongTensor`` ``ancestors`` of shape ``(K, *batch)`` with values in
        ``[0, K)``; ``ancestors[k, b]`` is the parent of new particle ``k`` in batch element
        ``b``. For the stratified and systematic schemes the indices are sorted along the
        particle dimension. Computed without gradient (integer indices are never differentiable).
    """
    if scheme not in RESAMPLING_SCHEMES:
        raise ValueError(f"unknown resampling scheme {scheme!r}; choose from {RESAMPLING_SCHEMES}")
    if log_weights.dim() < 1:
        raise ValueError("log_weights needs a leading particle dimension")
    with torch.no_grad():
        lw = log_weights.detach()
        K = lw.shape[0]
        batch_shape = lw.shape[1:]
        flat = lw.reshape(K, -1).to(torch.float64)  # (K, B)
        B = flat.shape[1]
        if torch.isneginf(flat).all(0).any() or torch.isnan(flat).any():
            raise ValueError("resample: every batch element needs a finite log-weight and no NaN")
        probs = torch.softmax(flat, dim=0)  # (K, B)
        if scheme == "multinomial":
            anc = torch.multinomial(probs.T, K, replacement=True, generator=generator).T
        else:
            if scheme == "systematic":
                u0 = torch.rand(1, B, dtype=torch.float64, device=flat.device, generator=generator)
            else:
                u0 = torch.rand(K, B, dtype=torch.float64, device=flat.device, generator=generator)
            k = torch.arange(K, dtype=torch.float64, device=flat.device).unsqueeze(-1)
            u = (k + u0) / K  # (K, B), sorted in [0, 1)
            cdf = torch.cumsum(probs, dim=0)
            cdf = cdf / cdf[-1:]  # exact 1 at the end despite rounding
            # The ancestor of u is the smallest k with cdf[k] > u: zero-weight particles, whose
            # cdf equals their predecessor's, are never chosen.
            anc = torch.searchsorted(cdf.T.contiguous(), u.T.contiguous(), right=True).T
            anc = anc.clamp_(max=K - 1)
        return anc.reshape((K,) + tuple(batch_shape)).contiguous()
