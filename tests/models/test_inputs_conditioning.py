"""DMM, SRNN and VRNN conditioned on known inputs (controls, actions) ``inputs=`` ``(B, T, U)``.

The reference runs the networks by hand from their raw weights (ReLU RNN, GRU and LSTM cells,
MLPs, Gaussian and Bernoulli log densities written out, independently of the model code),
following the equations of the module docstrings:

* DMM (thesis eq. 4.2-4.3, 4.6-4.9): ``p(z_t | z_{t-1}, u_t)`` the gated transition of
  Krishnan et al. (2017) on ``[z_{t-1}, u_t]``; the inference network reads ``[x_t, u_t]``;
* SRNN (thesis eq. 5.1, 5.3, 5.7, 5.10, 5.12): ``d_t = GRU(d_{t-1}, [x_{t-1}, u_t])``;
* VRNN (thesis eq. 4.16-4.17): ``d_t = f(d_{t-1}, [phi_x(x_{t-1}), phi_z(z_{t-1}), u_t])``,
  the smoothing guide's backward RNN reads ``[x_t, u_t]``.
"""

import re

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.cli import build_model
from pyro_seq.infer import FIVO
from pyro_seq.models import DMM, SRNN, VRNN
from pyro_seq.ops import SequenceState
from tests.models.reference import (
    act,
    bernoulli_logpmf,
    gru_cell,
    lin,
    normal_logpdf,
    randomize,
    relu_rnn_cell,
    softplus,
)

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py

D, U = 4, 3  # observation and input features per step


# ----------------------------------------------------------------- models and data
def build(arch, **kw):
    """A tiny model of case ``arch``; ``kw`` adds ``input_dim`` (or nothing)."""
    if arch == "dmm":
        return DMM(D, z_dim=3, transition_dim=6, emission_dim=5, rnn_dim=4, **kw)
    if arch == "dmm_filtering_resq":
        return DMM(
            D,
            z_dim=3,
            transition_dim=6,
            emission_dim=5,
            rnn_dim=4,
            inference="filtering",
            residual=True,
            **kw,
        )
    if arch == "srnn":  # smoothing, Res_q (the defaults)
        return SRNN(D, d_dim=4, z_dim=3, hidden_dim=6, **kw)
    if arch == "srnn_filtering":
        return SRNN(D, d_dim=4, z_dim=3, hidden_dim=6, inference="filtering", residual=False, **kw)
    if arch == "vrnn_lstm":  # filtering guide
        return VRNN(D, d_dim=4, z_dim=3, hidden_dim=6, feature_dim=5, **kw)
    if arch == "vrnn_gru_smoothing":
        return VRNN(
            D,
            d_dim=4,
            z_dim=3,
            hidden_dim=6,
            feature_dim=5,
            cell="gru",
            inference="smoothing",
            **kw,
        )
    raise AssertionError(arch)


ARCHS = ["dmm", "dmm_filtering_resq", "srnn", "srnn_filtering", "vrnn_lstm", "vrnn_gru_smoothing"]
TIME_PARALLEL = ("dmm", "srnn")  # architectures whose replayed model scores all steps at once


def tiny(arch, input_dim=U):
    m = build(arch, input_dim=input_dim)
    randomize(m)
    return m


def batch(lengths=(5, 3, 2), T=5, seed=0):
    """Bernoulli ``x (3, T, D)``, prefix ``mask``, inputs ``u (3, T, U)`` (padded steps of ``u``
    hold noise: the programs zero them)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(len(lengths), T, D, generator=g) < 0.4).double()
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    u = torch.randn(len(lengths), T, U, generator=g)
    return x * mask.unsqueeze(-1), mask, u


# ----------------------------------------------------------------- reference, written out
def relu(v):
    return torch.clamp(v, min=0)


def cell_step(kind, w, v, hidden):
    """One GRU (gates r, u, n) or LSTM (gates i, f, g, o) step from raw weights
    ``w = (W_ih, W_hh, b_ih, b_hh)``; ``hidden`` is ``(h,)`` or ``(h, c)``."""
    wi, wh, bi, bh = w
    gi, gh = v @ wi.T + bi, hidden[0] @ wh.T + bh
    H = hidden[0].shape[-1]
    if kind == "gru":
        r = torch.sigmoid(gi[:H] + gh[:H])
        z = torch.sigmoid(gi[H : 2 * H] + gh[H : 2 * H])
        n = torch.tanh(gi[2 * H :] + r * gh[2 * H :])
        return ((1 - z) * n + z * hidden[0],)
    g = gi + gh
    i, f = torch.sigmoid(g[:H]), torch.sigmoid(g[H : 2 * H])
    c = f * hidden[1] + i * torch.tanh(g[2 * H : 3 * H])
    return torch.sigmoid(g[3 * H :]) * torch.tanh(c), c


def gaussian_mlp(net, *inputs):
    """SRNN's GaussianMLP: one hidden layer (clipped leaky ReLU), std = min + softplus."""
    h = act(lin(net.first, torch.cat(inputs, -1)))
    return lin(net.head.loc, h), net.head.min_scale + softplus(lin(net.head.raw_scale, h))


