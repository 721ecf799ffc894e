"""ELBO vs IWAE vs FIVO training (K = 4) of an SRNN on JSB Chorales, all scored by FIVO K = 64.

Maddison et al. (2017, "Filtering variational objectives", Table 1) train the same sequential
model on the polyphonic-music data sets with the ELBO, IWAE and FIVO bounds at N = 4 particles
and evaluate every trained model with the same estimator; the bounds are ordered FIVO > IWAE >
ELBO. Their VRNN proposes from the past and the current frame only (a filtering proposal). This
script repeats the comparison with the SRNN on the original-resolution JSB Chorales
(``../shared/data/polyphonic/jsb_chorales.pickle``), with the settings of the presets
``srnn_jsb_bounds_elbo``, ``srnn_jsb_bounds_iwae`` and ``srnn_jsb_bounds_fivo``
(:mod:`pyro_seq.presets`; :data:`PRESETS`), which differ only in the objective:

* model: the presets' (GRU 128, z 32, MLPs of 128, the filtering proposal of the FIVO paper,
  Res_q); ``--size full`` (the thesis' Ch. 5 sizes of the preset ``srnn_jsb2x``: GRU 300,
  z 100, MLPs of 500) or ``small`` (64/16/64, a smoke test) and ``--inference smoothing``
  change it;
* each objective is trained by :func:`pyro_seq.train.fit` with its preset's training
  configuration (K = 4, no KL annealing, so that only the objective differs; the ELBO averages
  its 4 samples, drawn in one vectorized pass), into its own checkpoint folder
  ``benchmarks/checkpoints/<result name>/<objective>``. A flag that changes a preset's value
  (``--epochs``, ``--particles``, ``--kl-anneal-steps``, ``--size``, ``--inference``,
  ``--eval-particles``, ``--eval-seeds``) is an override, recorded in the result's
  ``overrides`` with the ``presets``;
* the objectives take turns, ``--round-epochs`` epochs each, so that at any stopping point
  they have had the same number of epochs (to within one round); ``--time-limit`` bounds the
  training time of one invocation (checked after each complete round) and running the same
  command again resumes every objective from its checkpoint;
* every trained model is evaluated on the test set by the presets' evaluation,
  ``evaluate_bound(model, test, method="smc", num_particles=64)`` with 5 seeds (FIVO's particle filter, ESS
  resampling, systematic scheme), both at the weights with the best validation ELBO and at the
  last weights; evaluations are cached next to the checkpoints until the run changes;
* the cost of one training step of FIVO vs IWAE (and the K-sample ELBO) is measured on the
  same real minibatches: ``loss_and_grads`` with the same model, median over ``--cost-steps``
  steps of CPU process time and wall time, objectives interleaved; target FIVO <= 1.3x IWAE.

Results go to ``benchmarks/results/bounds_jsb.json`` for the default model and to
``bounds_jsb_<size>_<inference>.json`` otherwise (``"smoke": true`` for ``--size small``).

    python benchmarks/paper/bounds_jsb.py --time-limit 7200 --no-cost     # run again to resume
    python benchmarks/paper/bounds_jsb.py --eval-only --no-cost           # evaluate what is trained
    python benchmarks/paper/bounds_jsb.py --size full --inference smoothing --cost-only
    python benchmarks/paper/bounds_jsb.py --size small --epochs 2 --round-epochs 1   # quick check

Everything runs with one torch thread by default (``--threads``): on a shared machine more
threads are usually slower.
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

import pyro  # noqa: E402
import torch  # noqa: E402
from common import ROOT, data_file, write_result  # noqa: E402

from pyro_seq.data import load_piano_rolls  # noqa: E402
from pyro_seq.data.batching import SequenceLoader  # noqa: E402
from pyro_seq.models import SRNN  # noqa: E402
from pyro_seq.presets import get_preset  # noqa: E402
from pyro_seq.train import evaluate_bound, fit, load_checkpoint, make_objective  # noqa: E402

NAME = "bounds_jsb"
OBJECTIVES = ("elbo", "iwae", "fivo")
#: The preset of each objective's run (result ``bounds_jsb.json``); they differ only in the
#: objective, so the shared settings are read from one of them (:data:`PRESET`).
PRESETS = {objective: f"srnn_jsb_bounds_{objective}" for objective in OBJECTIVES}
PRESET = get_preset(PRESETS["fivo"])
DATA = PRESET.data_file
SIZE_KEYS = ("d_dim", "z_dim", "hidden_dim")
#: ``--size``: the presets' sizes, the thesis's (those of the preset srnn_jsb2x) or tiny ones.
SIZES = {
    "full": {k: get_preset("srnn_jsb2x").model_options[k] for k in SIZE_KEYS},
    "medium": {k: PRESET.model_options[k] for k in SIZE_KEYS},
    "small": dict(d_dim=64, z_dim=16, hidden_dim=64),
}
DEFAULT_SIZE, DEFAULT_INFERENCE = "medium", PRESET.model_options["inference"]
#: ``--kl-anneal-steps N > 0`` anneals the KL weight from this value to 1 over N updates.
KL_START = 0.2
REFERENCE = (
    "Maddison et al. 2017, Filtering variational objectives, Table 1: with N = 4 the "
    "test bounds are ordered FIVO > IWAE > ELBO"
)
COST_TARGET = 1.3  # issue 4: one FIVO step at most 1.3x an IWAE step with the same K


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--objectives",
        nargs="+",
        choices=OBJECTIVES,
        default=list(OBJECTIVES),
        help="objectives to train in this invocation (all trained ones are evaluated)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help=f"maximum epochs in total per objective (presets: {PRESET.train['epochs']})",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds of training of this invocation, all objectives together, "
        "checked after each round (resume later)",
    )
    p.add_argument(
        "--round-epochs",
        type=int,
        default=10,
        help="epochs each objective trains in its turn (default 10)",
    )
    p.add_argument(
        "--particles",
        type=int,
        default=None,
        help=f"K of every training objective (presets: {PRESET.train['num_particles']})",
    )
    p.add_argument(
        "--size",
        choices=sorted(SIZES),
        default=None,
        help=f"SRNN sizes {SIZES} (presets: {DEFAULT_SIZE}; small is a smoke test)",
    )
    p.add_argument(
        "--inference",
        choices=("filtering", "smoothing"),
        default=None,
        help=f"SRNN inference network (presets: {DEFAULT_INFERENCE})",
    )
    p.add_argument(
        "--kl-anneal-steps",
        type=int,
        default=None,
        help=f"KL annealing from {KL_START} over this many updates (0: none, the presets')",
    )
    p.add_argument(
        "--eval-particles",
        type=int,
        default=None,
        help=f"K of the FIVO test estimator (presets: {PRESET.evaluation.particles})",
    )
    p.add_argument("--eval-batch-size", type=int, default=16)
    p.add_argument(
        "--eval-seeds",
        type=int,
        default=None,
        help="evaluations per weights (seeds 1234, 1235, ...); the mean is reported "
        f"(presets: {PRESET.evaluation.seeds})",
    )
    p.add_argument(
        "--cost-steps",
        type=int,
        default=7,
        help="minibatches in the step-cost measurement (median over them)",
    )
    p.add_argument("--no-cost", action="store_true", help="skip the step-cost measurement")
    p.add_argument("--cost-only", action="store_true", help="only measure the step cost")
    p.add_argument("--eval-only", action="store_true", help="no training, evaluate checkpoints")
    p.add_argument("--data", default=None, help=f"path of {DATA}")
    p.add_argument(
        "--out",
        default=None,
        help="checkpoint root (default benchmarks/checkpoints/"
        "<result name>); one folder per objective",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def build_model(options, seed):
    torch.manual_seed(seed)
    return SRNN(88, **options)


def settings(args):
    """The settings of a run: the presets' model options, each objective's
    :class:`~pyro_seq.train.TrainConfig` (its preset's, with this invocation's threads and
    progress bar; ``train``: the shared one), and the evaluation (``eval_particles``,
    ``eval_seeds``), with the flags that change a preset's value applied and listed in
    ``overrides`` (flag destination -> the value used; ``model_options``: the options
    changed), the ``size`` of :data:`SIZES` and the result's ``name``."""
    options = dict(PRESET.model_options)
    typed = dict(SIZES[args.size]) if args.size is not None else {}
    if args.inference is not None:
        typed["inference"] = args.inference
    overrides = {}
    changed = {k: v for k, v in typed.items() if options[k] != v}
    if changed:
        overrides["model_options"] = changed
        options.update(changed)
    base = PRESET.train_config()
    train = {}
    for flag, field in (("epochs", "epochs"), ("particles", "num_particles")):
        value = getattr(args, flag)
        if value is not None and value != getattr(base, field):
            overrides[flag] = train[field] = value
    steps = args.kl_anneal_steps
    if steps is not None and steps != base.kl_anneal_steps:
        overrides["kl_anneal_steps"] = steps
        train.update(kl_start=KL_START if steps > 0 else 1.0, kl_anneal_steps=steps)
    evaluation = {
        "eval_particles": PRESET.evaluation.particles,
        "eval_seeds": PRESET.evaluation.seeds,
    }
    for flag in evaluation:
        value = getattr(args, flag)
        if value is not None and value != evaluation[flag]:
            overrides[flag] = evaluation[flag] = value
    run = dict(num_threads=args.threads, progress=not args.quiet)
    configs = {o: replace(get_preset(PRESETS[o]).train_config(**train), **run) for o in OBJECTIVES}
    size = next(k for k, v in SIZES.items() if all(options[n] == v[n] for n in SIZE_KEYS))
    default = options == dict(PRESET.model_options)
    return {
        "name": NAME if default else f"{NAME}_{size}_{options['inference']}",
        "size": size,
        "model_options": options,
        "configs": configs,
        "train": replace(PRESET.train_config(**train), **run),
        "evaluation": evaluation,
        "overrides": overrides,
    }


