"""GTM-SM on image navigation (thesis 7.4.1, Fig. 7.2d): frame error per prediction step
against SRNN and VRNN baselines.

1. Data: :func:`pyro_seq.data.simulators.image_navigation` (cached): the flattened 8x8 frames,
   with the one-hot actions as known inputs ``u_t`` (``as_sequences()``, a
   :class:`~pyro_seq.data.SequenceList`). Training sequences have ``tau + pred`` steps (the
   preset's data: 1000 of 256 + 32), a fifth of ``--test`` validates, test sequences have
   ``tau + test_pred`` steps (100 of 256 + 256).
2. Models, each trained with :func:`pyro_seq.train.fit`, which passes the actions as
   ``inputs=`` (resumable: ``benchmarks/checkpoints/gtmsm_<tag>/<model>/checkpoint.pt``, tqdm
   progress):

   * ``gtmsm``: :class:`pyro_seq.models.GTMSM` with the settings of the preset
     ``gtmsm_navigation`` (:mod:`pyro_seq.presets`; thesis 7.7.1: 16-d codes, r = 1e-3, 5
     neighbours, Adam 1e-3, plus the learning aids: inverse pairs of displacements, all 256
     memories as neighbours at first, down to 5 by epoch 20, the wall network at 10x the rate;
     40 epochs, batch 16, clipping at 50, the rate constant for 20 epochs and then divided by
     1.1 per epoch), actions as inputs. A flag that changes a preset's value (``--train``,
     ``--tau``, ``--pred``, ``--epochs``, ``--batch-size``, ``--lr``, ``--seed``, the
     ``--gtmsm-*`` options; ``--gtmsm-true-m``
     and ``--smoke``'s sizes) is an override, recorded in the JSON's ``overrides`` and in
     each GTM-SM evaluation with the ``preset`` and the model options used. The thesis's
     literal settings are the preset ``gtmsm_navigation_thesis`` (``--gtmsm-displacements
     free --gtmsm-neighbour-warmup none --gtmsm-wall-lr 1``);
   * ``srnn``, ``vrnn``: :class:`~pyro_seq.models.SRNN` / :class:`~pyro_seq.models.VRNN` with a
     Gaussian likelihood on the frames and the actions as known inputs (``input_dim=5``: the
     SRNN's deterministic layer and the VRNN's recurrence read ``u_t``); they have no memory
     besides their RNN state. No preset covers them: their sizes (128 units, z 16) and epochs
     (``--baseline-epochs``, 50) are the script's own; they train with the GTM-SM's training
     configuration otherwise. (Until 2026-11-27 the baselines saw the actions packed into
     their observations, 69 features per step, scored as observations; ``--packed``
     reproduces that.)

3. Prediction on the test sequences: the frames after ``tau`` are hidden, the actions kept.
   GTM-SM: :meth:`~pyro_seq.models.GTMSM.predict` (noise-free states, the prior mean of the
   memory mixture, decoded); baselines: :func:`pyro_seq.tasks.impute` with the actions as
   ``inputs=``, ``method="importance"`` (``K`` paths from the guide with the frames marked
   unobserved, self-normalised weights: an estimate of ``E[x_miss | x_obs]``) or
   ``"iterative"`` (Bayer & Osendorfer 2014, sec. 4.3). Reported: the mean absolute pixel
   error per prediction step, and the error of predicting the mean memorised frame.

JSON in ``benchmarks/results/gtmsm_<tag>.json`` (settings, machine, per-step errors, training
histories); the finished evaluations are kept in ``<checkpoints>/evaluations.json`` so that a
rerun skips them. Several GTM-SM settings can share one tag's baselines (``--gtmsm-variant``);
each call may train a subset (``--models``), and the calls merge their evaluations. The run of
the docs (2026-11-26/27, one thread per process; the third is the preset's, whose recorded
command types its values)::

    python benchmarks/paper/gtmsm_navigation.py --models srnn --tag nav_1000_inputs  # 50 epochs
    python benchmarks/paper/gtmsm_navigation.py --models vrnn --baseline-epochs 30 \
        --tag nav_1000_inputs
    python benchmarks/paper/gtmsm_navigation.py --models gtmsm --gtmsm-variant learned \
        --tag nav_1000_inputs
    python benchmarks/paper/gtmsm_navigation.py --models gtmsm --gtmsm-variant true_m \
        --gtmsm-true-m --gtmsm-displacements free --gtmsm-neighbour-warmup 256 10 --epochs 30 \
        --tag nav_1000_inputs
    python benchmarks/paper/gtmsm_navigation.py --smoke      # seconds: tiny sizes, nothing recorded
"""

