r"""Expectation-maximization for linear-Gaussian state-space models (thesis Sec. 3.4.3).

Model (column vectors, as in :mod:`pyro_seq.ops.kalman`)::

    z_1 ~ N(mu_{1|0}, Sigma_{1|0})
    z_t = A z_{t-1} + B u_t + eps_t,   eps_t ~ N(0, Q)      (t = 2..T)
    x_t = C z_t + delta_t,             delta_t ~ N(0, R)    (t = 1..T)

with time-invariant parameters shared by a batch of ``N`` sequences ``x`` of shape
``(*batch, T, D)``.

**E-step** (thesis eq. 2.8): the exact posterior ``p(z_{1:T} | x_{1:T})`` from the RTS smoother
of :func:`pyro_seq.ops.kalman.kalman_smoother`, summarized by the smoothed moments
``m_t = E[z_t | x]``, ``P_t = Cov(z_t | x)`` and ``P_{t,t-1} = Cov(z_t, z_{t-1} | x)``.
Its filter gives ``log p(x | theta)`` (eq. 3.12) for free.

**M-step** (thesis eq. 2.9; Shumway & Stoffer 1982, Ghahramani & Hinton 1996): maximize the
expected complete-data log-likelihood. Every update is in closed form (sums run over sequences
and the indicated time steps; ``E[a b^T] = Cov(a, b | x) + E[a] E[b]^T``)::

    mu_{1|0}    = (1/N) sum_n m_1                                  (thesis Sec. 3.4.3)
    Sigma_{1|0} = (1/N) sum_n [P_1 + (m_1 - mu_{1|0})(m_1 - mu_{1|0})^T]
    [A B]       = (sum_t E[z_t r_t^T]) (sum_t E[r_t r_t^T])^{-1},  r_t = (z_{t-1}, u_t)   (t >= 2)
    Q           = 1/(N (T-1)) sum_t E[(z_t - A z_{t-1} - B u_t)(...)^T]
    C           = (sum_t x_t m_t^T) (sum_t E[z_t z_t^T])^{-1}       (observed steps only)
    R           = (1/#obs) sum_t [(x_t - C m_t)(x_t - C m_t)^T + C P_t C^T]

``Q`` and ``R`` are evaluated at the new ``A, B`` and ``C`` (the exact joint maximizer: for an
unconstrained ``A`` the least-squares solution does not depend on ``Q``). Any subset of the
parameters can be learned (``learn=``), the others staying fixed, e.g. only the initial state
as in the thesis' ball-tracking example (Fig. 3.5); with a fixed ``A`` only ``B`` is
regressed and vice versa. For a single sequence the initial-state update is
``mu_{1|0} = mu_{1|T}``, ``Sigma_{1|0} = Sigma_{1|T}``: the ``- mu mu^T`` term printed in the
thesis' M-step belongs to the second moment ``E[z_1 z_1^T] - mu_{1|T} mu_{1|T}^T = Sigma_{1|T}``.

Because the E-step is exact and the M-step maximizes, ``log p(x | theta)`` never decreases
across iterations (thesis Sec. 2.3.1); :func:`lgssm_em` records it at every iteration.

Missing data: ``mask`` ``(*batch, T)`` per step (or per element, ``(*batch, T, D)``, when
neither ``C`` nor ``R`` is learned). Masked steps are left out of the ``C`` and ``R``
updates; the latent chain, and so the ``A, B, Q`` updates, cover all steps.
"""

from typing import NamedTuple, Optional

import torch

from pyro_seq.ops.kalman import kalman_filter, kalman_smoother

__all__ = ["EMResult", "LGSSMParams", "LEARNABLE_PARAMS", "em_step", "lgssm_em", "lgssm_log_likelihood"]

#: Names accepted by ``learn=`` (``"all"`` selects every one that is not None).
LEARNABLE_PARAMS = (
    "initial_loc",
    "initial_cov",
    "transition_matrix",
    "transition_cov",
    "observation_matrix",
    "observation_cov",
    "control_matrix",
)


class LGSSMParams(NamedTuple):
    """Time-invariant LGSSM parameters (no batch dims).

    ``initial_loc (S,)`` mu_{1|0}, ``initial_cov (S, S)`` Sigma_{1|0}, ``transition_matrix
    (S, S)`` A, ``transition_cov (S, S)`` Q, ``observation_matrix (D, S)`` C,
    ``observation_cov (D, D)`` R, ``control_matrix (S, U)`` B or None (with ``controls`` given
    and ``B`` None, ``u_t`` is added to the state directly, as in :mod:`pyro_seq.ops.kalman`).
    """

    initial_loc: torch.Tensor
    initial_cov: torch.Tensor
    transition_matrix: torch.Tensor
    transition_cov: torch.Tensor
    observation_matrix: torch.Tensor
    observation_cov: torch.Tensor
    control_matrix: Optional[torch.Tensor] = None