def dmm_terms(m, x, u, zs):
    """Per step ``(log p(x_t | z_t), log p(z_t | z_{t-1}, u_t), log q(z_t | z_{t-1}, a_t))`` of
    one sequence ``x (T, D)``, inputs ``u (T, U)`` (None: the model without inputs), ``zs``."""
    T = x.shape[0]
    seen = x if u is None else torch.cat([x, u], -1)  # the inference network's input
    a = [None] * T
    if m.inference == "smoothing":  # eq. 4.8, ReLU RNN from learned h0
        g = m.encoder.h0
        for t in reversed(range(T)):
            g = relu_rnn_cell(m.encoder.rnn, seen[t], g)
            a[t] = g
    else:
        e = m.encoder
        a = [torch.tanh(lin(e[2], torch.tanh(lin(e[0], seen[t])))) for t in range(T)]
    tr, cb = m.transition, m.combiner

    def transition(z_prev, t):  # Krishnan et al. (2017), eq. 8
        zu = z_prev if u is None else torch.cat([z_prev, u[t]])
        gate = torch.sigmoid(lin(tr.gate, relu(lin(tr.gate_hidden, zu))))
        prop = lin(tr.proposal, relu(lin(tr.proposal_hidden, zu)))
        loc = (1 - gate) * lin(tr.linear, zu) + gate * prop
        return loc, tr.min_scale + softplus(lin(tr.raw_scale, relu(prop)))

    terms, z_prev, zq_prev = [], m.z_0, m.z_q_0
    for t in range(T):
        p_loc, p_scale = transition(z_prev, t)
        hc = 0.5 * (torch.tanh(lin(cb.z_to_hidden, zq_prev)) + a[t])
        q_loc, q_scale = lin(cb.loc, hc), cb.min_scale + softplus(lin(cb.raw_scale, hc))
        if m.residual:  # Res_q at the same z_{t-1}
            q_loc = q_loc + p_loc
        e = m.emitter
        logits = lin(e[4], relu(lin(e[2], relu(lin(e[0], zs[t])))))
        terms.append(
            (
                bernoulli_logpmf(x[t], logits),
                normal_logpdf(zs[t], p_loc, p_scale),
                normal_logpdf(zs[t], q_loc, q_scale),
            )
        )
        z_prev = zq_prev = zs[t]
    return terms


