r"""Expectation-maximization for linear-Gaussian state-space models (thesis Sec. 3.4.3).

Model (column vectors, as in :mod:`pyro_seq.ops.kalman`)::

    z_1 ~ N(mu_{1|0}, Sigma_{1|0})
    z_t = A z_{t-1} + B u_t + eps_t,   eps_t ~ N(0, Q)      (t = 2..T)
    x_t = C z_t + delta_t,             delta_t ~ N(0, R)    (t = 1..T)

with time-invariant parameters shared by a batch of ``N`` sequences ``x`` of shape
``(*batch, T, D)``.

**E-step** (thesis eq. 2.8): the exact posterior ``p(z_{1:T} | x_{1:T})`` from the RTS smoother
of :func:`pyro_seq.ops.kalman.kalman_smoother`, summarized by the smoothed moments
``m_t = E[z_t | x]``, ``P_t = Cov(z_t | x)`` and ``P_{t,t-1} = Cov(z_t, z_{t-1} | x)``.
Its filter gives ``log p(x | theta)`` (eq. 3.12) for free.

**M-step** (thesis eq. 2.9; Shumway & Stoffer 1982, Ghahramani & Hinton 1996): maximize the
expected complete-data log-likelihood. Every update is in closed form (sums run over sequences
and the indicated time steps; ``E[a b^T] = Cov(a, b | x) + E[a] E[b]^T``)::

    mu_{1|0}    = (1/N) sum_n m_1                                  (thesis Sec. 3.4.3)
    Sigma_{1|0} = (1/N) sum_n [P_1 + (m_1 - mu_{1|0})(m_1 - mu_{1|0})^T]
    [A B]       = (sum_t E[z_t r_t^T]) (sum_t E[r_t r_t^T])^{-1},  r_t = (z_{t-1}, u_t)   (t >= 2)
    Q           = 1/(N (T-1)) sum_t E[(z_t - A z_{t-1} - B u_t)(...)^T]
    C           = (sum_t x_t m_t^T) (sum_t E[z_t z_t^T])^{-1}       (observed steps only)
    R           = (1/#obs) sum_t [(x_t - C m_t)(x_t - C m_t)^T + C P_t C^T]

``Q`` and ``R`` are evaluated at the new ``A, B`` and ``C`` (the exact joint maximizer: for an
unconstrained ``A`` the least-squares solution does not depend on ``Q``). Any subset of the
parameters can be learned (``learn=``), the others staying fixed, e.g. only the initial state
as in the thesis' ball-tracking example (Fig. 3.5); with a fixed ``A`` only ``B`` is
regressed and vice versa. For a single sequence the initial-state update is
``mu_{1|0} = mu_{1|T}``, ``Sigma_{1|0} = Sigma_{1|T}``: the ``- mu mu^T`` term printed in the
thesis' M-step belongs to the second moment ``E[z_1 z_1^T] - mu_{1|T} mu_{1|T}^T = Sigma_{1|T}``.

Because the E-step is exact and the M-step maximizes, ``log p(x | theta)`` never decreases
across iterations (thesis Sec. 2.3.1); :func:`lgssm_em` records it at every iteration.

Missing data (thesis Sec. 3.4.2)
--------------------------------
``mask`` is bool (or 0/1) of shape ``(*batch, T)`` per step or ``(*batch, T, D)`` per element
(True = observed), read as :mod:`pyro_seq.ops.kalman` reads it. Write ``o_ti`` for the mask
of element ``i`` of ``x_t``, ``O_t``/``M_t`` for the observed/missing elements of step ``t``.
The E-step conditions on the observed elements only; the latent chain, and so the ``A, B,
Q`` and initial-state updates, cover all steps. A step with no observed element carries no
information about ``C, R`` and is left out of their updates (it is integrated out exactly).

The emission updates depend on the structure of ``R`` (``observation_cov_structure``):

* ``"diag"`` (``R = diag(r)``) and ``"scalar"`` (``R = s I``): the observed marginal
  ``p(x_{t,O_t} | z_t) = N(C_{O_t} z_t, R_{O_t O_t})`` factorizes over elements, so the
  expected complete-data log-likelihood with the missing elements integrated out,
  ``Q_obs(theta) = E_{p(z | x_obs, theta_old)}[log p(x_obs, z | theta)]``, has the emission part
  ``-1/2 sum_{t,i} o_ti [log r_i + E[(x_ti - c_i z_t)^2] / r_i]`` (``c_i`` row ``i`` of ``C``).
  It separates into one weighted least-squares problem per row ``i`` (``c_i, r_i`` appear
  only in the terms with ``o_ti = 1``), so its exact joint maximizer is row-wise::

      c_i = (sum_t o_ti x_ti m_t^T) (sum_t o_ti E[z_t z_t^T])^{-1}                  (E1)
      r_i = sum_t o_ti [(x_ti - c_i m_t)^2 + c_i P_t c_i^T] / sum_t o_ti          (E2)
      s   = sum_{t,i} o_ti [(x_ti - c_i m_t)^2 + c_i P_t c_i^T] / sum_{t,i} o_ti  (E2')

  (a solve, never an inverse). An element never observed has no data for ``c_i, r_i``:
  learning them raises ``ValueError``.

* ``"full"``: with correlated noise the observed marginal ``R_{O_t O_t}`` changes with the
  pattern ``O_t`` and the maximizer of ``Q_obs`` over a full ``R`` has no closed form (it is
  the incomplete-data covariance problem). Shumway & Stoffer (2017, *Time Series Analysis
  and Its Applications*, Sec. 6.4) instead treat the missing elements of the partially
  observed steps as latent variables too: EM with latents ``(z, x_mis)`` maximizes
  ``Q_aug(theta) = E_{p(z, x_mis | x_obs, theta_old)}[log p(x_obs, x_mis, z | theta)]`` and,
  since ``log p(x_obs | theta) - log p(x_obs | theta_old) >= Q_aug(theta) - Q_aug(theta_old)``,
  never decreases ``log p(x_obs)`` either. Derivation (old parameters ``C, R`` inside every
  expectation; ``delta_t = x_t - C z_t``; blocks after permuting ``O`` first):

  1. Given ``z_t`` and ``x_O`` we know ``delta_O = x_O - C_O z_t``, and Gaussian conditioning
     of ``delta_t ~ N(0, R)`` gives ``delta_M | delta_O ~ N(K delta_O, R_{MM.O})`` with
     ``K = R_MO R_OO^{-1}``, ``R_{MM.O} = R_MM - R_MO R_OO^{-1} R_OM``. So
     ``E[x_M | x_O, z_t] = C_M z_t + K (x_O - C_O z_t)``; in full-length form with
     ``Omega_t = Pi_t (R~_t)^{-1} Pi_t`` (``Pi_t = diag(o_t)``, ``R~_t`` = ``R`` with the
     missing rows and columns replaced by the identity, so ``Omega_t`` is ``R_OO^{-1}``
     padded with zeros)::

         E[x_t | x_O, z_t] = F_t x_t + H_t z_t,   F_t = R Omega_t,  H_t = (I - F_t) C      (S1)
         Cov(x_t | x_O, z_t) = V_t = R - R Omega_t R   (= R_{MM.O} on M x M, 0 elsewhere)  (S2)

     (``F_t`` has rows ``[I 0]`` on ``O`` and ``[K 0]`` on ``M``; ``x_t``'s missing entries are
     multiplied by zero columns.)
  2. Averaging over ``z_t ~ N(m_t, P_t)``::

         E[x_t z_t^T]   = F_t x_t m_t^T + H_t E[z_t z_t^T]                              (S3)
         E[(x_t - C' z_t)(x_t - C' z_t)^T] = e_t e_t^T + D_t P_t D_t^T + V_t,            (S4)
             D_t = H_t - C',  e_t = F_t x_t + D_t m_t

     for any new ``C'``.
  3. ``Q_aug`` is a complete-data Gaussian regression of ``x_t`` on ``z_t`` with the same
     regressors in every row, so its maximizer over ``C`` does not depend on ``R`` and the
     joint maximizer is (sums over steps with at least one observed element, ``n`` of them)::

         C' = (sum_t E[x_t z_t^T]) (sum_t E[z_t z_t^T])^{-1}                             (S5)
         R' = (1/n) sum_t [e_t e_t^T + D_t P_t D_t^T + V_t]                              (S6)

  With ``R_OM = 0`` (the case written out in Shumway & Stoffer's textbook) ``K = 0`` and
  ``V_t`` is the old ``R_MM``: missing entries filled with ``C z_t``, the old ``R`` on the
  missing block, no cross terms. Using that simplified form when the old ``R`` *is*
  correlated is not an EM step: it can decrease ``log p(x_obs)`` (by up to 1.13 nats per
  iteration in ``tests/infer/test_lgssm_em_elementwise.py``). For a fully observed step ``F_t = I``, ``H_t = 0``, ``V_t = 0`` and (S5)-(S6)
  are the per-step formulas above. The same construction is used by MARSS (Holmes 2012,
  "Derivation of an EM algorithm for constrained and unconstrained MARSS models", missing
  values). Note that (S5)-(S6) maximize ``Q_aug``, not ``Q_obs``: the gradient of ``Q_obs`` is
  generally nonzero there (both are valid EM auxiliaries; the row-wise (E1) with a full
  ``R`` maximizes neither, and is not used).

With a per-step mask (or none) all three structures use the per-step formulas; ``"diag"``
and ``"scalar"`` keep the diagonal, resp. ``tr(R)/D I``, of the full update, which is the
exact maximizer within the family.
"""

