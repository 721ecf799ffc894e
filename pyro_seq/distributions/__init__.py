"""pyro_seq.distributions"""

from pyro_seq.distributions.linear_gaussian_ssm import LGSSMForecast, LinearGaussianSSM
from pyro_seq.distributions.scored_value import ScoredValue

__all__ = ["LGSSMForecast", "LinearGaussianSSM", "ScoredValue"]
