"""Seconds per training epoch of the DMM: pyro-seq vs the structure of Pyro's examples/dmm.py.

Both use the sizes of Pyro's example (z 100, transition 200, emission 100, backward ReLU RNN
600), minibatches of 20 sequences of the original-resolution JSB Chorales training set (229
sequences), ClippedAdam and Trace_ELBO. The two implementations see the same minibatches and
run alternately in one process, so machine load affects both alike. Results go to
``benchmarks/results/dmm_speed.json``.

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


def epoch_time(step_fn, loader, epoch):
    start = time.perf_counter()
    for x, mask in loader.batches(epoch):
        step_fn(x, mask)
    return time.perf_counter() - start


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

    impls = {"pyro_example_structure": step_base, "pyro_seq": lambda x, m: svi_ours.step(x, m)}
    times = {k: [] for k in impls}
    for name, fn in impls.items():          # warm-up: one minibatch each
        x, mask = next(iter(loader.batches(0)))
        fn(x, mask)
    for epoch in range(args.epochs):
        for name, fn in impls.items():
            times[name].append(epoch_time(fn, loader, epoch))
            print(f"epoch {epoch}: {name} {times[name][-1]:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["pyro_seq"] / med["pyro_example_structure"]
    print(f"median s/epoch: pyro-seq {med['pyro_seq']:.2f}, Pyro example structure "
          f"{med['pyro_example_structure']:.2f}, ratio {ratio:.2f} (target <= 0.5)")
    write_result("dmm_speed", {
        "settings": {"z_dim": 100, "transition_dim": 200, "emission_dim": 100, "rnn_dim": 600,
                     "batch_size": 20, "loss": "Trace_ELBO", "data": "jsb_chorales.pickle train (229)",
                     "epochs_timed": args.epochs, "threads": torch.get_num_threads()},
        "seconds_per_epoch": times, "median_seconds_per_epoch": med, "ratio_pyro_seq_to_pyro": ratio,
        "target_ratio": 0.5})


if __name__ == "__main__":
    main()
