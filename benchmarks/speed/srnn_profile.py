"""Profile of the package's SRNN training step (the ``pyro_seq`` side of ``srnn_speed.py``).

Paper sizes, batches of 16 JSB-2x training windows, ``SVI`` with ``Trace_ELBO`` and Adam,
Pyro validation off, 1 thread. After 2 warm-up steps, ``--steps`` steps run under
:mod:`cProfile` (Python functions by own time, and by cumulative time) and again under
:mod:`torch.profiler` (operators by own CPU time); the three tables go to stdout and to
``--output`` (e.g. ``benchmarks/results/srnn_profile_before.txt``).

    python benchmarks/speed/srnn_profile.py --output benchmarks/results/srnn_profile_after.txt
"""

import argparse
import cProfile
import io
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="profiled SVI steps")
    parser.add_argument("--rows", type=int, default=25, help="rows per table")
    parser.add_argument("--data", default=str(SHARED_DATA / "jsb_chorales_2x.pickle"))
    parser.add_argument("--output", default=None, help="text file for the tables")
    args = parser.parse_args(argv)
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
