"""VRAE (Bayer & Osendorfer (2014), sec. 3.1; prior sec. 3.3) against a hand-written reference.

Reference, written out independently of the model code (cells and densities from
``test_storn``)::

    ->a_t = f(->a_{t-1}, x_t),  <-a_t = g(<-a_{t+1}, x_t)   (zero starts; <- from step L)
    q(z_t | x_{1:L}) = N(mu([->a_t, <-a_t]), sigma([->a_t, <-a_t])^2)
    z_t ~ N(0, I) (white) or N(z_{t-1}, I) (Wiener, z_0 = 0)
    h_t = f_d(h_{t-1}, z_t),  h_0 = 0;   x_t ~ p(x_t | h_t)

The closed-form KL term of L_VRAE is checked against the dense Gaussian KL with the
GP(0, min(r, t)) covariance of sec. 3.3.
"""

import pyro.poutine as poutine
import pytest
import torch

from pyro_seq.models.vrae import VRAE
from tests.models.reference import lin, normal_logpdf, randomize, softplus
from tests.models.test_storn import (
    OBJECTIVES,
    cell_fn,
    check_one_svi_step,
    check_particle_runs_match_full_runs,
    check_sites_against_reference,
    check_trains,
    emission_logpdf,
    prior_logpdf,
    ragged_batch,
)

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def recognition_reference(m, x):
    """(loc, scale) of q(z_t | x_{1:L}) for one sequence of length L = len(x)."""
    T = x.shape[0]
    fwd, bwd = cell_fn(m.forward_encoder), cell_fn(m.backward_encoder)
    f, b = torch.zeros(m.encoder_dim), torch.zeros(m.encoder_dim)
    forward, backward = [], [None] * T
    for t in range(T):
        f = fwd(m.forward_encoder.rnn, x[t], f)
        forward.append(f)
    for t in reversed(range(T)):
        b = bwd(m.backward_encoder.rnn, x[t], b)
        backward[t] = b
    head = m.recognition
    params = []
    for t in range(T):
        a = torch.cat([forward[t], backward[t]])
        params.append((lin(head.loc, a), head.min_scale + softplus(lin(head.raw_scale, a))))
    return params


def vrae_reference(m, x, zs):
    """Per step (log p(x_t|h_t), log p(z_t|z_{t-1}), log q(z_t|x_{1:L})) of one sequence."""
    dec = cell_fn(m.decoder)
    h, z_prev = torch.zeros(m.decoder_dim), torch.zeros(m.z_dim)
    terms = []
    for t, (q_loc, q_scale) in enumerate(recognition_reference(m, x)):
        h = dec(m.decoder.rnn, zs[t], h)
        terms.append(
            (
                emission_logpdf(m, x[t], h),
                prior_logpdf(m.prior, zs[t], z_prev),
                normal_logpdf(zs[t], q_loc, q_scale),
            )
        )
        z_prev = zs[t]
    return terms


def garbage_padded_batch(likelihood, **kwargs):
    """Padded entries set to 1: the bidirectional encoder must not read them."""
    x, mask = ragged_batch(likelihood, **kwargs)
    return torch.where(mask.unsqueeze(-1), x, torch.ones_like(x)), mask


def tiny(**kwargs):
    return VRAE(4, z_dim=3, encoder_dim=5, decoder_dim=4, emission_dim=6, **kwargs)


CASES = [
    ("white", "tanh", "bernoulli"),
    ("wiener", "tanh", "bernoulli"),
    ("wiener", "gru", "gaussian"),
    ("white", "gru", "gaussian"),
]


@pytest.mark.parametrize("prior,cell,likelihood", CASES)
def test_site_log_densities_match_reference(prior, cell, likelihood):
    torch.manual_seed(0)
    m = tiny(prior=prior, cell=cell, likelihood=likelihood)
    randomize(m)
    x, mask = garbage_padded_batch(likelihood)
    check_sites_against_reference(m, vrae_reference, x, mask)


