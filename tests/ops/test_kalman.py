"""Kalman filter / RTS smoother / FFBS against the dense float64 Gaussian of tests/dense_gaussian.py."""

import pytest
import torch

from pyro_seq.ops import kalman_filter, kalman_sample, kalman_smoother, psd_sqrt
from tests.dense_gaussian import (
    block,
    condition_z,
    dense_lgssm,
    log_marginal,
    observed_index,
)

METHODS = ["sequential", "parallel"]
F64 = torch.float64


def _spd(gen, shape, n, scale=0.3, jitter=0.2):
    W = torch.randn(shape + (n, n), generator=gen, dtype=F64)
    return scale * W @ W.mT / n + jitter * torch.eye(n, dtype=F64)


def random_model(S=3, D=2, T=5, batch=(), time_varying=False, controls=False, seed=0):
    """Random stable LGSSM as a dict of ops arguments. Batched parameters carry a time dim
    (size T if time_varying else 1) so that batch dims are unambiguous."""
    gen = torch.Generator().manual_seed(seed)
    tshape = (T,) if time_varying else ((1,) if batch else ())
    A = 0.9 * torch.linalg.qr(torch.randn(batch + tshape + (S, S), generator=gen, dtype=F64))[0]
    A = A * (0.5 + 0.5 * torch.rand(batch + tshape + (1, S), generator=gen, dtype=F64))
    p = dict(
        initial_loc=torch.randn(batch + (S,), generator=gen, dtype=F64),
        initial_cov=_spd(gen, batch, S, 1.0, 0.5),
        transition_matrix=A,
        transition_cov=_spd(gen, batch + tshape, S),
        observation_matrix=torch.randn(batch + tshape + (D, S), generator=gen, dtype=F64),
        observation_cov=_spd(gen, batch + tshape, D),
    )
    if controls:
        U = 2
        p["control_matrix"] = torch.randn(batch + tshape + (S, U), generator=gen, dtype=F64)
        p["controls"] = torch.randn(batch + (T, U), generator=gen, dtype=F64)
    return p


def observations(T, D, batch=(), seed=1):
    return torch.randn(batch + (T, D), generator=torch.Generator().manual_seed(seed), dtype=F64)


def element(p, idx, batch):
    """Parameters of batch element ``idx`` (a tuple), with time dims expanded to T."""
    out = {}
    for k, v in p.items():
        if v is None:
            continue
        event = {"initial_loc": 1, "controls": 2}.get(k, 2)
        if v.dim() > event:
            if k in ("initial_loc", "initial_cov"):
                v = v.expand(batch + v.shape[v.dim() - event :])
            else:
                nb = v.dim() - event - (0 if k == "controls" else 1)
                shape = batch + v.shape[nb:]
                v = v.reshape((1,) * (len(batch) - nb) + v.shape).expand(shape)
            v = v[idx]
        out[k] = v
    return out


def dense_of(p, T):
    A, Q = p["transition_matrix"], p["transition_cov"]
    offsets = None
    if "controls" in p:
        B = p["control_matrix"]
        if B.dim() == 2:
            B = B.unsqueeze(0)
        offsets = (B @ p["controls"].unsqueeze(-1)).squeeze(-1).expand(T, -1)
    return dense_lgssm(
        p["initial_loc"],
        p["initial_cov"],
        A,
        Q,
        p["observation_matrix"],
        p["observation_cov"],
        T,
        offsets,
    )


def assert_close(a, b, atol=1e-9, rtol=1e-9):
    torch.testing.assert_close(a, b.to(a.dtype), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("time_varying,controls", [(False, False), (True, True)])
def test_filter_matches_dense_prefix_conditioning(method, time_varying, controls):
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, time_varying=time_varying, controls=controls)
    x = observations(T, D)
    f = kalman_filter(x, **p, method=method)
    dense = dense_of(p, T)
    for t in range(T):
        # filtered p(z_t | x_{1:t}) and predicted p(z_t | x_{1:t-1}) by conditioning on a prefix
        mean, cov = condition_z(dense, x, observed_index(dense, upto=t + 1))
        assert_close(f.means[t], mean[t])
        assert_close(f.covs[t], block(cov, S, t, t))
        mean, cov = condition_z(dense, x, observed_index(dense, upto=t))
        assert_close(f.predicted_means[t], mean[t])
        assert_close(f.predicted_covs[t], block(cov, S, t, t))
        # log p(x_t | x_{1:t-1}) = log p(x_{1:t}) - log p(x_{1:t-1})  (eq. 3.12)
        expected = log_marginal(dense, x, observed_index(dense, upto=t + 1)) - log_marginal(
            dense, x, observed_index(dense, upto=t)
        )
        assert_close(f.log_likelihoods[t], expected)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("time_varying,controls", [(False, False), (True, True)])
def test_smoother_matches_dense(method, time_varying, controls):
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, time_varying=time_varying, controls=controls, seed=3)
    x = observations(T, D, seed=4)
    s = kalman_smoother(x, **p, method=method)
    dense = dense_of(p, T)
    mean, cov = condition_z(dense, x, observed_index(dense))
    assert_close(s.means, mean)
    for t in range(T):
        assert_close(s.covs[t], block(cov, S, t, t))
    for t in range(T - 1):
        assert_close(s.cross_covs[t], block(cov, S, t + 1, t))  # Cov(z_{t+1}, z_t | x)
    assert_close(s.filtered.log_likelihoods.sum(), log_marginal(dense, x, observed_index(dense)))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["step", "element", "element_last1"])
def test_masks_equal_deleting_rows(method, kind):
    T, S, D = 6, 3, 3
    p = random_model(S, D, T, time_varying=True, seed=5)
    x = observations(T, D, seed=6)
    gen = torch.Generator().manual_seed(7)
    if kind == "step":
        mask = torch.tensor([True, False, True, False, False, True])
    elif kind == "element":
        mask = torch.rand(T, D, generator=gen) < 0.5
        mask[2] = False  # one fully missing step
        mask[0, 0] = True
    else:
        mask = torch.tensor([True, False, False, True, True, False]).unsqueeze(-1)  # (T, 1)
    x = x.masked_fill(~(mask if mask.dim() == 2 else mask[:, None]).expand(T, D), float("nan"))
    s = kalman_smoother(x, **p, mask=mask, method=method)
    f = s.filtered
    dense = dense_of(p, T)
    dm = mask if kind != "element_last1" else mask[:, 0]
    for t in range(T):
        mean, cov = condition_z(dense, x, observed_index(dense, dm, upto=t + 1))
        assert_close(f.means[t], mean[t])
        assert_close(f.covs[t], block(cov, S, t, t))
    mean, cov = condition_z(dense, x, observed_index(dense, dm))
    assert_close(s.means, mean)
    for t in range(T):
        assert_close(s.covs[t], block(cov, S, t, t))
    for t in range(T - 1):
        assert_close(s.cross_covs[t], block(cov, S, t + 1, t))
    assert_close(f.log_likelihoods.sum(), log_marginal(dense, x, observed_index(dense, dm)))
    # a fully missing step contributes nothing and propagates the prediction (thesis 3.4.2)
    missing = ~(dm if dm.dim() == 2 else dm[:, None]).any(-1)
    assert missing.any()
    assert torch.all(f.log_likelihoods[missing] == 0)
    assert_close(f.means[missing], f.predicted_means[missing], atol=1e-13, rtol=1e-13)
    assert_close(f.covs[missing], f.predicted_covs[missing], atol=1e-13, rtol=1e-13)
    assert torch.isfinite(s.means).all()


@pytest.mark.parametrize("method", METHODS)
def test_batched_time_varying_broadcasting(method):
    T, S, D = 5, 2, 2
    batch = (2, 1)
    p = random_model(S, D, T, batch=batch, time_varying=True, controls=True, seed=8)
    p["initial_loc"] = p["initial_loc"][:1, 0]  # batch (1,) broadcasts against (2, 1)
    x = observations(T, D, batch=(3,), seed=9)  # broadcasts to (2, 3)
    mask = torch.ones(2, 1, T, D, dtype=torch.bool)
    mask[1, 0, 2, 1] = False
    s = kalman_smoother(x, **p, mask=mask, method=method)
    assert s.means.shape == (2, 3, T, S)
    assert s.covs.shape == (2, 3, T, S, S)
    assert s.cross_covs.shape == (2, 3, T - 1, S, S)
    assert s.filtered.log_likelihoods.shape == (2, 3, T)
    full = (2, 3)
    for i in range(2):
        for j in range(3):
            pe = element(p, (i, j), full)
            dense = dense_of(pe, T)
            idx = observed_index(dense, mask[i, 0])
            mean, cov = condition_z(dense, x[j], idx)
            assert_close(s.means[i, j], mean)
            assert_close(s.covs[i, j, 3], block(cov, S, 3, 3))
            assert_close(s.cross_covs[i, j, 1], block(cov, S, 2, 1))
            assert_close(s.filtered.log_likelihoods[i, j].sum(), log_marginal(dense, x[j], idx))


@pytest.mark.parametrize("T", [1, 2, 3, 7, 16, 33])
def test_sequential_equals_parallel(T):
    S, D = 3, 2
    p = random_model(S, D, T, batch=(2,), time_varying=T % 2 == 1, controls=True, seed=T)
    x = observations(T, D, batch=(4, 2), seed=T + 1)
    mask = torch.rand(4, 1, T, generator=torch.Generator().manual_seed(T)) < 0.7
    noise = torch.randn((3, 4, 2, T, S), generator=torch.Generator().manual_seed(1), dtype=F64)
    out = {}
    for m in METHODS:
        out[m] = (
            kalman_smoother(x, **p, mask=mask, method=m),
            kalman_sample(x, **p, mask=mask, sample_shape=(3,), noise=noise, method=m).samples,
        )
    (s1, z1), (s2, z2) = out["sequential"], out["parallel"]
    for a, b in zip(
        list(s1[:4]) + list(s1.filtered) + [z1], list(s2[:4]) + list(s2.filtered) + [z2]
    ):
        assert a.shape == b.shape
        assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("method", METHODS)
def test_zero_noise_ffbs_is_smoother_mean(method):
    # with e_t = 0 the backward sampler reduces to the RTS mean recursion exactly
    T, S, D = 7, 3, 2
    p = random_model(S, D, T, time_varying=True, seed=11)
    x = observations(T, D, seed=12)
    s = kalman_smoother(x, **p, method=method)
    z = kalman_sample(x, **p, noise=torch.zeros(T, S, dtype=F64), method=method).samples
    assert_close(z, s.means, atol=1e-12, rtol=1e-12)


def test_posterior_sample_moments():
    T, S, D, N = 4, 2, 2, 20000
    p = random_model(S, D, T, seed=13)
    x = observations(T, D, seed=14)
    mask = torch.tensor([True, False, True, True])
    torch.manual_seed(0)
    z = kalman_sample(x, **p, mask=mask, sample_shape=(N,)).samples.reshape(N, T * S)
    dense = dense_of(p, T)
    mean, cov = condition_z(dense, x, observed_index(dense, mask))
    mean = mean.reshape(-1)
    var = cov.diagonal()
    # standard error of a sample mean: sqrt(var / N); 5 SE per entry (8 entries, normal
    # approximation: family-wise false-alarm probability < 1e-5)
    se_mean = (var / N).sqrt()
    assert ((z.mean(0) - mean).abs() <= 5 * se_mean).all()
    # standard error of a sample covariance of Gaussians: sqrt((S_ii S_jj + S_ij^2) / N);
    # 5 SE per entry (36 distinct entries: family-wise false-alarm probability < 3e-5)
    emp = torch.cov(z.T)
    se_cov = ((var[:, None] * var[None, :] + cov**2) / N).sqrt()
    assert ((emp - cov).abs() <= 5 * se_cov).all()


