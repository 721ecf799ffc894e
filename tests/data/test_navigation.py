"""pyro_seq.data.simulators.image_navigation (thesis sec. 7.4.1, 7.10.1): determinism, crops,
walls, obstacles, action statistics, cache, and the missing-extra error."""

import sys

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")
pytest.importorskip("PIL")

from pyro_seq.data.simulators import (  # noqa: E402
    ACTIONS,
    image_navigation,
    navigation,  # noqa: E402
)
from pyro_seq.data.simulators.navigation import ACTION_MOVES, action_runs  # noqa: E402

QUIET = dict(cache=False, progress=False)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYRO_SEQ_CACHE", str(tmp_path / "cache"))


def test_shapes_types_and_ranges():
    v = image_navigation(3, 40, **QUIET)
    assert v.frames.shape == (3, 40, 8, 8) and v.frames.dtype == torch.float32
    assert v.actions.shape == (3, 40) and v.actions.dtype == torch.int64
    assert v.positions.shape == (3, 40, 2) and v.positions.dtype == torch.int64
    assert v.images.shape == (3, 32, 32) and v.obstacles is None
    assert 0 <= int(v.actions.min()) and int(v.actions.max()) <= 4
    assert 0 <= int(v.positions.min()) and int(v.positions.max()) <= 8
    assert 0.0 <= float(v.frames.min()) and float(v.frames.max()) <= 1.0
    seqs = v.as_sequences(pack_actions=True)  # the compatibility path
    assert len(seqs) == 3 and seqs[0].shape == (40, 64 + 5)
    assert torch.equal(seqs[1][:, 64:].argmax(-1), v.actions[1])
    assert torch.equal(seqs[1][:, 64:].sum(-1), torch.ones(40))
    c = image_navigation(2, 5, colour=True, **QUIET)
    assert c.frames.shape == (2, 5, 3, 8, 8) and c.images.shape == (2, 3, 32, 32)
    framed = c.as_sequences()  # frames, with the actions as known inputs
    assert framed[0].shape == (5, 192) and framed.input_dim == 5
    assert torch.equal(framed.inputs[1].argmax(-1), c.actions[1])
    assert torch.equal(framed.inputs[1].sum(-1), torch.ones(5))


def test_deterministic_prefix_and_seed_dependence():
    a = image_navigation(4, 30, seed=3, **QUIET)
    b = image_navigation(4, 30, seed=3, **QUIET)
    p = image_navigation(2, 30, seed=3, **QUIET)
    other = image_navigation(4, 30, seed=4, **QUIET)
    for key in ("frames", "actions", "positions", "images"):
        assert torch.equal(getattr(a, key), getattr(b, key))
        assert torch.equal(getattr(a, key)[:2], getattr(p, key))
    assert not torch.equal(a.actions, other.actions)
    valid = image_navigation(4, 30, seed=3, split="valid", **QUIET)
    assert not torch.equal(a.images, valid.images)
    # every sequence has its own environment
    assert len({tuple(img.flatten()[:64].tolist()) for img in a.images}) == 4


def test_grey_frames_are_the_luma_of_the_colour_frames():
    grey = image_navigation(3, 20, seed=1, **QUIET)
    rgb = image_navigation(3, 20, seed=1, colour=True, **QUIET)
    assert torch.equal(grey.positions, rgb.positions)
    luma = torch.einsum("c,ntchw->nthw", torch.tensor([0.299, 0.587, 0.114]), rgb.frames)
    assert torch.allclose(grey.frames, luma, atol=1e-6)


@pytest.mark.parametrize("colour", [False, True])
def test_every_frame_is_the_crop_of_its_image_at_its_position(colour):
    v = image_navigation(3, 60, seed=2, colour=colour, **QUIET)
    for i in range(3):
        for t in range(60):
            r, c = v.positions[i, t].tolist()
            assert torch.equal(
                v.frames[i, t], v.images[i][..., 3 * r : 3 * r + 8, 3 * c : 3 * c + 8]
            )


