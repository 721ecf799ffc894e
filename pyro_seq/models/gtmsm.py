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
``inference="landmark"``, below, uses the frames as in thesis appendix 7.10). Its moments are propagated as ``E[s_t] = f(E[s_{t-1}], a_t)`` (the noise-free transition) and
``Var[s_t] = t r^2 I`` from ``s_0 = 0``: exact for the linear transition, a linearisation of
the wall network otherwise (with ``r = 1e-3`` the difference is of order ``r^2``). Because
these statistics are deterministic functions of ``x_{1:tau}`` and ``a_{1:tau}``, ``init``
computes the whole memorisation phase and writes the ``tau`` entries in one batched append;
the steps ``t <= tau`` sample nothing.

Inference (``inference="prior"``, the default; thesis eq. 7.2)::

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

Landmark inference (``inference="landmark"``, thesis appendix 7.10 and Fig. 7.5). When the
transition cannot know where the agent really went (obstacles at random places, sec. 7.10.1),
the states are inferred with the frames too::

    q(z, s | x, a, v) = prod_{t > tau} q_phi(z_t | x_t) q_phi(s_t | s_{t-1}, a_t, z_t, m)

with ``q_phi(s_t | ...) = N(mu_q, diag sigma_q^2)`` merging the statistics ``(mu_p,
sigma_p^2)`` of the prior ``p(s_t | s_{t-1}, a_t)`` with those ``(mu_k, sigma_k^2)`` of ``K'``
states retrieved from a *reversed* DND, whose keys are frame encodings and whose values are the
states' means and variances, queried with the current frame's encoding at ``z``-space distances
``delta^(k)`` (:meth:`~pyro_seq.models.gtmsm_parts.GTMSMMemories.landmark_merge`)::

    mu_q = mu_p + sum_k beta_k (mu_k - mu_p),        beta_k = sigmoid(g(delta^(k))) in [0, 1]
    log sigma_q^2 = log sigma_p^2 + NN(delta^(1:K'), sigma^2_(1:K'), sigma_p^2)

Our reading of what the appendix leaves open:

* the memory's frame encodings (keys) and the query are the encoder means ``mu_phi(x_t)``, the
  sufficient statistics the thesis stores (7.3; it names them by the variable ``z``), not a
  sample of ``z_t``: the query is then the same in both phases, and a repeated frame is at
  distance exactly 0;
* memorisation (``t <= tau``): the reversed DND grows, ``m_{1:t-1}`` at step ``t`` (the
  ``q*`` of the appendix); each step merges the prior statistics propagated from the last
  step's, ``(f(E[s_{t-1}], a_t), Var[s_{t-1}] + r^2)``, then writes ``(mu_phi(x_t), (E[s_t],
  Var[s_t]))`` (:meth:`~pyro_seq.models.gtmsm_parts.GTMSMMemories.landmark_path`). At
  ``t = 1`` it is empty and the statistics are the prior's; with ``beta = 0`` and ``NN = 0``
  they are those of ``p*`` above. The model's memory is keyed by these means (the past
  encoder is the landmark network), and its first prediction step is ``N(f(E[s_tau],
  a_{tau+1}), Var[s_tau] + r^2)``;
* prediction (``t > tau``): the guide samples ``s_t`` from the merge of ``(f(s_{t-1}, a_t),
  r^2)`` (at ``t = tau + 1``: the model's first-step statistics) with the reads of the
  reversed DND of the ``tau`` memorised steps (it does not grow further: the memory ``m`` of
  the model is fixed after ``tau``). The reads need only ``mu_phi(x_t)`` and are done for all
  steps at once in ``guide_init``; per particle only ``mu_p = f(s_{t-1}, a_t)`` changes.

The bound gains the states' KL term of the appendix (the ``s`` sites' ``log p - log q`` is no
longer 0)::

    F = sum_{t > tau} E[log p(x_t | z_t)] - E_{q*(s_t)}[KL(q(z_t | x_t) || p(z_t | s_t, m))]
                      - E_{q*(s_{t-1})}[KL(q(s_t | s_{t-1}, a_t, z_t, m) || p(s_t | s_{t-1}, a_t))]

