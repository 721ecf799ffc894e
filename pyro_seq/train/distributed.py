"""Data-parallel SVI on ``torch.distributed``: one process per shard of every minibatch.

Every rank holds the same model (the parent's, pickled to each process), the same minibatches
(:class:`~pyro_seq.data.SequenceLoader` with the same seed) and takes the rows ``rank::N`` of each.
The objectives of this package sum over the sequences of a batch, so the full batch's gradient
is the **sum** of the ranks' gradients: :class:`AllReduceGradients` wraps the objective, and after
its ``loss_and_grads`` sums the gradients of every parameter in Pyro's param store with one
bucketed all-reduce (one flat tensor, names in sorted order) and returns the summed loss (for
contrastive divergence, whose value is a mean per visible element, the mean over all ranks'
elements). Every rank then takes the same optimizer step, so the parameters stay identical
without broadcasts. Free bits (``TrainConfig.free_bits``) is refused with more than one process:
it clamps each group's KL summed over the whole minibatch, which is no sum over sequences.
A rank whose shard is empty (a last batch smaller than N) contributes zero gradients.

The wrapper, not DDP: Pyro's parameters live in its global param store and are created lazily,
and the objectives (IWAE, FIVO, contrastive divergence) run several forward passes per update,
so there is no single ``forward`` for DDP to hook. Validation is sharded the same way and its
sums all-reduced, so every rank sees the same validation bound and takes the same schedule and
early-stopping decisions. Rank 0 alone writes checkpoints, logs and progress bars; each rank's
random-number state is gathered into the checkpoint so that a resumed run continues every rank's
stream (resuming needs the same number of processes).

Devices and backends: with ``TrainConfig.device = "cpu"`` the ranks use ``gloo`` (the tests
run it); with ``"cuda"`` (``"cuda:N"``) rank ``r`` trains on ``cuda:r`` (``cuda:N+r``) and the
ranks use ``nccl``, every collective on tensors of that device. The backend follows the
training device, not what the machine has: CPU training on a CUDA machine still uses ``gloo``
(nccl cannot reduce CPU tensors). Each rank's CUDA generator state is gathered into the
checkpoint as well (``extra["cuda_rng_states"]``). A rank that dies makes the
others fail at their next collective operation, or after ``TrainConfig.dist_timeout`` seconds at
the latest; :func:`torch.multiprocessing.spawn` then stops the remaining processes and
:func:`pyro_seq.train.fit` raises a ``RuntimeError`` naming the rank.
"""

import os
import socket
from datetime import timedelta

import pyro
import torch
import torch.distributed as dist

__all__ = ["AllReduceGradients", "ProcessGroup", "SingleProcess", "default_backend", "free_port",
           "rank_device"]


class SingleProcess:
    """The trivial communicator of an ordinary (one-process) run."""

    rank, world_size, is_main = 0, 1, True
    device = torch.device("cpu")

    def shard(self, x, mask):
        return x, mask

    def shard_list(self, sequences):
        return sequences

    def all_sum(self, values):
        """Sum floats over ranks (identity here)."""
        return list(values)

    def any(self, flag):
        return bool(flag)

    def gather_rng_states(self):
        return None

    def gather_cuda_rng_states(self):
        return None

    def barrier(self):
        pass


class ProcessGroup(SingleProcess):
    """Rank ``rank`` of ``world_size`` processes in the default ``torch.distributed`` group,
    training on ``device`` (where its collective operations run: nccl needs CUDA tensors)."""

    def __init__(self, rank, world_size, device=None):
        self.rank, self.world_size, self.is_main = rank, world_size, rank == 0
        self.device = torch.device("cpu") if device is None else torch.device(device)

    def shard(self, x, mask):
        """This rank's rows ``rank::N``, cut to their own longest sequence (padded steps score
        exactly 0, so only the padding work changes)."""
        x, mask = x[self.rank::self.world_size], mask[self.rank::self.world_size]
        if mask.shape[0]:
            length = int(mask.sum(-1).max())
            x, mask = x[:, :max(length, 1)], mask[:, :max(length, 1)]
        return x, mask

    def shard_list(self, sequences):
        return sequences[self.rank::self.world_size]

    def all_sum(self, values):
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def any(self, flag):
        return self.all_sum([1.0 if flag else 0.0])[0] > 0

    def gather_rng_states(self):
        states = [None] * self.world_size
        dist.all_gather_object(states, torch.get_rng_state())
        return states

    def gather_cuda_rng_states(self):
        """Every rank's CUDA generator state (of its own device), or None on CPU."""
        if self.device.type != "cuda":
            return None
        states = [None] * self.world_size
        dist.all_gather_object(states, torch.cuda.get_rng_state(self.device))
        return states

    def barrier(self):
        dist.barrier()


class AllReduceGradients:
    """Wrap a Pyro objective so that ``loss_and_grads`` sums gradients and loss over ranks.

    Every parameter of Pyro's param store is touched with ``pyro.param`` inside the step, so
    ``SVI.step`` hands the optimizer the same set of parameters on every rank (a rank that saw
    an empty shard included). The loss returned is the sum over ranks; for an objective whose
    value is a mean (``returns_mean``, e.g. the monitor of
    :class:`~pyro_seq.infer.ContrastiveDivergence`, a mean over ``last_monitor_count``
    elements) it is the mean over all ranks' elements, as one process would report it.
    """

    def __init__(self, loss, comm):
        self.loss, self.comm = loss, comm

    def __getattr__(self, name):
        return getattr(self.loss, name)

    def loss_and_grads(self, model, guide, x, mask, *args, **kwargs):
        value, weight = 0.0, 0.0
        mean = getattr(self.loss, "returns_mean", False)
        if x.shape[0] > 0:
            value = self.loss.loss_and_grads(model, guide, x, mask, *args, **kwargs)
            weight = float(self.loss.last_monitor_count) if mean else 1.0
        store = pyro.get_param_store()
        names = sorted(store.keys())
        params = [pyro.param(name).unconstrained() for name in names]
        tail = [float(value) * weight if mean else float(value), weight]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params] + [torch.tensor(tail, dtype=params[0].dtype,
                                                           device=params[0].device)])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            grad = flat[offset:offset + n].view_as(p)
            if p.grad is None:
                p.grad = grad.clone()
            else:
                p.grad.copy_(grad)
            offset += n
        if mean:  # the ranks' means weighted by their element counts
            return float(flat[-2]) / max(float(flat[-1]), 1.0)
        return float(flat[-2])


def free_port():
    """A free TCP port on this host for the process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(device, rank):
    """The device of rank ``rank`` when training on ``device``: the CPU for every rank, or
    ``cuda:(N + rank)`` for ``cuda:N`` (``cuda`` counts as ``cuda:0``)."""
    device = torch.device(device)
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def default_backend(device):
    """``nccl`` for CUDA training, ``gloo`` for CPU training."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_process_group(rank, world_size, port, backend=None, timeout=120.0, device="cpu"):
    """Join the default process group as rank ``rank`` training on ``device`` (this rank's
    device, :func:`rank_device`); ``backend`` None: :func:`default_backend` of ``device``."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # nccl's collectives and barrier use the current device
    backend = backend or default_backend(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    return ProcessGroup(rank, world_size, device)
