"""The table of :class:`pyro_seq.train.TrainConfig`'s fields on the training API page.

``.. train-config-table::`` renders one table per group of
:data:`pyro_seq.train.config.GROUPS`: each field's name, default (and the command line's own
where it declares one), unit, command-line flag, and its doc: what it means and when to change
it. Everything comes from the fields' :func:`~pyro_seq.train.config.option` declarations, the
same text that ``pyro-seq train --help`` shows, so the page and the help cannot drift.

TrainConfig's docstring carries the same list as plain bullets (for ``help()``); on the page
the list is replaced by the table (:func:`replace_field_list`), so each default is shown once.
"""

from dataclasses import MISSING

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

TRAIN_CONFIG = "pyro_seq.train.config.TrainConfig"


def _literal(value):
    """A default as it is written in Python, in an inline literal."""
    return f"``{value!r}``"


def field_rows():
    """``(group title, [row, ...])`` per group; a row is the cells ``(field, default, unit,
    flag, doc)`` as reStructuredText."""
    from pyro_seq.train.config import GROUPS, options

    out = []
    for key, title in GROUPS.items():
        rows = []
        for o in options():
            if o.group != key:
                continue
            default = _literal(o.default)
            if o.cli_default is not MISSING:
                default += f" (command line: {_literal(o.cli_default)}, {o.cli_default_why})"
            if o.cli_excluded is not None:
                flag = f"none: {o.cli_excluded}"
            else:
                flag = f"``{o.flag}``" + (
                    f" (``{o.flag} {o.cli_none}``: None)" if o.cli_none is not None else ""
                )
            unit = o.unit if o.unit else "–"
            rows.append((f"``{o.name}``", default, unit, flag, o.doc + "."))
        out.append((title[0].upper() + title[1:], rows))
    return out


def table_rst():
    """The tables of :func:`field_rows` as reStructuredText lines."""
    lines = []
    for title, rows in field_rows():
        lines += [
            f".. rubric:: {title}",
            "",
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 14 12 8 14 52",
            "   :class: train-config-fields",
            "",
            "   * - field",
            "     - default",
            "     - unit",
            "     - command line",
            "     - what it means, and when to change it",
        ]
        for cells in rows:
            lines.append(f"   * - {cells[0]}")
            lines += [f"     - {cell}" for cell in cells[1:]]
        lines.append("")
    return lines


class TrainConfigTable(SphinxDirective):
    """``.. train-config-table::``: the fields of TrainConfig, one table per group."""

    has_content = False

    def run(self):
        container = nodes.container(classes=["train-config-table"])
        self.state.nested_parse(StringList(table_rst(), source="train-config-table"), 0, container)
        return [container]


def replace_field_list(app, what, name, obj, options, lines):
    """``autodoc-process-docstring``: on the page, TrainConfig's generated list of fields
    gives way to the table (the defaults would otherwise be shown twice)."""
    if name != TRAIN_CONFIG and not (
        what == "class" and getattr(obj, "__name__", "") == "TrainConfig"
    ):
        return
    from pyro_seq.train.config import FIELD_LIST_HEADING

    heading = [i for i, line in enumerate(lines) if line.strip() == FIELD_LIST_HEADING]
    if not heading:
        return
    del lines[heading[0] :]
    lines += ["The fields by group:", "", ".. train-config-table::", ""]


def short_signature(app, what, name, obj, options, signature, return_annotation):
    """``autodoc-process-signature``: TrainConfig's signature is ``(**fields)``: its forty
    defaults are in the table (each default shown once)."""
    if name == TRAIN_CONFIG or (what == "class" and getattr(obj, "__name__", "") == "TrainConfig"):
        return "(**fields)", return_annotation
    return None


def setup(app):
    app.add_directive("train-config-table", TrainConfigTable)
    app.connect("autodoc-process-docstring", replace_field_list)
    app.connect("autodoc-process-signature", short_signature)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
