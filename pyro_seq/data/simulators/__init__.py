"""Simulated videos of simple physical systems: the environments of the KVAE experiments.

Fraccaro et al., *Deep Latent Variable Models for Sequential Data* (thesis, 2018), Ch. 6:

========================  ==========================================================  ========
function                  what                                                        frames
========================  ==========================================================  ========
:func:`box`               a ball bouncing elastically in a square (sec. 6.5.1)        32x32
:func:`box_gravity`       the same under gravity (sec. 6.5.3)                         32x32
:func:`polygon`           a ball in an irregular polygon of walls (sec. 6.5.3)        32x32
:func:`pong`              a ball and two paddles that follow it (sec. 6.5.3)          32x32
:func:`pendulum`          the torque-controlled pendulum of Karl et al. (sec. 6.5.2)  16x16
========================  ==========================================================  ========

Each is called as ``box(num_sequences, num_steps=20, seed=0)`` (``num_steps=15`` for the
pendulum) and returns a :class:`SimulatedVideos`: ``frames`` ``(N, T, H, W)`` float32 0/1,
``positions`` ``(N, T, 2)`` (the ball's centre, the pendulum's pole tip, in pixels), the full
simulator ``states``, and for the pendulum the torques as ``controls`` ``(N, T, 1)``.
:meth:`SimulatedVideos.as_sequences` gives the ``(T, H*W)`` tensors the sequence models take.

The physics, the rendering and where each number comes from are documented in
:mod:`~pyro_seq.data.simulators.balls` (the four pymunk environments),
:mod:`~pyro_seq.data.simulators.pendulum_ode` (the pendulum, integrated here without a physics
engine) and :mod:`~pyro_seq.data.simulators.render` (pixel coordinates and the binary
rasteriser); seeding, parallel generation, validation and the disk cache in
:mod:`~pyro_seq.data.simulators.core`.

The GTM-SM's environment (thesis Ch. 7) is :func:`image_navigation` (module
:mod:`~pyro_seq.data.simulators.navigation`): an agent walking on a 32x32 image patch and
seeing an 8x8 crop, with five actions, walls and optional obstacles; it returns a
:class:`NavigationVideos` with ``frames``, ``actions`` and ``positions``, and needs the
``[images]`` extra (scikit-learn's bundled photographs, read with Pillow).

The four ball environments need the optional physics engine pymunk
(``pip install pyro-seq[sim]``); this package imports without it and they raise an
:class:`ImportError` naming the extra when called. The pendulum needs nothing extra.
"""

from .balls import BOX_WALLS, POLYGON_WALLS, BallParams, PongParams
from .core import (
    DEFAULT_SIZES,
    ENVIRONMENTS,
    SPLITS,
    SimulatedVideos,
    box,
    box_gravity,
    pendulum,
    polygon,
    pong,
    simulate,
    simulate_sequence,
    validate_videos,
)
from .navigation import (
    ACTIONS,
    NAVIGATION_SIZES,
    NavigationParams,
    NavigationVideos,
    image_navigation,
)
from .pendulum_ode import PendulumParams, pendulum_energy
from .render import render_capsules

__all__ = [
    "ACTIONS",
    "NAVIGATION_SIZES",
    "NavigationParams",
    "NavigationVideos",
    "image_navigation",
    "BOX_WALLS",
    "BallParams",
    "DEFAULT_SIZES",
    "ENVIRONMENTS",
    "POLYGON_WALLS",
    "PendulumParams",
    "PongParams",
    "SPLITS",
    "SimulatedVideos",
    "box",
    "box_gravity",
    "pendulum",
    "pendulum_energy",
    "polygon",
    "pong",
    "render_capsules",
    "simulate",
    "simulate_sequence",
    "validate_videos",
]
