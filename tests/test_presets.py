"""The paper presets (:mod:`pyro_seq.presets`) and their command line (``pyro-seq presets``,
``pyro-seq train --preset``): every preset's configuration builds its model and trains one
step on tiny data shaped like its own, the listing reads the measured numbers from the result
files, typed flags win over a preset's values and are recorded. The numbers themselves live in
the benchmarks (``benchmarks/results/``), not here."""

import json
import math
import pickle

import pytest
import torch

from pyro_seq.cli import main, make_parser
from pyro_seq.presets import PRESETS, RESULTS_DIR, Evaluation, Preset, ResultKey, get_preset

JSON_KEYS = ["name", "model", "data", "metric", "published", "measured", "source"]


def _write_piano_rolls(path, lengths=((5, 6), (4,), (5,))):
    """A tiny Boulanger-Lewandowski pickle (note lists): 2 training sequences (one update of
    a minibatch of 2), 1 validation, 1 test sequence."""
    g = torch.Generator().manual_seed(0)
    splits = {}
    for split, sizes in zip(("train", "valid", "test"), lengths):
        splits[split] = [
            [tuple(int(k) for k in torch.randint(40, 80, (3,), generator=g)) for _ in range(T)]
            for T in sizes
        ]
    path.write_bytes(pickle.dumps(splits))


@pytest.fixture
def data_env(tmp_path, monkeypatch):
    """Tiny stand-ins named as the presets' files in a folder of ``$PYRO_SEQ_DATA`` (the
    lookup a user's data takes), and a private cache for the simulated data."""
    folder = tmp_path / "data"
    folder.mkdir()
    for preset in PRESETS.values():
        if preset.data_file is not None:
            _write_piano_rolls(folder / preset.data_file)
    monkeypatch.setenv("PYRO_SEQ_DATA", str(folder))
    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path / "cache"))
    return folder


def _tiny_data_flag(preset):
    """``--data`` for a simulated preset: the same simulator with 2 training sequences (and 1
    validation and test sequence); GTM-SM sequences just longer than its memorisation."""
    if preset.data_file is not None:
        return []  # found in $PYRO_SEQ_DATA under the preset's own file name
    name = preset.data.partition(":")[0]
    if name == "image_navigation":
        tau = preset.build(64, 5).tau
        return ["--data", f"{name}:2:{tau + 4}"]
    return ["--data", f"{name}:2"]


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_and_trains_one_step(name, data_env, tmp_path):
    preset = PRESETS[name]
    out = tmp_path / "run"
    small = ["--epochs", "1", "--batch-size", "2", "--quiet"]
    assert (
        main(["train", "--preset", name, *_tiny_data_flag(preset), *small, "--out", str(out)]) == 0
    )
    run = json.loads((out / "config.json").read_text())
    assert run["preset"] == name and run["model"] == preset.model
    assert run["model_options"] == dict(preset.model_options)
    expected = dict(preset.train, epochs=1, batch_size=2, progress=False)
    for key, value in expected.items():
        assert run["train"][key] == value, key
    overrides = {"epochs": 1, "batch_size": 2, "progress": False}
    if preset.data_file is None:
        overrides["data"] = _tiny_data_flag(preset)[1]
    else:
        assert run["data"] == str(data_env / preset.data_file)
    assert run["overrides"] == overrides
    log = json.loads((out / "log.json").read_text())
    assert len(log) == 1 and log[0]["step"] == 1  # one update
    numbers = [v for v in log[0].values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers)


def test_typed_flags_override_the_preset_and_are_recorded(data_env, tmp_path):
    preset = get_preset("dmm_jsb")
    defaults = make_parser().parse_args(["train", "--out", "x"])
    # the test can fail: the preset differs from the command line's defaults here
    assert preset.train["lr"] != 1e-3 and defaults.lr == 1e-3
    assert preset.train["kl_anneal_steps"] != defaults.kl_anneal_steps
    assert preset.train["patience"] != defaults.patience
    out = tmp_path / "run"
    argv = ["train", "--preset", "dmm_jsb", "--lr", "0.001", "--epochs", "1", "--quiet"]
    assert main([*argv, "--model-option", "rnn_dim=16", "--out", str(out)]) == 0
    run = json.loads((out / "config.json").read_text())
    assert run["train"]["lr"] == 1e-3  # typed, though equal to the flag's default
    assert run["train"]["kl_anneal_steps"] == preset.train["kl_anneal_steps"]  # not typed
    assert run["train"]["patience"] == preset.train["patience"]
    assert run["train"]["batch_size"] == preset.train["batch_size"]
    assert run["model_options"] == dict(preset.model_options, rnn_dim=16)
    assert run["overrides"] == {
        "epochs": 1,
        "lr": 1e-3,
        "model_option": ["rnn_dim=16"],
        "progress": False,
    }


