"""fit under torchrun: two single-process "nodes" on this machine join the group that torchrun's
environment describes and train to the same weights, bit for bit, as fit's own two spawned
processes with the same seed; the launcher's environment is read and checked."""

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from pyro_seq.train import TrainConfig, fit, load_checkpoint, load_weights
from pyro_seq.train.distributed import Launch, free_port, launch_environment

SCRIPT = '''"""One torchrun process: fit a tiny SRNN into argv[1] with the TrainConfig argv[2]."""
import json
import os
import sys

import torch


def problem():
    """The model (seed 0) and the train/valid sequences every rank builds alike."""
    from pyro_seq.models import SRNN

    g = torch.Generator().manual_seed(2)
    seqs = [(torch.rand(3 + i % 4, 5, generator=g) < 0.3).double() for i in range(17)]
    torch.manual_seed(0)
    return SRNN(5, d_dim=4, z_dim=2, hidden_dim=4).double(), seqs[:12], seqs[12:]


if __name__ == "__main__":
    from pyro_seq.train import TrainConfig, fit

    model, train, valid = problem()
    history = fit(model, train, valid, TrainConfig(**json.loads(sys.argv[2])), sys.argv[1])
    torch.save({"state": model.state_dict(), "stop_reason": history.stop_reason,
                "best_epoch": history.best_epoch, "rows": list(history)},
               os.path.join(sys.argv[1], "returned_rank%s.pt" % os.environ["RANK"]))
'''

CONFIG = dict(
    epochs=3,
    batch_size=4,
    lr=0.01,
    patience=None,
    progress=False,
    seed=3,
    num_threads=1,
    dist_timeout=60.0,
)
LAUNCH_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
)


