"""One entry point for every dataset (piano rolls and JapaneseVowels): :func:`load_dataset`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Sequence, Union

import torch

from .chorales import cache_dir, load_chorales
from .files import is_data_file, read_data_file, write_data_file
from .japanese_vowels import load_japanese_vowels
from .piano_roll import DEFAULT_SPLITS, load_piano_rolls

__all__ = ["NAMED_PICKLES", "NAVIGATION", "SIMULATED", "load_dataset", "save_dataset"]

#: Simulated video environments (:mod:`pyro_seq.data.simulators`), loaded by name.
SIMULATED = ("box", "box_gravity", "polygon", "pong", "pendulum")

#: The image navigation environment of the GTM-SM (:func:`~pyro_seq.data.simulators.image_navigation`),
#: loaded by name with the actions packed into the features.
NAVIGATION = ("image_navigation", "image_navigation_obstacles", "image_navigation_colour")

#: Boulanger-Lewandowski piano-roll sets known by name, and their usual file names.
NAMED_PICKLES = {
    "jsb": "jsb_chorales.pickle",
    "jsb_chorales": "jsb_chorales.pickle",
    "jsb_2x": "jsb_chorales_2x.pickle",
    "nottingham": "nottingham.pickle",
    "musedata": "musedata.pickle",
    "piano_midi": "piano_midi.pickle",
}


def _search_dirs() -> List[Path]:
    dirs: List[Path] = []
    env = os.environ.get("PYRO_SEQ_DATA")
    if env:
        dirs.extend(Path(d).expanduser() for d in env.split(os.pathsep) if d)
    dirs.append(cache_dir())
    return dirs


def load_dataset(
    name_or_path: Union[str, "os.PathLike[str]"], splits: Sequence[str] = DEFAULT_SPLITS, **kwargs
) -> Dict[str, List[torch.Tensor]]:
    """Load a dataset by name or path.

    Args:
        name_or_path: ``"chorales"``: the built-in music21 Bach chorales
            (:func:`~pyro_seq.data.load_chorales`; not the Boulanger-Lewandowski split);
            ``"japanese_vowels"``: 12 standardised LPC coefficients per frame, bundled with the
            optional ``aeon`` package (:func:`~pyro_seq.data.load_japanese_vowels`);
            a name of :data:`SIMULATED` (``"box"``, ..., ``"pendulum"``): simulated videos
            (:func:`~pyro_seq.data.simulators.simulate`, cached), flattened frames ``(T, H*W)``;
            ``"box:N"`` simulates ``N`` training sequences and ``N // 5`` (at least 1) each for
            validation and test instead of the thesis sizes. ``"pendulum"`` gives the frames
            with the torques as known inputs (a :class:`~pyro_seq.data.SequenceList`, ``(T,
            1)`` per sequence): ``pyro-seq train --model kvae --data pendulum`` trains the
            controlled KVAE of Fraccaro (2018), Table 6.1, and a DMM conditions on them;
            a name of :data:`NAVIGATION`: the GTM-SM's image navigation
            (:func:`~pyro_seq.data.simulators.image_navigation`; ``_obstacles``: with an
            obstacle, ``_colour``: RGB frames), the flattened frames ``(T, 64)`` (``(T, 192)``
            in colour) with the one-hot actions ``(T, 5)`` as known inputs (a
            :class:`~pyro_seq.data.SequenceList`): the ``inputs=`` of
            :class:`~pyro_seq.models.GTMSM` and of its SRNN and VRNN baselines;
            ``"image_navigation:N"`` gives ``N`` training sequences (and ``N // 5``, at least 1,
            for validation and test), ``"image_navigation:N:T"`` also sets their length
            (default 288 = 256 memorisation + 32 prediction steps);
            a name of :data:`NAMED_PICKLES` (``"jsb"``, ``"jsb_2x"``, ``"nottingham"``,
            ``"musedata"``, ``"piano_midi"``): that file looked up in the directories of
            ``$PYRO_SEQ_DATA`` (``os.pathsep``-separated) and then the cache directory
            (nothing is downloaded); the path of a ``.npz``, ``.pt`` or ``.csv`` file (your own
            data: real, binary or count features, with or without known inputs; layouts in
            :mod:`pyro_seq.data.files`, :func:`save_dataset` writes them); anything else: the
            path of a Boulanger-Lewandowski pickle (:func:`~pyro_seq.data.load_piano_rolls`).
        splits: which splits to return (a split a ``.npz``, ``.pt`` or ``.csv`` file does not
            hold comes back empty).
        **kwargs: passed to :func:`~pyro_seq.data.load_chorales` (e.g. ``cache``, ``progress``),
            :func:`~pyro_seq.data.load_japanese_vowels` (e.g. ``valid_fraction``) or, for a CSV
            without a ``split`` column, :func:`~pyro_seq.data.files.seeded_split`
            (``valid_fraction``, ``test_fraction``, ``seed``).

    Returns:
        ``{split: [roll_0, ...]}``, each a ``float32`` 0/1 tensor of shape ``(T_i, 88)``
        (``(T_i, 12)`` real values for ``"japanese_vowels"``, flattened frames for the videos);
        for the data with known inputs a :class:`~pyro_seq.data.SequenceList` per split, whose
        ``inputs`` are the controls or actions.

    Raises:
        FileNotFoundError: a named dataset that is in none of the search directories, or a
            path that does not exist (the message says where it looked).
        ValueError: a ``.npz``, ``.pt`` or ``.csv`` file off its layout, or with a missing
            value (NaN, an empty cell): the package trains on complete sequences only.
    """
    key = os.fspath(name_or_path)
    env, _, count = key.partition(":")
    if env in SIMULATED and not os.path.exists(key):
        return _load_simulated(env, count, splits, **kwargs)
    if env in NAVIGATION and not os.path.exists(key):
        return _load_navigation(env, count, splits, **kwargs)
    if key == "chorales":
        return load_chorales(splits, **kwargs)
    if key == "japanese_vowels":
        return load_japanese_vowels(splits, **kwargs)
    if is_data_file(key):
        return read_data_file(key, splits, **kwargs)
    if kwargs:
        raise TypeError(f"unexpected arguments {sorted(kwargs)} for a piano-roll pickle")
    if key.lower() in NAMED_PICKLES and not os.path.exists(key):
        fname = NAMED_PICKLES[key.lower()]
        dirs = _search_dirs()
        for d in dirs:
            if (d / fname).is_file():
                return load_piano_rolls(d / fname, splits)
        raise FileNotFoundError(
            f"dataset {key!r}: {fname} not found in {[str(d) for d in dirs]}; pass the file's "
            "path instead, or put its directory in $PYRO_SEQ_DATA (nothing is downloaded)"
        )
    if not os.path.exists(key):
        raise FileNotFoundError(
            f"no dataset {key!r}: not 'chorales' or 'japanese_vowels', not one of "
            f"{sorted(NAMED_PICKLES)}, and no such file"
        )
    return load_piano_rolls(key, splits)


def save_dataset(path: Union[str, "os.PathLike[str]"], splits: Dict[str, Sequence[torch.Tensor]]):
    """Write data splits to a file that :func:`load_dataset` (and ``pyro-seq train --data
    PATH``) reads: your own sequences, real-valued or binary, with known inputs when a split is
    a :class:`~pyro_seq.data.SequenceList` that carries them. The format follows the suffix:
    ``.pt``, ``.npz`` or ``.csv`` (:mod:`pyro_seq.data.files` gives each layout).

    Args:
        path: a file name ending in ``.pt``, ``.npz`` or ``.csv``.
        splits: ``{"train": [...], "valid": [...], "test": [...]}`` (any of them), lists of
            ``(T_i, D)`` tensors (or :class:`~pyro_seq.data.SequenceList` with inputs
            ``(T_i, U)``, in every split or none).
    """
    write_data_file(path, splits)


def _load_navigation(env: str, count: str, splits: Sequence[str], **kwargs):
    from .simulators import image_navigation

    sizes: Dict[str, int] = {}
    n_steps: Dict[str, Any] = {}
    if count:
        parts = count.split(":")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = [0]
        if len(values) > 2 or min(values) < 1:
            raise ValueError(
                f"dataset {env}:{count}: expected {env}:N or {env}:N:T with positive ints"
            )
        n = values[0]
        sizes = {"train": n, "valid": max(1, n // 5), "test": max(1, n // 5)}
        if len(values) == 2:
            n_steps = {"num_steps": values[1]}
    flags: Dict[str, Any] = {
        "obstacles": env.endswith("_obstacles"),
        "colour": env.endswith("_colour"),
    }
    return {
        split: image_navigation(
            sizes.get(split), split=split, **flags, **n_steps, **kwargs
        ).as_sequences()
        for split in splits
    }


def _load_simulated(env: str, count: str, splits: Sequence[str], **kwargs):
    from .simulators import simulate

    sizes = {}
    if count:
        try:
            n = int(count)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"dataset {env}:{count}: the count after ':' must be a positive int")
        sizes = {"train": n, "valid": max(1, n // 5), "test": max(1, n // 5)}
    return {
        split: simulate(env, sizes.get(split), split=split, **kwargs).as_sequences()
        for split in splits
    }
