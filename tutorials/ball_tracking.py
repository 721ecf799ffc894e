# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Tracking a ball with linear-Gaussian and non-linear state-space models
#
# This tutorial reproduces the running example of Chapter 3 of Fraccaro's thesis (*Deep Latent
# Variable Models for Sequential Data*, Secs. 3.4-3.5) with `pyro_seq`:
#
# 1. simulate a ball thrown in vacuum (eq. 3.9) and observe its position with noise;
# 2. filter and smooth with the exact Kalman filter / RTS smoother (Fig. 3.3);
# 3. impute a missing middle section of the trajectory (Fig. 3.4);
# 4. learn the initial state with EM (Fig. 3.5, with the log-likelihood curve);
# 5. add air resistance (eq. 3.13): the linear model fails (Fig. 3.7) while the unscented
#    Kalman filter/smoother with the true non-linear dynamics follows the ball (Fig. 3.8).
#
# Run it as a script (`python tutorials/ball_tracking.py [--out DIR]`) or open it as a notebook
# with jupytext. Figures are written as PNG to `--out`, or to `$PYRO_SEQ_OUTPUT/ball_tracking`
# (default: a temporary folder); `SMOKE` and `OUT` come from a hidden first cell.
# `PYRO_SEQ_SMOKE=1` runs a shorter version (fewer EM iterations) for continuous integration. A
# `metrics.json` with the numbers quoted below is written next to the figures.

# %% tags=["remove-input"]
# Options (--out, --smoke), the output folder and, in short mode, a banner.
from pyro_seq._tutorial_support import setup

SMOKE, OUT = setup("ball_tracking", "a ball tracked by Kalman and unscented filters")

# %%
import json
import math

import matplotlib.pyplot as plt
import torch

from pyro_seq.distributions.linear_gaussian_ssm import LinearGaussianSSM
from pyro_seq.infer.lgssm_em import LGSSMParams, lgssm_em
from pyro_seq.ops.nonlinear import unscented_kalman_smoother
from pyro_seq.train.plots import show_inline as show

torch.manual_seed(0)
DT = torch.float64
metrics = {"smoke": SMOKE}

# %% [markdown]
# ## The ball in vacuum (eq. 3.9)
#
# The state is $z_t = (x_t, \dot x_t, y_t, \dot y_t)$, sampled every $\Delta = 0.2$ s.
# Newton's equations give a linear transition $z_t = A z_{t-1} + B u_t$ where gravity enters as
# the constant control $u_t = -g$, and we observe the noisy position
# $x_t = C z_t + \delta_t$ (eq. 3.10), $\delta_t \sim N(0, R)$, $R = 3 I$. The dynamics are exact,
# so $Q = 0$. The prior on the initial state is deliberately poor:
# $\mu_{1|0} = 0$, $\Sigma_{1|0} = 2 I$ (the true initial velocity is 60 m/s in each direction).

# %%
delta, g = 0.2, 9.81
T = 60
A = torch.tensor([[1, delta, 0, 0], [0, 1, 0, 0], [0, 0, 1, delta], [0, 0, 0, 1]], dtype=DT)
B = torch.tensor([[0.0], [0.0], [0.5 * delta**2], [delta]], dtype=DT)
C = torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0]], dtype=DT)
Q = torch.zeros(4, 4, dtype=DT)
R = 3.0 * torch.eye(2, dtype=DT)
u = torch.full((T, 1), -g, dtype=DT)  # entry 0 unused (it is the transition into step 0)
prior_loc, prior_cov = torch.zeros(4, dtype=DT), 2.0 * torch.eye(4, dtype=DT)
z_init = torch.tensor([0.0, 60.0, 0.0, 60.0], dtype=DT)


def simulate(step, z0, T):
    """Deterministic trajectory z_{1:T} from z_1 = z0 and z_t = step(z_{t-1})."""
    zs = [z0]
    for _ in range(T - 1):
        zs.append(step(zs[-1]))
    return torch.stack(zs)


