r"""Differentiable neural dictionary (DND; Pritzel et al. 2017; thesis sec. 7.2, 7.3).

A DND is a memory of ``(key, value)`` pairs, one memory per sequence. :meth:`DND.write` appends
pairs; :meth:`DND.read` returns, for each query, the ``k`` stored entries whose keys are
nearest in Euclidean distance, with those distances and the entries' values. In the GTM-SM the
keys are the agent's inferred positions ``s_t`` and the values the statistics of the frame
encodings ``z_t`` (thesis eq. 7.1 and sec. 7.3.3).

*Differentiable* means: the selection of the ``k`` neighbours is a discrete choice (no gradient
flows through *which* entries are chosen), but the returned distances are computed in torch
from the stored keys and the queries, and the returned values are the stored tensors, so
gradients flow to queries, keys and values through everything a reader computes from them.

Search. :meth:`DND.read` is *exact*: every query is compared with every key of its sequence
(``O(n d)`` work and memory per query, ``n`` entries of dimension ``d``) and the entries are
ordered by a stable sort of the squared distances. Tie rule: among entries at the same
distance (bit-for-bit equal squared distances in the computation dtype), the one written
earlier (the lower index) comes first. This is what a brute-force reference gives, and what the
tests check. For the memories of the thesis (``n = 256`` positions of dimension 2 to 5, a few
particles) this is cheaper than building any index.

Scaling (not adopted here). For memories of many thousands of entries per sequence the exact
search dominates. The DND of Pritzel et al. uses an approximate nearest-neighbour index for
this: a kd-tree (Bentley 1975) per sequence, built at write time, suits low-dimensional keys
such as positions (logarithmic queries); FAISS (IVF or HNSW indices, on CPU or GPU) suits
high-dimensional keys. Either would replace only the *selection* step of :meth:`DND.read`:
the index returns the ``k`` candidate indices, and the distances are then recomputed in torch
from the gathered keys, exactly as here, so gradients are unchanged; the approximation can only
change which entries are selected (and the tie rule becomes the index's). Appending to a
kd-tree requires rebuilding (or a logarithmic forest of trees); FAISS indices support ``add``.

Reads during writing. :func:`nearest_earlier` gives, for every entry of a sequence of keys, the
read that entry's query would get from a DND holding only the entries written before it (the
same neighbours, order and tie rule as :meth:`DND.read`), for all entries at once. A reader that
writes one entry per step and reads before each write (the reversed DND of the GTM-SM's landmark
inference network, thesis appendix 7.10) needs only the keys to know its neighbours: the values,
which may depend on earlier reads, are then gathered step by step.
"""

from typing import NamedTuple, Optional

import torch

__all__ = ["DND", "DNDRead", "EarlierRead", "nearest_earlier"]


class DNDRead(NamedTuple):
    """What :meth:`DND.read` returns; ``k' = min(k, n)``, ``lead`` = the queries' leading
    dims (e.g. particles).

    * ``distances``: ``(*lead, batch, k')`` Euclidean distances, ascending (gradient 0 where a
      distance is exactly 0, instead of the infinite derivative of the square root);
    * ``squared_distances``: ``(*lead, batch, k')``, the same squared (smooth everywhere);
    * ``values``: ``(*lead, batch, k', *value_shape)``, the entries' values;
    * ``keys``: ``(*lead, batch, k', key_dim)``, the entries' keys;
    * ``indices``: int64 ``(*lead, batch, k')``, the entries' positions in write order.
    """

    distances: torch.Tensor
    squared_distances: torch.Tensor
    values: torch.Tensor
    keys: torch.Tensor
    indices: torch.Tensor


