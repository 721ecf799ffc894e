import pickle

import pytest
import torch

from pyro_seq.data import load_dataset, roll_to_notes


def test_path_loads_the_pickle(tmp_path):
    path = tmp_path / "mine.pickle"
    path.write_bytes(pickle.dumps({"train": [[(60,)]], "valid": [[(61,)]], "test": [[(62,), ()]]}))
    out = load_dataset(path)
    assert roll_to_notes(out["test"][0]) == [(62,), ()]
    assert list(load_dataset(str(path), splits=("valid",))) == ["valid"]


def test_named_dataset_found_in_pyro_seq_data(jsb_path, monkeypatch, tmp_path):
    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path))
    monkeypatch.setenv("PYRO_SEQ_DATA", str(jsb_path.parent))
    out = load_dataset("jsb")
    assert {k: len(v) for k, v in out.items()} == {"train": 229, "valid": 76, "test": 77}
    assert {k: len(v) for k, v in load_dataset("jsb_2x").items()} == {
        "train": 272,
        "valid": 80,
        "test": 77,
    }


def test_named_dataset_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path))
    monkeypatch.delenv("PYRO_SEQ_DATA", raising=False)
    with pytest.raises(
        FileNotFoundError, match=r"nottingham\.pickle not found.*nothing is downloaded"
    ):
        load_dataset("nottingham")
    with pytest.raises(FileNotFoundError, match=r"no dataset 'no/such/file.pickle'"):
        load_dataset("no/such/file.pickle")


def test_chorales_goes_to_music21_builtin(monkeypatch, tmp_path):
    seen = {}

    def fake(splits, **kwargs):
        seen.update(splits=splits, **kwargs)
        return {s: [torch.zeros(3, 88)] for s in splits}

    import pyro_seq.data.datasets as ds

    monkeypatch.setattr(ds, "load_chorales", fake)
    out = load_dataset("chorales", splits=("train",), cache=tmp_path)
    assert list(out) == ["train"] and seen == {"splits": ("train",), "cache": tmp_path}
    with pytest.raises(TypeError, match="unexpected arguments"):
        load_dataset(tmp_path / "x.pickle", cache=tmp_path)
