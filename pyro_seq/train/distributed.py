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
A parameter that no rank's objective touched keeps ``grad = None`` after the all-reduce (the
optimizer then leaves it and its state alone, as one process would: e.g. the KVAE's frozen
dynamics network during its warm-up); one touched by some ranks gets the sum of theirs, the
others counting zero.

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

Launched processes (``torchrun``, or any launcher that sets the same variables): when the
environment holds ``RANK`` and ``WORLD_SIZE``, :func:`pyro_seq.train.fit` spawns nothing; every
launched process is one rank and joins the group that ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` describe (``init_method="env://"``,
:func:`launch_environment`, :func:`join_launched_group`). ``WORLD_SIZE`` is the number of
processes; ``TrainConfig.world_size`` may stay 1 or equal it (any other value is a
``ValueError``). Global rank r shards and seeds as spawned rank r does, so a launched run and a
spawned run with the same seed train to the same weights; on CUDA rank r trains on
``cuda:LOCAL_RANK`` (``cuda:K+LOCAL_RANK`` for ``device="cuda:K"``), one GPU per process of a
node. Before training the ranks check that they were given the same data and settings, every
rank takes rank 0's initial weights (a broadcast, as DDP does), and rank 0 checks that the
other ranks see the files it writes: ``out_dir`` must be on a file system that every node
reads, since every rank reads ``checkpoint.pt`` to resume and ``best.pt`` at the end. ``fit``
then returns on every rank, each holding the trained weights.
"""

import os
import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyro
import torch
import torch.distributed as dist

__all__ = [
    "AllReduceGradients",
    "Launch",
    "ProcessGroup",
    "SingleProcess",
    "check_launch",
    "default_backend",
    "free_port",
    "join_launched_group",
    "launch_environment",
    "rank_device",
]


class SingleProcess:
    """The trivial communicator of an ordinary (one-process) run."""

    rank, world_size, is_main = 0, 1, True
    device = torch.device("cpu")

    def shard(self, x, mask, inputs=None):
        return x, mask, inputs

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

    def shard(self, x, mask, inputs=None):
        """This rank's rows ``rank::N`` of ``x``, ``mask`` and ``inputs`` (None stays None), cut
        to their own longest sequence (padded steps score exactly 0, so only the padding work
        changes)."""
        rows = slice(self.rank, None, self.world_size)
        x, mask = x[rows], mask[rows]
        inputs = None if inputs is None else inputs[rows]
        if mask.shape[0]:
            length = max(int(mask.sum(-1).max()), 1)
            x, mask = x[:, :length], mask[:, :length]
            inputs = None if inputs is None else inputs[:, :length]
        return x, mask, inputs

    def shard_list(self, sequences):
        return sequences[self.rank :: self.world_size]

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
    an empty shard included); a gradient no rank computed stays None, one that some ranks
    computed is summed with the others' counting zero. The loss returned is the sum over
    ranks; for an objective whose value is a mean (``returns_mean``, e.g. the monitor of
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
        dtype, device = params[0].dtype, params[0].device
        # one flat tensor: the gradients (zeros for grad None), then per parameter 1 where this
        # rank has a gradient, then the loss and its weight
        touched = torch.tensor(
            [float(p.grad is not None) for p in params], dtype=dtype, device=device
        )
        tail = torch.tensor(
            [float(value) * weight if mean else float(value), weight], dtype=dtype, device=device
        )
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
            + [touched, tail]
        )
        dist.all_reduce(flat)
        offset = sum(p.numel() for p in params)
        touched_by = flat[offset : offset + len(params)].tolist()  # ranks with a gradient
        offset = 0
        for p, count in zip(params, touched_by):
            n = p.numel()
            if count > 0:  # else no rank touched it: grad stays None (None here too)
                grad = flat[offset : offset + n].view_as(p)
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
    dist.init_process_group(
        backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout)
    )
    return ProcessGroup(rank, world_size, device)


@dataclass(frozen=True)
class Launch:
    """This process's place in a group started by a launcher (``torchrun``): global ``rank`` of
    ``world_size``, ``local_rank`` on its node, and the rendezvous ``master_addr:master_port``
    (the address and port of rank 0's store)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def _env_int(env, name, default=None):
    value = env.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={value!r} must be an integer (torchrun "
            f"sets it; unset it to train in one process)"
        ) from None


def launch_environment(environ=None):
    """The :class:`Launch` that the environment describes, or None outside a launcher.

    A process is launched when ``RANK`` and ``WORLD_SIZE`` are both set (``torchrun`` sets them
    with ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``). With more than one process the
    rendezvous variables ``MASTER_ADDR`` and ``MASTER_PORT`` must be set too; ``LOCAL_RANK``
    defaults to 0.

    :param dict environ: the variables (default :data:`os.environ`).
    :raises ValueError: a variable is missing or not an integer, or ``RANK`` is not in
        ``[0, WORLD_SIZE)``.
    """
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    rank, world_size = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    local_rank = _env_int(env, "LOCAL_RANK", 0)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"environment variables RANK={rank} and WORLD_SIZE={world_size}: RANK "
            "must be in [0, WORLD_SIZE) and WORLD_SIZE >= 1; launch with torchrun "
            "or unset both to train in one process"
        )
    if local_rank < 0:
        raise ValueError(f"environment variable LOCAL_RANK={local_rank} must be >= 0")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if world_size > 1 and missing:
        raise ValueError(
            f"RANK and WORLD_SIZE={world_size} are set but {' and '.join(missing)} "
            "is not: set the address and port of rank 0's rendezvous (torchrun's "
            "--master-addr/--master-port or --rdzv-endpoint do)"
        )
    return Launch(
        rank,
        world_size,
        local_rank,
        env.get("MASTER_ADDR", "127.0.0.1"),
        _env_int(env, "MASTER_PORT", 0),
    )


def check_launch(config, launch):
    """Refuse a :class:`~pyro_seq.train.TrainConfig` that contradicts the launcher: its
    ``world_size`` must be 1 (the default: the launcher's count is used) or ``WORLD_SIZE``;
    free bits needs one process (see the module docstring); on CUDA, ``cuda:K+LOCAL_RANK``
    must exist on this node. Raises ``ValueError``."""
    if config.world_size not in (1, launch.world_size):
        raise ValueError(
            f"TrainConfig.world_size={config.world_size} (--nproc) but the launcher "
            f"started WORLD_SIZE={launch.world_size} processes; leave world_size at 1 "
            f"(the launcher's count is used) or set it to {launch.world_size}"
        )
    if launch.world_size > 1 and config.free_bits > 0:
        raise ValueError(
            f"free_bits={config.free_bits} with WORLD_SIZE={launch.world_size}: free bits clamps "
            "each group's KL summed over the whole minibatch, and each rank would clamp its own "
            "shard instead (a different objective); train with free bits in one process"
        )
    device = torch.device(config.device)
    if device.type == "cuda":
        mine = rank_device(device, launch.local_rank)
        if mine.index >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={launch.local_rank} on device {config.device!r} needs "
                f"{mine} (one GPU per process of a node), but this node has "
                f"{torch.cuda.device_count()} CUDA device(s); start at most that "
                "many processes per node (torchrun --nproc-per-node)"
            )


def join_launched_group(launch, device, backend=None, timeout=120.0):
    """Join the default process group of ``launch`` (``init_method="env://"``) training on
    ``device`` (``rank_device(device, launch.local_rank)``). A group that this process has
    already joined (``torch.distributed.is_initialized()``: an earlier :func:`~pyro_seq.train.fit`, or the
    caller's own ``init_process_group``) is used as it is, after checking its rank and size.

    :returns: ``(comm, joined)``: the :class:`ProcessGroup` of this rank, and whether this call
        joined the group (then the caller leaves it with ``destroy_process_group`` when done).
    """
    device = rank_device(device, launch.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # nccl's collectives and barrier use the current device
    joined = not dist.is_initialized()
    if not joined:
        rank, size = dist.get_rank(), dist.get_world_size()
        if (rank, size) != (launch.rank, launch.world_size):
            raise ValueError(
                f"the process group already joined has rank {rank} of {size}, but "
                f"the environment says RANK={launch.rank} of "
                f"WORLD_SIZE={launch.world_size}"
            )
    else:
        dist.init_process_group(
            backend or default_backend(device),
            init_method="env://",
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=timedelta(seconds=timeout),
        )
    return ProcessGroup(launch.rank, launch.world_size, device), joined


def _data_summary(sequences):
    """``(count, elements, sum)`` of a list of tensors: equal lists give equal summaries."""
    return (
        len(sequences),
        sum(int(s.numel()) for s in sequences),
        float(sum(float(s.double().sum()) for s in sequences)),
    )


def check_same_run(comm, train_sequences, valid_sequences, settings):
    """Raise ``ValueError`` on every rank unless all ranks hold the same training and
    validation data (count, elements, sum) and the same ``settings`` (a dict): launched
    processes each load their own, and ranks with different numbers of minibatches would wait
    for each other until ``dist_timeout``."""
    mine = {
        "train": _data_summary(train_sequences),
        "valid": _data_summary(valid_sequences),
        **settings,
    }
    everyone = [None] * comm.world_size
    dist.all_gather_object(everyone, mine)
    for rank, theirs in enumerate(everyone):
        for key in mine:
            if theirs.get(key) != everyone[0].get(key):
                raise ValueError(
                    f"rank {rank} has {key}={theirs.get(key)!r} but rank 0 has "
                    f"{everyone[0].get(key)!r}: every launched process must call fit with the "
                    "same data (train/valid: count, elements, sum) and the same TrainConfig"
                )


def broadcast_weights(comm, model):
    """Give every rank rank 0's parameters and buffers (in place)."""
    state = [{k: v.detach().cpu() for k, v in model.state_dict().items()} if comm.is_main else None]
    dist.broadcast_object_list(state, src=0, device=comm.device)
    if not comm.is_main:
        model.load_state_dict(state[0])


def check_shared_folder(comm, out_dir):
    """Raise ``RuntimeError`` on every rank unless every rank sees a file that rank 0 writes
    into ``out_dir`` (a file system that all nodes read: resuming and the end of training read
    rank 0's ``checkpoint.pt`` and ``best.pt`` on every rank)."""
    token = [uuid.uuid4().hex if comm.is_main else None]
    dist.broadcast_object_list(token, src=0, device=comm.device)
    probe = Path(out_dir) / f".rank0-{token[0]}"
    if comm.is_main:
        probe.write_text("written by rank 0 of pyro_seq.train.fit\n")
    comm.barrier()
    sees = probe.exists()
    comm.barrier()
    if comm.is_main:
        probe.unlink()
    seen = [None] * comm.world_size
    dist.all_gather_object(seen, sees)
    blind = [rank for rank, ok in enumerate(seen) if not ok]
    if blind:
        raise RuntimeError(
            f"rank(s) {blind} do not see the files rank 0 writes in {out_dir}: "
            "give fit an output folder on a file system that every node reads "
            "(rank 0 writes the checkpoints there and every rank reads them)"
        )
