"""Known inputs (controls, actions) travel with their sequences: the loader, fit,
evaluate_bound, the estimators and the tasks pass them to the programs as ``inputs=``."""

import copy

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.optim import ClippedAdam

from pyro_seq.data import SequenceList, SequenceLoader, chunk_sequences, pad_sequences
from pyro_seq.infer import IWAE, estimate_log_likelihood
from pyro_seq.models import KVAE
from pyro_seq.tasks import denoise, forecast, impute
from pyro_seq.train import TrainConfig, elbo_terms, evaluate_bound, fit


def _data(n=5, controls=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 4, 5, 6, 3][:n]
    seqs = [(torch.rand(T, 16, generator=g) < 0.3).float() for T in lengths]
    inputs = [torch.randn(T, controls, generator=g) for T in lengths]
    return SequenceList(seqs, inputs)


def _kvae(controls=2):
    torch.manual_seed(0)
    return KVAE(
        (4, 4),
        control_dim=controls,
        encoder="mlp",
        hidden_dims=(4,),
        lstm_dim=4,
        z_dim=2,
        num_modes=2,
    )


def test_sequence_list_slices_select_and_chunks_keep_the_inputs():
    data = _data()
    assert data.input_dim == 2 and data[1:3].inputs == data.inputs[1:3]
    picked = data.select([4, 0])
    assert picked[0] is data[4] and picked.inputs[1] is data.inputs[0]
    windows = chunk_sequences(data, 4)
    assert [tuple(u.shape) for u in windows.inputs] == [
        (4, 2),
        (2, 2),
        (4, 2),
        (4, 2),
        (1, 2),
        (4, 2),
        (2, 2),
        (3, 2),
    ]
    assert torch.equal(torch.cat(windows.inputs[:2]), data.inputs[0])
    with pytest.raises(ValueError, match=r"inputs\[1\] has 3 steps, its sequence 4"):
        SequenceList(data, [data.inputs[0], torch.zeros(3, 2)] + data.inputs[2:])
    with pytest.raises(ValueError, match=r"inputs\[0\] holds NaN"):
        SequenceList(data[:1], [torch.full((6, 2), float("nan"))])


def test_loader_yields_the_padded_inputs_of_each_batch():
    data = _data()
    loader = SequenceLoader(data, 2, shuffle=True, seed=3)
    for idx, (x, mask, u) in zip(loader.batch_indices(0), loader.batches(0)):
        ex, em = pad_sequences([data[i] for i in idx])
        eu, _ = pad_sequences([data.inputs[i] for i in idx])
        assert torch.equal(x, ex) and torch.equal(mask, em) and torch.equal(u, eu)
    assert all(len(b) == 2 for b in SequenceLoader(list(data), 2).batches(0))


