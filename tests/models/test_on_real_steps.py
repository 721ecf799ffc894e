"""pyro_seq.models.base.on_real_steps: step-wise networks evaluated on the real steps only."""

import torch

from pyro_seq.models.base import on_real_steps


def test_equals_the_network_on_real_steps_and_pads_with_finite_values():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2).double()

    def fn(v):
        return net(v), net(v).exp()

    x = torch.randn(4, 2, 5, 3, dtype=torch.float64, requires_grad=True)  # (particles, B, T, F)
    mask = torch.arange(5) < torch.tensor([5, 2]).unsqueeze(-1)
    got = on_real_steps(fn, x, mask)
    want = fn(x)
    real = mask.expand(4, 2, 5)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert torch.allclose(g[real], w[real], rtol=1e-12, atol=1e-12)
        assert torch.isfinite(g).all()
    # padded cells take no gradient to the inputs of their own step
    (got[0] * (~real).unsqueeze(-1)).sum().backward()
    assert torch.equal(x.grad[~real], torch.zeros_like(x.grad[~real]))
    # a full mask is the plain call
    full = torch.ones(2, 5, dtype=torch.bool)
    assert torch.equal(on_real_steps(net, x, full), net(x))
