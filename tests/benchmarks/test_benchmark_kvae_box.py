"""The KVAE imputation benchmark (``benchmarks/paper/kvae_box.py``) takes its settings from the
preset ``kvae_box``: the recorded run kvae_box_1000.json is the preset's configuration with the
data sizes it records as overrides, a flag that changes a preset value is an override, and a
tiny run hands :func:`pyro_seq.train.fit` exactly the preset's configuration plus the typed
overrides."""

import json
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import pyro_seq.train
from pyro_seq.models import KVAE
from pyro_seq.presets import get_preset
from pyro_seq.train import TrainConfig

PAPER = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path[:0] = [str(PAPER), str(PAPER.parent)]

import kvae_box  # noqa: E402

RESULTS = PAPER.parent / "results"
PRESET = get_preset("kvae_box")


def _settings(*argv):
    return kvae_box.settings(kvae_box.parse_args(list(argv)))


def test_the_preset_is_the_configuration_of_the_recorded_run():
    """The KVAE of kvae_box_1000.json was built as KVAE((H, W), channels=32,
    dynamics_warmup_epochs=5) and trained with this TrainConfig (the script at the time): the
    preset's model and training configuration are the same."""
    recorded = TrainConfig(
        epochs=20,
        batch_size=16,
        lr=0.007,
        clip_norm=150.0,
        lr_schedule="exponential",
        lr_decay_after=1,
        lr_decay_factor=(1 / 0.85) ** (1 / 20),
        patience=None,
        init="none",
        seed=0,
        valid_batch_size=100,
    )
    assert PRESET.train_config() == recorded
    then, now = KVAE((32, 32), channels=32, dynamics_warmup_epochs=5), PRESET.build(32 * 32)
    assert now.image_shape == then.image_shape == (32, 32)
    assert (now.reconstruction_weight, now.dynamics_warmup_epochs) == (0.3, 5)
    shapes = {k: v.shape for k, v in then.state_dict().items()}
    assert {k: v.shape for k, v in now.state_dict().items()} == shapes


def test_the_recorded_run_is_the_presets_command():
    """The preset's command gives the recorded settings: the preset's training configuration,
    and the recorded data (100 validation videos, a fifth of its 500 test videos, as the script
    then chose) as the only overrides."""
    settings = json.loads((RESULTS / "kvae_box_1000.json").read_text())["settings"]
    words = shlex.split(PRESET.script)
    assert words[0] == "benchmarks/paper/kvae_box.py"
    args = kvae_box.parse_args(words[1:])
    run = kvae_box.settings(args)
    assert run["overrides"] == {"valid": settings["test"] // 5, "test": settings["test"]}
    assert run["data"] == {"env": "box", "train": 1000, "valid": 100, "test": 500}
    assert run["config"] == PRESET.train_config(num_threads=1, progress=True, device="cpu")
    assert run["model_options"] == dict(PRESET.model_options)
    used = kvae_box.used_settings(args, run)
    for key, value in settings.items():
        if key not in ("smoke_dir", "tag"):
            assert used[key] == value, key
    assert run["tag"] == settings["tag"] == "box_1000"


def test_flags_default_to_the_preset_and_typed_values_are_overrides():
    run = _settings()
    assert run["overrides"] == {} and run["tag"] == "box_1000"
    assert run["data"] == {"env": "box", "train": 1000, "valid": 200, "test": 200}  # box:1000
    assert run["config"] == PRESET.train_config(num_threads=1, progress=True, device="cpu")
    assert run["model_options"] == dict(PRESET.model_options) and run["baseline_epochs"] == 20
    same = ["--train", "1000", "--epochs", "20", "--batch-size", "16", "--lr", "0.007"]
    assert _settings(*same, "--channels", "32", "--warmup-epochs", "5")["overrides"] == {}
    argv = ["--train", "500", "--lr", "0.001", "--warmup-epochs", "2", "--time-limit", "60"]
    run = _settings(*argv)
    assert run["overrides"] == {"train": 500, "warmup_epochs": 2, "lr": 0.001, "time_limit": 60.0}
    assert run["data"] == {"env": "box", "train": 500, "valid": 100, "test": 100}
    expected = PRESET.train_config(lr=0.001, time_limit=60.0)
    assert run["config"] == replace(expected, num_threads=1, progress=True, device="cpu")
    assert run["model_options"] == dict(PRESET.model_options, dynamics_warmup_epochs=2)
    assert run["tag"] == "box_500"
    # the commands of the other recorded runs: a fifth of --test validates, as then
    for file in ("kvae_box_gravity_500.json", "kvae_box_5000_cuda.json"):
        settings = json.loads((RESULTS / file).read_text())["settings"]
        typed = ["--env", settings["env"], "--train", str(settings["train"])]
        data = _settings(*typed, "--test", str(settings["test"]))["data"]
        assert data == {
            "env": settings["env"],
            "train": settings["train"],
            "valid": settings["test"] // 5,
            "test": settings["test"],
        }


def test_smoke_run_trains_the_presets_configuration_and_records_the_overrides(
    tmp_path, monkeypatch
):
    pytest.importorskip("pymunk", reason="the box videos need the 'sim' extra (pymunk)")
    calls = {}
    real_fit = pyro_seq.train.fit

    def fit(model, train, valid, config, out):
        calls[Path(out).name] = (model, config, len(train), len(valid))
        return real_fit(model, train, valid, config, out)

    monkeypatch.setattr(pyro_seq.train, "fit", fit)
    argv = ["--smoke", "--smoke-dir", str(tmp_path), "--seed", "0", "--time-limit", "600"]
    kvae_box.main(argv)
    result = json.loads((tmp_path / "result.json").read_text())
    overrides = dict(kvae_box.SMOKE, time_limit=600.0)  # --seed 0: the preset's
    assert result["preset"] == "kvae_box" and result["overrides"] == overrides
    model, config, n_train, n_valid = calls["run"]
    expected = PRESET.train_config(epochs=1, batch_size=8, time_limit=600.0)
    assert config == replace(expected, num_threads=1, progress=False, device="cpu")
    assert result["train"] == json.loads(json.dumps(asdict(config)))
    assert isinstance(model, KVAE) and model.dynamics_warmup_epochs == 0
    assert model.reconstruction_weight == PRESET.model_options["reconstruction_weight"]
    assert (n_train, n_valid) == (16, 1)
    assert result["data"] == {"env": "box", "train": 16, "valid": 1, "test": 8}
    assert result["settings"]["epochs"] == 1 and result["settings"]["lr"] == PRESET.train["lr"]
    assert calls["vaernn"][1].epochs == 1  # the baselines: the KVAE's epochs by default
