"""Time-major packing of ragged batches, shared by the hand-written scans.

A minibatch of sequences of different lengths is padded to ``(B, T, ...)``. The scans
(:mod:`~pyro_seq.nn.relu_scan`, :mod:`~pyro_seq.nn.combiner_scan`, STORN's tanh RNN) compute
only the real steps: the rows are sorted by decreasing length, so the sequences still running at
step ``t`` are a prefix of the sorted batch, and the real steps are stored step-major
("packed", as ``torch.nn.utils.rnn.pack_padded_sequence`` does), one contiguous block of
``counts[t]`` rows per step.
"""

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = [
    "check_lengths",
    "pack_ragged",
    "previous_rows",
    "sequence_lengths",
    "step_offsets",
    "to_padded",
    "unsort_rows",
]


def pack_ragged(lengths: torch.Tensor, T: int) -> Tuple[torch.Tensor, List[int], torch.Tensor]:
    """The packing of a ragged batch with ``lengths`` ``(B,)`` (each in ``[1, T]``).

    :returns: ``(order, counts, index)``: the permutation ``(B,)`` that sorts the rows by
        decreasing length (stable), the number of rows running at each step (a list of length
        ``max(lengths)``) and, for every packed row in step-major order, its flat position
        ``b * T + t`` in the padded ``(B, T)`` layout (original row order).
    """
    order = torch.argsort(lengths, descending=True, stable=True)
    sorted_len = lengths[order]
    active = torch.arange(int(sorted_len[0]), device=lengths.device).unsqueeze(-1) < sorted_len
    t_idx, rank = active.nonzero(as_tuple=True)  # step-major, then sorted rank
    return order, active.sum(-1).tolist(), order[rank] * T + t_idx


def check_lengths(
    lengths: Optional[torch.Tensor], B: int, T: int, caller: str, device=None
) -> torch.Tensor:
    """``lengths``, or all ``T`` when None; ``ValueError`` naming ``caller`` unless it is a
    ``(B,)`` integer tensor with values in ``[1, T]``."""
    if lengths is None:
        return torch.full((B,), T, dtype=torch.long, device=device)
    if (
        lengths.shape != (B,)
        or lengths.dtype.is_floating_point
        or bool((lengths < 1).any())
        or bool((lengths > T).any())
    ):
        raise ValueError(f"{caller}: lengths must be (batch,) integers in [1, {T}]")
    return lengths


def step_offsets(counts: Sequence[int]) -> List[int]:
    """Start of each step's block in the packed rows, and the total (``len(counts) + 1``)."""
    offsets = [0]
    for n in counts:
        offsets.append(offsets[-1] + n)
    return offsets


def to_padded(packed: torch.Tensor, index: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """Packed rows ``(N, F)`` (the order of :func:`pack_ragged`'s ``index``) back in the
    padded layout ``(B, T, F)``, zeros at the padded steps."""
    padded = packed.new_zeros(B * T, packed.shape[-1])
    padded.index_copy_(0, index, packed)
    return padded.view(B, T, -1)


def unsort_rows(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Rows ``(B, F)`` in :func:`pack_ragged`'s sorted order back in the original order."""
    out = torch.empty_like(rows)
    out[order] = rows
    return out


def previous_rows(first: torch.Tensor, packed: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """For every packed row, the same sequence's row one step earlier.

    :param first: ``(B, D)`` the rows before step 1, in sorted order (e.g. initial states).
    :param packed: ``(N, D)`` packed rows of steps ``1..T``.
    :returns: ``(N, D)``: ``first`` for step 1, the previous step's block otherwise.
    """
    offsets = step_offsets(counts)
    prev = [first[: counts[0]]] + [
        packed[offsets[t - 1] : offsets[t - 1] + counts[t]] for t in range(1, len(counts))
    ]
    return torch.cat(prev, 0)


def sequence_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Steps of each row up to its last observed one (at least 1): ``(...,)`` for a
    ``(..., T)`` mask. A row's later steps are padding that no score reads; steps inside it
    that the mask hides (missing observations) still carry the recursion and are counted."""
    T = mask.shape[-1]
    steps = torch.arange(1, T + 1, device=mask.device)
    return (mask.to(torch.bool) * steps).amax(-1).clamp_(min=1)
