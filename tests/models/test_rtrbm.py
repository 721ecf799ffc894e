"""RTRBM / SRTRBM (seed 000): the CD gradient against the seed's BPTT recursion written out here
from eq. 1.16-1.27, exact log-likelihoods against enumeration, AIS, masks, generation."""

import itertools

import pyro
import pytest
import torch
from pyro.infer import SVI
from pyro.optim import Adam, ClippedAdam

from pyro_seq.infer import ContrastiveDivergence
from pyro_seq.models import RTRBM, SRTRBM


def _sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def seed_cd_update(W, U, b, c, b_init, v, v_neg):
    """Delta_theta of seed 000 eq. 1.16-1.27 for one sequence, from the equations only.

    v, v_neg: (T, V) data and negative (CD) visibles; expectations over h in closed form.
    Returns the ascent directions (dW, dU, db, dc, db_init).
    """
    T = v.shape[0]
    # r_t (eq. 1.2), 1-based in the seed, 0-based here
    r = []
    for t in range(T):
        pre = W @ v[t] + (b_init if t == 0 else b + U @ r[t - 1])
        r.append(_sigmoid(pre))
    bias = [b_init] + [b + U @ r[t - 1] for t in range(1, T)]
    h_pos = [_sigmoid(W @ v[t] + bias[t]) for t in range(T)]  # E[h_t | v_t, r_{t-1}]
    h_neg = [_sigmoid(W @ v_neg[t] + bias[t]) for t in range(T)]  # E[h_t | v'_t, r_{t-1}]
    # D_{t+1} (eq. 1.22), D_{T+1} = 0; D[t] below is the seed's D_{t+1} (0-based t)
    D = [None] * T
    D[T - 1] = torch.zeros_like(b)
    for t in range(T - 2, -1, -1):
        D[t] = U.T @ (D[t + 1] * r[t + 1] * (1 - r[t + 1]) + h_pos[t + 1] - h_neg[t + 1])
    dU = sum(
        torch.outer(D[t] * r[t] * (1 - r[t]) + h_pos[t] - h_neg[t], r[t - 1]) for t in range(1, T)
    )  # (1.16)
    dW = sum(torch.outer(h_pos[t], v[t]) - torch.outer(h_neg[t], v_neg[t]) for t in range(T))
    dW = dW + sum(torch.outer(D[t] * r[t] * (1 - r[t]), v[t]) for t in range(T - 1))  # (1.25)
    dc = sum(v[t] - v_neg[t] for t in range(T))
    db = sum(h_pos[t] - h_neg[t] for t in range(1, T))
    db = db + sum(
        (D[t] * r[t] * (1 - r[t]) for t in range(1, T - 1)), torch.zeros_like(b)
    )  # (1.26)
    db_init = h_pos[0] - h_neg[0] + D[0] * r[0] * (1 - r[0])  # (1.27)
    return dW, dU, db, dc, db_init


@pytest.mark.parametrize("k", [1, 3])
def test_cd_gradient_equals_seed_bptt_recursion(k):
    torch.manual_seed(0)
    pyro.clear_param_store()
    B, T, V, H = 3, 5, 6, 4
    model = RTRBM(V, H, init_scale=0.5).double()
    with torch.no_grad():
        for p in (model.b, model.c, model.b_init):
            p.normal_(0, 0.5)
    x = (torch.rand(B, T, V) < 0.4).double()
    cd = ContrastiveDivergence(k=k)
    loss = cd.differentiable_loss(model.model, model.guide, x)
    loss.backward()
    negatives = cd.last_negatives["x"]
    assert negatives.shape == x.shape
    expected = [torch.zeros_like(p) for p in (model.W, model.U, model.b, model.c, model.b_init)]
    with torch.no_grad():
        for i in range(B):
            upd = seed_cd_update(
                model.W, model.U, model.b, model.c, model.b_init, x[i], negatives[i]
            )
            expected = [e + u for e, u in zip(expected, upd)]
    # SVI descends the surrogate: its gradient is minus the seed's ascent direction
    for name, param, delta in zip(
        ("W", "U", "b", "c", "b_init"), (model.W, model.U, model.b, model.c, model.b_init), expected
    ):
        assert torch.allclose(param.grad, -delta, atol=1e-12, rtol=1e-10), name


