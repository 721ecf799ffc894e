"""Standard dropout in STORN, VOSP and VRAE, the stand-in for the fast dropout of Bayer &
Osendorfer (2014) (sec. 2 and supplementary; fast dropout after Wang & Manning 2013).

``dropout=p`` acts in training mode only: on the observations fed to the recurrent networks
(recognition RNNs; STORN's generating RNN reads ``x_{t-1}``) and on the emission MLP's hidden
layer, zeroing each element with probability ``p`` and scaling the rest by ``1 / (1 - p)``. In
eval mode, and for ``p = 0``, the model is the model built without the option, log-density for
log-density, on both the step loop and the time-parallel path.
"""

import json
import math

import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.cli import main
from pyro_seq.cli_runs import build_model, parse_options
from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models import STORN, VOSP, VRAE
from tests.models.reference import ragged_batch as reference_batch

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py

D, Z, EMISSION = 5, 3, 7
SIZES = {
    "storn": (STORN, {"z_dim": Z, "rnn_dim": 6, "emission_dim": EMISSION}),
    "vosp": (VOSP, {"z_dim": Z, "rnn_dim": 6, "emission_dim": EMISSION, "prior": "white"}),
    "vrae": (VRAE, {"z_dim": Z, "encoder_dim": 4, "decoder_dim": 6, "emission_dim": EMISSION}),
}


def build(name, likelihood="bernoulli", **options):
    cls, sizes = SIZES[name]
    return cls(D, likelihood=likelihood, **sizes, **options)


def ragged_batch(likelihood, B=4, T=6, lengths=(6, 2, 4, 1), seed=0):
    """Gaussian data have no zero entries (so a zero seen by a network is dropout's)."""
    return reference_batch(likelihood, B, T, D, lengths, seed)


def log_densities(m, x, mask, guide_trace):
    """``(log p(x, z), log q(z | x))`` of ``m`` at the latent values of ``guide_trace``."""
    model_tr = poutine.trace(poutine.replay(m.model, trace=guide_trace)).get_trace(x, mask)
    guide_tr = poutine.trace(poutine.replay(m.guide, trace=guide_trace)).get_trace(x, mask)
    return model_tr.log_prob_sum().item(), guide_tr.log_prob_sum().item()


