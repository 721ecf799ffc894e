r"""The members of :class:`~pyro_seq.distributions.linear_gaussian_ssm.LinearGaussianSSM` that
make it a drop-in for Pyro's :class:`~pyro.distributions.GaussianHMM`: the filter's result (a
``MultivariateNormal`` of the final state, as ``GaussianHMM.filter``), the forecast tuple, and
the constructions ``from_gaussian_hmm``, ``prefix_condition`` and ``conjugate_update`` (thesis
eqs. 3.4-3.12). The methods of the class document them; the functions here take the model
(``ssm``) and its constructor (``build``) as arguments.
"""

from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, Optional, Tuple, Type, Union

import torch
from pyro.distributions import GaussianHMM, MultivariateNormal
from torch import Tensor
from torch.distributions import Distribution
from torch.types import _size

from pyro_seq.ops.kalman import KalmanFilterResult
from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.pyro_internals import copy_validate_args, gaussian_hmm_factors

if TYPE_CHECKING:
    from pyro_seq.distributions.linear_gaussian_ssm import LinearGaussianSSM

__all__ = [
    "conjugate_update",
    "expand_filter",
    "expand_to",
    "from_gaussian_hmm",
    "prefix_condition",
]


class LGSSMForecast(NamedTuple):
    """Forecast of ``steps`` future steps given x_{1:T} (thesis Sec. 3.4.2).

    ``means (..., steps, D)`` and ``covs (..., steps, D, D)`` of p(x_{T+k} | x_{1:T});
    ``state_means (..., steps, S)`` and ``state_covs (..., steps, S, S)`` of p(z_{T+k} | x_{1:T}).
    """

    means: Tensor
    covs: Tensor
    state_means: Tensor
    state_covs: Tensor


class LGSSMFilterResult(MultivariateNormal):
    """What :meth:`LinearGaussianSSM.filter` returns: the filtering distribution of the final
    state, p(z_T | x_{1:T}) = N(means_T, covs_T) (thesis eq. 3.11), as a Pyro
    ``MultivariateNormal`` exactly like ``GaussianHMM.filter`` (``.loc (..., S)``,
    ``.covariance_matrix (..., S, S)``; usable as ``initial_dist`` of a ``GaussianHMM``), which
    also carries the Kalman filter of every step: ``means (..., T, S)``, ``covs (..., T, S, S)``,
    ``predicted_means``, ``predicted_covs`` and ``log_likelihoods (..., T)`` as in
    :class:`pyro_seq.ops.KalmanFilterResult` (``.result`` is that tuple; the object also unpacks
    and indexes like it).

    ``covariance_matrix`` is the filter's covariance itself; its Cholesky factor (for
    ``scale_tril``, ``precision_matrix``, ``log_prob``, ``rsample``, ``entropy``) is computed on
    first use, so a singular final covariance (noise-free states) is allowed until one of those
    is asked for, which then raises a ``ValueError``.
    """

    def __init__(self, result: KalmanFilterResult, validate_args: Optional[bool] = None) -> None:
        self.result = result
        self.loc = result.means[..., -1, :]
        self.covariance_matrix = result.covs[..., -1, :, :]
        # the moments come from a validated model: no argument checks (they would factorise)
        super(torch.distributions.MultivariateNormal, self).__init__(
            self.loc.shape[:-1], self.loc.shape[-1:], validate_args=False
        )
        self._validate_args = bool(validate_args)

    @property
    def _unbroadcasted_scale_tril(self) -> Tensor:
        L = self.__dict__.get("_cholesky")
        if L is None:
            L, info = torch.linalg.cholesky_ex(self.covariance_matrix)
            if bool((info != 0).any()):
                raise ValueError(
                    "the filtered covariance Cov(z_T | x_{1:T}) is singular (e.g. noise-free "
                    "states), so this MultivariateNormal has no scale_tril, precision, density "
                    "or reparameterized samples; use .loc and .covariance_matrix (or .means and "
                    ".covs) instead."
                )
            self.__dict__["_cholesky"] = L
        return L

    @_unbroadcasted_scale_tril.setter
    def _unbroadcasted_scale_tril(self, value: Tensor) -> None:
        self.__dict__["_cholesky"] = value

    def expand(
        self, batch_shape: _size, _instance: Optional["LGSSMFilterResult"] = None
    ) -> "LGSSMFilterResult":
        return LGSSMFilterResult(
            expand_filter(self.result, torch.Size(batch_shape)),
            validate_args=self.__dict__.get("_validate_args"),
        )

    means = property(lambda self: self.result.means)
    covs = property(lambda self: self.result.covs)
    predicted_means = property(lambda self: self.result.predicted_means)
    predicted_covs = property(lambda self: self.result.predicted_covs)
    log_likelihoods = property(lambda self: self.result.log_likelihoods)

    def __iter__(self) -> Iterator[Tensor]:  # ``means, covs, pm, pc, ll = d.filter(x)`` as before
        return iter(self.result)

    def __getitem__(self, index: Union[int, slice]) -> Union[Tensor, Tuple[Tensor, ...]]:
        return self.result[index]


