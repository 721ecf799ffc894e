"""Run tutorials/spatial_memory.py in its short mode and check its figures and numbers."""

import math

import pytest

from tests.tutorials import tutorial_output_fixture

pytest.importorskip("sklearn", reason="image_navigation needs the 'images' extra")
pytest.importorskip("PIL", reason="image_navigation needs the 'images' extra")

FIGURES = [
    "environment.png",
    "elbo_curve.png",
    "frame_error.png",
    "predictions.png",
    "states_vs_positions.png",
]

tutorial_output = tutorial_output_fixture("spatial_memory", timeout=300)


def test_figures_and_metrics(tutorial_output):
    out, metrics = tutorial_output
    assert metrics["smoke"] is True
    for name in FIGURES:
        assert (out / name).stat().st_size > 0, name
    # known parts: a frame at a visited position is read back up to the 1/(d^2 + delta)
    # leakage, at most 4 / (1e4 + 4) of the pixel range
    assert metrics["oracle_max_error_visited"] <= 4 / (1e4 + 4)
    assert 0.0 < metrics["oracle_fraction_visited"] <= 1.0
    assert all(math.isfinite(v) and v < 0 for v in metrics["elbo_per_sequence"])
    assert all(math.isfinite(v) for v in metrics["fivo_losses"])
    errors = metrics["frame_error_per_step"]
    assert len(errors) == len(metrics["mean_frame_error_per_step"]) == 8
    assert all(0.0 <= e <= 10.0 for e in errors)
    assert all(r2 <= 1.0 for r2 in metrics["state_position_r2"])
