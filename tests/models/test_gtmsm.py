"""GTM-SM (thesis Ch. 7): the mixture prior and transitions against hand computations, perfect
memory recall, a hand-computed reference ELBO, masks, validation and every objective."""

import itertools
import math
import re

import pyro
import pyro.poutine as poutine
import pytest
import torch
import torch.nn as nn
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam

from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models import GTMSM
from pyro_seq.nn import DND

# ACTIONS = up, down, left, right, stay on (row, col): the true displacement matrix
TRUE_M = torch.tensor([[-1.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 1.0, 0.0]], dtype=torch.float64)


@pytest.fixture(autouse=True)
def _clear():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


#: the thesis's literal settings (the defaults are the learning aids of the module docstring)
THESIS = dict(displacements="free", neighbour_warmup=None, wall_lr_multiplier=1.0)


def small(**kw):
    """A small GTM-SM with the thesis's settings (``THESIS``), ``kw`` over them."""
    opts = dict(
        THESIS,
        frame_shape=(2, 2),
        tau=3,
        num_neighbours=3,
        z_dim=2,
        hidden_dims=(5,),
        walls=False,
        wall_hidden=4,
    )
    opts.update(kw)
    torch.manual_seed(0)
    return GTMSM(**opts).double()


def log_normal(x, loc, scale):
    return -0.5 * ((x - loc) / scale) ** 2 - math.log(scale) - 0.5 * math.log(2 * math.pi)


def hand_mixture_log_prob(z, s, keys, locs, scales, K, delta):
    """log sum_k w_k prod_j N(z_j; mu_kj, sigma_kj), w_k = (1/(d_k^2+delta)) / sum, over the K
    entries nearest to s (ties by write order), in Python floats."""
    rows = sorted(
        (sum((float(a) - float(b)) ** 2 for a, b in zip(s, key)), i) for i, key in enumerate(keys)
    )[:K]
    inv = [1.0 / (d2 + delta) for d2, _ in rows]
    total = sum(inv)
    dens = 0.0
    for (_d2, i), v in zip(rows, inv):
        comp = sum(
            log_normal(float(z[j]), float(locs[i][j]), float(scales[i][j])) for j in range(len(z))
        )
        dens += v / total * math.exp(comp)
    return math.log(dens)


def test_mixture_prior_log_density_equals_hand_computation():
    m = small(tau=9, num_neighbours=5, delta=1e-4)
    torch.manual_seed(1)
    B, n, Z = 2, 9, 2
    keys = torch.randn(B, n, 2, dtype=torch.float64)
    keys[1, 4] = keys[1, 2]  # a duplicate key: a tie
    locs = torch.randn(B, n, Z, dtype=torch.float64)
    scales = 0.3 + torch.rand(B, n, Z, dtype=torch.float64)
    dnd = DND(2).write(keys, torch.stack([locs, scales], -2))
    s = torch.randn(3, B, 2, dtype=torch.float64)  # 3 particles
    s[0, 0] = keys[0, 5]  # exactly on a stored state: d = 0, weight 1/delta
    z = torch.randn(3, B, Z, dtype=torch.float64)
    prior = m.memory_prior(s, dnd)
    assert prior.batch_shape == (3, B) and prior.event_shape == (Z,)
    lp = prior.log_prob(z)
    for p, b in itertools.product(range(3), range(B)):
        ref = hand_mixture_log_prob(z[p, b], s[p, b], keys[b], locs[b], scales[b], 5, 1e-4)
        assert math.isclose(float(lp[p, b]), ref, rel_tol=1e-10, abs_tol=1e-10)


