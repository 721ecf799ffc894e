"""SteadyStateCache (pyro_seq.ops.kalman_steady): the observation-independent covariance side
of the steady-state path, kept for repeated calls with the same parameter tensors. Results
must be bit-for-bit those of a call without the cache, the recursion must run once per set
of parameters, any change of the parameters (other tensors, an in-place update) must be
seen, and nothing a caller gets back may alias what the cache keeps."""

import pytest
import torch

import pyro_seq.ops.kalman_steady as steady
from pyro_seq.distributions import LinearGaussianSSM
from pyro_seq.ops import (
    SteadyStateCache,
    kalman_filter,
    kalman_log_likelihood,
    kalman_sample,
    kalman_smoother,
)
from tests.dense_gaussian import log_marginal, observed_index
from tests.ops.test_kalman import dense_of, observations, random_model

T = 120  # past the steady state of random_model, long enough for the steady path


@pytest.fixture
def counted(monkeypatch):
    """The number of Riccati recursions run (calls of joint_covariance_pass)."""
    calls = []
    inner = steady.joint_covariance_pass

    def spy(mdl, tol):
        calls.append(mdl.T)
        return inner(mdl, tol)

    monkeypatch.setattr(steady, "joint_covariance_pass", spy)
    return calls


def _equal(a, b):
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _equal(u, v)
    else:
        assert torch.equal(a, b)


@torch.no_grad()
def test_cached_results_equal_uncached_and_recursion_runs_once(counted):
    p = random_model(3, 2, T, seed=2)
    x = observations(T, 2, (4,), seed=5)
    cache = SteadyStateCache()
    ref = (
        kalman_log_likelihood(x, **p),
        kalman_filter(x, **p),
        kalman_smoother(x, **p),
    )
    n_ref = len(counted)
    assert n_ref == 3  # one recursion per call without a cache
    for _ in range(2):
        got = (
            kalman_log_likelihood(x, **p, steady_state_cache=cache),
            kalman_filter(x, **p, steady_state_cache=cache),
            kalman_smoother(x, **p, steady_state_cache=cache),
        )
        _equal(got[0], ref[0])
        _equal(tuple(got[1]), tuple(ref[1]))
        _equal(tuple(got[2][:4]), tuple(ref[2][:4]))
        _equal(tuple(got[2].filtered), tuple(ref[2].filtered))
    assert len(counted) == n_ref + 1  # one recursion for all six cached calls
    noise = torch.randn(2, 4, T, 3, dtype=torch.float64)
    a = kalman_sample(x, **p, sample_shape=(2,), noise=noise).samples
    b = kalman_sample(x, **p, sample_shape=(2,), noise=noise, steady_state_cache=cache).samples
    _equal(a, b)
    # other observations, same parameters: the cache still holds, the value is exact
    x2 = observations(T, 2, (2,), seed=9)
    lp = kalman_log_likelihood(x2, **p, steady_state_cache=cache)
    n = len(counted)
    dense = dense_of(p, T)
    for i in range(2):
        expect = log_marginal(dense, x2[i], observed_index(dense))
        torch.testing.assert_close(lp[i], expect, atol=1e-11, rtol=1e-12)
    assert len(counted) == n


@torch.no_grad()
def test_every_change_of_the_values_is_seen(counted):
    p = random_model(3, 2, T, seed=3)
    x = observations(T, 2, (3,), seed=1)
    cache = SteadyStateCache()
    before = kalman_log_likelihood(x, **p, steady_state_cache=cache)
    p["transition_cov"].mul_(1.5)  # an in-place update, as an optimiser step under no_grad
    after = kalman_log_likelihood(x, **p, steady_state_cache=cache)
    _equal(after, kalman_log_likelihood(x, **p))
    assert not torch.allclose(before, after)
    # changes that no version counter sees: through .data (Pyro's ClippedAdam) and NumPy
    for change in (
        lambda: p["observation_cov"].data.mul_(2.0),
        lambda: p["transition_matrix"].numpy().__imul__(0.5),
    ):
        old = kalman_log_likelihood(x, **p, steady_state_cache=cache)
        change()
        new = kalman_log_likelihood(x, **p, steady_state_cache=cache)
        _equal(new, kalman_log_likelihood(x, **p))
        assert not torch.allclose(old, new)
    # equal values in other tensors (a copy, another view): the entries still hold
    q = dict(p, observation_cov=p["observation_cov"].clone())
    q["transition_matrix"] = p["transition_matrix"][:]
    kalman_log_likelihood(x, **p, steady_state_cache=cache)
    n = len(counted)
    _equal(kalman_log_likelihood(x, **q, steady_state_cache=cache), kalman_log_likelihood(x, **p))
    assert len(counted) == n + 1  # the uncached reference only
    # the same values in another dtype are other parameters
    q64 = kalman_log_likelihood(x, **p, steady_state_cache=cache)
    q32 = {k: v.float() for k, v in p.items()}
    got = kalman_log_likelihood(x.float(), **q32, steady_state_cache=cache)
    assert got.dtype == torch.float32
    _equal(got, kalman_log_likelihood(x.float(), **q32))
    _equal(kalman_log_likelihood(x, **p, steady_state_cache=cache), q64)


