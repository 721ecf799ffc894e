r"""A batch of per-row sub-RBMs over sparse visible entries (Soyer & Möllenhoff, "What
Do You Know?", sec. 2.1; Salakhutdinov et al. 2007): the collaborative-filtering RBM without a
dense ``(rows, items)`` matrix.

Row ``s`` (a student, a user) has visible units only for the items it has answered, entries
``(row[i], column[i])``; all rows share the weights :math:`W` ``(H, Q)`` (or ``(H, Q, K)``) and the
visible bias :math:`c`, and row ``s``'s RBM is the sub-RBM of :class:`~pyro_seq.distributions.RBM`
with ``visible_mask`` true exactly at its entries (Soyer & Möllenhoff: "a tiny RBM for every
student with as many visible units as the student has answered questions"). Its free energy is

.. math:: F_s(v) = -\sum_{i: row_i = s} [v_i \cdot c_{col_i} + \log m(v_i)]
    - \sum_j \operatorname{softplus}\Big(b_{s,j} + \sum_{i: row_i = s} W_{j, col_i} v_i\Big),

computed with gathers and ``index_add`` in :math:`O(\text{entries} \times H)` time and memory:
only the columns of ``W`` a batch touches are read, and nothing of size ``rows x items`` exists.

Values are the entries' states, aligned with ``row``/``column``: ``(n,)`` 0/1 for Bernoulli units,
``(n, K)`` one-hot or counts for the softmax types. The batch shape is ``(num_rows,)`` and the
event shape ``()``: the events are ragged, so ``log_prob(value)`` (``-F``, unnormalised) takes the
whole entry list and returns one value per row.
"""

from typing import NoReturn, Optional

import torch
import torch.nn.functional as F
from torch.distributions.constraints import Constraint
from torch.types import _size

from pyro_seq.distributions.rbm import (
    MAX_ENUMERATION,
    VISIBLE_TYPES,
    EnergyBasedDistribution,
    VisibleUnits,
)

__all__ = ["SparseRBM"]


