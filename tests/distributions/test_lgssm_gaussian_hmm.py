"""LinearGaussianSSM for GaussianHMM users: from_gaussian_hmm against Pyro's own GaussianHMM,
rsample_posterior, and observation offsets d_t against the dense float64 reference."""

import pyro.distributions as pdist
import pytest
import torch

from pyro_seq.distributions import LinearGaussianSSM
from tests.dense_gaussian import block, condition_x, condition_z, log_marginal, observed_index
from tests.ops.test_kalman import dense_of, observations, random_model

F64 = torch.float64


def assert_close(a, b, tol=1e-9):  # exact identities in float64: <= 1e-9 relative
    torch.testing.assert_close(a, b.to(a.dtype), atol=tol, rtol=tol)


def _spd(gen, shape, n):
    W = torch.randn(shape + (n, n), generator=gen, dtype=F64)
    return 0.3 * W @ W.mT / n + 0.3 * torch.eye(n, dtype=F64)


def random_hmm(S=3, D=2, T=5, batch=(2,), homogeneous=False, diagonal_obs=False, seed=0):
    """A GaussianHMM with batched initial state, time-varying (or homogeneous) transitions and
    observations, non-zero transition and observation offsets (row-vector convention)."""
    gen = torch.Generator().manual_seed(seed)
    tt = (1,) if homogeneous else (T,)
    init = pdist.MultivariateNormal(
        torch.randn(batch + (S,), generator=gen, dtype=F64), _spd(gen, batch, S)
    )
    M = 0.5 * torch.randn(batch + tt + (S, S), generator=gen, dtype=F64)
    trans = pdist.MultivariateNormal(
        torch.randn(tt + (S,), generator=gen, dtype=F64), _spd(gen, tt, S)
    )
    H = torch.randn(tt + (S, D), generator=gen, dtype=F64)
    loc = torch.randn(tt + (D,), generator=gen, dtype=F64)
    if diagonal_obs:
        obs = pdist.Normal(loc, 0.5 + torch.rand(tt + (D,), generator=gen, dtype=F64)).to_event(1)
    else:
        obs = pdist.MultivariateNormal(loc, _spd(gen, tt, D))
    return pdist.GaussianHMM(init, M, trans, H, obs, duration=None if homogeneous else T)


@pytest.mark.parametrize("diagonal_obs", [False, True])
def test_from_gaussian_hmm_log_prob_and_filter_equal_pyro(diagonal_obs):
    T, S, D = 5, 3, 2
    hmm = random_hmm(S, D, T, diagonal_obs=diagonal_obs, seed=90)
    d = LinearGaussianSSM.from_gaussian_hmm(hmm)
    assert d.batch_shape == hmm.batch_shape == (2,) and d.event_shape == hmm.event_shape
    x = observations(T, D, batch=(4, 2), seed=91)
    assert_close(d.log_prob(x), hmm.log_prob(x))
    # GaussianHMM.filter is p(z_T | x_{1:T}); ours gives every step
    f, post = d.filter(x), hmm.filter(x)
    assert_close(f.means[..., -1, :], post.loc)
    assert_close(f.covs[..., -1, :, :], post.covariance_matrix)


def test_homogeneous_hmm_filter_at_every_prefix():
    S, D = 2, 3
    hmm = random_hmm(S, D, batch=(), homogeneous=True, seed=92)
    d = LinearGaussianSSM.from_gaussian_hmm(hmm)
    assert d.num_steps is None and d.event_shape == (1, D)
    x = observations(6, D, seed=93)
    f = d.filter(x)
    for t in range(1, 7):  # any length, as for GaussianHMM
        post = hmm.filter(x[:t])
        assert_close(f.means[t - 1], post.loc)
        assert_close(f.covs[t - 1], post.covariance_matrix)
        assert_close(d.log_prob(x[:t]), hmm.log_prob(x[:t]))


