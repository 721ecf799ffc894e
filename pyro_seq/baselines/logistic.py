r"""Baselines for predicting whether a student answers a question correctly.

:class:`LogisticBaseline` is the additive (Rasch-like) logistic model with a student effect and a
question effect,

.. math::

    P(\text{correct} \mid s, q) = \sigma(\mu + \alpha_s + \beta_q),                      (1)

(``alpha_s``: how able student ``s`` is; ``beta_q``: how easy question ``q`` is), fitted by
penalised maximum likelihood on ``N`` training answers ``(s_i, q_i, z_i)``, ``z_i`` in {0, 1}:

.. math::

    J(\mu, \alpha, \beta) = \frac{1}{N} \Bigl[ \sum_{i=1}^{N}
        -\bigl(z_i \log \sigma(\eta_i) + (1 - z_i) \log(1 - \sigma(\eta_i))\bigr)
        + \lambda \bigl(\lVert \alpha \rVert^2 + \lVert \beta \rVert^2\bigr) \Bigr],
    \quad \eta_i = \mu + \alpha_{s_i} + \beta_{q_i}.                                     (2)

``J`` is strictly convex in ``(alpha, beta)`` and convex in ``mu``, so full-batch L-BFGS finds
its unique minimum. ``N J`` is the negative log posterior under independent ``N(0, 1/(2 lambda))``
priors on the effects (flat on ``mu``), so the default ``lambda = l2 = 0.5`` is a unit-variance
prior, the scale of the abilities and difficulties of :func:`pyro_seq.data.simulate_students`;
it keeps the effects of students and questions with few answers near 0 instead of at
``+-inf`` (a student who answered everything right). At the minimum (stationarity of eq. 2)::

    sum_i (sigma(eta_i) - z_i) = 0,                                 (mean fit = mean rate)  (3)
    sum_{i: s_i = s} (sigma(eta_i) - z_i) + 2 lambda alpha_s = 0    for every student s     (4)
    sum_{i: q_i = q} (sigma(eta_i) - z_i) + 2 lambda beta_q = 0     for every question q   (5)

:class:`ConstantBaseline` predicts a constant (0.5 by default, Capped Binomial Deviance
``log10 2 = 0.30103``).

For multiple-choice data (option 0 correct), pass ``correct = (answer == 0)``, e.g.
:attr:`pyro_seq.data.Answers.correct`.
"""

from __future__ import annotations

import math
import numbers
from typing import List, Optional, Tuple

import torch
from torch import nn

from pyro_seq.data.students import check_index_pair

__all__ = ["ConstantBaseline", "LogisticBaseline"]