def srnn_terms(m, x, u, zs):
    """As :func:`dmm_terms` for the SRNN: ``(log p(x_t | z_t, d_t), log p(z_t | z_{t-1}, d_t),
    log q(z_t | z_{t-1}, a_t))``."""
    T = x.shape[0]
    x_prev = torch.cat([torch.zeros(1, D), x[:-1]])  # x_{t-1}, x_0 = 0
    rnn_in = x_prev if u is None else torch.cat([x_prev, u], -1)
    d, h = [], torch.zeros(m.deterministic.rnn.hidden_size)
    for t in range(T):  # eq. 5.1
        h = gru_cell(m.deterministic.rnn, rnn_in[t], h)
        d.append(h)
    if m.inference == "smoothing":  # eq. 5.7, a_{T+1} = 0
        a, g = [None] * T, torch.zeros(m.encoder.rnn.hidden_size)
        for t in reversed(range(T)):
            g = gru_cell(m.encoder.rnn, torch.cat([d[t], x[t]]), g)
            a[t] = g
    else:
        e = m.encoder
        a = [act(lin(e[2], act(lin(e[0], torch.cat([d[t], x[t]]))))) for t in range(T)]
    terms, z_prev = [], torch.zeros(m.z_dim)
    for t in range(T):
        logits = lin(m.emitter[2], act(lin(m.emitter[0], torch.cat([zs[t], d[t]]))))
        p_loc, p_scale = gaussian_mlp(m.prior, z_prev, d[t])  # eq. 5.3
        q_loc, q_scale = gaussian_mlp(m.posterior, z_prev, a[t])  # eq. 5.10
        if m.residual:  # eq. 5.12
            q_loc = q_loc + p_loc
        terms.append(
            (
                bernoulli_logpmf(x[t], logits),
                normal_logpdf(zs[t], p_loc, p_scale),
                normal_logpdf(zs[t], q_loc, q_scale),
            )
        )
        z_prev = zs[t]
    return terms


def vrnn_terms(m, x, u, zs):
    """As :func:`dmm_terms` for the VRNN: ``(log p(x_t | z_t, d_t), log p(z_t | d_t),
    log q(z_t | c_t, d_t))``."""
    T = x.shape[0]
    rc = m.recurrence.cell
    f = (rc.weight_ih, rc.weight_hh, rc.bias_ih, rc.bias_hh)
    zeros = torch.zeros(m.d_dim)
    start = (zeros,) if m.cell == "gru" else (zeros, zeros)

    def phi_x(v):
        return relu(lin(m.phi_x[2], relu(lin(m.phi_x[0], v))))

    def phi_z(v):
        return relu(lin(m.phi_z[2], relu(lin(m.phi_z[0], v))))

    def rec_in(x_prev, z_prev, t):  # [phi_x(x_{t-1}), phi_z(z_{t-1}), u_t]
        parts = [phi_x(x_prev), phi_z(z_prev)] + ([] if u is None else [u[t]])
        return torch.cat(parts)

    if m.inference == "filtering":
        c = [phi_x(x[t]) for t in range(T)]
    else:  # a_t = g(a_{t+1}, [x_t, u_t])
        r = m.encoder.rnn
        w = (r.weight_ih_l0, r.weight_hh_l0, r.bias_ih_l0, r.bias_hh_l0)
        seen = x if u is None else torch.cat([x, u], -1)
        c, g = [None] * T, start
        for t in reversed(range(T)):
            g = cell_step(m.cell, w, seen[t], g)
            c[t] = g[0]
    hidden = cell_step(m.cell, f, rec_in(torch.zeros(D), torch.zeros(m.z_dim), 0), start)  # d_1
    terms = []
    for t in range(T):
        d = hidden[0]
        hp = relu(lin(m.prior[0][0], d))
        p_loc = lin(m.prior[1].loc, hp)
        p_scale = m.prior[1].min_scale + softplus(lin(m.prior[1].raw_scale, hp))
        hq = relu(lin(m.posterior.first, torch.cat([d, c[t]])))
        q_loc = lin(m.posterior.head.loc, hq)
        q_scale = m.posterior.head.min_scale + softplus(lin(m.posterior.head.raw_scale, hq))
        logits = lin(m.emitter[2], relu(lin(m.emitter[0], torch.cat([phi_z(zs[t]), d]))))
        terms.append(
            (
                bernoulli_logpmf(x[t], logits),
                normal_logpdf(zs[t], p_loc, p_scale),
                normal_logpdf(zs[t], q_loc, q_scale),
            )
        )
        if t + 1 < T:
            hidden = cell_step(m.cell, f, rec_in(x[t], zs[t], t + 1), hidden)
    return terms


def reference(arch, m, x, u, zs):
    fn = {"dmm": dmm_terms, "srnn": srnn_terms, "vrnn": vrnn_terms}[arch.split("_")[0]]
    return fn(m, x, u, zs)


