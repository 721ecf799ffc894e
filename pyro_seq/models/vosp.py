r"""Variational one step predictor, VOSP (Bayer & Osendorfer (2014), sec. 3.2).

One recurrent network, the *recognition* RNN, summarises the observed past; there is no
generating RNN. With ``h_0 = 0`` and ``z_0 = 0``::

    h_t = f(h_{t-1}, x_t)                       recognition RNN (eq. 2 with f_h = tanh, or a GRU)
    z_t ~ p(z_t | z_{t-1})                      prior="wiener": N(z_{t-1}, I) (sec. 3.3, 4),
                                                "white": N(0, I)
    x_t ~ p(x_t | h_{t-1}, z_t) = MLP([h_{t-1}, z_t])     Bernoulli (sec. 4) or Gaussian
    q(z_t | x_{1:t}) = N(z_t; mu(h_t), diag sigma^2(h_t))  the same RNN's state at step t

so the past :math:`x_{1:t-1}` flows deterministically (Dirac :math:`h_{t-1}`) into the
prediction of :math:`x_t` and :math:`z_t` carries what is left uncertain. The bound is the last
display of sec. 3.2,

.. math:: -\log p(x_{1:T}) \le KL(q(z_{1:T}) \| p(z_{1:T}))
    - \mathbb{E}_{z_{1:T} \sim q}\Big[\sum_{t=1}^T \log p(x_t | h_{t-1}, z_t)\Big]
    =: \mathcal{L}_{\mathrm{VOSP}}.

The derivation in sec. 3.2 writes :math:`p(x_t | h_t, z_t)`; since :math:`h_t` summarises
:math:`x_{1:t}` (``x_t`` included), the emission takes :math:`h_{t-1}`, as in the caption of
Fig. 2 and in sec. 4 (":math:`p(x_t | h_{t-1}, z_t)` ... independent Bernoulli distributions").
Compare :class:`~pyro_seq.models.storn.STORN`, where ``z_t`` is an input of a separate
generating RNN.

As a :class:`~pyro_seq.models.base.SequenceModel`: the RNN depends on ``x`` only, so
``h_{1:T}`` is computed once per pass (``state.shared["h"]``, shared by model and guide) and
the only per-particle state is ``z_{t-1}`` (Wiener prior), which FIVO resamples. Step ``t``
has the latent site ``z_{t+1}`` (prior :math:`p(z_t|z_{t-1})`, guide :math:`q(z_t|x_{1:t})`)
and the observation ``x_{t+1}``; every Pyro ELBO (and IWAE, FIVO) estimates the bound from
these sites; time-parallel scoring runs the emission MLP once over all steps, and since
``q(z_t | x_{1:t})`` reads ``h_t`` only, the full-sequence guide draws every ``z_t`` at once
(:func:`~pyro_seq.models.storn.draw_recognition`).

**Generation** (:meth:`VOSP.generate`): the model is a one step predictor, so sampling runs the
recognition RNN on the model's own samples: ``z_t ~ p(z_t | z_{t-1})``,
``x_t ~ p(x_t | h_{t-1}, z_t)``, then ``h_t = f(h_{t-1}, x_t)``, i.e. the past that flows into
the next prediction is the sampled past.

**Departures.** Fast dropout (Bayer et al. 2013, after Wang & Manning 2013) is not
implemented: ``dropout=p`` applies standard dropout in its place, in training mode only
(:class:`~pyro_seq.nn.TrainingDropout`), on the observations fed to the recognition
RNN (never on the :math:`x_t` scored by the likelihood) and on the hidden layer of the generating
MLP; in ``eval()`` mode the model is exactly the model without dropout, so bounds must be
computed in ``eval()`` mode. While dropout is active the model computes its own
:math:`h_{1:T}` (its own mask) instead of taking the guide's, in every path. Sizes are not in
the paper (random search): the defaults are those of :class:`~pyro_seq.models.storn.STORN` with
``z_dim=8`` (the cost of the Wiener prior with a step-wise independent ``q`` is explained
there).
"""

from typing import Any, Optional, Tuple

import pyro
import torch

from pyro_seq.models.base import SequenceModel, Step, masked, normal, shift_right
from pyro_seq.models.contract import example
from pyro_seq.models.emission import check_emission_options, make_emission, stack_params
from pyro_seq.models.storn import RecognitionScan, StepRNN, latent_prior
from pyro_seq.nn import (
    GaussianHead,
    TrainingDropout,
    cat_broadcast,
    check_dropout,
    emission_dropout,
)
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import positive_int, validate_generate_args

__all__ = ["VOSP"]


