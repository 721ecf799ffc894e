"""Your own sequences in files: the three file formats that :func:`~pyro_seq.data.load_dataset`
(and so ``--data`` of every ``pyro-seq`` command) reads besides names and piano-roll pickles.

* ``.npz`` (:func:`read_npz`, read with ``allow_pickle=False``): one array ``(T_i, D)`` per
  sequence, named ``<split>_<i>`` (``train_0, train_1, ..., valid_0, ..., test_0, ...``), and
  optionally the known inputs ``(T_i, U)`` of each as ``inputs_<split>_<i>``.
* ``.pt`` (:func:`read_pt`, read with ``weights_only=True``): the file that
  :func:`~pyro_seq.data.save_dataset` writes.
* ``.csv`` in long format (:func:`read_csv`): one row per step, columns ``sequence`` (an id),
  ``time`` (orders the steps of a sequence), the features, optionally ``split`` and known-input
  columns named ``u_<name>``; without a ``split`` column the sequences are split by
  :func:`seeded_split`.

Every reader returns ``{split: [x_0, ...]}`` of ``float32`` tensors ``(T_i, D)`` (a
:class:`~pyro_seq.data.SequenceList` with the inputs when the file has them) and refuses a
missing value (NaN or an empty cell) with a message saying how the package handles missing
data: it trains on complete sequences only; ``observed=`` masks and
:func:`pyro_seq.tasks.impute` score and fill missing values with a trained model. Nothing is
unpickled and nothing is downloaded. :func:`write_data_file` writes any of the three.
"""

from __future__ import annotations

import csv
import math
import os
import re
from pathlib import Path
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from pyro_seq.ops.padding import SequenceList, inputs_of

__all__ = [
    "CSV_INPUT_PREFIX",
    "DATA_FILE_SUFFIXES",
    "PT_FORMAT",
    "describe_data_formats",
    "is_data_file",
    "read_csv",
    "read_data_file",
    "read_npz",
    "read_pt",
    "seeded_split",
    "write_data_file",
]

#: The file suffixes :func:`read_data_file` reads (case-insensitive).
DATA_FILE_SUFFIXES = (".npz", ".pt", ".csv")
#: Columns of a long-format CSV whose name starts with this prefix are known inputs.
CSV_INPUT_PREFIX = "u_"
#: The ``format`` entry of a ``.pt`` dataset written by :func:`write_data_file`.
PT_FORMAT = "pyro_seq.dataset/1"
#: The default fractions of :func:`seeded_split` (validation, test) and its default seed.
DEFAULT_VALID_FRACTION, DEFAULT_TEST_FRACTION, DEFAULT_SPLIT_SEED = 0.1, 0.1, 0

PathLike = Union[str, "os.PathLike[str]"]
Splits = Dict[str, List[torch.Tensor]]

_NPZ_KEY = re.compile(r"^(inputs_)?([A-Za-z][A-Za-z0-9]*)_(\d+)$")
_MISSING_TOKENS = {"", "na", "n/a", "nan", "null", "none"}


def describe_data_formats() -> str:
    """The file formats of ``--data`` in a few sentences (for the command line's help)."""
    return (
        "your own sequences as a file: .npz (read without pickles) with one (T_i, D) array per "
        "sequence named train_0, train_1, ..., valid_0, ..., test_0, ... and optional known "
        "inputs inputs_train_0, ...; a .pt file written by pyro_seq.data.save_dataset; or .csv in "
        f"long format, one row per step with columns sequence, time, the features, optional "
        f"split (train/valid/test) and known inputs named {CSV_INPUT_PREFIX}*, split "
        f"{1 - DEFAULT_VALID_FRACTION - DEFAULT_TEST_FRACTION:g}/{DEFAULT_VALID_FRACTION:g}/"
        f"{DEFAULT_TEST_FRACTION:g} by seed {DEFAULT_SPLIT_SEED} without a split column; "
        "values are read as float32 and a missing value (NaN, empty cell) is refused"
    )


def is_data_file(path: PathLike) -> bool:
    """Whether ``path`` ends in one of :data:`DATA_FILE_SUFFIXES` (any case)."""
    return os.fspath(path).lower().endswith(DATA_FILE_SUFFIXES)


