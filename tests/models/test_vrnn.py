"""VRNN (thesis 4.4.2, Chung et al. 2015) against a hand-written reference and under every objective.

The reference re-implements the equations of the module docstring with raw weight matrices
(GRU and LSTM cells, MLPs, Gaussian and Bernoulli log densities written out), independently of
the model code: ``d_1 = f(0, [phi_x(0), phi_z(0)])``, ``z_t ~ N(NN^(p)(d_t))``, ``x_t ~
p(x | NN^(x)([phi_z(z_t), d_t]))``, ``d_{t+1} = f(d_t, [phi_x(x_t), phi_z(z_t)])``; guide
``q(z_t | NN^(q)([d_t, c_t]))`` with ``c_t = phi_x(x_t)`` (filtering) or ``c_t = a_t``, ``a_t =
g(a_{t+1}, x_t)``, ``a_{T+1} = 0`` (smoothing).
"""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam
from pyro.poutine.messenger import Messenger

from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models.vrnn import VRNN
from pyro_seq.ops import SequenceState
from tests.models.reference import bernoulli_logpmf, lin, normal_logpdf, softplus


# ----------------------------------------------------------------------------- the reference
def relu(x):
    return torch.clamp(x, min=0)


def gru_cell(wi, wh, bi, bh, x, h):
    """Cho et al. (2014) as torch orders the gates: reset r, update u, candidate n."""
    gi, gh = x @ wi.T + bi, h @ wh.T + bh
    H = h.shape[-1]
    r = torch.sigmoid(gi[..., :H] + gh[..., :H])
    u = torch.sigmoid(gi[..., H : 2 * H] + gh[..., H : 2 * H])
    n = torch.tanh(gi[..., 2 * H :] + r * gh[..., 2 * H :])
    return ((1 - u) * n + u * h,)


def lstm_cell(wi, wh, bi, bh, x, h, c):
    """Hochreiter & Schmidhuber (1997) with forget gate; torch's gate order i, f, g, o."""
    g = x @ wi.T + bi + h @ wh.T + bh
    H = h.shape[-1]
    i, f = torch.sigmoid(g[..., :H]), torch.sigmoid(g[..., H : 2 * H])
    cand, o = torch.tanh(g[..., 2 * H : 3 * H]), torch.sigmoid(g[..., 3 * H :])
    c = f * c + i * cand
    return o * torch.tanh(c), c


def cell(kind, weights, x, hidden):
    return (gru_cell if kind == "gru" else lstm_cell)(*weights, x, *hidden)


def zero_hidden(kind, H, lead=()):
    z = torch.zeros(tuple(lead) + (H,))
    return (z,) if kind == "gru" else (z, z.clone())


def gaussian_head(head, h, variance):
    raw = lin(head.raw_scale, h)
    std = torch.exp(raw / 2) if variance == "log" else softplus(raw)  # log v = NN, or softplus
    return lin(head.loc, h), head.min_scale + std


