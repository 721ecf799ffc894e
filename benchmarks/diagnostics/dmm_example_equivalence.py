"""Same weights, same objective? Pyro's ``examples/dmm.py`` against ``pyro_seq.models.DMM``.

Pyro's example (the unchanged Pyro 1.9.2 file, loaded offline by ``benchmarks/speed/anchors.py``)
trained on JSB Chorales leads the package's DMM with the same settings (the preset
``dmm_jsb_pyro``) by about 0.1 nats per step of validation ELBO at equal epochs. This script
separates "the two compute different things" from "the two trainings went differently":

(a) the ELBO per time step of both on one fixed minibatch of 20 training sequences, in float64,
    at KL annealing factors 1 and 0.2 (the example's ``poutine.scale`` on its latent sites; the
    package's :class:`~pyro_seq.infer.LatentScale` as ``fit`` wires it). Both guides draw the
    same noise: the example draws one ``(batch, z_dim)`` standard normal per step in
    ``Normal.rsample``, the package's scanned guide the same draws in the same order, so under
    one seed the latent paths agree (checked) and each draw's losses can be compared exactly,
    not only in expectation;
(b) the gradients of each draw's loss with respect to corresponding parameters (averaged over
    the draws), from the example's ``Trace_ELBO`` and the trainer's objective;
(c) the optimiser: the same gradients fed to the example's ``ClippedAdam(adam_params)`` and to
    :func:`pyro_seq.train.make_optimizer` of the preset's ``TrainConfig`` for three updates, and
    one full SVI step of each side's own wiring (the example's ``SVI`` with the annealing factor
    of its first minibatch, the package's ``SVI`` with ``LatentScale(kl_beta(0))``);

each for the package's DMM with ``min_scale=0`` (the example's networks have no floor on their
scales: the twin) and with the preset's sizes as constructed (``min_scale=1e-3``), at the
example's initial weights (seeded) and at the weights of its training run (its checkpoint,
``benchmarks/checkpoints/pyro_dmm_example/state.pt``, when present). Then, in float32 (the
precision both trainings and evaluations run in), the validation ELBO of the example's trained
weights and of the package's trained weights (``benchmarks/checkpoints/jsb_dmm_long5000/
best.pt``) scored by both implementations with the same draws, and the float32 gradients.
(d) Both implementations trained side by side for a few epochs on identical random streams
(same initial weights, minibatches, noise and annealing factors), from the example's initial
weights and from the package's. Finally the two construction's initial weight distributions,
the annealing schedules of the two training loops update by update, and the recorded training
curves of both long runs.

    python benchmarks/diagnostics/dmm_example_equivalence.py --threads 1
"""

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))  # anchors.py
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

import anchors  # noqa: E402
import pyro  # noqa: E402
import pyro.poutine as poutine  # noqa: E402
import torch  # noqa: E402
from common import ROOT, write_result  # noqa: E402
from diagnostics.pyro_dmm_example_run import annealing_factor  # noqa: E402
from pyro.infer import SVI, Trace_ELBO  # noqa: E402

from pyro_seq.data import load_piano_rolls  # noqa: E402
from pyro_seq.infer import LatentScale  # noqa: E402
from pyro_seq.models import DMM  # noqa: E402
from pyro_seq.presets import get_preset  # noqa: E402
from pyro_seq.train import kl_beta, make_optimizer  # noqa: E402
from pyro_seq.train.objectives import make_objective  # noqa: E402

PRESET = "dmm_jsb_pyro"
EXAMPLE_CKPT = ROOT / "benchmarks" / "checkpoints" / "pyro_dmm_example" / "state.pt"
PACKAGE_CKPT = ROOT / "benchmarks" / "checkpoints" / "jsb_dmm_long5000" / "best.pt"
PACKAGE_LOG = ROOT / "benchmarks" / "checkpoints" / "jsb_dmm_long5000" / "checkpoint.pt"
SIDES = ("twin", "preset")  # package DMM with min_scale=0, and as the preset builds it


def example_annealing(step, defaults, n_mini_batches):
    """The KL annealing factor of the example's ``process_minibatch`` at (0-based) update
    ``step`` (epoch ``step // n``, minibatch ``step % n``)."""
    epoch, b = divmod(step, n_mini_batches)
    return annealing_factor(epoch, b, n_mini_batches, defaults)


