"""Reference densities and recurrent cells written out from their equations (float64 tests).

Independent of the package's modules: every model's hand-written reference ELBO in
``tests/models`` is built from these pieces and the raw weights of a model's layers.
"""

import math

import torch


def lin(layer, x):
    return x @ layer.weight.T + layer.bias


def normal_logpdf(z, loc, scale):
    return (-0.5 * ((z - loc) / scale) ** 2 - torch.log(scale) - 0.5 * math.log(2 * math.pi)).sum(
        -1
    )


def normal_logpdf_logvar(z, mu, log_v):
    """log N(z; mu, diag(v)) written with the log-variance of eq. 5.3 / 5.10."""
    return (
        -0.5 * (z - mu) ** 2 / torch.exp(log_v) - 0.5 * log_v - 0.5 * math.log(2 * math.pi)
    ).sum(-1)


def bernoulli_logpmf(x, logits):
    p = 1 / (1 + torch.exp(-logits))
    return (x * torch.log(p) + (1 - x) * torch.log1p(-p)).sum(-1)


def softplus(x):
    return torch.log1p(torch.exp(x))


def act(x):  # leaky ReLU 1/3 clipped at +-3 (SRNN supplementary)
    return torch.clamp(torch.where(x > 0, x, x / 3), -3, 3)


def gru_cell(rnn, x, h):
    """One step of torch's GRU written out (Cho et al. 2014), gates ordered r, z, n."""
    wi, wh, bi, bh = rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0
    gi, gh = x @ wi.T + bi, h @ wh.T + bh
    H = h.shape[-1]
    r = torch.sigmoid(gi[..., :H] + gh[..., :H])
    u = torch.sigmoid(gi[..., H : 2 * H] + gh[..., H : 2 * H])
    n = torch.tanh(gi[..., 2 * H :] + r * gh[..., 2 * H :])
    return (1 - u) * n + u * h


def relu_rnn_cell(rnn, x, h):
    return torch.relu(
        x @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
    )


def randomize(module, scale=0.5):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen))


def ragged_batch(likelihood="bernoulli", B=4, T=6, D=5, lengths=(6, 2, 4, 1), seed=0):
    """A prefix-masked batch ``(B, T, D)`` with zero padding: binary entries with
    ``P(1) = 0.4`` (``"bernoulli"``) or standard normal ones (otherwise; no zero entries),
    drawn from ``seed``, and its mask ``(B, T)``."""
    g = torch.Generator().manual_seed(seed)
    if likelihood == "bernoulli":
        x = (torch.rand(B, T, D, generator=g) < 0.4).double()
    else:
        x = torch.randn(B, T, D, generator=g)
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    return x * mask.unsqueeze(-1), mask


def count_forward_calls(monkeypatch, module):
    """A list that grows by one at every call of ``module`` (its ``forward`` wrapped)."""
    calls = []
    original = module.forward
    monkeypatch.setattr(module, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls
