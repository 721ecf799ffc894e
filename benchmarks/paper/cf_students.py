"""Collaborative filtering of simulated student answers with RBMs (seed 003), against baselines.

Data: :func:`pyro_seq.data.simulate_students` (2PL item-response model, 10 000 students x 1 000
questions, 2 % observed, 20 % of each student's answers held out), binary answers or 4-option
answers (``--options 4``). Models (seed 003 sec. 2, Fig. 4), all trained by
``SVI(..., loss=ContrastiveDivergence(k))`` on minibatches of 1 000 students:

* ``bernoulli``: binary units, H 15 (sec. 2.1);
* ``softmax``: softmax units over the answer options, H 15, CD-1 and ``softmax_cd11`` with
  CD-11 (sec. 2.2, Fig. 4a);
* ``binomial``: binomial-softmax units with 2 replicas, H 15 (sec. 2.3, Fig. 4b);
* ``factored``: binomial-softmax with W = A B, H 40, C 10 (sec. 2.4, Fig. 4c).

Each is scored on the held-out answers after every epoch by the Capped Binomial Deviance
(:func:`pyro_seq.metrics.capped_binomial_deviance`; seed 003's metric); the reported number is
the test CBD at the epoch with the best CBD on a validation set (10 % of each student's
training answers, held out from training; every student keeps at least one), beside the
constant 0.5
(0.30103), the logistic baseline with per-student and per-question effects, and the generating
2PL model (the floor). The per-epoch curves are plotted like the seed's Fig. 4. Memory: the
process's peak resident set size and the largest per-batch tensor (entries x H x K floats);
nothing of size students x questions is built (:class:`pyro_seq.distributions.SparseRBM`).

Results: ``benchmarks/results/cf_students[_<tag>].json`` (and ``.png``), written after every
model; running the command again skips the models already done (``--force`` redoes them)::

    python benchmarks/paper/cf_students.py --threads 1
    python benchmarks/paper/cf_students.py --options 4 --tag options4
"""

import argparse
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import pyro  # noqa: E402
import torch  # noqa: E402
from common import RESULTS, write_result  # noqa: E402
from pyro.infer import SVI  # noqa: E402
from pyro.optim import Adam  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from pyro_seq.baselines import ConstantBaseline, LogisticBaseline  # noqa: E402
from pyro_seq.data import Answers, simulate_students  # noqa: E402
from pyro_seq.infer import ContrastiveDivergence  # noqa: E402
from pyro_seq.metrics import capped_binomial_deviance  # noqa: E402
from pyro_seq.models import CollaborativeRBM  # noqa: E402

VARIANTS = {
    "bernoulli": dict(visible="bernoulli", num_hidden=15, k=1),
    "softmax": dict(visible="softmax", num_hidden=15, k=1),
    "softmax_cd11": dict(visible="softmax", num_hidden=15, k=11),
    "binomial": dict(visible="binomial_softmax", num_hidden=15, k=1),
    "factored": dict(visible="binomial_softmax", num_hidden=40, num_factors=10, k=1),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--students", type=int, default=10_000)
    p.add_argument("--questions", type=int, default=1_000)
    p.add_argument("--observed", type=float, default=0.02, help="observed fraction of the matrix")
    p.add_argument("--options", type=int, choices=(2, 4), default=2)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.03, help="Adam learning rate")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--valid-fraction",
        type=float,
        default=0.1,
        help="training answers held out to pick the epoch",
    )
    p.add_argument("--tag", default="")
    p.add_argument("--force", action="store_true", help="retrain variants already in the JSON")
    return p.parse_args(argv)


