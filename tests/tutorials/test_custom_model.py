"""Run tutorials/custom_model.py in its short mode and check its model and numbers.

The model class is taken from the tutorial itself (its imports and class definitions only, so
no training runs on import) and checked against references written from its equations:

* the ELBO of a fixed latent sample, by hand in float64, against ``Trace_ELBO`` (which scores
  the model time-parallel) and against IWAE and FIVO with one particle (FIVO drives the step
  protocol one step at a time): all four must agree;
* the exact ``log p(x)`` of a one-dimensional-latent instance, by the forward algorithm on a
  dense grid, against the package's IWAE and SMC estimators (unbiased in ``p``) and the ELBO
  (strictly below);
* on the models the tutorial trained: the IWAE bound above the ELBO by more than its noise.
"""

import ast
import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.data import pad_sequences
from pyro_seq.infer import FIVO, IWAE, estimate_log_likelihood
from pyro_seq.train.objectives import ENERGY_OBJECTIVES, OBJECTIVES
from tests.tutorials import ROOT, tutorial_output_fixture

tutorial_output = tutorial_output_fixture("custom_model", timeout=300)

LOG_2PI = math.log(2 * math.pi)


def tutorial_definitions():
    """The tutorial's imports and class definitions, executed without the rest of the script."""
    path = ROOT / "tutorials" / "custom_model.py"
    tree = ast.parse(path.read_text())
    keep = [
        node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef))
    ]
    namespace = {"__name__": "custom_model_definitions"}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def model_class():
    return tutorial_definitions()["AutoregressiveDMM"]


# ------------------------------------------------------------------ hand-written reference
def gaussian_mlp(mlp, z, context):
    """``(loc, scale)`` of a ``GaussianMLP`` from its weights: one hidden ReLU layer on
    ``[z, context]``, ``scale = min_scale + softplus(.)``."""
    h = torch.relu(torch.cat([z, context], -1) @ mlp.first.weight.T + mlp.first.bias)
    head = mlp.head
    loc = h @ head.loc.weight.T + head.loc.bias
    return loc, head.min_scale + torch.nn.functional.softplus(
        h @ head.raw_scale.weight.T + head.raw_scale.bias
    )


def log_normal(z, loc, scale):
    return (-0.5 * ((z - loc) / scale) ** 2 - scale.log() - 0.5 * LOG_2PI).sum(-1)


def emission_log_prob(m, x, z, u):
    """``sum_d log Bernoulli(x_d; sigmoid(l_d))`` with ``l = W_2 relu(W_1 [z, u] + b_1) + b_2``."""
    first, last = m.emitter[0], m.emitter[-1]
    logits = (
        torch.relu(torch.cat([z, u], -1) @ first.weight.T + first.bias) @ last.weight.T + last.bias
    )
    return (x * logits - torch.nn.functional.softplus(logits)).sum(-1)


def backward_gru(m, inputs):
    """``a_t = GRU(a_{t+1}, inputs_t)`` from ``a_{T+1} = h0``, the GRU equations by hand.
    ``inputs (T, I) -> (T, H)``."""
    rnn = m.encoder.rnn
    w_ir, w_iz, w_in = rnn.weight_ih_l0.chunk(3)
    w_hr, w_hz, w_hn = rnn.weight_hh_l0.chunk(3)
    b_ir, b_iz, b_in = rnn.bias_ih_l0.chunk(3)
    b_hr, b_hz, b_hn = rnn.bias_hh_l0.chunk(3)
    h, out = m.encoder.h0, [None] * inputs.shape[0]
    for t in reversed(range(inputs.shape[0])):
        v = inputs[t]
        r = torch.sigmoid(v @ w_ir.T + b_ir + h @ w_hr.T + b_hr)
        g = torch.sigmoid(v @ w_iz.T + b_iz + h @ w_hz.T + b_hz)
        n = torch.tanh(v @ w_in.T + b_in + r * (h @ w_hn.T + b_hn))
        h = out[t] = (1 - g) * n + g * h
    return torch.stack(out)


def reference_elbo(m, x, zs):
    """``log p(x, z) - log q(z | x)`` of one sequence ``x (T, D)`` at latents ``zs (T, z_dim)``."""
    u = torch.cat([torch.zeros_like(x[:1]), x[:-1]])
    a = backward_gru(m, torch.cat([x, u], -1))
    z_prev = torch.zeros(m.z_dim, dtype=x.dtype)
    total = torch.zeros((), dtype=x.dtype)
    for t in range(x.shape[0]):
        total = total + log_normal(zs[t], *gaussian_mlp(m.prior, z_prev, u[t]))
        total = total + emission_log_prob(m, x[t], zs[t], u[t])
        total = total - log_normal(zs[t], *gaussian_mlp(m.posterior, z_prev, a[t]))
        z_prev = zs[t]
    return total


