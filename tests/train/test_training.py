"""The training loop: exact resume, logs, early stopping, evaluation convention."""

import json
import math

import pyro
import pytest
import torch

from pyro_seq.models import DMM, SRNN
from pyro_seq.train import (
    TrainConfig,
    elbo_terms,
    epoch_lr,
    evaluate_bound,
    fit,
    kl_beta,
    load_checkpoint,
    load_weights,
)
from pyro_seq.train import loop as loop_module
from pyro_seq.train import trainer as trainer_module


def toy_sequences(n, seed=0, D=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=g)
    return [(torch.rand(int(L), D, generator=g) < 0.3).float() for L in lengths]


def tiny_srnn():
    torch.manual_seed(0)
    return SRNN(6, d_dim=8, z_dim=3, hidden_dim=8)


def _assert_same_state(a, b):
    assert a.keys() == b.keys()
    for name, p in a.items():
        assert torch.equal(p, b[name]) if torch.is_tensor(p) else p == b[name], name


@pytest.mark.parametrize("restore_best", [False, True])
def test_resume_gives_the_same_parameters_as_an_uninterrupted_run(tmp_path, restore_best):
    """Also with plateau_restore_best, whose copy of the best weights comes back from best.pt
    on resuming."""
    train, valid = toy_sequences(12), toy_sequences(4, seed=1)
    # plateau schedule (the default) with a threshold no epoch can beat. KL annealing ends in
    # epoch 2 (3 updates per epoch, 4 annealing updates), the scheduler's first reading; every
    # later epoch is a bad one, so the rate halves after epoch 4 (patience 1) and the result
    # depends on the scheduler's bad-epoch count, which the checkpoint must carry over
    cfg = dict(
        batch_size=5,
        lr=0.01,
        kl_start=0.2,
        kl_anneal_steps=4,
        progress=False,
        plateau_patience=1,
        plateau_threshold=10.0,
        schedule_during_annealing=False,
        plateau_restore_best=restore_best,
    )
    straight = tiny_srnn()
    expected = fit(straight, train, valid, TrainConfig(epochs=5, **cfg), tmp_path / "a")
    assert [row["lr"] for row in expected] == [0.01, 0.01, 0.01, 0.01, 0.005]
    resumed = tiny_srnn()
    fit(resumed, train, valid, TrainConfig(epochs=3, **cfg), tmp_path / "b")
    saved = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["optimizer"]
    assert {s["scheduler"]["num_bad_epochs"] for s in saved.values()} == {1}
    other = tiny_srnn()  # a fresh object, as after a restart of the program
    torch.manual_seed(123)  # unrelated RNG use in between must not matter
    history = fit(other, train, valid, TrainConfig(epochs=5, **cfg), tmp_path / "b")
    assert [row["epoch"] for row in history] == [1, 2, 3, 4, 5]
    assert [row["lr"] for row in history] == [row["lr"] for row in expected]
    assert [row["valid_elbo_per_step"] for row in history] == [
        row["valid_elbo_per_step"] for row in expected
    ]
    _assert_same_state(straight.state_dict(), other.state_dict())  # the best weights
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    _assert_same_state(a["model"], b["model"])  # the last weights
    assert a["optimizer"].keys() == b["optimizer"].keys()
    for name, state in a["optimizer"].items():
        assert state["scheduler"] == b["optimizer"][name]["scheduler"], name
        assert state["scheduler"]["_last_lr"] == [0.005]
        _assert_same_state(
            state["optimizer"]["state"][0], b["optimizer"][name]["optimizer"]["state"][0]
        )


