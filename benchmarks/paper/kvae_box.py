"""KVAE on the bouncing-ball videos: training, then the imputation curves of thesis Fig. 6.3.

1. Train a KVAE with the settings of the preset ``kvae_box`` (:mod:`pyro_seq.presets`: paper
   architecture, a_t in R^2, z_t in R^4, K = 3, conv encoder / sub-pixel decoder; appendix 6.8
   tricks: reconstruction weight 0.3, dynamics network frozen for the first epochs, uniform
   initial mixture weights, Adam 0.007 with decay 0.85 every 20 epochs, gradient clipping 150;
   1000 training videos, 20 epochs) with :func:`pyro_seq.train.fit` (resumable from its
   checkpoints in ``benchmarks/checkpoints/<tag>``, tqdm progress).
2. On the test videos, for every drop probability p in {0.1, ..., 0.9} (the first 4 frames
   always observed, as the KVAE code's random masks) and for the "missing in the middle" scheme
   (only the first and last 4 frames observed): impute the missing frames by generation,
   filtering and smoothing (:meth:`pyro_seq.models.KVAE.impute_frames`) and report the fraction
   of incorrectly imputed pixels on the missing frames (:func:`pyro_seq.tasks.pixel_error`).
3. Baselines, each trained for the same number of epochs: the AE-RNN
   (:class:`pyro_seq.baselines.AERNN`: the same encoder and decoder, deterministic, an LSTM on
   the codes; Adam, its own resumable checkpoint ``ae_rnn.pt``), imputing forward; and the
   package's :class:`~pyro_seq.models.VAERNN` (MLPs on the flattened frames: GRU 50, z 8,
   hidden 128; :func:`pyro_seq.train.fit` in ``<tag>/vaernn``), imputing by importance
   sampling over whole paths with 16 particles (:func:`pyro_seq.tasks.impute`).
4. Figures: the error-vs-p curves (Fig. 6.3a), the learnt a_t trajectories beside the true
   positions, and a strip of frames.

JSON in ``benchmarks/results/kvae_<tag>.json``, figures next to it. The thesis trains on 5000
videos for 80 epochs (55 s an epoch on a Titan X); on this 2-core CPU an epoch of 5000 videos
takes about 6 minutes, so the preset chooses a smaller budget. The data default to the preset's
(``box:1000``: 1000 training videos and ``N // 5`` of ``--train`` N for validation and test;
with ``--test`` typed, a fifth of it for validation, as the recorded runs chose). A
flag that changes a preset's value (``--env``, ``--train``, ``--valid``, ``--test``,
``--epochs``, ``--batch-size``, ``--lr``, ``--warmup-epochs``, ``--channels``, ``--seed``,
``--time-limit``, and the sizes ``--smoke`` sets) is an override, recorded in the JSON's
``overrides`` with the ``preset``. Usage::

    python benchmarks/paper/kvae_box.py --train 1000 --valid 100 --test 500 \
        --baseline-epochs 6 --tag box_1000                  # the recorded run
    python benchmarks/paper/kvae_box.py --smoke      # seconds: tiny sizes, nothing recorded
"""

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

import torch
from common import RESULTS, ROOT, device_info, write_result

from pyro_seq.presets import get_preset

