"""Seconds per JSB Chorales training epoch of every latent-variable model, by objective.

For each model of the model zoo (``benchmarks/paper/zoo_jsb.py``: DMM, SRNN, VRNN, VAE-RNN,
STORN, VOSP, VRAE, the RNN baseline) at its default sizes (``MODELS[name].for_data(88)``) and each
objective it declares among ``--objectives`` (default ``elbo``, ``iwae``, ``fivo`` with
``--particles`` 4, built by :func:`pyro_seq.train.objectives.make_objective` as the trainer
builds them), one training epoch is the 12 minibatches of 20 of the 229 training chorales of
that repeat's shuffle (:class:`pyro_seq.data.SequenceLoader`, seeded), each an ``SVI.step`` with
``ClippedAdam`` (lr 1e-3, clip 10) and Pyro validation off, as ``pyro_seq.train`` runs it.
After one warm-up step, ``--repeats`` epochs per cell alternate between the cells (the cell
order rotates every repeat) so that machine load affects them alike; process CPU seconds and
wall seconds per epoch, median of the repeats, one thread (``--threads``).

Results go to ``benchmarks/results/epoch_speed.json`` (``--output`` elsewhere) with the revision
(``git describe``), the machine and the load averages before and after. ``--smoke``: two
models at tiny sizes on random rolls, 2 minibatches, 1 repeat (the test suite's check).

    python benchmarks/speed/epoch_speed.py --repeats 3
    python benchmarks/speed/epoch_speed.py --smoke --output /tmp/epoch_speed.json
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
sys.path.insert(2, str(Path(__file__).resolve().parents[1] / "paper"))  # zoo_jsb's model list

import pyro  # noqa: E402
import torch  # noqa: E402
from common import SHARED_DATA, machine_info, write_result  # noqa: E402
from pyro.infer import SVI  # noqa: E402
from pyro.optim import ClippedAdam  # noqa: E402
from zoo_jsb import ZOO_MODELS  # noqa: E402

from pyro_seq.data import SequenceLoader, load_piano_rolls  # noqa: E402
from pyro_seq.models import MODELS  # noqa: E402
from pyro_seq.train.objectives import make_objective  # noqa: E402

OBS_DIM = 88
BATCH_SIZE = 20


def random_rolls(num, min_len, max_len, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num,), generator=g).tolist()
    return [(torch.rand(n, OBS_DIM, generator=g) < 0.1).float() for n in lengths]


def cells(models, objectives):
    """``[(model, objective), ...]`` for the objectives each model declares."""
    out = []
    for name in models:
        declared = MODELS[name].objectives
        out += [(name, o) for o in objectives if o in declared]
    return out


class Cell:
    """One model trained with one objective: its own SVI, stepping through the minibatches."""

    def __init__(self, name, objective, particles, smoke):
        cls = MODELS[name]
        pyro.clear_param_store()
        torch.manual_seed(0)
        options = dict(cls.small_example["options"]) if smoke else {}
        self.model = cls.for_data(OBS_DIM, 0, **options)
        self.model.module_name = f"{name}_{objective}"  # separate parameters in the store
        loss = make_objective(objective, particles if objective != "elbo" else 1)
        optim = ClippedAdam({"lr": 1e-3, "clip_norm": 10.0})
        self.svi = SVI(self.model.model, self.model.guide, optim, loss=loss)

    def step(self, x, mask):
        loss = self.svi.step(x, mask)
        if loss != loss or abs(loss) == float("inf"):
            raise FloatingPointError(f"non-finite loss {loss}")
        return loss


def load_average():
    return list(os.getloadavg())


def revision():
    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(ZOO_MODELS), choices=ZOO_MODELS)
    p.add_argument("--objectives", nargs="+", default=["elbo", "iwae", "fivo"])
    p.add_argument("--particles", type=int, default=4, help="K of iwae and fivo")
    p.add_argument("--repeats", type=int, default=3, help="timed epochs per cell")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default=str(SHARED_DATA / "jsb_chorales.pickle"))
    p.add_argument(
        "--output", default=None, help="JSON path (default benchmarks/results/epoch_speed.json)"
    )
    p.add_argument("--smoke", action="store_true", help="tiny models, random rolls, 1 repeat")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.smoke:
        models, repeats, max_batches = ["dmm", "vrnn"], 1, 2
        data_name, seqs = "random rolls (smoke)", random_rolls(40, 5, 15, seed=0)
    else:
        models, repeats, max_batches = args.models, args.repeats, None
        if not Path(args.data).is_file():
            raise SystemExit(f"epoch_speed: JSB Chorales not found at {args.data} (--data)")
        data_name = args.data
        seqs = load_piano_rolls(args.data, splits=("train",))["train"]
    loader = SequenceLoader(seqs, BATCH_SIZE, shuffle=True, seed=0)
    todo = cells(models, args.objectives)
    built = {c: Cell(*c, args.particles, args.smoke) for c in todo}
    wall = {c: [] for c in todo}
    cpu = {c: [] for c in todo}
    load_before = load_average()
    with pyro.validation_enabled(False):
        x0, m0 = next(iter(loader.batches(0)))
        for cell in built.values():  # warm-up
            cell.step(x0, m0)
        for r in range(repeats):
            batches = list(loader.batches(r + 1))[:max_batches]
            order = todo[r % len(todo) :] + todo[: r % len(todo)]
            for c in order:
                w0, c0 = time.perf_counter(), time.process_time()
                for x, mask in batches:
                    built[c].step(x, mask)
                wall[c].append(time.perf_counter() - w0)
                cpu[c].append(time.process_time() - c0)
    rows = {}
    for name, objective in todo:
        key = f"{name}/{objective}"
        rows[key] = {
            "model": name,
            "objective": objective,
            "particles": 1 if objective == "elbo" else args.particles,
            "cpu_seconds_per_epoch": cpu[(name, objective)],
            "wall_seconds_per_epoch": wall[(name, objective)],
            "median_cpu_seconds": statistics.median(cpu[(name, objective)]),
            "median_wall_seconds": statistics.median(wall[(name, objective)]),
        }
        print(f"{key:16s} {rows[key]['median_cpu_seconds']:7.3f} CPU s / epoch", flush=True)
    result = {
        "benchmark": "epoch_speed",
        "data": data_name,
        "settings": {
            "batch_size": BATCH_SIZE,
            "batches_per_epoch": max_batches or len(loader),
            "repeats": repeats,
            "threads": args.threads,
            "optimizer": "ClippedAdam(lr 1e-3, clip_norm 10)",
            "pyro_validation": False,
            "sizes": "small_example" if args.smoke else "defaults",
            "order": "alternating epochs, cell order rotated each repeat",
        },
        "cells": rows,
        "revision": revision(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "machine": machine_info(),
    }
    if args.output or not args.smoke:
        write_result("epoch_speed", result, args.output)
    return result


if __name__ == "__main__":
    main()
