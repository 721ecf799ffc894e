"""The settings of a training run, :class:`TrainConfig`: one flat dataclass whose fields are
grouped (:data:`GROUPS`) and documented in place.

Each field is declared with :func:`option`, which writes its default once and keeps in
``dataclasses.field(metadata=...)`` what else belongs to it: its group, its unit, a one-line
doc (what it means and when to change it), and how the command line offers it (flag name, range check, choices, and, where the command line
deliberately starts elsewhere, a documented CLI default). The command line's ``train`` flags
(:func:`pyro_seq.cli.add_train_options`) and the benchmark scripts' flags are generated from
these declarations, so their defaults cannot drift from :func:`~pyro_seq.train.fit`'s, and
their help is the doc written here. :func:`options` lists the declarations; the API page's
table of the fields is generated from them too.
"""

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import NamedTuple, Optional

import torch

from pyro_seq.nn.init import INIT_SCHEMES
from pyro_seq.train.distributed import rank_device
from pyro_seq.train.objectives import ENERGY_OBJECTIVES, OBJECTIVES
from pyro_seq.validation import parse_device

__all__ = [
    "GROUPS",
    "INITS",
    "LR_SCHEDULES",
    "Option",
    "TrainConfig",
    "defaults_summary",
    "option",
    "options",
]

LR_SCHEDULES = ("plateau", "exponential", "constant")
#: What ``TrainConfig.time_limit`` counts (:attr:`TrainConfig.time_limit_counts`).
TIME_LIMIT_COUNTS = ("wall", "training", "cpu")
INITS = INIT_SCHEMES + ("bias", "none")

#: The groups of :class:`TrainConfig`'s fields, in order: key -> title (the command line's
#: ``train --help`` shows the flags under these titles).
GROUPS = {
    "objective": "objective",
    "optimiser": "optimiser (ClippedAdam)",
    "schedule": "learning-rate schedule",
    "annealing": "KL annealing and free bits",
    "batches": "minibatches and missing data",
    "stopping": "stopping",
    "start": "initialisation and randomness",
    "devices": "devices and processes",
    "output": "checks and output",
}


class Option(NamedTuple):
    """The declaration of one :class:`TrainConfig` field (its ``metadata["option"]``).

    ``check`` names the command line's range type of a numeric field (an attribute of
    :mod:`pyro_seq.cli`, e.g. ``"POSITIVE_INT"``); ``cli_default`` is the command line's own
    default where it deliberately differs (``cli_default_why`` says why; :data:`MISSING`:
    the field's default); ``cli_none`` is the command-line value that stands for None (e.g.
    ``--patience 0``); ``invert``: a bool field offered as a ``store_true`` flag that sets it
    to False (``--quiet``); ``cli_excluded``: why the field has no flag (None: it has one);
    ``unit``: the unit of a numeric field (``""``: a pure number; None: not a quantity, e.g. a
    choice, a flag or a seed).
    """

    name: str
    default: object
    group: str
    doc: str
    flag: str
    check: Optional[str] = None
    choices: Optional[tuple] = None
    nargs: Optional[int] = None
    cli_default: object = MISSING
    cli_default_why: Optional[str] = None
    cli_none: object = None
    invert: bool = False
    cli_excluded: Optional[str] = None
    unit: Optional[str] = None

    @property
    def command_line_default(self):
        """The flag's default, ``cli_default`` where declared, else the field's."""
        return self.default if self.cli_default is MISSING else self.cli_default


def option(
    default,
    group,
    doc,
    *,
    flag=None,
    check=None,
    choices=None,
    nargs=None,
    cli_default=MISSING,
    cli_default_why=None,
    cli_none=None,
    invert=False,
    cli_excluded=None,
    unit=None,
):
    """A :class:`TrainConfig` field: its ``default``, ``group`` (a key of :data:`GROUPS`), a
    one-line ``doc`` (what the field means, then when to change it; other fields named in
    double backquotes), its ``unit`` and the command-line declaration (see :class:`Option`;
    ``flag`` defaults to ``--`` and the field's name with dashes)."""
    if group not in GROUPS:
        raise ValueError(f"group must be one of {tuple(GROUPS)}, got {group!r}")
    if (cli_default is MISSING) != (cli_default_why is None):
        raise ValueError("a CLI default that differs from the field's needs cli_default_why")
    spec = dict(
        group=group,
        doc=doc,
        flag=flag,
        check=check,
        choices=choices,
        nargs=nargs,
        cli_default=cli_default,
        cli_default_why=cli_default_why,
        cli_none=cli_none,
        invert=invert,
        cli_excluded=cli_excluded,
        unit=unit,
    )
    return field(default=default, metadata={"option": spec})


