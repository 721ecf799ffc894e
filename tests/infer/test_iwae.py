"""IWAE: per-data-point bound, ordering ELBO <= IWAE_K <= log p(x), exactness, DReG gradients."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import RenyiELBO, Trace_ELBO

from pyro_seq.infer import IWAE, LatentScale
from pyro_seq.ops.resampling import log_mean_exp
from tests.infer._lg import grads, guide_param_slice, make_data, make_model, make_perturbed

LENGTHS = [6, 3, 1, 5]


def rel_err(a, b):
    """max |a - b| / max |b| (scalars or tensors)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return ((a - b).abs().max() / b.abs().max()).item()


def manual_iwae(m, x, mask, K, beta=1.0):
    """Reference: sum_b log mean_k w_{k,b}, w from traces with K particles at dim -2."""
    with pyro.plate("num_particles_vectorized", K, dim=-2):
        gtr = pyro.poutine.trace(m.guide).get_trace(x, mask)
        mtr = pyro.poutine.trace(pyro.poutine.replay(m.model, trace=gtr)).get_trace(x, mask)
    lw = 0.0
    for name, s in mtr.nodes.items():
        if s["type"] == "sample":
            lp = s["fn"].log_prob(s["value"])
            if s["is_observed"]:
                lw = lw + lp
            else:
                q = gtr.nodes[name]
                lw = lw + beta * (lp - q["fn"].log_prob(q["value"]))
    return log_mean_exp(lw, dim=0).sum()


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_value_and_gradient_are_per_sequence_log_mean_exp(float64, beta):
    # loss and standard gradient against the hand-written bound (same random numbers), for a
    # structured guide with parameters of its own and model parameters shared with it.
    # Measured relative errors (float64): loss <= 3.1e-16, gradient <= 3.3e-16 (was 1e-5/1e-4).
    m = make_perturbed()
    x, mask = make_data(m, LENGTHS)
    ls = LatentScale(beta)
    torch.manual_seed(0)
    loss = IWAE(num_particles=5, max_plate_nesting=1).loss_and_grads(
        ls(m.model), ls(m.guide), x, mask
    )
    g = grads(m)
    torch.manual_seed(0)
    ref = manual_iwae(m, x, mask, 5, beta)
    (-ref).backward()
    g_ref = grads(m)
    assert rel_err(loss, -ref.item()) < 1e-9
    assert rel_err(g, g_ref) < 1e-9
    assert g_ref.abs().max() > 0.1  # a gradient to compare


@pytest.mark.parametrize("vectorize", [True, False])
def test_equals_renyi_alpha0_for_one_data_point(float64, vectorize):
    # RenyiELBO(alpha=0) takes log-mean-exp of the whole batch's weight: for one sequence the
    # two objectives are the same estimator; the random numbers are drawn in the same order.
    m = make_model(guide="optimal", learnable=True)
    x, mask = make_data(m, [5])
    kw = dict(num_particles=6, vectorize_particles=vectorize, max_plate_nesting=1)
    torch.manual_seed(3)
    a = IWAE(**kw).loss_and_grads(m.model, m.guide, x, mask)
    ga = grads(m)
    torch.manual_seed(3)
    b = RenyiELBO(alpha=0.0, **kw).loss_and_grads(m.model, m.guide, x, mask)
    gb = grads(m)
    assert rel_err(a, b) < 1e-9
    assert rel_err(ga, gb) < 1e-9


def test_equals_renyi_alpha0_without_plates(float64):
    def model():
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        pyro.sample("x", dist.Normal(z, 0.5), obs=torch.tensor(1.3))

    def guide():
        loc = pyro.param("loc", torch.tensor(0.2))
        pyro.sample("z", dist.Normal(loc, 0.8))

    pyro.clear_param_store()
    torch.manual_seed(4)
    a = IWAE(num_particles=7, max_plate_nesting=0).loss_and_grads(model, guide)
    ga = pyro.param("loc").grad.clone()
    pyro.clear_param_store()
    torch.manual_seed(4)
    b = RenyiELBO(
        alpha=0.0, num_particles=7, vectorize_particles=True, max_plate_nesting=0
    ).loss_and_grads(model, guide)
    gb = pyro.param("loc").grad.clone()
    pyro.clear_param_store()
    assert rel_err(a, b) < 1e-9 and rel_err(ga, gb) < 1e-9


