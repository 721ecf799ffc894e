import io
import os
import pickle
import pickletools

import numpy as np
import pytest

from pyro_seq.data import UnsafePickleError, safe_load, safe_loads


class _SystemCall:
    """Unpickling this with the stock unpickler runs a shell command."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _EvalCall:
    def __reduce__(self):
        return (eval, ("__import__('os').getcwd()",))


def _globals(data: bytes):
    """(module, name) pairs a pickle references, from its GLOBAL / STACK_GLOBAL opcodes."""
    out, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            out.add(tuple(arg.split(" ", 1)))
        elif op.name == "STACK_GLOBAL":
            out.add(tuple(strings[-2:]))
        elif "UNICODE" in op.name or "STRING" in op.name:
            strings.append(arg)
    return out


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_refuses_os_system_and_runs_nothing(tmp_path, protocol):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_SystemCall(f"touch {marker}"), protocol=protocol)
    # the payload is real: the stock unpickler does run the command
    pickle.loads(payload)
    assert marker.exists()
    marker.unlink()

    with pytest.raises(UnsafePickleError, match=r"refusing to load global '(posix|nt|os)\.system'"):
        safe_loads(payload)
    assert not marker.exists()
    # subclass of pickle.UnpicklingError, so generic handlers catch it too
    with pytest.raises(pickle.UnpicklingError):
        safe_loads(payload)


def test_refuses_eval_nested_inside_data(tmp_path):
    payload = pickle.dumps({"train": [[(60,)], _EvalCall()]}, protocol=2)
    with pytest.raises(UnsafePickleError, match=r"(builtins|__builtin__)\.eval"):
        safe_loads(payload)


def test_refuses_classes_and_reduce_gadgets():
    # builtins.getattr is the usual step to reach arbitrary attributes
    payload = b"cbuiltins\ngetattr\n(cbuiltins\ndict\nS'keys'\ntR."
    with pytest.raises(UnsafePickleError, match=r"builtins\.getattr"):
        safe_loads(payload)
    with pytest.raises(UnsafePickleError, match=r"collections\.OrderedDict"):
        import collections

        safe_loads(pickle.dumps(collections.OrderedDict(a=1)))


@pytest.mark.parametrize(
    "value",
    [np.array([None, 1], dtype=object), np.array(["a"]), np.zeros(2, dtype=[("a", "f8")])],
    ids=["object", "unicode", "structured"],
)
@pytest.mark.parametrize("protocol", [2, 5])
def test_refuses_non_numeric_numpy(value, protocol):
    with pytest.raises(UnsafePickleError, match="dtype"):
        safe_loads(pickle.dumps(value, protocol=protocol))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_admits_data_types_every_protocol(protocol):
    obj = {
        "train": [[(60, 64), ()], [(np.int64(21), np.int64(108))]],
        "x": [1.5, 2 + 1j, True, None, "s", b"b", bytearray(b"ba"), {1, 2}, frozenset({3})],
        "arr": np.arange(6, dtype=np.float32).reshape(2, 3),
        "scalars": (np.float64(0.5), np.int32(-3), np.bool_(True), np.uint8(7)),
    }
    out = safe_loads(pickle.dumps(obj, protocol=protocol))
    assert out.keys() == obj.keys()
    assert out["train"] == obj["train"] and type(out["train"][1][0][0]) is np.int64
    assert out["x"] == obj["x"]
    np.testing.assert_array_equal(out["arr"], obj["arr"])
    assert out["arr"].dtype == np.float32
    assert [type(v) for v in out["scalars"]] == [type(v) for v in obj["scalars"]]
    assert out["scalars"] == obj["scalars"]


def test_real_jsb_pickle_needs_only_numpy_scalars(jsb_path):
    data = jsb_path.read_bytes()
    assert _globals(data) == {("numpy.core.multiarray", "scalar"), ("numpy", "dtype")}
    out = safe_load(jsb_path)
    assert {k: len(v) for k, v in out.items()} == {"train": 229, "valid": 76, "test": 77}
    # equal to what the unrestricted unpickler gives
    ref = pickle.loads(data, encoding="latin1")
    assert out["test"] == ref["test"] and out["train"][:5] == ref["train"][:5]
    # also from an open file object
    with open(jsb_path, "rb") as f:
        assert len(safe_load(f)["valid"]) == 76


def test_real_jsb_2x_pickle(jsb2x_path):
    out = safe_load(jsb2x_path)
    assert {k: len(v) for k, v in out.items()} == {"train": 272, "valid": 80, "test": 77}


def test_truncated_pickle_is_an_unpickling_error():
    data = pickle.dumps({"train": [[(60,)]]}, protocol=2)
    with pytest.raises((pickle.UnpicklingError, EOFError)):
        safe_load(io.BytesIO(data[:-3]))


# --- allocations must be backed by the bytes in the file -------------------------------------

import struct
import time
import tracemalloc

from numpy._core import multiarray as _multiarray
from numpy._core import numeric as _numeric

# numpy.core.multiarray._reconstruct(numpy.ndarray, (2**40,), b'b'): the issue's "60-byte" pickle
# (68 bytes here) asking for a 1 TiB array; the stock unpickler tries to allocate it
MALICIOUS_RECONSTRUCT = (
    b"\x80\x03cnumpy.core.multiarray\n_reconstruct\n"
    b"cnumpy\nndarray\n\x8a\x06\x00\x00\x00\x00\x00\x01\x85C\x01b\x87R."
)


def _refused_cheaply(data, match):
    """Refused with ``match``, in well under a second and with under 1 MiB traced."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(UnsafePickleError, match=match):
            safe_loads(data)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 0.2, seconds
    assert peak < 2**20, peak
    return seconds, peak


