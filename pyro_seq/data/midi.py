"""Piano roll <-> standard MIDI file, with :mod:`mido`.

A roll of shape ``(T, 88)`` has one row per time step of ``step_seconds`` seconds; column ``k``
is MIDI note ``21 + k``. A note held over consecutive steps becomes one note (one note-on and one
note-off), so a roll cannot express a re-attack of a note that is already sounding: two
consecutive steps with the same key are always one held note.

Files written here have type 0 (one track), 480 ticks per beat, and a tempo chosen so that one
beat lasts ``steps_per_beat`` steps (so one step is an exact number of ticks and the round trip
:func:`piano_roll_to_midi` -> :func:`midi_to_piano_roll` is exact, trailing silence included).
"""

from __future__ import annotations

import os
from typing import Dict, List, Tuple, Union

import numpy as np
import torch

from .piano_roll import LOWEST_NOTE, NUM_KEYS

__all__ = ["piano_roll_to_midi", "midi_to_piano_roll"]

TICKS_PER_BEAT = 480
_DRUM_CHANNEL = 9


def _roll_array(roll: Union[torch.Tensor, np.ndarray]) -> np.ndarray:
    r = roll.detach().cpu().numpy() if isinstance(roll, torch.Tensor) else np.asarray(roll)
    if r.ndim != 2 or r.shape[1] != NUM_KEYS:
        raise ValueError(f"piano roll must have shape (T, {NUM_KEYS}), got {tuple(r.shape)}")
    if r.shape[0] == 0:
        raise ValueError("piano roll is empty (0 time steps)")
    if not np.isin(r, (0, 1)).all():
        raise ValueError("piano roll must contain only 0 and 1 (threshold or sample it first)")
    return r.astype(bool)


def piano_roll_to_midi(
    roll: Union[torch.Tensor, np.ndarray],
    path: Union[str, "os.PathLike[str]"],
    step_seconds: float = 0.25,
    velocity: int = 80,
    program: int = 0,
    steps_per_beat: int = 1,
) -> None:
    """Write a binary piano roll as a standard MIDI file.

    Args:
        roll: ``(T, 88)`` tensor or array of 0/1; column ``k`` is MIDI note ``21 + k``.
        path: output ``.mid`` file.
        step_seconds: duration of one time step in seconds.
        velocity: note-on velocity, 1..127.
        program: General MIDI program (instrument) 0..127; 0 is acoustic grand piano.
        steps_per_beat: steps per notated beat (1 for a quarter-note roll, 2 for eighths);
            sets the tempo written in the file, not what is heard.

    Each maximal run of consecutive 1s in a column becomes one note on channel 0.
    """
    r = _roll_array(roll)
    if not 1 <= int(velocity) <= 127:
        raise ValueError(f"velocity must be in 1..127, got {velocity}")
    if not 0 <= int(program) <= 127:
        raise ValueError(f"program must be in 0..127, got {program}")
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be positive, got {step_seconds}")
    if steps_per_beat < 1 or TICKS_PER_BEAT % steps_per_beat:
        raise ValueError(f"steps_per_beat must divide {TICKS_PER_BEAT}, got {steps_per_beat}")
    import mido

    ticks_per_step = TICKS_PER_BEAT // steps_per_beat
    tempo = int(round(step_seconds * steps_per_beat * 1e6))  # microseconds per beat
    T = r.shape[0]
    padded = np.zeros((T + 2, NUM_KEYS), dtype=np.int8)
    padded[1:-1] = r
    diff = np.diff(padded, axis=0)  # (T+1, 88): +1 at onsets, -1 at offsets (step index)
    events: List[Tuple[int, int, int]] = []  # (step, order: 0 off / 1 on, note)
    for step, key in zip(*np.nonzero(diff == 1)):
        events.append((int(step), 1, int(key) + LOWEST_NOTE))
    for step, key in zip(*np.nonzero(diff == -1)):
        events.append((int(step), 0, int(key) + LOWEST_NOTE))
    events.sort()

    track = mido.MidiTrack()
    track.append(mido.MetaMessage("set_tempo", tempo=tempo, time=0))
    track.append(mido.Message("program_change", program=int(program), channel=0, time=0))
    now = 0
    for step, on, note in events:
        tick = step * ticks_per_step
        if on:
            msg = mido.Message("note_on", note=note, velocity=int(velocity), channel=0)
        else:
            msg = mido.Message("note_off", note=note, velocity=0, channel=0)
        track.append(msg.copy(time=tick - now))
        now = tick
    track.append(mido.MetaMessage("end_of_track", time=T * ticks_per_step - now))
    mid = mido.MidiFile(type=0, ticks_per_beat=TICKS_PER_BEAT)
    mid.tracks.append(track)
    mid.save(os.fspath(path))


def midi_to_piano_roll(
    path: Union[str, "os.PathLike[str]"],
    step_seconds: float = 0.25,
    include_drums: bool = False,
) -> torch.Tensor:
    """Read a MIDI file into a binary piano roll.

    Args:
        path: a standard MIDI file (any type; tempo changes are honoured).
        step_seconds: duration of one time step in seconds.
        include_drums: whether notes on channel 10 (index 9, General MIDI percussion) count.

    Returns:
        ``float32`` tensor of shape ``(T, 88)``, ``T = round(length / step_seconds)`` (at least
        1), where ``length`` is the file's duration in seconds including trailing silence;
        ``roll[t, n - 21] = 1`` when note ``n`` sounds at step ``t``, a note from ``t_on`` to
        ``t_off`` seconds covering steps ``round(t_on / step) .. round(t_off / step) - 1``
        (at least one step).

    Raises:
        ValueError: a note outside the piano range 21..108.
    """
    import mido

    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be positive, got {step_seconds}")
    mid = mido.MidiFile(os.fspath(path))
    now = 0.0
    active: Dict[Tuple[int, int], float] = {}  # (channel, note) -> onset time in seconds
    notes: List[Tuple[int, float, float]] = []
    for msg in mid:  # merged tracks, msg.time in seconds since the previous message
        now += msg.time
        if msg.type not in ("note_on", "note_off"):
            continue
        if msg.channel == _DRUM_CHANNEL and not include_drums:
            continue
        key = (msg.channel, msg.note)
        if msg.type == "note_on" and msg.velocity > 0:
            if key in active:  # re-attack without note-off: end the previous note here
                notes.append((msg.note, active.pop(key), now))
            active[key] = now
        elif key in active:
            notes.append((msg.note, active.pop(key), now))
    for (_channel, note), start in active.items():  # never released: hold to the end
        notes.append((note, start, now))
    T = max(1, int(round(now / step_seconds)))
    roll = torch.zeros(T, NUM_KEYS)
    for note, start, stop in notes:
        if not LOWEST_NOTE <= note < LOWEST_NOTE + NUM_KEYS:
            raise ValueError(
                f"{path}: note {note} at {start:.3f} s is outside the piano range "
                f"{LOWEST_NOTE}..{LOWEST_NOTE + NUM_KEYS - 1}"
            )
        a = int(round(start / step_seconds))
        b = max(a + 1, int(round(stop / step_seconds)))
        roll[a : min(b, T), note - LOWEST_NOTE] = 1.0
    return roll
