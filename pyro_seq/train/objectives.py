"""Objective names used by the trainer and the command line, mapped to ELBO classes.

Every objective is a :class:`pyro.infer.ELBO` instance, so switching is a change of ``loss=``.
"""

from typing import Any

from pyro.infer import ELBO, Trace_ELBO, TraceMeanField_ELBO

OBJECTIVES = ("elbo", "meanfield", "iwae", "fivo")  #: for latent-variable models
ENERGY_OBJECTIVES = ("cd",)  #: for energy-based models (RTRBM)


def check_objective(model, objective):
    """Refuse an objective ``model`` does not declare (:class:`~pyro_seq.models.Unsupported`, a
    ValueError): energy-based models train with ``"cd"`` only, latent-variable models with the
    ELBO-type objectives (``model.objectives``, :mod:`pyro_seq.models.contract`)."""
    if objective not in OBJECTIVES + ENERGY_OBJECTIVES:
        raise ValueError(
            f"unknown objective {objective!r}; choose from {OBJECTIVES + ENERGY_OBJECTIVES}"
        )
    model.require(objective, "objective")


def make_objective(
    name: str, num_particles: int = 1, free_bits: float = 0.0, cd_steps: int = 1, **kwargs: Any
) -> ELBO:
    """Build the ELBO object for ``name``.

    :param str name: ``"elbo"`` (:class:`~pyro.infer.Trace_ELBO`), ``"meanfield"``
        (:class:`~pyro.infer.TraceMeanField_ELBO`, analytic KL where registered), ``"iwae"`` or
        ``"fivo"`` (:mod:`pyro_seq.infer`).
    :param int num_particles: samples (ELBO: averaged; IWAE/FIVO: inside the log). The
        ELBO objectives draw their samples in one vectorized pass (``vectorize_particles=True``,
        as IWAE does) unless ``vectorize_particles=False`` is passed; every model of this
        package supports the extra particle dimension.
    :param float free_bits: nats per latent site below which the KL earns nothing (ELBO only;
        see :class:`pyro_seq.infer.FreeBits_ELBO`).
    :param int cd_steps: Gibbs sweeps ``k`` of ``"cd"``
        (:class:`pyro_seq.infer.ContrastiveDivergence`, for energy-based models).
    """
    if name == "cd":
        from pyro_seq.infer import ContrastiveDivergence

        return ContrastiveDivergence(k=cd_steps)
    if num_particles < 1:
        raise ValueError(f"num_particles must be >= 1, got {num_particles}")
    if free_bits and name not in ("elbo", "meanfield"):
        raise ValueError(
            f"free bits apply to the single-sample ELBO; use KL annealing with {name!r}"
        )
    common = dict(num_particles=num_particles, max_plate_nesting=1, **kwargs)
    if name in ("elbo", "meanfield") and free_bits:
        from pyro_seq.infer import FreeBits_ELBO

        return FreeBits_ELBO(free_bits=free_bits, vectorize_particles=False, **common)
    if name in ("elbo", "meanfield"):
        common.setdefault("vectorize_particles", num_particles > 1)
        cls = Trace_ELBO if name == "elbo" else TraceMeanField_ELBO
        return cls(**common)
    if name == "iwae":
        from pyro_seq.infer import IWAE

        return IWAE(**common)
    if name == "fivo":
        from pyro_seq.infer import FIVO

        return FIVO(num_particles=num_particles, **kwargs)
    raise ValueError(f"unknown objective {name!r}; choose from {OBJECTIVES + ENERGY_OBJECTIVES}")
