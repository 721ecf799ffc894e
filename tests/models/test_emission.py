"""Emission families (``make_emission``) and element-masked log-probabilities for missing data."""

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from torch.distributions import Categorical, Independent, MixtureSameFamily, Normal

from pyro_seq.distributions import DiagonalNormalMixture
from pyro_seq.models import SRNN
from pyro_seq.models.base import time_steps
from pyro_seq.models.emission import (
    ObservedElements,
    gmm_likelihood,
    make_emission,
    masked_log_prob,
    stack_params,
)

K, D = 3, 4


def _rand_mask(shape, seed, p=0.5):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < p


# ------------------------------------------------------------------------------ gmm family
def test_gmm_network_shapes_keep_time_at_dim_minus_two():
    net, lik = make_emission("gmm", 5, [8, 8], D, num_components=K)
    h = torch.randn(2, 7, 5)
    logits, loc, scale = net(h)
    assert logits.shape == (2, 7, K) and loc.shape == (2, 7, K * D) and scale.shape == (2, 7, K * D)
    d = lik((logits, loc, scale))
    assert isinstance(d, DiagonalNormalMixture)
    assert d.batch_shape == (2, 7) and d.event_shape == (D,)


def test_gmm_stacked_params_slice_into_the_per_step_distributions(float64):
    """stack_params then time_steps (the models' round trip) gives back each step's mixture."""
    net, lik = make_emission("gmm", 5, [8], D, num_components=K)
    per_step = [net(torch.randn(2, 5)) for _ in range(6)]
    stacked = stack_params(per_step)
    assert [p.shape[1] for p in stacked] == [6, 6, 6]
    x = torch.randn(2, 6, D)
    batched = lik(stacked).log_prob(x)
    for t, _params in enumerate(time_steps(stacked)):
        torch.testing.assert_close(
            batched[:, t], lik(per_step[t]).log_prob(x[:, t]), rtol=1e-12, atol=0
        )


def test_gmm_likelihood_is_the_component_major_mixture(float64):
    """Against torch's MixtureSameFamily built by explicit loops over components and dims."""
    logits, flat_loc = torch.randn(5, K), torch.randn(5, K * D)
    flat_scale = torch.rand(5, K * D) + 0.1
    loc = torch.stack(
        [torch.stack([flat_loc[:, k * D + d] for d in range(D)], -1) for k in range(K)], -2
    )
    scale = torch.stack(
        [torch.stack([flat_scale[:, k * D + d] for d in range(D)], -1) for k in range(K)], -2
    )
    ref = MixtureSameFamily(Categorical(logits=logits), Independent(Normal(loc, scale), 1))
    x = torch.randn(5, D)
    torch.testing.assert_close(
        gmm_likelihood((logits, flat_loc, flat_scale)).log_prob(x),
        ref.log_prob(x),
        rtol=1e-12,
        atol=0,
    )


def test_gmm_scales_have_the_floor():
    net, lik = make_emission("gmm", 5, [8], D, num_components=K, min_scale=0.05)
    head = net[-1].gaussian
    with torch.no_grad():
        head.raw_scale.bias.fill_(-60.0)  # softplus(-60) ~ 1e-26
        head.raw_scale.weight.zero_()
    _, _, scale = net(torch.randn(3, 5))
    assert (scale >= 0.05).all() and (scale - 0.05 < 1e-6).all()
    gnet, _ = make_emission("gaussian", 5, [8], D, min_scale=0.05)
    assert gnet[-1].min_scale == 0.05


def test_make_emission_errors():
    with pytest.raises(ValueError, match="num_components"):
        make_emission("gmm", 5, [8], D)
    with pytest.raises(ValueError, match="num_components"):
        make_emission("gmm", 5, [8], D, num_components=0)
    with pytest.raises(ValueError, match="only"):
        make_emission("gaussian", 5, [8], D, num_components=2)
    with pytest.raises(ValueError, match="likelihood must be one of"):
        make_emission("poisson", 5, [8], D)
    with pytest.raises(ValueError, match="K\\*D"):
        gmm_likelihood((torch.randn(2, 3), torch.randn(2, 7), torch.rand(2, 7)))


