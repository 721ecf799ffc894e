"""Padding ragged sequences ``(T_i, D)`` into a batch ``(B, T, D)`` with a prefix mask ``(B, T)``,
and the data split that carries known inputs next to them (:class:`SequenceList`).

The package's one padding function (used by :mod:`pyro_seq.data` and the likelihood
estimators). Pure torch.
"""

from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ["SequenceList", "check_input_list", "check_seq_list", "inputs_of", "pad_sequences"]


class SequenceList(list):
    """A data split: a list of sequences ``(T_i, D)`` that may carry the known inputs of each
    (controls, actions) ``inputs[i]`` ``(T_i, U)``, one per step of the same sequence.

    It is a plain list of the observation tensors for every consumer that ignores inputs;
    :func:`inputs_of` (the trainer, the evaluators, the loader, the command line) reads them.
    Slices keep the inputs; :meth:`select` picks by index.

    :param sequences: tensors ``(T_i, D)``.
    :param inputs: None, or as many tensors ``(T_i, U)`` (same ``T_i``, same ``U``, floating).
    :raises ValueError: the inputs do not match the sequences (naming the first that does not).
    """

    def __init__(self, sequences=(), inputs=None):
        super().__init__(sequences)
        if inputs is not None:
            inputs = list(inputs)
            check_input_list(self, inputs)
        self.inputs: Optional[List[torch.Tensor]] = inputs

    def __getitem__(self, index):
        if isinstance(index, slice):
            inputs = None if self.inputs is None else self.inputs[index]
            return SequenceList(list.__getitem__(self, index), inputs)
        return list.__getitem__(self, index)

    def select(self, indices):
        """The sequences (and inputs) at ``indices``, in that order."""
        indices = [int(i) for i in indices]
        inputs = None if self.inputs is None else [self.inputs[i] for i in indices]
        return SequenceList([list.__getitem__(self, i) for i in indices], inputs)

    @property
    def input_dim(self) -> int:
        """``U``, the inputs' features per step (0 without inputs)."""
        return 0 if not self.inputs else int(self.inputs[0].shape[-1])

    def __repr__(self):
        extra = "" if self.inputs is None else f", with inputs of {self.input_dim} features"
        return f"SequenceList({len(self)} sequences{extra})"


def inputs_of(sequences) -> Optional[List[torch.Tensor]]:
    """The known inputs a list of sequences carries (:class:`SequenceList`), else None."""
    return sequences.inputs if isinstance(sequences, SequenceList) else None


def check_input_list(seqs, inputs, what="inputs"):
    """Check known inputs ``(T_i, U)`` against their sequences ``(T_i, D)``: as many, the same
    steps, one feature size, floating and finite (ValueError naming the first that is not)."""
    if len(inputs) != len(seqs):
        raise ValueError(f"{what}: {len(inputs)} input sequences for {len(seqs)} sequences")
    if not inputs:
        return
    U = None
    for i, (s, u) in enumerate(zip(seqs, inputs)):
        if not torch.is_tensor(u) or u.dim() != 2 or not u.is_floating_point():
            raise ValueError(
                f"{what}[{i}]: expected a floating (T, U) tensor, got "
                f"{getattr(u, 'dtype', type(u).__name__)} of shape "
                f"{tuple(getattr(u, 'shape', ()))}"
            )
        if u.shape[0] != s.shape[0]:
            raise ValueError(
                f"{what}[{i}] has {u.shape[0]} steps, its sequence {s.shape[0]}: "
                "give one input per step"
            )
        if U is None:
            U = u.shape[1]
        elif u.shape[1] != U:
            raise ValueError(f"{what}[{i}]: {u.shape[1]} features, {what}[0] has {U}")
        if not bool(torch.isfinite(u).all()):
            raise ValueError(f"{what}[{i}] holds NaN or infinite values")


def check_seq_list(seqs: Sequence[torch.Tensor], what: str = "seqs") -> None:
    """Refuse anything but a non-empty list of 2-D ``(T_i, D)`` tensors, each with at least
    one step and all with the same D: ``ValueError`` naming ``what[i]``."""
    if isinstance(seqs, torch.Tensor) or len(seqs) == 0:
        raise ValueError(f"{what}: expected a non-empty list of (T_i, D) tensors")
    d = None
    for i, s in enumerate(seqs):
        if not isinstance(s, torch.Tensor):
            raise ValueError(f"{what}[{i}]: expected a torch.Tensor, got {type(s).__name__}")
        if s.dim() != 2:
            raise ValueError(
                f"{what}[{i}]: expected a 2-D (T, D) tensor, got {s.dim()}-D shape {tuple(s.shape)}"
            )
        if s.shape[0] == 0:
            raise ValueError(f"{what}[{i}]: empty sequence (0 time steps)")
        if d is None:
            d = s.shape[1]
        elif s.shape[1] != d:
            raise ValueError(f"{what}[{i}]: feature size {s.shape[1]} differs from {what}[0]'s {d}")


def pad_sequences(
    seqs: Sequence[torch.Tensor], dtype: torch.dtype = torch.float32
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Stack ragged sequences into a zero-padded batch.

    Args:
        seqs: ``B`` tensors of shapes ``(T_i, D)`` (same ``D``, ``T_i >= 1``).
        dtype: floating dtype of the result.

    The result lives on the device of ``seqs[0]``.

    Returns:
        ``(x, mask)``: ``x`` of shape ``(B, T, D)`` with ``T = max_i T_i``,
        ``x[i, :T_i] = seqs[i]`` and zeros after; ``mask`` ``bool`` of shape ``(B, T)``,
        ``True`` exactly at ``t < T_i``.
    """
    check_seq_list(seqs)
    device = seqs[0].device
    lengths = [s.shape[0] for s in seqs]
    x = torch.zeros(len(seqs), max(lengths), seqs[0].shape[1], dtype=dtype, device=device)
    for i, s in enumerate(seqs):
        x[i, : s.shape[0]] = s.to(dtype)
    mask = torch.arange(x.shape[1], device=device).unsqueeze(0) < torch.tensor(
        lengths, device=device
    ).unsqueeze(1)
    return x, mask
