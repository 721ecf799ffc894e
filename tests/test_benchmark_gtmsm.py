"""benchmarks/gtmsm_navigation.py in its short mode: it runs end to end, reports a frame error
per prediction step for every model, and a rerun resumes (skips what was evaluated)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gtmsm_navigation.py"),
                           "--smoke", *args], cwd=ROOT / "benchmarks", env=env,
                          capture_output=True, text=True, timeout=600)
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
    out = run("--smoke-dir", str(tmp_path))
    assert out.count("evaluated before, skipped") == 3
