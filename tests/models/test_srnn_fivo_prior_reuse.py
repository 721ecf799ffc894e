"""Under FIVO the SRNN model step reuses the prior its guide step computed for Res_q (same
z_{t-1}, same state). The reuse must not change the bound or any gradient."""

import pyro
import torch

from pyro_seq.infer import FIVO
from pyro_seq.models import SRNN


def _loss_and_grads(m, x, mask, reuse, monkeypatch):
    if not reuse:
        monkeypatch.setattr("pyro_seq.models.srnn.prior_from_guide", lambda state, t: None)
    calls = []
    original = m.prior.forward
    monkeypatch.setattr(m.prior, "forward", lambda *a: calls.append(1) or original(*a))
    pyro.set_rng_seed(3)
    m.zero_grad()
    loss = FIVO(num_particles=4).loss_and_grads(m.model, m.guide, x, mask)
    monkeypatch.undo()
    return loss, [p.grad.clone() for p in m.parameters()], len(calls)


def test_prior_reuse_keeps_the_fivo_bound_and_its_gradients(monkeypatch):
    torch.manual_seed(0)
    m = SRNN(5, d_dim=8, z_dim=3, hidden_dim=8, inference="filtering", residual=True).double()
    x = (torch.rand(3, 7, 5, generator=torch.Generator().manual_seed(1)) < 0.4).double()
    mask = torch.arange(7) < torch.tensor([7, 5, 3]).unsqueeze(-1)
    x = x * mask.unsqueeze(-1)
    loss_a, grads_a, calls_a = _loss_and_grads(m, x, mask, True, monkeypatch)
    loss_b, grads_b, calls_b = _loss_and_grads(m, x, mask, False, monkeypatch)
    assert calls_a == 7 and calls_b == 14  # one prior evaluation per step instead of two
    assert abs(loss_a - loss_b) < 1e-10
    for a, b in zip(grads_a, grads_b):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
