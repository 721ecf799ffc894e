"""Run tutorials/model_zoo.py in its short mode and check what it produces."""

import math

from tests.tutorials import tutorial_output_fixture

tutorial_output = tutorial_output_fixture("model_zoo")


def test_every_model_and_objective_has_a_finite_test_bound(tutorial_output):
    _, metrics = tutorial_output
    grid = metrics["grid"]
    models = {"DMM", "SRNN", "VRNN", "VAERNN", "STORN", "VRAE", "RNN"}
    assert {k.split("/")[0] for k in grid} == models and len(grid) == 3 * len(models)
    for cell in grid.values():
        # 88 Bernoulli units: a bound per step lies below 0 and above 88 log(1/2) - slack
        assert math.isfinite(cell["test_iwae_per_step"]) and -200 < cell["test_iwae_per_step"] < 0


def test_imputation_and_figures(tutorial_output):
    out, metrics = tutorial_output
    imp = metrics["imputation"]
    assert imp["dropped_steps"] >= 1 and math.isfinite(imp["bits_per_element"])
    for name in ("zoo_bounds.png", "imputation.png"):
        assert (out / name).stat().st_size > 1000
