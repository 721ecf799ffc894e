"""A linear-Gaussian state-space model with exact proposals: the test bed of the objectives.

Generative model (thesis 3.2, column-vector convention of the design notes)::

    z_1 ~ N(m_0, P_0)
    z_t ~ N(A z_{t-1}, Q)          t = 2..T
    x_t ~ N(C z_t, R)              t = 1..T

with ``z_t`` of size ``S = state_dim`` and ``x_t`` of size ``D = obs_dim``. Because ``log p(x)``
is known exactly (:meth:`LinearGaussianSequenceModel.exact_log_likelihood`), every bound and
estimator of :mod:`pyro_seq.infer` can be checked against it. Three guides (``q(z_t | z_{t-1},
x)``), all following the step protocol of :mod:`pyro_seq.models.base`:

* ``"prior"``: ``q = p(z_t | z_{t-1})``, the bootstrap proposal of a particle filter;
  incremental weights are ``p(x_t | z_t)``.
* ``"optimal"``: the locally optimal proposal ``q = p(z_t | z_{t-1}, x_t)`` (thesis eq. 3.19),
  with gain ``K = Q C^T (C Q C^T + R)^{-1}``, mean ``A z_{t-1} + K (x_t - C A z_{t-1})`` and
  covariance ``(I - K C) Q``; its incremental weight ``p(x_t | z_{t-1})`` does not depend on
  ``z_t``.
* ``"smoothing"``: the exact posterior transition ``q = p(z_t | z_{t-1}, x_{t:T})``, obtained
  from a backward information filter run in ``guide_init``. Its importance weight is
  ``p(x_{1:T})`` for every sample, so the ELBO, IWAE and FIVO all equal ``log p(x)`` with zero
  variance.

Backward information filter: ``beta_t(z) = p(x_{t+1:T} | z_t = z) \\propto exp(-z^T J_t z / 2 +
h_t^T z)`` with ``J_T = 0, h_T = 0``; including the emission at ``t``, ``J'_t = J_t + C^T R^{-1}
C``, ``h'_t = h_t + C^T R^{-1} x_t``; with ``L = chol(Q)`` and ``M = I + L^T J' L``,

    J_{t-1} = A^T (J' - J' L M^{-1} L^T J') A,      h_{t-1} = A^T (h' - J' L M^{-1} L^T h'),

and the posterior transition is ``N(L M^{-1} (L^{-1} mu + L^T h'_t), L M^{-1} L^T)`` with prior
mean ``mu = A z_{t-1}`` (``L = chol(P_0)``, ``mu = m_0`` at ``t = 1``). Only Cholesky solves of
SPD matrices are used, never ``torch.inverse``.

Particles: every step accepts per-particle state tensors ``(K, batch, S)`` as well as
``(batch, S)``; ``x`` is always ``(batch, T, D)`` and ``mask`` ``(batch, T)``.
"""

from typing import Any, Iterable, Optional, Tuple, Union

import pyro
import pyro.distributions as dist
import torch
import torch.nn as nn
import torch.nn.functional as F

from pyro_seq.models.base import SequenceModel, check_sequences
from pyro_seq.models.contract import example
from pyro_seq.ops.kalman import covariance_problem, kalman_filter
from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.ops.linalg import sym as _sym
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import positive_int, validate_generate_args

__all__ = ["LinearGaussianSequenceModel"]

_PARAM_NAMES = ("A", "C", "Q", "R", "init_loc", "init_cov")
GUIDES = ("prior", "optimal", "smoothing")


def _matvec(M, v):
    """``M @ v`` broadcasting: ``M`` ``(..., m, n)``, ``v`` ``(..., n)`` -> ``(..., m)``."""
    return (M @ v.unsqueeze(-1)).squeeze(-1)


def _softplus_inv(y):
    return y + torch.log(-torch.expm1(-y))


