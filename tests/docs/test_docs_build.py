"""Build the Sphinx site as ``make docs`` does (``-W``, nitpicky references), with the tutorials
executed in their short mode (``PYRO_SEQ_SMOKE=1``), and check the public API is documented.

The fast tests need no Sphinx: they check every public symbol's docstring and every entry of
the equations index with the same functions the build uses (``docs/_ext/pyro_seq_docs.py``),
every :class:`~pyro_seq.train.TrainConfig` field's declaration (the text of the training API
page's table and of ``pyro-seq train --help``), and the tutorials' sources (no seed-file
citations, the setup hidden, outputs outside the repository).

The site checks read the built HTML and the executed notebooks: no "seed 00N" text, no absolute
build paths, no warnings (or any stderr) in cell outputs, every TrainConfig field on the
training page, every model of ``pyro_seq.models.MODELS`` on the "which model" page, and
``git status`` as it was before the build.
"""

import dataclasses
import html as html_lib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import pyro_seq_docs  # noqa: E402
import train_config_table  # noqa: E402

BUILD_DEPS = ("sphinx", "furo", "myst_nb", "jupytext", "ipykernel", "ipywidgets")


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
    assert (
        pyro_seq_docs._attribute((9,), "see Soyer & Möllenhoff sec. 2.1,", "seed002") == "seed003"
    )
    assert pyro_seq_docs._attribute((2,), "a recurrent cell,", "seed002") == "seed002"
    assert pyro_seq_docs._attribute((7,), "nothing named", "") == ""
    assert pyro_seq_docs.in_source("thesis", (3, 20)) and not pyro_seq_docs.in_source(
        "thesis", (3, 21)
    )


# ------------------------------------------------------------------ TrainConfig, without Sphinx
def _plain(rst):
    """Text of a one-line reStructuredText doc as the HTML shows it: no literal markup, plain
    quotes, one space between words."""
    return " ".join(rst.replace("``", "").replace("\u2019", "'").split())


def test_every_train_config_field_is_documented():
    """Each field declares a doc (its meaning and when to change it, one line, as the CLI help
    needs) and, if it is a quantity, its unit; the table of the API page has a row per field,
    in the fields' order, and TrainConfig's docstring lists them all."""
    from pyro_seq.train import TrainConfig
    from pyro_seq.train.config import GROUPS, options

    names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert len(names) >= 40
    declared = {o.name: o for o in options()}
    assert list(declared) == names
    for o in declared.values():
        assert o.group in GROUPS, o.name
        # at least "initial KL weight beta" (kl_start, whose help tests/test_cli.py pins; its
        # advice is in kl_anneal_steps'): a meaning, not only a type
        assert "\n" not in o.doc and len(o.doc.split()) >= 4, (o.name, o.doc)
        assert not o.doc.endswith("."), o.name  # the table and the docstring add the stop
        if o.check is not None and o.check != "SEED":  # a number with a range: a quantity
            assert o.unit is not None, f"{o.name}: declare its unit ('' for a pure number)"
    rows = [row for _, group_rows in train_config_table.field_rows() for row in group_rows]
    assert [row[0] for row in rows] == [f"``{n}``" for n in names]
    for row, o in zip(rows, declared.values()):
        assert row[1].startswith(f"``{o.default!r}``") and row[4] == o.doc + ".", o.name
    doc = TrainConfig.__doc__
    for o in declared.values():
        assert f"* ``{o.name}`` [``{o.default!r}``" in doc and o.doc in doc, o.name


def test_train_config_says_what_its_defaults_do():
    """The docstring's summary is filled in from the defaults (written once): no KL annealing
    in TrainConfig, while the command line anneals; each number it quotes is the field's."""
    from pyro_seq.train import TrainConfig
    from pyro_seq.train.config import defaults_summary

    summary, defaults = defaults_summary(), TrainConfig()
    assert summary in TrainConfig.__doc__
    assert defaults.kl_anneal_steps == 0 and "**no KL annealing**" in summary
    assert f"``kl_anneal_steps={defaults.kl_anneal_steps}``" in summary
    assert f"``kl_start={defaults.kl_start}``" in summary
    assert f"at most {defaults.epochs} epochs" in summary
    assert f"after {defaults.patience} epochs without" in summary
    assert "from 0.2 over 1000 updates" in summary  # the command line's declared defaults


def test_train_page_replaces_the_field_list_by_the_table():
    """On the page, TrainConfig's docstring keeps its summary, and its bullet list of fields
    (defaults a second time) gives way to the table directive."""
    from pyro_seq.train import TrainConfig

    lines = TrainConfig.__doc__.splitlines()
    train_config_table.replace_field_list(
        None, "class", train_config_table.TRAIN_CONFIG, TrainConfig, {}, lines
    )
    text = "\n".join(lines)
    assert ".. train-config-table::" in text and "What the defaults do" in text
    assert "* ``objective``" not in text


