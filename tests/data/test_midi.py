import mido
import pytest
import torch

from pyro_seq.data import midi_to_piano_roll, notes_to_roll, piano_roll_to_midi


def _notes_in_seconds(path):
    """[(note, on_seconds, off_seconds)] read with mido independently of the package."""
    now, active, out = 0.0, {}, []
    for msg in mido.MidiFile(path):
        now += msg.time
        if msg.type == "note_on" and msg.velocity > 0:
            active[msg.note] = now
        elif msg.type in ("note_on", "note_off"):
            out.append((msg.note, active.pop(msg.note), now))
    return sorted(out), now


def test_sustained_notes_are_merged_and_timed(tmp_path):
    # C4 held over steps 1-3, E4 at steps 0 and 2 (two notes), A0 and C8 at the last step
    roll = notes_to_roll([(64,), (60,), (60, 64), (60,), (21, 108)])
    path = tmp_path / "a.mid"
    piano_roll_to_midi(roll, path, step_seconds=0.5, velocity=90, program=19)
    notes, length = _notes_in_seconds(path)
    approx = pytest.approx
    assert [n for n, _, _ in notes] == [21, 60, 64, 64, 108]
    assert notes[1][1:] == approx((0.5, 2.0))  # one note for the sustained C4
    assert notes[2][1:] == approx((0.0, 0.5)) and notes[3][1:] == approx((1.0, 1.5))
    assert notes[0][1:] == approx((2.0, 2.5)) and notes[4][1:] == approx((2.0, 2.5))
    assert length == approx(2.5)
    mid = mido.MidiFile(path)
    msgs = [m for m in mid.tracks[0] if not m.is_meta]
    assert sum(m.type == "note_on" for m in msgs) == 5
    assert {m.velocity for m in msgs if m.type == "note_on"} == {90}
    assert [m.program for m in msgs if m.type == "program_change"] == [19]


@pytest.mark.parametrize(
    "step_seconds, steps_per_beat", [(0.25, 1), (0.3, 1), (0.125, 2), (1 / 3, 4)]
)
def test_roll_midi_roll_round_trip(tmp_path, step_seconds, steps_per_beat):
    g = torch.Generator().manual_seed(0)
    roll = (torch.rand(64, 88, generator=g) < 0.05).float()
    roll[:3] = 0  # leading silence
    roll[-4:] = 0  # trailing silence is kept through the file length
    roll[10:20, 40] = 1  # a long held note
    path = tmp_path / "r.mid"
    piano_roll_to_midi(roll, path, step_seconds=step_seconds, steps_per_beat=steps_per_beat)
    back = midi_to_piano_roll(path, step_seconds=step_seconds)
    assert back.shape == roll.shape and back.dtype == torch.float32
    assert torch.equal(back, roll)


def test_numpy_input_and_silence(tmp_path):
    path = tmp_path / "s.mid"
    piano_roll_to_midi(torch.zeros(8, 88).numpy(), path)
    assert torch.equal(midi_to_piano_roll(path), torch.zeros(8, 88))


@pytest.mark.parametrize(
    "roll, kwargs, message",
    [
        (torch.zeros(4, 87), {}, r"shape \(T, 88\)"),
        (torch.zeros(0, 88), {}, "empty"),
        (torch.full((4, 88), 0.5), {}, "only 0 and 1"),
        (torch.zeros(4, 88), {"velocity": 0}, "velocity"),
        (torch.zeros(4, 88), {"program": 128}, "program"),
        (torch.zeros(4, 88), {"step_seconds": 0}, "step_seconds"),
    ],
)
def test_writer_errors(tmp_path, roll, kwargs, message):
    with pytest.raises(ValueError, match=message):
        piano_roll_to_midi(roll, tmp_path / "e.mid", **kwargs)


def _write_raw(path, messages, ticks_per_beat=480):
    track = mido.MidiTrack([mido.MetaMessage("set_tempo", tempo=500000)] + messages)
    f = mido.MidiFile(type=0, ticks_per_beat=ticks_per_beat)
    f.tracks.append(track)
    f.save(path)


def test_reader_other_files(tmp_path):
    # 120 bpm, 480 ticks per beat: 240 ticks = 0.25 s. Note-on with velocity 0 ends a note;
    # drums (channel index 9) are ignored by default.
    path = tmp_path / "o.mid"
    _write_raw(
        path,
        [
            mido.Message("note_on", note=60, velocity=70, time=0),
            mido.Message("note_on", note=36, velocity=70, channel=9, time=0),
            mido.Message("note_on", note=60, velocity=0, time=480),
            mido.Message("note_off", note=36, channel=9, time=0),
            mido.Message("note_on", note=62, velocity=70, time=240),
            mido.Message("note_off", note=62, time=240),
        ],
    )
    roll = midi_to_piano_roll(path, step_seconds=0.25)
    assert roll.shape == (4, 88)
    expected = notes_to_roll([(60,), (60,), (), (62,)])
    assert torch.equal(roll, expected)
    with_drums = midi_to_piano_roll(path, step_seconds=0.25, include_drums=True)
    assert torch.equal(with_drums[:2, 36 - 21], torch.ones(2))


def test_reader_rejects_notes_outside_piano(tmp_path):
    path = tmp_path / "low.mid"
    _write_raw(
        path,
        [
            mido.Message("note_on", note=12, velocity=70, time=0),
            mido.Message("note_off", note=12, time=480),
        ],
    )
    with pytest.raises(ValueError, match=r"note 12 .* outside the piano range 21\.\.108"):
        midi_to_piano_roll(path)
