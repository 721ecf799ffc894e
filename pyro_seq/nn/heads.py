"""Distribution heads: map features to the parameters of Gaussian and Bernoulli layers, and
the one-hidden-layer Gaussian MLP with a split first layer of SRNN/VRNN (thesis eq. 5.3, 5.10)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.functional import softplus

from pyro_seq.nn.mlp import make_activation


class GaussianHead(nn.Module):
    """Diagonal Gaussian parameters ``(loc, scale)`` from features.

    Two parameterisations of the scale from ``r = W_s h + b_s``:

    * ``variance="softplus"`` (default): ``scale = min_scale + softplus(r)``, a strictly positive
      floor on the standard deviation (thesis 4.8.1: lower-bounding the variances keeps latent
      units stochastic) and no overflow for large ``r``;
    * ``variance="log"``: ``r`` is the log-variance, ``scale = min_scale + exp(r / 2)``; with
      ``min_scale=0`` this is exactly ``log v = NN(h)`` of thesis eq. 5.3 and 5.10.

    :param int in_dim: feature size.
    :param int out_dim: dimension of the Gaussian.
    :param float min_scale: floor added to the standard deviation.
    :param str variance: ``"softplus"`` or ``"log"``.

    Shapes: ``(..., in_dim) -> ((..., out_dim), (..., out_dim))``.
    """

    VARIANCES = ("softplus", "log")

    def __init__(self, in_dim, out_dim, min_scale=1e-3, variance="softplus"):
        super().__init__()
        if min_scale < 0:
            raise ValueError(f"min_scale must be >= 0, got {min_scale}")
        if variance not in self.VARIANCES:
            raise ValueError(f"variance must be one of {self.VARIANCES}, got {variance!r}")
        self.loc = nn.Linear(in_dim, out_dim)
        self.raw_scale = nn.Linear(in_dim, out_dim)
        self.min_scale = min_scale
        self.variance = variance

    def forward(self, h):
        raw = self.raw_scale(h)
        if self.variance == "log":
            return self.loc(h), self.min_scale + torch.exp(0.5 * raw)
        return self.loc(h), self.min_scale + softplus(raw)


class BernoulliHead(nn.Linear):
    """Bernoulli logits from features: ``(..., in_dim) -> (..., out_dim)`` (a linear layer).

    Logits rather than probabilities keep ``log p(x)`` exact for saturated units.
    """


class GaussianMLP(nn.Module):
    """``(loc, scale)`` of a diagonal Gaussian from an MLP with one hidden layer (eq. 5.3, 5.10).

    The input is ``[z_{t-1}, c_t]`` with a context ``c_t`` (``d_t`` or ``a_t``) known for all
    steps in advance, so the first layer ``W [z, c] + b = W_z z + (W_c c + b)`` is split: the
    context term is computed for every step at once by :meth:`project_context` and only the
    ``z`` term is computed per step. The parameters are those of one ``Linear(z + c, hidden)``.

    Shapes: ``project_context(c (..., T, c_dim)) -> (..., T, hidden)``;
    ``forward(z (..., z_dim), projected (..., hidden)) -> (loc, scale)``, each ``(..., out_dim)``.
    """

    def __init__(self, z_dim, context_dim, hidden_dim, out_dim, activation, min_scale,
                 variance="softplus"):
        super().__init__()
        self.z_dim = z_dim
        self.first = nn.Linear(z_dim + context_dim, hidden_dim)
        self.activation = make_activation(activation)
        self.head = GaussianHead(hidden_dim, out_dim, min_scale, variance)

    def project_context(self, context):
        return F.linear(context, self.first.weight[:, self.z_dim:], self.first.bias)

    def forward(self, z, projected_context):
        hidden = F.linear(z, self.first.weight[:, :self.z_dim]) + projected_context
        return self.head(self.activation(hidden))
