"""Your own data (docs/your_data.rst): the page's example from each file format (.npz, .pt,
long CSV) through ``fit`` and the command line, the files read back exactly as written, splits
as declared or drawn by the documented seeded rule, missing values refused, the binary-data
error naming the Gaussian likelihood, and ``pyro-seq sample`` on data that are no piano rolls."""

import csv
import importlib.util
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_seq.cli import main
from pyro_seq.data import (
    SequenceList,
    describe_data_formats,
    load_dataset,
    save_dataset,
    seeded_split,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "_examples" / "your_data.py"
FORMATS = ("npz", "pt", "csv")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("your_data_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(example, fmt, path, xs, us, splits):
    {"npz": example.write_npz, "pt": example.write_pt, "csv": example.write_csv}[fmt](
        path, xs, us, splits
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_reads_back_exactly_what_the_example_wrote(example, fmt, tmp_path):
    xs, us = example.make_sequences(num=10, seed=3)
    splits = example.declared_splits(10)
    path = tmp_path / f"data.{fmt}"
    _write(example, fmt, path, xs, us, splits)
    data = load_dataset(path)
    assert sorted(data) == ["test", "train", "valid"]
    for split, indices in splits.items():
        seqs = data[split]
        assert isinstance(seqs, SequenceList) and len(seqs) == len(indices)
        for k, i in enumerate(indices):  # the k-th sequence of the split is the one declared
            assert seqs[k].dtype == torch.float32 and seqs.inputs[k].dtype == torch.float32
            assert torch.equal(seqs[k], torch.from_numpy(xs[i]))
            assert torch.equal(seqs.inputs[k], torch.from_numpy(us[i]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_example_trains_from_each_format_with_fit_and_the_cli(example, fmt, tmp_path, capsys):
    xs, us = example.make_sequences(num=10)
    path = tmp_path / f"data.{fmt}"
    _write(example, fmt, path, xs, us, example.declared_splits(10))
    model, history = example.train_in_python(load_dataset(path), tmp_path / "fit", epochs=1)
    assert len(history) == 1 and math.isfinite(history[-1]["valid_elbo_per_step"])
    assert not model.binary_observations and model.input_dim == 1

    run = tmp_path / "cli"
    example.train_on_command_line(path, run, epochs=1)
    config = json.loads((run / "config.json").read_text())
    assert (config["obs_dim"], config["input_dim"]) == (2, 1)
    assert config["model_options"]["likelihood"] == "gaussian" and config["data"] == str(path)
    assert math.isfinite(json.loads((run / "test.json").read_text())["per_step"])
    samples = torch.load(run / "samples.pt", weights_only=True)
    assert samples.shape == (2, 20, 2) and bool(torch.isfinite(samples).all())
    assert sorted(p.name for p in run.glob("sample_*")) == ["sample_0.png", "sample_1.png"]
    assert "no MIDI files: MIDI needs piano rolls" in capsys.readouterr().out


def test_a_csv_without_split_column_is_split_by_the_documented_seeded_rule(example, tmp_path):
    xs, us = example.make_sequences(num=20, seed=1)
    path = tmp_path / "seeded.csv"
    example.write_csv(path, xs, us)

    def membership(data):  # which written sequence each loaded one is (all differ)
        return {
            split: [
                next(i for i, x in enumerate(xs) if torch.equal(s, torch.from_numpy(x)))
                for s in seqs
            ]
            for split, seqs in data.items()
        }

    got = membership(load_dataset(path))
    assert [len(got[s]) for s in ("train", "valid", "test")] == [16, 2, 2]  # round(0.1 * 20)
    assert sorted(sum(got.values(), [])) == list(range(20))  # disjoint and complete
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0)).tolist()
    assert (
        got
        == {  # the documented rule: valid first, then test, in file order within each
            "valid": sorted(perm[:2]),
            "test": sorted(perm[2:4]),
            "train": sorted(perm[4:]),
        }
    )
    ids = [f"seq{i}" for i in range(20)]
    assert seeded_split(ids) == {s: [f"seq{i}" for i in got[s]] for s in got}
    assert membership(load_dataset(path)) == got  # reproducible
    other = membership(load_dataset(path, seed=1, valid_fraction=0.25, test_fraction=0.25))
    assert [len(other[s]) for s in ("train", "valid", "test")] == [10, 5, 5]
    assert sorted(sum(other.values(), [])) == list(range(20))
    with pytest.raises(ValueError, match=r"valid_fraction 0.5 and test_fraction 0.5 of 20"):
        load_dataset(path, valid_fraction=0.5, test_fraction=0.5)


def test_csv_rows_in_any_order_and_declared_splits(tmp_path):
    rng = np.random.default_rng(0)
    x = {"a": rng.normal(size=(5, 2)), "b": rng.normal(size=(3, 2)), "c": rng.normal(size=(4, 2))}
    split = {"a": "train", "b": "test", "c": "train"}
    rows = [(s, t, *x[s][t]) for s in x for t in range(len(x[s]))]
    random.Random(0).shuffle(rows)
    path = tmp_path / "long.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["value_1", "split", "time", "sequence", "value_2"])  # any column order
        for s, t, v1, v2 in rows:
            w.writerow([repr(float(v1)), split[s], 10.0 * t, s, repr(float(v2))])
    data = load_dataset(path)
    order = [s for s in dict.fromkeys(r[0] for r in rows)]  # first appearance in the file
    for name in ("train", "test"):
        expected = [torch.from_numpy(x[s]).float() for s in order if split[s] == name]
        assert len(data[name]) == len(expected) and type(data[name]) is list
        assert all(torch.equal(a, b) for a, b in zip(data[name], expected))
    assert data["valid"] == []


def test_save_dataset_writes_every_format_and_values_become_float32(tmp_path):
    g = torch.Generator().manual_seed(0)
    counts = [torch.poisson(torch.full((T, 3), 2.0), generator=g) for T in (4, 6)]
    np.savez(tmp_path / "counts.npz", train_0=counts[0].int().numpy(), train_1=counts[1].numpy())
    loaded = load_dataset(tmp_path / "counts.npz", splits=("train",))["train"]
    assert all(torch.equal(a, b) for a, b in zip(loaded, counts))
    np.savez(tmp_path / "f64.npz", train_0=np.array([[0.1, 1 / 3]]))
    (f64,) = load_dataset(tmp_path / "f64.npz", splits=("train",))["train"]
    assert torch.equal(f64, torch.tensor([[0.1, 1 / 3]], dtype=torch.float32))
    seqs = SequenceList(
        [torch.randn(5, 2), torch.randn(3, 2)], [torch.randn(5, 1), torch.randn(3, 1)]
    )
    for fmt in FORMATS:
        save_dataset(tmp_path / f"s.{fmt}", {"train": seqs[:1], "test": seqs[1:]})
        back = load_dataset(tmp_path / f"s.{fmt}")
        assert back["valid"] == [] and len(back["train"]) == len(back["test"]) == 1
        for got, want in ((back["train"], seqs[:1]), (back["test"], seqs[1:])):
            assert torch.equal(got[0], want[0]) and torch.equal(got.inputs[0], want.inputs[0])


MISSING = r"missing value \(NaN or empty\); pyro_seq trains only on complete sequences.*observed=.*pyro_seq\.tasks\.impute"


def test_missing_values_are_refused_with_how_the_package_handles_them(tmp_path):
    bad = np.ones((4, 2), np.float32)
    bad[2, 1] = np.nan
    np.savez(tmp_path / "m.npz", train_0=np.ones((3, 2)), train_1=bad)
    with pytest.raises(ValueError, match=r"m\.npz: train_1 step 2 feature 1 is a " + MISSING):
        load_dataset(tmp_path / "m.npz")
    save_dataset(tmp_path / "m.pt", {"train": [torch.from_numpy(bad)]})
    with pytest.raises(ValueError, match=r"m\.pt: train\[0\] step 2 feature 1 is a " + MISSING):
        load_dataset(tmp_path / "m.pt")
    for cell in ("", "NA", "nan"):
        (tmp_path / "m.csv").write_text(f"sequence,time,a,b\ns,0,1,2\ns,1,{cell},2\n")
        with pytest.raises(ValueError, match=r"m\.csv: line 3 column 'a' is a " + MISSING):
            load_dataset(tmp_path / "m.csv")
    (tmp_path / "u.csv").write_text("sequence,time,a,u_c\ns,0,1,\n")
    with pytest.raises(ValueError, match=r"line 2 column 'u_c' is a " + MISSING):
        load_dataset(tmp_path / "u.csv")
    with pytest.raises(SystemExit, match=r"^pyro-seq: error: --data .*m\.csv: .*missing value"):
        main(
            [
                "train",
                "--model",
                "srnn",
                "--data",
                str(tmp_path / "m.csv"),
                "--out",
                str(tmp_path / "r"),
            ]
        )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {"train_0": np.ones((2, 2)), "extra": np.ones(2)},
            r"array 'extra' is not named <split>_<i>",
        ),
        (
            {"train_0": np.ones((2, 2)), "train_2": np.ones((2, 2))},
            r"train_2 is there but train_1 is not",
        ),
        ({"train_0": np.ones(5)}, r"train_0 has shape \(5,\).*x\[:, None\]"),
        ({"train_0": np.ones((2, 2)), "train_1": np.ones((2, 3))}, r"train\[1\] has 3 features"),
        (
            {"train_0": np.ones((2, 2)), "inputs_train_0": np.ones((3, 1))},
            r"has 2 steps but its inputs have 3",
        ),
        (
            {
                "train_0": np.ones((2, 2)),
                "train_1": np.ones((2, 2)),
                "inputs_train_0": np.ones((2, 1)),
            },
            r"1 arrays inputs_train_<i> for 2 sequences",
        ),
        (
            {"train_0": np.array([["a", "b"]])},
            r"train_0 has dtype <U1; a sequence must hold numbers",
        ),
        ({"train_0": np.full((2, 2), np.inf)}, r"train_0 step 0 feature 0 is infinite"),
    ],
)
def test_npz_off_its_layout_is_refused_naming_the_array(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=message):
        load_dataset(tmp_path / "bad.npz")


