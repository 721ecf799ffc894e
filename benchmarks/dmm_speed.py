"""Seconds per training epoch of the DMM: pyro-seq vs the structure of Pyro's examples/dmm.py.

Both use the sizes of Pyro's example (z 100, transition 200, emission 100, backward ReLU RNN
600), minibatches of 20 sequences of the original-resolution JSB Chorales training set (229
sequences), ClippedAdam and Trace_ELBO. The implementations see the same minibatches and run
alternately in one process, so machine load affects them alike; wall time and process CPU time
are both recorded. Four variants: the Pyro-example structure as it runs by default (Pyro
validation on) and with validation off, pyro-seq's DMM with validation on, and pyro-seq as its
trainer runs it (validation off, see ``pyro_seq.train.trainer``). The headline ratio is
pyro-seq-as-trained over the Pyro example as it runs; the like-for-like ratio (both without
validation) is reported beside it. Results go to ``benchmarks/results/dmm_speed.json``.

    python benchmarks/dmm_speed.py [--epochs 3] [--threads N]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyro  # noqa: E402
import torch  # noqa: E402
from pyro.infer import SVI, Trace_ELBO  # noqa: E402
from pyro.optim import ClippedAdam  # noqa: E402

from baselines.pyro_dmm_example import PyroExampleDMM  # noqa: E402
from common import data_file, write_result  # noqa: E402
from pyro_seq.data import SequenceLoader, load_piano_rolls  # noqa: E402
from pyro_seq.models import DMM  # noqa: E402
from pyro_seq.nn import reverse_padded  # noqa: E402

ADAM = {"lr": 3e-4, "betas": (0.96, 0.999), "clip_norm": 10.0, "lrd": 0.99996, "weight_decay": 2.0}


def epoch_time(step_fn, loader, epoch, validation):
    wall, cpu = time.perf_counter(), time.process_time()
    with pyro.validation_enabled(validation):
        for x, mask in loader.batches(epoch):
            step_fn(x, mask)
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per implementation")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--data", default=None, help="path of jsb_chorales.pickle")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    seqs = load_piano_rolls(data_file("jsb_chorales.pickle", args.data), splits=("train",))["train"]
    loader = SequenceLoader(seqs, 20, shuffle=True, seed=0)

    pyro.clear_param_store()
    torch.manual_seed(0)
    ours = DMM(88)
    svi_ours = SVI(ours.model, ours.guide, ClippedAdam(ADAM), loss=Trace_ELBO())
    base = PyroExampleDMM()
    svi_base = SVI(base.model, base.guide, ClippedAdam(ADAM), loss=Trace_ELBO())

    def step_base(x, mask):
        lengths = mask.sum(-1)
        return svi_base.step(x, reverse_padded(x, lengths), mask.float(), lengths)

    impls = {  # name: (step function, Pyro validation)
        "pyro_example": (step_base, True),
        "pyro_example_no_validation": (step_base, False),
        "pyro_seq_validation": (lambda x, m: svi_ours.step(x, m), True),
        "pyro_seq": (lambda x, m: svi_ours.step(x, m), False),
    }
    wall = {k: [] for k in impls}
    cpu = {k: [] for k in impls}
    x, mask = next(iter(loader.batches(0)))
    for fn, _ in impls.values():            # warm-up: one minibatch each
        fn(x, mask)
    for epoch in range(args.epochs):
        for name, (fn, validation) in impls.items():
            w, c = epoch_time(fn, loader, epoch, validation)
            wall[name].append(w)
            cpu[name].append(c)
            print(f"epoch {epoch}: {name:28s} wall {w:6.2f} s  cpu {c:6.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    ratio = med["pyro_seq"] / med["pyro_example"]
    like = med["pyro_seq"] / med["pyro_example_no_validation"]
    print(f"median wall s/epoch: pyro-seq {med['pyro_seq']:.2f}, Pyro example {med['pyro_example']:.2f}"
          f" -> ratio {ratio:.2f} (target <= 0.5); like-for-like (no validation) {like:.2f}")
    write_result("dmm_speed", {
        "settings": {"z_dim": 100, "transition_dim": 200, "emission_dim": 100, "rnn_dim": 600,
                     "batch_size": 20, "loss": "Trace_ELBO", "data": "jsb_chorales.pickle train (229)",
                     "epochs_timed": args.epochs, "threads": torch.get_num_threads()},
        "wall_seconds_per_epoch": wall, "cpu_seconds_per_epoch": cpu,
        "median_wall_seconds_per_epoch": med, "median_cpu_seconds_per_epoch": med_cpu,
        "ratio_pyro_seq_to_pyro_example": ratio, "ratio_like_for_like_no_validation": like,
        "target_ratio": 0.5})

if __name__ == "__main__":
    main()
