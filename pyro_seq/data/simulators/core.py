"""Datasets of simulated videos: seeding, parallel generation, validation and the disk cache.

Determinism. Sequence ``i`` of split ``s`` of environment ``e`` is simulated from its own
random generator, ``numpy.random.default_rng(SeedSequence(seed, spawn_key=(e, s, i)))``, where
``e`` and ``s`` are the fixed codes of :data:`ENVIRONMENTS` and :data:`SPLITS`. Nothing else
is random, so a sequence depends only on ``(environment, parameters, split, seed, i)``: not on
the number of sequences asked for, the number of worker processes or the cache. Asking for
fewer sequences gives a prefix, and the splits are independent streams.

Cache. A generated set is stored as ``<env>-<split>-T<T>-seed<seed>-<config hash>-v<format>-
N<n>.npz`` in ``<cache dir>/simulators``, the cache directory being
:func:`pyro_seq.data.cache_dir` (``$PYRO_SEQ_CACHE`` if set, else ``~/.cache/pyro_seq``). The
config hash covers every physical and rendering parameter and, for the pymunk environments,
the pymunk version. Files are plain ``.npz`` archives read with ``allow_pickle=False``; a
request for ``n`` sequences reads the smallest cached set of the same config with at least
``n`` (and slices it), or extends the largest smaller one by simulating only the missing
sequences. A file that cannot be read, or whose content fails :func:`validate_videos`, is
ignored with a warning and regenerated. Writes are atomic (a temporary file, then
``os.replace``).

Parallel generation. The missing sequences are cut into chunks of consecutive indices (at
least 8, about 8 chunks per worker) that a :class:`concurrent.futures.ProcessPoolExecutor`
with ``num_workers`` processes simulates, with a tqdm bar counting sequences; the chunks are
put back in index order. The executor uses the platform's default start method, so a script
that generates data on a platform that spawns processes (macOS, Windows) needs the usual
``if __name__ == "__main__":`` guard. Cost on a busy 2-core machine: about 3 ms per 20-frame
ball video (pymunk, 20 sub-steps per frame) and 1.6 ms per 15-frame pendulum video; the
5000 training ``box`` videos take about 15 s with 2 workers and 4 MB of cache, and load in
about 2 s. ``frames`` are returned as float32: 410 MB for 5000 videos of 20 32x32 frames.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ...ops.padding import SequenceList
from ...validation import positive_int
from ..chorales import cache_dir
from .balls import (
    POLYGON_WALLS,
    BallParams,
    PongParams,
    require_pymunk,
    simulate_ball,
    simulate_pong,
)
from .pendulum_ode import PendulumParams, simulate_pendulum

__all__ = [
    "DEFAULT_SIZES",
    "ENVIRONMENTS",
    "SPLITS",
    "SimulatedVideos",
    "box",
    "box_gravity",
    "pendulum",
    "polygon",
    "pong",
    "simulate",
    "simulate_sequence",
    "validate_videos",
]

CACHE_FORMAT = 1  #: bump when a simulator's output changes, so that old caches are not read
#: The splits a simulator draws independently (each with its own seeds).
SPLITS = ("train", "valid", "test")
_ARRAYS = ("frames", "positions", "states", "controls")  # what a cache file holds, and config


@dataclass(frozen=True)
class _Environment:
    code: int
    params: Any  # the default parameter dataclass
    needs_pymunk: bool
    state_names: tuple
    default_steps: int
    sizes: Mapping[str, int]  # default number of sequences per split


_BALL_SIZES = {"train": 5000, "valid": 1000, "test": 1000}  # thesis app. 6.8 (no valid split)
_BALL_STATES = ("x", "y", "vx", "vy")

#: The environments by name, with their fixed seeding code and default parameters.
ENVIRONMENTS: Dict[str, _Environment] = {
    "box": _Environment(0, BallParams(), True, _BALL_STATES, 20, _BALL_SIZES),
    "box_gravity": _Environment(
        1, BallParams(gravity=5.0, speed=(5.0, 10.0)), True, _BALL_STATES, 20, _BALL_SIZES
    ),
    "polygon": _Environment(
        2, BallParams(walls=POLYGON_WALLS), True, _BALL_STATES, 20, _BALL_SIZES
    ),
    "pong": _Environment(3, PongParams(), True, _BALL_STATES + ("y_paddle",), 20, _BALL_SIZES),
    "pendulum": _Environment(
        4,
        PendulumParams(),
        False,
        ("phi", "phi_dot"),
        15,
        {"train": 500, "valid": 500, "test": 500},
    ),  # thesis 6.5.2
}
#: Default number of sequences per split and environment (thesis app. 6.8 and sec. 6.5.2; the
#: thesis has no validation split for the ball videos, 1000 is ours).
DEFAULT_SIZES = {name: dict(env.sizes) for name, env in ENVIRONMENTS.items()}


@dataclass(frozen=True, eq=False)
class SimulatedVideos:
    """Simulated videos and their ground truth.

    Attributes:
        name: the environment (``"box"``, ``"box_gravity"``, ``"polygon"``, ``"pong"``,
            ``"pendulum"``).
        split: ``"train"``, ``"valid"`` or ``"test"``.
        seed: the seed the sequences were drawn from.
        frames: ``float32`` ``(N, T, H, W)`` of 0/1 (32x32, or 16x16 for the pendulum).
        positions: ``float32`` ``(N, T, 2)``: the ball's centre (the pendulum's pole tip) in
            pixel coordinates ``(x, y)``: ``x`` along the columns, ``y`` down the rows, pixel
            ``(i, j)`` covering ``[j, j+1] x [i, i+1]``; one simulator unit is one pixel.
        states: ``float64`` ``(N, T, S)``: the full simulator state at each frame, columns named
            by ``state_names`` (``x, y, vx, vy`` in px and px/s; pong adds ``y_paddle``; the
            pendulum has ``phi, phi_dot`` in rad and rad/s, ``phi = 0`` upright).
        controls: ``float32`` ``(N, T, 1)``, the pendulum's torques ``u_t`` (the torque over the
            interval that ends at frame ``t``), or ``None``.
        state_names: names of the columns of ``states``.
        params: the parameter dataclass the videos were simulated with (``dt`` is ``params.dt``).
    """

    name: str
    split: str
    seed: int
    frames: torch.Tensor
    positions: torch.Tensor
    states: torch.Tensor
    controls: Optional[torch.Tensor]
    state_names: tuple
    params: Any

    def __len__(self) -> int:
        return self.frames.shape[0]

    @property
    def num_steps(self) -> int:
        return self.frames.shape[1]

    @property
    def dt(self) -> float:
        return float(self.params.dt)

    def subset(self, index) -> "SimulatedVideos":
        """The sequences ``index`` (an int, slice, list or tensor of indices) as a new object."""
        if isinstance(index, int):
            index = [index]
        return dataclasses.replace(
            self,
            frames=self.frames[index],
            positions=self.positions[index],
            states=self.states[index],
            controls=None if self.controls is None else self.controls[index],
        )

    def as_sequences(self) -> List[torch.Tensor]:
        """The videos as the package's sequence models take them: a list of ``N`` tensors
        ``(T, H*W)`` (row-major pixels), ready for :func:`~pyro_seq.data.pad_sequences`; for
        the pendulum a :class:`~pyro_seq.data.SequenceList` carrying the torques ``(T, 1)`` as
        known inputs (``inputs=`` of a KVAE with ``control_dim=1``, a DMM with
        ``input_dim=1``)."""
        frames = self.frames.flatten(2).unbind(0)
        if self.controls is None:
            return list(frames)
        return SequenceList(frames, self.controls.float().unbind(0))


def _config(name: str, params, num_steps: int) -> Dict[str, Any]:
    config = {
        "env": name,
        "format": CACHE_FORMAT,
        "num_steps": num_steps,
        "params": dataclasses.asdict(params),
    }
    if ENVIRONMENTS[name].needs_pymunk:
        import pymunk

        config["pymunk"] = str(pymunk.version)
    return json.loads(json.dumps(config))  # tuples as lists: compares equal to what is stored


def simulate_sequence(name: str, params, num_steps: int, seed: int, split: str, index: int):
    """Sequence ``index`` of a set, exactly as in every set it belongs to (module docstring).

    Returns:
        ``{"frames": uint8 (T, H, W), "positions": float64 (T, 2), "states": float64 (T, S),
        "controls": float64 (T, 1) or None}``.
    """
    env = ENVIRONMENTS[name]
    key = (env.code, SPLITS.index(split), index)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
    if name == "pendulum":
        frames, states, positions, controls = simulate_pendulum(params, rng, num_steps)
        return {"frames": frames, "positions": positions, "states": states, "controls": controls}
    simulate = simulate_pong if name == "pong" else simulate_ball
    frames, states = simulate(params, rng, num_steps)
    return {"frames": frames, "positions": states[:, :2].copy(), "states": states, "controls": None}


def _simulate_range(name, params, num_steps, seed, split, start, stop) -> Dict[str, np.ndarray]:
    """Sequences ``start..stop-1`` stacked (the unit of work of a worker process)."""
    seqs = [simulate_sequence(name, params, num_steps, seed, split, i) for i in range(start, stop)]
    out = {k: np.stack([s[k] for s in seqs]) for k in ("frames", "positions", "states")}
    if seqs[0]["controls"] is not None:
        out["controls"] = np.stack([s["controls"] for s in seqs])
    return out


def _concat(parts: Sequence[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _generate(name, params, num_steps, seed, split, start, stop, num_workers, progress):
    from pyro_seq.progress import progress_bar as tqdm

    n = stop - start
    chunk = max(8, -(-n // (8 * max(num_workers, 1))))
    bounds = [(a, min(a + chunk, stop)) for a in range(start, stop, chunk)]
    parts: Dict[int, Dict[str, np.ndarray]] = {}
    with tqdm(
        total=n, desc=f"simulating {name} ({split})", unit="seq", disable=not progress
    ) as bar:
        if num_workers <= 1 or len(bounds) == 1:
            for a, b in bounds:
                parts[a] = _simulate_range(name, params, num_steps, seed, split, a, b)
                bar.update(b - a)
        else:
            with ProcessPoolExecutor(max_workers=min(num_workers, len(bounds))) as pool:
                futures = {
                    pool.submit(_simulate_range, name, params, num_steps, seed, split, a, b): (a, b)
                    for a, b in bounds
                }
                for future in as_completed(futures):
                    a, b = futures[future]
                    parts[a] = future.result()
                    bar.update(b - a)
    return _concat([parts[a] for a, _ in bounds])


def validate_videos(
    arrays: Mapping[str, Any],
    num_sequences: int,
    num_steps: int,
    frame_size: int,
    state_dim: int,
    controls: bool,
) -> Optional[str]:
    """What is wrong with a set of simulated arrays, or ``None`` if nothing is.

    Checks: ``frames`` ``(N, T, H, W)`` of 0/1 with at least one pixel on in every frame (the
    ball, or the pole, is always in view); ``positions`` ``(N, T, 2)``, finite, inside the
    frame; ``states`` ``(N, T, S)`` finite; ``controls`` ``(N, T, 1)`` finite when expected and
    absent otherwise. ``N`` may be larger than ``num_sequences`` (a cached superset).
    """
    frames = arrays.get("frames")
    shape = (num_steps, frame_size, frame_size)
    if (
        frames is None
        or frames.ndim != 4
        or tuple(frames.shape[1:]) != shape
        or frames.shape[0] < num_sequences
    ):
        return (
            f"frames of shape {getattr(frames, 'shape', None)}, expected "
            f"(>={num_sequences}, {shape})"
        )
    n = frames.shape[0]
    values = np.asarray(frames)
    if values.dtype == np.uint8 or values.dtype == np.bool_:
        binary = values.max(initial=0) <= 1
    else:
        binary = np.isin(values, (0, 1)).all()
    if not binary:
        return "frames are not binary"
    if not values.reshape(n, num_steps, -1).any(-1).all():
        return "an empty frame"
    expected = {"positions": 2, "states": state_dim}
    if controls:
        expected["controls"] = 1
    elif "controls" in arrays and arrays["controls"] is not None:
        return "unexpected controls"
    for key, dim in expected.items():
        value = arrays.get(key)
        if value is None or tuple(value.shape) != (n, num_steps, dim):
            return f"{key} of shape {getattr(value, 'shape', None)}, expected {(n, num_steps, dim)}"
        if not np.isfinite(np.asarray(value)).all():
            return f"{key} are not finite"
    positions = np.asarray(arrays["positions"])
    if (positions < 0).any() or (positions > frame_size).any():
        return "a position outside the frame"
    return None


_CacheArg = Union[bool, str, "os.PathLike[str]"]


def cache_directory(cache: _CacheArg) -> Optional[Path]:
    """The folder of the simulators' cache files: None for ``cache=False``, the package's
    cache folder's ``simulators/`` for ``True``, else the given path."""
    if cache is False or cache is None:
        return None
    if cache is True:
        return cache_dir() / "simulators"
    return Path(cache).expanduser()