def _jsonable(config):
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}


def epochs_done(folder):
    log = folder / "log.json"
    return len(json.loads(log.read_text())) if log.exists() else 0


def train_in_turns(args, run, data, out_root):
    """Train every objective in turn, ``--round-epochs`` at a time, resuming from checkpoints
    (``run``: :func:`settings`)."""
    started = time.time()
    configs = run["configs"]
    while True:
        todo = [o for o in args.objectives if epochs_done(out_root / o) < configs[o].epochs]
        if not todo:
            return
        for objective in todo:
            folder = out_root / objective
            epochs = min(configs[objective].epochs, epochs_done(folder) + args.round_epochs)
            config = replace(configs[objective], epochs=epochs)
            print(
                f"== {objective} (K={config.num_particles}) to epoch {config.epochs} in {folder}",
                flush=True,
            )
            model = build_model(run["model_options"], config.seed)
            fit(model, data["train"], data["valid"], config, folder)
        if args.time_limit is not None and time.time() - started > args.time_limit:
            print(f"time limit of {args.time_limit:.0f} s reached; run again to resume", flush=True)
            return


# ------------------------------------------------------------------ evaluation (cached)
def evaluate(model, folder, test, args, evaluation):
    """FIVO K=64 test bounds at the best-validation and at the last weights of one run: the
    mean over ``eval_seeds`` evaluations (seeds 1234, 1235, ...) and its standard error
    (``evaluation``: that of :func:`settings`)."""
    particles, seeds = evaluation["eval_particles"], evaluation["eval_seeds"]
    history = json.loads((folder / "log.json").read_text())
    key = {
        "epochs_completed": len(history),
        "num_particles": particles,
        "batch_size": args.eval_batch_size,
        "num_test_sequences": len(test),
        "eval_seeds": seeds,
    }
    cache = folder / f"eval_smc{particles}.json"
    if cache.exists():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached["result"], history
    result = {}
    weights = {
        "best_valid_elbo": torch.load(folder / "best.pt", map_location="cpu", weights_only=True),
        "last": load_checkpoint(folder / "checkpoint.pt")["model"],
    }
    for which, state_dict in weights.items():
        model.load_state_dict(state_dict)
        started = time.process_time()
        runs = []
        for i in range(max(1, seeds)):
            torch.manual_seed(1234 + i)
            runs.append(
                evaluate_bound(
                    model,
                    test,
                    batch_size=args.eval_batch_size,
                    method="smc",
                    num_particles=particles,
                )
            )
        per_seed = [ev["per_step"] for ev in runs]
        result[which] = {
            "per_step": statistics.mean(per_seed),
            "per_seed": per_seed,
            "stderr": (
                statistics.stdev(per_seed) / len(per_seed) ** 0.5 if len(per_seed) > 1 else None
            ),
            "num_steps": runs[0]["num_steps"],
            "cpu_seconds": time.process_time() - started,
        }
    cache.write_text(json.dumps({"key": key, "result": result}, indent=1))
    return result, history


