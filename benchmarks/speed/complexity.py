"""How cost grows: seconds (and peak memory) against T, batch, particles and state size.

Each curve is a list of ``(x, y)`` points, ``y`` the median of ``--repeats`` timed calls after
one warm-up call (one torch thread), with the least-squares slope of ``log y`` on ``log x``
(:func:`fit_slope`) beside the exponent the algorithm should show. Fixed per-call costs (Python,
Pyro's tracing, kernel launches) flatten a curve at its small end, so the reported ``slope``
is fitted over the upper half of the points (largest ``x``, at least two; :func:`tail`),
``slope_all`` over every point and ``slope_end`` through the last two (the local exponent at
the large end). The curves:

* ``kalman_T``: :meth:`pyro_seq.distributions.LinearGaussianSSM.log_prob` and
  :meth:`~pyro_seq.distributions.LinearGaussianSSM.smooth` (``method="auto"``, no autograd: the
  steady-state and parallel-scan paths users get by default), batch 1 and 16, state 4,
  observation 2, float64, T = 10^2 .. 10^5; and ``log_prob`` followed by ``backward`` into every
  parameter (batch 16: the training path). Expected slope 1 (thesis eq. 3.11-3.12: one
  predict/update per step).
* ``kalman_state``: the same two at T = 1000, batch 16, state S = 2 .. 128, observation S/2.
  Each step does Cholesky factorisations and products of S x S matrices, so the cost tends to
  S^3 (expected 3) once those outweigh the per-step overhead: read the slope at the large-S end.
* ``kalman_memory``: peak resident memory of one ``log_prob`` / ``smooth`` call against T
  (batch 16, state 4, observation 2), each point in a fresh Python process: the kernel's
  high-water mark ``VmHWM`` of ``/proc/self/status`` is reset to the current resident size just
  before the call (``/proc/self/clear_refs``, Linux >= 4.0) and read after it; the point is the
  increase. Where that file cannot be written, ``ru_maxrss`` of :func:`resource.getrusage`
  minus the resident size before the call is used (the increase when the call sets a new
  peak, an upper bound otherwise); the result names the method. torch has no CPU peak-memory counter and
  ``tracemalloc`` does not see its allocations. Expected slope 1 (smoothing keeps (T, S, S)
  covariances).
* ``train_T`` and ``train_batch``: one ``SVI.step`` (``Trace_ELBO``, Adam, Pyro validation off)
  of the DMM and of the SRNN (smoothing inference) on random binary sequences of 88 notes
  (JSB's width), batch 16 against T (expected 1), and T = 100 against the batch size
  (expected at most 1: rows share each step's Python and launch overhead). The seconds of an
  epoch over N sequences are ``N / B`` steps, so per epoch the batch slope is ``slope - 1``.
* ``particles``: :meth:`pyro_seq.infer.IWAE.loss_and_grads` and
  :meth:`pyro_seq.infer.FIVO.loss_and_grads` of the SRNN (batch 16, T = 50) against the number
  of particles K (expected 1).

The machine is shared: the 1-, 5- and 15-minute load averages are recorded before and after
every group and at both ends of the run, with the machine facts of ``common.machine_info``.
Writes ``benchmarks/results/complexity.json`` (``--output``) and one log-log figure per group
beside it, ``complexity_<group>.png``, with the fitted line (solid, over the fitted points) and
the expected slope (dotted, through the fitted points' centre)::

    python benchmarks/speed/complexity.py                    # about 3 minutes, 1 thread
    python benchmarks/speed/complexity.py --no-figures \\
        --output benchmarks/results/complexity_repeat.json
    python benchmarks/speed/complexity.py --smoke --output /tmp/complexity.json   # seconds

(the second: a repeat run, the JSON only, to see how much a slope moves from run to run).

``--smoke``: tiny sizes, one repeat, two or three points per curve, a check that the script
works; it writes only ``--output`` (and its figures), never the recorded result.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's package

import pyro  # noqa: E402
import torch  # noqa: E402
from common import RESULTS, write_result  # noqa: E402
from pyro.infer import SVI, Trace_ELBO  # noqa: E402
from pyro.optim import Adam  # noqa: E402

import pyro_seq  # noqa: E402
from pyro_seq.distributions import LinearGaussianSSM  # noqa: E402
from pyro_seq.infer import FIVO, IWAE  # noqa: E402
from pyro_seq.models import DMM, SRNN  # noqa: E402

OBS_DIM = 88  # JSB Chorales' piano-roll width
DMM_SIZES = dict(z_dim=16, transition_dim=32, emission_dim=32, rnn_dim=64)
SRNN_SIZES = dict(d_dim=64, z_dim=16, hidden_dim=64)
SMOKE_DMM_SIZES = dict(z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4)
SMOKE_SRNN_SIZES = dict(d_dim=4, z_dim=2, hidden_dim=4)

#: (group, x label, y label, title) of each figure
GROUPS = {
    "kalman_T": ("sequence length T", "seconds per call", "Kalman ops against T"),
    "kalman_state": ("state size S (observation S/2)", "seconds per call", "Kalman ops against S"),
    "kalman_memory": ("sequence length T", "peak memory increase (MiB)", "Kalman peak memory"),
    "train_T": ("sequence length T", "seconds per SVI step", "Training step against T"),
    "train_batch": ("batch size B", "seconds per SVI step", "Training step against batch"),
    "particles": ("particles K", "seconds per loss_and_grads", "SRNN bounds against K"),
}


# ------------------------------------------------------------------------------ the arithmetic
def fit_slope(xs, ys):
    """Least-squares line through ``(log x, log y)``: returns ``(slope, intercept)`` with
    ``y ~ exp(intercept) * x ** slope``. Needs two distinct positive ``x`` and positive ``y``."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"fit_slope needs two or more (x, y) pairs, got {len(xs)} and {len(ys)}")
    if min(xs) <= 0 or min(ys) <= 0:
        raise ValueError("fit_slope needs positive x and y (it fits a line in log-log)")
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    sxx = sum((a - mx) ** 2 for a in lx)
    if sxx == 0:
        raise ValueError("fit_slope needs two distinct x values")
    slope = sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sxx
    return slope, my - slope * mx


