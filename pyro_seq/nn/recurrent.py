"""Recurrent encoders over masked ragged batches."""

import torch
import torch.nn as nn

from pyro_seq.nn.gru_scan import ragged_gru
from pyro_seq.nn.ragged import check_lengths
from pyro_seq.nn.relu_scan import ragged_relu_rnn


class _RowPermutation(torch.autograd.Function):
    """``x (N, F)`` -> ``x[perm]`` for an involution ``perm`` (perm[perm] = identity), whose
    gradient is therefore the same row selection: two row copies instead of a ``gather`` and a
    ``scatter_add`` over every element."""

    @staticmethod
    def forward(ctx, x, perm):
        ctx.save_for_backward(perm)
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad):
        (perm,) = ctx.saved_tensors
        return _RowPermutation.apply(grad, perm), None


def reverse_padded(x, lengths):
    """Reverse each sequence within its own length; padded steps stay in place.

    :param torch.Tensor x: ``(batch, T, ...)``.
    :param torch.LongTensor lengths: ``(batch,)`` with ``1 <= lengths <= T``.
    :returns: ``y`` with ``y[b, t] = x[b, lengths[b] - 1 - t]`` for ``t < lengths[b]``.

    The map is its own inverse, so its gradient is the same reversal (one row selection
    each way).
    """
    B, T = x.shape[:2]
    t = torch.arange(T, device=x.device)
    L = lengths.unsqueeze(-1)
    idx = torch.where(t < L, L - 1 - t, t) + T * torch.arange(B, device=x.device).unsqueeze(-1)
    return _RowPermutation.apply(x.reshape(B * T, -1), idx.reshape(-1)).reshape(x.shape)


RNN_CELLS = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}


class ForwardRNN(nn.Module):
    """Causal RNN ``d_t = f(d_{t-1}, u_t)`` from ``d_0 = h0`` (thesis eq. 4.11, SRNN eq. 5.1).

    Padded steps after a sequence's end do not affect its real steps (causality).

    :param int input_dim: input features per step.
    :param int hidden_dim: size of the state.
    :param str cell: ``"gru"`` (SRNN), ``"rnn"`` (ReLU RNN of Pyro's DMM example) or ``"lstm"``.
    :param bool learn_init: learn ``h0`` (default: fixed zeros, as in the thesis).

    Shapes: ``inputs (batch, T, input_dim)`` -> ``(batch, T, hidden_dim)``.
    """

    def __init__(self, input_dim, hidden_dim, cell="gru", learn_init=False):
        super().__init__()
        if cell not in RNN_CELLS:
            raise ValueError(f"unknown cell {cell!r}; choose from {sorted(RNN_CELLS)}")
        kwargs = {"nonlinearity": "relu"} if cell == "rnn" else {}
        self.rnn = RNN_CELLS[cell](input_dim, hidden_dim, batch_first=True, **kwargs)
        self.cell = cell
        if learn_init:
            self.h0 = nn.Parameter(torch.zeros(hidden_dim))
        else:
            self.register_buffer("h0", torch.zeros(hidden_dim))

    def forward(self, inputs, lengths=None):
        """Run over ``inputs (batch, T, input_dim)``; with ``lengths (batch,)`` the outputs after
        each sequence's end are set to zero.

        ReLU RNN, and GRU on the CPU: only the real steps are computed, by
        :func:`~pyro_seq.nn.relu_scan.ragged_relu_rnn` and :func:`~pyro_seq.nn.gru_scan.ragged_gru`
        (one autograd node each; a GRU on a random JSB minibatch of 20 trains about 1.9 times
        as fast as ``torch.nn.GRU`` on the padded batch). LSTM, and GRU on other devices
        (cuDNN's kernels): torch's module on the padded batch, the padded steps computed and
        then discarded (torch's packed sequences were slower on the CPU; docs/benchmarks.rst,
        section "DMM training speed").
        """
        if self.cell == "rnn" or (self.cell == "gru" and inputs.device.type == "cpu"):
            B, T = inputs.shape[:2]
            lengths = check_lengths(lengths, B, T, "ForwardRNN", inputs.device).long()
            r, h0 = self.rnn, self.h0.expand(B, -1)
            if self.cell == "rnn":
                bias = r.bias_ih_l0 + r.bias_hh_l0
                return ragged_relu_rnn(inputs, lengths, h0, r.weight_ih_l0, r.weight_hh_l0, bias)
            return ragged_gru(
                inputs, lengths, h0, r.weight_ih_l0, r.weight_hh_l0, r.bias_ih_l0, r.bias_hh_l0
            )
        h0 = self.h0.expand(1, inputs.shape[0], -1).contiguous()
        init = (h0, torch.zeros_like(h0)) if self.cell == "lstm" else h0
        out, _ = self.rnn(inputs, init)
        if lengths is not None:
            out = out * (
                torch.arange(inputs.shape[1], device=out.device) < lengths.unsqueeze(-1)
            ).unsqueeze(-1)
        return out


class BackwardRNN(ForwardRNN):
    """RNN run backwards in time over ragged sequences: ``a_t = g(a_{t+1}, input_t)``.

    Each sequence starts from ``a_{T_b + 1} = h0`` at its own last real step ``T_b`` (thesis
    eq. 4.8 and 5.7), so padding never leaks into real steps. The states at padded steps are
    unspecified and must be masked by the caller. Arguments as :class:`ForwardRNN`.

    Shapes: ``inputs (batch, T, input_dim)``, ``mask (batch, T)`` -> ``(batch, T, hidden_dim)``.
    """

    def forward(self, inputs, mask):
        lengths = mask.sum(-1)
        return reverse_padded(super().forward(reverse_padded(inputs, lengths), lengths), lengths)