def test_transitions_eq_7_3_walls_and_eq_7_4_rotation():
    m = small(walls=True)
    torch.manual_seed(2)
    s = torch.randn(4, 2, dtype=torch.float64)
    a = nn.functional.one_hot(torch.tensor([0, 1, 3, 4]), 5).double()
    d = a @ m.M.T
    lin1, lin2 = m.wall_net[0], m.wall_net[2]
    h = torch.relu((s + d) @ lin1.weight.T + lin1.bias)
    sigma = torch.sigmoid(h @ lin2.weight.T + lin2.bias)
    assert torch.allclose(m.transition_mean(s, a), s + d * sigma)
    r = small(walls=False, rotation=True, state_dim=3)
    s3 = torch.randn(4, 3, dtype=torch.float64)
    d3 = a @ r.M.T
    expected = []
    for i in range(4):
        c, sn = math.cos(float(s3[i, 2])), math.sin(float(s3[i, 2]))
        R = torch.tensor([[c, -sn, 0.0], [sn, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
        expected.append(s3[i] + R @ d3[i])
    assert torch.allclose(r.transition_mean(s3, a), torch.stack(expected))
    key = r.key(s3)
    assert torch.allclose(key, torch.cat([s3[:, :2], s3[:, 2:].cos(), s3[:, 2:].sin()], -1))


class IdentityEncoder(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x, torch.full_like(x, self.scale)


def perfect_memory_model(tau):
    """Frames are their own codes (z = x, decoder = identity) and M is the true displacement."""
    m = GTMSM(frame_shape=(8, 8), z_dim=64, tau=tau, walls=False, hidden_dims=(4,)).double()
    m.encoder_body, m.encoder_head, m.decoder = nn.Identity(), IdentityEncoder(0.05), nn.Identity()
    with torch.no_grad():
        m.set_displacement_matrix(TRUE_M)  # the default inverse pairs hold it
    return m


def test_perfect_memory_and_known_M_predict_the_stored_frames():
    torch.manual_seed(3)
    image = torch.rand(2, 32, 32, dtype=torch.float64)
    # memorise a snake over the 3x3 block around the centre (4, 4), then wander inside it;
    # no move hits a wall, so s_t = p_t - p_0 exactly under the linear transition
    U, D, L, R, S = range(5)
    memorise = [U, L, D, D, R, R, U, U, S, D, L]
    predict = [U, L, D, R, S, D, L, U, R, R, U]
    actions = torch.tensor([memorise + predict] * 2)
    moves = {U: (-1, 0), D: (1, 0), L: (0, -1), R: (0, 1), S: (0, 0)}
    pos, positions = (4, 4), []
    for a in actions[0].tolist():
        pos = (pos[0] + moves[a][0], pos[1] + moves[a][1])
        positions.append(pos)
    frames = torch.stack(
        [
            torch.stack(
                [image[b, 3 * r : 3 * r + 8, 3 * c : 3 * c + 8].flatten() for r, c in positions]
            )
            for b in range(2)
        ]
    )
    tau = len(memorise)
    m = perfect_memory_model(tau)
    out = m.predict(frames, actions)
    true_s = torch.tensor(positions, dtype=torch.float64) - torch.tensor([4.0, 4.0])
    assert torch.equal(out["states"][0], true_s[tau:])
    assert torch.equal(out["memory_states"][1], true_s[:tau])
    stored = {p: frames[:, i] for i, p in enumerate(positions[:tau])}
    assert all(p in stored for p in positions[tau:])
    for i, p in enumerate(positions[tau:]):
        # hand computation of the mixture mean: sum_k w_k mu_k over the 5 nearest entries
        for b in range(2):
            rows = sorted(
                (float(((true_s[tau + i] - true_s[j]) ** 2).sum()), j) for j in range(tau)
            )[:5]
            w = torch.tensor([1.0 / (d2 + 1e-4) for d2, _ in rows], dtype=torch.float64)
            mean = (w[:, None] * frames[b, [j for _, j in rows]]).sum(0) / w.sum()
            assert torch.allclose(out["frames"][b, i], mean, atol=1e-12)
            # the exact match holds weight >= 1e4 against <= 4 for the other four entries
            # (distances >= 1): the prediction is the stored frame to within 4e-4 of the range
            assert (out["frames"][b, i] - stored[p][b]).abs().max() <= 4e-4 * 1.0 + 1e-12
    # the model's own sites agree: at the true states the mixture prior is centred there
    s = true_s[tau : tau + 1].expand(2, 2).contiguous()
    dnd, _ = m.write_memory(frames[:, :tau], nn.functional.one_hot(actions[:, :tau], 5).double())
    m.eval()  # num_neighbours, as predict reads (training mode reads the warm-up's K = tau)
    prior = m.memory_prior(s, dnd)
    assert torch.allclose(prior.mean, out["z"][:, 0], atol=1e-12)


def test_reference_elbo_is_hand_computed():
    m = small(tau=3)
    B, T, F = 2, 6, 4
    torch.manual_seed(4)
    x = torch.rand(B, T, F, dtype=torch.float64)
    a = torch.randint(0, 5, (B, T))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 5:] = False
    pyro.set_rng_seed(5)
    loss = Trace_ELBO().differentiable_loss(m.model, m.guide, x, mask, inputs=a)
    pyro.set_rng_seed(5)
    trace = poutine.trace(m.guide).get_trace(x, mask, inputs=a)
    assert {n for n in trace.nodes if n.startswith(("s_", "z_"))} == {
        f"{v}_{t}" for v in "sz" for t in (4, 5, 6)
    }  # prediction steps only
    M = m.M.detach()
    r = m.r
    elbo = 0.0
    for b in range(B):
        mean = torch.zeros(2, dtype=torch.float64)
        keys = []
        for t in range(3):  # memorisation: E[s_t] = E[s_{t-1}] + M a_t
            mean = mean + M[:, int(a[b, t])]
            keys.append(mean.clone())
        q_loc, q_scale = (v.detach() for v in m.encode(x[b]))
        prev = mean
        for t in range(3, T):
            if not mask[b, t]:
                continue
            s = trace.nodes[f"s_{t + 1}"]["value"][b].detach()
            z = trace.nodes[f"z_{t + 1}"]["value"][b].detach()
            scale = r * math.sqrt(4) if t == 3 else r
            loc_s = prev + M[:, int(a[b, t])]
            log_ps = sum(log_normal(float(s[j]), float(loc_s[j]), scale) for j in range(2))
            log_qs = log_ps  # q(s) is the prior transition (eq. 7.2)
            log_pz = hand_mixture_log_prob(z, s, keys, q_loc[:3], q_scale[:3], 3, 1e-4)
            log_qz = sum(
                log_normal(float(z[j]), float(q_loc[t, j]), float(q_scale[t, j])) for j in range(2)
            )
            xhat = m.decode(z).detach()
            log_px = sum(log_normal(float(x[b, t, j]), float(xhat[j]), 0.1) for j in range(F))
            elbo += log_px + log_pz + log_ps - log_qz - log_qs
            prev = s
    assert math.isclose(-loss.item(), elbo, rel_tol=1e-9)


def test_padded_steps_contribute_nothing():
    m = small()
    x = torch.rand(2, 6, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 4:] = False
    guide = poutine.trace(m.guide).get_trace(x, mask, inputs=a)
    model = poutine.trace(poutine.replay(m.model, trace=guide)).get_trace(x, mask, inputs=a)
    model.compute_log_prob()
    for name in ("s_5", "z_5", "x_5", "s_6", "z_6", "x_6"):
        assert model.nodes[name]["log_prob"][0].item() == 0.0
        assert model.nodes[name]["log_prob"][1].item() != 0.0


def _elbo_at(m, x, mask, a, values=None):
    """log p - log q of one particle whose latent values are given (a dict of site name to
    ``(batch, ...)`` tensors; None: a draw of the guide): the guide replayed at them, then the
    model."""
    fixed = poutine.trace(m.guide).get_trace(x, mask, inputs=a)
    if values is None:
        values = {n: site["value"] for n, site in fixed.nodes.items() if n.startswith(("s_", "z_"))}
    assert set(values) == {n for n, site in fixed.nodes.items() if n.startswith(("s_", "z_"))}
    for name, value in values.items():
        fixed.nodes[name]["value"] = value
    guide = poutine.trace(poutine.replay(m.guide, trace=fixed)).get_trace(x, mask, inputs=a)
    model = poutine.trace(poutine.replay(m.model, trace=guide)).get_trace(x, mask, inputs=a)
    return model.log_prob_sum() - guide.log_prob_sum()


@pytest.mark.parametrize("inference", ["prior", "landmark"])
def test_sequences_no_longer_than_tau_contribute_exactly_nothing(inference):
    """A batch mixing sequences of lengths <= tau with longer ones has the bound of the long
    ones alone, bit for bit, at the same latent values (the short ones' sites are all masked);
    split into data-parallel shards, the short ones' shard (T = 3 = tau) adds exactly 0."""
    m = small(tau=3, walls=True, inference=inference, landmark_neighbours=2)
    torch.manual_seed(3)
    lengths = torch.tensor([7, 2, 6, 3])  # rows 1 and 3: no prediction step
    x = torch.rand(4, 7, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (4, 7))
    mask = torch.arange(7) < lengths.unsqueeze(-1)
    trace = poutine.trace(m.guide).get_trace(x, mask, inputs=a)
    values = {
        n: site["value"].detach()
        for n, site in trace.nodes.items()
        if site["type"] == "sample" and n.startswith(("s_", "z_"))
    }
    long_rows = torch.tensor([0, 2])
    mixed = _elbo_at(m, x, mask, a, values)
    alone = _elbo_at(
        m, x[long_rows], mask[long_rows], a[long_rows], {n: v[long_rows] for n, v in values.items()}
    )
    assert mixed.item() != 0.0 and torch.equal(mixed, alone)
    short_rows = torch.tensor([1, 3])
    shard = _elbo_at(m, x[short_rows, :3], mask[short_rows, :3], a[short_rows, :3])
    assert shard.item() == 0.0 and torch.equal(alone + shard, mixed)


@pytest.mark.parametrize("inference", ["prior", "landmark"])
def test_a_batch_of_sequences_no_longer_than_tau_gives_zero_with_zero_gradients(inference):
    """Such a batch (T <= tau, e.g. a data-parallel shard of short sequences) used to raise "no
    prediction step"; its bound is 0, every parameter a full batch reaches gets a zero gradient
    (so a gradient all-reduce sums the same tensors on every rank), and an SVI step runs."""
    m = small(tau=3, walls=True, inference=inference, landmark_neighbours=2)
    torch.manual_seed(4)
    x, a = torch.rand(3, 6, 4, dtype=torch.float64), torch.randint(0, 5, (3, 6))
    reached = set()
    Trace_ELBO().loss_and_grads(m.model, m.guide, x, None, inputs=a)
    reached = {n for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    short = (x[:, :3], torch.tensor([[True] * 3, [True] * 2 + [False], [True] * 3]), a[:, :3])
    for T in (3, 2):
        xs, ms, as_ = (v[:, :T] for v in short)
        loss = Trace_ELBO().differentiable_loss(m.model, m.guide, xs, ms, inputs=as_)
        assert loss.item() == 0.0
        loss.backward()
        got = {n for n, p in m.named_parameters() if p.grad is not None}
        assert got == reached
        assert all(not bool(p.grad.any()) for n, p in m.named_parameters() if n in got)
        m.zero_grad(set_to_none=True)
        assert TraceMeanField_ELBO().loss(m.model, m.guide, xs, ms, inputs=as_) == 0.0
        assert IWAE(num_particles=2).loss(m.model, m.guide, xs, ms, inputs=as_) == 0.0
        assert FIVO(num_particles=2).loss(m.model, m.guide, xs, ms, inputs=as_) == 0.0
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-2}), loss=Trace_ELBO())
    assert svi.step(*short[:2], inputs=short[2]) == 0.0
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())  # zero step
    assert math.isfinite(svi.step(x, None, inputs=a))  # and training goes on