``beta``'s output bias starts at -9 (``beta_k ~= 1e-4``) and ``NN``'s output layer at 0, so a
new landmark GTM-SM starts close to the prior-only one: with ``r = 1e-3`` moving the mean of
``q(s_t | ...)`` by ``u`` away from the transition's costs about ``(u / r)^2 / 2`` nats of KL per
dimension, and a larger start (e.g. -3, ``beta_k ~= 0.05`` toward arbitrary entries) made the
initial bound of a ``tau = 256`` model some 100 times the prior-only one (ours, 4 sequences). The ``beta_k`` are not normalised (as
in the thesis): two retrieved entries that both match with ``beta ~= 1`` move the mean past
them, which training has to avoid (or use ``landmark_neighbours=1``).

Learning the states (ours; ``benchmarks/gtmsm_learning.py``, docs "benchmarks"). Trained as
the thesis describes (one rate, ``M`` free, ``K = 5``) on our image navigation, the states do
not become positions: the moves settle on one axis or on a count of moves, and the wall network
does not learn the walls (about 30% of the steps push into a wall). Three options make a GTM-SM
learn positional states from a random start, and they are the defaults
(``displacements="inverse_pairs", neighbour_warmup="all"`` i.e. ``(tau, 20)``,
``wall_lr_multiplier=10``): with them, trained 40 epochs on 1000 navigation sequences, the
mean absolute pixel error of the prediction 200 steps after ``tau`` was 0.061 against 0.27 for
the SRNN and 0.28 for the VRNN (Fraccaro (2018), Fig. 7.2d; docs "benchmarks", GTM-SM
long-term prediction). The thesis's literal settings stay one option away:
``displacements="free", neighbour_warmup=None, wall_lr_multiplier=1`` (the preset
``gtmsm_navigation_thesis``).

* ``displacements="inverse_pairs"``: ``down = -up`` and ``right = -left`` by construction.
  Any two independent columns then make the states an affine map of the positions, so what is
  left to learn is the walls; a free ``M`` must also learn exact inverses, and a mismatch of a
  tenth of a cell drifts the states by cells over 256 steps. (``"conformal"`` keeps the rows of
  ``M`` orthonormal up to a scale; it stops the one-axis collapse of
  :meth:`~pyro_seq.models.gtmsm_parts.GTMSMTransition.displacement_matrix` but not the drift.)
* ``neighbour_warmup``: the mixture prior reads every memory entry at first, so that matching
  frames far apart in state space pull their states together; ``K`` then falls to 5.
* ``wall_lr_multiplier=10``: the wall network learns the walls at 1e-2, not at 1e-3, while
  ``M`` keeps the base rate (with ``M`` at 10x too, one pair of moves shrinks before the walls
  are learnt).

