"""Run tutorials/model_zoo.py in its short mode and check what it produces."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tutorials" / "model_zoo.py"


@pytest.fixture(scope="module")
def tutorial_output(tmp_path_factory):
    out = tmp_path_factory.mktemp("model_zoo")
    env = dict(os.environ, PYRO_SEQ_SMOKE="1", MPLBACKEND="Agg")
    # the checkout under test, not whichever pyro_seq the interpreter would find installed
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SCRIPT.parents[1])] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], env=env,
                          cwd=SCRIPT.parents[1], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out, json.loads((out / "metrics.json").read_text())


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
