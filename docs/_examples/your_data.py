"""Your own sequences: the example of docs/your_data.rst (tested by tests/data/test_your_data.py).

Synthetic data stand in for yours: noisy two-dimensional oscillations of different lengths,
each pushed by a known input u_t (a covariate). The script writes them in the three file formats
that ``--data`` reads (.npz, .pt, long CSV), and trains a small SRNN with the Gaussian
likelihood on them, in Python with ``fit`` and on the command line.

Run it with ``python docs/_examples/your_data.py [FOLDER]``.
"""

import csv
import sys
from pathlib import Path

import numpy as np
import torch

from pyro_seq.cli import main as pyro_seq_cli
from pyro_seq.data import SequenceList, load_dataset, save_dataset
from pyro_seq.models import SRNN
from pyro_seq.train import TrainConfig, fit


def make_sequences(num=20, seed=0):
    """``num`` sequences: observations ``x`` (T_i, 2) and inputs ``u`` (T_i, 1), float32."""
    rng = np.random.default_rng(seed)
    rotation = np.array([[0.9, -0.3], [0.3, 0.9]])
    xs, us = [], []
    for _ in range(num):
        T = int(rng.integers(15, 30))  # the lengths differ: no padding needed
        u = rng.normal(size=(T, 1)).astype(np.float32)
        state, x = rng.normal(size=2), np.empty((T, 2), np.float32)
        for t in range(T):
            state = rotation @ state + np.array([0.5, 0.0]) * u[t, 0]
            x[t] = state + 0.1 * rng.normal(size=2)
        xs.append(x)
        us.append(u)
    return xs, us


def declared_splits(num):
    """Which sequences go where, when you decide it: ``{split: [index, ...]}``."""
    n_test = n_valid = max(1, num // 10)
    n_train = num - n_valid - n_test
    return {
        "train": list(range(n_train)),
        "valid": list(range(n_train, n_train + n_valid)),
        "test": list(range(n_train + n_valid, num)),
    }


def write_npz(path, xs, us, splits):
    """One array per sequence, ``<split>_<k>``, and its inputs ``inputs_<split>_<k>``."""
    arrays = {}
    for split, indices in splits.items():
        for k, i in enumerate(indices):
            arrays[f"{split}_{k}"] = xs[i]
            arrays[f"inputs_{split}_{k}"] = us[i]
    np.savez(path, **arrays)


def write_pt(path, xs, us, splits):
    """``save_dataset``: each split a ``SequenceList`` that carries the inputs."""
    save_dataset(
        path,
        {
            split: SequenceList(
                [torch.from_numpy(xs[i]) for i in indices],
                [torch.from_numpy(us[i]) for i in indices],
            )
            for split, indices in splits.items()
        },
    )


def write_csv(path, xs, us, splits=None):
    """Long format: one row per step; without ``splits`` the reader splits by a seed."""
    split_of = {i: s for s, indices in (splits or {}).items() for i in indices}
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sequence", "time", "x", "y", "u_push"] + (["split"] if splits else []))
        for i, (x, u) in enumerate(zip(xs, us)):
            for t in range(len(x)):
                values = [repr(float(v)) for v in (x[t, 0], x[t, 1], u[t, 0])]  # exact text
                writer.writerow([f"seq{i}", t] + values + ([split_of[i]] if splits else []))


def train_in_python(data, out_dir, epochs=2):
    """``fit`` on the lists of tensors (here a ``SequenceList`` with inputs per split)."""
    x_dim = data["train"][0].shape[1]
    u_dim = data["train"].inputs[0].shape[1] if data["train"].inputs else 0
    model = SRNN(x_dim, d_dim=8, z_dim=2, hidden_dim=8, likelihood="gaussian", input_dim=u_dim)
    config = TrainConfig(epochs=epochs, batch_size=4, progress=False)
    return model, fit(model, data["train"], data["valid"], config, out_dir)


def train_on_command_line(path, out_dir, epochs=2):
    """``pyro-seq train --data FILE`` with the Gaussian likelihood, then ``pyro-seq sample``."""
    # fmt: off
    pyro_seq_cli([
        "train", "--model", "srnn", "--data", str(path), "--out", str(out_dir),
        "--model-option", "likelihood=gaussian", "--z-dim", "2",
        "--model-option", "d_dim=8", "--model-option", "hidden_dim=8",
        "--epochs", str(epochs), "--batch-size", "4", "--quiet",
    ])
    pyro_seq_cli(["sample", str(out_dir), "--num", "2", "--length", "20"])
    # fmt: on


def run(folder, epochs=2):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    xs, us = make_sequences()
    splits = declared_splits(len(xs))
    write_npz(folder / "oscillations.npz", xs, us, splits)
    write_pt(folder / "oscillations.pt", xs, us, splits)
    write_csv(folder / "oscillations.csv", xs, us, splits)
    write_csv(folder / "oscillations_seeded.csv", xs, us)  # split 0.8/0.1/0.1 by seed 0
    for name in ("oscillations.npz", "oscillations.pt", "oscillations.csv"):
        data = load_dataset(folder / name)
        print(name, {split: len(seqs) for split, seqs in data.items()})
    train_in_python(load_dataset(folder / "oscillations.npz"), folder / "fit_run", epochs)
    train_on_command_line(folder / "oscillations.csv", folder / "cli_run", epochs)


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else "your_data_output")
