"""Seconds per training epoch of the SRNN: pyro-seq against a plain-PyTorch floor.

The floor is ``baselines/plain_srnn.py``: the package's SRNN with its defaults (smoothing,
Res_q, Bernoulli; the paper sizes of ``jsb_srnn.py``: GRU 300, z 100, MLPs of 500) written
without Pyro, with the same parameters and the same single-sample ELBO that
:class:`pyro.infer.Trace_ELBO` computes from the package's sites. The package runs as its users
run it: ``pyro.infer.SVI`` with ``Trace_ELBO`` over ``m.model`` / ``m.guide``, Pyro validation
off (``TrainConfig.pyro_validation``); the floor runs ``loss.backward()`` and
``torch.optim.Adam``. Both use Adam with lr 1e-3 (``pyro.optim.Adam`` wraps the same torch
optimizer), KL weight 1 and no gradient clipping, start from the same weights (copied by
:func:`baselines.plain_srnn.copy_from_package`, which asserts equal parameter counts) and see
the same minibatches in the same order: batches of 16 of the training windows of
``jsb_chorales_2x.pickle`` (272 windows of 100 steps, so 17 per epoch), shuffled per repeat by
``pyro_seq.data.SequenceLoader``; padding happens before timing, once, for both.

Before timing, both score the first minibatch in float64 with the same weights and the same
standard-normal noise: the ELBOs must agree to 1e-6 (relative), or the run stops, since the
timing would compare different functions.

Timing, in ``--threads`` threads (default 1): the two alternate epoch by epoch in one process
(the order swaps every repeat) so that machine load affects them alike; wall and process CPU
seconds per epoch, median of ``--repeats`` (default 3); headline ratio
``pyro_seq / plain`` (target <= 1.3, issue 13). Results go to
``benchmarks/results/srnn_speed.json`` (``--output PATH`` elsewhere). ``--smoke``: tiny sizes,
synthetic data, 1 repeat of 2 minibatches, a check that the script works (writes nothing unless
``--output`` is given).

    python benchmarks/speed/srnn_speed.py [--repeats 3] [--batches 17] [--threads 1]
    python benchmarks/speed/srnn_speed.py --smoke
"""

import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import pyro  # noqa: E402
import torch  # noqa: E402
import torch.distributions.normal as torch_normal  # noqa: E402
from baselines.plain_srnn import from_package  # noqa: E402
from common import SHARED_DATA, finish_timing, parse_timing_args, timing_parser  # noqa: E402
from pyro.infer import SVI, Trace_ELBO  # noqa: E402
from pyro.optim import Adam  # noqa: E402

from pyro_seq.data import SequenceLoader, load_piano_rolls  # noqa: E402
from pyro_seq.models import SRNN  # noqa: E402

TARGET_RATIO = 1.3
#: the paper sizes of ``jsb_srnn.py`` (the package's defaults)
MODEL = dict(d_dim=300, z_dim=100, hidden_dim=500)
SMOKE_MODEL = dict(d_dim=8, z_dim=4, hidden_dim=8)
BATCH_SIZE = 16
LR = 1e-3
#: relative |ELBO difference| allowed in the float64 pre-timing check
CHECK_RTOL = 1e-6


@contextlib.contextmanager
def fixed_normal_noise(noise):
    """Make every ``Normal.rsample`` draw the next step of ``noise (B, T, z)`` (step order):
    the package's guide then uses exactly the floor's noise."""
    steps = iter(noise.unbind(1))
    original = torch_normal._standard_normal

    def draw(shape, dtype, device):
        eps = next(steps)
        if eps.shape != shape:
            raise RuntimeError(f"noise step of shape {tuple(eps.shape)}, expected {tuple(shape)}")
        return eps.to(dtype=dtype, device=device)

    torch_normal._standard_normal = draw
    try:
        yield
    finally:
        torch_normal._standard_normal = original


