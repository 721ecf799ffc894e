"""Batching ragged sequences into padded ``(batch, T, D)`` tensors with a ``(batch, T)`` mask.

Conventions (the sequence-model contract of the design notes): sequences are left-aligned,
``mask[b, t]`` is ``True`` for the real steps ``t < T_b`` of sequence ``b`` and ``False`` for
padding, and padded entries of ``x`` are zero.
"""

from __future__ import annotations

import math
import numbers
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from pyro_seq.ops.padding import SequenceList, check_input_list, inputs_of, pad_sequences
from pyro_seq.ops.padding import check_seq_list as _check_seq_list
from pyro_seq.validation import validate_sequences

__all__ = [
    "pad_sequences",
    "unpad_sequences",
    "chunk_sequences",
    "validate_sequences",
    "SequenceLoader",
]


def unpad_sequences(x: torch.Tensor, mask: torch.Tensor) -> List[torch.Tensor]:
    """Inverse of :func:`pad_sequences`.

    Args:
        x: ``(B, T, D)`` padded batch.
        mask: ``(B, T)`` boolean mask, each row a prefix of ``True`` values.

    Returns:
        list of ``B`` tensors ``x[i, :T_i]`` of shapes ``(T_i, D)``, ``T_i = mask[i].sum()``.
    """
    validate_sequences(x, mask, prefix_mask=True)
    return [x[i, : int(m.sum())] for i, m in enumerate(mask)]


def chunk_sequences(
    seqs: Sequence[torch.Tensor], length: int, drop_remainder: bool = False
) -> List[torch.Tensor]:
    r"""Split every sequence into consecutive non-overlapping windows of ``length`` steps (a
    :class:`SequenceList`'s inputs are cut into the same windows).

    Args:
        seqs: tensors of shapes ``(T_i, D)``.
        length: window length ``L >= 1``.
        drop_remainder: if ``True`` drop each sequence's last window when it is shorter than
            ``L`` (a sequence shorter than ``L`` then contributes nothing); if ``False`` keep it.

    Returns:
        list of windows in order (sequence by sequence, then time), shapes ``(L, D)`` except
        possibly the last of each sequence, ``(T_i mod L, D)``. With ``drop_remainder=False``,
        concatenating the windows of sequence ``i`` gives back ``seqs[i]``.
    """
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ValueError(f"chunk length must be a positive int, got {length!r}")
    _check_seq_list(seqs)
    inputs = inputs_of(seqs)
    out: List[torch.Tensor] = []
    out_inputs: List[torch.Tensor] = []
    for i, s in enumerate(seqs):
        for start in range(0, s.shape[0], length):
            w = s[start : start + length]
            if w.shape[0] < length and drop_remainder:
                break
            out.append(w)
            if inputs is not None:
                out_inputs.append(inputs[i][start : start + length])
    return out if inputs is None else SequenceList(out, out_inputs)


