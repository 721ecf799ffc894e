"""Devices (issue 13): the device setting, inputs on the wrong device, every model x objective on
a device.

The wrong-device checks use PyTorch's ``meta`` device as "another device" (tensors with shapes
and no data), so they run on every machine: a check that read a value before comparing devices
would fail on a meta tensor with a RuntimeError instead of the ValueError expected here. The
model x objective test runs on the CPU always and on CUDA when ``torch.cuda.is_available()``.
"""

import math

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO

from pyro_seq.cli import build_model, main
from pyro_seq.data import SequenceLoader
from pyro_seq.distributions import LinearGaussianSSM
from pyro_seq.infer import FIVO, IWAE, ContrastiveDivergence, LatentScale
from pyro_seq.models import DMM, RTRBM, LinearGaussianSequenceModel, RNNBaseline
from pyro_seq.ops import kalman_filter, kalman_sample, kalman_smoother
from pyro_seq.ops.kalman import _validate_parameters
from pyro_seq.tasks import denoise
from pyro_seq.train import TrainConfig, evaluate_bound
from pyro_seq.train.objectives import make_objective
from pyro_seq.validation import check_device, module_device, parse_device, validate_sequences

META, CPU = torch.device("meta"), torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)"
        ),
    ),
]


def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ------------------------------------------------------------------------ the device setting
@pytest.mark.parametrize("spec", ["cpu", torch.device("cpu")])
def test_parse_device_accepts_the_cpu(spec):
    assert parse_device(spec) == CPU


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "meta", "cpu:1", "", "mps", None])
def test_parse_device_refuses_other_names(spec):
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'cuda' or 'cuda:N', got"):
        parse_device(spec)


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_cuda_is_an_error_naming_it_never_a_cpu_fallback(
    spec, monkeypatch, tiny_pickle, tmp_path
):
    no_cuda(monkeypatch)
    with pytest.raises(
        ValueError,
        match=rf"device '{spec}' asks for CUDA, but "
        r"torch.cuda.is_available\(\) is False",
    ):
        parse_device(spec)
    with pytest.raises(ValueError, match=rf"device '{spec}' asks for CUDA"):
        TrainConfig(device=spec).validate()
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=rf"pyro-seq: error: --device '{spec}' asks for CUDA"):
        main(["train", "--data", str(tiny_pickle), "--out", str(out), "--device", spec, "--quiet"])
    assert not out.exists()  # refused before anything was written


def test_a_cuda_index_that_is_not_there_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"'cuda:2' does not exist: this machine has 2 CUDA"):
        parse_device("cuda:2")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert parse_device("cuda:1") == torch.device("cuda", 1)
    assert parse_device("cuda") == torch.device("cuda", 0)  # with the index tensors get
    # data parallel: rank r on cuda:N+r, all of them must exist
    TrainConfig(device="cuda", world_size=2).validate()
    with pytest.raises(ValueError, match=r"world_size=2 on device 'cuda:1' needs cuda:2"):
        TrainConfig(device="cuda:1", world_size=2).validate()


def test_the_default_device_is_the_cpu_and_reaches_config_json(tiny_pickle, tmp_path):
    assert TrainConfig().device == "cpu"
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--model",
                "dmm",
                "--data",
                str(tiny_pickle),
                "--epochs",
                "1",
                "--z-dim",
                "2",
                "--model-option",
                "rnn_dim=4",
                "--model-option",
                "transition_dim=4",
                "--model-option",
                "emission_dim=4",
                "--batch-size",
                "5",
                "--out",
                str(out),
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    import json

    assert json.loads((out / "config.json").read_text())["train"]["device"] == "cpu"
    for command in (["evaluate", str(out)], ["sample", str(out), "--length", "4"]):
        assert main(command + ["--device", "cpu"]) == 0


# ------------------------------------------------------------------------ wrong-device inputs
def batch(device=CPU, B=2, T=3, D=4):
    x = torch.zeros(B, T, D, device=device)
    return x, torch.ones(B, T, dtype=torch.bool, device=device)


