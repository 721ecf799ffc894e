r"""The importance weighted autoencoder bound (IWAE), per data point, with DReG gradients.

For a data point :math:`x` with latents :math:`z` and proposal :math:`q(z|x)` (thesis eq. 2.13;
Burda et al., 2016),

.. math::

    \mathcal{L}_K(x) = \mathbb{E}_{z^{(1:K)} \sim q}\Big[\log \frac{1}{K}\sum_{k=1}^K w_k\Big],
    \qquad w_k = \frac{p(x, z^{(k)})}{q(z^{(k)}|x)},

with :math:`\mathrm{ELBO} = \mathcal{L}_1 \le \mathcal{L}_K \le \mathcal{L}_{K+1} \le \log p(x)`.
For a minibatch the bound is applied to every data point separately and summed,
:math:`\frac{N}{B}\sum_{b=1}^B \mathcal{L}_K(x_b)`, where the data points are the elements of the
plates that contain *every* sample site of model and guide (for the sequence models: the batch
plate ``"sequences"``; a whole sequence is one data point). Pyro's
:class:`~pyro.infer.RenyiELBO` with ``alpha=0`` instead takes one log-mean-exp of the weight of
the entire minibatch, which is a looser bound for ``B > 1`` and mis-scales subsampled plates
(pyro issue #3104); for a single data point the two agree.

Gradients:

* ``gradient_estimator="standard"``: the gradient of the Monte Carlo bound
  :math:`\sum_k \tilde w_k \nabla \log w_k` (:math:`\tilde w_k = w_k / \sum_j w_j`) for
  reparameterized sites, plus a score-function term for non-reparameterized guide sites
  (:math:`s_k = \nabla \sum_{\text{non-reparam. sites}} \log q(z_k)`, unscaled):

  .. math::
      :label: iwae-score

      \sum_k \big(\hat{\mathcal L} - b_k\big)\, s_k, \qquad
      \hat{\mathcal L} = \log \frac1K \sum_j w_j .

  With ``score_baseline="vimco"`` (the default; used for :math:`K \ge 2`) :math:`b_k` is the
  leave-one-out baseline of VIMCO (Mnih & Rezende, 2016, eqs. 9-10): the bound recomputed with
  :math:`w_k` replaced by the geometric mean of the other weights,

  .. math::
      :label: vimco-baseline

      b_k = \log \frac1K \Big(\sum_{j \ne k} w_j + \exp\Big(\frac{1}{K-1}\sum_{j\ne k}
          \log w_j\Big)\Big).

  :math:`b_k` does not depend on :math:`z_k`, and :math:`\mathbb{E}[s_k \mid z_{-k}] = 0`, so
  the baseline changes the variance, not the expectation. The learning signal
  :math:`\hat{\mathcal L} - b_k` is :math:`O(1/K)`, so the variance of :eq:`iwae-score` falls
  with :math:`K`. ``score_baseline="none"`` (:math:`b_k = 0`, the plain REINFORCE term) is kept
  for comparison; its variance grows linearly with :math:`K`. For :math:`K \ge 2` the direct
  part :math:`-\sum_k \tilde w_k s_k` of :math:`\nabla \hat{\mathcal L}` is kept, as in
  VIMCO's estimator (Mnih & Rezende, 2016, sec. 3): its expectation is not zero.

  With :math:`K = 1` the estimator is :class:`~pyro.infer.Trace_ELBO`'s (``score_baseline`` is
  then ignored). There the direct part is :math:`-s_1`, which has expectation zero
  (:math:`\mathbb{E}_q[s_1] = 0`); keeping it would give the learning signal
  :math:`\log w_1 - 1`, REINFORCE with the arbitrary baseline 1 (measured: 2 to 4 times
  Trace_ELBO's variance for the guide parameters of a Bernoulli and a non-reparameterized
  Normal site). Trace_ELBO's surrogate drops it and Rao-Blackwellizes over plates (Ranganath
  et al., 2014, sec. 3):

  .. math::
      :label: elbo-surrogate

      \hat g_1 = \nabla\big(\log p(x, z) - \log q_{\mathcal R}(z)\big)
          + \sum_{i \notin \mathcal R} \sum_e [\log r]_{i,e}\, \nabla \log q_i(z_{i,e}),

  where :math:`\mathcal R` are the reparameterized guide sites (the first gradient runs through
  their samples), :math:`e` the elements of site :math:`i`, :math:`\log r = \log p(x, z) -
  \log q(z)` (detached) and :math:`[\log r]_{i,e}` the sum of its terms that share
  :math:`e`'s index in every plate of site :math:`i` (other elements of those plates are
  conditionally independent of :math:`z_{i,e}`). See :func:`elbo_surrogate`.
* ``gradient_estimator="dreg"``: the doubly reparameterized estimator of Tucker et al. (2019),
  generalized to tempered weights. Write the log weight as

  .. math::
      :label: dreg-logw

      \log w_k = a_\eta(z_k) - \beta \log q_\eta(z_k),

  where :math:`a` is the (scaled) model log joint and :math:`\beta` the common scale of the
  guide sites (``beta`` of :class:`~pyro_seq.infer.LatentScale`; 1 without it; the data-point
  plate factor :math:`N/B` is outside the log and divided out). The standard gradient of a
  guide parameter contains the score term :math:`-\beta\,\mathbb{E}[\sum_k \tilde w_k
  \partial_\eta \log q_\eta(z_k)|_{z}]`. Conditionally on :math:`z_{-k}`, Tucker's identity
  :math:`\mathbb{E}_q[f(z)\,\partial_\eta \log q_\eta(z)] = \mathbb{E}_\epsilon[\partial_z f\,
  dz/d\eta]` (both sides equal :math:`\partial_\eta \mathbb{E}_{q_\eta}[f]` with :math:`f` held
  fixed) with :math:`f = \tilde w_k` and :math:`\partial_{z_k} \tilde w_k = \tilde w_k(1-\tilde
  w_k)\,\partial_{z_k} \log w_k` turns it into :math:`-\beta\,\mathbb{E}[\sum_k \tilde w_k
  (1-\tilde w_k)\,\partial_{z_k}\log w_k\, dz_k/d\eta]`. Adding the path term :math:`\sum_k
  \tilde w_k \partial_{z_k}\log w_k\, dz_k/d\eta` gives, for every parameter :math:`\eta` (of
  model, guide, or shared between them),

  .. math::
      :label: dreg-tempered

      \hat g_{\mathrm{DReG}} = \sum_k \big((1-\beta)\tilde w_k + \beta\,\tilde w_k^2\big)\,
          \frac{\partial \log w_k}{\partial z_k} \frac{d z_k}{d \eta}
          + \sum_k \tilde w_k\,\frac{\partial a_\eta(z_k)}{\partial \eta}\Big|_{z_k},

  which is Tucker et al.'s :math:`\tilde w_k^2` at :math:`\beta = 1` and the plain
  reparameterization gradient at :math:`\beta = 0`. Here :math:`z_k` is the whole latent path of
  particle :math:`k` and :math:`q(z_k)` its joint density, so :eq:`dreg-tempered` holds for
  structured guides (``q(z_t|z_{t-1}, ...)``: :math:`dz_k/d\eta` is the total derivative through
  the chain) and for parameters shared by model and guide (the direct model term stays, the
  direct guide term is replaced). The identity needs *one* :math:`\beta` for the guide's joint
  :math:`\log q`; if guide sites carry different scales (after dividing out :math:`N/B`) the
  score term is not a multiple of the joint score and a ``ValueError`` asks for
  ``gradient_estimator="standard"``. It is implemented with a second pass of guide and model
  replayed at the *detached* samples (about twice the cost of the standard estimator), which
  isolates the direct derivatives :math:`\partial_\eta a|_z` and :math:`\partial_\eta \log q|_z`.
  It requires a fully reparameterized guide. Its expectation equals the standard gradient's,
  and its variance for the guide parameters does not grow with :math:`K` (Rainforth et al.,
  2018 show the signal-to-noise ratio of the standard guide gradient decays as
  :math:`1/\sqrt K`).

Subsampling: a plate with a random ``subsample_size`` draws its minibatch once per call; every
particle (vectorized or looped) and DReG's second pass see the same indices, so the :math:`K`
weights of data point :math:`b` all belong to the same :math:`x_b`.

References

* [1] Y. Burda, R. Grosse, R. Salakhutdinov, "Importance weighted autoencoders", ICLR 2016.
* [2] G. Tucker, D. Lawson, S. Gu, C. J. Maddison, "Doubly reparameterized gradient estimators
  for Monte Carlo objectives", ICLR 2019.
* [3] T. Rainforth et al., "Tighter variational bounds are not necessarily better", ICML 2018.
* [4] M. Fraccaro, PhD thesis, DTU 2018, sections 2.5.1 and 4.3.2.
* [5] A. Mnih, D. J. Rezende, "Variational inference for Monte Carlo objectives", ICML 2016.
* [6] R. Ranganath, S. Gerrish, D. M. Blei, "Black box variational inference", AISTATS 2014.
* [7] G. Roeder, Y. Wu, D. Duvenaud, "Sticking the landing", NeurIPS 2017.
* [8] J. Bornschein, Y. Bengio, "Reweighted wake-sleep", ICLR 2015.
"""

