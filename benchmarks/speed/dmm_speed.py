"""Seconds per training epoch of the DMM: pyro-seq against Pyro's own ``examples/dmm.py``.

The anchor is the unchanged file of Pyro 1.9.2, loaded by path from
``../shared/anchors/pyro-1.9.2/`` (``--anchors DIR``) by :mod:`anchors`, which replaces only its
data download (by the local ``jsb_chorales.pickle``, ``--data-dir DIR``) and its data folder.
Its training step is the one its ``main()`` builds with its default options, from its own
objects: its ``DMM`` (z 100, transition 200, emission 100, backward ReLU RNN 600), its
``ClippedAdam`` settings (lr 3e-4, betas (0.96, 0.999), clip norm 10, lrd 0.99996, weight
decay 2), ``Trace_ELBO``, and minibatches of 20 from its ``poly.get_mini_batch`` (sorted by
length, reversed copy, mask, packed sequence). The package's ``pyro_seq.models.DMM`` has the
same sizes, starts from the same weights (mapped by :func:`anchors.copy_weights`), uses the
same optimizer settings and ``Trace_ELBO``, and gets the same sequences, padded by its own
loader (``pyro_seq.data.pad_sequences``); the per-epoch order of sequence indices comes from
``pyro_seq.data.SequenceLoader`` and is shared. Both use KL-annealing factor 1 (the example's
value after its annealing epochs; the scale handler runs either way).

Before timing, both models score one minibatch with the same latent samples (weights copied,
the package's scale floor set to 0 as in the example): the two single-sample ELBOs must agree to
float32 rounding, or the run stops, since the timing would then compare different functions.

Timed variants, each in one thread (``--threads``), alternating epoch by epoch in one process
(the order rotates every repeat) so that machine load affects them alike; every epoch is the
first ``--batches`` minibatches of that repeat's shuffle (default all 12 of the 229 training
sequences), with each implementation's minibatch preparation inside the epoch as in its own
training loop (recorded separately too). Wall and process CPU time, median of ``--repeats``:

* ``pyro_example``: the example as it runs (Pyro validation on: Pyro's default under
  ``__debug__``; the example neither enables nor disables it);
* ``pyro_example_no_validation``: the same with ``pyro.validation_enabled(False)``;
* ``pyro_seq_validation``: the package's DMM with Pyro validation on;
* ``pyro_seq``: as ``pyro_seq.train`` runs it (validation off, ``TrainConfig.pyro_validation``).

Headline ratio ``pyro_seq / pyro_example``; like-for-like ratios with validation off on both
and on on both are reported beside it. Results go to ``benchmarks/results/dmm_speed.json``
(``--output PATH`` elsewhere; ``--smoke``, a 2-minibatch, 1-repeat check of the script, writes
nothing unless ``--output`` is given).

    python benchmarks/speed/dmm_speed.py [--repeats 5] [--batches 12] [--threads 1]
    python benchmarks/speed/dmm_speed.py --smoke
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import anchors  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
from common import SHARED_DATA, finish_timing, parse_timing_args, timing_parser  # noqa: E402
from pyro.infer import SVI, Trace_ELBO  # noqa: E402
from pyro.optim import ClippedAdam  # noqa: E402

from pyro_seq.data import SequenceLoader, load_piano_rolls, pad_sequences  # noqa: E402
from pyro_seq.models import DMM  # noqa: E402

TARGET_RATIO = 0.4
#: |ELBO difference| allowed in the pre-timing check, relative to the sum of |site terms|
#: (float32 rounding; measured about 1e-9 on a minibatch of 20, so a 100-fold margin)
CHECK_RTOL = 1e-7


class ExampleImpl:
    """The anchor's step: its minibatch from sequence indices, then ``svi.step``."""

    def __init__(self, anchor, dmm, svi):
        self.anchor, self.dmm, self.svi = anchor, dmm, svi

    def prepare(self, indices):
        return self.anchor.mini_batch(indices)

    def step(self, batch):
        return self.svi.step(*batch, 1.0)

    @staticmethod
    def num_steps(batch):
        return int(batch[3].sum())


