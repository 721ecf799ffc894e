"""The architectures train with every objective by changing only ``loss=``."""

import math

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam

from pyro_seq.infer import FIVO, IWAE, LatentScale
from pyro_seq.models import DMM, SRNN, STORN, VAERNN, VOSP, VRAE, VRNN, RNNBaseline

OBJECTIVES = {
    "trace_elbo": lambda: Trace_ELBO(),
    "mean_field": lambda: TraceMeanField_ELBO(),
    "iwae": lambda: IWAE(num_particles=3, max_plate_nesting=1),
    "iwae_dreg": lambda: IWAE(num_particles=3, max_plate_nesting=1, gradient_estimator="dreg"),
    "fivo": lambda: FIVO(num_particles=3, resample="always"),
}

MODELS = {
    "dmm": lambda **kw: DMM(5, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8, **kw),
    "dmm_residual": lambda **kw: DMM(
        5, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8, residual=True, **kw
    ),
    "srnn": lambda **kw: SRNN(5, d_dim=6, z_dim=3, hidden_dim=8, **kw),
    "vrnn": lambda **kw: VRNN(5, d_dim=6, z_dim=3, hidden_dim=8, feature_dim=6, **kw),
    "vrnn_smoothing": lambda **kw: VRNN(
        5, d_dim=6, z_dim=3, hidden_dim=8, feature_dim=6, inference="smoothing", **kw
    ),
    "vaernn": lambda **kw: VAERNN(5, d_dim=6, z_dim=3, hidden_dim=8, skip=True, **kw),
    "rnn": lambda **kw: RNNBaseline(5, d_dim=6, hidden_dim=8, **kw),
    "storn_wiener": lambda **kw: STORN(5, z_dim=3, rnn_dim=6, emission_dim=8, prior="wiener", **kw),
    "vosp_white": lambda **kw: VOSP(5, z_dim=3, rnn_dim=6, emission_dim=8, prior="white", **kw),
    "vrae": lambda **kw: VRAE(5, z_dim=3, encoder_dim=6, decoder_dim=6, emission_dim=8, **kw),
}
LIKELIHOODS = {
    "bernoulli": {},
    "gaussian": {"likelihood": "gaussian"},
    "gmm": {"likelihood": "gmm", "num_components": 2},
}


def _data(likelihood):
    g = torch.Generator().manual_seed(0)
    if likelihood == "bernoulli":
        x = torch.bernoulli(torch.full((3, 4, 5), 0.4), generator=g)
    else:
        x = torch.randn(3, 4, 5, generator=g)
    mask = torch.arange(4) < torch.tensor([4, 2, 3]).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


@pytest.mark.parametrize("likelihood", sorted(LIKELIHOODS))
@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_model_every_objective_every_emission(model, objective, likelihood):
    """One SVI step on a ragged batch (with KL annealing): finite loss, every parameter gets a
    finite gradient, and most parameters move."""
    torch.manual_seed(0)
    m = MODELS[model](**LIKELIHOODS[likelihood])
    x, mask = _data(likelihood)
    ls = LatentScale(0.5)  # KL annealing composes with every objective
    loss_fn = OBJECTIVES[objective]()
    loss = loss_fn.differentiable_loss(ls(m.model), ls(m.guide), x, mask)
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    nonzero = sum(bool(p.grad.abs().sum() > 0) for p in m.parameters())
    assert nonzero == len(list(m.parameters())), (nonzero, len(list(m.parameters())))
    pyro.clear_param_store()
    svi = SVI(ls(m.model), ls(m.guide), Adam({"lr": 0.01}), loss=OBJECTIVES[objective]())
    before = [p.detach().clone() for p in m.parameters()]
    assert math.isfinite(svi.step(x, mask))
    changed = sum(not torch.equal(b, p) for b, p in zip(before, m.parameters()))
    assert changed > 0.5 * len(before), (changed, len(before))


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("model", sorted(MODELS))
def test_step_protocol_with_particles_matches_full_runs(model):
    # FIVO drives init/step with a particle plate; IWAE/Trace_ELBO run the full sequence.
    # Same random numbers: K=1 FIVO = Trace_ELBO and FIVO(never) = IWAE for both architectures.
    torch.manual_seed(0)
    m = MODELS[model]()
    x, mask = _data("bernoulli")
    pairs = [
        (FIVO(num_particles=1), Trace_ELBO()),
        (FIVO(num_particles=4, resample="never"), IWAE(num_particles=4, max_plate_nesting=1)),
    ]
    for fivo, other in pairs:
        torch.manual_seed(1)
        a = fivo.loss(m.model, m.guide, x, mask)
        torch.manual_seed(1)
        b = other.loss(m.model, m.guide, x, mask)
        assert a == pytest.approx(b, rel=1e-9), (type(other).__name__, a, b)
