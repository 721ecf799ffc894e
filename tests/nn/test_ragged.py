"""The step-major packing of ragged batches (:mod:`pyro_seq.nn.ragged`) against torch's
``pack_padded_sequence`` and direct indexing."""

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from pyro_seq.nn import pack_ragged, previous_rows, sequence_lengths, step_offsets


@pytest.mark.parametrize("lengths", [[3, 5, 1, 5], [4], [2, 2, 2], [1, 6, 3, 2, 6]])
def test_pack_ragged_is_torchs_packing(lengths):
    """Same step-major order of the real rows and the same batch sizes per step as
    pack_padded_sequence (which also sorts by decreasing length, stably)."""
    lengths_t = torch.tensor(lengths)
    B, T = len(lengths), max(lengths) + 1  # one all-padding column
    x = torch.arange(B * T, dtype=torch.float64).view(B, T, 1)
    order, counts, index = pack_ragged(lengths_t, T)
    packed = pack_padded_sequence(x, lengths_t, batch_first=True, enforce_sorted=False)
    assert counts == packed.batch_sizes.tolist()
    assert torch.equal(x.view(-1)[index], packed.data.view(-1))
    assert torch.equal(order, packed.sorted_indices)
    assert step_offsets(counts) == [0] + torch.cumsum(packed.batch_sizes, 0).tolist()


def test_previous_rows_is_the_same_sequence_one_step_back():
    lengths = torch.tensor([3, 5, 1, 5])
    B, T = 4, 5
    x = torch.randn(B, T, 2)
    first = torch.randn(B, 2)
    order, counts, index = pack_ragged(lengths, T)
    prev = previous_rows(first[order], x.reshape(B * T, 2)[index], counts)
    for row, flat in enumerate(index.tolist()):
        b, t = divmod(flat, T)
        want = first[b] if t == 0 else x[b, t - 1]
        assert torch.equal(prev[row], want)


def test_sequence_lengths_count_up_to_the_last_observed_step():
    """Holes inside a sequence (missing observations) still carry the recursion; trailing
    padding does not; a row without any observed step still runs one step."""
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 0, 1, 0, 1], [0, 0, 0, 0, 0], [0, 1, 0, 0, 0]], dtype=torch.bool
    )
    assert sequence_lengths(mask).tolist() == [3, 5, 1, 2]
    assert sequence_lengths(mask.expand(2, 4, 5)).shape == (2, 4)
