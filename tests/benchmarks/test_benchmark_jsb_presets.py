"""The benchmark scripts of the paper tables take their settings from the presets
(:mod:`pyro_seq.presets`), so that the docs' tables, the scripts and ``pyro-seq train --preset``
cannot drift apart: each script's recorded runs train exactly its presets' model options and
training configuration, a flag that changes a preset's value is recorded as an override, and
the scripts hold no training settings of their own."""

import argparse
import ast
import json
import pickle
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pyro_seq.presets import PRESETS, get_preset

PAPER = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
DIAGNOSTICS = PAPER.parent / "diagnostics"
sys.path[:0] = [str(PAPER), str(DIAGNOSTICS), str(PAPER.parent)]

import bounds_jsb  # noqa: E402
import gtmsm_navigation  # noqa: E402
import jsb_dmm  # noqa: E402
import jsb_srnn  # noqa: E402
import kvae_box  # noqa: E402
import rtrbm_jsb  # noqa: E402
import train_defaults  # noqa: E402
import zoo_jsb  # noqa: E402

CONVERTED = [
    jsb_dmm,
    jsb_srnn,
    zoo_jsb,
    rtrbm_jsb,
    train_defaults,
    bounds_jsb,
    kvae_box,
    gtmsm_navigation,
]
#: The functions that train a script's baselines, which have no preset (the AE-RNN is no
#: model of the package): their settings are their own.
BASELINES = {kvae_box: ("train_baseline", "train_vaernn")}
RESULTS = PAPER.parent / "results"


def _script_argv(preset, script):
    """The options of ``preset.script`` (the command that measured it) for ``script``."""
    words = shlex.split(preset.script.split(",")[0].split("(")[0])
    assert words[0] == f"benchmarks/{script}", preset.script
    return words[1:]


def _write_piano_rolls(path, lengths=((6, 5, 7, 6), (5, 6), (8, 6))):
    """A tiny Boulanger-Lewandowski pickle (MIDI note tuples per step)."""
    g = torch.Generator().manual_seed(0)
    splits = {
        split: [
            [tuple(int(k) for k in torch.randint(40, 80, (3,), generator=g)) for _ in range(T)]
            for T in sizes
        ]
        for split, sizes in zip(("train", "valid", "test"), lengths)
    }
    path.write_bytes(pickle.dumps(splits))


@pytest.mark.parametrize("script", [jsb_dmm, jsb_srnn])
def test_the_scripts_train_with_the_presets_settings(script):
    default = get_preset(script.PRESETS[0])  # names this script as the source of its number
    assert default.script.startswith(f"benchmarks/paper/{Path(script.__file__).name}")
    assert script.MODEL == dict(default.model_options)
    assert script.CONFIG == default.train_config()
    # the script writes <name>.json, or <name>_<tag>.json for a run given --tag
    words = default.script.split()
    tag = words[words.index("--tag") + 1] if "--tag" in words else None
    stem = Path(script.__file__).stem + (f"_{tag}" if tag else "")
    assert default.result and default.result[0].file == f"{stem}.json"


def _source_without_baselines(script):
    source = Path(script.__file__).read_text()
    baselines = [
        ast.get_source_segment(source, node)
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name in BASELINES.get(script, ())
    ]
    assert len(baselines) == len(BASELINES.get(script, ()))
    for segment in baselines:
        source = source.replace(segment, "")
    return source


@pytest.mark.parametrize("script", CONVERTED, ids=lambda m: m.__name__)
def test_the_scripts_hold_no_training_settings_of_their_own(script):
    source = _source_without_baselines(script)
    assert "TrainConfig(" not in source and not re.search(r"\blr=", source)
    if script in (jsb_dmm, jsb_srnn):
        assert not re.search(r"\bz_dim=", source)
    if script is kvae_box:  # the KVAE is the preset's, built by it
        assert "KVAE(" not in source and "clip_norm=" not in source
        assert re.findall(r"\bchannels=\d+", source) == ["channels=4"]  # --smoke's size
        assert "TrainConfig(" in Path(script.__file__).read_text()  # the baselines' only
    if script is gtmsm_navigation:  # the GTM-SM is the preset's, built by it
        assert "clip_norm=" not in source and "lr_schedule=" not in source
        assert "PRESET.build(" in source and not re.search(r"_multiplier=\d", source)
        assert re.findall(r"\bepochs=\d+", source) == ["epochs=1"]  # --smoke's
    if script is bounds_jsb:  # the only sizes of its own: the smoke test's
        assert len(re.findall(r"\bz_dim=", source)) == 1 and "z_dim=16" in source


