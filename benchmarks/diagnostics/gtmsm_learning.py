"""Does the GTM-SM learn states that map to positions? R^2 and ``M`` after every epoch.

The GTM-SM's long-term predictions need its states ``s_t`` to track the agent's position
(thesis 7.4.1, Fig. 7.2c): ``M`` must learn the displacement of each action (``up = -down``,
``left = -right``, ``stay = 0`` up to a linear map) and the wall network where the walls are.
This script trains :class:`pyro_seq.models.GTMSM` with ``SVI`` and ``Trace_ELBO`` on the image
navigation training sequences (thesis sizes: 1000 sequences of 256 + 32 steps, batch 16,
ClippedAdam with clipping at 50) and after every epoch reports, on ``--valid`` validation
sequences, how well the memorised state means map to the true positions: the R^2 of a linear
map with offset fitted per sequence by least squares (mean over sequences) and of one map
pooled over all sequences, and ``M`` itself. ``--lr-m`` gives ``M`` its own learning rate (the
thesis uses one rate, 1e-3 annealed linearly to 5e-5 over its first 50,000 updates; this is a
diagnostic).

Resumable (model and optimizer state in ``benchmarks/checkpoints/gtmsm_learning_<tag>/``),
progress with tqdm, JSON in ``benchmarks/results/gtmsm_learning_<tag>.json`` after every epoch::

    python benchmarks/diagnostics/gtmsm_learning.py --epochs 80 --lr-m 1e-2 --tag lrm1e-2
    python benchmarks/diagnostics/gtmsm_learning.py --smoke  # seconds: tiny sizes, nothing recorded
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch
from common import ROOT, device_info, write_result

from pyro_seq.data.simulators.navigation import ACTION_MOVES, ACTIONS

#: The true displacements in grid units, columns up, down, left, right, stay on (row, column).
TRUE_M = torch.from_numpy(ACTION_MOVES).T.float()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    args = p.parse_args(argv)
    if args.smoke:
        args.train, args.valid, args.tau, args.pred, args.epochs, args.batch_size = (
            8,
            3,
            12,
            4,
            2,
            4,
        )
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
    args.tag = args.tag or ("smoke" if args.smoke else f"lrm{args.lr_m:g}{walls_lr}{init}")
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


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    import pyro
    from pyro.infer import SVI, Trace_ELBO
    from pyro.optim import ClippedAdam
    from tqdm.auto import tqdm

    from pyro_seq.data.simulators import image_navigation
    from pyro_seq.models import GTMSM
    from pyro_seq.validation import parse_device

    device = parse_device(args.device, "--device")
    sim = dict(cache=not args.smoke, progress=False, seed=args.seed)
    if args.repeat_rate is not None:
        sim["repeat_rate"] = args.repeat_rate
    train = image_navigation(args.train, args.tau + args.pred, split="train", **sim)
    valid = image_navigation(args.valid, args.tau + args.pred, split="valid", **sim)
    train_actions, valid_actions = train.actions, valid.actions
    if args.blocked_as_stay:
        train_actions, valid_actions = blocked_as_stay(train), blocked_as_stay(valid)
    x, a = train.frames.flatten(2).to(device), train_actions.to(device)
    vx, va = valid.frames.flatten(2).to(device), valid_actions.to(device)
    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    small = dict(hidden_dims=(16,), z_dim=4, wall_hidden=4) if args.smoke else {}
    warmup = (
        None if args.neighbours_start is None else (args.neighbours_start, args.neighbours_epochs)
    )
    model = GTMSM(
        tau=args.tau,
        init_displacement_std=args.init_displacement_std,
        walls=not args.no_walls,
        neighbour_warmup=warmup,
        displacements=args.displacements,
        **small,
    ).to(device)
    if args.init_inverse_pairs:  # a resumed run then loads its own M
        model.set_displacement_matrix(
            inverse_pairs(args.init_displacement_std, torch.Generator().manual_seed(args.seed))
        )
    if args.init_true_m:
        model.set_displacement_matrix(TRUE_M)

    def rate(name):
        if name in model.displacement_params:
            return args.lr_m
        return args.lr_walls if name.startswith("wall_net.") else args.lr

    optim = ClippedAdam(lambda module, name: {"lr": rate(name), "clip_norm": 50.0})
    svi = SVI(model.model, model.guide, optim, Trace_ELBO())
    folder = (
        Path(args.smoke_dir)
        if args.smoke
        else ROOT / "benchmarks" / "checkpoints" / f"gtmsm_learning_{args.tag}"
    )
    folder.mkdir(parents=True, exist_ok=True)
    path, log, start = folder / "checkpoint.pt", [], 0
    if path.exists():
        saved = torch.load(path, weights_only=True, map_location=device)
        model.load_state_dict(saved["model"])
        optim.set_state(saved["optim"])  # consumed when each parameter is first stepped
        start, log = int(saved["epoch"]), json.loads((folder / "log.json").read_text())
    order_gen = torch.Generator().manual_seed(args.seed)
    for _ in range(start):  # the same shuffles as an uninterrupted run
        torch.randperm(args.train, generator=order_gen)
    t0 = time.time() - (log[-1]["seconds"] if log else 0.0)
    call_start = time.time()
    bar = tqdm(
        range(start, args.epochs),
        initial=start,
        total=args.epochs,
        desc="GTM-SM epochs",
        disable=args.smoke,
    )
    final_delta = model.delta
    for epoch in bar:
        model.delta = delta_at(epoch, args.delta_start, args.delta_epochs, final_delta)
        model.training_epoch(epoch)  # K of the warm-up
        order = torch.randperm(args.train, generator=order_gen)
        total, epoch_start = 0.0, time.time()
        for i in range(0, args.train, args.batch_size):
            idx = order[i : i + args.batch_size].to(device)
            total += svi.step(x[idx], None, inputs=a[idx])
        epoch_seconds = time.time() - epoch_start
        per_seq, pooled = state_r2(model, vx, va, valid.positions, args.tau)
        row = {
            "epoch": epoch + 1,
            "updates": (epoch + 1) * -(-args.train // args.batch_size),
            "loss_per_sequence": total / args.train,
            "r2_per_sequence": per_seq,
            "r2_pooled": pooled,
            "M": model.displacement_matrix().detach().tolist(),
            "delta": model.delta,
            "num_neighbours": model.neighbours_now(),
            "seconds": time.time() - t0,
            "seconds_training_epoch": epoch_seconds,
        }
        if not (math.isfinite(row["loss_per_sequence"]) and math.isfinite(per_seq)):
            raise SystemExit(f"non-finite value at epoch {epoch + 1}: {row}")
        log.append(row)
        bar.set_postfix(r2=f"{per_seq:.3f}", loss=f"{row['loss_per_sequence']:.0f}")
        torch.save(
            {"model": model.state_dict(), "optim": optim.get_state(), "epoch": epoch + 1}, path
        )
        (folder / "log.json").write_text(json.dumps(log))
        if not args.smoke:
            write_result(
                f"gtmsm_learning_{args.tag}",
                {"settings": vars(args), "epochs": log, "device_info": device_info(device)},
            )
        if args.time_limit is not None and time.time() - call_start > args.time_limit:
            break
    model.delta = final_delta  # the oracle check and the saved model use the model's delta
    model.eval()  # and its K
    oracle = oracle_check(model, valid, args, vx, va) if log else None
    if not args.smoke and oracle is not None:
        write_result(
            f"gtmsm_learning_{args.tag}",
            {
                "settings": vars(args),
                "epochs": log,
                "oracle_check": oracle,
                "device_info": device_info(device),
            },
        )
    return log


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
