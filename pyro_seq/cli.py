"""Command line: ``pyro-seq train | presets | evaluate | sample | impute | denoise | forecast``.

Examples::

    pyro-seq presets                             # the paper presets, published and measured
    pyro-seq train --preset srnn_jsb2x --data jsb_chorales_2x.pickle --out runs/srnn2x

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

This module holds the parser, ``train`` and ``evaluate``; the tasks on a trained run are in
:mod:`pyro_seq.cli_tasks`, run folders and data loading in :mod:`pyro_seq.cli_runs`, the
argument types in :mod:`pyro_seq.cli_types` (their public names are importable from here too).
"""

import argparse
import json
import sys
from dataclasses import MISSING, asdict
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import torch

import pyro_seq.cli_types as argument_types
from pyro_seq.cli_runs import AIS_CHAINS as AIS_CHAINS
from pyro_seq.cli_runs import PIANO_KEYS as PIANO_KEYS
from pyro_seq.cli_runs import RUN_KEYS as RUN_KEYS
from pyro_seq.cli_runs import build_model as build_model
from pyro_seq.cli_runs import check_data as _check_data
from pyro_seq.cli_runs import device_option as _device
from pyro_seq.cli_runs import input_dim_of as _input_dim
from pyro_seq.cli_runs import load_best as _load_best
from pyro_seq.cli_runs import load_data as _load_data
from pyro_seq.cli_runs import load_run as load_run
from pyro_seq.cli_runs import load_run_and_data as _load_run_and_data
from pyro_seq.cli_runs import model_names as model_names
from pyro_seq.cli_runs import parse_options as _parse_options
from pyro_seq.cli_runs import read_config as _read_config
from pyro_seq.cli_tasks import cmd_denoise, cmd_forecast, cmd_impute, cmd_sample
from pyro_seq.cli_types import AT_LEAST_ONE as AT_LEAST_ONE
from pyro_seq.cli_types import AT_LEAST_TWO as AT_LEAST_TWO
from pyro_seq.cli_types import COUNT as COUNT
from pyro_seq.cli_types import FRACTION as FRACTION
from pyro_seq.cli_types import NON_NEGATIVE as NON_NEGATIVE
from pyro_seq.cli_types import POSITIVE as POSITIVE
from pyro_seq.cli_types import POSITIVE_INT as POSITIVE_INT
from pyro_seq.cli_types import PROBABILITY as PROBABILITY
from pyro_seq.cli_types import PROBABILITY_BELOW_ONE as PROBABILITY_BELOW_ONE
from pyro_seq.cli_types import SEED as SEED

#: ``evaluate --objective``: the bounds of sequence models and the energy-based models'
#: estimators (``pyro_seq.train.evaluate.ENERGY_METHODS``, not imported here so that the
#: command line starts without Pyro; a test checks the two agree)
EVALUATE_OBJECTIVES = (
    "elbo",
    "iwae",
    "smc",
    "exact",
    "ais",
    "reverse_ais",
    "raise",
    "pseudo_likelihood",
)
#: the annealed estimators, which run ``--particles`` chains (default ``AIS_CHAINS``)
ANNEALED = ("ais", "reverse_ais", "raise")

if TYPE_CHECKING:  # the training package is imported when a command needs it
    from pyro_seq.train.config import TrainConfig

#: The former name of :func:`~pyro_seq.cli_runs.load_run` (scripts and tests import it).
_load_run = load_run


def cmd_train(args: argparse.Namespace) -> int:
    from pyro_seq.train import evaluate_bound, fit

    out_dir = Path(args.out)
    _device(args.device)  # before the data are read
    preset = _preset_settings(args) if args.preset is not None else None  # sets model, data
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
    if preset is not None:  # the preset's values, and the flags the user typed over them
        options = {**preset["model_options"], **options}
        given = {k: getattr(config, k) for k in args.given_options if hasattr(config, k)}
        config = preset["preset"].train_config(**given)
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
    if preset is not None:
        run["preset"] = args.preset
        run["overrides"] = _overrides(args, run)
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
            ("" if preset is None else f"preset {args.preset}: ")
            + f"training {args.model} on {args.data}: {len(data['train'])} train / "
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


#: ``train`` destinations that a preset run does not record as overrides: where it writes.
_NOT_OVERRIDES = ("out", "restart", "preset")


def _preset_settings(args: argparse.Namespace) -> dict:
    """Apply ``--preset``: its model (unless ``--model`` was typed; another model drops the
    preset's model options) and its data (unless ``--data`` was typed; a data file it
    cannot find is one line naming the file). Returns the preset and its model options."""
    from pyro_seq.presets import get_preset

    try:
        preset = get_preset(args.preset)
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    if "model" not in args.given_options:
        args.model = preset.model
    if "data" not in args.given_options:
        try:
            args.data = preset.data_spec()
        except FileNotFoundError as e:
            raise SystemExit(f"pyro-seq: error: {e}") from None
    same_model = args.model == preset.model
    return {"preset": preset, "model_options": dict(preset.model_options) if same_model else {}}


def _overrides(args: argparse.Namespace, run: dict) -> dict:
    """The flags the user typed over a preset, by destination, with the values the run uses
    (``config.json``'s ``overrides``)."""
    out = {}
    for dest in sorted(args.given_options):
        if dest in _NOT_OVERRIDES:
            continue
        value = run["train"].get(dest, getattr(args, dest, None))
        out[dest] = list(value) if isinstance(value, tuple) else value
    return out


