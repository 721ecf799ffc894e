"""Multi-layer perceptrons and the activations the source papers use."""

import operator

import torch
import torch.nn as nn

from pyro_seq.ops.linalg import broadcast_shapes


class ClippedLeakyReLU(nn.Module):
    """Leaky ReLU clipped to ``[-clip, clip]`` (SRNN supplementary: leakiness 1/3, clip 3)."""

    def __init__(self, negative_slope=1.0 / 3.0, clip=3.0):
        super().__init__()
        self.negative_slope = negative_slope
        self.clip = clip

    def forward(self, x):
        return torch.clamp(nn.functional.leaky_relu(x, self.negative_slope), -self.clip, self.clip)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope:.4g}, clip={self.clip}"


ACTIVATIONS = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
    "clipped_leaky_relu": ClippedLeakyReLU,
}


def make_activation(name):
    """Return a fresh activation module by name (one of :data:`ACTIVATIONS`)."""
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r}; choose from {sorted(ACTIVATIONS)}"
        ) from None


def _width(value):
    """``value`` as an int if it is an integer >= 1 (not a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        value = operator.index(value)
    except TypeError:
        return None
    return value if value >= 1 else None


def layer_widths(hidden_dims, name="hidden_dims"):
    """``hidden_dims`` as a tuple of positive ints (the widths of hidden layers; may be empty).

    :raises TypeError: not a sequence of widths (e.g. a bare int or a string).
    :raises ValueError: an entry that is not a positive int (0, negative, fractional, bool).
    """
    if isinstance(hidden_dims, (str, bytes)) or not hasattr(hidden_dims, "__iter__"):
        raise TypeError(
            f"{name} must be a sequence of layer widths such as (256, 256), got {hidden_dims!r}"
        )
    dims = tuple(hidden_dims)
    for h in dims:
        if _width(h) is None:
            raise ValueError(
                f"{name} must hold positive ints (hidden layer widths), got "
                f"{dims!r}: {h!r} is not a width; drop the layer or make it >= 1"
            )
    return tuple(_width(h) for h in dims)


class MLP(nn.Sequential):
    """``Linear -> act -> ... -> Linear`` on the last dimension.

    :param int in_dim: input features.
    :param hidden_dims: sizes of hidden layers, positive ints (may be empty: a single linear
        map).
    :param int out_dim: output features.
    :param str activation: name of the hidden activation.
    :param bool activate_output: also apply the activation after the last layer.

    Shapes: ``(..., in_dim) -> (..., out_dim)``.

    :raises ValueError: a width (``in_dim``, ``out_dim`` or a ``hidden_dims`` entry) that is
        not a positive int; a zero-width layer would silently make the output a constant.
    """

    def __init__(self, in_dim, hidden_dims, out_dim, activation="relu", activate_output=False):
        hidden_dims = layer_widths(hidden_dims)
        for name, value in (("in_dim", in_dim), ("out_dim", out_dim)):
            if _width(value) is None:
                raise ValueError(f"MLP {name} must be a positive int (features), got {value!r}")
        layers = []
        dims = [in_dim] + list(hidden_dims) + [out_dim]
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(dims) - 2 or activate_output:
                layers.append(make_activation(activation))
        super().__init__(*layers)
        self.in_dim, self.out_dim = in_dim, out_dim


def cat_broadcast(tensors, dim=-1):
    """Concatenate along ``dim`` after broadcasting all other dimensions.

    Lets a per-particle tensor ``(K, batch, a)`` be joined with a shared one ``(batch, b)``.
    """
    shape = broadcast_shapes(*(t.shape[:-1] for t in tensors))
    return torch.cat([t.expand(shape + t.shape[-1:]) for t in tensors], dim=dim)
