"""The command line's run folders and data: build a model by name, read a run's
``config.json`` and best weights, load and check a data set, and batch its sequences (used by
the commands of :mod:`pyro_seq.cli` and :mod:`pyro_seq.cli_tasks`)."""

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

if TYPE_CHECKING:  # the models are imported when a command needs them
    from pyro_seq.models.contract import ModelContract

#: Samples with this many binary features per step (the keys of a piano roll) are also written
#: as MIDI files.
PIANO_KEYS = 88


def model_names() -> Tuple[str, ...]:
    """The names ``--model`` accepts: :data:`pyro_seq.models.MODELS`."""
    from pyro_seq.models import MODELS

    return tuple(MODELS)


def build_model(
    name: str, obs_dim: int, options: Dict[str, Any], input_dim: int = 0
) -> "ModelContract":
    """Construct a model by name for data of ``obs_dim`` features (and ``input_dim`` known
    inputs) per step, with keyword ``options``: the model's own
    :meth:`~pyro_seq.models.ModelContract.for_data`."""
    from pyro_seq.models import MODELS, Unsupported

    if name not in MODELS:
        raise SystemExit(
            f"pyro-seq: error: unknown model {name!r}; choose from {', '.join(MODELS)}"
        )
    try:
        return MODELS[name].for_data(obs_dim, input_dim, **options)
    except Unsupported as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None
    except (TypeError, ValueError) as e:
        raise SystemExit(f"pyro-seq: error: bad model option for {name}: {e}") from None


def parse_options(pairs: Optional[Sequence[str]]) -> Dict[str, Any]:
    options = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"pyro-seq: error: --model-option expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def load_data(
    spec: str, splits: Sequence[str] = ("train", "valid", "test")
) -> Dict[str, List[torch.Tensor]]:
    """The ``splits`` of ``--data spec`` (:func:`pyro_seq.data.load_dataset`: a name, a
    piano-roll pickle, or a ``.npz``, ``.pt`` or ``.csv`` file); one line and exit code 1 when
    it cannot be read or, asked for ``"train"``, holds no training sequence."""
    import pickle

    from pyro_seq.data import load_dataset

    try:
        data = load_dataset(spec, splits=splits)
    except (FileNotFoundError, ValueError, pickle.UnpicklingError) as e:  # unknown name, no
        raise SystemExit(f"pyro-seq: error: --data {spec}: {e}") from None  # file, bad N:T
    except IsADirectoryError:
        raise SystemExit(
            f"pyro-seq: error: --data {spec} is a folder; name a data set, a pickle file, "
            "or a .npz, .pt or .csv file (pyro-seq train --help lists the forms)"
        ) from None
    except KeyError as e:  # a pickle without one of the splits
        raise SystemExit(f"pyro-seq: error: --data {spec}: {e.args[0]}") from None
    if "train" in splits and not data.get("train"):
        raise SystemExit(
            f"pyro-seq: error: --data {spec} holds no train sequences; give the split "
            "'train' (arrays train_0, train_1, ... of a .npz, 'train' in a CSV's split column, "
            "the 'train' key of save_dataset)"
        )
    return data


def load_weights(path: Union[str, Path]) -> Dict[str, torch.Tensor]:
    from pyro_seq.train import load_weights

    return load_weights(path)


def device_option(spec: Union[str, torch.device]) -> torch.device:
    """``--device`` checked by the package's one device check; one line and exit code 1."""
    from pyro_seq.validation import parse_device

    try:
        return parse_device(spec, "--device")
    except ValueError as e:
        raise SystemExit(f"pyro-seq: error: {e}") from None


def to_cpu(value: Any) -> Any:
    """Tensors (or a tuple of them, e.g. Gaussian emission parameters) copied to the CPU, for
    figures, MIDI files and numbers."""
    if torch.is_tensor(value):
        return value.cpu()
    if isinstance(value, (tuple, list)):
        return type(value)(to_cpu(v) for v in value)
    return value


#: AIS chains of ``evaluate --objective ais`` when ``--particles`` is not given.
AIS_CHAINS = 100
#: The entries of a run's ``config.json`` the commands read, and their types.
RUN_KEYS = {"model": str, "obs_dim": int, "model_options": dict, "data": str}


def read_config(out_dir: Union[str, Path]) -> Dict[str, Any]:
    """The ``config.json`` of run folder ``out_dir`` (a dict with :data:`RUN_KEYS`); one line
    naming the file and the remedy when it is not valid JSON or lacks an entry."""
    cfg_path = Path(out_dir) / "config.json"
    retrain = f"retrain with pyro-seq train --out {out_dir} --restart"
    try:
        run = json.loads(cfg_path.read_text())
    except UnicodeDecodeError:
        raise SystemExit(
            f"pyro-seq: error: {cfg_path} is not text (not a config.json written by "
            f"pyro-seq train); {retrain}"
        ) from None
    except json.JSONDecodeError as e:
        raise SystemExit(
            f"pyro-seq: error: {cfg_path} is not valid JSON (line {e.lineno} "
            f"column {e.colno}: {e.msg}; truncated or edited?); {retrain}"
        ) from None
    except OSError as e:
        raise SystemExit(f"pyro-seq: error: cannot read {cfg_path}: {e.strerror or e}") from None
    if not isinstance(run, dict):
        raise SystemExit(
            f"pyro-seq: error: {cfg_path} holds a JSON {type(run).__name__}, not "
            f"the settings of a run; {retrain}"
        )
    nouns = {str: "a string", int: "a whole number", dict: "an object"}
    for key, kind in RUN_KEYS.items():
        if not isinstance(run.get(key), kind) or isinstance(run.get(key), bool):
            raise SystemExit(
                f"pyro-seq: error: {cfg_path} has no valid {key!r} entry ({nouns[kind]}); {retrain}"
            )
    return run


