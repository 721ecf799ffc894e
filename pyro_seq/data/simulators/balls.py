r"""A ball bouncing between walls, simulated with the 2-D physics engine pymunk.

The four video environments of Fraccaro et al. (thesis Ch. 6, sec. 6.5.1 and 6.5.3; appendix
6.8: "All the videos were generated using the physics engine Pymunk"): ``box``, ``box_gravity``,
``polygon`` and ``pong``. Units are those of :mod:`~pyro_seq.data.simulators.render`: one
simulator unit is one pixel, ``x`` runs to the right and ``y`` down the image, time is in
seconds.

Dynamics (between collisions, a point mass under a constant acceleration ``(0, g)``)::

    p(t + dt) = p(t) + dt v(t) + (dt^2 / 2) (0, g),    v(t + dt) = v(t) + dt (0, g)      (1)

pymunk integrates (1) with ``substeps`` semi-implicit Euler steps of ``h = dt / substeps`` per
frame (``v += h a; p += h v``), whose positions satisfy ``p_{m+1} - 2 p_m + p_{m-1} = h^2 a``
exactly, so the frame positions do too with ``dt^2 a``: the second finite difference of ``y``
over three frames without a collision is ``g dt^2`` up to rounding. Collisions with the walls are
perfectly elastic (restitution 1) and frictionless: the normal velocity is reversed and the
tangential velocity kept, so without gravity the speed ``|v|`` never changes. pymunk lets
shapes overlap by up to its collision slop (0.1 px) plus one sub-step's travel before pushing
them apart, so a recorded centre can lie up to ``0.1 + h |v|`` px (0.25 px here) beyond the
line ``radius`` from a wall.

Initial state (per sequence, from the sequence's own random generator): the centre uniform on
the points at least ``radius + start_margin`` from every wall (rejection sampling), the
direction of the velocity uniform on ``[0, 2 pi)`` and the speed uniform on ``speed``.

Frame ``t`` (``t = 0..T-1``) is the state at time ``t dt`` rendered by
:func:`~pyro_seq.data.simulators.render.render_capsules`: the ball is a filled disc of
``radius`` px; the walls are not drawn (only the pong paddles are, see :class:`PongParams`).

Parameters and where they come from. The thesis fixes the frame (32x32 binary), ``T = 20`` and
the set sizes (5000 training and 1000 test videos), says the collisions are "fully elastic" and
that the box has no forces other than the walls (sec. 6.5.1), names gravity, an irregular
polygon and pong paddles that "follow the vertical position of the ball to make it stay in the
frame at all times" (sec. 6.5.3), and shows the paddles in Fig. 6.5 (the only walls said to be
visible). The rest is not in the thesis; the values are those of the authors' released
generators (github.com/simonkamronn/kvae, ``kvae/datasets``), read for the numbers only: a ball
of radius 3 px, ``dt = 0.2`` s per frame (also the sampling interval of the thesis' ball-tracking
example, sec. 3.4), speeds uniform on 10-15 px/s (5-10 px/s under gravity), gravity 5 px/s^2.
Our own choices: the walls lie on the frame's border (so the ball fills the whole frame), the
polygon's vertices (:data:`POLYGON_WALLS`), the uniform initial position, 20 sub-steps per frame,
and the pong paddles' size and speed (:class:`PongParams`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import numpy as np

from .render import render_capsules

__all__ = [
    "BOX_WALLS",
    "POLYGON_WALLS",
    "BallParams",
    "PongParams",
    "require_pymunk",
    "simulate_ball",
    "simulate_pong",
    "wall_distances",
]

INSTALL_HINT = "pip install pyro-seq[sim]"

#: The walls of the square box, the border of the 32x32 frame (vertices in pixels, clockwise
#: on screen).
BOX_WALLS: Tuple[Tuple[float, float], ...] = ((0.0, 0.0), (32.0, 0.0), (32.0, 32.0), (0.0, 32.0))
#: The walls of the ``polygon`` environment, an irregular convex hexagon inside the 32x32 frame
#: with no two sides of equal length or direction (our choice; the thesis shows one in
#: Fig. 6.5 without giving its vertices).
POLYGON_WALLS: Tuple[Tuple[float, float], ...] = (
    (10.0, 1.0),
    (27.0, 3.0),
    (31.0, 21.0),
    (20.0, 31.0),
    (6.0, 30.0),
    (2.0, 10.0),
)


def require_pymunk():
    """The ``pymunk`` module, or an :class:`ImportError` that names the ``sim`` extra."""
    try:
        import pymunk
    except ImportError as err:
        raise ImportError(
            "the box, box_gravity, polygon and pong simulators need the optional dependency "
            f"'pymunk' (a 2-D physics engine), which is not installed: {INSTALL_HINT}"
        ) from err
    return pymunk


@dataclass(frozen=True)
class _BallCommon:
    """The fields every ball environment shares (see :class:`BallParams` for their meaning)."""

    frame_size: int = 32
    radius: float = 3.0
    dt: float = 0.2
    substeps: int = 20
    speed: Tuple[float, float] = (10.0, 15.0)
    start_margin: float = 1.0


@dataclass(frozen=True)
class BallParams(_BallCommon):
    """A ball in a convex polygon of walls (``box``, ``box_gravity``, ``polygon``).

    Attributes:
        frame_size: frames are ``frame_size x frame_size`` pixels.
        radius: the ball's radius (px).
        dt: seconds between frames.
        substeps: pymunk steps per frame.
        speed: ``(low, high)`` of the initial speed (px/s), uniform.
        gravity: acceleration along ``+y`` (down the image), px/s^2.
        walls: vertices of a convex polygon (px), in order; each side is a wall.
        start_margin: the initial centre is at least ``radius + start_margin`` px from every wall.
    """

    gravity: float = 0.0
    walls: Tuple[Tuple[float, float], ...] = BOX_WALLS


@dataclass(frozen=True)
class PongParams(_BallCommon):
    """A ball between a floor, a roof and two paddles that follow it (``pong``).

    The floor and the roof are the frame's top and bottom border (extended sideways). The
    paddles are vertical capsules drawn into the frames: segments of half-length
    ``paddle_half_length`` around ``(paddle_x[k], y_p)``, thickened by ``paddle_radius``. Both
    start at the ball's height and, before each frame's physics, move towards the ball's current
    height by at most ``paddle_step`` px (moving at constant velocity during the frame), kept
    inside the frame. The ball moves at most ``speed[1] dt`` = 3 px vertically per frame, less
    than ``paddle_step``, so a paddle is never more than 3 px from the ball's height and the
    ball cannot pass it: the ball stays in the frame (thesis sec. 6.5.3).

    Attributes:
        frame_size, radius, dt, substeps, speed, start_margin: as in :class:`BallParams`.
        paddle_x: the paddles' columns (px).
        paddle_half_length, paddle_radius: the paddles' shape (px); 10 x 2 px here.
        paddle_step: the most a paddle moves in one frame (px).
    """

    paddle_x: Tuple[float, float] = (1.0, 31.0)
    paddle_half_length: float = 4.0
    paddle_radius: float = 1.0
    paddle_step: float = 4.0


def wall_distances(points: np.ndarray, walls) -> np.ndarray:
    """Signed distances of points to the sides of a convex polygon (positive inside).

    Args:
        points: ``(..., 2)`` in pixels.
        walls: the polygon's vertices, in order (either orientation).

    Returns:
        ``(..., K)``: the distance of each point to the line of each of the ``K`` sides.
    """
    v = np.asarray(walls, dtype=np.float64)
    edge = np.roll(v, -1, axis=0) - v
    normal = np.stack([-edge[:, 1], edge[:, 0]], axis=1) / np.linalg.norm(edge, axis=1)[:, None]
    offset = (normal * v).sum(1)
    centroid = v.mean(0)
    sign = np.where(normal @ centroid - offset >= 0, 1.0, -1.0)  # make "inside" positive
    return (np.asarray(points, dtype=np.float64) @ normal.T - offset) * sign


def _check_convex(walls) -> None:
    v = np.asarray(walls, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != 2 or len(v) < 3:
        raise ValueError(f"walls must be at least 3 vertices (x, y), got {walls!r}")
    e = np.roll(v, -1, axis=0) - v
    cross = e[:, 0] * np.roll(e, -1, axis=0)[:, 1] - e[:, 1] * np.roll(e, -1, axis=0)[:, 0]
    if not (np.all(cross > 0) or np.all(cross < 0)):
        raise ValueError(f"walls must be the vertices of a convex polygon in order, got {walls!r}")


def _initial_velocity(rng: np.random.Generator, speed) -> Tuple[float, float]:
    angle = rng.uniform(0.0, 2.0 * math.pi)
    s = rng.uniform(*speed)
    return s * math.cos(angle), s * math.sin(angle)


def _add_ball(pymunk, space, radius, position, velocity):
    body = pymunk.Body(1.0, pymunk.moment_for_circle(1.0, 0.0, radius))
    body.position = position
    body.velocity = velocity
    shape = pymunk.Circle(body, radius)
    shape.elasticity, shape.friction = 1.0, 0.0
    space.add(body, shape)
    return body


def _add_wall(pymunk, space, body, a, b, radius=0.0):
    shape = pymunk.Segment(body, a, b, radius)
    shape.elasticity, shape.friction = 1.0, 0.0
    space.add(shape)
    return shape


def simulate_ball(params: BallParams, rng: np.random.Generator, num_steps: int):
    """One video of a ball in a convex polygon (see the module docstring).

    Returns:
        ``(frames, states)``: ``uint8`` ``(T, H, W)`` 0/1 and ``float64`` ``(T, 4)`` rows
        ``(x, y, vx, vy)`` in px and px/s at times ``0, dt, ..., (T-1) dt``.
    """
    pymunk = require_pymunk()
    _check_convex(params.walls)
    n, r = params.frame_size, params.radius
    lo = r + params.start_margin
    for _ in range(100_000):
        p = rng.uniform(0.0, n, size=2)
        if wall_distances(p, params.walls).min() >= lo:
            break
    else:
        raise ValueError(f"no point is {lo} px from every wall of {params.walls}")
    velocity = _initial_velocity(rng, params.speed)
    space = pymunk.Space()
    space.gravity = (0.0, params.gravity)
    walls = [tuple(map(float, w)) for w in params.walls]
    for a, b in zip(walls, walls[1:] + walls[:1]):
        _add_wall(pymunk, space, space.static_body, a, b)
    ball = _add_ball(pymunk, space, r, (float(p[0]), float(p[1])), velocity)
    h = params.dt / params.substeps
    frames = np.zeros((num_steps, n, n), dtype=np.uint8)
    states = np.zeros((num_steps, 4), dtype=np.float64)
    for t in range(num_steps):
        (x, y), (vx, vy) = ball.position, ball.velocity
        states[t] = x, y, vx, vy
        frames[t] = render_capsules(n, n, [(x, y, x, y, r)])
        if t + 1 < num_steps:
            for _ in range(params.substeps):
                space.step(h)
    return frames, states


def simulate_pong(params: PongParams, rng: np.random.Generator, num_steps: int):
    """One pong video: the ball and both paddles drawn (see :class:`PongParams`).

    Returns:
        ``(frames, states)``: ``uint8`` ``(T, H, W)`` 0/1 and ``float64`` ``(T, 5)`` rows
        ``(x, y, vx, vy, y_paddle)`` in px and px/s (both paddles are at height ``y_paddle``).
    """
    pymunk = require_pymunk()
    n, r = params.frame_size, params.radius
    left, right = params.paddle_x
    inner = params.paddle_radius + r + params.start_margin
    x0 = rng.uniform(left + inner, right - inner)
    y0 = rng.uniform(r + params.start_margin, n - r - params.start_margin)
    velocity = _initial_velocity(rng, params.speed)
    space = pymunk.Space()
    for y in (0.0, float(n)):  # floor and roof, wider than the frame
        _add_wall(pymunk, space, space.static_body, (-float(n), y), (2.0 * n, y))
    half = params.paddle_half_length
    y_lo, y_hi = half + params.paddle_radius, n - half - params.paddle_radius
    paddles = pymunk.Body(body_type=pymunk.Body.KINEMATIC)
    paddles.position = (0.0, min(max(y0, y_lo), y_hi))
    space.add(paddles)
    for px in (left, right):
        _add_wall(pymunk, space, paddles, (px, -half), (px, half), params.paddle_radius)
    ball = _add_ball(pymunk, space, r, (x0, y0), velocity)
    h = params.dt / params.substeps
    frames = np.zeros((num_steps, n, n), dtype=np.uint8)
    states = np.zeros((num_steps, 5), dtype=np.float64)
    for t in range(num_steps):
        (x, y), (vx, vy), yp = ball.position, ball.velocity, paddles.position.y
        states[t] = x, y, vx, vy, yp
        pr = params.paddle_radius
        frames[t] = render_capsules(
            n,
            n,
            [
                (x, y, x, y, r),
                (left, yp - half, left, yp + half, pr),
                (right, yp - half, right, yp + half, pr),
            ],
        )
        if t + 1 < num_steps:
            move = min(max(min(max(y, y_lo), y_hi) - yp, -params.paddle_step), params.paddle_step)
            paddles.velocity = (0.0, move / params.dt)
            for _ in range(params.substeps):
                space.step(h)
    return frames, states
