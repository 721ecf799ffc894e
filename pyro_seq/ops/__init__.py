"""Pure tensor math with no Pyro state: Kalman recursions, resampling, log-mean-exp, state."""

from pyro_seq.ops.state import SequenceState, gather_particles

__all__ = ["SequenceState", "gather_particles"]