@torch.no_grad()
def test_distribution_trained_with_clipped_adam_scores_the_new_parameters():
    """A LinearGaussianSSM built from parameters that Pyro's ClippedAdam then updates (through
    ``.data``, invisible to version counters): the next ``log_prob`` is that of the new values."""
    from pyro.optim.clipped_adam import ClippedAdam

    p = random_model(3, 2, T, seed=8)
    A = torch.nn.Parameter(p["transition_matrix"].clone())
    d = LinearGaussianSSM(**dict(p, transition_matrix=A))
    x = observations(T, 2, (2,), seed=6)
    first = d.log_prob(x)
    opt = ClippedAdam([A], lr=0.05)
    A.grad = torch.ones_like(A)
    opt.step()
    assert A._version == 0  # the update went through .data
    second = d.log_prob(x)
    _equal(second, kalman_log_likelihood(x, **dict(p, transition_matrix=A.detach())))
    assert not torch.allclose(first, second)


@torch.no_grad()
def test_entries_per_length_and_bound():
    p = random_model(3, 2, T, seed=4)
    cache = SteadyStateCache(max_entries=2)
    for t in (60, 80, 100):
        x = observations(t, 2, (2,), seed=t)
        _equal(
            kalman_log_likelihood(x, **p, steady_state_cache=cache), kalman_log_likelihood(x, **p)
        )
    assert len(cache) == 2
    cache.clear()
    assert len(cache) == 0
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="max_entries must be a positive integer"):
            SteadyStateCache(max_entries=bad)


@torch.no_grad()
def test_results_never_alias_the_cache():
    p = random_model(3, 2, T, seed=5)
    x = observations(T, 2, (2,), seed=2)
    cache = SteadyStateCache()
    first = kalman_smoother(x, **p, steady_state_cache=cache)
    ref = tuple(t.clone() for t in first[:4]) + tuple(t.clone() for t in first.filtered)
    for t in tuple(first[:4]) + tuple(first.filtered):
        t.fill_(float("nan"))
    second = kalman_smoother(x, **p, steady_state_cache=cache)
    _equal(tuple(second[:4]) + tuple(second.filtered), ref)


def test_inference_tensors_are_computed_not_cached():
    p = random_model(3, 2, T, seed=6)
    x = observations(T, 2, (2,), seed=3)
    cache = SteadyStateCache()
    with torch.inference_mode():
        pi = {k: v.clone() for k, v in p.items()}
        got = kalman_log_likelihood(x, **pi, steady_state_cache=cache)
        assert len(cache) == 0
    with torch.no_grad():
        _equal(got, kalman_log_likelihood(x, **p))


@torch.no_grad()
def test_distribution_keeps_one_cache_per_instance(counted):
    p = random_model(3, 2, T, seed=7)
    d = LinearGaussianSSM(**p)
    x = observations(T, 2, (5,), seed=4)
    lp = d.log_prob(x)
    n = len(counted)
    _equal(d.log_prob(x), lp)
    sm = d.smooth(x)
    assert len(counted) == n  # log_prob, then log_prob and smooth from the cache
    _equal(lp, kalman_log_likelihood(x, **p))
    _equal(sm.means, kalman_smoother(x, **p).means)
    e = d.expand((5,))
    _equal(e.log_prob(x), lp)
    assert e.__dict__.get("_steady_cache") is not d.__dict__.get("_steady_cache")
