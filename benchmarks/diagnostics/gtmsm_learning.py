"""Does the GTM-SM learn states that map to positions? R^2 and ``M`` after every epoch.

The GTM-SM's long-term predictions need its states ``s_t`` to track the agent's position
(thesis 7.4.1, Fig. 7.2c): ``M`` must learn the displacement of each action (``up = -down``,
``left = -right``, ``stay = 0`` up to a linear map) and the wall network where the walls are.
This script trains :class:`pyro_seq.models.GTMSM` with :func:`pyro_seq.train.fit` (ELBO,
ClippedAdam with clipping at 50, a constant rate) on the image navigation training sequences
(thesis sizes: 1000 sequences of 256 + 32 steps, batch 16) and after every epoch (fit's
``on_epoch``) reports, on ``--valid`` validation sequences, how well the memorised state means
map to the true positions: the R^2 of a linear map with offset fitted per sequence by least
squares (mean over sequences) and of one map pooled over all sequences, ``M`` itself and how far
it moved in the epoch (next to fit's validation ELBO). ``--lr-m`` and ``--lr-walls`` give ``M``
and the wall network their own learning rates (the GTM-SM's ``displacement_lr_multiplier`` and
``wall_lr_multiplier``, as factors on ``--lr``; the thesis uses one rate, 1e-3 annealed
linearly to 5e-5 over its first 50,000 updates; this is a diagnostic). ``--preset NAME``
(``gtmsm_navigation``, ``gtmsm_navigation_thesis``) takes the model options and the
training configuration, its learning-rate schedule included, from that preset instead (typed flags
change them).

Resumable (fit's checkpoint and logs in ``benchmarks/checkpoints/gtmsm_learning_<tag>/``; the
``M_i_j`` and ``r2_pooled_i`` columns of ``log.json`` are the result's ``M`` and ``r2_pooled``),
progress with tqdm, JSON in ``benchmarks/results/gtmsm_learning_<tag>.json`` after every epoch::

    python benchmarks/diagnostics/gtmsm_learning.py --epochs 80 --lr-m 1e-2 --tag lrm1e-2
    python benchmarks/diagnostics/gtmsm_learning.py --preset gtmsm_navigation --seed 1 \
        --tag preset_seed1 --time-limit 4200   # the preset's model and training, seed 1
    python benchmarks/diagnostics/gtmsm_learning.py --smoke  # seconds: tiny sizes, to --smoke-dir
"""

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch
from common import ROOT, device_info, write_result

from pyro_seq.data.simulators.navigation import ACTION_MOVES, ACTIONS
from pyro_seq.models import GTMSM
from pyro_seq.presets import PRESETS, get_preset

#: The true displacements in grid units, columns up, down, left, right, stay on (row, column).
TRUE_M = torch.from_numpy(ACTION_MOVES).T.float()

#: The log columns of ``M``'s entries, ``M_<row>_<column>``.
ENTRY = re.compile(r"M_(\d+)_(\d+)")


#: The presets of the GTM-SM that ``--preset`` can take its settings from.
GTMSM_PRESETS = tuple(name for name, preset in PRESETS.items() if preset.model == "gtmsm")


