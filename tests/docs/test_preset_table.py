"""The presets table of docs/reproduce.rst (``.. preset-table::``, ``docs/_ext/preset_table.py``):
a row per preset of the catalogue in its order, measured numbers as the result files hold them,
and reStructuredText that parses without a warning. No Sphinx needed, except for the last test
(a one-page Sphinx build with the directive)."""

import json
import re
import sys
from pathlib import Path

import pytest

import pyro_seq.presets
from pyro_seq.presets import PRESETS, Evaluation, Preset, ResultKey
from pyro_seq.presets import preset as preset_module

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import preset_table  # noqa: E402

ROW_START = re.compile(r"^   \* - ``([^`]+)``$")


def _walk(payload, path):
    for part in path:
        payload = payload[part]
    return payload


def _measured_from_files(preset, results_dir):
    """The preset's measured number read here from its result files by the ResultKey paths:
    one part's value, or the parts' mean weighted by their weights (equal without weights);
    None when not measured or a file or key is absent."""
    values, weights = [], []
    for part in preset.result:
        path = Path(results_dir) / part.file
        if not path.is_file():
            return None
        payload = json.loads(path.read_text())
        try:
            values.append(float(_walk(payload, part.key)))
            weights.append(1.0 if part.weight is None else float(_walk(payload, part.weight)))
        except (KeyError, IndexError, TypeError):
            return None
    if not values:
        return None
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


def _paragraphs(cell):
    """The paragraphs of a cell as rst (blank-line separated)."""
    return cell.split("\n\n")


def test_one_row_per_preset_in_catalogue_order():
    names = [m.group(1) for line in preset_table.table_rst() if (m := ROW_START.match(line))]
    assert names == list(PRESETS) and len(names) == len(set(names))
    assert [name for name, _ in preset_table.preset_rows()] == list(PRESETS)


def test_measured_cells_show_the_result_files_numbers():
    """Each measured cell starts with the number the result files hold (pooled here, by the
    ResultKey paths) to four significant digits, as ``pyro-seq presets`` prints it; "not
    measured" where the preset has no result (or its file is absent)."""
    rows = dict(preset_table.preset_rows())
    seen = {"measured": 0, "not measured": 0}
    for name, preset in PRESETS.items():
        expected = _measured_from_files(preset, preset_module.RESULTS_DIR)
        cell = rows[name][2]
        if expected is None:
            assert cell == "not measured", name
            seen["not measured"] += 1
        else:
            assert _paragraphs(cell)[0] == f"{expected:.4g}", name
            seen["measured"] += 1
    assert seen["measured"] >= 5  # the catalogue's recorded runs are in benchmarks/results/
    if any(not p.result for p in PRESETS.values()):
        assert seen["not measured"] > 0


def _preset(name, result=(), note=""):
    return Preset(
        name=name,
        model="dmm",
        model_options={},
        train={},
        evaluation=Evaluation("elbo"),
        data="jsb_chorales.pickle",
        metric="test ELBO in nats per time step (higher is better)",
        published=-6.93,
        source="Krishnan et al. (2017), Table 3",
        script="benchmarks/paper/x.py --tag a_b, then --eval-only --test-slice 0:38 and 38:77",
        result=result,
        note=note,
    )


@pytest.fixture
def made_up_presets(tmp_path, monkeypatch):
    """Three presets over result files in a temporary folder: two weighted slices (values
    -6 and -7 over 100 and 300 steps, times 600 + 1200 s), one part (-7.123456, 5400 s) and
    one without a result."""
    (tmp_path / "slice_a.json").write_text(
        json.dumps({"run": {"ll": -6.0, "steps": 100, "epoch_seconds": [600, 1200.0]}})
    )
    (tmp_path / "slice_b.json").write_text(
        json.dumps({"run": {"ll": -7.0, "steps": 300, "epoch_seconds": [1.0]}})
    )
    (tmp_path / "single.json").write_text(json.dumps({"x": [0, {"v": -7.123456}], "t": 5400}))
    run = ("run", "ll"), ("run", "epoch_seconds")
    presets = [
        _preset(
            "pooled",
            tuple(ResultKey(f, *run, weight=("run", "steps")) for f in ("slice_a.json", "b")),
        ),
        _preset(
            "pooled_b",
            tuple(
                ResultKey(f, *run, weight=("run", "steps"))
                for f in ("slice_a.json", "slice_b.json")
            ),
            note="1. starts like a list, with *stars*, `ticks`, a|bar and Res_q_ ends_",
        ),
        _preset("single", (ResultKey("single.json", ("x", 1, "v"), ("t",)),)),
        _preset("none", note="- not a bullet"),
    ]
    monkeypatch.setattr(pyro_seq.presets, "PRESETS", {p.name: p for p in presets})
    monkeypatch.setattr(preset_module, "RESULTS_DIR", tmp_path)
    return presets