def read_cache(
    path: Path, config: Dict[str, Any], check, names: Sequence[str] = _ARRAYS
) -> Optional[Dict[str, np.ndarray]]:
    """The arrays ``names`` of a cache file, or None (with a warning) if it is unreadable, was
    written for another configuration, or fails ``check`` (a function returning a problem or
    None)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in tuple(names) + ("config",) if k in f.files}
        stored = json.loads(bytes(arrays.pop("config")).decode())
    except Exception as e:  # unreadable, truncated, foreign: regenerate
        warnings.warn(
            f"ignoring unreadable simulator cache {path} ({type(e).__name__}: {e}); regenerating it",
            stacklevel=2,
        )
        return None
    problem = "its configuration differs" if stored != config else check(arrays)
    if problem is not None:
        warnings.warn(f"ignoring simulator cache {path}: {problem}; regenerating it", stacklevel=2)
        return None
    return arrays


def write_cache(path: Path, arrays: Dict[str, np.ndarray], config: Dict[str, Any]) -> None:
    """Write ``arrays`` and their generating ``config`` to the ``.npz`` file ``path``
    atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(
                f,
                config=np.frombuffer(json.dumps(config, sort_keys=True).encode(), dtype=np.uint8),
                **arrays,  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
            )
        os.replace(tmp, path)  # atomic: concurrent writers never leave a partial file
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def cached_sizes(directory: Path, stem: str) -> List[int]:
    """The training-set sizes ``N`` of the cache files ``<stem>-N<N>.npz`` in ``directory``,
    sorted (empty when the folder does not exist)."""
    pattern = re.compile(re.escape(stem) + r"-N(\d+)\.npz")
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := pattern.fullmatch(p.name)))


