r"""Simulated student answers for collaborative filtering (a stand-in for the Grockit data).

Soyer and Möllenhoff ("What Do You Know?", the Kaggle/Grockit challenge) predict the probability
that a student answers a question correctly from a very sparse student x question table of past
answers. :func:`simulate_students` draws such a table from a known model, so that a learned
predictor can be compared with the generating probabilities (the *floor*: no predictor has a
lower expected loss).

Generative model (Birnbaum's two-parameter logistic item response model, 2PL; A. Birnbaum,
"Some latent trait models and their use in inferring an examinee's ability", in Lord and
Novick, *Statistical Theories of Mental Test Scores*, 1968, ch. 17-20)::

    theta_s ~ N(0, 1)                        ability of student s,        s = 0..S-1     (1)
    d_q ~ N(0, 1),  a_q ~ LogNormal(0, 0.3)  difficulty, discrimination,  q = 0..Q-1     (2)
    P(correct | s, q) = sigmoid(a_q (theta_s - d_q)) = 1 / (1 + exp(-a_q (theta_s - d_q)))   (3)

(``LogNormal(0, 0.3)``: ``log a_q ~ N(0, 0.3^2)``.) Given the parameters, answers are independent.

Which answers are observed (missing completely at random)::

    n_s = max(2, Binomial(Q, f))       number of questions student s answers, f = observed_fraction
    {q_s1, .., q_sn_s}                 a uniformly random n_s-subset of 0..Q-1 (no duplicates)   (4)

Without the floor of 2, (4) is the same as observing every (s, q) pair independently with
probability ``f``; the floor (so that every student has an answer to learn from and, usually,
one to test on) only matters when ``f Q`` is small.

Answers. With ``num_options=2`` the answer is ``1`` (correct) or ``0`` (wrong), drawn by (3).
With ``num_options=4`` (a multiple-choice question) the answer is an option index ``0..3``;
option ``0`` is the correct one, chosen with probability (3), and a wrong answer picks one of the
distractors ``1, 2, 3`` with question-specific probabilities::

    pi_q = (pi_q1, pi_q2, pi_q3) ~ Dirichlet(1, 1, 1)                                    (5)
    P(answer = k | s, q) = (1 - P(correct | s, q)) pi_qk,   k = 1, 2, 3                  (6)

Each quantity is drawn from its own stream of a numpy ``SeedSequence(seed)``, so the abilities,
the observed pairs and whether each answer is correct do not depend on ``num_options``: for the
same arguments and seed, ``answer == 0`` of the 4-option data equals ``answer`` of the binary
data. Everything is deterministic given ``seed``.

Train/test split, per student: ``n_test_s = min(floor(test_fraction * n_s + 1/2), n_s - 1)`` of
the student's answers (a uniformly random subset) are held out, so every student keeps at least one
training answer (as in the Grockit test set, whose students all appear in the training set).

Storage is sparse only (coordinate lists, one row per answer, sorted by student then
question); no ``(S, Q)`` array is ever built, so memory is ``O(S + Q + number of answers)``.
:meth:`StudentResponses.batches` yields per-student minibatches in CSR form.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import numpy as np
import torch

__all__ = ["Answers", "StudentBatch", "StudentResponses", "simulate_students"]

_SPLITS = ("train", "test")
_DISCRIMINATION_SIGMA = 0.3  # a_q ~ LogNormal(0, 0.3), eq. (2)


@dataclass(frozen=True)
class Answers:
    """One split of the answers in coordinate form: answer ``i`` is ``answer[i]`` given by
    student ``student[i]`` to question ``question[i]``.

    Attributes:
        student: ``(N,)`` int64 student indices in ``0..S-1``, sorted (ascending).
        question: ``(N,)`` int64 question indices in ``0..Q-1``, ascending within each student.
        answer: ``(N,)`` int64; ``0/1`` (1 = correct) for binary data, an option index
            ``0..num_options-1`` (0 = correct) for multiple-choice data.
        num_options: 2 or 4, how ``answer`` is coded.
    """

    student: torch.Tensor
    question: torch.Tensor
    answer: torch.Tensor
    num_options: int

    def __len__(self) -> int:
        return int(self.student.shape[0])

    @property
    def correct(self) -> torch.Tensor:
        """``(N,)`` float 0/1 (default dtype): 1 where the answer is correct (``answer == 1``
        for binary data, ``answer == 0`` for multiple choice)."""
        hit = self.answer == 1 if self.num_options == 2 else self.answer == 0
        return hit.to(torch.get_default_dtype())


@dataclass(frozen=True)
class StudentBatch:
    """A minibatch of ``B`` students in CSR form: student ``student[i]`` (row ``i``) answered
    ``question[offsets[i]:offsets[i+1]]`` with ``answer[offsets[i]:offsets[i+1]]``.

    Attributes:
        student: ``(B,)`` int64 student indices.
        offsets: ``(B + 1,)`` int64, ``offsets[0] = 0``, ``offsets[B] = nnz``, non-decreasing.
        question: ``(nnz,)`` int64 question indices (ascending within a row).
        answer: ``(nnz,)`` int64 answers, coded as in :class:`Answers`.
    """

    student: torch.Tensor
    offsets: torch.Tensor
    question: torch.Tensor
    answer: torch.Tensor

    @property
    def row(self) -> torch.Tensor:
        """``(nnz,)`` int64: the row ``0..B-1`` of every answer (for ``index_add``/``scatter``)."""
        counts = self.offsets[1:] - self.offsets[:-1]
        return torch.repeat_interleave(torch.arange(self.student.shape[0]), counts)

    def columns(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The questions this batch touches: ``(cols, local)``.

        ``cols`` is ``(C,)`` int64, the sorted distinct questions of the batch, and ``local`` is
        ``(nnz,)`` int64 with ``cols[local] == question``: a model with per-question parameters
        ``W`` of shape ``(Q, H)`` gathers only ``W[cols]`` ``(C, H)`` and indexes it by ``local``.
        """
        cols, local = torch.unique(self.question, sorted=True, return_inverse=True)
        return cols, local


