r"""Tasks with a trained sequence model: imputation, online denoising, forecasting (Bayer &
Osendorfer 2014, sec. 4).

Every function works with any :class:`~pyro_seq.models.SequenceModel` (and any model/guide pair
following the sequence-model contract whose observation sites are named ``x_1..x_T``):

* :func:`impute`: missing values inside sequences.

  - ``method="iterative"``: the procedure of Bayer & Osendorfer (2014, sec. 4.3). Fill the
    missing values with random values, then repeat: infer ``z`` with the recognition model
    (the guide) given the current completion, and redraw the missing values from the model's
    emission given ``z``. With an exact guide this is a Gibbs sampler of
    :math:`p(z, x_{miss} | x_{obs})`; the reported probabilities are the emission means at the
    missing entries averaged over the iterations after ``burn_in``.
  - ``method="importance"``: the particle alternative for step-protocol models. ``K`` latent
    paths are drawn from the guide *with the missing entries marked unobserved* (``observed=``),
    weighted by :math:`w_k = p(x_{obs}, z_k) / q(z_k)`, and the emission means at the missing
    entries are averaged with the self-normalised weights, an estimate of
    :math:`\mathbb{E}[x_{miss} | x_{obs}]` that is consistent as ``K`` grows (importance
    sampling over whole paths, i.e. a particle smoother without resampling).

* :func:`denoise`: online denoising (Bayer & Osendorfer 2014, sec. 4.2): the latent path is the
  mode (mean) of the recognition model, step by step, and each ``x_t`` is replaced by its most
  likely value under the emission given that path (Bernoulli: ``p > 1/2``; Gaussian: the mean).
  With a filtering guide (``inference="filtering"``) only the past and present are used.

* :func:`forecast`: continuation of a prefix *in generation mode* (not teacher-forced): the
  latent path of the prefix is drawn from the guide, the future latents from the model's prior,
  and every generated ``x_t`` is fed back to the model as its input for the next step.
"""

import contextlib
from dataclasses import dataclass
from typing import Optional, Tuple

import pyro.poutine as poutine
import torch
from pyro.poutine.messenger import Messenger

from pyro_seq.models.contract import ModelContract
from pyro_seq.pyro_internals import is_subsample
from pyro_seq.validation import (
    check_device,
    module_device,
    prepare_sequences,
    validate_inputs,
    validate_sequences,
)

__all__ = [
    "ImputationResult",
    "ForecastResult",
    "impute",
    "denoise",
    "forecast",
    "drop_steps",
    "drop_frames",
    "pixel_error",
    "bits_per_element",
]


@dataclass
class ImputationResult:
    """Result of :func:`impute`.

    :ivar torch.Tensor x: ``(batch, T, D)``, the data with the missing entries filled (the last
        draw for ``"iterative"``; the posterior mean for ``"importance"``).
    :ivar torch.Tensor probs: ``(batch, T, D)``, the estimate of
        :math:`\\mathbb{E}[x | x_{obs}]` (Bernoulli: per-element probabilities); equal to ``x``
        at observed entries.
    :ivar torch.Tensor observed: the bool ``(batch, T, D)`` mask that was used.
    """

    x: torch.Tensor
    probs: torch.Tensor
    observed: torch.Tensor


@dataclass
class ForecastResult:
    """Result of :func:`forecast`.

    :ivar torch.Tensor samples: ``(num_samples, batch, steps, D)`` generated continuations.
    :ivar torch.Tensor means: ``(num_samples, batch, steps, D)`` emission means along each path.
    :ivar torch.Tensor log_prob: ``(batch, steps)`` log-likelihood of ``target`` at each future
        step under the forecast mixture :math:`\\frac{1}{S}\\sum_s p(x_{T+k} | \\text{path}_s)`,
        or None when no target was given.
    """

    samples: torch.Tensor
    means: torch.Tensor
    log_prob: Optional[torch.Tensor]


def _emission_fns(trace, T):
    """The observation distributions of sites ``x_1..x_T`` of a model trace."""
    return [trace.nodes[f"x_{t + 1}"]["fn"] for t in range(T)]


def _check_model(model, task, method=None):
    """Refuse a model that does not declare ``task`` (or imputation ``method``) in its contract
    (:mod:`pyro_seq.models.contract`): :class:`~pyro_seq.models.Unsupported`, one line."""
    if not isinstance(model, ModelContract):
        raise TypeError(
            f"expected a model of pyro_seq.models (a ModelContract subclass), got "
            f"{type(model).__name__}"
        )
    model.require(task)
    if method is not None:
        model.require(method, "impute_method")


