"""Checkpoint files: atomic writes, one-line errors for truncated or corrupt files, and the
global state that :func:`fit` touches."""

import random

import numpy as np
import pyro
import pytest
import torch

from pyro_seq.models import SRNN
from pyro_seq.train import (
    CheckpointError,
    TrainConfig,
    fit,
    load_checkpoint,
    load_weights,
    save_weights,
)
from pyro_seq.train import checkpoint as checkpoint_module


def toy_sequences(n, seed=0, D=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=g)
    return [(torch.rand(int(L), D, generator=g) < 0.3).float() for L in lengths]


def tiny_srnn():
    torch.manual_seed(0)
    return SRNN(6, d_dim=8, z_dim=3, hidden_dim=8)


CFG = dict(batch_size=5, lr=0.01, progress=False)


@pytest.fixture
def run_dir(tmp_path):
    """A run folder after one epoch: checkpoint.pt and best.pt."""
    fit(
        tiny_srnn(),
        toy_sequences(10),
        toy_sequences(3, seed=1),
        TrainConfig(epochs=1, **CFG),
        tmp_path,
    )
    return tmp_path


def _damage(path, how):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\x00garbage\n" * 50)


CKPT_MSG = (
    "checkpoint {} is truncated or corrupt and cannot be loaded; delete it to train in "
    "this folder from scratch, or train into a new output folder (--out)"
)
BEST_MSG = (
    "weights file {} is truncated or corrupt and cannot be loaded; delete it and train "
    "again (train --restart, or a new output folder --out)"
)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_fit_names_a_damaged_checkpoint_and_what_to_do(run_dir, how):
    path = run_dir / "checkpoint.pt"
    _damage(path, how)
    with pytest.raises(CheckpointError) as info:
        fit(
            tiny_srnn(),
            toy_sequences(10),
            toy_sequences(3, seed=1),
            TrainConfig(epochs=2, **CFG),
            run_dir,
        )
    assert str(info.value) == CKPT_MSG.format(path)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    # resume=False (the CLI's --restart) does not read it, and overwrites it
    fit(
        tiny_srnn(),
        toy_sequences(10),
        toy_sequences(3, seed=1),
        TrainConfig(epochs=1, **CFG),
        run_dir,
        resume=False,
    )
    assert load_checkpoint(path)["epoch"] == 1


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_load_weights_names_a_damaged_best_pt_and_what_to_do(run_dir, how):
    path = run_dir / "best.pt"
    assert set(load_weights(path)) == set(tiny_srnn().state_dict())
    _damage(path, how)
    with pytest.raises(CheckpointError) as info:
        load_weights(path)
    assert str(info.value) == BEST_MSG.format(path)
    assert "weights_only" not in str(info.value) and "\n" not in str(info.value)


def test_wrong_content_and_missing_files_are_reported(tmp_path):
    torch.save({"epoch": 3}, tmp_path / "checkpoint.pt")
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint .*checkpoint\.pt is not a pyro-seq "
        r"training checkpoint; delete it",
    ):
        load_checkpoint(tmp_path / "checkpoint.pt")
    torch.save([1, 2], tmp_path / "best.pt")
    with pytest.raises(CheckpointError, match=r"best\.pt does not hold a model state_dict"):
        load_weights(tmp_path / "best.pt")
    with pytest.raises(FileNotFoundError, match="no weights file at"):
        load_weights(tmp_path / "nothing.pt")


def test_a_save_that_fails_midway_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "best.pt"
    save_weights({"w": torch.ones(3)}, path)
    before = path.read_bytes()

    def broken_save(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", broken_save)
    with pytest.raises(OSError, match="No space left"):
        save_weights({"w": torch.zeros(3)}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]  # temporary file removed
    assert torch.equal(load_weights(path)["w"], torch.ones(3))


def test_saves_go_through_a_fsynced_temporary_file_and_os_replace(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = checkpoint_module.os.fsync, checkpoint_module.os.replace
    monkeypatch.setattr(
        checkpoint_module.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1]
    )
    monkeypatch.setattr(
        checkpoint_module.os,
        "replace",
        lambda a, b: (calls.append(("replace", str(a), str(b))), real_replace(a, b))[1],
    )
    save_weights({"w": torch.ones(2)}, tmp_path / "best.pt")
    tmp, dst = str(tmp_path / "best.pt.tmp"), str(tmp_path / "best.pt")
    assert calls[:2] == ["fsync", ("replace", tmp, dst)]  # the file is synced before the rename
    assert calls[2:] == ["fsync"]  # then the folder


def test_fit_restores_threads_and_rng_and_leaves_the_params_in_the_store(tmp_path):
    model = tiny_srnn()
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    random.seed(5)
    np.random.seed(5)
    torch_state, py_state, np_state = (
        torch.get_rng_state(),
        random.getstate(),
        np.random.get_state(),
    )
    try:
        fit(
            model,
            toy_sequences(10),
            [],
            TrainConfig(epochs=1, num_threads=2, seed=7, **CFG),
            tmp_path,
        )
        assert torch.get_num_threads() == 1
        assert torch.equal(torch.get_rng_state(), torch_state)
        assert random.getstate() == py_state
        assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state))
        # the param store is the training result: it holds the trained model's parameters
        store = pyro.get_param_store()
        params = list(model.parameters())
        assert len(list(store.keys())) == len(params) > 0
        for name in store.keys():
            assert any(store[name] is p for p in params), name
    finally:
        torch.set_num_threads(1)