@pytest.mark.parametrize(
    "text, message",
    [
        ("seq,time,a\ns,0,1\n", r"no 'sequence' column; the header must name sequence, time"),
        ("sequence,time\ns,0\n", r"no feature column"),
        ("sequence,time,a\ns,0,1\ns,0,2\n", r"sequence 's' has time 0 on lines 2 and 3"),
        (
            "sequence,time,a,split\ns,0,1,train\ns,1,1,test\n",
            r"sequence 's' is in split 'train' and, on line 3, 'test'",
        ),
        ("sequence,time,a\ns,0,x\n", r"line 2 column 'a' holds 'x', not a number"),
        ("sequence,time,a\ns,0\n", r"line 2 has 2 fields, the header 3"),
    ],
)
def test_csv_off_its_layout_is_refused_naming_the_line(tmp_path, text, message):
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_dataset(tmp_path / "bad.csv")


def test_the_binary_data_error_names_the_gaussian_likelihood(example, tmp_path):
    xs, us = example.make_sequences(num=4)
    np.savez(tmp_path / "real.npz", **{f"train_{i}": x for i, x in enumerate(xs)})
    hint = r'for real-valued data build the model with likelihood="gaussian" \(pyro-seq train --model-option likelihood=gaussian\)$'
    from pyro_seq.models import SRNN
    from pyro_seq.train import TrainConfig, fit

    seqs = load_dataset(tmp_path / "real.npz", splits=("train",))["train"]
    with pytest.raises(ValueError, match=r"^train\[0\]: x must be binary \(0/1\).*; " + hint):
        fit(
            SRNN(2, d_dim=4, z_dim=2, hidden_dim=4), seqs, [], TrainConfig(epochs=1), tmp_path / "f"
        )
    with pytest.raises(
        SystemExit, match=r"^pyro-seq: error: data .*real\.npz: train\[0\]: .*" + hint
    ):
        main(
            [
                "train",
                "--model",
                "srnn",
                "--data",
                str(tmp_path / "real.npz"),
                "--out",
                str(tmp_path / "r"),
            ]
        )


