"""What every tutorial of ``tutorials/`` does before its first visible cell: read its options,
pick the folder its files go to, and say when its numbers come from a short run.

Private to the tutorials (the first cell of each, hidden on the site, calls :func:`setup`).

* Short mode: ``PYRO_SEQ_SMOKE=1`` (or ``--smoke`` when run as a script) runs a tutorial on
  few sequences with tiny networks for a few epochs, as the test suite and ``tests/docs`` do.
* Files (figures, MIDI, metrics, checkpoints) go to ``--out`` when run as a script, else to
  ``$PYRO_SEQ_OUTPUT/<tutorial>``, else to ``<temporary folder>/pyro-seq-tutorials/<tutorial>``:
  never into the repository.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

SMOKE_VARIABLE = "PYRO_SEQ_SMOKE"
OUTPUT_VARIABLE = "PYRO_SEQ_OUTPUT"

#: The banner of a page built in short mode (MyST: an admonition).
SMOKE_BANNER = (
    "```{warning}\n"
    "**Short run.** This page was built in short mode (`PYRO_SEQ_SMOKE=1`): a few sequences, "
    "tiny networks and a few epochs, only to check that the code runs. Its numbers and "
    "figures are meaningless as results; run the tutorial without `PYRO_SEQ_SMOKE` (or build "
    "the site with `make docs`) for the real ones.\n"
    "```"
)


class Tutorial(NamedTuple):
    """The settings :func:`setup` returns: ``smoke`` (short mode) and ``out`` (the folder the
    tutorial writes to, created)."""

    smoke: bool
    out: Path


def in_notebook() -> bool:
    """Whether this runs under a Jupyter kernel (the executed pages of the site)."""
    return "ipykernel" in sys.modules


def smoke_from_environment() -> bool:
    """``$PYRO_SEQ_SMOKE`` set to anything but ``""`` or ``"0"``."""
    return os.environ.get(SMOKE_VARIABLE, "0") not in ("", "0")


def output_folder(name: str, out: Optional[str] = None) -> Path:
    """The folder tutorial ``name`` writes to (see the module's docstring), created."""
    if out:
        folder = Path(out).expanduser()
    elif os.environ.get(OUTPUT_VARIABLE):
        folder = Path(os.environ[OUTPUT_VARIABLE]).expanduser() / name
    else:
        folder = Path(tempfile.gettempdir()) / "pyro-seq-tutorials" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def setup(name: str, description: str, argv: Optional[Sequence[str]] = None) -> Tutorial:
    """Options, output folder and banner of tutorial ``name`` (``description``: its one-line
    ``--help``). As a script it reads ``--out`` and ``--smoke`` (unknown arguments are left
    alone) and prints where its files go; under a kernel it reads only the environment, and
    a short-mode page shows :data:`SMOKE_BANNER`."""
    if in_notebook():
        smoke, out = smoke_from_environment(), None
    else:
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument(
            "--out",
            default=None,
            help=f"folder for figures and metrics (default ${OUTPUT_VARIABLE}/{name}, "
            f"else {Path(tempfile.gettempdir()) / 'pyro-seq-tutorials' / name})",
        )
        parser.add_argument(
            "--smoke", action="store_true", help=f"short mode (as {SMOKE_VARIABLE}=1)"
        )
        args, _ = parser.parse_known_args(argv)
        smoke, out = args.smoke or smoke_from_environment(), args.out
    tutorial = Tutorial(smoke, output_folder(name, out))
    if in_notebook():
        if smoke:
            from IPython.display import Markdown, display

            display(Markdown(SMOKE_BANNER))
    else:
        mode = " (short mode: the numbers are meaningless)" if smoke else ""
        print(f"{name}: writing to {tutorial.out}{mode}")
    return tutorial
