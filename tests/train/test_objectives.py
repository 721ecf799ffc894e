"""Every objective name trains both architectures through SVI by changing only ``loss=``."""

import math

import pyro
import pytest
import torch
from pyro.infer import SVI
from pyro.optim import Adam

from pyro_seq.models import DMM, SRNN
from pyro_seq.train import OBJECTIVES, evaluate_bound, make_objective

ARCHS = {
    "dmm": lambda: DMM(5, z_dim=2, transition_dim=8, emission_dim=8, rnn_dim=8),
    "srnn": lambda: SRNN(5, d_dim=8, z_dim=2, hidden_dim=8),
}


def batch():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 6, 5, generator=g) < 0.3).float()
    mask = torch.arange(6) < torch.tensor([6, 4, 2]).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize(
    "name, particles, free_bits",
    [(n, 1, 0.0) for n in OBJECTIVES]
    + [
        ("iwae", 3, 0.0),
        ("fivo", 3, 0.0),
        ("elbo", 3, 0.0),
        ("meanfield", 3, 0.0),
        ("elbo", 1, 0.5),
    ],
)
def test_each_objective_takes_a_step(arch, name, particles, free_bits):
    m = ARCHS[arch]()
    x, mask = batch()
    before = [p.detach().clone() for p in m.parameters()]
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-2}), loss=make_objective(name, particles, free_bits))
    assert math.isfinite(svi.step(x, mask))
    moved = [not torch.equal(a, b) for a, b in zip(before, m.parameters())]
    assert sum(moved) >= len(moved) - 2  # every network received a gradient (h0 buffers aside)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_vectorized_elbo_particles_estimate_the_same_bound(arch):
    """K=4 particles in one vectorized pass average K independent ELBO estimates: over 100
    steps (400 particles) their mean equals the mean of 400 single-particle estimates to within
    4 standard errors, and their spread shrinks by about sqrt(K)."""
    m = ARCHS[arch]()
    x, mask = batch()
    vec, single = make_objective("elbo", 4), make_objective("elbo", 1)
    assert vec.vectorize_particles
    pyro.set_rng_seed(0)
    with torch.no_grad():
        v = torch.tensor([vec.loss(m.model, m.guide, x, mask) for _ in range(100)])
        s = torch.tensor([single.loss(m.model, m.guide, x, mask) for _ in range(400)])
    se = (v.var() / 100 + s.var() / 400).sqrt()
    assert abs(v.mean() - s.mean()) < 4 * se
    assert 0.3 < (v.std() / s.std()).item() < 0.75  # 1/sqrt(4) = 0.5


def test_free_bits_needs_a_single_sample_objective():
    with pytest.raises(ValueError, match="free bits"):
        make_objective("iwae", 4, free_bits=1.0)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_evaluation_estimators_are_ordered(arch):
    """ELBO <= IWAE_K in expectation; with K=64 the gap (~1 nat/step here) dwarfs MC noise."""
    m = ARCHS[arch]()
    x, mask = batch()
    seqs = [x[i, : int(mask[i].sum())] for i in range(3)]
    elbo = evaluate_bound(m, seqs, method="elbo", num_particles=64)
    iwae = evaluate_bound(m, seqs, method="iwae", num_particles=64)
    smc = evaluate_bound(m, seqs, method="smc", num_particles=64)
    assert elbo["num_steps"] == iwae["num_steps"] == smc["num_steps"] == 12
    assert iwae["per_step"] > elbo["per_step"] and smc["per_step"] > elbo["per_step"]
    assert iwae["num_particles"] == 64 and smc["method"] == "smc"