def _torchrun_nodes(args, port, cwd):
    """Start ``python -m torch.distributed.run --nnodes 2 --nproc-per-node 1`` as node 0 and
    node 1 (rendezvous at 127.0.0.1:port) running ``args``; wait for both."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                *args,
            ],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=150)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for node, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"node {node} exited with {p.returncode}:\n{out[-3000:]}"
    return outputs


def test_two_torchrun_nodes_train_as_two_spawned_processes(tmp_path):
    script = tmp_path / "train_one_rank.py"
    script.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location("train_one_rank", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    launched = tmp_path / "torchrun"
    started = time.time()
    _torchrun_nodes([str(script), str(launched), json.dumps(CONFIG)], free_port(), tmp_path)
    wall = time.time() - started
    print(f"two torchrun nodes: {wall:.1f} s wall")

    model, train, valid = module.problem()
    spawned = tmp_path / "spawned"
    history = fit(model, train, valid, TrainConfig(world_size=2, **CONFIG), spawned)

    # rank 0 wrote the same files as in the spawned run (and no rank left its probe file)
    returned = {f"returned_rank{r}.pt" for r in (0, 1)}
    assert {p.name for p in launched.iterdir()} == {p.name for p in spawned.iterdir()} | returned
    a, b = load_checkpoint(launched / "checkpoint.pt"), load_checkpoint(spawned / "checkpoint.pt")
    assert a["extra"]["world_size"] == 2 and a["global_step"] == b["global_step"] == 9
    for name, value in b["model"].items():  # the last epoch's weights, bit for bit
        assert torch.equal(a["model"][name], value), name
    best_a, best_b = load_weights(launched / "best.pt"), load_weights(spawned / "best.pt")
    assert all(torch.equal(best_a[k], v) for k, v in best_b.items())
    strip = [
        {k: v for k, v in row.items() if k not in ("seconds", "cpu_seconds")} for row in history
    ]
    for rank in (0, 1):  # fit returned on every rank with the best epoch's weights
        result = torch.load(launched / f"returned_rank{rank}.pt", weights_only=False)
        assert result["best_epoch"] == history.best_epoch
        assert result["stop_reason"] == history.stop_reason == "epochs"
        assert [
            {k: v for k, v in row.items() if k not in ("seconds", "cpu_seconds")}
            for row in result["rows"]
        ] == strip
        for name, value in model.state_dict().items():
            assert torch.equal(result["state"][name], value), (rank, name)
    # and training did something: the weights moved from the initial ones
    initial = module.problem()[0].state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in model.state_dict().items())


def test_the_cli_trains_under_torchrun_unchanged(tiny_pickle, tmp_path):
    out = tmp_path / "rnn"
    outputs = _torchrun_nodes(
        [
            "-m",
            "pyro_seq.cli",
            "train",
            "--model",
            "srnn",
            "--data",
            str(tiny_pickle),
            "--epochs",
            "1",
            "--quiet",
            "--batch-size",
            "4",
            "--threads",
            "1",
            "--out",
            str(out),
            "--model-option",
            "d_dim=3",
            "--model-option",
            "hidden_dim=3",
            "--z-dim",
            "2",
        ],
        free_port(),
        tmp_path,
    )
    # rank 0 (node 0) alone prints and writes test.json (and config.json)
    assert "test ELBO" in outputs[0] and "test ELBO" not in outputs[1]
    assert (out / "test.json").exists() and (out / "config.json").exists()
    payload = load_checkpoint(out / "checkpoint.pt")
    assert payload["extra"]["world_size"] == 2 and len(payload["extra"]["rng_states"]) == 2


def _env(**kw):
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    env.update(kw)
    return {k: v for k, v in env.items() if v is not None}


def test_launch_environment():
    assert launch_environment({}) is None
    assert launch_environment({"WORLD_SIZE": "2"}) is None  # RANK and WORLD_SIZE make a launch
    assert launch_environment(_env()) == Launch(1, 2, 0, "10.0.0.1", 29500)
    assert launch_environment(_env(LOCAL_RANK=None)).local_rank == 0
    with pytest.raises(ValueError, match="MASTER_PORT"):
        launch_environment(_env(MASTER_PORT=None))
    with pytest.raises(ValueError, match="RANK=2 and WORLD_SIZE=2"):
        launch_environment(_env(RANK="2"))
    with pytest.raises(ValueError, match="RANK='one' must be an integer"):
        launch_environment(_env(RANK="one"))
    # one launched process: no rendezvous needed
    assert launch_environment({"RANK": "0", "WORLD_SIZE": "1"}).world_size == 1


@pytest.mark.parametrize(
    "world_size, free_bits, match",
    [
        (3, 0.0, "TrainConfig.world_size=3 .* WORLD_SIZE=2"),
        (1, 0.5, "free_bits=0.5 with WORLD_SIZE=2"),
        (2, 0.5, "free_bits"),
    ],
)
def test_fit_refuses_a_config_that_contradicts_the_launcher(
    monkeypatch, tmp_path, world_size, free_bits, match
):
    """Before joining any group or writing anything."""
    from pyro_seq.models import RNNBaseline

    for k, v in _env().items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        fit(
            RNNBaseline(5, d_dim=3, hidden_dim=3),
            [torch.zeros(3, 5)],
            [],
            TrainConfig(world_size=world_size, free_bits=free_bits, progress=False),
            tmp_path / "run",
        )
    assert not (tmp_path / "run").exists()


def test_one_launched_process_trains_alone(monkeypatch, tmp_path):
    """torchrun --nproc-per-node 1 on one node (WORLD_SIZE=1): an ordinary one-process run, the
    same weights as without the launcher; world_size=2 contradicts it."""
    from pyro_seq.models import RNNBaseline

    seqs = [
        (torch.rand(4, 5, generator=torch.Generator().manual_seed(i)) < 0.3).double()
        for i in range(6)
    ]
    cfg = dict(epochs=1, batch_size=3, lr_schedule="constant", patience=None, progress=False)
    plain = RNNBaseline(5, d_dim=3, hidden_dim=3).double()
    launched = RNNBaseline(5, d_dim=3, hidden_dim=3).double()
    launched.load_state_dict(plain.state_dict())
    fit(plain, seqs, [], TrainConfig(**cfg), tmp_path / "plain")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    fit(launched, seqs, [], TrainConfig(**cfg), tmp_path / "launched")
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain.state_dict().values(), launched.state_dict().values())
    )
    with pytest.raises(ValueError, match="world_size=2"):
        fit(launched, seqs, [], TrainConfig(world_size=2, **cfg), tmp_path / "two")


def _launched_rank(rank, port, out):
    """A process started as a launcher would (its environment says rank ``rank`` of 2), whose
    training data differ from the other rank's: fit must refuse on both ranks."""
    from pyro_seq.models import RNNBaseline

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    seqs = [torch.zeros(3, 5, dtype=torch.float64)] * (4 + rank)
    try:
        fit(
            RNNBaseline(5, d_dim=3, hidden_dim=3).double(),
            seqs,
            [],
            TrainConfig(epochs=1, progress=False, dist_timeout=30.0),
            f"{out}/run",
        )
    except ValueError as e:
        with open(f"{out}/rank{rank}.txt", "w") as f:
            f.write(str(e))


def test_launched_ranks_with_different_data_are_refused(tmp_path):
    """Launched processes load their own data: ranks with different training sets would run
    different numbers of updates and wait for each other until dist_timeout. Both raise."""
    import torch.multiprocessing as mp

    mp.spawn(_launched_rank, nprocs=2, args=(free_port(), str(tmp_path)), join=True)
    for rank in (0, 1):
        message = (tmp_path / f"rank{rank}.txt").read_text()
        # (sequences, elements, sum): 5 and 4 sequences of 3 x 5 zeros
        assert message.startswith(
            f"rank 1 has train={(5, 5 * 15, 0.0)} but rank 0 has {(4, 4 * 15, 0.0)}"
        ), message
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