import math
from typing import Any, Callable, Tuple

import torch
from pyro import poutine
from pyro.distributions.util import is_identically_zero
from pyro.infer.enum import get_importance_trace
from pyro.infer.util import MultiFrameTensor, is_validation_enabled, torch_item
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from pyro.util import check_if_enumerated, warn_if_nan

from pyro_seq.infer.log_z_bound import LogZBound
from pyro_seq.ops.resampling import log_mean_exp
from pyro_seq.pyro_internals import is_reparameterized, vectorized_num_particles
from pyro_seq.validation import positive_int

__all__ = ["IWAE"]

GRADIENT_ESTIMATORS = ("standard", "dreg")
SCORE_BASELINES = ("vimco", "none")
_PARTICLE_PLATES = ("num_particles_vectorized",)


# ------------------------------------------------------------------ per-data-point log weights
def _frame_key(frame):
    return (frame.name, frame.dim, int(frame.size), frame.full_size)


def _sample_sites(*traces):
    for trace in traces:
        for site in trace.nodes.values():
            if site["type"] == "sample":
                yield site


def data_point_frames(traces, particle_plates=_PARTICLE_PLATES):
    """The vectorized plates that contain every sample site of ``traces`` (the data-point plates).

    :returns: list of :class:`~pyro.poutine.indep_messenger.CondIndepStackFrame`, sorted by dim.
    """
    shared, frames = None, {}
    for site in _sample_sites(*traces):
        keys = set()
        for f in site["cond_indep_stack"]:
            if f.vectorized and f.name not in particle_plates:
                keys.add(_frame_key(f))
                frames[_frame_key(f)] = f
        shared = keys if shared is None else shared & keys
    return sorted((frames[k] for k in (shared or ())), key=lambda f: f.dim)


