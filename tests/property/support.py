"""Shared helpers of the property-based tests: example budgets, the exception contract and
random ragged batches."""

import math
import re

import torch
from hypothesis import settings
from hypothesis import strategies as st


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
            f"{type(exc).__name__} message {first!r} names none of the problems present: {patterns}"
        ) from exc


def assert_finite(name: str, value) -> None:
    """No NaN (nor inf) in a tensor or a float."""
    if torch.is_tensor(value):
        assert bool(torch.isfinite(value).all()), f"{name} is not finite: {value}"
    else:
        assert math.isfinite(value), f"{name} is not finite: {value}"


@st.composite
def ragged_batches(draw, D, binary):
    """A prefix-masked batch (binary or real values, zero padding), then possibly one defect."""
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(1)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if binary:
        x = torch.bernoulli(
            torch.full((B, T, D), draw(st.sampled_from([0.0, 0.3, 1.0]))), generator=g
        )
    else:
        x = torch.randn(B, T, D, generator=g) * 10 ** draw(st.floats(-3, 3))
    x = x * mask.unsqueeze(-1)
    defect = draw(
        st.sampled_from(
            [None] * 6
            + [
                "non_binary",
                "nan",
                "inf",
                "nan_padded",
                "empty_row",
                "non_prefix",
                "half_mask",
                "features",
            ]
        )
    )
    b, t = draw(st.integers(0, B - 1)), draw(st.integers(0, T - 1))
    if defect == "non_binary":
        x[b, t, 0] = draw(st.sampled_from([0.5, -1.0, 2.0]))
    elif defect in ("nan", "inf"):
        x[b, t, 0] = float(defect)
    elif defect == "nan_padded" and not bool(mask.all()):
        b, t = (int(i) for i in (~mask).nonzero()[0])
        x[b, t, 0] = float("nan")
    elif defect == "empty_row":
        mask[b] = False
        x[b] = 0
    elif defect == "non_prefix" and T > 1:
        mask[b, 0] = False
    elif defect == "features":
        x = torch.cat([x, x[..., :1]], -1)
    mask = mask.float() if draw(st.booleans()) else mask
    if defect == "half_mask":
        mask = mask.float()
        mask[b, t] = 0.5
    return x, mask
