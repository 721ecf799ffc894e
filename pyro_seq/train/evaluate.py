"""Evaluation of sequence models: bounds in nats per time step.

The per-step number is the convention of Boulanger-Lewandowski et al. (2012) and Pyro's DMM
example: the *total* bound over all test sequences divided by the *total* number of test time
steps (not a mean of per-sequence averages).

Sequences may live on any device: they are padded into batches in the model's dtype and moved
to the device of the model's parameters (:func:`model_device`), where the bound is computed.
"""

import math
from typing import Any, Dict, Optional, Sequence

import pyro.poutine as poutine
import torch

from pyro_seq.data.batching import SequenceLoader
from pyro_seq.ops.padding import SequenceList, inputs_of
from pyro_seq.progress import progress_bar
from pyro_seq.validation import module_device, validate_sequence_list


def elbo_terms(
    model: Any, x: torch.Tensor, mask: torch.Tensor, inputs: Optional[torch.Tensor] = None
) -> Dict[str, torch.Tensor]:
    """One-sample ELBO terms per sequence, from a guide trace and the model replayed on it.

    :param model: a :class:`~pyro_seq.models.SequenceModel`.
    :param torch.Tensor x: ``(batch, T, D)``; ``mask`` ``(batch, T)``.
    :param inputs: known inputs ``(batch, T, U)`` of a model with ``input_dim = U``, or None.
    :returns: dict of ``(batch,)`` tensors: ``log_likelihood`` (sum of observed-site log
        probabilities), ``kl`` (sum over latent sites of ``log q - log p``, a one-sample KL
        estimate) and ``elbo = log_likelihood - kl``.
    """
    kwargs = {} if inputs is None else {"inputs": inputs}
    guide_trace = poutine.trace(model.guide).get_trace(x, mask, **kwargs)
    model_trace = poutine.trace(poutine.replay(model.model, trace=guide_trace)).get_trace(
        x, mask, **kwargs
    )
    batch = x.shape[0]
    log_lik = x.new_zeros(batch)
    kl = x.new_zeros(batch)
    for _name, site in model_trace.nodes.items():
        if site["type"] != "sample":
            continue
        lp = site["fn"].log_prob(site["value"])
        if site["is_observed"]:
            log_lik = log_lik + lp
        else:
            kl = kl - lp
    for _name, site in guide_trace.nodes.items():
        if site["type"] == "sample" and not site["is_observed"]:
            kl = kl + site["fn"].log_prob(site["value"])
    return {"log_likelihood": log_lik, "kl": kl, "elbo": log_lik - kl}


