"""LinearGaussianSSM's GaussianHMM members (duration, filter, prefix_condition,
conjugate_update) against Pyro's GaussianHMM built from the same parameters (float64), against
exact identities (chain rule, product of Gaussians), and their refusals."""

import pyro.distributions as pdist
import pytest
import torch

from pyro_seq.distributions import LinearGaussianSSM
from pyro_seq.distributions.linear_gaussian_ssm import LGSSMFilterResult
from pyro_seq.ops import KalmanFilterResult
from tests.distributions.test_lgssm_gaussian_hmm import random_hmm
from tests.ops.test_kalman import observations, random_model

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


def assert_close(a, b, tol=1e-10):  # exact identities in float64
    torch.testing.assert_close(a, b.to(a.dtype), atol=tol, rtol=tol)


def likelihood(T, D, batch, kind, seed):
    """Independent Gaussian factors g_t(x_t) = N(x_t; l_t, G_t) over (T, D)."""
    gen = torch.Generator().manual_seed(seed)
    loc = torch.randn(batch + (T, D), generator=gen, dtype=F64)
    scale = 0.5 + torch.rand(batch + (T, D), generator=gen, dtype=F64)
    if kind == "normal":
        return pdist.Normal(loc, scale).to_event(2)
    W = torch.randn(batch + (T, D, D), generator=gen, dtype=F64)
    return pdist.MultivariateNormal(loc, 0.3 * W @ W.mT + scale.diag_embed()).to_event(1)


# ----------------------------------------------------------------------------- duration


def homogeneous_hmm(S, D, duration, batch=(2,), seed=0):
    """A GaussianHMM with time-constant parameters (non-zero offsets) and a given duration."""
    gen = torch.Generator().manual_seed(seed)

    def spd(n):
        W = torch.randn(n, n, generator=gen, dtype=F64)
        return 0.3 * W @ W.T / n + 0.3 * torch.eye(n, dtype=F64)

    init = pdist.MultivariateNormal(torch.randn(batch + (S,), generator=gen, dtype=F64), spd(S))
    M = 0.5 * torch.randn(batch + (1, S, S), generator=gen, dtype=F64)
    trans = pdist.MultivariateNormal(torch.randn(S, generator=gen, dtype=F64), spd(S))
    H = torch.randn(S, D, generator=gen, dtype=F64)
    obs = pdist.MultivariateNormal(torch.randn(D, generator=gen, dtype=F64), spd(D))
    return pdist.GaussianHMM(init, M, trans, H, obs, duration=duration)


def test_duration_equals_gaussian_hmm():
    T, S, D = 5, 3, 2
    durations = []
    for hmm in (
        random_hmm(S, D, T, seed=1),
        random_hmm(S, D, T, homogeneous=True, seed=2),
        homogeneous_hmm(S, D, 7, seed=3),
    ):
        d = LinearGaussianSSM.from_gaussian_hmm(hmm)
        assert d.duration == hmm.duration and d.event_shape == hmm.event_shape
        assert d.expand((4, 2)).duration == hmm.expand((4, 2)).duration
        durations.append(d.duration)
    assert durations == [T, None, 7]  # time-varying, broadcasting, homogeneous with duration
    p = random_model(S, D, T, time_varying=True, seed=4)
    assert LinearGaussianSSM(*(p.get(n) for n in NAMES)).duration == T


# ------------------------------------------------------------------------------- filter


@pytest.mark.parametrize("homogeneous", [False, True])
def test_filter_is_gaussian_hmm_final_state_posterior(homogeneous):
    T, S, D = 5, 3, 2
    hmm = random_hmm(S, D, T, homogeneous=homogeneous, seed=4)
    d = LinearGaussianSSM.from_gaussian_hmm(hmm)
    x = observations(T, D, batch=(4, 2), seed=5)
    f, post = d.filter(x), hmm.filter(x)
    assert isinstance(f, pdist.MultivariateNormal) and isinstance(f, LGSSMFilterResult)
    assert f.batch_shape == post.batch_shape == (4, 2) and f.event_shape == post.event_shape
    assert_close(f.loc, post.loc)
    assert_close(f.covariance_matrix, post.covariance_matrix)
    assert_close(f.precision_matrix, post.precision_matrix)
    assert_close(f.scale_tril, post.scale_tril)
    z = torch.randn(3, 4, 2, S, generator=torch.Generator().manual_seed(6), dtype=F64)
    assert_close(f.log_prob(z), post.log_prob(z))
    assert_close(f.entropy(), post.entropy())
    e = f.expand((5, 4, 2))
    assert e.batch_shape == (5, 4, 2) and isinstance(e, LGSSMFilterResult)
    assert_close(e.log_prob(z[0]), post.log_prob(z[0]).expand(5, 4, 2))
    # as initial_dist of a further GaussianHMM segment, as Pyro documents for its filter
    M = torch.randn(S, S, generator=torch.Generator().manual_seed(7), dtype=F64) / S
    noise = pdist.MultivariateNormal(torch.zeros(S, dtype=F64), torch.eye(S, dtype=F64))
    H = torch.ones(S, D, dtype=F64)
    obs = pdist.MultivariateNormal(torch.zeros(D, dtype=F64), torch.eye(D, dtype=F64))
    x2 = observations(3, D, batch=(4, 2), seed=8)
    assert_close(
        pdist.GaussianHMM(f, M, noise, H, obs).log_prob(x2),
        pdist.GaussianHMM(post, M, noise, H, obs).log_prob(x2),
    )


