"""LinearGaussianSSM masks: per-step ``step_mask`` and per-element ``observation_mask`` cannot
be confused (the hardening issue's B == T == D case), against the dense float64 reference."""

import pytest
import torch

from pyro_seq.distributions import LinearGaussianSSM
from tests.dense_gaussian import log_marginal, observed_index
from tests.ops.test_kalman import dense_of, observations, random_model

F64 = torch.float64


def assert_close(a, b):  # exact identities in float64: <= 1e-9 relative
    torch.testing.assert_close(a, b.to(a.dtype), atol=1e-9, rtol=1e-9)


def make(p, **kw):
    return LinearGaussianSSM(
        p["initial_loc"],
        p["initial_cov"],
        p["transition_matrix"],
        p["transition_cov"],
        p["observation_matrix"],
        p["observation_cov"],
        p.get("control_matrix"),
        p.get("controls"),
        **kw,
    )


def dense_lp(p, x, elem_mask):
    """log p(x[observed]) of each sequence of x (B, T, D) under the per-element mask (B, T, D)."""
    T = x.shape[-2]
    dense = dense_of(p, T)
    return torch.stack(
        [log_marginal(dense, x[i], observed_index(dense, elem_mask[i])) for i in range(x.shape[0])]
    )


def square_case(seed=60):
    """B == T == D == 3 with time-constant parameters and no num_steps: a per-step mask (B, T)
    and a per-element mask (T, D) have the same shape."""
    B = T = D = 3
    p = random_model(S=2, D=D, T=1, seed=seed)
    x = observations(T, D, batch=(B,), seed=seed + 1)
    mask = torch.tensor([[True, False, True], [False, True, True], [True, True, False]])
    return p, x, mask


def test_square_mask_is_refused_in_observation_mask():
    p, x, mask = square_case()
    with pytest.raises(ValueError, match=r"ambiguous: with T == D == 3 .* step_mask=mask"):
        make(p, observation_mask=mask)
    with pytest.raises(ValueError, match="ambiguous"):  # also when T is known
        make(p, num_steps=3, observation_mask=mask)
    with pytest.raises(ValueError, match="ambiguous"):  # and at method level
        make(p).filter(x, observation_mask=mask)


def test_square_mask_per_step_and_per_element_read_as_declared():
    p, x, mask = square_case()
    B, T, D = x.shape
    per_step = make(p, step_mask=mask)
    assert per_step.batch_shape == (B,) and per_step.event_shape == (T, D)
    step_ref = dense_lp(p, x, mask[:, :, None].expand(B, T, D))
    assert_close(per_step.log_prob(x), step_ref)
    # the same tensor as a per-element (T, D) mask shared by the batch: confirmed by step_mask=True
    per_elem = make(p, observation_mask=mask, step_mask=True)
    assert per_elem.batch_shape == () and per_elem.event_shape == (T, D)
    elem_ref = dense_lp(p, x, mask.expand(B, T, D))
    assert_close(per_elem.log_prob(x), elem_ref)
    # the two readings differ here, so each assertion above can tell them apart
    assert (step_ref - elem_ref).abs().min() > 0.1
    # method-level masks follow the same rule
    f = make(p).filter(x, step_mask=mask)
    assert_close(f.log_likelihoods.sum(-1), step_ref)


def test_unambiguous_legacy_per_step_masks_still_work():
    T, S, D, B = 5, 2, 3, 2
    p = random_model(S, D, T, time_varying=True, seed=62)
    x = observations(T, D, batch=(B,), seed=63)
    mask = torch.tensor([[True, False, True, True, False], [False, True, True, False, True]])
    ref = dense_lp(p, x, mask[:, :, None].expand(B, T, D))
    assert_close(make(p, observation_mask=mask).log_prob(x), ref)  # (B, T), T != D
    assert_close(make(p, step_mask=mask).log_prob(x), ref)
    # 1-D per-step masks can only be per step
    q = random_model(S, D, 1, seed=64)
    m1 = torch.tensor([True, True, False])  # T == D == 3
    x1 = observations(3, D, seed=65)
    ref1 = dense_lp(q, x1[None], m1[None, :, None].expand(1, 3, D))[0]
    assert_close(make(q, observation_mask=m1).log_prob(x1), ref1)
    assert_close(make(q).smooth(x1, observation_mask=m1).filtered.log_likelihoods.sum(), ref1)


def test_step_and_element_masks_combine_with_and():
    T, S, D = 4, 2, 2
    p = random_model(S, D, T, time_varying=True, seed=66)
    x = observations(T, D, batch=(2,), seed=67)
    gen = torch.Generator().manual_seed(68)
    elem = torch.rand(2, T, D, generator=gen) < 0.7
    step = torch.tensor([True, False, True, True])
    d = make(p, observation_mask=elem, step_mask=step)
    assert_close(d.log_prob(x), dense_lp(p, x, elem & step[:, None]))


def test_mask_shape_errors_name_the_right_argument():
    T, S, D = 4, 2, 3
    p = random_model(S, D, T, time_varying=True, seed=69)
    with pytest.raises(
        ValueError, match=r"step_mask must have shape \(\.\.\., T\) = \(\.\.\., 4\)"
    ):
        make(p, step_mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(
        ValueError,
        match=r"observation_mask must have shape \(\.\.\., T, D\) = "
        r"\(\.\.\., 4, 3\) \(per element\); got \(4,\)",
    ):
        make(p, observation_mask=torch.ones(4, dtype=torch.bool), step_mask=True)
    with pytest.raises(ValueError, match=r"observation_mask must have shape .* got \(4, 2\)"):
        make(p, observation_mask=torch.ones(4, 2, dtype=torch.bool))


def test_mask_values_other_than_zero_and_one_are_refused():
    # a .bool() cast read 0.5 as observed; 0/1 masks of any dtype equal the bool mask
    S, D, T = 2, 3, 4
    eye = torch.eye
    args = (
        torch.zeros(S, dtype=torch.float64),
        eye(S, dtype=torch.float64),
        0.9 * eye(S, dtype=torch.float64),
        0.1 * eye(S, dtype=torch.float64),
        torch.ones(D, S, dtype=torch.float64),
        eye(D, dtype=torch.float64),
    )
    x = torch.randn(T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    steps = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    a = LinearGaussianSSM(*args, step_mask=steps).log_prob(x)
    b = LinearGaussianSSM(*args, step_mask=steps.bool()).log_prob(x)
    assert torch.equal(a, b)
    with pytest.raises(
        ValueError, match=r"step_mask must be bool or contain only 0 and 1 .*found 0.5"
    ):
        LinearGaussianSSM(*args, step_mask=torch.tensor([1.0, 0.5, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"observation_mask must be bool or contain only 0 and 1"):
        LinearGaussianSSM(*args, observation_mask=torch.full((T, D), 0.5))
