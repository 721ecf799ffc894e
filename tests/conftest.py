"""Shared fixtures: a clean Pyro param store and fixed seeds for every test."""

import pickle

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


@pytest.fixture
def tiny_pickle(tmp_path):
    """A tiny piano-roll pickle in the Boulanger-Lewandowski format (train/valid/test note lists)."""
    g = torch.Generator().manual_seed(0)

    def seqs(n):
        out = []
        for _ in range(n):
            T = int(torch.randint(4, 10, (), generator=g))
            out.append(
                [tuple(int(k) for k in torch.randint(40, 80, (3,), generator=g)) for _ in range(T)]
            )
        return out

    path = tmp_path / "tiny.pickle"
    path.write_bytes(pickle.dumps({"train": seqs(10), "valid": seqs(3), "test": seqs(3)}))
    return path