from typing import Any, Callable, Iterable, NamedTuple, Optional, Tuple, Union

import torch

from pyro_seq.ops.kalman import kalman_filter, kalman_smoother
from pyro_seq.ops.lgssm import LGSSMParams
from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.ops.linalg import sym as _sym
from pyro_seq.validation import as_bool_mask, check_device

__all__ = [
    "EMResult",
    "LGSSMParams",
    "LEARNABLE_PARAMS",
    "OBSERVATION_COV_STRUCTURES",
    "em_step",
    "lgssm_em",
    "lgssm_log_likelihood",
]

#: Values accepted by ``observation_cov_structure=`` (see the module docstring).
OBSERVATION_COV_STRUCTURES = ("full", "diag", "scalar")

#: Names accepted by ``learn=`` (``"all"`` selects every one that is not None).
LEARNABLE_PARAMS = (
    "initial_loc",
    "initial_cov",
    "transition_matrix",
    "transition_cov",
    "observation_matrix",
    "observation_cov",
    "control_matrix",
)


class EMResult(NamedTuple):
    """Output of :func:`lgssm_em`.

    ``params``: the final :class:`LGSSMParams`. ``log_likelihoods (num_iters + 1,)``: entry
    ``k`` is ``log p(x | theta_k)`` summed over all sequences, ``theta_0`` the initial
    parameters and the last entry the returned ones (non-decreasing up to rounding).
    """

    params: LGSSMParams
    log_likelihoods: torch.Tensor


