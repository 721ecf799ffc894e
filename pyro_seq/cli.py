"""Command line: ``pyro-seq train | evaluate | sample | impute | denoise | forecast``.

Examples::

    pyro-seq train --model srnn --data chorales --epochs 50 --out runs/srnn
    pyro-seq impute runs/srnn --drop 8          # Bayer & Osendorfer 2014, sec. 4.3
    pyro-seq denoise runs/srnn --flip 0.05      # Bayer & Osendorfer 2014, sec. 4.2
    pyro-seq train --model dmm --data jsb_chorales.pickle --out runs/dmm
    pyro-seq evaluate runs/srnn --objective iwae --particles 64
    pyro-seq forecast runs/srnn --prefix 16 --steps 8    # continue 16 steps by 8, score the truth
    pyro-seq sample runs/srnn --length 64
    pyro-seq train --model rtrbm --objective cd --cd-steps 1 --out runs/rtrbm
    pyro-seq train --model gtmsm --data image_navigation --out runs/gtmsm   # actions as inputs
    pyro-seq train --model kvae --data pendulum --out runs/kvae   # torques as controls
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
import sys
from dataclasses import MISSING, asdict
from pathlib import Path
from typing import Optional, Sequence

import torch

#: Samples with this many binary features per step (the keys of a piano roll) are also written
#: as MIDI files.
PIANO_KEYS = 88


def model_names():
    """The names ``--model`` accepts: :data:`pyro_seq.models.MODELS`."""
    from pyro_seq.models import MODELS

    return tuple(MODELS)


def build_model(name, obs_dim, options, input_dim=0):
    """Construct a model by name for data of ``obs_dim`` features (and ``input_dim`` known
    inputs) per step, with keyword ``options``: the model's own
    :meth:`~pyro_seq.models.ModelContract.for_data`."""
    from pyro_seq.models import MODELS, Unsupported

    if name not in MODELS:
        raise SystemExit(
            f"pyro-seq: error: unknown model {name!r}; choose from {', '.join(MODELS)}"
        )
    try:
        return MODELS[name].for_data(obs_dim, input_dim, **options)
    except Unsupported as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    except (TypeError, ValueError) as e:
        raise SystemExit(f"pyro-seq: error: bad model option for {name}: {e}") from None


def _parse_options(pairs):
    options = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"pyro-seq: error: --model-option expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _load_data(spec, splits=("train", "valid", "test")):
    import pickle

    from pyro_seq.data import load_dataset

    try:
        return load_dataset(spec, splits=splits)
    except (FileNotFoundError, ValueError, pickle.UnpicklingError) as e:  # unknown name, no
        raise SystemExit(f"pyro-seq: error: --data {spec}: {e}") from None  # file, bad N:T
    except IsADirectoryError:
        raise SystemExit(
            f"pyro-seq: error: --data {spec} is a folder; name a data set or a "
            "pickle file (pyro-seq train --help lists the forms)"
        ) from None
    except KeyError as e:  # a pickle without one of the splits
        raise SystemExit(f"pyro-seq: error: --data {spec}: {e.args[0]}") from None


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


#: AIS chains of ``evaluate --objective ais`` when ``--particles`` is not given.
AIS_CHAINS = 100
#: The entries of a run's ``config.json`` the commands read, and their types.
RUN_KEYS = {"model": str, "obs_dim": int, "model_options": dict, "data": str}


def _read_config(out_dir):
    """The ``config.json`` of run folder ``out_dir`` (a dict with :data:`RUN_KEYS`); one line
    naming the file and the remedy when it is not valid JSON or lacks an entry."""
    cfg_path = Path(out_dir) / "config.json"
    retrain = f"retrain with pyro-seq train --out {out_dir} --restart"
    try:
        run = json.loads(cfg_path.read_text())
    except UnicodeDecodeError:
        raise SystemExit(
            f"pyro-seq: error: {cfg_path} is not text (not a config.json written by "
            f"pyro-seq train); {retrain}"
        ) from None
    except json.JSONDecodeError as e:
        raise SystemExit(
            f"pyro-seq: error: {cfg_path} is not valid JSON (line {e.lineno} "
            f"column {e.colno}: {e.msg}; truncated or edited?); {retrain}"
        ) from None
    except OSError as e:
        raise SystemExit(f"pyro-seq: error: cannot read {cfg_path}: {e.strerror or e}") from None
    if not isinstance(run, dict):
        raise SystemExit(
            f"pyro-seq: error: {cfg_path} holds a JSON {type(run).__name__}, not "
            f"the settings of a run; {retrain}"
        )
    nouns = {str: "a string", int: "a whole number", dict: "an object"}
    for key, kind in RUN_KEYS.items():
        if not isinstance(run.get(key), kind) or isinstance(run.get(key), bool):
            raise SystemExit(
                f"pyro-seq: error: {cfg_path} has no valid {key!r} entry ({nouns[kind]}); {retrain}"
            )
    return run


def _load_best(model, out_dir, name, load=True):
    """Read ``out_dir/best.pt`` and check that it fits ``model`` (the run's ``name``); load it
    into ``model`` unless ``load`` is False. One line naming the file and the remedy when it is
    damaged, holds a NaN or an infinity (:class:`~pyro_seq.train.CheckpointError`) or holds
    the weights of another model."""
    from pyro_seq.train.checkpoint import state_dict_mismatch

    state = _load_weights(Path(out_dir) / "best.pt")
    problem = state_dict_mismatch(model.state_dict(), state)
    if problem is None and load:
        try:
            model.load_state_dict(state)
        except RuntimeError as e:  # e.g. a custom load hook: torch's message on one line
            problem = " ".join(str(e).split("\n", 1)[-1].split())
    if problem is not None:
        raise SystemExit(
            f"pyro-seq: error: best.pt in {out_dir} holds weights of another model, "
            f"not of the run's {name} ({problem}): retrain with pyro-seq train "
            f"--out {out_dir} --restart"
        )


def _load_run(out_dir, device="cpu"):
    out_dir = Path(out_dir)
    cfg_path = out_dir / "config.json"
    if not cfg_path.exists():
        raise SystemExit(
            f"pyro-seq: error: {out_dir} is not a run folder (no config.json); train first"
        )
    run = _read_config(out_dir)
    model = build_model(run["model"], run["obs_dim"], run["model_options"], run.get("input_dim", 0))
    weights = out_dir / "best.pt"
    if not weights.exists():
        raise SystemExit(
            f"pyro-seq: error: no trained weights in {out_dir} (best.pt missing); train first"
        )
    _load_best(model, out_dir, run["model"])
    model.to(_device(device))
    model.eval()
    return run, model


def _load_run_and_data(args, splits, require=None):
    """The trained run ``args.run``, and the splits of ``args.data`` (default: the run's data),
    checked by the package's validator; the model must declare task ``require`` (if given),
    checked before the data are read."""
    run, model = _load_run(args.run, args.device)
    if require is not None:
        model.require(require)
    spec = args.data or run["data"]
    data = _load_data(spec, splits=splits)
    if run.get("ignore_inputs") or not model.input_dim:  # as the run was trained
        data = {split: list(seqs) for split, seqs in data.items()}
    _check_data(data, model, spec)
    return run, model, data


def _check_data(data, model, spec):
    """Every split through the package's validator; one line and exit code 1 on bad data."""
    from pyro_seq.data import inputs_of
    from pyro_seq.validation import validate_sequence_list

    for split, seqs in data.items():
        if seqs:
            try:
                validate_sequence_list(
                    seqs,
                    model.obs_dim,
                    model.binary_observations,
                    split,
                    inputs=inputs_of(seqs),
                    input_dim=model.input_dim,
                )
            except ValueError as e:
                hint = (
                    "; --ignore-inputs trains without them"
                    if inputs_of(seqs) is not None and not model.input_dim
                    else ""
                )
                raise SystemExit(f"pyro-seq: error: data {spec}: {e}{hint}") from None


def _input_dim(seqs):
    """Features per step of the known inputs a split carries (0 without)."""
    from pyro_seq.data import inputs_of

    inputs = inputs_of(seqs)
    return 0 if not inputs else int(inputs[0].shape[-1])


def _batch(seqs, indices, length=None):
    """``(x, mask, inputs)`` of the sequences ``indices`` of a split (cut to ``length`` steps
    when given; ``inputs`` None when the split carries none), padded on the CPU."""
    from pyro_seq.data import inputs_of, pad_sequences

    cut = slice(None) if length is None else slice(0, length)
    x, mask = pad_sequences([seqs[i][cut] for i in indices])
    inputs = inputs_of(seqs)
    u = None if inputs is None else pad_sequences([inputs[i][cut] for i in indices])[0]
    return x, mask, u


def _on(device, tensor):
    return None if tensor is None else tensor.to(device)


def cmd_train(args):
    from pyro_seq.train import evaluate_bound, fit

    out_dir = Path(args.out)
    _device(args.device)  # before the data are read
    data = _load_data(args.data)
    if args.ignore_inputs:  # train a model without the data's known inputs
        data = {split: list(seqs) for split, seqs in data.items()}
    obs_dim = data["train"][0].shape[-1]
    input_dim = _input_dim(data["train"])
    options = _parse_options(args.model_option)
    if args.z_dim is not None:
        options["z_dim"] = args.z_dim
    if args.inference is not None:
        options["inference"] = args.inference
    config = train_config_from_args(args)
    try:
        config.validate()
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    run = {
        "model": args.model,
        "obs_dim": obs_dim,
        "input_dim": input_dim,
        "model_options": options,
        "data": args.data,
        "ignore_inputs": args.ignore_inputs,
        "train": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
    }
    torch.manual_seed(config.seed)
    model = build_model(args.model, obs_dim, options, input_dim)
    from pyro_seq.train.objectives import check_objective, make_objective

    try:
        check_objective(model, config.objective)
        make_objective(
            config.objective, config.num_particles, config.free_bits, cd_steps=config.cd_steps
        )
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    if config.missing_prob > 0 and model.energy_based:  # the trainer refuses it, after writing
        raise SystemExit(
            f"pyro-seq: error: --missing-prob {config.missing_prob} marks steps "
            f"unobserved, which needs a latent-variable model; {args.model} is "
            "energy-based: train it without --missing-prob"
        )
    _check_data(data, model, args.data)  # before anything is written to --out
    cfg_path = out_dir / "config.json"
    if cfg_path.exists() and not args.restart:
        previous = _read_config(out_dir)
        if (previous["model"], previous["model_options"]) != (run["model"], run["model_options"]):
            raise SystemExit(
                f"pyro-seq: error: {out_dir} holds a different model; use another "
                "--out or --restart"
            )
        if (out_dir / "best.pt").exists():  # resuming: the weights must be this model's
            _load_best(model, out_dir, args.model, load=False)
    from pyro_seq.train.distributed import launch_environment

    try:  # under torchrun this process is one rank: rank 0 writes and prints
        launch = launch_environment()
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    main_rank = launch is None or launch.rank == 0
    if launch is not None:
        run["train"]["world_size"] = launch.world_size  # what the launcher ran
    out_dir.mkdir(parents=True, exist_ok=True)
    if main_rank:
        cfg_path.write_text(json.dumps(run, indent=1))
        print(
            f"training {args.model} on {args.data}: {len(data['train'])} train / "
            f"{len(data['valid'])} valid sequences, objective {config.objective} "
            f"(K={config.num_particles})"
        )
    try:
        history = fit(model, data["train"], data["valid"], config, out_dir, resume=not args.restart)
    except (ValueError, FloatingPointError) as e:  # a resume mismatch, a diverged run
        raise SystemExit(f"pyro-seq: error: {e}") from None
    if not main_rank:
        return 0
    if history:
        print(f"last epoch: {json.dumps(history[-1])}")
    if data.get("test"):
        _load_best(model, out_dir, args.model)
        energy = model.energy_based
        method = "pseudo_likelihood" if energy else "elbo"
        result = evaluate_bound(model, data["test"], method=method)
        (out_dir / "test.json").write_text(json.dumps(result, indent=1))
        label = "test pseudo-log-likelihood" if energy else "test ELBO"
        print(
            f"{label}: {result['per_step']:.4f} nats per time step "
            f"({result['num_steps']} steps, {result['num_sequences']} sequences)"
        )
        if energy:
            print(f"for the log-likelihood: pyro-seq evaluate {out_dir} --objective ais")
    return 0


def cmd_evaluate(args):
    from pyro_seq.train import evaluate_bound

    run, model, data = _load_run_and_data(args, (args.split,))
    if args.objective is None:  # the model's first evaluation method is its default
        args.objective = (model.evaluation_methods or ("elbo",))[0]
    model.require(args.objective, "method")
    particles = args.particles
    if particles is None:  # one sample for the bounds, AIS_CHAINS chains for AIS
        particles = AIS_CHAINS if args.objective == "ais" else 1
    elif args.objective == "ais" and particles < 2:
        raise SystemExit(
            f"pyro-seq: error: --particles {particles} with --objective ais: AIS "
            "needs at least 2 chains (for its standard error); leave --particles "
            f"out for {AIS_CHAINS}"
        )
    torch.manual_seed(args.seed)
    try:
        result = evaluate_bound(
            model,
            data[args.split],
            batch_size=args.batch_size,
            method=args.objective,
            num_particles=particles,
            num_betas=args.betas,
        )
    except (ValueError, FloatingPointError) as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    result["split"] = args.split
    particles = result["num_particles"]  # the samples or chains actually used
    name = f"eval_{args.split}_{args.objective}_{particles}.json"
    (Path(args.run) / name).write_text(json.dumps(result, indent=1))
    stderr = f" +- {result['stderr_per_step']:.4f}" if "stderr_per_step" in result else ""
    print(
        f"{args.split} {args.objective} (K={particles}): {result['per_step']:.4f}{stderr} "
        f"nats per time step over {result['num_steps']} steps of {result['num_sequences']} sequences"
    )
    return 0


def cmd_impute(args):
    """Bayer & Osendorfer (2014), sec. 4.3: drop ``--drop`` consecutive steps of each sequence
    (or each step with probability ``--drop-prob``), impute them."""
    from pyro_seq.tasks import bits_per_element, drop_frames, drop_steps, impute, pixel_error
    from pyro_seq.train.plots import plot_recovery, plot_video

    run, model, data = _load_run_and_data(args, ("train", args.split))
    model.require("impute")
    video = model.frame_shape is not None
    if args.method is None:  # the model's first imputation method is its default
        args.method = model.impute_methods[0]
    model.require(args.method, "impute_method")
    drop = 1 if args.drop_prob is not None else args.drop
    split = data[args.split]
    chosen = [i for i, s in enumerate(split) if s.shape[0] > drop][: args.num]
    seqs = [split[i] for i in chosen]
    if not seqs:
        what = (
            "1 step (--drop-prob keeps the first)"
            if args.drop_prob is not None
            else f"--drop {args.drop}"
        )
        raise SystemExit(f"pyro-seq: error: no {args.split} sequence is longer than {what}")
    g = torch.Generator().manual_seed(args.seed)
    x, mask, inputs = _batch(split, chosen)
    if args.drop_prob is not None:
        observed = drop_frames(mask, args.drop_prob, generator=g, keep_first=1)
    else:
        observed = drop_steps(mask, args.drop, generator=g)
    if not bool((~observed & mask).any()):  # nothing to impute: every score would be NaN
        raise SystemExit(
            f"pyro-seq: error: --drop-prob {args.drop_prob} dropped no step of the "
            f"{len(seqs)} {args.split} sequences; raise --drop-prob or --num, or "
            "change --seed"
        )
    torch.manual_seed(args.seed)
    device = _device(args.device)
    try:
        res = impute(
            model,
            x.to(device),
            observed.to(device),
            mask.to(device),
            method=args.method,
            num_iterations=args.iterations,
            num_particles=args.particles,
            generator=g,
            inputs=_on(device, inputs),
        )
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    probs = res.probs.cpu()
    missing = (~observed & mask).unsqueeze(-1).expand(x.shape)
    target, probs_missing = x[missing], probs[missing]
    freq = torch.cat(list(data["train"])).float().mean(0).expand(x.shape)[missing]
    result = {
        "split": args.split,
        "drop": args.drop,
        "drop_prob": args.drop_prob,
        "method": args.method,
        "num_sequences": len(seqs),
        "missing_elements": int(missing.sum()),
        "mean_absolute_error": float((probs_missing - target).abs().mean()),
        "baseline_mean_absolute_error": float((freq - target).abs().mean()),
        "baseline": "training-set element means",
    }
    if model.binary_observations:
        result.update(
            bits_per_element=bits_per_element(probs_missing, target),
            baseline_bits_per_element=bits_per_element(freq, target),
            pixel_error=pixel_error(probs, x, missing),
        )
    out = Path(args.run)
    (out / f"impute_{args.split}_{args.method}.json").write_text(json.dumps(result, indent=1))
    L = int(mask[0].sum())
    png = out / f"impute_{args.split}_0.png"
    if video:  # the recovered video beside the truth (missing frames decoded by the model)
        frames = [v[0, :L].reshape((L,) + tuple(model.frame_shape)) for v in (x, probs)]
        frames = torch.cat([f.mean(1) if f.dim() == 4 else f for f in frames], -1).clamp(0, 1)
        plot_video(
            frames,
            png,
            title=f"truth | {args.method} (missing steps "
            f"{(~observed[0, :L]).nonzero().flatten().tolist()})",
        )
    elif model.binary_observations:
        shown = torch.where(
            observed[0, :L, None], x[0, :L], torch.full_like(x[0, :L], float("nan"))
        )
        recovered = torch.where(observed[0, :L, None], x[0, :L], (probs[0, :L] > 0.5).float())
        plot_recovery(x[0, :L], shown, recovered, png, probs=probs[0, :L], title="imputation")
    else:
        _plot_forecast(model, x[0, :L], probs[0, :L], 0, png, "imputation (dashed) and truth")
    if model.binary_observations:
        line = (
            f"{result['bits_per_element']:.4f} bits/element (element frequencies: "
            f"{result['baseline_bits_per_element']:.4f}), pixel error "
            f"{result['pixel_error']:.4f}"
        )
    else:
        line = (
            f"mean absolute error {result['mean_absolute_error']:.4f} (training means: "
            f"{result['baseline_mean_absolute_error']:.4f})"
        )
    print(
        f"imputed {result['missing_elements']} elements of {len(seqs)} {args.split} sequences "
        f"({args.method}): {line}; figure {png}"
    )
    return 0


def cmd_denoise(args):
    """Bayer & Osendorfer (2014), sec. 4.2: flip each element with probability ``--flip`` (real
    values: add Gaussian noise ``--noise``), denoise online."""
    from pyro_seq.tasks import denoise
    from pyro_seq.train.plots import plot_recovery, plot_video

    run, model, data = _load_run_and_data(args, (args.split,))
    model.require("denoise")
    split = data[args.split]
    chosen = list(range(min(args.num, len(split))))
    seqs = [split[i] for i in chosen]
    g = torch.Generator().manual_seed(args.seed)
    x, mask, inputs = _batch(split, chosen)
    real = mask.unsqueeze(-1).expand(x.shape)
    if model.binary_observations:  # flip elements (Bayer & Osendorfer 2014, sec. 4.2)
        flips = (torch.rand(x.shape, generator=g) < args.flip) & real
        corrupted = torch.where(flips, 1 - x, x)
        noise = {"flip": args.flip}
    else:  # real values: add Gaussian noise of standard deviation --noise
        corrupted = torch.where(real, x + args.noise * torch.randn(x.shape, generator=g), x)
        noise = {"noise": args.noise}
    device = _device(args.device)
    x_hat, probs = _to_cpu(
        denoise(model, corrupted.to(device), mask.to(device), inputs=_on(device, inputs))
    )
    result = {"split": args.split, **noise, "num_sequences": len(seqs), "elements": int(real.sum())}
    if model.binary_observations:
        result.update(
            error_rate_corrupted=float((corrupted != x)[real].float().mean()),
            error_rate_denoised=float((x_hat != x)[real].float().mean()),
        )
        line = (
            f"(flip {args.flip}): error rate {result['error_rate_corrupted']:.4f} -> "
            f"{result['error_rate_denoised']:.4f}"
        )
    else:
        result.update(
            rmse_corrupted=float((corrupted - x)[real].pow(2).mean().sqrt()),
            rmse_denoised=float((x_hat - x)[real].pow(2).mean().sqrt()),
        )
        line = (
            f"(noise {args.noise}): root mean squared error {result['rmse_corrupted']:.4f} "
            f"-> {result['rmse_denoised']:.4f}"
        )
    out = Path(args.run)
    (out / f"denoise_{args.split}.json").write_text(json.dumps(result, indent=1))
    L = int(mask[0].sum())
    png = out / f"denoise_{args.split}_0.png"
    if model.frame_shape is not None:
        frames = [v[0, :L].reshape((L,) + tuple(model.frame_shape)) for v in (x, corrupted, x_hat)]
        frames = torch.cat([f.mean(1) if f.dim() == 4 else f for f in frames], -1).clamp(0, 1)
        plot_video(frames, png, title="truth | corrupted | denoised")
    elif model.binary_observations:
        plot_recovery(x[0, :L], corrupted[0, :L], x_hat[0, :L], png, title="denoising")
    else:
        _plot_forecast(model, x[0, :L], x_hat[0, :L], 0, png, "denoised (dashed) and truth")
    print(f"denoised {len(seqs)} {args.split} sequences {line}; figure {png}")
    return 0


def cmd_sample(args):
    from pyro_seq.data.midi import piano_roll_to_midi
    from pyro_seq.train.plots import plot_features, plot_piano_roll, plot_video

    run, model = _load_run(args.run, args.device)
    model.require("generate")
    torch.manual_seed(args.seed)
    kwargs = {}
    if model.input_dim:  # known inputs held at zero (e.g. no torque): say so
        kwargs["inputs"] = torch.zeros(
            args.num, args.length, model.input_dim, device=_device(args.device)
        )
        print(
            f"{run['model']} takes {model.input_dim} known inputs per step: sampling with "
            "them at zero"
        )
    x, params = _to_cpu(model.generate(args.num, args.length, **kwargs))
    out = Path(args.run)
    for i in range(args.num):
        png = out / f"sample_{i}.png"
        title = f"{run['model']} sample {i}"
        if model.frame_shape is not None:  # a video: its trajectory and frames
            frames = x[i].reshape((args.length,) + tuple(model.frame_shape))
            if frames.dim() == 4:  # (T, C, H, W): the channels' mean
                frames = frames.mean(1)
            plot_video(frames.clamp(0, 1), png, title=title)
            print(f"wrote {png}")
        elif model.binary_observations:  # a piano roll (MIDI when it has the 88 keys)
            probs = torch.sigmoid(params[i]) if torch.is_tensor(params) else None
            plot_piano_roll(x[i], png, probs=probs, title=title)
            if model.obs_dim == PIANO_KEYS:
                mid = out / f"sample_{i}.mid"
                piano_roll_to_midi(x[i], mid, step_seconds=args.step_seconds)
                print(f"wrote {png} and {mid}")
            else:
                print(f"wrote {png}")
        else:  # real-valued features over time
            plot_features(x[i], png, title=title)
            print(f"wrote {png}")
    return 0


def cmd_forecast(args):
    """Continue the first ``--prefix`` steps of each sequence for ``--steps`` steps in
    generation mode (:func:`pyro_seq.tasks.forecast`, ``--num-samples`` paths each) and score
    the true continuation: its log-likelihood under the forecast mixture (binary observations)
    and the mean absolute error of the mean forecast."""
    from pyro_seq.tasks import forecast

    run, model, data = _load_run_and_data(args, ("train", args.split), require="forecast")
    P, K = args.prefix, args.steps
    split = data[args.split]
    chosen = [i for i, s in enumerate(split) if s.shape[0] >= P + K][: args.num]
    seqs = [split[i] for i in chosen]
    if not seqs:
        longest = max((s.shape[0] for s in data[args.split]), default=0)
        raise SystemExit(
            f"pyro-seq: error: no {args.split} sequence has --prefix {P} + --steps "
            f"{K} = {P + K} steps (the longest has {longest}); lower --prefix or "
            "--steps"
        )
    x, _, inputs = _batch(split, chosen, P + K)  # (B, P + K, D)
    prefix, truth = x[:, :P], x[:, P:]  # the inputs of every step, future ones included
    binary = model.binary_observations
    device = _device(args.device)
    torch.manual_seed(args.seed)
    try:
        res = forecast(
            model,
            prefix.to(device),
            K,
            num_samples=args.num_samples,
            target=truth.to(device) if binary else None,
            inputs=_on(device, inputs),
        )
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    mean = res.means.cpu().mean(0)  # (B, K, D)
    error = (mean - truth).abs()
    last = (prefix[:, -1:] - truth).abs()  # persistence baseline
    result = {
        "split": args.split,
        "prefix": P,
        "steps": K,
        "num_samples": args.num_samples,
        "num_sequences": len(seqs),
        "mean_absolute_error": float(error.mean()),
        "mean_absolute_error_by_step": error.mean((0, 2)).tolist(),
        "baseline_mean_absolute_error": float(last.mean()),
        "baseline": "the last prefix step repeated",
    }
    line = (
        f"mean absolute error {result['mean_absolute_error']:.4f} (last prefix step: "
        f"{result['baseline_mean_absolute_error']:.4f})"
    )
    if binary:  # log (1/S) sum_s p(x_{P+k} | path_s), nats per step (summed over the features)
        log_prob = res.log_prob.cpu()  # (B, K)
        freq = torch.cat(list(data["train"])).float().mean(0).clamp(1e-6, 1 - 1e-6)
        base = (truth * freq.log() + (1 - truth) * (-freq).log1p()).sum(-1)
        result.update(
            log_likelihood_per_step=float(log_prob.mean()),
            log_likelihood_by_step=log_prob.mean(0).tolist(),
            baseline_log_likelihood_per_step=float(base.mean()),
            baseline="the last prefix step repeated (mean absolute error); training-"
            "set element frequencies (log-likelihood)",
        )
        line = (
            f"log-likelihood {result['log_likelihood_per_step']:.4f} nats per step "
            f"(element frequencies: {result['baseline_log_likelihood_per_step']:.4f}), " + line
        )
    out = Path(args.run)
    (out / f"forecast_{args.split}.json").write_text(json.dumps(result, indent=1))
    png = out / f"forecast_{args.split}_0.png"
    _plot_forecast(model, x[0], mean[0], P, png, f"{run['model']} forecast from step {P}")
    print(
        f"forecast {K} steps after {P} of {len(seqs)} {args.split} sequences "
        f"({args.num_samples} samples): {line}; figure {png}"
    )
    return 0


def _plot_forecast(model, truth, mean, P, path, title):
    """The truth ``(P + K, D)`` beside the prefix continued by the mean forecast ``(K, D)``:
    videos frame by frame, binary data as piano rolls (prefix, truth and forecast
    probabilities), real values as curves (truth solid, forecast dashed)."""
    from pyro_seq.train.plots import plot_recovery, plot_video, plt

    forecast = torch.cat([truth[:P], mean])
    if model.frame_shape is not None:
        frames = [v.reshape((v.shape[0],) + tuple(model.frame_shape)) for v in (truth, forecast)]
        frames = [f.mean(1) if f.dim() == 4 else f for f in frames]  # RGB: channel mean
        plot_video(torch.cat(frames, -1).clamp(0, 1), path, title=f"truth | forecast after {P}")
    elif model.binary_observations:
        shown = torch.cat([truth[:P], torch.full_like(mean, float("nan"))])
        plot_recovery(truth, shown, (forecast > 0.5).float(), path, probs=forecast, title=title)
    else:
        fig, ax = plt.subplots(figsize=(8, 4))
        for d in range(min(truth.shape[1], 4)):
            (line,) = ax.plot(truth[:, d].numpy(), label=f"feature {d}")
            ax.plot(range(P, truth.shape[0]), mean[:, d].numpy(), "--", color=line.get_color())
        ax.axvline(P - 0.5, color="grey", lw=0.8)
        ax.set_xlabel("time step")
        ax.set_title(f"{title} (solid: truth, dashed: mean forecast)")
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def _number(kind, low, high=None, low_open=False, high_open=False):
    """An argparse ``type=``: a finite ``kind`` (int or float) in the interval from ``low`` to
    ``high`` (open at an end when ``low_open`` / ``high_open``). argparse refuses anything else
    with the usage line and one error line naming the option and the range (exit code 2)."""
    import math

    noun = "a whole number" if kind is int else "a number"
    if high is None:
        if kind is int and not low_open:
            rng = f">= {low}"
        else:
            rng = f"{'>' if low_open else '>='} {low}"
    else:
        rng = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun} {rng}, got {text!r}") from None
        if (
            not math.isfinite(value)
            or value < low
            or (low_open and value == low)
            or (high is not None and (value > high or (high_open and value == high)))
        ):
            raise argparse.ArgumentTypeError(f"must be {noun} {rng}, got {text}")
        return value

    parse.__name__ = f"{noun} {rng}"
    return parse


POSITIVE_INT = _number(int, 1)
COUNT = _number(int, 0)
AT_LEAST_TWO = _number(int, 2)
SEED = _number(int, 0, 2**63 - 1)
POSITIVE = _number(float, 0, low_open=True)
NON_NEGATIVE = _number(float, 0)
AT_LEAST_ONE = _number(float, 1)
PROBABILITY = _number(float, 0, 1)
PROBABILITY_BELOW_ONE = _number(float, 0, 1, high_open=True)
FRACTION = _number(float, 0, 1, low_open=True, high_open=True)


def _data_help():
    """``--data``'s help, from the names :func:`pyro_seq.data.load_dataset` knows."""
    from pyro_seq.data.datasets import NAMED_PICKLES, NAVIGATION, SIMULATED

    pickles = ", ".join(f"{name} ({file})" for name, file in NAMED_PICKLES.items())
    return (
        "a data set by name or a file: chorales (music21's Bach chorales, built in; "
        "default); japanese_vowels (12 real-valued LPC coefficients per frame, from the "
        f"aeon package); a Boulanger-Lewandowski piano-roll pickle by name: {pickles}, "
        "looked up in the folders of $PYRO_SEQ_DATA, then the cache (nothing is "
        f"downloaded); simulated videos: {', '.join(SIMULATED)} (NAME:N: N training "
        "sequences; the pendulum's torques are known inputs); the GTM-SM's image "
        f"navigation: {', '.join(NAVIGATION)} (NAME:N or NAME:N:T: N training sequences of "
        "T steps; the actions are known inputs); the path of a Boulanger-Lewandowski "
        "piano-roll pickle (e.g. jsb_chorales.pickle); or the path of a .pt file written by "
        "pyro_seq.data.save_dataset (your own real or binary sequences, with or without "
        "known inputs)"
    )


#: The ``train`` flags that are no :class:`~pyro_seq.train.TrainConfig` field, and why: what
#: is trained on what, and where :func:`~pyro_seq.train.fit` writes (every other ``train``
#: flag is generated from a field by :func:`add_train_options`).
TRAIN_RUN_OPTIONS = {
    "--model": "the architecture (config.json's model), built before training",
    "--data": "the data set (config.json's data), fit's sequences",
    "--z-dim": "a model constructor option (config.json's model_options)",
    "--inference": "a model constructor option (config.json's model_options)",
    "--model-option": "model constructor options (config.json's model_options)",
    "--out": "the run folder, fit's out_dir",
    "--restart": "fit's resume=False: ignore the folder's checkpoint",
    "--ignore-inputs": "drops the data's known inputs before fit sees them",
}


def _field_help(option, default, flags, own_default):
    """The help of ``option``'s flag: its doc (field names in double backquotes become their
    flags) and its ``default``, with the reason where it is the command line's own
    (``own_default``: the field declares one and the parser uses it)."""
    import re

    text = re.sub(r"``(\w+)``", lambda m: flags.get(m.group(1), m.group(1)), option.doc)
    if option.invert:
        return f"do not {text}"
    shown = (
        ("on" if default else "off")
        if isinstance(default, bool)
        else (
            "none"
            if default is None
            else " ".join(map(str, default))
            if isinstance(default, tuple)
            else default
        )
    )
    if own_default:
        text += (
            f" (default {shown} here, {option.default} in TrainConfig: {option.cli_default_why})"
        )
    else:
        text += f" (default {shown})"
    return text.replace("%", "%%")


def add_train_options(parser, defaults=None):
    """Add a flag for every field of :class:`~pyro_seq.train.TrainConfig` to ``parser`` (an
    :class:`argparse.ArgumentParser`), under one argument group per group of
    :data:`pyro_seq.train.config.GROUPS`. Each flag's destination is the field's name, its
    type the range check its declaration names (e.g. :data:`POSITIVE_INT`), its help the
    field's doc; :func:`train_config_from_args` turns the parsed flags into the configuration.

    :param defaults: a :class:`~pyro_seq.train.TrainConfig` whose values become the flags'
        defaults (e.g. a benchmark's settings); None: the fields' defaults, with the command
        line's own where a field declares one (``cli_default``, said in the help).
    """
    from pyro_seq.train.config import GROUPS, options

    opts = [o for o in options() if o.cli_excluded is None]
    flags = {o.name: o.flag for o in opts}
    groups = {key: parser.add_argument_group(f"training: {title}") for key, title in GROUPS.items()}
    for o in opts:
        default = o.command_line_default if defaults is None else getattr(defaults, o.name)
        own = defaults is None and o.cli_default is not MISSING
        kwargs = dict(dest=o.name, default=default, help=_field_help(o, default, flags, own))
        if o.invert:
            kwargs.update(action="store_false")
        elif isinstance(o.default, bool):
            kwargs.update(action=argparse.BooleanOptionalAction)
        else:
            if o.check is not None:
                kwargs["type"] = globals()[o.check]
            metavar = o.flag[2:].upper().replace("-", "_")
            if o.choices is not None:  # shown as {a,b,...}
                kwargs["choices"] = o.choices
            elif o.nargs is not None:
                kwargs.update(
                    nargs=o.nargs, metavar=tuple(f"{metavar}{i + 1}" for i in range(o.nargs))
                )
            else:
                kwargs["metavar"] = metavar
        groups[o.group].add_argument(o.flag, **kwargs)
    return parser


def train_config_from_args(args, base=None):
    """The :class:`~pyro_seq.train.TrainConfig` of flags parsed by a parser that
    :func:`add_train_options` built: every field from its flag (a ``cli_none`` value such as
    ``--patience 0`` becomes None); fields without a flag from ``base`` (default: their
    defaults). Not validated (:meth:`~pyro_seq.train.TrainConfig.validate`)."""
    import dataclasses

    from pyro_seq.train.config import TrainConfig, options

    values = {}
    for o in options():
        if o.cli_excluded is not None:
            continue
        value = getattr(args, o.name)
        if o.cli_none is not None and value == o.cli_none:
            value = None
        elif o.nargs is not None and value is not None:
            value = tuple(value)
        values[o.name] = value
    return TrainConfig(**values) if base is None else dataclasses.replace(base, **values)


def make_parser():
    parser = argparse.ArgumentParser(
        prog="pyro-seq",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model with SVI (resumes if --out has a checkpoint)")
    p.add_argument(
        "--model",
        choices=model_names(),
        default="srnn",
        help="architecture (default srnn; what each supports: docs, API, models)",
    )
    p.add_argument("--data", default="chorales", help=_data_help())
    p.add_argument("--z-dim", type=POSITIVE_INT, default=None, help="latent size")
    p.add_argument(
        "--inference",
        choices=("smoothing", "filtering", "prior", "landmark"),
        default=None,
        help="inference network: smoothing or filtering (DMM, SRNN, VRNN; thesis Fig. "
        "4.2), prior or landmark (GTM-SM; thesis appendix 7.10)",
    )
    p.add_argument(
        "--model-option",
        action="append",
        metavar="KEY=VALUE",
        help="further model constructor option (JSON value), repeatable",
    )
    p.add_argument("--out", required=True, help="run folder")
    p.add_argument("--restart", action="store_true", help="ignore an existing checkpoint")
    p.add_argument(
        "--ignore-inputs",
        action="store_true",
        help="train without the known inputs (controls, actions) the data carry, "
        "e.g. a model that takes none on the pendulum",
    )
    add_train_options(p)  # every TrainConfig field, in its group
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="bound on the test set in nats per time step")
    p.add_argument("run", help="run folder written by train")
    p.add_argument("--data", default=None, help="data (default: the run's training data)")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument(
        "--objective",
        choices=("elbo", "iwae", "smc", "ais", "exact", "pseudo_likelihood"),
        default=None,
        help="estimator: ELBO, IWAE or SMC (FIVO) bound; for an RTRBM the "
        "log-likelihood by AIS (--particles chains, --betas temperatures; "
        "default) or exact enumeration (small models), or the pseudo-likelihood",
    )
    p.add_argument(
        "--betas", type=AT_LEAST_TWO, default=1000, help="AIS temperatures (--objective ais)"
    )
    p.add_argument(
        "--particles",
        type=POSITIVE_INT,
        default=None,
        help=f"samples K of the estimator (default 1), or AIS chains (at least 2; "
        f"default {AIS_CHAINS})",
    )
    p.add_argument("--batch-size", type=POSITIVE_INT, default=32)
    p.add_argument("--seed", type=SEED, default=0)
    _device_option(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("sample", help="generate sequences: piano-roll PNG and MIDI files")
    p.add_argument("run", help="run folder written by train")
    p.add_argument("--length", type=POSITIVE_INT, default=64, help="time steps per sample")
    p.add_argument("--num", type=POSITIVE_INT, default=1, help="number of samples")
    p.add_argument("--step-seconds", type=POSITIVE, default=0.25, help="MIDI duration of a step")
    p.add_argument("--seed", type=SEED, default=0)
    _device_option(p)
    p.set_defaults(func=cmd_sample)

    p = _task_parser(
        sub,
        "impute",
        cmd_impute,
        "drop steps of test sequences and impute them (Bayer & Osendorfer 2014, sec. 4.3)",
    )
    p.add_argument(
        "--drop", type=POSITIVE_INT, default=8, help="consecutive steps dropped per sequence"
    )
    p.add_argument(
        "--drop-prob",
        type=FRACTION,
        default=None,
        help="drop each step with this probability instead (thesis Fig. 6.3a)",
    )
    p.add_argument(
        "--method",
        default=None,
        choices=("iterative", "importance", "smoothing", "filtering", "generation"),
        help="iterative (default) or importance; smoothing (KVAE default), filtering "
        "or generation for a KVAE",
    )
    p.add_argument(
        "--iterations", type=POSITIVE_INT, default=20, help="iterations (iterative method)"
    )
    p.add_argument(
        "--particles", type=POSITIVE_INT, default=64, help="particles (importance method)"
    )

    p = _task_parser(
        sub,
        "denoise",
        cmd_denoise,
        "corrupt test sequences and denoise them online (Bayer & Osendorfer 2014, sec. 4.2)",
    )
    p.add_argument(
        "--flip",
        type=PROBABILITY,
        default=0.05,
        help="binary data: probability of flipping an element",
    )
    p.add_argument(
        "--noise",
        type=POSITIVE,
        default=0.1,
        help="real-valued data: standard deviation of the added Gaussian noise",
    )

    p = _task_parser(
        sub,
        "forecast",
        cmd_forecast,
        "continue the start of each test sequence in generation mode and score "
        "the true continuation",
    )
    p.add_argument(
        "--prefix",
        type=POSITIVE_INT,
        default=8,
        help="steps P given to the model (sequences of at least P + K steps are used)",
    )
    p.add_argument("--steps", type=POSITIVE_INT, default=8, help="steps K forecast")
    p.add_argument(
        "--num-samples", type=POSITIVE_INT, default=100, help="sampled continuations S per sequence"
    )
    return parser


def _task_parser(sub, name, func, help_text):
    """The options shared by the tasks on a trained run (impute, denoise, forecast)."""
    p = sub.add_parser(name, help=help_text)
    p.add_argument("run", help="run folder written by train")
    p.add_argument("--data", default=None, help="data set (default: the run's)")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("--num", type=POSITIVE_INT, default=1000, help="at most this many sequences")
    p.add_argument("--seed", type=SEED, default=0)
    _device_option(p)
    p.set_defaults(func=func)
    return p


def _device_option(p, default="cpu"):
    p.add_argument(
        "--device",
        default=default,
        help="where the model runs: cpu, cuda or cuda:N (an error, never a CPU "
        f"fallback, when CUDA is not there; default {default})",
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    from pyro_seq.models import Unsupported
    from pyro_seq.train import CheckpointError

    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, Unsupported) as e:  # one line: the file or the model, what to do
        raise SystemExit(f"pyro-seq: error: {e}") from None


if __name__ == "__main__":
    sys.exit(main())
