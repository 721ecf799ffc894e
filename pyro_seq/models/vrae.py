r"""Variational recurrent auto-encoder, VRAE (Bayer & Osendorfer (2014), sec. 3.1).

A sequence VAE: the whole sequence is encoded into a latent *sequence* :math:`z_{1:T}` with a
temporal prior, and decoded back (``h_0 = 0``, ``z_0 = 0``)::

    z_t ~ p(z_t | z_{t-1})          prior="wiener": N(z_{t-1}, I) (sec. 3.3), "white": N(0, I)
    h_t = f(h_{t-1}, z_t)           decoder RNN (eq. 2 with f_h = tanh, or a GRU)
    x_t ~ p(x_t | h_t)              Bernoulli (sec. 4) or Gaussian

Recognition model: one bidirectional RNN (Schuster & Paliwal; the paper's [25]) over the whole
sequence, :math:`\overrightarrow{a}_t = f_\rightarrow(\overrightarrow{a}_{t-1}, x_t)`,
:math:`\overleftarrow{a}_t = f_\leftarrow(\overleftarrow{a}_{t+1}, x_t)` (both from zero, the
backward one from each sequence's own last step), and

.. math:: q(z_{1:T} | x_{1:T}) = \prod_{t=1}^T \mathcal{N}\big(z_t; \mu([\overrightarrow{a}_t,
    \overleftarrow{a}_t]), \mathrm{diag}\,\sigma^2([\overrightarrow{a}_t, \overleftarrow{a}_t])
    \big),

a diagonal Gaussian in which every step sees the whole sequence.

Bound: the display of sec. 3.1 (Eq. (6) with time indices),

.. math:: -\log p(x_{1:T}) \le KL(q(z_{1:T}) \| p(z_{1:T}))
    - \mathbb{E}_{z_{1:T} \sim q}[\log p(x_{1:T} | z_{1:T})] =: \mathcal{L}_{\mathrm{VRAE}},
    \qquad \log p(x_{1:T} | z_{1:T}) = \sum_t \log p(x_t | h_t).

As a :class:`~pyro_seq.models.base.SequenceModel` the guide's ``init`` runs the bidirectional
encoder once (``state.shared``), its steps sample ``z_t``; the model's steps run the decoder
(``h_t`` and ``z_{t-1}`` per particle, so FIVO resamples them). No ``q(z_t | x)`` reads an
earlier sample, so the full-sequence guide draws every ``z_t`` at once
(:func:`~pyro_seq.models.storn.draw_recognition`), and with every ``z_t`` fixed the decoder
runs once over the sequence. Pyro's ELBOs estimate
:math:`\mathcal{L}_{\mathrm{VRAE}}` from the per-step sites; the KL term in closed form
(sec. 3.3, via :math:`g_W`) is :meth:`VRAE.kl_divergence`.

**Departures from the paper.** Sec. 3.1 uses bidirectional RNNs for the *generating* model too
(Fig. 1a); a bidirectional decoder would make :math:`p(x_t | z_{1:T})` depend on future latents,
which the step protocol (and particle filtering) cannot express, so the decoder here is causal:
:math:`p(x_t | z_{1:t})`. The paper uses fast dropout (Bayer et al. 2013, after Wang & Manning
2013), which is not implemented: ``dropout=p`` applies standard dropout in its place, in training
mode only (:class:`~pyro_seq.nn.TrainingDropout`), on the observations fed to each
encoder RNN (never on the :math:`x_t` scored by the likelihood, nor on the decoder's inputs
:math:`z_t`) and on the hidden layer of the emission MLP; in ``eval()`` mode the model is exactly
the model without dropout, so bounds must be computed in ``eval()`` mode. Sizes are not in the
paper (random search); the defaults match :class:`~pyro_seq.models.storn.STORN`.
"""

from typing import Any, Optional, Tuple

import pyro
import torch

