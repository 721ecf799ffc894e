"""What do one-site-per-step latents and observations cost? The SRNN's and the DMM's ELBO,
each three ways.

The package's contract emits one Pyro sample site per time step (``z_t`` and ``x_t``, in
``pyro.markov``): FIVO resamples between steps, and replay, ``Predictive`` and the tasks read the
sites by name. Issue 26's SRNN target (an epoch no slower than plain PyTorch) stayed at about
1.10. This diagnostic measures how much of that is the per-step site layout, for the planners'
decision on a vectorised-time layout:

* ``pyro_seq``: the package's SRNN as its users train it: ``SVI(m.model, m.guide, Adam,
  Trace_ELBO)``, Pyro validation off (what ``benchmarks/speed/srnn_speed.py`` times);
* ``plain``: ``benchmarks/baselines/plain_srnn.py``, the same model written without Pyro (the
  floor of the speed target);
* ``one_expression``: the package's own networks and fused guide scan
  (:func:`pyro_seq.nn.srnn_guide_scan`), the prior at the guide's ``z_{t-1}``, the emission and
  every log-density evaluated once over all steps and summed into one ELBO: the work that the
  package does, without any sample site. A layout with one site per sequence for ``z`` and for
  ``x`` would cost this plus a few sites' handling.

The three are checked to give the same ELBO in float64 with the same weights and noise (to
1e-9 relative), then timed as in ``srnn_speed.py``: the same weights (copied), the same
minibatches of 16 JSB-2x training windows (272 windows of 100 steps, 17 per epoch), Adam lr
1e-3, alternating epochs in one process (the order rotated every repeat), one thread; median
wall and CPU seconds of ``--repeats`` epochs.

``--model dmm`` does the same for the DMM target (an epoch in 0.30 of Pyro's real
``examples/dmm.py``), as ``benchmarks/speed/dmm_speed.py`` sets it up: ``pyro_example`` (the
unchanged example, Pyro validation off), ``pyro_seq`` (the package's DMM with the example's
weights, ``ClippedAdam`` with the example's settings, ``Trace_ELBO``, validation off) and
``one_expression`` (the package's DMM networks: its backward RNN, the fused combiner scan, the
gated transition at the guide's ``z_{t-1}`` and the emission over all steps at once, one ELBO,
the same ``ClippedAdam``); 229 JSB training chorales in 12 minibatches of 20. The check here
is the package's ``Trace_ELBO`` against ``one_expression`` in float64 with the same noise
(the example and the package are checked equal by ``dmm_speed.py`` and
``dmm_example_equivalence.py``).

JSON to ``benchmarks/results/site_layout_cost.json`` or ``site_layout_cost_dmm.json``
(``--output``); ``--smoke``: tiny sizes on random data, one repeat of two minibatches.

    python benchmarks/diagnostics/site_layout_cost.py [--repeats 3] [--threads 1]
    python benchmarks/diagnostics/site_layout_cost.py --model dmm [--repeats 3]
"""

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(BENCHMARKS / "speed"), str(BENCHMARKS)]

import pyro  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from baselines.plain_srnn import from_package, normal_log_prob  # noqa: E402
from common import RESULTS, SHARED_DATA, machine_info  # noqa: E402
from pyro.infer import Trace_ELBO  # noqa: E402
from srnn_speed import (  # noqa: E402
    LR,
    PlainImpl,
    PyroSeqImpl,
    fixed_normal_noise,
    time_epoch,
    training_windows,
)

from pyro_seq.data import SequenceLoader, load_piano_rolls  # noqa: E402
from pyro_seq.models import SRNN  # noqa: E402
from pyro_seq.nn import srnn_guide_scan  # noqa: E402
from pyro_seq.nn.ragged import sequence_lengths  # noqa: E402

#: relative |ELBO difference| allowed between the three forms (float64)
CHECK_RTOL = 1e-9


