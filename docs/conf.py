"""Sphinx configuration of the pyro-seq site (``make docs``; ``tests/docs`` builds it too).

API pages come from the docstrings (autodoc + napoleon, math by MathJax); the tutorials are
the jupytext percent-format scripts of ``tutorials/`` (``docs/tutorials`` is a link to that
folder), read by myst-nb and executed at build time. ``PYRO_SEQ_SMOKE=1`` executes them in
their short mode (what the test suite does); without it they run in full and the executed
notebooks are cached in ``docs/_build/.jupyter_cache/full`` (re-run only when a tutorial
changes).
"""

import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import pyro_seq  # noqa: E402

project = "pyro-seq"
author = "pyro-seq developers"
copyright = "2026, pyro-seq developers"
version = release = pyro_seq.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_nb",
    "pyro_seq_docs",
    "train_config_table",
    "preset_table",
]
exclude_patterns = [
    "_build",
    "_ext",
    "_examples",
    "_generated",
    "conf.py",
    "tutorials/_*",
    "tutorials/_output",
    "**/.ipynb_checkpoints",
    "**/__pycache__",
]
templates_path = []
html_theme = "furo"
html_title = f"pyro-seq {release}"
html_static_path = []

# -- API pages ---------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}  # module pages list ":members:" themselves
autodoc_inherit_docstrings = False  # torch's forward/expand docs are not ours
autodoc_typehints = "description"  # annotations next to the parameters they belong to
napoleon_use_rtype = False  # "Returns: float64 tensor: ..." is prose, not a class
napoleon_use_ivar = True

# Every cross-reference must resolve (-n): a broken :class:/:func:/:mod: is an error under -W.
nitpicky = True
# Targets outside this package: their inventories cannot be fetched at build time (no network,
# so no intersphinx), so references to them render as plain text instead of links.
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|pyro|numpy|np|scipy|music21|mido|tqdm|matplotlib|aeon|argparse|os|"
        r"pathlib|pickle|_pickle|pickletools|io|typing|collections|dataclasses|enum|"
        r"abc|functools|concurrent|multiprocessing|socket|builtins)(\..*)?",
    ),
    # the conventional lower-case type name of ":param callable fn:" fields
    (r"py:class", r"callable"),
]

# -- Tutorials ---------------------------------------------------------------------------------
SMOKE = os.environ.get("PYRO_SEQ_SMOKE", "0") not in ("", "0")
nb_custom_formats = {".py": ["jupytext.reads", {"fmt": "py:percent"}]}
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
nb_execution_mode = os.environ.get("PYRO_SEQ_DOCS_EXECUTION", "cache")
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache" / ("smoke" if SMOKE else "full"))
nb_execution_timeout = 600 if SMOKE else 7200  # seconds per cell
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
# text/markdown cell outputs are MyST, so that a tutorial can show an admonition (the banner of
# short-mode pages, pyro_seq/_tutorial_support.py) from a cell whose input is removed
nb_render_markdown_format = "myst"


def _kernel_spec():
    """A Jupyter kernel that is *this* Python (the venv that runs Sphinx, with ipykernel and
    pyro_seq), found before any ``python3`` kernel installed elsewhere on the machine; the
    tutorials it runs write their files under ``$PYRO_SEQ_OUTPUT`` (default: a temporary
    folder of this build)."""
    folder = Path(tempfile.mkdtemp(prefix="pyro-seq-docs-kernel-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    spec = folder / "kernels" / "pyro-seq-docs"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (pyro-seq docs)",
                "language": "python",
                "env": {
                    "PYTHONPATH": os.pathsep.join(
                        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
                    ),
                    "MPLBACKEND": "Agg",
                    # the tutorials' figures and files: a folder of this build, removed after
                    # it (the pages embed the figures), never a folder of the repository
                    "PYRO_SEQ_OUTPUT": os.environ.get("PYRO_SEQ_OUTPUT") or str(folder / "output"),
                },
            }
        )
    )
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(folder)] + [p for p in [os.environ.get("JUPYTER_PATH")] if p]
    )
    return "pyro-seq-docs"


nb_kernel_rgx_aliases = {".*": _kernel_spec()}
