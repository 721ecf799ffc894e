"""RBM (seeds 000, 003): partition functions by brute force over the joint energy, AIS,
missing visibles, softmax and binomial-softmax conditionals by enumeration, Gibbs sampling."""

import itertools
import math

import pytest
import torch

from pyro_seq.distributions import RBM

D = torch.float64


def _bits(n):
    return torch.tensor(list(itertools.product([0.0, 1.0], repeat=n)), dtype=D)


def _rbm(V=10, H=4, seed=0, scale=1.0, visible="bernoulli", K=None, n=1, **kw):
    g = torch.Generator().manual_seed(seed)
    shape = (H, V) if K is None else (H, V, K)
    W = scale * torch.randn(shape, generator=g, dtype=D)
    c = torch.randn(shape[1:], generator=g, dtype=D)
    b = torch.randn(H, generator=g, dtype=D)
    return RBM(W, c, b, visible=visible, num_trials=n, **kw)


def test_log_partition_by_brute_force_over_visible_and_hidden():
    d = _rbm(10, 4)
    v, h = _bits(10), _bits(4)
    # -E(v, h) = h W v + c v + b h (seed 000 eq. 1.1 without U), every (v, h) pair
    neg_e = h @ d.W @ v.T + (v @ d.visible_bias)[None, :] + (h @ d.hidden_bias)[:, None]
    log_z = torch.logsumexp(neg_e.reshape(-1), 0)
    assert torch.allclose(d.log_partition("hidden"), log_z, atol=1e-10)
    assert torch.allclose(d.log_partition("visible"), log_z, atol=1e-10)
    assert torch.allclose(d.log_partition(), log_z, atol=1e-10)
    # free energy = -log sum_h exp(-E(v, h))
    assert torch.allclose(d.free_energy(v), -torch.logsumexp(neg_e, 0), atol=1e-10)
    assert abs(float(torch.logsumexp(d.normalized_log_prob(v), 0))) < 1e-10


def test_log_partition_with_batched_conditional_biases():
    d = _rbm(6, 3)
    hb = torch.randn(2, 5, 3, dtype=D)
    cond = RBM(d.W, d.visible_bias, hb)
    assert cond.batch_shape == (2, 5)
    z = cond.log_partition()
    for i, j in [(0, 0), (1, 4)]:
        assert torch.allclose(z[i, j], RBM(d.W, d.visible_bias, hb[i, j]).log_partition("visible"))


def test_ais_within_three_standard_errors_and_unbiased_in_exp():
    d = _rbm(10, 4, scale=0.8)
    exact = d.log_partition()
    torch.manual_seed(0)
    est = d.ais_log_partition(num_chains=200, num_betas=300)
    assert abs(float(est.log_partition - exact)) <= 3 * float(est.stderr)
    # E[Z_hat] = Z: the mean over repeats of Z_hat / Z is 1 within 3 standard errors
    ratios = torch.stack(
        [
            (d.ais_log_partition(num_chains=20, num_betas=30).log_partition - exact).exp()
            for _ in range(200)
        ]
    )
    se = ratios.std() / math.sqrt(ratios.numel())
    assert abs(float(ratios.mean()) - 1.0) <= 3 * float(se)


def test_ais_with_base_rates_and_custom_schedule():
    d = _rbm(8, 3)
    data = (torch.rand(500, 8, dtype=D) < 0.3).to(D)
    c0 = d.base_rate_bias(data)
    assert torch.allclose(torch.sigmoid(c0), data.mean(0).clamp(1e-3, 1 - 1e-3))
    betas = torch.cat(
        [torch.linspace(0, 0.5, 100, dtype=D), torch.linspace(0.5, 1, 300, dtype=D)[1:]]
    )
    torch.manual_seed(1)
    est = d.ais_log_partition(num_chains=100, betas=betas, base_visible_bias=c0)
    assert abs(float(est.log_partition - d.log_partition())) <= 3 * float(est.stderr) + 1e-6
    with pytest.raises(ValueError, match="betas"):
        d.ais_log_partition(betas=torch.tensor([0.0, 0.7, 0.5, 1.0]))


