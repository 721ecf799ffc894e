"""A GRU over ragged batches that computes only the real steps, with a hand-written backward.

``torch.nn.GRU``'s update (Cho et al. 2014, in PyTorch's convention; the SRNN's deterministic
layer and its backward inference GRU, Fraccaro 2018, eq. 5.1 and 5.7):

    r_t = sigmoid(W_ir u_t + b_ir + W_hr h_{t-1} + b_hr)
    z_t = sigmoid(W_iz u_t + b_iz + W_hz h_{t-1} + b_hz)
    n_t = tanh(W_in u_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}

As :func:`~pyro_seq.nn.relu_scan.ragged_relu_rnn` does for the ReLU RNN:

* only real steps are computed: the rows are sorted by length, so the sequences still running
  at step t are a prefix and each step multiplies only those rows (a random JSB minibatch of 20
  is about 45 % padding);
* the input projection of every real step is one product before the loop;
* the backward pass is one autograd node: per step one ``(n_t, 3H) x (3H, H)`` product for the
  recurrent gradient and a few elementwise operations, against about fifteen autograd nodes per
  step for ``torch.nn.GRU``; the weight gradients ``sum_t dgates_t^T h_{t-1}`` and
  ``sum_t dgates_t^T u_t`` are one large product each over all real steps.

Values and gradients equal ``torch.nn.GRU``'s on the real steps (tests/nn/test_gru_scan.py,
float64); states at padded steps are 0.
"""

import torch

import pyro_seq.nn.gemm as gemm
from pyro_seq.nn.ragged import (
    check_lengths,
    pack_ragged,
    previous_rows,
    step_offsets,
    to_padded,
    unsort_rows,
)

__all__ = ["ragged_gru"]


