"""The sequence-model contract: model/guide pairs defined once, by ``init`` and ``step``.

Every architecture subclasses :class:`SequenceModel` and implements four methods::

    model_init(state, x, mask)      model_step(state, t, x, mask)
    guide_init(state, x, mask)      guide_step(state, t, x, mask)

``x`` is a batch-first tensor ``(batch, T, D)``, ``mask`` a bool tensor ``(batch, T)`` (True for
real steps, a prefix of each row), ``t`` a 0-based step index and ``state`` a
:class:`~pyro_seq.ops.SequenceState`. Step ``t`` samples the latent site ``f"z_{t+1}"`` (and the
model observes ``f"x_{t+1}"``), masked by ``mask[:, t]`` so that padded steps contribute exactly
zero. Steps read what they need from the past from ``state`` only; per-particle tensors there
have shape ``(*particles, batch, ...)`` and ``state.shared`` holds tensors common to all
particles.

Ordering rule (the one of :class:`pyro.infer.SMCFilter`): at each step the guide runs first, then
the model, on the same state. The guide therefore only *reads* the latent history (e.g.
``state["z"]`` is z_{t-1} while it runs) and writes keys of its own; the model step writes the
new latent ``state["z"] = z_t``.

Rules for ``init`` that particle methods rely on: ``init`` does not sample; after it FIVO gives
every per-particle tensor a leading particle axis of size 1, and before each resampling every
per-particle tensor must have shape ``(K or 1, batch, ...)``. Anything with another shape
(a time axis, a particle-independent context) belongs in ``state.shared``.

Observations: a model step observes ``x_t`` with :meth:`SequenceModel.observe`, passing the
*features* of the emission network (e.g. ``[z_t, d_t]``). Evaluated one step at a time (particle
methods) it emits the site at once; in a full-sequence run the emission network is evaluated
once over all steps after the latent loop and the per-step sites ``x_{t+1}`` are emitted from
its slices. The same network and likelihood serve both orders, so the log-densities agree
(tested); batching over time only replaces T small matrix products by one large one.

Time-parallel scoring: the steps of DMM and SRNN are written so that ``t`` may be an int (one
step) or ``slice(None)`` (every step at once, with time at dim -2 of each tensor). When the
full-sequence model runs while *all* its latent values are already fixed by an enclosing
:class:`~pyro.poutine.replay_messenger.ReplayMessenger` (as inside every Pyro ELBO, which
replays the model against the guide's trace), :class:`StepProgram` fills ``state`` with the
latent history ``z_{0:T-1}`` and calls the model step once with ``t = slice(None)``: the
networks then run once over all steps, and :meth:`SequenceModel.sample_latent` /
:meth:`SequenceModel.observe` still emit one site per step, from slices of the batched
distributions, in ``pyro.markov``. Sites, values and log-densities are those of the step-by-step
loop (tested); only the evaluation order of the networks differs. With any handler that could
change sample values (``condition``, ``do``, enumeration, ...) the step-by-step loop runs.
Models opt in with ``time_parallel = True``; a model whose all-at-once path needs more than that
(e.g. the KVAE needs every real step's frame) says so per call in
:meth:`SequenceModel.scores_all_steps`, from that call's arguments only.

Sharing with the guide: every Pyro ELBO runs the guide and then the model replayed against the
guide's trace, whose ``_RETURN`` node holds the :class:`~pyro_seq.ops.SequenceState` the guide
returned. A model that lists keys of ``state.shared`` in ``shared_with_guide`` (tensors that
its ``init`` would compute identically, such as SRNN's deterministic states ``d_{1:T}``), and
the submodules they depend on in ``shared_with_guide_modules``, takes those tensors from the
guide's state instead of recomputing them, when it scores time-parallel and the guide ran on
equal ``x``, ``mask`` and ``observed``, in the same grad mode, with parameters of those
submodules still equal to their values then (a copy is kept by :class:`GuideRecord`; optimizers
that write ``p.data`` do not bump version counters). A guide step may also leave per-step
values in the record (:meth:`GuideRecord.append`), e.g. the prior a Res_q guide computes at its
own ``z_{t-1}``, which the model reuses when its latent history is the guide's samples
(:meth:`GuideRecord.steps_at`). The values and their gradients are those of recomputation; only
the work is done once (the gradient of a shared tensor sums its uses in model and guide, as
the gradients of two equal computations would).

Scanned guides: a model may also define :meth:`SequenceModel.guide_scan`, which runs every
guide step at once after ``guide_init`` (the DMM's combiner recursion as one autograd node,
:func:`pyro_seq.nn.combiner_scan`). The full-sequence guide uses it only when the handlers
around it cannot change its sample values or add batch dimensions (:func:`plain_guide_stack`:
inside ``Trace_ELBO`` and the trainer; not under a replay or a condition) and emits the same
per-step sites (:meth:`SequenceModel.sample_presampled`); the step loop serves everything else,
so particle methods never see the difference. A model whose scan takes leading particle
dimensions sets ``guide_scan_particles = True``: it then also runs under the one vectorised
particle plate of a Pyro ELBO (``num_particles > 1, vectorize_particles=True``, and
:class:`~pyro_seq.infer.IWAE`), drawing noise of shape ``(K, batch, Z)`` per step as the step
loop does under that plate (:func:`~pyro_seq.models.handlers.guide_scan_particles`).

``m.model`` and ``m.guide`` are :class:`StepProgram` objects: calling them runs the whole
sequence (``init`` then ``step`` for every ``t`` inside ``pyro.markov``, the batch inside
``pyro.plate("sequences")``), so they work with :class:`pyro.infer.SVI` and every stock ELBO;
their ``init``/``step`` methods expose the same code one step at a time to particle methods
(:class:`pyro_seq.infer.FIVO`). The loop over steps *is* the model, so the two views cannot drift
apart.
"""

