"""pyro_seq.infer"""
from pyro_seq.infer.annealing import FreeBits_ELBO, LatentScale, linear_schedule  # noqa: F401
from pyro_seq.infer.iwae import IWAE  # noqa: F401
from pyro_seq.infer.fivo import FIVO  # noqa: F401
from pyro_seq.infer.lgssm_em import EMResult, LGSSMParams, em_step, lgssm_em, lgssm_log_likelihood  # noqa: F401
from pyro_seq.infer.estimate import LikelihoodEstimate, estimate_log_likelihood  # noqa: F401
