"""pyro_seq.distributions"""

from pyro_seq.distributions.linear_gaussian_ssm import LGSSMForecast, LinearGaussianSSM

__all__ = ["LGSSMForecast", "LinearGaussianSSM"]