def given_train_options(argv: Sequence[str]) -> set:
    """The destinations of the ``train`` flags typed in ``argv`` (the command line after
    ``pyro-seq``), whatever their values: a flag typed with its default value counts, a
    default does not. Parsed again with every default suppressed."""
    argv = list(argv)
    parser = argparse.ArgumentParser(prog="pyro-seq train", add_help=False)
    _add_train_arguments(parser)
    for action in parser._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    start = argv.index("train") + 1 if "train" in argv else 0
    known, _ = parser.parse_known_args(argv[start:])
    return set(vars(known))


def cmd_presets(args: argparse.Namespace) -> int:
    """List the presets: a table, or with ``--json`` a JSON list of objects with the keys
    name, model, data, metric, published, measured and source (measured read now)."""
    from pyro_seq.presets import PRESETS

    rows = [preset.summary() for preset in PRESETS.values()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0

    def cell(key: str, value: object) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):  # published as printed, measured to 4 digits
            return f"{value:.4g}" if key == "measured" else f"{value:g}"
        return str(value)

    keys = ("name", "model", "data", "metric", "published", "measured", "source")
    table = [list(keys)] + [[cell(k, row[k]) for k in keys] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(keys))]
    for line in table:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())
    print(
        "\nmeasured: this package's number from benchmarks/results/ ('-': not measured with "
        "these settings); train one with pyro-seq train --preset NAME --out DIR [--data PATH]"
    )
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from pyro_seq.train import evaluate_bound

    run, model, data = _load_run_and_data(args, (args.split,))
    if args.objective is None:  # the model's first evaluation method is its default
        args.objective = (model.evaluation_methods or ("elbo",))[0]
    model.require(args.objective, "method")
    particles = args.particles
    if particles is None:  # one sample for the bounds, AIS_CHAINS chains for AIS
        particles = AIS_CHAINS if args.objective in ANNEALED else 1
    elif args.objective in ANNEALED and particles < 2:
        raise SystemExit(
            f"pyro-seq: error: --particles {particles} with --objective {args.objective}: AIS "
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
            progress=True,
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


def _data_help() -> str:
    """``--data``'s help, from the names :func:`pyro_seq.data.load_dataset` knows."""
    from pyro_seq.data.datasets import NAMED_PICKLES, NAVIGATION, SIMULATED
    from pyro_seq.data.files import describe_data_formats

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
        "piano-roll pickle (e.g. jsb_chorales.pickle); or " + describe_data_formats()
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
    "--preset": "a paper preset (pyro_seq.presets): model, options, settings and data",
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


def add_train_options(
    parser: argparse.ArgumentParser, defaults: Optional["TrainConfig"] = None
) -> argparse.ArgumentParser:
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
                kwargs["type"] = getattr(argument_types, o.check)
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


def train_config_from_args(
    args: argparse.Namespace, base: Optional["TrainConfig"] = None
) -> "TrainConfig":
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


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyro-seq",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model with SVI (resumes if --out has a checkpoint)")
    _add_train_arguments(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("presets", help="list the paper presets: published and measured numbers")
    p.add_argument(
        "--json",
        action="store_true",
        help="a JSON list, one object per preset (name, model, data, metric, published, "
        "measured, source)",
    )
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("evaluate", help="bound on the test set in nats per time step")
    p.add_argument("run", help="run folder written by train")
    p.add_argument("--data", default=None, help="data (default: the run's training data)")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument(
        "--objective",
        choices=EVALUATE_OBJECTIVES,
        default=None,
        help="estimator: ELBO, IWAE or SMC (FIVO) bound; for an RTRBM the "
        "log-likelihood by AIS (--particles chains, --betas temperatures; "
        "default; a stochastic upper bound), by reverse AIS from the model's draws "
        "(reverse_ais, a lower bound with exact draws) or from the data (raise, a lower "
        "bound on the annealing model), or exact enumeration (small models), or the "
        "pseudo-likelihood",
    )
    p.add_argument(
        "--betas",
        type=AT_LEAST_TWO,
        default=1000,
        help="AIS temperatures (ais, reverse_ais, raise)",
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


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    """The ``train`` flags: what is trained on what (:data:`TRAIN_RUN_OPTIONS`), ``--preset``
    and every :class:`~pyro_seq.train.TrainConfig` field (:func:`add_train_options`)."""
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
    p.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="a paper preset (pyro-seq presets lists them): its model, model options, "
        "training settings and data; the flags typed here override its values (another "
        "--model drops its model options)",
    )
    add_train_options(p)  # every TrainConfig field, in its group


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


def _device_option(p: argparse.ArgumentParser, default: str = "cpu") -> None:
    p.add_argument(
        "--device",
        default=default,
        help="where the model runs: cpu, cuda or cuda:N (an error, never a CPU "
        f"fallback, when CUDA is not there; default {default})",
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    from pyro_seq.models import Unsupported
    from pyro_seq.train import CheckpointError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    if args.command == "train":
        args.given_options = given_train_options(argv)
    try:
        return args.func(args)
    except (CheckpointError, Unsupported) as e:  # one line: the file or the model, what to do
        raise SystemExit(f"pyro-seq: error: {e}") from None


if __name__ == "__main__":
    sys.exit(main())
