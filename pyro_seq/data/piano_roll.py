"""Piano-roll datasets in the Boulanger-Lewandowski et al. (2012) pickle format.

The format (used by JSB Chorales, Nottingham, MuseData and Piano-midi.de): a pickled ``dict``
with keys ``"train"``, ``"valid"`` and ``"test"``; each value is a list of sequences; each
sequence is a list of time steps; each time step is a tuple (or list) of the MIDI note numbers
sounding at that step, an empty tuple being silence. MIDI notes 21 (A0) .. 108 (C8) are the 88
piano keys and map to roll columns 0 .. 87.

Files are read with the restricted unpickler of :mod:`pyro_seq.data.safe_pickle`, so a
malicious file cannot run code.
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Dict, Iterable, List, Sequence, Tuple, Union

import numpy as np
import torch

from .safe_pickle import safe_load

__all__ = [
    "LOWEST_NOTE",
    "HIGHEST_NOTE",
    "NUM_KEYS",
    "DEFAULT_SPLITS",
    "notes_to_roll",
    "roll_to_notes",
    "load_piano_rolls",
]

LOWEST_NOTE = 21  #: MIDI number of the lowest piano key (A0), roll column 0
HIGHEST_NOTE = 108  #: MIDI number of the highest piano key (C8), roll column 87
NUM_KEYS = HIGHEST_NOTE - LOWEST_NOTE + 1  #: 88
DEFAULT_SPLITS = ("train", "valid", "test")

PathLike = Union[str, "os.PathLike[str]"]


def _as_note(n: Any, where: str) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Real):
        raise ValueError(
            f"{where}: note {n!r} of type {type(n).__name__} is not a MIDI note number"
        )
    if isinstance(n, numbers.Integral):
        v = int(n)
    else:
        f = float(n)
        if not f.is_integer():
            raise ValueError(f"{where}: note {n!r} is not an integer MIDI note number")
        v = int(f)
    if not LOWEST_NOTE <= v <= HIGHEST_NOTE:
        raise ValueError(
            f"{where}: note {v} is outside the piano range {LOWEST_NOTE}..{HIGHEST_NOTE}"
        )
    return v


def notes_to_roll(steps: Sequence[Iterable[Any]], *, where: str = "sequence") -> torch.Tensor:
    """Turn a sequence of note tuples into a binary piano roll.

    Args:
        steps: length-``T`` sequence; ``steps[t]`` is an iterable of MIDI note numbers in
            21..108 sounding at step ``t`` (empty for silence). ``T`` must be at least 1.
        where: how error messages name this sequence (e.g. ``"split 'train', sequence 3"``).

    Returns:
        ``float32`` tensor of shape ``(T, 88)`` with ``roll[t, n - 21] = 1`` for every note ``n``
        of ``steps[t]`` and 0 elsewhere.

    Raises:
        ValueError: empty sequence, a step that is not a collection of notes, or a note that is
            not an integer in 21..108 (the message names the step and the note).
    """
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise ValueError(
            f"{where}: expected a list of time steps (tuples of MIDI notes), got {type(steps).__name__}"
        )
    if len(steps) == 0:
        raise ValueError(f"{where}: empty sequence (0 time steps)")
    roll = np.zeros((len(steps), NUM_KEYS), dtype=np.float32)
    for t, step in enumerate(steps):
        if isinstance(step, (str, bytes, dict)) or not isinstance(
            step, (tuple, list, set, frozenset)
        ):
            raise ValueError(
                f"{where}, step {t}: expected a tuple of MIDI notes, got {type(step).__name__} {step!r}"
            )
        for n in step:
            roll[t, _as_note(n, f"{where}, step {t}") - LOWEST_NOTE] = 1.0
    return torch.from_numpy(roll)


def roll_to_notes(roll: Union[torch.Tensor, np.ndarray]) -> List[Tuple[int, ...]]:
    """Inverse of :func:`notes_to_roll`.

    Args:
        roll: ``(T, 88)`` tensor or array of 0/1 values.

    Returns:
        list of ``T`` tuples; ``result[t]`` holds the MIDI numbers ``21 + k`` of the columns ``k``
        where ``roll[t, k] == 1``, in increasing order.

    Raises:
        ValueError: wrong shape, or values other than 0 and 1.
    """
    r = roll.detach().cpu().numpy() if isinstance(roll, torch.Tensor) else np.asarray(roll)
    if r.ndim != 2 or r.shape[1] != NUM_KEYS:
        raise ValueError(f"piano roll must have shape (T, {NUM_KEYS}), got {tuple(r.shape)}")
    if not np.isin(r, (0, 1)).all():
        raise ValueError("piano roll must contain only 0 and 1 (found other values, or NaN)")
    return [tuple(int(k) + LOWEST_NOTE for k in np.flatnonzero(row)) for row in r]


def load_piano_rolls(
    path: PathLike, splits: Sequence[str] = DEFAULT_SPLITS
) -> Dict[str, List[torch.Tensor]]:
    """Load a Boulanger-Lewandowski piano-roll pickle (JSB Chorales, Nottingham, ...).

    Args:
        path: the ``.pickle`` file.
        splits: which splits to return (each must be a key of the pickled dict).

    Returns:
        ``{split: [roll_0, roll_1, ...]}`` in file order, each ``roll_i`` a ``float32`` tensor of
        shape ``(T_i, 88)`` with entries 0/1 (MIDI note ``n`` in column ``n - 21``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        pyro_seq.data.UnsafePickleError: the pickle references anything but data types.
        KeyError: a requested split is missing (the message lists the available ones).
        ValueError: wrong structure, empty sequence, or a note outside 21..108; the message
            names the split, the sequence index and the step.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"piano-roll file not found: {path}")
    data = safe_load(path)
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a dict with splits {list(DEFAULT_SPLITS)}, got {type(data).__name__}"
        )
    if isinstance(splits, str):
        splits = (splits,)
    out: Dict[str, List[torch.Tensor]] = {}
    for split in splits:
        if split not in data:
            raise KeyError(
                f"{path}: missing split {split!r}; the file has splits {sorted(map(str, data))}"
            )
        seqs = data[split]
        if not isinstance(seqs, (list, tuple)):
            raise ValueError(
                f"{path}: split {split!r} must be a list of sequences, got {type(seqs).__name__}"
            )
        if len(seqs) == 0:
            raise ValueError(f"{path}: split {split!r} has no sequences")
        out[split] = [
            notes_to_roll(s, where=f"{path}: split {split!r}, sequence {i}")
            for i, s in enumerate(seqs)
        ]
    return out
