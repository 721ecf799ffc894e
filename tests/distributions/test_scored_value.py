"""ScoredValue: a precomputed log-density for one value object, everything else delegated."""

import pyro
import pyro.distributions as dist
import torch
from torch.distributions import kl_divergence

from pyro_seq.distributions.scored_value import ScoredValue


def test_log_prob_for_the_value_object_and_delegation_otherwise():
    base = dist.Normal(torch.zeros(3, 2), torch.ones(3, 2)).to_event(1)
    value = torch.randn(3, 2)
    marker = torch.full((3,), 7.0)
    scored = ScoredValue(base, value, marker)
    assert scored.log_prob(value) is marker
    other = value.clone()  # equal but not the same object
    assert torch.allclose(scored.log_prob(other), base.log_prob(other))
    assert scored.batch_shape == (3,) and scored.event_shape == (2,)
    assert scored.has_rsample and scored.rsample().shape == (3, 2)


def test_kl_delegates_to_the_base_distribution_also_when_masked():
    p = dist.Normal(torch.randn(4, 2), torch.rand(4, 2) + 0.5).to_event(1)
    q = dist.Normal(torch.randn(4, 2), torch.rand(4, 2) + 0.5).to_event(1)
    scored = ScoredValue(q, torch.zeros(4, 2), torch.zeros(4))
    assert torch.allclose(kl_divergence(p, scored), kl_divergence(p, q))
    mask = torch.tensor([True, False, True, True])
    assert torch.allclose(
        kl_divergence(p.mask(mask), scored.mask(mask)), kl_divergence(p, q) * mask
    )


def test_expand_keeps_the_precomputed_score():
    """Pyro's plates call ``expand`` on every site; the precomputed score must survive it
    (a sentinel score, unequal to the base log-density, shows which one is returned)."""
    base = dist.Normal(torch.zeros(3), torch.ones(3))
    value = torch.randn(3)
    sentinel = torch.full((3,), -123.0)
    d = ScoredValue(base, value, sentinel)
    assert d.expand((3,)) is d
    assert torch.equal(d.expand(torch.Size([3])).log_prob(value), sentinel)
    wide = d.expand((2, 3))
    assert wide.batch_shape == (2, 3)
    assert torch.equal(wide.log_prob(value), sentinel.expand(2, 3))
    other = torch.randn(3)
    assert torch.allclose(wide.log_prob(other), base.log_prob(other).expand(2, 3))
    with pyro.plate("p", 3):
        tr = pyro.poutine.trace(lambda: pyro.sample("s", d, obs=value)).get_trace()
    tr.compute_log_prob()
    assert torch.equal(tr.nodes["s"]["log_prob"], sentinel)
