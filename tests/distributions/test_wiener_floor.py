"""The KL floor of a step-wise independent Gaussian q(z_{1:T}) against the Wiener-process prior.

The unit random walk z_t = z_{t-1} + eps_t (z_0 = 0) has precision L^T L with L the difference
matrix: diagonal (2, ..., 2, 1), determinant 1. The mean-field minimum of KL(q || p) over
independent Gaussians is (1/2) sum_t log Lambda_tt - (1/2) log det Lambda = (T - 1) log(2) / 2,
reached at q_t = N(0, 1 / Lambda_tt). This is why STORN/VRAE with the Wiener prior and an
independent recognition model must keep z_dim small (documented in STORN).
"""

import math

import torch

from pyro_seq.distributions import kl_diagonal_normal_wiener


def test_mean_field_floor_is_reached_and_never_beaten():
    T, Z = 12, 3
    lam = torch.full((T,), 2.0, dtype=torch.float64)
    lam[-1] = 1.0
    scale = (1.0 / lam).sqrt().unsqueeze(-1).expand(T, Z)
    loc = torch.zeros(T, Z, dtype=torch.float64)
    floor = Z * (T - 1) * math.log(2.0) / 2
    kl = kl_diagonal_normal_wiener(loc, scale)
    assert abs(float(kl) - floor) <= 1e-10 * floor
    g = torch.Generator().manual_seed(0)
    for _ in range(200):  # any other independent Gaussian pays more
        other = kl_diagonal_normal_wiener(
            0.3 * torch.randn(T, Z, generator=g, dtype=torch.float64),
            scale * torch.exp(0.3 * torch.randn(T, Z, generator=g, dtype=torch.float64)),
        )
        assert float(other) > floor