def _check_grads(m):
    bad = [n for n, p in m.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not bad, f"parameters without a finite gradient: {bad}"


def _svi_step_with_gradients(m, loss, T, silent_prefix=""):
    """Gradients of one loss evaluation (finite for every parameter, nonzero for every one whose
    name starts with ``silent_prefix``), checked before an optimizer step (``SVI.step`` zeroes
    them afterwards), then one SVI step: finite loss and parameters."""
    x = torch.rand(3, T, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (3, T))
    mask = torch.ones(3, T, dtype=torch.bool)
    mask[2, 5:] = False
    pyro.set_rng_seed(0)
    value = loss.loss_and_grads(m.model, m.guide, x, mask, inputs=a)
    assert math.isfinite(value)
    _check_grads(m)
    silent = [
        n
        for n, p in m.named_parameters()
        if n.startswith(silent_prefix) and not bool((p.grad != 0).any())
    ]
    assert not silent, f"parameters with a zero gradient: {silent}"
    m.zero_grad()
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-3}), loss=loss)
    assert math.isfinite(svi.step(x, mask, inputs=a))
    assert all(torch.isfinite(p).all() for p in m.parameters())


@pytest.mark.parametrize(
    "loss",
    [Trace_ELBO(), TraceMeanField_ELBO(), IWAE(num_particles=3), FIVO(num_particles=3)],
    ids=["trace", "meanfield", "iwae", "fivo"],
)
def test_one_svi_step_every_parameter_has_a_finite_gradient(loss):
    m = small(walls=True)
    with torch.no_grad():  # its output weights start at 0, which stops the first layer's gradient
        m.wall_net[-1].weight.normal_(0.0, 0.5)
    _svi_step_with_gradients(m, loss, T=6)


def test_wall_network_starts_as_a_constant_so_inverse_moves_stay_inverse():
    m = small(walls=True)
    g = torch.Generator().manual_seed(0)
    s = 5 * torch.randn(50, 2, generator=g, dtype=torch.float64)
    a = nn.functional.one_hot(torch.randint(0, 4, (50,), generator=g), 5).to(torch.float64)
    sigma = torch.sigmoid(m.wall_net(s))
    assert torch.allclose(sigma, torch.full_like(sigma, 1 / (1 + math.exp(-3))), rtol=0, atol=1e-15)
    inverse = a[:, [1, 0, 3, 2, 4]]  # up <-> down, left <-> right
    M = m.displacement_matrix().detach()
    with torch.no_grad():
        m.set_displacement_matrix(
            torch.cat(
                [
                    M[:, :1],
                    -M[:, :1],
                    M[:, 2:3],
                    -M[:, 2:3],
                    torch.zeros(2, 1, dtype=torch.float64),
                ],
                1,
            )
        )
    back = m.transition_mean(m.transition_mean(s, a), inverse)
    assert torch.allclose(back, s, rtol=0, atol=1e-12)


def test_packed_actions_conv_colour_and_rotation_variants_train():
    torch.manual_seed(6)
    m = GTMSM(
        frame_shape=(3, 8, 8),
        tau=2,
        num_neighbours=2,
        z_dim=3,
        encoder="conv",
        channels=4,
        conv_layers=2,
        pack_actions=True,
        state_dim=3,
        rotation=True,
    ).double()
    assert m.obs_dim == 192 + 5 and m.input_dim == 0
    frames = torch.rand(2, 4, 192, dtype=torch.float64)
    acts = nn.functional.one_hot(torch.randint(0, 5, (2, 4)), 5).double()
    x = torch.cat([frames, acts], -1)
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-3}), loss=IWAE(num_particles=2))
    assert math.isfinite(svi.step(x, None))
    _check_grads(m)
    # packed and separate actions give the same bound
    u = GTMSM(
        frame_shape=(3, 8, 8),
        tau=2,
        num_neighbours=2,
        z_dim=3,
        encoder="conv",
        channels=4,
        conv_layers=2,
        state_dim=3,
        rotation=True,
    ).double()
    u.load_state_dict(m.state_dict())
    pyro.set_rng_seed(0)
    l1 = Trace_ELBO().loss(m.model, m.guide, x, None)
    pyro.set_rng_seed(0)
    l2 = Trace_ELBO().loss(u.model, u.guide, frames, None, inputs=acts)
    assert math.isclose(l1, l2, rel_tol=1e-12)


