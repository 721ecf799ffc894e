"""Sphinx extension of the pyro-seq site: checks that keep the API pages honest, and the
equations index built from the docstrings.

* **Public names resolve.** ``:class:`pyro_seq.models.SRNN``` (the name users import) is
  documented at its defining module, ``pyro_seq.models.srnn.SRNN``; a ``missing-reference``
  handler imports the target, finds where the object is defined and links there. A reference
  that still resolves to nothing is a nitpicky warning (an error under ``-W``).
* **Every public symbol is documented** (``env-check-consistency``): each name in the
  ``__all__`` of a package or module of ``pyro_seq`` must have a docstring (classes and
  functions; constants need a ``#:`` doc comment or an ``autodata`` entry) and appear on an API
  page, and every public module must be on an API page (``automodule``). Anything missing is a
  warning naming the symbol.
* **Equations index** (directive ``equation-index``): every equation citation in a docstring
  (``eq. 3.12``, ``eqs. (1)-(2)``, ``Soyer & Möllenhoff eq. 9-10 / 14-15``, ...) is attributed
  to its source document (:data:`SOURCES`) and listed with links to the object whose docstring cites
  it. A citation whose source cannot be told, or whose number the source does not have, is a
  warning: the docstring should name the source (``thesis eq. N``, ``Bayer & Osendorfer (2014),
  eq. N``, ...).
* **Command-line help** (directive ``cli-help``): the ``--help`` of ``pyro-seq`` and of each
  subcommand, taken from :func:`pyro_seq.cli.make_parser` at build time.

The functions :func:`public_symbols` and :func:`equation_citations` need no Sphinx and are what
``tests/docs`` check directly.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
import sys
from typing import Dict, Iterator, List, Optional, Tuple

PACKAGE = "pyro_seq"


# ---------------------------------------------------------------------------------------------
# Walking the package
# ---------------------------------------------------------------------------------------------

def public_modules(package: str = PACKAGE) -> List[str]:
    """Names of the package and of every module below it without a ``_``-prefixed part."""
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


@dataclasses.dataclass(frozen=True)
class PublicSymbol:
    """A name in the ``__all__`` of ``module``, and where it is documented."""

    module: str        #: the module (or package) whose ``__all__`` lists it
    name: str          #: the name in that ``__all__``
    targets: Tuple[str, ...]  #: documented names that would be its page entry (any one suffices)
    has_docstring: bool  #: own docstring (classes, functions) or a doc comment may supply it
    is_data: bool        #: a constant: documented by a ``#:`` comment or ``autodata``

    @property
    def public_name(self) -> str:
        return f"{self.module}.{self.name}"


def _own_doc(obj) -> Optional[str]:
    """The object's own docstring (a class does not inherit its base's here)."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return doc if isinstance(doc, str) and doc.strip() else None


def canonical_name(obj) -> Optional[str]:
    """``module.qualname`` where a class or function is defined, or None for other objects."""
    if inspect.isclass(obj) or inspect.isroutine(obj):
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if module and qualname and "<" not in qualname:
            return f"{module}.{qualname}"
    return None


def _data_homes(obj, name: str, modules: List[str]) -> Tuple[str, ...]:
    """Modules of the package that bind ``name`` to ``obj`` at top level (a constant's homes)."""
    homes = []
    for modname in modules:
        mod = importlib.import_module(modname)
        if vars(mod).get(name, _MISSING) is obj:
            homes.append(f"{modname}.{name}")
    return tuple(homes)


_MISSING = object()


def public_symbols(package: str = PACKAGE) -> Iterator[PublicSymbol]:
    """Every name in the ``__all__`` of the package and of its public modules."""
    modules = public_modules(package)
    for modname in modules:
        mod = importlib.import_module(modname)
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if inspect.ismodule(obj):
                yield PublicSymbol(modname, name, (obj.__name__,), bool(_own_doc(obj)), False)
                continue
            canon = canonical_name(obj)
            if canon is not None:
                yield PublicSymbol(modname, name, (canon,), bool(_own_doc(obj)), False)
            else:
                yield PublicSymbol(modname, name, _data_homes(obj, name, modules), True, True)