import functools
from types import MappingProxyType
from typing import Any, Callable, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions.torch_distribution import MaskedDistribution, TorchDistribution
from torch import nn

from pyro_seq.distributions.scored_value import PresampledValue, ScoredValue
from pyro_seq.models.contract import ModelContract
from pyro_seq.models.emission import ObservedElements
from pyro_seq.models.handlers import (
    guide_scan_particles,
    plain_guide_stack,  # noqa: F401  (re-exported: the docstrings here name it)
    replayed_latents,
    sole_replay,
)
from pyro_seq.nn.init import bernoulli_output_layer, init_output_bias, init_weights
from pyro_seq.ops.linalg import broadcast_shapes
from pyro_seq.ops.state import SequenceState
from pyro_seq.validation import (
    module_device,
    positive_int,
    prepare_sequences,
    validate_inputs,
    validate_mask,
    validate_sequences,
)

#: Alias of :func:`pyro_seq.validation.validate_sequences`, the package's one validator.
check_sequences = validate_sequences


def _observed_emission(fn, element_mask):
    """``fn`` scored on the observed elements of its value only
    (:class:`pyro_seq.models.emission.ObservedElements`)."""
    return ObservedElements(fn, element_mask)


def _same_tensor(a, b):
    """``a`` and ``b`` are both None, or tensors of equal shape, dtype, device and values."""
    if a is None or b is None:
        return a is None and b is None
    if a is b:
        return True
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
        and bool(torch.equal(a, b))
    )


