"""A restricted unpickler for piano-roll datasets.

The polyphonic music benchmarks of Boulanger-Lewandowski et al. (2012) -- JSB Chorales,
Nottingham, MuseData, Piano-midi.de -- are distributed as pickles. A pickle can name any
importable callable and call it while loading (``os.system`` via ``__reduce__`` is the classic
example), so unpickling a file from the internet with :func:`pickle.load` runs whatever code the
file asks for. :func:`safe_load` refuses every global that these datasets do not need.

What the real files reference (checked with :mod:`pickletools`):

* ``jsb_chorales.pickle`` (Python 2, protocol 2): ``numpy.core.multiarray.scalar`` and
  ``numpy.dtype`` -- each note is a pickled ``numpy.int64`` scalar; everything else is
  dicts, lists, tuples and byte strings built by opcodes, without globals.
* ``jsb_chorales_2x.pickle`` (protocol 4): no globals at all (plain ``int`` notes).

Admitted globals:

* builtin containers and scalars: ``dict``, ``list``, ``tuple``, ``set``, ``frozenset``,
  ``int``, ``float``, ``complex``, ``bool``, ``str``, ``bytes``, ``bytearray`` (also under the
  Python 2 names ``__builtin__.unicode``/``long``);
* ``_codecs.encode`` with the ``latin1`` codec only (how protocol-2 pickles store ``bytes``);
* numpy scalars and arrays of boolean, integer, unsigned, float or complex dtype, reached
  through ``numpy.dtype``, ``numpy[._]core.multiarray.scalar``, ``..._reconstruct`` with
  ``numpy.ndarray``, and ``numpy[._]core.numeric._frombuffer``. Object, string, void and
  structured dtypes are refused.

Anything else raises :class:`UnsafePickleError` naming the refused global, before it is
imported or called. After loading, the whole object graph is walked once more and must consist
of the admitted types only (defence in depth against state set by ``BUILD``).

No allocation may be larger than the bytes in the file back:

* the opcode stream is checked before loading: every counted length (``BINBYTES8``,
  ``BYTEARRAY8``, ``BINUNICODE8``, ``LONG4``, ``FRAME``...) must be present and memo indices
  must be consecutive-ish (the C unpickler allocates first and reads after);
* ``_reconstruct`` admits only numpy's own ``(0,)``/``b'b'``; the shape and data set by ``BUILD``
  and the arguments of ``_frombuffer`` and ``scalar`` must agree with the length of the data;
* dtypes and arrays are built from validated state only (``numpy.dtype.__setstate__`` would
  accept an object sub-array on a ``float64``);
* ``list(x)``, ``set(x)``, ``bytes(x)``... copy at most as many items in total as the file has
  bytes, and ``str``/``int``/``float``... accept only strings and numbers.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
from typing import Any, BinaryIO, Callable, Dict, Tuple, Union

import numpy as np

__all__ = ["UnsafePickleError", "RestrictedUnpickler", "safe_load", "safe_loads"]

_NUMERIC_KINDS = frozenset("biufc")  # bool, signed int, unsigned int, float, complex


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for something the restricted unpickler does not admit."""


def _numpy_core(submodule: str):
    """``numpy._core.<submodule>`` (numpy >= 2) or ``numpy.core.<submodule>`` (numpy 1.x)."""
    import importlib

    try:
        return importlib.import_module("numpy._core." + submodule)
    except ImportError:  # pragma: no cover - numpy 1.x
        return importlib.import_module("numpy.core." + submodule)


def _canonical_dtype(dtype: Any, where: str) -> np.dtype:
    """A fresh, plain numeric dtype equal to ``dtype``, or :class:`UnsafePickleError`.

    Beyond the kind, the dtype must have no fields, no sub-array and the flags of a freshly
    built dtype of its type code: ``dtype.__setstate__`` (a pickle's ``BUILD``) can graft an
    object sub-array or fields onto a ``float64`` without changing its kind.
    """
    if not isinstance(dtype, np.dtype):
        raise UnsafePickleError(f"{where}: expected a numpy dtype, got {type(dtype).__name__}")
    if (
        dtype.kind not in _NUMERIC_KINDS
        or dtype.hasobject
        or dtype.fields is not None
        or dtype.subdtype is not None
        or dtype.names is not None
    ):
        raise UnsafePickleError(
            f"{where}: numpy dtype {dtype!r} (kind {dtype.kind!r}) is refused; only boolean, "
            "integer, float and complex dtypes are admitted"
        )
    fresh = np.dtype(dtype.str)
    if fresh != dtype or fresh.itemsize != dtype.itemsize or fresh.flags != dtype.flags:
        raise UnsafePickleError(f"{where}: numpy dtype {dtype!r} was altered; refused")
    return fresh