def expand_filter(res: KalmanFilterResult, batch: _size) -> KalmanFilterResult:
    """The Kalman filter's result ``res`` with its batch dimensions expanded to ``batch``."""
    return KalmanFilterResult(*(expand_to(r, batch, n) for r, n in zip(res, (2, 3, 2, 3, 1))))


def expand_to(t: Tensor, batch: _size, event_ndim: int) -> Tensor:
    """``t`` with batch shape ``batch`` in front of its last ``event_ndim`` dimensions."""
    ev = t.shape[t.dim() - event_ndim :]
    return t.expand(torch.Size(batch) + ev)


def from_gaussian_hmm(
    cls: Type["LinearGaussianSSM"],
    hmm: GaussianHMM,
    num_steps: Optional[int] = None,
    **kwargs: Any,
) -> "LinearGaussianSSM":
    """``cls.from_gaussian_hmm(hmm, num_steps, **kwargs)``: see
    :meth:`~pyro_seq.distributions.linear_gaussian_ssm.LinearGaussianSSM.from_gaussian_hmm`."""
    from pyro.distributions import GaussianHMM
    from pyro.ops.gaussian import AffineNormal

    if not isinstance(hmm, GaussianHMM):
        raise ValueError(f"from_gaussian_hmm expects a pyro GaussianHMM, got {type(hmm).__name__}")
    S = hmm.hidden_dim

    def moments(g):  # Gaussian -> (loc, cov)
        cov = torch.cholesky_inverse(torch.linalg.cholesky(g.precision))
        return (cov @ g.info_vec.unsqueeze(-1)).squeeze(-1), cov

    def affine(f, x_dim):  # factor of y = x @ M + N(loc, cov) -> (M^T, loc, cov)
        if isinstance(f, AffineNormal):
            return f.matrix.mT, f.loc, f.scale.pow(2).diag_embed()
        P = f.precision
        cov = torch.cholesky_inverse(torch.linalg.cholesky(P[..., x_dim:, x_dim:]))
        loc = (cov @ f.info_vec[..., x_dim:].unsqueeze(-1)).squeeze(-1)
        return -cov @ P[..., x_dim:, :x_dim], loc, cov

    init, trans, obs = gaussian_hmm_factors(hmm)
    mu0, P0 = moments(init)
    A, b, Q = affine(trans, S)
    C, d, R = affine(obs, S)
    # time entry 0 of the HMM's transition produces z_1 from z_0
    A1 = A[..., 0, :, :] if A.dim() > 2 else A
    b1 = b[..., 0, :] if b.dim() > 1 else b
    Q1 = Q[..., 0, :, :] if Q.dim() > 2 else Q
    initial_loc = (A1 @ mu0.unsqueeze(-1)).squeeze(-1) + b1
    initial_cov = A1 @ P0 @ A1.mT + Q1
    initial_cov = 0.5 * (initial_cov + initial_cov.mT)  # exact in exact arithmetic
    if b.dim() == 1:
        b = b.unsqueeze(0)
    if d.dim() == 1:
        d = d.unsqueeze(0)
    # zero offsets are dropped (cheaper recursions) unless they carry gradients
    controls = b if b.requires_grad or bool((b != 0).any()) else None
    offset = d if d.requires_grad or bool((d != 0).any()) else None
    if num_steps is None:
        num_steps = hmm.duration
    return cls(
        initial_loc,
        initial_cov,
        A,
        Q,
        C,
        R,
        None,
        controls,
        num_steps=num_steps,
        observation_offset=offset,
        **kwargs,
    )


