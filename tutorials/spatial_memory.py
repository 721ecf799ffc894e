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
# # Spatial memory: a GTM-SM remembers what it saw where, and predicts hundreds of steps
#
# A generative temporal model with spatial memory (GTM-SM, thesis Ch. 7) is built for an agent
# that walks around, sees only a small part of its world, and must later predict what it will
# see when it comes back. It splits every step into **where** and **what**:
#
# * *where*: a 2-d state $s_t$ follows the actions, $s_t = s_{t-1} + M a_t \,
#   \sigma_d(s_{t-1} + M a_t) + \varepsilon_t$ (eq. 7.3; $M$ is learnt, $\sigma_d$ learns the
#   walls, $r = 10^{-3}$);
# * *what*: a VAE codes each frame into $z_t$;
# * *memory*: during the first $\tau$ steps the model writes $(\mathbb{E}[s_t], q(z_t \mid
#   x_t))$ into a differentiable neural dictionary (`pyro_seq.nn.DND`); afterwards it predicts
#   $z_t$ from the 5 stored entries nearest to $s_t$, a mixture with weights
#   $\propto 1/(d^2 + \delta)$ (thesis 7.4.1).
#
# This tutorial:
#
# 1. generates the image-navigation environment of thesis 7.4.1 (`image_navigation`, crops of
#    scikit-learn's bundled photographs: nothing is downloaded);
# 2. shows the memory at work with *known* parts (identity codes, the true $M$): predicted frames
#    are the stored ones;
# 3. trains `pyro_seq.models.GTMSM` with `SVI` and `Trace_ELBO`, and a few steps of FIVO by
#    changing `loss=` only;
# 4. compares predicted and true frames in the prediction phase (Fig. 7.2d), the frame error per
#    prediction step, and the learnt states against the true positions (Fig. 7.2c).
#
# `PYRO_SEQ_SMOKE=1` runs a short version (under a minute) for continuous integration; the full
# run uses the thesis' split, 256 memorisation and 32 prediction steps, 500 sequences and 30
# epochs (about half an hour on one CPU core). Figures and `metrics.json` go to
# `$PYRO_SEQ_OUTPUT/spatial_memory` (default: a temporary folder; `--out` when run as a script):
# `SMOKE` and `OUT` come from a hidden first cell.

# %% tags=["remove-input"]
# Options (--out, --smoke), the output folder and, in short mode, a banner.
from pyro_seq._tutorial_support import setup

SMOKE, OUT = setup("spatial_memory", "the GTM-SM on image navigation")

# %%
import json
import math
import time

import matplotlib.pyplot as plt
import pyro
import torch
import torch.nn as nn
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import ClippedAdam

from pyro_seq.data.simulators import ACTIONS, image_navigation
from pyro_seq.infer import FIVO
from pyro_seq.models import GTMSM
from pyro_seq.train.plots import show_inline

torch.set_num_threads(1)
pyro.set_rng_seed(0)
metrics = {"smoke": SMOKE}

# %% [markdown]
# ## 1. The environment
#
# Each sequence has its own 32x32 world, cut from a photograph. The agent stands on a 9x9 grid
# and sees the 8x8 crop around it. Its actions (up, down, left, right, stay) come in runs of
# $1 + \text{Poisson}(3)$ repeats; a move into the edge does nothing. `frames` are
# `(N, T, 8, 8)`, `actions` `(N, T)` and `positions` `(N, T, 2)`.

# %%
TAU, PRED = (32, 8) if SMOKE else (256, 32)
NUM_TRAIN, NUM_TEST, EPOCHS = (16, 4, 2) if SMOKE else (500, 50, 30)
train = image_navigation(NUM_TRAIN, TAU + PRED, split="train", progress=False)
test = image_navigation(NUM_TEST, TAU + (PRED if SMOKE else 256), split="test", progress=False)
print(train.frames.shape, train.actions.shape, train.positions.shape)
counts = torch.bincount(train.actions.flatten(), minlength=5)
print({name: int(c) for name, c in zip(ACTIONS, counts)})

