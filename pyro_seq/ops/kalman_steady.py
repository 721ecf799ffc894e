r"""The Kalman filter and RTS smoother for time-invariant parameters shared by a batch of
sequences, with the steady state of the Riccati recursion (thesis Sec. 3.4.1; used by
:func:`pyro_seq.ops.kalman.kalman_filter` and ``kalman_smoother`` with ``method="auto"``).

With A, Q, C, R constant in time and shared by the batch, no mask and no autograd, the
covariance recursion does not depend on the data and reaches its fixed point after a few
dozen steps (see Numerics in :mod:`pyro_seq.ops.kalman`); from then on the gain K, the
innovation factor L and the mean coefficient F = A - K C A are single matrices. The work
is then

* :func:`joint_covariance_pass`: the Riccati recursion until the steady state, three kernels
  per step: the joint predictive covariance of (x_t, z_t),
  G_t = [[C P C^T + R, C P], [P C^T, P]] (P = Sigma_{t|t-1}), has the Cholesky factor
  [[L, 0], [W^T, Lc]] with L L^T the innovation covariance (eq. 3.12),
  W = L^{-1} C P and Lc Lc^T = P - W^T W = Sigma_t (Schur complement), and the next
  G_{t+1} = N N^T + [[C Q C^T + R, C Q], [Q C^T, Q]] with N = [C A; A] Lc. For small
  state and observation sizes the recursion is lifted to blocks of ``LIFT`` steps (one
  factorisation of the joint covariance of a block's observations and its last state per
  block, then the steps inside all blocks at once), which cuts the sequential operations
  about fourfold;
* the means mu_t = F_t mu_{t-1} + g_t, constant F_t after the steady state, and the backward
  recursion of the smoother, by
  :func:`~pyro_seq.ops.blocked_recursions.piecewise_recursion` (blocks of steps, O(log T)
  levels);
* the log-likelihood terms (eq. 3.12) with one triangular solve for the steady stretch.

Everything after the steady state is computed once and repeated, so the covariance-side
cost does not grow with T and the data-side cost is a few large matrix products.

None of the covariance side depends on the observations. A :class:`SteadyStateCache` keeps
it for repeated calls with the same parameter values (as Pyro's ``GaussianHMM`` builds its
Gaussian factors once, at construction): :class:`~pyro_seq.distributions.LinearGaussianSSM`
holds one per instance, so its second ``log_prob`` or ``smooth`` runs the data side only.
"""

from collections import OrderedDict
from typing import Any, Callable, Optional, Tuple

import torch
from torch import Tensor

from pyro_seq.ops.blocked_recursions import piecewise_recursion
from pyro_seq.ops.kalman_blocked import blocked_filter_rows, blocked_log_likelihood
from pyro_seq.ops.kalman_sequential import backward_covariance_pass
from pyro_seq.ops.kalman_stein import steady_smoothed_covariances
from pyro_seq.ops.lgssm import PreparedLGSSM
from pyro_seq.ops.linalg import repeat_last, tri_solve_lower_transposed
from pyro_seq.validation import positive_int

__all__ = [
    "SteadyStateCache",
    "joint_covariance_pass",
    "steady_applicable",
    "steady_filter",
    "steady_log_likelihood",
    "steady_smoother",
    "steady_smoother_means",
]

#: Steps between two steady-state tests (as in :mod:`~pyro_seq.ops.kalman_sequential`).
_CHECK_EVERY = 4

#: Steps per factorisation of the lifted Riccati recursion (:func:`_lifted_joint`), used
#: while the lifted joint covariance (``LIFT * D + S`` square) is at most ``LIFT_MAX_SIZE``.
LIFT = 8
LIFT_MAX_SIZE = 32

#: Lifted blocks between two steady-state tests (each test covers the blocks since the last).
_LIFT_TEST_EVERY = 4