# ---------------------------------------------------------------------------------------------
# Resolving public names to where they are documented
# ---------------------------------------------------------------------------------------------

def import_target(target: str):
    """Import ``a.b.C.meth``: the longest importable module prefix, then attributes.

    :returns: ``(obj, module_name, attribute_path)`` or None when nothing imports.
    """
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        modname = ".".join(parts[:i])
        try:
            obj = importlib.import_module(modname)
        except Exception:  # noqa: BLE001 - any import failure means "not this prefix"
            continue
        rest = parts[i:]
        try:
            for attr in rest:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj, modname, rest
    return None


def documented_candidates(target: str) -> List[str]:
    """Names under which ``target`` (a dotted name as written in a reference) may be
    documented, best first: where the object is defined, then its enclosing class and module
    (an undocumented method or a private helper links to what holds it). Empty when the name
    does not import: a typo stays a broken reference."""
    found = import_target(target)
    if found is None:
        return []
    obj, modname, rest = found
    if not rest:
        return [obj.__name__]
    # re-anchor at the last class/function on the path whose definition we know
    owner, anchor, tail = importlib.import_module(modname), modname, []
    for i, attr in enumerate(rest):
        owner = getattr(owner, attr)
        canon = canonical_name(owner)
        if canon is not None:
            anchor, tail = canon, rest[i + 1:]
        else:
            tail = tail + [attr] if anchor != modname or tail else rest[:i + 1]
    full = ".".join([anchor] + tail)
    candidates = [full]
    if not inspect.isclass(obj) and not inspect.isroutine(obj) and not inspect.ismodule(obj):
        candidates.extend(_data_homes(obj, rest[-1], public_modules()))
    parts = full.split(".")
    for i in range(len(parts) - 1, 0, -1):   # enclosing class(es), then the module(s)
        candidates.append(".".join(parts[:i]))
    return candidates


def _missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip(".~")
    module, klass = node.get("py:module"), node.get("py:class")
    names = []
    if module and klass:
        names.append(f"{module}.{klass}.{target}")
    if module:
        names.append(f"{module}.{target}")
    names.append(target)
    domain = env.get_domain("py")
    for name in names:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            continue
        for candidate in documented_candidates(name):
            if not candidate.startswith(PACKAGE):
                break
            if candidate in domain.objects or candidate in domain.modules:
                return domain.resolve_xref(env, node["refdoc"], app.builder, "obj", candidate,
                                           node, contnode)
    if "." not in target:
        # a bare name in a docstring shown on another module's page (a re-export): link it
        # when exactly one documented object of the package has that name
        matches = {name for name in domain.objects
                   if name.startswith(PACKAGE + ".") and name.endswith("." + target)
                   and not domain.objects[name].aliased}
        if len(matches) == 1:
            return domain.resolve_xref(env, node["refdoc"], app.builder, "obj", matches.pop(),
                                       node, contnode)
    return None


# ---------------------------------------------------------------------------------------------
# The public-API check
# ---------------------------------------------------------------------------------------------

def api_problems(documented_objects, documented_modules) -> List[str]:
    """Messages for public symbols or modules that the API pages miss (empty when complete)."""
    problems = []
    for modname in public_modules():
        if modname not in documented_modules:
            problems.append(f"module {modname} is on no API page: add '.. automodule:: {modname}' "
                            f"to a page under docs/api/")
    seen = set()
    for sym in public_symbols():
        key = sym.targets
        if key in seen:
            continue
        seen.add(key)
        if not sym.has_docstring:
            problems.append(f"{sym.public_name} (in __all__ of {sym.module}) has no docstring")
            continue
        if not any(t in documented_objects or t in documented_modules for t in sym.targets):
            where = " or ".join(sym.targets) or "its module"
            hint = ("give it a '#:' doc comment where it is assigned, or an '.. autodata::' "
                    "entry with a description" if sym.is_data else
                    "its module is not on an API page, or autodoc skipped it")
            problems.append(f"{sym.public_name} (in __all__ of {sym.module}) is documented "
                            f"nowhere (expected {where}): {hint}")
    return problems


