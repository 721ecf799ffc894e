# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The Kalman VAE: a bouncing ball, an exact LGSSM prior, and imputation by smoothing
#
# The Kalman variational auto-encoder (thesis Ch. 6) separates *what a frame shows* from *how
# things move*. A VAE encodes each 32x32 frame $x_t$ into a 2-d code $a_t$; the codes follow a
# linear-Gaussian state-space model whose matrices $A_t, C_t$ are mixed from $K$ base matrices
# by a small LSTM, the dynamics parameter network (eq. 6.10). The states $z_t$ are integrated
# out **exactly** by the Kalman filter, so the model is an ordinary Pyro model/guide pair:
#
# * `model`: samples $a_t \sim p(a_t \mid a_{<t})$, the filter's one-step predictive, and
#   observes $x_t \sim p(x_t \mid a_t)$;
# * `guide`: $a_t \sim q(a_t \mid x_t)$, a convolutional encoder per frame.
#
# This tutorial:
#
# 1. simulates bouncing-ball videos (`pyro_seq.data.simulators.box`, no download);
# 2. trains `pyro_seq.models.KVAE` with `pyro.infer.SVI` and `Trace_ELBO`, then shows that the
#    same model trains with `FIVO` by changing `loss=` only (its step protocol runs one Kalman
#    filter step per time step);
# 3. imputes missing frames by generation, filtering and smoothing (thesis 6.4, Fig. 6.3);
# 4. puts the learnt $a_t$ trajectories next to the true ball positions (Fig. 6.5).
#
# `PYRO_SEQ_SMOKE=1` runs a short version for continuous integration. The full run trains on
# 1000 videos for 25 epochs (about 40 minutes on one CPU core; the thesis uses 5000 videos and
# 80 epochs on a GPU, see `benchmarks/paper/kvae_box.py`). Figures and `metrics.json` go to
# `$PYRO_SEQ_OUTPUT/kalman_vae` (default: a temporary folder; `--out` when run as a script):
# `SMOKE` and `OUT` come from a hidden first cell.

# %% tags=["remove-input"]
# Options (--out, --smoke), the output folder and, in short mode, a banner.
from pyro_seq._tutorial_support import setup

SMOKE, OUT = setup("kalman_vae", "the Kalman VAE on bouncing-ball videos")

# %%
import json
import math
import time

import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import ClippedAdam

from pyro_seq.data import SequenceLoader
from pyro_seq.data.simulators import box
from pyro_seq.infer import FIVO
from pyro_seq.models import KVAE
from pyro_seq.tasks import drop_frames, pixel_error
from pyro_seq.train.plots import plot_video, show_inline

torch.set_num_threads(1)
pyro.set_rng_seed(0)
metrics = {"smoke": SMOKE}

# %% [markdown]
# ## 1. Videos of a bouncing ball
#
# `box(N)` returns the frames `(N, T, 32, 32)` (0/1 pixels) and the true ball positions
# `(N, T, 2)`, deterministic from a seed and cached on disk. The models take flattened frames,
# `(T, 1024)` per video.

# %%
NUM_TRAIN, NUM_TEST, EPOCHS = (24, 8, 2) if SMOKE else (1000, 200, 25)
train = box(NUM_TRAIN, split="train", progress=False)
test = box(NUM_TEST, split="test", progress=False)
print(train.frames.shape, train.positions.shape)
plot_video(train.frames[0], OUT / "video.png", positions=train.positions[0], title="box video 0")
show_inline(OUT / "video.png")

# %% [markdown]
# ## 2. Training with SVI
#
# Appendix 6.8's settings are the model's defaults: codes $a_t \in \mathbb{R}^2$, states
# $z_t \in \mathbb{R}^4$, $K = 3$ modes, the reconstruction term weighted by 0.3 while the
# module is in training mode (in `eval()` mode the bound is the true ELBO), and the dynamics
# network frozen for the first `dynamics_warmup_epochs` epochs, which `training_epoch` switches.
# Adam at 0.007 with gradient clipping at 150.

# %%
model = KVAE((32, 32), channels=4 if SMOKE else 32, dynamics_warmup_epochs=0 if SMOKE else 3)
svi = SVI(
    model.model,
    model.guide,
    ClippedAdam({"lr": 0.007, "clip_norm": 150.0, "lrd": 0.85 ** (1 / (20 * 63))}),
    Trace_ELBO(),
)
loader = SequenceLoader(train.as_sequences(), batch_size=16, shuffle=True, seed=0)
x_test = test.frames.flatten(2)
curve = []
start = time.time()
for epoch in range(EPOCHS):
    model.train()
    model.training_epoch(epoch)
    total = sum(svi.step(x, mask) for x, mask in loader.batches(epoch))
    model.eval()
    with torch.no_grad():
        bound = -Trace_ELBO().loss(model.model, model.guide, x_test) / x_test.shape[0]
    curve.append(bound)
    print(f"epoch {epoch + 1}: test ELBO {bound:.1f} nats per video")
metrics["train_seconds"] = time.time() - start
metrics["test_elbo_per_video"] = curve[-1]

fig, ax = plt.subplots(figsize=(5, 3.2), layout="constrained")
ax.plot(range(1, EPOCHS + 1), curve, marker="o")
ax.set_xlabel("epoch")
ax.set_ylabel("test ELBO (nats per video)")
fig.savefig(OUT / "elbo_curve.png", dpi=110)
plt.close(fig)
show_inline(OUT / "elbo_curve.png")

