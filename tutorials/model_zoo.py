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
# # The model zoo: every architecture, every objective, one loop
#
# `pyro_seq.models` holds the deep latent-variable models of the source documents as ordinary
# Pyro model/guide pairs on one step protocol:
#
# | class | source |
# |---|---|
# | `DMM` | deep Markov model, thesis 4.3 (Krishnan et al. 2017) |
# | `SRNN` | stochastic RNN, thesis Ch. 5 |
# | `VRNN` | Chung et al. 2015, thesis 4.4.2 |
# | `VAERNN` | thesis 4.4.1 |
# | `STORN` / `VOSP` | Bayer & Osendorfer (2014), sec. 3.2, white or Wiener-process prior |
# | `VRAE` | Bayer & Osendorfer (2014), sec. 3.1 |
# | `RNNBaseline` | the deterministic "plain" RNN of Bayer & Osendorfer (2014), Table 1 (exact log-likelihood) |
#
# This tutorial trains each of them with `pyro.infer.SVI` under three objectives, changing only
# `loss=`: `Trace_ELBO`, `IWAE(K)` and `FIVO(K)`. It scores every trained model on the test set
# with the same estimator, and then imputes missing steps of a test sequence
# (`pyro_seq.tasks.impute`, Bayer & Osendorfer (2014), sec. 4.3) and draws their Fig. 3.
#
# Data: JSB Chorales (`load_dataset("jsb")` finds `jsb_chorales.pickle` in a folder of
# `$PYRO_SEQ_DATA`), else music21's built-in Bach chorales. `PYRO_SEQ_SMOKE=1` runs a short
# version for continuous integration (few sequences, tiny networks, one epoch). Figures and
# metrics go to `$PYRO_SEQ_OUTPUT/model_zoo` (default: a temporary folder; `--out` when run as a
# script): `SMOKE` and `OUT` come from a hidden first cell.

# %% tags=["remove-input"]
# Options (--out, --smoke), the output folder and, in short mode, a banner.
from pyro_seq._tutorial_support import setup

SMOKE, OUT = setup("model_zoo", "every model x every objective on piano rolls")

# %%
import json
import time

import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import ClippedAdam

from pyro_seq.data import SequenceLoader, load_dataset, pad_sequences
from pyro_seq.infer import FIVO, IWAE, estimate_log_likelihood
from pyro_seq.models import DMM, SRNN, STORN, VAERNN, VRAE, VRNN, RNNBaseline
from pyro_seq.tasks import bits_per_element, impute
from pyro_seq.train.plots import plot_recovery
from pyro_seq.train.plots import show_inline as show

torch.set_num_threads(1)
pyro.set_rng_seed(0)

# %% [markdown]
# ## Data

# %%
try:  # jsb_chorales.pickle in a folder of $PYRO_SEQ_DATA
    data, data_name = load_dataset("jsb"), "JSB Chorales"
except FileNotFoundError:
    data, data_name = load_dataset("chorales", progress=False), "music21 Bach chorales"
if SMOKE:
    data = {k: v[:16] for k, v in data.items()}
print(f"{data_name}: " + ", ".join(f"{k} {len(v)}" for k, v in data.items()))

# %% [markdown]
# ## Every model, every objective
# The same `SVI` loop for all of them; only the model and `loss=` change. Sizes are small so
# that the whole grid runs in minutes on a laptop; the benchmark `benchmarks/paper/zoo_jsb.py` uses
# the sizes of each paper.

# %%
D = 88
H = 8 if SMOKE else 64
Z = 4 if SMOKE else 16
MODELS = {
    "DMM": lambda: DMM(D, z_dim=Z, transition_dim=H, emission_dim=H, rnn_dim=H),
    "SRNN": lambda: SRNN(D, d_dim=H, z_dim=Z, hidden_dim=H),
    "VRNN": lambda: VRNN(D, d_dim=H, z_dim=Z, hidden_dim=H, feature_dim=H),
    "VAERNN": lambda: VAERNN(D, d_dim=H, z_dim=Z, hidden_dim=H, skip=True),
    "STORN": lambda: STORN(D, z_dim=Z, rnn_dim=H, emission_dim=H),
    "VRAE": lambda: VRAE(D, z_dim=Z, encoder_dim=H, decoder_dim=H, emission_dim=H),
    "RNN": lambda: RNNBaseline(D, d_dim=H, hidden_dim=H),
}
K = 2 if SMOKE else 4
OBJECTIVES = {
    "ELBO": lambda: Trace_ELBO(),
    f"IWAE({K})": lambda: IWAE(num_particles=K, max_plate_nesting=1),
    f"FIVO({K})": lambda: FIVO(num_particles=K),
}
EPOCHS = 1 if SMOKE else 20
loader = SequenceLoader(data["train"], batch_size=8 if SMOKE else 16, seed=0)
test_x, test_mask = pad_sequences(data["test"])
N = len(data["train"])

