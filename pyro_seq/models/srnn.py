"""Stochastic recurrent neural network (thesis Ch. 5, Fraccaro et al. 2016).

Generative model (eq. 5.1, 5.3), with ``u_t = x_{t-1}`` (``x_0 = 0``) as in the paper's
polyphonic-music experiments::

    d_t = GRU(d_{t-1}, u_t)                                   d_0 = 0   (deterministic layer)
    z_t ~ N(mu^(p)_t, v^(p)_t),  [mu^(p)_t, log v^(p)_t] = NN^(p)(z_{t-1}, d_t)   z_0 = 0
    x_t ~ Bernoulli(logits = NN^(x)(z_t, d_t))                (skip connection d_t -> x_t)

Inference network (eq. 5.5, 5.7, 5.10): ``q`` reuses the same ``d_{1:T}`` and factorises as
``prod_t q(z_t | z_{t-1}, a_t)`` with

* ``inference="smoothing"``: ``a_t = GRU_back(a_{t+1}, [d_t, x_t])``, ``a_{T+1} = 0`` (eq. 5.7);
* ``inference="filtering"``: ``a_t = NN^(a)([d_t, x_t])``.

Known inputs (``input_dim > 0``; the programs' ``inputs=`` ``(batch, T, input_dim)``, written
``k_t`` here since ``u_t`` is the input of eq. 5.1): the deterministic layer reads both,
``u_t = [x_{t-1}, k_t]`` (the concatenation), ``d_t = GRU(d_{t-1}, u_t)``; nothing else changes.
The prior, the emission and the guide see the inputs through ``d_t`` (the backward GRU still
reads ``[d_t, x_t]``, and ``d_{t:T}`` carries ``k_{1:T}``). ``input_dim=0`` is the model above.

With ``residual=True`` (Res_q, eq. 5.11-5.12, Algorithm 2) the guide mean is
``mu^(q)_t = mu^(p)_t(z_{t-1}, d_t) + NN^(q)_1(z_{t-1}, a_t)``: the guide learns the residual to
the prior mean evaluated at its own sample ``z_{t-1}``.

Defaults follow the polyphonic-music setting of the Ch. 5 supplementary: GRU 300, z 100, every
distribution parameterised by an MLP with one hidden layer of 500 units, leaky ReLU (1/3)
clipped at +-3.
"""

from typing import Any, Optional, Tuple

import pyro
import pyro.distributions as dist
import torch
from torch import nn

from pyro_seq.distributions import PresampledValue
from pyro_seq.models.base import (
    SequenceModel,
    Step,
    cache_guide_prior,
    masked,
    normal,
    prior_from_guide,
    shift_right,
)
from pyro_seq.models.contract import example
from pyro_seq.models.emission import check_emission_options, make_emission, stack_params
from pyro_seq.nn import (
    MLP,
    BackwardRNN,
    ForwardRNN,
    GaussianMLP,
    cat_broadcast,
    sequence_lengths,
)
from pyro_seq.nn.srnn_scan import activation_derivative, srnn_guide_scan
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import validate_generate_args, validate_input_dim


