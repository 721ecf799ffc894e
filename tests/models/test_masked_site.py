"""``models.base.masked``: ``fn.mask(mask)`` that keeps itself when a plate expands it to the
shape it already has; any other expansion is the stock one."""

import pyro.distributions as dist
import torch
from pyro.distributions.torch_distribution import MaskedDistribution

from pyro_seq.models.base import masked


def test_masked_is_fn_mask():
    torch.manual_seed(0)
    fn = dist.Normal(torch.randn(4, 3), torch.rand(4, 3) + 0.1).to_event(1)
    mask = torch.tensor([True, False, True, True])
    value = torch.randn(4, 3)
    d = masked(fn, mask)
    assert isinstance(d, MaskedDistribution)
    assert torch.equal(d.log_prob(value), fn.mask(mask).log_prob(value))
    assert d.expand((4,)) is d and d.expand(torch.Size([4])) is d
    wide = d.expand((2, 4))
    assert wide.batch_shape == (2, 4) and wide.event_shape == (3,)
    assert torch.equal(wide.log_prob(value), fn.mask(mask).expand((2, 4)).log_prob(value))
    assert torch.equal(wide.log_prob(value)[1], d.log_prob(value))
