"""RTRBM and SRTRBM on JSB Chorales (original resolution) and the built-in chorales, by CD-k.

Boulanger-Lewandowski et al. (2012), Table 1, report an RTRBM log-likelihood of -6.35 nats per
step on JSB (the target of issue 11). Each run trains through :func:`pyro_seq.train.fit` with
``objective="cd"`` (:class:`pyro_seq.infer.ContrastiveDivergence`, ``--cd-steps`` Gibbs sweeps),
Adam, the plateau schedule and early stopping on the validation pseudo-log-likelihood, and the
visible bias started at the note frequencies. The best weights are then scored on the test set
by the log-likelihood :math:`\\sum_t -F_t(v_t) - \\log Z_t` with every per-step partition function
estimated by annealed importance sampling (``--ais-chains`` chains, ``--ais-betas`` temperatures,
base model at the training notes' frequencies), with its standard error. AIS's :math:`\\hat Z_t` is
unbiased, so its log-likelihood is a stochastic upper bound; ``--estimators ais raise`` also
scores the same weights and sequences by reverse AIS on the same path (RAISE, Burda, Grosse &
Salakhutdinov 2015), a stochastic lower bound on the annealing model's log-likelihood: the gap
between the two is the honest error bar of the headline number.

The settings are those of the preset ``rtrbm_jsb`` (:mod:`pyro_seq.presets`; 150 hidden units,
CD-15, Adam 0.01, batch 16, 200 epochs, AIS with 100 chains and 1000 temperatures), so that the
docs' table, this script and ``pyro-seq train --preset rtrbm_jsb`` cannot drift apart; the
SRTRBM and the built-in chorales take the same settings. A flag that changes a preset's value
(``--hidden``, ``--cd-steps``, ``--epochs``, ``--batch-size``, ``--lr``, ``--ais-chains``,
``--ais-betas``) is an override, recorded in each run's ``overrides`` with the other model
(``srtrbm``) or data set (``chorales``).

The SRTRBM groups the 88 keys into the octaves of the piano (Mittelman et al.'s structure as
block masks, :meth:`pyro_seq.models.SRTRBM.block_masks`): each group of ``--hidden // groups``
hidden units sees one octave, and ``U`` links each group with itself and its neighbours.

Resumable: checkpoints in ``benchmarks/checkpoints/rtrbm_jsb[_<tag>]/<data>_<model>``; results in
``benchmarks/results/rtrbm_jsb[_<tag>].json``, written after every run::

    python benchmarks/paper/rtrbm_jsb.py --threads 1 --time-limit 3600     # again to resume
    python benchmarks/paper/rtrbm_jsb.py --datasets jsb --models rtrbm --hidden 16 --epochs 2 \\
        --ais-chains 10 --ais-betas 50 --tag smoke                      # a quick check
"""

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch  # noqa: E402
from common import RESULTS, ROOT, SHARED_DATA, write_result  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from pyro_seq.data import load_dataset  # noqa: E402
from pyro_seq.models import SRTRBM  # noqa: E402
from pyro_seq.presets import get_preset  # noqa: E402
from pyro_seq.train import evaluate_bound, fit, load_weights  # noqa: E402

#: The preset of the recorded runs: its model options, training configuration, evaluation and
#: data (the SRTRBM and the chorales take the same settings; the chorales are an override).
PRESET = get_preset("rtrbm_jsb")
DATASETS = {"jsb": PRESET.data_file, "chorales": None}
TARGET = PRESET.published
#: flag -> (where the preset holds its value, the name there)
PRESET_FLAGS = {
    "hidden": ("model_options", "num_hidden"),
    "cd_steps": ("train", "cd_steps"),
    "epochs": ("train", "epochs"),
    "batch_size": ("train", "batch_size"),
    "lr": ("train", "lr"),
    "ais_chains": ("evaluation", "particles"),
    "ais_betas": ("evaluation", "betas"),
}