def vacuum_step(z):
    """Eq. (3.9) as z_t = A z_{t-1} + B u_t."""
    return A @ z + (B @ u[1]).squeeze(-1) if z.dim() == 1 else z @ A.T + (B @ u[1])


z_true = simulate(vacuum_step, z_init, T)
x_obs = z_true @ C.T + torch.randn(T, 2, dtype=DT) @ torch.linalg.cholesky(R).T

ssm = LinearGaussianSSM(prior_loc, prior_cov, A, Q, C, R, control_matrix=B, controls=u)


def rmse(est, truth):
    """Root-mean-square Euclidean distance between (T, 2) position tracks."""
    return float((est - truth).pow(2).sum(-1).mean().sqrt())


def positions(z):
    return z[..., [0, 2]]


# %% [markdown]
# ## Filtering and smoothing (Fig. 3.3)
#
# The Kalman filter (Sec. 3.4.1) uses the observations up to time $t$, the RTS smoother the
# whole sequence. The filter needs a few observations to correct the poor initial state (its
# error starts far above the noise level) and then reduces the noise more and more; the
# smoother is accurate everywhere.

# %%
smooth = ssm.smooth(x_obs)
filt = smooth.filtered  # the smoother runs the filter first
true_pos = positions(z_true)
half = T // 2
metrics["fig3_3"] = {
    "rmse_observations": rmse(x_obs, true_pos),
    "rmse_filtered": rmse(positions(filt.means), true_pos),
    # after the transient caused by the poor initial state
    "rmse_observations_second_half": rmse(x_obs[half:], true_pos[half:]),
    "rmse_filtered_second_half": rmse(positions(filt.means)[half:], true_pos[half:]),
    "rmse_smoothed_second_half": rmse(positions(smooth.means)[half:], true_pos[half:]),
    "rmse_smoothed": rmse(positions(smooth.means), true_pos),
    "log_likelihood": float(filt.log_likelihoods.sum()),
}
print("Fig 3.3", metrics["fig3_3"])


def trajectory_panel(ax, title, est_filtered=None, est_smoothed=None, observed=None, extra=None):
    ax.plot(true_pos[:, 0], true_pos[:, 1], "b--", lw=1.5, label="true trajectory")
    mask = torch.ones(T, dtype=torch.bool) if observed is None else observed
    ax.plot(x_obs[mask, 0], x_obs[mask, 1], "k.", ms=4, label="observations")
    if est_filtered is not None:
        ax.plot(
            est_filtered[:, 0], est_filtered[:, 1], "-", color="tab:red", lw=1.2, label="filtered"
        )
    if est_smoothed is not None:
        ax.plot(
            est_smoothed[:, 0], est_smoothed[:, 1], "-", color="tab:green", lw=1.5, label="smoothed"
        )
    if extra is not None:
        extra(ax)
    ax.set_xlabel("x [m]")
    ax.set_ylabel("y [m]")
    ax.set_title(title)
    ax.legend(loc="lower center", fontsize=8)


def error_panel(ax, curves, title="position error"):
    t = torch.arange(T) * delta
    for label, est, style in curves:
        ax.plot(t, (est - true_pos).norm(dim=-1), style, label=label, lw=1.2)
    ax.set_yscale("log")
    ax.set_xlabel("time [s]")
    ax.set_ylabel("distance to the true position [m]")
    ax.set_title(title)
    ax.legend(fontsize=8)


fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
trajectory_panel(
    axes[0], "Fig. 3.3: Kalman filter and smoother", positions(filt.means), positions(smooth.means)
)
error_panel(
    axes[1],
    [
        ("observations", x_obs, "k."),
        ("filtered", positions(filt.means), "r-"),
        ("smoothed", positions(smooth.means), "g-"),
    ],
)
fig.tight_layout()
fig.savefig(OUT / "fig3_3_filter_smoother.png", dpi=110)
plt.close(fig)
show(OUT / "fig3_3_filter_smoother.png")

