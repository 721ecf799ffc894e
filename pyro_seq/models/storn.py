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

**Time-parallel runs.** The recognition RNN reads ``x`` only, so ``q(z_t | x_{1:t})`` does
not depend on earlier samples: the full-sequence guide draws every ``z_t`` at once
(:func:`draw_recognition`, under plain handlers such as ``Trace_ELBO``); with every ``z_t``
fixed (the model replayed against the guide) the generating RNN's inputs
:math:`[x_{t-1}, z_t]` are known and it runs once over the sequence
(:meth:`StepRNN.sequence`), and both priors are scored in one batch (the Wiener factor
:math:`\mathcal{N}(z_t; z_{t-1}, I)` at the stacked history :math:`z_{0:T-1}`). Particle methods
(FIVO) and any handler that may change sample values run the step loop, the reference path;
``time_parallel = False`` (on the class or an instance) forces it for model and guide.

**Defaults.** The paper selects sizes by random search (its supplementary does not give
them); the defaults here are those of the package's SRNN music setting (RNN 300, z 100, emission
MLP with one hidden layer of 500). The paper's RNN is the simple recurrent net of eq. (2),
trained with fast dropout; ``cell="tanh"`` (default) is eq. (2) with :math:`f_h = \tanh`,
``cell="gru"`` a GRU. The prior defaults to STORN's white noise N(0, I) (the later versions;
``prior="wiener"`` is the Wiener process of sec. 3.3 and 4, "For priors, we use a Wiener
process", the default of :class:`~pyro_seq.models.vosp.VOSP` and
:class:`~pyro_seq.models.vrae.VRAE`).