def test_one_particle_is_trace_elbo(float64):
    m = make_model(guide="optimal", learnable=True)
    x, mask = make_data(m, LENGTHS)
    torch.manual_seed(5)
    a = IWAE(num_particles=1).loss_and_grads(m.model, m.guide, x, mask)  # no plate guess
    ga = grads(m)
    torch.manual_seed(5)
    b = Trace_ELBO().loss_and_grads(m.model, m.guide, x, mask)
    gb = grads(m)
    assert rel_err(a, b) < 1e-9
    assert rel_err(ga, gb) < 1e-9


def test_bounds_are_ordered_and_gap_shrinks():
    # One sequence (T = 8) copied R times: the batch gives R independent draws of log Z_K.
    m = make_model(guide="prior")
    x1, _ = make_data(m, [8], seed=2)
    R = 400
    x = x1.expand(R, 8, 2).contiguous()
    exact = m.exact_log_likelihood(x1)[0].item()
    means, ses = {}, {}
    with torch.no_grad():
        torch.manual_seed(6)
        elbo = torch.stack([-torch.tensor(Trace_ELBO().loss(m.model, m.guide, x)) / R])
        for K in (1, 4, 16, 64):
            log_z, _ = IWAE(num_particles=K, max_plate_nesting=1).log_z(m.model, m.guide, x)
            means[K], ses[K] = log_z.mean().item(), (log_z.std() / R**0.5).item()
    # the K=1 bound is the ELBO: same expectation as Trace_ELBO's estimate (R draws each)
    assert abs(means[1] - elbo.item()) < 4 * 2**0.5 * ses[1]
    gaps = [exact - means[K] for K in (1, 4, 16, 64)]
    # ELBO <= IWAE_4 <= IWAE_16 <= IWAE_64 <= log p(x), each step significant at 3 standard
    # errors of the difference (measured, seed 6: gaps 56.8, 23.5, 10.4, 5.2 nats for
    # K = 1, 4, 16, 64 with standard errors 1.9, 0.74, 0.35, 0.20)
    for Ka, Kb in ((1, 4), (4, 16), (16, 64)):
        assert means[Kb] - means[Ka] > 3 * (ses[Ka] ** 2 + ses[Kb] ** 2) ** 0.5, (Ka, Kb, means)
    assert exact - means[64] > 3 * ses[64]
    assert all(g > 0 for g in gaps) and gaps == sorted(gaps, reverse=True)


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("vectorize", [True, False])
def test_exact_posterior_gives_log_likelihood_and_its_gradient(float64, K, vectorize):
    # log p(x, z) - log q(z | x) = log p(x) for every z and every parameter value: an identity
    # (measured relative errors: loss 1.7e-16, gradients <= 5.9e-15; was abs 1e-3 / 2e-3)
    from pyro_seq.ops.kalman import kalman_filter

    m = make_model(guide="smoothing", learnable=True)
    x, mask = make_data(m, LENGTHS)
    loss = IWAE(num_particles=K, vectorize_particles=vectorize, max_plate_nesting=1).loss_and_grads(
        m.model, m.guide, x, mask
    )
    g = {n: p.grad.clone() for n, p in m.named_parameters()}
    exact = m.exact_log_likelihood(x, mask).sum().item()
    assert rel_err(-loss, exact) < 1e-9  # padded steps (x = 1e3 there) add nothing
    m.zero_grad()
    ll = kalman_filter(
        x, m.init_loc, m.init_cov, m.A, m.Q, m.C, m.R, mask=mask, method="sequential"
    ).log_likelihoods.sum()
    (-ll).backward()
    for n, p in m.named_parameters():
        assert rel_err(g[n], p.grad) < 1e-9, n


