"""One validator, every path: each bad input gets the same message from every entry point.

The entry points are those a user reaches with a batch ``(x, mask)``: the full-sequence model and
guide, Pyro's Trace_ELBO, IWAE, FIVO (step protocol), the IWAE and SMC likelihood estimators.
The trainer and the command line are tested in tests/train and tests/test_cli.py.
"""

import re

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyro_seq.infer import FIVO, IWAE, estimate_log_likelihood
from pyro_seq.models import DMM, SRNN
from pyro_seq.validation import all_finite, validate_sequences

D = 4


def srnn():
    return SRNN(D, d_dim=5, z_dim=2, hidden_dim=5)


def dmm_gaussian():
    return DMM(D, z_dim=2, transition_dim=5, emission_dim=5, rnn_dim=5, likelihood="gaussian")


def good():
    x = (torch.rand(3, 5, D, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] + [0] * 4]).bool()
    return x * mask.unsqueeze(-1), mask


def with_value(b, t, d, v):
    x, mask = good()
    x[b, t, d] = v
    return x, mask


# (name, make (x, mask), model factory, expected message)
BAD = [
    (
        "nan",
        lambda: with_value(0, 1, 2, float("nan")),
        srnn,
        r"x contains 1 NaN/inf values; first: NaN at \(batch 0, step 1, feature 2\), a real step",
    ),
    (
        "nan_padded",
        lambda: with_value(2, 3, 0, float("nan")),
        srnn,
        r"NaN at \(batch 2, step 3, feature 0\), a padded step",
    ),
    (
        "inf",
        lambda: with_value(1, 0, 0, float("inf")),
        dmm_gaussian,
        r"infinite value at \(batch 1, step 0, feature 0\), a real step",
    ),
    (
        "non_binary",
        lambda: with_value(1, 2, 3, 0.5),
        srnn,
        r"x must be binary \(0/1\) for a Bernoulli model, found 0.5 at \(batch 1, step 2, feature 3\)",
    ),
    (
        "feature_size",
        lambda: (torch.zeros(3, 5, D + 1), None),
        srnn,
        rf"x has {D + 1} features per step, the model expects {D}",
    ),
    (
        "no_steps",
        lambda: (torch.zeros(3, 0, D), None),
        srnn,
        r"x has an empty dimension \(T = 0: no time steps\)",
    ),
    (
        "no_sequences",
        lambda: (torch.zeros(0, 5, D), None),
        srnn,
        r"x has an empty dimension \(batch = 0\)",
    ),
    (
        "empty_row",
        lambda: (good()[0], torch.tensor([[1] * 5, [0] * 5, [1] * 5]).bool()),
        srnn,
        r"empty sequence: mask row 1 has no True step",
    ),
    (
        "non_prefix",
        lambda: (good()[0], torch.tensor([[1] * 5, [1, 0, 1, 0, 0], [1] * 5]).bool()),
        srnn,
        r"mask row 1 is not a prefix",
    ),
    (
        "half_mask",
        lambda: (good()[0], torch.tensor([[1.0] * 5, [1, 1, 0.5, 0, 0], [1.0] * 5])),
        srnn,
        r"mask must be bool or contain only 0 and 1 \(dtype torch.float32\), found 0.5 at "
        r"\(batch 1, step 2\)",
    ),
    (
        "mask_shape",
        lambda: (good()[0], torch.ones(3, 4).bool()),
        srnn,
        r"mask shape \(3, 4\) does not match x's \(batch, T\) = \(3, 5\)",
    ),
]


def _paths(m):
    """Every entry point, as a function of (x, mask)."""
    return {
        "model": lambda x, mask: m.model(x, mask),
        "guide": lambda x, mask: m.guide(x, mask),
        "trace_elbo": lambda x, mask: Trace_ELBO().loss(m.model, m.guide, x, mask),
        "iwae": lambda x, mask: IWAE(num_particles=2, max_plate_nesting=1).loss(
            m.model, m.guide, x, mask
        ),
        "fivo": lambda x, mask: FIVO(num_particles=2).loss(m.model, m.guide, x, mask),
        "fivo_grad": lambda x, mask: FIVO(num_particles=2).differentiable_loss(
            m.model, m.guide, x, mask
        ),
        "step_init": lambda x, mask: m.model.init(pyro_seq_state(), x, mask),
        "estimate_iwae": lambda x, mask: estimate_log_likelihood(
            m.model, m.guide, (x, mask), method="iwae", num_particles=2
        ),
        "estimate_smc": lambda x, mask: estimate_log_likelihood(
            m.model, m.guide, (x, mask), method="smc", num_particles=2
        ),
    }


