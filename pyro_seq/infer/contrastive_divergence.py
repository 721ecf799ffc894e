r"""Contrastive divergence (CD-k and persistent CD) as a :class:`pyro.infer.ELBO` subclass.

For an energy-based observation :math:`p(v) = e^{-F(v)}/Z` the log-likelihood gradient is a
difference of two expectations (Soyer & Möllenhoff eq. 5; Mittelman et al.
2014, eq. 1.19, 1.24),

.. math:: \nabla_\theta \log p(v) = -\nabla_\theta F(v) + \mathbb{E}_{v' \sim p}\big[\nabla_\theta
    F(v')\big],

and contrastive divergence (Hinton 2002) replaces the model expectation by the value at
:math:`v'`, the end of ``k`` block-Gibbs sweeps started at the data (CD-k), or at persistent
chains that continue from one update to the next (PCD, Tieleman 2008). The gradient of the
surrogate

.. math:: S = \sum_{\text{data}} F(v) - F(\operatorname{stop\_grad}(v'))

is exactly the CD update with the hidden expectations taken in closed form, as Mittelman et al.
write them (:math:`\mathbb{E}_{h|v}[h] = \sigma(b + W v)`): no gradient flows through the chain, and
where the parameters of :math:`F` depend on the data through other modules (the RTRBM's
:math:`r_{t-1}`), back-propagation through those modules is the BPTT recursion of Mittelman et
al. (eq. 1.16-1.27): the tests check it against the paper's recursion written out by hand.

**How this fits Pyro.** The model observes its data through an
:class:`~pyro_seq.distributions.EnergyBasedDistribution` site (an
:class:`~pyro_seq.distributions.RBM`, or the per-step RBMs of an RTRBM as one site with a time
dimension); there are no latent sample sites, so the guide is empty (a function that does
nothing, or that only registers parameters). ``SVI(model, guide, optim,
loss=ContrastiveDivergence(k=1))`` then applies the CD update with any ``pyro.optim``
optimiser and schedule. Plates, ``poutine.mask``/``.mask()`` and ``.to_event()`` behave as in
the ELBOs: subsampled plates scale the surrogate by ``N / B``, masked elements contribute
nothing. Observed sites with an ordinary (normalised) distribution add their negative
log-likelihood to the surrogate, so a model may mix both.

**What ``loss`` returns.** CD optimises no bound and has no loss value; :meth:`ContrastiveDivergence.loss` and
:meth:`ContrastiveDivergence.loss_and_grads` return a *monitoring quantity* only (``monitor=``):
``"reconstruction"`` (default), the mean squared error per visible element between the data and
its mean-field reconstruction :math:`\mathbb{E}[v | h = \sigma(b + W v)]`; or
``"pseudo_likelihood"``, the negative log pseudo-likelihood per visible unit, :math:`-\frac1V
\sum_i \log p(v_i \mid v_{-i})` (Bernoulli and softmax units). Neither is a bound on
:math:`\log p(v)`; estimate that with :meth:`~pyro_seq.distributions.RBM.ais_log_partition`.

References

[1] G. E. Hinton, "Training products of experts by minimizing contrastive divergence", 2002.
[2] T. Tieleman, "Training RBMs using approximations to the likelihood gradient", ICML 2008.
[3] R. Mittelman et al., supplementary material of "Structured recurrent temporal RBMs", 2014.
[4] H. Soyer, T. Möllenhoff, "What do you know?", sec. 2.
"""

from typing import Any, Callable, Dict, Optional, Union

import torch
from pyro import poutine
from pyro.distributions.torch_distribution import MaskedDistribution
from pyro.distributions.util import scale_and_mask
from pyro.infer.elbo import ELBO
from pyro.poutine.util import site_is_subsample
from pyro.util import warn_if_nan
from torch.distributions import Independent

from pyro_seq.distributions.rbm import EnergyBasedDistribution
from pyro_seq.pyro_internals import masked_distribution_mask

__all__ = ["ContrastiveDivergence", "energy_site"]

MONITORS = ("reconstruction", "pseudo_likelihood")


