"""Every model x {ELBO, IWAE(4), FIVO(4)} on JSB Chorales (original resolution), equal budget.

The settings come from the presets (:mod:`pyro_seq.presets`), so that the docs' tables, this
script and ``pyro-seq train --preset`` cannot drift apart: a cell with a published
configuration (:data:`CELL_PRESETS`: ``storn/elbo``, ``vosp/elbo``, ``vrae/elbo``,
``vrnn/fivo``, ``vrnn/elbo``) trains its preset's model, options and training configuration
and is scored by its evaluation; every other cell takes the zoo's shared configuration (that
of the STORN preset: batch 16, K = 4, at most 500 epochs, seed 0) with its own model at the
model's default sizes and its own objective. A flag that changes a preset's value
(``--particles``, ``--epochs``, ``--budget``, ``--eval``, ``--eval-particles``, ``--small``, a
``--dataset`` or ``--likelihood`` other than JSB's) is an override, recorded in the cell's
``overrides``; each cell also records its ``preset``, ``model_options`` and ``train``.

Each cell trains one architecture with one objective through :func:`pyro_seq.train.fit` into
its own checkpoint folder ``benchmarks/checkpoints/zoo_jsb[_<tag>]/<model>_<objective>``, for at
most ``--budget`` seconds of training in total (default: the preset's time limit), the sum of
the epoch times in its log (with the presets' ``time_limit_counts="cpu"``: the CPU seconds of
the training epochs, so that neither a FIVO cell's costlier validation bound nor another job on
the same cores eats its budget), and the
budget holds across invocations: run the same command again to resume every unfinished cell.
Then the best-validation weights are scored on the test set by the same estimator for every
cell (IWAE with 64 particles, or ``--eval smc``), and, in generation mode (not
teacher-forced), by the log-likelihood of the second half of test sequences under the mixture of
``--forecast-samples`` continuations of their first half (:func:`pyro_seq.tasks.forecast`).

Results go to ``benchmarks/results/zoo_jsb[_<tag>].json`` with the published numbers beside
them (Bayer & Osendorfer 2014, Table 1; Krishnan et al. 2017, Table 3; Maddison et al. 2017,
Table 1). Every row of every training log must be finite ("no NaN in any cell").

Usage::

    python benchmarks/paper/zoo_jsb.py --threads 1                          # all cells, resumable
    python benchmarks/paper/zoo_jsb.py --models vrnn --objectives fivo --tag s20vrnn_fivo
    python benchmarks/paper/zoo_jsb.py --small --budget 20 --tag smoke       # a quick check
"""

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch  # noqa: E402
from common import ROOT, data_file, write_result  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from pyro_seq.data import load_dataset, load_piano_rolls, pad_sequences  # noqa: E402
from pyro_seq.infer import estimate_log_likelihood  # noqa: E402
from pyro_seq.models import MODELS  # noqa: E402
from pyro_seq.presets import get_preset  # noqa: E402
from pyro_seq.tasks import forecast  # noqa: E402
from pyro_seq.train import fit  # noqa: E402
from pyro_seq.train.checkpoint import load_weights  # noqa: E402

#: The presets of the recorded cells, by cell (``model/objective``): each such cell trains the
#: preset's model, model options and training configuration and is scored by its evaluation.
CELL_PRESETS = {
    "storn/elbo": "storn_jsb",
    "vosp/elbo": "vosp_jsb",
    "vrae/elbo": "vrae_jsb",
    "vrnn/fivo": "vrnn_jsb_fivo",
    "vrnn/elbo": "vrnn_jsb_elbo",
}
#: The preset whose settings every other cell takes, with the cell's model (at its default
#: sizes, the sizes of its paper) and objective: the zoo's shared configuration.
SHARED_PRESET = "storn_jsb"
#: ``--budget`` of the cells without a preset (training seconds per cell).
DEFAULT_BUDGET = 3600.0
ZOO_MODELS = ("dmm", "srnn", "vrnn", "vaernn", "storn", "vosp", "vrae", "rnn")
#: ``--small``: tiny networks for a quick check (model options over the preset's).
SMALL = {
    "dmm": dict(z_dim=8, transition_dim=16, emission_dim=16, rnn_dim=16),
    "srnn": dict(d_dim=16, z_dim=8, hidden_dim=16),
    "vrnn": dict(d_dim=16, z_dim=8, hidden_dim=16, feature_dim=16),
    "vaernn": dict(d_dim=16, z_dim=8, hidden_dim=16),
    "storn": dict(z_dim=8, rnn_dim=16, emission_dim=16),
    "vosp": dict(z_dim=4, rnn_dim=16, emission_dim=16),
    "vrae": dict(z_dim=8, encoder_dim=16, decoder_dim=16, emission_dim=16),
    "rnn": dict(d_dim=16, hidden_dim=16),
}
OBJECTIVES = ("elbo", "iwae", "fivo")
PUBLISHED = {
    "vrae": "Bayer & Osendorfer (2014), Table 1: VRAE NLL < 5.53 on JSB (test bound >= -5.53 "
    "nats/step)",
    "storn": "Bayer & Osendorfer (2014) as quoted in Fraccaro (2018), Table 5.2: STORN "
    "approx. -6.91 on JSB (an importance-sampled estimate)",
    "vosp": "Bayer & Osendorfer (2014), Table 1: VOSP NLL < 6.21 on JSB (Wiener prior)",
    "rnn": "Bayer & Osendorfer (2014), Table 1: 'plain' RNN NLL 8.58 on JSB (target >= -8.58)",
    "dmm": "Krishnan et al. 2017 Table 3: DKS (DMM) -6.93 on JSB; Pyro's example -6.87 after 5000 epochs",
    "srnn": "thesis Table 5.2: SRNN smooth+Res_q >= -4.74 on JSB (Bernoulli, ELBO)",
    "vrnn": "Maddison et al. 2017 Table 1: FIVO > IWAE > ELBO at N = 4",
    "vaernn": "thesis 4.4.1 (no published JSB number)",
}
TARGETS = {"storn": -6.91, "vosp": -6.21, "vrae": -5.53, "rnn": -8.58, "dmm": -6.93}


