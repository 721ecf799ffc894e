"""The SRNN speed benchmark: its plain-PyTorch floor computes the package's function, and the
runner works end to end.

``benchmarks/baselines/plain_srnn.py`` must be the same function as ``pyro_seq.models.SRNN``
(defaults: smoothing, Res_q, Bernoulli) or the timing in ``benchmarks/speed/srnn_speed.py`` would
compare different computations: with the weights copied across and the same standard-normal
noise, the single-sample ELBO of :class:`pyro.infer.Trace_ELBO` and the floor's must agree to
float64 rounding, and so must every parameter's gradient.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributions.normal as torch_normal
from pyro.infer import Trace_ELBO

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path[:0] = [str(BENCHMARKS / "speed"), str(BENCHMARKS)]

import srnn_speed  # noqa: E402
from baselines import plain_srnn  # noqa: E402

from pyro_seq.data import pad_sequences  # noqa: E402
from pyro_seq.models import SRNN  # noqa: E402


def _batch(obs_dim, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.bernoulli(torch.full((T, obs_dim), 0.3), generator=g) for T in lengths]
    return pad_sequences(seqs, dtype=torch.get_default_dtype())


def _randomize(module, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))


def _package_elbo_with_noise(m, x, mask, noise, monkeypatch):
    """``-Trace_ELBO`` loss of the package's SRNN whose guide draws ``noise[:, t]`` at step t."""
    steps = iter(noise.unbind(1))

    def fixed_noise(shape, dtype, device):
        eps = next(steps)
        assert eps.shape == shape
        return eps.to(dtype)

    monkeypatch.setattr(torch_normal, "_standard_normal", fixed_noise)
    loss = Trace_ELBO(max_plate_nesting=1).differentiable_loss(m.model, m.guide, x, mask)
    monkeypatch.undo()
    return -loss


@pytest.mark.parametrize("lengths", [(6, 6, 6), (7, 3, 5, 1)], ids=["full", "ragged"])
def test_plain_floor_is_the_package_srnn(float64, monkeypatch, lengths):
    """Same weights, same noise: same ELBO (1e-6 relative and absolute) and same gradients."""
    m = SRNN(12, d_dim=7, z_dim=5, hidden_dim=9)
    _randomize(m)
    plain = plain_srnn.from_package(m)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in m.parameters())
    x, mask = _batch(12, lengths)
    noise = torch.randn(x.shape[0], x.shape[1], 5, generator=torch.Generator().manual_seed(2))
    ours = _package_elbo_with_noise(m, x, mask, noise, monkeypatch)
    theirs = plain.elbo(x, mask, noise)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-6), (ours.item(), theirs.item())
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-10)  # float64: rounding only
    ours.backward()
    theirs.backward()
    package = dict(m.named_parameters())
    for name, p in plain.named_parameters():
        q = package[plain_srnn.PACKAGE_NAMES[name]]
        assert torch.allclose(p.grad, q.grad, rtol=1e-9, atol=1e-10), name


def test_plain_floor_draws_noise_per_step_in_order():
    """Without ``noise`` the floor draws one ``(B, z)`` standard normal per step, in step
    order: the ELBO equals the one with those draws passed explicitly."""
    m = SRNN(6, d_dim=4, z_dim=3, hidden_dim=5)
    plain = plain_srnn.from_package(m)
    x, mask = _batch(6, (4, 2))
    torch.manual_seed(5)
    drawn = plain.elbo(x, mask)
    torch.manual_seed(5)
    noise = torch.stack([torch.randn(2, 3) for _ in range(4)], 1)
    assert torch.equal(drawn, plain.elbo(x, mask, noise))


def test_plain_floor_refuses_other_settings():
    with pytest.raises(ValueError, match="smoothing"):
        plain_srnn.from_package(SRNN(6, d_dim=4, z_dim=3, hidden_dim=5, inference="filtering"))
    with pytest.raises(ValueError, match="variance"):
        plain_srnn.from_package(SRNN(6, d_dim=4, z_dim=3, hidden_dim=5, variance="log"))


def test_smoke_run_writes_the_result_fields(tmp_path):
    out = tmp_path / "srnn_speed.json"
    result = srnn_speed.main(["--smoke", "--output", str(out)])
    saved = json.loads(out.read_text())
    assert saved["ratio_pyro_seq_to_plain"] == pytest.approx(result["ratio_pyro_seq_to_plain"])
    for key in (
        "settings",
        "machine",
        "check_same_elbo",
        "wall_seconds_per_epoch",
        "cpu_seconds_per_epoch",
        "loss_per_step",
        "median_wall_seconds_per_epoch",
        "median_cpu_seconds_per_epoch",
        "ratio_pyro_seq_to_plain",
        "target_ratio",
        "parameters",
    ):
        assert key in saved, key
    assert saved["settings"]["smoke"] is True and saved["settings"]["repeats"] == 1
    assert saved["settings"]["threads"] == 1
    assert saved["parameters"]["pyro_seq"] == saved["parameters"]["plain"]
    assert saved["check_same_elbo"]["passed"]
    for name in ("pyro_seq", "plain"):
        assert len(saved["wall_seconds_per_epoch"][name]) == 1
        assert saved["median_wall_seconds_per_epoch"][name] > 0
    # both trained on the same minibatches from the same weights: close first-epoch losses
    a, b = saved["loss_per_step"]["pyro_seq"][0], saved["loss_per_step"]["plain"][0]
    assert abs(a - b) < 0.05 * abs(b)
    for key in ("cpu", "torch", "pyro", "torch_threads"):
        assert key in saved["machine"]