# %% [markdown]
# ## Missing data imputation (Fig. 3.4)
#
# Only the first 10 and the last 8 observations are kept (Sec. 3.4.2). At the missing steps
# the filter only propagates its prediction, so it drifts with the badly estimated velocity;
# the smoother also uses the last 8 observations at every step and stays on the trajectory.

# %%
observed = torch.zeros(T, dtype=torch.bool)
observed[:10] = True
observed[-8:] = True
x_missing = torch.where(observed[:, None], x_obs, torch.full_like(x_obs, math.nan))
smooth_m = ssm.smooth(x_missing, step_mask=observed)  # per-step mask (T,)
filt_m = smooth_m.filtered
gap = ~observed
metrics["fig3_4"] = {
    "rmse_filtered_gap": rmse(positions(filt_m.means)[gap], true_pos[gap]),
    "rmse_smoothed_gap": rmse(positions(smooth_m.means)[gap], true_pos[gap]),
}
print("Fig 3.4", metrics["fig3_4"])
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
trajectory_panel(
    axes[0],
    "Fig. 3.4: imputing the missing middle section",
    positions(filt_m.means),
    positions(smooth_m.means),
    observed=observed,
)
error_panel(
    axes[1],
    [("filtered", positions(filt_m.means), "r-"), ("smoothed", positions(smooth_m.means), "g-")],
    title="position error (observations missing at 2-10.2 s)",
)
axes[1].axvspan(10 * delta, (T - 8) * delta, color="0.9")
fig.tight_layout()
fig.savefig(OUT / "fig3_4_missing_data.png", dpi=110)
plt.close(fig)
show(OUT / "fig3_4_missing_data.png")

# %% [markdown]
# ## Learning the initial state with EM (Fig. 3.5)
#
# EM (Sec. 3.4.3) alternates the smoother (E-step) with the closed-form update of
# $\mu_{1|0}, \Sigma_{1|0}$ (M-step). Because the E-step is exact, the log-likelihood never
# decreases. After learning, the filter starts from the right velocity.

# %%
num_em = 3 if SMOKE else 20
params = LGSSMParams(prior_loc, prior_cov, A, Q, C, R, control_matrix=B)
em = lgssm_em(x_obs, params, num_iters=num_em, learn=("initial_loc", "initial_cov"), controls=u)
ssm_em = LinearGaussianSSM(
    em.params.initial_loc, em.params.initial_cov, A, Q, C, R, control_matrix=B, controls=u
)
smooth_em = ssm_em.smooth(x_obs)
filt_em = smooth_em.filtered
lls = em.log_likelihoods
metrics["fig3_5"] = {
    "log_likelihoods": [float(v) for v in lls],
    "learned_initial_loc": [float(v) for v in em.params.initial_loc],
    "rmse_filtered": rmse(positions(filt_em.means), true_pos),
    "rmse_smoothed": rmse(positions(smooth_em.means), true_pos),
}
print("Fig 3.5", {k: v for k, v in metrics["fig3_5"].items() if k != "log_likelihoods"})
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
trajectory_panel(
    axes[0],
    "Fig. 3.5a: after learning the initial state by EM",
    positions(filt_em.means),
    positions(smooth_em.means),
)
axes[1].plot(range(len(lls)), lls, "o-")
axes[1].set_xlabel("EM iteration")
axes[1].set_ylabel("log p(x)")
axes[1].set_title("Fig. 3.5b: log-likelihood during EM")
# the first step does most of the work; zoom in on the (still increasing) rest
inset = axes[1].inset_axes([0.35, 0.15, 0.6, 0.5])
inset.plot(range(1, len(lls)), lls[1:] - lls[-1], "o-", ms=3)
inset.set_title("log p(x) - final value, iterations >= 1", fontsize=8)
inset.tick_params(labelsize=7)
fig.tight_layout()
fig.savefig(OUT / "fig3_5_em.png", dpi=110)
plt.close(fig)
show(OUT / "fig3_5_em.png")

