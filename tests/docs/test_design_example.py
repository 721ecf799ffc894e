"""The example model of docs/design.rst ("Writing a new model from the primitives") trains with
every objective and works with the package's tools, so the page cannot drift from the code."""

import sys
from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.optim import Adam

from pyro_seq.data import pad_sequences
from pyro_seq.infer import FIVO, IWAE, estimate_log_likelihood
from pyro_seq.tasks import denoise, forecast, impute

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "_examples"))

from tiny_ssm import TinySSM  # noqa: E402


@pytest.fixture
def batch():
    torch.manual_seed(0)
    x, mask = pad_sequences([(torch.rand(T, 5) < 0.3).float() for T in (7, 4, 6)])
    return x, mask


@pytest.mark.parametrize(
    "loss",
    [
        Trace_ELBO(),
        TraceMeanField_ELBO(),
        IWAE(num_particles=3, max_plate_nesting=1),
        FIVO(num_particles=3),
    ],
    ids=lambda l: type(l).__name__,
)
def test_trains_with_every_objective(batch, loss):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    m = TinySSM(5)
    svi = SVI(m.model, m.guide, Adam({"lr": 1e-2}), loss=loss)
    losses = [svi.step(*batch) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_estimators_missing_data_and_tasks(batch):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, mask = batch
    m = TinySSM(5)
    for method in ("iwae", "smc"):
        est = estimate_log_likelihood(m.model, m.guide, (x, mask), method=method, num_particles=4)
        assert torch.isfinite(torch.tensor(est.nats_per_step))
    observed = torch.ones(3, 7, dtype=torch.bool)
    observed[0, 2] = False
    loss = SVI(m.model, m.guide, Adam({"lr": 1e-2}), loss=Trace_ELBO()).step(
        x, mask, observed=observed
    )
    assert torch.isfinite(torch.tensor(loss))
    assert impute(m, x, observed, mask=mask, num_iterations=2).probs.shape == x.shape
    x_hat, means = denoise(m, x, mask)
    assert x_hat.shape == means.shape == x.shape
    assert forecast(m, x[:, :4], 2, num_samples=3).samples.shape == (3, 3, 2, 5)


def test_the_model_support_table_is_the_contract():
    """docs/_generated/model_support.rst ("what each model supports") is what the models
    declare; regenerate it with ``python -m pyro_seq.models.contract`` after a change."""
    from pathlib import Path

    from pyro_seq.models import MODELS
    from pyro_seq.models.contract import support_table

    page = Path(__file__).parents[2] / "docs" / "_generated" / "model_support.rst"
    assert page.read_text() == support_table(MODELS)
