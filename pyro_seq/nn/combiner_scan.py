"""The DMM guide's recursion over a whole sequence as one autograd node (forward and backward).

The structured-inference guide of Krishnan et al. (2017, eq. 11; thesis eq. 4.8-4.9) samples
``z_t ~ q(z_t | z_{t-1}, a_t)`` step by step::

    u_t = W_z z_{t-1} + b_z,    h_t = (tanh(u_t) + a_t) / 2
    [loc_t, r_t] = W_h h_t + b_h,    scale_t = min_scale + softplus(r_t)
    z_t = loc_t + scale_t * eps_t,   eps_t ~ N(0, I)                 (reparameterised)

(:class:`~pyro_seq.nn.Combiner` with its stacked heads). Autograd records about ten nodes per
step and computes each weight gradient as one small product per step. :func:`combiner_scan`
runs the same recursion for given noise ``eps`` and returns ``loc``, ``scale`` and ``z`` for
every step, with a hand-written backward pass: per step only the two products that carry the
gradient back through ``h_t`` and ``z_{t-1}``; the weight gradients
``sum_t dout_t^T h_t`` and ``sum_t du_t^T z_{t-1}`` are each one product over all steps.
Values and gradients equal the per-step loop's to rounding (tested in float64 with
:func:`torch.autograd.gradcheck` and against the :class:`Combiner` loop).
"""

import torch
from torch.nn.functional import softplus


class _CombinerScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z0, a, eps, w_z, b_z, w_h, b_h, min_scale):
        B, T, Z = eps.shape
        H = a.shape[-1]
        g = a.new_empty(B, T, H)  # tanh(u_t)
        out = a.new_empty(B, T, 2 * Z)  # [loc_t, r_t]
        z = a.new_empty(B, T, Z)
        w_z_t, w_h_t = w_z.t(), w_h.t()
        z_prev = z0
        for t in range(T):
            g_t = torch.addmm(b_z, z_prev, w_z_t).tanh_()
            g[:, t] = g_t
            h_t = (g_t + a[:, t]).mul_(0.5)
            o_t = torch.addmm(b_h, h_t, w_h_t)
            out[:, t] = o_t
            # the same operations as Normal(loc, scale).rsample(): loc + eps * scale
            z_t = o_t[:, :Z] + eps[:, t] * (min_scale + softplus(o_t[:, Z:]))
            z[:, t] = z_t
            z_prev = z_t
        loc, raw = out[..., :Z].contiguous(), out[..., Z:].contiguous()
        scale = min_scale + softplus(raw)
        ctx.save_for_backward(z0, a, eps, w_z, w_h, g, raw, z)
        return loc, scale, z

    @staticmethod
    def backward(ctx, g_loc, g_scale, g_z):
        z0, a, eps, w_z, w_h, g, raw, z = ctx.saved_tensors
        B, T, Z = eps.shape
        g_loc, g_scale, g_z = (
            torch.zeros_like(z) if v is None else v for v in (g_loc, g_scale, g_z)
        )  # outputs that got no gradient
        # everything that does not depend on the carried gradient, for all steps at once
        sig = torch.sigmoid(raw)
        d_out = torch.cat([g_loc + g_z, (g_scale + g_z * eps) * sig], -1)  # (B, T, 2Z)
        d_u = torch.empty_like(g)
        d_h = torch.empty_like(g)
        dtanh = (1 - g * g).mul_(0.5)  # d u -> d h chain: d_u = 0.5 (1 - g^2) d_h
        carry = None  # d z_t from step t + 1
        for t in range(T - 1, -1, -1):
            d_out_t = d_out[:, t]
            if carry is not None:  # z_t feeds loc_t directly and scale_t through eps_t
                d_out_t = d_out_t + torch.cat([carry, carry * eps[:, t] * sig[:, t]], -1)
                d_out[:, t] = d_out_t
            d_h_t = d_out_t @ w_h
            d_h[:, t] = d_h_t
            d_u_t = d_h_t * dtanh[:, t]
            d_u[:, t] = d_u_t
            carry = d_u_t @ w_z
        h = (g + a).mul_(0.5)
        z_prev = torch.cat([z0.unsqueeze(1), z[:, :-1]], 1)
        flat = lambda v: v.reshape(B * T, -1)  # noqa: E731
        d_w_h = flat(d_out).t() @ flat(h)
        d_b_h = flat(d_out).sum(0)
        d_w_z = flat(d_u).t() @ flat(z_prev)
        d_b_z = flat(d_u).sum(0)
        d_a = d_h.mul_(0.5) if ctx.needs_input_grad[1] else None
        return carry, d_a, None, d_w_z, d_b_z, d_w_h, d_b_h, None


def combiner_scan(z0, a, eps, w_z, b_z, w_h, b_h, min_scale):
    """Run the combiner recursion (module docstring) over all steps for given noise.

    :param z0: ``(B, Z)`` the state before step 1 (the guide's ``z_q_0``, expanded).
    :param a: ``(B, T, H)`` the inference RNN's states ``a_t``.
    :param eps: ``(B, T, Z)`` standard-normal noise (no gradient).
    :param w_z: ``(H, Z)``, ``b_z`` ``(H,)``: the ``z_{t-1} -> hidden`` layer.
    :param w_h: ``(2Z, H)``, ``b_h`` ``(2Z,)``: the loc and scale heads stacked
        (:meth:`pyro_seq.nn.Combiner.stacked_heads`).
    :param float min_scale: floor added to the softplus scale.
    :returns: ``(loc, scale, z)``, each ``(B, T, Z)``; ``z = loc + scale * eps``.
    """
    B, T, Z = eps.shape
    if (
        z0.shape != (B, Z)
        or a.shape[:2] != (B, T)
        or w_z.shape != (a.shape[-1], Z)
        or w_h.shape != (2 * Z, a.shape[-1])
    ):
        raise ValueError(
            f"combiner_scan: inconsistent shapes z0 {tuple(z0.shape)}, a "
            f"{tuple(a.shape)}, eps {tuple(eps.shape)}, w_z {tuple(w_z.shape)}, "
            f"w_h {tuple(w_h.shape)}"
        )
    return _CombinerScan.apply(z0, a, eps.detach(), w_z, b_z, w_h, b_h, float(min_scale))
