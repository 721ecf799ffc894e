"""End to end through the command line: train, resume, evaluate, sample (tiny model, tiny data)."""

import json

import pytest
import torch

from pyro_seq.cli import main
from pyro_seq.data import midi_to_piano_roll

TINY_SRNN = ["--model-option", "d_dim=8", "--model-option", "hidden_dim=8", "--z-dim", "2"]


def test_train_evaluate_sample(tiny_pickle, tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "train",
        "--model",
        "srnn",
        "--data",
        str(tiny_pickle),
        "--batch-size",
        "5",
        "--kl-anneal-steps",
        "3",
        "--out",
        str(out),
        "--quiet",
    ] + TINY_SRNN
    assert main(args + ["--epochs", "1"]) == 0
    assert main(args + ["--epochs", "2"]) == 0  # resumes at epoch 2
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
    assert (
        main(
            [
                "train",
                "--model",
                "dmm",
                "--data",
                str(tiny_pickle),
                "--objective",
                "fivo",
                "--particles",
                "3",
                "--epochs",
                "1",
                "--batch-size",
                "5",
                "--out",
                str(out),
                "--quiet",
                "--z-dim",
                "2",
                "--model-option",
                "rnn_dim=8",
                "--model-option",
                "transition_dim=8",
                "--model-option",
                "emission_dim=8",
            ]
        )
        == 0
    )
    assert main(["evaluate", str(out), "--objective", "smc", "--particles", "4"]) == 0
    result = json.loads((out / "eval_test_smc_4.json").read_text())
    assert result["method"] == "smc" and result["num_particles"] == 4 and result["per_step"] < 0


# --- damaged checkpoints and interrupted saves ------------------------------------------------

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, env=None, **kwargs):
    """``python -m pyro_seq.cli ARGS`` in a subprocess, importing this checkout."""
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "pyro_seq.cli", *map(str, args)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _train_args(tiny_pickle, out, epochs):
    return [
        "train",
        "--model",
        "srnn",
        "--data",
        str(tiny_pickle),
        "--batch-size",
        "5",
        "--kl-anneal-steps",
        "3",
        "--out",
        str(out),
        "--quiet",
        "--epochs",
        str(epochs),
        "--threads",
        "1",
    ] + TINY_SRNN


def _damage(path, how):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\x00garbage\n" * 50)


def _ckpt_msg(path):
    return (
        f"pyro-seq: error: checkpoint {path} is truncated or corrupt and cannot be loaded; "
        "delete it to train in this folder from scratch, or train into a new output folder "
        "(--out)"
    )


def _best_msg(path):
    return (
        f"pyro-seq: error: weights file {path} is truncated or corrupt and cannot be loaded; "
        "delete it and train again (train --restart, or a new output folder --out)"
    )


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_damaged_checkpoint_and_best_pt_give_one_line(tiny_pickle, tmp_path, how):
    out = tmp_path / "run"
    assert main(_train_args(tiny_pickle, out, 1)) == 0
    good = {name: (out / name).read_bytes() for name in ("checkpoint.pt", "best.pt")}

    _damage(out / "checkpoint.pt", how)  # train resumes from checkpoint.pt
    with pytest.raises(SystemExit) as info:
        main(_train_args(tiny_pickle, out, 2))
    assert info.value.code == _ckpt_msg(out / "checkpoint.pt")
    (out / "checkpoint.pt").write_bytes(good["checkpoint.pt"])

    _damage(out / "best.pt", how)  # evaluate, sample and train read best.pt
    for args in (
        ["evaluate", out],
        ["sample", out, "--length", "4"],
        _train_args(tiny_pickle, out, 1),
    ):  # nothing left to train: tests best.pt
        with pytest.raises(SystemExit) as info:
            main([str(a) for a in args])
        assert info.value.code == _best_msg(out / "best.pt"), args