def test_fit_restores_threads_and_rng_when_it_raises(tmp_path):
    model = tiny_srnn()
    torch.set_num_threads(1)
    torch.manual_seed(99)
    state = torch.get_rng_state()
    (tmp_path / "checkpoint.pt").write_bytes(b"garbage")
    try:
        with pytest.raises(CheckpointError):
            fit(
                model,
                toy_sequences(10),
                [],
                TrainConfig(epochs=1, num_threads=2, seed=7, **CFG),
                tmp_path,
            )
        assert torch.get_num_threads() == 1
        assert torch.equal(torch.get_rng_state(), state)
    finally:
        torch.set_num_threads(1)


# --- weights of another model, non-finite weights ---------------------------------------------


def test_state_dict_mismatch_names_missing_unexpected_and_reshaped_entries():
    from pyro_seq.train.checkpoint import state_dict_mismatch

    model = {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(1)}
    assert state_dict_mismatch(model, {k: v.clone() for k, v in model.items()}) is None
    found = {"a": torch.zeros(2), "b": torch.zeros(4), "d": torch.zeros(1)}
    assert state_dict_mismatch(model, found) == (
        "missing keys 'c'; unexpected keys 'd'; size mismatch for 'b': (4,) in the file, (3,) "
        "in the model"
    )
    many = {f"k{i}": torch.zeros(1) for i in range(5)}
    assert state_dict_mismatch(many, {}) == "missing keys 'k0', 'k1', 'k2' and 2 more"
    assert state_dict_mismatch({}, many, limit=1) == "unexpected keys 'k0' and 4 more"
    reshaped = {"w": torch.zeros(2, 3), "x": torch.zeros(5)}
    assert state_dict_mismatch(reshaped, {"w": torch.zeros(3, 2), "x": torch.zeros(4)}) == (
        "size mismatch for 'w': (3, 2) in the file, (2, 3) in the model and 1 more"
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_load_weights_refuses_non_finite_weights(tmp_path, bad):
    path = tmp_path / "best.pt"
    w = torch.ones(2, 3)
    w[1, 2] = bad
    save_weights({"a": torch.ones(2), "w": w, "steps": torch.tensor([7])}, path)
    with pytest.raises(CheckpointError) as info:
        load_weights(path)
    assert str(info.value) == (
        f"weights file {path} holds non-finite values (NaN/inf) in the weight 'w'; delete it "
        "and train again (train --restart, or a new output folder --out)"
    )
    save_weights({"a": torch.ones(2), "steps": torch.tensor([7])}, path)  # finite: read back
    assert torch.equal(load_weights(path)["steps"], torch.tensor([7]))


def test_restore_names_the_entries_of_another_model_in_one_short_line(tmp_path):
    from pyro_seq.train.checkpoint import restore

    payload = {"model": torch.nn.Linear(2, 3).state_dict()}
    with pytest.raises(CheckpointError) as info:
        restore(payload, model=torch.nn.Linear(2, 4), path="ck.pt")
    assert str(info.value) == (
        "checkpoint ck.pt does not fit this model (size mismatch for 'bias': (3,) in the file, "
        "(4,) in the model and 1 more); resume with the model it was written for, or train "
        "into a new output folder (--out)"
    )
    payload = {"model": torch.nn.Bilinear(2, 2, 3).state_dict()}  # same keys: weight, bias
    payload["model"]["extra"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"\(unexpected keys 'extra'\)"):
        restore(payload, model=torch.nn.Bilinear(2, 2, 3), path="ck.pt")