def _check_api(app, env):
    from sphinx.util import logging

    logger = logging.getLogger(__name__)
    domain = env.get_domain("py")
    for message in api_problems(domain.objects, domain.modules):
        logger.warning(message, type="pyro_seq", subtype="api")


# ---------------------------------------------------------------------------------------------
# Equation citations
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Source:
    key: str
    short: str                 #: how the docstrings name it (author-year), the index's heading
    title: str                 #: full reference, as on the references page
    numbering: str             #: "chapter" (eq. 3.12) or "plain" (eq. 7)
    equations: Optional[Dict[int, int]] = None  #: chapter -> last equation, or {0: last}
    markers: Tuple[str, ...] = ()  #: regexes that name this source in a docstring
    ref: str = ""              #: label of its entry on the references page (``ref-...``)

    @property
    def label(self) -> str:
        return self.ref or f"ref-{self.key}"


#: The documents the docstrings cite equations of, in the order of the equations page. The keys
#: are internal names (stable, used by tests); users see ``short``, ``title`` and the link.
SOURCES = [
    Source("thesis", "Fraccaro (2018), the thesis",
           "M. Fraccaro, *Deep Latent Variable Models for Sequential Data*, PhD thesis, "
           "Technical University of Denmark, 2018. Chapter 5 is the SRNN paper (Fraccaro et al. "
           "2016), chapter 6 the KVAE paper (Fraccaro et al. 2017), chapter 7 the GTM-SM paper "
           "(Fraccaro et al. 2018).",
           "chapter", {2: 13, 3: 20, 4: 27, 5: 12, 6: 13, 7: 4},
           (r"\bthesis\b", r"\bFraccaro\b", r"\bSRNN\b"), "ref-thesis"),
    Source("seed000", "Mittelman et al. (2014), supplementary material",
           "R. Mittelman, B. Kuipers, S. Savarese, H. Lee, supplementary material (June 2014) "
           "for *Structured Recurrent Temporal Restricted Boltzmann Machines*, ICML 2014: the "
           "RTRBM energy, the recursion of r_t and the gradients of CD learning with BPTT.",
           "chapter", {1: 27}, (r"\bMittelman\b",)),
    Source("seed002", "Bayer & Osendorfer (2014)",
           "J. Bayer, C. Osendorfer, *Variational inference of latent state sequences using "
           "recurrent networks*, arXiv:1411.7610v1, 2014 (later versions: *Learning Stochastic "
           "Recurrent Networks*, STORN).",
           "plain", {0: 7}, (r"\bBayer\b", r"\bOsendorfer\b")),
    Source("seed003", "Soyer & Möllenhoff (n.d.)",
           "H. Soyer, T. Möllenhoff, *What Do You Know?*, project report, Technical University "
           "Munich, undated (the Kaggle challenge of 2011-2012): RBMs for student-performance "
           "prediction as collaborative filtering.",
           "plain", {0: 25}, (r"\bSoyer\b", r"\bMöllenhoff\b")),
    Source("chung2015", "Chung et al. (2015)",
           "J. Chung, K. Kastner, L. Dinh, K. Goel, A. Courville, Y. Bengio, *A Recurrent "
           "Latent Variable Model for Sequential Data*, NIPS 2015.",
           "plain", None, (r"\bChung et al\b",), "ref-chung2015"),
    Source("krishnan2017", "Krishnan et al. (2017)",
           "R. G. Krishnan, U. Shalit, D. Sontag, *Structured Inference Networks for Nonlinear "
           "State Space Models*, AAAI 2017.",
           "plain", None, (r"\bKrishnan et al\b",), "ref-krishnan2017"),
    Source("mnih2016", "Mnih & Rezende (2016)",
           "A. Mnih, D. J. Rezende, *Variational Inference for Monte Carlo Objectives* (VIMCO), "
           "ICML 2016.",
           "plain", None, (r"\bMnih\b", r"\bVIMCO\b"), "ref-mnih2016"),
    Source("burda2016", "Burda et al. (2016)",
           "Y. Burda, R. Grosse, R. Salakhutdinov, *Importance Weighted Autoencoders*, ICLR 2016.",
           "plain", None, (r"\bBurda et al\b",), "ref-burda2016"),
    Source("tucker2019", "Tucker et al. (2019)",
           "G. Tucker, D. Lawson, S. Gu, C. J. Maddison, *Doubly Reparameterized Gradient "
           "Estimators for Monte Carlo Objectives* (DReG), ICLR 2019.",
           "plain", None, (r"\bTucker et al\b", r"\bDReG\b"), "ref-tucker2019"),
    Source("maddison2017", "Maddison et al. (2017)",
           "C. J. Maddison, D. Lawson, G. Tucker, N. Heess, M. Norouzi, A. Mnih, A. Doucet, "
           "Y. W. Teh, *Filtering Variational Objectives*, NIPS 2017.",
           "plain", None, (r"\bMaddison et al\b",), "ref-maddison2017"),
]
SOURCES_BY_KEY = {s.key: s for s in SOURCES}

