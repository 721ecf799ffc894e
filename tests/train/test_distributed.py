"""Data-parallel fit on torch.distributed (gloo, CPU): the same parameters as one process for a
deterministic objective, a clear error when a rank dies, refusals on resume."""

import os
import time

import pytest
import torch

from pyro_seq.models import SRNN, RNNBaseline
from pyro_seq.train import TrainConfig, fit, load_checkpoint


def _seqs(n, seed, D=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(4 + i % 5, D, generator=g) < 0.3).double() for i in range(n)]


def _config(**kw):
    base = dict(
        epochs=1,
        batch_size=4,
        lr=0.01,
        lr_schedule="constant",
        patience=None,
        progress=False,
        seed=3,
        num_threads=1,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_two_processes_with_half_batches_equal_one_process(tmp_path):
    """RNNBaseline has no latent sites: the ELBO is its exact log-likelihood, so the summed
    gradients of two half batches are the whole batch's, and 5 Adam steps agree to 1e-6."""
    train = _seqs(20, 0)  # 5 updates of 4 sequences (2 per rank)
    one = RNNBaseline(5, d_dim=6, hidden_dim=6).double()
    two = RNNBaseline(5, d_dim=6, hidden_dim=6).double()
    two.load_state_dict(one.state_dict())
    h1 = fit(one, train, [], _config(), tmp_path / "one")
    h2 = fit(two, train, [], _config(world_size=2), tmp_path / "two")
    assert [r["step"] for r in h2] == [5]
    assert abs(h1[0]["train_loss_per_step"] - h2[0]["train_loss_per_step"]) <= 1e-9 * abs(
        h1[0]["train_loss_per_step"]
    )
    a = load_checkpoint(tmp_path / "one" / "checkpoint.pt")["model"]
    b = load_checkpoint(tmp_path / "two" / "checkpoint.pt")["model"]
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-6, atol=1e-12), name
    for name, p in two.state_dict().items():  # the parent's model holds the result
        assert torch.equal(p, b[name]), name
    # a last batch smaller than the number of ranks: the empty rank adds zero gradients
    odd = _seqs(5, 1)
    h3 = fit(
        RNNBaseline(5, d_dim=6, hidden_dim=6).double(),
        odd,
        [],
        _config(batch_size=3, world_size=4),
        tmp_path / "four",
    )
    assert h3[0]["step"] == 2


def test_stochastic_objective_with_validation_and_early_stopping(tmp_path):
    train, valid = _seqs(12, 2), _seqs(5, 3)
    model = SRNN(5, d_dim=4, z_dim=2, hidden_dim=4).double()
    cfg = _config(
        epochs=3, objective="iwae", num_particles=2, lr_schedule="plateau", patience=5, world_size=2
    )
    history = fit(model, train, valid, cfg, tmp_path)
    assert len(history) == 3 and history.restored_best
    assert all(torch.isfinite(torch.tensor(r["valid_bound_per_step"])) for r in history)
    assert history.best_valid_elbo_per_step == max(r["valid_bound_per_step"] for r in history)
    saved = load_checkpoint(tmp_path / "checkpoint.pt")["extra"]
    assert saved["world_size"] == 2 and len(saved["rng_states"]) == 2
    with pytest.raises(ValueError, match="world_size=2"):
        fit(
            SRNN(5, d_dim=4, z_dim=2, hidden_dim=4).double(),
            train,
            valid,
            _config(epochs=4, objective="iwae", num_particles=2, lr_schedule="plateau"),
            tmp_path,
        )


class DyingRNN(RNNBaseline):
    """Rank 1 exits abruptly in its third pass over a batch (``model_init`` starts each)."""

    calls = 0

    def model_init(self, *args, **kwargs):
        import torch.distributed as dist

        DyingRNN.calls += 1
        if dist.is_initialized() and dist.get_rank() == 1 and DyingRNN.calls == 3:
            os._exit(3)
        return super().model_init(*args, **kwargs)


def test_a_dying_rank_stops_the_others_with_a_clear_error(tmp_path):
    started = time.time()
    with pytest.raises(RuntimeError, match="distributed training failed"):
        fit(
            DyingRNN(5, d_dim=4, hidden_dim=4).double(),
            _seqs(40, 4),
            [],
            _config(epochs=3, world_size=2, dist_timeout=20.0),
            tmp_path,
        )
    assert time.time() - started < 60


def test_cli_nproc(tiny_pickle, tmp_path, capsys):
    from pyro_seq.cli import main

    out = tmp_path / "rnn2"
    assert (
        main(
            [
                "train",
                "--model",
                "rnn",
                "--data",
                str(tiny_pickle),
                "--epochs",
                "1",
                "--quiet",
                "--batch-size",
                "4",
                "--nproc",
                "2",
                "--threads",
                "1",
                "--out",
                str(out),
                "--model-option",
                "d_dim=4",
                "--model-option",
                "hidden_dim=4",
            ]
        )
        == 0
    )
    assert "test ELBO" in capsys.readouterr().out
    assert load_checkpoint(out / "checkpoint.pt")["extra"]["world_size"] == 2