def test_sub_rbm_of_visible_mask_is_the_rbm_of_the_observed_columns():
    d = _rbm(7, 3)
    observed = torch.tensor([True, False, True, True, False, True, True])
    sub = RBM(d.W[:, observed], d.visible_bias[observed], d.hidden_bias)
    masked = RBM(d.W, d.visible_bias, d.hidden_bias, visible_mask=observed)
    v = _bits(7)[::9]
    assert torch.allclose(masked.log_prob(v), sub.log_prob(v[:, observed]), atol=1e-12)
    for over in ("hidden", "visible"):
        assert torch.allclose(masked.log_partition(over), sub.log_partition(), atol=1e-10)
    # missing units never move and get no gradient
    W = d.W.clone().requires_grad_()
    RBM(W, d.visible_bias, d.hidden_bias, visible_mask=observed).log_prob(v).sum().backward()
    assert torch.equal(W.grad[:, ~observed], torch.zeros(3, 2, dtype=D))
    chain = masked.gibbs(torch.ones(50, 7, dtype=D), k=3)
    assert torch.equal(chain[:, ~observed], torch.zeros(50, 2, dtype=D))


def _brute_force_log_z(W, c, b, present, visible, n):
    """log Z of the sub-RBM of the present units by summing exp(-E(v, h)) over every joint state:
    each binomial-softmax unit as n one-hot replicas with shared weights (Soyer & Möllenhoff,
    sec. 2.3, eq. 16), each replica over K states, and every h in {0, 1}^H (float64, no
    multinomial coefficients)."""
    hs = _bits(b.shape[-1])
    units = [i for i in range(present.shape[-1]) if present[i]]
    a = [c[i] + hs @ W[:, i] for i in units]  # activations (2^H,) or (2^H, K) per present unit
    if visible == "bernoulli":
        replica_states = [(0,), (1,)]
    else:
        replica_states = list(itertools.product(range(W.shape[-1]), repeat=n))
    terms = []
    for joint in itertools.product(replica_states, repeat=len(units)):
        neg_e = hs @ b
        for a_i, states in zip(a, joint):
            for k in states:
                neg_e = neg_e + (k * a_i if visible == "bernoulli" else a_i[:, k])
        terms.append(neg_e)
    return torch.logsumexp(torch.cat(terms), 0)


@pytest.mark.parametrize(
    "visible,K,n",
    [
        ("bernoulli", None, 1),
        ("softmax", 3, 1),
        ("binomial_softmax", 3, 2),
        ("binomial_softmax", 2, 3),
    ],
)
def test_masked_log_partition_by_brute_force_for_every_method(visible, K, n, monkeypatch):
    """With missing units every exact method and "auto" give the sub-RBM's log Z; here S^V < 2^H,
    so "auto" enumerates the visibles (S states per unit, C(n+K-1, K-1) for binomial units)."""
    V = 3
    S = 2 if K is None else math.comb(n + K - 1, K - 1)
    H = int(math.log2(S**V)) + 1
    g = torch.Generator().manual_seed(7)
    shape = (H, V) if K is None else (H, V, K)
    W = torch.randn(shape, generator=g, dtype=D)
    c = torch.randn(shape[1:], generator=g, dtype=D)
    b = torch.randn(2, 1, H, generator=g, dtype=D)  # conditional biases broadcast with the mask
    mask = torch.tensor(
        [[True, False, True], [False, True, False], [True, True, True], [False, False, False]]
    )
    d = RBM(W, c, b, visible=visible, num_trials=n, visible_mask=mask)
    assert d.batch_shape == (2, 4)
    expected = torch.stack(
        [
            torch.stack([_brute_force_log_z(W, c, b[i, 0], mask[j], visible, n) for j in range(4)])
            for i in range(2)
        ]
    )
    for over in ("hidden", "visible"):
        assert torch.allclose(d.log_partition(over), expected, atol=1e-10, rtol=0)

    def not_hidden():
        raise AssertionError("auto should enumerate the visibles when S^V < 2^H")

    monkeypatch.setattr(d, "_log_partition_by_hidden", not_hidden)
    assert torch.allclose(d.log_partition(), expected, atol=1e-10, rtol=0)


