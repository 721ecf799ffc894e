"""KL annealing and free bits: training tricks against inactive latent units (thesis 4.8.1).

Early in training the KL term of a sequential VAE often collapses to zero and never recovers:
the approximate posterior copies the prior and the latent units become inactive (Burda et al.,
2015; Sonderby et al., 2016). Two remedies are implemented here as reusable pieces:

* **KL annealing** (Bowman et al., 2015; Sonderby et al., 2016): :class:`LatentScale` is a
  poutine that multiplies the ``scale`` of every *latent* (non-observed) sample site by
  :math:`\\beta`, both in the model and in the guide. With :class:`~pyro.infer.Trace_ELBO` the
  objective becomes

  .. math::

      \\mathcal{L}_\\beta = \\mathbb{E}_q[\\log p(x|z)]
          + \\beta\\,\\mathbb{E}_q[\\log p(z) - \\log q(z|x)]
      = \\mathbb{E}_q[\\log p(x|z)] - \\beta\\,\\mathrm{KL}(q(z|x)\\,\\|\\,p(z)),

  and :func:`linear_schedule` increases :math:`\\beta` linearly to 1. Because it only rescales
  site scores, it composes with every objective that reads ``site["scale"]``: the stock Pyro
  ELBOs, :class:`~pyro_seq.infer.IWAE` and :class:`~pyro_seq.infer.FIVO` (for the multi-sample
  bounds it tempers the importance weights, :math:`\\log w = \\log p(x|z) + \\beta(\\log p(z) -
  \\log q(z|x))`), and :class:`FreeBits_ELBO`.

* **Free bits** (Kingma et al., 2016, "Improved variational inference with inverse
  autoregressive flow", appendix C.8): :class:`FreeBits_ELBO` replaces the KL term of each group
  :math:`j` of latent variables by :math:`\\max(\\lambda, \\mathbb{E}_x[\\mathrm{KL}_j])`, the KL
  averaged over the data points of the minibatch, so that pushing a group's KL below
  :math:`\\lambda` nats earns nothing.

References

* [1] S. R. Bowman et al., "Generating sentences from a continuous space", CoNLL 2016.
* [2] C. K. Sonderby et al., "Ladder variational autoencoders", NeurIPS 2016.
* [3] D. P. Kingma et al., "Improved variational inference with inverse autoregressive flow",
  NeurIPS 2016.
* [4] M. Fraccaro, "Deep latent variable models for sequential data", PhD thesis, DTU 2018,
  section 4.8.1.
"""

import math
from typing import Any, Callable, Hashable, Union

import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer.trace_elbo import Trace_ELBO
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.messenger import Messenger
from pyro.util import warn_if_nan
from torch.distributions import kl_divergence

from pyro_seq.infer.protocol import is_step_program
from pyro_seq.pyro_internals import is_reparameterized

__all__ = ["LatentScale", "linear_schedule", "FreeBits_ELBO", "HandledStepProgram"]


