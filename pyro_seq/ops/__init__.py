"""Pure tensor math with no Pyro state.

* :mod:`~pyro_seq.ops.state`: the resamplable state of the step protocol.
* :mod:`~pyro_seq.ops.kalman`: exact Kalman filter, RTS smoother and posterior sampling,
  sequential and parallel-in-time (the public API), built from :mod:`~pyro_seq.ops.lgssm`
  (parameter bundle, argument checks, the prepared model), :mod:`~pyro_seq.ops.kalman_steps`
  (per-step formulas), :mod:`~pyro_seq.ops.kalman_sequential` (loops over time) and
  :mod:`~pyro_seq.ops.kalman_parallel` (associative scans) and :mod:`~pyro_seq.ops.kalman_steady`
  (the steady-state fast path of ``method="auto"`` for time-invariant, unmasked models).
* :mod:`~pyro_seq.ops.linalg`: batched linear algebra (symmetrisation, products with the data
  batch folded into columns, Cholesky with jitter, solves with singular PSD matrices).
* :mod:`~pyro_seq.ops.nonlinear`: extended and unscented Kalman filters and smoothers.
* :mod:`~pyro_seq.ops.particle_filter`: the bootstrap particle filter (thesis eq. 3.20).
* :mod:`~pyro_seq.ops.resampling`: log-mean-exp, effective sample size, resampling schemes and
  criteria (one vocabulary: ``resample`` criterion, ``ess_threshold``, ``resampling`` scheme).
* :mod:`~pyro_seq.ops.padding`: ragged ``(T_i, D)`` sequences to a padded batch and prefix mask.
"""

from pyro_seq.ops.kalman import (
    COV_TOL_EPS,
    PARALLEL_THRESHOLD,
    STEADY_STATE_TOL,
    KalmanFilterResult,
    KalmanSampleResult,
    KalmanSmootherResult,
    KalmanStep,
    LGSSMSample,
    SteadyStateCache,
    covariance_problem,
    kalman_filter,
    kalman_log_likelihood,
    kalman_predict,
    kalman_sample,
    kalman_smoother,
    kalman_update,
    lgssm_sample,
    psd_sqrt,
)
from pyro_seq.ops.nonlinear import (
    GaussianFilterResult,
    GaussianSmootherResult,
    extended_kalman_filter,
    extended_kalman_smoother,
    gaussian_rts_smoother,
    unscented_kalman_filter,
    unscented_kalman_smoother,
)
from pyro_seq.ops.padding import SequenceList, inputs_of, pad_sequences
from pyro_seq.ops.particle_filter import ParticleFilterResult, bootstrap_particle_filter
from pyro_seq.ops.resampling import (
    DEFAULT_RESAMPLING,
    RESAMPLE_CRITERIA,
    RESAMPLING_SCHEMES,
    effective_sample_size,
    log_mean_exp,
    normalize_log_weights,
    resample,
)
from pyro_seq.ops.state import SequenceState, gather_particles

__all__ = [
    "COV_TOL_EPS",
    "DEFAULT_RESAMPLING",
    "GaussianFilterResult",
    "GaussianSmootherResult",
    "KalmanFilterResult",
    "KalmanSampleResult",
    "KalmanSmootherResult",
    "KalmanStep",
    "LGSSMSample",
    "PARALLEL_THRESHOLD",
    "ParticleFilterResult",
    "RESAMPLE_CRITERIA",
    "RESAMPLING_SCHEMES",
    "STEADY_STATE_TOL",
    "SequenceList",
    "SequenceState",
    "SteadyStateCache",
    "bootstrap_particle_filter",
    "covariance_problem",
    "effective_sample_size",
    "extended_kalman_filter",
    "extended_kalman_smoother",
    "gather_particles",
    "gaussian_rts_smoother",
    "inputs_of",
    "kalman_filter",
    "kalman_log_likelihood",
    "kalman_predict",
    "kalman_sample",
    "kalman_smoother",
    "kalman_update",
    "lgssm_sample",
    "log_mean_exp",
    "normalize_log_weights",
    "pad_sequences",
    "psd_sqrt",
    "resample",
    "unscented_kalman_filter",
    "unscented_kalman_smoother",
]
