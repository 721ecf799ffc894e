"""LinearGaussianSSM against the dense float64 Gaussian of tests/dense_gaussian.py."""

import pyro
import pyro.distributions as pdist
import pytest
import torch
from pyro import poutine

from pyro_seq.distributions import LinearGaussianSSM
from pyro_seq.ops import kalman_smoother
from tests.dense_gaussian import (
    block,
    condition_x,
    condition_z,
    dense_lgssm,
    log_marginal,
    observed_index,
)
from tests.ops.test_kalman import dense_of, element, observations, random_model

F64 = torch.float64


def assert_close(a, b, atol=1e-9, rtol=1e-9):
    torch.testing.assert_close(a, b.to(a.dtype), atol=atol, rtol=rtol)


def make(p, **kw):
    return LinearGaussianSSM(
        p["initial_loc"],
        p["initial_cov"],
        p["transition_matrix"],
        p["transition_cov"],
        p["observation_matrix"],
        p["observation_cov"],
        p.get("control_matrix"),
        p.get("controls"),
        **kw,
    )


@pytest.mark.parametrize("time_varying,controls", [(False, False), (True, True)])
def test_log_prob_matches_dense(time_varying, controls):
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, time_varying=time_varying, controls=controls, seed=30)
    d = make(p, num_steps=T)
    assert d.event_shape == (T, D) and d.batch_shape == ()
    x = observations(T, D, batch=(4,), seed=31)
    lp = d.log_prob(x)
    assert lp.shape == (4,)
    dense = dense_of(p, T)
    for i in range(4):
        assert_close(lp[i], log_marginal(dense, x[i], observed_index(dense)))


def test_batched_parameters_and_expand():
    T, S, D = 5, 2, 2
    p = random_model(S, D, T, batch=(3,), time_varying=True, controls=True, seed=32)
    d = make(p)
    assert d.batch_shape == (3,) and d.event_shape == (T, D)
    e = d.expand((2, 3))
    assert e.batch_shape == (2, 3)
    x = observations(T, D, batch=(2, 3), seed=33)
    lp = e.log_prob(x)
    assert lp.shape == (2, 3)
    assert e.log_prob(x[0, 0]).shape == (2, 3)  # unbatched data broadcasts to the batch
    for i in range(2):
        for j in range(3):
            dense = dense_of(element(p, (j,), (3,)), T)
            assert_close(lp[i, j], log_marginal(dense, x[i, j], observed_index(dense)))
    assert e.rsample((4,)).shape == (4, 2, 3, T, D)
    assert e.smooth(x[0]).covs.shape == (2, 3, T, S, S)
    assert e.sample_posterior(x, (7,)).shape == (7, 2, 3, T, S)


def test_homogeneous_any_length():
    S, D = 2, 3
    p = random_model(S, D, 1, seed=34)
    d = make(p)
    assert d.event_shape == (1, D)
    for T in (1, 4, 9):
        x = observations(T, D, seed=T)
        dense = dense_of(p, T)
        assert_close(d.log_prob(x), log_marginal(dense, x, observed_index(dense)))
    with pytest.raises(ValueError, match="num_steps"):
        d.rsample()


@pytest.mark.parametrize("kind", ["step", "element"])
def test_observation_mask_equals_deleting_rows(kind):
    T, S, D = 6, 3, 3
    p = random_model(S, D, T, time_varying=True, seed=35)
    gen = torch.Generator().manual_seed(36)
    if kind == "step":
        mask = torch.rand(2, T, generator=gen) < 0.6
        elem = mask[..., None].expand(2, T, D)
        kw = dict(step_mask=mask)
    else:
        mask = torch.rand(2, T, D, generator=gen) < 0.6
        elem = mask
        kw = dict(observation_mask=mask)
    x = observations(T, D, batch=(2,), seed=37).masked_fill(~elem, float("nan"))
    d = make(p, validate_args=True, **kw)
    assert d.batch_shape == (2,)
    lp = d.log_prob(x)
    s = d.smooth(x)
    dense = dense_of(p, T)
    for i in range(2):
        idx = observed_index(dense, mask[i])
        assert_close(lp[i], log_marginal(dense, x[i], idx))
        mean, cov = condition_z(dense, x[i], idx)
        assert_close(s.means[i], mean)
        assert_close(s.covs[i, 2], block(cov, S, 2, 2))
    # gradient of the masked log-likelihood agrees with the dense reference
    C = p["observation_matrix"].clone().requires_grad_()
    g = torch.autograd.grad(make({**p, "observation_matrix": C}, **kw).log_prob(x).sum(), C)[0]
    C2 = C.detach().clone().requires_grad_()
    ref = sum(
        log_marginal(
            dense_of({**p, "observation_matrix": C2}, T), x[i], observed_index(dense, mask[i])
        )
        for i in range(2)
    )
    g_ref = torch.autograd.grad(ref, C2)[0]
    assert_close(g, g_ref)