def test_plateau_rule_factor_patience_threshold_and_min_lr(tmp_path, monkeypatch):
    """The rate of each epoch under a scripted validation curve: halved after patience + 1
    epochs without an improvement of more than the threshold, never below min_lr."""
    curve = iter([-5.0, -4.0, -3.9995, -4.2, -3.0, -3.5, -3.6, -3.7, -3.8])
    monkeypatch.setattr(
        loop_module,
        "evaluate_checked_bound",
        lambda *a, **k: {"per_step": next(curve), "kl_per_step": 0.0},
    )
    cfg = TrainConfig(
        epochs=9,
        batch_size=5,
        lr=0.01,
        plateau_patience=1,
        plateau_factor=0.5,
        plateau_threshold=1e-3,
        plateau_min_lr=0.003,
        progress=False,
    )
    history = fit(tiny_srnn(), toy_sequences(8), toy_sequences(3, seed=1), cfg, tmp_path)
    # -3.9995 is better than -4.0 but by less than the threshold: a bad epoch for the scheduler
    # (halving after epoch 4), while the trainer's best.pt follows every improvement
    assert [row["lr"] for row in history] == [
        0.01,
        0.01,
        0.01,
        0.01,
        0.005,
        0.005,
        0.005,
        0.003,
        0.003,
    ]
    assert history.best_epoch == 5 and history.best_valid_elbo_per_step == -3.0
    assert history.stop_reason == "epochs"


def test_plateau_restore_best_continues_from_the_best_epoch(tmp_path, monkeypatch):
    """plateau_restore_best: at the epoch where the rate is halved the weights go back to those
    of the best epoch so far (the checkpoint of that epoch equals best.pt), in the model and in
    Pyro's param store; without it the weights of that epoch stay (they differ from best.pt)."""
    original = loop_module.save_checkpoint

    def run(restore, folder):
        curve = iter([-5.0, -4.0, -4.5, -3.0])
        monkeypatch.setattr(
            loop_module,
            "evaluate_checked_bound",
            lambda *a, **k: {"per_step": next(curve), "kl_per_step": 0.0},
        )
        saved = {}

        def keep(path, *, model, epoch, **kw):  # the weights of every epoch's checkpoint
            saved[epoch] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return original(path, model=model, epoch=epoch, **kw)

        monkeypatch.setattr(loop_module, "save_checkpoint", keep)
        model = tiny_srnn()
        cfg = TrainConfig(
            epochs=4,
            batch_size=4,
            lr=0.01,
            plateau_patience=0,
            patience=None,
            plateau_restore_best=restore,
            progress=False,
        )
        history = fit(model, toy_sequences(8), toy_sequences(3, seed=1), cfg, folder)
        return model, history, saved

    model, history, saved = run(True, tmp_path / "restore")
    assert [row["lr"] for row in history] == [0.01, 0.01, 0.01, 0.005]  # halved after epoch 3
    for name, value in saved[3].items():  # epoch 3 ended on epoch 2's (the best) weights
        assert torch.equal(value, saved[2][name]), name
    assert any(not torch.equal(v, saved[3][k]) for k, v in saved[4].items())  # then trained on
    assert history.best_epoch == 4
    store = pyro.get_param_store()
    for name, p in model.named_parameters():
        assert torch.equal(store[f"{model.module_name}$$${name}"], p), name
    _, _, saved = run(False, tmp_path / "plain")
    assert any(not torch.equal(v, saved[2][k]) for k, v in saved[3].items())
    TrainConfig(lr_schedule="constant").validate()  # the default is no error elsewhere


def test_stopping_restores_the_best_weights_into_model_and_param_store(tmp_path, monkeypatch):
    curve = iter([-5.0, -4.0, -4.5, -4.6, -4.7, -4.8])
    monkeypatch.setattr(
        loop_module,
        "evaluate_checked_bound",
        lambda *a, **k: {"per_step": next(curve), "kl_per_step": 0.0},
    )
    model = tiny_srnn()
    cfg = TrainConfig(epochs=50, batch_size=4, lr=0.01, patience=3, progress=False)
    history = fit(model, toy_sequences(8), toy_sequences(3, seed=1), cfg, tmp_path)
    assert len(history) == 5 and history.stop_reason == "patience"
    assert history.best_epoch == 2 and history.best_valid_elbo_per_step == -4.0
    assert history.restored_best
    best, last = load_weights(tmp_path / "best.pt"), load_checkpoint(tmp_path / "checkpoint.pt")
    _assert_same_state(model.state_dict(), best)
    assert last["epoch"] == 5
    assert any(not torch.equal(p, best[k]) for k, p in last["model"].items())
    store = pyro.get_param_store()
    for name, p in model.named_parameters():
        assert torch.equal(store[f"{model.module_name}$$${name}"], p), name
    # best.pt holds the weights of epoch 2: those of a run stopped there
    two = tiny_srnn()
    curve = iter([-5.0, -4.0])
    fit(
        two,
        toy_sequences(8),
        toy_sequences(3, seed=1),
        TrainConfig(epochs=2, batch_size=4, lr=0.01, progress=False),
        tmp_path / "two",
    )
    _assert_same_state(two.state_dict(), best)
    # called again, a run that stopped early stays stopped and still returns the best weights
    again = tiny_srnn()
    history = fit(again, toy_sequences(8), toy_sequences(3, seed=1), cfg, tmp_path)
    assert len(history) == 5 and history.stop_reason == "patience" and history.best_epoch == 2
    _assert_same_state(again.state_dict(), best)


