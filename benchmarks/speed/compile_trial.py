"""Does ``torch.compile`` speed up a model's training step on the CPU?

The speed issue asks to try ``torch.compile`` on the step functions where it composes with
Pyro's tracing, and to keep only what measures faster. This script compiles the networks that
the time-parallel paths call once per sequence batch (the DMM's emission MLP and gated
transition, ``dynamic=True`` for the varying sequence lengths), leaves Pyro's model and guide
uncompiled (their sample sites must stay visible to the handlers), and times ``SVI`` steps
with ``Trace_ELBO`` on the first ``--batches`` minibatches of 20 JSB training chorales, both
variants built from the same seed and alternated ``--repeats`` times after two warm-up steps
(which include the compilation). Process CPU seconds are recorded (wall time too), one torch
thread, Pyro validation off. Writes ``benchmarks/results/compile_trial.json``::

    python benchmarks/speed/compile_trial.py --data jsb_chorales.pickle
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import ClippedAdam  # type: ignore[attr-defined]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine_info  # noqa: E402

from pyro_seq.data import load_piano_rolls  # noqa: E402
from pyro_seq.models import DMM  # noqa: E402
from pyro_seq.ops.padding import pad_sequences  # noqa: E402

SIZES = dict(z_dim=100, transition_dim=200, emission_dim=100, rnn_dim=600)


def build(compiled: bool):
    """The DMM at Pyro's example sizes and its SVI; with ``compiled`` its emitter and gated
    transition wrapped by ``torch.compile(dynamic=True)``."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = DMM.for_data(88, 0, **SIZES)
    if compiled:
        model.emitter = torch.compile(model.emitter, dynamic=True)
        model.transition = torch.compile(model.transition, dynamic=True)
    return model, SVI(model.model, model.guide, ClippedAdam({"lr": 3e-4}), Trace_ELBO())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="path of jsb_chorales.pickle")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    pyro.enable_validation(False)
    train = load_piano_rolls(args.data)["train"]
    batches = [pad_sequences(train[i : i + 20]) for i in range(0, 20 * args.batches, 20)]
    variants = {}
    warmup = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        model, svi = build(compiled)
        start = time.perf_counter()
        losses = [svi.step(x, mask) for x, mask in batches[:2]]
        warmup[name] = {"wall_s": time.perf_counter() - start, "losses": losses}
        variants[name] = svi
    cpu = {name: [] for name in variants}
    wall = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, svi in variants.items():
            c0, w0 = time.process_time(), time.perf_counter()
            for x, mask in batches:
                svi.step(x, mask)
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    ratio = statistics.median(cpu["compiled"]) / statistics.median(cpu["eager"])
    payload = {
        "benchmark": "compile_trial",
        "model": {"class": "DMM", **SIZES, "compiled": ["emitter", "transition"]},
        "settings": vars(args),
        "warmup_two_steps": warmup,
        "cpu_seconds_per_pass": cpu,
        "wall_seconds_per_pass": wall,
        "cpu_ratio_compiled_to_eager": ratio,
        "machine": machine_info(),
    }
    out = ROOT / "benchmarks" / "results" / "compile_trial.json"
    out.write_text(json.dumps(payload, indent=1))
    print(
        f"CPU s per {len(batches)} steps: eager {cpu['eager']}, compiled {cpu['compiled']}; "
        f"median ratio {ratio:.3f}; warm-up (2 steps) eager {warmup['eager']['wall_s']:.1f} s, "
        f"compiled {warmup['compiled']['wall_s']:.1f} s\nwrote {out}"
    )
    return payload


if __name__ == "__main__":
    main()