def test_filter_and_smooth_match_dense():
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, time_varying=True, controls=True, seed=38)
    d = make(p)
    x = observations(T, D, seed=39)
    f, s = d.filter(x), d.smooth(x)
    dense = dense_of(p, T)
    for t in range(T):
        mean, cov = condition_z(dense, x, observed_index(dense, upto=t + 1))
        assert_close(f.means[t], mean[t])
        assert_close(f.covs[t], block(cov, S, t, t))
    mean, cov = condition_z(dense, x, observed_index(dense))
    assert_close(s.means, mean)
    assert_close(s.cross_covs[3], block(cov, S, 4, 3))
    assert f.log_likelihoods.shape == (T,)


def test_rsample_joint_moments():
    T, S, D, N = 3, 2, 2, 20000
    p = random_model(S, D, T, time_varying=True, controls=True, seed=40)
    d = make(p)
    torch.manual_seed(1)
    z, x = d.rsample_with_states((N,))
    assert z.shape == (N, T, S) and x.shape == (N, T, D)
    dense = dense_of(p, T)
    v = torch.cat([z.reshape(N, -1), x.reshape(N, -1)], -1)
    mean = torch.cat([dense.mean_z, dense.mean_x])
    cov = torch.cat(
        [torch.cat([dense.cov_zz, dense.cov_xz.T], 1), torch.cat([dense.cov_xz, dense.cov_xx], 1)],
        0,
    )
    var = cov.diagonal()
    # sample mean SE sqrt(var/N); sample covariance SE sqrt((S_ii S_jj + S_ij^2)/N) for
    # Gaussians; 5 SE per entry: 12 means + 78 distinct covariances, family-wise false-alarm
    # probability < 1e-4 under the normal approximation
    assert ((v.mean(0) - mean).abs() <= 5 * (var / N).sqrt()).all()
    se = ((var[:, None] * var[None, :] + cov**2) / N).sqrt()
    assert ((torch.cov(v.T) - cov).abs() <= 5 * se).all()


def test_rsample_is_reparameterized():
    T, S, D, N = 4, 2, 2, 5
    p = random_model(S, D, T, seed=41)
    m0 = p["initial_loc"].clone().requires_grad_()
    x = make({**p, "initial_loc": m0}, num_steps=T).rsample((N,))
    g = torch.autograd.grad(x.sum(), m0)[0]
    # x is affine in mu_{1|0} with coefficient d E[x] / d mu_{1|0} = C_b G[:, :S] (dense)
    m1 = m0.detach().clone().requires_grad_()
    dense = dense_lgssm(
        m1,
        p["initial_cov"],
        p["transition_matrix"],
        p["transition_cov"],
        p["observation_matrix"],
        p["observation_cov"],
        T,
    )
    g_ref = torch.autograd.grad(N * dense.mean_x.sum(), m1)[0]
    assert_close(g, g_ref)


