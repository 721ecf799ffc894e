"""VAE-RNN: a VAE at every time step with a prior from a deterministic RNN (thesis 4.4.1).

Generative model (thesis eq. 4.11-4.12), with inputs ``u_t = x_{t-1}`` (``x_0 = 0``)::

    d_t = GRU(d_{t-1}, u_t)                                  d_0 = 0   (deterministic)
    z_t ~ N(mu^(p)_t, diag(sigma^(p)_t)^2),  (mu^(p)_t, sigma^(p)_t) = NN^(p)(d_t)
    x_t ~ p(x_t | z_t)                 (skip=False, Fig. 4.3a)
    x_t ~ p(x_t | z_t, d_t)            (skip=True: the d_t -> x_t connection discussed after
                                        eq. 4.16, which lets d_t carry the structure and z_t
                                        the variability)

Given ``d_{1:T}`` the ``z_t`` are independent (eq. 4.12): the prior has no ``z_{t-1}`` term.

Inference network (eq. 4.14-4.15): ``q(z_{1:T}, d_{1:T} | x) = prod_t q(z_t | x_t, d_t)
p(d_{1:T} | u_{1:T})`` with ``(mu^(q)_t, sigma^(q)_t) = NN^(q)([x_t, d_t])``, the same ``d_t``
as the model (the delta prior over ``d`` cancels). The ELBO is then (eq. 4.16)

    F = sum_t E_q(z_t|x_t,d_t)[ log p(x_t | z_t (, d_t)) ] - KL[q(z_t | x_t, d_t) || p(z_t | d_t)].

``d_{1:T}`` depends on ``x`` only, so it is the same for every particle: it lives in
``state.shared`` and both networks are evaluated over all steps at once in ``init``; the steps
only sample (the guide) or score (the model) their slice. Under FIVO and IWAE the proposal is
therefore exactly the per-step VAE encoder. Inside a Pyro ELBO the guide draws every ``z_t`` at
once (:class:`~pyro_seq.models.storn.RecognitionScan`) and the model, replayed against it,
takes ``d_{1:T}`` from the guide's run instead of running the GRU again (``models.base``,
"Sharing with the guide").

Defaults: the thesis does not give sizes for the VAE-RNN; those of
:class:`~pyro_seq.models.srnn.SRNN`'s polyphonic-music setting are used (GRU 300, z 100, every
distribution parameterised by an MLP with one hidden layer of 500 units, leaky ReLU 1/3 clipped
at +-3, standard deviations ``1e-3 + softplus(.)``), so the two models differ only in the
latent structure.
"""

from typing import Any, Tuple

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn

from pyro_seq.models.base import SequenceModel, Step, masked, normal, shift_right
from pyro_seq.models.contract import example
from pyro_seq.models.emission import check_emission_options, make_emission, stack_params
from pyro_seq.models.storn import RecognitionScan
from pyro_seq.nn import ForwardRNN, GaussianHead, cat_broadcast, make_activation
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import positive_int, validate_generate_args