def load_best(
    model: "ModelContract", out_dir: Union[str, Path], name: str, load: bool = True
) -> None:
    """Read ``out_dir/best.pt`` and check that it fits ``model`` (the run's ``name``); load it
    into ``model`` unless ``load`` is False. One line naming the file and the remedy when it is
    damaged, holds a NaN or an infinity (:class:`~pyro_seq.train.CheckpointError`) or holds
    the weights of another model."""
    from pyro_seq.train.checkpoint import state_dict_mismatch

    state = load_weights(Path(out_dir) / "best.pt")
    problem = state_dict_mismatch(model.state_dict(), state)
    if problem is None and load:
        try:
            model.load_state_dict(state)
        except RuntimeError as e:  # e.g. a custom load hook: torch's message on one line
            problem = " ".join(str(e).split("\n", 1)[-1].split())
    if problem is not None:
        raise SystemExit(
            f"pyro-seq: error: best.pt in {out_dir} holds weights of another model, "
            f"not of the run's {name} ({problem}): retrain with pyro-seq train "
            f"--out {out_dir} --restart"
        )


def load_run(
    out_dir: Union[str, Path], device: Union[str, torch.device] = "cpu"
) -> Tuple[Dict[str, Any], "ModelContract"]:
    out_dir = Path(out_dir)
    cfg_path = out_dir / "config.json"
    if not cfg_path.exists():
        raise SystemExit(
            f"pyro-seq: error: {out_dir} is not a run folder (no config.json); train first"
        )
    run = read_config(out_dir)
    model = build_model(run["model"], run["obs_dim"], run["model_options"], run.get("input_dim", 0))
    weights = out_dir / "best.pt"
    if not weights.exists():
        raise SystemExit(
            f"pyro-seq: error: no trained weights in {out_dir} (best.pt missing); train first"
        )
    load_best(model, out_dir, run["model"])
    model.to(device_option(device))
    model.eval()
    return run, model


def load_run_and_data(
    args: argparse.Namespace, splits: Sequence[str], require: Optional[str] = None
) -> Tuple[Dict[str, Any], "ModelContract", Dict[str, List[torch.Tensor]]]:
    """The trained run ``args.run``, and the splits of ``args.data`` (default: the run's data),
    checked by the package's validator; the model must declare task ``require`` (if given),
    checked before the data are read."""
    run, model = load_run(args.run, args.device)
    if require is not None:
        model.require(require)
    spec = args.data or run["data"]
    data = load_data(spec, splits=splits)
    if run.get("ignore_inputs") or not model.input_dim:  # as the run was trained
        data = {split: list(seqs) for split, seqs in data.items()}
    check_data(data, model, spec)
    return run, model, data


def check_data(data: Dict[str, List[torch.Tensor]], model: "ModelContract", spec: str) -> None:
    """Every split through the package's validator; one line and exit code 1 on bad data."""
    from pyro_seq.data import inputs_of
    from pyro_seq.validation import validate_sequence_list

    for split, seqs in data.items():
        if seqs:
            try:
                validate_sequence_list(
                    seqs,
                    model.obs_dim,
                    model.binary_observations,
                    split,
                    inputs=inputs_of(seqs),
                    input_dim=model.input_dim,
                )
            except ValueError as e:
                hint = (
                    "; --ignore-inputs trains without them"
                    if inputs_of(seqs) is not None and not model.input_dim
                    else ""
                )
                raise SystemExit(f"pyro-seq: error: data {spec}: {e}{hint}") from None


def input_dim_of(seqs: Sequence[torch.Tensor]) -> int:
    """Features per step of the known inputs a split carries (0 without)."""
    from pyro_seq.data import inputs_of

    inputs = inputs_of(seqs)
    return 0 if not inputs else int(inputs[0].shape[-1])


def batch_of(
    seqs: Sequence[torch.Tensor], indices: Sequence[int], length: Optional[int] = None
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(x, mask, inputs)`` of the sequences ``indices`` of a split (cut to ``length`` steps
    when given; ``inputs`` None when the split carries none), padded on the CPU."""
    from pyro_seq.data import inputs_of, pad_sequences

    cut = slice(None) if length is None else slice(0, length)
    x, mask = pad_sequences([seqs[i][cut] for i in indices])
    inputs = inputs_of(seqs)
    u = None if inputs is None else pad_sequences([inputs[i][cut] for i in indices])[0]
    return x, mask, u


def to_device(
    device: Union[str, torch.device], tensor: Optional[torch.Tensor]
) -> Optional[torch.Tensor]:
    return None if tensor is None else tensor.to(device)
