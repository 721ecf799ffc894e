"""Properties of the file readers: random bytes and mutated valid files.

* :func:`pyro_seq.data.safe_pickle.safe_loads`: a value built only of admitted types, or
  :class:`UnsafePickleError` (a ``pickle.UnpicklingError``) -- nothing else, and quickly.
* :func:`pyro_seq.data.load_piano_rolls`: 0/1 rolls ``(T, 88)`` that match the notes of the
  file, or the documented errors: UnsafePickleError, ValueError naming the split, sequence and
  step, KeyError naming a missing split.
* :func:`pyro_seq.train.checkpoint.load_checkpoint`: a dict with every checkpoint key, or
  :class:`CheckpointError` naming the file and the remedy.
"""

import math
import os
import pickle
import tempfile
import time

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pyro_seq.data import UnsafePickleError, load_piano_rolls
from pyro_seq.data.piano_roll import HIGHEST_NOTE, LOWEST_NOTE, NUM_KEYS
from pyro_seq.data.safe_pickle import safe_loads
from pyro_seq.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

from .support import examples, expect_documented

# pickle's STRING opcode warns about the invalid escapes of random bytes
pytestmark = [pytest.mark.fuzz, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SECONDS = 10.0  # "never a hang": each call on a file of a few kB must return long before this

_NUMERIC_KINDS = set("biufc")


def assert_admitted(obj):
    """The restricted unpickler's contract: builtin data and numeric numpy values only
    (walked iteratively: a mutated pickle may hold cycles or deep nesting)."""
    stack, seen = [obj], set()
    while stack:
        o = stack.pop()
        if o is None or type(o) in (int, float, complex, bool, str, bytes, bytearray):
            continue
        if isinstance(o, (np.ndarray, np.generic)):
            assert type(o) is np.ndarray or isinstance(o, np.generic), type(o)
            assert o.dtype.kind in _NUMERIC_KINDS and not o.dtype.hasobject, o.dtype
            continue
        assert type(o) in (list, tuple, dict, set, frozenset), f"refused type {type(o)} loaded"
        if id(o) in seen:
            continue
        seen.add(id(o))
        stack.extend(list(o.keys()) + list(o.values()) if type(o) is dict else list(o))


def timed(fn, *args):
    start = time.perf_counter()
    try:
        return fn(*args)
    finally:
        elapsed = time.perf_counter() - start
        assert elapsed < SECONDS, f"{fn.__name__} took {elapsed:.1f} s"


# --- strategies ------------------------------------------------------------------------------

GOOD_NOTE = st.integers(LOWEST_NOTE, HIGHEST_NOTE)
NOTE = st.one_of(
    GOOD_NOTE,
    GOOD_NOTE,
    GOOD_NOTE,
    GOOD_NOTE,
    GOOD_NOTE.map(np.int64),
    GOOD_NOTE.map(float),
    GOOD_NOTE.map(np.float32),
    st.sampled_from(
        [
            0,
            20,
            109,
            -60,
            10**30,
            60.5,
            float("nan"),
            float("inf"),
            True,
            np.bool_(False),
            "60",
            b"60",
            None,
            60 + 0j,
            [60],
        ]
    ),
)
STEP = st.one_of(
    st.lists(NOTE, max_size=4).map(tuple),
    st.lists(NOTE, max_size=4).map(tuple),
    st.lists(NOTE, max_size=3),
    st.frozensets(GOOD_NOTE, max_size=3),
    st.sampled_from([60, "C4", None, {60: 1}, np.array([60])]),
)
SEQUENCE = st.one_of(
    st.lists(STEP, min_size=1, max_size=5),
    st.lists(STEP, max_size=5),
    st.sampled_from([(), "abc", None, 60]),
)
SPLIT = st.one_of(
    st.lists(SEQUENCE, min_size=1, max_size=3),
    st.lists(SEQUENCE, max_size=3),
    st.sampled_from([None, "train", {"a": [[(60,)]]}]),
)
PIANO_ROLL_OBJECT = st.one_of(
    st.fixed_dictionaries({"train": SPLIT, "valid": SPLIT, "test": SPLIT}),
    st.dictionaries(st.sampled_from(["train", "valid", "test", "extra", 1]), SPLIT, max_size=4),
    st.sampled_from([None, [], [[(60,)]], "train", np.arange(3)]),
)
PROTOCOL = st.integers(0, pickle.HIGHEST_PROTOCOL)

# opcodes worth splicing into a valid pickle: refused globals, huge counted lengths, memo
# tricks, extension codes, builds of odd states
GADGETS = [
    b"cos\nsystem\n",
    b"cbuiltins\neval\n",
    b"c__builtin__\ngetattr\n",
    b"cnumpy\ndtype\n",
    b"cnumpy.core.multiarray\n_reconstruct\n",
    b"cnumpy\nndarray\n",
    b"c_codecs\nencode\n",
    b"\x8e\xff\xff\xff\xff\xff\xff\x00\x00",
    b"\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f",
    b"\x8b\xff\xff\xff\x7f",
    b"r\xff\xff\xff\x7f",
    b"h\x00",
    b"j\x00\x00\x00\x00",
    b"g0\n",
    b"\x82\x01",
    b"\x83\x01\x00",
    b"\x84\x01\x00\x00\x00",
    b"R",
    b"b",
    b"t",
    b"0",
    b"2",
    b"a",
    b"e",
    b"s",
    b"u",
    b"(",
    b")",
    b"]",
    b"}",
    b"N",
    b"\x88",
    b"\x85",
    b"\x86",
    b"\x87",
    b"\x93",
    b"\x94",
    b"\x95\x00\x00\x00\x00\x00\x00\x00\x00",
    b"\x80\x05",
    b"\x80\xff",
    b"Lnan\n",
    b"I99999999999999999999999\n",
    b"F1e999\n",
    b"S'\\x00'\n",
    b"V\\u0600\n",
    b"X\x02\x00\x00\x00\xd8\x00",
]


@st.composite
def mutated(draw, base: bytes):
    """``base`` with a few random edits: byte changes, deletions, insertions of random bytes or
    of opcodes, a duplicated slice, a truncation."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(
            st.sampled_from(
                ["set", "set", "delete", "insert", "gadget", "gadget", "duplicate", "truncate"]
            )
        )
        if op == "set":
            data[i] = draw(st.integers(0, 255))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "gadget":
            data[i:i] = draw(st.sampled_from(GADGETS))
        elif op == "duplicate":
            j = draw(st.integers(i, min(len(data), i + 32)))
            data[j:j] = data[i:j]
        else:
            del data[i:]
    return bytes(data)


def _valid_pickle_objects():
    arrays = st.sampled_from(
        [
            np.arange(6, dtype=np.float32).reshape(2, 3),
            np.array(2.5),
            np.array([True, False]),
            np.arange(4, dtype=">i4")[::2],
            np.zeros((0, 3)),
            np.float64(0.5),
            np.int64(60),
            np.uint8(7),
        ]
    )
    leaves = st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=5),
        st.binary(max_size=5),
        st.booleans(),
        st.none(),
        arrays,
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(st.text(max_size=3), inner, max_size=3),
            st.frozensets(st.integers(0, 99), max_size=3),
        ),
        max_leaves=12,
    )


@st.composite
def pickle_bytes(draw):
    kind = draw(st.sampled_from(["random", "mutated", "mutated", "mutated", "valid"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    obj = draw(st.one_of(PIANO_ROLL_OBJECT, _valid_pickle_objects()))
    data = pickle.dumps(obj, protocol=draw(PROTOCOL))
    return data if kind == "valid" else draw(mutated(data))


# --- safe_loads ------------------------------------------------------------------------------

PICKLE_MESSAGES = (
    r"refus",
    r"malformed pickle",
    r"numpy",
    r"\(\) of ",
    r"loaded object",
    r"_codecs\.encode: only encode\(str, .latin1.\) is admitted",
)


@given(pickle_bytes())
def test_safe_loads_returns_data_or_refuses(data):
    try:
        out = timed(safe_loads, data)
    except Exception as e:  # noqa: BLE001 - the property is about which exceptions escape
        expect_documented(e, *PICKLE_MESSAGES, types=(UnsafePickleError,))
        return
    assert_admitted(out)


@given(_valid_pickle_objects(), PROTOCOL)
def test_safe_loads_reads_valid_pickles_like_pickle_loads(obj, protocol):
    data = pickle.dumps(obj, protocol=protocol)
    out = safe_loads(data)
    ref = pickle.loads(data, encoding="latin1")
    assert same(out, ref), (out, ref)


def same(a, b) -> bool:
    """Equal values of equal types (arrays: dtype, shape and bytes; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


# --- load_piano_rolls ------------------------------------------------------------------------


def expected_rolls(obj, splits=("train", "valid", "test")):
    """The rolls the loader must return for ``obj``, or None when the file is invalid."""
    if not isinstance(obj, dict) or any(s not in obj for s in splits):
        return None
    out = {}
    for s in splits:
        seqs = obj[s]
        if not isinstance(seqs, (list, tuple)) or not seqs:
            return None
        rolls = []
        for seq in seqs:
            if not isinstance(seq, (list, tuple)) or not seq:
                return None
            roll = torch.zeros(len(seq), NUM_KEYS)
            for t, step in enumerate(seq):
                if not isinstance(step, (list, tuple, set, frozenset)):
                    return None
                for n in step:
                    if isinstance(n, (bool, np.bool_)) or not isinstance(
                        n, (int, float, np.integer, np.floating)
                    ):
                        return None
                    if not (
                        math.isfinite(float(n))
                        and float(n) == int(n)
                        and LOWEST_NOTE <= int(n) <= HIGHEST_NOTE
                    ):
                        return None
                    roll[t, int(n) - LOWEST_NOTE] = 1
            rolls.append(roll)
        out[s] = rolls
    return out


PIANO_MESSAGES = (
    r"split '\w+'",
    r"missing split",
    r"expected a dict with splits",
) + PICKLE_MESSAGES


def _write(folder, data: bytes, name: str = "data.pickle") -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


@given(PIANO_ROLL_OBJECT, PROTOCOL)
def test_load_piano_rolls_of_random_objects(obj, protocol):
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, pickle.dumps(obj, protocol=protocol))
        expected = expected_rolls(obj)
        try:
            out = timed(load_piano_rolls, path)
        except Exception as e:  # noqa: BLE001
            expect_documented(e, *PIANO_MESSAGES, types=(ValueError, KeyError, UnsafePickleError))
            assert expected is None, f"valid file refused: {e}"
            return
    assert expected is not None, "invalid file accepted"
    assert out.keys() == expected.keys()
    for s in out:
        assert len(out[s]) == len(expected[s])
        for r, e in zip(out[s], expected[s]):
            assert r.dtype == torch.float32 and r.shape == e.shape and torch.equal(r, e)


@given(pickle_bytes())
def test_load_piano_rolls_of_random_and_mutated_bytes(data):
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, data)
        try:
            out = timed(load_piano_rolls, path)
        except Exception as e:  # noqa: BLE001
            expect_documented(e, *PIANO_MESSAGES, types=(ValueError, KeyError, UnsafePickleError))
            return
    assert set(out) == {"train", "valid", "test"}
    for rolls in out.values():
        assert rolls
        for r in rolls:
            assert r.dtype == torch.float32 and r.dim() == 2 and r.shape[0] >= 1
            assert r.shape[1] == NUM_KEYS and bool(((r == 0) | (r == 1)).all())