class Reference:
    """The equations with the model's weights, one sequence (or a stack of particles) at a time."""

    def __init__(self, m, kind, variance="softplus", likelihood="bernoulli"):
        self.m, self.kind, self.variance, self.likelihood = m, kind, variance, likelihood
        rc = m.recurrence.cell
        self.f = (rc.weight_ih, rc.weight_hh, rc.bias_ih, rc.bias_hh)

    def phi_x(self, x):
        return relu(lin(self.m.phi_x[2], relu(lin(self.m.phi_x[0], x))))

    def phi_z(self, z):
        return relu(lin(self.m.phi_z[2], relu(lin(self.m.phi_z[0], z))))

    def first_hidden(self, lead=()):  # d_1 = f(d_0, [phi_x(x_0), phi_z(z_0)])
        m = self.m
        u = torch.cat([self.phi_x(torch.zeros(m.obs_dim)), self.phi_z(torch.zeros(m.z_dim))])
        h = cell(self.kind, self.f, u, zero_hidden(self.kind, m.d_dim))
        return tuple(v.expand(tuple(lead) + v.shape) for v in h)

    def next_hidden(self, hidden, x_t, z_t):  # d_{t+1} = f(d_t, [phi_x(x_t), phi_z(z_t)])
        phi_x = self.phi_x(x_t).expand(z_t.shape[:-1] + (-1,))
        return cell(self.kind, self.f, torch.cat([phi_x, self.phi_z(z_t)], -1), hidden)

    def contexts(self, x):
        """``c_t`` of the guide for one sequence ``x (T, D)``."""
        m = self.m
        if m.inference == "filtering":
            return [self.phi_x(x[t]) for t in range(x.shape[0])]
        r = m.encoder.rnn
        w = (r.weight_ih_l0, r.weight_hh_l0, r.bias_ih_l0, r.bias_hh_l0)
        a, g = [None] * x.shape[0], zero_hidden(self.kind, r.hidden_size)
        for t in reversed(range(x.shape[0])):  # a_t = g(a_{t+1}, x_t), a_{T+1} = 0
            g = cell(self.kind, w, x[t], g)
            a[t] = g[0]
        return a

    def terms(self, d, x_t, z_t, c_t):
        """``(log p(x_t | z_t, d_t), log p(z_t | d_t), log q(z_t | c_t, d_t))``."""
        m = self.m
        p_loc, p_scale = gaussian_head(m.prior[1], relu(lin(m.prior[0][0], d)), self.variance)
        c_t = c_t.expand(d.shape[:-1] + c_t.shape[-1:])
        hq = relu(lin(m.posterior.first, torch.cat([d, c_t], -1)))
        q_loc, q_scale = gaussian_head(m.posterior.head, hq, self.variance)
        feats = torch.cat([self.phi_z(z_t), d], -1)
        if self.likelihood == "bernoulli":
            log_px = bernoulli_logpmf(x_t, lin(m.emitter[2], relu(lin(m.emitter[0], feats))))
        else:
            e_loc, e_scale = gaussian_head(
                m.emitter[1], relu(lin(m.emitter[0][0], feats)), "softplus"
            )
            log_px = normal_logpdf(x_t, e_loc, e_scale)
        return log_px, normal_logpdf(z_t, p_loc, p_scale), normal_logpdf(z_t, q_loc, q_scale)

    def sequence(self, x, zs):
        """Per-step terms along one latent path ``zs (T, z_dim)`` of one sequence ``x (T, D)``."""
        out, hidden, c = [], self.first_hidden(), self.contexts(x)
        for t in range(x.shape[0]):
            out.append(self.terms(hidden[0], x[t], zs[t], c[t]))
            hidden = self.next_hidden(hidden, x[t], zs[t])
        return out


def randomize(module, scale=0.5, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen))


def tiny(**kw):
    kw = dict(dict(d_dim=4, z_dim=3, hidden_dim=6, feature_dim=5), **kw)
    return VRNN(5, **kw)


def ragged(B=3, T=6, D=5, lengths=(6, 4, 2), seed=0, likelihood="bernoulli"):
    g = torch.Generator().manual_seed(seed)
    if likelihood == "bernoulli":
        x = (torch.rand(B, T, D, generator=g) < 0.4).to(torch.get_default_dtype())
    else:
        x = torch.randn(B, T, D, generator=g)
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


def traces(m, x, mask):
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    return guide_tr, model_tr


# ----------------------------------------------------------------------------- (a) reference
CASES = [
    ("filtering", "gru", "bernoulli", "softplus"),
    ("smoothing", "gru", "bernoulli", "softplus"),
    ("filtering", "lstm", "gaussian", "softplus"),
    ("smoothing", "lstm", "gaussian", "log"),
    ("smoothing", "lstm", "bernoulli", "softplus"),
    ("filtering", "gru", "gaussian", "log"),
]


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("inference,kind,likelihood,variance", CASES)
def test_site_log_densities_match_reference(inference, kind, likelihood, variance):
    torch.manual_seed(0)
    min_scale = 0.0 if variance == "log" else 1e-3  # "log": exactly log v = NN
    m = tiny(
        inference=inference,
        cell=kind,
        likelihood=likelihood,
        variance=variance,
        min_scale=min_scale,
    )
    randomize(m)
    x, mask = ragged(likelihood=likelihood)
    guide_tr, model_tr = traces(m, x, mask)
    ref = Reference(m, kind, variance, likelihood)
    T = x.shape[1]
    for b in range(x.shape[0]):
        L = int(mask[b].sum())
        zs = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][b] for t in range(L)])
        expected = ref.sequence(x[b, :L], zs)
        for t in range(T):
            z = guide_tr.nodes[f"z_{t + 1}"]["value"]
            got = (
                model_tr.nodes[f"x_{t + 1}"]["fn"].log_prob(x[:, t])[b],
                model_tr.nodes[f"z_{t + 1}"]["fn"].log_prob(z)[b],
                guide_tr.nodes[f"z_{t + 1}"]["fn"].log_prob(z)[b],
            )
            if t < L:
                for g, e in zip(got, expected[t]):
                    assert torch.allclose(g, e, atol=1e-10, rtol=1e-10), (b, t, g, e)
            else:  # padded steps contribute exactly zero
                assert all(g.item() == 0.0 for g in got), (b, t, got)


