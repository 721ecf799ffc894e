"""Does ``pyro-seq train --nproc 2`` train like one process? SRNN validation curves on JSB.

Issue 13's acceptance item: "``pyro-seq train --nproc 2 ...`` trains SRNN on JSB with 2
processes; its validation curve matches the 1-process run within noise". Runs of the command
line as users run it (a subprocess each, ``python -m pyro_seq.cli train``), SRNN with the package
defaults (GRU 300, z 100, MLPs 500, smoothing + Res_q; the CLI's training defaults: batch 20,
Adam 1e-3 with the plateau schedule, KL annealing from 0.2 over 1000 updates, early stopping
after 12 epochs without improvement) on the original-resolution JSB Chorales
(``../shared/data/polyphonic/jsb_chorales.pickle``, its own train/valid/test split), one torch
thread per process (``--threads 1``). Four seeds, each with 1 and with 2 processes:

====  =========  ====  ====  =========  ====
run   processes  seed  run   processes  seed
====  =========  ====  ====  =========  ====
a     1          0     b     2          0
c     1          1     d     2          1
e     1          2     f     2          2
g     1          3     h     2          3
====  =========  ====  ====  =========  ====

With the same seed the two runs start from the same weights and see the same minibatches; with
2 processes each rank trains on half of every minibatch with its own sampling stream and the
gradients are summed, so the two differ by the Monte Carlo draws of the ELBO's latent samples
(and float rounding) only. The gradient of one step equals the 1-process gradient exactly for
a deterministic objective (``tests/train/test_distributed.py``); what is left to judge is noise.

The rule ("within noise"): a permutation test of the process count. Over the first ``E``
epochs that every run completed (``--compare-epochs``, default all common epochs), with
``m_1(e)`` and ``m_2(e)`` the mean validation ELBO (nats per step) of the 1-process and of the
2-process runs at epoch ``e``, the statistic is ``S = mean_e |m_1(e) - m_2(e)|``. It is computed
for every way of splitting the 8 runs into two groups of 4 (70 splits); the p-value is the
fraction of splits with a statistic at least the observed one. The curves match within noise
when ``p >= 0.05``: labelling runs by their process count separates the curves no more than a
random labelling of the same runs does. The same test on the best validation value of each run
is reported beside it, with each group's mean and standard deviation. A test that does not
reject is not a proof of equality: the result also states the observed ``S`` against the
seed-to-seed spread (the mean over epochs of the per-epoch standard deviation of the 1-process
runs).

Runs ``a``-``d`` were made for the first version of this script (50 epochs each, judged then by
a rule on one pair of runs that this test replaces); their curves are read from an earlier
result (``--reuse PATH``) when their folders are absent. Every run trains into
``benchmarks/checkpoints/nproc_curve/<run>`` (``--work-dir``); a run whose folder holds
``test.json`` (written by the CLI when training has finished) is skipped, and an interrupted one
resumes from its checkpoint (the CLI resumes by default), so running the same command again
continues. Progress: one line per finished epoch. Writes ``benchmarks/results/nproc_curve.json``
(``--output``) and ``nproc_curve.png`` next to it::

    nohup python benchmarks/speed/nproc_curve.py --epochs 30 > ../bench_logs/nproc_curve.log 2>&1 &
    python benchmarks/speed/nproc_curve.py --epochs 2 --runs a b --model-option d_dim=8 \\
        --model-option z_dim=2 --model-option hidden_dim=8 --work-dir /tmp/nc \\
        --output /tmp/nc/nproc_curve.json  # a check
"""

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean, stdev

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
sys.path.insert(0, str(ROOT))  # this checkout's package, also in the subprocesses (PYTHONPATH)

from common import RESULTS, SHARED_DATA, write_result  # noqa: E402

RUNS = {  # name: (processes, seed)
    "a": (1, 0),
    "b": (2, 0),
    "c": (1, 1),
    "d": (2, 1),
    "e": (1, 2),
    "f": (2, 2),
    "g": (1, 3),
    "h": (2, 3),
}
#: the significance level of the rule (module docstring)
LEVEL = 0.05


