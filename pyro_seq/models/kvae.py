r"""Kalman variational auto-encoder (thesis Ch. 6 and 4.6; Fraccaro et al. 2017).

Generative model, column vectors (thesis eq. 6.1-6.3, 6.9, 6.10)::

    z_1 ~ N(0, Sigma_0)
    z_t = A_t z_{t-1} + B_t u_t + eps_t,   eps_t ~ N(0, Q)                       (6.1)
    a_t = C_t z_t + delta_t,               delta_t ~ N(0, R)                     (6.2)
    x_t ~ p_theta(x_t | a_t)               (a decoder; Bernoulli pixels)
    d_t = LSTM(a_{t-1}, d_{t-1}),  alpha_t = softmax(W d_t + b)                  (dynamics net)
    A_t = sum_k alpha_t^(k) A^(k),  B_t = sum_k alpha_t^(k) B^(k),
    C_t = sum_k alpha_t^(k) C^(k)                                                 (6.10)

with ``d_0 = 0`` and a learned starting code ``a_0``. Because ``gamma_t = (A_t, B_t, C_t)``
depends on ``a_{0:t-1}`` only, ``p(a) = prod_t p(a_t | a_{<t})`` where each factor is the
Kalman filter's one-step predictive ``N(C_t mu_{t|t-1}, C_t Sigma_{t|t-1} C_t^T + R)`` (eq. 3.12),
computed with matrices that are already known at step t: the states z are integrated out
*exactly*, and gradients flow through the filter.

Inference (eq. 6.6): ``q(a, z | x) = prod_t q_phi(a_t | x_t) * p_gamma(z | a)``, a per-frame
encoder and the exact smoother. As a Pyro model/guide pair:

* the model samples the sites ``a_1..a_T`` from the predictive distributions above (a
  :class:`~pyro.distributions.MultivariateNormal` per step) and observes ``x_1..x_T``;
* the guide samples ``a_t ~ q_phi(a_t | x_t) = N(mu_phi(x_t), diag sigma_phi(x_t)^2)``.

So every ELBO of Pyro and of this package trains it with ``loss=`` alone. The bound of
eq. 6.7 is ``E_q[log p(x | a) + log p(a) - log q(a | x)]``, and ``log p(a)`` is computed in closed
form (``prior_score="exact"``, the default). ``prior_score="smoother_sample"`` evaluates it
as in eq. 6.8 instead: ``z ~ p(z | a)`` is drawn by forward filtering, backward sampling
(reparameterised) and ``log p(a) = log p(a | z) + log p(z) - log p(z | a)``; the identity holds
for every z, so the two agree to rounding (tested) and the exact form is cheaper.

Step protocol (:mod:`pyro_seq.models.base`). A step runs one Kalman filter step: the filtered
moments ``(mu_{t-1}, Sigma_{t-1})``, the LSTM state and the previous encoding live in ``state``
(per particle), so :class:`~pyro_seq.infer.FIVO` resamples them with the particles and SVI with
FIVO trains a KVAE. When every latent is fixed by a replay (inside every ELBO) and no step is
missing, the model instead runs the dynamics network once over the sequence and
:func:`pyro_seq.ops.kalman_filter` once with the stacked ``A_t, B_t, C_t`` (time-parallel
scoring); sites and log-densities are those of the step loop (tested).

Missing frames (``observed=``, thesis 6.4 and appendix 6.10). A step whose frame is entirely
unobserved has no ``a_t`` evidence: its ``a_t`` and ``x_t`` sites are masked (they contribute
0), the filter only predicts, and the dynamics network is fed the predicted encoding
``E[a_t | a_{<t}] = C_t mu_{t|t-1}`` (the mean of eq. 6.13 rather than a sample, so the bound
stays a deterministic function of the observed encodings). This is exactly the masked joint of
appendix 6.10. Partially observed frames are encoded from the zero-filled frame and scored on
their observed pixels. The guide samples ``a_t`` at every step; at missing steps its value is
masked and unused.

Training tricks of appendix 6.8, with their defaults:

* ``reconstruction_weight``: ``log p(x | a)`` is scaled by this weight *while the module is in
  training mode* (``model.train()``); in ``eval()`` mode the sites carry weight 1, so the bounds
  reported by :mod:`pyro_seq.train.evaluate` are the true ELBO. The default is 1 (training
  maximises the ELBO that is reported), not the thesis's 0.3: on the torque-controlled pendulum
  (Fraccaro (2018), sec. 6.5.2, Table 6.1; 300 epochs through :func:`pyro_seq.train.fit`,
  the torques as controls) weight 1 reached a test ELBO of -44.80 nats per sequence and 0.3
  only -54.91 (IWAE(64): -41.01 and -47.00), against -57.30 for the DMM given the torques
  (``benchmarks/results/kvae_pendulum_inputs.json`` and ``kvae_pendulum_inputs_w03.json``).
  ``reconstruction_weight=0.3`` gives the thesis's setting (the preset ``kvae_box`` uses it);
* ``dynamics_warmup_epochs=5``: while the attribute ``dynamics_frozen`` is True the dynamics network
  gets no gradient (the VAE and the matrices ``A^(k), B^(k), C^(k)`` learn first);
  :func:`pyro_seq.train.fit` calls :meth:`KVAE.training_epoch` at each epoch, which freezes it
  for the first ``dynamics_warmup_epochs`` epochs;
* the output layer of the dynamics network starts at zero, so the K mixture weights start
  uniform;
* gradient clipping is the optimiser's (``TrainConfig.clip_norm``; the KVAE code uses 150).

Defaults from the KVAE code of the thesis (github.com/simonkamronn/kvae, ``config.py``):
``a_dim=2, z_dim=4, num_modes=3``, LSTM of 50 units, ``Q = 0.08 I``, ``R = 0.03 I``,
``Sigma_0 = 20 I``, ``A^(k) = I`` and ``B^(k), C^(k) ~ N(0, 0.05^2)`` at initialisation, the
convolutional encoder/decoder of :mod:`pyro_seq.nn.conv` (``encoder="conv"``) or MLPs
(``encoder="mlp"``, the pendulum experiment).
"""

