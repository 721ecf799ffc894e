"""The SRNN guide's recursion over a whole sequence as one autograd node (forward and backward).

The inference network of Fraccaro et al. (2016, eq. 5.10-5.12; thesis Ch. 5) samples
``z_t ~ q(z_t | z_{t-1}, a_t)`` step by step with two one-hidden-layer MLPs
(:class:`~pyro_seq.nn.GaussianMLP`) that read ``z_{t-1}`` and a context known in advance::

    g^q_t = act(W^q_z z_{t-1} + c^q_t),   [m^q_t, r^q_t] = W^q_h g^q_t + b^q_h    (posterior)
    g^p_t = act(W^p_z z_{t-1} + c^p_t),   [m^p_t, r^p_t] = W^p_h g^p_t + b^p_h    (prior, Res_q)
    loc_t = m^q_t + m^p_t,   scale_t = s(r^q_t),   z_t = loc_t + scale_t * eps_t

with the projected contexts ``c^q_t = W^q_c a_t + b^q`` and ``c^p_t = W^p_c d_t + b^p``
(:meth:`GaussianMLP.project_context`), ``s(r) = min_scale + softplus(r)`` or
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

#: the threshold above which :func:`torch.nn.functional.softplus` is the identity (beta 1)
_SOFTPLUS_THRESHOLD = 20.0


def activation_derivative(
    activation: nn.Module,
) -> Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """``(u, g) -> d act(u) / du`` for ``g = activation(u)``, as autograd computes it, for the
    hidden activations of :data:`pyro_seq.nn.mlp.ACTIVATIONS` (clipped leaky ReLU, ReLU, leaky
    ReLU, tanh, ELU); None for any other module (:func:`srnn_guide_scan` cannot run it)."""
    if type(activation) is ClippedLeakyReLU:
        slope, clip = float(activation.negative_slope), float(activation.clip)

        def clipped(u, g):
            y = leaky_relu(u, slope)  # the clamp passes the gradient where -clip <= y <= clip
            inside = (y >= -clip) & (y <= clip)
            return torch.where(u > 0, u.new_ones(()), u.new_full((), slope)) * inside

        return clipped
    if type(activation) is nn.LeakyReLU:
        slope = float(activation.negative_slope)
        return lambda u, g: torch.where(u > 0, u.new_ones(()), u.new_full((), slope))
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


class _SRNNGuideScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z0, eps, cq, wzq, whq, bhq, cp, wzp, whp, bhp, act, d_act, min_scale, var):
        residual = cp is not None
        B, T, Z = eps.shape
        Hq = cq.shape[-1]
        if residual:  # both first layers read z_{t-1}: one product per step
            w_z = torch.cat([wzq, wzp])  # (H, Z), H = Hq + Hp
            context = torch.cat([cq, cp], -1).unbind(1)
            w_lp_t, b_lp = whp[:Z].t(), bhp[:Z]
        else:
            w_z, context = wzq, cq.unbind(1)
        w_z_t, whq_t = w_z.t(), whq.t()
        eps_steps = eps.unbind(1)
        us, gs, outs, locs, scales, m_ps, zs = [], [], [], [], [], [], []
        z_prev = z0
        for t in range(T):
            # the arithmetic of GaussianMLP.forward with step_weights(), in the same order
            u_t = torch.mm(z_prev, w_z_t) + context[t]
            g_t = act(u_t)
            o_t = torch.addmm(bhq, g_t[:, :Hq], whq_t)  # [m^q_t, r^q_t]
            loc_t = o_t[:, :Z]
            if residual:
                m_p = torch.addmm(b_lp, g_t[:, Hq:], w_lp_t)
                loc_t = loc_t + m_p
                m_ps.append(m_p)
            scale_t = _scale(o_t[:, Z:], min_scale, var)
            # the same operations as Normal(loc, scale).rsample(): loc + eps * scale
            z_t = loc_t + eps_steps[t] * scale_t
            for store, v in ((us, u_t), (gs, g_t), (outs, o_t), (locs, loc_t), (scales, scale_t)):
                store.append(v)
            zs.append(z_t)
            z_prev = z_t
        u, g, out = torch.stack(us, 1), torch.stack(gs, 1), torch.stack(outs, 1)
        loc, scale, z = torch.stack(locs, 1), torch.stack(scales, 1), torch.stack(zs, 1)
        raw_q = out[..., Z:]
        ctx.residual, ctx.d_act, ctx.min_scale, ctx.var, ctx.Hq = (
            residual,
            d_act,
            min_scale,
            var,
            Hq,
        )
        if not residual:
            ctx.save_for_backward(z0, eps, w_z, whq, u, g, raw_q, z, None, None)
            return loc, scale, z
        raw_p = torch.addmm(bhp[Z:], g[..., Hq:].reshape(B * T, -1), whp[Z:].t()).view(B, T, Z)
        prior_loc = torch.stack(m_ps, 1)
        prior_scale = _scale(raw_p, min_scale, var)
        ctx.save_for_backward(z0, eps, w_z, whq, u, g, raw_q, z, whp, raw_p)
        return loc, scale, z, prior_loc, prior_scale

    @staticmethod
    @once_differentiable
    def backward(ctx, g_loc, g_scale, g_z, g_ploc=None, g_pscale=None):
        z0, eps, w_z, whq, u, g, raw_q, z, whp, raw_p = ctx.saved_tensors
        residual, min_scale, var, Hq = ctx.residual, ctx.min_scale, ctx.var, ctx.Hq
        B, T, Z = eps.shape
        zero = torch.zeros_like(z)
        g_loc, g_scale, g_z, g_ploc, g_pscale = (
            zero if v is None else v for v in (g_loc, g_scale, g_z, g_ploc, g_pscale)
        )  # outputs that got no gradient
        flat = lambda v: v.reshape(B * T, -1)  # noqa: E731
        # everything that does not depend on the gradient carried through z_t, all steps at once
        k = eps * _scale_derivative(raw_q, min_scale, var)  # d z_t / d r^q_t
        f_loc = g_loc + g_z
        f_rq = (g_scale + g_z * eps) * _scale_derivative(raw_q, min_scale, var)
        f_oq = torch.cat([f_loc, f_rq], -1)
        f_g = f_oq @ whq  # (B, T, Hq): d L / d g^q without the carried part
        if residual:
            f_mp = f_loc + g_ploc
            d_rp = g_pscale * _scale_derivative(raw_p, min_scale, var)
            f_op = torch.cat([f_mp, d_rp], -1)
            f_g = torch.cat([f_g, f_op @ whp], -1)  # (B, T, H)
            # the Jacobian of [loc_t, r^q_t] with respect to g_t = [g^q_t, g^p_t]
            jac = torch.cat([whq, torch.cat([whp[:Z], whp.new_zeros(Z, whp.shape[1])])], 1)
        else:
            jac = whq
        d_g = ctx.d_act(u, g)  # (B, T, H)
        f_steps, d_g_steps, k_steps = f_g.unbind(1), d_g.unbind(1), k.unbind(1)
        d_us, carries = [None] * T, [None] * T
        carry = None  # d L / d z_t through step t + 1
        e = z0.new_empty(B, 2 * Z)
        for t in range(T - 1, -1, -1):
            if carry is None:
                d_u_t = f_steps[t] * d_g_steps[t]
            else:
                e[:, :Z] = carry
                torch.mul(carry, k_steps[t], out=e[:, Z:])
                d_u_t = torch.addmm(f_steps[t], e, jac).mul_(d_g_steps[t])
            carries[t] = carry if carry is not None else zero[:, 0]
            d_us[t] = d_u_t
            carry = d_u_t @ w_z
        d_u, c = torch.stack(d_us, 1), torch.stack(carries, 1)
        d_oq = torch.cat([f_loc + c, f_rq + c * k], -1)
        d_whq = flat(d_oq).t() @ flat(g[..., :Hq])
        d_bhq = flat(d_oq).sum(0)
        z_prev = torch.cat([z0.unsqueeze(1), z[:, :-1]], 1)
        d_w_z = flat(d_u).t() @ flat(z_prev)  # (H, Z)
        needs = ctx.needs_input_grad
        d_cq = d_u[..., :Hq] if needs[2] else None
        if not residual:
            return (carry, None, d_cq, d_w_z, d_whq, d_bhq) + (None,) * 8
        d_op = torch.cat([f_mp + c, d_rp], -1)
        d_whp = flat(d_op).t() @ flat(g[..., Hq:])
        d_bhp = flat(d_op).sum(0)
        d_cp = d_u[..., Hq:] if needs[6] else None
        grads = (carry, None, d_cq, d_w_z[:Hq], d_whq, d_bhq, d_cp, d_w_z[Hq:], d_whp, d_bhp)
        return grads + (None,) * 4


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
) -> Tuple[torch.Tensor, ...]:
    """Run the SRNN guide recursion (module docstring) over all steps for given noise.

    :param z0: ``(B, Z)`` the state before step 1 (zeros in the SRNN).
    :param eps: ``(B, T, Z)`` standard-normal noise (no gradient).
    :param posterior: ``(c^q, W^q_z, W^q_h, b^q_h)``: the projected context ``(B, T, Hq)``
        (:meth:`GaussianMLP.project_context` of ``a_{1:T}``) and the weights of
        :meth:`GaussianMLP.step_weights`, ``(Hq, Z)``, ``(2Z, Hq)``, ``(2Z,)``.
    :param prior: the same for the prior MLP on ``d_{1:T}`` (Res_q, eq. 5.12), or None for
        ``loc_t = m^q_t`` (no prior terms).
    :param activation: the hidden activation module of both MLPs (one that
        :func:`activation_derivative` knows); None for the SRNN's clipped leaky ReLU.
    :param float min_scale: floor added to the standard deviations.
    :param str variance: ``"softplus"`` or ``"log"`` (:class:`~pyro_seq.nn.GaussianHead`).
    :returns: ``(loc, scale, z)``, each ``(B, T, Z)``, ``z = loc + scale * eps``; with
        ``prior`` also ``(prior_loc, prior_scale)`` of ``p(z_t | z_{t-1}, d_t)`` at the guide's
        ``z_{t-1}``.
    """
    if eps.dim() != 3 or z0.shape != (eps.shape[0], eps.shape[2]):
        raise ValueError(
            f"srnn_guide_scan: eps must be (B, T, Z) and z0 (B, Z), got eps "
            f"{tuple(eps.shape)} and z0 {tuple(z0.shape)}"
        )
    B, T, Z = eps.shape
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
    return _SRNNGuideScan.apply(
        z0, eps.detach(), *q, *p, activation, d_act, float(min_scale), variance
    )
