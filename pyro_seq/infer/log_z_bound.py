"""Shared base of the multi-sample objectives: a bound given by an estimate of log p(x)."""

from typing import Any, Callable, Tuple

import torch
from pyro.infer.elbo import ELBO
from pyro.infer.util import torch_item
from pyro.util import warn_if_nan


class LogZBound(ELBO):
    """An :class:`~pyro.infer.ELBO` whose value is ``-scale * sum_b log Z-hat_b``.

    Subclasses implement ``log_z(model, guide, *args, **kwargs) -> (log_z, scale)`` with
    ``log_z`` of shape ``(batch,)`` (one estimate of ``log p(x^(b))`` per data point) and
    ``scale`` the plate scale ``N / B``; :meth:`loss` follows from it.
    """

    def log_z(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Tuple[torch.Tensor, float]:
        raise NotImplementedError

    def loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        """
        :returns: the negative bound, :math:`-\\frac{N}{B}\\sum_b \\log \\hat p(x^{(b)})`, for
            one draw of the estimator
        :rtype: float
        """
        with torch.no_grad():
            log_z, scale = self.log_z(model, guide, *args, **kwargs)
            loss = -torch_item(scale * log_z.sum())
        warn_if_nan(loss, "loss")
        return loss