@dataclass
class TrainConfig:
    """Settings of a training run (saved as ``config.json`` next to the checkpoints).

    Every field is a keyword argument, ``TrainConfig(epochs=50, lr=3e-4)``;
    :meth:`validate` checks them together.
    """

    # --- objective ---
    objective: str = option(
        "elbo",
        "objective",
        "training objective: elbo (Trace_ELBO), meanfield, iwae (IWAE_K) or fivo (FIVO_K) for "
        "latent-variable models; cd (contrastive divergence) for energy-based models such as "
        "the RTRBM. Keep elbo to start; iwae or fivo with ``num_particles`` > 1 give a tighter "
        "bound at K times the cost of an update; meanfield uses analytic KL terms where the "
        "guide allows them",
        choices=OBJECTIVES + ENERGY_OBJECTIVES,
    )
    num_particles: int = option(
        1,
        "objective",
        "samples K per sequence of the objective (IWAE_K, FIVO_K; with elbo, an average of K "
        "single-sample ELBOs). Raise it (e.g. 4-16) with iwae or fivo: 1 makes them the ELBO",
        flag="--particles",
        check="POSITIVE_INT",
        unit="samples",
    )
    cd_steps: int = option(
        1,
        "objective",
        "Gibbs sweeps k of objective cd (energy-based models; ignored otherwise). Raise it when "
        "the model's samples stay close to the data they start from (CD-1 is biased)",
        check="POSITIVE_INT",
        unit="Gibbs sweeps",
    )
    # --- optimiser ---
    lr: float = option(
        1e-3,
        "optimiser",
        "Adam learning rate, the base rate of every schedule. Lower it (e.g. 3e-4) when the "
        "loss spikes or turns NaN, raise it when training crawls",
        check="POSITIVE",
        unit="",
    )
    betas: tuple = option(
        (0.9, 0.999),
        "optimiser",
        "Adam's decay rates of the gradient's first and second moments; Adam's usual values, "
        "rarely worth changing (a lower second rate, e.g. 0.99, reacts faster to gradient "
        "scale changes)",
        check="PROBABILITY_BELOW_ONE",
        nargs=2,
        unit="",
    )
    clip_norm: float = option(
        10.0,
        "optimiser",
        "largest norm of each parameter tensor's gradient (ClippedAdam clips per tensor). Lower "
        "it when single updates throw the loss off (exploding RNN gradients)",
        check="POSITIVE",
        unit="",
    )
    weight_decay: float = option(
        0.0,
        "optimiser",
        "L2 penalty coefficient added to the gradient (0: none). Set it (e.g. 1e-5) when the "
        "validation bound falls behind the training bound early",
        check="NON_NEGATIVE",
        unit="",
    )
    # --- learning-rate schedule ---
    lr_schedule: str = option(
        "plateau",
        "schedule",
        "plateau: multiply the rate by ``plateau_factor`` when the validation bound has not "
        "improved for ``plateau_patience`` + 1 epochs; exponential: constant for "
        "``lr_decay_after`` epochs, then divided by ``lr_decay_factor`` per epoch (the SRNN "
        "code); constant: ``lr``, times ``lrd`` after every update. Without validation sequences "
        "plateau keeps the rate constant; exponential reproduces the SRNN code's schedule",
        choices=LR_SCHEDULES,
    )
    plateau_factor: float = option(
        0.5,
        "schedule",
        "rate multiplier on a validation plateau (lr_schedule plateau). Closer to 1 for "
        "gentler steps on long runs",
        check="FRACTION",
        unit="",
    )
    plateau_patience: int = option(
        3,
        "schedule",
        "epochs without validation improvement tolerated before the rate is reduced. Raise it "
        "when the validation bound is noisy (small validation sets)",
        check="COUNT",
        unit="epochs",
    )
    plateau_min_lr: float = option(
        1e-5,
        "schedule",
        "lowest rate of the plateau schedule; the rate is never reduced below it",
        check="NON_NEGATIVE",
        unit="",
    )
    plateau_cooldown: int = option(
        0,
        "schedule",
        "epochs the plateau schedule waits after a reduction before it counts bad epochs "
        "again. Raise it when reductions come back to back",
        check="COUNT",
        unit="epochs",
    )
    plateau_threshold: float = option(
        1e-3,
        "schedule",
        "amount by which the validation bound must beat its best to count as an improvement "
        "for the plateau schedule. Raise it when tiny improvements keep a stalled run at a "
        "high rate",
        check="NON_NEGATIVE",
        unit="nats per step",
    )
    plateau_restore_best: bool = option(
        True,
        "schedule",
        "when the plateau schedule lowers the rate, go back to the weights of the best "
        "validation epoch (the optimizer's moments stay). Turn it off to continue from the "
        "last weights",
    )
    lrd: float = option(
        1.0,
        "schedule",
        "learning-rate multiplier applied after every update (lr_schedule constant; 1: no "
        "decay), e.g. 0.99996 for the DMM code's slow decay",
        check="POSITIVE",
        unit="per update",
    )
    lr_decay_after: Optional[int] = option(
        None,
        "schedule",
        "epochs at the full rate before the per-epoch decay starts (lr_schedule exponential, "
        "which needs it; none otherwise)",
        check="COUNT",
        unit="epochs",
    )
    lr_decay_factor: float = option(
        1.0,
        "schedule",
        "divide the rate by this per epoch after ``lr_decay_after`` (lr_schedule "
        "exponential), e.g. 1.05",
        check="AT_LEAST_ONE",
        unit="per epoch",
    )
    # --- KL annealing and free bits ---
    kl_start: float = option(
        1.0,
        "annealing",
        "initial KL weight beta",
        check="PROBABILITY",
        cli_default=0.2,
        cli_default_why="the command line anneals the KL weight unless told otherwise",
        unit="",
    )
    kl_anneal_steps: int = option(
        0,
        "annealing",
        "updates over which beta rises linearly from ``kl_start`` to 1 (0: no annealing, beta "
        "is 1 throughout). Anneal (e.g. from 0.2 over 1000 updates) when the latent states "
        "go unused (the KL term collapses to zero early in training)",
        check="COUNT",
        cli_default=1000,
        cli_default_why="the command line anneals the KL weight unless told otherwise",
        unit="updates",
    )
    schedule_during_annealing: bool = option(
        True,
        "annealing",
        "step the plateau schedule and count early-stopping patience while beta < 1 too. "
        "Turn it off (wait for beta = 1) with long annealing, so that neither the rate nor the "
        "run is cut before the full objective trains",
    )
    free_bits: float = option(
        0.0,
        "annealing",
        "KL allowance per latent site below which the KL costs nothing (elbo and meanfield "
        "only; 0: off). Set it (e.g. 0.1-1) against posterior collapse, like annealing",
        check="NON_NEGATIVE",
        unit="nats",
    )
    # --- minibatches and missing data ---
    batch_size: int = option(
        20,
        "batches",
        "sequences per minibatch (one update each). Larger batches give smoother gradients "
        "and faster epochs on a GPU; fewer updates per epoch",
        check="POSITIVE_INT",
        unit="sequences",
    )
    chunk_length: Optional[int] = option(
        None,
        "batches",
        "train on windows of this many steps (none: whole sequences). Set it for long "
        "sequences that are slow or do not fit in memory",
        check="POSITIVE_INT",
        unit="steps",
    )
    valid_batch_size: int = option(
        64,
        "batches",
        "sequences per batch of the validation bound; changes speed and memory only, not the bound",
        check="POSITIVE_INT",
        unit="sequences",
    )
    missing_prob: float = option(
        0.0,
        "batches",
        "probability of marking each real step of a training batch unobserved, drawn from "
        "(seed, update) (Fraccaro 2018, sec. 6.10). Set it (e.g. 0.3) to train a model for "
        "imputation",
        check="PROBABILITY_BELOW_ONE",
        unit="",
    )
    missing_keep_first: int = option(
        3,
        "batches",
        "first steps of every sequence that are never marked unobserved (with "
        "``missing_prob``), so that every sequence starts from data",
        check="COUNT",
        unit="steps",
    )
    # --- stopping ---
    epochs: int = option(
        100,
        "stopping",
        "maximum number of epochs (passes over the training sequences). Raise it for small "
        "data sets; early stopping usually ends the run first",
        check="COUNT",
        unit="epochs",
    )
    patience: Optional[int] = option(
        12,
        "stopping",
        "stop after this many epochs without validation improvement; the best weights are "
        "kept (None, or 0 on the command line: never stop early). Raise it for noisy "
        "validation bounds",
        check="COUNT",
        cli_none=0,
        unit="epochs",
    )
    monitor: str = option(
        "objective",
        "stopping",
        "the validation bound watched by early stopping, the plateau schedule and best.pt: "
        "objective (the training objective's own bound: IWAE for iwae, SMC for fivo, else the "
        "ELBO) or elbo (to compare runs with different objectives on one bound)",
        choices=("objective", "elbo"),
    )
    time_limit: Optional[float] = option(
        None,
        "stopping",
        "stop after this many seconds (none: no limit), e.g. to fit a run into a job's time "
        "slot; the run stays resumable",
        check="POSITIVE",
        unit="seconds",
    )
    time_limit_counts: str = option(
        "wall",
        "stopping",
        "what ``time_limit`` counts: wall (this call's wall clock), training (the wall "
        "seconds of this call's training epochs, validation excluded, to compare models on "
        "equal training time) or cpu (the CPU seconds of this process, all its threads, in "
        "this call's training epochs: an equal budget that another job on the same cores "
        "does not shrink)",
        choices=TIME_LIMIT_COUNTS,
    )
    # --- initialisation and randomness ---
    init: str = option(
        "bias",
        "start",
        "initialisation of a fresh run (never on resume): srnn = the SRNN code's weights for "
        "an SRNN plus, for Bernoulli emissions, the output bias from the training notes' "
        "frequencies; normal = init_weights(scheme='normal') and that bias; bias = the output "
        "bias only; none = as built. Use srnn to reproduce the SRNN results",
        choices=INITS,
    )
    seed: int = option(
        0,
        "start",
        "seed of the initial weights, the batch order and the model's random draws. Change it "
        "to repeat a run with other random numbers (e.g. to measure the spread of a result)",
        check="SEED",
    )
    # --- devices and processes ---
    device: str = option(
        "cpu",
        "devices",
        "where the model trains: cpu, cuda or cuda:N (an error, never a CPU fallback, when "
        "CUDA is not there). Use cuda for large models and batches",
    )
    world_size: int = option(
        1,
        "devices",
        "data-parallel processes (torch.distributed: gloo on CPU, nccl on CUDA); each takes a "
        "shard of every minibatch. Raise it to use several GPUs (or CPU cores on large "
        "batches)",
        flag="--nproc",
        check="POSITIVE_INT",
        unit="processes",
    )
    dist_backend: Optional[str] = option(
        None,
        "devices",
        "process-group backend (none: nccl on CUDA devices, else gloo); set it only to force one",
        choices=("gloo", "nccl"),
    )
    dist_timeout: float = option(
        120.0,
        "devices",
        "seconds a rank waits for the others before failing. Raise it when a slow first "
        "epoch (e.g. data loading on one rank) times out",
        check="POSITIVE",
        unit="seconds",
    )
    num_threads: Optional[int] = option(
        None,
        "devices",
        "torch CPU threads (none: torch's default). Set it (e.g. 1) when several runs share "
        "a machine",
        flag="--threads",
        check="POSITIVE_INT",
        unit="threads",
    )
    # --- checks and output ---
    pyro_validation: bool = option(
        False,
        "output",
        "Pyro's per-site validation during the updates (the model checks its inputs once per "
        "batch either way). Turn it on to debug a new model: slower",
    )
    progress: bool = option(
        True,
        "output",
        "show a progress bar of the epochs on stderr (worth turning off for batch-job logs "
        "and rendered notebooks)",
        flag="--quiet",
        invert=True,
    )

    def validate(self) -> "TrainConfig":
        """Check the fields together; returns ``self``. Raises ``ValueError`` naming the field
        (or the combination) that is out of range, and what to use instead."""
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
                raise ValueError(
                    "use either the per-update decay lrd or the per-epoch schedule "
                    "lr_decay_after/lr_decay_factor, not both"
                )
        if (self.lr_decay_after is not None) != (self.lr_schedule == "exponential"):
            raise ValueError(
                "lr_decay_after/lr_decay_factor set the per-epoch schedule: use them "
                "with lr_schedule='exponential' (and lr_schedule='exponential' needs "
                "lr_decay_after)"
            )
        if self.lrd != 1.0 and self.lr_schedule != "constant":
            raise ValueError(
                "the per-update decay lrd belongs to lr_schedule='constant', got "
                f"lr_schedule={self.lr_schedule!r}"
            )
        if self.lr_schedule == "plateau":
            if not 0.0 < self.plateau_factor < 1.0:
                raise ValueError(f"plateau_factor must be in (0, 1), got {self.plateau_factor}")
            if min(self.plateau_patience, self.plateau_cooldown) < 0:
                raise ValueError("plateau_patience and plateau_cooldown must be >= 0")
            if self.plateau_min_lr < 0 or self.plateau_threshold < 0:
                raise ValueError("plateau_min_lr and plateau_threshold must be >= 0")
        if self.patience is not None and self.patience < 1:
            raise ValueError(
                f"patience must be None (no early stopping) or >= 1, got {self.patience}"
            )
        if not 0.0 <= self.missing_prob < 1.0:
            raise ValueError(f"missing_prob must be in [0, 1), got {self.missing_prob}")
        if self.missing_keep_first < 0:
            raise ValueError(f"missing_keep_first must be >= 0, got {self.missing_keep_first}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if not isinstance(self.cd_steps, int) or self.cd_steps < 1:
            raise ValueError(f"cd_steps must be a positive int, got {self.cd_steps!r}")
        if self.time_limit_counts not in TIME_LIMIT_COUNTS:
            raise ValueError(
                f"time_limit_counts must be one of {TIME_LIMIT_COUNTS}, "
                f"got {self.time_limit_counts!r}"
            )
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
                "own shard instead (a different objective); train with free bits in one process"
            )
        device = parse_device(self.device, "device")
        if device.type == "cuda" and self.world_size > 1:
            last = rank_device(device, self.world_size - 1)
            if last.index >= torch.cuda.device_count():
                raise ValueError(
                    f"world_size={self.world_size} on device {self.device!r} needs "
                    f"{last} (rank r trains on cuda:{device.index}+r), but this "
                    f"machine has {torch.cuda.device_count()} CUDA device(s)"
                )
        return self


