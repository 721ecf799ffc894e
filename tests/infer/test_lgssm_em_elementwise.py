"""EM for the LGSSM with per-element masks (pyro_seq.infer.lgssm_em, "Missing data").

References are dense float64 Gaussians over the whole sequence (tests/dense_gaussian.py):
the exact log-likelihood, the expected complete-data log-likelihood with the missing elements
integrated out (Q_obs, diagonal/scalar R) and with them as latents (Q_aug, full R).
"""

import math

import pytest
import torch

from pyro_seq.infer import LGSSMParams, em_step, lgssm_em, lgssm_log_likelihood
from tests.dense_gaussian import condition_z, dense_lgssm, log_marginal, observed_index
from tests.infer.test_lgssm_em import DT, expected_complete_loglik, perturb, random_params, simulate

EMISSION = ("observation_matrix", "observation_cov")


def with_structure(p, structure):
    R = p.observation_cov
    if structure == "diag":
        R = torch.diag_embed(R.diagonal())
    elif structure == "scalar":
        R = R.diagonal().mean() * torch.eye(R.shape[-1], dtype=DT)
    return p._replace(observation_cov=R)


def element_mask(N, T, D, p_missing, seed):
    """Random per-element mask with, in addition, one fully missing and one fully observed step."""
    m = torch.rand(N, T, D, generator=torch.Generator().manual_seed(seed)) > p_missing
    m[0, 1] = False
    m[-1, 2] = True
    return m


def rel(a, b):
    """Relative Frobenius distance |a - b| / |b|."""
    return ((a - b).norm() / b.norm()).item()


def dense_model(p, T, controls_n):
    offsets = None if controls_n is None else controls_n @ p.control_matrix.T
    return dense_lgssm(
        p.initial_loc,
        p.initial_cov,
        p.transition_matrix,
        p.transition_cov,
        p.observation_matrix,
        p.observation_cov,
        T,
        offsets,
    )


def augmented_index(mask_n):
    """Flat indices into x_n (T*D) of the elements of steps with at least one observed element."""
    steps = mask_n.any(-1, keepdim=True).expand(mask_n.shape)
    return steps.reshape(-1).nonzero().squeeze(-1)


def joint_moments(dn, A):
    """Mean and covariance of v = (z_{1:T}, x[A])."""
    mu = torch.cat([dn.mean_z, dn.mean_x[A]])
    Sxz = dn.cov_xz[A]
    Sig = torch.cat([torch.cat([dn.cov_zz, Sxz.T], 1), torch.cat([Sxz, dn.cov_xx[A][:, A]], 1)], 0)
    return mu, Sig


def expected_log_normal(mu, Sig, mean_q, cov_q):
    """E_{v ~ N(mean_q, cov_q)}[log N(v; mu, Sig)]."""
    L = torch.linalg.cholesky(Sig)
    d = torch.linalg.solve_triangular(L, (mean_q - mu)[:, None], upper=False)
    Linv_cov = torch.linalg.solve_triangular(L, cov_q, upper=False)
    tr = torch.linalg.solve_triangular(L, Linv_cov.T, upper=False).diagonal().sum()
    return -0.5 * (
        mu.numel() * math.log(2 * math.pi) + 2 * L.diagonal().log().sum() + (d**2).sum() + tr
    )


def augmented_posterior(p_old, x, mask):
    """Per sequence, the exact posterior of v = (z, x[A]) given the observed elements under p_old
    (observed entries get their values and zero variance, missing ones their conditional law)."""
    N, T, D = x.shape
    out = []
    dn = dense_model(p_old, T, None)
    for n in range(N):
        A = augmented_index(mask[n])
        mu, Sig = joint_moments(dn, A)
        obs_in_v = dn.T * dn.S + mask[n].reshape(-1)[A].nonzero().squeeze(-1)
        xo = x[n].reshape(-1)[A][obs_in_v - dn.T * dn.S]
        gain = torch.linalg.solve(Sig[obs_in_v][:, obs_in_v], Sig[obs_in_v]).T
        mean = mu + gain @ (xo - mu[obs_in_v])
        cov = Sig - gain @ Sig[obs_in_v]
        out.append((mean, 0.5 * (cov + cov.T)))
    return out


def expected_augmented_loglik(p, x, mask, posterior):
    """Q_aug(p) = E_{p(z, x_mis | x_obs, p_old)}[log p(x_obs, x_mis, z | p)] summed over sequences,
    x_mis the missing elements of the steps that have an observed element (fully missing steps
    are integrated out), from the dense joint Gaussian."""
    total = 0.0
    for n in range(x.shape[0]):
        mu, Sig = joint_moments(dense_model(p, x.shape[1], None), augmented_index(mask[n]))
        total = total + expected_log_normal(mu, Sig, *posterior[n])
    return total


