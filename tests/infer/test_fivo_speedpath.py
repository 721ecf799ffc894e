"""FIVO's batched bookkeeping equals the textbook online particle-filter accumulation.

:meth:`FIVO._combine` turns the per-step log weights and resampling decisions into
:math:`\\log \\hat p_b = \\sum_r \\log \\frac{1}{K}\\sum_k \\exp(\\sum_{t \\in r} \\log
\\alpha_{t,k,b})` (Maddison et al., 2017, sec. 3; thesis eq. 3.20) with one scatter; the
reference below accumulates it online, step by step, as a particle filter does: add the
step's log weights, and where a sequence resamples add the log-mean-exp of its running weights
and reset them. Values and gradients must agree in float64, with decisions that differ across
the sequences of one step, steps without sites and steps without any resampling.
:func:`~pyro_seq.ops.resampling.resample` and :func:`~pyro_seq.ops.resampling.draw_ancestors`
must draw the same ancestors from the same generator state.
"""

import math

import pytest
import torch

from pyro_seq.infer.fivo import FIVO
from pyro_seq.ops.resampling import RESAMPLING_SCHEMES, draw_ancestors, resample

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def online_log_z(incs, resampled, K, B):
    """Textbook accumulation: running log weights, log-mean-exp added at each resampling."""
    log_z = torch.zeros(B)
    log_w = torch.zeros(K, B)
    count = torch.zeros(B, dtype=torch.long)
    for inc, do in zip(incs, resampled):
        if inc is not None:
            log_w = log_w + inc
        if do is not None:
            step = torch.logsumexp(log_w, 0) - math.log(K)
            log_z = log_z + torch.where(do, step, torch.zeros(B))
            log_w = torch.where(do, torch.zeros(K, B), log_w)
            count = count + do.long()
    return log_z + torch.logsumexp(log_w, 0) - math.log(K), count


@pytest.mark.parametrize("pattern", ["mixed", "none", "always"])
def test_combine_equals_online_accumulation(pattern):
    gen = torch.Generator().manual_seed(3)
    T, K, B = 9, 4, 5
    leaf = (3 * torch.randn(T, K, B, generator=gen)).requires_grad_()
    incs = [None if t == 2 else leaf[t] for t in range(T)]  # a step without sites
    if pattern == "none":
        resampled = [None] * T
    elif pattern == "always":
        resampled = [torch.ones(B, dtype=torch.bool) for _ in range(T - 1)] + [None]
    else:
        resampled = [
            None if t in (0, 4, T - 1) else torch.rand(B, generator=gen) < 0.5 for t in range(T)
        ]
        resampled[1] = torch.tensor([True, False, True, False, False])
    x = torch.zeros(B, T, 1)
    got, count = FIVO._combine(incs, resampled, x, K, B)
    ref, ref_count = online_log_z(incs, resampled, K, B)
    assert torch.equal(count, ref_count)
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)
    (g_got,) = torch.autograd.grad(got.sum(), leaf)
    (g_ref,) = torch.autograd.grad(ref.sum(), leaf)
    assert torch.allclose(g_got, g_ref, rtol=1e-12, atol=1e-12)
    assert g_got[2].abs().max() == 0  # the step without sites contributes nothing


def test_combine_without_steps():
    log_z, count = FIVO._combine([], [], torch.zeros(3, 0, 1), 4, 3)
    assert torch.equal(log_z, torch.zeros(3)) and torch.equal(count, torch.zeros(3).long())


@pytest.mark.parametrize("scheme", RESAMPLING_SCHEMES)
def test_draw_ancestors_is_resample(scheme):
    lw = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    a = resample(lw, scheme, generator=torch.Generator().manual_seed(1))
    probs = torch.softmax(lw, 0)
    b = draw_ancestors(probs, scheme, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [math.inf, math.nan, -math.inf])
def test_resample_refuses_columns_without_finite_weights(bad):
    lw = torch.zeros(3, 2)
    if bad == -math.inf:
        lw[:, 1] = bad  # every weight of a column is zero
    else:
        lw[0, 1] = bad
    with pytest.raises(ValueError, match="finite log-weight"):
        resample(lw, "systematic")
