import math

import numpy as np
import pytest
import torch

from pyro_seq.data import (
    SequenceLoader,
    chunk_sequences,
    pad_sequences,
    unpad_sequences,
    validate_sequences,
)


def _seqs(lengths, D=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(T, D, generator=g) for T in lengths]


def _tagged(n, seed=0, D=2):
    """Sequences whose feature 0 is their index + 1 at every step, with varied lengths."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n,), generator=g).tolist()
    return [
        torch.cat([torch.full((T, 1), i + 1.0), torch.rand(T, D - 1, generator=g)], 1)
        for i, T in enumerate(lengths)
    ]


def _ids(x, mask):
    return [int(x[b, 0, 0]) - 1 for b in range(x.shape[0])]


def test_pad_reference():
    a, b = torch.ones(2, 2), 2 * torch.ones(3, 2)
    x, mask = pad_sequences([a, b])
    assert x.shape == (2, 3, 2) and x.dtype == torch.float32 and mask.dtype == torch.bool
    assert torch.equal(x, torch.tensor([[[1.0, 1], [1, 1], [0, 0]], [[2, 2], [2, 2], [2, 2]]]))
    assert torch.equal(mask, torch.tensor([[True, True, False], [True, True, True]]))


def test_pad_unpad_round_trip():
    seqs = _seqs([5, 1, 9, 9, 3])
    x, mask = pad_sequences(seqs)
    assert x.shape == (5, 9, 3)
    assert mask.sum(1).tolist() == [5, 1, 9, 9, 3]
    assert torch.all(x[~mask] == 0)
    back = unpad_sequences(x, mask)
    assert len(back) == 5 and all(torch.equal(a, b) for a, b in zip(back, seqs))


@pytest.mark.parametrize(
    "seqs, message",
    [
        ([], "non-empty list"),
        ([torch.zeros(3)], r"2-D \(T, D\) tensor, got 1-D"),
        ([torch.zeros(3, 2), torch.zeros(0, 2)], r"seqs\[1\]: empty sequence"),
        ([torch.zeros(3, 2), torch.zeros(3, 4)], r"feature size 4 differs"),
        ([[0.0, 1.0]], "expected a torch.Tensor"),
    ],
)
def test_pad_errors(seqs, message):
    with pytest.raises(ValueError, match=message):
        pad_sequences(seqs)


def test_chunk_concat_round_trip():
    seqs = _seqs([10, 3, 7, 8])
    chunks = chunk_sequences(seqs, 4)
    assert [c.shape[0] for c in chunks] == [4, 4, 2, 3, 4, 3, 4, 4]
    # windows are in order, sequence by sequence: concatenating a sequence's windows restores it
    per_seq = [3, 1, 2, 2]
    start = 0
    for s, n in zip(seqs, per_seq):
        assert torch.equal(torch.cat(chunks[start : start + n]), s)
        start += n
    dropped = chunk_sequences(seqs, 4, drop_remainder=True)
    assert [c.shape[0] for c in dropped] == [4, 4, 4, 4, 4]
    assert torch.equal(dropped[2], seqs[2][:4]) and torch.equal(dropped[3], seqs[3][:4])
    whole = chunk_sequences(seqs, 100)
    assert len(whole) == 4 and all(torch.equal(a, b) for a, b in zip(whole, seqs))
    assert chunk_sequences(seqs, 100, drop_remainder=True) == []
    with pytest.raises(ValueError, match="positive int"):
        chunk_sequences(seqs, 0)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("sort_by_length", [False, True])
def test_loader_covers_every_sequence_once_per_epoch(drop_last, sort_by_length):
    seqs = _tagged(23)
    loader = SequenceLoader(
        seqs,
        batch_size=5,
        seed=3,
        drop_last=drop_last,
        sort_by_length=sort_by_length,
        bucket_batches=2,
    )
    assert len(loader) == (4 if drop_last else 5)
    for epoch in range(3):
        batches = list(loader.batches(epoch))
        assert len(batches) == len(loader)
        ids = [i for x, m in batches for i in _ids(x, m)]
        if drop_last:
            assert len(ids) == 20 and len(set(ids)) == 20
        else:
            assert sorted(ids) == list(range(23))
        for x, mask in batches:
            # each row is its sequence, padded
            for b, i in enumerate(_ids(x, mask)):
                T = seqs[i].shape[0]
                assert mask[b].sum() == T and torch.equal(x[b, :T], seqs[i])
                assert x.shape[1] == max(seqs[j].shape[0] for j in _ids(x, mask))


def test_loader_order_is_a_function_of_seed_and_epoch():
    seqs = _tagged(40)

    def order(loader, epoch):
        return [_ids(x, m) for x, m in loader.batches(epoch)]

    a, b = SequenceLoader(seqs, 7, seed=11), SequenceLoader(seqs, 7, seed=11)
    assert order(a, 4) == order(b, 4)
    assert order(a, 4) != order(a, 5)
    assert order(a, 4) != order(SequenceLoader(seqs, 7, seed=12), 4)

    # uninterrupted run: plain iteration advances the epoch
    uninterrupted = [[_ids(x, m) for x, m in a] for _ in range(6)]
    assert a.epoch == 6
    assert uninterrupted[0] != uninterrupted[1]
    assert uninterrupted == [order(b, e) for e in range(6)]
    # resumed run: a fresh loader told to start at epoch 4 sees the same batches
    resumed = SequenceLoader(seqs, 7, seed=11)
    resumed.set_epoch(4)
    assert [[_ids(x, m) for x, m in resumed] for _ in range(2)] == uninterrupted[4:]
    # batches(epoch) does not move the epoch counter
    assert resumed.epoch == 6 and b.epoch == 0


def test_loader_without_shuffle_keeps_input_order():
    seqs = _tagged(10)
    loader = SequenceLoader(seqs, 4, shuffle=False)
    assert [_ids(x, m) for x, m in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [_ids(x, m) for x, m in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_loader_bucketing_reduces_padding():
    seqs = _tagged(200)

    def padded_steps(loader):
        return sum(int((~m).sum()) for _, m in loader.batches(0))

    plain = SequenceLoader(seqs, 10, seed=0)
    bucketed = SequenceLoader(seqs, 10, seed=0, sort_by_length=True, bucket_batches=5)
    assert padded_steps(bucketed) < padded_steps(plain) / 2
    assert len(bucketed) == len(plain) == 20


def test_loader_chunking():
    seqs = _seqs([10, 3, 7])
    loader = SequenceLoader(seqs, batch_size=2, chunk_length=4, shuffle=False)
    assert len(loader.items) == 6 and len(loader) == 3
    assert loader.num_steps == 20
    x, mask = next(iter(loader))
    assert (
        x.shape == (2, 4, 3) and torch.equal(x[0], seqs[0][:4]) and torch.equal(x[1], seqs[0][4:8])
    )
    steps = sum(int(m.sum()) for _, m in loader.batches(1))
    assert steps == 20


def test_loader_len_matches_iteration():
    for n, bs in [(1, 1), (7, 3), (9, 3), (2, 5)]:
        for drop_last in (False, True):
            loader = SequenceLoader(_tagged(n), bs, drop_last=drop_last)
            assert len(loader) == len(list(loader.batches(0)))
            assert len(loader) == (n // bs if drop_last else math.ceil(n / bs))
    with pytest.raises(ValueError, match="batch_size"):
        SequenceLoader(_tagged(3), 0)


def test_validate_accepts_good_input_and_fills_mask():
    x, mask = pad_sequences([torch.ones(3, 4), torch.zeros(1, 4)])
    out_x, out_mask = validate_sequences(x, mask, binary=True, prefix_mask=True)
    assert out_x is x and out_mask is mask
    _, full = validate_sequences(x)
    assert full.shape == (2, 3) and bool(full.all())


def _batch():
    return pad_sequences([torch.ones(3, 4), torch.zeros(2, 4)])


@pytest.mark.parametrize(
    "make, kwargs, message",
    [
        (lambda: (torch.zeros(3, 4), None), {}, r"3 dimensions \(batch, T, D\), got 2"),
        (lambda: (torch.zeros(2, 3, 4, 1), None), {}, r"3 dimensions .* got 4"),
        (lambda: (torch.zeros(2, 3, 4, dtype=torch.long), None), {}, "floating-point"),
        (lambda: (torch.zeros(2, 0, 4), None), {}, "empty dimension"),
        (
            lambda: (_batch()[0], torch.ones(2, 4, dtype=torch.bool)),
            {},
            r"mask shape \(2, 4\) does not match x's \(batch, T\) = \(2, 3\)",
        ),
        (
            lambda: (_batch()[0], torch.tensor([[1.0, 1.0, 0.5], [1.0, 1.0, 0.0]])),
            {},
            r"mask must be bool or contain only 0 and 1 \(dtype torch.float32\), found 0.5 at "
            r"\(batch 0, step 2\)",
        ),
        (
            lambda: (_batch()[0], torch.tensor([[2, 1, 1], [1, 1, 0]])),
            {},
            r"contain only 0 and 1 \(dtype torch.int64\), found 2 at \(batch 0, step 0\)",
        ),
        (lambda: (torch.zeros(0, 3, 4), None), {}, r"empty dimension \(batch = 0\)"),
        (lambda: (torch.zeros(2, 3, 0), None), {}, r"empty dimension \(D = 0\)"),
        (
            lambda: (
                _batch()[0].index_put(
                    (torch.tensor(1), torch.tensor(2), torch.tensor(0)), torch.tensor(float("nan"))
                ),
                _batch()[1],
            ),
            {},
            r"NaN at \(batch 1, step 2, feature 0\), a padded step",
        ),
        (
            lambda: (
                _batch()[0].index_put(
                    (torch.tensor(0), torch.tensor(1), torch.tensor(3)), torch.tensor(float("inf"))
                ),
                _batch()[1],
            ),
            {},
            r"infinite value at \(batch 0, step 1, feature 3\), a real step",
        ),
        (
            lambda: (_batch()[0], torch.tensor([[True, True, True], [False, False, False]])),
            {},
            "empty sequence: mask row 1",
        ),
        (
            lambda: (_batch()[0], torch.tensor([[True, False, True], [True, True, False]])),
            {"prefix_mask": True},
            "mask row 0 is not a prefix",
        ),
        (
            lambda: (_batch()[0] * 0.5, _batch()[1]),
            {"binary": True},
            r"binary \(0/1\) for a Bernoulli model, found 0.5 at \(batch 0, step 0, feature 0\)",
        ),
    ],
)
def test_validate_errors_name_the_problem(make, kwargs, message):
    x, mask = make()
    with pytest.raises(ValueError, match=message):
        validate_sequences(x, mask, **kwargs)


def test_validate_accepts_exact_zero_one_masks_of_any_dtype():
    x, mask = _batch()
    for dtype in (torch.float32, torch.float64, torch.int64, torch.uint8):
        _, out = validate_sequences(x, mask.to(dtype))
        assert out.dtype == torch.bool and torch.equal(out, mask)


def test_validate_refuses_non_prefix_by_default_and_wrong_feature_size():
    x, _ = _batch()
    with pytest.raises(ValueError, match="mask row 0 is not a prefix"):
        validate_sequences(x, torch.tensor([[True, False, True], [True, True, False]]))
    with pytest.raises(ValueError, match="x has 4 features per step, the model expects 5"):
        validate_sequences(x, obs_dim=5)


def test_validate_binary_ignores_padding_but_not_real_steps():
    x, mask = _batch()
    x[1, 2] = 0.3  # padded step: irrelevant for the Bernoulli check
    validate_sequences(x, mask, binary=True)
    x[1, 1] = 0.3  # real step
    with pytest.raises(ValueError, match=r"found 0.3.* at \(batch 1, step 1"):
        validate_sequences(x, mask, binary=True)
    validate_sequences(x, mask, binary=False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(bucket_batches=2.5, sort_by_length=True),
            r"bucket_batches must be a positive int, got 2\.5",
        ),
        (dict(bucket_batches="4"), r"bucket_batches must be a positive int, got '4'"),
        (dict(seed=-1), r"seed must be a non-negative int, got -1"),
        (dict(seed="abc"), r"seed must be a non-negative int, got 'abc'"),
        (dict(seed=None), r"seed must be a non-negative int, got None"),
    ],
)
def test_bad_pool_size_and_seed_are_refused_at_construction(kwargs, message):
    # regression (found by tests/property): bucket_batches=2.5 and seed=-1 were accepted and
    # failed at the first iteration with numpy's "'float' object cannot be interpreted as an
    # integer" / "expected non-negative integer"; seed="abc" gave int()'s message
    with pytest.raises(ValueError, match=message):
        SequenceLoader(_tagged(3), 2, **kwargs)
    SequenceLoader(_tagged(3), 2, seed=np.int64(3), bucket_batches=1)  # numpy ints are fine


def test_a_negative_epoch_is_refused_naming_it():
    # regression: batches(-1) and batch_indices(-1) gave numpy's "expected non-negative integer"
    loader = SequenceLoader(_tagged(3), 2)
    for call in (loader.set_epoch, loader.batch_indices, lambda e: list(loader.batches(e))):
        with pytest.raises(ValueError, match=r"^epoch must be >= 0, got -1$"):
            call(-1)
