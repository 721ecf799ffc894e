"""Tests of the student-answer simulator (pyro_seq.data.students, eqs. 1-6 of its docstring).

Statistical checks use fixed seeds and tolerances of 4 standard errors, derived next to each
assertion; every simulation is small enough to run in well under a second.
"""

import math
import tracemalloc

import numpy as np
import pytest
import torch

from pyro_seq.data import StudentResponses, simulate_students

Z = 4.0  # tolerance in standard errors (two-sided p ~ 6e-5 per check)


def _pairs(ans):
    return set(zip(ans.student.tolist(), ans.question.tolist()))


def _counts(ans, num_students):
    return np.bincount(ans.student.numpy(), minlength=num_students)


def test_deterministic_from_seed():
    kw = dict(num_students=300, num_questions=80, observed_fraction=0.1, num_options=4)
    a, b = simulate_students(seed=3, **kw), simulate_students(seed=3, **kw)
    c = simulate_students(seed=4, **kw)
    for split in ("train", "test"):
        for field in ("student", "question", "answer"):
            assert torch.equal(getattr(a.split(split), field), getattr(b.split(split), field))
    for field in ("ability", "difficulty", "discrimination", "distractor"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.ability, c.ability)
    assert _pairs(a.train) != _pairs(c.train)


def test_storage_is_sparse():
    """S x Q = 1e8 pairs, ~2e4 observed: a dense table (>= 100 MB even as bool) is never built.

    tracemalloc sees numpy's allocations (the simulator works in numpy and wraps the results with
    torch.from_numpy); the peak must stay O(answers + S + Q) bytes, and so must every tensor of
    the result.
    """
    S, Q = 2000, 50_000
    tracemalloc.start()
    try:
        d = simulate_students(num_students=S, num_questions=Q, observed_fraction=0.0002)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    n = len(d.train) + len(d.test)
    assert n < 0.001 * S * Q
    assert peak < 200 * (n + S + Q) < S * Q / 5
    numel = sum(t.numel() for t in (d.ability, d.difficulty, d.discrimination))
    for ans in (d.train, d.test):
        numel += sum(t.numel() for t in (ans.student, ans.question, ans.answer))
        assert ans.student.dtype == ans.question.dtype == ans.answer.dtype == torch.int64
    assert numel == 3 * n + S + 2 * Q


def test_observed_fraction_and_no_duplicates():
    """Without the floor of 2 (negligible here: P(Binomial(500, 0.1) < 2) ~ 1e-21), the number of
    answers is Binomial(S Q, f): mean S Q f, standard error sqrt(S Q f (1 - f))."""
    S, Q, f = 400, 500, 0.1
    d = simulate_students(num_students=S, num_questions=Q, observed_fraction=f, test_fraction=0.3)
    n = len(d.train) + len(d.test)
    assert abs(n - S * Q * f) < Z * math.sqrt(S * Q * f * (1 - f))
    pairs = _pairs(d.train) | _pairs(d.test)
    assert len(pairs) == n  # no (student, question) twice, within or across the splits
    # each question is observed by Binomial(S, f) students: mean S f, variance S f (1 - f)
    per_question = np.bincount(torch.cat([d.train.question, d.test.question]).numpy(), minlength=Q)
    assert abs(per_question.mean() - S * f) < Z * math.sqrt(S * f * (1 - f) / Q)


def test_at_least_two_answers_per_student():
    S = 200
    d = simulate_students(num_students=S, num_questions=100, observed_fraction=0.001)
    n = _counts(d.train, S) + _counts(d.test, S)
    # f Q = 0.1: almost every student is raised to the floor, none is below it
    assert n.min() == 2 and np.mean(n == 2) > 0.9
    full = simulate_students(num_students=5, num_questions=7, observed_fraction=1.0)
    assert len(_pairs(full.train) | _pairs(full.test)) == 35  # f = 1: every pair, once