def prefix_condition(
    ssm: "LinearGaussianSSM", data: Tensor, build: Callable[..., "LinearGaussianSSM"]
) -> "LinearGaussianSSM":
    """``ssm.prefix_condition(data)``, the model built with ``build`` (the class's constructor):
    see :meth:`~pyro_seq.distributions.linear_gaussian_ssm.LinearGaussianSSM.prefix_condition`."""
    T = ssm.num_steps
    if T is None:
        raise ValueError(
            "prefix_condition needs the model's length T (duration is None for a model "
            "constant in time); construct the LinearGaussianSSM with num_steps=T."
        )
    if not torch.is_tensor(data) or data.dim() < 2 or data.shape[-1] != ssm.obs_dim:
        shape = tuple(data.shape) if torch.is_tensor(data) else type(data).__name__
        raise ValueError(
            f"prefix_condition expects data of shape (..., t, {ssm.obs_dim}); got {shape}"
        )
    t = data.shape[-2]
    if not 1 <= t < T:
        raise ValueError(
            f"prefix_condition needs 1 <= t < T = {T} observed steps to "
            f"forecast the rest; data has t = {t}"
        )
    mask = ssm.observation_mask
    kw = {}
    if mask is not None:  # per element, (..., T, D): step_mask=True says so
        kw = dict(
            observation_mask=mask[..., :t, :],
            step_mask=torch.ones((), dtype=torch.bool, device=mask.device),
        )
    fc = ssm.predict(data, T - t, **kw)
    P = fc.state_covs[..., 0, :, :]

    def tail(p, event_ndim):
        if p is None or p.dim() <= event_ndim or p.shape[-event_ndim - 1] == 1:
            return p
        return p[(..., slice(t, None)) + (slice(None),) * event_ndim]

    new = build(
        fc.state_means[..., 0, :],
        0.5 * (P + P.mT),
        tail(ssm.transition_matrix, 2),
        tail(ssm.transition_cov, 2),
        tail(ssm.observation_matrix, 2),
        tail(ssm.observation_cov, 2),
        tail(ssm.control_matrix, 2),
        tail(ssm.controls, 1),
        num_steps=T - t,
        observation_mask=None if mask is None else mask[..., t:, :],
        step_mask=None if mask is None else kw["step_mask"],
        observation_offset=tail(ssm.observation_offset, 1),
        nan_as_missing=ssm.nan_as_missing,
        method=ssm.method,
        validate_args=False,
    )
    return copy_validate_args(ssm, new)


