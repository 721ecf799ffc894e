r"""Image navigation: an agent walks on an image and sees a crop of it (thesis sec. 7.4.1).

The environment of the GTM-SM experiments (Fraccaro et al. 2018, thesis Ch. 7):

* the world is a ``32x32`` image; the agent is at one of ``9x9`` grid positions ``(row, col)``,
  ``0..8`` each, and sees the ``8x8`` crop whose top-left pixel is ``(3 row, 3 col)`` (crops
  of neighbouring positions overlap by 5 pixels; the crop is centred at pixel coordinate
  ``3 p + 4``, the middle of the ``32 - 8 = 24`` pixels of travel split in 8 strides of 3);
* five actions, :data:`ACTIONS`: ``0`` up (row - 1), ``1`` down (row + 1), ``2`` left
  (col - 1), ``3`` right (col + 1), ``4`` stay;
* actions come in runs: an action is drawn uniformly from the five and repeated
  ``1 + Poisson(repeat_rate)`` times (the thesis repeats it "a Poisson-distributed number of
  times" to favour exploration without giving the rate; ``repeat_rate = 3`` is ours: mean
  run length 4); the next run draws its action afresh (it may be the same one);
* walls: a move that would leave the grid does nothing (the position is unchanged);
* obstacles (``obstacles=True``, thesis sec. 7.10.1): a square of ``obstacle_size x
  obstacle_size`` grid positions at a uniformly random place that the agent cannot enter (a
  move into it does nothing, as a wall), drawn into the image as a grey (0.5) square of pixels
  ``[3 r0 + 2, 3 (r0 + size - 1) + 6)`` (each blocked position's crop centre +- 2 px), so it is
  visible in the crops around it.

Time convention (thesis sec. 7.3): frame ``x_t`` is what the agent sees *after* action
``a_t``: ``p_0`` is uniform over the free positions, ``p_t = move(p_{t-1}, a_t)`` and
``x_t = crop(image, p_t)``; ``actions[:, t]`` is ``a_{t+1}`` and ``positions[:, t]`` is
``p_{t+1}`` (0-based arrays), as the GTM-SM's transition ``s_t = s_{t-1} + M a_t`` reads them.

Images. Every sequence has its own environment: a ``32x32`` patch cut at a uniformly random
offset from one of the two photographs bundled with scikit-learn
(``sklearn.datasets.load_sample_images``: ``china.jpg``, ``flower.jpg``, 427x640, shrunk
4x to 106x160 by default so that a patch holds structure; the thesis uses CelebA faces, which
cannot be bundled). Nothing is downloaded: the files are part of
the installed scikit-learn, and reading them needs Pillow; both are the ``[images]`` extra
(``pip install pyro-seq[images]``), and :func:`image_navigation` raises an
:class:`ImportError` naming it when one is missing. Colour frames are ``(3, 8, 8)`` RGB in
``[0, 1]``; greyscale frames use the luma ``0.299 R + 0.587 G + 0.114 B`` (ITU-R BT.601).

Determinism and cache as in :mod:`~pyro_seq.data.simulators.core`: sequence ``i`` of split
``s`` is drawn from ``numpy.random.default_rng(SeedSequence(seed, spawn_key=(5, s, i)))`` only,
so fewer sequences give a prefix; sets are cached as ``.npz`` files in ``<cache dir>/simulators``
keyed by every parameter and the scikit-learn image files' sizes. Generation is a few numpy
index operations per step (about 0.1 ms per 288-step sequence); it runs in this process with a
tqdm bar.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import numpy as np
import torch

from ...ops.padding import SequenceList
from ...validation import positive_int
from .core import SPLITS, cache_directory, cached_sizes, read_cache, write_cache

__all__ = [
    "ACTIONS",
    "ACTION_MOVES",
    "NAVIGATION_SIZES",
    "NavigationParams",
    "NavigationVideos",
    "crop",
    "image_navigation",
    "load_source_images",
    "move",
    "validate_navigation",
]

#: The five actions of the image navigation environment, by index.
ACTIONS = ("up", "down", "left", "right", "stay")
#: Grid displacement ``(d_row, d_col)`` of each action, indexed as :data:`ACTIONS`.
ACTION_MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1], [0, 0]], dtype=np.int64)
#: Default number of sequences per split, our choice (the thesis draws them procedurally).
NAVIGATION_SIZES = {"train": 1000, "valid": 200, "test": 200}
_CODE = 5  # seeding code, after the five environments of core.ENVIRONMENTS
_FORMAT = 2  # bump when the output changes (2: start at the centre by default)
_ARRAYS = ("frames", "actions", "positions", "images", "obstacles")


@dataclass(frozen=True)
class NavigationParams:
    """Parameters of :func:`image_navigation` (defaults: thesis sec. 7.4.1 where it says).

    Attributes:
        image_size: side of the world image in pixels (32).
        crop_size: side of the agent's view (8).
        grid_size: positions per axis (9); the crop's top-left pixel moves by
            ``stride = (image_size - crop_size) / (grid_size - 1)`` (3), which must be an int.
        repeat_rate: mean of the Poisson number of extra repetitions of an action (3.0, ours).
        colour: RGB frames ``(3, 8, 8)`` instead of greyscale ``(8, 8)``.
        obstacles: put one obstacle in each environment (thesis sec. 7.10.1).
        obstacle_size: side of the obstacle in grid positions (2).
        obstacle_value: grey level of the obstacle's pixels (0.5).
        downsample: the photographs are shrunk by this factor (block means) before the
            patches are cut (4, ours: at full size a 32x32 patch of the 427x640 photographs is
            nearly uniform, pixel standard deviation 0.07-0.11; shrunk 4x, 0.14-0.18, so that
            the crops tell positions apart).
        start: where each sequence starts: ``"centre"`` (default: the middle cell, or with an
            obstacle there the free cell nearest to it, first in row-major order among equals)
            or ``"random"`` (a uniformly drawn free cell). The thesis does not say; we start at
            the centre because the GTM-SM's wall network (eq. 7.3) sees the *absolute* state
            ``s_{t-1} + M a_t`` with a fixed ``s_0``: the walls sit at the same states in every
            sequence only when every sequence starts at the same cell (thesis 7.10.1 makes the
            same point for obstacles at random places, which "a prior transition model" cannot
            capture). Both choices draw the same random numbers, so the images and actions are
            the same.
    """

    image_size: int = 32
    crop_size: int = 8
    grid_size: int = 9
    repeat_rate: float = 3.0
    colour: bool = False
    obstacles: bool = False
    obstacle_size: int = 2
    obstacle_value: float = 0.5
    downsample: int = 4
    start: str = "centre"

    @property
    def stride(self) -> int:
        return (self.image_size - self.crop_size) // (self.grid_size - 1)

    def validate(self) -> None:
        for name in ("image_size", "crop_size", "grid_size", "obstacle_size", "downsample"):
            positive_int(name, getattr(self, name))
        if self.grid_size < 2 or self.crop_size > self.image_size:
            raise ValueError("need grid_size >= 2 and crop_size <= image_size")
        if (self.image_size - self.crop_size) % (self.grid_size - 1):
            raise ValueError(
                f"image_size - crop_size = {self.image_size - self.crop_size} is not "
                f"a multiple of grid_size - 1 = {self.grid_size - 1}"
            )
        if not (isinstance(self.repeat_rate, (int, float)) and 0 <= self.repeat_rate < 1e6):
            raise ValueError(f"repeat_rate must be a non-negative number, got {self.repeat_rate!r}")
        if self.obstacles and self.obstacle_size >= self.grid_size:
            raise ValueError("obstacle_size must be smaller than grid_size")
        if not 0.0 <= self.obstacle_value <= 1.0:
            raise ValueError("obstacle_value must be in [0, 1]")
        if self.start not in ("centre", "random"):
            raise ValueError(f"start must be 'centre' or 'random', got {self.start!r}")


@dataclass(frozen=True, eq=False)
class NavigationVideos:
    """Sequences of the image navigation environment and their ground truth.

    Attributes:
        split, seed: where the sequences come from.
        frames: ``float32`` in ``[0, 1]``, ``(N, T, 8, 8)`` (greyscale) or ``(N, T, 3, 8, 8)``
            (colour): ``crop(images[i], positions[i, t])``.
        actions: ``int64`` ``(N, T)`` in ``0..4`` (:data:`ACTIONS`), the action that led to
            each frame.
        positions: ``int64`` ``(N, T, 2)``: the grid position ``(row, col)`` in ``0..8``
            after each action.
        images: ``float32`` ``(N, 32, 32)`` or ``(N, 3, 32, 32)``: each sequence's world
            (with its obstacle drawn in).
        obstacles: ``int64`` ``(N, 2)`` top-left grid position of each obstacle, or None.
        params: the :class:`NavigationParams`.
    """

    split: str
    seed: int
    frames: torch.Tensor
    actions: torch.Tensor
    positions: torch.Tensor
    images: torch.Tensor
    obstacles: Optional[torch.Tensor]
    params: NavigationParams

    name = "image_navigation"

    def __len__(self) -> int:
        return self.frames.shape[0]

    @property
    def num_steps(self) -> int:
        return self.frames.shape[1]

    @property
    def frame_shape(self) -> Tuple[int, ...]:
        return tuple(self.frames.shape[2:])

    def one_hot_actions(self) -> torch.Tensor:
        """``float32`` ``(N, T, 5)``: the actions one-hot, as ``inputs=`` of the GTM-SM."""
        return torch.nn.functional.one_hot(self.actions, len(ACTIONS)).float()

    def as_sequences(self, pack_actions: bool = False) -> List[torch.Tensor]:
        """The videos as the package's models take them: a :class:`~pyro_seq.data.SequenceList`
        of ``N`` flattened frames ``(T, F)`` (``F = 64`` or ``192``) carrying the one-hot
        actions ``(T, 5)`` as known inputs (``inputs=`` of :class:`~pyro_seq.models.GTMSM` and
        of any model with ``input_dim = 5``); with ``pack_actions=True`` (a compatibility path,
        for a GTM-SM built with ``pack_actions=True``) a plain list of ``(T, F + 5)``: each
        frame followed by its one-hot action."""
        x = self.frames.flatten(2)
        if pack_actions:
            return list(torch.cat([x, self.one_hot_actions()], -1).unbind(0))
        return SequenceList(x.unbind(0), self.one_hot_actions().unbind(0))

    def subset(self, index) -> "NavigationVideos":
        """The sequences ``index`` (int, slice, list or tensor) as a new object."""
        if isinstance(index, int):
            index = [index]
        return dataclasses.replace(
            self,
            frames=self.frames[index],
            actions=self.actions[index],
            positions=self.positions[index],
            images=self.images[index],
            obstacles=None if self.obstacles is None else self.obstacles[index],
        )


# ---------------------------------------------------------------------------- the dynamics


def move(position, action, grid_size: int = 9, blocked=None):
    """The position after ``action``: ``position + ACTION_MOVES[action]`` unless that leaves the
    grid or enters a blocked cell (then ``position``, unchanged).

    :param position: ``(row, col)`` ints.
    :param int action: ``0..4``.
    :param blocked: bool ``(grid_size, grid_size)`` array of cells the agent cannot enter, or None.
    :returns: ``(row, col)`` as a tuple of ints.
    """
    r, c = (
        int(position[0]) + int(ACTION_MOVES[action, 0]),
        int(position[1]) + int(ACTION_MOVES[action, 1]),
    )
    if not (0 <= r < grid_size and 0 <= c < grid_size):
        return int(position[0]), int(position[1])
    if blocked is not None and blocked[r, c]:
        return int(position[0]), int(position[1])
    return r, c


def crop(image, position, params: NavigationParams = NavigationParams()):
    """The agent's view: ``image[..., 3 r : 3 r + 8, 3 c : 3 c + 8]`` (numpy or torch)."""
    s, k = params.stride, params.crop_size
    r, c = int(position[0]) * s, int(position[1]) * s
    return image[..., r : r + k, c : c + k]


