"""VOSP (Bayer & Osendorfer (2014), sec. 3.2; prior sec. 3.3) against the equations written out.

The reference runs the networks by hand from their raw weights (the tanh RNN of eq. 2 or a GRU,
the generating MLP, Bernoulli and Gaussian log densities), independently of the model code::

    h_t = f(h_{t-1}, x_t)                      h_0 = 0   (the recognition RNN, the only RNN)
    z_t ~ N(0, I) (white) or N(z_{t-1}, I) (Wiener, z_0 = 0)
    x_t ~ p(x_t | h_{t-1}, z_t) = MLP([h_{t-1}, z_t])
    q(z_t | x_{1:t}) = N(mu(h_t), sigma(h_t)^2)
"""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
import torch.nn as nn
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import Adam

from pyro_seq.cli import build_model
from pyro_seq.infer import FIVO
from pyro_seq.models import STORN, VOSP
from pyro_seq.models.storn import StepRNN
from tests.models.reference import (
    bernoulli_logpmf,
    gru_cell,
    lin,
    normal_logpdf,
    randomize,
    softplus,
)
from tests.models.reference import ragged_batch as reference_batch

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


# ----------------------------------------------------------------- reference, written out
def tanh_cell(rnn, x, h):
    """Eq. (2) with f_h = tanh (torch's two-bias layout)."""
    return torch.tanh(
        x @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
    )


def recognition_rnn(m, x):
    """``h_{0:T}`` of one sequence ``x (T, D)``: ``(T + 1, H)``, ``h_0 = 0``."""
    cell = {"tanh": tanh_cell, "gru": gru_cell}[m.encoder.cell]
    hs = [torch.zeros(m.rnn_dim)]
    for t in range(x.shape[0]):
        hs.append(cell(m.encoder.rnn, x[t], hs[-1]))
    return torch.stack(hs)


def emission_logpdf(m, x, h_prev, z):
    """log p(x_t | h_{t-1}, z_t): one tanh hidden layer on [h_{t-1}, z_t], then Bernoulli logits
    or a Gaussian head."""
    u = torch.cat([h_prev, z])
    if m.binary_observations:
        return bernoulli_logpmf(x, lin(m.emitter[2], torch.tanh(lin(m.emitter[0], u))))
    hid = torch.tanh(lin(m.emitter[0][0], u))
    head = m.emitter[1]
    return normal_logpdf(x, lin(head.loc, hid), head.min_scale + softplus(lin(head.raw_scale, hid)))


def vosp_reference(m, x, zs):
    """Per step (log p(x_t | h_{t-1}, z_t), log p(z_t | z_{t-1}), log q(z_t | x_{1:t})) of one
    sequence ``x (T, D)`` with latents ``zs (T, Z)``."""
    hs = recognition_rnn(m, x)
    head = m.recognition
    terms, z_prev = [], torch.zeros(m.z_dim)
    for t in range(x.shape[0]):
        prior_loc = torch.zeros(m.z_dim) if m.prior == "white" else z_prev
        q_loc = lin(head.loc, hs[t + 1])
        q_scale = head.min_scale + softplus(lin(head.raw_scale, hs[t + 1]))
        terms.append(
            (
                emission_logpdf(m, x[t], hs[t], zs[t]),
                normal_logpdf(zs[t], prior_loc, torch.ones(m.z_dim)),
                normal_logpdf(zs[t], q_loc, q_scale),
            )
        )
        z_prev = zs[t]
    return terms


def ragged_batch(likelihood, B=3, T=5, D=4, lengths=(5, 3, 2), seed=0):
    return reference_batch(likelihood, B, T, D, lengths, seed)


def tiny(prior="wiener", cell="tanh", likelihood="bernoulli"):
    m = VOSP(4, z_dim=3, rnn_dim=5, emission_dim=6, prior=prior, cell=cell, likelihood=likelihood)
    randomize(m)
    return m


def traces(m, x, mask, full_model=True, guide_tr=None):
    """The guide's trace (drawn unless given) and the model's trace at the guide's z: replayed
    (time-parallel) or, with ``full_model=False``, conditioned (the step-by-step loop)."""
    if guide_tr is None:
        guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    if full_model:
        model = poutine.replay(m.model, trace=guide_tr)
    else:
        zs = {f"z_{t + 1}": guide_tr.nodes[f"z_{t + 1}"]["value"] for t in range(x.shape[1])}
        model = poutine.condition(m.model, data=zs)
    model_tr = poutine.trace(model).get_trace(x, mask)
    guide_tr.compute_log_prob()
    model_tr.compute_log_prob()
    return guide_tr, model_tr


