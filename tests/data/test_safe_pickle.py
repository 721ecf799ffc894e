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
