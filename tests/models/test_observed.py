"""Missing data inside sequences: ``observed=`` (per step or per element) on every path.

Unobserved entries contribute no likelihood and the networks see zeros there. Checked in float64
against references built by hand from the traces: the same sites with the dropped emission terms
removed, on the same random numbers.
"""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models import DMM, SRNN

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py

D = 5
MODELS = {
    "dmm": lambda: DMM(D, z_dim=3, transition_dim=6, emission_dim=6, rnn_dim=6),
    "srnn": lambda: SRNN(D, d_dim=6, z_dim=3, hidden_dim=6),
    "dmm_gaussian": lambda: DMM(
        D, z_dim=3, transition_dim=6, emission_dim=6, rnn_dim=6, likelihood="gaussian"
    ),
}


def batch(gaussian=False):
    g = torch.Generator().manual_seed(0)
    x = (
        torch.randn(3, 6, D, generator=g)
        if gaussian
        else (torch.rand(3, 6, D, generator=g) < 0.4).double()
    )
    mask = torch.arange(6) < torch.tensor([6, 4, 2]).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


def traces(m, x, mask, seed, **kw):
    torch.manual_seed(seed)
    g = poutine.trace(m.guide).get_trace(x, mask, **kw)
    tr = poutine.trace(poutine.replay(m.model, trace=g)).get_trace(x, mask, **kw)
    tr.compute_log_prob()
    g.compute_log_prob()
    return tr, g


def elementwise(fn):
    """The per-element distribution inside a site's (masked, scored) Independent family."""
    while not isinstance(fn, torch.distributions.Independent):
        fn = fn.base_dist if hasattr(fn, "base_dist") else fn.base
    return fn.base_dist


def site_lp(tr, name):
    return tr.nodes[name]["log_prob"]


@pytest.mark.parametrize("arch", list(MODELS))
@pytest.mark.parametrize("per", ["step", "element"])
def test_all_observed_equals_no_observed(arch, per):
    m = MODELS[arch]()
    x, mask = batch("gaussian" in arch)
    obs = torch.ones(x.shape[:2] if per == "step" else x.shape, dtype=torch.bool)
    for loss in (Trace_ELBO(), IWAE(num_particles=3, max_plate_nesting=1), FIVO(num_particles=3)):
        torch.manual_seed(1)
        a = loss.loss(m.model, m.guide, x, mask)
        torch.manual_seed(1)
        b = loss.loss(m.model, m.guide, x, mask, observed=obs)
        assert b == pytest.approx(a, rel=1e-12, abs=0), type(loss).__name__


@pytest.mark.parametrize("arch", list(MODELS))
def test_dropped_elements_remove_exactly_their_terms(arch):
    gaussian = "gaussian" in arch
    m = MODELS[arch]()
    x, mask = batch(gaussian)
    obs = torch.ones_like(x, dtype=torch.bool)
    obs[0, 2] = False  # a whole step of sequence 0
    obs[1, 1, [0, 3]] = False  # two elements of sequence 1
    x_nan = torch.where(obs, x, torch.full_like(x, math.nan))
    filled = torch.where(obs, x, torch.zeros_like(x))
    # reference: the guide and model on the zero-filled data without missing values
    ref, ref_g = traces(m, filled, mask, seed=3)
    got, got_g = traces(m, x_nan, mask, seed=3, observed=obs)
    for name in ref_g.nodes:  # the guide saw the same (zero-filled) input
        if name.startswith("z_"):
            assert torch.equal(got_g.nodes[name]["value"], ref_g.nodes[name]["value"])
    for name, site in ref.nodes.items():
        if site["type"] != "sample" or not name.startswith(("x_", "z_")):
            continue
        expected = site_lp(ref, name).clone()
        if name.startswith("x_"):
            t = int(name[2:]) - 1
            base = elementwise(site["fn"])
            per_element = base.log_prob(filled[:, t])  # (batch, D), by hand
            expected = expected - ((~obs[:, t]) * per_element).sum(-1) * mask[:, t]
        assert torch.allclose(site_lp(got, name), expected, rtol=1e-12, atol=1e-12), name
    assert site_lp(got, "x_3")[0] == 0.0  # a dropped step scores 0


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
def test_nan_at_unobserved_entries_gives_finite_losses_and_gradients(arch):
    m = MODELS[arch]()
    x, mask = batch()
    obs = torch.rand(x.shape, generator=torch.Generator().manual_seed(4)) < 0.7
    x_nan = torch.where(obs, x, torch.full_like(x, math.nan))
    filled = torch.where(obs, x, torch.zeros_like(x))
    for loss in (
        Trace_ELBO(),
        IWAE(num_particles=3, max_plate_nesting=1),
        IWAE(num_particles=3, max_plate_nesting=1, gradient_estimator="dreg"),
        FIVO(num_particles=3),
    ):
        grads = []
        for data in (x_nan, filled):
            pyro.clear_param_store()
            m.zero_grad()
            torch.manual_seed(5)
            value = loss.differentiable_loss(m.model, m.guide, data, mask, observed=obs)
            value.backward()
            assert torch.isfinite(value)
            grads.append(
                torch.cat([p.grad.reshape(-1) for p in m.parameters() if p.grad is not None])
            )
        assert torch.isfinite(grads[0]).all()
        assert torch.equal(grads[0], grads[1]), type(loss).__name__


