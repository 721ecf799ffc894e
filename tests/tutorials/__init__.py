"""Tests that run the tutorials in their short mode."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_tutorial(name, out, timeout=600, unset=()):
    """Run ``tutorials/<name>.py --out OUT`` with ``PYRO_SEQ_SMOKE=1`` against this checkout
    (``PYTHONPATH``, not whichever pyro_seq the interpreter would find installed); assert that
    it exits with 0 and return the finished process."""
    env = dict(os.environ, PYRO_SEQ_SMOKE="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    )
    for key in unset:
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tutorials" / f"{name}.py"), "--out", str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def tutorial_output_fixture(name, **kwargs):
    """A module-scoped fixture that runs tutorial ``name`` once (``run_tutorial(name, out,
    **kwargs)``) and gives ``(out, metrics)``, the folder and its ``metrics.json``."""

    @pytest.fixture(scope="module")
    def tutorial_output(tmp_path_factory):
        out = tmp_path_factory.mktemp(name)
        run_tutorial(name, out, **kwargs)
        return out, json.loads((out / "metrics.json").read_text())

    return tutorial_output
