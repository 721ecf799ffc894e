"""Checkpoints that resume training exactly: model, optimizer, epoch, RNG and history.

A checkpoint is a plain dict of tensors and Python containers saved with :func:`torch.save`
and read back with ``torch.load(..., weights_only=True)``, so loading never runs pickled code.
Files are written atomically (temporary file, then rename) so that an interrupted save never
leaves a corrupt checkpoint behind.
"""

import os
from pathlib import Path

import torch


def save_checkpoint(path, *, model, optimizer, epoch, global_step, history, extra=None):
    """Write a checkpoint of everything needed to continue training exactly.

    :param path: file to write.
    :param torch.nn.Module model: its ``state_dict()`` is saved.
    :param pyro.optim.PyroOptim optimizer: its ``get_state()`` is saved.
    :param int epoch: number of completed epochs.
    :param int global_step: number of completed SVI steps.
    :param list history: per-epoch log rows (dicts of numbers).
    :param dict extra: further plain data (e.g. best validation score).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.get_state(),
        "epoch": int(epoch),
        "global_step": int(global_step),
        "history": list(history),
        "torch_rng": torch.get_rng_state(),
        "extra": dict(extra or {}),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path):
    """Read a checkpoint written by :func:`save_checkpoint` (``weights_only=True``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location="cpu", weights_only=True)


def restore(payload, *, model, optimizer=None, restore_rng=True):
    """Load a checkpoint's state into ``model`` (and ``optimizer``, RNG); returns ``payload``."""
    model.load_state_dict(payload["model"])
    if optimizer is not None:
        optimizer.set_state(payload["optimizer"])
    if restore_rng:
        torch.set_rng_state(payload["torch_rng"])
    return payload