def test_int_and_one_hot_actions_agree():
    m = small()
    x = torch.rand(2, 5, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (2, 5))
    pyro.set_rng_seed(0)
    l1 = Trace_ELBO().loss(m.model, m.guide, x, None, inputs=a)
    pyro.set_rng_seed(0)
    l2 = Trace_ELBO().loss(m.model, m.guide, x, None, inputs=nn.functional.one_hot(a, 5).double())
    assert l1 == l2


def test_fivo_with_memorisation_steps_scales_by_the_subsampling_factor():
    """The first steps have no site; the batch plate's N/B factor is read from the first step
    that has one (log Z with num_sequences=N is N/B times the full-batch one)."""
    m = small()
    x = torch.rand(2, 6, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (2, 6))
    f = FIVO(num_particles=4, resample="never")
    pyro.set_rng_seed(1)
    l1 = f.loss(m.model, m.guide, x, None, inputs=a)
    pyro.set_rng_seed(1)
    l2 = f.loss(m.model, m.guide, x, None, 10, inputs=a)
    assert math.isclose(l2, 5.0 * l1, rel_tol=1e-12)


def test_bad_input_raises_clear_errors():
    m = small()
    x = torch.rand(2, 5, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (2, 5))
    with pytest.raises(ValueError, match="needs inputs"):
        m.model(x, None)
    with pytest.raises(ValueError, match="outside 0..4"):
        m.model(x, None, inputs=torch.full((2, 5), 5))
    with pytest.raises(ValueError, match="no prediction step"):  # predict needs T > tau
        m.predict(x[:, :3], a[:, :3])
    with pytest.raises(ValueError, match="observed"):
        m.model(x, None, observed=torch.ones(2, 5, dtype=torch.bool), inputs=a)
    with pytest.raises(ValueError, match="state_dim=3"):
        GTMSM(rotation=True)
    with pytest.raises(ValueError, match="delta"):
        GTMSM(delta=0.0)
    with pytest.raises(ValueError, match="encoder"):
        GTMSM(encoder="rnn")
    with pytest.raises(ValueError, match="tau must be a positive int"):
        m.tau = 0
    assert m.tau == 3


@pytest.mark.parametrize("bad", [-2, 0, 2.5, True, "3", None])
def test_tau_must_be_a_positive_int(bad):
    message = rf"tau must be a positive int .*got {re.escape(repr(bad))}"
    with pytest.raises(ValueError, match=message):
        small(tau=bad)
    m = small()
    with pytest.raises(ValueError, match=message):
        m.tau = bad
    if bad is not None:  # predict(tau=None) means the attribute
        with pytest.raises(ValueError, match="tau must be a positive int"):
            m.predict(
                torch.rand(1, 5, 4, dtype=torch.float64),
                torch.zeros(1, 5, dtype=torch.long),
                tau=bad,
            )


def test_num_neighbours_cannot_exceed_the_memorised_steps():
    """The memory holds one entry per memorised step: K > tau used to read min(K, tau) entries
    silently. Refused at construction, and at call time when tau or K changed since."""
    with pytest.raises(ValueError, match=r"num_neighbours=5 exceeds the memory: it holds tau=3"):
        small(tau=3, num_neighbours=5)
    with pytest.raises(
        ValueError,
        match=r"neighbour_warmup K_0=7 exceeds the memory: it holds "
        r"tau=6",
    ):
        small(tau=6, num_neighbours=2, neighbour_warmup=(7, 3))
    assert small(tau=3, num_neighbours=3).num_neighbours == 3  # K = tau: every entry
    m = small(tau=4, num_neighbours=4)
    x = torch.rand(2, 6, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (2, 6))
    m.tau = 3
    with pytest.raises(ValueError, match=r"num_neighbours=4 exceeds the memory: it holds tau=3"):
        Trace_ELBO().loss(m.model, m.guide, x, None, inputs=a)
    with pytest.raises(ValueError, match=r"num_neighbours=4 exceeds the memory: it holds tau=2"):
        m.predict(x, a, tau=2)
    m.num_neighbours = 3
    assert math.isfinite(Trace_ELBO().loss(m.model, m.guide, x, None, inputs=a))


def test_hidden_dims_must_be_positive_ints():
    for bad in ((0,), (5, 0), (-1,)):
        with pytest.raises(
            ValueError, match=r"hidden_dims must hold positive ints .*got " + re.escape(repr(bad))
        ):
            small(hidden_dims=bad)
        with pytest.raises(ValueError, match="hidden_dims must hold positive ints"):
            small(hidden_dims=bad, encoder="conv", frame_shape=(8, 8), channels=2, conv_layers=2)


# ---------------------------------------------------------------------------------------------
# Landmark inference network (thesis appendix 7.10)
# ---------------------------------------------------------------------------------------------


def landmark(**kw):
    opts = dict(inference="landmark", landmark_neighbours=2)
    opts.update(kw)
    return small(**opts)


def set_linear(layer, weight, bias):
    with torch.no_grad():
        layer.weight.copy_(torch.as_tensor(weight, dtype=layer.weight.dtype))
        layer.bias.copy_(torch.as_tensor(bias, dtype=layer.bias.dtype))


