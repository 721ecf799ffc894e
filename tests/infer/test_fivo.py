"""FIVO: special cases (K=1 = ELBO, never = IWAE), masks, scales, arguments, errors.

Float64 throughout: identities that are exact in exact arithmetic (same random numbers) are
checked at <= 1e-9 relative. Unbiasedness: test_fivo_unbiased.py; gradients against finite
differences: test_fivo_gradients.py.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import Adam

from pyro_seq.infer import FIVO, IWAE, LatentScale
from pyro_seq.models.linear_gaussian import LinearGaussianSequenceModel
from tests.infer._lg import grads, make_data, make_model, make_perturbed

LENGTHS = [6, 3, 1, 5]


pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def rel(a, b):
    """Relative error of scalars or vectors (vector 2-norm)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).norm() / b.norm()).item()


def test_one_particle_is_trace_elbo():
    m = make_perturbed()
    x, mask = make_data(m, LENGTHS)
    torch.manual_seed(1)
    a = FIVO(num_particles=1, resample="always").loss_and_grads(m.model, m.guide, x, mask)
    ga = grads(m)
    torch.manual_seed(1)
    b = Trace_ELBO().loss_and_grads(m.model, m.guide, x, mask)
    gb = grads(m)
    assert ga.dtype == torch.float64
    # same random numbers, same function: exact up to rounding. Measured (float64): loss 0,
    # gradient 2e-16 relative (float32, the former test at rel 1e-5 / 1e-4: 3e-8 and 1e-7)
    assert rel(a, b) <= 1e-9 and rel(ga, gb) <= 1e-9, (rel(a, b), rel(ga, gb))


def test_never_resampling_is_iwae():
    m = make_perturbed()
    x, mask = make_data(m, LENGTHS)
    torch.manual_seed(2)
    a = FIVO(num_particles=5, resample="never").loss_and_grads(m.model, m.guide, x, mask)
    ga = grads(m)
    torch.manual_seed(2)
    b = IWAE(num_particles=5, max_plate_nesting=1).loss_and_grads(m.model, m.guide, x, mask)
    gb = grads(m)
    # measured (float64): loss 1.5e-16, gradient 5e-16 relative
    assert rel(a, b) <= 1e-9 and rel(ga, gb) <= 1e-9, (rel(a, b), rel(ga, gb))


def test_exact_posterior_without_resampling_gives_log_likelihood():
    m = make_model(guide="smoothing")
    x, mask = make_data(m, LENGTHS)
    log_z, scale = FIVO(num_particles=3, resample="never").log_z(m.model, m.guide, x, mask)
    assert scale == 1.0
    # with the exact posterior as proposal every weight is p(x) exactly (thesis eq. 2.13);
    # measured: 4.7e-16 relative (float32, the former test at atol 1e-4: 5e-8)
    exact = m.exact_log_likelihood(x, mask)
    assert ((log_z - exact).abs() / exact.abs()).max() <= 1e-9


def test_resampling_tightens_the_bound_on_long_sequences():
    # bootstrap proposal, T = 30: the ESS-resampled bound beats IWAE (Maddison et al. 2017)
    m = make_model(guide="prior")
    x1, _ = make_data(m, [30], seed=5)
    R = 200
    x = x1.expand(R, 30, 2).contiguous()
    torch.manual_seed(4)
    with torch.no_grad():
        f, _ = FIVO(num_particles=8, resample="ess").log_z(m.model, m.guide, x)
        i, _ = FIVO(num_particles=8, resample="never").log_z(m.model, m.guide, x)
    exact = m.exact_log_likelihood(x1)[0].item()
    se = (f.var() / R + i.var() / R) ** 0.5
    # measured (T = 30, K = 8): FIVO(ess) ~ exact - 19 nats, IWAE ~ exact - 108 nats
    assert f.mean() - i.mean() > 3 * se
    assert f.mean() < exact


def test_loss_and_loss_and_grads_agree():
    m = make_perturbed()
    x, mask = make_data(m, LENGTHS)
    fivo = FIVO(num_particles=4, resample="always", resampling="systematic")
    torch.manual_seed(5)
    a = fivo.loss(m.model, m.guide, x, mask)
    torch.manual_seed(5)
    b = fivo.loss_and_grads(m.model, m.guide, x, mask)
    torch.manual_seed(5)
    c = fivo.differentiable_loss(m.model, m.guide, x, mask)
    # the same particle filter run three ways (measured: identical, 0 relative)
    assert rel(a, b) <= 1e-12 and rel(a, c.item()) <= 1e-12
    # (gradients are checked against finite differences in test_fivo_gradients.py)


