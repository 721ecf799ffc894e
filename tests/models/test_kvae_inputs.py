"""KVAE with controls u_t (thesis eq. 6.1, 6.10): imputation (thesis 6.4) against an independent
dense-Gaussian reference and against :func:`pyro_seq.ops.kalman_smoother` with the offsets
B_t u_t, and the argument checks of ``impute_frames`` / ``filter_encodings``."""

import pytest
import torch
import torch.nn as nn

from pyro_seq.models import KVAE
from pyro_seq.ops import kalman_smoother
from tests.dense_gaussian import condition_z, dense_lgssm, observed_index

U = 2  # control_dim


def tiny_kvae(control_dim=U):
    torch.manual_seed(3)
    m = KVAE(
        image_shape=(2, 3),
        encoder="mlp",
        hidden_dims=(6,),
        a_dim=2,
        z_dim=3,
        num_modes=2,
        control_dim=control_dim,
        lstm_dim=5,
    ).double()
    with torch.no_grad():  # gamma_t varies with the history, and B u moves the state visibly
        nn.init.normal_(m.dynamics.out.weight, std=1.0)
        m.A_modes.add_(0.2 * torch.randn_like(m.A_modes))
        m.C_modes.normal_()
        if m.B_modes is not None:
            m.B_modes.normal_()
    return m.eval()


def gamma(m, prev):
    """(A_t, B_t, C_t) of eq. 6.10 at the last step of ``prev = a_{0:t-1} (t, a_dim)``, from the
    module's LSTM and base matrices, mixed here by an explicit sum."""
    h, _ = m.dynamics.lstm(prev.unsqueeze(0))
    alpha = torch.softmax(m.dynamics.out(h[0, -1]), -1)
    mix = lambda modes: sum(alpha[k] * modes[k] for k in range(m.num_modes))  # noqa: E731
    return mix(m.A_modes), mix(m.B_modes), mix(m.C_modes)


def dense_imputation(m, a, observed, u):
    """Thesis 6.4 by brute force, one sequence: gamma_t from the encodings used so far (a missing
    step uses C_t E[z_t | observed a_{<t}]), then every conditional mean from the joint Gaussian
    of (z_{1:T}, a_{1:T}) with offsets B_t u_t. Returns (filtered, smoothed) C_t E[z_t | ...]."""
    T, A = a.shape
    used, mats = [], []
    for t in range(T):
        mats.append(gamma(m, torch.cat([m.a0[None], *[v[None] for v in used]])))
        As, Bs, Cs = (torch.stack(g) for g in zip(*mats))
        dense = dense_lgssm(
            m.init_loc, m.init_cov, As, m.Q, Cs, m.R, t + 1, (Bs @ u[: t + 1, :, None]).squeeze(-1)
        )
        if observed[t]:
            used.append(a[t])
        else:
            past = torch.cat([torch.stack(used), a.new_zeros(1, A)]) if used else a.new_zeros(1, A)
            idx = observed_index(dense, observed[: t + 1] & (torch.arange(t + 1) < t))
            used.append(Cs[t] @ condition_z(dense, past, idx)[0][t])
    a_used = torch.stack(used)
    steps = torch.arange(T)
    filtered = torch.stack(
        [
            Cs[t] @ condition_z(dense, a_used, observed_index(dense, observed & (steps <= t)))[0][t]
            for t in range(T)
        ]
    )
    mean_z = condition_z(dense, a_used, observed_index(dense, observed))[0]
    smoothed = (Cs @ mean_z[..., None]).squeeze(-1)
    return filtered, smoothed


def data(B=2, T=6):
    g = torch.Generator().manual_seed(5)
    x = (torch.rand(B, T, 6, generator=g) < 0.5).double()
    u = torch.randn(B, T, U, generator=g, dtype=torch.float64)
    observed = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 0, 1, 1, 0, 1]], dtype=torch.bool)[:B, :T]
    return x, u, observed


@torch.no_grad()
def test_imputation_with_controls_equals_dense_reference():
    """Smoothing, filtering and generation with B_t u_t in every prediction (eq. 6.1) equal the
    brute-force Gaussian conditioning; with zero controls the answer differs (so the controls
    are used, and this test could see them ignored)."""
    m = tiny_kvae()
    x, u, observed = data()
    a = m.encode(x)[0]  # the encoder is per frame: observed rows equal those of the zero-filled x
    num_initial = 3
    _, a_smooth = m.impute_frames(x, observed, "smoothing", inputs=u)
    probs, a_filt = m.impute_frames(x, observed, "filtering", inputs=u)
    _, a_gen = m.impute_frames(x, observed, "generation", inputs=u, num_initial=num_initial)
    first = observed & (torch.arange(x.shape[1]) < num_initial)
    for b in range(x.shape[0]):
        filtered, smoothed = dense_imputation(m, a[b], observed[b], u[b])
        assert torch.allclose(a_smooth[b], smoothed, atol=1e-9), b
        assert torch.allclose(a_filt[b], filtered, atol=1e-9), b
        generated, _ = dense_imputation(m, a[b], first[b], u[b])
        assert torch.allclose(a_gen[b], generated, atol=1e-9), b
    assert torch.allclose(probs, torch.sigmoid(m.decode(a_filt)))
    _, a_zero = m.impute_frames(x, observed, "smoothing", inputs=torch.zeros_like(u))
    assert (a_zero - a_smooth).abs().max() > 0.1