# ------------------------------------------------------------------ tutorials, without Sphinx
TUTORIALS = sorted(p for p in (ROOT / "tutorials").glob("*.py") if not p.name.startswith("_"))


def test_tutorials_cite_papers_not_seed_files():
    """No "seed 00N", no file that users do not have, no data path outside the repository."""
    assert len(TUTORIALS) == 7
    for path in TUTORIALS:
        text = path.read_text()
        for stale in ("seed 00", "seed00", "DESIGN.md", "../shared", "shared/data", "_output/"):
            assert stale not in text, f"{path.name}: {stale!r}"


def test_tutorials_hide_their_setup_in_a_first_cell():
    """The first code cell of each page is the setup (options, output folder, banner), input
    removed on the page; no visible cell parses arguments or reads the environment."""
    import jupytext

    for path in TUTORIALS:
        cells = [c for c in jupytext.read(path).cells if c.cell_type == "code"]
        first = cells[0]
        assert "remove-input" in first.metadata.get("tags", []), path.name
        assert f'setup("{path.stem}",' in first.source, path.name
        for cell in cells[1:]:
            for boilerplate in (
                "argparse",
                "os.environ",
                "PYRO_SEQ_SMOKE",
                "matplotlib.use",
                "noqa",
            ):
                assert boilerplate not in cell.source, f"{path.name}: {boilerplate}"


def test_tutorial_outputs_go_outside_the_repository(tmp_path, monkeypatch):
    """``$PYRO_SEQ_OUTPUT/<name>``, else a temporary folder; ``--out`` for a script."""
    from pyro_seq import _tutorial_support as support

    monkeypatch.setenv("PYRO_SEQ_OUTPUT", str(tmp_path / "outputs"))
    assert support.output_folder("zoo") == tmp_path / "outputs" / "zoo"
    assert (tmp_path / "outputs" / "zoo").is_dir()
    monkeypatch.delenv("PYRO_SEQ_OUTPUT")
    default = support.output_folder("zoo")
    assert default == Path(tempfile.gettempdir()) / "pyro-seq-tutorials" / "zoo"
    assert ROOT not in default.parents
    monkeypatch.setenv("PYRO_SEQ_SMOKE", "1")
    tutorial = support.setup("zoo", "a test", argv=["--out", str(tmp_path / "mine")])
    assert tutorial == (True, tmp_path / "mine")
    monkeypatch.setenv("PYRO_SEQ_SMOKE", "0")
    assert support.setup("zoo", "a test", argv=[]).smoke is False
    assert support.setup("zoo", "a test", argv=["--smoke"]).smoke is True
    assert support.SMOKE_BANNER.startswith("```{warning}") and "meaningless" in support.SMOKE_BANNER


#: ``git status`` of the checkout before and after the build of :func:`built_site`.
BUILD_GIT_STATUS = {}

#: Ignored paths a build or a test run may write (caches and build folders).
BUILD_CACHES = ("docs/_build/", ".pytest_cache/", ".mypy_cache/", ".ruff_cache/", ".hypothesis/")


def _git_status():
    """``git status --porcelain --ignored`` of the checkout, as a set of lines, without the
    caches of :data:`BUILD_CACHES` and ``__pycache__`` folders (None outside a git checkout)."""
    try:
        proc = subprocess.run(
            ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {
        line
        for line in proc.stdout.splitlines()
        if not any(c in line for c in BUILD_CACHES)
        and "__pycache__" not in line
        and ".egg-info" not in line
        and not line[3:].strip('"').startswith(".venv/")
    }


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    for name in BUILD_DEPS:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("docs")
    status_before = _git_status()
    env = dict(os.environ, PYRO_SEQ_SMOKE="1", PYRO_SEQ_DOCS_EXECUTION="force", MPLBACKEND="Agg")
    env.pop("PYRO_SEQ_OUTPUT", None)  # the build's own default: a temporary folder
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
    BUILD_GIT_STATUS.update(before=status_before, after=_git_status())
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


# ------------------------------------------------------------------ the built site
def _page_text(path):
    """The visible text of an HTML page: no tags, entities resolved, one space between words."""
    raw = path.read_text()
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.S)
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", raw)).replace("\u2019", "'")
    return " ".join(text.split())


def _html_pages(html):
    return sorted(p for p in html.rglob("*.html") if "_sources" not in p.parts)