def test_zoo_cells_of_the_presets_train_the_presets_settings():
    defaults = zoo_jsb.parse_args([])
    assert set(zoo_jsb.CELL_PRESETS.values()) == {
        name for name, p in PRESETS.items() if p.script.startswith("benchmarks/paper/zoo_jsb.py")
    }
    for cell, name in zoo_jsb.CELL_PRESETS.items():
        preset = get_preset(name)
        model, objective = cell.split("/")
        assert preset.model == model and preset.train["objective"] == objective
        for part in preset.result:  # the number lives in this cell of a zoo result file
            assert part.file.startswith("zoo_jsb") and part.key[:2] == ("cells", cell)
        for args in (defaults, zoo_jsb.parse_args(_script_argv(preset, "paper/zoo_jsb.py"))):
            cell_set = zoo_jsb.cell_settings(model, objective, args)
            assert cell_set["preset"] == name and cell_set["overrides"] == {}
            assert cell_set["model_options"] == dict(preset.model_options)
            assert cell_set["config"] == preset.train_config()
            assert cell_set["evaluation"] == {
                "eval": preset.evaluation.objective,
                "eval_particles": preset.evaluation.particles,
            }
    # the preset's command runs its cell: --models and --objectives name it
    argv = _script_argv(get_preset("vrnn_jsb_fivo"), "paper/zoo_jsb.py")
    args = zoo_jsb.parse_args(argv)
    assert (args.models, args.objectives, args.budget) == (["vrnn"], ["fivo"], 600.0)


def test_zoo_cells_without_a_preset_take_the_shared_settings():
    shared = get_preset(zoo_jsb.SHARED_PRESET)
    cell_set = zoo_jsb.cell_settings("dmm", "iwae", zoo_jsb.parse_args([]))
    assert cell_set["preset"] is None and cell_set["overrides"] == {}
    assert cell_set["model_options"] == {}  # the model's default sizes
    expected = shared.train_config(objective="iwae", time_limit=zoo_jsb.DEFAULT_BUDGET)
    assert cell_set["config"] == expected
    assert expected.num_particles == 4 and expected.batch_size == 16


def test_zoo_flags_that_change_a_presets_value_are_overrides():
    preset = get_preset("storn_jsb")
    assert preset.train["time_limit"] == 900.0 and preset.train["num_particles"] == 4
    # --particles 4 and --eval iwae equal the preset's values: no overrides
    argv = ["--budget", "20", "--particles", "4", "--eval", "iwae", "--eval-particles", "8"]
    cell_set = zoo_jsb.cell_settings("storn", "elbo", zoo_jsb.parse_args([*argv, "--small"]))
    assert cell_set["overrides"] == {
        "budget": 20.0,
        "eval_particles": 8,
        "model_options": zoo_jsb.SMALL["storn"],
    }
    assert cell_set["config"] == preset.train_config(time_limit=20.0)
    assert cell_set["evaluation"] == {"eval": "iwae", "eval_particles": 8}
    assert cell_set["model_options"] == zoo_jsb.SMALL["storn"]