def _expected_step(prev, action, blocked=None):
    """Brute-force rule: the move of ACTIONS[action] unless it leaves the grid or is blocked."""
    name = ACTIONS[action]
    r, c = prev
    r, c = {
        "up": (r - 1, c),
        "down": (r + 1, c),
        "left": (r, c - 1),
        "right": (r, c + 1),
        "stay": (r, c),
    }[name]
    if not (0 <= r <= 8 and 0 <= c <= 8) or (blocked is not None and (r, c) in blocked):
        return prev
    return (r, c)


def test_walls_the_agent_never_leaves_the_grid_and_wall_moves_do_nothing():
    v = image_navigation(20, 200, seed=5, **QUIET)
    hits = 0
    for i in range(20):
        pos = v.positions[i].tolist()
        for t in range(1, 200):
            expected = _expected_step(tuple(pos[t - 1]), int(v.actions[i, t]))
            assert tuple(pos[t]) == expected
            moved = ACTION_MOVES[int(v.actions[i, t])]
            target = np.array(pos[t - 1]) + moved
            if moved.any() and ((target < 0) | (target > 8)).any():
                hits += 1
                assert pos[t] == pos[t - 1]
    assert hits > 50  # the walls are really exercised


def test_obstacles_are_never_entered_and_drawn_grey():
    v = image_navigation(20, 200, seed=6, obstacles=True, **QUIET)
    assert v.obstacles.shape == (20, 2)
    bumps = 0
    for i in range(20):
        r0, c0 = v.obstacles[i].tolist()
        assert 0 <= r0 <= 7 and 0 <= c0 <= 7
        blocked = {(r0 + a, c0 + b) for a in range(2) for b in range(2)}
        pos = [tuple(p) for p in v.positions[i].tolist()]
        assert not blocked & set(pos)
        for t in range(1, 200):
            assert pos[t] == _expected_step(pos[t - 1], int(v.actions[i, t]), blocked)
            target = tuple(np.array(pos[t - 1]) + ACTION_MOVES[int(v.actions[i, t])])
            bumps += target in blocked
        # the grey square: pixels [3 r0 + 2, 3 (r0 + 1) + 6) in both directions
        square = v.images[i][3 * r0 + 2 : 3 * r0 + 9, 3 * c0 + 2 : 3 * c0 + 9]
        assert square.shape == (7, 7) and torch.all(square == 0.5)
    assert bumps > 5


def test_action_runs_statistics():
    """Runs: action uniform on 5, length 1 + Poisson(rate). Over n runs the mean length has
    standard error sqrt(rate / n) and each action frequency sqrt(0.2 * 0.8 / n); 4.5 SE."""
    rng = np.random.default_rng(0)
    rate = 3.0
    actions, lengths = action_runs(rng, 200_000, rate)
    n = len(lengths)
    assert abs(lengths.mean() - (1 + rate)) < 4.5 * np.sqrt(rate / n)
    assert abs(lengths.var() - rate) < 4.5 * np.sqrt(
        2 * rate**2 / n + rate / n
    )  # Var of Poisson var
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    run_actions = actions[starts]
    freq = np.bincount(run_actions, minlength=5) / n
    assert np.all(np.abs(freq - 0.2) < 4.5 * np.sqrt(0.16 / n))
    # a run repeats one action: consecutive steps inside a run are equal
    for s, length in list(zip(starts, lengths))[:1000]:
        assert np.all(actions[s : s + length] == actions[s])


def test_action_statistics_of_the_environment():
    """Long-run fraction of each action is 1/5 (renewal-reward), and P(a_{t+1} = a_t) =
    1 - (4/5) / E[L] = 0.8 for rate 3; tolerances: 4.5 SE with the run as the independent unit."""
    v = image_navigation(200, 288, seed=7, **QUIET)
    a = v.actions.numpy()
    freq = np.bincount(a.ravel(), minlength=5) / a.size
    runs = a.size / 4.0  # independent units: about one run per 4 steps
    # ratio estimator over runs: Var = 0.16 E[L^2] / (E[L]^2 n) with E[L^2] = 3 + 16
    assert np.all(np.abs(freq - 0.2) < 4.5 * np.sqrt(0.16 * 19 / 16 / runs))
    same = (a[:, 1:] == a[:, :-1]).mean()
    assert abs(same - 0.8) < 4.5 * np.sqrt(0.16 / runs)


