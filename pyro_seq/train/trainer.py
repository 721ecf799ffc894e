"""The SVI training loop: annealing, clipping, validation, early stopping, exact resume.

:func:`fit` trains any :class:`~pyro_seq.models.SequenceModel` with any objective of
:mod:`pyro_seq.train.objectives`. Each epoch it

1. runs :class:`pyro.infer.SVI` over shuffled minibatches (order a function of seed and epoch),
   with :class:`~pyro.optim.ClippedAdam` (per-parameter gradient-norm clipping, learning-rate
   decay per update ``lrd`` or per epoch after ``lr_decay_after`` epochs, see
   :func:`epoch_lr`) and optional KL annealing (:class:`~pyro_seq.infer.LatentScale`, beta rising
   linearly from ``kl_start`` to 1 over ``kl_anneal_steps`` updates, thesis 4.8.1). Pyro's
   per-site validation (argument checks, NaN hooks on every log-density) is off during the
   updates unless ``pyro_validation=True``: the inputs are checked once per batch by the model
   and a non-finite loss stops training with an error, so the per-site checks only add cost;
2. evaluates the validation ELBO in nats per step (and its KL term);
3. appends a row to ``log.csv``/``log.json``, saves ``checkpoint.pt`` (everything needed to
   continue exactly) and ``best.pt`` when validation improves, and redraws ``loss_curve.png``;
4. stops early after ``patience`` epochs without validation improvement.

Calling :func:`fit` again on the same output folder resumes from ``checkpoint.pt`` and gives the
same parameters as an uninterrupted run.
"""

import csv
import functools
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import pyro
import torch
from pyro.infer import SVI
from pyro.optim import ClippedAdam
from tqdm.auto import tqdm

from pyro_seq.data.batching import SequenceLoader
from pyro_seq.train.checkpoint import load_checkpoint, restore, save_checkpoint, save_weights
from pyro_seq.train.evaluate import evaluate_bound
from pyro_seq.train.objectives import make_objective
from pyro_seq.validation import validate_sequence_list


@dataclass
class TrainConfig:
    """Settings of a training run (saved as ``config.json`` next to the checkpoints)."""

    epochs: int = 100
    batch_size: int = 20
    objective: str = "elbo"
    num_particles: int = 1
    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    clip_norm: float = 10.0
    lrd: float = 1.0
    lr_decay_after: Optional[int] = None
    lr_decay_factor: float = 1.0
    weight_decay: float = 0.0
    kl_start: float = 1.0
    kl_anneal_steps: int = 0
    free_bits: float = 0.0
    chunk_length: Optional[int] = None
    valid_batch_size: int = 64
    patience: Optional[int] = None
    seed: int = 0
    time_limit: Optional[float] = None
    num_threads: Optional[int] = None
    pyro_validation: bool = False
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self):
        if self.epochs < 0 or self.batch_size < 1:
            raise ValueError("epochs must be >= 0 and batch_size >= 1")
        if not 0.0 <= self.kl_start <= 1.0:
            raise ValueError(f"kl_start must be in [0, 1], got {self.kl_start}")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.lr_decay_after is not None:
            if self.lr_decay_after < 0 or self.lr_decay_factor < 1.0:
                raise ValueError("lr_decay_after must be >= 0 and lr_decay_factor >= 1")
            if self.lrd != 1.0:
                raise ValueError("use either the per-update decay lrd or the per-epoch schedule "
                                 "lr_decay_after/lr_decay_factor, not both")
        return self


def epoch_lr(epoch, config):
    """Learning rate of (0-based) ``epoch`` under the per-epoch exponential schedule of the
    SRNN code (Fraccaro et al. 2016): constant for ``lr_decay_after`` epochs, then divided by
    ``lr_decay_factor`` once per epoch. ``config.lr`` when no schedule is set."""
    if config.lr_decay_after is None:
        return config.lr
    return config.lr / config.lr_decay_factor ** max(0, epoch - config.lr_decay_after + 1)


