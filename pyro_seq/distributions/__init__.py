"""pyro_seq.distributions: Pyro distributions of the package (exact LGSSM marginal, Wiener-process
prior, diagonal Gaussian mixture emissions, precomputed-score wrapper, restricted Boltzmann
machines)."""

from pyro_seq.distributions.linear_gaussian_ssm import LGSSMForecast, LinearGaussianSSM
from pyro_seq.distributions.mixture import DiagonalNormalMixture
from pyro_seq.distributions.rbm import RBM, EnergyBasedDistribution
from pyro_seq.distributions.rbm_annealing import AISResult
from pyro_seq.distributions.scored_value import PresampledValue, ScoredValue
from pyro_seq.distributions.sparse_rbm import SparseRBM
from pyro_seq.distributions.wiener import (
    WienerProcess,
    kl_diagonal_normal_wiener,
    wiener_increments,
    wiener_transition,
)

__all__ = [
    "AISResult",
    "DiagonalNormalMixture",
    "EnergyBasedDistribution",
    "LGSSMForecast",
    "LinearGaussianSSM",
    "PresampledValue",
    "RBM",
    "ScoredValue",
    "SparseRBM",
    "WienerProcess",
    "kl_diagonal_normal_wiener",
    "wiener_increments",
    "wiener_transition",
]
