r"""RBMs for collaborative filtering of student answers (Soyer & Möllenhoff,
"What Do You Know?"; Salakhutdinov et al. 2007).

Each student is one RBM whose visible units are the questions it answered (a sub-RBM of one
shared model, :class:`~pyro_seq.distributions.SparseRBM`); the four variants of Soyer &
Möllenhoff are

* ``visible="bernoulli"``: one binary unit per question, 1 = correct (sec. 2.1, eq. 9-10);
* ``visible="softmax"``: one K-way softmax unit per question over the answer options, with a
  weight matrix per option :math:`W^{(k)}` (sec. 2.2, eq. 14-15);
* ``visible="binomial_softmax"``: each softmax unit replicated ``num_trials`` times with shared
  weights; an observed answer sets all replicas (sec. 2.3, eq. 16);
* ``num_factors=C``: the factored RBM :math:`W^{(k)} = A^{(k)} B` of rank ``C`` (sec. 2.4,
  eq. 17; ``B`` starts at the non-square identity as in the paper);

and ``conditional=True`` adds the "seen" input of the conditional RBM (sec. 2.5, eq. 20): the
hidden bias of student ``s`` is :math:`b + \sum_{q \in seen(s)} D_{:, q}`.

Training is ``SVI(model.model, model.guide, optim, loss=ContrastiveDivergence(k))`` over
per-student minibatches (:meth:`pyro_seq.data.StudentResponses.batches`); prediction for a
held-out (student, question) pair is the mean-field pass of Soyer & Möllenhoff eq. 9-10
(14-15): hidden probabilities from the student's training answers, then the visible
probability of the correct answer at the question.
"""

from types import MappingProxyType
from typing import Any, Optional, Tuple

import pyro
import torch
import torch.nn.functional as F
from torch import nn

from pyro_seq.distributions.rbm import VISIBLE_TYPES
from pyro_seq.distributions.sparse_rbm import SparseRBM
from pyro_seq.models.contract import EnergyBasedModel, example

__all__ = ["CollaborativeRBM"]