def simulate(
    name: str,
    num_sequences: Optional[int] = None,
    num_steps: Optional[int] = None,
    seed: int = 0,
    *,
    split: str = "train",
    cache: _CacheArg = True,
    num_workers: Optional[int] = None,
    progress: bool = True,
    **overrides,
) -> SimulatedVideos:
    """Simulate (or read from the cache) videos of one environment.

    Args:
        name: ``"box"``, ``"box_gravity"``, ``"polygon"``, ``"pong"`` or ``"pendulum"``.
        num_sequences: how many; default :data:`DEFAULT_SIZES` ``[name][split]`` (5000 / 1000
            training / test ball videos, 500 per split for the pendulum, as in the thesis).
        num_steps: frames per video; default 20 (15 for the pendulum).
        seed: a non-negative integer; see the module docstring for what it determines.
        split: ``"train"``, ``"valid"`` or ``"test"``: independent streams of sequences.
        cache: ``True`` (the package's cache directory), ``False`` (no cache) or a directory.
        num_workers: processes for the simulation (default ``min(4, cpu count)``; 1: in this
            process). The result does not depend on it.
        progress: show a tqdm progress bar while simulating.
        **overrides: fields of the environment's parameter dataclass to change
            (:class:`~pyro_seq.data.simulators.BallParams`,
            :class:`~pyro_seq.data.simulators.PongParams` or
            :class:`~pyro_seq.data.simulators.PendulumParams`), e.g. ``gravity=9.81``.

    Returns:
        a :class:`SimulatedVideos`.

    Raises:
        ImportError: a pymunk environment without pymunk installed (``pip install pyro-seq[sim]``).
        ValueError: an unknown environment, split or parameter, or a bad count or seed.
    """
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown simulator {name!r}; known: {sorted(ENVIRONMENTS)}")
    env = ENVIRONMENTS[name]
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    if env.needs_pymunk:
        require_pymunk()
    n = positive_int("num_sequences", env.sizes[split] if num_sequences is None else num_sequences)
    num_steps = positive_int("num_steps", env.default_steps if num_steps is None else num_steps)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    try:
        params = dataclasses.replace(env.params, **overrides)
    except TypeError as e:
        raise ValueError(f"unknown parameter for {name}: {e}") from None
    workers = (
        min(4, os.cpu_count() or 1)
        if num_workers is None
        else positive_int("num_workers", num_workers)
    )
    config = _config(name, params, num_steps)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    stem = f"{name}-{split}-T{num_steps}-seed{seed}-{digest}-v{CACHE_FORMAT}"
    with_controls = name == "pendulum"

    def check(arrays, count=n):
        return validate_videos(
            arrays, count, num_steps, params.frame_size, len(env.state_names), with_controls
        )

    directory = cache_directory(cache)
    arrays = None
    if directory is not None:
        sizes = cached_sizes(directory, stem)
        for size in [s for s in sizes if s >= n] + [s for s in reversed(sizes) if s < n]:
            found = read_cache(
                directory / f"{stem}-N{size}.npz",
                config,
                lambda a, size=size: check(a, min(size, n)),
            )
            if found is not None and found["frames"].shape[0] == size:
                arrays = found
                break
    have = 0 if arrays is None else arrays["frames"].shape[0]
    if have < n:
        new = _generate(name, params, num_steps, seed, split, have, n, workers, progress)
        arrays = new if arrays is None else _concat([arrays, new])
        problem = check(arrays)
        if problem is not None:  # a simulator bug, not bad luck: say so
            raise RuntimeError(f"simulated {name} videos failed validation: {problem}")
        if directory is not None:
            write_cache(directory / f"{stem}-N{n}.npz", arrays, config)
    assert arrays is not None  # found in the cache, or generated above (n >= 1)
    arrays = {k: v[:n] for k, v in arrays.items()}
    return SimulatedVideos(
        name=name,
        split=split,
        seed=seed,
        frames=torch.from_numpy(arrays["frames"].astype(np.float32)),
        positions=torch.from_numpy(arrays["positions"].astype(np.float32)),
        states=torch.from_numpy(np.ascontiguousarray(arrays["states"], dtype=np.float64)),
        controls=(
            torch.from_numpy(arrays["controls"].astype(np.float32)) if with_controls else None
        ),
        state_names=env.state_names,
        params=params,
    )


