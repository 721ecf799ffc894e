"""pyro_seq.data.simulators: determinism, prefixes, the cache, rendering and the physics.

The physics checks assert mathematics, not snapshots:
* box: perfectly elastic, frictionless walls conserve the speed |v| exactly (pymunk reverses the
  normal velocity), and a ball too far from every wall to reach one within dt moves by v dt;
* box_gravity: between collisions the second difference of y over three frames is g dt^2
  (pymunk's semi-implicit Euler sub-steps make this exact up to rounding; balls.py eq. 1);
* pendulum: with mu = 0 the energy E = phi'^2/2 + g cos(phi) changes over a frame by exactly the
  work of the constant torque, u_t (phi_t - phi_{t-1}) (pendulum_ode.py eq. 2), so it is
  conserved when u = 0; the RK4 tolerance (20 steps of 5 ms) is about 1e-8.
"""

import importlib
import importlib.util
import sys
import warnings

import numpy as np
import pytest
import torch

import pyro_seq.data
from pyro_seq.data import simulators
from pyro_seq.data.simulators import (
    BallParams,
    PendulumParams,
    box,
    box_gravity,
    core,
    pendulum,
    pendulum_energy,
    polygon,
    pong,
    simulate,
)
from pyro_seq.data.simulators.balls import wall_distances

needs_pymunk = pytest.mark.skipif(
    importlib.util.find_spec("pymunk") is None, reason="needs pymunk (pip install pyro-seq[sim])"
)
ALL = [pytest.param(f, marks=needs_pymunk) for f in (box, box_gravity, polygon, pong)] + [pendulum]
QUIET = dict(cache=False, progress=False, num_workers=1)
# pymunk lets the ball overlap a wall by its collision slop (0.1 px) plus one sub-step's travel
# (15 px/s * 0.01 s) before pushing it out: the bound stated in balls.py.
OVERLAP = 0.1 + 15.0 * 0.2 / 20


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Every call that uses the default cache writes under tmp_path, never ~/.cache."""
    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path / "cache"))


def _same(a, b):
    return (
        torch.equal(a.frames, b.frames)
        and torch.equal(a.positions, b.positions)
        and torch.equal(a.states, b.states)
        and (a.controls is None) == (b.controls is None)
        and (a.controls is None or torch.equal(a.controls, b.controls))
    )


def _centroids(frames):
    """Centroids ``(N, T, 2)`` of the on pixels' centres, in the (x, y) pixel coordinates."""
    frames = frames.double()
    ys = torch.arange(frames.shape[-2], dtype=torch.float64)[:, None] + 0.5
    xs = torch.arange(frames.shape[-1], dtype=torch.float64)[None, :] + 0.5
    mass = frames.sum((-2, -1))
    return torch.stack([(frames * xs).sum((-2, -1)) / mass, (frames * ys).sum((-2, -1)) / mass], -1)


# --- the interface ------------------------------------------------------------------------------


@pytest.mark.parametrize("make", ALL)
def test_shapes_binary_frames_and_fields(make):
    v = make(3, num_steps=5, **QUIET)
    size = 16 if make is pendulum else 32
    assert v.frames.shape == (3, 5, size, size) and v.frames.dtype == torch.float32
    assert set(v.frames.unique().tolist()) <= {0.0, 1.0}
    assert (v.frames.flatten(2).sum(-1) > 0).all()  # the object is in every frame
    assert v.positions.shape == (3, 5, 2) and v.positions.dtype == torch.float32
    assert v.states.shape == (3, 5, len(v.state_names)) and v.states.dtype == torch.float64
    if make is pendulum:
        assert v.controls.shape == (3, 5, 1) and v.controls.abs().max() <= 1.0
    else:
        assert v.controls is None
        assert torch.allclose(v.positions.double(), v.states[..., :2], atol=1e-5)
    seqs = v.as_sequences()
    assert len(seqs) == 3 and seqs[0].shape == (5, size * size)
    if make is pendulum:  # the torques travel as known inputs
        assert [torch.equal(u, c) for u, c in zip(seqs.inputs, v.controls.float())] == [True] * 3
    else:
        assert not hasattr(seqs, "inputs")
    assert torch.equal(seqs[1].view(5, size, size), v.frames[1])
    assert len(v) == 3 and v.num_steps == 5 and v.dt == v.params.dt
    assert _same(v.subset(slice(1, 3)), make(3, num_steps=5, **QUIET).subset([1, 2]))