@torch.no_grad()
def test_all_observed_smoothing_equals_kalman_smoother_with_offsets():
    """Every frame observed: gamma_t depends on the encodings only, and the imputed encodings are
    C_t mu_{t|T} of the RTS smoother run directly with the offsets b_t = B_t u_t."""
    m = tiny_kvae()
    x, u, _ = data()
    B, T = x.shape[:2]
    a = m.encode(x)[0]
    _, a_hat = m.impute_frames(x, torch.ones(B, T, dtype=torch.bool), "smoothing", inputs=u)
    for b in range(B):
        prev = torch.cat([m.a0[None], a[b, :-1]])
        As, Bs, Cs = (torch.stack(g) for g in zip(*[gamma(m, prev[: t + 1]) for t in range(T)]))
        offsets = (Bs @ u[b, :, :, None]).squeeze(-1)
        sm = kalman_smoother(a[b], m.init_loc, m.init_cov, As, m.Q, Cs, m.R, controls=offsets)
        assert torch.allclose(a_hat[b], (Cs @ sm.means[..., None]).squeeze(-1), atol=1e-9), b


def _bad_inputs(x, u):
    short, nan = u[:, :-1], u.clone()
    nan[1, 2, 0] = float("nan")
    B, T = x.shape[:2]
    expected = rf"\(batch, T, input_dim\) = \({B}, {T}, {U}\)"
    return {
        "missing": (None, rf"needs inputs=.*\(batch, T, {U}\)"),
        "one step short": (short, expected + rf", got \({B}, {T - 1}, {U}\)"),
        "wrong feature size": (u[..., :1], expected + rf", got \({B}, {T}, 1\)"),
        "wrong batch size": (u[:1], expected + rf", got \(1, {T}, {U}\)"),
        "nan": (nan, "inputs has a non-finite value at a real step: sequence 1, step 2"),
        "integer": (u.long(), "inputs must be a floating-point tensor"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs(*data()[:2])))
@pytest.mark.parametrize("method", ["smoothing", "filtering", "generation"])
def test_bad_inputs_are_refused_naming_inputs(case, method):
    m = tiny_kvae()
    x, u, observed = data()
    inputs, message = _bad_inputs(x, u)[case]
    with pytest.raises(ValueError, match=message):
        m.impute_frames(x, observed, method, inputs=inputs)
    with pytest.raises(ValueError, match=message):
        m.filter_encodings(m.encode(x)[0], observed, inputs)


def test_inputs_to_a_model_without_controls_are_refused():
    m = tiny_kvae(control_dim=0)
    x, u, observed = data()
    with pytest.raises(ValueError, match="takes no inputs=.*control_dim="):
        m.impute_frames(x, observed, "smoothing", inputs=u)
    m.impute_frames(x, observed, "smoothing")  # and none is fine


def test_bad_frames_steps_and_method_are_refused():
    m = tiny_kvae()
    x, u, observed = data()
    B, T = observed.shape
    cases = [
        (dict(x=x[0]), "x must have 3 dimensions"),
        (dict(x=x[..., :4]), "x has 4 features per step, the model expects 6"),
        (dict(x=x.masked_fill(observed[..., None], float("nan"))), "x contains .* NaN"),
        (
            dict(observed_steps=observed[:, :-1]),
            rf"observed_steps shape \({B}, {T - 1}\) does not match x's \(batch, T\) = \({B}, {T}\)",
        ),
        (dict(observed_steps=0.5 * observed.double()), "observed_steps must be bool or .* 0.5"),
        (dict(observed_steps=observed.tolist()), "observed_steps must be a bool torch.Tensor"),
        (dict(method="smooth"), "method must be 'smoothing', 'filtering' or 'generation'"),
        (dict(num_initial=-1), "num_initial must be a non-negative int"),
    ]
    for change, message in cases:
        args = dict(x=x, observed_steps=observed, method="generation", inputs=u, num_initial=2)
        args.update(change)
        with pytest.raises(ValueError, match=message):
            m.impute_frames(**args)


def test_unobserved_frames_may_hold_nan():
    m = tiny_kvae()
    x, u, observed = data()
    probs, a_hat = m.impute_frames(
        x.masked_fill(~observed[..., None], float("nan")), observed, "smoothing", inputs=u
    )
    assert torch.equal(a_hat, m.impute_frames(x, observed, "smoothing", inputs=u)[1])
    assert bool(torch.isfinite(probs).all())


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), 0.0, -1.0])
def test_non_finite_or_non_positive_reconstruction_weight_is_refused(weight):
    with pytest.raises(ValueError, match="reconstruction_weight must be a positive finite number"):
        KVAE(image_shape=(2, 3), encoder="mlp", reconstruction_weight=weight)
