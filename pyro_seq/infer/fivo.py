r"""The filtering variational objective (FIVO): a bound from a particle filter's likelihood estimate.

A particle filter (thesis 3.5.1.4) with proposal :math:`q(z_t | z_{1:t-1}, x)` propagates
:math:`K` particles per sequence; at step :math:`t` each particle gets the incremental weight
(thesis eq. 3.18)

.. math:: \alpha_t^{(k)} = \frac{p(x_t | z_{1:t}^{(k)}, x_{1:t-1})\, p(z_t^{(k)} | z_{1:t-1}^{(k)},
    x_{1:t-1})}{q(z_t^{(k)} | z_{1:t-1}^{(k)}, x)},

and the product over resampling epochs of the average weights is an unbiased estimate of the
marginal likelihood (thesis eq. 3.20, 4.10): with resampling times :math:`t_1 < \dots < t_R`
and :math:`t_0 = 0`, :math:`t_{R+1} = T`,

.. math:: \hat p(x_{1:T}) = \prod_{r=0}^{R} \frac{1}{K}\sum_{k=1}^K \prod_{t=t_r+1}^{t_{r+1}}
    \alpha_t^{(k)}, \qquad \mathbb{E}[\hat p(x_{1:T})] = p(x_{1:T}).

By Jensen's inequality :math:`\mathcal{L}^{\mathrm{FIVO}}_K = \mathbb{E}[\log \hat p(x_{1:T})] \le
\log p(x_{1:T})` (Maddison et al., 2017; Le et al., 2018; Naesseth et al., 2018; thesis 4.3.2).
Without resampling it is the IWAE bound; with :math:`K = 1` it is the ELBO.

Resampling uses the vocabulary of :mod:`pyro_seq.ops.resampling`: the criterion ``resample``
(as FIVO's ``smc.py``) is ``"always"``, ``"never"``, or ``"ess"``: resample a sequence's
particles when their effective sample size :math:`1/\sum_k \tilde w_k^2` falls below
``ess_threshold * K``; the scheme ``resampling`` is ``"systematic"`` (default),
``"stratified"`` or ``"multinomial"`` (:func:`pyro_seq.ops.resampling.resample`). Every scheme
and every such criterion keeps :math:`\hat p` unbiased.

**Gradient bias.** Ancestor indices are integers and the resampling decision is a comparison:
no gradient flows through either. The gradient of :math:`\log \hat p` is taken with the
ancestors held fixed, which drops the score-function term :math:`\log \hat p\, \nabla \log
P(\text{ancestors})` of the resampling distribution. The resulting gradient estimate is biased;
Maddison et al. (2017), Le et al. (2018) and Naesseth et al. (2018) report that the omitted
term has very high variance and that dropping it works better in practice (thesis 4.3.2). The
*value* of the bound is unaffected.

**Reparameterized guides.** The training objective (:meth:`FIVO.loss`,
:meth:`FIVO.differentiable_loss`, :meth:`FIVO.loss_and_grads`) refuses a guide with a site that
has no ``rsample`` (``ValueError``), since its gradient would silently miss the score-function
term of that site; :meth:`FIVO.loss` refuses it too, so that the value reported for an
objective is always that of an objective that can be trained. Evaluating the bound needs no
gradient: :meth:`FIVO.log_z` (the estimator of ``estimate_log_likelihood(method="smc")``)
accepts any guide.

Ragged batches: padded steps are masked, so their incremental weights are 1 (log 0), and a
sequence is never resampled after its last step; each sequence's estimate is that of a particle
filter run on its own length. The bound of a minibatch is :math:`\frac{N}{B}\sum_b \log \hat
p(x^{(b)})` (``N = num_sequences``).

References

[1] C. J. Maddison et al., "Filtering variational objectives", NeurIPS 2017.
[2] T. A. Le et al., "Auto-encoding sequential Monte Carlo", ICLR 2018.
[3] C. A. Naesseth et al., "Variational sequential Monte Carlo", AISTATS 2018.
[4] M. Fraccaro, PhD thesis, DTU 2018, sections 3.5.1.4 and 4.3.2.
"""