def test_svi_step_applies_the_seed_update_with_sgd():
    torch.manual_seed(1)
    pyro.clear_param_store()
    model = RTRBM(5, 3, init_scale=0.5).double()
    x = (torch.rand(2, 4, 5) < 0.5).double()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cd = ContrastiveDivergence(k=1)
    svi = SVI(model.model, model.guide, pyro.optim.SGD({"lr": 0.1}), cd)
    svi.step(x)
    neg = cd.last_negatives["x"]
    total = [torch.zeros_like(before[n]) for n in ("W", "U", "b", "c", "b_init")]
    for i in range(2):
        upd = seed_cd_update(
            before["W"], before["U"], before["b"], before["c"], before["b_init"], x[i], neg[i]
        )
        total = [a + u for a, u in zip(total, upd)]
    for n, delta in zip(("W", "U", "b", "c", "b_init"), total):
        assert torch.allclose(
            dict(model.named_parameters())[n], before[n] + 0.1 * delta, atol=1e-12
        ), n


def _all_sequences(T, V):
    states = torch.tensor(list(itertools.product([0.0, 1.0], repeat=V)), dtype=torch.float64)
    idx = torch.tensor(list(itertools.product(range(states.shape[0]), repeat=T)))
    return states[idx]  # (S^T, T, V)


def _joint_energy_log_p(model, v):
    """log p(v_1:T) from eq. 1.1-1.3 by enumerating h_t and v'_t of each step's RBM."""
    W, U = model.weights()
    H, V = W.shape
    hs = torch.tensor(list(itertools.product([0.0, 1.0], repeat=H)), dtype=torch.float64)
    vs = torch.tensor(list(itertools.product([0.0, 1.0], repeat=V)), dtype=torch.float64)
    total, r = 0.0, None
    for t in range(v.shape[0]):
        bias = model.b_init if t == 0 else model.b + U @ r
        # -E(v, h) = h W v + c v + bias h, over all (v', h) for Z and all h for the numerator
        neg_e = lambda vv: hs @ W @ vv + model.c @ vv + hs @ bias  # noqa: E731
        log_num = torch.logsumexp(neg_e(v[t]), 0)
        log_z = torch.logsumexp(torch.stack([torch.logsumexp(neg_e(vv), 0) for vv in vs]), 0)
        total = total + log_num - log_z
        r = _sigmoid(W @ v[t] + bias)
    return total


def test_exact_log_likelihood_is_normalised_and_matches_the_energy():
    torch.manual_seed(2)
    model = RTRBM(3, 2, init_scale=0.8).double()
    with torch.no_grad():
        model.b.normal_(0, 0.5), model.c.normal_(0, 0.5), model.b_init.normal_(0, 0.5)
    seqs = _all_sequences(3, 3)  # 512 sequences of T = 3
    ll = model.log_likelihood(seqs).log_likelihood
    assert abs(float(torch.logsumexp(ll, 0))) < 1e-10  # sums to one over every sequence
    for i in (0, 77, 300, 511):
        assert torch.allclose(ll[i], _joint_energy_log_p(model, seqs[i]), atol=1e-10)


def test_padding_contributes_nothing():
    torch.manual_seed(3)
    model = RTRBM(4, 3, init_scale=0.5).double()
    x = (torch.rand(2, 6, 4) < 0.5).double()
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    ll = model.log_likelihood(x, mask)
    short = model.log_likelihood(x[1:, :4])
    assert torch.allclose(ll.log_likelihood[1], short.log_likelihood[0], atol=1e-12)
    assert ll.num_steps.tolist() == [6, 4]
    # and the CD surrogate ignores the padded steps, whatever values they hold
    x2 = x.clone()
    x2[1, 4:] = 1 - x2[1, 4:]
    cd = ContrastiveDivergence(k=1)
    torch.manual_seed(0)
    a = cd.differentiable_loss(model.model, model.guide, x, mask)
    torch.manual_seed(0)
    b = cd.differentiable_loss(model.model, model.guide, x2, mask)
    assert torch.allclose(a, b, atol=1e-12)


