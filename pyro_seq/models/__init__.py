"""Sequence architectures as Pyro model/guide pairs sharing the step protocol of ``base``."""

from pyro_seq.models.base import SequenceModel, StepProgram, check_sequences
from pyro_seq.models.dmm import DMM
from pyro_seq.models.linear_gaussian import LinearGaussianSequenceModel
from pyro_seq.models.srnn import SRNN

__all__ = ["DMM", "LinearGaussianSequenceModel", "SRNN", "SequenceModel", "StepProgram", "check_sequences"]
