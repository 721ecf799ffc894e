"""KVAE (thesis Ch. 6): the exact LGSSM prior against dense Gaussians, the two evaluation orders,
eq. 6.8's smoother-sample form, gradients, missing frames, objectives and imputation."""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
import torch.nn as nn
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam

from pyro_seq.infer import FIVO, IWAE
from pyro_seq.models import KVAE
from pyro_seq.ops import kalman_smoother
from tests.dense_gaussian import condition_z, dense_lgssm, log_marginal, observed_index


@pytest.fixture(autouse=True)
def _clear():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def small_kvae(**kw):
    opts = dict(
        image_shape=(8, 8), channels=4, conv_layers=2, a_dim=2, z_dim=3, num_modes=3, lstm_dim=6
    )
    opts.update(kw)
    m = KVAE(**opts).double()
    with torch.no_grad():  # non-uniform mixture weights, so that gamma_t really varies
        nn.init.normal_(m.dynamics.out.weight, std=1.0)
        m.A_modes.add_(0.3 * torch.randn_like(m.A_modes))
        m.C_modes.normal_()
        if m.B_modes is not None:
            m.B_modes.normal_()
    return m


class IdentityEncoder(nn.Module):
    """q(a_t | x_t) = N(x_t, s^2 I): the 'identity-like' stand-in of the issue."""

    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, x):
        return x, torch.full_like(x, self.s)


def identity_kvae(num_modes=1, s=0.3, pixel_var=0.2):
    """A KVAE whose frames are its encodings: x_t = a_t + N(0, pixel_var), q(a_t|x_t) = N(x_t, s^2)."""
    m = KVAE(
        image_shape=(1, 2),
        encoder="mlp",
        hidden_dims=(4,),
        a_dim=2,
        z_dim=3,
        num_modes=num_modes,
        likelihood="gaussian",
        pixel_var=pixel_var,
    ).double()
    m.encoder_body = nn.Identity()
    m.encoder_head = IdentityEncoder(s)
    m.emitter = nn.Identity()
    with torch.no_grad():
        m.A_modes.copy_(
            torch.tensor([[0.9, 0.2, 0.0], [-0.1, 0.8, 0.1], [0.0, 0.3, 0.7]]).expand(
                num_modes, 3, 3
            )
            + 0.1 * torch.randn(num_modes, 3, 3)
        )
        m.C_modes.normal_()
    m.eval()
    return m


def prior_site_log_probs(m, x, mask, a_values, parallel, **kw):
    """Model trace at given encodings; ``parallel`` picks the time-parallel or the step path."""
    guide = poutine.trace(m.guide).get_trace(x, mask, **kw)
    for t, v in enumerate(a_values.unbind(1)):
        guide.nodes[f"a_{t + 1}"]["value"] = v
    prog = m.model
    if not parallel:  # condition (not value-preserving) forces the step-by-step loop
        data = {f"a_{t + 1}": v for t, v in enumerate(a_values.unbind(1))}
        prog = poutine.condition(m.model, data=data)
    tr = poutine.trace(poutine.replay(prog, trace=guide)).get_trace(x, mask, **kw)
    tr.compute_log_prob()
    return tr


def mixing(m, a):
    """gamma_t computed here from a_{0:T-1} with the module's LSTM, independently of the model."""
    B, T, A = a.shape
    prev = torch.cat([m.a0.expand(B, 1, A), a[:, :-1]], 1)
    h, _ = m.dynamics.lstm(prev)
    alpha = torch.softmax(m.dynamics.out(h), -1)
    At = (alpha[..., :, None, None] * m.A_modes).sum(-3)
    Ct = (alpha[..., :, None, None] * m.C_modes).sum(-3)
    Bt = None if m.B_modes is None else (alpha[..., :, None, None] * m.B_modes).sum(-3)
    return At, Bt, Ct