SHOW = int(train.images.flatten(1).std(-1).argmax())  # the most textured world
fig, axes = plt.subplots(1, 9, figsize=(13, 2.2), layout="constrained")
axes[0].imshow(train.images[SHOW], cmap="gray", vmin=0, vmax=1)
pos = train.positions[SHOW, :TAU].float() * 3 + 3.5  # crop centres in pixels
axes[0].plot(pos[:, 1], pos[:, 0], lw=0.8, color="C1")
axes[0].set_title("world + path")
for i, t in enumerate(torch.linspace(0, TAU - 1, 8).long().tolist()):
    axes[i + 1].imshow(train.frames[SHOW, t], cmap="gray", vmin=0, vmax=1)
    axes[i + 1].set_title(f"t={t + 1} {ACTIONS[int(train.actions[SHOW, t])]}", fontsize=8)
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.savefig(OUT / "environment.png", dpi=110)
plt.close(fig)
show_inline(OUT / "environment.png")

# %% [markdown]
# ## 2. The memory with known parts
#
# Before learning anything, give the model the parts it would have to learn: codes that are the
# frames themselves ($z_t = x_t$, an identity encoder and decoder), the true displacements $M$
# in (row, col) units, a wall network that is 1 inside the grid and 0 outside, and the true
# starting position as $s_0$. The states are then the true positions, and every frame of the
# prediction phase at a position visited during memorisation is read back from the memory: the
# nearest entry sits at distance 0 and holds weight $1/\delta = 10^4$ against at most $1$ for
# each neighbour. The error there is zero up to that leakage.


# %%
class IdentityCode(nn.Module):
    def forward(self, x):
        return x, torch.full_like(x, 0.05)


class GridWalls(nn.Module):
    """A logit of +30 inside the 9x9 grid and -30 outside: sigma_d is 1 or 0 to 1e-13."""

    def forward(self, s):
        inside = ((s > -0.5) & (s < 8.5)).all(-1, keepdim=True)
        return torch.where(inside, 30.0, -30.0).to(s)


oracle = GTMSM(tau=TAU, z_dim=64, hidden_dims=(4,)).double()
oracle.encoder_body, oracle.encoder_head, oracle.decoder = (
    nn.Identity(),
    IdentityCode(),
    nn.Identity(),
)
oracle.wall_net = GridWalls()
with torch.no_grad():
    oracle.set_displacement_matrix(torch.tensor([[-1.0, 1, 0, 0, 0], [0, 0, -1, 1, 0]]))
frames = train.frames.flatten(2)
errors, visited = [], []
for b in range(frames.shape[0]):
    oracle.s0.copy_(train.positions[b, 0].double())  # s_1 = s_0: the first action is 'stay'
    acts = train.actions[b : b + 1].clone()
    acts[0, 0] = ACTIONS.index("stay")
    out = oracle.predict(frames[b : b + 1].double(), acts)
    assert torch.allclose(out["states"][0], train.positions[b, TAU:].double())
    seen = {tuple(p) for p in train.positions[b, :TAU].tolist()}
    visited.append(torch.tensor([tuple(p) in seen for p in train.positions[b, TAU:].tolist()]))
    errors.append((out["frames"][0] - frames[b, TAU:].double()).abs().amax(-1))
errors, visited = torch.stack(errors), torch.stack(visited)
metrics["oracle_max_error_visited"] = float(errors[visited].max()) if visited.any() else 0.0
metrics["oracle_fraction_visited"] = float(visited.double().mean())
print(
    f"known parts: largest |pixel error| {metrics['oracle_max_error_visited']:.2e} on the "
    f"{100 * metrics['oracle_fraction_visited']:.0f}% of prediction steps at visited positions"
)
assert metrics["oracle_max_error_visited"] < 1e-3

