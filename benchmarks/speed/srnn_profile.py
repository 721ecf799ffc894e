"""Profile of the package's SRNN training step (the ``pyro_seq`` side of ``srnn_speed.py``).

Paper sizes, batches of 16 JSB-2x training windows, ``SVI`` with ``Trace_ELBO`` and Adam,
Pyro validation off, 1 thread. After 2 warm-up steps, ``--steps`` steps run under
:mod:`cProfile` (Python functions by own time, and by cumulative time) and again under
:mod:`torch.profiler` (operators by own CPU time); the three tables go to stdout and to
``--output`` (e.g. ``benchmarks/results/srnn_profile_before.txt``).

    python benchmarks/speed/srnn_profile.py --output benchmarks/results/srnn_profile_after.txt

``--fivo`` instead times one ``loss_and_grads`` step of FIVO(4) against IWAE(4) for the SRNN of
the ``srnn_jsb2x`` preset (GRU 300, z 100, MLPs 500; batch 16, T 100, float32, 1 thread), with
FIVO as committed at ``--before`` (default ``HEAD``, with that revision's resampling module) and
as in the working tree, alternating the three in every round on the same batches (the machine
is shared: wall and CPU time are both recorded). A check first requires the two FIVOs' loss and
every gradient to be equal (``torch.equal``) for the same seed. Then one step of each runs
under cProfile and FIVO's under torch.profiler; JSON to ``--output`` (e.g.
``benchmarks/results/srnn_fivo_iwae_ratio.json``), tables next to it (``.txt``).

    python benchmarks/speed/srnn_profile.py --fivo --rounds 12 \
        --output benchmarks/results/srnn_fivo_iwae_ratio.json
"""

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import pyro  # noqa: E402
import srnn_speed  # noqa: E402
import torch  # noqa: E402
from common import SHARED_DATA, machine_info  # noqa: E402

import pyro_seq  # noqa: E402
from pyro_seq.data import SequenceLoader, load_piano_rolls  # noqa: E402
from pyro_seq.models import SRNN  # noqa: E402


def load_revision(rev, path, name):
    """The module ``path`` (repository-relative) as committed at ``rev``, imported as ``name``."""
    import importlib.util
    import subprocess

    root = Path(__file__).resolve().parents[2]
    src = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(src, f"{rev}:{path}", "exec"), module.__dict__)
    sys.modules[name] = module
    return module


