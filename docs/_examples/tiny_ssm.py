"""A new architecture from the primitives: the example of docs/design.rst (tested by
tests/docs/test_design_example.py)."""

import pyro
import torch.nn as nn

from pyro_seq.models import SequenceModel, make_emission, normal
from pyro_seq.nn import MLP, ForwardRNN, GaussianHead, cat_broadcast


class TinySSM(SequenceModel):
    """A deep state-space model with a filtering guide.

    Model: ``z_t ~ N(f(z_{t-1}))`` with ``z_0 = 0``, ``x_t ~ p(x_t | z_t)``.
    Guide: ``q(z_t | z_{t-1}, a_t)`` with ``a_t = RNN(a_{t-1}, x_t)`` (it sees ``x_{1:t}``).
    """

    module_name = "tiny_ssm"            # prefix of the parameters in Pyro's param store

    def __init__(self, obs_dim, z_dim=8, hidden_dim=32, likelihood="bernoulli"):
        super().__init__(obs_dim)
        self.binary_observations = likelihood == "bernoulli"   # inputs checked to be 0/1
        self.z_dim = z_dim
        self.transition = nn.Sequential(                        # z_{t-1} -> (loc, scale)
            MLP(z_dim, [hidden_dim], hidden_dim, activate_output=True),
            GaussianHead(hidden_dim, z_dim))
        # self.emitter (features -> parameters) and self.likelihood (parameters ->
        # distribution) are the two attributes SequenceModel.observe uses
        self.emitter, self.likelihood = make_emission(likelihood, z_dim, [hidden_dim], obs_dim)
        self.encoder = ForwardRNN(obs_dim, hidden_dim)          # a_{1:T} from x_{1:T}
        self.posterior = nn.Sequential(                         # [z_{t-1}, a_t] -> (loc, scale)
            MLP(z_dim + hidden_dim, [hidden_dim], hidden_dim, activate_output=True),
            GaussianHead(hidden_dim, z_dim))

    # generative model p(x, z)
    def model_init(self, state, x, mask):
        state["z"] = x.new_zeros(x.shape[0], self.z_dim)       # z_0, a per-particle tensor

    def model_step(self, state, t, x, mask):
        loc, scale = self.transition(state["z"])               # p(z_t | z_{t-1})
        z = self.sample_latent(state, "z", t, normal, (loc, scale), mask)   # site z_{t+1}
        self.observe(state, t, x, mask, z)                     # site x_{t+1}, from features z_t
        state["z"] = z

    # inference network q(z | x)
    def guide_init(self, state, x, mask):
        state.shared["a"] = self.encoder(x, mask.sum(-1))     # (batch, T, hidden): shared
        state["guide_z"] = x.new_zeros(x.shape[0], self.z_dim)

    def guide_step(self, state, t, x, mask):
        features = cat_broadcast([state["guide_z"], state.shared_at("a", t)])
        loc, scale = self.posterior(features)
        z = pyro.sample(f"z_{t + 1}", normal(loc, scale).mask(mask[:, t]))
        state["guide_z"] = z