def test_site_has_no_seed_file_citations(built_site):
    """Papers are cited by authors, year and section, never as "seed 00N"."""
    found = []
    for page in _html_pages(built_site[0]):
        text = _page_text(page)
        for m in re.finditer(r"[Ss]eed ?00\d", text):
            found.append(
                f"{page.relative_to(built_site[0])}: ...{text[max(0, m.start() - 40) : m.end() + 20]}..."
            )
    assert not found, f"{len(found)} seed-file citations, e.g. " + "\n".join(found[:20])


def test_site_has_no_absolute_build_paths(built_site):
    """No page shows where it was built: the temporary folders, the checkout, the home folder."""
    html = built_site[0]
    forbidden = {"/tmp/", str(ROOT), str(Path.home()), str(html.parent), tempfile.gettempdir()}
    found = []
    for page in _html_pages(html):
        raw = html_lib.unescape(page.read_text())
        for path in forbidden:
            if path and path != "/" and path in raw:
                i = raw.index(path)
                found.append(
                    f"{page.relative_to(html)}: {path!r} in ...{raw[max(0, i - 60) : i + 60]}..."
                )
    assert not found, "\n".join(found[:20])


def test_tutorial_cells_show_no_warnings_or_stderr(built_site):
    """The executed notebooks: no stderr stream, no warning and no error in any cell's output;
    a cell ends without a stray return value (an ``execute_result`` that is not a figure or a
    display)."""
    executed = built_site[0].parent / "jupyter_execute" / "tutorials"
    notebooks = sorted(executed.glob("*.ipynb"))
    assert [n.stem for n in notebooks] == [t.stem for t in TUTORIALS]
    problems = []
    for notebook in notebooks:
        for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
            for output in cell.get("outputs", []):
                text = "".join(output.get("text", "")) + "".join(
                    output.get("data", {}).get("text/plain", "")
                )
                where = f"{notebook.stem} cell {i}"
                if output["output_type"] == "stream" and output["name"] == "stderr":
                    problems.append(f"{where}: stderr {text[:300]!r}")
                elif output["output_type"] == "error":
                    problems.append(f"{where}: {output.get('ename')}")
                elif re.search(r"Warning\b", text):
                    problems.append(f"{where}: {text[:300]!r}")
                elif output["output_type"] == "execute_result":
                    problems.append(f"{where}: a stray return value {text[:80]!r}")
    assert not problems, "\n".join(problems)


def test_short_mode_pages_carry_the_banner(built_site):
    """Each tutorial page built in short mode says so, in an admonition at its top."""
    for script in TUTORIALS:
        page = (built_site[0] / "tutorials" / f"{script.stem}.html").read_text()
        banner = page.find('class="admonition warning"')
        assert banner != -1 and "Short run." in page, script.name
        assert banner < page.find("<h2"), (
            f"{script.name}: the banner is not above the first section"
        )
        assert "meaningless" in _page_text(built_site[0] / "tutorials" / f"{script.stem}.html")


def test_train_page_documents_every_train_config_field(built_site):
    """Every field of TrainConfig, with its doc, in the table of the training API page, and the
    defaults once: in the table, not again in the class signature."""
    from pyro_seq.train import TrainConfig
    from pyro_seq.train.config import GROUPS, options

    page = built_site[0] / "api" / "train.html"
    raw, text = page.read_text(), _page_text(page)
    assert len(re.findall(r"<table[^>]*train-config-fields", raw)) == len(GROUPS)
    assert "What the defaults do" in text and "no KL annealing" in text
    squashed = re.sub(r"\s+", "", text)  # literals are tags: spaces around them vary
    missing = [
        f.name
        for f, o in zip(dataclasses.fields(TrainConfig), options())
        if not re.search(rf"\b{f.name}\b", text)
        or re.sub(r"\s+", "", _plain(o.doc)) not in squashed
    ]
    assert not missing, f"TrainConfig fields not documented on api/train.html: {missing}"
    assert "objective = 'elbo'" not in text and "TrainConfig ( ** fields )" in text


def test_which_model_page_names_every_model(built_site):
    """Each model the command line and the package export, by class or command-line name."""
    from pyro_seq.models import MODELS

    page = built_site[0] / "which_model.html"
    assert page.is_file(), "docs/which_model.rst is not built (no such page yet?)"
    text = _page_text(page)
    missing = [
        name
        for name, cls in MODELS.items()
        if not re.search(rf"\b({re.escape(cls.__name__)}|{re.escape(name)})\b", text)
    ]
    assert not missing, f"models not named on which_model.html: {missing}"


def test_build_leaves_git_status_unchanged(built_site):
    """Nothing new in the checkout after the build, tracked, untracked or ignored (outside the
    build folder and caches): the tutorials write their files outside the repository."""
    before, after = BUILD_GIT_STATUS.get("before"), BUILD_GIT_STATUS.get("after")
    if before is None or after is None:
        pytest.skip("not a git checkout")
    assert sorted(after - before) == []
