"""Tests that run the tutorials in their short mode."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_tutorial(name, out, timeout=600, unset=()):
    """Run ``tutorials/<name>.py --out OUT`` with ``PYRO_SEQ_SMOKE=1`` against this checkout
    (``PYTHONPATH``, not whichever pyro_seq the interpreter would find installed); assert that
    it exits with 0 and return the finished process."""
    env = dict(os.environ, PYRO_SEQ_SMOKE="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    for key in unset:
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(ROOT / "tutorials" / f"{name}.py"), "--out", str(out)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc
