"""Singular process noise: the RTS smoother and FFBS must not invert a singular predicted
covariance Sigma_{t+1|t}. Compared with the dense float64 reference of
tests/dense_gaussian.py, which conditions the joint Gaussian on x (its only solve is with
Cov(x), positive definite since R is) and so needs no inverse of Sigma_{t+1|t}.

Three models:
* constant velocity with noise on the velocity only (Q singular, Sigma_{t+1|t} regular);
* a deterministic known bias (zero initial variance and Q = 0 on it): Sigma_{t+1|t} has an
  exactly zero row and column, Cholesky fails;
* a rank-deficient transition A = U diag(0.9, 0.6, 0) U^T with rank-two Q on range(A):
  Sigma_{t+1|t} has rank 2 up to rounding, Cholesky succeeds or fails by chance.

Not covered, because the RTS recursion itself is ill-conditioned there: a *contracting*
noise-free direction (A eigenvalue |a| < 1 without noise, e.g. Q rank-one above) whose
filtered variance decays like a^{2t} toward rounding. Its backward gain is ~1/a, so a
rounding error made where the variance is ~eps is amplified by a^{-t} on the way back
(measured: 1e2 absolute at t = 0 after 40 steps with a = 0.6); the dense reference does
not have this problem. Any RTS-form smoother shares it.
"""

import pytest
import torch

from pyro_seq.ops import extended_kalman_smoother, kalman_sample, kalman_smoother
from tests.dense_gaussian import block, condition_z, log_marginal, observed_index
from tests.ops.test_kalman import METHODS, dense_of, observations

F64 = torch.float64


def constant_velocity(T):
    dt, q = 0.1, 0.5
    A = torch.tensor([[1.0, dt], [0.0, 1.0]], dtype=F64)
    return dict(
        initial_loc=torch.tensor([0.0, 1.0], dtype=F64),
        initial_cov=torch.diag(torch.tensor([1.0, 0.5], dtype=F64)),
        transition_matrix=A,
        transition_cov=torch.tensor([[0.0, 0.0], [0.0, q * dt]], dtype=F64),
        observation_matrix=torch.tensor([[1.0, 0.0]], dtype=F64),
        observation_cov=torch.tensor([[0.2]], dtype=F64),
    )


def known_bias(T):
    """State (position, velocity, bias); bias known exactly (variance 0) and constant (Q = 0
    on it); observations of position + bias and of velocity."""
    dt = 0.2
    A = torch.tensor([[1.0, dt, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=F64)
    return dict(
        initial_loc=torch.tensor([0.0, 1.0, 0.7], dtype=F64),
        initial_cov=torch.diag(torch.tensor([1.0, 0.5, 0.0], dtype=F64)),
        transition_matrix=A,
        transition_cov=torch.diag(torch.tensor([0.0, 0.3, 0.0], dtype=F64)),
        observation_matrix=torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype=F64),
        observation_cov=torch.tensor([[0.3, 0.1], [0.1, 0.4]], dtype=F64),
    )


def rank_deficient(T):
    gen = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=F64))[0]
    A = U @ torch.diag(torch.tensor([0.9, 0.6, 0.0], dtype=F64)) @ U.T
    q = U[:, 0:2] @ torch.tensor([[0.6, 0.0], [0.3, 0.4]], dtype=F64)
    return dict(
        initial_loc=torch.randn(3, generator=gen, dtype=F64),
        initial_cov=torch.eye(3, dtype=F64),
        transition_matrix=A,
        transition_cov=q @ q.T,
        observation_matrix=torch.randn(2, 3, generator=gen, dtype=F64),
        observation_cov=0.5 * torch.eye(2, dtype=F64),
    )


MODELS = [constant_velocity, known_bias, rank_deficient]


