"""The Wiener-process prior (seed 002 sec. 3.3) against the dense Gaussian process GP(0, min(r, t)).

References are written independently of the module: dense covariance matrices, the Gaussian
log-density and the Gaussian KL of sec. 3.3 evaluated with explicit inverses and determinants.
"""

import math

import pytest
import torch
from torch.distributions import kl_divergence

from pyro_seq.distributions.wiener import (
    WienerProcess,
    kl_diagonal_normal_wiener,
    wiener_increments,
    wiener_transition,
)

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def min_kernel(T, var=1.0):
    t = torch.arange(1, T + 1, dtype=torch.float64)
    return var * torch.minimum(t.unsqueeze(-1), t.unsqueeze(0))


def dense_gaussian_logpdf(v, mean, cov):
    n = v.shape[-1]
    d = v - mean
    return (
        -0.5 * d @ torch.linalg.solve(cov, d)
        - 0.5 * torch.logdet(cov)
        - 0.5 * n * math.log(2 * math.pi)
    )


def dense_kl(mu_q, cov_q, mu_p, cov_p):
    """KL(q | p) of two Gaussians, the formula of sec. 3.3 with gamma = dimension."""
    n = mu_q.shape[-1]
    inv_p = torch.linalg.inv(cov_p)
    d = mu_p - mu_q
    return 0.5 * (
        torch.logdet(cov_p) - torch.logdet(cov_q) - n + torch.trace(inv_p @ cov_q) + d @ inv_p @ d
    )


def test_increments_are_the_difference_map():
    z = torch.tensor([[1.0, 2.0], [4.0, 3.0], [4.5, -1.0]])  # T=3, Z=2
    assert torch.equal(wiener_increments(z), torch.tensor([[1.0, 2.0], [3.0, 1.0], [0.5, -4.0]]))
    z0 = torch.tensor([0.5, -1.0])
    assert torch.equal(wiener_increments(z, z0)[0], torch.tensor([0.5, 3.0]))


@pytest.mark.parametrize("with_start", [False, True])
def test_log_prob_is_the_dense_gp_with_min_kernel(with_start):
    torch.manual_seed(0)
    T, Z = 6, 3
    scale = torch.tensor([1.0, 0.7, 1.9]) if with_start else 1.0
    z0 = torch.randn(2, Z) if with_start else torch.zeros(2, Z)
    p = WienerProcess(T, z0, scale)
    assert p.batch_shape == (2,) and p.event_shape == (T, Z)
    z = 2.0 * torch.randn(4, 2, T, Z)
    got = p.log_prob(z)
    assert got.shape == (4, 2)
    sig = torch.as_tensor(scale).expand(Z)
    for s in range(4):
        for b in range(2):
            expected = sum(
                dense_gaussian_logpdf(z[s, b, :, i], z0[b, i].expand(T), min_kernel(T, sig[i] ** 2))
                for i in range(Z)
            )
            assert abs(got[s, b] - expected) < 1e-10, (got[s, b], expected)


def test_per_step_transitions_multiply_to_the_process_density():
    # p(z_{1:T}) = prod_t N(z_t; z_{t-1}, I): Jacobian of g_W is 1
    torch.manual_seed(1)
    T, Z = 5, 2
    z = torch.randn(3, T, Z)
    z_prev = torch.zeros(3, Z)
    total = torch.zeros(3)
    for t in range(T):
        total = total + wiener_transition(z_prev).log_prob(z[:, t])
        z_prev = z[:, t]
    full = WienerProcess(T, torch.zeros(Z)).log_prob(z)
    assert torch.allclose(total, full, atol=1e-12, rtol=0)
    dense = torch.stack(
        [
            sum(dense_gaussian_logpdf(z[b, :, i], torch.zeros(T), min_kernel(T)) for i in range(Z))
            for b in range(3)
        ]
    )
    assert torch.allclose(total, dense, atol=1e-10, rtol=0)


def test_rsample_has_the_min_kernel_covariance():
    torch.manual_seed(2)
    T = 4
    p = WienerProcess(T, torch.tensor([0.5]), 1.5)
    z = p.rsample((40000,))[..., 0]  # (N, T)
    assert z.shape == (40000, T)
    emp = torch.cov(z.T)
    assert torch.allclose(emp, min_kernel(T, 1.5**2), atol=0.15), emp
    assert torch.allclose(z.mean(0), torch.full((T,), 0.5), atol=0.05)
    assert torch.allclose(p.variance[:, 0], torch.diagonal(min_kernel(T, 1.5**2)))


@pytest.mark.parametrize("with_start", [False, True])
def test_kl_via_difference_map_equals_dense_kl(with_start):
    torch.manual_seed(3)
    T, Z = 7, 3
    loc = torch.randn(2, T, Z)
    scale = 0.2 + torch.rand(2, T, Z)
    z0 = torch.randn(2, Z) if with_start else None
    sigma = torch.tensor([1.0, 0.5, 2.0]) if with_start else 1.0
    got = kl_diagonal_normal_wiener(loc, scale, z0, sigma)
    sig = torch.as_tensor(sigma).expand(Z)
    for b in range(2):
        expected = 0.0
        for i in range(Z):
            mu_p = (z0[b, i] if with_start else torch.tensor(0.0)).expand(T)
            expected = expected + dense_kl(
                loc[b, :, i], torch.diag(scale[b, :, i] ** 2), mu_p, min_kernel(T, sig[i] ** 2)
            )
        assert abs(got[b] - expected) < 1e-10, (got[b], expected)
    # the registered kl_divergence for Normal(loc, scale).to_event(2) gives the same numbers
    q = torch.distributions.Independent(torch.distributions.Normal(loc, scale), 2)
    p = WienerProcess(T, z0 if with_start else torch.zeros(Z), sigma)
    assert torch.allclose(kl_divergence(q, p), got, atol=1e-12, rtol=0)


def test_kl_mask_gives_the_prefix_kl():
    torch.manual_seed(4)
    T, Z, L = 6, 2, 4
    loc, scale = torch.randn(T, Z), 0.3 + torch.rand(T, Z)
    mask = torch.arange(T) < L
    masked = kl_diagonal_normal_wiener(loc, scale, mask=mask)
    expected = sum(
        dense_kl(loc[:L, i], torch.diag(scale[:L, i] ** 2), torch.zeros(L), min_kernel(L))
        for i in range(Z)
    )
    assert abs(masked - expected) < 1e-10


def test_kl_of_a_diagonal_q_at_the_prior_marginals_is_positive():
    # q = p is impossible for a diagonal q (p is correlated): KL > 0 even at matching marginals
    T = 5
    var = torch.diagonal(min_kernel(T)).unsqueeze(-1)
    kl = kl_diagonal_normal_wiener(torch.zeros(T, 1), var.sqrt())
    assert kl > 0.1


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="num_steps"):
        WienerProcess(0, torch.zeros(2))
    with pytest.raises(ValueError, match="scale"):
        WienerProcess(3, torch.zeros(2), -1.0)
    with pytest.raises(ValueError, match="scale"):
        wiener_transition(torch.zeros(2), 0.0)
    with pytest.raises(ValueError, match="z0"):
        WienerProcess(3, torch.tensor(0.0))
