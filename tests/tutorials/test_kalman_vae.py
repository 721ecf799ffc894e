"""Run tutorials/kalman_vae.py in its short mode and check its figures and numbers."""

import math

import pytest

from tests.tutorials import tutorial_output_fixture

pytest.importorskip("pymunk", reason="the bouncing-ball videos need the 'sim' extra (pymunk)")

FIGURES = [
    "video.png",
    "elbo_curve.png",
    "imputation_curves.png",
    "imputed_video.png",
    "codes_vs_positions.png",
]

tutorial_output = tutorial_output_fixture("kalman_vae", timeout=600)


def test_figures_and_metrics(tutorial_output):
    out, metrics = tutorial_output
    assert metrics["smoke"] is True
    for name in FIGURES:
        assert (out / name).stat().st_size > 0, name
    assert math.isfinite(metrics["test_elbo_per_video"]) and metrics["test_elbo_per_video"] < 0
    assert all(math.isfinite(v) for v in metrics["fivo_losses"])
    errors = metrics["imputation_pixel_error"]
    for method in ("generation", "filtering", "smoothing"):
        assert len(errors[method]) == len(errors["p"])
        assert all(0.0 <= e <= 1.0 for e in errors[method])
    assert all(r2 <= 1.0 for r2 in metrics["position_r2"])