def _check_size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_indices(
    student, question, num_students: int, num_questions: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    student, question = torch.as_tensor(student), torch.as_tensor(question)
    if student.dim() != 1 or question.dim() != 1 or student.shape != question.shape:
        raise ValueError(
            f"student and question must be 1-D tensors of the same length, got shapes "
            f"{tuple(student.shape)} and {tuple(question.shape)}"
        )
    return check_index_pair(student, question, num_students, num_questions)


class LogisticBaseline(nn.Module):
    """Student + question effects logistic model, eq. (1) of the module docstring.

    Args:
        num_students: ``S``, student indices are ``0..S-1``.
        num_questions: ``Q``, question indices are ``0..Q-1``.
        dtype: of the parameters (default: torch's default dtype).

    Attributes:
        mu: ``()`` intercept; ``alpha``: ``(S,)`` student effects; ``beta``: ``(Q,)`` question
        effects (all :class:`~torch.nn.Parameter`, initialised at 0).
    """

    def __init__(self, num_students: int, num_questions: int, dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.num_students = _check_size("num_students", num_students)
        self.num_questions = _check_size("num_questions", num_questions)
        dtype = dtype or torch.get_default_dtype()
        self.mu = nn.Parameter(torch.zeros((), dtype=dtype))
        self.alpha = nn.Parameter(torch.zeros(self.num_students, dtype=dtype))
        self.beta = nn.Parameter(torch.zeros(self.num_questions, dtype=dtype))

    def logits(self, student, question) -> torch.Tensor:
        """``(N,)`` logits ``eta = mu + alpha[student] + beta[question]`` (differentiable).

        Args:
            student, question: ``(N,)`` integer index tensors.
        """
        student, question = _check_indices(student, question, self.num_students, self.num_questions)
        return self.mu + self.alpha[student] + self.beta[question]

    def forward(self, student, question) -> torch.Tensor:
        """``(N,)`` probabilities ``sigmoid(eta)`` of eq. (1) (differentiable)."""
        return torch.sigmoid(self.logits(student, question))

    @torch.no_grad()
    def predict(self, student, question) -> torch.Tensor:
        """``(N,)`` predicted ``P(correct | student, question)``, eq. (1), without gradients.

        Args:
            student: ``(N,)`` integer student indices in ``0..S-1``.
            question: ``(N,)`` integer question indices in ``0..Q-1``.
        """
        return self.forward(student, question)

    def objective(self, student, question, correct, l2: float = 0.5) -> torch.Tensor:
        """The penalised mean negative log-likelihood ``J`` of eq. (2), a differentiable scalar.

        Args:
            student, question: ``(N,)`` integer index tensors.
            correct: ``(N,)`` targets, bool or 0/1 of any real dtype (1 = correct).
            l2: ``lambda >= 0``.
        """
        eta = self.logits(student, question)
        z = torch.as_tensor(correct).to(eta.dtype)
        nll = nn.functional.binary_cross_entropy_with_logits(eta, z, reduction="sum")
        penalty = l2 * (self.alpha.square().sum() + self.beta.square().sum())
        return (nll + penalty) / eta.shape[0]

    def fit(
        self, student, question, correct, l2: float = 0.5, max_iter: int = 500, tol: float = 1e-12
    ) -> List[float]:
        """Minimise eq. (2) over ``(mu, alpha, beta)`` by full-batch L-BFGS (strong Wolfe line
        search), starting from ``alpha = beta = 0``, ``mu = logit(mean(correct))``.

        Args:
            student: ``(N,)`` integer student indices in ``0..S-1``, ``N >= 1``.
            question: ``(N,)`` integer question indices in ``0..Q-1``.
            correct: ``(N,)`` 1 = correct, 0 = wrong (bool or any real dtype holding 0 and 1).
            l2: ``lambda >= 0`` of eq. (2); 0.5 is a unit-variance Gaussian prior on the effects
                (``l2 = 0`` may diverge when a student or question has only correct answers).
            max_iter: at most this many L-BFGS iterations.
            tol: stop when an iteration lowers ``J`` by at most ``tol * max(1, |J|)``
                (``tol = 0``: run until an iteration makes no progress at all, i.e. to the
                round-off floor of the parameters' dtype, or ``max_iter``).

        Returns:
            The training curve: ``J`` before the first iteration and after each one (floats,
            non-increasing up to round-off).

        Raises:
            ValueError: bad shapes, indices out of range, ``correct`` not 0/1, ``l2 < 0``,
                ``max_iter < 1``.
        """
        student, question = _check_indices(student, question, self.num_students, self.num_questions)
        correct = torch.as_tensor(correct)
        if correct.shape != student.shape:
            raise ValueError(
                f"correct must have the shape of student, {tuple(student.shape)}, "
                f"got {tuple(correct.shape)}"
            )
        if student.shape[0] == 0:
            raise ValueError("fit needs at least one answer, got N = 0")
        if correct.is_complex() or bool(((correct != 0) & (correct != 1)).any()):
            raise ValueError(
                "correct must hold only 0 and 1 (1 = correct); for multiple-choice "
                "answers pass (answer == 0)"
            )
        if isinstance(l2, bool) or not isinstance(l2, numbers.Real) or not l2 >= 0:
            raise ValueError(f"l2 must be a number >= 0, got {l2!r}")
        if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol >= 0:
            raise ValueError(f"tol must be a number >= 0, got {tol!r}")
        if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral) or max_iter < 1:
            raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")
        z = correct.to(self.mu.dtype)
        rate = float(z.mean())
        rate = min(max(rate, 1e-3), 1 - 1e-3)
        with torch.no_grad():
            self.mu.fill_(math.log(rate / (1 - rate)))
            self.alpha.zero_()
            self.beta.zero_()
        opt = torch.optim.LBFGS(
            self.parameters(),
            lr=1.0,
            max_iter=1,
            max_eval=50,
            history_size=20,
            tolerance_grad=0.0,
            tolerance_change=0.0,
            line_search_fn="strong_wolfe",
        )

        def closure():
            opt.zero_grad()
            loss = self.objective(student, question, z, l2)
            loss.backward()
            return loss

        curve = [float(self.objective(student, question, z, l2).detach())]
        for _ in range(max_iter):
            opt.step(closure)
            with torch.no_grad():
                curve.append(float(self.objective(student, question, z, l2)))
            if curve[-2] - curve[-1] <= tol * max(1.0, abs(curve[-1])):
                break
        return curve


class ConstantBaseline(nn.Module):
    """Predicts the same probability for every answer (default 0.5: Capped Binomial Deviance
    ``log10 2 = 0.30103`` whatever the targets).

    Args:
        probability: the constant prediction, in ``[0, 1]``.
    """

    def __init__(self, probability: float = 0.5):
        super().__init__()
        if (
            isinstance(probability, bool)
            or not isinstance(probability, numbers.Real)
            or not 0 <= probability <= 1
        ):
            raise ValueError(f"probability must be a number in [0, 1], got {probability!r}")
        self.probability: float = float(probability)

    def fit(self, *args, **kwargs) -> List[float]:
        """Nothing to learn (same call signature as :meth:`LogisticBaseline.fit`); returns ``[]``."""
        return []

    def forward(self, student, question) -> torch.Tensor:
        """``(N,)`` tensor (default dtype) filled with ``probability``."""
        student = torch.as_tensor(student)
        if student.dim() != 1 or torch.as_tensor(question).shape != student.shape:
            raise ValueError(
                f"student and question must be 1-D tensors of the same length, got "
                f"shapes {tuple(student.shape)} and {tuple(torch.as_tensor(question).shape)}"
            )
        return torch.full(student.shape, self.probability)

    predict = forward