@contextlib.contextmanager
def _true_likelihood(model):
    """Run a task on the model's true likelihood: evaluation mode (no training-time tempering
    such as the KVAE's ``reconstruction_weight``, no dropout), restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _kw(inputs):
    return {} if inputs is None else {"inputs": inputs}


def _check_inputs(model, inputs, x, mask, shape="(batch, T, input_dim)"):
    """The known inputs of a task, checked by the programs' validator (None for a model that
    takes none); the message names ``inputs`` and the expected ``shape``."""
    try:
        return validate_inputs(
            inputs, x.shape[:2], model.input_dim, mask, x.dtype, module_device(model)
        )
    except ValueError as e:
        raise ValueError(f"{e} (inputs of {model.module_name}: {shape})") from None


def _traces(model, x, mask, **kwargs):
    guide_trace = poutine.trace(model.guide).get_trace(x, mask, **kwargs)
    model_trace = poutine.trace(poutine.replay(model.model, trace=guide_trace)).get_trace(
        x, mask, **kwargs
    )
    return model_trace, guide_trace


@torch.no_grad()
def impute(
    model: ModelContract,
    x: torch.Tensor,
    observed: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    method: str = "iterative",
    num_iterations: int = 20,
    burn_in: Optional[int] = None,
    num_particles: int = 64,
    generator: Optional[torch.Generator] = None,
    inputs: Optional[torch.Tensor] = None,
) -> ImputationResult:
    """Fill the missing entries of ``x`` (see the module docstring).

    :param model: a trained :class:`~pyro_seq.models.SequenceModel`.
    :param torch.Tensor x: ``(batch, T, D)``; entries marked unobserved may hold anything.
    :param observed: bool ``(batch, T)`` or ``(batch, T, D)``, True = observed.
    :param mask: ``(batch, T)`` padding mask or None.
    :param str method: ``"iterative"`` (Bayer & Osendorfer sec. 4.3) or ``"importance"``; for a
        :class:`~pyro_seq.models.KVAE` also ``"smoothing"``, ``"filtering"`` or ``"generation"``
        (thesis 6.4, :meth:`~pyro_seq.models.KVAE.impute_frames`: whole frames, so a step
        counts as observed when any of its elements is; ``probs`` are the decoded pixel
        probabilities at the missing steps).
    :param int num_iterations: iterations of the iterative procedure.
    :param int burn_in: iterations left out of the average of ``probs`` (default: a third).
    :param int num_particles: ``K`` of the importance method.
    :param torch.Generator generator: for the random initial fill; it may live on the CPU while
        ``x`` is on a GPU (the fill is then drawn on the CPU and copied, the same numbers on
        every device).
    :param inputs: known inputs ``(batch, T, U)`` of a model with ``input_dim = U`` (controls,
        actions; known at every step, observed or not), else None.
    :returns: :class:`ImputationResult`.
    """
    _check_model(model, "impute", method)
    with _true_likelihood(model):
        return _impute(
            model,
            x,
            observed,
            mask,
            method,
            num_iterations,
            burn_in,
            num_particles,
            generator,
            inputs,
        )


@torch.no_grad()
def _impute(
    model, x, observed, mask, method, num_iterations, burn_in, num_particles, generator, inputs
):
    x, mask, seen = prepare_sequences(
        x, mask, model.obs_dim, model.binary_observations, observed, device=module_device(model)
    )
    inputs = _check_inputs(model, inputs, x, mask)
    if seen is None:
        seen = torch.ones_like(x, dtype=torch.bool)
    if method == "iterative":
        return _impute_iterative(model, x, mask, seen, num_iterations, burn_in, generator, inputs)
    if method == "importance":
        return _impute_importance(model, x, mask, seen, num_particles, inputs)
    # the model's own methods over whole steps (e.g. the KVAE's Kalman smoothing, thesis 6.4)
    steps = seen.any(-1) & mask
    probs = model.impute_steps(x, steps, method, inputs=inputs)
    probs = torch.where(steps[..., None], x, probs)
    filled = (probs > 0.5).to(x.dtype) if model.binary_observations else probs
    return ImputationResult(
        torch.where(steps[..., None], x, filled), probs, steps[..., None].expand(x.shape)
    )


def _impute_iterative(model, x, mask, seen, num_iterations, burn_in, generator, inputs):
    if int(num_iterations) < 1:
        raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
    burn_in = num_iterations // 3 if burn_in is None else int(burn_in)
    if not 0 <= burn_in < num_iterations:
        raise ValueError(f"burn_in must lie in [0, num_iterations), got {burn_in}")
    B, T, D = x.shape
    where = x.device if generator is None else generator.device
    fill = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=where).to(x.device)
    if model.binary_observations:
        fill = (fill < 0.5).to(x.dtype)  # random values in {0, 1} for binary data
    current = torch.where(seen, x, fill)
    total, count = torch.zeros_like(x), 0
    for it in range(num_iterations):
        model_trace, _ = _traces(model, current, mask, **_kw(inputs))
        fns = _emission_fns(model_trace, T)
        means = torch.stack([fn.mean for fn in fns], 1).expand(x.shape)
        draws = torch.stack([fn.sample() for fn in fns], 1).expand(x.shape)
        current = torch.where(seen, x, draws)
        if it >= burn_in:
            total, count = total + means, count + 1
    probs = torch.where(seen, x, total / count)
    return ImputationResult(x=current, probs=probs, observed=seen)


def _impute_importance(model, x, mask, seen, num_particles, inputs):
    K = int(num_particles)
    if K < 1:
        raise ValueError(f"num_particles must be >= 1, got {num_particles}")
    B, T, D = x.shape
    rep = lambda t: t.repeat((K,) + (1,) * (t.dim() - 1))  # noqa: E731  (K B, ...)
    model_trace, guide_trace = _traces(
        model, rep(x), rep(mask), observed=rep(seen), **_kw(None if inputs is None else rep(inputs))
    )
    model_trace.compute_log_prob()
    guide_trace.compute_log_prob()
    log_w = x.new_zeros(K * B)
    for trace, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
        for site in trace.nodes.values():
            if (
                site["type"] == "sample"
                and torch.is_tensor(site.get("log_prob"))
                and site["log_prob"].dim() >= 1
            ):
                log_w = log_w + sign * site["log_prob"].reshape(K * B)
    w = torch.softmax(log_w.reshape(K, B), dim=0)  # (K, B)
    means = torch.stack([fn.mean for fn in _emission_fns(model_trace, T)], 1)
    means = means.expand(K * B, T, D).reshape(K, B, T, D)
    estimate = (w[..., None, None] * means).sum(0)
    probs = torch.where(seen, x, estimate)
    return ImputationResult(x=probs.clone(), probs=probs, observed=seen)


class _GuideMode(Messenger):
    """Set every latent sample site of the guide to its distribution's mean (the mode of a
    Gaussian): the MAP path of the recognition model, step by step."""

    def _pyro_sample(self, msg):
        if msg["is_observed"] or msg["value"] is not None:
            return
        if is_subsample(msg):
            return
        msg["value"] = msg["fn"].mean
        msg["done"] = True


@torch.no_grad()
def denoise(
    model: ModelContract,
    x: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    inputs: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Online denoising (Bayer & Osendorfer 2014, sec. 4.2): ``(x_hat, params)``.

    The guide's latent sites take their means (the MAP of the Gaussian recognition model, step
    by step, each conditioned on the previous MAP value); each ``x_t`` is replaced by its most
    likely value under the model's emission given that path: ``p > 1/2`` for Bernoulli
    emissions, the mean otherwise.

    :param model: a trained :class:`~pyro_seq.models.SequenceModel` (use a filtering guide for
        online denoising: a smoothing guide also reads the future).
    :param torch.Tensor x: ``(batch, T, D)``, the corrupted data.
    :param mask: ``(batch, T)`` padding mask or None.
    :param inputs: known inputs ``(batch, T, U)`` of a model with ``input_dim = U``, else None.
    :returns: ``(x_hat, means)``, both ``(batch, T, D)``: the denoised data and the emission
        means (Bernoulli: probabilities).
    """
    _check_model(model, "denoise")
    with _true_likelihood(model):
        return _denoise(model, x, mask, inputs)


