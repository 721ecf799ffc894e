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

Resampling criteria (as FIVO's ``smc.py``): ``"always"``, ``"never"``, or ``"ess"``: resample a
sequence's particles when their effective sample size :math:`1/\sum_k \tilde w_k^2` falls below
``ess_threshold * K``. Schemes (``multinomial``, ``systematic``, ``stratified``) are those of
:func:`pyro_seq.ops.resampling.resample`.

**Gradient bias.** Ancestor indices are integers and the resampling decision is a comparison:
no gradient flows through either. The gradient of :math:`\log \hat p` is taken with the
ancestors held fixed, which drops the score-function term :math:`\log \hat p\, \nabla \log
P(\text{ancestors})` of the resampling distribution. The resulting gradient estimate is biased;
Maddison et al. (2017), Le et al. (2018) and Naesseth et al. (2018) report that the omitted
term has very high variance and that dropping it works better in practice (thesis 4.3.2). The
*value* of the bound is unaffected. The guide must be reparameterized for gradients.

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

import pyro
import torch
from pyro import poutine
from pyro.infer.elbo import ELBO
from pyro.infer.util import is_validation_enabled, torch_item
from pyro.poutine.util import prune_subsample_sites
from pyro.util import check_site_shape, warn_if_nan

from pyro_seq.infer.iwae import check_fully_reparameterized, site_log_weights
from pyro_seq.ops.resampling import RESAMPLING_SCHEMES, effective_sample_size, log_mean_exp, resample
from pyro_seq.ops.state import SequenceState

__all__ = ["FIVO"]

RESAMPLE_CRITERIA = ("ess", "always", "never")
PARTICLE_PLATE = "fivo_particles"


def _check_step_protocol(fn, role):
    if not (callable(getattr(fn, "init", None)) and callable(getattr(fn, "step", None))):
        raise TypeError(
            f"FIVO needs a {role} that follows the step protocol: a callable with "
            f"`.init(state, x, mask, num_sequences=None)` and `.step(state, t, x, mask, "
            f"num_sequences=None)` (e.g. `SequenceModel.{role}`, see pyro_seq.models.base), "
            f"so that it can run the {role} one time step at a time and resample between "
            f"steps; got {fn!r} of type {type(fn).__name__}"
        )


def _parse_args(args, kwargs):
    """``(x, mask, num_sequences)`` from the arguments of a step-protocol program."""
    names = ("x", "mask", "num_sequences")
    extra = set(kwargs) - set(names)
    if len(args) > 3 or extra:
        raise TypeError(f"FIVO programs take (x, mask=None, num_sequences=None); got extra {sorted(extra)}")
    values = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in values:
            raise TypeError(f"got multiple values for argument {k!r}")
        values[k] = v
    x = values.get("x")
    if not torch.is_tensor(x) or x.dim() != 3:
        raise ValueError(f"FIVO expects x of shape (batch, T, D), got {getattr(x, 'shape', x)}")
    mask = values.get("mask")
    if mask is None:
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    elif mask.shape != x.shape[:2]:
        raise ValueError(f"mask must have shape {tuple(x.shape[:2])}, got {tuple(mask.shape)}")
    return x, mask.bool(), values.get("num_sequences")


class FIVO(ELBO):
    r"""Filtering variational objective :math:`\frac{N}{B}\sum_b \log \hat p(x^{(b)})` (module docstring).

    Works with any model/guide pair that follows the step protocol of
    :mod:`pyro_seq.models.base` (``.init(state, x, mask, num_sequences)``,
    ``.step(state, t, x, mask, num_sequences)``, batch plate at dim -1)::

        svi = SVI(m.model, m.guide, optim, loss=FIVO(num_particles=4))
        svi.step(x, mask)

    At each step ``t`` the guide step runs first (traced), then the model step replayed against
    the guide's samples, both inside a particle plate at dim ``-max_plate_nesting - 1``.
    ``init`` must not sample (per-particle state tensors it writes, ``(batch, ...)``, get a
    particle dim of size 1 that broadcasts); every step must accept per-particle tensors
    ``(K, batch, ...)`` in ``state``. After step ``t`` the per-sequence log weights
    :math:`\log w_{k,b}` (the step's model-site log-probs minus guide-site log-probs, with each
    site's scale apart from the batch-plate subsampling factor) are accumulated, and where the
    criterion fires (and the sequence has a step ``t+1``) :math:`\log \hat p_b` gains
    :math:`\log \frac{1}{K}\sum_k w_{k,b}`, the state is resampled with
    :meth:`SequenceState.resample` and the weights are reset.

    :param int num_particles: :math:`K \ge 1`.
    :param str resample: ``"ess"`` (adaptive), ``"always"`` or ``"never"`` (= IWAE).
    :param float ess_threshold: resample when ESS < ``ess_threshold * K`` (``"ess"`` only).
    :param str resampling: ``"multinomial"``, ``"systematic"`` or ``"stratified"``.
    :param int max_plate_nesting: plates of the programs (1: the batch plate).
    :param torch.Generator generator: optional generator for the resampling draws.

    After each evaluation, ``last_num_resamples`` holds the number of resampling events per
    sequence (``(batch,)`` long tensor).
    """

    def __init__(self, num_particles=4, resample="ess", ess_threshold=0.5,
                 resampling="multinomial", max_plate_nesting=1, generator=None, **kwargs):
        if int(num_particles) != num_particles or num_particles < 1:
            raise ValueError(f"num_particles must be a positive integer, got {num_particles}")
        if resample not in RESAMPLE_CRITERIA:
            raise ValueError(f"resample must be one of {RESAMPLE_CRITERIA}, got {resample!r}")
        if resampling not in RESAMPLING_SCHEMES:
            raise ValueError(f"resampling must be one of {RESAMPLING_SCHEMES}, got {resampling!r}")
        if not 0.0 <= float(ess_threshold) <= 1.0:
            raise ValueError(f"ess_threshold must lie in [0, 1], got {ess_threshold}")
        if max_plate_nesting == float("inf") or int(max_plate_nesting) < 1:
            raise ValueError("FIVO needs a finite max_plate_nesting >= 1 (the batch plate)")
        super().__init__(num_particles=int(num_particles), max_plate_nesting=int(max_plate_nesting),
                         vectorize_particles=False, **kwargs)
        self.resample = resample
        self.ess_threshold = float(ess_threshold)
        self.resampling = resampling
        self.generator = generator
        self.last_num_resamples = None

    def _get_trace(self, model, guide, args, kwargs):  # required by ELBO; FIVO runs per step
        raise NotImplementedError("FIVO traces one time step at a time; see FIVO.log_z")

    # ---------------------------------------------------------------- the particle filter
    def _trace_step(self, fn_guide, fn_model, state, call_args):
        guide_trace = poutine.trace(fn_guide).get_trace(state, *call_args)
        model_trace = poutine.trace(poutine.replay(fn_model, trace=guide_trace)).get_trace(
            state, *call_args)
        guide_trace = prune_subsample_sites(guide_trace)
        model_trace = prune_subsample_sites(model_trace)
        model_trace.compute_log_prob()
        guide_trace.compute_score_parts()
        if is_validation_enabled():
            for tr in (model_trace, guide_trace):
                for site in tr.nodes.values():
                    if site["type"] == "sample":
                        check_site_shape(site, self.max_plate_nesting + 1)
        return model_trace, guide_trace

    def _prepare_state(self, state, batch):
        """Check per-particle shapes and expand size-1 particle axes to ``K`` before a resample."""
        K = self.num_particles
        for key, value in list(state.items()):
            if not torch.is_tensor(value) or value.dim() < 2 or value.shape[0] not in (1, K) \
                    or value.shape[1] not in (1, batch):
                raise ValueError(
                    f"FIVO: state[{key!r}] has shape {tuple(getattr(value, 'shape', ()))}, "
                    f"expected a per-particle tensor (K={K} or 1, batch={batch}, ...); "
                    "tensors common to all particles belong in state.shared"
                )
            if value.shape[0] == 1:
                state[key] = value.expand((K,) + tuple(value.shape[1:]))

    def log_z(self, model, guide, *args, check_reparam=False, **kwargs):
        r"""Run the particle filter once; return :math:`\log \hat p(x^{(b)})` per sequence.

        :param model: step-protocol model (``m.model``, possibly wrapped by a handler such as
            :class:`~pyro_seq.infer.LatentScale`).
        :param guide: step-protocol guide.
        :param args: ``x`` ``(batch, T, D)``, ``mask`` ``(batch, T)`` or None,
            ``num_sequences``.
        :returns: ``(log_z, scale)``: tensor ``(batch,)`` (differentiable, ancestors fixed) and
            the batch-plate subsampling factor ``N / B``.
        """
        _check_step_protocol(model, "model")
        _check_step_protocol(guide, "guide")
        x, mask, num_sequences = _parse_args(args, kwargs)
        B, T = mask.shape
        K = self.num_particles
        particle_dim = -self.max_plate_nesting - 1
        rank = self.max_plate_nesting + 1
        keep = {particle_dim, -1}
        plate = pyro.plate(PARTICLE_PLATE, K, dim=particle_dim)
        state = SequenceState()

        with plate:
            model_trace, guide_trace = self._trace_step(guide.init, model.init, state,
                                                        (x, mask, num_sequences))
        for tr in (model_trace, guide_trace):
            sampled = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
            if sampled:
                raise NotImplementedError(
                    f"FIVO: init must not sample (found sites {sampled}); sample z_1 in step 0")
        for key, value in list(state.items()):
            if not torch.is_tensor(value) or value.dim() < 1:
                raise ValueError(f"FIVO: state[{key!r}] after init must be a (batch, ...) tensor")
            state[key] = value.unsqueeze(0)  # particle dim of size 1, broadcasts

        log_w = x.new_zeros(K, B)
        log_z = x.new_zeros(B)
        num_resamples = torch.zeros(B, dtype=torch.long, device=x.device)
        scale = None
        identity = torch.arange(K, device=x.device).unsqueeze(-1).expand(K, B)
        for t in range(T):
            with plate:
                model_trace, guide_trace = self._trace_step(guide.step, model.step, state,
                                                            (t, x, mask, num_sequences))
            if check_reparam:
                check_fully_reparameterized(guide_trace, "FIVO")
            if scale is None:
                scale = self._batch_scale(model_trace, guide_trace)
            (inc,) = site_log_weights(model_trace, guide_trace, rank, keep, scale, ("weight",))
            if torch.is_tensor(inc):  # (K or 1, 1, ..., B or 1) -> (K, B)
                log_w = log_w + inc.reshape(inc.shape[0], inc.shape[-1]).expand(K, B)
            if K == 1 or t == T - 1 or self.resample == "never":
                continue
            with torch.no_grad():
                do = mask[:, t + 1].clone()  # never resample after a sequence's last step
                if self.resample == "ess":
                    ess = effective_sample_size(log_w.detach(), dim=0)
                    do &= ess < self.ess_threshold * K
            if not do.any():
                continue
            self._prepare_state(state, B)
            ancestors = resample(log_w.detach(), scheme=self.resampling, generator=self.generator)
            ancestors = torch.where(do, ancestors, identity)
            state.resample(ancestors)
            log_z = log_z + torch.where(do, log_mean_exp(log_w, dim=0), log_z.new_zeros(()))
            log_w = torch.where(do, log_w.new_zeros(()), log_w)
            num_resamples += do.long()
        log_z = log_z + log_mean_exp(log_w, dim=0)
        self.last_num_resamples = num_resamples
        return log_z, (1.0 if scale is None else scale)

    def _batch_scale(self, model_trace, guide_trace):
        """Subsampling factor ``N / B`` of the batch plate (the plate at dim -1)."""
        frames = set()
        for tr in (model_trace, guide_trace):
            for name, site in tr.nodes.items():
                if site["type"] != "sample":
                    continue
                f = [f for f in site["cond_indep_stack"] if f.vectorized and f.dim == -1]
                if not f:
                    raise ValueError(
                        f"FIVO: site {name!r} is not inside the batch plate at dim -1; every "
                        "site of a step must be local to its sequence")
                frames.add((f[0].size, f[0].full_size))
        if len(frames) > 1:
            raise ValueError(f"FIVO: inconsistent batch plates across sites: {sorted(frames)}")
        if not frames:
            return 1.0
        size, full_size = frames.pop()
        return 1.0 if full_size is None else full_size / size

    # ---------------------------------------------------------------- ELBO interface
    def loss(self, model, guide, *args, **kwargs):
        """
        :returns: an estimate of the negative FIVO bound, :math:`-\\frac{N}{B}\\sum_b \\log
            \\hat p(x^{(b)})`, for one run of the particle filter
        :rtype: float
        """
        with torch.no_grad():
            log_z, scale = self.log_z(model, guide, *args, **kwargs)
            loss = -torch_item(scale * log_z.sum())
        warn_if_nan(loss, "loss")
        return loss

    def differentiable_loss(self, model, guide, *args, **kwargs):
        """
        :returns: the negative FIVO bound as a differentiable tensor (gradient with the
            ancestor indices held fixed; see the module docstring for the bias).
        :rtype: torch.Tensor
        """
        log_z, scale = self.log_z(model, guide, *args, check_reparam=True, **kwargs)
        loss = -scale * log_z.sum()
        warn_if_nan(loss, "loss")
        return loss

    def loss_and_grads(self, model, guide, *args, **kwargs):
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
