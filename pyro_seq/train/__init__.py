"""Training, evaluation, checkpoints and figures for sequence models."""

from pyro_seq.train.checkpoint import (CheckpointError, load_checkpoint, load_weights, restore,
                                       save_checkpoint, save_weights)
from pyro_seq.train.evaluate import elbo_terms, evaluate_bound
from pyro_seq.train.objectives import OBJECTIVES, make_objective
from pyro_seq.train.trainer import TrainConfig, epoch_lr, fit, kl_beta

__all__ = [
    "CheckpointError",
    "OBJECTIVES",
    "TrainConfig",
    "elbo_terms",
    "evaluate_bound",
    "fit",
    "kl_beta",
    "epoch_lr",
    "load_checkpoint",
    "load_weights",
    "make_objective",
    "restore",
    "save_checkpoint",
    "save_weights",
]