def test_sample_is_reparameterized():
    T, S, D = 5, 2, 2
    p = random_model(S, D, T, seed=15)
    x = observations(T, D, seed=16).requires_grad_()
    noise = torch.randn(7, T, S, dtype=F64)
    A = p["transition_matrix"].clone().requires_grad_()
    p["transition_matrix"] = A
    z = kalman_sample(x, **p, sample_shape=(7,), noise=noise).samples
    gx, gA = torch.autograd.grad(z.sum(), [x, A])
    assert torch.isfinite(gx).all() and gx.abs().sum() > 0
    assert torch.isfinite(gA).all() and gA.abs().sum() > 0
    # d z / d x with fixed noise is the smoother-mean Jacobian, since the noise part
    # chol(Pc) e does not depend on x: compare with the dense posterior-mean gain
    dense = dense_of({**p, "transition_matrix": A.detach()}, T)
    idx = observed_index(dense)
    gain = torch.linalg.solve(dense.cov_xx[idx][:, idx], dense.cov_xz[idx]).T  # (TS, TD)
    assert_close(gx, 7 * gain.sum(0).reshape(T, D), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck_log_likelihood(method):
    T, S, D = 3, 2, 2
    p = random_model(S, D, T, time_varying=True, controls=True, seed=17)
    x = observations(T, D, seed=18)
    mask = torch.tensor([[True, True], [False, True], [True, True]])
    eye_s, eye_d = torch.eye(S, dtype=F64), torch.eye(D, dtype=F64)

    def unpack(m0, L0, A, LQ, C, LR, B, u, xx):
        return dict(
            initial_loc=m0,
            initial_cov=L0 @ L0.mT + 0.1 * eye_s,
            transition_matrix=A,
            transition_cov=LQ @ LQ.mT + 0.1 * eye_s,
            observation_matrix=C,
            observation_cov=LR @ LR.mT + 0.1 * eye_d,
            control_matrix=B,
            controls=u,
        ), xx

    def ours(*args):
        kw, xx = unpack(*args)
        return kalman_filter(xx, **kw, mask=mask, method=method).log_likelihoods.sum()

    def dense_ref(*args):
        kw, xx = unpack(*args)
        offsets = (kw["control_matrix"] @ kw["controls"].unsqueeze(-1)).squeeze(-1)
        dense = dense_lgssm(
            kw["initial_loc"],
            kw["initial_cov"],
            kw["transition_matrix"],
            kw["transition_cov"],
            kw["observation_matrix"],
            kw["observation_cov"],
            T,
            offsets,
        )
        return log_marginal(dense, xx, observed_index(dense, mask))

    gen = torch.Generator().manual_seed(19)
    args = [
        p["initial_loc"],
        torch.linalg.cholesky(p["initial_cov"]),
        p["transition_matrix"],
        torch.tril(torch.randn(T, S, S, generator=gen, dtype=F64)),
        p["observation_matrix"],
        torch.tril(torch.randn(T, D, D, generator=gen, dtype=F64)),
        p["control_matrix"],
        p["controls"],
        x,
    ]
    args = [a.clone().requires_grad_() for a in args]
    # finite differences vs autograd (the parallel form is checked by fast-mode gradcheck,
    # i.e. along random directions, to keep the suite fast; both are checked against the
    # dense reference's gradient below)
    assert torch.autograd.gradcheck(ours, args, eps=1e-6, atol=1e-6, fast_mode=method == "parallel")
    g_ours = torch.autograd.grad(ours(*args), args)
    g_dense = torch.autograd.grad(dense_ref(*args), args)
    for a, b in zip(g_ours, g_dense):
        assert_close(a, b, atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("method", METHODS)
def test_extreme_conditioning_float64(method):
    # covariances with eigenvalues from 1e-6 to 1e6
    T, S, D = 8, 4, 3
    gen = torch.Generator().manual_seed(20)

    def spd_range(n):
        U = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=F64))[0]
        ev = torch.logspace(-6, 6, n, dtype=F64)
        return U @ torch.diag(ev) @ U.T

    A = 0.95 * torch.linalg.qr(torch.randn(S, S, generator=gen, dtype=F64))[0]
    p = dict(
        initial_loc=torch.zeros(S, dtype=F64),
        initial_cov=spd_range(S),
        transition_matrix=A,
        transition_cov=spd_range(S),
        observation_matrix=torch.randn(D, S, generator=gen, dtype=F64),
        observation_cov=spd_range(D),
    )
    dense = dense_of(p, T)
    x = (
        dense.mean_x
        + torch.linalg.cholesky(dense.cov_xx) @ torch.randn(T * D, generator=gen, dtype=F64)
    ).reshape(T, D)
    s = kalman_smoother(x, **p, method=method)
    z = kalman_sample(x, **p, sample_shape=(3,), method=method).samples
    for t in list(s[:4]) + list(s.filtered) + [z]:
        assert torch.isfinite(t).all()
    for covs in (s.covs, s.filtered.covs, s.filtered.predicted_covs[1:]):
        assert torch.equal(covs, covs.mT)  # exactly symmetric (entry 0 of predicted is the input)
        ev = torch.linalg.eigvalsh(covs)
        assert (ev >= -1e-12 * ev.abs().amax(-1, keepdim=True)).all()  # PSD to rounding
    # agreement with the dense reference: both sides lose about cond * eps = 1e12 * 1e-16
    # relative accuracy in the worst case, so compare with a tolerance of 1e-4 relative
    ll = log_marginal(dense, x, observed_index(dense))
    assert abs(s.filtered.log_likelihoods.sum() - ll) <= 1e-4 * abs(ll)
    mean, _ = condition_z(dense, x, observed_index(dense))
    scale = mean.abs().max()
    assert ((s.means - mean).abs() <= 1e-4 * scale).all()