# ----------------------------------------------------------------- p = 0 and eval mode
@pytest.mark.parametrize("time_parallel", [True, False])
@pytest.mark.parametrize("likelihood", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("name", sorted(SIZES))
def test_no_dropout_and_eval_mode_are_the_model_without_the_option(name, likelihood, time_parallel):
    x, mask = ragged_batch(likelihood)
    torch.manual_seed(1)
    ref = build(name, likelihood)  # the constructor without the option
    off, on = build(name, likelihood, dropout=0.0), build(name, likelihood, dropout=0.5)
    for m in (off, on):  # same parameter names: the checkpoint of one loads into the other
        m.load_state_dict(ref.state_dict(), strict=True)
    for m in (ref, off, on):
        m.time_parallel = time_parallel
    guide_trace = poutine.trace(ref.guide).get_trace(x, mask)

    expected = log_densities(ref.eval(), x, mask, guide_trace)
    assert log_densities(on.eval(), x, mask, guide_trace) == expected
    assert log_densities(off.eval(), x, mask, guide_trace) == expected

    # p = 0 in training mode: the same densities and not one random number drawn
    torch.manual_seed(5)
    expected = log_densities(ref.train(), x, mask, guide_trace)
    after_ref = torch.rand(3)
    torch.manual_seed(5)
    assert log_densities(off.train(), x, mask, guide_trace) == expected
    assert torch.equal(torch.rand(3), after_ref)
    # p = 0.5 in training mode: other densities at the same latent values
    model_lp, guide_lp = log_densities(on.train(), x, mask, guide_trace)
    assert model_lp != expected[0] and guide_lp != expected[1]


@pytest.mark.parametrize("name", sorted(SIZES))
def test_elbo_and_samples_in_training_mode_differ_from_eval_mode(name):
    x, mask = ragged_batch("gaussian")
    torch.manual_seed(2)
    ref = build(name, "gaussian")
    m = build(name, "gaussian", dropout=0.5)
    m.load_state_dict(ref.state_dict())

    def loss(model, seed):
        torch.manual_seed(seed)
        return Trace_ELBO().loss(model.model, model.guide, x, mask)

    def sample(model, seed):
        torch.manual_seed(seed)
        return model.generate(3, 4)[0]

    ref.eval()
    m.eval()
    assert loss(m, 7) == loss(ref, 7)
    assert torch.equal(sample(m, 7), sample(ref, 7))
    ref.train()  # without dropout the training mode is the eval-mode model
    assert loss(ref, 7) == loss(m, 7)
    m.train()
    assert loss(m, 7) != loss(ref, 7)
    assert not torch.equal(sample(m, 7), sample(ref, 7))


@pytest.mark.parametrize("objective", ["iwae", "fivo"])
@pytest.mark.parametrize("name", sorted(SIZES))
def test_particle_objectives_in_eval_mode_are_the_model_without_the_option(name, objective):
    """IWAE (the guide's vectorised particle scan) and FIVO (init/step, resampling) score the
    dropout-free model in eval mode, and another objective in training mode."""
    x, mask = ragged_batch("bernoulli")
    torch.manual_seed(4)
    ref = build(name)
    m = build(name, dropout=0.5)
    m.load_state_dict(ref.state_dict())

    def loss(model, seed):
        torch.manual_seed(seed)
        est = IWAE(num_particles=3) if objective == "iwae" else FIVO(num_particles=2)
        return est.loss(model.model, model.guide, x, mask)

    assert loss(m.eval(), 8) == loss(ref.eval(), 8)
    training = loss(m.train(), 8)
    assert math.isfinite(training) and training != loss(ref.train(), 8)


# ----------------------------------------------------------------- what dropout does
class Recorder:
    """Records the inputs ``u`` of a :class:`~pyro_seq.models.storn.StepRNN` (``sequence``:
    ``(batch, T, I)``; ``step``: ``(batch, I)`` per step, stacked at dim 1 per pass of ``T``
    steps)."""

    def __init__(self, rnn, T=6):
        self.calls, self.steps, self.T = [], [], T
        sequence, step = rnn.sequence, rnn.step

        def record_sequence(u, h0, lengths=None):
            self.calls.append(u.detach().clone())
            return sequence(u, h0, lengths)

        def record_step(u, h):
            self.steps.append(u.detach().clone())
            return step(u, h)

        rnn.sequence, rnn.step = record_sequence, record_step

    def passes(self):
        """Every pass's inputs ``(batch, T, I)``; the steps of a pass are stacked."""
        assert len(self.steps) % self.T == 0
        for i in range(0, len(self.steps), self.T):
            self.calls.append(torch.stack(self.steps[i : i + self.T], 1))
        self.steps = []
        return self.calls


def check_dropped(u, v, real, p):
    """``u`` (many draws of dropout of ``v`` (..., T, I), stacked at dim 0) is 0 or
    ``v / (1 - p)`` element-wise, zero at a rate within 5 standard deviations of ``p`` over the
    real steps (``v`` has no zeros there), and its mean over the draws is ``v`` within 5
    standard deviations (aggregated over the elements)."""
    v = v.expand_as(u)
    keep = u != 0
    assert torch.allclose(u[keep], v[keep] / (1 - p), rtol=1e-12, atol=0)
    on = real.expand_as(u)
    assert bool((v[on] != 0).all())
    n = int(on.sum())
    rate = 1.0 - float(keep[on].double().mean())
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n), (rate, p, n)
    ratio = (u[on] / v[on]).mean()  # each term 0 or 1/(1-p): mean 1, variance p/(1-p)
    assert abs(float(ratio) - 1.0) < 5 * math.sqrt(p / (1 - p) / n), float(ratio)