def test_sample_posterior_moments_and_noise():
    T, S, D, N = 4, 2, 2, 20000
    p = random_model(S, D, T, seed=42)
    d = make(p)
    x = observations(T, D, seed=43)
    torch.manual_seed(2)
    z = d.sample_posterior(x, (N,)).reshape(N, -1)
    dense = dense_of(p, T)
    mean, cov = condition_z(dense, x, observed_index(dense))
    var = cov.diagonal()
    # SEs as in test_rsample_joint_moments; 8 means + 36 covariances at 5 SE
    assert ((z.mean(0) - mean.reshape(-1)).abs() <= 5 * (var / N).sqrt()).all()
    se = ((var[:, None] * var[None, :] + cov**2) / N).sqrt()
    assert ((torch.cov(z.T) - cov).abs() <= 5 * se).all()
    zero = d.sample_posterior(x, noise=torch.zeros(T, S, dtype=F64))
    assert_close(zero, mean, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("time_varying", [False, True])
def test_predict_matches_dense(time_varying):
    T_obs, steps, S, D = 5, 3, 3, 2
    T = T_obs + steps
    p = random_model(S, D, T, time_varying=time_varying, controls=time_varying, seed=44)
    d = make(p, num_steps=T)
    x_full = observations(T, D, seed=45)
    x = x_full[:T_obs]
    mask = torch.ones(T_obs, D, dtype=torch.bool)
    mask[1, 0] = False
    fc = d.predict(x, steps, observation_mask=mask)
    assert fc.means.shape == (steps, D) and fc.covs.shape == (steps, D, D)
    dense = dense_of(p, T)
    full_mask = torch.cat([mask, torch.zeros(steps, D, dtype=torch.bool)])
    idx = observed_index(dense, full_mask)
    for k in range(steps):
        target = torch.arange((T_obs + k) * D, (T_obs + k + 1) * D)
        mean, cov = condition_x(dense, x_full, idx, target)
        assert_close(fc.means[k], mean)
        assert_close(fc.covs[k], cov)
    mean_z, cov_z = condition_z(dense, x_full, idx)
    assert_close(fc.state_means, mean_z[T_obs:])
    assert_close(fc.state_covs[-1], block(cov_z, S, T - 1, T - 1))


def test_in_pyro_model_with_plate():
    T, S, D, B = 5, 2, 2, 4
    p = random_model(S, D, T, seed=46)
    x = observations(T, D, batch=(B,), seed=47)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 2:4] = False
    dense = dense_of(p, T)
    expected = torch.stack(
        [log_marginal(dense, x[i], observed_index(dense, mask[i])) for i in range(B)]
    )

    def model(x, mask):
        R_scale = pyro.param(
            "R_scale", torch.tensor(1.0, dtype=F64), constraint=pdist.constraints.positive
        )
        q = {**p, "observation_cov": R_scale * p["observation_cov"]}
        with pyro.plate("sequences", x.shape[0]):
            pyro.sample("x", make(q, step_mask=mask), obs=x)

    tr = poutine.trace(model).get_trace(x, mask)
    tr.compute_log_prob()
    assert_close(tr.nodes["x"]["log_prob"], expected)
    # with no latent sites the ELBO is the exact log-likelihood; SVI's first loss equals it
    svi = pyro.infer.SVI(
        model, lambda x, mask: None, pyro.optim.Adam({"lr": 0.05}), pyro.infer.Trace_ELBO()
    )
    loss0 = svi.step(x, mask)
    assert abs(loss0 + expected.sum().item()) < 1e-8
    losses = [svi.step(x, mask) for _ in range(20)]
    assert losses[-1] < loss0  # maximum likelihood on the noise scale improves the fit

    # a latent global parameter with the LGSSM as likelihood: Trace_ELBO gradients are finite
    def model2(x):
        a = pyro.sample("a", pdist.Normal(torch.tensor(0.5, dtype=F64), 0.1))
        q = {**p, "transition_matrix": a * torch.eye(S, dtype=F64)}
        with pyro.plate("sequences", x.shape[0]):
            pyro.sample("x", make(q), obs=x)

    guide = pyro.infer.autoguide.AutoNormal(model2)
    svi2 = pyro.infer.SVI(model2, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
    assert torch.isfinite(torch.tensor(svi2.step(x)))


def test_validation_errors():
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, seed=48)
    with pytest.raises(ValueError, match="initial_cov is not positive semi-definite"):
        make({**p, "initial_cov": -torch.eye(S, dtype=F64)}, num_steps=T, validate_args=True)
    d = make(p, num_steps=T, validate_args=True)
    with pytest.raises(ValueError, match="expected 4 time steps, got 5"):
        d.log_prob(observations(T + 1, D))
    with pytest.raises(ValueError, match=r"expected observations of shape \(\.\.\., T, 2\)"):
        d.log_prob(observations(T, D + 1))
    with pytest.raises(ValueError, match="8 NaN value.*observation_mask"):
        d.log_prob(observations(T, D).masked_fill(torch.ones(T, D, dtype=torch.bool), float("nan")))


def test_distribution_smooth_equals_ops():
    T, S, D = 40, 3, 2
    p = random_model(S, D, T, seed=49)
    x = observations(T, D, batch=(2,), seed=50)
    ops = kalman_smoother(x, **p, method="sequential")
    for method in ("sequential", "parallel", "auto"):
        s = make(p, num_steps=T, method=method).smooth(x)
        assert_close(s.means, ops.means, atol=1e-10, rtol=1e-10)
        assert_close(s.cross_covs, ops.cross_covs, atol=1e-10, rtol=1e-10)


def test_from_scale_tril_equals_covariance_form_and_is_differentiable():
    torch.manual_seed(3)
    S, D, T = 3, 2, 6
    tril = lambda n: (
        torch.randn(n, n, dtype=torch.float64).tril() + 2 * torch.eye(n, dtype=torch.float64)
    )
    L0, Lq, Lr = tril(S).requires_grad_(), tril(S), tril(D)
    A = 0.5 * torch.randn(S, S, dtype=torch.float64)
    C = torch.randn(D, S, dtype=torch.float64)
    m0 = torch.randn(S, dtype=torch.float64)
    x = torch.randn(T, D, dtype=torch.float64)
    a = LinearGaussianSSM.from_scale_tril(m0, L0, A, Lq, C, Lr, num_steps=T)
    b = LinearGaussianSSM(m0, L0 @ L0.T, A, Lq @ Lq.T, C, Lr @ Lr.T, num_steps=T)
    assert_close(a.log_prob(x), b.log_prob(x))
    a.log_prob(x).backward()
    assert L0.grad is not None and torch.isfinite(L0.grad).all()