# ----------------------------------------------------------------------------- (b) objectives
OBJECTIVES = {
    "trace_elbo": lambda: Trace_ELBO(),
    "mean_field": lambda: TraceMeanField_ELBO(),
    "iwae": lambda: IWAE(num_particles=4, max_plate_nesting=1),
    "iwae_dreg": lambda: IWAE(num_particles=4, max_plate_nesting=1, gradient_estimator="dreg"),
    "fivo": lambda: FIVO(num_particles=4),
}


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize(
    "likelihood,inference,kind",
    [("bernoulli", "filtering", "lstm"), ("gaussian", "smoothing", "gru")],
)
def test_every_objective_gives_every_parameter_a_gradient(objective, likelihood, inference, kind):
    torch.manual_seed(0)
    m = tiny(likelihood=likelihood, inference=inference, cell=kind)
    x, mask = ragged(likelihood=likelihood)
    loss = OBJECTIVES[objective]().loss_and_grads(m.model, m.guide, x, mask)
    assert math.isfinite(loss)
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    # and one SVI step through the optimizer changes the parameters
    before = [p.detach().clone() for p in m.parameters()]
    svi = SVI(m.model, m.guide, Adam({"lr": 0.01}), loss=OBJECTIVES[objective]())
    assert math.isfinite(svi.step(x, mask))
    assert all(not torch.equal(b, p) for b, p in zip(before, m.parameters()))


# ----------------------------------------------------------------------------- (c) FIVO
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("inference", ["filtering", "smoothing"])
def test_fivo_k1_is_trace_elbo_and_never_is_iwae(inference):
    torch.manual_seed(0)
    m = tiny(inference=inference)
    randomize(m)
    x, mask = ragged()
    pairs = [
        (FIVO(num_particles=1), Trace_ELBO()),
        (FIVO(num_particles=4, resample="never"), IWAE(num_particles=4, max_plate_nesting=1)),
    ]
    for fivo, other in pairs:
        pyro.set_rng_seed(1)
        a = fivo.loss(m.model, m.guide, x, mask)
        pyro.set_rng_seed(1)
        b = other.loss(m.model, m.guide, x, mask)
        assert a == pytest.approx(b, rel=1e-9, abs=0), (type(other).__name__, a, b)


class _RecordLatents(Messenger):
    """Records the first value of every latent site ``z_t`` (the guide's; the model replays it)."""

    def __init__(self):
        super().__init__()
        self.values = {}

    def _pyro_post_sample(self, msg):
        if not msg["is_observed"] and msg["name"].startswith("z_"):
            self.values.setdefault(msg["name"], msg["value"])


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("inference,kind", [("filtering", "lstm"), ("smoothing", "gru")])
def test_fivo_resamples_d_with_the_particles(inference, kind, monkeypatch):
    """FIVO(K=4, resample="always") equals a particle filter written from the equations in which
    each particle's d_{t+1} is computed from its *ancestor's* (d_t, z_t): log Z = sum_t log
    (1/K) sum_k alpha_t^k (every step is its own epoch). A d shared across particles, or not
    gathered with z, gives another value. The ancestors and latent draws are recorded from the
    run; the state after each resampling must also be the gather of the state before it."""
    torch.manual_seed(0)
    m = tiny(inference=inference, cell=kind)
    randomize(m, scale=0.7)
    x, mask = ragged(B=2, T=5, lengths=(5, 5), seed=3)
    K, B, T = 4, 2, 5
    events = []
    original = SequenceState.resample

    def recording(state, ancestors):
        before = dict(state)
        original(state, ancestors)
        events.append((ancestors.clone(), before, dict(state)))
        return state

    monkeypatch.setattr(SequenceState, "resample", recording)
    record = _RecordLatents()
    fivo = FIVO(num_particles=K, resample="always")
    pyro.set_rng_seed(2)
    with record:
        log_z, _ = fivo.log_z(m.model, m.guide, x, mask)
    assert len(events) == T - 1
    # d_t (and the LSTM cell) of both programs, and the latest z_t of each (the latent history
    # that a time-parallel model run starts from)
    keys = ["d", "guide_d", "z", "guide_z"] + (["c", "guide_c"] if kind == "lstm" else [])
    identity = torch.arange(K).unsqueeze(-1).expand(K, B)
    assert any(not torch.equal(a, identity) for a, _, _ in events)  # resampling moved particles
    for ancestors, before, after in events:
        assert sorted(after) == sorted(keys)
        for key in keys:
            gathered = torch.stack(
                [before[key].expand(K, B, -1)[ancestors[:, b], b] for b in range(B)], dim=1
            )
            assert torch.equal(after[key], gathered), key
        assert torch.equal(after["d"], after["guide_d"])

    ref = Reference(m, kind)
    with torch.no_grad():
        for b in range(B):
            hidden = ref.first_hidden((K,))
            c = ref.contexts(x[b])
            expected = 0.0
            for t in range(T):
                z = record.values[f"z_{t + 1}"][:, b]  # (K, z_dim)
                log_px, log_pz, log_qz = ref.terms(hidden[0], x[b, t], z, c[t])
                alpha = log_px + log_pz - log_qz  # (K,)
                expected += torch.logsumexp(alpha, 0) - math.log(K)
                if t + 1 < T:
                    a = events[t][0][:, b]
                    hidden = ref.next_hidden(tuple(h[a] for h in hidden), x[b, t], z[a])
            assert log_z[b].item() == pytest.approx(expected.item(), rel=1e-10, abs=1e-10), b


