"""Training, evaluation, checkpoints and figures for sequence models."""

from pyro_seq.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_weights,
    restore,
    save_checkpoint,
    save_weights,
)
from pyro_seq.train.config import INITS, LR_SCHEDULES, TrainConfig
from pyro_seq.train.evaluate import elbo_terms, evaluate_bound
from pyro_seq.train.loop import TrainHistory, fit, initialise
from pyro_seq.train.objectives import ENERGY_OBJECTIVES, OBJECTIVES, make_objective
from pyro_seq.train.schedules import epoch_lr, kl_beta, lr_multiplier, make_optimizer

__all__ = [
    "CheckpointError",
    "INITS",
    "LR_SCHEDULES",
    "ENERGY_OBJECTIVES",
    "OBJECTIVES",
    "TrainConfig",
    "TrainHistory",
    "elbo_terms",
    "evaluate_bound",
    "fit",
    "kl_beta",
    "epoch_lr",
    "initialise",
    "load_checkpoint",
    "load_weights",
    "lr_multiplier",
    "make_objective",
    "make_optimizer",
    "restore",
    "save_checkpoint",
    "save_weights",
]
