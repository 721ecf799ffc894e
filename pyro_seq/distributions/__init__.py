"""pyro_seq.distributions"""

from pyro_seq.distributions.linear_gaussian_ssm import LGSSMForecast, LinearGaussianSSM
from pyro_seq.distributions.mixture import DiagonalNormalMixture
from pyro_seq.distributions.scored_value import ScoredValue

__all__ = ["DiagonalNormalMixture", "LGSSMForecast", "LinearGaussianSSM", "ScoredValue"]