def test_marginal_log_prob_equals_summation_over_missing_units():
    d = _rbm(6, 3)
    observed = torch.tensor([True, False, True, False, False, True])
    v = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0], dtype=D)
    total = []
    for fill in itertools.product([0.0, 1.0], repeat=3):
        full = v.clone()
        full[~observed] = torch.tensor(fill, dtype=D)
        total.append(d.log_prob(full))
    assert torch.allclose(
        d.marginal_log_prob(v, observed), torch.logsumexp(torch.stack(total), 0), atol=1e-10
    )


@pytest.mark.parametrize(
    "visible,n", [("softmax", 1), ("binomial_softmax", 2), ("binomial_softmax", 3)]
)
def test_softmax_units_conditionals_and_partition_by_replica_enumeration(visible, n):
    """A binomial-softmax unit is n softmax replicas with shared weights (seed 003 eq. 16):
    its partition function equals that of the softmax RBM with W and c tiled n times."""
    V, K, H = 3, 3, 2
    d = _rbm(V, H, K=K, visible=visible, n=n, seed=3)
    replicas = RBM(
        d.W.repeat(1, n, 1), d.visible_bias.repeat(n, 1), d.hidden_bias, visible="softmax"
    )
    assert torch.allclose(d.log_partition("hidden"), replicas.log_partition("visible"), atol=1e-10)
    assert torch.allclose(d.log_partition("visible"), replicas.log_partition("visible"), atol=1e-10)
    # p(v_i | h): enumerate the replica states of unit 0 and count
    h = torch.tensor([1.0, 0.0], dtype=D)
    a = d.visible_bias[0] + torch.einsum("hk,h->k", d.W[:, 0], h)
    states = list(itertools.product(range(K), repeat=n))
    log_w = torch.stack([sum(a[s] for s in st) for st in states])
    counts = torch.zeros(K, dtype=D)
    for st, p in zip(states, torch.softmax(log_w, 0)):
        for s in st:
            counts[s] += p
    assert torch.allclose(d.visible_probs(h)[0], counts, atol=1e-12)
    # p(h_j = 1 | v) from the joint energy over the 2^H hidden configurations (eq. 15-16)
    v = d._visible_configurations()[5]
    hs = _bits(H)
    neg_e = torch.stack([-d.energy(v, hh) for hh in hs])
    p_h = (torch.softmax(neg_e, 0)[:, None] * hs).sum(0)
    assert torch.allclose(d.hidden_probs(v), p_h, atol=1e-12)


def test_bernoulli_conditionals_by_enumeration():
    d = _rbm(4, 3)
    v, hs = _bits(4), _bits(3)
    x = v[6]
    neg_e = torch.stack([-d.energy(x, hh) for hh in hs])
    assert torch.allclose(d.hidden_probs(x), (torch.softmax(neg_e, 0)[:, None] * hs).sum(0))
    h = hs[5]
    neg_e = torch.stack([-d.energy(vv, h) for vv in v])
    assert torch.allclose(d.visible_probs(h), (torch.softmax(neg_e, 0)[:, None] * v).sum(0))


def test_gibbs_chain_reaches_the_exact_distribution():
    torch.manual_seed(2)
    d = _rbm(3, 2, scale=1.5, seed=4)
    states = _bits(3)
    probs = d.normalized_log_prob(states).exp()
    draws = d.gibbs(torch.zeros(20000, 3, dtype=D), k=20)
    codes = (draws * torch.tensor([4.0, 2.0, 1.0], dtype=D)).sum(-1).long()
    freq = torch.bincount(codes, minlength=8).to(D) / draws.shape[0]
    se = (probs * (1 - probs) / draws.shape[0]).sqrt()
    assert ((freq - probs).abs() <= 4 * se + 1e-4).all()
    # the persistent chain of sample(): first call burns in, later calls continue
    s1 = d.sample((100,))
    s2 = d.sample((100,))
    assert s1.shape == s2.shape == (100, 3)
    assert d._chain is not None and torch.equal(d._chain, s2)


