"""pyro_seq.baselines: simple non-latent predictors to compare the latent-variable models with.

* Collaborative filtering of student answers (issue 11): :class:`LogisticBaseline`, the additive
  student + question logistic model ``P(correct | s, q) = sigmoid(mu + alpha_s + beta_q)`` fitted
  by penalised maximum likelihood, and :class:`ConstantBaseline` (always 0.5, Capped Binomial
  Deviance ``log10 2``). Score them with :func:`pyro_seq.metrics.capped_binomial_deviance` on
  :func:`pyro_seq.data.simulate_students` data.

Depends on :mod:`torch` only.
"""

from .logistic import ConstantBaseline, LogisticBaseline

__all__ = ["ConstantBaseline", "LogisticBaseline"]