def preset_defaults(name):
    """The flag defaults that give the settings of preset ``name``: its model options
    (``displacements``, ``neighbour_warmup`` as ``--neighbours-start``/``--neighbours-epochs``,
    the rate factors as ``--lr-m``/``--lr-walls`` on its rate) and its training's epochs, batch
    size, rate and seed. Rates are resolved after parsing, as factors on the (typed) ``--lr``."""
    preset = get_preset(name)
    options, train = preset.model_options, preset.train
    warmup = options.get("neighbour_warmup", "all")
    return {
        "displacements": options.get("displacements", "inverse_pairs"),
        "neighbours_start": None if warmup is None else (warmup[0] if warmup != "all" else -1),
        "neighbours_epochs": 20 if warmup in (None, "all") else warmup[1],
        "epochs": train["epochs"],
        "batch_size": train["batch_size"],
        "lr": train["lr"],
        "seed": train.get("seed", 0),
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--preset",
        default=None,
        choices=GTMSM_PRESETS,
        help="take the model options and training configuration (its schedule included) "
        "from this preset; typed flags change them",
    )
    p.add_argument("--train", type=int, default=1000)
    p.add_argument("--valid", type=int, default=20)
    p.add_argument("--tau", type=int, default=256)
    p.add_argument("--pred", type=int, default=32)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-m", type=float, default=None, help="learning rate of M (default --lr)")
    p.add_argument(
        "--lr-walls",
        type=float,
        default=None,
        help="learning rate of the wall network (default --lr)",
    )
    p.add_argument(
        "--init-displacement-std",
        type=float,
        default=0.5,
        help="std of M's initial entries (the model's default 0.5)",
    )
    p.add_argument(
        "--blocked-as-stay",
        action="store_true",
        help="diagnostic: record every move that a wall blocked as 'stay', so that "
        "the data hold no wall effect and s_t = s_{t-1} + M a_t is exact",
    )
    p.add_argument(
        "--no-walls",
        action="store_true",
        help="the linear transition (GTMSM(walls=False)), no wall network",
    )
    p.add_argument(
        "--delta-start",
        type=float,
        default=None,
        help="curriculum on the mixture kernel: delta of w_k ~ 1 / (d_k^2 + delta) "
        "starts here and falls geometrically to the model's 1e-4 over "
        "--delta-epochs epochs (a wide kernel mixes the K neighbours' frames, so "
        "that states of nearby positions must be near)",
    )
    p.add_argument("--delta-epochs", type=int, default=10)
    p.add_argument(
        "--neighbours-start",
        type=int,
        default=None,
        help="curriculum on K, the memory entries of the mixture prior "
        "(GTMSM(neighbour_warmup=(start, epochs))): K starts here (e.g. --tau: "
        "every entry, so that matching frames far away in state space still pull "
        "their states together) and falls geometrically to the model's 5 over "
        "--neighbours-epochs epochs",
    )
    p.add_argument("--neighbours-epochs", type=int, default=10)
    p.add_argument(
        "--repeat-rate",
        type=float,
        default=None,
        help="mean extra repetitions of an action in the data (the simulator's 3.0; "
        "fewer repetitions push into the walls less often)",
    )
    p.add_argument(
        "--init-inverse-pairs",
        action="store_true",
        help="diagnostic: start M as [u, -u, l, -l, 0] with u, l random orthogonal of "
        "length --init-displacement-std (is a 2-D start kept?)",
    )
    p.add_argument(
        "--init-true-m",
        action="store_true",
        help="diagnostic: start M at the true displacements in grid units (with "
        "--lr-m 0 it stays there: can the wall network learn the walls?)",
    )
    p.add_argument(
        "--displacements",
        default="free",
        choices=("free", "conformal", "inverse_pairs"),
        help="GTMSM(displacements=...): 'conformal', M = alpha Q^T with orthonormal "
        "rows, so the state axes cannot collapse onto one line; "
        "'inverse_pairs', down = -up and right = -left",
    )
    p.add_argument(
        "--conformal",
        action="store_const",
        const="conformal",
        dest="displacements",
        help="the same as --displacements conformal",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (named in the JSON)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="stop after the epoch that passes this many seconds of this call",
    )
    p.add_argument("--tag", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, results to --smoke-dir")
    p.add_argument("--smoke-dir", default="/tmp/gtmsm_learning_smoke", help="where --smoke writes")
    preset = p.parse_known_args(argv)[0].preset
    if preset is not None:
        p.set_defaults(**preset_defaults(preset))
    args = p.parse_args(argv)
    if preset is not None:  # the preset's rate factors on --lr, unless typed
        options = get_preset(preset).model_options
        factors = (
            ("lr_m", "displacement_lr_multiplier", 1.0),
            ("lr_walls", "wall_lr_multiplier", 10.0),
        )
        for flag, option, default in factors:  # the defaults: the GTM-SM's
            if getattr(args, flag) is None:
                setattr(args, flag, args.lr * options.get(option, default))
    if args.smoke:
        args.train, args.valid, args.tau, args.pred, args.epochs, args.batch_size = (
            8,
            3,
            12,
            4,
            2,
            4,
        )
    if args.neighbours_start == -1 or (args.smoke and args.neighbours_start):
        args.neighbours_start = args.tau  # the preset's "all" (or a smoke run's whole memory)
    args.lr_m = args.lr if args.lr_m is None else args.lr_m
    walls_lr = "" if args.lr_walls is None else f"_lrw{args.lr_walls:g}"
    args.lr_walls = args.lr if args.lr_walls is None else args.lr_walls
    init = "" if args.init_displacement_std == 0.5 else f"_init{args.init_displacement_std:g}"
    init += ("_nohits" if args.blocked_as_stay else "") + ("_nowalls" if args.no_walls else "")
    init += "" if args.delta_start is None else f"_delta{args.delta_start:g}x{args.delta_epochs}"
    init += "_pairs" if args.init_inverse_pairs else ""
    init += "_truem" if args.init_true_m else ""
    init += (
        ""
        if args.neighbours_start is None
        else f"_k{args.neighbours_start}x{args.neighbours_epochs}"
    )
    init += "" if args.repeat_rate is None else f"_repeat{args.repeat_rate:g}"
    init += "" if args.displacements == "free" else f"_{args.displacements}"
    tag = f"{args.preset}_seed{args.seed}" if args.preset else f"lrm{args.lr_m:g}{walls_lr}{init}"
    args.tag = args.tag or ("smoke" if args.smoke else tag)
    return args


def blocked_as_stay(videos):
    """The actions of ``videos`` with every move that a wall blocked replaced by "stay" (4).

    Sequences start at the centre cell and ``positions[:, t]`` is the position after
    ``actions[:, t]`` (:mod:`pyro_seq.data.simulators.navigation`), so a move was blocked where
    the position did not change. The result makes the transition exactly linear, ``p_t =
    p_{t-1} + D a_t`` with ``D`` the true displacements: a diagnostic that removes the walls'
    effect from the data without changing frames or positions.
    """
    params = videos.params
    if params.start != "centre" or params.obstacles:
        raise ValueError("blocked_as_stay needs sequences that start at the centre, no obstacles")
    pos = videos.positions
    centre = torch.full_like(pos[:, :1], (params.grid_size - 1) // 2)
    previous = torch.cat([centre, pos[:, :-1]], 1)
    stay = len(ACTIONS) - 1
    blocked = (pos == previous).all(-1) & (videos.actions != stay)
    return torch.where(blocked, torch.full_like(videos.actions, stay), videos.actions)


def inverse_pairs(length, generator):
    """``M = [u, -u, l, -l, 0]`` (columns up, down, left, right, stay) with ``u`` and ``l``
    orthogonal of norm ``length`` in a random orientation: a 2-D start in which inverse actions
    are opposite, whatever the true axes."""
    q, _ = torch.linalg.qr(torch.randn(2, 2, generator=generator))
    u, l = length * q[:, 0], length * q[:, 1]
    return torch.stack([u, -u, l, -l, torch.zeros(2)], 1)


def delta_at(epoch, start, epochs, final):
    """The kernel's ``delta`` in ``epoch`` (0-based) of the curriculum: ``start`` at epoch 0,
    geometric to ``final`` at ``epochs`` and after (``start=None``: ``final`` throughout)."""
    from pyro_seq.models.gtmsm import warmup_value

    return warmup_value(epoch, start, epochs, final)


def state_r2(model, frames, actions, positions, tau):
    """R^2 of linear maps (with offset) from memorised state means to true positions:
    ``(per-sequence fit, mean over sequences; one pooled fit, per coordinate)``."""
    with torch.no_grad():
        _, means = model.write_memory(frames[:, :tau], model.one_hot(actions[:, :tau]))
    means = means.cpu()
    pos = positions[:, :tau].to(means.dtype)
    ones = torch.ones(means.shape[:-1] + (1,), dtype=means.dtype)
    X = torch.cat([means, ones], -1)
    per = []
    for n in range(X.shape[0]):
        w = torch.linalg.lstsq(X[n], pos[n]).solution
        resid = (pos[n] - X[n] @ w).pow(2).sum()
        per.append(float(1 - resid / (pos[n] - pos[n].mean(0)).pow(2).sum().clamp_min(1e-12)))
    Xf, Yf = X.reshape(-1, X.shape[-1]), pos.reshape(-1, 2)
    w = torch.linalg.lstsq(Xf, Yf).solution
    pooled = 1 - (Yf - Xf @ w).pow(2).sum(0) / (Yf - Yf.mean(0)).pow(2).sum(0)
    return sum(per) / len(per), pooled.tolist()


class CurriculumGTMSM(GTMSM):
    """:class:`~pyro_seq.models.GTMSM` whose kernel ``delta`` follows :func:`delta_at` in
    training: :func:`~pyro_seq.train.fit` calls :meth:`training_epoch` before every epoch
    (resumed ones too), which sets ``delta`` from ``delta_start`` (None: the model's ``delta``
    throughout) geometrically down to the model's ``delta`` over ``delta_epochs`` epochs."""

    def __init__(self, delta_start=None, delta_epochs=10, **kwargs):
        super().__init__(**kwargs)
        self.final_delta = self.delta
        self.delta_start, self.delta_epochs = delta_start, delta_epochs

    def training_epoch(self, epoch):
        super().training_epoch(epoch)  # K of the neighbour warm-up
        self.delta = delta_at(epoch, self.delta_start, self.delta_epochs, self.final_delta)


def measure_epochs(model, valid, x, a, args, earlier, steps_per_sequence):
    """The ``on_epoch`` hook of :func:`~pyro_seq.train.fit`: after every epoch, the R^2 of
    :func:`state_r2` on the validation sequences (frames ``x``, actions ``a`` on the model's
    device), ``M`` (entries ``M_i_j``) and how much it moved in the epoch (``M_change``,
    Frobenius norm), the curriculum's ``delta`` and ``K``, the loss per sequence and the wall
    seconds since the run began (over resumed calls). ``earlier``: the rows of the calls
    before (the checkpoint's history); after every epoch the result JSON is rewritten."""
    rows = [dict(row) for row in earlier]
    previous = matrix_of(rows[-1]) if rows else model.displacement_matrix().detach().cpu().clone()
    offset, call_start = (rows[-1]["seconds_wall"] if rows else 0.0), time.time()

    def on_epoch(epoch, model, row):
        nonlocal previous
        per_seq, pooled = state_r2(model, x, a, valid.positions, args.tau)
        M = model.displacement_matrix().detach().cpu().clone()
        values = {
            "loss_per_sequence": row["train_loss_per_step"] * steps_per_sequence,
            "r2_per_sequence": per_seq,
            "M_change": float((M - previous).norm()),
            "delta": model.delta,
            "num_neighbours": model.neighbours_now(),
            "seconds_wall": offset + time.time() - call_start,
        }
        values.update({f"r2_pooled_{i}": float(v) for i, v in enumerate(pooled)})
        values.update({f"M_{i}_{j}": float(v) for (i, j), v in matrix_entries(M)})
        previous = M
        rows.append(dict(row, **values))
        if not args.smoke:
            write_result(f"gtmsm_learning_{args.tag}", result(args, rows, model))
        return values

    return on_epoch


def matrix_entries(M):
    """``((i, j), M[i, j])`` for every entry of a 2-D tensor."""
    return (((i, j), M[i, j].item()) for i in range(M.shape[0]) for j in range(M.shape[1]))


def matrix_of(row):
    """``M`` from the entries ``M_i_j`` of a log row."""
    index = [tuple(map(int, m.groups())) for m in map(ENTRY.fullmatch, row) if m]
    rows, cols = (1 + max(ij[k] for ij in index) for k in (0, 1))
    return torch.tensor([[row[f"M_{i}_{j}"] for j in range(cols)] for i in range(rows)])


def epoch_record(row):
    """One entry of the result's ``"epochs"``, from a log row of :func:`~pyro_seq.train.fit`
    with the values of :func:`measure_epochs`: ``M`` and ``r2_pooled`` as lists again."""
    pooled = sorted(k for k in row if k.startswith("r2_pooled_"))
    return {
        "epoch": row["epoch"],
        "updates": row["step"],
        "loss_per_sequence": row["loss_per_sequence"],
        "r2_per_sequence": row["r2_per_sequence"],
        "r2_pooled": [row[k] for k in pooled],
        "M": matrix_of(row).tolist(),
        "M_change": row["M_change"],
        "delta": row["delta"],
        "num_neighbours": row["num_neighbours"],
        "valid_elbo_per_step": row.get("valid_elbo_per_step"),
        "seconds": row["seconds_wall"],
        "seconds_training_epoch": row["seconds"],
    }


def result(args, rows, model, oracle=None):
    """The result JSON: settings, the epochs' records, the oracle check (after training)."""
    payload = {"settings": vars(args), "epochs": [epoch_record(row) for row in rows]}
    if oracle is not None:
        payload["oracle_check"] = oracle
    return dict(payload, device_info=device_info(next(model.parameters()).device))


def train_config(args):
    """The :class:`~pyro_seq.train.TrainConfig`: with ``--preset``, the preset's (its learning-rate
    schedule included) with ``--epochs``, ``--batch-size``, ``--lr`` and ``--seed``; else
    ClippedAdam at a constant ``--lr``, clipping at 50 (the diagnostic's own). Both stop at
    ``--time-limit`` seconds of wall time and use one thread."""
    from pyro_seq.train import TrainConfig

    run = dict(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        time_limit=args.time_limit,
        time_limit_counts="wall",
        seed=args.seed,
        device=args.device,
        num_threads=1,
        progress=not args.smoke,
    )
    if args.preset is not None:
        return get_preset(args.preset).train_config(**run)
    return TrainConfig(
        clip_norm=50.0,
        lr_schedule="constant",  # the thesis' annealing is not part of this diagnostic
        patience=None,
        init="none",
        **run,
    )


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    from pyro_seq.data.simulators import image_navigation
    from pyro_seq.train import fit, load_checkpoint
    from pyro_seq.validation import parse_device

    device = parse_device(args.device, "--device")
    if args.lr <= 0:
        raise SystemExit(f"--lr must be positive, got {args.lr}")
    sim = dict(cache=not args.smoke, progress=False, seed=args.seed)
    if args.repeat_rate is not None:
        sim["repeat_rate"] = args.repeat_rate
    train = image_navigation(args.train, args.tau + args.pred, split="train", **sim)
    valid = image_navigation(args.valid, args.tau + args.pred, split="valid", **sim)
    if args.blocked_as_stay:  # the same frames and positions, blocked moves as "stay"
        train = dataclasses.replace(train, actions=blocked_as_stay(train))
        valid = dataclasses.replace(valid, actions=blocked_as_stay(valid))
    vx, va = valid.frames.flatten(2).to(device), valid.actions.to(device)
    torch.manual_seed(args.seed)  # the initial weights
    small = dict(hidden_dims=(16,), z_dim=4, wall_hidden=4) if args.smoke else {}
    warmup = (
        None if args.neighbours_start is None else (args.neighbours_start, args.neighbours_epochs)
    )
    model = CurriculumGTMSM(
        delta_start=args.delta_start,
        delta_epochs=args.delta_epochs,
        tau=args.tau,
        init_displacement_std=args.init_displacement_std,
        walls=not args.no_walls,
        neighbour_warmup=warmup,
        displacements=args.displacements,
        # --lr-m and --lr-walls as factors on --lr (fit's per-parameter rates)
        displacement_lr_multiplier=args.lr_m / args.lr,
        wall_lr_multiplier=args.lr_walls / args.lr,
        **small,
    )
    if args.init_inverse_pairs:  # a resumed run then loads its own M
        model.set_displacement_matrix(
            inverse_pairs(args.init_displacement_std, torch.Generator().manual_seed(args.seed))
        )
    if args.init_true_m:
        model.set_displacement_matrix(TRUE_M)
    folder = (
        Path(args.smoke_dir)
        if args.smoke
        else ROOT / "benchmarks" / "checkpoints" / f"gtmsm_learning_{args.tag}"
    )
    path = folder / "checkpoint.pt"
    earlier = load_checkpoint(path)["history"] if path.exists() else []
    config = train_config(args)
    steps = args.tau + args.pred
    hook = measure_epochs(model, valid, vx, va, args, earlier, steps)
    history = fit(model, train.as_sequences(), valid.as_sequences(), config, folder, on_epoch=hook)
    # the oracle check on the last epoch's weights (fit returns the best validation epoch's)
    model.load_state_dict(load_checkpoint(path)["model"])
    model.delta = model.final_delta  # the oracle check uses the model's delta
    model.eval()  # and its K
    oracle = oracle_check(model, valid, args, vx, va) if history else None
    smoke_path = folder / "gtmsm_learning_smoke.json" if args.smoke else None
    write_result(
        f"gtmsm_learning_{args.tag}", result(args, history, model, oracle), path=smoke_path
    )
    return [epoch_record(row) for row in history]


def oracle_check(model, valid, args, x, a, repeats=3):
    """Is the true structure better under the objective? The validation ELBO (nats per
    sequence, mean of ``repeats`` single-sample estimates with the same seeds) of the trained
    model, and of the same model with ``M`` set to the true displacements in grid units and the
    wall network set by hand to block moves beyond the 9 x 9 grid (states = position - centre,
    sequences start at the centre cell). A higher oracle ELBO means the objective prefers the
    true states, so failing to find them is a matter of optimisation. ``x``, ``a``: the
    validation frames and actions on the model's device."""
    import pyro
    from pyro.infer import Trace_ELBO

    def elbo():
        pyro.set_rng_seed(args.seed)
        with torch.no_grad():
            return (
                -sum(
                    Trace_ELBO().loss(model.model, model.guide, x, None, inputs=a)
                    for _ in range(repeats)
                )
                / repeats
                / x.shape[0]
            )

    saved = {k: v.clone() for k, v in model.state_dict().items()}
    learnt = elbo()
    half = (valid.params.grid_size - 1) / 2 + 0.5  # beyond the last cell's centre
    with torch.no_grad():
        model.set_displacement_matrix(TRUE_M)
        if model.wall_net is not None:
            first, last = model.wall_net[0], model.wall_net[-1]
            first.weight.zero_(), first.bias.zero_(), last.weight.zero_()
            for k, (i, sign) in enumerate(((0, 1.0), (0, -1.0), (1, 1.0), (1, -1.0))):
                first.weight[k, i], first.bias[k] = sign, -half  # relu(|s_i| - half) per side
            last.weight[0, :4], last.bias[0] = -100.0, 10.0  # sigmoid: ~1 inside, ~0 beyond
    oracle = elbo()
    model.load_state_dict(saved)
    return {
        "valid_elbo_learnt": learnt,
        "valid_elbo_oracle_M_and_walls": oracle,
        "valid_sequences": x.shape[0],
        "repeats": repeats,
    }


if __name__ == "__main__":
    main()
