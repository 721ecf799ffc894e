"""Does ``pyro-seq train --nproc 2`` train like one process? SRNN validation curves on JSB.

Issue 13's acceptance item: "``pyro-seq train --nproc 2 ...`` trains SRNN on JSB with 2
processes; its validation curve matches the 1-process run within noise". Three runs of the
command line as users run it (a subprocess each, ``python -m pyro_seq.cli train``), SRNN with
the package defaults (GRU 300, z 100, MLPs 500, smoothing + Res_q; the CLI's training defaults:
batch 20, Adam 1e-3 with the plateau schedule, KL annealing from 0.2 over 1000 updates, early
stopping after 12 epochs without improvement) on the original-resolution JSB Chorales
(``../shared/data/polyphonic/jsb_chorales.pickle``, its own train/valid/test split), for
``--epochs`` epochs (default 50), one torch thread per process (``--threads 1``):

* ``a``: 1 process, seed 0;
* ``b``: 2 processes (``--nproc 2``), seed 0: the same initial weights and minibatch order as
  ``a``; each rank trains on half of every minibatch with its own sampling stream and the
  gradients are summed, so ``b`` differs from ``a`` by the Monte Carlo draws of the ELBO's
  latent samples (and float rounding) only;
* ``c``: 1 process, seed 1: the noise reference (other initial weights, batch order and draws);
* ``d`` (only with ``--runs a b c d``): 2 processes, seed 1, a second pair: ``d`` against ``c``
  with ``|c - a|`` as the noise reference, by the same rule (``verdict_seed1``); the JSON then
  also lists the differences of every pair of runs (``pairwise``).

The rule ("within noise"): over the epochs all three completed, with ``d_ab(e) = |a(e) - b(e)|``
and ``d_ac(e) = |a(e) - c(e)|`` the differences of the per-epoch validation ELBO (nats per step),
``b`` matches ``a`` within noise when ``max_e d_ab <= max_e d_ac`` **and**
``mean_e d_ab <= mean_e d_ac``: two processes move the curve no further from the one-process
run than changing the seed does. The best and last validation values and their differences are
reported beside the rule (``|best_a - best_b|`` against ``|best_a - best_c|``). One seed pair is
one draw of the seed-to-seed difference, so the rule is a sanity check, not a test at a stated
level.

Every run trains into ``benchmarks/checkpoints/nproc_curve/<run>`` (``--work-dir``); a run whose
folder holds ``test.json`` (written by the CLI when training has finished) is skipped, and an
interrupted one resumes from its checkpoint (the CLI resumes by default), so running the same
command again continues. Progress: one line per finished epoch with the run's validation bound
and an estimate of the time left. Writes ``benchmarks/results/nproc_curve.json`` (``--output``)
and ``nproc_curve.png`` next to it::

    nohup python benchmarks/nproc_curve.py > ../bench_logs/nproc_curve.log 2>&1 &
    python benchmarks/nproc_curve.py --epochs 2 --model-option d_dim=8 --model-option z_dim=2 \\
        --model-option hidden_dim=8 --work-dir /tmp/nc --output /tmp/nc/nproc_curve.json  # a check
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))  # this checkout's package, also in the subprocesses (PYTHONPATH)

from common import RESULTS, SHARED_DATA, write_result  # noqa: E402

RUNS = {  # name: (processes, seed, description)
    "a": (1, 0, "1 process, seed 0"),
    "b": (2, 0, "2 processes (--nproc 2), seed 0"),
    "c": (1, 1, "1 process, seed 1 (noise reference)"),
    "d": (2, 1, "2 processes (--nproc 2), seed 1"),  # optional (--runs a b c d): a second pair
}
STYLES = {"a": ("C0", "-"), "b": ("C3", "--"), "c": ("C2", ":"), "d": ("C1", "-.")}


def judge(a, b, c):
    """The rule of the module docstring on three validation curves (lists, one value per epoch;
    the common prefix of the three is compared). Returns a dict of the numbers and the verdict."""
    n = min(len(a), len(b), len(c))
    if n == 0:
        raise ValueError("no epoch completed by all three runs")
    d_ab = [abs(a[i] - b[i]) for i in range(n)]
    d_ac = [abs(a[i] - c[i]) for i in range(n)]
    best = {k: max(v[:n]) for k, v in (("a", a), ("b", b), ("c", c))}
    last = {k: v[n - 1] for k, v in (("a", a), ("b", b), ("c", c))}
    out = {
        "epochs_compared": n,
        "max_abs_diff_ab": max(d_ab), "max_abs_diff_ac": max(d_ac),
        "epoch_of_max_ab": d_ab.index(max(d_ab)) + 1, "epoch_of_max_ac": d_ac.index(max(d_ac)) + 1,
        "mean_abs_diff_ab": sum(d_ab) / n, "mean_abs_diff_ac": sum(d_ac) / n,
        "best_valid": best, "last_valid": last,
        "best_diff_ab": abs(best["a"] - best["b"]), "best_diff_ac": abs(best["a"] - best["c"]),
        "last_diff_ab": abs(last["a"] - last["b"]), "last_diff_ac": abs(last["a"] - last["c"]),
    }
    out["within_noise"] = (out["max_abs_diff_ab"] <= out["max_abs_diff_ac"]
                           and out["mean_abs_diff_ab"] <= out["mean_abs_diff_ac"])
    return out


def _read_log(folder):
    path = Path(folder) / "log.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet, or being rewritten
        return None


def _train(name, args, folder, done_epochs, total_epochs, started):
    """Run ``pyro-seq train`` for run ``name`` into ``folder``, printing a line per epoch."""
    nproc, seed, what = RUNS[name]
    cmd = [sys.executable, "-m", "pyro_seq.cli", "train", "--model", "srnn", "--data",
           str(args.data), "--epochs", str(args.epochs), "--nproc", str(nproc), "--threads",
           str(args.threads), "--seed", str(seed), "--out", str(folder), "--quiet"]
    for option in args.model_option or []:
        cmd += ["--model-option", option]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
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
                print(f"[{name}] epoch {row['epoch']}/{args.epochs}  valid ELBO "
                      f"{row.get('valid_elbo_per_step', float('nan')):.4f}  train "
                      f"{row['seconds']:.1f} s  (elapsed {(time.time() - started) / 60:.1f} min, "
                      f"about {max(left, 0) / 60:.0f} min left)", flush=True)
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

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    for name, curve in curves.items():
        color, ls = STYLES[name]
        top.plot(range(1, len(curve) + 1), curve, color=color, ls=ls, lw=1.6,
                 label=f"{name}: {RUNS[name][2]}")
        for epoch in (cuts or {}).get(name, []):  # the plateau schedule halved the rate here
            top.plot([epoch], [curve[epoch - 1]], marker="v", color=color, ms=7, ls="none")
    top.set_ylabel("validation ELBO (nats / step)")
    top.set_title("SRNN on JSB Chorales: pyro-seq train --nproc 2 against 1 process")
    later = [v for c in curves.values() for v in c[2:]]
    if later:  # the first two epochs are far below the rest: keep the later range in view
        top.set_ylim(min(later) - 0.3, max(later) + 0.2)
    top.legend(title="triangles: learning rate halved after that epoch" if cuts else None,
               title_fontsize=8, fontsize=8)
    top.grid(alpha=0.3)
    n = verdict["epochs_compared"]
    a, b, c = (curves[k][:n] for k in "abc")
    epochs = range(1, n + 1)
    bottom.plot(epochs, [abs(x - y) for x, y in zip(a, b)], color="C3", ls="--",
                label="|a - b| (2 processes)")
    bottom.plot(epochs, [abs(x - y) for x, y in zip(a, c)], color="C2", ls=":",
                label="|a - c| (other seed)")
    if "d" in curves:
        m = min(n, len(curves["d"]))
        bottom.plot(range(1, m + 1), [abs(x - y) for x, y in zip(c[:m], curves["d"][:m])],
                    color="C1", ls="-.", label="|c - d| (2 processes, seed 1)")
    bottom.set_yscale("log")
    bottom.set_xlabel("epoch")
    bottom.set_ylabel("|difference| (nats / step)")
    bottom.legend()
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=50, help="epochs per run (default 50)")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "jsb_chorales.pickle",
                        help="piano-roll pickle (default the shared original-resolution JSB)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--runs", nargs="+", default=["a", "b", "c"], choices=list(RUNS),
                        help="a b c (default), or a b c d for the second pair")
    parser.add_argument("--model-option", action="append", metavar="KEY=VALUE",
                        help="passed to the CLI (a quick check with a small model); the "
                             "recorded result uses none")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "benchmarks" / "checkpoints"
                        / "nproc_curve", help="run folders (resumed, or skipped when finished)")
    parser.add_argument("--output", type=Path, default=RESULTS / "nproc_curve.json",
                        help="result JSON (the figure goes next to it)")
    args = parser.parse_args(argv)
    if not args.data.exists():
        raise SystemExit(f"data file {args.data} not found; pass --data PATH")
    started = time.time()
    if not {"a", "b", "c"} <= set(args.runs):
        raise SystemExit("--runs must include a, b and c")
    runs_wanted = [name for name in RUNS if name in args.runs]
    done_epochs, total_epochs = 0, len(runs_wanted) * args.epochs
    for name in runs_wanted:
        folder = args.work_dir / name
        if (folder / "test.json").exists():  # finished: the CLI writes it last
            print(f"[{name}] done already ({folder}), skipped", flush=True)
            done_epochs += args.epochs
            continue
        _train(name, args, folder, done_epochs, total_epochs, started)
        done_epochs += args.epochs
    runs, curves, cuts = {}, {}, {}
    for name in runs_wanted:
        nproc, seed, what = RUNS[name]
        folder = args.work_dir / name
        rows = _read_log(folder)
        config = json.loads((folder / "config.json").read_text())
        test = json.loads((folder / "test.json").read_text())
        curves[name] = [row["valid_elbo_per_step"] for row in rows]
        seconds = [row["seconds"] for row in rows]
        cuts[name] = [i for i in range(1, len(rows)) if rows[i]["lr"] < rows[i - 1]["lr"]]
        runs[name] = {
            "description": what, "nproc": nproc, "seed": seed, "folder": str(folder),
            "epochs_completed": len(rows), "valid_elbo_per_step": curves[name],
            "train_seconds_per_epoch": seconds,
            "train_seconds_per_epoch_median": sorted(seconds)[len(seconds) // 2],
            "test_elbo_per_step": test["per_step"],
            "lr_halved_after_epochs": cuts[name],
            "train_config": config["train"], "model_options": config["model_options"],
        }
    verdict = judge(curves["a"], curves["b"], curves["c"])
    verdict_seed1 = judge(curves["c"], curves["d"], curves["a"]) if "d" in curves else None
    pairwise = {}  # every pair of runs, for the spread beyond the rule's one noise pair
    for i, x in enumerate(runs_wanted):
        for y in runs_wanted[i + 1:]:
            n = min(len(curves[x]), len(curves[y]))
            diff = [abs(p - q) for p, q in zip(curves[x][:n], curves[y][:n])]
            pairwise[f"{x}-{y}"] = {"max_abs_diff": max(diff), "mean_abs_diff": sum(diff) / n,
                                    "best_diff": abs(max(curves[x]) - max(curves[y]))}
    result = {
        "benchmark": "nproc_curve",
        "question": "does pyro-seq train --nproc 2 give the 1-process validation curve within "
                    "noise?",
        "data": str(args.data.name), "epochs": args.epochs, "threads_per_process": args.threads,
        "model": "srnn", "model_options": args.model_option or [],
        "rule": "within noise when max_e |a-b| <= max_e |a-c| and mean_e |a-b| <= mean_e |a-c| "
                "(validation ELBO per step, epochs all three completed; c = seed 1)",
        "verdict": verdict, "runs": runs,
        "verdict_seed1": verdict_seed1, "pairwise": pairwise,
        "verdict_seed1_rule": "d (2 processes, seed 1) against c, noise reference |c - a|"
        if verdict_seed1 else None,
        "wall_seconds_this_invocation": time.time() - started,
    }
    print(f"max |a-b| {verdict['max_abs_diff_ab']:.4f} (epoch {verdict['epoch_of_max_ab']}) vs "
          f"max |a-c| {verdict['max_abs_diff_ac']:.4f} (epoch {verdict['epoch_of_max_ac']}); "
          f"mean {verdict['mean_abs_diff_ab']:.4f} vs {verdict['mean_abs_diff_ac']:.4f}; best "
          f"a/b/c {verdict['best_valid']['a']:.4f}/{verdict['best_valid']['b']:.4f}/"
          f"{verdict['best_valid']['c']:.4f}: "
          f"{'within noise' if verdict['within_noise'] else 'NOT within noise'}")
    if verdict_seed1:
        v = verdict_seed1
        print(f"seed 1 pair: max |c-d| {v['max_abs_diff_ab']:.4f} vs max |c-a| "
              f"{v['max_abs_diff_ac']:.4f}; mean {v['mean_abs_diff_ab']:.4f} vs "
              f"{v['mean_abs_diff_ac']:.4f}: "
              f"{'within noise' if v['within_noise'] else 'NOT within noise'}")
    write_result("nproc_curve", result, path=args.output)
    plot(curves, verdict, args.output.with_suffix(".png"), cuts)
    return result


if __name__ == "__main__":
    main()
