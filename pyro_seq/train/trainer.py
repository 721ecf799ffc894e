"""The SVI training loop: annealing, clipping, validation, early stopping, exact resume.

:func:`fit` trains any :class:`~pyro_seq.models.SequenceModel` with any objective of
:mod:`pyro_seq.train.objectives`. Each epoch it

1. runs :class:`pyro.infer.SVI` over shuffled minibatches (order a function of seed and epoch),
   with :class:`~pyro.optim.ClippedAdam` (per-parameter gradient-norm clipping) under one of the
   learning-rate schedules ``lr_schedule`` (below) and optional KL annealing
   (:class:`~pyro_seq.infer.LatentScale`, beta rising
   linearly from ``kl_start`` to 1 over ``kl_anneal_steps`` updates, thesis 4.8.1). Pyro's
   per-site validation (argument checks, NaN hooks on every log-density) is off during the
   updates unless ``pyro_validation=True``: the inputs are checked once per batch by the model
   and a non-finite loss stops training with an error, so the per-site checks only add cost;
2. evaluates the validation ELBO in nats per step (and its KL term) and, under the default
   ``lr_schedule="plateau"``, halves the rate when it has not improved for a few epochs;
3. appends a row to ``log.csv``/``log.json``, saves ``checkpoint.pt`` (everything needed to
   continue exactly, the scheduler's state included) and ``best.pt`` when validation improves,
   and redraws ``loss_curve.png``;
4. stops early after ``patience`` epochs without validation improvement.

When it stops (patience, ``epochs`` reached or ``time_limit``) the model holds the weights of
its best validation epoch (read back from ``best.pt``); ``checkpoint.pt`` keeps the last ones,
so that calling :func:`fit` again on the same output folder resumes from ``checkpoint.pt`` and
gives the same parameters as an uninterrupted run.

Learning-rate schedules (``TrainConfig.lr_schedule``):

* ``"plateau"`` (default): :class:`pyro.optim.ReduceLROnPlateau` around ClippedAdam, driven by
  the validation ELBO per step once per epoch: the rate is multiplied by ``plateau_factor``
  (0.5) after ``plateau_patience`` + 1 (4) consecutive epochs without an improvement of at least
  ``plateau_threshold`` nats per step over the best so far, then waits ``plateau_cooldown``
  epochs, never going below ``plateau_min_lr``. When it lowers the rate, the weights of the best
  validation epoch so far come back (``plateau_restore_best``, default True): the epochs
  without improvement that triggered the reduction are undone, and the lower rate continues
  from the best point (on the SRNN of ``benchmarks/train_defaults.py`` it raised the test ELBO
  on JSB Chorales from -7.460 to -7.184 nats per step, past the tuned recipe's -7.217). It
  needs no per-dataset tuning: the SRNN recipe
  tuned on JSB-2x (constant for 50 epochs, then /1.15 per epoch) kept the full rate while the
  validation bound of other data peaked at a third of the schedule and then fell. Without
  validation sequences the rate stays constant. The validation bound is the unannealed ELBO
  (comparable across epochs whatever beta is), so by default the schedule and early stopping
  also run while KL annealing is under way (``schedule_during_annealing``). Waiting for
  ``beta = 1`` instead kept the full rate through 67 annealing epochs on JSB Chorales and
  over-fitted: test ELBO -8.13 against -7.46 nats per step (``benchmarks/train_defaults.py``,
  ``docs/benchmarks.rst``).
* ``"exponential"``: the per-epoch schedule of the SRNN code, ``lr_decay_after`` epochs
  constant, then divided by ``lr_decay_factor`` per epoch (:func:`epoch_lr`).
* ``"constant"``: ``lr`` throughout, optionally multiplied by ``lrd`` after every update
  (Pyro's DMM example).

Early stopping (``patience``, default 12 epochs without a new best validation bound, counted
from the first epoch, or from the end of KL annealing with ``schedule_during_annealing=False``;
``best.pt`` follows the best validation epoch throughout): with the
plateau defaults the rate has then been halved twice and each rate has had 4 epochs to help,
so training stops at the epoch where the third halving would come.

Devices (``TrainConfig.device``: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``, checked by
:func:`pyro_seq.validation.parse_device`; asking for CUDA on a machine without it is a
``ValueError``, never a silent CPU run): ``fit`` moves the model there after its
initialisation and before Pyro's param store sees it (so the optimizer state lives there too),
the minibatches and the validation batches are padded and then moved there, and the models
sample with the generator of that device. A checkpoint of a CUDA run also holds the CUDA
generators' states, so resuming on CUDA continues the same random stream (resume on the device
the run was started on for exact continuation). With ``world_size`` N > 1 on ``"cuda:K"``,
rank r trains on ``cuda:K+r`` and the ranks communicate with nccl
(:mod:`pyro_seq.train.distributed`). ``fit`` returns with the model on the device.

Initialisation (``TrainConfig.init``, only on a fresh start, never on resume):

* ``"bias"`` (default): for every model with a Bernoulli emission, the emission's output bias
  becomes the logits of the training set's note frequencies
  (:func:`pyro_seq.nn.init_output_bias`; for an energy-based model, its visible bias); all
  other weights stay as constructed (the DMM's gated transition starts at the identity);
* ``"srnn"``: the same, and :func:`pyro_seq.nn.init_weights` (the SRNN authors' scheme) on a
  model that declares it in ``weight_init_schemes`` (:class:`~pyro_seq.models.SRNN`); ``"normal"``: with ``init_weights(scheme="normal")``. On JSB
  Chorales these weights fit the training set faster and generalise worse (test ELBO -7.515
  against -7.460 with the bias only and -7.355 with nothing, one seed each; docs/benchmarks.rst);
* ``"none"``: the model as constructed.
"""

