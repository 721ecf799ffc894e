"""The steady-state path of ``method="auto"`` (pyro_seq.ops.kalman_steady): time-invariant
parameters shared by the batch, no mask, no autograd. Its results must equal the dense
Gaussian of tests/dense_gaussian.py to 1e-12, and every case it does not cover (masks,
time-varying or batched parameters, gradients, singular filtered covariances) must fall back
to the general passes with the same results."""

import pytest
import torch

import pyro_seq.ops.kalman as kalman
import pyro_seq.ops.kalman_steady as steady
from pyro_seq.ops import kalman_filter, kalman_smoother
from tests.dense_gaussian import block, condition_z, log_marginal, observed_index
from tests.ops.test_kalman import dense_of, observations, random_model

F64 = torch.float64
T_LONG = 120  # >= PARALLEL_THRESHOLD and well past the steady state of random_model


def _close(a, b, tol=1e-12):
    torch.testing.assert_close(a, b.to(a.dtype), atol=tol, rtol=tol)


def _prepared(p, x, mask=None):
    return kalman._prepare(x, **p, mask=mask, validate_args=False)


@pytest.mark.parametrize("controls", [False, True])
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_steady_path_matches_dense(controls, batch):
    T, S, D = T_LONG, 3, 2
    p = random_model(S, D, T, controls=controls, seed=2)
    x = observations(T, D, batch, seed=5)
    with torch.no_grad():
        mdl = _prepared(p, x)
        assert steady.steady_applicable(mdl, kalman.STEADY_STATE_TOL)
        fast = steady.steady_filter(mdl, kalman.STEADY_STATE_TOL)
        assert fast is not None and fast[-1] < T  # the steady path is taken
        f = kalman_filter(x, **p)
        s = kalman_smoother(x, **p)
    dense = dense_of(p, T)
    xs = x.reshape(-1, T, D)
    fm, fll = f.means.reshape(-1, T, S), f.log_likelihoods.reshape(-1, T)
    sm = s.means.reshape(-1, T, S)
    mean, cov = condition_z(dense, xs[0], observed_index(dense))
    for i in range(xs.shape[0]):
        mean, cov = condition_z(dense, xs[i], observed_index(dense))
        _close(sm[i], mean)
        _close(fll[i].sum(), log_marginal(dense, xs[i], observed_index(dense)), 1e-11)
        for t in (0, 1, T // 2, T - 1):
            fmean, fcov = condition_z(dense, xs[i], observed_index(dense, upto=t + 1))
            _close(fm[i, t], fmean[t])
            if i == 0:
                _close(f.covs.reshape(-1, T, S, S)[0, t], block(fcov, S, t, t))
                _close(s.covs.reshape(-1, T, S, S)[0, t], block(cov, S, t, t))
                if t < T - 1:
                    _close(s.cross_covs.reshape(-1, T - 1, S, S)[0, t], block(cov, S, t + 1, t))


def _general(x, p, fn, **kw):
    return fn(x, **p, method="sequential", steady_state_tol=0.0, **kw)


def _assert_same(a, b, tol=1e-12):
    for name in a._fields:
        va, vb = getattr(a, name), getattr(b, name)
        if isinstance(va, tuple):
            _assert_same(va, vb, tol)
        else:
            _close(va, vb, tol)


def test_steady_path_equals_full_recursion_long():
    """T = 1000 (the benchmark size), state 4, obs 2: every output of the steady path equals
    the full sequential recursion without the shortcut."""
    p = random_model(4, 2, 1000, seed=7)
    x = observations(1000, 2, (5,), seed=8)
    with torch.no_grad():
        _assert_same(kalman_smoother(x, **p), _general(x, p, kalman_smoother), 1e-11)


def fallback_case(case, T=T_LONG, S=3, D=2):
    """A model and data (``(p, x, kw)``, ``kw`` the mask argument) that the steady-state paths
    do not cover: a per-sequence or shared mask, time-varying or batched parameters, or a
    sequence shorter than the parallel threshold (``"short"``, T = 20)."""
    if case == "time_varying":
        p = random_model(S, D, T, time_varying=True, seed=3)
    elif case == "batched_params":
        p = random_model(S, D, T, batch=(2,), seed=3)
    else:
        p = random_model(S, D, T, seed=3)
    if case == "short":
        T = 20
    x = observations(T, D, (2,), seed=6)
    kw = {}
    if case == "mask":
        kw["mask"] = torch.rand(2, T, generator=torch.Generator().manual_seed(0)) > 0.3
    elif case == "shared_mask":
        kw["mask"] = torch.rand(T, generator=torch.Generator().manual_seed(0)) > 0.3
    return p, x, kw


@pytest.mark.parametrize("case", ["mask", "time_varying", "batched_params", "shared_mask"])
def test_fallback_cases_equal_general_path(case):
    p, x, kw = fallback_case(case)
    with torch.no_grad():
        assert not steady.steady_applicable(_prepared(p, x, kw.get("mask")), 8.0)
        _assert_same(kalman_smoother(x, **p, **kw), _general(x, p, kalman_smoother, **kw))


def test_singular_filtered_covariance_falls_back():
    """Q = 0 and a rank-one initial covariance: the filtered covariance is singular, the
    joint Cholesky fails and the general path gives the result."""
    T, S, D = 40, 2, 1
    p = dict(
        initial_loc=torch.zeros(S, dtype=F64),
        initial_cov=torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=F64),
        transition_matrix=torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=F64),
        transition_cov=torch.zeros(S, S, dtype=F64),
        observation_matrix=torch.tensor([[1.0, 0.0]], dtype=F64),
        observation_cov=torch.tensor([[0.5]], dtype=F64),
    )
    x = observations(T, D, seed=2)
    with torch.no_grad():
        assert steady.joint_covariance_pass(_prepared(p, x), 8.0) is None
        _assert_same(kalman_filter(x, **p), _general(x, p, kalman_filter), 1e-10)


