"""Checkpoints that resume training exactly: model, optimizer, epoch, RNG and history.

Random numbers: the CPU generator's state is always saved (``torch_rng``); a run on CUDA also
saves every CUDA generator's state (``cuda_rng``, :func:`torch.cuda.get_rng_state_all`), since
the models sample on the device their tensors live on. Checkpoints without ``cuda_rng`` (CPU
runs, older files) load as before; a ``cuda_rng`` is ignored on a machine without CUDA.

A checkpoint is a plain dict of tensors and Python containers saved with :func:`torch.save`
and read back with ``torch.load(..., weights_only=True)``, so loading never runs pickled code.

Files are written atomically: to ``<name>.tmp`` in the same folder, flushed and fsynced, then
renamed over ``<name>`` with :func:`os.replace`, so a save interrupted at any point (killed
process, full disk, power loss) leaves the previous file intact. A file that is truncated or
corrupt anyway (copied halfway, edited, from an older tool) raises :class:`CheckpointError`, a
one-line message naming the file and what to do about it.
"""

import os
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import torch

__all__ = [
    "CheckpointError",
    "load_checkpoint",
    "load_weights",
    "restore",
    "save_checkpoint",
    "save_weights",
    "state_dict_mismatch",
]

_CHECKPOINT_KEYS = ("model", "optimizer", "epoch", "global_step", "history", "torch_rng", "extra")

# Tests only: when set to a file name (e.g. "checkpoint.pt"), saving that file stops after the
# temporary file is complete and before os.replace, creates "<name>.paused" beside it and
# sleeps, so that a test can kill the process at that exact point.
_PAUSE_ENV = "PYRO_SEQ_TEST_PAUSE_BEFORE_REPLACE"


class CheckpointError(RuntimeError):
    """A checkpoint or weights file cannot be read; the message says what to do."""


def _fsync_dir(folder):
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def _atomic_save(obj, path):
    """``torch.save(obj, path)`` through a fsynced temporary file and :func:`os.replace`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if os.environ.get(_PAUSE_ENV) == path.name:
            path.with_name(path.name + ".paused").write_text(str(tmp))
            time.sleep(120)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def _load(path, what, remedy):
    """``torch.load(path, weights_only=True)`` with a one-line :class:`CheckpointError`.

    torch's own messages are not passed on: they are long and, for a file that is not a zip
    archive, advise ``weights_only=False``, which would run whatever code the file holds.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (PermissionError, IsADirectoryError) as e:
        raise CheckpointError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except Exception:  # torch raises RuntimeError, UnpicklingError, EOFError, OSError(EINVAL)...
        raise CheckpointError(
            f"{what} {path} is truncated or corrupt and cannot be loaded; {remedy}"
        ) from None


def save_checkpoint(
    path: Union[str, "os.PathLike[str]"],
    *,
    model: torch.nn.Module,
    optimizer: Any,
    epoch: int,
    global_step: int,
    history: Sequence[Mapping[str, Any]],
    extra: Optional[Mapping[str, Any]] = None,
    cuda_rng: bool = False,
) -> None:
    """Write a checkpoint of everything needed to continue training exactly (atomically).

    :param path: file to write.
    :param torch.nn.Module model: its ``state_dict()`` is saved.
    :param pyro.optim.PyroOptim optimizer: its ``get_state()`` is saved.
    :param int epoch: number of completed epochs.
    :param int global_step: number of completed SVI steps.
    :param list history: per-epoch log rows (dicts of numbers).
    :param dict extra: further plain data (e.g. best validation score).
    :param bool cuda_rng: also save the CUDA generators' states (training on CUDA).
    """
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.get_state(),
        "epoch": int(epoch),
        "global_step": int(global_step),
        "history": list(history),
        "torch_rng": torch.get_rng_state(),
        "extra": dict(extra or {}),
    }
    if cuda_rng:
        payload["cuda_rng"] = list(torch.cuda.get_rng_state_all())
    _atomic_save(payload, path)


