"""STORN (Bayer & Osendorfer (2014); prior sec. 3.3) against a hand-written reference.

The reference re-implements the equations with raw weight matrices (tanh RNN of eq. 2 and
the GRU written out, the emission MLP, Gaussian and Bernoulli log densities), independently of
the model code::

    h_t = f(h_{t-1}, [x_{t-1}, z_t])     x_0 = 0, h_0 = 0
    x_t ~ p(x_t | h_t)
    z_t ~ N(0, I) (white) or N(z_{t-1}, I) (Wiener, z_0 = 0)
    q(z_t | x_{1:t}) = N(mu(a_t), sigma(a_t)^2),  a_t = f_q(a_{t-1}, x_t),  a_0 = 0
"""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam

from pyro_seq.distributions.wiener import WienerProcess
from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models.storn import STORN
from tests.models.reference import bernoulli_logpmf, lin, normal_logpdf, randomize, softplus
from tests.models.reference import ragged_batch as reference_batch

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


# ----------------------------------------------------------------- reference, written out
def tanh_cell(rnn, u, h):
    """Eq. (2) with f_h = tanh (torch's two-bias layout)."""
    return torch.tanh(
        u @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
    )


def gru_cell(rnn, u, h):
    """One GRU step written out (Cho et al. 2014), gates ordered r, z, n as in torch."""
    gi = u @ rnn.weight_ih_l0.T + rnn.bias_ih_l0
    gh = h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
    H = h.shape[-1]
    r = torch.sigmoid(gi[..., :H] + gh[..., :H])
    g = torch.sigmoid(gi[..., H : 2 * H] + gh[..., H : 2 * H])
    n = torch.tanh(gi[..., 2 * H :] + r * gh[..., 2 * H :])
    return (1 - g) * n + g * h


def cell_fn(step_rnn):
    return {"tanh": tanh_cell, "gru": gru_cell}[step_rnn.cell]


def emission_logpdf(m, x, h):
    """log p(x_t | h_t): one tanh hidden layer, then Bernoulli logits or a Gaussian head."""
    if m.binary_observations:
        return bernoulli_logpmf(x, lin(m.emitter[2], torch.tanh(lin(m.emitter[0], h))))
    hid = torch.tanh(lin(m.emitter[0][0], h))
    head = m.emitter[1]
    return normal_logpdf(x, lin(head.loc, hid), head.min_scale + softplus(lin(head.raw_scale, hid)))


def prior_logpdf(prior, z, z_prev):
    if prior == "white":
        return normal_logpdf(z, torch.zeros_like(z), torch.ones_like(z))
    return normal_logpdf(z, z_prev, torch.ones_like(z))  # Wiener: N(z_{t-1}, I)


def storn_reference(m, x, zs):
    """Per step (log p(x_t|h_t), log p(z_t|z_{t-1}), log q(z_t|x_{1:t})) of one sequence."""
    T, D = x.shape
    dec, enc = cell_fn(m.decoder), cell_fn(m.encoder)
    h, a = torch.zeros(m.rnn_dim), torch.zeros(m.rnn_dim)
    x_prev, z_prev = torch.zeros(D), torch.zeros(m.z_dim)
    head = m.recognition
    terms = []
    for t in range(T):
        a = enc(m.encoder.rnn, x[t], a)
        q_loc, q_scale = lin(head.loc, a), head.min_scale + softplus(lin(head.raw_scale, a))
        h = dec(m.decoder.rnn, torch.cat([x_prev, zs[t]]), h)
        terms.append(
            (
                emission_logpdf(m, x[t], h),
                prior_logpdf(m.prior, zs[t], z_prev),
                normal_logpdf(zs[t], q_loc, q_scale),
            )
        )
        x_prev, z_prev = x[t], zs[t]
    return terms


def ragged_batch(likelihood, B=3, T=5, D=4, lengths=(5, 3, 2), seed=0):
    return reference_batch(likelihood, B, T, D, lengths, seed)


