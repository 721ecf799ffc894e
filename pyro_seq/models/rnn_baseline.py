"""A deterministic RNN with an exact likelihood: the "plain" RNN baseline (Bayer & Osendorfer
2014, Table 1).

Generative model (thesis eq. 4.1-4.2 with ``u_t = x_{t-1}``, ``x_0 = 0``)::

    d_t = f(d_{t-1}, x_{t-1})                    d_0 = 0   (GRU by default)
    x_t ~ p(x_t | d_t)                            Bernoulli(logits = NN^(x)(d_t)) or Gaussian

so that ``log p(x_{1:T}) = sum_t log p(x_t | d_t)`` exactly: the states are deterministic
functions of the past observations and there is nothing to integrate out. In Table 1 of
Bayer & Osendorfer's "Variational inference of latent state sequences using Recurrent Networks"
this is the "plain" RNN (7.58 / 3.43 / 8.58 nats per step on Piano-midi.de / Nottingham /
JSB Chorales, from Boulanger-Lewandowski et al. 2012): a floor that a latent-variable model
must beat to show its latent layer is used.

As a Pyro program the model has only observation sites ``x_1..x_T`` and the guide has no sample
site at all (its ``init`` and ``step`` do nothing), so every objective of the package is the
exact log-likelihood: ``Trace_ELBO``, ``TraceMeanField_ELBO``, ``IWAE(K)`` (either gradient
estimator) and ``FIVO(K)`` all give ``-sum_b log p(x^(b))`` (tested against a hand-written GRU
in float64). :meth:`RNNBaseline.log_likelihood` returns the per-sequence value directly.

Defaults: the deterministic layer and the emission MLP of :class:`~pyro_seq.models.srnn.SRNN`'s
polyphonic-music setting (GRU 300, one hidden layer of 500 units, leaky ReLU 1/3 clipped at
+-3), so that SRNN minus its stochastic layer is this model; the source table gives no sizes.
"""

from typing import Any, Optional, Tuple

import torch

from pyro_seq.models.base import SequenceModel, Step, shift_right
from pyro_seq.models.contract import example
from pyro_seq.models.emission import check_emission_options, make_emission, stack_params
from pyro_seq.nn import ForwardRNN
from pyro_seq.nn.recurrent import RNN_CELLS
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import (
    module_device,
    positive_int,
    validate_generate_args,
    validate_sequences,
)


class RNNBaseline(SequenceModel):
    """Deterministic RNN ``d_t = f(d_{t-1}, x_{t-1})`` with emission ``p(x_t | d_t)``.

    :param int obs_dim: observation size ``D``.
    :param int d_dim: RNN state size.
    :param int hidden_dim: hidden units of the emission MLP.
    :param str cell: ``"gru"`` (default), ``"lstm"`` or ``"rnn"`` (ReLU).
    :param str likelihood: ``"bernoulli"`` or ``"gaussian"`` (or any family
        :func:`~pyro_seq.models.emission.make_emission` knows).
    :param str activation: hidden activation of the emission MLP.
    :param emission_kwargs: passed on to ``make_emission`` (e.g. ``num_components``).

    ``m.model`` observes ``x_{t+1}`` at every step; ``m.guide`` samples nothing.
    """

    time_parallel = True
    latent_names = ()
    module_name = "rnn_baseline"
    small_example = example(d_dim=4, hidden_dim=4)

    def __init__(
        self,
        obs_dim: int,
        d_dim: int = 300,
        hidden_dim: int = 500,
        cell: str = "gru",
        likelihood: str = "bernoulli",
        activation: str = "clipped_leaky_relu",
        **emission_kwargs: Any,
    ) -> None:
        super().__init__(obs_dim)
        for name, value in (("d_dim", d_dim), ("hidden_dim", hidden_dim)):
            positive_int(name, value)
        if cell not in RNN_CELLS:
            raise ValueError(f"cell must be one of {sorted(RNN_CELLS)}, got {cell!r}")
        self.binary_observations = likelihood == "bernoulli"
        self.d_dim = int(d_dim)
        self.deterministic = ForwardRNN(obs_dim, self.d_dim, cell=cell)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=False)
        self.emitter, self.likelihood = make_emission(
            likelihood, self.d_dim, [int(hidden_dim)], obs_dim, activation, **emission_kwargs
        )

    def _deterministic_states(self, x, mask):
        """``d_{1:T}``: ``(batch, T, d_dim)`` (zero after each sequence's end)."""
        return self.deterministic(shift_right(x), mask.sum(-1))

    # generative model: d_t = f(d_{t-1}, x_{t-1}), x_t ~ p(x_t | d_t)
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        state.shared["d"] = self._deterministic_states(x, mask)

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        self.observe(state, t, x, mask, state.shared_at("d", t))

    # no latent variable: the guide is the empty program
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        pass

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        pass

    def log_likelihood(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Exact ``log p(x^(b)_{1:T_b}) = sum_{t <= T_b} log p(x_t | d_t)`` per sequence.

        :param torch.Tensor x: ``(batch, T, D)``.
        :param mask: ``(batch, T)`` prefix mask or None.
        :returns: tensor ``(batch,)`` (differentiable).
        """
        x, mask = validate_sequences(
            x, mask, self.obs_dim, self.binary_observations, device=module_device(self)
        )
        d = self._deterministic_states(x, mask)
        log_p = self.likelihood(self.emitter(d)).log_prob(x)  # (batch, T)
        return torch.where(mask, log_p, log_p.new_zeros(())).sum(-1)

    @torch.no_grad()
    def generate(self, num_sequences: int, num_steps: int) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples: ``d_t = f(d_{t-1}, x_{t-1})``, ``x_t ~ p(x_t | d_t)``.

        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters per step.
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        rnn = self.deterministic
        h = rnn.h0.expand(1, num_sequences, -1).contiguous()
        if rnn.cell == "lstm":
            h = (h, torch.zeros_like(h))
        x_prev = rnn.h0.new_zeros(num_sequences, 1, self.obs_dim)
        xs, params = [], []
        for _ in range(num_steps):
            d, h = rnn.rnn(x_prev, h)
            p = self.emitter(d[:, 0])
            x = self.likelihood(p).sample()
            xs.append(x)
            params.append(p)
            x_prev = x.unsqueeze(1)
        return torch.stack(xs, 1), stack_params(params)
