r"""Stochastic recurrent network, STORN (Bayer & Osendorfer (2014), later versions).

Generative model (``x_0 = 0``, ``h_0 = 0``)::

    z_t ~ p(z_t | z_{t-1})                      prior="white":  N(0, I)       (independent)
                                                prior="wiener": N(z_{t-1}, I) (z_0 = 0, sec. 3.3)
    h_t = f(h_{t-1}, [x_{t-1}, z_t])            a recurrent cell, eq. (2)
    x_t ~ p(x_t | h_t) = Emitter(h_t)           Bernoulli or Gaussian (sec. 4: Bernoulli)

Recognition model: a forward RNN over the observations, ``a_t = f_q(a_{t-1}, x_t)``,
``a_0 = 0``, gives

.. math:: q(z_{1:T} | x_{1:T}) = \prod_{t=1}^T \mathcal{N}(z_t; \mu(a_t), \mathrm{diag}\,
    \sigma^2(a_t)), \qquad q(z_t | x_{1:T}) = q(z_t | x_{1:t}),

independent across steps given :math:`x` and filtering (online, as in sec. 3.2).

Bound (of the form of the last display of sec. 3.2): with :math:`h_t` a deterministic function
of :math:`(x_{1:t-1}, z_{1:t})`,

.. math:: -\log p(x_{1:T}) \le KL(q(z_{1:T}) \| p(z_{1:T}))
    - \mathbb{E}_{q}\Big[\sum_{t=1}^T \log p(x_t | h_t)\Big].

As a :class:`~pyro_seq.models.base.SequenceModel` the KL is not formed in closed form: step
``t`` has the latent site ``z_{t+1}`` with density :math:`p(z_t | z_{t-1})` and the guide site
with :math:`q(z_t|x_{1:t})`, so every Pyro ELBO (and IWAE, FIVO) estimates the bound from the
same sites; for the Wiener prior the product of the per-step factors is the whole-sequence
density of :class:`~pyro_seq.distributions.wiener.WienerProcess` (Jacobian of :math:`g_W` is
1), and :class:`~pyro.infer.TraceMeanField_ELBO` uses the per-step Gaussian KL given the sampled
:math:`z_{t-1}`.

**Relation to VOSP.** The variational one step predictor of sec. 3.2
(:class:`~pyro_seq.models.vosp.VOSP`) feeds ``[h_{t-1}, z_t]`` (``h`` the recognition RNN's
summary of :math:`x_{1:t-1}`) to an MLP and has no generating RNN; STORN makes ``z_t`` an
*input* of a generating RNN instead, so that its state depends on :math:`z_{1:t}`. Both
``h_t`` (through ``z_t``) and ``z_{t-1}`` (Wiener prior) are per-particle state: FIVO
resamples them.

**Defaults.** The paper selects sizes by random search (its supplementary does not give
them); the defaults here are those of the package's SRNN music setting (RNN 300, z 100, emission
MLP with one hidden layer of 500). The paper's RNN is the simple recurrent net of eq. (2),
trained with fast dropout; ``cell="tanh"`` (default) is eq. (2) with :math:`f_h = \tanh` (fast
dropout is not implemented), ``cell="gru"`` a GRU. The prior defaults to the Wiener process
(sec. 4: "For priors, we use a Wiener process").
"""

from typing import Any, Callable, Tuple

import pyro
import torch
import torch.nn as nn
from pyro.distributions.torch_distribution import TorchDistribution

from pyro_seq.distributions.wiener import wiener_transition
from pyro_seq.models.base import (
    SequenceModel,
    Step,
    masked,
    normal,
    shift_right,  # u_t = x_{t-1}, x_0 = 0
)
from pyro_seq.models.contract import example
from pyro_seq.models.emission import check_emission_options, make_emission, stack_params
from pyro_seq.nn import GaussianHead, cat_broadcast
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import positive_int, validate_generate_args

__all__ = ["PRIORS", "CELLS", "STORN", "StepRNN", "latent_prior", "white_noise"]

PRIORS = ("white", "wiener")
CELLS = ("tanh", "gru")


def white_noise(z_prev: torch.Tensor) -> TorchDistribution:
    r""":math:`p(z_t | z_{t-1}) = \mathcal{N}(z_t; 0, I)`: the white prior, independent across steps
    (``z_prev`` only fixes shape, dtype and device). Event shape ``(Z,)``."""
    return normal(torch.zeros_like(z_prev), torch.ones_like(z_prev))