def fivo_against_iwae(args):
    """FIVO(4) before/after against IWAE(4): equality check, alternating timings, profiles."""
    import json
    import statistics

    from torch.profiler import ProfilerActivity, profile

    from pyro_seq.infer import FIVO, IWAE
    from pyro_seq.presets.catalogue import get_preset

    torch.set_num_threads(1)
    pyro.enable_validation(False)
    old_resampling = load_revision(args.before, "pyro_seq/ops/resampling.py", "resampling_before")
    old = load_revision(args.before, "pyro_seq/infer/fivo.py", "fivo_before")
    old.resample = old_resampling.resample
    old.effective_sample_size = old_resampling.effective_sample_size
    options = dict(get_preset("srnn_jsb2x").model_options)
    seqs = load_piano_rolls(args.data, splits=("train",))["train"]
    loader = SequenceLoader(seqs, srnn_speed.BATCH_SIZE, shuffle=True, seed=0)
    batches = list(loader.batches(0))[: args.batches]
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = SRNN(88, **options)
    K = args.particles
    losses = {
        "fivo_before": old.FIVO(num_particles=K),
        "fivo_after": FIVO(num_particles=K),
        "iwae": IWAE(num_particles=K),
    }
    params = list(model.parameters())

    def run(name, x, mask):
        out = losses[name].loss_and_grads(model.model, model.guide, x, mask)
        grads = [None if p.grad is None else p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        return out, grads

    # the estimator is unchanged: same seed, same loss and gradients, bit for bit
    x, mask = batches[0]
    results = {}
    for name in ("fivo_before", "fivo_after"):
        pyro.set_rng_seed(1)
        results[name] = run(name, x, mask)
    (lb, gb), (la, ga) = results["fivo_before"], results["fivo_after"]
    equal = lb == la and all((u is None and v is None) or torch.equal(u, v) for u, v in zip(gb, ga))
    if not equal:
        raise SystemExit(f"FIVO before and after differ: loss {lb} against {la}")
    for name in losses:  # warm-up
        run(name, x, mask)
    wall = {name: [] for name in losses}
    cpu = {name: [] for name in losses}
    for r in range(args.rounds):
        x, mask = batches[r % len(batches)]
        order = list(losses) if r % 2 == 0 else list(reversed(losses))
        for name in order:
            w0, c0 = time.perf_counter(), time.process_time()
            run(name, x, mask)
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)

    def ratios(times, name):
        per_round = [a / b for a, b in zip(times[name], times["iwae"])]
        return dict(
            median_of_ratios=statistics.median(per_round),
            ratio_of_medians=statistics.median(times[name]) / statistics.median(times["iwae"]),
            min_ratio=min(per_round),
            max_ratio=max(per_round),
        )

    out = io.StringIO()
    profiles = {}
    x, mask = batches[0]
    for name in losses:
        profiler = cProfile.Profile()
        profiler.enable()
        run(name, x, mask)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).strip_dirs().sort_stats("tottime").print_stats(
            args.rows
        )
        out.write(f"\n=== cProfile, one {name} loss_and_grads step, by own time ===\n")
        out.write(text.getvalue())
        stats = pstats.Stats(profiler).stats
        profiles[name] = {
            f"{Path(file).name}:{func}": round(entry[3] * 1e3, 2)
            for (file, _, func), entry in stats.items()
            if func
            in (
                "log_z",
                "_step_log_weight",
                "resample",
                "effective_sample_size",
                "gather_particles",
                "_combine",
                "_prepare_state",
                "run",
                "run_backward",
            )
        }
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run("fivo_after", x, mask)
    out.write("\n=== torch.profiler, one FIVO step (after), operators by self CPU time ===\n")
    out.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    info = machine_info()
    result = dict(
        benchmark="FIVO(K) loss_and_grads step against IWAE(K), SRNN of preset srnn_jsb2x",
        settings=dict(
            model_options=options,
            batch_size=srnn_speed.BATCH_SIZE,
            particles=K,
            fivo=dict(resample="ess", ess_threshold=0.5, resampling="systematic"),
            dtype="float32",
            threads=1,
            pyro_validation=False,
            rounds=args.rounds,
            batches=len(batches),
            before=args.before,
            order="the three alternate in every round, order reversed every other round",
        ),
        equal_loss_and_gradients=equal,
        median_seconds={k: statistics.median(v) for k, v in wall.items()},
        median_cpu_seconds={k: statistics.median(v) for k, v in cpu.items()},
        ratio_wall={k: ratios(wall, k) for k in ("fivo_before", "fivo_after")},
        ratio_cpu={k: ratios(cpu, k) for k in ("fivo_before", "fivo_after")},
        cprofile_cumulative_ms=profiles,
        load_average=list(os.getloadavg()),
        machine=info,
        pyro_seq=str(Path(pyro_seq.__file__).parent),
    )
    summary = json.dumps(
        {k: result[k] for k in ("median_seconds", "median_cpu_seconds", "ratio_wall", "ratio_cpu")},
        indent=1,
    )
    print(out.getvalue())
    print(summary)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
        Path(args.output).with_suffix(".txt").write_text(summary + "\n" + out.getvalue())
        print(f"wrote {args.output}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="profiled SVI steps")
    parser.add_argument("--rows", type=int, default=25, help="rows per table")
    parser.add_argument("--data", default=str(SHARED_DATA / "jsb_chorales_2x.pickle"))
    parser.add_argument("--output", default=None, help="text file for the tables")
    parser.add_argument("--fivo", action="store_true", help="FIVO(K) against IWAE(K) instead")
    parser.add_argument("--before", default="HEAD", help="--fivo: revision of the old FIVO")
    parser.add_argument("--rounds", type=int, default=12, help="--fivo: timed rounds")
    parser.add_argument("--batches", type=int, default=4, help="--fivo: batches cycled")
    parser.add_argument("--particles", type=int, default=4, help="--fivo: K")
    args = parser.parse_args(argv)
    if args.fivo:
        return fivo_against_iwae(args)
    torch.set_num_threads(1)
    seqs = load_piano_rolls(args.data, splits=("train",))["train"]
    batches = list(SequenceLoader(seqs, srnn_speed.BATCH_SIZE, shuffle=True, seed=0).batches(0))
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    impl = srnn_speed.PyroSeqImpl(SRNN(88, **srnn_speed.MODEL))
    for x, mask in batches[:2]:
        impl.step(x, mask)
    steps = batches[2 : 2 + args.steps]
    start, cpu = time.perf_counter(), time.process_time()
    for x, mask in steps:
        impl.step(x, mask)
    seconds = (time.perf_counter() - start) / len(steps)
    cpu = (time.process_time() - cpu) / len(steps)

    out = io.StringIO()
    info = machine_info()
    out.write(
        f"SRNN SVI step, paper sizes, batch {srnn_speed.BATCH_SIZE}, T 100, 1 thread: "
        f"{seconds * 1e3:.0f} ms wall, {cpu * 1e3:.0f} ms CPU per step (mean of "
        f"{len(steps)}, unprofiled; the machine is shared, compare the counts)\n"
        f"pyro_seq from {Path(pyro_seq.__file__).parent}\n"
        f"{info['cpu']}; torch {info['torch']}, pyro {info['pyro']}, {info['date']}\n"
    )
    profiler = cProfile.Profile()
    profiler.enable()
    for x, mask in steps:
        impl.step(x, mask)
    profiler.disable()
    for key in ("tottime", "cumtime"):
        out.write(f"\n=== cProfile, {len(steps)} steps, sorted by {key} ===\n")
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(key).print_stats(args.rows)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x, mask in steps:
            impl.step(x, mask)
    out.write(f"\n=== torch.profiler, {len(steps)} steps, operators by self CPU time ===\n")
    out.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    text = out.getvalue()
    print(text)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