def test_damaged_best_pt_exits_nonzero_without_traceback(tiny_pickle, tmp_path):
    out = tmp_path / "run"
    assert main(_train_args(tiny_pickle, out, 1)) == 0
    _damage(out / "best.pt", "garbage")
    proc = _cli("evaluate", out)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert stderr == _best_msg(out / "best.pt") + "\n" and stdout == ""
    assert "Traceback" not in stderr and "weights_only" not in stderr


def test_killed_during_a_checkpoint_save_keeps_the_previous_one_and_resumes(tiny_pickle, tmp_path):
    straight = tmp_path / "straight"
    assert main(_train_args(tiny_pickle, straight, 2)) == 0
    out = tmp_path / "run"
    assert main(_train_args(tiny_pickle, out, 1)) == 0
    epoch1 = (out / "checkpoint.pt").read_bytes()

    # the writer pauses after the temporary file is complete and before os.replace
    env = dict(os.environ, PYRO_SEQ_TEST_PAUSE_BEFORE_REPLACE="checkpoint.pt")
    proc = _cli(*_train_args(tiny_pickle, out, 2), env=env)
    paused = out / "checkpoint.pt.paused"
    deadline = time.monotonic() + 60
    while not paused.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert paused.exists(), proc.communicate()
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # the new checkpoint was complete in the temporary file, but never replaced the old one
    assert torch.load(out / "checkpoint.pt.tmp", weights_only=True)["epoch"] == 2
    assert (out / "checkpoint.pt").read_bytes() == epoch1
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1

    assert main(_train_args(tiny_pickle, out, 2)) == 0  # resumes at epoch 2
    assert [row["epoch"] for row in json.loads((out / "log.json").read_text())] == [1, 2]
    assert not (out / "checkpoint.pt.tmp").exists()
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(out / "checkpoint.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 2 and a["global_step"] == b["global_step"]
    for name, p in a["model"].items():
        assert torch.equal(p, b["model"][name]), name


def test_train_schedule_and_init_options_default_to_fits_and_reach_the_run(tiny_pickle, tmp_path):
    from pyro_seq.cli import make_parser
    from pyro_seq.train import TrainConfig

    args = make_parser().parse_args(["train", "--out", str(tmp_path)])
    defaults = TrainConfig()
    for name in (
        "lr_schedule",
        "plateau_factor",
        "plateau_patience",
        "plateau_min_lr",
        "lrd",
        "lr_decay_after",
        "lr_decay_factor",
        "init",
        "patience",
    ):
        assert getattr(args, name) == getattr(defaults, name), name
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--data",
                str(tiny_pickle),
                "--epochs",
                "1",
                "--out",
                str(out),
                "--quiet",
                "--lr-schedule",
                "exponential",
                "--lr-decay-after",
                "0",
                "--lr-decay-factor",
                "2",
                "--init",
                "none",
                "--patience",
                "0",
                "--plateau-factor",
                "0.25",
                "--plateau-patience",
                "5",
            ]
            + TINY_SRNN
        )
        == 0
    )
    train = json.loads((out / "config.json").read_text())["train"]
    assert (
        train["lr_schedule"],
        train["lr_decay_after"],
        train["lr_decay_factor"],
        train["init"],
        train["patience"],
        train["plateau_factor"],
        train["plateau_patience"],
    ) == ("exponential", 0, 2.0, "none", None, 0.25, 5)
    assert json.loads((out / "log.json").read_text())[0]["lr"] == 1e-3 / 2
    with pytest.raises(
        SystemExit,
        match="pyro-seq: error: the per-update decay lrd belongs to lr_schedule='constant'",
    ):
        main(["train", "--data", str(tiny_pickle), "--out", str(tmp_path / "x"), "--lrd", "0.99"])