def observed_posterior(p_old, x, mask):
    """Per sequence, the exact posterior (mean (T, S), cov (T S, T S)) of z given the observed elements."""
    dn = dense_model(p_old, x.shape[1], None)
    return [condition_z(dn, x[n], observed_index(dn, mask[n])) for n in range(x.shape[0])]


def correlated(p):
    """Add 0.3 to every entry of R: correlations of 0.2-0.5 between all noise elements."""
    return p._replace(observation_cov=p.observation_cov + 0.3)


def _setup(structure, seed=0, N=3, T=5, S=2, D=3):
    true = random_params(S, D, seed=seed)
    _, x = simulate(true, N, T, seed=seed + 2)
    mask = element_mask(N, T, D, 0.35, seed=seed + 3)
    x = torch.where(
        mask, x, torch.tensor(float("nan"), dtype=DT)
    )  # missing entries must be ignored
    return with_structure(perturb(true, seed=seed + 1), structure), x, mask


# ---------------------------------------------------------------------------------------------
# (a) monotone log-likelihood


@pytest.mark.parametrize("learn", ["all", EMISSION])
@pytest.mark.parametrize("structure", ["full", "diag", "scalar"])
def test_log_likelihood_never_decreases_with_element_mask(structure, learn):
    """EM with a per-element mask (30% of the elements missing) never decreases
    log p(x_obs | theta), computed exactly by the Kalman filter with the same mask."""
    N, T, S, D = 6, 20, 2, 3
    true = random_params(S, D, seed=20)  # R with correlated noise
    _, x = simulate(true, N, T, seed=21)
    mask = element_mask(N, T, D, 0.3, seed=22)
    init = with_structure(perturb(true, seed=23, scale=0.5), structure)
    res = lgssm_em(
        x, init, num_iters=15, learn=learn, mask=mask, observation_cov_structure=structure
    )
    lls = res.log_likelihoods
    steps = lls[1:] - lls[:-1]
    # the only slack is float64 rounding of a sum of ~N*T*D terms
    assert steps.min() >= -1e-11 * lls.abs().max(), steps
    assert lls[-1] > lls[0] + 5.0
    assert rel(lls[-1], lgssm_log_likelihood(x, res.params, mask=mask)) <= 1e-12
    # the learned R stays in its family (exactly: diagonal, resp. equal diagonal entries)
    R = res.params.observation_cov
    if structure != "full":
        assert torch.equal(R, torch.diag_embed(R.diagonal()))
    if structure == "scalar":
        assert torch.all(R.diagonal() == R[0, 0])


def test_full_r_em_monotone_from_the_truth():
    """Near the optimum, with strongly correlated noise, the monotonicity check is sharp: the
    exact S&S update (S1-S6) never decreases log p(x_obs), while the simplifications that drop
    the conditional structure of the missing block do (measured when this test was written:
    filling x_mis with C z_t and using the old R_MM with zero cross terms, i.e. K = 0, loses
    up to 1.13 nats in an iteration (also with the row-wise C); keeping K but using R_MM instead
    of R_{MM.O} loses up to 0.17 nats; dropping V_t makes R indefinite)."""
    true = correlated(random_params(2, 3, seed=20))
    _, x = simulate(true, 6, 20, seed=21)
    mask = element_mask(6, 20, 3, 0.3, seed=22)
    lls = lgssm_em(x, true, num_iters=8, learn=EMISSION, mask=mask).log_likelihoods
    steps = lls[1:] - lls[:-1]
    assert steps.min() >= -1e-11 * lls.abs().max(), steps


def test_log_likelihood_matches_dense_with_element_mask():
    """The quantity test (a) monitors is the exact log p(x_obs): compare with the dense joint Gaussian."""
    p, x, mask = _setup("full", seed=30)
    dn = dense_model(p, x.shape[1], None)
    dense = sum(log_marginal(dn, x[n], observed_index(dn, mask[n])) for n in range(x.shape[0]))
    assert rel(lgssm_log_likelihood(x, p, mask=mask), dense) <= 1e-12


# ---------------------------------------------------------------------------------------------
# (b) the M-step zeroes the gradient of the expected complete-data log-likelihood


