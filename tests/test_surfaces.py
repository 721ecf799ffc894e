"""Every model through every surface, generated from the model contract.

For each model of :data:`pyro_seq.models.MODELS`, built from its declared ``small_example``,
and each surface (``fit`` with resume, every objective, every evaluation method, every command
of the command line, ``--nproc 2``, ``--device``), the cell either works or stops with one line
naming the model and what it lacks. A new model meets every cell without new test code; the
table of what each model declares is ``docs/_generated/model_support.rst``.
"""

import json
import math
import tempfile
from pathlib import Path

import pyro
import pytest
import torch

from pyro_seq.cli import main
from pyro_seq.data import SequenceList, save_dataset
from pyro_seq.models import MODELS, Unsupported
from pyro_seq.models.contract import TASK_COMMANDS, TASKS
from pyro_seq.train import TrainConfig, evaluate_bound, fit
from pyro_seq.train.evaluate import ENERGY_METHODS
from pyro_seq.train.objectives import ENERGY_OBJECTIVES, OBJECTIVES, check_objective

NAMES = sorted(MODELS)
EVALUATION_METHODS = ("elbo", "iwae", "smc") + ENERGY_METHODS


def _build(name):
    cls = MODELS[name]
    ex = cls.small_example
    torch.manual_seed(0)
    return cls.for_data(ex["obs_dim"], ex["input_dim"], **ex["options"])


def _data(name, num=6, seed=0):
    """Sequences the model's declarations describe: ``obs_dim`` features (0/1 when
    ``binary_observations``), ``input_dim`` known inputs, lengths up to ``length``."""
    cls = MODELS[name]
    ex = cls.small_example
    model = _build(name)
    g = torch.Generator().manual_seed(seed)
    lengths = [ex["length"] - (i % 3) for i in range(num)]
    if model.binary_observations:
        seqs = [(torch.rand(T, ex["obs_dim"], generator=g) < 0.4).float() for T in lengths]
    else:
        seqs = [0.5 * torch.randn(T, ex["obs_dim"], generator=g) for T in lengths]
    if ex["input_dim"]:
        return SequenceList(seqs, [torch.randn(T, ex["input_dim"], generator=g) for T in lengths])
    return seqs


def _config(model, **kw):
    objective = model.objectives[0] if model.objectives else "elbo"
    return TrainConfig(
        **{
            "epochs": 1,
            "batch_size": 3,
            "objective": objective,
            "progress": False,
            "patience": None,
            **kw,
        }
    )


def _one_line_refusal(message, name):
    assert "\n" not in message, message
    assert message.startswith(f"{MODELS[name].module_name} does not support"), message


# ------------------------------------------------------------------ fit, objectives, evaluation


@pytest.mark.parametrize("name", NAMES)
def test_fit_resumes_exactly_or_refuses(name, tmp_path):
    model, data = _build(name), _data(name)
    if not model.trains_on_sequences:
        with pytest.raises(Unsupported) as e:
            fit(model, data[:4], data[4:], _config(model), tmp_path / "a")
        _one_line_refusal(str(e.value), name)
        return
    whole = _build(name)
    fit(whole, data[:4], data[4:], _config(whole, epochs=2), tmp_path / "whole")
    fit(model, data[:4], data[4:], _config(model, epochs=1), tmp_path / "parts")
    fit(model, data[:4], data[4:], _config(model, epochs=2), tmp_path / "parts")
    for (key, a), b in zip(whole.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), key
    log = json.loads((tmp_path / "parts" / "log.json").read_text())
    assert [row["epoch"] for row in log] == [1, 2]


@pytest.mark.parametrize("objective", OBJECTIVES + ENERGY_OBJECTIVES)
@pytest.mark.parametrize("name", NAMES)
def test_every_objective_trains_or_refuses(name, objective, tmp_path):
    model, data = _build(name), _data(name)
    if not model.supports(objective, "objective"):
        with pytest.raises(Unsupported) as e:
            check_objective(model, objective)
        _one_line_refusal(str(e.value), name)
        return
    if not model.trains_on_sequences:
        return  # refused by fit itself (test above)
    config = _config(model, objective=objective, num_particles=2 if objective != "cd" else 1)
    history = fit(model, data[:4], data[4:], config, tmp_path)
    key = "train_reconstruction_error" if model.energy_based else "train_loss_per_step"
    assert math.isfinite(history[-1][key])


@pytest.mark.parametrize("method", EVALUATION_METHODS)
@pytest.mark.parametrize("name", NAMES)
def test_every_evaluation_method_scores_or_refuses(name, method):
    model, data = _build(name), _data(name)
    if not model.supports(method, "method"):
        with pytest.raises(Unsupported) as e:
            evaluate_bound(model, data, method=method)
        _one_line_refusal(str(e.value), name)
        return
    pyro.set_rng_seed(0)
    result = evaluate_bound(model, data, method=method, num_particles=3, num_betas=20)
    assert math.isfinite(result["per_step"]) and result["num_sequences"] == len(data)
    if method in ("elbo", "iwae", "smc"):  # a bound on log p(x): below the exact value if known
        assert result["num_steps"] == sum(len(s) for s in data)


# ------------------------------------------------------------------ the command line


def _cli_run(name, folder, *extra):
    ex = MODELS[name].small_example
    save_dataset(
        folder / "data.pt",
        {"train": _data(name), "valid": _data(name, 3, seed=1), "test": _data(name, 3, seed=2)},
    )
    model = _build(name)
    options = [
        arg
        for key, value in ex["options"].items()
        for arg in ("--model-option", f"{key}={json.dumps(value)}")
    ]
    objective = model.objectives[0] if model.objectives else "elbo"
    return [
        "train",
        "--model",
        name,
        "--data",
        str(folder / "data.pt"),
        "--epochs",
        "1",
        "--batch-size",
        "3",
        "--objective",
        objective,
        "--kl-anneal-steps",
        "0",
        "--quiet",
        "--out",
        str(folder / "run"),
        *options,
        *extra,
    ]


@pytest.fixture(scope="module")
def trained_runs():
    """One trained run folder per model (or its refusal), shared by the command cells."""
    root = Path(tempfile.mkdtemp())
    runs = {}
    for name in NAMES:
        folder = root / name
        folder.mkdir()
        try:
            runs[name] = ("ok", main(_cli_run(name, folder)), folder / "run")
        except SystemExit as e:
            runs[name] = ("refused", str(e), folder / "run")
    return runs


COMMANDS = {
    "evaluate": [],
    "sample": ["--length", "4"],
    "impute": ["--drop", "1", "--iterations", "2", "--particles", "3"],
    "denoise": [],
    "forecast": ["--prefix", "2", "--steps", "1", "--num-samples", "2"],
}
TASK_OF = {command: task for task, command in TASK_COMMANDS.items()}


@pytest.mark.parametrize("name", NAMES)
def test_train_from_the_command_line_works_or_refuses_in_one_line(name, trained_runs):
    status, value, _ = trained_runs[name]
    if MODELS[name].trains_on_sequences:
        assert (status, value) == ("ok", 0)
    else:
        assert status == "refused" and "\n" not in value
        assert value.startswith(f"pyro-seq: error: {MODELS[name].module_name} does not support")


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name", NAMES)
def test_every_command_works_or_refuses_in_one_line(name, command, trained_runs, capsys):
    status, _, run = trained_runs[name]
    if status != "ok":
        return  # the model does not train on sequences: train refused it in one line
    model = _build(name)
    task = TASK_OF.get(command)
    args = [command, str(run), *COMMANDS[command]]
    if task is None or model.supports(task):
        assert main(args) == 0
        return
    with pytest.raises(SystemExit) as e:
        main(args)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        f"pyro-seq: error: {model.module_name} does not support task {command}: "
    ), message


@pytest.mark.parametrize("name", [n for n in NAMES if MODELS[n].trains_on_sequences])
def test_data_parallel_training_from_the_command_line(name, tmp_path):
    assert main(_cli_run(name, tmp_path, "--nproc", "2", "--threads", "1")) == 0
    assert (tmp_path / "run" / "best.pt").exists()


@pytest.mark.parametrize("name", NAMES)
def test_device_option_trains_where_asked_or_refuses(name, tmp_path):
    if not MODELS[name].trains_on_sequences:
        return
    if torch.cuda.is_available():
        assert main(_cli_run(name, tmp_path, "--device", "cuda")) == 0
        return
    with pytest.raises(SystemExit, match="^pyro-seq: error: .*CUDA"):
        main(_cli_run(name, tmp_path, "--device", "cuda"))


def test_the_matrix_covers_every_declared_task_and_model():
    assert set(TASK_OF.values()) == set(TASKS)
    assert {
        "dmm",
        "srnn",
        "vrnn",
        "vaernn",
        "storn",
        "vosp",
        "vrae",
        "rnn",
        "kvae",
        "gtmsm",
        "lgssm",
        "rtrbm",
        "srtrbm",
        "collaborative_rbm",
    } <= set(NAMES)