def plate_scale(frames):
    """``prod(full_size / size)`` over subsampled ``frames`` (the minibatch -> data-set factor)."""
    scale = 1.0
    for f in frames:
        if f.full_size is not None and f.full_size != f.size:
            scale *= f.full_size / f.size
    return scale


def reduce_site(tensor, rank, keep_dims):
    """Sum ``tensor`` (a site's batch-shaped log prob) over every dim not in ``keep_dims``.

    ``tensor`` is left-padded to ``rank`` dims; negative dims in ``keep_dims`` are kept (with
    ``keepdim``), all others summed to size 1.
    """
    if not torch.is_tensor(tensor):
        return tensor
    if tensor.dim() > rank:
        raise ValueError(
            f"a site has batch shape {tuple(tensor.shape)} with more dims than the {rank} "
            "plate dims; declare every batch dim with pyro.plate (and set max_plate_nesting)"
        )
    tensor = tensor.reshape((1,) * (rank - tensor.dim()) + tuple(tensor.shape))
    sum_dims = [d for d in range(-rank, 0) if d not in keep_dims and tensor.shape[d] != 1]
    if sum_dims:
        tensor = tensor.sum(sum_dims, keepdim=True)
    return tensor


def site_log_weights(
    model_trace, guide_trace, rank, keep_dims, divide_scale=1.0, parts=("weight",)
):
    """Per-data-point sums of log-probabilities of two traces.

    :param model_trace: model trace with ``log_prob`` computed.
    :param guide_trace: guide trace with ``score_parts`` computed.
    :param int rank: number of batch dims to lay results out in (plates incl. particles).
    :param set keep_dims: negative dims kept (particle dim and data-point plate dims).
    :param float divide_scale: the data-point plate scale, divided out of site scales.
    :param parts: which sums to return, each a tensor broadcastable to ``rank`` dims (or 0.):

        * ``"weight"``: :math:`\\log p(x, z) - \\log q(z)` (scaled by the non-data-point part of
          each site's scale, masked);
        * ``"model"``: :math:`\\log p(x, z)` only;
        * ``"guide"``: :math:`\\log q(z)` only;
        * ``"score"``: unscaled, masked :math:`\\log q(z)` of non-reparameterized guide sites.
    :returns: tuple of tensors in the order of ``parts``.
    """
    out = {p: 0.0 for p in parts}
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample":
            continue
        if not site["is_observed"] and name not in guide_trace.nodes:
            raise ValueError(
                f"latent model site {name!r} has no guide site; importance weights need the "
                "guide to propose every latent variable"
            )
        lp = reduce_site(site["log_prob"], rank, keep_dims) / divide_scale
        for p in ("weight", "model"):
            if p in out:
                out[p] = out[p] + lp
    for site in guide_trace.nodes.values():
        if site["type"] != "sample":
            continue
        lq = reduce_site(site["log_prob"], rank, keep_dims) / divide_scale
        for p in ("guide",):
            if p in out:
                out[p] = out[p] + lq
        if "weight" in out:
            out["weight"] = out["weight"] - lq
        if "score" in out and not is_identically_zero(site["score_parts"].score_function):
            lu = site["unscaled_log_prob"]
            mask = site["mask"]
            if mask is not None and mask is not True:
                lu = torch.where(mask, lu, lu.new_zeros(()))  # mask=False sites: zeros
            out["score"] = out["score"] + reduce_site(lu, rank, keep_dims)
    return tuple(out[p] for p in parts)