def test_zoo_smoke_trains_each_cell_with_its_recorded_settings(tmp_path, monkeypatch):
    """Two preset cells end to end on tiny data: fit receives each preset's training
    configuration with the typed overrides, and the result records them."""
    data = tmp_path / "jsb_chorales.pickle"
    _write_piano_rolls(data)
    written, configs = {}, {}
    real_fit = zoo_jsb.fit

    def fit(model, train, valid, config, out):
        configs[Path(out).name] = config
        return real_fit(model, train, valid, config, out)

    monkeypatch.setattr(zoo_jsb, "ROOT", tmp_path)
    monkeypatch.setattr(zoo_jsb, "fit", fit)
    monkeypatch.setattr(
        zoo_jsb, "write_result", lambda name, payload: written.update({name: payload})
    )
    argv = ["--models", "vrnn", "--objectives", "fivo", "elbo", "--small", "--epochs", "1"]
    argv += ["--eval-particles", "2", "--forecast-sequences", "1", "--forecast-samples", "2"]
    zoo_jsb.main([*argv, "--data", str(data), "--tag", "smoke"])
    cells = written["zoo_jsb_smoke"]["cells"]
    for objective in ("fivo", "elbo"):
        cell = cells[f"vrnn/{objective}"]
        preset = get_preset(f"vrnn_jsb_{objective}")
        assert cell["preset"] == preset.name and cell["epochs"] == 1
        assert cell["overrides"] == {
            "epochs": 1,
            "eval_particles": 2,
            "model_options": zoo_jsb.SMALL["vrnn"],
        }
        assert cell["model_options"] == zoo_jsb.SMALL["vrnn"]  # the preset's are {}
        assert cell["estimator"] == "IWAE(2)"
        expected = replace(preset.train_config(epochs=1), num_threads=1)
        assert cell["train"] == json.loads(json.dumps(expected.__dict__))
        # a fresh cell: the whole budget is left; the run's own threads and no progress bar
        given = configs[f"vrnn_{objective}"]
        assert given == replace(expected, progress=False)


def test_rtrbm_preset_is_the_recorded_training_configuration():
    """The RTRBM of rtrbm_jsb_bidir_full_*.json was trained with the preset's configuration
    (plateau_restore_best False: the halved rate goes on from the last weights, as when the
    first RTRBM was trained before the restore existed); its result records every field, and
    the evaluation's chains and temperatures."""
    preset = get_preset("rtrbm_jsb")
    config = preset.train_config()
    for part in preset.result:
        payload = json.loads((RESULTS / part.file).read_text())
        recorded = payload["runs"]["jsb"]["rtrbm"]["train"]
        assert recorded["plateau_restore_best"] is False and config.plateau_restore_best is False
        for key, value in recorded.items():
            if key in ("time_limit", "num_threads", "extra", "init"):
                continue  # run options; "srnn" and "bias" both only set an RBM's visible bias
            assert getattr(config, key) == (tuple(value) if isinstance(value, list) else value), key
        assert payload["runs"]["jsb"]["rtrbm"]["num_hidden"] == preset.model_options["num_hidden"]
        settings = payload["settings"]
        assert (settings["ais_chains"], settings["ais_betas"]) == (
            preset.evaluation.particles,
            preset.evaluation.betas,
        )


def test_rtrbm_flags_default_to_the_preset_and_typed_values_are_overrides():
    p = rtrbm_jsb.PRESET
    values, overrides = rtrbm_jsb.settings(argparse_namespace(rtrbm_jsb))
    assert overrides == {}
    assert values == {
        "hidden": p.model_options["num_hidden"],
        "cd_steps": p.train["cd_steps"],
        "epochs": p.train["epochs"],
        "batch_size": p.train["batch_size"],
        "lr": p.train["lr"],
        "ais_chains": p.evaluation.particles,
        "ais_betas": p.evaluation.betas,
    }
    typed = argparse_namespace(rtrbm_jsb, hidden=16, lr=p.train["lr"], ais_betas=50)
    assert rtrbm_jsb.settings(typed)[1] == {"hidden": 16, "ais_betas": 50}  # lr: the preset's


def argparse_namespace(script, **typed):
    """The flags of ``script.settings`` as parsed with nothing typed but ``typed``."""
    return argparse.Namespace(**dict(dict.fromkeys(script.PRESET_FLAGS), **typed))


