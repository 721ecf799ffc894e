"""``GaussianMLP.forward`` with per-pass ``step_weights()`` (the ``z`` block of the first layer
cut once, the two output layers fused) is the same function, with the same gradients, as
without."""

import pytest
import torch

from pyro_seq.nn import GaussianHead, GaussianMLP


@pytest.mark.parametrize("variance", ["softplus", "log"])
def test_step_weights_give_the_same_values_and_gradients(float64, variance):
    torch.manual_seed(0)
    net = GaussianMLP(3, 4, 6, 3, "clipped_leaky_relu", 1e-3, variance)
    z = torch.randn(5, 3)
    ctx = net.project_context(torch.randn(5, 2, 4))
    grads = []
    for weights in (None, net.step_weights()):
        net.zero_grad()
        total = 0.0
        for t in range(2):  # a recurrence: the same weights at every step
            loc, scale = net(z, ctx[:, t], weights)
            total = total + (loc * 1.3 - scale.log()).sum()
        total.backward(retain_graph=True)
        grads.append((total.detach(), [p.grad.clone() for p in net.parameters()]))
    assert torch.allclose(grads[0][0], grads[1][0], rtol=1e-12)
    for a, b in zip(grads[0][1], grads[1][1]):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_fused_head_is_the_head(float64):
    torch.manual_seed(1)
    head = GaussianHead(4, 2, min_scale=0.1)
    h = torch.randn(3, 4)
    loc, scale = head(h)
    loc_f, scale_f = head.from_fused(torch.nn.functional.linear(h, *head.fused_weights()))
    assert torch.allclose(loc, loc_f, rtol=1e-12) and torch.allclose(scale, scale_f, rtol=1e-12)
    assert bool((scale_f > 0.1).all())
