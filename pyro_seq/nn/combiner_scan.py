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
``sum_t dout_t^T h_t`` and ``sum_t du_t^T z_{t-1}`` are each one product over all steps. Given
the sequence lengths it computes only the real steps, in the step-major packing of
:mod:`pyro_seq.nn.ragged` (a random JSB Chorales minibatch is about half padding).
Values and gradients equal the per-step loop's to rounding (tested in float64 with
:func:`torch.autograd.gradcheck` and against the :class:`Combiner` loop).
"""

import torch
from torch.nn.functional import softplus

from pyro_seq.nn.ragged import check_lengths, pack_ragged, previous_rows, step_offsets


class _CombinerScan(torch.autograd.Function):
    """The recursion on the real steps of a ragged batch, packed step-major
    (:mod:`pyro_seq.nn.ragged`); padded steps get ``loc = 0``, ``scale = 1``, ``z = eps``."""

    @staticmethod
    def forward(ctx, z0, a, eps, w_z, b_z, w_h, b_h, min_scale, lengths):
        B, T, Z = eps.shape
        H = a.shape[-1]
        order, counts, index = pack_ragged(lengths, T)
        a_p = a.reshape(B * T, H).index_select(0, index)  # (N, H) real steps, step-major
        eps_p = eps.reshape(B * T, Z).index_select(0, index)
        N = a_p.shape[0]
        g = a_p.new_empty(N, H)  # tanh(u_t)
        out = a_p.new_empty(N, 2 * Z)  # [loc_t, r_t]
        z = a_p.new_empty(N, Z)
        w_z_t, w_h_t = w_z.t(), w_h.t()
        z_prev = z0.index_select(0, order)  # sorted: the running rows are a prefix
        lo = 0
        for n in counts:
            g_t = torch.addmm(b_z, z_prev[:n], w_z_t, out=g[lo : lo + n]).tanh_()
            h_t = (g_t + a_p[lo : lo + n]).mul_(0.5)
            o_t = torch.addmm(b_h, h_t, w_h_t, out=out[lo : lo + n])
            # the same operations as Normal(loc, scale).rsample(): loc + eps * scale
            z_t = torch.add(
                o_t[:, :Z],
                eps_p[lo : lo + n] * (min_scale + softplus(o_t[:, Z:])),
                out=z[lo : lo + n],
            )
            z_prev = z_t
            lo += n
        raw = out[:, Z:]
        scale_p = min_scale + softplus(raw)
        ctx.save_for_backward(z0, a_p, eps_p, w_z, w_h, g, raw, z, order, index)
        ctx.counts, ctx.shape = counts, (B, T, H)

        def unpack(packed, fill):  # a new (B, T, Z) tensor: fill, with the real steps packed
            padded = packed.new_empty(B * T, Z).copy_(fill)
            return padded.index_copy_(0, index, packed).view(B, T, Z)

        loc = unpack(out[:, :Z], a_p.new_zeros(()))
        scale = unpack(scale_p, a_p.new_ones(()))
        return loc, scale, unpack(z, eps.reshape(B * T, Z))

    @staticmethod
    def backward(ctx, g_loc, g_scale, g_z):
        z0, a_p, eps_p, w_z, w_h, g, raw, z, order, index = ctx.saved_tensors
        counts, (B, T, H) = ctx.counts, ctx.shape
        Z = z.shape[1]

        def pack(grad):  # padded (B, T, Z) gradient -> packed real steps (N, Z)
            if grad is None:
                return z.new_zeros(z.shape)
            return grad.reshape(B * T, Z).index_select(0, index)

        g_loc, g_scale, g_z = pack(g_loc), pack(g_scale), pack(g_z)
        # everything that does not depend on the carried gradient, for all steps at once
        sig = torch.sigmoid(raw)
        d_out = torch.cat([g_loc + g_z, (g_scale + g_z * eps_p) * sig], -1)  # (N, 2Z)
        d_u = torch.empty_like(g)
        d_h = torch.empty_like(g)
        dtanh = (1 - g * g).mul_(0.5)  # d u -> d h chain: d_u = 0.5 (1 - g^2) d_h
        offsets = step_offsets(counts)
        carry = None  # d z_t from step t + 1 (its running rows, a prefix)
        for t in range(len(counts) - 1, -1, -1):
            lo, n = offsets[t], counts[t]
            d_out_t = d_out[lo : lo + n]
            if carry is not None:  # z_t feeds loc_t directly and scale_t through eps_t
                m = carry.shape[0]
                d_out_t[:m, :Z] += carry
                d_out_t[:m, Z:] += carry * eps_p[lo : lo + m] * sig[lo : lo + m]
            d_h_t = torch.mm(d_out_t, w_h, out=d_h[lo : lo + n])
            d_u_t = torch.mul(d_h_t, dtanh[lo : lo + n], out=d_u[lo : lo + n])
            carry = d_u_t @ w_z
        h = (g + a_p).mul_(0.5)
        z_prev = previous_rows(z0.index_select(0, order), z, counts)
        d_w_h = d_out.t() @ h
        d_b_h = d_out.sum(0)
        d_w_z = d_u.t() @ z_prev
        d_b_z = d_u.sum(0)
        d_z0 = None
        if ctx.needs_input_grad[0]:
            d_z0 = torch.zeros_like(z0)
            d_z0[order[: carry.shape[0]]] = carry  # every row runs step 1
        d_a = None
        if ctx.needs_input_grad[1]:
            d_a = d_h.new_zeros(B * T, H).index_copy_(0, index, d_h.mul_(0.5)).view(B, T, H)
        return d_z0, d_a, None, d_w_z, d_b_z, d_w_h, d_b_h, None, None


def combiner_scan(z0, a, eps, w_z, b_z, w_h, b_h, min_scale, lengths=None):
    """Run the combiner recursion (module docstring) over the real steps for given noise.

    :param z0: ``(B, Z)`` the state before step 1 (the guide's ``z_q_0``, expanded).
    :param a: ``(B, T, H)`` the inference RNN's states ``a_t``.
    :param eps: ``(B, T, Z)`` standard-normal noise (no gradient).
    :param w_z: ``(H, Z)``, ``b_z`` ``(H,)``: the ``z_{t-1} -> hidden`` layer.
    :param w_h: ``(2Z, H)``, ``b_h`` ``(2Z,)``: the loc and scale heads stacked
        (:meth:`pyro_seq.nn.Combiner.stacked_heads`).
    :param float min_scale: floor added to the softplus scale.
    :param lengths: ``(B,)`` integer steps of each row, each in ``[1, T]``
        (:func:`~pyro_seq.nn.ragged.sequence_lengths` of the mask); ``None``: every row runs
        all ``T`` steps. Steps past a row's length are not computed.
    :returns: ``(loc, scale, z)``, each ``(B, T, Z)``; ``z = loc + scale * eps`` on the real
        steps, and ``loc = 0``, ``scale = 1``, ``z = eps`` (finite values that no score reads)
        past each row's length.
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
    if lengths is None:
        lengths = torch.full((B,), T, dtype=torch.long, device=eps.device)
    else:
        check_lengths(lengths, B, T, "combiner_scan")
    return _CombinerScan.apply(z0, a, eps.detach(), w_z, b_z, w_h, b_h, float(min_scale), lengths)