def dense_kl(mu_q, var_q, cov_p):
    n = mu_q.shape[-1]
    inv_p = torch.linalg.inv(cov_p)
    return 0.5 * (
        torch.logdet(cov_p)
        - torch.log(var_q).sum()
        - n
        + torch.trace(inv_p @ torch.diag(var_q))
        + mu_q @ inv_p @ mu_q
    )


@pytest.mark.parametrize("prior", ["white", "wiener"])
def test_closed_form_kl_matches_dense_gaussian_kl(prior):
    """KL(q(z_{1:L}) | p(z_{1:L})) of sec. 3.1 / 3.3: dense prior covariance min(r, t) (Wiener)
    or I (white), recognition parameters from the written-out encoder."""
    torch.manual_seed(0)
    m = tiny(prior=prior)
    randomize(m)
    x, mask = garbage_padded_batch("bernoulli")
    got = m.kl_divergence(x, mask)
    for b in range(x.shape[0]):
        L = int(mask[b].sum())
        params = recognition_reference(m, x[b, :L])
        loc = torch.stack([p[0] for p in params])  # (L, Z)
        var = torch.stack([p[1] for p in params]) ** 2
        t = torch.arange(1, L + 1, dtype=torch.float64)
        cov = torch.minimum(t.unsqueeze(-1), t) if prior == "wiener" else torch.eye(L)
        expected = sum(dense_kl(loc[:, i], var[:, i], cov) for i in range(m.z_dim))
        assert abs(got[b] - expected) < 1e-10, (b, got[b], expected)


def test_recognition_model_sees_the_whole_sequence():
    m = tiny()
    x, mask = ragged_batch("bernoulli", lengths=(5, 5, 5))
    zs = {f"z_{t + 1}": torch.randn(3, 3) for t in range(5)}

    def log_qs(data):
        tr = poutine.trace(poutine.condition(m.guide, data=zs)).get_trace(data, mask)
        tr.compute_log_prob()
        return [tr.nodes[f"z_{t + 1}"]["log_prob"] for t in range(5)]

    x2 = x.clone()
    x2[:, 2] = 1 - x2[:, 2]
    base, new = log_qs(x), log_qs(x2)
    assert all(not torch.equal(base[t], new[t]) for t in range(5))


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("prior", ["white", "wiener"])
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_one_svi_step_every_objective(objective, prior, likelihood):
    torch.manual_seed(0)
    m = tiny(prior=prior, likelihood=likelihood)
    x, mask = ragged_batch(likelihood)
    check_one_svi_step(m, objective, x, mask)


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("prior", ["white", "wiener"])
def test_fivo_one_particle_equals_trace_elbo(prior, likelihood):
    torch.manual_seed(0)
    m = tiny(prior=prior, likelihood=likelihood, cell="gru")
    x, mask = ragged_batch(likelihood)
    check_particle_runs_match_full_runs(m, x, mask)


@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
def test_generate_shapes(likelihood):
    m = tiny(likelihood=likelihood)
    x, params = m.generate(2, 7)
    assert x.shape == (2, 7, 4)
    if likelihood == "bernoulli":
        assert params.shape == (2, 7, 4)
        assert ((x == 0) | (x == 1)).all()
    else:
        assert [p.shape for p in params] == [(2, 7, 4)] * 2


def test_bad_options_raise():
    with pytest.raises(ValueError, match="prior"):
        tiny(prior="ou")
    with pytest.raises(ValueError, match="cell"):
        tiny(cell="lstm")
    with pytest.raises(ValueError, match="likelihood"):
        tiny(likelihood="poisson")
    with pytest.raises(ValueError, match="decoder_dim"):
        VRAE(4, decoder_dim=0)


@pytest.mark.parametrize("prior", ["white", "wiener"])
def test_trains(prior):
    torch.manual_seed(0)
    check_trains(VRAE(6, z_dim=3, encoder_dim=8, decoder_dim=8, emission_dim=8, prior=prior))
