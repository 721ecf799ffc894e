"""benchmarks/paper/gtmsm_navigation.py in its short mode: it runs end to end, reports a frame error
per prediction step for every model, and a rerun resumes (skips what was evaluated)."""

import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from pyro_seq.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]
PRESET = get_preset("gtmsm_navigation")


def run(*args):
    env = dict(
        os.environ,
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "paper" / "gtmsm_navigation.py"),
            "--smoke",
            *args,
        ],
        cwd=ROOT / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_gtmsm_navigation_benchmark_smoke(tmp_path):
    pytest.importorskip("sklearn", reason="image_navigation needs the 'images' extra")
    pytest.importorskip("PIL", reason="image_navigation needs the 'images' extra")
    run("--smoke-dir", str(tmp_path))
    result = json.loads((tmp_path / "gtmsm_smoke.json").read_text())
    assert "machine" in result and result["settings"]["test_pred"] == 6
    for name in ("gtmsm", "srnn", "vrnn", "mean_memorised_frame"):
        row = result["results"][name]
        errors = row if name == "mean_memorised_frame" else row["frame_error_per_step"]
        assert len(errors) == 6 and all(0.0 <= e < 10.0 for e in errors), name
    states = result["gtmsm_states"]["gtmsm"]
    assert len(states["r2_memorisation"]) == 2 and len(states["r2_prediction"]) == 2
    assert len(states["position_error_per_step"]) == 6
    assert torch.tensor(states["M"]).shape == (2, 5)
    # the GTM-SM trained the preset's configuration with --smoke's sizes, recorded as overrides
    smoke = {"train": 8, "tau": 12, "pred": 4, "epochs": 1, "batch_size": 4}
    smoke.update(gtmsm_neighbour_warmup=[12, 20], smoke_sizes=result["overrides"]["smoke_sizes"])
    assert result["preset"] == "gtmsm_navigation" and result["overrides"] == smoke
    gtmsm = result["results"]["gtmsm"]
    assert gtmsm["preset"] == "gtmsm_navigation" and gtmsm["overrides"] == smoke
    expected = replace(PRESET.train_config(epochs=1, batch_size=4), num_threads=1, progress=False)
    assert gtmsm["train"] == json.loads(json.dumps(asdict(expected)))
    assert gtmsm["model_options"] == dict(
        PRESET.model_options,
        tau=12,
        neighbour_warmup=[12, 20],
        displacement_lr_multiplier=1.0,
        **smoke["smoke_sizes"],
    )
    for name in ("srnn", "vrnn"):  # the same training, their own epochs; no preset
        assert result["results"][name]["train"] == gtmsm["train"]
        assert result["results"][name]["preset"] is None
    for figure in ("error", "states", "frames"):
        assert (tmp_path / f"gtmsm_smoke_{figure}.png").stat().st_size > 0
    out = run("--smoke-dir", str(tmp_path))
    assert out.count("evaluated before, skipped") == 3


def _navigation_script():
    sys.path[:0] = [str(ROOT / "benchmarks" / "paper"), str(ROOT / "benchmarks")]
    import gtmsm_navigation

    return gtmsm_navigation


