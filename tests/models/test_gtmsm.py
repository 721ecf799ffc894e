"""GTM-SM (thesis Ch. 7): the mixture prior and transitions against hand computations, perfect
memory recall, a hand-computed reference ELBO, masks, validation and every objective."""

import itertools
import math

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


def small(**kw):
    opts = dict(frame_shape=(2, 2), tau=3, z_dim=2, hidden_dims=(5,), walls=False, wall_hidden=4)
    opts.update(kw)
    torch.manual_seed(0)
    return GTMSM(**opts).double()


def log_normal(x, loc, scale):
    return -0.5 * ((x - loc) / scale) ** 2 - math.log(scale) - 0.5 * math.log(2 * math.pi)


def hand_mixture_log_prob(z, s, keys, locs, scales, K, delta):
    """log sum_k w_k prod_j N(z_j; mu_kj, sigma_kj), w_k = (1/(d_k^2+delta)) / sum, over the K
    entries nearest to s (ties by write order), in Python floats."""
    rows = sorted((sum((float(a) - float(b)) ** 2 for a, b in zip(s, key)), i)
                  for i, key in enumerate(keys))[:K]
    inv = [1.0 / (d2 + delta) for d2, _ in rows]
    total = sum(inv)
    dens = 0.0
    for (d2, i), v in zip(rows, inv):
        comp = sum(log_normal(float(z[j]), float(locs[i][j]), float(scales[i][j]))
                   for j in range(len(z)))
        dens += v / total * math.exp(comp)
    return math.log(dens)


def test_mixture_prior_log_density_equals_hand_computation():
    m = small(num_neighbours=5, delta=1e-4)
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
        m.M.copy_(TRUE_M)
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
    frames = torch.stack([torch.stack([image[b, 3 * r:3 * r + 8, 3 * c:3 * c + 8].flatten()
                                       for r, c in positions]) for b in range(2)])
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
            rows = sorted((float(((true_s[tau + i] - true_s[j]) ** 2).sum()), j)
                          for j in range(tau))[:5]
            w = torch.tensor([1.0 / (d2 + 1e-4) for d2, _ in rows], dtype=torch.float64)
            mean = (w[:, None] * frames[b, [j for _, j in rows]]).sum(0) / w.sum()
            assert torch.allclose(out["frames"][b, i], mean, atol=1e-12)
            # the exact match holds weight >= 1e4 against <= 4 for the other four entries
            # (distances >= 1): the prediction is the stored frame to within 4e-4 of the range
            assert (out["frames"][b, i] - stored[p][b]).abs().max() <= 4e-4 * 1.0 + 1e-12
    # the model's own sites agree: at the true states the mixture prior is centred there
    s = true_s[tau:tau + 1].expand(2, 2).contiguous()
    dnd, _ = m.write_memory(frames[:, :tau], nn.functional.one_hot(actions[:, :tau], 5).double())
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
        f"{v}_{t}" for v in "sz" for t in (4, 5, 6)}  # prediction steps only
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
            log_pz = hand_mixture_log_prob(z, s, keys, q_loc[:3], q_scale[:3], 5, 1e-4)
            log_qz = sum(log_normal(float(z[j]), float(q_loc[t, j]), float(q_scale[t, j]))
                         for j in range(2))
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


def _check_grads(m):
    bad = [n for n, p in m.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not bad, f"parameters without a finite gradient: {bad}"


@pytest.mark.parametrize("loss", [Trace_ELBO(), TraceMeanField_ELBO(), IWAE(num_particles=3),
                                  FIVO(num_particles=3)],
                         ids=["trace", "meanfield", "iwae", "fivo"])
def test_one_svi_step_every_parameter_has_a_finite_gradient(loss):
    m = small(walls=True)
    x = torch.rand(3, 6, 4, dtype=torch.float64)
    a = torch.randint(0, 5, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[2, 5:] = False
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-3}), loss=loss)
    value = svi.step(x, mask, inputs=a)
    assert math.isfinite(value)
    _check_grads(m)


def test_packed_actions_conv_colour_and_rotation_variants_train():
    torch.manual_seed(6)
    m = GTMSM(frame_shape=(3, 8, 8), tau=2, z_dim=3, encoder="conv", channels=4, conv_layers=2,
              pack_actions=True, state_dim=3, rotation=True).double()
    assert m.obs_dim == 192 + 5 and m.input_dim == 0
    frames = torch.rand(2, 4, 192, dtype=torch.float64)
    acts = nn.functional.one_hot(torch.randint(0, 5, (2, 4)), 5).double()
    x = torch.cat([frames, acts], -1)
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-3}), loss=IWAE(num_particles=2))
    assert math.isfinite(svi.step(x, None))
    _check_grads(m)
    # packed and separate actions give the same bound
    u = GTMSM(frame_shape=(3, 8, 8), tau=2, z_dim=3, encoder="conv", channels=4, conv_layers=2,
              state_dim=3, rotation=True).double()
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
    l2 = Trace_ELBO().loss(m.model, m.guide, x, None,
                           inputs=nn.functional.one_hot(a, 5).double())
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
    with pytest.raises(ValueError, match="no prediction step"):
        m.model(x[:, :3], None, inputs=a[:, :3])
    with pytest.raises(ValueError, match="observed"):
        m.model(x, None, observed=torch.ones(2, 5, dtype=torch.bool), inputs=a)
    with pytest.raises(ValueError, match="state_dim=3"):
        GTMSM(rotation=True)
    with pytest.raises(ValueError, match="delta"):
        GTMSM(delta=0.0)
    with pytest.raises(ValueError, match="encoder"):
        GTMSM(encoder="rnn")
    m.tau = 0
    with pytest.raises(ValueError, match="tau must be"):
        m.model(x, None, inputs=a)