def _rel_grad(q_fn, new_leaves, old_leaves):
    """max over parameters of |grad Q(new)| / |grad Q(old)| (covariance gradients symmetrized)."""

    def grads(leaves):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in leaves.items()}
        g = torch.autograd.grad(q_fn(leaves), list(leaves.values()))
        # only symmetric perturbations are meaningful for a full covariance
        return {
            k: (0.5 * (gk + gk.mT) if k == "R" and gk.dim() == 2 else gk)
            for k, gk in zip(leaves, g)
        }

    g_new, g_old = grads(new_leaves), grads(old_leaves)
    return {k: (g_new[k].norm() / g_old[k].norm()).item() for k in g_new}, g_new, g_old


@pytest.mark.parametrize("learn", [EMISSION, ("observation_matrix",), ("observation_cov",)])
@pytest.mark.parametrize("structure", ["diag", "scalar"])
def test_rowwise_m_step_zeroes_gradient_of_observed_q(structure, learn):
    """Diagonal / scalar R: the M-step (eqs. E1-E2') is the stationary point of
    Q_obs = E_{p(z | x_obs, old)}[log p(x_obs, z | theta)], where only the observed marginal
    N(C_O z_t, R_OO) of each x_t enters (missing elements integrated out exactly)."""
    old, x, mask = _setup(structure, seed=40)
    post = observed_posterior(old, x, mask)
    new, _ = em_step(x, old, learn=learn, mask=mask, observation_cov_structure=structure)

    def params_of(leaves):
        r = leaves["R"]
        R = torch.diag_embed(r) if structure == "diag" else r * torch.eye(x.shape[-1], dtype=DT)
        return old._replace(observation_matrix=leaves["C"], observation_cov=R)

    def q_fn(leaves):
        return expected_complete_loglik(params_of(leaves), x, mask, None, post)

    def leaves_of(p):
        d = p.observation_cov.diagonal()
        return {"C": p.observation_matrix, "R": d if structure == "diag" else d[0]}

    ratios, g_new, _ = _rel_grad(q_fn, leaves_of(new), leaves_of(old))
    learned = {"observation_matrix": "C", "observation_cov": "R"}
    for name in learn:
        assert ratios[learned[name]] <= 1e-10, (ratios, g_new)
    for name in set(EMISSION) - set(learn):
        assert torch.equal(getattr(new, name), getattr(old, name))
    # a maximum, not only a stationary point
    q_new = q_fn(leaves_of(new))
    g = torch.Generator().manual_seed(41)
    for _ in range(3):
        bumped = dict(leaves_of(new))
        for name in learn:
            k = learned[name]
            bumped[k] = bumped[k] + 1e-2 * torch.randn(bumped[k].shape, generator=g, dtype=DT)
        assert q_fn(bumped) <= q_new + 1e-12


@pytest.mark.parametrize("learn", [EMISSION, ("observation_matrix",), ("observation_cov",)])
def test_full_r_m_step_zeroes_gradient_of_augmented_q(learn):
    """Full R: the M-step (eqs. S1-S6) is the stationary point and maximum of
    Q_aug = E_{p(z, x_mis | x_obs, old)}[log p(x_obs, x_mis, z | theta)] (Shumway & Stoffer's
    missing-data EM, with the conditional law of x_mis given x_obs and z under a correlated R)."""
    old, x, mask = _setup("full", seed=50)
    old = correlated(old)  # K = R_MO R_OO^{-1} != 0 for every pattern
    post = augmented_posterior(old, x, mask)
    new, _ = em_step(x, old, learn=learn, mask=mask)

    def q_fn(leaves):
        return expected_augmented_loglik(
            old._replace(observation_matrix=leaves["C"], observation_cov=leaves["R"]), x, mask, post
        )

    def leaves_of(p):
        return {"C": p.observation_matrix, "R": p.observation_cov}

    ratios, g_new, _ = _rel_grad(q_fn, leaves_of(new), leaves_of(old))
    learned = {"observation_matrix": "C", "observation_cov": "R"}
    for name in learn:
        assert ratios[learned[name]] <= 1e-10, (ratios, g_new)
    for name in set(EMISSION) - set(learn):
        assert torch.equal(getattr(new, name), getattr(old, name))
    q_new = q_fn(leaves_of(new))
    g = torch.Generator().manual_seed(51)
    for _ in range(3):
        bumped = dict(leaves_of(new))
        for name in learn:
            k = learned[name]
            e = torch.randn(bumped[k].shape, generator=g, dtype=DT)
            bumped[k] = bumped[k] + 1e-2 * (e + e.mT if k == "R" else e)
        assert q_fn(bumped) <= q_new + 1e-12