@pytest.mark.usefixtures("float64")
def test_gmm_emission_in_srnn_time_parallel_equals_step_by_step_and_the_reference():
    """A model observing through the gmm family: the batched (time-parallel) scoring of the
    3-tuple params agrees with the step-by-step loop, and each x site is the mixture density."""
    m = SRNN(D, d_dim=6, z_dim=2, hidden_dim=8, likelihood="gaussian")
    m.emitter, m.likelihood = make_emission("gmm", 2 + 6, [8], D, num_components=K)
    x = torch.randn(2, 5, D)
    mask = torch.arange(5) < torch.tensor([[5], [3]])
    g = poutine.trace(m.guide).get_trace(x, mask)
    parallel = poutine.trace(poutine.replay(m.model, trace=g)).get_trace(x, mask)
    zs = {n: s["value"] for n, s in g.nodes.items() if n.startswith("z_")}
    sequential = poutine.trace(poutine.condition(m.model, data=zs)).get_trace(x, mask)
    parallel.compute_log_prob()
    sequential.compute_log_prob()
    for t in range(5):
        name = f"x_{t + 1}"
        fn = sequential.nodes[name]["fn"].base_dist  # under .mask(): a ScoredValue
        fn = fn.base  # (emission batched after the loop)
        assert isinstance(fn, DiagonalNormalMixture)
        ref = MixtureSameFamily(
            Categorical(logits=fn.logits), Independent(Normal(fn.loc, fn.scale), 1)
        )
        torch.testing.assert_close(
            sequential.nodes[name]["log_prob"], ref.log_prob(x[:, t]) * mask[:, t]
        )
        torch.testing.assert_close(
            parallel.nodes[name]["log_prob"],
            sequential.nodes[name]["log_prob"],
            rtol=1e-12,
            atol=1e-12,
        )
    sample, params = m.generate(2, 4)  # sampling through the family
    assert sample.shape == (2, 4, D) and torch.isfinite(sample).all()
    assert [p.shape for p in params] == [(2, 4, K), (2, 4, K * D), (2, 4, K * D)]


# ------------------------------------------------------------------------- masked_log_prob
def _families(batch=(3,)):
    g = torch.Generator().manual_seed(7)
    normal = dist.Normal(
        torch.randn(batch + (D,), generator=g), torch.rand(batch + (D,), generator=g) + 0.3
    ).to_event(1)
    bern = dist.Bernoulli(
        logits=torch.randn(batch + (D,), generator=g), validate_args=False
    ).to_event(1)
    return {
        "normal": (normal, torch.randn(batch + (D,), generator=g)),
        "bernoulli": (
            bern,
            (torch.rand(batch + (D,), generator=g) < 0.5).to(torch.get_default_dtype()),
        ),
    }


@pytest.mark.parametrize("family", ["normal", "bernoulli"])
def test_masked_log_prob_factorised_equals_the_sum_over_observed_elements(family, float64):
    fn, x = _families()[family]
    mask = _rand_mask((3, D), 1)
    got = masked_log_prob(fn, x, mask)
    per_element = fn.base_dist.log_prob(x)  # dense reference: explicit loop
    ref = torch.stack(
        [
            sum((per_element[b, d] for d in range(D) if mask[b, d]), torch.tensor(0.0))
            for b in range(3)
        ]
    )
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=0)
    full = masked_log_prob(fn, x, torch.ones(D, dtype=torch.bool))
    assert ((full - fn.log_prob(x)).abs() <= 1e-12 * fn.log_prob(x).abs()).all()
    assert torch.equal(masked_log_prob(fn, x, torch.zeros(3, D, dtype=torch.bool)), torch.zeros(3))
    assert torch.equal(masked_log_prob(fn, x, None), fn.log_prob(x))


@pytest.mark.parametrize("family", ["normal", "bernoulli", "gmm"])
def test_nan_at_masked_entries_gives_finite_values_and_gradients(family, float64):
    if family == "gmm":
        logits, loc = (
            torch.randn(3, K, requires_grad=True),
            torch.randn(3, K, D, requires_grad=True),
        )
        raw = torch.randn(3, K, D, requires_grad=True)
        fn, leaves = DiagonalNormalMixture(logits, loc, raw.exp()), (logits, loc, raw)
        x = torch.randn(3, D)
    else:
        fn, x = _families()[family]
        base = fn.base_dist
        p = (base.loc if family == "normal" else base.logits).clone().requires_grad_()
        fn = (
            dist.Normal(p, base.scale)
            if family == "normal"
            else dist.Bernoulli(logits=p, validate_args=False)
        ).to_event(1)
        leaves = (p,)
    mask = _rand_mask((3, D), 2)
    mask[1] = False
    x_nan = torch.where(mask, x, torch.full_like(x, float("nan"))).requires_grad_()
    lp = masked_log_prob(fn, x_nan, mask)
    assert torch.isfinite(lp).all() and lp[1] == 0
    grads = torch.autograd.grad(lp.sum(), leaves + (x_nan,))
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[-1][~mask] == 0).all()
    torch.testing.assert_close(lp, masked_log_prob(fn, x, mask), rtol=0, atol=0)