Objectives. ``Trace_ELBO``, ``TraceMeanField_ELBO`` (it falls back to the sampled KL for the
mixture), :class:`~pyro_seq.infer.IWAE` and :class:`~pyro_seq.infer.FIVO` train it through
``loss=`` alone: the states are in ``state`` per particle (``state["s"]``, the guide's
``state["guide_s"]``), the memory in ``state.shared`` (it is the same for every particle,
since its keys are means), so FIVO's resampling is consistent. With the prior as proposal for
``s`` the FIVO weights are ``p(x_t | z_t) p(z_t | s_t, m) / q(z_t | x_t)``: resampling selects
positions whose memory explains the frame, which is what the landmark network of appendix 7.10
learns to do; with ``inference="landmark"`` the weights also hold ``p(s_t | s_{t-1}, a_t) /
q(s_t | s_{t-1}, a_t, z_t, m)`` (the landmark reads are in ``state.shared``, the same for
every particle).

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
nothing, and a batch made only of them (``T <= tau``) gives a bound of exactly 0 with zero
gradients (:meth:`GTMSM.pad_short_batch`). :meth:`GTMSM.predict` takes its own ``tau``. The
bound is over the ``T - tau`` prediction steps, while :func:`pyro_seq.train.evaluate_bound`
divides totals by every real step: its "per step" numbers for a GTM-SM are per step of the
whole sequence (multiply by ``T / (T - tau)`` for nats per predicted frame).
"""

import math
from types import MappingProxyType
from typing import Any, Optional, Sequence, Tuple, Union, cast

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro.distributions.torch_distribution import TorchDistribution

from pyro_seq.models.base import SequenceModel, masked
from pyro_seq.models.contract import example
from pyro_seq.models.emission import bernoulli_likelihood
from pyro_seq.models.gtmsm_inputs import ActionProgram, GTMSMInputs
from pyro_seq.models.gtmsm_parts import (
    DISPLACEMENTS,
    ENCODERS,
    INFERENCES,
    LIKELIHOODS,
    GTMSMMemories,
    GTMSMMemory,
    GTMSMTransition,
)
from pyro_seq.models.gtmsm_parts import conformal_matrix as conformal_matrix
from pyro_seq.models.gtmsm_parts import warmup_value as warmup_value
from pyro_seq.models.gtmsm_prediction import GTMSMPrediction
from pyro_seq.nn import MLP, GaussianHead
from pyro_seq.nn.conv import frame_networks
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import positive_int, square_frame_shape

__all__ = ["GTMSM", "GTMSMMemory"]


class GTMSM(GTMSMInputs, GTMSMTransition, GTMSMMemories, GTMSMPrediction, SequenceModel):
    r"""GTM-SM as a Pyro model/guide pair (equations in the module docstring).

    Two inference networks for the states (``inference=``): the prior transition of thesis
    eq. 7.2 (default), or the landmark network of thesis appendix 7.10, which also infers the
    positions from the frames through a reversed DND (needed where the transition cannot tell
    where the agent went, e.g. the obstacles of sec. 7.10.1).

    :param tuple frame_shape: ``(H, W)`` or ``(C, H, W)`` of the frames (``(8, 8)``); frames
        travel flattened, ``F = prod(frame_shape)`` values per step.
    :param int num_actions: size of the (one-hot) actions (5).
    :param int tau: length of the memorisation phase (256, thesis 7.4.1): a positive int, at
        least ``num_neighbours`` (the memory holds ``tau`` entries; :meth:`check_tau`).
    :param int state_dim: size of ``s_t`` (2; 3 with ``rotation=True``).
    :param int z_dim: size of the frame encodings ``z_t`` (16, thesis 7.7.1).
    :param int num_neighbours: ``K`` entries read from the memory (5; at most ``tau``).
    :param float delta: ``delta`` of the mixture weights (1e-4).
    :param float transition_noise: ``r``, the standard deviation of ``eps_t`` (1e-3).
    :param bool walls: the wall network ``sigma_d`` of eq. 7.3 (True).
    :param bool rotation: the rotation of eq. 7.4 (needs ``state_dim=3``; False).
    :param int wall_hidden: hidden units of ``sigma_d`` (32); its output layer starts with zero
        weights and bias 3, so ``sigma_d = sigmoid(3) ~= 0.95`` everywhere at initialisation (a
        linear transition with ``M`` scaled by 0.95).
    :param float init_displacement_std: ``M ~ N(0, std^2)`` at initialisation (0.5).
    :param str displacements: how ``M`` is parametrised. ``"free"`` (the thesis): any
        ``state_dim x num_actions`` matrix. ``"conformal"`` (ours): ``M = alpha Q^T`` with
        ``Q^T Q = I`` (:func:`conformal_matrix`), so that ``M`` maps the actions onto the states
        by a rotation and one scale ``alpha > 0``: the state axes cannot collapse onto one line
        (``M`` has rank ``state_dim``), which the free ``M`` does when trained on image
        navigation (see
        :meth:`~pyro_seq.models.gtmsm_parts.GTMSMTransition.displacement_matrix`). The true
        displacements of a grid with
        square cells (up = -down, left = -right, orthogonal and of equal length, stay = 0) are
        conformal. Starts at ``alpha = init_displacement_std sqrt(num_actions)`` (the expected
        row norm of the free start) and a random ``Q``. Not with ``rotation=True``.
        ``"inverse_pairs"`` (default, ours): the actions of each pair in ``inverse_actions``
        undo each other, ``M[:, j] = -M[:, i]`` for ``(i, j)``; the other columns are free and start at
        0. A round trip then returns to the same state exactly, which a free ``M`` only
        approaches (a mismatch of a tenth of a cell drifts the states by cells over 256 steps).
        The default because a free ``M`` did not learn positional states (module docstring).
    :param neighbour_warmup: ``(K_0, epochs)``, ``"all"`` (default: ``(tau, 20)`` with the
        current ``tau``) or None (the thesis: ``K = num_neighbours`` throughout). Training only
        (ours):
        the mixture prior reads ``K_0 <= tau`` memory entries in the first epoch (e.g. ``tau``:
        all of them), falling geometrically to ``num_neighbours`` over ``epochs`` epochs
        (:meth:`training_epoch`, called by :func:`pyro_seq.train.fit`). With the ``K = 5``
        nearest entries only, a memorised frame that matches the current one but sits far away
        in state space sends no gradient, and the states settle on one axis or on a count of
        moves (``benchmarks/gtmsm_learning.py``); with every entry in the mixture, matching
        frames pull their states together from anywhere. Evaluation (``model.eval()``) and
        :meth:`predict` always use ``num_neighbours``. A training loop other than ``fit`` calls
        :meth:`training_epoch` before each epoch (else the first epoch's ``K_0`` stays).
    :param float displacement_lr_multiplier: factor on the learning rate of ``M``'s parameters
        in :func:`pyro_seq.train.fit` (``lr_multipliers``; 1, the thesis' single rate; 0
        freezes ``M``, e.g. at known displacements).
    :param float wall_lr_multiplier: the same for the wall network (10, ours; 1: the thesis'
        single rate). It learns the walls at 10x (1e-2) and not at 1e-3
        (``benchmarks/gtmsm_learning.py``).
    :param tuple inverse_actions: pairs ``(i, j)`` of action indices for
        ``displacements="inverse_pairs"`` (``((0, 1), (2, 3))``: up/down, left/right of
        :data:`pyro_seq.data.simulators.navigation.ACTIONS`).
    :param str encoder: ``"mlp"`` (default) or ``"conv"`` (:mod:`pyro_seq.nn.conv`).
    :param tuple hidden_dims: MLP hidden layers ((256, 256)).
    :param int channels: conv filters (32); ``conv_layers`` (2): 8x8 frames become 2x2 maps.
    :param str likelihood: ``"gaussian"`` (fixed variance ``pixel_var``, default) or
        ``"bernoulli"``.
    :param float pixel_var: pixel variance of the Gaussian likelihood (0.01, ours).
    :param float min_scale: floor of the encoder's standard deviations (1e-3).
    :param bool pack_actions: actions are the last ``num_actions`` columns of ``x`` (True) or
        ``inputs=`` (False, default).
    :param str inference: the states' inference network: ``"prior"`` (default; the prior
        transition, thesis eq. 7.2, with ``p*`` in the past encoder, sec. 7.3.3) or
        ``"landmark"`` (thesis appendix 7.10: a posterior ``q(s_t | s_{t-1}, a_t, z_t, m)`` that
        merges the prior's statistics with those of the states retrieved from a reversed DND
        keyed by frame encodings, in the memorisation phase and the prediction phase; see
        "Landmark inference" in the module docstring and
        :meth:`~pyro_seq.models.gtmsm_parts.GTMSMMemories.landmark_merge`).
    :param int landmark_neighbours: ``K'``, entries read from the reversed DND (5; the thesis
        gives no value, this is its ``K`` of 7.7.1). Only with ``inference="landmark"``.
    :param int landmark_hidden: hidden units of the landmark networks ``beta`` and ``NN`` (32).
    """

    module_name = "gtmsm"
    s0: torch.Tensor  #: buffer ``(state_dim,)``: the start state
    latent_names = ("s", "z")
    tasks = frozenset()
    impute_methods = ()
    small_example = example(
        obs_dim=4,
        input_dim=5,
        length=6,
        tau=3,
        num_neighbours=3,
        z_dim=2,
        hidden_dims=[5],
        wall_hidden=4,
    )
    unsupported = MappingProxyType(
        dict(
            SequenceModel.unsupported,
            generate="a GTM-SM predicts frames from a memory of observed frames and actions; use "
            "GTMSM.predict(frames, actions) (tutorials/spatial_memory.py)",
            impute="a GTM-SM predicts the frames after its memorisation phase; use "
            "GTMSM.predict(frames, actions)",
            denoise="a GTM-SM has no per-frame denoising path; use GTMSM.predict(frames, actions)",
            forecast="a GTM-SM forecasts from its memory with GTMSM.predict(frames, actions)",
        )
    )

    def __init__(
        self,
        frame_shape: Sequence[int] = (8, 8),
        num_actions: int = 5,
        tau: int = 256,
        state_dim: int = 2,
        z_dim: int = 16,
        num_neighbours: int = 5,
        delta: float = 1e-4,
        transition_noise: float = 1e-3,
        walls: bool = True,
        rotation: bool = False,
        wall_hidden: int = 32,
        init_displacement_std: float = 0.5,
        encoder: str = "mlp",
        hidden_dims: Sequence[int] = (256, 256),
        channels: int = 32,
        conv_layers: int = 2,
        likelihood: str = "gaussian",
        pixel_var: float = 0.01,
        min_scale: float = 1e-3,
        pack_actions: bool = False,
        inference: str = "prior",
        landmark_neighbours: int = 5,
        landmark_hidden: int = 32,
        displacements: str = "inverse_pairs",
        inverse_actions: Sequence[Tuple[int, int]] = ((0, 1), (2, 3)),
        neighbour_warmup: Union[str, Tuple[int, int], None] = "all",
        displacement_lr_multiplier: float = 1.0,
        wall_lr_multiplier: float = 10.0,
    ) -> None:
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
        self.state_dim = positive_int("state_dim", state_dim)
        self.z_dim = positive_int("z_dim", z_dim)
        self.num_neighbours = positive_int("num_neighbours", num_neighbours)
        if neighbour_warmup is not None and neighbour_warmup != "all":
            if not (isinstance(neighbour_warmup, (tuple, list)) and len(neighbour_warmup) == 2):
                raise ValueError(
                    f"neighbour_warmup must be (K_0, epochs), 'all' or None, got "
                    f"{neighbour_warmup!r}"
                )
            neighbour_warmup = (
                positive_int("neighbour_warmup K_0", neighbour_warmup[0]),
                positive_int("neighbour_warmup epochs", neighbour_warmup[1]),
            )
        self.neighbour_warmup = neighbour_warmup
        self.warmup_epoch = 0  # the epoch of the neighbour warm-up (training_epoch)
        self.tau = tau  # validated by the property's setter
        self.check_tau()  # K <= tau: the memory holds tau entries
        #: names of the parameters that make up ``M``
        #: (:meth:`~pyro_seq.models.gtmsm_parts.GTMSMTransition.displacement_matrix`)
        self.displacement_params = {
            "free": ("M",),
            "conformal": ("M_direction", "M_log_scale"),
            "inverse_pairs": ("M_pairs", "M_other"),
        }.get(displacements, ())
        self.lr_multipliers = {}
        for option, factor, names in (
            ("displacement_lr_multiplier", displacement_lr_multiplier, self.displacement_params),
            ("wall_lr_multiplier", wall_lr_multiplier, ("wall_net",)),
        ):
            if (
                isinstance(factor, bool)
                or not isinstance(factor, (int, float))
                or not (factor >= 0 and math.isfinite(factor))
            ):
                raise ValueError(f"{option} must be a finite number >= 0, got {factor!r}")
            if factor != 1:
                self.lr_multipliers.update({name: float(factor) for name in names})
        for name, value in (
            ("delta", delta),
            ("transition_noise", transition_noise),
            ("pixel_var", pixel_var),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (value > 0 and math.isfinite(value))
            ):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        for name, flag in (("walls", walls), ("rotation", rotation)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if rotation and self.state_dim != 3:
            raise ValueError(f"rotation=True (eq. 7.4) needs state_dim=3, got {state_dim}")
        if not isinstance(displacements, str) or displacements not in DISPLACEMENTS:
            raise ValueError(f"displacements must be one of {DISPLACEMENTS}, got {displacements!r}")
        if displacements == "conformal" and (rotation or self.state_dim > num_actions):
            raise ValueError(
                "displacements='conformal' needs rotation=False and state_dim <= "
                f"num_actions, got rotation={rotation}, state_dim={self.state_dim}, "
                f"num_actions={num_actions}"
            )
        std = init_displacement_std
        if (
            isinstance(std, bool)
            or not isinstance(std, (int, float))
            or not (std > 0 and math.isfinite(std))
        ):
            raise ValueError(f"init_displacement_std must be a positive finite number, got {std!r}")
        self.displacements = displacements
        pairs = tuple(tuple(pair) for pair in inverse_actions)
        flat = [i for pair in pairs for i in pair]
        if displacements == "inverse_pairs" and (
            not pairs
            or any(len(pair) != 2 for pair in pairs)
            or len(set(flat)) != len(flat)
            or not all(isinstance(i, int) and 0 <= i < num_actions for i in flat)
        ):
            raise ValueError(
                "inverse_actions must be disjoint pairs (i, j) of action indices in "
                f"0..{num_actions - 1}, got {inverse_actions!r}; name the pairs of actions "
                "that undo each other, or use displacements='free' (the thesis's M)"
            )
        self.inverse_actions = pairs
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
        if not isinstance(inference, str) or inference not in INFERENCES:
            raise ValueError(f"inference must be one of {INFERENCES}, got {inference!r}")
        self.inference = inference
        self.landmark_neighbours = positive_int("landmark_neighbours", landmark_neighbours)
        landmark_hidden = positive_int("landmark_hidden", landmark_hidden)
        self.delta, self.r = float(delta), float(transition_noise)
        self.walls, self.rotation = walls, rotation
        self.key_dim = 4 if rotation else self.state_dim
        self.likelihood_name, self.pixel_scale = likelihood, math.sqrt(pixel_var)
        self.binary_observations = likelihood == "bernoulli"
        self.encoder_type = encoder

        Z = self.z_dim
        self.encoder_body, enc_out, self.decoder = frame_networks(
            encoder, frame_shape, Z, channels, conv_layers, hidden_dims
        )
        self.encoder_head = GaussianHead(enc_out, Z, min_scale)
        start = init_displacement_std * torch.randn(self.state_dim, num_actions)
        if displacements == "free":
            self.M = nn.Parameter(start)
        elif displacements == "inverse_pairs":
            firsts = [i for i, _ in pairs]
            self.other_actions = [a for a in range(num_actions) if a not in flat]
            self.M_pairs = nn.Parameter(start[:, firsts])
            # the other actions (stay) start without displacement: a random one makes every
            # "stay" move the state, a clock that the pairs cannot undo
            self.M_other = nn.Parameter(torch.zeros(self.state_dim, len(self.other_actions)))
        else:
            self.M_direction = nn.Parameter(start)
            self.M_log_scale = nn.Parameter(
                torch.tensor(math.log(init_displacement_std * math.sqrt(num_actions)))
            )
        if walls:
            self.wall_net: Optional[MLP] = MLP(self.state_dim, (wall_hidden,), 1, "relu")
            # sigma_d starts as the constant sigmoid(3) ~= 0.95: every move is scaled alike, so
            # inverse moves stay inverse (random output weights made it vary by ~7% over the
            # grid, and the states drift after every round trip)
            nn.init.zeros_(cast(nn.Linear, self.wall_net[-1]).weight)
            nn.init.constant_(cast(nn.Linear, self.wall_net[-1]).bias, 3.0)
        else:
            self.wall_net = None
        if inference == "landmark":
            K, S = self.landmark_neighbours, self.state_dim
            # beta_k = sigmoid(beta_net(delta_k)); output bias -9: beta ~= 1e-4 at first, so the
            # guide starts close to the prior-only one (module docstring)
            self.landmark_beta: Optional[MLP] = MLP(1, (landmark_hidden,), 1, "relu")
            nn.init.constant_(cast(nn.Linear, self.landmark_beta[-1]).bias, -9.0)
            # log sigma_q^2 - log sigma_p^2 = NN(delta^(1:K'), sigma^2_(1:K'), sigma_p^2); its
            # output layer starts at 0 (sigma_q = sigma_p at first)
            self.landmark_var: Optional[MLP] = MLP(K * (2 + S) + S, (landmark_hidden,), S, "relu")
            nn.init.zeros_(cast(nn.Linear, self.landmark_var[-1]).weight)
            nn.init.zeros_(cast(nn.Linear, self.landmark_var[-1]).bias)
        else:
            self.landmark_beta = self.landmark_var = None
        self.register_buffer("s0", torch.zeros(self.state_dim))
        self.model = ActionProgram(self, "model")
        self.guide = ActionProgram(self, "guide")

    # ------------------------------------------------------------------ from data

    @classmethod
    def for_data(cls, obs_dim: int, input_dim: int = 0, **options: Any) -> "GTMSM":
        """A GTM-SM for frames of ``obs_dim`` values with ``input_dim`` one-hot actions per
        step as ``inputs=`` (``num_actions = input_dim``). Without inputs, the compatibility
        path: the actions are the last ``num_actions`` columns of ``x`` (``pack_actions=True``).
        ``frame_shape`` defaults to a square greyscale frame, or a square RGB one."""
        options = dict(options)
        packed = not input_dim
        if options.pop("pack_actions", packed) is not packed:
            raise ValueError(
                "pack_actions must be false when the data carry the actions as "
                "inputs, true when the actions are packed into x"
            )
        num_actions = options.pop("num_actions", input_dim or 5)
        if input_dim and num_actions != input_dim:
            raise ValueError(
                f"num_actions={num_actions!r} but the data have {input_dim} action "
                "features per step"
            )
        if (
            isinstance(num_actions, bool)
            or not isinstance(num_actions, int)
            or not (0 < num_actions < obs_dim or not packed and num_actions > 0)
        ):
            raise ValueError(f"num_actions={num_actions!r} does not fit {obs_dim} values per step")
        frames = obs_dim - num_actions if packed else obs_dim
        shape = tuple(options.pop("frame_shape", None) or square_frame_shape(frames))
        if math.prod(shape) != frames:
            raise ValueError(
                f"frame_shape {list(shape)} does not hold the {frames} frame values per step"
            )
        return cls(shape, num_actions=num_actions, pack_actions=packed, **options)

    # ------------------------------------------------------------------ building blocks

    def encode(self, frames: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``q(z_t | x_t)``: ``(loc, scale)``, each ``(..., z_dim)``, from ``(..., F)``."""
        return self.encoder_head(self.encoder_body(frames))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Decoder output ``(..., F)``: pixel means (Gaussian) or logits (Bernoulli)."""
        return self.decoder(z)

    def likelihood(self, params: torch.Tensor) -> TorchDistribution:
        """``p(x_t | z_t)`` from the decoder output, event dim 1."""
        if self.likelihood_name == "bernoulli":
            return bernoulli_likelihood(params)
        return dist.Normal(params, self.pixel_scale).to_event(1)

    def training_epoch(self, epoch: int) -> None:
        """Called by :func:`pyro_seq.train.fit` before each epoch (0-based): the ``K`` of
        ``neighbour_warmup`` for this epoch's updates
        (:meth:`~pyro_seq.models.gtmsm_parts.GTMSMMemories.neighbours_now`)."""
        self.warmup_epoch = epoch

    def _first_scale(self, tau, like):
        """``sqrt(tau + 1) r``: the first prediction step starts from ``p*(s_tau)``."""
        return like.new_tensor(self.r * math.sqrt(tau + 1))

    # ------------------------------------------------------------------ the step protocol

    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        frames, actions = self._split(state, x)
        tau = self.check_tau(x.shape[1])
        memory = self.memorise(frames[:, :tau], actions[:, :tau])
        state.shared["memory"], state.shared["actions"] = memory.memory, actions
        state.shared["tau"], state.shared["M"] = tau, self.displacement_matrix()
        if self.inference == "landmark":
            state.shared["s_tau_var"] = memory.variances[:, -1]
        state["s"] = memory.means[:, -1]

    def _position_prior(self, state, key, t):
        """``(loc, scale)`` of ``p(s_t | s_{t-1}, a_t)`` (eq. 7.3) at ``s_{t-1} = state[key]``:
        ``loc (..., batch, state_dim)``, ``scale`` broadcastable to it. The first prediction step
        has the accumulated memorisation noise: ``sqrt(tau + 1) r`` (:meth:`_first_scale`), or
        ``sqrt(Var[s_tau] + r^2)`` with the landmark past encoder."""
        tau = state.shared["tau"]
        s_prev = state[key]
        loc = self.transition_mean(s_prev, state.shared_at("actions", t), state.shared["M"])
        if t != tau:
            scale = s_prev.new_tensor(self.r)
        elif "s_tau_var" in state.shared:
            scale = (state.shared["s_tau_var"] + self.r**2).sqrt()
        else:
            scale = self._first_scale(tau, s_prev)
        return loc, scale

    def _sample_position(self, state, key, t, mask, loc, scale):
        """``s_t ~ N(loc, diag scale^2)`` at site ``s_{t+1}``, stored in ``state[key]``."""
        s = pyro.sample(
            f"s_{t + 1}", masked(dist.Normal(loc, scale.expand(loc.shape)).to_event(1), mask[:, t])
        )
        state[key] = s
        return s

    def model_step(  # type: ignore[override]  # time_parallel is False: t is never a slice
        self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        tau = state.shared["tau"]
        if t < tau:  # memorisation: written by init
            return
        s = self._sample_position(state, "s", t, mask, *self._position_prior(state, "s", t))
        z = pyro.sample(
            f"z_{t + 1}", masked(self.memory_prior(s, state.shared["memory"]), mask[:, t])
        )
        frames = x[..., : self.frame_dim]
        pyro.sample(
            f"x_{t + 1}", masked(self.likelihood(self.decode(z)), mask[:, t]), obs=frames[:, t]
        )

    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        frames, actions = self._split(state, x)
        tau = self.check_tau(x.shape[1])
        state.shared["actions"], state.shared["tau"] = actions, tau
        state.shared["M"] = self.displacement_matrix()
        if self.inference == "landmark":
            loc, scale = self.encode(frames)
            memory = self.memorise(
                frames[:, :tau], actions[:, :tau], codes=(loc[:, :tau], scale[:, :tau])
            )
            loc, scale = loc[:, tau:], scale[:, tau:]
            # the reversed DND read with every prediction-phase code at once: (T - tau, batch, .)
            # the landmark inference writes the reversed DND (GTMSMMemory.reversed)
            reads: Tuple[torch.Tensor, ...] = self.read_landmarks(
                memory.reversed,  # type: ignore[arg-type]
                loc.transpose(0, 1),
            )
            reads = reads + (self.landmark_weights(reads[0], reads[3]),)
            state.shared["landmarks"] = list(zip(*(r.unbind(0) for r in reads)))
            state.shared["s_tau_var"] = memory.variances[:, -1]
            state["guide_s"] = memory.means[:, -1]
        else:
            loc, scale = self.encode(frames[:, tau:])
            state["guide_s"] = self.mean_path(actions[:, :tau])[:, -1]
        state.shared["q_loc"], state.shared["q_scale"] = loc, scale

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        tau = state.shared["tau"]
        if t < tau:
            return
        loc, scale = self._position_prior(state, "guide_s", t)
        if self.inference == "landmark":  # q(s_t | s_{t-1}, a_t, z_t, m), thesis appendix 7.10
            var_p = scale.pow(2).expand(loc.shape[-2:])  # (batch, state_dim): NN once per sequence
            loc, var = self.landmark_merge(loc, var_p, *state.shared["landmarks"][t - tau])
            scale = var.sqrt()
        self._sample_position(state, "guide_s", t, mask, loc, scale)
        q = dist.Normal(state.shared_at("q_loc", t - tau), state.shared_at("q_scale", t - tau))
        pyro.sample(f"z_{t + 1}", masked(q.to_event(1), mask[:, t]))
