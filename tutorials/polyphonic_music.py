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
# # Polyphonic music with deep state-space models: DMM and SRNN, three objectives
#
# This tutorial trains two of the architectures of `pyro_seq.models`, the deep Markov model
# (DMM) and the stochastic RNN (SRNN), on piano rolls of Bach chorales and shows the three things
# a Pyro user does with them:
#
# 1. train a model/guide pair with `pyro.infer.SVI` (here also through `pyro_seq.train.fit`,
#    which adds a learning-rate schedule, early stopping, checkpoints and logs);
# 2. swap the objective by changing `loss=` only: `Trace_ELBO`, `IWAE`, `FIVO`;
# 3. evaluate bounds on log p(x) in nats per time step (ELBO, IWAE and SMC estimators) and
#    listen to samples (MIDI) or look at them (piano-roll PNG).
#
# Data: `load_dataset("chorales")` builds 88-key piano rolls from the Bach chorales bundled
# with music21 (no download). This is **not** the Boulanger-Lewandowski JSB split, so the
# numbers are not comparable with published ones; the full run uses that split instead when
# `load_dataset("jsb")` finds `jsb_chorales.pickle` in a folder of `$PYRO_SEQ_DATA`.
#
# Run it as a script (`python tutorials/polyphonic_music.py [--out DIR]`) or as a notebook with
# jupytext. `PYRO_SEQ_SMOKE=1` runs a short version (40 chorales, tiny networks, two epochs)
# for continuous integration; the full version trains for about ten minutes on two CPU cores.
# Figures, MIDI files and `metrics.json` go to `$PYRO_SEQ_OUTPUT/polyphonic_music` (default: a
# temporary folder; `--out` when run as a script): `SMOKE` and `OUT` come from a hidden first
# cell.

# %% tags=["remove-input"]
# Options (--out, --smoke), the output folder and, in short mode, a banner.
from pyro_seq._tutorial_support import setup

SMOKE, OUT = setup("polyphonic_music", "DMM and SRNN on Bach chorales")

# %%
import json

import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import ClippedAdam

from pyro_seq.data import SequenceLoader, build_chorales, load_dataset, piano_roll_to_midi
from pyro_seq.data.chorales import chorale_paths
from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models import DMM, SRNN
from pyro_seq.train import TrainConfig, evaluate_bound, fit
from pyro_seq.train.plots import plot_piano_roll
from pyro_seq.train.plots import show_inline as show

torch.set_num_threads(1)  # many small operations per step: one thread is fastest
torch.manual_seed(0)
metrics = {"smoke": SMOKE}

# %% [markdown]
# ## Data
# Each sequence is a float tensor `(T_i, 88)` of 0/1; `SequenceLoader` pads a minibatch to
# `x (batch, T, 88)` with a boolean `mask (batch, T)`.

# %%
if SMOKE:  # the first 40 of music21's chorales
    rolls, _ = build_chorales(chorale_paths()[:40], progress=False)
    data = {k: [r.float() for r in v] for k, v in rolls.items()}
else:
    try:  # jsb_chorales.pickle in a folder of $PYRO_SEQ_DATA
        data = load_dataset("jsb")
    except FileNotFoundError:
        data = load_dataset("chorales", progress=False)
print({k: len(v) for k, v in data.items()})
plot_piano_roll(data["train"][0], OUT / "training_example.png", title="a training chorale")
show(OUT / "training_example.png")

# %% [markdown]
# ## A model/guide pair trained by SVI
# The full run's SRNN has a deterministic GRU state of 128, a latent state of 32 and MLPs of
# 200 units, smaller than in the SRNN paper's music experiments (GRU 300, z 100, MLPs of 500;
# Fraccaro (2018), Ch. 5, experimental setup) so that it trains in minutes on a CPU.
# `srnn.model` and `srnn.guide` are ordinary Pyro programs: the loop below is all SVI needs.
# (Inside the ELBO the model scores all time steps at once; see
# {doc}`the design notes <../design>`.)

# %%
sizes = (
    dict(d_dim=16, z_dim=4, hidden_dim=16) if SMOKE else dict(d_dim=128, z_dim=32, hidden_dim=200)
)
pyro.clear_param_store()
srnn = SRNN(88, **sizes)
svi = SVI(srnn.model, srnn.guide, ClippedAdam({"lr": 3e-3}), loss=Trace_ELBO())
loader = SequenceLoader(data["train"], batch_size=16, seed=0)
for x, mask in loader.batches(0):
    loss = svi.step(x, mask)