def conjugate_update(
    ssm: "LinearGaussianSSM", other: Distribution, build: Callable[..., "LinearGaussianSSM"]
) -> Tuple["LinearGaussianSSM", Tensor]:
    """``ssm.conjugate_update(other)``, the models built with ``build`` (the class's
    constructor): see
    :meth:`~pyro_seq.distributions.linear_gaussian_ssm.LinearGaussianSSM.conjugate_update`."""
    from torch.distributions import Independent, Normal
    from torch.distributions import MultivariateNormal as MVN

    if not (
        isinstance(other, Independent)
        and (
            (isinstance(other.base_dist, Normal) and other.reinterpreted_batch_ndims == 2)
            or (isinstance(other.base_dist, MVN) and other.reinterpreted_batch_ndims == 1)
        )
    ):
        got = type(other).__name__
        if isinstance(other, Independent):
            got += f"({type(other.base_dist).__name__}, {other.reinterpreted_batch_ndims})"
        raise TypeError(
            "conjugate_update expects other = Independent(Normal, 2) or "
            f"Independent(MultivariateNormal, 1) over (T, D) observations; got {got}"
        )
    T = ssm.num_steps if ssm.num_steps is not None else other.event_shape[0]
    D, S = ssm.obs_dim, ssm.hidden_dim
    if tuple(other.event_shape) != (T, D):
        raise ValueError(
            f"conjugate_update needs other.event_shape == (T, D) = ({T}, {D}); "
            f"got {tuple(other.event_shape)}"
        )
    if ssm.observation_mask is not None or ssm.nan_as_missing:
        raise NotImplementedError(
            "LinearGaussianSSM.conjugate_update is not implemented for a model with "
            "observation_mask, step_mask or nan_as_missing, because masked entries are left "
            "out of log_prob so the product with other is no density over all of x; call it "
            "on the same model built without masks."
        )
    base = other.base_dist
    if isinstance(base, Normal):
        loc, G = base.loc, base.scale.pow(2).diag_embed()
    else:
        loc, G = base.loc, base.covariance_matrix
    loc = loc.expand(other.batch_shape + (T, D))
    out_batch = broadcast_shapes(ssm.batch_shape, other.batch_shape)

    def step(p, t, event_ndim):  # entry t of a parameter with optional time dim
        if p is None or p.dim() <= event_ndim:
            return p
        return p.select(-event_ndim - 1, t if p.shape[-event_ndim - 1] > 1 else 0)

    R = ssm.observation_cov
    Rg = R + G
    # the normaliser: this model with observation noise R + G, evaluated at l
    log_normalizer = (
        build(
            ssm.initial_loc,
            ssm.initial_cov,
            ssm.transition_matrix,
            ssm.transition_cov,
            ssm.observation_matrix,
            Rg,
            ssm.control_matrix,
            ssm.controls,
            num_steps=T,
            observation_offset=ssm.observation_offset,
            method=ssm.method,
            validate_args=False,
        )
        .log_prob(loc)
        .expand(out_batch)
    )

    # observation factor of the product: W = (R + G)^{-1} R
    L = torch.linalg.cholesky(Rg)
    R_b = R.expand(Rg.shape)
    W = torch.cholesky_solve(R_b, L)
    Wt = W.mT
    C = ssm.observation_matrix
    d = ssm.observation_offset
    new_C = C - Wt @ C
    resid = loc if d is None else loc - d
    new_d = (Wt @ resid.unsqueeze(-1)).squeeze(-1)
    if d is not None:
        new_d = new_d + d
    new_R = R_b - R_b @ W
    new_R = 0.5 * (new_R + new_R.mT)

    # information of the pseudo-observations l_t ~ N(C z_t + d_t, R_t + G_t)
    C_b = C.expand(Rg.shape[:-2] + C.shape[-2:])
    RinvC = torch.cholesky_solve(C_b, L)  # (..., T, D, S)
    J = C_b.mT @ RinvC  # (..., T, S, S)
    h = (RinvC.mT @ resid.unsqueeze(-1)).squeeze(-1)  # (..., T, S)
    J = 0.5 * (J + J.mT)
    b = ssm.controls
    if b is not None and ssm.control_matrix is not None:
        b = (ssm.control_matrix @ b.unsqueeze(-1)).squeeze(-1)  # (..., T|1, S)
    eye = torch.eye(S, dtype=J.dtype, device=J.device)

    def update(loc_prior, cov, lam, eta):  # N(loc_prior, cov) times exp(-z'Λz/2 + η'z)
        N = eye + cov @ lam
        new_cov = torch.linalg.solve(N, cov)
        return (
            N,
            0.5 * (new_cov + new_cov.mT),
            (
                torch.linalg.solve(
                    N, (loc_prior + (cov @ eta.unsqueeze(-1)).squeeze(-1)).unsqueeze(-1)
                ).squeeze(-1)
            ),
        )

    # per-step lists, stacked into tensors below
    A_new: Any
    Q_new: Any
    b_new: Any
    A_new, Q_new, b_new = [None] * T, [None] * T, [None] * T
    lam, eta = step(J, T - 1, 2), step(h, T - 1, 1)
    for t in range(T - 1, 0, -1):
        A, Q = step(ssm.transition_matrix, t, 2), step(ssm.transition_cov, t, 2)
        bt = step(b, t, 1)
        bt = torch.zeros(S, dtype=J.dtype, device=J.device) if bt is None else bt
        N, Q_new[t], b_new[t] = update(bt, Q, lam, eta)
        A_new[t] = torch.linalg.solve(N, A)
        # message to z_{t-1}: M = (I + Λ Q)^{-1} Λ, ν = (I + Λ Q)^{-1} η at A z + b
        M = torch.linalg.solve(N.mT, lam)
        M = 0.5 * (M + M.mT)
        nu = torch.linalg.solve(N.mT, eta.unsqueeze(-1)).squeeze(-1)
        nu = nu - (M @ bt.unsqueeze(-1)).squeeze(-1)
        lam = A.mT @ M @ A + step(J, t - 1, 2)
        lam = 0.5 * (lam + lam.mT)
        eta = (A.mT @ nu.unsqueeze(-1)).squeeze(-1) + step(h, t - 1, 1)
    _, init_cov, init_loc = update(ssm.initial_loc, ssm.initial_cov, lam, eta)
    # entry 0 is unused: the original transition and no offset
    A_new[0] = step(ssm.transition_matrix, 0, 2)
    Q_new[0] = step(ssm.transition_cov, 0, 2)
    b_new[0] = torch.zeros(S, dtype=J.dtype, device=J.device)
    A_new = torch.stack(torch.broadcast_tensors(*A_new), -3)
    Q_new = torch.stack(torch.broadcast_tensors(*Q_new), -3)
    b_new = torch.stack(torch.broadcast_tensors(*b_new), -2)
    updated = build(
        init_loc,
        init_cov,
        A_new,
        Q_new,
        new_C,
        new_R,
        None,
        b_new,
        num_steps=T,
        observation_offset=new_d,
        method=ssm.method,
        validate_args=False,
    )
    updated = copy_validate_args(ssm, updated)
    if updated.batch_shape != out_batch:
        updated = updated.expand(out_batch)
    return updated, log_normalizer