def action_runs(
    rng: np.random.Generator, num_steps: int, repeat_rate: float, num_actions: int = len(ACTIONS)
):
    """Actions in runs: a uniform action repeated ``1 + Poisson(repeat_rate)`` times, runs
    until ``num_steps`` actions (the last run cut).

    :returns: ``(actions, lengths)``: int64 ``(num_steps,)`` and the drawn run lengths (the last
        one before it was cut).
    """
    actions, lengths, total = [], [], 0
    while total < num_steps:
        a = int(rng.integers(num_actions))
        n = 1 + int(rng.poisson(repeat_rate))
        actions.append(np.full(n, a, dtype=np.int64))
        lengths.append(n)
        total += n
    return np.concatenate(actions)[:num_steps], np.array(lengths, dtype=np.int64)


@functools.lru_cache(maxsize=4)
def load_source_images(colour: bool, downsample: int = 1) -> Tuple[np.ndarray, ...]:
    """The photographs of ``sklearn.datasets.load_sample_images`` as float32 in ``[0, 1]``:
    ``(3, H, W)`` RGB (``colour=True``) or ``(H, W)`` luma, shrunk by ``downsample`` (means of
    ``downsample x downsample`` blocks, the remainder rows and columns dropped); read once per
    process (cached, read-only arrays).

    :raises ImportError: scikit-learn or Pillow missing (``pip install pyro-seq[images]``).
    """
    try:
        import PIL  # noqa: F401  (sklearn's reader of the bundled jpg files)
        from sklearn.datasets import load_sample_images
    except ImportError as e:
        raise ImportError(
            f"image_navigation reads the photographs bundled with scikit-learn and "
            f"needs scikit-learn and Pillow ({e}); install them with "
            f"pip install pyro-seq[images]"
        ) from None
    out = []
    for img in load_sample_images().images:
        rgb = np.asarray(img, dtype=np.float32) / 255.0  # (H, W, 3)
        f = downsample
        H, W = rgb.shape[0] // f * f, rgb.shape[1] // f * f
        rgb = rgb[:H, :W].reshape(H // f, f, W // f, f, 3).mean((1, 3), dtype=np.float32)
        if colour:
            out.append(np.ascontiguousarray(rgb.transpose(2, 0, 1)))
        else:
            out.append(rgb @ np.array([0.299, 0.587, 0.114], dtype=np.float32))
    for a in out:
        a.setflags(write=False)  # cached and shared between calls
    return tuple(out)


def _sources_fingerprint(sources) -> List[List[int]]:
    return [list(s.shape) for s in sources]


def navigation_sequence(
    params: NavigationParams, sources, num_steps: int, seed: int, split: str, index: int
):
    """Sequence ``index`` of a set, exactly as in every set it belongs to (module docstring).

    :returns: dict of numpy arrays ``frames (T, [3,] 8, 8)``, ``actions (T,)``,
        ``positions (T, 2)``, ``image ([3,] 32, 32)``, ``obstacle (2,)`` (``[-1, -1]`` without).
    """
    rng = np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(_CODE, SPLITS.index(split), index))
    )
    src = sources[int(rng.integers(len(sources)))]
    H, W = src.shape[-2:]
    S = params.image_size
    top, left = int(rng.integers(H - S + 1)), int(rng.integers(W - S + 1))
    image = src[..., top : top + S, left : left + S].copy()
    G = params.grid_size
    blocked = np.zeros((G, G), dtype=bool)
    obstacle = np.array([-1, -1], dtype=np.int64)
    if params.obstacles:
        k = params.obstacle_size
        r0, c0 = int(rng.integers(G - k + 1)), int(rng.integers(G - k + 1))
        blocked[r0 : r0 + k, c0 : c0 + k] = True
        st = params.stride
        lo_r, hi_r = st * r0 + 2, st * (r0 + k - 1) + 6
        lo_c, hi_c = st * c0 + 2, st * (c0 + k - 1) + 6
        image[..., lo_r:hi_r, lo_c:hi_c] = params.obstacle_value
        obstacle = np.array([r0, c0], dtype=np.int64)
    free = np.argwhere(~blocked)  # row-major
    pos = tuple(int(v) for v in free[int(rng.integers(len(free)))])
    if params.start == "centre":  # the same draws as "random", then the centre-most free cell
        distance = np.abs(free - (G // 2)).sum(-1)
        pos = tuple(int(v) for v in free[int(np.argmin(distance))])
    actions, _ = action_runs(rng, num_steps, params.repeat_rate)
    positions = np.empty((num_steps, 2), dtype=np.int64)
    frames = np.empty((num_steps,) + image.shape[:-2] + (params.crop_size,) * 2, dtype=np.float32)
    for t in range(num_steps):
        pos = move(pos, actions[t], G, blocked)
        positions[t] = pos
        frames[t] = crop(image, pos, params)
    return {
        "frames": frames,
        "actions": actions,
        "positions": positions,
        "image": image,
        "obstacle": obstacle,
    }


def validate_navigation(
    arrays, num_sequences: int, num_steps: int, params: NavigationParams
) -> Optional[str]:
    """What is wrong with a set of navigation arrays, or None. Checks shapes, value ranges,
    that positions move by at most one cell per step and never enter an obstacle, and that
    every frame is the crop of its image at its position."""
    frame_shape = ((3,) if params.colour else ()) + (params.crop_size,) * 2
    frames = arrays.get("frames")
    if (
        frames is None
        or tuple(frames.shape[1:]) != (num_steps,) + frame_shape
        or frames.shape[0] < num_sequences
    ):
        return f"frames of shape {getattr(frames, 'shape', None)}"
    n = frames.shape[0]
    actions, positions = arrays.get("actions"), arrays.get("positions")
    if (
        actions is None
        or tuple(actions.shape) != (n, num_steps)
        or actions.min() < 0
        or actions.max() >= len(ACTIONS)
    ):
        return "bad actions"
    if (
        positions is None
        or tuple(positions.shape) != (n, num_steps, 2)
        or positions.min() < 0
        or positions.max() >= params.grid_size
    ):
        return "bad positions"
    if np.abs(np.diff(positions, axis=1)).sum(-1).max(initial=0) > 1:
        return "a position jumps by more than one cell"
    if not np.isfinite(frames).all() or frames.min() < 0 or frames.max() > 1:
        return "frames outside [0, 1]"
    images = arrays.get("images")
    if images is None or images.shape[0] != n:
        return "bad images"
    st, k = params.stride, params.crop_size
    for i in range(min(n, 4)):  # spot check: frames are crops of their image
        for t in (0, num_steps - 1):
            r, c = positions[i, t] * st
            if not np.array_equal(frames[i, t], images[i][..., r : r + k, c : c + k]):
                return "a frame is not the crop of its image"
    return None


def image_navigation(
    num_sequences: Optional[int] = None,
    num_steps: int = 288,
    seed: int = 0,
    obstacles: bool = False,
    colour: bool = False,
    *,
    split: str = "train",
    cache: Union[bool, str, os.PathLike] = True,
    progress: bool = True,
    **overrides,
) -> NavigationVideos:
    """Sequences of the image navigation environment (thesis sec. 7.4.1; module docstring).

    Args:
        num_sequences: how many (default :data:`NAVIGATION_SIZES` ``[split]``).
        num_steps: steps per sequence; default 288 = 256 memorisation + 32 prediction steps,
            the thesis' training sequences (testing uses 512).
        seed: a non-negative integer; sequence ``i`` depends only on it, the split, ``i`` and
            the parameters.
        obstacles: add an obstacle to every environment (thesis sec. 7.10.1).
        colour: RGB frames ``(3, 8, 8)`` instead of greyscale ``(8, 8)``.
        split: ``"train"``, ``"valid"`` or ``"test"`` (independent streams).
        cache: True (the package's cache directory), False, or a directory.
        progress: a tqdm bar while generating.
        **overrides: other fields of :class:`NavigationParams` (e.g. ``repeat_rate=1.0``).

    Returns:
        a :class:`NavigationVideos`.

    Raises:
        ImportError: scikit-learn or Pillow missing (``pip install pyro-seq[images]``).
        ValueError: a bad count, seed, split or parameter.
    """
    from pyro_seq.progress import progress_bar as tqdm

    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    n = positive_int(
        "num_sequences", NAVIGATION_SIZES[split] if num_sequences is None else num_sequences
    )
    num_steps = positive_int("num_steps", num_steps)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    for name, flag in (("obstacles", obstacles), ("colour", colour)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    try:
        params = NavigationParams(colour=colour, obstacles=obstacles, **overrides)
    except TypeError as e:
        raise ValueError(f"unknown parameter for image_navigation: {e}") from None
    params.validate()
    sources = load_source_images(colour, params.downsample)
    config = json.loads(
        json.dumps(
            {
                "env": "image_navigation",
                "format": _FORMAT,
                "num_steps": num_steps,
                "params": dataclasses.asdict(params),
                "sources": _sources_fingerprint(sources),
            }
        )
    )
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    stem = f"image_navigation-{split}-T{num_steps}-seed{seed}-{digest}-v{_FORMAT}"

    def check(arrays, count=n):
        return validate_navigation(arrays, count, num_steps, params)

    directory = cache_directory(cache)
    arrays = None
    if directory is not None:
        sizes = cached_sizes(directory, stem)
        for size in [s for s in sizes if s >= n] + [s for s in reversed(sizes) if s < n]:
            found = read_cache(
                directory / f"{stem}-N{size}.npz",
                config,
                lambda a, size=size: check(a, min(size, n)),
                names=_ARRAYS,
            )
            if found is not None and found["frames"].shape[0] == size:
                arrays = found
                break
    have = 0 if arrays is None else arrays["frames"].shape[0]
    if have < n:
        seqs = []
        for i in tqdm(
            range(have, n),
            desc=f"simulating image_navigation ({split})",
            unit="seq",
            disable=not progress,
        ):
            seqs.append(navigation_sequence(params, sources, num_steps, seed, split, i))
        new = {
            "frames": np.stack([s["frames"] for s in seqs]),
            "actions": np.stack([s["actions"] for s in seqs]),
            "positions": np.stack([s["positions"] for s in seqs]),
            "images": np.stack([s["image"] for s in seqs]),
            "obstacles": np.stack([s["obstacle"] for s in seqs]),
        }
        arrays = new if arrays is None else {k: np.concatenate([arrays[k], new[k]]) for k in new}
        problem = check(arrays)
        if problem is not None:
            raise RuntimeError(f"simulated image_navigation sequences failed validation: {problem}")
        if directory is not None:
            write_cache(directory / f"{stem}-N{n}.npz", arrays, config)
    assert arrays is not None  # found in the cache, or generated above (n >= 1)
    arrays = {k: v[:n] for k, v in arrays.items()}
    return NavigationVideos(
        split=split,
        seed=seed,
        frames=torch.from_numpy(np.ascontiguousarray(arrays["frames"], dtype=np.float32)),
        actions=torch.from_numpy(np.ascontiguousarray(arrays["actions"], dtype=np.int64)),
        positions=torch.from_numpy(np.ascontiguousarray(arrays["positions"], dtype=np.int64)),
        images=torch.from_numpy(np.ascontiguousarray(arrays["images"], dtype=np.float32)),
        obstacles=(
            torch.from_numpy(np.ascontiguousarray(arrays["obstacles"], dtype=np.int64))
            if obstacles
            else None
        ),
        params=params,
    )