def test_time_limit_and_last_epoch_also_restore_the_best_weights(tmp_path, monkeypatch):
    curve = iter([-4.0, -5.0, -6.0, -7.0])
    monkeypatch.setattr(
        loop_module,
        "evaluate_checked_bound",
        lambda *a, **k: {"per_step": next(curve), "kl_per_step": 0.0},
    )
    data = toy_sequences(8), toy_sequences(3, seed=1)
    cfg = dict(batch_size=4, lr=0.01, progress=False)
    model = tiny_srnn()
    history = fit(model, *data, TrainConfig(epochs=2, **cfg), tmp_path)
    assert history.stop_reason == "epochs" and history.best_epoch == 1
    best = load_weights(tmp_path / "best.pt")
    _assert_same_state(model.state_dict(), best)
    model = tiny_srnn()
    history = fit(model, *data, TrainConfig(epochs=10, time_limit=0.0, **cfg), tmp_path)
    assert len(history) == 3 and history.stop_reason == "time_limit" and history.best_epoch == 1
    _assert_same_state(model.state_dict(), best)


def test_epoch_lr_schedule_of_the_srnn_code():
    """Constant for ``lr_decay_after`` epochs, then divided by the factor once per epoch
    (0-based epoch 20 is the first decayed one with lr_decay_after=20, as in the SRNN code)."""
    cfg = TrainConfig(lr=1e-3, lr_schedule="exponential", lr_decay_after=20, lr_decay_factor=1.2)
    assert epoch_lr(0, cfg) == epoch_lr(19, cfg) == 1e-3
    assert math.isclose(epoch_lr(20, cfg), 1e-3 / 1.2)
    assert math.isclose(epoch_lr(29, cfg), 1e-3 / 1.2**10)
    assert epoch_lr(7, TrainConfig(lr=0.5)) == 0.5
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(
            lr_schedule="exponential", lr_decay_after=2, lr_decay_factor=2.0, lrd=0.99
        ).validate()
    with pytest.raises(ValueError, match="lr_decay_factor >= 1"):
        TrainConfig(lr_schedule="exponential", lr_decay_after=2, lr_decay_factor=0.5).validate()


def test_epoch_lr_schedule_is_applied_logged_and_resumed_exactly(tmp_path):
    train, valid = toy_sequences(12), toy_sequences(4, seed=1)
    cfg = dict(
        batch_size=5,
        lr=0.01,
        lr_schedule="exponential",
        lr_decay_after=1,
        lr_decay_factor=4.0,
        progress=False,
    )
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
    fit(
        tiny_srnn(),
        toy_sequences(8),
        toy_sequences(3, seed=1),
        TrainConfig(epochs=2, batch_size=4, progress=False),
        tmp_path,
    )
    rows = json.loads((tmp_path / "log.json").read_text())
    assert len(rows) == 2 and all(math.isfinite(r["valid_elbo_per_step"]) for r in rows)
    assert (tmp_path / "log.csv").read_text().count("\n") == 3
    for name in ("checkpoint.pt", "best.pt", "loss_curve.png"):
        assert (tmp_path / name).stat().st_size > 0
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and ckpt["global_step"] == 4


