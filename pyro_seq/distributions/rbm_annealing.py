r"""Annealed importance sampling for the RBM (:class:`~pyro_seq.distributions.rbm.RBM`): the
partition function from above and below, and the log-likelihood from below.

All three estimators share one path of RBMs (Salakhutdinov & Murray 2008): the joint energy
:math:`-E_\beta(v, h) = (1 - \beta)\, c_0^\top v + \beta (c^\top v + b^\top h + h^\top W v)`
runs from an independent base model (:math:`\beta = 0`, visible bias :math:`c_0`) to the RBM
(:math:`\beta = 1`), with one block-Gibbs transition per temperature.

* :meth:`RBMAnnealing.ais_log_partition`: forward AIS; :math:`\hat Z` unbiased, so
  :math:`\log \hat Z` is low and the log-likelihood from it high, in expectation.
* :meth:`RBMAnnealing.reverse_ais_log_partition`: reverse AIS from draws of the RBM (Grosse,
  Ghahramani & Adams 2015): :math:`\log \hat Z` high, the log-likelihood low, in expectation,
  when the draws are exact.
* :meth:`RBMAnnealing.raise_log_prob`: reverse AIS from the data (RAISE; Burda, Grosse &
  Salakhutdinov 2015): a lower bound on the log-likelihood of the annealing model, which tends
  to the RBM's as the schedule refines.
"""

import math
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from pyro_seq.ops.linalg import broadcast_shapes

__all__ = ["AISResult", "RBMAnnealing"]


class AISResult(NamedTuple):
    """Result of :meth:`RBMAnnealing.ais_log_partition`.

    ``log_partition`` (batch shape): :math:`\\log \\hat Z`, the log of the mean importance
    weight (an unbiased estimate of :math:`Z` itself; its log is biased low by Jensen);
    ``stderr``: the delta-method standard error of ``log_partition``,
    :math:`\\mathrm{sd}(w) / (\\sqrt{n}\\, \\bar w)`; ``log_weights``: ``(num_chains, *batch)``.
    """

    log_partition: torch.Tensor
    stderr: torch.Tensor
    log_weights: torch.Tensor


