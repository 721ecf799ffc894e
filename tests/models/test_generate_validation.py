"""Every model's ``generate`` checks its arguments first (one validator,
:func:`pyro_seq.validation.validate_generate_args`), and the RTRBM checks its ``prefix``."""

import numpy as np
import pytest
import torch

from pyro_seq.models import DMM, KVAE, RTRBM, SRNN, STORN, VAERNN, VOSP, VRAE, VRNN, RNNBaseline
from pyro_seq.validation import validate_generate_args

D = 5
MODELS = {
    "dmm": lambda: DMM(D, z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4),
    "srnn": lambda: SRNN(D, d_dim=4, z_dim=2, hidden_dim=4),
    "vrnn": lambda: VRNN(D, d_dim=4, z_dim=2, hidden_dim=4, feature_dim=4),
    "vaernn": lambda: VAERNN(D, d_dim=4, z_dim=2, hidden_dim=4),
    "rnn_baseline": lambda: RNNBaseline(D, d_dim=4, hidden_dim=4),
    "storn": lambda: STORN(D, z_dim=2, rnn_dim=4, emission_dim=4),
    "vosp": lambda: VOSP(D, z_dim=2, rnn_dim=4, emission_dim=4),
    "vrae": lambda: VRAE(D, z_dim=2, encoder_dim=4, decoder_dim=4, emission_dim=4),
    "rtrbm": lambda: RTRBM(D, 3),
    "kvae": lambda: KVAE((1, D), encoder="mlp", hidden_dims=[4], lstm_dim=4, z_dim=2),
}
GIBBS = {"rtrbm": {"gibbs_steps": 1}}

# (num_sequences, num_steps, the argument named in the error, its repr in the message)
BAD = [
    (2, 0, "num_steps", "0"),
    (-1, 3, "num_sequences", "-1"),
    (2.5, 3, "num_sequences", "2.5"),
    (2, 1.5, "num_steps", "1.5"),
    (True, 3, "num_sequences", "True"),
    (2, torch.tensor(True), "num_steps", "tensor(True)"),
    (2, "3", "num_steps", "'3'"),
    (None, 3, "num_sequences", "None"),
    (2, float("nan"), "num_steps", "nan"),
]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bad_counts_are_refused_with_the_argument_named(name):
    m = MODELS[name]()
    for num_sequences, num_steps, arg, shown in BAD:
        with pytest.raises(ValueError) as info:
            m.generate(num_sequences, num_steps, **GIBBS.get(name, {}))
        message = str(info.value)
        assert message.startswith(f"generate: {arg} ") and f"got {shown};" in message, message


@pytest.mark.parametrize("name", sorted(MODELS))
def test_whole_numbers_give_that_many_sequences_and_steps(name):
    """Ints, whole floats and NumPy ints are counts: the samples have that shape."""
    m = MODELS[name]()
    for num_sequences, num_steps in ((2, 3), (1, 1), (np.int64(2), 3.0)):
        x, _ = m.generate(num_sequences, num_steps, **GIBBS.get(name, {}))
        assert x.shape == (int(num_sequences), int(num_steps), D)
        assert torch.isfinite(x).all()


def test_validator_returns_ints():
    out = validate_generate_args(np.int64(4), 2.0)
    assert out == (4, 2) and all(type(v) is int for v in out)


# ----------------------------------------------------------------- RTRBM prefix
def rtrbm():
    torch.manual_seed(0)
    return RTRBM(D, 3)


@pytest.mark.parametrize(
    "prefix,match",
    [
        (
            torch.full((2, 2, D), 0.5),
            r"prefix must be binary \(0/1\), found 0.5 at \(sequence 0, "
            r"step 0, unit 0\)",
        ),
        (
            torch.zeros(2, 2, D + 1),
            r"prefix must have shape \(num_sequences = 2 or 1, T0, "
            r"num_visible = 5\), got \(2, 2, 6\)",
        ),
        (torch.zeros(3, 2, D), r"prefix must have shape .* got \(3, 2, 5\)"),
        (torch.zeros(2, D), r"prefix must have shape .* got \(2, 5\)"),
        (torch.zeros(2, 5, D), r"prefix has 5 steps, more than num_steps = 4"),
        ([[0.0] * D], r"prefix must be a tensor"),
        (
            torch.zeros(2, 2, D, dtype=torch.complex64),
            r"prefix must have a bool, integer or "
            r"floating dtype, got torch.complex64",
        ),
        (torch.tensor([[[0.0, 1.0, float("nan"), 0.0, 1.0]]]), r"prefix must be binary .* nan"),
    ],
)
def test_bad_prefix_is_refused(prefix, match):
    with pytest.raises(ValueError, match=match):
        rtrbm().generate(2, 4, gibbs_steps=1, prefix=prefix)


def test_bool_int_and_shared_prefixes_are_kept():
    """A bool or integer prefix is the same prefix as its 0/1 float; a batch of one is
    continued by every sequence."""
    g = torch.Generator().manual_seed(1)
    prefix = torch.rand(2, 3, D, generator=g) < 0.5
    for p in (prefix, prefix.long(), prefix.double()):
        x, logits = rtrbm().generate(2, 5, gibbs_steps=1, prefix=p)
        assert x.shape == logits.shape == (2, 5, D) and x.dtype == rtrbm().W.dtype
        assert torch.equal(x[:, :3], prefix.to(x.dtype))
    x, _ = rtrbm().generate(4, 5, gibbs_steps=1, prefix=prefix[:1])
    assert torch.equal(x[:, :3], prefix[:1].to(x.dtype).expand(4, -1, -1))


def test_gibbs_steps_refuses_booleans():
    with pytest.raises(ValueError, match="gibbs_steps must be a positive int, got True"):
        rtrbm().generate(2, 3, gibbs_steps=True)