class _RaggedGRU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, w_ih, w_hh, b_ih, b_hh, lengths):
        B, T, _ = x.shape
        H = w_hh.shape[1]
        order, counts, index = pack_ragged(lengths, T)
        xp = x.reshape(B * T, -1).index_select(0, index)  # (N, I) packed, step-major
        gi = gemm.linear(xp, w_ih, b_ih)  # (N, 3H): input projections of every step
        N = gi.shape[0]
        gates = torch.empty(N, 3 * H, dtype=gi.dtype, device=gi.device)  # r, z, n
        ghn = torch.empty(N, H, dtype=gi.dtype, device=gi.device)  # W_hn h + b_hn
        out = torch.empty(N, H, dtype=gi.dtype, device=gi.device)
        h = h0.index_select(0, order)  # sorted by decreasing length
        start = 0
        for n in counts:
            sl = slice(start, start + n)
            gh = gemm.linear(h[:n], w_hh, b_hh)  # (n, 3H)
            g = gates[sl]
            torch.add(gi[sl, : 2 * H], gh[:, : 2 * H], out=g[:, : 2 * H]).sigmoid_()
            r, z = g[:, :H], g[:, H : 2 * H]
            ghn[sl] = gh[:, 2 * H :]
            nt = torch.addcmul(gi[sl, 2 * H :], r, ghn[sl], out=g[:, 2 * H :]).tanh_()
            h = torch.addcmul(nt, z, h[:n] - nt, out=out[sl])  # n + z (h_{t-1} - n)
            start += n
        ctx.save_for_backward(xp, h0, w_ih, w_hh, gates, ghn, out, order, index)
        ctx.counts, ctx.shape = counts, (B, T)
        return to_padded(out, index, B, T)

    @staticmethod
    def backward(ctx, grad_out):
        xp, h0, w_ih, w_hh, gates, ghn, out, order, index = ctx.saved_tensors
        counts, (B, T) = ctx.counts, ctx.shape
        H = out.shape[1]
        g_out = grad_out.reshape(B * T, H).index_select(0, index)  # packed output gradients
        h0s = h0.index_select(0, order)
        hprev = previous_rows(h0s, out, counts)  # h_{t-1} of every packed row
        # d(W_h h + b_h) per gate: its r and z parts are also those of d(W_i u + b_i)
        dgh = torch.empty_like(gates)
        dgin = torch.empty_like(ghn)  # d(W_in u + b_in)
        zc = 1.0 - gates[:, H : 2 * H]  # 1 - z, all steps at once
        offsets = step_offsets(counts)
        w_hh_t = w_hh.t().contiguous()  # dh_{t-1} = d(W_h h + b_h) W_hh, a product with it
        dh = None
        for t in range(len(counts) - 1, -1, -1):
            lo, n = offsets[t], counts[t]
            sl = slice(lo, lo + n)
            d = g_out[sl]
            if dh is not None:
                d[: dh.shape[0]] += dh
            g = gates[sl]
            r, z, nt = g[:, :H], g[:, H : 2 * H], g[:, 2 * H :]
            e = dgh[sl]
            # dn_pre = d (1 - z) (1 - n^2); dz_pre = d (h_{t-1} - n) z (1 - z)
            dn = torch.mul(d, zc[sl], out=dgin[sl])
            dn.mul_(1.0 - nt * nt)
            torch.mul(dn, r, out=e[:, 2 * H :])
            torch.mul(dn, ghn[sl], out=e[:, :H]).mul_(r - r * r)
            torch.sub(hprev[sl], nt, out=e[:, H : 2 * H]).mul_(d).mul_(z * zc[sl])
            # dh_{t-1} = d z + d(W_h h + b_h) W_hh
            dh = gemm.addmm(d * z, e, w_hh_t)
        d_w_hh = gemm.matmul(dgh.t(), hprev)
        d_b_hh = dgh.sum(0)
        d_w_ih = torch.cat([gemm.matmul(dgh[:, : 2 * H].t(), xp), gemm.matmul(dgin.t(), xp)], 0)
        d_b_ih = torch.cat([d_b_hh[: 2 * H], dgin.sum(0)])
        d_x = None
        if ctx.needs_input_grad[0]:
            dgi_x = gemm.matmul(dgin, w_ih[2 * H :]) + gemm.matmul(dgh[:, : 2 * H], w_ih[: 2 * H])
            d_x = to_padded(dgi_x, index, B, T)
        d_h0 = None
        if ctx.needs_input_grad[1]:
            d_h0 = unsort_rows(dh, order)  # dh of step 0 covers the whole (sorted) batch
        return d_x, d_h0, d_w_ih, d_w_hh, d_b_ih, d_b_hh, None


def ragged_gru(x, lengths, h0, weight_ih, weight_hh, bias_ih, bias_hh):
    """Run ``torch.nn.GRU``'s update (module docstring) over the real steps of each sequence.

    :param torch.Tensor x: ``(batch, T, input_dim)``, sequence b real for ``t < lengths[b]``.
    :param torch.LongTensor lengths: ``(batch,)``, each in ``[1, T]``.
    :param torch.Tensor h0: ``(batch, hidden)`` initial states.
    :param weight_ih: ``(3 hidden, input_dim)``; ``weight_hh`` ``(3 hidden, hidden)``;
        ``bias_ih``, ``bias_hh`` ``(3 hidden,)``: ``torch.nn.GRU``'s ``*_l0`` parameters, gates
        in its order (r, z, n).
    :returns: ``(batch, T, hidden)``, zero at padded steps.
    """
    H = weight_hh.shape[1]
    if x.dim() != 3 or h0.shape != (x.shape[0], H) or weight_hh.shape != (3 * H, H):
        raise ValueError(
            f"ragged_gru: expected x (B, T, I), h0 (B, H) and weight_hh (3H, H); got "
            f"{tuple(x.shape)}, {tuple(h0.shape)}, {tuple(weight_hh.shape)}"
        )
    check_lengths(lengths, x.shape[0], x.shape[1], "ragged_gru")
    return _RaggedGRU.apply(x, h0, weight_ih, weight_hh, bias_ih, bias_hh, lengths)