# ----------------------------------------------------------------- traces
def replayed(m, x, mask, inputs=None, guide_inputs=None, guide_tr=None):
    """The guide's trace (on ``guide_inputs``, default ``inputs``) and the model's trace
    replayed against it (time-parallel for DMM and SRNN)."""
    kw = {} if inputs is None else {"inputs": inputs}
    if guide_tr is None:
        gkw = kw if guide_inputs is None else {"inputs": guide_inputs}
        guide_tr = poutine.trace(m.guide).get_trace(x, mask, **gkw)
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask, **kw)
    guide_tr.compute_log_prob()
    model_tr.compute_log_prob()
    return guide_tr, model_tr


def latents(trace, T):
    return {f"z_{t + 1}": trace.nodes[f"z_{t + 1}"]["value"] for t in range(T)}


def conditioned(m, x, mask, inputs, zs):
    """The full-sequence model conditioned on ``zs``: the step loop (emission deferred)."""
    tr = poutine.trace(poutine.condition(m.model, data=zs)).get_trace(x, mask, inputs=inputs)
    tr.compute_log_prob()
    return tr


def driven(m, x, mask, inputs, zs):
    """The model driven one step at a time through ``init``/``step`` (the path of FIVO), each
    step observing its ``x_t`` at once, conditioned on ``zs``."""

    def program():
        state = SequenceState()
        m.model.init(state, x, mask, inputs=inputs)
        for t in range(x.shape[1]):
            m.model.step(state, t, x, mask, inputs=inputs)

    tr = poutine.trace(poutine.condition(program, data=zs)).get_trace()
    tr.compute_log_prob()
    return tr


def site_log_probs(tr, T):
    return {
        name: tr.nodes[name]["log_prob"] for t in range(T) for name in (f"z_{t + 1}", f"x_{t + 1}")
    }


# ----------------------------------------------------------------- input_dim = 0
@pytest.mark.parametrize("arch", ARCHS)
def test_input_dim_zero_is_the_model_without_inputs(arch):
    """``input_dim=0`` builds the same parameters from the same seed as a model built without
    the option, and gives the same log joint and guide density bit for bit; that log joint is
    the hand-run model without inputs at 1e-10."""
    torch.manual_seed(5)
    old = build(arch)
    torch.manual_seed(5)
    new = build(arch, input_dim=0)
    assert new.input_dim == 0
    a, b = old.state_dict(), new.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    x, mask, _ = batch()
    traces = []
    for m in (old, new):
        pyro.set_rng_seed(3)
        traces.append(replayed(m, x, mask))
    (g_old, p_old), (g_new, p_new) = traces
    assert p_old.log_prob_sum().item() == p_new.log_prob_sum().item()
    assert g_old.log_prob_sum().item() == g_new.log_prob_sum().item()
    randomize(new)
    guide_tr, model_tr = replayed(new, x, mask)
    expected = 0.0
    for b in range(x.shape[0]):
        L = int(mask[b].sum())
        zs = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][b] for t in range(L)])
        expected = expected + sum(e[0] + e[1] for e in reference(arch, new, x[b, :L], None, zs))
    assert abs(model_tr.log_prob_sum() - expected) < 1e-10