def options():
    """The :class:`Option` of every :class:`TrainConfig` field, in the fields' order."""
    out = []
    for f in fields(TrainConfig):
        spec = dict(f.metadata["option"])
        spec["flag"] = spec["flag"] or "--" + f.name.replace("_", "-")
        out.append(Option(name=f.name, default=f.default, **spec))
    return out


#: What :class:`TrainConfig`'s defaults do, filled in from the fields' defaults (so that each
#: default is written once, in its :func:`option`).
DEFAULTS_SUMMARY = (
    "What the defaults do: at most {epochs} epochs of the {objective} objective with "
    "ClippedAdam at rate {lr} on minibatches of {batch_size} whole sequences, in one process "
    "on the {device}; the rate is multiplied by {plateau_factor} when the validation bound "
    "stalls ({lr_schedule} schedule), and the run stops after {patience} epochs without "
    "validation improvement, keeping the best weights. There is **no KL annealing** "
    "(``kl_start={kl_start}``, ``kl_anneal_steps={kl_anneal_steps}``: the full ELBO from the "
    "first update) and no free bits. The command line's ``train`` differs only there: it "
    "anneals the KL weight from {cli_kl_start} over {cli_kl_anneal_steps} updates (``make "
    "demo`` and the tuned SRNN benchmark anneal too); pass ``kl_start`` and "
    "``kl_anneal_steps`` to :func:`~pyro_seq.train.fit` to train as the command line does."
)