@pytest.mark.parametrize("arch", ["dmm", "srnn"])
def test_fivo_with_one_particle_is_the_elbo_with_missing_data(arch):
    m = MODELS[arch]()
    x, mask = batch()
    obs = torch.ones(x.shape[:2], dtype=torch.bool)
    obs[:, 1] = False
    torch.manual_seed(6)
    a = Trace_ELBO().loss(m.model, m.guide, x, mask, observed=obs)
    torch.manual_seed(6)
    b = FIVO(num_particles=1).loss(m.model, m.guide, x, mask, observed=obs)
    assert b == pytest.approx(a, rel=1e-9)


def test_bad_observed_masks_are_named():
    m = MODELS["dmm"]()
    x, mask = batch()
    with pytest.raises(ValueError, match=r"observed shape \(3, 5\) is neither \(batch, T\)"):
        m.model(x, mask, observed=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"observed must be bool or contain only 0 and 1"):
        m.model(x, mask, observed=torch.full((3, 6), 0.5))
    x_nan = x.clone()
    x_nan[0, 0, 0] = math.nan
    with pytest.raises(ValueError, match=r"NaN at \(batch 0, step 0, feature 0\), a real step"):
        m.model(x_nan, mask, observed=torch.ones(3, 6, dtype=torch.bool))


def test_linear_gaussian_exact_guide_gives_the_kalman_likelihood_of_the_observed_steps():
    # with missing steps the exact posterior guide (backward information filter over the
    # observed steps) makes every importance weight p(x_observed): the ELBO is exact
    from pyro_seq.models import LinearGaussianSequenceModel
    from pyro_seq.ops import kalman_filter

    m = LinearGaussianSequenceModel(2, 3, guide="smoothing")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 7, 2, generator=g)
    mask = torch.arange(7) < torch.tensor([7, 5, 3]).unsqueeze(-1)
    x = x * mask.unsqueeze(-1)
    obs = torch.ones(3, 7, dtype=torch.bool)
    obs[0, [1, 2, 5]] = False
    obs[1, 0] = False
    x_nan = torch.where(obs.unsqueeze(-1), x, torch.full_like(x, math.nan))
    elbo = -Trace_ELBO().loss(m.model, m.guide, x_nan, mask, observed=obs)
    with torch.no_grad():
        kf = kalman_filter(
            torch.where(obs.unsqueeze(-1), x, torch.zeros_like(x)),
            m.init_loc,
            m.init_cov,
            m.A,
            m.Q,
            m.C,
            m.R,
            mask=(mask & obs).unsqueeze(-1).expand(x.shape),
        )
    assert elbo == pytest.approx(kf.log_likelihoods.sum().item(), rel=1e-9)
    with pytest.raises(ValueError, match="missing data per step only"):
        part = torch.ones(3, 7, 2, dtype=torch.bool)
        part[0, 1, 0] = False
        m.model(x, mask, observed=part)
