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

All three are unbiased: ``E[#offspring of k] = K w_k``. The default is ``"systematic"``
everywhere in :mod:`pyro_seq` (lowest variance, unbiased like the others).

**Vocabulary** (shared by :func:`resample`, :func:`pyro_seq.ops.bootstrap_particle_filter`,
:class:`pyro_seq.infer.FIVO` and :func:`pyro_seq.infer.estimate_log_likelihood`):

* ``resample``: the criterion, one of :data:`RESAMPLE_CRITERIA`: ``"ess"`` (resample when the
  effective sample size falls below ``ess_threshold * K``), ``"always"`` or ``"never"``;
* ``ess_threshold``: the fraction of ``K`` in ``[0, 1]`` below which the ESS triggers resampling
  (``"ess"`` only);
* ``resampling``: the scheme, one of :data:`RESAMPLING_SCHEMES`, default ``"systematic"``.

The former names ``scheme`` (:func:`resample`), ``resample_threshold`` and
``resampling_scheme`` (:func:`~pyro_seq.ops.bootstrap_particle_filter`) still work for one
release and emit a :class:`FutureWarning`.
"""

import math
import warnings

import torch

__all__ = [
    "DEFAULT_RESAMPLING",
    "RESAMPLE_CRITERIA",
    "RESAMPLING_SCHEMES",
    "check_resampling_args",
    "check_weights",
    "draw_ancestors",
    "effective_sample_size",
    "log_mean_exp",
    "normalize_log_weights",
    "resample",
]

RESAMPLING_SCHEMES = ("multinomial", "stratified", "systematic")
RESAMPLE_CRITERIA = ("ess", "always", "never")
DEFAULT_RESAMPLING = "systematic"


def deprecated_alias(fn_name, old_name, old_value, new_name, new_value, new_default, stacklevel=3):
    """Resolve a deprecated keyword: warn (FutureWarning naming ``new_name``) and return the
    value to use. A conflicting non-default ``new_value`` raises ``ValueError``."""
    if old_value is None:
        return new_value
    warnings.warn(
        f"{fn_name}: `{old_name}` is deprecated and will be removed in the next release; use "
        f"`{new_name}` instead",
        FutureWarning,
        stacklevel=stacklevel,
    )
    if new_value != new_default and new_value != old_value:
        raise ValueError(
            f"{fn_name}: got both `{new_name}`={new_value!r} and its deprecated alias "
            f"`{old_name}`={old_value!r}; pass only `{new_name}`"
        )
    return old_value


def check_resampling_args(resample=None, ess_threshold=None, resampling=None, where="resampling"):
    """Validate the shared resampling arguments (see the module docstring); ``None`` skips one.

    :raises ValueError: with a message naming the argument and its allowed values.
    """
    if resample is not None and resample not in RESAMPLE_CRITERIA:
        raise ValueError(
            f"{where}: resample must be one of {RESAMPLE_CRITERIA} (the criterion), "
            f"got {resample!r}"
        )
    if resampling is not None and resampling not in RESAMPLING_SCHEMES:
        raise ValueError(
            f"{where}: resampling must be one of {RESAMPLING_SCHEMES} (the scheme), "
            f"got {resampling!r}"
        )
    if ess_threshold is not None:
        try:
            ok = 0.0 <= float(ess_threshold) <= 1.0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(
                f"{where}: ess_threshold must be a fraction of K in [0, 1], got {ess_threshold!r}"
            )


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


def resample(log_weights, resampling=DEFAULT_RESAMPLING, generator=None, *, scheme=None):
    """Draw ancestor indices with ``E[#offspring of particle k] = K * w_k``.

    :param torch.Tensor log_weights: unnormalized log-weights of shape ``(K, *batch)``,
        particles first (``*batch`` may be empty or several dims). Normalization is done here.
        Rows that are all ``-inf`` are not allowed (there is nothing to resample from).
    :param str resampling: the scheme, ``"multinomial"``, ``"stratified"`` or ``"systematic"``
        (default; see the module docstring for their offspring-count guarantees).
    :param torch.Generator generator: optional random generator (on ``log_weights.device``) for
        reproducible draws; the global RNG is used otherwise.
    :param str scheme: deprecated alias of ``resampling`` (emits a FutureWarning).
    :returns: ``torch.LongTensor`` ``ancestors`` of shape ``(K, *batch)`` with values in
        ``[0, K)``; ``ancestors[k, b]`` is the parent of new particle ``k`` in batch element
        ``b``. For the stratified and systematic schemes the indices are sorted along the
        particle dimension. Computed without gradient (integer indices are never differentiable).
    """
    resampling = deprecated_alias(
        "resample", "scheme", scheme, "resampling", resampling, DEFAULT_RESAMPLING
    )
    if resampling not in RESAMPLING_SCHEMES:
        raise ValueError(
            f"resample: unknown resampling scheme {resampling!r}; choose `resampling` from "
            f"{RESAMPLING_SCHEMES}"
        )
    if log_weights.dim() < 1:
        raise ValueError("log_weights needs a leading particle dimension")
    with torch.no_grad():
        lw = log_weights.detach()
        K = lw.shape[0]
        batch_shape = lw.shape[1:]
        probs = torch.softmax(lw.reshape(K, -1).to(torch.float64), dim=0)  # (K, B)
        check_weights(probs)
        anc = draw_ancestors(probs, resampling, generator)
        return anc.reshape((K,) + tuple(batch_shape)).contiguous()


def check_weights(probs):
    """Refuse normalized weights ``(K, B)`` with a NaN: ``softmax`` gives NaN for a column of
    log-weights that is all ``-inf``, has a ``+inf`` or has a NaN (nothing to resample from).

    :raises ValueError: naming the log-weights.
    """
    if torch.isnan(probs).any():
        raise ValueError(
            "resample: every batch element needs a finite log-weight and no NaN; check the "
            "log_weights passed (a column that is all -inf, +inf or NaN cannot be resampled)"
        )


def draw_ancestors(probs, resampling=DEFAULT_RESAMPLING, generator=None):
    """The draw of :func:`resample` from normalized weights (no argument checks).

    Callers that also need the normalized weights (e.g. for :func:`effective_sample_size` as
    ``1 / sum_k p_k^2``) compute ``softmax`` once and pass it here; the random draws are those
    of :func:`resample` for the same generator state.

    :param torch.Tensor probs: ``(K, B)`` float64 weights summing to one along dim 0.
    :param str resampling: ``"multinomial"``, ``"stratified"`` or ``"systematic"``.
    :param torch.Generator generator: optional random generator.
    :returns: ``(K, B)`` long ancestors (sorted along dim 0 for stratified and systematic).
    """
    K, B = probs.shape
    if resampling == "multinomial":
        return torch.multinomial(probs.T, K, replacement=True, generator=generator).T
    if resampling == "systematic":
        u0 = torch.rand(1, B, dtype=probs.dtype, device=probs.device, generator=generator)
    else:
        u0 = torch.rand(K, B, dtype=probs.dtype, device=probs.device, generator=generator)
    k = torch.arange(K, dtype=probs.dtype, device=probs.device).unsqueeze(-1)
    u = (k + u0) / K  # (K, B), sorted in [0, 1)
    cdf = torch.cumsum(probs, dim=0)
    cdf = cdf / cdf[-1:]  # exact 1 at the end despite rounding
    # The ancestor of u is the smallest k with cdf[k] > u: zero-weight particles, whose cdf
    # equals their predecessor's, are never chosen.
    anc = torch.searchsorted(cdf.T.contiguous(), u.T.contiguous(), right=True).T
    return anc.clamp_(max=K - 1)