@torch.no_grad()
def _denoise(model, x, mask, inputs):
    x, mask = validate_sequences(
        x, mask, model.obs_dim, model.binary_observations, device=module_device(model)
    )
    kw = _kw(_check_inputs(model, inputs, x, mask))
    with _GuideMode():
        guide_trace = poutine.trace(model.guide).get_trace(x, mask, **kw)
    model_trace = poutine.trace(poutine.replay(model.model, trace=guide_trace)).get_trace(
        x, mask, **kw
    )
    means = torch.stack([fn.mean for fn in _emission_fns(model_trace, x.shape[1])], 1)
    means = means.expand(x.shape)
    x_hat = (means > 0.5).to(x.dtype) if model.binary_observations else means
    return x_hat * mask.unsqueeze(-1), means * mask.unsqueeze(-1)


@torch.no_grad()
def forecast(
    model: ModelContract,
    x_prefix: torch.Tensor,
    steps: int,
    num_samples: int = 100,
    mask: Optional[torch.Tensor] = None,
    target: Optional[torch.Tensor] = None,
    inputs: Optional[torch.Tensor] = None,
) -> ForecastResult:
    """Continue each sequence of ``x_prefix`` for ``steps`` steps in generation mode.

    The prefixes must have equal length (``mask`` all True, or None). The latent path of the
    prefix is one draw from the guide per sample; every future step draws ``z`` from the
    model's prior and ``x`` from its emission, and the drawn ``x`` is the model's input at the
    next step (the model is run again over the extended sequence, with the earlier latents
    fixed, so any architecture whose inputs are past observations works).

    :param torch.Tensor x_prefix: ``(batch, T, D)``.
    :param int steps: number of future steps.
    :param int num_samples: ``S`` continuations per sequence.
    :param target: optional ``(batch, steps, D)`` true continuation, scored under the mixture.
    :param inputs: known inputs ``(batch, T + steps, U)`` of a model with ``input_dim = U``:
        those of the prefix and of every future step (controls or actions to come), else None.
    :returns: :class:`ForecastResult`.
    """
    _check_model(model, "forecast")
    with _true_likelihood(model):
        return _forecast(model, x_prefix, steps, num_samples, mask, target, inputs)