import math
from typing import Any, Literal, Optional, Sequence, Tuple, Union, overload

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
from pyro.distributions.torch_distribution import TorchDistribution

from pyro_seq.distributions.scored_value import ScoredValue
from pyro_seq.models.base import SequenceModel, Step, masked, stack_time
from pyro_seq.models.contract import example
from pyro_seq.models.emission import bernoulli_likelihood
from pyro_seq.models.kvae_dynamics import DynamicsNetwork as DynamicsNetwork
from pyro_seq.models.kvae_dynamics import KVAEDynamics, KVAEFilterResult
from pyro_seq.nn import GaussianHead
from pyro_seq.nn.conv import FRAME_NETWORKS, frame_networks
from pyro_seq.ops.kalman import kalman_filter
from pyro_seq.ops.linalg import mv as _mv
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import (
    module_device,
    positive_int,
    square_frame_shape,
    validate_generate_args,
    validate_mask,
    validate_sequences,
)

__all__ = ["KVAE", "KVAEFilterResult"]

#: Frame encoders/decoders of :class:`KVAE` (``encoder=``): convolutional (appendix 6.8) or MLP.
ENCODERS = FRAME_NETWORKS
#: Pixel likelihoods of :class:`KVAE` (``likelihood=``).
LIKELIHOODS = ("bernoulli", "gaussian")
#: How :class:`KVAE` scores log p(a) (``prior_score=``): closed form, or eq. 6.8 at a smoother draw.
PRIOR_SCORES = ("exact", "smoother_sample")


