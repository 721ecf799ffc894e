"""Variational recurrent neural network (thesis 4.4.2; Chung et al. 2015).

Generative model (thesis eq. 4.16, with the inputs ``u_t = x_{t-1}`` of Chung et al.)::

    d_t = f(d_{t-1}, [phi_x(x_{t-1}), phi_z(z_{t-1})])        d_0 = 0, z_0 = 0, x_0 = 0
    z_t ~ p(z_t | d_t)  = N(mu^(p)_t, diag(sigma^(p)_t^2)),  [mu^(p)_t, sigma^(p)_t] = NN^(p)(d_t)
    x_t ~ p(x_t | z_t, d_t),  parameters NN^(x)([phi_z(z_t), d_t])

``f`` is an LSTM or GRU cell (``d_t`` is the cell's output ``h``; an LSTM also carries its
memory cell ``c_t``), ``phi_x`` and ``phi_z`` are the feature extractors of Chung et al. (MLPs;
``phi_z`` is shared by the recurrence and the emission, as in their eq. 6-7) and the
emission is built by :func:`~pyro_seq.models.emission.make_emission`. The deterministic
transition ``p(d_t | z_{t-1}, d_{t-1}, u_t)`` of eq. 4.16 is a delta function, so the joint
density of ``(x, z)`` is ``prod_t p(x_t | z_t, d_t) p(z_t | d_t)``.

Index convention. Chung et al. (2015, eq. 1, 5-7) write ``h_t = f(phi_x(x_t), phi_z(z_t),
h_{t-1})`` and condition the prior, the emission and the posterior of step ``t`` on
``h_{t-1}``. With ``d_t := h_{t-1}`` this is exactly the recursion above: ``d_{t+1} =
f(d_t, [phi_x(x_t), phi_z(z_t)])``, and every step-``t`` distribution reads ``d_t``. The only
difference is the start: Chung et al. set ``h_0 = 0``, i.e. ``d_1 = 0``, whereas the thesis
form used here sets ``d_0 = 0, z_0 = 0, x_0 = 0`` and computes ``d_1 = f(0, [phi_x(0),
phi_z(0)])``, a learned constant (equivalent to Chung et al. with a learned ``h_0``).

Known inputs (``input_dim > 0``; the programs' ``inputs=`` ``(batch, T, input_dim)``, written
``k_t`` here since ``u_t`` is the input of eq. 4.16). Eq. 4.16 conditions step ``t`` on ``u_t``
through the recurrence ``d_t = f(d_{t-1}, z_{t-1}, u_t)``, and that is the one place the known
inputs enter: ``u_t = [x_{t-1}, k_t]``, i.e.

    d_t = f(d_{t-1}, [phi_x(x_{t-1}), phi_z(z_{t-1}), k_t])       (d_1 reads k_1)

so the prior ``p(z_t | d_t)``, the emission ``p(x_t | z_t, d_t)`` and the posterior
``q(z_t | c_t, d_t)`` of step ``t`` depend on ``k_{1:t}`` through ``d_t``; no other network
reads them, except the smoothing guide's backward RNN, which reads ``[x_t, k_t]`` (``a_t`` then
summarises ``x_{t:T}`` and ``k_{t:T}``, as thesis eq. 4.5-4.6). In Chung et al.'s indices this
is ``h_{t-1} = f(h_{t-2}, phi_x(x_{t-1}), phi_z(z_{t-1}), k_t)``: the input of step ``t`` enters
the state that step ``t`` reads: the prior and the posterior of step ``t`` condition on the
same variables (``x_{<t}``, ``z_{<t}``, ``k_{1:t}``, and ``x_t`` for the posterior) as when
``k_t`` is fed to the prior, the encoder and the recurrence of step ``t`` separately, with one
network reading it instead of three, and the emission of ``x_t`` sees ``k_t`` too.
``input_dim=0`` is the model above, unchanged.

Inference network (thesis eq. 4.17): ``q(z_{1:T} | x) = prod_t q(z_t | c_t, d_t)`` with the
same ``d_t`` as the model (computed from the guide's own samples ``z_{<t}``):

* ``inference="filtering"`` (Chung et al. eq. 9; thesis Algorithm 1): ``c_t = phi_x(x_t)``;
* ``inference="smoothing"`` (Goyal et al. 2017, thesis 4.5): ``c_t = a_t`` with a backward RNN
  ``a_t = g(a_{t+1}, x_t)``, ``a_{T+1} = 0``, run over each sequence's own length, so that
  ``q(z_t)`` sees ``x_{t:T}``.

``[mu^(q)_t, sigma^(q)_t] = NN^(q)([d_t, c_t])``. The bound is (thesis 4.4.2)

    F = E_q[ sum_t log p(x_t | z_t, d_t) + log p(z_t | d_t) - log q(z_t | c_t, d_t) ].

Where ``d_t`` lives (step protocol of :mod:`pyro_seq.models.base`). ``d_t`` depends on the
sampled ``z_{<t}``, so it is per-particle state (``(batch, d_dim)``; ``(K or 1, batch, d_dim)``
under :class:`~pyro_seq.infer.FIVO`, which resamples it with the particles; never in
``state.shared``). Each program keeps its own copy of the *next* deterministic state: after
sampling ``z_t`` a step computes ``d_{t+1}`` and stores it (model: ``state["d"]``, guide:
``state["guide_d"]``; LSTM memory cells under ``"c"`` / ``"guide_c"``), so step ``t`` reads
``d_t`` from the history only, as the ordering rule requires (the guide runs first and only
reads the history). When model and guide share one state (FIVO), the guide's step leaves its
``phi_z(z_t)`` and ``d_{t+1}`` in ``state.shared``, and the model step reuses them if it sampled
the same ``z_t`` from the same ``d_t`` (checked), so the recurrence runs once per step.

Time-parallel scoring (:mod:`pyro_seq.models.base`). Inside a Pyro ELBO the model is replayed
against the guide's trace, so every ``z_t`` is fixed and ``d_{1:T}`` follow from them; the guide
computed exactly these states at exactly these samples. The model then takes them from the
guide's record (``shared_with_guide``; recomputed with the recurrence when the weights changed
in between or the values are not the guide's) and evaluates the prior, ``phi_z`` and the
emission once over all steps, emitting the same per-step sites as the step loop (tested against
it in float64: log-densities, ELBO and gradients, also under IWAE's particle plate).

Defaults. Chung et al. (2015) report speech and handwriting only; for polyphonic music the
VRNN was trained by Maddison et al. (2017, FIVO; the application the thesis cites for
particle-filter bounds), whose piano-roll configuration sets every size to the latent size 64
(LSTM state, one hidden layer in each MLP, the encoded ``phi_x``/``phi_z`` features) with ReLU
activations (``latent_size=64`` in their code, whose sizes default to it). Those are the
defaults here (``cell="lstm"``, as both papers use). Departure: latent standard deviations are
``min_scale + softplus(NN)`` with ``min_scale = 1e-3`` (the floor of thesis 4.8.1, as in
:class:`~pyro_seq.models.SRNN`), where Maddison et al. use ``softplus(NN + 0.25)`` without a
floor; so no scale reaches 0 and no log-density becomes NaN.
"""

