"""Reusable neural-network blocks (pure torch): MLPs, distribution heads, transitions, RNNs, the DND memory."""

from pyro_seq.nn.combiner_scan import combiner_scan, residual_combiner_scan
from pyro_seq.nn.conv import ConvEncoder, SubPixelDecoder
from pyro_seq.nn.dropout import TrainingDropout, check_dropout, emission_dropout
from pyro_seq.nn.gru_scan import ragged_gru
from pyro_seq.nn.heads import BernoulliHead, GaussianHead, GaussianMLP
from pyro_seq.nn.init import INIT_SCHEMES, bernoulli_output_layer, init_output_bias, init_weights
from pyro_seq.nn.memory import DND, DNDRead, EarlierRead, nearest_earlier
from pyro_seq.nn.mlp import MLP, ClippedLeakyReLU, cat_broadcast, layer_widths, make_activation
from pyro_seq.nn.ragged import pack_ragged, previous_rows, sequence_lengths, step_offsets
from pyro_seq.nn.recurrent import BackwardRNN, ForwardRNN, reverse_padded
from pyro_seq.nn.relu_scan import ragged_relu_rnn
from pyro_seq.nn.srnn_scan import srnn_guide_scan
from pyro_seq.nn.transitions import Combiner, GatedTransition

__all__ = [
    "BackwardRNN",
    "BernoulliHead",
    "ClippedLeakyReLU",
    "Combiner",
    "ConvEncoder",
    "DND",
    "DNDRead",
    "EarlierRead",
    "ForwardRNN",
    "GatedTransition",
    "GaussianHead",
    "GaussianMLP",
    "INIT_SCHEMES",
    "MLP",
    "SubPixelDecoder",
    "TrainingDropout",
    "bernoulli_output_layer",
    "cat_broadcast",
    "check_dropout",
    "combiner_scan",
    "emission_dropout",
    "init_output_bias",
    "init_weights",
    "layer_widths",
    "make_activation",
    "nearest_earlier",
    "pack_ragged",
    "previous_rows",
    "ragged_gru",
    "ragged_relu_rnn",
    "residual_combiner_scan",
    "reverse_padded",
    "sequence_lengths",
    "srnn_guide_scan",
    "step_offsets",
]
