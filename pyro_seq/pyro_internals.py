"""The one module that touches private Pyro and ``torch.distributions`` names.

A Pyro (or torch) release may rename or move any name that starts with ``_``; every such use of
the package sits here, behind a public function, so that such a release breaks one module and
``tests/test_pyro_fence.py`` names what moved. The names are checked against pyro-ppl 1.9.x
(the upper bound in ``setup.cfg``). What the fence holds:

* the handler stack (``pyro.poutine.runtime._PYRO_STACK``): :func:`active_messengers`, and the
  hand-kept list of handler types that never change a sample value,
  :data:`VALUE_PRESERVING_MESSENGERS` with :func:`preserves_sample_values`;
* the name of the vectorised particle plate that Pyro's ELBOs add,
  :data:`PARTICLE_PLATE_NAME` with :func:`is_particle_plate`;
* plate subsample sites (Pyro's ``_Subsample`` distribution): :func:`is_subsample`;
* the class-level default of ``validate_args`` (``Distribution._validate_args``):
  :func:`default_validate_args`;
* private attributes of Pyro objects: the mask of a ``MaskedDistribution``
  (:func:`masked_distribution_mask`), the factors of a ``GaussianHMM``
  (:func:`gaussian_hmm_factors`), the particle plate of an ``ELBO``
  (:func:`vectorized_num_particles`);
* the package's one reparameterisation test of a guide site, :func:`is_reparameterized`.

Left outside, as the documented way to subclass: a distribution reading or setting its *own*
``self._validate_args`` (set by ``Distribution.__init__``; ``expand`` sets it on the new
instance it builds) and calling its own ``self._extended_shape``/``self._get_checked_instance``;
a messenger's ``_pyro_sample``/``_pyro_post_sample``/``_process_message`` hooks; an ``ELBO``
overriding or calling its own ``_get_trace``/``_get_traces``. ``tests/test_pyro_fence.py``
checks that these hooks still exist.

This module depends on :mod:`pyro` and :mod:`torch` only, so that every layer may import it.
"""

import torch
from pyro.distributions import GaussianHMM
from pyro.distributions.torch_distribution import MaskedDistribution
from pyro.distributions.util import is_identically_zero
from pyro.poutine.block_messenger import BlockMessenger
from pyro.poutine.broadcast_messenger import BroadcastMessenger
from pyro.poutine.indep_messenger import IndepMessenger
from pyro.poutine.infer_config_messenger import InferConfigMessenger
from pyro.poutine.markov_messenger import MarkovMessenger
from pyro.poutine.mask_messenger import MaskMessenger
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.scale_messenger import ScaleMessenger
from pyro.poutine.seed_messenger import SeedMessenger
from pyro.poutine.trace_messenger import TraceMessenger
from pyro.poutine.util import site_is_subsample

__all__ = [
    "PARTICLE_PLATE_NAME",
    "VALUE_PRESERVING_MESSENGERS",
    "active_messengers",
    "copy_validate_args",
    "default_validate_args",
    "gaussian_hmm_factors",
    "is_particle_plate",
    "is_reparameterized",
    "is_subsample",
    "masked_distribution_mask",
    "preserves_sample_values",
    "vectorized_num_particles",
]

#: Handler types that never change the value a ``pyro.sample`` statement returns (they record,
#: block, scale, mask, broadcast or seed it). A handler of another type is assumed to change
#: values (replay, condition, enumeration, ...) unless it declares
#: ``preserves_sample_values = True`` (:func:`preserves_sample_values`).
VALUE_PRESERVING_MESSENGERS = (
    BlockMessenger,
    BroadcastMessenger,
    IndepMessenger,
    InferConfigMessenger,
    MarkovMessenger,
    MaskMessenger,
    ScaleMessenger,
    SeedMessenger,
    TraceMessenger,
)


def active_messengers():
    """The handlers active right now (Pyro's handler stack), outermost first, as a tuple."""
    return tuple(_PYRO_STACK)