results = {}
trained = {}
for model_name, make in MODELS.items():
    for objective_name, make_loss in OBJECTIVES.items():
        pyro.clear_param_store()
        torch.manual_seed(0)
        m = make()
        svi = SVI(m.model, m.guide, ClippedAdam({"lr": 3e-3, "clip_norm": 10.0}), loss=make_loss())
        start = time.perf_counter()
        for epoch in range(EPOCHS):
            for x, mask in loader.batches(epoch):
                svi.step(x, mask, num_sequences=N)
        seconds = time.perf_counter() - start
        m.eval()
        est = estimate_log_likelihood(
            m.model, m.guide, (test_x, test_mask), method="iwae", num_particles=4 if SMOKE else 64
        )
        results[(model_name, objective_name)] = {
            "test_iwae_per_step": est.nats_per_step,
            "train_seconds": seconds,
        }
        trained[(model_name, objective_name)] = m
        print(
            f"{model_name:7s} {objective_name:8s} test IWAE: {est.nats_per_step:8.3f} nats/step "
            f"({seconds:.1f} s)"
        )

# %% [markdown]
# Every cell is scored by the same estimator (IWAE with many particles; higher is better).

# %%
fig, ax = plt.subplots(figsize=(8, 4))
width = 0.8 / len(OBJECTIVES)
for j, objective_name in enumerate(OBJECTIVES):
    values = [results[(m_, objective_name)]["test_iwae_per_step"] for m_ in MODELS]
    ax.bar([i + j * width for i in range(len(MODELS))], values, width, label=objective_name)
ax.set_xticks([i + width for i in range(len(MODELS))], list(MODELS))
ax.set_ylabel("test IWAE bound (nats / step)")
ax.set_title(f"{data_name}: every model under every objective")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "zoo_bounds.png", dpi=120)
plt.close(fig)
show(OUT / "zoo_bounds.png")

# %% [markdown]
# ## Imputation (Bayer & Osendorfer (2014), sec. 4.3)
# Drop 8 consecutive steps of a test sequence, impute them with the best model of the grid,
# and compare with filling them from the training-set note frequencies, in bits per element.

# %%
best = max(results, key=lambda k: results[k]["test_iwae_per_step"])
m = trained[best]
seq = max(data["test"], key=len)
drop = min(8, seq.shape[0] // 2)
x = seq.unsqueeze(0)
observed = torch.ones(1, seq.shape[0], dtype=torch.bool)
start = (seq.shape[0] - drop) // 2
observed[0, start : start + drop] = False
res = impute(m, x, observed, num_iterations=5 if SMOKE else 50)
missing = ~observed[0]
freq = torch.cat(data["train"]).float().mean(0).clamp(1e-6, 1 - 1e-6)


imputed_bits = bits_per_element(res.probs[0, missing], seq[missing])
baseline_bits = bits_per_element(freq.expand(int(missing.sum()), D), seq[missing])
corrupted = torch.where(observed[0, :, None], seq, torch.full_like(seq, float("nan")))
errors = plot_recovery(
    seq,
    corrupted,
    torch.where(observed[0, :, None], seq, (res.probs[0] > 0.5).float()),
    OUT / "imputation.png",
    probs=res.probs[0],
    title=f"{best[0]} ({best[1]})",
)
show(OUT / "imputation.png")
print(
    f"imputation with {best}: {imputed_bits:.3f} bits/element, note frequencies "
    f"{baseline_bits:.3f}; {errors} wrong elements"
)

# %%
metrics = {
    "data": data_name,
    "smoke": SMOKE,
    "epochs": EPOCHS,
    "grid": {f"{m_}/{o}": v for (m_, o), v in results.items()},
    "imputation": {
        "model": list(best),
        "bits_per_element": imputed_bits,
        "baseline_bits_per_element": baseline_bits,
        "dropped_steps": drop,
    },
}
with open(OUT / "metrics.json", "w") as fh:
    json.dump(metrics, fh, indent=1)
