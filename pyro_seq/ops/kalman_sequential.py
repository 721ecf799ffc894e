r"""The sequential Kalman passes (a loop over time) of :func:`pyro_seq.ops.kalman.kalman_filter`,
``kalman_smoother``, ``kalman_sample`` and ``lgssm_sample`` with ``method="sequential"``
(thesis Sec. 3.4.1; the parallel-in-time counterparts are in :mod:`pyro_seq.ops.kalman_parallel`).

* :func:`covariance_pass`: the Riccati recursion (Schur-complement measurement update, with the
  steady-state shortcut described under Numerics in :mod:`pyro_seq.ops.kalman`).
* :func:`mean_pass`: the filtered means mu_t = F_t mu_{t-1} + g_t.
* :func:`backward_mean_pass` and :func:`backward_covariance_pass`: the backward recursions of
  the RTS smoother and of forward-filtering backward-sampling.

The covariance loops run on the batch shape of the parameters and mask only, flattened to one
dimension; the mean loops fold the data batch into matrix columns
(:func:`~pyro_seq.ops.linalg.fold_columns`).
"""

from typing import List, Optional

import torch
from torch import Tensor

from pyro_seq.ops.lgssm import PreparedLGSSM
from pyro_seq.ops.linalg import (
    broadcast_shapes,
    fold_columns,
    fused_addmm,
    repeat_last,
    step_addmm,
    tri_solve_lower_transposed,
)

__all__ = ["backward_covariance_pass", "backward_mean_pass", "covariance_pass", "mean_pass"]


#: Steps between two steady-state tests.
_STEADY_CHECK_EVERY = 4


# ---------------------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------------------