class VOSP(RecognitionScan, SequenceModel):
    """VOSP as a Pyro model/guide pair (module docstring; Bayer & Osendorfer (2014), sec. 3.2,
    3.3).

    :param int obs_dim: observation size ``D`` (88 for piano rolls).
    :param int z_dim: latent size.
    :param int rnn_dim: size of the recognition RNN state ``h_t``.
    :param int emission_dim: hidden units of the generating MLP ``[h_{t-1}, z_t] -> x_t``.
    :param str prior: ``"wiener"`` (default, sec. 3.3 and 4) or ``"white"``.
    :param str likelihood: ``"bernoulli"`` (sec. 4) or ``"gaussian"`` (or any family
        :func:`~pyro_seq.models.emission.make_emission` knows, with its ``emission_kwargs``).
    :param str cell: ``"tanh"`` (eq. 2) or ``"gru"``, the recognition RNN.
    :param str activation: hidden activation of the generating MLP.
    :param float min_scale: floor on the recognition model's standard deviations.
    :param str variance: ``"softplus"`` or ``"log"`` (:class:`~pyro_seq.nn.GaussianHead`).
    :param float dropout: probability ``0 <= p < 1`` of standard dropout in training mode, the
        stand-in for the paper's fast dropout (module docstring): on the recognition RNN's
        inputs ``x_t`` and the generating MLP's hidden layer. 0 (default): none. Evaluate in
        ``eval()`` mode.
    :param emission_kwargs: passed on to ``make_emission`` (e.g. ``num_components``).

    ``x`` is ``(batch, T, obs_dim)``, ``mask`` ``(batch, T)``; see :mod:`pyro_seq.models.base`
    for the step protocol. State: ``state["z"]`` (``z_{t-1}``) per particle;
    ``state.shared`` holds ``h_{1:T}`` ``(batch, T, rnn_dim)``, ``h_{0:T-1}`` and the
    recognition parameters of every step.
    """

    time_parallel = True
    module_name = "vosp"
    small_example = example(z_dim=2, rnn_dim=4, emission_dim=4)
    shared_with_guide = ("h",)
    shared_with_guide_modules = ("encoder",)

    def __init__(
        self,
        obs_dim: int,
        z_dim: int = 8,
        rnn_dim: int = 300,
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
        for name, value in (("z_dim", z_dim), ("rnn_dim", rnn_dim), ("emission_dim", emission_dim)):
            positive_int(name, value)
        self.dropout = check_dropout(dropout)
        self.prior_dist = latent_prior(prior)
        self.prior, self.z_dim, self.rnn_dim = prior, int(z_dim), int(rnn_dim)
        self.binary_observations = likelihood == "bernoulli"
        self.encoder = StepRNN(obs_dim, rnn_dim, cell)
        self.recognition = GaussianHead(rnn_dim, z_dim, min_scale, variance)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=False)
        emitter, self.likelihood = make_emission(
            likelihood, rnn_dim + z_dim, [emission_dim], obs_dim, activation, **emission_kwargs
        )
        self.emitter = emission_dropout(emitter, self.dropout)
        self.input_dropout = TrainingDropout(self.dropout)

    def recognition_states(
        self, x: torch.Tensor, mask: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``h_{1:T}`` of the recognition RNN, ``h_t = f(h_{t-1}, x_t)``, ``h_0 = 0``:
        ``(batch, T, rnn_dim)``. Causal, so padding never leaks into real steps; with the
        prefix ``mask`` ``(batch, T)`` the padded steps are not computed
        (:meth:`~pyro_seq.models.storn.StepRNN.sequence`). In training mode the inputs pass
        through ``dropout`` (a fresh mask per call)."""
        lengths = None if mask is None else mask.sum(-1)
        u = self.input_dropout(x)
        return self.encoder.sequence(u, x.new_zeros(x.shape[0], self.rnn_dim), lengths)

    # generative model: z_t ~ p(z_t | z_{t-1}), x_t ~ p(x_t | h_{t-1}, z_t)
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        if self.training and self.dropout > 0:  # the model's own mask, in every path
            h = self.recognition_states(x, mask)
        else:  # set by guide_init (same state, FIVO) or the guide's run
            h = state.shared.get("h")
            if h is None:
                h = state.shared["h"] = self.recognition_states(x, mask)
        state.shared["h_prev"] = shift_right(h)  # h_{0:T-1}
        state["z"] = x.new_zeros(x.shape[0], self.z_dim)

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        z = self.sample_latent(state, "z", t, self.prior_dist, (state["z"],), mask)
        self.observe(state, t, x, mask, cat_broadcast([state.shared_at("h_prev", t), z]))
        state["z"] = z

    # recognition model q(z_t | x_{1:t}) = N(mu(h_t), sigma^2(h_t))
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        h = state.shared["h"] = self.recognition_states(x, mask)
        state.shared["q_loc"], state.shared["q_scale"] = self.recognition(h)

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        loc, scale = state.shared_at("q_loc", t), state.shared_at("q_scale", t)
        pyro.sample(f"z_{t + 1}", masked(normal(loc, scale), mask[:, t]))

    @torch.no_grad()
    def generate(self, num_sequences: int, num_steps: int) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples of the one step predictor (module docstring, sec. 3.2): with
        ``h_0 = 0``, ``z_0 = 0``: ``z_t ~ p(z_t | z_{t-1})``, ``x_t ~ p(x_t | h_{t-1}, z_t)``,
        ``h_t = f(h_{t-1}, x_t)``, the recognition RNN fed the sampled ``x_t`` (there is no
        generating RNN). In training mode ``dropout`` acts on the ``x_t`` fed to the RNN and on
        the generating MLP's hidden layer, as in scoring.

        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters per step (time at dim 1).
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        ref = self.recognition.loc.weight
        h = ref.new_zeros(num_sequences, self.rnn_dim)
        z = ref.new_zeros(num_sequences, self.z_dim)
        xs, params = [], []
        for _ in range(num_steps):
            z = self.prior_dist(z).sample()
            p = self.emitter(torch.cat([h, z], -1))
            x = self.likelihood(p).sample()
            h = self.encoder.step(self.input_dropout(x), h)
            xs.append(x)
            params.append(p)
        return torch.stack(xs, 1), stack_params(params)
