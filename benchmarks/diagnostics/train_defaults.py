"""Do the training defaults transfer? SRNN with ``TrainConfig``'s defaults on three datasets.

The tuned SRNN recipe (``jsb_srnn.py``: Adam 1e-3 constant for 50 epochs, then /1.15 per
epoch, 90 epochs) was tuned on JSB-2x; on other polyphonic data its validation bound peaked at a
third of the schedule and then fell while the rate was still constant. This script trains the
same SRNN (GRU 300, z 100, MLPs 500, smoothing + Res_q; batch 16, KL annealing from 0.2 over
1000 updates, clip 10) with one configuration for every dataset. The model and the shared
settings are those of the preset ``srnn_jsb2x`` (:mod:`pyro_seq.presets`), the ``recipe``
those of ``srnn_jsb2x_recipe``, so that the docs' tables, this script and ``pyro-seq train
--preset`` cannot drift apart; each variant below changes the named fields of the preset's
configuration (:data:`VARIANT_CHANGES`). A flag that changes a preset's value (``--epochs``,
``--eval-seeds``, ``--d-dim``, ``--z-dim``, ``--hidden-dim``, a data set other than JSB-2x) is
an override, recorded in each run's ``overrides`` beside its ``preset`` and
``variant_changes``:

* ``defaults``: the defaults of :class:`pyro_seq.train.TrainConfig` (plateau schedule on the
  validation ELBO, factor 0.5, patience 3, the best weights restored at each reduction; early
  stopping after 12 epochs without improvement with the best weights restored; output bias from
  note frequencies; the schedule and early stopping active during KL annealing), at most 90
  epochs;
* ``candidate``: the defaults before ``plateau_restore_best`` (the halved rate continues from
  the last weights);
* ``candidate_noinit``: the same with no initialisation at all (``init="none"``);
* ``plateau1``: ``candidate`` with ``plateau_patience=1``;
* ``restore``: ``candidate`` with ``plateau_restore_best=True``, the defaults since 2026-11-26;
* ``srnn_init_wait``: the defaults before 2026-11-26 (SRNN initialisation, the schedule waiting
  for the end of KL annealing);
* ``recipe`` (``--variants recipe``): the tuned recipe for comparison (exponential schedule,
  no early stopping, no initialisation), 90 epochs.

Datasets: JSB Chorales at the original resolution (``jsb_chorales.pickle``), at double
resolution (``jsb_chorales_2x.pickle``, the recipe's) and the built-in music21 chorales
(``load_dataset("chorales")``). For each run it reports the best validation ELBO, its epoch, the
test ELBO of the best weights (mean over the preset's 4 evaluation seeds), the training time to the best
validation epoch and in total (seconds of the training updates, validation excluded), and why
training stopped. Results accumulate in ``benchmarks/results/train_defaults[_<tag>].json``.

Every run checkpoints into ``benchmarks/checkpoints/train_defaults[_<tag>]/<data>_<variant>``;
run the same command again to resume (``--time-limit`` bounds one invocation)::

    python benchmarks/diagnostics/train_defaults.py --threads 1 --time-limit 3600  # again to resume
    python benchmarks/diagnostics/train_defaults.py --variants defaults recipe     # with the recipe
    python benchmarks/diagnostics/train_defaults.py --datasets jsb --d-dim 16 --z-dim 4 \\
        --hidden-dim 16 --epochs 2 --eval-seeds 1 --tag smoke             # a quick check
"""

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch  # noqa: E402
from common import RESULTS, ROOT, SHARED_DATA, write_result  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from pyro_seq.data import load_dataset  # noqa: E402
from pyro_seq.models import SRNN  # noqa: E402
from pyro_seq.presets import get_preset  # noqa: E402
from pyro_seq.train import evaluate_bound, fit, load_weights  # noqa: E402

