r"""Generative temporal model with spatial memory (GTM-SM; thesis Ch. 7 and 4.7.1; Fraccaro et
al. 2018).

A sequence of ``T`` frames ``x_t`` and actions ``a_t`` is split at ``tau`` into a
*memorisation* phase ``t = 1..tau`` and a *prediction* phase ``t = tau+1..T`` (thesis 7.3).
Two latent variables per step: the agent's state (position) ``s_t`` of a state-space model
driven by the actions, and a frame encoding ``z_t`` of a VAE.

Generative model of the prediction phase, conditioned on the memory ``m`` (thesis eq. 7.1)::

    p(x, z, s | a, v) = prod_{t > tau} p(x_t | z_t) p(z_t | s_t, m) p(s_t | s_{t-1}, a_t)    (7.1)

* transition (eq. 7.3, image navigation with walls)::

      s_t = s_{t-1} + M a_t * sigma_d(s_{t-1} + M a_t) + eps_t,   eps_t ~ N(0, r^2 I)     (7.3)

  with ``M`` (``state_dim x num_actions``) learnt, ``r = 1e-3`` and ``sigma_d`` a small
  network with a sigmoid output that learns to cancel moves into walls (``walls=True``;
  ``walls=False`` is the linear ``s_t = s_{t-1} + M a_t + eps_t``). With ``rotation=True``
  (``state_dim = 3``, eq. 7.4) the displacement is turned by the heading
  ``R(s^{(3)}_{t-1}) M a_t``, and the memory keys are ``[s^{(1)}, s^{(2)}, cos s^{(3)},
  sin s^{(3)}]`` (thesis 7.7.2, without the optional linear layer);
* the VAE prior is a mixture over the ``K = 5`` memory entries nearest to ``s_t`` (image
  navigation, thesis 7.4.1 and 7.7.1)::

      p(z_t | s_t, m) = sum_k w_k N(z_t | mu^(k), diag sigma^(k)^2),
      w_k = (1 / (d_k^2 + delta)) / sum_j (1 / (d_j^2 + delta)),   delta = 1e-4

  where ``d_k`` is the Euclidean distance between (the key of) ``s_t`` and the k-th nearest
  stored state mean, and ``(mu^(k), sigma^(k))`` the stored statistics of ``q(z | x)`` of that
  entry;
* ``p(x_t | z_t)``: a decoder, Gaussian pixels with a fixed variance (natural images; default)
  or Bernoulli.

Memory, the past encoder (thesis 7.3.3). During the memorisation phase the model stores in a
:class:`~pyro_seq.nn.DND`, per step ``t <= tau``, the key ``E[s_t]`` and the value
``(mu_phi(x_t), sigma_phi(x_t))`` of the encoder ``q(z_t | x_t)``: sufficient statistics, not
samples (the thesis' choice; samples would add noise). The thesis approximates the filtering
posterior of ``s_t`` by ``p*(s_t) = int p(s_t | s_{t-1}, a_t) p*(s_{t-1}) ds_{t-1}``, the prior
marginal given the actions only: *no frame is used to infer s during memorisation* (7.3.2-7.3.3;
the landmark inference network of appendix 7.10 that does use frames is not implemented here).
Its moments are propagated as ``E[s_t] = f(E[s_{t-1}], a_t)`` (the noise-free transition) and
``Var[s_t] = t r^2 I`` from ``s_0 = 0``: exact for the linear transition, a linearisation of
the wall network otherwise (with ``r = 1e-3`` the difference is of order ``r^2``). Because
these statistics are deterministic functions of ``x_{1:tau}`` and ``a_{1:tau}``, ``init``
computes the whole memorisation phase and writes the ``tau`` entries in one batched append;
the steps ``t <= tau`` sample nothing.

Inference (thesis eq. 7.2)::

    q(z, s | x, a) = prod_{t > tau} q_phi(z_t | x_t) p_theta(s_t | s_{t-1}, a_t)           (7.2)

an encoder per frame and the *prior* transition for the states, started from
``p*(s_{tau}) ~= N(E[s_tau], tau r^2 I)``, so that the first prediction-phase state has
``s_{tau+1} ~ N(f(E[s_tau], a_{tau+1}), (tau + 1) r^2 I)``. As a Pyro model/guide pair the
model samples ``s_t`` and ``z_t`` and observes ``x_t`` at every prediction step; the guide
samples ``s_t`` from the same transition and ``z_t`` from the encoder. The ``s`` sites'
``log p - log q`` is then exactly 0 and the ELBO is the thesis' bound (sec. 7.3.4)::

    F = sum_{t > tau} E_q(z_t|x_t)[log p(x_t | z_t)]
                      - E_{p*(s_t)}[KL(q(z_t | x_t) || p(z_t | s_t, m))]

with the KL to the mixture estimated by the sample (it has no closed form). Memorisation steps
contribute nothing; padded steps (``mask``) neither.

Objectives. ``Trace_ELBO``, ``TraceMeanField_ELBO`` (it falls back to the sampled KL for the
mixture), :class:`~pyro_seq.infer.IWAE` and :class:`~pyro_seq.infer.FIVO` train it through
``loss=`` alone: the states are in ``state`` per particle (``state["s"]``, the guide's
``state["guide_s"]``), the memory in ``state.shared`` (it is the same for every particle,
since its keys are means), so FIVO's resampling is consistent. With the prior as proposal for
``s`` the FIVO weights are ``p(x_t | z_t) p(z_t | s_t, m) / q(z_t | x_t)``: resampling selects
positions whose memory explains the frame, which is what the landmark network of appendix 7.10
learns to do.

Actions. Either ``inputs=`` (``pack_actions=False``, the default): an int64 tensor ``(batch,
T)`` of action indices ``0..num_actions-1`` (turned into one-hot vectors here) or a float tensor
``(batch, T, num_actions)`` (one-hot, or any real action features: ``M a_t`` is linear in them);
or packed into the observations (``pack_actions=True``): ``x`` is ``(batch, T, F + num_actions)``
with the one-hot actions in the last ``num_actions`` columns, never scored as observations.
Packing is how :func:`pyro_seq.train.fit` and the command line, which pass ``(x, mask)`` only,
train a GTM-SM (:meth:`~pyro_seq.data.simulators.NavigationVideos.as_sequences` packs them).

``tau``: a model attribute (``GTMSM(tau=256)``, the thesis' image navigation; change it with
``model.tau = ...``), the same for every sequence of a batch. Training sequences have ``T >
tau`` steps (the thesis: 256 + 32); sequences whose real length is at most ``tau`` contribute
nothing. :meth:`GTMSM.predict` takes its own ``tau``. The bound is over the ``T - tau``
prediction steps, while :func:`pyro_seq.train.evaluate_bound` divides totals by every real step:
its "per step" numbers for a GTM-SM are per step of the whole sequence (multiply by
``T / (T - tau)`` for nats per predicted frame).
"""

