"""The command line answers bad input with one line, never a traceback: damaged run folders
(another model's best.pt, a truncated config.json, NaN weights) and out-of-range options of
every command."""

import json
import pickle
import shutil

import pytest
import torch

from pyro_seq.cli import main

TINY_DMM = [
    "--z-dim",
    "2",
    "--model-option",
    "rnn_dim=6",
    "--model-option",
    "transition_dim=6",
    "--model-option",
    "emission_dim=6",
]
TINY_SRNN = ["--model-option", "d_dim=8", "--model-option", "hidden_dim=8", "--z-dim", "2"]


def _tiny_pickle(path):
    """The piano-roll pickle of the ``tiny_pickle`` fixture (conftest.py), for module-scoped
    runs: 10 / 3 / 3 sequences of 4 to 9 steps, three notes per step."""
    g = torch.Generator().manual_seed(0)

    def seqs(n):
        out = []
        for _ in range(n):
            T = int(torch.randint(4, 10, (), generator=g))
            out.append(
                [tuple(int(k) for k in torch.randint(40, 80, (3,), generator=g)) for _ in range(T)]
            )
        return out

    path.write_bytes(pickle.dumps({"train": seqs(10), "valid": seqs(3), "test": seqs(3)}))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Trained one-epoch runs of a DMM, an SRNN and an RTRBM on the tiny pickle."""
    root = tmp_path_factory.mktemp("runs")
    data = _tiny_pickle(root / "tiny.pickle")
    base = ["train", "--data", str(data), "--epochs", "1", "--batch-size", "5", "--quiet"]
    assert main(base + ["--model", "dmm", "--out", str(root / "dmm")] + TINY_DMM) == 0
    assert main(base + ["--model", "srnn", "--out", str(root / "srnn")] + TINY_SRNN) == 0
    assert (
        main(
            base
            + [
                "--model",
                "rtrbm",
                "--objective",
                "cd",
                "--out",
                str(root / "rtrbm"),
                "--model-option",
                "num_hidden=4",
            ]
        )
        == 0
    )
    return {"data": data, "dmm": root / "dmm", "srnn": root / "srnn", "rtrbm": root / "rtrbm"}


def one_line_error(argv, capsys):
    """Run ``main(argv)``, which must exit with one error line (no traceback: any other
    exception fails the test); return that line. Option errors come from argparse (a usage
    line, then ``pyro-seq CMD: error: argument OPT: ...``, exit code 2); the others are the
    SystemExit message ``pyro-seq: error: ...`` (exit code 1)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    code = info.value.code
    if code == 2:
        lines = capsys.readouterr().err.strip().splitlines()
        line = lines[-1]
        assert line.startswith(f"pyro-seq {argv[0]}: error: argument "), lines
        assert lines[0].startswith("usage: pyro-seq") and "Traceback" not in "".join(lines)
    else:
        assert isinstance(code, str), code
        line = code
        assert line.startswith("pyro-seq: error: "), line
    assert "\n" not in line
    return line


def _copy_run(runs, name, tmp_path):
    run = tmp_path / name
    shutil.copytree(runs[name], run)
    return run


# --- damaged run folders -----------------------------------------------------------------------


def _task_commands(run):
    """Every command that reads a run's best.pt."""
    return [
        ["evaluate", run],
        ["sample", run, "--length", "3"],
        ["impute", run, "--drop", "2", "--iterations", "2"],
        ["denoise", run],
        ["forecast", run, "--prefix", "2", "--steps", "2", "--num-samples", "2"],
    ]


def test_best_pt_of_another_model_is_named_with_the_remedy(runs, tmp_path, capsys):
    run = _copy_run(runs, "dmm", tmp_path)
    shutil.copy(runs["srnn"] / "best.pt", run / "best.pt")  # an SRNN's weights in a DMM run
    dmm_keys = set(torch.load(runs["dmm"] / "best.pt", weights_only=True))
    srnn_keys = set(torch.load(runs["srnn"] / "best.pt", weights_only=True))
    missing = sorted(dmm_keys - srnn_keys)
    unexpected = sorted(srnn_keys - dmm_keys)
    head = (
        f"pyro-seq: error: best.pt in {run} holds weights of another model, not of the run's "
        f"dmm (missing keys '{missing[0]}', '{missing[1]}', '{missing[2]}' and "
        f"{len(missing) - 3} more; unexpected keys '{unexpected[0]}', '{unexpected[1]}', "
        f"'{unexpected[2]}' and {len(unexpected) - 3} more; "
    )
    tail = f"): retrain with pyro-seq train --out {run} --restart"
    train = [
        "train",
        "--model",
        "dmm",
        "--data",
        runs["data"],
        "--epochs",
        "2",
        "--quiet",
        "--out",
        run,
    ] + TINY_DMM  # resumes: reads best.pt
    for argv in _task_commands(run) + [train]:
        line = one_line_error(argv, capsys)
        assert line.startswith(head) and line.endswith(tail), (argv, line)
    assert main([str(a) for a in train + ["--restart"]]) == 0  # the remedy works
    assert main(["evaluate", str(run)]) == 0