@pytest.mark.parametrize("estimator", ["standard", "dreg"])
def test_loss_and_loss_and_grads_agree(float64, estimator):
    # the three entry points run the same computation: same value, same gradient
    m = make_perturbed()
    x, mask = make_data(m, LENGTHS)
    elbo = IWAE(num_particles=4, max_plate_nesting=1, gradient_estimator=estimator)
    torch.manual_seed(7)
    a = elbo.loss(m.model, m.guide, x, mask)
    torch.manual_seed(7)
    b = elbo.loss_and_grads(m.model, m.guide, x, mask)
    gb = grads(m)
    torch.manual_seed(7)
    c = elbo.differentiable_loss(m.model, m.guide, x, mask)
    c.backward()
    gc = grads(m)
    assert rel_err(b, a) < 1e-12 and rel_err(c.item(), a) < 1e-12
    assert rel_err(gc, gb) < 1e-12 and gb.abs().max() > 0.1


def test_padding_values_do_not_matter():
    m = make_model(guide="optimal")
    x, mask = make_data(m, LENGTHS)
    x2 = torch.where(mask.unsqueeze(-1), x, -x)
    torch.manual_seed(8)
    a = IWAE(num_particles=4, max_plate_nesting=1).loss(m.model, m.guide, x, mask)
    torch.manual_seed(8)
    b = IWAE(num_particles=4, max_plate_nesting=1).loss(m.model, m.guide, x2, mask)
    assert a == b


def test_subsampling_scales_the_per_sequence_bound(float64):
    m = make_model(guide="optimal")
    x, mask = make_data(m, LENGTHS)
    torch.manual_seed(9)
    a = IWAE(num_particles=4, max_plate_nesting=1).loss(m.model, m.guide, x, mask)
    torch.manual_seed(9)
    b = IWAE(num_particles=4, max_plate_nesting=1).loss(m.model, m.guide, x, mask, num_sequences=40)
    assert rel_err(b, 10 * a) < 1e-9  # N / B = 40 / 4 outside the log-mean-exp


@pytest.mark.parametrize("estimator", ["standard", "dreg"])
@pytest.mark.parametrize("K,vectorize", [(1, True), (3, True), (3, False)])
def test_program_without_sample_sites_gives_zero(K, vectorize, estimator):
    # as Trace_ELBO: a model (and guide) without sample sites has bound 0 (was StopIteration)
    def model():
        pyro.deterministic("d", torch.tensor(1.0))

    def guide():
        pass

    elbo = IWAE(num_particles=K, vectorize_particles=vectorize, gradient_estimator=estimator)
    assert elbo.loss(model, guide) == 0.0 == Trace_ELBO().loss(model, guide)
    assert elbo.loss_and_grads(model, guide) == 0.0
    loss = elbo.differentiable_loss(model, guide)
    assert torch.is_tensor(loss) and loss.item() == 0.0 and not loss.requires_grad


def test_dreg_same_expectation_lower_guide_variance():
    # Paired draws (same random numbers) of the standard and DReG gradient of IWAE_8 for all
    # parameters of a structured guide q(z_t | z_{t-1}, x_t) with parameters of its own and
    # model parameters it shares. Both are unbiased: the paired difference has mean zero.
    m = make_perturbed()
    x, mask = make_data(m, [4, 4, 3] * 4)  # 12 data points per draw
    std_, dreg = (
        IWAE(num_particles=8, max_plate_nesting=1),
        IWAE(num_particles=8, max_plate_nesting=1, gradient_estimator="dreg"),
    )
    N = 30
    gs, gd = [], []
    for i in range(N):
        torch.manual_seed(1000 + i)
        std_.loss_and_grads(m.model, m.guide, x, mask)
        gs.append(grads(m))
        torch.manual_seed(1000 + i)
        dreg.loss_and_grads(m.model, m.guide, x, mask)
        gd.append(grads(m))
    gs, gd = torch.stack(gs), torch.stack(gd)
    diff = gs - gd
    z = diff.mean(0) / (diff.std(0) / N**0.5 + 1e-12)
    # |paired-difference mean| within 4 standard errors for every coordinate
    assert z.abs().max() < 4.0, z
    idx = guide_param_slice(m)
    var_std, var_dreg = gs[:, idx].var(0), gd[:, idx].var(0)
    # measured (100 paired draws, 12 data points): guide-gradient variance ratio DReG /
    # standard = 0.34 (K=2), 0.26 (K=8), 0.14 (K=32). (For the model parameters that this guide
    # shares, A, C, Q, R, DReG's variance was higher here: 612 vs 317 at K=8.)
    ratio = (var_dreg.sum() / var_std.sum()).item()
    assert ratio < 0.5, ratio


