"""Observation layers shared by the architectures: a network plus a likelihood family."""

import pyro.distributions as dist
import torch
import torch.nn as nn

from pyro_seq.nn import MLP, GaussianHead


def bernoulli_likelihood(logits):
    """``p(x_t | .) = prod_d Bernoulli(x_td; sigmoid(logits_d))``, event dim 1."""
    return dist.Bernoulli(logits=logits, validate_args=False).to_event(1)


def gaussian_likelihood(params):
    """``p(x_t | .) = prod_d N(x_td; loc_d, scale_d^2)``, event dim 1."""
    loc, scale = params
    return dist.Normal(loc, scale).to_event(1)


def make_emission(likelihood, in_dim, hidden_dims, obs_dim, activation="relu"):
    """Return ``(network, likelihood_fn)`` for ``"bernoulli"`` or ``"gaussian"`` observations.

    The network maps features ``(..., in_dim)`` to the likelihood's parameters; the likelihood
    function maps those to a distribution with event shape ``(obs_dim,)``.
    """
    if likelihood == "bernoulli":
        return MLP(in_dim, hidden_dims, obs_dim, activation), bernoulli_likelihood
    if likelihood == "gaussian":
        body = MLP(in_dim, hidden_dims[:-1], hidden_dims[-1], activation, activate_output=True)
        return nn.Sequential(body, GaussianHead(hidden_dims[-1], obs_dim)), gaussian_likelihood
    raise ValueError(f"likelihood must be 'bernoulli' or 'gaussian', got {likelihood!r}")


def stack_params(params):
    """Stack per-step emission parameters along time (dim 1): tensors or ``(loc, scale)`` pairs."""
    if torch.is_tensor(params[0]):
        return torch.stack(params, 1)
    return tuple(torch.stack(p, 1) for p in zip(*params))
