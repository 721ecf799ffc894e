"""Deep Markov model / deep Kalman filter (thesis 4.3; Krishnan et al. 2017).

Generative model (thesis eq. 4.3, 4.2)::

    z_t ~ N(GatedTransition(z_{t-1}))                 z_0 learned
    x_t ~ Bernoulli(logits = Emitter(z_t))            (or Normal for real-valued data)

Known inputs (controls, actions; ``input_dim > 0``, ``inputs=`` ``(batch, T, input_dim)``):
the transition is ``p(z_t | z_{t-1}, u_t)`` of thesis eq. 4.2-4.3 (the action-conditioned
transition of Krishnan et al. 2015 and 2017). The gated transition reads ``[z_{t-1}, u_t]`` in
its gate, proposal and linear paths (:class:`InputGatedTransition`; the linear path starts as
``[I, 0]``, so its ``B u_t`` term starts at zero), and the inference network reads
``[x_t, u_t]`` (its RNN, or its MLP when filtering), so that ``q(z_t | z_{t-1}, x_{t:T},
u_{t:T})`` as thesis eq. 4.6. Res_q takes the residual to ``mu^(p)(z_{t-1}, u_t)``. The emission
``p(x_t | z_t)`` is unchanged. ``input_dim=0`` is the model without inputs, unchanged.

Inference networks of thesis Fig. 4.2:

* ``inference="smoothing"`` (Fig. 4.2a, eq. 4.6-4.9): ``a_t = RNN(a_{t+1}, x_t)`` runs backwards
  from a *learned* initial state ``a_{T+1}`` (a parameter, as ``h_0`` in Pyro's
  ``examples/dmm.py``; the thesis starts from zeros, which is the learned state's initial
  value) and ``q(z_t | z_{t-1}, a_t)`` is the combiner of Krishnan et al.;
* ``inference="filtering"`` (Fig. 4.2b): ``a_t = NN^(a)(x_t)`` sees only the present.

With ``residual=True`` (Res_q, thesis 4.8.1, in the form of eq. 5.12) the guide learns the
residual to the prior mean evaluated at its own previous sample::

    mu^(q)_t = mu^(p)(z_{t-1}) + W_l h_t,   h_t = (tanh(W z_{t-1}) + a_t) / 2
    sigma^(q)_t = min_scale + softplus(W_s h_t)          (unchanged, as in the thesis)

where ``mu^(p)`` is the gated-transition mean. For ``t >= 2`` ``z_{t-1}`` is the guide's sample
(the model, replayed against the guide, uses the same value); for ``t = 1`` the prior mean is
that of the model, ``mu^(p)(z_0)`` with the model's learned ``z_0`` (the combiner still reads the
guide's own ``z_q_0``), so the residual is taken to the prior the model actually evaluates at
every step. The default ``residual=False`` is the combiner of Krishnan et al. (2017) unchanged.

**Dropout.** ``dropout=p`` applies standard (inverted) dropout with probability ``p`` to the
recognition network's states ``a_{1:T}`` that feed the combiner (the backward RNN's outputs, or
``NN^(a)(x_t)`` when filtering): Krishnan et al. (2017) train on JSB Chorales with dropout 0.1
after the RNN output layer of the inference network (their published code, together with L2
regularisation and KL annealing). One mask per guide pass is drawn in ``guide_init`` and serves
the step loop and the combiner scan alike (and every particle). It acts in training mode only
(:class:`~pyro_seq.nn.TrainingDropout`); in ``eval()`` mode the model is exactly the
model without the option (no new parameters), so bounds are computed in ``eval()`` mode:
``fit`` returns the model in eval mode, and :func:`pyro_seq.train.evaluate_bound` and
:func:`pyro_seq.infer.estimate_log_likelihood` switch to it.

Default sizes are those of Pyro's ``examples/dmm.py`` (z 100, transition 200, emission 100,
backward RNN 600).
"""

from typing import Any, Optional, Tuple

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn

from pyro_seq.models.base import (
    SequenceModel,
    Step,
    cache_guide_prior,
    masked,
    normal,
    on_real_steps,
    prior_from_guide,
)
from pyro_seq.models.contract import example
from pyro_seq.models.emission import check_emission_options, make_emission, stack_params
from pyro_seq.nn import (
    MLP,
    BackwardRNN,
    Combiner,
    GatedTransition,
    TrainingDropout,
    cat_broadcast,
    check_dropout,
    combiner_scan,
    residual_combiner_scan,
    sequence_lengths,
)
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import validate_generate_args, validate_input_dim


class InputGatedTransition(GatedTransition):
    """The gated transition of :class:`~pyro_seq.nn.GatedTransition` on ``[z_{t-1}, u_t]``:
    ``p(z_t | z_{t-1}, u_t)`` (thesis eq. 4.2). Gate, proposal and linear path read the
    concatenation; the linear path starts as ``[I, 0]`` (``W_0 [z, u] = z``), the scale reads
    the proposal as before.

    Shapes: ``forward(zu (..., z_dim + input_dim)) -> (loc, scale)`` each ``(..., z_dim)``.
    """

    def __init__(
        self, z_dim: int, input_dim: int, hidden_dim: int, min_scale: float = 1e-3
    ) -> None:
        super().__init__(z_dim, hidden_dim, min_scale)
        in_dim = z_dim + input_dim
        self.gate_hidden = nn.Linear(in_dim, hidden_dim)
        self.proposal_hidden = nn.Linear(in_dim, hidden_dim)
        self.linear = nn.Linear(in_dim, z_dim)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.weight[:, :z_dim] = torch.eye(z_dim)
            self.linear.bias.zero_()


