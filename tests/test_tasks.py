"""Imputation, denoising and forecasting against the exact answers of a linear-Gaussian model.

On :class:`LinearGaussianSequenceModel` the conditional means are known exactly from the Kalman
smoother / predictor: E[x_t | x_obs] = C E[z_t | x_obs]. Monte Carlo estimates must match them
within 5 standard errors (estimated from the draws themselves, stated next to each assertion).
"""

import math

import pytest
import torch

from pyro_seq.models import DMM, LinearGaussianSequenceModel
from pyro_seq.ops import kalman_filter, kalman_smoother
from pyro_seq.tasks import denoise, forecast, impute

pytestmark = pytest.mark.usefixtures("float64")  # tests/conftest.py


def lg_model(guide):
    torch.manual_seed(0)
    A = torch.tensor([[0.9, 0.2], [-0.1, 0.8]])
    C = torch.tensor([[1.0, 0.0], [0.3, 1.0], [0.0, -0.5]])
    return LinearGaussianSequenceModel(
        3, 2, A=A, C=C, Q=0.3 * torch.eye(2), R=0.2 * torch.eye(3), guide=guide
    )


def lg_data(m, T=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    z = torch.zeros(2)
    xs = []
    for _ in range(T):
        z = m.A @ z + torch.linalg.cholesky(m.Q) @ torch.randn(2, generator=g, dtype=torch.float64)
        xs.append(
            m.C @ z + torch.linalg.cholesky(m.R) @ torch.randn(3, generator=g, dtype=torch.float64)
        )
    return torch.stack(xs).unsqueeze(0).detach()  # (1, T, 3)


def kalman_means(m, x, step_observed):
    with torch.no_grad():
        sm = kalman_smoother(
            torch.where(step_observed[..., None], x, torch.zeros_like(x)),
            m.init_loc,
            m.init_cov,
            m.A,
            m.Q,
            m.C,
            m.R,
            mask=step_observed[..., None].expand(x.shape),
        )
        return sm.means @ m.C.T  # (1, T, D)


def test_importance_imputation_converges_to_the_kalman_smoother_mean():
    m = lg_model("prior")
    x = lg_data(m)
    obs = torch.ones(1, 6, dtype=torch.bool)
    obs[0, [2, 3]] = False
    exact = kalman_means(m, x, obs)
    # R independent runs of K particles: the spread of the R estimates gives the standard error
    R, K = 40, 400
    torch.manual_seed(2)
    runs = torch.stack(
        [impute(m, x, obs, method="importance", num_particles=K).probs for _ in range(R)]
    )
    mean, se = runs.mean(0), runs.std(0) / math.sqrt(R)
    missing = ~obs[0]
    err = (mean[0, missing] - exact[0, missing]).abs()
    assert (err <= 5 * se[0, missing] + 1e-12).all(), (err, se[0, missing])
    assert torch.equal(runs[0][0, ~missing], x[0, ~missing])  # observed entries kept


def test_iterative_imputation_with_an_exact_guide_is_a_gibbs_sampler_of_the_missing_values():
    # the exact posterior guide makes the seed's iterative procedure a Gibbs sampler: the
    # running average of E[x_miss | z] converges to E[x_miss | x_obs]
    m = lg_model("smoothing")
    x = lg_data(m)
    obs = torch.ones(1, 6, dtype=torch.bool)
    obs[0, 4] = False
    exact = kalman_means(m, x, obs)
    chains = 200  # independent chains
    xb, ob = x.expand(chains, 6, 3).clone(), obs.expand(chains, 6).clone()
    torch.manual_seed(3)
    res = impute(m, xb, ob, method="iterative", num_iterations=30, burn_in=10)
    est = res.probs[:, 4]  # (chains, D)
    mean, se = est.mean(0), est.std(0) / math.sqrt(chains)
    assert ((mean - exact[0, 4]).abs() <= 5 * se).all(), (mean, exact[0, 4], se)
    assert torch.equal(res.x[:, :4], xb[:, :4])


def test_forecast_in_generation_mode_matches_the_kalman_prediction():
    m = lg_model("smoothing")
    x = lg_data(m, T=5)
    steps, S = 3, 3000
    torch.manual_seed(4)
    res = forecast(m, x, steps, num_samples=S)
    with torch.no_grad():
        f = kalman_filter(x, m.init_loc, m.init_cov, m.A, m.Q, m.C, m.R)
    z = f.means[0, -1]
    for k in range(steps):
        z = m.A @ z
        exact = m.C @ z  # E[x_{T+k+1} | x_{1:T}]
        draws = res.samples[:, 0, k]  # (S, D)
        se = draws.std(0) / math.sqrt(S)
        assert ((draws.mean(0) - exact).abs() <= 5 * se).all(), (k, draws.mean(0), exact, se)
    assert res.samples.shape == (S, 1, steps, 3) and res.log_prob is None


def test_denoise_uses_only_the_past_with_a_filtering_guide_and_thresholds_the_emission():
    torch.manual_seed(5)
    m = DMM(6, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8, inference="filtering")
    g = torch.Generator().manual_seed(6)
    x = (torch.rand(2, 7, 6, generator=g) < 0.3).double()
    x_hat, probs = denoise(m, x)
    assert torch.equal(x_hat, (probs > 0.5).double())
    x2 = x.clone()
    x2[:, 4:] = 1 - x2[:, 4:]  # change the future
    x_hat2, probs2 = denoise(m, x2)
    assert torch.equal(probs[:, :4], probs2[:, :4]) and not torch.equal(probs[:, 4:], probs2[:, 4:])


def test_forecast_scores_a_binary_target_under_the_mixture():
    torch.manual_seed(7)
    m = DMM(6, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8)
    g = torch.Generator().manual_seed(8)
    x = (torch.rand(2, 5, 6, generator=g) < 0.3).double()
    target = (torch.rand(2, 3, 6, generator=g) < 0.3).double()
    res = forecast(m, x, 3, num_samples=4, target=target)
    p = res.means
    per_path = (target * p.log() + (1 - target) * (-p).log1p()).sum(-1)  # (S, B, steps)
    assert torch.allclose(res.log_prob, per_path.exp().mean(0).log(), rtol=1e-10)
    assert set(res.samples.unique().tolist()) <= {0.0, 1.0}


def test_forecast_score_is_finite_when_a_float32_emission_saturates():
    """A note the model is certain of (sigmoid(+-60) is exactly 1 or 0 in float32) that the
    target contradicts scores log(eps), not NaN: the clamp was 1 - 1e-12, which float32 rounds
    to 1, and 0 * log(0) made the whole step NaN (seen on a trained VOSP on JSB Chorales)."""
    torch.manual_seed(7)
    m = DMM(6, z_dim=3, transition_dim=8, emission_dim=8, rnn_dim=8).float()
    out = m.emitter[4]
    with torch.no_grad():
        out.weight[:3].zero_()
        out.bias[0], out.bias[1], out.bias[2] = 60.0, -200.0, 60.0  # surely on, off, on
    x = torch.zeros(1, 5, 6)
    target = torch.zeros(1, 2, 6)
    target[..., 1] = target[..., 2] = 1.0  # notes 0 and 1 contradicted, note 2 confirmed
    res = forecast(m, x, 2, num_samples=3, target=target)
    assert res.means[..., 0].eq(1.0).all() and res.means[..., 1].eq(0.0).all()
    assert torch.isfinite(res.log_prob).all()
    eps = torch.finfo(torch.float32).eps
    p = res.means.double().clamp(eps, 1 - eps)
    per_path = torch.where(target.double() > 0.5, p.log(), (-p).log1p()).sum(-1)
    expected = per_path.exp().mean(0).log()
    assert torch.allclose(res.log_prob.double(), expected, rtol=1e-5)
    assert bool((res.log_prob < 2 * math.log(eps) + 1e-3).all())  # both notes cost log(eps)


def test_bad_arguments():
    m = lg_model("prior")
    x = lg_data(m)
    with pytest.raises(
        ValueError,
        match="linear_gaussian_ssm does not support imputation method gibbs; use one of: iterative, importance",
    ):
        impute(m, x, torch.ones(1, 6, dtype=torch.bool), method="gibbs")
    with pytest.raises(ValueError, match="equal length"):
        forecast(m, x, 2, mask=torch.tensor([[True] * 5 + [False]]))


def test_recovery_figure_counts_the_errors(tmp_path):
    from pyro_seq.train.plots import plot_recovery

    clean = torch.zeros(10, 88)
    clean[:, 40] = 1
    corrupted = clean.clone()
    corrupted[3:5] = math.nan
    recovered = clean.clone()
    recovered[4, 41] = 1
    n = plot_recovery(clean, corrupted, recovered, tmp_path / "r.png")
    assert n == 1 and (tmp_path / "r.png").stat().st_size > 1000


def test_drop_steps_and_bits_per_element():
    from pyro_seq.tasks import bits_per_element, drop_steps

    mask = torch.arange(10) < torch.tensor([10, 6, 9]).unsqueeze(-1)
    obs = drop_steps(mask, 4, generator=torch.Generator().manual_seed(0))
    dropped = ~obs
    assert dropped.sum(-1).tolist() == [4, 4, 4] and not (dropped & ~mask).any()
    for row in dropped:  # one window of consecutive steps
        idx = row.nonzero().flatten()
        assert (idx.diff() == 1).all()
    with pytest.raises(ValueError, match="every sequence longer"):
        drop_steps(mask, 6)
    target = torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert bits_per_element(torch.full((4,), 0.5), target) == pytest.approx(1.0, rel=1e-12)
    p = torch.tensor([0.9, 0.2, 0.6, 0.99])
    expected = -(math.log2(0.9) + math.log2(0.8) + math.log2(0.6) + math.log2(0.99)) / 4
    assert bits_per_element(p, target) == pytest.approx(expected, rel=1e-12)


def test_pixel_error_counts_wrong_pixels_on_missing_frames_only():
    from pyro_seq.tasks import pixel_error

    target = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]])
    probs = torch.tensor([[[0.9, 0.9], [0.2, 0.6], [0.1, 0.7]]])
    missing = torch.tensor([[False, True, True]])[..., None]
    # missing frames 2 and 3: pixels (1,1) wrong (0.2 < .5 for 1), (1,1) right, (0,0) right, (0,1) wrong
    assert pixel_error(probs, target, missing) == pytest.approx(2 / 4)
    assert math.isnan(pixel_error(probs, target, torch.zeros(1, 3, 1, dtype=torch.bool)))


