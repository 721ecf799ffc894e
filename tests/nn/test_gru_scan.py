"""``pyro_seq.nn.ragged_gru``: torch.nn.GRU's update over the real steps of a ragged batch, with
a hand-written backward pass. Its values and every gradient (inputs, initial states, weights,
biases) must equal torch.nn.GRU run on each sequence alone, in float64; padded steps hold 0
and pass no gradient. ``ForwardRNN`` / ``BackwardRNN`` with ``cell="gru"`` use it on the CPU
and must equal torch's module on the real steps."""

import pytest
import torch

from pyro_seq.nn import BackwardRNN, ForwardRNN, ragged_gru

F64 = torch.float64


def _torch_gru_per_sequence(gru, x, lengths, h0):
    """torch.nn.GRU on each sequence alone (its real steps only), zeros after its end."""
    outs = []
    for b in range(x.shape[0]):
        L = int(lengths[b])
        o, _ = gru(x[b : b + 1, :L], h0[b].reshape(1, 1, -1))
        outs.append(torch.cat([o[0], o.new_zeros(x.shape[1] - L, o.shape[-1])]))
    return torch.stack(outs)


def _weights(gru):
    return [gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0]


@pytest.mark.parametrize(
    "lengths",
    [[3, 7, 1, 5, 7], [7, 7, 5, 3, 1], [7, 7, 7, 7, 7]],
    ids=["unsorted", "sorted", "full"],
)
def test_values_and_gradients_equal_torch_gru_per_sequence(lengths):
    torch.manual_seed(0)
    B, T, I, H = 5, 7, 3, 4
    gru = torch.nn.GRU(I, H, batch_first=True).double()
    x = torch.randn(B, T, I, dtype=F64, requires_grad=True)
    h0 = torch.randn(B, H, dtype=F64, requires_grad=True)
    lengths = torch.tensor(lengths)
    w = torch.randn(B, T, H, dtype=F64)
    params = [x, h0] + _weights(gru)
    ref = _torch_gru_per_sequence(gru, x, lengths, h0)
    got = ragged_gru(x, lengths, h0, *_weights(gru))
    real = (torch.arange(T) < lengths.unsqueeze(-1)).unsqueeze(-1)
    assert torch.allclose(got, ref, rtol=0, atol=1e-14)
    assert torch.equal(got * ~real, torch.zeros_like(got))
    g_ref = torch.autograd.grad((ref * w).sum(), params)
    g_got = torch.autograd.grad((got * w).sum(), params, retain_graph=True)
    for a, b in zip(g_got, g_ref):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-13)
    # padded inputs get no gradient, and a loss on the padded outputs reaches nothing
    assert torch.equal(g_got[0] * ~real, torch.zeros_like(g_got[0]))
    pad = torch.autograd.grad((got * ~real).sum(), params, allow_unused=True)
    assert all(g is None or not g.any() for g in pad)


def test_gradcheck_and_bad_arguments():
    torch.manual_seed(1)
    B, T, I, H = 3, 4, 2, 3
    gru = torch.nn.GRU(I, H, batch_first=True).double()
    x = torch.randn(B, T, I, dtype=F64, requires_grad=True)
    h0 = torch.randn(B, H, dtype=F64, requires_grad=True)
    lengths = torch.tensor([4, 2, 3])
    weights = [p.detach().clone().requires_grad_() for p in _weights(gru)]
    assert torch.autograd.gradcheck(
        lambda x, h0, *w: ragged_gru(x, lengths, h0, *w), (x, h0, *weights)
    )
    for bad in ([5, 2, 3], [0, 2, 3], [4, 2]):
        with pytest.raises(ValueError, match="ragged_gru: lengths"):
            ragged_gru(x, torch.tensor(bad), h0, *weights)
    with pytest.raises(ValueError, match="ragged_gru: expected"):
        ragged_gru(x, lengths, h0[:, :2], *weights)


def test_forward_and_backward_rnn_use_it_and_equal_torch_module():
    """ForwardRNN / BackwardRNN with a GRU: the ragged scan on the CPU equals torch's module on
    the padded batch (the path other devices take) on the real steps, gradients included,
    with a learned initial state."""
    torch.manual_seed(2)
    x = torch.randn(4, 6, 3, dtype=F64)
    lengths = torch.tensor([6, 2, 4, 1])
    mask = torch.arange(6) < lengths.unsqueeze(-1)
    for cls in (ForwardRNN, BackwardRNN):
        rnn = cls(3, 5, cell="gru", learn_init=True).double()
        with torch.no_grad():
            rnn.h0.normal_()
        arg = lengths if cls is ForwardRNN else mask
        got = rnn(x, arg) * mask.unsqueeze(-1)

        def module_path(v):
            h0 = rnn.h0.expand(1, v.shape[0], -1).contiguous()
            return rnn.rnn(v, h0)[0]

        if cls is ForwardRNN:
            ref = module_path(x) * mask.unsqueeze(-1)
        else:
            from pyro_seq.nn import reverse_padded

            ref = reverse_padded(module_path(reverse_padded(x, lengths)), lengths)
            ref = ref * mask.unsqueeze(-1)
        assert torch.allclose(got, ref, atol=1e-13)
        w = torch.randn_like(got)
        g_got = torch.autograd.grad((got * w).sum(), list(rnn.parameters()))
        g_ref = torch.autograd.grad((ref * w).sum(), list(rnn.parameters()))
        for a, b in zip(g_got, g_ref):
            assert torch.allclose(a, b, rtol=1e-11, atol=1e-12)


def test_float32_at_routed_sizes_equals_torch_gru_to_rounding():
    """At the sizes where the scan's products go to oneDNN (pyro_seq.nn.gemm), float32 values
    and gradients equal torch.nn.GRU's to float32 rounding."""
    torch.manual_seed(3)
    B, T, I, H = 16, 12, 40, 300
    gru = torch.nn.GRU(I, H, batch_first=True)
    x = torch.randn(B, T, I, requires_grad=True)
    h0 = torch.randn(B, H, requires_grad=True)
    lengths = torch.randint(1, T + 1, (B,))
    params = [x, h0] + _weights(gru)
    ref = _torch_gru_per_sequence(gru, x, lengths, h0)
    got = ragged_gru(x, lengths, h0, *_weights(gru))
    assert torch.allclose(got, ref, rtol=1e-5, atol=2e-6)
    w = torch.randn(B, T, H)
    for a, b in zip(
        torch.autograd.grad((got * w).sum(), params), torch.autograd.grad((ref * w).sum(), params)
    ):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max())