def randomise_landmark_nets(m, seed=7):
    """Nonzero weights everywhere (NN's output layer starts at 0), so no term is trivially 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in itertools.chain(m.landmark_beta.parameters(), m.landmark_var.parameters()):
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))


def test_landmark_merge_equals_the_appendix_formula_by_hand():
    """mu_q = mu_p + sum_k beta_k (mu_k - mu_p), log sigma_q^2 = log sigma_p^2 + NN(...), with
    one-hidden-unit networks set to known functions:
    beta(delta) = sigmoid(4 relu(1 - delta) - 2) and NN = (-2, -1) relu(1 - delta^(1))."""
    m = landmark(landmark_hidden=1)
    set_linear(m.landmark_beta[0], [[-1.0]], [1.0])
    set_linear(m.landmark_beta[2], [[4.0]], [-2.0])
    n_in = m.landmark_var[0].in_features
    assert n_in == 2 * (2 + 2) + 2  # delta (K'), log-variance ratios (K' S), prior (S), valid (K')
    w = [[0.0] * n_in]
    w[0][0] = -1.0  # feature 0 is delta^(1)
    set_linear(m.landmark_var[0], w, [1.0])
    set_linear(m.landmark_var[2], [[-2.0], [-1.0]], [0.0, 0.0])
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    mu_p, var_p = t([[1.0, -1.0]]), t([[0.04, 0.09]])  # 1 sequence, S = 2
    delta = t([[0.5, 2.0]])  # K' = 2
    mu_k = t([[[2.0, 0.0], [-3.0, 5.0]]])
    var_k = t([[[0.01, 0.01], [1.0, 1.0]]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    mu_q, var_q = m.landmark_merge(mu_p, var_p, delta, mu_k, var_k, valid)
    sig = lambda v: 1.0 / (1.0 + math.exp(-v))  # noqa: E731
    b1, b2 = sig(4 * 0.5 - 2), sig(4 * 0.0 - 2)  # beta(0.5) = 1/2, beta(2) = sigmoid(-2)
    expected_mu = [
        1.0 + b1 * (2.0 - 1.0) + b2 * (-3.0 - 1.0),
        -1.0 + b1 * (0.0 + 1.0) + b2 * (5.0 + 1.0),
    ]
    expected_var = [0.04 * math.exp(-2 * 0.5), 0.09 * math.exp(-1 * 0.5)]
    assert torch.allclose(mu_q, t([expected_mu]), rtol=0, atol=1e-14)
    assert torch.allclose(var_q, t([expected_var]), rtol=1e-14, atol=0)
    # the second slot empty (a memory of one entry): beta_2 = 0, the same NN (it reads delta^(1))
    mu_q, var_q = m.landmark_merge(mu_p, var_p, delta, mu_k, var_k, t([[1, 0]]).bool())
    assert torch.allclose(mu_q, t([[1.0 + b1, -1.0 + b1]]), rtol=0, atol=1e-14)
    assert torch.allclose(var_q, t([expected_var]), rtol=1e-14, atol=0)


def test_landmark_merge_broadcasts_over_particles_like_one_call_per_particle():
    m = landmark(landmark_neighbours=3)
    randomise_landmark_nets(m)
    torch.manual_seed(8)
    P, B, K, S = 4, 2, 3, 2
    mu_p = torch.randn(P, B, S, dtype=torch.float64)
    var_p = torch.rand(B, S, dtype=torch.float64) + 0.1
    delta = torch.rand(B, K, dtype=torch.float64)
    mu_k, var_k = torch.randn(B, K, S, dtype=torch.float64), torch.rand(B, K, S).double() + 0.1
    valid = torch.tensor([[True, True, True], [True, False, False]])
    mu_q, var_q = m.landmark_merge(mu_p, var_p, delta, mu_k, var_k, valid)
    assert mu_q.shape == var_q.shape == (P, B, S)
    for p, b in itertools.product(range(P), range(B)):
        one = m.landmark_merge(
            mu_p[p, b : b + 1],
            var_p[b : b + 1],
            delta[b : b + 1],
            mu_k[b : b + 1],
            var_k[b : b + 1],
            valid[b : b + 1],
        )
        assert torch.allclose(mu_q[p, b], one[0][0], rtol=1e-13, atol=1e-14)
        assert torch.allclose(var_q[p, b], one[1][0], rtol=1e-13, atol=0)


def test_landmark_posterior_with_an_empty_memory_is_the_prior():
    """No valid neighbour (t = 1): (mu_p, sigma_p^2) exactly, whatever the networks, no NaN in
    values or gradients (also with zero placeholders where no entry was stored)."""
    m = landmark()
    randomise_landmark_nets(m)
    mu_p = torch.randn(3, 2, 2, dtype=torch.float64, requires_grad=True)
    var_p = (torch.rand(2, 2, dtype=torch.float64) + 0.1).requires_grad_(True)
    mu_k, var_k = torch.zeros(2, 2, 2, dtype=torch.float64), torch.ones(2, 2, 2).double()
    none = torch.zeros(2, 2, dtype=torch.bool)
    mu_q, var_q = m.landmark_merge(mu_p, var_p, torch.zeros(2, 2).double(), mu_k, var_k, none)
    assert torch.equal(mu_q, mu_p) and torch.equal(var_q, var_p.expand(3, 2, 2))
    (mu_q.sum() + var_q.sum()).backward()
    assert torch.equal(mu_p.grad, torch.ones_like(mu_p))
    assert torch.equal(var_p.grad, torch.full_like(var_p, 3.0))
    # the first memorisation step reads an empty reversed DND: the prior-only statistics
    a = nn.functional.one_hot(torch.randint(0, 5, (2, 4)), 5).double()
    codes = torch.randn(2, 4, 2, dtype=torch.float64)
    means, variances = m.landmark_path(a, codes)
    assert torch.equal(means[:, 0], m.transition_mean(m.s0.expand(2, 2), a[:, 0]))
    assert torch.equal(variances[:, 0], torch.full((2, 2), m.r**2, dtype=torch.float64))
    assert torch.isfinite(means).all() and torch.isfinite(variances).all()


def test_landmark_memorisation_is_a_reversed_dnd_written_and_read_step_by_step():
    """landmark_path against the appendix read literally: at each step query the reversed DND
    (keys mu_phi(x_i), values (E[s_i], Var[s_i]), i < t) with mu_phi(x_t), merge with the prior
    statistics (f(E[s_{t-1}], a_t), Var[s_{t-1}] + r^2), write the step's entry."""
    K = 3
    m = landmark(landmark_neighbours=K, walls=True)
    randomise_landmark_nets(m)
    torch.manual_seed(9)
    B, n = 2, 7
    a = nn.functional.one_hot(torch.randint(0, 5, (B, n)), 5).double()
    codes = torch.randint(0, 2, (B, n, 2)).double()  # repeated codes: exact matches and ties
    means, variances = m.landmark_path(a, codes)
    rev = DND(2)
    mean, var = m.s0.expand(B, 2), torch.zeros(B, 2, dtype=torch.float64)
    for t in range(n):
        mu_p, var_p = m.transition_mean(mean, a[:, t]), var + m.r**2
        if t == 0:
            mean, var = mu_p, var_p
        else:
            d, mu_k, var_k, valid = m.read_landmarks(rev, codes[:, t])
            assert int(valid.sum(-1)[0]) == min(K, t)
            mean, var = m.landmark_merge(mu_p, var_p, d, mu_k, var_k, valid)
        rev.write(codes[:, t], torch.stack([mean, var], -2))
        assert torch.allclose(means[:, t], mean, rtol=1e-12, atol=1e-14)
        assert torch.allclose(variances[:, t], var, rtol=1e-12, atol=0)
    memory = m.memorise(torch.rand(B, n, 4, dtype=torch.float64), a)
    assert memory.reversed.values.shape == (B, n, 2, 2)
    assert torch.equal(memory.memory.keys, memory.means)