def test_best_pt_of_the_same_model_with_other_sizes_names_the_shapes(runs, tmp_path, capsys):
    run = tmp_path / "dmm_z3"
    assert (
        main(
            [
                "train",
                "--model",
                "dmm",
                "--data",
                str(runs["data"]),
                "--epochs",
                "1",
                "--quiet",
                "--out",
                str(run),
                "--z-dim",
                "3",
            ]
            + TINY_DMM[2:]
        )
        == 0
    )
    here = torch.load(run / "best.pt", weights_only=True)
    shutil.copy(runs["dmm"] / "best.pt", run / "best.pt")  # z_dim 2 in a z_dim 3 run
    there = torch.load(run / "best.pt", weights_only=True)
    assert set(here) == set(there)
    reshaped = sorted(k for k in here if here[k].shape != there[k].shape)
    k = reshaped[0]
    assert one_line_error(["evaluate", run], capsys) == (
        f"pyro-seq: error: best.pt in {run} holds weights of another model, not of the run's dmm "
        f"(size mismatch for '{k}': {tuple(there[k].shape)} in the file, {tuple(here[k].shape)} "
        f"in the model and {len(reshaped) - 1} more): retrain with pyro-seq train --out {run} "
        "--restart"
    )


def test_truncated_or_incomplete_config_json_is_named_with_the_remedy(runs, tmp_path, capsys):
    run = _copy_run(runs, "dmm", tmp_path)
    config = run / "config.json"
    text = config.read_text()
    config.write_text(text[: len(text) // 2])
    try:
        json.loads(text[: len(text) // 2])
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}: {e.msg}"
    expected = (
        f"pyro-seq: error: {config} is not valid JSON ({where}; truncated or edited?); "
        f"retrain with pyro-seq train --out {run} --restart"
    )
    train = [
        "train",
        "--model",
        "dmm",
        "--data",
        runs["data"],
        "--epochs",
        "1",
        "--quiet",
        "--out",
        run,
    ] + TINY_DMM
    for argv in _task_commands(run) + [train]:
        assert one_line_error(argv, capsys) == expected, argv
    config.write_text(json.dumps({"model": "dmm", "model_options": {}, "data": "chorales"}))
    assert one_line_error(["evaluate", run], capsys) == (
        f"pyro-seq: error: {config} has no valid 'obs_dim' entry (a whole number); retrain with pyro-seq "
        f"train --out {run} --restart"
    )
    config.write_bytes(b"\xff\xfe\x00garbage")
    assert one_line_error(["sample", run], capsys).startswith(
        f"pyro-seq: error: {config} is not text"
    )
    assert main([str(a) for a in train + ["--restart"]]) == 0  # the remedy works
    assert json.loads(config.read_text())["model"] == "dmm"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_in_best_pt_are_named(runs, tmp_path, capsys, bad):
    run = _copy_run(runs, "dmm", tmp_path)
    state = torch.load(run / "best.pt", weights_only=True)
    name = sorted(state)[-1]
    state[name].view(-1)[0] = bad
    torch.save(state, run / "best.pt")
    expected = (
        f"pyro-seq: error: weights file {run / 'best.pt'} holds non-finite values "
        f"(NaN/inf) in the weight '{name}'; delete it and train again (train --restart, "
        "or a new output folder --out)"
    )
    for argv in _task_commands(run):
        assert one_line_error(argv, capsys) == expected, argv


def test_missing_and_unknown_data_are_one_line(runs, tmp_path, capsys):
    line = one_line_error(
        ["train", "--data", tmp_path / "none.pickle", "--out", tmp_path / "x"], capsys
    )
    assert line.startswith(f"pyro-seq: error: --data {tmp_path / 'none.pickle'}: no dataset ")
    line = one_line_error(["evaluate", runs["dmm"], "--data", "box:x"], capsys)
    assert line == (
        "pyro-seq: error: --data box:x: dataset box:x: the count after ':' must be a positive int"
    )
    (tmp_path / "text.pickle").write_text("not a pickle\n")
    line = one_line_error(["evaluate", runs["dmm"], "--data", tmp_path / "text.pickle"], capsys)
    assert line.startswith(f"pyro-seq: error: --data {tmp_path / 'text.pickle'}: malformed pickle")
    line = one_line_error(["evaluate", runs["dmm"], "--data", tmp_path], capsys)
    assert line == (
        f"pyro-seq: error: --data {tmp_path} is a folder; name a data set, a pickle file, "
        "or a .npz, .pt or .csv file (pyro-seq train --help lists the forms)"
    )


# --- out-of-range options ---------------------------------------------------------------------

#: (option, bad value, where it is refused: "parse" = argparse, else a fragment of the message)
TRAIN_BAD = [
    ("--particles", "0"),
    ("--particles", "-2"),
    ("--cd-steps", "0"),
    ("--epochs", "-1"),
    ("--epochs", "1.5"),
    ("--batch-size", "0"),
    ("--lr", "0"),
    ("--lr", "-1e-3"),
    ("--lr", "nan"),
    ("--lr", "inf"),
    ("--clip-norm", "0"),
    ("--plateau-factor", "0"),
    ("--plateau-factor", "1"),
    ("--plateau-patience", "-1"),
    ("--plateau-min-lr", "-1"),
    ("--lrd", "0"),
    ("--lr-decay-after", "-1"),
    ("--lr-decay-factor", "0.5"),
    ("--missing-prob", "1"),
    ("--missing-prob", "-0.1"),
    ("--kl-start", "1.5"),
    ("--kl-anneal-steps", "-1"),
    ("--free-bits", "-1"),
    ("--chunk-length", "0"),
    ("--patience", "-1"),
    ("--time-limit", "0"),
    ("--threads", "0"),
    ("--nproc", "0"),
    ("--z-dim", "0"),
    ("--seed", "-1"),
    ("--seed", str(2**64)),
    ("--betas", "0.9 1"),
    ("--betas", "0.9 -0.1"),
    ("--weight-decay", "-1"),
    ("--plateau-cooldown", "-1"),
    ("--plateau-threshold", "-1"),
    ("--valid-batch-size", "0"),
    ("--missing-keep-first", "-1"),
    ("--dist-timeout", "0"),
    ("--dist-timeout", "nan"),
]
RUN_BAD = {
    "evaluate": [
        ("--particles", "0"),
        ("--particles", "-1"),
        ("--betas", "0"),
        ("--betas", "1"),
        ("--batch-size", "0"),
        ("--seed", "-1"),
    ],
    "sample": [("--length", "0"), ("--num", "0"), ("--step-seconds", "0"), ("--seed", "-1")],
    "impute": [
        ("--drop", "0"),
        ("--drop-prob", "1.5"),
        ("--drop-prob", "1"),
        ("--drop-prob", "0"),
        ("--iterations", "0"),
        ("--particles", "0"),
        ("--num", "0"),
        ("--seed", "-1"),
    ],
    "denoise": [
        ("--flip", "1.5"),
        ("--flip", "-0.1"),
        ("--flip", "nan"),
        ("--num", "0"),
        ("--seed", "-1"),
        ("--noise", "0"),
        ("--noise", "-1"),
        ("--noise", "inf"),
    ],
    "forecast": [
        ("--steps", "0"),
        ("--prefix", "0"),
        ("--num-samples", "0"),
        ("--num", "0"),
        ("--prefix", "-1"),
        ("--seed", "-1"),
    ],
}


@pytest.mark.parametrize("option,value", TRAIN_BAD)
def test_train_refuses_out_of_range_options_in_one_line(runs, tmp_path, capsys, option, value):
    out = tmp_path / "run"
    parts = value.split()  # --betas takes a pair (the second value is the bad one)
    given = [f"{option}={value}"] if len(parts) == 1 else [option, *parts]
    argv = (
        [
            "train",
            "--model",
            "dmm",
            "--data",
            runs["data"],
            "--epochs",
            "1",
            "--quiet",
            "--out",
            out,
        ]
        + TINY_DMM
        + given
    )  # "=": values such as -1e-3
    line = one_line_error(argv, capsys)
    assert line.startswith(f"pyro-seq train: error: argument {option}: ") and parts[-1] in line
    assert not out.exists()  # nothing written


@pytest.mark.parametrize(
    "command,option,value", [(c, o, v) for c, bad in RUN_BAD.items() for o, v in bad]
)
def test_run_commands_refuse_out_of_range_options_in_one_line(runs, capsys, command, option, value):
    line = one_line_error([command, runs["dmm"], f"{option}={value}"], capsys)
    assert line.startswith(f"pyro-seq {command}: error: argument {option}: ") and value in line


def test_the_numeric_option_messages_name_the_range(runs, capsys):
    assert one_line_error(["evaluate", runs["dmm"], "--particles", "0"], capsys) == (
        "pyro-seq evaluate: error: argument --particles: must be a whole number >= 1, got 0"
    )
    assert one_line_error(["impute", runs["dmm"], "--drop-prob", "1.5"], capsys) == (
        "pyro-seq impute: error: argument --drop-prob: must be a number in (0, 1), got 1.5"
    )
    assert one_line_error(["denoise", runs["dmm"], "--flip", "x"], capsys) == (
        "pyro-seq denoise: error: argument --flip: expected a number in [0, 1], got 'x'"
    )
    assert one_line_error(["sample", runs["dmm"], "--length", "2.5"], capsys) == (
        "pyro-seq sample: error: argument --length: expected a whole number >= 1, got '2.5'"
    )


def test_every_numeric_option_of_every_command_is_checked(runs):
    """No numeric option is left to argparse's plain int or float (which take 0, negatives,
    nan and inf): each has a range type, and the bad-value lists above cover every one."""
    import argparse

    from pyro_seq.cli import make_parser

    parser = make_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    covered = {
        "train": {o for o, _ in TRAIN_BAD},
        **{c: {o for o, _ in bad} for c, bad in RUN_BAD.items()},
        "presets": set(),  # no numeric options
    }
    for command, p in sub.choices.items():
        numeric = {
            a.option_strings[0] for a in p._actions if a.option_strings and a.type is not None
        }
        assert all(a.type not in (int, float) for a in p._actions), command
        assert numeric == covered[command], (command, numeric ^ covered[command])


def test_energy_based_model_with_missing_prob_is_refused_before_writing(runs, tmp_path, capsys):
    out = tmp_path / "rtrbm"
    line = one_line_error(
        [
            "train",
            "--model",
            "rtrbm",
            "--objective",
            "cd",
            "--data",
            runs["data"],
            "--missing-prob",
            "0.3",
            "--out",
            out,
        ],
        capsys,
    )
    assert line == (
        "pyro-seq: error: --missing-prob 0.3 marks steps unobserved, which needs a "
        "latent-variable model; rtrbm is energy-based: train it without "
        "--missing-prob"
    )
    assert not out.exists()


def test_free_bits_with_iwae_is_refused_before_writing(runs, tmp_path, capsys):
    out = tmp_path / "iwae"
    line = one_line_error(
        [
            "train",
            "--model",
            "dmm",
            "--data",
            runs["data"],
            "--objective",
            "iwae",
            "--free-bits",
            "0.5",
            "--out",
            out,
        ]
        + TINY_DMM,
        capsys,
    )
    assert line == (
        "pyro-seq: error: free bits apply to the single-sample ELBO; use KL annealing with 'iwae'"
    )
    assert not out.exists()


def test_ais_uses_and_reports_the_chains_it_runs(runs, capsys):
    """--particles absent: 100 AIS chains, said in the label and the file name; --particles 1
    with AIS (too few chains for a standard error) is refused instead of becoming 100."""
    run = runs["rtrbm"]
    capsys.readouterr()
    assert main(["evaluate", str(run), "--betas", "20"]) == 0  # AIS is the RTRBM's default
    assert "test ais (K=100): " in capsys.readouterr().out
    assert json.loads((run / "eval_test_ais_100.json").read_text())["num_particles"] == 100
    assert one_line_error(["evaluate", run, "--objective", "ais", "--particles", "1"], capsys) == (
        "pyro-seq: error: --particles 1 with --objective ais: AIS needs at least 2 chains (for "
        "its standard error); leave --particles out for 100"
    )
    assert (
        main(["evaluate", str(run), "--objective", "ais", "--particles", "3", "--betas", "20"]) == 0
    )
    assert "test ais (K=3): " in capsys.readouterr().out
    assert main(["evaluate", str(runs["dmm"])]) == 0  # the bounds: one sample
    assert "test elbo (K=1): " in capsys.readouterr().out


def test_commands_a_model_does_not_declare_are_refused_in_one_line(runs, capsys):
    for command in ("impute", "denoise", "forecast"):
        line = one_line_error([command, runs["rtrbm"]], capsys)
        assert line.startswith(f"pyro-seq: error: rtrbm does not support task {command}: "), line
    assert one_line_error(["evaluate", runs["dmm"], "--objective", "ais"], capsys).startswith(
        "pyro-seq: error: dmm does not support evaluation method ais: "
    )