@pytest.mark.usefixtures("float64")
def test_model_reuse_of_the_guide_recurrence_changes_nothing(monkeypatch):
    """Under FIVO the model step reuses the guide's phi_z(z_t) and d_{t+1} (same state); with the
    reuse disabled the bound and every gradient are the same, with twice the recurrence calls."""
    torch.manual_seed(0)
    m = tiny(cell="lstm")
    randomize(m)
    x, mask = ragged()

    def run(reuse):
        if not reuse:
            monkeypatch.setattr(VRNN, "_from_guide", staticmethod(lambda *a: None))
        calls = []
        forward = m.recurrence.forward
        monkeypatch.setattr(m.recurrence, "forward", lambda *a: calls.append(1) or forward(*a))
        pyro.set_rng_seed(3)
        m.zero_grad()
        loss = FIVO(num_particles=4, resample="always").loss_and_grads(m.model, m.guide, x, mask)
        monkeypatch.undo()
        return loss, [p.grad.clone() for p in m.parameters()], len(calls)

    loss_a, grads_a, calls_a = run(True)
    loss_b, grads_b, calls_b = run(False)
    T = x.shape[1]
    assert calls_a == 2 + (T - 1) and calls_b == 2 + 2 * (T - 1)  # d_1 in each init, d_{t+1}
    assert loss_a == pytest.approx(loss_b, rel=1e-12)
    for a, b in zip(grads_a, grads_b):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- (d) padding
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("inference", ["filtering", "smoothing"])
def test_batch_bound_is_sum_of_per_sequence_bounds(inference):
    """Same latent paths: every site of the ragged batch equals that sequence run alone, padded
    sites are exactly 0, so the batch's log weight is the sum of the per-sequence ones; the
    content of padded steps changes nothing."""
    torch.manual_seed(0)
    m = tiny(inference=inference)
    randomize(m)
    x, mask = ragged()
    g_tr, m_tr = traces(m, x, mask)
    g_tr.compute_log_prob()
    m_tr.compute_log_prob()
    total = 0.0
    for b, L in enumerate(mask.sum(-1).tolist()):
        zs = {f"z_{t + 1}": g_tr.nodes[f"z_{t + 1}"]["value"][b : b + 1] for t in range(L)}
        g1 = poutine.trace(poutine.condition(m.guide, data=zs)).get_trace(x[b : b + 1, :L])
        m1 = poutine.trace(poutine.condition(m.model, data=zs)).get_trace(x[b : b + 1, :L])
        g1.compute_log_prob()
        m1.compute_log_prob()
        total = total + m1.log_prob_sum() - g1.log_prob_sum()
        for t in range(x.shape[1]):
            for tr, one in ((m_tr, m1), (g_tr, g1)):
                for name in (f"z_{t + 1}", f"x_{t + 1}"):
                    if name not in tr.nodes:
                        continue
                    lp = tr.nodes[name]["log_prob"][b]
                    if t < L:
                        assert torch.allclose(
                            lp, one.nodes[name]["log_prob"][0], rtol=1e-10, atol=1e-10
                        ), (b, name)
                    else:
                        assert lp.item() == 0.0, (b, name)
    batch = m_tr.log_prob_sum() - g_tr.log_prob_sum()
    assert batch.item() == pytest.approx(total.item(), rel=1e-10)

    garbage = torch.where(mask.unsqueeze(-1), x, torch.ones_like(x))
    losses = []
    for data in (x, garbage):
        for objective in (Trace_ELBO(), FIVO(num_particles=3, resample="always")):
            pyro.set_rng_seed(4)
            losses.append(objective.loss(m.model, m.guide, data, mask))
    assert losses[0] == losses[2] and losses[1] == losses[3], losses