def test_filter_keeps_every_step_for_existing_callers():
    T, S, D = 4, 2, 3
    p = random_model(S, D, T, time_varying=True, controls=True, seed=9)
    d = LinearGaussianSSM(*(p.get(n) for n in NAMES))
    x = observations(T, D, batch=(2,), seed=10)
    f = d.filter(x)
    assert isinstance(f.result, KalmanFilterResult)
    assert f.means.shape == (2, T, S) and f.covs.shape == (2, T, S, S)
    assert f.log_likelihoods.shape == (2, T)
    assert_close(f.log_likelihoods.sum(-1), d.log_prob(x))
    assert_close(f.loc, f.means[:, -1])
    means, covs, pm, pc, ll = f  # unpacks like the KalmanFilterResult it used to be
    for a, b in zip((means, covs, pm, pc, ll), f.result):
        assert a is b
    assert f[3] is f.predicted_covs and f[-1] is f.log_likelihoods


def test_filter_with_singular_final_covariance_refuses_density_only():
    # z_t = z_{t-1} exactly, known z_1: Cov(z_T | x) = 0, which the filter moments allow
    T, S, D = 3, 2, 2
    eye = torch.eye(S, dtype=F64)
    d = LinearGaussianSSM(
        torch.tensor([1.0, -2.0], dtype=F64),
        torch.zeros(S, S, dtype=F64),
        eye,
        torch.zeros(S, S, dtype=F64),
        torch.ones(D, S, dtype=F64),
        torch.eye(D, dtype=F64),
        num_steps=T,
    )
    f = d.filter(observations(T, D, seed=11))
    assert_close(f.loc, torch.tensor([1.0, -2.0], dtype=F64))
    assert bool((f.covariance_matrix == 0).all())
    with pytest.raises(
        ValueError,
        match=r"filtered covariance Cov\(z_T \| x_\{1:T\}\) is "
        r"singular .* use \.loc and \.covariance_matrix",
    ):
        f.log_prob(torch.zeros(S, dtype=F64))


# --------------------------------------------------------------------- prefix_condition


@pytest.mark.parametrize("homogeneous", [False, True])
@pytest.mark.parametrize("t", [1, 3, 5])
def test_prefix_condition_equals_gaussian_hmm(t, homogeneous):
    T, S, D = 6, 3, 2
    hmm = homogeneous_hmm(S, D, T, seed=12) if homogeneous else random_hmm(S, D, T, seed=12)
    d = LinearGaussianSSM.from_gaussian_hmm(hmm)
    x = observations(T, D, batch=(4, 2), seed=13)
    right, ref = d.prefix_condition(x[..., :t, :]), hmm.prefix_condition(x[..., :t, :])
    assert right.duration == ref.duration == T - t
    assert right.batch_shape == ref.batch_shape and right.event_shape == ref.event_shape
    y = x[..., t:, :]
    assert_close(right.log_prob(y), ref.log_prob(y))
    assert_close(right.filter(y).loc, ref.filter(y).loc)
    assert_close(right.filter(y).covariance_matrix, ref.filter(y).covariance_matrix)


@pytest.mark.parametrize("t", [1, 4])
def test_prefix_condition_is_the_chain_rule_with_masks_controls_and_offsets(t):
    # log p(x_{t+1:T} | x_{1:t}) = sum_{s > t} log p(x_s | x_{1:s-1}) over the observed entries
    T, S, D = 6, 3, 2
    p = random_model(S, D, T, time_varying=True, controls=True, seed=14)
    gen = torch.Generator().manual_seed(15)
    mask = torch.rand(2, T, D, generator=gen) < 0.7
    mask[0, 1] = False
    offset = torch.randn(T, D, generator=gen, dtype=F64)
    d = LinearGaussianSSM(
        *(p.get(n) for n in NAMES), observation_mask=mask, observation_offset=offset
    )
    x = observations(T, D, batch=(2,), seed=16)
    x = torch.where(mask, x, torch.full_like(x, float("nan")))  # masked values never matter
    right = d.prefix_condition(x[:, :t])
    assert right.batch_shape == (2,) and right.event_shape == (T - t, D)
    ll = d.filter(x).log_likelihoods
    assert_close(right.log_prob(x[:, t:]), ll[:, t:].sum(-1))
    assert torch.equal(right.observation_mask, mask[:, t:])


