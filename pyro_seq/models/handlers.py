"""What the handlers around a full-sequence run allow (:mod:`pyro_seq.models.base`).

:func:`replayed_latents` finds the latent values an enclosing replay fixes (time-parallel
scoring); :func:`guide_scan_particles` and :func:`plain_guide_stack` decide whether a guide may
draw every step ahead (:meth:`~pyro_seq.models.base.SequenceModel.guide_scan`). Both read
Pyro's handler stack through :mod:`pyro_seq.pyro_internals` only.
"""

from typing import Dict, List, Optional, Sequence, Tuple

import pyro
import torch
from pyro.poutine.indep_messenger import IndepMessenger
from pyro.poutine.replay_messenger import ReplayMessenger

from pyro_seq.pyro_internals import active_messengers, is_particle_plate, preserves_sample_values

__all__ = ["guide_scan_particles", "plain_guide_stack", "replayed_latents", "sole_replay"]


def sole_replay():
    """The one :class:`~pyro.poutine.replay_messenger.ReplayMessenger` on the handler stack
    (with a trace) when every other active handler is known not to change sample values
    (:func:`pyro_seq.pyro_internals.preserves_sample_values`); otherwise None."""
    replay = None
    for messenger in active_messengers():
        if isinstance(messenger, ReplayMessenger):
            if replay is not None:
                return None
            replay = messenger
        elif not preserves_sample_values(messenger):
            return None
    if replay is None or replay.trace is None:
        return None
    return replay


def guide_scan_particles(
    plate: Optional[pyro.plate], particles: bool = False
) -> Optional[Tuple[int, ...]]:
    """The particle shape a guide that draws every step ahead must draw with, or None when it
    may not draw ahead.

    Every active messenger must be known not to change sample values (as for
    :func:`sole_replay`; no replay, condition, enumeration, ...), and the plates must be
    ``plate`` (the batch plate, dim -1) and, when ``particles`` is True, at most one vectorised
    particle plate of a Pyro ELBO (:func:`pyro_seq.pyro_internals.is_particle_plate`) left of
    it. Returns ``()`` without a particle plate, and ``(K, 1, ..., 1)`` with one of size ``K``
    at dim ``d``: the leading shape ``d`` gives a per-step site of batch shape ``(batch,)``
    (``-d - 2`` ones), so a draw of shape ``(K, 1, ..., 1, batch, Z)`` is what the step loop
    draws under that plate."""
    particle = None
    for messenger in active_messengers():
        if isinstance(messenger, IndepMessenger):
            if messenger is plate:
                continue
            if particles and particle is None and is_particle_plate(messenger):
                particle = messenger
                continue
            return None
        if isinstance(messenger, ReplayMessenger) or not preserves_sample_values(messenger):
            return None
    if particle is None:
        return ()
    batch_dim = -1 if plate is None or plate.dim is None else plate.dim
    dim = particle.dim
    assert dim is not None  # allocated: is_particle_plate checks it
    if batch_dim != -1 or dim >= batch_dim:
        return None
    return (int(particle.size),) + (1,) * (-dim - 2)


def plain_guide_stack(plate: Optional[pyro.plate]) -> bool:
    """True when the handlers around a full guide run leave its sample values to the guide and
    its batch shape to ``plate``: :func:`guide_scan_particles` without a particle plate."""
    return guide_scan_particles(plate) == ()


def replayed_latents(
    names: Sequence[str], num_steps: int
) -> Optional[Dict[str, List[torch.Tensor]]]:
    """Values of the latent sites ``{name}_1..{name}_T`` fixed by an enclosing replay, or None.

    Returns a dict ``name -> list of T tensors`` when exactly one
    :class:`~pyro.poutine.replay_messenger.ReplayMessenger` on the handler stack holds every
    site and every other active handler is known not to change sample values (messengers may
    declare ``preserves_sample_values = True``); otherwise None.
    """
    replay = sole_replay()
    if replay is None:
        return None
    nodes = replay.trace.nodes
    values = {}
    for name in names:
        sites = [nodes.get(f"{name}_{t + 1}") for t in range(num_steps)]
        if any(site is None or site["type"] != "sample" or site["is_observed"] for site in sites):
            return None
        values[name] = [site["value"] for site in sites]
    return values
