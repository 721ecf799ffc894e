import pickle
import random

import numpy as np
import pytest
import torch

from pyro_seq.data import load_piano_rolls, notes_to_roll, roll_to_notes


def _write(tmp_path, obj, name="d.pickle"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=4))
    return path


def _random_notes(rng, T):
    return [tuple(sorted(rng.sample(range(21, 109), rng.randint(0, 6)))) for _ in range(T)]


def test_notes_to_roll_reference():
    roll = notes_to_roll([(21, 60), (), (108,)])
    assert roll.shape == (3, 88) and roll.dtype == torch.float32
    expected = torch.zeros(3, 88)
    expected[0, 0] = expected[0, 39] = expected[2, 87] = 1
    assert torch.equal(roll, expected)


def test_roll_note_tuples_round_trip():
    rng = random.Random(0)
    steps = _random_notes(rng, 50) + [(21, 108), ()]
    roll = notes_to_roll(steps)
    assert roll_to_notes(roll) == steps
    assert torch.equal(notes_to_roll(roll_to_notes(roll)), roll)
    # numpy input and numpy integer notes work too
    assert roll_to_notes(roll.numpy()) == steps
    assert torch.equal(notes_to_roll([tuple(np.int64(n) for n in s) for s in steps]), roll)


@pytest.mark.parametrize(
    "steps, message",
    [
        ([], r"empty sequence"),
        ([(60,), (20,)], r"step 1: note 20 is outside the piano range 21\.\.108"),
        ([(109,)], r"note 109 is outside"),
        ([(60.5,)], r"not an integer MIDI note"),
        ([(True,)], r"not a MIDI note number"),
        ([("60",)], r"not a MIDI note number"),
        ([60, 61], r"step 0: expected a tuple of MIDI notes, got int"),
        ("abc", r"expected a list of time steps"),
    ],
)
def test_notes_to_roll_errors(steps, message):
    with pytest.raises(ValueError, match=message):
        notes_to_roll(steps)


def test_integral_float_notes_accepted():
    assert torch.equal(notes_to_roll([(60.0,)]), notes_to_roll([(60,)]))


@pytest.mark.parametrize(
    "roll, message",
    [
        (torch.zeros(3, 87), r"shape \(T, 88\)"),
        (torch.full((2, 88), 0.5), "only 0 and 1"),
        (torch.full((2, 88), float("nan")), "only 0 and 1"),
    ],
)
def test_roll_to_notes_errors(roll, message):
    with pytest.raises(ValueError, match=message):
        roll_to_notes(roll)


def test_load_small_file(tmp_path):
    data = {
        "train": [[(60, 64), (), (62,)], [(21,)]],
        "valid": [[(108,)]],
        "test": [[(70,), (71,)]],
    }
    out = load_piano_rolls(_write(tmp_path, data))
    assert list(out) == ["train", "valid", "test"]
    assert [r.shape for r in out["train"]] == [(3, 88), (1, 88)]
    assert [roll_to_notes(r) for r in out["train"]] == data["train"]
    assert roll_to_notes(out["test"][0]) == [(70,), (71,)]
    only = load_piano_rolls(_write(tmp_path, data), splits=("test",))
    assert list(only) == ["test"]
    assert list(load_piano_rolls(_write(tmp_path, data), splits="valid")) == ["valid"]


def test_missing_split_names_it(tmp_path):
    path = _write(tmp_path, {"train": [[(60,)]], "test": [[(60,)]]})
    with pytest.raises(KeyError, match=r"missing split 'valid'.*\['test', 'train'\]"):
        load_piano_rolls(path)


@pytest.mark.parametrize(
    "obj, message",
    [
        ([[(60,)]], r"expected a dict with splits"),
        ({"train": "x", "valid": [], "test": []}, r"split 'train' must be a list of sequences"),
        ({"train": [], "valid": [], "test": []}, r"split 'train' has no sequences"),
        (
            {"train": [[(60,)], []], "valid": [[(60,)]], "test": [[(60,)]]},
            r"split 'train', sequence 1: empty sequence",
        ),
        (
            {"train": [[(60,)]], "valid": [[(60,), (61, 7)]], "test": [[(60,)]]},
            r"split 'valid', sequence 0, step 1: note 7 is outside the piano range",
        ),
        (
            {"train": [[(60,)]], "valid": [[(60,)]], "test": [[60]]},
            r"split 'test', sequence 0, step 0: expected a tuple of MIDI notes",
        ),
    ],
)
def test_bad_files_name_the_problem(tmp_path, obj, message):
    with pytest.raises(ValueError, match=message):
        load_piano_rolls(_write(tmp_path, obj))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_piano_rolls(tmp_path / "nope.pickle")


def test_real_jsb(jsb_path):
    out = load_piano_rolls(jsb_path)
    assert {k: len(v) for k, v in out.items()} == {"train": 229, "valid": 76, "test": 77}
    # the per-step normaliser of published numbers: 4725 test steps
    assert sum(r.shape[0] for r in out["test"]) == 4725
    assert sum(r.shape[0] for r in out["train"]) == 13807
    for rolls in out.values():
        for r in rolls:
            assert r.dtype == torch.float32 and r.shape[1] == 88
            assert set(r.unique().tolist()) <= {0.0, 1.0}
            assert r.sum(1).max() <= 4  # four-voice chorales
    # first chord of the first training chorale, as stored in the file
    assert roll_to_notes(out["train"][0])[:2] == [(60, 72, 79, 88), (72, 79, 88)]
    # rolls hold exactly the file's notes
    raw = pickle.loads(jsb_path.read_bytes(), encoding="latin1")
    for split in out:
        for r, seq in zip(out[split], raw[split]):
            assert roll_to_notes(r) == [tuple(sorted(int(n) for n in step)) for step in seq]


def test_real_jsb_2x(jsb2x_path):
    out = load_piano_rolls(jsb2x_path)
    assert {k: len(v) for k, v in out.items()} == {"train": 272, "valid": 80, "test": 77}
    assert all(r.shape[0] == 100 for r in out["train"])
