"""The one input validator of the package: a padded batch of sequences and its mask.

Every path that takes sequences from a user goes through :func:`validate_sequences`: the
full-sequence ``model``/``guide`` of every :class:`~pyro_seq.models.SequenceModel` (and so every
Pyro ELBO, :class:`~pyro_seq.infer.IWAE` and the IWAE estimator), the step protocol's ``init``
(so :class:`~pyro_seq.infer.FIVO` and the SMC estimator), :func:`pyro_seq.infer.estimate_log_likelihood`,
:func:`pyro_seq.train.fit`, the command line and :mod:`pyro_seq.data`. A bad input therefore gets
the same message whichever path the user takes.

This module depends on :mod:`torch` only, so that every layer may import it.
"""

import math
from typing import Any, Literal, Optional, Tuple, overload

import torch

__all__ = [
    "all_finite",
    "as_bool_mask",
    "check_device",
    "module_device",
    "parse_device",
    "positive_int",
    "prepare_sequences",
    "square_frame_shape",
    "validate_generate_args",
    "validate_input_dim",
    "validate_inputs",
    "validate_mask",
    "validate_observed",
    "validate_sequence_list",
    "validate_sequences",
]


def parse_device(spec, name: str = "device") -> torch.device:
    """``spec`` (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a :class:`torch.device`) as a device that
    exists on this machine: the package's one check of a device setting (``TrainConfig.device``,
    ``--device``). No fallback: a device that is not there is an error, never CPU instead.

    :raises ValueError: naming ``spec`` when it is not one of those forms, when it asks for CUDA
        and ``torch.cuda.is_available()`` is False, or for a CUDA index that does not exist.
    """
    try:
        device = spec if isinstance(spec, torch.device) else torch.device(str(spec))
    except (RuntimeError, TypeError, ValueError):
        device = None
    if (
        device is None
        or device.type not in ("cpu", "cuda")
        or (device.type == "cpu" and device.index not in (None, 0))
    ):
        raise ValueError(f"{name} must be 'cpu', 'cuda' or 'cuda:N', got {spec!r}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            f"{name} {spec!r} asks for CUDA, but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use "
            f"{name} 'cpu' on this machine"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(
            f"{name} {spec!r} does not exist: this machine has {count} CUDA "
            f"device(s), cuda:0..cuda:{count - 1}"
        )
    if device.index is None:  # the device tensors moved "to cuda" land on, with its index
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def module_device(module) -> Optional[torch.device]:
    """The device of ``module``'s first parameter (or, without parameters, its first buffer);
    None for a module that holds no tensors."""
    for tensors in (module.parameters(), module.buffers()):
        for t in tensors:
            return t.device
    return None


def check_device(name: str, tensor, device, where: str = "the model's parameters are") -> None:
    """Refuse a tensor that is not on ``device`` with a message naming it and both devices.

    The package never moves a user's tensor to another device silently (a CPU tensor reaching a
    CUDA model would otherwise fail deep inside torch, or run on the wrong device).

    :param str name: the argument's name, for the message.
    :param tensor: a tensor, or None (nothing to check).
    :param device: the expected :class:`torch.device` (None: no check).
    :param str where: what lives on ``device``, with its verb, for the message.
    :raises ValueError: ``"<name> is on device <a>, but <where> on <b>; ..."``.
    """
    if device is None or not torch.is_tensor(tensor) or tensor.device == device:
        return
    raise ValueError(
        f"{name} is on device {tensor.device}, but {where} on {device}; move it "
        f"there first ({name}.to({str(device)!r}))"
    )


@overload
def positive_int(name: str, value: Any, optional: Literal[False] = False) -> int: ...


@overload
def positive_int(name: str, value: Any, optional: bool) -> Optional[int]: ...


def positive_int(name: str, value: Any, optional: bool = False) -> Optional[int]:
    """``value`` as an ``int`` if it is a whole number >= 1 (``3`` or ``3.0``; not ``True``).

    :param str name: the argument's name, for the message.
    :param bool optional: accept ``None`` (returned as ``None``).
    :raises ValueError: ``"<name> must be a positive integer, got <value>"`` for anything else
        (0, negatives, fractions, booleans, strings, NaN).
    """
    if value is None and optional:
        return None
    if not isinstance(value, (bool, str, bytes)):
        try:
            if float(value) == int(value) and int(value) >= 1:
                return int(value)
        except (TypeError, ValueError, OverflowError):
            pass
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite, with one reduction where it is: a NaN or an
    infinite entry makes the sum non-finite, so a finite sum proves every entry finite; only
    a non-finite sum (a bad entry, or a sum that overflows) runs the elementwise test. No
    autograd node (the sum is of ``x.detach()``)."""
    if not (x.is_floating_point() or x.is_complex()) or x.numel() == 0:
        return True
    xd = x.detach()
    if bool(torch.isfinite(xd.sum())):
        return True
    return bool(torch.isfinite(xd).all())


def _first(index_mask: torch.Tensor) -> Tuple[int, ...]:
    return tuple(int(v) for v in index_mask.nonzero()[0])


def as_bool_mask(
    mask, name: str = "mask", labels: Optional[Tuple[str, ...]] = None
) -> torch.Tensor:
    """``mask`` as a bool tensor: the package's one check of mask *values* (any shape).

    A bool tensor is returned as it is; a tensor of another dtype must hold exactly 0 and 1 (a
    ``.bool()`` cast would read 0.5 or NaN as True). ``labels`` name the dims in the message
    (``"(batch 1, step 2)"``); otherwise the position is given as ``"index (1, 2)"``.

    :raises TypeError: ``mask`` cannot be read as a tensor (None, a dict, a string...).
    :raises ValueError: a complex dtype, or a value other than 0 and 1.
    """
    try:
        mask = torch.as_tensor(mask)
    except (TypeError, ValueError, RuntimeError) as e:  # torch: "Could not infer dtype of ..."
        raise TypeError(
            f"{name} must be a bool tensor or an array-like of 0 and 1, got "
            f"{type(mask).__name__} ({e})"
        ) from None
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise ValueError(f"{name} must be bool or contain only 0 and 1, got dtype {mask.dtype}")
    bad = (mask != 0) & (mask != 1)  # NaN compares unequal to both
    if bool(bad.any()):
        i = _first(bad)
        where = (
            f"({', '.join(f'{n} {v}' for n, v in zip(labels, i))})"
            if labels is not None and len(labels) == len(i)
            else f"index {i}"
        )
        raise ValueError(
            f"{name} must be bool or contain only 0 and 1 (dtype {mask.dtype}), found "
            f"{mask[i].item()!r} at {where}; {int(bad.sum())} such entries"
        )
    return mask != 0


def validate_mask(mask, shape: Tuple[int, ...], device=None, name: str = "mask") -> torch.Tensor:
    """Check a ``(batch, T)`` padding mask and return it as a bool tensor.

    A mask is accepted when it is a bool tensor, or a tensor of any other dtype whose entries
    are exactly 0 or 1 (e.g. a float mask ``1.0/0.0``). Anything else, e.g. ``0.5``, is refused:
    a cast with ``.bool()`` would silently read it as True.

    :param mask: tensor ``(batch, T)`` or None (every step real).
    :param tuple shape: the expected ``(batch, T)``.
    :param device: the device of ``x``: a mask elsewhere is refused (and None is replaced by an
        all-True mask there).
    :param str name: the argument's name, used in messages.
    :returns: bool tensor ``(batch, T)``.
    :raises ValueError: naming the problem (a mask on another device than ``x`` included).
    """
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if not torch.is_tensor(mask):
        raise ValueError(
            f"{name} must be a bool torch.Tensor of shape {tuple(shape)}, got {type(mask).__name__}"
        )
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(
            f"{name} shape {tuple(mask.shape)} does not match x's (batch, T) = {tuple(shape)}"
        )
    check_device(name, mask, device, "x is")
    return as_bool_mask(mask, name, ("batch", "step"))


def validate_observed(observed, shape, device=None) -> Optional[torch.Tensor]:
    """Check the ``observed=`` mask of missing data *inside* sequences; return it per element.

    ``observed`` marks which observations exist (True) at real steps; it is not the padding
    ``mask``. It may be per step ``(batch, T)`` or per element ``(batch, T, D)``, bool or exactly
    0/1 of any dtype.

    :param observed: tensor or None (everything observed).
    :param tuple shape: ``(batch, T, D)`` of ``x``.
    :param device: the device of ``x``; ``observed`` elsewhere is refused, not moved.
    :returns: None, or a bool tensor ``(batch, T, D)``.
    :raises ValueError: naming the problem (shape, device, values other than 0/1).
    """
    if observed is None:
        return None
    B, T, D = shape
    if not torch.is_tensor(observed):
        raise ValueError(
            f"observed must be a bool torch.Tensor of shape {(B, T)} or {(B, T, D)}, "
            f"got {type(observed).__name__}"
        )
    if tuple(observed.shape) == (B, T):
        per_step = True
    elif tuple(observed.shape) == (B, T, D):
        per_step = False
    else:
        raise ValueError(
            f"observed shape {tuple(observed.shape)} is neither (batch, T) = {(B, T)} "
            f"nor (batch, T, D) = {(B, T, D)}"
        )
    check_device("observed", observed, device, "x is")
    observed = as_bool_mask(observed, "observed", ("batch", "step", "feature")[: observed.dim()])
    if per_step:
        observed = observed.unsqueeze(-1).expand(B, T, D)
    return observed


def validate_inputs(
    inputs, shape: Tuple[int, int], input_dim: int, mask: torch.Tensor, dtype=None, device=None
) -> Optional[torch.Tensor]:
    """Check known inputs (controls ``u_t``, actions): ``(batch, T, input_dim)``, floating point
    and finite at the real steps of ``mask`` (padded steps may hold anything and are zeroed).

    :param shape: ``(batch, T)`` of the observations.
    :param int input_dim: what the model expects; 0 means the model takes no inputs.
    :returns: the inputs in ``dtype`` with zeros at padded steps, or None when ``inputs`` is
        None and ``input_dim == 0``.
    :raises ValueError: inputs missing for a model that needs them, given to one that takes
        none, of the wrong shape or non-finite at a real step.
    """
    if inputs is None:
        if input_dim:
            raise ValueError(
                f"this model needs inputs= (controls), a tensor of shape (batch, T, {input_dim})"
            )
        return None
    if not input_dim:
        raise ValueError(
            "this model takes no inputs= (its input_dim is 0); build it with known "
            "inputs to condition on them (input_dim= of DMM, SRNN and VRNN, "
            "control_dim= of the KVAE, num_actions of the GTM-SM)"
        )
    if not torch.is_tensor(inputs) or not inputs.is_floating_point():
        raise ValueError(
            f"inputs must be a floating-point tensor, got "
            f"{getattr(inputs, 'dtype', type(inputs).__name__)}"
        )
    expected = tuple(shape) + (input_dim,)
    if tuple(inputs.shape) != expected:
        raise ValueError(
            f"inputs must have shape (batch, T, input_dim) = {expected}, got {tuple(inputs.shape)}"
        )
    check_device("inputs", inputs, device)
    inputs = torch.where(mask.unsqueeze(-1), inputs, inputs.new_zeros(()))
    if not bool(torch.isfinite(inputs).all()):
        b, t, d = _first(~torch.isfinite(inputs))
        raise ValueError(
            f"inputs has a non-finite value at a real step: sequence {b}, step {t}, element {d}"
        )
    return inputs if dtype is None else inputs.to(dtype)


def validate_sequences(
    x,
    mask=None,
    obs_dim: Optional[int] = None,
    binary: bool = False,
    prefix_mask: bool = True,
    observed=None,
    device=None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Check a padded batch against the sequence-model contract; return ``(x, mask)``.

    :param torch.Tensor x: ``(batch, T, D)`` floating tensor, finite everywhere (padded steps
        included: ``0 * nan`` is ``nan``, so a NaN placeholder would poison sums and gradients).
    :param mask: ``(batch, T)`` padding mask (True at real steps), bool or exactly 0/1, or None
        (every step real). By default every row must be a prefix ``True...True False...False``
        with at least one True.
    :param int obs_dim: the expected feature size ``D`` (the model's), if known.
    :param bool binary: require 0/1 values at real steps (Bernoulli likelihoods).
    :param bool prefix_mask: require prefix rows (the padding contract). ``False`` only for
        masks that mark something other than padding.
    :param observed: optional missing-data mask (:func:`validate_observed`): entries it marks
        unobserved may hold anything (NaN included) and are exempt from the finite and binary
        checks.
    :param device: the device of the model's parameters (:func:`module_device`), if known:
        ``x`` must be there, and ``mask`` and ``observed`` where ``x`` is (:func:`check_device`;
        nothing is moved for you).
    :returns: ``(x, mask)`` with ``mask`` a bool tensor ``(batch, T)`` (all True when None);
        ``x`` is returned unchanged.
    :raises TypeError: ``x`` is not a tensor.
    :raises ValueError: naming the problem: dimensionality, dtype, an empty dimension
        (``batch = 0``, ``T = 0`` or ``D = 0``), the wrong feature size, NaN or infinite values
        (with the first position and whether it is a real or a padded step), mask shape, mask
        values other than 0/1, an empty row, a non-prefix row, non-binary values at real steps,
        a tensor on the wrong device (checked before any value, naming the argument and both
        devices).
    """
    return _validate_sequences(x, mask, obs_dim, binary, prefix_mask, observed, device)[:2]


def prepare_sequences(
    x, mask=None, obs_dim: Optional[int] = None, binary: bool = False, observed=None, device=None
):
    """:func:`validate_sequences`, then zero-fill the entries ``observed`` marks missing.

    What every program and task does with a batch that may have missing values: the networks
    see zeros there, and the per-element mask says what the observation sites are scored on.

    :returns: ``(x, mask, seen)``: ``x`` with zeros at unobserved entries, the bool padding mask
        ``(batch, T)``, and the bool ``(batch, T, D)`` observed mask (None without ``observed``).
    """
    x, mask, seen = _validate_sequences(x, mask, obs_dim, binary, True, observed, device)
    if seen is not None:
        x = torch.where(seen, x, x.new_zeros(()))
    return x, mask, seen


def _validate_sequences(x, mask, obs_dim, binary, prefix_mask, observed, device=None):
    """:func:`validate_sequences`; also returns the ``(batch, T, D)`` observed mask."""
    if not torch.is_tensor(x):
        raise TypeError(f"x must be a torch.Tensor of shape (batch, T, D), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(
            f"x must have 3 dimensions (batch, T, D), got {x.dim()} with shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    B, T, D = x.shape
    if B == 0 or T == 0 or D == 0:
        what = "batch = 0" if B == 0 else ("T = 0: no time steps" if T == 0 else "D = 0")
        raise ValueError(f"x has an empty dimension ({what}): shape {tuple(x.shape)} (batch, T, D)")
    if obs_dim is not None and D != obs_dim:
        raise ValueError(f"x has {D} features per step, the model expects {obs_dim}")
    check_device("x", x, device)  # before any value is read (a host synchronisation)
    mask = validate_mask(mask, (B, T), device=x.device)
    seen = validate_observed(observed, (B, T, D), device=x.device)
    finite = None if all_finite(x) else torch.isfinite(x)
    if finite is not None and seen is not None:
        finite = finite | ~seen
    if finite is not None and not bool(finite.all()):
        b, t, d = _first(~finite)
        kind = "NaN" if bool(torch.isnan(x[b, t, d])) else "infinite value"
        where = "real" if bool(mask[b, t]) else "padded"
        raise ValueError(
            f"x contains {int((~finite).sum())} NaN/inf values; first: {kind} at "
            f"(batch {b}, step {t}, feature {d}), a {where} step (use zeros at padded steps; mark "
            "missing observations with observed=)"
        )
    lengths = mask.sum(1)
    if bool((lengths == 0).any()):
        b = int((lengths == 0).nonzero()[0])
        raise ValueError(f"empty sequence: mask row {b} has no True step")
    if prefix_mask:
        prefix = torch.arange(T, device=mask.device).unsqueeze(0) < lengths.unsqueeze(1)
        if not bool((prefix == mask).all()):
            b = int((prefix != mask).any(1).nonzero()[0])
            raise ValueError(
                f"mask row {b} is not a prefix (True steps must come first, then padding)"
            )
    if binary:
        bad = ((x != 0) & (x != 1)) & mask.unsqueeze(-1)
        if seen is not None:
            bad = bad & seen
        if bool(bad.any()):
            b, t, d = _first(bad)
            raise ValueError(
                f"x must be binary (0/1) for a Bernoulli model, found {x[b, t, d].item()!r} at "
                f"(batch {b}, step {t}, feature {d}); {int(bad.sum())} non-binary values in all; "
                'for real-valued data build the model with likelihood="gaussian" (pyro-seq '
                "train --model-option likelihood=gaussian)"
            )
    return x, mask, seen


def validate_sequence_list(
    seqs,
    obs_dim: Optional[int] = None,
    binary: bool = False,
    name: str = "sequences",
    inputs=None,
    input_dim: Optional[int] = None,
):
    """Check a list of ``(T_i, D)`` sequences (a data split) before any training starts.

    Each sequence is checked as a batch of one by :func:`validate_sequences`, so the message is
    the validator's, prefixed with the sequence's place: ``"train[17]: x contains ..."``.

    :param seqs: list of tensors ``(T_i, D)``.
    :param int obs_dim: expected ``D``.
    :param bool binary: require 0/1 values (Bernoulli likelihoods).
    :param str name: the split's name, used in messages.
    :param inputs: the split's known inputs, tensors ``(T_i, U)`` (or None).
    :param int input_dim: the ``U`` the model takes (0: none; None: not checked).
    :raises ValueError: for an empty list, a non-tensor or non-2-D item, or any problem
        :func:`validate_sequences` names; inputs missing for a model that takes them, given to
        one that takes none, of another feature size, length or with non-finite values.
    """
    if torch.is_tensor(seqs) or len(seqs) == 0:
        raise ValueError(f"{name}: expected a non-empty list of (T_i, D) tensors")
    for i, s in enumerate(seqs):
        if not torch.is_tensor(s) or s.dim() != 2:
            raise ValueError(
                f"{name}[{i}]: expected a (T, D) tensor, got "
                f"{tuple(s.shape) if torch.is_tensor(s) else type(s).__name__}"
            )
        try:
            validate_sequences(s.unsqueeze(0), None, obs_dim, binary)
        except ValueError as e:
            raise ValueError(f"{name}[{i}]: {e}") from None
    if input_dim is None:
        return
    if inputs is None and input_dim:
        raise ValueError(
            f"{name}: the model takes {input_dim} known inputs per step "
            "(controls, actions), but the data carry none; pass a SequenceList "
            "with inputs"
        )
    if inputs is not None and not input_dim:
        raise ValueError(
            f"{name}: the data carry known inputs ({inputs[0].shape[-1]} per step), "
            "but the model takes none (input_dim 0); build it with inputs, or "
            "leave the inputs out of the data"
        )
    if inputs is None:
        return
    if len(inputs) != len(seqs):
        raise ValueError(f"{name}: {len(inputs)} input sequences for {len(seqs)} sequences")
    for i, (s, u) in enumerate(zip(seqs, inputs)):
        expected = (s.shape[0], input_dim)
        if not torch.is_tensor(u) or tuple(u.shape) != expected or not u.is_floating_point():
            raise ValueError(
                f"{name} inputs[{i}]: expected a floating tensor of shape (T, U) = "
                f"{expected}, got {getattr(u, 'dtype', type(u).__name__)} "
                f"{tuple(getattr(u, 'shape', ()))}"
            )
        if not bool(torch.isfinite(u).all()):
            b, t = _first(~torch.isfinite(u))
            raise ValueError(
                f"{name} inputs[{i}] has a NaN or infinite value at step {b}, feature {t}"
            )


def validate_generate_args(num_sequences, num_steps) -> Tuple[int, int]:
    """``(num_sequences, num_steps)`` of a model's ``generate`` as ints: the package's one check
    of them, called first by every ``generate``.

    Each must be a whole number >= 1 (``3`` or ``3.0``, as :func:`positive_int`); booleans
    (Python, NumPy or torch) are refused, since ``True`` is not a count.

    :raises ValueError: naming the argument and its value otherwise (0, negatives, fractions,
        booleans, strings, NaN, None).
    """
    out = []
    for name, value, what in (
        ("num_sequences", num_sequences, "sequences to draw"),
        ("num_steps", num_steps, "steps per sequence"),
    ):
        is_bool = isinstance(value, bool) or str(getattr(value, "dtype", "")) in (
            "bool",
            "torch.bool",
        )
        try:
            if is_bool:
                raise ValueError
            out.append(positive_int(name, value))
        except ValueError:
            raise ValueError(
                f"generate: {name} (the number of {what}) must be a positive "
                f"integer, got {value!r}; pass an int >= 1"
            ) from None
    return out[0], out[1]


def square_frame_shape(num_values: int, name: str = "frame_shape") -> Tuple[int, ...]:
    """The frame shape of ``num_values`` values per step when none is given: a square greyscale
    frame ``(H, H)``, or a square RGB one ``(3, H, H)``; a ValueError asking for ``name``
    otherwise."""
    side, side3 = math.isqrt(num_values), math.isqrt(num_values // 3)
    if side * side == num_values:
        return (side, side)
    if num_values % 3 == 0 and 3 * side3 * side3 == num_values:
        return (3, side3, side3)
    raise ValueError(
        f"{num_values} values per step are not a square frame; pass "
        f"{name}=[H,W] (--model-option {name}=[H,W])"
    )


def validate_input_dim(value) -> int:
    """A model's ``input_dim`` (known input features per step) as an int >= 0; 0 = no inputs.

    :raises ValueError: naming the value otherwise (negatives, fractions, booleans, strings).
    """
    if not isinstance(value, (bool, str, bytes)):
        try:
            if float(value) == 0:
                return 0
            return positive_int("input_dim", value)
        except (TypeError, ValueError, OverflowError):
            pass
    raise ValueError(
        f"input_dim (known input features per step) must be a non-negative "
        f"integer, got {value!r}; pass 0 for a model without inputs"
    )
