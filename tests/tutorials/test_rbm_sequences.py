"""Run tutorials/rbm_sequences.py in its short mode and check what it produces."""

import math

from tests.tutorials import tutorial_output_fixture

tutorial_output = tutorial_output_fixture("rbm_sequences")


def test_rtrbm_likelihood_and_samples(tutorial_output):
    out, metrics = tutorial_output
    r = metrics["rtrbm"]
    # 88 binary units: a normalised log-likelihood per step lies in [88 log(1/2) - slack, 0]
    assert -88 * math.log(2) - 5 < r["ais_loglik_per_step"] < 0 and r["stderr_per_step"] >= 0
    assert all(math.isfinite(m) and 0 <= m <= 1 for m in r["monitor_per_epoch"])
    for i in range(2):
        assert (out / f"rtrbm_sample_{i}.png").stat().st_size > 1000
        assert (out / f"rtrbm_sample_{i}.mid").read_bytes()[:4] == b"MThd"


def test_cf_curves_and_figure(tutorial_output):
    out, metrics = tutorial_output
    cf = metrics["cf"]
    floor = cf["baselines"]["true 2PL model"]
    assert floor < cf["baselines"]["logistic"] < 0.30103
    for curve in cf["curves"].values():
        assert all(floor < c < 0.35 for c in curve)
    assert (out / "cf_cbd.png").stat().st_size > 1000
