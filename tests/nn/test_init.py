"""Initialisation: the SRNN authors' scheme and the Bernoulli output bias from note frequencies."""

import math

import pytest
import torch
import torch.nn as nn

from pyro_seq.models import DMM, SRNN
from pyro_seq.models import base as base_module  # the contract's initialise calls these
from pyro_seq.nn import bernoulli_output_layer, init_output_bias, init_weights
from pyro_seq.train import TrainConfig, fit


def _assert_orthonormal_rows_or_columns(w, what):
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    assert torch.allclose(gram, torch.eye(gram.shape[0], dtype=w.dtype), atol=1e-6, rtol=0), what


def _assert_std(w, std, what):
    """Sample mean and standard deviation of ``w`` within 3 standard errors of ``0`` and
    ``std`` (SE of the sample std of n normal draws: std / sqrt(2 n))."""
    n = w.numel()
    assert abs(w.mean().item()) < 3 * std / math.sqrt(n), what
    assert abs(w.std().item() - std) < 3 * std / math.sqrt(2 * n), what


@pytest.mark.parametrize("scheme", ["srnn", "normal"])
def test_every_gru_gate_has_orthogonal_recurrent_weights_and_zero_biases(float64, scheme):
    torch.manual_seed(0)
    gru = nn.GRU(30, 20, batch_first=True)
    init_weights(gru, scheme)
    H = 20
    for gate, w in enumerate(gru.weight_hh_l0.detach().chunk(3, 0)):
        assert w.shape == (H, H)
        assert torch.allclose(w @ w.T, torch.eye(H), atol=1e-6, rtol=0), gate
    # the three gates are drawn independently, not one matrix repeated
    blocks = gru.weight_hh_l0.detach().chunk(3, 0)
    assert not torch.allclose(blocks[0], blocks[1])
    ih = gru.weight_ih_l0.detach()
    if scheme == "srnn":  # the SRNN code: orthogonal input-to-hidden gates too (20 x 30)
        for gate, w in enumerate(ih.chunk(3, 0)):
            _assert_orthonormal_rows_or_columns(w, gate)
    else:
        _assert_std(ih, 0.05, "weight_ih")
    for name in ("bias_ih_l0", "bias_hh_l0"):
        assert torch.count_nonzero(getattr(gru, name)) == 0, name


def test_linear_weights_are_glorot_normal_under_srnn_and_normal_005_under_normal():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(400, 500), nn.ReLU(), nn.Linear(500, 88))
    init_weights(mlp, "srnn")
    _assert_std(mlp[0].weight.detach(), math.sqrt(2.0 / 900), "400->500")
    _assert_std(mlp[2].weight.detach(), math.sqrt(2.0 / 588), "500->88")
    init_weights(mlp, "normal")
    for i in (0, 2):
        _assert_std(mlp[i].weight.detach(), 0.05, i)
        assert torch.count_nonzero(mlp[i].bias) == 0
    init_weights(mlp, "normal", std=0.2)
    _assert_std(mlp[0].weight.detach(), 0.2, "std=0.2")
    with pytest.raises(ValueError, match="unknown init scheme 'xavier'"):
        init_weights(mlp, "xavier")


def test_srnn_scheme_reaches_every_layer_of_an_srnn():
    torch.manual_seed(0)
    model = init_weights(SRNN(88, d_dim=40, z_dim=10, hidden_dim=50), "srnn")
    for gru in (model.deterministic.rnn, model.encoder.rnn):
        for w in gru.weight_hh_l0.detach().chunk(3, 0):
            assert torch.allclose(w @ w.T, torch.eye(40), atol=1e-5, rtol=0)  # float32
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 8  # prior/posterior first layers and heads (2 x 3), emission MLP (2)
    for m in linears:
        assert torch.count_nonzero(m.bias) == 0
        fan_out, fan_in = m.weight.shape
        std = math.sqrt(2.0 / (fan_in + fan_out))
        assert abs(m.weight.std().item() - std) < 4 * std / math.sqrt(2 * m.weight.numel())


