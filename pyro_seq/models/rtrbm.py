r"""The recurrent temporal RBM and its structured version (Mittelman et al. 2014).

At each step the visibles :math:`v_t \in \{0,1\}^V` and hiddens :math:`h_t \in \{0,1\}^H` form an
RBM whose hidden bias depends on the previous step through :math:`r_{t-1}` (eq. 1.1):

.. math:: E(v_t, h_t; r_{t-1}) = -\big(h_t^\top W v_t + c^\top v_t + b^\top h_t + h_t^\top U
    r_{t-1}\big),

with the standard RBM with hidden bias :math:`b_{init}` at :math:`t = 1`, and the deterministic
recursion (eq. 1.2)

.. math:: r_t = \sigma(W v_t + b + U r_{t-1}) \;(t > 1), \qquad r_1 = \sigma(W v_1 + b_{init}),

the expected hidden units given :math:`v_t`. So the sequence distribution is a product of
conditional RBMs (eq. 1.3), :math:`p(v_{1:T}) = \prod_t p(v_t \mid r_{t-1})`, each with hidden
bias :math:`b_t = b + U r_{t-1}` (:math:`b_1 = b_{init}`).

As a Pyro model: :meth:`RTRBM.model` computes :math:`r_{1:T-1}` from the data and observes the
whole batch through one :class:`~pyro_seq.distributions.RBM` site ``"x"`` with batch shape
``(batch, T)`` (the per-step RBMs, masked at padded steps); the guide is empty. Training with
``SVI(..., loss=ContrastiveDivergence(k))`` runs ``k`` Gibbs sweeps of every per-step RBM from
the data (they are independent given :math:`r`, Mittelman et al. sec. 1.1) and back-propagates the
surrogate :math:`\sum_t F_t(v_t) - F_t(v'_t)` through :math:`b_t` into :math:`r_{t-1}` and on
through the recursion: this is the BPTT of eq. 1.16-1.27 (tested against the paper's recursion
written out by hand).

The log-likelihood of a sequence, as Boulanger-Lewandowski et al. (2012) report it, is
:math:`\sum_t \log p(v_t \mid r_{t-1}) = \sum_t -F_t(v_t) - \log Z_t` (:meth:`RTRBM.log_likelihood`),
with each per-step partition function exact (small ``H`` or ``V``) or by AIS.
"""

from types import MappingProxyType
from typing import Any, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import pyro
import torch
from torch import nn

from pyro_seq.distributions.rbm import RBM
from pyro_seq.models.contract import EnergyBasedModel, example
from pyro_seq.validation import (
    check_device,
    module_device,
    positive_int,
    validate_generate_args,
    validate_sequences,
)

__all__ = ["RTRBM", "SRTRBM", "SequenceLogLikelihood"]

#: the estimators of :meth:`RTRBM.log_likelihood`
_LIKELIHOOD_METHODS = ("exact", "ais", "reverse_ais", "raise")


class SequenceLogLikelihood(NamedTuple):
    """Per-sequence :math:`\\log p(v_{1:T})` ``(batch,)``, its standard error ``(batch,)`` (zeros
    when exact; with AIS :math:`\\sqrt{\\sum_t se_t^2}` over the independent per-step
    estimates), and the number of real steps ``(batch,)``."""

    log_likelihood: torch.Tensor
    stderr: torch.Tensor
    num_steps: torch.Tensor