PRESET = get_preset("kvae_box")
#: The preset's data ``"env:N"``: N training videos, ``N // 5`` (at least 1) for validation and
#: test each, as :func:`pyro_seq.data.load_dataset` reads it.
ENV, _, COUNT = PRESET.data.partition(":")
#: ``--smoke``: tiny sizes (overrides of the preset's values).
SMOKE = dict(train=16, valid=1, test=8, epochs=1, channels=4, batch_size=8, warmup_epochs=0)
#: Flags that change a preset value -> (where: "data", "model" or "train", the field).
PRESET_FLAGS = {
    "env": ("data", "env"),
    "train": ("data", "train"),
    "valid": ("data", "valid"),
    "test": ("data", "test"),
    "channels": ("model", "channels"),
    "warmup_epochs": ("model", "dynamics_warmup_epochs"),
    "epochs": ("train", "epochs"),
    "batch_size": ("train", "batch_size"),
    "lr": ("train", "lr"),
    "seed": ("train", "seed"),
    "time_limit": ("train", "time_limit"),
}
PROBS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
METHODS = ("generation", "filtering", "smoothing")
BASELINE = "ae_rnn"
BASELINES = (BASELINE, "vaernn")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default=None, help=f"simulated videos (preset: {ENV})")
    p.add_argument(
        "--train", type=int, default=None, help=f"training videos (preset {COUNT}; thesis 5000)"
    )
    p.add_argument(
        "--valid",
        type=int,
        default=None,
        help="validation videos (default: --test // 5 when --test is typed, else --train // 5)",
    )
    p.add_argument(
        "--test", type=int, default=None, help="test videos (default: --train // 5; thesis 1000)"
    )
    p.add_argument("--epochs", type=int, default=None, help="KVAE epochs (preset: 20)")
    p.add_argument(
        "--baseline-epochs",
        type=int,
        default=None,
        help="epochs of the AE-RNN and VAE-RNN baselines (default: the KVAE's); a "
        "later call with more resumes them",
    )
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup-epochs", type=int, default=None, help="dynamics_warmup_epochs")
    p.add_argument("--channels", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=None, help="of the data and every model")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (named in the JSON)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds of KVAE training at most (fit's time_limit; the epochs done are in the JSON)",
    )
    p.add_argument("--tag", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, results to --smoke-dir")
    p.add_argument("--smoke-dir", default="/tmp/kvae_smoke", help="where --smoke writes")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    return args


def settings(args):
    """The settings of a run: the preset's data sizes (``env``, ``train``, ``valid``,
    ``test``), model options and :class:`~pyro_seq.train.TrainConfig` (with this run's
    threads, device and progress bar), with the flags that change a preset's value applied
    and listed in ``overrides`` (flag destination -> the value used); then the settings the
    script fills in from them (``baseline_epochs``, ``tag``)."""
    count = int(COUNT)
    values = {
        "data": {
            "env": ENV,
            "train": count,
            "valid": max(1, count // 5),
            "test": max(1, count // 5),
        },
        "model": dict(PRESET.model_options),
        "train": asdict(PRESET.train_config()),
    }
    overrides = {}
    for flag, (where, field) in PRESET_FLAGS.items():
        value = getattr(args, flag)
        if value is not None and value != values[where].get(field):
            overrides[flag] = values[where][field] = value
    data = values["data"]
    typed = {flag for flag in ("train", "valid", "test") if getattr(args, flag) is not None}
    # untyped sizes follow the typed ones: a fifth of --train ("env:N"), for validation a
    # fifth of --test when typed (as the recorded runs chose)
    if "test" not in typed and "train" in typed:
        data["test"] = max(1, data["train"] // 5)
    if "valid" not in typed and typed:
        data["valid"] = max(1, data["test" if "test" in typed else "train"] // 5)
    typed = {PRESET_FLAGS[f][1]: v for f, v in overrides.items() if PRESET_FLAGS[f][0] == "train"}
    config = replace(
        PRESET.train_config(**typed),
        num_threads=args.threads,
        progress=not args.smoke,
        device=args.device,
    )
    baseline_epochs = config.epochs if args.baseline_epochs is None else args.baseline_epochs
    tag = args.tag or (f"{data['env']}_smoke" if args.smoke else f"{data['env']}_{data['train']}")
    return {
        "preset": PRESET.name,
        "data": data,
        "model_options": values["model"],
        "config": config,
        "overrides": overrides,
        "baseline_epochs": baseline_epochs,
        "tag": tag,
    }


def used_settings(args, run):
    """The flags as parsed, with the values used where one was not typed (the preset's)."""
    places = {"data": run["data"], "model": run["model_options"], "train": asdict(run["config"])}
    used = {flag: places[where][field] for flag, (where, field) in PRESET_FLAGS.items()}
    return dict(vars(args), **used, baseline_epochs=run["baseline_epochs"], tag=run["tag"])


def make_masks(num, T, generator):
    """The imputation schemes: ``{name: observed (num, T)}``."""
    mask = torch.ones(num, T, dtype=torch.bool)
    from pyro_seq.tasks import drop_frames

    schemes = {f"p={p}": drop_frames(mask, p, generator=generator, keep_first=4) for p in PROBS}
    middle = torch.zeros(num, T, dtype=torch.bool)
    middle[:, :4] = middle[:, -4:] = True
    schemes["middle"] = middle
    return schemes


def imputation_errors(model, baseline, vaernn, videos, generator, batch=100):
    from pyro_seq.tasks import impute, pixel_error

    first = next(model.parameters())
    x = videos.frames.flatten(2).to(first.device, first.dtype)
    N, T, _ = x.shape
    out = {}
    for name, observed in make_masks(N, T, generator).items():
        observed = observed.to(x.device)
        row = {}
        for method in METHODS:
            probs = torch.cat(
                [
                    model.impute_frames(x[i : i + batch], observed[i : i + batch], method)[0]
                    for i in range(0, N, batch)
                ]
            )
            row[method] = pixel_error(probs, x, (~observed)[..., None])
        probs = torch.cat(
            [
                baseline.impute_frames(x[i : i + batch], observed[i : i + batch])[0]
                for i in range(0, N, batch)
            ]
        )
        row[BASELINE] = pixel_error(probs, x, (~observed)[..., None])
        probs = torch.cat(
            [
                impute(
                    vaernn,
                    x[i : i + batch],
                    observed[i : i + batch],
                    method="importance",
                    num_particles=16,
                ).probs
                for i in range(0, N, batch)
            ]
        )
        row["vaernn"] = pixel_error(probs, x, (~observed)[..., None])
        out[name] = row
        print(
            f"  {name:>6}: " + "  ".join(f"{m} {row[m]:.4f}" for m in METHODS + BASELINES),
            flush=True,
        )
    return out


def train_baseline(train, args, run, out_dir, image_shape):
    """The AE-RNN for ``run["baseline_epochs"]`` epochs (minibatches, seed and channels those of
    the KVAE in ``run``: :func:`settings`), resumable from ``out_dir / "ae_rnn.pt"``."""
    from tqdm.auto import tqdm

    from pyro_seq.baselines import AERNN

    config, epochs = run["config"], run["baseline_epochs"]
    torch.manual_seed(config.seed)
    model = AERNN(image_shape, channels=run["model_options"]["channels"]).to(args.device)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    path, start, history = out_dir / "ae_rnn.pt", 0, []
    if path.exists():
        state = torch.load(path, weights_only=True, map_location=args.device)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start, history = int(state["epoch"]), [float(v) for v in state["history"]]
    x = train.frames.flatten(2).to(args.device)
    t0 = time.time()
    batch = config.batch_size
    for epoch in tqdm(
        range(start, epochs),
        initial=start,
        total=epochs,
        desc="AE-RNN epochs",
        disable=args.smoke,
    ):
        g = torch.Generator().manual_seed(config.seed * 1000 + epoch)
        order = torch.randperm(len(x), generator=g).to(x.device)
        total = 0.0
        for i in range(0, len(x), batch):
            loss = model.loss(x[order[i : i + batch]])
            optim.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 150.0)
            optim.step()
            total += float(loss.detach()) * len(order[i : i + batch])
        history.append(total / len(x))
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "model": model.state_dict(),
                "optim": optim.state_dict(),
                "epoch": epoch + 1,
                "history": torch.tensor(history),
            },
            path,
        )
    model.eval()
    return model, history, time.time() - t0


def train_vaernn(train, valid, args, run, out_dir):
    """The package's VAE-RNN on the flattened frames, by :func:`pyro_seq.train.fit` (resumable;
    epochs, minibatches and seed from ``run``: :func:`settings`)."""
    from pyro_seq.models import VAERNN
    from pyro_seq.train import TrainConfig, fit

    kvae = run["config"]
    torch.manual_seed(kvae.seed)
    model = VAERNN(train.frames[0, 0].numel(), d_dim=50, z_dim=8, hidden_dim=128)
    config = TrainConfig(
        epochs=run["baseline_epochs"],
        batch_size=kvae.batch_size,
        lr=1e-3,
        patience=None,
        device=args.device,
        seed=kvae.seed,
        num_threads=args.threads,
        progress=not args.smoke,
        valid_batch_size=100,
    )
    t0 = time.time()
    fit(model, train.as_sequences(), valid.as_sequences(), config, out_dir / "vaernn")
    model.eval()
    return model, time.time() - t0


def figures(model, videos, errors, out_prefix, env="box"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pyro_seq.train.plots import plot_video

    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    labels = {"ae_rnn": "AE-RNN", "vaernn": "VAE-RNN"}
    for method in METHODS + BASELINES:
        ax.plot(
            PROBS,
            [errors[f"p={p}"][method] for p in PROBS],
            marker="o",
            label=labels.get(method, f"KVAE {method}"),
        )
    ax.set_xlabel("drop probability p")
    ax.set_ylabel("fraction of incorrect pixels")
    ax.set_title(f"KVAE imputation on {env} (thesis Fig. 6.3a)")
    ax.legend()
    fig.savefig(f"{out_prefix}_imputation.png", dpi=120)
    plt.close(fig)

    first = next(model.parameters())
    x = videos.frames.flatten(2)[:4].to(first.device, first.dtype)
    a = model.encode(x)[0].detach().cpu()
    pos = videos.positions[:4]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.2), layout="constrained")
    for i, ax in enumerate(axes):
        ax.scatter(a[i, :, 0], a[i, :, 1], c=range(a.shape[1]), cmap="viridis", s=14)
        ax.plot(a[i, :, 0], a[i, :, 1], lw=0.6, color="C1")
        ax.set_title(f"video {i}: learnt a_t")
    fig.savefig(f"{out_prefix}_encodings.png", dpi=120)
    plt.close(fig)
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.2), layout="constrained")
    for i, ax in enumerate(axes):
        ax.scatter(pos[i, :, 0], pos[i, :, 1], c=range(pos.shape[1]), cmap="viridis", s=14)
        ax.invert_yaxis()
        ax.set_title(f"video {i}: true positions")
    fig.savefig(f"{out_prefix}_positions.png", dpi=120)
    plt.close(fig)
    g = torch.Generator().manual_seed(1)
    observed = make_masks(1, x.shape[1], g)["p=0.8"].to(x.device)
    probs, _ = model.impute_frames(x[:1], observed, "smoothing")
    H, W = model.image_shape[-2:]
    frames = torch.cat([x[0].reshape(-1, H, W), probs[0].detach().reshape(-1, H, W)], -1).cpu()
    plot_video(
        frames, f"{out_prefix}_frames.png", positions=None, title="truth | smoothing at p = 0.8"
    )
    # Generation (appendix 6.9 videos, Fig. 6.5): the first 4 frames observed, then the
    # filter's predictions only; truth beside the generated frames, trajectory coloured by time.
    observed = torch.zeros(1, x.shape[1], dtype=torch.bool, device=x.device)
    observed[:, :4] = True
    probs, _ = model.impute_frames(x[:1], observed, "generation")
    frames = torch.cat([x[0].reshape(-1, H, W), probs[0].detach().reshape(-1, H, W)], -1).cpu()
    plot_video(
        frames,
        f"{out_prefix}_generation.png",
        positions=None,
        title=f"{env}: truth | generated after 4 frames",
    )


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from pyro_seq.data.simulators import simulate
    from pyro_seq.train import evaluate_bound, fit
    from pyro_seq.validation import parse_device

    device = parse_device(args.device, "--device")
    run = settings(args)
    config, sizes, tag = run["config"], run["data"], run["tag"]
    t0 = time.time()
    cache = False if args.smoke else True
    sim = dict(cache=cache, progress=not args.smoke, num_workers=1 if args.smoke else None)
    videos = {
        split: simulate(sizes["env"], sizes[split], split=split, seed=config.seed, **sim)
        for split in ("train", "valid", "test")
    }
    train, valid, test = videos["train"], videos["valid"], videos["test"]
    sim_seconds = time.time() - t0
    H, W = train.frames.shape[-2:]
    torch.manual_seed(config.seed)
    model = PRESET.build(H * W, 0, image_shape=[H, W], **run["model_options"])
    smoke_dir = Path(args.smoke_dir)
    out_dir = smoke_dir / "run" if args.smoke else ROOT / "benchmarks" / "checkpoints" / tag
    t1 = time.time()
    history = fit(model, train.as_sequences(), valid.as_sequences(), config, out_dir)
    train_seconds = time.time() - t1
    model.eval()
    test_elbo = evaluate_bound(model, test.as_sequences(), batch_size=100)
    print(
        f"test ELBO {test_elbo['per_step']:.3f} nats per frame "
        f"({test_elbo['per_step'] * test.frames.shape[1]:.2f} per sequence)"
    )
    baseline, baseline_history, baseline_seconds = train_baseline(train, args, run, out_dir, (H, W))
    vaernn, vaernn_seconds = train_vaernn(train, valid, args, run, out_dir)
    t2 = time.time()
    with torch.no_grad():
        errors = imputation_errors(
            model, baseline, vaernn, test, torch.Generator().manual_seed(config.seed)
        )
    impute_seconds = time.time() - t2
    ordered = all(
        errors[f"p={p}"]["smoothing"]
        <= errors[f"p={p}"]["filtering"]
        <= errors[f"p={p}"]["generation"]
        for p in PROBS
    )
    below_baseline = all(errors[f"p={p}"]["smoothing"] < errors[f"p={p}"][BASELINE] for p in PROBS)
    below_vaernn = all(errors[f"p={p}"]["smoothing"] < errors[f"p={p}"]["vaernn"] for p in PROBS)
    epochs = [r for r in history if "seconds" in r] if isinstance(history, list) else []
    payload = {
        "env": sizes["env"],
        "settings": used_settings(args, run),
        "test_elbo_per_frame": test_elbo["per_step"],
        "test_elbo_per_sequence": test_elbo["per_step"] * test.frames.shape[1],
        "imputation_pixel_error": errors,
        "smoothing_lt_filtering_lt_generation_at_every_p": ordered,
        "kvae_smoothing_below_ae_rnn_at_every_p": below_baseline,
        "kvae_smoothing_below_vaernn_at_every_p": below_vaernn,
        "ae_rnn_train_loss_per_frame": baseline_history,
        "seconds": {
            "simulation": sim_seconds,
            "training": train_seconds,
            "ae_rnn_training": baseline_seconds,
            "vaernn_training": vaernn_seconds,
            "imputation": impute_seconds,
        },
        "seconds_per_epoch": [r["seconds"] for r in epochs],
        "epochs_trained": len(epochs),
        "device_info": device_info(device),
        "thesis": "Fig. 6.3a: smoothing < filtering < generation at every p (curves, no table)",
        "preset": run["preset"],
        "overrides": run["overrides"],
        "data": sizes,
        "model_options": run["model_options"],
        "train": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()},
    }
    prefix = smoke_dir / "fig" if args.smoke else RESULTS / f"kvae_{tag}"
    with torch.no_grad():
        figures(model, test, errors, str(prefix), sizes["env"])
    write_result(f"kvae_{tag}", payload, path=smoke_dir / "result.json" if args.smoke else None)
    print(
        json.dumps(
            {
                "ordered": ordered,
                "below_ae_rnn": below_baseline,
                "train_seconds": round(train_seconds),
            }
        )
    )
    return payload


if __name__ == "__main__":
    main()
