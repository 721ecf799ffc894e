"""Shared fixtures for the data tests: the real JSB Chorales pickles, found by path."""

from pathlib import Path

import pytest

# tests/data/conftest.py -> project root is two levels up; the shared data sits beside it.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
POLYPHONIC = PROJECT_ROOT.parent / "shared" / "data" / "polyphonic"


def _require(name: str) -> Path:
    path = POLYPHONIC / name
    if not path.is_file():
        pytest.skip(
            f"needs the shared data file {path}: {name} is absent (the shared data folder ../shared/data is not beside this checkout)"
        )
    return path


@pytest.fixture
def jsb_path() -> Path:
    return _require("jsb_chorales.pickle")


@pytest.fixture
def jsb2x_path() -> Path:
    return _require("jsb_chorales_2x.pickle")