from typing import Any, List, Optional, Tuple

import pyro
import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from pyro.util import check_site_shape, warn_if_nan

from pyro_seq.infer.iwae import reduce_site
from pyro_seq.infer.log_z_bound import LogZBound
from pyro_seq.infer.protocol import program_device, require_step_program
from pyro_seq.ops.resampling import (
    DEFAULT_RESAMPLING,
    effective_sample_size,
    log_mean_exp,
    resample,
)
from pyro_seq.ops.resampling import (
    check_resampling_args as _check_resampling_args,
)
from pyro_seq.ops.state import SequenceState
from pyro_seq.pyro_internals import is_reparameterized
from pyro_seq.validation import positive_int, prepare_sequences

__all__ = ["FIVO"]

PARTICLE_PLATE = "fivo_particles"


def _parse_args(args, kwargs, device=None):
    """``(x, mask, num_sequences, observed, inputs)`` from the arguments of a step-protocol
    program.

    With ``observed`` (missing data inside sequences) ``x`` is returned zero-filled at the
    unobserved entries; the programs' ``init`` keeps the mask for their observation sites.
    ``device``: the model program's (``model.device``, e.g. :attr:`StepProgram.device`), when
    it has one: the batch must be there (a ValueError naming the tensor otherwise)."""
    names = ("x", "mask", "num_sequences", "observed", "inputs")
    extra = set(kwargs) - set(names)
    if len(args) > 5 or extra:
        raise TypeError(
            "FIVO programs take (x, mask=None, num_sequences=None, observed=None, "
            f"inputs=None); got extra {sorted(extra)}"
        )
    values = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in values:
            raise TypeError(f"got multiple values for argument {k!r}")
        values[k] = v
    # the package's one validator (model-specific checks, e.g. feature size and binary data for
    # a Bernoulli likelihood, follow in the model's ``init``)
    observed = values.get("observed")
    x, mask, _ = prepare_sequences(
        values.get("x"), values.get("mask"), observed=observed, device=device
    )
    return x, mask, values.get("num_sequences"), observed, values.get("inputs")


class _StepSites(Messenger):
    """Collects the sample sites of one program step (a light stand-in for trace + replay).

    ``run(fn, replay, *args)`` calls ``fn(*args)`` and returns ``(sites, latent)``: the messages
    of its sample sites in execution order, after every handler inside has processed them
    (plates, scales, masks), without the subsample sites of plates; and its non-observed
    messages by name (subsample sites included). With ``replay`` (such a dict from the guide),
    non-observed sites of ``fn`` take the guide's values, as
    :class:`~pyro.poutine.replay_messenger.ReplayMessenger` sets them in
    ``trace(replay(model, guide_trace))``.
    """

    def __init__(self):
        super().__init__()
        self._sites, self._latent, self._replay = [], {}, None

    def run(self, fn, replay, *args):
        self._sites, self._latent, self._replay = [], {}, replay
        try:
            fn(*args)
            return self._sites, self._latent
        finally:
            self._sites, self._latent, self._replay = [], {}, None

    def _pyro_sample(self, msg):
        if self._replay is None or msg["is_observed"]:
            return
        guide_msg = self._replay.get(msg["name"])
        if guide_msg is not None:
            msg["value"] = guide_msg["value"]
            msg["infer"] = guide_msg["infer"]
            msg["done"] = True

    def _pyro_post_sample(self, msg):
        if not msg["is_observed"]:
            self._latent[msg["name"]] = msg
        if not site_is_subsample(msg):
            self._sites.append(msg)


def _check_reparameterized(guide_sites):
    """Refuse a guide site without ``rsample`` (the training objective's gradient would lack
    its score-function term); the same message for loss, differentiable_loss, loss_and_grads."""
    for site in guide_sites:
        if not is_reparameterized(site):
            raise ValueError(
                f"FIVO's training objective (loss, differentiable_loss, loss_and_grads) needs a "
                f"fully reparameterized guide, but guide site {site['name']!r} "
                f"({type(site['fn']).__name__}) has no rsample; use a reparameterizable "
                "distribution. To only evaluate the bound, use FIVO.log_z or "
                "estimate_log_likelihood(method='smc'), which accept any guide"
            )