from typing import Any, Optional, Sequence, Tuple

import pyro
import torch
import torch.nn as nn

from pyro_seq.models.base import (
    SequenceModel,
    Step,
    masked,
    normal,
    on_real_steps,
    stack_time,
)
from pyro_seq.models.contract import example
from pyro_seq.models.emission import check_emission_options, make_emission, stack_params
from pyro_seq.nn import MLP, BackwardRNN, GaussianHead, GaussianMLP, cat_broadcast
from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import positive_int, validate_generate_args, validate_input_dim

__all__ = ["VRNN"]

CELLS = {"gru": nn.GRUCell, "lstm": nn.LSTMCell}


class Recurrence(nn.Module):
    """The deterministic transition ``d_t = f(d_{t-1}, u)`` with a GRU or LSTM cell.

    ``hidden`` is a tuple: ``(d,)`` for a GRU, ``(d, c)`` for an LSTM. Inputs and states may have
    any leading shape (particles, batch); they are broadcast against each other, flattened for
    torch's cell and reshaped back.

    Shapes: ``forward(u (..., input_dim), hidden (..., hidden_dim) each) -> hidden``.
    """

    def __init__(self, input_dim: int, hidden_dim: int, cell: str) -> None:
        super().__init__()
        self.cell_type = cell
        self.cell = CELLS[cell](input_dim, hidden_dim)
        self.hidden_dim = hidden_dim

    def initial(self, like: torch.Tensor, batch_shape: Sequence[int]) -> Tuple[torch.Tensor, ...]:
        """``d_0 = 0`` (and ``c_0 = 0``) of shape ``batch_shape + (hidden_dim,)``."""
        zeros = like.new_zeros(tuple(batch_shape) + (self.hidden_dim,))
        return (zeros, zeros) if self.cell_type == "lstm" else (zeros,)

    def forward(
        self, inputs: torch.Tensor, hidden: Sequence[torch.Tensor]
    ) -> Tuple[torch.Tensor, ...]:
        lead = broadcast_shapes(inputs.shape[:-1], *(h.shape[:-1] for h in hidden))
        flat_in = inputs.expand(lead + inputs.shape[-1:]).reshape(-1, inputs.shape[-1])
        flat_h = [h.expand(lead + h.shape[-1:]).reshape(-1, self.hidden_dim) for h in hidden]
        if self.cell_type == "lstm":
            out = self.cell(flat_in, (flat_h[0], flat_h[1]))
        else:
            out = (self.cell(flat_in, flat_h[0]),)
        return tuple(o.reshape(lead + (self.hidden_dim,)) for o in out)