def cell_settings(model_name, objective, args, likelihood_options=None):
    """The settings of one cell: its preset (:data:`CELL_PRESETS`; else :data:`SHARED_PRESET`
    with the cell's model at its default sizes and the cell's objective), the model options,
    the :class:`~pyro_seq.train.TrainConfig` (``time_limit``: the cell's whole budget) and the
    evaluation, with the flags that change a preset's value applied and listed in
    ``overrides`` (flag destination -> the value used)."""
    name = CELL_PRESETS.get(f"{model_name}/{objective}")
    preset = get_preset(name or SHARED_PRESET)
    options = dict(preset.model_options) if name else {}
    config = preset.train_config(objective=objective)
    if name is None:
        config = replace(config, time_limit=DEFAULT_BUDGET)
    evaluation = {
        "eval": preset.evaluation.objective,
        "eval_particles": preset.evaluation.particles,
    }
    overrides = {}
    for flag, field in (
        ("particles", "num_particles"),
        ("epochs", "epochs"),
        ("budget", "time_limit"),
        ("seed", "seed"),
    ):
        value = getattr(args, flag)
        if value is not None and value != getattr(config, field):
            overrides[flag] = value
            config = replace(config, **{field: value})
    for flag in evaluation:
        value = getattr(args, flag)
        if value is not None and value != evaluation[flag]:
            overrides[flag] = evaluation[flag] = value
    extra = dict(SMALL[model_name] if args.small else {}, **(likelihood_options or {}))
    if extra:
        overrides["model_options"] = extra
        options.update(extra)
    return {
        "preset": name,
        "model_options": options,
        "config": config,
        "evaluation": evaluation,
        "overrides": overrides,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(ZOO_MODELS), choices=ZOO_MODELS)
    p.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=OBJECTIVES)
    p.add_argument(
        "--particles",
        type=int,
        default=None,
        help="K of IWAE and FIVO (and the K-sample ELBO); default: the presets' (4)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="training seconds per cell in total; default: each cell's preset's time limit "
        f"({DEFAULT_BUDGET:.0f} s for the cells without a preset)",
    )
    p.add_argument(
        "--epochs", type=int, default=None, help="at most this many epochs per cell (presets: 500)"
    )
    p.add_argument(
        "--eval", choices=("iwae", "smc"), default=None, help="test estimator (presets: iwae)"
    )
    p.add_argument("--eval-particles", type=int, default=None, help="its particles (presets: 64)")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the initial weights and of training (presets: 0); evaluation stays at 0",
    )
    p.add_argument("--forecast-sequences", type=int, default=20)
    p.add_argument("--forecast-samples", type=int, default=100)
    p.add_argument("--forecast-steps", type=int, default=16, help="at most this many future steps")
    p.add_argument(
        "--small", action="store_true", help="tiny networks (a quick check; a model override)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default=None, help="path of jsb_chorales.pickle")
    p.add_argument(
        "--dataset",
        choices=("jsb", "japanese_vowels"),
        default="jsb",
        help="japanese_vowels: real-valued (needs pyro-seq[data]); no forecasting score",
    )
    p.add_argument(
        "--likelihood",
        choices=("bernoulli", "gaussian", "gmm"),
        default=None,
        help="emission family (default: bernoulli for jsb, gaussian otherwise)",
    )
    p.add_argument("--num-components", type=int, default=5, help="components of the gmm emission")
    p.add_argument("--tag", default="", help="suffix of the result name and checkpoint folder")
    return p.parse_args(argv)


def used_seconds(out, counts="training"):
    """The budget a cell has used over all its invocations: the sum of its epochs' training
    seconds (``counts="training"``) or CPU seconds (``"cpu"``; a row written before the CPU
    column existed counts its wall seconds), and its log rows."""
    log = out / "log.json"
    if not log.exists():
        return 0.0, []
    rows = json.loads(log.read_text())
    column = "cpu_seconds" if counts == "cpu" else "seconds"
    return float(sum(r.get(column, r["seconds"]) for r in rows)), rows


def forecast_score(model, test, args):
    """Mean per-step log-likelihood of the true second half under the forecast mixture."""
    seqs = [s for s in test if s.shape[0] >= 4][: args.forecast_sequences]
    totals, steps = 0.0, 0
    for s in seqs:
        half = s.shape[0] // 2
        k = min(args.forecast_steps, s.shape[0] - half)
        res = forecast(
            model,
            s[:half].unsqueeze(0),
            k,
            num_samples=args.forecast_samples,
            target=s[half : half + k].unsqueeze(0),
        )
        totals += float(res.log_prob.sum())
        steps += k
    return totals / steps, len(seqs), steps


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    likelihood = args.likelihood or ("bernoulli" if args.dataset == "jsb" else "gaussian")
    em = {} if likelihood == "bernoulli" else {"likelihood": likelihood}
    if likelihood == "gmm":
        em["num_components"] = args.num_components
    base = "zoo_jsb" if args.dataset == "jsb" else f"zoo_vowels_{likelihood}"
    name = base + (f"_{args.tag}" if args.tag else "")
    root = ROOT / "benchmarks" / "checkpoints" / name
    if args.dataset == "jsb":
        data = load_piano_rolls(data_file(get_preset(SHARED_PRESET).data_file, args.data))
    else:
        data = load_dataset("japanese_vowels")
    D = data["train"][0].shape[-1]
    test_x, test_mask = pad_sequences(data["test"])
    cells = [(m, o) for m in args.models for o in args.objectives]
    results = {}
    for model_name, objective in tqdm(cells, desc="zoo cells"):
        out = root / f"{model_name}_{objective}"
        cell_set = cell_settings(model_name, objective, args, em)
        counts = cell_set["config"].time_limit_counts
        used, _ = used_seconds(out, counts)
        if args.dataset != "jsb":
            cell_set["overrides"]["dataset"] = args.dataset
        budget = cell_set["config"].time_limit
        evaluation = cell_set["evaluation"]
        torch.manual_seed(cell_set["config"].seed)
        model = MODELS[model_name].for_data(D, 0, **cell_set["model_options"])
        config = replace(
            cell_set["config"],
            time_limit=max(budget - used, 1.0),
            num_threads=args.threads,
            progress=False,
        )
        if used < budget:
            fit(model, data["train"], data["valid"], config, out)
        used, rows = used_seconds(out, counts)
        finite = all(
            math.isfinite(r["train_loss_per_step"])
            and math.isfinite(r.get("valid_elbo_per_step", 0.0))
            for r in rows
        )
        model.load_state_dict(load_weights(out / "best.pt"))
        model.eval()
        torch.manual_seed(0)
        start = time.perf_counter()
        est = estimate_log_likelihood(
            model.model,
            model.guide,
            (test_x, test_mask),
            method=evaluation["eval"],
            num_particles=evaluation["eval_particles"],
            batch_size=8,
            particles_per_pass=16 if evaluation["eval"] == "iwae" else None,
        )
        eval_seconds = time.perf_counter() - start
        torch.manual_seed(0)
        fc, fc_seqs, fc_steps = (
            forecast_score(model, data["test"], args) if likelihood == "bernoulli" else (None, 0, 0)
        )
        cell = {
            "model": model_name,
            "objective": objective,
            "likelihood": likelihood,
            "epochs": len(rows),
            "train_seconds": used,
            "all_losses_finite": finite,
            "test_bound_per_step": est.nats_per_step,
            "estimator": f"{evaluation['eval'].upper()}({evaluation['eval_particles']})",
            "eval_seconds": eval_seconds,
            "forecast_loglik_per_step": fc,
            "forecast_sequences": fc_seqs,
            "forecast_steps": fc_steps,
            "published": PUBLISHED[model_name] if args.dataset == "jsb" else None,
            "preset": cell_set["preset"],
            "overrides": cell_set["overrides"],
            "model_options": cell_set["model_options"],
            "train": {
                k: list(v) if isinstance(v, tuple) else v
                for k, v in asdict(replace(cell_set["config"], num_threads=args.threads)).items()
            },
        }
        if model_name in TARGETS and args.dataset == "jsb":
            cell["target"] = TARGETS[model_name]
            cell["target_met"] = est.nats_per_step >= TARGETS[model_name]
        results[f"{model_name}/{objective}"] = cell
        tqdm.write(
            f"{model_name:7s} {objective:5s} test {cell['estimator']} "
            f"{est.nats_per_step:8.4f} nats/step, forecast {fc}, "
            f"{len(rows)} epochs in {used:.0f} s, finite={finite}"
        )
    write_result(
        name,
        {
            "benchmark": name,
            "likelihood": likelihood,
            "data": (
                "JSB Chorales (Boulanger-Lewandowski split)"
                if args.dataset == "jsb"
                else "JapaneseVowels (aeon's bundled UEA copy, standardised)"
            ),
            "settings": vars(args),
            "cells": results,
        },
    )
    return results


if __name__ == "__main__":
    main()
