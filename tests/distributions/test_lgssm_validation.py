"""LinearGaussianSSM input validation: each bad input gets its own ValueError message, NaN can
be opted in as missing data, and NaN placeholders never poison values or gradients."""

import pytest
import torch
from pyro.distributions import constraints

from pyro_seq.distributions import LinearGaussianSSM
from tests.dense_gaussian import log_marginal, observed_index
from tests.ops.test_kalman import dense_of, observations, random_model

F64 = torch.float64
NAMES = (
    "initial_loc",
    "initial_cov",
    "transition_matrix",
    "transition_cov",
    "observation_matrix",
    "observation_cov",
    "control_matrix",
    "controls",
)


def assert_close(a, b):  # exact identities in float64: <= 1e-9 relative
    torch.testing.assert_close(a, b.to(a.dtype), atol=1e-9, rtol=1e-9)


def make(p, **kw):
    return LinearGaussianSSM(*(p.get(n) for n in NAMES), **kw)


# ----------------------------------------------------------------- observations


def test_nan_without_mask_names_observation_mask():
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, seed=70)
    x = observations(T, D, seed=71)
    x[2, 1] = float("nan")
    d = make(p, num_steps=T)
    msg = (
        r"observations contain 1 NaN value\(s\) at entries that are not masked \(first at "
        r"index \(2, 1\)\)\. Mark missing entries with observation_mask"
    )
    for call in (d.log_prob, d.filter, d.smooth, d.sample_posterior):
        with pytest.raises(ValueError, match=msg):
            call(x)
    with pytest.raises(ValueError, match="nan_as_missing=True"):
        d.log_prob(x)


@pytest.mark.parametrize("value", [float("inf"), -float("inf")])
def test_infinite_observations_are_refused_like_nan(value):
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, seed=72)
    x = observations(T, D, seed=73)
    x[1, 0] = value
    with pytest.raises(ValueError, match=r"1 infinite value\(s\) .* index \(1, 0\)"):
        make(p, num_steps=T).log_prob(x)
    with pytest.raises(ValueError, match="infinite values are never valid"):
        make(p, num_steps=T, nan_as_missing=True).log_prob(x)  # inf is not "missing"
    # a masked inf is a placeholder like a masked NaN
    mask = torch.ones(T, D, dtype=torch.bool)
    mask[1, 0] = False
    dense = dense_of(p, T)
    lp = make(p, num_steps=T, observation_mask=mask).log_prob(x)
    assert_close(lp, log_marginal(dense, x, observed_index(dense, mask)))


def test_nan_as_missing_equals_the_explicit_mask():
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, time_varying=True, controls=True, seed=74)
    x = observations(T, D, batch=(2,), seed=75)
    gen = torch.Generator().manual_seed(76)
    mask = torch.rand(2, T, D, generator=gen) < 0.6
    xn = x.masked_fill(~mask, float("nan"))
    d = make(p, nan_as_missing=True)
    dense = dense_of(p, T)
    lp = d.log_prob(xn)
    for i in range(2):
        assert_close(lp[i], log_marginal(dense, x[i], observed_index(dense, mask[i])))
    s, s_ref = d.smooth(xn), make(p, observation_mask=mask).smooth(x)
    assert_close(s.means, s_ref.means)
    # NaN-missing combines with a step mask by "and"
    step = torch.tensor([True, True, False, True, True, True])
    lp2 = make(p, nan_as_missing=True, step_mask=step).log_prob(xn)
    for i in range(2):
        assert_close(
            lp2[i], log_marginal(dense, x[i], observed_index(dense, mask[i] & step[:, None]))
        )


def test_zero_time_steps_are_refused():
    S, D = 2, 2
    p = random_model(S, D, 1, seed=77)
    with pytest.raises(ValueError, match=r"num_steps must be a positive integer \(T >= 1\); got 0"):
        make(p, num_steps=0)
    with pytest.raises(ValueError, match=r"observations have no time steps \(T = 0\)"):
        make(p).log_prob(torch.zeros(0, D, dtype=F64))
    with pytest.raises(ValueError, match="transition_matrix has a time dimension of size 0"):
        make({**p, "transition_matrix": torch.zeros(0, S, S, dtype=F64)})
    with pytest.raises(
        ValueError, match=r"the masks have a time dimension of size 0; T must be >= 1"
    ):
        make(p, step_mask=torch.zeros(0, dtype=torch.bool))


# ----------------------------------------------------------------- covariances


def _bad(S, kind):
    M = torch.eye(S, dtype=F64)
    if kind == "asym":
        M[0, 1] = 0.1
    elif kind == "indefinite":
        M[0, 0] = -0.5
    else:
        M[0, 0] = float("nan")
    return M