class GuideRecord:
    """What a full-sequence guide run leaves for the model replayed against its trace.

    Created by :meth:`StepProgram.__call__` for the guide of a model with
    ``shared_with_guide`` keys, kept in the returned state's ``guide_record``: the validated
    inputs, the grad mode, a copy of the parameters of ``shared_with_guide_modules``, and
    per-step values that guide steps :meth:`append`. See the module docstring.

    :param SequenceModel owner: the model whose guide ran.
    :param SequenceState state: the guide's state (its ``shared`` dict is what is shared).
    :param tuple inputs: validated ``(x, mask, observed, inputs)`` (the last two may be None).
    """

    def __init__(self, owner, state, inputs):
        self.owner, self.shared, self.inputs = owner, state.shared, inputs
        self.grad_enabled = torch.is_grad_enabled()
        self.parameters = self._parameters()
        with torch.no_grad():
            self.values = [p.detach().clone() for p in self.parameters]
        self.requires_grad = [p.requires_grad for p in self.parameters]
        self.steps = {}

    def _parameters(self):
        return [
            p
            for name in self.owner.shared_with_guide_modules
            for p in getattr(self.owner, name).parameters()
        ]

    def append(self, key, z_prev, value):
        """Record ``value`` (a tensor or tuple of tensors) computed at ``z_prev`` by the guide
        step that runs next in the sequence, under ``key``."""
        self.steps.setdefault(key, []).append((z_prev, value))

    def matches(self, owner, inputs):
        """The model ``owner`` on validated ``inputs`` may use what this guide run computed:
        same model, equal data, missing entries and known inputs, same grad mode, equal
        parameters (see the class docs)."""
        if owner is not self.owner or torch.is_grad_enabled() != self.grad_enabled:
            return False
        if len(inputs) != len(self.inputs) or not all(
            _same_tensor(a, b) for a, b in zip(inputs, self.inputs)
        ):
            return False
        current = self._parameters()
        if len(current) != len(self.values):
            return False
        with torch.no_grad():
            return all(
                p.requires_grad == r and _same_tensor(p.detach(), v)
                for p, v, r in zip(current, self.values, self.requires_grad)
            )

    def steps_at(self, key, history):
        """The per-step values under ``key``, stacked with time at dim -2, when the guide
        computed step ``t``'s at ``history[t]`` for every ``t`` (identical objects, or equal
        values for the initial state); otherwise None.

        :param list history: the model's latent history ``z_{0:T-1}``, T tensors.
        """
        steps = self.steps.get(key)
        if steps is None or len(steps) != len(history):
            return None
        for i, ((z_guide, _), z_model) in enumerate(zip(steps, history)):
            if z_guide is not z_model and not (i == 0 and _same_tensor(z_guide, z_model)):
                return None
        values = [v for _, v in steps]
        if torch.is_tensor(values[0]):
            return stack_time(values)
        return tuple(stack_time(list(v)) for v in zip(*values))


def replayed_guide_record(owner, inputs):
    """The :class:`GuideRecord` of ``owner``'s guide in the trace an enclosing replay holds
    (its ``_RETURN`` node), when :meth:`GuideRecord.matches` holds; otherwise None."""
    replay = sole_replay()
    if replay is None:
        return None
    node = replay.trace.nodes.get("_RETURN")
    state = node.get("value") if node is not None else None
    record = getattr(state, "guide_record", None)
    if not isinstance(record, GuideRecord) or not record.matches(owner, inputs):
        return None
    return record


class _StepMasked(MaskedDistribution):
    """``fn.mask(mask)`` that keeps itself when expanded to its own batch shape (see
    :func:`masked`)."""

    def expand(self, batch_shape, _instance=None):
        if _instance is None and torch.Size(batch_shape) == self.batch_shape:
            return self
        return super().expand(batch_shape, _instance)


def masked(fn: TorchDistribution, mask: torch.Tensor) -> MaskedDistribution:
    """``fn.mask(mask)`` for a per-step site: the same distribution, whose ``expand`` to the
    batch shape it already has returns itself. Pyro's plates expand every site's distribution
    to the plate shape; the stock ``MaskedDistribution`` then rebuilds itself and every layer
    below it (e.g. ``Independent`` and ``Normal``) even when nothing changes, a fixed cost per
    site of a per-step loop. Distributions are immutable, so keeping the object is equivalent.
    """
    return _StepMasked(fn, mask)


