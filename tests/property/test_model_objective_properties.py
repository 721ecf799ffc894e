"""Every latent sequence model x every objective x every emission, and ``estimate_log_likelihood``.

* One loss evaluation of a tiny model (DMM, residual DMM, SRNN and VRNN with filtering and
  smoothing guides, VAE-RNN, RNN baseline,
  STORN, VOSP, VRAE; Bernoulli, Gaussian or Gaussian-mixture emission) under Trace_ELBO,
  TraceMeanField_ELBO, FreeBits_ELBO, IWAE (score-function and DReG gradients) and FIVO, on a
  random ragged batch (float32 or float64, the model in the same dtype) that may carry one
  defect: a finite loss and finite gradients for a valid
  batch; for an invalid one exactly the ValueError of
  :func:`pyro_seq.validation.validate_sequences` (the model's own validator), whichever
  objective.
* ``estimate_log_likelihood`` on random data forms (list of sequences, padded tensor, (x, mask)
  batches), batch sizes, particle counts and methods: for the RNN baseline (no latent
  variables) every estimator is exact, so it equals the model's log-likelihood computed
  independently by ``Trace_ELBO`` per sequence; for a latent model the result is finite with
  the documented bookkeeping (``total = sum per_sequence``, ``num_steps = sum lengths``).
  Invalid arguments are a ValueError naming the argument.
"""

import math

import pyro
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO

from pyro_seq.infer import FIVO, IWAE, FreeBits_ELBO, estimate_log_likelihood
from pyro_seq.models import DMM, SRNN, STORN, VAERNN, VOSP, VRAE, VRNN, RNNBaseline
from pyro_seq.validation import validate_sequences

from .support import assert_finite, examples, expect_documented, ragged_batches

pytestmark = pytest.mark.fuzz

OBJECTIVES = {
    "trace_elbo": lambda: Trace_ELBO(),
    "mean_field": lambda: TraceMeanField_ELBO(),
    "free_bits": lambda: FreeBits_ELBO(0.1),
    "iwae": lambda: IWAE(num_particles=2, max_plate_nesting=1),
    "iwae_dreg": lambda: IWAE(num_particles=2, max_plate_nesting=1, gradient_estimator="dreg"),
    "fivo": lambda: FIVO(num_particles=2, resample="always"),
}

MODELS = {
    "dmm": lambda D, **kw: DMM(D, z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4, **kw),
    "dmm_residual": lambda D, **kw: DMM(
        D, z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4, residual=True, **kw
    ),
    "srnn": lambda D, **kw: SRNN(D, d_dim=3, z_dim=2, hidden_dim=4, **kw),
    "srnn_filtering": lambda D, **kw: SRNN(
        D, d_dim=3, z_dim=2, hidden_dim=4, inference="filtering", **kw
    ),
    "vrnn": lambda D, **kw: VRNN(D, d_dim=3, z_dim=2, hidden_dim=4, feature_dim=3, **kw),
    "vrnn_smoothing": lambda D, **kw: VRNN(
        D, d_dim=3, z_dim=2, hidden_dim=4, feature_dim=3, inference="smoothing", **kw
    ),
    "vaernn": lambda D, **kw: VAERNN(D, d_dim=3, z_dim=2, hidden_dim=4, skip=True, **kw),
    "rnn": lambda D, **kw: RNNBaseline(D, d_dim=3, hidden_dim=4, **kw),
    "storn": lambda D, **kw: STORN(D, z_dim=2, rnn_dim=3, emission_dim=4, prior="wiener", **kw),
    "vosp": lambda D, **kw: VOSP(D, z_dim=2, rnn_dim=3, emission_dim=4, prior="white", **kw),
    "vrae": lambda D, **kw: VRAE(D, z_dim=2, encoder_dim=3, decoder_dim=3, emission_dim=4, **kw),
}
EMISSIONS = {
    "bernoulli": {},
    "gaussian": {"likelihood": "gaussian"},
    "gmm": {"likelihood": "gmm", "num_components": 2},
}


@examples(0.6)
@given(
    st.data(),
    st.sampled_from(sorted(MODELS)),
    st.sampled_from(sorted(OBJECTIVES)),
    st.sampled_from(sorted(EMISSIONS)),
)
def test_every_model_and_objective_gives_a_finite_loss_or_the_validators_error(
    data, model_name, objective, emission
):
    D = data.draw(st.integers(1, 3))
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = MODELS[model_name](D, **EMISSIONS[emission])
    x, mask = data.draw(ragged_batches(D, binary=emission == "bernoulli"))
    if data.draw(st.booleans()):  # float64 models train on float64 batches
        model, x = model.double(), x.double()
    try:
        validate_sequences(x, mask, model.obs_dim, model.binary_observations)
        expected = None
    except ValueError as e:
        expected = str(e).split("\n")[0]
    try:
        loss = OBJECTIVES[objective]().differentiable_loss(model.model, model.guide, x, mask)
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


