"""Shared linear-Gaussian test bed for the objective tests (exact log p(x) is known)."""

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn

from pyro_seq.models.linear_gaussian import LinearGaussianSequenceModel


def make_model(guide="prior", learnable=False, seed=0, obs_dim=2, state_dim=2):
    """A fixed, stable (spectral radius <= 0.9) LGSSM with non-trivial A and C (seeded)."""
    g = torch.Generator().manual_seed(seed)
    A = 0.7 * torch.eye(state_dim) + 0.2 * torch.randn(state_dim, state_dim, generator=g)
    A = A * min(1.0, 0.9 / torch.linalg.eigvals(A).abs().max().item())  # stable: radius <= 0.9
    C = torch.randn(obs_dim, state_dim, generator=g)
    return LinearGaussianSequenceModel(
        obs_dim,
        state_dim,
        A=A,
        C=C,
        Q=0.3 * torch.eye(state_dim),
        R=0.4 * torch.eye(obs_dim),
        learnable=learnable,
        guide=guide,
    )


def make_data(m, lengths, seed=1):
    """Sequences drawn from the model itself, padded with garbage after their length."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(-1)
    with torch.no_grad():
        z = m.init_loc + torch.randn(B, m.state_dim, generator=g) @ m.init_tril.T
        xs = []
        for t in range(T):
            if t > 0:
                z = z @ m.A.T + torch.randn(B, m.state_dim, generator=g) @ m.Q_tril.T
            xs.append(z @ m.C.T + torch.randn(B, m.obs_dim, generator=g) @ m.R_tril.T)
        x = torch.stack(xs, 1)
    x = torch.where(mask.unsqueeze(-1), x, torch.full_like(x, 1e3))  # padding must not matter
    return x, mask


class PerturbedGuideLG(LinearGaussianSequenceModel):
    """LGSSM whose guide is the locally optimal proposal shifted and scaled by learnable
    guide-only parameters (``guide_shift``, ``guide_log_scale``): a structured guide with
    parameters of its own, q(z_t | z_{t-1}, x_t) depending on z_{t-1}."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("guide", "optimal")
        super().__init__(*args, **kwargs)
        self.guide_shift = nn.Parameter(0.3 * torch.ones(self.state_dim))
        self.guide_log_scale = nn.Parameter(torch.tensor(0.4))

    def guide_step(self, state, t, x, mask):
        m_t = mask[:, t]
        K, tril_post = state.shared["optimal"][min(t, 1)]
        prior_loc = self._prior_loc(state, t, "guide_z")
        loc = prior_loc + (K @ (x[:, t] - prior_loc @ self.C.T).unsqueeze(-1)).squeeze(-1)
        loc = loc + self.guide_shift
        loc = loc.expand(torch.broadcast_shapes(loc.shape, (x.shape[0], self.state_dim)))
        tril = tril_post * self.guide_log_scale.exp()
        z = pyro.sample(f"z_{t + 1}", dist.MultivariateNormal(loc, scale_tril=tril).mask(m_t))
        state["guide_z"] = z


def make_perturbed(seed=0, obs_dim=2, state_dim=2, learnable=True):
    base = make_model(seed=seed, obs_dim=obs_dim, state_dim=state_dim)
    return PerturbedGuideLG(
        obs_dim, state_dim, A=base.A, C=base.C, Q=base.Q, R=base.R, learnable=learnable
    )


def grads(m):
    """Flat vector of the gradients of ``m``'s parameters (zeros where None), then zero them."""
    out = []
    for p in m.parameters():
        out.append(
            torch.zeros_like(p).reshape(-1) if p.grad is None else p.grad.reshape(-1).clone()
        )
        p.grad = None
    return torch.cat(out)


def guide_param_slice(m):
    """Index range of ``guide_shift`` and ``guide_log_scale`` in :func:`grads`'s vector."""
    start, idx = 0, []
    for name, p in m.named_parameters():
        if name.startswith("guide_"):
            idx.extend(range(start, start + p.numel()))
        start += p.numel()
    return torch.tensor(idx)