class EMResult(NamedTuple):
    """Output of :func:`lgssm_em`.

    ``params``: the final :class:`LGSSMParams`. ``log_likelihoods (num_iters + 1,)``: entry
    ``k`` is ``log p(x | theta_k)`` summed over all sequences, ``theta_0`` the initial
    parameters and the last entry the returned ones (non-decreasing up to rounding).
    """

    params: LGSSMParams
    log_likelihoods: torch.Tensor


def _args(params, controls, mask):
    return dict(
        initial_loc=params.initial_loc,
        initial_cov=params.initial_cov,
        transition_matrix=params.transition_matrix,
        transition_cov=params.transition_cov,
        observation_matrix=params.observation_matrix,
        observation_cov=params.observation_cov,
        control_matrix=params.control_matrix,
        controls=controls,
        mask=mask,
    )


def lgssm_log_likelihood(x, params, mask=None, controls=None, method="auto"):
    """``log p(x | theta)`` (eq. 3.12) summed over all sequences.

    :param torch.Tensor x: ``(*batch, T, D)``.
    :param LGSSMParams params: the model.
    :param torch.Tensor mask: optional bool ``(*batch, T)`` or ``(*batch, T, D)``.
    :param torch.Tensor controls: optional ``(*batch, T, U)`` (entry 0 unused).
    :returns: scalar tensor.
    """
    return kalman_filter(x, method=method, **_args(params, controls, mask)).log_likelihoods.sum()


def _learn_set(learn, params):
    if learn == "all":
        names = [n for n in LEARNABLE_PARAMS if getattr(params, n) is not None]
    elif isinstance(learn, str):
        names = [learn]
    else:
        names = list(learn)
    for n in names:
        if n not in LEARNABLE_PARAMS:
            raise ValueError(f"cannot learn {n!r}; choose from {LEARNABLE_PARAMS}")
    if "control_matrix" in names and params.control_matrix is None:
        raise ValueError("learning control_matrix needs an initial control_matrix (and controls)")
    return set(names)


def _check_controls(names, controls):
    if "control_matrix" in names and controls is None:
        raise ValueError("learning control_matrix needs controls")


def _solve_right(M, G):
    """``M G^{-1}`` for a symmetric positive definite Gram matrix ``G``."""
    L = torch.linalg.cholesky(0.5 * (G + G.mT))
    return torch.cholesky_solve(M.mT, L).mT


def _outer(a, b):
    return a.unsqueeze(-1) * b.unsqueeze(-2)