class DMM(SequenceModel):
    """Deep Markov model as a Pyro model/guide pair.

    :param int obs_dim: observation size ``D`` (88 for piano rolls).
    :param int z_dim: latent size.
    :param int transition_dim: hidden size of the gated transition.
    :param int emission_dim: hidden size of the two-layer emitter.
    :param int rnn_dim: size of the inference RNN state ``a_t``.
    :param str inference: ``"smoothing"`` or ``"filtering"`` (thesis Fig. 4.2).
    :param str rnn_cell: ``"rnn"`` (ReLU RNN, as Pyro's example), ``"gru"`` or ``"lstm"``.
    :param str likelihood: ``"bernoulli"`` (binary data) or ``"gaussian"``.
    :param float min_scale: floor on latent standard deviations.
    :param emission_kwargs: passed to :func:`~pyro_seq.models.emission.make_emission`, e.g.
        ``num_components`` for ``likelihood="gmm"``.
    :param bool residual: Res_q (module docstring): the guide mean is the gated-transition mean
        at the guide's ``z_{t-1}`` plus the combiner's output. Default False (Krishnan et al.).
    :param int input_dim: known input features per step ``U`` (module docstring); 0 (default)
        is the model without inputs.
    :param float dropout: probability ``0 <= p < 1`` of dropout on the recognition states
        ``a_{1:T}`` before the combiner, in training mode only (module docstring; Krishnan et al.
        2017 use 0.1 on JSB). Default 0: no dropout.

    ``x`` is ``(batch, T, obs_dim)``, ``mask`` ``(batch, T)``, with ``input_dim > 0`` also
    ``inputs=`` ``(batch, T, input_dim)`` for ``model``, ``guide`` and ``generate``; see
    :mod:`pyro_seq.models.base` for the step protocol.
    """

    time_parallel = True
    guide_scan_particles = True
    module_name = "dmm"
    small_example = example(z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4)

    def __init__(
        self,
        obs_dim: int,
        z_dim: int = 100,
        transition_dim: int = 200,
        emission_dim: int = 100,
        rnn_dim: int = 600,
        inference: str = "smoothing",
        rnn_cell: str = "rnn",
        likelihood: str = "bernoulli",
        min_scale: float = 1e-3,
        residual: bool = False,
        input_dim: int = 0,
        dropout: float = 0.0,
        **emission_kwargs: Any,
    ) -> None:
        super().__init__(obs_dim)
        self.dropout = check_dropout(dropout)
        self.input_dim = input_dim = validate_input_dim(input_dim)
        self.binary_observations = likelihood == "bernoulli"
        if inference not in ("smoothing", "filtering"):
            raise ValueError(f"inference must be 'smoothing' or 'filtering', got {inference!r}")
        if not isinstance(residual, bool):
            raise ValueError(f"residual must be True or False, got {residual!r}")
        self.z_dim, self.inference, self.residual = z_dim, inference, residual
        if input_dim:
            self.transition: nn.Module = InputGatedTransition(
                z_dim, input_dim, transition_dim, min_scale
            )
        else:
            self.transition = GatedTransition(z_dim, transition_dim, min_scale)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=True)
        self.emitter, self.likelihood = make_emission(
            likelihood, z_dim, [emission_dim] * 2, obs_dim, **emission_kwargs
        )
        if inference == "smoothing":
            self.encoder: nn.Module = BackwardRNN(
                obs_dim + input_dim, rnn_dim, cell=rnn_cell, learn_init=True
            )
        else:
            self.encoder = MLP(
                obs_dim + input_dim, [rnn_dim], rnn_dim, activation="tanh", activate_output=True
            )
        self.combiner = Combiner(z_dim, rnn_dim, min_scale)
        self.rnn_dropout = TrainingDropout(self.dropout)  # on a_{1:T}; no parameters
        self.z_0 = nn.Parameter(torch.zeros(z_dim))
        self.z_q_0 = nn.Parameter(torch.zeros(z_dim))

    @classmethod
    def for_data(cls, obs_dim: int, input_dim: int = 0, **options: Any) -> "DMM":
        """A DMM for ``obs_dim`` features and ``input_dim`` known inputs per step."""
        return cls(obs_dim, input_dim=input_dim, **options)

    def _transition_input(self, state, z_prev, t):
        """The transition's input at step ``t`` (or all steps): ``z_{t-1}``, or
        ``[z_{t-1}, u_t]`` with known inputs."""
        if not self.input_dim:
            return z_prev
        return cat_broadcast([z_prev, state.shared_at("inputs", t)])

    # generative model p(x, z | u): thesis eq. 4.3
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        state["z"] = self.z_0.expand(x.shape[0], self.z_dim)

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        loc_scale = prior_from_guide(state, t) if self.residual else None
        if loc_scale is None:
            z_in = self._transition_input(state, state["z"], t)
            if isinstance(t, slice):  # time-parallel scoring: the real steps only
                loc_scale = on_real_steps(self.transition, z_in, mask)
            else:
                loc_scale = self.transition(z_in)
        loc, scale = loc_scale
        z = self.sample_latent(state, "z", t, normal, (loc, scale), mask)
        self.observe(state, t, x, mask, z)
        state["z"] = z

    # inference network q(z | x): thesis eq. 4.6-4.9, Fig. 4.2
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        seen = torch.cat([x, state.shared["inputs"]], -1) if self.input_dim else x  # [x_t, u_t]
        a = self.encoder(seen, mask) if self.inference == "smoothing" else self.encoder(seen)
        # one dropout mask (training mode) for the step loop, the scan and every particle
        state.shared["a"] = self.rnn_dropout(a)
        state["guide_z"] = self.z_q_0.expand(x.shape[0], self.z_dim)
        state.shared["combiner_w"], state.shared["combiner_b"] = self.combiner.stacked_heads()

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        heads = (state.shared["combiner_w"], state.shared["combiner_b"])
        loc, scale = self.combiner(state["guide_z"], state.shared_at("a", t), heads)
        if self.residual:  # Res_q: residual to the prior mean at the guide's z_{t-1} (z_0 at t=0)
            z_prev = state["guide_z"] if t > 0 else self.z_0
            prior = self.transition(self._transition_input(state, z_prev, t))
            loc = loc + prior[0]
            # a model step sharing this state (FIVO) reuses p(z_t | z_{t-1}) at the same z_{t-1}
            cache_guide_prior(state, t, z_prev, prior)
        z = pyro.sample(f"z_{t + 1}", masked(dist.Normal(loc, scale).to_event(1), mask[:, t]))
        state["guide_z"] = z

    def guide_scan(
        self,
        state: SequenceState,
        x: torch.Tensor,
        mask: torch.Tensor,
        particles: Tuple[int, ...] = (),
    ) -> bool:
        """Every guide step at once (the full-sequence guide under plain handlers, e.g. inside
        ``Trace_ELBO``): the noise of all steps is drawn first, then
        :func:`~pyro_seq.nn.combiner_scan.combiner_scan` runs the combiner recursion of
        :meth:`guide_step` as one autograd node and the sites ``z_1..z_T`` are emitted with those
        values. The values equal the step loop's for the same seed (the noise is drawn in the
        same order and shapes) on every step up to each sequence's last observed one; past it,
        where no site is scored, ``z`` is the noise itself. Under a particle plate (``particles = (K, 1, ..., 1)``) the
        scan runs on ``K * batch`` rows (``z_0`` and ``a`` repeated per particle). With Res_q
        (``residual=True``) :func:`~pyro_seq.nn.combiner_scan.residual_combiner_scan` adds the
        gated transition's mean inside the recursion; Res_q with known inputs keeps the step
        loop."""
        if self.residual and self.input_dim:  # Res_q with known inputs: the step loop
            return False
        a = state.shared["a"]
        z0 = state["guide_z"]
        lead = particles + z0.shape[:-1]  # (*particles, batch): each step's draw, as the loop's
        # one standard-normal draw per step, as each step's Normal.rsample() makes: the same
        # random stream, hence the same values as the step loop for the same seed
        eps = torch.stack(
            [a.new_empty(lead + z0.shape[-1:]).normal_() for _ in range(a.shape[-2])], -2
        )
        if particles:  # K * batch rows
            z0 = z0.expand(lead + z0.shape[-1:]).reshape(-1, z0.shape[-1])
            a = a.expand(particles + a.shape).reshape((-1,) + a.shape[-2:])
        c = self.combiner
        # only the steps up to each row's last observed one are computed
        lengths = sequence_lengths(mask).expand(lead).reshape(-1)
        noise = eps.reshape((-1,) + eps.shape[-2:])
        if self.residual:  # the transition's mean at z_{t-1} (the model's z_0 at t = 1)
            zp0 = self.z_0.expand(z0.shape)
            out = residual_combiner_scan(z0, zp0, a, noise, c, self.transition, lengths)
        else:
            out = combiner_scan(
                z0,
                a,
                noise,
                c.z_to_hidden.weight,
                c.z_to_hidden.bias,
                state.shared["combiner_w"],
                state.shared["combiner_b"],
                c.min_scale,
                lengths,
            )
        loc, scale, z = (v.reshape(eps.shape) for v in out)
        self.sample_presampled("z", normal, (loc, scale), z, mask)
        state["guide_z"] = z[..., -1, :]
        return True

    @torch.no_grad()
    def generate(
        self, num_sequences: int, num_steps: int, inputs: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples from the generative model (thesis eq. 4.3).

        :param inputs: the known inputs ``u_{1:T}`` ``(num_sequences, num_steps, input_dim)``,
            required when ``input_dim > 0`` and refused otherwise (ValueError).
        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters per step (Bernoulli logits, or a ``(loc, scale)`` pair).
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        u = self.generate_inputs(inputs, num_sequences, num_steps, self.z_0)
        z = self.z_0.expand(num_sequences, self.z_dim)
        xs, params = [], []
        for t in range(num_steps):
            loc, scale = self.transition(z if u is None else torch.cat([z, u[:, t]], -1))
            z = torch.distributions.Normal(loc, scale).sample()
            p = self.emitter(z)
            xs.append(self.likelihood(p).sample())
            params.append(p)
        return torch.stack(xs, 1), stack_params(params)
