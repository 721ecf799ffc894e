"""The trainer's names in one place, as earlier code imports them
(``from pyro_seq.train.trainer import fit, TrainConfig``).

They live in the modules of the training run's parts: the settings
(:mod:`pyro_seq.train.config`: :class:`~pyro_seq.train.config.TrainConfig`,
:data:`~pyro_seq.train.config.LR_SCHEDULES`, :data:`~pyro_seq.train.config.INITS`), the
learning-rate and KL schedules (:mod:`pyro_seq.train.schedules`), the epoch loop
(:mod:`pyro_seq.train.loop`: :func:`~pyro_seq.train.loop.fit`) and the processes of
data-parallel training (:mod:`pyro_seq.train.processes`).
"""

from pyro_seq.train.config import INITS, LR_SCHEDULES, TrainConfig
from pyro_seq.train.loop import MONITORED_BOUND, TrainHistory, fit, initialise
from pyro_seq.train.schedules import epoch_lr, kl_beta, lr_multiplier, make_optimizer

__all__ = [
    "INITS",
    "LR_SCHEDULES",
    "MONITORED_BOUND",
    "TrainConfig",
    "TrainHistory",
    "epoch_lr",
    "fit",
    "initialise",
    "kl_beta",
    "lr_multiplier",
    "make_optimizer",
]