def test_train_help_lists_every_data_form_load_dataset_accepts(capsys, monkeypatch):
    """--data's help is written from load_dataset's own name lists, so the two cannot drift."""
    import re

    from pyro_seq.data.datasets import NAMED_PICKLES, NAVIGATION, SIMULATED

    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps to the terminal: no broken names
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    data_help = text[text.index("--data DATA ") : text.index(" --objective {")]
    for name in (
        "chorales",
        "japanese_vowels",
        *NAMED_PICKLES,
        *NAMED_PICKLES.values(),
        *SIMULATED,
        *NAVIGATION,
    ):
        assert re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", data_help), name
    for form in (
        "NAME:N",
        "NAME:N:T",
        "$PYRO_SEQ_DATA",
        "path of a Boulanger-Lewandowski",
        ".pt file written by pyro_seq.data.save_dataset",
        "known inputs",
    ):
        assert form in data_help, form


# --- the train flags are TrainConfig's fields ---------------------------------------------------

#: The train flags of the command line before they were generated from TrainConfig: each must
#: keep working under its name.
EARLIER_TRAIN_FLAGS = (
    "--model",
    "--data",
    "--objective",
    "--particles",
    "--cd-steps",
    "--epochs",
    "--batch-size",
    "--lr",
    "--clip-norm",
    "--lr-schedule",
    "--plateau-factor",
    "--plateau-patience",
    "--plateau-restore-best",
    "--no-plateau-restore-best",
    "--plateau-min-lr",
    "--lrd",
    "--lr-decay-after",
    "--lr-decay-factor",
    "--init",
    "--missing-prob",
    "--kl-start",
    "--kl-anneal-steps",
    "--schedule-during-annealing",
    "--no-schedule-during-annealing",
    "--free-bits",
    "--chunk-length",
    "--patience",
    "--time-limit",
    "--threads",
    "--device",
    "--nproc",
    "--z-dim",
    "--inference",
    "--model-option",
    "--seed",
    "--out",
    "--restart",
    "--ignore-inputs",
    "--quiet",
)


def _train_parser():
    import argparse

    from pyro_seq.cli import make_parser

    parser = make_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, sub.choices["train"]


def test_train_flags_are_the_fields_of_train_config_or_documented_run_options():
    """Every TrainConfig field has a train flag (or its declaration says why not) whose
    destination is the field; every other train flag is a documented run option."""
    import dataclasses

    from pyro_seq.cli import TRAIN_RUN_OPTIONS
    from pyro_seq.train import TrainConfig
    from pyro_seq.train.config import GROUPS, options

    _, train = _train_parser()
    actions = {
        a.option_strings[0]: a for a in train._actions if a.option_strings and a.dest != "help"
    }
    every_flag = {s for a in train._actions for s in a.option_strings}
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    declared = options()
    assert [o.name for o in declared] == names
    for o in declared:
        assert o.group in GROUPS and o.doc and "\n" not in o.doc, o.name
        if o.cli_excluded is not None:
            assert o.cli_excluded.strip() and o.flag not in every_flag, o.name
        else:
            assert actions[o.flag].dest == o.name, o.name
    run_flags = {flag for flag, a in actions.items() if a.dest not in names}
    assert run_flags == set(TRAIN_RUN_OPTIONS)
    assert all(why.strip() for why in TRAIN_RUN_OPTIONS.values())
    assert set(EARLIER_TRAIN_FLAGS) <= every_flag, set(EARLIER_TRAIN_FLAGS) - every_flag
    assert "extra" not in names


def test_train_defaults_are_fits_except_the_declared_kl_annealing(tmp_path, capsys, monkeypatch):
    """With no flags the command line trains with TrainConfig's defaults, except the overrides
    its declarations name (KL annealing from 0.2 over 1000 updates), which the help says."""
    import dataclasses

    from pyro_seq.cli import main, train_config_from_args
    from pyro_seq.train import TrainConfig
    from pyro_seq.train.config import options

    parser, _ = _train_parser()
    config = train_config_from_args(parser.parse_args(["train", "--out", str(tmp_path)]))
    overrides = {
        o.name: o.cli_default for o in options() if o.cli_default is not dataclasses.MISSING
    }
    assert overrides == {"kl_start": 0.2, "kl_anneal_steps": 1000}
    assert config == dataclasses.replace(TrainConfig(), **overrides)
    assert (TrainConfig().kl_start, TrainConfig().kl_anneal_steps) == (1.0, 0)
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--kl-start KL_START initial KL weight beta (default 0.2 here, 1.0 in TrainConfig: "
        "the command line anneals the KL weight unless told otherwise)"
    ) in text
    assert "(default 1000 here, 0 in TrainConfig: " in text


