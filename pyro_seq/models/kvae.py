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

* ``reconstruction_weight=0.3``: ``log p(x | a)`` is scaled by 0.3 *while the module is in
  training mode* (``model.train()``); in ``eval()`` mode the sites carry weight 1, so the bounds
  reported by :mod:`pyro_seq.train.evaluate` are the true ELBO;
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

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn

from pyro_seq.distributions.scored_value import ScoredValue
from pyro_seq.models.base import SequenceModel, masked, stack_time
from pyro_seq.models.contract import example
from pyro_seq.models.emission import bernoulli_likelihood
from pyro_seq.nn import GaussianHead
from pyro_seq.nn.conv import FRAME_NETWORKS, frame_networks
from pyro_seq.ops.kalman import (
    kalman_filter,
    kalman_predict,
    kalman_smoother,
    kalman_update,
    psd_sqrt,
)
from pyro_seq.ops.linalg import mv as _mv
from pyro_seq.validation import (
    module_device,
    positive_int,
    square_frame_shape,
    validate_generate_args,
    validate_inputs,
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


class KVAEFilterResult(dict):
    """What :meth:`KVAE.filter_encodings` returns (a dict with attribute access).

    ``a (batch, T, a_dim)``: the encodings used (observed ones, and at missing steps the
    filter's predictions); ``A (batch, T, S, S)``, ``B`` (or None), ``C (batch, T, a_dim, S)``:
    the estimated ``gamma_t``; ``alpha (batch, T, K)``; ``filtered`` and (with
    ``smooth=True``) ``smoothed``: :class:`~pyro_seq.ops.KalmanFilterResult` /
    :class:`~pyro_seq.ops.KalmanSmootherResult` of the LGSSM with those matrices;
    ``a_filtered``, ``a_smoothed (batch, T, a_dim)``: ``C_t E[z_t | ...]``.
    """

    __getattr__ = dict.__getitem__


class DynamicsNetwork(nn.Module):
    """``alpha_t(a_{0:t-1})``: ``d_t = LSTM(a_{t-1}, d_{t-1})``, ``alpha_t = softmax(W d_t + b)``.

    ``W`` and ``b`` start at zero (uniform mixture weights). Shapes: :meth:`step`
    ``(..., a_dim), ((..., H), (..., H)) -> (..., K), ((..., H), (..., H))``; :meth:`sequence`
    ``(..., T, a_dim) -> (..., T, K)`` (inputs ``a_{0:T-1}``).
    """

    def __init__(self, a_dim, num_modes, hidden_dim=50):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.lstm = nn.LSTM(a_dim, hidden_dim, batch_first=True)
        self.out = nn.Linear(hidden_dim, num_modes)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def initial(self, like, batch_shape):
        zeros = like.new_zeros(tuple(batch_shape) + (self.hidden_dim,))
        return zeros, zeros

    def step(self, a_prev, hidden):
        h, c = hidden
        lead = torch.broadcast_shapes(a_prev.shape[:-1], h.shape[:-1], c.shape[:-1])
        flat = [v.expand(lead + v.shape[-1:]).reshape(1, -1, v.shape[-1]) for v in (a_prev, h, c)]
        out, (h, c) = self.lstm(flat[0].transpose(0, 1), (flat[1], flat[2]))
        h = h.reshape(lead + (self.hidden_dim,))
        c = c.reshape(lead + (self.hidden_dim,))
        return torch.softmax(self.out(h), -1), (h, c)

    def sequence(self, a_prev):
        lead, (T, A) = a_prev.shape[:-2], a_prev.shape[-2:]
        out, _ = self.lstm(a_prev.reshape(-1, T, A))
        return torch.softmax(self.out(out), -1).reshape(lead + (T, -1))


class KVAE(SequenceModel):
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
    :param float reconstruction_weight: weight of ``log p(x | a)`` in training mode (0.3).
    :param int dynamics_warmup_epochs: epochs with the dynamics network frozen (5).
    :param str prior_score: ``"exact"`` or ``"smoother_sample"`` (eq. 6.8).
    """

    module_name = "kvae"
    latent_names = ("a",)
    time_parallel = True  #: when :meth:`scores_all_steps` allows it (no missing frame)
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
        image_shape=(32, 32),
        a_dim=2,
        z_dim=4,
        num_modes=3,
        control_dim=0,
        lstm_dim=50,
        encoder="conv",
        channels=32,
        conv_layers=3,
        hidden_dims=(128, 128),
        transition_noise=0.08,
        emission_noise=0.03,
        init_cov=20.0,
        init_matrix_std=0.05,
        likelihood="bernoulli",
        pixel_var=0.1,
        min_scale=1e-3,
        reconstruction_weight=0.3,
        dynamics_warmup_epochs=5,
        prior_score="exact",
    ):
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

    def likelihood(self, params):
        """``p(x_t | a_t)`` from the decoder output ``(..., obs_dim)``: Bernoulli logits or
        Gaussian means (event dim 1)."""
        if self.likelihood_name == "bernoulli":
            return bernoulli_likelihood(params)
        return dist.Normal(params, self.pixel_scale).to_event(1)

    # ------------------------------------------------------------------ training hooks

    def training_epoch(self, epoch):
        """Called by :func:`pyro_seq.train.fit` before each epoch (0-based): freeze the dynamics
        network for the first ``dynamics_warmup_epochs`` epochs (appendix 6.8)."""
        self.dynamics_frozen = epoch < self.dynamics_warmup_epochs

    @property
    def _obs_scale(self):
        return self.reconstruction_weight if self.training else 1.0

    # ------------------------------------------------------------------ building blocks

    def encode(self, x):
        """``q(a_t | x_t)``: ``(loc, scale)``, each ``(..., a_dim)``, from frames ``(..., obs_dim)``."""
        return self.encoder_head(self.encoder_body(x))

    def decode(self, a):
        """Pixel logits ``(..., obs_dim)`` of ``p(x_t | a_t)``."""
        return self.emitter(a)

    def mix(self, alpha):
        """``(A_t, B_t, C_t)`` of eq. 6.10 from weights ``alpha (..., K)`` (B_t None without
        controls): ``(..., S, S)``, ``(..., S, U)``, ``(..., a_dim, S)``."""
        A = torch.einsum("...k,kij->...ij", alpha, self.A_modes)
        C = torch.einsum("...k,kij->...ij", alpha, self.C_modes)
        B = None if self.B_modes is None else torch.einsum("...k,kij->...ij", alpha, self.B_modes)
        return A, B, C

    def _dynamics_step(self, a_prev, hidden):
        if self.dynamics_frozen:
            with torch.no_grad():
                alpha, hidden = self.dynamics.step(
                    a_prev.detach(), tuple(h.detach() for h in hidden)
                )
            return alpha, hidden
        return self.dynamics.step(a_prev, hidden)

    def _dynamics_sequence(self, a_prev):
        if self.dynamics_frozen:
            with torch.no_grad():
                return self.dynamics.sequence(a_prev.detach())
        return self.dynamics.sequence(a_prev)

    def _predict(self, m, P, prev, hidden, t, u_t=None):
        """One step of the LGSSM before ``a_t`` is seen: ``gamma_t`` from the dynamics network
        (input ``a_{t-1}``), the prediction (eq. 3.11; none at t = 0, where the moments are the
        prior's) and the predictive of ``a_t``. Returns ``(alpha, hidden, m_pred, P_pred, step)``
        with ``step`` a :class:`~pyro_seq.ops.KalmanStep`."""
        alpha, hidden = self._dynamics_step(prev, hidden)
        A_t, B_t, C_t = self.mix(alpha)
        if t > 0:
            offset = None if B_t is None else _mv(B_t, u_t)
            m, P = kalman_predict(m, P, A_t, self.Q, offset)
        return alpha, hidden, m, P, kalman_update(m, P, C_t, self.R)

    @staticmethod
    def _absorb(step, m_pred, P_pred, a, ok):
        """The filtered moments after ``a_t`` where ``ok`` (bool, batch shape), the predicted
        ones elsewhere; and the encoding passed on (``a_t``, or the prediction ``C_t
        mu_{t|t-1}`` where missing). Returns ``(m, P, a_used)``."""
        keep = ok.reshape(ok.shape + (1,))
        a_used = torch.where(keep, a, step.loc)
        return (
            torch.where(keep, step.mean(a), m_pred),
            torch.where(keep.unsqueeze(-1), step.cov, P_pred),
            a_used,
        )

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

    def model_init(self, state, x, mask):
        B = x.shape[0]
        state["m"] = self.init_loc.expand(B, self.z_dim)
        state["P"] = self.init_cov.expand(B, self.z_dim, self.z_dim)
        state["a"] = self.a0.expand(B, self.a_dim)
        state["d"], state["c"] = self.dynamics.initial(x, (B,))

    @classmethod
    def for_data(cls, obs_dim, input_dim=0, **options):
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

    def scores_all_steps(self, state, x, mask):
        """All steps at once only when every real step's frame has an observed pixel (the
        Kalman filter of the all-at-once path needs every real step's encoding); decided from
        this call's ``mask`` and ``observed`` alone."""
        seen = state.shared.get("observed")
        return seen is None or bool((seen.any(-1) | ~mask).all())

    def model_step(self, state, t, x, mask):
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

    def _smoother_sample_terms(self, a, A_t, B_t, C_t, u, step_mask):
        r"""Per-step terms of eq. 6.8, ``log p(a|z) + log p(z) - log p(z|a)`` at one
        reparameterised draw ``z ~ p(z | a)`` (forward filtering, backward sampling), ``(..., T)``.

        Step t carries ``log p(a_t | z_t) + log p(z_t | z_{t-1}) - log p(z_t | z_{t+1}, a_{1:t})``
        (the last step: ``- log p(z_T | a_{1:T})``); their sum over a sequence is ``log p(a)`` for
        every z. Padded steps are filtered as missing, and their terms are added to the
        sequence's last real step, so that the masked sites still sum to ``log p(a_{1:L})``.
        """
        sm = kalman_smoother(
            a,
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
        f = sm.filtered
        noise = torch.randn_like(f.means)
        T = a.shape[-2]
        z = [None] * T
        z[T - 1] = f.means[..., -1, :] + _mv(psd_sqrt(f.covs[..., -1, :, :]), noise[..., -1, :])
        cond = [None] * T
        cond[T - 1] = (f.means[..., -1, :], f.covs[..., -1, :, :])
        for t in range(T - 2, -1, -1):
            J = sm.gains[..., t, :, :]
            loc = f.means[..., t, :] + _mv(J, z[t + 1] - f.predicted_means[..., t + 1, :])
            cov = f.covs[..., t, :, :] - J @ f.predicted_covs[..., t + 1, :, :] @ J.mT
            cov = 0.5 * (cov + cov.mT)
            z[t] = loc + _mv(psd_sqrt(cov), noise[..., t, :])
            cond[t] = (loc, cov)
        zs = torch.stack(z, -2)
        jitter = 1e-9 * torch.eye(self.z_dim, dtype=a.dtype, device=a.device)
        terms = []
        for t in range(T):
            obs = dist.MultivariateNormal(
                _mv(C_t[..., t, :, :], zs[..., t, :]), covariance_matrix=self.R
            ).log_prob(a[..., t, :])
            obs = torch.where(step_mask[..., t], obs, torch.zeros_like(obs))
            if t == 0:
                prior = dist.MultivariateNormal(self.init_loc, self.init_cov).log_prob(
                    zs[..., 0, :]
                )
            else:
                mean = _mv(A_t[..., t, :, :], zs[..., t - 1, :])
                if B_t is not None:
                    mean = mean + _mv(B_t[..., t, :, :], u[..., t, :])
                prior = dist.MultivariateNormal(mean, covariance_matrix=self.Q).log_prob(
                    zs[..., t, :]
                )
            post = dist.MultivariateNormal(cond[t][0], covariance_matrix=cond[t][1] + jitter)
            terms.append(obs + prior - post.log_prob(zs[..., t, :]))
        terms = torch.stack(terms, -1)
        # move the terms of padded steps onto each sequence's last real step
        lengths = step_mask.long().sum(-1, keepdim=True)  # (..., 1)
        tail = torch.flip(torch.cumsum(torch.flip(terms, [-1]), -1), [-1])  # sum_{s >= t}
        idx = torch.arange(T, device=a.device)
        last = idx == (lengths - 1)
        return torch.where(last, tail, terms)

    def observe(self, state, t, x, mask, features):
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

    def guide_init(self, state, x, mask):
        loc, scale = self.encode(x)
        state.shared["q_loc"], state.shared["q_scale"] = loc, scale

    def guide_step(self, state, t, x, mask):
        loc = state.shared_at("q_loc", t)
        scale = state.shared_at("q_scale", t)
        ok = self._step_observed(state, t, mask)
        pyro.sample(f"a_{t + 1}", masked(dist.Normal(loc, scale).to_event(1), ok))

    # ------------------------------------------------------------------ imputation (thesis 6.4)

    @torch.no_grad()
    def filter_encodings(self, a, observed_steps, inputs=None, smooth=True):
        r"""The LGSSM of the KVAE on encodings with missing steps, gamma estimated recursively
        (thesis 6.4, eq. 6.12-6.13).

        Forward pass: at step t the dynamics network gives ``gamma_t`` from ``a_{0:t-1}``; an
        observed step uses its encoding ``a_t`` (and updates the filter), a missing step uses
        the predicted encoding ``a_hat_t = C_t mu_{t|t-1}`` (the mean of eq. 6.13, where the
        thesis draws a sample) as the input of the dynamics network at ``t + 1``. Then, with
        ``smooth=True``, the RTS smoother runs with the estimated ``A_t, B_t, C_t`` (exact given
        them, as the thesis notes).

        :param a: encodings ``(batch, T, a_dim)`` (e.g. the encoder means), finite at observed
            steps; any values at missing steps.
        :param observed_steps: bool ``(batch, T)`` (or exactly 0/1), True where ``a_t`` is
            observed.
        :param inputs: controls ``u_{1:T}`` ``(batch, T, control_dim)``, required exactly when
            ``control_dim > 0`` (entry 0 unused: ``B_t u_t`` enters the prediction from t = 2,
            eq. 6.1); None otherwise.
        :returns: :class:`KVAEFilterResult`.
        :raises ValueError: naming the argument: ``a`` of the wrong shape or non-finite at an
            observed step, ``observed_steps`` not ``(batch, T)`` 0/1, ``inputs`` missing,
            unexpected, of the wrong shape or non-finite (the messages of the Pyro programs).
        """
        if (
            not torch.is_tensor(a)
            or a.dim() != 3
            or a.shape[-1] != self.a_dim
            or not a.is_floating_point()
        ):
            raise ValueError(
                f"a must be a floating-point tensor of shape (batch, T, a_dim = "
                f"{self.a_dim}), got "
                f"{tuple(a.shape) if torch.is_tensor(a) else type(a).__name__}"
            )
        B, T, _ = a.shape
        observed_steps, inputs = self._check_steps_and_inputs((B, T), observed_steps, inputs, a)
        bad = ~torch.isfinite(a).all(-1) & observed_steps
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"a has a non-finite value at an observed step (sequence {b}, step "
                f"{t}); mark the step unobserved in observed_steps or give a finite "
                f"encoding"
            )
        m, P = self.init_loc.expand(B, self.z_dim), self.init_cov.expand(B, self.z_dim, self.z_dim)
        prev = self.a0.expand(B, self.a_dim)
        hidden = self.dynamics.initial(a, (B,))
        used, alphas = [], []
        for t in range(T):
            u_t = None if inputs is None else inputs[:, t]
            alpha, hidden, m, P, step = self._predict(m, P, prev, hidden, t, u_t)
            m, P, prev = self._absorb(step, m, P, a[:, t], observed_steps[:, t])
            used.append(prev)
            alphas.append(alpha)
        a_used, alpha = torch.stack(used, 1), torch.stack(alphas, 1)
        A_t, B_t, C_t = self.mix(alpha)
        args = (
            a_used,
            self.init_loc,
            self.init_cov,
            A_t,
            self.Q,
            C_t,
            self.R,
            B_t,
            inputs,
            observed_steps,
        )
        out = KVAEFilterResult(a=a_used, alpha=alpha, A=A_t, B=B_t, C=C_t)
        if smooth:
            sm = kalman_smoother(*args, validate_args=False)
            out.update(filtered=sm.filtered, smoothed=sm, a_smoothed=_mv(C_t, sm.means))
            f = sm.filtered
        else:
            f = kalman_filter(*args, validate_args=False)
            out.update(filtered=f, smoothed=None, a_smoothed=None)
        out["a_filtered"] = _mv(C_t, f.means)
        return out

    @torch.no_grad()
    def impute_steps(self, x, observed_steps, method, inputs=None):
        """The contract's hook for :func:`pyro_seq.tasks.impute` with ``method`` ``"smoothing"``,
        ``"filtering"`` or ``"generation"``: the pixel probabilities of :meth:`impute_frames`."""
        return self.impute_frames(x, observed_steps, method, inputs=inputs)[0]

    def impute_frames(self, x, observed_steps, method="smoothing", inputs=None, num_initial=4):
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

    def _check_steps_and_inputs(self, shape, observed_steps, inputs, like):
        """``observed_steps`` as a bool ``(batch, T)`` tensor and ``inputs`` checked by the
        package's validator (:func:`~pyro_seq.validation.validate_inputs`: the messages of the
        Pyro programs), in ``like``'s dtype; controls are known at every step, so all must be
        finite."""
        seen = validate_mask(
            observed_steps, tuple(shape), device=like.device, name="observed_steps"
        )
        every = torch.ones(tuple(shape), dtype=torch.bool, device=like.device)
        inputs = validate_inputs(
            inputs, tuple(shape), self.control_dim, every, like.dtype, like.device
        )
        return seen, inputs

    @torch.no_grad()
    def generate(self, num_sequences, num_steps, inputs=None, return_codes=False):
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