@pytest.mark.parametrize("name", ["initial_cov", "transition_cov", "observation_cov"])
def test_invalid_covariances_are_refused_with_a_message(name):
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, seed=78)
    n = D if name == "observation_cov" else S
    with pytest.raises(
        ValueError,
        match=rf"{name} is not symmetric( at index \(\d+,\))?: max \|M - M\^T\| = 0\.1 "
        r"exceeds .* not symmetrised for you",
    ):
        make({**p, name: _bad(n, "asym")}, num_steps=T)
    kind = "definite" if name == "observation_cov" else "semi-definite"
    with pytest.raises(ValueError, match=rf"{name} is not positive {kind}.*-0\.5"):
        make({**p, name: _bad(n, "indefinite")}, num_steps=T)
    with pytest.raises(ValueError, match=rf"{name} contains NaN or inf"):
        make({**p, name: _bad(n, "nan")}, num_steps=T)
    # batched or time-varying parameters: the message says which matrix
    M = torch.eye(n, dtype=F64).expand(T, n, n).clone()  # batch (initial) or time (Q, R)
    M[2, 1, 0] = 0.2
    with pytest.raises(ValueError, match=rf"{name} is not symmetric at index \(2,\)"):
        make({**p, name: M}, num_steps=T)
    # without validation nothing is checked at construction (Pyro's convention)
    make({**p, name: _bad(n, "asym")}, num_steps=T, validate_args=False)


def test_singular_R_is_refused_and_other_parameters_must_be_finite():
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, seed=79)
    R = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=F64)  # PSD, singular
    with pytest.raises(ValueError, match="observation_cov is not positive definite"):
        make({**p, "observation_cov": R}, num_steps=T)
    A = p["transition_matrix"].clone()
    A[0, 0] = float("inf")
    with pytest.raises(ValueError, match="transition_matrix contains NaN or inf"):
        make({**p, "transition_matrix": A}, num_steps=T)


def test_singular_psd_transition_and_initial_covariances_are_accepted():
    """Q = v v^T (rank 1; its smallest eigenvalue rounds below 0, so torch's own
    positive_semidefinite constraint rejects it) and a known initial state (zero covariance):
    log p(x), filter and smoother equal the dense reference."""
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, seed=80)
    v = torch.tensor([[0.3], [-0.7], [0.5]], dtype=F64)
    Q = v @ v.T
    assert torch.linalg.eigvalsh(Q)[0] < 0  # the rounding case the tolerance exists for
    assert not bool(constraints.positive_semidefinite.check(Q))
    q = {**p, "transition_cov": Q, "initial_cov": torch.zeros(S, S, dtype=F64)}
    d = make(q, num_steps=T, validate_args=True)
    x = observations(T, D, seed=81)
    dense = dense_of(q, T)
    assert_close(d.log_prob(x), log_marginal(dense, x, observed_index(dense)))
    f = d.filter(x)
    assert torch.isfinite(f.covs).all()


# ----------------------------------------------------------------- NaN gradient trap


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_nan_placeholders_give_finite_values_and_gradients(method):
    """Pyro #2654: NaN at every masked entry must not reach log_prob or any gradient. The
    gradients must also equal those with zero placeholders (masked entries are ignored)."""
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, time_varying=True, controls=True, seed=82)
    gen = torch.Generator().manual_seed(83)
    x = observations(T, D, batch=(2,), seed=84)
    mask = torch.rand(2, T, D, generator=gen) < 0.6
    mask[0, 3] = False  # a fully missing step
    offset = torch.randn(T, D, generator=gen, dtype=F64)

    def grads(placeholder, nan_as_missing):
        q = {k: v.clone().requires_grad_() for k, v in p.items()}
        d_t = offset.clone().requires_grad_()
        xv = x.masked_fill(~mask, placeholder).requires_grad_()
        kw = dict(nan_as_missing=True) if nan_as_missing else dict(observation_mask=mask)
        d = make(q, observation_offset=d_t, method=method, **kw)
        lp = (
            d.log_prob(xv).sum()
            + d.smooth(xv).means.sum()
            + d.sample_posterior(xv, noise=torch.ones(2, T, S, dtype=F64)).sum()
        )
        gs = torch.autograd.grad(lp, [*q.values(), d_t, xv])
        return lp.detach(), gs

    lp0, g0 = grads(0.0, False)
    for nan_as_missing in (False, True):
        lp, g = grads(float("nan"), nan_as_missing)
        assert torch.isfinite(lp)
        assert_close(lp, lp0)
        for a, b in zip(g, g0):
            assert torch.isfinite(a).all()
            assert_close(a, b)
        assert (g[-1][~mask] == 0).all()  # no gradient flows to a masked entry


def test_arg_constraints_use_the_same_tolerances():
    p = random_model(2, 2, 1, seed=85)
    cons = make(p).arg_constraints
    v = torch.tensor([[0.3], [-0.7]], dtype=F64)
    Q = v @ v.T  # singular PSD
    assert bool(cons["transition_cov"].check(Q)) and not bool(cons["observation_cov"].check(Q))
    asym = torch.tensor([[1.0, 0.1], [0.0, 1.0]], dtype=F64)
    assert not bool(cons["initial_cov"].check(asym))


def test_expand_keeps_masks_offset_and_nan_as_missing():
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, time_varying=True, seed=86)
    x = observations(T, D, batch=(3,), seed=87)
    x[1, 2, 0] = float("nan")
    off = torch.randn(T, D, generator=torch.Generator().manual_seed(88), dtype=F64)
    step = torch.tensor([True, False, True, True])
    d = make(p, nan_as_missing=True, observation_offset=off, step_mask=step)
    e = d.expand((3,))
    assert e.batch_shape == (3,)
    assert_close(e.log_prob(x), d.log_prob(x))
    dense = dense_of(p, T)
    dense = dense._replace(mean_x=dense.mean_x + off.reshape(-1))
    m = (~torch.isnan(x[1])) & step[:, None]
    assert_close(e.log_prob(x)[1], log_marginal(dense, x[1], observed_index(dense, m)))