def shift_right(x: torch.Tensor) -> torch.Tensor:
    """``u_t = x_{t-1}`` with ``u_1 = 0``: ``(batch, T, D) -> (batch, T, D)``."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


def cache_guide_prior(
    state: SequenceState, t: int, z_prev: torch.Tensor, prior: Tuple[torch.Tensor, torch.Tensor]
) -> None:
    """Leave the prior ``p(z_t | z_{t-1})`` a Res_q guide step computed at its own ``z_{t-1}``
    for a model step that runs next on the same ``state`` (FIVO); see :func:`prior_from_guide`."""
    state.shared["_guide_prior"] = (t, z_prev, prior)


def prior_from_guide(
    state: SequenceState, t: "Step"
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """The prior ``(loc, scale)`` the guide's Res_q step computed at step ``t``, when the model
    runs on the same state (FIVO) with the same ``z_{t-1}`` (``state["z"]``); None otherwise."""
    cached = state.shared.pop("_guide_prior", None)
    if cached is None or cached[0] != t:
        return None
    z_guide, z_model = cached[1], state["z"]
    if z_guide is z_model or (z_guide.shape == z_model.shape and torch.equal(z_guide, z_model)):
        return cached[2]
    return None


def on_real_steps(
    fn: Callable[[torch.Tensor], Union[torch.Tensor, Tuple[torch.Tensor, ...]]],
    inputs: torch.Tensor,
    mask: torch.Tensor,
) -> Any:  # what fn returns: a tensor or a tuple of them, each laid out (..., B, T, F')
    """``fn(inputs)`` evaluated on the real steps only, for time-parallel scoring.

    ``fn`` maps rows ``(N, F)`` to a tensor or a tuple of tensors ``(N, F')`` (a network of
    the model applied step-wise: a transition, an emission network). It runs on the rows of
    ``inputs (..., B, T, F)`` where ``mask (B, T)`` is True; the outputs are laid out as
    ``(..., B, T, F')``, and each padded step gets the outputs of the first real row (finite
    values for its masked-out site, which gets no gradient). On a ragged minibatch this skips
    the padding (about 45% of the cells of a random JSB minibatch of 20).
    """
    lead = inputs.shape[:-1]
    real = mask.expand(lead).reshape(-1)
    index = real.nonzero().squeeze(-1)
    if index.numel() == real.numel():
        return fn(inputs)
    out = fn(inputs.reshape(-1, inputs.shape[-1]).index_select(0, index))
    rows = torch.where(real, real.long().cumsum(0) - 1, 0)  # packed row of every cell

    def unpack(v):
        return v.index_select(0, rows).view(*lead, v.shape[-1])

    return unpack(out) if torch.is_tensor(out) else tuple(unpack(v) for v in out)


def stack_time(values: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack per-step tensors ``(..., F)`` into ``(..., T, F)`` after broadcasting them."""
    shape = broadcast_shapes(*(v.shape for v in values))
    return torch.stack([v.expand(shape) for v in values], dim=-2)


def normal(loc: torch.Tensor, scale: torch.Tensor) -> TorchDistribution:
    """Diagonal Gaussian with event shape ``(dim,)``: the latent layer of DMM and SRNN."""
    return dist.Normal(loc, scale).to_event(1)


def time_steps(
    params: Union[torch.Tensor, Sequence[torch.Tensor]],
) -> Union[Tuple[torch.Tensor, ...], List[Tuple[torch.Tensor, ...]]]:
    """Split parameters with time at dim -2 into per-step values (a tensor or a tuple of them).

    Uses :func:`torch.unbind` (one ``stack`` in the backward pass) rather than indexing every
    step, whose backward would cost a full-size gradient per step.
    """
    if torch.is_tensor(params):
        return params.unbind(-2)
    return list(zip(*(p.unbind(-2) for p in params)))


#: A step index, or ``slice(None)`` for every step at once (time-parallel scoring).
Step = Union[int, slice]


