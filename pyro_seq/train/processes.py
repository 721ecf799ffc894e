"""The processes of a data-parallel :func:`~pyro_seq.train.fit` (``world_size`` N > 1): spawn
N ranks with :func:`torch.multiprocessing.spawn` and read rank 0's result back, or, under a
launcher such as ``torchrun``, train here as one rank of the launched group.

Each rank runs the one-process training loop of :mod:`pyro_seq.train.loop` with a
:class:`~pyro_seq.train.distributed.ProcessGroup` as its communicator (sharded minibatches,
gradients summed over ranks; :mod:`pyro_seq.train.distributed` describes the scheme). The
sequences reach the ranks already validated by :func:`~pyro_seq.train.fit`.
"""

import copy
import json
import os
from dataclasses import asdict
from pathlib import Path

import pyro
import torch

from pyro_seq.train.checkpoint import load_checkpoint, load_weights
from pyro_seq.train.distributed import rank_device
from pyro_seq.train.loop import TrainHistory, fit_rank
from pyro_seq.validation import parse_device

__all__ = ["fit_processes"]

#: The :class:`~pyro_seq.train.TrainConfig` fields that launched ranks may set differently:
#: the others must be equal on every rank (:func:`~pyro_seq.train.distributed.check_same_run`).
PER_RANK_SETTINGS = ("world_size", "progress", "num_threads")


def _worker(
    rank, world_size, port, model, train_sequences, valid_sequences, config, out_dir, resume
):
    """One rank of :func:`fit_processes` (started by ``torch.multiprocessing.spawn``)."""
    import torch.distributed as dist

    from pyro_seq.train.distributed import init_process_group

    # torch.multiprocessing hands every rank the parent's tensors in one shared-memory storage:
    # without a private copy the ranks would all step the same parameters
    model = copy.deepcopy(model)
    if not config.num_threads and parse_device(config.device).type == "cpu":
        # N processes with torch's default thread count each would oversubscribe the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    device = rank_device(parse_device(config.device), rank)
    comm = init_process_group(
        rank, world_size, port, config.dist_backend, config.dist_timeout, device=device
    )
    try:
        fit_rank(
            model, train_sequences, valid_sequences, config, Path(out_dir), resume, comm, device
        )
    finally:
        dist.destroy_process_group()


def fit_processes(model, train_sequences, valid_sequences, config, out_dir, resume, launch=None):
    """Spawn ``config.world_size`` ranks, wait, and read rank 0's result back into ``model``;
    or, under a launcher (``launch``, a :class:`~pyro_seq.train.distributed.Launch`), train
    here as its rank: join the group, check that every rank has the same data, settings and
    output folder, start from rank 0's weights, and train.

    The arguments are :func:`~pyro_seq.train.fit`'s, checked by it (``out_dir`` a
    :class:`~pathlib.Path` that exists). Returns the :class:`~pyro_seq.train.TrainHistory`
    of rank 0 (spawned) or of this rank (launched), with ``model`` holding the trained weights.
    """
    if launch is not None:
        return _fit_launched(
            model, train_sequences, valid_sequences, config, out_dir, resume, launch
        )
    import torch.multiprocessing as mp

    from pyro_seq.train.distributed import free_port

    summary_path = out_dir / "fit_summary.json"
    if summary_path.exists():
        summary_path.unlink()
    try:
        mp.spawn(
            _worker,
            nprocs=config.world_size,
            join=True,
            args=(
                config.world_size,
                free_port(),
                model,
                train_sequences,
                valid_sequences,
                config,
                str(out_dir),
                resume,
            ),
        )
    except mp.ProcessRaisedException as e:
        raise RuntimeError(f"distributed training failed in a rank: {e}") from None
    except mp.ProcessExitedException as e:
        raise RuntimeError(
            f"distributed training failed: {e} (the other ranks were stopped)"
        ) from None
    summary = json.loads(summary_path.read_text())
    log = out_dir / "log.json"
    history = TrainHistory(json.loads(log.read_text()) if log.exists() else [])
    for key, value in summary.items():
        setattr(history, key, value)
    weights = (
        load_weights(out_dir / "best.pt")
        if summary["restored_best"]
        else load_checkpoint(out_dir / "checkpoint.pt")["model"]
    )
    model.load_state_dict(weights)
    model.to(parse_device(config.device))  # as after a one-process fit: on the (first) device
    pyro.clear_param_store()
    pyro.module(model.module_name, model)  # as after a one-process fit: the store holds them
    return history


def _fit_launched(model, train_sequences, valid_sequences, config, out_dir, resume, launch):
    """:func:`fit_processes` as one rank of the group that ``launch`` describes."""
    import torch.distributed as dist

    from pyro_seq.train.distributed import (
        broadcast_weights,
        check_same_run,
        check_shared_folder,
        join_launched_group,
    )

    comm, joined = join_launched_group(
        launch, parse_device(config.device), config.dist_backend, config.dist_timeout
    )
    try:
        settings = {k: v for k, v in asdict(config).items() if k not in PER_RANK_SETTINGS}
        check_same_run(comm, train_sequences, valid_sequences, dict(settings, resume=resume))
        check_shared_folder(comm, out_dir)
        broadcast_weights(comm, model)
        return fit_rank(
            model, train_sequences, valid_sequences, config, out_dir, resume, comm, comm.device
        )
    finally:
        if joined:
            dist.destroy_process_group()