#: The presets the runs take their settings from: the SRNN at the thesis's sizes with the shared
#: settings and the training defaults (``srnn_jsb2x``, measured as the ``restore`` run on
#: JSB-2x), and the tuned recipe (``srnn_jsb2x_recipe``, ``jsb_srnn.py``'s).
PRESET = get_preset("srnn_jsb2x")
RECIPE = get_preset("srnn_jsb2x_recipe")
DATASETS = {
    "jsb": "jsb_chorales.pickle",
    "jsb_2x": PRESET.data_file,
    "chorales": None,
}
MODEL = dict(PRESET.model_options)
#: What each variant changes in the preset's training configuration (the subject of this
#: diagnostic, not a setting of the recorded runs: those are the presets').
VARIANT_CHANGES = {
    # nothing but the settings shared by every dataset: schedule, stopping, init are defaults
    # (since 2026-11-26 those of "restore" below, results under "restore"; before that those of
    # "candidate", results under "candidate")
    "defaults": {},
    # the defaults before 2026-11-26 (recorded as "defaults" in train_defaults_full*.json until
    # then): SRNN initialisation, schedule and early stopping waiting for the end of annealing
    "srnn_init_wait": dict(init="srnn", schedule_during_annealing=False),
    # what the measurements of train_defaults_full*.json point to: the output bias only (the SRNN
    # weights fit the 229 JSB chorales faster and generalise worse), and the plateau schedule
    # and early stopping active from epoch 1 (waiting for beta = 1 kept the full rate through
    # 67 annealing epochs, over-fitting)
    "candidate": dict(init="bias", schedule_during_annealing=True, plateau_restore_best=False),
    # the same without any initialisation: on JSB the output-bias start fitted the training set
    # faster (epoch 10: 6.99 against the recipe's 8.95 nats/step) and over-fitted more
    "candidate_noinit": dict(
        init="none", schedule_during_annealing=True, plateau_restore_best=False
    ),
    # the defaults with the plateau schedule halving after 2 epochs without improvement instead
    # of 4: on JSB the defaults over-fitted in the 4 epochs before each halving (epochs 47-50)
    "plateau1": dict(plateau_patience=1, plateau_restore_best=False),
    # "candidate", and when the plateau schedule halves the rate the weights of the best
    # validation epoch come back (TrainConfig.plateau_restore_best): the lower rate continues
    # from the best point, not from the over-fitted epochs that triggered the halving (the
    # defaults since 2026-11-26)
    "restore": dict(plateau_restore_best=True),
}
#: The training configuration of each variant: the preset's with the variant's changes;
#: ``recipe``: the recipe preset's (benchmarks/paper/jsb_srnn.py, tuned on JSB-2x).
VARIANTS = {name: PRESET.train_config(**changes) for name, changes in VARIANT_CHANGES.items()}
VARIANTS["recipe"] = RECIPE.train_config()
#: The preset of each variant's settings.
VARIANT_PRESETS = dict(dict.fromkeys(VARIANTS, PRESET.name), recipe=RECIPE.name)


def load(name, data_dir):
    if DATASETS[name] is None:
        return load_dataset("chorales", progress=False)
    path = Path(data_dir) / DATASETS[name]
    if not path.exists():
        raise SystemExit(f"data file {path} not found; pass --data-dir")
    return load_dataset(path)


def summarise(history, stop_reason, test_runs, seconds_this_call):
    valid = [row.get("valid_elbo_per_step") for row in history]
    seconds = [row["seconds"] for row in history]
    best_index = max(range(len(valid)), key=lambda i: (valid[i], -i))
    per_seed = [r["per_step"] for r in test_runs]
    return {
        "best_valid_elbo_per_step": valid[best_index],
        "best_epoch": history[best_index]["epoch"],
        "test_elbo_per_step": statistics.mean(per_seed),
        "test_elbo_stderr": (
            statistics.stdev(per_seed) / len(per_seed) ** 0.5 if len(per_seed) > 1 else None
        ),
        "test_elbo_per_seed": per_seed,
        "test_kl_per_step": test_runs[0]["kl_per_step"],
        "train_seconds_to_best_valid": sum(seconds[: best_index + 1]),
        "train_seconds_total": sum(seconds),
        "seconds_per_epoch_mean": sum(seconds) / len(seconds),
        "epochs_completed": len(history),
        "stop_reason": stop_reason,
        "complete": stop_reason in ("epochs", "patience"),
        "final_lr": history[-1]["lr"],
        "wall_seconds_last_invocation": seconds_this_call,
        "valid_curve": valid,
        "lr_curve": [row["lr"] for row in history],
    }


