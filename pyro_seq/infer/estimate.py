r"""Log-likelihood estimation of sequence models for evaluation (IWAE or SMC estimators).

Both estimators are stochastic lower bounds *in expectation* of :math:`\log p(x)` whose exponent
is unbiased, :math:`\mathbb{E}[\hat p(x)] = p(x)`:

* ``method="iwae"``: :math:`\log \frac{1}{K}\sum_k p(x, z^{(k)}) / q(z^{(k)}|x)` with
  :math:`K` independent proposals of the whole sequence (thesis eq. 2.13);
* ``method="smc"``: the particle filter's :math:`\log \hat p(x)` (thesis eq. 3.20), i.e. one
  evaluation of :class:`~pyro_seq.infer.FIVO` with adaptive (ESS) resampling.

The bias :math:`\log p(x) - \mathbb{E}\log\hat p(x)` shrinks as :math:`K` grows (as
:math:`O(1/K)` for IWAE, Maddison et al. 2017 Prop. 1). Results are therefore always reported
with the method and :math:`K`. ``nats_per_step`` is the summed log-likelihood divided by the
total number of (unpadded) time steps, the "log-likelihood per time step" of Table 1 of
Maddison et al. (2017) and of the thesis' chapter 5 (higher is better).
"""

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from pyro_seq.infer.fivo import FIVO
from pyro_seq.infer.iwae import IWAE
from pyro_seq.infer.protocol import program_device, program_owner
from pyro_seq.ops.padding import check_input_list, inputs_of, pad_sequences
from pyro_seq.ops.resampling import DEFAULT_RESAMPLING
from pyro_seq.validation import positive_int, validate_sequences

__all__ = ["LikelihoodEstimate", "estimate_log_likelihood"]

METHODS = ("iwae", "smc")


@dataclass
class LikelihoodEstimate:
    """Result of :func:`estimate_log_likelihood`.

    :ivar torch.Tensor per_sequence: float64 ``(N,)`` estimates of :math:`\\log p(x^{(n)})`, in
        the order of the input sequences.
    :ivar torch.Tensor lengths: long ``(N,)`` numbers of time steps.
    :ivar float total: sum of ``per_sequence``.
    :ivar int num_steps: total number of time steps, ``lengths.sum()``.
    :ivar float nats_per_step: ``total / num_steps``.
    :ivar str method: ``"iwae"`` or ``"smc"``.
    :ivar int num_particles: :math:`K`.
    """

    per_sequence: torch.Tensor
    lengths: torch.Tensor
    total: float
    num_steps: int
    nats_per_step: float
    method: str
    num_particles: int

    def __str__(self) -> str:
        return (
            f"{self.method} (K={self.num_particles}): {self.nats_per_step:.4f} nats/step, "
            f"total {self.total:.3f} nats over {len(self.lengths)} sequences, "
            f"{self.num_steps} steps"
        )

    def as_dict(self) -> Dict[str, Any]:
        """Plain-Python summary for JSON reports."""
        return {
            "method": self.method,
            "num_particles": self.num_particles,
            "nats_per_step": self.nats_per_step,
            "total": self.total,
            "num_steps": self.num_steps,
            "num_sequences": len(self.lengths),
        }


def _batches(data, batch_size, device=None):
    """Yield ``(x, mask, inputs)`` batches from the accepted data formats (checked against the
    model's ``device`` when known); ``inputs`` is None unless the data are a
    :class:`~pyro_seq.ops.SequenceList` with inputs."""
    inputs = inputs_of(data)
    if inputs is not None:
        check_input_list(data, inputs)
        bs = batch_size or len(data)
        for i in range(0, len(data), bs):
            chunk, u = data[i : i + bs], inputs[i : i + bs]
            x, mask = validate_sequences(*pad_sequences(chunk, dtype=chunk[0].dtype), device=device)
            yield x, mask, pad_sequences(u, dtype=chunk[0].dtype)[0].to(x.device)
        return
    for x, mask in _plain_batches(data, batch_size, device):
        yield x, mask, None