def test_landmark_without_landmark_weight_is_the_prior_only_gtmsm():
    """beta = 0 (output bias -1e4: sigmoid underflows to 0) and NN = 0 (its initial output
    layer): the landmark GTM-SM's bound is the prior-only one, sample for sample."""
    prior = small(walls=True)
    lm = small(walls=True, inference="landmark", landmark_neighbours=2)
    lm.load_state_dict(prior.state_dict(), strict=False)
    with torch.no_grad():
        lm.landmark_beta[-1].bias.fill_(-1e4)
    x = torch.rand(2, 7, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (2, 7))
    for make in (Trace_ELBO, lambda: IWAE(num_particles=3), lambda: FIVO(num_particles=3)):
        pyro.set_rng_seed(3)  # a new objective per run: the first run guesses plate nesting
        l1 = make().loss(prior.model, prior.guide, x, None, inputs=a)
        pyro.set_rng_seed(3)
        l2 = make().loss(lm.model, lm.guide, x, None, inputs=a)
        assert math.isclose(l1, l2, rel_tol=1e-9)


def obstacle_sequence(num_steps, seed):
    """One image-navigation sequence with an obstacle (thesis sec. 7.10.1) on a random 32x32
    image (no photographs needed): frames (T, 64), actions (T,), positions (T, 2)."""
    import numpy as np

    from pyro_seq.data.simulators.navigation import NavigationParams, navigation_sequence

    image = np.random.default_rng(seed).random((32, 32)).astype(np.float32)
    params = NavigationParams(obstacles=True, repeat_rate=2.0)
    seq = navigation_sequence(params, (image,), num_steps, seed, "train", 0)
    return (
        torch.from_numpy(seq["frames"]).double().reshape(num_steps, 64),
        torch.from_numpy(seq["actions"]),
        torch.from_numpy(seq["positions"]).double(),
    )


def exact_match_landmark_model(tau):
    """Frames are their own codes, M the true displacement, beta(delta) = sigmoid(60 relu(1 -
    1000 delta) - 30): ~1 - 1e-13 for a frame seen before (delta = 0), ~1e-13 for any other
    (crops of a random image are far apart); K' = 1 (two exact matches would both get beta ~ 1)."""
    m = GTMSM(
        frame_shape=(8, 8),
        z_dim=64,
        tau=tau,
        walls=False,
        hidden_dims=(4,),
        inference="landmark",
        landmark_neighbours=1,
        landmark_hidden=1,
    ).double()
    m.encoder_body, m.encoder_head, m.decoder = nn.Identity(), IdentityEncoder(0.05), nn.Identity()
    with torch.no_grad():
        m.set_displacement_matrix(TRUE_M)
    set_linear(m.landmark_beta[0], [[-1000.0]], [1.0])
    set_linear(m.landmark_beta[2], [[60.0]], [-30.0])
    return m


def test_obstacles_landmarks_recover_the_positions_the_transition_cannot_sec_7_10_1():
    """Thesis sec. 7.10.1 and Fig. 7.6: a move into the obstacle (or a wall) does nothing, so
    x_t = x_{t-1}; the prior transition moves the state anyway, the landmark network finds
    x_{t-1} in the reversed DND and keeps the stored position. With the true M the landmark
    memorisation tracks the true positions relative to the first step at every step, in the
    memorisation phase and in the guide's prediction-phase posterior means."""
    T, tau = 60, 40
    for seed in range(20):  # a sequence whose memorisation phase has blocked moves
        frames, actions, positions = obstacle_sequence(T, seed)
        moved = (positions[1:tau] != positions[: tau - 1]).any(-1)
        blocked = (~moved & (actions[1:tau] != 4)).sum()
        if blocked >= 3:
            break
    assert blocked >= 3
    m = exact_match_landmark_model(tau)
    a = nn.functional.one_hot(actions, 5).double()
    memory = m.memorise(frames[None, :tau], a[None, :tau])
    truth = positions[:tau] - positions[0]
    assert torch.allclose(memory.means[0] - memory.means[0, :1], truth, rtol=0, atol=1e-9)
    prior_means = m.mean_path(a[None, :tau])[0]
    assert (prior_means - prior_means[:1] - truth).abs().max() >= 1.0  # the prior gets lost
    # prediction phase: where x_t was seen during memorisation, q(s_t | ...) is centred on the
    # stored state whatever s_{t-1}; elsewhere on f(s_{t-1}, a_t)
    pyro.set_rng_seed(0)
    trace = poutine.trace(m.guide).get_trace(frames[None], None, inputs=actions[None])
    seen = {tuple(f.tolist()): i for i, f in reversed(list(enumerate(frames[:tau])))}
    prev, hits = memory.means[0, -1], 0
    for t in range(tau, T):
        node = trace.nodes[f"s_{t + 1}"]
        loc = node["fn"].base_dist.base_dist.loc[0]
        i = seen.get(tuple(frames[t].tolist()))
        expected = memory.means[0, i] if i is not None else prev + TRUE_M @ a[t]
        assert torch.allclose(loc, expected, rtol=0, atol=1e-9)
        hits += i is not None
        prev = node["value"][0]
    assert hits >= 5
    out = m.predict(frames[None], actions[None])
    assert torch.equal(out["memory_states"], memory.means)


@pytest.mark.parametrize(
    "loss",
    [Trace_ELBO(), TraceMeanField_ELBO(), IWAE(num_particles=3), FIVO(num_particles=3)],
    ids=["trace", "meanfield", "iwae", "fivo"],
)
def test_landmark_svi_step_is_finite_and_every_parameter_has_a_gradient(loss):
    m = landmark(walls=True)
    randomise_landmark_nets(m)  # NN's zero output layer would leave its hidden layer at 0
    _svi_step_with_gradients(m, loss, T=7, silent_prefix="landmark")


def test_landmark_options_are_validated():
    with pytest.raises(
        ValueError,
        match=r"inference must be one of \('prior', 'landmark'\), "
        r"got 'smoothing'",
    ):
        GTMSM(inference="smoothing")
    with pytest.raises(ValueError, match="inference must be one of"):
        GTMSM(inference=None)
    with pytest.raises(ValueError, match="landmark_neighbours"):
        GTMSM(inference="landmark", landmark_neighbours=0)
    m = small()
    assert m.inference == "prior" and m.landmark_beta is None and m.landmark_var is None
    with pytest.raises(RuntimeError, match="inference='landmark'"):
        m.landmark_merge(
            *(torch.zeros(1, 2),) * 2,
            torch.zeros(1, 1),
            *(torch.zeros(1, 1, 2),) * 2,
            torch.ones(1, 1, dtype=torch.bool),
        )