def pyro_seq_state():
    from pyro_seq.ops import SequenceState

    return SequenceState()


PATHS = list(_paths(None))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name, make, factory, message", BAD, ids=[b[0] for b in BAD])
def test_every_path_gives_the_validators_message(path, name, make, factory, message):
    x, mask = make()
    with pytest.raises(ValueError) as direct:  # the validator itself, with the model's settings
        m = factory()
        validate_sequences(x, mask, m.obs_dim, m.binary_observations)
    assert re.search(message, str(direct.value)), str(direct.value)
    pyro.clear_param_store()
    with pytest.raises(ValueError) as info:
        _paths(factory())[path](x, mask)
    # Pyro's trace handler appends the trace shapes on later lines; the message is the first
    assert str(info.value).split("\n")[0] == str(direct.value)


@pytest.mark.parametrize("path", PATHS)
def test_good_input_and_a_zero_one_float_mask_give_the_bool_masks_result(path):
    # a float 1/0 mask is accepted and read exactly as the bool mask (the same random numbers)
    x, mask = good()
    results = []
    for m_ in (mask, mask.float()):
        pyro.clear_param_store()
        pyro.set_rng_seed(3)
        torch.manual_seed(3)
        m = srnn()
        out = _paths(m)[path](x, m_)
        if hasattr(out, "per_sequence"):
            out = out.per_sequence
        results.append(out)
    if torch.is_tensor(results[0]):
        assert torch.equal(results[0], results[1])
    elif isinstance(results[0], float):
        assert results[0] == results[1]


def test_sequence_list_names_the_split_and_the_sequence():
    from pyro_seq.validation import validate_sequence_list

    seqs = [torch.ones(3, D), torch.zeros(2, D), torch.full((4, D), 0.25)]
    validate_sequence_list(seqs[:2], obs_dim=D, binary=True, name="train")
    with pytest.raises(
        ValueError,
        match=r"^train\[2\]: x must be binary \(0/1\) for a Bernoulli "
        r"model, found 0.25 at \(batch 0, step 0, feature 0\)",
    ):
        validate_sequence_list(seqs, obs_dim=D, binary=True, name="train")
    with pytest.raises(
        ValueError, match=rf"^valid\[0\]: x has {D} features per step, the model expects 7"
    ):
        validate_sequence_list(seqs, obs_dim=7, name="valid")
    with pytest.raises(ValueError, match=r"^test: expected a non-empty list"):
        validate_sequence_list([], name="test")
    with pytest.raises(ValueError, match=r"^train\[1\]: expected a \(T, D\) tensor, got \(3,\)"):
        validate_sequence_list([torch.ones(2, D), torch.ones(3)], name="train")


def _bad_splits():
    good_seq = torch.ones(4, D)
    bad_seq = torch.full((3, D), 0.5)  # non-binary for the Bernoulli SRNN
    return {"train": [good_seq, bad_seq], "valid": [good_seq], "test": [good_seq]}


EXPECTED_TRAIN = (
    r"train\[1\]: x must be binary \(0/1\) for a Bernoulli model, found 0.5 at "
    r"\(batch 0, step 0, feature 0\)"
)


def test_fit_refuses_bad_data_before_writing_anything(tmp_path):
    from pyro_seq.train import TrainConfig, fit

    splits = _bad_splits()
    with pytest.raises(ValueError, match="^" + EXPECTED_TRAIN):
        fit(
            srnn(),
            splits["train"],
            splits["valid"],
            TrainConfig(epochs=1, progress=False),
            tmp_path / "run",
        )
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match=r"^valid\[0\]: x contains 1 NaN/inf values"):
        fit(
            srnn(),
            [torch.ones(2, D)],
            [
                torch.ones(2, D)
                .index_fill(0, torch.tensor([1]), 0)
                .index_put((torch.tensor(0), torch.tensor(0)), torch.tensor(float("nan")))
            ],
            TrainConfig(epochs=1, progress=False),
            tmp_path / "run",
        )