def read_data_file(path: PathLike, splits: Sequence[str], **options: Any) -> Splits:
    """The ``splits`` of a ``.npz``, ``.pt`` or ``.csv`` file, by its suffix.

    Args:
        path: the file.
        splits: which splits to return; a split the file does not hold comes back empty.
        **options: for a CSV only: ``valid_fraction``, ``test_fraction``, ``seed`` of
            :func:`seeded_split`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file does not follow its format's layout, or holds a missing value.
        TypeError: ``options`` for a ``.npz`` or ``.pt`` file.
    """
    name = os.fspath(path)
    if not os.path.exists(name):
        raise FileNotFoundError(f"no dataset file {name!r}")
    suffix = Path(name).suffix.lower()
    if suffix == ".csv":
        return read_csv(name, splits, **options)
    if options:
        raise TypeError(f"unexpected arguments {sorted(options)} for a {suffix} dataset")
    if suffix == ".npz":
        return read_npz(name, splits)
    if suffix == ".pt":
        return read_pt(name, splits)
    raise ValueError(f"{name}: not a data file; the suffix must be one of {DATA_FILE_SUFFIXES}")


# ------------------------------------------------------------------ checks shared by the readers


def _missing_value(path: str, where: str) -> ValueError:
    return ValueError(
        f"{path}: {where} is a missing value (NaN or empty); pyro_seq trains only on complete "
        "sequences, so fill or drop it before loading (cut the sequence at the gap, or "
        "interpolate); a trained model scores incomplete batches with observed= masks "
        "(False where missing) and fills them with pyro_seq.tasks.impute"
    )


def _as_sequence(path: str, where: str, array: Any, inputs: bool = False) -> torch.Tensor:
    """One sequence (or its inputs) as a ``float32`` tensor ``(T, D)``, checked: numeric, 2-D,
    not empty, finite (a NaN is a missing value)."""
    if torch.is_tensor(array):  # via float32: numpy has no bfloat16
        array = array.detach().cpu()
        array = (array.float() if array.is_floating_point() else array).numpy()
    a = np.asarray(array)
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{path}: {where} has dtype {a.dtype}; a sequence must hold numbers")
    if a.ndim != 2 or 0 in a.shape:
        hint = " (one feature: write x[:, None])" if a.ndim == 1 else ""
        raise ValueError(
            f"{path}: {where} has shape {a.shape}; a sequence must be a non-empty (T, "
            f"{'U' if inputs else 'D'}) array{hint}"
        )
    a = a.astype(np.float32)
    bad = ~np.isfinite(a)
    if bad.any():
        t, d = (int(i) for i in np.argwhere(bad)[0])
        spot = f"{where} step {t} {'input' if inputs else 'feature'} {d}"
        if np.isnan(a[t, d]):
            raise _missing_value(path, spot)
        raise ValueError(f"{path}: {spot} is infinite; every value must be finite")
    return torch.from_numpy(a)


def _assemble(
    path: str,
    found: Dict[str, List[torch.Tensor]],
    found_inputs: Dict[str, List[torch.Tensor]],
    splits: Sequence[str],
) -> Splits:
    """``{split: sequences}`` for the requested ``splits`` (empty when absent), one feature size
    throughout, inputs for every split or none, as long as their sequences."""
    if found_inputs and set(found_inputs) != set(found):
        raise ValueError(
            f"{path}: known inputs for splits {sorted(found_inputs)} but sequences for "
            f"{sorted(found)}; give inputs for every split or for none"
        )
    first: Optional[Tuple[str, int, int, int]] = None  # split, index, D, U
    for split, seqs in found.items():
        inputs = found_inputs.get(split)
        for i, x in enumerate(seqs):
            u_dim = 0 if inputs is None else int(inputs[i].shape[1])
            if first is None:
                first = (split, i, int(x.shape[1]), u_dim)
            elif (int(x.shape[1]), u_dim) != first[2:]:
                raise ValueError(
                    f"{path}: {split}[{i}] has {x.shape[1]} features and {u_dim} inputs per "
                    f"step, {first[0]}[{first[1]}] has {first[2]} and {first[3]}; every "
                    "sequence needs the same"
                )
            if inputs is not None and inputs[i].shape[0] != x.shape[0]:
                raise ValueError(
                    f"{path}: {split}[{i}] has {x.shape[0]} steps but its inputs have "
                    f"{inputs[i].shape[0]}; give one input row per step"
                )
    out: Splits = {}
    for split in splits:
        seqs = found.get(split, [])
        inputs = found_inputs.get(split)
        out[split] = SequenceList(seqs, inputs) if inputs is not None else list(seqs)
    return out


# ------------------------------------------------------------------ .npz


