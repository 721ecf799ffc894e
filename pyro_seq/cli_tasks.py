"""The command line's tasks on a trained run: ``pyro-seq impute | denoise | sample |
forecast`` (Bayer & Osendorfer (2014), sec. 4.2 and 4.3 for denoising and imputation).
:func:`pyro_seq.cli.make_parser` wires them to their subcommands."""

import argparse
import json
from pathlib import Path

import torch

from pyro_seq.cli_runs import (
    PIANO_KEYS,
    batch_of,
    device_option,
    load_run,
    load_run_and_data,
    to_cpu,
    to_device,
)


def cmd_impute(args: argparse.Namespace) -> int:
    """Bayer & Osendorfer (2014), sec. 4.3: drop ``--drop`` consecutive steps of each sequence
    (or each step with probability ``--drop-prob``), impute them."""
    from pyro_seq.tasks import bits_per_element, drop_frames, drop_steps, impute, pixel_error
    from pyro_seq.train.plots import plot_recovery, plot_video

    run, model, data = load_run_and_data(args, ("train", args.split))
    model.require("impute")
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
    x, mask, inputs = batch_of(split, chosen)
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
    device = device_option(args.device)
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
            inputs=to_device(device, inputs),
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
    if model.frame_shape is not None:  # a video: the recovered one beside the truth
        frames = side_by_side(model.frame_shape, x[0, :L], probs[0, :L])
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