import math

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn

from pyro_seq.models.base import SequenceModel, StepProgram, masked
from pyro_seq.models.emission import bernoulli_likelihood
from pyro_seq.nn import MLP, GaussianHead
from pyro_seq.nn.conv import FRAME_NETWORKS, frame_networks
from pyro_seq.nn.memory import DND
from pyro_seq.validation import positive_int

__all__ = ["GTMSM"]

#: Frame encoders/decoders of :class:`GTMSM` (``encoder=``); the thesis found MLPs enough.
ENCODERS = FRAME_NETWORKS
#: Pixel likelihoods of :class:`GTMSM` (``likelihood=``).
LIKELIHOODS = ("gaussian", "bernoulli")


class _ActionProgram(StepProgram):
    """The GTM-SM's programs: int action indices ``(batch, T)`` become one-hot ``inputs``;
    ``observed=`` is refused (missing frames in the memory are not modelled)."""

    def _validate(self, state, x, mask, observed, inputs=None):
        owner = self._owner
        if observed is not None:
            raise ValueError("GTMSM does not take observed= (missing frames are not modelled: "
                             "every memorisation step writes its frame into the memory)")
        if torch.is_tensor(inputs) and not inputs.is_floating_point() and owner.input_dim:
            inputs = owner.one_hot(inputs)
        return super()._validate(state, x, mask, observed, inputs)


