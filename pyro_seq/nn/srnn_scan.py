"""The SRNN guide's recursion over a whole sequence as one autograd node (forward and backward).

The inference network of Fraccaro et al. (2016, eq. 5.10-5.12; thesis Ch. 5) samples
``z_t ~ q(z_t | z_{t-1}, a_t)`` step by step with two one-hidden-layer MLPs
(:class:`~pyro_seq.nn.GaussianMLP`) that read ``z_{t-1}`` and a context known in advance::

    g^q_t = act(W^q_z z_{t-1} + c^q_t),   [m^q_t, r^q_t] = W^q_h g^q_t + b^q_h    (posterior)
    g^p_t = act(W^p_z z_{t-1} + c^p_t),   [m^p_t, r^p_t] = W^p_h g^p_t + b^p_h    (prior, Res_q)
    loc_t = m^q_t + m^p_t,   scale_t = s(r^q_t),   z_t = loc_t + scale_t * eps_t

with the projected contexts ``c^q_t = W^q_c a_t + b^q`` and ``c^p_t = W^p_c d_t + b^p``
(:meth:`~pyro_seq.nn.heads.GaussianMLP.project_context`), ``s(r) = min_scale + softplus(r)`` or
``min_scale + exp(r / 2)`` (the two variance modes of :class:`~pyro_seq.nn.GaussianHead`).
Without Res_q (``residual=False``) the prior terms are absent and ``loc_t = m^q_t``. The prior's
``(m^p_t, s(r^p_t))`` at the guide's own ``z_{t-1}`` is returned as well: the model reuses it
for ``log p(z_t | z_{t-1}, d_t)``.

:func:`srnn_guide_scan` runs this for given noise ``eps`` with a hand-written backward pass.
Forward, per step: one product for both first layers (``[W^q_z; W^p_z] z_{t-1}``), the
activation, and the two output products that the recursion needs (``[m^q, r^q]`` and ``m^p``);
the prior's scale does not feed the recursion and is one product over all steps afterwards.
Backward, per step: only the two products that carry the gradient from ``z_t`` back to
``z_{t-1}`` (through the output layers, ``(B, 2Z) x (2Z, H)``, and the first layers,
``(B, H) x (H, Z)``); every term that does not depend on that carried gradient, and every weight
gradient, is one product over all steps. Values and gradients equal those of the per-step loop
of :class:`~pyro_seq.models.SRNN` to rounding (tested in float64 with
:func:`torch.autograd.gradcheck` and against the loop).
"""

from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.functional import leaky_relu, softplus

from pyro_seq.nn.mlp import ClippedLeakyReLU
from pyro_seq.nn.ragged import check_lengths, pack_ragged

#: the threshold above which :func:`torch.nn.functional.softplus` is the identity (beta 1)
_SOFTPLUS_THRESHOLD = 20.0


def activation_derivative(
    activation: nn.Module,
) -> Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """``(u, g) -> d act(u) / du`` for ``g = activation(u)``, as autograd computes it, for the
    hidden activations of :data:`pyro_seq.nn.mlp.ACTIVATIONS` (clipped leaky ReLU, ReLU, leaky
    ReLU, tanh, ELU); None for any other module, or one that works in place
    (:func:`srnn_guide_scan` cannot run it)."""
    if getattr(activation, "inplace", False):
        return None
    if type(activation) is ClippedLeakyReLU:
        slope = float(activation.negative_slope)

        def clipped(u, g):
            # the clamp passes the gradient where -clip <= leaky_relu(u) <= clip, i.e. where it
            # left leaky_relu(u) unchanged; the leaky ReLU's own derivative is 1 or the slope
            inside = (g == leaky_relu(u, slope)).to(u.dtype)
            return torch.ops.aten.leaky_relu_backward(inside, u, slope, False)

        return clipped
    if type(activation) is nn.LeakyReLU:
        slope = float(activation.negative_slope)
        return lambda u, g: torch.ops.aten.leaky_relu_backward(torch.ones_like(u), u, slope, False)
    if type(activation) is nn.ReLU:
        return lambda u, g: (g > 0).to(u.dtype)
    if type(activation) is nn.Tanh:
        return lambda u, g: 1 - g * g
    if type(activation) is nn.ELU:
        alpha = float(activation.alpha)
        return lambda u, g: torch.where(u > 0, 1.0, g + alpha)
    return None


