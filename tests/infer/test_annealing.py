"""KL annealing (LatentScale, linear_schedule) and free bits (FreeBits_ELBO)."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch.distributions import kl_divergence

from pyro_seq.infer import FreeBits_ELBO, LatentScale, linear_schedule
from pyro_seq.infer.annealing import HandledStepProgram

N, D = 5, 3
X = torch.tensor(
    [[0.3, -1.2, 0.5], [1.0, 0.2, -0.4], [2.0, 1.1, 0.0], [-0.7, 0.4, 0.9], [0.1, 0.1, 0.1]]
)


def model(x):
    loc = pyro.param("p_loc", torch.zeros(D))
    with pyro.plate("data", x.shape[0]):
        z = pyro.sample("z", dist.Normal(loc, 1.0).to_event(1))
        pyro.sample("x", dist.Normal(z, 0.5).to_event(1), obs=x)


def guide(x):
    w = pyro.param("q_w", torch.full((D,), 0.5))
    s = pyro.param("q_s", torch.full((D,), 0.8), constraint=dist.constraints.positive)
    with pyro.plate("data", x.shape[0]):
        pyro.sample("z", dist.Normal(w * x, s).to_event(1))


def _terms(seed, x=X):
    """One draw z ~ q: (log p(x|z), log p(z), log q(z)) summed over data."""
    torch.manual_seed(seed)
    gtr = pyro.poutine.trace(guide).get_trace(x)
    mtr = pyro.poutine.trace(pyro.poutine.replay(model, trace=gtr)).get_trace(x)
    return (
        mtr.nodes["x"]["fn"].log_prob(x).sum(),
        mtr.nodes["z"]["fn"].log_prob(mtr.nodes["z"]["value"]).sum(),
        gtr.nodes["z"]["fn"].log_prob(gtr.nodes["z"]["value"]).sum(),
    )


def _loss_and_grads(elbo, mdl, gde, seed):
    pyro.clear_param_store()
    torch.manual_seed(seed)
    loss = elbo.loss_and_grads(mdl, gde, X)
    grads = {k: v.grad.clone() for k, v in pyro.get_param_store().named_parameters()}
    return loss, grads


@pytest.mark.parametrize("beta", [1.0, 0.3, 0.0])
def test_latent_scale_matches_scaled_elbo(beta):
    pyro.clear_param_store()
    ls = LatentScale(beta)
    torch.manual_seed(0)
    loss = Trace_ELBO().loss(ls(model), ls(guide), X)
    pyro.clear_param_store()
    loglik, logp, logq = _terms(0)
    # beta=1: the ELBO; beta=0: only the reconstruction term log p(x|z) is left.
    assert loss == pytest.approx(-(loglik + beta * (logp - logq)).item(), rel=1e-6)


def test_latent_scale_beta_one_equals_trace_elbo_grads():
    ls = LatentScale(1.0)
    l1, g1 = _loss_and_grads(Trace_ELBO(), ls(model), ls(guide), seed=3)
    l2, g2 = _loss_and_grads(Trace_ELBO(), model, guide, seed=3)
    assert l1 == pytest.approx(l2, rel=1e-6)
    for k in g2:
        assert torch.allclose(g1[k], g2[k], atol=1e-6), k


def test_latent_scale_beta_zero_gradient_is_reconstruction_only():
    ls = LatentScale(0.0)
    _, g = _loss_and_grads(Trace_ELBO(), ls(model), ls(guide), seed=4)
    # the prior parameter only enters through log p(z), scaled by beta = 0
    assert torch.equal(g["p_loc"], torch.zeros(D))
    assert g["q_w"].abs().sum() > 0  # the guide still learns through log p(x|z)


def test_latent_scale_is_mutable_and_validated():
    ls = LatentScale(0.2)
    ls.beta = linear_schedule(500, start=0.2, num_steps=1000)
    assert ls.beta == pytest.approx(0.6)
    with pytest.raises(ValueError):
        ls.beta = -1.0
    with pytest.raises(ValueError):
        LatentScale(float("nan"))


def test_latent_scale_leaves_observed_sites():
    ls = LatentScale(0.5)
    tr = pyro.poutine.trace(ls(model)).get_trace(X)
    assert tr.nodes["z"]["scale"] == 0.5
    assert tr.nodes["x"]["scale"] == 1.0


def test_latent_scale_wraps_step_programs():
    class Prog:
        role = "model"

        def __call__(self, x):
            return pyro.sample("z", dist.Normal(0.0, 1.0))

        def init(self, state, x, mask=None, num_sequences=None):
            state["z"] = pyro.sample("z_0", dist.Normal(0.0, 1.0))

        def step(self, state, t, x, mask=None, num_sequences=None):
            pyro.sample(f"z_{t + 1}", dist.Normal(0.0, 1.0))

    ls = LatentScale(0.25)
    wrapped = ls(Prog())
    assert isinstance(wrapped, HandledStepProgram) and wrapped.role == "model"
    tr = pyro.poutine.trace(wrapped.step).get_trace({}, 0, X)
    assert tr.nodes["z_1"]["scale"] == 0.25
    tr = pyro.poutine.trace(wrapped.init).get_trace({}, X)
    assert tr.nodes["z_0"]["scale"] == 0.25


def test_linear_schedule():
    assert linear_schedule(0) == pytest.approx(0.2)
    assert linear_schedule(250, start=0.0, end=1.0, num_steps=1000) == pytest.approx(0.25)
    assert linear_schedule(1000) == pytest.approx(1.0)
    assert linear_schedule(5000) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        linear_schedule(-1)
    with pytest.raises(ValueError):
        linear_schedule(1, num_steps=0)


def _analytic_kl():
    q = dist.Normal(pyro.param("q_w") * X, pyro.param("q_s"))
    p = dist.Normal(pyro.param("p_loc").expand(X.shape), 1.0)
    return kl_divergence(q, p)  # (N, D)


def test_free_bits_zero_is_mean_field_elbo():
    l1, g1 = _loss_and_grads(FreeBits_ELBO(free_bits=0.0), model, guide, seed=5)
    l2, g2 = _loss_and_grads(TraceMeanField_ELBO(), model, guide, seed=5)
    assert l1 == pytest.approx(l2, rel=1e-6)
    for k in g2:
        assert torch.allclose(g1[k], g2[k], atol=1e-6), k


@pytest.mark.parametrize("group", ["site", "all", "dim"])
def test_free_bits_clamps_group_kl(group):
    pyro.clear_param_store()
    torch.manual_seed(6)
    pyro.poutine.trace(guide).get_trace(X)  # create params
    pyro.poutine.trace(model).get_trace(X)
    kl = _analytic_kl().detach()  # (N, D)
    lam = 0.4
    if group == "dim":
        # per-dimension: sum_d max(lam * N, sum_n KL_nd)
        penalty = torch.maximum(kl.sum(0), torch.tensor(lam * N)).sum()
    else:
        penalty = torch.maximum(kl.sum(), torch.tensor(lam * N))
    # the reference formula, whichever side of the clamp each group is on
    torch.manual_seed(7)
    loss = FreeBits_ELBO(free_bits=lam, group=group).loss(model, guide, X)
    loglik, _, _ = _terms(7)
    assert loss == pytest.approx((-loglik + penalty).item(), rel=1e-5)


def test_free_bits_clamped_group_gives_no_kl_gradient():
    # lambda far above the KL: the KL term is constant, so the prior loc gets no gradient
    _, g = _loss_and_grads(FreeBits_ELBO(free_bits=100.0), model, guide, seed=8)
    assert torch.equal(g["p_loc"], torch.zeros(D))
    _, g = _loss_and_grads(FreeBits_ELBO(free_bits=0.0), model, guide, seed=8)
    assert g["p_loc"].abs().sum() > 0


def test_free_bits_composes_with_latent_scale():
    ls = LatentScale(0.5)
    pyro.clear_param_store()
    torch.manual_seed(9)
    pyro.poutine.trace(guide).get_trace(X)
    pyro.poutine.trace(model).get_trace(X)
    kl = _analytic_kl().detach().sum()
    torch.manual_seed(9)
    loss = FreeBits_ELBO(free_bits=100.0, group="all").loss(ls(model), ls(guide), X)
    loglik, _, _ = _terms(9)
    assert loss == pytest.approx(
        (-loglik + 0.5 * torch.maximum(kl, torch.tensor(100.0 * N))).item(), rel=1e-6
    )


def test_free_bits_respects_subsampling_scale():
    def model_sub(x):
        loc = pyro.param("p_loc", torch.zeros(D))
        with pyro.plate("data", 50, subsample=torch.arange(x.shape[0])):
            z = pyro.sample("z", dist.Normal(loc, 1.0).to_event(1))
            pyro.sample("x", dist.Normal(z, 0.5).to_event(1), obs=x)

    def guide_sub(x):
        w = pyro.param("q_w", torch.full((D,), 0.5))
        s = pyro.param("q_s", torch.full((D,), 0.8), constraint=dist.constraints.positive)
        with pyro.plate("data", 50, subsample=torch.arange(x.shape[0])):
            pyro.sample("z", dist.Normal(w * x, s).to_event(1))

    pyro.clear_param_store()
    torch.manual_seed(10)
    lo = FreeBits_ELBO(free_bits=100.0).loss(model_sub, guide_sub, X)
    loglik, _, _ = _terms(10)
    # scale 50/5: likelihood scaled by 10, clamp at lambda * 50 data points
    assert lo == pytest.approx((-10 * loglik + 100.0 * 50).item(), rel=1e-6)


def test_free_bits_validation():
    with pytest.raises(ValueError):
        FreeBits_ELBO(free_bits=-1.0)
    with pytest.raises(ValueError):
        FreeBits_ELBO(group="bogus")