def test_drop_frames_rate_and_kept_prefix():
    from pyro_seq.tasks import drop_frames

    mask = torch.ones(400, 50, dtype=torch.bool)
    mask[:, 40:] = False
    g = torch.Generator().manual_seed(0)
    observed = drop_frames(mask, 0.3, generator=g, keep_first=2)
    assert observed[:, :2].all() and observed[:, 40:].all()
    rate = 1 - observed[:, 2:40].float().mean().item()
    se = math.sqrt(0.3 * 0.7 / (400 * 38))
    assert abs(rate - 0.3) < 5 * se
    with pytest.raises(ValueError):
        drop_frames(mask, 1.0)


def test_impute_dispatches_frame_methods_to_the_kvae_only():
    from pyro_seq.models import DMM, KVAE
    from pyro_seq.tasks import impute

    torch.manual_seed(0)
    m = KVAE(image_shape=(8, 8), channels=4, conv_layers=2, lstm_dim=4).eval()
    x = (torch.rand(2, 6, 64) < 0.2).to(torch.get_default_dtype())
    observed = torch.tensor([[1, 1, 0, 1, 0, 1], [1, 0, 0, 0, 1, 1]], dtype=torch.bool)
    res = impute(m, x, observed, method="smoothing")
    probs, _ = m.impute_frames(x, observed, "smoothing")
    assert torch.equal(res.probs[~observed], probs[~observed])
    assert torch.equal(res.x[observed], x[observed])  # observed frames are kept
    assert set(res.x.unique().tolist()) <= {0.0, 1.0}
    with pytest.raises(
        ValueError, match="dmm does not support imputation method smoothing: .*kvae"
    ):
        impute(
            DMM(64, z_dim=2, emission_dim=4, transition_dim=4, rnn_dim=4),
            x,
            observed,
            method="smoothing",
        )
