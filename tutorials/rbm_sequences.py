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
# # Energy-based sequence models: an RTRBM on chorales, and RBMs for student answers
#
# Restricted Boltzmann machines have an unnormalised likelihood, so they are trained by
# contrastive divergence instead of a variational bound. In `pyro-seq` they are still ordinary
# Pyro programs: the model observes its data through an energy-based distribution
# (`pyro_seq.distributions.RBM`), the guide is empty (there are no latent sample sites: the
# hidden units are summed out in the free energy), and `pyro.infer.SVI` trains them with
# `loss=ContrastiveDivergence(k)`.
#
# 1. A recurrent temporal RBM (Sutskever et al. 2009; Mittelman et al. 2014) on Bach
#    chorales: CD-k with the gradient through the recursion r_t (BPTT, Mittelman et al. (2014),
#    supplementary material, eqs. 1.16-1.27),
#    its test log-likelihood by annealed importance sampling, and samples as piano rolls and MIDI.
# 2. Collaborative filtering of student answers (Soyer & Möllenhoff): binary, softmax and
#    binomial-softmax RBMs on simulated students, the capped binomial deviance per epoch (their
#    Fig. 4) against a constant, a logistic baseline and the generating model.
#
# `PYRO_SEQ_SMOKE=1` runs a short version for continuous integration. Figures, MIDI files and
# `metrics.json` go to `$PYRO_SEQ_OUTPUT/rbm_sequences` (default: a temporary folder; `--out`
# when run as a script): `SMOKE` and `OUT` come from a hidden first cell.

# %% tags=["remove-input"]
# Options (--out, --smoke), the output folder and, in short mode, a banner.
from pyro_seq._tutorial_support import setup

SMOKE, OUT = setup("rbm_sequences", "RTRBM on chorales and RBMs for student answers")

# %%
import json

import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import SVI
from pyro.optim import Adam

from pyro_seq.baselines import LogisticBaseline
from pyro_seq.data import SequenceLoader, load_dataset, pad_sequences, simulate_students
from pyro_seq.data.midi import piano_roll_to_midi
from pyro_seq.infer import ContrastiveDivergence
from pyro_seq.metrics import capped_binomial_deviance
from pyro_seq.models import RTRBM, CollaborativeRBM
from pyro_seq.train.plots import plot_piano_roll
from pyro_seq.train.plots import show_inline as show

torch.set_num_threads(1)
pyro.set_rng_seed(0)
metrics = {}

# %% [markdown]
# ## 1. An RTRBM on chorales
# Data: music21's Bach chorales, bundled with the `music21` package (no download), as 88-key
# piano rolls.

# %%
data = load_dataset("chorales", progress=False)
if SMOKE:
    data = {k: v[:12] for k, v in data.items()}
print(", ".join(f"{k} {len(v)}" for k, v in data.items()))

# %% [markdown]
# The model: at each step an RBM over the 88 keys whose hidden bias depends on the previous
# step through r_{t-1} (Mittelman et al. (2014), eqs. 1.1-1.2). `model` observes the whole batch through one
# `RBM` site with batch shape (sequences, steps); `guide` does nothing.

# %%
H = 16 if SMOKE else 150
rtrbm = RTRBM(88, num_hidden=H)
rtrbm.init_visible_bias(data["train"])  # c = logit of the note frequencies
cd = ContrastiveDivergence(k=1)
svi = SVI(rtrbm.model, rtrbm.guide, Adam({"lr": 1e-3 if not SMOKE else 3e-3}), loss=cd)
loader = SequenceLoader(data["train"], batch_size=16, seed=0)
epochs = 2 if SMOKE else 100
monitor = []
for epoch in range(epochs):
    total = 0.0
    for x, mask in loader.batches(epoch):
        total += svi.step(x, mask, num_sequences=len(data["train"]))
    monitor.append(total / len(loader))
    if epoch % 10 == 0 or epoch == epochs - 1:
        print(f"epoch {epoch + 1}: reconstruction error per unit {monitor[-1]:.4f}")

# %% [markdown]
# `svi.step` returns CD's monitoring quantity, the mean squared reconstruction error per
# visible unit: CD optimises no bound, so there is no loss value to report. The likelihood
# itself needs the per-step partition functions Z_t; with 150 hidden units they are estimated
# by annealed importance sampling (Salakhutdinov & Murray 2008), each with a standard error.