def test_schedule_and_early_stopping_wait_for_the_end_of_kl_annealing(tmp_path, monkeypatch):
    """schedule_during_annealing=False: beta < 1 in epochs 1-3 (2 updates per epoch, 8 annealing updates): a falling validation
    bound there neither halves the rate nor counts towards patience; best.pt still follows it."""

    def falling():
        curve = iter([-5.0, -6.0, -7.0, -8.0, -9.0, -10.0, -11.0])
        return lambda *a, **k: {"per_step": next(curve), "kl_per_step": 0.0}

    monkeypatch.setattr(loop_module, "evaluate_checked_bound", falling())
    cfg = TrainConfig(
        epochs=7,
        batch_size=4,
        lr=0.01,
        patience=3,
        plateau_patience=0,
        kl_start=0.2,
        kl_anneal_steps=8,
        schedule_during_annealing=False,
        progress=False,
    )
    history = fit(tiny_srnn(), toy_sequences(8), toy_sequences(3, seed=1), cfg, tmp_path / "a")
    assert [row["beta"] for row in history][:4] == pytest.approx([0.4, 0.6, 0.8, 1.0])
    assert len(history) == 6 and history.stop_reason == "patience"  # epochs 4, 5, 6 count
    # the scheduler's first reading is epoch 4 (its reference); epoch 5 is its first bad epoch
    assert [row["lr"] for row in history] == [0.01, 0.01, 0.01, 0.01, 0.01, 0.005]
    assert history.best_epoch == 1
    monkeypatch.setattr(loop_module, "evaluate_checked_bound", falling())
    no_annealing = TrainConfig(
        epochs=7, batch_size=4, lr=0.01, patience=3, plateau_patience=0, progress=False
    )
    history = fit(
        tiny_srnn(), toy_sequences(8), toy_sequences(3, seed=1), no_annealing, tmp_path / "b"
    )
    assert len(history) == 4 and [row["lr"] for row in history] == [0.01, 0.01, 0.005, 0.0025]


def test_schedule_during_annealing_steps_the_schedule_while_beta_rises(tmp_path, monkeypatch):
    """With schedule_during_annealing the falling bound of the test above halves the rate and
    counts towards patience from epoch 1 (beta 0.4), exactly as without annealing."""
    curve = iter([-5.0, -6.0, -7.0, -8.0, -9.0, -10.0, -11.0])
    monkeypatch.setattr(
        loop_module,
        "evaluate_checked_bound",
        lambda *a, **k: {"per_step": next(curve), "kl_per_step": 0.0},
    )
    cfg = TrainConfig(
        epochs=7,
        batch_size=4,
        lr=0.01,
        patience=3,
        plateau_patience=0,
        kl_start=0.2,
        kl_anneal_steps=8,
        schedule_during_annealing=True,
        progress=False,
    )
    history = fit(tiny_srnn(), toy_sequences(8), toy_sequences(3, seed=1), cfg, tmp_path)
    assert [row["beta"] for row in history] == pytest.approx([0.4, 0.6, 0.8, 1.0])
    assert history.stop_reason == "patience" and history.best_epoch == 1
    assert [row["lr"] for row in history] == [0.01, 0.01, 0.005, 0.0025]


def test_time_limit_counts_wall_or_training_seconds(tmp_path, monkeypatch):
    """A slow validation (0.6 s per epoch) stops a 1-s wall-clock limit after epoch 2, but not a
    1-s limit on training seconds (three tiny epochs train in well under a second)."""
    import time as _time

    def slow_bound(*args, **kwargs):
        _time.sleep(0.6)
        return {"per_step": -5.0, "kl_per_step": 0.0}

    monkeypatch.setattr(loop_module, "evaluate_checked_bound", slow_bound)
    common = dict(epochs=3, batch_size=4, lr=0.01, time_limit=1.0, progress=False)
    wall = fit(
        tiny_srnn(),
        toy_sequences(8),
        toy_sequences(3, seed=1),
        TrainConfig(**common),
        tmp_path / "wall",
    )
    assert len(wall) == 2 and wall.stop_reason == "time_limit"
    training = fit(
        tiny_srnn(),
        toy_sequences(8),
        toy_sequences(3, seed=1),
        TrainConfig(time_limit_counts="training", **common),
        tmp_path / "training",
    )
    assert sum(r["seconds"] for r in training) < 1.0
    assert len(training) == 3 and training.stop_reason == "epochs"
    with pytest.raises(ValueError, match="time_limit_counts"):
        TrainConfig(time_limit_counts="process").validate()