class GTMSM(SequenceModel):
    r"""GTM-SM as a Pyro model/guide pair (equations in the module docstring).

    :param tuple frame_shape: ``(H, W)`` or ``(C, H, W)`` of the frames (``(8, 8)``); frames
        travel flattened, ``F = prod(frame_shape)`` values per step.
    :param int num_actions: size of the (one-hot) actions (5).
    :param int tau: length of the memorisation phase (256, thesis 7.4.1).
    :param int state_dim: size of ``s_t`` (2; 3 with ``rotation=True``).
    :param int z_dim: size of the frame encodings ``z_t`` (16, thesis 7.7.1).
    :param int num_neighbours: ``K`` entries read from the memory (5).
    :param float delta: ``delta`` of the mixture weights (1e-4).
    :param float transition_noise: ``r``, the standard deviation of ``eps_t`` (1e-3).
    :param bool walls: the wall network ``sigma_d`` of eq. 7.3 (True).
    :param bool rotation: the rotation of eq. 7.4 (needs ``state_dim=3``; False).
    :param int wall_hidden: hidden units of ``sigma_d`` (32); its output bias starts at 3, so
        ``sigma_d ~= 0.95`` (nearly linear) at initialisation.
    :param float init_displacement_std: ``M ~ N(0, std^2)`` at initialisation (0.5).
    :param str encoder: ``"mlp"`` (default) or ``"conv"`` (:mod:`pyro_seq.nn.conv`).
    :param tuple hidden_dims: MLP hidden layers ((256, 256)).
    :param int channels: conv filters (32); ``conv_layers`` (2): 8x8 frames become 2x2 maps.
    :param str likelihood: ``"gaussian"`` (fixed variance ``pixel_var``, default) or
        ``"bernoulli"``.
    :param float pixel_var: pixel variance of the Gaussian likelihood (0.01, ours).
    :param float min_scale: floor of the encoder's standard deviations (1e-3).
    :param bool pack_actions: actions are the last ``num_actions`` columns of ``x`` (True) or
        ``inputs=`` (False, default).
    """

    module_name = "gtmsm"
    latent_names = ("s", "z")

    def __init__(self, frame_shape=(8, 8), num_actions=5, tau=256, state_dim=2, z_dim=16,
                 num_neighbours=5, delta=1e-4, transition_noise=1e-3, walls=True, rotation=False,
                 wall_hidden=32, init_displacement_std=0.5, encoder="mlp", hidden_dims=(256, 256),
                 channels=32, conv_layers=2, likelihood="gaussian", pixel_var=0.01,
                 min_scale=1e-3, pack_actions=False):
        frame_shape = tuple(frame_shape)
        if len(frame_shape) not in (2, 3):
            raise ValueError(f"frame_shape must be (H, W) or (C, H, W), got {frame_shape!r}")
        frame_dim = math.prod(positive_int("frame_shape entry", s) for s in frame_shape)
        num_actions = positive_int("num_actions", num_actions)
        if not isinstance(pack_actions, bool):
            raise ValueError(f"pack_actions must be True or False, got {pack_actions!r}")
        super().__init__(frame_dim + (num_actions if pack_actions else 0))
        self.frame_shape, self.frame_dim = frame_shape, frame_dim
        self.num_actions, self.pack_actions = num_actions, pack_actions
        self.input_dim = 0 if pack_actions else num_actions
        self.tau = tau
        self.state_dim = positive_int("state_dim", state_dim)
        self.z_dim = positive_int("z_dim", z_dim)
        self.num_neighbours = positive_int("num_neighbours", num_neighbours)
        for name, value in (("delta", delta), ("transition_noise", transition_noise),
                            ("pixel_var", pixel_var)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        for name, flag in (("walls", walls), ("rotation", rotation)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if rotation and self.state_dim != 3:
            raise ValueError(f"rotation=True (eq. 7.4) needs state_dim=3, got {state_dim}")
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
        self.delta, self.r = float(delta), float(transition_noise)
        self.walls, self.rotation = walls, rotation
        self.key_dim = 4 if rotation else self.state_dim
        self.likelihood_name, self.pixel_scale = likelihood, math.sqrt(pixel_var)
        self.binary_observations = likelihood == "bernoulli"
        self.encoder_type = encoder

        Z = self.z_dim
        self.encoder_body, enc_out, self.decoder = frame_networks(
            encoder, frame_shape, Z, channels, conv_layers, hidden_dims)
        self.encoder_head = GaussianHead(enc_out, Z, min_scale)
        self.M = nn.Parameter(init_displacement_std * torch.randn(self.state_dim, num_actions))
        if walls:
            self.wall_net = MLP(self.state_dim, (wall_hidden,), 1, "relu")
            nn.init.constant_(self.wall_net[-1].bias, 3.0)
        else:
            self.wall_net = None
        self.register_buffer("s0", torch.zeros(self.state_dim))
        self.model = _ActionProgram(self, "model")
        self.guide = _ActionProgram(self, "guide")

    # ------------------------------------------------------------------ validation helpers

    def one_hot(self, actions):
        """Int action indices ``(batch, T)`` -> float one-hot ``(batch, T, num_actions)``.

        :raises ValueError: not 2-D, or an index outside ``0..num_actions-1``.
        """
        if actions.dtype == torch.bool or actions.dim() != 2:
            raise ValueError(f"integer actions must be indices of shape (batch, T), got "
                             f"{actions.dtype} {tuple(actions.shape)}")
        bad = (actions < 0) | (actions >= self.num_actions)
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"action index {int(actions[b, t])} at sequence {b}, step {t} is "
                             f"outside 0..{self.num_actions - 1}")
        dtype = self.M.dtype
        return nn.functional.one_hot(actions.long(), self.num_actions).to(dtype)

    def check_tau(self, num_steps, tau=None):
        """``tau`` (the attribute when None) as an int with ``1 <= tau < num_steps``."""
        tau = self.tau if tau is None else tau
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ValueError(f"tau must be a positive int, got {tau!r}")
        if tau >= num_steps:
            raise ValueError(f"tau={tau} memorisation steps leave no prediction step in "
                             f"sequences of T={num_steps} steps; use T > tau")
        return tau

    def _split(self, state, x):
        """``(frames (batch, T, F), actions (batch, T, num_actions))`` of a program's input."""
        frames = x[..., :self.frame_dim]
        if self.pack_actions:
            return frames, x[..., self.frame_dim:]
        return frames, state.shared["inputs"]

    # ------------------------------------------------------------------ building blocks

    def encode(self, frames):
        """``q(z_t | x_t)``: ``(loc, scale)``, each ``(..., z_dim)``, from ``(..., F)``."""
        return self.encoder_head(self.encoder_body(frames))

    def decode(self, z):
        """Decoder output ``(..., F)``: pixel means (Gaussian) or logits (Bernoulli)."""
        return self.decoder(z)

    def likelihood(self, params):
        """``p(x_t | z_t)`` from the decoder output, event dim 1."""
        if self.likelihood_name == "bernoulli":
            return bernoulli_likelihood(params)
        return dist.Normal(params, self.pixel_scale).to_event(1)

    def displacement(self, s_prev, a):
        """``M a_t`` (eq. 7.3), turned by ``R(s^{(3)}_{t-1})`` with ``rotation=True`` (eq. 7.4):
        ``(..., state_dim)`` from ``s_prev (..., state_dim)`` and ``a (..., num_actions)``."""
        d = a @ self.M.T
        if self.rotation:
            d = d.expand(torch.broadcast_shapes(d.shape, s_prev.shape))
            c, s = torch.cos(s_prev[..., 2]), torch.sin(s_prev[..., 2])
            d = torch.stack([c * d[..., 0] - s * d[..., 1], s * d[..., 0] + c * d[..., 1],
                             d[..., 2]], -1)
        return d

    def transition_mean(self, s_prev, a):
        """``f(s_{t-1}, a_t) = s_{t-1} + d_t sigma_d(s_{t-1} + d_t)`` (eq. 7.3; without walls
        ``s_{t-1} + d_t``), ``d_t`` from :meth:`displacement`. Shapes broadcast:
        ``(..., state_dim)``."""
        d = self.displacement(s_prev, a)
        if self.wall_net is not None:
            d = d * torch.sigmoid(self.wall_net(s_prev + d))
        return s_prev + d

    def key(self, s):
        """Memory key of a state: ``s`` itself, or ``[s1, s2, cos s3, sin s3]`` with rotation
        (thesis 7.7.2): ``(..., state_dim) -> (..., key_dim)``."""
        if not self.rotation:
            return s
        return torch.cat([s[..., :2], torch.cos(s[..., 2:3]), torch.sin(s[..., 2:3])], -1)

    def mean_path(self, actions, s_start=None):
        """``E[s_t] = f(E[s_{t-1}], a_t)`` for every step of ``actions (batch, n,
        num_actions)``, from ``s_start`` (default ``s_0 = 0``): ``(batch, n, state_dim)``."""
        s = self.s0.expand(actions.shape[:1] + (self.state_dim,)) if s_start is None else s_start
        out = []
        for a in actions.unbind(1):
            s = self.transition_mean(s, a)
            out.append(s)
        return torch.stack(out, 1)

    def write_memory(self, frames, actions):
        """The past encoder (thesis 7.3.3): a :class:`~pyro_seq.nn.DND` holding, for each of the
        ``n`` steps of ``frames (batch, n, F)`` and ``actions (batch, n, num_actions)``, the key
        ``key(E[s_t])`` and the value ``stack([mu_phi(x_t), sigma_phi(x_t)])`` ``(2, z_dim)``.

        :returns: ``(dnd, means)``: the memory and ``E[s_{1:n}]`` ``(batch, n, state_dim)``.
        """
        means = self.mean_path(actions)
        loc, scale = self.encode(frames)
        dnd = DND(self.key_dim).write(self.key(means), torch.stack([loc, scale], -2))
        return dnd, means

    def memory_prior(self, s, dnd):
        r"""``p(z_t | s_t, m)``: the mixture of the module docstring from the ``K`` nearest
        entries of ``dnd`` to ``key(s)``; ``s (..., batch, state_dim)`` ->
        :class:`~pyro.distributions.MixtureSameFamily` with batch shape ``(..., batch)`` and
        event shape ``(z_dim,)``. The mixture logits are ``-log(d_k^2 + delta)``."""
        read = dnd.read(self.key(s), self.num_neighbours)
        logits = -torch.log(read.squared_distances + self.delta)
        components = dist.Normal(read.values[..., 0, :], read.values[..., 1, :]).to_event(1)
        return dist.MixtureSameFamily(dist.Categorical(logits=logits), components)

    def _first_scale(self, tau, like):
        """``sqrt(tau + 1) r``: the first prediction step starts from ``p*(s_tau)``."""
        return like.new_tensor(self.r * math.sqrt(tau + 1))

    # ------------------------------------------------------------------ the step protocol

    def model_init(self, state, x, mask):
        frames, actions = self._split(state, x)
        tau = self.check_tau(x.shape[1])
        dnd, means = self.write_memory(frames[:, :tau], actions[:, :tau])
        state.shared["memory"], state.shared["actions"], state.shared["tau"] = dnd, actions, tau
        state["s"] = means[:, -1]

    def _sample_position(self, state, key, t, mask):
        """``s_t ~ p(s_t | s_{t-1}, a_t)`` (eq. 7.3; the guide's ``q(s_t | s_{t-1}, a_t)`` of eq.
        7.2 is the same density) from ``state[key]``, which it then holds; the first prediction
        step has the accumulated memorisation noise (:meth:`_first_scale`)."""
        tau = state.shared["tau"]
        s_prev = state[key]
        scale = self._first_scale(tau, s_prev) if t == tau else s_prev.new_tensor(self.r)
        loc = self.transition_mean(s_prev, state.shared_at("actions", t))
        s = pyro.sample(f"s_{t + 1}", masked(dist.Normal(loc, scale.expand(loc.shape)).to_event(1),
                               mask[:, t]))
        state[key] = s
        return s

    def model_step(self, state, t, x, mask):
        tau = state.shared["tau"]
        if t < tau:  # memorisation: written by init
            return
        s = self._sample_position(state, "s", t, mask)
        z = pyro.sample(f"z_{t + 1}", masked(self.memory_prior(s, state.shared["memory"]), mask[:, t]))
        frames = x[..., :self.frame_dim]
        pyro.sample(f"x_{t + 1}", masked(self.likelihood(self.decode(z)), mask[:, t]),
                    obs=frames[:, t])

    def guide_init(self, state, x, mask):
        frames, actions = self._split(state, x)
        tau = self.check_tau(x.shape[1])
        loc, scale = self.encode(frames[:, tau:])
        state.shared["q_loc"], state.shared["q_scale"] = loc, scale
        state.shared["actions"], state.shared["tau"] = actions, tau
        state["guide_s"] = self.mean_path(actions[:, :tau])[:, -1]

    def guide_step(self, state, t, x, mask):
        tau = state.shared["tau"]
        if t < tau:
            return
        self._sample_position(state, "guide_s", t, mask)
        q = dist.Normal(state.shared_at("q_loc", t - tau), state.shared_at("q_scale", t - tau))
        pyro.sample(f"z_{t + 1}", masked(q.to_event(1), mask[:, t]))

    # ------------------------------------------------------------------ prediction

    @torch.no_grad()
    def predict(self, frames, actions, tau=None, sample_states=False):
        r"""Long-term prediction (thesis Fig. 7.2d): memorise ``frames[:, :tau]``, then generate
        the frames of the steps ``t > tau`` from the actions only.

        The states follow the noise-free transition ``E[s_t] = f(E[s_{t-1}], a_t)`` (or, with
        ``sample_states=True``, one ancestral sample of eq. 7.3 from ``p*(s_tau)``), the
        encodings are the means of the memory prior, ``E[z_t | s_t, m] = sum_k w_k mu^(k)``, and
        the frames are decoded from them (Gaussian: the pixel means; Bernoulli: probabilities).

        :param frames: ``(batch, T, F)``.
        :param actions: int64 ``(batch, T)`` or float ``(batch, T, num_actions)``.
        :param int tau: memorisation steps (default ``self.tau``).
        :returns: dict with ``frames (batch, T - tau, F)``, ``z (batch, T - tau, z_dim)``,
            ``states (batch, T - tau, state_dim)`` and the memorised ``memory_states (batch,
            tau, state_dim)``.
        """
        if not actions.is_floating_point():
            actions = self.one_hot(actions)
        frames = frames.to(self.M.dtype)
        if frames.dim() != 3 or frames.shape[-1] != self.frame_dim:
            raise ValueError(f"frames must be (batch, T, {self.frame_dim}), got {tuple(frames.shape)}")
        if actions.shape != frames.shape[:2] + (self.num_actions,):
            raise ValueError(f"actions of shape {tuple(actions.shape)} do not match frames "
                             f"{tuple(frames.shape)}")
        tau = self.check_tau(frames.shape[1], tau)
        dnd, means = self.write_memory(frames[:, :tau], actions[:, :tau])
        s = means[:, -1]
        states, zs = [], []
        for i, a in enumerate(actions[:, tau:].unbind(1)):
            loc = self.transition_mean(s, a)
            if sample_states:
                scale = self.r * math.sqrt(tau + 1) if i == 0 else self.r
                loc = loc + scale * torch.randn_like(loc)
            s = loc
            prior = self.memory_prior(s, dnd)
            w = prior.mixture_distribution.probs
            zs.append((w.unsqueeze(-1) * prior.component_distribution.base_dist.loc).sum(-2))
            states.append(s)
        z = torch.stack(zs, 1)
        out = self.decode(z)
        if self.likelihood_name == "bernoulli":
            out = torch.sigmoid(out)
        return {"frames": out, "z": z, "states": torch.stack(states, 1), "memory_states": means}
