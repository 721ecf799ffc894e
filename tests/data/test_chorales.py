import os
from collections import Counter

import pytest
import torch

from pyro_seq.data import chorales as ch
from pyro_seq.data import load_chorales, roll_to_notes, score_to_piano_roll

music21 = pytest.importorskip("music21")
from music21 import chord, converter, note, stream  # noqa: E402


def _corpus_file(name):
    for p in ch.chorale_paths():
        if p.name == name:
            return p
    pytest.skip(f"{name} is not in this music21 corpus")


def _parse(name):
    return converter.parse(_corpus_file(name), forceSource=True)


def _part(name, *items):
    part = stream.Part()
    part.partName = name
    for it in items:
        part.append(it)
    return part


def _synthetic_score():
    """A tiny score whose roll is known by hand (offsets in quarter notes in comments)."""
    soprano = _part(
        "Soprano",
        note.Rest(quarterLength=1),  # 0-1
        note.Note("C5", quarterLength=1),  # 1-2   MIDI 72
        note.Note("D5", quarterLength=0.5),  # 2-2.5 MIDI 74, sounds at beat 2
        note.Note("E5", quarterLength=0.5),  # 2.5-3 between beats: dropped
        note.Note("F5", quarterLength=2),  # 3-5   MIDI 77
        note.Rest(quarterLength=1),  # 5-6
        note.Note("G5", quarterLength=1),  # 6-7   MIDI 79
    )
    alto = _part(
        "Alto 1",
        note.Rest(quarterLength=2),
        note.Note("A4", quarterLength=2),  # 2-4: 69
        note.Rest(quarterLength=3),
    )
    tenor = _part(
        "Tenor", note.Rest(quarterLength=1), chord.Chord(["C3", "E3"], quarterLength=1)
    )  # 1-2: 48, 52
    horn = _part("Horn 1", note.Note("C4", quarterLength=4))  # 0-4: 60 (not vocal)
    score = stream.Score()
    for p in (soprano, alto, tenor, horn):
        score.insert(0, p)
    return score


def test_synthetic_score_reference():
    score = _synthetic_score()
    raw = score_to_piano_roll(score, max_silence=None)
    assert raw.dtype == torch.uint8 and raw.shape == (7, 88)
    assert roll_to_notes(raw) == [(), (48, 52, 72), (69, 74), (69, 77), (77,), (), (79,)]
    everything = score_to_piano_roll(score, vocal_only=False, max_silence=None)
    assert roll_to_notes(everything) == [
        (60,),
        (48, 52, 60, 72),
        (60, 69, 74),
        (60, 69, 77),
        (77,),
        (),
        (79,),
    ]
    # default: leading/trailing silence removed, silent runs limited to 4 steps
    assert roll_to_notes(score_to_piano_roll(score)) == [
        (48, 52, 72),
        (69, 74),
        (69, 77),
        (77,),
        (),
        (79,),
    ]
    assert roll_to_notes(score_to_piano_roll(score, max_silence=0)) == [
        (48, 52, 72),
        (69, 74),
        (69, 77),
        (77,),
        (79,),
    ]
    # eighth-note resolution keeps the passing note E5 (76) at step 5 (offset 2.5)
    fine = score_to_piano_roll(score, steps_per_quarter=2, max_silence=None)
    assert fine.shape == (14, 88) and roll_to_notes(fine)[4:6] == [(69, 74), (69, 76)]


def test_limit_silence():
    roll = torch.zeros(12, 88, dtype=torch.uint8)
    roll[2, 0] = roll[9, 5] = 1  # sounding steps 2 and 9; silent run of 6 between them
    out = ch._limit_silence(roll, 4)
    assert out.shape[0] == 1 + 4 + 1
    assert roll_to_notes(out) == [(21,), (), (), (), (), (26,)]


def test_score_without_vocal_parts_is_refused():
    score = stream.Score()
    score.insert(0, _part("Piano", note.Note("C4")))
    with pytest.raises(ValueError, match=r"no vocal part .*\['Piano'\]"):
        score_to_piano_roll(score)


def test_bwv66_6_first_chords():
    # "Christ unser Herr zum Jordan kam", BWV 66.6 (F# minor), the music21 tutorial chorale.
    # First beat: S C#5, A E4, T A3, B A3 (eighth notes in S/T/B); beat 2: S A4, A F#4, T C#4, B F#3.
    roll = score_to_piano_roll(_parse("bwv66.6.mxl"))
    assert roll_to_notes(roll)[:2] == [(57, 64, 73), (54, 61, 66, 69)]
    assert roll.sum(1).max() <= 4 and roll.shape[0] == 36
    notes = [n for step in roll_to_notes(roll) for n in step]
    assert 36 <= min(notes) and max(notes) <= 84  # vocal ranges, well inside 21..108


def test_bwv1_6_leaves_out_the_horn():
    score = _parse("bwv1.6.mxl")
    assert [p.partName for p in score.parts] == ["Horn 2", "Soprano", "Alto", "Tenor", "Bass"]
    vocal = score_to_piano_roll(score)
    # beat 1: S C5, A C4, T G3, B E3; the horn's G4 (67) is not there
    assert roll_to_notes(vocal)[:2] == [(53, 57, 60, 65), (52, 55, 60, 72)]
    assert vocal.sum(1).max() <= 4
    full = score_to_piano_roll(score, vocal_only=False)
    assert 67 in roll_to_notes(full)[1]