def test_gradients_use_the_general_path_and_match_dense():
    """With autograd the steady shortcut is off (its repeated covariances would drop the
    derivative of the transient): gradients of log p(x) equal those of the dense Gaussian."""
    T, S, D = 40, 2, 2
    p = random_model(S, D, T, seed=4)
    x = observations(T, D, seed=3)
    A = p["transition_matrix"].clone().requires_grad_()
    assert not steady.steady_applicable(_prepared(dict(p, transition_matrix=A), x), 8.0)
    lp = kalman_filter(x, **dict(p, transition_matrix=A)).log_likelihoods.sum()
    (grad,) = torch.autograd.grad(lp, A)
    A2 = p["transition_matrix"].clone().requires_grad_()
    dense = dense_of(dict(p, transition_matrix=A2), T)
    (grad_dense,) = torch.autograd.grad(log_marginal(dense, x, observed_index(dense)), A2)
    _close(grad, grad_dense, 1e-10)


@pytest.mark.parametrize("S, D, seed", [(4, 2, 0), (3, 2, 1), (2, 1, 2), (8, 3, 3)])
def test_lifted_riccati_equals_stepwise(S, D, seed, monkeypatch):
    """The lifted Riccati recursion (one factorisation per LIFT steps, then the inner steps
    batched over blocks) gives the covariances, innovation factors and gains of the
    one-step-at-a-time recursion to 1e-13 up to the steady state; the model is small enough
    that the lifted form is taken (the stepwise one is made to fail)."""
    T = 400
    p = random_model(S, D, T, seed=seed)
    x = observations(T, D, (2,), seed=seed)
    with torch.no_grad():
        mdl = _prepared(p, x)
        monkeypatch.setattr(steady, "LIFT_MAX_SIZE", 0)
        ref = steady.joint_covariance_pass(mdl, 8.0)
        monkeypatch.undo()

        def no_stepwise(*args):
            raise AssertionError("the lifted form fell back to the stepwise one")

        monkeypatch.setattr(steady, "_stepwise_joint", no_stepwise)
        got = steady.joint_covariance_pass(mdl, 8.0)
    assert ref[-1] < T and got[-1] < T
    u = min(ref[-1], got[-1]) + 1
    for a, b in zip(got[:4], ref[:4]):
        _close(a[:u], b[:u], 1e-13)
        _close(a[-1], b[-1], 1e-13)  # both steady states
