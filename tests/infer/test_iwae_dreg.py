"""DReG under tempered weights (LatentScale): same expectation as the standard IWAE gradient.

Model and guide are vectorized over ``R`` independent replicates of one data point, each with
parameters of its own (tensors of shape ``(R,)``), so one backward pass gives ``R`` i.i.d.
gradient draws per parameter: mean and standard error come from one call.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_seq.infer import IWAE, LatentScale

R = 20000
X = 1.3


@pytest.fixture
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


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
        ls(model), ls(guide))
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
        se = diff.std() / R ** 0.5
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
    with pytest.raises(ValueError, match="one scale for all guide sites.*gradient_estimator='standard'"):
        elbo.loss_and_grads(model, guide)
    # the standard estimator handles it
    assert torch.isfinite(torch.tensor(IWAE(num_particles=3, max_plate_nesting=0).loss_and_grads(model, guide)))