def test_dreg_requires_reparameterized_guide():
    def model():
        z = pyro.sample("z", dist.Bernoulli(0.3))
        pyro.sample("x", dist.Normal(2 * z - 1, 1.0), obs=torch.tensor(0.5))

    def guide():
        p = pyro.param("p", torch.tensor(0.5), constraint=dist.constraints.unit_interval)
        pyro.sample("z", dist.Bernoulli(p))

    with pytest.raises(ValueError, match="reparameterized"):
        IWAE(num_particles=2, max_plate_nesting=0, gradient_estimator="dreg").loss_and_grads(
            model, guide
        )


def test_score_function_gradient_is_unbiased_for_discrete_latents():
    # z ~ Bern(0.3), x | z ~ N(2z - 1, 1), q(z) = Bern(sigmoid(phi)). For K = 2 the bound
    # E[log (w_1 + w_2) / 2] is a finite sum over (z_1, z_2), so its exact gradient is known.
    R = 200
    xobs = torch.full((R,), 0.5)

    def model():
        with pyro.plate("data", R):
            z = pyro.sample("z", dist.Bernoulli(0.3))
            pyro.sample("x", dist.Normal(2 * z - 1, 1.0), obs=xobs)

    def guide():
        phi = pyro.param("phi", torch.tensor(0.4))
        with pyro.plate("data", R):
            pyro.sample("z", dist.Bernoulli(logits=phi))

    phi = torch.tensor(0.4, requires_grad=True)
    exact = 0.0
    for z1 in (0.0, 1.0):
        for z2 in (0.0, 1.0):
            lw = []
            for z in (z1, z2):
                zt = torch.tensor(z)
                lw.append(
                    dist.Bernoulli(0.3).log_prob(zt)
                    + dist.Normal(2 * zt - 1, 1.0).log_prob(torch.tensor(0.5))
                    - dist.Bernoulli(logits=phi).log_prob(zt)
                )
            q = (
                dist.Bernoulli(logits=phi).log_prob(torch.tensor(z1)).exp()
                * dist.Bernoulli(logits=phi).log_prob(torch.tensor(z2)).exp()
            )
            exact = exact + q * log_mean_exp(torch.stack(lw), 0)
    (g_exact,) = torch.autograd.grad(exact, phi)
    elbo = IWAE(num_particles=2, max_plate_nesting=1)
    est = []
    for i in range(30):
        pyro.clear_param_store()
        torch.manual_seed(i)
        elbo.loss_and_grads(model, guide)
        est.append(-pyro.param("phi").grad / R)  # mean over R independent data points
    est = torch.stack(est)
    se = est.std() / len(est) ** 0.5
    assert abs(est.mean() - g_exact) < 4 * se, (est.mean(), g_exact, se)


def test_argument_validation():
    with pytest.raises(ValueError, match="num_particles"):
        IWAE(num_particles=0)
    with pytest.raises(ValueError, match="gradient_estimator"):
        IWAE(gradient_estimator="vimco")
    with pytest.raises(ValueError, match="score_baseline"):
        IWAE(score_baseline="mean")