from pyro_seq.distributions.wiener import kl_diagonal_normal_wiener
from pyro_seq.models.base import SequenceModel, Step, masked, normal
from pyro_seq.models.contract import example
from pyro_seq.models.emission import check_emission_options, make_emission, stack_params
from pyro_seq.models.storn import RecognitionScan, StepRNN, latent_prior
from pyro_seq.nn import (
    GaussianHead,
    TrainingDropout,
    check_dropout,
    emission_dropout,
    reverse_padded,
)
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import (
    module_device,
    positive_int,
    validate_generate_args,
    validate_sequences,
)

__all__ = ["VRAE"]


class VRAE(RecognitionScan, SequenceModel):
    """VRAE as a Pyro model/guide pair (module docstring; Bayer & Osendorfer (2014), sec. 3.1, 3.3).

    :param int obs_dim: observation size ``D``.
    :param int z_dim: latent size.
    :param int encoder_dim: state size of each direction of the bidirectional encoder.
    :param int decoder_dim: state size of the decoder RNN ``h_t``.
    :param int emission_dim: hidden units of the emission MLP ``h_t -> p(x_t | h_t)``.
    :param str prior: ``"wiener"`` (default, sec. 3.3 and 4) or ``"white"``. The recognition
        model is independent across steps, so the Wiener prior costs at least about 0.35 nats
        per step and latent dimension (the mean-field floor explained in
        :class:`~pyro_seq.models.storn.STORN`); hence the small default ``z_dim=8`` (the paper
        does not give its latent size).
    :param str likelihood: ``"bernoulli"`` (sec. 4) or ``"gaussian"`` (or any family
        :func:`~pyro_seq.models.emission.make_emission` knows, with its ``emission_kwargs``).
    :param str cell: ``"tanh"`` (eq. 2) or ``"gru"``, for all three RNNs.
    :param str activation: hidden activation of the emission MLP.
    :param float min_scale: floor on the recognition model's standard deviations.
    :param str variance: ``"softplus"`` or ``"log"`` (:class:`~pyro_seq.nn.GaussianHead`).
    :param float dropout: probability ``0 <= p < 1`` of standard dropout in training mode, the
        stand-in for the paper's fast dropout (module docstring): on the inputs ``x_t`` of both
        encoder RNNs (a mask each) and the emission MLP's hidden layer. 0 (default): none.
        Evaluate in ``eval()`` mode.
    :param emission_kwargs: passed on to ``make_emission`` (e.g. ``num_components``).
    """

    time_parallel = True
    module_name = "vrae"
    small_example = example(z_dim=2, encoder_dim=4, decoder_dim=4, emission_dim=4)

    def __init__(
        self,
        obs_dim: int,
        z_dim: int = 8,
        encoder_dim: int = 300,
        decoder_dim: int = 300,
        emission_dim: int = 500,
        prior: str = "wiener",
        likelihood: str = "bernoulli",
        cell: str = "tanh",
        activation: str = "tanh",
        min_scale: float = 1e-3,
        variance: str = "softplus",
        dropout: float = 0.0,
        **emission_kwargs: Any,
    ) -> None:
        super().__init__(obs_dim)
        for name, value in (
            ("z_dim", z_dim),
            ("encoder_dim", encoder_dim),
            ("decoder_dim", decoder_dim),
            ("emission_dim", emission_dim),
        ):
            positive_int(name, value)
        self.dropout = check_dropout(dropout)
        self.prior_dist = latent_prior(prior)
        self.prior, self.z_dim = prior, int(z_dim)
        self.encoder_dim, self.decoder_dim = int(encoder_dim), int(decoder_dim)
        self.binary_observations = likelihood == "bernoulli"
        self.forward_encoder = StepRNN(obs_dim, encoder_dim, cell)
        self.backward_encoder = StepRNN(obs_dim, encoder_dim, cell)
        self.recognition = GaussianHead(2 * encoder_dim, z_dim, min_scale, variance)
        self.decoder = StepRNN(z_dim, decoder_dim, cell)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=False)
        emitter, self.likelihood = make_emission(
            likelihood, decoder_dim, [emission_dim], obs_dim, activation, **emission_kwargs
        )
        self.emitter = emission_dropout(emitter, self.dropout)
        self.input_dropout = TrainingDropout(self.dropout)

    # generative model: z_t ~ p(z_t | z_{t-1}), h_t = f(h_{t-1}, z_t), x_t ~ p(x_t | h_t)
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        state["h"] = x.new_zeros(x.shape[0], self.decoder_dim)
        state["z"] = x.new_zeros(x.shape[0], self.z_dim)

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        z = self.sample_latent(state, "z", t, self.prior_dist, (state["z"],), mask)
        if isinstance(t, slice):  # every z_t known (replayed): the decoder runs once
            h = self.decoder.sequence(z, state["h"], mask.sum(-1))
        else:
            h = self.decoder.step(z, state["h"])
        self.observe(state, t, x, mask, h)
        state["h"], state["z"] = h, z

    # recognition model q(z_{1:T} | x_{1:T}): bidirectional RNN over the whole sequence
    def recognition_params(
        self, x: torch.Tensor, mask: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(loc, scale)`` of :math:`q(z_t | x_{1:T})` for every step, ``(batch, T, z_dim)``
        (in training mode with ``dropout`` on each encoder's inputs, a mask each)."""
        zeros = x.new_zeros(x.shape[0], self.encoder_dim)
        lengths = mask.sum(-1)
        forward = self.forward_encoder.sequence(self.input_dropout(x), zeros, lengths)
        backward_inputs = reverse_padded(self.input_dropout(x), lengths)
        backward = reverse_padded(
            self.backward_encoder.sequence(backward_inputs, zeros, lengths), lengths
        )  # starts at each sequence's own last step
        return self.recognition(torch.cat([forward, backward], dim=-1))

    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        state.shared["q_loc"], state.shared["q_scale"] = self.recognition_params(x, mask)

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        loc, scale = state.shared_at("q_loc", t), state.shared_at("q_scale", t)
        pyro.sample(f"z_{t + 1}", masked(normal(loc, scale), mask[:, t]))

    def kl_divergence(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        r"""The KL term of :math:`\mathcal{L}_{\mathrm{VRAE}}` in closed form, per sequence.

        Wiener prior: via the difference map :math:`g_W` (sec. 3.3,
        :func:`~pyro_seq.distributions.wiener.kl_diagonal_normal_wiener`); white prior: the sum
        of per-step Gaussian KLs from :math:`\mathcal{N}(0, I)`. Padded steps contribute 0.

        :returns: ``(batch,)``.
        """
        x, mask = validate_sequences(
            x, mask, self.obs_dim, self.binary_observations, device=module_device(self)
        )
        loc, scale = self.recognition_params(x, mask)
        if self.prior == "wiener":
            return kl_diagonal_normal_wiener(loc, scale, mask=mask)
        terms = 0.5 * (scale**2 + loc**2 - 1.0) - torch.log(scale)
        return terms.sum(-1).masked_fill(~mask, 0.0).sum(-1)

    @torch.no_grad()
    def generate(self, num_sequences: int, num_steps: int) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples: ``z_t ~ p(z_t|z_{t-1})``, ``h_t = f(h_{t-1}, z_t)``,
        ``x_t ~ p(x_t | h_t)`` (in training mode with ``dropout`` on the emission's hidden layer,
        as in scoring).

        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters per step (time at dim 1).
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        ref = self.recognition.loc.weight
        h = ref.new_zeros(num_sequences, self.decoder_dim)
        z = ref.new_zeros(num_sequences, self.z_dim)
        xs, params = [], []
        for _ in range(num_steps):
            z = self.prior_dist(z).sample()
            h = self.decoder.step(z, h)
            p = self.emitter(h)
            xs.append(self.likelihood(p).sample())
            params.append(p)
        return torch.stack(xs, 1), stack_params(params)
