"""The all-reduced gradients of two ranks' shards equal one process's gradient of the whole
minibatch (float64, 1e-10), for latent-variable models whose ELBO draws noise; and the
all-reduce keeps grad None where no rank touched a parameter."""

import contextlib

import pyro
import pytest
import torch

from pyro_seq.models import DMM, SRNN
from pyro_seq.ops.padding import pad_sequences
from pyro_seq.train.distributed import AllReduceGradients
from pyro_seq.train.objectives import make_objective

BATCH, D = 5, 4


def _problem(name):
    """A float64 model and a padded minibatch of 5 sequences of lengths 7, 3, 6, 2, 5 (rank 1
    of 2 gets the rows of lengths 3 and 2, cut to 3 steps)."""
    torch.manual_seed(0)
    model = {
        "dmm": lambda: DMM(D, z_dim=3, transition_dim=5, emission_dim=5, rnn_dim=5),
        "srnn": lambda: SRNN(D, d_dim=4, z_dim=3, hidden_dim=4),
    }[name]().double()
    g = torch.Generator().manual_seed(1)
    seqs = [(torch.rand(T, D, generator=g) < 0.4).double() for T in (7, 3, 6, 2, 5)]
    x, mask = pad_sequences(seqs, dtype=torch.float64)
    return model, x, mask


@contextlib.contextmanager
def _row_noise(rows):
    """Make the k-th argument-free ``Tensor.normal_()`` (the guides' reparameterised draw of
    step k, shape ``(rows, z_dim)``) return rows ``rows`` of a fixed table ``(5, z_dim)``: each
    sequence then sees the same noise whichever rank or batch it is in."""
    original, calls = torch.Tensor.normal_, [0]

    def normal_(self, *args, **kwargs):
        if args or kwargs or self.dim() != 2 or self.shape[0] != len(rows):
            return original(self, *args, **kwargs)
        g = torch.Generator().manual_seed(1000 + calls[0])
        calls[0] += 1
        table = torch.randn(BATCH, self.shape[1], generator=g, dtype=torch.float64)
        with torch.no_grad():
            return self.copy_(table[rows])

    torch.Tensor.normal_ = normal_
    try:
        yield calls
    finally:
        torch.Tensor.normal_ = original


def _gradients(name, rows, comm=None):
    """The ELBO loss and the gradients of every parameter (None where untouched) of the rows
    ``rows`` of the minibatch; with ``comm`` this rank's shard, summed over ranks."""
    model, x, mask = _problem(name)
    pyro.clear_param_store()
    pyro.module(model.module_name, model)
    loss = make_objective("elbo")
    if comm is not None:
        x, mask, _ = comm.shard(x, mask)
        loss = AllReduceGradients(loss, comm)
    with _row_noise(rows) as calls:
        value = loss.loss_and_grads(model.model, model.guide, x, mask)
    assert calls[0] == x.shape[1]  # one draw per step of the (cut) batch
    store = pyro.get_param_store()
    grads = {
        n: (None if p.grad is None else p.grad.clone())
        for n, p in ((n, store[n].unconstrained()) for n in store.keys())
    }
    return float(value), grads


class _PartialLoss:
    """A stand-in objective: ``a`` is used by both ranks (``(rank + 1) * sum(a)``), ``b`` by
    rank 1 alone (``3 * sum(b)``), ``c`` by none."""

    def __init__(self, rank):
        self.rank = rank

    def loss_and_grads(self, model, guide, x, mask):
        loss = (self.rank + 1) * pyro.param("a").sum()
        if self.rank == 1:
            loss = loss + 3 * pyro.param("b").sum()
        loss.backward()
        return float(loss.detach())


def _rank(rank, port, out):
    import torch.distributed as dist

    from pyro_seq.train.distributed import init_process_group

    torch.set_num_threads(1)
    comm = init_process_group(rank, 2, port)
    rows = list(range(BATCH))[rank::2]
    result = {name: _gradients(name, rows, comm) for name in ("dmm", "srnn")}
    pyro.clear_param_store()
    for name in "abc":
        pyro.param(name, torch.zeros(2, dtype=torch.float64))
    AllReduceGradients(_PartialLoss(rank), comm).loss_and_grads(
        None, None, torch.zeros(1, 1, 1), torch.ones(1, 1, dtype=torch.bool)
    )
    store = pyro.get_param_store()
    result["partial"] = {n: store[n].unconstrained().grad for n in "abc"}
    torch.save(result, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    import torch.multiprocessing as mp

    from pyro_seq.train.distributed import free_port

    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(_rank, nprocs=2, args=(free_port(), str(out)), join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.parametrize("name", ["dmm", "srnn"])
def test_summed_shard_gradients_equal_the_whole_batch_gradient(two_ranks, name):
    """The ELBO of a minibatch is a sum over its sequences, so with each sequence's noise
    fixed, grad(sum over all rows) = grad(rank 0's rows) + grad(rank 1's rows), whatever the
    rows' order, batching or padding."""
    value, reference = _gradients(name, list(range(BATCH)))
    for rank in (0, 1):
        rank_value, grads = two_ranks[rank][name]
        assert abs(rank_value - value) <= 1e-10 * abs(value), (rank, rank_value, value)
        assert sorted(grads) == sorted(reference)
        for n, g in reference.items():
            assert g is not None and grads[n] is not None, n
            scale = max(float(g.abs().max()), 1e-300)
            assert float((grads[n] - g).abs().max()) <= 1e-10 * scale, (rank, n)
    # the test can tell: every parameter has a gradient, and they are not all zero
    assert sum(float(g.abs().sum()) for g in reference.values()) > 1e-3


def test_a_parameter_touched_by_some_ranks_gets_their_sum_and_none_stays_none(two_ranks):
    for rank in (0, 1):
        grads = two_ranks[rank]["partial"]
        assert torch.equal(grads["a"], torch.full((2,), 3.0, dtype=torch.float64))  # 1 + 2
        assert torch.equal(grads["b"], torch.full((2,), 3.0, dtype=torch.float64))  # 0 + 3
        assert grads["c"] is None