class SequenceLoader:
    """Minibatches ``(x, mask)`` of ragged sequences, reproducible from ``(seed, epoch)``; with
    known inputs (``inputs``, or those of a :class:`SequenceList`) ``(x, mask, inputs)``.

    Each epoch visits every sequence (or every window, with ``chunk_length``) exactly once
    (except the incomplete last batch when ``drop_last``). The order of epoch ``e`` is a pure
    function of ``(seed, e)`` (numpy's PCG64 seeded with ``[seed, e]``), independent of how
    many epochs were iterated before, so a training run resumed at epoch ``e`` sees exactly the
    batches an uninterrupted run would.

    Epoch bookkeeping: ``iter(loader)`` yields epoch ``loader.epoch`` and then advances
    ``loader.epoch`` by one, so plain ``for x, mask in loader`` reshuffles every epoch;
    ``loader.set_epoch(e)`` makes the next iteration epoch ``e`` (call it when resuming);
    ``loader.batches(e)`` yields epoch ``e`` without touching ``loader.epoch``.

    Args:
        seqs: tensors of shapes ``(T_i, D)`` (a :class:`SequenceList` may carry inputs).
        batch_size: sequences per minibatch.
        shuffle: random order per epoch; if ``False`` the order is the input order, every epoch.
        seed: seed of the shuffling.
        chunk_length: if given, split the sequences once, up front, into windows of this many
            steps (:func:`chunk_sequences`, remainders kept) and batch the windows.
        drop_last: drop the last batch of an epoch if it has fewer than ``batch_size`` items.
        sort_by_length: bucketing: after shuffling, sort each pool of ``bucket_batches``
            consecutive batches' worth of items by length (longest first) so that a batch holds
            sequences of similar lengths and pads less; the batch order is then shuffled again.
            Off by default.
        bucket_batches: pool size of ``sort_by_length``, in batches.
        dtype: floating dtype of ``x``.
        device: device of the yielded tensors.
        inputs: known inputs ``(T_i, U)`` per sequence (default: those ``seqs`` carries).

    Yields:
        ``(x, mask)``: ``x`` of shape ``(b, T, D)`` (``T`` the longest item in the batch,
        ``b <= batch_size``) and ``bool`` ``mask`` of shape ``(b, T)``, as from
        :func:`pad_sequences`; with inputs ``(x, mask, inputs)``, ``inputs`` ``(b, T, U)``
        padded with zeros.
    """

    def __init__(
        self,
        seqs: Sequence[torch.Tensor],
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        chunk_length: Optional[int] = None,
        drop_last: bool = False,
        sort_by_length: bool = False,
        bucket_batches: int = 50,
        dtype: torch.dtype = torch.float32,
        device: Union[str, torch.device, None] = None,
        inputs: Optional[Sequence[torch.Tensor]] = None,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if (
            not isinstance(bucket_batches, int)
            or isinstance(bucket_batches, bool)
            or bucket_batches < 1
        ):
            raise ValueError(f"bucket_batches must be a positive int, got {bucket_batches!r}")
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        _check_seq_list(seqs)
        if inputs is None:
            inputs = inputs_of(seqs)
        if inputs is not None:
            check_input_list(seqs, list(inputs))
            seqs = SequenceList(seqs, inputs)
        items = chunk_sequences(seqs, chunk_length) if chunk_length is not None else seqs
        self.items: List[torch.Tensor] = list(items)
        #: the known inputs of each item, or None
        self.inputs: Optional[List[torch.Tensor]] = inputs_of(items)
        self.lengths: np.ndarray = np.array([s.shape[0] for s in self.items])
        self.batch_size: int = batch_size
        self.shuffle: bool = shuffle
        self.seed: int = int(seed)
        self.drop_last: bool = drop_last
        self.sort_by_length: bool = sort_by_length
        self.bucket_batches: int = bucket_batches
        self.dtype: torch.dtype = dtype
        self.device: Union[str, torch.device, None] = device
        self.epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter(self)`` yield the batches of epoch ``epoch``."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)

    def __len__(self) -> int:
        """Number of batches per epoch."""
        n = len(self.items)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def batch_indices(self, epoch: int) -> List[np.ndarray]:
        """Indices into ``self.items`` of every batch of epoch ``epoch``, in order.

        Returns:
            ``len(self)`` integer arrays, each of length ``<= batch_size``.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        n = len(self.items)
        rng = np.random.Generator(np.random.PCG64([self.seed, int(epoch)]))
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        bs = self.batch_size
        if self.sort_by_length:
            pool = bs * self.bucket_batches
            parts = []
            for start in range(0, n, pool):
                chunk = order[start : start + pool]
                # stable sort, longest first: ties keep the (shuffled) order
                parts.append(chunk[np.argsort(-self.lengths[chunk], kind="stable")])
            order = np.concatenate(parts)
        batches = [order[i : i + bs] for i in range(0, n, bs)]
        if self.drop_last and batches and len(batches[-1]) < bs:
            batches.pop()
        if self.sort_by_length and self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def batches(self, epoch: int) -> Iterator[Tuple[torch.Tensor, ...]]:
        """Yield the ``(x, mask)`` (or ``(x, mask, inputs)``) minibatches of epoch ``epoch``
        (``self.epoch`` unchanged)."""
        for idx in self.batch_indices(epoch):
            x, mask = pad_sequences([self.items[i] for i in idx], dtype=self.dtype)
            if self.device is not None:
                x, mask = x.to(self.device), mask.to(self.device)
            if self.inputs is None:
                yield x, mask
                continue
            u, _ = pad_sequences([self.inputs[i] for i in idx], dtype=self.dtype)
            yield x, mask, (u if self.device is None else u.to(self.device))

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, ...]]:
        epoch = self.epoch
        self.epoch += 1
        return self.batches(epoch)

    @property
    def num_steps(self) -> int:
        """Total number of real time steps over all items (for per-step averages)."""
        return int(self.lengths.sum())