**Dropout.** The paper trains its networks with fast dropout (Bayer et al. 2013, after Wang &
Manning 2013: a Gaussian approximation that propagates each unit's mean and variance; its
supplementary uses rate 0.1 on the inputs, hidden and output units). Fast dropout is not
implemented; ``dropout=p`` applies standard (inverted) dropout with probability ``p`` in its place
(:class:`~pyro_seq.nn.TrainingDropout`): on the observations fed to the recognition RNN, on the
:math:`x_{t-1}` fed to the generating RNN (never on the :math:`x_t` scored by the likelihood,
nor on :math:`z_t`) and on the hidden layer of the emission MLP (:func:`~pyro_seq.nn.emission_dropout`).
Each pass draws one mask per network input over all steps (the step loop, the time-parallel
path and :meth:`STORN.generate` apply it at the same places). It acts in training mode only:
in ``eval()`` mode the model is exactly the model without dropout, so bounds must be computed
in ``eval()`` mode (as :func:`pyro_seq.train.evaluate_bound` and
:func:`pyro_seq.infer.estimate_log_likelihood` do).
"""

from typing import Any, Callable, Optional, Tuple, cast

import pyro
import torch
import torch.nn as nn
from pyro.distributions.torch_distribution import TorchDistribution
from torch.autograd.function import once_differentiable

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
from pyro_seq.nn import (
    GaussianHead,
    TrainingDropout,
    cat_broadcast,
    check_dropout,
    emission_dropout,
)
from pyro_seq.nn.ragged import pack_ragged, previous_rows, step_offsets
from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import positive_int, validate_generate_args

__all__ = [
    "PRIORS",
    "CELLS",
    "STORN",
    "StepRNN",
    "RecognitionScan",
    "draw_recognition",
    "latent_prior",
    "white_noise",
]

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


def draw_recognition(
    model: SequenceModel,
    state: SequenceState,
    mask: torch.Tensor,
    particles: Tuple[int, ...] = (),
) -> bool:
    r"""Every guide site ``z_1..z_T`` at once from the per-step Gaussians
    :math:`q(z_t | x) = \mathcal{N}(\mu_t, \mathrm{diag}\, \sigma_t^2)` that ``guide_init``
    left in ``state.shared["q_loc"]``, ``["q_scale"]`` ``(batch, T, Z)``: the
    :meth:`~pyro_seq.models.base.SequenceModel.guide_scan` of STORN, VOSP and VRAE, whose
    recognition models do not read earlier samples (Bayer & Osendorfer (2014), sec. 3.1-3.2),
    and of the VAE-RNN, whose ``q(z_t | x_t, d_t)`` does not either (thesis eq. 4.15).

    The noise is drawn as the step loop draws it, one ``(batch, Z)`` standard normal per step
    in step order, and ``z_t = mu_t + eps_t sigma_t`` as ``Normal.rsample`` forms it, so the
    values equal the step loop's for the same seed; the sites carry log-densities computed in
    one batch (:meth:`~pyro_seq.models.base.SequenceModel.sample_presampled`). Under a
    vectorised particle plate (``particles = (K, 1, ..., 1)``) each step's draw is
    ``(*particles, batch, Z)``, as the step loop draws it there, and the sites have that batch
    shape. Returns False (the step loop runs) when ``model.time_parallel`` is off.
    """
    if not model.time_parallel:
        return False
    loc, scale = state.shared["q_loc"], state.shared["q_scale"]
    if particles:  # the per-step Gaussians as the particle plate expands them
        loc, scale = loc.expand(*particles, *loc.shape), scale.expand(*particles, *scale.shape)
    step_shape = loc.shape[:-2] + loc.shape[-1:]
    eps = torch.stack([loc.new_empty(step_shape).normal_() for _ in range(loc.shape[-2])], -2)
    model.sample_presampled("z", normal, (loc, scale), loc + eps * scale, mask)
    return True


class RecognitionScan:
    """Mixin of the sequence models whose guide draws every ``z_t`` from per-step Gaussians
    that read no earlier sample (``guide_init`` leaves them in ``state.shared["q_loc"]`` and
    ``["q_scale"]``): STORN, VOSP and VRAE (Bayer & Osendorfer (2014), sec. 3.1-3.2) and the
    VAE-RNN (thesis eq. 4.15). Their
    :meth:`~pyro_seq.models.base.SequenceModel.guide_scan` is :func:`draw_recognition`, also
    under a vectorised particle plate. List it before ``SequenceModel`` among the bases."""

    guide_scan_particles = True

    def guide_scan(
        self,
        state: SequenceState,
        x: torch.Tensor,
        mask: torch.Tensor,
        particles: Tuple[int, ...] = (),
    ) -> bool:
        """All guide steps at once (:func:`draw_recognition`)."""
        return draw_recognition(cast(SequenceModel, self), state, mask, particles)


class _RaggedTanhRNN(torch.autograd.Function):
    """Eq. (2) over the real steps of a ragged batch, forward and hand-written backward."""

    @staticmethod
    def forward(ctx, u, h0, w_ih, w_hh, bias, lengths):
        N, T, _ = u.shape
        order, counts, index = pack_ragged(lengths, T)
        up = u.reshape(N * T, -1).index_select(0, index)  # (R, I) packed real rows
        out = torch.addmm(bias, up, w_ih.t())  # W_ih u_t + b for every real step at once
        h, w_hh_t, start = h0.index_select(0, order), w_hh.t(), 0
        for n in counts:  # rows still running are a prefix of the sorted batch
            rows = out[start : start + n]
            h = rows.addmm_(h[:n], w_hh_t).tanh_()
            start += n
        ctx.save_for_backward(up, h0, w_ih, w_hh, out, order, index)
        ctx.counts, ctx.shape = counts, (N, T)
        padded = out.new_zeros(N * T, w_hh.shape[0])
        return padded.index_copy_(0, index, out).view(N, T, -1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        up, h0, w_ih, w_hh, out, order, index = ctx.saved_tensors
        counts, (N, T) = ctx.counts, ctx.shape
        H = out.shape[1]
        dpre = grad_out.reshape(N * T, H).index_select(0, index)  # becomes dL/d(pre-tanh)
        offsets = step_offsets(counts)
        dh = None
        for t in range(len(counts) - 1, -1, -1):  # per step only the recurrent product
            rows, h = dpre[offsets[t] : offsets[t + 1]], out[offsets[t] : offsets[t + 1]]
            if dh is not None:
                rows[: dh.shape[0]] += dh
            rows.mul_(1 - h * h)
            dh = rows @ w_hh
        d_u = d_h0 = None
        if ctx.needs_input_grad[1]:  # rows of length 0 (no real step) get no gradient
            d_h0 = torch.zeros_like(h0)
            if dh is not None:
                d_h0.index_copy_(0, order[: dh.shape[0]], dh)
        if not counts:
            d_w = torch.zeros_like(w_hh)
            return None, d_h0, torch.zeros_like(w_ih), d_w, w_hh.new_zeros(w_hh.shape[0]), None
        h0s = h0.index_select(0, order)
        hprev = previous_rows(h0s, out, counts)
        if ctx.needs_input_grad[0]:
            d_u = dpre.new_zeros(N * T, up.shape[1]).index_copy_(0, index, dpre @ w_ih)
            d_u = d_u.view(N, T, -1)
        return d_u, d_h0, dpre.t() @ up, dpre.t() @ hprev, dpre.sum(0), None


class StepRNN(nn.Module):
    r"""A recurrent cell :math:`h_t = f(h_{t-1}, u_t)` run one step at a time or over a sequence.

    ``cell="tanh"``: :math:`h_t = \tanh(W_{in} u_t + b_{in} + W_{rec} h_{t-1} + b_{rec})`, the
    simple RNN of Bayer & Osendorfer (2014), eq. (2) (torch's ``nn.RNN`` layout, two biases);
    ``cell="gru"``: torch's GRU (Cho et al. 2014). The same weights serve :meth:`step`
    (particle methods, per-particle ``h``) and :meth:`sequence` (all steps at once when the
    inputs are known).

    Shapes: ``step(u (..., I), h (..., H)) -> (..., H)``;
    ``sequence(u (..., T, I), h0 (..., H), lengths (..., )) -> (..., T, H)``; leading dims
    broadcast.
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
        shape = broadcast_shapes(u.shape[:-1], h.shape[:-1])
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

    def sequence(
        self, u: torch.Tensor, h0: torch.Tensor, lengths: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Every step at once from ``h0``; with ``lengths`` (each >= 1, broadcast against the
        leading dims) the outputs at and after a sequence's length are not computed: zero
        (``"tanh"`` on CPU) or the recursion continued over the padding (otherwise); the real
        steps are those of :meth:`step`.

        ``"tanh"`` on CPU runs only the real steps, with a hand-written backward pass: per step
        one ``(n_t, H) x (H, H)`` product (the recurrent gradient), the weight gradients one
        product over all real steps (instead of two small products and an accumulation per
        step). ``"gru"``, and ``"tanh"`` on other devices (cuDNN), run torch's RNN over the
        padded batch.
        """
        shape = broadcast_shapes(u.shape[:-2], h0.shape[:-1])
        T = u.shape[-2]
        inputs = u.expand(shape + u.shape[-2:]).reshape(-1, T, u.shape[-1])
        init = h0.expand(shape + h0.shape[-1:]).reshape(-1, h0.shape[-1])
        r = self.rnn
        if self.cell == "tanh" and u.device.type == "cpu":
            if lengths is None:
                n = torch.full((inputs.shape[0],), T, dtype=torch.long, device=u.device)
            else:
                n = lengths.long().expand(shape).reshape(-1)
            names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
            w_ih, w_hh, b_ih, b_hh = (cast(torch.Tensor, getattr(r, name)) for name in names)
            out = _RaggedTanhRNN.apply(inputs, init, w_ih, w_hh, b_ih + b_hh, n)
        else:
            out, _ = r(inputs, init.unsqueeze(0).contiguous())
        return out.reshape(shape + (T, self.hidden_dim))


class STORN(RecognitionScan, SequenceModel):
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
    :param float dropout: probability ``0 <= p < 1`` of standard dropout in training mode, the
        stand-in for the paper's fast dropout (module docstring): on the recognition RNN's
        inputs ``x_t``, the generating RNN's inputs ``x_{t-1}`` and the emission MLP's hidden
        layer. 0 (default): none. Evaluate in ``eval()`` mode.
    :param emission_kwargs: passed on to ``make_emission`` (e.g. ``num_components``).

    ``x`` is ``(batch, T, obs_dim)``, ``mask`` ``(batch, T)``; see
    :mod:`pyro_seq.models.base` for the step protocol. State: ``state["h"]`` (``h_{t-1}``) and
    ``state["z"]`` (``z_{t-1}``) per particle; ``state.shared`` holds ``u_t = x_{t-1}`` (after
    dropout) and the recognition parameters of every step.
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
        self.decoder = StepRNN(obs_dim + z_dim, rnn_dim, cell)
        check_emission_options(type(self).__name__, emission_kwargs, takes_inputs=False)
        emitter, self.likelihood = make_emission(
            likelihood, rnn_dim, [emission_dim], obs_dim, activation, **emission_kwargs
        )
        self.emitter = emission_dropout(emitter, self.dropout)
        self.input_dropout = TrainingDropout(self.dropout)
        self.encoder = StepRNN(obs_dim, rnn_dim, cell)
        self.recognition = GaussianHead(rnn_dim, z_dim, min_scale, variance)

    # generative model: h_t = f(h_{t-1}, [x_{t-1}, z_t]), x_t ~ p(x_t | h_t)
    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        state.shared["u"] = self.input_dropout(shift_right(x))  # x_{t-1} (after dropout)
        state["h"] = x.new_zeros(x.shape[0], self.rnn_dim)
        state["z"] = x.new_zeros(x.shape[0], self.z_dim)

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        z = self.sample_latent(state, "z", t, self.prior_dist, (state["z"],), mask)
        inputs = cat_broadcast([state.shared_at("u", t), z])
        if isinstance(t, slice):  # every z_t known (replayed): the RNN runs once over all steps
            h = self.decoder.sequence(inputs, state["h"], mask.sum(-1))
        else:
            h = self.decoder.step(inputs, state["h"])
        self.observe(state, t, x, mask, h)
        state["h"], state["z"] = h, z

    # recognition model q(z_t | x_{1:t})
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        u = self.input_dropout(x)
        a = self.encoder.sequence(u, x.new_zeros(x.shape[0], self.rnn_dim), mask.sum(-1))
        state.shared["q_loc"], state.shared["q_scale"] = self.recognition(a)

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        loc, scale = state.shared_at("q_loc", t), state.shared_at("q_scale", t)
        pyro.sample(f"z_{t + 1}", masked(normal(loc, scale), mask[:, t]))

    @torch.no_grad()
    def generate(self, num_sequences: int, num_steps: int) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples: ``z_t ~ p(z_t|z_{t-1})``, ``h_t = f(h_{t-1}, [x_{t-1}, z_t])``,
        ``x_t ~ p(x_t | h_t)`` (in training mode with ``dropout`` on ``x_{t-1}`` and the
        emission's hidden layer, as in scoring).

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
            h = self.decoder.step(torch.cat([self.input_dropout(x), z], -1), h)
            p = self.emitter(h)
            x = self.likelihood(p).sample()
            xs.append(x)
            params.append(p)
        return torch.stack(xs, 1), stack_params(params)
