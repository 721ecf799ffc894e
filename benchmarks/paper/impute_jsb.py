"""Imputation of 8 dropped steps of every JSB test sequence (seed 002 sec. 4.3), in bits per element.

Loads the best-validation weights of trained zoo cells (``benchmarks/paper/zoo_jsb.py`` checkpoint
folders), drops ``--drop`` consecutive steps at a random place of each test sequence longer than
that (seeded), imputes them with :func:`pyro_seq.tasks.impute` and reports the mean of
``-log2 p(true element)`` over the dropped elements, beside the same score of filling them with
the training-set note frequencies. Writes ``benchmarks/results/impute_jsb.json``.

Usage::

    python benchmarks/paper/impute_jsb.py --cells zoo_jsb_a/storn_elbo zoo_jsb_a/rnn_elbo
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch  # noqa: E402
from common import ROOT, data_file, write_result  # noqa: E402
from zoo_jsb import MODELS  # noqa: E402

from pyro_seq.data import load_piano_rolls, pad_sequences  # noqa: E402
from pyro_seq.tasks import bits_per_element, drop_steps, impute  # noqa: E402
from pyro_seq.train.checkpoint import load_weights  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--cells",
        nargs="+",
        required=True,
        help="checkpoint folders under benchmarks/checkpoints, e.g. zoo_jsb_a/storn_elbo",
    )
    p.add_argument("--drop", type=int, default=8)
    p.add_argument("--method", choices=("iterative", "importance"), default="iterative")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--particles", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_piano_rolls(data_file("jsb_chorales.pickle", args.data))
    seqs = [s for s in data["test"] if s.shape[0] > args.drop]
    x, mask = pad_sequences(seqs)
    g = torch.Generator().manual_seed(args.seed)
    observed = drop_steps(mask, args.drop, generator=g)
    missing = (~observed & mask).unsqueeze(-1).expand(x.shape)
    freq = torch.cat(data["train"]).float().mean(0).expand(x.shape)[missing]
    baseline = bits_per_element(freq, x[missing])
    results = {}
    for cell in args.cells:
        model_name = Path(cell).name.split("_")[0]
        model = MODELS[model_name](False, 88)
        model.load_state_dict(load_weights(ROOT / "benchmarks" / "checkpoints" / cell / "best.pt"))
        model.eval()
        torch.manual_seed(args.seed)
        res = impute(
            model,
            x,
            observed,
            mask,
            method=args.method,
            num_iterations=args.iterations,
            num_particles=args.particles,
            generator=g,
        )
        score = bits_per_element(res.probs[missing], x[missing])
        results[cell] = {"bits_per_element": score, "beats_note_frequencies": score < baseline}
        print(f"{cell}: {score:.4f} bits/element (note frequencies {baseline:.4f})")
    write_result(
        "impute_jsb",
        {
            "benchmark": "impute_jsb",
            "drop": args.drop,
            "method": args.method,
            "iterations": args.iterations,
            "num_sequences": len(seqs),
            "missing_elements": int(missing.sum()),
            "baseline_bits_per_element": baseline,
            "baseline": "training-set note frequencies",
            "cells": results,
        },
    )


if __name__ == "__main__":
    main()