def test_time_limit_counts_cpu_seconds_of_the_training_epochs(tmp_path, monkeypatch):
    """With ``time_limit_counts="cpu"`` the limit sums the process's CPU seconds of the training
    epochs: a clock that a sleeping epoch (as if another job held the core) does not advance
    stops a 1-s limit only when the CPU seconds pass it."""
    calls = []

    def process_time():  # 0.6 CPU seconds between two readings (an epoch's start and end)
        calls.append(None)
        return 0.6 * len(calls)

    monkeypatch.setattr(loop_module.time, "process_time", process_time)
    config = TrainConfig(
        epochs=5, batch_size=4, lr=0.01, time_limit=1.0, time_limit_counts="cpu", progress=False
    )
    history = fit(tiny_srnn(), toy_sequences(8), None, config, tmp_path / "cpu")
    # 0.6 CPU seconds per epoch: the limit of 1 s is passed after epoch 2 of 5
    assert [r["cpu_seconds"] for r in history] == pytest.approx([0.6, 0.6])
    assert history.stop_reason == "time_limit"


def test_early_stopping(tmp_path):
    history = fit(
        tiny_srnn(),
        toy_sequences(8),
        toy_sequences(3, seed=1),
        TrainConfig(epochs=50, batch_size=4, lr=1e-9, patience=1, progress=False),
        tmp_path,
    )
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
    m = DMM(6, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8).double()
    m.eval()
    seqs = toy_sequences(5)
    torch.manual_seed(1)
    result = evaluate_bound(m, seqs, batch_size=2)
    torch.manual_seed(1)
    batches = list(SequenceLoader(seqs, 2, shuffle=False, dtype=torch.float64))
    expected = sum(-Trace_ELBO().loss(m.model, m.guide, x, mask) for x, mask in batches)
    assert (
        result["num_steps"] == sum(len(s) for s in seqs) == sum(int(mk.sum()) for _, mk in batches)
    )
    # float64 (fit and evaluate_bound pad in the model's dtype): same identity at 1e-9
    assert result["total"] == pytest.approx(expected, rel=1e-9)
    assert result["per_step"] == pytest.approx(expected / result["num_steps"], rel=1e-9)
    x, mask = batches[0]
    torch.manual_seed(2)
    terms = elbo_terms(m, x, mask)
    torch.manual_seed(2)
    elbo = -Trace_ELBO().loss(m.model, m.guide, x, mask)
    torch.manual_seed(2)
    zero = LatentScale(0.0)
    log_lik = -Trace_ELBO().loss(zero(m.model), zero(m.guide), x, mask)
    assert terms["elbo"].sum().item() == pytest.approx(elbo, rel=1e-9)
    assert terms["log_likelihood"].sum().item() == pytest.approx(log_lik, rel=1e-9)
    assert (terms["kl"] != 0).all()


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="kl_start"):
        TrainConfig(kl_start=2.0).validate()
    # a fixed schedule's settings under another schedule are refused, not silently ignored
    with pytest.raises(ValueError, match="lr_schedule='exponential'"):
        TrainConfig(lr_decay_after=50, lr_decay_factor=1.15).validate()
    with pytest.raises(ValueError, match="lr_schedule='exponential'"):
        TrainConfig(lr_schedule="exponential").validate()
    with pytest.raises(ValueError, match="lrd belongs to lr_schedule='constant'"):
        TrainConfig(lrd=0.999).validate()
    TrainConfig(lr_schedule="constant", lrd=0.999).validate()
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        TrainConfig(lr_schedule="cosine").validate()
    with pytest.raises(ValueError, match=r"plateau_factor must be in \(0, 1\)"):
        TrainConfig(plateau_factor=1.0).validate()
    with pytest.raises(ValueError, match="patience must be None"):
        TrainConfig(patience=0).validate()
    with pytest.raises(ValueError, match="init must be one of"):
        TrainConfig(init="xavier").validate()