def test_rsample_posterior_matches_gaussian_hmm_posterior():
    T, S, D, N = 4, 2, 2, 20000
    hmm = random_hmm(S, D, T, batch=(), seed=94)
    d = LinearGaussianSSM.from_gaussian_hmm(hmm)
    x = observations(T, D, seed=95)
    s = d.smooth(x)
    # shapes follow GaussianHMM.rsample_posterior: sample_shape + batch + (T, S)
    assert d.rsample_posterior(x, (7,)).shape == hmm.rsample_posterior(x, (7,)).shape == (7, T, S)
    xb = observations(T, D, batch=(3,), seed=96)
    assert d.rsample_posterior(xb, (5,)).shape == hmm.rsample_posterior(xb, (5,)).shape
    # with zero noise the draw is the posterior mean (FFBS is affine in the noise)
    assert_close(d.rsample_posterior(x, noise=torch.zeros(T, S, dtype=F64)), s.means, 1e-12)
    # Pyro's own posterior draws have our smoothed moments: SE sqrt(var / N) for means,
    # sqrt((v_i v_j + c_ij^2) / N) for covariances; 8 means + 36 covariances at 5 SE
    torch.manual_seed(5)
    z = hmm.rsample_posterior(x, (N,)).reshape(N, -1)
    mean = s.means.reshape(-1)
    cov = torch.zeros(T * S, T * S, dtype=F64)
    for t in range(T):
        cov[t * S : (t + 1) * S, t * S : (t + 1) * S] = s.covs[t]
        if t + 1 < T:
            cov[(t + 1) * S : (t + 2) * S, t * S : (t + 1) * S] = s.cross_covs[t]
            cov[t * S : (t + 1) * S, (t + 1) * S : (t + 2) * S] = s.cross_covs[t].T
    var = cov.diagonal()
    assert ((z.mean(0) - mean).abs() <= 5 * (var / N).sqrt()).all()
    near = torch.zeros_like(cov, dtype=torch.bool)  # blocks |t - s| <= 1 are known exactly
    for t in range(T):
        near[max(t - 1, 0) * S : min(t + 2, T) * S, t * S : (t + 1) * S] = True
    se = ((var[:, None] * var[None, :] + cov**2) / N).sqrt()
    assert ((torch.cov(z.T) - cov).abs() <= 5 * se)[near].all()


def test_from_gaussian_hmm_refuses_other_objects():
    with pytest.raises(ValueError, match="expects a pyro GaussianHMM, got Normal"):
        LinearGaussianSSM.from_gaussian_hmm(pdist.Normal(0.0, 1.0))


# ----------------------------------------------------------------- observation offsets


def dense_with_offset(p, T, d):
    """Dense joint of the model x_t = C_t z_t + d_t + delta_t: the offset shifts mean_x."""
    dense = dense_of(p, T)
    return dense._replace(mean_x=dense.mean_x + d.expand(T, -1).reshape(-1))


def test_observation_offset_matches_dense():
    T_obs, steps, S, D = 5, 2, 3, 2
    T = T_obs + steps
    p = random_model(S, D, T, time_varying=True, controls=True, seed=97)
    off = torch.randn(T, D, generator=torch.Generator().manual_seed(98), dtype=F64)
    args = [
        p[k]
        for k in (
            "initial_loc",
            "initial_cov",
            "transition_matrix",
            "transition_cov",
            "observation_matrix",
            "observation_cov",
            "control_matrix",
            "controls",
        )
    ]
    d = LinearGaussianSSM(*args, observation_offset=off)
    assert d.num_steps == T
    dense = dense_with_offset(p, T, off)
    x = observations(T, D, batch=(2,), seed=99)
    mask = torch.ones(T, D, dtype=torch.bool)
    mask[2, 1] = False
    lp = LinearGaussianSSM(*args, observation_offset=off, observation_mask=mask).log_prob(x)
    s = d.smooth(x)
    for i in range(2):
        assert_close(lp[i], log_marginal(dense, x[i], observed_index(dense, mask)))
        mean, cov = condition_z(dense, x[i], observed_index(dense))
        assert_close(s.means[i], mean)
        assert_close(s.covs[i, 3], block(cov, S, 3, 3))
    # forecasts add d_{T+k}
    fc = d.predict(x[0, :T_obs], steps)
    idx = observed_index(dense, upto=T_obs)
    for k in range(steps):
        target = torch.arange((T_obs + k) * D, (T_obs + k + 1) * D)
        mean, cov = condition_x(dense, x[0], idx, target)
        assert_close(fc.means[k], mean)
        assert_close(fc.covs[k], cov)
    # time-constant offsets, (D,) or (1, D), equal the expanded one
    c = off[0]
    x1 = x[0]
    ref = LinearGaussianSSM(*args, observation_offset=c.expand(T, D)).log_prob(x1)
    assert_close(LinearGaussianSSM(*args, observation_offset=c).log_prob(x1), ref)
    assert_close(LinearGaussianSSM(*args, observation_offset=c[None]).log_prob(x1), ref)


def test_observation_offset_shifts_samples():
    T, S, D, N = 3, 2, 2, 20000
    p = random_model(S, D, T, time_varying=True, seed=100)
    off = torch.tensor([[5.0, -3.0], [0.0, 1.0], [-2.0, 2.0]], dtype=F64)
    args = [
        p[k]
        for k in (
            "initial_loc",
            "initial_cov",
            "transition_matrix",
            "transition_cov",
            "observation_matrix",
            "observation_cov",
        )
    ]
    torch.manual_seed(6)
    x = LinearGaussianSSM(*args, observation_offset=off).rsample((N,)).reshape(N, -1)
    dense = dense_with_offset(p, T, off)
    # sample mean within 5 SE (sqrt(var / N)) of mean_x + d for each of the 6 entries
    assert ((x.mean(0) - dense.mean_x).abs() <= 5 * (dense.cov_xx.diagonal() / N).sqrt()).all()