def _full(tensor, shape, like):
    """Broadcast ``tensor`` (or the number 0.) to ``shape``."""
    if not torch.is_tensor(tensor):
        return like.new_full(shape, float(tensor))
    return tensor.expand(shape)


def check_fully_reparameterized(guide_trace: Any, who: str) -> None:
    for name, site in guide_trace.nodes.items():
        if site["type"] == "sample" and not is_reparameterized(site):
            raise ValueError(
                f"{who} needs a fully reparameterized guide, but guide site {name!r} "
                f"({type(site['fn']).__name__}) has no rsample; use "
                "gradient_estimator='standard' or a reparameterizable distribution"
            )


def common_guide_scale(guide_traces, divide_scale, who):
    r"""The one scale :math:`\beta` shared by every guide sample site (``divide_scale`` divided out).

    :eq:`dreg-tempered` needs the guide's joint :math:`\log q` scaled as a whole; a guide whose
    sites carry different scales (or a tensor scale that is not constant) is refused.

    :param guide_traces: guide traces (one per particle, or one vectorized trace).
    :param float divide_scale: the data-point plate factor :math:`N/B`.
    :returns: :math:`\beta` as a float (1.0 for a guide without sample sites).
    """
    beta, first = None, None
    for guide_trace in guide_traces:
        for name, site in guide_trace.nodes.items():
            if site["type"] != "sample":
                continue
            scale = site["scale"]
            if torch.is_tensor(scale):
                flat = scale.detach().reshape(-1)
                if flat.numel() == 0 or not bool((flat == flat[0]).all()):
                    raise ValueError(
                        f"{who} needs one scale for all guide sites, but guide site {name!r} has "
                        "a non-constant tensor scale; use gradient_estimator='standard'"
                    )
                scale = flat[0].item()
            scale = float(scale) / divide_scale
            if beta is None:
                beta, first = scale, name
            elif not math.isclose(scale, beta, rel_tol=1e-12, abs_tol=1e-300):
                raise ValueError(
                    f"{who} needs one scale for all guide sites (the doubly reparameterized "
                    "identity holds for the guide's joint log q scaled as a whole, e.g. by "
                    f"LatentScale), but site {first!r} has scale {beta:g} and site {name!r} "
                    f"{scale:g} (after dividing out the data-point plate factor "
                    f"{divide_scale:g}); use gradient_estimator='standard'"
                )
    return 1.0 if beta is None else beta


