"""Objectives and inference algorithms, as :class:`pyro.infer.ELBO` subclasses where they train.

* :class:`IWAE` (standard or DReG gradients) and :class:`FIVO` (SMC bound on the step protocol):
  swap them for ``Trace_ELBO`` with ``loss=``.
* :class:`ContrastiveDivergence`: CD-k and persistent CD for energy-based models (RBM, RTRBM).
* :class:`LatentScale` (KL annealing), :func:`linear_schedule`, :class:`FreeBits_ELBO`.
* :func:`estimate_log_likelihood`: IWAE / SMC estimates of log p(x) in nats per step.
* :func:`lgssm_em`: EM for the linear-Gaussian state-space model.
"""

from pyro_seq.infer.annealing import FreeBits_ELBO, LatentScale, linear_schedule
from pyro_seq.infer.contrastive_divergence import ContrastiveDivergence
from pyro_seq.infer.estimate import LikelihoodEstimate, estimate_log_likelihood
from pyro_seq.infer.fivo import FIVO
from pyro_seq.infer.iwae import IWAE
from pyro_seq.infer.lgssm_em import (
    OBSERVATION_COV_STRUCTURES,
    EMResult,
    LGSSMParams,
    em_step,
    lgssm_em,
    lgssm_log_likelihood,
)

__all__ = [
    "ContrastiveDivergence",
    "OBSERVATION_COV_STRUCTURES",
    "EMResult",
    "FIVO",
    "FreeBits_ELBO",
    "IWAE",
    "LGSSMParams",
    "LatentScale",
    "LikelihoodEstimate",
    "em_step",
    "estimate_log_likelihood",
    "lgssm_em",
    "lgssm_log_likelihood",
    "linear_schedule",
]
