r"""Restricted Boltzmann machines as energy-based Pyro distributions (Mittelman et al. 2014;
Soyer & Möllenhoff, "What Do You Know?").

An RBM with visible units :math:`v` and binary hidden units :math:`h \in \{0, 1\}^H` has the
energy (Mittelman et al. 2014, eq. 1.1 without the recurrent term; Soyer & Möllenhoff eq. 1, with
:math:`W` transposed)

.. math:: E(v, h) = -\big(h^\top W v + c^\top v + b^\top h\big), \qquad
    p(v, h) = \frac{1}{Z} e^{-E(v, h)},

``W`` of shape ``(H, V)`` as in Mittelman et al. (2014) (``c``: visible bias, ``b``: hidden
bias). Summing out the hidden units gives the *free energy*

.. math:: F(v) = -c^\top v - \sum_j \operatorname{softplus}\big(b_j + W_j v\big),
    \qquad p(v) = e^{-F(v)} / Z,

and the conditionals factorise (Mittelman et al. eq. 1.6; Soyer & Möllenhoff eq. 9-10, 14-16):
:math:`p(h_j = 1 \mid v) = \sigma(b_j + W_j v)` and each visible unit depends on :math:`h` only
through its activation :math:`a_i = c_i + (W^\top h)_i`.

Visible unit types (``visible=``):

* ``"bernoulli"``: :math:`v_i \in \{0, 1\}`, :math:`p(v_i = 1 \mid h) = \sigma(a_i)`;
  ``W`` ``(H, V)``, value ``(..., V)``.
* ``"softmax"``: K-way softmax units (Soyer & Möllenhoff sec. 2.2, eq. 14-15): :math:`v_i`
  one-hot over ``K`` states, :math:`p(v_i^{(k)} = 1 \mid h) = \operatorname{softmax}_k(a_i)`;
  ``W`` ``(H, V, K)`` (one weight matrix per state, :math:`W^{(k)}` of the paper), value
  ``(..., V, K)``.
* ``"binomial_softmax"``: each softmax unit replicated ``num_trials`` times with shared weights
  (Soyer & Möllenhoff sec. 2.3, eq. 16): :math:`v_i` is a count vector over the ``K`` states
  summing to ``num_trials``,
  :math:`v_i \mid h \sim \operatorname{Multinomial}(n, \operatorname{softmax}(a_i))`.
  The replicas are exchangeable, so the energy depends on the counts only; the multinomial
  coefficient (the number of replica states with these counts) is part of :math:`e^{-F(v)}`, so
  that :math:`Z` sums over count vectors exactly as it would over the replicas.

Factored weights :math:`W = B A` (Soyer & Möllenhoff eq. 17) are :meth:`RBM.from_factors`; a
conditional RBM (Soyer & Möllenhoff eq. 20; the per-step RBMs of an RTRBM, Mittelman et al.
eq. 1.1) is an RBM whose biases carry batch dimensions computed from the input.

**Missing visibles** (``visible_mask``): the per-user sub-RBM of Salakhutdinov et al. (2007) that
Soyer & Möllenhoff train on ("a tiny RBM for every student with as many visible units as the
student has answered questions"): units with mask ``False`` are absent. They add nothing to the
free energy, to the hidden units' input or to the partition function, they get no gradient, and
Gibbs sampling leaves them at 0. This sub-RBM is not the marginal of the full RBM over the missing
units; that marginal, :meth:`RBM.marginal_log_prob`, needs a sum over the hidden
configurations and is offered for small ``H``.

``log_prob`` is **unnormalised**: it returns :math:`-F(v)`, which is all that contrastive
divergence (:class:`pyro_seq.infer.ContrastiveDivergence`) needs. The normaliser is
:meth:`RBM.log_partition` (exact, by enumeration, for small ``H`` or ``V``) or
:meth:`~pyro_seq.distributions.rbm_annealing.RBMAnnealing.ais_log_partition` (annealed importance
sampling, Salakhutdinov & Murray 2008; :mod:`~pyro_seq.distributions.rbm_annealing`).
"""