# %% [markdown]
# Changing the objective is changing `loss=`. FIVO runs the model's step protocol: one Kalman
# filter step per time step, with the filter moments and the LSTM state in the particle state,
# resampled with the particles. A few steps of it, from the trained weights:

# %%
fivo = SVI(
    model.model, model.guide, ClippedAdam({"lr": 1e-3, "clip_norm": 150.0}), FIVO(num_particles=4)
)
model.train()
fivo_losses = [fivo.step(x, mask) for _, (x, mask) in zip(range(2), loader.batches(EPOCHS))]
model.eval()
with torch.no_grad():
    smc = -FIVO(num_particles=16).loss(model.model, model.guide, x_test) / x_test.shape[0]
print(f"FIVO training losses {fivo_losses}; SMC bound (K=16) {smc:.1f} nats per video")
metrics["fivo_losses"] = fivo_losses
metrics["smc_bound_per_video"] = smc
assert all(math.isfinite(v) for v in fivo_losses + [smc])

# %% [markdown]
# ## 3. Imputing missing frames
#
# Given the observed frames, the encoder gives their codes; the LGSSM fills the others in
# (thesis 6.4): **generation** uses only the first 4 frames and then the filter's predictions,
# **filtering** uses every observed frame up to $t$, **smoothing** uses all of them (RTS
# smoother). The dynamics weights at a missing step come from the predicted code. The metric
# is the fraction of wrongly imputed pixels on the missing frames (Fig. 6.3a), for random drops
# with probability $p$ (the first 4 frames always kept).

# %%
probs_grid = [0.2, 0.5, 0.8] if SMOKE else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
methods = ("generation", "filtering", "smoothing")
errors = {m: [] for m in methods}
g = torch.Generator().manual_seed(0)
mask = torch.ones(x_test.shape[:2], dtype=torch.bool)
with torch.no_grad():
    for p in probs_grid:
        observed = drop_frames(mask, p, generator=g, keep_first=4)
        for method in methods:
            probs, _ = model.impute_frames(x_test, observed, method)
            errors[method].append(pixel_error(probs, x_test, (~observed)[..., None]))
metrics["imputation_pixel_error"] = {"p": probs_grid, **errors}
fig, ax = plt.subplots(figsize=(5, 3.4), layout="constrained")
for method in methods:
    ax.plot(probs_grid, errors[method], marker="o", label=method)
ax.set_xlabel("drop probability p")
ax.set_ylabel("incorrect pixels on missing frames")
ax.legend()
fig.savefig(OUT / "imputation_curves.png", dpi=110)
plt.close(fig)
show_inline(OUT / "imputation_curves.png")

# %% [markdown]
# One video with 80% of its frames missing: truth on the left of each frame, the smoothed
# imputation on the right.

# %%
observed = drop_frames(mask[:1], 0.8, generator=g, keep_first=4)
with torch.no_grad():
    probs, a_hat = model.impute_frames(x_test[:1], observed, "smoothing")
pair = torch.cat([test.frames[0], probs[0].reshape(-1, 32, 32)], -1)
plot_video(
    pair,
    OUT / "imputed_video.png",
    title=f"truth | smoothing, missing {(~observed[0]).nonzero().flatten().tolist()}",
)
show_inline(OUT / "imputed_video.png")

# %% [markdown]
# ## 4. What the codes learnt
#
# The encoder means $\mathbb{E}[a_t \mid x_t]$ of a few test videos next to the true positions:
# a good KVAE maps the ball's position to $a_t$ up to an affine map (the thesis's Fig. 6.5).
# A linear map fitted from codes to positions measures it ($R^2$, 1 is perfect).

# %%
with torch.no_grad():
    codes = model.encode(x_test)[0]
pos = test.positions
design = torch.cat([codes.reshape(-1, 2), torch.ones(codes.shape[0] * codes.shape[1], 1)], -1)
target = pos.reshape(-1, 2).to(design)
coef = torch.linalg.lstsq(design, target).solution
resid = target - design @ coef
r2 = 1 - resid.pow(2).sum(0) / (target - target.mean(0)).pow(2).sum(0)
metrics["position_r2"] = r2.tolist()
print("R^2 of a linear map from a_t to the ball position (x, y):", r2.tolist())
fig, axes = plt.subplots(2, 4, figsize=(12, 6), layout="constrained")
for i in range(4):
    axes[0, i].scatter(codes[i, :, 0], codes[i, :, 1], c=range(codes.shape[1]), cmap="viridis")
    axes[0, i].plot(codes[i, :, 0], codes[i, :, 1], lw=0.6, color="C1")
    axes[0, i].set_title(f"video {i}: learnt a_t")
    axes[1, i].scatter(pos[i, :, 0], pos[i, :, 1], c=range(pos.shape[1]), cmap="viridis")
    axes[1, i].plot(pos[i, :, 0], pos[i, :, 1], lw=0.6, color="C1")
    axes[1, i].invert_yaxis()
    axes[1, i].set_title(f"video {i}: true position")
fig.savefig(OUT / "codes_vs_positions.png", dpi=110)
plt.close(fig)
show_inline(OUT / "codes_vs_positions.png")

# %%
with open(OUT / "metrics.json", "w") as fh:
    json.dump(metrics, fh, indent=1)
print(json.dumps(metrics, indent=1))
