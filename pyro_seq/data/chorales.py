"""Built-in default data: the Bach chorales bundled with music21, as 88-key piano rolls.

This needs no download: music21 ships about 410 Bach chorale scores (MusicXML) in its corpus.
:func:`load_chorales` turns them into piano rolls at quarter-note resolution with a
deterministic train/valid/test split and caches the result (a ``.pt`` file of plain tensors) in
a user cache directory, ``$PYRO_SEQ_CACHE`` if set, else ``~/.cache/pyro_seq``. The first build
parses every score, serially: about 40 s of CPU time (1-1.5 min wall time on a busy 2-core
machine); later calls load the cache in about 0.1 s.

.. warning::
   This is **not** the JSB Chorales split of Boulanger-Lewandowski et al. (2012) (229/76/77
   sequences): the set of chorales, their encoding and the split all differ, so likelihoods
   measured on it are **not comparable to published numbers**. For published comparisons load
   ``jsb_chorales.pickle`` with :func:`pyro_seq.data.load_piano_rolls`.

Conversion (:func:`score_to_piano_roll`):

* parts: the vocal parts, i.e. those whose name starts with Soprano, Alto, Tenor or Bass
  (instrumental doublings, descants, timpani and continuo are left out); scores without vocal
  parts (one keyboard piece in the corpus) are skipped. A few chorales have five voices.
* time: step ``t`` covers quarter-note beat ``t`` counted from the start of the score (a pickup
  measure starts at 0); a key is on at step ``t`` when a note of that pitch sounds at the
  instant ``t`` (in quarter notes), so shorter ornamental notes between beats are dropped, as
  in the usual quarter-note sampling. Ties and held notes simply stay on. Repeats are not
  expanded. Silence before the first and after the last note is removed, and a silent stretch
  longer than 4 steps (an orchestral interlude while the voices rest, in the cantata and
  oratorio movements) is shortened to 4 steps.
* pitch: MIDI number ``n`` to column ``n - 21``; no transposition.

Split: files are grouped by chorale number (``bwv248.9-1`` and ``bwv248.9-s`` are one group so
that versions of one chorale never straddle splits); a group goes to train / valid / test when
the first 8 hex digits of the SHA-256 of its name, divided by ``2**32``, are below 0.6 / 0.8 /
1.0. This is stable under additions to the corpus. Scores whose roll is identical to an earlier
one (in sorted path order) are dropped. Within a split, sequences are sorted by corpus path.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from .piano_roll import DEFAULT_SPLITS, LOWEST_NOTE, NUM_KEYS

__all__ = [
    "cache_dir",
    "chorale_paths",
    "chorale_split",
    "score_to_piano_roll",
    "build_chorales",
    "load_chorales",
]

CACHE_FORMAT = 1  #: bump when the conversion changes, so that old caches are rebuilt
SPLIT_FRACTIONS = (0.6, 0.2, 0.2)  #: train / valid / test, as in JSB (229/76/77 of 382)
_VOICES = ("soprano", "alto", "tenor", "bass")
_SCORE_SUFFIXES = (".mxl", ".xml", ".musicxml")


def cache_dir() -> Path:
    """The cache directory: ``$PYRO_SEQ_CACHE`` if set, else ``~/.cache/pyro_seq``."""
    env = os.environ.get("PYRO_SEQ_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pyro_seq"


def _music21_version() -> str:
    import music21

    return str(music21.__version__)


def _cache_file(directory: Path) -> Path:
    return directory / f"chorales-v{CACHE_FORMAT}-music21-{_music21_version()}.pt"


def chorale_paths() -> List[Path]:
    """The Bach chorale score files of music21's corpus, sorted by corpus path.

    Returns:
        absolute paths of the ``.mxl``/``.xml`` files of ``music21.corpus.getComposer("bach")``
        (Roman-numeral analyses and Humdrum duplicates excluded).
    """
    from music21 import corpus

    paths = [Path(p) for p in corpus.getComposer("bach") if Path(p).suffix in _SCORE_SUFFIXES]
    return sorted(paths, key=_corpus_name)


def _corpus_name(path: Union[str, Path]) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name}"


def _group_key(path: Union[str, Path]) -> str:
    return Path(path).stem.split("-", 1)[0].lower()


def chorale_split(path: Union[str, Path]) -> str:
    """The split (``"train"``, ``"valid"`` or ``"test"``) a chorale file belongs to.

    A pure function of the file's name (see the module docstring), so the split never depends
    on which other files are present.
    """
    h = int(hashlib.sha256(_group_key(path).encode()).hexdigest()[:8], 16) / 2**32
    if h < SPLIT_FRACTIONS[0]:
        return "train"
    if h < SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]:
        return "valid"
    return "test"


def _is_vocal(part) -> bool:
    name = (part.partName or "").strip().lower()
    first = re.split(r"[\s\d,]+", name, maxsplit=1)[0] if name else ""
    return first in _VOICES


def _limit_silence(roll: torch.Tensor, max_silence: int) -> torch.Tensor:
    """Drop leading/trailing silent steps and shorten silent runs to ``max_silence`` steps."""
    sounding = roll.any(1).tolist()
    first = sounding.index(True)
    last = len(sounding) - 1 - sounding[::-1].index(True)
    keep, run = [], 0
    for t in range(first, last + 1):
        run = 0 if sounding[t] else run + 1
        if run <= max_silence:
            keep.append(t)
    return roll[keep]


def score_to_piano_roll(
    score, steps_per_quarter: int = 1, vocal_only: bool = True, max_silence: Optional[int] = 4
) -> torch.Tensor:
    """Sample a music21 score into a binary piano roll.

    Args:
        score: a ``music21.stream.Score``.
        steps_per_quarter: time steps per quarter note (1: quarter-note resolution).
        vocal_only: keep only parts named Soprano/Alto/Tenor/Bass (see module docstring); if
            ``False`` use every part.
        max_silence: if not ``None``, remove silent steps before the first and after the last
            note, and shorten every run of silent steps (an instrumental interlude while the
            voices rest) to at most this many steps.

    Returns:
        ``uint8`` tensor of shape ``(T, 88)``. With ``max_silence=None``,
        ``T = ceil(steps_per_quarter * end)`` with ``end`` the end of the last note in quarter
        notes, and ``roll[t, n - 21] = 1`` when a note of MIDI pitch ``n`` sounds at time
        ``t / steps_per_quarter`` quarter notes; otherwise silent steps are then removed as
        described above.

    Raises:
        ValueError: no usable part, no notes, or a pitch outside 21..108.
    """
    parts = [p for p in score.parts if _is_vocal(p)] if vocal_only else list(score.parts)
    if not parts:
        names = [p.partName for p in score.parts]
        raise ValueError(f"score has no vocal part (Soprano/Alto/Tenor/Bass); parts: {names}")
    spans: List[Tuple[int, int, int]] = []  # (first step, end step exclusive, midi)
    for part in parts:
        for n in part.flatten().notes:
            start = n.offset * steps_per_quarter
            stop = (n.offset + n.quarterLength) * steps_per_quarter
            a, b = math.ceil(start), math.ceil(stop)  # integer steps t with start <= t < stop
            if b <= a:
                continue  # grace note or ornament entirely between two sampling instants
            for p in n.pitches:
                m = int(p.midi)
                if not LOWEST_NOTE <= m < LOWEST_NOTE + NUM_KEYS:
                    raise ValueError(
                        f"pitch {p.nameWithOctave} (MIDI {m}) is outside the piano range"
                    )
                spans.append((a, b, m))
    if not spans:
        raise ValueError("score has no notes")
    T = max(b for _, b, _ in spans)
    roll = torch.zeros(T, NUM_KEYS, dtype=torch.uint8)
    for a, b, m in spans:
        roll[a:b, m - LOWEST_NOTE] = 1
    return roll if max_silence is None else _limit_silence(roll, max_silence)


def build_chorales(
    paths: Optional[Sequence[Union[str, Path]]] = None, progress: bool = True
) -> Tuple[Dict[str, List[torch.Tensor]], Dict[str, List[str]]]:
    """Parse chorale scores and split them (no caching; see :func:`load_chorales`).

    Args:
        paths: score files; default :func:`chorale_paths` (the whole music21 Bach corpus).
        progress: show a tqdm progress bar.

    Returns:
        ``(rolls, names)``: ``rolls[split]`` a list of ``uint8`` tensors of shapes ``(T_i, 88)``
        and ``names[split]`` their corpus names (``"bach/bwv66.6.mxl"``), sorted by name, for
        ``split`` in train/valid/test. Scores without vocal parts and exact duplicates of an
        earlier roll are skipped.
    """
    from music21 import converter

    from pyro_seq.progress import progress_bar as tqdm

    paths = chorale_paths() if paths is None else sorted((Path(p) for p in paths), key=_corpus_name)
    rolls: Dict[str, List[torch.Tensor]] = {s: [] for s in DEFAULT_SPLITS}
    names: Dict[str, List[str]] = {s: [] for s in DEFAULT_SPLITS}
    seen = set()
    for path in tqdm(
        paths, desc="music21 chorales -> piano rolls", unit="score", disable=not progress
    ):
        score = converter.parse(path, forceSource=True)  # forceSource: no music21 pickle cache
        try:
            roll = score_to_piano_roll(score)
        except ValueError:
            continue
        digest = hashlib.sha256(roll.numpy().tobytes() + str(roll.shape).encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        split = chorale_split(path)
        rolls[split].append(roll)
        names[split].append(_corpus_name(path))
    return rolls, names


def _valid_cache(obj) -> bool:
    if not isinstance(obj, dict) or obj.get("format") != CACHE_FORMAT:
        return False
    for s in DEFAULT_SPLITS:
        rolls, names = obj.get("rolls", {}).get(s), obj.get("names", {}).get(s)
        if not isinstance(rolls, list) or not isinstance(names, list) or len(rolls) != len(names):
            return False
        for r in rolls:
            if not (
                isinstance(r, torch.Tensor)
                and r.dim() == 2
                and r.shape[1] == NUM_KEYS
                and r.shape[0] > 0
            ):
                return False
    return True


def load_chorales(
    splits: Sequence[str] = DEFAULT_SPLITS,
    cache: Union[str, Path, None] = None,
    rebuild: bool = False,
    progress: bool = True,
    return_names: bool = False,
):
    """The built-in music21 Bach chorales as piano rolls, built once and then cached.

    **Not** the Boulanger-Lewandowski JSB split: numbers measured on it are not comparable to
    published JSB Chorales results (see the module docstring for the conversion and split).

    Args:
        splits: which of ``"train"``, ``"valid"``, ``"test"`` to return.
        cache: cache directory (default :func:`cache_dir`: ``$PYRO_SEQ_CACHE`` or
            ``~/.cache/pyro_seq``). The file name carries the cache format and music21 version,
            so a music21 upgrade triggers a rebuild.
        rebuild: ignore an existing cache and rebuild it.
        progress: show a tqdm progress bar while building.
        return_names: also return the corpus names of the sequences.

    Returns:
        ``{split: [roll_0, ...]}`` with ``float32`` tensors of shapes ``(T_i, 88)`` (0/1), or
        ``(rolls, names)`` with ``names[split]`` the matching corpus names if ``return_names``.
        With music21 10.5.1: 247 / 87 / 72 sequences (406 distinct chorales; 14148 / 4725 /
        3846 steps).

    Raises:
        KeyError: an unknown split name.
    """
    if isinstance(splits, str):
        splits = (splits,)
    for s in splits:
        if s not in DEFAULT_SPLITS:
            raise KeyError(f"unknown split {s!r}; the chorales have splits {list(DEFAULT_SPLITS)}")
    directory = Path(cache).expanduser() if cache is not None else cache_dir()
    path = _cache_file(directory)
    obj = None
    if path.exists() and not rebuild:
        try:
            obj = torch.load(path, weights_only=True)
        except Exception as e:  # corrupt or foreign file: rebuild it
            warnings.warn(
                f"ignoring unreadable chorale cache {path} ({e}); rebuilding", stacklevel=2
            )
            obj = None
        if obj is not None and not _valid_cache(obj):
            warnings.warn(
                f"ignoring chorale cache {path} of an unexpected format; rebuilding", stacklevel=2
            )
            obj = None
    if obj is None:
        rolls, names = build_chorales(progress=progress)
        obj = {
            "format": CACHE_FORMAT,
            "music21": _music21_version(),
            "rolls": rolls,
            "names": names,
        }
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(obj, f)
            os.replace(tmp, path)  # atomic: concurrent builders never see a partial file
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    out = {s: [r.to(torch.float32) for r in obj["rolls"][s]] for s in splits}
    if return_names:
        return out, {s: list(obj["names"][s]) for s in splits}
    return out
