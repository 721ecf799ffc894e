"""SRNN (smoothing + Res_q, Bernoulli emission) in plain PyTorch: the floor of ``srnn_speed.py``.

The same function as ``pyro_seq.models.SRNN`` with its defaults (thesis Ch. 5, Fraccaro et al.
2016), written without Pyro as one would write it by hand for speed, so that the package's
overhead (Pyro's traces and sites, the model/guide split) can be measured against it::

    d_t = GRU(d_{t-1}, x_{t-1})                            d_0 = 0, x_0 = 0        (eq. 5.1)
    a_t = GRU_back(a_{t+1}, [d_t, x_t])                    a_{T_b+1} = 0           (eq. 5.7)
    [mu^p_t, s^p_t] = NN^p(z_{t-1}, d_t)                                           (eq. 5.3)
    [r_t, s^q_t]    = NN^q(z_{t-1}, a_t),  mu^q_t = mu^p_t + r_t       (Res_q, eq. 5.12)
    z_t = mu^q_t + s^q_t * eps_t,  eps_t ~ N(0, I)                     (reparameterised)
    x_t ~ Bernoulli(logits = NN^x([z_t, d_t]))                                     (eq. 5.1)

Every ``NN`` is ``Linear -> clipped leaky ReLU (1/3, +-3) -> Linear`` with one hidden layer;
the Gaussian ones have two output layers, ``mu`` and ``s = min_scale + softplus(.)``. The
single-sample ELBO is the one :class:`pyro.infer.Trace_ELBO` computes from the package's sites,
the sum over real steps (``mask``) of

    log p(x_t | z_t, d_t) + log p(z_t | z_{t-1}, d_t) - log q(z_t | z_{t-1}, a_t)

with both Gaussian log-densities evaluated at the sample ``z_t`` (no analytic KL).

What makes it fast, all of which a careful hand-written version does: ``d`` is computed once
(the package's model and guide each run the GRU unless they share it); the first layers of the
per-step MLPs are split into a context part computed for all steps at once and a ``z`` part
computed per step; the prior of each step is computed once, inside the sampling loop, and
serves both Res_q and ``log p(z)``; emission and log-densities are batched over time.

Parameters are plain ``torch.nn`` modules, with the same count as the package's SRNN;
:func:`copy_from_package` copies a package model's weights in (tests check that both give the
same ELBO and gradients for the same noise).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def clipped_leaky_relu(h):
    """The hidden activation of every MLP: leaky ReLU (slope 1/3) clipped at +-3."""
    return torch.clamp(F.leaky_relu(h, 1.0 / 3.0), -3.0, 3.0)


def shift_right(x):
    """``u_t = x_{t-1}``, ``u_1 = 0``: ``(B, T, D) -> (B, T, D)``."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


def reverse_padded(x, lengths):
    """Reverse each sequence of ``x (B, T, F)`` within its length ``lengths (B,)``."""
    T = x.shape[1]
    t = torch.arange(T, device=x.device)
    idx = torch.where(t < lengths.unsqueeze(-1), lengths.unsqueeze(-1) - 1 - t, t)
    return torch.gather(x, 1, idx.unsqueeze(-1).expand(x.shape))


def normal_log_prob(value, loc, scale):
    """``log N(value; loc, scale^2)`` summed over the last dim: ``(..., z) -> (...)``."""
    return (-0.5 * ((value - loc) / scale) ** 2 - torch.log(scale) - _LOG_SQRT_2PI).sum(-1)


class GaussianMLP(nn.Module):
    """``[z, c] -> Linear -> act -> (mu, min_scale + softplus(Linear))``, split first layer."""

    def __init__(self, z_dim, context_dim, hidden_dim, min_scale):
        super().__init__()
        self.z_dim, self.min_scale = z_dim, min_scale
        self.first = nn.Linear(z_dim + context_dim, hidden_dim)
        self.loc = nn.Linear(hidden_dim, z_dim)
        self.raw_scale = nn.Linear(hidden_dim, z_dim)

    def split(self, context):
        """``(W_z, W_c c + b)``: the per-step weight and the context term ``(B, T, hidden)``."""
        w = self.first.weight
        return w[:, : self.z_dim], F.linear(context, w[:, self.z_dim :], self.first.bias)

    def step(self, z, w_z, projected):
        """``(mu, s)`` from ``z (B, z_dim)`` and one step of the projected context."""
        h = clipped_leaky_relu(F.linear(z, w_z) + projected)
        return self.loc(h), self.min_scale + F.softplus(self.raw_scale(h))