def test_defaults_are_the_plateau_schedule_early_stopping_and_output_bias_init():
    cfg = TrainConfig()
    assert (
        cfg.lr_schedule,
        cfg.plateau_factor,
        cfg.plateau_patience,
        cfg.plateau_cooldown,
        cfg.plateau_min_lr,
        cfg.plateau_threshold,
    ) == ("plateau", 0.5, 3, 0, 1e-5, 1e-3)
    # early stopping where the third halving would come: two halvings, each given 4 epochs
    assert cfg.patience == 3 * (cfg.plateau_patience + 1) == 12
    # measured in benchmarks/diagnostics/train_defaults.py (docs/benchmarks.rst): the SRNN weights fitted
    # JSB faster and generalised worse; waiting for beta = 1 kept the full rate too long
    assert cfg.init == "bias" and cfg.schedule_during_annealing and cfg.plateau_restore_best


def test_a_checkpoint_of_another_schedule_is_refused(tmp_path):
    data = toy_sequences(6), toy_sequences(2, seed=1)
    fit(tiny_srnn(), *data, TrainConfig(epochs=1, batch_size=3, progress=False), tmp_path)
    cfg = TrainConfig(epochs=2, batch_size=3, lr_schedule="constant", progress=False)
    with pytest.raises(
        ValueError,
        match="was written with lr_schedule='plateau'; resume with "
        "the same schedule \\(got 'constant'\\)",
    ):
        fit(tiny_srnn(), *data, cfg, tmp_path)


def test_float64_models_train_and_evaluate_on_float64_batches(tmp_path):
    # data are padded in the model's dtype (the loader's float32 default broke float64 models)
    from pyro_seq.models import RNNBaseline

    torch.manual_seed(0)
    m = RNNBaseline(6, d_dim=4, hidden_dim=4).double()
    seqs = toy_sequences(6)
    history = fit(
        m,
        seqs[:4],
        seqs[4:],
        TrainConfig(epochs=1, batch_size=2, progress=False, init="none"),
        tmp_path / "run",
    )
    assert len(history) == 1
    for method in ("elbo", "iwae", "smc"):
        result = evaluate_bound(m, seqs, batch_size=3, method=method, num_particles=2)
        assert math.isfinite(result["per_step"])
    # the exact log-likelihood of the no-latent model, in float64, on every path
    from pyro_seq.data import pad_sequences

    x, mask = pad_sequences(seqs, dtype=torch.float64)
    with torch.no_grad():
        exact = float(m.log_likelihood(x, mask).sum())
    assert evaluate_bound(m, seqs, method="iwae", num_particles=2)["total"] == pytest.approx(
        exact, rel=1e-12
    )


@pytest.mark.parametrize("monitor", ["objective", "elbo"])
def test_iwae_training_is_judged_by_its_own_bound(tmp_path, monitor):
    # early stopping, the plateau schedule and best.pt watch IWAE_K for a model trained with it
    torch.manual_seed(0)
    m = DMM(6, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8)
    seqs = toy_sequences(8)
    cfg = TrainConfig(
        epochs=3, batch_size=4, objective="iwae", num_particles=3, progress=False, monitor=monitor
    )
    history = fit(m, seqs[:6], seqs[6:], cfg, tmp_path / "run")
    watched = [row["valid_bound_per_step"] for row in history]
    elbos = [row["valid_elbo_per_step"] for row in history]
    if monitor == "elbo":
        assert watched == elbos
    else:
        assert all(w != e for w, e in zip(watched, elbos))
    best = max(range(len(watched)), key=lambda i: (watched[i], -i))
    assert history.best_epoch == history[best]["epoch"]
    assert history.best_valid_elbo_per_step == watched[best]