# %% [markdown]
# ## 3. Learning everything: SVI with Trace_ELBO
#
# Now $M$, the wall network, the encoder and the decoder are learnt from frames and actions
# alone (thesis 7.7.1: 16-d codes, $r = 10^{-3}$, 5 neighbours, Adam at $10^{-3}$; MLP encoder
# and decoder, which the thesis found enough here). The bound is over the prediction phase
# only (thesis 7.3.4): the memorisation steps only fill the memory. Actions reach the model
# as `inputs=` (int indices; `pack_actions=True` reads them from the last 5 columns of `x`
# instead, as `pyro-seq train --model gtmsm` does).
#
# Trained exactly as the thesis describes, the states do not become positions on this data
# (the moves settle on one axis or count the moves; see the GTM-SM sections of the benchmarks
# page). Three options of ours fix that, and they are used here:
#
# * `displacements="inverse_pairs"`: down $= -$up and right $= -$left in $M$ by construction,
#   so that any two independent columns make the states an affine copy of the grid;
# * `neighbour_warmup=(TAU, ...)`: in the first epochs the mixture prior reads *every* memory
#   entry, so that matching frames far apart in state space pull their states together; $K$
#   then falls to 5 (call `model.training_epoch(epoch)` before each epoch; `pyro_seq.train.fit`
#   does it for you);
# * `wall_lr_multiplier=10`: the wall network learns at $10^{-2}$ (it does not learn the walls
#   at $10^{-3}$). With plain `SVI` the per-parameter rates come from a Pyro optimizer callable
#   and `pyro_seq.train.lr_multiplier`; `fit` applies `model.lr_multipliers` itself.

# %%
from pyro_seq.train import lr_multiplier