# ----------------------------------------------------------------------------- (e) generate
@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_generate_shapes_support_and_sampling(likelihood):
    torch.manual_seed(0)
    m = tiny(likelihood=likelihood)
    x, params = m.generate(4, 7)
    assert x.shape == (4, 7, 5)
    if likelihood == "bernoulli":
        assert params.shape == (4, 7, 5) and torch.isfinite(params).all()
        assert ((x == 0) | (x == 1)).all()
    else:
        loc, scale = params
        assert loc.shape == scale.shape == (4, 7, 5)
        assert (scale > 0).all() and torch.isfinite(x).all()
    # x_t is drawn from the returned emission: empirical mean of x within 5 standard errors
    x, params = m.generate(4000, 2)
    if likelihood == "bernoulli":
        p = torch.sigmoid(params)
        err = (x - p).sum() / (p * (1 - p)).sum().sqrt()
    else:
        err = ((x - params[0]) / params[1]).sum() / math.sqrt(x.numel())
    assert abs(err.item()) < 5, err


@pytest.mark.usefixtures("float64")
def test_generate_follows_the_model(monkeypatch):
    """The emission parameters of ``generate`` are those of the equations given the sampled path:
    record z_t from the prior draws and recompute the logits with the reference."""
    torch.manual_seed(0)
    m = tiny(cell="gru")
    randomize(m)
    zs = []
    original = torch.distributions.Normal.sample

    def sample(self, *a, **k):
        value = original(self, *a, **k)
        zs.append(value)
        return value

    monkeypatch.setattr(torch.distributions.Normal, "sample", sample)
    x, logits = m.generate(3, 4)
    monkeypatch.undo()
    ref = Reference(m, "gru")
    hidden = ref.first_hidden((3,))
    for t in range(4):
        feats = torch.cat([ref.phi_z(zs[t]), hidden[0]], -1)
        expected = lin(m.emitter[2], relu(lin(m.emitter[0], feats)))
        assert torch.allclose(logits[:, t], expected, rtol=1e-10, atol=1e-10), t
        hidden = ref.next_hidden(hidden, x[:, t], zs[t])


# ----------------------------------------------------------------------------- options, guides
@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"inference": "forward"}, "inference"),
        ({"cell": "rnn"}, "cell"),
        ({"likelihood": "poisson"}, "likelihood"),
        ({"d_dim": 0}, "d_dim"),
        ({"z_dim": 2.5}, "z_dim"),
        ({"min_scale": -1.0}, "min_scale"),
        ({"variance": "exp"}, "variance"),
        ({"activation": "swish"}, "activation"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny(**kwargs)


def test_unknown_options_are_named():
    with pytest.raises(TypeError, match="hiden_dim"):
        tiny(hiden_dim=3)


def test_emission_options_are_passed_to_make_emission(monkeypatch):
    # e.g. ``num_components=`` of a mixture likelihood, once make_emission accepts it
    import pyro_seq.models.vrnn as vrnn

    seen = []
    original = vrnn.make_emission

    def make_emission(likelihood, in_dim, hidden_dims, obs_dim, activation="relu", **kwargs):
        seen.append((likelihood, in_dim, hidden_dims, obs_dim, activation, kwargs))
        return original(likelihood, in_dim, hidden_dims, obs_dim, activation)

    monkeypatch.setattr(vrnn, "make_emission", make_emission)
    tiny(likelihood="gaussian", num_components=3)
    assert seen == [("gaussian", 5 + 4, [6], 5, "relu", {"num_components": 3})]


def test_bad_generate_arguments_are_named():
    with pytest.raises(ValueError, match="num_steps"):
        tiny().generate(2, 0)


@pytest.mark.parametrize("inference", ["smoothing", "filtering"])
def test_smoothing_guide_sees_the_future_filtering_does_not(inference):
    m = tiny(inference=inference)
    x, mask = ragged(lengths=(6, 6, 6))
    zs = {f"z_{t + 1}": torch.randn(3, 3) for t in range(6)}

    def locs(data):
        tr = poutine.trace(poutine.condition(m.guide, data=zs)).get_trace(data, mask)
        return [tr.nodes[k]["fn"].base_dist.base_dist.loc for k in zs]

    base = locs(x)
    x2 = x.clone()
    x2[:, 3] = 1 - x2[:, 3]  # perturb x_4
    new = locs(x2)
    for s in range(3):  # q(z_s), s < 4
        assert (not torch.allclose(base[s], new[s])) == (inference == "smoothing"), s
    assert not torch.allclose(base[3], new[3])  # both see the present
    assert not torch.allclose(base[4], new[4])  # d_5 depends on x_4