def test_training_with_missing_steps_passes_observed_masks(tmp_path, monkeypatch):
    """Appendix 6.10: every update sees an ``observed`` mask with the configured drop rate, the
    first steps kept, drawn reproducibly from (seed, update); without it nothing is passed."""
    from pyro.infer import SVI

    seen = []
    original = SVI.step

    def spy(self, *args, **kwargs):
        seen.append((args[1].clone(), kwargs.get("observed")))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SVI, "step", spy)
    train = [(torch.rand(30, 6) < 0.3).float() for _ in range(40)]
    cfg = dict(batch_size=10, progress=False, patience=None, missing_prob=0.4, missing_keep_first=2)
    fit(tiny_srnn(), train, None, TrainConfig(epochs=2, **cfg), tmp_path / "a")
    first = [o.clone() for _, o in seen]
    assert len(first) == 8 and all(o is not None for o in first)
    dropped = torch.cat([~o[:, 2:] for o in first]).float().mean().item()
    se = math.sqrt(0.4 * 0.6 / (80 * 28))
    assert abs(dropped - 0.4) < 5 * se
    assert all(bool(o[:, :2].all()) for o in first)
    seen.clear()
    fit(tiny_srnn(), train, None, TrainConfig(epochs=2, **cfg), tmp_path / "b")
    assert all(torch.equal(a, o) for a, (_, o) in zip(first, seen))  # reproducible
    seen.clear()
    fit(
        tiny_srnn(),
        train,
        None,
        TrainConfig(epochs=1, batch_size=10, progress=False),
        tmp_path / "c",
    )
    assert all(o is None for _, o in seen)
    with pytest.raises(ValueError, match="missing_prob"):
        TrainConfig(missing_prob=1.0).validate()


def test_fit_validates_the_sequences_once_and_builds_their_batches_once(tmp_path, monkeypatch):
    """fit checks the training and validation sequences once, before training; the validation
    bound of every epoch reuses one set of batches and checks nothing again (the public
    evaluate_bound still checks what it is given)."""
    from pyro_seq.data import batching
    from pyro_seq.train import evaluate as evaluate_module

    checked, built = [], []
    real_check = evaluate_module.validate_sequence_list

    def check(seqs, obs_dim=None, binary=False, name="sequences", **kwargs):
        checked.append(name)
        return real_check(seqs, obs_dim, binary, name, **kwargs)

    class CountingLoader(batching.SequenceLoader):
        def __init__(self, seqs, *args, **kwargs):
            built.append(len(seqs))
            super().__init__(seqs, *args, **kwargs)

    for module in (loop_module, evaluate_module):
        monkeypatch.setattr(module, "validate_sequence_list", check)
        monkeypatch.setattr(module, "SequenceLoader", CountingLoader)
    train, valid = toy_sequences(8), toy_sequences(3, seed=1)
    cfg = TrainConfig(epochs=3, batch_size=4, progress=False, patience=None)
    history = fit(tiny_srnn(), train, valid, cfg, tmp_path / "run")
    assert len(history) == 3 and all("valid_elbo_per_step" in row for row in history)
    assert checked == ["train", "valid"]
    assert built == [8, 3]  # the training batches and the validation batches, once each
    checked.clear()
    evaluate_bound(tiny_srnn(), valid)
    assert checked == ["sequences"]
    bad = valid[:2] + [torch.full((4, 6), 0.5)]  # not binary: the SRNN's Bernoulli refuses it
    with pytest.raises(ValueError, match=r"^valid\[2\]: "):
        fit(tiny_srnn(), train, bad, cfg, tmp_path / "bad")
    with pytest.raises(ValueError, match=r"^sequences\[2\]: "):
        evaluate_bound(tiny_srnn(), bad)


def test_lr_multiplier_matches_the_longest_parameter_name_prefix():
    m = tiny_srnn()
    m.lr_multipliers = {"emitter": 10.0, "emitter.2": 3.0, "prior.first.weight": 0.5}
    f = trainer_module.lr_multiplier
    assert f(m, "srnn$$$emitter.0.weight") == 10.0
    assert f(m, "srnn.emitter.2.bias") == 3.0  # the longer key wins
    assert f(m, "prior.first.weight") == 0.5  # a model-relative name
    assert f(m, "srnn$$$prior.first.bias") == 1.0
    m.lr_multipliers = {"M": 10.0}
    assert f(m, "gtmsm$$$M_direction") == 1.0  # a key is a name or a dotted prefix
    assert f(None, "srnn$$$emitter.0.weight") == 1.0


def _rates_in_checkpoint(path):
    return {
        name: [g["lr"] for g in (s.get("optimizer", s))["param_groups"]]
        for name, s in load_checkpoint(path)["optimizer"].items()
    }