@pytest.mark.parametrize("controls", [0, 2])
def test_prior_equals_dense_gaussian_with_time_varying_gamma(controls):
    torch.manual_seed(0)
    m = small_kvae(control_dim=controls)
    B, T = 3, 5
    x = (torch.rand(B, T, 64) < 0.3).double()
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    a = torch.randn(B, T, 2, dtype=torch.float64)
    kw = {"inputs": torch.randn(B, T, controls, dtype=torch.float64)} if controls else {}
    At, Bt, Ct = mixing(m, a)
    for parallel in (True, False):
        tr = prior_site_log_probs(m, x, mask, a, parallel, **kw)
        for b in range(B):
            L = int(mask[b].sum())
            offsets = None
            if controls:
                offsets = (Bt[b, :L] @ kw["inputs"][b, :L, :, None]).squeeze(-1)
            dense = dense_lgssm(m.init_loc, m.init_cov, At[b, :L], m.Q, Ct[b, :L], m.R, L, offsets)
            expected = log_marginal(dense, a[b, :L], observed_index(dense))
            got = sum(tr.nodes[f"a_{t + 1}"]["log_prob"][b] for t in range(T))
            assert torch.allclose(got, expected, rtol=1e-9, atol=1e-9), (parallel, b)


def test_time_parallel_and_step_loop_sites_agree():
    torch.manual_seed(1)
    m = small_kvae()
    x = (torch.rand(2, 6, 64) < 0.3).double()
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2], dtype=torch.bool)
    a = torch.randn(2, 6, 2, dtype=torch.float64)
    fast = prior_site_log_probs(m, x, mask, a, True)
    slow = prior_site_log_probs(m, x, mask, a, False)
    for name, site in fast.nodes.items():
        if site["type"] == "sample" and name[0] in "ax":
            assert torch.allclose(site["log_prob"], slow.nodes[name]["log_prob"], atol=1e-10), name


def test_smoother_sample_variant_equals_exact_prior():
    """eq. 6.8: log p(a|z) + log p(z) - log p(z|a) = log p(a) for every draw z ~ p(z | a)."""
    torch.manual_seed(2)
    m = small_kvae()
    x = (torch.rand(3, 5, 64) < 0.3).double()
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 2:] = False
    a = torch.randn(3, 5, 2, dtype=torch.float64)
    exact = prior_site_log_probs(m, x, mask, a, True)
    m.prior_score = "smoother_sample"
    for seed in range(3):
        torch.manual_seed(seed)
        sampled = prior_site_log_probs(m, x, mask, a, True)
        tot_e = sum(exact.nodes[f"a_{t + 1}"]["log_prob"] for t in range(5))
        tot_s = sum(sampled.nodes[f"a_{t + 1}"]["log_prob"] for t in range(5))
        assert torch.allclose(tot_s, tot_e, rtol=1e-8, atol=1e-8)


def _closed_form_elbo(m, x, s, pixel_var):
    """E_q[log N(x; a, v I) + log p(a) - log q(a|x)] with q = N(x, s^2 I), p(a) dense Gaussian."""
    T, D = x.shape
    A, C = m.A_modes[0].detach(), m.C_modes[0].detach()
    dense = dense_lgssm(m.init_loc, m.init_cov, A, m.Q, C, m.R, T)
    n = T * D
    cov = dense.cov_xx
    # E_q log p(a) = log N(mu_q; mean, cov) - tr(cov^-1 S_q) / 2
    e_prior = (
        log_marginal(dense, x, observed_index(dense)) - 0.5 * s**2 * torch.linalg.inv(cov).trace()
    )
    e_lik = -0.5 * n * math.log(2 * math.pi * pixel_var) - 0.5 * n * s**2 / pixel_var
    entropy = 0.5 * n * math.log(2 * math.pi * math.e * s**2)
    return e_lik + e_prior + entropy


def test_elbo_equals_dense_gaussian_reference():
    """With identity-like encoder/decoder stand-ins and K = 1 the bound has a closed form."""
    torch.manual_seed(3)
    s, v = 0.3, 0.2
    m = identity_kvae(num_modes=1, s=s, pixel_var=v)
    x = torch.randn(1, 4, 2, dtype=torch.float64)
    expected = _closed_form_elbo(m, x[0], s, v)
    # the per-sample log weight is exact at any a: check it at the guide's draws
    N = 4000
    elbo = Trace_ELBO(num_particles=N, vectorize_particles=True, max_plate_nesting=1)
    estimate = -elbo.loss(m.model, m.guide, x)
    # standard error from the spread of single-sample log weights
    lw = torch.stack([-Trace_ELBO().loss(m.model, m.guide, x) * torch.ones(()) for _ in range(200)])
    se = lw.std() / math.sqrt(N)
    assert abs(estimate - expected.item()) < 5 * se + 1e-9, (estimate, expected.item(), se.item())


