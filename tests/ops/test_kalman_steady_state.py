"""The steady-state shortcut of the sequential Kalman recursions (``steady_state_tol``).

With time-invariant parameters shared by the batch, the Riccati recursion converges to a
fixed point; once it has settled to rounding the remaining steps reuse it. These tests check
that the shortcut is taken (the covariance tail repeats exactly) and that every output equals
the full recursion (``steady_state_tol=0``) to rounding, also for a slowly converging model.
"""

import inspect

import pytest
import torch

import pyro_seq.ops.kalman as kalman
from pyro_seq.ops import kalman_filter, kalman_sample, kalman_smoother
from tests.ops.test_kalman import random_model

DEFAULT_TOL = kalman.STEADY_STATE_TOL


def _tail_repeats(covs):
    """Length of the trailing run of covariances exactly equal to the last one."""
    flat = covs.reshape(covs.shape[-3], -1)
    return int((flat == flat[-1]).all(-1).flip(0).cumprod(0).sum())


def _run(p, x, tol, **kw):
    return kalman_smoother(x, **p, method="sequential", steady_state_tol=tol, **kw)


def _observations(p, B, T, seed=1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    D = p["observation_matrix"].shape[-2]
    return torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_steady_state_equals_full_recursion(dtype, rtol):
    p = {k: v.to(dtype) for k, v in random_model(S=5, D=3, T=1, seed=3).items()}
    x = _observations(p, 4, 300, dtype=dtype)
    full = _run(p, x, 0.0)
    fast = _run(p, x, DEFAULT_TOL)
    assert _tail_repeats(fast.filtered.covs[0]) > 200  # the shortcut was taken
    assert _tail_repeats(fast.covs[0, :150]) > 50  # ... in the smoother too
    for name in ("means", "covs", "cross_covs", "gains"):
        a, b = getattr(full, name), getattr(fast, name)
        assert torch.allclose(b, a, rtol=0, atol=rtol * float(a.abs().max())), name
    for name in ("means", "covs", "predicted_means", "predicted_covs", "log_likelihoods"):
        a, b = getattr(full.filtered, name), getattr(fast.filtered, name)
        assert torch.allclose(b, a, rtol=0, atol=rtol * float(a.abs().max())), name


def test_slowly_converging_model_still_agrees():
    """A near-unit-root state observed through heavy noise settles slowly (about 2000
    steps); the shortcut must not fire before the covariance has reached its fixed point."""
    S = 2
    p = dict(
        initial_loc=torch.zeros(S, dtype=torch.float64),
        initial_cov=10.0 * torch.eye(S, dtype=torch.float64),
        transition_matrix=torch.tensor([[0.995, 0.01], [0.0, 0.994]], dtype=torch.float64),
        transition_cov=1e-3 * torch.eye(S, dtype=torch.float64),
        observation_matrix=torch.tensor([[1.0, 0.0]], dtype=torch.float64),
        observation_cov=torch.tensor([[25.0]], dtype=torch.float64),
    )
    x = _observations(p, 3, 3000)
    full = _run(p, x, 0.0)
    fast = _run(p, x, DEFAULT_TOL)
    assert 100 < _tail_repeats(fast.filtered.covs[0]) < 1500  # settled late, but settled
    for name in ("means", "covs"):
        a, b = getattr(full, name), getattr(fast, name)
        assert torch.allclose(b, a, rtol=0, atol=1e-12 * float(a.abs().max())), name
    ll_full = full.filtered.log_likelihoods.sum(-1)
    ll_fast = fast.filtered.log_likelihoods.sum(-1)
    assert torch.allclose(ll_fast, ll_full, rtol=1e-12, atol=0)


def test_not_taken_for_time_varying_parameters_or_masks():
    p = random_model(S=3, D=2, T=200, time_varying=True, seed=5)
    x = _observations(p, 2, 200)
    fast = _run(p, x, DEFAULT_TOL)
    assert _tail_repeats(fast.filtered.covs[0]) < 5
    p = random_model(S=3, D=2, T=1, seed=5)
    mask = torch.rand(2, 200, generator=torch.Generator().manual_seed(0)) < 0.9
    f = kalman_filter(x, **p, mask=mask, method="sequential", steady_state_tol=DEFAULT_TOL)
    full_mask = _tail_repeats(f.covs[0])
    assert full_mask < 5


def test_sampling_and_filtering_use_the_same_steady_filter():
    p = random_model(S=4, D=2, T=1, seed=7)
    x = _observations(p, 2, 400)
    noise = torch.randn(2, 400, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    a = kalman_sample(x, **p, noise=noise, method="sequential", steady_state_tol=0.0).samples
    b = kalman_sample(
        x, **p, noise=noise, method="sequential", steady_state_tol=DEFAULT_TOL
    ).samples
    assert torch.allclose(a, b, rtol=0, atol=1e-11 * float(a.abs().max()))


def test_default_is_the_module_constant():
    """The argument's default is ``kalman.STEADY_STATE_TOL`` (the shortcut is on by default):
    the results equal an explicit ``steady_state_tol=STEADY_STATE_TOL`` bit for bit, and for
    this model (deterministic, fixed seed) they differ in the last bits from
    ``steady_state_tol=0``, which reaches its own rounding-level fixed point two steps later."""
    for fn in (kalman_filter, kalman_smoother, kalman_sample):
        assert inspect.signature(fn).parameters["steady_state_tol"].default == DEFAULT_TOL
    p = random_model(S=3, D=2, T=1, seed=9)
    x = _observations(p, 2, 300)
    default = kalman_smoother(x, **p, method="sequential")
    explicit = _run(p, x, DEFAULT_TOL)
    full = _run(p, x, 0.0)
    assert torch.equal(default.covs, explicit.covs)
    assert torch.equal(default.filtered.covs, explicit.filtered.covs)
    assert not torch.equal(default.filtered.covs, full.filtered.covs)