def test_json_listing_has_exactly_the_keys_and_the_result_files_numbers(capsys):
    assert main(["presets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == list(PRESETS)
    for row in rows:
        assert list(row) == JSON_KEYS
        preset = PRESETS[row["name"]]
        assert row["model"] == preset.model and row["published"] == preset.published
        assert row["measured"] == _measured_from_files(preset)


def _measured_from_files(preset):
    """The measured number read from the result file(s) here, independently of the package:
    one file's key; the RTRBM's test slices pooled as total log-likelihood over total steps."""
    if not preset.result:
        return None
    payloads = [json.loads((RESULTS_DIR / part.file).read_text()) for part in preset.result]
    if preset.name == "rtrbm_jsb":
        runs = [p["runs"]["jsb"]["rtrbm"] for p in payloads]
        assert sorted(r["test_slice"] for r in runs) == ["0:40", "40:200"]
        assert sum(r["test_sequences"] for r in runs) == 77  # the whole test set
        return pytest.approx(
            sum(r["test_total_loglik"] for r in runs) / sum(r["test_steps"] for r in runs),
            rel=1e-12,
        )
    values = []
    for payload, part in zip(payloads, preset.result):
        for key in part.key:
            payload = payload[key]
        values.append(payload)
    return values[0] if len(values) == 1 else pytest.approx(sum(values) / len(values), rel=1e-12)


@pytest.mark.skipif(not RESULTS_DIR.is_dir(), reason="no benchmark results in this install")
def test_measured_numbers_and_seconds_come_from_the_files():
    measured = [name for name, preset in PRESETS.items() if preset.measured() is not None]
    assert set(measured) == {name for name, preset in PRESETS.items() if preset.result}
    for preset in PRESETS.values():
        assert preset.measured() == _measured_from_files(preset)
        if preset.result:
            assert preset.seconds() > 0
    # the KVAE's training seconds are its epochs' seconds, summed
    box = json.loads((RESULTS_DIR / "kvae_box_1000.json").read_text())
    assert PRESETS["kvae_box"].seconds() == pytest.approx(sum(box["seconds_per_epoch"]))


def test_measured_is_none_without_the_file_or_the_key(tmp_path):
    preset = get_preset("srnn_jsb2x_recipe")
    assert preset.measured(tmp_path) is None and preset.seconds(tmp_path) is None
    (tmp_path / preset.result[0].file).write_text(json.dumps({"other": 1.0}))
    assert preset.measured(tmp_path) is None
    (tmp_path / preset.result[0].file).write_text(json.dumps({"test_elbo_per_step": -5.0}))
    assert preset.measured(tmp_path) == -5.0


def test_parts_without_weights_are_an_equal_mean_and_with_weights_pooled(tmp_path):
    for name, value, steps in (("a.json", -5.0, 100), ("b.json", -8.0, 300)):
        (tmp_path / name).write_text(json.dumps({"v": value, "n": steps}))
    seeds = _preset(result=(ResultKey("a.json", ("v",)), ResultKey("b.json", ("v",))))
    assert seeds.measured(tmp_path) == -6.5
    slices = _preset(
        result=(
            ResultKey("a.json", ("v",), weight=("n",)),
            ResultKey("b.json", ("v",), weight=("n",)),
        )
    )
    assert slices.measured(tmp_path) == (-5.0 * 100 - 8.0 * 300) / 400


def test_table_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == JSON_KEYS
    for name, line in zip(PRESETS, lines[1:]):
        assert line.split()[0] == name
    unmeasured = next(name for name, preset in PRESETS.items() if not preset.result)
    assert " - " in lines[1 + list(PRESETS).index(unmeasured)]  # not measured


def test_unknown_preset_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", "dmm_jsbb", "--out", str(tmp_path / "run")])
    message = str(e.value)
    assert "\n" not in message and "unknown preset 'dmm_jsbb'" in message
    assert all(name in message for name in PRESETS)
    with pytest.raises(ValueError, match="choose from dmm_jsb, "):
        get_preset("dmm_jsbb")
    assert not (tmp_path / "run").exists()


def test_missing_data_file_names_the_file_and_the_remedies(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_SEQ_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", "srnn_jsb2x", "--out", str(tmp_path / "run")])
    message = str(e.value)
    assert "\n" not in message and "jsb_chorales_2x.pickle" in message
    assert "--data PATH" in message and "$PYRO_SEQ_DATA" in message
    assert str(tmp_path / "empty") in message
    assert not (tmp_path / "run").exists()
    with pytest.raises(FileNotFoundError, match="jsb_chorales_2x.pickle"):
        get_preset("srnn_jsb2x").data_spec()
    # a typed --data PATH is used as it is
    assert get_preset("srnn_jsb2x").data_spec(tmp_path / "x.pickle") == str(tmp_path / "x.pickle")


def test_data_file_is_found_in_the_folders_of_pyro_seq_data(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
    (second / "jsb_chorales.pickle").write_bytes(b"")
    monkeypatch.setenv("PYRO_SEQ_DATA", f"{first}:{second}")
    assert get_preset("dmm_jsb").data_spec() == str(second / "jsb_chorales.pickle")
    assert get_preset("kvae_pendulum").data_spec() == "pendulum"  # a name: simulated


def _preset(**changes):
    values = dict(
        name="p",
        model="srnn",
        model_options={},
        train={},
        evaluation=Evaluation("elbo"),
        data="jsb_chorales.pickle",
        metric="m",
        published=-1.0,
        source="s",
        script="x.py",
    )
    values.update(changes)
    return Preset(**values)


def test_a_preset_is_checked_when_it_is_defined():
    assert _preset().train_config().lr == 1e-3  # the dataclass's defaults under the overrides
    with pytest.raises(ValueError, match=r"\['no_such_field'\] are no TrainConfig fields"):
        _preset(train={"no_such_field": 1})
    with pytest.raises(ValueError, match="model 'nope'"):
        _preset(model="nope")
    with pytest.raises(ValueError, match="lr must be a positive"):
        _preset(train={"lr": -1.0})
    with pytest.raises(ValueError, match="survive JSON"):
        _preset(model_options={"hidden_dims": (8, 8)})
    with pytest.raises(ValueError, match="evaluation objective"):
        Evaluation("nope")
    with pytest.raises(ValueError, match="betas"):
        Evaluation("elbo", betas=10)
    with pytest.raises(ValueError, match="weight path on every part"):
        _preset(result=(ResultKey("a.json", ("x",), weight=("n",)), ResultKey("b.json", ("x",))))
    assert get_preset("dmm_jsb_pyro").train_config().betas == (0.96, 0.999)  # JSON lists