def vimco_leave_one_out(log_w: torch.Tensor) -> torch.Tensor:
    r"""VIMCO's leave-one-out baselines :math:`b_k` of :eq:`vimco-baseline`.

    :param torch.Tensor log_w: log weights, shape ``(K, E)`` with ``K >= 2``.
    :returns: tensor ``(K, E)``, :math:`b_k = \log\frac1K(\sum_{j\ne k} w_j +
        \exp(\frac{1}{K-1}\sum_{j\ne k}\log w_j))`. The sums over :math:`j \ne k` are formed
        from exclusive prefix and suffix sums (no subtraction of a dominant weight), so
        :math:`b_k` is accurate when one weight dominates, and a weight of zero gives no NaN.
    """
    K = log_w.shape[0]
    if K < 2:
        raise ValueError(f"the VIMCO baseline needs num_particles >= 2, got {K}")
    pad = log_w.new_zeros((1,) + log_w.shape[1:])
    ninf = torch.full_like(pad, -math.inf)
    # sum_{j != k} log w_j and log sum_{j != k} w_j from exclusive prefix/suffix reductions
    sum_others = torch.cat([pad, log_w.cumsum(0)[:-1]], 0) + torch.cat(
        [log_w.flip(0).cumsum(0).flip(0)[1:], pad], 0
    )
    lse_others = torch.logaddexp(
        torch.cat([ninf, torch.logcumsumexp(log_w, 0)[:-1]], 0),
        torch.cat([torch.logcumsumexp(log_w.flip(0), 0).flip(0)[1:], ninf], 0),
    )
    return torch.logaddexp(lse_others, sum_others / (K - 1)) - math.log(K)


def elbo_surrogate(model_trace, guide_trace):
    r"""The surrogate of :class:`~pyro.infer.Trace_ELBO` for one particle, :eq:`elbo-surrogate`.

    Model log-probabilities and the entropy terms of reparameterized guide sites enter as they
    are (their gradient is the path derivative); a non-reparameterized guide site :math:`i`
    enters only through its score term :math:`\sum [\log r]_{\downarrow i} \log q_i(z_i)`,
    where :math:`\log r = \log p(x, z) - \log q(z)` (scaled, masked, detached) is summed over
    every plate that does not hold site :math:`i` (partial Rao-Blackwellization, as in
    Trace_ELBO) and :math:`\log q_i` is unscaled and unmasked (Pyro's ``score_function``).

    :returns: a scalar tensor, or 0. for traces without sample sites.
    """
    surrogate, log_r = 0.0, None
    for site in _sample_sites(model_trace):
        surrogate = surrogate + site["log_prob_sum"]
    for site in _sample_sites(guide_trace):
        _, score_function, entropy_term = site["score_parts"]
        if not is_identically_zero(entropy_term):
            surrogate = surrogate - entropy_term.sum()
        if not is_identically_zero(score_function):
            if log_r is None:
                log_r = MultiFrameTensor()
                for m in _sample_sites(model_trace):  # log p - log q of the model's sites
                    term = m["log_prob"]
                    if not m["is_observed"]:
                        term = term - guide_trace.nodes[m["name"]]["log_prob"]
                    log_r.add((m["cond_indep_stack"], term.detach()))
                for g in _sample_sites(guide_trace):  # guide-only (auxiliary) sites
                    if g["name"] not in model_trace.nodes:
                        log_r.add((g["cond_indep_stack"], -g["log_prob"].detach()))
            signal = log_r.sum_to(site["cond_indep_stack"])
            surrogate = surrogate + (signal * score_function).sum()
    return surrogate


class _SharedSubsample(Messenger):
    """Makes every run of model and guide under it reuse the first run's plate subsamples.

    A plate with ``subsample_size`` emits a ``_Subsample`` sample site when it is entered; the
    first value drawn for each plate name is recorded and given to every later run (particles
    of the non-vectorized loop, DReG's replay), so all see the same minibatch.
    """

    #: it fixes plate subsample indices only, never a latent site's value, so a model's fused
    #: guide (:meth:`~pyro_seq.models.SequenceModel.guide_scan`) may run under it
    preserves_sample_values = True

    def __init__(self):
        super().__init__()
        self.values = {}

    def _pyro_sample(self, msg):
        if site_is_subsample(msg) and msg["value"] is None and msg["name"] in self.values:
            msg["value"] = self.values[msg["name"]]

    def _pyro_post_sample(self, msg):
        if site_is_subsample(msg) and msg["name"] not in self.values:
            self.values[msg["name"]] = msg["value"]


def detached_replay_trace(guide_trace):
    """A trace holding the guide's sample values detached, for :func:`pyro.poutine.replay`."""
    tr = poutine.Trace()
    for name, site in guide_trace.nodes.items():
        if site["type"] == "sample":
            tr.add_node(name, **dict(site, value=site["value"].detach()))
    return tr


