"""Docstrings and comments cite papers by author, year and section, never by the file name of
the project's source documents ("seed 000" ... "seed 004"): a reader of the package has the
papers, not those files. Read from the source text (nothing imported).

The allow-list names modules that still did when this check was introduced; it must only
shrink (an entry that no longer offends fails the test, so that the list stays exact).
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyro_seq"
FORBIDDEN = re.compile(r"seed 00", re.IGNORECASE)

# being split (issue 24): paths relative to the repository root
ALLOWED: set = set()


def offending_lines(text):
    """``[(line number, line)]`` of the lines of ``text`` that name a seed document."""
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]


def test_the_pattern_finds_seed_citations_and_nothing_else():
    text = "a (seed 002 sec. 3.3)\nb Seed 000 eq. 1.1\nc SEED 003\nd manual_seed(3)\ne seeds\n"
    assert [n for n, _ in offending_lines(text)] == [1, 2, 3]


def test_no_module_cites_a_seed_document():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        lines = offending_lines(path.read_text(encoding="utf-8"))
        if lines:
            found[rel] = lines
    problems = [
        f"{rel}:{n}: cite the paper by authors, year and section instead: {line.strip()}"
        for rel, lines in found.items()
        if rel not in ALLOWED
        for n, line in lines
    ]
    assert not problems, "\n".join(problems)
    stale = sorted(ALLOWED - set(found))
    assert not stale, f"no longer cite a seed document; remove them from ALLOWED: {stale}"
