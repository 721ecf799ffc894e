"""DMM on the original-resolution JSB Chorales, settings of Pyro's examples/dmm.py.

z 100, transition 200, emission 100, backward ReLU RNN 600, minibatch 20, ClippedAdam
(lr 3e-4, betas (0.96, 0.999), clip 10, lrd 0.99996, weight decay 2.0), KL annealing from 0.2
over the first 1000 epochs' worth of updates, Trace_ELBO. Reference: Pyro's example reaches a
test ELBO of -6.87 nats per step after 5000 epochs (Krishnan et al. 2017 report -6.926).

    python benchmarks/paper/jsb_dmm.py --time-limit 3600      # run again to resume

Every training option of ``jsb_training.run`` can be changed on the command line, and
``--residual`` gives the guide the residual parameterisation Res_q (thesis 4.8.1); a variant
needs its own ``--tag`` (checkpoint folder and result name).
"""

import argparse
import sys

from jsb_training import run

from pyro_seq.models import DMM
from pyro_seq.train import TrainConfig

MODEL = dict(
    z_dim=100,
    transition_dim=200,
    emission_dim=100,
    rnn_dim=600,
    inference="smoothing",
    rnn_cell="rnn",
)
CONFIG = TrainConfig(
    epochs=5000,
    batch_size=20,
    lr=3e-4,
    betas=(0.96, 0.999),
    clip_norm=10.0,
    lrd=0.99996,
    weight_decay=2.0,
    kl_start=0.2,
    kl_anneal_steps=12 * 1000,
    patience=None,
    valid_batch_size=80,
    seed=0,
    lr_schedule="constant",
    init="none",
)  # the settings of the recorded runs

if __name__ == "__main__":
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--residual", action="store_true", help="Res_q guide (DMM(residual=True))")
    known, rest = pre.parse_known_args(sys.argv[1:])
    model = dict(MODEL, residual=True) if known.residual else MODEL
    run(
        "jsb_dmm",
        "jsb_chorales.pickle",
        lambda: DMM(88, **model),
        model,
        CONFIG,
        argv=rest,
        target=-6.87,
        reference="Pyro examples/dmm.py: test ELBO -6.87 nats/step after 5000 epochs",
    )
