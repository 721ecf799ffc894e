"""DMM on the original-resolution JSB Chorales, with the settings of a preset.

Default: the preset ``dmm_jsb_pyro`` (:mod:`pyro_seq.presets`), the settings of Pyro's
examples/dmm.py: z 100, transition 200, emission 100, backward ReLU RNN 600, minibatch 20,
ClippedAdam (lr 3e-4, betas (0.96, 0.999), clip 10, lrd 0.99996, weight decay 2.0), KL
annealing from 0.2 over the first 1000 epochs' worth of updates, Trace_ELBO. Reference: Pyro's
example reaches a test ELBO of -6.87 nats per step after 5000 epochs (Krishnan et al. 2017,
Table 3, report -6.93). ``--preset dmm_jsb``: the residual guide Res_q with Adam 3e-3 and the
plateau schedule (the run recorded as ``jsb_dmm_fast_lr3e-3.json``); ``--preset
dmm_jsb_krishnan``: the networks and the regularisation of the authors' code (LSTM recognition
network, non-residual combiner, emission MLP of 200 units; KL annealing over 5000 updates,
recognition dropout 0.1, L2, Adam 8e-4). The settings live in the presets only, so that
``pyro-seq train --preset NAME`` and this script cannot drift apart.

    python benchmarks/paper/jsb_dmm.py --time-limit 3600      # run again to resume
    python benchmarks/paper/jsb_dmm.py --preset dmm_jsb --tag fast_lr3e-3
    python benchmarks/paper/jsb_dmm.py --preset dmm_jsb_krishnan --tag krishnan_lstm

Every training option of ``jsb_training.run`` can be changed on the command line (over the
preset's values), and ``--residual`` gives the guide the residual parameterisation Res_q
(thesis 4.8.1), ``--model-option KEY=VALUE`` any other DMM option (e.g. ``rnn_cell=lstm``);
a variant needs its own ``--tag`` (checkpoint folder and result name).
"""

import argparse
import json
import sys

from jsb_training import run

from pyro_seq.models import DMM
from pyro_seq.presets import get_preset

#: The presets this script trains; the first is the default (result ``jsb_dmm.json``).
PRESETS = ("dmm_jsb_pyro", "dmm_jsb", "dmm_jsb_krishnan")
PRESET = get_preset(PRESETS[0])
MODEL = dict(PRESET.model_options)
CONFIG = PRESET.train_config()  # the settings of the recorded runs

if __name__ == "__main__":
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset", choices=PRESETS, default=PRESETS[0], help="the settings")
    pre.add_argument("--residual", action="store_true", help="Res_q guide (DMM(residual=True))")
    pre.add_argument(
        "--model-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a DMM constructor option over the preset's (JSON value), repeatable",
    )
    known, rest = pre.parse_known_args(sys.argv[1:])
    preset = get_preset(known.preset)
    overrides = {}
    for item in known.model_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--model-option takes KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value  # a bare word such as lstm
    if (known.preset != PRESETS[0] or known.residual or overrides) and not any(
        a == "--tag" or a.startswith("--tag=") for a in rest
    ):
        raise SystemExit(
            f"--preset {known.preset}, --residual or --model-option is a variant: give it a --tag"
        )
    model = dict(preset.model_options, **({"residual": True} if known.residual else {}))
    model.update(overrides)
    run(
        "jsb_dmm",
        preset.data_file,
        lambda: DMM(88, **model),
        model,
        preset.train_config(),
        argv=rest,
        target=preset.published,
        reference=f"{preset.source}: test ELBO {preset.published} nats/step",
        eval_seeds=preset.evaluation.seeds,
    )