def test_mask_broadcasts_against_value(float64):
    fn, x = _families((3,))["normal"]
    x = x.expand(2, 3, D)  # extra sample dim
    mask = torch.tensor([True, False, True, True])
    got = masked_log_prob(fn, x, mask)
    assert got.shape == (2, 3)
    torch.testing.assert_close(got, fn.base_dist.log_prob(x)[..., mask].sum(-1), rtol=1e-12, atol=0)


def test_masked_log_prob_bad_input():
    fn, x = _families()["normal"]
    with pytest.raises(ValueError, match="bool"):
        masked_log_prob(fn, x, torch.ones(3, D))
    with pytest.raises(ValueError, match="last dim"):
        masked_log_prob(fn, x, torch.ones(3, D + 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="supports"):
        mvn = dist.MultivariateNormal(torch.zeros(D), torch.eye(D))
        masked_log_prob(mvn, x, torch.ones(D, dtype=torch.bool))
    with pytest.raises(ValueError, match="event shape"):
        masked_log_prob(dist.Normal(0.0, 1.0), torch.zeros(()), torch.ones((), dtype=torch.bool))


# ------------------------------------------------------------------------- ObservedElements
def test_observed_elements_site_under_plate_and_step_mask(float64):
    """``pyro.sample(name, ObservedElements(fn, m).mask(step_mask), obs=x)`` scores
    step_mask * log p(observed elements), with NaN at the unobserved ones."""
    logits, loc, scale = torch.randn(4, K), torch.randn(4, K, D), torch.rand(4, K, D) + 0.2
    fn = DiagonalNormalMixture(logits, loc, scale)
    mask = _rand_mask((4, D), 3)
    x = torch.where(mask, torch.randn(4, D), torch.full((4, D), float("nan")))
    step_mask = torch.tensor([True, True, False, True])

    def model():
        with pyro.plate("b", 4):
            pyro.sample("x", ObservedElements(fn, mask).mask(step_mask), obs=x)

    tr = poutine.trace(model).get_trace()
    tr.compute_log_prob()
    ref = fn.masked_log_prob(torch.where(mask, x, torch.zeros_like(x)), mask) * step_mask
    torch.testing.assert_close(tr.nodes["x"]["log_prob"], ref, rtol=1e-12, atol=0)
    assert torch.isfinite(tr.log_prob_sum())


def test_observed_elements_delegates_and_expand_keeps_the_mask(float64):
    fn, x = _families((3,))["normal"]
    mask = _rand_mask((3, D), 4)
    w = ObservedElements(fn, mask)
    assert w.batch_shape == (3,) and w.event_shape == (D,) and w.has_rsample
    assert w.support.base_constraint is dist.constraints.real and w.support.event_dim == 1
    assert torch.equal(w.mean, fn.mean) and torch.equal(w.variance, fn.variance)
    assert w.rsample((5,)).shape == (5, 3, D) and w.sample().shape == (3, D)
    e = w.expand((2, 3))
    assert e.batch_shape == (2, 3) and torch.equal(e.element_mask, mask)
    torch.testing.assert_close(
        e.log_prob(x.expand(2, 3, D)), masked_log_prob(fn, x, mask).expand(2, 3), rtol=0, atol=0
    )
    assert w.expand((3,)) is w
    with pytest.raises(ValueError, match="event shape"):
        ObservedElements(dist.Normal(0.0, 1.0), torch.ones((), dtype=torch.bool))


@pytest.mark.parametrize(
    "name", ["DMM", "SRNN", "VRNN", "VRAE", "VOSP", "VAERNN", "STORN", "RNNBaseline"]
)
def test_an_unknown_option_names_itself_and_what_the_emission_takes(name):
    """Extra keywords go to make_emission: an unknown one is refused in one sentence that names
    it, the two the emission takes, and input_dim when the option names known inputs."""
    import pyro_seq.models as models

    cls = getattr(models, name)
    with pytest.raises(TypeError) as err:
        cls(3, control_dim=2)
    msg = str(err.value)
    assert msg.startswith(f"{name} got unknown option(s) ['control_dim']")
    assert "num_components, min_scale" in msg
    if name in ("DMM", "SRNN", "VRNN"):
        assert msg.endswith(f"given to {name} as input_dim")
    else:
        assert f"{name} takes no known inputs (DMM, SRNN, VRNN take input_dim" in msg
    with pytest.raises(TypeError, match=r"\['colour'\]: besides") as err:
        cls(3, colour=1)
    assert "input_dim" not in str(err.value)
    cls(3, likelihood="gmm", num_components=2, min_scale=1e-2)  # the two it takes pass through
