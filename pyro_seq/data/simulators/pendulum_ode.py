r"""The torque-controlled pendulum of Karl et al. (2017), simulated without a physics engine.

Karl, Soelch, Bayer and van der Smagt, "Deep Variational Bayes Filters: Unsupervised Learning
of State Space Models from Raw Data", ICLR 2017, sec. 5.1 (the "dynamic pendulum"); used by
Fraccaro et al. for the KVAE (thesis sec. 6.5.2, Table 6.1): 16x16 frames, 15 steps,
500 / 500 / 500 training / validation / test sequences, the torques given to the model as the
controls ``u_t``.

Equation of motion (Karl et al., sec. 5.1), angle ``phi`` from the upright position::

    m l^2 phi''(t) = -mu phi'(t) + m g l sin(phi(t)) + u(t),
    m = l = 1,  mu = 0.5,  g = 9.81                                                     (1)

``phi = 0`` is the (unstable) upright position and ``phi = pi`` hanging down; ``phi`` is not
wrapped. The mechanical energy::

    E = (1/2) m l^2 phi'^2 + m g l cos(phi),      dE/dt = -mu phi'^2 + u phi'             (2)

is conserved when ``mu = 0`` and ``u = 0``.

Controls and time (our choices where Karl et al. and the thesis give no number): frames are
``dt = 0.1`` s apart; ``u_t`` is the torque held constant over the interval ``((t-1) dt, t dt]``
that ends at frame ``t`` (the convention ``z_t = A z_{t-1} + B u_t`` of the package), and the
torques are i.i.d. ``Uniform(-max_torque, max_torque)`` with ``max_torque = 1``. The state is
drawn at time ``-dt`` (``phi ~ Uniform(-pi, pi)``, ``phi' ~ Uniform(-2, 2)`` rad/s) so that
``u_0`` also acts before frame 0. (1) is integrated with the classical fourth-order Runge-Kutta
method, ``substeps`` steps per frame, in scalar double precision (so each sequence's numbers do
not depend on how sequences are batched); with 20 steps of 5 ms the energy (2) of a frictionless,
unforced pendulum drifts by about ``1e-9`` of ``m g l`` over 15 frames.

Rendering: the pivot is the centre of the frame, ``c = (8, 8)`` px; the pole is the capsule of
half-width ``pole_radius = 1`` px around the segment from the pivot to the tip::

    tip = (c_x + L sin(phi), c_y - L cos(phi)),       L = pole_length = 6.5 px           (3)

(``y`` runs down the image, so ``phi`` grows clockwise on screen), rasterised without
anti-aliasing by :func:`~pyro_seq.data.simulators.render.render_capsules`. The returned
``positions`` are the tips (3), in pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .render import render_capsules

__all__ = ["PendulumParams", "pendulum_energy", "simulate_pendulum"]


@dataclass(frozen=True)
class PendulumParams:
    """The pendulum (1) and its rendering (3) (see the module docstring).

    Attributes:
        mass, length, damping, gravity: ``m`` (kg), ``l`` (m), ``mu`` (N m s), ``g`` (m/s^2).
        dt: seconds between frames.
        substeps: Runge-Kutta steps per frame.
        max_torque: torques are uniform on ``[-max_torque, max_torque]`` (N m).
        max_initial_velocity: ``phi'`` at time ``-dt`` is uniform on ``[-v, v]`` (rad/s).
        frame_size: frames are ``frame_size x frame_size`` pixels, pivot at the centre.
        pole_length, pole_radius: the drawn pole (px).
    """

    mass: float = 1.0
    length: float = 1.0
    damping: float = 0.5
    gravity: float = 9.81
    dt: float = 0.1
    substeps: int = 20
    max_torque: float = 1.0
    max_initial_velocity: float = 2.0
    frame_size: int = 16
    pole_length: float = 6.5
    pole_radius: float = 1.0


def _rk4(params: PendulumParams, phi: float, omega: float, u: float, h: float, steps: int):
    ml2 = params.mass * params.length**2
    mgl = params.mass * params.gravity * params.length
    mu = params.damping

    def accel(p, w):
        return (-mu * w + mgl * math.sin(p) + u) / ml2

    for _ in range(steps):
        k1p, k1w = omega, accel(phi, omega)
        k2p, k2w = omega + 0.5 * h * k1w, accel(phi + 0.5 * h * k1p, omega + 0.5 * h * k1w)
        k3p, k3w = omega + 0.5 * h * k2w, accel(phi + 0.5 * h * k2p, omega + 0.5 * h * k2w)
        k4p, k4w = omega + h * k3w, accel(phi + h * k3p, omega + h * k3w)
        phi += h / 6.0 * (k1p + 2.0 * k2p + 2.0 * k3p + k4p)
        omega += h / 6.0 * (k1w + 2.0 * k2w + 2.0 * k3w + k4w)
    return phi, omega


def pendulum_energy(states, params: PendulumParams = PendulumParams()):
    """The mechanical energy (2) of states ``(..., 2)`` = ``(phi, phi')``; returns ``(...)``."""
    phi, omega = states[..., 0], states[..., 1]
    cos = np.cos(phi) if isinstance(phi, np.ndarray) else phi.cos()
    return (
        0.5 * params.mass * params.length**2 * omega**2
        + params.mass * params.gravity * params.length * cos
    )


def simulate_pendulum(params: PendulumParams, rng: np.random.Generator, num_steps: int):
    """One pendulum video (see the module docstring).

    Returns:
        ``(frames, states, positions, controls)``: ``uint8`` ``(T, H, W)`` 0/1; ``float64``
        ``(T, 2)`` rows ``(phi, phi')`` (rad, rad/s) at the frame times; ``float64`` ``(T, 2)``
        pole tips (3) in px; ``float64`` ``(T, 1)`` torques ``u_t`` (N m).
    """
    phi = rng.uniform(-math.pi, math.pi)
    omega = rng.uniform(-params.max_initial_velocity, params.max_initial_velocity)
    torques = rng.uniform(-params.max_torque, params.max_torque, size=num_steps)
    n = params.frame_size
    c, length, h = n / 2.0, params.pole_length, params.dt / params.substeps
    frames = np.zeros((num_steps, n, n), dtype=np.uint8)
    states = np.zeros((num_steps, 2), dtype=np.float64)
    positions = np.zeros((num_steps, 2), dtype=np.float64)
    for t in range(num_steps):
        phi, omega = _rk4(params, phi, omega, float(torques[t]), h, params.substeps)
        tip = (c + length * math.sin(phi), c - length * math.cos(phi))
        states[t] = phi, omega
        positions[t] = tip
        frames[t] = render_capsules(n, n, [(c, c, tip[0], tip[1], params.pole_radius)])
    return frames, states, positions, torques.astype(np.float64)[:, None]