def test_output_bias_is_the_logit_of_the_note_frequencies():
    model = SRNN(4, d_dim=8, z_dim=2, hidden_dim=8)
    on = torch.tensor([[1.0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]])  # 3 steps
    more = torch.tensor([[0.0, 0, 1, 1]])  # 1 step
    bias = init_output_bias(model, [on, more])
    # frequencies 1/4, 0 (clamped to 1e-3), 3/4, 1 (clamped to 1 - 1e-3)
    expected = torch.tensor(
        [math.log(1 / 3), math.log(1e-3 / 0.999), math.log(3.0), math.log(0.999 / 1e-3)]
    )
    assert torch.allclose(bias, expected, atol=1e-6, rtol=0)
    assert bernoulli_output_layer(model) is model.emitter[-1]
    assert torch.equal(model.emitter[-1].bias.detach(), bias)
    # a model without a Bernoulli emission is refused
    gaussian = DMM(4, z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4, likelihood="gaussian")
    assert bernoulli_output_layer(gaussian) is None
    with pytest.raises(ValueError, match="Bernoulli emission"):
        init_output_bias(gaussian, [on])


def _toy(n, seed=0, D=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=g)
    return [(torch.rand(int(L), D, generator=g) < 0.3).float() for L in lengths]


def test_fit_initialises_a_fresh_start_and_never_a_resumed_run(tmp_path, monkeypatch):
    calls = []
    real_weights, real_bias = base_module.init_weights, base_module.init_output_bias
    monkeypatch.setattr(
        base_module,
        "init_weights",
        lambda *a, **k: calls.append("weights") or real_weights(*a, **k),
    )
    monkeypatch.setattr(
        base_module, "init_output_bias", lambda *a, **k: calls.append("bias") or real_bias(*a, **k)
    )
    train, valid = _toy(8), _toy(3, seed=1)
    torch.manual_seed(0)
    model = SRNN(6, d_dim=8, z_dim=3, hidden_dim=8)
    fit(model, train, valid, TrainConfig(epochs=0, init="srnn", progress=False), tmp_path / "zero")
    assert calls == ["weights", "bias"]
    freq = torch.cat(train).mean(0).clamp(1e-3, 1 - 1e-3)
    assert torch.allclose(model.emitter[-1].bias.detach(), torch.logit(freq), atol=1e-5)
    for w in model.deterministic.rnn.weight_hh_l0.detach().chunk(3, 0):
        assert torch.allclose(w @ w.T, torch.eye(8), atol=1e-5, rtol=0)

    calls.clear()
    cfg = dict(batch_size=4, init="srnn", progress=False)
    fit(
        SRNN(6, d_dim=8, z_dim=3, hidden_dim=8),
        train,
        valid,
        TrainConfig(epochs=1, **cfg),
        tmp_path / "run",
    )
    assert calls == ["weights", "bias"]
    fit(
        SRNN(6, d_dim=8, z_dim=3, hidden_dim=8),
        train,
        valid,
        TrainConfig(epochs=2, **cfg),
        tmp_path / "run",
    )
    assert calls == ["weights", "bias"]  # resumed: not initialised again
    fit(
        SRNN(6, d_dim=8, z_dim=3, hidden_dim=8),
        train,
        valid,
        TrainConfig(epochs=1, **cfg),
        tmp_path / "run",
        resume=False,
    )  # a restart is a fresh start
    assert calls == ["weights", "bias"] * 2


def test_init_none_keeps_the_constructed_model_and_dmm_keeps_its_weights(tmp_path):
    train = _toy(8)
    torch.manual_seed(0)
    model = SRNN(6, d_dim=8, z_dim=3, hidden_dim=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fit(model, train, [], TrainConfig(epochs=0, init="none", progress=False), tmp_path / "a")
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # the DMM's gated transition starts at the identity: only its output bias is set
    torch.manual_seed(0)
    dmm = DMM(6, z_dim=3, transition_dim=4, emission_dim=4, rnn_dim=4)
    before = {k: v.clone() for k, v in dmm.state_dict().items()}
    fit(dmm, train, [], TrainConfig(epochs=0, progress=False), tmp_path / "b")
    changed = {k for k, v in dmm.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"emitter.4.bias"}  # Linear, act, Linear, act, Linear


def test_init_bias_sets_only_the_output_bias(tmp_path):
    train = _toy(8)
    torch.manual_seed(0)
    model = SRNN(6, d_dim=8, z_dim=3, hidden_dim=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fit(model, train, [], TrainConfig(epochs=0, init="bias", progress=False), tmp_path)
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    bias_name = next(n for n, p in model.named_parameters() if p is model.emitter[-1].bias)
    assert changed == {bias_name}
    freq = torch.cat(train).mean(0).clamp(1e-3, 1 - 1e-3)
    assert torch.allclose(model.emitter[-1].bias.detach(), torch.logit(freq), atol=1e-5)
