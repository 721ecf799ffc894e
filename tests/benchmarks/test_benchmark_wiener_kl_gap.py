"""The diagnostic of benchmarks/diagnostics/wiener_kl_gap.py: the amount by which reading the
g_W-mapped recognition Gaussian as diagonal under-states the KL from the Wiener prior."""

import math
import sys
from pathlib import Path

import torch

from pyro_seq.distributions.wiener import kl_diagonal_normal_wiener

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "diagnostics"))
sys.path.insert(1, str(ROOT / "benchmarks"))

import wiener_kl_gap  # noqa: E402


def _diagonal_reading_kl(loc, scale, mask):
    """KL from N(0, I) of the Gaussian of the increments z_t - z_{t-1} (z_0 = 0) with its
    off-diagonal covariances dropped: variances s_t^2 + s_{t-1}^2, means mu_t - mu_{t-1}."""
    var = scale**2
    var_prev = torch.cat([torch.zeros_like(var[:, :1]), var[:, :-1]], 1)
    m = loc - torch.cat([torch.zeros_like(loc[:, :1]), loc[:, :-1]], 1)
    v = var + var_prev
    terms = 0.5 * (v + m**2 - 1.0 - torch.log(v)).sum(-1)
    return terms.masked_fill(~mask, 0.0).sum(-1)


def test_gap_is_the_exact_kl_minus_the_diagonal_reading():
    g = torch.Generator().manual_seed(0)
    loc = torch.randn(3, 7, 4, generator=g, dtype=torch.float64)
    scale = 0.1 + torch.rand(3, 7, 4, generator=g, dtype=torch.float64)
    mask = torch.arange(7).expand(3, 7) < torch.tensor([[7], [5], [1]])
    exact = kl_diagonal_normal_wiener(loc, scale, mask=mask)
    gap = wiener_kl_gap.diagonal_reading_gap(scale, mask)
    assert torch.allclose(exact - _diagonal_reading_kl(loc, scale, mask), gap, rtol=0, atol=1e-12)
    assert gap[2] == 0.0  # one step: no neighbour, nothing dropped
    # equal scales: half log 2 per step after the first and per dimension
    flat = wiener_kl_gap.diagonal_reading_gap(torch.full((1, 7, 4), 0.3), mask[:1])
    assert math.isclose(float(flat), 6 * 4 * 0.5 * math.log(2), rel_tol=1e-6)
