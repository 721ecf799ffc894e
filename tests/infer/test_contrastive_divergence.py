"""ContrastiveDivergence: the gradient is the CD update of seed 003 eq. 6-8 (hidden
expectations in closed form) with the negatives it used; plates, masks, optimisers, PCD."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI
from pyro.optim import ClippedAdam, ExponentialLR

from pyro_seq.distributions import RBM
from pyro_seq.infer import ContrastiveDivergence

D = torch.float64


def _params(V=6, H=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(t)
        for t in (
            0.5 * torch.randn(H, V, generator=g, dtype=D),
            torch.randn(V, generator=g, dtype=D),
            torch.randn(H, generator=g, dtype=D),
        )
    ]


def _data(N=20, V=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(N, V, generator=g, dtype=D) < 0.4).to(D)


def _cd_update(W, c, b, v, v_neg):
    """Seed 003 eq. 6-8 with E[h|v] = sigmoid(b + W v): the ascent directions, summed over rows."""
    hp, hn = torch.sigmoid(b + v @ W.T), torch.sigmoid(b + v_neg @ W.T)
    return hp.T @ v - hn.T @ v_neg, (v - v_neg).sum(0), (hp - hn).sum(0)


def _model(W, c, b, subsample=None, N=None):
    def model(x, mask=None):
        plate = pyro.plate("data", N or x.shape[0], subsample=subsample)
        with plate:
            fn = RBM(W, c, b)
            pyro.sample("x", fn if mask is None else fn.mask(mask), obs=x)

    return model


def guide(*args, **kwargs):
    pass


@pytest.mark.parametrize("k", [1, 5])
def test_gradient_is_the_cd_update_with_the_negatives_used(k):
    W, c, b = _params()
    x = _data()
    cd = ContrastiveDivergence(k=k)
    cd.loss_and_grads(_model(W, c, b), guide, x)
    neg = cd.last_negatives["x"]
    assert neg.shape == x.shape and not torch.equal(neg, x)
    dW, dc, db = _cd_update(W.detach(), c.detach(), b.detach(), x, neg)
    assert torch.allclose(W.grad, -dW, atol=1e-12)
    assert torch.allclose(c.grad, -dc, atol=1e-12)
    assert torch.allclose(b.grad, -db, atol=1e-12)


def test_subsampled_plate_scales_and_mask_removes_rows():
    W, c, b = _params()
    x = _data(8)
    mask = torch.tensor([True, True, False, True, False, True, True, True])
    cd = ContrastiveDivergence(k=1)
    loss = cd.differentiable_loss(_model(W, c, b, subsample=torch.arange(8), N=40), guide, x, mask)
    loss.backward()
    neg = cd.last_negatives["x"]
    dW, dc, db = _cd_update(W.detach(), c.detach(), b.detach(), x[mask], neg[mask])
    assert torch.allclose(W.grad, -5.0 * dW, atol=1e-12)  # N / B = 40 / 8
    assert torch.allclose(c.grad, -5.0 * dc, atol=1e-12)
    assert torch.allclose(b.grad, -5.0 * db, atol=1e-12)


def test_mask_outside_to_event_is_aligned():
    W, c, b = _params()
    x = _data(12).reshape(3, 4, 6)
    rows = torch.tensor([True, False, True])

    def model(x):
        with pyro.plate("seq", 3):
            pyro.sample("x", RBM(W, c, b.expand(3, 4, 3)).to_event(1).mask(rows), obs=x)

    cd = ContrastiveDivergence(k=1)
    cd.differentiable_loss(model, guide, x).backward()
    neg = cd.last_negatives["x"]
    dW, _, _ = _cd_update(
        W.detach(), c.detach(), b.detach(), x[rows].reshape(-1, 6), neg[rows].reshape(-1, 6)
    )
    assert torch.allclose(W.grad, -dW, atol=1e-12)


def test_cd_learns_the_maximum_likelihood_biases_of_an_independent_model():
    """With W = 0 one Gibbs sweep is an exact draw, so CD is unbiased maximum likelihood:
    c converges to logit of the data means."""
    torch.manual_seed(0)
    pyro.clear_param_store()
    V, H = 5, 2
    x = _data(400, V, seed=3)
    W = torch.zeros(H, V, dtype=D)
    c = torch.nn.Parameter(torch.zeros(V, dtype=D))
    b = torch.zeros(H, dtype=D)
    opt = torch.optim.SGD([c], lr=0.02)
    cd = ContrastiveDivergence(k=1)
    for step in range(1500):
        opt.zero_grad()
        cd.loss_and_grads(_model(W, c, b), guide, x)
        for g in opt.param_groups:
            g["lr"] = 0.02 / (1 + step / 100)
        c.grad /= x.shape[0]
        opt.step()
    target = torch.logit(x.mean(0))
    # Robbins-Monro noise: tolerance of a few standard errors of logit(mean) over 400 rows
    assert torch.allclose(c.detach(), target, atol=0.15)


def test_composes_with_clipped_adam_and_a_scheduler():
    pyro.clear_param_store()
    torch.manual_seed(1)
    V, H = 6, 3

    def model(x):
        W = pyro.param("W", 0.01 * torch.randn(H, V, dtype=D))
        c = pyro.param("c", torch.zeros(V, dtype=D))
        b = pyro.param("b", torch.zeros(H, dtype=D))
        with pyro.plate("data", 200, subsample_size=25) as idx:
            pyro.sample("x", RBM(W, c, b), obs=x[idx])

    x = _data(200, V, seed=4)
    scheduler = ExponentialLR(
        {"optimizer": torch.optim.Adam, "optim_args": {"lr": 0.05}, "gamma": 0.99}
    )
    svi = SVI(model, guide, scheduler, ContrastiveDivergence(k=1))
    for _ in range(150):
        monitor = svi.step(x)
        scheduler.step()
    W, c, b = (pyro.param(n).detach() for n in ("W", "c", "b"))
    fitted = RBM(W, c, b).normalized_log_prob(x).mean()
    start = RBM(torch.zeros(H, V, dtype=D), torch.zeros(V, dtype=D), torch.zeros(H, dtype=D))
    p = x.mean(0)
    independent_ml = (x * p.log() + (1 - x) * (1 - p).log()).sum(-1).mean()  # -4.04 here
    # uniform start: 6 log(1/2) = -4.159; the independent optimum is within 0.12 of it
    assert fitted > independent_ml - 0.03
    assert fitted > start.normalized_log_prob(x).mean() + 0.09
    assert 0.0 <= monitor < 0.25
    svi2 = SVI(
        model, guide, ClippedAdam({"lr": 0.01, "clip_norm": 1.0}), ContrastiveDivergence(k=2)
    )
    assert isinstance(svi2.step(x), float)


def test_persistent_chains_continue_between_steps():
    W, c, b = _params()
    x = _data(10)
    cd = ContrastiveDivergence(k=1, persistent=True)
    cd.differentiable_loss(_model(W, c, b), guide, x)
    first = cd.chains["x"].clone()
    torch.manual_seed(7)
    cd.differentiable_loss(_model(W, c, b), guide, x)
    torch.manual_seed(7)
    expected = RBM(W.detach(), c.detach(), b.detach()).expand((10,)).gibbs(first, 1)
    assert torch.equal(cd.chains["x"], expected)
    cd.reset_chains()
    assert cd.chains == {}


def test_persistent_shared_chains_and_their_refusal_for_conditional_rbms():
    W, c, b = _params()
    x = _data(10)
    cd = ContrastiveDivergence(k=1, persistent=True, num_chains=7)
    loss = cd.differentiable_loss(_model(W, c, b), guide, x)
    loss.backward()
    chains = cd.chains["x"]
    assert chains.shape == (7, 6)
    hp = torch.sigmoid(b.detach() + x @ W.detach().T)
    hn = torch.sigmoid(b.detach() + chains @ W.detach().T)
    expected = hp.T @ x - 10 * (hn.T @ chains) / 7  # negative phase: chain mean, per row
    assert torch.allclose(W.grad, -expected, atol=1e-12)

    def conditional(x):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("x", RBM(W, c, b + torch.randn(x.shape[0], 3, dtype=D)), obs=x)

    with pytest.raises(ValueError, match="differ"):
        cd.differentiable_loss(conditional, guide, x)


def test_monitor_values():
    W, c, b = _params()
    x = _data(9)
    fn = RBM(W.detach(), c.detach(), b.detach())
    rec = ContrastiveDivergence(k=1).loss(_model(W, c, b), guide, x)
    assert abs(rec - float(fn.reconstruction_error(x).sum()) / x.numel()) < 1e-12
    pl = ContrastiveDivergence(k=1, monitor="pseudo_likelihood").loss(_model(W, c, b), guide, x)
    assert abs(pl + float(fn.pseudo_log_likelihood(x).sum()) / x.numel()) < 1e-12


def test_ordinary_observed_sites_add_their_negative_log_likelihood():
    W, c, b = _params()
    x = _data(5)
    loc = torch.nn.Parameter(torch.tensor(0.3, dtype=D))
    y = torch.tensor([0.1, -0.2, 0.4], dtype=D)

    def model(x):
        with pyro.plate("data", 5):
            pyro.sample("x", RBM(W, c, b), obs=x)
        with pyro.plate("ys", 3):
            pyro.sample("y", dist.Normal(loc, 1.0), obs=y)

    ContrastiveDivergence(k=1).differentiable_loss(model, guide, x).backward()
    assert torch.allclose(loc.grad, -(y - loc.detach()).sum())


def test_refusals():
    W, c, b = _params()
    x = _data(4)

    def normal_only(x):
        pyro.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))

    with pytest.raises(ValueError, match="energy-based"):
        ContrastiveDivergence().loss(normal_only, guide, x)

    def latent(x):
        pyro.sample("z", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 4):
            pyro.sample("x", RBM(W, c, b), obs=x)

    with pytest.raises(ValueError, match="latent"):
        ContrastiveDivergence().loss(latent, guide, x)

    def sampling_guide(x):
        pyro.sample("z", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match="guide must be empty"):
        ContrastiveDivergence().loss(_model(W, c, b), sampling_guide, x)
    for kwargs in (
        {"k": 0},
        {"k": 1.5},
        {"num_chains": 3},
        {"monitor": "elbo"},
        {"persistent": True, "num_chains": 0},
    ):
        with pytest.raises(ValueError):
            ContrastiveDivergence(**kwargs)


def _rtrbm(V=4, H=3):
    from pyro_seq.models import RTRBM

    torch.manual_seed(3)
    m = RTRBM(V, H, init_scale=0.5).double()
    with torch.no_grad():
        m.b.normal_()
        m.c.normal_()
        m.b_init.normal_()
    return m


def _padded(lengths, T, V=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(len(lengths), T, V, generator=g, dtype=D) < 0.5).to(D)
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


def test_persistent_chains_of_an_rtrbm_survive_a_change_of_batch_shape(monkeypatch):
    """PCD over padded minibatches of different (batch, T): batch 2 continues, slot by slot and
    step by step, the chains batch 1 left (the buffer grows to the largest shape; padded and
    unreached slots keep their state; a slot first reached at a real step starts at the data)."""
    m = _rtrbm()
    starts, gibbs = [], RBM.gibbs
    monkeypatch.setattr(
        RBM, "gibbs", lambda self, v, k=1: starts.append(v.clone()) or gibbs(self, v, k)
    )
    cd = ContrastiveDivergence(k=2, persistent=True)
    x1, mask1 = _padded([5, 2, 4], 5, seed=1)  # batch 1: (3, 5)
    x2, mask2 = _padded([3, 3, 1, 3], 3, seed=2)  # batch 2: (4, 3)
    torch.manual_seed(10)
    cd.differentiable_loss(m.model, m.guide, x1, mask1)
    after1 = cd.chains["x"].clone()
    assert after1.shape == (3, 5, 4)
    # batch 1 by hand: every chain starts at the data; only the real steps are kept
    torch.manual_seed(10)
    ref1 = m.step_rbms(x1).gibbs(x1, 2)
    assert torch.equal(after1[mask1], ref1[mask1])
    assert torch.equal(after1[~mask1], torch.zeros_like(after1[~mask1]))  # never started
    torch.manual_seed(11)
    cd.differentiable_loss(m.model, m.guide, x2, mask2)
    # the start batch 2 continues: batch 1's chain where batch 1 had a real step, else the data
    start = x2.clone()
    for i in range(4):
        for t in range(3):
            if i < 3 and mask1[i, t]:
                start[i, t] = after1[i, t]
    assert not torch.equal(start[mask2], x2[mask2])  # the test would notice a restart
    assert torch.equal(starts[-1][mask2], start[mask2])
    torch.manual_seed(11)
    ref2 = m.step_rbms(x2).gibbs(start, 2)
    neg = cd.last_negatives["x"]
    assert torch.equal(neg[mask2], ref2[mask2])
    after2 = cd.chains["x"]
    assert after2.shape == (4, 5, 4)  # the largest shape seen
    assert torch.equal(after2[:4, :3][mask2], ref2[mask2])
    # steps batch 2 does not reach (t >= 3) and its padded steps keep batch 1's state
    assert torch.equal(after2[:3, 3:], after1[:, 3:])
    assert torch.equal(after2[2, 1:3], after1[2, 1:3])
    assert torch.equal(after2[3, 3:], torch.zeros(2, 4, dtype=D))
    assert cd.chains_started["x"].tolist() == [
        [True] * 5,
        [True, True, True, False, False],
        [True] * 4 + [False],
        [True] * 3 + [False] * 2,
    ]
    with pytest.raises(ValueError, match="reset_chains"):
        cd.differentiable_loss(_model(*_params(V=4)), guide, x2[:, 0])
    cd.reset_chains()
    assert cd.chains == {} and cd.chains_started == {}
