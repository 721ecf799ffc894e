"""LinearGaussianSequenceModel: exact likelihood, exact/optimal/bootstrap proposals, particles."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.models.linear_gaussian import LinearGaussianSequenceModel
from pyro_seq.ops.state import SequenceState
from tests.infer._lg import make_data, make_model

LENGTHS = [6, 3, 1, 5]


def assert_close(a, b):  # exact identities in float64: <= 1e-9 relative
    torch.testing.assert_close(a, b.to(a.dtype), atol=1e-9, rtol=1e-9)


def make_model64(**kw):
    """``make_model`` and its data, both in float64 (the identities below are exact in exact
    arithmetic, so float64 rounding lets them be tested at 1e-9)."""
    lengths = kw.pop("lengths", LENGTHS)
    m = make_model(**kw)
    x, mask = make_data(m, lengths)
    return m.double(), x.double(), mask


def _log_weights(m, x, mask, K):
    """Per-(particle, sequence) log p(x, z) - log q(z) with z ~ guide, K particles at dim -2."""
    with pyro.plate("particles", K, dim=-2):
        gtr = pyro.poutine.trace(m.guide).get_trace(x, mask)
        mtr = pyro.poutine.trace(pyro.poutine.replay(m.model, trace=gtr)).get_trace(x, mask)
    gtr.compute_log_prob()
    mtr.compute_log_prob()
    lw = 0.0
    for tr, sign in ((mtr, 1.0), (gtr, -1.0)):
        for site in tr.nodes.values():
            if site["type"] == "sample":
                lw = lw + sign * site["log_prob"]
    return lw  # (K, B)


def test_kalman_and_dense_likelihoods_agree_on_ragged_batch():
    m = make_model(obs_dim=3, state_dim=2)
    x, mask = make_data(m, LENGTHS)
    kal = m.exact_log_likelihood(x, mask)
    dense = m.exact_log_likelihood(x, mask, method="dense")
    assert kal.dtype == torch.float64 and kal.shape == (4,)
    assert torch.allclose(kal, dense, atol=1e-8, rtol=0)
    # a ragged sequence's value is that of the truncated sequence
    assert torch.allclose(kal[1], m.exact_log_likelihood(x[1:2, :3])[0], atol=1e-10)


def test_kalman_likelihood_with_batch_equal_to_length_and_obs_dim():
    # B == T == D: the per-step (B, T) mask must not be read as a per-element (T, D) one
    m = make_model(obs_dim=3, state_dim=2)
    x, mask = make_data(m, [3, 2, 1])
    assert x.shape == (3, 3, 3)
    assert_close(m.exact_log_likelihood(x, mask), m.exact_log_likelihood(x, mask, method="dense"))


def test_dense_likelihood_single_step_closed_form():
    m = make_model(obs_dim=2, state_dim=3).double()
    x = torch.randn(2, 1, 2, dtype=torch.float64)
    cov = m.C @ m.init_cov @ m.C.T + m.R
    ref = dist.MultivariateNormal(m.C @ m.init_loc, covariance_matrix=cov).log_prob(x[:, 0])
    assert_close(m.exact_log_likelihood(x, method="dense"), ref)


@pytest.mark.parametrize("K", [1, 5])
def test_smoothing_guide_is_exact_posterior(K):
    # w = p(x, z) / q(z) equals p(x) for every z iff q(z) = p(z | x). Exact identity, so
    # float64 at 1e-9 relative (was float32 at atol 2e-4; measured: 3.8e-6 abs in float32,
    # 1.4e-14 abs / 6.6e-16 rel in float64)
    m, x, mask = make_model64(guide="smoothing", obs_dim=2, state_dim=3)
    lw = _log_weights(m, x, mask, K)
    assert lw.shape == (K, 4) and lw.dtype == torch.float64
    assert_close(lw, m.exact_log_likelihood(x, mask).expand(K, 4))


def test_smoothing_guide_exact_with_time_varying_structure():
    # non-diagonal noise, 1-d observations of a 3-d state (weakly observed)
    g = torch.Generator().manual_seed(3)
    Lq = torch.tril(torch.randn(3, 3, generator=g)) * 0.3 + torch.eye(3) * 0.5
    m = LinearGaussianSequenceModel(
        1,
        3,
        A=0.9 * torch.eye(3) + 0.05 * torch.randn(3, 3, generator=g),
        C=torch.randn(1, 3, generator=g),
        Q=Lq @ Lq.T,
        R=torch.tensor([[0.2]]),
        init_loc=torch.tensor([1.0, -1.0, 0.5]),
        learnable=False,
        guide="smoothing",
    )
    x, mask = make_data(m, [8, 8])
    lw = _log_weights(m, x, mask, 3)
    assert torch.allclose(lw, m.exact_log_likelihood(x, mask).float().expand(3, 2), atol=5e-4)


def test_optimal_guide_weights_are_predictive_likelihoods():
    # the locally optimal proposal's weight at t is p(x_t | z_{t-1}), independent of z_t:
    # for T = 1 it is p(x_1) exactly; for T = 2 it is p(x_1) + log N(x_2; C A z_1, C Q C^T + R)
    m = make_model(guide="optimal", obs_dim=2, state_dim=3)
    x, mask = make_data(m, [2, 2, 2])
    lw1 = _log_weights(m, x[:, :1], mask[:, :1], 4)
    exact1 = m.exact_log_likelihood(x[:, :1]).float()
    assert torch.allclose(lw1, exact1.expand(4, 3), atol=1e-4)
    with pyro.plate("particles", 4, dim=-2):
        gtr = pyro.poutine.trace(m.guide).get_trace(x, mask)
        mtr = pyro.poutine.trace(pyro.poutine.replay(m.model, trace=gtr)).get_trace(x, mask)
    lw = sum(
        s["fn"].log_prob(s["value"]) for s in mtr.nodes.values() if s["type"] == "sample"
    ) - sum(s["fn"].log_prob(s["value"]) for s in gtr.nodes.values() if s["type"] == "sample")
    z1 = gtr.nodes["z_1"]["value"]
    pred = dist.MultivariateNormal(z1 @ m.A.T @ m.C.T, covariance_matrix=m.C @ m.Q @ m.C.T + m.R)
    assert torch.allclose(lw, exact1 + pred.log_prob(x[:, 1]), atol=1e-4)


def test_prior_guide_weights_are_the_emission_densities():
    # bootstrap proposal: log w = sum_t log N(x_t; C z_t, R) over observed steps (the
    # transition terms cancel), with z the guide's draws; checked against torch's density
    m, x, mask = make_model64(guide="prior", lengths=[3, 2])
    pyro.set_rng_seed(0)
    lw = _log_weights(m, x, mask, 4)
    pyro.set_rng_seed(0)  # the same guide draws as inside _log_weights
    with pyro.plate("particles", 4, dim=-2):
        gtr = pyro.poutine.trace(m.guide).get_trace(x, mask)
    ref = 0.0
    for t in range(3):
        z = gtr.nodes[f"z_{t + 1}"]["value"]  # (4, B, S)
        lp = torch.distributions.MultivariateNormal(z @ m.C.T, covariance_matrix=m.R).log_prob(
            x[:, t]
        )
        ref = ref + torch.where(mask[:, t], lp, torch.zeros_like(lp))
    assert_close(lw, ref)


@pytest.mark.parametrize("guide", ["prior", "optimal", "smoothing"])
def test_steps_broadcast_over_particles(guide):
    # state tensors (K, batch, S) with x (batch, T, D): every step keeps the particle dim
    m = make_model(guide=guide, obs_dim=2, state_dim=3)
    x, mask = make_data(m, [4, 2])
    K, B = 7, 2
    state = SequenceState()
    with pyro.plate("sequences", B, dim=-1), pyro.plate("particles", K, dim=-2):
        m.guide_init(state, x, mask)
        m.model_init(state, x, mask)
        for t in range(4):
            m.guide_step(state, t, x, mask)
            m.model_step(state, t, x, mask)
            assert state["z"].shape == (K, B, 3) and state["guide_z"].shape == (K, B, 3)
    state.resample(torch.randint(K, (K, B)))  # per-particle tensors resample cleanly
    assert state["z"].shape == (K, B, 3)


def test_masked_steps_contribute_zero():
    m = make_model(guide="prior")
    x, mask = make_data(m, [5, 2])
    tr = pyro.poutine.trace(m.model).get_trace(x, mask)
    tr.compute_log_prob()
    for t in range(2, 5):
        assert (
            tr.nodes[f"x_{t + 1}"]["log_prob"][1] == 0
            and tr.nodes[f"z_{t + 1}"]["log_prob"][1] == 0
        )
        assert tr.nodes[f"x_{t + 1}"]["log_prob"][0] != 0


def test_parameters_learnable_and_fixed():
    Q = torch.tensor([[0.5, 0.1], [0.1, 0.3]])
    m = LinearGaussianSequenceModel(2, 2, Q=Q, learnable=False)
    assert list(m.parameters()) == []
    assert torch.allclose(m.Q, Q, atol=1e-6)
    m = LinearGaussianSequenceModel(2, 2, Q=Q, learnable=("A", "Q"))
    names = {n for n, _ in m.named_parameters()}
    assert names == {"A", "_Q_raw"}
    assert torch.allclose(m.Q, Q, atol=1e-6)
    # gradients reach the learnable parameters through SVI's loss
    x, mask = make_data(m, [3, 3])
    Trace_ELBO().loss_and_grads(m.model, m.guide, x, mask)
    assert m.A.grad is not None and m._Q_raw.grad.abs().sum() > 0


def test_smoothing_elbo_gradient_is_exact_likelihood_gradient():
    # With the exact posterior as guide (which depends on the parameters), the single-sample
    # ELBO is log p(x) for every draw, so its gradient is grad log p(x) (Kalman filter).
    from pyro_seq.ops.kalman import kalman_filter

    # Exact identity, so float64 at 1e-9 relative (was float32 at atol = rtol = 1e-3;
    # measured max |g_elbo - g| / max |g|: 4.8e-6 in float32, 7.8e-15 in float64).
    m, x, mask = make_model64(
        guide="smoothing", learnable=True, obs_dim=2, state_dim=2, lengths=[5, 3]
    )
    Trace_ELBO().loss_and_grads(m.model, m.guide, x, mask)
    g_elbo = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    ll = kalman_filter(
        x,
        m.init_loc,
        m.init_cov,
        m.A,
        m.Q,
        m.C,
        m.R,
        mask=mask.unsqueeze(-1).expand(x.shape),
        method="sequential",
    ).log_likelihoods.sum()
    (-ll).backward()
    for n, p in m.named_parameters():
        assert p.grad.abs().max() > 1e-3, n  # a non-trivial gradient to compare
        torch.testing.assert_close(
            g_elbo[n], p.grad, atol=1e-9 * p.grad.abs().max().item(), rtol=1e-9, msg=n
        )


def test_validation():
    with pytest.raises(ValueError, match="guide"):
        LinearGaussianSequenceModel(2, 2, guide="bogus")
    with pytest.raises(ValueError, match="shape"):
        LinearGaussianSequenceModel(2, 2, A=torch.eye(3))
    with pytest.raises(ValueError, match="learnable"):
        LinearGaussianSequenceModel(2, 2, learnable=("B",))
    with pytest.raises(ValueError, match="Q must be a symmetric positive definite matrix"):
        LinearGaussianSequenceModel(2, 2, Q=-torch.eye(2))
    with pytest.raises(ValueError, match="R must be a symmetric positive definite matrix"):
        LinearGaussianSequenceModel(2, 2, R=torch.tensor([[1.0, 0.5], [0.0, 1.0]]))
    m = make_model()
    with pytest.raises(ValueError, match="method"):
        m.exact_log_likelihood(torch.zeros(1, 2, 2), method="bogus")
    assert math.isfinite(float(m.exact_log_likelihood(torch.zeros(1, 2, 2))[0]))
