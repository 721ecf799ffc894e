"""The training loop: exact resume, logs, early stopping, evaluation convention."""

import json
import math

import pytest
import torch

from pyro_seq.models import DMM, SRNN
from pyro_seq.train import TrainConfig, elbo_terms, epoch_lr, evaluate_bound, fit, kl_beta


def toy_sequences(n, seed=0, D=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=g)
    return [(torch.rand(int(L), D, generator=g) < 0.3).float() for L in lengths]


def tiny_srnn():
    torch.manual_seed(0)
    return SRNN(6, d_dim=8, z_dim=3, hidden_dim=8)


def test_resume_gives_the_same_parameters_as_an_uninterrupted_run(tmp_path):
    train, valid = toy_sequences(12), toy_sequences(4, seed=1)
    cfg = dict(batch_size=5, lr=0.01, kl_start=0.2, kl_anneal_steps=4, progress=False)
    straight = tiny_srnn()
    fit(straight, train, valid, TrainConfig(epochs=3, **cfg), tmp_path / "a")
    resumed = tiny_srnn()
    fit(resumed, train, valid, TrainConfig(epochs=1, **cfg), tmp_path / "b")
    other = tiny_srnn()            # a fresh object, as after a restart of the program
    torch.manual_seed(123)         # unrelated RNG use in between must not matter
    history = fit(other, train, valid, TrainConfig(epochs=3, **cfg), tmp_path / "b")
    assert [row["epoch"] for row in history] == [1, 2, 3]
    for (name, p), q in zip(straight.state_dict().items(), other.state_dict().values()):
        assert torch.equal(p, q), name


def test_epoch_lr_schedule_of_the_srnn_code():
    """Constant for ``lr_decay_after`` epochs, then divided by the factor once per epoch
    (0-based epoch 20 is the first decayed one with lr_decay_after=20, as in the SRNN code)."""
    cfg = TrainConfig(lr=1e-3, lr_decay_after=20, lr_decay_factor=1.2)
    assert epoch_lr(0, cfg) == epoch_lr(19, cfg) == 1e-3
    assert math.isclose(epoch_lr(20, cfg), 1e-3 / 1.2)
    assert math.isclose(epoch_lr(29, cfg), 1e-3 / 1.2 ** 10)
    assert epoch_lr(7, TrainConfig(lr=0.5)) == 0.5
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(lr_decay_after=2, lr_decay_factor=2.0, lrd=0.99).validate()
    with pytest.raises(ValueError, match="lr_decay_factor"):
        TrainConfig(lr_decay_after=2, lr_decay_factor=0.5).validate()


def test_epoch_lr_schedule_is_applied_logged_and_resumed_exactly(tmp_path):
    train, valid = toy_sequences(12), toy_sequences(4, seed=1)
    cfg = dict(batch_size=5, lr=0.01, lr_decay_after=1, lr_decay_factor=4.0, progress=False)
    straight = tiny_srnn()
    history = fit(straight, train, valid, TrainConfig(epochs=3, **cfg), tmp_path / "a")
    assert [row["lr"] for row in history] == [0.01, 0.01 / 4, 0.01 / 16]
    resumed = tiny_srnn()
    fit(resumed, train, valid, TrainConfig(epochs=2, **cfg), tmp_path / "b")
    fit(resumed, train, valid, TrainConfig(epochs=3, **cfg), tmp_path / "b")
    for (name, p), q in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(p, q), name
    # the schedule reaches the optimizer: a run with a tiny decayed rate moves less in epoch 2
    slow = tiny_srnn()
    cfg_slow = dict(cfg, lr_decay_factor=1e6)
    fit(slow, train, valid, TrainConfig(epochs=3, **cfg_slow), tmp_path / "c")
    one = tiny_srnn()
    fit(one, train, valid, TrainConfig(epochs=1, **cfg_slow), tmp_path / "d")
    drift = max((p - q).abs().max().item() for p, q in zip(slow.parameters(), one.parameters()))
    assert drift < 1e-5


def test_logs_checkpoints_and_figure_are_written(tmp_path):
    fit(tiny_srnn(), toy_sequences(8), toy_sequences(3, seed=1),
        TrainConfig(epochs=2, batch_size=4, progress=False), tmp_path)
    rows = json.loads((tmp_path / "log.json").read_text())
    assert len(rows) == 2 and all(math.isfinite(r["valid_elbo_per_step"]) for r in rows)
    assert (tmp_path / "log.csv").read_text().count("\n") == 3
    for name in ("checkpoint.pt", "best.pt", "loss_curve.png"):
        assert (tmp_path / name).stat().st_size > 0
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and ckpt["global_step"] == 4


def test_early_stopping(tmp_path):
    history = fit(tiny_srnn(), toy_sequences(8), toy_sequences(3, seed=1),
                  TrainConfig(epochs=50, batch_size=4, lr=1e-9, patience=1, progress=False), tmp_path)
    assert len(history) < 50


def test_kl_beta_is_linear_from_start_to_one():
    cfg = TrainConfig(kl_start=0.2, kl_anneal_steps=10)
    assert [kl_beta(s, cfg) for s in (0, 5, 10, 20)] == pytest.approx([0.2, 0.6, 1.0, 1.0])
    assert kl_beta(0, TrainConfig()) == 1.0


def test_evaluate_bound_and_elbo_terms_match_pyros_trace_elbo():
    # independent references on the same random numbers: Pyro's Trace_ELBO for the ELBO, and
    # Trace_ELBO with every latent site scaled by 0 (LatentScale(0)) for its log-likelihood term
    from pyro.infer import Trace_ELBO

    from pyro_seq.data import SequenceLoader
    from pyro_seq.infer import LatentScale

    torch.manual_seed(0)
    m = DMM(6, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8)
    m.eval()
    seqs = toy_sequences(5)
    torch.manual_seed(1)
    result = evaluate_bound(m, seqs, batch_size=2)
    torch.manual_seed(1)
    batches = list(SequenceLoader(seqs, 2, shuffle=False))
    expected = sum(-Trace_ELBO().loss(m.model, m.guide, x, mask) for x, mask in batches)
    assert result["num_steps"] == sum(len(s) for s in seqs) == sum(int(mk.sum()) for _, mk in batches)
    # float32 (the loader pads in float32): summation orders differ, rel 1e-5
    assert result["total"] == pytest.approx(expected, rel=1e-5)
    assert result["per_step"] == pytest.approx(expected / result["num_steps"], rel=1e-5)
    x, mask = batches[0]
    torch.manual_seed(2)
    terms = elbo_terms(m, x, mask)
    torch.manual_seed(2)
    elbo = -Trace_ELBO().loss(m.model, m.guide, x, mask)
    torch.manual_seed(2)
    zero = LatentScale(0.0)
    log_lik = -Trace_ELBO().loss(zero(m.model), zero(m.guide), x, mask)
    assert terms["elbo"].sum().item() == pytest.approx(elbo, rel=1e-5)
    assert terms["log_likelihood"].sum().item() == pytest.approx(log_lik, rel=1e-5)
    assert (terms["kl"] != 0).all()


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="kl_start"):
        TrainConfig(kl_start=2.0).validate()