def model_dtype(model):
    """The floating dtype of ``model``'s parameters (the default dtype if it has none): data are
    padded in it, so a float64 model is evaluated and trained on float64 batches."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.get_default_dtype()


def model_device(model):
    """The device of ``model``'s parameters (or buffers; the CPU if it holds no tensors): the
    batches of :func:`evaluate_bound` (and the trainer's) are moved there."""
    return module_device(model) or torch.device("cpu")


ENERGY_METHODS = ("exact", "ais", "reverse_ais", "raise", "pseudo_likelihood")


def _evaluate_energy_based(model, loader, method, num_particles, num_betas, progress=False):
    """Log-likelihood (exact, AIS or reverse AIS) or pseudo-log-likelihood of an energy-based
    model, over the batches of ``loader`` (a progress bar over them with ``progress``)."""
    model.require(method, "method")
    chains = num_particles if num_particles > 1 else 100
    total, variance, steps = 0.0, 0.0, 0
    bar = progress_bar(
        loader.batches(0), total=len(loader), desc=method, unit="batch", disable=not progress
    )
    for x, mask in bar:
        if method == "pseudo_likelihood":
            total += float(model.pseudo_log_likelihood(x, mask).sum())
        else:
            est = model.log_likelihood(
                x, mask, method=method, num_chains=chains, num_betas=num_betas
            )
            total += float(est.log_likelihood.sum())
            variance += float((est.stderr**2).sum())
        steps += int(mask.sum())
    result = {"total": total, "num_steps": steps, "per_step": total / steps}
    if method in (
        "ais",
        "reverse_ais",
        "raise",
    ):  # independent per-sequence estimates: their variances add
        result["stderr_per_step"] = math.sqrt(variance) / steps
        result["num_betas"] = num_betas
        result["num_particles"] = chains  # the chains actually run
    return result


@torch.no_grad()
def evaluate_bound(
    model: Any,
    sequences: Sequence[torch.Tensor],
    batch_size: int = 32,
    method: str = "elbo",
    num_particles: int = 1,
    num_betas: int = 1000,
    progress: bool = False,
) -> Dict[str, Any]:
    """Bound on ``log p(x)`` over a list of sequences, in total and in nats per time step.

    :param model: a :class:`~pyro_seq.models.SequenceModel`.
    :param list sequences: tensors ``(T_i, D)`` on any device (batches are moved to the model's);
        a :class:`~pyro_seq.data.SequenceList` carries the known inputs of a model with
        ``input_dim``.
    :param str method: ``"elbo"`` (average of ``num_particles`` one-sample ELBOs; also reports
        the KL term), ``"iwae"`` or ``"smc"`` (see :func:`pyro_seq.infer.estimate_log_likelihood`).
        Energy-based models (``model.energy_based``, e.g. RTRBM) take ``"exact"``, ``"ais"``
        (``num_particles`` AIS chains, 100 when 1, ``num_betas`` temperatures; adds
        ``stderr_per_step``; a stochastic upper bound), ``"reverse_ais"`` (reverse AIS from
        Gibbs draws of each step's RBM: with exact draws a stochastic lower bound), ``"raise"``
        (reverse AIS from the data, a stochastic lower bound on the annealing model's
        log-likelihood) or
        ``"pseudo_likelihood"`` (a monitor, not a bound).
    :param bool progress: a progress bar over the batches of an energy-based model's estimate
        (AIS at 1000 temperatures takes minutes per batch on a CPU).
    :returns: dict with ``total``, ``num_steps``, ``per_step``, ``kl_per_step`` (ELBO only),
        ``method``, ``num_particles`` and ``num_sequences``.
    """
    if not sequences:
        raise ValueError("evaluate_bound needs at least one sequence")
    validate_sequence_list(
        sequences,
        model.obs_dim,
        model.binary_observations,
        "sequences",
        inputs=inputs_of(sequences),
        input_dim=model.input_dim,
    )
    model.require(method, "method")
    if int(num_particles) < 1:
        raise ValueError(f"num_particles must be >= 1, got {num_particles}")
    return evaluate_checked_bound(
        model, sequences, batch_size, method, num_particles, num_betas, progress=progress
    )


@torch.no_grad()
def evaluate_checked_bound(
    model,
    sequences,
    batch_size=32,
    method="elbo",
    num_particles=1,
    num_betas=1000,
    loader=None,
    progress=False,
):
    """:func:`evaluate_bound` on sequences that the caller has validated (it does not check
    them again: :func:`~pyro_seq.train.fit` validates its validation sequences once and
    evaluates them every epoch). ``loader``: the unshuffled
    :class:`~pyro_seq.data.SequenceLoader` of ``sequences`` with ``batch_size``, in the model's
    dtype and on its device, built once by the caller (default: built here)."""
    if loader is None and (model.energy_based or method in ("elbo", "exact")):
        loader = SequenceLoader(
            sequences,
            batch_size,
            shuffle=False,
            dtype=model_dtype(model),
            device=model_device(model),
        )
    was_training = model.training
    model.eval()
    try:
        if model.energy_based:
            result = _evaluate_energy_based(
                model, loader, method, num_particles, num_betas, progress
            )
        elif method == "elbo":
            total = kl_total = 0.0
            steps = 0
            for x, mask, *inputs in loader.batches(0):
                u = inputs[0] if inputs else None
                terms = [elbo_terms(model, x, mask, u) for _ in range(num_particles)]
                total += sum(float(t["elbo"].sum()) for t in terms) / num_particles
                kl_total += sum(float(t["kl"].sum()) for t in terms) / num_particles
                steps += int(mask.sum())
            result = {
                "total": total,
                "num_steps": steps,
                "per_step": total / steps,
                "kl_per_step": kl_total / steps,
            }
        elif method in ("iwae", "smc"):
            from pyro_seq.infer import estimate_log_likelihood

            dtype, device = model_dtype(model), model_device(model)
            moved = SequenceList(
                [s.to(device=device, dtype=dtype) for s in sequences],
                None
                if inputs_of(sequences) is None
                else [u.to(device=device, dtype=dtype) for u in inputs_of(sequences)],
            )
            est = estimate_log_likelihood(
                model.model,
                model.guide,
                moved,
                method=method,
                num_particles=num_particles,
                batch_size=batch_size,
            )
            result = {
                "total": float(est.total),
                "num_steps": int(est.num_steps),
                "per_step": float(est.nats_per_step),
            }
        elif method == "exact":  # a latent-variable model with a closed-form likelihood
            total, steps = 0.0, 0
            for x, mask, *_ in loader.batches(0):
                total += float(model.exact_log_likelihood(x, mask).sum())
                steps += int(mask.sum())
            result = {"total": total, "num_steps": steps, "per_step": total / steps}
        else:
            raise ValueError(f"method must be 'elbo', 'iwae' or 'smc', got {method!r}")
    finally:
        model.train(was_training)
    if not math.isfinite(result["per_step"]):
        raise FloatingPointError(f"evaluation gave a non-finite bound: {result}")
    result.setdefault("num_particles", num_particles)
    result.update(method=method, num_sequences=len(sequences))
    return result