@pytest.mark.parametrize("schedule", ["constant", "exponential", "plateau"])
def test_lr_multipliers_scale_each_parameters_rate_under_every_schedule(tmp_path, schedule):
    """Adam's first update moves every coordinate with a nonzero gradient by the rate (its
    direction is g / (|g| + eps)), so one update shows each parameter's rate; the schedules
    move the multiplied rates with the base rate, and the history logs the base rate."""
    train, valid = toy_sequences(4), toy_sequences(2, seed=1)
    cfg = dict(
        batch_size=8,
        lr=1e-3,
        lr_schedule=schedule,
        progress=False,
        init="none",
        plateau_patience=0,
        plateau_threshold=1e9,
        patience=None,
    )
    # plateau: every epoch is bad and the rate halves each time; exponential: / 4 per epoch
    if schedule == "exponential":
        cfg.update(lr_decay_after=1, lr_decay_factor=4.0)
    m = tiny_srnn()
    m.lr_multipliers = {"emitter": 10.0}
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    history = fit(m, train, valid, TrainConfig(epochs=1, **cfg), tmp_path / "one")
    for name, p in m.named_parameters():
        step = (p.detach() - before[name]).abs()
        step = step[step > 0]
        rate = 1e-2 if name.startswith("emitter.") else 1e-3
        # tiny gradients (|g| near eps = 1e-8) move a little less: 0.988 of the rate at worst
        assert step.numel() > 0, name
        assert torch.allclose(step, torch.full_like(step, rate), rtol=0.02), name
    assert history[0]["lr"] == 1e-3
    m = tiny_srnn()
    m.lr_multipliers = {"emitter": 10.0}
    history = fit(m, train, valid, TrainConfig(epochs=2, **cfg), tmp_path / "two")
    # the log holds the rate of the epoch's updates; the plateau rule halves it after epoch 2
    assert history[-1]["lr"] == pytest.approx(
        1e-3 / 4 if schedule == "exponential" else 1e-3, rel=1e-12
    )
    base = {"constant": 1e-3, "exponential": 1e-3 / 4, "plateau": 1e-3 / 2}[schedule]
    rates = _rates_in_checkpoint(tmp_path / "two" / "checkpoint.pt")
    for name, groups in rates.items():
        factor = 10.0 if ".emitter." in name.replace("$$$", ".") else 1.0
        assert groups == pytest.approx([base * factor], rel=1e-12), name
    # resuming an exponential schedule rewrites the saved rates: still multiplied
    m2 = tiny_srnn()
    m2.lr_multipliers = {"emitter": 10.0}
    fit(m2, train, valid, TrainConfig(epochs=3, **cfg), tmp_path / "two")
    rates = _rates_in_checkpoint(tmp_path / "two" / "checkpoint.pt")
    base = {"constant": 1e-3, "exponential": 1e-3 / 16, "plateau": 1e-3 / 4}[schedule]
    for name, groups in rates.items():
        factor = 10.0 if ".emitter." in name.replace("$$$", ".") else 1.0
        assert groups == pytest.approx([base * factor], rel=1e-12), name


def test_fit_returns_the_model_in_eval_mode_so_dropout_is_off_afterwards(tmp_path):
    """After ``fit`` a STORN with dropout generates as the model without it: same weights, same
    seed, same draws (in training mode its RNN inputs would be dropped)."""
    from pyro_seq.models import STORN

    model = STORN(6, z_dim=2, rnn_dim=8, emission_dim=8, dropout=0.5)
    config = TrainConfig(epochs=1, batch_size=4, lr=0.01, progress=False)
    fit(model, toy_sequences(8), toy_sequences(3, seed=1), config, tmp_path / "run")
    assert not model.training and not any(m.training for m in model.modules())
    plain = STORN(6, z_dim=2, rnn_dim=8, emission_dim=8)
    plain.load_state_dict(model.state_dict())
    plain.eval()
    draws = []
    for m in (model, plain):
        torch.manual_seed(3)
        draws.append(m.generate(4, 5)[0])
    assert torch.equal(draws[0], draws[1])