@torch.no_grad()
def grid_log_likelihood(m, x, half_width=12.0, points=2401):
    """Exact ``log p(x)`` of one sequence for ``z_dim = 1``: the forward algorithm
    ``alpha_t(z_t) = p(x_t | z_t, x_{t-1}) sum_{z_{t-1}} alpha_{t-1}(z_{t-1}) p(z_t | z_{t-1},
    x_{t-1}) dz`` on a grid of ``points`` values of ``z`` (rectangle rule; for Gaussian kernels
    of width >> the spacing the error is far below the tolerances used here). Also returns the
    largest filtered-mass-weighted deviation of the transition rows from 1, which shows that
    the grid covers where the mass is."""
    grid = torch.linspace(-half_width, half_width, points, dtype=x.dtype).unsqueeze(-1)  # (G, 1)
    log_dz = math.log(2 * half_width / (points - 1))
    u = torch.cat([torch.zeros_like(x[:1]), x[:-1]])
    log_alpha, leak = None, 0.0
    for t in range(x.shape[0]):
        if t == 0:
            loc, scale = gaussian_mlp(m.prior, torch.zeros(1, 1, dtype=x.dtype), u[:1])
            log_alpha = log_normal(grid, loc, scale) + log_dz  # (G,)
        else:
            loc, scale = gaussian_mlp(m.prior, grid, u[t].expand(points, -1))  # (G, 1)
            # log_trans[i, j] = log p(z_t = grid_j | z_{t-1} = grid_i, x_{t-1}) + log dz
            log_trans = log_normal(grid.unsqueeze(0), loc.unsqueeze(1), scale.unsqueeze(1)) + log_dz
            filtered = torch.softmax(log_alpha, 0)
            leak = max(leak, float((filtered * (log_trans.logsumexp(-1).exp() - 1).abs()).sum()))
            log_alpha = torch.logsumexp(log_alpha.unsqueeze(-1) + log_trans, 0)
        log_alpha = log_alpha + emission_log_prob(
            m, x[t].expand(points, -1), grid, u[t].expand(points, -1)
        )
    return float(torch.logsumexp(log_alpha, 0)), leak


# ------------------------------------------------------------------ tests of the model
def test_elbo_of_a_fixed_latent_sample_matches_the_equations(model_class):
    """One latent draw, four evaluations: by hand from the equations, ``Trace_ELBO`` (the model
    scored time-parallel against the guide's trace), ``IWAE(1)`` and ``FIVO(1)`` (the step
    protocol driven one step at a time). The same seed gives the same draw to all of them, so
    they agree to float64 rounding; padded steps (a ragged batch) contribute nothing."""
    torch.manual_seed(0)
    m = model_class(5, z_dim=3, hidden_dim=7, rnn_dim=6).double()
    lengths = [6, 3, 1]
    x, mask = pad_sequences(
        [torch.bernoulli(torch.full((n, 5), 0.4)) for n in lengths], dtype=torch.float64
    )
    pyro.set_rng_seed(11)
    guide_trace = poutine.trace(m.guide).get_trace(x, mask)
    zs = torch.stack([guide_trace.nodes[f"z_{t + 1}"]["value"] for t in range(x.shape[1])], 1)
    with torch.no_grad():
        expected = torch.stack(
            [reference_elbo(m, x[b, :n], zs[b, :n]) for b, n in enumerate(lengths)]
        )

    model_trace = poutine.trace(poutine.replay(m.model, trace=guide_trace)).get_trace(x, mask)
    model_trace.compute_log_prob()
    guide_trace.compute_log_prob()
    per_sequence = sum(
        site["log_prob"]
        for site in model_trace.nodes.values()
        if site["type"] == "sample" and site["name"] != "sequences"
    )
    per_sequence = per_sequence - sum(
        site["log_prob"]
        for site in guide_trace.nodes.values()
        if site["type"] == "sample" and site["name"] != "sequences"
    )
    assert torch.allclose(per_sequence, expected, rtol=0, atol=1e-10)

    pyro.set_rng_seed(11)
    with torch.no_grad():
        loss = Trace_ELBO().loss(m.model, m.guide, x, mask)
    assert loss == pytest.approx(-float(expected.sum()), abs=1e-9)
    for objective in (IWAE(num_particles=1, max_plate_nesting=1), FIVO(num_particles=1)):
        pyro.set_rng_seed(11)
        log_z, _ = objective.log_z(m.model, m.guide, x, mask)
        assert torch.allclose(log_z, expected, rtol=0, atol=1e-10), type(objective).__name__