def energy_site(fn):
    """Unwrap ``.mask()`` and ``.to_event()`` around an energy-based distribution.

    :returns: ``(base, mask, event_dims)``: the :class:`EnergyBasedDistribution` (or None if
        ``fn`` is not one), the combined mask of the wrappers aligned with ``base.batch_shape``
        (or None), and the number of its batch dimensions that ``.to_event()`` reinterpreted.
    """
    masks, event_dims = [], 0
    while True:
        if isinstance(fn, MaskedDistribution):
            masks.append((masked_distribution_mask(fn), event_dims))
            fn = fn.base_dist
        elif isinstance(fn, Independent):
            event_dims += fn.reinterpreted_batch_ndims
            fn = fn.base_dist
        else:
            break
    if not isinstance(fn, EnergyBasedDistribution):
        return None, None, 0
    mask = None
    for m, outer in masks:  # a mask outside k reinterpreted dims lacks those k dims on the right
        m = m.reshape(m.shape + (1,) * (event_dims - outer))
        mask = m if mask is None else mask & m
    return fn, mask, event_dims


def _row_weights(site, mask, event_dims, like):
    """Float weights over ``base.batch_shape``: the wrappers' mask times the site's mask."""
    weight = torch.ones_like(like)
    if mask is not None:
        weight = weight * mask.to(like.dtype)
    if site["mask"] is not None:
        m = torch.as_tensor(site["mask"], device=like.device)
        weight = weight * m.reshape(m.shape + (1,) * event_dims).to(like.dtype)
    return weight