def one_expression_elbo(m: SRNN, x, mask, eps=None):
    """The single-sample ELBO of the package's SRNN (Bernoulli, smoothing, Res_q) as one
    expression over all steps, from its modules: ``x (B, T, D)``, ``mask (B, T)``, ``eps``
    the guide's noise ``(B, T, Z)`` (drawn when None). A scalar, summed over the batch."""
    B, T, _ = x.shape
    d = m._deterministic_states(x, mask)
    a = m.encoder(torch.cat([d, x], -1), mask)
    post, prior = m.posterior, m.prior
    if eps is None:
        eps = torch.randn(B, T, m.z_dim, dtype=x.dtype, device=x.device)
    loc, scale, z, p_loc, p_scale = srnn_guide_scan(
        x.new_zeros(B, m.z_dim),
        eps,
        (post.project_context(a),) + tuple(post.step_weights()),
        (prior.project_context(d),) + tuple(prior.step_weights()),
        post.activation,
        post.head.min_scale,
        post.head.variance,
        sequence_lengths(mask),
    )
    logits = m.emitter(torch.cat([z, d], -1))
    log_px = -F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)
    terms = log_px + normal_log_prob(z, p_loc, p_scale) - normal_log_prob(z, loc, scale)
    return torch.where(mask, terms, torch.zeros((), dtype=x.dtype)).sum()


class OneExpressionImpl:
    """The package's networks, one ELBO expression, ``backward`` and ``torch.optim.Adam``."""

    def __init__(self, model):
        self.model = model
        self.optim = torch.optim.Adam(model.parameters(), lr=LR)

    def step(self, x, mask):
        self.optim.zero_grad()
        loss = -one_expression_elbo(self.model, x, mask)
        loss.backward()
        self.optim.step()
        return loss.item()


def check_same_elbo(model, x, mask, seed):
    """Float64 ELBOs of the three forms on one minibatch, same weights and noise."""
    m = copy.deepcopy(model).double()
    plain = from_package(m)
    x64 = x.double()
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape[0], x.shape[1], m.z_dim, dtype=torch.float64, generator=gen)
    with torch.no_grad(), pyro.validation_enabled(False):
        with fixed_normal_noise(noise):
            pyro_seq = -Trace_ELBO(max_plate_nesting=1).loss(m.model, m.guide, x64, mask)
        values = {
            "pyro_seq": pyro_seq,
            "plain": plain.elbo(x64, mask, noise).item(),
            "one_expression": one_expression_elbo(m, x64, mask, noise).item(),
        }
    pyro.clear_param_store()
    ref = values["plain"]
    diffs = {k: abs(v - ref) / abs(ref) for k, v in values.items()}
    passed = all(d <= CHECK_RTOL for d in diffs.values())
    print(f"check (float64, same weights and noise): {values}, rel. diff to plain {diffs}")
    if not passed:
        raise SystemExit(
            "the three forms give different ELBOs; the timing would compare different functions"
        )
    return {"elbo": values, "rel_diff_to_plain": diffs, "tolerance": CHECK_RTOL, "passed": passed}


def timings(check, record, med, ratios):
    """The fields every result file of this script shares."""
    return {
        "check_same_elbo": check,
        "wall_seconds_per_epoch": {k: v["wall"] for k, v in record.items()},
        "cpu_seconds_per_epoch": {k: v["cpu"] for k, v in record.items()},
        "median_wall_seconds_per_epoch": med,
        "ratios": ratios,
        "site_handling_seconds_per_epoch": med["pyro_seq"] - med["one_expression"],
        "machine": machine_info(),
    }


def write(result, args, name):
    """Print the medians and ratios; write ``result`` to ``--output`` (default
    ``benchmarks/results/<name>``, none for ``--smoke``)."""
    print(
        json.dumps(
            {"median": result["median_wall_seconds_per_epoch"], "ratios": result["ratios"]},
            indent=1,
        )
    )
    out = args.output or (None if args.smoke else str(RESULTS / name))
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")
    return result


def alternate(variants, repeats, epoch_batches, run_epoch, warmup):
    """Time every variant's epochs in turn, the order rotated every repeat: ``run_epoch(impl,
    batches)`` returns ``(wall, cpu)`` seconds for ``epoch_batches(r)``, after one warm-up
    epoch on ``warmup``. Returns ``({name: {"wall": [...], "cpu": [...]}}, {name: median
    wall})``."""
    for impl in variants.values():
        run_epoch(impl, warmup)
    record = {k: {"wall": [], "cpu": []} for k in variants}
    names = list(variants)
    for r in range(repeats):
        batches = epoch_batches(r)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            w, c = run_epoch(variants[name], batches)
            record[name]["wall"].append(w)
            record[name]["cpu"].append(c)
            print(f"repeat {r}: {name:15s} wall {w:7.2f} s  cpu {c:7.2f} s", flush=True)
    return record, {k: statistics.median(v["wall"]) for k, v in record.items()}