def test_rtrbm_smoke_trains_with_the_preset_and_records_the_overrides(tmp_path, monkeypatch):
    _write_piano_rolls(tmp_path / "jsb_chorales.pickle")
    written, configs = {}, {}
    real_fit = rtrbm_jsb.fit

    def fit(model, train, valid, config, out):
        configs[Path(out).name] = (model, config)
        return real_fit(model, train, valid, config, out)

    monkeypatch.setattr(rtrbm_jsb, "ROOT", tmp_path)
    monkeypatch.setattr(rtrbm_jsb, "RESULTS", tmp_path)
    monkeypatch.setattr(rtrbm_jsb, "fit", fit)
    monkeypatch.setattr(rtrbm_jsb, "write_result", lambda n, r: written.update({n: r}))
    argv = ["--datasets", "jsb", "--models", "rtrbm", "srtrbm", "--hidden", "16", "--epochs", "1"]
    argv += ["--ais-chains", "2", "--ais-betas", "3", "--data-dir", str(tmp_path), "--tag", "s"]
    rtrbm_jsb.main([*argv, "--lr", "0.01"])  # the preset's rate: no override
    preset = rtrbm_jsb.PRESET
    runs = written["rtrbm_jsb_s"]["runs"]["jsb"]
    expected = {"hidden": 16, "epochs": 1, "ais_chains": 2, "ais_betas": 3}
    assert runs["rtrbm"]["overrides"] == expected
    assert runs["srtrbm"]["overrides"] == dict(expected, model="srtrbm")
    for name in ("rtrbm", "srtrbm"):
        model, config = configs[f"jsb_{name}"]
        assert runs[name]["preset"] == preset.name
        assert config == preset.train_config(epochs=1, num_threads=1, progress=True)
    assert configs["jsb_rtrbm"][0].num_hidden == 16
    assert type(configs["jsb_rtrbm"][0]).__name__ == "RTRBM"


def test_train_defaults_runs_are_the_presets_and_their_recorded_configurations():
    """The recorded restore run on JSB-2x (the srnn_jsb2x preset's number) and the recipe run
    (train_defaults_full.json) have exactly their preset's configuration, as the script builds
    them, and were scored with the preset's evaluation seeds (4; the script's default was 8)."""
    td = train_defaults
    assert (
        td.VARIANTS["restore"] == td.VARIANTS["defaults"] == get_preset("srnn_jsb2x").train_config()
    )
    assert td.VARIANTS["recipe"] == get_preset("srnn_jsb2x_recipe").train_config()
    for file, data, variant in (
        ("train_defaults_s20r2x.json", "jsb_2x", "restore"),
        ("train_defaults_full.json", "jsb", "recipe"),
        ("train_defaults_full.json", "jsb", "candidate"),
    ):
        payload = json.loads((RESULTS / file).read_text())
        run = payload["runs"][data][variant]
        config = td.VARIANTS[variant]
        for key, value in run["train"].items():
            if key in ("time_limit", "num_threads", "progress", "extra"):
                continue  # run options
            if key == "plateau_restore_best" and "plateau_restore_best" not in run["train"]:
                continue
            assert getattr(config, key) == (tuple(value) if isinstance(value, list) else value), (
                variant,
                key,
            )
        assert payload["model"] == td.MODEL
        assert len(run["test_elbo_per_seed"]) == td.PRESET.evaluation.seeds


