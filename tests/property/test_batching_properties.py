"""Properties of :func:`pad_sequences` and :class:`SequenceLoader` on random ragged lists.

* padding: ``x[i, :T_i]`` is sequence ``i``, zeros after; the mask is the prefix mask of the
  lengths;
* every epoch visits every sequence (window, with ``chunk_length``) exactly once, except the
  short last batch with ``drop_last``; the epoch is a pure function of ``(seed, epoch)``;
* invalid arguments are a ValueError/TypeError naming the argument, at construction, never a
  numpy or torch error at iteration time.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pyro_seq.data import SequenceLoader, chunk_sequences, pad_sequences

from .support import expect_documented

pytestmark = pytest.mark.fuzz

INPUT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.int64, torch.bool]
OUT_DTYPES = [torch.float32, torch.float64, torch.bfloat16]


@st.composite
def ragged(draw, min_size=1):
    """Sequences ``(T_i, D)`` whose every entry is ``i + 1`` (so items can be identified), with
    random lengths and one input dtype."""
    lengths = draw(st.lists(st.integers(1, 7), min_size=min_size, max_size=12))
    D = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(INPUT_DTYPES))
    seqs = [torch.full((T, D), float(i + 1)) for i, T in enumerate(lengths)]
    if dtype == torch.bool:  # identity is lost for bools: only the shapes matter then
        return [s.bool() for s in seqs]
    return [s.to(dtype) for s in seqs]


BAD_LISTS = st.sampled_from(
    [
        ([], r"seqs: expected a non-empty list"),
        (torch.zeros(2, 3), r"seqs: expected a non-empty list"),
        ([torch.zeros(3)], r"seqs\[0\]: expected a 2-D \(T, D\) tensor, got 1-D"),
        ([torch.zeros(2, 2), torch.zeros(1, 2, 2)], r"seqs\[1\]: expected a 2-D"),
        ([torch.zeros(2, 2), torch.zeros(0, 2)], r"seqs\[1\]: empty sequence"),
        ([torch.zeros(2, 2), torch.zeros(2, 3)], r"seqs\[1\]: feature size 3 differs"),
        ([[0.0, 1.0]], r"seqs\[0\]: expected a torch\.Tensor, got list"),
        ([torch.zeros(1, 1), None], r"seqs\[1\]: expected a torch\.Tensor, got NoneType"),
    ]
)


def check_padded(x, mask, seqs, dtype):
    lengths = [s.shape[0] for s in seqs]
    B, T = len(seqs), max(lengths)
    assert x.shape == (B, T, seqs[0].shape[1]) and x.dtype == dtype
    assert mask.dtype == torch.bool and mask.shape == (B, T)
    assert torch.equal(mask, torch.arange(T) < torch.tensor(lengths).unsqueeze(1))
    assert bool((x[~mask] == 0).all()), "padding must be zeros"
    for i, s in enumerate(seqs):
        assert torch.equal(x[i, : lengths[i]], s.to(dtype))


@given(ragged(), st.sampled_from(OUT_DTYPES))
def test_pad_sequences(seqs, dtype):
    x, mask = pad_sequences(seqs, dtype=dtype)
    check_padded(x, mask, seqs, dtype)


@given(BAD_LISTS)
def test_pad_sequences_names_the_bad_item(bad):
    seqs, message = bad
    with pytest.raises((ValueError, TypeError)) as info:
        pad_sequences(seqs)
    expect_documented(info.value, message)


@st.composite
def loader_args(draw):
    return dict(
        batch_size=draw(st.integers(1, 6)),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32)),
        chunk_length=draw(st.sampled_from([None, None, 1, 2, 3])),
        drop_last=draw(st.booleans()),
        sort_by_length=draw(st.booleans()),
        bucket_batches=draw(st.integers(1, 4)),
        dtype=draw(st.sampled_from([torch.float32, torch.float64])),
    )


@given(ragged(), loader_args(), st.integers(0, 3))
def test_every_item_once_per_epoch_with_prefix_masks_and_zero_padding(seqs, kwargs, epoch):
    loader = SequenceLoader(seqs, **kwargs)
    items = chunk_sequences(seqs, kwargs["chunk_length"]) if kwargs["chunk_length"] else seqs
    assert len(loader.items) == len(items)
    bs, n = kwargs["batch_size"], len(items)
    batches = list(loader.batches(epoch))
    assert len(batches) == len(loader)
    visited = []
    for idx, (x, mask) in zip(loader.batch_indices(epoch), batches):
        assert 1 <= len(idx) <= bs
        check_padded(x, mask, [items[i] for i in idx], kwargs["dtype"])
        visited += [int(i) for i in idx]
    if kwargs["drop_last"]:
        assert len(visited) == n - n % bs and len(set(visited)) == len(visited)
        assert all(len(i) == bs for i in loader.batch_indices(epoch))
    else:
        assert sorted(visited) == list(range(n)), "every item exactly once per epoch"
    if not kwargs["shuffle"] and not kwargs["sort_by_length"]:
        assert visited == list(range(len(visited)))
    if seqs[0].dtype != torch.bool and not kwargs["chunk_length"]:
        # the yielded rows are the sequences themselves (identified by their values)
        rows = [int(x[b, 0, 0]) - 1 for x, _ in batches for b in range(x.shape[0])]
        assert rows == visited
    # a pure function of (seed, epoch): the same again, and what iter() yields after set_epoch
    again = SequenceLoader(seqs, **kwargs)
    again.set_epoch(epoch)
    for (x1, m1), (x2, m2) in zip(batches, iter(again)):
        assert torch.equal(x1, x2) and torch.equal(m1, m2)
    assert again.epoch == epoch + 1
    assert loader.num_steps == sum(s.shape[0] for s in items)


@given(
    ragged(),
    loader_args(),
    st.sampled_from(
        [
            ("batch_size", 0),
            ("batch_size", -1),
            ("batch_size", 2.0),
            ("batch_size", True),
            ("batch_size", None),
            ("batch_size", "2"),
            ("chunk_length", 0),
            ("chunk_length", 1.5),
            ("chunk_length", True),
            ("chunk_length", "3"),
            ("bucket_batches", 0),
            ("bucket_batches", 2.5),
            ("bucket_batches", 2.0),
            ("bucket_batches", "4"),
            ("bucket_batches", None),
            ("seed", -1),
            ("seed", "abc"),
            ("seed", None),
            ("seed", 1.5),
        ]
    ),
)
def test_invalid_arguments_are_refused_at_construction_naming_them(seqs, kwargs, bad):
    name, value = bad
    kwargs = dict(kwargs, **{name: value})
    if name == "bucket_batches":
        kwargs["sort_by_length"] = True  # where the pool size is used
    try:
        loader = SequenceLoader(seqs, **kwargs)
    except Exception as e:  # noqa: BLE001
        expect_documented(e, name.replace("_", "[ _]"))
        return
    raise AssertionError(f"{name}={value!r} accepted; iterating gives {_first_error(loader)}")


def _first_error(loader):
    try:
        list(loader)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


@given(ragged(), st.integers(-3, -1))
def test_a_negative_epoch_is_refused_naming_it(seqs, epoch):
    loader = SequenceLoader(seqs, 2)
    for call in (loader.set_epoch, lambda e: list(loader.batches(e)), loader.batch_indices):
        with pytest.raises((ValueError, TypeError)) as info:
            call(epoch)
        expect_documented(info.value, r"epoch must be >= 0")


@given(ragged(), st.integers(1, 4))
def test_windows_concatenate_back_to_the_sequences(seqs, length):
    windows = chunk_sequences(seqs, length)
    assert all(1 <= w.shape[0] <= length for w in windows)
    assert torch.equal(torch.cat(windows), torch.cat(seqs))
    assert len(windows) == sum(math.ceil(s.shape[0] / length) for s in seqs)
    dropped = chunk_sequences(seqs, length, drop_remainder=True)
    assert all(w.shape[0] == length for w in dropped)
    assert len(dropped) == sum(s.shape[0] // length for s in seqs)