class GaussianNet(nn.Module):
    """``(loc, scale) = GaussianHead(act(W h + b))``: one hidden layer, then the Gaussian head.

    Shapes: ``(..., in_dim) -> ((..., out_dim), (..., out_dim))``.
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        out_dim: int,
        activation: str,
        min_scale: float,
        variance: str,
    ) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_dim, hidden_dim)
        self.activation = make_activation(activation)
        self.head = GaussianHead(hidden_dim, out_dim, min_scale, variance)

    def forward(self, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.head(self.activation(self.hidden(h)))


class VAERNN(RecognitionScan, SequenceModel):
    """VAE-RNN (thesis 4.4.1) as a Pyro model/guide pair.

    :param int obs_dim: observation size ``D``.
    :param int d_dim: GRU size of the deterministic layer.
    :param int z_dim: latent size.
    :param int hidden_dim: hidden units of the prior, inference and emission MLPs.
    :param bool skip: emit from ``[z_t, d_t]`` (``p(x_t | z_t, d_t)``) instead of ``z_t``.
    :param str likelihood: ``"bernoulli"`` or ``"gaussian"`` (or another family of
        :func:`~pyro_seq.models.emission.make_emission`).
    :param str activation: hidden activation of the MLPs.
    :param float min_scale: floor on latent standard deviations (thesis 4.8.1).
    :param str variance: ``"softplus"`` (``sigma = min_scale + softplus(r)``) or ``"log"``
        (``r`` is the log-variance), as :class:`~pyro_seq.nn.GaussianHead`.
    :param emission_kwargs: passed on to ``make_emission`` (e.g. ``num_components``).
    """

    time_parallel = True
    #: the replayed model takes ``d_{1:T}`` from its guide's run (``models.base``, "Sharing
    #: with the guide")
    shared_with_guide = ("d",)
    shared_with_guide_modules = ("deterministic",)
    module_name = "vaernn"
    small_example = example(d_dim=4, z_dim=2, hidden_dim=4)

    def __init__(
        self,
        obs_dim: int,
        d_dim: int = 300,
        z_dim: int = 100,
        hidden_dim: int = 500,
        skip: bool = False,
        likelihood: str = "bernoulli",
        activation: str = "clipped_leaky_relu",
        min_scale: float = 1e-3,
        variance: str = "softplus",
        **emission_kwargs: Any,
    ) -> None:
        super().__init__(obs_dim)
        for name, value in (("d_dim", d_dim), ("z_dim", z_dim), ("hidden_dim", hidden_dim)):
            positive_int(name, value)
        if not isinstance(skip, bool):
            raise ValueError(f"skip must be True or False, got {skip!r}")
        self.binary_observations = likelihood == "bernoulli"
        self.d_dim, self.z_dim, self.skip = int(d_dim), int(z_dim), skip
        self.deterministic = ForwardRNN(obs_dim, self.d_dim, cell="gru")
        self.prior = GaussianNet(
            self.d_dim, hidden_dim, self.z_dim, activation, min_scale, variance
        )
        self.posterior = GaussianNet(
            obs_dim + self.d_dim, hidden_dim, self.z_dim, activation, min_scale, variance
        )
        emit_dim = self.z_dim + (self.d_dim if skip else 0)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=False)
        self.emitter, self.likelihood = make_emission(
            likelihood, emit_dim, [hidden_dim], obs_dim, activation, **emission_kwargs
        )

    def _deterministic_states(self, x, mask):
        """``d_{1:T}`` (eq. 4.11): ``(batch, T, d_dim)`` (zero after each sequence's end)."""
        return self.deterministic(shift_right(x), mask.sum(-1))

    def _features(self, z, d):
        return cat_broadcast([z, d]) if self.skip else z

    # generative model: eq. 4.11-4.12
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        d = state.shared.get("d")  # set by guide_init when both share a state (FIVO)
        if d is None:
            d = state.shared["d"] = self._deterministic_states(x, mask)
        state.shared["prior_loc"], state.shared["prior_scale"] = self.prior(d)
        # z_{t-1} is not read by the prior (eq. 4.12); it is the latent history the
        # time-parallel scoring of base.StepProgram expects
        state["z"] = x.new_zeros(x.shape[0], self.z_dim)

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        params = (state.shared_at("prior_loc", t), state.shared_at("prior_scale", t))
        z = self.sample_latent(state, "z", t, normal, params, mask)
        self.observe(state, t, x, mask, self._features(z, state.shared_at("d", t)))
        state["z"] = z

    # inference network: eq. 4.15
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        d = state.shared["d"] = self._deterministic_states(x, mask)
        state.shared["q_loc"], state.shared["q_scale"] = self.posterior(torch.cat([x, d], dim=-1))

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        loc, scale = state.shared_at("q_loc", t), state.shared_at("q_scale", t)
        pyro.sample(f"z_{t + 1}", masked(dist.Normal(loc, scale).to_event(1), mask[:, t]))

    @torch.no_grad()
    def generate(self, num_sequences: int, num_steps: int) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples (eq. 4.11): ``d_t = GRU(d_{t-1}, x_{t-1})``, ``z_t ~ p(z_t | d_t)``,
        ``x_t ~ p(x_t | z_t (, d_t))``.

        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters per step.
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        h = self.deterministic.h0.expand(1, num_sequences, -1).contiguous()
        x_prev = h.new_zeros(num_sequences, 1, self.obs_dim)
        xs, params = [], []
        for _ in range(num_steps):
            d, h = self.deterministic.rnn(x_prev, h)
            d = d[:, 0]
            loc, scale = self.prior(d)
            z = torch.distributions.Normal(loc, scale).sample()
            p = self.emitter(self._features(z, d))
            x = self.likelihood(p).sample()
            xs.append(x)
            params.append(p)
            x_prev = x.unsqueeze(1)
        return torch.stack(xs, 1), stack_params(params)
