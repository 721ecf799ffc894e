r"""The inputs of the GTM-SM (:mod:`pyro_seq.models.gtmsm`; thesis Ch. 7, Fraccaro et al.
2018): the actions (int indices or one-hot vectors, given as ``inputs=`` or packed into ``x``),
the length ``tau`` of the memorisation phase (thesis 7.3) and its checks, the padding of a batch
without a prediction step, and the program (:class:`ActionProgram`) that applies them before
the model and the guide run.

:class:`~pyro_seq.models.gtmsm.GTMSM` inherits :class:`GTMSMInputs`.
"""

from typing import Optional, Tuple, Union, cast

import torch
import torch.nn as nn

from pyro_seq.models.base import StepProgram
from pyro_seq.ops.state import SequenceState

__all__ = ["ActionProgram", "GTMSMInputs", "NEIGHBOUR_WARMUP_EPOCHS"]

#: Epochs of the default neighbour warm-up (``neighbour_warmup="all"``: ``(tau, 20)``).
NEIGHBOUR_WARMUP_EPOCHS = 20


class ActionProgram(StepProgram):
    """The GTM-SM's programs: int action indices ``(batch, T)`` become one-hot ``inputs``;
    ``observed=`` is refused (missing frames in the memory are not modelled); a batch with
    ``T <= tau`` is padded to ``tau + 1`` masked steps
    (:meth:`~pyro_seq.models.gtmsm.GTMSM.pad_short_batch`)."""

    def _validate(self, state, x, mask, observed, inputs=None):
        owner = self._owner
        if observed is not None:
            raise ValueError(
                "GTMSM does not take observed= (missing frames are not modelled: "
                "every memorisation step writes its frame into the memory)"
            )
        if torch.is_tensor(inputs) and not inputs.is_floating_point() and owner.input_dim:
            inputs = owner.one_hot(inputs)
        x, mask = super()._validate(state, x, mask, observed, inputs)
        return owner.pad_short_batch(state, x, mask)


class GTMSMInputs:
    """The GTM-SM's actions and memorisation length ``tau``, a part of
    :class:`~pyro_seq.models.gtmsm.GTMSM` (whose constructor sets ``tau`` and the sizes)."""

    # set by GTMSM's constructor
    num_actions: int
    frame_dim: int
    pack_actions: bool
    num_neighbours: int
    neighbour_warmup: Union[str, Tuple[int, int], None]
    s0: torch.Tensor
    _tau: int

    def one_hot(self, actions: torch.Tensor) -> torch.Tensor:
        """Int action indices ``(batch, T)`` -> float one-hot ``(batch, T, num_actions)``.

        :raises ValueError: not 2-D, or an index outside ``0..num_actions-1``.
        """
        if actions.dtype == torch.bool or actions.dim() != 2:
            raise ValueError(
                f"integer actions must be indices of shape (batch, T), got "
                f"{actions.dtype} {tuple(actions.shape)}"
            )
        bad = (actions < 0) | (actions >= self.num_actions)
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"action index {int(actions[b, t])} at sequence {b}, step {t} is "
                f"outside 0..{self.num_actions - 1}"
            )
        dtype = self.s0.dtype
        return nn.functional.one_hot(actions.long(), self.num_actions).to(dtype)

    @property
    def tau(self) -> int:
        """Memorisation steps (a positive int; set it with ``model.tau = ...``)."""
        return self._tau

    @tau.setter
    def tau(self, tau: int) -> None:
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ValueError(f"tau must be a positive int (memorisation steps), got {tau!r}")
        self._tau = tau

    def neighbour_schedule(self) -> Optional[Tuple[int, int]]:
        """``(K_0, epochs)`` of the neighbour warm-up now: ``neighbour_warmup`` as given, or for
        ``"all"`` ``(tau, NEIGHBOUR_WARMUP_EPOCHS)`` with the current ``tau`` (every memorised
        entry at first); None: no warm-up."""
        if self.neighbour_warmup == "all":
            return (self.tau, NEIGHBOUR_WARMUP_EPOCHS)
        return cast(Optional[Tuple[int, int]], self.neighbour_warmup)

    def check_tau(self, num_steps: Optional[int] = None, tau: Optional[int] = None) -> int:
        """``tau`` (the attribute when None) as an int with ``1 <= tau`` and, when
        ``num_steps`` is given, ``tau < num_steps``.

        The memory holds exactly ``tau`` entries (one per memorised step; a :class:`DND` has no
        other capacity), so ``num_neighbours`` and the first ``K`` of ``neighbour_warmup`` must
        not exceed it: a mixture over more neighbours than entries would silently read fewer.
        (``landmark_neighbours`` may: the reversed memory grows from empty and its unfilled
        slots are masked by design,
        :meth:`~pyro_seq.models.gtmsm_parts.GTMSMMemories.landmark_merge`.)
        Checked at construction and on every call (``tau`` may be set later, and
        :meth:`~pyro_seq.models.gtmsm.GTMSM.predict` takes its own).

        :raises ValueError: a bad ``tau``, ``K > tau``, or ``tau >= num_steps``.
        :returns: ``tau``.
        """
        tau = self.tau if tau is None else tau
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            raise ValueError(f"tau must be a positive int (memorisation steps), got {tau!r}")
        for name, k in (
            ("num_neighbours", self.num_neighbours),
            ("neighbour_warmup K_0", (self.neighbour_schedule() or (0, 0))[0]),
        ):
            if k > tau:
                raise ValueError(
                    f"{name}={k} exceeds the memory: it holds tau={tau} entries "
                    f"(one per memorised step); use {name} <= tau"
                )
        if num_steps is None:
            return tau
        if tau >= num_steps:
            raise ValueError(
                f"tau={tau} memorisation steps leave no prediction step in "
                f"sequences of T={num_steps} steps; use T > tau"
            )
        return tau

    def pad_short_batch(
        self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """A batch with no prediction step (``T <= tau``: every sequence no longer than
        ``tau``) padded to ``tau + 1`` steps that the mask leaves out (zero frames, zero
        actions; ``state.shared["inputs"]`` too). Such sequences contribute nothing (module
        docstring), so such a batch, or a data-parallel shard of them, gives a bound of exactly
        0 whose graph reaches the same parameters as any other batch, with zero gradients
        (drivers that step only through the caller's ``T``, such as FIVO, see no site: 0 and no
        gradient). Other batches are returned as they are.

        :returns: ``(x, mask)``, ``(batch, max(T, tau + 1), D)`` and ``(batch, max(T, tau + 1))``.
        """
        tau = self.check_tau()
        T = x.shape[1]
        if T > tau:
            return x, mask
        pad = tau + 1 - T
        x = nn.functional.pad(x, (0, 0, 0, pad))
        mask = nn.functional.pad(mask, (0, pad), value=False)
        if state.shared.get("inputs") is not None:
            state.shared["inputs"] = nn.functional.pad(state.shared["inputs"], (0, 0, 0, pad))
        return x, mask

    def _split(self, state, x):
        """``(frames (batch, T, F), actions (batch, T, num_actions))`` of a program's input."""
        frames = x[..., : self.frame_dim]
        if self.pack_actions:
            return frames, x[..., self.frame_dim :]
        return frames, state.shared["inputs"]