def _set_lr(optim, lr):
    """Set the rate of every optimizer Pyro has created so far."""
    for opt in optim.optim_objs.values():
        for group in opt.param_groups:
            group["lr"] = lr


def _set_lr_in_state(state, lr):
    """Set the rate in a saved ``PyroOptim.get_state()`` (per parameter torch state dicts)."""
    for opt_state in state.values():
        for group in opt_state["param_groups"]:
            group["lr"] = lr


def kl_beta(step, config):
    """Annealing temperature after ``step`` updates: linear from ``kl_start`` to 1."""
    if config.kl_anneal_steps <= 0:
        return 1.0
    frac = min(1.0, step / config.kl_anneal_steps)
    return config.kl_start + (1.0 - config.kl_start) * frac


def _write_logs(out_dir, history):
    with open(out_dir / "log.json", "w") as f:
        json.dump(history, f, indent=1)
    keys = list(dict.fromkeys(k for row in history for k in row))  # rows of older runs may lack some
    with open(out_dir / "log.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, restval="")
        writer.writeheader()
        writer.writerows(history)


def _restores_torch_threads_and_rng(func):
    """Put torch's CPU thread count and global RNG state back as they were when ``func``
    returns or raises (saving the RNG state is a 5 KB copy)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        threads, rng_state = torch.get_num_threads(), torch.get_rng_state()
        try:
            return func(*args, **kwargs)
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            torch.set_rng_state(rng_state)

    return wrapper


@_restores_torch_threads_and_rng
def fit(model, train_sequences, valid_sequences, config, out_dir, resume=True):
    """Train ``model`` with SVI; resumable, logged and checkpointed in ``out_dir``.

    :param model: a :class:`~pyro_seq.models.SequenceModel`.
    :param list train_sequences: tensors ``(T_i, D)``.
    :param list valid_sequences: tensors ``(T_i, D)`` (may be empty: no early stopping).
    :param TrainConfig config: settings.
    :param out_dir: folder for ``checkpoint.pt``, ``best.pt``, ``log.csv``, ``log.json``,
        ``loss_curve.png``.
    :param bool resume: continue from ``out_dir/checkpoint.pt`` if it exists.
    :returns: the list of per-epoch log rows.
    :raises ValueError: a sequence fails :func:`pyro_seq.validation.validate_sequence_list`
        (message ``"train[i]: ..."`` / ``"valid[i]: ..."``, before anything is written).
    :raises pyro_seq.train.CheckpointError: ``checkpoint.pt`` is truncated or corrupt (the
        message names it and says what to do).

    Global state. While it runs, ``fit`` seeds torch's global RNG with ``config.seed`` (on
    resume: sets it to the state saved in the checkpoint) and, if ``config.num_threads`` is set,
    calls :func:`torch.set_num_threads`; both are put back as they were when it returns or
    raises. Pyro validation is switched per update with :func:`pyro.validation_enabled`, which
    restores it. Pyro's global param store is *not* restored: it is cleared on entry and holds
    the trained model's parameters on return (the training result, as after any Pyro SVI run).
    Python's and numpy's global RNGs are not used (batch order comes from a local numpy
    generator seeded with ``(config.seed, epoch)``).
    """
    config.validate()
    # the package's one validator, on every sequence before anything is written or trained
    validate_sequence_list(train_sequences, model.obs_dim, model.binary_observations, "train")
    if valid_sequences:
        validate_sequence_list(valid_sequences, model.obs_dim, model.binary_observations, "valid")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    pyro.clear_param_store()
    torch.manual_seed(config.seed)
    loader = SequenceLoader(train_sequences, config.batch_size, shuffle=True, seed=config.seed,
                            chunk_length=config.chunk_length)
    optim = ClippedAdam({"lr": epoch_lr(0, config), "betas": tuple(config.betas), "clip_norm": config.clip_norm,
                         "lrd": config.lrd, "weight_decay": config.weight_decay})
    loss = make_objective(config.objective, config.num_particles, config.free_bits)
    model_fn, guide_fn, annealer = model.model, model.guide, None
    if config.kl_anneal_steps > 0:
        from pyro_seq.infer import LatentScale

        annealer = LatentScale(config.kl_start)
        model_fn, guide_fn = annealer(model.model), annealer(model.guide)
    svi = SVI(model_fn, guide_fn, optim, loss=loss)

    history, start_epoch, global_step = [], 0, 0
    best, bad_epochs = -math.inf, 0
    ckpt_path = out_dir / "checkpoint.pt"
    if resume and ckpt_path.exists():
        payload = load_checkpoint(ckpt_path)
        if config.lr_decay_after is not None:  # optimizers are rebuilt lazily from this state
            _set_lr_in_state(payload["optimizer"], epoch_lr(payload["epoch"], config))
        payload = restore(payload, model=model, optimizer=optim)
        history, start_epoch = payload["history"], payload["epoch"]
        global_step = payload["global_step"]
        best = payload["extra"].get("best_valid", -math.inf)
        bad_epochs = payload["extra"].get("bad_epochs", 0)

    started = time.time()
    bar = tqdm(range(start_epoch, config.epochs), initial=start_epoch, total=config.epochs,
               desc="epochs", disable=not config.progress, unit="epoch")
    for epoch in bar:
        model.train()
        lr = epoch_lr(epoch, config)
        if config.lr_decay_after is not None:
            _set_lr(optim, lr)
        total_loss, epoch_start = 0.0, time.time()
        for x, mask in loader.batches(epoch):
            beta = kl_beta(global_step, config)
            if annealer is not None:
                annealer.beta = beta
            with pyro.validation_enabled(config.pyro_validation):
                step_loss = svi.step(x, mask)
            if not math.isfinite(step_loss):
                raise FloatingPointError(
                    f"non-finite loss {step_loss} at epoch {epoch}, step {global_step}; "
                    "lower the learning rate or raise min_scale")
            total_loss += step_loss
            global_step += 1
        row = {"epoch": epoch + 1, "step": global_step, "beta": kl_beta(global_step, config),
               "lr": lr * config.lrd ** global_step,
               "train_loss_per_step": total_loss / loader.num_steps,
               "seconds": time.time() - epoch_start}
        if valid_sequences:
            val = evaluate_bound(model, valid_sequences, config.valid_batch_size)
            row.update(valid_elbo_per_step=val["per_step"], valid_kl_per_step=val["kl_per_step"])
            improved = val["per_step"] > best
            best = max(best, val["per_step"])
            bad_epochs = 0 if improved else bad_epochs + 1
        else:
            improved = True
        history.append(row)
        if improved:
            save_weights(model.state_dict(), out_dir / "best.pt")
        save_checkpoint(ckpt_path, model=model, optimizer=optim, epoch=epoch + 1,
                        global_step=global_step, history=history,
                        extra={"best_valid": best, "bad_epochs": bad_epochs})
        _write_logs(out_dir, history)
        postfix = {"loss/step": f"{row['train_loss_per_step']:.3f}"}
        if valid_sequences:
            postfix.update({"val": f"{row['valid_elbo_per_step']:.3f}",
                            "KL": f"{row['valid_kl_per_step']:.3f}"})
        bar.set_postfix(postfix)
        if config.patience is not None and bad_epochs >= config.patience:
            bar.write(f"early stop: no validation improvement in {bad_epochs} epochs")
            break
        if config.time_limit is not None and time.time() - started > config.time_limit:
            bar.write(f"time limit of {config.time_limit:.0f} s reached after epoch {epoch + 1}")
            break
    bar.close()
    try:
        from pyro_seq.train.plots import plot_history

        if history:
            plot_history(history, out_dir / "loss_curve.png")
    except ImportError:  # matplotlib missing: logs are still written
        pass
    return history