def test_evaluate_bound_refuses_bad_data():
    from pyro_seq.train import evaluate_bound

    with pytest.raises(
        ValueError,
        match=r"^sequences\[0\]: x has 5 features per step, the model "
        r"expects 4",
    ):
        evaluate_bound(srnn(), [torch.ones(3, 5)])


def test_cli_prints_the_validators_message_in_one_line(tmp_path, monkeypatch):
    import pyro_seq.cli as cli

    monkeypatch.setattr(cli, "_load_data", lambda spec, splits=None: _bad_splits())
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        cli.main(
            [
                "train",
                "--data",
                "fake",
                "--out",
                str(out),
                "--epochs",
                "1",
                "--quiet",
                "--model-option",
                "d_dim=5",
                "--model-option",
                "hidden_dim=5",
                "--z-dim",
                "2",
            ]
        )
    assert re.fullmatch(
        r"pyro-seq: error: data fake: " + EXPECTED_TRAIN + r"; 12 non-binary "
        r'values in all; for real-valued data build the model with likelihood="gaussian" '
        r"\(pyro-seq train --model-option likelihood=gaussian\)",
        info.value.code,
    ), info.value.code
    assert not out.exists()


@pytest.mark.parametrize(
    "value",
    [None, {"a": 1}, object(), "mask", [[1, 0], [1]]],
    ids=["none", "dict", "object", "str", "ragged"],
)
def test_as_bool_mask_names_a_value_that_is_not_array_like(value):
    # regression (found by tests/property): torch.as_tensor's RuntimeError "Could not infer
    # dtype of NoneType" escaped, naming neither the argument nor the problem
    from pyro_seq.validation import as_bool_mask

    with pytest.raises(
        TypeError,
        match=r"^step_mask must be a bool tensor or an array-like of "
        r"0 and 1, got " + type(value).__name__,
    ):
        as_bool_mask(value, "step_mask")
    assert torch.equal(as_bool_mask([1, 0.0], "step_mask"), torch.tensor([True, False]))


@pytest.mark.parametrize("value, expected", [(1, 1), (7, 7), (3.0, 3), (torch.tensor(4), 4)])
def test_positive_int_accepts_whole_numbers(value, expected):
    from pyro_seq.validation import positive_int

    assert positive_int("k", value) == expected
    assert type(positive_int("k", value)) is int


@pytest.mark.parametrize("value", [0, -3, 2.5, True, False, "3", None, float("nan"), float("inf")])
def test_positive_int_refuses_the_rest_by_name(value):
    from pyro_seq.validation import positive_int

    with pytest.raises(ValueError, match=r"^k must be a positive integer, got "):
        positive_int("k", value)
    assert positive_int("k", None, optional=True) is None


def test_fractional_obs_dim_is_refused_not_truncated():
    # regression: SequenceModel(2.5) used to become a 2-dimensional model silently
    from pyro_seq.models import SRNN

    with pytest.raises(ValueError, match="obs_dim must be a positive integer, got 2.5"):
        SRNN(2.5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_all_finite_agrees_with_the_elementwise_test(dtype):
    big = torch.finfo(dtype).max
    cases = [
        torch.randn(7, 5, dtype=dtype),
        torch.full((4,), big, dtype=dtype),  # finite entries whose sum overflows
        torch.tensor([1.0, float("nan")], dtype=dtype),
        torch.tensor([float("inf"), 0.0], dtype=dtype),
        torch.tensor([float("-inf"), float("inf")], dtype=dtype),  # sum NaN
        torch.tensor([float("nan"), float("nan")], dtype=dtype).mul_(torch.zeros(2, dtype=dtype)),
        torch.zeros(0, 3, dtype=dtype),
    ]
    for x in cases:
        assert all_finite(x) == bool(torch.isfinite(x).all()), x
    assert all_finite(torch.arange(5))  # integers are always finite
    x = torch.randn(3, requires_grad=True)
    assert all_finite(x) and x.grad_fn is None and x.grad is None