def _scale(raw, min_scale, variance):
    """The standard deviation from the raw output (:meth:`GaussianHead.scale`)."""
    if variance == "log":
        return min_scale + torch.exp(0.5 * raw)
    return min_scale + softplus(raw)


def _scale_derivative(raw, min_scale, variance):
    """``d scale / d raw`` as autograd computes it for :func:`_scale`."""
    if variance == "log":
        return 0.5 * torch.exp(0.5 * raw)
    return torch.where(raw > _SOFTPLUS_THRESHOLD, 1.0, torch.sigmoid(raw))


def _real_steps(counts, T, B, device):
    """``(T, B)`` bool: row ``b`` (sorted by decreasing length) runs at step ``t``."""
    n = torch.tensor(list(counts) + [0] * (T - len(counts)), device=device)
    return torch.arange(B, device=device) < n.unsqueeze(-1)


def _on(real, v):
    """``v`` with padded steps zeroed (``real`` None: no padding)."""
    return v if real is None else torch.where(real, v, 0.0)


class _SRNNGuideScan(torch.autograd.Function):
    # Internally time-major: the per-step slices of the (T, B, .) buffers are contiguous, so
    # the products of a step write into them directly and nothing is stacked along dim 1.
    # Ragged batches: the rows come sorted by decreasing length and ``counts[t]`` rows run at
    # step t (a prefix); only those are computed, and padded steps hold loc 0, scale 1,
    # z = eps, prior loc 0 and prior scale 1, whose incoming gradients are ignored.
    @staticmethod
    def forward(
        ctx, z0, eps, cq, wzq, whq, bhq, cp, wzp, whp, bhp, act, d_act, min_scale, var, counts
    ):
        residual = cp is not None
        B, T, Z = eps.shape
        Hq = cq.shape[-1]
        H = Hq + (cp.shape[-1] if residual else 0)
        # u_t = c_t + W_z z_{t-1}, both first layers at once; the buffer starts as the contexts
        u = cq.new_empty(T, B, H)
        u[..., :Hq] = cq.transpose(0, 1)
        if residual:
            u[..., Hq:] = cp.transpose(0, 1)
            w_z = torch.cat([wzq, wzp])  # (H, Z)
            w_lp_t, b_lp = whp[:Z].t(), bhp[:Z]
        else:
            w_z = wzq
        w_z_t, whq_t = w_z.t(), whq.t()
        eps_tm = eps.transpose(0, 1)  # (T, B, Z) view
        g = u.new_zeros(T, B, H)
        out = u.new_zeros(T, B, 2 * Z)  # [m^q_t, r^q_t]
        loc = u.new_zeros(T, B, Z)
        scale = u.new_ones(T, B, Z)
        z = eps_tm.clone()
        m_p = u.new_zeros(T, B, Z) if residual else None
        z_prev_all = u.new_zeros(T, B, Z)  # z_{t-1} of every step (z0 at step 1)
        z_prev_all[0] = z0
        z_prev = z0
        for t, n in enumerate(counts):
            u_t = u[t, :n].addmm_(z_prev[:n], w_z_t)
            g_t = act(u_t)
            g[t, :n] = g_t
            o_t = torch.addmm(bhq, g_t[:, :Hq], whq_t, out=out[t, :n])
            loc_t = o_t[:, :Z]
            if residual:
                m_p_t = torch.addmm(b_lp, g_t[:, Hq:], w_lp_t, out=m_p[t, :n])
                loc_t = loc_t + m_p_t
            loc[t, :n] = loc_t
            scale_t = _scale(o_t[:, Z:], min_scale, var)
            scale[t, :n] = scale_t
            # the same operations as Normal(loc, scale).rsample(): loc + eps * scale
            z_t = torch.add(loc_t, eps_tm[t, :n] * scale_t, out=z[t, :n])
            if t + 1 < T:
                z_prev_all[t + 1, :n] = z_t
            z_prev = z_t
        ctx.residual, ctx.d_act, ctx.min_scale, ctx.var, ctx.Hq, ctx.counts = (
            residual,
            d_act,
            min_scale,
            var,
            Hq,
            counts,
        )
        bm = lambda v: v.transpose(0, 1)  # noqa: E731  (T, B, .) -> (B, T, .)
        if not residual:
            ctx.save_for_backward(eps, w_z, whq, u, g, out, z_prev_all, None, None)
            return bm(loc), bm(scale), bm(z)
        g_p = g[..., Hq:].view(T * B, H - Hq)
        raw_p = torch.addmm(bhp[Z:], g_p, whp[Z:].t()).view(T, B, Z)
        prior_scale = _scale(raw_p, min_scale, var)
        ragged = sum(counts) < T * B
        if ragged:
            real = _real_steps(counts, T, B, u.device).unsqueeze(-1)
            prior_scale = torch.where(real, prior_scale, 1.0)
        ctx.save_for_backward(eps, w_z, whq, u, g, out, z_prev_all, whp, raw_p)
        return bm(loc), bm(scale), bm(z), bm(m_p), bm(prior_scale).contiguous()

    @staticmethod
    @once_differentiable
    def backward(ctx, g_loc, g_scale, g_z, g_ploc=None, g_pscale=None):
        eps, w_z, whq, u, g, out, z_prev, whp, raw_p = ctx.saved_tensors
        residual, min_scale, var, Hq, d_act = (
            ctx.residual,
            ctx.min_scale,
            ctx.var,
            ctx.Hq,
            ctx.d_act,
        )
        T, B, H = u.shape
        Z = eps.shape[-1]
        TB = T * B
        # time-major views of the output gradients; None for outputs that got no gradient
        counts = ctx.counts
        real = None
        if sum(counts) < T * B:  # gradients reaching padded steps (constants) are ignored
            real = _real_steps(counts, T, B, u.device).unsqueeze(-1)
        g_loc, g_scale, g_z, g_ploc, g_pscale = (
            None if v is None else _on(real, v.transpose(0, 1))
            for v in (g_loc, g_scale, g_z, g_ploc, g_pscale)
        )
        zero = z_prev.new_zeros(())
        g_z = zero if g_z is None else g_z
        eps_t = eps.transpose(0, 1)
        # everything that does not depend on the gradient carried through z_t, all steps at once
        s_q = _scale_derivative(out[..., Z:], min_scale, var)  # d scale_t / d r^q_t
        k = eps_t * s_q  # d z_t / d r^q_t
        f_loc = g_z if g_loc is None else g_loc + g_z
        f_rq = g_z * k if g_scale is None else (g_scale + g_z * eps_t) * s_q
        d_oq = torch.cat([f_loc.expand(T, B, Z), f_rq.expand(T, B, Z)], -1)  # (T, B, 2Z)
        d_u = u.new_empty(T, B, H)  # first d L / d g without the carried part, then d L / d u
        d_u_flat = d_u.view(TB, H)
        torch.mm(d_oq.view(TB, 2 * Z), whq, out=d_u_flat[:, :Hq])
        if residual:
            f_mp = f_loc if g_ploc is None else f_loc + g_ploc
            if g_pscale is None:
                d_rp = zero.expand(T, B, Z)
            else:  # (zero on padded steps, where g_pscale is)
                d_rp = g_pscale * _scale_derivative(raw_p, min_scale, var)
            d_op = torch.cat([f_mp.expand(T, B, Z), d_rp.expand(T, B, Z)], -1)
            torch.mm(d_op.view(TB, 2 * Z), whp, out=d_u_flat[:, Hq:])
            # the Jacobian of [loc_t, r^q_t] with respect to g_t = [g^q_t, g^p_t]
            jac = torch.cat([whq, torch.cat([whp[:Z], whp.new_zeros(Z, H - Hq)])], 1)
        else:
            jac = whq
        # e[t] = [c_t, c_t * k_t], c_t = d L / d z_t through step t + 1 (zero at the last step)
        # (rows past a sequence's end get no carried gradient, and their d u is zero)
        e = u.new_zeros(T, B, 2 * Z)
        for t in range(len(counts) - 1, -1, -1):
            n = counts[t]
            d_u_t = d_u[t, :n]
            if t < T - 1:
                d_u_t.addmm_(e[t, :n], jac)
            d_u_t.mul_(d_act(u[t, :n], g[t, :n]))
            if t > 0:
                c = torch.mm(d_u_t, w_z, out=e[t - 1, :n, :Z])
                torch.mul(c, k[t - 1, :n], out=e[t - 1, :n, Z:])
        d_z0 = d_u[0] @ w_z
        d_oq += e  # d [m^q_t, r^q_t] = the fixed part + [c_t, c_t * k_t]
        g_flat, d_oq = g.view(TB, H), d_oq.view(TB, 2 * Z)
        d_whq = d_oq.t() @ g_flat[:, :Hq]
        d_bhq = d_oq.sum(0)
        d_w_z = d_u_flat.t() @ z_prev.view(TB, Z)  # (H, Z)
        needs = ctx.needs_input_grad
        d_c = d_u.transpose(0, 1)
        d_cq = d_c[..., :Hq] if needs[2] else None
        if not residual:
            return (d_z0, None, d_cq, d_w_z, d_whq, d_bhq) + (None,) * 9
        d_op[..., :Z] += e[..., :Z]  # d m^p_t = the fixed part + c_t
        d_op = d_op.view(TB, 2 * Z)
        d_whp = d_op.t() @ g_flat[:, Hq:]
        d_bhp = d_op.sum(0)
        d_cp = d_c[..., Hq:] if needs[6] else None
        grads = (d_z0, None, d_cq, d_w_z[:Hq], d_whq, d_bhq, d_cp, d_w_z[Hq:], d_whp, d_bhp)
        return grads + (None,) * 5