class PlainSRNN(nn.Module):
    """The package's default SRNN for binary data, in plain PyTorch.

    :param int obs_dim: ``D``; ``d_dim``, ``z_dim``, ``hidden_dim``, ``min_scale`` as in
        ``pyro_seq.models.SRNN`` (defaults: 300, 100, 500, 1e-3).

    Shapes: :meth:`elbo` takes ``x (B, T, D)`` (0/1, zero at padded steps) and a bool prefix
    mask ``(B, T)``.
    """

    def __init__(self, obs_dim, d_dim=300, z_dim=100, hidden_dim=500, min_scale=1e-3):
        super().__init__()
        self.obs_dim, self.z_dim = obs_dim, z_dim
        self.forward_gru = nn.GRU(obs_dim, d_dim, batch_first=True)
        self.backward_gru = nn.GRU(d_dim + obs_dim, d_dim, batch_first=True)
        self.prior = GaussianMLP(z_dim, d_dim, hidden_dim, min_scale)
        self.posterior = GaussianMLP(z_dim, d_dim, hidden_dim, min_scale)
        self.emit_hidden = nn.Linear(z_dim + d_dim, hidden_dim)
        self.emit_logits = nn.Linear(hidden_dim, obs_dim)

    def elbo(self, x, mask, noise=None):
        """Single-sample ELBO of the batch, summed over sequences and real steps (a scalar).

        :param noise: ``eps`` ``(B, T, z_dim)``, or None to draw it with ``torch.randn``
            (one ``(B, z_dim)`` draw per step, in step order).
        """
        B, T, _ = x.shape
        lengths = mask.sum(-1)
        step_mask = mask.unsqueeze(-1)
        d, _ = self.forward_gru(shift_right(x))  # eq. 5.1
        d = d * step_mask
        a, _ = self.backward_gru(reverse_padded(torch.cat([d, x], -1), lengths))  # eq. 5.7
        a = reverse_padded(a, lengths)
        wq, ctx_q = self.posterior.split(a)
        wp, ctx_p = self.prior.split(d)
        ctx_q, ctx_p = ctx_q.unbind(1), ctx_p.unbind(1)
        eps = noise.unbind(1) if noise is not None else None
        z = x.new_zeros(B, self.z_dim)
        zs, q_params, p_params = [], [], []
        for t in range(T):
            loc_p, scale_p = self.prior.step(z, wp, ctx_p[t])  # eq. 5.3
            res, scale_q = self.posterior.step(z, wq, ctx_q[t])
            loc_q = loc_p + res  # eq. 5.12
            e = eps[t] if eps is not None else torch.randn_like(loc_q)
            z = loc_q + scale_q * e
            zs.append(z)
            q_params.append((loc_q, scale_q))
            p_params.append((loc_p, scale_p))
        z = torch.stack(zs, 1)
        loc_q, scale_q = (torch.stack(p, 1) for p in zip(*q_params))
        loc_p, scale_p = (torch.stack(p, 1) for p in zip(*p_params))
        kl_terms = normal_log_prob(z, loc_p, scale_p) - normal_log_prob(z, loc_q, scale_q)
        logits = self.emit_logits(clipped_leaky_relu(self.emit_hidden(torch.cat([z, d], -1))))
        log_px = -F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)
        terms = torch.where(mask, log_px + kl_terms, torch.zeros((), dtype=x.dtype))
        return terms.sum()