def cmd_denoise(args: argparse.Namespace) -> int:
    """Bayer & Osendorfer (2014), sec. 4.2: flip each element with probability ``--flip`` (real
    values: add Gaussian noise ``--noise``), denoise online."""
    from pyro_seq.tasks import denoise
    from pyro_seq.train.plots import plot_recovery, plot_video

    run, model, data = load_run_and_data(args, (args.split,))
    model.require("denoise")
    split = data[args.split]
    chosen = list(range(min(args.num, len(split))))
    seqs = [split[i] for i in chosen]
    g = torch.Generator().manual_seed(args.seed)
    x, mask, inputs = batch_of(split, chosen)
    real = mask.unsqueeze(-1).expand(x.shape)
    if model.binary_observations:  # flip elements (Bayer & Osendorfer 2014, sec. 4.2)
        flips = (torch.rand(x.shape, generator=g) < args.flip) & real
        corrupted = torch.where(flips, 1 - x, x)
        noise = {"flip": args.flip}
    else:  # real values: add Gaussian noise of standard deviation --noise
        corrupted = torch.where(real, x + args.noise * torch.randn(x.shape, generator=g), x)
        noise = {"noise": args.noise}
    device = device_option(args.device)
    x_hat, probs = to_cpu(
        denoise(model, corrupted.to(device), mask.to(device), inputs=to_device(device, inputs))
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
        frames = side_by_side(model.frame_shape, x[0, :L], corrupted[0, :L], x_hat[0, :L])
        plot_video(frames, png, title="truth | corrupted | denoised")
    elif model.binary_observations:
        plot_recovery(x[0, :L], corrupted[0, :L], x_hat[0, :L], png, title="denoising")
    else:
        _plot_forecast(model, x[0, :L], x_hat[0, :L], 0, png, "denoised (dashed) and truth")
    print(f"denoised {len(seqs)} {args.split} sequences {line}; figure {png}")
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    """Draw ``--num`` sequences of ``--length`` steps: ``samples.pt`` (the tensor ``(num,
    length, D)``) and a PNG per sequence (frames for videos, a piano roll for binary data,
    curves for real values); MIDI files only for piano rolls (88 binary pitches per step)."""
    from pyro_seq.data.midi import piano_roll_to_midi
    from pyro_seq.train.plots import plot_features, plot_piano_roll, plot_video

    run, model = load_run(args.run, args.device)
    model.require("generate")
    torch.manual_seed(args.seed)
    kwargs = {}
    if model.input_dim:  # known inputs held at zero (e.g. no torque): say so
        kwargs["inputs"] = torch.zeros(
            args.num, args.length, model.input_dim, device=device_option(args.device)
        )
        print(
            f"{run['model']} takes {model.input_dim} known inputs per step: sampling with "
            "them at zero"
        )
    x, params = to_cpu(model.generate(args.num, args.length, **kwargs))
    out = Path(args.run)
    piano = is_piano_roll(model)
    for i in range(args.num):
        png = out / f"sample_{i}.png"
        title = f"{run['model']} sample {i}"
        if model.frame_shape is not None:  # a video: its trajectory and frames
            plot_video(side_by_side(model.frame_shape, x[i]), png, title=title)
        elif model.binary_observations:  # binary features drawn as a piano roll
            probs = torch.sigmoid(params[i]) if torch.is_tensor(params) else None
            plot_piano_roll(x[i], png, probs=probs, title=title, lowest_note=21 if piano else 0)
        else:  # real-valued features over time
            plot_features(x[i], png, title=title)
        if piano:
            mid = out / f"sample_{i}.mid"
            piano_roll_to_midi(x[i], mid, step_seconds=args.step_seconds)
            print(f"wrote {png} and {mid}")
        else:
            print(f"wrote {png}")
    tensor = out / "samples.pt"
    torch.save(x, tensor)
    print(f"wrote {tensor}: the samples, a tensor of shape {tuple(x.shape)} (num, length, D)")
    if not piano:
        kind = "binary" if model.binary_observations else "real-valued"
        print(
            f"no MIDI files: MIDI needs piano rolls ({PIANO_KEYS} binary pitches per step), "
            f"these samples have {model.obs_dim} {kind} features per step"
        )
    return 0


def is_piano_roll(model) -> bool:
    """Whether ``model``'s observations are piano rolls: :data:`PIANO_KEYS` binary features per
    step that are no video frames (the only data written as MIDI)."""
    return bool(
        model.binary_observations and model.obs_dim == PIANO_KEYS and model.frame_shape is None
    )


def cmd_forecast(args: argparse.Namespace) -> int:
    """Continue the first ``--prefix`` steps of each sequence for ``--steps`` steps in
    generation mode (:func:`pyro_seq.tasks.forecast`, ``--num-samples`` paths each) and score
    the true continuation: its log-likelihood under the forecast mixture (binary observations)
    and the mean absolute error of the mean forecast."""
    from pyro_seq.tasks import forecast

    run, model, data = load_run_and_data(args, ("train", args.split), require="forecast")
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
    x, _, inputs = batch_of(split, chosen, P + K)  # (B, P + K, D)
    prefix, truth = x[:, :P], x[:, P:]  # the inputs of every step, future ones included
    binary = model.binary_observations
    device = device_option(args.device)
    torch.manual_seed(args.seed)
    try:
        res = forecast(
            model,
            prefix.to(device),
            K,
            num_samples=args.num_samples,
            target=truth.to(device) if binary else None,
            inputs=to_device(device, inputs),
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
        # (B, K); forecast scores the target, which binary models were given above
        log_prob = res.log_prob.cpu()  # type: ignore[union-attr]
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


def side_by_side(frame_shape, *videos):
    """Videos ``(T, F)`` of flattened frames of ``frame_shape`` as greyscale frames ``(T, H, W *
    len(videos))`` in ``[0, 1]``, side by side (an RGB frame shows its channels' mean)."""
    panels = [v.reshape((v.shape[0],) + tuple(frame_shape)) for v in videos]
    panels = [p.mean(1) if p.dim() == 4 else p for p in panels]
    return torch.cat(panels, -1).clamp(0, 1)


def _plot_forecast(model, truth, mean, P, path, title):
    """The truth ``(P + K, D)`` beside the prefix continued by the mean forecast ``(K, D)``:
    videos frame by frame, binary data as piano rolls (prefix, truth and forecast
    probabilities), real values as curves (truth solid, forecast dashed)."""
    from pyro_seq.train.plots import plot_recovery, plot_video, plt

    forecast = torch.cat([truth[:P], mean])
    if model.frame_shape is not None:
        frames = side_by_side(model.frame_shape, truth, forecast)
        plot_video(frames, path, title=f"truth | forecast after {P}")
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
