"""JapaneseVowels: a small real-valued multivariate sequence test bed, with no download.

The UCI Japanese Vowels data (Kudo, Toyama and Shimbo 1999): nine male speakers utter the
vowel pair /ae/; each utterance is a sequence of 12 LPC cepstrum coefficients, 7 to 29 frames
long. The UEA archive split has 270 training utterances (30 per speaker) and 370 test
utterances. The ``aeon`` package bundles that split as ``.ts`` files inside its wheel
(``aeon/datasets/data/JapaneseVowels``); :func:`load_japanese_vowels` reads those files with
``aeon.datasets.load_from_ts_file`` straight from the installed package, so nothing is ever
downloaded. ``aeon`` is an optional dependency: ``pip install pyro-seq[data]``.

Validation split (deterministic, stratified by speaker): within each speaker's training
utterances (file order ``i``), the ``round(valid_fraction * n_speaker)`` utterances with the
smallest SHA-256 of ``f"JapaneseVowels/train/{i}"`` go to ``"valid"``, the rest stay in
``"train"``. Within a split, sequences keep the order of the file.

Standardisation (per coefficient ``d``, over every frame of every sequence of the final
``"train"`` split, ``N`` frames in all)::

    m_d = (1/N) sum_{i,t} x_itd,    s_d^2 = (1/N) sum_{i,t} (x_itd - m_d)^2              (1)
    x'_itd = (x_itd - m_d) / s_d                     (applied to every split)           (2)

so that the training frames have mean 0 and (population) standard deviation 1 per coefficient.
"""

from __future__ import annotations

import hashlib
import os
from typing import Dict, List, Sequence, Tuple, Union

import torch

from .piano_roll import DEFAULT_SPLITS

__all__ = ["JAPANESE_VOWELS_DIM", "load_japanese_vowels"]

JAPANESE_VOWELS_DIM = 12  #: LPC coefficients per frame
_INSTALL_HINT = "pip install pyro-seq[data]"
_SPLITS = ("train", "valid", "test")


def _read_ts_files() -> Dict[str, Tuple[List[torch.Tensor], List[str]]]:
    """The bundled UEA files: ``{"train"|"test": ([x_i (T_i, 12) float64], [speaker_i])}``."""
    try:
        import aeon.datasets
        from aeon.datasets import load_from_ts_file
    except ImportError as err:
        raise ImportError(
            "load_japanese_vowels reads the JapaneseVowels files bundled with the optional "
            f"dependency 'aeon', which is not installed: {_INSTALL_HINT}"
        ) from err
    folder = os.path.join(os.path.dirname(aeon.datasets.__file__), "data", "JapaneseVowels")
    out = {}
    for split, fname in (("train", "JapaneseVowels_TRAIN.ts"), ("test", "JapaneseVowels_TEST.ts")):
        path = os.path.join(folder, fname)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path} is missing: this aeon installation does not bundle JapaneseVowels "
                f"(nothing is downloaded); reinstall it with {_INSTALL_HINT}"
            )
        data, labels = load_from_ts_file(path)
        seqs = [torch.as_tensor(x, dtype=torch.float64).T.contiguous() for x in data]
        out[split] = (seqs, [str(y) for y in labels])
    return out


def _valid_indices(labels: Sequence[str], valid_fraction: float) -> List[int]:
    """Training indices carved out for validation (stratified, hash-ordered; module docstring)."""
    chosen = []
    for speaker in sorted(set(labels)):
        idx = [i for i, y in enumerate(labels) if y == speaker]
        idx.sort(key=lambda i: hashlib.sha256(f"JapaneseVowels/train/{i}".encode()).hexdigest())
        chosen.extend(idx[: round(valid_fraction * len(idx))])
    return sorted(chosen)


def load_japanese_vowels(
    splits: Union[str, Sequence[str]] = DEFAULT_SPLITS,
    valid_fraction: float = 0.1,
    standardize: bool = True,
    return_stats: bool = False,
):
    """Load JapaneseVowels as ragged real-valued sequences (see the module docstring).

    Args:
        splits: which of ``"train"``, ``"valid"``, ``"test"`` to return (a name or a sequence).
        valid_fraction: fraction of each speaker's training utterances moved to ``"valid"``,
            in ``[0, 1)`` (0.1: 27 of 270; 0: an empty ``"valid"``).
        standardize: apply eq. (2) with the statistics (1) of the final ``"train"`` split.
        return_stats: also return ``{"mean": (12,), "std": (12,)}`` (float64; eq. 1; computed
            also when ``standardize`` is False); ``x = x' * std + mean`` undoes eq. (2).

    Returns:
        ``{split: [x_0, ...]}``, each ``x_i`` a ``float32`` tensor of shape ``(T_i, 12)``,
        ``7 <= T_i <= 29``; with ``return_stats``, the pair ``(data, stats)``.

    Raises:
        ImportError: ``aeon`` is not installed (``pip install pyro-seq[data]``).
        ValueError: an unknown split or a ``valid_fraction`` outside ``[0, 1)``.
    """
    if isinstance(splits, str):
        splits = (splits,)
    unknown = [s for s in splits if s not in _SPLITS]
    if unknown:
        raise ValueError(f"unknown split(s) {unknown}; JapaneseVowels has {list(_SPLITS)}")
    if not 0 <= valid_fraction < 1:
        raise ValueError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    raw = _read_ts_files()
    train_seqs, train_labels = raw["train"]
    valid_idx = set(_valid_indices(train_labels, valid_fraction))
    parts = {
        "train": [x for i, x in enumerate(train_seqs) if i not in valid_idx],
        "valid": [x for i, x in enumerate(train_seqs) if i in valid_idx],
        "test": raw["test"][0],
    }
    frames = torch.cat(parts["train"], 0)
    mean = frames.mean(0)
    std = frames.std(0, correction=0)
    if not (std > 0).all():
        raise ValueError("a JapaneseVowels coefficient is constant over the training frames")
    data = {}
    for split in splits:
        seqs = [(x - mean) / std if standardize else x for x in parts[split]]
        data[split] = [x.to(torch.float32) for x in seqs]
    if return_stats:
        return data, {"mean": mean, "std": std}
    return data
