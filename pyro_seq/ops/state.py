"""The resamplable state of a sequence model's step protocol.

A :class:`SequenceState` is what ``init(state, x, mask)`` fills and ``step(state, t, x, mask)``
reads and updates (see :mod:`pyro_seq.models.base`). It is a ``dict`` of *per-particle* tensors
plus a ``shared`` dict of tensors that are the same for every particle (for example the
deterministic RNN states ``d_{1:T}`` of an SRNN, or the backward-RNN states ``a_{1:T}`` of a
smoothing guide).

Shapes: a per-particle tensor has shape ``(*particle_shape, batch, ...)``; without particles
``particle_shape`` is empty. An inference algorithm that resamples (FIVO, particle filters)
gathers every per-particle tensor along the particle dimension with :meth:`SequenceState.resample` and leaves
``shared`` untouched. Everything a step needs from the past lives here, never in closures.
"""

import torch


class SequenceState(dict):
    """Dict of per-particle tensors; ``.shared`` holds particle-independent tensors."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shared = {}
        #: emission features collected by a full-sequence model run (None = observe at once)
        self.deferred_features = None
        #: latent values fixed by an enclosing replay (time-parallel scoring), name -> T tensors
        self.replayed = None
        #: a :class:`~pyro_seq.models.base.GuideRecord`: written by a full-sequence guide run,
        #: read by the model replayed against that guide's trace (None otherwise)
        self.guide_record = None
        self._steps = {}

    def shared_at(self, key, t):
        """``shared[key]`` at step ``t`` (time at dim -2): ``(..., F)``, or ``(..., T, F)`` for a slice.

        Per-step reads go through one cached :func:`torch.unbind`: indexing ``value[:, t]`` at
        every step would make each step's backward allocate and fill a gradient the size of the
        whole sequence (quadratic in ``T``); the gradient of ``unbind`` is one ``stack``.
        """
        value = self.shared[key]
        if isinstance(t, slice):
            return value[..., t, :]
        steps = self._steps.get(key)
        if steps is None or steps[0] is not value:
            steps = self._steps[key] = (value, value.unbind(-2))
        return steps[1][t]

    def resample(self, ancestors):
        """Replace every per-particle tensor by its ancestors' values, in place.

        :param torch.LongTensor ancestors: shape ``(K, batch)``; entry ``[k, b]`` is the index
            of the particle that particle ``k`` of sequence ``b`` descends from. Per-particle
            tensors have shape ``(K, batch, ...)`` (or ``(1, batch, ...)``, broadcast).

        Ancestor indices are integers: no gradient flows through them.
        """
        for key, value in list(self.items()):
            if not torch.is_tensor(value):
                raise TypeError(f"state[{key!r}] is {type(value).__name__}, expected a tensor")
            self[key] = gather_particles(value, ancestors)
        return self


def gather_particles(value, ancestors):
    """``out[k, b, ...] = value[ancestors[k, b], b, ...]``.

    :param torch.Tensor value: ``(K, batch, *rest)``; a size-1 particle axis broadcasts.
    :param torch.LongTensor ancestors: ``(K, batch)``.
    :returns: tensor of shape ``(K, batch, *rest)``.
    """
    if value.dim() < 2:
        raise ValueError(
            f"a per-particle state tensor needs (particles, batch, ...) dims, got {tuple(value.shape)}"
        )
    shape = (ancestors.shape[0],) + tuple(value.shape[1:])
    idx = ancestors.reshape(ancestors.shape + (1,) * (value.dim() - 2)).expand(shape)
    source = value.expand(shape) if value.shape[0] == 1 else value
    return torch.gather(source, 0, idx)
