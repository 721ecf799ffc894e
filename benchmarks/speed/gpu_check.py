"""One check for a lent GPU machine: everything that must work on CUDA, in a few minutes.

Sections (each reported in the JSON, none stops the others; the exit status is 1 when any
failed):

* ``grid``: every model of the command line x every objective it trains with, each trained by
  :func:`pyro_seq.train.fit` on the device for a few steps (KL annealing on, validation and the
  objective's own validation bound included), then sampled with ``generate``. A cell passes when
  the losses and bounds are finite and the parameters and samples are on the device.
  Objectives: ``elbo`` (Trace_ELBO), ``meanfield``, ``free_bits`` (FreeBits_ELBO), ``iwae``,
  ``fivo`` for the latent-variable models; ``cd`` (contrastive divergence) for the RTRBM.
* ``resume``: 2 epochs in one call against 1 epoch + a resumed epoch (a DMM, ELBO): the last
  weights must agree (max abs difference <= 1e-5; 0 on CPU), which needs the CUDA generator
  state in the checkpoint.
* ``device_errors``: a tensor on another device than the model's parameters (the CPU when the
  device is CUDA, ``meta`` when it is the CPU) gets a ValueError naming the tensor, from a
  model, the Kalman filter and the LinearGaussianSSM.
* ``lgssm``: ``kalman_filter`` and ``kalman_smoother`` (sequential and parallel-scan forms),
  ``kalman_sample`` (fixed noise) and ``LinearGaussianSSM.log_prob`` in float64 on the device
  against the same calls on the CPU in float64, on a batch with controls and missing
  observations: the largest :func:`relative_error` must be <= 1e-9.
* ``timing``: seconds per training epoch (SVI with Trace_ELBO, ClippedAdam, batches of 20) of
  a DMM (Pyro's example sizes) and an SRNN (thesis sizes) on JSB Chorales, on the device and on
  the CPU with one thread; the median of ``--epochs`` epochs after a few warm-up updates.
  JSB is ``--data``, else ``../shared/data/polyphonic/jsb_chorales.pickle``, else the built-in
  chorales. ``--smoke``: small models on random data, a few minibatches per epoch.
* ``throughput``: sequences per second of one training step (SVI, Trace_ELBO, ClippedAdam,
  Pyro validation off) of the same DMM and SRNN against the batch size (16 to 512; minibatches
  drawn with replacement from the training sequences, the same draws on both devices), on the
  device and on the CPU with one thread, the median of ``--throughput-steps`` steps after one
  warm-up step, with a log-log figure ``<out>_throughput.png``. The curve shows where the
  device stops being launch-bound (issue 26 asks for a 5x speed-up over one CPU core at the
  papers' batch sizes).

Usage (``--device cpu`` runs the same script; the tests run it with ``--smoke``)::

    python benchmarks/speed/gpu_check.py --device cuda   # -> benchmarks/results/gpu_check_cuda.json
    python benchmarks/speed/gpu_check.py --device cpu --smoke --out /tmp/gpu_check.json

The JSON names the device (``device``, ``device_name``), the machine and the versions.
"""

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import pyro  # noqa: E402
import torch  # noqa: E402
from common import RESULTS, SHARED_DATA, device_info, machine_info  # noqa: E402

LGSSM_TOLERANCE = 1e-9
RESUME_TOLERANCE = 1e-5
LATENT_OBJECTIVES = ("elbo", "meanfield", "free_bits", "iwae", "fivo")
OBS_DIM = 88