_check_dtype = _canonical_dtype


class _PendingDtype:
    """What a pickled ``numpy.dtype(code, align, copy)`` yields while loading.

    The real :class:`numpy.dtype` is built only from a validated state, so a pickle's ``BUILD``
    never reaches ``numpy.dtype.__setstate__`` (which admits sub-arrays, fields and flags that
    would make raw bytes be read as object pointers).
    """

    __slots__ = ("dtype", "_built")

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self._built = False

    def __setstate__(self, state: Any) -> None:
        # numpy writes (3, byteorder, subarray, names, fields, elsize, alignment, flags) and, with
        # metadata, a 9th item; for numeric dtypes subarray/names/fields/metadata are None,
        # elsize/alignment -1 and flags those of the fresh dtype.
        if self._built:
            raise UnsafePickleError("numpy.dtype: state set twice")
        if not (
            isinstance(state, tuple)
            and len(state) in (8, 9)
            and state[0] in (3, 4)
            and state[1] in ("<", ">", "|", "=")
            and all(v is None for v in state[2:5] + state[8:])
            and state[5] == -1
            and state[6] == -1
            and state[7] == self.dtype.flags
        ):
            raise UnsafePickleError(
                f"numpy.dtype: refusing state {_short(state)} for {self.dtype} (only plain "
                "numeric dtypes are admitted)"
            )
        self._built = True
        if state[1] in "<>" and self.dtype.byteorder != "|":
            self.dtype = _canonical_dtype(self.dtype.newbyteorder(state[1]), "numpy.dtype")


def _short(obj: Any, limit: int = 80) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[:limit] + "..."


def _real_dtype(dtype: Any, where: str) -> np.dtype:
    if not isinstance(dtype, _PendingDtype):
        raise UnsafePickleError(f"{where}: expected a numpy dtype, got {type(dtype).__name__}")
    return dtype.dtype


def _safe_dtype(obj: Any, align: bool = False, copy: bool = False) -> _PendingDtype:
    if not isinstance(obj, str) or len(obj) > 8:
        raise UnsafePickleError(
            f"numpy.dtype: refusing a dtype built from {_short(obj)} (expected a type code)"
        )
    try:
        dtype = np.dtype(obj, align=bool(align), copy=True)
    except TypeError as e:
        raise UnsafePickleError(f"numpy.dtype: invalid type code {obj!r}: {e}") from None
    return _PendingDtype(_canonical_dtype(dtype, "numpy.dtype"))


def _payload_length(data: Any, where: str) -> int:
    if not isinstance(data, (bytes, bytearray, str)):
        raise UnsafePickleError(
            f"{where}: refusing payload of type {type(data).__name__} (expected bytes)"
        )
    return len(data)  # a str here is Python 2 bytes decoded as latin1: one char per byte


def _safe_scalar(dtype: Any, data: Any = None) -> np.generic:
    dtype = _real_dtype(dtype, "numpy scalar")
    n = _payload_length(data, "numpy scalar")
    if n != dtype.itemsize:
        raise UnsafePickleError(
            f"numpy scalar: {n} bytes of data for dtype {dtype} (itemsize {dtype.itemsize}); "
            "refused"
        )
    return _numpy_core("multiarray").scalar(dtype, data)


def _check_shape(shape: Any, where: str) -> int:
    """Number of elements of a shape: a tuple of at most 32 non-negative ints."""
    if (
        not isinstance(shape, tuple)
        or len(shape) > 32
        or not all(type(n) is int and n >= 0 for n in shape)
    ):
        raise UnsafePickleError(f"{where}: invalid shape {_short(shape)}")
    size = 1
    for n in shape:
        size *= n
    return size


def _check_size(shape: Any, dtype: np.dtype, nbytes: int, where: str) -> None:
    size = _check_shape(shape, where)
    if size * dtype.itemsize != nbytes:
        raise UnsafePickleError(
            f"{where}: shape {_short(shape)} of {dtype} needs {size * dtype.itemsize} bytes but "
            f"the file holds {nbytes}; refused"
        )


class _NDArrayMarker:
    """Stands in for ``numpy.ndarray`` so that a pickle cannot call ``ndarray(...)`` directly."""

    def __new__(cls, *args, **kwargs):
        raise UnsafePickleError("numpy.ndarray may only be used through _reconstruct")


