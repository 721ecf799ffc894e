"""Shared fixtures: a clean Pyro param store and fixed seeds for every test."""

from pathlib import Path

import pyro
import pytest
import torch

# Tests run tiny tensors: one intra-op thread avoids OpenMP hand-off costs that dominate at
# these sizes (and oversubscription when other processes share the 2 CI cores).
torch.set_num_threads(1)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _clean_pyro_state():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


def shared_data_file(name):
    """Path of a file under ``../shared/data`` (beside the project), or skip the test."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"data file {path} not found (the shared data folder is not beside the project)")
    return path