class PyroSeqImpl:
    """The package's step: its padding of the same sequences, then ``svi.step(x, mask)``."""

    def __init__(self, seqs, svi):
        self.seqs, self.svi = seqs, svi

    def prepare(self, indices):
        return pad_sequences([self.seqs[i] for i in indices])

    def step(self, batch):
        return self.svi.step(*batch)

    @staticmethod
    def num_steps(batch):
        return int(batch[1].sum())


def time_epoch(impl, batches, validation):
    """One epoch over ``batches`` (lists of sequence indices): wall, CPU and preparation
    seconds and the training loss per time step (the sum of ``svi.step`` losses / steps)."""
    prep, loss, steps = 0.0, 0.0, 0
    wall, cpu = time.perf_counter(), time.process_time()
    with pyro.validation_enabled(validation):
        for indices in batches:
            t = time.perf_counter()
            batch = impl.prepare(indices)
            prep += time.perf_counter() - t
            loss += impl.step(batch)
            steps += impl.num_steps(batch)
    return time.perf_counter() - wall, time.process_time() - cpu, prep, loss / steps


def check_same_function(anchor, example_dmm, indices):
    """Score one minibatch with both models and the same latent samples (see the module
    docstring); raises SystemExit when the ELBOs differ by more than float32 rounding."""
    twin = anchors.pyro_seq_twin(example_dmm)
    summary = anchors.compare_elbos(
        anchors.replayed_elbo(example_dmm, twin, anchor.mini_batch(indices))
    )
    summary["tolerance"] = CHECK_RTOL * summary["sum_abs_site_terms"]
    summary["passed"] = summary["elbo_abs_diff"] <= summary["tolerance"]
    print(
        f"check (same weights, same z): ELBO example {summary['elbo_example']:.3f}, pyro-seq "
        f"{summary['elbo_pyro_seq']:.3f}, |diff| {summary['elbo_abs_diff']:.2e} "
        f"(tolerance {summary['tolerance']:.2e}), max site |diff| {summary['max_site_abs_diff']:.2e}"
    )
    if not summary["passed"]:
        raise SystemExit(
            "the package's DMM and the example's DMM give different ELBOs with the "
            "same weights and latent samples; the timing would compare different "
            "functions"
        )
    return summary