# --- load_checkpoint -------------------------------------------------------------------------


class _Optimizer:
    def get_state(self):
        return {"fc.weight": {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2, 3)}}


def _checkpoint_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "checkpoint.pt")
        torch.manual_seed(0)
        save_checkpoint(
            path,
            model=torch.nn.Linear(3, 2),
            optimizer=_Optimizer(),
            epoch=2,
            global_step=10,
            history=[{"epoch": 1, "loss": 1.5}, {"epoch": 2, "loss": 1.2}],
            extra={"best": -3.0},
        )
        with open(path, "rb") as f:
            return f.read()


CHECKPOINT = _checkpoint_bytes()
KEYS = ("model", "optimizer", "epoch", "global_step", "history", "torch_rng", "extra")


@examples(0.5)
@given(
    st.one_of(
        mutated(CHECKPOINT), mutated(CHECKPOINT), st.binary(max_size=200), st.just(CHECKPOINT)
    )
)
def test_load_checkpoint_of_mutated_files(data):
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, data, "checkpoint.pt")
        try:
            out = timed(load_checkpoint, path)
        except Exception as e:  # noqa: BLE001
            # the file's defect (unreadable, not a checkpoint, or a named bad entry: see
            # tests/property/test_resume_properties.py), then the remedy
            expect_documented(
                e,
                r"^checkpoint .*checkpoint\.pt (is truncated or corrupt and "
                r"cannot be loaded|is not a pyro-seq training checkpoint|has |"
                r"holds ).*; delete it to train in this folder from scratch",
                types=(CheckpointError,),
            )
            return
    assert isinstance(out, dict) and all(k in out for k in KEYS)
    if data == CHECKPOINT:
        assert out["epoch"] == 2 and out["global_step"] == 10
        assert out["model"]["weight"].shape == (2, 3)