def test_gradient_matches_finite_differences():
    torch.manual_seed(4)
    m = small_kvae()
    m.eval()
    x = (torch.rand(2, 4, 64) < 0.3).double()
    mask = torch.tensor([[1] * 4, [1] * 3 + [0]], dtype=torch.bool)
    params = {
        "A_modes": m.A_modes,
        "C_modes": m.C_modes,
        "a0": m.a0,
        "lstm": m.dynamics.lstm.weight_ih_l0,
        "enc": m.encoder_head.loc.weight,
        "dec": m.emitter.out.weight,
    }

    def loss():
        torch.manual_seed(123)  # the same reparameterisation noise at every evaluation
        return Trace_ELBO().differentiable_loss(m.model, m.guide, x, mask)

    value = loss()
    grads = torch.autograd.grad(value, list(params.values()))
    h = 1e-6
    for (name, p), g in zip(params.items(), grads):
        for idx in [(0,) * p.dim(), tuple(d - 1 for d in p.shape)]:
            with torch.no_grad():
                old = p[idx].item()
                p[idx] = old + h
                up = loss().item()
                p[idx] = old - h
                down = loss().item()
                p[idx] = old
            fd = (up - down) / (2 * h)
            assert abs(fd - g[idx].item()) < 1e-5 * max(1.0, abs(fd)), (
                name,
                idx,
                fd,
                g[idx].item(),
            )


def test_missing_frames_give_the_marginal_of_the_observed_encodings():
    """With missing steps (K = 1: gamma fixed) the a-sites sum to log p(a_obs) (dense marginal)."""
    torch.manual_seed(5)
    m = identity_kvae(num_modes=1)
    T = 6
    x = torch.randn(2, T, 2, dtype=torch.float64)
    observed = torch.tensor([[1, 0, 1, 1, 0, 1], [1, 1, 0, 0, 1, 1]], dtype=torch.bool)
    a = torch.randn(2, T, 2, dtype=torch.float64)
    tr = prior_site_log_probs(m, x, None, a, False, observed=observed)
    dense = dense_lgssm(
        m.init_loc, m.init_cov, m.A_modes[0].detach(), m.Q, m.C_modes[0].detach(), m.R, T
    )
    for b in range(2):
        expected = log_marginal(dense, a[b], observed_index(dense, observed[b]))
        got = sum(tr.nodes[f"a_{t + 1}"]["log_prob"][b] for t in range(T))
        assert torch.allclose(got, expected, rtol=1e-9)
        for t in range(T):  # missing frames contribute no likelihood
            if not observed[b, t]:
                assert tr.nodes[f"x_{t + 1}"]["log_prob"][b] == 0


def test_observed_all_true_equals_no_mask():
    torch.manual_seed(6)
    m = small_kvae()
    m.eval()
    x = (torch.rand(2, 5, 64) < 0.3).double()
    losses = []
    for kw in ({}, {"observed": torch.ones(2, 5, dtype=torch.bool)}):
        torch.manual_seed(0)
        losses.append(Trace_ELBO().loss(m.model, m.guide, x, **kw))
    assert abs(losses[0] - losses[1]) < 1e-9 * abs(losses[0])


@pytest.mark.parametrize(
    "loss",
    [Trace_ELBO(), TraceMeanField_ELBO(), IWAE(4), IWAE(4, gradient_estimator="dreg"), FIVO(4)],
    ids=["elbo", "meanfield", "iwae", "dreg", "fivo"],
)
def test_svi_step_every_objective(loss):
    torch.manual_seed(7)
    m = KVAE(image_shape=(8, 8), channels=4, conv_layers=2, lstm_dim=5, control_dim=1)
    x = (torch.rand(3, 5, 64) < 0.3).float()
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    u = torch.randn(3, 5, 1)
    value = loss.differentiable_loss(m.model, m.guide, x, mask, inputs=u)
    assert torch.isfinite(value)
    value.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        # the dynamics network's output layer starts at zero (uniform weights): on the first
        # step nothing behind it (the LSTM, a_0) can move alpha, so their gradients are 0
        if not (name.startswith("dynamics.lstm") or name == "a0"):
            assert p.grad.abs().sum() > 0, name
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-3}), loss=loss)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    assert math.isfinite(svi.step(x, mask, inputs=u))
    assert not torch.equal(before["C_modes"], m.C_modes)