class StepProgram:
    """A Pyro program given by ``init``/``step``; calling it runs the whole sequence.

    :param SequenceModel owner: the module whose parameters the program uses.
    :param str role: ``"model"`` or ``"guide"``.
    """

    def __init__(self, owner: "SequenceModel", role: str) -> None:
        self._owner = owner
        self.role = role
        self._init = getattr(owner, f"{role}_init")
        self._step = getattr(owner, f"{role}_step")
        self._plate: Optional[pyro.plate] = None
        self._plate_key: Optional[tuple] = None

    def __repr__(self):
        return f"{type(self._owner).__name__}.{self.role}"

    @property
    def owner(self) -> "SequenceModel":
        """The :class:`SequenceModel` whose parameters and networks the program uses."""
        return self._owner

    @property
    def device(self) -> Optional[torch.device]:
        """The device of the owner's parameters, where ``x``, ``mask`` and ``observed`` must be.

        Drivers such as :class:`~pyro_seq.infer.FIVO` check their batch against it before
        running any step."""
        return module_device(self._owner)

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the owner's parameters, or buffers without parameters (the
        default dtype without either): ``x`` and ``inputs`` are converted to it."""
        for tensors in (self._owner.parameters(), self._owner.buffers()):
            for p in tensors:
                if p.is_floating_point():
                    return p.dtype
        return torch.get_default_dtype()

    def plate(self, x: torch.Tensor, num_sequences: Optional[int] = None) -> pyro.plate:
        """The batch plate; ``num_sequences`` (data-set size) scales a minibatch to the full sum.

        The plate object is reused while the batch size and ``num_sequences`` stay the same
        (particle methods enter it once per step).
        """
        key = (x.shape[0], num_sequences, x.device)
        if self._plate_key != key:
            batch = x.shape[0]
            if num_sequences is None:
                # pyro.plate takes a torch.device too (its annotation says str)
                self._plate = pyro.plate("sequences", batch, dim=-1, device=x.device)  # type: ignore[arg-type]
            else:
                self._plate = pyro.plate(
                    "sequences",
                    num_sequences,
                    subsample=torch.arange(batch, device=x.device),
                    dim=-1,
                    device=x.device,  # type: ignore[arg-type]
                )
            self._plate_key = key
        assert self._plate is not None  # built above for this key
        return self._plate

    def _validate(self, state, x, mask, observed, inputs=None):
        """The package's validator; with ``observed`` also zero-fill the missing entries of ``x``
        (what the networks see) and keep the per-element mask in ``state.shared["observed"]``
        (what the observation sites are scored on); ``x`` is converted to :attr:`dtype`. Known
        ``inputs`` (controls, ``(batch, T,
        input_dim)``) go to ``state.shared["inputs"]``; a model takes them when its
        ``input_dim`` is positive. ``x``, ``mask``, ``observed`` and ``inputs`` must be on the
        device of the model's parameters (a ValueError naming the tensor otherwise)."""
        owner = self._owner
        x, mask, seen = prepare_sequences(
            x, mask, owner.obs_dim, owner.binary_observations, observed, device=self.device
        )
        x = x.to(self.dtype)  # float64 data into a float32 model (and back), as the loader does
        if seen is not None:
            state.shared["observed"] = seen
        u = validate_inputs(inputs, x.shape[:2], owner.input_dim, mask, x.dtype, self.device)
        if u is not None:
            state.shared["inputs"] = u
        return x, mask

    def init(
        self,
        state: SequenceState,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        num_sequences: Optional[int] = None,
        observed: Optional[torch.Tensor] = None,
        inputs: Optional[torch.Tensor] = None,
    ) -> None:
        """Register parameters and fill ``state`` for step 0 (inside the batch plate).

        Validates ``(x, mask)`` once per sequence pass (:func:`~pyro_seq.validation.validate_sequences`
        with the model's ``obs_dim`` and likelihood), so particle methods that drive the steps
        refuse bad input with the same messages as the full-sequence program. ``observed``
        (missing data inside sequences, ``(batch, T)`` or ``(batch, T, D)``) is kept in
        ``state.shared`` for the observation sites; the caller must pass ``step`` an ``x`` that
        is finite at the unobserved entries (FIVO passes the zero-filled one).
        """
        owner = self._owner
        x, mask = self._validate(state, x, mask, observed, inputs)
        pyro.module(owner.module_name, owner)
        with self.plate(x, num_sequences):
            self._init(state, x, mask)

    def step(
        self,
        state: SequenceState,
        t: int,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        num_sequences: Optional[int] = None,
        observed: Optional[torch.Tensor] = None,
        inputs: Optional[torch.Tensor] = None,
    ) -> None:
        """Run step ``t`` (0-based) inside the batch plate.

        ``mask`` is the one given to :meth:`init` (validated there); a mask that is None or not
        bool is converted here (and its values checked) so every step sees a bool mask.
        ``observed`` and ``inputs`` are read from ``state`` (set by :meth:`init`); the arguments
        are accepted so that drivers may pass the same arguments to ``init`` and ``step``.
        """
        if mask is None or mask.dtype != torch.bool:
            mask = validate_mask(mask, x.shape[:2], device=x.device)
        with self.plate(x, num_sequences):
            self._step(state, t, x, mask)

    def __call__(
        self,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        num_sequences: Optional[int] = None,
        observed: Optional[torch.Tensor] = None,
        inputs: Optional[torch.Tensor] = None,
    ) -> SequenceState:
        """Run the whole sequence: ``init`` then ``step`` for t = 0..T-1 in ``pyro.markov``.

        :param torch.Tensor x: ``(batch, T, D)``.
        :param mask: ``(batch, T)`` bool prefix mask or None.
        :param int num_sequences: size of the full data set when ``x`` is a minibatch.
        :param observed: missing data inside sequences: bool ``(batch, T)`` or ``(batch, T, D)``
            (True = observed) or None. Unobserved entries of ``x`` may hold anything (NaN
            included): the networks see zeros there and the observation sites are scored on the
            observed elements only (a fully unobserved step contributes exactly 0).
        :param inputs: known inputs (controls) ``(batch, T, input_dim)`` for models with a
            positive ``input_dim`` (e.g. :class:`~pyro_seq.models.KVAE` with ``control_dim``);
            None otherwise.
        :returns: the final :class:`SequenceState`.
        """
        owner = self._owner
        state = SequenceState()
        x, mask = self._validate(state, x, mask, observed, inputs)
        pyro.module(owner.module_name, owner)
        T = x.shape[1]
        # what a guide run's record must match: the data, the missing entries, the known inputs
        run_inputs = (x, mask, state.shared.get("observed"), state.shared.get("inputs"))
        latents = None
        if self.role == "model" and owner.scores_all_steps(state, x, mask):
            latents = replayed_latents(owner.latent_names, T)
            if latents is not None and owner.shared_with_guide:
                record = replayed_guide_record(owner, run_inputs)
                if record is not None:  # the guide's tensors for the same inputs and weights
                    state.guide_record = record
                    state.shared.update(
                        {k: record.shared[k] for k in owner.shared_with_guide if k in record.shared}
                    )
        elif self.role == "guide" and owner.shared_with_guide:
            state.guide_record = GuideRecord(owner, state, run_inputs)
        with self.plate(x, num_sequences):
            self._init(state, x, mask)
            if latents is not None:  # every latent fixed by a replay: score all steps at once
                state.replayed = latents
                for name, values in latents.items():
                    history = [state[name]] + values[:-1]  # z_{0:T-1}
                    state[name] = stack_time(history)
                self._step(state, slice(None), x, mask)
            elif not self._scanned_guide(state, x, mask):
                if self.role == "model":
                    state.deferred_features = []
                for t in pyro.markov(range(T)):
                    self._step(state, t, x, mask)
                if state.deferred_features:
                    owner._observe_deferred(state, x, mask)
        return state

    def _scanned_guide(self, state, x, mask):
        """Whether the guide ran every step at once (:meth:`SequenceModel.guide_scan`): only a
        model that defines it, only under :func:`plain_guide_stack` (or one particle plate
        for a model with ``guide_scan_particles``), only if it accepts."""
        owner = self._owner
        if self.role != "guide" or type(owner).guide_scan is SequenceModel.guide_scan:
            return False
        particles = guide_scan_particles(self._plate, owner.guide_scan_particles)
        if particles is None:
            return False
        if particles:
            return owner.guide_scan(state, x, mask, particles=particles)
        return owner.guide_scan(state, x, mask)


