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

from pyro_seq.nn.ragged import check_lengths, pack_ragged, previous_rows, step_offsets, to_padded


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
        counts, (B, T, _) = ctx.counts, ctx.shape
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
            d_a = to_padded(d_h.mul_(0.5), index, B, T)
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
    lengths = check_lengths(lengths, B, T, "combiner_scan", eps.device)
    return _CombinerScan.apply(z0, a, eps.detach(), w_z, b_z, w_h, b_h, float(min_scale), lengths)


class _ResidualCombinerScan(torch.autograd.Function):
    """The Res_q recursion (:func:`residual_combiner_scan`) on the real steps of a ragged batch,
    packed step-major as :class:`_CombinerScan`."""

    @staticmethod
    def forward(ctx, z0, zp0, a, eps, w_h, b_h, w_all, b_all, w_g2, b_g2, w_p2, b_p2, sizes, ms, n):
        H, Hg, Hp = sizes
        B, T, Z = eps.shape
        order, counts, index = pack_ragged(n, T)
        a_p = a.reshape(B * T, H).index_select(0, index)
        eps_p = eps.reshape(B * T, Z).index_select(0, index)
        N = a_p.shape[0]
        U = a_p.new_empty(N, H + Hg + Hp + Z)  # [u_c, u_g, u_p, W_0 z + b_0] per packed row
        out = a_p.new_empty(N, 2 * Z)  # the combiner's [loc, raw scale]
        gate, pm, z = (a_p.new_empty(N, Z) for _ in range(3))
        w_all_t, w_h_t, w_g2_t, w_p2_t = w_all.t(), w_h.t(), w_g2.t(), w_p2.t()
        zc, zp = z0.index_select(0, order), zp0.index_select(0, order)
        z_prev, lo = None, 0
        for t, m in enumerate(counts):
            rows = slice(lo, lo + m)
            if t == 0:  # the combiner reads z_q_0, the transition the model's z_0
                torch.addmm(b_all[:H], zc[:m], w_all_t[:, :H], out=U[rows, :H])
                torch.addmm(b_all[H:], zp[:m], w_all_t[:, H:], out=U[rows, H:])
            else:
                torch.addmm(b_all, z_prev[:m], w_all_t, out=U[rows])
            g_t = U[rows, :H].tanh_()
            h_t = (g_t + a_p[rows]).mul_(0.5)
            o_t = torch.addmm(b_h, h_t, w_h_t, out=out[rows])
            gh = torch.relu(U[rows, H : H + Hg])
            gate_t = torch.addmm(b_g2, gh, w_g2_t, out=gate[rows]).sigmoid_()
            ph = torch.relu(U[rows, H + Hg : H + Hg + Hp])
            pm_t = torch.addmm(b_p2, ph, w_p2_t, out=pm[rows])
            l0 = U[rows, H + Hg + Hp :]
            # (1 - gate) W_0 z + gate h, then plus the combiner's loc (Res_q)
            loc_t = torch.addcmul(l0, gate_t, pm_t - l0).add_(o_t[:, :Z])
            z_t = torch.add(loc_t, eps_p[rows] * (ms + softplus(o_t[:, Z:])), out=z[rows])
            z_prev, lo = z_t, lo + m
        loc_p = torch.addcmul(U[:, H + Hg + Hp :], gate, pm - U[:, H + Hg + Hp :]).add_(out[:, :Z])
        ctx.save_for_backward(
            z0, zp0, a_p, eps_p, w_h, w_all, w_g2, w_p2, U, out, gate, pm, z, order, index
        )
        ctx.sizes, ctx.counts, ctx.shape = sizes, counts, (B, T)

        def unpack(packed, fill):
            padded = packed.new_empty(B * T, Z).copy_(fill)
            return padded.index_copy_(0, index, packed).view(B, T, Z)

        scale_p = ms + softplus(out[:, Z:])
        return (
            unpack(loc_p, a_p.new_zeros(())),
            unpack(scale_p, a_p.new_ones(())),
            unpack(z, eps.reshape(B * T, Z)),
        )

    @staticmethod
    def backward(ctx, g_loc, g_scale, g_z):
        (z0, zp0, a_p, eps_p, w_h, w_all, w_g2, w_p2, U, out, gate, pm, z, order, index) = (
            ctx.saved_tensors
        )
        (H, Hg, Hp), counts, (B, T) = ctx.sizes, ctx.counts, ctx.shape
        Z = z.shape[1]

        def pack(grad):
            if grad is None:
                return z.new_zeros(z.shape)
            return grad.reshape(B * T, Z).index_select(0, index)

        g_loc, g_scale, g_z = pack(g_loc), pack(g_scale), pack(g_z)
        sig = torch.sigmoid(out[:, Z:])
        d_out = torch.cat([g_loc + g_z, (g_scale + g_z * eps_p) * sig], -1)  # (N, 2Z)
        g_tanh = U[:, :H]  # tanh(u_c), stored in place by the forward pass
        l0 = U[:, H + Hg + Hp :]
        d_U = torch.empty_like(U)  # [d u_c, d u_g, d u_p, d (W_0 z)] per packed row
        d_h = torch.empty_like(a_p)
        d_gpre = torch.empty_like(gate)  # d of the gate's pre-sigmoid
        d_pm = torch.empty_like(pm)
        dtanh = (1 - g_tanh * g_tanh).mul_(0.5)
        offsets = step_offsets(counts)
        carry = None
        d_z0 = d_zp0 = None
        for t in range(len(counts) - 1, -1, -1):
            lo, m = offsets[t], counts[t]
            rows = slice(lo, lo + m)
            d_o = d_out[rows]
            if carry is not None:  # z_t feeds loc_t directly and the scale through eps_t
                k = carry.shape[0]
                d_o[:k, :Z] += carry
                d_o[:k, Z:] += carry * eps_p[lo : lo + k] * sig[lo : lo + k]
            d_loc = d_o[:, :Z]  # also the gradient of the transition's mean m_t
            d_h_t = torch.mm(d_o, w_h, out=d_h[rows])
            torch.mul(d_h_t, dtanh[rows], out=d_U[rows, :H])
            gate_t, pm_t, l0_t = gate[rows], pm[rows], l0[rows]
            torch.mul(d_loc, 1 - gate_t, out=d_U[rows, H + Hg + Hp :])
            torch.mul(d_loc, gate_t, out=d_pm[rows])
            d_gp = torch.mul(d_loc * (pm_t - l0_t), gate_t * (1 - gate_t), out=d_gpre[rows])
            torch.mm(d_gp, w_g2, out=d_U[rows, H : H + Hg]).mul_(U[rows, H : H + Hg] > 0)
            torch.mm(d_pm[rows], w_p2, out=d_U[rows, H + Hg : H + Hg + Hp]).mul_(
                U[rows, H + Hg : H + Hg + Hp] > 0
            )
            if t > 0:
                carry = d_U[rows] @ w_all
            else:
                d_z0 = d_U[rows, :H] @ w_all[:H]
                d_zp0 = d_U[rows, H:] @ w_all[H:]
        h = (g_tanh + a_p).mul_(0.5)
        zc_prev = previous_rows(z0.index_select(0, order), z, counts)
        zp_prev = previous_rows(zp0.index_select(0, order), z, counts)
        d_w_h, d_b_h = d_out.t() @ h, d_out.sum(0)
        d_w_all = torch.cat([d_U[:, :H].t() @ zc_prev, d_U[:, H:].t() @ zp_prev], 0)
        d_b_all = d_U.sum(0)
        d_w_g2 = d_gpre.t() @ torch.relu(U[:, H : H + Hg])
        d_w_p2 = d_pm.t() @ torch.relu(U[:, H + Hg : H + Hg + Hp])
        grads_z0 = []
        for d, like in ((d_z0, z0), (d_zp0, zp0)):
            full = torch.zeros_like(like)
            full[order[: d.shape[0]]] = d  # every row runs step 1
            grads_z0.append(full)
        d_a = None
        if ctx.needs_input_grad[2]:
            d_a = to_padded(d_h.mul_(0.5), index, B, T)
        return (
            grads_z0[0],
            grads_z0[1],
            d_a,
            None,
            d_w_h,
            d_b_h,
            d_w_all,
            d_b_all,
            d_w_g2,
            d_gpre.sum(0),
            d_w_p2,
            d_pm.sum(0),
            None,
            None,
            None,
        )