def test_estimators_against_the_exact_likelihood_on_a_grid(model_class):
    """With a one-dimensional latent, ``log p(x)`` is a 1-d integral per step: the grid forward
    algorithm gives it exactly (to ~1e-8 here). Against it:

    * IWAE(512) and SMC(512) estimate ``p(x)`` without bias: over R independent runs the mean
      of ``p_hat / p(x)`` is 1 within 4 standard errors of that mean (measured: 1.0006 and
      0.9997, standard errors 0.0037 and 0.0034);
    * their logs are biased down only (Jensen): mean ``log p_hat <= log p(x) + 4 SE``, and they
      lie above the ELBO by more than 4 standard errors of the difference;
    * the ELBO is strictly below: ``log p(x) - mean ELBO > 4 SE`` (the guide is not the exact
      posterior, so the gap, the expected KL to it, is positive; measured 0.40 nats against an
      SE of 0.023 with 2000 draws). Five seeds of this setup all pass with these margins.
    """
    torch.manual_seed(1)
    m = model_class(4, z_dim=1, hidden_dim=8, rnn_dim=8).double()
    x = torch.bernoulli(torch.full((1, 5, 4), 0.5, dtype=torch.float64))
    exact, leak = grid_log_likelihood(m, x[0])
    assert leak < 1e-8  # the grid holds the transition mass wherever the filter has mass

    # independent runs of an estimator = copies of x in one batch (one estimate per sequence)
    def runs(method, K, R):
        pyro.set_rng_seed(0)
        return estimate_log_likelihood(
            m.model,
            m.guide,
            x.expand(R, -1, -1).contiguous(),
            method=method,
            num_particles=K,
            particles_per_pass=128,
        ).per_sequence

    elbo = runs("iwae", 1, 2000)
    elbo_se = float(elbo.std()) / math.sqrt(len(elbo))
    assert exact - float(elbo.mean()) > 4 * elbo_se
    for method in ("iwae", "smc"):
        log_p_hat = runs(method, 512, 200)
        se = float(log_p_hat.std()) / math.sqrt(len(log_p_hat))
        ratio = (log_p_hat - exact).exp()
        assert abs(float(ratio.mean()) - 1) < 4 * float(ratio.std()) / math.sqrt(len(ratio)), method
        assert float(log_p_hat.mean()) <= exact + 4 * se, method
        assert float(log_p_hat.mean()) - float(elbo.mean()) > 4 * math.hypot(se, elbo_se), method


# ------------------------------------------------------------------ tests of the tutorial's run
def test_every_latent_variable_objective_was_trained(tutorial_output):
    _, metrics = tutorial_output
    assert metrics["smoke"] is True
    assert sorted(metrics["objectives"]) == sorted(OBJECTIVES)
    assert metrics["skipped_objectives"] == list(ENERGY_OBJECTIVES) == ["cd"]
    assert sorted(metrics["results"]) == sorted(OBJECTIVES)


def test_metrics_are_consistent(tutorial_output):
    out, metrics = tutorial_output
    batches = math.ceil(metrics["num_sequences"]["train"] / metrics["batch_size"])
    table = (out / "results_table.md").read_text()
    for name, r in metrics["results"].items():
        curve = metrics["curves"][name]
        assert len(curve) == r["train_steps"] == metrics["epochs"] * batches, name
        assert all(math.isfinite(v) and v < 0 for v in curve), name
        assert r["final_train_bound_per_step"] == pytest.approx(sum(curve[-batches:]) / batches)
        for key in ("test_elbo_per_step", "test_iwae_per_step", "test_smc_per_step"):
            # 88 Bernoulli units: log-likelihoods per step are negative; the untrained model
            # starts near the independent-notes fit (about -11)
            assert math.isfinite(r[key]) and -100 < r[key] < 0, (name, key)
        # the table quotes exactly these numbers
        assert (
            f"| {name} | {r['test_elbo_per_step']:.3f} | {r['test_iwae_per_step']:.3f} | "
            f"{r['test_smc_per_step']:.3f} |"
        ) in table
    assert metrics["best"] == max(
        metrics["results"], key=lambda k: metrics["results"][k]["test_iwae_per_step"]
    )


def test_figures_written(tutorial_output):
    out, _ = tutorial_output
    for name in ("training_curves.png", "sample.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_trained_models_bound_ordering(tutorial_output, model_class):
    """On each model the tutorial trained, on the test chorales: IWAE(64) above the ELBO, by
    more than 4 standard errors of the difference of the two means (R independent runs of
    each, seeded). Measured in smoke mode: gap 0.14 nats/step, standard error of the
    difference 0.014."""
    out, metrics = tutorial_output
    from pyro_seq.data import build_chorales
    from pyro_seq.data.chorales import chorale_paths

    rolls, _ = build_chorales(chorale_paths()[: metrics["chorale_files"]], progress=False)
    x, mask = pad_sequences([r.float() for r in rolls["test"]])
    steps = int(mask.sum())
    R, n = 16, x.shape[0]
    # R independent runs of an estimator = R copies of the test set in one batch
    copies = (x.repeat(R, 1, 1), mask.repeat(R, 1))
    for name in metrics["objectives"]:
        m = model_class(metrics["obs_dim"], **metrics["sizes"])
        m.load_state_dict(torch.load(out / f"model_{name}.pt", weights_only=True))
        m.eval()
        pyro.set_rng_seed(0)
        means, ses = [], []
        for K in (1, 64):
            est = estimate_log_likelihood(
                m.model, m.guide, copies, method="iwae", num_particles=K, particles_per_pass=16
            )
            totals = est.per_sequence.reshape(R, n).sum(-1) / steps  # per run, nats/step
            assert torch.isfinite(totals).all()
            means.append(float(totals.mean()))
            ses.append(float(totals.std()) / math.sqrt(R))
        assert means[1] - means[0] > 4 * math.hypot(*ses), (name, means, ses)
