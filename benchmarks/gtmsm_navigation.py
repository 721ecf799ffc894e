"""GTM-SM on image navigation (thesis 7.4.1, Fig. 7.2d): frame error per prediction step
against SRNN and VRNN baselines.

1. Data: :func:`pyro_seq.data.simulators.image_navigation` (cached), every step the flattened
   8x8 frame followed by the one-hot action (``as_sequences()``). Training sequences have
   ``tau + pred`` steps (thesis: 256 + 32), test sequences ``tau + test_pred`` (256 + 256).
2. Models, each trained with :func:`pyro_seq.train.fit` on the packed sequences (resumable:
   ``benchmarks/checkpoints/gtmsm_<tag>/<model>/checkpoint.pt``, tqdm progress):

   * ``gtmsm``: :class:`pyro_seq.models.GTMSM` with ``pack_actions=True`` (thesis 7.7.1:
     16-d codes, r = 1e-3, 5 neighbours, Adam 1e-3);
   * ``srnn``, ``vrnn``: :class:`~pyro_seq.models.SRNN` / :class:`~pyro_seq.models.VRNN` with a
     Gaussian likelihood on the same packed features (they model the actions as observations
     too; they have no memory besides their RNN state).

3. Prediction on the test sequences: the frames after ``tau`` are hidden, the actions kept.
   GTM-SM: :meth:`~pyro_seq.models.GTMSM.predict` (noise-free states, the prior mean of the
   memory mixture, decoded); baselines: :func:`pyro_seq.tasks.impute` with
   ``method="importance"`` (``K`` paths from the guide with the frames marked unobserved,
   self-normalised weights: an estimate of ``E[x_miss | x_obs]``). Reported: the mean absolute
   pixel error per prediction step, and the error of predicting the mean memorised frame.

JSON in ``benchmarks/results/gtmsm_<tag>.json`` (settings, machine, per-step errors, training
histories); the finished evaluations are kept in ``<checkpoints>/evaluations.json`` so that a
rerun skips them. Usage::

    python benchmarks/gtmsm_navigation.py --train 1000 --epochs 50 --tag nav_1000
    python benchmarks/gtmsm_navigation.py --smoke      # seconds: tiny sizes, nothing recorded

Only the smoke run has been made on this 2-core CPU: no number from this script is recorded
in the docs.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from common import ROOT, write_result

MODELS = ("gtmsm", "srnn", "vrnn")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", type=int, default=1000)
    p.add_argument("--test", type=int, default=100)
    p.add_argument("--tau", type=int, default=256, help="memorisation steps (thesis 256)")
    p.add_argument("--pred", type=int, default=32, help="prediction steps in training (32)")
    p.add_argument("--test-pred", type=int, default=256, help="prediction steps in testing (256)")
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--particles", type=int, default=32, help="K of the baselines' imputation")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag", default=None)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, results to --smoke-dir")
    p.add_argument("--smoke-dir", default="/tmp/gtmsm_smoke", help="where --smoke writes")
    args = p.parse_args(argv)
    if args.smoke:
        args.train, args.test, args.tau, args.pred, args.test_pred = 8, 2, 12, 4, 6
        args.epochs, args.batch_size, args.particles = 1, 4, 2
    args.models = [m for m in args.models.split(",") if m]
    unknown = set(args.models) - set(MODELS)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; choose from {MODELS}")
    args.tag = args.tag or ("smoke" if args.smoke else f"nav_{args.train}")
    return args


def build(name, args):
    from pyro_seq.models import GTMSM, SRNN, VRNN

    if name == "gtmsm":
        small = dict(hidden_dims=(16,), z_dim=4, wall_hidden=4) if args.smoke else {}
        return GTMSM(tau=args.tau, pack_actions=True, **small)
    size = 8 if args.smoke else 128
    cls = SRNN if name == "srnn" else VRNN
    opts = dict(d_dim=size, z_dim=min(16, size), hidden_dim=size, likelihood="gaussian")
    if name == "vrnn":
        opts["feature_dim"] = size
    return cls(64 + 5, **opts)


def predict_frames(name, model, test, args):
    """Predicted frames ``(N, test_pred, 64)`` of the prediction phase."""
    from pyro_seq.tasks import impute

    x = torch.stack(test.as_sequences())
    model.eval()
    with torch.no_grad():
        if name == "gtmsm":
            return model.predict(x[..., :64], test.actions, tau=args.tau)["frames"]
        observed = torch.ones(x.shape, dtype=torch.bool)
        observed[:, args.tau:, :64] = False
        out = []
        for i in range(0, x.shape[0], 8):
            res = impute(model, x[i:i + 8], observed[i:i + 8], method="importance",
                         num_particles=args.particles)
            out.append(res.probs[:, args.tau:, :64])
        return torch.cat(out)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from pyro_seq.data.simulators import image_navigation
    from pyro_seq.train import TrainConfig, fit

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
    truth = test.frames.flatten(2)[:, args.tau:]
    memorised_mean = test.frames.flatten(2)[:, :args.tau].mean(1, keepdim=True)
    results = {"mean_memorised_frame": (memorised_mean - truth).abs().mean(-1).mean(0).tolist()}
    for name in args.models:
        if name in done:
            print(f"{name}: evaluated before, skipped")
            results[name] = done[name]
            continue
        torch.manual_seed(args.seed)
        model = build(name, args)
        config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                             clip_norm=50.0, lr_schedule="plateau", patience=None,
                             seed=args.seed, progress=not args.smoke, init="none")
        start = time.time()
        history = fit(model, train.as_sequences(), valid.as_sequences(), config, ckpt / name)
        seconds = time.time() - start
        frames = predict_frames(name, model, test, args)
        errors = (frames - truth).abs().mean(-1)  # (N, test_pred)
        done[name] = {"frame_error_per_step": errors.mean(0).tolist(),
                      "mean_frame_error": float(errors.mean()),
                      "train_seconds_this_call": seconds,
                      "history": [dict(row) for row in history]}
        results[name] = done[name]
        done_path.write_text(json.dumps(done))
        print(f"{name}: mean frame error {done[name]['mean_frame_error']:.4f} over "
              f"{args.test_pred} prediction steps", flush=True)
    payload = {"settings": {k: v for k, v in vars(args).items()},
               "simulation_seconds": sim_seconds, "results": results,
               "metric": "mean |pixel error| per prediction step, test split"}
    path = Path(args.smoke_dir) / f"gtmsm_{args.tag}.json" if args.smoke else None
    write_result(f"gtmsm_{args.tag}", payload, path)
    return payload


if __name__ == "__main__":
    main()