def test_thesis_defaults():
    assert core.DEFAULT_SIZES["box"] == {"train": 5000, "valid": 1000, "test": 1000}
    assert core.DEFAULT_SIZES["pendulum"] == {"train": 500, "valid": 500, "test": 500}
    assert core.ENVIRONMENTS["box"].default_steps == 20
    assert core.ENVIRONMENTS["pendulum"].default_steps == 15
    assert BallParams().frame_size == 32 and PendulumParams().frame_size == 16


@needs_pymunk
def test_bad_arguments():
    with pytest.raises(ValueError, match="num_sequences"):
        box(0, **QUIET)
    with pytest.raises(ValueError, match="seed"):
        box(2, seed=-1, **QUIET)
    with pytest.raises(ValueError, match="split"):
        box(2, split="validation", **QUIET)
    with pytest.raises(ValueError, match="parameter"):
        box(2, gravty=1.0, **QUIET)
    with pytest.raises(ValueError, match="unknown simulator"):
        simulate("boxx", 2, **QUIET)


def test_import_without_pymunk_and_the_error_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("pyro_seq.data.simulators")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pymunk", None)  # "import pymunk" now raises ImportError
    monkeypatch.setattr(pyro_seq.data, "simulators", simulators)  # restored afterwards
    fresh = importlib.import_module("pyro_seq.data.simulators")
    assert fresh is not simulators
    for make in (fresh.box, fresh.box_gravity, fresh.polygon, fresh.pong):
        with pytest.raises(ImportError, match=r"pip install pyro-seq\[sim\]"):
            make(2, **QUIET)
    assert fresh.pendulum(2, num_steps=3, **QUIET).frames.shape == (2, 3, 16, 16)


# --- determinism, prefixes, workers -------------------------------------------------------------


@pytest.mark.parametrize("make", ALL)
def test_deterministic_for_a_seed(make):
    a, b = make(3, num_steps=6, seed=7, **QUIET), make(3, num_steps=6, seed=7, **QUIET)
    assert _same(a, b)
    c = make(3, num_steps=6, seed=8, **QUIET)
    assert not torch.equal(a.states, c.states) and not torch.equal(a.frames, c.frames)
    test = make(3, num_steps=6, seed=7, split="test", **QUIET)
    assert not torch.equal(a.states, test.states)  # the splits are independent streams


@pytest.mark.parametrize("make", ALL)
def test_fewer_sequences_give_a_prefix(make):
    small, large = make(2, num_steps=4, **QUIET), make(5, num_steps=4, **QUIET)
    assert _same(small, large.subset(slice(0, 2)))


@needs_pymunk
def test_worker_processes_do_not_change_the_result():
    serial = box(16, num_steps=4, **QUIET)
    parallel = box(16, num_steps=4, cache=False, progress=False, num_workers=2)  # 2 chunks of 8
    assert _same(serial, parallel)


# --- the cache ----------------------------------------------------------------------------------


