"""pyro_seq.infer"""
from pyro_seq.infer.annealing import FreeBits_ELBO, LatentScale, linear_schedule  # noqa: F401