def check_sites_against_reference(m, reference, x, mask):
    """Every site's log-density in the guide trace and the replayed model trace equals the
    reference at 1e-10; padded steps contribute exactly zero."""
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    guide_tr.compute_log_prob()
    model_tr.compute_log_prob()
    T = x.shape[1]
    for b in range(x.shape[0]):
        L = int(mask[b].sum())
        zs = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][b] for t in range(L)])
        expected = reference(m, x[b, :L], zs)
        for t in range(T):
            got = (
                model_tr.nodes[f"x_{t + 1}"]["log_prob"][b],
                model_tr.nodes[f"z_{t + 1}"]["log_prob"][b],
                guide_tr.nodes[f"z_{t + 1}"]["log_prob"][b],
            )
            if t < L:
                for g, e in zip(got, expected[t]):
                    assert abs(g - e) < 1e-10, (b, t, g, e)
            else:
                assert all(g.item() == 0.0 for g in got), (b, t, got)
    return guide_tr, model_tr


CASES = [
    ("white", "tanh", "bernoulli"),
    ("wiener", "tanh", "bernoulli"),
    ("wiener", "gru", "gaussian"),
    ("white", "gru", "gaussian"),
]


@pytest.mark.parametrize("prior,cell,likelihood", CASES)
def test_site_log_densities_match_reference(prior, cell, likelihood):
    torch.manual_seed(0)
    m = STORN(4, z_dim=3, rnn_dim=5, emission_dim=6, prior=prior, cell=cell, likelihood=likelihood)
    randomize(m)
    x, mask = ragged_batch(likelihood)
    guide_tr, model_tr = check_sites_against_reference(m, storn_reference, x, mask)
    if prior == "wiener":  # the per-step factors are the WienerProcess density (Jacobian 1)
        z = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][0] for t in range(5)])
        total = sum(model_tr.nodes[f"z_{t + 1}"]["log_prob"][0] for t in range(5))
        assert abs(total - WienerProcess(5, torch.zeros(3)).log_prob(z)) < 1e-10


def test_step_by_step_run_matches_reference():
    """Without a replay (ancestral sampling from the model) the step-by-step path is used;
    conditioning the model on the guide's z gives the reference log-densities too."""
    torch.manual_seed(0)
    m = STORN(4, z_dim=3, rnn_dim=5, emission_dim=6, prior="wiener")
    randomize(m)
    x, mask = ragged_batch("bernoulli")
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    zs = {f"z_{t + 1}": guide_tr.nodes[f"z_{t + 1}"]["value"] for t in range(5)}
    model_tr = poutine.trace(poutine.condition(m.model, data=zs)).get_trace(x, mask)
    model_tr.compute_log_prob()
    expected = storn_reference(m, x[0], torch.stack([zs[f"z_{t + 1}"][0] for t in range(5)]))
    for t in range(5):
        assert abs(model_tr.nodes[f"x_{t + 1}"]["log_prob"][0] - expected[t][0]) < 1e-10
        assert abs(model_tr.nodes[f"z_{t + 1}"]["log_prob"][0] - expected[t][1]) < 1e-10


def test_recognition_model_filters():
    """q(z_t | x_{1:t}): perturbing x_{s} changes q(z_t) for t >= s only."""
    m = STORN(4, z_dim=3, rnn_dim=5, emission_dim=6)
    x, mask = ragged_batch("bernoulli", lengths=(5, 5, 5))
    zs = {f"z_{t + 1}": torch.randn(3, 3) for t in range(5)}

    def locs(data):
        tr = poutine.trace(poutine.condition(m.guide, data=zs)).get_trace(data, mask)
        tr.compute_log_prob()
        return [tr.nodes[f"z_{t + 1}"]["log_prob"] for t in range(5)]

    x2 = x.clone()
    x2[:, 2] = 1 - x2[:, 2]
    base, new = locs(x), locs(x2)
    for t in range(5):
        assert torch.equal(base[t], new[t]) == (t < 2), t


OBJECTIVES = {
    "trace_elbo": lambda: Trace_ELBO(),
    "mean_field": lambda: TraceMeanField_ELBO(),
    "iwae": lambda: IWAE(num_particles=4, max_plate_nesting=1),
    "iwae_dreg": lambda: IWAE(num_particles=4, max_plate_nesting=1, gradient_estimator="dreg"),
    "fivo": lambda: FIVO(num_particles=4),
}