class SteadyStateCache:
    """The observation-independent part of the steady-state paths, kept for repeated calls
    with the same parameter values: the Riccati recursion of :func:`joint_covariance_pass`
    and the smoother's gains and covariances of :func:`steady_smoother`, per number of steps
    T and tolerance.

    Pass one to :func:`pyro_seq.ops.kalman.kalman_log_likelihood`,
    :func:`~pyro_seq.ops.kalman.kalman_filter`, :func:`~pyro_seq.ops.kalman.kalman_smoother`
    or :func:`~pyro_seq.ops.kalman.kalman_sample` (``steady_state_cache=``); results are
    identical with and without it. The key is the parameters' values (Sigma_{1|0}, A, Q, C, R,
    which the steady-state path needs constant in time, so a few small matrices): every call
    compares them with the values its entries were computed from (one concatenation and one
    exact comparison), and any change empties the cache, however it was made (an optimiser
    step, an in-place change through ``.data`` or a NumPy view, tensors with other values).
    Inference tensors (``torch.inference_mode``) are never cached. Returned results never
    alias the cached tensors. At most ``max_entries`` (a positive integer) (T, tolerance,
    kind) entries are kept, the oldest dropped first.
    """

    def __init__(self, max_entries: int = 4):
        self.max_entries = positive_int("max_entries", max_entries)
        self._meta: Optional[Tuple[Any, ...]] = None
        self._values: Optional[Tensor] = None
        self._entries: "OrderedDict[Any, Any]" = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry and the parameter values they belong to."""
        self._meta, self._values, self._entries = None, None, OrderedDict()

    def get(self, mdl: PreparedLGSSM, entry: Tuple[Any, ...], compute: Callable[[], Any]):
        """``compute()`` for the parameters of ``mdl`` under the name ``entry``, or the value
        kept from an earlier call with the same parameter values."""
        params = (mdl.init_cov, mdl.A, mdl.Q, mdl.C, mdl.R)
        if any(p.is_inference() for p in params):
            return compute()
        meta = tuple((tuple(p.shape), p.dtype, p.device) for p in params)
        values = torch.cat([p.detach().reshape(-1) for p in params])  # a copy, never a view
        if meta != self._meta or self._values is None or not torch.equal(values, self._values):
            self._meta, self._values, self._entries = meta, values, OrderedDict()
        if entry in self._entries:
            return self._entries[entry]
        value = compute()
        self._entries[entry] = value
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value


def _cached(cache: Optional[SteadyStateCache], mdl: PreparedLGSSM, entry, compute):
    """``compute()``, through ``cache`` when one is given."""
    return compute() if cache is None else cache.get(mdl, entry, compute)


def _covariances(mdl: PreparedLGSSM, tol: float, cache: Optional[SteadyStateCache]):
    """:func:`joint_covariance_pass`, through ``cache`` when one is given."""
    return _cached(cache, mdl, ("covariances", mdl.T, tol), lambda: joint_covariance_pass(mdl, tol))


def steady_applicable(mdl: PreparedLGSSM, steady_state_tol: float, min_steps: int = 32) -> bool:
    """Whether the steady-state filter applies: A, Q, C, R constant in time (so no mask),
    parameters shared by the batch, ``steady_state_tol > 0``, ``T >= min_steps`` and no
    parameter that needs a gradient."""
    params = (mdl.init_loc, mdl.init_cov, mdl.A, mdl.Q, mdl.C, mdl.R, mdl.b)
    if steady_state_tol <= 0 or mdl.T < min_steps or mdl.mask is not None:
        return False
    if any(p.shape[-3] != 1 for p in (mdl.A, mdl.Q, mdl.C, mdl.R)):
        return False
    if mdl.param_batch_shape.numel() != 1:
        return False
    if torch.is_grad_enabled() and any(
        p is not None and p.requires_grad for p in params + (mdl.x,)
    ):
        return False
    return True


def joint_covariance_pass(mdl: PreparedLGSSM, steady_state_tol: float):
    """Riccati recursion on the Cholesky factor of the joint predictive covariance of
    (x_t, z_t) (module docstring), until the steady state; lifted by :data:`LIFT` steps
    per factorisation (:func:`_lifted_joint`) where the state and observation are small.

    :returns: None if a Cholesky factorisation fails (a singular filtered covariance: the
        caller falls back to the general pass), else ``(pcovs, covs, L, K, steady_from)``
        with the u = min(steady_from + 1, T) distinct entries ``(u, S, S)``, ``(u, S, S)``,
        ``(u, D, D)``, ``(u, S, D)``; entries t >= ``steady_from`` repeat entry
        ``steady_from`` (``steady_from = T`` when the fixed point was not reached).
    """
    T, S, D = mdl.T, mdl.S, mdl.D
    A, Q = mdl.A.reshape(S, S), mdl.Q.reshape(S, S)
    C, R = mdl.C.reshape(D, S), mdl.R.reshape(D, D)
    P0 = mdl.init_cov.reshape(S, S)
    CA, CQ = C @ A, C @ Q
    N0 = torch.cat([CA, A], 0)  # (D + S, S)
    QJ = torch.cat([torch.cat([CQ @ C.mT + R, CQ], 1), torch.cat([CQ.mT, Q], 1)], 0)
    M0 = torch.cat([C, torch.eye(S, dtype=A.dtype, device=A.device)], 0)
    G0 = M0 @ (P0 @ M0.mT)
    G0[:D, :D] += R
    tol = steady_state_tol * torch.finfo(A.dtype).eps
    m = LIFT if (LIFT * D + S <= LIFT_MAX_SIZE and T >= 4 * LIFT) else 1
    out = _lifted_joint(N0, QJ, G0, A, C, Q, R, m, T, tol) if m > 1 else None
    if out is None:
        out = _stepwise_joint(N0, QJ, G0, T, tol)
    G, Lf, info, steady_from = out
    if bool((info != 0).any()):
        return None
    L, Wt, Lc = Lf[:, :D, :D], Lf[:, D:, :D], Lf[:, D:, D:]
    covs = Lc @ Lc.mT
    covs = 0.5 * (covs + covs.mT)
    Pu = G[:, D:, D:]
    pcovs = Pu + Pu.mT
    pcovs *= 0.5
    pcovs[0] = P0
    K = tri_solve_lower_transposed(L, Wt.mT).mT  # P C^T (L L^T)^{-1} = W^T L^{-1}
    return pcovs, covs, L, K, steady_from


def _stepwise_joint(N0: Tensor, QJ: Tensor, G0: Tensor, T: int, tol: float):
    """G_{t+1} = N0 Lc_t Lc_t^T N0^T + QJ one step at a time, with the steady-state test
    every :data:`_CHECK_EVERY` steps. Returns ``(G, Lf, info, steady_from)``, the first
    min(steady_from + 1, T) joint covariances, their Cholesky factors and infos."""
    S = N0.shape[1]
    D = N0.shape[0] - S
    mm, addmm, cholesky_ex = torch.mm, torch.addmm, torch.linalg.cholesky_ex
    Lt, it = cholesky_ex(G0)
    Gs, Ls, infos = [G0], [Lt], [it]
    settled, steady_from = 0, T
    for t in range(1, T):
        N = mm(N0, Lt[D:, D:])
        Gt = addmm(QJ, N, N.mT)
        Lt, it = cholesky_ex(Gt)
        Gs.append(Gt)
        Ls.append(Lt)
        infos.append(it)
        if t % _CHECK_EVERY == 0:
            diff = float(torch.sub(Gt, Gs[t - 1]).abs_().max())
            settled = settled + 1 if diff <= tol * float(Gt.abs().max()) else 0
            if settled == 2:
                steady_from = t
                break
    return torch.stack(Gs), torch.stack(Ls), torch.stack(infos), steady_from


def _lifted_joint(N0, QJ, G0, A, C, Q, R, m: int, T: int, tol: float):
    """The joint covariances G_t of :func:`_stepwise_joint` with one sequential
    factorisation per m steps (the recursion lifted to blocks of m observations).

    With P_s the predicted covariance at the first step s of a block, the joint covariance
    of (x_s, ..., x_{s+m-1}, z_{s+m-1}) given x_{<s} is Nm0 P_s Nm0^T + QJm0, where
    Nm0 = [C; C A; ...; C A^{m-1}; A^{m-1}] and QJm0 is the covariance of the block's later
    noise (w_{s+i}, i >= 1, enters x_{s+j}, j >= i, through C A^{j-i} and z_{s+m-1} through
    A^{m-1-i}; v_{s+j} through the identity). With P_s = A Sigma_{s-1} A^T + Q this is
    Nm Sigma_{s-1} Nm^T + QJm with Nm = Nm0 A and QJm = Nm0 Q Nm0^T + QJm0, and the
    trailing block of its Cholesky factor is that of Sigma_{s+m-1} (Schur complement). The
    sequential part is one product, one factorisation and a test per block; then the m
    steps inside every block run as the per-step recursion, batched over the blocks. The
    steady-state test compares G_t with G_{t-1} inside a block (t = m / 2 mod m), where both
    come from the same per-step chain. Returns None where no steady state is found in the
    blocks computed (the caller then runs :func:`_stepwise_joint`).
    """
    S = N0.shape[1]
    D = N0.shape[0] - S
    mm, addmm, cholesky_ex = torch.mm, torch.addmm, torch.linalg.cholesky_ex
    eye = torch.eye(S, dtype=A.dtype, device=A.device)
    pw = [eye, A]
    for _ in range(m - 2):
        pw.append(A @ pw[-1])
    powers = torch.stack(pw)  # (m, S, S): A^0 .. A^{m-1}
    CP = C @ powers  # (m, D, S)
    Nm0 = torch.cat([CP.reshape(m * D, S), pw[-1]], 0)  # (m D + S, S)
    # Phi0 [(j, d), (i, c)] = (C A^{j-i})[d, c] for 1 <= i <= j, last rows A^{m-1-i}
    ar = torch.arange(m, device=A.device)
    idx = ar.unsqueeze(1) - ar.unsqueeze(0)  # [j, i] = j - i
    idx = torch.where((idx >= 0) & (ar.unsqueeze(0) >= 1), idx, torch.full_like(idx, m))
    CPz = torch.cat([CP, torch.zeros_like(CP[:1])], 0)
    Phi_x = CPz[idx].permute(0, 2, 1, 3).reshape(m * D, m * S)
    Pz = torch.cat([powers, torch.zeros_like(powers[:1])], 0)
    Phi_z = Pz[torch.where(ar >= 1, m - 1 - ar, torch.full_like(ar, m))]  # (m, S, S)
    Phi = torch.cat([Phi_x, Phi_z.permute(1, 0, 2).reshape(S, m * S)], 0)
    PhiQ = (Phi.view(-1, m, S) @ Q).view(-1, m * S)
    QJm0 = PhiQ @ Phi.mT
    QJm0[: m * D, : m * D].view(m, D, m, D).diagonal(0, 0, 2).add_(R.unsqueeze(-1))
    Nm = Nm0 @ A
    QJm = torch.addmm(QJm0, Nm0 @ Q, Nm0.mT)
    # the sequential part: the filtered factor at every block end
    Gm = torch.addmm(QJm0, Nm0 @ G0[D:, D:], Nm0.mT)  # block 0 from P_0 = Sigma_{1|0}
    Lm, info = cholesky_ex(Gm)
    ends, infos, Gms = [Lm[m * D :, m * D :]], [info], [Gm]
    last = -(-T // m) - 2  # the last block whose end starts a block inside 0..T-1
    tested, settled = 0, 0
    for i in range(1, last + 1):
        N = mm(Nm, ends[-1])
        Gm = addmm(QJm, N, N.mT)
        Lm, info = cholesky_ex(Gm)
        ends.append(Lm[m * D :, m * D :])
        infos.append(info)
        Gms.append(Gm)
        if i % _LIFT_TEST_EVERY and i < last:
            continue
        # the steady-state test on the blocks since the last test, at once
        Gn = torch.stack(Gms[tested:])
        gap = torch.sub(Gn[1:], Gn[:-1]).abs_().amax((-2, -1))
        ok = (gap <= tol * Gn[1:].abs().amax((-2, -1))).tolist()
        for j, passed in enumerate(ok):
            settled = settled + 1 if passed else 0
            if settled == 2:
                del ends[tested + j + 2 :], infos[tested + j + 2 :]
                break
        if settled == 2:
            break
        tested = i
    if bool(torch.stack(infos).any()):
        return None
    # the steps inside every block, batched: first steps from the predicted covariances
    AL = A @ torch.stack(ends)  # (nb, S, S): A Sigma^{1/2} at the block ends
    P = torch.cat([G0[D:, D:].unsqueeze(0), torch.baddbmm(Q, AL, AL.mT)], 0)
    M0 = torch.cat([C, eye], 0)
    Gt = M0 @ P @ M0.mT
    Gt[:, :D, :D] += R
    Lt, it = cholesky_ex(Gt)
    Gb, Lb, ib = [Gt], [Lt], [it]
    N0b = N0.expand(P.shape[0], -1, -1)
    for _ in range(1, m):
        N = torch.bmm(N0b, Lt[:, D:, D:])
        Gt = torch.baddbmm(QJ, N, N.mT)
        Lt, it = cholesky_ex(Gt)
        Gb.append(Gt)
        Lb.append(Lt)
        ib.append(it)
    G = torch.stack(Gb, 1).flatten(0, 1)[:T]  # time order: block b, step j -> b m + j
    Lf = torch.stack(Lb, 1).flatten(0, 1)[:T]
    info = torch.stack(ib, 1).flatten(0, 1)[:T]
    # the steady-state test of _stepwise_joint, inside blocks, at two consecutive tests
    t_test = torch.arange(m // 2, G.shape[0], m, device=G.device)
    gap = (G[t_test] - G[t_test - 1]).abs().amax((-2, -1))
    ok = (gap <= tol * G[t_test].abs().amax((-2, -1))).tolist()
    for i in range(1, len(ok)):
        if ok[i - 1] and ok[i]:
            u = int(t_test[i]) + 1
            return G[:u], Lf[:u], info[:u], u - 1
    return None


def _apply_split(M: Tensor, v: Tensor, u: int) -> Tensor:
    """v_t M_t^T for M_t = M[min(t, u - 1)]: M ``(u, p, q)``, v ``(n, T, q)`` contiguous ->
    ``(n, T, p)``; one matrix product for all t, then the first u steps replaced."""
    out = v @ M[-1].mT
    u = min(u, v.shape[1])
    out[:, :u] = (M[:u] @ v[:, :u].permute(1, 2, 0)).permute(2, 0, 1)
    return out


def steady_filter(
    mdl: PreparedLGSSM, steady_state_tol: float, cache: Optional[SteadyStateCache] = None
):
    """The filter of :func:`pyro_seq.ops.kalman.kalman_filter` on the steady-state path.

    :returns: None where :func:`joint_covariance_pass` fails or no steady state is reached
        (the caller then runs the general path), else
        ``(means, covs, pmeans, pcovs, log_likelihoods, ASig, steady_from)`` with the
        shapes of :class:`~pyro_seq.ops.kalman.KalmanFilterResult` (covariances with the
        parameters' batch dims of size 1) and ``ASig (u, S, S)`` the distinct products
        A Sigma_t, t < u = steady_from + 1. ``cache``: a :class:`SteadyStateCache` for the
        covariance side.
    """
    res = _covariances(mdl, steady_state_tol, cache)
    if res is None or res[-1] >= mdl.T:
        return None
    pcovs, covs, L, K, steady_from = res
    T, S = mdl.T, mdl.S
    A = mdl.A.reshape(S, S)
    xb = mdl.x.shape[:-2]
    means, pmeans, ll = blocked_filter_rows(mdl, L, K)
    ones = (1,) * len(xb)
    ASig = (covs @ A.mT).mT
    return (
        means.reshape(xb + (T, S)),
        repeat_last(covs, T, 0, copy=True).reshape(ones + (T, S, S)),
        pmeans.reshape(xb + (T, S)),
        repeat_last(pcovs, T, 0, copy=True).reshape(ones + (T, S, S)),
        ll.reshape(xb + (T,)),
        ASig,
        steady_from,
    )


def steady_log_likelihood(
    mdl: PreparedLGSSM, steady_state_tol: float, cache: Optional[SteadyStateCache] = None
) -> Optional[Tensor]:
    """log p(x_{1:T}) (thesis eq. 3.12) of every sequence, ``mdl.x (..., T, D)`` -> ``(...)``,
    for a model where :func:`steady_applicable` holds
    (:func:`~pyro_seq.ops.kalman_blocked.blocked_log_likelihood`). None where
    :func:`joint_covariance_pass` fails or reaches no steady state before T (the caller then
    runs the general filter). ``cache``: a :class:`SteadyStateCache` for the covariance
    side."""
    res = _covariances(mdl, steady_state_tol, cache)
    if res is None or res[-1] >= mdl.T:
        return None
    return blocked_log_likelihood(mdl, res[2], res[3])


def steady_smoother_means(J: Tensor, h: Tensor, zT: Tensor) -> Tensor:
    """Backward recursion z_t = J_t z_{t+1} + h_t from z_{T-1} = ``zT`` (0-based), with
    J_t = ``J[min(t, u - 1)]``: J ``(u, S, S)``, h ``(n, T-1, S)``, zT ``(n, S)`` ->
    ``(n, T, S)``; reversed in time, the constant stretch comes first
    (:func:`~pyro_seq.ops.blocked_recursions.piecewise_recursion`)."""
    z = piecewise_recursion(J.flip(0), h.flip(1), zT, at_end=True)
    return torch.cat([z.flip(1), zT.unsqueeze(1)], 1)


def _smoother_covariances(
    mdl: PreparedLGSSM, covs: Tensor, pcovs: Tensor, ASig: Tensor, steady_from: int, tol: float
):
    """The observation-independent part of :func:`steady_smoother`: ``(J, scovs, cross)``
    with J ``(u, S, S)`` the distinct gains, the smoothed covariances ``(T, S, S)`` and the
    cross covariances ``(T-1, S, S)``; None where some Sigma_{t+1|t} is singular."""
    T, S = mdl.T, mdl.S
    u = min(steady_from + 1, T - 1)
    ASu = ASig[:u]
    Lp, info = torch.linalg.cholesky_ex(pcovs.reshape(T, S, S)[1 : u + 1])
    if bool((info != 0).any()):
        return None
    J = torch.cholesky_solve(ASu, Lp).mT  # (u, S, S)
    cv = covs.reshape(T, S, S)
    eps = torch.finfo(cv.dtype).eps
    scovs = steady_smoothed_covariances(J, cv[:u] - J @ ASu, cv[-1], T, tol * eps)
    if scovs is None:
        ones = covs.shape[:-3]
        J_full = repeat_last(J, T - 1, 0).reshape(ones + (T - 1, S, S))
        scovs = backward_covariance_pass(J_full, covs, ASu.reshape(ones + (u, S, S)), u - 1, tol)
    sc = scovs.reshape(T, S, S)
    cross = torch.cat(
        [sc[1 : u + 1] @ J.mT, (sc[u + 1 :].reshape(-1, S) @ J[-1].mT).view(-1, S, S)]
    )
    return J, sc, cross


def steady_smoother(
    mdl: PreparedLGSSM,
    filtered,
    ASig: Tensor,
    steady_from: int,
    tol: float,
    cache: Optional[SteadyStateCache] = None,
):
    """The RTS smoother of :func:`pyro_seq.ops.kalman.kalman_smoother` after
    :func:`steady_filter` (``filtered`` its first five outputs, ``ASig`` and ``steady_from``
    its last two): J_t = Sigma_t A^T Sigma_{t+1|t}^{-1} for the distinct t <= steady_from
    (one Cholesky solve), the backward means by :func:`steady_smoother_means`, the
    covariances by :func:`~pyro_seq.ops.kalman_stein.steady_smoothed_covariances` (or
    :func:`~pyro_seq.ops.kalman_sequential.backward_covariance_pass` where it declines) and the
    cross covariances Sigma_{t+1|T} J_t^T with one product for the constant stretch. The
    gains and covariances do not depend on the observations: ``cache`` (a
    :class:`SteadyStateCache`) keeps them.

    :returns: None where some Sigma_{t+1|t} is singular to working precision (the caller
        runs the general smoother), else ``(means, covs, cross_covs, gains)``.
    """
    means, covs, pmeans, pcovs = filtered[:4]
    T, S = mdl.T, mdl.S

    def compute():
        return _smoother_covariances(mdl, covs, pcovs, ASig, steady_from, tol)

    part = _cached(cache, mdl, ("smoother", T, tol), compute)
    if part is None:
        return None
    J, sc, cross = part
    u = J.shape[0]
    ones = covs.shape[:-3]
    xb = means.shape[:-2]
    mu, pm = means.reshape(-1, T, S), pmeans.reshape(-1, T, S)
    h = mu[:, :-1] - _apply_split(J, pm[:, 1:], u)
    sm = steady_smoother_means(J, h, mu[:, -1])
    J_full = repeat_last(J, T - 1, 0, copy=True).reshape(ones + (T - 1, S, S))
    return (
        sm.reshape(xb + (T, S)),
        sc.clone().reshape(ones + (T, S, S)),
        cross.clone().reshape(ones + (T - 1, S, S)),
        J_full,
    )
