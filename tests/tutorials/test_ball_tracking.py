"""Run tutorials/ball_tracking.py in its short mode and check its figures and numbers."""

from tests.tutorials import tutorial_output_fixture

FIGURES = [
    "fig3_3_filter_smoother.png",
    "fig3_4_missing_data.png",
    "fig3_5_em.png",
    "fig3_7_air_resistance_lgssm.png",
    "fig3_8_air_resistance_ukf.png",
]


tutorial_output = tutorial_output_fixture("ball_tracking", timeout=300)


def test_figures_written(tutorial_output):
    out, metrics = tutorial_output
    assert metrics["smoke"] is True
    for name in FIGURES:
        path = out / name
        assert path.exists(), name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_filter_and_smoother_reduce_the_noise(tutorial_output):
    """Fig. 3.3: smoothed < filtered < raw observations (the filter after the transient caused
    by the deliberately poor initial state, thesis Sec. 3.4.1)."""
    m = tutorial_output[1]["fig3_3"]
    assert m["rmse_smoothed"] < m["rmse_observations"]
    assert (
        m["rmse_smoothed_second_half"]
        < m["rmse_filtered_second_half"]
        < m["rmse_observations_second_half"]
    )


def test_missing_section_is_imputed_by_the_smoother(tutorial_output):
    """Fig. 3.4: in the gap the smoother stays below the observation noise level, the filter
    drifts away."""
    m = tutorial_output[1]["fig3_4"]
    noise = tutorial_output[1]["fig3_3"]["rmse_observations"]
    assert m["rmse_smoothed_gap"] < noise < m["rmse_filtered_gap"]


def test_em_increases_the_likelihood(tutorial_output):
    """Fig. 3.5: the log-likelihood never decreases and learning the initial state helps."""
    m = tutorial_output[1]["fig3_5"]
    lls = m["log_likelihoods"]
    assert len(lls) == 4  # 3 EM iterations in smoke mode, plus the initial value
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(lls, lls[1:]))
    assert lls[-1] > lls[0] + 100
    assert (
        abs(m["learned_initial_loc"][1] - 60.0) < 1.0
        and abs(m["learned_initial_loc"][3] - 60.0) < 1.0
    )
    assert m["rmse_filtered"] < tutorial_output[1]["fig3_3"]["rmse_filtered"]


def test_ukf_follows_the_ball_in_air(tutorial_output):
    """Figs. 3.7-3.8: with air resistance the LGSSM loses the ball, the UKF with the true
    non-linear dynamics tracks it better than the raw observations."""
    m = tutorial_output[1]["fig3_7_3_8"]
    assert m["rmse_ukf_smoothed"] < m["rmse_observations"] < m["rmse_lgssm_smoothed"]
    assert m["log_likelihood_ukf"] > m["log_likelihood_lgssm"]