def em_step(x, params, learn="all", mask=None, controls=None, method="auto"):
    """One EM iteration: E-step with the RTS smoother, closed-form M-step (module docstring).

    :param torch.Tensor x: observations ``(*batch, T, D)``; all leading dims are independent
        sequences sharing ``params``.
    :param LGSSMParams params: current parameters.
    :param learn: ``"all"``, one name or an iterable of names from :data:`LEARNABLE_PARAMS`.
    :param torch.Tensor mask: optional bool ``(*batch, T)`` (or ``(*batch, T, D)`` when neither
        ``observation_matrix`` nor ``observation_cov`` is learned).
    :param torch.Tensor controls: optional ``(*batch, T, U)``.
    :param str method: forwarded to :func:`pyro_seq.ops.kalman.kalman_smoother`.
    :returns: ``(new_params, log_likelihood)`` where ``log_likelihood`` is ``log p(x | params)``
        of the *input* parameters (from the E-step's filter).
    """
    names = _learn_set(learn, params)
    _check_controls(names, controls)
    T, D = x.shape[-2:]
    S = params.initial_loc.shape[-1]
    if mask is not None:
        mask = torch.as_tensor(mask, dtype=torch.bool, device=x.device)
        per_element = mask.dim() >= 2 and mask.shape[-2] == T and mask.shape[-1] in (D, 1) and not (
            mask.shape[-1] == T and D not in (T, 1)
        )
        if per_element and ({"observation_matrix", "observation_cov"} & names):
            if mask.shape[-1] == 1:
                mask = mask[..., 0]
            else:
                raise NotImplementedError("learning C or R needs a per-step mask (..., T)")
    with torch.no_grad():
        sm = kalman_smoother(x, method=method, **_args(params, controls, mask))
        log_lik = sm.filtered.log_likelihoods.sum()
        batch = sm.means.shape[:-2]
        m = sm.means.reshape(-1, T, S)
        P = sm.covs.reshape(-1, T, S, S)
        cross = sm.cross_covs.reshape(-1, T - 1, S, S)  # Cov(z_{t+1}, z_t | x)
        N = m.shape[0]
        new = params._asdict()

        # ---- initial state (thesis Sec. 3.4.3)
        m1, P1 = m[:, 0], P[:, 0]
        if "initial_loc" in names:
            new["initial_loc"] = m1.mean(0)
        if "initial_cov" in names:
            d = m1 - new["initial_loc"]
            new["initial_cov"] = _sym(P1.mean(0) + _outer(d, d).mean(0))

        # ---- transition: A, B, Q over the pairs (t-1, t), t = 2..T
        if T > 1 and names & {"transition_matrix", "transition_cov", "control_matrix"}:
            m_prev, m_cur = m[:, :-1], m[:, 1:]
            P_prev, P_cur = P[:, :-1], P[:, 1:]
            Ezz_prev = (P_prev + _outer(m_prev, m_prev)).sum((0, 1))
            Ezz_cross = (cross + _outer(m_cur, m_prev)).sum((0, 1))  # sum E[z_t z_{t-1}^T]
            if controls is not None:
                u = controls.expand(batch + controls.shape[-2:]).reshape(N, T, -1)[:, 1:]
                b = u if params.control_matrix is None else u @ params.control_matrix.mT
            else:
                u = b = None
            A, B = new["transition_matrix"], new["control_matrix"]
            learn_A, learn_B = "transition_matrix" in names, "control_matrix" in names
            if learn_A and learn_B:
                Ezu_cur = _outer(m_cur, u).sum((0, 1))  # sum m_t u_t^T
                Ezu_prev = _outer(m_prev, u).sum((0, 1))
                Euu = _outer(u, u).sum((0, 1))
                G = torch.cat([torch.cat([Ezz_prev, Ezu_prev], -1), torch.cat([Ezu_prev.mT, Euu], -1)], -2)
                M = torch.cat([Ezz_cross, Ezu_cur], -1)
                AB = _solve_right(M, G)
                A, B = AB[:, :S], AB[:, S:]
            elif learn_A:
                M = Ezz_cross if b is None else Ezz_cross - _outer(b, m_prev).sum((0, 1))
                A = _solve_right(M, Ezz_prev)
            elif learn_B:
                resid = m_cur - m_prev @ A.mT
                B = _solve_right(_outer(resid, u).sum((0, 1)), _outer(u, u).sum((0, 1)))
            new["transition_matrix"], new["control_matrix"] = A, B
            if "transition_cov" in names:
                if controls is not None:
                    b = u if B is None else u @ B.mT
                e = m_cur - m_prev @ A.mT - (0 if b is None else b)  # E[z_t - A z_{t-1} - b_t]
                cov_e = P_cur - A @ cross.mT - cross @ A.mT + A @ P_prev @ A.mT
                new["transition_cov"] = _sym((cov_e + _outer(e, e)).sum((0, 1)) / (N * (T - 1)))

        # ---- emission: C, R over observed steps
        if names & {"observation_matrix", "observation_cov"}:
            xs = x.expand(batch + (T, D)).reshape(N, T, D)
            if mask is None:
                w = torch.ones(N, T, dtype=x.dtype, device=x.device)
            else:
                w = mask.expand(batch + (T,)).reshape(N, T).to(x.dtype)
            xs = torch.where(w.unsqueeze(-1) > 0, xs, torch.zeros((), dtype=x.dtype, device=x.device))
            wv, wm = w.unsqueeze(-1), w.unsqueeze(-1).unsqueeze(-1)
            C = new["observation_matrix"]
            if "observation_matrix" in names:
                Exz = (wm * _outer(xs, m)).sum((0, 1))
                Ezz = (wm * (P + _outer(m, m))).sum((0, 1))
                C = _solve_right(Exz, Ezz)
                new["observation_matrix"] = C
            if "observation_cov" in names:
                r = (xs - m @ C.mT) * wv
                total = (_outer(r, r) + wm * (C @ P @ C.mT)).sum((0, 1))
                new["observation_cov"] = _sym(total / w.sum())
    return LGSSMParams(**new), log_lik


def _sym(M):
    return 0.5 * (M + M.mT)


def lgssm_em(x, params, num_iters=20, learn="all", mask=None, controls=None, tol=None, method="auto", callback=None):
    """Run EM (thesis Sec. 3.4.3) for ``num_iters`` iterations or until the log-likelihood
    improves by less than ``tol``.

    :param torch.Tensor x: observations ``(*batch, T, D)``, sequences sharing the parameters.
    :param LGSSMParams params: initial parameters (unbatched; float64 recommended).
    :param int num_iters: maximum number of iterations.
    :param learn: ``"all"``, a name or names from :data:`LEARNABLE_PARAMS`; the others stay fixed
        (``learn=("initial_loc", "initial_cov")`` is the thesis' Fig. 3.5 experiment).
    :param torch.Tensor mask: optional bool ``(*batch, T)`` (see :func:`em_step`).
    :param torch.Tensor controls: optional ``(*batch, T, U)``.
    :param float tol: optional stopping tolerance on the log-likelihood increase (nats).
    :param str method: forwarded to the Kalman smoother.
    :param callable callback: optional ``callback(iteration, params, log_likelihood)`` called
        after each E-step.
    :returns: :class:`EMResult` with ``log_likelihoods`` of length ``iterations + 1``.
    """
    lls = []
    for it in range(num_iters):
        new_params, ll = em_step(x, params, learn=learn, mask=mask, controls=controls, method=method)
        lls.append(ll)
        if callback is not None:
            callback(it, params, ll)
        if tol is not None and it > 0 and float(lls[-1] - lls[-2]) < tol:
            break
        params = new_params
    else:
        with torch.no_grad():
            lls.append(lgssm_log_likelihood(x, params, mask=mask, controls=controls, method=method))
    return EMResult(params, torch.stack(lls))