def test_gtmsm_navigation_defaults_and_the_recorded_command_are_the_preset():
    """The script's defaults and the preset's recorded command give the preset's model
    options and TrainConfig with no overrides, the model ``pyro-seq train --preset`` builds
    for 8x8 frames with 5 actions as inputs, and the settings of the recorded GTM-SM in
    gtmsm_nav_1000_exp.json (options, 40 epochs, 1000 sequences of 256 + 32 steps)."""
    nav = _navigation_script()
    command = shlex.split(PRESET.script)
    assert command[0] == "benchmarks/paper/gtmsm_navigation.py"
    preset_model = PRESET.build(64, 5)
    recorded = json.loads((ROOT / "benchmarks" / "results" / PRESET.result[0].file).read_text())
    learned = recorded["results"]["gtmsm_learned"]
    for argv in ([], command[1:]):
        args = nav.parse_args(argv)
        run = nav.settings(args)
        assert run["preset"] == PRESET.name and run["overrides"] == {}
        assert run["config"] == replace(PRESET.train_config(), num_threads=1, progress=True)
        assert run["data"] == {"train": 1000, "pred": 32}
        model = nav.build("gtmsm", args, run)
        for attr in ("tau", "neighbour_warmup", "displacements", "num_neighbours", "z_dim"):
            assert getattr(model, attr) == getattr(preset_model, attr), attr
        assert model.lr_multipliers == preset_model.lr_multipliers
        assert {k: v.shape for k, v in model.state_dict().items()} == {
            k: v.shape for k, v in preset_model.state_dict().items()
        }
        used = nav.used_settings(args, run)
        assert {k: used[k] for k in learned["gtmsm_options"]} == {
            **learned["gtmsm_options"],
            "gtmsm_variant": used["gtmsm_variant"],
        }
        assert used["epochs"] == learned["epochs"] == len(learned["history"]) == 40
        for key in ("train", "tau", "pred", "batch_size", "lr", "seed"):
            assert used[key] == recorded["settings"][key], key
    assert nav.parse_args(command[1:]).models == ["gtmsm_learned"]


def test_gtmsm_navigation_typed_flags_are_overrides():
    """Flags that change a preset value are recorded; the thesis's literal settings typed as
    flags give the model options of the preset gtmsm_navigation_thesis; the baselines keep
    their own epochs."""
    nav = _navigation_script()
    thesis = get_preset("gtmsm_navigation_thesis")
    argv = ["--gtmsm-displacements", "free", "--gtmsm-neighbour-warmup", "none"]
    argv += ["--gtmsm-wall-lr", "1", "--epochs", "3", "--lr", "2e-3", "--seed", "1"]
    args = nav.parse_args(argv)
    run = nav.settings(args)
    assert run["overrides"] == {
        "gtmsm_displacements": "free",
        "gtmsm_neighbour_warmup": None,
        "gtmsm_wall_lr": 1.0,
        "epochs": 3,
        "lr": 2e-3,
        "seed": 1,
    }
    options = {k: run["model_options"][k] for k in thesis.model_options}
    assert options == dict(thesis.model_options)
    expected = PRESET.train_config(epochs=3, lr=2e-3, seed=1)
    assert run["config"] == replace(expected, num_threads=1, progress=True)
    assert run["baseline_epochs"] == nav.BASELINE_EPOCHS == 50
    true_m = nav.settings(nav.parse_args(["--gtmsm-true-m", "--gtmsm-neighbour-warmup", "9", "4"]))
    assert true_m["overrides"] == {"gtmsm_true_m": True, "gtmsm_neighbour_warmup": [9, 4]}
    assert true_m["model_options"]["displacement_lr_multiplier"] == 0.0
    with pytest.raises(SystemExit):
        nav.parse_args(["--gtmsm-neighbour-warmup", "9"])


