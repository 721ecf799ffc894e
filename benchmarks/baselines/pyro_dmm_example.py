"""Timing baseline: the structure of Pyro's ``examples/dmm.py`` (Krishnan et al. 2017).

Written for this benchmark from the published description of Pyro's example (not a copy of its
code): the same networks and sizes (emitter 100-100-88 with sigmoid output, gated transition
200, combiner, ReLU RNN 600 run over reversed packed sequences, learned z_0 / z_q_0 / h_0), one
``pyro.sample`` site per latent and per observation per step inside ``pyro.markov``, KL
annealing via ``poutine.scale``, ``Bernoulli(probs)`` emissions and ``Trace_ELBO``. It is the
yardstick for ``benchmarks/dmm_speed.py``; it is not part of the package.
"""

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from pyro_seq.nn import reverse_padded


class Emitter(nn.Module):
    def __init__(self, input_dim, z_dim, emission_dim):
        super().__init__()
        self.lin_z_to_hidden = nn.Linear(z_dim, emission_dim)
        self.lin_hidden_to_hidden = nn.Linear(emission_dim, emission_dim)
        self.lin_hidden_to_input = nn.Linear(emission_dim, input_dim)

    def forward(self, z_t):
        h1 = torch.relu(self.lin_z_to_hidden(z_t))
        h2 = torch.relu(self.lin_hidden_to_hidden(h1))
        return torch.sigmoid(self.lin_hidden_to_input(h2))


class GatedTransition(nn.Module):
    def __init__(self, z_dim, transition_dim):
        super().__init__()
        self.lin_gate_z_to_hidden = nn.Linear(z_dim, transition_dim)
        self.lin_gate_hidden_to_z = nn.Linear(transition_dim, z_dim)
        self.lin_proposed_mean_z_to_hidden = nn.Linear(z_dim, transition_dim)
        self.lin_proposed_mean_hidden_to_z = nn.Linear(transition_dim, z_dim)
        self.lin_sig = nn.Linear(z_dim, z_dim)
        self.lin_z_to_loc = nn.Linear(z_dim, z_dim)
        nn.init.eye_(self.lin_z_to_loc.weight)
        nn.init.zeros_(self.lin_z_to_loc.bias)

    def forward(self, z_prev):
        gate = torch.sigmoid(self.lin_gate_hidden_to_z(torch.relu(self.lin_gate_z_to_hidden(z_prev))))
        proposed = self.lin_proposed_mean_hidden_to_z(torch.relu(self.lin_proposed_mean_z_to_hidden(z_prev)))
        loc = (1 - gate) * self.lin_z_to_loc(z_prev) + gate * proposed
        scale = nn.functional.softplus(self.lin_sig(torch.relu(proposed)))
        return loc, scale


class Combiner(nn.Module):
    def __init__(self, z_dim, rnn_dim):
        super().__init__()
        self.lin_z_to_hidden = nn.Linear(z_dim, rnn_dim)
        self.lin_hidden_to_loc = nn.Linear(rnn_dim, z_dim)
        self.lin_hidden_to_scale = nn.Linear(rnn_dim, z_dim)

    def forward(self, z_prev, h_rnn):
        h = 0.5 * (torch.tanh(self.lin_z_to_hidden(z_prev)) + h_rnn)
        return self.lin_hidden_to_loc(h), nn.functional.softplus(self.lin_hidden_to_scale(h))


class PyroExampleDMM(nn.Module):
    def __init__(self, input_dim=88, z_dim=100, emission_dim=100, transition_dim=200, rnn_dim=600):
        super().__init__()
        self.emitter = Emitter(input_dim, z_dim, emission_dim)
        self.trans = GatedTransition(z_dim, transition_dim)
        self.combiner = Combiner(z_dim, rnn_dim)
        self.rnn = nn.RNN(input_dim, rnn_dim, nonlinearity="relu", batch_first=True)
        self.z_0 = nn.Parameter(torch.zeros(z_dim))
        self.z_q_0 = nn.Parameter(torch.zeros(z_dim))
        self.h_0 = nn.Parameter(torch.zeros(1, 1, rnn_dim))

    def model(self, x, reversed_x, mask, lengths, annealing_factor=1.0):
        T_max = x.size(1)
        pyro.module("dmm_baseline", self)
        z_prev = self.z_0.expand(x.size(0), self.z_0.size(0))
        with pyro.plate("z_minibatch", len(x)):
            for t in pyro.markov(range(1, T_max + 1)):
                z_loc, z_scale = self.trans(z_prev)
                with poutine.scale(None, annealing_factor):
                    z_t = pyro.sample(f"z_{t}", dist.Normal(z_loc, z_scale)
                                      .mask(mask[:, t - 1:t]).to_event(1))
                probs = self.emitter(z_t)
                pyro.sample(f"obs_x_{t}", dist.Bernoulli(probs).mask(mask[:, t - 1:t]).to_event(1),
                            obs=x[:, t - 1, :])
                z_prev = z_t

    def guide(self, x, reversed_x, mask, lengths, annealing_factor=1.0):
        T_max = x.size(1)
        pyro.module("dmm_baseline", self)
        h_0 = self.h_0.expand(1, x.size(0), self.rnn.hidden_size).contiguous()
        packed = pack_padded_sequence(reversed_x, lengths, batch_first=True, enforce_sorted=False)
        rnn_output, _ = self.rnn(packed, h_0)
        rnn_output, _ = pad_packed_sequence(rnn_output, batch_first=True, total_length=T_max)
        rnn_output = reverse_padded(rnn_output, lengths)
        z_prev = self.z_q_0.expand(x.size(0), self.z_q_0.size(0))
        with pyro.plate("z_minibatch", len(x)):
            for t in pyro.markov(range(1, T_max + 1)):
                z_loc, z_scale = self.combiner(z_prev, rnn_output[:, t - 1, :])
                with poutine.scale(None, annealing_factor):
                    z_t = pyro.sample(f"z_{t}", dist.Normal(z_loc, z_scale)
                                      .mask(mask[:, t - 1:t]).to_event(1))
                z_prev = z_t