def read_npz(path: PathLike, splits: Sequence[str]) -> Splits:
    """A ``.npz`` archive (``numpy.load(path, allow_pickle=False)``): array ``<split>_<i>`` is
    sequence ``i`` ``(T_i, D)`` of that split (``i = 0, 1, ...`` without gaps; split names are
    letters and digits), ``inputs_<split>_<i>`` its known inputs ``(T_i, U)`` (for every
    sequence or for none). Any other array name is refused, so nothing is silently ignored.
    Write one with ``numpy.savez(path, train_0=x0, train_1=x1, valid_0=x2)``."""
    name = os.fspath(path)
    try:
        archive = np.load(name, allow_pickle=False)
    except Exception as e:  # not a zip archive, truncated, or a single .npy
        raise ValueError(
            f"{name} is not a readable .npz archive ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{name} holds one array, not a .npz archive of named sequences")
    keyed: Dict[Tuple[bool, str], Dict[int, np.ndarray]] = {}
    with archive:
        for key in archive.files:
            m = _NPZ_KEY.match(key)
            if m is None or m.group(2) == "inputs":
                raise ValueError(
                    f"{name}: array {key!r} is not named <split>_<i> (e.g. train_0) or "
                    "inputs_<split>_<i> (e.g. inputs_train_0); rename or remove it"
                )
            try:
                value = archive[key]
            except ValueError as e:  # object arrays need pickles
                raise ValueError(
                    f"{name}: array {key!r} cannot be read without pickles ({e})"
                ) from None
            keyed.setdefault((m.group(1) is not None, m.group(2)), {})[int(m.group(3))] = value
    found: Dict[str, List[torch.Tensor]] = {}
    found_inputs: Dict[str, List[torch.Tensor]] = {}
    for (is_input, split), arrays in sorted(keyed.items()):
        stem = f"inputs_{split}" if is_input else split
        gap = next(i for i in range(len(arrays) + 1) if i not in arrays)
        if gap != len(arrays):
            raise ValueError(
                f"{name}: {stem}_{max(arrays)} is there but {stem}_{gap} is not; number the "
                f"sequences of a split 0, 1, 2, ... without gaps"
            )
        target = found_inputs if is_input else found
        target[split] = [
            _as_sequence(name, f"{stem}_{i}", arrays[i], inputs=is_input)
            for i in range(len(arrays))
        ]
    for split, inputs in found_inputs.items():
        if len(inputs) != len(found.get(split, [])):
            raise ValueError(
                f"{name}: {len(inputs)} arrays inputs_{split}_<i> for "
                f"{len(found.get(split, []))} sequences {split}_<i>; give one per sequence"
            )
    return _assemble(name, found, found_inputs, splits)


# ------------------------------------------------------------------ .pt


def read_pt(path: PathLike, splits: Sequence[str]) -> Splits:
    """A file written by :func:`~pyro_seq.data.save_dataset` (``torch.load`` with
    ``weights_only=True``: tensors, lists and dicts only, no code)."""
    name = os.fspath(path)
    try:
        payload = torch.load(name, weights_only=True, map_location="cpu")
    except Exception as e:  # truncated or not a torch file: say which and what to do
        raise ValueError(
            f"{name} is not a dataset written by pyro_seq.data.save_dataset "
            f"({type(e).__name__}: {e})"
        ) from None
    if not (isinstance(payload, dict) and payload.get("format") == PT_FORMAT):
        raise ValueError(f"{name} is not a dataset written by pyro_seq.data.save_dataset")
    found: Dict[str, List[torch.Tensor]] = {}
    found_inputs: Dict[str, List[torch.Tensor]] = {}
    for target, entry in ((found, "splits"), (found_inputs, "inputs")):
        for split, seqs in payload.get(entry, {}).items():
            for i, s in enumerate(seqs):
                if not (torch.is_tensor(s) and s.dim() == 2 and s.is_floating_point()):
                    raise ValueError(f"{name}: {split}[{i}] is not a floating (T, D) tensor")
            label = "inputs " if entry == "inputs" else ""
            target[split] = [
                _as_sequence(name, f"{label}{split}[{i}]", s, inputs=bool(label))
                for i, s in enumerate(seqs)
            ]
    return _assemble(name, found, found_inputs, splits)


# ------------------------------------------------------------------ .csv


