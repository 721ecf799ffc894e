"""pyro_seq.nn.DND: exact k-NN reads against a brute-force reference (ties included), k larger
than the memory, batching over sequences and particles, gradients and errors; nearest_earlier
against a DND written and read step by step."""

import itertools
import math

import pytest
import torch

from pyro_seq.nn import DND, nearest_earlier


def brute_force(keys, values, query, k):
    """Reference for one sequence and one query, in float64 Python: sort the entries by
    (squared distance, write index) and keep the first min(k, n)."""
    rows = []
    for i in range(keys.shape[0]):
        d2 = sum((float(q) - float(c)) ** 2 for q, c in zip(query, keys[i]))
        rows.append((d2, i))
    rows.sort()
    rows = rows[: min(k, len(rows))]
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
    queries[1] += 0.5  # half-integer queries: ties at equal offsets
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
    (out.distances.sum() + out.squared_distances.sum() + (out.values**2).sum()).backward()
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


@pytest.mark.parametrize("k", [1, 3, 20])
def test_nearest_earlier_is_a_dnd_written_and_read_step_by_step(k):
    """Entry i's slots are what DND(keys[:, :i]).read(keys[:, i], k) returns (ties by write
    order included), padded to k slots with valid=False; entry 0 has no neighbour."""
    torch.manual_seed(1)
    B, n, d = 3, 12, 2
    keys = torch.randint(0, 3, (B, n, d)).double()  # a 3x3 grid: many exact ties and repeats
    out = nearest_earlier(keys, k)
    assert out.distances.shape == out.indices.shape == out.valid.shape == (B, n, k)
    assert not out.valid[:, 0].any()
    ties = 0
    for i in range(1, n):
        read = DND(d).write(keys[:, :i], torch.zeros(B, i, 1)).read(keys[:, i], k)
        kk = min(k, i)
        assert out.valid[:, i].sum(-1).tolist() == [kk] * B
        assert out.valid[:, i, :kk].all()
        assert torch.equal(out.indices[:, i, :kk], read.indices)
        assert torch.allclose(out.distances[:, i, :kk], read.distances, rtol=0, atol=1e-12)
        assert torch.allclose(
            out.squared_distances[:, i, :kk], read.squared_distances, rtol=0, atol=1e-12
        )
        ties += sum(len(set(r)) < len(r) for r in read.squared_distances.tolist())
    padding = ~out.valid
    assert (out.distances[padding] == 0).all() and (out.indices[padding] == 0).all()
    assert k == 1 or ties > 3  # the tie rule was exercised (a tie needs two slots to show)


def test_nearest_earlier_gradients_are_finite_at_zero_distance_and_skip_padding():
    keys = torch.tensor([[[0.0, 0.0], [0.0, 0.0], [3.0, 4.0]]], requires_grad=True)
    out = nearest_earlier(keys, 2)
    assert out.distances[0].tolist() == [[0.0, 0.0], [0.0, 0.0], [5.0, 5.0]]
    assert out.valid[0].tolist() == [[False, False], [True, False], [True, True]]
    out.distances.sum().backward()
    assert torch.isfinite(keys.grad).all()
    # only entry 2's two reads (to the two keys at the origin) have a gradient: d|k2 - k|/dk2
    # = (k2 - k) / 5 twice; each origin key gets -(3, 4)/5
    assert torch.allclose(keys.grad[0], torch.tensor([[-0.6, -0.8], [-0.6, -0.8], [1.2, 1.6]]))
    with pytest.raises(ValueError, match="k must be"):
        nearest_earlier(keys, 0)
    with pytest.raises(ValueError, match="batch, n, d"):
        nearest_earlier(torch.zeros(3, 2), 1)