# ----------------------------------------------------------------- the equations with inputs
@pytest.mark.parametrize("arch", ARCHS)
def test_log_joint_with_inputs_matches_the_equations(arch):
    """Every site's log-density of the replayed model trace and of the guide trace, with
    inputs, equals the hand-run networks at 1e-10 (ragged batch; padded steps exactly 0); the
    log joint equals their sum."""
    torch.manual_seed(0)
    m = tiny(arch)
    x, mask, u = batch()
    guide_tr, model_tr = replayed(m, x, mask, u)
    if arch.split("_")[0] in TIME_PARALLEL:
        assert model_tr.nodes["_RETURN"]["value"].replayed is not None
    joint, q = 0.0, 0.0
    for b in range(x.shape[0]):
        L = int(mask[b].sum())
        zs = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][b] for t in range(L)])
        ref = reference(arch, m, x[b, :L], u[b, :L], zs)
        for t in range(x.shape[1]):
            got = (
                model_tr.nodes[f"x_{t + 1}"]["log_prob"][b],
                model_tr.nodes[f"z_{t + 1}"]["log_prob"][b],
                guide_tr.nodes[f"z_{t + 1}"]["log_prob"][b],
            )
            if t < L:
                for g, e in zip(got, ref[t]):
                    assert torch.allclose(g, e, atol=1e-10, rtol=1e-10), (arch, b, t, g, e)
            else:
                assert all(g.item() == 0.0 for g in got), (b, t, got)
        joint = joint + sum(e[0] + e[1] for e in ref)
        q = q + sum(e[2] for e in ref)
    assert torch.allclose(model_tr.log_prob_sum(), joint, atol=1e-10, rtol=1e-10)
    assert torch.allclose(guide_tr.log_prob_sum(), q, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("arch", ARCHS)
def test_time_parallel_and_step_by_step_scoring_agree(arch):
    """At the guide's latents, the replayed model (all steps at once for DMM and SRNN), the
    conditioned full-sequence model (step loop) and the model driven through init/step (FIVO's
    path, one emission per step) give every site the same log-density at 1e-10."""
    torch.manual_seed(0)
    m = tiny(arch)
    x, mask, u = batch()
    T = x.shape[1]
    guide_tr, parallel = replayed(m, x, mask, u)
    zs = latents(guide_tr, T)
    stepwise = conditioned(m, x, mask, u, zs)
    by_step = driven(m, x, mask, u, zs)
    assert stepwise.nodes["_RETURN"]["value"].replayed is None
    ref = site_log_probs(parallel, T)
    for tr in (stepwise, by_step):
        for name, lp in site_log_probs(tr, T).items():
            assert torch.allclose(lp, ref[name], atol=1e-10, rtol=1e-10), (
                arch,
                name,
                lp,
                ref[name],
            )


# the sites that changing u_s (0-based step s) changes at fixed latents, by the equations: the
# DMM's u_s enters p(z_s | z_{s-1}, u_s) only; the SRNN's and VRNN's enters d_s, which every
# later step reads (and x_s's emission through d_s)
def expected_changed(arch, s, T):
    if arch.startswith("dmm"):
        return {f"z_{s + 1}"}
    return {f"{v}_{t + 1}" for t in range(s, T) for v in ("z", "x")}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_model_is_causal_in_its_inputs(arch):
    """Changing u_s at fixed latents (the step loop, before and after) leaves every site before
    step s bit for bit and changes exactly the sites the equations make depend on u_s (step s
    and later). The replayed model on the new inputs, against a guide trace drawn with the old
    ones, scores the new inputs as the step loop does (the SRNN does not take d_{1:T} from a
    guide that ran on other inputs)."""
    torch.manual_seed(0)
    m = tiny(arch)
    x, mask, u = batch(lengths=(5, 5, 5))
    T, s = x.shape[1], 2
    u2 = u.clone()
    u2[:, s] += 1.0
    guide_tr = poutine.trace(m.guide).get_trace(x, mask, inputs=u)
    zs = latents(guide_tr, T)
    before = site_log_probs(conditioned(m, x, mask, u, zs), T)
    after = site_log_probs(conditioned(m, x, mask, u2, zs), T)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == expected_changed(arch, s, T), (arch, sorted(changed))
    for name in changed:
        assert (before[name] - after[name]).abs().max() > 1e-6, name
    _, replay_after = replayed(m, x, mask, u2, guide_tr=guide_tr)
    for name, lp in site_log_probs(replay_after, T).items():
        assert torch.allclose(lp, after[name], atol=1e-10, rtol=1e-10), name


# ----------------------------------------------------------------- training objectives
@pytest.mark.parametrize("arch", ARCHS)
def test_fivo_one_particle_equals_trace_elbo_with_inputs(arch):
    """FIVO with one particle (init/step, per-particle state) is Trace_ELBO (full-sequence,
    time-parallel) for the same random numbers, with inputs; the inputs move the bound."""
    torch.manual_seed(0)
    m = tiny(arch)
    x, mask, u = batch()
    pyro.set_rng_seed(7)
    a = FIVO(num_particles=1).loss(m.model, m.guide, x, mask, inputs=u)
    pyro.set_rng_seed(7)
    b = Trace_ELBO().loss(m.model, m.guide, x, mask, inputs=u)
    assert abs(a - b) <= 1e-9 * abs(b), (a, b)
    pyro.set_rng_seed(7)
    c = Trace_ELBO().loss(m.model, m.guide, x, mask, inputs=u + 1.0)
    assert abs(c - b) > 1e-6


# ----------------------------------------------------------------- generation
@pytest.mark.parametrize("arch", ARCHS)
def test_generate_with_inputs(arch):
    """Shapes; the same seed and inputs give the same draw; changing u_s changes the emission
    parameters of step s (and leaves those before s) bit for bit; inputs are required."""
    torch.manual_seed(0)
    m = tiny(arch)
    u = torch.randn(2, 7, U)
    pyro.set_rng_seed(1)
    x, logits = m.generate(2, 7, inputs=u)
    assert x.shape == (2, 7, D) and logits.shape == (2, 7, D)
    assert ((x == 0) | (x == 1)).all()
    pyro.set_rng_seed(1)
    assert torch.equal(m.generate(2, 7, inputs=u)[1], logits)
    u2 = u.clone()
    u2[:, 3] += 1.0
    pyro.set_rng_seed(1)
    logits2 = m.generate(2, 7, inputs=u2)[1]
    assert torch.equal(logits2[:, :3], logits[:, :3])
    assert (logits2[:, 3] - logits[:, 3]).abs().min() > 1e-8
    msg = re.escape(
        f"generate: {m.module_name} was built with input_dim={U} and needs inputs= "
        f"(the known inputs u_t) of shape (num_sequences, num_steps, input_dim) = "
        f"(2, 7, {U})"
    )
    with pytest.raises(ValueError, match=msg):
        m.generate(2, 7)
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"generate: inputs must have shape (batch, T, input_dim) = (2, 7, {U}), got (2, 6, {U})"
        ),
    ):
        m.generate(2, 7, inputs=u[:, :6])
    with pytest.raises(ValueError, match="generate: inputs has a non-finite value"):
        m.generate(2, 7, inputs=torch.full((2, 7, U), float("nan")))


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_without_input_dim_refuses_inputs(arch):
    m = build(arch)
    assert m.generate(2, 3)[0].shape == (2, 3, D)
    with pytest.raises(
        ValueError,
        match=re.escape(f"generate: {m.module_name} takes no inputs (input_dim=0), got inputs="),
    ):
        m.generate(2, 3, inputs=torch.zeros(2, 3, U))


