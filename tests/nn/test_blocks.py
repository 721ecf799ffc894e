"""The reusable blocks: ragged reversal, masked RNNs, transitions, heads."""

import re

import pytest
import torch

from pyro_seq.nn import (
    MLP,
    BackwardRNN,
    ClippedLeakyReLU,
    Combiner,
    ForwardRNN,
    GatedTransition,
    GaussianHead,
    cat_broadcast,
    layer_widths,
    reverse_padded,
)
from pyro_seq.nn.conv import frame_networks


def test_reverse_padded_reverses_within_length_and_is_an_involution():
    x = torch.arange(2 * 5).reshape(2, 5, 1).float()
    lengths = torch.tensor([5, 3])
    y = reverse_padded(x, lengths)
    assert y[0, :, 0].tolist() == [4, 3, 2, 1, 0]
    assert y[1, :, 0].tolist() == [7, 6, 5, 8, 9]  # padding stays in place
    assert torch.equal(reverse_padded(y, lengths), x)


def test_reverse_padded_gradient_is_the_reversal_and_gradchecks():
    """The gradient of the reversal is the reversal of the incoming gradient (the map is an
    involution): against the gather definition, with extra trailing dims, and gradcheck
    (second order included) in float64."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([6, 1, 4])
    g = torch.randn(3, 6, 2, 4, generator=gen, dtype=torch.float64)
    t = torch.arange(6)
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    ref = torch.gather(x, 1, idx[:, :, None, None].expand(x.shape))
    (grad_ref,) = torch.autograd.grad(ref, x, g)
    y = reverse_padded(x, lengths)
    (grad,) = torch.autograd.grad(y, x, g)
    assert torch.equal(y, ref) and torch.equal(grad, grad_ref)
    assert torch.autograd.gradcheck(lambda v: reverse_padded(v, lengths), (x,))
    assert torch.autograd.gradgradcheck(lambda v: reverse_padded(v, lengths), (x,))


def test_backward_rnn_equals_each_sequence_run_alone():
    torch.manual_seed(0)
    rnn = BackwardRNN(3, 4, cell="gru")
    x = torch.randn(3, 6, 3)
    lengths = torch.tensor([6, 4, 1])
    mask = torch.arange(6) < lengths.unsqueeze(-1)
    out = rnn(x * mask.unsqueeze(-1) + 100 * (~mask).unsqueeze(-1), mask)  # garbage padding
    for b, L in enumerate(lengths.tolist()):
        h, ref = torch.zeros(1, 1, 4), []
        for t in reversed(range(L)):  # a_t = g(a_{t+1}, x_t), a_{L+1}=0
            o, h = rnn.rnn(x[b : b + 1, t : t + 1], h)
            ref.append(o[0, 0])
        ref = torch.stack(ref[::-1])
        assert torch.allclose(out[b, :L], ref, atol=1e-6)


def test_forward_rnn_is_causal():
    torch.manual_seed(0)
    rnn = ForwardRNN(3, 4)
    x = torch.randn(2, 6, 3)
    y = x.clone()
    y[:, 4:] += 5.0
    assert torch.equal(rnn(x)[:, :4], rnn(y)[:, :4])
    assert not torch.allclose(rnn(x)[:, 4:], rnn(y)[:, 4:])


def test_gated_transition_starts_close_to_identity_mean_and_has_positive_scale():
    torch.manual_seed(0)
    tr = GatedTransition(5, 16, min_scale=0.01)
    z = torch.randn(7, 5)
    loc, scale = tr(z)
    gate = torch.sigmoid(tr.gate(torch.relu(tr.gate_hidden(z))))
    proposed = tr.proposal(torch.relu(tr.proposal_hidden(z)))
    assert torch.allclose(loc, (1 - gate) * z + gate * proposed, atol=1e-6)  # W_0 = I at init
    assert (scale > 0.01).all()


def test_combiner_formula():
    torch.manual_seed(0)
    c = Combiner(3, 4, min_scale=0.0)
    z, a = torch.randn(2, 3), torch.randn(2, 4)
    h = 0.5 * (torch.tanh(c.z_to_hidden(z)) + a)
    loc, scale = c(z, a)
    assert torch.allclose(loc, c.loc(h)) and torch.allclose(
        scale, torch.nn.functional.softplus(c.raw_scale(h))
    )
    loc2, scale2 = c(z, a, c.stacked_heads())  # the fused form used in loops
    assert torch.allclose(loc2, loc, atol=1e-6) and torch.allclose(scale2, scale, atol=1e-6)


def test_gaussian_head_floor_and_mlp_shapes():
    head = GaussianHead(4, 2, min_scale=0.5)
    with torch.no_grad():
        head.raw_scale.bias.fill_(-50.0)
        head.raw_scale.weight.zero_()
    _, scale = head(torch.randn(3, 4))
    assert torch.allclose(scale, torch.full((3, 2), 0.5))
    assert MLP(4, [8, 8], 2)(torch.randn(5, 6, 4)).shape == (5, 6, 2)


def test_clipped_leaky_relu():
    f = ClippedLeakyReLU()
    x = torch.tensor([-20.0, -3.0, 0.0, 2.0, 10.0])
    assert f(x).tolist() == [-3.0, -1.0, 0.0, 2.0, 3.0]


def test_cat_broadcast_joins_particle_and_shared_tensors():
    a, b = torch.randn(4, 2, 3), torch.randn(2, 5)
    out = cat_broadcast([a, b])
    assert out.shape == (4, 2, 8)
    assert torch.equal(out[1, :, 3:], b) and torch.equal(out[..., :3], a)


def test_forward_rnn_packed_equals_padded_on_real_steps():
    torch.manual_seed(0)
    rnn = ForwardRNN(3, 4)
    x = torch.randn(3, 6, 3)
    lengths = torch.tensor([6, 2, 4])
    packed, padded = rnn(x, lengths), rnn(x)
    for b, L in enumerate(lengths.tolist()):
        assert torch.allclose(packed[b, :L], padded[b, :L], atol=1e-6)
        assert (packed[b, L:] == 0).all()


def _relu_rnn_reference(rnn, x, lengths, h0):
    """torch.nn.RNN run on each sequence alone (its real steps only)."""
    outs = []
    for b in range(x.shape[0]):
        L = int(lengths[b])
        o, _ = rnn.rnn(x[b : b + 1, :L], h0[b].reshape(1, 1, -1))
        outs.append(torch.cat([o[0], o.new_zeros(x.shape[1] - L, o.shape[-1])]))
    return torch.stack(outs)


def test_ragged_relu_rnn_equals_torch_rnn_per_sequence_with_gradients():
    """Values and every gradient (weights, biases, inputs, initial states) of the ragged scan
    equal torch.nn.RNN run on each sequence alone; padded outputs are 0 and get no gradient."""
    torch.manual_seed(0)
    rnn = ForwardRNN(3, 5, cell="rnn", learn_init=True).double()
    with torch.no_grad():
        rnn.h0.normal_()
    x = torch.randn(4, 7, 3, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([3, 7, 1, 5])
    w = torch.randn(4, 7, 5, dtype=torch.float64)
    grads = []
    for run in (
        lambda: rnn(x, lengths),
        lambda: _relu_rnn_reference(rnn, x, lengths, rnn.h0.expand(4, -1)),
    ):
        rnn.zero_grad()
        x.grad = None
        out = run()
        (out * w).sum().backward()
        grads.append((out.detach(), x.grad.clone(), [p.grad.clone() for p in rnn.parameters()]))
    (o1, gx1, gp1), (o2, gx2, gp2) = grads
    assert torch.allclose(o1, o2, atol=1e-12)
    assert torch.equal(o1[0, 3:], torch.zeros(4, 5))
    assert torch.allclose(gx1, gx2, atol=1e-12)
    assert torch.equal(gx1[2, 1:], torch.zeros(6, 3))
    for a, b in zip(gp1, gp2):
        assert torch.allclose(a, b, atol=1e-12)


def test_ragged_relu_rnn_gradcheck_and_bad_lengths():
    from pyro_seq.nn.relu_scan import ragged_relu_rnn

    torch.manual_seed(1)
    args = [
        torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True),
        torch.tensor([4, 2, 3]),
        torch.randn(3, 5, dtype=torch.float64, requires_grad=True),
        torch.randn(5, 2, dtype=torch.float64, requires_grad=True),
        0.4 * torch.randn(5, 5, dtype=torch.float64, requires_grad=True),
        torch.rand(5, dtype=torch.float64, requires_grad=True),
    ]
    assert torch.autograd.gradcheck(
        lambda x, h0, wi, wh, b: ragged_relu_rnn(x, args[1], h0, wi, wh, b),
        (args[0],) + tuple(args[2:]),
    )
    with pytest.raises(ValueError, match="lengths"):
        ragged_relu_rnn(args[0], torch.tensor([5, 2, 3]), *args[2:])
    with pytest.raises(ValueError, match="lengths"):
        ragged_relu_rnn(args[0], torch.tensor([0, 2, 3]), *args[2:])


@pytest.mark.parametrize("bad", [(0,), (8, 0), (-3,), (2.5,), (True,), (8, "16")])
def test_mlp_refuses_hidden_widths_that_are_not_positive_ints(bad):
    """A zero-width hidden layer used to be built (Linear(a, 0)): the output was then the last
    bias for every input."""
    with pytest.raises(
        ValueError,
        match=r"hidden_dims must hold positive ints .*got " + re.escape(repr(tuple(bad))),
    ):
        MLP(3, bad, 2)
    with pytest.raises(ValueError, match="hidden_dims must hold positive ints"):
        frame_networks("mlp", (2, 2), 3, hidden_dims=bad)
    with pytest.raises(ValueError, match="hidden_dims must hold positive ints"):
        frame_networks("conv", (8, 8), 3, channels=2, layers=2, hidden_dims=bad)


def test_mlp_widths_and_their_type_errors():
    net = MLP(3, (4, 5), 2)
    assert [(m.in_features, m.out_features) for m in net if isinstance(m, torch.nn.Linear)] == [
        (3, 4),
        (4, 5),
        (5, 2),
    ]
    assert layer_widths([4, torch.tensor(5)]) == (4, 5)
    assert layer_widths(()) == ()
    for bad in (256, "256", None):
        with pytest.raises(TypeError, match="hidden_dims must be a sequence of layer widths"):
            MLP(3, bad, 2)
    with pytest.raises(ValueError, match=r"out_dim must be a positive int \(features\), got 0"):
        MLP(3, (), 0)
    with pytest.raises(ValueError, match=r"in_dim must be a positive int \(features\), got 0"):
        MLP(0, (4,), 2)
    with pytest.raises(ValueError, match=r"at least one hidden layer, got \(\)"):
        frame_networks("mlp", (2, 2), 3, hidden_dims=())


def test_ragged_relu_rnn_float32_at_routed_sizes_equals_torch_rnn_to_rounding():
    """At the sizes where the scan's products go to oneDNN (pyro_seq.nn.gemm), float32 values
    and gradients equal torch.nn.RNN's to float32 rounding."""
    torch.manual_seed(4)
    rnn = ForwardRNN(30, 600, cell="rnn", learn_init=True)
    with torch.no_grad():
        rnn.h0.normal_()
        rnn.rnn.weight_hh_l0.mul_(0.5)
    x = torch.randn(20, 10, 30, requires_grad=True)
    lengths = torch.randint(1, 11, (20,))
    w = torch.randn(20, 10, 600)
    outs = []
    for run in (
        lambda: rnn(x, lengths),
        lambda: _relu_rnn_reference(rnn, x, lengths, rnn.h0.expand(20, -1)),
    ):
        out = run()
        outs.append((out, torch.autograd.grad((out * w).sum(), [x] + list(rnn.parameters()))))
    (o1, g1), (o2, g2) = outs
    assert torch.allclose(o1, o2, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max())