def check_same_function(model, x, mask, seed):
    """Float64 ELBO of the package's SRNN (``Trace_ELBO``) and of the floor on one minibatch,
    same weights and noise; raises SystemExit when they differ by more than CHECK_RTOL."""
    m = copy.deepcopy(model).double()
    plain = from_package(m)
    x64 = x.double()
    noise = torch.randn(
        x.shape[0],
        x.shape[1],
        m.z_dim,
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(seed),
    )
    with torch.no_grad(), fixed_normal_noise(noise), pyro.validation_enabled(False):
        ours = -Trace_ELBO(max_plate_nesting=1).loss(m.model, m.guide, x64, mask)
        theirs = plain.elbo(x64, mask, noise).item()
    pyro.clear_param_store()
    diff = abs(ours - theirs)
    summary = {
        "elbo_pyro_seq": ours,
        "elbo_plain": theirs,
        "abs_diff": diff,
        "tolerance": CHECK_RTOL * abs(theirs),
        "dtype": "float64",
        "passed": diff <= CHECK_RTOL * abs(theirs),
    }
    print(
        f"check (float64, same weights, same noise): ELBO pyro-seq {ours:.6f}, plain "
        f"{theirs:.6f}, |diff| {diff:.2e} (tolerance {summary['tolerance']:.2e})"
    )
    if not summary["passed"]:
        raise SystemExit(
            "the package's SRNN and the plain floor give different ELBOs with the "
            "same weights and noise; the timing would compare different functions"
        )
    return summary


class PyroSeqImpl:
    """The package as its users train it: ``SVI(m.model, m.guide, Adam, Trace_ELBO)``."""

    def __init__(self, model):
        self.svi = SVI(
            model.model, model.guide, Adam({"lr": LR}), loss=Trace_ELBO(max_plate_nesting=1)
        )

    def step(self, x, mask):
        with pyro.validation_enabled(False):
            return self.svi.step(x, mask)


class PlainImpl:
    """The floor: ``-elbo``, ``backward``, ``torch.optim.Adam``."""

    def __init__(self, plain):
        self.plain = plain
        self.optim = torch.optim.Adam(plain.parameters(), lr=LR)

    def step(self, x, mask):
        self.optim.zero_grad()
        loss = -self.plain.elbo(x, mask)
        loss.backward()
        self.optim.step()
        return loss.item()


def time_epoch(impl, batches):
    """One epoch over ``batches`` of ``(x, mask)``: wall and CPU seconds, loss per time step."""
    loss, steps = 0.0, 0
    wall, cpu = time.perf_counter(), time.process_time()
    for x, mask in batches:
        loss += impl.step(x, mask)
        steps += int(mask.sum())
    return time.perf_counter() - wall, time.process_time() - cpu, loss / steps