def load_checkpoint(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (``weights_only=True``).

    :raises FileNotFoundError: no file at ``path``.
    :raises CheckpointError: the file is truncated, corrupt or not a checkpoint.
    """
    remedy = (
        "delete it to train in this folder from scratch, or train into a new output folder (--out)"
    )
    payload = _load(path, "checkpoint", remedy)
    if not isinstance(payload, dict) or not all(k in payload for k in _CHECKPOINT_KEYS):
        raise CheckpointError(f"checkpoint {path} is not a pyro-seq training checkpoint; {remedy}")
    problem = _checkpoint_problem(payload)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} {problem}; {remedy}")
    return payload


def _non_finite(state):
    """``"holds non-finite values (NaN/inf) in the weight 'name'"`` for the first floating or
    complex tensor of ``state`` with a NaN or an infinity, else None."""
    for name, value in state.items():
        if (value.is_floating_point() or value.is_complex()) and not bool(
            torch.isfinite(value).all()
        ):
            return f"holds non-finite values (NaN/inf) in the weight {name!r}"
    return None


def _names(keys, limit):
    keys = sorted(keys)
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def state_dict_mismatch(expected, state, limit=3):
    """How the ``state_dict`` ``state`` (read from a file) fails to fit ``expected`` (the
    model's ``state_dict()``), in one line, or None when every key matches with its shape.

    The line lists the missing keys, the unexpected keys and the first entry whose shape
    differs (at most ``limit`` names of each, then a count), e.g. ``"missing keys 'a', 'b' and
    4 more; unexpected keys 'c'"``, where torch's message names every entry on a line of
    its own.
    """
    missing = set(expected) - set(state)
    unexpected = set(state) - set(expected)
    shapes = [
        (k, tuple(state[k].shape), tuple(expected[k].shape))
        for k in sorted(expected)
        if k in state and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    parts = []
    if missing:
        parts.append(f"missing keys {_names(missing, limit)}")
    if unexpected:
        parts.append(f"unexpected keys {_names(unexpected, limit)}")
    if shapes:
        key, have, want = shapes[0]
        more = f" and {len(shapes) - 1} more" if len(shapes) > 1 else ""
        parts.append(f"size mismatch for {key!r}: {have} in the file, {want} in the model{more}")
    return "; ".join(parts) or None


def _is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _checkpoint_problem(payload):
    """What is wrong with the content of a loaded checkpoint dict, or None."""
    model = payload["model"]
    if not isinstance(model, dict) or not all(
        isinstance(k, str) and torch.is_tensor(v) for k, v in model.items()
    ):
        return "has a model entry that is not a state_dict of named tensors"
    problem = _non_finite(model)
    if problem is not None:
        return problem
    for key in ("epoch", "global_step"):
        if not _is_count(payload[key]):
            return f"has {key} = {payload[key]!r}, not a non-negative integer"
    history = payload["history"]
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        return "has a history that is not a list of per-epoch rows (dicts)"
    if len(history) != payload["epoch"]:
        return f"has {len(history)} history rows for {payload['epoch']} completed epochs"
    rng, expected = payload["torch_rng"], torch.get_rng_state()
    if not (torch.is_tensor(rng) and rng.dtype == expected.dtype and rng.shape == expected.shape):
        return "has a torch_rng entry that is not a torch RNG state"
    cuda = payload.get("cuda_rng")
    if cuda is not None and not (
        isinstance(cuda, (list, tuple))
        and all(torch.is_tensor(s) and s.dtype == torch.uint8 and s.dim() == 1 for s in cuda)
    ):
        return "has a cuda_rng entry that is not a list of CUDA RNG states"
    for key in ("optimizer", "extra"):
        if not isinstance(payload[key], dict):
            return f"has an {key} entry of type {type(payload[key]).__name__}, not a dict"
    return None


def save_weights(
    state_dict: Mapping[str, torch.Tensor], path: Union[str, "os.PathLike[str]"]
) -> None:
    """Write a model ``state_dict`` (e.g. ``best.pt``) atomically."""
    _atomic_save(state_dict, path)


def load_weights(path: Union[str, "os.PathLike[str]"]) -> Dict[str, torch.Tensor]:
    """Read a ``state_dict`` written by :func:`save_weights` (``weights_only=True``).

    :raises FileNotFoundError: no file at ``path``.
    :raises CheckpointError: the file is truncated, corrupt or not a ``state_dict`` of named
        tensors, or holds a NaN or an infinity (training never saves one: a diverged run stops).
    """
    remedy = "delete it and train again (train --restart, or a new output folder --out)"
    state = _load(path, "weights file", remedy)
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()
    ):
        raise CheckpointError(f"weights file {path} does not hold a model state_dict; {remedy}")
    problem = _non_finite(state)
    if problem is not None:
        raise CheckpointError(f"weights file {path} {problem}; {remedy}")
    return state


def restore(
    payload: Dict[str, Any],
    *,
    model: torch.nn.Module,
    optimizer: Any = None,
    restore_rng: bool = True,
    path: Union[str, "os.PathLike[str]"] = "checkpoint",
) -> Dict[str, Any]:
    """Load a checkpoint's state into ``model`` (and ``optimizer``, RNG); returns ``payload``.

    ``restore_rng``: set torch's CPU generator, and, when the checkpoint holds ``cuda_rng`` and
    CUDA is available, the generators of the CUDA devices it saved that exist here.

    :raises CheckpointError: the weights do not fit ``model`` (missing, unexpected or
        differently shaped entries: a checkpoint of another model), or the optimizer state
        does not fit ``optimizer``. ``path`` names the file in the message.
    """
    remedy = "resume with the model it was written for, or train into a new output folder (--out)"
    detail = state_dict_mismatch(model.state_dict(), payload["model"])
    if detail is None:
        try:
            model.load_state_dict(payload["model"])
        except RuntimeError as e:
            detail = " ".join(str(e).split("\n", 1)[-1].split())
    if detail is not None:
        raise CheckpointError(
            f"checkpoint {path} does not fit this model ({detail}); {remedy}"
        ) from None
    if optimizer is not None:
        try:
            optimizer.set_state(payload["optimizer"])
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
            raise CheckpointError(
                f"checkpoint {path} has an optimizer state that does not fit "
                f"({type(e).__name__}: {e}); {remedy}"
            ) from None
    if restore_rng:
        torch.set_rng_state(payload["torch_rng"])
        cuda = payload.get("cuda_rng")
        if cuda and torch.cuda.is_available():
            for index, state in enumerate(cuda[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(state, index)
    return payload