def test_prefix_condition_refusals():
    S, D = 2, 2
    hmm = random_hmm(S, D, batch=(), homogeneous=True, seed=17)
    d = LinearGaussianSSM.from_gaussian_hmm(hmm)
    with pytest.raises(
        ValueError,
        match="prefix_condition needs the model's length T .* "
        "construct the LinearGaussianSSM with num_steps=T",
    ):
        d.prefix_condition(observations(3, D))
    d5 = LinearGaussianSSM.from_gaussian_hmm(hmm, num_steps=5)
    for t in (5, 6):
        with pytest.raises(ValueError, match=rf"1 <= t < T = 5 .* data has t = {t}"):
            d5.prefix_condition(observations(t, D))
    with pytest.raises(ValueError, match=r"data of shape \(\.\.\., t, 2\); got \(3, 3\)"):
        d5.prefix_condition(observations(3, 3))


# --------------------------------------------------------------------- conjugate_update


@pytest.mark.parametrize("kind", ["normal", "mvn"])
@pytest.mark.parametrize("homogeneous", [False, True])
def test_conjugate_update_equals_gaussian_hmm(kind, homogeneous):
    T, S, D = 5, 3, 2
    hmm = random_hmm(S, D, T, homogeneous=homogeneous, seed=18)
    d = LinearGaussianSSM.from_gaussian_hmm(hmm)
    g = likelihood(T, D, (3, 1), kind, seed=19)
    new, log_z = d.conjugate_update(g)
    ref, ref_log_z = hmm.conjugate_update(g)
    assert new.batch_shape == ref.batch_shape == (3, 2)
    assert new.event_shape == ref.event_shape and new.duration == T
    assert_close(log_z, ref_log_z)
    x = observations(T, D, batch=(3, 2), seed=20)
    assert_close(new.log_prob(x), ref.log_prob(x))
    assert_close(new.filter(x).loc, ref.filter(x).loc)
    assert_close(new.filter(x).covariance_matrix, ref.filter(x).covariance_matrix)
    # Pyro's defining identity, with each side computed independently
    assert_close(d.log_prob(x) + g.log_prob(x), new.log_prob(x) + log_z)


@pytest.mark.parametrize("T", [1, 4])
def test_conjugate_update_identity_with_control_matrix_and_offsets(T):
    # f(x) g(x) = fg(x) Z at several x, fg normalised: fixes both fg and Z
    S, D = 3, 2
    p = random_model(S, D, T, time_varying=True, controls=True, seed=21)
    offset = torch.randn(T, D, generator=torch.Generator().manual_seed(22), dtype=F64)
    d = LinearGaussianSSM(*(p.get(n) for n in NAMES), observation_offset=offset)
    g = likelihood(T, D, (2,), "mvn", seed=23)
    new, log_z = d.conjugate_update(g)
    assert new.batch_shape == log_z.shape == (2,)
    x = observations(T, D, batch=(4, 2), seed=24)
    assert_close(d.log_prob(x) + g.log_prob(x), new.log_prob(x) + log_z)
    # the normaliser is log N(l; E x, Cov x + G): the same model with R + G at l
    Rg = LinearGaussianSSM(
        *(p.get(n) for n in NAMES[:5]),
        p["observation_cov"] + g.base_dist.covariance_matrix,
        *(p.get(n) for n in NAMES[6:]),
        observation_offset=offset,
    )
    assert_close(log_z, Rg.log_prob(g.base_dist.loc))


def test_conjugate_update_refusals():
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, time_varying=True, seed=25)
    d = LinearGaussianSSM(*(p.get(n) for n in NAMES))
    with pytest.raises(
        TypeError,
        match=r"conjugate_update expects other = Independent\(Normal, "
        r"2\) or Independent\(MultivariateNormal, 1\)",
    ):
        d.conjugate_update(pdist.Normal(torch.zeros(T, D, dtype=F64), 1.0))
    with pytest.raises(TypeError, match=r"got Independent\(Normal, 1\)$"):
        d.conjugate_update(pdist.Normal(torch.zeros(T, D, dtype=F64), 1.0).to_event(1))
    with pytest.raises(ValueError, match=r"other.event_shape == \(T, D\) = \(4, 2\); got \(3, 2\)"):
        d.conjugate_update(likelihood(3, D, (), "normal", seed=26))
    masked = LinearGaussianSSM(
        *(p.get(n) for n in NAMES), step_mask=torch.tensor([True, False, True, True])
    )
    msg = (
        r"^LinearGaussianSSM.conjugate_update is not implemented for a model with "
        r"observation_mask, step_mask or nan_as_missing, because masked entries are left out "
        r"of log_prob so the product with other is no density over all of x; call it on the "
        r"same model built without masks.$"
    )
    with pytest.raises(NotImplementedError, match=msg):
        masked.conjugate_update(likelihood(T, D, (), "normal", seed=27))
