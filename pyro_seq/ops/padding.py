"""Padding ragged sequences ``(T_i, D)`` into a batch ``(B, T, D)`` with a prefix mask ``(B, T)``.

The package's one padding function (used by :mod:`pyro_seq.data` and the likelihood
estimators). Pure torch.
"""

from typing import Sequence, Tuple

import torch

__all__ = ["pad_sequences"]


def _check_seq_list(seqs: Sequence[torch.Tensor], what: str = "seqs") -> None:
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
    _check_seq_list(seqs)
    device = seqs[0].device
    lengths = [s.shape[0] for s in seqs]
    x = torch.zeros(len(seqs), max(lengths), seqs[0].shape[1], dtype=dtype, device=device)
    for i, s in enumerate(seqs):
        x[i, : s.shape[0]] = s.to(dtype)
    mask = torch.arange(x.shape[1], device=device).unsqueeze(0) < torch.tensor(
        lengths, device=device).unsqueeze(1)
    return x, mask