import itertools
import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import constraints
from torch.types import _size

from pyro_seq.distributions.rbm_annealing import RBMAnnealing
from pyro_seq.ops.linalg import broadcast_shapes

__all__ = ["EnergyBasedDistribution", "RBM", "VISIBLE_TYPES", "VisibleUnits"]

VISIBLE_TYPES = ("bernoulli", "softmax", "binomial_softmax")
MAX_ENUMERATION = 2**20


class EnergyBasedDistribution(TorchDistribution):
    """Marker base class of distributions with an unnormalised ``log_prob = -free_energy``.

    :class:`~pyro_seq.infer.ContrastiveDivergence` trains a model through its observed sites of
    this type: it needs :meth:`free_energy` and :meth:`gibbs` (``k`` steps of a Markov chain
    that leaves the distribution invariant, with no gradient through the chain).
    """

    def free_energy(self, value: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def gibbs(self, value: torch.Tensor, k: int = 1) -> torch.Tensor:
        raise NotImplementedError

    def shared(self) -> "EnergyBasedDistribution":
        """The distribution without batch dimensions, when its parameters are the same for
        every batch row (persistent chains of an unconditional model); ValueError otherwise."""
        raise NotImplementedError

    def reconstruction_error(self, value: torch.Tensor) -> torch.Tensor:
        """Per batch row, the squared error of a mean-field reconstruction (a monitor)."""
        raise NotImplementedError

    def pseudo_log_likelihood(self, value: torch.Tensor) -> torch.Tensor:
        r"""Per batch row, :math:`\sum_i \log p(v_i \mid v_{-i})` (a monitor)."""
        raise NotImplementedError

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """The **unnormalised** log-density :math:`-F(v)` (no :math:`\\log Z` is subtracted)."""
        if self._validate_args:
            self._validate_sample(value)
        return -self.free_energy(value)


class VisibleUnits:
    """The per-unit algebra of one visible type (shared by :class:`RBM` and ``SparseRBM``).

    ``a`` are activations ``(..., K)`` per unit for softmax types (``(...)`` for Bernoulli);
    ``m(v)`` is the base measure (the multinomial coefficient of binomial-softmax units).
    """

    def __init__(self, visible: str, num_trials: int = 1) -> None:
        self.visible, self.num_trials = visible, num_trials

    def log_normaliser(self, a: torch.Tensor) -> torch.Tensor:
        """Per unit :math:`\\log \\sum_{v_i} m(v_i) e^{v_i \\cdot a_i}`."""
        if self.visible == "bernoulli":
            return F.softplus(a)
        return self.num_trials * torch.logsumexp(a, -1)

    def log_potential(self, v: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Per unit :math:`v_i \\cdot a_i + \\log m(v_i)`."""
        if self.visible == "bernoulli":
            return v * a
        out = (v * a).sum(-1)
        if self.visible == "binomial_softmax":
            n = torch.tensor(float(self.num_trials + 1), dtype=a.dtype, device=a.device)
            out = out + torch.lgamma(n) - torch.lgamma(v + 1).sum(-1)
        return out

    def mean(self, a: torch.Tensor) -> torch.Tensor:
        """:math:`\\mathbb{E}[v_i]` given the activations."""
        if self.visible == "bernoulli":
            return torch.sigmoid(a)
        return self.num_trials * torch.softmax(a, -1)

    def sample(self, a: torch.Tensor) -> torch.Tensor:
        """One draw of every unit given its activations."""
        if self.visible == "bernoulli":
            return torch.bernoulli(torch.sigmoid(a))
        if self.visible == "softmax":
            index = torch.distributions.Categorical(logits=a).sample()
            return F.one_hot(index, a.shape[-1]).to(a.dtype)
        probs = torch.softmax(a, -1)
        flat = probs.reshape(-1, probs.shape[-1])
        draws = torch.multinomial(flat, self.num_trials, replacement=True)
        return F.one_hot(draws, probs.shape[-1]).sum(-2).to(a.dtype).reshape(probs.shape)


class _RBMSupport(constraints.Constraint):
    """Binary vectors, one-hot vectors, or count vectors summing to ``n`` (per visible type)."""

    def __init__(self, visible: str, num_trials: int) -> None:
        self.visible, self.num_trials = visible, num_trials
        self.event_dim = 1 if visible == "bernoulli" else 2
        super().__init__()

    def check(self, value: torch.Tensor) -> torch.Tensor:
        if self.visible == "bernoulli":
            return ((value == 0) | (value == 1)).all(-1)
        integer = (value == value.round()) & (value >= 0)
        # a unit left at all zeros is allowed: it is how a missing unit is stored
        total = value.sum(-1)
        ok = integer.all(-1) & ((total == self.num_trials) | (total == 0))
        return ok.all(-1)


class RBM(RBMAnnealing, EnergyBasedDistribution):
    r"""An RBM over its visible units, with an unnormalised ``log_prob`` (module docstring).

    :param torch.Tensor W: ``(H, V)`` for Bernoulli visibles, ``(H, V, K)`` for softmax and
        binomial-softmax visibles (Mittelman et al.'s orientation: hidden by visible). Leading batch
        dimensions are allowed.
    :param torch.Tensor visible_bias: ``c``, ``(..., V)`` or ``(..., V, K)``.
    :param torch.Tensor hidden_bias: ``b``, ``(..., H)``; batch dimensions make a conditional RBM.
    :param str visible: ``"bernoulli"``, ``"softmax"`` or ``"binomial_softmax"``.
    :param int num_trials: replicas per unit of ``"binomial_softmax"`` (Soyer & Möllenhoff use 2).
    :param torch.Tensor visible_mask: optional bool ``(..., V)``: ``False`` marks a missing unit
        (the per-user sub-RBM; module docstring).
    :param int sample_burn_in: Gibbs sweeps before the first :meth:`sample`.
    :param int sample_thinning: Gibbs sweeps between later calls of :meth:`sample`.

    Batch shape: the broadcast of the biases', ``W``'s and the mask's batch dimensions; event
    shape ``(V,)`` or ``(V, K)``.
    """

    arg_constraints = {}
    has_rsample = False

    def __init__(
        self,
        W: torch.Tensor,
        visible_bias: torch.Tensor,
        hidden_bias: torch.Tensor,
        visible: str = "bernoulli",
        num_trials: int = 1,
        visible_mask: Optional[torch.Tensor] = None,
        sample_burn_in: int = 1000,
        sample_thinning: int = 10,
        validate_args: Optional[bool] = None,
    ) -> None:
        if visible not in VISIBLE_TYPES:
            raise ValueError(f"visible must be one of {VISIBLE_TYPES}, got {visible!r}")
        if visible == "binomial_softmax":
            if not isinstance(num_trials, int) or num_trials < 1:
                raise ValueError(f"num_trials must be a positive int, got {num_trials!r}")
        elif num_trials != 1:
            raise ValueError(
                f"num_trials applies to visible='binomial_softmax' only (got "
                f"{num_trials!r} with visible={visible!r})"
            )
        for name, t in (("W", W), ("visible_bias", visible_bias), ("hidden_bias", hidden_bias)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {type(t).__name__}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name} has non-finite entries")
        self.visible, self.num_trials = visible, num_trials
        self.units = VisibleUnits(visible, num_trials)
        self._unit_dims = 1 if visible == "bernoulli" else 2  # dims of one visible layer
        if W.dim() < self._unit_dims + 1:
            raise ValueError(
                f"W must have shape (H, V{'' if visible == 'bernoulli' else ', K'}) "
                f"for visible={visible!r}, got {tuple(W.shape)}"
            )
        H = W.shape[-self._unit_dims - 1]
        unit_shape = W.shape[-self._unit_dims :]
        if visible != "bernoulli" and unit_shape[-1] < 2:
            raise ValueError(f"softmax units need K >= 2 states, got W of shape {tuple(W.shape)}")
        if (
            visible_bias.dim() < self._unit_dims
            or visible_bias.shape[-self._unit_dims :] != unit_shape
        ):
            raise ValueError(
                f"visible_bias must end in {tuple(unit_shape)} (from W "
                f"{tuple(W.shape)}), got {tuple(visible_bias.shape)}"
            )
        if hidden_bias.dim() < 1 or hidden_bias.shape[-1] != H:
            raise ValueError(
                f"hidden_bias must end in H = {H} (from W {tuple(W.shape)}), got "
                f"{tuple(hidden_bias.shape)}"
            )
        shapes = [
            W.shape[: -self._unit_dims - 1],
            visible_bias.shape[: -self._unit_dims],
            hidden_bias.shape[:-1],
        ]
        if visible_mask is not None:
            if visible_mask.dtype != torch.bool:
                raise TypeError(f"visible_mask must be a bool tensor, got {visible_mask.dtype}")
            if visible_mask.dim() < 1 or visible_mask.shape[-1] != unit_shape[0]:
                raise ValueError(
                    f"visible_mask must end in V = {unit_shape[0]}, got {tuple(visible_mask.shape)}"
                )
            shapes.append(visible_mask.shape[:-1])
        try:
            batch_shape = broadcast_shapes(*shapes)
        except ValueError as e:
            raise ValueError(
                f"batch dimensions of W, visible_bias, hidden_bias and visible_mask "
                f"do not broadcast: {[tuple(s) for s in shapes]}"
            ) from e
        self.W, self.visible_bias, self.hidden_bias = W, visible_bias, hidden_bias
        self.visible_mask = visible_mask
        self.num_hidden, self.num_visible = H, unit_shape[0]
        self.sample_burn_in, self.sample_thinning = int(sample_burn_in), int(sample_thinning)
        self._chain: Optional[torch.Tensor] = None
        super().__init__(batch_shape, torch.Size(unit_shape), validate_args=validate_args)

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_factors(
        cls,
        A: torch.Tensor,
        B: torch.Tensor,
        visible_bias: torch.Tensor,
        hidden_bias: torch.Tensor,
        **kwargs: Any,
    ) -> "RBM":
        r"""The factored RBM of Soyer & Möllenhoff, sec. 2.4: :math:`W = B A` of rank ``C``.

        Soyer & Möllenhoff write :math:`W^{(k)} = A^{(k)} B` with visible-by-hidden matrices; in
        this module's hidden-by-visible orientation that is ``W = B @ A`` with ``A`` ``(C, V)`` (or
        ``(C, V, K)``, one factor per softmax state) and ``B`` ``(H, C)``. Gradients reach ``A``
        and ``B`` through the product (Soyer & Möllenhoff eq. 18-19).
        """
        W = torch.einsum("hc,cv->hv", B, A) if A.dim() == 2 else torch.einsum("hc,cvk->hvk", B, A)
        return cls(W, visible_bias, hidden_bias, **kwargs)

    @property
    def support(self) -> constraints.Constraint:
        return _RBMSupport(self.visible, self.num_trials)

    def expand(self, batch_shape: _size, _instance: Optional["RBM"] = None) -> "RBM":
        batch_shape = torch.Size(batch_shape)
        u = self._unit_dims
        mask = (
            None
            if self.visible_mask is None
            else self.visible_mask.expand(batch_shape + self.visible_mask.shape[-1:])
        )
        new = RBM(
            self.W,
            self.visible_bias.expand(batch_shape + self.visible_bias.shape[-u:]),
            self.hidden_bias.expand(batch_shape + self.hidden_bias.shape[-1:]),
            visible=self.visible,
            num_trials=self.num_trials,
            visible_mask=mask,
            sample_burn_in=self.sample_burn_in,
            sample_thinning=self.sample_thinning,
            validate_args=False,
        )
        new._validate_args = self._validate_args
        return new

    # ------------------------------------------------------------------ per-unit pieces
    def _mask(self):
        """Float mask ``(..., V)`` of present units (ones without a ``visible_mask``)."""
        if self.visible_mask is None:
            return None
        return self.visible_mask.to(self.visible_bias.dtype)

    def _masked_value(self, v):
        m = self._mask()
        if m is None:
            return v
        return v * (m if self.visible == "bernoulli" else m.unsqueeze(-1))

    def hidden_input(self, v: torch.Tensor) -> torch.Tensor:
        r""":math:`b + W v` ``(..., H)``: the hidden units' input (missing units excluded)."""
        v = self._masked_value(v)
        if self.visible == "bernoulli":
            return self.hidden_bias + torch.einsum("...hv,...v->...h", self.W, v)
        return self.hidden_bias + torch.einsum("...hvk,...vk->...h", self.W, v)

    def visible_input(self, h: torch.Tensor) -> torch.Tensor:
        r"""Activations :math:`a = c + W^\top h`, ``(..., V)`` or ``(..., V, K)``."""
        if self.visible == "bernoulli":
            return self.visible_bias + torch.einsum("...hv,...h->...v", self.W, h)
        return self.visible_bias + torch.einsum("...hvk,...h->...vk", self.W, h)

    def _unit_log_normaliser(self, a):
        return self.units.log_normaliser(a)

    def _unit_log_potential(self, v, a):
        return self.units.log_potential(v, a)

    def _sum_units(self, per_unit):
        m = self._mask()
        return (per_unit if m is None else per_unit * m).sum(-1)

    # ------------------------------------------------------------------ energies
    def free_energy(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`F(v) = -\sum_i [v_i \cdot c_i + \log m(v_i)] - \sum_j \operatorname{softplus}(b_j
        + W_j v)`, shape ``batch``; :math:`m` is the multinomial coefficient of binomial-softmax
        units (1 otherwise)."""
        visible_term = self._sum_units(self._unit_log_potential(value, self.visible_bias))
        return -visible_term - F.softplus(self.hidden_input(value)).sum(-1)

    def energy(self, value: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        r"""The joint energy :math:`E(v, h) = -(h^\top W v + c^\top v + b^\top h)` (eq. 1.1)."""
        visible_term = self._sum_units(self._unit_log_potential(value, self.visible_bias))
        return -visible_term - (h * self.hidden_input(value)).sum(-1)

    # ------------------------------------------------------------------ conditionals, Gibbs
    def hidden_probs(self, v: torch.Tensor) -> torch.Tensor:
        """:math:`p(h_j = 1 \\mid v) = \\sigma(b_j + W_j v)` (Mittelman et al. 2014, eq. 1.6)."""
        return torch.sigmoid(self.hidden_input(v))

    def visible_probs(self, h: torch.Tensor) -> torch.Tensor:
        """The mean of :math:`v \\mid h`: Bernoulli probabilities, softmax probabilities, or
        expected counts ``num_trials * softmax`` (Soyer & Möllenhoff eq. 10, 14)."""
        return self.units.mean(self.visible_input(h))

    def _sample_units(self, a):
        """A draw of every visible unit given activations ``a`` (missing units set to 0)."""
        return self._masked_value(self.units.sample(a))

    def sample_hidden(self, v: torch.Tensor) -> torch.Tensor:
        """A draw of :math:`h \\sim p(h \\mid v)`, shape ``(..., H)``."""
        return torch.bernoulli(self.hidden_probs(v))

    def sample_visible(self, h: torch.Tensor) -> torch.Tensor:
        """A draw of :math:`v \\sim p(v \\mid h)`."""
        return self._sample_units(self.visible_input(h))

    @torch.no_grad()
    def gibbs(self, value: torch.Tensor, k: int = 1) -> torch.Tensor:
        """``k`` sweeps of block Gibbs sampling :math:`v \\to h \\to v` started at ``value``.

        Runs without gradient (contrastive divergence never differentiates through the chain).
        Missing units stay at 0. Returns the visible state after ``k`` sweeps, same shape.
        """
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be a non-negative int, got {k!r}")
        v = self._masked_value(value.detach().to(self.visible_bias.dtype))
        for _ in range(k):
            v = self.sample_visible(self.sample_hidden(v))
        return v

    def _random_visible(self, shape):
        """Independent uniform draws of every unit (the start of a fresh chain)."""
        zeros = torch.zeros(
            shape + self.event_shape, dtype=self.visible_bias.dtype, device=self.visible_bias.device
        )
        return self._sample_units(zeros)

    def sample(self, sample_shape: _size = torch.Size()) -> torch.Tensor:
        """Draws from a persistent Gibbs chain of this distribution object.

        The first call starts ``sample_shape`` independent chains from uniform noise and runs
        ``sample_burn_in`` sweeps; later calls with the same shape continue the same chains for
        ``sample_thinning`` sweeps. Consecutive draws are therefore correlated; for independent
        draws start new chains (a new ``RBM`` object or a different ``sample_shape``).
        """
        shape = torch.Size(sample_shape) + self.batch_shape
        if self._chain is None or self._chain.shape[: len(shape)] != shape:
            self._chain = self.gibbs(self._random_visible(shape), self.sample_burn_in)
        else:
            self._chain = self.gibbs(self._chain, self.sample_thinning)
        return self._chain.clone()

    # ------------------------------------------------------------------ monitors, sharing
    def reconstruction_error(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\sum_i \|v_i - \mathbb{E}[v_i \mid h = \sigma(b + W v)]\|^2` per batch row
        (present units only): the mean-field up-down pass that CD monitors report."""
        recon = self.visible_probs(self.hidden_probs(value))
        err = (value - recon) ** 2
        if self.visible != "bernoulli":
            err = err.sum(-1)
        return self._sum_units(err)

    def pseudo_log_likelihood(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\sum_i \log p(v_i \mid v_{-i})` per batch row, exactly (present units only).

        Each conditional compares the free energy of ``value`` with that of ``value`` with unit
        ``i`` changed: :math:`\log \sigma(F(\tilde v^{(i)}) - F(v))` for Bernoulli units (flip),
        a softmax over the ``K`` states for softmax units. Costs ``(..., V, H)`` (times ``K``)
        memory. Not available for binomial-softmax units.
        """
        if self.visible == "binomial_softmax":
            raise NotImplementedError(
                "pseudo_log_likelihood is defined for 'bernoulli' and "
                "'softmax' units; use monitor='reconstruction'"
            )
        x = self.hidden_input(value)  # (..., H)
        if self.visible == "bernoulli":
            d = 1 - 2 * value  # the change of each unit when flipped
            W_t = self.W.transpose(-1, -2)  # (..., V, H)
            x_flip = x.unsqueeze(-2) + W_t * d.unsqueeze(-1)
            delta_f = -self.visible_bias * d - (
                F.softplus(x_flip) - F.softplus(x).unsqueeze(-2)
            ).sum(-1)
            per_unit = F.logsigmoid(delta_f)
        else:
            W_t = self.W.permute(*range(self.W.dim() - 3), -2, -1, -3)  # (..., V, K, H)
            own = torch.einsum("...vkh,...vk->...vh", W_t, value)  # W_i v_i, (..., V, H)
            x_k = (x.unsqueeze(-2) - own).unsqueeze(-2) + W_t  # (..., V, K, H)
            logits = self.visible_bias + F.softplus(x_k).sum(-1)  # (..., V, K), up to a constant
            per_unit = (torch.log_softmax(logits, -1) * value).sum(-1)
        return self._sum_units(per_unit)

    def shared(self) -> "RBM":
        """This RBM with its batch dimensions removed, if every batch row has the same
        parameters (an unconditional RBM expanded by a plate); ValueError otherwise."""
        if self.visible_mask is not None:
            raise ValueError(
                "an RBM with a visible_mask differs per row; persistent chains "
                "with num_chains need an unconditional RBM"
            )
        u = self._unit_dims

        def first(t, event_dims):
            flat = t.reshape((-1,) + t.shape[t.dim() - event_dims :])
            if not torch.equal(flat, flat[:1].expand_as(flat)):
                raise ValueError(
                    "the RBM's parameters differ across its batch (a conditional "
                    "RBM); persistent chains with num_chains need one shared RBM, "
                    "use num_chains=None (one chain per row) or CD-k"
                )
            return flat[0]

        return RBM(
            first(self.W, u + 1),
            first(self.visible_bias, u),
            first(self.hidden_bias, 1),
            visible=self.visible,
            num_trials=self.num_trials,
            validate_args=False,
        )

    # ------------------------------------------------------------------ partition function
    def _unit_states(self):
        """Every state of one visible unit, ``(S,)`` or ``(S, K)``."""
        dtype, device = self.visible_bias.dtype, self.visible_bias.device
        if self.visible == "bernoulli":
            return torch.tensor([0.0, 1.0], dtype=dtype, device=device)
        K = self.event_shape[-1]
        if self.visible == "softmax":
            return torch.eye(K, dtype=dtype, device=device)
        states = [
            c
            for c in itertools.product(range(self.num_trials + 1), repeat=K)
            if sum(c) == self.num_trials
        ]
        return torch.tensor(states, dtype=dtype, device=device)

    def _hidden_configurations(self):
        H = self.num_hidden
        if 2**H > MAX_ENUMERATION:
            raise ValueError(f"exact enumeration needs 2^H <= {MAX_ENUMERATION}; H = {H}")
        codes = torch.arange(2**H, device=self.W.device)
        bits = (codes.unsqueeze(-1) >> torch.arange(H, device=self.W.device)) & 1
        return bits.to(self.visible_bias.dtype)  # (2^H, H)

    def _log_partition_by_hidden(self):
        h = self._hidden_configurations()
        h = h.reshape((h.shape[0],) + (1,) * len(self.batch_shape) + (self.num_hidden,))
        visible = self._sum_units(self._unit_log_normaliser(self.visible_input(h)))
        return torch.logsumexp((h * self.hidden_bias).sum(-1) + visible, 0)

    def _visible_configurations(self):
        states = self._unit_states()
        count = states.shape[0] ** self.num_visible
        if count > MAX_ENUMERATION:
            raise ValueError(
                f"exact enumeration over the visible units needs S^V <= "
                f"{MAX_ENUMERATION}; here {states.shape[0]}^{self.num_visible}"
            )
        index = torch.cartesian_prod(*[torch.arange(states.shape[0])] * self.num_visible)
        index = index.reshape(count, self.num_visible)
        return states[index]  # (count, V) or (count, V, K)

    def _log_partition_by_visible(self):
        r""":math:`\log Z` by enumerating every visible configuration, missing units included.

        A missing unit adds nothing to :math:`F` (it is absent from the sub-RBM), so each of its
        :math:`S` states repeats every term once: :math:`\sum_v e^{-F(v)} = S^{\#\text{missing}}
        Z`, and :math:`\#\text{missing} \cdot \log S` is subtracted.
        :math:`S` is the number of states enumerated per unit (2, ``K``, or the
        :math:`\binom{n + K - 1}{K - 1}` count vectors of a binomial-softmax unit), not
        :math:`\sum_{v_i} m(v_i) = K^n`: the enumeration does not weight a missing unit's states
        by the multinomial coefficient.
        """
        states = self._unit_states().shape[0]
        v = self._visible_configurations()
        v = v.reshape((v.shape[0],) + (1,) * len(self.batch_shape) + self.event_shape)
        log_z = torch.logsumexp(-self.free_energy(v), 0)
        m = self._mask()
        if m is not None:
            log_z = log_z - (1 - m).sum(-1) * math.log(states)
        return log_z

    def log_partition(self, over: str = "auto") -> torch.Tensor:
        r"""Exact :math:`\log Z` by enumeration, shape ``batch_shape``.

        :param str over: ``"hidden"`` sums the visible units out analytically for each of the
            :math:`2^H` hidden configurations; ``"visible"`` enumerates every visible
            configuration; ``"auto"`` picks the smaller of the two. With a ``visible_mask`` all
            three give the per-user sub-RBM's :math:`\log Z` (missing units absent).
        """
        if over not in ("auto", "hidden", "visible"):
            raise ValueError(f"over must be 'auto', 'hidden' or 'visible', got {over!r}")
        if over == "auto":
            visible_count = self._unit_states().shape[0] ** self.num_visible
            over = (
                "hidden"
                if 2**self.num_hidden <= min(visible_count, MAX_ENUMERATION)
                else ("visible" if visible_count <= MAX_ENUMERATION else "hidden")
            )
        return (
            self._log_partition_by_hidden()
            if over == "hidden"
            else self._log_partition_by_visible()
        )

    def normalized_log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """:math:`\\log p(v) = -F(v) - \\log Z` with the exact :meth:`log_partition`."""
        return self.log_prob(value) - self.log_partition()

    def marginal_log_prob(self, value: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
        r"""Unnormalised log-marginal of the *full* RBM over the units where ``observed`` is False.

        :math:`\log \sum_{v_m} e^{-F(v_o, v_m)} = \log \sum_h e^{b^\top h} \prod_{i \in o}
        m(v_i) e^{v_i \cdot a_i(h)} \prod_{i \notin o} \sum_{v_i} m(v_i) e^{v_i \cdot a_i(h)}`,
        summed over the :math:`2^H` hidden configurations (small ``H`` only). Subtract the
        full RBM's :meth:`log_partition` for :math:`\log p(v_o)`. Contrast with
        ``visible_mask``, which defines the per-user sub-RBM instead (module docstring).

        :param torch.Tensor observed: bool ``(..., V)``.
        """
        if self.visible_mask is not None:
            raise ValueError("marginal_log_prob is defined for an RBM without visible_mask")
        if observed.dtype != torch.bool or observed.shape[-1] != self.num_visible:
            raise ValueError(f"observed must be a bool tensor ending in V = {self.num_visible}")
        h = self._hidden_configurations()
        batch = broadcast_shapes(
            value.shape[: value.dim() - len(self.event_shape)],
            observed.shape[:-1],
            self.batch_shape,
        )
        h = h.reshape((h.shape[0],) + (1,) * len(batch) + (self.num_hidden,))
        a = self.visible_input(h)
        present = self._unit_log_potential(value, a)
        absent = self._unit_log_normaliser(a)
        per_unit = torch.where(observed, present, absent)
        return torch.logsumexp((h * self.hidden_bias).sum(-1) + per_unit.sum(-1), 0)

    def base_rate_bias(self, data: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
        r"""Visible bias :math:`c_0` of the independent model that matches the data's marginals.

        :param torch.Tensor data: ``(N, V)`` or ``(N, V, K)`` visible data.
        :returns: ``logit(p_i)`` (Bernoulli) or ``log p_{ik}`` (softmax types), clipped by ``eps``.
        """
        mean = data.reshape((-1,) + tuple(self.event_shape)).to(self.visible_bias.dtype).mean(0)
        if self.visible == "bernoulli":
            p = mean.clamp(eps, 1 - eps)
            return torch.log(p) - torch.log1p(-p)
        p = (mean / self.num_trials).clamp_min(eps)
        return torch.log(p / p.sum(-1, keepdim=True))
