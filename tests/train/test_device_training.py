"""``fit`` on a device: the model, the param store, the batches and the random numbers follow
``TrainConfig.device``; checkpoints carry the CUDA generators' states; the distributed ranks pick
their device and backend from it. CUDA runs are skipped without CUDA; the CUDA bookkeeping
(checkpoint entries, backends) is also tested on the CPU with torch.cuda's functions replaced.
"""

import pyro
import pytest
import torch

from pyro_seq.models import DMM, RTRBM
from pyro_seq.train import CheckpointError, TrainConfig, evaluate_bound, fit, load_checkpoint
from pyro_seq.train import checkpoint as checkpoint_module
from pyro_seq.train.distributed import ProcessGroup, default_backend, rank_device
from pyro_seq.validation import parse_device

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


def seqs(n, seed, D=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(3 + i % 4, D, generator=g) < 0.3).float() for i in range(n)]


def tiny_dmm():
    torch.manual_seed(0)
    return DMM(5, z_dim=2, transition_dim=4, emission_dim=4, rnn_dim=4)


def config(device, epochs=1, **kw):
    base = dict(
        epochs=epochs,
        batch_size=3,
        lr=0.01,
        progress=False,
        device=device,
        kl_anneal_steps=2,
        kl_start=0.5,
        lr_schedule="constant",
        patience=None,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("device", DEVICES)
def test_fit_trains_on_the_device_and_resumes_exactly(device, tmp_path):
    """The model and Pyro's param store end up on the device; the initial weights do not depend
    on it; 2 epochs at once equal 1 + 1 resumed (the random stream of the device continues)."""
    dev = parse_device(device)
    train, valid = seqs(7, 0), seqs(3, 1)
    model = tiny_dmm()
    history = fit(model, train, valid, config(device, 2, init="none"), tmp_path / "once")
    assert {p.device for p in model.parameters()} == {dev}
    assert {p.device for p in pyro.get_param_store().values()} == {dev}
    assert all(torch.isfinite(torch.tensor(r["valid_elbo_per_step"])) for r in history)
    assert evaluate_bound(model, valid)["num_steps"] == sum(len(s) for s in valid)
    if dev.type == "cuda":  # the same initial weights (initialised before the move)
        cpu, gpu = tiny_dmm(), tiny_dmm()
        fit(cpu, train, [], config("cpu", 0), tmp_path / "cpu")
        fit(gpu, train, [], config(device, 0), tmp_path / "gpu")
        assert all(torch.equal(v, gpu.state_dict()[k].cpu()) for k, v in cpu.state_dict().items())
    fit(tiny_dmm(), train, valid, config(device, 1, init="none"), tmp_path / "twice")
    torch.manual_seed(123)  # another global state: what the resumed process starts from
    fit(tiny_dmm(), train, valid, config(device, 2, init="none"), tmp_path / "twice")
    once = load_checkpoint(tmp_path / "once" / "checkpoint.pt")
    twice = load_checkpoint(tmp_path / "twice" / "checkpoint.pt")
    assert ("cuda_rng" in once) == (dev.type == "cuda")
    # exact on the CPU; on CUDA up to the order of atomic additions (a lost random stream
    # would differ by ~lr = 1e-2)
    atol = 0.0 if dev.type == "cpu" else 1e-6
    for k, v in once["model"].items():
        assert torch.allclose(v, twice["model"][k], rtol=0.0, atol=atol), k


@pytest.mark.parametrize("device", DEVICES)
def test_fit_an_energy_based_model_on_the_device(device, tmp_path):
    model = RTRBM(5, num_hidden=3)
    history = fit(
        model,
        seqs(6, 2),
        seqs(2, 3),
        config(device, 1, objective="cd", kl_anneal_steps=0, kl_start=1.0),
        tmp_path,
    )
    assert {p.device for p in model.parameters()} == {parse_device(device)}
    assert "valid_pll_per_step" in history[-1]


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)")
def test_fit_on_cuda_restores_the_cuda_generator(tmp_path):
    torch.cuda.manual_seed_all(77)
    before = torch.cuda.get_rng_state_all()
    fit(tiny_dmm(), seqs(6, 0), [], config("cuda"), tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(before, torch.cuda.get_rng_state_all()))


# ---------------------------------------------------------------- CUDA bookkeeping, on the CPU
class FakeCuda:
    """Stands in for torch.cuda's generator functions: two devices with known states."""

    def __init__(self, monkeypatch):
        self.states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
        self.set = {}
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(
            torch.cuda,
            "set_rng_state",
            lambda state, device=0: self.set.__setitem__(device, state.clone()),
        )


def _save(path, **kw):
    model = torch.nn.Linear(2, 2)
    optim = pyro.optim.Adam({"lr": 0.1})
    checkpoint_module.save_checkpoint(
        path, model=model, optimizer=optim, epoch=0, global_step=0, history=[], **kw
    )
    return model, optim


def test_a_cuda_checkpoint_holds_and_restores_the_cuda_generators(tmp_path, monkeypatch):
    fake = FakeCuda(monkeypatch)
    model, optim = _save(tmp_path / "c.pt", cuda_rng=True)
    payload = load_checkpoint(tmp_path / "c.pt")
    assert [s.tolist() for s in payload["cuda_rng"]] == [s.tolist() for s in fake.states]
    checkpoint_module.restore(payload, model=model, optimizer=optim)
    assert sorted(fake.set) == [0, 1]
    assert all(torch.equal(fake.set[i], fake.states[i]) for i in (0, 1))
    # a machine with one device restores the first state only; restore_rng=False none
    fake.set.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    checkpoint_module.restore(payload, model=model, optimizer=optim)
    assert sorted(fake.set) == [0]
    fake.set.clear()
    checkpoint_module.restore(payload, model=model, optimizer=optim, restore_rng=False)
    assert not fake.set


def test_cpu_checkpoints_have_no_cuda_entry_and_ignore_one_without_cuda(tmp_path, monkeypatch):
    _save(tmp_path / "cpu.pt")
    assert "cuda_rng" not in load_checkpoint(tmp_path / "cpu.pt")  # as older checkpoints
    fake = FakeCuda(monkeypatch)
    model, optim = _save(tmp_path / "cuda.pt", cuda_rng=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checkpoint_module.restore(load_checkpoint(tmp_path / "cuda.pt"), model=model, optimizer=optim)
    assert not fake.set


def test_a_damaged_cuda_rng_entry_is_a_checkpoint_error(tmp_path):
    model, optim = _save(tmp_path / "c.pt")
    payload = torch.load(tmp_path / "c.pt", weights_only=True)
    payload["cuda_rng"] = [torch.zeros(3)]  # float, not a generator state
    torch.save(payload, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="cuda_rng entry that is not a list of CUDA RNG"):
        load_checkpoint(tmp_path / "c.pt")


def test_ranks_take_their_device_and_the_backend_follows_the_training_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA machine...
    assert (
        default_backend("cpu") == "gloo"
    )  # ...training on the CPU: nccl cannot reduce CPU tensors
    assert default_backend(torch.device("cuda", 1)) == "nccl"
    assert rank_device(torch.device("cpu"), 3) == torch.device("cpu")
    assert rank_device(torch.device("cuda"), 1) == torch.device("cuda", 1)
    assert rank_device(torch.device("cuda", 2), 1) == torch.device("cuda", 3)
    assert ProcessGroup(0, 2, torch.device("cuda", 1)).device == torch.device("cuda", 1)
    assert ProcessGroup(0, 2).device == torch.device("cpu")
    assert ProcessGroup(0, 2).gather_cuda_rng_states() is None
