"""Behaviour of the DMM and SRNN model/guide pairs under the sequence-model contract."""

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam

from pyro_seq.models import DMM, SRNN, check_sequences
from pyro_seq.ops import SequenceState

TINY = {
    "dmm": lambda inference="smoothing": DMM(
        6, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8, inference=inference
    ),
    "srnn": lambda inference="smoothing": SRNN(
        6, d_dim=8, z_dim=3, hidden_dim=8, inference=inference
    ),
}


def binary_batch(B=3, T=7, D=6, lengths=(7, 5, 2), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(B, T, D, generator=g) < 0.3).float()
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


def guide_params(m, x, mask, zs):
    """(loc, scale) of every q(z_t | z_{t-1}, ...) with the latent path fixed to ``zs``."""
    tr = poutine.trace(poutine.condition(m.guide, data=zs)).get_trace(x, mask)
    return {
        k: (tr.nodes[k]["fn"].base_dist.base_dist.loc, tr.nodes[k]["fn"].base_dist.base_dist.scale)
        for k in zs
    }


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
def test_padding_content_is_ignored(arch):
    m = TINY[arch]()
    x, mask = binary_batch()
    garbage = torch.where(mask.unsqueeze(-1), x, torch.ones_like(x))
    losses = []
    for data in (x, garbage):
        pyro.set_rng_seed(3)
        losses.append(Trace_ELBO().loss(m.model, m.guide, data, mask))
    assert losses[0] == losses[1]


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
def test_batch_elbo_is_sum_of_per_sequence_elbos(arch):
    """A ragged batch gives the same log-densities as each sequence run alone (same z path)."""
    m = TINY[arch]()
    x, mask = binary_batch()
    g_tr = poutine.trace(m.guide).get_trace(x, mask)
    m_tr = poutine.trace(poutine.replay(m.model, trace=g_tr)).get_trace(x, mask)
    g_tr.compute_log_prob()
    m_tr.compute_log_prob()
    for b, L in enumerate(mask.sum(-1).tolist()):
        zs = {f"z_{t + 1}": g_tr.nodes[f"z_{t + 1}"]["value"][b : b + 1] for t in range(L)}
        xb = x[b : b + 1, :L]
        g1 = poutine.trace(poutine.condition(m.guide, data=zs)).get_trace(xb)
        m1 = poutine.trace(poutine.condition(m.model, data=zs)).get_trace(xb)
        g1.compute_log_prob()
        m1.compute_log_prob()
        for name in list(zs) + [f"x_{t + 1}" for t in range(L)]:
            assert torch.allclose(
                m1.nodes[name]["log_prob"][0], m_tr.nodes[name]["log_prob"][b], atol=1e-5
            ), name
        for name in zs:
            assert torch.allclose(
                g1.nodes[name]["log_prob"][0], g_tr.nodes[name]["log_prob"][b], atol=1e-5
            ), name


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
@pytest.mark.parametrize("inference", ["smoothing", "filtering"])
def test_smoothing_guide_sees_the_future_filtering_does_not(arch, inference):
    m = TINY[arch](inference)
    x, mask = binary_batch(lengths=(7, 7, 7))
    T = x.shape[1]
    zs = {f"z_{t + 1}": torch.randn(3, 3) for t in range(T)}
    base = guide_params(m, x, mask, zs)
    t = 2
    x2 = x.clone()
    x2[:, t + 1] = 1 - x2[:, t + 1]  # perturb x_{t+1}
    new = guide_params(m, x2, mask, zs)
    for s in range(t + 1):  # q(z_s), s <= t
        changed = not torch.allclose(base[f"z_{s + 1}"][0], new[f"z_{s + 1}"][0])
        assert changed == (inference == "smoothing"), (s, inference)
    # both guides see the present: q(z_{t+1}) depends on x_{t+1}
    assert not torch.allclose(base[f"z_{t + 2}"][0], new[f"z_{t + 2}"][0])


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
def test_step_protocol_is_the_model(arch):
    """init/step driven by hand give exactly the sites of the full-sequence call (latent values
    on the real steps: a fused guide does not compute the padding, where no site is scored, and
    its products over the rows still running round differently from the full batch's)."""
    m = TINY[arch]()
    x, mask = binary_batch()
    pyro.set_rng_seed(5)
    full_g = poutine.trace(m.guide).get_trace(x, mask)
    full_m = poutine.trace(poutine.replay(m.model, trace=full_g)).get_trace(x, mask)

    pyro.set_rng_seed(5)
    state, traces = SequenceState(), []
    traces.append(poutine.trace(m.guide.init).get_trace(state, x, mask))
    traces.append(poutine.trace(m.model.init).get_trace(state, x, mask))
    for t in range(x.shape[1]):  # each step traced on its own, as particle methods do
        g = poutine.trace(m.guide.step).get_trace(state, t, x, mask)
        traces += [
            g,
            poutine.trace(poutine.replay(m.model.step, trace=g)).get_trace(state, t, x, mask),
        ]
    sites = {
        name: site
        for tr in traces
        for name, site in tr.nodes.items()
        if site["type"] == "sample" and name != "sequences"
    }
    for t in range(x.shape[1]):
        real = mask[:, t]
        for name, ref in ((f"z_{t + 1}", full_g), (f"x_{t + 1}", full_m)):
            got, want = sites[name]["value"][real], ref.nodes[name]["value"][real]
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), name
    log_joint = sum(tr.log_prob_sum() for tr in traces[1::2])
    assert torch.allclose(log_joint, full_m.log_prob_sum())


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
@pytest.mark.parametrize("elbo", [Trace_ELBO, TraceMeanField_ELBO])
def test_trains_with_stock_elbos(arch, elbo):
    """A short SVI run raises a 20-sample ELBO estimate on a fixed tiny data set."""
    torch.manual_seed(0)
    m = TINY[arch]()
    x, mask = binary_batch(B=8, lengths=(7, 6, 5, 7, 3, 4, 7, 2))
    svi = SVI(m.model, m.guide, Adam({"lr": 0.02}), loss=elbo())

    def estimate():
        pyro.set_rng_seed(11)
        return -Trace_ELBO(num_particles=20).loss(m.model, m.guide, x, mask)

    before = estimate()
    for _ in range(40):
        loss = svi.step(x, mask)
        assert torch.isfinite(torch.tensor(loss))
    assert estimate() > before + 5.0  # about 1 nat per sequence: far above MC noise (~0.5)