# --------------------------------------------------------------------------- helpers
def relative_error(actual, expected):
    """Normwise relative error ``max|actual - expected| / max|expected|`` (inf-norm).

    0 when both are exactly equal (all zeros included); ``inf`` when the shapes differ, when
    NaNs do not sit at the same places, or when ``expected`` is all zeros and ``actual`` is not.
    Normwise rather than elementwise: covariance entries near 0 would make an elementwise ratio
    meaningless, while the inf-norm ratio is what rounding bounds in float64.
    """
    a = torch.as_tensor(actual).detach().to("cpu", torch.float64)
    b = torch.as_tensor(expected).detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        return math.inf
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return math.inf
    a, b = a[~nan_a], b[~nan_b]
    if a.numel() == 0 or torch.equal(a, b):
        return 0.0
    diff = float((a - b).abs().max())
    scale = float(b.abs().max())
    if not math.isfinite(diff):
        return math.inf
    return diff / scale if scale > 0 else math.inf


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def no_figures():
    """``fit`` without its loss-curve figure: drawn on the CPU from the log, it has nothing to do
    with the device and takes three quarters of a tiny cell's time."""
    import pyro_seq.train.plots as plots

    saved = plots.plot_history
    plots.plot_history = lambda *args, **kwargs: None
    try:
        yield
    finally:
        plots.plot_history = saved


def finite(*values):
    return all(v is not None and math.isfinite(v) for v in values)


