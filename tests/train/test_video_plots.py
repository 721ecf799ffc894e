"""The video figures of pyro_seq.train.plots: the trajectory image and the PNG it is drawn in."""

import pytest
import torch

from pyro_seq.data.simulators import pendulum
from pyro_seq.train.plots import plot_video, video_trajectory


def test_trajectory_image_marks_when_each_pixel_was_last_on():
    T = 4
    frames = torch.zeros(T, 3, 5)
    for t in range(T):
        frames[t, 1, t] = 1.0  # a dot moving right one pixel per frame
    frames[3, 1, 0] = 1.0  # ... and back at the start in the last frame
    image = video_trajectory(frames)
    assert image.shape == (3, 5)
    assert torch.allclose(image[1], torch.tensor([4, 2, 3, 4, 0]) / 4.0)
    assert image[0].abs().sum() == 0 and image[2].abs().sum() == 0
    with pytest.raises(ValueError, match=r"\(T, H, W\)"):
        video_trajectory(frames[0])


def test_plot_video_writes_a_png(tmp_path):
    v = pendulum(1, num_steps=6, cache=False, progress=False, num_workers=1)
    path = tmp_path / "video.png"
    plot_video(v.frames[0], path, positions=v.positions[0], title="pendulum", max_frames=4)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plain = tmp_path / "plain.png"
    plot_video(v.frames[0], plain)
    assert plain.stat().st_size > 1000