def test_ragged_batch_stops_after_last_step():
    m = make_model(guide="optimal")
    x, mask = make_data(m, LENGTHS)
    fivo = FIVO(num_particles=4, resample="always")
    torch.manual_seed(6)
    a = fivo.loss(m.model, m.guide, x, mask)
    # never resampled after a sequence's last step: one resampling between consecutive steps
    assert fivo.last_num_resamples.tolist() == [L - 1 for L in LENGTHS]
    torch.manual_seed(6)
    b = fivo.loss(m.model, m.guide, torch.where(mask.unsqueeze(-1), x, -x), mask)
    assert a == b  # padded values contribute nothing


def test_subsampling_scale_and_latent_scale():
    m = make_model(guide="optimal")
    x, mask = make_data(m, LENGTHS)
    fivo = FIVO(num_particles=3, resample="always")
    torch.manual_seed(7)
    a = fivo.loss(m.model, m.guide, x, mask)
    torch.manual_seed(7)
    b = fivo.loss(m.model, m.guide, x, mask, num_sequences=40)
    assert rel(b, 10 * a) <= 1e-12  # N / B = 40 / 4 (measured: 0)
    # KL annealing: with one particle FIVO under LatentScale is the annealed ELBO
    ls = LatentScale(0.3)
    torch.manual_seed(8)
    c = FIVO(num_particles=1).loss(ls(m.model), ls(m.guide), x, mask)
    torch.manual_seed(8)
    d = Trace_ELBO().loss(ls(m.model), ls(m.guide), x, mask)
    assert rel(c, d) <= 1e-9  # measured: 0 (float32, the former test at rel 1e-5: 8e-8)
    torch.manual_seed(9)
    e = FIVO(num_particles=4, resample="always").loss(
        LatentScale(1.0)(m.model), LatentScale(1.0)(m.guide), x, mask
    )
    torch.manual_seed(9)
    f = FIVO(num_particles=4, resample="always").loss(m.model, m.guide, x, mask)
    assert rel(e, f) <= 1e-12  # measured: 0


def test_svi_trains_with_fivo():
    m = make_model(guide="optimal", learnable=True)
    x, mask = make_data(make_model(seed=3), [8, 8, 8])
    svi = SVI(m.model, m.guide, Adam({"lr": 0.02}), loss=FIVO(num_particles=4))
    before = m.exact_log_likelihood(x, mask).sum()
    for _ in range(30):
        svi.step(x, mask)
    assert m.exact_log_likelihood(x, mask).sum() > before


def test_requires_step_protocol():
    def model(x, mask=None):
        pass

    with pytest.raises(TypeError, match="step protocol"):
        FIVO().loss(model, model, torch.zeros(1, 2, 1))


class _Prog:
    """Minimal step-protocol program for error paths."""

    def __init__(self, role, bad_state=False, sample_in_init=False):
        self.role, self.bad_state, self.sample_in_init = role, bad_state, sample_in_init

    def __call__(self, x, mask=None, num_sequences=None):
        pass

    def init(self, state, x, mask=None, num_sequences=None):
        with pyro.plate("sequences", x.shape[0], dim=-1):
            if self.sample_in_init:
                pyro.sample("z_0", dist.Normal(0.0, 1.0))
            state[f"{self.role}_h"] = x.new_zeros(x.shape[0], 3)

    def step(self, state, t, x, mask=None, num_sequences=None):
        with pyro.plate("sequences", x.shape[0], dim=-1):
            if self.role == "guide":
                z = pyro.sample(f"z_{t + 1}", dist.Normal(0.0, 1.0))
            else:
                z = pyro.sample(f"z_{t + 1}", dist.Normal(0.0, 1.0))
                pyro.sample(f"x_{t + 1}", dist.Normal(z, 1.0), obs=x[:, t, 0])
            if self.bad_state:
                state["h"] = x.new_zeros(x.shape[0] + 1, 3)  # not (K, batch, ...)
            else:
                state[f"{self.role}_z"] = z


def test_clear_errors():
    x = torch.randn(2, 3, 1)
    with pytest.raises(ValueError, match="per-particle"):
        FIVO(num_particles=3, resample="always").loss(
            _Prog("model", bad_state=True), _Prog("guide"), x
        )
    with pytest.raises(NotImplementedError, match="init must not sample"):
        FIVO(num_particles=3).loss(_Prog("model"), _Prog("guide", sample_in_init=True), x)
    # a well-formed minimal program runs
    assert torch.isfinite(
        torch.tensor(
            FIVO(num_particles=3, resample="always").loss(_Prog("model"), _Prog("guide"), x)
        )
    )
    for bad in (
        dict(num_particles=0),
        dict(resample="sometimes"),
        dict(resampling="residual"),
        dict(ess_threshold=2.0),
        dict(max_plate_nesting=0),
    ):
        with pytest.raises(ValueError):
            FIVO(**bad)