class DND:
    """A differentiable neural dictionary per sequence, exact k-nearest-neighbour reads.

    :param int key_dim: size ``d`` of the keys.

    Attributes ``keys`` ``(batch, n, d)`` and ``values`` ``(batch, n, *value_shape)`` (None
    until the first write); ``len(dnd)`` is ``n``. A DND is a plain container of tensors (not
    an :class:`torch.nn.Module`; it has no parameters): a model builds one per sequence pass.
    """

    def __init__(self, key_dim: int):
        if isinstance(key_dim, bool) or not isinstance(key_dim, int) or key_dim < 1:
            raise ValueError(f"key_dim must be a positive int, got {key_dim!r}")
        self.key_dim = key_dim
        self.keys: Optional[torch.Tensor] = None
        self.values: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def __repr__(self) -> str:
        if self.keys is None:
            return f"DND(key_dim={self.key_dim}, empty)"
        assert self.values is not None  # keys and values are written together
        return (
            f"DND(key_dim={self.key_dim}, batch={self.keys.shape[0]}, size={len(self)}, "
            f"value_shape={tuple(self.values.shape[2:])})"
        )

    def write(self, keys: torch.Tensor, values: torch.Tensor) -> "DND":
        """Append entries to every sequence's memory (differentiably: a concatenation).

        :param keys: ``(batch, d)`` (one entry per sequence) or ``(batch, m, d)`` (``m``).
        :param values: ``(batch, *value_shape)`` or ``(batch, m, *value_shape)``, matching.
        :returns: ``self``.
        :raises ValueError: shapes that disagree with each other or with earlier writes,
            non-finite keys.
        """
        if not (torch.is_tensor(keys) and torch.is_tensor(values)):
            raise ValueError("DND.write takes tensors keys and values")
        if keys.dim() not in (2, 3) or keys.shape[-1] != self.key_dim:
            raise ValueError(
                f"DND.write: keys must be (batch, {self.key_dim}) or "
                f"(batch, m, {self.key_dim}), got {tuple(keys.shape)}"
            )
        if keys.dim() == 2:
            keys, values = keys.unsqueeze(1), values.unsqueeze(1)
        if values.dim() < 2 or values.shape[:2] != keys.shape[:2]:
            raise ValueError(
                f"DND.write: values {tuple(values.shape)} do not match keys "
                f"{tuple(keys.shape)} in (batch, m)"
            )
        if not bool(torch.isfinite(keys).all()):
            raise ValueError("DND.write: keys must be finite")
        if self.keys is None:
            self.keys, self.values = keys, values
            return self
        assert self.values is not None  # keys and values are written together
        if keys.shape[0] != self.keys.shape[0] or values.shape[2:] != self.values.shape[2:]:
            raise ValueError(
                f"DND.write: batch {keys.shape[0]} and value shape "
                f"{tuple(values.shape[2:])} differ from the memory's "
                f"{self.keys.shape[0]} and {tuple(self.values.shape[2:])}"
            )
        self.keys = torch.cat([self.keys, keys], 1)
        self.values = torch.cat([self.values, values], 1)
        return self

    def read(self, queries: torch.Tensor, k: int) -> DNDRead:
        """The ``k`` nearest entries (Euclidean) of each query's sequence, exactly.

        :param queries: ``(*lead, batch, d)``; ``lead`` is any shape (e.g. particles), and
            ``batch`` must equal the memory's (or be 1, broadcast).
        :param int k: neighbours wanted; ``min(k, n)`` are returned when the memory holds fewer.
        :returns: :class:`DNDRead`, ordered by increasing distance, ties by write order.
        :raises RuntimeError: the memory is empty.
        :raises ValueError: a bad ``k`` or query shape, non-finite queries.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if self.keys is None:
            raise RuntimeError("DND.read: the memory is empty; write(keys, values) before reading")
        assert self.values is not None  # keys and values are written together
        if not torch.is_tensor(queries) or queries.dim() < 2 or queries.shape[-1] != self.key_dim:
            raise ValueError(
                f"DND.read: queries must be (*lead, batch, {self.key_dim}), got "
                f"{tuple(getattr(queries, 'shape', ()))}"
            )
        batch = self.keys.shape[0]
        if queries.shape[-2] not in (1, batch):
            raise ValueError(
                f"DND.read: queries have batch {queries.shape[-2]}, the memory {batch}"
            )
        if not bool(torch.isfinite(queries).all()):
            raise ValueError("DND.read: queries must be finite")
        lead = queries.shape[:-2]
        n, kk = len(self), min(k, len(self))
        diff = queries.unsqueeze(-2) - self.keys  # (*lead, batch, n, d)
        sq = diff.pow(2).sum(-1)  # (*lead, batch, n)
        order = torch.sort(sq.detach(), dim=-1, stable=True).indices[..., :kk]
        sq_k = torch.gather(sq, -1, order)
        positive = sq_k > 0
        dist = torch.where(
            positive,
            torch.where(positive, sq_k, torch.ones_like(sq_k)).sqrt(),
            torch.zeros_like(sq_k),
        )
        full = lead + (batch,)
        vshape = self.values.shape[2:]
        flat_values = self.values.reshape(batch, n, -1).expand(full + (n, -1))
        V = flat_values.shape[-1]
        values = torch.gather(flat_values, -2, order.unsqueeze(-1).expand(full + (kk, V)))
        keys = torch.gather(
            self.keys.expand(full + (n, self.key_dim)),
            -2,
            order.unsqueeze(-1).expand(full + (kk, self.key_dim)),
        )
        return DNDRead(dist, sq_k, values.reshape(full + (kk,) + vshape), keys, order)


class EarlierRead(NamedTuple):
    """What :func:`nearest_earlier` returns for keys ``(batch, n, d)``: ``k`` slots per entry.

    * ``distances``: ``(batch, n, k)`` Euclidean distances, ascending over the valid slots
      (0 at padding; gradient 0 where a distance is exactly 0, as :class:`DNDRead`);
    * ``squared_distances``: ``(batch, n, k)``, the same squared;
    * ``indices``: int64 ``(batch, n, k)``, the neighbours' positions (0 at padding);
    * ``valid``: bool ``(batch, n, k)``: slot ``j`` of entry ``i`` holds a neighbour iff
      ``j < i`` (entry ``i`` has ``i`` earlier entries, so ``min(k, i)`` valid slots, first).
    """

    distances: torch.Tensor
    squared_distances: torch.Tensor
    indices: torch.Tensor
    valid: torch.Tensor


def nearest_earlier(keys: torch.Tensor, k: int) -> EarlierRead:
    """For every entry ``i`` of ``keys``, its ``k`` nearest among the entries ``0..i-1``.

    Slot for slot what ``DND(d).write(keys[:, :i], ...).read(keys[:, i], k)`` returns (same
    neighbours, order and tie rule: ties by write order), padded to ``k`` slots: entry 0 has no
    neighbour (every slot padding), entry ``i < k`` has ``i``. The selection is done without
    gradient on all ``n x n`` pairs by :func:`torch.cdist` in its exact mode (differences, not
    the matrix-product expansion; ``O(batch n^2)`` memory); the distances are then recomputed
    differentiably, as :meth:`DND.read` computes them, for the ``n k`` selected pairs only.
    Equal keys are at distance exactly 0 either way; two entries whose distances differ only by
    rounding may be ordered differently from :meth:`DND.read`.

    :param keys: ``(batch, n, d)``.
    :param int k: neighbours per entry.
    :returns: :class:`EarlierRead`.
    :raises ValueError: a bad ``k``, keys not 3-D or not finite.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if not torch.is_tensor(keys) or keys.dim() != 3:
        raise ValueError(
            f"nearest_earlier: keys must be (batch, n, d), got {tuple(getattr(keys, 'shape', ()))}"
        )
    if not bool(torch.isfinite(keys).all()):
        raise ValueError("nearest_earlier: keys must be finite")
    batch, n, d = keys.shape
    kk = min(k, n)
    with torch.no_grad():
        dist = torch.cdist(keys, keys, compute_mode="donot_use_mm_for_euclid_dist")  # [b, i, j]
        later = torch.ones(n, n, dtype=torch.bool, device=keys.device).triu()  # j >= i
        dist = dist.masked_fill(later, float("inf"))
        order = torch.sort(dist, dim=-1, stable=True).indices[..., :kk]  # (batch, n, kk)
    slots = torch.arange(kk, device=keys.device)
    valid = slots < torch.arange(n, device=keys.device).unsqueeze(-1)  # (n, kk): j < i
    order = torch.where(valid, order, torch.zeros_like(order))
    chosen = torch.gather(keys, 1, order.reshape(batch, n * kk, 1).expand(batch, n * kk, d))
    chosen = chosen.reshape(batch, n, kk, d)
    sq_k = (keys.unsqueeze(2) - chosen).pow(2).sum(-1)
    valid = valid.expand(batch, n, kk)
    sq_k = torch.where(valid, sq_k, torch.zeros_like(sq_k))
    positive = sq_k > 0
    dist = torch.where(
        positive, torch.where(positive, sq_k, torch.ones_like(sq_k)).sqrt(), torch.zeros_like(sq_k)
    )
    if kk < k:  # fewer entries than slots: pad
        pad = (0, k - kk)
        dist, sq_k = (torch.nn.functional.pad(v, pad) for v in (dist, sq_k))
        order = torch.nn.functional.pad(order, pad)
        valid = torch.nn.functional.pad(valid, pad, value=False)
    return EarlierRead(dist, sq_k, order, valid)