def cbd(p, y):
    return float(capped_binomial_deviance(p.double(), y.double()))


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    name = "cf_students" + (f"_{args.tag}" if args.tag else "")
    path = RESULTS / f"{name}.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    result.update(benchmark=name, settings=vars(args), models=result.get("models", {}))
    rss_start = peak_rss_mb()
    data = simulate_students(
        args.students, args.questions, args.observed, args.options, seed=args.seed
    )
    te = data.test
    S = data.num_students
    full = data.train
    # validation answers: a random 10 % of the training answers, never a student's first one
    g = torch.Generator().manual_seed(args.seed + 1)
    first = torch.ones_like(full.student, dtype=torch.bool)
    first[1:] = full.student[1:] != full.student[:-1]
    held = (torch.rand(full.student.shape[0], generator=g) < args.valid_fraction) & ~first

    def subset(keep):
        return Answers(full.student[keep], full.question[keep], full.answer[keep], full.num_options)

    tr, va = subset(~held), subset(held)
    data = dataclasses.replace(data, train=tr)
    result["data"] = {
        "students": S,
        "questions": data.num_questions,
        "options": args.options,
        "train_answers": int(tr.student.numel()),
        "valid_answers": int(va.student.numel()),
        "test_answers": int(te.student.numel()),
    }
    y = te.correct
    floor = cbd(data.true_probability(te.student, te.question), y)
    logistic = LogisticBaseline(S, data.num_questions, dtype=torch.float64)
    start = time.perf_counter()
    logistic.fit(full.student, full.question, full.correct)  # all training answers (no epochs)
    result["baselines"] = {
        "constant_0.5": cbd(ConstantBaseline().predict(te.student, te.question), y),
        "logistic": cbd(logistic.predict(te.student, te.question), y),
        "logistic_fit_seconds": time.perf_counter() - start,
        "true_2pl_floor": floor,
    }
    print({k: round(v, 5) for k, v in result["baselines"].items()})
    for variant in args.variants:
        if variant in result["models"] and not args.force:
            print(f"{variant}: done (use --force to retrain)")
            continue
        settings = dict(VARIANTS[variant])
        k = settings.pop("k")
        pyro.clear_param_store()
        torch.manual_seed(args.seed)
        model = CollaborativeRBM(data.num_questions, num_options=args.options, **settings)
        svi = SVI(model.model, model.guide, Adam({"lr": args.lr}), ContrastiveDivergence(k=k))
        curve, valid_curve, monitor, seconds = [], [], [], []
        largest = 0
        for epoch in tqdm(range(args.epochs), desc=variant):
            t0 = time.perf_counter()
            total, batches = 0.0, 0
            for batch in data.batches(args.batch_size, seed=args.seed * 1000 + epoch):
                total += svi.step(
                    batch.row, batch.question, batch.answer, batch.student.shape[0], S
                )
                batches += 1
                K = 1 if settings["visible"] == "bernoulli" else args.options
                largest = max(largest, batch.question.numel() * settings["num_hidden"] * K)
            seconds.append(time.perf_counter() - t0)
            monitor.append(total / batches)
            p = model.predict(tr.student, tr.question, tr.answer, S, te.student, te.question)
            curve.append(cbd(p, y))
            p = model.predict(tr.student, tr.question, tr.answer, S, va.student, va.question)
            valid_curve.append(cbd(p, va.correct))
        best = min(range(len(valid_curve)), key=valid_curve.__getitem__)
        result["models"][variant] = {
            "settings": dict(VARIANTS[variant]),
            "test_cbd_per_epoch": curve,
            "valid_cbd_per_epoch": valid_curve,
            "best_valid_epoch": best + 1,
            "test_cbd": curve[best],
            "final_test_cbd": curve[-1],
            "reconstruction_monitor_per_epoch": monitor,
            "seconds_per_epoch": sum(seconds) / len(seconds),
            "train_seconds": sum(seconds),
            "largest_batch_tensor_mb": largest * 4 / 2**20,
            "beats_logistic": curve[best] < result["baselines"]["logistic"],
        }
        tqdm.write(
            f"{variant}: test CBD {curve[best]:.5f} at epoch {best + 1} (last {curve[-1]:.5f}; logistic "
            f"{result['baselines']['logistic']:.5f}, floor {floor:.5f}), "
            f"{sum(seconds) / len(seconds):.1f} s/epoch"
        )
        result["memory"] = {
            "peak_rss_mb": peak_rss_mb(),
            "peak_rss_mb_at_start": rss_start,
            "dense_students_x_questions_mb": S * data.num_questions * 4 / 2**20,
        }
        write_result(name, result)
        plot(result, RESULTS / f"{name}.png")
    return result


def plot(result, out):
    """The seed's Fig. 4: test CBD per epoch of every model, with the baselines as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in result["models"].items():
        ax.plot(range(1, len(m["test_cbd_per_epoch"]) + 1), m["test_cbd_per_epoch"], label=name)
    styles = {"constant_0.5": ":", "logistic": "--", "true_2pl_floor": "-."}
    for key, style in styles.items():
        ax.axhline(result["baselines"][key], color="k", linestyle=style, linewidth=1, label=key)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test capped binomial deviance")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