def test_train_defaults_smoke_records_the_preset_and_the_typed_overrides(tmp_path, monkeypatch):
    _write_piano_rolls(tmp_path / "jsb_chorales_2x.pickle")
    written, configs = {}, {}
    real_fit = train_defaults.fit

    def fit(model, train, valid, config, out):
        configs[Path(out).name] = (model, config)
        return real_fit(model, train, valid, config, out)

    monkeypatch.setattr(train_defaults, "ROOT", tmp_path)
    monkeypatch.setattr(train_defaults, "RESULTS", tmp_path)
    monkeypatch.setattr(train_defaults, "fit", fit)
    monkeypatch.setattr(train_defaults, "write_result", lambda n, r: written.update({n: r}))
    argv = ["--datasets", "jsb_2x", "--variants", "restore", "candidate", "--epochs", "1"]
    argv += ["--d-dim", "8", "--z-dim", "4", "--hidden-dim", "500", "--eval-seeds", "1"]
    train_defaults.main([*argv, "--data-dir", str(tmp_path), "--tag", "s", "--quiet"])
    runs = written["train_defaults_s"]["runs"]["jsb_2x"]
    preset = get_preset("srnn_jsb2x")
    expected = {"epochs": 1, "eval_seeds": 1, "model_options": {"d_dim": 8, "z_dim": 4}}
    for variant, changes in (("restore", {}), ("candidate", {"plateau_restore_best": False})):
        assert runs[variant]["preset"] == "srnn_jsb2x"
        assert runs[variant]["overrides"] == expected  # hidden_dim 500: the preset's
        assert runs[variant]["variant_changes"] == train_defaults.VARIANT_CHANGES[variant]
        model, config = configs[f"jsb_2x_{variant}"]
        assert config == preset.train_config(epochs=1, progress=False, **changes)
        assert model.z_dim == 4 and model.deterministic.rnn.hidden_size == 8
        assert len(runs[variant]["test_elbo_per_seed"]) == 1


def _bounds_settings(*argv):
    return bounds_jsb.settings(bounds_jsb.parse_args(list(argv)))


def test_bounds_presets_differ_only_in_the_objective():
    shared = bounds_jsb.PRESET
    assert set(bounds_jsb.PRESETS.values()) == {
        name for name, p in PRESETS.items() if p.script.startswith("benchmarks/paper/bounds_jsb")
    }
    for objective, name in bounds_jsb.PRESETS.items():
        preset = get_preset(name)
        assert preset.train["objective"] == objective and preset.model == "srnn"
        assert preset.train_config() == shared.train_config(objective=objective)
        assert preset.model_options == shared.model_options
        assert (preset.evaluation, preset.data) == (shared.evaluation, shared.data)
        (part,) = preset.result  # this objective's number in bounds_jsb.json
        assert part.file == "bounds_jsb.json" and part.key[-1] == objective
    assert bounds_jsb.SIZES["medium"] == {k: shared.model_options[k] for k in bounds_jsb.SIZE_KEYS}


SIZES = ("d_dim", "z_dim", "hidden_dim")


@pytest.mark.parametrize(
    "file, argv, changed",
    [
        ("bounds_jsb.json", _script_argv(bounds_jsb.PRESET, "paper/bounds_jsb.py"), ()),
        ("bounds_jsb_full_filtering.json", ["--size", "full", "--cost-only"], SIZES),
        (
            "bounds_jsb_full_smoothing.json",
            ["--size", "full", "--inference", "smoothing"],
            (*SIZES, "inference"),
        ),
    ],
)
def test_bounds_recorded_runs_are_the_presets_settings(file, argv, changed):
    """Each recorded file's model, training configuration and estimator are what the script
    builds from the presets with its command: the presets' own for bounds_jsb.json, the
    thesis's sizes (and smoothing) as model overrides for the full-size step costs."""
    payload = json.loads((RESULTS / file).read_text())
    run = _bounds_settings(*argv)
    assert run["name"] == Path(file).stem
    assert payload["model"] == dict(run["model_options"], obs_dim=88)
    overrides = {k: payload["model"][k] for k in changed}
    assert run["overrides"] == ({"model_options": overrides} if changed else {})
    for key, value in payload["train"].items():  # fields added since keep their defaults
        if key in ("objective", "extra"):
            continue  # one run per objective; extra was always {} and is gone
        assert getattr(run["train"], key) == (tuple(value) if isinstance(value, list) else value)
    for objective, config in run["configs"].items():
        preset = get_preset(bounds_jsb.PRESETS[objective])
        assert config == preset.train_config(num_threads=1, progress=True)
    estimator = payload["estimator"]
    assert estimator["method"] == bounds_jsb.PRESET.evaluation.objective
    assert estimator["num_particles"] == run["evaluation"]["eval_particles"]
    assert len(estimator["seeds"]) == run["evaluation"]["eval_seeds"]


