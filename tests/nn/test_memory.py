"""pyro_seq.nn.DND: exact k-NN reads against a brute-force reference (ties included), k larger
than the memory, batching over sequences and particles, gradients and errors."""

import itertools
import math

import pytest
import torch

from pyro_seq.nn import DND


def brute_force(keys, values, query, k):
    """Reference for one sequence and one query, in float64 Python: sort the entries by
    (squared distance, write index) and keep the first min(k, n)."""
    rows = []
    for i in range(keys.shape[0]):
        d2 = sum((float(q) - float(c)) ** 2 for q, c in zip(query, keys[i]))
        rows.append((d2, i))
    rows.sort()
    rows = rows[:min(k, len(rows))]
    return [math.sqrt(d2) for d2, _ in rows], [i for _, i in rows]


def test_matches_brute_force_with_ties_batched_over_sequences_and_particles():
    torch.manual_seed(0)
    B, K, d = 3, 4, 2
    # integer grid keys: many exact ties (squared distances are small exact integers)
    keys = torch.randint(0, 4, (B, 12, d)).double()
    values = torch.randn(B, 12, 2, 3, dtype=torch.float64)
    dnd = DND(d)
    dnd.write(keys[:, :5], values[:, :5])
    for t in range(5, 12):  # mixed block and one-entry writes: the order is write order
        dnd.write(keys[:, t], values[:, t])
    assert len(dnd) == 12 and torch.equal(dnd.keys, keys)
    queries = torch.randint(0, 4, (K, B, d)).double()
    queries[0, 0] = keys[0, 3]  # a query on a key: distance exactly 0
    queries[1] += 0.5           # half-integer queries: ties at equal offsets
    out = dnd.read(queries, k=5)
    assert out.distances.shape == (K, B, 5) and out.values.shape == (K, B, 5, 2, 3)
    ties = 0
    for p, b in itertools.product(range(K), range(B)):
        ref_d, ref_i = brute_force(keys[b], values[b], queries[p, b], 5)
        assert out.indices[p, b].tolist() == ref_i
        assert torch.allclose(out.distances[p, b], torch.tensor(ref_d, dtype=torch.float64))
        assert torch.equal(out.values[p, b], values[b, ref_i])
        assert torch.equal(out.keys[p, b], keys[b, ref_i])
        assert torch.allclose(out.squared_distances[p, b], out.distances[p, b] ** 2)
        ties += len(set(ref_d)) < len(ref_d)
    assert ties > 3  # the tie rule was exercised
    assert float(out.distances[0, 0, 0]) == 0.0


def test_k_larger_than_the_memory_returns_every_entry_sorted():
    keys = torch.tensor([[[0.0], [3.0], [1.0]]])
    dnd = DND(1).write(keys, torch.arange(3.0).reshape(1, 3, 1))
    out = dnd.read(torch.tensor([[2.1]]), k=10)
    assert out.indices.tolist() == [[1, 2, 0]]
    assert torch.allclose(out.distances, torch.tensor([[0.9, 1.1, 2.1]]))
    assert out.values[..., 0].tolist() == [[1.0, 2.0, 0.0]]


def test_gradients_flow_to_queries_keys_and_values_and_are_finite_at_zero_distance():
    keys = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]], requires_grad=True)
    values = torch.tensor([[[1.0], [2.0], [3.0]]], requires_grad=True)
    q = torch.tensor([[[0.0, 0.0]], [[0.5, 0.0]]]).squeeze(1).unsqueeze(1)  # (2, 1, 2)
    q.requires_grad_(True)
    out = DND(2).write(keys, values).read(q, k=2)
    (out.distances.sum() + out.squared_distances.sum() + (out.values ** 2).sum()).backward()
    for g in (keys.grad, values.grad, q.grad):
        assert torch.isfinite(g).all()
    # d/dq of ||q - k||^2 summed over the two neighbours (0 and 1) of the query (0.5, 0)
    # plus d/dq ||q - k|| = sign: (0.5 - 0) + (0.5 - 1) = 0 for x; 2*(0.5) + 2*(-0.5) = 0
    assert torch.allclose(q.grad[1], torch.zeros(1, 2), atol=1e-6)
    # value 3 (index 2) is never read; values 1 and 2 are read twice (both queries): grad 2*2v
    assert torch.allclose(values.grad[0, :, 0], torch.tensor([4.0, 8.0, 0.0]))


def test_errors():
    dnd = DND(2)
    with pytest.raises(RuntimeError, match="empty"):
        dnd.read(torch.zeros(1, 2), k=1)
    with pytest.raises(ValueError, match="key_dim"):
        DND(0)
    with pytest.raises(ValueError, match="keys must be"):
        dnd.write(torch.zeros(1, 3), torch.zeros(1, 1))
    with pytest.raises(ValueError, match="do not match"):
        dnd.write(torch.zeros(2, 4, 2), torch.zeros(2, 3, 1))
    with pytest.raises(ValueError, match="finite"):
        dnd.write(torch.full((1, 2), float("nan")), torch.zeros(1, 1))
    dnd.write(torch.zeros(2, 2), torch.zeros(2, 1))
    with pytest.raises(ValueError, match="differ"):
        dnd.write(torch.zeros(3, 2), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="k must be"):
        dnd.read(torch.zeros(2, 2), k=0)
    with pytest.raises(ValueError, match="batch"):
        dnd.read(torch.zeros(3, 2), k=1)
    with pytest.raises(ValueError, match="finite"):
        dnd.read(torch.full((2, 2), float("inf")), k=1)