def test_float32_close_to_float64():
    T, S, D = 50, 4, 2
    p = random_model(S, D, T, seed=21)
    x = observations(T, D, batch=(3,), seed=22)
    ref = kalman_smoother(x, **p)
    p32 = {k: v.float() for k, v in p.items()}
    for m in METHODS:
        out = kalman_smoother(x.float(), **p32, method=m)
        assert out.means.dtype == torch.float32
        # float32 eps = 1.2e-7; the recursion is contractive here, so errors stay ~1e-5
        assert_close(out.means, ref.means.float(), atol=1e-4, rtol=1e-4)
        assert_close(out.covs, ref.covs.float(), atol=1e-4, rtol=1e-4)
        ll = out.filtered.log_likelihoods.sum(-1)
        assert_close(ll, ref.filtered.log_likelihoods.sum(-1).float(), atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_zero_transition_noise_ball_example(method):
    # thesis eq. 3.9-3.10: ball in vacuum, Q = 0, R = 3 I, mu_{1|0} = 0, Sigma_{1|0} = 2 I
    dt, g, T = 0.2, 9.81, 12
    A = torch.tensor([[1, dt, 0, 0], [0, 1, 0, 0], [0, 0, 1, dt], [0, 0, 0, 1]], dtype=F64)
    B = torch.tensor([[0.0], [0.0], [-0.5 * dt**2], [-dt]], dtype=F64)
    u = torch.full((T, 1), g, dtype=F64)
    C = torch.tensor([[1.0, 0, 0, 0], [0, 0, 1, 0]], dtype=F64)
    p = dict(
        initial_loc=torch.zeros(4, dtype=F64),
        initial_cov=2 * torch.eye(4, dtype=F64),
        transition_matrix=A,
        transition_cov=torch.zeros(4, 4, dtype=F64),
        observation_matrix=C,
        observation_cov=3 * torch.eye(2, dtype=F64),
        control_matrix=B,
        controls=u,
    )
    x = observations(T, 2, seed=23) * 3 + torch.arange(T, dtype=F64)[:, None]
    s = kalman_smoother(x, **p, method=method)
    z = kalman_sample(x, **p, sample_shape=(4,), method=method).samples
    assert torch.isfinite(s.means).all() and torch.isfinite(z).all()
    dense = dense_of(p, T)
    mean, _ = condition_z(dense, x, observed_index(dense))
    assert_close(s.means, mean, atol=1e-8, rtol=1e-8)
    # with Q = 0 the posterior is a deterministic trajectory: z_{t} = A z_{t-1} + B u_t
    pred = z[..., :-1, :] @ A.T + (B @ u[1:, :, None]).squeeze(-1)
    assert_close(z[..., 1:, :], pred, atol=1e-6, rtol=1e-6)


def test_not_positive_definite_raises():
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, seed=24)
    p["observation_cov"] = -torch.eye(D, dtype=F64)
    p["initial_cov"] = torch.zeros(S, S, dtype=F64)
    x = observations(T, D)
    for m in METHODS:
        with pytest.raises(ValueError, match="not positive definite"):
            kalman_filter(x, **p, method=m)