def test_the_60_byte_reconstruct_pickle_is_refused_without_allocating():
    assert _globals(MALICIOUS_RECONSTRUCT) == {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
    }
    _refused_cheaply(
        MALICIOUS_RECONSTRUCT,
        r"numpy _reconstruct: refusing shape \(1099511627776,\) and type code b'b'; "
        r"numpy's pickles use \(0,\) and b'b'",
    )


@pytest.mark.parametrize(
    "args", [((2**20,), b"b"), ((0, 0), b"b"), ((0,), b"d"), ((False,), b"b"), ([0], b"b")]
)
def test_reconstruct_admits_only_numpy_shape_and_typecode(args):
    class R:
        def __reduce__(self):
            return _multiarray._reconstruct, (np.ndarray,) + args

    with pytest.raises(UnsafePickleError, match="numpy _reconstruct: refusing shape"):
        safe_loads(pickle.dumps(R(), protocol=2))


def _reduce_pickle(func, args, state=None, protocol=2):
    class R:
        def __reduce__(self):
            return (func, args) if state is None else (func, args, state)

    return pickle.dumps(R(), protocol=protocol)


def test_array_state_whose_shape_disagrees_with_its_bytes_is_refused():
    f8 = np.dtype("f8")
    cases = {
        (2**40,): r"shape \(1099511627776,\) of float64 needs 8796093022208 bytes but the file "
        r"holds 16; refused",
        (3,): r"shape \(3,\) of float64 needs 24 bytes but the file holds 16",
        (1,): r"shape \(1,\) of float64 needs 8 bytes but the file holds 16",
        (2**32, 2**32): r"shape \(4294967296, 4294967296\) of float64 needs 147573952589676412928 "
        r"bytes but the file holds 16",
        (-2,): r"invalid shape \(-2,\)",
    }
    for shape, match in cases.items():
        data = _reduce_pickle(
            _multiarray._reconstruct, (np.ndarray, (0,), b"b"), (1, shape, f8, False, b"\0" * 16)
        )
        _refused_cheaply(data, "numpy array: " + match)
    # the well-formed version of the same pickle loads
    good = _reduce_pickle(
        _multiarray._reconstruct, (np.ndarray, (0,), b"b"), (1, (2,), f8, False, b"\0" * 16)
    )
    np.testing.assert_array_equal(safe_loads(good), np.zeros(2))


@pytest.mark.parametrize("protocol", [2, 5])
def test_frombuffer_whose_shape_disagrees_with_its_bytes_is_refused(protocol):
    f8 = np.dtype("f8")
    for shape, match in [
        (
            (2**40,),
            r"shape \(1099511627776,\) of float64 needs 8796093022208 "
            r"bytes but the file holds 16; refused",
        ),
        ((2, 2), r"shape \(2, 2\) of float64 needs 32 bytes but the file holds 16"),
        ((-1,), r"invalid shape \(-1,\)"),
        ((2.0,), r"invalid shape \(2.0,\)"),
    ]:
        data = _reduce_pickle(
            _numeric._frombuffer, (bytearray(16), f8, shape, "C"), protocol=protocol
        )
        _refused_cheaply(data, "numpy _frombuffer: " + match)
    data = _reduce_pickle(_numeric._frombuffer, (bytearray(16), f8, (2,), "X"), protocol=protocol)
    with pytest.raises(UnsafePickleError, match="numpy _frombuffer: invalid order 'X'"):
        safe_loads(data)