_NUM = r"\(?\d+(?:\.\d+)?\)?"
_ITEM = rf"{_NUM}(?:\s*[-\u2013]\s*{_NUM})?"
_CITATION = re.compile(
    rf"\b(?:[Ee]qs?\.|[Ee]quations?)\s*(?P<list>{_ITEM}(?:\s*(?:,|/|and)\s*{_ITEM})*)")
_LOCAL_AFTER = re.compile(r"^\s*\)?\s*(?:of the module docstring|of :mod:|of the module\b)")
_LOCAL_DISPLAY = re.compile(r"\(\d+\)\s*$", re.M)  # "... (3)" ending a line: local numbering
_WINDOW = 160


@dataclasses.dataclass(frozen=True)
class Citation:
    source: str       #: key of :data:`SOURCES`, or "" when it cannot be told
    equation: str     #: "3.12" or "7"
    target: str       #: documented name of the citing object (module, class, function, ...)
    objtype: str      #: "module", "class", "function", "method", "attribute", "property"
    text: str         #: the citation as written, for messages

    @property
    def sort_key(self):
        return tuple(int(p) for p in self.equation.split("."))


def _numbers(item: str) -> List[Tuple[int, ...]]:
    """``"3.4-3.6"`` -> [(3, 4), (3, 5), (3, 6)]; ``"(1)-(2)"`` -> [(1,), (2,)]."""
    ends = [tuple(int(p) for p in n.strip("() ").split(".")) for n in re.split(r"[-\u2013]", item)]
    if len(ends) == 1:
        return ends
    a, b = ends[0], ends[-1]
    if len(a) != len(b) or a[:-1] != b[:-1] or not 0 <= b[-1] - a[-1] <= 30:
        return [a, b]
    return [a[:-1] + (k,) for k in range(a[-1], b[-1] + 1)]


def _markers_before(text: str) -> List[Tuple[int, str]]:
    found = []
    for source in SOURCES:
        for marker in source.markers:
            for m in re.finditer(marker, text):
                found.append((m.start(), source.key))
    return sorted(found)


def _module_default(module_doc: str) -> str:
    """The plain-numbered source a module's docstring names first (for a bare ``eq. 7``)."""
    for _, key in _markers_before(module_doc or ""):
        if SOURCES_BY_KEY[key].numbering == "plain":
            return key
    return ""


