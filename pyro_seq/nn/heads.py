"""Distribution heads: map features to the parameters of Gaussian and Bernoulli layers."""

import torch
import torch.nn as nn
from torch.nn.functional import softplus


class GaussianHead(nn.Module):
    """Diagonal Gaussian parameters ``(loc, scale)`` from features.

    ``scale = min_scale + softplus(W_s h + b_s)`` keeps a strictly positive variance floor
    (thesis 4.8.1: lower-bounding the variances keeps latent units stochastic).

    :param int in_dim: feature size.
    :param int out_dim: dimension of the Gaussian.
    :param float min_scale: floor added to the standard deviation.

    Shapes: ``(..., in_dim) -> ((..., out_dim), (..., out_dim))``.
    """

    def __init__(self, in_dim, out_dim, min_scale=1e-3):
        super().__init__()
        if min_scale < 0:
            raise ValueError(f"min_scale must be >= 0, got {min_scale}")
        self.loc = nn.Linear(in_dim, out_dim)
        self.raw_scale = nn.Linear(in_dim, out_dim)
        self.min_scale = min_scale

    def forward(self, h):
        return self.loc(h), self.min_scale + softplus(self.raw_scale(h))


class BernoulliHead(nn.Linear):
    """Bernoulli logits from features: ``(..., in_dim) -> (..., out_dim)`` (a linear layer).

    Logits rather than probabilities keep ``log p(x)`` exact for saturated units.
    """