def test_ais_log_likelihood_within_three_standard_errors():
    torch.manual_seed(4)
    model = RTRBM(8, 4, init_scale=1.0).double()
    x = (torch.rand(3, 5, 8) < 0.3).double()
    exact = model.log_likelihood(x).log_likelihood
    est = model.log_likelihood(x, method="ais", num_chains=200, num_betas=400, steps_per_chunk=7)
    assert ((est.log_likelihood - exact).abs() <= 3 * est.stderr + 1e-3).all()
    assert (est.stderr > 0).all()


def test_raise_per_step_agrees_with_the_exact_sequence_log_likelihood():
    """Reverse AIS per step (Burda et al. 2015), on a fine schedule, within a few standard errors
    of the exact value, with padded steps left out; a coarse schedule estimates the annealing
    model instead, measurably away from it (so the test sees the schedule)."""
    torch.manual_seed(6)
    model = RTRBM(8, 4, init_scale=1.0).double()
    x = (torch.rand(3, 5, 8) < 0.3).double()
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    exact = model.log_likelihood(x, mask).log_likelihood
    fine = model.log_likelihood(x, mask, "raise", num_chains=200, num_betas=400, steps_per_chunk=4)
    assert ((fine.log_likelihood - exact).abs() <= 4 * fine.stderr + 1e-3).all()
    assert (fine.stderr > 0).all()
    coarse = torch.stack(
        [model.log_likelihood(x, mask, "raise", 4, 2).log_likelihood for _ in range(100)]
    )
    se = coarse.std(0) / 10
    assert ((coarse.mean(0) - exact).abs() > 4 * se).any()
    with pytest.raises(ValueError, match="'raise'"):
        model.log_likelihood(x, method="reverse")


def test_reverse_ais_per_step_agrees_with_the_exact_sequence_log_likelihood():
    """Reverse AIS from Gibbs draws of each step's RBM (the lower half of bidirectional Monte
    Carlo) on a fine schedule: within a few standard errors of the exact value, padded steps
    left out."""
    torch.manual_seed(7)
    model = RTRBM(8, 4, init_scale=1.0).double()
    x = (torch.rand(3, 5, 8) < 0.3).double()
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 2:] = False
    exact = model.log_likelihood(x, mask).log_likelihood
    est = model.log_likelihood(
        x, mask, "reverse_ais", num_chains=200, num_betas=400, gibbs_steps=200, steps_per_chunk=5
    )
    assert ((est.log_likelihood - exact).abs() <= 4 * est.stderr + 1e-3).all()
    assert (est.stderr > 0).all()


def test_generate_first_step_matches_the_initial_rbm():
    torch.manual_seed(5)
    model = RTRBM(3, 2, init_scale=1.0).double()
    samples = model.generate(4000, 1, gibbs_steps=30)[0][:, 0]
    states = _all_sequences(1, 3)[:, 0]
    from pyro_seq.distributions import RBM

    probs = RBM(model.W, model.c, model.b_init).normalized_log_prob(states).exp()
    codes = (samples * torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)).sum(-1).long()
    freq = torch.bincount(codes, minlength=8).double() / 4000
    order = (states * torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64)).sum(-1).long()
    se = (probs * (1 - probs) / 4000).sqrt()
    assert ((freq[order] - probs).abs() <= 4 * se + 1e-3).all()


def test_generate_keeps_the_prefix():
    torch.manual_seed(6)
    model = RTRBM(5, 3)
    prefix = (torch.rand(2, 3, 5) < 0.5).float()
    out, logits = model.generate(2, 6, gibbs_steps=2, prefix=prefix)
    assert out.shape == logits.shape == (2, 6, 5)
    assert torch.equal(out[:, :3], prefix)
    assert set(out.unique().tolist()) <= {0.0, 1.0}