class CollaborativeRBM(EnergyBasedModel):
    r"""A student-answer RBM (module docstring).

    :param int num_questions: ``Q``.
    :param int num_hidden: ``H`` (Soyer & Möllenhoff: 15 non-factored, 40 with ``C = 10`` factors).
    :param str visible: ``"bernoulli"``, ``"softmax"`` or ``"binomial_softmax"``.
    :param int num_options: answer options ``K`` of the data (2: 0 wrong / 1 correct; 4: option
        indices with 0 correct, as :func:`pyro_seq.data.simulate_students` codes them).
    :param int num_trials: replicas of binomial-softmax units (Soyer & Möllenhoff: 2).
    :param int num_factors: ``C`` of the factored RBM, or None.
    :param bool conditional: add the seen-question input ``D`` (eq. 20).
    :param float init_scale: standard deviation of the initial weights (Soyer & Möllenhoff: 0.001).
    """

    module_name = "collaborative_rbm"
    trains_on_sequences = False  #: its data are (student, question, answer) triples
    unsupported = MappingProxyType(
        dict(
            EnergyBasedModel.unsupported,
            fit="its data are (student, question, answer) triples, not sequences; train it with "
            "SVI(model.model, model.guide, optim, ContrastiveDivergence(k)) on "
            "pyro_seq.data.simulate_students data",
            **{
                task: "it models students' answers, not sequences; predict answers with "
                "CollaborativeRBM.predict"
                for task in ("generate", "impute", "denoise", "forecast")
            },
            **{
                f"method:{m}": "it is evaluated by predicting held-out answers "
                "(CollaborativeRBM.predict, benchmarks/paper/cf_students.py)"
                for m in (
                    "elbo",
                    "iwae",
                    "smc",
                    "ais",
                    "reverse_ais",
                    "raise",
                    "exact",
                    "pseudo_likelihood",
                )
            },
        )
    )
    evaluation_methods: Tuple[
        str, ...
    ] = ()  #: evaluated by prediction (:meth:`predict`, the CBD metric)
    small_example = example(obs_dim=4, num_hidden=3)

    def __init__(
        self,
        num_questions: int,
        num_hidden: int = 15,
        visible: str = "bernoulli",
        num_options: int = 2,
        num_trials: int = 2,
        num_factors: Optional[int] = None,
        conditional: bool = False,
        init_scale: float = 1e-3,
    ) -> None:
        super().__init__()
        if visible not in VISIBLE_TYPES:
            raise ValueError(f"visible must be one of {VISIBLE_TYPES}, got {visible!r}")
        if num_options not in (2, 4):
            raise ValueError(f"num_options must be 2 or 4, got {num_options!r}")
        for name, value in (("num_questions", num_questions), ("num_hidden", num_hidden)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.visible, self.num_options = visible, num_options
        self.obs_dim = num_questions
        self.binary_observations = visible == "bernoulli"
        self.num_trials = num_trials if visible == "binomial_softmax" else 1
        self.correct_state = 1 if num_options == 2 else 0
        unit = () if visible == "bernoulli" else (num_options,)
        if num_factors is None:
            self.W = nn.Parameter(init_scale * torch.randn((num_hidden, num_questions) + unit))
        else:
            if not isinstance(num_factors, int) or num_factors < 1:
                raise ValueError(f"num_factors must be a positive int or None, got {num_factors!r}")
            self.A = nn.Parameter(init_scale * torch.randn((num_factors, num_questions) + unit))
            self.B = nn.Parameter(torch.eye(num_hidden, num_factors))
        self.num_factors = num_factors
        self.c = nn.Parameter(torch.zeros((num_questions,) + unit))
        self.b = nn.Parameter(torch.zeros(num_hidden))
        self.D = nn.Parameter(torch.zeros(num_hidden, num_questions)) if conditional else None

    def weights(self) -> torch.Tensor:
        """``W`` ``(H, Q[, K])``; for the factored model :math:`B A` (Soyer & Möllenhoff eq. 17)."""
        if self.num_factors is None:
            return self.W
        if self.A.dim() == 2:
            return self.B @ self.A
        return torch.einsum("hc,cqk->hqk", self.B, self.A)

    def encode(self, answer: torch.Tensor) -> torch.Tensor:
        """Visible states of answers ``(n,)``: 0/1 correct (Bernoulli), one-hot over options
        (softmax), or ``num_trials`` times the one-hot (binomial-softmax, every replica set)."""
        if self.visible == "bernoulli":
            return (answer == self.correct_state).to(self.b.dtype)
        return self.num_trials * F.one_hot(answer, self.num_options).to(self.b.dtype)

    def distribution(
        self,
        row: torch.Tensor,
        column: torch.Tensor,
        num_rows: int,
        seen: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> SparseRBM:
        """The batch's :class:`SparseRBM` (``seen``: ``(row, column)`` of the seen questions)."""
        hidden_bias: torch.Tensor = self.b
        if self.D is not None:
            if seen is None:
                raise ValueError("a conditional CollaborativeRBM needs seen=(row, column)")
            seen_row, seen_col = seen
            hidden_bias = self.b + self.b.new_zeros(num_rows, self.b.shape[0]).index_add(
                0, seen_row, self.D[:, seen_col].T
            )
        return SparseRBM(
            self.weights(),
            self.c,
            hidden_bias,
            row,
            column,
            num_rows,
            visible=self.visible,
            num_trials=self.num_trials,
        )

    def model(
        self,
        row: torch.Tensor,
        column: torch.Tensor,
        answer: torch.Tensor,
        num_rows: int,
        num_students: Optional[int] = None,
        seen: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> None:
        """Observe a minibatch of students' answers through their sub-RBMs (site ``"answers"``).

        :param row: ``(n,)`` int64 row ``0..num_rows-1`` of each answer.
        :param column: ``(n,)`` int64 question of each answer.
        :param answer: ``(n,)`` int64 answers (coded as ``num_options`` says).
        :param int num_rows: students in the batch.
        :param int num_students: all students (scales the minibatch, ``N / B``).
        :param seen: ``(row, column)`` of seen questions (conditional model only).
        """
        pyro.module(self.module_name, self)
        fn = self.distribution(row, column, num_rows, seen)
        device = self.b.device
        plate = (
            # pyro.plate takes a torch.device too (its annotation says str)
            pyro.plate("students", num_rows, device=device)  # type: ignore[arg-type]
            if num_students is None
            else pyro.plate(
                "students",
                num_students,
                subsample=torch.arange(num_rows, device=device),
                device=device,  # type: ignore[arg-type]
            )
        )
        with plate:
            pyro.sample("answers", fn, obs=self.encode(answer))

    def guide(self, *args: Any, **kwargs: Any) -> None:
        """Empty: the hidden units are summed out (there are no latent sample sites)."""

    @torch.no_grad()
    def predict(
        self,
        row: torch.Tensor,
        column: torch.Tensor,
        answer: torch.Tensor,
        num_rows: int,
        query_row: torch.Tensor,
        query_column: torch.Tensor,
        seen: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """P(correct) at the queries ``(query_row, query_column)`` ``(m,)`` given each row's
        training answers (mean-field, Soyer & Möllenhoff eq. 9-10 / 14-15)."""
        fn = self.distribution(row, column, num_rows, seen)
        mean = fn.predict(self.encode(answer), query_row, query_column)
        if self.visible == "bernoulli":
            return mean
        return mean[:, self.correct_state] / self.num_trials
