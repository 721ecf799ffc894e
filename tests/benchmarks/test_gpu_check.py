"""``benchmarks/speed/gpu_check.py``, the check for a lent GPU machine, in its short mode on the CPU
(``--device cpu --smoke``): every section runs and reports, and its comparison code really
compares (tested on perturbed inputs, since CPU against CPU gives 0)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "speed" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check_cpu.json"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_report_names_the_device_and_passes(report):
    assert report["device"] == "cpu" and report["device_info"]["device"] == "cpu"
    assert report["device_info"]["device_name"]  # the CPU model on a CPU run
    assert report["smoke"] is True and report["ok"] is True and report["failures"] == []
    assert {"torch", "pyro", "cpu"} <= set(report["machine"])


def test_every_model_and_objective_cell_is_finite_and_on_the_device(report):
    cells = report["grid"]["cells"]
    latent = ("dmm", "srnn", "vrnn", "vaernn", "storn", "vosp", "vrae", "rnn", "kvae")
    expected = {
        f"{m}/{o}" for m in latent for o in ("elbo", "meanfield", "free_bits", "iwae", "fivo")
    } | {"rtrbm/cd"}
    assert set(cells) == expected
    for name, cell in cells.items():
        assert cell["ok"], (name, cell.get("error"))
        assert math.isfinite(cell["train_loss_per_step"]), name
        assert math.isfinite(cell["valid_bound_per_step"]), name
        assert cell["parameter_devices"] == ["cpu"] and cell["sample_device"] == "cpu", name


def test_lgssm_errors_resume_and_device_errors(report):
    lgssm = report["lgssm"]
    assert lgssm["tolerance"] == 1e-9 and lgssm["ok"]
    assert len(lgssm["errors"]) >= 20 and lgssm["max_relative_error"] <= 1e-9
    assert all(0.0 <= e <= 1e-9 for e in lgssm["errors"].values())
    assert any(k.startswith("kalman_smoother[parallel]") for k in lgssm["errors"])
    assert report["resume"]["ok"] and report["resume"]["max_abs_difference"] == 0.0
    errors = report["device_errors"]
    assert errors["ok"] and errors["other_device"] == "meta"
    assert all(c["ok"] for c in errors["checks"].values())


def test_timing_reports_both_devices(report):
    timing = report["timing"]
    assert set(timing["models"]) == {"dmm", "srnn"}
    for row in timing["models"].values():
        assert len(row["device_seconds_per_epoch"]) == len(row["cpu_seconds_per_epoch"]) == 2
        assert row["median_device_seconds"] > 0 and row["median_cpu_seconds"] > 0


def test_throughput_curve_is_consistent_and_drawn(report):
    """Every model has one row per batch size on the device (the CPU here, so the CPU curve is
    the same rows), sequences per second = batch size / median step time, a real-step rate no
    larger than batch size x longest sequence, and the figure exists."""
    curve = report["throughput"]
    assert report["throughput"]["ok"] is True
    assert set(curve["models"]) == {"dmm", "srnn"}
    for entry in curve["models"].values():
        rows = entry["device"]
        assert [r["batch_size"] for r in rows] == [2, 4]
        for r in rows:
            assert len(r["seconds_per_step"]) == curve["steps"] == 1
            assert math.isclose(r["median_seconds_per_step"], r["seconds_per_step"][0])
            assert math.isclose(
                r["sequences_per_second"], r["batch_size"] / r["seconds_per_step"][0]
            )
            assert 0 < r["real_steps_per_second"] <= r["sequences_per_second"] * 60
        assert entry["cpu"] == rows and entry["cpu_over_device"] == [1.0, 1.0]
    assert Path(curve["figure"]).is_file() and Path(curve["figure"]).stat().st_size > 0


def test_throughput_batches_draw_the_same_minibatches_with_replacement():
    gpu_check = load_script()
    data = gpu_check.random_rolls(5, 3, 7, seed=0)
    a = gpu_check.throughput_batches(data, (4, 8), steps=2, seed=3)
    b = gpu_check.throughput_batches(data, (4, 8), steps=2, seed=3)
    assert sorted(a) == [4, 8] and all(len(v) == 3 for v in a.values())
    for bs in (4, 8):
        for (x, m), (y, n) in zip(a[bs], b[bs]):
            assert x.shape[0] == bs and torch.equal(x, y) and torch.equal(m, n)
            lengths = sorted(int(v) for v in m.sum(-1))
            assert set(lengths) <= {len(s) for s in data}  # drawn from the data, 8 > 5 rows


def test_relative_error_measures_a_perturbation():
    gc = load_script()
    b = torch.tensor([[1.0, -2.0], [0.0, 4.0]], dtype=torch.float64)
    assert gc.relative_error(b, b.clone()) == 0.0
    assert gc.relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    a = b.clone()
    a[1, 0] = 4e-8  # an absolute error of 4e-8 against max|b| = 4
    assert gc.relative_error(a, b) == pytest.approx(1e-8)
    assert gc.relative_error(b * (1 + 1e-12), b) == pytest.approx(1e-12, rel=1e-3)
    assert gc.relative_error(b[:1], b) == math.inf  # shapes differ
    nan = b.clone()
    nan[0, 0] = float("nan")
    assert gc.relative_error(nan, b) == math.inf  # a NaN where there is none
    assert gc.relative_error(nan, nan.clone()) == 0.0
    assert gc.relative_error(torch.ones(2), torch.zeros(2)) == math.inf


def test_the_lgssm_comparison_fails_a_perturbed_device_result(monkeypatch):
    gc = load_script()
    outputs = gc.lgssm_outputs

    def perturbed(device):
        out = outputs(device)
        if device.type == "cpu" and perturbed.calls == 1:  # the second call is "the device"
            key = "kalman_smoother[sequential].covs"
            out[key] = out[key] * (1 + 1e-7)
        perturbed.calls += 1
        return out

    perturbed.calls = 0
    monkeypatch.setattr(gc, "lgssm_outputs", perturbed)
    result = gc.check_lgssm(torch.device("cpu"))
    assert not result["ok"]
    assert result["errors"]["kalman_smoother[sequential].covs"] == pytest.approx(1e-7, rel=1e-3)
    assert result["errors"]["kalman_filter[sequential].means"] == 0.0
