"""Mask values and the per-step / per-element shape rule of the Kalman ops."""

import pytest
import torch

from pyro_seq.ops import kalman_filter


def _model(D=3, S=2, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return dict(
        initial_loc=torch.zeros(S, dtype=dtype),
        initial_cov=torch.eye(S, dtype=dtype),
        transition_matrix=0.9 * torch.eye(S, dtype=dtype),
        transition_cov=0.1 * torch.eye(S, dtype=dtype),
        observation_matrix=torch.randn(D, S, generator=g, dtype=dtype),
        observation_cov=0.5 * torch.eye(D, dtype=dtype),
    )


def test_half_mask_is_refused_and_zero_one_float_mask_equals_bool():
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]).bool()
    with pytest.raises(
        ValueError,
        match=r"mask must be bool or contain only 0 and 1 .* found 0.5 at "
        r"index \(0, 2\)",
    ):
        kalman_filter(x, mask=torch.where(mask, 1.0, 0.5), **_model())
    a = kalman_filter(x, mask=mask, **_model()).log_likelihoods
    b = kalman_filter(x, mask=mask.double(), **_model()).log_likelihoods
    assert torch.equal(a, b)


def test_square_per_step_mask_of_a_batch_of_T_is_refused():
    # B == T == D: a per-step (B, T) mask has the shape of a per-element (T, D) mask
    T = D = 3
    x = torch.randn(T, T, D, dtype=torch.float64)
    steps = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]).bool()
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\) is ambiguous: with T == D == 3"):
        kalman_filter(x, mask=steps, **_model(D))
    per_step = kalman_filter(x, mask=steps[..., None], **_model(D)).log_likelihoods
    for b in range(T):  # each row scored on its own first steps only
        L = int(steps[b].sum())
        alone = kalman_filter(x[b, :L], **_model(D)).log_likelihoods
        assert torch.allclose(per_step[b, :L], alone, rtol=1e-12, atol=0)
        assert (per_step[b, L:] == 0).all()
    # a (T, D) mask of unbatched observations is per element, and so is a full (B, T, D) one
    kalman_filter(x[0], mask=steps, **_model(D))
    kalman_filter(x, mask=steps.expand(T, T, D), **_model(D))
