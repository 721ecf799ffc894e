"""Schedules of a training run: the learning rate (``TrainConfig.lr_schedule``), the
optimizer that carries it, and the KL weight beta of annealing.

Learning-rate schedules:

* ``"plateau"`` (default): :class:`pyro.optim.ReduceLROnPlateau` around ClippedAdam, driven by
  the validation ELBO per step once per epoch: the rate is multiplied by ``plateau_factor``
  (0.5) after ``plateau_patience`` + 1 (4) consecutive epochs without an improvement of at least
  ``plateau_threshold`` nats per step over the best so far, then waits ``plateau_cooldown``
  epochs, never going below ``plateau_min_lr``. When it lowers the rate, the weights of the best
  validation epoch so far come back (``plateau_restore_best``, default True): the epochs
  without improvement that triggered the reduction are undone, and the lower rate continues
  from the best point (on the SRNN of JSB Chorales this raised the test ELBO past the tuned
  recipe's; measured: docs/benchmarks.rst, section "Do the training defaults transfer?"). It
  needs no per-dataset tuning: the SRNN recipe tuned on JSB-2x (constant for 50 epochs, then
  /1.15 per epoch) kept the full rate while the validation bound of other data peaked at a third
  of the schedule and then fell. Without validation sequences the rate stays constant. The
  validation bound is the unannealed ELBO (comparable across epochs whatever beta is), so by
  default the schedule and early stopping also run while KL annealing is under way
  (``schedule_during_annealing``). Waiting for ``beta = 1`` instead kept the full rate through
  the annealing epochs on JSB Chorales and over-fitted (measured: docs/benchmarks.rst, section
  "Do the training defaults transfer?").
* ``"exponential"``: the per-epoch schedule of the SRNN code, ``lr_decay_after`` epochs
  constant, then divided by ``lr_decay_factor`` per epoch (:func:`epoch_lr`).
* ``"constant"``: ``lr`` throughout, optionally multiplied by ``lrd`` after every update
  (Pyro's DMM example).

KL annealing (:func:`kl_beta`): beta rises linearly from ``kl_start`` to 1 over
``kl_anneal_steps`` updates (thesis 4.8.1); :func:`~pyro_seq.train.fit` hands it to
:class:`~pyro_seq.infer.LatentScale` before every update.
"""

from typing import TYPE_CHECKING, Mapping, Optional

import pyro

# pyro.optim wraps torch's schedulers at import time, out of mypy's sight
from pyro.optim import ClippedAdam, ReduceLROnPlateau  # type: ignore[attr-defined]
from pyro.optim.clipped_adam import ClippedAdam as _TorchClippedAdam
from pyro.optim.optim import PyroOptim

if TYPE_CHECKING:
    from pyro_seq.models.contract import ModelContract
    from pyro_seq.train.config import TrainConfig

__all__ = ["epoch_lr", "kl_beta", "lr_multiplier", "make_optimizer"]


def epoch_lr(epoch: int, config: "TrainConfig") -> float:
    """Learning rate of (0-based) ``epoch`` under the per-epoch exponential schedule of the
    SRNN code (Fraccaro et al. 2016): constant for ``lr_decay_after`` epochs, then divided by
    ``lr_decay_factor`` once per epoch (``lr_schedule="exponential"``). ``config.lr`` for the
    other schedules (the plateau schedule's later rates depend on the validation curve)."""
    if config.lr_decay_after is None:
        return config.lr
    return config.lr / config.lr_decay_factor ** max(0, epoch - config.lr_decay_after + 1)


def lr_multiplier(model: Optional["ModelContract"], param_name: str) -> float:
    """The factor on the learning rate of one parameter: ``model.lr_multipliers`` maps names of
    ``model.named_parameters()`` (a parameter, or a submodule's prefix such as ``"wall_net"``)
    to factors; the longest matching key wins, 1 where none matches (or ``model`` is None).

    :param str param_name: the parameter's name in Pyro's param store (``"<module_name>$$$M"``)
        or in the model (``"M"``).
    """
    multipliers: Mapping[str, float] = {} if model is None else model.lr_multipliers
    name = param_name.replace("$$$", ".")
    prefix = "." if model is None else f"{model.module_name}."
    if name.startswith(prefix):
        name = name[len(prefix) :]
    match = max(
        (key for key in multipliers if name == key or name.startswith(key + ".")),
        key=len,
        default=None,
    )
    return 1.0 if match is None else float(multipliers[match])


