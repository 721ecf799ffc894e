"""IWAE with a randomly subsampled data plate: all particles weight the same minibatch.

Conjugate model z_n ~ N(mu, 1), x_n | z_n ~ N(z_n, sx) for N = 100 points, guide = the exact
posterior q(z_n) = p(z_n | x_n). Every importance weight of data point n is then exactly
p(x_n) = N(x_n; mu, sqrt(1 + sx^2)), so one draw of the bound is exactly
(N / B) sum_{n in S} log p(x_n) for the minibatch S that was drawn (an identity, tested in
float64 at 1e-9), and its expectation over S is log p(x_{1:N}).
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_seq.infer import IWAE

N, B, MU, SX = 100, 10, 0.3, 0.7


def make_problem():
    x = torch.randn(N, generator=torch.Generator().manual_seed(0)) * 1.5 + 0.5
    post_var = 1.0 / (1.0 + 1.0 / SX**2)
    post_loc = post_var * (MU + x / SX**2)
    shift = torch.zeros((), requires_grad=True)  # guide parameters, at the exact posterior
    log_scale = torch.tensor(0.5 * math.log(post_var), requires_grad=True)
    seen = []

    def model():
        with pyro.plate("data", N, subsample_size=B) as idx:
            seen.append(idx)
            z = pyro.sample("z", dist.Normal(MU, 1.0))
            pyro.sample("x", dist.Normal(z, SX), obs=x[idx])

    def guide():
        with pyro.plate("data", N, subsample_size=B) as idx:
            seen.append(idx)
            pyro.sample("z", dist.Normal(post_loc[idx] + shift, log_scale.exp()))

    log_px = dist.Normal(MU, math.sqrt(1.0 + SX**2)).log_prob(x)  # (N,)
    return model, guide, seen, log_px, (shift, log_scale)


@pytest.mark.parametrize("estimator", ["standard", "dreg"])
@pytest.mark.parametrize("vectorize", [False, True])
def test_particles_share_the_minibatch(float64, vectorize, estimator):
    model, guide, seen, log_px, params = make_problem()
    elbo = IWAE(
        num_particles=4,
        vectorize_particles=vectorize,
        max_plate_nesting=1,
        gradient_estimator=estimator,
    )
    for seed in range(5):
        torch.manual_seed(seed)
        seen.clear()
        loss = elbo.loss_and_grads(model, guide)
        # every run of model and guide (K looped particles, DReG's replay) saw one minibatch
        assert len(seen) >= 2 and all(torch.equal(idx, seen[0]) for idx in seen), seen
        assert len(set(seen[0].tolist())) == B
        exact = N / B * log_px[seen[0]].sum().item()
        # before the fix (looped particles drawing their own minibatches): mean -258 where
        # log p(x) = -577 in the setting
        assert abs(-loss - exact) <= 1e-9 * abs(exact), (-loss, exact)
        if estimator == "dreg":
            # at the exact posterior log w is constant in z: DReG's guide gradient is zero
            # (not only in expectation), provided the replay sees the same minibatch
            for p in params:
                assert p.grad.abs().item() < 1e-9 * abs(exact), p.grad
        for p in params:
            p.grad = None


def test_mean_over_minibatches_is_log_likelihood(float64):
    # E_S[(N/B) sum_{n in S} log p(x_n)] = log p(x_{1:N}); 400 looped-particle draws,
    # tolerance 4 standard errors of their mean
    model, guide, seen, log_px, _ = make_problem()
    elbo = IWAE(num_particles=3, vectorize_particles=False, max_plate_nesting=1)
    torch.manual_seed(0)
    draws = torch.tensor([-elbo.loss(model, guide) for _ in range(400)])
    se = draws.std() / 400**0.5
    assert abs(draws.mean() - log_px.sum()) < 4 * se, (draws.mean(), log_px.sum(), se)