def dmm_one_expression_elbo(m, x, mask, eps=None):
    """The single-sample ELBO of the package's DMM (the default combiner, no Res_q, no
    inputs) as one expression over all steps, from its modules: ``x (B, T, D)``,
    ``mask (B, T)``, ``eps`` the guide's noise ``(B, T, Z)`` (drawn when None)."""
    from pyro_seq.nn import combiner_scan

    if m.residual or m.input_dim:
        raise ValueError("one_expression covers the DMM without Res_q and inputs")
    B, T, _ = x.shape
    a = m.rnn_dropout(m.encoder(x, mask))
    z0 = m.z_q_0.expand(B, m.z_dim)
    w, b = m.combiner.stacked_heads()
    if eps is None:
        eps = torch.randn(B, T, m.z_dim, dtype=x.dtype, device=x.device)
    c = m.combiner
    loc, scale, z = combiner_scan(
        z0,
        a,
        eps,
        c.z_to_hidden.weight,
        c.z_to_hidden.bias,
        w,
        b,
        c.min_scale,
        sequence_lengths(mask),
    )
    z_prev = torch.cat([m.z_0.expand(B, 1, m.z_dim), z[:, :-1]], 1)
    p_loc, p_scale = m.transition(z_prev)
    log_px = m.likelihood(m.emitter(z)).log_prob(x)
    terms = log_px + normal_log_prob(z, p_loc, p_scale) - normal_log_prob(z, loc, scale)
    return torch.where(mask, terms, torch.zeros((), dtype=x.dtype)).sum()