def _args(params, controls, mask):
    return dict(params._asdict(), controls=controls, mask=mask)


def lgssm_log_likelihood(
    x: torch.Tensor,
    params: LGSSMParams,
    mask: Optional[torch.Tensor] = None,
    controls: Optional[torch.Tensor] = None,
    method: str = "auto",
    *,
    step_mask: Optional[torch.Tensor] = None,
    observation_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``log p(x | theta)`` (eq. 3.12) summed over all sequences.

    :param torch.Tensor x: ``(*batch, T, D)``.
    :param LGSSMParams params: the model.
    :param torch.Tensor mask: optional bool (or 0/1) ``(*batch, T)`` or ``(*batch, T, D)``.
    :param torch.Tensor controls: optional ``(*batch, T, U)`` (entry 0 unused).
    :returns: scalar tensor.
    :param torch.Tensor step_mask: optional bool (or 0/1) ``(*batch, T)``, one flag per step.
    :param torch.Tensor observation_mask: optional bool (or 0/1) ``(*batch, T, D)`` per element.
    :raises ValueError: for a mask that is not bool/0-1, has the wrong shape, or (``mask``) a
        shape that reads both per step and per element.
    """
    kind, mask = _normalize_mask(mask, x, step_mask, observation_mask)
    return kalman_filter(
        x, method=method, **_args(params, controls, _ops_mask(kind, mask, x))
    ).log_likelihoods.sum()


def _learn_set(learn, params):
    if learn == "all":
        names = [n for n in LEARNABLE_PARAMS if getattr(params, n) is not None]
    elif isinstance(learn, str):
        names = [learn]
    else:
        names = list(learn)
    for n in names:
        if n not in LEARNABLE_PARAMS:
            raise ValueError(f"cannot learn {n!r}; choose from {LEARNABLE_PARAMS}")
    if "control_matrix" in names and params.control_matrix is None:
        raise ValueError("learning control_matrix needs an initial control_matrix (and controls)")
    return set(names)


def _check_controls(names, controls):
    if "control_matrix" in names and controls is None:
        raise ValueError("learning control_matrix needs controls")


def _solve_right(M, G):
    """``M G^{-1}`` for a symmetric positive definite Gram matrix ``G``."""
    L = torch.linalg.cholesky(0.5 * (G + G.mT))
    return torch.cholesky_solve(M.mT, L).mT


def _outer(a, b):
    return a.unsqueeze(-1) * b.unsqueeze(-2)


def _normalize_mask(mask, x, step_mask=None, observation_mask=None):
    """Validate the masks against ``x (*batch, T, D)`` and return ``(kind, bool mask)``.

    ``kind`` is None (no mask), ``"step"`` for ``(*batch, T)`` or ``"element"`` for
    ``(*batch, T, D)``. ``step_mask`` ``(*batch, T)`` and ``observation_mask`` ``(*batch, T, D)``
    say which kind they are (as in :class:`~pyro_seq.distributions.LinearGaussianSSM`); both
    together are combined with "and" into a per-element mask. The older ``mask`` is read by
    shape (a ``(*batch, T, 1)`` mask with T > 1 is per step) and refused where the shape reads
    both ways: last two dims ``(T, T)`` with ``T == D`` (a per-step mask of a batch of T
    sequences, or a per-element mask).
    """
    if x.dim() < 2:
        raise ValueError(f"observations must have shape (*batch, T, D); got {tuple(x.shape)}")
    T, D = x.shape[-2:]
    if mask is not None and (step_mask is not None or observation_mask is not None):
        raise ValueError("pass either mask or step_mask/observation_mask, not both")
    if step_mask is not None or observation_mask is not None:
        kind, out = None, None
        # a tensor must already be on x's device (never copied silently); array-likes go there
        check_device("step_mask", step_mask, x.device, "the observations are")
        check_device("observation_mask", observation_mask, x.device, "the observations are")
        if step_mask is not None:
            step_mask = as_bool_mask(torch.as_tensor(step_mask, device=x.device), "step_mask")
            if step_mask.dim() < 1 or step_mask.shape[-1] != T:
                raise ValueError(
                    f"step_mask must have shape (*batch, T) with T={T}; got "
                    f"{tuple(step_mask.shape)}. Per-element masks go in observation_mask."
                )
            kind, out = "step", step_mask
        if observation_mask is not None:
            observation_mask = as_bool_mask(
                torch.as_tensor(observation_mask, device=x.device), "observation_mask"
            )
            if observation_mask.dim() < 2 or observation_mask.shape[-2:] != (T, D):
                raise ValueError(
                    f"observation_mask must have shape (*batch, T, D) = (*batch, {T}, {D}); "
                    f"got {tuple(observation_mask.shape)}. Per-step masks go in step_mask."
                )
            kind = "element"
            out = observation_mask if out is None else observation_mask & out.unsqueeze(-1)
        per_element = kind == "element"
        mask = out
    else:
        if mask is None:
            return None, None
        check_device("mask", mask, x.device, "the observations are")
        mask = as_bool_mask(torch.as_tensor(mask, device=x.device), "mask")
        if mask.dim() >= 2 and mask.shape[-2:] == (T, T) and T == D:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} is ambiguous: with T == D == {T} it reads both as "
                "a per-step mask (*batch, T) and as a per-element mask (*batch, T, D). Pass "
                "step_mask=mask or observation_mask=mask instead."
            )
        per_element = (
            mask.dim() >= 2
            and mask.shape[-2] == T
            and (mask.shape[-1] == D or (mask.shape[-1] == 1 and T != 1))
        )
        if per_element and mask.shape[-1] == 1 and D != 1:
            mask, per_element = mask[..., 0], False
        if not per_element and (mask.dim() < 1 or mask.shape[-1] != T):
            raise ValueError(
                f"mask must have shape (*batch, T) per step or (*batch, T, D) per element with "
                f"T={T}, D={D}; got {tuple(mask.shape)}"
            )
    batch = mask.shape[:-2] if per_element else mask.shape[:-1]
    try:
        broadcast_shapes(batch, x.shape[:-2])
    except ValueError:
        how = "(*batch, T, D) per element" if per_element else "(*batch, T) per step"
        raise ValueError(
            f"mask of shape {tuple(mask.shape)}, read as {how} with T={T}, D={D}: its batch shape "
            f"{tuple(batch)} does not broadcast with the observations' {tuple(x.shape[:-2])}"
        ) from None
    return ("element" if per_element else "step"), mask


def _ops_mask(kind, mask, x):
    """The mask for :mod:`pyro_seq.ops.kalman`, always per element and of the observations' full
    shape ``(*batch, T, D)``, so that the ops cannot read it per step (or the reverse)."""
    if kind is None:
        return None
    if kind == "step":
        mask = mask.unsqueeze(-1)
    return mask.expand(broadcast_shapes(mask.shape, x.shape))


def _check_structure(structure, R):
    """``ValueError`` unless ``structure`` is known and ``R`` belongs to its family (EM's
    monotonicity needs the old parameters inside the family the M-step maximizes over)."""
    if structure not in OBSERVATION_COV_STRUCTURES:
        raise ValueError(
            f"observation_cov_structure must be one of {OBSERVATION_COV_STRUCTURES}; got "
            f"{structure!r} (block, banded or low-rank R are not supported)"
        )
    if structure == "full":
        return
    off = R - torch.diag_embed(R.diagonal(dim1=-2, dim2=-1))
    if torch.count_nonzero(off):
        raise ValueError(
            f"observation_cov_structure={structure!r} needs a diagonal observation_cov; "
            f"its largest off-diagonal entry is {off.abs().max().item():.3g}"
        )
    d = R.diagonal(dim1=-2, dim2=-1)
    if structure == "scalar" and not torch.all(d == d[..., :1]):
        raise ValueError(
            "observation_cov_structure='scalar' needs observation_cov = s * I; got diagonal "
            f"{d.tolist()}"
        )


def _emission_rowwise(xs, o, m, P, C, learn_C, learn_R, structure):
    """Row-wise emission M-step, eqs. (E1)-(E2') of the module docstring.

    ``xs (N, T, D)`` zero where missing, ``o (N, T, D)`` 0/1 weights, ``m (N, T, S)``,
    ``P (N, T, S, S)``, ``C (D, S)`` the current ``C``. Returns ``(C, R or None)``.
    """
    D = xs.shape[-1]
    count = o.sum((0, 1))  # (D,) observations of each element
    never = (count == 0).nonzero().flatten().tolist()
    if count.sum() == 0:
        raise ValueError(
            "no element of x is observed: observation_matrix/observation_cov cannot be learned"
        )
    if never and (learn_C or structure == "diag"):
        raise ValueError(
            f"element(s) {never} of x are never observed, so their rows of observation_matrix "
            "and their observation_cov entries are not identified; observe them or keep C, R fixed"
        )
    if learn_C:
        G = torch.einsum("ntd,ntab->dab", o, P + _outer(m, m))  # (D, S, S) sum_t o_ti E[z z^T]
        M = torch.einsum("ntd,nta->da", o * xs, m)  # (D, S) sum_t o_ti x_ti m_t^T
        C = _solve_right(M.unsqueeze(-2), G).squeeze(-2)  # (E1), one S x S solve per row
    if not learn_R:
        return C, None
    resid = xs - m @ C.mT  # (N, T, D)
    cPc = torch.einsum("da,ntab,db->ntd", C, P, C)  # c_i P_t c_i^T
    sq = (o * (resid.square() + cPc)).sum((0, 1))  # (D,)
    eye = torch.eye(D, dtype=xs.dtype, device=xs.device)
    if structure == "diag":
        return C, torch.diag_embed(sq / count)  # (E2)
    return C, (sq.sum() / count.sum()) * eye  # (E2')


def _emission_augmented(xs, o, m, P, C_old, R_old, learn_C, learn_R):
    """Full-``R`` emission M-step with the missing elements as latents, eqs. (S1)-(S6).

    Shapes as :func:`_emission_rowwise`; ``R_old (D, D)``. Returns ``(C, R or None)``.
    """
    D = xs.shape[-1]
    ob = o > 0
    eye = torch.eye(D, dtype=xs.dtype, device=xs.device)
    pair = ob.unsqueeze(-1) & ob.unsqueeze(-2)
    R_tilde = torch.where(pair, R_old, eye)  # (N, T, D, D): R_OO, identity on the missing block
    L = torch.linalg.cholesky(R_tilde)
    Omega = o.unsqueeze(-1) * torch.cholesky_solve(torch.diag_embed(o), L)  # Pi R~^{-1} Pi
    F = R_old @ Omega  # (S1); rows [I 0] on O (set exactly below), [K 0] on M
    F = torch.where(ob.unsqueeze(-1), eye, F)
    V = _sym(R_old - F @ R_old) * ((1 - o).unsqueeze(-1) * (1 - o).unsqueeze(-2))  # (S2)
    H = (eye - F) @ C_old  # (N, T, D, S), zero rows on O
    Fx = (F @ xs.unsqueeze(-1)).squeeze(-1)  # (N, T, D)
    w = ob.any(-1).to(xs.dtype)  # steps with at least one observed element
    n = w.sum()
    if n == 0:
        raise ValueError(
            "no element of x is observed: observation_matrix/observation_cov cannot be learned"
        )
    wm = w[..., None, None]
    C = C_old
    if learn_C:
        Ezz = P + _outer(m, m)
        Exz = _outer(Fx, m) + H @ Ezz  # (S3)
        C = _solve_right((wm * Exz).sum((0, 1)), (wm * Ezz).sum((0, 1)))  # (S5)
    if not learn_R:
        return C, None
    Dt = H - C  # (N, T, D, S)
    e = Fx + (Dt @ m.unsqueeze(-1)).squeeze(-1)
    cov = _outer(e, e) + Dt @ P @ Dt.mT + V  # (S4)
    return C, _sym((wm * cov).sum((0, 1)) / n)  # (S6)


def em_step(
    x: torch.Tensor,
    params: LGSSMParams,
    learn: Union[str, Iterable[str]] = "all",
    mask: Optional[torch.Tensor] = None,
    controls: Optional[torch.Tensor] = None,
    method: str = "auto",
    observation_cov_structure: str = "full",
    *,
    step_mask: Optional[torch.Tensor] = None,
    observation_mask: Optional[torch.Tensor] = None,
) -> Tuple[LGSSMParams, torch.Tensor]:
    """One EM iteration: E-step with the RTS smoother, closed-form M-step (module docstring).

    :param torch.Tensor x: observations ``(*batch, T, D)``; all leading dims are independent
        sequences sharing ``params``.
    :param LGSSMParams params: current parameters.
    :param learn: ``"all"``, one name or an iterable of names from :data:`LEARNABLE_PARAMS`.
    :param torch.Tensor mask: optional bool (or 0/1) ``(*batch, T)`` per step or
        ``(*batch, T, D)`` per element, True = observed (module docstring, "Missing data").
    :param torch.Tensor controls: optional ``(*batch, T, U)``.
    :param str method: forwarded to :func:`pyro_seq.ops.kalman.kalman_smoother`.
    :param str observation_cov_structure: ``"full"`` (default), ``"diag"`` or ``"scalar"``:
        the family ``R`` is learned in (and must already belong to). With a per-element mask
        it selects eqs. (E1)-(E2') (diag, scalar) or (S1)-(S6) (full).
    :param torch.Tensor step_mask: optional ``(*batch, T)`` per step (unambiguous form of ``mask``).
    :param torch.Tensor observation_mask: optional ``(*batch, T, D)`` per element.
    :raises ValueError: for a bad mask (values other than 0/1, a shape that is neither
        ``(*batch, T)`` nor ``(*batch, T, D)``, or a ``mask`` whose shape reads both ways), an unknown structure or an ``R`` outside it,
        non-finite observed entries, or emission parameters with no observed data.
    :returns: ``(new_params, log_likelihood)`` where ``log_likelihood`` is ``log p(x | params)``
        of the *input* parameters (from the E-step's filter).
    """
    names = _learn_set(learn, params)
    _check_controls(names, controls)
    T, D = x.shape[-2:]
    S = params.initial_loc.shape[-1]
    mask_kind, mask = _normalize_mask(mask, x, step_mask, observation_mask)
    _check_structure(observation_cov_structure, params.observation_cov)
    observed = mask if mask_kind != "step" else mask.unsqueeze(-1)
    finite = torch.isfinite(x)
    if not (finite if observed is None else finite | ~observed).all():
        raise ValueError("observations contain NaN or inf at observed positions (mask them out)")
    with torch.no_grad():
        sm = kalman_smoother(
            x, method=method, **_args(params, controls, _ops_mask(mask_kind, mask, x))
        )
        log_lik = sm.filtered.log_likelihoods.sum()
        batch = sm.means.shape[:-2]
        m = sm.means.reshape(-1, T, S)
        P = sm.covs.reshape(-1, T, S, S)
        cross = sm.cross_covs.reshape(-1, T - 1, S, S)  # Cov(z_{t+1}, z_t | x)
        N = m.shape[0]
        new = params._asdict()

        # ---- initial state (thesis Sec. 3.4.3)
        m1, P1 = m[:, 0], P[:, 0]
        if "initial_loc" in names:
            new["initial_loc"] = m1.mean(0)
        if "initial_cov" in names:
            d = m1 - new["initial_loc"]
            new["initial_cov"] = _sym(P1.mean(0) + _outer(d, d).mean(0))

        # ---- transition: A, B, Q over the pairs (t-1, t), t = 2..T
        if T > 1 and names & {"transition_matrix", "transition_cov", "control_matrix"}:
            m_prev, m_cur = m[:, :-1], m[:, 1:]
            P_prev, P_cur = P[:, :-1], P[:, 1:]
            Ezz_prev = (P_prev + _outer(m_prev, m_prev)).sum((0, 1))
            Ezz_cross = (cross + _outer(m_cur, m_prev)).sum((0, 1))  # sum E[z_t z_{t-1}^T]
            u: Optional[torch.Tensor]  # controls u_2..u_T, None without controls
            b: Optional[torch.Tensor]  # B u_t (u_t itself while B is unknown)
            if controls is not None:
                u = controls.expand(batch + controls.shape[-2:]).reshape(N, T, -1)[:, 1:]
                b = u if params.control_matrix is None else u @ params.control_matrix.mT
            else:
                u = b = None
            A, B = new["transition_matrix"], new["control_matrix"]
            learn_A, learn_B = "transition_matrix" in names, "control_matrix" in names
            if learn_A and learn_B:
                Ezu_cur = _outer(m_cur, u).sum((0, 1))  # sum m_t u_t^T
                Ezu_prev = _outer(m_prev, u).sum((0, 1))
                Euu = _outer(u, u).sum((0, 1))
                G = torch.cat(
                    [torch.cat([Ezz_prev, Ezu_prev], -1), torch.cat([Ezu_prev.mT, Euu], -1)], -2
                )
                M = torch.cat([Ezz_cross, Ezu_cur], -1)
                AB = _solve_right(M, G)
                A, B = AB[:, :S], AB[:, S:]
            elif learn_A:
                M = Ezz_cross if b is None else Ezz_cross - _outer(b, m_prev).sum((0, 1))
                A = _solve_right(M, Ezz_prev)
            elif learn_B:
                resid = m_cur - m_prev @ A.mT
                B = _solve_right(_outer(resid, u).sum((0, 1)), _outer(u, u).sum((0, 1)))
            new["transition_matrix"], new["control_matrix"] = A, B
            if "transition_cov" in names:
                if controls is not None:
                    b = u if B is None else u @ B.mT
                e = m_cur - m_prev @ A.mT - (0 if b is None else b)  # E[z_t - A z_{t-1} - b_t]
                cov_e = P_cur - A @ cross.mT - cross @ A.mT + A @ P_prev @ A.mT
                new["transition_cov"] = _sym((cov_e + _outer(e, e)).sum((0, 1)) / (N * (T - 1)))

        # ---- emission: C, R over observed steps / elements
        if names & {"observation_matrix", "observation_cov"}:
            learn_C, learn_R = "observation_matrix" in names, "observation_cov" in names
            xs = x.expand(batch + (T, D)).reshape(N, T, D)
            if mask_kind == "element":
                o = mask.expand(batch + (T, D)).reshape(N, T, D)
                xs = torch.where(o, xs, torch.zeros((), dtype=x.dtype, device=x.device))
                o = o.to(x.dtype)
                if observation_cov_structure == "full":
                    C, R = _emission_augmented(
                        xs,
                        o,
                        m,
                        P,
                        params.observation_matrix,
                        params.observation_cov,
                        learn_C,
                        learn_R,
                    )
                else:
                    C, R = _emission_rowwise(
                        xs,
                        o,
                        m,
                        P,
                        params.observation_matrix,
                        learn_C,
                        learn_R,
                        observation_cov_structure,
                    )
                new["observation_matrix"] = C
                if learn_R:
                    new["observation_cov"] = R
            else:
                if mask is None:
                    w = torch.ones(N, T, dtype=x.dtype, device=x.device)
                else:
                    w = mask.expand(batch + (T,)).reshape(N, T).to(x.dtype)
                if w.sum() == 0:
                    raise ValueError(
                        "no step of x is observed: observation_matrix/observation_cov cannot be learned"
                    )
                xs = torch.where(
                    w.unsqueeze(-1) > 0, xs, torch.zeros((), dtype=x.dtype, device=x.device)
                )
                wv, wm = w.unsqueeze(-1), w.unsqueeze(-1).unsqueeze(-1)
                C = new["observation_matrix"]
                if learn_C:
                    Exz = (wm * _outer(xs, m)).sum((0, 1))
                    Ezz = (wm * (P + _outer(m, m))).sum((0, 1))
                    C = _solve_right(Exz, Ezz)
                    new["observation_matrix"] = C
                if learn_R:
                    r = (xs - m @ C.mT) * wv
                    total = (_outer(r, r) + wm * (C @ P @ C.mT)).sum((0, 1))
                    R = _sym(total / w.sum())
                    if observation_cov_structure == "diag":
                        R = torch.diag_embed(R.diagonal())
                    elif observation_cov_structure == "scalar":
                        R = (R.diagonal().sum() / D) * torch.eye(D, dtype=R.dtype, device=R.device)
                    new["observation_cov"] = R
    return LGSSMParams(**new), log_lik


def lgssm_em(
    x: torch.Tensor,
    params: LGSSMParams,
    num_iters: int = 20,
    learn: Union[str, Iterable[str]] = "all",
    mask: Optional[torch.Tensor] = None,
    controls: Optional[torch.Tensor] = None,
    tol: Optional[float] = None,
    method: str = "auto",
    callback: Optional[Callable[[int, LGSSMParams, torch.Tensor], Any]] = None,
    observation_cov_structure: str = "full",
    *,
    step_mask: Optional[torch.Tensor] = None,
    observation_mask: Optional[torch.Tensor] = None,
) -> EMResult:
    """Run EM (thesis Sec. 3.4.3) for ``num_iters`` iterations or until the log-likelihood
    improves by less than ``tol``.

    :param torch.Tensor x: observations ``(*batch, T, D)``, sequences sharing the parameters.
    :param LGSSMParams params: initial parameters (unbatched; float64 recommended).
    :param int num_iters: maximum number of iterations.
    :param learn: ``"all"``, a name or names from :data:`LEARNABLE_PARAMS`; the others stay fixed
        (``learn=("initial_loc", "initial_cov")`` is the thesis' Fig. 3.5 experiment).
    :param torch.Tensor mask: optional bool (or 0/1) ``(*batch, T)`` or ``(*batch, T, D)``
        (see :func:`em_step`); ``step_mask``/``observation_mask`` (keywords) are its
        unambiguous forms.
    :param torch.Tensor controls: optional ``(*batch, T, U)``.
    :param float tol: optional stopping tolerance on the log-likelihood increase (nats).
    :param str method: forwarded to the Kalman smoother.
    :param callable callback: optional ``callback(iteration, params, log_likelihood)`` called
        after each E-step.
    :param str observation_cov_structure: ``"full"``, ``"diag"`` or ``"scalar"`` (see
        :func:`em_step`).
    :returns: :class:`EMResult` with ``log_likelihoods`` of length ``iterations + 1``.
    """
    kind, mask = _normalize_mask(mask, x, step_mask, observation_mask)
    masks = {} if kind is None else {("step_mask" if kind == "step" else "observation_mask"): mask}
    lls = []
    for it in range(num_iters):
        new_params, ll = em_step(
            x,
            params,
            learn=learn,
            controls=controls,
            method=method,
            observation_cov_structure=observation_cov_structure,
            **masks,
        )
        lls.append(ll)
        if callback is not None:
            callback(it, params, ll)
        if tol is not None and it > 0 and float(lls[-1] - lls[-2]) < tol:
            break
        params = new_params
    else:
        with torch.no_grad():
            lls.append(lgssm_log_likelihood(x, params, controls=controls, method=method, **masks))
    return EMResult(params, torch.stack(lls))