def _data_form(draw, x, mask):
    """The same sequences as a list of (T_i, D) tensors, an (x, mask) batch, or a list of
    (x, mask) batches split at a random point."""
    form = draw(st.sampled_from(["list", "batch", "batches"]))
    if form == "list":
        return [x[i, : int(mask[i].sum())] for i in range(x.shape[0])]
    if form == "batch":
        return (x, mask)
    cut = draw(st.integers(1, x.shape[0]))
    parts = [(x[:cut], mask[:cut])]
    if cut < x.shape[0]:
        parts.append((x[cut:], mask[cut:]))
    return parts


@examples(0.6)
@given(st.data(), st.sampled_from(["iwae", "smc"]))
def test_every_estimator_is_exact_without_latent_variables(data, method):
    # the RNN baseline's p(x) needs no sampling: IWAE weights are all p(x), SMC weights are the
    # incremental p(x_t | x_<t); so any K, batching and data form gives log p(x) exactly
    D = data.draw(st.integers(1, 3))
    torch.manual_seed(0)
    model = RNNBaseline(D, d_dim=3, hidden_dim=4)
    x, mask = data.draw(ragged_batches(D, binary=True).filter(lambda xm: _valid(xm, D)))
    K = data.draw(st.integers(1, 4))
    kwargs = dict(
        method=method,
        num_particles=K,
        batch_size=data.draw(st.one_of(st.none(), st.integers(1, 3))),
    )
    if method == "iwae":
        kwargs["particles_per_pass"] = data.draw(st.one_of(st.none(), st.integers(1, K)))
    est = estimate_log_likelihood(
        model.model, model.guide, _data_form(data.draw, x, mask), **kwargs
    )
    exact = torch.tensor(
        [
            -Trace_ELBO().loss(model.model, model.guide, x[i : i + 1], mask[i : i + 1])
            for i in range(x.shape[0])
        ],
        dtype=torch.float64,
    )
    assert est.per_sequence.shape == (x.shape[0],)
    assert torch.allclose(est.per_sequence, exact, rtol=1e-5, atol=1e-4), (est.per_sequence, exact)
    assert torch.equal(est.lengths, mask.sum(-1).long())
    assert math.isclose(est.total, float(est.per_sequence.sum()), rel_tol=1e-12, abs_tol=1e-12)
    assert est.num_steps == int(mask.sum())
    assert math.isclose(est.nats_per_step, est.total / est.num_steps, rel_tol=1e-12)


def _valid(xm, D):
    try:
        validate_sequences(*xm, obs_dim=D, binary=True)
    except ValueError:
        return False
    return True


@examples(0.4)
@given(
    st.data(), st.sampled_from(["srnn", "vrnn", "storn", "vrae"]), st.sampled_from(["iwae", "smc"])
)
def test_latent_model_estimates_are_finite_with_consistent_bookkeeping(data, model_name, method):
    D = data.draw(st.integers(1, 3))
    torch.manual_seed(0)
    model = MODELS[model_name](D)
    x, mask = data.draw(ragged_batches(D, binary=True).filter(lambda xm: _valid(xm, D)))
    est = estimate_log_likelihood(
        model.model,
        model.guide,
        _data_form(data.draw, x, mask),
        method=method,
        num_particles=data.draw(st.integers(1, 3)),
    )
    assert_finite("per-sequence estimates", est.per_sequence)
    # (not "at most 0": only the mean of the weights is p(x) <= 1; one weight p(x, z) / q(z)
    # may exceed 1, as the fuzz profile found with STORN's Wiener prior and K = 1)
    assert torch.equal(est.lengths, mask.sum(-1).long())
    assert est.num_steps == int(mask.sum())
    assert math.isclose(est.total, float(est.per_sequence.sum()), rel_tol=1e-12, abs_tol=1e-12)


BAD_ARGUMENTS = [
    (dict(method="exact"), r"method"),
    (dict(num_particles=0), r"num_particles"),
    (dict(num_particles=1.5), r"num_particles"),
    (dict(batch_size=0), r"batch_size"),
    (dict(batch_size=-2), r"batch_size"),
    (dict(batch_size=1.5), r"batch_size"),
    (dict(particles_per_pass=0), r"particles_per_pass"),
    (dict(method="smc", ess_threshold=1.5), r"ess_threshold"),
    (dict(method="smc", resample="sometimes"), r"resample"),
    (dict(method="smc", resampling="magic"), r"resampling"),
]


@pytest.mark.parametrize("kwargs, pattern", BAD_ARGUMENTS, ids=lambda v: str(v))
def test_estimator_arguments_are_checked(kwargs, pattern):
    torch.manual_seed(0)
    model = MODELS["srnn"](2)
    x = torch.bernoulli(torch.full((2, 3, 2), 0.5))
    with pytest.raises(ValueError, match=pattern):
        estimate_log_likelihood(model.model, model.guide, x, **kwargs)


def test_empty_data_is_refused():
    model = MODELS["srnn"](2)
    with pytest.raises(ValueError, match="no data"):
        estimate_log_likelihood(model.model, model.guide, [])
