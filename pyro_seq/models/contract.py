"""What a sequence model is, and what it declares: the one place every surface reads.

Every model of the package subclasses :class:`ModelContract`, through
:class:`~pyro_seq.models.SequenceModel` (latent-variable models: a Pyro ``model``/``guide``
pair built from ``init``/``step``) or :class:`EnergyBasedModel` (RTRBM, SRTRBM, the
collaborative RBM: an unnormalised likelihood, an empty guide, trained by contrastive
divergence). The trainer (:func:`pyro_seq.train.fit`), the command line, the tasks
(:mod:`pyro_seq.tasks`) and the estimators read these declarations and nothing else: no
class-name checks, no probing of undeclared attributes. A new model meets every surface by
declaring what it can do here; what it does not declare is refused with one line
(:class:`Unsupported`) that names the model, what it lacks and what to use instead.

Declarations (class attributes unless said otherwise):

==========================  =====================================================================
``module_name``             the name of the model in Pyro's param store and in messages
``obs_dim``                 features per step ``D`` of ``x`` ``(batch, T, D)`` (set by ``__init__``)
``input_dim``               features per step of the known inputs ``inputs=`` ``(batch, T, U)``
                            (controls, actions); 0 = the model takes none
``binary_observations``     ``x`` must be 0/1 (Bernoulli or RBM visibles)
``energy_based``            an unnormalised likelihood, trained by contrastive divergence
``trains_on_sequences``     ``fit`` and the command line can train it on ``(T, D)`` sequences
``objectives``              names of :mod:`pyro_seq.train.objectives` it trains with
``evaluation_methods``      methods of :func:`pyro_seq.train.evaluate_bound` it supports (the
                            first is the command line's default)
``tasks``                   tasks of :mod:`pyro_seq.tasks` (and CLI commands) it supports:
                            ``"generate"`` (``pyro-seq sample``), ``"impute"``, ``"denoise"``,
                            ``"forecast"``
``impute_methods``          methods of :func:`pyro_seq.tasks.impute` it supports
``unsupported``             per task (or objective, or method; ``"<kind>:<name>"`` where the
                            same name is of two kinds) a one-line reason and what to use
                            instead, for the refusal message
``frame_shape``             ``(H, W)`` or ``(C, H, W)`` when each step is an image, else None
``weight_init_schemes``     schemes of ``TrainConfig.init`` that redraw its weights
``lr_multipliers``          per-parameter factors on the learning rate (name or prefix -> factor)
``small_example``           the data and options of a small instance (:func:`example`), which
                            the surface tests build: every model meets every surface
==========================  =====================================================================

Methods every model has (defaults here): :meth:`ModelContract.generate`,
:meth:`ModelContract.training_epoch` (called by ``fit`` before each epoch),
:meth:`ModelContract.initialise` (called by ``fit`` on a fresh start), and the checks
:meth:`ModelContract.supports` / :meth:`ModelContract.require`.

A model keeps no state from one call that changes the next: how a call scores (all steps at
once or step by step) is decided from that call's own arguments
(:meth:`pyro_seq.models.SequenceModel.scores_all_steps`).
"""

from types import MappingProxyType
from typing import Any, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar

import torch
from torch import nn

from pyro_seq.validation import validate_inputs

__all__ = ["EnergyBasedModel", "ModelContract", "TASKS", "Unsupported", "example", "support_table"]

_Model = TypeVar("_Model", bound="ModelContract")

#: Task names of :mod:`pyro_seq.tasks` (and the command that runs each).
TASKS = ("generate", "impute", "denoise", "forecast")
#: The command line's name for each task.
TASK_COMMANDS = {
    "generate": "sample",
    "impute": "impute",
    "denoise": "denoise",
    "forecast": "forecast",
}


def example(
    obs_dim: int = 4, input_dim: int = 0, length: int = 5, **options: Any
) -> Mapping[str, Any]:
    """A model's ``small_example``: the data (``obs_dim`` features and ``input_dim`` known
    inputs per step, sequences of ``length`` steps) and the :meth:`ModelContract.for_data`
    ``options`` of a small instance, which the surface tests and smoke runs build."""
    return MappingProxyType(
        {
            "obs_dim": obs_dim,
            "input_dim": input_dim,
            "length": length,
            "options": MappingProxyType(options),
        }
    )


class Unsupported(ValueError):
    """A model lacks what a surface asked of it. ``str(e)`` is one line: the model, what it
    lacks and what to use instead (the command line prints it after ``pyro-seq: error:``)."""