def residual_combiner_scan(z0, zp0, a, eps, combiner, transition, lengths=None):
    """The DMM guide's recursion with Res_q (thesis 4.8.1): ``loc_t`` is the combiner's loc
    plus the mean of the gated transition (:class:`~pyro_seq.nn.GatedTransition`) at the
    guide's ``z_{t-1}`` (at the model's ``z_0`` for ``t = 1``), over the real steps for given
    noise, as one autograd node with a hand-written backward pass: per step the products that
    carry the gradient back to ``z_{t-1}`` (the output layers of the combiner and of the
    transition's two branches, then one product for every layer that reads ``z_{t-1}``); each
    weight gradient one product over all steps.

    :param z0: ``(B, Z)`` the guide's start ``z_q_0``; ``zp0`` ``(B, Z)`` the model's ``z_0``.
    :param a: ``(B, T, H)`` the recognition states; ``eps`` ``(B, T, Z)`` standard normals.
    :param combiner: the :class:`~pyro_seq.nn.Combiner`; ``transition`` the
        :class:`~pyro_seq.nn.GatedTransition` (their weights are read, not called).
    :param lengths: as :func:`combiner_scan`.
    :returns: ``(loc, scale, z)``, each ``(B, T, Z)``, with the padding of :func:`combiner_scan`.
    """
    B, T, Z = eps.shape
    if z0.shape != (B, Z) or zp0.shape != (B, Z) or a.shape[:2] != (B, T):
        raise ValueError(
            f"residual_combiner_scan: inconsistent shapes z0 {tuple(z0.shape)}, zp0 "
            f"{tuple(zp0.shape)}, a {tuple(a.shape)}, eps {tuple(eps.shape)}"
        )
    lengths = check_lengths(lengths, B, T, "residual_combiner_scan", eps.device)
    c, tr = combiner, transition
    w_h, b_h = c.stacked_heads()
    w_all = torch.cat(
        [c.z_to_hidden.weight, tr.gate_hidden.weight, tr.proposal_hidden.weight, tr.linear.weight]
    )
    b_all = torch.cat(
        [c.z_to_hidden.bias, tr.gate_hidden.bias, tr.proposal_hidden.bias, tr.linear.bias]
    )
    sizes = (
        c.z_to_hidden.out_features,
        tr.gate_hidden.out_features,
        tr.proposal_hidden.out_features,
    )
    return _ResidualCombinerScan.apply(
        z0,
        zp0,
        a,
        eps.detach(),
        w_h,
        b_h,
        w_all,
        b_all,
        tr.gate.weight,
        tr.gate.bias,
        tr.proposal.weight,
        tr.proposal.bias,
        sizes,
        float(c.min_scale),
        lengths,
    )