class SequenceModel(ModelContract):
    """Base class of the latent-variable architectures: holds the networks, exposes
    ``.model``/``.guide``, and declares the defaults of the model contract
    (:mod:`pyro_seq.models.contract`) for a Pyro model/guide pair.

    Subclasses set ``obs_dim`` and implement ``model_init``, ``model_step``, ``guide_init``,
    ``guide_step`` (see the module docstring for the protocol).
    """

    module_name = "sequence_model"
    objectives: Tuple[str, ...] = ("elbo", "meanfield", "iwae", "fivo")
    evaluation_methods: Tuple[str, ...] = ("elbo", "iwae", "smc")
    tasks: FrozenSet[str] = frozenset({"generate", "impute", "denoise", "forecast"})
    impute_methods: Tuple[str, ...] = ("iterative", "importance")
    unsupported: Mapping[str, str] = MappingProxyType(
        {
            "cd": "contrastive divergence trains energy-based models; use elbo, iwae or fivo",
            "exact": "its likelihood has no closed form; use iwae or smc for a bound",
            "ais": "AIS estimates the partition functions of energy-based models; use iwae or smc",
            "raise": "reverse AIS scores energy-based models; use iwae or smc",
            "reverse_ais": "reverse AIS scores energy-based models; use iwae or smc",
            "pseudo_likelihood": "it is not energy-based; use elbo, iwae or smc",
            **{
                method: "imputing whole frames through a Kalman smoother over encodings needs an "
                "LGSSM over the codes (kvae); use iterative or importance"
                for method in ("smoothing", "filtering", "generation")
            },
        }
    )

    def __init__(self, obs_dim: int) -> None:
        super().__init__()
        self.obs_dim: int = positive_int("obs_dim", obs_dim)
        self.model = StepProgram(self, "model")
        self.guide = StepProgram(self, "guide")

    def scores_all_steps(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> bool:
        """Whether a full-sequence model run with ``x``, ``mask`` and ``state.shared`` (its
        ``observed`` and ``inputs``) may score every step at once when a replay fixes every
        latent (module docstring). Decided per call from its arguments only; the default is
        ``time_parallel``."""
        return self.time_parallel

    def initialise(
        self, train_sequences: Sequence[torch.Tensor], scheme: str = "bias"
    ) -> List[str]:
        """``TrainConfig.init`` on a fresh start: ``"none"`` does nothing; a scheme of
        :data:`pyro_seq.nn.INIT_SCHEMES` redraws the weights with
        :func:`~pyro_seq.nn.init_weights` when the model lists it in ``weight_init_schemes``;
        every scheme but ``"none"`` sets a Bernoulli emission's output bias to the logits of the
        training set's frequencies (:func:`~pyro_seq.nn.init_output_bias`). Returns the names of
        what was initialised (``"weights"``, ``"output_bias"``)."""
        done: List[str] = []
        if scheme == "none":
            return done
        if scheme in self.weight_init_schemes:
            init_weights(self, scheme)
            done.append("weights")
        if bernoulli_output_layer(self) is not None:
            init_output_bias(self, train_sequences)
            done.append("output_bias")
        return done

    # Subclasses that call ``observe`` define ``self.emitter(features) -> params`` (a module)
    # and ``self.likelihood(params) -> distribution`` with event shape ``(obs_dim,)``.

    emitter: nn.Module  #: set by subclasses that call ``observe``: features -> parameters
    likelihood: Callable[..., TorchDistribution]  #: parameters -> distribution (``observe``)
    time_parallel = False  #: the steps accept ``t = slice(None)`` (see the module docstring)
    latent_names = ("z",)  #: latent site prefixes; ``state[name]`` holds the previous value
    #: keys of ``state.shared`` a time-parallel model run takes from its guide's run, and the
    #: submodules they depend on (see "Sharing with the guide" in the module docstring)
    shared_with_guide = ()
    shared_with_guide_modules = ()
    #: :meth:`guide_scan` takes a leading particle shape (``particles=``; module docstring)
    guide_scan_particles = False

    def sample_latent(
        self,
        state: SequenceState,
        name: str,
        t: Step,
        make_dist: Callable[..., TorchDistribution],
        params: Sequence[torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Sample the latent site(s) ``f"{name}_{t+1}"`` from ``make_dist(*params)``.

        :param str name: site prefix (also the ``state`` key of the latent history).
        :param t: step index, or ``slice(None)`` for all steps (time-parallel scoring).
        :param make_dist: builds the per-step distribution (event shape ``(dim,)``) from params.
        :param tuple params: tensors ``(..., dim)`` for one step or ``(..., T, dim)`` for all.
        :returns: the value(s), ``(..., dim)`` or ``(..., T, dim)``.
        """
        if not isinstance(t, slice):
            return pyro.sample(f"{name}_{t + 1}", masked(make_dist(*params), mask[:, t]))
        expected = state.replayed[name]
        self._emit_steps(name, make_dist, params, expected, mask, ScoredValue, "replayed")
        return stack_time(expected)

    def sample_presampled(
        self,
        name: str,
        make_dist: Callable[..., TorchDistribution],
        params: Sequence[torch.Tensor],
        values: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Emit the guide sites ``f"{name}_{t+1}"`` for every step at once, with values drawn
        ahead (reparameterised) by the caller: the site distributions are ``make_dist`` at the
        per-step slices of ``params`` and each site returns its slice of ``values``
        (:class:`~pyro_seq.distributions.PresampledValue`, log-densities computed in one batch).
        For :meth:`guide_scan`, which runs only under :func:`plain_guide_stack`.

        :param tuple params: tensors ``(..., T, dim)``; ``values`` ``(..., T, dim)``.
        """
        self._emit_steps(
            name, make_dist, params, list(values.unbind(-2)), mask, PresampledValue, "drawn"
        )
        return values

    @staticmethod
    def _emit_steps(name, make_dist, params, values, mask, wrapper, what):
        """One site per step from batched ``params`` (time at dim -2), each taking its value from
        the list ``values`` with its log-density sliced from one batched evaluation."""
        steps = time_steps(tuple(params))
        log_probs = make_dist(*params).log_prob(stack_time(values)).unbind(-1)
        like = make_dist(*steps[0])  # shapes of every step; the others are built if used
        for i in pyro.markov(range(len(values))):
            fn = wrapper((like, functools.partial(make_dist, *steps[i])), values[i], log_probs[i])
            value = pyro.sample(f"{name}_{i + 1}", masked(fn, mask[:, i]))
            if value is not values[i]:
                raise RuntimeError(f"site {name}_{i + 1} did not take its {what} value")

    def guide_scan(
        self,
        state: SequenceState,
        x: torch.Tensor,
        mask: torch.Tensor,
        particles: Tuple[int, ...] = (),
    ) -> bool:
        """Optionally run every guide step at once, after ``guide_init``: return True when done
        (all latent sites emitted, e.g. by :meth:`sample_presampled`, and ``state`` as the step
        loop leaves it), False to let the step loop run. Called only for a full-sequence guide
        run under :func:`plain_guide_stack`, or, with ``guide_scan_particles = True``, under
        one particle plate: then ``particles`` is ``(K, 1, ..., 1)``, the leading shape of every
        draw (``(*particles, batch, Z)`` per step). The default does nothing."""
        return False

    def observe(
        self,
        state: SequenceState,
        t: Step,
        x: torch.Tensor,
        mask: torch.Tensor,
        features: torch.Tensor,
    ) -> None:
        """Observe ``x_t`` (site ``f"x_{t+1}"``) from emission ``features`` ``(..., F)``.

        Per step when driven by ``step``; deferred to one batched evaluation of
        ``self.emitter`` when the whole sequence runs step by step; batched at once when
        ``t = slice(None)`` (see the module docstring). With missing data
        (``state.shared["observed"]``, set from the programs' ``observed=``) each site is scored
        on its observed elements only (:func:`_observed_emission`).
        """
        seen = state.shared.get("observed")
        if isinstance(t, slice):
            self._emit_observations(on_real_steps(self.emitter, features, mask), x, mask, seen)
            return
        deferred = getattr(state, "deferred_features", None)
        if deferred is not None:
            deferred.append(features)
            return
        fn = self.likelihood(self.emitter(features))
        if seen is not None:
            fn = _observed_emission(fn, seen[:, t])
        pyro.sample(f"x_{t + 1}", masked(fn, mask[:, t]), obs=x[:, t])

    def _observe_deferred(self, state, x, mask):
        features, state.deferred_features = state.deferred_features, None
        self._emit_observations(
            self.emitter(stack_time(features)), x, mask, state.shared.get("observed")
        )

    def _emit_observations(self, params, x, mask, seen=None):
        """One site ``x_{t+1}`` per step from emission parameters with time at dim -2."""
        steps = time_steps(params)
        fn_all = self.likelihood(params)
        if seen is None:
            log_probs = fn_all.log_prob(x).unbind(-1)
        else:
            log_probs = _observed_emission(fn_all, seen).log_prob(x).unbind(-1)
        values = x.unbind(1)

        def step_fn(t):
            fn = self.likelihood(steps[t])
            return fn if seen is None else _observed_emission(fn, seen[:, t])

        like = step_fn(0)  # shapes of every step; the others are built if used
        for t in pyro.markov(range(x.shape[1])):
            fn = ScoredValue((like, functools.partial(step_fn, t)), values[t], log_probs[t])
            pyro.sample(f"x_{t + 1}", masked(fn, mask[:, t]), obs=values[t])

    def model_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        raise NotImplementedError

    def model_step(
        self, state: SequenceState, t: Step, x: torch.Tensor, mask: torch.Tensor
    ) -> None:
        raise NotImplementedError

    def guide_init(self, state: SequenceState, x: torch.Tensor, mask: torch.Tensor) -> None:
        raise NotImplementedError

    def guide_step(self, state: SequenceState, t: int, x: torch.Tensor, mask: torch.Tensor) -> None:
        raise NotImplementedError