def random_rolls(num, min_len, max_len, seed, p=0.1):
    """Random binary piano rolls ``(T_i, 88)`` (stand-ins for data in smoke runs)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.rand(
                int(torch.randint(min_len, max_len + 1, (), generator=g)), OBS_DIM, generator=g
            )
            < p
        ).float()
        for _ in range(num)
    ]


def load_timing_data(spec, smoke):
    """``(name, train sequences)`` for the timing section."""
    from pyro_seq.data import load_dataset

    if spec is None and smoke:
        return "random binary rolls (smoke)", random_rolls(60, 20, 60, seed=1)
    path = Path(spec) if spec else SHARED_DATA / "jsb_chorales.pickle"
    if path.exists():
        return str(path), load_dataset(path, splits=("train",))["train"]
    if spec:
        raise SystemExit(f"data file {path} not found")
    return "chorales (built in; JSB not found at %s)" % path, load_dataset(
        "chorales", splits=("train",)
    )["train"]


# --------------------------------------------------------------------------- grid
def tiny_options(name, width):
    w, z = width, max(2, width // 2)
    return {
        "dmm": dict(z_dim=z, transition_dim=w, emission_dim=w, rnn_dim=w),
        "srnn": dict(d_dim=w, z_dim=z, hidden_dim=w),
        "vrnn": dict(d_dim=w, z_dim=z, hidden_dim=w, feature_dim=w),
        "vaernn": dict(d_dim=w, z_dim=z, hidden_dim=w),
        "storn": dict(z_dim=z, rnn_dim=w, emission_dim=w),
        "vosp": dict(z_dim=z, rnn_dim=w, emission_dim=w),
        "vrae": dict(z_dim=z, encoder_dim=w, decoder_dim=w, emission_dim=w),
        "rnn": dict(d_dim=w, hidden_dim=w),
        "rtrbm": dict(num_hidden=w),
        # 88 piano keys read as 8x11 "frames" with the MLP encoder (the conv one needs
        # power-of-two frame sides); the device check is about devices, not about videos
        "kvae": dict(image_shape=[8, 11], encoder="mlp", hidden_dims=[w], lstm_dim=w, z_dim=z),
    }[name]


def grid_cells():
    """(model, objective) of every model with tiny options here (the GTM-SM needs actions and
    T > tau, not the random piano rolls; tests/test_surfaces.py takes every model of MODELS
    through every objective on data of its own kind): the objectives it declares, and free
    bits for the ELBO-trained ones."""
    from pyro_seq.models import MODELS

    for model in ("dmm", "srnn", "vrnn", "vaernn", "storn", "vosp", "vrae", "rnn", "rtrbm", "kvae"):
        declared = MODELS[model].objectives
        for objective in ("cd",) if MODELS[model].energy_based else LATENT_OBJECTIVES:
            if objective in declared or objective == "free_bits":
                yield model, objective


def train_config(objective, device, epochs, smoke):
    from pyro_seq.train import TrainConfig

    energy = objective == "cd"
    return TrainConfig(
        epochs=epochs,
        batch_size=3 if smoke else 8,
        device=str(device),
        progress=False,
        objective="elbo" if objective == "free_bits" else objective,
        free_bits=0.1 if objective == "free_bits" else 0.0,
        num_particles=3 if objective in ("iwae", "fivo") else 1,
        kl_start=1.0 if energy else 0.5,
        kl_anneal_steps=0 if energy else 3,
        valid_batch_size=4,
        patience=None,
        lr_schedule="constant",
        seed=0,
    )


def run_cell(model_name, objective, device, train, valid, width, smoke, work):
    from pyro_seq.cli import build_model
    from pyro_seq.train import fit

    torch.manual_seed(0)
    model = build_model(model_name, OBS_DIM, tiny_options(model_name, width))
    config = train_config(objective, device, 1, smoke)
    start = time.perf_counter()
    with no_figures():
        history = fit(model, train, valid, config, work / f"{model_name}_{objective}", resume=False)
    synchronize(device)
    seconds = time.perf_counter() - start
    row = history[-1]
    loss = row.get("train_loss_per_step", row.get("train_reconstruction_error"))
    bound = row.get("valid_bound_per_step")
    devices = sorted({str(p.device) for p in model.parameters()})
    kwargs = {"gibbs_steps": 2} if model_name == "rtrbm" else {}
    with torch.no_grad():
        sample, _ = model.generate(2, 4, **kwargs)
    cell = {
        "train_loss_per_step": loss,
        "valid_bound_per_step": bound,
        "parameter_devices": devices,
        "sample_device": str(sample.device),
        "sample_finite": bool(torch.isfinite(sample).all()),
        "seconds": seconds,
    }
    problems = []
    if not finite(loss, bound):
        problems.append(f"non-finite loss/bound {loss}, {bound}")
    if devices != [str(device)]:
        problems.append(f"parameters on {devices}, expected {device}")
    if sample.device != device or not cell["sample_finite"]:
        problems.append(f"samples on {sample.device} (finite: {cell['sample_finite']})")
    cell["ok"] = not problems
    if problems:
        cell["error"] = "; ".join(problems)
    return cell


def check_grid(device, smoke, work):
    width = 8 if smoke else 32
    train = random_rolls(6 if smoke else 24, 4, 10 if smoke else 40, seed=2)
    valid = random_rolls(2 if smoke else 8, 4, 10 if smoke else 40, seed=3)
    grid = {}
    for model_name, objective in grid_cells():
        key = f"{model_name}/{objective}"
        try:
            grid[key] = run_cell(model_name, objective, device, train, valid, width, smoke, work)
        except Exception as e:  # report, go on with the other cells
            grid[key] = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=-4),
            }
        status = "ok" if grid[key]["ok"] else f"FAILED: {grid[key]['error']}"
        print(f"  {key:22s} {status}", flush=True)
    return grid


# --------------------------------------------------------------------------- resume
def check_resume(device, smoke, work):
    """2 epochs at once vs 1 + 1 resumed: the last weights (checkpoint.pt) must agree."""
    from pyro_seq.models import DMM
    from pyro_seq.train import fit, load_checkpoint

    train = random_rolls(6, 4, 10, seed=4)
    valid = random_rolls(2, 4, 10, seed=5)

    def run(folder, epochs_per_call):
        for epochs in epochs_per_call:
            torch.manual_seed(0)
            model = DMM(OBS_DIM, **tiny_options("dmm", 8))
            config = train_config("elbo", device, epochs, smoke=True)
            with no_figures():
                fit(model, train, valid, config, work / folder)
            torch.manual_seed(12345)  # what a resumed process would see: another global state
            if device.type == "cuda":
                torch.cuda.manual_seed_all(12345)
        return load_checkpoint(work / folder / "checkpoint.pt")["model"]

    once, twice = run("resume_once", [2]), run("resume_twice", [1, 2])
    diff = max(float((once[k].double() - twice[k].double()).abs().max()) for k in once)
    return {
        "max_abs_difference": diff,
        "tolerance": RESUME_TOLERANCE,
        "ok": diff <= RESUME_TOLERANCE,
    }


# --------------------------------------------------------------------------- device errors
def check_device_errors(device):
    """A tensor elsewhere than the parameters must be a ValueError naming it."""
    from pyro_seq.distributions import LinearGaussianSSM
    from pyro_seq.models import DMM
    from pyro_seq.ops import kalman_filter

    other = torch.device("cpu") if device.type == "cuda" else torch.device("meta")
    results = {}

    def expect(name, argument, fn):
        try:
            fn()
        except ValueError as e:
            msg = str(e)
            ok = argument in msg and str(other) in msg and str(device) in msg
            results[name] = {"ok": ok, "message": msg}
            return
        except Exception as e:
            results[name] = {"ok": False, "message": f"{type(e).__name__}: {e}"}
            return
        results[name] = {"ok": False, "message": "no error"}

    model = DMM(OBS_DIM, **tiny_options("dmm", 8)).to(device)
    x = torch.zeros(2, 3, OBS_DIM)
    pyro.clear_param_store()
    expect("model_x", "x", lambda: model.model(x.to(other)))
    expect(
        "model_mask",
        "mask",
        lambda: model.model(x.to(device), torch.ones(2, 3, dtype=torch.bool, device=other)),
    )
    p = lgssm_problem(torch.device("cpu"))
    on_device = {k: v.to(device) if torch.is_tensor(v) else v for k, v in p.items()}
    expect(
        "kalman_filter_observations",
        "observations",
        lambda: kalman_filter(
            on_device["observations"].to(other), *[on_device[k] for k in LGSSM_PARAMS]
        ),
    )
    expect(
        "lgssm_log_prob",
        "observations",
        lambda: LinearGaussianSSM(*[on_device[k] for k in LGSSM_PARAMS]).log_prob(
            on_device["observations"].to(other)
        ),
    )
    pyro.clear_param_store()
    return {
        "other_device": str(other),
        "checks": results,
        "ok": all(r["ok"] for r in results.values()),
    }


# --------------------------------------------------------------------------- LGSSM
LGSSM_PARAMS = (
    "initial_loc",
    "initial_cov",
    "transition_matrix",
    "transition_cov",
    "observation_matrix",
    "observation_cov",
)


def lgssm_problem(device, B=3, T=48, S=4, D=3, U=2, seed=0):
    """A random stable time-invariant LGSSM in float64 with controls and missing data."""
    f = torch.float64
    g = torch.Generator().manual_seed(seed)
    A = 0.95 * torch.linalg.qr(torch.randn(S, S, generator=g, dtype=f))[0]
    W = torch.randn(S, S, generator=g, dtype=f)
    Q = 0.1 * W @ W.T / S + 0.05 * torch.eye(S, dtype=f)
    C = torch.randn(D, S, generator=g, dtype=f) / S**0.5
    V = torch.randn(D, D, generator=g, dtype=f)
    R = 0.2 * V @ V.T / D + 0.3 * torch.eye(D, dtype=f)
    P0 = torch.eye(S, dtype=f)
    m0 = torch.randn(S, generator=g, dtype=f)
    Bm = torch.randn(S, U, generator=g, dtype=f) / U
    u = torch.randn(B, T, U, generator=g, dtype=f)
    x = torch.randn(B, T, D, generator=g, dtype=f)
    mask = torch.rand(B, T, D, generator=g) > 0.2
    mask[:, :2] = True
    noise = torch.randn(B, T, S, generator=g, dtype=f)
    p = dict(
        observations=x,
        initial_loc=m0,
        initial_cov=P0,
        transition_matrix=A,
        transition_cov=Q,
        observation_matrix=C,
        observation_cov=R,
        control_matrix=Bm,
        controls=u,
        mask=mask,
        noise=noise,
    )
    return {k: v.to(device) for k, v in p.items()}


def lgssm_outputs(device):
    """Every checked output of the LGSSM ops on ``device`` (float64), as CPU tensors."""
    from pyro_seq.distributions import LinearGaussianSSM
    from pyro_seq.ops import kalman_filter, kalman_sample, kalman_smoother

    p = lgssm_problem(device)
    args = [p["observations"]] + [p[k] for k in LGSSM_PARAMS]
    kw = dict(control_matrix=p["control_matrix"], controls=p["controls"], mask=p["mask"])
    out = {}
    for method in ("sequential", "parallel"):
        f = kalman_filter(*args, method=method, **kw)
        for field in f._fields:
            out[f"kalman_filter[{method}].{field}"] = getattr(f, field)
        s = kalman_smoother(*args, method=method, **kw)
        for field in ("means", "covs", "cross_covs", "gains"):
            out[f"kalman_smoother[{method}].{field}"] = getattr(s, field)
        out[f"kalman_sample[{method}].samples"] = kalman_sample(
            *args, method=method, noise=p["noise"], **kw
        ).samples
        d = LinearGaussianSSM(
            *[p[k] for k in LGSSM_PARAMS],
            control_matrix=p["control_matrix"],
            controls=p["controls"],
            observation_mask=p["mask"],
            method=method,
        )
        out[f"LinearGaussianSSM[{method}].log_prob"] = d.log_prob(p["observations"])
    for name, value in out.items():
        if value.device != device:
            raise RuntimeError(f"{name} came back on {value.device}, not {device}")
    return {k: v.detach().cpu() for k, v in out.items()}


def check_lgssm(device):
    expected = lgssm_outputs(torch.device("cpu"))
    actual = lgssm_outputs(device)
    errors = {k: relative_error(actual[k], expected[k]) for k in expected}
    worst = max(errors.values())
    return {
        "errors": errors,
        "max_relative_error": worst,
        "tolerance": LGSSM_TOLERANCE,
        "measure": "max|device - cpu| / max|cpu| per output, float64",
        "ok": worst <= LGSSM_TOLERANCE,
    }


# --------------------------------------------------------------------------- timing
def timing_models(smoke):
    from pyro_seq.models import DMM, SRNN

    if smoke:
        return {
            "dmm": lambda: DMM(OBS_DIM, z_dim=8, transition_dim=16, emission_dim=16, rnn_dim=16),
            "srnn": lambda: SRNN(OBS_DIM, d_dim=16, z_dim=8, hidden_dim=16),
        }
    # Pyro's examples/dmm.py sizes (benchmarks/speed/dmm_speed.py) and the thesis' SRNN (Ch. 5)
    return {
        "dmm": lambda: DMM(
            OBS_DIM, z_dim=100, transition_dim=200, emission_dim=100, rnn_dim=600, rnn_cell="rnn"
        ),
        "srnn": lambda: SRNN(OBS_DIM),
    }


def time_epochs(make_model, data, device, epochs, max_batches, batch_size=20, warmup=2):
    """Seconds per training epoch (Trace_ELBO, ClippedAdam) on ``device``."""
    from pyro.infer import SVI, Trace_ELBO
    from pyro.optim import ClippedAdam

    from pyro_seq.data import SequenceLoader

    pyro.clear_param_store()
    torch.manual_seed(0)
    model = make_model().to(device)
    svi = SVI(
        model.model, model.guide, ClippedAdam({"lr": 1e-3, "clip_norm": 10.0}), loss=Trace_ELBO()
    )
    loader = SequenceLoader(data, batch_size, shuffle=True, seed=0, device=device)
    times = []
    with pyro.validation_enabled(False):
        for i, (x, mask) in enumerate(loader.batches(epochs)):  # warm-up: CUDA init, autotune
            if i >= warmup:
                break
            svi.step(x, mask)
        for epoch in range(epochs):
            synchronize(device)
            start = time.perf_counter()
            for i, (x, mask) in enumerate(loader.batches(epoch)):
                if max_batches is not None and i >= max_batches:
                    break
                loss = svi.step(x, mask)
                if not math.isfinite(loss):
                    raise FloatingPointError(f"non-finite loss {loss}")
            synchronize(device)
            times.append(time.perf_counter() - start)
    pyro.clear_param_store()
    return times


def check_timing(device, data_spec, smoke, epochs):
    name, data = load_timing_data(data_spec, smoke)
    max_batches = 2 if smoke else None
    out = {
        "data": name,
        "num_sequences": len(data),
        "batch_size": 20,
        "batches_per_epoch": max_batches or math.ceil(len(data) / 20),
        "epochs": epochs,
        "cpu_threads": 1,
        "models": {},
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for model_name, make_model in timing_models(smoke).items():
            on_device = time_epochs(make_model, data, device, epochs, max_batches)
            on_cpu = time_epochs(make_model, data, torch.device("cpu"), epochs, max_batches)
            med_dev, med_cpu = statistics.median(on_device), statistics.median(on_cpu)
            out["models"][model_name] = {
                "device_seconds_per_epoch": on_device,
                "cpu_seconds_per_epoch": on_cpu,
                "median_device_seconds": med_dev,
                "median_cpu_seconds": med_cpu,
                "cpu_over_device": med_cpu / med_dev,
            }
            print(
                f"  {model_name}: {med_dev:.2f} s/epoch on {device}, {med_cpu:.2f} s/epoch on "
                f"the CPU (1 thread)",
                flush=True,
            )
    finally:
        torch.set_num_threads(threads)
    out["ok"] = True
    return out


# --------------------------------------------------------------------------- throughput
THROUGHPUT_BATCH_SIZES = (16, 32, 64, 128, 256, 512)


def throughput_batches(data, batch_sizes, steps, seed=0):
    """``{batch size: [(x, mask), ...]}``: ``1 + steps`` padded minibatches per size, drawn with
    replacement by a seeded generator (so batches larger than the data set exist, and every
    device sees the same draws)."""
    from pyro_seq.data import pad_sequences

    g = torch.Generator().manual_seed(seed)
    out = {}
    for bs in batch_sizes:
        draws = [torch.randint(len(data), (bs,), generator=g).tolist() for _ in range(1 + steps)]
        out[bs] = [pad_sequences([data[i] for i in idx]) for idx in draws]
    return out


def time_steps(make_model, batches, device):
    """One row per batch size: the median seconds of the timed training steps (after the first,
    a warm-up), sequences and real time steps per second."""
    from pyro.infer import SVI, Trace_ELBO
    from pyro.optim import ClippedAdam

    rows = []
    for bs, minibatches in batches.items():
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = make_model().to(device)
        svi = SVI(
            model.model,
            model.guide,
            ClippedAdam({"lr": 1e-3, "clip_norm": 10.0}),
            loss=Trace_ELBO(),
        )
        on_device = [(x.to(device), mask.to(device)) for x, mask in minibatches]
        seconds = []
        with pyro.validation_enabled(False):
            for i, (x, mask) in enumerate(on_device):
                synchronize(device)
                start = time.perf_counter()
                loss = svi.step(x, mask)
                synchronize(device)
                if not math.isfinite(loss):
                    raise FloatingPointError(f"non-finite loss {loss} at batch size {bs}")
                if i:  # the first step warms up (CUDA context, kernels, allocator)
                    seconds.append(time.perf_counter() - start)
        med = statistics.median(seconds)
        real_steps = statistics.mean(float(mask.sum()) for _, mask in minibatches[1:])
        rows.append(
            {
                "batch_size": bs,
                "seconds_per_step": seconds,
                "median_seconds_per_step": med,
                "sequences_per_second": bs / med,
                "real_steps_per_second": real_steps / med,
            }
        )
        print(f"    batch {bs:4d}: {bs / med:9.1f} sequences/s on {device}", flush=True)
    pyro.clear_param_store()
    return rows


def plot_throughput(curves, path):
    """Sequences per second against batch size, log-log, one line per model and device."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for (model_name, where), rows in curves.items():
        ax.plot(
            [r["batch_size"] for r in rows],
            [r["sequences_per_second"] for r in rows],
            marker="o",
            linestyle="-" if where == "device" else "--",
            label=f"{model_name}, {where}",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (sequences)")
    ax.set_ylabel("training sequences per second")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def check_throughput(device, data_spec, smoke, steps, figure):
    name, data = load_timing_data(data_spec, smoke)
    sizes = (2, 4) if smoke else THROUGHPUT_BATCH_SIZES
    batches = throughput_batches(data, sizes, steps)
    out = {"data": name, "steps": steps, "cpu_threads": 1, "models": {}}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    curves = {}
    try:
        for model_name, make_model in timing_models(smoke).items():
            print(f"  {model_name}:", flush=True)
            on_device = time_steps(make_model, batches, device)
            on_cpu = (
                on_device
                if device.type == "cpu"
                else time_steps(make_model, batches, torch.device("cpu"))
            )
            curves[(model_name, "device")] = on_device
            curves[(model_name, "cpu")] = on_cpu
            out["models"][model_name] = {
                "device": on_device,
                "cpu": on_cpu,
                "cpu_over_device": [
                    c["median_seconds_per_step"] / d["median_seconds_per_step"]
                    for c, d in zip(on_cpu, on_device)
                ],
            }
    finally:
        torch.set_num_threads(threads)
    plot_throughput(curves, figure)
    out["figure"] = str(figure)
    out["ok"] = True
    return out


# --------------------------------------------------------------------------- main
def run_section(results, name, fn):
    print(f"{name}:", flush=True)
    start = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as e:  # report and continue; the exit status says it failed
        results[name] = {
            "ok": False,
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(limit=-6),
        }
        print(f"  FAILED: {results[name]['error']}", flush=True)
    results[name]["seconds"] = time.perf_counter() - start


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, random data, 1-2 steps per cell and a few minibatches per "
        "timed epoch (the test suite's short mode)",
    )
    ap.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="timed epochs per model and device (default 3; 2 with --smoke)",
    )
    ap.add_argument(
        "--data",
        default=None,
        help="piano-roll pickle for the timing (default: JSB Chorales from "
        "../shared/data, else the built-in chorales; --smoke: random rolls)",
    )
    ap.add_argument(
        "--throughput-steps",
        type=int,
        default=None,
        help="timed training steps per batch size in the throughput section (default 3; 1 "
        "with --smoke)",
    )
    ap.add_argument(
        "--sections",
        default="grid,resume,device_errors,lgssm,timing,throughput",
        help="comma-separated subset of the sections to run",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="JSON path (default benchmarks/results/gpu_check_<device>.json; with "
        "--smoke a file in the temporary directory)",
    )
    args = ap.parse_args(argv)

    from pyro_seq.validation import parse_device

    try:
        device = parse_device(args.device, "--device")
    except ValueError as e:
        raise SystemExit(f"gpu_check: {e}") from None
    tag = args.device.replace(":", "")
    if args.out:
        out = Path(args.out)
    elif args.smoke:
        out = Path(tempfile.gettempdir()) / f"gpu_check_{tag}_smoke.json"
    else:
        out = RESULTS / f"gpu_check_{tag}.json"
    epochs = args.epochs or (2 if args.smoke else 3)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    known = ("grid", "resume", "device_errors", "lgssm", "timing", "throughput")
    if set(sections) - set(known):
        raise SystemExit(
            f"gpu_check: unknown sections {sorted(set(sections) - set(known))}; choose from {known}"
        )

    torch.set_num_threads(1)
    out.parent.mkdir(parents=True, exist_ok=True)  # the throughput figure goes beside it
    started = time.perf_counter()
    results = {"benchmark": "gpu_check", "device": str(device), "smoke": args.smoke}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checks = {
            "grid": lambda: check_grid(device, args.smoke, work),
            "resume": lambda: check_resume(device, args.smoke, work),
            "device_errors": lambda: check_device_errors(device),
            "lgssm": lambda: check_lgssm(device),
            "timing": lambda: check_timing(device, args.data, args.smoke, epochs),
            "throughput": lambda: check_throughput(
                device,
                args.data,
                args.smoke,
                args.throughput_steps or (1 if args.smoke else 3),
                out.with_name(out.stem + "_throughput.png"),
            ),
        }
        for name in sections:
            if name == "grid":
                run_section(results, name, lambda: {"cells": checks["grid"]()})
                cells = results["grid"].get("cells", {})
                results["grid"]["ok"] = bool(cells) and all(c["ok"] for c in cells.values())
            else:
                run_section(results, name, checks[name])
    failures = [name for name in sections if not results[name].get("ok")]
    if "grid" in results:
        failures += [
            f"grid:{k}" for k, c in results["grid"].get("cells", {}).items() if not c["ok"]
        ]
    results.update(
        failures=failures,
        ok=not failures,
        wall_seconds=time.perf_counter() - started,
        device_info=device_info(device),
        machine=machine_info(),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")
    print("all checks passed" if not failures else f"FAILED: {', '.join(failures)}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