def test_split_is_deterministic_and_groups_versions():
    assert ch.chorale_split("bach/bwv248.9-1.mxl") == ch.chorale_split("/x/bwv248.9-s.mxl")
    assert ch._group_key("bwv190.7-inst.mxl") == "bwv190.7"
    paths = ch.chorale_paths()
    assert len(paths) >= 400
    counts = Counter(ch.chorale_split(p) for p in paths)
    # group hashes are ~uniform: fractions within 3 binomial standard errors (n ~ 400:
    # sd(train) = sqrt(.6 * .4 / 400) = 0.024, sd(valid/test) = 0.02)
    n = sum(counts.values())
    assert abs(counts["train"] / n - 0.6) < 3 * 0.025
    assert abs(counts["valid"] / n - 0.2) < 3 * 0.02
    assert abs(counts["test"] / n - 0.2) < 3 * 0.02


def test_build_a_few_chorales():
    files = [_corpus_file(n) for n in ("bwv66.6.mxl", "bwv1.6.mxl", "bwv269.mxl")]
    rolls, names = ch.build_chorales(files, progress=False)
    assert sorted(n for s in names for n in names[s]) == [
        "bach/bwv1.6.mxl",
        "bach/bwv269.mxl",
        "bach/bwv66.6.mxl",
    ]
    for split in ("train", "valid", "test"):
        assert len(rolls[split]) == len(names[split])
        for r, name in zip(rolls[split], names[split]):
            assert ch.chorale_split(name) == split
            assert r.dtype == torch.uint8 and r.shape[1] == 88 and r.sum(1).max() <= 4
    # an exact duplicate is dropped
    rolls2, names2 = ch.build_chorales(files + files[:1], progress=False)
    assert sum(len(v) for v in names2.values()) == 3


def _fake_build(calls):
    def build(paths=None, progress=True):
        calls.append(progress)
        g = torch.Generator().manual_seed(len(calls))
        rolls = {
            s: [(torch.rand(T, 88, generator=g) < 0.05).to(torch.uint8) for T in (5, 9)]
            for s in ("train", "valid", "test")
        }
        names = {s: [f"bach/{s}{i}.mxl" for i in range(2)] for s in rolls}
        return rolls, names

    return build


def test_cache_is_built_once_then_loaded(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ch, "build_chorales", _fake_build(calls))
    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path / "cache"))
    assert ch.cache_dir() == tmp_path / "cache"
    first = load_chorales(progress=False)
    assert calls == [False]
    files = os.listdir(tmp_path / "cache")
    assert files == [
        f"chorales-v{ch.CACHE_FORMAT}-music21-{music21.__version__}.pt"
    ]  # no temp files left
    second, names = load_chorales(return_names=True)
    assert calls == [False]  # loaded, not rebuilt
    for s in ("train", "valid", "test"):
        assert all(
            a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(first[s], second[s])
        )
        assert names[s] == [f"bach/{s}0.mxl", f"bach/{s}1.mxl"]
    assert list(load_chorales(splits="test")) == ["test"]
    # the cache holds plain tensors: loadable with weights_only=True
    obj = torch.load(tmp_path / "cache" / files[0], weights_only=True)
    assert obj["format"] == ch.CACHE_FORMAT and len(obj["rolls"]["train"]) == 2
    # rebuild=True rebuilds
    rebuilt = load_chorales(rebuild=True, progress=False)
    assert len(calls) == 2 and not torch.equal(rebuilt["train"][0], first["train"][0])


def test_corrupt_cache_is_rebuilt(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(ch, "build_chorales", _fake_build(calls))
    cache = tmp_path / "c"
    cache.mkdir()
    ch._cache_file(cache).write_bytes(b"not a torch file")
    with pytest.warns(UserWarning, match="unreadable chorale cache"):
        out = load_chorales(cache=cache, progress=False)
    assert len(calls) == 1 and len(out["train"]) == 2
    torch.save({"format": 0}, ch._cache_file(cache))
    with pytest.warns(UserWarning, match="unexpected format"):
        load_chorales(cache=cache, progress=False)
    assert len(calls) == 2
    load_chorales(cache=cache)
    assert len(calls) == 2


def test_unknown_split(tmp_path):
    with pytest.raises(KeyError, match="unknown split 'training'"):
        load_chorales(splits=("training",), cache=tmp_path)


@pytest.mark.slow
def test_full_build(tmp_path):
    rolls, names = load_chorales(cache=tmp_path, progress=False, return_names=True)
    counts = {s: len(v) for s, v in rolls.items()}
    if music21.__version__ == "10.5.1":
        assert counts == {"train": 247, "valid": 87, "test": 72}
    else:
        assert counts["train"] > 150 and counts["valid"] > 40 and counts["test"] > 40
    all_names = [n for v in names.values() for n in v]
    assert len(set(all_names)) == len(all_names)
    groups = {s: {ch._group_key(n) for n in names[s]} for s in names}
    assert not (groups["train"] & groups["valid"]) and not (groups["train"] & groups["test"])
    for s in rolls:
        assert names[s] == sorted(names[s])
        for r in rolls[s]:
            assert r.shape[0] >= 8 and r.sum(1).max() <= 5
            assert bool(r[0].any()) and bool(r[-1].any())
    # loaded from the cache the second time, identical
    again = load_chorales(cache=tmp_path, progress=False)
    assert all(torch.equal(a, b) for s in rolls for a, b in zip(rolls[s], again[s]))