def summarize(objective, folder, evaluation, history):
    seconds = [row["seconds"] for row in history]
    valid = [row.get("valid_elbo_per_step") for row in history]
    return {
        "objective": objective,
        "checkpoints": str(folder.relative_to(ROOT))
        if folder.is_relative_to(ROOT)
        else str(folder),
        "test_fivo_per_step_best_valid_elbo": evaluation["best_valid_elbo"]["per_step"],
        "test_fivo_per_step_last": evaluation["last"]["per_step"],
        "evaluation": evaluation,
        "epochs_completed": len(history),
        "updates": history[-1]["step"] if history else 0,
        "seconds_per_epoch_mean": sum(seconds) / len(seconds) if seconds else None,
        "wall_seconds_total_training": sum(seconds),
        "final_train_loss_per_step": history[-1]["train_loss_per_step"] if history else None,
        "best_valid_elbo_per_step": max((v for v in valid if v is not None), default=None),
        "valid_elbo_curve": valid,
    }


def ordering(results, key):
    """Whether FIVO > IWAE > ELBO holds for ``key`` (None when an objective is missing)."""
    if not all(o in results for o in OBJECTIVES):
        return None
    v = {o: results[o][key] for o in OBJECTIVES}
    return v["fivo"] > v["iwae"] > v["elbo"]