def test_bounds_flags_default_to_the_presets_and_typed_values_are_overrides():
    preset = bounds_jsb.PRESET
    same = ["--particles", "4", "--size", "medium", "--inference", "filtering", "--epochs", "500"]
    same += ["--kl-anneal-steps", "0", "--eval-particles", "64", "--eval-seeds", "5"]
    assert _bounds_settings(*same)["overrides"] == {}  # typed, but the presets' values
    run = _bounds_settings("--particles", "8", "--kl-anneal-steps", "100", "--eval-seeds", "2")
    assert run["overrides"] == {"particles": 8, "kl_anneal_steps": 100, "eval_seeds": 2}
    assert run["configs"]["iwae"] == get_preset("srnn_jsb_bounds_iwae").train_config(
        num_particles=8, kl_start=0.2, kl_anneal_steps=100, num_threads=1, progress=True
    )
    assert run["evaluation"] == {"eval_particles": preset.evaluation.particles, "eval_seeds": 2}
    assert run["name"] == "bounds_jsb"  # the presets' model: the recorded result's name
    small = _bounds_settings("--size", "small")
    assert small["name"] == "bounds_jsb_small_filtering"
    assert small["overrides"] == {"model_options": bounds_jsb.SIZES["small"]}


def test_bounds_smoke_trains_each_objective_with_its_preset(tmp_path, monkeypatch):
    """A tiny run end to end: fit receives each objective's preset configuration with the
    typed overrides (in rounds of one epoch), and the result records presets and overrides."""
    data = tmp_path / "jsb_chorales.pickle"
    _write_piano_rolls(data)
    written, calls = {}, []
    real_fit = bounds_jsb.fit

    def fit(model, train, valid, config, out):
        calls.append((Path(out).name, config, model))
        return real_fit(model, train, valid, config, out)

    monkeypatch.setattr(bounds_jsb, "ROOT", tmp_path)
    monkeypatch.setattr(bounds_jsb, "fit", fit)
    monkeypatch.setattr(bounds_jsb, "write_result", lambda n, r: written.update({n: r}))
    argv = ["--size", "small", "--epochs", "2", "--round-epochs", "1", "--particles", "4"]
    argv += ["--eval-particles", "2", "--eval-seeds", "1", "--no-cost", "--quiet"]
    bounds_jsb.main([*argv, "--data", str(data), "--out", str(tmp_path / "ck")])
    payload = written["bounds_jsb_small_filtering"]
    overrides = {
        "model_options": bounds_jsb.SIZES["small"],
        "epochs": 2,
        "eval_particles": 2,
        "eval_seeds": 1,
    }
    assert payload["overrides"] == overrides and payload["presets"] == bounds_jsb.PRESETS
    assert payload["smoke"] is True
    # the objectives take turns: all three to epoch 1, then all three to epoch 2
    assert [(name, config.epochs) for name, config, _ in calls] == [
        (o, e) for e in (1, 2) for o in bounds_jsb.OBJECTIVES
    ]
    for name, config, model in calls:
        preset = get_preset(bounds_jsb.PRESETS[name])
        expected = preset.train_config(epochs=2, num_threads=1, progress=False)
        assert config == replace(expected, epochs=config.epochs)
        assert model.z_dim == 16 and model.deterministic.rnn.hidden_size == 64
    shared = bounds_jsb.PRESET.train_config(epochs=2, num_threads=1, progress=False)
    recorded = dict(
        json.loads(json.dumps(shared.__dict__)), objective=payload["train"]["objective"]
    )
    assert payload["train"] == recorded and recorded["num_particles"] == 4
    assert payload["estimator"]["num_particles"] == 2 and payload["estimator"]["seeds"] == [1234]
    for objective in bounds_jsb.OBJECTIVES:
        result = payload["objectives"][objective]
        assert result["epochs_completed"] == 2
        assert len(result["evaluation"]["best_valid_elbo"]["per_seed"]) == 1