def test_cd_monitor_is_the_whole_batch_mean_not_the_sum_over_ranks(tmp_path):
    """Contrastive divergence returns a *mean* per visible element (its monitor), not a sum over
    sequences: two ranks must report the mean over both shards' elements. One update (one batch
    of all 8 sequences, uneven lengths): the monitor is computed before the step from the same
    initial weights on both runs, so the values agree to rounding."""
    from pyro_seq.models import RTRBM

    g = torch.Generator().manual_seed(5)
    train = [(torch.rand(3 + 2 * i, 5, generator=g) < 0.3).double() for i in range(8)]
    one, two = RTRBM(5, 3).double(), RTRBM(5, 3).double()
    two.load_state_dict(one.state_dict())
    cfg = dict(objective="cd", batch_size=8, init="none")
    h1 = fit(one, train, [], _config(**cfg), tmp_path / "one")
    h2 = fit(two, train, [], _config(world_size=2, **cfg), tmp_path / "two")
    a, b = h1[0]["train_reconstruction_error"], h2[0]["train_reconstruction_error"]
    assert 0 < a < 1 and abs(a - b) <= 1e-9 * a, (a, b)


def test_free_bits_is_refused_with_several_processes(tmp_path):
    """Free bits clamps a group's KL summed over the whole minibatch (max(lambda S, sum KL)):
    the sum over ranks of per-shard clamps is another objective, so fit refuses before
    spawning or writing anything."""
    with pytest.raises(ValueError, match="free_bits"):
        TrainConfig(free_bits=0.5, world_size=2).validate()
    TrainConfig(free_bits=0.5).validate()  # one process: fine
    TrainConfig(world_size=2).validate()
    with pytest.raises(ValueError, match="free bits"):
        fit(
            SRNN(5, d_dim=4, z_dim=2, hidden_dim=4),
            _seqs(8, 0),
            [],
            _config(free_bits=0.5, world_size=2),
            tmp_path / "run",
        )
    assert not (tmp_path / "run").exists()


def test_shards_are_cut_to_their_own_longest_sequence():
    """Rows rank::N, then the padding beyond the shard's longest sequence is dropped (it scores
    exactly 0); an empty shard stays empty."""
    from pyro_seq.train.distributed import ProcessGroup

    lengths = torch.tensor([9, 3, 7, 2, 4])
    mask = torch.arange(9) < lengths[:, None]
    x = torch.randn(5, 9, 2)
    u = torch.randn(5, 9, 3)
    for rank, (rows, longest) in enumerate((([0, 2, 4], 9), ([1, 3], 3))):
        xs, ms, us = ProcessGroup(rank, 2).shard(x, mask, u)
        assert torch.equal(xs, x[rows, :longest]) and torch.equal(ms, mask[rows, :longest])
        assert torch.equal(us, u[rows, :longest])  # known inputs follow their rows
        assert ProcessGroup(rank, 2).shard(x, mask)[2] is None
    xs, ms, us = ProcessGroup(5, 6).shard(x, mask, u)
    assert xs.shape[0] == 0 and ms.shape[0] == 0 and us.shape[0] == 0


def test_parameters_no_rank_touched_keep_no_gradient_and_no_optimizer_state(tmp_path):
    """The KVAE's dynamics network is frozen (run under no_grad) during its warm-up, so one
    process leaves its gradients None and Adam never steps it (state {}). The all-reduce must
    not turn None into zeros: with two processes its Adam state stays {} too (it was
    {step: 2} after 2 updates when None was sent as zeros), and the weights stay put."""
    from pyro_seq.models import KVAE

    g = torch.Generator().manual_seed(0)
    train = [(torch.rand(3 + i % 2, 4, generator=g) < 0.4).double() for i in range(8)]
    kw = dict(
        image_shape=(2, 2),
        encoder="mlp",
        hidden_dims=(3,),
        a_dim=2,
        z_dim=2,
        num_modes=2,
        lstm_dim=3,
        dynamics_warmup_epochs=5,
    )
    one = KVAE(**kw).double()
    two = KVAE(**kw).double()
    two.load_state_dict(one.state_dict())
    before = {k: v.clone() for k, v in one.state_dict().items()}
    states = {}
    for n, model in ((1, one), (2, two)):  # 2 updates of 4 sequences (2 per rank)
        history = fit(model, train, [], _config(world_size=n), tmp_path / str(n))
        assert history[-1]["step"] == 2
        states[n] = load_checkpoint(tmp_path / str(n) / "checkpoint.pt")["optimizer"]
    # the dynamics network (the LSTM's 4 tensors, the output layer's 2) and its first input a0
    frozen = {k for k in states[1] if "$$$dynamics." in k or k.endswith("$$$a0")}
    assert len(frozen) == 7
    for n in (1, 2):
        assert sorted(states[n]) == sorted(states[1])  # the same parameters were seen
        assert {k: v["state"] for k, v in states[n].items() if k in frozen} == {
            k: {} for k in frozen
        }, n
        # everything else was stepped twice on both runs
        assert all(v["state"][0]["step"] == 2 for k, v in states[n].items() if k not in frozen)
        weights = load_checkpoint(tmp_path / str(n) / "checkpoint.pt")["model"]
        for k, _ in one.named_parameters():  # the frozen ones alone are where they started
            assert torch.equal(weights[k], before[k]) == (f"kvae$$${k}" in frozen), (n, k)
