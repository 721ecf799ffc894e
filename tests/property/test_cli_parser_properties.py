"""Property of the command-line parser: random argument lists give a namespace or SystemExit.

Arguments are drawn from the parser's own vocabulary (sub-commands, every option string,
choices) mixed with numbers, odd strings and random text, so that most lists get deep into
argparse. Parsing never raises anything but SystemExit (argparse's usage error or --help), and
a parsed namespace names its sub-command and the function that runs it.
"""

import contextlib
import io

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pyro_seq.cli import make_parser

pytestmark = pytest.mark.fuzz

PARSER = make_parser()
SUBPARSERS = next(a for a in PARSER._actions if a.__class__.__name__ == "_SubParsersAction")
COMMANDS = sorted(SUBPARSERS.choices)
OPTIONS = sorted(
    {s for p in SUBPARSERS.choices.values() for a in p._actions for s in a.option_strings}
)
CHOICES = sorted(
    {str(c) for p in SUBPARSERS.choices.values() for a in p._actions for c in (a.choices or ())}
)
VALUES = [
    "0",
    "1",
    "-1",
    "20",
    "1e-3",
    "0.5",
    "-0.0",
    "nan",
    "inf",
    "-inf",
    "1e999",
    "1_000",
    "0x10",
    "",
    " ",
    "-",
    "--",
    "---",
    "-x",
    "--no-such-option",
    "=",
    "--out=",
    "a=b",
    "d_dim=4",
    "hidden_dim=[1, 2]",
    "{",
    "\x00",
    "\u00e9t\u00e9",
    "runs/x",
    "/dev/null",
    "../../etc/passwd",
    "%(prog)s",
    "%s",
    "-1e5",
    "2147483648",
    "9" * 50,
]
TOKEN = st.one_of(
    st.sampled_from(COMMANDS),
    st.sampled_from(OPTIONS),
    st.sampled_from(OPTIONS),
    st.sampled_from(CHOICES),
    st.sampled_from(VALUES),
    st.text(max_size=8),
    st.builds(lambda o, v: f"{o}={v}", st.sampled_from(OPTIONS), st.sampled_from(VALUES)),
    st.builds(lambda o: o[: max(3, len(o) // 2)], st.sampled_from(OPTIONS)),  # prefixes
)


def _value(draw, action):
    """A value for ``action``: one of its choices, a number of its type, or anything."""
    if action.choices:
        return str(draw(st.sampled_from(sorted(action.choices, key=str))))
    if action.type is int and draw(st.booleans()):
        return str(draw(st.integers(-5, 10**6)))
    if action.type is float and draw(st.booleans()):
        return repr(draw(st.floats(allow_nan=True, allow_infinity=True)))
    return draw(st.sampled_from(VALUES + ["runs/a", "chorales", "x.pickle"]))


@st.composite
def near_valid(draw):
    """A sub-command with its required arguments and a few of its options, then maybe a
    random edit: most of these parse, so the namespace side of the property is exercised."""
    command = draw(st.sampled_from(COMMANDS))
    sub = SUBPARSERS.choices[command]
    args = [command] + (["--out", "runs/a"] if command == "train" else ["runs/a"])
    optional = [a for a in sub._actions if a.option_strings and a.dest != "help"]
    for action in draw(st.lists(st.sampled_from(optional), max_size=5)):
        args.append(draw(st.sampled_from(action.option_strings)))
        if action.nargs != 0:
            args.append(_value(draw, action))
    if draw(st.integers(0, 3)) == 0:
        i = draw(st.integers(0, len(args)))
        args.insert(i, draw(TOKEN))
    return args


@st.composite
def argument_lists(draw):
    if draw(st.booleans()):
        return draw(near_valid())
    args = draw(st.lists(TOKEN, max_size=12))
    if draw(st.booleans()):
        args = [draw(st.sampled_from(COMMANDS))] + args
    return args


@given(argument_lists())
def test_parse_args_gives_a_namespace_or_system_exit(argv):
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            ns = PARSER.parse_args(argv)
        event("parsed")
    except SystemExit as e:
        # 0: --help; 2: a usage error, explained on stderr
        assert e.code in (0, 2), e.code
        if e.code == 2:
            assert "error:" in err.getvalue()
        return
    assert ns.command in COMMANDS
    assert callable(ns.func)


@given(st.lists(st.text(max_size=10), max_size=8))
def test_random_text_gives_a_namespace_or_system_exit(argv):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            ns = make_parser().parse_args(argv)
        except SystemExit:
            return
    assert ns.command in COMMANDS
