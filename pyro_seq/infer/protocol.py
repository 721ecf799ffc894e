"""The step protocol as the objectives and estimators see a Pyro program: the one place that
asks a program what it offers.

A *step program* (e.g. ``SequenceModel.model`` or ``.guide``, a
:class:`pyro_seq.models.StepProgram`) is a callable with ``init(state, x, mask, ...)`` and
``step(state, t, x, mask, ...)`` (the protocol of :class:`pyro.infer.SMCFilter`); it may also
tell the ``device`` its batches must be on and the ``owner`` module whose parameters it uses.
Any other Pyro callable is a plain program: the objectives that need steps refuse it
(:func:`require_step_program`), the others run it whole.
"""

from typing import Any, Optional

import torch

__all__ = ["is_step_program", "program_device", "program_owner", "require_step_program"]


def is_step_program(fn: Any) -> bool:
    """Whether ``fn`` offers the step protocol (callable ``init`` and ``step``)."""
    return callable(getattr(fn, "init", None)) and callable(getattr(fn, "step", None))


def require_step_program(fn: Any, role: str, who: str = "FIVO") -> None:
    """Raise a TypeError naming ``who`` and the ``role`` (``"model"``/``"guide"``) unless ``fn``
    offers the step protocol."""
    if not is_step_program(fn):
        raise TypeError(
            f"{who} needs a {role} that follows the step protocol: a callable with "
            f"`.init(state, x, mask, num_sequences=None)` and `.step(state, t, x, mask, "
            f"num_sequences=None)` (e.g. `SequenceModel.{role}`, see pyro_seq.models.base), "
            f"so that it can run the {role} one time step at a time and resample between "
            f"steps; got {fn!r} of type {type(fn).__name__}"
        )


def program_device(fn: Any) -> Optional[torch.device]:
    """The device a step program's batches must be on (its ``device``), None if it does not
    say."""
    return getattr(fn, "device", None)


def program_owner(fn: Any) -> Optional[torch.nn.Module]:
    """The :class:`torch.nn.Module` whose parameters a program uses (its ``owner``), or None."""
    owner = getattr(fn, "owner", None)
    return owner if isinstance(owner, torch.nn.Module) else None