def test_cache_reuse_and_prefix(tmp_path, monkeypatch):
    a = image_navigation(5, 20, seed=1, cache=tmp_path, progress=False)
    assert len(list(tmp_path.glob("image_navigation-train-T20-seed1-*-N5.npz"))) == 1

    def boom(*args, **kwargs):
        raise AssertionError("should have been read from the cache")

    monkeypatch.setattr(navigation, "navigation_sequence", boom)
    b = image_navigation(3, 20, seed=1, cache=tmp_path, progress=False)
    assert torch.equal(a.frames[:3], b.frames) and torch.equal(a.actions[:3], b.actions)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_sequences"):
        image_navigation(0, 5, **QUIET)
    with pytest.raises(ValueError, match="seed"):
        image_navigation(1, 5, seed=-1, **QUIET)
    with pytest.raises(ValueError, match="split"):
        image_navigation(1, 5, split="dev", **QUIET)
    with pytest.raises(ValueError, match="unknown parameter"):
        image_navigation(1, 5, speed=3, **QUIET)
    with pytest.raises(ValueError, match="multiple of"):
        image_navigation(1, 5, grid_size=8, **QUIET)
    with pytest.raises(ValueError, match="obstacles"):
        image_navigation(1, 5, obstacles=1, **QUIET)


def test_missing_reader_names_the_extra(monkeypatch):
    navigation.load_source_images.cache_clear()
    monkeypatch.setitem(sys.modules, "PIL", None)
    try:
        with pytest.raises(ImportError, match=r"pyro-seq\[images\]"):
            image_navigation(1, 5, **QUIET)
    finally:
        navigation.load_source_images.cache_clear()


def test_sources_are_block_means_of_the_photographs():
    full = navigation.load_source_images(False, 1)
    small = navigation.load_source_images(False, 4)
    for f, s in zip(full, small):
        assert s.shape == (f.shape[0] // 4, f.shape[1] // 4)
        i, j = 7, 11
        assert np.isclose(s[i, j], f[4 * i : 4 * i + 4, 4 * j : 4 * j + 4].mean(), atol=1e-6)
    assert all(s.dtype == np.float32 and 0 <= s.min() and s.max() <= 1 for s in small)


def test_start_at_the_centre_or_at_random():
    """Default start: the centre cell (4, 4), so positions[0] is the centre moved by the first
    action; start="random" draws the same images and actions from another start cell."""
    centre = image_navigation(12, 30, **QUIET)
    rand = image_navigation(12, 30, start="random", **QUIET)
    assert torch.equal(centre.images, rand.images) and torch.equal(centre.actions, rand.actions)
    first = torch.tensor(4) + torch.from_numpy(ACTION_MOVES)[centre.actions[:, 0]]
    assert torch.equal(centre.positions[:, 0], first)
    starts = rand.positions[:, 0] - torch.from_numpy(ACTION_MOVES)[rand.actions[:, 0]]
    assert not bool((starts == 4).all())  # some random starts are elsewhere
    # with an obstacle over the centre, the start is the nearest free cell (never blocked)
    obst = image_navigation(30, 5, obstacles=True, **QUIET)
    for n in range(30):
        r0, c0 = obst.obstacles[n].tolist()
        if r0 <= 4 < r0 + 2 and c0 <= 4 < c0 + 2:
            p = obst.positions[n, 0]
            assert not (r0 <= p[0] < r0 + 2 and c0 <= p[1] < c0 + 2)
    with pytest.raises(ValueError, match="start must be 'centre' or 'random'"):
        image_navigation(2, 5, start="corner", **QUIET)