import copy
import csv
import functools
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pyro
import torch
from pyro.infer import SVI
from pyro.optim import ClippedAdam, ReduceLROnPlateau
from pyro.optim.clipped_adam import ClippedAdam as _TorchClippedAdam
from tqdm.auto import tqdm

from pyro_seq.data.batching import SequenceLoader
from pyro_seq.ops.padding import inputs_of
from pyro_seq.models.contract import Unsupported
from pyro_seq.nn.init import INIT_SCHEMES
from pyro_seq.train.checkpoint import (load_checkpoint, load_weights, restore, save_checkpoint,
                                       save_weights)
from pyro_seq.train.distributed import AllReduceGradients, SingleProcess, rank_device
from pyro_seq.train.evaluate import evaluate_bound, model_dtype
from pyro_seq.train.objectives import check_objective, make_objective
from pyro_seq.validation import parse_device, validate_sequence_list

#: The validation bound watched by early stopping, the plateau schedule and ``best.pt`` when
#: ``TrainConfig.monitor == "objective"``: a model trained with IWAE_K (FIVO_K) is judged by the
#: IWAE (SMC) estimate with the same K, the quantity its training optimises; other objectives
#: by the ELBO.
MONITORED_BOUND = {"iwae": "iwae", "fivo": "smc"}


LR_SCHEDULES = ("plateau", "exponential", "constant")
INITS = INIT_SCHEMES + ("bias", "none")