def tail(points):
    """The upper half of ``points`` by ``x`` (rounded up, at least two): the fitted range."""
    points = sorted(points)
    n = max(2, math.ceil(len(points) / 2))
    return points[-n:]


def make_curve(name, group, expected_slope, expected, points, samples, settings):
    """A curve's record: points, every timed sample, the slopes and the expectation."""
    fitted = tail(points)
    slope, intercept = fit_slope(*zip(*fitted))
    slope_all, _ = fit_slope(*zip(*points))
    slope_end, _ = fit_slope(*zip(*sorted(points)[-2:]))
    return {
        "name": name,
        "group": group,
        "points": [list(p) for p in points],
        "samples": samples,
        "fit_x_range": [fitted[0][0], fitted[-1][0]],
        "slope": slope,
        "intercept": intercept,
        "slope_all": slope_all,
        "slope_end": slope_end,
        "expected_slope": expected_slope,
        "expected": expected,
        "settings": settings,
    }


def load_average():
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def time_call(fn, repeats):
    """One warm-up call, then ``repeats`` timed calls: (median seconds, all seconds)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


# ------------------------------------------------------------------------------ Kalman
def lgssm_params(S, D, requires_grad=False):
    """A stable random LGSSM in float64 (the construction of ``kalman.py``'s ``make_model``)."""
    gen = torch.Generator().manual_seed(0)
    f64 = torch.float64
    A = 0.95 * torch.linalg.qr(torch.randn(S, S, generator=gen, dtype=f64))[0]
    W = torch.randn(S, S, generator=gen, dtype=f64)
    Q = 0.1 * W @ W.T / S + 0.05 * torch.eye(S, dtype=f64)
    C = torch.randn(D, S, generator=gen, dtype=f64) / S**0.5
    V = torch.randn(D, D, generator=gen, dtype=f64)
    R = 0.2 * V @ V.T / D + 0.3 * torch.eye(D, dtype=f64)
    params = dict(
        initial_loc=torch.zeros(S, dtype=f64),
        initial_cov=A @ A.T + Q,
        transition_matrix=A,
        transition_cov=Q,
        observation_matrix=C,
        observation_cov=R,
    )
    return {k: v.requires_grad_(requires_grad) for k, v in params.items()}


def kalman_op(op, T, B, S, D):
    """A zero-argument function running ``op`` (``log_prob``, ``smooth`` or ``log_prob_grad``)
    on B random sequences of length T; the data do not change the work of the recursions.
    Each call builds its own distribution (without validation, microseconds): an instance
    keeps the covariance side of the steady-state path for its later calls
    (``pyro_seq.ops.SteadyStateCache``), and these curves time the whole algorithm."""
    params = lgssm_params(S, D, requires_grad=op == "log_prob_grad")
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def dist():
        return LinearGaussianSSM(**params, num_steps=T, validate_args=False)

    if op == "log_prob_grad":
        return lambda: dist().log_prob(x).sum().backward()

    def run():
        with torch.no_grad():
            return getattr(dist(), op)(x)

    return run


def kalman_curves(sizes, repeats, log):
    curves = []
    for op in ("log_prob", "smooth", "log_prob_grad"):
        for B in (1, 16) if op != "log_prob_grad" else (16,):
            points, samples = [], []
            for T in sizes["kalman_T"]:
                median, times = time_call(kalman_op(op, T, B, 4, 2), repeats)
                points.append((T, median))
                samples.append(times)
                log(f"kalman_T {op} B={B} T={T}: {median * 1e3:.2f} ms")
            settings = dict(batch=B, state=4, obs=2, dtype="float64", method="auto")
            if op == "log_prob_grad":
                settings["autograd"] = "backward into every parameter"
            curves.append(
                make_curve(f"{op} B={B}", "kalman_T", 1.0, "linear", points, samples, settings)
            )
    T, B = sizes["kalman_state_T"], 16
    for op in ("log_prob", "smooth"):
        points, samples = [], []
        for S in sizes["kalman_S"]:
            median, times = time_call(kalman_op(op, T, B, S, max(1, S // 2)), repeats)
            points.append((S, median))
            samples.append(times)
            log(f"kalman_state {op} S={S}: {median * 1e3:.2f} ms")
        settings = dict(batch=B, num_steps=T, obs="S/2", dtype="float64", method="auto")
        curves.append(
            make_curve(f"{op} B={B}", "kalman_state", 3.0, "cubic", points, samples, settings)
        )
    return curves


def _peak_rss_kib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise OSError("no VmHWM in /proc/self/status")


def _rss_kib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise OSError("no VmRSS in /proc/self/status")


def memory_point(op, T, B, S, D):
    """In this (fresh) process: the peak resident memory that one call of ``op`` adds, in KiB,
    and the method that measured it (module docstring)."""
    import gc
    import resource

    torch.set_num_threads(1)
    kalman_op(op, 8, B, S, D)()  # warm-up: lazy initialisation of torch's kernels
    fn = kalman_op(op, T, B, S, D)
    gc.collect()
    rss_before = _rss_kib()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        method = "VmHWM after /proc/self/clear_refs"
    except OSError:
        method = "ru_maxrss minus VmRSS before"
    fn()
    if method.startswith("VmHWM"):
        peak = _peak_rss_kib()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"increase_kib": peak - rss_before, "rss_before_kib": rss_before, "method": method}


def memory_curves(sizes, log):
    curves, methods = [], set()
    for op in ("log_prob", "smooth"):
        points, samples = [], []
        for T in sizes["memory_T"]:
            spec = json.dumps(dict(op=op, T=T, B=16, S=4, D=2))
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--memory-point", spec],
                capture_output=True,
                text=True,
                check=True,
                env=dict(os.environ, OMP_NUM_THREADS="1"),
            )
            res = json.loads(out.stdout.strip().splitlines()[-1])
            methods.add(res["method"])
            mib = max(res["increase_kib"], 4) / 1024  # one page at least: the log needs y > 0
            points.append((T, mib))
            samples.append(res)
            log(f"kalman_memory {op} T={T}: +{mib:.2f} MiB")
        settings = dict(batch=16, state=4, obs=2, dtype="float64", method="auto", unit="MiB")
        curves.append(
            make_curve(f"{op} B=16", "kalman_memory", 1.0, "linear", points, samples, settings)
        )
    return curves, sorted(methods)


# ------------------------------------------------------------------------------ training
def svi_step(kind, B, T, model_sizes, loss=None, grads_only=False):
    """A zero-argument function: one SVI step (or ``loss.loss_and_grads``) of a fresh DMM or
    SRNN on B random binary sequences of length T."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    cls = DMM if kind == "dmm" else SRNN
    model = cls(OBS_DIM, **model_sizes[kind])
    gen = torch.Generator().manual_seed(1)
    x = torch.bernoulli(torch.full((B, T, OBS_DIM), 0.1), generator=gen)
    mask = torch.ones(B, T, dtype=torch.bool)
    loss = loss or Trace_ELBO(max_plate_nesting=1)
    if grads_only:

        def run():
            with pyro.validation_enabled(False):
                out = loss.loss_and_grads(model.model, model.guide, x, mask)
            for p in model.parameters():
                p.grad = None
            return out

        return run
    svi = SVI(model.model, model.guide, Adam({"lr": 1e-3}), loss=loss)

    def step():
        with pyro.validation_enabled(False):
            return svi.step(x, mask)

    return step


def training_curves(sizes, model_sizes, repeats, log):
    curves = []
    for kind in ("dmm", "srnn"):
        points, samples = [], []
        for T in sizes["train_T"]:
            median, times = time_call(svi_step(kind, 16, T, model_sizes), repeats)
            points.append((T, median))
            samples.append(times)
            log(f"train_T {kind} T={T}: {median * 1e3:.1f} ms")
        settings = dict(batch=16, sizes=model_sizes[kind], loss="Trace_ELBO", optim="Adam 1e-3")
        curves.append(make_curve(kind.upper(), "train_T", 1.0, "linear", points, samples, settings))
    T = sizes["train_batch_T"]
    for kind in ("dmm", "srnn"):
        points, samples = [], []
        for B in sizes["train_B"]:
            median, times = time_call(svi_step(kind, B, T, model_sizes), repeats)
            points.append((B, median))
            samples.append(times)
            log(f"train_batch {kind} B={B}: {median * 1e3:.1f} ms")
        settings = dict(num_steps=T, sizes=model_sizes[kind], loss="Trace_ELBO")
        curve = make_curve(
            kind.upper(), "train_batch", 1.0, "at most linear", points, samples, settings
        )
        curve["epoch_slope"] = curve["slope"] - 1  # an epoch of N sequences is N / B steps
        curves.append(curve)
    T, B = sizes["particles_T"], 16
    for name, cls in (("IWAE", IWAE), ("FIVO", FIVO)):
        points, samples = [], []
        for K in sizes["particles_K"]:
            fn = svi_step("srnn", B, T, model_sizes, cls(K, max_plate_nesting=1), True)
            median, times = time_call(fn, repeats)
            points.append((K, median))
            samples.append(times)
            log(f"particles {name} K={K}: {median * 1e3:.1f} ms")
        settings = dict(batch=B, num_steps=T, model="SRNN", sizes=model_sizes["srnn"])
        if name == "FIVO":
            settings.update(resample="ess", ess_threshold=0.5, resampling="systematic")
        curves.append(
            make_curve(f"{name} SRNN", "particles", 1.0, "linear", points, samples, settings)
        )
    return curves


# ------------------------------------------------------------------------------ figures
def plot_group(curves, group, path):
    """One log-log figure: each curve's points, its fitted line over the fitted range (solid)
    and the expected slope through the fitted points' centre (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlabel, ylabel, title = GROUPS[group]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, c in enumerate(curves):
        color = f"C{i}"
        xs, ys = zip(*c["points"])
        ax.plot(xs, ys, "o", color=color, ms=4)
        lo, hi = c["fit_x_range"]
        fx = [lo, hi]
        ax.plot(fx, [math.exp(c["intercept"]) * x ** c["slope"] for x in fx], "-", color=color)
        fitted = [p for p in c["points"] if lo <= p[0] <= hi]
        cx = math.exp(statistics.fmean(math.log(p[0]) for p in fitted))
        cy = math.exp(statistics.fmean(math.log(p[1]) for p in fitted))
        k = c["expected_slope"]
        ax.plot(fx, [cy * (x / cx) ** k for x in fx], ":", color=color, lw=1.5)
        ax.plot(
            [],
            [],
            "o-",
            color=color,
            label=f"{c['name']}: slope {c['slope']:.2f}, last two {c['slope_end']:.2f} "
            f"(expected {k:g})",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} (solid: fit, dotted: expected slope)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------ main
FULL_SIZES = dict(
    kalman_T=[100, 316, 1000, 3162, 10000, 31623, 100000],
    kalman_state_T=1000,
    kalman_S=[2, 4, 8, 16, 32, 64, 128],
    memory_T=[1000, 3162, 10000, 31623, 100000],
    train_T=[25, 50, 100, 200, 400, 800, 1600],
    train_batch_T=100,
    train_B=[1, 4, 16, 64, 256, 1024],
    particles_T=50,
    particles_K=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
)
SMOKE_SIZES = dict(
    kalman_T=[10, 20, 40],
    kalman_state_T=10,
    kalman_S=[2, 4],
    memory_T=[10, 20],
    train_T=[3, 6],
    train_batch_T=3,
    train_B=[1, 2],
    particles_T=3,
    particles_K=[1, 2],
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls per point (median; default 5)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, 1 repeat: a check of the script"
    )
    parser.add_argument(
        "--output",
        default=None,
        help="result JSON (default benchmarks/results/complexity.json; required with --smoke); "
        "the figures go beside it as <stem>_<group>.png",
    )
    parser.add_argument(
        "--no-figures", action="store_true", help="write the JSON only (e.g. a repeat run)"
    )
    parser.add_argument("--memory-point", default=None, help=argparse.SUPPRESS)  # subprocess
    args = parser.parse_args(argv)
    if args.smoke and args.output is None and args.memory_point is None:
        parser.error("--smoke writes only --output: pass --output PATH")
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 5
    if args.repeats < 1 or args.threads < 1:
        parser.error(f"--repeats and --threads must be >= 1, got {args.repeats}, {args.threads}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.memory_point is not None:
        spec = json.loads(args.memory_point)
        print(json.dumps(memory_point(spec["op"], spec["T"], spec["B"], spec["S"], spec["D"])))
        return None
    torch.set_num_threads(args.threads)
    sizes = SMOKE_SIZES if args.smoke else FULL_SIZES
    model_sizes = (
        dict(dmm=SMOKE_DMM_SIZES, srnn=SMOKE_SRNN_SIZES)
        if args.smoke
        else dict(dmm=DMM_SIZES, srnn=SRNN_SIZES)
    )
    started = time.perf_counter()

    def log(message):
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", flush=True)

    loads = {"start": load_average()}
    curves = kalman_curves(sizes, args.repeats, log)
    loads["after_kalman"] = load_average()
    memory, memory_methods = memory_curves(sizes, log)
    curves += memory
    loads["after_memory"] = load_average()
    curves += training_curves(sizes, model_sizes, args.repeats, log)
    loads["end"] = load_average()

    output = Path(args.output) if args.output else RESULTS / "complexity.json"
    figures = {}
    for group in () if args.no_figures else GROUPS:
        path = output.with_name(f"{output.stem}_{group}.png")
        output.parent.mkdir(parents=True, exist_ok=True)
        plot_group([c for c in curves if c["group"] == group], group, path)
        figures[group] = path.name
    result = {
        "benchmark": "complexity",
        "smoke": args.smoke,
        "pyro_seq": pyro_seq.__version__,
        "load_average": loads,
        "load_average_note": "1-, 5- and 15-minute load averages (os.getloadavg) before and "
        "after each group; above the core count the machine ran other jobs beside this one",
        "settings": {
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "timing": "median wall-clock seconds of the timed calls after one warm-up call",
            "slope": "least squares of log y on log x over the upper half of the points "
            "(fit_x_range); slope_all over every point; slope_end through the last two",
            "memory_method": memory_methods,
            "sizes": sizes,
            "model_sizes": model_sizes,
            "obs_dim": OBS_DIM,
            "wall_seconds": time.perf_counter() - started,
        },
        "figures": figures,
        "curves": curves,
    }
    write_result("complexity", result, path=output)
    for c in curves:
        print(
            f"{c['group']:<14} {c['name']:<20} slope {c['slope']:6.3f} (all {c['slope_all']:6.3f}"
            f", end {c['slope_end']:6.3f})"
            f"  expected {c['expected']} ({c['expected_slope']:g})"
        )
    return result


if __name__ == "__main__":
    main()