def test_module_device_and_check_device():
    assert module_device(torch.nn.Linear(2, 2)) == CPU
    assert module_device(torch.nn.Linear(2, 2, device="meta")) == META
    assert module_device(torch.nn.Identity()) is None
    check_device("x", torch.zeros(1), CPU)  # same device: nothing happens
    check_device("x", None, CPU)
    with pytest.raises(
        ValueError,
        match=r"^y is on device meta, but the model's parameters are "
        r"on cpu; move it there first \(y.to\('cpu'\)\)$",
    ):
        check_device("y", torch.zeros(1, device="meta"), CPU)


def test_validate_sequences_names_the_tensor_and_both_devices_before_reading_values():
    x, mask = batch()
    with pytest.raises(
        ValueError,
        match=r"^x is on device meta, but the model's parameters are "
        r"on cpu",
    ):
        validate_sequences(batch(META)[0], device=CPU)
    with pytest.raises(
        ValueError,
        match=r"^x is on device cpu, but the model's parameters are "
        r"on meta",
    ):
        validate_sequences(x, mask, device=META)
    with pytest.raises(ValueError, match=r"^mask is on device meta, but x is on cpu"):
        validate_sequences(x, mask.to(META))
    with pytest.raises(ValueError, match=r"^observed is on device meta, but x is on cpu"):
        validate_sequences(x, mask, observed=mask.to(META))
    assert validate_sequences(x, mask, device=CPU)[1].device == CPU