class SRNN(SequenceModel):
    """Stochastic RNN as a Pyro model/guide pair.

    :param int obs_dim: observation size ``D``.
    :param int d_dim: GRU size of the deterministic layer.
    :param int z_dim: stochastic layer size.
    :param int hidden_dim: hidden units of every MLP.
    :param str inference: ``"smoothing"`` (backward GRU) or ``"filtering"``.
    :param bool residual: the Res_q parameterisation (eq. 5.12).
    :param str likelihood: ``"bernoulli"`` or ``"gaussian"``.
    :param str activation: hidden activation of the MLPs.
    :param float min_scale: floor on latent standard deviations.
    :param str variance: how the MLPs output the latent variances. ``"log"``: a log-variance,
        ``log v = NN_2(...)`` exactly as eq. 5.3 and 5.10 (with ``min_scale=0``; a positive
        ``min_scale`` adds a floor to the standard deviation ``exp(NN_2 / 2)``).
        ``"softplus"`` (default, a departure from eq. 5.10): standard deviation
        ``min_scale + softplus(NN_2(...))``, which cannot overflow and keeps the floor of
        thesis 4.8.1; the benchmark results in ``docs/benchmarks.rst`` use it. Both are
        tested against a reference written from the equations
        (``tests/models/test_reference_elbo.py``).
    :param emission_kwargs: passed to :func:`~pyro_seq.models.emission.make_emission`, e.g.
        ``num_components`` for ``likelihood="gmm"``.
    :param int input_dim: known input features per step, read by the deterministic layer with
        ``x_{t-1}`` (module docstring); 0 (default) is the model without inputs.
    """

    time_parallel = True
    guide_scan_particles = True
    weight_init_schemes = ("srnn", "normal")  #: the SRNN authors' initialisation (pyro_seq.nn.init)
    module_name = "srnn"
    small_example = example(d_dim=4, z_dim=2, hidden_dim=4)
    # d_{1:T} and its prior projection are the same in model and guide (eq. 5.1): a model
    # replayed against the guide's trace takes them from the guide (see models.base)
    shared_with_guide = ("d", "prior_context")
    shared_with_guide_modules = ("deterministic", "prior")

    def __init__(
        self,
        obs_dim: int,
        d_dim: int = 300,
        z_dim: int = 100,
        hidden_dim: int = 500,
        inference: str = "smoothing",
        residual: bool = True,
        likelihood: str = "bernoulli",
        activation: str = "clipped_leaky_relu",
        min_scale: float = 1e-3,
        variance: str = "softplus",
        input_dim: int = 0,
        **emission_kwargs: Any,
    ) -> None:
        super().__init__(obs_dim)
        self.input_dim = input_dim = validate_input_dim(input_dim)
        self.binary_observations = likelihood == "bernoulli"
        if inference not in ("smoothing", "filtering"):
            raise ValueError(f"inference must be 'smoothing' or 'filtering', got {inference!r}")
        self.z_dim, self.inference, self.residual = z_dim, inference, residual
        self.deterministic = ForwardRNN(obs_dim + input_dim, d_dim, cell="gru")
        self.prior = GaussianMLP(z_dim, d_dim, hidden_dim, z_dim, activation, min_scale, variance)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=True)
        self.emitter, self.likelihood = make_emission(
            likelihood, z_dim + d_dim, [hidden_dim], obs_dim, activation, **emission_kwargs
        )
        if inference == "smoothing":
            self.encoder: nn.Module = BackwardRNN(d_dim + obs_dim, d_dim, cell="gru")
        else:
            self.encoder = MLP(
                d_dim + obs_dim, [hidden_dim], d_dim, activation, activate_output=True
            )
        self.posterior = GaussianMLP(
            z_dim, d_dim, hidden_dim, z_dim, activation, min_scale, variance
        )

    @classmethod
    def for_data(cls, obs_dim: int, input_dim: int = 0, **options: Any) -> "SRNN":
        """An SRNN for ``obs_dim`` features and ``input_dim`` known inputs per step."""
        return cls(obs_dim, input_dim=input_dim, **options)

    def _deterministic_states(self, x, mask, inputs=None):
        """``d_{1:T}`` (eq. 5.1): ``(batch, T, d_dim)`` (zero after each sequence's end), from
        ``u_t = x_{t-1}``, or ``[x_{t-1}, k_t]`` with known ``inputs`` ``(batch, T, input_dim)``."""
        u = shift_right(x)
        if self.input_dim:
            u = torch.cat([u, inputs], -1)
        return self.deterministic(u, mask.sum(-1))

    # generative model: eq. 5.1, 5.3
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        d = state.shared.get("d")  # set by guide_init when both share a state (FIVO)
        if d is None:
            d = state.shared["d"] = self._deterministic_states(x, mask, state.shared.get("inputs"))
        if "prior_context" not in state.shared:
            state.shared["prior_context"] = self.prior.project_context(d)
        state["z"] = x.new_zeros(x.shape[0], self.z_dim)

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        loc_scale = prior_from_guide(state, t)
        if loc_scale is None and isinstance(t, slice) and state.guide_record is not None:
            # Res_q: the guide computed p(z_t | z_{t-1}, d_t) at every z_{t-1} of this history
            # z_0 = 0 unexpanded, as the guide recorded it (also under a particle plate)
            history = [x.new_zeros(x.shape[0], self.z_dim)] + state.replayed["z"][:-1]
            loc_scale = state.guide_record.steps_at("prior", history)
        if loc_scale is None:
            loc_scale = self.prior(
                state["z"],
                state.shared_at("prior_context", t),
                self._step_weights(state, "prior", t),
            )
        loc, scale = loc_scale
        z = self.sample_latent(state, "z", t, normal, (loc, scale), mask)
        self.observe(state, t, x, mask, cat_broadcast([z, state.shared_at("d", t)]))
        state["z"] = z

    # inference network: eq. 5.5, 5.7, 5.10, 5.12
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        d = state.shared["d"] = self._deterministic_states(x, mask, state.shared.get("inputs"))
        inputs = torch.cat([d, x], dim=-1)
        if self.inference == "smoothing":
            a = self.encoder(inputs, mask)
        else:
            a = self.encoder(inputs)
        state.shared["posterior_context"] = self.posterior.project_context(a)
        if self.residual:
            state.shared["prior_context"] = self.prior.project_context(d)
        state["guide_z"] = x.new_zeros(x.shape[0], self.z_dim)

    def _step_weights(self, state, name, t):
        """``getattr(self, name).step_weights()``, built once per sequence pass (kept in
        ``state.shared``) for per-step calls; None for a time-parallel call (one product)."""
        if isinstance(t, slice):
            return None
        key = f"{name}_step_weights"
        weights = state.shared.get(key)
        if weights is None:
            weights = state.shared[key] = getattr(self, name).step_weights()
        return weights

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        z_prev = state["guide_z"]
        loc, scale = self.posterior(
            z_prev,
            state.shared_at("posterior_context", t),
            self._step_weights(state, "posterior", t),
        )
        if self.residual:  # Res_q, eq. 5.12: residual to the prior mean at the guide's z_{t-1}
            prior = self.prior(
                z_prev, state.shared_at("prior_context", t), self._step_weights(state, "prior", t)
            )
            loc = loc + prior[0]
            # a model step sharing this state (FIVO) reuses p(z_t | z_{t-1}) at the same z_{t-1}
            cache_guide_prior(state, t, z_prev, prior)
            if state.guide_record is not None:  # and so does a time-parallel model run
                state.guide_record.append("prior", z_prev, prior)
        z = pyro.sample(f"z_{t + 1}", masked(dist.Normal(loc, scale).to_event(1), mask[:, t]))
        state["guide_z"] = z

    def _scannable(self) -> bool:
        """Whether :func:`~pyro_seq.nn.srnn_guide_scan` computes what :meth:`guide_step` does:
        its activation has a hand-written derivative and, with Res_q, the prior MLP has the
        posterior's activation, floor and variance mode (as the constructor makes them)."""
        post = self.posterior
        if activation_derivative(post.activation) is None:
            return False
        if not self.residual:
            return True
        prior = self.prior
        return (
            type(prior.activation) is type(post.activation)
            and prior.activation.extra_repr() == post.activation.extra_repr()
            and prior.head.min_scale == post.head.min_scale
            and prior.head.variance == post.head.variance
        )

    def guide_scan(
        self,
        state: SequenceState,
        x: torch.Tensor,
        mask: torch.Tensor,
        particles: Tuple[int, ...] = (),
    ) -> bool:
        """Every guide step at once (the full-sequence guide under plain handlers, e.g. inside
        ``Trace_ELBO``; see :mod:`pyro_seq.models.base`): the noise of all steps is drawn
        first, one ``Normal.rsample`` per step as the step loop draws it, then
        :func:`~pyro_seq.nn.srnn_guide_scan` runs the recursion of :meth:`guide_step`
        (eq. 5.10, 5.12) as one autograd node and the sites ``z_1..z_T`` are emitted with
        those values. With Res_q the prior at each guide ``z_{t-1}`` is recorded for the
        time-parallel model as the step loop records it. Values equal the step loop's for the
        same seed on every step up to each sequence's last observed one (past it, where no
        site is scored, ``z`` is the noise itself). Under a particle plate
        (``particles = (K, 1, ..., 1)``) the scan runs on ``K * batch`` rows (``z_0`` and the
        contexts repeated per particle)."""
        if not self._scannable():
            return False
        post, z0 = self.posterior, state["guide_z"]
        T = x.shape[1]
        lead = particles + z0.shape[:-1]  # (*particles, batch): each step's draw, as the loop's
        unit = torch.distributions.Normal(z0.new_zeros(()), z0.new_ones(()), validate_args=False)
        eps = torch.stack([unit.rsample(lead + z0.shape[-1:]) for _ in range(T)], -2)

        def rows(v):  # (..., F) per batch row -> (K * batch, ..., F)
            if not particles:
                return v
            return v.expand(particles + v.shape).reshape((-1,) + v.shape[1:])

        prior = None
        if self.residual:
            prior = (rows(state.shared["prior_context"]),) + tuple(self.prior.step_weights())
        out = srnn_guide_scan(
            rows(z0),
            eps.reshape((-1,) + eps.shape[-2:]),
            (rows(state.shared["posterior_context"]),) + tuple(post.step_weights()),
            prior,
            post.activation,
            post.head.min_scale,
            post.head.variance,
            # only the steps up to each row's last observed one are computed
            sequence_lengths(mask).expand(lead).reshape(-1),
        )
        out = tuple(v.reshape(lead + v.shape[1:]) for v in out)
        loc, scale, z = out[:3]
        zs = list(z.unbind(-2))  # the site values, also the z_{t-1} the record is keyed by
        self._emit_steps("z", normal, (loc, scale), zs, mask, PresampledValue, "drawn")
        if self.residual:
            priors = list(zip(out[3].unbind(-2), out[4].unbind(-2)))
            history = [z0] + zs[:-1]
            if state.guide_record is not None:
                for z_prev, p in zip(history, priors):
                    state.guide_record.append("prior", z_prev, p)
            cache_guide_prior(state, T - 1, history[-1], priors[-1])
        state["guide_z"] = zs[-1]
        return True

    @torch.no_grad()
    def generate(
        self, num_sequences: int, num_steps: int, inputs: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples (eq. 5.1): ``d_t = GRU(d_{t-1}, x_{t-1})`` (``[x_{t-1}, k_t]`` with
        known inputs), ``z_t ~ p``, ``x_t ~ p``.

        :param inputs: the known inputs ``k_{1:T}`` ``(num_sequences, num_steps, input_dim)``,
            required when ``input_dim > 0`` and refused otherwise (ValueError).
        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters per step.
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        h0 = self.deterministic.h0  # zeros on the model's device and in its dtype
        k = self.generate_inputs(inputs, num_sequences, num_steps, h0)
        x_prev = h0.new_zeros(num_sequences, 1, self.obs_dim)
        h = h0.expand(1, num_sequences, -1).contiguous()
        z = h0.new_zeros(num_sequences, self.z_dim)
        xs, params = [], []
        for t in range(num_steps):
            u = x_prev if k is None else torch.cat([x_prev, k[:, t : t + 1]], -1)
            d, h = self.deterministic.rnn(u, h)
            d = d[:, 0]
            loc, scale = self.prior(z, self.prior.project_context(d))
            z = torch.distributions.Normal(loc, scale).sample()
            p = self.emitter(cat_broadcast([z, d]))
            x = self.likelihood(p).sample()
            xs.append(x)
            params.append(p)
            x_prev = x.unsqueeze(1)
        return torch.stack(xs, 1), stack_params(params)