class KVAE(KVAEDynamics, SequenceModel):
    r"""Kalman VAE as a Pyro model/guide pair (equations in the module docstring).

    :param tuple image_shape: ``(H, W)`` (or ``(C, H, W)``) of the frames; ``obs_dim = C*H*W``,
        frames travel flattened as ``x (batch, T, obs_dim)`` with values 0/1.
    :param int a_dim: size of the encodings ``a_t`` (2).
    :param int z_dim: LGSSM state size (4).
    :param int num_modes: K, the number of base matrices (3).
    :param int control_dim: size of the controls ``u_t`` (0: none); with controls the programs
        take ``inputs=u`` of shape ``(batch, T, control_dim)``.
    :param int lstm_dim: units of the dynamics network's LSTM (50).
    :param str encoder: ``"conv"`` (appendix 6.8) or ``"mlp"`` (the pendulum alternative).
    :param int channels: filters per convolution (32); ``conv_layers``: 3.
    :param tuple hidden_dims: hidden layers of the MLP encoder/decoder ((128, 128)).
    :param float transition_noise: Q = transition_noise * I (0.08).
    :param float emission_noise: R = emission_noise * I (0.03).
    :param float init_cov: Sigma_0 = init_cov * I (20).
    :param float init_matrix_std: standard deviation of the initial B^(k), C^(k) (0.05).
    :param str likelihood: ``"bernoulli"`` (binary frames, default) or ``"gaussian"``: pixels
        ``N(decoder(a_t), pixel_var)`` with a fixed variance, as the KVAE code's
        ``out_distr="gaussian"``.
    :param float pixel_var: the fixed pixel variance of ``likelihood="gaussian"`` (0.1).
    :param float min_scale: floor of the encoder's standard deviations (1e-3).
    :param float reconstruction_weight: weight of ``log p(x | a)`` in training mode (1: the
        ELBO; the thesis's appendix 6.8 uses 0.3, which scored about 10 nats per sequence lower
        on the pendulum, module docstring).
    :param int dynamics_warmup_epochs: epochs with the dynamics network frozen (5).
    :param str prior_score: ``"exact"`` or ``"smoother_sample"`` (eq. 6.8).
    """

    module_name = "kvae"
    latent_names = ("a",)
    time_parallel = True  #: when :meth:`scores_all_steps` allows it (no missing frame)
    Q: torch.Tensor  #: buffer ``(z_dim, z_dim)``: transition noise covariance
    R: torch.Tensor  #: buffer ``(a_dim, a_dim)``: emission noise covariance
    init_loc: torch.Tensor  #: buffer ``(z_dim,)``: mu_0
    init_cov: torch.Tensor  #: buffer ``(z_dim, z_dim)``: Sigma_0
    impute_methods = ("smoothing", "filtering", "generation", "iterative", "importance")
    small_example = example(
        obs_dim=16,
        input_dim=1,
        length=6,
        encoder="mlp",
        hidden_dims=[4],
        lstm_dim=4,
        z_dim=2,
        num_modes=2,
        dynamics_warmup_epochs=1,
    )

    def __init__(
        self,
        image_shape: Sequence[int] = (32, 32),
        a_dim: int = 2,
        z_dim: int = 4,
        num_modes: int = 3,
        control_dim: int = 0,
        lstm_dim: int = 50,
        encoder: str = "conv",
        channels: int = 32,
        conv_layers: int = 3,
        hidden_dims: Sequence[int] = (128, 128),
        transition_noise: float = 0.08,
        emission_noise: float = 0.03,
        init_cov: float = 20.0,
        init_matrix_std: float = 0.05,
        likelihood: str = "bernoulli",
        pixel_var: float = 0.1,
        min_scale: float = 1e-3,
        reconstruction_weight: float = 1.0,
        dynamics_warmup_epochs: int = 5,
        prior_score: str = "exact",
    ) -> None:
        image_shape = tuple(image_shape)
        super().__init__(math.prod(image_shape))
        self.image_shape = self.frame_shape = image_shape
        self.a_dim = positive_int("a_dim", a_dim)
        self.z_dim = positive_int("z_dim", z_dim)
        self.num_modes = positive_int("num_modes", num_modes)
        if isinstance(control_dim, bool) or not isinstance(control_dim, int) or control_dim < 0:
            raise ValueError(f"control_dim must be a non-negative int, got {control_dim!r}")
        self.input_dim = self.control_dim = control_dim
        for name, value in (
            ("transition_noise", transition_noise),
            ("emission_noise", emission_noise),
            ("init_cov", init_cov),
        ):
            if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if not (
            isinstance(reconstruction_weight, (int, float))
            and reconstruction_weight > 0
            and math.isfinite(reconstruction_weight)
        ):
            raise ValueError(
                f"reconstruction_weight must be a positive finite number, got "
                f"{reconstruction_weight!r}"
            )
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
        if not (isinstance(pixel_var, (int, float)) and pixel_var > 0 and math.isfinite(pixel_var)):
            raise ValueError(f"pixel_var must be a positive finite number, got {pixel_var!r}")
        if prior_score not in PRIOR_SCORES:
            raise ValueError(f"prior_score must be one of {PRIOR_SCORES}, got {prior_score!r}")
        self.encoder_type, self.prior_score = encoder, prior_score
        self.reconstruction_weight = float(reconstruction_weight)
        self.dynamics_warmup_epochs = int(dynamics_warmup_epochs)
        self.dynamics_frozen = False

        A, S, K = self.a_dim, self.z_dim, self.num_modes
        self.encoder_body, enc_out, self.emitter = frame_networks(
            encoder, image_shape, A, channels, conv_layers, hidden_dims
        )
        self.encoder_head = GaussianHead(enc_out, A, min_scale)
        self.likelihood_name = likelihood
        self.binary_observations = likelihood == "bernoulli"
        self.pixel_scale = math.sqrt(pixel_var)

        self.dynamics = DynamicsNetwork(A, K, lstm_dim)
        self.a0 = nn.Parameter(torch.zeros(A))
        self.A_modes = nn.Parameter(torch.eye(S).expand(K, S, S).clone())
        self.C_modes = nn.Parameter(init_matrix_std * torch.randn(K, A, S))
        self.B_modes = (
            nn.Parameter(init_matrix_std * torch.randn(K, S, control_dim)) if control_dim else None
        )
        self.register_buffer("Q", transition_noise * torch.eye(S))
        self.register_buffer("R", emission_noise * torch.eye(A))
        self.register_buffer("init_loc", torch.zeros(S))
        self.register_buffer("init_cov", init_cov * torch.eye(S))

    def likelihood(self, params: torch.Tensor) -> TorchDistribution:
        """``p(x_t | a_t)`` from the decoder output ``(..., obs_dim)``: Bernoulli logits or
        Gaussian means (event dim 1)."""
        if self.likelihood_name == "bernoulli":
            return bernoulli_likelihood(params)
        return dist.Normal(params, self.pixel_scale).to_event(1)

    # ------------------------------------------------------------------ training hooks

    def training_epoch(self, epoch: int) -> None:
        """Called by :func:`pyro_seq.train.fit` before each epoch (0-based): freeze the dynamics
        network for the first ``dynamics_warmup_epochs`` epochs (appendix 6.8)."""
        self.dynamics_frozen = epoch < self.dynamics_warmup_epochs

    @property
    def _obs_scale(self):
        return self.reconstruction_weight if self.training else 1.0

    # ------------------------------------------------------------------ building blocks

    def encode(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``q(a_t | x_t)``: ``(loc, scale)``, each ``(..., a_dim)``, from frames ``(..., obs_dim)``."""
        return self.encoder_head(self.encoder_body(x))

    def decode(self, a: torch.Tensor) -> torch.Tensor:
        """Pixel logits ``(..., obs_dim)`` of ``p(x_t | a_t)``."""
        return self.emitter(a)

    @staticmethod
    def _step_observed(state, t, mask):
        """bool ``(batch,)`` (or ``(batch, T)`` for a slice): the step is real and its frame has
        at least one observed pixel."""
        ok = mask[:, t]
        seen = state.shared.get("observed")
        if seen is not None:
            ok = ok & seen[:, t].any(-1)
        return ok

    # ------------------------------------------------------------------ the step protocol

    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        B = x.shape[0]
        state["m"] = self.init_loc.expand(B, self.z_dim)
        state["P"] = self.init_cov.expand(B, self.z_dim, self.z_dim)
        state["a"] = self.a0.expand(B, self.a_dim)
        state["d"], state["c"] = self.dynamics.initial(x, (B,))

    @classmethod
    def for_data(cls, obs_dim: int, input_dim: int = 0, **options: Any) -> "KVAE":
        """A KVAE for frames of ``obs_dim`` pixels (square unless ``image_shape`` is given) with
        ``input_dim`` controls per step (``control_dim``)."""
        options = dict(options)
        shape = tuple(
            options.pop("image_shape", None) or square_frame_shape(obs_dim, "image_shape")
        )
        if math.prod(shape) != obs_dim:
            raise ValueError(f"image_shape {list(shape)} does not hold {obs_dim} values per step")
        if input_dim and options.get("control_dim", input_dim) != input_dim:
            raise ValueError(
                f"control_dim={options['control_dim']} but the data have "
                f"{input_dim} input features per step"
            )
        if input_dim:
            options["control_dim"] = input_dim
        return cls(shape, **options)

    def scores_all_steps(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> bool:
        """All steps at once only when every real step's frame has an observed pixel (the
        Kalman filter of the all-at-once path needs every real step's encoding); decided from
        this call's ``mask`` and ``observed`` alone."""
        seen = state.shared.get("observed")
        return seen is None or bool((seen.any(-1) | ~mask).all())

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        if isinstance(t, slice):
            return self._model_all_steps(state, x, mask)
        u_t = state.shared_at("inputs", t) if self.control_dim else None
        _, (d, c), m_pred, P_pred, step = self._predict(
            state["m"], state["P"], state["a"], (state["d"], state["c"]), t, u_t
        )
        ok = self._step_observed(state, t, mask)
        fn = dist.MultivariateNormal(step.loc, scale_tril=step.scale_tril)  # p(a_t | a_{<t})
        a = pyro.sample(f"a_{t + 1}", masked(fn, ok))
        state["m"], state["P"], state["a"] = self._absorb(step, m_pred, P_pred, a, ok)
        state["d"], state["c"] = d, c
        self.observe(state, t, x, mask, a)

    def _model_all_steps(self, state, x, mask):
        """Every step at once (see the module docstring): one LSTM pass, one Kalman filter."""
        a = state["a"]  # (..., T, a_dim): a_{0:T-1}, the history filled in by StepProgram
        values = state.replayed["a"]
        a_obs = stack_time(values)  # (..., T, a_dim): a_{1:T}
        alpha = self._dynamics_sequence(a)
        A_t, B_t, C_t = self.mix(alpha)
        u = state.shared.get("inputs")
        step_mask = mask.expand(a_obs.shape[:-2] + mask.shape[-1:])
        f = kalman_filter(
            a_obs,
            self.init_loc,
            self.init_cov,
            A_t,
            self.Q,
            C_t,
            self.R,
            B_t,
            u,
            step_mask,
            validate_args=False,
        )
        if self.prior_score == "exact":
            log_p = f.log_likelihoods
        else:
            log_p = self._smoother_sample_terms(a_obs, A_t, B_t, C_t, u, step_mask)
        loc = _mv(C_t, f.predicted_means)
        cov = C_t @ f.predicted_covs @ C_t.mT + self.R
        scale_tril = torch.linalg.cholesky(0.5 * (cov + cov.mT))
        log_p = log_p.unbind(-1)
        for i in pyro.markov(range(len(values))):
            fn = ScoredValue(
                dist.MultivariateNormal(loc[..., i, :], scale_tril=scale_tril[..., i, :, :]),
                values[i],
                log_p[i],
            )
            value = pyro.sample(f"a_{i + 1}", fn.mask(mask[:, i]))
            if value is not values[i]:
                raise RuntimeError(f"site a_{i + 1} did not take its replayed value")
        self.observe(state, slice(None), x, mask, a_obs)

    def observe(
        self,
        state: SequenceState,
        t: Step,
        x: torch.Tensor,
        mask: torch.Tensor,
        features: torch.Tensor,
    ) -> None:
        """``x_t ~ p(x_t | a_t)``, scaled by ``reconstruction_weight`` in training mode."""
        scale = self._obs_scale
        if scale == 1.0:
            return super().observe(state, t, x, mask, features)
        with pyro.poutine.scale(scale=scale):
            return super().observe(state, t, x, mask, features)

    def _observe_deferred(self, state, x, mask):
        scale = self._obs_scale
        if scale == 1.0:
            return super()._observe_deferred(state, x, mask)
        with pyro.poutine.scale(scale=scale):
            return super()._observe_deferred(state, x, mask)

    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        loc, scale = self.encode(x)
        state.shared["q_loc"], state.shared["q_scale"] = loc, scale

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        loc = state.shared_at("q_loc", t)
        scale = state.shared_at("q_scale", t)
        ok = self._step_observed(state, t, mask)
        pyro.sample(f"a_{t + 1}", masked(dist.Normal(loc, scale).to_event(1), ok))

    # ------------------------------------------------------------------ imputation (thesis 6.4)

    @torch.no_grad()
    def impute_steps(
        self,
        x: torch.Tensor,
        observed_steps: torch.Tensor,
        method: str,
        inputs: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The contract's hook for :func:`pyro_seq.tasks.impute` with ``method`` ``"smoothing"``,
        ``"filtering"`` or ``"generation"``: the pixel probabilities of :meth:`impute_frames`."""
        return self.impute_frames(x, observed_steps, method, inputs=inputs)[0]

    def impute_frames(
        self,
        x: torch.Tensor,
        observed_steps: torch.Tensor,
        method: str = "smoothing",
        inputs: Optional[torch.Tensor] = None,
        num_initial: int = 4,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        r"""Impute missing frames (thesis 6.4, Fig. 6.3).

        The observed frames are encoded by the encoder means ``E_q[a_t | x_t]``; the encodings
        are completed by :meth:`filter_encodings` and frames are decoded from them.

        * ``"smoothing"``: ``a_hat_t = C_t E[z_t | a_obs]`` (RTS smoother);
        * ``"filtering"``: ``a_hat_t = C_t E[z_t | a_obs up to t]``;
        * ``"generation"``: only the first ``num_initial`` frames (4) are used, then the
          filter's predictions (the videos of appendix 6.9).

        With controls (``control_dim > 0``) every method uses them: ``B_t u_t`` enters each
        prediction step (eq. 6.1, with ``B_t`` of eq. 6.10), at observed and missing steps alike.

        :param x: frames ``(batch, T, obs_dim)``, finite at observed steps; unobserved frames
            may hold anything (NaN included).
        :param observed_steps: bool ``(batch, T)`` (or exactly 0/1), True where the frame is
            observed.
        :param inputs: controls ``(batch, T, control_dim)`` for a model with ``control_dim > 0``
            (known at every step, observed or not); None for a model without controls.
        :param int num_initial: frames kept by ``"generation"`` (>= 0).
        :returns: ``(probs, a_hat)``: pixel probabilities (Bernoulli; Gaussian: the means)
            ``(batch, T, obs_dim)`` decoded from ``a_hat (batch, T, a_dim)``, at every step.
        :raises ValueError: naming the argument: ``method`` unknown, ``x`` not a finite
            ``(batch, T, obs_dim)`` batch at observed steps or on another device than the model,
            ``observed_steps`` not ``(batch, T)`` 0/1, ``num_initial`` negative or fractional,
            ``inputs`` missing, unexpected, of the wrong shape or non-finite.
        """
        if method not in ("smoothing", "filtering", "generation"):
            raise ValueError(
                f"method must be 'smoothing', 'filtering' or 'generation', got {method!r}"
            )
        if isinstance(num_initial, bool) or not isinstance(num_initial, int) or num_initial < 0:
            raise ValueError(
                f"num_initial must be a non-negative int (the frames that "
                f"'generation' keeps), got {num_initial!r}"
            )
        seen = None
        if torch.is_tensor(x) and x.dim() == 3:  # otherwise validate_sequences names x's problem
            seen = validate_mask(
                observed_steps, x.shape[:2], device=x.device, name="observed_steps"
            )
        x, _ = validate_sequences(x, None, self.obs_dim, observed=seen, device=module_device(self))
        seen, inputs = self._check_steps_and_inputs(x.shape[:2], seen, inputs, x)
        if method == "generation":
            seen = seen & (torch.arange(x.shape[1], device=x.device) < num_initial)
        x = torch.where(seen[..., None], x, x.new_zeros(()))
        a = self.encode(x)[0]
        res = self.filter_encodings(a, seen, inputs, smooth=method == "smoothing")
        a_hat = res.a_smoothed if method == "smoothing" else res.a_filtered
        out = self.decode(a_hat)
        probs = torch.sigmoid(out) if self.likelihood_name == "bernoulli" else out
        return probs, a_hat

    @overload
    def generate(
        self,
        num_sequences: int,
        num_steps: int,
        inputs: Optional[torch.Tensor] = None,
        return_codes: Literal[False] = False,
    ) -> Tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def generate(
        self,
        num_sequences: int,
        num_steps: int,
        inputs: Optional[torch.Tensor] = None,
        *,
        return_codes: Literal[True],
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    @overload
    def generate(
        self,
        num_sequences: int,
        num_steps: int,
        inputs: Optional[torch.Tensor],
        return_codes: Literal[True],
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    @torch.no_grad()
    def generate(
        self,
        num_sequences: int,
        num_steps: int,
        inputs: Optional[torch.Tensor] = None,
        return_codes: bool = False,
    ) -> Union[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Ancestral samples: ``a_t ~ p(a_t | a_{<t})`` by the filter's predictive, the dynamics
        network fed the samples, ``x_t ~ p(x_t | a_t)``.

        :param inputs: controls ``(num_sequences, num_steps, control_dim)`` for a model with
            ``control_dim > 0``.
        :returns: ``(x, params)`` as the other models' ``generate``: frames ``(num_sequences,
            num_steps, obs_dim)`` and the decoder outputs (Bernoulli logits or Gaussian means);
            with ``return_codes=True`` also the encodings ``a (num_sequences, num_steps, a_dim)``.
        """
        B, T = validate_generate_args(num_sequences, num_steps)
        if self.control_dim and (inputs is None or tuple(inputs.shape) != (B, T, self.control_dim)):
            raise ValueError(
                f"generate needs inputs of shape {(B, T, self.control_dim)} (controls)"
            )
        m, P = self.init_loc.expand(B, self.z_dim), self.init_cov.expand(B, self.z_dim, self.z_dim)
        prev = self.a0.expand(B, self.a_dim)
        hidden = self.dynamics.initial(m, (B,))
        out = []
        for t in range(T):
            u_t = None if inputs is None else inputs[:, t]
            _, hidden, m, P, step = self._predict(m, P, prev, hidden, t, u_t)
            prev = dist.MultivariateNormal(step.loc, scale_tril=step.scale_tril).sample()
            m, P = step.mean(prev), step.cov
            out.append(prev)
        a = torch.stack(out, 1)
        params = self.decode(a)
        x = self.likelihood(params).sample()
        return (x, params, a) if return_codes else (x, params)
