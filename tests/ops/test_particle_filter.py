import math

import pytest
import torch

from pyro_seq.ops.particle_filter import additive_gaussian, ancestral_paths, bootstrap_particle_filter
from tests.ops.test_nonlinear import dense_lgssm

DT = torch.float64


def lgssm(T=8, seed=0):
    """A small 2-state / 1-observation LGSSM with a known exact likelihood."""
    g = torch.Generator().manual_seed(seed)
    A = torch.tensor([[0.9, 0.2], [-0.1, 0.8]], dtype=DT)
    b = torch.zeros(T, 2, dtype=DT)
    Q = torch.tensor([[0.3, 0.05], [0.05, 0.2]], dtype=DT)
    C = torch.tensor([[1.0, 0.5]], dtype=DT)
    R = torch.tensor([[0.5]], dtype=DT)
    m0 = torch.tensor([0.5, -0.3], dtype=DT)
    P0 = torch.tensor([[1.0, 0.2], [0.2, 0.6]], dtype=DT)
    # simulate x from the model itself, so that the bootstrap weights are well behaved
    z = m0 + torch.linalg.cholesky(P0) @ torch.randn(2, generator=g, dtype=DT)
    xs = []
    for t in range(T):
        if t > 0:
            z = A @ z + torch.linalg.cholesky(Q) @ torch.randn(2, generator=g, dtype=DT)
        xs.append(C @ z + R.sqrt() @ torch.randn(1, generator=g, dtype=DT))
    return A, b, Q, C, R, m0, P0, torch.stack(xs)


def pf_args(A, Q, C, R, m0, P0):
    f = lambda z, t: z @ A.T  # noqa: E731
    h = lambda z, t: z @ C.T  # noqa: E731
    init = torch.distributions.MultivariateNormal(m0, covariance_matrix=P0)
    return init, additive_gaussian(f, Q), additive_gaussian(h, R)


@pytest.mark.parametrize(
    "threshold,scheme",
    [(1.0, "multinomial"), (0.5, "systematic"), (0.7, "stratified"), (0.0, "systematic")],
)
def test_likelihood_estimate_is_unbiased(threshold, scheme):
    """E[p-hat] = p(x) (eq. 3.20): the mean of p-hat / p over N independent runs (vectorized in a
    batch dim) lies within 3 standard errors of 1; and E[log p-hat] < log p (Jensen)."""
    T, K, N = 8, 16, 4000
    A, b, Q, C, R, m0, P0, x = lgssm(T)
    observed = torch.ones(T, dtype=torch.bool)
    observed[3] = False
    exact = dense_lgssm(A.expand(T, 2, 2), b, Q.expand(T, 2, 2), C, R, m0, P0, x, observed)["log_likelihoods"].sum()
    init, trans, obs = pf_args(A, Q, C, R, m0, P0)
    torch.manual_seed(0)
    xs = x.expand(N, T, 1).clone()
    xs[:, 3] = math.nan  # masked entries may be NaN
    res = bootstrap_particle_filter(
        xs, init, trans, obs, K, mask=observed.expand(N, T), resample_threshold=threshold,
        resampling_scheme=scheme, generator=torch.Generator().manual_seed(1),
    )
    assert res.log_likelihood.shape == (N,)
    assert torch.all(res.log_likelihood_increments[:, 3] == 0)
    ratio = (res.log_likelihood - exact).exp()
    se = ratio.std() / math.sqrt(N)
    assert abs(ratio.mean().item() - 1.0) < 3 * se.item(), (ratio.mean(), se)
    # the log of the estimate is biased low (Jensen): clearly below log p in this setting
    log_se = res.log_likelihood.std() / math.sqrt(N)
    assert res.log_likelihood.mean() < exact - 3 * log_se
    if threshold >= 1:
        assert res.resampled[:, 1:].all() and not res.resampled[:, 0].any()
    if threshold == 0:
        assert not res.resampled.any()
        assert torch.equal(res.ancestors, torch.arange(K).reshape(K, 1, 1).expand(K, N, T))


def test_filtered_means_match_kalman():
    """With many particles the weighted particle mean approaches the exact filtered mean; the
    Monte Carlo standard error is about sqrt(Var[z_t | x_{1:t}] / ESS_t)."""
    T, K = 8, 20000
    A, b, Q, C, R, m0, P0, x = lgssm(T, seed=3)
    ref = dense_lgssm(A.expand(T, 2, 2), b, Q.expand(T, 2, 2), C, R, m0, P0, x, torch.ones(T, dtype=torch.bool))
    init, trans, obs = pf_args(A, Q, C, R, m0, P0)
    torch.manual_seed(2)
    res = bootstrap_particle_filter(x, init, trans, obs, K, resample_threshold=0.5)
    assert res.particles.shape == (K, T, 2) and res.log_weights.shape == (K, T)
    assert torch.allclose(res.log_weights.logsumexp(0), torch.zeros(T, dtype=DT), atol=1e-10)
    se = (ref["filter_covs"].diagonal(dim1=-2, dim2=-1) / res.ess.unsqueeze(-1)).sqrt()
    assert torch.all((res.mean() - ref["filter_means"]).abs() < 5 * se)
    assert torch.all(res.ess <= K + 1e-6) and torch.all(res.ess >= 1 - 1e-6)


def test_adaptive_resampling_follows_ess():
    T, K, N = 10, 32, 50
    A, b, Q, C, R, m0, P0, x = lgssm(T, seed=4)
    init, trans, obs = pf_args(A, Q, C, R, m0, P0)
    torch.manual_seed(5)
    thr = 0.6
    res = bootstrap_particle_filter(x.expand(N, T, 1), init, trans, obs, K, resample_threshold=thr)
    expected = torch.zeros(N, T, dtype=torch.bool)
    expected[:, 1:] = res.ess[:, :-1] < thr * K
    assert torch.equal(res.resampled, expected)
    assert res.resampled.any() and not res.resampled[:, 1:].all()
    identity = torch.arange(K).reshape(K, 1).expand(K, N)
    for t in range(T):
        no = ~res.resampled[:, t]
        assert torch.equal(res.ancestors[:, no, t], identity[:, no])


def test_ancestral_paths():
    torch.manual_seed(0)
    K, B, T, S = 5, 3, 6, 2
    particles = torch.randn(K, B, T, S)
    ancestors = torch.randint(0, K, (K, B, T))
    paths = ancestral_paths(particles, ancestors)
    assert paths.shape == (K, B, T, S)
    for b in range(B):
        for k in range(K):
            i = k
            for t in range(T - 1, -1, -1):
                assert torch.equal(paths[k, b, t], particles[i, b, t])
                i = ancestors[i, b, t].item()


def test_gradient_flows_through_weights():
    T, K = 5, 64
    A, b, Q, C, R, m0, P0, x = lgssm(T, seed=6)
    Cp = C.clone().requires_grad_()
    init, trans, _ = pf_args(A, Q, C, R, m0, P0)
    obs = additive_gaussian(lambda z, t: z @ Cp.T, R)
    torch.manual_seed(0)
    res = bootstrap_particle_filter(x, init, trans, obs, K)
    (g,) = torch.autograd.grad(res.log_likelihood, Cp)
    assert torch.isfinite(g).all() and g.abs().sum() > 0
    assert res.ancestors.dtype == torch.long and not res.ancestors.requires_grad