def assert_rel(a, b, rtol):
    """max |a - b| <= rtol * max |b| (relative to the reference's scale)."""
    err = float((a - b).abs().max())
    assert err <= rtol * float(b.abs().max()), (err, float(b.abs().max()))
    return err / float(b.abs().max())


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("method", METHODS)
def test_smoother_matches_dense_with_singular_noise(model, method):
    """Smoothed means, covariances, lag-one covariances and the log-likelihood equal the
    dense reference to 1e-9 relative (exact identities in float64: the reference and the
    recursions differ by rounding only; measured: at most 7e-13 relative, known_bias)."""
    T = 40
    p = model(T)
    D = p["observation_matrix"].shape[-2]
    S = p["initial_loc"].shape[-1]
    x = observations(T, D, seed=1)
    s = kalman_smoother(x, **p, method=method)
    dense = dense_of(p, T)
    idx = observed_index(dense)
    mean, cov = condition_z(dense, x, idx)
    assert_rel(s.means, mean, 1e-9)
    covs = torch.stack([block(cov, S, t, t) for t in range(T)])
    cross = torch.stack([block(cov, S, t + 1, t) for t in range(T - 1)])
    assert_rel(s.covs, covs, 1e-9)
    assert_rel(s.cross_covs, cross, 1e-9)
    ll = log_marginal(dense, x, idx)
    assert abs(float(s.filtered.log_likelihoods.sum() - ll)) <= 1e-9 * abs(float(ll))
    for t in (s.means, s.covs, s.cross_covs, s.gains):
        assert torch.isfinite(t).all()


@pytest.mark.parametrize("model", [known_bias, rank_deficient], ids=lambda m: m.__name__)
@pytest.mark.parametrize("method", METHODS)
def test_predicted_covariance_is_singular_in_these_models(model, method):
    """Guard for the test above: Sigma_{t+1|t} really is singular here (smallest eigenvalue
    at rounding level, below 1e-12 of the largest), so the smoother went through the
    rank-deficient solve and not through a Cholesky of a regular matrix."""
    T = 10
    p = model(T)
    x = observations(T, p["observation_matrix"].shape[-2], seed=1)
    pc = kalman_smoother(x, **p, method=method).filtered.predicted_covs[1:]
    ev = torch.linalg.eigvalsh(pc)
    assert (ev[..., 0].abs() <= 1e-12 * ev[..., -1]).all()


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("method", METHODS)
def test_ffbs_with_singular_noise(model, method):
    """FFBS with zero noise is the smoother mean (exact, 1e-9 relative); with noise the
    draws are finite and a deterministic component stays deterministic: in the known-bias
    model every draw keeps the bias at its known value 0.7 (to 1e-6, the size of the
    jitter psd_sqrt adds to factor a singular backward covariance)."""
    T = 30
    p = model(T)
    S, D = p["initial_loc"].shape[-1], p["observation_matrix"].shape[-2]
    x = observations(T, D, seed=2)
    s = kalman_smoother(x, **p, method=method)
    z0 = kalman_sample(x, **p, noise=torch.zeros(T, S, dtype=F64), method=method).samples
    assert_rel(z0, s.means, 1e-9)
    torch.manual_seed(3)
    z = kalman_sample(x, **p, sample_shape=(64,), method=method).samples
    assert torch.isfinite(z).all()
    if model is known_bias:
        assert ((z[..., 2] - 0.7).abs() <= 1e-6).all()


