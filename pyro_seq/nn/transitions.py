"""Transition and combiner blocks of deep state-space models (Krishnan et al. 2017)."""

import torch
import torch.nn as nn
from torch.nn.functional import relu, softplus


class GatedTransition(nn.Module):
    """Gated transition ``p(z_t | z_{t-1}) = N(loc, diag(scale^2))`` (Krishnan et al. 2017, eq. 8).

    ``g = sigmoid(W_2 relu(W_1 z))``, ``h = W_4 relu(W_3 z)``,
    ``loc = (1 - g) * (W_0 z) + g * h`` (the linear path starts as the identity),
    ``scale = min_scale + softplus(W_s relu(h))``. The gate lets the model use linear dynamics
    for some latent dimensions and nonlinear ones for others (thesis 4.3).

    Shapes: ``z_prev (..., z_dim) -> (loc, scale)`` each ``(..., z_dim)``.
    """

    def __init__(self, z_dim, hidden_dim, min_scale=1e-3):
        super().__init__()
        self.gate_hidden = nn.Linear(z_dim, hidden_dim)
        self.gate = nn.Linear(hidden_dim, z_dim)
        self.proposal_hidden = nn.Linear(z_dim, hidden_dim)
        self.proposal = nn.Linear(hidden_dim, z_dim)
        self.linear = nn.Linear(z_dim, z_dim)
        self.raw_scale = nn.Linear(z_dim, z_dim)
        nn.init.eye_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.min_scale = min_scale

    def forward(self, z_prev):
        gate = torch.sigmoid(self.gate(relu(self.gate_hidden(z_prev))))
        proposed = self.proposal(relu(self.proposal_hidden(z_prev)))
        loc = (1 - gate) * self.linear(z_prev) + gate * proposed
        scale = self.min_scale + softplus(self.raw_scale(relu(proposed)))
        return loc, scale


class Combiner(nn.Module):
    """Structured-inference combiner ``q(z_t | z_{t-1}, a_t)`` (Krishnan et al. 2017, eq. 11).

    ``h = (tanh(W z_{t-1}) + a_t) / 2``, ``loc = W_l h``, ``scale = min_scale + softplus(W_s h)``,
    with ``a_t`` the backward-RNN state summarising ``x_{t:T}`` (thesis eq. 4.8-4.9).

    Shapes: ``z_prev (..., z_dim)``, ``a (..., rnn_dim)`` -> ``(loc, scale)`` each ``(..., z_dim)``.

    In a loop over time, pass ``heads=combiner.stacked_heads()`` (computed once per pass): the
    loc and scale layers then run as one matrix product per step.
    """

    def __init__(self, z_dim, rnn_dim, min_scale=1e-3):
        super().__init__()
        self.z_to_hidden = nn.Linear(z_dim, rnn_dim)
        self.loc = nn.Linear(rnn_dim, z_dim)
        self.raw_scale = nn.Linear(rnn_dim, z_dim)
        self.min_scale = min_scale

    def stacked_heads(self):
        """``(W, b)``: the loc and scale layers stacked, ``(2 z_dim, rnn_dim)`` and ``(2 z_dim,)``."""
        return (
            torch.cat([self.loc.weight, self.raw_scale.weight]),
            torch.cat([self.loc.bias, self.raw_scale.bias]),
        )

    def forward(self, z_prev, a, heads=None):
        h = 0.5 * (torch.tanh(self.z_to_hidden(z_prev)) + a)
        if heads is None:
            return self.loc(h), self.min_scale + softplus(self.raw_scale(h))
        loc, raw_scale = torch.nn.functional.linear(h, *heads).chunk(2, dim=-1)
        return loc, self.min_scale + softplus(raw_scale)
