"""pyro_seq.baselines: simple non-latent predictors to compare the latent-variable models with.

* Collaborative filtering of student answers (issue 11): :class:`LogisticBaseline`, the additive
  student + question logistic model ``P(correct | s, q) = sigmoid(mu + alpha_s + beta_q)`` fitted
  by penalised maximum likelihood, and :class:`ConstantBaseline` (always 0.5, Capped Binomial
  Deviance ``log10 2``). Score them with :func:`pyro_seq.metrics.capped_binomial_deviance` on
  :func:`pyro_seq.data.simulate_students` data.

* Video imputation (issue 10): :class:`AERNN`, a deterministic auto-encoder with an LSTM on its
  codes, the baseline of the KVAE's imputation experiments (thesis Fig. 6.3).

Depends on :mod:`torch` and the pure-torch blocks of :mod:`pyro_seq.nn` only.
"""

from .ae_rnn import AERNN
from .logistic import ConstantBaseline, LogisticBaseline

__all__ = ["AERNN", "ConstantBaseline", "LogisticBaseline"]