class IWAE(LogZBound):
    r"""Importance weighted bound :math:`\sum_b \mathcal{L}_K(x_b)` (module docstring), per data point.

    Used like any Pyro ELBO: ``SVI(model, guide, optim, loss=IWAE(num_particles=8))``.
    ``loss`` returns :math:`-\frac{N}{B}\sum_b \log \frac{1}{K}\sum_k w_{k,b}` for one draw of
    the :math:`K` particles, where :math:`w_{k,b}` is the weight of data point :math:`b` (all
    sites of the data-point plates, see :func:`data_point_frames`; sites masked out contribute
    zero, so padded time steps add nothing) and :math:`N/B` the subsampling scale of those
    plates. Other site scales (e.g. :class:`~pyro_seq.infer.LatentScale`) multiply their terms
    inside :math:`\log w`. With no plate shared by every site the whole batch is one data point,
    which is exactly :class:`~pyro.infer.RenyiELBO` with ``alpha=0``. A model and guide without
    sample sites give 0, as :class:`~pyro.infer.Trace_ELBO` does.

    Under :class:`~pyro_seq.infer.LatentScale` (every latent site of model and guide scaled by
    :math:`\beta`) the weights are tempered, :math:`\log w = \log p(x|z) + \beta(\log p(z) -
    \log q(z|x))`; the ``"standard"`` gradient is the exact gradient of that Monte Carlo
    objective, and ``"dreg"`` uses the tempered coefficient :math:`(1-\beta)\tilde w_k +
    \beta\tilde w_k^2` of :eq:`dreg-tempered` (unbiased for the same objective). ``"dreg"``
    refuses guides whose sites carry different scales.

    Plates with a random ``subsample_size`` draw one minibatch per call, shared by all particles
    (also with ``vectorize_particles=False``) and by DReG's second pass.

    With ``num_particles=1`` the ``"standard"`` estimator is :class:`~pyro.infer.Trace_ELBO`'s
    (same loss, same surrogate gradient, :eq:`elbo-surrogate`); ``"dreg"`` at :math:`K = 1` is
    instead the path-derivative ("sticking the landing") gradient of Roeder et al. (2017).

    Non-reparameterized guide sites with :math:`K \ge 2`: the noise of their parameters'
    gradient comes from the score term :eq:`iwae-score`. Without a baseline (``score_baseline="none"``) its learning
    signal :math:`\hat{\mathcal L}` is :math:`O(1)` and multiplies :math:`K` independent
    zero-mean scores, so its variance grows linearly in :math:`K` (Mnih & Rezende, 2016, sec. 3;
    Burda et al., 2016, sec. 3, derive the IWAE gradient for reparameterized latents only).
    VIMCO's baseline (the default) makes the signal :math:`O(1/K)` and the variance fall about
    as :math:`1/K`; measured for one Bernoulli latent, variance of one draw 0.042, 0.0089,
    0.0027, 0.00069 at :math:`K` = 2, 8, 32, 128, against 1.2, 4.1, 13.5, 52 without a
    baseline. But the gradient itself falls as :math:`1/K` (the bound tends to
    :math:`\log p(x)`, whatever :math:`q`), so the signal-to-noise ratio of the guide gradient
    still decays, about as :math:`1/\sqrt K` (there 0.99, 0.82, 0.38, 0.19), as Rainforth et
    al. (2018), sec. 3, show for the reparameterized estimator.

    Instead, where possible:

    * make the site reparameterizable and use ``gradient_estimator="dreg"`` (Tucker et al.,
      2019, sec. 3): no score term, and a guide-gradient variance that does not grow with
      :math:`K`;
    * sum out discrete latents exactly with Pyro's :class:`~pyro.infer.TraceEnum_ELBO`
      (no score term at all);
    * at :math:`K = 1`, Pyro's :class:`~pyro.infer.TraceGraph_ELBO` Rao-Blackwellizes over the
      dependency graph and takes learned or decaying-average baselines
      (``infer={"baseline": ...}``);
    * :class:`~pyro.infer.ReweightedWakeSleep` (Bornschein & Bengio, 2015) trains the guide on
      the :math:`K` self-normalized weights without a score function (no minibatches).

    Pyro's :class:`~pyro.infer.RenyiELBO` is no substitute: at ``alpha=0`` the parameters of a
    non-reparameterized guide site get no gradient from its surrogate.

    :param int num_particles: :math:`K \ge 1`.
    :param bool vectorize_particles: draw the :math:`K` particles in one pass inside a plate
        at dim ``-max_plate_nesting - 1`` (needs static structure); otherwise loop.
    :param int max_plate_nesting: bound on nested plates of model and guide (guessed by running
        them once if omitted, as in :class:`~pyro.infer.ELBO`).
    :param str gradient_estimator: ``"standard"`` or ``"dreg"`` (module docstring).
    :param str score_baseline: control variate of the score-function term of
        non-reparameterized guide sites under ``"standard"``: ``"vimco"`` (default, the
        leave-one-out baseline :eq:`vimco-baseline`) or ``"none"`` (plain REINFORCE,
        :math:`b_k = 0`). Ignored for ``num_particles=1`` (Trace_ELBO's estimator).
    :param kwargs: other :class:`~pyro.infer.ELBO` options (``retain_graph``, ...).
    """

    def __init__(
        self,
        num_particles: int = 2,
        vectorize_particles: bool = True,
        max_plate_nesting: float = float("inf"),
        gradient_estimator: str = "standard",
        score_baseline: str = "vimco",
        **kwargs: Any,
    ) -> None:
        num_particles = positive_int("num_particles", num_particles)
        if gradient_estimator not in GRADIENT_ESTIMATORS:
            raise ValueError(
                f"gradient_estimator must be one of {GRADIENT_ESTIMATORS}, got {gradient_estimator!r}"
            )
        if score_baseline not in SCORE_BASELINES:
            raise ValueError(
                f"score_baseline must be one of {SCORE_BASELINES}, got {score_baseline!r}"
            )
        super().__init__(
            num_particles=int(num_particles),
            max_plate_nesting=max_plate_nesting,
            vectorize_particles=vectorize_particles,
            **kwargs,
        )
        self.gradient_estimator = gradient_estimator
        self.score_baseline = score_baseline

    def _get_trace(self, model, guide, args, kwargs):
        model_trace, guide_trace = get_importance_trace(
            "flat", self.max_plate_nesting, model, guide, args, kwargs
        )
        if is_validation_enabled():
            check_if_enumerated(guide_trace)
        return model_trace, guide_trace

    def _get_traces(self, model, guide, args, kwargs):
        if self._vectorized:
            yield from super()._get_traces(model, guide, args, kwargs)
        else:  # one particle, or a loop: no plate, so no need to guess max_plate_nesting
            for _ in range(self.num_particles):
                yield self._get_trace(model, guide, args, kwargs)

    @property
    def _vectorized(self):
        return self.vectorize_particles and self.num_particles > 1

    def _layout(self, traces):
        """How per-site log-probs of ``traces`` are laid out and stacked into ``(K, E)``.

        :returns: dict with ``frames`` (data-point plates), ``keep`` (dims not summed),
            ``rank``, ``particle_dim`` (None when particles are stacked from a loop),
            ``shape`` (full per-trace layout) and ``scale`` (``N / B`` of the data-point plates).
        """
        frames = data_point_frames([tr for pair in traces for tr in pair])
        keep = {f.dim for f in frames}
        if self._vectorized:
            particle_dim = -self.max_plate_nesting
            keep.add(particle_dim)
            rank = self.max_plate_nesting
        else:
            particle_dim = None
            rank = max(
                (
                    -f.dim
                    for pair in traces
                    for s in _sample_sites(*pair)
                    for f in s["cond_indep_stack"]
                    if f.vectorized
                ),
                default=0,
            )
        rank = max(rank, max((-d for d in keep), default=0))
        shape = [1] * rank
        for f in frames:
            shape[f.dim] = int(f.size)
        if particle_dim is not None:
            shape[particle_dim] = self.num_particles
        return dict(
            frames=frames,
            keep=keep,
            rank=rank,
            particle_dim=particle_dim,
            shape=shape,
            scale=plate_scale(frames),
        )

    def _stack(self, traces, layout, parts, like=None):
        """``site_log_weights`` of every (model, guide) pair, as tensors ``(K, E)`` per part."""
        results = [
            site_log_weights(m, g, layout["rank"], layout["keep"], layout["scale"], parts)
            for m, g in traces
        ]
        if like is None:  # no tensor at all: a model and guide without sample sites
            like = next((t for r in results for t in r if torch.is_tensor(t)), torch.zeros(()))
        shape = layout["shape"]
        if layout["particle_dim"] is not None:
            (res,) = results
            return [_full(t, shape, like).reshape(self.num_particles, -1) for t in res]
        return [
            torch.stack([_full(r[i], shape, like).reshape(-1) for r in results])
            for i in range(len(parts))
        ]

    def _log_weights(self, model, guide, args, kwargs, parts):
        """Run the particles; return ``(tensors (K, E) for parts, layout, traces, programs)``.

        ``programs`` are ``(model, guide)`` wrapped so that every later run of them (DReG's
        replay) reuses the plate subsamples the particles drew.
        """
        share = _SharedSubsample()
        model, guide = share(model), share(guide)
        traces = list(self._get_traces(model, guide, args, kwargs))
        layout = self._layout(traces)
        return self._stack(traces, layout, parts), layout, traces, (model, guide)

    def _replay_detached(self, model, guide, traces, args, kwargs):
        """Model and guide replayed at the detached guide samples (DReG's second pass)."""
        if self._vectorized:
            model, guide = (
                vectorized_num_particles(self, model),
                vectorized_num_particles(self, guide),
            )
        replays = []
        for _model_trace, guide_trace in traces:
            check_fully_reparameterized(guide_trace, "IWAE(gradient_estimator='dreg')")
            replayed = poutine.replay(guide, trace=detached_replay_trace(guide_trace))
            replays.append(self._get_trace(model, replayed, args, kwargs))
        return replays

    def _bound_and_surrogate(self, model, guide, args, kwargs):
        """Return ``(bound, surrogate)`` tensors; ``surrogate`` has the estimator's gradient."""
        (log_w, score), layout, traces, (model, guide) = self._log_weights(
            model, guide, args, kwargs, ("weight", "score")
        )
        scale = layout["scale"]
        log_z = log_mean_exp(log_w, dim=0)  # (E,)
        bound = scale * log_z.sum()
        if self.gradient_estimator == "standard" and self.num_particles == 1:
            # K = 1: Trace_ELBO's estimator (elbo-surrogate), without the zero-mean -s term
            ((model_trace, guide_trace),) = traces
            surrogate = elbo_surrogate(model_trace, guide_trace)
            return bound, surrogate if torch.is_tensor(surrogate) else bound
        if self.gradient_estimator == "standard":
            # reparameterized paths through log_z; score term (iwae-score) for non-reparam sites
            surrogate = log_z
            if score.requires_grad:
                signal = log_z.detach().expand_as(log_w)  # (K, E)
                if self.score_baseline == "vimco" and self.num_particles > 1:
                    signal = signal - vimco_leave_one_out(log_w.detach())
                surrogate = surrogate + (signal * score).sum(0)
            return bound, scale * surrogate.sum()
        # DReG (dreg-tempered): replay at detached z to isolate the direct derivatives of
        # log q(z-bar) and log p(x, z-bar); log_w has direct + path derivatives.
        replays = self._replay_detached(model, guide, traces, args, kwargs)
        beta = common_guide_scale([g for _, g in traces], scale, "IWAE(gradient_estimator='dreg')")
        log_p_det, log_q_det = self._stack(replays, layout, ("model", "guide"), like=log_w)
        w = torch.softmax(log_w.detach(), dim=0)  # normalized weights (K, E)
        path = log_w - (log_p_det - log_q_det)  # gradient: path derivative of log w only
        coef = (1.0 - beta) * w + beta * w.pow(2)
        surrogate = (coef * path + w * log_p_det).sum(0)
        return bound, scale * surrogate.sum()

    def log_z(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Tuple[torch.Tensor, float]:
        r"""One draw of :math:`\log \frac{1}{K}\sum_k w_{k,e}` for every data point :math:`e`.

        :returns: ``(log_z, scale)``: tensor ``(E,)`` over the elements of the data-point plates
            (for sequence models: ``(batch,)``; ``(1,)`` when no plate holds every site), with
            gradients, and the subsampling factor ``N / B`` of those plates.
        """
        (log_w,), layout, _, _ = self._log_weights(model, guide, args, kwargs, ("weight",))
        return log_mean_exp(log_w, dim=0), layout["scale"]

    def differentiable_loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """
        :returns: a differentiable tensor whose value is the negative IWAE bound and whose
            gradient is the chosen estimator (``standard`` or ``dreg``) of its gradient.
        :rtype: torch.Tensor
        """
        bound, surrogate = self._bound_and_surrogate(model, guide, args, kwargs)
        loss = -bound.detach() - (surrogate - surrogate.detach())
        warn_if_nan(loss, "loss")
        return loss

    def loss_and_grads(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        """
        :returns: an estimate of the negative IWAE bound
        :rtype: float

        Computes the bound and back-propagates the surrogate of the chosen gradient estimator
        into the parameters of model and guide.
        """
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        if loss.requires_grad:
            loss.backward(retain_graph=self.retain_graph)
        return torch_item(loss)