def overrides_of(args):
    """The typed flags that change a preset's value (``epochs``, ``eval_seeds``, and the SRNN
    sizes as ``model_options``), with the values used."""
    overrides = {}
    if args.epochs is not None and args.epochs != PRESET.train["epochs"]:
        overrides["epochs"] = args.epochs
    if args.eval_seeds is not None and args.eval_seeds != PRESET.evaluation.seeds:
        overrides["eval_seeds"] = args.eval_seeds
    sizes = {
        k: getattr(args, k)
        for k in ("d_dim", "z_dim", "hidden_dim")
        if getattr(args, k) is not None and getattr(args, k) != MODEL[k]
    }
    if sizes:
        overrides["model_options"] = sizes
    return overrides


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["defaults"])
    parser.add_argument(
        "--data-dir",
        default=str(SHARED_DATA),
        help="folder of jsb_chorales.pickle and jsb_chorales_2x.pickle",
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="maximum epochs (default: the preset's, 90)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds for this invocation over all runs (run again to resume)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--eval-seeds",
        type=int,
        default=None,
        help=f"test ELBO evaluation seeds (default: the preset's, {PRESET.evaluation.seeds})",
    )
    for flag in ("d_dim", "z_dim", "hidden_dim"):
        parser.add_argument(
            "--" + flag.replace("_", "-"),
            type=int,
            default=None,
            help=f"SRNN size (default: the preset's, {MODEL[flag]})",
        )
    parser.add_argument("--tag", default="", help="suffix of the result and checkpoint names")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = "train_defaults" + (f"_{args.tag}" if args.tag else "")
    overrides = overrides_of(args)
    model_settings = dict(MODEL, **overrides.get("model_options", {}))
    eval_seeds = overrides.get("eval_seeds", PRESET.evaluation.seeds)
    previous = RESULTS / f"{name}.json"
    result = json.loads(previous.read_text()) if previous.exists() else {}
    result.update(benchmark=name, model=model_settings, runs=result.get("runs", {}))
    for runs in result["runs"].values():  # runs of the defaults before 2026-11-26
        old = runs.get("defaults", {}).get("train", {})
        if old.get("init") == "srnn" and not old.get("schedule_during_annealing", False):
            runs["srnn_init_wait"] = runs.pop("defaults")
    started = time.time()
    runs = [(d, v) for d in args.datasets for v in args.variants]
    outer = tqdm(runs, desc="runs", unit="run", disable=args.quiet)
    for data_name, variant in outer:
        outer.set_postfix(data=data_name, variant=variant)
        remaining = None
        if args.time_limit is not None:
            remaining = args.time_limit - (time.time() - started)
            if remaining <= 0:
                outer.write("time limit reached; run again to resume")
                break
        config = replace(
            VARIANTS[variant],
            **({"epochs": overrides["epochs"]} if "epochs" in overrides else {}),
            time_limit=remaining,
            num_threads=args.threads,
            progress=not args.quiet,
        )
        data = load(data_name, args.data_dir)
        out = ROOT / "benchmarks" / "checkpoints" / name / f"{data_name}_{variant}"
        torch.manual_seed(config.seed)
        model = SRNN(88, **model_settings)
        call_started = time.time()
        history = fit(model, data["train"], data["valid"], config, out)
        seconds = time.time() - call_started
        model.load_state_dict(load_weights(out / "best.pt"))  # fit restored them; explicit here
        model.eval()
        test_runs = []
        for seed in range(max(1, eval_seeds)):
            torch.manual_seed(seed)
            test_runs.append(evaluate_bound(model, data["test"], batch_size=16))
        summary = summarise(history, history.stop_reason, test_runs, seconds)
        summary.update(
            data=DATASETS[data_name] or "load_dataset('chorales')",
            train={k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
            preset=VARIANT_PRESETS[variant],
            variant_changes=VARIANT_CHANGES.get(variant, {}),
            overrides=dict(
                overrides,
                **({"dataset": data_name} if DATASETS[data_name] != PRESET.data_file else {}),
            ),
        )
        result["runs"].setdefault(data_name, {})[variant] = summary
        outer.write(
            f"{data_name} / {variant}: best valid {summary['best_valid_elbo_per_step']:.4f} "
            f"at epoch {summary['best_epoch']} ({summary['train_seconds_to_best_valid']:.0f} s "
            f"of training), test {summary['test_elbo_per_step']:.4f} nats/step, "
            f"stopped: {summary['stop_reason']}"
        )
        write_result(name, result)  # after every run, so an interrupted invocation keeps them
    outer.close()
    return result


if __name__ == "__main__":
    main()