def parse_args(argv=None):
    parser = timing_parser(
        __doc__.split("\n\n")[0],
        5,
        "minibatches per epoch (default: all, 12 of 20 for 229 sequences)",
        "dmm_speed",
        "quick check of the script: 1 repeat of 2 minibatches, no result file unless --output",
        [
            ("--anchors", "folder of the anchor files (default ../shared/anchors/pyro-1.9.2)"),
            ("--data-dir", f"folder holding jsb_chorales.pickle (default {SHARED_DATA})"),
        ],
    )
    return parse_timing_args(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        anchor = anchors.load_anchor(args.anchors, args.data_dir)
    except anchors.AnchorMissing as e:
        raise SystemExit(f"cannot time the anchor: {e}") from None
    torch.set_num_threads(args.threads)
    data_dir = Path(args.data_dir) if args.data_dir else SHARED_DATA
    seqs = load_piano_rolls(data_dir / "jsb_chorales.pickle", splits=("train",))["train"]
    example_seqs = anchor.training_sequences()
    if len(seqs) != len(example_seqs) or not all(
        torch.equal(a, b) for a, b in zip(seqs, example_seqs)
    ):
        raise SystemExit(
            "the example's training sequences differ from pyro_seq's reading of the "
            "same pickle; the minibatches would not be the same"
        )
    batch_size = anchor.defaults.mini_batch_size
    loader = SequenceLoader(seqs, batch_size, shuffle=True, seed=args.seed)
    num_batches = min(args.batches or len(loader), len(loader))

    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    example_dmm, example_svi = anchor.make_svi()
    check = check_same_function(anchor, example_dmm, loader.batch_indices(args.repeats)[0])
    pyro.clear_param_store()
    ours = DMM(88)  # as the package's users build it (scale floor 1e-3)
    ours.module_name = "pyro_seq_dmm"  # the example registers its parameters as "dmm"
    anchors.copy_weights(example_dmm, ours)
    svi_ours = SVI(ours.model, ours.guide, ClippedAdam(anchor.adam_params()), loss=Trace_ELBO())
    example = ExampleImpl(anchor, example_dmm, example_svi)
    package = PyroSeqImpl(seqs, svi_ours)

    variants = {  # name: (implementation, Pyro validation)
        "pyro_example": (example, True),
        "pyro_example_no_validation": (example, False),
        "pyro_seq_validation": (package, True),
        "pyro_seq": (package, False),
    }
    record = {k: {"wall": [], "cpu": [], "prep": [], "loss_per_step": []} for k in variants}
    warmup = [loader.batch_indices(args.repeats)[0]]  # not one of the timed epochs' batches
    for impl, validation in variants.values():
        time_epoch(impl, warmup, validation)
    names = list(variants)
    for r in range(args.repeats):
        batches = loader.batch_indices(r)[:num_batches]
        for name in names[r % len(names) :] + names[: r % len(names)]:
            impl, validation = variants[name]
            w, c, p, lps = time_epoch(impl, batches, validation)
            for key, value in zip(("wall", "cpu", "prep", "loss_per_step"), (w, c, p, lps)):
                record[name][key].append(value)
            print(
                f"repeat {r}: {name:28s} wall {w:6.2f} s  cpu {c:6.2f} s  (prep {p:5.2f} s)  "
                f"loss/step {lps:7.3f}",
                flush=True,
            )

    med = {k: statistics.median(v["wall"]) for k, v in record.items()}
    med_cpu = {k: statistics.median(v["cpu"]) for k, v in record.items()}
    ratio = med["pyro_seq"] / med["pyro_example"]
    like_off = med["pyro_seq"] / med["pyro_example_no_validation"]
    like_on = med["pyro_seq_validation"] / med["pyro_example"]
    print(
        f"\nmedian of {args.repeats} epoch(s) of {num_batches} minibatch(es), "
        f"{torch.get_num_threads()} thread(s)"
    )
    print(f"{'variant':28s} {'wall s':>8s} {'CPU s':>8s} {'wall / pyro_example':>20s}")
    for k in variants:
        print(f"{k:28s} {med[k]:8.2f} {med_cpu[k]:8.2f} {med[k] / med['pyro_example']:20.2f}")
    print(
        f"ratio pyro_seq / pyro_example {ratio:.2f} (target <= {TARGET_RATIO}); like for like: "
        f"validation off {like_off:.2f}, validation on {like_on:.2f}; CPU ratio "
        f"{med_cpu['pyro_seq'] / med_cpu['pyro_example']:.2f}"
    )
    if args.smoke:
        print("smoke run: the times above only show that the script works")

    result = {
        "anchor": {
            "folder": str(anchor.folder),
            "sha256": anchor.digests,
            "pyro": pyro.__version__,
            "loaded_by": "benchmarks/speed/anchors.py (download -> local pickle, data folder -> "
            "temporary folder; nothing else changed)",
        },
        "settings": {
            "z_dim": 100,
            "transition_dim": 200,
            "emission_dim": 100,
            "rnn_dim": 600,
            "batch_size": batch_size,
            "batches_per_epoch": num_batches,
            "sequences": len(seqs),
            "loss": "Trace_ELBO",
            "optimizer": "ClippedAdam",
            "adam": anchor.adam_params(),
            "annealing_factor": 1.0,
            "data": str(data_dir / "jsb_chorales.pickle") + " train",
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "seed": args.seed,
            "smoke": args.smoke,
            "order": "alternating epochs, variant order rotated each repeat",
            "epoch_includes": "each implementation's minibatch preparation",
        },
        "check_same_elbo": check,
        "wall_seconds_per_epoch": {k: v["wall"] for k, v in record.items()},
        "cpu_seconds_per_epoch": {k: v["cpu"] for k, v in record.items()},
        "prep_seconds_per_epoch": {k: v["prep"] for k, v in record.items()},
        "loss_per_step": {k: v["loss_per_step"] for k, v in record.items()},
        "median_wall_seconds_per_epoch": med,
        "median_cpu_seconds_per_epoch": med_cpu,
        "ratio_pyro_seq_to_pyro_example": ratio,
        "ratio_like_for_like_no_validation": like_off,
        "ratio_like_for_like_validation": like_on,
        "target_ratio": TARGET_RATIO,
    }
    return finish_timing("dmm_speed", result, record, args)


if __name__ == "__main__":
    main()