def test_full_r_update_is_not_the_observed_q_stationary_point():
    """Why the full-R path maximizes Q_aug and is tested against it: with correlated noise and
    partially observed steps, Q_obs (missing elements integrated out) keeps a gradient at the
    S&S update, while Q_aug (test above) does not. If the data had no partial steps the two
    would coincide and this test would fail."""
    old, x, mask = _setup("full", seed=50)
    old = correlated(old)
    post = observed_posterior(old, x, mask)
    new, _ = em_step(x, old, learn=EMISSION, mask=mask)

    def q_fn(leaves):
        return expected_complete_loglik(
            old._replace(observation_matrix=leaves["C"], observation_cov=leaves["R"]),
            x,
            mask,
            None,
            post,
        )

    ratios, _, _ = _rel_grad(
        q_fn,
        {"C": new.observation_matrix, "R": new.observation_cov},
        {"C": old.observation_matrix, "R": old.observation_cov},
    )
    assert min(ratios.values()) > 1e-3, ratios


# ---------------------------------------------------------------------------------------------
# (c) per-element path == per-step path when every step is all-or-nothing


@pytest.mark.parametrize("structure", ["full", "diag", "scalar"])
@pytest.mark.parametrize("pattern", ["ones", "whole_steps"])
def test_element_mask_matches_step_mask(structure, pattern):
    """A per-element mask whose steps are all observed or all missing gives the per-step
    path's update (F_t = I, H_t = 0, V_t = 0 in eqs. S1-S2; E1-E2' with equal weights per row)."""
    N, T, S, D = 4, 12, 2, 3
    true = random_params(S, D, seed=60)
    _, x = simulate(true, N, T, seed=61)
    p = with_structure(perturb(true, seed=62), structure)
    if pattern == "ones":
        step_mask = None
        elem_mask = torch.ones(N, T, D, dtype=torch.bool)
    else:
        step_mask = torch.rand(N, T, generator=torch.Generator().manual_seed(63)) > 0.3
        elem_mask = step_mask.unsqueeze(-1).expand(N, T, D).clone()
    a, ll_a = em_step(x, p, learn="all", mask=elem_mask, observation_cov_structure=structure)
    b, ll_b = em_step(x, p, learn="all", mask=step_mask, observation_cov_structure=structure)
    for k in a._fields:
        if getattr(b, k) is not None:
            assert rel(getattr(a, k), getattr(b, k)) <= 1e-9, k
    assert rel(ll_a, ll_b) <= 1e-12
    # and the emission update really changed something (the comparison is not vacuous)
    assert rel(a.observation_matrix, p.observation_matrix) > 1e-3
    assert rel(a.observation_cov, p.observation_cov) > 1e-3


# ---------------------------------------------------------------------------------------------
# (d) bad input