model = GTMSM(
    tau=TAU,
    hidden_dims=(64,) if SMOKE else (256, 256),
    displacements="inverse_pairs",
    neighbour_warmup=(TAU, max(1, 2 * EPOCHS // 3)),
    wall_lr_multiplier=10,
)
optim = ClippedAdam(lambda name: {"lr": 1e-3 * lr_multiplier(model, name), "clip_norm": 50.0})
svi = SVI(model.model, model.guide, optim, Trace_ELBO())
x_test, a_test = test.frames.flatten(2), test.actions
g = torch.Generator().manual_seed(0)
curve = []
start = time.time()
batch = 16
for epoch in range(EPOCHS):
    model.train()
    model.training_epoch(epoch)  # this epoch's K of the warm-up
    order = torch.randperm(NUM_TRAIN, generator=g)
    for i in range(0, NUM_TRAIN, batch):
        idx = order[i : i + batch]
        svi.step(frames[idx], None, inputs=train.actions[idx])
    model.eval()  # the bound of the model itself: K = 5
    with torch.no_grad():
        model.tau = TAU
        x_val = frames[:8]
        bound = (
            -Trace_ELBO().loss(model.model, model.guide, x_val, None, inputs=train.actions[:8])
            / x_val.shape[0]
        )
    curve.append(bound)
    print(f"epoch {epoch + 1}: ELBO {bound:.1f} nats per sequence ({PRED} prediction steps)")
metrics["train_seconds"] = time.time() - start
metrics["elbo_per_sequence"] = curve
fig, ax = plt.subplots(figsize=(5, 3.2), layout="constrained")
ax.plot(range(1, EPOCHS + 1), curve, marker="o")
ax.set_xlabel("epoch")
ax.set_ylabel("ELBO (nats per sequence)")
fig.savefig(OUT / "elbo_curve.png", dpi=110)
plt.close(fig)
show_inline(OUT / "elbo_curve.png")

# %% [markdown]
# FIVO by `loss=` alone: the states are per-particle state of the step protocol, the memory is
# shared by the particles; with the transition as proposal, resampling keeps the positions whose
# memory explains the frame.

# %%
fivo = SVI(
    model.model, model.guide, ClippedAdam({"lr": 1e-3, "clip_norm": 50.0}), FIVO(num_particles=4)
)
fivo_losses = [fivo.step(frames[:8], None, inputs=train.actions[:8]) for _ in range(2)]
metrics["fivo_losses"] = fivo_losses
print("FIVO losses", fivo_losses)
assert all(math.isfinite(v) for v in fivo_losses)

# %% [markdown]
# ## 4. Long-term prediction
#
# On test sequences the model memorises $\tau$ steps and then predicts every later frame from
# the actions alone (256 steps in the full run, as in the thesis' tests): the noise-free states
# $\mathbb{E}[s_t]$, the prior mean of the memory mixture, the decoded frame. The error per
# prediction step is compared with predicting the mean frame of the memorisation phase.

# %%
pred = model.predict(x_test, a_test)
truth = x_test[:, TAU:]
err = (pred["frames"] - truth).abs().mean(-1)  # (N, T - tau)
baseline = (x_test[:, :TAU].mean(1, keepdim=True) - truth).abs().mean(-1)
metrics["frame_error_per_step"] = err.mean(0).tolist()
metrics["mean_frame_error_per_step"] = baseline.mean(0).tolist()
fig, ax = plt.subplots(figsize=(5, 3.2), layout="constrained")
steps = range(1, err.shape[1] + 1)
ax.plot(steps, err.mean(0), label="GTM-SM")
ax.plot(steps, baseline.mean(0), label="mean memorised frame")
ax.set_xlabel("prediction step")
ax.set_ylabel("mean |pixel error|")
ax.legend()
fig.savefig(OUT / "frame_error.png", dpi=110)
plt.close(fig)
show_inline(OUT / "frame_error.png")

shown = torch.linspace(0, truth.shape[1] - 1, min(8, truth.shape[1])).long().tolist()
fig, axes = plt.subplots(2, len(shown), figsize=(1.4 * len(shown), 3), layout="constrained")
for j, t in enumerate(shown):
    axes[0, j].imshow(truth[0, t].reshape(8, 8), cmap="gray", vmin=0, vmax=1)
    axes[1, j].imshow(pred["frames"][0, t].reshape(8, 8).clamp(0, 1), cmap="gray", vmin=0, vmax=1)
    axes[0, j].set_title(f"t={TAU + t + 1}", fontsize=8)
for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
axes[0, 0].set_ylabel("truth")
axes[1, 0].set_ylabel("predicted")
fig.savefig(OUT / "predictions.png", dpi=110)
plt.close(fig)
show_inline(OUT / "predictions.png")

# %% [markdown]
# The states the model learnt against the true positions (Fig. 7.2c): a good model uses
# $s_t$ as a rotated and stretched copy of the grid, which a linear map from $s_t$ to the
# position measures ($R^2$, 1 is perfect).

# %%
s = torch.cat([pred["memory_states"], pred["states"]], 1).reshape(-1, 2)
target = test.positions.reshape(-1, 2).float()
design = torch.cat([s, torch.ones(s.shape[0], 1)], -1)
coef = torch.linalg.lstsq(design, target).solution
resid = target - design @ coef
r2 = 1 - resid.pow(2).sum(0) / (target - target.mean(0)).pow(2).sum(0)
metrics["state_position_r2"] = r2.tolist()
print("R^2 of a linear map from s_t to the (row, col) position:", r2.tolist())
fig, axes = plt.subplots(1, 2, figsize=(8, 3.6), layout="constrained")
m_states = pred["memory_states"][0]
axes[0].scatter(m_states[:, 0], m_states[:, 1], c=range(TAU), cmap="viridis", s=8)
axes[0].set_title("learnt states (memorisation)")
p0 = test.positions[0, :TAU].float()
axes[1].scatter(p0[:, 1], p0[:, 0], c=range(TAU), cmap="viridis", s=8)
axes[1].invert_yaxis()
axes[1].set_title("true positions (col, row)")
fig.savefig(OUT / "states_vs_positions.png", dpi=110)
plt.close(fig)
show_inline(OUT / "states_vs_positions.png")

# %% [markdown]
# **When the actions are not enough: landmarks.** Here the guide infers $s_t$ from the actions
# only (the prior transition, thesis eq. 7.2), which works because $\sigma_d$ can learn the
# fixed walls. With an obstacle at a random place in every environment
# (`image_navigation(obstacles=True)`, thesis 7.10.1) a blocked move looks like any other move
# to the transition. `GTMSM(inference="landmark")` is the inference network of thesis appendix
# 7.10: a *reversed* DND keyed by frame codes returns the states stored where the agent saw a
# similar frame, and $q(s_t \mid s_{t-1}, a_t, z_t, m)$ moves the prior mean toward them,
# $\mu_q = \mu_p + \sum_k \beta_k (\mu_k - \mu_p)$, with learnt weights $\beta_k \in [0, 1]$ of
# the code distances and a learnt correction of the log-variance. Seeing the same frame again
# after a blocked move then keeps the state where it was. Training is unchanged (`loss=` as
# above); the bound gains a KL term for the states.

# %%
with open(OUT / "metrics.json", "w") as fh:
    json.dump(metrics, fh, indent=1)
print(json.dumps(metrics, indent=1))