class _PendingArray:
    """What ``numpy.core.multiarray._reconstruct`` yields while loading.

    numpy pickles an array (protocols 0-4) as ``_reconstruct(ndarray, (0,), b'b')`` followed by
    ``BUILD`` with ``(version, shape, dtype, is_fortran, raw_bytes)``. The state is validated
    here (numeric dtype, shape consistent with the bytes present) before numpy's own
    ``ndarray.__setstate__`` builds the array; :func:`safe_load` then puts the array in place of
    this object.
    """

    __slots__ = ("array",)

    def __init__(self):
        self.array = None

    def __setstate__(self, state: Any) -> None:
        if self.array is not None:
            raise UnsafePickleError("numpy array: state set twice")
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise UnsafePickleError(f"numpy array: refusing state {_short(state)}")
        version, (shape, dtype, fortran, raw) = (state[0] if len(state) == 5 else 0), state[-4:]
        if version not in (0, 1) or not isinstance(fortran, (bool, int)):
            raise UnsafePickleError(f"numpy array: refusing state {_short(state)}")
        dtype = _real_dtype(dtype, "numpy array")
        _check_size(shape, dtype, _payload_length(raw, "numpy array"), "numpy array")
        array = _numpy_core("multiarray")._reconstruct(np.ndarray, (0,), b"b")
        array.__setstate__((1, shape, dtype, bool(fortran), raw))
        self.array = array

    def result(self) -> np.ndarray:
        if self.array is None:  # never built: what numpy gives for a bare _reconstruct
            self.array = _numpy_core("multiarray")._reconstruct(np.ndarray, (0,), b"b")
        return self.array


def _safe_reconstruct(cls: Any, shape: Any, typecode: Any) -> _PendingArray:
    if cls is not _NDArrayMarker:
        raise UnsafePickleError(
            f"numpy _reconstruct: refusing subtype {cls!r}; only numpy.ndarray is admitted"
        )
    # numpy always writes _reconstruct(ndarray, (0,), b'b') (Python 2: 'b') and sets the real
    # shape and data with BUILD; any other shape is an allocation the file's bytes do not back.
    if not (
        isinstance(shape, tuple)
        and len(shape) == 1
        and type(shape[0]) is int
        and shape[0] == 0
        and typecode in (b"b", "b")
    ):
        raise UnsafePickleError(
            f"numpy _reconstruct: refusing shape {_short(shape)} and type code "
            f"{_short(typecode)}; numpy's pickles use (0,) and b'b'"
        )
    return _PendingArray()


def _safe_frombuffer(
    buf: Any, dtype: Any, shape: Any, order: Any, axis_order: Any = None
) -> np.ndarray:
    dtype = _real_dtype(dtype, "numpy _frombuffer")
    if not isinstance(buf, (bytes, bytearray)):
        raise UnsafePickleError(f"numpy _frombuffer: refusing buffer of type {type(buf).__name__}")
    _check_size(shape, dtype, len(buf), "numpy _frombuffer")
    if order not in ("C", "F", "K"):
        raise UnsafePickleError(f"numpy _frombuffer: invalid order {_short(order)}")
    if axis_order is not None:
        if (
            order != "K"
            or not isinstance(axis_order, tuple)
            or sorted(axis_order) != list(range(len(shape)))
            or not all(type(i) is int for i in axis_order)
        ):
            raise UnsafePickleError(f"numpy _frombuffer: invalid axis order {_short(axis_order)}")
        return _numpy_core("numeric")._frombuffer(buf, dtype, shape, order, axis_order)
    return _numpy_core("numeric")._frombuffer(buf, dtype, shape, order)


def _safe_codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise UnsafePickleError(
            f"_codecs.encode: only encode(str, 'latin1') is admitted, got encoding {encoding!r}"
        )
    return obj.encode("latin1")


_SCALAR_ARGS = (str, bytes, bytearray, int, float, complex, bool)
_SCALAR_BUILTINS = ("int", "float", "complex", "bool", "str", "unicode", "long")
_COPYING_BUILTINS = ("dict", "list", "tuple", "set", "frozenset", "bytes", "bytearray")


def _scalar_builtin(kind: type, name: str) -> Callable[..., Any]:
    """``int``/``float``/``str``/... of strings and numbers only (``str(container)`` of a
    shared object graph is exponentially long)."""

    def make(*args):
        if not all(isinstance(a, _SCALAR_ARGS) for a in args):
            raise UnsafePickleError(
                f"{name}() of {', '.join(type(a).__name__ for a in args)} is refused"
            )
        return kind(*args)

    make.__name__ = name
    return make