class FIVO(LogZBound):
    r"""Filtering variational objective :math:`\frac{N}{B}\sum_b \log \hat p(x^{(b)})` (module docstring).

    Works with any model/guide pair that follows the step protocol of
    :mod:`pyro_seq.models.base` (``.init(state, x, mask, num_sequences)``,
    ``.step(state, t, x, mask, num_sequences)``, batch plate at dim -1)::

        svi = SVI(m.model, m.guide, optim, loss=FIVO(num_particles=4))
        svi.step(x, mask)

    At each step ``t`` the guide step runs first, then the model step with the guide's latent
    values, both inside a particle plate at dim ``-max_plate_nesting - 1``. ``init`` must not
    sample (per-particle state tensors it writes, ``(batch, ...)``, get a particle dim of size 1
    that broadcasts); every step must accept per-particle tensors ``(K, batch, ...)`` in
    ``state``. After step ``t`` the per-sequence log weights :math:`\log w_{k,b}` (the step's
    model-site log-probs minus guide-site log-probs, with each site's scale apart from the
    batch-plate subsampling factor) are accumulated, and where the criterion fires (and the
    sequence has a step ``t+1``) :math:`\log \hat p_b` gains :math:`\log \frac{1}{K}\sum_k
    w_{k,b}`, the state is resampled with :meth:`SequenceState.resample` and the weights are
    reset.

    :param int num_particles: :math:`K \ge 1`.
    :param str resample: the criterion: ``"ess"`` (adaptive), ``"always"`` or ``"never"``
        (= IWAE).
    :param float ess_threshold: fraction of :math:`K` in ``[0, 1]``: resample when
        ESS < ``ess_threshold * K`` (``"ess"`` only).
    :param str resampling: the scheme: ``"systematic"`` (default), ``"stratified"`` or
        ``"multinomial"``.
    :param int max_plate_nesting: plates of the programs (1: the batch plate).
    :param torch.Generator generator: optional generator for the resampling draws.
    :param bool vectorize_particles: only ``True`` (the default) is accepted: FIVO always draws
        its :math:`K` particles in one vectorized particle plate, since it resamples across
        particles between time steps; ``False`` raises ``ValueError``.
    :param kwargs: other arguments of :class:`~pyro.infer.ELBO` (e.g. ``retain_graph``).

    The training objective (:meth:`loss`, :meth:`differentiable_loss`, :meth:`loss_and_grads`)
    needs a fully reparameterized guide and raises ``ValueError`` otherwise; :meth:`log_z`
    evaluates the bound for any guide (module docstring).

    After each evaluation, ``last_num_resamples`` holds the number of resampling events per
    sequence (``(batch,)`` long tensor).
    """

    def __init__(
        self,
        num_particles: int = 4,
        resample: str = "ess",
        ess_threshold: float = 0.5,
        resampling: str = DEFAULT_RESAMPLING,
        max_plate_nesting: int = 1,
        generator: Optional[torch.Generator] = None,
        vectorize_particles: bool = True,
        **kwargs: Any,
    ) -> None:
        num_particles = positive_int("num_particles", num_particles)
        _check_resampling_args(resample, ess_threshold, resampling, where="FIVO")
        if max_plate_nesting == float("inf") or int(max_plate_nesting) < 1:
            raise ValueError("FIVO needs a finite max_plate_nesting >= 1 (the batch plate)")
        if vectorize_particles is not True:
            raise ValueError(
                f"FIVO always draws its particles in one vectorized particle plate (it resamples "
                f"across particles between time steps), so vectorize_particles must be True (the "
                f"default) or left out; got vectorize_particles={vectorize_particles!r}"
            )
        # ELBO's own vectorization (an extra plate and max_plate_nesting + 1) is not used: FIVO
        # opens its particle plate itself, at dim -max_plate_nesting - 1.
        super().__init__(
            num_particles=int(num_particles),
            max_plate_nesting=int(max_plate_nesting),
            vectorize_particles=False,
            **kwargs,
        )
        self.vectorize_particles = True  # what FIVO does (ELBO._get_traces is never used)
        self.resample = resample
        self.ess_threshold = float(ess_threshold)
        self.resampling = resampling
        self.generator = generator
        self.last_num_resamples: Optional[torch.Tensor] = None

    def _get_trace(self, model, guide, args, kwargs):  # required by ELBO; FIVO runs per step
        raise NotImplementedError("FIVO traces one time step at a time; see FIVO.log_z")

    # ---------------------------------------------------------------- the particle filter
    def _prepare_state(self, state, batch):
        """Check per-particle shapes and expand size-1 particle axes to ``K`` before a resample."""
        K = self.num_particles
        for key, value in list(state.items()):
            if (
                not torch.is_tensor(value)
                or value.dim() < 2
                or value.shape[0] not in (1, K)
                or value.shape[1] not in (1, batch)
            ):
                raise ValueError(
                    f"FIVO: state[{key!r}] has shape {tuple(getattr(value, 'shape', ()))}, "
                    f"expected a per-particle tensor (K={K} or 1, batch={batch}, ...); "
                    "tensors common to all particles belong in state.shared"
                )
            if value.shape[0] == 1:
                state[key] = value.expand((K,) + tuple(value.shape[1:]))

    def _site_log_prob(self, site, layout):
        """A site's log-density as ``(K, B)``: scaled, masked, other plate dims summed."""
        rank, keep, divide_scale, K, B = layout
        lp = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
        lp = scale_and_mask(lp, site["scale"], site["mask"])
        if is_validation_enabled():
            warn_if_nan(lp.sum(), f"log_prob_sum at site {site['name']!r}")
            check_site_shape(dict(site, log_prob=lp), rank)
        if rank == 2 and lp.dim() <= 2:  # already (K or 1, B or 1), (B,) or a scalar
            lp = lp.expand(K, B)
        else:
            lp = reduce_site(lp, rank, keep)  # (K or 1, 1, ..., B or 1)
            lp = lp.reshape(lp.shape[0], lp.shape[-1]).expand(K, B)
        return lp if divide_scale == 1.0 else lp / divide_scale

    def _step_log_weight(self, model_sites, guide_sites, layout):
        """Incremental log weight ``(K, B)`` of one step (None when the step has no site).

        Model-site log-densities minus guide-site log-densities, summed in the order of
        :func:`~pyro_seq.infer.iwae.site_log_weights` (model sites, then guide sites).
        """
        total = None
        for site in model_sites:
            lp = self._site_log_prob(site, layout)
            total = lp if total is None else total + lp
        for site in guide_sites:
            lq = self._site_log_prob(site, layout)
            total = -lq if total is None else total - lq
        return total

    @staticmethod
    def _check_latents_proposed(model_sites, latent):
        for site in model_sites:
            if not site["is_observed"] and site["name"] not in latent:
                raise ValueError(
                    f"latent model site {site['name']!r} has no guide site; importance weights "
                    "need the guide to propose every latent variable"
                )

    def log_z(
        self,
        model: Any,
        guide: Any,
        *args: Any,
        check_reparam: bool = False,
        **kwargs: Any,
    ) -> Tuple[torch.Tensor, float]:
        r"""Run the particle filter once; return :math:`\log \hat p(x^{(b)})` per sequence.

        Sites are collected by :class:`_StepSites`, a minimal messenger (no
        :class:`~pyro.poutine.Trace` objects, no replay trace per step): the guide step runs
        first and its latent values are then fixed in the model step, as
        ``trace(replay(model, guide_trace))`` would do. Per-step log weights are kept as
        ``(T, K, B)`` tensors and combined once at the end: :math:`\log \hat p_b = \sum_r \log
        \frac{1}{K}\sum_k \exp(\sum_{t \in \text{epoch } r} \log \alpha_{t,k,b})` over the
        resampling epochs of sequence ``b``; detached running weights drive the resampling.

        :param model: step-protocol model (``m.model``, possibly wrapped by a handler such as
            :class:`~pyro_seq.infer.LatentScale`).
        :param guide: step-protocol guide.
        :param args: ``x`` ``(batch, T, D)``, ``mask`` ``(batch, T)`` or None,
            ``num_sequences``.
        :param bool check_reparam: refuse guide sites without ``rsample`` (``ValueError``), as
            the training objective does; off by default, since the bound's value needs no
            gradient and any guide gives an unbiased :math:`\hat p`.
        :returns: ``(log_z, scale)``: tensor ``(batch,)`` (differentiable, ancestors fixed) and
            the batch-plate subsampling factor ``N / B``.
        """
        require_step_program(model, "model")
        require_step_program(guide, "guide")
        x, mask, num_sequences, observed, inputs = _parse_args(
            args, kwargs, device=program_device(model)
        )
        B, T = mask.shape
        K = self.num_particles
        particle_dim = -self.max_plate_nesting - 1
        rank = self.max_plate_nesting + 1
        keep = {particle_dim, -1}
        state = SequenceState()
        sites = _StepSites()
        call_args: Tuple[Any, ...] = (x, mask, num_sequences)
        if inputs is not None:  # programs without these arguments still work without them
            call_args += (observed, inputs)
        elif observed is not None:
            call_args += (observed,)
        decide = K > 1 and self.resample != "never"  # resampling decisions to take

        with pyro.plate(PARTICLE_PLATE, K, dim=particle_dim, device=x.device), sites:
            guide_sites, latent = sites.run(guide.init, None, state, *call_args)
            model_sites, _ = sites.run(model.init, latent, state, *call_args)
            sampled = [s["name"] for s in guide_sites + model_sites]
            if sampled:
                raise NotImplementedError(
                    f"FIVO: init must not sample (found sites {sampled}); sample z_1 in step 0"
                )
            for key, value in list(state.items()):
                if not torch.is_tensor(value) or value.dim() < 1:
                    raise ValueError(
                        f"FIVO: state[{key!r}] after init must be a (batch, ...) tensor"
                    )
                state[key] = value.unsqueeze(0)  # particle dim of size 1, broadcasts

            layout = None
            incs: List[Optional[torch.Tensor]] = []
            resampled: List[
                Optional[torch.Tensor]
            ] = []  # per step: (K, B) log weight or None; (B,) bool or None
            log_w = x.new_zeros(K, B)  # detached running weights: they only drive decisions
            identity = torch.arange(K, device=x.device).unsqueeze(-1).expand(K, B)
            for t in range(T):
                guide_sites, latent = sites.run(guide.step, None, state, t, *call_args)
                model_sites, _ = sites.run(model.step, latent, state, t, *call_args)
                if check_reparam:
                    _check_reparameterized(guide_sites)
                self._check_latents_proposed(model_sites, latent)
                if layout is None and (model_sites or guide_sites):
                    # from the first step that has sites: a step without any (e.g. a GTM-SM
                    # memorisation step) cannot tell the batch plate's subsampling scale
                    layout = (rank, keep, self._batch_scale(model_sites + guide_sites), K, B)
                inc = self._step_log_weight(model_sites, guide_sites, layout)
                incs.append(inc)
                resampled.append(None)
                if not decide or t == T - 1:
                    continue
                with torch.no_grad():
                    if inc is not None:
                        log_w = log_w + inc
                    do = mask[:, t + 1]  # never resample after a sequence's last step
                    if self.resample == "ess":
                        do = do & (effective_sample_size(log_w, dim=0) < self.ess_threshold * K)
                    if not do.any():
                        continue
                    ancestors = resample(log_w, self.resampling, generator=self.generator)
                    if not do.all():  # sequences that do not resample keep their particles
                        ancestors = torch.where(do, ancestors, identity)
                    log_w = log_w.masked_fill(do, 0.0)
                self._prepare_state(state, B)
                state.resample(ancestors)  # differentiable in the state, ancestors fixed
                resampled[t] = do
        log_z, self.last_num_resamples = self._combine(incs, resampled, x, K, B)
        return log_z, (1.0 if layout is None else layout[2])

    @staticmethod
    def _combine(incs, resampled, x, K, B):
        r""":math:`\log \hat p_b = \sum_r \log \frac{1}{K}\sum_k \exp(\sum_{t \in r}
        \log\alpha_{t,k,b})` from the per-step log weights, in a few batched operations.

        :param list incs: per step, the ``(K, B)`` log weights (None: no site, zero).
        :param list resampled: per step, ``(B,)`` bool (resampled after the step) or None.
        :returns: ``(log_z, num_resamples)``, both ``(B,)`` (the second a long tensor).
        """
        num_resamples = torch.zeros(B, dtype=torch.long, device=x.device)
        if not incs:  # no time step
            return x.new_zeros(B), num_resamples
        zeros = x.new_zeros(K, B)
        inc = torch.stack([zeros if v is None else v for v in incs])  # (T, K, B)
        if all(do is None for do in resampled):
            return log_mean_exp(inc.sum(0), dim=0), num_resamples
        # after[t, b]: sequence b resampled after step t; epoch[t, b]: events before step t
        never = torch.zeros(B, dtype=torch.bool, device=x.device)
        after = torch.stack([never if do is None else do for do in resampled]).long()
        num_resamples = after.sum(0)
        epoch = torch.cumsum(after, 0) - after
        num_epochs = sum(do is not None for do in resampled) + 1
        sums = inc.new_zeros(num_epochs, K, B).scatter_add(
            0, epoch.unsqueeze(1).expand(inc.shape), inc
        )  # (epochs, K, B)
        # epochs that a sequence never reaches are all zero: log-mean-exp 0 adds nothing
        return log_mean_exp(sums, dim=1).sum(0), num_resamples

    def _batch_scale(self, sites):
        """Subsampling factor ``N / B`` of the batch plate (the plate at dim -1)."""
        frames = set()
        for site in sites:
            f = [f for f in site["cond_indep_stack"] if f.vectorized and f.dim == -1]
            if not f:
                raise ValueError(
                    f"FIVO: site {site['name']!r} is not inside the batch plate at dim -1; every "
                    "site of a step must be local to its sequence"
                )
            frames.add((f[0].size, f[0].full_size))
        if len(frames) > 1:
            raise ValueError(f"FIVO: inconsistent batch plates across sites: {sorted(frames)}")
        if not frames:
            return 1.0
        size, full_size = frames.pop()
        return 1.0 if full_size is None else full_size / size

    # ---------------------------------------------------------------- ELBO interface
    def loss(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> float:
        """
        :returns: the negative FIVO bound, :math:`-\\frac{N}{B}\\sum_b \\log \\hat p(x^{(b)})`, for
            one run of the particle filter
        :rtype: float
        :raises ValueError: for a guide site without ``rsample``, as :meth:`differentiable_loss`
            (the value of the training objective; use :meth:`log_z` to evaluate any guide).
        """
        with torch.no_grad():
            log_z, scale = self.log_z(model, guide, *args, check_reparam=True, **kwargs)
            loss = -torch_item(scale * log_z.sum())
        warn_if_nan(loss, "loss")
        return loss

    def differentiable_loss(
        self, model: Any, guide: Any, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """
        :returns: the negative FIVO bound as a differentiable tensor (gradient with the
            ancestor indices held fixed; see the module docstring for the bias).
        :rtype: torch.Tensor
        """
        log_z, scale = self.log_z(model, guide, *args, check_reparam=True, **kwargs)
        loss = -scale * log_z.sum()
        warn_if_nan(loss, "loss")
        return loss

    def loss_and_grads(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> float:
        """
        :returns: an estimate of the negative FIVO bound
        :rtype: float

        Runs the particle filter and back-propagates :math:`-\\log \\hat p` into the parameters
        of model and guide.
        """
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        if loss.requires_grad:
            loss.backward(retain_graph=self.retain_graph)
        return torch_item(loss)