def _other_value(o, parser_action):
    """A command-line value of field ``o`` other than its default, as argv strings, and the
    value TrainConfig should receive."""
    if o.invert:
        return [o.flag], not o.default
    if isinstance(o.default, bool):
        return [o.flag if not o.default else "--no-" + o.flag[2:]], not o.default
    if o.choices is not None:
        value = next(c for c in o.choices if c != o.default)
        return [o.flag, value], value
    parse = parser_action.type or str  # --device: a string, checked later
    for text in ("0.25", "2", "7"):
        try:
            value = parse(text)
        except Exception:
            continue
        if o.nargs is not None:
            return [o.flag] + [text] * o.nargs, (value,) * o.nargs
        if value != o.default and value != o.cli_none:
            return [o.flag, text], value
    raise AssertionError(f"no test value for {o.name}")


def test_every_train_flag_reaches_its_field(tmp_path):
    """Each flag set to a value other than its default gives TrainConfig that value (and
    --patience 0 gives None: no early stopping); the rest stay at their defaults."""
    from pyro_seq.cli import train_config_from_args
    from pyro_seq.train.config import options

    parser, train = _train_parser()
    actions = {a.option_strings[0]: a for a in train._actions if a.option_strings}
    base = train_config_from_args(parser.parse_args(["train", "--out", str(tmp_path)]))
    for o in options():
        argv, expected = _other_value(o, actions[o.flag])
        config = train_config_from_args(parser.parse_args(["train", "--out", "x"] + argv))
        assert getattr(config, o.name) == expected, (o.name, argv)
        assert all(
            getattr(config, p.name) == getattr(base, p.name) for p in options() if p.name != o.name
        ), o.name
    config = train_config_from_args(parser.parse_args(["train", "--out", "x", "--patience", "0"]))
    assert config.patience is None


def test_add_train_options_takes_a_scripts_settings_as_defaults():
    """The benchmark scripts' parsers: defaults are the script's TrainConfig (no command-line
    overrides), and a flag changes only its field."""
    import argparse
    import dataclasses

    from pyro_seq.cli import add_train_options, train_config_from_args
    from pyro_seq.train import TrainConfig

    script = TrainConfig(
        epochs=5000,
        lr=3e-4,
        betas=(0.96, 0.999),
        lrd=0.99996,
        weight_decay=2.0,
        kl_start=0.5,
        kl_anneal_steps=12000,
        patience=None,
        lr_schedule="constant",
        init="none",
        valid_batch_size=80,
    )
    parser = add_train_options(argparse.ArgumentParser(), defaults=script)
    assert train_config_from_args(parser.parse_args([]), script) == script
    changed = train_config_from_args(
        parser.parse_args(["--betas", "0.9", "0.99", "--patience", "3", "--quiet"]), script
    )
    assert changed == dataclasses.replace(script, betas=(0.9, 0.99), patience=3, progress=False)


def test_evaluate_objectives_are_every_models_evaluation_methods():
    """The CLI lists its estimators without importing Pyro; they must be exactly the bounds of
    sequence models and the energy-based estimators that evaluate_bound runs."""
    from pyro_seq.cli import ANNEALED, EVALUATE_OBJECTIVES
    from pyro_seq.models import MODELS
    from pyro_seq.train.evaluate import ENERGY_METHODS

    declared = {m for cls in MODELS.values() for m in cls.evaluation_methods}
    assert set(EVALUATE_OBJECTIVES) == {"elbo", "iwae", "smc"} | set(ENERGY_METHODS) == declared
    assert set(ANNEALED) == {"ais", "reverse_ais", "raise"} <= declared
