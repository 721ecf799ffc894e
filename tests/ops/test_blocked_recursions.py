"""The linear recursions of pyro_seq.ops.blocked_recursions against their definition, a
plain loop over time, in float64 (padding, one block, looped and recursive joins, varying
stretches at the start and at the end)."""

import pytest
import torch

import pyro_seq.ops.blocked_recursions as rec

F64 = torch.float64


def _close(a, b, tol=1e-12):
    torch.testing.assert_close(a, b, atol=tol * b.abs().max().item(), rtol=tol)


def _loop_varying(Fs, g, y0):
    """y_t = F_t y_{t-1} + g_t in row form, ``g (n, T, S)``, ``y0 (n, S)``, F_t = ``Fs[t]``:
    the definition."""
    y, out = y0, []
    for t in range(g.shape[1]):
        y = y @ Fs[t].mT + g[:, t]
        out.append(y)
    return torch.stack(out, 1)


def _loop(F, g, y0):
    return _loop_varying([F] * g.shape[1], g, y0)


def _random(shape, seed, scale=0.7):
    gen = torch.Generator().manual_seed(seed)
    S = shape[-1]
    Q = torch.linalg.qr(torch.randn(shape[:-2] + (S, S), generator=gen, dtype=F64))[0]
    return scale * Q, gen


@pytest.mark.parametrize("T", [1, 7, 8, 9, 64, 200, 1500])
@pytest.mark.parametrize("k", [2, 8])
def test_blocked_recursion_equals_loop(T, k):
    """Padding (T not a multiple of k), one block, a looped join (nb - 1 <= 16) and a
    recursive join (nb - 1 > 16, up to three levels for k = 2, T = 1500)."""
    gen = torch.Generator().manual_seed(T + k)
    S = 3
    F = 0.7 * torch.linalg.qr(torch.randn(S, S, generator=gen, dtype=F64))[0]
    g = torch.randn(4, T, S, generator=gen, dtype=F64)
    y0 = torch.randn(4, S, generator=gen, dtype=F64)
    got = rec.blocked_recursion(F, rec.to_blocks(g, k), y0.T.contiguous())
    _close(rec.from_blocks(got, T), _loop(F, g, y0))
    zero = rec.blocked_recursion(F, rec.to_blocks(g, k))
    _close(rec.from_blocks(zero, T), _loop(F, g, torch.zeros_like(y0)))


def test_blocks_round_trip_and_layout():
    x = torch.arange(2 * 11 * 3, dtype=F64).reshape(2, 11, 3)
    b = rec.to_blocks(x, 4)  # nb = 3 blocks, the last with one padding step
    assert b.shape == (3, 4, 3, 2)
    assert torch.equal(b[:, 2, 1, 0], x[0, 6])  # step t = 1 * 4 + 2 of sequence 0
    assert torch.equal(b[:, 3, 2], torch.zeros(3, 2, dtype=F64))  # t = 11: padding
    assert torch.equal(rec.from_blocks(b, 11), x)


@pytest.mark.parametrize("nb", [1, 2, 5])
def test_varying_recursion_equals_loop(nb):
    k, S, n = 4, 3, 2
    F, gen = _random((nb, k, S, S), nb)
    g = torch.randn(nb, k, S, n, generator=gen, dtype=F64)
    got = rec.varying_recursion(F, g.clone())
    ref = _loop_varying(
        F.reshape(nb * k, S, S),
        g.reshape(nb * k, S, n).permute(2, 0, 1),
        torch.zeros(n, S, dtype=F64),
    )
    _close(got.reshape(nb * k, S, n).permute(2, 0, 1), ref)


@pytest.mark.parametrize(
    "T, m, at_end, start",
    [
        (1000, 65, False, False),
        (1000, 65, True, True),
        (37, 37, False, True),
        (37, 5, True, False),
        (20, 1, True, True),
        (9, 3, False, False),
        (300, 299, True, True),
        (130, 8, False, True),
    ],
)
def test_piecewise_recursion_equals_loop(T, m, at_end, start):
    """Varying stretch at the start (the filter's head before the steady state) or at the
    end (the smoother's, reversed in time), with and without a start state; stretches that
    end inside a block, fill whole blocks, or cover everything."""
    n, S = 3, 4
    V, gen = _random((m, S, S), T + m, 0.5)
    g = torch.randn(n, T, S, generator=gen, dtype=F64)
    y0 = torch.randn(n, S, generator=gen, dtype=F64) if start else None
    idx = [min(t, m - 1) if not at_end else max(t - (T - m), 0) for t in range(T)]
    ref = _loop_varying(V[idx], g, y0 if start else torch.zeros(n, S, dtype=F64))
    _close(rec.piecewise_recursion(V, g, y0, at_end), ref)