CASES = [
    ("wiener", "tanh", "bernoulli"),
    ("white", "tanh", "bernoulli"),
    ("wiener", "gru", "bernoulli"),
    ("white", "gru", "gaussian"),
]


# ----------------------------------------------------------------- the bound's terms
@pytest.mark.parametrize("prior,cell,likelihood", CASES)
def test_log_joint_matches_sec_3_2_written_out(prior, cell, likelihood):
    """log p(x, z) of the replayed model trace and log q(z | x) of the guide trace equal the
    hand-run networks of sec. 3.2 at 1e-10, site by site; padded steps contribute exactly 0."""
    torch.manual_seed(0)
    m = tiny(prior, cell, likelihood)
    x, mask = ragged_batch(likelihood)
    guide_tr, model_tr = traces(m, x, mask)
    expected_joint, expected_q = 0.0, 0.0
    for b in range(x.shape[0]):
        L = int(mask[b].sum())
        zs = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][b] for t in range(L)])
        ref = vosp_reference(m, x[b, :L], zs)
        for t in range(x.shape[1]):
            got = (
                model_tr.nodes[f"x_{t + 1}"]["log_prob"][b],
                model_tr.nodes[f"z_{t + 1}"]["log_prob"][b],
                guide_tr.nodes[f"z_{t + 1}"]["log_prob"][b],
            )
            if t < L:
                for g, e in zip(got, ref[t]):
                    assert abs(g - e) < 1e-10, (b, t, g, e)
            else:
                assert all(g.item() == 0.0 for g in got), (b, t, got)
        expected_joint += sum(e[0] + e[1] for e in ref)
        expected_q += sum(e[2] for e in ref)
    assert abs(model_tr.log_prob_sum() - expected_joint) < 1e-10
    assert abs(guide_tr.log_prob_sum() - expected_q) < 1e-10


@pytest.mark.parametrize("prior,cell,likelihood", CASES)
def test_time_parallel_and_step_by_step_scoring_agree(prior, cell, likelihood):
    """The replayed model scores every step at once (``state.replayed`` is set); the model
    conditioned on the same z runs the step loop. Every site's log-density agrees."""
    torch.manual_seed(0)
    m = tiny(prior, cell, likelihood)
    x, mask = ragged_batch(likelihood)
    guide_tr, parallel = traces(m, x, mask, full_model=True)
    _, stepwise = traces(m, x, mask, full_model=False, guide_tr=guide_tr)
    assert parallel.nodes["_RETURN"]["value"].replayed is not None
    assert stepwise.nodes["_RETURN"]["value"].replayed is None
    for t in range(x.shape[1]):
        for site in (f"x_{t + 1}", f"z_{t + 1}"):
            a, b = parallel.nodes[site]["log_prob"], stepwise.nodes[site]["log_prob"]
            assert torch.allclose(a, b, rtol=0, atol=1e-12), (site, a, b)


def test_one_step_predictor_is_online():
    """Changing x_s changes q(z_t | x_{1:t}) and the x-sites at t >= s only: the past flows
    into the prediction of x_t, the future never does."""
    m = tiny()
    x, mask = ragged_batch("bernoulli", lengths=(5, 5, 5))
    zs = {f"z_{t + 1}": torch.randn(3, 3) for t in range(5)}

    def log_probs(data):
        g = poutine.trace(poutine.condition(m.guide, data=zs)).get_trace(data, mask)
        p = poutine.trace(poutine.condition(m.model, data=zs)).get_trace(data, mask)
        g.compute_log_prob()
        p.compute_log_prob()
        return [
            (g.nodes[f"z_{t + 1}"]["log_prob"], p.nodes[f"x_{t + 1}"]["log_prob"]) for t in range(5)
        ]

    x2 = x.clone()
    x2[:, 2] = 1 - x2[:, 2]
    for t, (a, b) in enumerate(zip(log_probs(x), log_probs(x2))):
        assert torch.equal(a[0], b[0]) == (t < 2), t
        assert torch.equal(a[1], b[1]) == (t < 2), t