def defaults_summary():
    """:data:`DEFAULTS_SUMMARY` with the defaults of :class:`TrainConfig` (and the command
    line's own ones) filled in."""
    values = {o.name: o.default for o in options()}
    values.update({"cli_" + o.name: o.command_line_default for o in options()})
    return DEFAULTS_SUMMARY.format(**values)


#: The line of :class:`TrainConfig`'s docstring above its generated list of fields (the API
#: page replaces the list with a table: ``docs/_ext/train_config_table.py``).
FIELD_LIST_HEADING = "The fields by group, with their defaults and units in brackets:"


def _field_list():
    """The fields of :class:`TrainConfig` by group, as reStructuredText for its docstring."""
    lines = [FIELD_LIST_HEADING]
    for key, title in GROUPS.items():
        lines += ["", f"{title[0].upper()}{title[1:]}:", ""]
        for o in options():
            if o.group == key:
                cli = (
                    ""
                    if o.cli_default is MISSING
                    else f"; the command line's is {o.cli_default!r}: {o.cli_default_why}"
                )
                unit = f"; {o.unit}" if o.unit else ""
                lines.append(f"* ``{o.name}`` [``{o.default!r}``{unit}{cli}]: {o.doc}.")
    return "\n".join("    " + line if line else "" for line in lines)


# the class has a docstring
TrainConfig.__doc__ = (
    TrainConfig.__doc__.rstrip()  # type: ignore[union-attr]
    + "\n\n    "
    + defaults_summary()
    + "\n\n"
    + _field_list()
    + "\n"
)
