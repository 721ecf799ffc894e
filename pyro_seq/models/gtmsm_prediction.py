r"""Long-term prediction with the GTM-SM (:mod:`pyro_seq.models.gtmsm`; thesis Ch. 7 and
Fig. 7.2d, Fraccaro et al. 2018): memorise the first ``tau`` frames, then generate the frames of
the later steps from the actions alone.

:class:`~pyro_seq.models.gtmsm.GTMSM` inherits :class:`GTMSMPrediction`.
"""

import math
from typing import TYPE_CHECKING, Dict, Optional, Tuple, Union

import pyro.distributions as dist
import torch

from pyro_seq.models.gtmsm_parts import GTMSMMemory
from pyro_seq.nn.memory import DND

__all__ = ["GTMSMPrediction"]


class GTMSMPrediction:
    """The GTM-SM's :meth:`predict`, a part of :class:`~pyro_seq.models.gtmsm.GTMSM`."""

    # set by GTMSM's constructor
    num_actions: int
    frame_dim: int
    num_neighbours: int
    inference: str
    r: float
    likelihood_name: str
    s0: torch.Tensor

    if TYPE_CHECKING:  # GTMSM's and its other parts' methods that predict uses

        def one_hot(self, actions: torch.Tensor) -> torch.Tensor: ...

        def check_tau(self, num_steps: Optional[int] = None, tau: Optional[int] = None) -> int: ...

        def memorise(
            self,
            frames: torch.Tensor,
            actions: torch.Tensor,
            codes: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        ) -> GTMSMMemory: ...

        def displacement_matrix(self) -> torch.Tensor: ...

        def transition_mean(
            self, s_prev: torch.Tensor, a: torch.Tensor, M: Optional[torch.Tensor] = None
        ) -> torch.Tensor: ...

        def memory_prior(
            self, s: torch.Tensor, dnd: DND, num_neighbours: Optional[int] = None
        ) -> dist.MixtureSameFamily: ...

        def decode(self, z: torch.Tensor) -> torch.Tensor: ...

    @torch.no_grad()
    def predict(
        self,
        frames: torch.Tensor,
        actions: torch.Tensor,
        tau: Optional[int] = None,
        sample_states: bool = False,
    ) -> Dict[str, torch.Tensor]:
        r"""Long-term prediction (thesis Fig. 7.2d): memorise ``frames[:, :tau]``, then generate
        the frames of the steps ``t > tau`` from the actions only.

        The states follow the noise-free transition ``E[s_t] = f(E[s_{t-1}], a_t)`` (or, with
        ``sample_states=True``, one ancestral sample of eq. 7.3 from ``p*(s_tau)``; with
        ``inference="landmark"`` the memorised states are the landmark network's and the start
        is ``N(E[s_tau], Var[s_tau])``), the
        encodings are the means of the memory prior, ``E[z_t | s_t, m] = sum_k w_k mu^(k)``, and
        the frames are decoded from them (Gaussian: the pixel means; Bernoulli: probabilities).

        :param frames: ``(batch, T, F)``.
        :param actions: int64 ``(batch, T)`` or float ``(batch, T, num_actions)``.
        :param int tau: memorisation steps (default ``self.tau``).
        :returns: dict with ``frames (batch, T - tau, F)``, ``z (batch, T - tau, z_dim)``,
            ``states (batch, T - tau, state_dim)`` and the memorised ``memory_states (batch,
            tau, state_dim)``.
        """
        if not actions.is_floating_point():
            actions = self.one_hot(actions)
        frames = frames.to(self.s0.dtype)
        if frames.dim() != 3 or frames.shape[-1] != self.frame_dim:
            raise ValueError(
                f"frames must be (batch, T, {self.frame_dim}), got {tuple(frames.shape)}"
            )
        if actions.shape != frames.shape[:2] + (self.num_actions,):
            raise ValueError(
                f"actions of shape {tuple(actions.shape)} do not match frames {tuple(frames.shape)}"
            )
        tau = self.check_tau(frames.shape[1], tau)
        memory = self.memorise(frames[:, :tau], actions[:, :tau])
        dnd, means = memory.memory, memory.means
        s = means[:, -1]
        if self.inference == "landmark":
            first_scale: Union[torch.Tensor, float] = (memory.variances[:, -1] + self.r**2).sqrt()
        else:
            first_scale = self.r * math.sqrt(tau + 1)
        states, zs, M = [], [], self.displacement_matrix()
        for i, a in enumerate(actions[:, tau:].unbind(1)):
            loc = self.transition_mean(s, a, M)
            if sample_states:
                scale = first_scale if i == 0 else self.r
                loc = loc + scale * torch.randn_like(loc)
            s = loc
            prior = self.memory_prior(s, dnd, self.num_neighbours)
            w = prior.mixture_distribution.probs
            zs.append((w.unsqueeze(-1) * prior.component_distribution.base_dist.loc).sum(-2))
            states.append(s)
        z = torch.stack(zs, 1)
        out = self.decode(z)
        if self.likelihood_name == "bernoulli":
            out = torch.sigmoid(out)
        return {"frames": out, "z": z, "states": torch.stack(states, 1), "memory_states": means}