def test_fit_passes_the_inputs_to_every_update():
    """Two updates of fit equal two hand-written SVI steps on the same batches with inputs=."""
    data = _data()
    model = _kvae()
    manual = copy.deepcopy(model)
    config = TrainConfig(
        epochs=1, batch_size=3, lr_schedule="constant", init="none", progress=False, clip_norm=10.0
    )
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        fit(model, data, [], config, out)
    pyro.clear_param_store()
    torch.manual_seed(config.seed)
    svi = SVI(
        manual.model,
        manual.guide,
        ClippedAdam({"lr": config.lr, "clip_norm": 10.0, "betas": config.betas}),
        Trace_ELBO(),
    )
    manual.train()
    manual.training_epoch(0)
    for x, mask, u in SequenceLoader(data, 3, shuffle=True, seed=config.seed).batches(0):
        svi.step(x, mask, inputs=u)
    for (name, a), b in zip(model.state_dict().items(), manual.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name


def test_bounds_and_estimators_score_with_the_inputs():
    data = _data()
    model = _kvae().double().eval()
    seqs = SequenceList([s.double() for s in data], [u.double() for u in data.inputs])
    pyro.set_rng_seed(0)
    got = evaluate_bound(model, seqs, batch_size=10)
    x, mask = pad_sequences(list(seqs), dtype=torch.float64)
    u, _ = pad_sequences(seqs.inputs, dtype=torch.float64)
    pyro.set_rng_seed(0)
    with torch.no_grad():
        expected = float(elbo_terms(model, x, mask, u)["elbo"].sum())
    assert got["total"] == pytest.approx(expected, rel=1e-12)
    pyro.set_rng_seed(1)
    est = estimate_log_likelihood(model.model, model.guide, seqs, method="iwae", num_particles=4)
    pyro.set_rng_seed(1)
    log_z, _ = IWAE(num_particles=4, vectorize_particles=True, max_plate_nesting=1).log_z(
        model.model, model.guide, x, mask, inputs=u
    )
    assert torch.allclose(est.per_sequence, log_z.double(), rtol=1e-12, atol=0)
    # the inputs matter: other controls give another bound
    other = SequenceList(list(seqs), [v + 1.0 for v in seqs.inputs])
    pyro.set_rng_seed(0)
    assert evaluate_bound(model, other, batch_size=10)["total"] != got["total"]


def test_tasks_take_inputs_and_name_them_when_they_are_wrong():
    data = _data()
    model = _kvae().eval()
    x, mask = pad_sequences(list(data[:2]))
    u, _ = pad_sequences(data.inputs[:2])
    observed = mask.clone()
    observed[:, 2] = False
    for method in model.impute_methods:
        res = impute(
            model, x, observed, mask, method=method, inputs=u, num_iterations=2, num_particles=3
        )
        assert torch.equal(res.x[observed], x[observed])
    assert denoise(model, x, mask, inputs=u)[0].shape == x.shape
    future = torch.cat([u[:, :4], torch.randn(2, 3, 2)], 1)
    assert forecast(model, x[:, :4], 3, num_samples=2, inputs=future).samples.shape == (2, 2, 3, 16)
    for bad, message in (
        (u[:, :5], r"inputs must have shape \(batch, T, input_dim\) = \(2, 6, 2\)"),
        (u[..., :1], r"got \(2, 6, 1\)"),
        (None, "needs inputs="),
        (torch.full_like(u, float("nan")), "non-finite"),
    ):
        with pytest.raises(ValueError, match=message):
            impute(model, x, observed, mask, inputs=bad)
    with pytest.raises(ValueError, match=r"\(batch, T \+ steps, input_dim\)"):
        forecast(model, x[:, :4], 3, num_samples=2, inputs=u[:, :4])


def test_inputs_and_models_must_agree():
    data = _data()
    with pytest.raises(ValueError, match="train: the model takes 2 known inputs per step"):
        fit(_kvae(), list(data), [], TrainConfig(epochs=1, progress=False), "unused")
    with pytest.raises(ValueError, match="but the model takes none"):
        evaluate_bound(_kvae(controls=0), data)
    with pytest.raises(ValueError, match=r"valid inputs\[0\]: expected a floating tensor of shape"):
        valid = SequenceList(data[:1], [torch.zeros(6, 3)])
        fit(_kvae(), data, valid, TrainConfig(epochs=1, progress=False), "unused")


def test_a_model_program_scores_with_its_inputs_in_the_trace():
    """The inputs reach the model: the controls' effect B_t u_t moves the prior of a_t."""
    data = _data()
    model = _kvae().double()
    x, mask = pad_sequences(list(data[:2]), dtype=torch.float64)
    u, _ = pad_sequences(data.inputs[:2], dtype=torch.float64)
    guide = poutine.trace(model.guide).get_trace(x, mask, inputs=u)
    scores = []
    for v in (u, 2 * u):
        tr = poutine.trace(poutine.replay(model.model, trace=guide)).get_trace(x, mask, inputs=v)
        scores.append(tr.log_prob_sum())
    assert scores[0] != scores[1]
