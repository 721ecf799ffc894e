"""estimate_log_likelihood: per-sequence IWAE / SMC estimates against exact log p(x).

Float64 throughout, so that the identities that are exact in exact arithmetic (the exact
posterior as proposal gives every importance weight the value p(x)) are checked at <= 1e-9
relative against the Kalman filter's log p(x).
"""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_seq.infer import estimate_log_likelihood
from pyro_seq.models.linear_gaussian import LinearGaussianSequenceModel
from tests.infer._lg import make_data, make_model

LENGTHS = [6, 3, 1, 5]


pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def _seqs(x, mask):
    return [x[b, : int(mask[b].sum())] for b in range(x.shape[0])]


def _rel(a, b):
    return ((a - b).abs() / b.abs()).max().item()


@pytest.mark.parametrize("method", ["iwae", "smc"])
def test_exact_guide_gives_exact_estimates_in_every_format(method):
    # exact posterior proposal: every weight is p(x) (thesis eq. 2.13), so the estimate is
    # log p(x) up to rounding. Measured (float64): <= 6e-16 relative (float32, the former test
    # at atol 2e-4: 5e-8 iwae, 1.4e-7 smc)
    m = make_model(guide="smoothing")
    x, mask = make_data(m, LENGTHS)
    exact = m.exact_log_likelihood(x, mask)
    kw = dict(method=method, num_particles=3, resample="never")
    for data, bs in (
        ((x, mask), None),
        (_seqs(x, mask), 3),
        ([(x[:2], mask[:2]), (x[2:], mask[2:])], 1),
    ):
        est = estimate_log_likelihood(m.model, m.guide, data, batch_size=bs, **kw)
        assert _rel(est.per_sequence, exact) <= 1e-9  # order and lengths preserved
        assert est.lengths.tolist() == LENGTHS and est.num_steps == sum(LENGTHS)
        # the summaries against the exact log-likelihood (not against each other)
        assert abs(est.total - exact.sum().item()) <= 1e-9 * abs(exact.sum().item())
        exact_per_step = exact.sum().item() / sum(LENGTHS)
        assert abs(est.nats_per_step - exact_per_step) <= 1e-9 * abs(exact_per_step)
        assert est.method == method and est.num_particles == 3
        assert f"{method} (K=3)" in str(est) and est.as_dict()["num_particles"] == 3
        assert est.as_dict()["num_sequences"] == len(LENGTHS)


def test_particle_chunks_combine_to_one_estimate():
    # measured: 3e-16 relative (float32: 4e-8)
    m = make_model(guide="smoothing")
    x, mask = make_data(m, LENGTHS)
    est = estimate_log_likelihood(
        m.model, m.guide, (x, mask), num_particles=10, particles_per_pass=3
    )
    assert _rel(est.per_sequence, m.exact_log_likelihood(x, mask)) <= 1e-9
    # and with an inexact proposal the chunked estimate is the same function of the same 10
    # weights as one pass (same random numbers: the chunks draw 3 + 3 + 3 + 1 particles)
    m = make_model(guide="optimal")
    torch.manual_seed(0)
    a = estimate_log_likelihood(m.model, m.guide, (x, mask), num_particles=2, particles_per_pass=1)
    torch.manual_seed(0)
    b1 = estimate_log_likelihood(m.model, m.guide, (x, mask), num_particles=1).per_sequence
    b2 = estimate_log_likelihood(m.model, m.guide, (x, mask), num_particles=1).per_sequence
    log_mean = torch.logsumexp(torch.stack([b1, b2]), 0) - torch.log(torch.tensor(2.0))
    assert _rel(a.per_sequence, log_mean) <= 1e-12