def test_sample_on_binary_data_that_are_no_piano_roll(tmp_path, capsys):
    from pyro_seq.cli_runs import load_run

    g = torch.Generator().manual_seed(0)
    np.savez(
        tmp_path / "b.npz",
        **{f"train_{i}": (torch.rand(6, 5, generator=g) < 0.5).float().numpy() for i in range(4)},
    )
    run = tmp_path / "run"
    main(
        [
            "train",
            "--model",
            "dmm",
            "--data",
            str(tmp_path / "b.npz"),
            "--out",
            str(run),
            "--epochs",
            "1",
            "--z-dim",
            "2",
            "--quiet",
        ]
    )
    capsys.readouterr()
    assert main(["sample", str(run), "--num", "2", "--length", "7", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert (
        "no MIDI files: MIDI needs piano rolls (88 binary pitches per step), these samples have 5 binary features per step"
        in out
    )
    assert not list(run.glob("*.mid")) and (run / "sample_1.png").stat().st_size > 0
    samples = torch.load(run / "samples.pt", weights_only=True)
    _, model = load_run(run)
    torch.manual_seed(5)  # what the command drew: the model's generate under --seed
    assert torch.equal(samples, model.generate(2, 7)[0])


def test_describe_data_formats_states_the_layouts_the_readers_read():
    text = describe_data_formats()
    for part in (
        ".npz",
        "without pickles",
        "train_0",
        "inputs_train_0",
        ".pt",
        ".pt file written by pyro_seq.data.save_dataset",
        ".csv",
        "sequence, time",
        "split",
        "u_*",
        "0.8/0.1/0.1 by seed 0",
        "missing value",
    ):
        assert part in text, part
    assert [len(v) for v in seeded_split(list(range(10))).values()] == [8, 1, 1]  # as stated