@pytest.mark.parametrize("time_parallel", [True, False])
@pytest.mark.parametrize("name", sorted(SIZES))
def test_training_mode_drops_rnn_inputs_and_emission_hidden_layer(name, time_parallel):
    p, draws = 0.5, 40
    x, mask = ragged_batch("gaussian", B=8, T=6, lengths=(6, 2, 4, 1, 6, 5, 3, 6))
    torch.manual_seed(3)
    m = build(name, "gaussian", dropout=p)
    m.time_parallel = time_parallel
    m.train()
    encoders = {
        "storn": ["encoder"],
        "vosp": ["encoder"],
        "vrae": ["forward_encoder", "backward_encoder"],
    }[name]
    recorders = {e: Recorder(getattr(m, e)) for e in encoders}
    if name == "storn":
        recorders["decoder"] = Recorder(m.decoder)
    hidden = []
    m.emitter.dropout.register_forward_hook(
        lambda mod, i, o: hidden.append((i[0].detach(), o.detach()))
    )
    observed = []
    for _ in range(draws):
        guide_trace = poutine.trace(m.guide).get_trace(x, mask)
        model_trace = poutine.trace(poutine.replay(m.model, trace=guide_trace)).get_trace(x, mask)
        observed.append(
            torch.stack([model_trace.nodes[f"x_{t + 1}"]["value"] for t in range(6)], 1)
        )
    real = mask.unsqueeze(-1)
    # the likelihood scores the data themselves
    assert all(torch.equal(o, x) for o in observed)
    lengths, t = mask.sum(-1, keepdim=True), torch.arange(6)
    reverse = torch.where(t < lengths, lengths - 1 - t, t).unsqueeze(-1).expand(-1, -1, D)
    seen = {}
    for e in encoders:
        u = torch.stack(recorders[e].passes())
        # VOSP's model computes its own h_{1:T} (its own mask) in every path: two passes
        assert u.shape[0] == draws * (2 if name == "vosp" else 1)
        if e == "backward_encoder":  # each sequence reversed within its length: undo it
            u = torch.gather(u, 2, reverse.expand(u.shape))
        check_dropped(u, x, real, p)
        seen[e] = u
    if name == "vrae":  # one mask per encoder: both kept at about (1 - p)^2 of the real entries
        both = ((seen["forward_encoder"] != 0) & (seen["backward_encoder"] != 0))[
            real.expand(draws, -1, -1, D)
        ]
        n = both.numel()
        q = (1 - p) ** 2
        assert abs(float(both.double().mean()) - q) < 5 * math.sqrt(q * (1 - q) / n)
    if name == "storn":  # [x_{t-1}, z_t]: x_{t-1} dropped, z_t untouched (no zero entries)
        u = torch.stack(recorders["decoder"].passes())
        assert u.shape[0] == draws
        previous = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
        first_real = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, 1:]], 1)
        check_dropped(u[..., :D], previous, first_real.unsqueeze(-1), p)
        assert bool((u[..., D:][mask.expand(draws, -1, -1)] != 0).all())
    # the emission's hidden layer: EMISSION tanh units, dropped
    inputs = torch.cat([i.reshape(-1, EMISSION) for i, _ in hidden])
    outputs = torch.cat([o.reshape(-1, EMISSION) for _, o in hidden])
    assert bool((inputs.abs() < 1).all()) and bool((inputs != 0).all())
    check_dropped(outputs, inputs, torch.ones(1, 1, dtype=torch.bool), p)


def test_vosp_shares_the_guides_states_in_eval_mode_only():
    """With dropout active VOSP's model runs the recognition RNN itself (its own mask); in eval
    mode the time-parallel model takes the guide's ``h_{1:T}`` (one run per ELBO)."""
    x, mask = ragged_batch("bernoulli")
    m = build("vosp", dropout=0.3)
    rec = Recorder(m.encoder)
    Trace_ELBO().differentiable_loss(m.model, m.guide, x, mask)
    assert len(rec.passes()) == 2
    m.eval()
    rec.calls = []
    Trace_ELBO().differentiable_loss(m.model, m.guide, x, mask)
    assert len(rec.passes()) == 1


# ----------------------------------------------------------------- the option
@pytest.mark.parametrize("name", sorted(SIZES))
@pytest.mark.parametrize("bad", [-0.1, 1, 1.0, 1.5, float("nan"), float("inf")])
def test_dropout_outside_unit_interval_is_refused(name, bad):
    with pytest.raises(ValueError, match=rf"dropout={bad!r}") as info:
        build(name, dropout=bad)
    assert "0 <= dropout < 1" in str(info.value)


@pytest.mark.parametrize("bad", ["0.3", True, None])
def test_dropout_of_wrong_type_is_refused(bad):
    with pytest.raises(TypeError, match="dropout must be a number"):
        build("storn", dropout=bad)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_option_round_trips_through_for_data_and_the_command_line_options(name):
    cls, sizes = SIZES[name]
    for m in (
        cls.for_data(D, dropout=0.3, **sizes),
        build_model(name, D, {**sizes, **parse_options(["dropout=0.3"])}),
    ):
        assert m.dropout == 0.3 and m.input_dropout.p == 0.3 and m.emitter.dropout.p == 0.3
    assert build_model(name, D, {**sizes, "dropout": 0}).dropout == 0.0  # json's 0 is an int
    with pytest.raises(SystemExit, match=r"bad model option for .*dropout=1"):
        build_model(name, D, {**sizes, **parse_options(["dropout=1"])})


def test_train_and_evaluate_storn_with_dropout_from_the_command_line(tiny_pickle, tmp_path):
    out = tmp_path / "storn"
    args = ["train", "--model", "storn", "--data", str(tiny_pickle), "--epochs", "1", "--quiet"]
    args += ["--batch-size", "4", "--out", str(out), "--z-dim", "2"]
    for option in ("rnn_dim=6", "emission_dim=6", "dropout=0.3"):
        args += ["--model-option", option]
    assert main(args) == 0
    assert json.loads((out / "config.json").read_text())["model_options"]["dropout"] == 0.3
    assert main(["evaluate", str(out), "--objective", "iwae", "--particles", "2"]) == 0
