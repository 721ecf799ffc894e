"""Tests of the collaborative-filtering baselines (pyro_seq.baselines) on simulated students."""

import math

import numpy as np
import pytest
import torch

from pyro_seq.baselines import ConstantBaseline, LogisticBaseline
from pyro_seq.data import simulate_students
from pyro_seq.metrics import capped_binomial_deviance

LOG10_2 = math.log10(2)


@pytest.fixture(scope="module")
def small():
    return simulate_students(num_students=400, num_questions=100, observed_fraction=0.3, seed=0)


def _fit(d, **kwargs):
    model = LogisticBaseline(d.num_students, d.num_questions)
    curve = model.fit(d.train.student, d.train.question, d.train.correct, **kwargs)
    return model, curve


def test_logistic_between_constant_and_floor(small):
    """On held-out answers the fitted model beats always-0.5 and cannot beat the generating
    probabilities by more than sampling noise: the tolerance is 3 standard errors of the mean
    per-answer difference of the two deviances."""
    d, te = small, small.test
    model, curve = _fit(d)
    p_model = model.predict(te.student, te.question)
    p_true = d.true_probability(te.student, te.question)
    cbd_model = float(capped_binomial_deviance(p_model, te.correct))
    cbd_floor = float(capped_binomial_deviance(p_true, te.correct))
    diff = capped_binomial_deviance(
        p_model, te.correct, reduction="none"
    ) - capped_binomial_deviance(p_true, te.correct, reduction="none")
    se = float(diff.std() / math.sqrt(len(diff)))
    assert cbd_model > cbd_floor - 3 * se
    # and it beats 0.5 by more than 3 standard errors of its own per-answer gain over 0.5
    gain = LOG10_2 - capped_binomial_deviance(p_model, te.correct, reduction="none")
    assert cbd_model < LOG10_2 - 3 * float(gain.std() / math.sqrt(len(gain)))
    # the curve starts at the intercept-only fit and decreases
    assert len(curve) >= 2 and curve[-1] < curve[0]
    assert all(b <= a + 1e-6 for a, b in zip(curve, curve[1:]))
    assert p_model.shape == te.student.shape and bool(((p_model > 0) & (p_model < 1)).all())


def test_effects_recover_ability_and_difficulty():
    """Well observed (~50 answers per student, ~150 per question): alpha_s tracks theta_s and
    beta_q (easiness) tracks -d_q, since logit P = a_q theta_s - a_q d_q with a_q near 1."""
    d = simulate_students(num_students=300, num_questions=100, observed_fraction=0.5, seed=1)
    model, _ = _fit(d)

    def pearson(x, y):
        return float(torch.corrcoef(torch.stack([x.double(), y.double()]))[0, 1])

    assert pearson(model.alpha.detach(), d.ability) > 0.8
    assert pearson(model.beta.detach(), -d.difficulty) > 0.8


def test_fit_reaches_the_stationary_point(small, float64):
    """Eqs. (3)-(5) of pyro_seq.baselines.logistic: at the minimum of J the residuals
    sigma(eta_i) - z_i sum to 0 overall and to -2 lambda alpha_s (-2 lambda beta_q) per student
    (question). Fitted in float64 to the round-off floor (tol=0); the residual sums are over
    ~25 (student) to ~95 (question) answers, each residual O(1)."""
    d, l2 = small, 0.7
    tr = d.train
    model, _ = _fit(d, l2=l2, tol=0.0)
    assert model.alpha.dtype == torch.float64
    with torch.no_grad():
        r = torch.sigmoid(model.mu + model.alpha[tr.student] + model.beta[tr.question]) - tr.correct
        per_student = torch.zeros(d.num_students, dtype=r.dtype).index_add_(0, tr.student, r)
        per_question = torch.zeros(d.num_questions, dtype=r.dtype).index_add_(0, tr.question, r)
        assert abs(float(r.sum())) < 1e-6
        torch.testing.assert_close(per_student, -2 * l2 * model.alpha, rtol=0, atol=1e-6)
        torch.testing.assert_close(per_question, -2 * l2 * model.beta, rtol=0, atol=1e-6)
    # J at the fit is below J at random perturbations of it (a minimum, not just stationary)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        j0 = float(model.objective(tr.student, tr.question, tr.correct, l2))
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        assert float(model.objective(tr.student, tr.question, tr.correct, l2)) > j0


def test_multiple_choice_uses_option_zero():
    """The 4-option simulation has option 0 exactly where the binary one has a 1 (same seed), so
    fitting on answer == 0 gives the binary fit."""
    kw = dict(num_students=100, num_questions=30, observed_fraction=0.3, seed=2)
    d2, d4 = simulate_students(num_options=2, **kw), simulate_students(num_options=4, **kw)
    m2, _ = _fit(d2)
    m4 = LogisticBaseline(d4.num_students, d4.num_questions)
    m4.fit(d4.train.student, d4.train.question, d4.train.answer == 0)
    torch.testing.assert_close(
        m4.predict(d4.test.student, d4.test.question), m2.predict(d2.test.student, d2.test.question)
    )


def test_constant_baseline_is_log10_two(small):
    te = small.test
    c = ConstantBaseline()
    assert c.fit(small.train.student, small.train.question, small.train.correct) == []
    p = c.predict(te.student, te.question)
    assert bool((p == 0.5).all()) and p.shape == te.student.shape
    assert abs(float(capped_binomial_deviance(p, te.correct)) - LOG10_2) < 1e-15


def test_validation():
    model = LogisticBaseline(3, 4)
    s, q, z = torch.tensor([0, 1, 2]), torch.tensor([0, 3, 1]), torch.tensor([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="num_students"):
        LogisticBaseline(0, 4)
    with pytest.raises(ValueError, match=r"question indices must lie in \[0, 3\]"):
        model.fit(s, torch.tensor([0, 4, 1]), z)
    with pytest.raises(ValueError, match="same length"):
        model.fit(s, q[:2], z)
    with pytest.raises(ValueError, match="correct must have the shape"):
        model.fit(s, q, z[:2])
    with pytest.raises(ValueError, match="only 0 and 1"):
        model.fit(s, q, torch.tensor([1, 2, 0]))
    with pytest.raises(ValueError, match="l2"):
        model.fit(s, q, z, l2=-1.0)
    with pytest.raises(ValueError, match="tol"):
        model.fit(s, q, z, tol=-1.0)
    with pytest.raises(ValueError, match="max_iter"):
        model.fit(s, q, z, max_iter=0)
    with pytest.raises(ValueError, match="integer index"):
        model.predict(s.float(), q)
    with pytest.raises(ValueError, match="probability"):
        ConstantBaseline(1.5)
    assert np.isfinite(model.fit(s, q, z)[-1])