def preserves_sample_values(messenger):
    """True when ``messenger`` is known not to change sample values: an instance of
    :data:`VALUE_PRESERVING_MESSENGERS`, or one that declares ``preserves_sample_values = True``."""
    return isinstance(messenger, VALUE_PRESERVING_MESSENGERS) or bool(
        getattr(messenger, "preserves_sample_values", False)
    )


#: The name of the plate over vectorised particles that Pyro's ELBOs (``Trace_ELBO`` and the
#: others with ``vectorize_particles=True``) enter around model and guide
#: (:func:`vectorized_num_particles`); not a public constant of Pyro.
PARTICLE_PLATE_NAME = "num_particles_vectorized"


def is_particle_plate(messenger):
    """True when ``messenger`` is the vectorised particle plate a Pyro ELBO entered
    (:data:`PARTICLE_PLATE_NAME`, with a batch dim allocated)."""
    return (
        isinstance(messenger, IndepMessenger)
        and messenger.name == PARTICLE_PLATE_NAME
        and messenger.dim is not None
    )


def is_subsample(msg):
    """True when the message (or trace site) ``msg`` is the subsample site that a
    ``pyro.plate`` with ``subsample_size`` (or ``subsample``) emits when entered: a sample site
    of Pyro's private ``_Subsample`` distribution, whose value is the index set, not a latent."""
    return site_is_subsample(msg)


def default_validate_args():
    """The class-level default of ``validate_args``: what a distribution built with
    ``validate_args=None`` checks (set by ``Distribution.set_default_validate_args`` and by
    ``pyro.enable_validation``; off under ``python -O``). Torch has no public getter."""
    return torch.distributions.Distribution._validate_args


def copy_validate_args(source, target):
    """Give the distribution ``target`` the argument-validation setting of ``source`` (torch
    keeps it in the private instance attribute ``_validate_args``); returns ``target``."""
    target._validate_args = source._validate_args
    return target


def masked_distribution_mask(fn):
    """The mask of ``fn = base.mask(mask)`` (a Pyro ``MaskedDistribution``): a bool, or a bool
    tensor that broadcasts with ``fn.batch_shape``."""
    if not isinstance(fn, MaskedDistribution):
        raise TypeError(
            f"masked_distribution_mask needs a pyro MaskedDistribution, got "
            f"{type(fn).__name__}; unwrap other distributions first"
        )
    return fn._mask


def gaussian_hmm_factors(hmm):
    """``(init, trans, obs)``: the Gaussian factors that a Pyro ``GaussianHMM`` holds, the
    initial state (a ``Gaussian`` over ``z_0``), the transition (over ``(z_{t-1}, z_t)``) and the
    observation (over ``(z_t, x_t)``), each a ``Gaussian`` or an ``AffineNormal``."""
    if not isinstance(hmm, GaussianHMM):
        raise TypeError(f"gaussian_hmm_factors needs a pyro GaussianHMM, got {type(hmm).__name__}")
    return hmm._init, hmm._trans, hmm._obs


def vectorized_num_particles(elbo, fn):
    """``fn`` wrapped by ``elbo`` (a Pyro ``ELBO``) in its vectorised particle plate
    ``num_particles_vectorized`` of size ``elbo.num_particles``, as Pyro's vectorised ELBOs run
    model and guide."""
    return elbo._vectorized_num_particles(fn)


def is_reparameterized(site):
    """True when the guide sample site ``site`` (a trace site or a message) is reparameterised:
    its distribution has ``rsample`` and, where Pyro computed the site's score parts (a trace
    after ``compute_score_parts``, e.g. from an ELBO), they have no score-function term and a
    nonzero entropy term (Pyro's ``check_fully_reparametrized``). For any distribution that
    keeps Pyro's convention (``score_parts`` follows ``has_rsample``: every Pyro and torch
    distribution, masked, expanded or ``to_event``-ed) this is ``site["fn"].has_rsample``; it
    refuses also one whose own ``score_parts`` adds a score-function term (e.g. ``Rejector``)."""
    if not site["fn"].has_rsample:
        return False
    parts = site.get("score_parts")
    if parts is None:
        return True
    return is_identically_zero(parts.score_function) and not is_identically_zero(parts.entropy_term)