@dataclass(frozen=True)
class StudentResponses:
    """Simulated answers and the parameters that generated them (see :mod:`.students`).

    Attributes:
        train: :class:`Answers` of the training split.
        test: :class:`Answers` of the test split (disjoint from ``train`` in (student, question)).
        num_students: ``S``.
        num_questions: ``Q``.
        num_options: 2 (binary answers) or 4 (option indices, 0 = correct).
        ability: ``(S,)`` float64, ``theta_s`` of eq. (1).
        difficulty: ``(Q,)`` float64, ``d_q`` of eq. (2).
        discrimination: ``(Q,)`` float64, ``a_q`` of eq. (2).
        distractor: ``(Q, 3)`` float64, ``pi_q`` of eq. (5) (rows sum to 1), or None when
            ``num_options == 2``.
    """

    train: Answers
    test: Answers
    num_students: int
    num_questions: int
    num_options: int
    ability: torch.Tensor
    difficulty: torch.Tensor
    discrimination: torch.Tensor
    distractor: Optional[torch.Tensor] = None

    def split(self, split: str) -> Answers:
        """The :class:`Answers` of ``"train"`` or ``"test"``."""
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {list(_SPLITS)}, got {split!r}")
        return self.train if split == "train" else self.test

    def true_probability(self, student, question) -> torch.Tensor:
        """The generating ``P(correct | s, q) = sigmoid(a_q (theta_s - d_q))`` of eq. (3).

        Args:
            student: int64 tensor of student indices in ``0..S-1``, any shape.
            question: int64 tensor of question indices in ``0..Q-1``, the same shape.

        Returns:
            float64 tensor of that shape: the floor model's predictions.
        """
        student, question = check_index_pair(
            student, question, self.num_students, self.num_questions
        )
        a = self.discrimination[question]
        return torch.sigmoid(a * (self.ability[student] - self.difficulty[question]))

    def csr(self, split: str = "train") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All students of a split in CSR form: ``(offsets, question, answer)``.

        ``offsets`` is ``(S + 1,)`` int64; student ``s`` answered
        ``question[offsets[s]:offsets[s+1]]`` (possibly none, in the test split).
        """
        ans = self.split(split)
        counts = torch.bincount(ans.student, minlength=self.num_students)
        offsets = torch.zeros(self.num_students + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(counts, 0)
        return offsets, ans.question, ans.answer

    def batches(
        self, batch_size: int, split: str = "train", shuffle: bool = True, seed: int = 0
    ) -> Iterator[StudentBatch]:
        """Per-student minibatches of one split, as :class:`StudentBatch` (CSR form).

        Every student with at least one answer in ``split`` appears in exactly one batch (in the
        test split, students without held-out answers are skipped); all batches have
        ``batch_size`` students except possibly the last. With ``shuffle`` the order of the
        students is a permutation drawn from ``numpy.random.default_rng(seed)`` (pass e.g. the
        epoch number as ``seed`` for a new order each epoch); otherwise it is ascending.

        Args:
            batch_size: students per batch, a positive int.
            split: ``"train"`` or ``"test"``.
            shuffle: permute the students.
            seed: the permutation's seed, a non-negative int.

        Yields:
            :class:`StudentBatch`; a batch touches only the questions its students answered
            (:meth:`StudentBatch.columns`).
        """
        _check_int("batch_size", batch_size, 1)
        _check_int("seed", seed, 0)
        offsets, question, answer = self.csr(split)
        counts = offsets[1:] - offsets[:-1]
        students = torch.nonzero(counts > 0).flatten()
        if shuffle:
            perm = np.random.default_rng(seed).permutation(students.shape[0])
            students = students[torch.from_numpy(perm)]
        for start in range(0, students.shape[0], batch_size):
            ids = students[start : start + batch_size]
            c = counts[ids]
            batch_offsets = torch.zeros(ids.shape[0] + 1, dtype=torch.int64)
            batch_offsets[1:] = torch.cumsum(c, 0)
            # position of answer j of row i in the split: offsets[ids[i]] + j
            within = torch.arange(int(batch_offsets[-1])) - torch.repeat_interleave(
                batch_offsets[:-1], c
            )
            idx = torch.repeat_interleave(offsets[ids], c) + within
            yield StudentBatch(ids, batch_offsets, question[idx], answer[idx])


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value}")
    return int(value)


def check_index_pair(student, question, num_students: int, num_questions: int):
    """``(student, question)`` as integer index tensors, checked against the table's sizes:
    a ValueError names the argument with a floating, complex or bool dtype or an index outside
    ``[0, n)``."""
    student, question = torch.as_tensor(student), torch.as_tensor(question)
    for name, idx, n in (("student", student, num_students), ("question", question, num_questions)):
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer index tensor, got dtype {idx.dtype}")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(
                f"{name} indices must lie in [0, {n - 1}], got range "
                f"[{int(idx.min())}, {int(idx.max())}]"
            )
    if student.shape != question.shape:
        raise ValueError(
            f"student shape {tuple(student.shape)} and question shape "
            f"{tuple(question.shape)} differ"
        )
    return student.long(), question.long()


def _answers(
    student: np.ndarray,
    question: np.ndarray,
    answer: np.ndarray,
    num_questions: int,
    num_options: int,
) -> Answers:
    order = np.argsort(student * num_questions + question, kind="stable")
    columns = [
        torch.from_numpy(np.ascontiguousarray(v[order], dtype=np.int64))
        for v in (student, question, answer)
    ]
    return Answers(columns[0], columns[1], columns[2], num_options=num_options)


def simulate_students(
    num_students: int = 10_000,
    num_questions: int = 1_000,
    observed_fraction: float = 0.02,
    num_options: int = 2,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> StudentResponses:
    """Simulate sparse student answers from the 2PL model (module docstring, eqs. 1-6).

    Args:
        num_students: ``S >= 1``.
        num_questions: ``Q >= 2`` (every student answers at least two distinct questions).
        observed_fraction: ``f`` in ``(0, 1]``; each student answers ``max(2, Binomial(Q, f))``
            distinct questions, about ``f Q`` (eq. 4).
        num_options: 2 (answers 0/1, 1 = correct) or 4 (option index 0..3, 0 = correct; eqs. 5-6).
        seed: non-negative int; the result is a deterministic function of all arguments.
        test_fraction: in ``[0, 1)``; per student, ``min(floor(test_fraction * n_s + 1/2), n_s - 1)``
            answers go to the test split.

    Returns:
        :class:`StudentResponses` with ``train`` and ``test`` :class:`Answers` (int64 coordinate
        tensors, ``O(number of answers)`` memory) and the true parameters.

    Raises:
        ValueError: naming the argument that is out of range or of the wrong type.
    """
    S = _check_int("num_students", num_students, 1)
    Q = _check_int("num_questions", num_questions, 2)
    if (
        isinstance(observed_fraction, bool)
        or not isinstance(observed_fraction, numbers.Real)
        or not 0 < observed_fraction <= 1
    ):
        raise ValueError(f"observed_fraction must be a number in (0, 1], got {observed_fraction!r}")
    if isinstance(num_options, bool) or num_options not in (2, 4):
        raise ValueError(
            f"num_options must be 2 (binary answers) or 4 (multiple choice), got {num_options!r}"
        )
    seed = _check_int("seed", seed, 0)
    if (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, numbers.Real)
        or not 0 <= test_fraction < 1
    ):
        raise ValueError(f"test_fraction must be a number in [0, 1), got {test_fraction!r}")

    params_ss, pattern_ss, answer_ss, distractor_ss = np.random.SeedSequence(seed).spawn(4)
    rng = np.random.default_rng(params_ss)
    ability = rng.standard_normal(S)  # eq. (1)
    difficulty = rng.standard_normal(Q)  # eq. (2)
    discrimination = np.exp(_DISCRIMINATION_SIGMA * rng.standard_normal(Q))

    # eq. (4): n_s questions per student, a uniformly random subset in uniformly random order
    rng = np.random.default_rng(pattern_ss)
    n = np.maximum(2, rng.binomial(Q, float(observed_fraction), size=S))
    question = np.empty(int(n.sum()), dtype=np.int64)
    pos = 0
    for s in range(S):
        question[pos : pos + n[s]] = rng.choice(Q, size=n[s], replace=False, shuffle=True)
        pos += n[s]
    student = np.repeat(np.arange(S, dtype=np.int64), n)

    # eq. (3): correct with probability sigmoid(a_q (theta_s - d_q)), one uniform per answer
    logit = discrimination[question] * (ability[student] - difficulty[question])
    u = np.random.default_rng(answer_ss).random(student.shape[0])
    correct = u < 1.0 / (1.0 + np.exp(-logit))
    distractor = None
    if num_options == 2:
        answer = correct.astype(np.int64)
    else:  # eqs. (5)-(6)
        rng = np.random.default_rng(distractor_ss)
        distractor = rng.dirichlet(np.ones(3), size=Q)
        cdf = np.cumsum(distractor[question], axis=1)
        v = rng.random(student.shape[0])
        wrong = 1 + np.minimum((v[:, None] >= cdf).sum(1), 2)
        answer = np.where(correct, 0, wrong).astype(np.int64)

    # split: the last n_test_s of each student's (randomly ordered) answers are held out
    n_test = np.minimum(np.floor(test_fraction * n + 0.5).astype(np.int64), n - 1)
    start = np.concatenate(([0], np.cumsum(n)[:-1]))
    rank = np.arange(student.shape[0]) - np.repeat(start, n)
    is_test = rank >= np.repeat(n - n_test, n)
    train = _answers(student[~is_test], question[~is_test], answer[~is_test], Q, num_options)
    test = _answers(student[is_test], question[is_test], answer[is_test], Q, num_options)
    return StudentResponses(
        train=train,
        test=test,
        num_students=S,
        num_questions=Q,
        num_options=num_options,
        ability=torch.from_numpy(ability),
        difficulty=torch.from_numpy(difficulty),
        discrimination=torch.from_numpy(discrimination),
        distractor=None if distractor is None else torch.from_numpy(distractor),
    )