class Pair:
    """The example's DMM and the package's twin (``min_scale=0``) and preset DMMs, in one dtype,
    with the example's weights copied into both package models."""

    def __init__(self, anchor, preset, dtype, seed):
        d = anchor.defaults
        pyro.set_rng_seed(seed)
        self.example = anchor.module.DMM(
            rnn_dropout_rate=d.rnn_dropout_rate, num_iafs=d.num_iafs, iaf_dim=d.iaf_dim
        ).to(dtype)
        self.models = {
            "twin": DMM(88, min_scale=0.0, **preset.model_options).to(dtype),
            "preset": DMM(88, **preset.model_options).to(dtype),
        }
        for side, m in self.models.items():
            m.module_name = f"pyro_seq_dmm_{side}"  # apart from the example's "dmm" in the store
        self.dtype = dtype
        self.sync_from_example()

    def sync_from_example(self):
        for m in self.models.values():
            anchors.copy_weights(self.example, m)

    @torch.no_grad()
    def load_package_weights(self, state):
        """The package's weights ``state`` into both package models and (mapped back) into the
        example."""
        for m in self.models.values():
            m.load_state_dict(state)
        ours = dict(self.models["preset"].named_parameters())
        for name, p in self.example.named_parameters():
            p.copy_(ours[anchors.pyro_seq_name(name)].reshape(p.shape))

    def zero_grad(self):
        for mod in (self.example, *self.models.values()):
            for p in mod.parameters():
                p.grad = None

    def example_grads(self):
        return {k: p.grad.detach().clone() for k, p in self.example.named_parameters()}

    def package_grads(self, side):
        """The package model's gradients, keyed and shaped as the example's parameters."""
        ours = dict(self.models[side].named_parameters())
        return {
            k: ours[anchors.pyro_seq_name(k)].grad.detach().reshape(p.shape).clone()
            for k, p in self.example.named_parameters()
        }


def count_scans(model):
    """Count the calls of the scanned guide (the path ``fit`` trains with)."""
    calls = [0]
    original = model.guide_scan

    def wrapped(*args, **kwargs):
        done = original(*args, **kwargs)
        calls[0] += bool(done)
        return done

    model.guide_scan = wrapped
    return calls


def example_loss(pair, batch, seed, af, grads=True):
    """The example's ``Trace_ELBO`` loss (negative annealed ELBO, summed) of one draw."""
    torch.manual_seed(seed)
    ex = pair.example
    if grads:
        return Trace_ELBO().loss_and_grads(ex.model, ex.guide, *batch, af)
    with torch.no_grad():
        return Trace_ELBO().loss(ex.model, ex.guide, *batch, af)


def package_loss(pair, side, x, mask, seed, af, grads=True):
    """The trainer's objective (``make_objective("elbo")``) under ``LatentScale(af)`` on the same
    draw: ``fit`` wraps model and guide this way for every update."""
    torch.manual_seed(seed)
    m, ann = pair.models[side], LatentScale(af)
    elbo = make_objective("elbo", 1)
    if grads:
        return elbo.loss_and_grads(ann(m.model), ann(m.guide), x, mask)
    with torch.no_grad():
        return elbo.loss(ann(m.model), ann(m.guide), x, mask)


def latent_path_gap(pair, ex_batch, x, mask, seed):
    """Largest difference of ``z_t`` between the example's guide and the package's scanned guide
    under one seed, over the real steps (twin: the same function, so only rounding)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        ex_tr = poutine.trace(pair.example.guide).get_trace(*ex_batch)
        torch.manual_seed(seed)
        ours_tr = poutine.trace(pair.models["twin"].guide).get_trace(x, mask)
    gap = 0.0
    for t in range(x.shape[1]):
        a, b = ex_tr.nodes[f"z_{t + 1}"]["value"], ours_tr.nodes[f"z_{t + 1}"]["value"]
        real = mask[:, t]
        gap = max(gap, float((a[real] - b[real]).abs().max())) if real.any() else gap
    return gap


def scale_stats(pair, ex_batch, seed):
    """How close the example's scales come to the package's floor ``min_scale``: quantiles of
    the guide's ``q(z_t | z_{t-1}, x_{t:T})`` and the prior's ``p(z_t | z_{t-1})`` standard
    deviations over the real steps of one draw."""
    torch.manual_seed(seed)
    ex = pair.example
    mask = ex_batch[2].bool()
    with torch.no_grad():
        guide_tr = poutine.trace(ex.guide).get_trace(*ex_batch)
        model_tr = poutine.trace(poutine.replay(ex.model, trace=guide_tr)).get_trace(*ex_batch)
    out = {}
    for role, tr in (("guide", guide_tr), ("prior", model_tr)):
        scales = []
        for t in range(mask.shape[1]):
            fn = tr.nodes[f"z_{t + 1}"]["fn"]
            while not hasattr(fn, "scale"):
                fn = fn.base_dist
            scales.append(fn.scale[mask[:, t]].flatten())
        s = torch.cat(scales)
        out[role] = {
            "min": float(s.min()),
            "q01": float(s.quantile(0.01)),
            "median": float(s.median()),
            "fraction_below_0.01": float((s < 0.01).double().mean()),
        }
    return out


def grad_table(ref, other):
    """Per parameter: ``|g_other - g_ref| / |g_ref|`` (Frobenius norms) and the whole vector's."""
    rows, num, den = {}, 0.0, 0.0
    for k, g in ref.items():
        d = float((other[k] - g).norm())
        n = float(g.norm())
        rows[k] = {"rel_diff": d / n if n > 0 else (0.0 if d == 0 else math.inf), "norm": n}
        num, den = num + d * d, den + n * n
    return {"all_rel_diff": math.sqrt(num / den), "per_parameter": rows}