def test_step_path_under_fivo_equals_the_time_parallel_bounds():
    """FIVO runs the step protocol, ELBO/IWAE the time-parallel path: with the same random
    numbers FIVO(1) = Trace_ELBO and FIVO(4, never resample) = IWAE(4)."""
    torch.manual_seed(8)
    m = small_kvae(control_dim=1)
    m.eval()
    x = (torch.rand(2, 5, 64) < 0.3).double()
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2], dtype=torch.bool)
    u = torch.randn(2, 5, 1, dtype=torch.float64)
    pairs = [(FIVO(1), Trace_ELBO()), (FIVO(4, resample="never"), IWAE(4, max_plate_nesting=1))]
    for fivo, other in pairs:
        torch.manual_seed(1)
        a = fivo.loss(m.model, m.guide, x, mask, inputs=u)
        torch.manual_seed(1)
        b = other.loss(m.model, m.guide, x, mask, inputs=u)
        assert a == pytest.approx(b, rel=1e-9), type(other).__name__


def test_reconstruction_weight_applies_in_training_mode_only():
    torch.manual_seed(9)
    m = small_kvae(reconstruction_weight=0.3)
    x = (torch.rand(2, 4, 64) < 0.3).double()
    guide = poutine.trace(m.guide).get_trace(x)
    traces = {}
    for mode in (True, False):
        m.train(mode)
        traces[mode] = poutine.trace(poutine.replay(m.model, trace=guide)).get_trace(x)
    assert traces[True].nodes["x_1"]["scale"] == 0.3
    assert traces[False].nodes["x_1"]["scale"] == 1.0
    assert traces[True].nodes["a_1"]["scale"] == 1.0


def test_dynamics_warmup_freezes_the_dynamics_network():
    torch.manual_seed(10)
    m = KVAE(image_shape=(8, 8), channels=4, conv_layers=2, lstm_dim=5, dynamics_warmup_epochs=2)
    x = (torch.rand(2, 4, 64) < 0.3).float()
    for epoch, frozen in ((0, True), (1, True), (2, False)):
        m.training_epoch(epoch)
        assert m.dynamics_frozen is frozen
        m.zero_grad(set_to_none=True)
        Trace_ELBO().differentiable_loss(m.model, m.guide, x).backward()
        lstm_grad = m.dynamics.lstm.weight_hh_l0.grad
        assert (lstm_grad is None) is frozen
        assert m.A_modes.grad is not None


def test_uniform_mixture_weights_at_initialisation():
    m = KVAE(image_shape=(8, 8), channels=4, conv_layers=2)
    alpha = m.dynamics.sequence(torch.randn(3, 7, 2))
    assert torch.allclose(alpha, torch.full_like(alpha, 1 / 3))