@pytest.mark.parametrize("method", ["iwae", "smc"])
def test_estimates_are_close_to_log_likelihood(method):
    # optimal proposal, K = 64, 100 copies of 4 sequences: the mean estimate is not above
    # log p(x) (Jensen; 3 standard errors) and within 0.1 nats of it (measured: |gap| <= 0.012
    # nats per sequence with standard errors <= 0.012, for both methods)
    m = make_model(guide="optimal")
    x, mask = make_data(m, LENGTHS)
    R = 100
    xs, masks = x.repeat(R, 1, 1), mask.repeat(R, 1)
    torch.manual_seed(0)
    est = estimate_log_likelihood(m.model, m.guide, (xs, masks), method=method, num_particles=64)
    per = est.per_sequence.reshape(R, 4)
    exact = m.exact_log_likelihood(x, mask)
    gap = exact - per.mean(0)
    se = per.std(0) / R**0.5
    # 1e-9 |log p|: float64 rounding (the T = 1 sequence is estimated exactly, se = 0)
    assert (gap > -3 * se - 1e-9 * exact.abs()).all(), (gap, se)
    assert (gap < 0.1).all(), gap


class _NoRsampleMVN(dist.MultivariateNormal):
    has_rsample = False


class _NonReparamSmoothingLG(LinearGaussianSequenceModel):
    """The exact-posterior (smoothing) proposal drawn from a site without rsample."""

    def guide_step(self, state, t, x, mask):
        G, g, tril = state.shared["G"][:, t], state.shared["g"][:, t], state.shared["tril"][:, t]
        prior_loc = self._prior_loc(state, t, "guide_z")
        loc = (G @ prior_loc.unsqueeze(-1)).squeeze(-1) + g
        loc = loc.expand(torch.broadcast_shapes(loc.shape, (x.shape[0], self.state_dim)))
        state["guide_z"] = pyro.sample(
            f"z_{t + 1}", _NoRsampleMVN(loc, scale_tril=tril).mask(mask[:, t])
        )


def test_smc_accepts_a_non_reparameterized_guide():
    # evaluation needs no gradient: FIVO's training objective refuses this guide, the SMC
    # estimator (FIVO.log_z) does not, and gives the exact log p(x) for the exact posterior
    base = make_model(guide="smoothing")
    m = _NonReparamSmoothingLG(2, 2, A=base.A, C=base.C, Q=base.Q, R=base.R, learnable=False)
    x, mask = make_data(m, LENGTHS)
    est = estimate_log_likelihood(
        m.model, m.guide, (x, mask), method="smc", num_particles=3, resample="never"
    )
    assert _rel(est.per_sequence, m.exact_log_likelihood(x, mask)) <= 1e-9


def test_default_smc_resampling_is_systematic_ess():
    m = make_model(guide="prior")
    x, mask = make_data(m, LENGTHS)
    out = {}
    for key, kw in [
        ("default", {}),
        ("explicit", dict(resample="ess", ess_threshold=0.5, resampling="systematic")),
        ("multinomial", dict(resampling="multinomial")),
    ]:
        torch.manual_seed(5)
        est = estimate_log_likelihood(
            m.model, m.guide, (x, mask), method="smc", num_particles=8, **kw
        )
        out[key] = est.per_sequence
    assert torch.equal(out["default"], out["explicit"]) and not torch.equal(
        out["default"], out["multinomial"]
    )


def test_errors():
    m = make_model()
    x, mask = make_data(m, [3])
    with pytest.raises(ValueError, match="method"):
        estimate_log_likelihood(m.model, m.guide, (x, mask), method="exact")
    with pytest.raises(ValueError):
        estimate_log_likelihood(m.model, m.guide, (x, mask), num_particles=0)
    with pytest.raises(TypeError, match="step protocol"):
        estimate_log_likelihood(lambda x, mask=None: None, m.guide, (x, mask), method="smc")
    with pytest.raises(TypeError):
        estimate_log_likelihood(m.model, m.guide, [1, 2, 3])
    with pytest.raises(ValueError, match="resampling must be one of"):
        estimate_log_likelihood(m.model, m.guide, (x, mask), method="smc", resampling="residual")
