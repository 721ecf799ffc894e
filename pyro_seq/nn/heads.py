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

    def scale(self, raw):
        """The standard deviation from the raw output ``r`` (see the class docstring)."""
        if self.variance == "log":
            return self.min_scale + torch.exp(0.5 * raw)
        return self.min_scale + softplus(raw)

    def forward(self, h):
        return self.loc(h), self.scale(self.raw_scale(h))

    def fused_weights(self):
        """``(W, b)``: the weights ``(2 out_dim, in_dim)`` and biases ``(2 out_dim,)`` of the loc
        and raw-scale layers stacked, so that one ``F.linear(h, W, b)`` gives ``[loc, r]``
        (for :meth:`from_fused`; built once and used at many steps, it halves the number of
        small matrix products of a recurrence)."""
        return (
            torch.cat([self.loc.weight, self.raw_scale.weight]),
            torch.cat([self.loc.bias, self.raw_scale.bias]),
        )

    def from_fused(self, out):
        """``(loc, scale)`` from ``out = F.linear(h, *fused_weights())`` ``(..., 2 out_dim)``:
        equal to ``forward(h)``."""
        loc, raw = out.split(self.loc.out_features, dim=-1)
        return loc, self.scale(raw)


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

    A recurrence that calls :meth:`forward` at every step passes ``weights=step_weights()``,
    computed once per sequence pass: the ``W_z`` block then is cut from the first layer once
    (cutting it at every step makes every step's backward fill a gradient of the whole first
    layer) and the two output layers run as one product (:meth:`GaussianHead.fused_weights`).
    Results are the same.
    """

    def __init__(
        self, z_dim, context_dim, hidden_dim, out_dim, activation, min_scale, variance="softplus"
    ):
        super().__init__()
        self.z_dim = z_dim
        self.first = nn.Linear(z_dim + context_dim, hidden_dim)
        self.activation = make_activation(activation)
        self.head = GaussianHead(hidden_dim, out_dim, min_scale, variance)

    def project_context(self, context):
        return F.linear(context, self.first.weight[:, self.z_dim :], self.first.bias)

    def step_weights(self):
        """``(W_z, W_head, b_head)`` for :meth:`forward` at many steps of one sequence pass:
        ``W_z (hidden, z_dim)`` the ``z`` block of the first layer, ``W_head, b_head`` the fused
        output layers. Build them again after the parameters change (they are views and copies
        made now, with their own autograd history)."""
        return (self.first.weight[:, : self.z_dim],) + self.head.fused_weights()

    def forward(self, z, projected_context, weights=None):
        """``(loc, scale)`` of eq. 5.3 / 5.10 from ``z`` and the projected context of one step
        (or of all steps, time at dim -2); ``weights`` from :meth:`step_weights` or None."""
        if weights is None:
            hidden = F.linear(z, self.first.weight[:, : self.z_dim]) + projected_context
            return self.head(self.activation(hidden))
        w_z, w_head, b_head = weights
        hidden = F.linear(z, w_z) + projected_context
        return self.head.from_fused(F.linear(self.activation(hidden), w_head, b_head))
