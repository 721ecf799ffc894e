"""Binary rasterisation of the simulated scenes: filled discs and capsules, no anti-aliasing.

Image coordinates (shared by every simulator of :mod:`pyro_seq.data.simulators`): a frame of
``H x W`` pixels covers the rectangle ``[0, W] x [0, H]``; ``x`` runs along the columns (to the
right) and ``y`` along the rows (downwards, as in the array). Pixel ``(i, j)`` (row ``i``,
column ``j``) is the unit square ``[j, j + 1] x [i, i + 1]`` and its centre is
``(j + 1/2, i + 1/2)``. One simulator unit is one pixel.

A capsule is the set of points within distance ``r`` of a segment ``[a, b]`` (a disc when
``a = b``). A pixel is on (1) exactly when its centre lies in one of the capsules::

    on(i, j) = 1  iff  min_k dist((j + 1/2, i + 1/2), [a_k, b_k]) <= r_k               (1)

so a disc of radius 3 is 28 to 32 pixels, and the centroid of its pixel centres is within
half a pixel of the disc's centre.
"""

from __future__ import annotations

from typing import Iterable, Tuple

import numpy as np

__all__ = ["render_capsules"]

#: ``(ax, ay, bx, by, r)``: the segment from ``(ax, ay)`` to ``(bx, by)`` thickened by ``r``.
Capsule = Tuple[float, float, float, float, float]


def render_capsules(height: int, width: int, capsules: Iterable[Capsule]) -> np.ndarray:
    """Rasterise capsules into a binary image by rule (1) of the module docstring.

    Args:
        height, width: the frame size in pixels.
        capsules: ``(ax, ay, bx, by, r)`` tuples in image coordinates (pixels).

    Returns:
        ``uint8`` array ``(height, width)`` of 0/1.
    """
    py = np.arange(height, dtype=np.float64)[:, None] + 0.5
    px = np.arange(width, dtype=np.float64)[None, :] + 0.5
    image = np.zeros((height, width), dtype=bool)
    for ax, ay, bx, by, r in capsules:
        dx, dy = bx - ax, by - ay
        length2 = dx * dx + dy * dy
        s: np.ndarray | float
        if length2 > 0.0:
            s = np.clip(((px - ax) * dx + (py - ay) * dy) / length2, 0.0, 1.0)
        else:
            s = 0.0
        ex, ey = px - (ax + s * dx), py - (ay + s * dy)
        image |= ex * ex + ey * ey <= r * r
    return image.astype(np.uint8)
