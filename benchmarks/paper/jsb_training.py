"""Shared driver of the JSB Chorales training benchmarks (``jsb_srnn.py``, ``jsb_dmm.py``).

Trains with :func:`pyro_seq.train.fit` into a checkpoint folder (resumable: run the same
command again to continue), evaluates the best-validation weights on the test set, and writes
``benchmarks/results/<name>.json`` with the test bound in nats per step, the wall time, seconds
per epoch and every setting.
"""

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch  # noqa: E402
from common import ROOT, data_file, write_result  # noqa: E402

from pyro_seq.cli import add_train_options, train_config_from_args  # noqa: E402
from pyro_seq.data import load_piano_rolls  # noqa: E402
from pyro_seq.train import evaluate_bound, fit  # noqa: E402


def run(
    name, data_name, build_model, model_settings, config, target, reference, argv=None, eval_seeds=1
):
    """Parse the common options, train (resuming), evaluate and write the JSON result."""
    parser = argparse.ArgumentParser(description=f"{name}: {reference}")
    parser.add_argument("--data", default=None, help=f"path of {data_name}")
    parser.add_argument(
        "--out",
        default=None,
        help="checkpoint folder, resumed if it exists "
        "(default benchmarks/checkpoints/<name>[_<tag>])",
    )
    parser.add_argument("--eval-only", action="store_true", help="only evaluate the best weights")
    parser.add_argument(
        "--eval-seeds",
        type=int,
        default=eval_seeds,
        help="evaluate the test ELBO with seeds 0..N-1 and report the mean (and "
        "its standard error); the target is judged on the mean",
    )
    parser.add_argument("--tag", default="", help="suffix of the result name (a variant run)")
    add_train_options(parser, defaults=config)  # every TrainConfig field; the script's values
    args = parser.parse_args(argv)
    config = train_config_from_args(args, config)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    if args.tag:
        name = f"{name}_{args.tag}"
    if args.out is None:
        args.out = str(ROOT / "benchmarks" / "checkpoints" / name)
    data = load_piano_rolls(data_file(data_name, args.data))
    out = Path(args.out)
    torch.manual_seed(config.seed)
    model = build_model()
    started = time.time()
    history = []
    if not args.eval_only:
        history = fit(model, data["train"], data["valid"], config, out)
    else:
        history = json.loads((out / "log.json").read_text())
    wall = time.time() - started
    model.load_state_dict(torch.load(out / "best.pt", map_location="cpu", weights_only=True))
    runs = []
    for seed in range(max(1, args.eval_seeds)):
        torch.manual_seed(seed)
        runs.append(evaluate_bound(model, data["test"], batch_size=16))
    test = runs[0]
    per_seed = [r["per_step"] for r in runs]
    mean = statistics.mean(per_seed)
    stderr = statistics.stdev(per_seed) / len(per_seed) ** 0.5 if len(per_seed) > 1 else None
    valid_curve = [row.get("valid_elbo_per_step") for row in history]
    seconds = [row["seconds"] for row in history]
    result = {
        "benchmark": name,
        "data": data_name,
        "reference": reference,
        "test_elbo_per_step": mean,
        "test_elbo_stderr": stderr,
        "test_elbo_per_seed": per_seed,
        "test_kl_per_step": test["kl_per_step"],
        "test_num_steps": test["num_steps"],
        "estimator": f"ELBO, 1 sample, mean over {len(per_seed)} evaluation seed(s)",
        "target_test_elbo_per_step": target,
        "target_reached": mean >= target,
        "epochs_completed": len(history),
        "best_valid_elbo_per_step": max((v for v in valid_curve if v is not None), default=None),
        "seconds_per_epoch_mean": sum(seconds) / len(seconds) if seconds else None,
        "wall_seconds_this_invocation": wall,
        "wall_seconds_total_training": sum(seconds),
        "model": model_settings,
        "train": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
        "valid_curve": valid_curve,
    }
    print(
        f"{name}: test ELBO {mean:.4f} nats/step (mean of {len(per_seed)} seeds) after {len(history)} epochs "
        f"(target {target}); {result['seconds_per_epoch_mean'] or 0:.1f} s/epoch"
    )
    write_result(name, result)
    return result