def test_factored_weights_and_pseudo_likelihood():
    g = torch.Generator().manual_seed(5)
    A, B = torch.randn(2, 5, generator=g, dtype=D), torch.randn(4, 2, generator=g, dtype=D)
    c, b = torch.randn(5, dtype=D), torch.randn(4, dtype=D)
    d = RBM.from_factors(A, B, c, b)
    assert torch.allclose(d.W, B @ A)
    v = _bits(5)[[3, 17, 30]]
    # log p(v_i | v_-i) by the exact joint: flip unit i
    expected = torch.zeros(3, dtype=D)
    for i in range(5):
        flipped = v.clone()
        flipped[:, i] = 1 - flipped[:, i]
        lp, lq = d.log_prob(v), d.log_prob(flipped)
        expected += lp - torch.logaddexp(lp, lq)
    assert torch.allclose(d.pseudo_log_likelihood(v), expected, atol=1e-12)
    s = _rbm(3, 2, K=3, visible="softmax", seed=6)
    x = s._visible_configurations()[[2, 11]]
    expected = torch.zeros(2, dtype=D)
    for i in range(3):
        alts = []
        for k in range(3):
            y = x.clone()
            y[:, i] = torch.nn.functional.one_hot(torch.tensor(k), 3).to(D)
            alts.append(s.log_prob(y))
        expected += s.log_prob(x) - torch.logsumexp(torch.stack(alts), 0)
    assert torch.allclose(s.pseudo_log_likelihood(x), expected, atol=1e-12)


def test_reconstruction_error_and_shared():
    d = _rbm(5, 3)
    v = _bits(5)[[1, 9]]
    recon = torch.sigmoid(d.visible_bias + torch.sigmoid(d.hidden_bias + v @ d.W.T) @ d.W)
    assert torch.allclose(d.reconstruction_error(v), ((v - recon) ** 2).sum(-1))
    expanded = d.expand((4,))
    assert expanded.batch_shape == (4,)
    shared = expanded.shared()
    assert shared.batch_shape == () and torch.equal(shared.hidden_bias, d.hidden_bias)
    with pytest.raises(ValueError, match="differ"):
        RBM(d.W, d.visible_bias, torch.randn(4, 3, dtype=D)).shared()


def test_validation():
    W = torch.randn(3, 4)
    with pytest.raises(ValueError, match="visible must be"):
        RBM(W, torch.zeros(4), torch.zeros(3), visible="gaussian")
    with pytest.raises(ValueError, match="hidden_bias"):
        RBM(W, torch.zeros(4), torch.zeros(2))
    with pytest.raises(ValueError, match="visible_bias"):
        RBM(W, torch.zeros(5), torch.zeros(3))
    with pytest.raises(ValueError, match="non-finite"):
        RBM(W * float("nan"), torch.zeros(4), torch.zeros(3))
    with pytest.raises(ValueError, match="num_trials"):
        RBM(W, torch.zeros(4), torch.zeros(3), num_trials=2)
    with pytest.raises(ValueError, match="K >= 2"):
        RBM(torch.randn(3, 4, 1), torch.zeros(4, 1), torch.zeros(3), visible="softmax")
    with pytest.raises(TypeError, match="visible_mask"):
        RBM(W, torch.zeros(4), torch.zeros(3), visible_mask=torch.ones(4))
    d = RBM(W, torch.zeros(4), torch.zeros(3), validate_args=True)
    with pytest.raises(ValueError):
        d.log_prob(torch.full((4,), 0.5))
    with pytest.raises(ValueError, match="2\\^H"):
        RBM(torch.randn(30, 40), torch.zeros(40), torch.zeros(30)).log_partition()