def latent_prior(prior: str) -> Callable[[torch.Tensor], TorchDistribution]:
    """The per-step prior ``z_prev -> p(z_t | z_{t-1})`` named ``"white"`` or ``"wiener"``."""
    if prior == "white":
        return white_noise
    if prior == "wiener":
        return wiener_transition
    raise ValueError(f"prior must be one of {PRIORS}, got {prior!r}")


class StepRNN(nn.Module):
    r"""A recurrent cell :math:`h_t = f(h_{t-1}, u_t)` run one step at a time or over a sequence.

    ``cell="tanh"``: :math:`h_t = \tanh(W_{in} u_t + b_{in} + W_{rec} h_{t-1} + b_{rec})`, the
    simple RNN of Bayer & Osendorfer (2014), eq. (2) (torch's ``nn.RNN`` layout, two biases);
    ``cell="gru"``: torch's GRU (Cho et al. 2014). The same weights serve :meth:`step`
    (particle methods, per-particle ``h``) and :meth:`sequence` (all steps at once when the
    inputs are known).

    Shapes: ``step(u (..., I), h (..., H)) -> (..., H)``;
    ``sequence(u (..., T, I), h0 (..., H)) -> (..., T, H)``; leading dims broadcast.
    """

    def __init__(self, input_dim: int, hidden_dim: int, cell: str = "tanh") -> None:
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
        if cell == "gru":
            self.rnn: nn.RNNBase = nn.GRU(input_dim, hidden_dim, batch_first=True)
            self._cell = torch.gru_cell
        else:
            self.rnn = nn.RNN(input_dim, hidden_dim, nonlinearity="tanh", batch_first=True)
            self._cell = torch.rnn_tanh_cell
        self.cell, self.input_dim, self.hidden_dim = cell, input_dim, hidden_dim

    def step(self, u, h):
        shape = torch.broadcast_shapes(u.shape[:-1], h.shape[:-1])
        r = self.rnn
        out = self._cell(
            u.expand(shape + u.shape[-1:]).reshape(-1, u.shape[-1]),
            h.expand(shape + h.shape[-1:]).reshape(-1, h.shape[-1]),
            r.weight_ih_l0,
            r.weight_hh_l0,
            r.bias_ih_l0,
            r.bias_hh_l0,
        )
        return out.reshape(shape + (self.hidden_dim,))

    def sequence(self, u: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        shape = torch.broadcast_shapes(u.shape[:-2], h0.shape[:-1])
        T = u.shape[-2]
        inputs = u.expand(shape + u.shape[-2:]).reshape(-1, T, u.shape[-1])
        init = h0.expand(shape + h0.shape[-1:]).reshape(1, -1, h0.shape[-1]).contiguous()
        out, _ = self.rnn(inputs, init)
        return out.reshape(shape + (T, self.hidden_dim))


class STORN(SequenceModel):
    """STORN as a Pyro model/guide pair (module docstring; Bayer & Osendorfer (2014), sec. 3.3
    for the prior).

    :param int obs_dim: observation size ``D`` (88 for piano rolls).
    :param int z_dim: latent size.
    :param int rnn_dim: size of the generating RNN state ``h_t`` and of the recognition RNN
        state ``a_t``.
    :param int emission_dim: hidden units of the emission MLP ``h_t -> p(x_t | h_t)``.
    :param str prior: ``"white"`` (default: STORN's independent N(0, I) prior) or
        ``"wiener"`` (sec. 3.3 and 4; the default of :class:`~pyro_seq.models.vosp.VOSP`).
        *Cost of the Wiener prior with this recognition model:* ``q(z_t | x_{1:t})`` is
        independent across steps, and the KL of any step-wise independent Gaussian from a unit
        random walk is at least its mean-field minimum ``(T - 1) log(2) / 2`` per sequence and
        latent dimension (the walk's precision matrix has diagonal 2 and determinant 1), i.e.
        about 0.35 nats per step and dimension: 35 nats per step at ``z_dim=100``, more than
        the whole likelihood of a piano-roll step. Keep ``z_dim`` small with
        ``prior="wiener"`` (tested: ``tests/distributions/test_wiener_floor.py``).
    :param str likelihood: ``"bernoulli"`` (sec. 4) or ``"gaussian"`` (or any family
        :func:`~pyro_seq.models.emission.make_emission` knows, with its ``emission_kwargs``).
    :param str cell: ``"tanh"`` (eq. 2) or ``"gru"``, for both RNNs.
    :param str activation: hidden activation of the emission MLP.
    :param float min_scale: floor on the recognition model's standard deviations.
    :param str variance: ``"softplus"`` or ``"log"``
        (:class:`~pyro_seq.nn.GaussianHead`): how the recognition model outputs its scales.
    :param emission_kwargs: passed on to ``make_emission`` (e.g. ``num_components``).

    ``x`` is ``(batch, T, obs_dim)``, ``mask`` ``(batch, T)``; see
    :mod:`pyro_seq.models.base` for the step protocol. State: ``state["h"]`` (``h_{t-1}``) and
    ``state["z"]`` (``z_{t-1}``) per particle; ``state.shared`` holds ``u_t = x_{t-1}`` and the
    recognition parameters of every step.
    """

    time_parallel = True
    module_name = "storn"
    small_example = example(z_dim=2, rnn_dim=4, emission_dim=4)

    def __init__(
        self,
        obs_dim: int,
        z_dim: int = 100,
        rnn_dim: int = 300,
        emission_dim: int = 500,
        prior: str = "white",
        likelihood: str = "bernoulli",
        cell: str = "tanh",
        activation: str = "tanh",
        min_scale: float = 1e-3,
        variance: str = "softplus",
        **emission_kwargs: Any,
    ) -> None:
        super().__init__(obs_dim)
        for name, value in (("z_dim", z_dim), ("rnn_dim", rnn_dim), ("emission_dim", emission_dim)):
            positive_int(name, value)
        self.prior_dist = latent_prior(prior)
        self.prior, self.z_dim, self.rnn_dim = prior, int(z_dim), int(rnn_dim)
        self.binary_observations = likelihood == "bernoulli"
        self.decoder = StepRNN(obs_dim + z_dim, rnn_dim, cell)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=False)
        self.emitter, self.likelihood = make_emission(
            likelihood, rnn_dim, [emission_dim], obs_dim, activation, **emission_kwargs
        )
        self.encoder = StepRNN(obs_dim, rnn_dim, cell)
        self.recognition = GaussianHead(rnn_dim, z_dim, min_scale, variance)

    # generative model: h_t = f(h_{t-1}, [x_{t-1}, z_t]), x_t ~ p(x_t | h_t)
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        state.shared["u"] = shift_right(x)
        state["h"] = x.new_zeros(x.shape[0], self.rnn_dim)
        state["z"] = x.new_zeros(x.shape[0], self.z_dim)

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        z = self.sample_latent(state, "z", t, self.prior_dist, (state["z"],), mask)
        inputs = cat_broadcast([state.shared_at("u", t), z])
        if isinstance(t, slice):  # every z_t known (replayed): the RNN runs once over all steps
            h = self.decoder.sequence(inputs, state["h"])
        else:
            h = self.decoder.step(inputs, state["h"])
        self.observe(state, t, x, mask, h)
        state["h"], state["z"] = h, z

    # recognition model q(z_t | x_{1:t})
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        a = self.encoder.sequence(x, x.new_zeros(x.shape[0], self.rnn_dim))  # causal: padding
        state.shared["q_loc"], state.shared["q_scale"] = self.recognition(a)  # never leaks back

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        loc, scale = state.shared_at("q_loc", t), state.shared_at("q_scale", t)
        pyro.sample(f"z_{t + 1}", masked(normal(loc, scale), mask[:, t]))

    @torch.no_grad()
    def generate(self, num_sequences: int, num_steps: int) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples: ``z_t ~ p(z_t|z_{t-1})``, ``h_t = f(h_{t-1}, [x_{t-1}, z_t])``,
        ``x_t ~ p(x_t | h_t)``.

        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters per step (time at dim 1).
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        ref = self.recognition.loc.weight
        x = ref.new_zeros(num_sequences, self.obs_dim)
        h = ref.new_zeros(num_sequences, self.rnn_dim)
        z = ref.new_zeros(num_sequences, self.z_dim)
        xs, params = [], []
        for _ in range(num_steps):
            z = self.prior_dist(z).sample()
            h = self.decoder.step(torch.cat([x, z], -1), h)
            p = self.emitter(h)
            x = self.likelihood(p).sample()
            xs.append(x)
            params.append(p)
        return torch.stack(xs, 1), stack_params(params)
