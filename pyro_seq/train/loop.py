"""The SVI training loop: annealing, clipping, validation, early stopping, exact resume.

:func:`fit` trains any :class:`~pyro_seq.models.SequenceModel` with any objective of
:mod:`pyro_seq.train.objectives` under the settings of a
:class:`~pyro_seq.train.config.TrainConfig`. Each epoch it

1. runs :class:`pyro.infer.SVI` over shuffled minibatches (order a function of seed and epoch),
   with :class:`~pyro.optim.ClippedAdam` (per-parameter gradient-norm clipping) under one of the
   learning-rate schedules ``lr_schedule`` (:mod:`pyro_seq.train.schedules`) and optional KL
   annealing (:class:`~pyro_seq.infer.LatentScale`, beta rising
   linearly from ``kl_start`` to 1 over ``kl_anneal_steps`` updates, thesis 4.8.1). Pyro's
   per-site validation (argument checks, NaN hooks on every log-density) is off during the
   updates unless ``pyro_validation=True``: the inputs are checked once per batch by the model
   and a non-finite loss stops training with an error, so the per-site checks only add cost;
2. evaluates the validation ELBO in nats per step (and its KL term) and, under the default
   ``lr_schedule="plateau"``, halves the rate when it has not improved for a few epochs;
3. calls ``on_epoch`` (an argument of :func:`fit`, optional), whose numbers join the epoch's
   row; appends the row to ``log.csv``/``log.json``, saves ``checkpoint.pt`` (everything needed to
   continue exactly, the scheduler's state included) and ``best.pt`` when validation improves,
   and redraws ``loss_curve.png``;
4. stops early after ``patience`` epochs without validation improvement.

When it stops (patience, ``epochs`` reached or ``time_limit``) the model holds the weights of
its best validation epoch (read back from ``best.pt``), in eval mode (no dropout);
``checkpoint.pt`` keeps the last ones,
so that calling :func:`fit` again on the same output folder resumes from ``checkpoint.pt`` and
gives the same parameters as an uninterrupted run.

The sequences are validated once per call, by :func:`fit`
(:func:`pyro_seq.validation.validate_sequence_list`); the validation bounds of every epoch
reuse one set of validation batches built after the checks and do not check them again.

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
(:mod:`pyro_seq.train.distributed`, :mod:`pyro_seq.train.processes`). ``fit`` returns with the
model on the device.

Initialisation (``TrainConfig.init``, only on a fresh start, never on resume):

* ``"bias"`` (default): for every model with a Bernoulli emission, the emission's output bias
  becomes the logits of the training set's note frequencies
  (:func:`pyro_seq.nn.init_output_bias`; for an energy-based model, its visible bias); all
  other weights stay as constructed (the DMM's gated transition starts at the identity);
* ``"srnn"``: the same, and :func:`pyro_seq.nn.init_weights` (the SRNN authors' scheme) on a
  model that declares it in ``weight_init_schemes`` (:class:`~pyro_seq.models.SRNN`);
  ``"normal"``: with ``init_weights(scheme="normal")``. On JSB
  Chorales these weights fit the training set faster and generalise worse than the bias only
  or nothing (one training seed each; measured: docs/benchmarks.rst, section "Do the training
  defaults transfer?");
* ``"none"``: the model as constructed.
"""

import csv
import functools
import json
import math
import numbers
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Sequence, Union

import pyro
import torch
from pyro.infer import SVI

from pyro_seq.data.batching import SequenceLoader
from pyro_seq.models.contract import Unsupported
from pyro_seq.ops.padding import inputs_of
from pyro_seq.progress import progress_bar
from pyro_seq.train.checkpoint import (
    load_checkpoint,
    load_weights,
    restore,
    save_checkpoint,
    save_weights,
)
from pyro_seq.train.config import INITS
from pyro_seq.train.distributed import AllReduceGradients, SingleProcess
from pyro_seq.train.evaluate import evaluate_checked_bound, model_device, model_dtype
from pyro_seq.train.objectives import check_objective, make_objective
from pyro_seq.train.schedules import (
    check_schedule_of_checkpoint,
    current_lr,
    epoch_lr,
    kl_beta,
    make_optimizer,
    set_lr,
    set_lr_in_state,
)
from pyro_seq.validation import parse_device, validate_sequence_list