# ---------------------------------------------------------------------------------------------
# Conformal displacement matrix (ours): M = alpha Q^T, Q^T Q = I
# ---------------------------------------------------------------------------------------------


def test_conformal_matrix_is_gram_schmidt_of_the_rows_times_the_scale():
    g = torch.Generator().manual_seed(0)
    direction = torch.randn(2, 5, generator=g, dtype=torch.float64)
    log_scale = torch.tensor(0.3, dtype=torch.float64)
    r1, r2 = direction
    q1 = r1 / r1.norm()
    q2 = r2 - (r2 @ q1) * q1
    q2 = q2 / q2.norm()
    hand = math.exp(0.3) * torch.stack([q1, q2])
    from pyro_seq.models.gtmsm import conformal_matrix

    M = conformal_matrix(direction, log_scale)
    assert torch.allclose(M, hand, rtol=0, atol=1e-12)
    assert torch.allclose(M @ M.T, math.exp(0.6) * torch.eye(2, dtype=torch.float64), atol=1e-12)


def test_conformal_model_starts_conformal_and_sets_the_true_displacements_exactly():
    m = small(displacements="conformal", init_displacement_std=0.5)
    M = m.displacement_matrix()
    alpha2 = 0.25 * 5  # (init_displacement_std sqrt(num_actions))^2
    assert torch.allclose(M @ M.T, alpha2 * torch.eye(2, dtype=torch.float64), atol=1e-12)
    m.set_displacement_matrix(TRUE_M)
    assert torch.allclose(m.displacement_matrix(), TRUE_M, rtol=0, atol=1e-12)
    assert m.displacement_matrix().requires_grad  # still a function of the parameters
    with pytest.raises(ValueError, match="orthogonal rows of equal norm"):
        m.set_displacement_matrix(torch.tensor([[1.0, 1, 0, 0, 0], [0, 0, 1, 1, 0.5]]))
    with pytest.raises(ValueError, match="orthogonal rows of equal norm"):
        m.set_displacement_matrix(torch.tensor([[1.0, 1, 0, 0, 0], [1.0, 0, 0, 0, 0]]))
    with pytest.raises(ValueError, match=r"M must be \(2, 5\)"):
        m.set_displacement_matrix(torch.zeros(5, 2))
    free = small()
    free.set_displacement_matrix(TRUE_M + 0.5)  # a free M takes anything of its shape
    assert torch.equal(free.M.detach(), TRUE_M + 0.5)


def test_conformal_and_free_models_with_the_same_M_have_the_same_elbo_and_predictions():
    free, conf = small(walls=True), small(walls=True, displacements="conformal")
    M = 0.7 * torch.tensor(
        [[0.6, -0.6, 0.8, -0.8, 0.0], [0.8, -0.8, -0.6, 0.6, 0.0]], dtype=torch.float64
    )  # rotated true displacements
    free.load_state_dict(
        {k: v for k, v in conf.state_dict().items() if not k.startswith("M_")} | {"M": M}
    )
    conf.set_displacement_matrix(M)
    x = torch.rand(2, 7, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (2, 7))
    losses = []
    for m in (free, conf):
        pyro.set_rng_seed(3)
        losses.append(Trace_ELBO().loss(m.model, m.guide, x, None, inputs=a))
    assert math.isclose(losses[0], losses[1], rel_tol=1e-12)
    p_free, p_conf = free.predict(x, a), conf.predict(x, a)
    assert torch.allclose(p_free["states"], p_conf["states"], rtol=0, atol=1e-12)
    assert torch.allclose(p_free["frames"], p_conf["frames"], rtol=0, atol=1e-12)


def test_conformal_svi_step_keeps_M_conformal_and_moves_both_its_parameters():
    m = small(walls=True, displacements="conformal")
    _svi_step_with_gradients(m, Trace_ELBO(), T=6, silent_prefix="M_")
    M = m.displacement_matrix().detach()
    assert torch.allclose(
        M @ M.T, M.pow(2).sum(1).mean() * torch.eye(2, dtype=torch.float64), atol=1e-12
    )


def test_free_M_gradient_of_a_distance_loss_is_M_times_a_symmetric_matrix():
    """The claim of :meth:`GTMSM.displacement_matrix`: with ``s = M c`` (linear, no noise) any
    loss of the pairwise squared distances has ``dL/dM = M G``, ``G = sum_ij 2 (dL/dd_ij^2)
    (c_i - c_j)(c_i - c_j)^T``, so every row of ``M`` is driven by the same ``G``."""
    g = torch.Generator().manual_seed(1)
    M = torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    c = torch.randint(0, 4, (12, 5), generator=g).to(torch.float64)  # action counts
    s = c @ M.T
    d2 = (s[:, None] - s[None]).pow(2).sum(-1)
    loss = torch.log(1.0 / (d2 + 1e-2)).sum() + torch.sin(d2).sum()  # any function of the d^2
    loss.backward()
    dd2 = (-1.0 / (d2 + 1e-2) + torch.cos(d2)).detach()  # dL / d d2_ij
    diff = c[:, None] - c[None]
    G = 2 * torch.einsum("ij,ija,ijb->ab", dd2, diff, diff)
    assert torch.allclose(M.grad, M.detach() @ G, rtol=1e-10, atol=1e-10)
    assert torch.allclose(G, G.T)


def test_conformal_options_are_validated():
    with pytest.raises(ValueError, match="displacements must be one of"):
        GTMSM(displacements="orthogonal")
    with pytest.raises(ValueError, match="needs rotation=False"):
        GTMSM(state_dim=3, rotation=True, displacements="conformal")
    with pytest.raises(ValueError, match="state_dim <= num_actions"):
        GTMSM(state_dim=6, displacements="conformal")
    with pytest.raises(ValueError, match="init_displacement_std"):
        GTMSM(init_displacement_std=0.0)