def describe(name):
    nproc, seed = RUNS[name]
    return f"{nproc} process{'es' if nproc > 1 else ''}, seed {seed}"


def permutation_test(group1, group2, statistic):
    """Exact permutation test of a group label: ``statistic(g1, g2)`` for the observed split and
    for every split of the pooled items into groups of the same sizes.

    :returns: ``(observed, p)``; ``p`` is the fraction of splits (the observed one included)
        whose statistic is at least the observed one (up to 1e-12).
    """
    pooled = list(group1) + list(group2)
    n1 = len(group1)
    if n1 == 0 or len(group2) == 0:
        raise ValueError("both groups need at least one run")
    observed = statistic(list(group1), list(group2))
    count = total = 0
    for chosen in itertools.combinations(range(len(pooled)), n1):
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        value = statistic([pooled[i] for i in chosen], rest)
        count += value >= observed - 1e-12
        total += 1
    return observed, count / total


def _sd(values):
    """Sample standard deviation (n - 1), 0 for a single value."""
    return stdev(values) if len(values) > 1 else 0.0


def curve_gap(g1, g2):
    """``mean_e |mean of g1 at e - mean of g2 at e|`` for curves of equal length."""
    return mean([abs(mean(a) - mean(b)) for a, b in zip(zip(*g1), zip(*g2))])


def judge(curves, compare_epochs=None):
    """The rule of the module docstring. ``curves``: ``{run name: validation ELBO per epoch}``
    with the runs of both process counts; the first ``compare_epochs`` epochs (default: all
    that every run completed) are compared. Returns a dict of the numbers and the verdict."""
    n = min(len(c) for c in curves.values())
    if compare_epochs is not None:
        n = min(n, compare_epochs)
    if n == 0:
        raise ValueError("no epoch completed by every run")
    one = [curves[k][:n] for k in sorted(curves) if RUNS[k][0] == 1]
    two = [curves[k][:n] for k in sorted(curves) if RUNS[k][0] == 2]
    gap, p_curve = permutation_test(one, two, curve_gap)
    best1, best2 = [max(c) for c in one], [max(c) for c in two]
    best_gap, p_best = permutation_test(best1, best2, lambda a, b: abs(mean(a) - mean(b)))
    spread = mean([_sd(col) for col in zip(*one)]) if len(one) > 1 else None
    return {
        "epochs_compared": n,
        "runs_1_process": [k for k in sorted(curves) if RUNS[k][0] == 1],
        "runs_2_processes": [k for k in sorted(curves) if RUNS[k][0] == 2],
        "curve_gap": gap,
        "p_curve": p_curve,
        "seed_spread_1_process": spread,
        "best_valid_1_process": {"mean": mean(best1), "sd": _sd(best1), "values": best1},
        "best_valid_2_processes": {"mean": mean(best2), "sd": _sd(best2), "values": best2},
        "best_gap": best_gap,
        "p_best": p_best,
        "splits": math.comb(len(one) + len(two), len(one)),
        "within_noise": p_curve >= LEVEL,
    }


def _read_log(folder):
    path = Path(folder) / "log.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet, or being rewritten
        return None


def _train(name, args, folder, done_epochs, total_epochs, started):
    """Run ``pyro-seq train`` for run ``name`` into ``folder``, printing a line per epoch."""
    nproc, seed = RUNS[name]
    what = describe(name)
    cmd = [
        sys.executable,
        "-m",
        "pyro_seq.cli",
        "train",
        "--model",
        "srnn",
        "--data",
        str(args.data),
        "--epochs",
        str(args.epochs),
        "--nproc",
        str(nproc),
        "--threads",
        str(args.threads),
        "--seed",
        str(seed),
        "--out",
        str(folder),
        "--quiet",
    ]
    for option in args.model_option or []:
        cmd += ["--model-option", option]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
    )
    print(f"[{name}] {what}: {' '.join(cmd[1:])}", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "cli_output.txt", "a") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        seen = len(_read_log(folder) or [])
        run_started, run_seen0 = time.time(), seen
        while True:
            finished = proc.poll() is not None
            rows = _read_log(folder) or []
            for row in rows[seen:]:
                seen += 1
                new = seen - run_seen0
                per_epoch = (time.time() - run_started) / max(new, 1)
                left = (args.epochs - seen + total_epochs - done_epochs - args.epochs) * per_epoch
                print(
                    f"[{name}] epoch {row['epoch']}/{args.epochs}  valid ELBO "
                    f"{row.get('valid_elbo_per_step', float('nan')):.4f}  train "
                    f"{row['seconds']:.1f} s  (elapsed {(time.time() - started) / 60:.1f} min, "
                    f"about {max(left, 0) / 60:.0f} min left)",
                    flush=True,
                )
            if finished:
                break
            time.sleep(5)
    if proc.returncode != 0:
        tail = (folder / "cli_output.txt").read_text()[-2000:]
        raise SystemExit(f"run {name} failed (exit code {proc.returncode}):\n{tail}")
    return len(_read_log(folder) or [])