# %%
test_x, test_mask = pad_sequences(data["test"][: 4 if SMOKE else 20])
est = rtrbm.log_likelihood(
    test_x,
    test_mask,
    method="ais",
    num_chains=20 if SMOKE else 100,
    num_betas=50 if SMOKE else 1000,
    base_visible_bias=rtrbm.c.detach(),
)
steps = int(test_mask.sum())
per_step = float(est.log_likelihood.sum()) / steps
stderr = float(est.stderr.pow(2).sum().sqrt()) / steps
print(f"test log-likelihood (AIS): {per_step:.3f} +- {stderr:.3f} nats per step")
metrics["rtrbm"] = {
    "ais_loglik_per_step": per_step,
    "stderr_per_step": stderr,
    "monitor_per_epoch": monitor,
    "num_hidden": H,
}

# %% [markdown]
# Samples by per-step Gibbs sampling (Mittelman et al. (2014), sec. 1.1), as piano rolls and MIDI files.

# %%
samples, logits = rtrbm.generate(2, 16 if SMOKE else 64, gibbs_steps=20 if SMOKE else 200)
for i in range(samples.shape[0]):
    plot_piano_roll(
        samples[i],
        OUT / f"rtrbm_sample_{i}.png",
        probs=torch.sigmoid(logits[i]),
        title=f"RTRBM sample {i}",
    )
    show(OUT / f"rtrbm_sample_{i}.png")
    piano_roll_to_midi(samples[i], OUT / f"rtrbm_sample_{i}.mid")

# %% [markdown]
# ## 2. RBMs for student answers (Soyer & Möllenhoff)
# Simulated students from a two-parameter logistic item-response model, each answering about
# 2 % of the questions; 20 % of each student's answers are held out. Each student is its own
# sub-RBM over the questions it answered (`SparseRBM`: nothing of size students x questions is
# built).

# %%
students = simulate_students(
    1000 if SMOKE else 10_000, 100 if SMOKE else 1000, 0.1 if SMOKE else 0.02, seed=0
)
tr, te = students.train, students.test
S = students.num_students
floor = float(
    capped_binomial_deviance(students.true_probability(te.student, te.question), te.correct)
)
logistic = LogisticBaseline(S, students.num_questions)
logistic.fit(tr.student, tr.question, tr.correct)
baselines = {
    "always 0.5": 0.30103,
    "logistic": float(
        capped_binomial_deviance(logistic.predict(te.student, te.question), te.correct)
    ),
    "true 2PL model": floor,
}
print(baselines)

# %%
curves = {}
for visible in ("bernoulli", "softmax", "binomial_softmax"):
    pyro.clear_param_store()
    torch.manual_seed(0)
    rbm = CollaborativeRBM(students.num_questions, num_hidden=15, visible=visible, init_scale=0.01)
    svi = SVI(rbm.model, rbm.guide, Adam({"lr": 0.03}), loss=ContrastiveDivergence(k=1))
    curve = []
    for epoch in range(3 if SMOKE else 30):
        for b in students.batches(1000, seed=epoch):
            svi.step(b.row, b.question, b.answer, b.student.shape[0], S)
        p = rbm.predict(tr.student, tr.question, tr.answer, S, te.student, te.question)
        curve.append(float(capped_binomial_deviance(p, te.correct)))
    curves[visible] = curve
    print(f"{visible}: test CBD per epoch {[round(c, 4) for c in curve]}")
metrics["cf"] = {"baselines": baselines, "curves": curves}

# %% [markdown]
# Soyer & Möllenhoff's Fig. 4: test capped binomial deviance per epoch, with the baselines as lines.
# On these simulated data the logistic baseline is nearly the generating model (a 2PL model
# without the discriminations), which is hard for an RBM to beat; see `docs/benchmarks.rst`.

# %%
fig, ax = plt.subplots(figsize=(6, 4))
for name, curve in curves.items():
    ax.plot(range(1, len(curve) + 1), curve, label=name)
for (name, value), style in zip(baselines.items(), (":", "--", "-.")):
    ax.axhline(value, color="k", linestyle=style, linewidth=1, label=name)
ax.set_xlabel("epoch")
ax.set_ylabel("test capped binomial deviance")
ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(OUT / "cf_cbd.png", dpi=120)
plt.close(fig)
show(OUT / "cf_cbd.png")
with open(OUT / "metrics.json", "w") as fh:
    json.dump(metrics, fh, indent=1)