class HandledStepProgram:
    """A step-protocol program (see :mod:`pyro_seq.models.base`) run under a messenger.

    Calling it, and its ``init``/``step`` methods, all run inside ``messenger``, so that
    handlers such as :class:`LatentScale` reach particle methods (FIVO) that drive the program
    one step at a time. Other attributes are forwarded to the wrapped program.

    :param pyro.poutine.messenger.Messenger messenger: the handler to install.
    :param program: a callable with ``init(state, x, mask, num_sequences=None)`` and
        ``step(state, t, x, mask, num_sequences=None)``.
    """

    def __init__(self, messenger: Messenger, program: Any) -> None:
        self._messenger = messenger
        self._program = program

    def __repr__(self) -> str:
        return f"{type(self._messenger).__name__}({self._program!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._messenger:
            return self._program(*args, **kwargs)

    def init(self, *args: Any, **kwargs: Any) -> Any:
        with self._messenger:
            return self._program.init(*args, **kwargs)

    def step(self, *args: Any, **kwargs: Any) -> Any:
        with self._messenger:
            return self._program.step(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_messenger", "_program"):
            raise AttributeError(name)
        return getattr(self._program, name)


class LatentScale(Messenger):
    """Multiply the score of every latent sample site by ``beta`` (KL annealing).

    Observed sites (``obs=...``) are left untouched; every other ``sample`` site -- in the model
    and in the guide -- has its ``scale`` multiplied by ``beta``. Wrap *both* model and guide::

        ls = LatentScale(0.2)
        svi = SVI(ls(m.model), ls(m.guide), optim, loss=Trace_ELBO())
        for step in range(num_steps):
            ls.beta = linear_schedule(step, start=0.2, num_steps=1000)
            svi.step(x, mask)

    With :class:`~pyro.infer.Trace_ELBO` the objective is
    :math:`\\mathbb{E}_q[\\log p(x|z)] - \\beta\\,\\mathbb{E}_q[\\log q(z|x) - \\log p(z)]`;
    ``beta=1`` is the ELBO and ``beta=0`` leaves only the reconstruction term (whose gradient
    still reaches the guide through reparameterized samples). Wrapping a step-protocol program
    (one with ``init``/``step``) returns a :class:`HandledStepProgram`, so the handler also
    applies when :class:`~pyro_seq.infer.FIVO` drives the program step by step.

    With the multi-sample bounds the weights are tempered, :math:`\\log w = \\log p(x|z) +
    \\beta(\\log p(z) - \\log q(z|x))`. :class:`~pyro_seq.infer.IWAE` with
    ``gradient_estimator="standard"`` differentiates that objective exactly (per draw); with
    ``gradient_estimator="dreg"`` it uses the doubly reparameterized coefficient
    :math:`(1-\\beta)\\tilde w_k + \\beta\\tilde w_k^2` derived for tempered weights (see
    :mod:`pyro_seq.infer.iwae`, eq. ``dreg-tempered``; Tucker et al.'s :math:`\\tilde w_k^2` is
    its :math:`\\beta = 1` case), which is unbiased for the same objective. That derivation needs
    one common :math:`\\beta` for the guide's joint :math:`\\log q`: wrap the *whole* guide with
    this handler and scale no guide site further (e.g. by :func:`pyro.poutine.scale`);
    otherwise DReG raises ``ValueError`` and ``gradient_estimator="standard"`` is the choice.

    :param float beta: non-negative, finite multiplier; the attribute ``beta`` may be changed
        between steps.
    """

    #: only scores are rescaled; sample values are untouched (lets models score time-parallel)
    preserves_sample_values = True

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        self.beta = beta

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        value = float(value)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {value}")
        self._beta = value

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if is_step_program(fn):
            return HandledStepProgram(self, fn)
        return super().__call__(fn)

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"]:
            msg["scale"] = self._beta * msg["scale"]


def linear_schedule(
    step: int, start: float = 0.2, end: float = 1.0, num_steps: int = 1000
) -> float:
    """Linear annealing schedule for :attr:`LatentScale.beta`.

    .. math:: \\beta(s) = \\mathrm{start} + (\\mathrm{end} - \\mathrm{start})
        \\min(s / \\mathrm{num\\_steps}, 1)

    so ``beta`` goes from ``start`` at step 0 to ``end`` at ``num_steps`` and stays there
    (the schedule of the thesis' chapter 5 experiments starts at 0.2 and reaches 1).

    :param int step: current optimisation step, ``>= 0``.
    :param float start: value at step 0.
    :param float end: value from ``num_steps`` on.
    :param int num_steps: length of the ramp, ``> 0``.
    :rtype: float
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if num_steps <= 0:
        raise ValueError(f"num_steps must be > 0, got {num_steps}")
    frac = min(float(step) / float(num_steps), 1.0)
    return float(start) + (float(end) - float(start)) * frac


class FreeBits_ELBO(Trace_ELBO):
    """ELBO with free bits (Kingma et al., 2016): no reward for a group KL below ``free_bits``.

    Latent sites are partitioned into groups :math:`j` (by ``group``). With :math:`S` the
    (plate-scaled) number of data points and :math:`\\mathrm{KL}_j(x)` the KL of group :math:`j`
    for data point :math:`x`, the objective is

    .. math::

        \\mathcal{L}_\\lambda = \\sum_x \\mathbb{E}_q[\\log p(x|z)]
            - \\sum_j S \\max\\Big(\\lambda, \\frac{1}{S}\\sum_x \\mathrm{KL}_j(x)\\Big)
        = \\sum_x \\mathbb{E}_q[\\log p(x|z)] - \\sum_j \\max\\Big(\\lambda S, \\sum_x
            \\mathrm{KL}_j(x)\\Big),

    i.e. the group's KL is averaged over the minibatch before the clamp, as in the paper. For
    :math:`\\lambda = 0` this is the ELBO of :class:`~pyro.infer.TraceMeanField_ELBO`. The KL of
    a site is the analytic :func:`torch.distributions.kl_divergence` of guide and model
    distributions when it is registered, otherwise the single-sample estimate
    :math:`\\log q(z) - \\log p(z)`; the guide must be reparameterized, and the mean-field
    caveat of :class:`~pyro.infer.TraceMeanField_ELBO` applies to the analytic KL (for a
    Markov chain of latents ``kl(q(z_t|z_{t-1}), p(z_t|z_{t-1}))`` evaluated at the sampled
    ``z_{t-1}`` is an unbiased estimate of the conditional KL term, which is what is wanted).

    Masks and plate scales are honoured: a masked-out element contributes neither KL nor
    :math:`S`; the clamp of a group uses :math:`S_j = \\max_{\\text{sites}} \\sum
    \\mathrm{scale}\\cdot\\mathrm{mask}`, the number of data points seen by the group's
    best-covered site (for a sequence group: all sequences present at step 1). Composes with
    :class:`LatentScale`: both the KL and :math:`S` carry :math:`\\beta`, so the clamped term is
    :math:`\\beta \\max(\\lambda S, \\sum_x \\mathrm{KL}_j)`.

    Free bits is defined for the single-sample ELBO's KL decomposition; multi-sample bounds
    (IWAE, FIVO) have no separate KL term and use :class:`LatentScale` instead.

    :param float free_bits: :math:`\\lambda`, in nats per group and data point, ``>= 0``.
    :param group: how latent sites form groups: ``"site"`` (default; each site, e.g. each
        ``z_t``, is a group), ``"dim"`` (each latent *dimension* of each site is a group; needs
        an analytic KL whose guide and model distributions are ``Independent`` over their event
        dimension), ``"all"`` (one group for all latents: the classic "KL >= lambda" hinge), or
        a callable ``name -> hashable`` mapping a site name to its group (e.g.
        ``lambda name: "z"`` for all ``z_t``).
    :param kwargs: passed to :class:`~pyro.infer.Trace_ELBO` (``num_particles``,
        ``max_plate_nesting``, ``vectorize_particles``, ...).
    """

    def __init__(
        self,
        free_bits: float = 0.0,
        group: Union[str, Callable[[str], Hashable]] = "site",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        free_bits = float(free_bits)
        if not (math.isfinite(free_bits) and free_bits >= 0):
            raise ValueError(f"free_bits must be a finite number >= 0, got {free_bits}")
        if not (callable(group) or group in ("site", "dim", "all")):
            raise ValueError(f"group must be 'site', 'dim', 'all' or a callable, got {group!r}")
        self.free_bits = free_bits
        self.group = group

    def _site_kl(self, name, model_site, guide_site):
        """Return ``(kl, count)``: scaled, masked KL tensor and the scaled data-point count.

        ``kl`` has the site's batch shape (plus a trailing event dim for ``group="dim"``).
        """
        q, p = guide_site["fn"], model_site["fn"]
        scale, mask = guide_site["scale"], guide_site["mask"]
        if self.group == "dim":
            try:
                kl = kl_divergence(q.base_dist, p.base_dist)
            except (AttributeError, NotImplementedError):
                raise NotImplementedError(
                    f"FreeBits_ELBO(group='dim') needs an analytic KL between Independent "
                    f"distributions at site {name!r}; got {type(q).__name__} and "
                    f"{type(p).__name__}"
                ) from None
            kl = kl.reshape(q.batch_shape + (-1,))
            m = mask.unsqueeze(-1) if torch.is_tensor(mask) else mask
            kl = scale_and_mask(kl, scale=scale, mask=m)
        else:
            try:
                kl = kl_divergence(q, p)
            except NotImplementedError:
                kl = guide_site["unscaled_log_prob"] - model_site["unscaled_log_prob"]
            kl = scale_and_mask(kl, scale=scale, mask=mask)
        ones = torch.ones(q.batch_shape, dtype=kl.dtype, device=kl.device)
        count = scale_and_mask(ones, scale=scale, mask=mask).sum()
        return kl, count

    def _group_key(self, name):
        if self.group in ("site", "dim"):
            return name
        if self.group == "all":
            return "all"
        return self.group(name)

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        elbo = 0.0
        groups = {}  # key -> [kl_sum, count]
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            if model_site["is_observed"]:
                elbo = elbo + model_site["log_prob_sum"]
                continue
            guide_site = guide_trace.nodes[name]
            if is_validation_enabled() and not is_reparameterized(guide_site):
                raise NotImplementedError(  # the message of Pyro's check_fully_reparametrized
                    "All distributions in the guide must be fully reparameterized."
                )
            kl, count = self._site_kl(name, model_site, guide_site)
            key = self._group_key(name)
            if self.group == "dim":
                kl = kl.reshape(-1, kl.shape[-1]).sum(0)  # one group per dimension
                for d in range(kl.shape[0]):
                    _add_to_group(groups, (key, d), kl[d], count)
            else:
                _add_to_group(groups, key, kl.sum(), count)
        for kl_sum, count in groups.values():
            elbo = elbo - torch.maximum(kl_sum, self.free_bits * count)
        for name, guide_site in guide_trace.nodes.items():
            if guide_site["type"] == "sample" and name not in model_trace.nodes:
                raise NotImplementedError(
                    f"FreeBits_ELBO does not support auxiliary guide site {name!r}"
                )
        loss = -(elbo.detach() if torch.jit.is_tracing() else torch_item(elbo))
        return loss, -elbo

    def loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        """
        :returns: an estimate of the negative free-bits objective :math:`-\\mathcal{L}_\\lambda`
        :rtype: float
        """
        loss = 0.0
        with torch.no_grad():
            for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
                loss_particle, _ = self._differentiable_loss_particle(model_trace, guide_trace)
                loss = loss + loss_particle / self.num_particles
        # pyro types warn_if_nan with numbers.Number, which mypy does not match to a float
        warn_if_nan(loss, "loss")  # type: ignore[call-overload]
        return loss


def _add_to_group(groups, key, kl_sum, count):
    if key in groups:
        groups[key][0] = groups[key][0] + kl_sum
        groups[key][1] = torch.maximum(groups[key][1], count)
    else:
        groups[key] = [kl_sum, count]