def test_split():
    S, tf = 500, 0.2
    d = simulate_students(num_students=S, num_questions=60, observed_fraction=0.1, test_fraction=tf)
    n_train, n_test = _counts(d.train, S), _counts(d.test, S)
    n = n_train + n_test
    assert n_train.min() >= 1  # every student keeps a training answer
    assert not (_pairs(d.train) & _pairs(d.test))  # disjoint
    np.testing.assert_array_equal(n_test, np.minimum(np.floor(tf * n + 0.5), n - 1))
    # the held-out answers are a random subset: their correct rate matches the training one
    # (difference of two means of 0/1 variables, standard error <= sqrt(1/4 (1/N1 + 1/N2)))
    se = math.sqrt(0.25 * (1 / len(d.train) + 1 / len(d.test)))
    assert abs(float(d.train.correct.mean() - d.test.correct.mean())) < Z * se
    # sorted by student, then question
    for ans in (d.train, d.test):
        key = ans.student * d.num_questions + ans.question
        assert bool((key[1:] > key[:-1]).all())
    no_test = simulate_students(
        num_students=20, num_questions=30, observed_fraction=0.2, test_fraction=0.0
    )
    assert len(no_test.test) == 0


def test_parameters_follow_their_priors():
    """theta, d ~ N(0, 1) and log a ~ N(0, 0.3^2): sample mean within Z sd/sqrt(n), sample
    variance within Z sd^2 sqrt(2/(n-1)) (normal theory)."""
    d = simulate_students(num_students=4000, num_questions=4000, observed_fraction=0.0005)
    for x, sd in ((d.ability, 1.0), (d.difficulty, 1.0), (d.discrimination.log(), 0.3)):
        n = x.shape[0]
        assert abs(float(x.mean())) < Z * sd / math.sqrt(n)
        assert abs(float(x.var()) - sd**2) < Z * sd**2 * math.sqrt(2 / (n - 1))
    assert d.ability.dtype == torch.float64 and bool((d.discrimination > 0).all())


def test_answers_follow_the_2pl_probability():
    """Eq. (3), written here from Birnbaum's formula. Given the parameters the answers are
    independent Bernoulli(p_i); in each of 10 bins of p, sum(y - p) has standard error
    sqrt(sum p (1 - p))."""
    d = simulate_students(num_students=2000, num_questions=200, observed_fraction=0.25)
    s = torch.cat([d.train.student, d.test.student])
    q = torch.cat([d.train.question, d.test.question])
    y = torch.cat([d.train.answer, d.test.answer]).double()
    a, theta, b = d.discrimination[q], d.ability[s], d.difficulty[q]
    p = 1 / (1 + torch.exp(-a * (theta - b)))
    torch.testing.assert_close(d.true_probability(s, q), p, rtol=1e-12, atol=0)
    assert len(y) > 90_000 and set(y.unique().tolist()) == {0.0, 1.0}
    edges = torch.quantile(p, torch.linspace(0, 1, 11, dtype=p.dtype))
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (p >= lo) & (p <= hi)
        se = math.sqrt(float((p[m] * (1 - p[m])).sum()))
        assert abs(float((y[m] - p[m]).sum())) < Z * se
    # true_probability broadcasts over any shape and is a probability
    grid = d.true_probability(torch.tensor([[0, 1], [2, 3]]), torch.tensor([[5, 5], [6, 7]]))
    assert grid.shape == (2, 2) and bool(((grid > 0) & (grid < 1)).all())


def test_four_options():
    kw = dict(num_students=3000, num_questions=50, observed_fraction=0.4, seed=7)
    d4, d2 = simulate_students(num_options=4, **kw), simulate_students(num_options=2, **kw)
    assert d4.num_options == 4 and d2.distractor is None
    for split in ("train", "test"):
        a4, a2 = d4.split(split), d2.split(split)
        assert torch.equal(a4.student, a2.student) and torch.equal(a4.question, a2.question)
        # same streams: option 0 (correct) exactly where the binary data has a 1
        assert torch.equal(a4.answer == 0, a2.answer == 1)
        assert torch.equal(a4.correct, a2.correct)
        assert set(a4.answer.unique().tolist()) == {0, 1, 2, 3}
    pi = d4.distractor
    assert pi.shape == (50, 3) and bool((pi > 0).all())
    torch.testing.assert_close(pi.sum(1), torch.ones(50, dtype=pi.dtype))
    # eq. (6): a wrong answer is option k with probability pi_qk, independently. Over the N_w
    # wrong answers, count(k) - sum pi_{q_i k} has standard error sqrt(sum pi (1 - pi)).
    ans = d4.train
    wrong = ans.answer > 0
    pik = pi[ans.question[wrong]]
    for k in (1, 2, 3):
        dev = float((ans.answer[wrong] == k).sum()) - float(pik[:, k - 1].sum())
        assert abs(dev) < Z * math.sqrt(float((pik[:, k - 1] * (1 - pik[:, k - 1])).sum()))
    # per question (about 3000 * 0.4 * 0.8 * P(wrong) answers each): option frequencies of the
    # wrong answers track pi_q, whose rows vary a lot under Dirichlet(1, 1, 1)
    freq = torch.stack(
        [torch.bincount(ans.question[wrong & (ans.answer == k)], minlength=50) for k in (1, 2, 3)],
        1,
    ).double()
    freq = freq / freq.sum(1, keepdim=True)
    assert float(torch.corrcoef(torch.stack([freq.flatten(), pi.flatten()]))[0, 1]) > 0.95