# %% [markdown]
# ## Air resistance (eq. 3.13, Fig. 3.7)
#
# In air the velocities lose $b(v)\, v\, \dot x_{t-1} \Delta$ (and likewise for $\dot y$) per
# step, with speed $v = \sqrt{\dot x_{t-1}^2 + \dot y_{t-1}^2}$ and drag coefficient
# $b(v) = 0.0039 + 0.0058 / (1 + e^{(v - 35)/5})$ (Labbe 2015, which the thesis follows; the
# typeset eq. 3.13 lost the parentheses around $b(v)$ and the factor $v$). The trajectory is no
# longer a parabola. The ball is thrown as before, so we reuse the initial state learned by EM
# in Fig. 3.5. The LGSSM's dynamics ignore the drag and, with $Q = 0$, it trusts them
# completely: it keeps following a parabola and loses the ball.

# %%


def air_step(z, t=None):
    """Eq. (3.13): the vacuum dynamics plus a non-linear drag on the velocities. Works on
    ``(..., 4)`` states (and so on the UKF's sigma points)."""
    px, vx, py, vy = z.unbind(-1)
    speed = torch.sqrt(vx**2 + vy**2)
    drag = (0.0039 + 0.0058 / (1 + torch.exp((speed - 35.0) / 5.0))) * speed
    return torch.stack(
        [
            px + vx * delta,
            vx - drag * vx * delta,
            py + vy * delta - 0.5 * g * delta**2,
            vy - g * delta - drag * vy * delta,
        ],
        -1,
    )


T_air = 45
z_air = simulate(air_step, z_init, T_air)
x_air = z_air @ C.T + torch.randn(T_air, 2, dtype=DT) @ torch.linalg.cholesky(R).T
air_pos = positions(z_air)
u_air = u[:1].expand(T_air, 1)
learned_loc, learned_cov = em.params.initial_loc, em.params.initial_cov
ssm_air = LinearGaussianSSM(learned_loc, learned_cov, A, Q, C, R, control_matrix=B, controls=u_air)
smooth_lin = ssm_air.smooth(x_air)
filt_lin = smooth_lin.filtered
if not SMOKE:  # for reference: the LGSSM with the original poor prior is not better
    smooth_lin_prior = LinearGaussianSSM(
        prior_loc, prior_cov, A, Q, C, R, control_matrix=B, controls=u_air
    ).smooth(x_air)

fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
axes[0].plot(true_pos[:, 0], true_pos[:, 1], "b--", label="in vacuum (eq. 3.9)")
axes[0].plot(air_pos[:, 0], air_pos[:, 1], "m-", label="in air (eq. 3.13)")
axes[0].set_xlabel("x [m]")
axes[0].set_ylabel("y [m]")
axes[0].set_title("Fig. 3.7a: same initial state, with and without air")
axes[0].legend(fontsize=8)


def air_panel(ax, title, f_pos, s_pos, legend_loc):
    ax.plot(air_pos[:, 0], air_pos[:, 1], "b--", lw=1.5, label="true trajectory (in air)")
    ax.plot(x_air[:, 0], x_air[:, 1], "k.", ms=4, label="observations")
    ax.plot(f_pos[:, 0], f_pos[:, 1], "-", color="tab:red", lw=1.2, label="filtered")
    ax.plot(s_pos[:, 0], s_pos[:, 1], "-", color="tab:green", lw=1.5, label="smoothed")
    ax.set_xlabel("x [m]")
    ax.set_ylabel("y [m]")
    ax.set_title(title)
    ax.legend(loc=legend_loc, fontsize=8)