def synthetic_sequences(num, obs_dim=88, seed=0):
    """Random binary sequences of 5 to 20 steps, about 10% of notes on (``--smoke``)."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.bernoulli(
            torch.full((int(torch.randint(5, 21, (), generator=g)), obs_dim), 0.1), generator=g
        )
        for _ in range(num)
    ]


def training_windows(data=None, smoke=False, seed=0):
    """The sequences the SRNN timings train on: ``(model sizes, batch size, sequences,
    description)``; the JSB-2x training windows (``data`` or the shared pickle), or with
    ``smoke`` tiny sizes and 12 random sequences."""
    if smoke:
        seqs = synthetic_sequences(12, seed=seed)
        return SMOKE_MODEL, 4, seqs, "synthetic: 12 sequences of 5-20 steps, D = 88"
    path = Path(data) if data else SHARED_DATA / "jsb_chorales_2x.pickle"
    if not path.exists():
        raise SystemExit(f"data file {path} not found; pass --data PATH")
    return MODEL, BATCH_SIZE, load_piano_rolls(path, splits=("train",))["train"], f"{path} train"


def parse_args(argv=None):
    parser = timing_parser(
        __doc__.split("\n\n")[0],
        3,
        "minibatches per epoch (default: all, 17 of 16 for 272 windows)",
        "srnn_speed",
        "quick check of the script: tiny sizes, synthetic data, 1 repeat of 2 minibatches, no "
        "result file unless --output",
        [("--data", f"jsb_chorales_2x.pickle (default {SHARED_DATA})")],
    )
    return parse_timing_args(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes, batch_size, seqs, data = training_windows(args.data, args.smoke, args.seed)
    loader = SequenceLoader(seqs, batch_size, shuffle=True, seed=args.seed)
    num_batches = min(args.batches or len(loader), len(loader))

    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    model = SRNN(88, **sizes)
    plain = from_package(model)
    params = {
        "pyro_seq": sum(p.numel() for p in model.parameters()),
        "plain": sum(p.numel() for p in plain.parameters()),
    }
    assert params["pyro_seq"] == params["plain"]
    first = next(iter(loader.batches(args.repeats)))  # not one of the timed epochs' batches
    check = check_same_function(model, *first, seed=args.seed)

    variants = {"pyro_seq": PyroSeqImpl(model), "plain": PlainImpl(plain)}
    epochs = [list(loader.batches(r))[:num_batches] for r in range(args.repeats)]
    for impl in variants.values():  # warm-up: one step each, outside the timed epochs
        time_epoch(impl, [first])
    record = {k: {"wall": [], "cpu": [], "loss_per_step": []} for k in variants}
    names = list(variants)
    for r, batches in enumerate(epochs):
        for name in names[r % 2 :] + names[: r % 2]:
            w, c, lps = time_epoch(variants[name], batches)
            for key, value in zip(("wall", "cpu", "loss_per_step"), (w, c, lps)):
                record[name][key].append(value)
            print(
                f"repeat {r}: {name:9s} wall {w:7.2f} s  cpu {c:7.2f} s  loss/step {lps:8.4f}",
                flush=True,
            )

    med = {k: statistics.median(v["wall"]) for k, v in record.items()}
    med_cpu = {k: statistics.median(v["cpu"]) for k, v in record.items()}
    ratio = med["pyro_seq"] / med["plain"]
    cpu_ratio = med_cpu["pyro_seq"] / med_cpu["plain"]
    print(
        f"\nmedian of {args.repeats} epoch(s) of {num_batches} minibatch(es) of {batch_size}, "
        f"{torch.get_num_threads()} thread(s): pyro_seq {med['pyro_seq']:.2f} s, plain "
        f"{med['plain']:.2f} s; ratio {ratio:.3f} (target <= {TARGET_RATIO}), CPU ratio "
        f"{cpu_ratio:.3f}"
    )
    if args.smoke:
        print("smoke run: the times above only show that the script works")

    result = {
        "settings": {
            "model": dict(
                sizes, obs_dim=88, inference="smoothing", residual=True, likelihood="bernoulli"
            ),
            "batch_size": batch_size,
            "batches_per_epoch": num_batches,
            "sequences": len(seqs),
            "data": data,
            "loss": "Trace_ELBO (1 sample)",
            "optimizer": f"Adam lr {LR} (pyro.optim.Adam / torch.optim.Adam)",
            "annealing_factor": 1.0,
            "pyro_validation": False,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "seed": args.seed,
            "smoke": args.smoke,
            "order": "alternating epochs, variant order swapped each repeat",
            "epoch_includes": "svi.step / backward + Adam on pre-padded minibatches",
        },
        "parameters": params,
        "check_same_elbo": check,
        "wall_seconds_per_epoch": {k: v["wall"] for k, v in record.items()},
        "cpu_seconds_per_epoch": {k: v["cpu"] for k, v in record.items()},
        "loss_per_step": {k: v["loss_per_step"] for k, v in record.items()},
        "median_wall_seconds_per_epoch": med,
        "median_cpu_seconds_per_epoch": med_cpu,
        "ratio_pyro_seq_to_plain": ratio,
        "cpu_ratio_pyro_seq_to_plain": cpu_ratio,
        "target_ratio": TARGET_RATIO,
    }
    return finish_timing("srnn_speed", result, record, args)


if __name__ == "__main__":
    main()
