"""benchmarks/common.py finds data the way the package does: $PYRO_SEQ_DATA first."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import common  # noqa: E402


def test_data_file_searches_pyro_seq_data_first_and_names_what_it_searched(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (b / "x.pickle").write_bytes(b"")
    monkeypatch.setenv("PYRO_SEQ_DATA", f"{a}:{b}")
    assert common.data_dirs()[:2] == [a, b]
    assert common.data_file("x.pickle") == b / "x.pickle"
    (a / "x.pickle").write_bytes(b"")
    assert common.data_file("x.pickle") == a / "x.pickle"
    assert common.data_file("ignored", override=str(b / "x.pickle")) == b / "x.pickle"
    with pytest.raises(
        SystemExit, match=f"data file y.pickle not found in {a}, {b}, .*PYRO_SEQ_DATA"
    ):
        common.data_file("y.pickle")
    with pytest.raises(SystemExit, match="data file .*nothing not found"):
        common.data_file("x.pickle", override=str(tmp_path / "nothing"))