air_panel(
    axes[1],
    "Fig. 3.7b: the LGSSM (no drag) on data in air",
    positions(filt_lin.means),
    positions(smooth_lin.means),
    "lower right",
)
fig.tight_layout()
fig.savefig(OUT / "fig3_7_air_resistance_lgssm.png", dpi=110)
plt.close(fig)
show(OUT / "fig3_7_air_resistance_lgssm.png")

# %% [markdown]
# ## The unscented Kalman filter and smoother (Fig. 3.8)
#
# With the non-linear transition of eq. 3.13 as $f$, the same linear emission and the same
# learned initial state, `unscented_kalman_smoother` (Sec. 3.5.1.2) propagates $2S + 1 = 9$
# sigma points through $f$ and follows the ball. A tiny transition noise keeps the predicted
# covariances well conditioned.
#
# A caveat the numbers in `metrics.json` show: started from the original poor prior
# ($\mu_{1|0} = 0$, $\Sigma_{1|0} = 2I$) the UKF does much worse, because with $Q \approx 0$
# an early, badly centred sigma-point approximation is never forgotten; a broad prior
# (e.g. $\Sigma_{1|0} = 100 I$) or a learned initial state avoids this.

# %%


def run_ukf(loc, cov):
    return unscented_kalman_smoother(
        x_air, air_step, lambda z, t: z @ C.T, loc, cov, 1e-6 * torch.eye(4, dtype=DT), R
    )


ukf = run_ukf(learned_loc, learned_cov)
if not SMOKE:
    ukf_prior = run_ukf(prior_loc, prior_cov)
    ukf_broad = run_ukf(prior_loc, 100.0 * torch.eye(4, dtype=DT))
metrics["fig3_7_3_8"] = {
    "rmse_observations": rmse(x_air, air_pos),
    "rmse_lgssm_filtered": rmse(positions(filt_lin.means), air_pos),
    "rmse_lgssm_smoothed": rmse(positions(smooth_lin.means), air_pos),
    "rmse_ukf_filtered": rmse(positions(ukf.filtered.means), air_pos),
    "rmse_ukf_smoothed": rmse(positions(ukf.means), air_pos),
    "rmse_lgssm_smoothed_original_prior": None
    if SMOKE
    else rmse(positions(smooth_lin_prior.means), air_pos),
    "rmse_ukf_smoothed_original_prior": None
    if SMOKE
    else rmse(positions(ukf_prior.means), air_pos),
    "rmse_ukf_smoothed_broad_prior": None if SMOKE else rmse(positions(ukf_broad.means), air_pos),
    "log_likelihood_lgssm": float(filt_lin.log_likelihoods.sum()),
    "log_likelihood_ukf": float(ukf.filtered.log_likelihoods.sum()),
}
print("Figs 3.7-3.8", metrics["fig3_7_3_8"])
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
air_panel(
    axes[0],
    "Fig. 3.8: unscented Kalman filter and smoother",
    positions(ukf.filtered.means),
    positions(ukf.means),
    "lower center",
)
t_air = torch.arange(T_air) * delta
for label, est, style in [
    ("observations", x_air, "k."),
    ("LGSSM smoothed", positions(smooth_lin.means), "r-"),
    ("UKF filtered", positions(ukf.filtered.means), "c-"),
    ("UKF smoothed", positions(ukf.means), "g-"),
]:
    axes[1].plot(t_air, (est - air_pos).norm(dim=-1), style, label=label, lw=1.2)
axes[1].set_yscale("log")
axes[1].set_xlabel("time [s]")
axes[1].set_ylabel("distance to the true position [m]")
axes[1].set_title("position error, ball in air")
axes[1].legend(fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "fig3_8_air_resistance_ukf.png", dpi=110)
plt.close(fig)
show(OUT / "fig3_8_air_resistance_ukf.png")

# %%
with open(OUT / "metrics.json", "w") as fh:
    json.dump(metrics, fh, indent=2)
print("done:", sorted(p.name for p in OUT.glob("*.png")))
