"""Shared helpers of the property-based tests: example budgets and the exception contract."""

import math
import re

import torch
from hypothesis import settings


def examples(fraction: float, at_least: int = 2) -> settings:
    """Settings with ``fraction`` of the profile's ``max_examples`` (for slow properties).

    Built when the test module is imported, i.e. after ``conftest.py`` loaded the profile, so
    the count follows the profile (``ci``: a handful; ``fuzz``: hundreds).
    """
    return settings(max_examples=max(at_least, int(settings().max_examples * fraction)))


def expect_documented(exc: BaseException, *patterns: str, types=(ValueError, TypeError)) -> None:
    """``exc`` is one of the documented ``types`` and its first line matches one of ``patterns``.

    Anything else (another exception type, a message naming none of the problems present) is
    re-raised with the reason, so that Hypothesis shrinks and reports it.
    """
    if not isinstance(exc, types):
        raise AssertionError(f"undocumented exception type {type(exc).__name__}: {exc}") from exc
    first = str(exc).split("\n")[0]
    if patterns and not any(re.search(p, first) for p in patterns):
        raise AssertionError(
            f"{type(exc).__name__} message {first!r} names none of the problems present: "
            f"{patterns}") from exc


def assert_finite(name: str, value) -> None:
    """No NaN (nor inf) in a tensor or a float."""
    if torch.is_tensor(value):
        assert bool(torch.isfinite(value).all()), f"{name} is not finite: {value}"
    else:
        assert math.isfinite(value), f"{name} is not finite: {value}"