def set_lr(optim, lr, model=None):
    """Set the rate of every optimizer Pyro has created so far (times :func:`lr_multiplier`)."""
    store = pyro.get_param_store()
    for param, opt in optim.optim_objs.items():
        for group in opt.param_groups:
            group["lr"] = lr * lr_multiplier(model, store.param_name(param))


def set_lr_in_state(state, lr, model=None):
    """Set the rate in a saved ``PyroOptim.get_state()`` (per parameter torch state dicts)."""
    for name, opt_state in state.items():
        for group in opt_state["param_groups"]:
            group["lr"] = lr * lr_multiplier(model, name)


def make_optimizer(config: "TrainConfig", model: Optional["ModelContract"] = None) -> PyroOptim:
    """The Pyro optimizer of ``config``: ClippedAdam, wrapped in
    :class:`pyro.optim.ReduceLROnPlateau` (mode ``"max"`` on the validation ELBO, absolute
    threshold ``plateau_threshold``) when ``lr_schedule="plateau"``.

    Pyro builds one torch optimizer (and one scheduler) per parameter when it first sees the
    parameter; every scheduler receives the same validation bound, so all rates move together.
    ``get_state()`` then holds ``{"scheduler": ..., "optimizer": ...}`` per parameter (plain
    numbers and lists, loadable with ``weights_only=True``). A ``model`` with
    ``lr_multipliers`` (e.g. the GTM-SM's displacements and wall network) gets per-parameter
    rates ``lr * factor`` (:func:`lr_multiplier`); the schedules scale them all alike.
    """
    adam = {
        "lr": epoch_lr(0, config),
        "betas": tuple(config.betas),
        "clip_norm": config.clip_norm,
        "lrd": config.lrd,
        "weight_decay": config.weight_decay,
    }
    if model is not None and model.lr_multipliers:
        base = adam

        # Pyro takes the arguments as a dict or as a function of the parameter's name
        def adam(param_name):  # type: ignore[misc]  # Pyro's one-argument form: the normalised name "<module>.<param>"
            return dict(base, lr=base["lr"] * lr_multiplier(model, param_name))

    if config.lr_schedule != "plateau":
        return ClippedAdam(adam)
    return ReduceLROnPlateau(
        {
            "optimizer": _TorchClippedAdam,
            "optim_args": adam,
            "mode": "max",
            "factor": config.plateau_factor,
            "patience": config.plateau_patience,
            "threshold": config.plateau_threshold,
            "threshold_mode": "abs",
            "cooldown": config.plateau_cooldown,
            "min_lr": config.plateau_min_lr,
        }
    )


def current_lr(optim, default, model=None):
    """The base rate of the optimizers Pyro has created (all equal once divided by their
    :func:`lr_multiplier`), ``default`` before the first."""
    for param, obj in optim.optim_objs.items():
        factor = lr_multiplier(model, pyro.get_param_store().param_name(param))
        if factor > 0:  # a frozen parameter (factor 0) does not tell the base rate
            return getattr(obj, "optimizer", obj).param_groups[0]["lr"] / factor
    return default


def check_schedule_of_checkpoint(state, config, path):
    """Refuse to resume a checkpoint whose optimizer state belongs to another kind of schedule
    (a plateau checkpoint holds a scheduler state per parameter)."""
    saved_plateau = any(isinstance(v, dict) and "scheduler" in v for v in state.values())
    if state and saved_plateau != (config.lr_schedule == "plateau"):
        saved = "'plateau'" if saved_plateau else "'exponential' or 'constant'"
        raise ValueError(
            f"{path} was written with lr_schedule={saved}; resume with the same "
            f"schedule (got {config.lr_schedule!r}) or train into a new folder"
        )


def kl_beta(step: int, config: "TrainConfig") -> float:
    """Annealing temperature after ``step`` updates: linear from ``kl_start`` to 1."""
    if config.kl_anneal_steps <= 0:
        return 1.0
    frac = min(1.0, step / config.kl_anneal_steps)
    return config.kl_start + (1.0 - config.kl_start) * frac
