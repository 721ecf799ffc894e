"""Reverse AIS (RAISE; Burda, Grosse & Salakhutdinov 2015, sec. 3) for the RBM: the weight is
unbiased for the annealing model's marginal, computed here densely by enumerating every visible
and hidden configuration; on a fine schedule it and AIS meet the exact log-likelihood."""

import itertools
import math

import pytest
import torch

from pyro_seq.distributions import RBM

D = torch.float64


def _bits(n):
    return torch.tensor(list(itertools.product([0.0, 1.0], repeat=n)), dtype=D)


def _rbm(V, H, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    W = scale * torch.randn(H, V, generator=g, dtype=D)
    c = torch.randn(V, generator=g, dtype=D)
    b = torch.randn(H, generator=g, dtype=D)
    return RBM(W, c, b)


def _dense_annealing_marginal(d, betas, c0):
    """p_ann(v) = [p_0 T_1 ... T_K](v): p_0 the base model exp(c0 v) / prod(1 + e^c0), T_k the
    block-Gibbs kernel v -> h -> v' of p_beta_k, every probability by enumeration."""
    v, h = _bits(d.visible_bias.numel()), _bits(d.hidden_bias.numel())
    p = torch.exp(v @ c0 - torch.nn.functional.softplus(c0).sum())
    for beta in betas[1:]:
        ph1 = torch.sigmoid(beta * (d.hidden_bias + v @ d.W.T))  # (2^V, H): p(h_j = 1 | v)
        ph = torch.prod(torch.where(h[None] > 0, ph1[:, None], 1 - ph1[:, None]), -1)  # (v, h)
        a = (1 - beta) * c0 + beta * (d.visible_bias + h @ d.W)  # (2^H, V)
        pv1 = torch.sigmoid(a)
        pv = torch.prod(torch.where(v[None] > 0, pv1[:, None], 1 - pv1[:, None]), -1)  # (h, v')
        p = p @ (ph @ pv)
    return v, p


@pytest.mark.parametrize("schedule", [[0.0, 1.0], [0.0, 0.5, 1.0], [0.0, 0.3, 0.7, 1.0]])
def test_raise_weight_is_unbiased_for_the_dense_annealing_marginal(schedule):
    d = _rbm(3, 2, seed=3, scale=3.0)
    betas = torch.tensor(schedule, dtype=D)
    c0 = torch.tensor([0.2, -0.5, 0.1], dtype=D)
    v, p_ann = _dense_annealing_marginal(d, betas, c0)
    assert abs(float(p_ann.sum()) - 1.0) < 1e-12
    torch.manual_seed(0)
    n = 100_000
    est = d.raise_log_prob(v, num_chains=n, betas=betas, base_visible_bias=c0)
    w = est.log_weights.exp()  # (n, 8): E[w] = p_ann(v)
    se = w.std(0) / math.sqrt(n)
    assert ((w.mean(0) - p_ann).abs() <= 4 * se).all(), (w.mean(0), p_ann, se)
    assert torch.allclose(est.log_partition, w.mean(0).log())
    if len(schedule) == 2:  # one transition: p_ann is measurably not the RBM's own p(v)
        exact = d.normalized_log_prob(v).exp()
        assert ((p_ann - exact).abs() > 10 * se).any()


def test_raise_and_ais_agree_with_the_exact_log_likelihood_on_a_fine_schedule():
    d = _rbm(8, 4, seed=1, scale=0.8)
    torch.manual_seed(2)
    v = (torch.rand(6, 8, dtype=D) < 0.5).to(D)
    exact = d.normalized_log_prob(v)
    low = d.raise_log_prob(v, num_chains=200, num_betas=400)
    ais = d.ais_log_partition(num_chains=200, num_betas=400)
    high = -d.free_energy(v) - ais.log_partition
    # a fine schedule: both within a few standard errors of the exact value
    assert ((low.log_partition - exact).abs() <= 4 * low.stderr + 1e-3).all()
    assert ((high - exact).abs() <= 4 * ais.stderr + 1e-3).all()


def test_raise_on_binomial_softmax_units_includes_the_base_measure():
    g = torch.Generator().manual_seed(4)
    W = 0.7 * torch.randn(3, 3, 4, generator=g, dtype=D)
    d = RBM(
        W,
        torch.randn(3, 4, generator=g, dtype=D),
        torch.randn(3, generator=g, dtype=D),
        visible="binomial_softmax",
        num_trials=2,
    )
    torch.manual_seed(5)
    v = d.gibbs(d._random_visible(torch.Size([4])), k=20)
    exact = d.normalized_log_prob(v)
    est = d.raise_log_prob(v, num_chains=300, num_betas=300)
    assert ((est.log_partition - exact).abs() <= 4 * est.stderr + 1e-3).all()


def test_raise_checks_its_arguments_like_ais():
    d = _rbm(4, 2)
    v = torch.zeros(4, dtype=D)
    with pytest.raises(ValueError, match="num_chains"):
        d.raise_log_prob(v, num_chains=1)
    with pytest.raises(ValueError, match="betas"):
        d.raise_log_prob(v, betas=torch.tensor([0.0, 0.6, 0.4, 1.0]))
    with pytest.raises(ValueError, match="base_visible_bias"):
        d.raise_log_prob(v, base_visible_bias=torch.zeros(3, dtype=D))


@pytest.mark.parametrize("schedule", [[0.0, 1.0], [0.0, 0.4, 1.0], [0.0, 0.2, 0.5, 0.8, 1.0]])
def test_reverse_ais_from_exact_draws_is_unbiased_for_z0_over_z(schedule):
    """Bidirectional Monte Carlo (Grosse et al. 2015): chains started at exact draws of the RBM
    (by enumeration) run the path backwards; E[w] = Z_0 / Z for any schedule."""
    d = _rbm(4, 3, seed=5, scale=1.5)
    betas = torch.tensor(schedule, dtype=D)
    c0 = torch.tensor([0.3, -0.2, 0.1, 0.0], dtype=D)
    v = _bits(4)
    torch.manual_seed(1)
    n = 100_000
    idx = torch.distributions.Categorical(logits=d.normalized_log_prob(v)).sample((n,))
    est = d.reverse_ais_log_partition(v[idx], betas=betas, base_visible_bias=c0)
    w = est.log_weights.exp()
    log_z0 = 3 * math.log(2.0) + float(torch.nn.functional.softplus(c0).sum())
    target = math.exp(log_z0 - float(d.log_partition()))
    se = float(w.std()) / math.sqrt(n)
    assert abs(float(w.mean()) - target) <= 4 * se, (float(w.mean()), target, se)
    assert abs(float(est.log_partition) - (log_z0 - math.log(float(w.mean())))) < 1e-9


def test_forward_and_reverse_ais_sandwich_log_z_on_a_coarse_schedule():
    """With exact draws, reverse AIS overestimates log Z and forward AIS underestimates it, in
    expectation; a coarse schedule makes both biases visible."""
    d = _rbm(6, 4, seed=2, scale=1.2)
    exact = float(d.log_partition())
    v = _bits(6)
    torch.manual_seed(3)
    probs = d.normalized_log_prob(v)
    forward, reverse = [], []
    for _ in range(200):
        forward.append(float(d.ais_log_partition(num_chains=2, num_betas=3).log_partition))
        draws = v[torch.distributions.Categorical(logits=probs).sample((2,))]
        reverse.append(float(d.reverse_ais_log_partition(draws, num_betas=3).log_partition))
    f, r = torch.tensor(forward), torch.tensor(reverse)
    assert float(f.mean() + 3 * f.std() / math.sqrt(200)) < exact
    assert float(r.mean() - 3 * r.std() / math.sqrt(200)) > exact


def test_reverse_ais_checks_the_shape_of_its_draws():
    d = _rbm(4, 2)
    with pytest.raises(
        ValueError, match=r"samples must have shape \(num_chains, \*\(\), \*\(4,\)\)"
    ):
        d.reverse_ais_log_partition(torch.zeros(4, dtype=D))
    with pytest.raises(ValueError, match="num_chains"):
        d.reverse_ais_log_partition(torch.zeros(1, 4, dtype=D))
