"""Command line: ``pyro-seq train | evaluate | sample | impute | denoise``.

Examples::

    pyro-seq train --model srnn --data chorales --epochs 50 --out runs/srnn
    pyro-seq impute runs/srnn --drop 8          # seed 002 sec. 4.3, figure + bits per element
    pyro-seq denoise runs/srnn --flip 0.05      # seed 002 sec. 4.2, figure + error rates
    pyro-seq train --model dmm --data ../shared/data/polyphonic/jsb_chorales.pickle --out runs/dmm
    pyro-seq evaluate runs/srnn --objective iwae --particles 64
    pyro-seq sample runs/srnn --length 64
    pyro-seq train --model rtrbm --objective cd --cd-steps 1 --out runs/rtrbm
    pyro-seq train --model gtmsm --data image_navigation --out runs/gtmsm   # actions packed in x
    pyro-seq evaluate runs/rtrbm --objective ais --particles 100
    pyro-seq train --model srnn --nproc 2 --threads 1 --out runs/srnn2   # data-parallel
    pyro-seq train --model srnn --device cuda --out runs/srnn_gpu        # on a GPU
    pyro-seq evaluate runs/srnn_gpu --objective iwae --particles 64 --device cuda

A run folder holds ``config.json`` (model and training settings), ``checkpoint.pt`` (resume),
``best.pt`` (best validation weights), ``log.csv``/``log.json`` and ``loss_curve.png``.
Re-running ``train`` with the same ``--out`` resumes where it stopped.
"""

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import torch

MODELS = ("dmm", "srnn", "vrnn", "vaernn", "storn", "vosp", "vrae", "rnn", "rtrbm", "kvae",
          "gtmsm")


def build_model(name, obs_dim, options):
    """Construct a model by name with keyword ``options`` (see each model's docstring)."""
    from pyro_seq.models import (DMM, GTMSM, KVAE, RTRBM, SRNN, STORN, VAERNN, VOSP, VRAE, VRNN,
                                 RNNBaseline)

    classes = {"dmm": DMM, "srnn": SRNN, "vrnn": VRNN, "vaernn": VAERNN, "storn": STORN,
               "vosp": VOSP, "vrae": VRAE, "rnn": RNNBaseline, "rtrbm": RTRBM, "kvae": KVAE,
               "gtmsm": GTMSM}
    if name not in classes:
        raise SystemExit(f"unknown model {name!r}; choose from {MODELS}")
    try:
        if name == "kvae":  # frames: square images unless image_shape is given
            options = dict(options)
            side = math.isqrt(obs_dim)
            if "image_shape" not in options and side * side != obs_dim:
                raise ValueError(f"{obs_dim} values per step are not a square frame; pass "
                                 "--model-option image_shape=[H,W]")
            shape = options.pop("image_shape", [side, side])
            if math.prod(shape) != obs_dim:
                raise ValueError(f"image_shape {shape} does not hold {obs_dim} values per step")
            return KVAE(tuple(shape), **options)
        if name == "gtmsm":
            return _build_gtmsm(GTMSM, obs_dim, options)
        return classes[name](obs_dim, **options)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"pyro-seq: error: bad model option for {name}: {e}") from None