print(f"one epoch by hand: last minibatch loss {loss / mask.sum().item():.3f} nats per step")

# %% [markdown]
# ## The same, with annealing, checkpoints and logs: `pyro_seq.train.fit`
# `fit` runs SVI with ClippedAdam, evaluates the validation ELBO after each epoch, keeps the best
# weights, and can be resumed. Its defaults do not anneal the KL term; this configuration does
# (beta from 0.2 to 1 over 300 updates, Fraccaro (2018), sec. 4.8.1), as the command line's
# `pyro-seq train` does by default.

# %%
epochs = 2 if SMOKE else 40
config = TrainConfig(
    epochs=epochs,
    batch_size=16,
    lr=3e-3,
    init="srnn",
    kl_start=0.2,
    kl_anneal_steps=300,
    time_limit=None if SMOKE else 300,
    progress=False,  # no progress bar on the page
)
history = fit(srnn, data["train"], data["valid"], config, OUT / "srnn_elbo", resume=False)
metrics["srnn_valid_elbo_per_step"] = history[-1]["valid_elbo_per_step"]

# %% [markdown]
# ## Changing the objective is changing `loss=`
# A DMM trained with IWAE (K=4) and another with FIVO (K=4): the same model class, the same
# loop; only the objective differs. `make_objective` (used by `fit`) maps the names to
# `Trace_ELBO`, `IWAE(num_particles=K)` and `FIVO(num_particles=K)`.

# %%
dmm_sizes = dict(z_dim=4, transition_dim=16, emission_dim=16, rnn_dim=16) if SMOKE else {}
for objective, loss in (
    ("iwae", IWAE(num_particles=4, max_plate_nesting=1)),
    ("fivo", FIVO(num_particles=4)),
):
    pyro.clear_param_store()
    torch.manual_seed(0)
    dmm = DMM(88, **dmm_sizes)
    svi = SVI(dmm.model, dmm.guide, ClippedAdam({"lr": 3e-3}), loss=loss)
    for epoch in range(1 if SMOKE else 10):
        for x, mask in loader.batches(epoch):
            svi.step(x, mask)
    result = evaluate_bound(dmm, data["test"], method="elbo")
    metrics[f"dmm_{objective}_test_elbo_per_step"] = result["per_step"]
    print(f"DMM trained with {objective}: test ELBO {result['per_step']:.3f} nats/step")

# %% [markdown]
# ## Evaluating bounds in nats per time step
# Total over all test sequences divided by the total number of test steps. The single-sample
# ELBO is the loosest; IWAE and the SMC (FIVO) estimator with K particles are tighter lower
# bounds on log p(x) (in expectation).

# %%
K = 16 if SMOKE else 64
srnn.load_state_dict(torch.load(OUT / "srnn_elbo" / "best.pt", weights_only=True))
bounds = {
    method: evaluate_bound(
        srnn, data["test"], method=method, num_particles=K if method != "elbo" else 1
    )
    for method in ("elbo", "iwae", "smc")
}
for method, result in bounds.items():
    print(
        f"SRNN test {method:4s} (K={result['num_particles']:3d}): {result['per_step']:.3f} nats/step"
    )
    metrics[f"srnn_test_{method}_per_step"] = result["per_step"]
metrics["num_particles"] = K

# %% [markdown]
# ## Listening to the model
# `generate` draws sequences from the generative model; they are written as a piano-roll PNG
# and a MIDI file (quarter notes at 0.25 s per step here).

# %%
samples, logits = srnn.generate(num_sequences=1, num_steps=32 if SMOKE else 64)
plot_piano_roll(
    samples[0], OUT / "srnn_sample.png", probs=torch.sigmoid(logits[0]), title="SRNN sample"
)
show(OUT / "srnn_sample.png")
piano_roll_to_midi(samples[0], OUT / "srnn_sample.mid", step_seconds=0.25)
with open(OUT / "metrics.json", "w") as fh:
    json.dump(metrics, fh, indent=1)
print(json.dumps(metrics, indent=1))