def test_srtrbm_masked_entries_get_zero_gradient_and_stay_zero():
    torch.manual_seed(7)
    pyro.clear_param_store()
    W_mask, U_mask = SRTRBM.block_masks([[0, 1, 2], [3, 4, 5]], 2, edges=[])
    model = SRTRBM(6, 4, W_mask, U_mask, init_scale=0.5)
    assert torch.equal(model.W.detach() * (1 - W_mask), torch.zeros(4, 6))
    x = (torch.rand(4, 5, 6) < 0.5).float()
    svi = SVI(model.model, model.guide, ClippedAdam({"lr": 0.05}), ContrastiveDivergence(k=1))
    for _ in range(5):
        svi.step(x)
    loss = ContrastiveDivergence(k=1).differentiable_loss(model.model, model.guide, x)
    model.zero_grad()
    loss.backward()
    assert torch.equal(model.W.grad * (1 - W_mask), torch.zeros(4, 6))
    assert torch.equal(model.U.grad * (1 - U_mask), torch.zeros(4, 4))
    assert torch.equal(model.W.detach() * (1 - W_mask), torch.zeros(4, 6))
    assert torch.equal(model.U.detach() * (1 - U_mask), torch.zeros(4, 4))
    assert (model.W.detach() * W_mask).abs().sum() > 0


def test_training_raises_the_exact_log_likelihood():
    torch.manual_seed(8)
    pyro.clear_param_store()
    # data: a binary pattern that shifts by one unit per step
    T, V = 6, 5
    base = torch.zeros(64, T, V)
    start = torch.randint(V, (64,))
    for t in range(T):
        base[torch.arange(64), t, (start + t) % V] = 1.0
    model = RTRBM(V, 4, init_scale=0.1)
    before = model.log_likelihood(base).log_likelihood.mean()
    svi = SVI(model.model, model.guide, Adam({"lr": 0.05}), ContrastiveDivergence(k=1))
    for _ in range(300):
        svi.step(base)
    after = model.log_likelihood(base).log_likelihood.mean()
    # a model that knows the shift needs about log 5 nats for the first step only
    assert after > before + 5.0
    assert after > -(T * V * 0.3 + 2.0)


def test_bad_input_is_refused():
    model = RTRBM(4, 2)
    with pytest.raises(ValueError, match="binary|0 and 1|0/1"):
        model.log_likelihood(torch.full((1, 3, 4), 0.5))
    with pytest.raises(ValueError):
        model.log_likelihood(torch.zeros(1, 3, 5))
    with pytest.raises(ValueError, match="method"):
        model.log_likelihood(torch.zeros(1, 3, 4), method="nope")
    with pytest.raises(ValueError, match="num_hidden"):
        RTRBM(4, 0)
    with pytest.raises(ValueError, match="W_mask"):
        SRTRBM(4, 2, torch.ones(3, 4))
    with pytest.raises(ValueError, match="gibbs_steps"):
        model.generate(1, 2, gibbs_steps=0)


def test_srtrbm_edges_are_checked_with_one_line_errors():
    """A bad ``edges`` is a ValueError naming the argument (it was an unpacking error)."""
    for bad in ("foo", [(0, 5)], [(0,)], ["ab"], [(0.5, 1)]):
        with pytest.raises(ValueError, match="edge"):
            SRTRBM.for_data(12, 0, num_groups=3, hidden_per_group=2, edges=bad)
    # the chain links neighbouring groups only: hidden blocks 0-1 and 1-2, not 0-2
    model = SRTRBM.for_data(12, 0, num_groups=3, hidden_per_group=2, edges="chain")
    U_blocks = model.U_mask[::2, ::2]
    assert U_blocks.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
    listed = SRTRBM.for_data(12, 0, num_groups=3, hidden_per_group=2, edges=[(0, 2)])
    assert listed.U_mask[::2, ::2].tolist() == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
