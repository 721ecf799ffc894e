"""Dropout on the DMM's recognition states ``a_{1:T}`` (Krishnan et al. 2017: dropout 0.1 after
the inference network's RNN output layer on JSB Chorales).

``dropout=p`` acts in training mode only, on the states that feed the combiner, one mask per
guide pass for the step loop and the combiner scan alike: each element zeroed with probability
``p``, the rest scaled by ``1 / (1 - p)``. In eval mode, and for ``p = 0``, the DMM is the DMM
built without the option (same parameter names), log-density for log-density, for every
inference network (smoothing, filtering, Res_q, known inputs) and on both guide paths.
"""

import json
import math

import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO

import pyro_seq.models.dmm as dmm_module
from pyro_seq.cli import main
from pyro_seq.cli_runs import build_model, parse_options
from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models import DMM
from pyro_seq.models.base import SequenceModel
from tests.models.reference import randomize

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py

D, Z, RNN, U, T = 5, 3, 4, 2, 6
SIZES = {"z_dim": Z, "transition_dim": 6, "emission_dim": 5, "rnn_dim": RNN}
VARIANTS = {
    "smoothing": {},
    "smoothing_gru": {"rnn_cell": "gru"},
    "filtering": {"inference": "filtering"},
    "residual": {"residual": True},
    "filtering_residual": {"inference": "filtering", "residual": True},
    "inputs": {"input_dim": U},
    "inputs_filtering_residual": {"input_dim": U, "inference": "filtering", "residual": True},
}


def build(variant, **options):
    return DMM(D, **SIZES, **VARIANTS[variant], **options)