def dmm_main(args):
    """``--model dmm`` (module docstring)."""
    import anchors
    import dmm_speed
    from pyro.infer import SVI
    from pyro.optim import ClippedAdam
    from pyro.optim.clipped_adam import ClippedAdam as TorchClippedAdam

    from pyro_seq.data import pad_sequences
    from pyro_seq.models import DMM

    anchor = anchors.load_anchor()
    seqs = load_piano_rolls(SHARED_DATA / "jsb_chorales.pickle", splits=("train",))["train"]
    if args.smoke:
        args.repeats, args.batches = 1, 2
    loader = SequenceLoader(seqs, anchor.defaults.mini_batch_size, shuffle=True, seed=args.seed)
    num_batches = min(args.batches or len(loader), len(loader))
    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    example_dmm, example_svi = anchor.make_svi()
    pyro.clear_param_store()
    ours = DMM(88)
    ours.module_name = "pyro_seq_dmm"
    anchors.copy_weights(example_dmm, ours)
    # the check: the package's Trace_ELBO against one expression, float64, same noise
    m64 = copy.deepcopy(ours).double()
    x, mask = pad_sequences([seqs[i] for i in loader.batch_indices(args.repeats)[0]])
    x64 = x.double()
    with torch.no_grad(), pyro.validation_enabled(False):
        # the guide scan draws one (B, Z) normal_() per step; the same draws for both
        torch.manual_seed(args.seed)
        traced = -Trace_ELBO().loss(m64.model, m64.guide, x64, mask)
        torch.manual_seed(args.seed)
        B, T = mask.shape
        noise = torch.stack([x64.new_empty(B, m64.z_dim).normal_() for _ in range(T)], 1)
        one = dmm_one_expression_elbo(m64, x64, mask, noise).item()
    pyro.clear_param_store()
    rel = abs(traced - one) / abs(one)
    check = {
        "elbo": {"pyro_seq": traced, "one_expression": one},
        "rel_diff": rel,
        "tolerance": CHECK_RTOL,
    }
    print(f"check (float64, same weights and noise): {check}")
    if rel > CHECK_RTOL:
        raise SystemExit("the package's DMM and its one-expression ELBO differ")
    pyro.clear_param_store()
    ours = DMM(88)
    ours.module_name = "pyro_seq_dmm"
    anchors.copy_weights(example_dmm, ours)
    twin = copy.deepcopy(ours)
    svi_ours = SVI(ours.model, ours.guide, ClippedAdam(anchor.adam_params()), loss=Trace_ELBO())
    # the same optimiser for the twin, as the torch optimiser inside pyro.optim.ClippedAdam
    one_optim = TorchClippedAdam(twin.parameters(), **anchor.adam_params())

    class OneExpressionDMM(dmm_speed.PyroSeqImpl):
        def step(self, batch):
            one_optim.zero_grad()
            loss = -dmm_one_expression_elbo(twin, *batch)
            loss.backward()
            one_optim.step()
            return loss.item()

    variants = {
        "pyro_example": dmm_speed.ExampleImpl(anchor, example_dmm, example_svi),
        "pyro_seq": dmm_speed.PyroSeqImpl(seqs, svi_ours),
        "one_expression": OneExpressionDMM(seqs, None),
    }
    record, med = alternate(
        variants,
        args.repeats,
        lambda r: loader.batch_indices(r)[:num_batches],
        lambda impl, batches: dmm_speed.time_epoch(impl, batches, False)[:2],
        [loader.batch_indices(args.repeats)[0]],
    )
    ratios = {
        "pyro_seq / pyro_example": med["pyro_seq"] / med["pyro_example"],
        "one_expression / pyro_example": med["one_expression"] / med["pyro_example"],
        "pyro_seq / one_expression": med["pyro_seq"] / med["one_expression"],
    }
    return {
        "benchmark": "site_layout_cost_dmm",
        "settings": {
            "model": "DMM(88), Pyro's example sizes and weights",
            "batch_size": anchor.defaults.mini_batch_size,
            "batches_per_epoch": num_batches,
            "data": str(SHARED_DATA / "jsb_chorales.pickle") + " train",
            "optimizer": "ClippedAdam with the example's settings (all three)",
            "pyro_validation": False,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "smoke": args.smoke,
            "timing": "alternating epochs, order rotated every repeat; median wall seconds; "
            "each implementation's minibatch preparation inside its epoch",
        },
        **timings(check, record, med, ratios),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("srnn", "dmm"), default="srnn")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=None, help="minibatches per epoch (all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--output", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model == "dmm":
        return write(dmm_main(args), args, "site_layout_cost_dmm.json")
    sizes, batch_size, seqs, data = training_windows(args.data, args.smoke, args.seed)
    if args.smoke:
        args.repeats, args.batches = 1, 2
    loader = SequenceLoader(seqs, batch_size, shuffle=True, seed=args.seed)
    num_batches = min(args.batches or len(loader), len(loader))
    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    model = SRNN(88, **sizes)
    first = next(iter(loader.batches(args.repeats)))  # not a timed epoch's batch
    check = check_same_elbo(model, *first, seed=args.seed)
    variants = {
        "pyro_seq": PyroSeqImpl(model),
        "plain": PlainImpl(from_package(model)),
        "one_expression": OneExpressionImpl(copy.deepcopy(model)),
    }
    record, med = alternate(
        variants,
        args.repeats,
        lambda r: list(loader.batches(r))[:num_batches],
        lambda impl, batches: time_epoch(impl, batches)[:2],
        [first],
    )
    ratios = {
        "pyro_seq / plain": med["pyro_seq"] / med["plain"],
        "one_expression / plain": med["one_expression"] / med["plain"],
        "pyro_seq / one_expression": med["pyro_seq"] / med["one_expression"],
    }
    sites = 3 * num_batches * 100 if not args.smoke else None
    result = {
        "benchmark": "site_layout_cost",
        "settings": {
            "model": dict(sizes, obs_dim=88, inference="smoothing", residual=True),
            "batch_size": batch_size,
            "batches_per_epoch": num_batches,
            "data": data,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "smoke": args.smoke,
            "timing": "alternating epochs, order rotated every repeat; median wall seconds",
        },
        **timings(check, record, med, ratios),
        "sample_sites_per_epoch": sites,
    }
    return write(result, args, "site_layout_cost.json")


if __name__ == "__main__":
    main()