def test_extended_smoother_with_singular_predicted_covariance():
    """The Gaussian RTS smoother of ops.nonlinear shares the rank-deficient solve: the EKF
    smoother of the (linear) known-bias model equals the dense reference (1e-9 relative)."""
    T = 25
    p = known_bias(T)
    S = 3
    x = observations(T, 2, seed=4)
    A, C = p["transition_matrix"], p["observation_matrix"]
    s = extended_kalman_smoother(
        x,
        lambda z, t: z @ A.T,
        lambda z, t: z @ C.T,
        p["initial_loc"],
        p["initial_cov"],
        p["transition_cov"],
        p["observation_cov"],
    )
    dense = dense_of(p, T)
    mean, cov = condition_z(dense, x, observed_index(dense))
    assert_rel(s.means, mean, 1e-9)
    assert_rel(s.covs, torch.stack([block(cov, S, t, t) for t in range(T)]), 1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_gradients_with_singular_predicted_covariance(method):
    """Gradients through the rank-deficient RTS gain are finite for every parameter. The
    log-likelihood's gradients (filter only) equal the dense reference's (1e-9 relative;
    covariance gradients symmetrised, since each side reads the symmetric arguments
    differently). For the smoothed means they agree for the perturbations that keep the
    rank of Sigma_{t+1|t} (C, R, mu_{1|0}); for A, Q, Sigma_{1|0}, which can give the
    known bias a variance, the derivative needs the limit of J_t on the null space along
    the perturbation, which no single gain provides: our gradient is that of the
    constant-rank pseudo-inverse (documented limitation, finite)."""
    T = 12
    p = {k: v.clone().requires_grad_() for k, v in known_bias(T).items()}
    x = observations(T, 2, seed=5)
    s = kalman_smoother(x, **p, method=method)
    dense = dense_of(p, T)
    idx = observed_index(dense)
    mean, _ = condition_z(dense, x, idx)
    for ours, ref, names in (
        (s.filtered.log_likelihoods.sum(), log_marginal(dense, x, idx), list(p)),
        (s.means.sum(), mean.sum(), ["observation_matrix", "observation_cov", "initial_loc"]),
    ):
        g = torch.autograd.grad(ours, list(p.values()), retain_graph=True)
        g_ref = torch.autograd.grad(ref, list(p.values()), retain_graph=True)
        for name, a, b in zip(p, g, g_ref):
            assert torch.isfinite(a).all(), name
            if name in names:
                if name.endswith("cov"):
                    a, b = 0.5 * (a + a.mT), 0.5 * (b + b.mT)
                assert_rel(a, b, 1e-9)


def large_rank_one_prior(seed):
    """Found by tests/property: a rank-one initial covariance 1e4 v v^T, Q = 0 and a
    contracting A (spectral norm 0.9), T = 3. The filtered covariance is a Schur complement
    of the 1e4-sized prior, so Sigma_{t+1|t} carries rounding of ~1e4 eps, far above 10 n eps
    of its own largest eigenvalue (~1e-2); it used to be refused as 'not positive
    semi-definite' (smallest eigenvalue -7e-15)."""
    g = torch.Generator().manual_seed(seed)
    S, D = 3, 2
    v = torch.randn(S, 1, generator=g, dtype=F64)
    A = torch.randn(S, S, generator=g, dtype=F64)
    return dict(
        initial_loc=torch.zeros(S, dtype=F64),
        initial_cov=1e4 * v @ v.T,
        transition_matrix=0.9 * A / torch.linalg.matrix_norm(A, 2),
        transition_cov=torch.zeros(S, S, dtype=F64),
        observation_matrix=torch.randn(D, S, generator=g, dtype=F64),
        observation_cov=0.1 * torch.eye(D, dtype=F64),
    )


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("method", METHODS)
def test_smoother_with_large_rank_one_prior_matches_dense(seed, method):
    """Regression (fuzzing): the smoother accepts the model above and its smoothed moments
    equal the dense reference to 1e-7 relative to the reference's largest entry (measured:
    at most 3.5e-9 over these 24 cases; before the fix 5e-2 where the rounding-level
    eigenvalues of Sigma_{t+1|t} were inverted)."""
    T = 3
    p = large_rank_one_prior(seed)
    S, D = 3, 2
    x = observations(T, D, seed=seed)
    s = kalman_smoother(x, **p, method=method)
    dense = dense_of(p, T)
    mean, cov = condition_z(dense, x, observed_index(dense))
    assert_rel(s.means, mean, 1e-7)
    assert_rel(s.covs, torch.stack([block(cov, S, t, t) for t in range(T)]), 1e-7)
    assert torch.isfinite(s.gains).all()


def test_psd_solve_names_the_failing_matrix():
    """A clearly indefinite rank-deficient matrix is refused, and the message names its
    batch index and its own eigenvalues (it used to print the batch's overall minimum)."""
    from pyro_seq.ops.linalg import psd_solve

    good = torch.diag(torch.tensor([1.0, 0.0], dtype=F64))
    bad = torch.diag(torch.tensor([1.0, -0.5], dtype=F64))
    worse = torch.diag(torch.tensor([1.0, -0.9], dtype=F64))
    P = torch.stack([good, bad, worse])
    with pytest.raises(
        ValueError,
        match=r"at index \(1,\) \(smallest eigenvalue -0\.5, "
        r"largest 1\)",
    ):
        psd_solve(P, torch.ones(3, 2, 1, dtype=F64), "P")
