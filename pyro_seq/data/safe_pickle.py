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
"""

from __future__ import annotations

import io
import os
import pickle
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


def _check_dtype(dtype: Any, where: str) -> np.dtype:
    if not isinstance(dtype, np.dtype):
        raise UnsafePickleError(f"{where}: expected a numpy dtype, got {type(dtype).__name__}")
    if dtype.kind not in _NUMERIC_KINDS or dtype.hasobject or dtype.fields is not None:
        raise UnsafePickleError(
            f"{where}: numpy dtype {dtype!r} (kind {dtype.kind!r}) is refused; only boolean, "
            "integer, float and complex dtypes are admitted"
        )
    return dtype


def _safe_dtype(obj: Any, align: bool = False, copy: bool = False) -> np.dtype:
    if not isinstance(obj, str):
        raise UnsafePickleError(
            f"numpy.dtype: refusing a dtype built from {type(obj).__name__} (expected a type code)"
        )
    try:
        dtype = np.dtype(obj, align=bool(align), copy=bool(copy))
    except TypeError as e:
        raise UnsafePickleError(f"numpy.dtype: invalid type code {obj!r}: {e}") from None
    return _check_dtype(dtype, "numpy.dtype")


def _safe_scalar(dtype: Any, data: Any = None) -> np.generic:
    _check_dtype(dtype, "numpy scalar")
    if not isinstance(data, (bytes, str)):
        raise UnsafePickleError(
            f"numpy scalar: refusing payload of type {type(data).__name__} (expected bytes)"
        )
    return _numpy_core("multiarray").scalar(dtype, data)


class _NDArrayMarker:
    """Stands in for ``numpy.ndarray`` so that a pickle cannot call ``ndarray(...)`` directly."""

    def __init__(self, *args, **kwargs):
        raise UnsafePickleError("numpy.ndarray may only be used through _reconstruct")


def _safe_reconstruct(cls: Any, shape: Any, typecode: Any) -> np.ndarray:
    if cls is not _NDArrayMarker:
        raise UnsafePickleError(
            f"numpy _reconstruct: refusing subtype {cls!r}; only numpy.ndarray is admitted"
        )
    return _numpy_core("multiarray")._reconstruct(np.ndarray, shape, typecode)


def _safe_frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    _check_dtype(dtype, "numpy _frombuffer")
    if not isinstance(buf, (bytes, bytearray, pickle.PickleBuffer)):
        raise UnsafePickleError(
            f"numpy _frombuffer: refusing buffer of type {type(buf).__name__}"
        )
    return _numpy_core("numeric")._frombuffer(buf, dtype, shape, order)


def _safe_codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(
            f"_codecs.encode: only encode(str, 'latin1') is admitted, got encoding {encoding!r}"
        )
    return obj.encode("latin1", errors)


def _no_int_alloc(kind: type) -> Callable[..., Any]:
    """``bytes``/``bytearray`` that refuse ``bytes(n)`` (an allocation chosen by the file)."""

    def make(*args):
        if args and isinstance(args[0], int):
            raise UnsafePickleError(f"{kind.__name__}(int) is refused")
        return kind(*args)

    make.__name__ = kind.__name__
    return make


_BUILTINS: Dict[str, Any] = {
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
    "bytes": _no_int_alloc(bytes),
    "bytearray": _no_int_alloc(bytearray),
}
_PY2_BUILTINS: Dict[str, Any] = dict(_BUILTINS, unicode=str, long=int)

_ADMITTED: Dict[Tuple[str, str], Any] = {}
_ADMITTED.update({("builtins", k): v for k, v in _BUILTINS.items()})
_ADMITTED.update({("__builtin__", k): v for k, v in _PY2_BUILTINS.items()})
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
    the loaded object graph.
    """

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ADMITTED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refusing to load global '{module}.{name}': the restricted unpickler admits only "
                "builtin containers, numbers, strings and numeric numpy scalars/arrays; if you "
                "trust this file, load it with pickle.load yourself"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"refusing persistent id {pid!r}")


_LEAF_TYPES = (int, float, complex, bool, str, bytes, bytearray, type(None))
_CONTAINER_TYPES = (list, tuple, set, frozenset, dict)


def _check_graph(obj: Any) -> None:
    """Walk the loaded object graph; raise :class:`UnsafePickleError` on any foreign type."""
    stack = [obj]
    seen = set()
    while stack:
        o = stack.pop()
        t = type(o)
        if t in _LEAF_TYPES:
            continue
        if isinstance(o, np.generic) or t is np.ndarray:
            _check_dtype(o.dtype, "loaded numpy value")
            continue
        if t not in _CONTAINER_TYPES:
            raise UnsafePickleError(f"loaded object contains a refused type {t.__module__}.{t.__name__}")
        if id(o) in seen:
            continue
        seen.add(id(o))
        if t is dict:
            stack.extend(o.keys())
            stack.extend(o.values())
        else:
            stack.extend(o)


def safe_load(file: Union[str, os.PathLike, BinaryIO], *, encoding: str = "latin1") -> Any:
    """Unpickle ``file`` (a path or a binary file object) admitting only data types.

    ``encoding="latin1"`` decodes Python 2 byte strings as ``str``, which is what numpy
    scalars pickled by Python 2 (as in ``jsb_chorales.pickle``) need.

    Raises:
        UnsafePickleError: the pickle names a global outside the admitted set (the message names
            it), or the loaded graph holds a refused type. Nothing named is imported or called.
    """
    if isinstance(file, (str, os.PathLike)):
        with open(file, "rb") as f:
            return safe_load(f, encoding=encoding)
    obj = RestrictedUnpickler(file, encoding=encoding).load()
    _check_graph(obj)
    return obj


def safe_loads(data: bytes, *, encoding: str = "latin1") -> Any:
    """Like :func:`safe_load` for a ``bytes`` object."""
    return safe_load(io.BytesIO(data), encoding=encoding)