def compare_objective(pair, ex_batch, particles, afs):
    """(a) and (b) on one minibatch: per draw the losses of the example, the twin and the
    preset model, and the draw-averaged gradients."""
    x, mask = ex_batch[0], ex_batch[2].bool()
    steps = float(mask.sum())
    scans = {side: count_scans(m) for side, m in pair.models.items()}
    out = {}
    for af in afs:
        losses = {"example": [], **{s: [] for s in SIDES}}
        grads = {"example": None, **{s: None for s in SIDES}}

        def add(key, g):
            grads[key] = g if grads[key] is None else {k: grads[key][k] + g[k] for k in g}

        for seed in range(particles):
            pair.zero_grad()
            losses["example"].append(example_loss(pair, ex_batch, seed, af))
            add("example", pair.example_grads())
            for side in SIDES:
                pair.zero_grad()
                losses[side].append(package_loss(pair, side, x, mask, seed, af))
                add(side, pair.package_grads(side))
        res = {"annealing_factor": af, "num_steps": int(steps), "particles": particles}
        res["elbo_per_step"] = {k: -sum(v) / len(v) / steps for k, v in losses.items()}
        for side in SIDES:
            diffs = [(b - a) / steps for a, b in zip(losses["example"], losses[side])]
            mean = sum(diffs) / len(diffs)
            sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(len(diffs) - 1, 1))
            res[f"{side}_minus_example_loss_per_step"] = {
                "mean": mean,
                "stderr": sd / math.sqrt(len(diffs)),
                "max_abs_per_draw": max(abs(d) for d in diffs),
            }
            res[f"{side}_grad_vs_example"] = grad_table(
                {k: g / particles for k, g in grads["example"].items()},
                {k: g / particles for k, g in grads[side].items()},
            )
        out[f"af_{af:g}"] = res
    for side, calls in scans.items():
        if calls[0] != len(afs) * particles:
            raise RuntimeError(f"{side}: the scanned guide ran {calls[0]} times, not every draw")
    for m in pair.models.values():
        del m.guide_scan  # the class's method again
    return out


def snapshot(module):
    return {k: p.detach().clone() for k, p in module.named_parameters()}


@torch.no_grad()
def restore(module, state):
    for k, p in module.named_parameters():
        p.copy_(state[k])