_COMMON_ARGS = """
    Args:
        num_sequences: how many videos; default: the thesis' size of ``split``.
        num_steps: frames per video.
        seed: a non-negative integer; sequence ``i`` depends only on the seed, the split, ``i``
            and the parameters, so a smaller ``num_sequences`` gives a prefix.
        **kwargs: ``split``, ``cache``, ``num_workers``, ``progress`` and parameter overrides,
            as in :func:`simulate`.

    Returns:
        a :class:`SimulatedVideos` with ``frames`` ``(N, T, H, W)`` float 0/1 and ``positions``
        ``(N, T, 2)`` in pixels.
"""


def box(
    num_sequences: Optional[int] = None, num_steps: int = 20, seed: int = 0, **kwargs
) -> SimulatedVideos:
    """A ball bouncing elastically in a square box, no other force (thesis sec. 6.5.1).

    32x32 binary frames, ``T = 20``; 5000 training / 1000 test videos by default; parameters
    :class:`~pyro_seq.data.simulators.BallParams` (module :mod:`~pyro_seq.data.simulators.balls`).
    Needs pymunk (``pip install pyro-seq[sim]``).
    """
    return simulate("box", num_sequences, num_steps, seed, **kwargs)


def box_gravity(
    num_sequences: Optional[int] = None, num_steps: int = 20, seed: int = 0, **kwargs
) -> SimulatedVideos:
    """The box with gravity, 5 px/s^2 down the image (thesis sec. 6.5.3).

    As :func:`box` with ``gravity=5.0`` and initial speeds on 5-10 px/s. Needs pymunk.
    """
    return simulate("box_gravity", num_sequences, num_steps, seed, **kwargs)