if TYPE_CHECKING:
    import os

    from pyro_seq.models.contract import ModelContract
    from pyro_seq.train.config import TrainConfig

__all__ = ["MONITORED_BOUND", "TrainHistory", "fit", "initialise"]

#: The validation bound watched by early stopping, the plateau schedule and ``best.pt`` when
#: ``TrainConfig.monitor == "objective"``: a model trained with IWAE_K (FIVO_K) is judged by the
#: IWAE (SMC) estimate with the same K, the quantity its training optimises; other objectives
#: by the ELBO.
MONITORED_BOUND = {"iwae": "iwae", "fivo": "smc"}
#: The column of an epoch's log row that ``time_limit_counts`` sums ("wall" counts the call).
EPOCH_SECONDS = {"training": "seconds", "cpu": "cpu_seconds"}


def initialise(
    model: "ModelContract", train_sequences: Sequence[torch.Tensor], scheme: str = "srnn"
) -> List[str]:
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
        objective's own bound (``TrainConfig.monitor``, ``MONITORED_BOUND``); None without
        validation.
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
    return drop_frames(mask, config.missing_prob, generator=g, keep_first=config.missing_keep_first)


def _write_logs(out_dir, history):
    with open(out_dir / "log.json", "w") as f:
        json.dump(history, f, indent=1)
    # the columns of every row (rows of older runs may lack some)
    keys = list(dict.fromkeys(k for row in history for k in row))
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
        cuda_states = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_available() and (on_cuda or torch.cuda.is_initialized())
            else None
        )
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
def fit(
    model: "ModelContract",
    train_sequences: Sequence[torch.Tensor],
    valid_sequences: Optional[Sequence[torch.Tensor]],
    config: "TrainConfig",
    out_dir: Union[str, "os.PathLike[str]"],
    resume: bool = True,
    on_epoch: Optional[
        Callable[[int, "ModelContract", Mapping[str, Any]], Optional[Mapping[str, float]]]
    ] = None,
) -> "TrainHistory":
    """Train ``model`` with SVI; resumable, logged and checkpointed in ``out_dir``.

    :param model: a :class:`~pyro_seq.models.SequenceModel`.
    :param list train_sequences: tensors ``(T_i, D)``; a
        :class:`~pyro_seq.data.SequenceList` carries known inputs ``(T_i, U)`` (controls,
        actions) for a model with ``input_dim = U``, which every update passes as ``inputs=``.
    :param list valid_sequences: tensors ``(T_i, D)``, with inputs as the training data (may be
        empty: no early stopping).
    :param TrainConfig config: settings. Its defaults train at a constant KL weight of 1 (no
        KL annealing; ``pyro-seq train`` anneals from 0.2 over 1000 updates by default, and the
        tuned SRNN runs of the benchmarks page used that annealing): see
        :class:`~pyro_seq.train.TrainConfig` for every field and ``pyro-seq presets`` for the
        published configurations.
    :param out_dir: folder for ``checkpoint.pt``, ``best.pt``, ``log.csv``, ``log.json``,
        ``loss_curve.png``.
    :param bool resume: continue from ``out_dir/checkpoint.pt`` if it exists (a fresh start,
        and only a fresh start, initialises the model as ``config.init`` says).
    :param on_epoch: None, or ``on_epoch(epoch, model, row) -> dict or None``, called after
        each epoch's validation (and plateau step) and before its checkpoint, with the 0-based
        ``epoch`` (``row["epoch"]`` is ``epoch + 1``), the model holding the weights that
        ``checkpoint.pt`` will hold, and a copy of the epoch's log row so far. The numbers
        it returns (``{name: int or float}``, finite; names that the row does not have yet) join
        that row: they go into the returned history, ``log.json``/``log.csv`` and
        ``checkpoint.pt``, so a resumed run keeps the rows of earlier calls (the hook is only
        called for the epochs this call trains). It runs under :func:`torch.random.fork_rng`,
        so its random draws do not change the training's. Per-epoch measurements of a
        diagnostic, e.g. scores of the learnt states; not part of :class:`TrainConfig` (a
        function is not a setting that a checkpoint or the CLI could carry). One process only
        (``world_size`` 1).

    With ``config.world_size = N > 1`` the run is data-parallel
    (:mod:`pyro_seq.train.distributed`, :mod:`pyro_seq.train.processes`): N processes are spawned, each trains on the rows ``rank::N`` of every minibatch with the
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
        ``checkpoint.pt`` was written under another kind of ``lr_schedule``; or ``on_epoch``
        returned a value that is not a finite number, or a name the row already has.
    :raises TypeError: ``on_epoch`` is not callable or returned neither a mapping nor None.
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
    if on_epoch is not None and not callable(on_epoch):
        raise TypeError(
            f"on_epoch must be a function (epoch, model, row) or None, got {on_epoch!r}"
        )
    if not model.trains_on_sequences:
        raise Unsupported(model.refusal("fit", "surface"))
    check_objective(model, config.objective)  # before anything is spawned or written
    # the package's one validator, on every sequence (and its known inputs) before anything is
    # written or trained; nothing inside the run checks them again
    for name, seqs in (("train", train_sequences), ("valid", valid_sequences)):
        if seqs or name == "train":
            validate_sequence_list(
                seqs,
                model.obs_dim,
                model.binary_observations,
                name,
                inputs=inputs_of(seqs),
                input_dim=model.input_dim,
            )
    from pyro_seq.train.distributed import check_launch, launch_environment

    launch = launch_environment()  # under torchrun: this process is one rank, spawn nothing
    if launch is not None:
        check_launch(config, launch)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (launch.world_size if launch is not None else config.world_size) > 1:
        if on_epoch is not None:
            raise ValueError(
                "on_epoch is supported in one process only; train with world_size=1 or "
                "measure after fit returns"
            )
        from pyro_seq.train.processes import fit_processes

        return fit_processes(
            model, train_sequences, valid_sequences, config, out_dir, resume, launch
        )
    return fit_rank(
        model,
        train_sequences,
        valid_sequences,
        config,
        out_dir,
        resume,
        SingleProcess(),
        parse_device(config.device),
        on_epoch,
    )


def fit_rank(
    model, train_sequences, valid_sequences, config, out_dir, resume, comm, device, on_epoch=None
):
    """The body of :func:`fit` on one rank (``comm``: :mod:`pyro_seq.train.distributed`),
    training on ``device`` (a :class:`torch.device`, this rank's), on sequences that
    :func:`fit` has validated; ``on_epoch``: :func:`fit`'s, called on rank 0."""
    run = _Run(model, train_sequences, valid_sequences, config, out_dir, comm, device)
    run.start(resume)
    for epoch in run.progress_bar():
        row = run.train_epoch(epoch)
        improved = run.validate(epoch, row)
        if on_epoch is not None and run.main:
            _epoch_hook(on_epoch, epoch, model, row, device)
        run.checkpoint(epoch, row, improved)
        if run.should_stop(epoch):
            break
    return run.finish()


def _epoch_hook(on_epoch, epoch, model, row, device):
    """Call :func:`fit`'s ``on_epoch`` on a copy of ``row`` (torch's random streams forked) and
    merge the finite numbers it returns into ``row``."""
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        values = on_epoch(epoch, model, dict(row))
    if values is None:
        return
    if not isinstance(values, Mapping):
        raise TypeError(
            f"on_epoch must return a dict of numbers or None, got {type(values).__name__} "
            f"at epoch {epoch + 1}"
        )
    for key, value in values.items():
        if key in row or not isinstance(key, str):
            raise ValueError(
                f"on_epoch returned the name {key!r} at epoch {epoch + 1}, which the log row "
                "already has (or is not a string); give its value a new name"
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
        ):
            raise ValueError(
                f"on_epoch returned {key!r}: {value!r} at epoch {epoch + 1}; return finite "
                "numbers (int or float) only, e.g. float(tensor)"
            )
    row.update(
        (key, int(value) if isinstance(value, numbers.Integral) else float(value))
        for key, value in values.items()
    )


class _Validation:
    """The validation sequences of one rank (all of them in one process, else its shard
    ``rank::N``), validated by :func:`fit`, with their batches built once; :meth:`bound` is
    :func:`~pyro_seq.train.evaluate_bound` on them, summed over the ranks."""

    def __init__(self, model, sequences, comm, batch_size):
        self.comm, self.batch_size = comm, batch_size
        self.sequences = sequences if comm.world_size == 1 else comm.shard_list(sequences)
        self.loader = None
        if self.sequences:  # the batches of evaluate_bound, padded in the model's dtype there
            self.loader = SequenceLoader(
                self.sequences,
                batch_size,
                shuffle=False,
                dtype=model_dtype(model),
                device=model_device(model),
            )

    def bound(self, model, method="elbo", num_particles=1):
        """The bound ``method`` over every rank's validation sequences: ``total``,
        ``num_steps``, ``per_step`` and ``kl_per_step``."""
        if self.comm.world_size == 1:
            return evaluate_checked_bound(
                model,
                self.sequences,
                self.batch_size,
                method=method,
                num_particles=num_particles,
                loader=self.loader,
            )
        total = steps = kl = 0.0
        if self.sequences:
            r = evaluate_checked_bound(
                model,
                self.sequences,
                self.batch_size,
                method=method,
                num_particles=num_particles,
                loader=self.loader,
            )
            total, steps = r["total"], r["num_steps"]
            kl = r.get("kl_per_step", 0.0) * steps
        total, steps, kl = self.comm.all_sum([total, steps, kl])
        return {
            "total": total,
            "num_steps": int(steps),
            "per_step": total / steps,
            "kl_per_step": kl / steps,
        }


class _Run:
    """One rank's training run, in the steps of :func:`_fit`: the constructor sets up (seeds,
    batches, optimizer, objective, annealing), :meth:`start` initialises a fresh model or
    resumes from ``checkpoint.pt``; then every epoch :meth:`train_epoch`, :meth:`validate`,
    :meth:`checkpoint` and :meth:`should_stop`; :meth:`finish` restores the best weights."""

    def __init__(self, model, train_sequences, valid_sequences, config, out_dir, comm, device):
        self.model, self.config, self.out_dir = model, config, out_dir
        self.train_sequences, self.valid_sequences = train_sequences, valid_sequences
        self.comm, self.device, self.main = comm, device, comm.is_main
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        pyro.clear_param_store()
        torch.manual_seed(config.seed)  # seeds the CPU and every CUDA generator
        self.loader = SequenceLoader(
            train_sequences,
            config.batch_size,
            shuffle=True,
            seed=config.seed,
            chunk_length=config.chunk_length,
            dtype=model_dtype(model),
            device=device,
        )
        self.energy = model.energy_based
        if self.energy and config.missing_prob > 0:
            raise ValueError(
                "missing_prob needs a latent-variable model with observed= masks; "
                f"{model.module_name} is energy-based"
            )
        self.optim = make_optimizer(config, model)
        loss = make_objective(
            config.objective, config.num_particles, config.free_bits, cd_steps=config.cd_steps
        )
        model_fn, guide_fn, self.annealer = model.model, model.guide, None
        if config.kl_anneal_steps > 0 and not self.energy:  # no latent sites to anneal
            from pyro_seq.infer import LatentScale

            self.annealer = LatentScale(config.kl_start)
            model_fn, guide_fn = self.annealer(model.model), self.annealer(model.guide)
        self.svi = SVI(model_fn, guide_fn, self.optim, loss=loss)
        if comm.world_size > 1:  # sum gradients and loss over ranks before every optimizer step
            self.svi.loss_and_grads = AllReduceGradients(loss, comm).loss_and_grads
        self.history, self.start_epoch, self.global_step = TrainHistory(), 0, 0
        self.best, self.bad_epochs, self.best_state = -math.inf, 0, None
        # only the plateau schedule lowers the rate on a plateau: other schedules keep no copy
        self.restore_best = config.plateau_restore_best and config.lr_schedule == "plateau"
        self.ckpt_path = out_dir / "checkpoint.pt"
        self.validation = self.bar = None
        self.lr = config.lr  # the base rate of the current epoch's updates

    # --- before the first epoch ---------------------------------------------------------------

    def start(self, resume):
        """Initialise a fresh model (``config.init``) or resume from ``checkpoint.pt``, then move
        the model to the device and build the validation batches there."""
        model, comm = self.model, self.comm
        fresh = not (resume and self.ckpt_path.exists())
        if fresh:
            initialise(model, self.train_sequences, self.config.init)
        else:
            self._resume()
        # to the device before Pyro's param store (and so the optimizer) sees a parameter; after
        # the initialisation, which thereby draws the same weights whatever the device
        model.to(self.device)
        if comm.world_size > 1:
            pyro.module(model.module_name, model)  # every parameter in the store before step 1
            if fresh:  # the same initial weights, then a different sampling stream per rank
                torch.manual_seed(self.config.seed + 7919 * comm.rank)
        if self.valid_sequences:
            self.validation = _Validation(
                model, self.valid_sequences, comm, self.config.valid_batch_size
            )

    def _resume(self):
        """Weights, optimizer and scheduler states, history, counters and random streams from
        ``checkpoint.pt`` (refused when it was written by another number of processes or under
        another kind of schedule)."""
        config, comm, path = self.config, self.comm, self.ckpt_path
        payload = load_checkpoint(path)
        saved_world = payload["extra"].get("world_size", 1)
        if saved_world != comm.world_size:
            raise ValueError(
                f"{path} was written by {saved_world} process(es); resume it "
                f"with world_size={saved_world} (got {comm.world_size}) or train "
                f"into a new folder"
            )
        check_schedule_of_checkpoint(payload["optimizer"], config, path)
        if config.lr_schedule == "exponential":  # optimizers are rebuilt lazily from this state
            set_lr_in_state(payload["optimizer"], epoch_lr(payload["epoch"], config), self.model)
        payload = restore(payload, model=self.model, optimizer=self.optim, path=path)
        self.history, self.start_epoch = TrainHistory(payload["history"]), payload["epoch"]
        self.global_step = payload["global_step"]
        self.best = payload["extra"].get("best_valid", -math.inf)
        self.bad_epochs = payload["extra"].get("bad_epochs", 0)
        if self.restore_best and (self.out_dir / "best.pt").exists():
            self.best_state = load_weights(self.out_dir / "best.pt")
        if comm.world_size > 1:  # every rank continues its own random stream
            torch.set_rng_state(payload["extra"]["rng_states"][comm.rank])
            cuda_states = payload["extra"].get("cuda_rng_states")
            if self.device.type == "cuda" and cuda_states:
                torch.cuda.set_rng_state(cuda_states[comm.rank], self.device)

    def _out_of_patience(self):
        return self.config.patience is not None and self.bad_epochs >= self.config.patience

    def progress_bar(self):
        """The epochs still to train, as a progress bar (shown by rank 0): none after an early
        stop, as the uninterrupted run would have stopped there."""
        config = self.config
        self.started = time.time()
        last = self.start_epoch if self._out_of_patience() else config.epochs
        self.bar = progress_bar(
            range(self.start_epoch, last),
            initial=self.start_epoch,
            total=config.epochs,
            desc="epochs",
            disable=not (config.progress and self.main),
            unit="epoch",
        )
        return self.bar

    # --- one epoch ----------------------------------------------------------------------------

    def train_epoch(self, epoch):
        """One pass of SVI updates over the minibatches of ``epoch``; returns its log row."""
        model, config, optim = self.model, self.config, self.optim
        model.train()
        model.training_epoch(epoch)  # e.g. the KVAE's dynamics warm-up
        self.lr = epoch_lr(epoch, config)
        if config.lr_schedule == "exponential":
            set_lr(optim, self.lr, model)
        total_loss, epoch_start, cpu_start, num_batches = 0.0, time.time(), time.process_time(), 0
        for x, mask, *inputs in self.loader.batches(epoch):
            total_loss += self._update(epoch, x, mask, inputs[0] if inputs else None)
            num_batches += 1
        if config.lr_schedule == "plateau":
            self.lr = current_lr(optim, config.lr, model)  # the rate of this epoch's updates
        row = {
            "epoch": epoch + 1,
            "step": self.global_step,
            "beta": kl_beta(self.global_step, config),
            "lr": self.lr * config.lrd**self.global_step,
            "seconds": time.time() - epoch_start,
            "cpu_seconds": time.process_time() - cpu_start,  # this process, all its threads
        }
        if self.energy:  # CD's step value is a monitor per visible element, not a loss per step
            row["train_reconstruction_error"] = total_loss / max(num_batches, 1)
        else:
            row["train_loss_per_step"] = total_loss / self.loader.num_steps
        return row

    def _update(self, epoch, x, mask, inputs):
        """One SVI step on this rank's rows of a minibatch; returns its loss."""
        config = self.config
        x, mask, u = self.comm.shard(x, mask, inputs)  # this rank's rows (all in one process)
        beta = kl_beta(self.global_step, config)
        if self.annealer is not None:
            self.annealer.beta = beta
        kwargs = {} if u is None else {"inputs": u}
        if config.missing_prob > 0:  # appendix 6.10: missing steps inside the sequences
            kwargs["observed"] = _missing_steps(mask, config, self.global_step, self.comm.rank)
        with pyro.validation_enabled(config.pyro_validation):
            step_loss = self.svi.step(x, mask, **kwargs)
        if not math.isfinite(step_loss):
            raise FloatingPointError(
                f"non-finite loss {step_loss} at epoch {epoch}, step {self.global_step}; "
                "lower the learning rate or raise min_scale"
            )
        self.global_step += 1
        return step_loss

    def validate(self, epoch, row):
        """The validation bounds of the epoch into ``row``; follow the best epoch, count epochs
        without improvement and step the plateau schedule. Returns whether the watched bound
        improved (always True without validation sequences)."""
        if self.validation is None:
            return True
        config = self.config
        watched = self._watched_bound(row)
        improved = watched > self.best
        self.best = max(self.best, watched)
        if improved and self.restore_best:  # every rank keeps its own copy
            self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        # while the KL weight still rises the objective changes under the validation bound:
        # best.pt tracks the best epoch, but the schedule and early stopping wait for beta = 1
        annealing = (
            self.annealer is not None and row["beta"] < 1.0 and not config.schedule_during_annealing
        )
        if not annealing:
            self.bad_epochs = 0 if improved else self.bad_epochs + 1
        if config.lr_schedule == "plateau" and not annealing:
            self._step_plateau_schedule(epoch, watched)
        return improved

    def _watched_bound(self, row):
        """The validation bounds into ``row``: the ELBO and its KL term (the
        pseudo-log-likelihood of an energy-based model, which has no bound), and the watched
        one (``TrainConfig.monitor``, :data:`MONITORED_BOUND`), which it returns."""
        config, model = self.config, self.model
        if self.energy:  # CD has no bound: watch the pseudo-log-likelihood
            watched = self.validation.bound(model, method="pseudo_likelihood")["per_step"]
            row["valid_pll_per_step"] = watched
        else:
            val = self.validation.bound(model)
            row.update(valid_elbo_per_step=val["per_step"], valid_kl_per_step=val["kl_per_step"])
            watched = val["per_step"]
        method = (
            MONITORED_BOUND.get(config.objective)
            if config.monitor == "objective" and not self.energy
            else None
        )
        if method is not None:  # the training objective's own bound (IWAE_K or FIVO_K)
            watched = self.validation.bound(
                model, method=method, num_particles=config.num_particles
            )["per_step"]
        row["valid_bound_per_step"] = watched
        return watched

    def _step_plateau_schedule(self, epoch, watched):
        """Every parameter's scheduler sees the watched bound; when they lower the rate, the
        best epoch's weights come back (``plateau_restore_best``)."""
        lr = self.lr
        self.optim.step(watched)  # each scheduler: reduce the rate on a plateau
        new_lr = current_lr(self.optim, lr, self.model)
        back_to_best = new_lr < lr and self.restore_best and self.best_state is not None
        if back_to_best:  # in place: the param store and the optimizer hold these
            self.model.load_state_dict(self.best_state)
        if new_lr < lr and self.main:
            self.bar.write(
                f"epoch {epoch + 1}: validation plateau, learning rate "
                f"{lr:.3g} -> {new_lr:.3g}"
                + (", weights of the best epoch restored" if back_to_best else "")
            )

    def checkpoint(self, epoch, row, improved):
        """Log the epoch; rank 0 writes ``best.pt`` (if ``improved``), ``checkpoint.pt`` (with
        every rank's random streams) and the logs."""
        comm, model = self.comm, self.model
        self.history.append(row)
        extra = {"best_valid": self.best, "bad_epochs": self.bad_epochs}
        if comm.world_size > 1:
            extra.update(world_size=comm.world_size, rng_states=comm.gather_rng_states())
            cuda_states = comm.gather_cuda_rng_states()
            if cuda_states is not None:
                extra["cuda_rng_states"] = cuda_states
        if self.main:
            if improved:
                save_weights(model.state_dict(), self.out_dir / "best.pt")
            save_checkpoint(
                self.ckpt_path,
                model=model,
                optimizer=self.optim,
                epoch=epoch + 1,
                global_step=self.global_step,
                history=self.history,
                extra=extra,
                cuda_rng=self.device.type == "cuda",
            )
            _write_logs(self.out_dir, self.history)
        postfix = (
            {"recon": f"{row['train_reconstruction_error']:.4f}"}
            if self.energy
            else {"loss/step": f"{row['train_loss_per_step']:.3f}"}
        )
        if self.validation is not None and not self.energy:
            postfix.update(
                {
                    "val": f"{row['valid_elbo_per_step']:.3f}",
                    "KL": f"{row['valid_kl_per_step']:.3f}",
                }
            )
        elif self.validation is not None:
            postfix["val pll"] = f"{row['valid_pll_per_step']:.3f}"
        self.bar.set_postfix(postfix)

    def should_stop(self, epoch):
        """Early stopping (``patience``) or the time limit, decided alike on every rank."""
        config, history = self.config, self.history
        if self._out_of_patience():
            if self.main:
                self.bar.write(f"early stop: no validation improvement in {self.bad_epochs} epochs")
            history.stop_reason = "patience"
            return True
        # one decision for all ranks (their clocks differ)
        this_call = history[len(history) - (epoch + 1 - self.start_epoch) :]  # its epochs' rows
        used = (
            time.time() - self.started
            if config.time_limit_counts == "wall"
            else sum(r[EPOCH_SECONDS[config.time_limit_counts]] for r in this_call)
        )
        if config.time_limit is not None and self.comm.any(used > config.time_limit):
            if self.main:
                self.bar.write(
                    f"time limit of {config.time_limit:.0f} s reached after epoch {epoch + 1}"
                )
            history.stop_reason = "time_limit"
            return True
        return False

    # --- after the last epoch -----------------------------------------------------------------

    def finish(self):
        """Give the model the best validation epoch's weights (from ``best.pt``) and put it in
        eval mode (a model with dropout, such as ``STORN(dropout=p)``, generates and scores
        without it after ``fit``; ``fit`` itself sets training mode before every epoch), draw
        the loss curve; returns the :class:`TrainHistory`."""
        history, out_dir, comm = self.history, self.out_dir, self.comm
        self.bar.close()
        self.model.eval()
        if self._out_of_patience():
            history.stop_reason = "patience"  # also when a resumed run had already stopped
        valid = [
            (row.get("valid_bound_per_step", row.get("valid_elbo_per_step")), -i)
            for i, row in enumerate(history)
            if "valid_elbo_per_step" in row or "valid_bound_per_step" in row
        ]
        comm.barrier()  # rank 0 has written best.pt
        if valid:  # the first epoch with the highest bound is the one best.pt holds
            value, neg_index = max(valid)
            history.best_epoch = history[-neg_index]["epoch"]
            history.best_valid_elbo_per_step = value
            if (out_dir / "best.pt").exists():
                self.model.load_state_dict(load_weights(out_dir / "best.pt"))
                history.restored_best = True
            else:  # deleted or lost since the epoch that wrote it (a resumed run)
                warnings.warn(
                    f"{out_dir / 'best.pt'} is missing: the model keeps the weights of "
                    f"the last epoch, not those of the best epoch {history.best_epoch} "
                    "(restored_best is False)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if self.main:
            try:
                from pyro_seq.train.plots import plot_history

                if history:
                    plot_history(history, out_dir / "loss_curve.png")
            except ImportError:  # matplotlib missing: logs are still written
                pass
            if comm.world_size > 1:  # what the parent process returns
                (out_dir / "fit_summary.json").write_text(
                    json.dumps(
                        {
                            "stop_reason": history.stop_reason,
                            "best_epoch": history.best_epoch,
                            "best_valid_elbo_per_step": history.best_valid_elbo_per_step,
                            "restored_best": history.restored_best,
                        }
                    )
                )
        return history