@dataclass
class TrainConfig:
    """Settings of a training run (saved as ``config.json`` next to the checkpoints)."""

    epochs: int = 100
    batch_size: int = 20
    objective: str = "elbo"
    num_particles: int = 1
    cd_steps: int = 1  #: Gibbs sweeps k of objective "cd" (energy-based models)
    #: The training device, ``"cpu"`` or ``"cuda"`` (with an index after a colon for one GPU of
    #: several); see Devices in the module docstring.
    device: str = "cpu"
    world_size: int = 1  #: processes of data-parallel training (pyro_seq.train.distributed)
    dist_backend: Optional[str] = None  #: "gloo" or "nccl" (None = nccl on CUDA devices, else gloo)
    dist_timeout: float = 120.0  #: seconds a rank waits for the others before failing
    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    clip_norm: float = 10.0
    lr_schedule: str = "plateau"
    plateau_factor: float = 0.5
    plateau_patience: int = 3
    plateau_min_lr: float = 1e-5
    plateau_cooldown: int = 0
    plateau_threshold: float = 1e-3
    #: when the plateau schedule lowers the rate, put the weights of the best validation epoch
    #: back into the model (the optimizer's moments stay), so that the lower rate continues
    #: from the best point rather than from the epochs that did not improve on it (no effect
    #: under the other schedules, which have no plateau)
    plateau_restore_best: bool = True
    lrd: float = 1.0
    lr_decay_after: Optional[int] = None
    lr_decay_factor: float = 1.0
    weight_decay: float = 0.0
    kl_start: float = 1.0
    kl_anneal_steps: int = 0
    #: step the plateau schedule and count early-stopping patience while beta < 1 too (the
    #: validation bound is the unannealed ELBO, comparable across epochs); False: wait for
    #: beta = 1 (the rate stays constant through annealing)
    schedule_during_annealing: bool = True
    free_bits: float = 0.0
    #: Training with missing data, thesis appendix 6.10. Each real step of a training batch is
    #: marked unobserved (``observed=``) with this probability, except the first
    #: ``missing_keep_first`` steps; drawn from ``(seed, update)``, so a resumed run sees the
    #: same masks. Validation and test bounds use complete sequences.
    missing_prob: float = 0.0
    missing_keep_first: int = 3
    chunk_length: Optional[int] = None
    valid_batch_size: int = 64
    patience: Optional[int] = 12
    monitor: str = "objective"  #: "objective" = watch the training objective's bound (MONITORED_BOUND); "elbo"
    init: str = "bias"
    seed: int = 0
    time_limit: Optional[float] = None
    #: what ``time_limit`` counts: "wall" (this call's wall clock) or "training" (the summed
    #: seconds of this call's training epochs, validation excluded: an equal budget for
    #: objectives whose validation bound costs more, as the zoo benchmark needs)
    time_limit_counts: str = "wall"
    num_threads: Optional[int] = None
    pyro_validation: bool = False
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self):
        if self.monitor not in ("objective", "elbo"):
            raise ValueError(f"monitor must be 'objective' or 'elbo', got {self.monitor!r}")
        if self.epochs < 0 or self.batch_size < 1:
            raise ValueError("epochs must be >= 0 and batch_size >= 1")
        if not 0.0 <= self.kl_start <= 1.0:
            raise ValueError(f"kl_start must be in [0, 1], got {self.kl_start}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.lr_decay_after is not None:
            if self.lr_decay_after < 0 or self.lr_decay_factor < 1.0:
                raise ValueError("lr_decay_after must be >= 0 and lr_decay_factor >= 1")
            if self.lrd != 1.0:
                raise ValueError("use either the per-update decay lrd or the per-epoch schedule "
                                 "lr_decay_after/lr_decay_factor, not both")
        if (self.lr_decay_after is not None) != (self.lr_schedule == "exponential"):
            raise ValueError("lr_decay_after/lr_decay_factor set the per-epoch schedule: use them "
                             "with lr_schedule='exponential' (and lr_schedule='exponential' needs "
                             "lr_decay_after)")
        if self.lrd != 1.0 and self.lr_schedule != "constant":
            raise ValueError("the per-update decay lrd belongs to lr_schedule='constant', got "
                             f"lr_schedule={self.lr_schedule!r}")
        if self.lr_schedule == "plateau":
            if not 0.0 < self.plateau_factor < 1.0:
                raise ValueError(f"plateau_factor must be in (0, 1), got {self.plateau_factor}")
            if min(self.plateau_patience, self.plateau_cooldown) < 0:
                raise ValueError("plateau_patience and plateau_cooldown must be >= 0")
            if self.plateau_min_lr < 0 or self.plateau_threshold < 0:
                raise ValueError("plateau_min_lr and plateau_threshold must be >= 0")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"patience must be None (no early stopping) or >= 1, got {self.patience}")
        if not 0.0 <= self.missing_prob < 1.0:
            raise ValueError(f"missing_prob must be in [0, 1), got {self.missing_prob}")
        if self.missing_keep_first < 0:
            raise ValueError(f"missing_keep_first must be >= 0, got {self.missing_keep_first}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if not isinstance(self.cd_steps, int) or self.cd_steps < 1:
            raise ValueError(f"cd_steps must be a positive int, got {self.cd_steps!r}")
        if self.time_limit_counts not in ("wall", "training"):
            raise ValueError(f"time_limit_counts must be 'wall' or 'training', got "
                             f"{self.time_limit_counts!r}")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {self.world_size!r}")
        if self.dist_timeout <= 0:
            raise ValueError(f"dist_timeout must be positive, got {self.dist_timeout}")
        if self.world_size > 1 and self.free_bits > 0:
            # data-parallel ranks sum their gradients, which is the whole batch's gradient only
            # for objectives that sum over sequences; free bits clamps a KL summed over the batch
            raise ValueError(
                f"free_bits={self.free_bits} with world_size={self.world_size}: free bits clamps "
                "each group's KL summed over the whole minibatch, and each rank would clamp its "
                "own shard instead (a different objective); train with free bits in one process")
        device = parse_device(self.device, "device")
        if device.type == "cuda" and self.world_size > 1:
            last = rank_device(device, self.world_size - 1)
            if last.index >= torch.cuda.device_count():
                raise ValueError(f"world_size={self.world_size} on device {self.device!r} needs "
                                 f"{last} (rank r trains on cuda:{device.index}+r), but this "
                                 f"machine has {torch.cuda.device_count()} CUDA device(s)")
        return self


def epoch_lr(epoch, config):
    """Learning rate of (0-based) ``epoch`` under the per-epoch exponential schedule of the
    SRNN code (Fraccaro et al. 2016): constant for ``lr_decay_after`` epochs, then divided by
    ``lr_decay_factor`` once per epoch (``lr_schedule="exponential"``). ``config.lr`` for the
    other schedules (the plateau schedule's later rates depend on the validation curve)."""
    if config.lr_decay_after is None:
        return config.lr
    return config.lr / config.lr_decay_factor ** max(0, epoch - config.lr_decay_after + 1)


def lr_multiplier(model, param_name):
    """The factor on the learning rate of one parameter: ``model.lr_multipliers`` maps names of
    ``model.named_parameters()`` (a parameter, or a submodule's prefix such as ``"wall_net"``)
    to factors; the longest matching key wins, 1 where none matches (or ``model`` is None).

    :param str param_name: the parameter's name in Pyro's param store (``"<module_name>$$$M"``)
        or in the model (``"M"``).
    """
    multipliers = {} if model is None else model.lr_multipliers
    name = param_name.replace("$$$", ".")
    prefix = "." if model is None else f"{model.module_name}."
    if name.startswith(prefix):
        name = name[len(prefix):]
    match = max((key for key in multipliers if name == key or name.startswith(key + ".")),
                key=len, default=None)
    return 1.0 if match is None else float(multipliers[match])


def _set_lr(optim, lr, model=None):
    """Set the rate of every optimizer Pyro has created so far (times :func:`lr_multiplier`)."""
    store = pyro.get_param_store()
    for param, opt in optim.optim_objs.items():
        for group in opt.param_groups:
            group["lr"] = lr * lr_multiplier(model, store.param_name(param))


def _set_lr_in_state(state, lr, model=None):
    """Set the rate in a saved ``PyroOptim.get_state()`` (per parameter torch state dicts)."""
    for name, opt_state in state.items():
        for group in opt_state["param_groups"]:
            group["lr"] = lr * lr_multiplier(model, name)


def make_optimizer(config, model=None):
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
    adam = {"lr": epoch_lr(0, config), "betas": tuple(config.betas), "clip_norm": config.clip_norm,
            "lrd": config.lrd, "weight_decay": config.weight_decay}
    if model is not None and model.lr_multipliers:
        base = adam

        def adam(param_name):  # Pyro's one-argument form: the normalised name "<module>.<param>"
            return dict(base, lr=base["lr"] * lr_multiplier(model, param_name))
    if config.lr_schedule != "plateau":
        return ClippedAdam(adam)
    return ReduceLROnPlateau({"optimizer": _TorchClippedAdam, "optim_args": adam, "mode": "max",
                              "factor": config.plateau_factor, "patience": config.plateau_patience,
                              "threshold": config.plateau_threshold, "threshold_mode": "abs",
                              "cooldown": config.plateau_cooldown, "min_lr": config.plateau_min_lr})


def _current_lr(optim, default, model=None):
    """The base rate of the optimizers Pyro has created (all equal once divided by their
    :func:`lr_multiplier`), ``default`` before the first."""
    for param, obj in optim.optim_objs.items():
        factor = lr_multiplier(model, pyro.get_param_store().param_name(param))
        if factor > 0:  # a frozen parameter (factor 0) does not tell the base rate
            return getattr(obj, "optimizer", obj).param_groups[0]["lr"] / factor
    return default


def _check_schedule_of_checkpoint(state, config, path):
    """Refuse to resume a checkpoint whose optimizer state belongs to another kind of schedule
    (a plateau checkpoint holds a scheduler state per parameter)."""
    saved_plateau = any(isinstance(v, dict) and "scheduler" in v for v in state.values())
    if state and saved_plateau != (config.lr_schedule == "plateau"):
        saved = "'plateau'" if saved_plateau else "'exponential' or 'constant'"
        raise ValueError(f"{path} was written with lr_schedule={saved}; resume with the same "
                         f"schedule (got {config.lr_schedule!r}) or train into a new folder")


def initialise(model, train_sequences, scheme="srnn"):
    """Apply ``TrainConfig.init`` to a freshly built ``model`` (uses torch's global RNG): the
    model's own :meth:`~pyro_seq.models.ModelContract.initialise` (``"srnn"``/``"normal"``:
    :func:`~pyro_seq.nn.init_weights` on a model that lists the scheme in
    ``weight_init_schemes``, e.g. :class:`~pyro_seq.models.SRNN`, and
    :func:`~pyro_seq.nn.init_output_bias` on any model with a Bernoulli emission; ``"bias"``:
    the output bias only, the visible bias of an energy-based model; ``"none"``: nothing).
    Returns the names of what was initialised (``"weights"``, ``"output_bias"``).
    """
    if scheme not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {scheme!r}")
    return model.initialise(train_sequences, scheme)


class TrainHistory(list):
    """The per-epoch log rows returned by :func:`fit` (a list), with how training ended.

    :ivar str stop_reason: ``"epochs"`` (all epochs done), ``"patience"`` (early stop) or
        ``"time_limit"``.
    :ivar best_epoch: 1-based epoch of the best validation bound (None without validation).
    :ivar best_valid_elbo_per_step: that watched bound: the validation ELBO, or the training
        objective's own bound (``TrainConfig.monitor``, ``MONITORED_BOUND``); None without validation.
    :ivar bool restored_best: the model was given the weights of ``best_epoch`` from
        ``best.pt`` when ``fit`` returned.
    """

    stop_reason = "epochs"
    best_epoch = None
    best_valid_elbo_per_step = None
    restored_best = False


def _missing_steps(mask, config, step, rank=0):
    """The ``observed`` mask of one training update under ``config.missing_prob``: bool
    ``(batch, T)``, False at dropped real steps; a pure function of ``(seed, step, rank)``."""
    from pyro_seq.tasks import drop_frames

    g = torch.Generator().manual_seed(config.seed * 1_000_003 + step * 101 + rank)
    return drop_frames(mask, config.missing_prob, generator=g,
                       keep_first=config.missing_keep_first)


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
    """Put torch's CPU thread count and global RNG states back as they were when ``func``
    returns or raises (saving the CPU RNG state is a 5 KB copy). The CUDA generators' states are
    saved and restored too when the run is on CUDA (``config.device``) or CUDA is already in use;
    a CPU run on a machine that has not touched CUDA does not initialise it."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        config = kwargs.get("config", args[3] if len(args) > 3 else None)
        on_cuda = str(getattr(config, "device", "cpu")).startswith("cuda")
        threads, rng_state = torch.get_num_threads(), torch.get_rng_state()
        cuda_states = (torch.cuda.get_rng_state_all() if torch.cuda.is_available()
                       and (on_cuda or torch.cuda.is_initialized()) else None)
        try:
            return func(*args, **kwargs)
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            torch.set_rng_state(rng_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)

    return wrapper


@_restores_torch_threads_and_rng
def fit(model, train_sequences, valid_sequences, config, out_dir, resume=True):
    """Train ``model`` with SVI; resumable, logged and checkpointed in ``out_dir``.

    :param model: a :class:`~pyro_seq.models.SequenceModel`.
    :param list train_sequences: tensors ``(T_i, D)``; a
        :class:`~pyro_seq.data.SequenceList` carries known inputs ``(T_i, U)`` (controls,
        actions) for a model with ``input_dim = U``, which every update passes as ``inputs=``.
    :param list valid_sequences: tensors ``(T_i, D)``, with inputs as the training data (may be
        empty: no early stopping).
    :param TrainConfig config: settings.
    :param out_dir: folder for ``checkpoint.pt``, ``best.pt``, ``log.csv``, ``log.json``,
        ``loss_curve.png``.
    :param bool resume: continue from ``out_dir/checkpoint.pt`` if it exists (a fresh start,
        and only a fresh start, initialises the model as ``config.init`` says).

    With ``config.world_size = N > 1`` the run is data-parallel (:mod:`pyro_seq.train.distributed`):
    N processes are spawned, each trains on the rows ``rank::N`` of every minibatch with the
    gradients summed over ranks, rank 0 writes the folder, and the trained weights are read back
    into ``model`` here. The results equal the one-process run's up to the random draws (exactly,
    to rounding, for an objective without randomness). Under ``torchrun`` (``RANK`` and
    ``WORLD_SIZE`` in the environment) nothing is spawned: this process trains as rank ``RANK``
    of the launched group of ``WORLD_SIZE`` processes (``config.world_size`` must be 1 or
    ``WORLD_SIZE``), and ``fit`` returns on every rank with the trained weights in ``model``.

    :returns: a :class:`TrainHistory`: the list of per-epoch log rows (of all epochs, resumed
        ones included) with ``stop_reason``, ``best_epoch``, ``best_valid_elbo_per_step`` and
        ``restored_best``. With validation sequences, ``model`` (and Pyro's param store, which
        holds the same tensors) then has the weights of the best validation epoch, read back
        from ``best.pt``; ``checkpoint.pt`` keeps the last epoch's for resuming.
    :raises ValueError: a sequence fails :func:`pyro_seq.validation.validate_sequence_list`
        (message ``"train[i]: ..."`` / ``"valid[i]: ..."``, before anything is written); or
        ``checkpoint.pt`` was written under another kind of ``lr_schedule``.
    :raises pyro_seq.train.CheckpointError: ``checkpoint.pt`` is truncated or corrupt (the
        message names it and says what to do).

    Global state. While it runs, ``fit`` seeds torch's global RNG with ``config.seed`` (then
    draws the initial weights from it; on resume: sets it to the state saved in the checkpoint)
    and, if ``config.num_threads`` is set,
    calls :func:`torch.set_num_threads`; both are put back as they were when it returns or
    raises. Pyro validation is switched per update with :func:`pyro.validation_enabled`, which
    restores it. Pyro's global param store is *not* restored: it is cleared on entry and holds
    the trained model's parameters on return (the training result, as after any Pyro SVI run).
    Python's and numpy's global RNGs are not used (batch order comes from a local numpy
    generator seeded with ``(config.seed, epoch)``).
    """
    config.validate()
    if not model.trains_on_sequences:
        raise Unsupported(model.refusal("fit", "surface"))
    check_objective(model, config.objective)  # before anything is spawned or written
    # the package's one validator, on every sequence (and its known inputs) before anything is
    # written or trained
    for name, seqs in (("train", train_sequences), ("valid", valid_sequences)):
        if seqs or name == "train":
            validate_sequence_list(seqs, model.obs_dim, model.binary_observations, name,
                                   inputs=inputs_of(seqs), input_dim=model.input_dim)
    from pyro_seq.train.distributed import check_launch, launch_environment

    launch = launch_environment()  # under torchrun: this process is one rank, spawn nothing
    if launch is not None:
        check_launch(config, launch)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (launch.world_size if launch is not None else config.world_size) > 1:
        return _fit_distributed(model, train_sequences, valid_sequences, config, out_dir, resume,
                                launch)
    return _fit(model, train_sequences, valid_sequences, config, out_dir, resume, SingleProcess(),
                parse_device(config.device))


def _validation_bound(model, sequences, comm, batch_size, method="elbo", num_particles=1):
    """:func:`evaluate_bound` over all ranks' shards of ``sequences`` (sums all-reduced)."""
    if comm.world_size == 1:
        return evaluate_bound(model, sequences, batch_size, method=method,
                              num_particles=num_particles)
    local = comm.shard_list(sequences)
    total = steps = kl = 0.0
    if local:
        r = evaluate_bound(model, local, batch_size, method=method, num_particles=num_particles)
        total, steps = r["total"], r["num_steps"]
        kl = r.get("kl_per_step", 0.0) * steps
    total, steps, kl = comm.all_sum([total, steps, kl])
    return {"total": total, "num_steps": int(steps), "per_step": total / steps,
            "kl_per_step": kl / steps}


