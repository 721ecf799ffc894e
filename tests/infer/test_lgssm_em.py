import math

import pytest
import torch

from pyro_seq.infer import LGSSMParams, em_step, lgssm_em, lgssm_log_likelihood
from pyro_seq.ops.kalman import kalman_smoother
from tests.dense_gaussian import condition_z, dense_lgssm, observed_index

DT = torch.float64


def spd(n, scale, g):
    M = torch.randn(n, n, generator=g, dtype=DT)
    return scale * (M @ M.T / n + 0.5 * torch.eye(n, dtype=DT))


def rel(a, b):
    """Relative Frobenius distance |a - b| / |b| (exact identities in float64: <= 1e-12)."""
    return ((a - b).norm() / b.norm()).item()


def random_params(S=2, D=2, U=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = 0.9 * torch.linalg.qr(torch.randn(S, S, generator=g, dtype=DT))[0]
    return LGSSMParams(
        initial_loc=torch.randn(S, generator=g, dtype=DT),
        initial_cov=spd(S, 1.0, g),
        transition_matrix=A,
        transition_cov=spd(S, 0.3, g),
        observation_matrix=torch.randn(D, S, generator=g, dtype=DT),
        observation_cov=spd(D, 0.4, g),
        control_matrix=torch.randn(S, U, generator=g, dtype=DT) if U else None,
    )


def simulate(params, N, T, controls=None, seed=0):
    """Ancestral sampling from the LGSSM, (N, T, S) states and (N, T, D) observations."""
    g = torch.Generator().manual_seed(seed)
    S, D = params.initial_loc.shape[-1], params.observation_matrix.shape[0]
    Lq = torch.linalg.cholesky(params.transition_cov)
    Lr = torch.linalg.cholesky(params.observation_cov)
    z = (
        params.initial_loc
        + torch.randn(N, S, generator=g, dtype=DT) @ torch.linalg.cholesky(params.initial_cov).T
    )
    zs, xs = [], []
    for t in range(T):
        if t > 0:
            z = z @ params.transition_matrix.T + torch.randn(N, S, generator=g, dtype=DT) @ Lq.T
            if controls is not None:
                z = z + controls[:, t] @ params.control_matrix.T
        zs.append(z)
        xs.append(z @ params.observation_matrix.T + torch.randn(N, D, generator=g, dtype=DT) @ Lr.T)
    return torch.stack(zs, 1), torch.stack(xs, 1)


def perturb(params, seed=1, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in params._asdict().items():
        if v is None:
            out[k] = None
        elif k.endswith("cov"):
            out[k] = v + spd(v.shape[-1], scale, g)
        else:
            out[k] = v + scale * torch.randn(v.shape, generator=g, dtype=DT)
    return LGSSMParams(**out)


def expected_complete_loglik(params, x, mask, controls, posterior):
    """E_q[log p(x_obs, z_{1:T} | params)] with q the (fixed) dense posterior of z, for every
    sequence, from the stacked joint Gaussian of (z, x_obs): an independent reference for the
    M-step (it must be maximized, with zero gradient, at em_step's output)."""
    total = 0.0
    N, T, D = x.shape
    for n in range(N):
        offsets = None if controls is None else controls[n] @ params.control_matrix.T
        dn = dense_lgssm(
            params.initial_loc,
            params.initial_cov,
            params.transition_matrix,
            params.transition_cov,
            params.observation_matrix,
            params.observation_cov,
            T,
            offsets,
        )
        idx = observed_index(dn, None if mask is None else mask[n])
        mu = torch.cat([dn.mean_z, dn.mean_x[idx]])
        Sxz = dn.cov_xz[idx]
        Sig = torch.cat(
            [torch.cat([dn.cov_zz, Sxz.T], 1), torch.cat([Sxz, dn.cov_xx[idx][:, idx]], 1)], 0
        )
        mq, Pq = posterior[n]
        v = torch.cat([mq.reshape(-1), x[n].reshape(-1)[idx]])
        covq = torch.zeros_like(Sig)
        covq[: Pq.shape[0], : Pq.shape[0]] = Pq
        L = torch.linalg.cholesky(Sig)
        d = torch.linalg.solve_triangular(L, (v - mu)[:, None], upper=False)
        Linv_cov = torch.linalg.solve_triangular(L, covq, upper=False)
        tr = torch.linalg.solve_triangular(L, Linv_cov.T, upper=False).diagonal().sum()
        total = total - 0.5 * (
            mu.numel() * math.log(2 * math.pi) + 2 * L.diagonal().log().sum() + (d**2).sum() + tr
        )
    return total


LEARN_SETS = [
    "all",
    ("initial_loc", "initial_cov"),
    ("initial_cov",),
    ("transition_matrix",),
    ("transition_cov",),
    ("observation_matrix", "observation_cov"),
    ("observation_cov",),
    ("transition_matrix", "control_matrix", "transition_cov"),
    ("control_matrix",),
]


@pytest.mark.parametrize("learn", LEARN_SETS)
def test_m_step_maximizes_expected_complete_loglik(learn):
    """The closed-form M-step is the stationary point (zero gradient) and a maximum of the
    expected complete-data log-likelihood computed from the dense joint Gaussian."""
    N, T, S, D, U = 3, 5, 2, 2, 1
    true = random_params(S, D, U, seed=0)
    controls = torch.randn(N, T, U, generator=torch.Generator().manual_seed(9), dtype=DT)
    _, x = simulate(true, N, T, controls, seed=2)
    mask = torch.ones(N, T, dtype=torch.bool)
    mask[0, 1] = mask[2, 3] = False
    old = perturb(true)
    # E-step posterior under the old parameters (dense conditioning)
    posterior = []
    for n in range(N):
        dn = dense_lgssm(
            old.initial_loc,
            old.initial_cov,
            old.transition_matrix,
            old.transition_cov,
            old.observation_matrix,
            old.observation_cov,
            T,
            controls[n] @ old.control_matrix.T,
        )
        posterior.append(condition_z(dn, x[n], observed_index(dn, mask[n])))
    new, ll_old = em_step(x, old, learn=learn, mask=mask, controls=controls)
    names = [k for k in old._fields] if learn == "all" else list(learn)
    # the parameters not learned are untouched
    for k in old._fields:
        if k not in names:
            assert torch.equal(getattr(new, k), getattr(old, k))

    def grads(p):
        leaves = {k: getattr(p, k).clone().requires_grad_() for k in names}
        q = expected_complete_loglik(p._replace(**leaves), x, mask, controls, posterior)
        gs = torch.autograd.grad(q, list(leaves.values()))
        # only symmetric perturbations are meaningful for a covariance
        return (
            leaves,
            q,
            {k: 0.5 * (gk + gk.mT) if k.endswith("cov") else gk for k, gk in zip(names, gs)},
        )

    leaves, q_new, g_new = grads(new)
    _, q_old, g_old = grads(old)
    for k in names:  # zero up to rounding, relative to the gradient's scale at the old parameters
        assert g_new[k].norm() <= 1e-10 * g_old[k].norm(), (k, g_new[k], g_old[k])
    assert q_new >= q_old
    # random perturbations of the learned parameters never increase it
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        bumped = {
            k: v.detach()
            + 1e-2
            * (lambda e: e + e.mT if k.endswith("cov") else e)(
                torch.randn(v.shape, generator=g, dtype=DT)
            )
            for k, v in leaves.items()
        }
        assert (
            expected_complete_loglik(new._replace(**bumped), x, mask, controls, posterior)
            <= q_new.detach() + 1e-12
        )
    # em_step reports log p(x | old parameters) (the same filter: equal to rounding)
    assert rel(ll_old, lgssm_log_likelihood(x, old, mask=mask, controls=controls)) <= 1e-12


@pytest.mark.parametrize(
    "learn", ["all", ("initial_loc", "initial_cov"), ("transition_matrix", "observation_cov")]
)
def test_log_likelihood_never_decreases(learn):
    N, T = 8, 25
    true = random_params(3, 2, 1, seed=4)
    controls = torch.randn(N, T, 1, generator=torch.Generator().manual_seed(5), dtype=DT)
    _, x = simulate(true, N, T, controls, seed=6)
    mask = torch.rand(N, T, generator=torch.Generator().manual_seed(7)) > 0.2
    res = lgssm_em(
        x, perturb(true, scale=0.5), num_iters=15, learn=learn, mask=mask, controls=controls
    )
    lls = res.log_likelihoods
    assert lls.shape == (16,)
    # monotone up to float64 rounding of a sum of ~N*T terms
    assert torch.all(lls[1:] - lls[:-1] >= -1e-11 * lls.abs().max()), lls
    assert lls[-1] > lls[0] + 1.0
    assert rel(lls[-1], lgssm_log_likelihood(x, res.params, mask=mask, controls=controls)) <= 1e-12


def test_initial_state_update_single_sequence():
    """Thesis Sec. 3.4.3: for one sequence the initial-state M-step is mu_{1|0} = mu_{1|T},
    Sigma_{1|0} = Sigma_{1|T}."""
    p = random_params(2, 2, seed=8)
    _, x = simulate(p, 1, 10, seed=9)
    new, _ = em_step(x[0], p, learn=("initial_loc", "initial_cov"))
    sm = kalman_smoother(
        x[0],
        p.initial_loc,
        p.initial_cov,
        p.transition_matrix,
        p.transition_cov,
        p.observation_matrix,
        p.observation_cov,
    )
    assert rel(new.initial_loc, sm.means[0]) <= 1e-12
    assert rel(new.initial_cov, sm.covs[0]) <= 1e-12


def test_recovers_known_parameters():
    """With C fixed (so the state basis is identified), EM recovers A, Q, R from N*T = 3000
    simulated steps. The statistical error of each entry is about
    sqrt(noise var / (N T var(z))) ~ 0.02-0.03 here, so a tolerance of 0.1 is > 3 SE."""
    N, T = 60, 50
    true = LGSSMParams(
        initial_loc=torch.zeros(2, dtype=DT),
        initial_cov=torch.eye(2, dtype=DT),
        transition_matrix=torch.tensor([[0.9, 0.2], [-0.2, 0.8]], dtype=DT),
        transition_cov=torch.tensor([[0.3, 0.1], [0.1, 0.2]], dtype=DT),
        observation_matrix=torch.tensor([[1.0, 0.0], [0.5, 1.0]], dtype=DT),
        observation_cov=torch.tensor([[0.2, 0.0], [0.0, 0.3]], dtype=DT),
    )
    _, x = simulate(true, N, T, seed=10)
    init = true._replace(
        transition_matrix=torch.eye(2, dtype=DT) * 0.5,
        transition_cov=torch.eye(2, dtype=DT),
        observation_cov=torch.eye(2, dtype=DT),
    )
    res = lgssm_em(
        x, init, num_iters=60, learn=("transition_matrix", "transition_cov", "observation_cov")
    )
    assert (res.params.transition_matrix - true.transition_matrix).abs().max() < 0.1
    assert (res.params.transition_cov - true.transition_cov).abs().max() < 0.1
    assert (res.params.observation_cov - true.observation_cov).abs().max() < 0.1
    # the maximum-likelihood fit is at least as likely as the truth
    assert res.log_likelihoods[-1] >= lgssm_log_likelihood(x, true)


def test_tolerance_stops_early_and_bad_arguments():
    p = random_params(2, 2, seed=11)
    _, x = simulate(p, 4, 20, seed=12)
    res = lgssm_em(x, perturb(p), num_iters=200, learn=("initial_loc",), tol=1e-6)
    n = res.log_likelihoods.shape[0]
    assert n < 201
    assert rel(res.log_likelihoods[-1], lgssm_log_likelihood(x, res.params)) <= 1e-12
    with pytest.raises(ValueError, match="cannot learn 'not_a_param'"):
        em_step(x, p, learn=("not_a_param",))
    with pytest.raises(ValueError, match="needs an initial control_matrix"):
        em_step(x, p, learn=("control_matrix",))