def _plain_batches(data, batch_size, device=None):
    """``(x, mask)`` batches of data without known inputs."""
    if torch.is_tensor(data):
        data = (data, None)
    if (
        isinstance(data, tuple)
        and len(data) == 2
        and torch.is_tensor(data[0])
        and data[0].dim() == 3
    ):
        data = [data]
    data = list(data)
    if not data:
        raise ValueError("estimate_log_likelihood: no data")
    if all(torch.is_tensor(s) and s.dim() == 2 for s in data):  # a list of (T_i, D) sequences
        bs = batch_size or len(data)
        for i in range(0, len(data), bs):
            chunk = data[i : i + bs]
            yield validate_sequences(*pad_sequences(chunk, dtype=chunk[0].dtype), device=device)
        return
    for item in data:
        if torch.is_tensor(item) and item.dim() == 3:
            x, mask = item, None
        elif isinstance(item, (tuple, list)) and len(item) == 2 and torch.is_tensor(item[0]):
            x, mask = item
        else:
            raise TypeError(
                "data must be a list of (T_i, D) sequences, an (x, mask) batch, or an iterable "
                f"of (x, mask) batches / (batch, T, D) tensors; got an item of type {type(item).__name__}"
            )
        # the package's one validator, before any slicing
        x, mask = validate_sequences(x, mask, device=device)
        bs = batch_size or x.shape[0]
        for i in range(0, x.shape[0], bs):
            yield x[i : i + bs], mask[i : i + bs]


def _iwae_log_z(
    model, guide, x, mask, num_particles, particles_per_pass, max_plate_nesting, **kwargs
):
    """IWAE estimate, drawing the ``K`` particles in chunks of ``particles_per_pass``."""
    chunks, remaining = [], num_particles
    while remaining > 0:
        k = min(remaining, particles_per_pass)
        iwae = IWAE(num_particles=k, vectorize_particles=True, max_plate_nesting=max_plate_nesting)
        log_z, _ = iwae.log_z(model, guide, x, mask, **kwargs)
        chunks.append(log_z.double() + torch.log(torch.tensor(float(k), dtype=torch.float64)))
        remaining -= k
    # log (1/K) sum_k w_k = logsumexp_j (log_mean_j + log K_j) - log K
    return torch.logsumexp(torch.stack(chunks), 0) - torch.log(
        torch.tensor(float(num_particles), dtype=torch.float64)
    )