class ContrastiveDivergence(ELBO):
    r"""CD-k / persistent CD for models with energy-based observation sites (module docstring).

    :param int k: Gibbs sweeps per update (CD-k; Soyer & Möllenhoff compare CD-1 and CD-11).
    :param bool persistent: keep the chains between updates (PCD) instead of restarting them at
        the data. The chains are stored per site name (below: batches of different shapes).
    :param int num_chains: with ``persistent``, the number of fantasy chains per site. ``None``
        keeps one chain per row of the site (the minibatch size, as in Tieleman 2008); an int
        keeps that many chains of the *shared* distribution, which requires parameters that are
        the same for every batch row (an unconditional RBM): the negative phase is then the
        mean free energy of the chains, the same for every row.
    :param str monitor: ``"reconstruction"`` or ``"pseudo_likelihood"`` (module docstring).

    **One chain per row, batches of different shapes** (``num_chains=None``). The chains live
    in a buffer per site, ``chains[name]`` of shape ``(*B_max, *event)``, the largest batch
    shape seen in each dimension (for an RTRBM ``(batch_max, T_max, V)``: one chain per
    sequence slot and time step). A batch of shape ``B`` continues the chains of its corner
    ``[:B_1, :B_2, ...]``: a smaller last minibatch, or a padded batch with a shorter longest
    sequence (:class:`~pyro_seq.data.SequenceLoader`), continues the chains of its slots and
    steps and leaves the others as they are. A chain advances only at the rows the site scores
    (its mask and the wrappers' masks): at padded steps it keeps its state. A slot's chain
    starts at the data the first time a scored row reaches it; :meth:`reset_chains` restarts
    them all. A change of the number of batch dimensions or of the event shape (another
    model) is refused with a ValueError (call :meth:`reset_chains`).

    For per-step conditional RBMs (the RTRBM, hidden bias :math:`b + U r_{t-1}`, which depends
    on the sequence) the chain of slot ``(i, t)`` is a fantasy particle of "the step-``t``
    conditional RBM": each update runs ``k`` sweeps of the current batch's :math:`p(v_t \mid
    r_{t-1})` from the state the previous update left. Tieleman's argument (Tieleman 2008, the
    section introducing PCD: the parameters change little between updates, so a chain stays
    near equilibrium) covers the parameter change only; :math:`r_{t-1}` changes with the
    sequence in the slot, so the start is a sample of a *neighbouring* conditional, not of the
    new one. PCD on an RTRBM is a heuristic; CD-k from the data (the default) is the procedure
    of Mittelman et al. (2014), supplement sec. 1.

    Attributes after each step: ``last_negatives``, a dict of site name to the negative samples
    :math:`v'` that the update used (detached); ``last_monitor_count``, the number of visible
    elements the returned monitor is the mean over (data-parallel training,
    :class:`pyro_seq.train.distributed.AllReduceGradients`, weights the ranks' means by it).
    """

    #: the value of ``loss``/``loss_and_grads`` is a mean over ``last_monitor_count`` elements,
    #: not a sum over sequences
    returns_mean = True

    def __init__(
        self,
        k: int = 1,
        persistent: bool = False,
        num_chains: Optional[int] = None,
        monitor: str = "reconstruction",
    ) -> None:
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive int (Gibbs sweeps), got {k!r}")
        if num_chains is not None and (not isinstance(num_chains, int) or num_chains < 1):
            raise ValueError(f"num_chains must be a positive int or None, got {num_chains!r}")
        if num_chains is not None and not persistent:
            raise ValueError(
                "num_chains applies to persistent=True only (CD-k restarts its "
                "chains at the data, one per row)"
            )
        if monitor not in MONITORS:
            raise ValueError(f"monitor must be one of {MONITORS}, got {monitor!r}")
        super().__init__(num_particles=1)
        self.k, self.persistent, self.num_chains, self.monitor = k, persistent, num_chains, monitor
        self.chains: Dict[str, torch.Tensor] = {}
        self.chains_started: Dict[
            str, torch.Tensor
        ] = {}  # per site: bool (*B_max,), chains that have left the data
        self.last_negatives: Dict[str, torch.Tensor] = {}
        self.last_monitor_count = 0.0

    # ------------------------------------------------------------------ tracing
    def _get_trace(self, model, guide, args, kwargs):
        """Not used: CD traces the model once per step in :meth:`_model_trace`."""
        raise NotImplementedError("ContrastiveDivergence draws no latent particles")

    def _model_trace(self, model, guide, args, kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        latent = [
            name
            for name, site in guide_trace.nodes.items()
            if site["type"] == "sample" and not site_is_subsample(site)
        ]
        if latent:
            raise ValueError(
                f"ContrastiveDivergence trains models without latent sample sites; "
                f"the guide must be empty, but it samples {latent}"
            )
        trace = poutine.trace(model).get_trace(*args, **kwargs)
        energy, other = [], []
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            if not site["is_observed"]:
                raise ValueError(
                    f"ContrastiveDivergence: model site {name!r} is a latent sample "
                    f"site; energy-based models here observe all their variables "
                    f"(the hidden units are summed out in the free energy)"
                )
            base, mask, event_dims = energy_site(site["fn"])
            (energy if base is not None else other).append((name, site, base, mask, event_dims))
        if not energy:
            raise ValueError(
                "ContrastiveDivergence needs a model with an observed site whose "
                "distribution is energy-based (pyro_seq.distributions.RBM or another "
                "EnergyBasedDistribution); this model has none"
            )
        return energy, other

    # ------------------------------------------------------------------ negatives
    def _negative_free_energy(self, name, base, value, scored):
        """Free energy of the negative samples, per batch row (gradient w.r.t. parameters only).

        ``scored``: bool over ``base.batch_shape``, the rows the site scores (persistent chains
        advance there only)."""
        if not self.persistent:
            negatives = base.gibbs(value, self.k)
            self.last_negatives[name] = negatives
            return base.free_energy(negatives)
        if self.num_chains is None:
            chains = self._continue_row_chains(name, base, value, scored)
            self.last_negatives[name] = chains
            return base.free_energy(chains)
        shared = base.shared()
        chains = self.chains.get(name)
        if chains is None or chains.shape[1:] != shared.event_shape:
            start = value.detach().reshape((-1,) + tuple(shared.event_shape))
            index = torch.randint(start.shape[0], (self.num_chains,), device=start.device)
            chains = start[index]
        chains = shared.gibbs(chains, self.k)
        self.chains[name] = self.last_negatives[name] = chains
        mean = shared.free_energy(chains).mean(0)
        return mean.expand(base.batch_shape)

    def _continue_row_chains(self, name, base, value, scored):
        """``k`` sweeps of the per-row chains of the batch's corner of the buffer (class
        docstring); updates ``chains[name]`` at the scored rows; returns the chains used,
        shaped like ``value``."""
        value = value.detach()
        event = len(base.event_shape)
        nb = value.dim() - event
        batch, tail = tuple(value.shape[:nb]), (1,) * event
        buf, started = self.chains.get(name), self.chains_started.get(name)
        if buf is not None and (buf.dim() != value.dim() or buf.shape[nb:] != value.shape[nb:]):
            raise ValueError(
                f"ContrastiveDivergence: site {name!r} has values of shape "
                f"{tuple(value.shape)} but persistent chains of shape "
                f"{tuple(buf.shape)} (another number of batch dimensions or another "
                f"event shape); call reset_chains() before training another model"
            )
        if buf is None:
            buf = value.new_zeros(value.shape)
            started = torch.zeros(batch, dtype=torch.bool, device=value.device)
        buf = buf.to(device=value.device, dtype=value.dtype)
        started = started.to(value.device)
        size = tuple(max(a, b) for a, b in zip(buf.shape[:nb], batch))
        if size != tuple(buf.shape[:nb]):  # a larger batch: grow the buffer
            old = tuple(slice(0, s) for s in buf.shape[:nb])
            grown = buf.new_zeros(size + tuple(value.shape[nb:]))
            grown[old] = buf
            grown_started = started.new_zeros(size)
            grown_started[old] = started
            buf, started = grown, grown_started
        corner = tuple(slice(0, s) for s in batch)
        scored = scored.expand(batch)
        fresh = (scored & ~started[corner]).reshape(batch + tail)
        start = torch.where(fresh, value, buf[corner])  # new chains start at the data
        chains = base.gibbs(start, self.k)
        buf[corner] = torch.where(scored.reshape(batch + tail), chains, start)
        started[corner] |= scored
        self.chains[name], self.chains_started[name] = buf, started
        return chains

    def _monitor(self, energy):
        total, count = 0.0, 0
        with torch.no_grad():
            for _name, site, base, mask, event_dims in energy:
                value = site["value"]
                if self.monitor == "reconstruction":
                    per_row = base.reconstruction_error(value)
                else:
                    per_row = -base.pseudo_log_likelihood(value)
                weight = _row_weights(site, mask, event_dims, per_row)
                total += float((per_row * weight).sum())
                count += float(weight.sum()) * base.num_visible
        self.last_monitor_count = count
        return total / max(count, 1.0)

    # ------------------------------------------------------------------ ELBO interface
    def _surrogate(self, model, guide, args, kwargs):
        energy, other = self._model_trace(model, guide, args, kwargs)
        surrogate = 0.0
        for name, site, base, mask, event_dims in energy:
            value = site["value"]
            positive = base.free_energy(value)
            weight = _row_weights(site, mask, event_dims, positive)
            per_row = positive - self._negative_free_energy(name, base, value, weight > 0)
            surrogate = surrogate + site["scale"] * (per_row * weight).sum()
        for _, site, _, _, _ in other:
            log_p = site["fn"].log_prob(site["value"])
            surrogate = surrogate - scale_and_mask(log_p, site["scale"], site["mask"]).sum()
        return surrogate, energy

    def differentiable_loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Union[torch.Tensor, float]:
        r"""The surrogate :math:`S = \sum F(v) - F(v')` (plus :math:`-\log p` of ordinary
        observed sites), whose gradient is the CD update. Its value is not a loss of any bound."""
        surrogate, _ = self._surrogate(model, guide, args, kwargs)
        warn_if_nan(surrogate, "contrastive divergence surrogate")
        return surrogate

    def loss_and_grads(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        """Back-propagate the CD surrogate into the parameters; return the monitoring quantity."""
        surrogate, energy = self._surrogate(model, guide, args, kwargs)
        if not bool(torch.isfinite(torch.as_tensor(surrogate)).all()):
            raise ValueError(
                "contrastive divergence surrogate is not finite; check the data "
                "and the learning rate"
            )
        if torch.is_tensor(surrogate) and surrogate.requires_grad:
            surrogate.backward()
        return self._monitor(energy)

    def loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        """The monitoring quantity (``monitor=``), with no gradient and no Gibbs sampling."""
        with torch.no_grad():
            energy, _ = self._model_trace(model, guide, args, kwargs)
        return self._monitor(energy)

    def reset_chains(self) -> None:
        """Forget the persistent chains (they restart at the data on the next step)."""
        self.chains.clear()
        self.chains_started.clear()