def batch(variant, B=4, lengths=(6, 2, 4, 1), seed=0):
    """``(x, mask, kwargs)``: binary data, a ragged mask and the known inputs if any."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(B, T, D, generator=g) < 0.4).double()
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    kw = {"inputs": torch.randn(B, T, U, generator=g)} if "input_dim" in VARIANTS[variant] else {}
    return x * mask.unsqueeze(-1), mask, kw


def twins(variant, p=0.5, seed=1):
    """A DMM without the option (random weights) and DMMs with ``dropout=0`` and ``p`` that
    load its checkpoint strictly (same parameter names)."""
    torch.manual_seed(seed)
    ref = build(variant)
    randomize(ref)
    off, on = build(variant, dropout=0.0), build(variant, dropout=p)
    for m in (off, on):
        m.load_state_dict(ref.state_dict(), strict=True)
    return ref, off, on


def guide_path(path, monkeypatch):
    """Select the guide's path: ``"scan"`` (the combiner scan under plain handlers, the
    default) or ``"loop"`` (the step loop); return the list of scans that drew the sites."""
    calls = []
    scan = DMM.guide_scan

    def counted(self, state, x, mask, particles=()):
        done = scan(self, state, x, mask, particles=particles)
        calls.append(done)
        return done

    monkeypatch.setattr(DMM, "guide_scan", counted if path == "scan" else SequenceModel.guide_scan)
    return calls


def sampled(m, x, mask, kw, seed):
    """The guide's trace for ``seed`` on the selected path, and ``(log p(x, z), log q(z | x))``
    with the model replayed against it."""
    torch.manual_seed(seed)
    guide_tr = poutine.trace(m.guide).get_trace(x, mask, **kw)
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask, **kw)
    return guide_tr, (model_tr.log_prob_sum().item(), guide_tr.log_prob_sum().item())


def replayed(m, x, mask, kw, guide_tr):
    """``(log p(x, z), log q(z | x))`` of ``m`` at the latent values of ``guide_tr``."""
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask, **kw)
    guide_tr = poutine.trace(poutine.replay(m.guide, trace=guide_tr)).get_trace(x, mask, **kw)
    return model_tr.log_prob_sum().item(), guide_tr.log_prob_sum().item()


def latents(tr):
    return torch.stack([tr.nodes[f"z_{t + 1}"]["value"] for t in range(T)], -2)


# ----------------------------------------------------------------- p = 0 and eval mode
@pytest.mark.parametrize("path", ["scan", "loop"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_no_dropout_and_eval_mode_are_the_dmm_without_the_option(variant, path, monkeypatch):
    x, mask, kw = batch(variant)
    ref, off, on = twins(variant)
    calls = guide_path(path, monkeypatch)
    ref_tr, expected = sampled(ref.eval(), x, mask, kw, seed=3)
    # the scan draws the sites unless Res_q (which keeps the step loop)
    options = VARIANTS[variant]
    scanned = not (options.get("residual") and options.get("input_dim"))  # Res_q with inputs
    assert calls == ([scanned] if path == "scan" else [])
    expected_replayed = replayed(ref, x, mask, kw, ref_tr)
    for m in (on.eval(), off.eval(), off.train()):
        tr, densities = sampled(m, x, mask, kw, seed=3)
        assert torch.equal(latents(tr), latents(ref_tr))
        assert densities == expected
        assert replayed(m, x, mask, kw, ref_tr) == expected_replayed

    # p = 0 in training mode draws not one random number
    torch.manual_seed(5)
    replayed(ref.train(), x, mask, kw, ref_tr)
    after_ref = torch.rand(3)
    torch.manual_seed(5)
    replayed(off, x, mask, kw, ref_tr)
    assert torch.equal(torch.rand(3), after_ref)

    # p = 0.5 in training mode: another guide density at the same latent values, the same model
    model_lp, guide_lp = replayed(on.train(), x, mask, kw, ref_tr)
    assert guide_lp != expected_replayed[1]
    assert model_lp == expected_replayed[0]  # the generative model has no dropout


@pytest.mark.parametrize("objective", ["iwae", "fivo", "trace_elbo_particles"])
@pytest.mark.parametrize("variant", ["smoothing", "residual", "inputs"])
def test_particle_objectives_in_eval_mode_are_the_dmm_without_the_option(variant, objective):
    """IWAE and the vectorised Trace_ELBO (the scan with particles in front, or Res_q's step
    loop under the particle plate) and FIVO (init/step) score the dropout-free DMM in eval
    mode, and another objective in training mode."""
    x, mask, kw = batch(variant)
    ref, _, on = twins(variant)

    def loss(m, seed):
        torch.manual_seed(seed)
        est = {
            "iwae": lambda: IWAE(num_particles=3),
            "fivo": lambda: FIVO(num_particles=2),
            "trace_elbo_particles": lambda: Trace_ELBO(
                num_particles=3, vectorize_particles=True, max_plate_nesting=1
            ),
        }[objective]()
        return est.loss(m.model, m.guide, x, mask, **kw)

    assert loss(on.eval(), 8) == loss(ref.eval(), 8)
    training = loss(on.train(), 8)
    assert math.isfinite(training) and training != loss(ref.train(), 8)


# ----------------------------------------------------------------- what dropout does
def check_dropped(u, v, p):
    """Each element of ``u`` (draws of dropout of ``v``, stacked at dim 0) is 0 or
    ``v / (1 - p)``; where ``v != 0`` (a ReLU RNN has exact zeros) the zero rate is within 5
    standard errors of ``p`` and the mean of ``u / v`` within 5 standard errors of 1."""
    keep = u != 0
    assert torch.allclose(u[keep], v[keep] / (1 - p), rtol=1e-12, atol=0)
    on = v != 0
    n = int(on.sum())
    assert n > 1000
    rate = 1.0 - float(keep[on].double().mean())
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n), (rate, p, n)
    ratio = float((u[on] / v[on]).mean())  # each term 0 or 1/(1-p): mean 1, variance p/(1-p)
    assert abs(ratio - 1.0) < 5 * math.sqrt(p / (1 - p) / n), ratio


def recorded_states(m, path, monkeypatch):
    """Hooks: the encoder's outputs ``(batch, T, rnn_dim)`` per pass, and the states entering
    the combiner per pass (the scans' ``a`` argument, or the step loop's ``a_t`` stacked)."""
    encoded, entering, steps = [], [], []
    m.encoder.register_forward_hook(lambda mod, i, o: encoded.append(o.detach().clone()))
    if path == "scan":
        scan, residual_scan = dmm_module.combiner_scan, dmm_module.residual_combiner_scan

        def recording(z0, a, *rest):
            entering.append(a.detach().clone())
            return scan(z0, a, *rest)

        def residual_recording(z0, zp0, a, *rest):
            entering.append(a.detach().clone())
            return residual_scan(z0, zp0, a, *rest)

        monkeypatch.setattr(dmm_module, "combiner_scan", recording)
        monkeypatch.setattr(dmm_module, "residual_combiner_scan", residual_recording)
    else:
        m.combiner.register_forward_pre_hook(lambda mod, args: steps.append(args[1].detach()))

    def passes():
        if path == "loop":
            assert len(steps) % T == 0
            entering.extend(torch.stack(steps[i : i + T], -2) for i in range(0, len(steps), T))
        return torch.stack(encoded), torch.stack(entering)

    return passes


@pytest.mark.parametrize(
    "variant, path",
    [
        ("smoothing", "scan"),
        ("smoothing", "loop"),
        ("smoothing_gru", "scan"),
        ("filtering", "scan"),
        ("filtering", "loop"),
        ("residual", "loop"),
        ("residual", "scan"),
        ("inputs", "scan"),
    ],
)
def test_training_mode_drops_the_states_entering_the_combiner(variant, path, monkeypatch):
    p, draws = 0.3, 40
    x, mask, kw = batch(variant, B=8, lengths=(6, 2, 4, 1, 6, 5, 3, 6))
    _, _, m = twins(variant, p=p)
    calls = guide_path(path, monkeypatch)
    passes = recorded_states(m, path, monkeypatch)
    m.train()
    for _ in range(draws):
        guide_tr = poutine.trace(m.guide).get_trace(x, mask, **kw)
        poutine.trace(poutine.replay(m.model, trace=guide_tr)).get_trace(x, mask, **kw)
    assert calls == ([True] * draws if path == "scan" else [])
    encoded, entering = passes()
    assert encoded.shape == entering.shape == (draws, 8, T, RNN)  # the model runs no encoder
    check_dropped(entering, encoded, p)
    # the draws are independent masks, not one mask reused
    assert not torch.equal(entering[0] == 0, entering[1] == 0)


@pytest.mark.parametrize("variant", ["smoothing", "filtering", "inputs"])
def test_scan_and_step_loop_apply_the_same_mask(variant, monkeypatch):
    """In training mode the mask is drawn before the noise, once per pass: for the same seed
    the scan and the step loop draw the same latent values on the real steps (the scan does not
    compute the padding) with the same guide density."""
    x, mask, kw = batch(variant)
    _, _, m = twins(variant, p=0.5)
    eval_tr, _ = sampled(m.eval(), x, mask, kw, seed=4)
    m.train()
    runs = []
    for path in ("scan", "loop"):
        with monkeypatch.context() as patch:
            calls = guide_path(path, patch)
            runs.append(sampled(m, x, mask, kw, seed=4))
            assert calls == ([True] if path == "scan" else [])
    (scan_tr, (scan_p, scan_q)), (loop_tr, (loop_p, loop_q)) = runs
    real = mask.unsqueeze(-1).expand(latents(loop_tr).shape)
    assert torch.allclose(latents(scan_tr)[real], latents(loop_tr)[real], rtol=1e-12, atol=1e-12)
    assert abs(scan_q - loop_q) <= 1e-10 * abs(loop_q)
    assert abs(scan_p - loop_p) <= 1e-10 * abs(loop_p)
    assert not torch.allclose(latents(scan_tr), latents(eval_tr))  # dropout acted


# ----------------------------------------------------------------- the option
@pytest.mark.parametrize("bad", [-0.1, 1, 1.0, 1.5, float("nan"), float("inf")])
def test_dropout_outside_unit_interval_is_refused(bad):
    with pytest.raises(ValueError, match=rf"dropout={bad!r}") as info:
        build("smoothing", dropout=bad)
    assert "0 <= dropout < 1" in str(info.value)


@pytest.mark.parametrize("bad", ["0.3", True, None])
def test_dropout_of_wrong_type_is_refused(bad):
    with pytest.raises(TypeError, match="dropout must be a number"):
        build("smoothing", dropout=bad)


def test_option_round_trips_through_for_data_and_the_command_line_options():
    names = list(build("smoothing").state_dict())
    for m in (
        DMM.for_data(D, dropout=0.1, **SIZES),
        build_model("dmm", D, {**SIZES, **parse_options(["dropout=0.1"])}),
    ):
        assert m.dropout == 0.1 and m.rnn_dropout.p == 0.1
        assert list(m.state_dict()) == names  # no new parameters
    assert build_model("dmm", D, {**SIZES, "dropout": 0}).dropout == 0.0  # json's 0 is an int
    with pytest.raises(SystemExit, match=r"bad model option for .*dropout=1"):
        build_model("dmm", D, {**SIZES, **parse_options(["dropout=1"])})


def test_train_and_evaluate_dmm_with_dropout_from_the_command_line(tiny_pickle, tmp_path):
    out = tmp_path / "dmm"
    args = ["train", "--model", "dmm", "--data", str(tiny_pickle), "--epochs", "1", "--quiet"]
    args += ["--batch-size", "4", "--out", str(out), "--z-dim", "2"]
    for option in ("rnn_dim=6", "transition_dim=6", "emission_dim=6", "dropout=0.1"):
        args += ["--model-option", option]
    assert main(args) == 0
    assert json.loads((out / "config.json").read_text())["model_options"]["dropout"] == 0.1
    assert main(["evaluate", str(out), "--objective", "iwae", "--particles", "2"]) == 0