class _CopyBudget:
    """Bounds the items copied by ``list(x)``, ``set(x)``, ``bytes(x)``...: one pickle could
    otherwise copy the same large list once per opcode (memory quadratic in the file size)."""

    def __init__(self, limit: int):
        self.left = limit

    def wrap(self, kind: type, name: str) -> Callable[..., Any]:
        def make(*args):
            if args and isinstance(args[0], int) and kind in (bytes, bytearray):
                raise UnsafePickleError(f"{name}(int) is refused")
            if args:
                try:
                    n = len(args[0])
                except TypeError:
                    raise UnsafePickleError(
                        f"{name}() of {type(args[0]).__name__} is refused"
                    ) from None
                self.left -= n
                if self.left < 0:
                    raise UnsafePickleError(
                        f"{name}(): the pickle copies more items than its size can hold; refused"
                    )
            return kind(*args)

        make.__name__ = name
        return make


_BUILTIN_TYPES: Dict[str, type] = {
    "dict": dict,
    "list": list,
    "tuple": tuple,
    "set": set,
    "frozenset": frozenset,
    "int": int,
    "float": float,
    "complex": complex,
    "bool": bool,
    "str": str,
    "bytes": bytes,
    "bytearray": bytearray,
}
_PY2_BUILTIN_TYPES: Dict[str, type] = dict(_BUILTIN_TYPES, unicode=str, long=int)

_ADMITTED: Dict[Tuple[str, str], Any] = {}
_ADMITTED.update({("builtins", k): v for k, v in _BUILTIN_TYPES.items()})
_ADMITTED.update({("__builtin__", k): v for k, v in _PY2_BUILTIN_TYPES.items()})
_ADMITTED[("_codecs", "encode")] = _safe_codecs_encode
_ADMITTED[("numpy", "dtype")] = _safe_dtype
_ADMITTED[("numpy", "ndarray")] = _NDArrayMarker
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ADMITTED[(_mod, "scalar")] = _safe_scalar
    _ADMITTED[(_mod, "_reconstruct")] = _safe_reconstruct