def compare_updates(pair, anchor, config, ex_batch, af, grads, num_updates=3):
    """(c) The example's ClippedAdam and the preset's ``make_optimizer`` fed the same gradients
    ``grads`` (keyed by the example's names) for ``num_updates`` updates from the same weights;
    then one full SVI step of each side's own wiring from the same weights and seed."""
    ex = pair.example
    start_ex = snapshot(ex)
    start_ours = {s: snapshot(m) for s, m in pair.models.items()}
    out = {"optimizer_example": anchor.adam_params()}
    out["optimizer_package"] = {
        k: getattr(config, k) for k in ("lr", "betas", "clip_norm", "lrd", "weight_decay")
    }

    def deltas_example(before):
        return {k: p.detach() - before[k] for k, p in ex.named_parameters()}

    def deltas_package(side, before):
        m = dict(pair.models[side].named_parameters())
        return {
            k: (m[anchors.pyro_seq_name(k)].detach() - before[anchors.pyro_seq_name(k)]).reshape(
                p.shape
            )
            for k, p in ex.named_parameters()
        }

    def gap(a, b):
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    def size(a):
        return max(float(v.abs().max()) for v in a.values())

    # the same gradients into both optimizers
    pyro.clear_param_store()
    pyro.module("dmm", ex)
    ex_optim = pyro.optim.ClippedAdam(anchor.adam_params())
    ours_optim = {}
    for side, m in pair.models.items():
        pyro.module(m.module_name, m)
        ours_optim[side] = make_optimizer(config, m)
    same_grad = []
    for n in range(num_updates):
        before = snapshot(ex)
        for k, p in ex.named_parameters():
            p.grad = grads[k].clone()
        ex_optim(list(ex.parameters()))
        d_ex = deltas_example(before)
        row = {"update": n + 1, "max_abs_step_example": size(d_ex)}
        for side, m in pair.models.items():
            before = snapshot(m)
            named = dict(m.named_parameters())
            for k in grads:
                target = named[anchors.pyro_seq_name(k)]
                target.grad = grads[k].reshape(target.shape).clone()
            ours_optim[side](list(m.parameters()))
            row[f"{side}_max_abs_step_diff"] = gap(d_ex, deltas_package(side, before))
        same_grad.append(row)
        pair.zero_grad()
    out["same_gradients"] = same_grad
    out["lr_after_updates"] = {
        "example": next(iter(ex_optim.optim_objs.values())).param_groups[0]["lr"],
        **{
            s: next(iter(o.optim_objs.values())).param_groups[0]["lr"]
            for s, o in ours_optim.items()
        },
    }

    # one full step of each side's own training wiring (and of the package's at the example's
    # annealing factor, which isolates the wiring from the schedules' offset of one update)
    restore(ex, start_ex)
    pyro.clear_param_store()
    torch.manual_seed(0)
    svi = SVI(ex.model, ex.guide, pyro.optim.ClippedAdam(anchor.adam_params()), Trace_ELBO())
    loss_ex = svi.step(*ex_batch, af)
    d_ex = deltas_example(start_ex)
    x, mask = ex_batch[0], ex_batch[2].bool()
    full = {"annealing_factor_example": af, "loss_example": loss_ex}
    full["max_abs_step_example"] = size(d_ex)
    for side, m in pair.models.items():
        for which, beta in (("own_schedule", kl_beta(0, config)), ("example_factor", af)):
            restore(m, start_ours[side])
            ann = LatentScale(beta)
            svi = SVI(
                ann(m.model),
                ann(m.guide),
                make_optimizer(config, m),
                make_objective(config.objective, config.num_particles),
            )
            torch.manual_seed(0)
            loss = svi.step(x, mask)
            d = deltas_package(side, start_ours[side])
            diff = torch.cat([(d[k] - d_ex[k]).flatten() for k in d])
            ref = torch.cat([d_ex[k].flatten() for k in d])
            lr = anchor.adam_params()["lr"]
            full[f"{side}_{which}"] = {
                "annealing_factor": beta,
                "loss": loss,
                "rel_step_diff": float(diff.norm() / ref.norm()),
                "max_abs_step_diff": float(diff.abs().max()),
                # Adam's first step is about lr * sign(gradient): a gradient within rounding
                # of 0 may flip its element's step, a difference of up to 2 lr
                "fraction_elements_diff_over_1pct_lr": float(
                    (diff.abs() > 0.01 * lr).double().mean()
                ),
            }
    out["one_svi_step"] = full
    restore(ex, start_ex)
    for s, m in pair.models.items():
        restore(m, start_ours[s])
    pyro.clear_param_store()
    return out


def validation_scores(pair, val_batch, particles, package_eval=None):
    """Validation ELBO per step of the weights in ``pair`` scored by the example (its
    ``do_evaluation``: RNN in eval mode, ``Trace_ELBO`` loss, one batch of all sequences) and by
    both package models on that batch with the same draws."""
    x, mask = val_batch[0], val_batch[2].bool()
    steps = float(mask.sum())
    pair.example.rnn.eval()
    for m in pair.models.values():
        m.eval()
    losses = {"example": [], **{s: [] for s in SIDES}}
    for seed in range(particles):
        losses["example"].append(example_loss(pair, val_batch, 10_000 + seed, 1.0, grads=False))
        for side in SIDES:
            losses[side].append(package_loss(pair, side, x, mask, 10_000 + seed, 1.0, False))
    pair.example.rnn.train()
    for m in pair.models.values():
        m.train()
    res = {k: -sum(v) / len(v) / steps for k, v in losses.items()}
    for side in SIDES:
        res[f"{side}_minus_example_max_abs_per_draw"] = max(
            abs(b - a) / steps for a, b in zip(losses["example"], losses[side])
        )
    return res