def _forbid_generation(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("simulated although the cache holds the sequences")

    monkeypatch.setattr(core, "_generate", fail)


def test_cache_round_trip_prefix_and_extension(tmp_path, monkeypatch):
    fresh = pendulum(6, num_steps=5, **QUIET)
    first = pendulum(6, num_steps=5, cache=tmp_path, progress=False)
    assert _same(first, fresh)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith("pendulum-train-T5-seed0-")
    assert files[0].endswith("-N6.npz")
    with np.load(tmp_path / files[0], allow_pickle=False) as f:  # plain arrays, no pickle
        assert f["frames"].dtype == np.uint8

    with monkeypatch.context() as m:
        _forbid_generation(m)
        assert _same(pendulum(6, num_steps=5, cache=tmp_path, progress=False), fresh)
        assert _same(
            pendulum(4, num_steps=5, cache=tmp_path, progress=False), fresh.subset(slice(0, 4))
        )

    calls = []
    generate = core._generate
    monkeypatch.setattr(
        core, "_generate", lambda *a: calls.append(a[5:7]) or generate(*a)
    )  # (start, stop)
    extended = pendulum(9, num_steps=5, cache=tmp_path, progress=False)
    assert calls == [(6, 9)]  # only the missing sequences were simulated
    assert _same(extended, pendulum(9, num_steps=5, **QUIET))
    # another configuration is another file, not a hit
    other = pendulum(6, num_steps=5, cache=tmp_path, progress=False, damping=0.0)
    assert not torch.equal(other.states, fresh.states)


def test_default_cache_directory_follows_the_environment_variable(tmp_path):
    pendulum(2, num_steps=3, progress=False, num_workers=1)  # cache=True
    assert len(list((tmp_path / "cache" / "simulators").glob("pendulum-*-N2.npz"))) == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not_binary", "wrong_shape"])
def test_a_corrupt_cache_is_regenerated(tmp_path, damage):
    fresh = pendulum(4, num_steps=5, **QUIET)
    pendulum(4, num_steps=5, cache=tmp_path, progress=False)
    (path,) = tmp_path.iterdir()
    raw = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not an npz archive")
    elif damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    else:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        if damage == "not_binary":
            arrays["frames"] = arrays["frames"] * 2
        else:
            arrays["positions"] = arrays["positions"][:, :, :1]
        np.savez(path, **arrays)
    with pytest.warns(UserWarning, match="ignoring"):
        again = pendulum(4, num_steps=5, cache=tmp_path, progress=False)
    assert _same(again, fresh)
    with warnings.catch_warnings():  # the file was rewritten and is valid again
        warnings.simplefilter("error")
        assert _same(pendulum(4, num_steps=5, cache=tmp_path, progress=False), fresh)


# --- rendering ----------------------------------------------------------------------------------


@needs_pymunk
@pytest.mark.parametrize("make", [box, box_gravity, polygon, pong])
def test_rendered_ball_is_at_the_returned_position(make):
    v = make(4, num_steps=20, **QUIET)
    frames = v.frames.clone()
    if make is pong:  # the paddles are drawn in columns 0-1 and 30-31, the ball never there
        assert frames[..., :2].sum((-2, -1)).gt(0).all()
        assert frames[..., 30:].sum((-2, -1)).gt(0).all()
        frames[..., :2] = 0
        frames[..., 30:] = 0
    error = (_centroids(frames) - v.positions.double()).norm(dim=-1)
    assert error.max() < 0.5  # a radius-3 disc's pixel centroid: within half a pixel
    area = frames.sum((-2, -1))
    assert area.min() >= 25 and area.max() <= 32  # pi 3^2 = 28.3


# --- physics ------------------------------------------------------------------------------------


@needs_pymunk
@pytest.mark.parametrize("make", [box, polygon])
def test_elastic_walls_conserve_speed_and_keep_the_ball_inside(make):
    v = make(8, num_steps=20, **QUIET)
    p = v.params
    pos, vel = v.states[..., :2].numpy(), v.states[..., 2:4].numpy()
    speed = np.linalg.norm(vel, axis=-1)
    np.testing.assert_allclose(speed, speed[:, :1].repeat(20, 1), rtol=1e-9)
    assert (speed[:, 0] >= p.speed[0]).all() and (speed[:, 0] <= p.speed[1]).all()
    # there were bounces: the velocity changed direction in most videos
    turned = np.abs(np.diff(vel, axis=1)).max(axis=(1, 2)) > 1e-6
    assert turned.sum() >= 6
    assert wall_distances(pos, p.walls).min() >= p.radius - OVERLAP
    # away from the walls the ball moves by v dt: finite differences of the positions
    free = wall_distances(pos[:, :-1], p.walls).min(-1) > p.radius + speed[:, :-1] * p.dt
    assert free.sum() > 20
    step = (pos[:, 1:] - pos[:, :-1])[free]
    np.testing.assert_allclose(step, vel[:, :-1][free] * p.dt, atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(step, axis=-1) / p.dt, speed[:, :-1][free], rtol=1e-9)


@needs_pymunk
@pytest.mark.parametrize("gravity", [None, 9.81])
def test_gravity_is_the_second_difference_of_height(gravity):
    extra = {} if gravity is None else {"gravity": gravity}
    v = box_gravity(8, num_steps=20, **QUIET, **extra)
    p = v.params
    g = 5.0 if gravity is None else gravity
    assert p.gravity == g
    pos = v.states[..., :2].numpy()
    vmax = np.linalg.norm(v.states[..., 2:4].numpy(), axis=-1).max()
    # three frames away from the walls: no collision can have happened in between
    far = wall_distances(pos, p.walls).min(-1) > p.radius + vmax * p.dt + g * p.dt**2
    free = far[:, :-2] & far[:, 1:-1] & far[:, 2:]
    assert free.sum() > 20
    second = (pos[:, 2:] - 2 * pos[:, 1:-1] + pos[:, :-2])[free]
    np.testing.assert_allclose(second[:, 1], g * p.dt**2, atol=1e-9)
    np.testing.assert_allclose(second[:, 0], 0.0, atol=1e-9)
    assert wall_distances(pos, p.walls).min() >= p.radius - OVERLAP


@needs_pymunk
def test_pong_paddles_follow_the_ball_and_keep_it_in_the_frame():
    v = pong(8, num_steps=40, **QUIET)
    p = v.params
    x, y, y_paddle = (v.states[..., k].numpy() for k in (0, 1, 4))
    inner = p.paddle_radius + p.radius - OVERLAP
    assert x.min() >= p.paddle_x[0] + inner and x.max() <= p.paddle_x[1] - inner
    assert y.min() >= p.radius - OVERLAP and y.max() <= p.frame_size - p.radius + OVERLAP
    lo = p.paddle_half_length + p.paddle_radius
    target = np.clip(y, lo, p.frame_size - lo)
    assert np.abs(target - y_paddle).max() <= p.speed[1] * p.dt + 1e-6
    assert np.abs(np.diff(y_paddle, axis=1)).max() <= p.paddle_step + 1e-6


def test_pendulum_energy_is_the_work_of_the_torque():
    # frictionless: E_t - E_{t-1} = u_t (phi_t - phi_{t-1}) (constant torque over the interval)
    v = pendulum(6, num_steps=15, damping=0.0, **QUIET)
    params = v.params
    energy = pendulum_energy(v.states, params)
    work = v.controls[:, 1:, 0].double() * (v.states[:, 1:, 0] - v.states[:, :-1, 0])
    # controls are stored as float32: allow their rounding (|u| <= 1, |dphi| < 1.5)
    assert torch.allclose(energy.diff(dim=1), work, atol=1e-6)
    # no torque and no friction: conserved to the integrator's tolerance
    free = pendulum(6, num_steps=15, damping=0.0, max_torque=0.0, **QUIET)
    assert free.controls.abs().max() == 0
    energy = pendulum_energy(free.states, free.params)
    assert (energy - energy[:, :1]).abs().max() < 1e-7 * params.gravity
    # no torque, with friction: energy only decreases
    damped = pendulum(6, num_steps=15, max_torque=0.0, **QUIET)
    assert (pendulum_energy(damped.states, damped.params).diff(dim=1) <= 1e-12).all()


def test_pendulum_frames_show_the_pole_at_its_angle():
    v = pendulum(8, num_steps=15, **QUIET)
    p = v.params
    phi = v.states[..., 0]
    c = p.frame_size / 2
    direction = torch.stack([phi.sin(), -phi.cos()], -1)  # phi = 0 upright, y down the image
    assert torch.allclose(v.positions.double(), c + p.pole_length * direction, atol=1e-5)
    centroid = _centroids(v.frames) - c
    # the pole's pixels are centred on the middle of the pole ...
    assert (centroid - 0.5 * p.pole_length * direction).norm(dim=-1).max() < 1.0
    # ... and point along phi
    seen = torch.atan2(centroid[..., 0], -centroid[..., 1])
    error = torch.remainder(seen - phi + torch.pi, 2 * torch.pi) - torch.pi
    assert error.abs().max() < 0.2