import argparse
import inspect
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch
from common import ROOT, write_result

from pyro_seq.data.simulators.navigation import NAVIGATION_SIZES, image_navigation
from pyro_seq.models import GTMSM
from pyro_seq.presets import get_preset

PRESET = get_preset("gtmsm_navigation")
MODELS = ("gtmsm", "srnn", "vrnn")
#: Steps per sequence of the preset's data (``image_navigation``'s default: tau + 32).
PRESET_STEPS = inspect.signature(image_navigation).parameters["num_steps"].default
#: The baselines' own epochs (no preset covers them; the recorded SRNN's).
BASELINE_EPOCHS = 50
#: The GTM-SM's constructor defaults, the preset's values where it states none.
GTMSM_DEFAULTS = {
    name: par.default
    for name, par in inspect.signature(GTMSM.__init__).parameters.items()
    if par.default is not inspect.Parameter.empty
}
#: Flags that change a preset value -> (where: "data", "model" or "train", the field).
PRESET_FLAGS = {
    "train": ("data", "train"),
    "tau": ("model", "tau"),
    "pred": ("data", "pred"),
    "gtmsm_displacements": ("model", "displacements"),
    "gtmsm_neighbour_warmup": ("model", "neighbour_warmup"),
    "gtmsm_displacement_lr": ("model", "displacement_lr_multiplier"),
    "gtmsm_wall_lr": ("model", "wall_lr_multiplier"),
    "epochs": ("train", "epochs"),
    "batch_size": ("train", "batch_size"),
    "lr": ("train", "lr"),
    "seed": ("train", "seed"),
}
#: ``--smoke``: tiny sizes (overrides of the preset's values where they are its).
SMOKE = dict(
    train=8,
    test=2,
    tau=12,
    pred=4,
    test_pred=6,
    epochs=1,
    baseline_epochs=1,
    batch_size=4,
    particles=2,
    gtmsm_neighbour_warmup=[12, 20],
)
#: ``--smoke``: the GTM-SM's tiny layers (recorded as the override ``smoke_sizes``).
SMOKE_SIZES = dict(hidden_dims=[16], z_dim=4, wall_hidden=4)