def estimate_log_likelihood(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    data: Union[torch.Tensor, Sequence[torch.Tensor], Iterable[Tuple[torch.Tensor, torch.Tensor]]],
    method: str = "iwae",
    num_particles: int = 100,
    batch_size: Optional[int] = None,
    particles_per_pass: Optional[int] = None,
    resample: str = "ess",
    resampling: str = DEFAULT_RESAMPLING,
    ess_threshold: float = 0.5,
    max_plate_nesting: int = 1,
) -> LikelihoodEstimate:
    """Estimate :math:`\\log p(x)` of every sequence with an IWAE or SMC estimator.

    :param model: the model program (e.g. ``m.model``); for ``"smc"`` it must follow the step
        protocol (``init``/``step``).
    :param guide: the proposal (e.g. ``m.guide``); it need not be reparameterized (no gradient
        is taken; :meth:`FIVO.log_z <pyro_seq.infer.FIVO.log_z>` accepts any guide).
    :param data: a list of ``(T_i, D)`` sequences (a :class:`~pyro_seq.ops.SequenceList` with
        known inputs passes them to the programs as ``inputs=``), a ``(batch, T, D)`` tensor,
        an ``(x, mask)``
        batch, or an iterable of ``(x, mask)`` batches, on the device of the model's parameters
        (``model.device`` of a :class:`~pyro_seq.models.base.StepProgram`; a ValueError naming
        the tensor otherwise).
    :param str method: ``"iwae"`` or ``"smc"`` (module docstring).
    :param int num_particles: :math:`K`.
    :param int batch_size: sequences per pass (default: all of a batch at once).
    :param int particles_per_pass: IWAE only: draw the :math:`K` particles in chunks of this
        size to bound memory (the estimate is the same function of the :math:`K` weights).
    :param str resample: SMC resampling criterion (``"ess"``, ``"always"``, ``"never"``), the
        vocabulary of :mod:`pyro_seq.ops.resampling`.
    :param str resampling: SMC resampling scheme (``"systematic"``, the default everywhere,
        ``"stratified"`` or ``"multinomial"``).
    :param float ess_threshold: SMC ESS threshold (fraction of :math:`K` in ``[0, 1]``).
    :param int max_plate_nesting: plates of the programs (1 for the sequence models).
    :returns: :class:`LikelihoodEstimate` (``per_sequence`` float64 ``(N,)``, ``nats_per_step``,
        ``method``, ``num_particles``, ...). Computed without gradients, with the programs'
        modules (``.owner`` of a :class:`~pyro_seq.models.base.StepProgram`) in ``eval()`` mode
        and restored after: training-only terms, such as the KVAE's reconstruction weight, are
        off.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    num_particles = positive_int("num_particles", num_particles)
    batch_size = positive_int("batch_size", batch_size, optional=True)
    particles_per_pass = positive_int("particles_per_pass", particles_per_pass, optional=True)
    estimates: List[torch.Tensor] = []
    length_parts: List[torch.Tensor] = []
    owners = {id(o): o for o in (program_owner(model), program_owner(guide)) if o is not None}
    modes = {k: o.training for k, o in owners.items()}
    for o in owners.values():
        o.eval()
    try:
        _estimate(
            model,
            guide,
            data,
            method,
            num_particles,
            batch_size,
            particles_per_pass,
            resample,
            resampling,
            ess_threshold,
            max_plate_nesting,
            estimates,
            length_parts,
        )
    finally:
        for k, o in owners.items():
            o.train(modes[k])
    per_sequence = torch.cat(estimates)
    lengths = torch.cat(length_parts).long()
    total = float(per_sequence.sum())
    num_steps = int(lengths.sum())
    return LikelihoodEstimate(
        per_sequence=per_sequence,
        lengths=lengths,
        total=total,
        num_steps=num_steps,
        nats_per_step=total / num_steps,
        method=method,
        num_particles=num_particles,
    )


def _estimate(
    model,
    guide,
    data,
    method,
    num_particles,
    batch_size,
    particles_per_pass,
    resample,
    resampling,
    ess_threshold,
    max_plate_nesting,
    estimates,
    lengths,
):
    """The estimation loop of :func:`estimate_log_likelihood`; appends to ``estimates`` and
    ``lengths``."""
    with torch.no_grad():
        for x, mask, inputs in _batches(data, batch_size, program_device(model)):
            kwargs = {} if inputs is None else {"inputs": inputs}
            if method == "iwae":
                log_z = _iwae_log_z(
                    model,
                    guide,
                    x,
                    mask,
                    num_particles,
                    particles_per_pass or num_particles,
                    max_plate_nesting,
                    **kwargs,
                )
            else:
                fivo = FIVO(
                    num_particles=num_particles,
                    resample=resample,
                    ess_threshold=ess_threshold,
                    resampling=resampling,
                    max_plate_nesting=max_plate_nesting,
                )
                log_z, _ = fivo.log_z(model, guide, x, mask, **kwargs)
            if log_z.shape != (x.shape[0],):
                raise ValueError(
                    f"{method}: got {tuple(log_z.shape)} estimates for a batch of {x.shape[0]} "
                    "sequences; every site must lie in the batch plate to give one per sequence"
                )
            estimates.append(log_z.double().cpu())
            lengths.append(mask.sum(-1).cpu())
