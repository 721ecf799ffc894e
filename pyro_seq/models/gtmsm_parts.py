r"""Building blocks of the GTM-SM (:mod:`pyro_seq.models.gtmsm`; thesis Ch. 7, Fraccaro et
al. 2018): its option names, the conformal displacement matrix, the memory tuple, and the two
halves of the model that :class:`~pyro_seq.models.gtmsm.GTMSM` inherits:

* :class:`GTMSMTransition`: the state-space transition of thesis eqs. 7.3-7.4, the
  displacement matrix ``M`` in its three forms (``displacements=``), the wall network and the
  mean path of the past encoder;
* :class:`GTMSMMemories`: the memory keys, the mixture prior read from the memory (thesis
  7.4.1), the past encoder (thesis 7.3.3) and the landmark network (thesis appendix 7.10) with
  its reversed DND.

The actions and the memorisation length are in :mod:`pyro_seq.models.gtmsm_inputs`
(:class:`~pyro_seq.models.gtmsm_inputs.ActionProgram`, still importable from here), the
long-term prediction in :mod:`pyro_seq.models.gtmsm_prediction`.

The equations are in the docstring of :mod:`pyro_seq.models.gtmsm`.
"""

import math
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Tuple

import pyro.distributions as dist
import torch
import torch.nn as nn

from pyro_seq.models.gtmsm_inputs import ActionProgram as ActionProgram
from pyro_seq.nn import MLP, cat_broadcast
from pyro_seq.nn.conv import FRAME_NETWORKS
from pyro_seq.nn.memory import DND, nearest_earlier
from pyro_seq.ops.linalg import broadcast_shapes

__all__ = [
    "ActionProgram",
    "GTMSMMemories",
    "GTMSMMemory",
    "GTMSMTransition",
    "conformal_matrix",
    "warmup_value",
]

#: Frame encoders/decoders of :class:`~pyro_seq.models.gtmsm.GTMSM` (``encoder=``); the
#: thesis found MLPs enough.
ENCODERS = FRAME_NETWORKS
#: Pixel likelihoods of :class:`~pyro_seq.models.gtmsm.GTMSM` (``likelihood=``).
LIKELIHOODS = ("gaussian", "bernoulli")
#: Inference networks for the states of :class:`~pyro_seq.models.gtmsm.GTMSM` (``inference=``):
#: the prior transition (thesis eq. 7.2) or the landmark network of thesis appendix 7.10.
INFERENCES = ("prior", "landmark")
#: Parametrisations of the displacement matrix ``M`` of :class:`~pyro_seq.models.gtmsm.GTMSM`
#: (``displacements=``).
DISPLACEMENTS = ("free", "conformal", "inverse_pairs")


def warmup_value(epoch: int, start: Optional[float], epochs: int, final: float) -> float:
    """A geometric warm-up: ``start`` at ``epoch`` 0 to ``final`` at ``epochs`` and after
    (``start=None``: ``final`` throughout)."""
    if start is None or epoch >= epochs:
        return final
    return start * (final / start) ** (epoch / epochs)


