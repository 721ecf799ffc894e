r"""Scores of probabilistic predictions. Depends on :mod:`torch` only.

The Capped Binomial Deviance (CBD) is the score of the Kaggle "What Do You Know?" (Grockit)
challenge, defined in footnote 2 of Soyer and Möllenhoff, "What Do You Know?": for predictions
``p_n = M(x_n)`` of the probability that answer ``n`` is correct and targets ``z_n`` in {0, 1},

.. math::

    \hat p_n = \min(\max(p_n, c), 1 - c),                                              (1)

    \mathrm{CBD} = \frac{1}{N} \sum_{n=1}^{N}
        -\bigl(z_n \log_{10} \hat p_n + (1 - z_n) \log_{10} (1 - \hat p_n)\bigr),      (2)

with the cap ``c = 0.01`` (predictions clipped to ``[0.01, 0.99]``). A model that always outputs
0.5 scores ``-log10(0.5) = log10(2) = 0.30103`` (the footnote writes ``log10 0.5``, dropping
the sign); the cap bounds the loss of one answer by ``-log10(0.01) = 2``.
"""

from __future__ import annotations

import torch

__all__ = ["capped_binomial_deviance"]


def capped_binomial_deviance(p, y, cap: float = 0.01, reduction: str = "mean") -> torch.Tensor:
    r"""Capped Binomial Deviance, eqs. (1)-(2) of the module docstring (base-10 logarithm).

    Args:
        p: ``(N,)`` predicted probabilities of a correct answer, in ``[0, 1]`` (no NaN), any
            floating dtype; ``N >= 1``.
        y: ``(N,)`` targets, 1 = correct and 0 = wrong: bool, or any real dtype holding only 0
            and 1.
        cap: ``c`` in ``[0, 1/2)``; predictions are clipped to ``[c, 1 - c]`` (``c = 0``: the
            plain binomial deviance, infinite for a confident wrong prediction).
        reduction: ``"mean"`` (eq. 2) or ``"none"`` (the ``(N,)`` per-answer terms, whose mean
            is eq. 2; e.g. for a standard error).

    Returns:
        float64 tensor: a scalar (``"mean"``) or ``(N,)`` (``"none"``); differentiable in ``p``
        where ``c < p < 1 - c``.

    Raises:
        ValueError: ``p`` or ``y`` not 1-D, their lengths differ, ``N = 0``, ``y`` not in
            {0, 1}, ``p`` outside ``[0, 1]`` or NaN, ``cap`` outside ``[0, 1/2)``, an unknown
            ``reduction``.
    """
    p, y = torch.as_tensor(p), torch.as_tensor(y)
    if not 0 <= cap < 0.5:
        raise ValueError(f"cap must be in [0, 0.5), got {cap!r}")
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    if p.dim() != 1 or y.dim() != 1:
        raise ValueError(
            f"p and y must be 1-D tensors (one entry per answer), got shapes "
            f"{tuple(p.shape)} and {tuple(y.shape)}"
        )
    if p.shape[0] != y.shape[0]:
        raise ValueError(
            f"p and y have different lengths: {p.shape[0]} predictions, {y.shape[0]} targets"
        )
    if p.shape[0] == 0:
        raise ValueError("p and y are empty: the deviance of no answers is undefined")
    if not p.dtype.is_floating_point:
        raise ValueError(f"p must be a floating tensor of probabilities, got dtype {p.dtype}")
    bad = torch.isnan(p) | (p < 0) | (p > 1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"p must hold probabilities in [0, 1] (no NaN), found {p[i].item()!r} at "
            f"index {i}; {int(bad.sum())} such entries"
        )
    if y.is_complex():
        raise ValueError(f"y must hold only 0 and 1, got dtype {y.dtype}")
    bad = (y != 0) & (y != 1)  # NaN is unequal to both
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"y must hold only 0 and 1 (1 = correct), found {y[i].item()!r} at "
            f"index {i}; {int(bad.sum())} such entries"
        )
    p_hat = p.to(torch.float64).clamp(cap, 1 - cap)  # (1)
    # eq. (2) written as -log10 of the probability given to what happened, so that with cap = 0
    # a certain correct prediction contributes 0 (not 0 * log10(0) = NaN)
    p_observed = torch.where(y != 0, p_hat, 1 - p_hat)
    terms = -torch.log10(p_observed)  # (2)
    return terms.mean() if reduction == "mean" else terms
