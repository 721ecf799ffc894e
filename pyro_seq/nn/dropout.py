"""Dropout as a model option (standard, inverted dropout in training mode only): the stand-in
for the fast dropout of Bayer & Osendorfer (2014) in STORN, VOSP and VRAE, and the recognition
RNN's dropout of Krishnan et al. (2017) in the DMM. In ``eval()`` mode a model is exactly the
model without the option."""

import numbers
from collections import OrderedDict
from typing import Any

import torch
import torch.nn as nn

__all__ = ["TrainingDropout", "check_dropout", "emission_dropout"]


def check_dropout(dropout: Any) -> float:
    """The ``dropout`` option of the DMM, STORN, VOSP and VRAE: a probability
    ``0 <= dropout < 1``.

    :raises TypeError: not a real number (a bool included).
    :raises ValueError: outside ``[0, 1)`` (NaN included).
    """
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real):
        raise TypeError(
            f"dropout must be a number with 0 <= dropout < 1 (the probability of zeroing a "
            f"unit), got {dropout!r} of type {type(dropout).__name__}"
        )
    p = float(dropout)
    if not 0.0 <= p < 1.0:
        raise ValueError(
            f"dropout must satisfy 0 <= dropout < 1 (the probability of zeroing a unit), got "
            f"dropout={dropout!r}; use 0 for no dropout"
        )
    return p


class TrainingDropout(nn.Module):
    r"""Standard (inverted) dropout (Srivastava et al. 2014) in training mode: every element of
    ``u`` is zeroed with probability ``p`` and the others are scaled by :math:`1 / (1 - p)`, so
    :math:`\mathbb{E}[\tilde u] = u`. In ``eval()`` mode, and for ``p = 0``, the identity (no
    random numbers are drawn). Shapes: ``(...) -> (...)``; no parameters."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = check_dropout(p)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return u
        return nn.functional.dropout(u, self.p, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def emission_dropout(emitter: nn.Module, p: float) -> nn.Module:
    """``emitter`` (from :func:`~pyro_seq.models.emission.make_emission` with one hidden layer:
    ``MLP(Linear, act, Linear)`` or ``Sequential(MLP(Linear, act), head)``) with
    :class:`TrainingDropout` ``(p)`` on the input of its last child, i.e. on the hidden layer.

    The new child is named ``"dropout"`` and has no parameters, so the parameter names (and
    checkpoints) are those of ``emitter``; for ``p = 0`` ``emitter`` itself is returned.
    """
    p = check_dropout(p)
    if p == 0.0:
        return emitter
    if not isinstance(emitter, nn.Sequential) or len(emitter) < 2:
        raise TypeError(
            f"emission_dropout needs an nn.Sequential emitter with a hidden layer before its "
            f"output layer, got {type(emitter).__name__}"
        )
    children = list(emitter.named_children())
    layers = children[:-1] + [("dropout", TrainingDropout(p))] + children[-1:]
    return nn.Sequential(OrderedDict(layers))