# ------------------------------------------------------------------ step cost
def step_cost(model_settings, train, args, config):
    """CPU and wall time of one ``loss_and_grads`` per objective on the same minibatches.

    One fresh model (seeded), the first ``--cost-steps`` minibatches of epoch 0 of the training
    loader, every objective on every minibatch in rotating order (after one warm-up step each),
    the same random seed per minibatch for every objective; Pyro validation off, as in ``fit``.
    """
    model = build_model(model_settings, config.seed)
    loader = SequenceLoader(train, config.batch_size, shuffle=True, seed=config.seed)
    batches = [b for _, b in zip(range(args.cost_steps + 1), loader.batches(0))]
    names = ("iwae", "fivo", "elbo")
    losses = {n: make_objective(n, config.num_particles) for n in names}
    cpu = {n: [] for n in names}
    wall = {n: [] for n in names}
    pyro.clear_param_store()
    with pyro.validation_enabled(False):
        for n in names:  # warm-up
            losses[n].loss_and_grads(model.model, model.guide, *batches[0])
            model.zero_grad()
        for i, (x, mask) in enumerate(batches[1:]):
            order = names[i % 3 :] + names[: i % 3]
            for n in order:
                torch.manual_seed(i)
                c0, w0 = time.process_time(), time.perf_counter()
                losses[n].loss_and_grads(model.model, model.guide, x, mask)
                cpu[n].append(time.process_time() - c0)
                wall[n].append(time.perf_counter() - w0)
                model.zero_grad()
    med = {
        n: {
            "cpu_seconds_median": statistics.median(cpu[n]),
            "wall_seconds_median": statistics.median(wall[n]),
            "cpu_seconds": cpu[n],
            "wall_seconds": wall[n],
        }
        for n in names
    }
    ratio_cpu = med["fivo"]["cpu_seconds_median"] / med["iwae"]["cpu_seconds_median"]
    ratio_wall = med["fivo"]["wall_seconds_median"] / med["iwae"]["wall_seconds_median"]
    paired = statistics.median(f / i for f, i in zip(cpu["fivo"], cpu["iwae"]))
    return {
        "what": "one loss_and_grads (forward + backward) per minibatch; same model, minibatches "
        "and seeds for every objective; objectives interleaved",
        "num_particles": config.num_particles,
        "batch_size": config.batch_size,
        "minibatch_steps": [int(m.shape[1]) for _, m in batches[1:]],
        "objectives": med,
        "fivo_over_iwae_cpu": ratio_cpu,
        "fivo_over_iwae_wall": ratio_wall,
        "fivo_over_iwae_cpu_paired_median": paired,
        "target_fivo_over_iwae": COST_TARGET,
        "target_met_cpu": ratio_cpu <= COST_TARGET,
    }


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    run = settings(args)
    model_options, evaluation, name = run["model_options"], run["evaluation"], run["name"]
    out_root = Path(args.out) if args.out else ROOT / "benchmarks" / "checkpoints" / name
    data = load_piano_rolls(data_file(DATA, args.data))

    previous = {}
    result_path = ROOT / "benchmarks" / "results" / f"{name}.json"
    if result_path.exists():
        previous = json.loads(result_path.read_text())

    if not args.cost_only and not args.eval_only:
        train_in_turns(args, run, data, out_root)

    results = {}
    if not args.cost_only:
        for objective in OBJECTIVES:
            folder = out_root / objective
            if not (folder / "checkpoint.pt").exists():
                continue
            model = build_model(model_options, 0)
            scores, history = evaluate(model, folder, data["test"], args, evaluation)
            results[objective] = summarize(objective, folder, scores, history)
            print(
                f"{objective}: FIVO K={evaluation['eval_particles']} test bound (mean of "
                f"{evaluation['eval_seeds']} seeds) "
                f"{results[objective]['test_fivo_per_step_best_valid_elbo']:.4f} nats/step "
                f"(best valid ELBO weights), {results[objective]['test_fivo_per_step_last']:.4f} "
                f"(last) after {results[objective]['epochs_completed']} epochs, "
                f"{results[objective]['seconds_per_epoch_mean'] or 0:.1f} s/epoch",
                flush=True,
            )
    else:
        results = previous.get("objectives", {})

    cost = previous.get("step_cost")
    if not args.no_cost:
        cost = step_cost(model_options, data["train"], args, run["train"])
        print(
            f"step cost: FIVO/IWAE = {cost['fivo_over_iwae_cpu']:.2f} (CPU), "
            f"{cost['fivo_over_iwae_wall']:.2f} (wall); IWAE "
            f"{cost['objectives']['iwae']['cpu_seconds_median']:.3f} s, FIVO "
            f"{cost['objectives']['fivo']['cpu_seconds_median']:.3f} s CPU per step "
            f"(target <= {COST_TARGET})",
            flush=True,
        )

    payload = {
        "benchmark": name,
        "data": DATA,
        "reference": REFERENCE,
        "smoke": run["size"] == "small",
        "note": (
            "--size small: a quick end-to-end check of the script, not the benchmark"
            if run["size"] == "small"
            else f"{run['size']} SRNN, {model_options['inference']} inference"
        ),
        "expected_ordering": "fivo > iwae > elbo",
        "ordering_reproduced_best_valid_elbo": ordering(
            results, "test_fivo_per_step_best_valid_elbo"
        ),
        "ordering_reproduced_last": ordering(results, "test_fivo_per_step_last"),
        "test_fivo_per_step_best_valid_elbo": {
            o: r["test_fivo_per_step_best_valid_elbo"] for o, r in results.items()
        },
        "test_fivo_per_step_last": {o: r["test_fivo_per_step_last"] for o, r in results.items()},
        "estimator": {
            "function": "pyro_seq.train.evaluate_bound",
            "method": "smc",
            "num_particles": evaluation["eval_particles"],
            "resample": "ess",
            "resampling": "systematic",
            "batch_size": args.eval_batch_size,
            "seeds": list(range(1234, 1234 + max(1, evaluation["eval_seeds"]))),
            "reported": "mean over the seeds (per_seed and stderr per objective)",
        },
        "objectives": results,
        "step_cost": cost,
        "model": dict(model_options, obs_dim=88),
        "train": dict(
            _jsonable(run["train"]),
            objective="one run per objective: " + ", ".join(OBJECTIVES),
        ),
        "presets": PRESETS,
        "overrides": run["overrides"],
    }
    write_result(name, payload)
    return payload


if __name__ == "__main__":
    main()