class RBMAnnealing:
    """The annealed estimators of :class:`~pyro_seq.distributions.rbm.RBM` (a part of the
    class, which sets the attributes and provides the unit methods below)."""

    if TYPE_CHECKING:  # provided by RBM
        visible_bias: torch.Tensor
        hidden_bias: torch.Tensor
        num_hidden: int
        event_shape: torch.Size
        batch_shape: torch.Size

        def hidden_input(self, v: torch.Tensor) -> torch.Tensor: ...
        def visible_input(self, h: torch.Tensor) -> torch.Tensor: ...
        def free_energy(self, value: torch.Tensor) -> torch.Tensor: ...
        def _sum_units(self, per_unit: Any) -> Any: ...
        def _unit_log_potential(self, v: Any, a: Any) -> Any: ...
        def _unit_log_normaliser(self, a: Any) -> Any: ...
        def _sample_units(self, a: Any) -> Any: ...
        def _masked_value(self, v: Any) -> Any: ...

    def _annealing_path(self, num_betas, betas, base_visible_bias, num_chains):
        """The schedule ``betas`` and the base model's visible bias ``c0`` of AIS and RAISE,
        checked: an increasing schedule from 0 to 1, ``num_chains >= 2``, ``c0`` shaped like the
        visible bias."""
        dtype, device = self.visible_bias.dtype, self.visible_bias.device
        if betas is None:
            if not isinstance(num_betas, int) or num_betas < 2:
                raise ValueError(f"num_betas must be an int >= 2, got {num_betas!r}")
            betas = torch.linspace(0.0, 1.0, num_betas, dtype=dtype, device=device)
        else:
            betas = torch.as_tensor(betas, dtype=dtype, device=device)
            if (
                betas.dim() != 1
                or betas.numel() < 2
                or float(betas[0]) != 0.0
                or float(betas[-1]) != 1.0
                or bool((betas[1:] < betas[:-1]).any())
            ):
                raise ValueError("betas must be a 1-D non-decreasing schedule from 0 to 1")
        if not isinstance(num_chains, int) or num_chains < 2:
            raise ValueError(
                f"num_chains must be an int >= 2 (for a standard error), got {num_chains!r}"
            )
        c0 = (
            torch.zeros_like(self.visible_bias)
            if base_visible_bias is None
            else torch.as_tensor(base_visible_bias, dtype=dtype, device=device)
        )
        if c0.shape[-len(self.event_shape) :] != self.event_shape:
            raise ValueError(f"base_visible_bias must end in {tuple(self.event_shape)}")
        return betas, c0

    def _log_f_difference(self, v, beta, beta_prev, c0):
        r""":math:`\log f_\beta(v) - \log f_{\beta'}(v)` and the hidden input :math:`b + W v`."""
        x = self.hidden_input(v)
        # the weights (1 - beta) + beta = 1 keep the base measure log m(v) out of the difference
        visible = self._sum_units(
            self._unit_log_potential(v, self.visible_bias) - self._unit_log_potential(v, c0)
        )
        hidden = (F.softplus(beta * x) - F.softplus(beta_prev * x)).sum(-1)
        return (beta - beta_prev) * visible + hidden, x

    def _annealed_gibbs(self, x, beta, c0):
        r"""One block-Gibbs transition :math:`v \to h \to v'` that leaves :math:`p_\beta`
        invariant (and is reversible for it), from the hidden input ``x`` of :math:`v`."""
        h = torch.bernoulli(torch.sigmoid(beta * x))
        return self._sample_units((1 - beta) * c0 + beta * self.visible_input(h))

    def _log_base_partition(self, c0):
        r""":math:`\log Z_0 = H \log 2 + \sum_i \log \sum_{v_i} m(v_i) e^{v_i \cdot c_{0,i}}`."""
        return self.num_hidden * math.log(2.0) + self._sum_units(
            self._unit_log_normaliser(c0.expand(self.batch_shape + self.event_shape))
        )

    @staticmethod
    def _annealing_result(log_base, log_w, num_chains):
        log_mean_w = torch.logsumexp(log_w, 0) - math.log(num_chains)
        w = torch.exp(log_w - log_w.max(0).values)
        stderr = w.std(0) / (math.sqrt(num_chains) * w.mean(0))
        return AISResult(log_base + log_mean_w, stderr, log_w)

    @torch.no_grad()
    def ais_log_partition(
        self,
        num_chains: int = 100,
        num_betas: int = 1000,
        betas: Optional[Union[torch.Tensor, Sequence[float]]] = None,
        base_visible_bias: Optional[torch.Tensor] = None,
    ) -> AISResult:
        r"""Annealed importance sampling estimate of :math:`\log Z` (Salakhutdinov & Murray 2008).

        The intermediate distributions are the RBMs with joint energy
        :math:`-E_\beta(v, h) = (1 - \beta)\, c_0^\top v + \beta (c^\top v + b^\top h + h^\top W
        v)`: at :math:`\beta = 0` the independent "base-rate" model with visible bias :math:`c_0`
        (``base_visible_bias``, zeros by default) and :math:`Z_0 = 2^H \prod_i \sum_{v_i} m(v_i)
        e^{v_i \cdot c_{0,i}}`; at :math:`\beta = 1` this RBM. Each chain starts with an exact
        draw from the base model and takes one block-Gibbs transition at each intermediate
        :math:`\beta_k`; its log-weight is :math:`\sum_k \log f_{\beta_k}(v_k) - \log
        f_{\beta_{k-1}}(v_k)` with :math:`\log f_\beta(v) = (1-\beta) c_0^\top v + \beta c^\top v +
        \log m(v) + \sum_j \operatorname{softplus}(\beta (b_j + W_j v))`.

        :param int num_chains: independent annealing runs.
        :param int num_betas: size of the uniform grid :math:`0 = \beta_0 < \dots < \beta_K = 1`
            (ignored when ``betas`` is given).
        :param torch.Tensor betas: an increasing schedule from 0 to 1 (e.g. the 14 500 values of
            Salakhutdinov & Murray: 0-0.5 by 1e-3, 0.5-0.9 by 1e-4, 0.9-1 by 1e-4).
        :param torch.Tensor base_visible_bias: :math:`c_0`, shaped like ``visible_bias`` (the
            data's base rates make a better start; :meth:`base_rate_bias`).
        :returns: :class:`AISResult`; :math:`\hat Z = Z_0 \cdot \mathrm{mean}(w)` is unbiased, so
            :math:`-F(v) - \log \hat Z` is a stochastic *upper* bound on :math:`\log p(v)`
            (:meth:`raise_log_prob` gives the lower one).
        """
        path, c0 = self._annealing_path(num_betas, betas, base_visible_bias, num_chains)
        shape = torch.Size([num_chains]) + self.batch_shape
        v = self._sample_units(c0.expand(shape + self.event_shape))
        log_w = v.new_zeros(shape)
        for k in range(1, path.numel()):
            step, x = self._log_f_difference(v, path[k], path[k - 1], c0)
            log_w = log_w + step
            if k < path.numel() - 1:
                v = self._annealed_gibbs(x, path[k], c0)
        return self._annealing_result(self._log_base_partition(c0), log_w, num_chains)

    @torch.no_grad()
    def raise_log_prob(
        self,
        value: torch.Tensor,
        num_chains: int = 100,
        num_betas: int = 1000,
        betas: Optional[Union[torch.Tensor, Sequence[float]]] = None,
        base_visible_bias: Optional[torch.Tensor] = None,
    ) -> AISResult:
        r"""Reverse annealed importance sampling (RAISE; Burda, Grosse & Salakhutdinov 2015,
        sec. 3): a stochastic lower bound on the log-likelihood of the annealing model, which
        tends to :math:`\log p(v)` as the schedule refines.

        The annealing model draws :math:`v_0` from the base model and applies the block-Gibbs
        transitions :math:`T_1, \dots, T_K` of the AIS path (:meth:`ais_log_partition`; each
        :math:`T_k` reversible for :math:`p_{\beta_k}`). Its marginal :math:`p_{\mathrm{ann}}(v)`
        tends to :math:`p(v)` as the schedule refines. Started at the data, :math:`v_K = v`, the
        reversed chain :math:`v_{k-1} \sim T_k(\cdot \mid v_k)` gives the unbiased weight

        .. math:: w = \frac{f_K(v)}{Z_0} \prod_{k=0}^{K-1} \frac{f_k(v_k)}{f_{k+1}(v_k)},
            \qquad \mathbb{E}[w] = p_{\mathrm{ann}}(v),

        so :math:`\log \mathrm{mean}(w) \le \log p_{\mathrm{ann}}(v)` in expectation (Jensen).
        :math:`p_{\mathrm{ann}}` is a proper distribution, so this estimate cannot be inflated
        by an underestimated partition function, the failure of AIS
        (:meth:`ais_log_partition` errs the other way); on a coarse schedule it measures the
        annealing model, not this RBM. Agreement of the two on the same path is the check.

        :param torch.Tensor value: ``batch_shape + event_shape`` (or broadcastable to it).
        :param num_chains, num_betas, betas, base_visible_bias: as :meth:`ais_log_partition`.
        :returns: :class:`AISResult` whose ``log_partition`` holds the estimate of
            :math:`\log p(v)` (shape of the broadcast batch), ``stderr`` its delta-method
            standard error and ``log_weights`` the :math:`\log w`, ``(num_chains, *batch)``.
        """
        path, c0 = self._annealing_path(num_betas, betas, base_visible_bias, num_chains)
        value = self._masked_value(torch.as_tensor(value, dtype=self.visible_bias.dtype))
        batch = broadcast_shapes(
            value.shape[: value.dim() - len(self.event_shape)], self.batch_shape
        )
        v = value.expand(torch.Size([num_chains]) + batch + self.event_shape)
        log_w = -self.free_energy(v)
        x = self.hidden_input(v)
        for k in range(path.numel() - 1, 0, -1):  # v_{k-1} ~ T_k(. | v_k), weight f_{k-1}/f_k
            v = self._annealed_gibbs(x, path[k], c0)
            step, x = self._log_f_difference(v, path[k], path[k - 1], c0)
            log_w = log_w - step
        log_w = log_w - self._log_base_partition(c0)  # the weight w of the formula above
        return self._annealing_result(0.0, log_w, num_chains)

    @torch.no_grad()
    def reverse_ais_log_partition(
        self,
        samples: torch.Tensor,
        num_betas: int = 1000,
        betas: Optional[Union[torch.Tensor, Sequence[float]]] = None,
        base_visible_bias: Optional[torch.Tensor] = None,
    ) -> AISResult:
        r"""Reverse AIS estimate of :math:`\log Z`, from draws of this RBM (the other half of
        bidirectional Monte Carlo, Grosse, Ghahramani & Adams 2015, sec. 4).

        The chains run the AIS path of :meth:`ais_log_partition` backwards: each starts at a
        draw :math:`v_K \sim p` (``samples``), takes the factor :math:`f_{K-1}(v_K) /
        f_K(v_K)`, moves by the transition of :math:`p_{\beta_{K-1}}`, and so on down to
        :math:`f_0 / f_1`. With exact draws the weight's mean is :math:`Z_0 / Z`, so
        :math:`\log \hat Z = \log Z_0 - \log \mathrm{mean}(w)` is a stochastic *upper* bound
        on :math:`\log Z` (Jensen), and :math:`-F(v) - \log \hat Z` a stochastic lower bound
        on :math:`\log p(v)`: with the forward estimate it sandwiches the log-likelihood.
        Draws from a Gibbs chain (:meth:`~pyro_seq.distributions.RBM.gibbs`) are exact only in
        the limit; the sandwich is as good as their mixing.

        :param torch.Tensor samples: ``(num_chains, *batch_shape, *event_shape)`` draws of this
            RBM, ``num_chains >= 2``.
        :param num_betas, betas, base_visible_bias: as :meth:`ais_log_partition`.
        :returns: :class:`AISResult`: ``log_partition`` the estimate of :math:`\log Z`,
            ``stderr`` its delta-method standard error, ``log_weights`` the reverse
            :math:`\log w`.
        """
        samples = self._masked_value(torch.as_tensor(samples, dtype=self.visible_bias.dtype))
        shape = samples.shape[: samples.dim() - len(self.event_shape)]
        if samples.dim() < 1 + len(self.event_shape) or shape[1:] != self.batch_shape:
            raise ValueError(
                f"samples must have shape (num_chains, *{tuple(self.batch_shape)}, "
                f"*{tuple(self.event_shape)}), got {tuple(samples.shape)}"
            )
        num_chains = int(shape[0])
        path, c0 = self._annealing_path(num_betas, betas, base_visible_bias, num_chains)
        v, log_w = samples, samples.new_zeros(shape)
        for k in range(path.numel() - 1, 0, -1):  # factor f_{k-1}(v) / f_k(v), then T_{k-1}
            step, x = self._log_f_difference(v, path[k], path[k - 1], c0)
            log_w = log_w - step
            if k > 1:
                v = self._annealed_gibbs(x, path[k - 1], c0)
        est = self._annealing_result(0.0, log_w, num_chains)
        return AISResult(self._log_base_partition(c0) - est.log_partition, est.stderr, log_w)