def training_curves():
    """Train loss and validation ELBO per step of the two recorded runs at a few epochs."""
    if not (EXAMPLE_CKPT.is_file() and PACKAGE_LOG.is_file()):
        return None
    ex = {r["epoch"]: r for r in torch.load(EXAMPLE_CKPT, weights_only=True)["history"]}
    ours = {r["epoch"]: r for r in torch.load(PACKAGE_LOG, weights_only=True)["history"]}
    return ex, ours


def finite_or_none(v):
    return v if math.isfinite(v) else None


def lockstep_training(anchor, preset, config, init, seed, epochs):
    """(d) Both implementations trained side by side in float32 on the same random streams: the
    same initial weights (the example's construction after ``pyro.set_rng_seed(seed)``, or the
    package's after ``torch.manual_seed(seed)``, copied into the other), the same minibatches
    (``torch.randperm`` of a generator seeded with ``seed``, as the example's loop draws them),
    the same noise (the global generator reseeded before each side's update) and the example's
    annealing factor on both sides; each side with its own wiring (the example's ``SVI`` and
    ``ClippedAdam``; ``LatentScale``, ``make_objective`` and ``make_optimizer`` of the preset
    for the package's DMM as the preset builds it). Returns per epoch the training loss per step
    of both and the largest difference between corresponding weights."""
    d = anchor.defaults
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    ex, svi_ex = anchor.make_svi()
    torch.manual_seed(seed)
    ours = DMM(88, **preset.model_options)
    ours.module_name = "pyro_seq_dmm_lockstep"
    if init == "example":
        anchors.copy_weights(ex, ours)
    else:
        with torch.no_grad():
            named = dict(ours.named_parameters())
            for k, p in ex.named_parameters():
                p.copy_(named[anchors.pyro_seq_name(k)].reshape(p.shape))
    ann = LatentScale(config.kl_start)
    svi_ours = SVI(
        ann(ours.model),
        ann(ours.guide),
        make_optimizer(config, ours),
        make_objective(config.objective, config.num_particles),
    )
    train = anchor.data()["train"]
    n = len(train["sequence_lengths"])
    nb = math.ceil(n / d.mini_batch_size)
    n_steps = float(train["sequence_lengths"].sum())
    g = torch.Generator().manual_seed(seed)
    rows = []
    with pyro.validation_enabled(False):
        for e in range(epochs):
            perm = torch.randperm(n, generator=g)
            loss_ex = loss_ours = 0.0
            for b in range(nb):
                mb = anchor.mini_batch(perm[b * d.mini_batch_size : (b + 1) * d.mini_batch_size])
                af = example_annealing(e * nb + b, d, nb)
                torch.manual_seed(10_000 * seed + 100 * e + b)
                loss_ex += svi_ex.step(*mb, af)
                ann.beta = af
                torch.manual_seed(10_000 * seed + 100 * e + b)
                loss_ours += svi_ours.step(mb[0], mb[2].bool())
            named = dict(ours.named_parameters())
            gap = max(
                float(
                    (p.detach() - named[anchors.pyro_seq_name(k)].detach().reshape(p.shape))
                    .abs()
                    .max()
                )
                for k, p in ex.named_parameters()
            )
            rows.append(
                {
                    "epoch": e + 1,
                    "example_train_loss_per_step": finite_or_none(loss_ex / n_steps),
                    "package_train_loss_per_step": finite_or_none(loss_ours / n_steps),
                    "max_abs_weight_diff": finite_or_none(gap),
                }
            )
    pyro.clear_param_store()
    return {"init": init, "seed": seed, "epochs": rows}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--particles", type=int, default=8, help="draws per comparison")
    p.add_argument("--seed", type=int, default=0, help="the example's initial weights")
    p.add_argument("--batch-seed", type=int, default=0, help="which 20 training sequences")
    p.add_argument(
        "--lockstep",
        default="example:0,package:2",
        help="(d) lockstep trainings, INIT:SEED,... with INIT example or package ('' for none)",
    )
    p.add_argument("--lockstep-epochs", type=int, default=4)
    p.add_argument("--anchors", default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--output", default=None, help="JSON (default results/<name>.json)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    began = time.time()
    anchor = anchors.load_anchor(args.anchors, args.data_dir)
    preset = get_preset(PRESET)
    config = preset.train_config()
    data = anchor.data()
    train = data["train"]
    n_train = len(train["sequence_lengths"])
    n_mini_batches = math.ceil(n_train / anchor.defaults.mini_batch_size)

    # the package's loader reads the same sequences as the example's
    ours_data = load_piano_rolls(anchor.data_dir / "jsb_chorales.pickle")
    same_data = all(
        len(ours_data[s]) == len(data[s]["sequence_lengths"])
        and all(
            torch.equal(a, data[s]["sequences"][i, : len(a)]) for i, a in enumerate(ours_data[s])
        )
        for s in ("train", "valid", "test")
    )

    idx = torch.randperm(n_train, generator=torch.Generator().manual_seed(args.batch_seed))[:20]

    def batch(split, indices, dtype):
        d = data[split]
        return anchor.poly.get_mini_batch(indices, d["sequences"].to(dtype), d["sequence_lengths"])

    result = {
        "benchmark": "dmm_example_equivalence",
        "anchor": {"folder": str(anchor.folder), "sha256": anchor.digests},
        "preset": PRESET,
        "preset_model_options": dict(preset.model_options),
        "data_identical_to_example_loader": same_data,
        "minibatch_indices": idx.tolist(),
        "particles": args.particles,
    }

    # initialisation: the example's construction against the package's (jsb_dmm.py builds the
    # preset's DMM after torch.manual_seed(seed); the preset's init "none" keeps it): the same
    # distributions per parameter (different draws), compared by their standard deviations
    pyro.set_rng_seed(args.seed)
    d = anchor.defaults
    ex0 = anchor.module.DMM(rnn_dropout_rate=d.rnn_dropout_rate, num_iafs=d.num_iafs)
    torch.manual_seed(args.seed)
    ours0 = dict(DMM(88, **preset.model_options).named_parameters())
    init = {}
    for k, v in ex0.named_parameters():
        w = ours0[anchors.pyro_seq_name(k)]
        init[k] = {
            "std_example": float(v.std()) if v.numel() > 1 else float(v.abs().max()),
            "std_package": float(w.std()) if w.numel() > 1 else float(w.abs().max()),
            "max_abs_example": float(v.abs().max()),
            "max_abs_package": float(w.abs().max()),
        }
    result["initialisation"] = init

    # (a), (b), (c) in float64
    pyro.clear_param_store()
    pair = Pair(anchor, preset, torch.float64, args.seed)
    ex_batch = batch("train", idx, torch.float64)
    x, mask = ex_batch[0], ex_batch[2].bool()
    result["minibatch_steps"] = int(mask.sum())
    result["minibatch_T_max"] = int(x.shape[1])
    weights = {"init_seed%d" % args.seed: None}
    ex_state = None
    if EXAMPLE_CKPT.is_file():
        ex_state = torch.load(EXAMPLE_CKPT, weights_only=True)
        weights[f"example_trained_epoch{ex_state['epoch']}"] = ex_state["model"]
    float64 = {}
    for label, state in weights.items():
        if state is not None:
            pair.example.load_state_dict(state)
            pair.sync_from_example()
        entry = {"latent_path_max_abs_diff_twin": latent_path_gap(pair, ex_batch, x, mask, 0)}
        entry["example_scales"] = scale_stats(pair, ex_batch, 0)
        entry.update(compare_objective(pair, ex_batch, args.particles, (1.0, 0.2)))
        float64[label] = entry
        print(f"[{time.time() - began:.0f} s] float64 objective/gradients at {label} done")
    result["float64"] = float64

    # (c) at the initial weights: the first update of a run
    pair.example.load_state_dict(
        Pair(anchor, preset, torch.float64, args.seed).example.state_dict()
    )
    pair.sync_from_example()
    af0 = example_annealing(0, anchor.defaults, n_mini_batches)
    pair.zero_grad()
    example_loss(pair, ex_batch, 0, af0)
    result["updates"] = compare_updates(pair, anchor, config, ex_batch, af0, pair.example_grads())
    print(f"[{time.time() - began:.0f} s] optimizer comparison done")

    # float32: validation ELBO of both trained weight sets, scored by both implementations
    pyro.clear_param_store()
    pair32 = Pair(anchor, preset, torch.float32, args.seed)
    val32 = batch("valid", torch.arange(len(data["valid"]["sequence_lengths"])), torch.float32)
    val64 = batch("valid", torch.arange(len(data["valid"]["sequence_lengths"])), torch.float64)
    trained = {}
    if ex_state is not None:
        trained[f"example_epoch{ex_state['epoch']}"] = ("example", ex_state["model"])
    if PACKAGE_CKPT.is_file():
        trained["package_long5000_best"] = (
            "package",
            torch.load(PACKAGE_CKPT, weights_only=True),
        )
    float32 = {}
    for label, (kind, state) in trained.items():
        entry = {}
        for dtype_name, pr, vb in (("float32", pair32, val32), ("float64", pair, val64)):
            if kind == "example":
                pr.example.load_state_dict(state)
                pr.sync_from_example()
            else:
                pr.load_package_weights({k: v.to(pr.dtype) for k, v in state.items()})
            entry[f"valid_elbo_{dtype_name}"] = validation_scores(pr, vb, args.particles)
        # float32 gradients on the training minibatch (af 1), example vs twin, same draws
        ex32 = batch("train", idx, torch.float32)
        g = {"example": None, "twin": None}
        for seed in range(args.particles):
            pair32.zero_grad()
            example_loss(pair32, ex32, seed, 1.0)
            ge = pair32.example_grads()
            pair32.zero_grad()
            package_loss(pair32, "twin", ex32[0], ex32[2].bool(), seed, 1.0)
            gt = pair32.package_grads("twin")
            g = {
                "example": ge if g["example"] is None else {k: g["example"][k] + ge[k] for k in ge},
                "twin": gt if g["twin"] is None else {k: g["twin"][k] + gt[k] for k in gt},
            }
        entry["float32_twin_grad_vs_example"] = grad_table(g["example"], g["twin"])
        float32[label] = entry
        print(f"[{time.time() - began:.0f} s] trained weights {label} done")
    result["trained_weights"] = float32

    # the two training loops' schedules, update by update
    steps = range(anchor.defaults.annealing_epochs * n_mini_batches + 2 * n_mini_batches)
    diffs = [
        abs(example_annealing(s, anchor.defaults, n_mini_batches) - kl_beta(s, config))
        for s in steps
    ]
    result["annealing"] = {
        "example_updates_per_epoch": n_mini_batches,
        "example_anneal_updates": anchor.defaults.annealing_epochs * n_mini_batches,
        "package_anneal_updates": config.kl_anneal_steps,
        "max_abs_factor_diff": max(diffs),
        "first_update": {
            "example": example_annealing(0, anchor.defaults, n_mini_batches),
            "package": kl_beta(0, config),
        },
    }
    lockstep = []
    for item in filter(None, args.lockstep.split(",")):
        init_kind, _, s_ = item.partition(":")
        lockstep.append(
            lockstep_training(anchor, preset, config, init_kind, int(s_), args.lockstep_epochs)
        )
        print(f"[{time.time() - began:.0f} s] lockstep training {item} done")
    result["lockstep_training"] = lockstep
    curves = training_curves()
    if curves is not None:
        ex_h, ours_h = curves
        n_steps = float(train["sequence_lengths"].sum())
        result["recorded_runs"] = {
            str(e): {
                "example_train_loss_per_step": ex_h[e]["train_loss"] / n_steps,
                "package_train_loss_per_step": ours_h[e]["train_loss_per_step"],
                "example_valid_elbo": ex_h[e].get("valid"),
                "package_valid_elbo": ours_h[e].get("valid_elbo_per_step"),
            }
            for e in (1, 2, 3, 4, 5, 10, 50, 100, 200, 500, 1000, 1050)
            if e in ex_h and e in ours_h
        }
    result["seconds"] = time.time() - began
    report(result)
    write_result("dmm_example_equivalence", result, args.output)
    return result


def report(r):
    print(f"\ndata identical to the example's loader: {r['data_identical_to_example_loader']}")
    print(f"minibatch: 20 sequences, {r['minibatch_steps']} steps, T_max {r['minibatch_T_max']}")
    for label, entry in r["float64"].items():
        print(
            f"\nfloat64, weights {label} (latent paths twin vs example: max |dz| "
            f"{entry['latent_path_max_abs_diff_twin']:.2e})"
        )
        print(
            f"{'af':>4} {'ELBO/step ex':>13} {'twin-ex':>10} {'preset-ex':>22} "
            f"{'grad rel twin':>14} {'grad rel preset':>16}"
        )
        for key, res in entry.items():
            if not key.startswith("af_"):
                continue
            e = res["elbo_per_step"]["example"]
            tw = res["twin_minus_example_loss_per_step"]
            pr = res["preset_minus_example_loss_per_step"]
            print(
                f"{res['annealing_factor']:>4g} {e:>13.5f} {tw['max_abs_per_draw']:>10.1e} "
                f"{pr['mean']:>+12.2e}+-{pr['stderr']:.1e} "
                f"{res['twin_grad_vs_example']['all_rel_diff']:>14.1e} "
                f"{res['preset_grad_vs_example']['all_rel_diff']:>16.1e}"
            )
        top = sorted(
            entry["af_1"]["preset_grad_vs_example"]["per_parameter"].items(),
            key=lambda kv: -kv[1]["rel_diff"],
        )[:4]
        print(
            "  preset vs example, largest gradient differences (af 1): "
            + ", ".join(f"{k} {v['rel_diff']:.1e}" for k, v in top)
        )
        for role, st in entry["example_scales"].items():
            print(
                f"  example {role} scales: min {st['min']:.2e}, 1% {st['q01']:.2e}, median "
                f"{st['median']:.2e}, below 0.01 {st['fraction_below_0.01']:.1%}"
            )
    u = r["updates"]
    print(
        "\noptimizer: example",
        u["optimizer_example"],
        "\n           package",
        u["optimizer_package"],
    )
    for row in u["same_gradients"]:
        print(
            f"  same gradients, update {row['update']}: |step| {row['max_abs_step_example']:.2e}"
            f", twin diff {row['twin_max_abs_step_diff']:.1e}"
            f", preset diff {row['preset_max_abs_step_diff']:.1e}"
        )
    f = u["one_svi_step"]
    print(
        f"  one SVI step from the same weights and seed (example af "
        f"{f['annealing_factor_example']:.6f}, |step| {f['max_abs_step_example']:.2e}):"
    )
    for key, row in f.items():
        if isinstance(row, dict):
            print(
                f"    {key:<22} af {row['annealing_factor']:.6f}: loss diff "
                f"{row['loss'] - f['loss_example']:+.2e}, |d step|/|step| "
                f"{row['rel_step_diff']:.1e}, elements off by >1% lr "
                f"{row['fraction_elements_diff_over_1pct_lr']:.1e}"
            )
    for label, entry in r["trained_weights"].items():
        print(f"\ntrained weights {label}: validation ELBO per step (same draws)")
        for dt in ("float32", "float64"):
            v = entry[f"valid_elbo_{dt}"]
            print(
                f"  {dt}: example {v['example']:.4f}  twin {v['twin']:.4f}  preset "
                f"{v['preset']:.4f}  (max |twin-ex| per draw "
                f"{v['twin_minus_example_max_abs_per_draw']:.1e})"
            )
        print(
            f"  float32 gradient twin vs example: rel diff "
            f"{entry['float32_twin_grad_vs_example']['all_rel_diff']:.1e}"
        )
    ratios = [
        v["std_package"] / v["std_example"]
        for v in r["initialisation"].values()
        if v["std_example"] > 0
    ]
    zero = [k for k, v in r["initialisation"].items() if v["std_example"] == 0]
    print(
        f"\ninitialisation: std package / std example per parameter in "
        f"[{min(ratios):.3f}, {max(ratios):.3f}]; zero in both: {zero}"
    )
    a = r["annealing"]
    print(
        f"\nannealing: max |factor diff| {a['max_abs_factor_diff']:.1e} "
        f"(first update {a['first_update']})"
    )
    for run in r["lockstep_training"]:
        print(
            f"\nlockstep training, {run['init']}'s initial weights (seed {run['seed']}): "
            "train loss/step example | package, max |weight diff|"
        )
        for row in run["epochs"]:
            ex_l, ours_l, gap = (
                row[k]
                for k in (
                    "example_train_loss_per_step",
                    "package_train_loss_per_step",
                    "max_abs_weight_diff",
                )
            )
            print(
                f"  epoch {row['epoch']}: "
                + " | ".join("nan" if v is None else f"{v:.3f}" for v in (ex_l, ours_l))
                + f"  {'nan' if gap is None else f'{gap:.1e}'}"
            )
    if "recorded_runs" in r:
        print("\nrecorded runs (train loss/step, valid ELBO/step): example | package")
        for e, row in r["recorded_runs"].items():
            print(
                f"  epoch {e:>5}: {row['example_train_loss_per_step']:.3f} "
                f"{row['example_valid_elbo'] or float('nan'):.3f} | "
                f"{row['package_train_loss_per_step']:.3f} "
                f"{row['package_valid_elbo'] or float('nan'):.3f}"
            )
    print(f"\n{r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
