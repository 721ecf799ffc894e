"""Smoke test of ``benchmarks/diagnostics/site_layout_cost.py``: the SRNN's and the DMM's ELBO
written as one expression over all steps (the package's networks and fused scans, no sample
sites) equals the package's ``Trace_ELBO`` over its per-step sites in float64 with the same
noise (and the SRNN's equals the plain-PyTorch floor), so the diagnostic's timings compare the
same function. Tiny sizes for the SRNN (random data); the DMM needs Pyro's example (skipped
without the anchor or the JSB pickle)."""

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path[:0] = [str(BENCHMARKS / "speed"), str(BENCHMARKS / "diagnostics"), str(BENCHMARKS)]

import anchors  # noqa: E402
import site_layout_cost  # noqa: E402


@pytest.fixture
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # the script sets one thread for its timings


def test_srnn_three_forms_agree(restore_threads, tmp_path):
    out = tmp_path / "srnn.json"
    result = site_layout_cost.main(["--smoke", "--output", str(out)])
    check = result["check_same_elbo"]
    assert check["passed"]
    assert max(check["rel_diff_to_plain"].values()) <= 1e-9
    assert set(result["median_wall_seconds_per_epoch"]) == {"pyro_seq", "plain", "one_expression"}
    assert out.exists()


def test_dmm_one_expression_equals_trace_elbo(restore_threads, tmp_path):
    try:
        anchors.load_anchor()
    except anchors.AnchorMissing as e:
        pytest.skip(f"anchor not available: {e}")
    result = site_layout_cost.main(
        ["--model", "dmm", "--smoke", "--output", str(tmp_path / "d.json")]
    )
    assert result["check_same_elbo"]["rel_diff"] <= 1e-9
    assert result["median_wall_seconds_per_epoch"]["pyro_example"] > 0
