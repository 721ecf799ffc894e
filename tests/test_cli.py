"""End to end through the command line: train, resume, evaluate, sample (tiny model, tiny data)."""

import json
import pickle

import pytest
import torch

from pyro_seq.cli import main
from pyro_seq.data import midi_to_piano_roll


@pytest.fixture
def tiny_pickle(tmp_path):
    g = torch.Generator().manual_seed(0)

    def seqs(n):
        out = []
        for _ in range(n):
            T = int(torch.randint(4, 10, (), generator=g))
            out.append([tuple(int(k) for k in torch.randint(40, 80, (3,), generator=g)) for _ in range(T)])
        return out

    path = tmp_path / "tiny.pickle"
    path.write_bytes(pickle.dumps({"train": seqs(10), "valid": seqs(3), "test": seqs(3)}))
    return path


TINY_SRNN = ["--model-option", "d_dim=8", "--model-option", "hidden_dim=8", "--z-dim", "2"]


def test_train_evaluate_sample(tiny_pickle, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--model", "srnn", "--data", str(tiny_pickle), "--batch-size", "5",
            "--kl-anneal-steps", "3", "--out", str(out), "--quiet"] + TINY_SRNN
    assert main(args + ["--epochs", "1"]) == 0
    assert main(args + ["--epochs", "2"]) == 0                  # resumes at epoch 2
    log = json.loads((out / "log.json").read_text())
    assert [row["epoch"] for row in log] == [1, 2]
    test = json.loads((out / "test.json").read_text())
    assert test["num_sequences"] == 3 and test["per_step"] < 0
    assert "nats per time step" in capsys.readouterr().out

    assert main(["evaluate", str(out), "--particles", "2"]) == 0
    result = json.loads((out / "eval_test_elbo_2.json").read_text())
    assert result["num_particles"] == 2 and result["per_step"] < 0

    assert main(["sample", str(out), "--length", "12", "--num", "1"]) == 0
    assert (out / "sample_0.png").stat().st_size > 0
    roll = midi_to_piano_roll(out / "sample_0.mid", step_seconds=0.25)
    assert roll.shape[1] == 88 and roll.shape[0] <= 12


def test_different_model_in_same_folder_is_refused(tiny_pickle, tmp_path):
    out = tmp_path / "run"
    base = ["train", "--data", str(tiny_pickle), "--epochs", "1", "--out", str(out), "--quiet"]
    main(base + ["--model", "srnn"] + TINY_SRNN)
    with pytest.raises(SystemExit, match="different model"):
        main(base + ["--model", "dmm", "--z-dim", "2"])


def test_evaluate_needs_a_run_folder(tmp_path):
    with pytest.raises(SystemExit, match="not a run folder"):
        main(["evaluate", str(tmp_path)])


def test_train_with_fivo_and_evaluate_with_smc(tiny_pickle, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", "dmm", "--data", str(tiny_pickle), "--objective", "fivo",
                 "--particles", "3", "--epochs", "1", "--batch-size", "5", "--out", str(out),
                 "--quiet", "--z-dim", "2", "--model-option", "rnn_dim=8",
                 "--model-option", "transition_dim=8", "--model-option", "emission_dim=8"]) == 0
    assert main(["evaluate", str(out), "--objective", "smc", "--particles", "4"]) == 0
    result = json.loads((out / "eval_test_smc_4.json").read_text())
    assert result["method"] == "smc" and result["num_particles"] == 4 and result["per_step"] < 0