class LinearGaussianSequenceModel(SequenceModel):
    """Linear-Gaussian SSM as a step-protocol model/guide pair with exact proposals.

    :param int obs_dim: ``D``.
    :param int state_dim: ``S``.
    :param A: ``(S, S)`` transition matrix (default ``0.9 I``).
    :param C: ``(D, S)`` emission matrix (default: ones on the diagonal, zeros elsewhere).
    :param Q: ``(S, S)`` transition noise covariance (default ``0.5 I``).
    :param R: ``(D, D)`` observation noise covariance (default ``0.5 I``).
    :param init_loc: ``(S,)`` mean ``m_0`` of ``z_1`` (default zeros).
    :param init_cov: ``(S, S)`` covariance ``P_0`` of ``z_1`` (default ``I``).
    :param learnable: ``True`` (all six are ``nn.Parameter``), ``False`` (all buffers) or an
        iterable of names from ``("A", "C", "Q", "R", "init_loc", "init_cov")``. Covariances
        are learned through their Cholesky factors (softplus diagonal).
    :param str guide: ``"prior"``, ``"optimal"`` or ``"smoothing"`` (module docstring).
    :param float jitter: added to the diagonal of every covariance factorisation.
    """

    module_name = "linear_gaussian_ssm"
    #: The likelihood is exact (the Kalman filter), so the ``"exact"`` method of
    #: :func:`pyro_seq.train.evaluate_bound` calls :meth:`exact_log_likelihood`.
    evaluation_methods = ("elbo", "iwae", "smc", "exact")
    small_example = example(obs_dim=2, state_dim=2)
    # parameters or buffers, by ``learnable`` (set by ``_register``)
    A: torch.Tensor
    C: torch.Tensor
    init_loc: torch.Tensor

    def __init__(
        self,
        obs_dim: int,
        state_dim: int,
        A: Optional[torch.Tensor] = None,
        C: Optional[torch.Tensor] = None,
        Q: Optional[torch.Tensor] = None,
        R: Optional[torch.Tensor] = None,
        init_loc: Optional[torch.Tensor] = None,
        init_cov: Optional[torch.Tensor] = None,
        learnable: Union[bool, Iterable[str], None] = True,
        guide: str = "smoothing",
        jitter: float = 0.0,
    ) -> None:
        super().__init__(obs_dim)
        S, D = positive_int("state_dim", state_dim), self.obs_dim
        if guide not in GUIDES:
            raise ValueError(f"guide must be one of {GUIDES}, got {guide!r}")
        self.state_dim, self.guide_type, self.jitter = S, guide, float(jitter)
        if learnable is True:
            learnable = set(_PARAM_NAMES)
        elif learnable is False or learnable is None:
            learnable = set()
        else:
            learnable = set(learnable)
            unknown = learnable - set(_PARAM_NAMES)
            if unknown:
                raise ValueError(f"unknown learnable names {sorted(unknown)}; use {_PARAM_NAMES}")
        self.learnable = frozenset(learnable)

        def tensor(value, default, shape, name):
            value = (
                default
                if value is None
                else torch.as_tensor(value, dtype=torch.get_default_dtype())
            )
            if value.shape != shape:
                raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")
            return value.clone()

        eye = torch.eye(S)
        A = tensor(A, 0.9 * eye, (S, S), "A")
        C = tensor(C, torch.eye(D, S), (D, S), "C")
        Q = tensor(Q, 0.5 * eye, (S, S), "Q")
        R = tensor(R, 0.5 * torch.eye(D), (D, D), "R")
        init_loc = tensor(init_loc, torch.zeros(S), (S,), "init_loc")
        init_cov = tensor(init_cov, eye, (S, S), "init_cov")
        self._register("A", A)
        self._register("C", C)
        self._register("init_loc", init_loc)
        for name, cov in (("Q", Q), ("R", R), ("init_cov", init_cov)):
            # the package's covariance check (pyro_seq.ops.kalman.covariance_problem)
            problem = covariance_problem(cov, definite=True)
            if problem is not None:
                raise ValueError(
                    f"{name} must be a symmetric positive definite matrix (it is "
                    f"learned through its Cholesky factor): {name} {problem}"
                )
            L = torch.linalg.cholesky(cov)
            raw = torch.tril(L, -1) + torch.diag_embed(_softplus_inv(L.diagonal()))
            self._register(f"_{name}_raw", raw, learn=name in self.learnable)

    def _register(self, name, value, learn=None):
        learn = (name in self.learnable) if learn is None else learn
        if learn:
            setattr(self, name, nn.Parameter(value))
        else:
            self.register_buffer(name, value)

    # ---------------------------------------------------------------- parameters
    def _tril(self, name):
        raw = getattr(self, f"_{name}_raw")
        L = torch.tril(raw, -1) + torch.diag_embed(F.softplus(raw.diagonal()))
        if self.jitter:
            eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device)
            L = torch.linalg.cholesky(_sym(L @ L.T) + self.jitter * eye)
        return L

    @property
    def Q_tril(self) -> torch.Tensor:
        """``(S, S)`` lower Cholesky factor of ``Q``."""
        return self._tril("Q")

    @property
    def R_tril(self) -> torch.Tensor:
        """``(D, D)`` lower Cholesky factor of ``R``."""
        return self._tril("R")

    @property
    def init_tril(self) -> torch.Tensor:
        """``(S, S)`` lower Cholesky factor of ``P_0``."""
        return self._tril("init_cov")

    @property
    def Q(self) -> torch.Tensor:
        L = self.Q_tril
        return L @ L.T

    @property
    def R(self) -> torch.Tensor:
        L = self.R_tril
        return L @ L.T

    @property
    def init_cov(self) -> torch.Tensor:
        L = self.init_tril
        return L @ L.T

    # ---------------------------------------------------------------- model
    def _prior_loc(self, state, t, key):
        """Mean of ``p(z_t | z_{t-1})``: ``m_0`` at ``t = 0`` else ``A z_{t-1}`` (``state[key]``)."""
        if t == 0:
            return self.init_loc
        return _matvec(self.A, state[key])

    def _prior_tril(self, t):
        return self.init_tril if t == 0 else self.Q_tril

    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        self._observed_steps(state, mask)  # refuses element-level missing data
        # z_1 has its own prior; nothing else to carry

    @staticmethod
    def _observed_steps(state, mask):
        """``mask`` and the per-step ``observed=`` (missing steps are unobserved); missing data
        here is per step: a step with some but not all elements observed is refused (the
        marginal of a full-covariance emission over a subset of dims is not implemented)."""
        seen = state.shared.get("observed")
        if seen is None:
            return mask
        whole = seen.all(-1)
        if not torch.equal(whole, seen.any(-1)):
            raise ValueError(
                "LinearGaussianSequenceModel supports missing data per step only: "
                "observed must be all True or all False across the features of a step"
            )
        return mask & whole

    def model_step(  # type: ignore[override]  # time_parallel is False: t is never a slice
        self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        m_t = mask[:, t]
        seen = state.shared.get("observed")
        m_x = m_t if seen is None else m_t & seen[:, t].all(-1)
        loc = self._prior_loc(state, t, "z")
        loc = loc.expand(broadcast_shapes(loc.shape, (x.shape[0], self.state_dim)))
        z = pyro.sample(
            f"z_{t + 1}", dist.MultivariateNormal(loc, scale_tril=self._prior_tril(t)).mask(m_t)
        )
        pyro.sample(
            f"x_{t + 1}",
            dist.MultivariateNormal(_matvec(self.C, z), scale_tril=self.R_tril).mask(m_x),
            obs=x[:, t],
        )
        state["z"] = z

    @classmethod
    def for_data(
        cls,
        obs_dim: int,
        input_dim: int = 0,
        state_dim: Optional[int] = None,
        **options: Any,
    ) -> "LinearGaussianSequenceModel":
        """The test bed for ``obs_dim`` features per step; ``state_dim`` defaults to ``obs_dim``."""
        if input_dim:
            return super().for_data(obs_dim, input_dim)
        return cls(obs_dim, obs_dim if state_dim is None else state_dim, **options)

    @torch.no_grad()
    def generate(self, num_sequences: int, num_steps: int) -> Tuple[torch.Tensor, Any]:
        """Ancestral samples: ``z_1 ~ N(m_0, P_0)``, ``z_t ~ N(A z_{t-1}, Q)``,
        ``x_t ~ N(C z_t, R)`` (Fraccaro 2018, eq. 3.1-3.2).

        :returns: ``(x, means)``: samples and the emission means ``C z_t``, both
            ``(num_sequences, num_steps, D)``."""
        B, T = validate_generate_args(num_sequences, num_steps)
        z = dist.MultivariateNormal(self.init_loc, scale_tril=self.init_tril).sample((B,))
        frames, means = [], []
        for t in range(T):
            if t > 0:
                z = dist.MultivariateNormal(_matvec(self.A, z), scale_tril=self.Q_tril).sample()
            means.append(_matvec(self.C, z))
            frames.append(dist.MultivariateNormal(means[-1], scale_tril=self.R_tril).sample())
        return torch.stack(frames, 1), torch.stack(means, 1)

    # ---------------------------------------------------------------- guides
    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        state.shared["emitted"] = self._observed_steps(state, mask)  # steps with an observation
        if self.guide_type == "optimal":
            state.shared["optimal"] = [self._optimal_gain(t) for t in (0, 1)]
        elif self.guide_type == "smoothing":
            G, g, tril = self._backward_information_filter(x, state.shared["emitted"])
            state.shared["G"], state.shared["g"], state.shared["tril"] = G, g, tril

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        m_t = mask[:, t]
        batch = x.shape[0]
        prior_loc = self._prior_loc(state, t, "guide_z")
        if self.guide_type == "prior":
            loc, tril = prior_loc, self._prior_tril(t)
        elif self.guide_type == "optimal":
            K, tril_post = state.shared["optimal"][min(t, 1)]
            innovation = x[:, t] - _matvec(self.C, prior_loc)  # (*, batch, D)
            loc_post = prior_loc + _matvec(K, innovation)
            # padded or missing steps: propose from the prior
            e_t = state.shared["emitted"][:, t]
            loc = torch.where(e_t.unsqueeze(-1), loc_post, prior_loc)
            tril = torch.where(e_t[:, None, None], tril_post, self._prior_tril(t))
        else:
            G, g, tril = (
                state.shared["G"][:, t],
                state.shared["g"][:, t],
                state.shared["tril"][:, t],
            )
            loc = _matvec(G, prior_loc) + g
        loc = loc.expand(broadcast_shapes(loc.shape, (batch, self.state_dim)))
        z = pyro.sample(f"z_{t + 1}", dist.MultivariateNormal(loc, scale_tril=tril).mask(m_t))
        state["guide_z"] = z

    def _optimal_gain(self, t):
        """Gain ``K`` ``(S, D)`` and posterior factor ``(S, S)`` of ``p(z_t | z_{t-1}, x_t)``."""
        L = self._prior_tril(t)
        P = L @ L.T
        C = self.C
        Sy = _sym(C @ P @ C.T + self.R)
        Ly = torch.linalg.cholesky(Sy)
        CP = C @ P  # (D, S)
        K = torch.cholesky_solve(CP, Ly).T  # P C^T Sy^{-1}
        cov = _sym(P - K @ CP)
        return K, torch.linalg.cholesky(cov)

    def _backward_information_filter(self, x, mask):
        """Exact posterior transitions ``p(z_t | z_{t-1}, x_{t:T})`` for every ``t``.

        :returns: ``G`` ``(batch, T, S, S)``, ``g`` ``(batch, T, S)``, ``tril`` ``(batch, T, S,
            S)`` such that ``q(z_t | z_{t-1}) = N(G_t mu_t + g_t, tril_t tril_t^T)`` with ``mu_t``
            the prior mean (``m_0`` or ``A z_{t-1}``). Padded steps give the prior transition.
        """
        B, T, _ = x.shape
        S = self.state_dim
        A, C = self.A, self.C
        R_tril = self.R_tril
        eye = torch.eye(S, dtype=x.dtype, device=x.device)
        # C^T R^{-1} C and C^T R^{-1} x_t
        RinvC = torch.cholesky_solve(C, R_tril)  # (D, S)
        CtRinvC = _sym(C.T @ RinvC)
        CtRinvx = x @ RinvC  # (B, T, S)
        m = mask.to(x.dtype)
        J = x.new_zeros(B, S, S)
        h = x.new_zeros(B, S)
        G, g, tril = [None] * T, [None] * T, [None] * T
        for t in reversed(range(T)):
            Jp = J + m[:, t, None, None] * CtRinvC
            hp = h + m[:, t, None] * CtRinvx[:, t]
            L = self._prior_tril(t)
            LtJL = L.T @ Jp @ L
            M = _sym(eye + LtJL)
            N = torch.linalg.cholesky(M)
            # posterior transition: mean L M^{-1} (L^{-1} mu + L^T h'), cov L M^{-1} L^T
            Minv = torch.cholesky_solve(eye.expand(B, S, S), N)
            LMinv = L @ Minv  # (B, S, S)
            Linv = torch.linalg.solve_triangular(L, eye, upper=False)
            G[t] = LMinv @ Linv
            g[t] = _matvec(LMinv, _matvec(L.T, hp))
            tril[t] = torch.linalg.cholesky(_sym(LMinv @ L.T))
            if t > 0:
                JL = Jp @ L  # (B, S, S)
                inner_J = Jp - JL @ torch.cholesky_solve(JL.transpose(-1, -2), N)
                inner_h = hp - _matvec(
                    JL, torch.cholesky_solve(_matvec(L.T, hp).unsqueeze(-1), N).squeeze(-1)
                )
                J = _sym(A.T @ inner_J @ A)
                h = _matvec(A.T, inner_h)
        return torch.stack(G, 1), torch.stack(g, 1), torch.stack(tril, 1)

    # ---------------------------------------------------------------- exact likelihood
    def exact_log_likelihood(
        self, x: torch.Tensor, mask: Optional[torch.Tensor] = None, method: str = "kalman"
    ) -> torch.Tensor:
        """Exact ``log p(x_{1:L_b})`` of each sequence ``b`` (its first ``L_b`` steps), in float64.

        ``method="kalman"``: the Kalman filter of :func:`pyro_seq.ops.kalman.kalman_filter`
        (prediction-error decomposition, thesis eq. 3.12), ``O(T S^3)``.
        ``method="dense"``: a brute-force reference from the dense joint Gaussian of ``x``.
        The observations of one sequence are jointly Gaussian with mean ``C A^{t-1} m_0`` and
        covariance ``Cov(x_s, x_t) = C A^{t-s} Sigma_s C^T + [s = t] R`` (``s <= t``), where
        ``Sigma_1 = P_0``, ``Sigma_t = A Sigma_{t-1} A^T + Q``. Because the model is causal the
        first ``L_b`` steps have the leading sub-block as their marginal, so ragged sequences are
        handled exactly (``O((T D)^3)``; a reference, not a fast path).

        :param torch.Tensor x: ``(batch, T, D)``.
        :param mask: ``(batch, T)`` bool prefix mask or None.
        :returns: float64 tensor ``(batch,)``.
        """
        x, mask = check_sequences(x, mask, self.obs_dim)
        if method not in ("kalman", "dense"):
            raise ValueError(f"method must be 'kalman' or 'dense', got {method!r}")
        if method == "kalman":
            f = torch.float64
            # a per-element (B, T, D) mask: a per-step (B, T) one would be read per element by
            # the ops when B == T == D
            elem = mask.unsqueeze(-1).expand(x.shape)
            with torch.no_grad():
                res = kalman_filter(
                    x.to(f),
                    self.init_loc.to(f),
                    self.init_cov.to(f),
                    self.A.to(f),
                    self.Q.to(f),
                    self.C.to(f),
                    self.R.to(f),
                    mask=elem,
                    method="sequential",
                )
            return res.log_likelihoods.sum(-1)
        with torch.no_grad():
            f = torch.float64
            B, T, D = x.shape
            A, C = self.A.to(f), self.C.to(f)
            Q, R, P0, m0 = self.Q.to(f), self.R.to(f), self.init_cov.to(f), self.init_loc.to(f)
            means, covs = [m0], [P0]
            for _ in range(1, T):
                means.append(A @ means[-1])
                covs.append(A @ covs[-1] @ A.T + Q)
            mean_x = torch.cat([C @ mu for mu in means])  # (T D,)
            cov_x = torch.zeros(T * D, T * D, dtype=f, device=x.device)
            for s in range(T):
                cross = covs[s]  # Cov(z_t, z_s) for t = s
                for t in range(s, T):
                    block = C @ cross @ C.T
                    if t == s:
                        block = block + R
                    cov_x[t * D : (t + 1) * D, s * D : (s + 1) * D] = block
                    cov_x[s * D : (s + 1) * D, t * D : (t + 1) * D] = block.T
                    cross = A @ cross
            lengths = mask.sum(-1).tolist()
            out = []
            for b, L in enumerate(lengths):
                n = L * D
                d = dist.MultivariateNormal(mean_x[:n], covariance_matrix=_sym(cov_x[:n, :n]))
                out.append(d.log_prob(x[b, :L].reshape(-1).to(f)))
            return torch.stack(out)