@torch.no_grad()
def _forecast(model, x_prefix, steps, num_samples, mask, target, inputs):
    x_prefix, mask = validate_sequences(
        x_prefix, mask, model.obs_dim, model.binary_observations, device=module_device(model)
    )
    if not bool(mask.all()):
        raise ValueError("forecast needs prefixes of equal length (mask all True); cut them first")
    if int(steps) < 1 or int(num_samples) < 1:
        raise ValueError(f"steps and num_samples must be >= 1, got {steps}, {num_samples}")
    B, T, D = x_prefix.shape
    S = int(num_samples)
    ahead = torch.ones(B, T + int(steps), dtype=torch.bool, device=x_prefix.device)
    inputs = _check_inputs(
        model,
        inputs,
        x_prefix.new_zeros(B, T + int(steps), D),
        ahead,
        "(batch, T + steps, input_dim)",
    )
    u_all = None if inputs is None else inputs.repeat(S, 1, 1)  # (S B, T + steps, U)
    x = x_prefix.repeat(S, 1, 1)  # (S B, T, D)
    guide_trace = poutine.trace(model.guide).get_trace(
        x,
        torch.ones(S * B, T, dtype=torch.bool, device=x.device),
        **_kw(None if u_all is None else u_all[:, :T]),
    )
    latents = {
        name: site["value"]
        for name, site in guide_trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not is_subsample(site)
    }
    samples, means = [], []
    for k in range(int(steps)):
        x_ext = torch.cat([x, x.new_zeros(S * B, 1, D)], 1)  # step T + k unknown
        observed = torch.ones(S * B, T + k + 1, dtype=torch.bool, device=x.device)
        observed[:, -1] = False
        trace = poutine.trace(poutine.condition(model.model, data=latents)).get_trace(
            x_ext, None, observed=observed, **_kw(None if u_all is None else u_all[:, : T + k + 1])
        )
        for name, site in trace.nodes.items():  # keep the new latents
            if (
                site["type"] == "sample"
                and not site["is_observed"]
                and name not in latents
                and not is_subsample(site)
            ):
                latents[name] = site["value"]
        fn = trace.nodes[f"x_{T + k + 1}"]["fn"]
        mean = fn.mean.expand(S * B, D)
        draw = fn.sample().expand(S * B, D)
        samples.append(draw)
        means.append(mean)
        x = torch.cat([x, draw.unsqueeze(1)], 1)
    samples = torch.stack(samples, 1).reshape(S, B, int(steps), D)
    means = torch.stack(means, 1).reshape(S, B, int(steps), D)
    log_prob = None
    if target is not None:
        if tuple(target.shape) != (B, int(steps), D):
            raise ValueError(
                f"target must have shape {(B, int(steps), D)}, got {tuple(target.shape)}"
            )
        check_device("target", target, x_prefix.device, "x_prefix is")
        log_prob = _mixture_log_prob(model, means, target)
    return ForecastResult(samples=samples, means=means, log_prob=log_prob)