def _fit(model, train_sequences, valid_sequences, config, out_dir, resume, comm, device):
    """The body of :func:`fit` on one rank (``comm``: :mod:`pyro_seq.train.distributed`),
    training on ``device`` (a :class:`torch.device`, this rank's)."""
    main = comm.is_main
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    pyro.clear_param_store()
    torch.manual_seed(config.seed)  # seeds the CPU and every CUDA generator
    loader = SequenceLoader(train_sequences, config.batch_size, shuffle=True, seed=config.seed,
                            chunk_length=config.chunk_length, dtype=model_dtype(model),
                            device=device)
    energy = model.energy_based
    if energy and config.missing_prob > 0:
        raise ValueError("missing_prob needs a latent-variable model with observed= masks; "
                         f"{model.module_name} is energy-based")
    optim = make_optimizer(config, model)
    loss = make_objective(config.objective, config.num_particles, config.free_bits,
                          cd_steps=config.cd_steps)
    model_fn, guide_fn, annealer = model.model, model.guide, None
    if config.kl_anneal_steps > 0 and not energy:  # no latent sites to anneal
        from pyro_seq.infer import LatentScale

        annealer = LatentScale(config.kl_start)
        model_fn, guide_fn = annealer(model.model), annealer(model.guide)
    svi = SVI(model_fn, guide_fn, optim, loss=loss)
    if comm.world_size > 1:  # sum gradients and loss over ranks before every optimizer step
        svi.loss_and_grads = AllReduceGradients(loss, comm).loss_and_grads

    history, start_epoch, global_step = [], 0, 0
    best, bad_epochs, best_state = -math.inf, 0, None
    # only the plateau schedule lowers the rate on a plateau: other schedules keep no copy
    restore_best = config.plateau_restore_best and config.lr_schedule == "plateau"
    ckpt_path = out_dir / "checkpoint.pt"
    fresh = not (resume and ckpt_path.exists())
    if fresh:
        initialise(model, train_sequences, config.init)
    else:
        payload = load_checkpoint(ckpt_path)
        saved_world = payload["extra"].get("world_size", 1)
        if saved_world != comm.world_size:
            raise ValueError(f"{ckpt_path} was written by {saved_world} process(es); resume it "
                             f"with world_size={saved_world} (got {comm.world_size}) or train "
                             f"into a new folder")
        _check_schedule_of_checkpoint(payload["optimizer"], config, ckpt_path)
        if config.lr_schedule == "exponential":  # optimizers are rebuilt lazily from this state
            _set_lr_in_state(payload["optimizer"], epoch_lr(payload["epoch"], config), model)
        payload = restore(payload, model=model, optimizer=optim, path=ckpt_path)
        history, start_epoch = payload["history"], payload["epoch"]
        global_step = payload["global_step"]
        best = payload["extra"].get("best_valid", -math.inf)
        bad_epochs = payload["extra"].get("bad_epochs", 0)
        if restore_best and (out_dir / "best.pt").exists():
            best_state = load_weights(out_dir / "best.pt")
        if comm.world_size > 1:  # every rank continues its own random stream
            torch.set_rng_state(payload["extra"]["rng_states"][comm.rank])
            cuda_states = payload["extra"].get("cuda_rng_states")
            if device.type == "cuda" and cuda_states:
                torch.cuda.set_rng_state(cuda_states[comm.rank], device)
    # to the device before Pyro's param store (and so the optimizer) sees a parameter; after
    # the initialisation, which thereby draws the same weights whatever the device
    model.to(device)
    if comm.world_size > 1:
        pyro.module(model.module_name, model)  # every parameter in the store before step 1
        if fresh:  # the same initial weights, then a different sampling stream per rank
            torch.manual_seed(config.seed + 7919 * comm.rank)

    history = TrainHistory(history)
    stopped_early = config.patience is not None and bad_epochs >= config.patience
    started = time.time()
    # a run that stopped early stays stopped when called again (as the uninterrupted run would)
    bar = tqdm(range(start_epoch, start_epoch if stopped_early else config.epochs),
               initial=start_epoch, total=config.epochs,
               desc="epochs", disable=not (config.progress and main), unit="epoch")
    for epoch in bar:
        model.train()
        model.training_epoch(epoch)  # e.g. the KVAE's dynamics warm-up
        lr = epoch_lr(epoch, config)
        if config.lr_schedule == "exponential":
            _set_lr(optim, lr, model)
        total_loss, epoch_start, num_batches = 0.0, time.time(), 0
        for x, mask, *inputs in loader.batches(epoch):
            # this rank's rows (all of them in one process), and their known inputs
            x, mask, u = comm.shard(x, mask, inputs[0] if inputs else None)
            beta = kl_beta(global_step, config)
            if annealer is not None:
                annealer.beta = beta
            kwargs = {} if u is None else {"inputs": u}
            if config.missing_prob > 0:  # appendix 6.10: missing steps inside the sequences
                kwargs["observed"] = _missing_steps(mask, config, global_step, comm.rank)
            with pyro.validation_enabled(config.pyro_validation):
                step_loss = svi.step(x, mask, **kwargs)
            if not math.isfinite(step_loss):
                raise FloatingPointError(
                    f"non-finite loss {step_loss} at epoch {epoch}, step {global_step}; "
                    "lower the learning rate or raise min_scale")
            total_loss += step_loss
            global_step += 1
            num_batches += 1
        if config.lr_schedule == "plateau":
            lr = _current_lr(optim, config.lr, model)  # the rate of this epoch's updates
        row = {"epoch": epoch + 1, "step": global_step, "beta": kl_beta(global_step, config),
               "lr": lr * config.lrd ** global_step, "seconds": time.time() - epoch_start}
        if energy:  # CD's step value is a monitor per visible element, not a loss per step
            row["train_reconstruction_error"] = total_loss / max(num_batches, 1)
        else:
            row["train_loss_per_step"] = total_loss / loader.num_steps
        if valid_sequences and energy:  # CD has no bound: watch the pseudo-log-likelihood
            watched = _validation_bound(model, valid_sequences, comm, config.valid_batch_size,
                                        method="pseudo_likelihood")["per_step"]
            row["valid_pll_per_step"] = watched
        elif valid_sequences:
            val = _validation_bound(model, valid_sequences, comm, config.valid_batch_size)
            row.update(valid_elbo_per_step=val["per_step"], valid_kl_per_step=val["kl_per_step"])
            watched = val["per_step"]
        if valid_sequences:
            method = (MONITORED_BOUND.get(config.objective)
                      if config.monitor == "objective" and not energy else None)
            if method is not None:  # the training objective's own bound (IWAE_K or FIVO_K)
                watched = _validation_bound(model, valid_sequences, comm, config.valid_batch_size,
                                            method=method,
                                            num_particles=config.num_particles)["per_step"]
            row["valid_bound_per_step"] = watched
            improved = watched > best
            best = max(best, watched)
            if improved and restore_best:  # every rank keeps its own copy
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            # while the KL weight still rises the objective changes under the validation bound:
            # best.pt tracks the best epoch, but the schedule and early stopping wait for beta = 1
            annealing = (annealer is not None and row["beta"] < 1.0
                         and not config.schedule_during_annealing)
            if not annealing:
                bad_epochs = 0 if improved else bad_epochs + 1
            if config.lr_schedule == "plateau" and not annealing:
                optim.step(watched)  # each scheduler: reduce the rate on a plateau
                new_lr = _current_lr(optim, lr, model)
                back_to_best = new_lr < lr and restore_best and best_state is not None
                if back_to_best:  # in place: the param store and the optimizer hold these
                    model.load_state_dict(best_state)
                if new_lr < lr and main:
                    bar.write(f"epoch {epoch + 1}: validation plateau, learning rate "
                              f"{lr:.3g} -> {new_lr:.3g}"
                              + (", weights of the best epoch restored" if back_to_best else ""))
        else:
            improved = True
        history.append(row)
        extra = {"best_valid": best, "bad_epochs": bad_epochs}
        if comm.world_size > 1:
            extra.update(world_size=comm.world_size, rng_states=comm.gather_rng_states())
            cuda_states = comm.gather_cuda_rng_states()
            if cuda_states is not None:
                extra["cuda_rng_states"] = cuda_states
        if main:
            if improved:
                save_weights(model.state_dict(), out_dir / "best.pt")
            save_checkpoint(ckpt_path, model=model, optimizer=optim, epoch=epoch + 1,
                            global_step=global_step, history=history, extra=extra,
                            cuda_rng=device.type == "cuda")
            _write_logs(out_dir, history)
        postfix = ({"recon": f"{row['train_reconstruction_error']:.4f}"} if energy else
                   {"loss/step": f"{row['train_loss_per_step']:.3f}"})
        if valid_sequences and not energy:
            postfix.update({"val": f"{row['valid_elbo_per_step']:.3f}",
                            "KL": f"{row['valid_kl_per_step']:.3f}"})
        elif valid_sequences:
            postfix["val pll"] = f"{row['valid_pll_per_step']:.3f}"
        bar.set_postfix(postfix)
        if config.patience is not None and bad_epochs >= config.patience:
            if main:
                bar.write(f"early stop: no validation improvement in {bad_epochs} epochs")
            history.stop_reason = "patience"
            break
        # one decision for all ranks (their clocks differ)
        used = (time.time() - started if config.time_limit_counts == "wall"
                else sum(r["seconds"] for r in history[len(history) - (epoch + 1 - start_epoch):]))
        if config.time_limit is not None and comm.any(used > config.time_limit):
            if main:
                bar.write(f"time limit of {config.time_limit:.0f} s reached after epoch {epoch + 1}")
            history.stop_reason = "time_limit"
            break
    bar.close()
    if config.patience is not None and bad_epochs >= config.patience:
        history.stop_reason = "patience"  # also when a resumed run had already stopped
    valid = [(row.get("valid_bound_per_step", row.get("valid_elbo_per_step")), -i)
             for i, row in enumerate(history)
             if "valid_elbo_per_step" in row or "valid_bound_per_step" in row]
    comm.barrier()  # rank 0 has written best.pt
    if valid:  # the first epoch with the highest bound is the one best.pt holds
        value, neg_index = max(valid)
        history.best_epoch, history.best_valid_elbo_per_step = history[-neg_index]["epoch"], value
        if (out_dir / "best.pt").exists():
            model.load_state_dict(load_weights(out_dir / "best.pt"))
            history.restored_best = True
        else:  # deleted or lost since the epoch that wrote it (a resumed run)
            warnings.warn(f"{out_dir / 'best.pt'} is missing: the model keeps the weights of the "
                          f"last epoch, not those of the best epoch {history.best_epoch} "
                          "(restored_best is False)", RuntimeWarning)
    if main:
        try:
            from pyro_seq.train.plots import plot_history

            if history:
                plot_history(history, out_dir / "loss_curve.png")
        except ImportError:  # matplotlib missing: logs are still written
            pass
        if comm.world_size > 1:  # what the parent process returns
            (out_dir / "fit_summary.json").write_text(json.dumps({
                "stop_reason": history.stop_reason, "best_epoch": history.best_epoch,
                "best_valid_elbo_per_step": history.best_valid_elbo_per_step,
                "restored_best": history.restored_best}))
    return history


