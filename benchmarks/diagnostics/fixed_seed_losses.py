"""Fixed-seed training losses of an SRNN and a DMM: the referee of behaviour-preserving
refactors (the losses of every update, written with full precision, must be bit-identical
before and after).

    python benchmarks/diagnostics/fixed_seed_losses.py --out /tmp/before.json
    python benchmarks/diagnostics/fixed_seed_losses.py --out /tmp/after.json \
        --compare /tmp/before.json
"""

import argparse
import json
import tempfile

import torch

from pyro_seq.models import DMM, SRNN
from pyro_seq.train import TrainConfig, fit


def losses(name):
    g = torch.Generator().manual_seed(0)
    seqs = [
        (torch.rand(int(T), 12, generator=g) < 0.3).float()
        for T in torch.randint(5, 15, (24,), generator=g)
    ]
    torch.manual_seed(0)
    model = (
        SRNN(12, d_dim=16, z_dim=4, hidden_dim=16)
        if name == "srnn"
        else DMM(12, z_dim=4, transition_dim=16, emission_dim=16, rnn_dim=16)
    )
    config = TrainConfig(
        epochs=3,
        batch_size=8,
        kl_anneal_steps=4,
        kl_start=0.2,
        seed=0,
        progress=False,
        num_threads=1,
    )
    with tempfile.TemporaryDirectory() as out:
        history = fit(model, seqs[:18], seqs[18:], config, out)
    return [{k: row[k] for k in ("train_loss_per_step", "valid_elbo_per_step")} for row in history]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--compare", default=None, help="a file of an earlier run: must be equal")
    args = p.parse_args()
    result = {name: losses(name) for name in ("srnn", "dmm")}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))
    if args.compare:
        with open(args.compare) as f:
            before = json.load(f)
        same = before == result
        print("bit-identical" if same else "DIFFERENT")
        raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
