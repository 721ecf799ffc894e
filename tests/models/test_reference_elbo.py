"""Per-time-step ELBO terms of DMM and SRNN against a hand-written reference.

The reference re-implements the published equations with raw weight matrices (GRU/RNN cells,
MLPs, Gaussian and Bernoulli log densities written out), independently of the model code:
SRNN thesis eq. 5.1, 5.3, 5.7, 5.10, 5.12; DMM thesis eq. 4.3, 4.8, 4.9 with the gated
transition and combiner of Krishnan et al. (2017). Given the latent samples recorded in a guide
trace, every site's log-density must match the reference to float64 rounding.
"""

import pyro.poutine as poutine
import pytest
import torch

from pyro_seq.models import DMM, SRNN
from tests.models.reference import (
    act,
    bernoulli_logpmf,
    gru_cell,
    lin,
    normal_logpdf,
    normal_logpdf_logvar,
    randomize,
    relu_rnn_cell,
    softplus,
)

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def gaussian_mlp(net, *inputs):
    """The documented departure (SRNN ``variance="softplus"``): std = min_scale + softplus(NN_2)."""
    h = act(lin(net.first, torch.cat(inputs, -1)))
    return lin(net.head.loc, h), net.head.min_scale + softplus(lin(net.head.raw_scale, h))


def mean_logvar_mlp(net, *inputs):
    """Eq. 5.3 / 5.10: ``mu = NN_1(.)``, ``log v = NN_2(.)`` (one hidden layer shared)."""
    h = act(lin(net.first, torch.cat(inputs, -1)))
    return lin(net.head.loc, h), lin(net.head.raw_scale, h)


def srnn_reference(m, x, zs, variance="softplus"):
    """Per-step (log p(x_t|z_t,d_t), log p(z_t|z_{t-1},d_t), log q(z_t|z_{t-1},a_t)), one sequence."""
    T, D = x.shape
    d, h = [], torch.zeros(m.deterministic.rnn.hidden_size)
    u = torch.cat([torch.zeros(1, D), x[:-1]])  # u_t = x_{t-1}
    for t in range(T):
        h = gru_cell(m.deterministic.rnn, u[t], h)  # eq. 5.1
        d.append(h)
    a, g = [None] * T, torch.zeros(m.encoder.rnn.hidden_size)
    for t in reversed(range(T)):  # eq. 5.7, a_{T+1} = 0
        g = gru_cell(m.encoder.rnn, torch.cat([d[t], x[t]]), g)
        a[t] = g
    terms, z_prev = [], torch.zeros(m.z_dim)
    for t in range(T):
        hid = act(lin(m.emitter[0], torch.cat([zs[t], d[t]])))
        log_px = bernoulli_logpmf(x[t], lin(m.emitter[2], hid))
        if variance == "log":  # eq. 5.3 and 5.10
            p_mu, p_logv = mean_logvar_mlp(m.prior, z_prev, d[t])
            q_mu, q_logv = mean_logvar_mlp(m.posterior, z_prev, a[t])
            q_mu = q_mu + p_mu  # Res_q, eq. 5.12
            terms.append(
                (
                    log_px,
                    normal_logpdf_logvar(zs[t], p_mu, p_logv),
                    normal_logpdf_logvar(zs[t], q_mu, q_logv),
                )
            )
        else:  # documented departure
            p_loc, p_scale = gaussian_mlp(m.prior, z_prev, d[t])
            q_loc, q_scale = gaussian_mlp(m.posterior, z_prev, a[t])
            q_loc = q_loc + p_loc  # Res_q, eq. 5.12
            terms.append(
                (log_px, normal_logpdf(zs[t], p_loc, p_scale), normal_logpdf(zs[t], q_loc, q_scale))
            )
        z_prev = zs[t]
    return terms


def dmm_reference(m, x, zs):
    T, D = x.shape
    a, g = [None] * T, m.encoder.h0
    for t in reversed(range(T)):  # eq. 4.8 (ReLU RNN)
        g = relu_rnn_cell(m.encoder.rnn, x[t], g)
        a[t] = g
    tr, cb = m.transition, m.combiner
    terms, z_prev, zq_prev = [], m.z_0, m.z_q_0
    for t in range(T):
        gate = torch.sigmoid(lin(tr.gate, torch.relu(lin(tr.gate_hidden, z_prev))))
        prop = lin(tr.proposal, torch.relu(lin(tr.proposal_hidden, z_prev)))
        p_loc = (1 - gate) * lin(tr.linear, z_prev) + gate * prop
        p_scale = tr.min_scale + softplus(lin(tr.raw_scale, torch.relu(prop)))
        hc = 0.5 * (torch.tanh(lin(cb.z_to_hidden, zq_prev)) + a[t])
        q_loc, q_scale = lin(cb.loc, hc), cb.min_scale + softplus(lin(cb.raw_scale, hc))
        e = m.emitter
        logits = lin(e[4], torch.relu(lin(e[2], torch.relu(lin(e[0], zs[t])))))
        terms.append(
            (
                bernoulli_logpmf(x[t], logits),
                normal_logpdf(zs[t], p_loc, p_scale),
                normal_logpdf(zs[t], q_loc, q_scale),
            )
        )
        z_prev = zq_prev = zs[t]
    return terms


@pytest.mark.parametrize("arch", ["srnn", "srnn_logvar", "dmm"])
def test_site_log_densities_match_reference(arch):
    torch.manual_seed(0)
    if arch == "srnn":
        m, ref = SRNN(5, d_dim=4, z_dim=3, hidden_dim=6), srnn_reference
    elif arch == "srnn_logvar":  # eq. 5.10 exactly: log-variance, no floor
        m = SRNN(5, d_dim=4, z_dim=3, hidden_dim=6, variance="log", min_scale=0.0)
        ref = lambda m, x, zs: srnn_reference(m, x, zs, variance="log")  # noqa: E731
    else:
        m, ref = DMM(5, z_dim=3, transition_dim=6, emission_dim=4, rnn_dim=4), dmm_reference
    randomize(m)
    x = (torch.rand(2, 6, 5) < 0.4).double()
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2]).bool()
    guide_tr = poutine.trace(m.guide).get_trace(x, mask)
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask)
    for b in range(2):
        L = int(mask[b].sum())
        zs = torch.stack([guide_tr.nodes[f"z_{t + 1}"]["value"][b] for t in range(L)])
        expected = ref(m, x[b, :L], zs)
        for t in range(6):
            got = (
                model_tr.nodes[f"x_{t + 1}"]["fn"].log_prob(x[:, t])[b],
                model_tr.nodes[f"z_{t + 1}"]["fn"].log_prob(guide_tr.nodes[f"z_{t + 1}"]["value"])[
                    b
                ],
                guide_tr.nodes[f"z_{t + 1}"]["fn"].log_prob(guide_tr.nodes[f"z_{t + 1}"]["value"])[
                    b
                ],
            )
            if t < L:
                for g, e in zip(got, expected[t]):
                    assert torch.allclose(g, e, atol=1e-10, rtol=1e-10), (arch, b, t, g, e)
            else:  # padded steps contribute exactly zero
                assert all(g.item() == 0.0 for g in got)
