"""fit() with an energy-based model: contrastive divergence, pseudo-likelihood validation,
visible-bias initialisation, and refusals of mismatched objectives."""

import pytest
import torch

from pyro_seq.models import RTRBM, SRNN
from pyro_seq.train import TrainConfig, evaluate_bound, fit


def _seqs(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(6 + i % 3, 5, generator=g) < 0.3).float() for i in range(n)]


def test_fit_rtrbm_with_cd(tmp_path):
    train, valid = _seqs(12, 0), _seqs(4, 1)
    model = RTRBM(5, 3)
    config = TrainConfig(epochs=3, batch_size=4, objective="cd", cd_steps=2, progress=False)
    history = fit(model, train, valid, config, tmp_path)
    assert len(history) == 3
    assert all("valid_pll_per_step" in row and "valid_elbo_per_step" not in row for row in history)
    # the CD monitor (mean squared reconstruction error per unit), not a loss per step
    assert all(
        0 <= row["train_reconstruction_error"] <= 1 and "train_loss_per_step" not in row
        for row in history
    )
    best = max(row["valid_pll_per_step"] for row in history)
    assert history.best_valid_elbo_per_step == best and history.restored_best
    pll = evaluate_bound(model, valid, method="pseudo_likelihood")
    assert abs(pll["per_step"] - best) < 1e-9  # the restored weights are the best epoch's
    exact = evaluate_bound(model, valid, method="exact")
    assert exact["per_step"] < 0 and (tmp_path / "loss_curve.png").exists()


def test_initialisation_sets_the_visible_bias_from_frequencies(tmp_path):
    train = _seqs(10, 2)
    model = RTRBM(5, 3)
    fit(model, train, [], TrainConfig(epochs=0, objective="cd", progress=False), tmp_path)
    freq = torch.cat(train).mean(0).clamp(1e-3, 1 - 1e-3)
    assert torch.allclose(model.c.detach(), torch.logit(freq), atol=1e-6)


def test_mismatched_objectives_are_refused(tmp_path):
    train = _seqs(4, 3)
    with pytest.raises(ValueError, match="energy-based"):
        fit(RTRBM(5, 3), train, [], TrainConfig(epochs=1, progress=False), tmp_path / "a")
    with pytest.raises(ValueError, match="energy-based"):
        fit(
            SRNN(5, d_dim=4, z_dim=2, hidden_dim=4),
            train,
            [],
            TrainConfig(epochs=1, objective="cd", progress=False),
            tmp_path / "b",
        )
    with pytest.raises(ValueError, match="cd_steps"):
        TrainConfig(objective="cd", cd_steps=0).validate()
    with pytest.raises(ValueError, match="energy-based"):
        evaluate_bound(RTRBM(5, 3), train, method="elbo")
    with pytest.raises(ValueError, match="energy-based models"):
        evaluate_bound(SRNN(5, d_dim=4, z_dim=2, hidden_dim=4), train, method="ais")


def test_progress_bar_counts_the_batches_and_leaves_the_estimate_alone(capsys):
    """``progress=True`` draws one bar over the batches (3 batches of at most 2 of 5
    sequences) on stderr and gives the same exact log-likelihood as without it."""
    model, seqs = RTRBM(5, 3), _seqs(5, 3)
    quiet = evaluate_bound(model, seqs, batch_size=2, method="exact")
    assert capsys.readouterr().err == ""
    shown = evaluate_bound(model, seqs, batch_size=2, method="exact", progress=True)
    err = capsys.readouterr().err
    assert "exact" in err and "3/3" in err
    assert shown["total"] == quiet["total"]
