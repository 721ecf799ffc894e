"""The blocked steady-state log-likelihood (pyro_seq.ops.kalman_blocked) behind
``kalman_log_likelihood(method="auto")`` and ``LinearGaussianSSM.log_prob``: it equals the
dense Gaussian marginal and the full recursion without the steady-state shortcut to 1e-12,
and every case it does not cover falls back to the filter's sum."""

import pytest
import torch

import pyro_seq.ops.kalman as kalman
import pyro_seq.ops.kalman_steady as steady
from pyro_seq.distributions import LinearGaussianSSM
from pyro_seq.ops import kalman_filter, kalman_log_likelihood
from pyro_seq.ops.kalman_steady import joint_covariance_pass
from tests.dense_gaussian import log_marginal, observed_index
from tests.ops.test_kalman import dense_of, observations, random_model
from tests.ops.test_kalman_steady_path import fallback_case

F64 = torch.float64


def _close(a, b, tol=1e-12):
    torch.testing.assert_close(a, b.to(a.dtype), atol=tol * b.abs().max().item(), rtol=tol)


def _full_sum(x, p, **kw):
    """log p(x) from the sequential filter with every step computed (no shortcut)."""
    f = kalman_filter(x, **p, method="sequential", steady_state_tol=0.0, **kw)
    return f.log_likelihoods.sum(-1)


@pytest.mark.parametrize("batch", [(), (5,), (2, 3)])
def test_log_likelihood_matches_dense(batch):
    """T = 120: the steady path is taken (steady state well before T) and every sequence's
    log p(x) equals the dense Gaussian marginal."""
    T, S, D = 120, 3, 2
    p = random_model(S, D, T, seed=2)
    x = observations(T, D, batch, seed=5)
    with torch.no_grad():
        mdl = kalman._prepare(x, **p, validate_args=False)
        fast = steady.steady_log_likelihood(mdl, kalman.STEADY_STATE_TOL)
        assert fast is not None and fast.shape == batch
        got = kalman_log_likelihood(x, **p)
    assert torch.equal(got, fast)  # "auto" took the blocked path
    dense = dense_of(p, T)
    xs, gs = x.reshape(-1, T, D), got.reshape(-1)
    for i in range(xs.shape[0]):
        _close(gs[i], log_marginal(dense, xs[i], observed_index(dense)), 1e-11)


@pytest.mark.parametrize("S, D, T", [(4, 2, 1000), (2, 5, 33), (6, 1, 257), (32, 16, 300)])
def test_log_likelihood_equals_full_recursion(S, D, T):
    """Benchmark sizes and odd ones (T just above the steady-state threshold, D > S, a
    large state): equal to the full sequential recursion to 1e-12."""
    p = random_model(S, D, T, seed=S + D)
    x = observations(T, D, (3,), seed=T)
    with torch.no_grad():
        _close(kalman_log_likelihood(x, **p), _full_sum(x, p))


def test_slow_convergence_long_head():
    """A slowly forgetting model (eigenvalues 0.97, small noise, one direction seen only
    through the other) converges late: the head of time-varying gains spans about 70
    blocks; still exact."""
    T, S, D = 1000, 2, 1
    p = dict(
        initial_loc=torch.tensor([0.3, -0.2], dtype=F64),
        initial_cov=torch.eye(S, dtype=F64) * 5.0,
        transition_matrix=0.97 * torch.eye(S, dtype=F64),
        transition_cov=1e-3 * torch.eye(S, dtype=F64),
        observation_matrix=torch.tensor([[1.0, 0.5]], dtype=F64),
        observation_cov=torch.tensor([[0.2]], dtype=F64),
    )
    x = observations(T, D, (2,), seed=9)
    with torch.no_grad():
        mdl = kalman._prepare(x, **p, validate_args=False)
        steady_from = joint_covariance_pass(mdl, 8.0)[-1]
        assert 400 < steady_from < T  # a long head, and the blocked path is still taken
        _close(kalman_log_likelihood(x, **p), _full_sum(x, p))


@pytest.mark.parametrize("case", ["mask", "time_varying", "batched_params", "short"])
def test_fallback_cases_equal_filter_sum(case):
    p, x, kw = fallback_case(case)
    with torch.no_grad():
        _close(kalman_log_likelihood(x, **p, **kw), _full_sum(x, p, **kw))


def test_controls_take_the_blocked_path():
    """State offsets B u_t shared by the batch (time-varying controls): the blocked path is
    taken and equals the full recursion."""
    T, S, D = 120, 3, 2
    p = random_model(S, D, T, controls=True, seed=3)
    x = observations(T, D, (2,), seed=6)
    with torch.no_grad():
        mdl = kalman._prepare(x, **p, validate_args=False)
        fast = steady.steady_log_likelihood(mdl, kalman.STEADY_STATE_TOL)
        assert fast is not None
        _close(fast, _full_sum(x, p))
        _close(kalman_log_likelihood(x, **p), _full_sum(x, p))


def test_gradients_fall_back_and_match_filter():
    """With autograd the steady shortcuts are off: the value and the gradient equal the
    filter's."""
    T, S, D = 60, 2, 2
    p = random_model(S, D, T, seed=4)
    x = observations(T, D, (2,), seed=3)
    A1 = p["transition_matrix"].clone().requires_grad_()
    A2 = p["transition_matrix"].clone().requires_grad_()
    lp1 = kalman_log_likelihood(x, **dict(p, transition_matrix=A1)).sum()
    lp2 = kalman_filter(x, **dict(p, transition_matrix=A2)).log_likelihoods.sum()
    (g1,), (g2,) = torch.autograd.grad(lp1, A1), torch.autograd.grad(lp2, A2)
    _close(lp1.detach(), lp2.detach())
    _close(g1, g2)


def test_distribution_log_prob_uses_it():
    """``LinearGaussianSSM.log_prob`` at the Kalman benchmark's sizes (batch 16, T 1000,
    state 4, obs 2, float64) equals the full recursion, with the blocked path taken."""
    T, S, D = 1000, 4, 2
    p = random_model(S, D, T, seed=11)
    d = LinearGaussianSSM(**p, num_steps=T)
    x = observations(T, D, (16,), seed=12)
    with torch.no_grad():
        lp = d.log_prob(x)
        mdl = kalman._prepare(x, **p, validate_args=False)
        assert torch.equal(lp, steady.steady_log_likelihood(mdl, kalman.STEADY_STATE_TOL))
        _close(lp, _full_sum(x, p))