def _same(a, b):
    return a is b or (a.shape == b.shape and torch.equal(a, b))


class VRNN(SequenceModel):
    """Variational RNN as a Pyro model/guide pair (see the module docstring for the equations).

    :param int obs_dim: observation size ``D``.
    :param int d_dim: size of the recurrent state ``d_t`` (LSTM/GRU units); 64.
    :param int z_dim: latent size; 64.
    :param int hidden_dim: hidden units of the one hidden layer of every MLP (``phi_x``,
        ``phi_z``, prior, posterior, emission); 64.
    :param int feature_dim: output size of ``phi_x`` and ``phi_z``; 64.
    :param str inference: ``"filtering"`` (Chung et al., default) or ``"smoothing"`` (backward
        RNN of size ``d_dim``, Goyal et al.).
    :param str cell: ``"lstm"`` (default, as Chung et al.) or ``"gru"``: the recurrence ``f``
        and the backward RNN of the smoothing guide.
    :param str likelihood: ``"bernoulli"`` or ``"gaussian"`` (any name
        :func:`~pyro_seq.models.emission.make_emission` accepts).
    :param str activation: hidden activation of the MLPs (``"relu"``, as both papers).
    :param float min_scale: floor on the latent standard deviations.
    :param str variance: ``"softplus"`` (std ``min_scale + softplus(NN)``) or ``"log"`` (``NN`` is
        the log-variance, std ``min_scale + exp(NN / 2)``), as :class:`~pyro_seq.models.SRNN`.
    :param emission_kwargs: passed on to ``make_emission`` (e.g. ``num_components=`` for a
        mixture likelihood where ``make_emission`` supports it); an option that neither VRNN
        nor ``make_emission`` accepts raises ``TypeError`` naming it. Bad values raise
        ``ValueError``.
    :param int input_dim: known input features per step ``k_t``, read by the recurrence ``f``
        (and the smoothing guide's backward RNN; module docstring); 0 (default): no inputs.

    ``x`` is ``(batch, T, obs_dim)``, ``mask`` ``(batch, T)``, with ``input_dim > 0`` also
    ``inputs=`` ``(batch, T, input_dim)``; see :mod:`pyro_seq.models.base`.
    """

    module_name = "vrnn"
    small_example = example(d_dim=4, z_dim=2, hidden_dim=4, feature_dim=4)
    #: a replayed model scores every step at once (module docstring, "Time-parallel scoring")
    time_parallel = True
    #: ``phi_x(x_{1:T})`` and, through the guide's record, ``d_{1:T}`` (``models.base``,
    #: "Sharing with the guide")
    shared_with_guide = ("phi_x",)
    shared_with_guide_modules = ("phi_x", "phi_z", "recurrence")

    def __init__(
        self,
        obs_dim: int,
        d_dim: int = 64,
        z_dim: int = 64,
        hidden_dim: int = 64,
        feature_dim: int = 64,
        inference: str = "filtering",
        cell: str = "lstm",
        likelihood: str = "bernoulli",
        activation: str = "relu",
        min_scale: float = 1e-3,
        variance: str = "softplus",
        input_dim: int = 0,
        **emission_kwargs: Any,
    ) -> None:
        super().__init__(obs_dim)
        self.input_dim = input_dim = validate_input_dim(input_dim)
        d_dim, z_dim = positive_int("d_dim", d_dim), positive_int("z_dim", z_dim)
        hidden_dim = positive_int("hidden_dim", hidden_dim)
        feature_dim = positive_int("feature_dim", feature_dim)
        if inference not in ("filtering", "smoothing"):
            raise ValueError(f"inference must be 'filtering' or 'smoothing', got {inference!r}")
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {sorted(CELLS)}, got {cell!r}")
        self.binary_observations = likelihood == "bernoulli"
        self.d_dim, self.z_dim, self.inference, self.cell = d_dim, z_dim, inference, cell
        # feature extractors phi_x, phi_z (Chung et al. eq. 6-7, 9)
        self.phi_x = MLP(obs_dim, [hidden_dim], feature_dim, activation, activate_output=True)
        self.phi_z = MLP(z_dim, [hidden_dim], feature_dim, activation, activate_output=True)
        self.recurrence = Recurrence(2 * feature_dim + input_dim, d_dim, cell)  # eq. 4.16, f
        self.prior = nn.Sequential(  # p(z_t | d_t)
            MLP(d_dim, [], hidden_dim, activation, activate_output=True),
            GaussianHead(hidden_dim, z_dim, min_scale, variance),
        )
        emission_args = (likelihood, feature_dim + d_dim, [hidden_dim], obs_dim, activation)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=True)
        self.emitter, self.likelihood = make_emission(*emission_args, **emission_kwargs)  # p(x|z,d)
        if inference == "smoothing":
            self.encoder = BackwardRNN(obs_dim + input_dim, d_dim, cell=cell)  # a_t, [x_t, k_t]
            context_dim = d_dim
        else:
            context_dim = feature_dim  # c_t = phi_x(x_t)
        self.posterior = GaussianMLP(
            d_dim, context_dim, hidden_dim, z_dim, activation, min_scale, variance
        )  # q(z_t | c_t, d_t)

    @classmethod
    def for_data(cls, obs_dim: int, input_dim: int = 0, **options: Any) -> "VRNN":
        """A VRNN for ``obs_dim`` features and ``input_dim`` known inputs per step."""
        return cls(obs_dim, input_dim=input_dim, **options)

    # ----------------------------------------------------------------- shared pieces
    def _hidden_keys(self, prefix):
        return (prefix + "d", prefix + "c") if self.cell == "lstm" else (prefix + "d",)

    def _read_hidden(self, state, prefix):
        return tuple(state[k] for k in self._hidden_keys(prefix))

    def _write_hidden(self, state, prefix, hidden):
        for k, h in zip(self._hidden_keys(prefix), hidden):
            state[k] = h

    def _first_hidden(self, like, num_sequences, k_1=None):
        """``d_1 = f(d_0, [phi_x(x_0), phi_z(z_0)])`` with ``d_0, x_0, z_0 = 0``: ``(B, d_dim)``;
        with known inputs ``f(d_0, [phi_x(x_0), phi_z(z_0), k_1])``, ``k_1`` ``(B, input_dim)``."""
        u = torch.cat(
            [
                self.phi_x(like.new_zeros(1, self.obs_dim)),
                self.phi_z(like.new_zeros(1, self.z_dim)),
            ],
            dim=-1,
        )
        if self.input_dim:
            u = cat_broadcast([u, k_1])
        hidden = self.recurrence(u, self.recurrence.initial(like, (1,)))
        return tuple(h.expand(num_sequences, -1) for h in hidden)

    def _input_at(self, state, t):
        """The known input ``k_{t+1}`` (0-based step ``t``) ``(batch, input_dim)``, or None."""
        return state.shared_at("inputs", t) if self.input_dim else None

    def _features_x(self, state, x):
        """``phi_x(x_t)`` for every step, ``(batch, T, feature_dim)``, computed once per state."""
        phi_x = state.shared.get("phi_x")
        if phi_x is None:
            phi_x = state.shared["phi_x"] = self.phi_x(x)
        return phi_x

    def _next_hidden(self, state, t, phi_z, hidden):
        """``d_{t+1} = f(d_t, [phi_x(x_t), phi_z(z_t)])``, and ``k_{t+1}`` appended with known
        inputs (1-based indices: the 0-based step ``t`` reads ``x[:, t]`` and
        ``inputs[:, t + 1]``)."""
        parts = [state.shared_at("phi_x", t), phi_z]
        if self.input_dim:
            parts.append(self._input_at(state, t + 1))
        return self.recurrence(cat_broadcast(parts), hidden)

    # ----------------------------------------------------------------- generative model
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        self._features_x(state, x)  # set by guide_init when both share a state (FIVO)
        self._write_hidden(state, "", self._first_hidden(x, x.shape[0], self._input_at(state, 0)))
        state["z"] = x.new_zeros(x.shape[0], self.z_dim)  # z_0 = 0, the latent history's start

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        if isinstance(t, slice):
            self._model_all_steps(state, x, mask)
            return
        hidden = self._read_hidden(state, "")
        d = hidden[0]
        z = self.sample_latent(state, "z", t, normal, self.prior(d), mask)
        last = t + 1 == x.shape[1]
        cached = self._from_guide(state, t, z, hidden)
        phi_z = self.phi_z(z) if cached is None else cached[0]
        self.observe(state, t, x, mask, cat_broadcast([phi_z, d]))
        if not last:
            nxt = self._next_hidden(state, t, phi_z, hidden) if cached is None else cached[1]
            self._write_hidden(state, "", nxt)
        state["z"] = z

    def _model_all_steps(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        """Every model step at once, when a replay fixes ``z_{1:T}`` (time-parallel scoring of
        :mod:`pyro_seq.models.base`): the deterministic states ``d_{1:T}`` then follow from
        ``z_{<t}``, and the guide computed them at the very same samples; they are taken from its
        record (:meth:`~pyro_seq.models.base.GuideRecord.steps_at`), or else recomputed with the
        recurrence step by step. The prior, ``phi_z`` and the emission then run once over all
        steps (the real ones for the prior and the emission), and one site per step is emitted
        as in the step loop."""
        zs = state.replayed["z"]
        # z_{0:T-1}; z_0 = 0 unexpanded, as the guide's record holds it (also under particles)
        history = [x.new_zeros(x.shape[0], self.z_dim)] + zs[:-1]
        hidden = None
        if state.guide_record is not None:
            hidden = state.guide_record.steps_at("hidden", history)
        z = stack_time(zs)
        phi_z = self.phi_z(z)  # phi_z(z_t) for every step, (..., B, T, feature_dim)
        if hidden is None:
            hidden = self._recurrence_over(state, x, phi_z)
        d = hidden[0]
        loc, scale = on_real_steps(self.prior, d, mask)
        self.sample_latent(state, "z", slice(None), normal, (loc, scale), mask)
        self.observe(state, slice(None), x, mask, cat_broadcast([phi_z, d]))

    def _recurrence_over(self, state, x, phi_z):
        """``d_{1:T}`` (and LSTM cells) for the latent path with features ``phi_z(z_{1:T})``,
        stacked with time at dim -2: ``d_1`` from the zero start, then ``d_{t+1} = f(d_t,
        [phi_x(x_t), phi_z(z_t)])``."""
        hidden = self._read_hidden(state, "")  # d_1 from model_init
        steps = [hidden]
        phi_z_steps = phi_z.unbind(-2)
        for t in range(x.shape[1] - 1):
            hidden = self._next_hidden(state, t, phi_z_steps[t], hidden)
            steps.append(hidden)
        return tuple(stack_time(list(h)) for h in zip(*steps))

    @staticmethod
    def _from_guide(state, t, z, hidden):
        """``(phi_z(z_t), d_{t+1})`` from the guide step that ran on this state (FIVO), when it
        sampled this ``z_t`` from the same ``d_t``; None otherwise."""
        cached = state.shared.pop("_guide_step", None)
        if cached is None or cached[0] != t or not _same(cached[1], z):
            return None
        if len(cached[2]) != len(hidden) or not all(_same(a, b) for a, b in zip(cached[2], hidden)):
            return None
        return cached[3], cached[4]

    # ----------------------------------------------------------------- inference network
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        phi_x = self._features_x(state, x)
        if self.inference == "smoothing":
            seen = torch.cat([x, state.shared["inputs"]], -1) if self.input_dim else x
            context = self.encoder(seen, mask)  # a_t from [x_t, k_t]
        else:
            context = phi_x
        state.shared["posterior_context"] = self.posterior.project_context(context)
        self._write_hidden(
            state, "guide_", self._first_hidden(x, x.shape[0], self._input_at(state, 0))
        )
        state["guide_z"] = x.new_zeros(x.shape[0], self.z_dim)  # z_0 = 0

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        hidden = self._read_hidden(state, "guide_")
        if state.guide_record is not None:  # a time-parallel model run reuses d_t at z_{t-1}
            state.guide_record.append("hidden", state["guide_z"], hidden)
        loc, scale = self.posterior(hidden[0], state.shared_at("posterior_context", t))
        z = pyro.sample(f"z_{t + 1}", masked(normal(loc, scale), mask[:, t]))
        state["guide_z"] = z
        if t + 1 < x.shape[1]:
            phi_z = self.phi_z(z)
            nxt = self._next_hidden(state, t, phi_z, hidden)
            self._write_hidden(state, "guide_", nxt)
            # a model step on the same state (FIVO) reuses phi_z(z_t) and d_{t+1}
            state.shared["_guide_step"] = (t, z, hidden, phi_z, nxt)

    # ----------------------------------------------------------------- sampling
    @torch.no_grad()
    def generate(
        self, num_sequences: int, num_steps: int, inputs: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples of eq. 4.16: ``z_t ~ p(z_t | d_t)``, ``x_t ~ p(x_t | z_t, d_t)``,
        ``d_{t+1} = f(d_t, [phi_x(x_t), phi_z(z_t)])`` (``k_{t+1}`` appended with known inputs).

        :param inputs: the known inputs ``k_{1:T}`` ``(num_sequences, num_steps, input_dim)``,
            required when ``input_dim > 0`` and refused otherwise (ValueError).
        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters per step (Bernoulli logits, or a ``(loc, scale)`` pair).
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        like = next(self.parameters())
        k = self.generate_inputs(inputs, num_sequences, num_steps, like)
        hidden = self._first_hidden(like, num_sequences, None if k is None else k[:, 0])
        xs, params = [], []
        for t in range(num_steps):
            d = hidden[0]
            loc, scale = self.prior(d)
            z = torch.distributions.Normal(loc, scale).sample()
            phi_z = self.phi_z(z)
            p = self.emitter(torch.cat([phi_z, d], dim=-1))
            x = self.likelihood(p).sample()
            xs.append(x)
            params.append(p)
            if t + 1 < num_steps:  # d_{t+1}, read by the next step only
                parts = [self.phi_x(x), phi_z] + ([] if k is None else [k[:, t + 1]])
                hidden = self.recurrence(torch.cat(parts, dim=-1), hidden)
        return torch.stack(xs, 1), stack_params(params)