def test_bad_masks_and_structures_raise():
    N, T, S, D = 2, 6, 2, 3
    p = random_params(S, D, seed=70)
    _, x = simulate(p, N, T, seed=71)
    good = element_mask(N, T, D, 0.3, seed=72)
    ref, _ = em_step(x, p, mask=good)
    # 0/1 masks in any real dtype are accepted and equal the bool mask
    for m in (good.int(), good.double(), good.to(torch.uint8)):
        out, _ = em_step(x, p, mask=m)
        assert all(torch.equal(u, v) for u, v in zip(out, ref) if u is not None)
    bad_values = [
        good.double() * 0.5,
        good.int() * 2,
        torch.where(good, 1.0, float("nan")),
        good.double() - 1,
    ]
    for m in bad_values:
        with pytest.raises(ValueError, match="only 0 and 1"):
            em_step(x, p, mask=m)
        with pytest.raises(ValueError, match="only 0 and 1"):
            lgssm_em(x, p, num_iters=1, mask=m)
        with pytest.raises(ValueError, match="only 0 and 1"):
            lgssm_log_likelihood(x, p, mask=m)
    for shape in [(N, T + 1), (N, T, D + 1), (N, T, 2), (T, N)]:
        with pytest.raises(ValueError, match=r"mask must have shape"):
            em_step(x, p, mask=torch.ones(shape, dtype=torch.bool))
    for shape in [(N + 1, T, D), (N, D, T), (N + 1, T)]:  # transposed / wrong batch
        with pytest.raises(ValueError, match="does not broadcast"):
            em_step(x, p, mask=torch.ones(shape, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"must be bool .*got dtype torch.complex64"):
        em_step(x, p, mask=torch.ones(N, T, D, dtype=torch.complex64))
    # structures
    with pytest.raises(ValueError, match="one of"):
        em_step(x, p, mask=good, observation_cov_structure="banded")
    with pytest.raises(ValueError, match="diagonal observation_cov"):
        em_step(x, p, mask=good, observation_cov_structure="diag")
    with pytest.raises(ValueError, match="s \\* I"):
        em_step(x, with_structure(p, "diag"), mask=good, observation_cov_structure="scalar")
    # an element that is never observed: its row of C is not identified
    never = good.clone()
    never[..., 1] = False
    with pytest.raises(ValueError, match=r"element\(s\) \[1\]"):
        em_step(x, with_structure(p, "diag"), mask=never, observation_cov_structure="diag")
    # nothing observed at all: no data for R in any structure
    nothing = torch.zeros(N, T, D, dtype=torch.bool)
    for structure in ("full", "diag", "scalar"):
        with pytest.raises(ValueError, match="no element of x is observed"):
            em_step(
                x,
                with_structure(p, structure),
                learn=("observation_cov",),
                mask=nothing,
                observation_cov_structure=structure,
            )
    with pytest.raises(ValueError, match="no step of x is observed"):
        em_step(x, p, learn=("observation_cov",), mask=torch.zeros(N, T, dtype=torch.bool))
    # NaN at an observed position is an error; at a missing one it is ignored
    x_nan = x.clone()
    x_nan[0, 0, 0] = float("nan")
    obs = good.clone()
    obs[0, 0, 0] = True
    with pytest.raises(ValueError, match="NaN"):
        em_step(x_nan, p, mask=obs)
    obs[0, 0, 0] = False
    out_nan, _ = em_step(x_nan, p, mask=obs)
    out_ok, _ = em_step(x, p, mask=obs)
    assert all(torch.equal(u, v) for u, v in zip(out_nan, out_ok) if u is not None)


@pytest.mark.parametrize("structure", ["full", "diag"])
def test_element_mask_broadcasts_like_the_kalman_filter(structure):
    """A per-element mask follows the batch rules of pyro_seq.ops.kalman: an unbatched
    sequence equals a batch of one, and a shared (T, D) mask equals its expansion."""
    p = with_structure(correlated(random_params(2, 3, seed=80)), structure)
    _, x = simulate(p, 3, 8, seed=81)
    mask = element_mask(3, 8, 3, 0.3, seed=82)
    for (xa, ma), (xb, mb) in [
        ((x[0], mask[0]), (x[:1], mask[:1])),
        ((x, mask[0]), (x, mask[0].expand(3, 8, 3))),
    ]:
        a, _ = em_step(xa, p, mask=ma, observation_cov_structure=structure)
        b, _ = em_step(xb, p, mask=mb, observation_cov_structure=structure)
        for k in a._fields:
            if getattr(b, k) is not None:
                assert rel(getattr(a, k), getattr(b, k)) <= 1e-12, k


def test_square_mask_is_ambiguous_and_the_explicit_masks_are_not():
    # B == T == D: a (B, T) per-step mask has the shape of a (T, D) per-element mask
    g = torch.Generator().manual_seed(5)
    T = D = 3
    x = torch.randn(T, T, D, generator=g, dtype=torch.float64)
    params = LGSSMParams(
        initial_loc=torch.zeros(2, dtype=torch.float64),
        initial_cov=torch.eye(2, dtype=torch.float64),
        transition_matrix=0.9 * torch.eye(2, dtype=torch.float64),
        transition_cov=0.1 * torch.eye(2, dtype=torch.float64),
        observation_matrix=torch.randn(D, 2, generator=g, dtype=torch.float64),
        observation_cov=0.5 * torch.eye(D, dtype=torch.float64),
    )
    steps = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]).bool()  # (B, T), prefix rows
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\) is ambiguous: with T == D == 3"):
        lgssm_log_likelihood(x, params, mask=steps)
    # per-step reading: each sequence scored on its own first steps
    per_step = lgssm_log_likelihood(x, params, step_mask=steps)
    by_rows = sum(lgssm_log_likelihood(x[b, : int(steps[b].sum())], params) for b in range(T))
    assert torch.allclose(per_step, by_rows, rtol=1e-12, atol=0)
    # per-element reading: the same (T, D) pattern for every sequence
    per_element = lgssm_log_likelihood(x, params, observation_mask=steps)
    expanded = lgssm_log_likelihood(x, params, observation_mask=steps.expand(T, T, D))
    assert torch.allclose(per_element, expanded, rtol=1e-12, atol=0)
    assert not torch.allclose(per_step, per_element)
    new, _ = em_step(x, params, step_mask=steps)
    res = lgssm_em(x, params, num_iters=3, step_mask=steps)
    assert (res.log_likelihoods.diff() >= -1e-10).all()
    with pytest.raises(ValueError, match="either mask or step_mask/observation_mask"):
        em_step(x, params, mask=steps, step_mask=steps)