def conformal_matrix(direction: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    r"""``M = exp(log_scale) Q^T`` with ``Q`` the orthonormal factor of ``direction^T = Q R``
    (signs fixed by ``diag R >= 0``, so ``Q`` is Gram-Schmidt's and varies smoothly):
    ``(S, A)`` with orthogonal rows of equal norm, ``M M^T = exp(2 log_scale) I``.

    :param direction: ``(S, A)`` with ``S <= A`` and full row rank.
    :param log_scale: scalar tensor.
    """
    q, r = torch.linalg.qr(direction.T)
    sign = torch.where(torch.diagonal(r) >= 0, 1.0, -1.0).to(q.dtype)
    return log_scale.exp() * (q * sign).T


class GTMSMMemory(NamedTuple):
    """What the past encoder (:meth:`GTMSMMemories.memorise`) computes from the memorisation
    phase.

    * ``memory``: the :class:`~pyro_seq.nn.DND` of the generative model, keys ``key(E[s_t])``
      ``(batch, tau, key_dim)``, values ``stack([mu_phi(x_t), sigma_phi(x_t)])`` ``(batch, tau,
      2, z_dim)``;
    * ``reversed``: the reversed DND of the landmark network (thesis appendix 7.10), keys
      ``mu_phi(x_t)`` ``(batch, tau, z_dim)``, values ``stack([E[s_t], Var[s_t]])`` ``(batch,
      tau, 2, state_dim)``; None with ``inference="prior"``;
    * ``means``, ``variances``: ``E[s_t]`` and the diagonal ``Var[s_t]``, ``(batch, tau,
      state_dim)``.
    """

    memory: DND
    reversed: Optional[DND]
    means: torch.Tensor
    variances: torch.Tensor


class GTMSMTransition:
    """The GTM-SM's transition ``p(s_t | s_{t-1}, a_t)`` (thesis eqs. 7.3-7.4), a part of
    :class:`~pyro_seq.models.gtmsm.GTMSM` (which builds ``M``'s parameters and the wall
    network ``wall_net``)."""

    # set by GTMSM's constructor
    displacements: str
    num_actions: int
    state_dim: int
    rotation: bool
    inverse_actions: Tuple[Tuple[int, ...], ...]
    other_actions: List[int]
    M: torch.Tensor
    M_pairs: torch.Tensor
    M_other: torch.Tensor
    M_direction: torch.Tensor
    M_log_scale: torch.Tensor
    s0: torch.Tensor
    wall_net: Optional[MLP]

    def displacement_matrix(self) -> torch.Tensor:
        r"""``M`` of eq. 7.3, ``(state_dim, num_actions)``: the parameter ``M`` (``displacements=
        "free"``), ``exp(M_log_scale) Q^T`` from ``M_direction`` (``"conformal"``), or the
        columns ``M_pairs`` and their negatives beside ``M_other`` (``"inverse_pairs"``).

        Why the conformal form exists: the objective depends on a free ``M`` only through
        distances between states, ``s_t - s_i = M (c_t - c_i)`` with ``c`` the counts of each
        action (no walls, noise aside), so its gradient is ``sum g_ti M (c_t - c_i) (c_t -
        c_i)^T = M G``: every row of ``M`` is driven by the same ``num_actions x num_actions``
        matrix ``G``, as in a power iteration, and the rows align with its leading eigenvector.
        Trained on image navigation, a free ``M`` settles with all moves on one axis
        (``benchmarks/gtmsm_learning.py``); a conformal one cannot.
        """
        if self.displacements == "free":
            return self.M
        if self.displacements == "inverse_pairs":
            columns: List[Optional[torch.Tensor]] = [None] * self.num_actions
            for k, (i, j) in enumerate(self.inverse_actions):
                columns[i], columns[j] = self.M_pairs[:, k], -self.M_pairs[:, k]
            for k, a in enumerate(self.other_actions):
                columns[a] = self.M_other[:, k]
            # every column is set: the pairs and the other actions cover 0..num_actions-1
            return torch.stack(columns, 1)  # type: ignore[arg-type]
        return conformal_matrix(self.M_direction, self.M_log_scale)

    @torch.no_grad()
    def set_displacement_matrix(self, M: torch.Tensor) -> None:
        """Set ``M`` (``(state_dim, num_actions)``), e.g. to the true displacements.

        :raises ValueError: wrong shape; with ``displacements="conformal"``, an ``M`` whose rows
            are not orthogonal with equal norms (relative tolerance 1e-5); with
            ``"inverse_pairs"``, one whose paired columns are not opposite (tolerance 1e-6).
        """
        M = torch.as_tensor(M, dtype=self.s0.dtype, device=self.s0.device)
        if M.shape != (self.state_dim, self.num_actions):
            raise ValueError(
                f"M must be ({self.state_dim}, {self.num_actions}), got {tuple(M.shape)}"
            )
        if self.displacements == "free":
            self.M.copy_(M)
            return
        if self.displacements == "inverse_pairs":
            for i, j in self.inverse_actions:
                if not torch.allclose(M[:, j], -M[:, i], rtol=0, atol=1e-6):
                    raise ValueError(
                        f"inverse_pairs: column {j} of M must be minus column {i}, "
                        f"got {M[:, i].tolist()} and {M[:, j].tolist()}"
                    )
            self.M_pairs.copy_(M[:, [i for i, _ in self.inverse_actions]])
            self.M_other.copy_(M[:, self.other_actions])
            return
        gram = M @ M.T
        scale2 = torch.diagonal(gram).mean()
        if not (
            scale2 > 0
            and torch.allclose(
                gram,
                scale2 * torch.eye(self.state_dim, dtype=M.dtype, device=M.device),
                rtol=0,
                atol=1e-5 * float(scale2),
            )
        ):
            raise ValueError(
                "a conformal M needs orthogonal rows of equal norm (M M^T = "
                f"alpha^2 I), got M M^T = {gram.tolist()}"
            )
        self.M_direction.copy_(M)
        self.M_log_scale.copy_(0.5 * scale2.log())

    def displacement(
        self, s_prev: torch.Tensor, a: torch.Tensor, M: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``M a_t`` (eq. 7.3), turned by ``R(s^{(3)}_{t-1})`` with ``rotation=True`` (eq. 7.4):
        ``(..., state_dim)`` from ``s_prev (..., state_dim)`` and ``a (..., num_actions)``.
        ``M``: :meth:`displacement_matrix` (computed here when None; loops pass it once)."""
        d = a @ (self.displacement_matrix() if M is None else M).T
        if self.rotation:
            d = d.expand(broadcast_shapes(d.shape, s_prev.shape))
            c, s = torch.cos(s_prev[..., 2]), torch.sin(s_prev[..., 2])
            d = torch.stack(
                [c * d[..., 0] - s * d[..., 1], s * d[..., 0] + c * d[..., 1], d[..., 2]], -1
            )
        return d

    def transition_mean(
        self, s_prev: torch.Tensor, a: torch.Tensor, M: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``f(s_{t-1}, a_t) = s_{t-1} + d_t sigma_d(s_{t-1} + d_t)`` (eq. 7.3; without walls
        ``s_{t-1} + d_t``), ``d_t`` from :meth:`displacement` (``M`` as there). Shapes broadcast:
        ``(..., state_dim)``."""
        d = self.displacement(s_prev, a, M)
        if self.wall_net is not None:
            d = d * torch.sigmoid(self.wall_net(s_prev + d))
        return s_prev + d

    def mean_path(
        self, actions: torch.Tensor, s_start: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``E[s_t] = f(E[s_{t-1}], a_t)`` for every step of ``actions (batch, n,
        num_actions)``, from ``s_start`` (default ``s_0 = 0``): ``(batch, n, state_dim)``."""
        s = self.s0.expand(actions.shape[:1] + (self.state_dim,)) if s_start is None else s_start
        out, M = [], self.displacement_matrix()
        for a in actions.unbind(1):
            s = self.transition_mean(s, a, M)
            out.append(s)
        return torch.stack(out, 1)


class GTMSMMemories:
    """The GTM-SM's memories: the keys and the past encoder (thesis 7.3.3), and the landmark
    network with its reversed DND (thesis appendix 7.10), a part of
    :class:`~pyro_seq.models.gtmsm.GTMSM` (which builds ``landmark_beta`` and
    ``landmark_var``)."""

    # set by GTMSM's constructor
    rotation: bool
    inference: str
    state_dim: int
    z_dim: int
    key_dim: int
    r: float
    landmark_neighbours: int
    landmark_beta: Optional[MLP]
    landmark_var: Optional[MLP]
    s0: torch.Tensor
    delta: float
    num_neighbours: int
    warmup_epoch: int
    training: bool

    if TYPE_CHECKING:  # GTMSM's and GTMSMTransition's methods that these use

        def encode(self, frames: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]: ...

        def displacement_matrix(self) -> torch.Tensor: ...

        def neighbour_schedule(self) -> Optional[Tuple[int, int]]: ...

        def transition_mean(
            self, s_prev: torch.Tensor, a: torch.Tensor, M: Optional[torch.Tensor] = None
        ) -> torch.Tensor: ...

        def mean_path(
            self, actions: torch.Tensor, s_start: Optional[torch.Tensor] = None
        ) -> torch.Tensor: ...

    def neighbours_now(self) -> int:
        """``K`` read by :meth:`memory_prior`: in training mode the warm-up's ``K`` of the
        epoch last given to :meth:`~pyro_seq.models.gtmsm.GTMSM.training_epoch` (0 before
        any), else ``num_neighbours``."""
        schedule = self.neighbour_schedule()
        if self.training and schedule is not None:
            start, epochs = schedule
            return int(round(warmup_value(self.warmup_epoch, start, epochs, self.num_neighbours)))
        return self.num_neighbours

    def memory_prior(
        self, s: torch.Tensor, dnd: DND, num_neighbours: Optional[int] = None
    ) -> dist.MixtureSameFamily:
        r"""``p(z_t | s_t, m)``: the mixture of :mod:`pyro_seq.models.gtmsm` from the ``K`` nearest
        entries of ``dnd`` to ``key(s)``; ``s (..., batch, state_dim)`` ->
        :class:`~pyro.distributions.MixtureSameFamily` with batch shape ``(..., batch)`` and
        event shape ``(z_dim,)``. The mixture logits are ``-log(d_k^2 + delta)``. ``K``:
        ``num_neighbours`` when given, else :meth:`neighbours_now`."""
        read = dnd.read(self.key(s), num_neighbours or self.neighbours_now())
        logits = -torch.log(read.squared_distances + self.delta)
        components = dist.Normal(read.values[..., 0, :], read.values[..., 1, :]).to_event(1)
        return dist.MixtureSameFamily(dist.Categorical(logits=logits), components)

    def key(self, s: torch.Tensor) -> torch.Tensor:
        """Memory key of a state: ``s`` itself, or ``[s1, s2, cos s3, sin s3]`` with rotation
        (thesis 7.7.2): ``(..., state_dim) -> (..., key_dim)``."""
        if not self.rotation:
            return s
        return torch.cat([s[..., :2], torch.cos(s[..., 2:3]), torch.sin(s[..., 2:3])], -1)

    def landmark_weights(self, distances: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``beta_k = sigmoid(g(delta^(k)))`` of :meth:`landmark_merge`, 0 at empty slots:
        ``distances (..., K')``, bool ``valid (..., K')`` -> ``(..., K')``."""
        if self.landmark_beta is None:
            raise RuntimeError("the landmark network needs GTMSM(inference='landmark')")
        w = valid.to(distances.dtype)
        return torch.sigmoid(self.landmark_beta((distances * w).unsqueeze(-1))).squeeze(-1) * w

    def landmark_merge(
        self,
        mu_p: torch.Tensor,
        var_p: torch.Tensor,
        distances: torch.Tensor,
        mu_k: torch.Tensor,
        var_k: torch.Tensor,
        valid: torch.Tensor,
        beta: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        r"""The landmark posterior's statistics (thesis appendix 7.10)::

            mu_q = mu_p + sum_k beta_k (mu_k - mu_p),       beta_k = sigmoid(g(delta^(k)))
            sigma_q^2 = sigma_p^2 exp(NN(delta^(1:K'), sigma^2_(1:K'), sigma_p^2))

        i.e. ``log sigma_q^2 = log sigma_p^2 + NN(...)``, as in the thesis. ``beta_k`` in
        ``[0, 1]`` is a network ``g`` (``landmark_beta``: one hidden layer, then a sigmoid) of the
        ``z``-space distance alone; ``NN`` (``landmark_var``, one hidden layer, one output per
        state dimension) reads ``[delta^(1:K'), log(sigma_k^2 / sigma_p^2), log(sigma_p^2 / r^2),
        valid^(1:K')]`` (the thesis' inputs, on log scales, and which slots hold a neighbour).
        The ``beta_k`` are not normalised: as written in the thesis, ``sum_k beta_k`` may exceed
        1 (the mean then moves past the retrieved means); ``g`` learns where that hurts.

        Slots that hold no neighbour (``valid`` False: the reversed memory has fewer than ``K'``
        entries) get ``beta_k = 0`` and are zeroed in ``NN``'s input; with no neighbour at all
        (an empty memory, ``t = 1``) ``NN`` is not applied and the result is the prior's
        statistics exactly: ``(mu_p, sigma_p^2)``.

        :param mu_p: ``(..., state_dim)``, the prior's mean ``f(s_{t-1}, a_t)``.
        :param var_p: ``(..., state_dim)``, the prior's (diagonal, positive) variance.
        :param distances: ``(..., K')`` ``delta^(k)``, distances in ``z``-space.
        :param mu_k: ``(..., K', state_dim)``, retrieved means.
        :param var_k: ``(..., K', state_dim)``, retrieved (positive) variances.
        :param valid: bool ``(..., K')``.
        :param beta: ``(..., K')``, :meth:`landmark_weights` of ``distances`` when already
            computed (they depend on the distances only: the memorisation phase computes them
            for all steps at once).
        :returns: ``(mu_q, var_q)``, each of the broadcast shape ``(..., state_dim)``. ``var_q``
            does not depend on ``mu_p``: pass ``var_p`` without the particle dims of ``mu_p`` and
            ``NN`` runs once per sequence (``var_q`` is then an expanded view).
        """
        if beta is None:
            beta = self.landmark_weights(distances, valid)
        w = valid.to(mu_p.dtype)
        distances = distances * w
        mu_q = mu_p + (beta.unsqueeze(-1) * (mu_k - mu_p.unsqueeze(-2))).sum(-2)
        log_var_p = var_p.log()
        ratio = (var_k.log() - log_var_p.unsqueeze(-2)) * w.unsqueeze(-1)
        features = cat_broadcast(
            [distances, ratio.flatten(-2), log_var_p - 2 * math.log(self.r), w]
        )
        # only the landmark inference merges, and GTMSM(inference="landmark") builds landmark_var
        correction = self.landmark_var(features) * valid.any(-1, keepdim=True).to(mu_p.dtype)  # type: ignore[misc]
        var_q = var_p * torch.exp(correction)
        return mu_q, var_q.expand(broadcast_shapes(mu_q.shape, var_q.shape))

    def landmark_path(
        self, actions: torch.Tensor, codes: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        r"""The memorisation phase with the landmark network (thesis appendix 7.10): Gaussian
        statistics ``(E[s_t], Var[s_t])`` of ``q*(s_t)``, ``t = 1..n``, propagated as the
        prior-only past encoder propagates ``p*`` (module docstring) and merged at every step
        with the states retrieved from the reversed DND of the steps before::

            mu_p = f(E[s_{t-1}], a_t),   sigma_p^2 = Var[s_{t-1}] + r^2,   (E[s_0], Var[s_0]) = (0, 0)
            (E[s_t], Var[s_t]) = landmark_merge(mu_p, sigma_p^2, reads of mu_phi(x_t) in m_{1:t-1})

        where the reversed DND ``m_{1:t-1}`` holds ``(key mu_phi(x_i), value (E[s_i], Var[s_i]))``
        for ``i < t``. At ``t = 1`` it is empty and the statistics are the prior's, ``(f(0,
        a_1), r^2)``; with ``beta = 0`` and ``NN = 0`` throughout they are ``p*``'s, ``(E[s_t],
        t r^2)``. The neighbours depend on the keys only and are found for all steps at once
        (:func:`~pyro_seq.nn.memory.nearest_earlier`, the same reads as a DND written step by
        step); the values are gathered step by step.

        :param actions: ``(batch, n, num_actions)``.
        :param codes: ``(batch, n, z_dim)``, the encoder means ``mu_phi(x_t)``.
        :returns: ``(means, variances)``, each ``(batch, n, state_dim)``.
        """
        batch, n = codes.shape[:2]
        K, S = self.landmark_neighbours, self.state_dim
        near = nearest_earlier(codes, K)
        beta = self.landmark_weights(near.distances, near.valid)  # (batch, n, K'), all at once
        mean = self.s0.expand(batch, S)
        var = torch.zeros_like(mean)
        means: List[torch.Tensor] = []
        variances: List[torch.Tensor] = []
        M = self.displacement_matrix()
        for t in range(n):
            mu_p = self.transition_mean(mean, actions[:, t], M)
            var_p = var + self.r**2
            if t == 0:  # empty memory: placeholders that no valid slot reads
                mu_k = mu_p.new_zeros(batch, K, S)
                var_k = mu_p.new_ones(batch, K, S)
            else:
                idx = near.indices[:, t].unsqueeze(-1).expand(batch, K, S)
                mu_k = torch.gather(torch.stack(means, 1), 1, idx)
                var_k = torch.gather(torch.stack(variances, 1), 1, idx)
            mean, var = self.landmark_merge(
                mu_p, var_p, near.distances[:, t], mu_k, var_k, near.valid[:, t], beta[:, t]
            )
            means.append(mean)
            variances.append(var)
        return torch.stack(means, 1), torch.stack(variances, 1)

    def memorise(
        self,
        frames: torch.Tensor,
        actions: torch.Tensor,
        codes: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> GTMSMMemory:
        """The past encoder (thesis 7.3.3; with ``inference="landmark"`` the states inferred by
        the landmark network, thesis appendix 7.10).

        :param frames: ``(batch, n, F)``; ``actions``: ``(batch, n, num_actions)``.
        :param codes: ``(loc, scale)`` of ``q(z_t | x_t)`` for these frames, each ``(batch, n,
            z_dim)``, when already computed (default: encode ``frames``).
        :returns: :class:`GTMSMMemory`.
        """
        loc, scale = self.encode(frames) if codes is None else codes
        if self.inference == "landmark":
            means, variances = self.landmark_path(actions, loc)
            rev = DND(self.z_dim).write(loc, torch.stack([means, variances], -2))
        else:
            means, rev = self.mean_path(actions), None
            steps = torch.arange(1, means.shape[1] + 1, dtype=means.dtype, device=means.device)
            variances = (steps * self.r**2).unsqueeze(-1).expand(means.shape)
        dnd = DND(self.key_dim).write(self.key(means), torch.stack([loc, scale], -2))
        return GTMSMMemory(dnd, rev, means, variances)

    def write_memory(self, frames: torch.Tensor, actions: torch.Tensor) -> Tuple[DND, torch.Tensor]:
        """The past encoder (thesis 7.3.3): a :class:`~pyro_seq.nn.DND` holding, for each of the
        ``n`` steps of ``frames (batch, n, F)`` and ``actions (batch, n, num_actions)``, the key
        ``key(E[s_t])`` and the value ``stack([mu_phi(x_t), sigma_phi(x_t)])`` ``(2, z_dim)``
        (the ``memory`` and ``means`` of :meth:`memorise`).

        :returns: ``(dnd, means)``: the memory and ``E[s_{1:n}]`` ``(batch, n, state_dim)``.
        """
        memory = self.memorise(frames, actions)
        return memory.memory, memory.means

    def read_landmarks(
        self, reversed_memory: DND, codes: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reads of the reversed DND for the prediction phase (thesis appendix 7.10), padded to
        ``K'`` slots when it holds fewer entries.

        :param reversed_memory: the ``reversed`` DND of a :class:`GTMSMMemory`.
        :param codes: ``(*lead, batch, z_dim)`` queries ``mu_phi(x_t)``.
        :returns: ``(distances (*lead, batch, K'), mu_k (*lead, batch, K', state_dim), var_k
            (same), valid (*lead, batch, K'))``, the arguments of :meth:`landmark_merge`.
        """
        K = self.landmark_neighbours
        read = reversed_memory.read(codes, K)
        d, mu_k, var_k = read.distances, read.values[..., 0, :], read.values[..., 1, :]
        valid = torch.ones_like(d, dtype=torch.bool)
        kk = d.shape[-1]
        if kk < K:
            pad = K - kk
            d = nn.functional.pad(d, (0, pad))
            valid = nn.functional.pad(valid, (0, pad), value=False)
            mu_k = nn.functional.pad(mu_k, (0, 0, 0, pad))
            var_k = nn.functional.pad(var_k, (0, 0, 0, pad), value=1.0)
        return d, mu_k, var_k, valid
