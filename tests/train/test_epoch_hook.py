"""fit's ``on_epoch`` hook: called once per epoch, in order, on the weights of that epoch; its
numbers join the log rows (history, log.json, log.csv, checkpoint) and survive a resume."""

import csv
import json
import math

import pytest
import torch

from pyro_seq.models import SRNN
from pyro_seq.train import TrainConfig, fit


def toy_sequences(n, seed=0, D=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=g)
    return [(torch.rand(int(L), D, generator=g) < 0.3).float() for L in lengths]


def tiny_srnn():
    torch.manual_seed(0)
    return SRNN(6, d_dim=8, z_dim=3, hidden_dim=8)


TRAIN = toy_sequences(12)
CFG = dict(batch_size=5, lr=0.01, progress=False, lr_schedule="constant", patience=None)


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_hook_sees_every_epoch_in_order_with_the_weights_of_that_epoch(tmp_path):
    """The snapshot the hook takes after epoch e equals the weights of a separate run of e + 1
    epochs (no validation: fit returns the last weights); the row it gets is the epoch's."""
    seen, rows = [], []

    def hook(epoch, model, row):
        seen.append((epoch, snapshot(model)))
        rows.append(row)
        return {"sum_of_weights": float(sum(p.detach().sum() for p in model.parameters()))}

    model = tiny_srnn()
    history = fit(model, TRAIN, [], TrainConfig(epochs=3, **CFG), tmp_path / "hook", on_epoch=hook)
    assert [e for e, _ in seen] == [0, 1, 2]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["train_loss_per_step"] for r in rows] == [r["train_loss_per_step"] for r in history]
    for epoch, weights in seen:  # brute force: train epoch + 1 epochs from scratch
        alone = tiny_srnn()
        fit(alone, TRAIN, [], TrainConfig(epochs=epoch + 1, **CFG), tmp_path / f"e{epoch}")
        assert same(weights, snapshot(alone)), epoch
        expected = float(sum(p.detach().sum() for p in alone.parameters()))
        assert history[epoch]["sum_of_weights"] == expected
    assert same(seen[-1][1], snapshot(model))


def test_a_hook_that_draws_random_numbers_does_not_change_the_training(tmp_path):
    """Under fork_rng: the weights equal those of a run without the hook."""
    plain = tiny_srnn()
    fit(plain, TRAIN, [], TrainConfig(epochs=2, **CFG), tmp_path / "plain")
    hooked = tiny_srnn()
    fit(
        hooked,
        TRAIN,
        [],
        TrainConfig(epochs=2, **CFG),
        tmp_path / "hooked",
        on_epoch=lambda epoch, model, row: {"noise": float(torch.randn(100).sum())},
    )
    assert same(snapshot(plain), snapshot(hooked))


def test_hook_values_are_in_the_history_the_logs_and_a_resumed_run(tmp_path):
    """The values land in the returned rows, log.json and log.csv; a second call on the same
    folder resumes: it calls the hook for the new epochs only and returns all rows, equal to an
    uninterrupted run's."""
    calls = []

    def hook(epoch, model, row):
        calls.append(epoch)
        return {"double_epoch": 2 * row["epoch"], "loss_squared": row["train_loss_per_step"] ** 2}

    straight = fit(
        tiny_srnn(), TRAIN, [], TrainConfig(epochs=4, **CFG), tmp_path / "a", on_epoch=hook
    )
    assert calls == [0, 1, 2, 3]
    for row in straight:
        assert row["double_epoch"] == 2 * row["epoch"] and isinstance(row["double_epoch"], int)
        assert row["loss_squared"] == row["train_loss_per_step"] ** 2
    logged = json.loads((tmp_path / "a" / "log.json").read_text())
    assert [r["double_epoch"] for r in logged] == [2, 4, 6, 8]
    with open(tmp_path / "a" / "log.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [float(r["loss_squared"]) for r in table] == [r["loss_squared"] for r in straight]

    calls.clear()
    fit(tiny_srnn(), TRAIN, [], TrainConfig(epochs=2, **CFG), tmp_path / "b", on_epoch=hook)
    resumed = fit(
        tiny_srnn(), TRAIN, [], TrainConfig(epochs=4, **CFG), tmp_path / "b", on_epoch=hook
    )
    assert calls == [0, 1, 2, 3]  # 0, 1 in the first call, 2, 3 in the resumed one
    keys = ("epoch", "double_epoch", "loss_squared", "train_loss_per_step")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in straight]


def test_without_a_hook_the_rows_have_fit_columns_only(tmp_path):
    history = fit(tiny_srnn(), TRAIN, [], TrainConfig(epochs=1, **CFG), tmp_path)
    assert set(history[0]) == {
        "epoch",
        "step",
        "beta",
        "lr",
        "seconds",
        "cpu_seconds",
        "train_loss_per_step",
    }


@pytest.mark.parametrize(
    "values, match",
    [
        ({"score": math.nan}, "'score': nan at epoch 1"),
        ({"score": math.inf}, "'score': inf at epoch 1"),
        ({"score": "0.5"}, "'score': '0.5' at epoch 1"),
        ({"score": True}, "'score': True at epoch 1"),
        ({"score": torch.tensor(0.5)}, "'score'"),
        ({"score": [0.5, 0.25]}, "'score'"),
        ({"lr": 0.5}, "name 'lr' at epoch 1, which the log row already has"),
    ],
)
def test_a_bad_value_is_a_value_error_naming_the_key_and_nothing_is_saved(tmp_path, values, match):
    with pytest.raises(ValueError, match=match):
        fit(
            tiny_srnn(),
            TRAIN,
            [],
            TrainConfig(epochs=2, **CFG),
            tmp_path,
            on_epoch=lambda epoch, model, row: values,
        )
    assert not (tmp_path / "checkpoint.pt").exists()  # raised before the first checkpoint


def test_a_hook_that_is_not_callable_or_returns_no_mapping_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="on_epoch must be a function"):
        fit(tiny_srnn(), TRAIN, [], TrainConfig(epochs=1, **CFG), tmp_path, on_epoch=3)
    with pytest.raises(TypeError, match="must return a dict of numbers or None, got list"):
        fit(
            tiny_srnn(),
            TRAIN,
            [],
            TrainConfig(epochs=1, **CFG),
            tmp_path,
            on_epoch=lambda epoch, model, row: [1.0],
        )


def test_a_hook_is_refused_with_several_processes(tmp_path):
    with pytest.raises(ValueError, match="one process only"):
        fit(
            tiny_srnn(),
            TRAIN,
            [],
            TrainConfig(epochs=1, world_size=2, **CFG),
            tmp_path,
            on_epoch=lambda epoch, model, row: None,
        )


def test_hook_runs_after_the_validation_of_its_epoch(tmp_path):
    """The row it gets already holds the epoch's validation bound, the one in the history."""
    got = []
    history = fit(
        tiny_srnn(),
        TRAIN,
        toy_sequences(4, seed=1),
        TrainConfig(epochs=2, **CFG),
        tmp_path,
        on_epoch=lambda epoch, model, row: got.append(row["valid_elbo_per_step"]),
    )
    assert got == [row["valid_elbo_per_step"] for row in history]
