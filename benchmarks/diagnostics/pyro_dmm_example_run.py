"""Does Pyro's own ``examples/dmm.py`` reach its published test ELBO on this data? (presets issue)

Pyro's example is documented to reach a test ELBO of about -6.87 nats per time step on JSB
Chorales after 5000 epochs; the package's DMM with the example's settings (the preset
``dmm_jsb_pyro``) is far from it after 2400. This script trains the example itself, the
unchanged Pyro 1.9.2 file loaded offline by ``benchmarks/speed/anchors.py`` (only its download
is replaced by the local pickle): its ``DMM``, its ``ClippedAdam`` settings, ``Trace_ELBO``, its
``poly.get_mini_batch``, with the training loop of its ``main()`` written out here so that the
run can stop and resume: per epoch a ``torch.randperm`` shuffle into minibatches of 20, the KL
annealing factor of its ``process_minibatch`` (from 0.2, linearly per minibatch, over the first
1000 epochs), and its ``do_evaluation`` every 50 epochs (the RNN in eval mode, validation and
test ``svi.evaluate_loss`` divided by the number of time steps, one sample: the example's
``n_eval_samples = 1``). The example's defaults are read from its own argument parser.

Every ``--checkpoint-every`` epochs (and at the end or at ``--time-limit``) the weights, the
optimizer state, the epoch, the evaluations so far and the random states go to
``benchmarks/checkpoints/pyro_dmm_example/state.pt``; running the same command again resumes
exactly there. The curve goes to ``benchmarks/results/pyro_dmm_example.json``.

    python benchmarks/diagnostics/pyro_dmm_example_run.py --time-limit 3600   # run again to resume
"""

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))  # anchors.py
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

import anchors  # noqa: E402
import pyro  # noqa: E402
import torch  # noqa: E402
from common import ROOT, write_result  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

CHECKPOINT = ROOT / "benchmarks" / "checkpoints" / "pyro_dmm_example" / "state.pt"
VAL_TEST_FREQUENCY = 50  # the example's main(): val_test_frequency


def annealing_factor(epoch, which_mini_batch, n_mini_batches, defaults):
    """The example's ``process_minibatch`` KL annealing factor."""
    if defaults.annealing_epochs > 0 and epoch < defaults.annealing_epochs:
        min_af = defaults.minimum_annealing_factor
        return min_af + (1.0 - min_af) * (
            float(which_mini_batch + epoch * n_mini_batches + 1)
            / float(defaults.annealing_epochs * n_mini_batches)
        )
    return 1.0


def evaluation_batches(anchor):
    """The example's validation and test batches (``n_eval_samples = 1``: no replication)."""
    data = anchor.data()
    out = {}
    for split in ("valid", "test"):
        seqs, lengths = data[split]["sequences"], data[split]["sequence_lengths"]
        out[split] = anchor.poly.get_mini_batch(torch.arange(seqs.shape[0]), seqs, lengths)
    return out


def evaluate(dmm, svi, batches):
    """The example's ``do_evaluation``: ELBO per time step (the negated NLL it logs). Its draws
    come from a forked random state, so that evaluating (or not) leaves the training's random
    stream unchanged and a resumed run repeats an uninterrupted one."""
    dmm.rnn.eval()
    out = {}
    with torch.random.fork_rng():
        for split, batch in batches.items():
            out[split] = -svi.evaluate_loss(*batch) / float(torch.sum(batch[3]))
    dmm.rnn.train()
    return out


def save(path, dmm, svi, epoch, history, seconds):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "epoch": epoch,
            "model": dmm.state_dict(),
            "optimizer": svi.optim.get_state(),
            "history": history,
            "seconds": seconds,
            "torch_rng": torch.get_rng_state(),
        },
        tmp,
    )
    tmp.replace(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=None, help="default: the example's (5000)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds of this invocation")
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--checkpoint", default=str(CHECKPOINT))
    p.add_argument("--output", default=None, help="JSON (default results/pyro_dmm_example.json)")
    p.add_argument("--anchors", default=None)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    anchor = anchors.load_anchor(args.anchors, args.data_dir)
    defaults = anchor.defaults
    epochs = args.epochs or defaults.num_epochs
    data = anchor.data()
    n_train = len(data["train"]["sequence_lengths"])
    n_mini_batches = math.ceil(n_train / defaults.mini_batch_size)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)  # the example sets no seed
    dmm, svi = anchor.make_svi()
    batches = evaluation_batches(anchor)
    path = Path(args.checkpoint)
    start, history, seconds = 0, [], 0.0
    if path.is_file():
        state = torch.load(path, weights_only=True)
        dmm.load_state_dict(state["model"])
        svi.optim.set_state(state["optimizer"])
        start, history, seconds = state["epoch"], state["history"], state["seconds"]
        torch.set_rng_state(state["torch_rng"])
        print(f"resumed at epoch {start} ({seconds:.0f} s of training so far)", flush=True)
    began = time.time()
    epoch = start
    with pyro.validation_enabled(False):  # as pyro_seq.train runs; the values do not change
        for epoch in tqdm(range(start, epochs), initial=start, total=epochs, desc="epochs"):
            t0 = time.process_time()
            shuffled = torch.randperm(n_train)
            losses = []
            for b in range(n_mini_batches):
                idx = shuffled[b * defaults.mini_batch_size : (b + 1) * defaults.mini_batch_size]
                af = annealing_factor(epoch, b, n_mini_batches, defaults)
                losses.append(svi.step(*anchor.mini_batch(idx), af))
            seconds += time.process_time() - t0
            row = {"epoch": epoch + 1, "train_loss": sum(losses)}
            if (epoch + 1) % VAL_TEST_FREQUENCY == 0 or epoch + 1 == epochs:
                row.update(evaluate(dmm, svi, batches))
                tqdm.write(f"epoch {epoch + 1}: valid {row['valid']:.4f} test {row['test']:.4f}")
            history.append(row)
            done = epoch + 1 == epochs
            out_of_time = args.time_limit and time.time() - began > args.time_limit
            if done or out_of_time or (epoch + 1) % args.checkpoint_every == 0:
                save(path, dmm, svi, epoch + 1, history, seconds)
            if out_of_time:
                break
    evaluated = [r for r in history if "test" in r]
    result = {
        "benchmark": "pyro_dmm_example",
        "anchor": {"folder": str(anchor.folder), "sha256": anchor.digests},
        "settings": {
            k: getattr(defaults, k)
            for k in (
                "num_epochs",
                "mini_batch_size",
                "learning_rate",
                "beta1",
                "beta2",
                "clip_norm",
                "lr_decay",
                "weight_decay",
                "annealing_epochs",
                "minimum_annealing_factor",
                "rnn_dropout_rate",
                "num_iafs",
            )
            if hasattr(defaults, k)
        },
        "epochs_completed": len(history),
        "epochs_planned": epochs,
        "cpu_seconds_training": seconds,
        "evaluations": evaluated,
        "last_test_elbo_per_step": evaluated[-1]["test"] if evaluated else None,
        "best_valid": max(evaluated, key=lambda r: r["valid"]) if evaluated else None,
        "published": {"test_elbo_per_step": -6.87, "after_epochs": 5000},
    }
    write_result("pyro_dmm_example", result, args.output)
    return result


if __name__ == "__main__":
    main()
