"""SequenceState resampling: per-particle tensors gathered, shared ones untouched."""

import pytest
import torch

from pyro_seq.ops import SequenceState, gather_particles


def test_gather_matches_explicit_indexing():
    K, B = 4, 3
    value = torch.randn(K, B, 2, 5)
    anc = torch.randint(0, K, (K, B))
    out = gather_particles(value, anc)
    for k in range(K):
        for b in range(B):
            assert torch.equal(out[k, b], value[anc[k, b], b])


def test_size_one_particle_axis_broadcasts():
    value = torch.randn(1, 3, 2)
    anc = torch.tensor([[0, 0, 0], [0, 0, 0]])
    out = gather_particles(value, anc)
    assert out.shape == (2, 3, 2) and torch.equal(out[1], value[0])


def test_state_resample_leaves_shared_alone():
    state = SequenceState(z=torch.arange(6.0).reshape(3, 2, 1))
    state.shared["d"] = torch.randn(2, 7, 4)
    d = state.shared["d"]
    state.resample(torch.tensor([[2, 0], [2, 1], [0, 0]]))
    assert state["z"][:, 0, 0].tolist() == [4.0, 4.0, 0.0]
    assert state["z"][:, 1, 0].tolist() == [1.0, 3.0, 1.0]
    assert state.shared["d"] is d


def test_non_tensor_state_is_refused():
    state = SequenceState(h=[1, 2])
    with pytest.raises(TypeError, match="expected a tensor"):
        state.resample(torch.zeros(1, 1, dtype=torch.long))