@pytest.mark.parametrize("payload", [b"\0" * 3, b"\0" * 30, b""])
def test_scalar_whose_payload_disagrees_with_its_itemsize_is_refused(payload):
    data = _reduce_pickle(_multiarray.scalar, (np.dtype("f8"), payload))
    with pytest.raises(
        UnsafePickleError,
        match=rf"numpy scalar: {len(payload)} bytes of data for dtype float64 "
        r"\(itemsize 8\); refused",
    ):
        safe_loads(data)


@pytest.mark.parametrize(
    "opcodes, what",
    [
        (b"\x80\x04\x8e" + struct.pack("<Q", 2**34), "expected 17179869184 bytes in a bytes8"),
        (b"\x80\x05\x96" + struct.pack("<Q", 2**34), "expected 17179869184 bytes in a bytearray8"),
        (
            b"\x80\x04\x8d" + struct.pack("<Q", 2**34),
            "expected 17179869184 bytes in a unicodestring8",
        ),
        (b"\x80\x02\x8b" + struct.pack("<i", 2**30), "not enough data in stream to read long4"),
    ],
)
def test_length_fields_larger_than_the_file_are_refused_before_allocating(opcodes, what):
    # the stock unpickler allocates the claimed size first (16 GiB here), then finds it truncated
    _refused_cheaply(
        opcodes + b".",
        rf"malformed pickle: {what}(, but only 1 remain)? "
        r"\(truncated or crafted file\); refused",
    )


def test_memo_index_far_past_the_opcodes_is_refused():
    # the stock unpickler zero-fills a memo of 2 * index entries: 2 GiB for LONG_BINPUT 2**27
    data = b"\x80\x02Nr" + struct.pack("<I", 2**27) + b"."
    _refused_cheaply(
        data,
        r"malformed pickle: memo index 134217728 at byte 3 after only 2 "
        r"opcodes \(a crafted file\); refused",
    )
    assert safe_loads(b"\x80\x02Nr" + struct.pack("<I", 2) + b".") is None


def test_frame_longer_than_the_file_is_refused():
    data = b"\x80\x04\x95" + struct.pack("<Q", 2**40) + b"N."
    _refused_cheaply(data, r"frame of 1099511627776 bytes at byte 2 but only 2 remain")


def test_dtype_state_cannot_graft_subarray_fields_or_flags():
    base = (3, "<", None, None, None, -1, -1, 0)
    bad = [
        base[:2] + ((np.dtype("f8"), (2,)),) + base[3:],  # sub-array
        base[:7] + (63,),  # object flags
        base[:5] + (1000, 1, 0),  # element size
        base + ({"meta": 1},),
    ]  # metadata
    for state in bad:
        data = _reduce_pickle(np.dtype, ("f8", False, True), state)
        with pytest.raises(UnsafePickleError, match=r"numpy.dtype: refusing state"):
            safe_loads(data)
    # a pickle asking for numpy's shared float64 (copy=False) cannot alter it either
    data = _reduce_pickle(_multiarray.scalar, (np.dtype("f8"), b"\0" * 8))
    data = data.replace(b"\x89\x88\x87", b"\x89\x89\x87")  # dtype('f8', False, False)
    assert safe_loads(data) == 0.0 and np.dtype("f8").byteorder == "="


def test_subarray_and_structured_type_codes_are_refused():
    for code in ("(3,)f8", "f8,i4", "V8", "M8[s]"):
        data = _reduce_pickle(np.dtype, (code, False, True))
        with pytest.raises(UnsafePickleError, match="numpy.dtype: "):
            safe_loads(data)


def test_repeated_copies_of_one_list_are_refused():
    # list(L) for the same 1000-item L, 1000 times: 10**6 items copied from an 8 kB file
    ops = [b"\x80\x02]q\x00(" + b"K\x01" * 1000 + b"ecbuiltins\nlist\nq\x01]("]
    ops += [b"h\x01h\x00\x85R"] * 1000
    data = b"".join(ops) + b"e."
    ref = pickle.loads(data)
    assert len(ref) == 1000 and ref[0] == [1] * 1000 and len(data) < 9000
    with pytest.raises(
        UnsafePickleError, match=r"list\(\): the pickle copies more items than its size can hold"
    ):
        safe_loads(data)
    # a single copy (how protocol 2 pickles sets) is fine
    assert safe_loads(pickle.dumps({1, 2, 3}, protocol=2)) == {1, 2, 3}


def test_str_of_a_container_is_refused():
    # str() of a DAG of shared lists is exponentially long in the pickle's size
    data = b"\x80\x02cbuiltins\nstr\n]\x85R."
    with pytest.raises(UnsafePickleError, match=r"str\(\) of list is refused"):
        safe_loads(data)
    assert safe_loads(b"\x80\x02c__builtin__\nunicode\nX\x01\x00\x00\x00a\x85R.") == "a"


