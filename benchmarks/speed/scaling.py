"""Data-parallel scaling on one machine: training sequences per second with N processes.

What is measured. :func:`pyro_seq.train.fit` with ``TrainConfig(world_size=N, num_threads=1)``,
the path ``pyro-seq train --nproc N --threads 1`` takes (N = 1 is the ordinary one-process
loop, N > 1 spawns N ranks that each train on the rows ``rank::N`` of every minibatch and sum
their gradients with one all-reduce per update, :mod:`pyro_seq.train.distributed`), for two
models at the sizes of the existing benchmarks:

* SRNN (``jsb_srnn.py``: GRU 300, z 100, MLPs 500, smoothing + Res_q), minibatch 16;
* DMM (``jsb_dmm.py``: z 100, transition 200, emission 100, backward ReLU RNN 600), minibatch 20;

both on the 229 training sequences of the original-resolution JSB Chorales
(``../shared/data/polyphonic/jsb_chorales.pickle``) with the training settings of those
scripts (their ``CONFIG``; the schedules do not change the work per update), no validation set,
no early stopping. A cell (model, N) is one ``fit`` call of ``--warmup`` + ``--epochs`` epochs
(default 1 + 6 for the SRNN, 1 + 15 for the DMM: 15 and 12 updates per epoch); its throughput
is the training sequences of the measured epochs divided by their summed ``seconds`` from the
training log (rank 0's clock: the minibatch loop of an epoch, which ends
with the last all-reduce, so all ranks are done; validation, checkpoints and the spawn of the
processes are outside it and are reported separately as the cell's wall time). The warm-up
epochs (first allocations, lazy parameter creation, the optimizer's state) are excluded. Cells
run ``--repeats`` times, the order of N rotating each repeat so that a change of machine load
hits every N alike; per N the median over repeats is reported, and the scaling efficiency
``throughput_N / (N * throughput_1)`` (1 = perfect, 1/N = no gain). The JSON also holds every
repeat, the machine (CPU, cores, the cores this process may use), the load average at the start
and the end (a measurement under load > 0.5 is not a measurement of this code), library versions
and all settings.

    python benchmarks/speed/scaling.py                      # about 10 minutes on 2 quiet cores
    python benchmarks/speed/scaling.py --smoke --output /tmp/scaling.json   # seconds, tiny data

``--smoke``: tiny synthetic data and tiny models, one repeat of 1 + 1 epochs, to check the
script (it writes ``--output`` only; the default result file is never replaced by a smoke run).

What limits scaling on 2 cores (read off the code). Per update every rank runs the whole
Python program of an SVI step on its half of the minibatch: Pyro traces the model and the
guide, one ``pyro.sample`` site and a few small matrix products per time step, with the
minibatch padded to its longest sequence *before* it is sharded (``SequenceLoader`` pads, then
``ProcessGroup.shard`` takes rows), so each rank loops over as many time steps as the one
process did. Halving the rows halves the arithmetic but not the Python, Pyro and dispatcher
overhead per operation, which at 8-10 rows of 300-600 units is a large share of an update;
that share does not shrink with N. Then ``AllReduceGradients`` flattens every parameter's
gradient into one tensor and all-reduces it with gloo after every update: 1.82 M float32
values (7.3 MB) for the SRNN, 0.73 M (2.9 MB) for the DMM, copied into and out of the flat
buffer, each rank sending and receiving about the buffer's size over gloo's loopback TCP
transport (ring reduce-scatter, then all-gather). The script times that all-reduce alone
(``allreduce_seconds_per_update``, and its share of the measured epoch): 8-9 ms for the SRNN's
buffer and 3-7 ms for the DMM's with 2 processes on this machine (under load), against updates of
several hundred milliseconds, about 1% or less. It is also a barrier, so every update waits for the
slower rank (the shards are nearly even: both loop over the padded length, and the last
batch of 229 = 14 x 16 + 5 gives 3 and 2 rows; a rank slowed by anything else holds both up).
Each rank reads all the weight matrices at every time step; at these row counts a product does
few operations per weight it reads, so it is limited by cache and memory bandwidth more than by
arithmetic, and two ranks read two private copies (2 x 7.3 MB for the SRNN) through one shared
cache and memory bus. Last,
there are only 2 cores: with N = 2 both are busy training, and everything else, the kernel,
gloo's I/O threads, rank 0's checkpoint and log writing at each epoch end (rank 1 waits for it
at the next collective), the parent process and any other job on the machine, takes its time
from a rank and, through the per-update barrier, from both; with N = 1 and one thread it runs
on the idle core. Hence: expect an efficiency well below 1 on this machine; the number says
how much of the second core data parallelism turns into training.

Past one machine (the plan; not implemented). The package spawns its ranks itself
(``torch.multiprocessing.spawn`` in ``pyro_seq.train.processes.fit_processes``) and joins them
on ``MASTER_ADDR=127.0.0.1`` and a free local port (``init_process_group``). On several nodes the
launcher would be ``torchrun``::

    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint node0.example:29500 --rdzv-id srnn-jsb \\
        -m pyro_seq.cli train --model srnn --device cuda --out /shared/runs/srnn

torchrun starts the processes on every node and sets ``RANK`` (global), ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node) and ``MASTER_ADDR`` /
``MASTER_PORT`` (the rendezvous). ``fit`` would then not spawn: when ``WORLD_SIZE`` is in the
environment it calls ``torch.distributed.init_process_group(backend, init_method="env://")``
once, builds ``ProcessGroup(rank=int(RANK), world_size=int(WORLD_SIZE), device=...)`` from
those variables (``TrainConfig.world_size`` must agree or be left at 1) and runs ``_fit``
directly in the launched process. On GPUs the backend is ``nccl`` (``default_backend``) and the
device ``cuda:LOCAL_RANK``: ``rank_device`` (``cuda:index+rank``) counts global ranks and
would be wrong on every node but the first. Data: today every rank holds the whole training
set and the same shuffled minibatches and takes rows ``rank::N``; that stays right on many nodes
(each process loads the file, as the CLI does) while the data fit in memory. For larger data each
node would read only its part (sequences ``rank::WORLD_SIZE``) with a loader seeded alike on
every rank and the same number of minibatches per epoch on every rank (the shortest shard's, or
padded with empty batches, which ``AllReduceGradients`` already accepts), since every rank must
call the per-update all-reduce equally often. Checkpoints: written by global rank 0 only (rank 0
of node 0), as now; but every rank reads ``checkpoint.pt`` to resume and ``best.pt`` at the end,
so ``--out`` must be on a file system all nodes share, or rank 0 must send the state to the
others (``broadcast_object_list``) instead. The per-rank random states are already gathered into
the checkpoint, so a resumed multi-node run needs the same ``WORLD_SIZE``. Between nodes the
all-reduce of 7.3 MB per update crosses the network (ring all-reduce sends 2 (N-1)/N times
the buffer per rank: about 12 ms at 10 Gbit/s for large N), still small against an SRNN update,
while the per-rank Python overhead above stays: scaling across nodes pays when each rank keeps a
minibatch share large enough to amortise it (raise the batch size with N, and the learning rate
with care). The command line's own work around ``fit`` (``config.json``, the test evaluation,
its printing) would also be left to global rank 0.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
sys.path.insert(2, str(Path(__file__).resolve().parents[1] / "paper"))  # jsb_srnn, jsb_dmm
sys.path.insert(0, str(ROOT))  # this checkout's package (and so in the spawned ranks)

import torch  # noqa: E402
from common import SHARED_DATA, machine_info, write_result  # noqa: E402

from pyro_seq.data import load_piano_rolls  # noqa: E402
from pyro_seq.models import DMM, SRNN  # noqa: E402
from pyro_seq.train import fit  # noqa: E402

MODELS = ("srnn", "dmm")


def model_setups(smoke):
    """``name -> (builder, model settings, TrainConfig)`` at the existing benchmarks' sizes, or
    tiny ones for ``--smoke``."""
    import jsb_dmm
    import jsb_srnn

    if smoke:
        srnn = dict(d_dim=8, z_dim=2, hidden_dim=8)
        dmm = dict(z_dim=2, transition_dim=8, emission_dim=8, rnn_dim=8)
        return {
            "srnn": (SRNN, srnn, replace(jsb_srnn.CONFIG, batch_size=4)),
            "dmm": (DMM, dmm, replace(jsb_dmm.CONFIG, batch_size=4)),
        }
    return {
        "srnn": (SRNN, jsb_srnn.MODEL, jsb_srnn.CONFIG),
        "dmm": (DMM, jsb_dmm.MODEL, jsb_dmm.CONFIG),
    }


def smoke_data(num=16, dim=88, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(5 + i % 6, dim, generator=g) < 0.1).float() for i in range(num)]


def _allreduce_worker(rank, world_size, port, numel, iters, result_path):
    import torch.distributed as dist

    from pyro_seq.train.distributed import init_process_group

    torch.set_num_threads(1)
    init_process_group(rank, world_size, port)
    try:
        flat = torch.zeros(numel)
        times = []
        for _i in range(iters + 3):  # 3 warm-up calls
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - t)
        if rank == 0:
            Path(result_path).write_text(repr(statistics.median(times[3:])))
    finally:
        dist.destroy_process_group()


def allreduce_seconds(numel, nproc, iters=20):
    """Median seconds of one gloo all-reduce of ``numel`` float32 values over ``nproc``
    processes (one thread each): the communication ``AllReduceGradients`` adds per update."""
    import torch.multiprocessing as mp

    from pyro_seq.train.distributed import free_port

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "seconds"
        mp.spawn(
            _allreduce_worker,
            nprocs=nproc,
            join=True,
            args=(nproc, free_port(), numel, iters, str(path)),
        )
        return float(path.read_text())


def run_cell(name, setup, train, nproc, warmup, epochs, work_dir):
    """One ``fit`` of ``warmup + epochs`` epochs with ``nproc`` processes; the measured epochs'
    throughput (training sequences per second of rank 0's epoch clock) and the wall time."""
    build, settings, base = setup
    config = replace(
        base,
        epochs=warmup + epochs,
        world_size=nproc,
        num_threads=1,
        progress=False,
        patience=None,
        time_limit=None,
    )
    torch.manual_seed(0)
    model = build(train[0].shape[-1], **settings)
    out = Path(tempfile.mkdtemp(prefix=f"{name}_n{nproc}_", dir=work_dir))
    started = time.perf_counter()
    history = fit(model, train, [], config, out, resume=False)
    wall = time.perf_counter() - started
    seconds = [row["seconds"] for row in history]
    measured = seconds[warmup:]
    return {
        "epoch_seconds": seconds,
        "warmup_epochs": warmup,
        "measured_epochs": len(measured),
        "sequences_per_epoch": len(train),
        "updates_per_epoch": history[-1]["step"] // len(history),
        "sequences_per_second": len(train) * len(measured) / sum(measured),
        "wall_seconds_fit": wall,
    }


def measure(models, nprocs, train, warmup, epochs, repeats, smoke, work_dir, log=print):
    setups = model_setups(smoke)
    results = {}
    cells = len(models) * len(nprocs) * repeats
    done, started = 0, time.time()
    for name in models:
        runs = {n: [] for n in nprocs}
        for r in range(repeats):
            order = nprocs[r % len(nprocs) :] + nprocs[: r % len(nprocs)]  # rotate per repeat
            for n in order:
                cell = run_cell(name, setups[name], train, n, warmup, epochs, work_dir)
                runs[n].append(cell)
                done += 1
                elapsed = time.time() - started
                log(
                    f"[{done}/{cells}] {name} N={n} repeat {r + 1}/{repeats}: "
                    f"{cell['sequences_per_second']:.2f} seq/s (epochs "
                    f"{', '.join(f'{s:.2f}' for s in cell['epoch_seconds'])} s; fit wall "
                    f"{cell['wall_seconds_fit']:.1f} s; load {os.getloadavg()[0]:.2f}); about "
                    f"{elapsed / done * (cells - done) / 60:.1f} min left"
                )
        per_n = {}
        for n in nprocs:
            values = [c["sequences_per_second"] for c in runs[n]]
            per_n[str(n)] = {
                "sequences_per_second_median": statistics.median(values),
                "sequences_per_second_repeats": values,
                "cells": runs[n],
            }
        base = per_n["1"]["sequences_per_second_median"] if 1 in nprocs else None
        for n in nprocs:
            entry = per_n[str(n)]
            entry["speedup"] = entry["sequences_per_second_median"] / base if base else None
            entry["efficiency"] = (
                entry["sequences_per_second_median"] / (n * base) if base else None
            )
        build, settings, config = setups[name]
        numel = sum(p.numel() for p in build(train[0].shape[-1], **settings).parameters()) + 1
        for n in nprocs:
            if n > 1:  # the communication alone, and its share of the measured epochs
                entry = per_n[str(n)]
                ar = allreduce_seconds(numel, n)
                cell = entry["cells"][0]
                seconds = statistics.median(
                    s for c in entry["cells"] for s in c["epoch_seconds"][c["warmup_epochs"] :]
                )
                entry["allreduce_seconds_per_update"] = ar
                entry["allreduce_share_of_epoch"] = ar * cell["updates_per_epoch"] / seconds
                log(
                    f"{name} N={n}: one all-reduce of {numel} values {ar * 1e3:.1f} ms, "
                    f"{100 * entry['allreduce_share_of_epoch']:.1f}% of a measured epoch"
                )
        results[name] = {
            "model": dict(settings),
            "batch_size": config.batch_size,
            "num_parameters": numel - 1,
            "train": {
                k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()
            },
            "per_nproc": per_n,
        }
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument(
        "--nprocs",
        type=int,
        nargs="+",
        default=[1, 2],
        help="numbers of processes (the first must be 1 for the efficiency)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        nargs="+",
        default=None,
        help="measured epochs per cell, one value or one per model (default: srnn 6, dmm 15)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="epochs excluded per cell")
    parser.add_argument("--repeats", type=int, default=3, help="cells per (model, N)")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "jsb_chorales.pickle")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="result JSON (default benchmarks/results/scaling.json; with "
        "--smoke nothing is written unless this is given)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny synthetic data and models, 1 repeat of 1 + 1 epochs",
    )
    args = parser.parse_args(argv)
    defaults = {"srnn": 6, "dmm": 15}
    if args.smoke:
        args.epochs, args.warmup, args.repeats = [1], 1, 1
    epochs = args.epochs or [defaults[m] for m in args.models]
    if len(epochs) == 1:
        epochs = epochs * len(args.models)
    if len(epochs) != len(args.models):
        raise SystemExit("--epochs: one value, or one per model")
    if min(args.nprocs) < 1 or sorted(set(args.nprocs)) != args.nprocs:
        raise SystemExit("--nprocs: increasing positive numbers, e.g. 1 2")
    if args.smoke:
        train, data_name = smoke_data(), "synthetic (smoke)"
    else:
        if not args.data.exists():
            raise SystemExit(f"data file {args.data} not found; pass --data PATH")
        train, data_name = load_piano_rolls(args.data)["train"], args.data.name
    load_start = os.getloadavg()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    print(
        f"scaling: models {args.models}, N {args.nprocs}, {len(train)} training sequences "
        f"({data_name}), warm-up {args.warmup} + {dict(zip(args.models, epochs))} epochs, "
        f"{args.repeats} repeat(s); load average {load_start[0]:.2f} {load_start[1]:.2f} "
        f"{load_start[2]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    started = time.time()
    results = {}
    with tempfile.TemporaryDirectory(prefix="pyro_seq_scaling_") as work_dir:
        for name, n_epochs in zip(args.models, epochs):
            results.update(
                measure(
                    [name],
                    args.nprocs,
                    train,
                    args.warmup,
                    n_epochs,
                    args.repeats,
                    args.smoke,
                    work_dir,
                    log=lambda s: print(s, flush=True),
                )
            )
    load_end = os.getloadavg()
    payload = {
        "benchmark": "scaling",
        "smoke": args.smoke,
        "what": "training sequences per second of fit(TrainConfig(world_size=N, num_threads=1)) "
        "(pyro-seq train --nproc N --threads 1), measured epochs only (rank 0's "
        "minibatch-loop clock), median over repeats; efficiency = throughput_N / "
        "(N * throughput_1)",
        "data": data_name,
        "num_train_sequences": len(train),
        "settings": {
            "models": args.models,
            "nprocs": args.nprocs,
            "warmup_epochs": args.warmup,
            "measured_epochs": dict(zip(args.models, epochs)),
            "repeats": args.repeats,
            "threads_per_process": 1,
            "validation": False,
            "backend": "gloo",
            "device": "cpu",
        },
        "machine_state": {
            "cores": os.cpu_count(),
            "usable_cores": usable,
            "load_average_start": list(load_start),
            "load_average_end": list(load_end),
        },
        "versions": {k: machine_info()[k] for k in ("python", "torch", "pyro")},
        "wall_seconds": time.time() - started,
        "results": results,
    }
    for name, r in results.items():
        line = ", ".join(
            f"N={n}: {v['sequences_per_second_median']:.2f} seq/s"
            + (f" (efficiency {v['efficiency']:.2f})" if v["efficiency"] else "")
            for n, v in r["per_nproc"].items()
        )
        print(f"{name}: {line}")
    print(f"load average at the end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    if args.smoke and args.output is None:
        print("smoke run: nothing written (pass --output PATH to keep it)")
        return payload
    write_result("scaling", payload, path=args.output)
    return payload


if __name__ == "__main__":
    main()
