"""Resume through :func:`pyro_seq.train.fit` from mutated checkpoints.

A checkpoint written by one epoch of a tiny SRNN run is altered in its *content* (a loadable
file with a wrong value: a missing or extra key, a weight of another shape or with NaN, a
weight dropped, an epoch or step that is negative or not an integer, a history that is not a
list of rows, an RNG state of the wrong kind, ``extra`` or the optimizer state not a dict) or in
its *bytes*. Resuming must then either continue training (the mutation left a valid checkpoint)
or raise :class:`~pyro_seq.train.CheckpointError` naming the file and what is wrong: never
another exception, never NaN weights after training.
"""

import copy
import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pyro_seq.models import SRNN
from pyro_seq.train import CheckpointError, TrainConfig, fit
from pyro_seq.train.checkpoint import _atomic_save

from .support import examples, expect_documented

pytestmark = pytest.mark.fuzz

CONFIG = dict(batch_size=4, lr=0.01, progress=False, valid_batch_size=4)


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.rand(int(L), 5, generator=g) < 0.3).float()
        for L in torch.randint(2, 6, (n,), generator=g)
    ]


TRAIN, VALID = _data(8, 0), _data(3, 1)


def _model():
    torch.manual_seed(0)
    return SRNN(5, d_dim=4, z_dim=2, hidden_dim=4)


def _reference_payload():
    with tempfile.TemporaryDirectory() as folder:
        fit(_model(), TRAIN, VALID, TrainConfig(epochs=1, **CONFIG), folder)
        return torch.load(Path(folder) / "checkpoint.pt", weights_only=True)


PAYLOAD = _reference_payload()
WEIGHTS = sorted(PAYLOAD["model"])

MUTATIONS = {
    "none": lambda p, d: None,
    "drop_key": lambda p, d: p.pop(d(st.sampled_from(sorted(p)))),
    "extra_key": lambda p, d: p.__setitem__("surprise", 1),
    "drop_weight": lambda p, d: p["model"].pop(d(st.sampled_from(WEIGHTS))),
    "extra_weight": lambda p, d: p["model"].__setitem__("ghost.weight", torch.zeros(2)),
    "weight_shape": lambda p, d: p["model"].__setitem__(
        d(st.sampled_from(WEIGHTS)), torch.zeros(d(st.integers(1, 3)), 7)
    ),
    "weight_nan": lambda p, d: (
        p["model"][d(st.sampled_from(WEIGHTS))]
        .view(-1)
        .__setitem__(0, float(d(st.sampled_from(["nan", "inf"]))))
    ),
    "weight_not_tensor": lambda p, d: p["model"].__setitem__(d(st.sampled_from(WEIGHTS)), 1.5),
    "model_not_dict": lambda p, d: p.__setitem__("model", [1, 2]),
    "epoch": lambda p, d: p.__setitem__("epoch", d(st.sampled_from([-1, 2.5, "1", None]))),
    "global_step": lambda p, d: p.__setitem__("global_step", d(st.sampled_from([-3, 1.5, "x"]))),
    "history": lambda p, d: p.__setitem__(
        "history", d(st.sampled_from([None, "rows", [1, 2], {"epoch": 1}]))
    ),
    "torch_rng": lambda p, d: p.__setitem__(
        "torch_rng", d(st.sampled_from([torch.zeros(3, dtype=torch.uint8), torch.zeros(5), None]))
    ),
    "extra": lambda p, d: p.__setitem__("extra", d(st.sampled_from([None, [1], "best"]))),
    "optimizer": lambda p, d: p.__setitem__("optimizer", d(st.sampled_from([None, [1], "adam"]))),
}


@examples(0.8)
@given(st.data(), st.sampled_from(sorted(MUTATIONS)))
def test_resume_continues_or_names_the_defect(data, mutation):
    payload = copy.deepcopy(PAYLOAD)
    MUTATIONS[mutation](payload, data.draw)
    with tempfile.TemporaryDirectory() as folder:
        _atomic_save(payload, Path(folder) / "checkpoint.pt")
        _atomic_save(PAYLOAD["model"], Path(folder) / "best.pt")
        model = _model()
        try:
            history = fit(model, TRAIN, VALID, TrainConfig(epochs=2, **CONFIG), folder)
        except Exception as e:  # noqa: BLE001 - the property is about which exceptions escape
            assert mutation not in ("none", "extra_key"), f"valid checkpoint refused: {e}"
            expect_documented(e, r"^checkpoint .*checkpoint\.pt ", types=(CheckpointError,))
            return
    assert mutation in ("none", "extra_key"), f"{mutation} accepted"
    assert len(history) == 2 and history[0] == PAYLOAD["history"][0]
    assert all(math.isfinite(r["train_loss_per_step"]) for r in history)
    for name, p in model.named_parameters():
        assert bool(torch.isfinite(p).all()), name


def test_a_checkpoint_of_another_model_is_named_as_such(tmp_path):
    _atomic_save(PAYLOAD, tmp_path / "checkpoint.pt")
    torch.manual_seed(0)
    other = SRNN(5, d_dim=6, z_dim=2, hidden_dim=4)
    with pytest.raises(
        CheckpointError,
        match=r"^checkpoint .*checkpoint\.pt does not fit this "
        r"model \(.*size mismatch.*\); resume with the "
        r"model it was written for",
    ):
        fit(other, TRAIN, VALID, TrainConfig(epochs=2, **CONFIG), tmp_path)


def test_a_missing_best_pt_keeps_the_last_weights_with_a_warning(tmp_path):
    fit(_model(), TRAIN, VALID, TrainConfig(epochs=1, **CONFIG), tmp_path)
    (tmp_path / "best.pt").unlink()
    model = _model()
    # resumed with nothing left to train: fit restores the checkpoint and then looks for best.pt
    with pytest.warns(
        RuntimeWarning, match="best.pt is missing: the model keeps the weights of the last epoch"
    ):
        history = fit(model, TRAIN, VALID, TrainConfig(epochs=1, **CONFIG), tmp_path)
    assert not history.restored_best and history.best_epoch == 1
    last = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in last.items())
