"""DReG under tempered weights (LatentScale): same expectation as the standard IWAE gradient.

Model and guide are vectorized over ``R`` independent replicates of one data point, each with
parameters of its own (tensors of shape ``(R,)``), so one backward pass gives ``R`` i.i.d.
gradient draws per parameter: mean and standard error come from one call.
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_seq.infer import IWAE, LatentScale

R = 20000
X = 1.3


def make_params():
    """Model: mu, log_sx; guide: a1, log_s1, b, a2, log_s2 (mu is shared with the guide)."""
    init = dict(mu=0.4, log_sx=-0.5, a1=0.2, log_s1=0.1, b=0.5, a2=0.3, log_s2=-0.2)
    return {k: torch.full((R,), v, requires_grad=True) for k, v in init.items()}


def make_programs(p):
    # z1 ~ N(mu, 1), z2 | z1 ~ N(0.8 z1, 0.6), x | z2 ~ N(z2, exp(log_sx)), x = 1.3
    def model():
        with pyro.plate("rep", R):
            z1 = pyro.sample("z1", dist.Normal(p["mu"], 1.0))
            z2 = pyro.sample("z2", dist.Normal(0.8 * z1, 0.6))
            pyro.sample("x", dist.Normal(z2, p["log_sx"].exp()), obs=torch.full((R,), X))

    # structured guide q(z1) q(z2 | z1), its z1 location shares mu with the model
    def guide():
        with pyro.plate("rep", R):
            z1 = pyro.sample("z1", dist.Normal(p["a1"] + p["mu"], p["log_s1"].exp()))
            pyro.sample("z2", dist.Normal(p["b"] * z1 + p["a2"], p["log_s2"].exp()))

    return model, guide


def gradient_draws(estimator, K, beta, seed):
    p = make_params()
    model, guide = make_programs(p)
    ls = LatentScale(beta)
    torch.manual_seed(seed)
    IWAE(num_particles=K, max_plate_nesting=1, gradient_estimator=estimator).loss_and_grads(
        ls(model), ls(guide)
    )
    return {k: -v.grad for k, v in p.items()}  # gradients of the bound, one per replicate


@pytest.mark.parametrize("K", [2, 8])
@pytest.mark.parametrize("beta", [0.3, 1.0])
def test_dreg_matches_standard_gradient_under_latent_scale(float64, beta, K):
    # Paired draws (same random numbers): the difference of the two estimators has mean zero.
    # log_sx enters only the likelihood: both estimators give it sum_k w_k d log p(x|z_k), an
    # identity. Measured (R = 20000, seed 0; mean +- standard error, standard | DReG):
    #   beta=0.3 K=2: a1 +0.4770+-0.0068 | +0.4762+-0.0054, log_s1 -0.4816+-0.0087 | -0.4794+-0.0068
    #   beta=0.3 K=8: a1 +0.2402+-0.0025 | +0.2403+-0.0016, log_s1 -0.2414+-0.0027 | -0.2403+-0.0015
    #   beta=1.0 K=2: a1 +0.3904+-0.0110 | +0.3866+-0.0054, log_s1 -0.5953+-0.0142 | -0.5904+-0.0071
    #   beta=1.0 K=8: a1 +0.0576+-0.0045 | +0.0589+-0.0008, log_s1 -0.0879+-0.0047 | -0.0863+-0.0007
    # largest |z| of the paired differences over all cases and parameters: 2.55 (log_s2,
    # beta=0.3, K=8). With DReG's old coefficient w~^2 the beta=0.3 cases fail at |z| = 33-113
    # (a1 at K=8: DReG +0.0485 vs standard +0.2402, SE of the difference 0.0021).
    gs = gradient_draws("standard", K, beta, seed=0)
    gd = gradient_draws("dreg", K, beta, seed=0)
    err = (gd["log_sx"] - gs["log_sx"]).abs().max() / gs["log_sx"].abs().max()
    assert err < 1e-9, err
    for name in ("mu", "a1", "log_s1", "b", "a2", "log_s2"):
        diff = gd[name] - gs[name]
        se = diff.std() / R**0.5
        assert se > 1e-4  # the estimators differ draw by draw: the comparison has content
        # |mean paired difference| < 4 standard errors of that mean (false alarm ~6e-5 each)
        assert diff.mean().abs() < 4 * se, (name, gs[name].mean(), gd[name].mean(), se)


def test_dreg_refuses_guide_sites_with_different_scales():
    def model():
        z1 = pyro.sample("z1", dist.Normal(0.0, 1.0))
        z2 = pyro.sample("z2", dist.Normal(z1, 1.0))
        pyro.sample("x", dist.Normal(z2, 1.0), obs=torch.tensor(0.5))

    def guide():
        loc = pyro.param("loc", torch.tensor(0.1))
        pyro.sample("z1", dist.Normal(loc, 1.0))
        with pyro.poutine.scale(scale=0.5):
            pyro.sample("z2", dist.Normal(loc, 1.0))

    pyro.clear_param_store()
    elbo = IWAE(num_particles=3, max_plate_nesting=0, gradient_estimator="dreg")
    with pytest.raises(
        ValueError, match="one scale for all guide sites.*gradient_estimator='standard'"
    ):
        elbo.loss_and_grads(model, guide)
    # the standard estimator handles it
    assert torch.isfinite(
        torch.tensor(IWAE(num_particles=3, max_plate_nesting=0).loss_and_grads(model, guide))
    )


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_dreg_gradient_equals_hand_written_estimator(float64, beta):
    # One data point, K = 3 particles, the same random numbers: IWAE's DReG gradient against
    # eq. (dreg-tempered) written out by hand with explicit reparameterization
    # z1 = a1 + mu + e^{log_s1} eps1, z2 = b z1 + a2 + e^{log_s2} eps2 (an identity: 1e-9;
    # measured relative errors 1.7e-16, 6.3e-16, 3.6e-16 at beta = 0, 0.3, 1).
    K = 3
    init = dict(mu=0.4, log_sx=-0.5, a1=0.2, log_s1=0.1, b=0.5, a2=0.3, log_s2=-0.2)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    N = dist.Normal

    def model():
        z1 = pyro.sample("z1", N(p["mu"], 1.0))
        z2 = pyro.sample("z2", N(0.8 * z1, 0.6))
        pyro.sample("x", N(z2, p["log_sx"].exp()), obs=torch.tensor(X))

    def guide():
        z1 = pyro.sample("z1", N(p["a1"] + p["mu"], p["log_s1"].exp()))
        pyro.sample("z2", N(p["b"] * z1 + p["a2"], p["log_s2"].exp()))

    ls = LatentScale(beta)
    torch.manual_seed(11)
    loss = IWAE(num_particles=K, max_plate_nesting=0, gradient_estimator="dreg").loss_and_grads(
        ls(model), ls(guide)
    )
    got = torch.stack([-p[k].grad for k in init])

    torch.manual_seed(11)
    eps1, eps2 = torch.randn(K), torch.randn(K)  # the guide's draws, in the order it makes them

    def parts(z1, z2, q):  # (scaled model log joint a, guide log density log q)
        a = beta * (N(q["mu"], 1.0).log_prob(z1) + N(0.8 * z1, 0.6).log_prob(z2)) + N(
            z2, q["log_sx"].exp()
        ).log_prob(torch.tensor(X))
        lq = N(q["a1"] + q["mu"], q["log_s1"].exp()).log_prob(z1) + N(
            q["b"] * z1 + q["a2"], q["log_s2"].exp()
        ).log_prob(z2)
        return a, lq

    z1 = p["a1"] + p["mu"] + p["log_s1"].exp() * eps1
    z2 = p["b"] * z1 + p["a2"] + p["log_s2"].exp() * eps2
    detached = {k: v.detach() for k, v in p.items()}
    a, lq = parts(z1, z2, detached)  # depends on the parameters only through z: path terms
    log_w = a - beta * lq
    w = torch.softmax(log_w.detach(), 0)
    coef = (1 - beta) * w + beta * w**2
    a_direct, _ = parts(z1.detach(), z2.detach(), p)  # direct model terms at fixed z
    params = list(p.values())
    g_path = torch.autograd.grad((coef * log_w).sum(), params, allow_unused=True)
    g_direct = torch.autograd.grad((w * a_direct).sum(), params, allow_unused=True)
    want = torch.stack([sum(g for g in gs if g is not None) for gs in zip(g_path, g_direct)])

    assert abs(-loss - (torch.logsumexp(log_w, 0) - math.log(K)).item()) < 1e-12 * abs(loss)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-9, (got, want)