def test_gtmsm_learning_r2_is_one_for_states_that_are_an_affine_map_of_positions():
    """The diagnostic of benchmarks/diagnostics/gtmsm_learning.py: with M and walls that make the
    states an
    affine map of the positions (oracle M in grid units on a walk without walls), R^2 is 1; a
    model whose M ignores the direction of the moves gets far less."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "diagnostics"))
    import gtmsm_learning

    # a walk on an unbounded grid (no walls), with the actions that produced it
    from pyro_seq.data.simulators.navigation import ACTION_MOVES
    from pyro_seq.models import GTMSM

    g = torch.Generator().manual_seed(0)
    actions = torch.randint(0, 5, (6, 40), generator=g)
    positions = 4 + torch.from_numpy(ACTION_MOVES)[actions].cumsum(1)
    frames = torch.rand(6, 40, 64, generator=g, dtype=torch.float64)
    # a free M (the thesis): the second M below breaks the default inverse pairs on purpose
    m = GTMSM(tau=40, walls=False, transition_noise=1e-6, displacements="free").double()
    with torch.no_grad():
        m.M.copy_(torch.tensor([[-1.0, 1, 0, 0, 0], [0, 0, -1, 1, 0]]))
    per_seq, pooled = gtmsm_learning.state_r2(m, frames, actions, positions, 40)
    assert per_seq == pytest.approx(1.0, abs=1e-9) and pooled == pytest.approx([1.0, 1.0], abs=1e-9)
    with torch.no_grad():  # displacements that ignore the direction: states count moves only
        m.M.copy_(torch.tensor([[1.0, 1, 0, 0, 0], [0, 0, 1, 1, 0]]))
    per_seq, _ = gtmsm_learning.state_r2(m, frames, actions, positions, 40)
    assert per_seq < 0.8


def test_gtmsm_learning_smoke_trains_through_fit_and_resumes(tmp_path):
    """The diagnostic trains with pyro_seq.train.fit and measures in its on_epoch hook: a first
    call stopped by --time-limit after epoch 1, a second call resumes epoch 2, a third finds the
    finished run and trains nothing. The result's epochs are fit's log rows: M from the M_i_j
    columns, M_change the norm of M's change between consecutive epochs (across the resume),
    the loss per sequence fit's loss per step times the 12 + 4 steps of a sequence."""
    pytest.importorskip("sklearn", reason="image_navigation needs the 'images' extra")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "diagnostics" / "gtmsm_learning.py"),
        "--smoke",
        "--smoke-dir",
        str(tmp_path),
    ]
    for extra, epochs in ((["--time-limit", "1e-6"], [1]), ([], [1, 2]), ([], [1, 2])):
        proc = subprocess.run(
            cmd + extra,
            cwd=ROOT / "benchmarks",
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads((tmp_path / "gtmsm_learning_smoke.json").read_text())
        assert [r["epoch"] for r in result["epochs"]] == epochs
    log = json.loads((tmp_path / "log.json").read_text())  # fit's rows, with the hook's columns
    rows = result["epochs"]
    assert [r["updates"] for r in rows] == [2, 4]  # 8 sequences in batches of 4
    for row, fit_row in zip(rows, log):
        assert row["M"] == [[fit_row[f"M_{i}_{j}"] for j in range(5)] for i in range(2)]
        assert row["r2_pooled"] == [fit_row["r2_pooled_0"], fit_row["r2_pooled_1"]]
        assert row["loss_per_sequence"] == fit_row["train_loss_per_step"] * 16
        assert row["valid_elbo_per_step"] == fit_row["valid_elbo_per_step"]
        assert -1.0 <= row["r2_per_sequence"] <= 1.0 and row["num_neighbours"] == 5
    moved = float((torch.tensor(rows[1]["M"]) - torch.tensor(rows[0]["M"])).norm())
    assert rows[1]["M_change"] == pytest.approx(moved, rel=1e-5) and moved > 0
    assert rows[0]["M_change"] > 0
    assert rows[1]["seconds"] > rows[0]["seconds"]  # wall time over both calls
    oracle = result["oracle_check"]
    assert oracle["valid_sequences"] == 3 and oracle["repeats"] == 3


def test_gtmsm_learning_preset_option_gives_the_presets_settings():
    """gtmsm_learning --preset: the model options (inverse pairs, K from 256 down to 5 over 20
    epochs, the walls at 10x the rate) and the preset's TrainConfig, plateau schedule included;
    typed flags win; the thesis preset gives a free M, no warm-up and one rate."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "diagnostics"))
    import gtmsm_learning

    args = gtmsm_learning.parse_args(["--preset", "gtmsm_navigation", "--seed", "2"])
    assert (args.displacements, args.neighbours_start, args.neighbours_epochs) == (
        "inverse_pairs",
        256,
        20,
    )
    assert args.lr_walls == pytest.approx(10 * args.lr) and args.lr_m == args.lr == 1e-3
    assert (args.train, args.tau, args.pred, args.tag) == (1000, 256, 32, "gtmsm_navigation_seed2")
    config = gtmsm_learning.train_config(args)
    assert config == PRESET.train_config(
        seed=2, time_limit_counts="wall", device="cpu", num_threads=1, progress=True
    )
    assert (config.lr_schedule, config.lr_decay_after, config.lr_decay_factor) == (
        "exponential",
        20,
        1.1,
    )
    assert config.epochs == 40 and config.batch_size == 16
    typed = gtmsm_learning.parse_args(["--preset", "gtmsm_navigation", "--lr", "2e-3"])
    assert typed.lr_walls == pytest.approx(2e-2)
    typed = gtmsm_learning.parse_args(["--preset", "gtmsm_navigation", "--lr-walls", "5e-3"])
    assert typed.lr_walls == 5e-3
    thesis = gtmsm_learning.parse_args(["--preset", "gtmsm_navigation_thesis"])
    assert (thesis.displacements, thesis.neighbours_start, thesis.lr_walls) == ("free", None, 1e-3)
    plain = gtmsm_learning.parse_args([])  # without --preset: the diagnostic's own settings
    assert gtmsm_learning.train_config(plain).lr_schedule == "constant"
    assert (plain.displacements, plain.neighbours_start, plain.lr_walls) == ("free", None, 1e-3)


def test_blocked_as_stay_makes_the_walk_exactly_linear():
    """gtmsm_learning.blocked_as_stay: with the blocked moves recorded as "stay", every position
    is the centre plus the cumulative sum of the true displacements of the actions (the walls'
    effect is gone); the frames and positions are untouched, and only blocked moves changed."""
    pytest.importorskip("sklearn", reason="image_navigation needs the 'images' extra")
    pytest.importorskip("PIL", reason="image_navigation needs the 'images' extra")
    sys.path.insert(0, str(ROOT / "benchmarks" / "diagnostics"))
    import gtmsm_learning

    from pyro_seq.data.simulators import image_navigation
    from pyro_seq.data.simulators.navigation import ACTION_MOVES

    videos = image_navigation(12, 120, cache=False, progress=False)
    moves = torch.from_numpy(ACTION_MOVES)
    walked = 4 + moves[videos.actions].cumsum(1)
    assert not torch.equal(walked, videos.positions)  # the raw actions hit walls
    actions = gtmsm_learning.blocked_as_stay(videos)
    assert torch.equal(4 + moves[actions].cumsum(1), videos.positions)
    changed = actions != videos.actions
    assert changed.any() and (actions[changed] == 4).all()
    with pytest.raises(ValueError, match="centre"):
        gtmsm_learning.blocked_as_stay(
            image_navigation(2, 20, start="random", cache=False, progress=False)
        )


def test_delta_curriculum_is_geometric_from_start_to_final():
    sys.path.insert(0, str(ROOT / "benchmarks" / "diagnostics"))
    import gtmsm_learning

    at = gtmsm_learning.delta_at
    assert at(0, 1.0, 10, 1e-4) == 1.0
    assert at(5, 1.0, 10, 1e-4) == pytest.approx(1e-2, rel=1e-12)  # the geometric midpoint
    assert at(10, 1.0, 10, 1e-4) == at(37, 1.0, 10, 1e-4) == 1e-4
    assert at(3, None, 10, 1e-4) == 1e-4


def test_inverse_pairs_start_is_two_dimensional_with_opposite_inverse_actions():
    sys.path.insert(0, str(ROOT / "benchmarks" / "diagnostics"))
    import gtmsm_learning

    M = gtmsm_learning.inverse_pairs(0.5, torch.Generator().manual_seed(3))
    u, l = M[:, 0], M[:, 2]
    assert (
        torch.equal(M[:, 1], -u)
        and torch.equal(M[:, 3], -l)
        and torch.equal(M[:, 4], torch.zeros(2))
    )
    assert float(u.norm()) == pytest.approx(0.5, rel=1e-6) and float(l.norm()) == pytest.approx(
        0.5, rel=1e-6
    )
    assert float(u @ l) == pytest.approx(0.0, abs=1e-6)
