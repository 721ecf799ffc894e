"""Shared fixtures: a clean Pyro param store and fixed seeds for every test."""

import pyro
import pytest
import torch

# Tests run tiny tensors: one intra-op thread avoids OpenMP hand-off costs that dominate at
# these sizes (and oversubscription when other processes share the 2 CI cores).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _clean_pyro_state():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


@pytest.fixture
def float64():
    """Default dtype float64 for the test (exact identities are checked at <= 1e-9 relative)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