def _same_array(out, ref):
    assert type(out) is type(ref) is np.ndarray
    assert out.dtype == ref.dtype and out.dtype.str == ref.dtype.str
    assert out.shape == ref.shape and out.strides == ref.strides
    assert out.flags.c_contiguous == ref.flags.c_contiguous
    assert out.flags.f_contiguous == ref.flags.f_contiguous
    assert out.flags.writeable == ref.flags.writeable
    assert out.tobytes("A") == ref.tobytes("A")


REAL_ARRAYS = {
    "f8": np.linspace(-1, 1, 7),
    "f4-2d": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f2": np.array([0.5, -2.0], dtype=np.float16),
    "i1": np.array([-128, 0, 127], dtype=np.int8),
    "u8": np.array([0, 2**64 - 1], dtype=np.uint64),
    "bool": np.array([[True, False], [False, True]]),
    "c16": np.array([1 + 2j, -3j]),
    "big-endian": np.arange(5, dtype=">i4"),
    "0-d": np.array(3.25),
    "empty": np.zeros((0, 3), dtype=np.int32),
    "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "transposed-3d": np.arange(24.0).reshape(2, 3, 4).transpose(1, 0, 2),
    "strided": np.arange(10)[::3],
}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("name", sorted(REAL_ARRAYS))
def test_real_numpy_pickles_load_identically(name, protocol):
    value = REAL_ARRAYS[name]
    data = pickle.dumps(value, protocol=protocol)
    _same_array(safe_loads(data), pickle.loads(data))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_real_numpy_scalars_and_shared_arrays_load_identically(protocol):
    arr = np.arange(3.0)
    obj = {
        "pair": (arr, arr),
        "list": [arr, (arr,)],
        "scalars": [
            np.float16(1.5),
            np.complex64(1j),
            np.uint16(7),
            np.bool_(False),
            np.int64(-(2**62)),
            np.float64(np.nan),
        ],
    }
    data = pickle.dumps(obj, protocol=protocol)
    out, ref = safe_loads(data), pickle.loads(data)
    # the same array object everywhere it was shared, as with pickle.load
    assert out["pair"][0] is out["pair"][1] is out["list"][0] is out["list"][1][0]
    _same_array(out["pair"][0], ref["pair"][0])
    assert [type(v) for v in out["scalars"]] == [type(v) for v in ref["scalars"]]
    assert [v.tobytes() for v in out["scalars"]] == [v.tobytes() for v in ref["scalars"]]


def test_file_object_is_left_after_the_pickle():
    f = io.BytesIO(pickle.dumps([1, 2], protocol=2) + pickle.dumps(np.arange(2), protocol=4))
    assert safe_load(f) == [1, 2]
    np.testing.assert_array_equal(safe_load(f), np.arange(2))
    assert f.read() == b""


@pytest.mark.parametrize(
    "data, cause",
    [
        (
            b"}Na.",
            r"AttributeError: \"'dict' object has no attribute 'append'\"",
        ),  # APPEND to a dict
        (b"dp0\n.", r"UnpicklingError: 'could not find MARK'"),
        (b"(}]s.", r"UnpicklingError: 'unexpected MARK found'"),
        (b"\x80\x52N.", r"ValueError: 'unsupported pickle protocol: 82'"),
        (b"\x82\x01.", r"ValueError: 'unregistered extension code 1'"),  # EXT1
        (b"cnumpy\ndtype\n)R.", r"TypeError: \"_safe_dtype\(\) missing 1 required positional"),
        (b"(lp0\nI1\naI2\nag0\n\x85R.", r"TypeError: \"'list' object is not callable\""),
    ],
    ids=[
        "append_to_dict",
        "no_mark",
        "stray_mark",
        "protocol",
        "extension",
        "arguments",
        "call_list",
    ],
)
def test_opcodes_that_do_not_fit_together_are_an_unsafe_pickle_error(tmp_path, data, cause):
    # regression (found by tests/property): the C unpickler's AttributeError, TypeError,
    # ValueError and bare UnpicklingError escaped safe_load (and load_piano_rolls), although
    # its docstring promises UnsafePickleError for a malformed pickle
    from pyro_seq.data import load_piano_rolls

    match = r"^malformed pickle: " + cause + r".* \(truncated or crafted file\); refused$"
    with pytest.raises(UnsafePickleError, match=match):
        safe_loads(data)
    path = tmp_path / "bad.pickle"
    path.write_bytes(data)
    with pytest.raises(UnsafePickleError, match=match):
        load_piano_rolls(path)
