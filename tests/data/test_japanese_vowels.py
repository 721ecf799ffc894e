"""JapaneseVowels from the files bundled with aeon: sizes, split, standardisation, errors."""

import os
import sys

import pytest
import torch

from pyro_seq.data import JAPANESE_VOWELS_DIM, load_dataset, load_japanese_vowels


@pytest.fixture(scope="module")
def raw():
    """The bundled files read directly with aeon (the reference for every check)."""
    pytest.importorskip("aeon")
    import aeon.datasets
    from aeon.datasets import load_from_ts_file

    folder = os.path.join(os.path.dirname(aeon.datasets.__file__), "data", "JapaneseVowels")
    out = {}
    for split in ("train", "test"):
        data, labels = load_from_ts_file(os.path.join(folder, f"JapaneseVowels_{split.upper()}.ts"))
        out[split] = ([torch.as_tensor(x, dtype=torch.float64).T for x in data], list(labels))
    return out


@pytest.fixture(scope="module")
def loaded(raw):
    return load_japanese_vowels(return_stats=True)


def _sorted_rows(seqs):
    """A canonical multiset of sequences (for comparing splits irrespective of order)."""
    return sorted(tuple(x.float().flatten().tolist()) for x in seqs)


def test_sizes_lengths_and_features(raw, loaded):
    assert len(raw["train"][0]) == 270 and len(raw["test"][0]) == 370
    data, _ = loaded
    assert len(data["train"]) + len(data["valid"]) == 270 and len(data["test"]) == 370
    assert len(data["valid"]) == 27  # 10% of each speaker's 30
    lengths = [x.shape[0] for s in data.values() for x in s]
    assert min(lengths) == 7 and max(lengths) == 29
    for seqs in data.values():
        for x in seqs:
            assert x.dtype == torch.float32 and x.shape[1] == JAPANESE_VOWELS_DIM == 12
            assert torch.isfinite(x).all()


def test_validation_split_is_stratified_and_partitions_train(raw):
    data = load_japanese_vowels(("train", "valid"), standardize=False)
    seqs, labels = raw["train"]
    assert _sorted_rows(data["train"] + data["valid"]) == _sorted_rows(seqs)
    valid_rows = set(_sorted_rows(data["valid"]))
    speakers = [
        y for x, y in zip(seqs, labels) if tuple(x.float().flatten().tolist()) in valid_rows
    ]
    assert sorted(set(speakers)) == sorted(set(labels)) and all(
        speakers.count(s) == 3 for s in set(speakers)
    )
    assert load_japanese_vowels("valid", valid_fraction=0.0)["valid"] == []
    assert len(load_japanese_vowels("valid", valid_fraction=0.2)["valid"]) == 54


def test_standardised_with_training_statistics(raw, loaded):
    data, stats = loaded
    frames = torch.cat(data["train"]).double()
    assert (frames.mean(0).abs() < 1e-6).all()
    assert ((frames.std(0, correction=0) - 1).abs() < 1e-6).all()
    # the statistics are those of the raw training frames left after the split (eq. 1) ...
    raw_train = torch.cat(load_japanese_vowels("train", standardize=False)["train"]).double()
    torch.testing.assert_close(stats["mean"], raw_train.mean(0), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stats["std"], raw_train.std(0, correction=0), rtol=1e-6, atol=1e-7)
    # ... and every split is mapped by the same affine map (eq. 2): undo it on the test set
    undone = torch.cat(data["test"]).double() * stats["std"] + stats["mean"]
    torch.testing.assert_close(undone, torch.cat(raw["test"][0]), rtol=1e-5, atol=1e-5)
    assert not (
        torch.cat(data["test"]).double().mean(0).abs() < 1e-6
    ).all()  # not self-standardised


def test_deterministic_and_registered(loaded):
    data, stats = loaded
    again = load_dataset("japanese_vowels", return_stats=True)
    for split in data:
        assert len(again[0][split]) == len(data[split])
        assert all(torch.equal(a, b) for a, b in zip(again[0][split], data[split]))
    assert torch.equal(again[1]["mean"], stats["mean"]) and torch.equal(
        again[1]["std"], stats["std"]
    )
    only_test = load_dataset("japanese_vowels", ("test",))
    assert list(only_test) == ["test"]


def test_bad_arguments(raw):
    with pytest.raises(ValueError, match="unknown split"):
        load_japanese_vowels(("train", "dev"))
    with pytest.raises(ValueError, match="valid_fraction"):
        load_japanese_vowels(valid_fraction=1.0)
    with pytest.raises(ValueError, match="valid_fraction"):
        load_japanese_vowels(valid_fraction=-0.1)


def test_missing_aeon_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "aeon" or m.startswith("aeon.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "aeon", None)  # makes `import aeon...` fail
    with pytest.raises(ImportError, match=r"pip install pyro-seq\[data\]"):
        load_japanese_vowels()
    with pytest.raises(ImportError, match=r"pip install pyro-seq\[data\]"):
        load_dataset("japanese_vowels")