def plot(curves, verdict, path, cuts=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(7, 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    n = verdict["epochs_compared"]
    for name, curve in sorted(curves.items()):
        nproc = RUNS[name][0]
        color, ls = ("C0", "-") if nproc == 1 else ("C3", "--")
        top.plot(
            range(1, len(curve) + 1),
            curve,
            color=color,
            ls=ls,
            lw=1.1,
            alpha=0.8,
            label=f"{name}: {describe(name)}",
        )
        for epoch in (cuts or {}).get(name, []):  # the plateau schedule halved the rate here
            top.plot([epoch], [curve[epoch - 1]], marker="v", color=color, ms=5, ls="none")
    top.axvline(n + 0.5, color="grey", lw=0.8, ls=":")
    top.set_ylabel("validation ELBO (nats / step)")
    top.set_title("SRNN on JSB Chorales: pyro-seq train --nproc 2 (dashed) against 1 process")
    later = [v for c in curves.values() for v in c[2:]]
    if later:  # the first two epochs are far below the rest: keep the later range in view
        top.set_ylim(min(later) - 0.3, max(later) + 0.2)
    top.legend(
        fontsize=7,
        ncol=2,
        title="triangles: learning rate halved" if cuts else None,
        title_fontsize=7,
    )
    top.grid(alpha=0.3)
    one = [curves[k][:n] for k in verdict["runs_1_process"]]
    two = [curves[k][:n] for k in verdict["runs_2_processes"]]
    epochs = range(1, n + 1)
    bottom.plot(
        epochs,
        [abs(mean(a) - mean(b)) for a, b in zip(zip(*one), zip(*two))],
        color="C3",
        label="|mean 1 process - mean 2 processes|",
    )
    if len(one) > 1:
        bottom.plot(
            epochs,
            [_sd(col) for col in zip(*one)],
            color="C0",
            ls=":",
            label="sd over seeds, 1 process",
        )
    if len(two) > 1:
        bottom.plot(
            epochs,
            [_sd(col) for col in zip(*two)],
            color="C3",
            ls=":",
            label="sd over seeds, 2 processes",
        )
    bottom.set_yscale("log")
    bottom.set_xlabel("epoch")
    bottom.set_ylabel("nats / step")
    bottom.set_title(
        f"permutation test over {verdict['splits']} splits: p = {verdict['p_curve']:.2f}",
        fontsize=9,
    )
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30, help="epochs per new run (default 30)")
    parser.add_argument(
        "--compare-epochs",
        type=int,
        default=None,
        help="compare the first E epochs (default: all that every run completed)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=SHARED_DATA / "jsb_chorales.pickle",
        help="piano-roll pickle (default the shared original-resolution JSB)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--runs",
        nargs="+",
        default=list(RUNS),
        choices=list(RUNS),
        help="runs to include (default all eight)",
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        default=RESULTS / "nproc_curve.json",
        help="earlier result whose recorded runs stand in for absent folders",
    )
    parser.add_argument(
        "--model-option",
        action="append",
        metavar="KEY=VALUE",
        help="passed to the CLI (a quick check with a small model); the recorded result uses none",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=ROOT / "benchmarks" / "checkpoints" / "nproc_curve",
        help="run folders (resumed, or skipped when finished)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=RESULTS / "nproc_curve.json",
        help="result JSON (the figure goes next to it)",
    )
    args = parser.parse_args(argv)
    if not args.data.exists():
        raise SystemExit(f"data file {args.data} not found; pass --data PATH")
    started = time.time()
    names = [name for name in RUNS if name in args.runs]
    if not ({RUNS[k][0] for k in names} == {1, 2}):
        raise SystemExit("--runs must include runs with 1 and with 2 processes")
    reused = {}
    if args.reuse and args.reuse.exists() and not args.model_option:
        reused = json.loads(args.reuse.read_text()).get("runs", {})
    runs, curves, cuts = {}, {}, {}
    done_epochs, total_epochs = 0, len(names) * args.epochs
    for name in names:
        folder = args.work_dir / name
        if not (folder / "test.json").exists() and name in reused:
            runs[name] = dict(reused[name], reused_from=str(args.reuse.name))
            curves[name] = runs[name]["valid_elbo_per_step"]
            cuts[name] = runs[name].get("lr_halved_after_epochs", [])
            print(f"[{name}] recorded in {args.reuse.name}, reused", flush=True)
            continue
        if (folder / "test.json").exists():  # finished: the CLI writes it last
            print(f"[{name}] done already ({folder}), skipped", flush=True)
        else:
            _train(name, args, folder, done_epochs, total_epochs, started)
        done_epochs += args.epochs
        nproc, seed = RUNS[name]
        rows = _read_log(folder)
        config = json.loads((folder / "config.json").read_text())
        test = json.loads((folder / "test.json").read_text())
        curves[name] = [row["valid_elbo_per_step"] for row in rows]
        seconds = [row["seconds"] for row in rows]
        cuts[name] = [i for i in range(1, len(rows)) if rows[i]["lr"] < rows[i - 1]["lr"]]
        runs[name] = {
            "description": describe(name),
            "nproc": nproc,
            "seed": seed,
            "folder": str(folder),
            "epochs_completed": len(rows),
            "valid_elbo_per_step": curves[name],
            "train_seconds_per_epoch": seconds,
            "train_seconds_per_epoch_median": sorted(seconds)[len(seconds) // 2],
            "test_elbo_per_step": test["per_step"],
            "lr_halved_after_epochs": cuts[name],
            "train_config": config["train"],
            "model_options": config["model_options"],
        }
    verdict = judge(curves, args.compare_epochs)
    result = {
        "benchmark": "nproc_curve",
        "question": "does pyro-seq train --nproc 2 give the 1-process validation curve within "
        "noise?",
        "data": str(args.data.name),
        "threads_per_process": args.threads,
        "model": "srnn",
        "model_options": args.model_option or [],
        "rule": "permutation test of the process count over all splits of the runs into two "
        "groups of the observed sizes; statistic mean_e |mean_1(e) - mean_2(e)| of the "
        f"validation ELBO per step over the compared epochs; within noise when "
        f"p >= {LEVEL}",
        "verdict": verdict,
        "runs": runs,
        "wall_seconds_this_invocation": time.time() - started,
    }
    v = verdict
    print(
        f"{v['epochs_compared']} epochs, runs {''.join(v['runs_1_process'])} (1 process) vs "
        f"{''.join(v['runs_2_processes'])} (2): curve gap {v['curve_gap']:.4f} nats/step "
        f"(seed spread {v['seed_spread_1_process'] or float('nan'):.4f}), p = "
        f"{v['p_curve']:.3f} over {v['splits']} splits; best valid "
        f"{v['best_valid_1_process']['mean']:.4f} +- {v['best_valid_1_process']['sd']:.4f} vs "
        f"{v['best_valid_2_processes']['mean']:.4f} +- {v['best_valid_2_processes']['sd']:.4f}"
        f" (p = {v['p_best']:.3f}): "
        f"{'within noise' if v['within_noise'] else 'NOT within noise'}"
    )
    write_result("nproc_curve", result, path=args.output)
    plot(curves, verdict, args.output.with_suffix(".png"), cuts)
    return result


if __name__ == "__main__":
    main()