# ----------------------------------------------------------------- training
def test_svi_step_and_particle_runs():
    """Trace_ELBO: finite loss, a nonzero finite gradient for every parameter, one SVI step
    moves every parameter; FIVO with one particle (init/step, per-particle z) equals
    Trace_ELBO (full-sequence, time-parallel) for the same random numbers."""
    torch.manual_seed(0)
    m = VOSP(4, z_dim=3, rnn_dim=5, emission_dim=6)
    x, mask = ragged_batch("bernoulli")
    loss = Trace_ELBO().loss_and_grads(m.model, m.guide, x, mask)
    assert math.isfinite(loss)
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    m.zero_grad()
    before = [p.detach().clone() for p in m.parameters()]
    svi = SVI(m.model, m.guide, Adam({"lr": 0.01}), loss=Trace_ELBO())
    assert math.isfinite(svi.step(x, mask))
    assert all(not torch.equal(b, p) for b, p in zip(before, m.parameters()))
    pyro.set_rng_seed(7)
    a = FIVO(num_particles=1).loss(m.model, m.guide, x, mask)
    pyro.set_rng_seed(7)
    b = Trace_ELBO().loss(m.model, m.guide, x, mask)
    assert abs(a - b) <= 1e-9 * abs(b), (a, b)


# ----------------------------------------------------------------- generation
@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_generate_shapes(likelihood):
    m = VOSP(4, z_dim=3, rnn_dim=5, emission_dim=6, likelihood=likelihood)
    x, params = m.generate(2, 7)
    assert x.shape == (2, 7, 4)
    if likelihood == "bernoulli":
        assert params.shape == (2, 7, 4)
        assert ((x == 0) | (x == 1)).all()
    else:
        assert [p.shape for p in params] == [(2, 7, 4)] * 2


def test_generation_feeds_its_samples_to_the_recognition_rnn():
    """No generating RNN: the only recurrent network is the recognition RNN. With the z-columns
    of the generating MLP zeroed, the emission logits of step t are MLP([h_{t-1}, 0]) with
    h_{t-1} the recognition RNN run by hand over the *generated* x_{1:t-1} (sec. 3.2: the past
    flows deterministically into the prediction of x_t)."""
    torch.manual_seed(0)
    m = tiny()
    recurrent = [n for n, mod in m.named_modules() if isinstance(mod, (StepRNN, nn.RNNBase))]
    assert recurrent == ["encoder", "encoder.rnn"]
    with torch.no_grad():
        m.emitter[0].weight[:, m.rnn_dim :] = 0.0
    x, logits = m.generate(3, 6)
    for b in range(3):
        hs = recognition_rnn(m, x[b])
        for t in range(6):
            u = torch.cat([hs[t], torch.zeros(m.z_dim)])
            expected = lin(m.emitter[2], torch.tanh(lin(m.emitter[0], u)))
            assert torch.allclose(logits[b, t], expected, rtol=0, atol=1e-12), (b, t)


# ----------------------------------------------------------------- construction
def test_constructor_conventions():
    """Its own class (not STORN), the Wiener prior and z_dim=8 by default, the models'
    option names (as the command line's ``--model vosp`` passes them)."""
    m = VOSP(4)
    assert not isinstance(m, STORN) and m.prior == "wiener" and m.z_dim == 8
    assert m.module_name == "vosp" and m.binary_observations
    assert not hasattr(m, "decoder")
    built = build_model(
        "vosp",
        6,
        {"z_dim": 2, "rnn_dim": 5, "emission_dim": 7, "likelihood": "gaussian", "cell": "gru"},
    )
    assert isinstance(built, VOSP) and built.encoder.cell == "gru"
    assert not built.binary_observations and built.emitter[0][0].in_features == 5 + 2
    gmm = VOSP(4, z_dim=2, rnn_dim=3, emission_dim=4, likelihood="gmm", num_components=2)
    assert gmm.generate(2, 3)[0].shape == (2, 3, 4)
    for kwargs, name in (
        ({"prior": "gp"}, "prior"),
        ({"cell": "lstm"}, "cell"),
        ({"likelihood": "poisson"}, "likelihood"),
        ({"z_dim": 0}, "z_dim"),
        ({"rnn_dim": 2.5}, "rnn_dim"),
    ):
        with pytest.raises(ValueError, match=name):
            VOSP(4, **kwargs)
