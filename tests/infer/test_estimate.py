"""estimate_log_likelihood: per-sequence IWAE / SMC estimates against exact log p(x)."""

import pytest
import torch

from pyro_seq.infer import estimate_log_likelihood
from tests.infer._lg import make_data, make_model

LENGTHS = [6, 3, 1, 5]


def _seqs(x, mask):
    return [x[b, : int(mask[b].sum())] for b in range(x.shape[0])]


@pytest.mark.parametrize("method", ["iwae", "smc"])
def test_exact_guide_gives_exact_estimates_in_every_format(method):
    m = make_model(guide="smoothing")
    x, mask = make_data(m, LENGTHS)
    exact = m.exact_log_likelihood(x, mask)
    kw = dict(method=method, num_particles=3, resample="never")
    for data, bs in (((x, mask), None), (_seqs(x, mask), 3), ([(x[:2], mask[:2]), (x[2:], mask[2:])], 1)):
        est = estimate_log_likelihood(m.model, m.guide, data, batch_size=bs, **kw)
        assert torch.allclose(est.per_sequence, exact, atol=2e-4)  # order and lengths preserved
        assert est.lengths.tolist() == LENGTHS and est.num_steps == sum(LENGTHS)
        assert est.nats_per_step == pytest.approx(est.total / est.num_steps)
        assert est.method == method and est.num_particles == 3
        assert f"{method} (K=3)" in str(est) and est.as_dict()["num_particles"] == 3


def test_particle_chunks_combine_to_one_estimate():
    m = make_model(guide="smoothing")
    x, mask = make_data(m, LENGTHS)
    est = estimate_log_likelihood(m.model, m.guide, (x, mask), num_particles=10, particles_per_pass=3)
    assert torch.allclose(est.per_sequence, m.exact_log_likelihood(x, mask), atol=2e-4)


@pytest.mark.parametrize("method", ["iwae", "smc"])
def test_estimates_are_close_to_log_likelihood(method):
    # optimal proposal, K = 64, 100 copies of 4 sequences: the mean estimate is not above
    # log p(x) (Jensen; 3 standard errors) and within 0.1 nats of it (measured: |gap| <= 0.012
    # nats per sequence with standard errors <= 0.012, for both methods)
    m = make_model(guide="optimal")
    x, mask = make_data(m, LENGTHS)
    R = 100
    xs, masks = x.repeat(R, 1, 1), mask.repeat(R, 1)
    torch.manual_seed(0)
    est = estimate_log_likelihood(m.model, m.guide, (xs, masks), method=method, num_particles=64)
    per = est.per_sequence.reshape(R, 4)
    exact = m.exact_log_likelihood(x, mask)
    gap = exact - per.mean(0)
    se = per.std(0) / R ** 0.5
    assert (gap > -3 * se - 1e-4).all(), (gap, se)  # 1e-4: float32 rounding (T = 1 is exact)
    assert (gap < 0.1).all(), gap


def test_errors():
    m = make_model()
    x, mask = make_data(m, [3])
    with pytest.raises(ValueError, match="method"):
        estimate_log_likelihood(m.model, m.guide, (x, mask), method="exact")
    with pytest.raises(ValueError):
        estimate_log_likelihood(m.model, m.guide, (x, mask), num_particles=0)
    with pytest.raises(TypeError, match="step protocol"):
        estimate_log_likelihood(lambda x, mask=None: None, m.guide, (x, mask), method="smc")
    with pytest.raises(TypeError):
        estimate_log_likelihood(m.model, m.guide, [1, 2, 3])
