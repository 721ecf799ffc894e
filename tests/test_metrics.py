"""Tests of pyro_seq.metrics.capped_binomial_deviance against footnote 2 of Soyer and Möllenhoff."""

import math

import pytest
import torch

from pyro_seq.metrics import capped_binomial_deviance


def test_hand_computation():
    p = torch.tensor([0.9, 0.2, 0.5, 0.995, 0.001, 0.7], dtype=torch.float64)
    y = torch.tensor([1, 0, 1, 1, 1, 0])
    # clipped to [0.01, 0.99]: 0.995 -> 0.99, 0.001 -> 0.01 (a confident miss costs 2)
    by_hand = [
        -math.log10(0.9),
        -math.log10(1 - 0.2),
        -math.log10(0.5),
        -math.log10(0.99),
        -math.log10(0.01),
        -math.log10(1 - 0.7),
    ]
    expected = sum(by_hand) / 6
    got = capped_binomial_deviance(p, y)
    assert got.dtype == torch.float64 and got.shape == ()
    assert abs(float(got) - expected) < 1e-14
    terms = capped_binomial_deviance(p, y, reduction="none")
    torch.testing.assert_close(
        terms, torch.tensor(by_hand, dtype=torch.float64), rtol=1e-14, atol=0
    )
    # float32 predictions are scored too (their values carry ~1e-8 relative rounding)
    assert abs(float(capped_binomial_deviance(p.float(), y)) - expected) < 1e-7


def test_half_gives_log10_two():
    g = torch.Generator().manual_seed(0)
    for n in (1, 7, 1000):
        y = torch.randint(0, 2, (n,), generator=g)
        got = float(capped_binomial_deviance(torch.full((n,), 0.5), y))
        assert abs(got - math.log10(2)) < 1e-15
    assert abs(math.log10(2) - 0.30103) < 1e-5


def test_is_natural_log_deviance_over_ln10_inside_the_cap():
    """Inside [cap, 1 - cap] the CBD is the mean binary cross-entropy (natural log) / ln 10."""
    g = torch.Generator().manual_seed(1)
    p = torch.rand(500, generator=g, dtype=torch.float64) * 0.98 + 0.01
    y = torch.randint(0, 2, (500,), generator=g).double()
    bce = torch.nn.functional.binary_cross_entropy(p, y)
    torch.testing.assert_close(
        capped_binomial_deviance(p, y), bce / math.log(10), rtol=1e-12, atol=0
    )


def test_capping():
    y1, y0 = torch.tensor([1]), torch.tensor([0])
    for p, y, expected in [
        (0.0, y1, 2.0),
        (1.0, y0, 2.0),
        (0.0, y0, -math.log10(0.99)),
        (1.0, y1, -math.log10(0.99)),
        (0.005, y1, 2.0),
    ]:
        got = float(capped_binomial_deviance(torch.tensor([p], dtype=torch.float64), y))
        assert abs(got - expected) < 1e-14
    # any cap: one answer costs at most -log10(cap)
    p = torch.tensor([0.0, 1.0, 0.3], dtype=torch.float64)
    y = torch.tensor([1, 0, 1])
    terms = capped_binomial_deviance(p, y, cap=0.1, reduction="none")
    torch.testing.assert_close(
        terms, torch.tensor([1.0, 1.0, -math.log10(0.3)], dtype=torch.float64)
    )
    # cap = 0 is the plain deviance: a certain hit costs 0 (not NaN), a certain miss is infinite
    assert float(capped_binomial_deviance(torch.tensor([1.0]), y1, cap=0.0)) == 0.0
    assert math.isinf(float(capped_binomial_deviance(torch.tensor([1.0]), y0, cap=0.0)))


def test_targets_may_be_bool_or_float():
    p = torch.tensor([0.3, 0.6])
    ref = capped_binomial_deviance(p, torch.tensor([0, 1]))
    assert capped_binomial_deviance(p, torch.tensor([False, True])) == ref
    assert capped_binomial_deviance(p, torch.tensor([0.0, 1.0])) == ref


@pytest.mark.parametrize(
    "p, y, kwargs, match",
    [
        (torch.tensor([0.5, 0.5]), torch.tensor([1]), {}, "different lengths"),
        (torch.full((2, 2), 0.5), torch.ones(2, 2), {}, "1-D"),
        (torch.tensor([]), torch.tensor([]), {}, "empty"),
        (torch.tensor([0.5, 0.5]), torch.tensor([1, 2]), {}, "y must hold only 0 and 1"),
        (torch.tensor([0.5]), torch.tensor([0.5]), {}, "y must hold only 0 and 1"),
        (torch.tensor([0.5]), torch.tensor([float("nan")]), {}, "y must hold only 0 and 1"),
        (
            torch.tensor([0.5, 1.5]),
            torch.tensor([1, 0]),
            {},
            r"p must hold probabilities in \[0, 1\].*index 1",
        ),
        (torch.tensor([-0.1]), torch.tensor([1]), {}, "p must hold probabilities"),
        (torch.tensor([float("nan")]), torch.tensor([1]), {}, "NaN"),
        (torch.tensor([1]), torch.tensor([1]), {}, "floating"),
        (torch.tensor([0.5]), torch.tensor([1]), dict(cap=0.5), "cap"),
        (torch.tensor([0.5]), torch.tensor([1]), dict(cap=-0.01), "cap"),
        (torch.tensor([0.5]), torch.tensor([1]), dict(reduction="sum"), "reduction"),
    ],
)
def test_errors(p, y, kwargs, match):
    with pytest.raises(ValueError, match=match):
        capped_binomial_deviance(p, y, **kwargs)