def warmup_flag(words):
    """``--gtmsm-neighbour-warmup``'s words: ``[K0, EPOCHS]``, ``"all"`` or ``"none"`` (no
    warm-up: :func:`settings` passes None)."""
    if words in (["all"], ["none"]):
        return words[0]
    try:
        k0, epochs = (int(w) for w in words)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--gtmsm-neighbour-warmup takes K0 EPOCHS (two ints), 'all' or 'none', got {words}"
        ) from None
    return [k0, epochs]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--train",
        type=int,
        default=None,
        help=f"training sequences (preset: {NAVIGATION_SIZES['train']})",
    )
    p.add_argument("--test", type=int, default=100, help="test sequences (a fifth validate)")
    p.add_argument("--tau", type=int, default=None, help="memorisation steps (preset, thesis 256)")
    p.add_argument("--pred", type=int, default=None, help="prediction steps in training (32)")
    p.add_argument("--test-pred", type=int, default=256, help="prediction steps in testing (256)")
    p.add_argument("--epochs", type=int, default=None, help="GTM-SM epochs (preset: 40)")
    p.add_argument(
        "--baseline-epochs",
        type=int,
        default=BASELINE_EPOCHS,
        help="epochs of the SRNN and VRNN baselines (their own setting)",
    )
    p.add_argument("--batch-size", type=int, default=None, help="every model's (preset: 16)")
    p.add_argument("--lr", type=float, default=None, help="every model's (preset: 1e-3)")
    p.add_argument("--particles", type=int, default=32, help="K of the baselines' imputation")
    p.add_argument(
        "--baseline-method",
        default="importance",
        choices=("importance", "iterative"),
        help="how the baselines predict the hidden frames (pyro_seq.tasks.impute); "
        "iterative results are kept as <model>_iterative",
    )
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument(
        "--gtmsm-displacements",
        default=None,
        choices=("free", "conformal", "inverse_pairs"),
        help="GTMSM(displacements=...) (preset: inverse_pairs; the thesis: free)",
    )
    p.add_argument(
        "--gtmsm-neighbour-warmup",
        nargs="+",
        default=None,
        metavar="K0 EPOCHS",
        help="GTMSM(neighbour_warmup=(K0, EPOCHS)), 'all' or 'none' (preset: 256 20; the "
        "thesis: none)",
    )
    p.add_argument(
        "--gtmsm-displacement-lr",
        type=float,
        default=None,
        help="GTMSM(displacement_lr_multiplier=...): rate factor of M (preset: 1)",
    )
    p.add_argument(
        "--gtmsm-wall-lr",
        type=float,
        default=None,
        help="GTMSM(wall_lr_multiplier=...): rate factor of the wall network (preset: 10; "
        "the thesis: 1)",
    )
    p.add_argument(
        "--gtmsm-true-m",
        action="store_true",
        help="an upper reference: M fixed at the true displacements (grid units), "
        "only the wall network and the VAE learnt",
    )
    p.add_argument(
        "--gtmsm-variant",
        default="",
        help="name suffix of this GTM-SM's results and checkpoints (gtmsm_<variant>), "
        "so that several GTM-SM settings share one tag's baselines",
    )
    p.add_argument(
        "--packed",
        action="store_true",
        help="the earlier setting: actions packed into every model's observations "
        "(baselines score them as observations) instead of known inputs",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=None, help="of the data and every model (0)")
    p.add_argument("--tag", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, results to --smoke-dir")
    p.add_argument("--smoke-dir", default="/tmp/gtmsm_smoke", help="where --smoke writes")
    args = p.parse_args(argv)
    if args.gtmsm_neighbour_warmup is not None:
        try:
            args.gtmsm_neighbour_warmup = warmup_flag(args.gtmsm_neighbour_warmup)
        except argparse.ArgumentTypeError as e:
            p.error(str(e))
    if args.smoke:
        vars(args).update(SMOKE)
    args.models = [m for m in args.models.split(",") if m]
    unknown = set(args.models) - set(MODELS)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; choose from {MODELS}")
    if args.gtmsm_variant:
        args.models = [f"gtmsm_{args.gtmsm_variant}" if m == "gtmsm" else m for m in args.models]
    if args.baseline_method != "importance":
        args.models = [
            m if m.startswith("gtmsm") else f"{m}_{args.baseline_method}" for m in args.models
        ]
    return args


def settings(args):
    """The settings of a run: the preset's data (``train`` sequences of ``tau + pred``
    steps), GTM-SM options (the preset's, else the GTM-SM's defaults) and
    :class:`~pyro_seq.train.TrainConfig` (with this run's threads and progress bar), with the
    flags that change a preset's value applied and listed in ``overrides`` (flag destination
    -> the value used; ``--gtmsm-true-m`` and ``--smoke``'s layer sizes too); then the
    script's own: the baselines' epochs and the ``tag``."""
    options = dict(PRESET.model_options)
    values = {
        "data": {"train": NAVIGATION_SIZES["train"], "pred": PRESET_STEPS - GTMSM_DEFAULTS["tau"]},
        "model": {
            field: options.get(field, GTMSM_DEFAULTS[field])
            for where, field in PRESET_FLAGS.values()
            if where == "model"
        },
        "train": asdict(PRESET.train_config()),
    }
    overrides = {}
    for flag, (where, field) in PRESET_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue  # not typed: the preset's
        if value == "none":  # --gtmsm-neighbour-warmup none: no warm-up
            value = None
        if value != values[where][field]:
            overrides[flag] = values[where][field] = value
    model = dict(options, **values["model"])
    if args.gtmsm_true_m:
        overrides["gtmsm_true_m"] = True
        model["displacement_lr_multiplier"] = 0.0  # M stays at the true displacements
    if args.smoke:
        overrides["smoke_sizes"] = SMOKE_SIZES
        model.update(SMOKE_SIZES)
    typed = {
        field: overrides[flag]
        for flag, (where, field) in PRESET_FLAGS.items()
        if where == "train" and flag in overrides
    }
    config = replace(
        PRESET.train_config(**typed),
        num_threads=args.threads,
        progress=not args.smoke,
    )
    data = values["data"]
    tag = args.tag or ("smoke" if args.smoke else f"nav_{data['train']}")
    return {
        "preset": PRESET.name,
        "data": data,
        "model_options": model,
        "config": config,
        "overrides": overrides,
        "baseline_epochs": args.baseline_epochs,
        "tag": tag,
    }


def used_settings(args, run):
    """The flags as parsed, with the values used where one was not typed (the preset's)."""
    places = {"data": run["data"], "model": run["model_options"], "train": asdict(run["config"])}
    used = {flag: places[where][field] for flag, (where, field) in PRESET_FLAGS.items()}
    return dict(vars(args), **used, tag=run["tag"])


def build(name, args, run):
    """The model ``name``: the GTM-SM of ``run`` (:func:`settings`: the preset's options with
    the overrides, ``M`` set to the true displacements with ``--gtmsm-true-m``), or an SRNN or
    VRNN baseline with its own sizes (d, z, hidden 128; no preset covers them), the actions as
    known inputs (``--packed``: in the observations)."""
    from pyro_seq.models import SRNN, VRNN

    if name.startswith("gtmsm"):
        obs_dim, input_dim = (64 + 5, 0) if args.packed else (64, 5)
        model = PRESET.build(obs_dim, input_dim, **run["model_options"])
        if args.gtmsm_true_m:
            from pyro_seq.data.simulators.navigation import ACTION_MOVES

            model.set_displacement_matrix(torch.from_numpy(ACTION_MOVES).T)  # grid units
        return model
    size = 8 if args.smoke else 128
    cls = SRNN if name.startswith("srnn") else VRNN
    opts = dict(d_dim=size, z_dim=min(16, size), hidden_dim=size, likelihood="gaussian")
    if cls is VRNN:
        opts["feature_dim"] = size
    if args.packed:
        return cls(64 + 5, **opts)
    return cls(64, input_dim=5, **opts)  # the actions as known inputs u_t


def predict_frames(name, model, test, args):
    """Predicted frames ``(N, test_pred, 64)`` of the prediction phase."""
    from pyro_seq.tasks import impute

    x = torch.stack(test.as_sequences(pack_actions=True))
    model.eval()
    with torch.no_grad():
        if name.startswith("gtmsm"):
            return model.predict(x[..., :64], test.actions, tau=args.tau)["frames"]
        u = test.one_hot_actions()
        if not args.packed:
            x = x[..., :64]
        observed = torch.ones(x.shape, dtype=torch.bool)
        observed[:, args.tau :, :64] = False
        out = []
        method = "iterative" if name.endswith("_iterative") else "importance"
        for i in range(0, x.shape[0], 8):
            res = impute(
                model,
                x[i : i + 8],
                observed[i : i + 8],
                method=method,
                num_particles=args.particles,
                generator=torch.Generator().manual_seed(args.seed + i),
                inputs=None if args.packed else u[i : i + 8],
            )
            out.append(res.probs[:, args.tau :, :64])
        return torch.cat(out)


def _r2(pred, target):
    """Coefficient of determination per coordinate, pooled over the leading dims."""
    pred, target = pred.reshape(-1, target.shape[-1]), target.reshape(-1, target.shape[-1])
    resid = (target - pred).pow(2).sum(0)
    return (1 - resid / (target - target.mean(0)).pow(2).sum(0)).tolist()


def analyse_gtmsm(args, test, folder, model):
    """How well GTM-SM's states map to the true positions (thesis 7.4.1, Fig. 7.2c): per test
    sequence a linear map (with offset) from the memorised state means to the true positions is
    fitted by least squares on the memorisation phase and applied to the predicted states.
    Reports its R^2 on the memorisation phase (fit) and on the prediction phase (held out), the
    position error per prediction step (grid units), and the learnt displacements ``M``."""
    state = torch.load(folder / "best.pt", weights_only=True)
    model.load_state_dict(state)
    model.eval()
    x = torch.stack(test.as_sequences(pack_actions=True))
    with torch.no_grad():
        out = model.predict(x[..., :64], test.actions, tau=args.tau)
    pos = test.positions.to(out["states"].dtype)
    mem, pred = out["memory_states"], out["states"]
    ones = lambda v: torch.cat([v, torch.ones(v.shape[:-1] + (1,), dtype=v.dtype)], -1)  # noqa
    fit_mem, fit_pred = [], []
    for n in range(x.shape[0]):
        w = torch.linalg.lstsq(ones(mem[n]), pos[n, : args.tau]).solution
        fit_mem.append(ones(mem[n]) @ w)
        fit_pred.append(ones(pred[n]) @ w)
    fit_mem, fit_pred = torch.stack(fit_mem), torch.stack(fit_pred)
    err = (fit_pred - pos[:, args.tau :]).pow(2).sum(-1).sqrt()  # (N, test_pred)
    return {
        "r2_memorisation": _r2(fit_mem, pos[:, : args.tau]),
        "r2_prediction": _r2(fit_pred, pos[:, args.tau :]),
        "position_error_per_step": err.mean(0).tolist(),
        "M": model.displacement_matrix().detach().tolist(),
        "example_states": mem[0].tolist(),
        "example_positions": pos[0].tolist(),
        "example_frames": out["frames"][0].tolist(),
    }


def figures(results, analysis, test, args, prefix):
    """Error-vs-horizon curves (Fig. 7.2d's measure), learnt states beside the true positions
    (Fig. 7.2b/c) and strips of true and predicted frames (Fig. 7.2d)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {
        "gtmsm": "GTM-SM",
        "srnn": "SRNN (importance)",
        "vrnn": "VRNN (importance)",
        "srnn_iterative": "SRNN (iterative)",
        "vrnn_iterative": "VRNN (iterative)",
        "mean_memorised_frame": "mean memorised frame",
    }
    fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
    for key, value in results.items():
        curve = value if isinstance(value, list) else value["frame_error_per_step"]
        label = names.get(key) or (f"GTM-SM ({key[6:]})" if key.startswith("gtmsm_") else key)
        ax.plot(
            range(1, len(curve) + 1),
            curve,
            label=label,
            ls=":" if key == "mean_memorised_frame" else "-",
        )
    if args.test_pred > 200:
        ax.axvline(200, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("prediction step (t - tau)")
    ax.set_ylabel("mean |pixel error|")
    ax.set_title("image navigation: long-term prediction (thesis Fig. 7.2d)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(f"{prefix}_error.png", dpi=120)
    plt.close(fig)
    if analysis:
        states = torch.tensor(analysis["example_states"])
        pos = torch.tensor(analysis["example_positions"])[: args.tau]
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4), layout="constrained")
        left.scatter(pos[:, 1], pos[:, 0], c=range(len(pos)), cmap="viridis", s=12)
        left.invert_yaxis()
        left.set_title("true positions, memorisation (Fig. 7.2b)")
        sc = right.scatter(states[:, 0], states[:, 1], c=range(len(states)), cmap="viridis", s=12)
        right.set_title("learnt states s_t (Fig. 7.2c)")
        fig.colorbar(sc, ax=right, label="time step")
        fig.savefig(f"{prefix}_states.png", dpi=120)
        plt.close(fig)
    shown = [s for s in (0, 1, 2, 3, 199, 200, 201, 202) if s < args.test_pred]
    rows = [("truth", test.frames.flatten(2)[0, args.tau :])]
    rows += [
        (names.get(k) or k.replace("gtmsm_", "GTM-SM "), torch.tensor(v["example_frames"]))
        for k, v in results.items()
        if isinstance(v, dict) and "example_frames" in v
    ]
    side = int(round(rows[0][1].shape[-1] ** 0.5))
    fig, axes = plt.subplots(
        len(rows),
        len(shown),
        figsize=(1.2 * len(shown), 1.3 * len(rows)),
        layout="constrained",
        squeeze=False,
    )
    for i, (label, frames) in enumerate(rows):
        for j, step in enumerate(shown):
            ax = axes[i, j]
            ax.imshow(frames[step].reshape(side, side).clamp(0, 1), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"t = tau+{step + 1}", fontsize=7)
        axes[i, 0].set_ylabel(label, fontsize=8)
    fig.savefig(f"{prefix}_frames.png", dpi=120)
    plt.close(fig)


def save_evaluations(path, done):
    """Write ``done`` into ``path`` merged over what the file holds (another call may have
    evaluated other models into the same tag meanwhile; ``done`` wins): returns the merge."""
    saved = json.loads(path.read_text()) if path.exists() else {}
    merged = {**saved, **done}
    path.write_text(json.dumps(merged))
    return merged


def main(argv=None):
    args = parse_args(argv)
    run = settings(args)
    vars(args).update(used_settings(args, run))  # args.tau, args.seed, ...: the values used
    torch.set_num_threads(args.threads)
    from pyro_seq.train import fit

    t0 = time.time()
    sim = dict(cache=not args.smoke, progress=not args.smoke, seed=args.seed)
    train = image_navigation(args.train, args.tau + args.pred, split="train", **sim)
    valid = image_navigation(max(1, args.test // 5), args.tau + args.pred, split="valid", **sim)
    test = image_navigation(args.test, args.tau + args.test_pred, split="test", **sim)
    sim_seconds = time.time() - t0
    base = Path(args.smoke_dir) if args.smoke else ROOT / "benchmarks" / "checkpoints"
    ckpt = base / f"gtmsm_{args.tag}"
    ckpt.mkdir(parents=True, exist_ok=True)
    done_path = ckpt / "evaluations.json"
    done = json.loads(done_path.read_text()) if done_path.exists() else {}
    truth = test.frames.flatten(2)[:, args.tau :]
    memorised_mean = test.frames.flatten(2)[:, : args.tau].mean(1, keepdim=True)
    results = {"mean_memorised_frame": (memorised_mean - truth).abs().mean(-1).mean(0).tolist()}
    for name in args.models:
        if name in done:
            print(f"{name}: evaluated before, skipped")
            results[name] = done[name]
            continue
        torch.manual_seed(args.seed)
        model = build(name, args, run)
        gtmsm = name.startswith("gtmsm")
        # the baselines: the GTM-SM's training configuration with their own epochs
        config = run["config"] if gtmsm else replace(run["config"], epochs=args.baseline_epochs)
        epochs = config.epochs
        start = time.time()
        folder = ckpt / name.removesuffix("_iterative")  # one trained model, two predictions
        history = fit(
            model,
            train.as_sequences(pack_actions=args.packed),
            valid.as_sequences(pack_actions=args.packed),
            config,
            folder,
        )
        seconds = time.time() - start
        frames = predict_frames(name, model, test, args)
        errors = (frames - truth).abs().mean(-1)  # (N, test_pred)
        done[name] = {
            "frame_error_per_step": errors.mean(0).tolist(),
            "prediction": "GTMSM.predict"
            if name.startswith("gtmsm")
            else f"impute(method={'iterative' if name.endswith('_iterative') else 'importance'})",
            "mean_frame_error": float(errors.mean()),
            "train_seconds_this_call": seconds,
            "epochs": epochs,
            "gtmsm_options": {k: v for k, v in vars(args).items() if k.startswith("gtmsm_")}
            if gtmsm
            else None,
            "preset": run["preset"] if gtmsm else None,  # the baselines have none
            "overrides": run["overrides"] if gtmsm else None,
            "model_options": run["model_options"] if gtmsm else None,
            "train": asdict(config),
            "example_frames": frames[0].tolist(),
            "history": [dict(row) for row in history],
        }
        results[name] = done[name]
        done = save_evaluations(done_path, done)
        print(
            f"{name}: mean frame error {done[name]['mean_frame_error']:.4f} over "
            f"{args.test_pred} prediction steps",
            flush=True,
        )
    for name, value in done.items():  # what earlier calls evaluated into this tag
        results.setdefault(name, value)
    analysis = {}
    gtmsm = [m for m in args.models if m.startswith("gtmsm")]
    if gtmsm:  # kept with the evaluation, so that every variant's states stay in the JSON
        analysis = analyse_gtmsm(args, test, ckpt / gtmsm[0], build(gtmsm[0], args, run))
        done[gtmsm[0]].setdefault("example_frames", analysis.pop("example_frames"))
        done[gtmsm[0]]["states"] = analysis
        done = save_evaluations(done_path, done)
    prefix = (
        Path(args.smoke_dir) / "gtmsm_smoke"
        if args.smoke
        else ROOT / "benchmarks" / "results" / f"gtmsm_{args.tag}"
    )
    figures(results, analysis, test, args, str(prefix))
    states = {name: value["states"] for name, value in done.items() if "states" in value}
    # the JSON holds no frames (the figures show them; the evaluations cache keeps them)
    results = {
        name: {k: v for k, v in value.items() if k not in ("states", "example_frames")}
        if isinstance(value, dict)
        else value
        for name, value in results.items()
    }
    payload = {
        "settings": {k: v for k, v in vars(args).items()},
        "preset": run["preset"],
        "overrides": run["overrides"],
        "simulation_seconds": sim_seconds,
        "results": results,
        "gtmsm_states": states,
        "metric": "mean |pixel error| per prediction step, test split",
    }
    path = Path(args.smoke_dir) / f"gtmsm_{args.tag}.json" if args.smoke else None
    write_result(f"gtmsm_{args.tag}", payload, path)
    return payload


if __name__ == "__main__":
    main()
