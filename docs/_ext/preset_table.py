"""The table of the paper presets on the "Reproduce a table" page.

``.. preset-table::`` renders one table with a row per preset of
:data:`pyro_seq.presets.PRESETS`, in the catalogue's order: the preset (its name, model, data
and metric), the published number with its source, the number this package measured
(:meth:`~pyro_seq.presets.Preset.measured`, to four significant digits as ``pyro-seq presets``
prints it) with the training time (:meth:`~pyro_seq.presets.Preset.seconds`), how to run it
(the ``pyro-seq train --preset`` command, the benchmark script and its result files) and the
preset's note. Everything is read from the catalogue and the result files when the page is
built, so the page cannot drift from ``pyro-seq presets``; the page is rebuilt when the
catalogue or a result file changes.

:func:`preset_rows` and :func:`table_rst` need no Sphinx (the tests call them).
"""

import re
from pathlib import Path

#: The columns of the table, and their relative widths.
HEADER = ("preset", "published", "measured by this package", "how to run it", "notes")
WIDTHS = (17, 15, 13, 28, 27)

#: Words of a script's prose remainder that end a run of command-line flags and arguments.
_CONNECTORS = {"and", "or", "then", "to", "with", "for", "again", "once"}


def _escape(text):
    """Text with the inline markup characters of reStructuredText escaped."""
    return re.sub(r"([\\*`|_])", r"\\\1", text)


def _text(value):
    """Plain text as the start of a cell: one line, the inline markup characters escaped, and
    a first character escaped where it would start a list, a field or a directive."""
    text = _escape(" ".join(str(value).split()))
    if re.match(r"([-+*:.#]|\(?[A-Za-z0-9]{1,3}[.)])(\s|$)|[:.]", text):
        text = "\\" + text
    return text


def _literal(value):
    """An inline literal (``value``)."""
    return f"``{value}``"


def number(value, key):
    """A number as ``pyro-seq presets`` prints it: published as given (``:g``), measured to
    four significant digits (``:.4g``); a sentence stays as it is."""
    if isinstance(value, float):
        return f"{value:.4g}" if key == "measured" else f"{value:g}"
    return str(value)


def duration(seconds):
    """Training seconds as minutes below an hour (``"16 min"``, ``"under 1 min"``), else as
    hours to a tenth (``"1.2 h"``)."""
    if seconds < 30:
        return "under 1 min"
    if round(seconds / 60) < 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _command(script):
    """The benchmark ``script`` as rst: its command (up to a ", " or " (") as an inline
    ``python ...`` literal, then the prose after it with its flags and arguments in literals
    (``..., then --eval-only --test-slice 0:38 and 38:77``)."""
    cut = min([i for i in (script.find(", "), script.find(" (")) if i != -1], default=len(script))
    command, rest = script[:cut].strip(), script[cut:]
    if not command.startswith("python "):
        command = "python " + command
    # segments (kind, text): "code", "prose" or "space", merged into runs of code below
    segments = [("code", command)]
    flag = False
    for i, token in enumerate(rest.split()):
        if i > 0 or rest[:1].isspace():
            segments.append(("space", " "))
        lead, core, tail = re.fullmatch(r"([(\[]*)(.*?)([,.;:)\]]*)", token).groups()
        code = bool(core) and (
            core.startswith("-")
            or bool(re.search(r"[^A-Za-z']", core))
            or (flag and not lead and core.lower() not in _CONNECTORS)
        )
        segments += [("prose", lead), ("code" if code else "prose", core), ("prose", tail)]
        flag = code and core.startswith("-") and not tail
    segments = [(kind, text) for kind, text in segments if text]
    out = []
    for j, (kind, text) in enumerate(segments):
        inside = 0 < j < len(segments) - 1 and segments[j - 1][0] == segments[j + 1][0] == "code"
        if out and out[-1][0] == "code" and (kind == "code" or (kind == "space" and inside)):
            out[-1] = ("code", out[-1][1] + text)
        else:
            out.append((kind, text))
    return "".join(_literal(text) if kind == "code" else _escape(text) for kind, text in out)


def _result_files(preset):
    """The result files of ``preset`` (in order, once each)."""
    return list(dict.fromkeys(part.file for part in preset.result))


def preset_rows():
    """One row per preset of :data:`pyro_seq.presets.PRESETS`, in its order; a row is
    ``(name, cells)`` with the five cells of :data:`HEADER` as reStructuredText, paragraphs
    of a cell separated by a blank line. Measured numbers and times are read now."""
    from pyro_seq.presets import PRESETS
    from pyro_seq.presets import preset as preset_module

    rows = []
    for name, preset in PRESETS.items():
        about = (
            f"{_literal(name)}\n\nmodel {_literal(preset.model)}, data {_literal(preset.data)}"
            f"\n\n{_text(preset.metric)}"
        )
        published = f"{_text(number(preset.published, 'published'))}\n\n{_text(preset.source)}"
        value = preset.measured()
        if value is None:
            measured = "not measured"
        else:
            seconds = preset.seconds()
            measured = _text(number(value, "measured")) + (
                "\n\ntraining time not recorded"
                if seconds is None
                else f"\n\ntrained in {duration(seconds)}"
            )
        files = _result_files(preset)
        run = f"{_literal(f'pyro-seq train --preset {name} --out runs/{name}')}\n\n"
        if files:
            written = ", ".join(
                _literal(f)
                + ("" if (preset_module.RESULTS_DIR / f).is_file() else " (not written yet)")
                for f in files
            )
            run += f"benchmark: {_command(preset.script)}; result{'s' * (len(files) > 1)}: "
            run += written
        else:
            run += f"benchmark, not yet run with these settings: {_command(preset.script)}"
        notes = _text(preset.note) if preset.note else "–"
        rows.append((name, (about, published, measured, run, notes)))
    return rows


def table_rst():
    """The table of :func:`preset_rows` as reStructuredText lines (a ``list-table``)."""
    lines = [
        ".. list-table::",
        "   :header-rows: 1",
        f"   :widths: {' '.join(str(w) for w in WIDTHS)}",
        "   :class: preset-table",
        "",
    ]
    for i, title in enumerate(HEADER):
        lines.append(f"   {'*' if i == 0 else ' '} - {title}")
    for _, cells in preset_rows():
        for i, cell in enumerate(cells):
            first, *rest = cell.split("\n")
            lines.append(f"   {'*' if i == 0 else ' '} - {first}")
            lines += [f"       {line}" if line else "" for line in rest]
    lines.append("")
    return lines


def dependencies():
    """The files the table is read from: the catalogue, :mod:`pyro_seq.presets.preset` and
    every preset's result files (absent ones too: the page is rebuilt when they appear)."""
    import pyro_seq.presets.catalogue as catalogue
    import pyro_seq.presets.preset as preset_module
    from pyro_seq.presets import PRESETS

    files = [Path(catalogue.__file__), Path(preset_module.__file__)]
    files += [
        preset_module.RESULTS_DIR / f for preset in PRESETS.values() for f in _result_files(preset)
    ]
    return list(dict.fromkeys(files))


def setup(app):
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class PresetTable(SphinxDirective):
        """``.. preset-table::``: every paper preset, published and measured."""

        has_content = False

        def run(self):
            for path in dependencies():
                self.env.note_dependency(str(path))
            container = nodes.container(classes=["preset-table"])
            self.state.nested_parse(StringList(table_rst(), source="preset-table"), 0, container)
            return [container]

    app.add_directive("preset-table", PresetTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
