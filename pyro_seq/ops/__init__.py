"""Pure tensor math with no Pyro state: Kalman recursions, resampling, log-mean-exp, state."""

from pyro_seq.ops.state import SequenceState, gather_particles

__all__ = ["SequenceState", "gather_particles"]

from pyro_seq.ops.kalman import (  # noqa: E402
    PARALLEL_THRESHOLD,
    KalmanFilterResult,
    KalmanSampleResult,
    KalmanSmootherResult,
    LGSSMSample,
    kalman_filter,
    kalman_sample,
    kalman_smoother,
    lgssm_sample,
    psd_sqrt,
)

__all__ += [
    "PARALLEL_THRESHOLD",
    "KalmanFilterResult",
    "KalmanSampleResult",
    "KalmanSmootherResult",
    "LGSSMSample",
    "kalman_filter",
    "kalman_sample",
    "kalman_smoother",
    "lgssm_sample",
    "psd_sqrt",
]
