"""Sequence architectures as Pyro model/guide pairs sharing the step protocol of ``base``."""

from pyro_seq.models.base import SequenceModel, StepProgram, check_sequences
from pyro_seq.models.collaborative_rbm import CollaborativeRBM
from pyro_seq.models.dmm import DMM
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

__all__ = ["CollaborativeRBM", "DMM", "GTMSM", "KVAE", "LinearGaussianSequenceModel", "RNNBaseline", "RTRBM", "SRNN", "SRTRBM", "STORN", "SequenceModel",
           "StepProgram", "VAERNN", "VOSP", "VRAE", "VRNN", "check_sequences"]
