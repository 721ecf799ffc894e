"""The smoothed covariances of the steady path without a loop over time
(pyro_seq.ops.kalman_stein): equal to the backward loop of
pyro_seq.ops.kalman_sequential.backward_covariance_pass (the reference) to 1e-12, and to the
dense Gaussian through kalman_smoother; None where it declines."""

import pytest
import torch

import pyro_seq.ops.kalman_stein as stein
from pyro_seq.ops import kalman_smoother
from pyro_seq.ops.kalman_sequential import backward_covariance_pass
from tests.dense_gaussian import block, condition_z, observed_index
from tests.ops.test_kalman import dense_of, observations, random_model

F64 = torch.float64
EPS8 = 8 * torch.finfo(F64).eps


def _close(a, b, tol=1e-12):
    torch.testing.assert_close(a, b, atol=tol * b.abs().max().item(), rtol=tol)


def _coefficients(S, u, seed, contraction=0.6):
    """Random stable gains J_t (constant from u - 1 on), PSD Pc_t and a final covariance."""
    gen = torch.Generator().manual_seed(seed)
    J = contraction * torch.linalg.qr(torch.randn(u, S, S, generator=gen, dtype=F64))[0]
    W = torch.randn(u, S, S, generator=gen, dtype=F64)
    Pc = W @ W.mT / S + 0.1 * torch.eye(S, dtype=F64)
    V = torch.randn(S, S, generator=gen, dtype=F64)
    return J, Pc, V @ V.mT + torch.eye(S, dtype=F64)


def _reference(J, Pc, last, T):
    """The loop, every step computed (no settling shortcut)."""
    u, S = J.shape[0], J.shape[-1]
    Jf = torch.cat([J, J[-1:].expand(T - 1 - u, S, S)], 0)
    covs = torch.cat([torch.zeros(T - 1, S, S, dtype=F64), last.unsqueeze(0)], 0)
    # backward_covariance_pass forms Pc_t = Sigma_t - J_t ASig_t: give Sigma_t = 0, ASig = -Pc J^-T
    ASig = -torch.linalg.solve(J, Pc)
    ASig = torch.cat([ASig, ASig[-1:].expand(T - 1 - u, S, S)], 0)
    return backward_covariance_pass(Jf, covs, ASig)


@pytest.mark.parametrize(
    "S, u, T", [(3, 1, 50), (3, 10, 300), (4, 65, 1000), (2, 40, 45), (8, 20, 200)]
)
def test_equals_backward_loop(S, u, T):
    """Settled constant stretch (T long), a stretch too short to settle (T = 45, u = 40:
    every distance computed), u = 1 (no time-varying stretch) and the largest state in
    Kronecker form."""
    J, Pc, last = _coefficients(S, u, seed=S + u)
    got = stein.steady_smoothed_covariances(J, Pc, last, T, EPS8)
    assert got is not None and got.shape == (T, S, S)
    assert torch.equal(got, got.mT)
    _close(got, _reference(J, Pc, last, T))


def test_declines_large_state_and_unsettled_stretch():
    J, Pc, last = _coefficients(9, 5, seed=0)
    assert stein.steady_smoothed_covariances(J, Pc, last, 300, EPS8) is None  # S > 8
    J, Pc, last = _coefficients(3, 5, seed=1, contraction=0.999)
    # contraction 0.999: not settled within the max(64, 4 u) distances computed
    assert stein.steady_smoothed_covariances(J, Pc, last, 3000, EPS8) is None


def test_powers_by_doubling():
    J = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(0)) / 2
    P = stein._powers(J, 11)
    assert P.shape == (11, 3, 3)
    for j in range(11):
        _close(P[j], torch.linalg.matrix_power(J, j))


def test_smoother_covariances_match_dense():
    """Through kalman_smoother's steady path: smoothed covariances at the ends and in the
    middle of a long sequence equal the dense Gaussian's conditionals."""
    T, S, D = 150, 3, 2
    p = random_model(S, D, T, seed=5)
    x = observations(T, D, seed=6)
    with torch.no_grad():
        s = kalman_smoother(x, **p)
    dense = dense_of(p, T)
    _, cov = condition_z(dense, x, observed_index(dense))
    for t in (0, 1, 30, 75, T - 2, T - 1):
        _close(s.covs[t], block(cov, S, t, t), 1e-11)