for _mod in ("numpy.core.numeric", "numpy._core.numeric"):
    _ADMITTED[(_mod, "_frombuffer")] = _safe_frombuffer


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` whose ``find_class`` admits only data types (see module doc).

    Use :func:`safe_load` / :func:`safe_loads` rather than this class directly: they also check
    the opcode stream before loading and the loaded object graph after.

    :param copy_budget: how many items the admitted ``list``/``tuple``/``set``/``dict``/
        ``bytes`` constructors may copy in total (:func:`safe_load` passes the file's size).
    """

    def __init__(self, file: BinaryIO, *, copy_budget: int = 1 << 20, **kwargs: Any):
        super().__init__(file, **kwargs)
        self._budget = _CopyBudget(copy_budget)

    def find_class(self, module: str, name: str) -> Any:
        try:
            target = _ADMITTED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refusing to load global '{module}.{name}': the restricted unpickler admits only "
                "builtin containers, numbers, strings and numeric numpy scalars/arrays; if you "
                "trust this file, load it with pickle.load yourself"
            ) from None
        if isinstance(target, type) and module in ("builtins", "__builtin__"):
            if name in _COPYING_BUILTINS:
                return self._budget.wrap(target, name)
            return _scalar_builtin(target, name)
        return target

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"refusing persistent id {pid!r}")


_MEMO_PUT = frozenset(("PUT", "BINPUT", "LONG_BINPUT"))


def _scan_opcodes(data: bytes) -> int:
    """Check the opcode stream before the C unpickler sees it; return the length up to STOP.

    The C unpickler allocates what length fields and memo indices claim before reading the
    bytes: ``BINBYTES8`` of 2**40 allocates a terabyte, ``LONG_BINPUT 2**27`` zero-fills a 2 GB
    memo. Here every counted argument must be present in ``data`` and every memo index at most
    the number of opcodes before it (picklers number memo entries consecutively).
    """
    ops = 0
    try:
        for op, arg, pos in pickletools.genops(data):
            assert pos is not None  # genops over bytes reports every position
            # the arguments of memo puts and frames are ints (pickletools' argument readers)
            if op.name in _MEMO_PUT and arg > ops:  # type: ignore[operator]
                raise UnsafePickleError(
                    f"malformed pickle: memo index {arg} at byte {pos} after only {ops} opcodes "
                    "(a crafted file); refused"
                )
            if op.name == "FRAME" and arg > len(data) - pos - 9:  # type: ignore[operator]  # 9: opcode and length
                raise UnsafePickleError(
                    f"malformed pickle: frame of {arg} bytes at byte {pos} but only "
                    f"{len(data) - pos - 9} remain (truncated or crafted file); refused"
                )
            ops += 1
    except ValueError as e:  # pickletools: length past the end, bad opcode, no STOP, ...
        raise UnsafePickleError(
            f"malformed pickle: {e} (truncated or crafted file); refused"
        ) from None
    assert pos is not None  # genops yields up to STOP or raises
    return pos + 1


_LEAF_TYPES = (int, float, complex, bool, str, bytes, bytearray, type(None))


def _resolve(obj: Any) -> Any:
    """Walk the loaded graph: check every type, put arrays in place of :class:`_PendingArray`.

    Lists and dicts are updated in place (keeping shared references shared); a tuple holding an
    array is rebuilt. Raises :class:`UnsafePickleError` on any other type.
    """
    done: Dict[int, Any] = {}
    busy = set()  # tuples being resolved (a cycle back to one cannot see its rebuilt copy)
    cyclic = set()

    def visit(o: Any) -> Any:
        t = type(o)
        if t in _LEAF_TYPES:
            return o
        if t is _PendingArray:
            o = o.result()
            t = np.ndarray
        if t is np.ndarray or isinstance(o, np.generic):
            _canonical_dtype(o.dtype, "loaded numpy value")
            return o
        key = id(o)
        if key in done:
            return done[key]
        if t is list:
            done[key] = o
            for i, item in enumerate(o):
                new = visit(item)
                if new is not item:
                    o[i] = new
            return o
        if t is dict:
            done[key] = o
            for k, v in list(o.items()):
                if visit(k) is not k:
                    raise UnsafePickleError("loaded object uses a numpy array as a dict key")
                new = visit(v)
                if new is not v:
                    o[k] = new
            return o
        if t in (set, frozenset):
            done[key] = o
            if any(visit(item) is not item for item in o):
                raise UnsafePickleError("loaded object holds a numpy array in a set")
            return o
        if t is tuple:
            if key in busy:
                cyclic.add(key)
                return o
            busy.add(key)
            items = [visit(item) for item in o]
            busy.discard(key)
            new = o if all(a is b for a, b in zip(items, o)) else tuple(items)
            if new is not o and key in cyclic:
                raise UnsafePickleError("loaded object holds an array in a self-referencing tuple")
            done[key] = new
            return new
        raise UnsafePickleError(
            f"loaded object contains a refused type {t.__module__}.{t.__name__}"
        )

    try:
        return visit(obj)
    except RecursionError:
        raise UnsafePickleError("loaded object is nested too deeply") from None


def safe_load(file: Union[str, os.PathLike, BinaryIO], *, encoding: str = "latin1") -> Any:
    """Unpickle ``file`` (a path or a binary file object) admitting only data types.

    ``encoding="latin1"`` decodes Python 2 byte strings as ``str``, which is what numpy
    scalars pickled by Python 2 (as in ``jsb_chorales.pickle``) need.

    The file is read into memory first and its opcodes checked, so that no allocation is larger
    than what the bytes present back (see :func:`_scan_opcodes`); a file object is left just
    after the pickle's STOP opcode when it is seekable.

    Raises:
        UnsafePickleError: the pickle names a global outside the admitted set (the message names
            it), is malformed (including opcodes that do not fit together, e.g. ``APPEND`` to a
            dict, which the stock unpickler reports as AttributeError, TypeError, ...) or claims
            sizes its bytes do not back, or the loaded graph holds a refused type. Nothing named
            is imported or called.
    """
    if isinstance(file, (str, os.PathLike)):
        with open(file, "rb") as f:
            return safe_load(f, encoding=encoding)
    start = file.tell() if file.seekable() else None
    data = file.read()
    if not isinstance(data, bytes):
        raise TypeError(f"safe_load needs a binary file, got {type(data).__name__} from read()")
    end = _scan_opcodes(data)
    if start is not None:
        file.seek(start + end)
    unpickler = RestrictedUnpickler(
        io.BytesIO(data[:end]) if end < len(data) else io.BytesIO(data),
        encoding=encoding,
        copy_budget=len(data),
    )
    try:
        obj = unpickler.load()
    except UnsafePickleError:
        raise
    except MemoryError:  # pragma: no cover - not a property of the file's format
        raise
    except Exception as e:  # opcodes that do not fit together: APPEND to a dict, no MARK, an
        # unknown protocol or extension code, a call with the wrong arguments, deep nesting...
        raise UnsafePickleError(
            f"malformed pickle: {type(e).__name__}: {_short(str(e), 200)} (truncated or crafted "
            "file); refused"
        ) from None
    return _resolve(obj)


def safe_loads(data: bytes, *, encoding: str = "latin1") -> Any:
    """Like :func:`safe_load` for a ``bytes`` object."""
    return safe_load(io.BytesIO(data), encoding=encoding)