# ----------------------------------------------------------------- construction and checks
@pytest.mark.parametrize("name,cls", [("dmm", DMM), ("srnn", SRNN), ("vrnn", VRNN)])
def test_for_data_passes_input_dim_and_the_programs_check_inputs(name, cls):
    """``for_data(obs_dim, input_dim=3)`` (what ``pyro-seq train`` builds) declares
    ``input_dim`` 3; model and guide refuse missing inputs and inputs of the wrong size with the
    package's messages."""
    m = cls.for_data(D, input_dim=3, z_dim=2)
    assert isinstance(m, cls) and m.input_dim == 3 and m.z_dim == 2
    assert cls.for_data(D).input_dim == 0
    assert build_model(name, D, {"z_dim": 2}, input_dim=3).input_dim == 3
    x, mask, u = batch()
    for program in (m.model, m.guide):
        with pytest.raises(
            ValueError,
            match=re.escape(
                "inputs must have shape (batch, T, input_dim) = (3, 5, 3), got (3, 5, 2)"
            ),
        ):
            program(x, mask, inputs=u[..., :2])
        with pytest.raises(
            ValueError,
            match=re.escape("this model needs inputs= (controls), a tensor of shape (batch, T, 3)"),
        ):
            program(x, mask)
    with pytest.raises(
        ValueError,
        match=re.escape("inputs must have shape (batch, T, input_dim) = (3, 5, 3), got (3, 5, 4)"),
    ):
        FIVO(num_particles=2).loss(m.model, m.guide, x, mask, inputs=torch.zeros(3, 5, 4))
    without = cls.for_data(D, z_dim=2)
    with pytest.raises(ValueError, match="this model takes no inputs="):
        without.model(x, mask, inputs=u)


@pytest.mark.parametrize("cls", [DMM, SRNN, VRNN])
@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_bad_input_dim_is_named(cls, bad):
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"input_dim (known input features per step) must be a non-negative integer, got {bad!r}"
        ),
    ):
        cls(D, input_dim=bad)
