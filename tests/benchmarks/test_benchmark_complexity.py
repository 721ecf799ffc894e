"""``benchmarks/speed/complexity.py``: the log-log slope fit against synthetic power laws with a
known exponent, and the smoke run end to end (every curve in the JSON, its slope the fit of its
own points, the figures written; never timing values)."""

import json
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path[:0] = [str(BENCHMARKS / "speed"), str(BENCHMARKS)]

import complexity  # noqa: E402

CURVES = {
    ("kalman_T", "log_prob B=1"),
    ("kalman_T", "log_prob B=16"),
    ("kalman_T", "smooth B=1"),
    ("kalman_T", "smooth B=16"),
    ("kalman_T", "log_prob_grad B=16"),
    ("kalman_state", "log_prob B=16"),
    ("kalman_state", "smooth B=16"),
    ("kalman_memory", "log_prob B=16"),
    ("kalman_memory", "smooth B=16"),
    ("train_T", "DMM"),
    ("train_T", "SRNN"),
    ("train_batch", "DMM"),
    ("train_batch", "SRNN"),
    ("particles", "IWAE SRNN"),
    ("particles", "FIVO SRNN"),
}


@pytest.mark.parametrize("exponent", [1.0, 3.0, 0.5, -0.75])
def test_fit_slope_recovers_a_known_power_law(exponent):
    xs = [2.0, 7.0, 31.0, 100.0, 1e4, 1e5]
    ys = [0.003 * x**exponent for x in xs]
    slope, intercept = complexity.fit_slope(xs, ys)
    assert abs(slope - exponent) < 1e-9
    assert abs(intercept - math.log(0.003)) < 1e-9


def test_fit_slope_is_least_squares_in_log_log():
    # log y = 1, 0, 3 at log x = 0, 1, 2 (x = 1, e, e^2): slope of the least-squares line is
    # sum (lx - 1)(ly - 4/3) / sum (lx - 1)^2 = ((-1)(-1/3) + (1)(5/3)) / 2 = 1
    xs = [1.0, math.e, math.e**2]
    ys = [math.e, 1.0, math.e**3]
    slope, intercept = complexity.fit_slope(xs, ys)
    assert abs(slope - 1.0) < 1e-12 and abs(intercept - 1.0 / 3.0) < 1e-12


def test_curve_slope_is_fitted_on_the_upper_half():
    # a fixed overhead of 1 second hides the linear cost at small x: the tail (4 of 7 points,
    # x >= 1000) follows x^1 exactly, the full range does not
    xs = [1, 10, 100, 1000, 1e4, 1e5, 1e6]
    points = [(x, 1.0 if x < 1000 else 1e-3 * x) for x in xs]
    curve = complexity.make_curve("c", "kalman_T", 1.0, "linear", points, [], {})
    assert curve["fit_x_range"] == [1000, 1e6]
    assert abs(curve["slope"] - 1.0) < 1e-9
    assert abs(curve["intercept"] - math.log(1e-3)) < 1e-9
    assert curve["slope_all"] < 0.9
    assert abs(curve["slope_end"] - 1.0) < 1e-9
    flat_end = complexity.make_curve("c", "g", 1.0, "linear", points[:4], [], {})
    assert flat_end["slope_end"] == 0.0  # x = 100 and 1000 both take 1 s
    assert complexity.tail([(3, 1), (1, 1)]) == [(1, 1), (3, 1)]  # two points: both


@pytest.mark.parametrize(
    "xs, ys", [([1.0], [1.0]), ([1.0, 2.0], [1.0, 0.0]), ([0.0, 2.0], [1.0, 1.0]), ([2, 2], [1, 3])]
)
def test_fit_slope_refuses_what_it_cannot_fit(xs, ys):
    with pytest.raises(ValueError, match="fit_slope"):
        complexity.fit_slope(xs, ys)


def test_smoke_writes_every_curve_and_figure(tmp_path):
    out = tmp_path / "cx.json"
    complexity.main(["--smoke", "--output", str(out)])
    result = json.loads(out.read_text())
    assert result["benchmark"] == "complexity" and result["smoke"] is True
    assert {(c["group"], c["name"]) for c in result["curves"]} == CURVES
    for c in result["curves"]:
        points = [tuple(p) for p in c["points"]]
        assert len(points) >= 2 and all(y > 0 for _, y in points)
        fitted = complexity.tail(points)
        slope, _ = complexity.fit_slope(*zip(*fitted))
        assert c["slope"] == pytest.approx(slope, abs=1e-12)
        assert c["fit_x_range"] == [fitted[0][0], fitted[-1][0]]
        assert c["slope_end"] == pytest.approx(
            complexity.fit_slope(*zip(*sorted(points)[-2:]))[0], abs=1e-12
        )
        expected = 3.0 if c["group"] == "kalman_state" else 1.0
        assert c["expected_slope"] == expected
        if c["group"] not in ("kalman_memory",):
            assert len(c["samples"]) == len(points)
            assert all(len(s) == result["settings"]["repeats"] == 1 for s in c["samples"])
        if c["group"] == "train_batch":
            assert c["epoch_slope"] == pytest.approx(c["slope"] - 1)
    assert set(result["figures"]) == set(complexity.GROUPS)
    for name in result["figures"].values():
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"start", "end"} <= set(result["load_average"])
    assert {"cpu", "cores", "torch_threads"} <= set(result["machine"])
    assert result["settings"]["threads"] == 1
    assert len(result["settings"]["memory_method"]) == 1


def test_smoke_needs_an_output():
    with pytest.raises(SystemExit):
        complexity.main(["--smoke"])
