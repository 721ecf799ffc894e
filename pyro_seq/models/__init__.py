"""Sequence architectures as Pyro model/guide pairs sharing the step protocol of ``base``.

What every model declares is in :mod:`pyro_seq.models.contract`. The helpers a model of your own
needs (see ``tutorials/custom_model.py``) are exported here too: :func:`normal`,
:func:`shift_right`, :func:`masked`, :func:`stack_time`, :func:`make_emission` and
:func:`stack_params`.
"""

from typing import Dict, Type

from pyro_seq.models.base import (
    SequenceModel,
    StepProgram,
    check_sequences,
    masked,
    normal,
    shift_right,
    stack_time,
)
from pyro_seq.models.collaborative_rbm import CollaborativeRBM
from pyro_seq.models.contract import EnergyBasedModel, ModelContract, Unsupported
from pyro_seq.models.dmm import DMM
from pyro_seq.models.emission import make_emission, stack_params
from pyro_seq.models.gtmsm import GTMSM
from pyro_seq.models.kvae import KVAE
from pyro_seq.models.linear_gaussian import LinearGaussianSequenceModel
from pyro_seq.models.rnn_baseline import RNNBaseline
from pyro_seq.models.rtrbm import RTRBM, SRTRBM
from pyro_seq.models.srnn import SRNN
from pyro_seq.models.storn import STORN
from pyro_seq.models.vaernn import VAERNN
from pyro_seq.models.vosp import VOSP
from pyro_seq.models.vrae import VRAE
from pyro_seq.models.vrnn import VRNN

#: The models by the name the command line and the docs use (``pyro-seq train --model NAME``);
#: every surface reads what each declares (:mod:`pyro_seq.models.contract`).
MODELS: Dict[str, Type[ModelContract]] = {
    "dmm": DMM,
    "srnn": SRNN,
    "vrnn": VRNN,
    "vaernn": VAERNN,
    "storn": STORN,
    "vosp": VOSP,
    "vrae": VRAE,
    "rnn": RNNBaseline,
    "kvae": KVAE,
    "gtmsm": GTMSM,
    "lgssm": LinearGaussianSequenceModel,
    "rtrbm": RTRBM,
    "srtrbm": SRTRBM,
    "collaborative_rbm": CollaborativeRBM,
}

__all__ = [
    "MODELS",
    "CollaborativeRBM",
    "DMM",
    "EnergyBasedModel",
    "GTMSM",
    "KVAE",
    "LinearGaussianSequenceModel",
    "ModelContract",
    "RNNBaseline",
    "RTRBM",
    "SRNN",
    "SRTRBM",
    "STORN",
    "SequenceModel",
    "StepProgram",
    "Unsupported",
    "VAERNN",
    "VOSP",
    "VRAE",
    "VRNN",
    "check_sequences",
    "make_emission",
    "masked",
    "normal",
    "shift_right",
    "stack_params",
    "stack_time",
]
