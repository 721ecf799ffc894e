"""Build the Sphinx site as ``make docs`` does (``-W``, nitpicky references), with the tutorials
executed in their short mode (``PYRO_SEQ_SMOKE=1``), and check the public API is documented.

The fast tests need no Sphinx: they check every public symbol's docstring and every entry of
the equations index with the same functions the build uses (``docs/_ext/pyro_seq_docs.py``).
"""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import pyro_seq_docs  # noqa: E402

BUILD_DEPS = ("sphinx", "furo", "myst_nb", "jupytext", "ipykernel")


def test_every_public_symbol_has_a_docstring():
    """Every name in an ``__all__`` of pyro_seq: classes and functions carry a docstring."""
    symbols = list(pyro_seq_docs.public_symbols())
    assert len(symbols) > 100
    missing = [s.public_name for s in symbols if not s.has_docstring]
    assert not missing, f"public symbols without a docstring: {missing}"


def test_every_public_symbol_has_a_page_entry_target():
    """Each public symbol maps to a name an API page can document (its definition, or the
    module a constant is assigned in)."""
    for s in pyro_seq_docs.public_symbols():
        assert s.targets, s.public_name
        assert all(t.startswith("pyro_seq") for t in s.targets), s


def test_every_module_is_on_an_api_page():
    pages = "\n".join(p.read_text() for p in (DOCS / "api").glob("*.rst"))
    for module in pyro_seq_docs.public_modules():
        assert f".. automodule:: {module}\n" in pages, f"{module} is on no page of docs/api/"


def test_equation_index_entries_resolve_to_real_objects():
    citations = pyro_seq_docs.equation_citations()
    assert len({(c.source, c.equation) for c in citations}) > 60
    for c in citations:
        assert pyro_seq_docs.import_target(c.target) is not None, c
        assert c.source in pyro_seq_docs.SOURCES_BY_KEY, c
    assert pyro_seq_docs.citation_problems(citations) == []
    found = {(c.source, c.equation): c.target for c in citations}
    assert found[("thesis", "3.12")]  # the Kalman log-likelihood
    assert ("seed000", "1.2") in found and ("seed003", "17") in found


def test_equation_citations_are_attributed_to_their_documents():
    """The attribution rules on made-up docstrings (module-level defaults, ranges, lists)."""
    num = pyro_seq_docs._numbers
    assert num("3.4-3.6") == [(3, 4), (3, 5), (3, 6)]
    assert num("(1)-(2)") == [(1,), (2,)]
    assert pyro_seq_docs._attribute((3, 12), "the filter", "") == "thesis"
    assert pyro_seq_docs._attribute((1, 2), "the recursion", "") == "seed000"
    assert pyro_seq_docs._attribute((9,), "see seed 003 sec. 2.1,", "seed002") == "seed003"
    assert pyro_seq_docs._attribute((2,), "a recurrent cell,", "seed002") == "seed002"
    assert pyro_seq_docs._attribute((7,), "nothing named", "") == ""
    assert pyro_seq_docs.in_source("thesis", (3, 20)) and not pyro_seq_docs.in_source(
        "thesis", (3, 21)
    )


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    for name in BUILD_DEPS:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("docs")
    env = dict(os.environ, PYRO_SEQ_SMOKE="1", PYRO_SEQ_DOCS_EXECUTION="force", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    )
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-b",
            "html",
            "-d",
            str(out / "doctrees"),
            "-D",
            "nb_execution_in_temp=1",
            str(DOCS),
            str(out / "html"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out / "html", proc, seconds


def test_docs_build_without_warnings(built_site):
    html, proc, seconds = built_site
    assert "build succeeded" in proc.stdout
    print(f"docs build (tutorials in short mode): {seconds:.0f} s")


def test_api_pages_document_the_public_symbols(built_site):
    from sphinx.util.inventory import InventoryFile

    with open(built_site[0] / "objects.inv", "rb") as fh:
        inventory = InventoryFile.load(fh, "", os.path.join)
    names = (
        set(inventory.get("py:class", {}))
        | set(inventory.get("py:function", {}))
        | set(inventory.get("py:data", {}))
        | set(inventory.get("py:module", {}))
        | set(inventory.get("py:exception", {}))
    )
    for s in pyro_seq_docs.public_symbols():
        assert any(t in names for t in s.targets), s.public_name


def test_tutorials_are_executed_pages_with_inline_figures(built_site):
    html = built_site[0]
    for script in sorted((ROOT / "tutorials").glob("*.py")):
        if script.name.startswith("_"):
            continue
        page = (html / "tutorials" / f"{script.stem}.html").read_text()
        assert "<img" in page and "_images/" in page, f"{script.name}: no figure on its page"


def test_equations_page_links_every_source(built_site):
    page = (built_site[0] / "equations.html").read_text()
    references = (built_site[0] / "references.html").read_text()
    for key in ("thesis", "seed000", "seed002", "seed003"):
        assert f'id="ref-{key}"' in references and f"references.html#ref-{key}" in page
    assert "pyro_seq.ops.kalman" in page and "(3.12)" in page