def seeded_split(
    ids: Sequence[Hashable],
    valid_fraction: float = DEFAULT_VALID_FRACTION,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    seed: int = DEFAULT_SPLIT_SEED,
) -> Dict[str, List[Hashable]]:
    """Split sequence ``ids`` into train, valid and test, reproducibly from ``seed``.

    With ``N = len(ids)``, ``floor(valid_fraction * N + 1/2)`` ids go to ``"valid"``,
    ``floor(test_fraction * N + 1/2)`` to ``"test"`` and the rest (at least one) to ``"train"``,
    drawn by ``torch.randperm(N)`` under ``torch.Generator().manual_seed(seed)``; each split
    keeps the order of ``ids``. What :func:`read_csv` does for a file without a ``split``
    column, so ``seeded_split(ids_in_file_order)`` says where each sequence went.

    Raises:
        ValueError: a fraction outside ``[0, 1)``, fractions summing to 1 or more, or no id left
            for training.
    """
    for label, f in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not (isinstance(f, (int, float)) and 0 <= f < 1):
            raise ValueError(f"{label} must be a number in [0, 1), got {f!r}")
    n = len(ids)
    n_valid = int(math.floor(valid_fraction * n + 0.5))
    n_test = int(math.floor(test_fraction * n + 0.5))
    if n - n_valid - n_test < 1:
        raise ValueError(
            f"valid_fraction {valid_fraction} and test_fraction {test_fraction} of {n} "
            "sequences leave none for training; lower them or give a split column"
        )
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).tolist()
    chosen = {"valid": perm[:n_valid], "test": perm[n_valid : n_valid + n_test]}
    chosen["train"] = perm[n_valid + n_test :]
    return {split: [ids[i] for i in sorted(chosen[split])] for split in ("train", "valid", "test")}


def _number(path: str, line: int, column: str, text: str) -> float:
    if text.strip().lower() in _MISSING_TOKENS:
        raise _missing_value(path, f"line {line} column {column!r}")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(
            f"{path}: line {line} column {column!r} holds {text!r}, not a number"
        ) from None
    if math.isnan(value):
        raise _missing_value(path, f"line {line} column {column!r}")
    return value


