"""benchmarks/paper/gtmsm_navigation.py in its short mode: it runs end to end, reports a frame error
per prediction step for every model, and a rerun resumes (skips what was evaluated)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


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
    for figure in ("error", "states", "frames"):
        assert (tmp_path / f"gtmsm_smoke_{figure}.png").stat().st_size > 0
    out = run("--smoke-dir", str(tmp_path))
    assert out.count("evaluated before, skipped") == 3


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