def test_smoothing_imputation_equals_the_kalman_smoother():
    """Known LGSSM (K = 1, identity encoder): imputed encodings are C E[z_t | a_obs]."""
    torch.manual_seed(11)
    m = identity_kvae(num_modes=1)
    T = 7
    x = torch.randn(2, T, 2, dtype=torch.float64)
    observed = torch.tensor([[1, 1, 0, 0, 1, 0, 1], [1, 0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    probs, a_hat = m.impute_frames(x, observed, "smoothing")
    A, C = m.A_modes[0].detach(), m.C_modes[0].detach()
    sm = kalman_smoother(x, m.init_loc, m.init_cov, A, m.Q, C, m.R, mask=observed)
    assert torch.allclose(a_hat, sm.means @ C.T, atol=1e-10)
    dense = dense_lgssm(m.init_loc, m.init_cov, A, m.Q, C, m.R, T)
    for b in range(2):
        mean_z, _ = condition_z(dense, x[b], observed_index(dense, observed[b]))
        assert torch.allclose(a_hat[b], mean_z.to(a_hat) @ C.T, atol=1e-9)
    assert torch.allclose(probs, a_hat)  # identity decoder, Gaussian pixels: the means
    _, a_filt = m.impute_frames(x, observed, "filtering")
    for b in range(2):  # filtering: condition on the observed prefix only
        for t in range(T):
            prefix = observed[b] & (torch.arange(T) <= t)
            mean_z, _ = condition_z(dense, x[b], observed_index(dense, prefix))
            assert torch.allclose(a_filt[b, t], C @ mean_z[t].to(a_hat), atol=1e-9)


def test_generation_uses_only_the_first_frames():
    torch.manual_seed(12)
    m = identity_kvae(num_modes=1)
    x = torch.randn(1, 8, 2, dtype=torch.float64)
    observed = torch.ones(1, 8, dtype=torch.bool)
    _, gen = m.impute_frames(x, observed, "generation", num_initial=4)
    prefix = observed & (torch.arange(8) < 4)
    _, filt = m.impute_frames(x, prefix, "filtering")
    assert torch.allclose(gen, filt)


def test_bad_inputs_are_refused():
    m = KVAE(image_shape=(8, 8), channels=4, conv_layers=2, control_dim=2)
    x = torch.zeros(2, 3, 64)
    with pytest.raises(ValueError, match="needs inputs"):
        Trace_ELBO().loss(m.model, m.guide, x)
    with pytest.raises(ValueError, match="shape"):
        Trace_ELBO().loss(m.model, m.guide, x, inputs=torch.zeros(2, 3, 1))
    with pytest.raises(ValueError, match="non-finite"):
        Trace_ELBO().loss(m.model, m.guide, x, inputs=torch.full((2, 3, 2), float("nan")))
    m2 = KVAE(image_shape=(8, 8), channels=4, conv_layers=2)
    with pytest.raises(ValueError, match="takes no inputs"):
        Trace_ELBO().loss(m2.model, m2.guide, x, inputs=torch.zeros(2, 3, 2))
    with pytest.raises(ValueError, match="features per step"):
        Trace_ELBO().loss(m2.model, m2.guide, torch.zeros(2, 3, 65))
    with pytest.raises(ValueError, match="divisible"):
        KVAE(image_shape=(10, 10))
    for bad in (
        {"encoder": "rnn"},
        {"prior_score": "x"},
        {"likelihood": "poisson"},
        {"transition_noise": 0.0},
        {"a_dim": 0},
        {"control_dim": -1},
    ):
        with pytest.raises(ValueError):
            KVAE(image_shape=(8, 8), conv_layers=2, **bad)


def test_generated_codes_follow_the_lgssm_prior():
    """K = 1: the codes of ``generate`` are draws of the LGSSM marginal p(a_{1:T}) (dense
    mean 0 and covariance, compared entrywise within 5 standard errors)."""
    torch.manual_seed(13)
    m = identity_kvae(num_modes=1)
    N, T = 20000, 3
    x, params, a = m.generate(N, T, return_codes=True)
    assert x.shape == (N, T, 2) and torch.equal(params, a)  # identity decoder
    dense = dense_lgssm(
        m.init_loc, m.init_cov, m.A_modes[0].detach(), m.Q, m.C_modes[0].detach(), m.R, T
    )
    flat = a.reshape(N, -1)
    var = dense.cov_xx.diagonal()
    assert ((flat.mean(0) - dense.mean_x).abs() < 5 * (var / N).sqrt()).all()
    emp = torch.cov(flat.T)
    se = ((dense.cov_xx**2 + var[:, None] * var[None, :]) / N).sqrt()
    assert ((emp - dense.cov_xx).abs() < 5 * se).all()


def test_default_training_objective_is_the_reported_elbo():
    """With the default reconstruction weight the training-mode model is the eval-mode one:
    the same log joint on the same guide sample (the thesis's 0.3 scales log p(x | a))."""
    torch.manual_seed(9)
    x = (torch.rand(2, 4, 64) < 0.3).double()
    for kw, equal in (({}, True), ({"reconstruction_weight": 0.3}, False)):
        m = small_kvae(**kw)
        guide = poutine.trace(m.guide).get_trace(x)
        joint = {}
        for mode in (True, False):
            m.train(mode)
            trace = poutine.trace(poutine.replay(m.model, trace=guide)).get_trace(x)
            joint[mode] = trace.log_prob_sum().item()
        assert (abs(joint[True] - joint[False]) <= 1e-9 * abs(joint[False])) is equal


def test_likelihood_estimates_run_in_eval_mode_and_restore_it():
    """estimate_log_likelihood scores with weight 1 on log p(x|a) (eval mode) whatever the mode."""
    from pyro_seq.infer import estimate_log_likelihood

    torch.manual_seed(14)
    m = small_kvae(reconstruction_weight=0.3)
    x = (torch.rand(2, 4, 64) < 0.3).double()
    values = {}
    for mode in (True, False):
        m.train(mode)
        torch.manual_seed(0)
        values[mode] = estimate_log_likelihood(m.model, m.guide, x, num_particles=3).total
        assert m.training is mode
    assert values[True] == values[False]
    m.train()
    torch.manual_seed(0)
    weighted = -IWAE(3, max_plate_nesting=1).loss(m.model, m.guide, x)
    assert weighted != pytest.approx(values[True], rel=1e-3)