class SparseRBM(EnergyBasedDistribution):
    r"""Per-row sub-RBMs over the sparse entries ``(row, column)`` (module docstring).

    :param torch.Tensor W: ``(H, Q)`` Bernoulli, or ``(H, Q, K)`` softmax types.
    :param torch.Tensor visible_bias: ``(Q,)`` or ``(Q, K)``.
    :param torch.Tensor hidden_bias: ``(H,)``, or ``(num_rows, H)`` for a conditional RBM (Soyer &
        Möllenhoff eq. 20 adds :math:`\sum_i r_i D_{ij}` per row).
    :param torch.Tensor row: ``(n,)`` int64 in ``0..num_rows-1``.
    :param torch.Tensor column: ``(n,)`` int64 in ``0..Q-1``.
    :param int num_rows: number of rows (the batch size).
    :param str visible: as :class:`~pyro_seq.distributions.RBM`.
    :param int num_trials: replicas of ``"binomial_softmax"`` units.
    """

    arg_constraints = {}
    has_rsample = False

    def __init__(
        self,
        W: torch.Tensor,
        visible_bias: torch.Tensor,
        hidden_bias: torch.Tensor,
        row: torch.Tensor,
        column: torch.Tensor,
        num_rows: int,
        visible: str = "bernoulli",
        num_trials: int = 1,
        validate_args: Optional[bool] = None,
    ) -> None:
        if visible not in VISIBLE_TYPES:
            raise ValueError(f"visible must be one of {VISIBLE_TYPES}, got {visible!r}")
        k_dims = 0 if visible == "bernoulli" else 1
        if W.dim() != 2 + k_dims:
            raise ValueError(
                f"W must be (H, Q{'' if k_dims == 0 else ', K'}) for visible={visible!r},"
                f" got {tuple(W.shape)}"
            )
        H, Q = W.shape[:2]
        if tuple(visible_bias.shape) != tuple(W.shape[1:]):
            raise ValueError(
                f"visible_bias must have shape {tuple(W.shape[1:])}, got "
                f"{tuple(visible_bias.shape)}"
            )
        if (
            hidden_bias.shape[-1] != H
            or hidden_bias.dim() > 2
            or (hidden_bias.dim() == 2 and hidden_bias.shape[0] != num_rows)
        ):
            raise ValueError(
                f"hidden_bias must be (H,) or (num_rows, H) = ({num_rows}, {H}), got "
                f"{tuple(hidden_bias.shape)}"
            )
        for name, t in (("row", row), ("column", column)):
            if t.dtype != torch.long or t.dim() != 1:
                raise ValueError(
                    f"{name} must be a 1-D int64 tensor, got {t.dtype} {tuple(t.shape)}"
                )
        if row.shape != column.shape:
            raise ValueError(
                f"row and column must have the same length, got {row.shape[0]} and "
                f"{column.shape[0]}"
            )
        if row.numel() and (int(row.min()) < 0 or int(row.max()) >= num_rows):
            raise ValueError(f"row indices must lie in 0..{num_rows - 1}")
        if column.numel() and (int(column.min()) < 0 or int(column.max()) >= Q):
            raise ValueError(f"column indices must lie in 0..{Q - 1}")
        if visible == "binomial_softmax" and (not isinstance(num_trials, int) or num_trials < 1):
            raise ValueError(f"num_trials must be a positive int, got {num_trials!r}")
        self.W, self.visible_bias, self.hidden_bias = W, visible_bias, hidden_bias
        self.row, self.column, self.num_rows = row, column, int(num_rows)
        self.visible, self.num_trials = visible, num_trials
        self.units = VisibleUnits(visible, num_trials)
        self.num_hidden, self.num_visible = H, Q
        super().__init__(torch.Size([num_rows]), torch.Size(), validate_args=validate_args)

    def expand(self, batch_shape: _size, _instance: Optional["SparseRBM"] = None) -> "SparseRBM":
        if torch.Size(batch_shape) != self.batch_shape:
            raise ValueError(
                f"a SparseRBM has batch shape {tuple(self.batch_shape)} (its rows) "
                f"and cannot be expanded to {tuple(batch_shape)}"
            )
        return self

    def _validate_sample(self, value):
        n = self.row.shape[0]
        shape = (n,) if self.visible == "bernoulli" else (n, self.W.shape[-1])
        if tuple(value.shape) != shape:
            raise ValueError(
                f"value must have shape {shape} (one state per entry), got {tuple(value.shape)}"
            )
        if self.visible == "bernoulli":
            ok = ((value == 0) | (value == 1)).all()
        else:
            total = self.num_trials
            ok = ((value == value.round()) & (value >= 0)).all() and bool(
                (value.sum(-1) == total).all()
            )
        if not ok:
            raise ValueError(f"value is outside the support of {self.visible!r} units")

    @property
    def support(self) -> Constraint:
        from torch.distributions import constraints

        return constraints.real  # checked entry-wise by _validate_sample

    # ------------------------------------------------------------------ gathers
    def _entry_weights(self):
        """``W`` at the entries' columns, ``(n, H)`` or ``(n, H, K)``."""
        return self.W[:, self.column].transpose(0, 1)

    def _rows_sum(self, per_entry):
        out = per_entry.new_zeros((self.num_rows,) + per_entry.shape[1:])
        return out.index_add(0, self.row, per_entry)

    def hidden_input(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`b_s + \sum_{i \in s} W_{:, col_i} v_i`, ``(num_rows, H)``."""
        We = self._entry_weights()
        contrib = (
            We * value.unsqueeze(-1)
            if self.visible == "bernoulli"
            else torch.einsum("nhk,nk->nh", We, value)
        )
        return self.hidden_bias + self._rows_sum(contrib)

    def entry_activations(
        self,
        h: torch.Tensor,
        row: Optional[torch.Tensor] = None,
        column: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        r"""Activations :math:`c_q + W_{:, q}^\top h_s` at entries (default: this object's), ``(n,)``
        or ``(n, K)``; ``h`` is ``(num_rows, H)`` (samples or probabilities)."""
        row = self.row if row is None else row
        column = self.column if column is None else column
        We = self.W[:, column].transpose(0, 1)
        hr = h[row]
        if self.visible == "bernoulli":
            return self.visible_bias[column] + (We * hr).sum(-1)
        return self.visible_bias[column] + torch.einsum("nhk,nh->nk", We, hr)

    # ------------------------------------------------------------------ energies, sampling
    def free_energy(self, value: torch.Tensor) -> torch.Tensor:
        """:math:`F_s(v)` per row, ``(num_rows,)``."""
        potential = self._rows_sum(self.units.log_potential(value, self.visible_bias[self.column]))
        return -potential - F.softplus(self.hidden_input(value)).sum(-1)

    def hidden_probs(self, value: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.hidden_input(value))

    @torch.no_grad()
    def gibbs(self, value: torch.Tensor, k: int = 1) -> torch.Tensor:
        """``k`` block-Gibbs sweeps of every row's sub-RBM; returns the entries' states."""
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be a non-negative int, got {k!r}")
        v = value.detach().to(self.visible_bias.dtype)
        for _ in range(k):
            h = torch.bernoulli(self.hidden_probs(v))
            v = self.units.sample(self.entry_activations(h))
        return v

    def predict(
        self, value: torch.Tensor, query_row: torch.Tensor, query_column: torch.Tensor
    ) -> torch.Tensor:
        r"""Mean-field prediction at new entries (Soyer & Möllenhoff sec. 2.1, eq. 9-10 / 14-15):
        :math:`\mathbb{E}[v_q \mid h = p(h \mid v_s)]` for each query ``(query_row, query_column)``:
        probabilities ``(m,)`` (Bernoulli) or expected counts ``(m, K)``."""
        h = self.hidden_probs(value)
        return self.units.mean(self.entry_activations(h, query_row, query_column))

    def reconstruction_error(self, value: torch.Tensor) -> torch.Tensor:
        recon = self.units.mean(self.entry_activations(self.hidden_probs(value)))
        err = (value - recon) ** 2
        return self._rows_sum(err if self.visible == "bernoulli" else err.sum(-1))

    def pseudo_log_likelihood(self, value: torch.Tensor) -> torch.Tensor:
        """:math:`\\sum_i \\log p(v_i \\mid v_{-i})` per row (Bernoulli units; one flip per entry)."""
        if self.visible != "bernoulli":
            raise NotImplementedError(
                "SparseRBM.pseudo_log_likelihood is for 'bernoulli' units; "
                "use monitor='reconstruction'"
            )
        x = self.hidden_input(value)[self.row]  # (n, H)
        d = 1 - 2 * value
        x_flip = x + self._entry_weights() * d.unsqueeze(-1)
        delta_f = -self.visible_bias[self.column] * d - (F.softplus(x_flip) - F.softplus(x)).sum(-1)
        return self._rows_sum(F.logsigmoid(delta_f))

    def shared(self) -> NoReturn:
        raise ValueError(
            "a SparseRBM's rows are different sub-RBMs; persistent chains with "
            "num_chains need one shared RBM"
        )

    # ------------------------------------------------------------------ partition function
    def log_partition(self) -> torch.Tensor:
        r"""Exact :math:`\log Z_s` of every row's sub-RBM, ``(num_rows,)``, by summing the
        visible entries out for each of the :math:`2^H` hidden configurations (small ``H``)."""
        H = self.num_hidden
        if 2**H > MAX_ENUMERATION:
            raise ValueError(f"exact enumeration needs 2^H <= {MAX_ENUMERATION}; H = {H}")
        codes = torch.arange(2**H, device=self.W.device)
        hs = ((codes.unsqueeze(-1) >> torch.arange(H, device=self.W.device)) & 1).to(self.W.dtype)
        We = self._entry_weights()  # (n, H[, K])
        a = self.visible_bias[self.column].unsqueeze(0) + (
            torch.einsum("nh,ch->cn", We, hs)
            if self.visible == "bernoulli"
            else torch.einsum("nhk,ch->cnk", We, hs)
        )  # (2^H, n[, K])
        per_entry = self.units.log_normaliser(a)  # (2^H, n)
        rows = per_entry.new_zeros(hs.shape[0], self.num_rows).index_add(1, self.row, per_entry)
        hidden = (
            hs @ self.hidden_bias.T
            if self.hidden_bias.dim() == 2
            else (hs @ self.hidden_bias).unsqueeze(-1)
        )
        return torch.logsumexp(rows + hidden, 0)