class RTRBM(EnergyBasedModel):
    r"""Recurrent temporal RBM (Mittelman et al. 2014, eq. 1.1-1.6) over binary vectors.

    :param int num_visible: ``V`` (88 for piano rolls).
    :param int num_hidden: ``H``.
    :param float init_scale: standard deviation of the initial ``W`` and ``U``.

    Parameters, named as in the paper: ``W`` ``(H, V)``, ``U`` ``(H, H)``, ``b`` ``(H,)`` (hidden
    bias), ``c`` ``(V,)`` (visible bias), ``b_init`` ``(H,)`` (hidden bias at t = 1).
    """

    module_name = "rtrbm"
    tasks = frozenset({"generate"})
    small_example = example(obs_dim=5, num_hidden=3)
    unsupported = MappingProxyType(
        dict(
            EnergyBasedModel.unsupported,
            impute="an RTRBM has no recognition model to condition on the observed steps; impute "
            "with a latent-variable model (srnn, dmm)",
            denoise="an RTRBM has no recognition model; denoise with a latent-variable model "
            "(srnn, dmm)",
            forecast="continue a sequence with RTRBM.generate(num_sequences, num_steps, "
            "prefix=x) instead",
        )
    )

    def __init__(self, num_visible: int, num_hidden: int = 150, init_scale: float = 0.01) -> None:
        super().__init__()
        for name, value in (("num_visible", num_visible), ("num_hidden", num_hidden)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_visible, self.num_hidden = num_visible, num_hidden
        self.obs_dim = num_visible
        self.W = nn.Parameter(init_scale * torch.randn(num_hidden, num_visible))
        self.U = nn.Parameter(init_scale * torch.randn(num_hidden, num_hidden))
        self.b = nn.Parameter(torch.zeros(num_hidden))
        self.c = nn.Parameter(torch.zeros(num_visible))
        self.b_init = nn.Parameter(torch.zeros(num_hidden))

    # ------------------------------------------------------------------ structure
    def weights(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The ``(W, U)`` the energy uses (SRTRBM masks them)."""
        return self.W, self.U

    def _check(self, x, mask):
        x, mask = validate_sequences(
            x, mask, self.num_visible, binary=True, device=module_device(self)
        )
        return x.to(self.W.dtype), mask

    # ------------------------------------------------------------------ recursion
    def hidden_biases(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        r"""Per-step hidden biases :math:`b_t` ``(batch, T, H)`` and :math:`r_t` ``(batch, T, H)``.

        :math:`b_1 = b_{init}`, :math:`b_t = b + U r_{t-1}`; :math:`r_t = \sigma(W v_t + b_t)`
        (eq. 1.2). Steps after a sequence's end are computed but never scored.
        """
        W, U = self.weights()
        drive = torch.einsum("hv,btv->bth", W, x)  # W v_t for every step at once
        biases: List[torch.Tensor] = []
        rs: List[torch.Tensor] = []
        bias = self.b_init.expand(x.shape[0], self.num_hidden)
        for t in range(x.shape[1]):
            if t > 0:
                bias = self.b + rs[-1] @ U.T
            biases.append(bias)
            rs.append(torch.sigmoid(drive[:, t] + bias))
        return torch.stack(biases, 1), torch.stack(rs, 1)

    def step_rbms(self, x: torch.Tensor) -> RBM:
        """The per-step conditional RBMs as one :class:`RBM` of batch shape ``(batch, T)``."""
        W, _ = self.weights()
        biases, _ = self.hidden_biases(x)
        return RBM(W, self.c, biases)

    # ------------------------------------------------------------------ Pyro program
    def model(
        self,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        num_sequences: Optional[int] = None,
    ) -> None:
        """Observe ``x`` ``(batch, T, V)`` through the per-step RBMs (site ``"x"``).

        :param mask: ``(batch, T)`` padding mask or None.
        :param int num_sequences: data-set size when ``x`` is a minibatch (scales the plate).
        """
        x, mask = self._check(x, mask)
        pyro.module(self.module_name, self)
        rbm = self.step_rbms(x)
        B = x.shape[0]
        plate = (
            # pyro.plate takes a torch.device too (its annotation says str)
            pyro.plate("sequences", B, dim=-1, device=x.device)  # type: ignore[arg-type]
            if num_sequences is None
            else pyro.plate(
                "sequences",
                num_sequences,
                subsample=torch.arange(B, device=x.device),
                dim=-1,
                device=x.device,  # type: ignore[arg-type]
            )
        )
        with plate:
            pyro.sample("x", rbm.mask(mask).to_event(1), obs=x)

    def guide(
        self,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        num_sequences: Optional[int] = None,
    ) -> None:
        """Empty: an RTRBM has no latent sample sites (the hidden units are summed out)."""
        self._check(x, mask)

    @torch.no_grad()
    def init_visible_bias(
        self, train_sequences: Iterable[torch.Tensor], eps: float = 1e-3
    ) -> torch.Tensor:
        """Set ``c`` to the logit of each unit's frequency in the training steps (the usual RBM
        start: the visible marginals of the independent model); returns it."""
        freq = torch.cat([s.reshape(-1, self.num_visible) for s in train_sequences]).mean(0)
        p = freq.to(self.c.dtype).clamp(eps, 1 - eps)
        self.c.copy_(torch.log(p) - torch.log1p(-p))
        return self.c

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def pseudo_log_likelihood(
        self, x: torch.Tensor, mask: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Per sequence :math:`\\sum_t \\sum_i \\log p(v_{t,i} \\mid v_{t,-i}, r_{t-1})` ``(batch,)``:
        the validation monitor of CD training (not a bound on the likelihood)."""
        x, mask = self._check(x, mask)
        W, _ = self.weights()
        biases, _ = self.hidden_biases(x)
        per_step = RBM(W, self.c, biases).pseudo_log_likelihood(x)
        return (per_step * mask.to(per_step.dtype)).sum(-1)

    @torch.no_grad()
    def log_likelihood(
        self,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        method: str = "exact",
        num_chains: int = 100,
        num_betas: int = 1000,
        betas: Optional[torch.Tensor] = None,
        base_visible_bias: Optional[torch.Tensor] = None,
        steps_per_chunk: Optional[int] = None,
        gibbs_steps: int = 1000,
    ) -> "SequenceLogLikelihood":
        r"""Per-sequence :math:`\log p(v_{1:T}) = \sum_t [-F_t(v_t) - \log Z_t]`.

        :param str method: how each step's :math:`\log Z_t` or :math:`\log p(v_t \mid
            r_{t-1})` is obtained, on one annealing path
            (:mod:`~pyro_seq.distributions.rbm_annealing`):

            * ``"exact"``: enumeration (small ``H`` or ``V``);
            * ``"ais"``: forward AIS; :math:`\hat Z_t` is unbiased, so the log-likelihood is a
              stochastic upper bound;
            * ``"reverse_ais"``: reverse AIS from ``num_chains`` draws of each step's RBM
              (``gibbs_steps`` block-Gibbs sweeps from a uniform start); with exact draws a
              stochastic lower bound, so that with ``"ais"`` it sandwiches the log-likelihood
              (bidirectional Monte Carlo, Grosse, Ghahramani & Adams 2015);
            * ``"raise"``: reverse AIS from the data (Burda, Grosse & Salakhutdinov 2015), a
              stochastic lower bound on the annealing model's log-likelihood, which tends to
              the RTRBM's as the schedule refines.
        :param int num_chains: AIS chains.
        :param int num_betas: AIS temperatures (``betas`` overrides the uniform grid).
        :param base_visible_bias: AIS base model's visible bias ``(V,)``; default ``c``, the
            model's own visible bias (after :meth:`init_visible_bias`, the training notes'
            logits), a closer start than the uniform model for piano rolls.
        :param int steps_per_chunk: AIS memory bound: at most this many (sequence, step) RBMs at
            once (all at once by default).
        :param int gibbs_steps: sweeps of the chains whose final states start reverse AIS.
        :returns: :class:`SequenceLogLikelihood`.
        """
        if method not in _LIKELIHOOD_METHODS:
            raise ValueError(f"method must be one of {_LIKELIHOOD_METHODS}, got {method!r}")
        x, mask = self._check(x, mask)
        W, _ = self.weights()
        biases, _ = self.hidden_biases(x)
        rbm = RBM(W, self.c, biases)
        unnorm = -rbm.free_energy(x)  # (batch, T)
        if method == "exact":
            log_z = rbm.log_partition()
            var = torch.zeros_like(log_z)
        else:
            if base_visible_bias is None:
                base_visible_bias = self.c.detach()
            flat_bias = biases[mask]  # only real steps: (N, H)
            flat_x = x[mask]
            chunk = steps_per_chunk or flat_bias.shape[0]
            values, errors = [], []
            for start in range(0, flat_bias.shape[0], chunk):
                part = RBM(W, self.c, flat_bias[start : start + chunk])
                if method == "ais":
                    est = part.ais_log_partition(num_chains, num_betas, betas, base_visible_bias)
                elif method == "reverse_ais":
                    start_v = torch.rand((num_chains,) + flat_x[start : start + chunk].shape) < 0.5
                    draws = part.gibbs(start_v.to(W.dtype), k=gibbs_steps)
                    est = part.reverse_ais_log_partition(draws, num_betas, betas, base_visible_bias)
                else:  # log p(v_t | r_{t-1}) itself: stored as unnorm - log_z below
                    value = flat_x[start : start + chunk]
                    est = part.raise_log_prob(
                        value, num_chains, num_betas, betas, base_visible_bias
                    )
                values.append(est.log_partition)
                errors.append(est.stderr)
            log_z = torch.zeros_like(unnorm)
            var = torch.zeros_like(unnorm)
            log_z[mask] = torch.cat(values)
            if method == "raise":
                log_z[mask] = unnorm[mask] - log_z[mask]
            var[mask] = torch.cat(errors) ** 2
        m = mask.to(unnorm.dtype)
        ll = ((unnorm - log_z) * m).sum(-1)
        return SequenceLogLikelihood(ll, (var * m).sum(-1).sqrt(), mask.sum(-1))

    @torch.no_grad()
    def generate(
        self,
        num_sequences: int,
        num_steps: int,
        gibbs_steps: int = 100,
        prefix: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Sample sequences by per-step Gibbs (Mittelman et al. (2014), supplementary sec. 1.1).

        At each step ``gibbs_steps`` sweeps of the conditional RBM given :math:`r_{t-1}` from a
        uniform start; then :math:`r_t = \\sigma(W v_t + b_t)`.

        :param torch.Tensor prefix: optional ``(num_sequences, T0, V)`` (or ``(1, T0, V)``,
            shared by every sequence) binary steps to condition on, ``T0 <= num_steps``
            (generation continues after them); bool, integer or floating dtype, values 0/1, on
            the model's device.
        :returns: ``(x, logits)``: ``x`` ``(num_sequences, num_steps, V)`` float 0/1 (prefix
            included) and the visible logits :math:`c + W^\\top h` of the last Gibbs sweep at
            each generated step (those of :math:`\\mathbb{E}[v_t \\mid r_{t-1}]` at prefix
            steps), as the other models' ``generate`` returns their emission logits.
        :raises ValueError: naming the argument, for ``num_sequences``, ``num_steps`` or
            ``gibbs_steps`` not a positive integer, or a ``prefix`` of the wrong type, shape,
            dtype, device or values.
        """
        num_sequences, num_steps = validate_generate_args(num_sequences, num_steps)
        if isinstance(gibbs_steps, bool) or not isinstance(gibbs_steps, int) or gibbs_steps < 1:
            raise ValueError(f"gibbs_steps must be a positive int, got {gibbs_steps!r}")
        if prefix is not None:
            prefix = self._check_prefix(prefix, num_sequences, num_steps)
        W, U = self.weights()
        out, logits = [], []
        r: Optional[torch.Tensor] = None
        for t in range(num_steps):
            # r is r_{t-1}, set by the previous step, whenever t > 0
            bias = self.b_init.expand(num_sequences, -1) if t == 0 else self.b + r @ U.T  # type: ignore[operator]
            rbm = RBM(W, self.c, bias)
            if prefix is not None and t < prefix.shape[1]:
                v = prefix[:, t].to(W.dtype)
                h = rbm.hidden_probs(v)
            else:
                v = rbm._random_visible(torch.Size([num_sequences]))
                for _ in range(gibbs_steps):
                    h = rbm.sample_hidden(v)
                    v = rbm.sample_visible(h)
            out.append(v)
            logits.append(rbm.visible_input(h))
            r = torch.sigmoid(rbm.hidden_input(v))
        return torch.stack(out, 1), torch.stack(logits, 1)

    def _check_prefix(self, prefix, num_sequences, num_steps):
        """The ``prefix`` of :meth:`generate` checked and returned as ``(num_sequences, T0, V)``
        in the weights' dtype (a batch of 1 is shared by every sequence)."""
        V = self.num_visible
        if not torch.is_tensor(prefix):
            raise ValueError(
                f"prefix must be a tensor (num_sequences, T0, {V}) of 0/1 steps, "
                f"got {type(prefix).__name__}"
            )
        if prefix.dim() != 3 or prefix.shape[0] not in (1, num_sequences) or prefix.shape[2] != V:
            raise ValueError(
                f"prefix must have shape (num_sequences = {num_sequences} or 1, T0, "
                f"num_visible = {V}), got {tuple(prefix.shape)}"
            )
        if prefix.shape[1] > num_steps:
            raise ValueError(
                f"prefix has {prefix.shape[1]} steps, more than num_steps = "
                f"{num_steps} (which counts the prefix); pass num_steps >= "
                f"{prefix.shape[1]}"
            )
        if prefix.is_complex():
            raise ValueError(
                f"prefix must have a bool, integer or floating dtype, got {prefix.dtype}"
            )
        check_device("prefix", prefix, module_device(self))
        bad = (prefix != 0) & (prefix != 1)
        if bool(bad.any()):
            b, t, v = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"prefix must be binary (0/1), found {prefix[b, t, v].item()!r} at "
                f"(sequence {b}, step {t}, unit {v}); binarise it first, e.g. "
                f"(prefix > 0.5)"
            )
        return prefix.to(self.W.dtype).expand(num_sequences, -1, -1)


class SRTRBM(RTRBM):
    r"""Structured RTRBM: fixed binary masks on ``W`` and ``U`` (Mittelman et al. 2014).

    The energy uses :math:`W \odot M_W` and :math:`U \odot M_U`; masked entries are zero at
    initialisation, get exactly zero gradient (the product's derivative), and so stay zero
    under any optimiser without weight decay on them.

    :param torch.Tensor W_mask: bool or 0/1 ``(H, V)``.
    :param torch.Tensor U_mask: bool or 0/1 ``(H, H)``; None keeps ``U`` dense.
    """

    module_name = "srtrbm"
    W_mask: torch.Tensor  #: buffer ``(H, V)``
    U_mask: torch.Tensor  #: buffer ``(H, H)``
    small_example = example(obs_dim=6, num_groups=2, hidden_per_group=2)

    def __init__(
        self,
        num_visible: int,
        num_hidden: int,
        W_mask: torch.Tensor,
        U_mask: Optional[torch.Tensor] = None,
        init_scale: float = 0.01,
    ) -> None:
        super().__init__(num_visible, num_hidden, init_scale)
        W_mask = _binary_mask(W_mask, (num_hidden, num_visible), "W_mask")
        U_mask = (
            torch.ones(num_hidden, num_hidden)
            if U_mask is None
            else _binary_mask(U_mask, (num_hidden, num_hidden), "U_mask")
        )
        self.register_buffer("W_mask", W_mask)
        self.register_buffer("U_mask", U_mask)
        with torch.no_grad():
            self.W.mul_(W_mask)
            self.U.mul_(U_mask)

    @classmethod
    def for_data(
        cls,
        obs_dim: int,
        input_dim: int = 0,
        num_groups: int = 4,
        hidden_per_group: int = 8,
        edges: Union[str, Sequence[Tuple[int, int]]] = "chain",
        **options: Any,
    ) -> "SRTRBM":
        """An SRTRBM over ``obs_dim`` visibles split into ``num_groups`` contiguous groups (e.g.
        registers of a piano roll), ``hidden_per_group`` hidden units each, groups linked
        through ``U`` along a chain (``edges="chain"``), not at all (``"none"``) or as a list
        of pairs (:meth:`block_masks`)."""
        if input_dim:
            return super().for_data(obs_dim, input_dim)
        G = positive_int("num_groups", num_groups)
        if G > obs_dim:
            raise ValueError(f"num_groups={G} is more than the {obs_dim} visibles")
        bounds = [round(g * obs_dim / G) for g in range(G + 1)]
        groups = [list(range(bounds[g], bounds[g + 1])) for g in range(G)]
        if edges == "chain":
            edges = [(g, g + 1) for g in range(G - 1)]
        elif edges == "none":
            edges = []
        elif isinstance(edges, str):
            raise ValueError(
                f"edges must be 'chain', 'none' or a list of group pairs (g, g2), got {edges!r}"
            )
        W_mask, U_mask = cls.block_masks(
            groups, positive_int("hidden_per_group", hidden_per_group), edges
        )
        return cls(obs_dim, W_mask.shape[0], W_mask, U_mask, **options)

    def weights(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.W * self.W_mask, self.U * self.U_mask

    @staticmethod
    def block_masks(
        visible_groups: Sequence[Sequence[int]],
        hidden_per_group: int,
        edges: Optional[Sequence[Tuple[int, int]]] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        r"""Masks of a structure over groups of units (Mittelman et al.'s block structure).

        :param list visible_groups: one list of visible indices per group ``g``.
        :param int hidden_per_group: hidden units per group; group ``g`` owns hidden units
            ``g * hidden_per_group ...``.
        :param edges: pairs ``(g, g2)`` of groups whose hidden units interact through ``U``
            (symmetric; every group is linked to itself). None: only self-links.
        :returns: ``(W_mask (H, V), U_mask (H, H))`` float 0/1, ``H = groups * hidden_per_group``;
            hidden units of group ``g`` connect to the visibles of ``g`` only.
        """
        G = len(visible_groups)
        V = max(max(g) for g in visible_groups if g) + 1
        H = G * hidden_per_group
        W_mask = torch.zeros(H, V)
        U_group = torch.eye(G)
        for g, units in enumerate(visible_groups):
            W_mask[g * hidden_per_group : (g + 1) * hidden_per_group, units] = 1.0
        for edge in edges or ():
            if (
                isinstance(edge, str)
                or len(edge) != 2
                or not all(isinstance(g, int) and 0 <= g < G for g in edge)
            ):
                raise ValueError(
                    f"each edge must be a pair (g, g2) of group indices in 0..{G - 1}, got {edge!r}"
                )
            g, g2 = edge
            U_group[g, g2] = U_group[g2, g] = 1.0
        U_mask = torch.kron(U_group, torch.ones(hidden_per_group, hidden_per_group))
        return W_mask, U_mask


def _binary_mask(mask, shape, name) -> torch.Tensor:
    mask = torch.as_tensor(mask)
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1")
    return mask.to(torch.get_default_dtype())