def test_subsampling_scales_the_batch():
    m = TINY["dmm"]()
    x, mask = binary_batch()
    pyro.set_rng_seed(1)
    small = Trace_ELBO().loss(m.model, m.guide, x, mask)
    pyro.set_rng_seed(1)
    scaled = Trace_ELBO().loss(m.model, m.guide, x, mask, num_sequences=30)
    assert scaled == pytest.approx(10 * small, rel=1e-5)


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
def test_generate_shapes_and_support(arch):
    m = TINY[arch]()
    x, logits = m.generate(4, 9)
    assert x.shape == (4, 9, 6) and logits.shape == (4, 9, 6)
    assert set(x.unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.zeros(3, 6), "3 dimensions \\(batch, T, D\\)"),
        (torch.zeros(2, 0, 6), "T = 0: no time steps"),
        (torch.full((2, 3, 6), float("nan")), "NaN"),
        (torch.zeros(2, 3, 5), "expects 6"),
    ],
)
def test_bad_inputs_are_named(bad, message):
    m = TINY["dmm"]()
    with pytest.raises(ValueError, match=message):
        m.model(bad)


def test_bad_masks_are_named():
    x = torch.zeros(2, 3, 6)
    with pytest.raises(ValueError, match="prefix"):
        check_sequences(x, torch.tensor([[1, 0, 1], [1, 1, 1]]).bool())
    with pytest.raises(ValueError, match="empty sequence"):
        check_sequences(x, torch.tensor([[0, 0, 0], [1, 1, 1]]).bool())
    with pytest.raises(ValueError, match="does not match x's"):
        check_sequences(x, torch.ones(2, 4).bool())


def test_non_binary_data_refused_by_bernoulli_models():
    m = TINY["srnn"]()
    with pytest.raises(ValueError, match="binary"):
        m.model(torch.full((2, 3, 6), 0.5))


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
def test_time_parallel_scoring_equals_step_by_step(arch, monkeypatch):
    """Under a replay the model scores all steps at once; sites and log-densities are unchanged."""
    import pyro_seq.models.base as base

    m = TINY[arch]()
    x, mask = binary_batch()
    g = poutine.trace(m.guide).get_trace(x, mask)
    modes = []
    real = base.replayed_latents
    monkeypatch.setattr(base, "replayed_latents", lambda *a: modes.append(real(*a)) or modes[-1])
    parallel = poutine.trace(poutine.replay(m.model, trace=g)).get_trace(x, mask)
    zs = {name: site["value"] for name, site in g.nodes.items() if name.startswith("z_")}
    sequential = poutine.trace(poutine.condition(m.model, data=zs)).get_trace(x, mask)
    assert modes[0] is not None and modes[1] is None  # replay: parallel; condition: loop
    parallel.compute_log_prob()
    sequential.compute_log_prob()
    names = [n for n in sequential.nodes if n.startswith(("z_", "x_"))]
    assert [n for n in parallel.nodes if n.startswith(("z_", "x_"))] == names
    for name in names:
        assert torch.allclose(
            parallel.nodes[name]["log_prob"], sequential.nodes[name]["log_prob"], atol=1e-5
        ), name


def test_dmm_backward_rnn_starts_from_a_learned_state_srnn_from_zeros():
    # DMM docstring: a_{T+1} is a parameter (Pyro's example); SRNN eq. 5.7: a_{T+1} = 0.
    dmm, srnn = TINY["dmm"](), TINY["srnn"]()
    assert isinstance(dmm.encoder.h0, torch.nn.Parameter)
    assert "h0" in dict(srnn.encoder.named_buffers()) and not srnn.encoder.h0.any()
    x, mask = binary_batch()
    zs = {f"z_{t + 1}": torch.zeros(3, 3) for t in range(7)}
    before = guide_params(dmm, x, mask, zs)["z_7"][0]
    with torch.no_grad():
        dmm.encoder.h0.add_(1.0)
    after = guide_params(dmm, x, mask, zs)["z_7"][0]
    assert not torch.allclose(before[0], after[0])  # full-length row: q(z_T) reads a_{T+1}