def test_batches_are_a_csr_view_of_the_split():
    d = simulate_students(num_students=103, num_questions=40, observed_fraction=0.1)
    offsets, question, answer = d.csr("train")
    assert offsets.shape == (104,) and int(offsets[-1]) == len(d.train)
    seen = []
    batches = list(d.batches(10, shuffle=True, seed=1))
    assert [len(b.student) for b in batches] == [10] * 10 + [3]
    for b in batches:
        assert b.offsets[0] == 0 and int(b.offsets[-1]) == len(b.question)
        for i, s in enumerate(b.student.tolist()):
            lo, hi = int(b.offsets[i]), int(b.offsets[i + 1])
            assert torch.equal(b.question[lo:hi], question[offsets[s] : offsets[s + 1]])
            assert torch.equal(b.answer[lo:hi], answer[offsets[s] : offsets[s + 1]])
            seen += [(s, int(q), int(a)) for q, a in zip(b.question[lo:hi], b.answer[lo:hi])]
        assert torch.equal(b.student[b.row], torch.repeat_interleave(b.student, b.offsets.diff()))
        cols, local = b.columns()
        assert torch.equal(cols[local], b.question) and bool((cols[1:] > cols[:-1]).all())
    # every training answer exactly once
    expected = list(
        zip(d.train.student.tolist(), d.train.question.tolist(), d.train.answer.tolist())
    )
    assert sorted(seen) == sorted(expected) and len(seen) == len(expected)
    order = [b.student for b in batches]
    again = [b.student for b in d.batches(10, shuffle=True, seed=1)]
    other = torch.cat([b.student for b in d.batches(10, shuffle=True, seed=2)])
    assert all(torch.equal(x, y) for x, y in zip(order, again))
    assert not torch.equal(torch.cat(order), other)
    assert torch.equal(
        torch.cat([b.student for b in d.batches(50, shuffle=False)]), torch.arange(103)
    )
    # the test split: only students with held-out answers
    test_students = torch.cat([b.student for b in d.batches(7, split="test", shuffle=False)])
    assert torch.equal(test_students, d.test.student.unique())


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_students=0), "num_students"),
        (dict(num_students=2.5), "num_students"),
        (dict(num_questions=1), "num_questions"),
        (dict(observed_fraction=0.0), "observed_fraction"),
        (dict(observed_fraction=1.5), "observed_fraction"),
        (dict(observed_fraction=float("nan")), "observed_fraction"),
        (dict(num_options=3), "num_options"),
        (dict(seed=-1), "seed"),
        (dict(test_fraction=1.0), "test_fraction"),
        (dict(test_fraction=-0.1), "test_fraction"),
    ],
)
def test_argument_validation(kwargs, name):
    base = dict(num_students=10, num_questions=10, observed_fraction=0.3)
    with pytest.raises(ValueError, match=name):
        simulate_students(**{**base, **kwargs})


def test_method_argument_validation():
    d = simulate_students(num_students=10, num_questions=10, observed_fraction=0.3)
    assert isinstance(d, StudentResponses)
    with pytest.raises(ValueError, match="split"):
        d.csr("valid")
    with pytest.raises(ValueError, match="batch_size"):
        next(d.batches(0))
    with pytest.raises(ValueError, match="question indices"):
        d.true_probability(torch.tensor([0]), torch.tensor([10]))
    with pytest.raises(ValueError, match="student must be an integer"):
        d.true_probability(torch.tensor([0.0]), torch.tensor([1]))
    with pytest.raises(ValueError, match="shape"):
        d.true_probability(torch.tensor([0, 1]), torch.tensor([1]))