def covariance_pass(mdl: PreparedLGSSM, steady_state_tol: float = 0.0):
    """Riccati recursion of thesis Sec. 3.4.1 (prediction + measurement step), looped over t.

    Per step, with L L^T = C P C^T + R (Cholesky) and W = L^{-1} C P (triangular solve),
    the measurement update is Sigma = P - W^T W, the Schur-complement form (equal to the
    Joseph form (I-KC) P (I-KC)^T + K R K^T for the optimal gain, at a third of its cost),
    symmetrised exactly. The prediction and the next step's C P come from one product:
    [A; C A] Sigma A^T + [Q; C Q] = [Sigma_{t+1|t}; C Sigma_{t+1|t}]. The loop carries
    halves (H = M / 2, so that the exact symmetrisation M_sym = H + H^T is a single add;
    halving is exact in binary floating point) and runs 7 kernels per step on the
    covariance batch flattened to one dimension (plain 2-D products when the parameters
    are shared). The predicted covariances are symmetrised after the loop in one batched
    add (inside the loop Sigma's symmetrisation absorbs P's rounding asymmetry), the gains
    K_t = W_t^T L_t^{-1} are formed for all t at once, and Cholesky failures are checked
    once at the end.

    :returns: ``(predicted_covs, covs, L, K, ASig, steady_from)``, ``ASig``
        ``(cb, T-1, S, S)`` with entry t = A_{t+1} Sigma_t (reused by the smoother), or None
        for T = 1; every covariance-side quantity of step t >= ``steady_from`` (T when the
        steady-state shortcut was not taken) repeats that of step ``steady_from``.
    """
    T, S = mdl.T, mdl.S
    cb = broadcast_shapes(
        mdl.init_cov.shape[:-2],
        mdl.A.shape[:-3],
        mdl.Q.shape[:-3],
        mdl.C.shape[:-3],
        mdl.R.shape[:-3],
    )
    n = cb.numel()
    lead = (n,) if n != 1 else ()
    C0 = _flat_time_entries(mdl.C, cb, 1, 2)[0]
    Cs, Rs = _flat_time_entries(mdl.C, cb, T, 2), _flat_time_entries(mdl.R, cb, T, 2)
    CTs = [c.mT for c in Cs] if mdl.C.shape[-3] > 1 else [Cs[0].mT] * T
    if T > 1:
        # blocks [A_t; C_t A_t] and [Q_t; C_t Q_t] for all t (one small product when constant)
        CA, CQ = mdl.C @ mdl.A, mdl.C @ mdl.Q
        Ab = mdl.A.expand(CA.shape[:-2] + mdl.A.shape[-2:])
        Qb = mdl.Q.expand(CQ.shape[:-2] + mdl.Q.shape[-2:])
        AB = torch.cat([Ab, CA], -2)
        QB = torch.cat([Qb, CQ], -2)
        ABs, QBs = _flat_time_entries(AB, cb, T, 2), _flat_time_entries(QB, cb, T, 2)
        As = _flat_time_entries(mdl.A, cb, T, 2)
        ATs = [a.mT for a in As] if mdl.A.shape[-3] > 1 else [As[0].mT] * T
    P0 = mdl.init_cov.expand(cb + (S, S)).reshape(lead + (S, S))
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (mdl.init_cov, mdl.A, mdl.Q, mdl.C, mdl.R)
    )
    if n == 1 and T > 1 and not needs_grad:
        return _covariance_loop_2d_nograd(
            mdl, P0, C0, Cs, Rs, CTs, ABs, QBs, ATs, cb, steady_state_tol
        )
    Ph = 0.5 * P0
    CPh = 0.5 * (C0 @ P0)
    Phs, Ls, Whs, covs, infos, ASigs = [Ph], [], [], [], [], []
    solve = torch.linalg.solve_triangular
    cholesky_ex = torch.linalg.cholesky_ex
    two_d = n == 1
    addmm = torch.addmm if two_d else torch.baddbmm
    mm = torch.mm if two_d else torch.bmm
    Sigma: Tensor  # assigned at the end of every step, read from the second
    for t in range(T):
        if t > 0:
            Y = mm(ABs[t], Sigma)  # noqa: F821 (Sigma of step t - 1)  [A; C A] Sigma
            Z = addmm(QBs[t], Y, ATs[t], beta=0.5, alpha=0.5)  # [P; C P] / 2
            Ph, CPh = Z[..., :S, :], Z[..., S:, :]
            ASigs.append(Y[..., :S, :])
            Phs.append(Ph)
        L, info = cholesky_ex(addmm(Rs[t], CPh, CTs[t], alpha=2.0))
        Wh = solve(L, CPh, upper=False)  # W / 2
        H = addmm(Ph, Wh.mT, Wh, alpha=-2.0)  # (P - W^T W) / 2
        Sigma = H + H.mT
        Ls.append(L)
        Whs.append(Wh)
        infos.append(info)
        covs.append(Sigma)
    if bool((torch.stack(infos) != 0).any()):
        raise ValueError(
            "innovation covariance C P C^T + R is not positive definite (Cholesky failed); "
            "check the covariances for NaN/inf, negative eigenvalues or a condition number "
            "beyond the dtype's range"
        )
    tdim = 1 if n != 1 else 0

    def stack(xs):
        out = torch.stack(xs, tdim)
        return out.reshape(cb + out.shape[tdim:])

    L, Wh = stack(Ls), stack(Whs)
    K = tri_solve_lower_transposed(L, Wh).mT * 2.0
    Ph = stack(Phs)
    pcovs = Ph + Ph.mT
    pcovs[..., 0, :, :] = mdl.init_cov.expand(cb + (S, S))  # entry 0 is the input itself
    return pcovs, stack(covs), L, K, (stack(ASigs) if T > 1 else None), T


