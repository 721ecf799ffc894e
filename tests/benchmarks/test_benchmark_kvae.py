"""The KVAE benchmark scripts in their short modes: they run end to end and report every field
(values are not checked here: untrained models; the recorded runs are in benchmarks/results)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(script, *args):
    env = dict(
        os.environ,
        MPLBACKEND="Agg",
        PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "paper" / script), "--smoke", *args],
        cwd=ROOT / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_box_imputation_benchmark_smoke(tmp_path):
    pytest.importorskip("pymunk", reason="the box videos need the 'sim' extra (pymunk)")
    run("kvae_box.py", "--smoke-dir", str(tmp_path))
    result = json.loads((tmp_path / "result.json").read_text())
    errors = result["imputation_pixel_error"]
    assert set(errors) == {f"p={p}" for p in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)} | {
        "middle"
    }
    for row in errors.values():
        assert set(row) == {"generation", "filtering", "smoothing", "ae_rnn", "vaernn"}
        assert all(0.0 <= v <= 1.0 for v in row.values())
    assert math.isfinite(result["test_elbo_per_frame"]) and "machine" in result
    for name in ("fig_imputation.png", "fig_encodings.png", "fig_positions.png", "fig_frames.png"):
        assert (tmp_path / name).exists(), name


def test_pendulum_benchmark_smoke(tmp_path):
    out = tmp_path / "pendulum.json"
    run("kvae_pendulum.py", "--smoke-out", str(out))
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"kvae_mlp", "kvae_cnn", "dmm"}
    for r in result["results"].values():
        assert math.isfinite(r["test_elbo"]) and math.isfinite(r["test_iwae64"])
        assert r["input_dim"] == 1  # the torques reach every model through fit
    assert set(result["kvae_above_dmm"]) == {"kvae_mlp", "kvae_cnn"}
    assert result["results"]["kvae_mlp"]["preset"] == "kvae_pendulum"
    assert result["results"]["dmm"]["preset"] == "dmm_pendulum"


def test_pendulum_benchmark_dmm_without_inputs(tmp_path):
    out = tmp_path / "pendulum.json"
    run("kvae_pendulum.py", "--models", "dmm", "--no-dmm-inputs", "--smoke-out", str(out))
    result = json.loads(out.read_text())
    assert result["results"]["dmm"]["input_dim"] == 0 and result["kvae_above_dmm"] == {}