class _NoRsampleMVN(dist.MultivariateNormal):
    """A multivariate normal that declares no reparameterized sampler (pyro then calls
    ``sample()``, which draws the same values from the same RNG state, without a graph)."""

    has_rsample = False


class _NonReparamPriorLG(LinearGaussianSequenceModel):
    """The LGSSM with its bootstrap (prior) proposal drawn from a non-reparameterized site."""

    def guide_step(self, state, t, x, mask):
        loc = self._prior_loc(state, t, "guide_z")
        loc = loc.expand(torch.broadcast_shapes(loc.shape, (x.shape[0], self.state_dim)))
        z = pyro.sample(
            f"z_{t + 1}", _NoRsampleMVN(loc, scale_tril=self._prior_tril(t)).mask(mask[:, t])
        )
        state["guide_z"] = z


def test_non_reparameterized_guide_training_refused_evaluation_accepted():
    base = make_model(guide="prior", learnable=True)
    m = _NonReparamPriorLG(
        2, 2, A=base.A, C=base.C, Q=base.Q, R=base.R, learnable=True, guide="prior"
    )
    x, mask = make_data(m, LENGTHS)
    fivo = FIVO(num_particles=4, resample="always")
    messages = []
    for method in (fivo.loss, fivo.differentiable_loss, fivo.loss_and_grads):
        with pytest.raises(ValueError, match="fully reparameterized guide") as info:
            method(m.model, m.guide, x, mask)
        messages.append(str(info.value))
    assert len(set(messages)) == 1 and "'z_1'" in messages[0] and "FIVO.log_z" in messages[0]
    assert all(p.grad is None for p in m.parameters())  # nothing was back-propagated
    # the bound's value needs no gradient: log_z accepts the guide, and gives exactly the
    # estimate of the same proposal drawn reparameterized (same random numbers)
    torch.manual_seed(3)
    with torch.no_grad():
        a, _ = fivo.log_z(m.model, m.guide, x, mask)
    torch.manual_seed(3)
    with torch.no_grad():
        b, _ = fivo.log_z(base.model, base.guide, x, mask)
    assert torch.isfinite(a).all() and torch.equal(a, b)
    # the check is about the guide only: the reparameterized prior guide trains
    assert math.isfinite(fivo.loss_and_grads(base.model, base.guide, x, mask))


def test_vectorize_particles_argument():
    # FIVO draws its particles in one vectorized plate: True is accepted (and changes nothing),
    # False is refused with a message that says why, instead of ELBO.__init__'s TypeError
    m = make_model(guide="optimal")
    x, mask = make_data(m, LENGTHS)
    f = FIVO(num_particles=4, resample="always", vectorize_particles=True)
    assert f.vectorize_particles is True and f.max_plate_nesting == 1
    torch.manual_seed(0)
    a = f.loss(m.model, m.guide, x, mask)
    torch.manual_seed(0)
    b = FIVO(num_particles=4, resample="always").loss(m.model, m.guide, x, mask)
    assert a == b
    with pytest.raises(ValueError, match="one vectorized particle plate.*must be True"):
        FIVO(num_particles=4, vectorize_particles=False)


def test_default_resampling_scheme_is_systematic():
    m = make_model(guide="prior")
    x, mask = make_data(m, LENGTHS)
    assert (
        FIVO().resampling == "systematic"
        and FIVO().resample == "ess"
        and FIVO().ess_threshold == 0.5
    )
    losses = {}
    for scheme in (None, "systematic", "multinomial"):
        f = (
            FIVO(num_particles=8, resample="always")
            if scheme is None
            else FIVO(num_particles=8, resample="always", resampling=scheme)
        )
        torch.manual_seed(4)
        losses[scheme] = f.loss(m.model, m.guide, x, mask)
    assert losses[None] == losses["systematic"] != losses["multinomial"]


def test_resampling_argument_errors_name_the_argument():
    for bad, match in [
        (dict(resample="sometimes"), "resample must be one of"),
        (dict(resampling="residual"), "resampling must be one of"),
        (dict(ess_threshold=2.0), "ess_threshold must be"),
        (dict(ess_threshold="half"), "ess_threshold must be"),
    ]:
        with pytest.raises(ValueError, match=match):
            FIVO(**bad)