#: parameter of :class:`PlainSRNN` -> parameter of ``pyro_seq.models.SRNN`` (default settings)
PACKAGE_NAMES = {
    "forward_gru.weight_ih_l0": "deterministic.rnn.weight_ih_l0",
    "forward_gru.weight_hh_l0": "deterministic.rnn.weight_hh_l0",
    "forward_gru.bias_ih_l0": "deterministic.rnn.bias_ih_l0",
    "forward_gru.bias_hh_l0": "deterministic.rnn.bias_hh_l0",
    "backward_gru.weight_ih_l0": "encoder.rnn.weight_ih_l0",
    "backward_gru.weight_hh_l0": "encoder.rnn.weight_hh_l0",
    "backward_gru.bias_ih_l0": "encoder.rnn.bias_ih_l0",
    "backward_gru.bias_hh_l0": "encoder.rnn.bias_hh_l0",
    "emit_hidden.weight": "emitter.0.weight",
    "emit_hidden.bias": "emitter.0.bias",
    "emit_logits.weight": "emitter.2.weight",
    "emit_logits.bias": "emitter.2.bias",
}
for _net in ("prior", "posterior"):
    PACKAGE_NAMES.update(
        {
            f"{_net}.first.weight": f"{_net}.first.weight",
            f"{_net}.first.bias": f"{_net}.first.bias",
            f"{_net}.loc.weight": f"{_net}.head.loc.weight",
            f"{_net}.loc.bias": f"{_net}.head.loc.bias",
            f"{_net}.raw_scale.weight": f"{_net}.head.raw_scale.weight",
            f"{_net}.raw_scale.bias": f"{_net}.head.raw_scale.bias",
        }
    )


def check_package_model(srnn):
    """Raise ValueError unless ``srnn`` is a package SRNN whose function :class:`PlainSRNN`
    reproduces: smoothing, Res_q, Bernoulli, clipped leaky ReLU, softplus scales, h0 = 0."""
    from pyro_seq.nn import ClippedLeakyReLU

    problems = []
    if srnn.inference != "smoothing" or not srnn.residual or not srnn.binary_observations:
        problems.append("needs inference='smoothing', residual=True, likelihood='bernoulli'")
    for net in (srnn.prior, srnn.posterior):
        if net.head.variance != "softplus" or not isinstance(net.activation, ClippedLeakyReLU):
            problems.append("needs variance='softplus' and activation='clipped_leaky_relu'")
    if problems:
        raise ValueError("; ".join(sorted(set(problems))))
    if (
        any(isinstance(p, nn.Parameter) for p in (srnn.deterministic.h0, srnn.encoder.h0))
        or bool(srnn.deterministic.h0.any())
        or bool(srnn.encoder.h0.any())
    ):
        raise ValueError("needs fixed zero initial GRU states")


def from_package(srnn):
    """A :class:`PlainSRNN` with the sizes, dtype, device and a copy of the weights of a
    package SRNN."""
    check_package_model(srnn)
    plain = PlainSRNN(
        srnn.obs_dim,
        srnn.deterministic.rnn.hidden_size,
        srnn.z_dim,
        srnn.prior.first.out_features,
        srnn.prior.head.min_scale,
    )
    ref = srnn.prior.first.weight
    plain.to(dtype=ref.dtype, device=ref.device)
    copy_from_package(plain, srnn)
    return plain


def copy_from_package(plain, srnn):
    """Copy the weights of ``srnn`` (``pyro_seq.models.SRNN``) into ``plain``, in place; both
    must have the same parameter count (asserted) and shapes."""
    ours = dict(plain.named_parameters())
    theirs = dict(srnn.named_parameters())
    assert sum(p.numel() for p in ours.values()) == sum(p.numel() for p in theirs.values()), (
        "the plain SRNN and the package's SRNN have different parameter counts"
    )
    assert set(PACKAGE_NAMES) == set(ours) and set(PACKAGE_NAMES.values()) == set(theirs)
    with torch.no_grad():
        for name, p in ours.items():
            p.copy_(theirs[PACKAGE_NAMES[name]])
    return plain
