"""One SVI loss evaluation of tiny SRNN/VRNN models on random ragged binary batches.

Under ``Trace_ELBO`` and :class:`pyro_seq.infer.IWAE` (K = 2): a finite loss (and finite
gradients) for a valid batch; for an invalid one (a non-binary value, NaN, a non-prefix or
empty mask row, a mask value other than 0/1, the wrong feature size) exactly the
ValueError of :func:`pyro_seq.validation.validate_sequences`, whichever objective. These
properties are slow (a model per example): few examples in the default profile.
"""

import pyro
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pyro.infer import Trace_ELBO

from pyro_seq.infer import IWAE
from pyro_seq.models import SRNN, VRNN
from pyro_seq.validation import validate_sequences

from .support import assert_finite, examples, expect_documented

pytestmark = pytest.mark.fuzz

OBJECTIVES = {
    "trace_elbo": lambda: Trace_ELBO(),
    "iwae": lambda: IWAE(num_particles=2, max_plate_nesting=1),
}


@st.composite
def tiny_models(draw):
    D = draw(st.integers(1, 4))
    d, z, h = (draw(st.integers(2, 4)) for _ in range(3))
    if draw(st.booleans()):
        return D, lambda: SRNN(D, d_dim=d, z_dim=z, hidden_dim=h,
                               inference=draw(st.sampled_from(["smoothing", "filtering"])))
    return D, lambda: VRNN(D, d_dim=d, z_dim=z, hidden_dim=h, feature_dim=draw(st.integers(2, 4)),
                           inference=draw(st.sampled_from(["filtering", "smoothing"])))


@st.composite
def ragged_binary_batches(draw, D):
    """A prefix-masked binary batch with zero padding, then possibly one defect."""
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    mask = torch.arange(T) < torch.tensor(lengths).unsqueeze(1)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.bernoulli(torch.full((B, T, D), draw(st.sampled_from([0.0, 0.3, 1.0]))),
                        generator=g) * mask.unsqueeze(-1)
    defect = draw(st.sampled_from([None] * 6 + ["non_binary", "nan", "nan_padded", "empty_row",
                                                "non_prefix", "half_mask", "features"]))
    b, t = draw(st.integers(0, B - 1)), draw(st.integers(0, T - 1))
    if defect == "non_binary":
        x[b, t, 0] = draw(st.sampled_from([0.5, -1.0, 2.0]))
    elif defect == "nan":
        x[b, t, 0] = float("nan")
    elif defect == "nan_padded" and not bool(mask.all()):
        b, t = (int(i) for i in (~mask).nonzero()[0])
        x[b, t, 0] = float("nan")
    elif defect == "empty_row":
        mask[b] = False
        x[b] = 0
    elif defect == "non_prefix" and T > 1:
        mask[b, 0] = False
    elif defect == "features":
        x = torch.cat([x, x[..., :1]], -1)
    mask = mask.float() if draw(st.booleans()) else mask
    if defect == "half_mask":
        mask = mask.float()
        mask[b, t] = 0.5
    return x, mask


@examples(0.5)
@given(st.data(), st.sampled_from(sorted(OBJECTIVES)))
def test_one_loss_evaluation_is_finite_or_the_validators_error(data, objective):
    D, make = data.draw(tiny_models())
    x, mask = data.draw(ragged_binary_batches(D))
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = make()
    try:
        validate_sequences(x, mask, model.obs_dim, model.binary_observations)
        expected = None
    except ValueError as e:
        expected = str(e)
    loss_fn = OBJECTIVES[objective]()
    try:
        loss = loss_fn.differentiable_loss(model.model, model.guide, x, mask)
    except Exception as e:  # noqa: BLE001 - the property is about which exceptions escape
        assert expected is not None, f"valid batch refused: {type(e).__name__}: {e}"
        expect_documented(e, types=(ValueError,))
        assert str(e).split("\n")[0] == expected, (str(e), expected)
        return
    assert expected is None, f"invalid batch accepted ({expected})"
    assert_finite("loss", loss)
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert_finite(f"gradient of {name}", p.grad)