def test_inverse_pairs_M_undoes_each_pair_exactly_and_sets_only_such_matrices():
    m = small(displacements="inverse_pairs")
    M = m.displacement_matrix()
    assert torch.equal(M[:, 1], -M[:, 0]) and torch.equal(M[:, 3], -M[:, 2])
    assert [n for n, _ in m.named_parameters() if n.startswith("M")] == ["M_pairs", "M_other"]
    g = torch.Generator().manual_seed(2)
    s = torch.randn(7, 2, generator=g, dtype=torch.float64)
    for i, j in ((0, 1), (2, 3)):  # a round trip returns exactly (no walls)
        a_i = nn.functional.one_hot(torch.full((7,), i), 5).to(torch.float64)
        a_j = nn.functional.one_hot(torch.full((7,), j), 5).to(torch.float64)
        assert torch.allclose(
            m.transition_mean(m.transition_mean(s, a_i), a_j), s, rtol=0, atol=1e-14
        )
    m.set_displacement_matrix(2 * TRUE_M)
    assert torch.equal(m.displacement_matrix().detach(), 2 * TRUE_M)
    with pytest.raises(ValueError, match="column 1 of M must be minus column 0"):
        m.set_displacement_matrix(torch.tensor([[1.0, 1, 0, 0, 0], [0, 0, 1, -1, 0]]))
    other = small(displacements="inverse_pairs", inverse_actions=((0, 2),))
    M = other.displacement_matrix()
    assert torch.equal(M[:, 2], -M[:, 0]) and torch.equal(
        M[:, [1, 3, 4]], torch.zeros(2, 3, dtype=M.dtype)
    )
    free_rest = torch.tensor([[1.0, 2, -1, 3, 4], [0, 5, 0, 6, 7]])  # only 2 = -0 is required
    other.set_displacement_matrix(free_rest)
    assert torch.equal(other.displacement_matrix().detach(), free_rest.double())
    _svi_step_with_gradients(
        small(displacements="inverse_pairs"), Trace_ELBO(), T=6, silent_prefix="M_"
    )
    for bad in (((0, 1), (1, 2)), ((0, 5),), ((0,),), ()):
        with pytest.raises(ValueError, match="inverse_actions must be disjoint pairs"):
            GTMSM(displacements="inverse_pairs", inverse_actions=bad)


def test_neighbour_warmup_reads_K0_entries_in_training_then_num_neighbours():
    m = small(tau=6, num_neighbours=2, neighbour_warmup=(6, 4))
    dnd = DND(2)
    g = torch.Generator().manual_seed(0)
    dnd.write(
        torch.randn(1, 6, 2, generator=g, dtype=torch.float64),
        torch.rand(1, 6, 2, 2, generator=g, dtype=torch.float64) + 0.1,
    )
    s = torch.zeros(1, 2, dtype=torch.float64)
    m.train()
    ks = []
    for epoch in range(6):
        m.training_epoch(epoch)
        ks.append(m.memory_prior(s, dnd).mixture_distribution.logits.shape[-1])
    assert ks == [6, 5, 3, 3, 2, 2]  # round(6 (2/6)^(e/4)), then num_neighbours
    m.training_epoch(0)
    m.eval()
    assert m.memory_prior(s, dnd).mixture_distribution.logits.shape[-1] == 2
    m.train()
    assert m.memory_prior(s, dnd, 1).mixture_distribution.logits.shape[-1] == 1
    plain = small(tau=6, num_neighbours=2)
    plain.training_epoch(0)
    plain.num_neighbours = 3  # without a warm-up, training reads the attribute
    assert plain.memory_prior(s, dnd).mixture_distribution.logits.shape[-1] == 3
    for bad in ((0, 3), (5,), 5, (5, 0), "some"):
        with pytest.raises(ValueError, match="neighbour_warmup"):
            small(neighbour_warmup=bad)


@pytest.mark.parametrize(
    "displacements,names",
    [
        ("free", ["M"]),
        ("conformal", ["M_direction", "M_log_scale"]),
        ("inverse_pairs", ["M_pairs", "M_other"]),
    ],
)
def test_lr_multipliers_of_M_and_of_the_wall_network(displacements, names):
    from pyro_seq.train.trainer import lr_multiplier

    m = small(
        walls=True,
        displacements=displacements,
        displacement_lr_multiplier=0.5,
        wall_lr_multiplier=10,
    )
    factors = {n: lr_multiplier(m, f"gtmsm$$${n}") for n, _ in m.named_parameters()}
    assert sorted(n for n, f in factors.items() if f == 0.5) == sorted(names)
    assert sorted(n for n, f in factors.items() if f == 10.0) == sorted(
        n for n in factors if n.startswith("wall_net.")
    )
    assert all(f == 1.0 for n, f in factors.items() if not n.startswith(("M", "wall_net.")))
    assert small(walls=True).lr_multipliers == {}
    assert small(wall_lr_multiplier=10).lr_multipliers == {"wall_net": 10.0}
    for option in ("displacement_lr_multiplier", "wall_lr_multiplier"):
        with pytest.raises(ValueError, match=option):
            small(**{option: -1.0})


def test_defaults_are_the_learning_aids_and_the_thesis_settings_stay_reachable():
    """GTMSM()'s defaults: inverse pairs of displacements, every memory entry at first (tau,
    then down to num_neighbours over 20 epochs) and the wall network at 10x the rate; the
    thesis's free M, fixed K and single rate by options."""
    torch.manual_seed(0)
    m = GTMSM(frame_shape=(2, 2), tau=8, num_neighbours=2, z_dim=2, hidden_dims=(5,))
    assert m.displacements == "inverse_pairs" and m.neighbour_warmup == "all"
    assert m.lr_multipliers == {"wall_net": 10.0}
    assert torch.equal(m.displacement_matrix()[:, 1], -m.displacement_matrix()[:, 0])
    dnd = DND(2)
    g = torch.Generator().manual_seed(0)
    dnd.write(torch.randn(1, 8, 2, generator=g), torch.rand(1, 8, 2, 2, generator=g) + 0.1)
    s = torch.zeros(1, 2)
    m.train()
    ks = []
    for epoch in range(22):
        m.training_epoch(epoch)
        ks.append(m.memory_prior(s, dnd).mixture_distribution.logits.shape[-1])
    assert ks == [round(8 * (2 / 8) ** (e / 20)) for e in range(20)] + [2, 2]
    assert ks[0] == 8 and ks[10] == 4  # all tau entries, then geometrically down to K
    m.tau = 6  # "all" follows tau: a smaller memory is read whole at epoch 0
    m.training_epoch(0)
    assert m.neighbour_schedule() == (6, 20) and m.neighbours_now() == 6
    m.eval()
    assert m.neighbours_now() == 2
    thesis = GTMSM(frame_shape=(2, 2), tau=8, num_neighbours=2, z_dim=2, **THESIS)
    assert isinstance(thesis.M, nn.Parameter) and thesis.neighbour_schedule() is None
    assert thesis.lr_multipliers == {}
    thesis.training_epoch(0)
    assert thesis.neighbours_now() == 2


def test_default_inverse_pairs_need_four_actions_or_the_free_M():
    with pytest.raises(ValueError, match="inverse_actions .* displacements='free'"):
        GTMSM(num_actions=3)
    assert GTMSM(num_actions=3, displacements="free").M.shape == (2, 3)