def test_made_up_presets_cells(made_up_presets):
    rows = dict(preset_table.preset_rows())
    assert list(rows) == ["pooled", "pooled_b", "single", "none"]
    # a part whose file is absent: not measured, and the file is said to be missing
    assert rows["pooled"][2] == "not measured"
    assert "``b`` (not written yet)" in rows["pooled"][3]
    # (-6 * 100 - 7 * 300) / 400 = -6.75; the time of the first part: 600 + 1200 s = 30 min
    assert _paragraphs(rows["pooled_b"][2]) == ["-6.75", "trained in 30 min"]
    assert _paragraphs(rows["single"][2]) == ["-7.123", "trained in 1.5 h"]
    assert rows["none"][2] == "not measured"
    assert "benchmark, not yet run with these settings" in rows["none"][3]
    assert _paragraphs(rows["single"][0]) == [
        "``single``",
        "model ``dmm``, data ``jsb_chorales.pickle``",
        "test ELBO in nats per time step (higher is better)",
    ]
    assert _paragraphs(rows["single"][1]) == ["-6.93", "Krishnan et al. (2017), Table 3"]


def test_durations():
    assert preset_table.duration(10) == "under 1 min"
    assert preset_table.duration(982.3) == "16 min"
    assert preset_table.duration(3569) == "59 min"  # 59.48 min
    assert preset_table.duration(3590) == "1.0 h"  # 59.8 min would read "60 min"
    assert preset_table.duration(4165.5) == "1.2 h"
    assert preset_table.number(-7.203375, "measured") == "-7.203"
    assert preset_table.number(807.02, "published") == "807.02"
    assert preset_table.number("FIVO above ELBO", "published") == "FIVO above ELBO"


def _doctree(lines):
    """The doctree of rst ``lines``; a warning (or worse) raises."""
    docutils_core = pytest.importorskip("docutils.core")
    return docutils_core.publish_doctree(
        "\n".join(lines),
        settings_overrides={"report_level": 2, "halt_level": 2, "warning_stream": False},
    )


def _table_rows(doctree):
    """Rows of the table's body: per row, per cell, the text of each paragraph."""
    from docutils import nodes

    (table,) = list(doctree.findall(nodes.table))
    (tbody,) = list(table.findall(nodes.tbody))
    return [
        [[p.astext() for p in entry.findall(nodes.paragraph)] for entry in row.children]
        for row in tbody.children
    ]


def _script_text(preset):
    return "python " + preset.script


def _check_rendered(presets):
    """The table of ``presets`` parses without a warning, and each cell reads as the preset's
    own text: name, model and data, published and source, the commands and the note."""
    rows = _table_rows(_doctree(preset_table.table_rst()))
    assert len(rows) == len(presets)
    for row, preset in zip(rows, presets):
        about, published, measured, run, notes = row
        assert about == [
            preset.name,
            f"model {preset.model}, data {preset.data}",
            " ".join(preset.metric.split()),
        ]
        value = preset.published
        assert published == [
            f"{value:g}" if isinstance(value, float) else " ".join(value.split()),
            " ".join(preset.source.split()),
        ]
        expected = _measured_from_files(preset, preset_module.RESULTS_DIR)
        assert measured[0] == ("not measured" if expected is None else f"{expected:.4g}")
        assert run[0] == f"pyro-seq train --preset {preset.name} --out runs/{preset.name}"
        files = list(dict.fromkeys(part.file for part in preset.result))
        assert _script_text(preset) in run[1]
        for f in files:
            assert f in run[1], preset.name
        assert notes == [" ".join(preset.note.split()) or "–"], preset.name


def test_rst_parses_and_reads_as_the_catalogue():
    _check_rendered(list(PRESETS.values()))


def test_made_up_rst_parses_with_markup_characters(made_up_presets):
    """Notes that start like a list and carry inline markup characters render as written; the
    script's prose remainder keeps its words and its flags."""
    _check_rendered(made_up_presets)
    rst = "\n".join(preset_table.table_rst())
    assert (
        "``python benchmarks/paper/x.py --tag a_b``, then ``--eval-only --test-slice 0:38`` and "
        "``38:77``" in rst
    )


def test_directive_in_a_sphinx_build(tmp_path):
    """``.. preset-table::`` in a one-page Sphinx project builds without a warning (``-W``);
    the page has a row per preset, and its visible text holds each command as written (no
    flag's ``--`` turned into a dash by smart quotes)."""
    pytest.importorskip("sphinx")
    import html as html_lib

    from sphinx.cmd.build import build_main

    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'docs' / '_ext')!r})\n"
        "extensions = ['preset_table']\nproject = 'x'\n"
    )
    (src / "index.rst").write_text("Presets\n=======\n\n.. preset-table::\n")
    out = tmp_path / "html"
    assert build_main(["-W", "-q", "-b", "html", str(src), str(out)]) == 0
    page = (out / "index.html").read_text()
    assert page.count("<tr") == len(PRESETS) + 1
    text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    text = re.sub(r" ([,;)])", r"\1", text)  # literals are tags: spaces around them vary
    for name, preset in PRESETS.items():
        assert f"pyro-seq train --preset {name} --out runs/{name}" in text
        assert " ".join(_script_text(preset).split()) in text, name
