"""pyro_seq.data: sequence datasets and batching.

* Piano rolls in the Boulanger-Lewandowski pickle format (JSB Chorales, Nottingham, MuseData,
  Piano-midi.de), read with a restricted unpickler: :func:`load_piano_rolls`.
* A built-in default needing no file, the music21 Bach chorales: :func:`load_chorales`
  (not the Boulanger-Lewandowski split). :func:`load_dataset` picks either by name or path.
* Your own sequences in files: ``.npz``, ``.pt`` or long-format ``.csv``, read by
  :func:`load_dataset` and written by :func:`save_dataset` (layouts:
  :func:`describe_data_formats`, :mod:`pyro_seq.data.files`; CSV splits by
  :func:`seeded_split`); in Python, a list of ``(T_i, D)`` tensors, or a
  :class:`SequenceList` that carries per-sequence known inputs.
* Batching ragged ``(T_i, D)`` sequences into ``(batch, T, D)`` tensors with a ``(batch, T)``
  bool mask: :func:`pad_sequences`, :func:`chunk_sequences`, :class:`SequenceLoader`
  (reproducible from ``(seed, epoch)``), and input checks: :func:`validate_sequences`.
* MIDI files: :func:`piano_roll_to_midi`, :func:`midi_to_piano_roll`.
* Simulated student answers for collaborative filtering (2PL item response model, sparse
  storage, per-student CSR minibatches): :func:`simulate_students`, :class:`StudentResponses`.
* Simulated videos of the KVAE experiments (ball in a box, with gravity, in a polygon, pong;
  the torque-controlled pendulum): :mod:`pyro_seq.data.simulators` (pymunk: ``[sim]`` extra);
  the GTM-SM's image navigation with actions, walls and obstacles:
  :func:`~pyro_seq.data.simulators.image_navigation` (scikit-learn, Pillow: ``[images]`` extra).

music21, mido and tqdm are imported only when a function that needs them is called.
"""

from pyro_seq.ops.padding import SequenceList, inputs_of

from .batching import (
    SequenceLoader,
    chunk_sequences,
    pad_sequences,
    unpad_sequences,
    validate_sequences,
)
from .chorales import build_chorales, cache_dir, load_chorales, score_to_piano_roll
from .datasets import NAMED_PICKLES, load_dataset, save_dataset
from .files import describe_data_formats, seeded_split
from .japanese_vowels import JAPANESE_VOWELS_DIM, load_japanese_vowels
from .midi import midi_to_piano_roll, piano_roll_to_midi
from .piano_roll import (
    HIGHEST_NOTE,
    LOWEST_NOTE,
    NUM_KEYS,
    load_piano_rolls,
    notes_to_roll,
    roll_to_notes,
)
from .safe_pickle import RestrictedUnpickler, UnsafePickleError, safe_load, safe_loads
from .students import Answers, StudentBatch, StudentResponses, simulate_students

__all__ = [
    "Answers",
    "HIGHEST_NOTE",
    "JAPANESE_VOWELS_DIM",
    "LOWEST_NOTE",
    "NAMED_PICKLES",
    "NUM_KEYS",
    "RestrictedUnpickler",
    "SequenceList",
    "SequenceLoader",
    "StudentBatch",
    "StudentResponses",
    "UnsafePickleError",
    "build_chorales",
    "cache_dir",
    "chunk_sequences",
    "describe_data_formats",
    "load_chorales",
    "load_dataset",
    "load_japanese_vowels",
    "inputs_of",
    "load_piano_rolls",
    "midi_to_piano_roll",
    "notes_to_roll",
    "pad_sequences",
    "piano_roll_to_midi",
    "roll_to_notes",
    "safe_load",
    "safe_loads",
    "save_dataset",
    "score_to_piano_roll",
    "seeded_split",
    "simulate_students",
    "unpad_sequences",
    "validate_sequences",
]