def _build_gtmsm(cls, obs_dim, options):
    """A GTM-SM for packed sequences ``(T, F + num_actions)`` (frames, then one-hot actions, as
    ``load_dataset("image_navigation")`` gives them): the trainer passes ``(x, mask)`` only, so
    the actions travel inside ``x`` (``pack_actions=True``). ``frame_shape`` defaults to a
    square greyscale frame, or a square RGB one when ``F / 3`` is a square."""
    options = dict(options)
    if options.pop("pack_actions", True) is not True:
        raise ValueError("the command line trains a GTM-SM on packed actions only "
                         "(pack_actions=true)")
    num_actions = options.get("num_actions", 5)
    if not isinstance(num_actions, int) or not 0 < num_actions < obs_dim:
        raise ValueError(f"num_actions={num_actions!r} does not fit {obs_dim} values per step")
    F = obs_dim - num_actions
    shape = options.pop("frame_shape", None)
    if shape is None:
        side, side3 = math.isqrt(F), math.isqrt(F // 3)
        if side * side == F:
            shape = [side, side]
        elif F % 3 == 0 and 3 * side3 * side3 == F:
            shape = [3, side3, side3]
        else:
            raise ValueError(f"{F} frame values per step (after {num_actions} action columns) "
                             "are not a square frame; pass --model-option frame_shape=[H,W]")
    if math.prod(shape) != F:
        raise ValueError(f"frame_shape {shape} does not hold the {F} frame values per step")
    return cls(tuple(shape), pack_actions=True, **options)


def _parse_options(pairs):
    options = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"--model-option expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _load_data(spec, splits=("train", "valid", "test")):
    from pyro_seq.data import load_dataset

    return load_dataset(spec, splits=splits)


def _load_weights(path):
    from pyro_seq.train import load_weights

    return load_weights(path)


def _device(spec):
    """``--device`` checked by the package's one device check; one line and exit code 1."""
    from pyro_seq.validation import parse_device

    try:
        return parse_device(spec, "--device")
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None


def _to_cpu(value):
    """Tensors (or a tuple of them, e.g. Gaussian emission parameters) copied to the CPU, for
    figures, MIDI files and numbers."""
    if torch.is_tensor(value):
        return value.cpu()
    if isinstance(value, (tuple, list)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _load_run(out_dir, device="cpu"):
    out_dir = Path(out_dir)
    cfg_path = out_dir / "config.json"
    if not cfg_path.exists():
        raise SystemExit(f"{out_dir} is not a run folder (no config.json); train first")
    run = json.loads(cfg_path.read_text())
    model = build_model(run["model"], run["obs_dim"], run["model_options"])
    weights = out_dir / "best.pt"
    if not weights.exists():
        raise SystemExit(f"no trained weights in {out_dir} (best.pt missing)")
    model.load_state_dict(_load_weights(weights))
    model.to(_device(device))
    model.eval()
    return run, model


def _load_run_and_data(args, splits):
    """The trained run ``args.run``, and the splits of ``args.data`` (default: the run's data),
    checked by the package's validator."""
    run, model = _load_run(args.run, args.device)
    spec = args.data or run["data"]
    data = _load_data(spec, splits=splits)
    _check_data(data, model, spec)
    return run, model, data


def _check_data(data, model, spec):
    """Every split through the package's validator; one line and exit code 1 on bad data."""
    from pyro_seq.validation import validate_sequence_list

    for split, seqs in data.items():
        if seqs:
            try:
                validate_sequence_list(seqs, model.obs_dim, model.binary_observations, split)
            except ValueError as e:
                raise SystemExit(f"pyro-seq: error: data {spec}: {e}") from None


def cmd_train(args):
    from pyro_seq.train import TrainConfig, evaluate_bound, fit

    out_dir = Path(args.out)
    _device(args.device)  # before the data are read
    data = _load_data(args.data)
    obs_dim = data["train"][0].shape[-1]
    options = _parse_options(args.model_option)
    if args.z_dim is not None:
        options["z_dim"] = args.z_dim
    if args.inference is not None:
        options["inference"] = args.inference
    config = TrainConfig(
        epochs=args.epochs, batch_size=args.batch_size, objective=args.objective,
        num_particles=args.particles, cd_steps=args.cd_steps, lr=args.lr, clip_norm=args.clip_norm,
        lr_schedule=args.lr_schedule, plateau_factor=args.plateau_factor,
        plateau_patience=args.plateau_patience, plateau_min_lr=args.plateau_min_lr,
        lrd=args.lrd, lr_decay_after=args.lr_decay_after, lr_decay_factor=args.lr_decay_factor,
        kl_start=args.kl_start, kl_anneal_steps=args.kl_anneal_steps, free_bits=args.free_bits,
        missing_prob=args.missing_prob,
        chunk_length=args.chunk_length, patience=args.patience or None, seed=args.seed,
        init=args.init, schedule_during_annealing=args.schedule_during_annealing,
        plateau_restore_best=args.plateau_restore_best,
        time_limit=args.time_limit, num_threads=args.threads,
        progress=not args.quiet, world_size=args.nproc, device=args.device)
    try:
        config.validate()
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    run = {"model": args.model, "obs_dim": obs_dim, "model_options": options, "data": args.data,
           "train": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}}
    torch.manual_seed(args.seed)
    model = build_model(args.model, obs_dim, options)
    from pyro_seq.train.objectives import check_objective

    try:
        check_objective(model, args.objective)
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    _check_data(data, model, args.data)  # before anything is written to --out
    cfg_path = out_dir / "config.json"
    if cfg_path.exists() and not args.restart:
        previous = json.loads(cfg_path.read_text())
        if (previous["model"], previous["model_options"]) != (run["model"], run["model_options"]):
            raise SystemExit(f"{out_dir} holds a different model; use another --out or --restart")
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(json.dumps(run, indent=1))
    print(f"training {args.model} on {args.data}: {len(data['train'])} train / "
          f"{len(data['valid'])} valid sequences, objective {args.objective} (K={args.particles})")
    history = fit(model, data["train"], data["valid"], config, out_dir, resume=not args.restart)
    if history:
        print(f"last epoch: {json.dumps(history[-1])}")
    if data.get("test"):
        model.load_state_dict(_load_weights(out_dir / "best.pt"))
        energy = getattr(model, "energy_based", False)
        method = "pseudo_likelihood" if energy else "elbo"
        result = evaluate_bound(model, data["test"], method=method)
        (out_dir / "test.json").write_text(json.dumps(result, indent=1))
        label = "test pseudo-log-likelihood" if energy else "test ELBO"
        print(f"{label}: {result['per_step']:.4f} nats per time step "
              f"({result['num_steps']} steps, {result['num_sequences']} sequences)")
        if energy:
            print(f"for the log-likelihood: pyro-seq evaluate {out_dir} --objective ais")
    return 0


def cmd_evaluate(args):
    from pyro_seq.train import evaluate_bound

    run, model, data = _load_run_and_data(args, (args.split,))
    if args.objective is None:
        args.objective = "ais" if getattr(model, "energy_based", False) else "elbo"
    torch.manual_seed(args.seed)
    try:
        result = evaluate_bound(model, data[args.split], batch_size=args.batch_size,
                                method=args.objective, num_particles=args.particles,
                                num_betas=args.betas)
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    result["split"] = args.split
    name = f"eval_{args.split}_{args.objective}_{args.particles}.json"
    (Path(args.run) / name).write_text(json.dumps(result, indent=1))
    stderr = (f" +- {result['stderr_per_step']:.4f}" if "stderr_per_step" in result else "")
    print(f"{args.split} {args.objective} (K={args.particles}): {result['per_step']:.4f}{stderr} "
          f"nats per time step over {result['num_steps']} steps of {result['num_sequences']} sequences")
    return 0


def cmd_impute(args):
    """Seed 002 sec. 4.3: drop ``--drop`` consecutive steps of each sequence, impute them."""
    from pyro_seq.data import pad_sequences
    from pyro_seq.tasks import bits_per_element, drop_frames, drop_steps, impute, pixel_error
    from pyro_seq.train.plots import plot_recovery, plot_video

    run, model, data = _load_run_and_data(args, ("train", args.split))
    video = hasattr(model, "impute_frames")
    if args.method is None:
        args.method = "smoothing" if video else "iterative"
    drop = 1 if args.drop_prob is not None else args.drop
    seqs = [s for s in data[args.split] if s.shape[0] > drop][: args.num]
    if not seqs:
        raise SystemExit(f"pyro-seq: error: no {args.split} sequence is longer than --drop {args.drop}")
    g = torch.Generator().manual_seed(args.seed)
    x, mask = pad_sequences(seqs)
    if args.drop_prob is not None:
        observed = drop_frames(mask, args.drop_prob, generator=g, keep_first=1)
    else:
        observed = drop_steps(mask, args.drop, generator=g)
    torch.manual_seed(args.seed)
    device = _device(args.device)
    try:
        res = impute(model, x.to(device), observed.to(device), mask.to(device),
                     method=args.method, num_iterations=args.iterations,
                     num_particles=args.particles, generator=g)
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    probs = res.probs.cpu()
    missing = (~observed & mask).unsqueeze(-1).expand(x.shape)
    target, probs_missing = x[missing], probs[missing]
    freq = torch.cat(data["train"]).float().mean(0).expand(x.shape)[missing]
    result = {"split": args.split, "drop": args.drop, "drop_prob": args.drop_prob,
              "method": args.method, "num_sequences": len(seqs),
              "missing_elements": int(missing.sum()),
              "bits_per_element": bits_per_element(probs_missing, target),
              "baseline_bits_per_element": bits_per_element(freq, target),
              "baseline": "training-set element frequencies",
              "pixel_error": pixel_error(probs, x, missing)}
    out = Path(args.run)
    (out / f"impute_{args.split}_{args.method}.json").write_text(json.dumps(result, indent=1))
    L = int(mask[0].sum())
    png = out / f"impute_{args.split}_0.png"
    if video:  # the recovered video beside the truth (missing frames decoded by the model)
        H, W = model.image_shape[-2:]
        frames = torch.cat([x[0, :L].reshape(L, H, W), probs[0, :L].reshape(L, H, W)], -1)
        plot_video(frames, png, title=f"truth | {args.method} (missing steps "
                   f"{(~observed[0, :L]).nonzero().flatten().tolist()})")
    else:
        shown = torch.where(observed[0, :L, None], x[0, :L], torch.full_like(x[0, :L], float("nan")))
        recovered = torch.where(observed[0, :L, None], x[0, :L], (probs[0, :L] > 0.5).float())
        plot_recovery(x[0, :L], shown, recovered, png, probs=probs[0, :L], title="imputation")
    print(f"imputed {result['missing_elements']} elements of {len(seqs)} {args.split} sequences "
          f"({args.method}): {result['bits_per_element']:.4f} bits/element "
          f"(element frequencies: {result['baseline_bits_per_element']:.4f}), pixel error "
          f"{result['pixel_error']:.4f}; figure {png}")
    return 0


def cmd_denoise(args):
    """Seed 002 sec. 4.2: flip each element with probability ``--flip``, denoise online."""
    from pyro_seq.data import pad_sequences
    from pyro_seq.tasks import denoise
    from pyro_seq.train.plots import plot_recovery

    run, model, data = _load_run_and_data(args, (args.split,))
    seqs = data[args.split][: args.num]
    g = torch.Generator().manual_seed(args.seed)
    x, mask = pad_sequences(seqs)
    flips = (torch.rand(x.shape, generator=g) < args.flip) & mask.unsqueeze(-1)
    corrupted = torch.where(flips, 1 - x, x)
    device = _device(args.device)
    x_hat, probs = _to_cpu(denoise(model, corrupted.to(device), mask.to(device)))
    real = mask.unsqueeze(-1).expand(x.shape)
    result = {"split": args.split, "flip": args.flip, "num_sequences": len(seqs),
              "elements": int(real.sum()),
              "error_rate_corrupted": float((corrupted != x)[real].float().mean()),
              "error_rate_denoised": float((x_hat != x)[real].float().mean())}
    out = Path(args.run)
    (out / f"denoise_{args.split}.json").write_text(json.dumps(result, indent=1))
    L = int(mask[0].sum())
    png = out / f"denoise_{args.split}_0.png"
    plot_recovery(x[0, :L], corrupted[0, :L], x_hat[0, :L], png, title="denoising")
    print(f"denoised {len(seqs)} {args.split} sequences (flip {args.flip}): error rate "
          f"{result['error_rate_corrupted']:.4f} -> {result['error_rate_denoised']:.4f}; figure {png}")
    return 0


def cmd_sample(args):
    from pyro_seq.data.midi import piano_roll_to_midi
    from pyro_seq.train.plots import plot_piano_roll

    run, model = _load_run(args.run, args.device)
    torch.manual_seed(args.seed)
    x, params = _to_cpu(model.generate(args.num, args.length))
    out = Path(args.run)
    for i in range(args.num):
        probs = torch.sigmoid(params[i]) if torch.is_tensor(params) else None
        png = out / f"sample_{i}.png"
        mid = out / f"sample_{i}.mid"
        plot_piano_roll(x[i], png, probs=probs, title=f"{run['model']} sample {i}")
        piano_roll_to_midi(x[i], mid, step_seconds=args.step_seconds)
        print(f"wrote {png} and {mid}")
    return 0


def _train_defaults():
    from pyro_seq.train import TrainConfig

    return TrainConfig()


def make_parser():
    parser = argparse.ArgumentParser(prog="pyro-seq", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model with SVI (resumes if --out has a checkpoint)")
    p.add_argument("--model", choices=MODELS, default="srnn", help="architecture (default srnn)")
    p.add_argument("--data", default="chorales",
                   help="'chorales' (music21's Bach chorales, built in) or the path of a "
                        "piano-roll pickle (e.g. jsb_chorales.pickle)")
    p.add_argument("--objective", choices=("elbo", "meanfield", "iwae", "fivo", "cd"),
                   default="elbo",
                   help="training objective (default elbo = Trace_ELBO; cd = contrastive "
                        "divergence, for --model rtrbm)")
    p.add_argument("--particles", type=int, default=1, help="samples K of the objective")
    p.add_argument("--cd-steps", type=int, default=1, help="Gibbs sweeps k of --objective cd")
    p.add_argument("--epochs", type=int, default=100, help="maximum number of epochs")
    p.add_argument("--batch-size", type=int, default=20, help="sequences per minibatch")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--clip-norm", type=float, default=10.0, help="gradient norm clip per tensor")
    defaults = _train_defaults()
    p.add_argument("--lr-schedule", choices=("plateau", "exponential", "constant"),
                   default=defaults.lr_schedule,
                   help="plateau (default): multiply the rate by --plateau-factor when the "
                        "validation ELBO has not improved for --plateau-patience + 1 epochs; "
                        "exponential: constant for --lr-decay-after epochs, then divided by "
                        "--lr-decay-factor per epoch (the SRNN code); constant: --lr, times "
                        "--lrd after every update")
    p.add_argument("--plateau-factor", type=float, default=defaults.plateau_factor,
                   help=f"rate multiplier on a validation plateau (default {defaults.plateau_factor})")
    p.add_argument("--plateau-patience", type=int, default=defaults.plateau_patience,
                   help="epochs without validation improvement tolerated before the rate is "
                        f"reduced (default {defaults.plateau_patience})")
    p.add_argument("--plateau-restore-best", action=argparse.BooleanOptionalAction,
                   default=defaults.plateau_restore_best,
                   help="when the plateau schedule lowers the rate, go back to the weights of "
                        "the best validation epoch (default on)")
    p.add_argument("--plateau-min-lr", type=float, default=defaults.plateau_min_lr,
                   help=f"lowest rate of the plateau schedule (default {defaults.plateau_min_lr:g})")
    p.add_argument("--lrd", type=float, default=defaults.lrd,
                   help="learning-rate decay per step (--lr-schedule constant)")
    p.add_argument("--lr-decay-after", type=int, default=defaults.lr_decay_after,
                   help="epochs at the full rate (--lr-schedule exponential)")
    p.add_argument("--lr-decay-factor", type=float, default=defaults.lr_decay_factor,
                   help="divide the rate by this per epoch after --lr-decay-after")
    from pyro_seq.train.trainer import INITS

    p.add_argument("--init", choices=INITS, default=defaults.init,
                   help="initialisation of a fresh run (never on resume): srnn = the SRNN "
                        "code's weights for an SRNN plus, for Bernoulli emissions, the output "
                        "bias from the training notes' frequencies; bias = the output bias only; "
                        f"none = as built (default {defaults.init})")
    p.add_argument("--missing-prob", type=float, default=0.0,
                   help="train with each step missing with this probability (thesis app. 6.10)")
    p.add_argument("--kl-start", type=float, default=0.2, help="initial KL weight beta")
    p.add_argument("--kl-anneal-steps", type=int, default=1000,
                   help="updates over which beta rises linearly to 1 (0: no annealing)")
    p.add_argument("--schedule-during-annealing", action=argparse.BooleanOptionalAction,
                   default=defaults.schedule_during_annealing,
                   help="step the plateau schedule and early stopping while beta < 1 too")
    p.add_argument("--free-bits", type=float, default=0.0, help="free bits per latent site (nats)")
    p.add_argument("--chunk-length", type=int, default=None, help="train on windows of this length")
    p.add_argument("--patience", type=int, default=defaults.patience,
                   help="stop after this many epochs without validation improvement; the best "
                        f"weights are kept (default {defaults.patience}; 0: never stop early)")
    p.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    _device_option(p, defaults.device)
    p.add_argument("--nproc", type=int, default=1,
                   help="data-parallel processes (torch.distributed: gloo on CPU, nccl on CUDA); "
                        "each takes a shard of every minibatch")
    p.add_argument("--z-dim", type=int, default=None, help="latent size")
    p.add_argument("--inference", choices=("smoothing", "filtering", "prior", "landmark"),
                   default=None,
                   help="inference network: smoothing or filtering (DMM, SRNN, VRNN; thesis Fig. "
                        "4.2), prior or landmark (GTM-SM; thesis appendix 7.10)")
    p.add_argument("--model-option", action="append", metavar="KEY=VALUE",
                   help="further model constructor option (JSON value), repeatable")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--restart", action="store_true", help="ignore an existing checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="bound on the test set in nats per time step")
    p.add_argument("run", help="run folder written by train")
    p.add_argument("--data", default=None, help="data (default: the run's training data)")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--objective", choices=("elbo", "iwae", "smc", "ais", "exact", "pseudo_likelihood"),
                   default=None,
                   help="estimator: ELBO, IWAE or SMC (FIVO) bound; for an RTRBM the "
                        "log-likelihood by AIS (--particles chains, --betas temperatures; "
                        "default) or exact enumeration (small models), or the pseudo-likelihood")
    p.add_argument("--betas", type=int, default=1000, help="AIS temperatures (--objective ais)")
    p.add_argument("--particles", type=int, default=1, help="samples K of the estimator")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    _device_option(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("sample", help="generate sequences: piano-roll PNG and MIDI files")
    p.add_argument("run", help="run folder written by train")
    p.add_argument("--length", type=int, default=64, help="time steps per sample")
    p.add_argument("--num", type=int, default=1, help="number of samples")
    p.add_argument("--step-seconds", type=float, default=0.25, help="MIDI duration of a step")
    p.add_argument("--seed", type=int, default=0)
    _device_option(p)
    p.set_defaults(func=cmd_sample)

    p = _task_parser(sub, "impute", cmd_impute,
                     "drop steps of test sequences and impute them (seed 002 4.3)")
    p.add_argument("--drop", type=int, default=8, help="consecutive steps dropped per sequence")
    p.add_argument("--drop-prob", type=float, default=None,
                   help="drop each step with this probability instead (thesis Fig. 6.3a)")
    p.add_argument("--method", default=None,
                   choices=("iterative", "importance", "smoothing", "filtering", "generation"),
                   help="iterative (default) or importance; smoothing (KVAE default), filtering "
                        "or generation for a KVAE")
    p.add_argument("--iterations", type=int, default=20, help="iterations (iterative method)")
    p.add_argument("--particles", type=int, default=64, help="particles (importance method)")

    p = _task_parser(sub, "denoise", cmd_denoise,
                     "flip notes at random and denoise online (seed 002 4.2)")
    p.add_argument("--flip", type=float, default=0.05, help="probability of flipping an element")
    return parser


def _task_parser(sub, name, func, help_text):
    """The options shared by the tasks on a trained run (impute, denoise)."""
    p = sub.add_parser(name, help=help_text)
    p.add_argument("run", help="run folder written by train")
    p.add_argument("--data", default=None, help="data set (default: the run's)")
    p.add_argument("--split", default="test")
    p.add_argument("--num", type=int, default=1000, help="at most this many sequences")
    p.add_argument("--seed", type=int, default=0)
    _device_option(p)
    p.set_defaults(func=func)
    return p


def _device_option(p, default="cpu"):
    p.add_argument("--device", default=default,
                   help="where the model runs: cpu, cuda or cuda:N (an error, never a CPU "
                        f"fallback, when CUDA is not there; default {default})")


def main(argv=None):
    from pyro_seq.train import CheckpointError

    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except CheckpointError as e:  # one line naming the file and what to do, no traceback
        raise SystemExit(f"pyro-seq: error: {e}") from None


if __name__ == "__main__":
    sys.exit(main())