def check_one_svi_step(m, objective, x, mask):
    """Gradients: finite for every parameter and not all zero; then one SVI step."""
    loss_fn = OBJECTIVES[objective]()
    pyro.set_rng_seed(2)
    loss = loss_fn.loss_and_grads(m.model, m.guide, x, mask)
    assert math.isfinite(loss)
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    m.zero_grad()
    before = [p.detach().clone() for p in m.parameters()]
    svi = SVI(m.model, m.guide, Adam({"lr": 0.01}), loss=loss_fn)
    assert math.isfinite(svi.step(x, mask))
    assert all(not torch.equal(b, p) for b, p in zip(before, m.parameters()))


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("prior", ["white", "wiener"])
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_one_svi_step_every_objective(objective, prior, likelihood):
    torch.manual_seed(0)
    m = STORN(4, z_dim=3, rnn_dim=5, emission_dim=6, prior=prior, likelihood=likelihood)
    x, mask = ragged_batch(likelihood)
    check_one_svi_step(m, objective, x, mask)


def check_particle_runs_match_full_runs(m, x, mask):
    """FIVO drives init/step one step at a time (per-particle state); Trace_ELBO / IWAE run the
    full sequence (time-parallel model). Same random numbers: FIVO(K=1) = Trace_ELBO and
    FIVO(K=4, never resample) = IWAE(4)."""
    pairs = [
        (FIVO(num_particles=1), Trace_ELBO()),
        (FIVO(num_particles=4, resample="never"), IWAE(num_particles=4, max_plate_nesting=1)),
    ]
    for fivo, other in pairs:
        pyro.set_rng_seed(7)
        a = fivo.loss(m.model, m.guide, x, mask)
        pyro.set_rng_seed(7)
        b = other.loss(m.model, m.guide, x, mask)
        assert abs(a - b) <= 1e-9 * abs(b), (type(other).__name__, a, b)


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("prior", ["white", "wiener"])
def test_fivo_one_particle_equals_trace_elbo(prior, likelihood):
    torch.manual_seed(0)
    m = STORN(4, z_dim=3, rnn_dim=5, emission_dim=6, prior=prior, likelihood=likelihood, cell="gru")
    x, mask = ragged_batch(likelihood)
    check_particle_runs_match_full_runs(m, x, mask)


def test_fivo_resamples_the_recurrent_state():
    """With resampling the per-particle h and z_{t-1} are gathered: the bound stays finite and
    resampling happens."""
    torch.manual_seed(0)
    m = STORN(4, z_dim=3, rnn_dim=5, emission_dim=6)
    x, mask = ragged_batch("bernoulli")
    fivo = FIVO(num_particles=5, resample="always")
    log_z, _ = fivo.log_z(m.model, m.guide, x, mask)
    assert torch.isfinite(log_z).all()
    assert fivo.last_num_resamples.tolist() == [4, 2, 1]


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_generate_shapes(likelihood):
    m = STORN(4, z_dim=3, rnn_dim=5, emission_dim=6, likelihood=likelihood)
    x, params = m.generate(2, 7)
    assert x.shape == (2, 7, 4)
    if likelihood == "bernoulli":
        assert params.shape == (2, 7, 4)
        assert ((x == 0) | (x == 1)).all()
    else:
        assert [p.shape for p in params] == [(2, 7, 4)] * 2


def test_defaults_and_bad_options_raise():
    assert STORN(4).prior == "white"
    with pytest.raises(ValueError, match="prior"):
        STORN(4, prior="gp")
    with pytest.raises(ValueError, match="cell"):
        STORN(4, cell="lstm")
    with pytest.raises(ValueError, match="likelihood"):
        STORN(4, likelihood="poisson")
    with pytest.raises(ValueError, match="z_dim"):
        STORN(4, z_dim=0)


def check_trains(m):
    """40 Adam steps on a fixed tiny binary data set raise a 20-sample ELBO estimate."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(8, 7, 6, generator=g) < 0.3).double()
    mask = torch.arange(7) < torch.tensor([7, 6, 5, 7, 3, 4, 7, 2]).unsqueeze(-1)
    x = x * mask.unsqueeze(-1)

    def estimate():
        pyro.set_rng_seed(11)
        return -Trace_ELBO(num_particles=20).loss(m.model, m.guide, x, mask)

    before = estimate()
    svi = SVI(m.model, m.guide, Adam({"lr": 0.02}), loss=Trace_ELBO())
    for _ in range(40):
        assert math.isfinite(svi.step(x, mask))
    assert estimate() > before + 10.0  # measured +31 to +60 nats (float32 run); MC noise ~1


@pytest.mark.parametrize("prior", ["white", "wiener"])
def test_trains(prior):
    torch.manual_seed(0)
    check_trains(STORN(6, z_dim=3, rnn_dim=8, emission_dim=8, prior=prior))
