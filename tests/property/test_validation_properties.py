"""Properties of :mod:`pyro_seq.validation`: every input is accepted with the contract's
result, or refused with a ValueError/TypeError naming a problem the input really has.

An independent oracle lists the problems of each random input; the validator must raise iff
the list is non-empty, and its message must name one of them.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pyro_seq.validation import (
    as_bool_mask,
    prepare_sequences,
    validate_mask,
    validate_observed,
    validate_sequences,
)

from .support import expect_documented

pytestmark = pytest.mark.fuzz

NAN, INF = float("nan"), float("inf")
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
OTHER_DTYPES = [torch.int64, torch.int8, torch.uint8, torch.bool, torch.complex64]
MASK_DTYPES = [
    torch.bool,
    torch.bool,
    torch.float32,
    torch.float64,
    torch.float16,
    torch.int64,
    torch.uint8,
    torch.int8,
]
BAD_MASK_VALUES = [0.5, NAN, 2.0, -1.0, INF, 1e-30]

# what the validator's message says for each kind of problem (first line of the message)
MESSAGES = {
    "x_type": r"^x must be a torch\.Tensor",
    "x_dim": r"^x must have 3 dimensions \(batch, T, D\), got \d+",
    "x_dtype": r"^x must be a floating-point tensor, got dtype",
    "x_empty": r"^x has an empty dimension \((batch = 0|T = 0: no time steps|D = 0)\)",
    "obs_dim": r"^x has \d+ features per step, the model expects \d+",
    "mask_type": r"^mask must be a bool torch\.Tensor of shape",
    "mask_shape": r"^mask shape \(.*\) does not match x's \(batch, T\)",
    "mask_values": r"^mask must be bool or contain only 0 and 1",
    "observed_type": r"^observed must be a bool torch\.Tensor",
    "observed_shape": r"^observed shape \(.*\) is neither \(batch, T\)",
    "observed_values": r"^observed must be bool or contain only 0 and 1",
    "nonfinite": r"^x contains \d+ NaN/inf values; first: (NaN|infinite value) at \(batch \d+, "
    r"step \d+, feature \d+\), a (real|padded) step",
    "empty_row": r"^empty sequence: mask row \d+ has no True step",
    "non_prefix": r"^mask row \d+ is not a prefix",
    "binary": r"^x must be binary \(0/1\) for a Bernoulli model, found .* at \(batch \d+, "
    r"step \d+, feature \d+\)",
}


# --- strategies ------------------------------------------------------------------------------


@st.composite
def values_tensor(draw, shape, dtype, pool):
    n = math.prod(shape)
    vals = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    t = torch.tensor(vals, dtype=torch.float64).reshape(shape)
    if dtype.is_complex:
        return t.to(dtype)
    if dtype == torch.bool:
        return t != 0
    if not dtype.is_floating_point:
        return torch.nan_to_num(t, nan=0.0, posinf=1.0, neginf=-1.0).to(dtype)
    return t.to(dtype)


X_POOL = [0.0, 1.0] * 6 + [0.5, -2.0, NAN, INF, -INF]


@st.composite
def sequences_x(draw):
    """x: mostly (B, T, D) floats of 0/1 with the odd non-binary or non-finite value; sometimes
    another rank, an empty dimension, a non-floating dtype or not a tensor at all."""
    kind = draw(st.sampled_from(["good"] * 8 + ["rank", "dtype", "not_tensor"]))
    if kind == "not_tensor":
        return draw(st.sampled_from([None, [[[0.0]]], np.zeros((1, 1, 1)), 3.0, "x"]))
    if kind == "rank":
        shape = tuple(
            draw(st.lists(st.integers(0, 3), min_size=0, max_size=4).filter(lambda s: len(s) != 3))
        )
    else:
        shape = (draw(st.integers(0, 4)), draw(st.integers(0, 5)), draw(st.integers(0, 3)))
        if 0 in shape and draw(st.booleans()):  # empty dimensions: rare but tried
            shape = tuple(max(s, 1) for s in shape)
    dtype = draw(st.sampled_from(OTHER_DTYPES if kind == "dtype" else FLOAT_DTYPES))
    clean = draw(st.booleans())
    return draw(values_tensor(shape, dtype, [0.0, 1.0] if clean else X_POOL))


@st.composite
def bool_rows(draw, B, T, prefix):
    if prefix:
        lengths = draw(
            st.lists(
                st.integers(0 if draw(st.booleans()) or T == 0 else 1, T), min_size=B, max_size=B
            )
        )
        return torch.arange(T).unsqueeze(0) < torch.tensor(lengths, dtype=torch.long).reshape(B, 1)
    vals = draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))
    return torch.tensor(vals, dtype=torch.bool).reshape(B, T)


@st.composite
def masks(draw, shape, name="mask", allow_prefix=True):
    """A mask for ``shape``: None, prefix or arbitrary rows, bool or any dtype holding 0/1,
    sometimes a bad value, the wrong shape, or not a tensor."""
    kind = draw(
        st.sampled_from(["none", "prefix", "prefix", "prefix", "any", "shape", "not_tensor"])
    )
    if kind == "none":
        return None
    if kind == "not_tensor":
        return draw(st.sampled_from([[[True]], np.ones(shape, dtype=bool), 1, "mask"]))
    if kind == "shape":
        shape = (
            tuple(s + draw(st.sampled_from([-1, 1])) if s > 0 else 1 for s in shape)
            if len(shape)
            else (1,)
        )
    B, T = (shape[0], shape[1]) if len(shape) >= 2 else (1, shape[0] if shape else 1)
    m = draw(bool_rows(B, T, prefix=kind == "prefix" and allow_prefix))
    if len(shape) == 3:
        m = m.unsqueeze(-1).expand(shape).clone()
        if draw(st.booleans()):
            flip = draw(st.lists(st.booleans(), min_size=m.numel(), max_size=m.numel()))
            m = m ^ torch.tensor(flip, dtype=torch.bool).reshape(shape)
    elif len(shape) != 2:
        m = (
            m.reshape(-1)[: math.prod(shape)].reshape(shape)
            if m.numel() >= math.prod(shape)
            else torch.ones(shape, dtype=torch.bool)
        )
    dtype = draw(st.sampled_from(MASK_DTYPES))
    m = m.to(dtype)
    if dtype != torch.bool and m.numel() and draw(st.integers(0, 3)) == 0:
        i = draw(st.integers(0, m.numel() - 1))
        v = draw(st.sampled_from(BAD_MASK_VALUES))
        if not dtype.is_floating_point:
            v = 2 if v != -1.0 else -1
            if dtype == torch.uint8:
                v = 2
        m.view(-1)[i] = v
    return m


# --- an independent oracle -------------------------------------------------------------------


def _bad_values(m: torch.Tensor) -> bool:
    if m.dtype == torch.bool:
        return False
    if m.is_complex():
        return True
    f = m.double()
    return bool(((f != 0) & (f != 1)).any())


def oracle(x, mask, obs_dim, binary, prefix_mask, observed):
    """The problems of an input (kinds of :data:`MESSAGES`), in the validator's order of
    checks; the checks after a problem that makes them meaningless are skipped."""
    if not torch.is_tensor(x):
        return ["x_type"]
    if x.dim() != 3:
        return ["x_dim"]
    if not x.is_floating_point():
        return ["x_dtype"]
    B, T, D = x.shape
    if 0 in (B, T, D):
        return ["x_empty"]
    out = []
    if obs_dim is not None and obs_dim != D:
        out.append("obs_dim")
    if mask is not None:
        if not torch.is_tensor(mask):
            return out + ["mask_type"]
        if tuple(mask.shape) != (B, T):
            return out + ["mask_shape"]
        if _bad_values(mask):
            return out + ["mask_values"]
    m = torch.ones(B, T, dtype=torch.bool) if mask is None else mask.double() != 0
    seen = torch.ones(B, T, D, dtype=torch.bool)
    if observed is not None:
        if not torch.is_tensor(observed):
            return out + ["observed_type"]
        if tuple(observed.shape) not in ((B, T), (B, T, D)):
            return out + ["observed_shape"]
        if _bad_values(observed):
            return out + ["observed_values"]
        seen = observed.double() != 0
        seen = seen.unsqueeze(-1).expand(B, T, D) if seen.dim() == 2 else seen
    xd = x.double()
    if not bool((torch.isfinite(xd) | ~seen).all()):
        out.append("nonfinite")
    lengths = m.sum(1)
    if bool((lengths == 0).any()):
        out.append("empty_row")
    elif prefix_mask and not torch.equal(torch.arange(T) < lengths.unsqueeze(1), m):
        out.append("non_prefix")
    if binary and bool((((xd != 0) & (xd != 1)) & m.unsqueeze(-1) & seen).any()):
        out.append("binary")
    return out


def _check_accepted(x, mask, out_x, out_mask, binary, prefix_mask):
    B, T, D = x.shape
    assert out_x is x, "validate_sequences must return x unchanged"
    assert out_mask.dtype == torch.bool and tuple(out_mask.shape) == (B, T)
    expected = torch.ones(B, T, dtype=torch.bool) if mask is None else mask.double() != 0
    assert torch.equal(out_mask, expected), "the bool mask must read 0/1 exactly as given"
    lengths = out_mask.sum(1)
    assert bool((lengths >= 1).all())
    if prefix_mask:
        assert torch.equal(out_mask, torch.arange(T) < lengths.unsqueeze(1))


# --- properties ------------------------------------------------------------------------------


@st.composite
def validator_inputs(draw):
    x = draw(sequences_x())
    shape = tuple(x.shape) if torch.is_tensor(x) and x.dim() == 3 else (2, 3, 2)
    mask = draw(masks(shape[:2]))
    observed = None
    if draw(st.integers(0, 3)) == 0:
        per_element = draw(st.booleans())
        observed = draw(masks(shape if per_element else shape[:2], allow_prefix=False))
    D = shape[2]
    obs_dim = draw(st.sampled_from([None, None, D, D + 1]))
    return x, mask, obs_dim, draw(st.booleans()), draw(st.booleans()), observed


@given(validator_inputs())
def test_validate_sequences_accepts_or_names_a_real_problem(args):
    x, mask, obs_dim, binary, prefix_mask, observed = args
    problems = oracle(*args)
    try:
        out_x, out_mask = validate_sequences(x, mask, obs_dim, binary, prefix_mask, observed)
    except Exception as e:  # noqa: BLE001 - the property is about which exceptions escape
        assert problems, f"valid input refused: {type(e).__name__}: {e}"
        expect_documented(e, *(MESSAGES[p] for p in problems))
        return
    assert not problems, f"input with problems {problems} accepted"
    _check_accepted(x, mask, out_x, out_mask, binary, prefix_mask)


@given(validator_inputs())
def test_prepare_sequences_zero_fills_missing_and_never_returns_nan(args):
    x, mask, obs_dim, binary, _, observed = args
    problems = oracle(x, mask, obs_dim, binary, True, observed)
    try:
        out_x, out_mask, seen = prepare_sequences(x, mask, obs_dim, binary, observed)
    except Exception as e:  # noqa: BLE001
        assert problems, f"valid input refused: {type(e).__name__}: {e}"
        expect_documented(e, *(MESSAGES[p] for p in problems))
        return
    assert not problems, f"input with problems {problems} accepted"
    B, T, D = x.shape
    assert out_x.shape == x.shape and out_x.dtype == x.dtype
    assert bool(torch.isfinite(out_x).all()), "prepared x holds NaN/inf"
    _check_accepted(x, mask, x, out_mask, binary, True)
    if observed is None:
        assert seen is None and torch.equal(out_x, x)
    else:
        assert seen.dtype == torch.bool and tuple(seen.shape) == (B, T, D)
        assert bool((out_x[~seen] == 0).all()), "unobserved entries must be zeros"
        assert torch.equal(out_x[seen], x[seen]), "observed entries must be unchanged"
        if binary:
            real = seen & out_mask.unsqueeze(-1)
            assert bool(((out_x[real] == 0) | (out_x[real] == 1)).all())


@given(st.integers(0, 3), st.integers(0, 4), st.data())
def test_validate_mask(B, T, data):
    mask = data.draw(masks((B, T)))
    expected_shape_ok = mask is None or (torch.is_tensor(mask) and tuple(mask.shape) == (B, T))
    try:
        out = validate_mask(mask, (B, T))
    except Exception as e:  # noqa: BLE001
        expect_documented(e, MESSAGES["mask_type"], MESSAGES["mask_shape"], MESSAGES["mask_values"])
        assert not expected_shape_ok or (torch.is_tensor(mask) and _bad_values(mask)), str(e)
        return
    assert expected_shape_ok and (mask is None or not _bad_values(mask))
    assert out.dtype == torch.bool and tuple(out.shape) == (B, T)
    if mask is None:
        assert bool(out.all())
    else:
        assert torch.equal(out, mask.double() != 0)


@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.data())
def test_validate_observed(B, T, D, data):
    per_element = data.draw(st.booleans())
    observed = data.draw(masks((B, T, D) if per_element else (B, T), allow_prefix=False))
    ok_shape = observed is None or (
        torch.is_tensor(observed) and tuple(observed.shape) in ((B, T), (B, T, D))
    )
    try:
        out = validate_observed(observed, (B, T, D))
    except Exception as e:  # noqa: BLE001
        expect_documented(
            e, MESSAGES["observed_type"], MESSAGES["observed_shape"], MESSAGES["observed_values"]
        )
        assert not ok_shape or _bad_values(observed), str(e)
        return
    assert ok_shape
    if observed is None:
        assert out is None
        return
    assert not _bad_values(observed)
    assert out.dtype == torch.bool and tuple(out.shape) == (B, T, D)
    ref = observed.double() != 0
    assert torch.equal(out, ref.unsqueeze(-1).expand(B, T, D) if ref.dim() == 2 else ref)


ARRAY_LIKES = st.one_of(
    st.lists(st.sampled_from([0, 1, 0.0, 1.0, True, False, 0.5, 2, -1, NAN]), max_size=5),
    st.lists(st.lists(st.sampled_from([0, 1, 0.5]), min_size=0, max_size=3), max_size=3),
    st.sampled_from(
        [
            None,
            "mask",
            {"a": 1},
            object(),
            1,
            0,
            0.5,
            NAN,
            True,
            1 + 0j,
            b"\x01",
            np.array([0, 1]),
            np.array([0.5]),
            np.array(["1"]),
            (1, 0),
        ]
    ),
)


@st.composite
def any_tensor(draw):
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    dtype = draw(st.sampled_from(MASK_DTYPES + [torch.complex64, torch.bfloat16]))
    return draw(values_tensor(shape, dtype, [0.0, 1.0] * 4 + BAD_MASK_VALUES))


@given(st.one_of(any_tensor(), ARRAY_LIKES), st.booleans())
def test_as_bool_mask(mask, labelled):
    labels = (
        ("batch", "step", "feature")[: mask.dim()] if torch.is_tensor(mask) and labelled else None
    )
    try:
        out = as_bool_mask(mask, "m", labels)
    except Exception as e:  # noqa: BLE001
        expect_documented(e, r"\bm\b")
        return
    ref = torch.as_tensor(mask)
    assert out.dtype == torch.bool and out.shape == ref.shape
    assert not _bad_values(ref)
    assert torch.equal(out, ref != 0 if ref.dtype != torch.bool else ref)