def _worker(rank, world_size, port, model, train_sequences, valid_sequences, config, out_dir,
            resume):
    """One rank of :func:`_fit_distributed` (started by ``torch.multiprocessing.spawn``)."""
    import torch.distributed as dist

    from pyro_seq.train.distributed import init_process_group

    # torch.multiprocessing hands every rank the parent's tensors in one shared-memory storage:
    # without a private copy the ranks would all step the same parameters
    model = copy.deepcopy(model)
    if not config.num_threads and parse_device(config.device).type == "cpu":
        # N processes with torch's default thread count each would oversubscribe the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    device = rank_device(parse_device(config.device), rank)
    comm = init_process_group(rank, world_size, port, config.dist_backend, config.dist_timeout,
                              device=device)
    try:
        _fit(model, train_sequences, valid_sequences, config, Path(out_dir), resume, comm, device)
    finally:
        dist.destroy_process_group()


def _fit_distributed(model, train_sequences, valid_sequences, config, out_dir, resume,
                     launch=None):
    """Spawn ``config.world_size`` ranks, wait, and read rank 0's result back into ``model``;
    or, under a launcher (``launch``, a :class:`~pyro_seq.train.distributed.Launch`), train
    here as its rank: join the group, check that every rank has the same data, settings and
    output folder, start from rank 0's weights, and train."""
    import torch.multiprocessing as mp

    from pyro_seq.train.distributed import free_port

    if launch is not None:
        from dataclasses import asdict

        import torch.distributed as dist

        from pyro_seq.train.distributed import (broadcast_weights, check_same_run,
                                                check_shared_folder, join_launched_group)

        comm, joined = join_launched_group(launch, parse_device(config.device),
                                           config.dist_backend, config.dist_timeout)
        try:
            settings = {k: v for k, v in asdict(config).items()
                        if k not in ("world_size", "progress", "num_threads", "extra")}
            check_same_run(comm, train_sequences, valid_sequences, dict(settings, resume=resume))
            check_shared_folder(comm, out_dir)
            broadcast_weights(comm, model)
            return _fit(model, train_sequences, valid_sequences, config, out_dir, resume, comm,
                        comm.device)
        finally:
            if joined:
                dist.destroy_process_group()
    summary_path = out_dir / "fit_summary.json"
    if summary_path.exists():
        summary_path.unlink()
    try:
        mp.spawn(_worker, nprocs=config.world_size, join=True,
                 args=(config.world_size, free_port(), model, train_sequences, valid_sequences,
                       config, str(out_dir), resume))
    except mp.ProcessRaisedException as e:
        raise RuntimeError(f"distributed training failed in a rank: {e}") from None
    except mp.ProcessExitedException as e:
        raise RuntimeError(f"distributed training failed: {e} (the other ranks were stopped)") from None
    summary = json.loads(summary_path.read_text())
    history = TrainHistory(json.loads((out_dir / "log.json").read_text()) if (out_dir / "log.json").exists() else [])
    for key, value in summary.items():
        setattr(history, key, value)
    weights = (load_weights(out_dir / "best.pt") if summary["restored_best"]
               else load_checkpoint(out_dir / "checkpoint.pt")["model"])
    model.load_state_dict(weights)
    model.to(parse_device(config.device))  # as after a one-process fit: on the (first) device
    pyro.clear_param_store()
    pyro.module(model.module_name, model)  # as after a one-process fit: the store holds them
    return history
