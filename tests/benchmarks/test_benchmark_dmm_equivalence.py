"""Smoke test of ``benchmarks/diagnostics/dmm_example_equivalence.py``: Pyro's unchanged
``examples/dmm.py`` and the package's DMM twin (same weights, ``min_scale=0``) compute the
same ELBO and the same gradients in float64, and the package's optimiser takes the example's
steps from the same gradients. One draw, no lockstep training (about 20 s on one core).
Skipped when the anchor or the JSB pickle is not there."""

import json
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path[:0] = [str(BENCHMARKS / "speed"), str(BENCHMARKS / "diagnostics"), str(BENCHMARKS)]

import anchors  # noqa: E402


def test_example_and_twin_are_the_same_function(tmp_path):
    try:
        anchors.load_anchor()
    except anchors.AnchorMissing as e:
        pytest.skip(f"anchor not available: {e}")
    import dmm_example_equivalence

    out = tmp_path / "equivalence.json"
    threads = torch.get_num_threads()
    try:
        dmm_example_equivalence.main(
            ["--particles", "1", "--lockstep", "", "--lockstep-epochs", "0", "--output", str(out)]
        )
    finally:
        torch.set_num_threads(threads)  # the script sets one thread for its timings
    report = json.loads(out.read_text())
    assert report["data_identical_to_example_loader"] is True
    init = report["float64"]["init_seed0"]
    assert init["latent_path_max_abs_diff_twin"] < 1e-12  # same noise, same latent paths
    for af in ("af_1", "af_0.2"):
        res = init[af]
        elbo = res["elbo_per_step"]
        # float64 sums of about 1300 steps: equal to rounding, not just close
        assert abs(elbo["twin"] - elbo["example"]) <= 1e-12 * abs(elbo["example"])
        assert res["twin_minus_example_loss_per_step"]["max_abs_per_draw"] < 1e-11
        assert res["twin_grad_vs_example"]["all_rel_diff"] < 1e-12
        # the preset (min_scale 1e-3) differs from the example, by a little
        assert 0 < abs(elbo["preset"] - elbo["example"]) < 0.05 * abs(elbo["example"])
    for update in report["updates"]["same_gradients"]:
        assert update["twin_max_abs_step_diff"] <= 1e-12 * update["max_abs_step_example"]
    lr = report["updates"]["lr_after_updates"]
    assert lr["twin"] == lr["example"]