def _attribute(numbers: Tuple[int, ...], window: str, module_default: str) -> str:
    style = "chapter" if len(numbers) == 2 else "plain"
    for _, key in reversed(_markers_before(window)):
        if SOURCES_BY_KEY[key].numbering == style:
            return key
    if style == "chapter":
        return "seed000" if numbers[0] == 1 else "thesis"
    return module_default


def in_source(source: str, numbers: Tuple[int, ...]) -> bool:
    """Whether the source document has an equation with that number (when its list is known)."""
    known = SOURCES_BY_KEY[source].equations
    if known is None:
        return True
    chapter, number = (numbers if len(numbers) == 2 else (0,) + numbers)
    return chapter in known and 1 <= number <= known[chapter]


def _is_documented(mod, qualname: str) -> bool:
    """Whether autodoc documents ``mod.qualname`` (public path, in ``__all__`` if there is one)."""
    parts = qualname.split(".")
    if any(p.startswith("_") for p in parts):
        return False
    allnames = getattr(mod, "__all__", None)
    return allnames is None or parts[0] in allnames


def _docstrings(modname: str) -> Iterator[Tuple[str, str, str, str]]:
    """``(target, objtype, docstring, module_docstring)`` of a module and what it defines."""
    mod = importlib.import_module(modname)
    module_doc = mod.__doc__ or ""
    yield modname, "module", module_doc, module_doc

    def members(owner, prefix, owner_target):
        for name, value in vars(owner).items():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                value, kind = value.fget, "property"
            elif inspect.isclass(value):
                kind = "class"
            elif inspect.isfunction(value):
                kind = "method" if prefix else "function"
            else:
                continue
            if value is None or getattr(value, "__module__", None) != modname:
                continue
            qualname = f"{prefix}{name}"
            if getattr(value, "__qualname__", qualname) != qualname:
                continue  # an alias of something defined elsewhere in the module
            documented = _is_documented(mod, qualname) and _own_doc(value) is not None
            target = f"{modname}.{qualname}" if documented else owner_target
            doc = _own_doc(value) or ""
            yield target, kind if documented else ("module" if not prefix else "class"), doc
            if inspect.isclass(value):
                yield from members(value, qualname + ".", target)

    for target, kind, doc in members(mod, "", modname):
        yield target, kind, doc, module_doc


def equation_citations(package: str = PACKAGE) -> List[Citation]:
    """Every equation citation in the docstrings of the package, attributed to a source.

    Citations of a module's own numbered displays (``eq. (2) of the module docstring``, or a
    bare ``eq. (2)`` in a module whose docstring numbers its own displays) are left out.
    """
    citations = []
    for modname in public_modules(package):
        for target, objtype, doc, module_doc in _docstrings(modname):
            text = " ".join(doc.split())
            local = bool(_LOCAL_DISPLAY.search(module_doc))
            default = _module_default(" ".join(module_doc.split()))
            for m in _CITATION.finditer(text):
                if _LOCAL_AFTER.match(text[m.end():]):
                    continue
                window = text[max(0, m.start() - _WINDOW):m.start()]
                items = re.split(r"\s*(?:,|/|and)\s*", m.group("list"))
                style = None
                for item in items:
                    for numbers in _numbers(item):
                        if style is None:
                            style = len(numbers)
                        elif len(numbers) != style:
                            break  # "eq. 3.12, 300 ..." : the list ended
                        if len(numbers) == 1 and local and not any(
                                SOURCES_BY_KEY[k].numbering == "plain"
                                for _, k in _markers_before(window[-60:])):
                            continue  # the module's own equation
                        source = _attribute(numbers, window, default)
                        citations.append(Citation(source, ".".join(map(str, numbers)), target,
                                                  objtype, m.group(0)))
    return sorted(set(citations), key=lambda c: (c.source, c.sort_key, c.target))