def _mixture_log_prob(model, means, target):
    """``log (1/S) sum_s p(target_k | path_s)`` per (batch, step) for Bernoulli emissions (from
    the means) or Gaussian ones (not available from means alone: raise)."""
    if not model.binary_observations:
        raise NotImplementedError(
            "forecast log-likelihoods of a target are implemented for "
            "Bernoulli emissions (piano rolls)"
        )
    # clamp by the dtype's resolution: in float32, 1 - 1e-12 rounds to 1, and a mean of exactly
    # 1 at a silent note gave 0 * log(0) = NaN; the where() never multiplies an infinity
    eps = torch.finfo(means.dtype).eps
    p = means.clamp(eps, 1 - eps)
    lp = torch.where(target > 0.5, p.log(), (-p).log1p()).sum(-1)  # (S, B, steps)
    return torch.logsumexp(lp, 0) - torch.log(torch.tensor(float(lp.shape[0]), dtype=lp.dtype))


def drop_steps(
    mask: torch.Tensor, drop: int, generator: Optional[torch.Generator] = None
) -> torch.Tensor:
    """The ``observed`` mask of Bayer & Osendorfer (2014), sec. 4.3: ``drop`` consecutive steps
    missing per sequence.

    :param torch.Tensor mask: ``(batch, T)`` bool prefix padding mask; every sequence must be
        longer than ``drop``.
    :param int drop: number of consecutive steps dropped, at a uniformly random start.
    :returns: bool ``(batch, T)``: False at the dropped steps, True elsewhere (padding included).
    """
    lengths = mask.sum(-1)
    if int(drop) < 1 or bool((lengths <= drop).any()):
        raise ValueError(
            f"drop must be >= 1 and every sequence longer than it, got drop={drop} "
            f"and lengths down to {int(lengths.min())}"
        )
    observed = torch.ones_like(mask, dtype=torch.bool)
    for b, length in enumerate(lengths.tolist()):
        start = int(torch.randint(0, length - drop + 1, (), generator=generator))
        observed[b, start : start + drop] = False
    return observed


def drop_frames(
    mask: torch.Tensor,
    prob: float,
    generator: Optional[torch.Generator] = None,
    keep_first: int = 0,
) -> torch.Tensor:
    """An ``observed`` mask with each real step missing independently with probability ``prob``
    (the random-drop scheme of thesis Fig. 6.3a); the first ``keep_first`` steps stay observed.

    :returns: bool ``(batch, T)``, False at the dropped steps.
    """
    if not 0.0 <= float(prob) < 1.0:
        raise ValueError(f"prob must be in [0, 1), got {prob}")
    u = torch.rand(mask.shape, generator=generator).to(mask.device)
    observed = (u >= prob) | ~mask
    observed[:, :keep_first] = True
    return observed


def pixel_error(probs: torch.Tensor, target: torch.Tensor, missing: torch.Tensor) -> float:
    """Fraction of incorrectly imputed pixels (thesis Fig. 6.3): ``probs > 1/2`` against the
    binary ``target`` over the elements where ``missing`` (bool, broadcastable) is True; NaN
    when nothing is missing.

    :rtype: float
    """
    missing = missing.expand(target.shape)
    if not bool(missing.any()):
        return float("nan")
    wrong = ((probs > 0.5).to(target.dtype) != target) & missing
    return float(wrong.sum() / missing.sum())


def bits_per_element(probs: torch.Tensor, target: torch.Tensor, eps: float = 1e-6) -> float:
    """Mean of ``-log2 p(target)`` under independent Bernoulli ``probs`` (clamped to ``eps``).

    :param torch.Tensor probs: probabilities, any shape.
    :param torch.Tensor target: 0/1 values of the same shape.
    :rtype: float
    """
    p = probs.clamp(eps, 1 - eps)
    return float(-(target * p.log2() + (1 - target) * (1 - p).log2()).mean())