def test_psd_sqrt_singular():
    M = torch.zeros(2, 3, 3, dtype=F64)
    v = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    M[1] = torch.outer(v, v)  # rank one
    L = psd_sqrt(M)
    assert torch.equal(L[0], torch.zeros(3, 3, dtype=F64))
    assert_close(L[1] @ L[1].T, M[1], atol=1e-6, rtol=0)  # jitter of order eps * mean(diag)
    with pytest.raises(ValueError):
        psd_sqrt(-torch.eye(2, dtype=F64))


def test_bad_shapes_raise():
    p = random_model(2, 2, 4)
    with pytest.raises(ValueError, match="time dimension"):
        kalman_filter(
            observations(5, 2), **{**p, "transition_matrix": torch.eye(2).expand(3, 2, 2)}
        )
    with pytest.raises(ValueError, match="method"):
        kalman_filter(observations(4, 2), **p, method="magic")


@pytest.mark.parametrize("method", METHODS)
def test_float32_documented_range(method):
    # module docstring: float32 is supported for covariance eigenvalues in about [1e-2, 1e3]
    # (condition number 1e5). First-order error bound cond * eps32 = 1e5 * 1.2e-7 = 1.2e-2
    # relative; observed ~2e-5 on these models, asserted at 1e-3 relative to the largest entry.
    T, S, D = 50, 4, 3
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)

        def spd_range(n):
            U = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=F64))[0]
            return U @ torch.diag(torch.logspace(-2, 3, n, dtype=F64)) @ U.T

        A = 0.95 * torch.linalg.qr(torch.randn(S, S, generator=gen, dtype=F64))[0]
        p = dict(
            initial_loc=torch.zeros(S, dtype=F64),
            initial_cov=spd_range(S),
            transition_matrix=A,
            transition_cov=spd_range(S),
            observation_matrix=torch.randn(D, S, generator=gen, dtype=F64),
            observation_cov=spd_range(D),
        )
        x = 30 * torch.randn(2, T, D, generator=gen, dtype=F64)
        r64 = kalman_smoother(x, **p, method=method)
        r32 = kalman_smoother(x.float(), **{k: v.float() for k, v in p.items()}, method=method)
        pairs = [
            (r32.means, r64.means),
            (r32.covs, r64.covs),
            (r32.filtered.covs, r64.filtered.covs),
            (r32.filtered.log_likelihoods.sum(-1), r64.filtered.log_likelihoods.sum(-1)),
        ]
        for a, b in pairs:
            assert torch.isfinite(a).all()
            assert (a.double() - b).abs().max() <= 1e-3 * b.abs().max()


@pytest.mark.parametrize(
    "time_varying,controls,masked", [(False, False, False), (True, True, True)]
)
def test_sequential_autograd_and_nograd_paths_match_dense(time_varying, controls, masked):
    # the sequential covariance loop has an out=-buffer variant used for shared parameters
    # when no gradient is needed; both must equal the dense reference (and each other)
    T, S, D = 7, 3, 2
    p = random_model(S, D, T, time_varying=time_varying, controls=controls, seed=31)
    x = observations(T, D, batch=(2,), seed=32)
    mask = torch.rand(T, D, generator=torch.Generator().manual_seed(33)) > 0.3 if masked else None
    with torch.no_grad():
        fast = kalman_smoother(x, **p, mask=mask, method="sequential")
    slow = kalman_smoother(
        x, **{k: v.clone().requires_grad_() for k, v in p.items()}, mask=mask, method="sequential"
    )
    for a, b in zip(list(fast[:4]) + list(fast.filtered), list(slow[:4]) + list(slow.filtered)):
        assert_close(a, b.detach(), atol=1e-12, rtol=1e-10)
    for s in (fast, slow):
        assert torch.equal(s.covs, s.covs.mT) and torch.equal(s.filtered.covs, s.filtered.covs.mT)
    for i in range(2):
        xi = x[i]
        dense = dense_of(p, T)
        idx = observed_index(dense) if mask is None else observed_index(dense, mask)
        mean, cov = condition_z(dense, xi, idx)
        assert_close(fast.means[i], mean)
        for t in range(T):
            assert_close(fast.covs[i, t], block(cov, S, t, t))