def _check_mlp(name, mlp, B, T, Z):
    """The ``(context, w_z, w_head, b_head)`` of one MLP, checked against ``(B, T, Z)``."""
    if len(mlp) != 4:
        raise ValueError(
            f"srnn_guide_scan: {name} must be (context, w_z, w_head, b_head), got {len(mlp)} items"
        )
    context, w_z, w_head, b_head = mlp
    H = context.shape[-1]
    if (
        context.shape != (B, T, H)
        or w_z.shape != (H, Z)
        or w_head.shape != (2 * Z, H)
        or b_head.shape != (2 * Z,)
    ):
        raise ValueError(
            f"srnn_guide_scan: inconsistent {name} shapes context {tuple(context.shape)}, "
            f"w_z {tuple(w_z.shape)}, w_head {tuple(w_head.shape)}, b_head "
            f"{tuple(b_head.shape)} for eps {(B, T, Z)}; expected ({B}, {T}, H), (H, {Z}), "
            f"({2 * Z}, H), ({2 * Z},)"
        )
    return context, w_z, w_head, b_head


def srnn_guide_scan(
    z0: torch.Tensor,
    eps: torch.Tensor,
    posterior: Sequence[torch.Tensor],
    prior: Optional[Sequence[torch.Tensor]] = None,
    activation: Optional[nn.Module] = None,
    min_scale: float = 1e-3,
    variance: str = "softplus",
    lengths: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, ...]:
    """Run the SRNN guide recursion (module docstring) over the real steps for given noise.

    :param z0: ``(B, Z)`` the state before step 1 (zeros in the SRNN).
    :param eps: ``(B, T, Z)`` standard-normal noise (no gradient).
    :param posterior: ``(c^q, W^q_z, W^q_h, b^q_h)``: the projected context ``(B, T, Hq)``
        (:meth:`~pyro_seq.nn.heads.GaussianMLP.project_context` of ``a_{1:T}``) and the weights of
        :meth:`~pyro_seq.nn.heads.GaussianMLP.step_weights`, ``(Hq, Z)``, ``(2Z, Hq)``, ``(2Z,)``.
    :param prior: the same for the prior MLP on ``d_{1:T}`` (Res_q, eq. 5.12), or None for
        ``loc_t = m^q_t`` (no prior terms).
    :param activation: the hidden activation module of both MLPs (one that
        :func:`activation_derivative` knows); None for the SRNN's clipped leaky ReLU.
    :param float min_scale: floor added to the standard deviations.
    :param str variance: ``"softplus"`` or ``"log"`` (:class:`~pyro_seq.nn.GaussianHead`).
    :param lengths: ``(B,)`` integer steps of each row, each in ``[1, T]``
        (:func:`~pyro_seq.nn.ragged.sequence_lengths` of the mask); ``None``: every row runs
        all ``T`` steps. Steps past a row's length are not computed: the rows run sorted by
        decreasing length, each step on those still running.
    :returns: ``(loc, scale, z)``, each ``(B, T, Z)``, ``z = loc + scale * eps``; with
        ``prior`` also ``(prior_loc, prior_scale)`` of ``p(z_t | z_{t-1}, d_t)`` at the guide's
        ``z_{t-1}``. Past each row's length: ``loc = 0``, ``scale = 1``, ``z = eps``, prior
        ``0`` and ``1`` (finite values that no score reads; their gradients are ignored).
    """
    if eps.dim() != 3 or z0.shape != (eps.shape[0], eps.shape[2]):
        raise ValueError(
            f"srnn_guide_scan: eps must be (B, T, Z) and z0 (B, Z), got eps "
            f"{tuple(eps.shape)} and z0 {tuple(z0.shape)}"
        )
    B, T, Z = eps.shape
    if T == 0:
        raise ValueError("srnn_guide_scan: eps has no steps (T = 0); pass at least one step")
    if activation is None:
        activation = ClippedLeakyReLU()
    d_act = activation_derivative(activation)
    if d_act is None:
        raise ValueError(
            f"srnn_guide_scan: activation {activation!r} has no hand-written derivative; use "
            "one of pyro_seq.nn.mlp.ACTIVATIONS or run the step loop"
        )
    if variance not in ("softplus", "log"):
        raise ValueError(f"srnn_guide_scan: variance must be 'softplus' or 'log', got {variance!r}")
    q = _check_mlp("posterior", posterior, B, T, Z)
    p = (None,) * 4 if prior is None else _check_mlp("prior", prior, B, T, Z)
    if lengths is None:
        counts = [B] * T
        return _SRNNGuideScan.apply(
            z0, eps.detach(), *q, *p, activation, d_act, float(min_scale), variance, counts
        )
    check_lengths(lengths, B, T, "srnn_guide_scan")
    order, counts, _ = pack_ragged(lengths, T)
    if bool((order == torch.arange(B, device=order.device)).all()):
        # rows already sorted by decreasing length (e.g. all of length T): no permutation,
        # which would cost a copy of every input and output and its backward
        return _SRNNGuideScan.apply(
            z0, eps.detach(), *q, *p, activation, d_act, float(min_scale), variance, counts
        )
    rows = lambda v: None if v is None else v.index_select(0, order)  # noqa: E731
    q = (rows(q[0]),) + tuple(q[1:])
    p = (rows(p[0]),) + tuple(p[1:])
    out = _SRNNGuideScan.apply(
        rows(z0), rows(eps.detach()), *q, *p, activation, d_act, float(min_scale), variance, counts
    )
    back = torch.argsort(order)  # the original row order
    return tuple(v.index_select(0, back) for v in out)