def octave_masks(num_hidden, num_visible=88):
    """Block masks over the piano's octaves (12 keys each, the last group shorter)."""
    groups = [list(range(i, min(i + 12, num_visible))) for i in range(0, num_visible, 12)]
    per_group = max(1, num_hidden // len(groups))
    edges = [(g, g + 1) for g in range(len(groups) - 1)]
    return SRTRBM.block_masks(groups, per_group, edges), per_group * len(groups)


def settings(args):
    """The preset's values with the typed flags over them: ``(values, overrides)``, both flag
    destination -> value (``overrides``: the flags that changed a preset's value)."""
    values, overrides = {}, {}
    for flag, (where, key) in PRESET_FLAGS.items():
        source = getattr(PRESET, where)
        preset_value = source[key] if isinstance(source, Mapping) else getattr(source, key)
        typed = getattr(args, flag)
        values[flag] = preset_value if typed is None else typed
        if typed is not None and typed != preset_value:
            overrides[flag] = typed
    return values, overrides


def build(name, hidden):
    """The preset's model with ``hidden`` hidden units, or the octave-structured SRTRBM."""
    if name == "rtrbm":
        return PRESET.build(88, num_hidden=hidden)
    (W_mask, U_mask), H = octave_masks(hidden)
    return SRTRBM(88, H, W_mask, U_mask)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    p.add_argument("--models", nargs="+", choices=("rtrbm", "srtrbm"), default=["rtrbm", "srtrbm"])
    p.add_argument("--data-dir", default=str(SHARED_DATA))
    preset_help = f"(default: the preset {PRESET.name}'s; another value is an override)"
    p.add_argument("--hidden", type=int, default=None, help=f"hidden units {preset_help}")
    p.add_argument("--cd-steps", type=int, default=None, help=f"Gibbs sweeps {preset_help}")
    p.add_argument("--epochs", type=int, default=None, help=f"epochs {preset_help}")
    p.add_argument("--batch-size", type=int, default=None, help=f"minibatch {preset_help}")
    p.add_argument("--lr", type=float, default=None, help=f"Adam's rate {preset_help}")
    p.add_argument("--ais-chains", type=int, default=None, help=f"AIS chains {preset_help}")
    p.add_argument("--ais-betas", type=int, default=None, help=f"temperatures {preset_help}")
    p.add_argument(
        "--estimators",
        nargs="+",
        choices=("ais", "reverse_ais", "raise"),
        default=["ais"],
        help="test-set estimators on the same weights (ais: from above; reverse_ais: from "
        "below with exact draws; raise: the annealing model from below)",
    )
    p.add_argument("--time-limit", type=float, default=None, help="seconds for this invocation")
    p.add_argument("--eval-only", action="store_true", help="score the saved best weights only")
    p.add_argument(
        "--weights-from",
        default=None,
        help="with --eval-only: the tag whose checkpoints to score ('' for none)",
    )
    p.add_argument(
        "--test-sequences",
        type=int,
        default=None,
        help="score only the first N test sequences (a quicker, partial estimate)",
    )
    p.add_argument(
        "--test-slice",
        default=None,
        metavar="START:STOP",
        help="score test sequences START..STOP-1 only (to split the AIS over "
        "processes; the result records total log-likelihood and steps)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    name = "rtrbm_jsb" + (f"_{args.tag}" if args.tag else "")
    path = RESULTS / f"{name}.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    values, overrides = settings(args)
    result.update(
        benchmark=name,
        target=TARGET,
        preset=PRESET.name,
        settings=dict(vars(args), **values),
        runs=result.get("runs", {}),
    )
    started = time.time()
    for data_name in args.datasets:
        if DATASETS[data_name] is None:
            data = load_dataset("chorales", progress=False)
        else:
            file = Path(args.data_dir) / DATASETS[data_name]
            if not file.exists():
                raise SystemExit(f"data file {file} not found; pass --data-dir")
            data = load_dataset(file)
        for model_name in args.models:
            remaining = None
            if args.time_limit is not None:
                remaining = args.time_limit - (time.time() - started)
                if remaining <= 0:
                    print("time limit reached; run again to resume")
                    break
            folder = name
            if args.eval_only and args.weights_from is not None:
                folder = "rtrbm_jsb" + (f"_{args.weights_from}" if args.weights_from else "")
            out = ROOT / "benchmarks" / "checkpoints" / folder / f"{data_name}_{model_name}"
            torch.manual_seed(0)
            model = build(model_name, values["hidden"])
            config = PRESET.train_config(
                **{
                    PRESET_FLAGS[f][1]: v
                    for f, v in values.items()
                    if PRESET_FLAGS[f][0] == "train"
                },
                time_limit=remaining,
                num_threads=args.threads,
                progress=True,
            )
            if args.eval_only:
                from pyro_seq.train.trainer import TrainHistory

                history = TrainHistory(json.loads((out / "log.json").read_text()))
                history.best_epoch = max(history, key=lambda r: r["valid_bound_per_step"])["epoch"]
                history.best_valid_elbo_per_step = max(r["valid_bound_per_step"] for r in history)
            else:
                history = fit(model, data["train"], data["valid"], config, out)
            if history.stop_reason == "time_limit":
                print(f"{data_name}/{model_name}: time limit; run again to resume")
                break
            model.load_state_dict(load_weights(out / "best.pt"))
            test_seqs = data["test"][: args.test_sequences] if args.test_sequences else data["test"]
            if args.test_slice:
                start, stop = (int(v) for v in args.test_slice.split(":"))
                test_seqs = data["test"][start:stop]
            scores = {}
            for estimator in args.estimators:
                torch.manual_seed(0)
                t0 = time.perf_counter()
                scores[estimator] = evaluate_bound(
                    model,
                    test_seqs,
                    batch_size=8,
                    method=estimator,
                    num_particles=values["ais_chains"],
                    num_betas=values["ais_betas"],
                    progress=True,
                )
                scores[estimator]["seconds"] = time.perf_counter() - t0
            test = scores[args.estimators[0]]
            run = {
                "test_loglik_per_step": test["per_step"],
                "test_sequences": len(test_seqs),
                "test_steps": test["num_steps"],
                "test_total_loglik": test["total"],
                "test_slice": args.test_slice,
                "test_stderr_per_step": test["stderr_per_step"],
                "estimator": args.estimators[0],
                "ais_seconds": test["seconds"],
                "estimates": {
                    k: {
                        "loglik_per_step": v["per_step"],
                        "stderr_per_step": v["stderr_per_step"],
                        "total_loglik": v["total"],
                        "seconds": v["seconds"],
                    }
                    for k, v in scores.items()
                },
                "target_met": test["per_step"] >= TARGET if data_name == "jsb" else None,
                "epochs": len(history),
                "best_epoch": history.best_epoch,
                "best_valid_pll_per_step": history.best_valid_elbo_per_step,
                "train_seconds": sum(r["seconds"] for r in history),
                "stop_reason": history.stop_reason,
                "num_hidden": model.num_hidden,
                "preset": PRESET.name,
                "overrides": dict(
                    overrides,
                    **({"model": model_name} if model_name != PRESET.model else {}),
                    **({"dataset": data_name} if DATASETS[data_name] != PRESET.data_file else {}),
                ),
                "train": {
                    k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()
                },
            }
            result["runs"].setdefault(data_name, {})[model_name] = run
            for k, v in scores.items():
                tqdm.write(
                    f"{data_name}/{model_name}: test log-likelihood {v['per_step']:.4f} +- "
                    f"{v['stderr_per_step']:.4f} nats/step ({k}), {len(history)} epochs"
                )
            write_result(name, result)
    return result


if __name__ == "__main__":
    main()