def polygon(
    num_sequences: Optional[int] = None, num_steps: int = 20, seed: int = 0, **kwargs
) -> SimulatedVideos:
    """A ball bouncing between the walls of an irregular convex hexagon (thesis sec. 6.5.3).

    As :func:`box` with ``walls=POLYGON_WALLS`` (walls not drawn). Needs pymunk.
    """
    return simulate("polygon", num_sequences, num_steps, seed, **kwargs)


def pong(
    num_sequences: Optional[int] = None, num_steps: int = 20, seed: int = 0, **kwargs
) -> SimulatedVideos:
    """Pong: a ball between a floor, a roof and two drawn paddles that follow its height
    (thesis sec. 6.5.3, Fig. 6.5); parameters :class:`~pyro_seq.data.simulators.PongParams`.

    ``positions`` are the ball's; ``states`` add the paddles' height. Needs pymunk.
    """
    return simulate("pong", num_sequences, num_steps, seed, **kwargs)


def pendulum(
    num_sequences: Optional[int] = None, num_steps: int = 15, seed: int = 0, **kwargs
) -> SimulatedVideos:
    """The torque-controlled pendulum of Karl et al. (2017) (thesis sec. 6.5.2).

    16x16 binary frames of the pole, ``T = 15``, 500 sequences per split by default, the
    torques in ``controls`` ``(N, T, 1)``, pole tips in ``positions``; module
    :mod:`~pyro_seq.data.simulators.pendulum_ode`. Needs no pymunk.
    """
    return simulate("pendulum", num_sequences, num_steps, seed, **kwargs)


for _f in (box, box_gravity, polygon, pong, pendulum):
    _f.__doc__ += _COMMON_ARGS  # type: ignore[operator]  # every one has a docstring
del _f
