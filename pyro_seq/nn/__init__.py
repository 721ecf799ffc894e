"""Reusable neural-network blocks (pure torch): MLPs, distribution heads, transitions, RNNs."""

from pyro_seq.nn.heads import BernoulliHead, GaussianHead
from pyro_seq.nn.mlp import MLP, ClippedLeakyReLU, cat_broadcast, make_activation
from pyro_seq.nn.recurrent import BackwardRNN, ForwardRNN, reverse_padded
from pyro_seq.nn.relu_scan import ragged_relu_rnn
from pyro_seq.nn.transitions import Combiner, GatedTransition

__all__ = [
    "BackwardRNN",
    "BernoulliHead",
    "ClippedLeakyReLU",
    "Combiner",
    "ForwardRNN",
    "GatedTransition",
    "GaussianHead",
    "MLP",
    "cat_broadcast",
    "make_activation",
    "ragged_relu_rnn",
    "reverse_padded",
]