class ModelContract(nn.Module):
    """The declarations every model makes (see the module docstring); the defaults describe a
    model that supports nothing beyond what it declares."""

    module_name: str = "model"
    obs_dim: Optional[int] = None
    input_dim: int = 0
    binary_observations: bool = False
    energy_based: bool = False
    trains_on_sequences: bool = True
    objectives: Tuple[str, ...] = ()
    evaluation_methods: Tuple[str, ...] = ()
    tasks: FrozenSet[str] = frozenset()
    impute_methods: Tuple[str, ...] = ()
    unsupported: Mapping[str, str] = MappingProxyType({})
    frame_shape: Optional[Tuple[int, ...]] = None
    weight_init_schemes: Tuple[str, ...] = ()
    lr_multipliers: Mapping[str, float] = MappingProxyType({})
    small_example: Mapping[str, Any] = example()

    # ------------------------------------------------------------------ checks

    def supports(self, what: str, kind: str = "task") -> bool:
        """Whether the model declares ``what`` of ``kind``: ``"task"`` (:data:`TASKS`),
        ``"objective"``, ``"method"`` (of evaluation) or ``"impute_method"``."""
        if kind == "impute_method":
            return "impute" in self.tasks and what in self.impute_methods
        declared = {
            "task": self.tasks,
            "objective": self.objectives,
            "method": self.evaluation_methods,
        }
        if kind not in declared:
            raise ValueError(
                f"kind must be 'task', 'objective', 'method' or 'impute_method', got {kind!r}"
            )
        return what in declared[kind]

    def require(self, what: str, kind: str = "task") -> None:
        """Raise :class:`Unsupported` (one line, see :meth:`refusal`) unless
        :meth:`supports` holds."""
        if not self.supports(what, kind):
            raise Unsupported(self.refusal(what, kind))

    def refusal(self, what: str, kind: str = "task") -> str:
        """The one-line message refusing ``what`` of ``kind``: the model, what it lacks, and
        the model's own reason and alternative (``unsupported[what]``) or what it supports."""
        label = TASK_COMMANDS.get(what, what) if kind == "task" else what
        noun = {"impute_method": "imputation method", "method": "evaluation method"}.get(kind, kind)
        head = f"{self.module_name} does not support {noun} {label}"
        reason = self.unsupported.get(f"{kind}:{what}", self.unsupported.get(what))
        if reason:
            return f"{head}: {reason}"
        options = {
            "objective": self.objectives,
            "method": self.evaluation_methods,
            "impute_method": self.impute_methods if "impute" in self.tasks else (),
            "task": tuple(TASK_COMMANDS[t] for t in TASKS if t in self.tasks),
        }.get(kind, ())
        if options:
            return f"{head}; use one of: {', '.join(options)}"
        return f"{head}; it supports no {noun}"

    # ------------------------------------------------------------------ construction

    @classmethod
    def for_data(cls: Type[_Model], obs_dim: int, input_dim: int = 0, **options: Any) -> _Model:
        """The model for data of ``obs_dim`` features per step and ``input_dim`` known inputs
        per step (what ``pyro-seq train`` builds): ``cls(obs_dim, **options)`` by default.
        Models whose constructor takes other sizes (frame shapes, action counts) override it;
        a model that takes no inputs refuses ``input_dim > 0`` (:class:`Unsupported`)."""
        if input_dim:
            raise Unsupported(
                f"{cls.module_name} takes no inputs (controls, actions), but the "
                f"data have {input_dim} input features per step; use a model "
                "that declares input_dim, or data without inputs"
            )
        return cls(obs_dim, **options)

    # ------------------------------------------------------------------ hooks

    def generate(self, num_sequences: int, num_steps: int) -> Tuple[torch.Tensor, Any]:
        """Draw ``num_sequences`` sequences of ``num_steps`` steps from the model.

        :returns: ``(x, params)``: samples ``(num_sequences, num_steps, obs_dim)`` and the
            emission parameters of each step (Bernoulli logits, Gaussian means, ...). Models
            that declare ``"generate"`` override it; a model with ``input_dim`` also takes
            ``inputs=`` ``(num_sequences, num_steps, input_dim)``."""
        self.require("generate")
        raise NotImplementedError(f"{self.module_name} declares 'generate' but does not define it")

    def impute_steps(
        self,
        x: torch.Tensor,
        observed_steps: torch.Tensor,
        method: str,
        inputs: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The model's own imputation ``method`` (one of ``impute_methods`` other than
        ``"iterative"`` and ``"importance"``, which :func:`pyro_seq.tasks.impute` runs for every
        model) over whole missing steps: ``x`` ``(batch, T, D)``, ``observed_steps`` bool
        ``(batch, T)``; returns the estimate of :math:`\\mathbb{E}[x | x_{obs}]` ``(batch, T, D)``."""
        self.require(method, "impute_method")
        raise NotImplementedError(
            f"{self.module_name} declares imputation method {method!r} "
            "but does not define impute_steps"
        )

    def generate_inputs(
        self,
        inputs: Optional[torch.Tensor],
        num_sequences: int,
        num_steps: int,
        like: torch.Tensor,
    ) -> Optional[torch.Tensor]:
        """``inputs=`` of this model's ``generate``: ``(num_sequences, num_steps, input_dim)``,
        required when ``self.input_dim > 0`` and refused otherwise (the package's
        :func:`~pyro_seq.validation.validate_inputs`, its message prefixed by ``generate:``).

        :returns: the inputs in the dtype and on the device of ``like``, or None.
        """
        shape = (num_sequences, num_steps, self.input_dim)
        if inputs is None and self.input_dim:
            raise ValueError(
                f"generate: {self.module_name} was built with input_dim="
                f"{self.input_dim} and needs inputs= (the known inputs u_t) of shape "
                f"(num_sequences, num_steps, input_dim) = {shape}"
            )
        if inputs is not None and not self.input_dim:
            raise ValueError(
                f"generate: {self.module_name} takes no inputs (input_dim=0), got "
                f"inputs=; build it with input_dim= to condition on known inputs"
            )
        every = torch.ones(num_sequences, num_steps, dtype=torch.bool, device=like.device)
        try:
            return validate_inputs(
                inputs, (num_sequences, num_steps), self.input_dim, every, like.dtype, like.device
            )
        except ValueError as e:
            raise ValueError(f"generate: {e}") from None

    def training_epoch(self, epoch: int) -> None:
        """Called by :func:`pyro_seq.train.fit` before each (0-based) epoch, e.g. for a warm-up;
        the default does nothing."""

    def initialise(
        self, train_sequences: Sequence[torch.Tensor], scheme: str = "bias"
    ) -> List[str]:
        """Apply ``TrainConfig.init`` on a fresh start (uses torch's global RNG); returns the
        names of what was initialised. The default does nothing."""
        return []


class EnergyBasedModel(ModelContract):
    """Base of energy-based models (RTRBM, SRTRBM, the collaborative RBM): ``model(x, mask)``
    observes ``x`` through an energy-based distribution with an unnormalised ``log_prob``, the
    guide is empty, and :class:`~pyro_seq.infer.ContrastiveDivergence` trains it.

    Sequence models of this kind define ``log_likelihood(x, mask, method, num_chains,
    num_betas)`` (methods ``"exact"``, ``"ais"``, ``"reverse_ais"``, ``"raise"``) and ``pseudo_log_likelihood(x, mask)``, and
    ``init_visible_bias(train_sequences)`` (the RBM analogue of an output bias).
    """

    energy_based = True
    binary_observations = True
    objectives: Tuple[str, ...] = ("cd",)
    #: the first is the default
    evaluation_methods: Tuple[str, ...] = (
        "ais",
        "reverse_ais",
        "raise",
        "exact",
        "pseudo_likelihood",
    )
    unsupported: Mapping[str, str] = MappingProxyType(
        {
            "elbo": "it is energy-based (no latent sites, an unnormalised likelihood); use objective cd",
            "meanfield": "it is energy-based (no latent sites); use objective cd",
            "iwae": "it is energy-based (no latent sites); use objective cd",
            "fivo": "it is energy-based (no latent sites); use objective cd",
            **{
                f"method:{m}": "it is energy-based (an unnormalised likelihood, no guide); evaluate "
                "it with ais, reverse_ais, raise, exact or pseudo_likelihood"
                for m in ("elbo", "iwae", "smc")
            },
        }
    )

    def initialise(
        self, train_sequences: Sequence[torch.Tensor], scheme: str = "bias"
    ) -> List[str]:
        """Every scheme but ``"none"`` sets the visible bias from the training frequencies."""
        if scheme == "none":
            return []
        self.init_visible_bias(train_sequences)
        return ["output_bias"]

    def init_visible_bias(self, train_sequences: Sequence[torch.Tensor]) -> torch.Tensor:
        """Set the visible bias from the frequencies in ``train_sequences``; returns it."""
        raise NotImplementedError


def support_table(models: Mapping[str, Type[ModelContract]]) -> str:
    """What each model declares, as the reStructuredText list-table of the docs' "what each
    model supports" (``docs/_generated/model_support.rst``, checked against this by the tests).

    :param dict models: name -> model class (:data:`pyro_seq.models.MODELS`).
    """

    def cell(values):
        return ", ".join(values) if values else "--"

    rows = [
        ("model", "class", "kind", "objectives", "evaluation", "commands", "imputation methods")
    ]
    for name, cls in models.items():
        kind = "energy-based" if cls.energy_based else "latent-variable"
        if not cls.trains_on_sequences:
            kind += " (not on sequences)"
        commands = ["train", "evaluate"] if cls.trains_on_sequences else []
        commands += [TASK_COMMANDS[t] for t in TASKS if t in cls.tasks]
        rows.append(
            (
                f"``{name}``",
                f":class:`~{cls.__module__}.{cls.__name__}`",
                kind,
                cell(cls.objectives),
                cell(cls.evaluation_methods),
                cell(commands),
                cell(cls.impute_methods if "impute" in cls.tasks else ()),
            )
        )
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in rows:
        lines.append(f"   * - {row[0]}")
        lines += [f"     - {value}" for value in row[1:]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m pyro_seq.models.contract: rewrite the docs' table
    from pathlib import Path

    from pyro_seq.models import MODELS

    page = Path(__file__).parents[2] / "docs" / "_generated" / "model_support.rst"
    page.write_text(support_table(MODELS))
    print(f"wrote {page}")