def _covariance_loop_2d_nograd(mdl, P0, C0, Cs, Rs, CTs, ABs, QBs, ATs, cb, steady_state_tol):
    """The loop of :func:`covariance_pass` for shared parameters without
    autograd: identical kernels, but each writes straight into its slot of the stacked
    result (``out=``), which saves the per-step allocations and the final stacking copies."""
    T, S, D = mdl.T, mdl.S, mdl.D
    kw = dict(dtype=P0.dtype, device=P0.device)
    Z = torch.empty((T, S + D, S), **kw)  # [P; C P] / 2
    Y = torch.empty((T, S + D, S), **kw)  # [A; C A] Sigma_{t-1} (entry 0 unused)
    Lb = torch.empty((T, D, D), **kw)
    info = torch.empty((T,), dtype=torch.int32, device=P0.device)
    Wh = torch.empty((T, D, S), **kw)
    covs = torch.empty((T, S, S), **kw)
    torch.mul(P0, 0.5, out=Z[0, :S])
    torch.mm(C0, P0, out=Z[0, S:])
    Z[0, S:].mul_(0.5)
    addmm, mm, add = torch.addmm, torch.mm, torch.add
    solve, cholesky_ex = torch.linalg.solve_triangular, torch.linalg.cholesky_ex
    Zs, Ys, Ls, Whs, Cv = Z.unbind(0), Y.unbind(0), Lb.unbind(0), Wh.unbind(0), covs.unbind(0)
    infos = info.unbind(0)
    Sigma = None
    steady = steady_state_tol > 0 and all(p.shape[-3] == 1 for p in (mdl.A, mdl.Q, mdl.C, mdl.R))
    settled, steady_from = 0, T
    for t in range(T):
        Zt = Zs[t]
        if t > 0:
            mm(ABs[t], Sigma, out=Ys[t])
            addmm(QBs[t], Ys[t], ATs[t], beta=0.5, alpha=0.5, out=Zt)
        Ph, CPh = Zt[:S], Zt[S:]
        cholesky_ex(addmm(Rs[t], CPh, CTs[t], alpha=2.0), out=(Ls[t], infos[t]))
        solve(Ls[t], CPh, upper=False, out=Whs[t])
        H = addmm(Ph, Whs[t].mT, Whs[t], alpha=-2.0)
        Sigma = add(H, H.mT, out=Cv[t])
        if steady and t > 0 and t % _STEADY_CHECK_EVERY == 0:
            settled = settled + 1 if _settled(Sigma, Cv[t - 1], steady_state_tol) else 0
            if settled == 2 and t + 1 < T:  # fixed point reached: the rest repeats step t
                for buf in (Z, Y, Lb, info, Wh, covs):
                    buf[t + 1 :] = buf[t]
                steady_from = t
                break
    if bool((info != 0).any()):
        raise ValueError(
            "innovation covariance C P C^T + R is not positive definite (Cholesky failed); "
            "check the covariances for NaN/inf, negative eigenvalues or a condition number "
            "beyond the dtype's range"
        )
    u = min(steady_from + 1, T)  # distinct steps
    K = repeat_last(tri_solve_lower_transposed(Lb[:u], Wh[:u]).mT * 2.0, T, 0)
    Ph = Z[:u, :S]
    pcovs = repeat_last(Ph + Ph.mT, T, 0)
    pcovs[0] = P0
    r = lambda x: x.reshape(cb + x.shape)  # noqa: E731
    return r(pcovs), r(covs), r(Lb), r(K), r(Y[1:, :S]), steady_from


def _settled(new: Tensor, old: Tensor, steady_state_tol: float) -> bool:
    """Whether ``new`` equals ``old`` to ``steady_state_tol`` epsilons of its largest entry."""
    tol = steady_state_tol * torch.finfo(new.dtype).eps
    return float(torch.sub(new, old).abs_().max()) <= tol * float(new.abs().max())


def _flat_time_entries(p: Tensor, batch: torch.Size, T: int, event_ndim: int):
    """The T entries of p ``(b..., T|1, *event)`` along time, each expanded to ``batch`` and
    flattened to ``(n, *event)``, or to ``event`` alone when ``batch`` has one element
    (so that per-step products are plain ``mm`` / ``addmm`` calls without broadcasting)."""
    dim = p.dim() - event_ndim - 1
    p = p.expand(batch + p.shape[dim:])
    n = batch.numel()
    p = p.reshape(((n,) if n != 1 else ()) + p.shape[dim:])
    tdim = p.dim() - event_ndim - 1
    if p.shape[tdim] == 1:
        return [p.select(tdim, 0)] * T
    return list(p.unbind(tdim))


def mean_pass(F: Tensor, g: Tensor) -> Tensor:
    """mu_t = F_t mu_{t-1} + g_t looped over t; F (pb, T|1, S, S), g (b, T, S) -> (b, T, S).
    The data batch is folded into matrix columns (see ``fold_columns``)."""
    T = g.shape[-2]
    F = F.expand(F.shape[:-3] + (T,) + F.shape[-2:])
    Fp, G, unfold = fold_columns(F, g)
    Fs, Gs = Fp.unbind(-3), G.unbind(-3)
    addmm = step_addmm(Fs[0], Gs[0])
    m = Gs[0]
    out = [m]
    for t in range(1, T):
        m = addmm(Gs[t], Fs[t], m)
        out.append(m)
    return unfold(torch.stack(out, dim=-3))


# ---------------------------------------------------------------------------------------
# Backward pass
# ---------------------------------------------------------------------------------------