TINY = {
    "dmm": lambda: DMM(4, z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4),
    "srnn": lambda: build_model("srnn", 4, dict(d_dim=4, z_dim=2, hidden_dim=4)),
    "vrnn": lambda: build_model("vrnn", 4, dict(d_dim=4, z_dim=2, hidden_dim=4, feature_dim=4)),
    "vaernn": lambda: build_model("vaernn", 4, dict(d_dim=4, z_dim=2, hidden_dim=4)),
    "storn": lambda: build_model("storn", 4, dict(z_dim=2, rnn_dim=4, emission_dim=4)),
    "vrae": lambda: build_model(
        "vrae", 4, dict(z_dim=2, encoder_dim=4, decoder_dim=4, emission_dim=4)
    ),
    "rnn": lambda: RNNBaseline(4, d_dim=4, hidden_dim=4),
    "linear_gaussian": lambda: LinearGaussianSequenceModel(4, 2),
    "rtrbm": lambda: RTRBM(4, num_hidden=3),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_models_refuse_inputs_on_another_device_whatever_the_path(name):
    m = TINY[name]()
    x, mask = batch()
    xm, maskm = batch(META)
    energy = getattr(m, "energy_based", False)
    losses = (
        [ContrastiveDivergence(k=1)]
        if energy
        else [Trace_ELBO(), IWAE(num_particles=2, max_plate_nesting=1), FIVO(num_particles=2)]
    )
    calls = [lambda: m.model(xm, maskm), lambda: m.guide(xm, maskm)]
    calls += [lambda loss=loss: loss.loss(m.model, m.guide, xm, maskm) for loss in losses]
    for call in calls:
        with pytest.raises(
            ValueError,
            match=r"^x is on device meta, but the model's parameters "
            r"are on cpu",
        ):
            call()
    with pytest.raises(ValueError, match=r"^mask is on device meta, but x is on cpu"):
        m.model(x, maskm)
    m.to(META)  # the other way round: a CPU batch for a model elsewhere
    with pytest.raises(
        ValueError,
        match=r"^x is on device cpu, but the model's parameters are "
        r"on meta",
    ):
        m.model(x, mask)


def test_model_methods_and_tasks_check_the_device_too():
    with pytest.raises(ValueError, match=r"^x is on device meta"):
        RNNBaseline(4, d_dim=4, hidden_dim=4).log_likelihood(*batch(META))
    with pytest.raises(ValueError, match=r"^x is on device meta"):
        denoise(TINY["dmm"](), *batch(META))


# ------------------------------------------------------------------------ Kalman ops, LGSSM
def lgssm(device=CPU, T=5, S=2, D=3):
    g = torch.Generator().manual_seed(0)
    p = dict(
        initial_loc=torch.zeros(S),
        initial_cov=torch.eye(S),
        transition_matrix=0.9 * torch.eye(S),
        transition_cov=0.1 * torch.eye(S),
        observation_matrix=torch.randn(D, S, generator=g),
        observation_cov=torch.eye(D),
    )
    return torch.randn(T, D, generator=g), p


@pytest.mark.parametrize("op", [kalman_filter, kalman_smoother, kalman_sample])
@pytest.mark.parametrize(
    "moved", ["observations", "initial_cov", "transition_cov", "observation_matrix", "mask"]
)
def test_kalman_ops_name_the_argument_on_another_device(op, moved):
    x, p = lgssm()
    mask = torch.ones(x.shape[0], dtype=torch.bool)
    if moved == "observations":
        x = x.to(META)
    elif moved == "mask":
        mask = mask.to(META)
    else:
        p[moved] = p[moved].to(META)
    with pytest.raises(
        ValueError,
        match=rf"^{moved} is on device meta, but initial_loc is on "
        r"cpu",
    ):
        op(x, **p, mask=mask)


def test_kalman_noise_and_parameter_validation_check_devices():
    x, p = lgssm()
    with pytest.raises(ValueError, match=r"^noise is on device meta, but the model's parameters"):
        kalman_sample(x, **p, noise=torch.zeros(5, 2, device="meta"))
    args = [
        p[k]
        for k in (
            "initial_loc",
            "initial_cov",
            "transition_matrix",
            "transition_cov",
            "observation_matrix",
            "observation_cov",
        )
    ]
    args[3] = args[3].to(META)
    with pytest.raises(
        ValueError,
        match=r"^transition_cov is on device meta, but initial_loc is "
        r"on cpu",
    ):
        _validate_parameters(*args, None, None)


def test_linear_gaussian_ssm_checks_devices_of_parameters_data_and_masks():
    x, p = lgssm()
    bad = dict(p, observation_cov=p["observation_cov"].to(META))
    with pytest.raises(ValueError, match=r"^observation_cov is on device meta, but initial_loc"):
        LinearGaussianSSM(**bad)
    with pytest.raises(ValueError, match=r"^step_mask is on device meta, but initial_loc"):
        LinearGaussianSSM(**p, step_mask=torch.ones(5, dtype=torch.bool, device="meta"))
    d = LinearGaussianSSM(**p)
    msg = r"^{} is on device meta, but the LinearGaussianSSM's parameters are on cpu"
    with pytest.raises(ValueError, match=msg.format("observations")):
        d.log_prob(x.to(META))
    with pytest.raises(ValueError, match=msg.format("step_mask")):
        d.filter(x, step_mask=torch.ones(5, dtype=torch.bool, device="meta"))
    assert torch.isfinite(d.log_prob(x))


# ------------------------------------------------------------------------ every model x objective
MODELS = ("dmm", "srnn", "vrnn", "vaernn", "storn", "vosp", "vrae", "rnn", "rtrbm", "kvae", "gtmsm")


def _cells():
    for model in MODELS:
        if model == "gtmsm":  # needs actions and T > tau, no generate(): tests/models/test_gtmsm.py
            continue
        objectives = (
            ("cd",) if model == "rtrbm" else ("elbo", "meanfield", "free_bits", "iwae", "fivo")
        )
        for objective in objectives:
            yield model, objective


def _options(name):
    return {
        "dmm": dict(z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4),
        "srnn": dict(d_dim=4, z_dim=2, hidden_dim=4),
        "vrnn": dict(d_dim=4, z_dim=2, hidden_dim=4, feature_dim=4),
        "vaernn": dict(d_dim=4, z_dim=2, hidden_dim=4),
        "storn": dict(z_dim=2, rnn_dim=4, emission_dim=4),
        "vosp": dict(z_dim=2, rnn_dim=4, emission_dim=4),
        "vrae": dict(z_dim=2, encoder_dim=4, decoder_dim=4, emission_dim=4),
        "rnn": dict(d_dim=4, hidden_dim=4),
        "rtrbm": dict(num_hidden=3),
        # 5 values per step read as 1x5 frames with the MLP encoder
        "kvae": dict(image_shape=[1, 5], encoder="mlp", hidden_dims=[4], lstm_dim=4, z_dim=2),
    }[name]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_name,objective", list(_cells()))
def test_every_model_and_objective_trains_evaluates_and_samples_on_the_device(
    model_name, objective, device
):
    """Two SVI updates on batches padded on the CPU and moved to the device (KL annealing on for
    latent models), then the ELBO (pseudo-likelihood) of CPU sequences and samples: finite, and
    every parameter, batch and sample on the device."""
    device = parse_device(device)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    seqs = [(torch.rand(int(T), 5, generator=g) < 0.3).float() for T in (4, 6, 3, 5)]
    m = build_model(model_name, 5, _options(model_name)).to(device)
    free_bits = 0.1 if objective == "free_bits" else 0.0
    loss = make_objective(
        "elbo" if objective == "free_bits" else objective,
        num_particles=1 if objective in ("elbo", "meanfield", "free_bits") else 2,
        free_bits=free_bits,
    )
    model_fn, guide_fn = m.model, m.guide
    if objective != "cd":
        anneal = LatentScale(0.5)
        model_fn, guide_fn = anneal(m.model), anneal(m.guide)
    svi = SVI(model_fn, guide_fn, pyro.optim.ClippedAdam({"lr": 1e-2}), loss=loss)
    for x, mask in SequenceLoader(seqs, 2, seed=0, device=device):
        assert x.device == device and mask.device == device
        assert math.isfinite(svi.step(x, mask))
    for name, p in pyro.get_param_store().items():
        assert p.device == device, name
    assert {p.device for p in m.parameters()} == {device}
    method = "pseudo_likelihood" if objective == "cd" else "elbo"
    assert math.isfinite(evaluate_bound(m, seqs, batch_size=3, method=method)["per_step"])
    kwargs = {"gibbs_steps": 1} if model_name == "rtrbm" else {}
    with torch.no_grad():
        sample, _ = m.generate(2, 3, **kwargs)
    assert sample.device == device and torch.isfinite(sample).all()


@pytest.mark.parametrize("which", ["mask", "step_mask", "observation_mask"])
def test_lgssm_em_masks_on_another_device_are_named(which):
    from pyro_seq.infer import LGSSMParams, lgssm_log_likelihood

    x, p = lgssm()
    params = LGSSMParams(**p)
    shape = x.shape if which == "observation_mask" else x.shape[:1]
    with pytest.raises(
        ValueError,
        match=rf"^{which} is on device meta, but the observations are "
        r"on cpu",
    ):
        lgssm_log_likelihood(
            x, params, **{which: torch.ones(shape, dtype=torch.bool, device="meta")}
        )
    assert torch.isfinite(lgssm_log_likelihood(x, params, **{which: torch.ones(shape).bool()}))


def test_the_likelihood_estimators_check_the_batch_against_the_model_device():
    from pyro_seq.infer import estimate_log_likelihood

    m = TINY["dmm"]()
    for method in ("iwae", "smc"):
        for data in ([torch.zeros(3, 4, device="meta")], batch(META)):
            with pytest.raises(
                ValueError,
                match=r"^x is on device meta, but the model's "
                r"parameters are on cpu",
            ):
                estimate_log_likelihood(m.model, m.guide, data, method=method, num_particles=2)