def read_csv(
    path: PathLike,
    splits: Sequence[str],
    valid_fraction: float = DEFAULT_VALID_FRACTION,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    seed: int = DEFAULT_SPLIT_SEED,
) -> Splits:
    """A CSV in long format: a header, then one row per step of a sequence.

    Columns: ``sequence`` (the id of the sequence the row belongs to, any text), ``time`` (a
    number that orders the steps of a sequence; unique within it, rows may come in any order;
    the models assume equally spaced steps), optionally ``split`` (the sequence's split, the
    same on each of its rows), optionally known inputs named ``u_<name>``
    (:data:`CSV_INPUT_PREFIX`), and the features: every other column, in header order. The
    sequences come in the order of their first row. Without a ``split`` column they are split
    by :func:`seeded_split` (``valid_fraction``, ``test_fraction``, ``seed``) over the ids in
    that order.
    """
    name = os.fspath(path)
    with open(name, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        rows = [(reader.line_num, row) for row in reader if any(c.strip() for c in row)]
    if len(set(header)) != len(header):
        dup = sorted({h for h in header if header.count(h) > 1})
        raise ValueError(f"{name}: the header names columns {dup} more than once")
    for required in ("sequence", "time"):
        if required not in header:
            raise ValueError(
                f"{name}: no {required!r} column; the header must name sequence, time, the "
                f"features and optionally split and known inputs {CSV_INPUT_PREFIX}*, got "
                f"{header}"
            )
    reserved = {"sequence", "time", "split"}
    inputs = [h for h in header if h.startswith(CSV_INPUT_PREFIX)]
    features = [h for h in header if h not in reserved and h not in inputs]
    if not features:
        raise ValueError(f"{name}: no feature column besides {sorted(reserved)} and inputs")
    col = {h: j for j, h in enumerate(header)}
    steps: Dict[str, List[Tuple[float, int, List[float], List[float]]]] = {}
    split_of: Dict[str, str] = {}
    for line, row in rows:
        if len(row) != len(header):
            raise ValueError(f"{name}: line {line} has {len(row)} fields, the header {len(header)}")
        seq = row[col["sequence"]].strip()
        if not seq:
            raise ValueError(f"{name}: line {line} has an empty sequence id")
        if "split" in col:
            split = row[col["split"]].strip()
            if not split:
                raise ValueError(f"{name}: line {line} has an empty split")
            if split_of.setdefault(seq, split) != split:
                raise ValueError(
                    f"{name}: sequence {seq!r} is in split {split_of[seq]!r} and, on line "
                    f"{line}, {split!r}; a sequence belongs to one split"
                )
        time = _number(name, line, "time", row[col["time"]])
        x = [_number(name, line, h, row[col[h]]) for h in features]
        u = [_number(name, line, h, row[col[h]]) for h in inputs]
        steps.setdefault(seq, []).append((time, line, x, u))
    if not steps:
        raise ValueError(f"{name}: no rows after the header")
    if "split" not in col:
        assigned = seeded_split(list(steps), valid_fraction, test_fraction, seed)
        split_of = {str(seq): split for split, seqs in assigned.items() for seq in seqs}
    found: Dict[str, List[torch.Tensor]] = {}
    found_inputs: Dict[str, List[torch.Tensor]] = {}
    for seq, rows_of in steps.items():
        rows_of.sort(key=lambda r: r[0])
        for a, b in zip(rows_of, rows_of[1:]):
            if a[0] == b[0]:
                raise ValueError(
                    f"{name}: sequence {seq!r} has time {a[0]:g} on lines {a[1]} and {b[1]}; "
                    "each step of a sequence needs its own time"
                )
        split = split_of[seq]
        found.setdefault(split, []).append(torch.tensor([r[2] for r in rows_of]).float())
        if inputs:
            found_inputs.setdefault(split, []).append(torch.tensor([r[3] for r in rows_of]).float())
    return _assemble(name, found, found_inputs, splits)


# ------------------------------------------------------------------ writers


def write_data_file(path: PathLike, splits: Dict[str, Sequence[torch.Tensor]]) -> None:
    """Write ``{split: [x_0, ...]}`` (tensors or arrays ``(T_i, D)``; a
    :class:`~pyro_seq.data.SequenceList` with inputs in every split or none) in the format of
    ``path``'s suffix, as the readers above read it: ``.npz`` arrays ``<split>_<i>``, a ``.pt``
    dict, or a long CSV with columns ``sequence`` (``<split>_<i>``), ``split``, ``time``
    (``0, 1, ...``), ``x_0, ...`` and ``u_0, ...``."""
    name = os.fspath(path)
    if not is_data_file(name):
        raise ValueError(f"a dataset file must end in one of {DATA_FILE_SUFFIXES}, got {name!r}")
    names = [str(s) for s in splits]
    for split in names:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", split) or split == "inputs":
            raise ValueError(f"split name {split!r} must be letters and digits (e.g. train)")
    seqs = {s: [torch.as_tensor(x).detach().cpu() for x in v] for s, v in splits.items()}
    inputs = {
        s: [u.detach().cpu() for u in inputs_of(v) or []]
        for s, v in splits.items()
        if inputs_of(v) is not None
    }
    if inputs and set(inputs) != set(seqs):
        raise ValueError("known inputs must be given for every split or for none")
    suffix = Path(name).suffix.lower()
    if suffix == ".pt":
        torch.save({"format": PT_FORMAT, "splits": seqs, "inputs": inputs}, name)
    elif suffix == ".npz":
        arrays = {f"{s}_{i}": x.numpy() for s, v in seqs.items() for i, x in enumerate(v)}
        arrays.update(
            {f"inputs_{s}_{i}": u.numpy() for s, v in inputs.items() for i, u in enumerate(v)}
        )
        np.savez(name, **arrays)  # type: ignore[arg-type]
    else:
        _write_csv(name, seqs, inputs)


def _write_csv(
    path: str, seqs: Dict[str, List[torch.Tensor]], inputs: Dict[str, List[torch.Tensor]]
) -> None:
    first = next((x for v in seqs.values() for x in v), None)
    if first is None:
        raise ValueError("no sequence to write")
    D = int(first.shape[-1])
    U = int(next((u for v in inputs.values() for u in v), torch.zeros(0, 0)).shape[-1])
    header = ["sequence", "split", "time"] + [f"x_{d}" for d in range(D)]
    header += [f"{CSV_INPUT_PREFIX}{k}" for k in range(U)]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for split, v in seqs.items():
            for i, x in enumerate(v):
                u = inputs[split][i] if inputs else x.new_zeros(x.shape[0], 0)
                for t in range(x.shape[0]):  # repr: the shortest text that reads back exactly
                    values = [repr(float(a)) for a in x[t].tolist() + u[t].tolist()]
                    writer.writerow([f"{split}_{i}", split, t] + values)