def citation_problems(citations: List[Citation]) -> List[str]:
    """Citations without a source, or with a number their source does not have."""
    problems = []
    for c in citations:
        numbers = tuple(int(p) for p in c.equation.split("."))
        if not c.source:
            problems.append(f"{c.target}: cannot tell which document '{c.text}' cites; name it in "
                            f"the docstring (e.g. 'Bayer & Osendorfer (2014), eq. {c.equation}')")
        elif not in_source(c.source, numbers):
            problems.append(f"{c.target}: '{c.text}' read as {SOURCES_BY_KEY[c.source].short} "
                            f"eq. {c.equation}, which that document does not have")
    return problems


# ---------------------------------------------------------------------------------------------
# Directives
# ---------------------------------------------------------------------------------------------

def _xref(c: Citation) -> str:
    """A link to the citing object, shown as ``module`` or ``Class.method`` / ``function``."""
    if c.objtype == "module":
        return f":py:mod:`{c.target}`"
    module = c.target
    while module not in sys.modules or not inspect.ismodule(sys.modules[module]):
        module = module.rsplit(".", 1)[0]
    return f":py:obj:`{c.target[len(module) + 1:]} <{c.target}>`"


def _setup_directives(app):
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util import logging
    from sphinx.util.docutils import SphinxDirective

    logger = logging.getLogger(__name__)

    class EquationIndex(SphinxDirective):
        """The equations index: one table per source, equation -> citing objects."""

        def run(self):
            citations = equation_citations()
            for message in citation_problems(citations):
                logger.warning(message, location=(self.env.docname, self.lineno),
                               type="pyro_seq", subtype="equations")
            lines = []
            for source in SOURCES:
                rows: Dict[str, List[Citation]] = {}
                for c in citations:
                    if c.source == source.key:
                        rows.setdefault(c.equation, []).append(c)
                if not rows:
                    continue
                title = source.short
                lines += [title, "-" * len(title), "",
                          f"Source: {source.title} (:ref:`references <{source.label}>`)", "",
                          ".. list-table::", "   :header-rows: 1", "   :widths: 12 88", "",
                          "   * - equation", "     - implemented or used in"]
                for eq in sorted(rows, key=lambda e: tuple(int(p) for p in e.split("."))):
                    refs = []
                    for c in sorted(rows[eq], key=lambda c: c.target):
                        ref = _xref(c)
                        if ref not in refs:
                            refs.append(ref)
                    lines += [f"   * - ({eq})", f"     - {', '.join(refs)}"]
                lines.append("")
            container = nodes.section()
            container.document = self.state.document
            self.state.nested_parse(StringList(lines, source="<equation-index>"),
                                    self.content_offset, container, match_titles=True)
            return container.children

    class CliHelp(SphinxDirective):
        """``pyro-seq --help`` and every subcommand's help as literal blocks."""

        def run(self):
            import argparse

            from pyro_seq.cli import make_parser

            columns = os.environ.get("COLUMNS")
            os.environ["COLUMNS"] = "100"   # argparse wraps at the terminal width
            try:
                parser = make_parser()
                parser.prog = "pyro-seq"
                out = [nodes.literal_block(text=parser.format_help())]
                subactions = [a for a in parser._actions
                              if isinstance(a, argparse._SubParsersAction)]
                for action in subactions:
                    for name, sub in action.choices.items():
                        section = nodes.section(ids=[f"cli-{name}"])
                        section += nodes.title(text=f"pyro-seq {name}")
                        section += nodes.literal_block(text=sub.format_help())
                        out.append(section)
            finally:
                if columns is None:
                    os.environ.pop("COLUMNS", None)
                else:
                    os.environ["COLUMNS"] = columns
            return out

    app.add_directive("equation-index", EquationIndex)
    app.add_directive("cli-help", CliHelp)


def setup(app):
    _setup_directives(app)
    app.connect("missing-reference", _missing_reference)
    app.connect("env-check-consistency", _check_api)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