def backward_mean_pass(J, g, zT):
    """Backward loop z_t = J_t z_{t+1} + g_t from z_T; J (pb, T-1, S, S), g (b, T-1, S)."""
    T1 = J.shape[-3]
    gT = zT.unsqueeze(-2)
    batch = broadcast_shapes(g.shape[:-2], gT.shape[:-2])
    gg = torch.cat([g.expand(batch + g.shape[-2:]), gT.expand(batch + gT.shape[-2:])], -2)
    Ep, G, unfold = fold_columns(J, gg)  # J has T-1 entries, gg has T (only batch dims matter)
    Es, Gs = Ep.unbind(-3), G.unbind(-3)
    addmm = step_addmm(Es[0], Gs[0])
    z = Gs[T1]
    out = [z]
    for t in range(T1 - 1, -1, -1):
        z = addmm(Gs[t], Es[t], z)
        out.append(z)
    return unfold(torch.stack(out[::-1], dim=-3))


def backward_covariance_pass(
    J: Tensor,
    covs: Tensor,
    ASig: Tensor,
    repeat_from: Optional[int] = None,
    steady_state_tol: float = 0.0,
) -> Tensor:
    """Backward RTS loop on covariances, Sigma_{t|T} = Pc_t + J_t Sigma_{t+1|T} J_t^T from
    Sigma_{T|T} = Sigma_T, with Pc_t = Sigma_t - J_t A_{t+1} Sigma_t (= Sigma_t - J_t
    Sigma_{t+1|t} J_t^T) formed for all t at once. The loop carries halves and runs two
    kernels per step on the covariance batch flattened to one dimension; the results are
    symmetrised exactly in one batched add (H + H^T). When J_t and Pc_t repeat exactly for
    t >= ``repeat_from`` (a filter in steady state) the loop stops once Sigma_{t|T} has
    settled there (``steady_state_tol``) and repeats it down to ``repeat_from``.
    J, ASig (pb, T-1, S, S), covs (pb, T, S, S) -> (pb, T, S, S)."""
    T1 = J.shape[-3]
    if repeat_from is None:
        repeat_from = T1
    u = min(repeat_from + 1, T1)  # distinct coefficients: entry u - 1 stands for t >= u - 1
    Pch = fused_addmm(
        covs[..., :u, :, :], J[..., :u, :, :], ASig[..., :u, :, :], beta=0.5, alpha=-0.5
    )  # Pc / 2
    cb = broadcast_shapes(J.shape[:-3], covs.shape[:-3], Pch.shape[:-3])
    Js = _flat_time_entries(J[..., :u, :, :], cb, u, 2)
    Pchs = _flat_time_entries(Pch, cb, u, 2)
    n = cb.numel()
    two_d = n == 1
    addmm = torch.addmm if two_d else torch.baddbmm
    mm = torch.mm if two_d else torch.bmm
    X = 0.5 * _flat_time_entries(covs[..., -1:, :, :], cb, 1, 2)[0]
    late: List[Tensor] = [X]  # halves, backwards in time: after the repeated stretch
    early: List[Tensor] = []  # and before it
    out, repeats, settled, t = late, 0, 0, T1 - 1
    while t >= 0:
        i = min(t, u - 1)
        Jt = Js[i]
        X_new = addmm(Pchs[i], mm(Jt, X), Jt.mT)
        if t >= repeat_from and (T1 - t) % _STEADY_CHECK_EVERY == 0:
            settled = settled + 1 if _settled(X_new, X, steady_state_tol) else 0
        X = X_new
        out.append(X)
        if settled == 2:  # settled with constant coefficients: repeat it down to repeat_from
            repeats, out = t - repeat_from, early
            t, settled = repeat_from - 1, 0
            continue
        t -= 1
    tdim = 1 if n != 1 else 0
    parts = [torch.stack(early[::-1], tdim)] if early else []
    if repeats:  # the settled value, repeated: one expanded view, copied once by cat
        X = late[-1].unsqueeze(tdim)
        parts.append(X.expand(X.shape[:tdim] + (repeats,) + X.shape[tdim + 1 :]))
    parts.append(torch.stack(late[::-1], tdim))
    res = torch.cat(parts, tdim) if len(parts) > 1 else parts[0]
    res = res.reshape(cb + res.shape[tdim:])
    return res + res.mT
