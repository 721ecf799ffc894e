"""What a preset is: :class:`Preset`, with its :class:`Evaluation` and the :class:`ResultKey`
parts where the package's measured number lives.

A preset holds one published configuration: the model (a name of
:data:`pyro_seq.models.MODELS`) and its constructor options, the training configuration as
overrides of :class:`~pyro_seq.train.TrainConfig`'s fields (every other field keeps the
*dataclass's* default, not the command line's), the evaluation, the data, the published number
with its source, and where the benchmark result file holds the number this package measured
with these settings. Everything is checked when the preset is defined: an unknown model, an
unknown training field, a configuration that :meth:`~pyro_seq.train.TrainConfig.validate`
refuses, or options that do not survive a round trip through JSON (what ``config.json`` stores)
raise ``ValueError``.
"""

import json
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from pyro_seq.models.contract import ModelContract
    from pyro_seq.train.config import TrainConfig

__all__ = [
    "EVALUATION_METHODS",
    "Evaluation",
    "Preset",
    "RESULTS_DIR",
    "ResultKey",
    "data_search_dirs",
]

#: The result files of the benchmarks (``benchmarks/results/`` of a source checkout; absent
#: from an installed wheel, where every preset's ``measured`` is None).
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

#: The ways a preset's number is measured, each a bound or log-likelihood estimator of ``pyro-seq
#: evaluate --objective`` (``elbo``, ``iwae``, ``smc``, ``ais``), or a task's error
#: (``impute``: frames imputed by :func:`pyro_seq.tasks.impute` or the KVAE's own imputation;
#: ``predict``: the GTM-SM's long-term prediction, :meth:`~pyro_seq.models.GTMSM.predict`).
EVALUATION_METHODS = ("elbo", "iwae", "smc", "ais", "impute", "predict")

KeyPath = Tuple[Union[str, int], ...]


@dataclass(frozen=True)
class Evaluation:
    """How a preset's published number is estimated: ``objective`` (one of
    :data:`EVALUATION_METHODS`), its ``particles`` (samples K, or AIS chains), the AIS
    temperatures ``betas`` (``ais`` only) and the number of evaluation ``seeds`` averaged."""

    objective: str
    particles: int = 1
    betas: Optional[int] = None
    seeds: int = 1

    def __post_init__(self) -> None:
        if self.objective not in EVALUATION_METHODS:
            raise ValueError(
                f"evaluation objective {self.objective!r} is not one of {EVALUATION_METHODS}"
            )
        for name in ("particles", "seeds"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"evaluation {name} must be a positive int, got {value!r}")
        if (self.betas is not None) != (self.objective == "ais"):
            raise ValueError("evaluation betas (AIS temperatures) belong to objective 'ais' only")


@dataclass(frozen=True)
class ResultKey:
    """Where a measured number lives: ``file`` under :data:`RESULTS_DIR`, the ``key`` path of
    dict keys and list indices to the number, the ``seconds`` path to the training seconds
    (a number, or a list of per-epoch seconds that is summed; None: not recorded), and the
    ``weight`` path (e.g. the test steps) by which the numbers of several parts are pooled
    (None: the part counts 1, e.g. one of several training seeds)."""

    file: str
    key: KeyPath
    seconds: Optional[KeyPath] = None
    weight: Optional[KeyPath] = None

    def read(self, results_dir: Union[str, "os.PathLike[str]", None] = None) -> Optional[dict]:
        """The JSON object of ``file`` (None when the file is absent or not JSON)."""
        path = Path(RESULTS_DIR if results_dir is None else results_dir) / self.file
        try:
            payload = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return payload if isinstance(payload, dict) else None


def _lookup(payload: Any, path: Optional[KeyPath], total: bool = False) -> Optional[float]:
    """The number at ``path`` in ``payload``, or with ``total`` the sum of a list of numbers
    there (None when a key is absent or it is no number)."""
    if path is None:
        return None
    value = payload
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return None
    if total and isinstance(value, list):
        parts = [_lookup(v, ()) for v in value]
        return None if None in parts else sum(p for p in parts if p is not None)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def data_search_dirs() -> List[Path]:
    """The folders a data file named by a preset is looked up in, in order: those of
    ``$PYRO_SEQ_DATA`` (``os.pathsep``-separated), then the cache folder
    (:func:`pyro_seq.data.cache_dir`), as :func:`pyro_seq.data.load_dataset` looks up a
    piano-roll pickle by name. Nothing is downloaded."""
    from pyro_seq.data import cache_dir

    env = os.environ.get("PYRO_SEQ_DATA")
    dirs = [Path(d).expanduser() for d in env.split(os.pathsep) if d] if env else []
    return dirs + [cache_dir()]


def _json_stable(value: Any) -> bool:
    try:
        return bool(json.loads(json.dumps(value)) == value)
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Preset:
    """One published configuration, reproducible with ``pyro-seq train --preset NAME``.

    :param name: the preset's name (``--preset NAME``).
    :param model: a name of :data:`pyro_seq.models.MODELS`.
    :param model_options: keyword options of the model's
        :meth:`~pyro_seq.models.ModelContract.for_data` (what ``--model-option`` passes), in
        their JSON form (lists, not tuples).
    :param train: overrides of :class:`~pyro_seq.train.TrainConfig` fields; the other fields
        keep the dataclass's defaults (:meth:`train_config`).
    :param evaluation: how the published number is estimated (:class:`Evaluation`).
    :param data: a data set name :func:`pyro_seq.data.load_dataset` knows (``"pendulum"``,
        ``"box:1000"``), or the file name of a piano-roll pickle it cannot ship
        (``"jsb_chorales.pickle"``), looked up in :func:`data_search_dirs` or given by path.
    :param metric: what the numbers measure, with its unit and direction.
    :param published: the published number, or the published claim where the paper gives an
        ordering or a figure instead of a number.
    :param source: where ``published`` comes from (authors, year, table or figure).
    :param script: the benchmark script (and its options) that measured ``result``.
    :param result: the :class:`ResultKey` part(s) of the measured number; empty: not measured
        with these settings (``note`` says why).
    :param note: what else a user must know (what differs from the measured run, why a number
        is missing, whether the numbers compare).
    """

    name: str
    model: str
    model_options: Mapping[str, Any]
    train: Mapping[str, Any]
    evaluation: Evaluation
    data: str
    metric: str
    published: Union[float, str]
    source: str
    script: str
    result: Tuple[ResultKey, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        from pyro_seq.models import MODELS
        from pyro_seq.train.config import TrainConfig

        if self.model not in MODELS:
            raise ValueError(
                f"preset {self.name!r}: model {self.model!r} is not one of {sorted(MODELS)}"
            )
        known = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(self.train) - known)
        if unknown:
            raise ValueError(
                f"preset {self.name!r}: {unknown} are no TrainConfig fields; use names of "
                "pyro_seq.train.TrainConfig"
            )
        for what in ("model_options", "train"):
            if not _json_stable(dict(getattr(self, what))):
                raise ValueError(
                    f"preset {self.name!r}: {what} must survive JSON (lists, not tuples)"
                )
        object.__setattr__(self, "model_options", MappingProxyType(dict(self.model_options)))
        object.__setattr__(self, "train", MappingProxyType(dict(self.train)))
        object.__setattr__(self, "result", tuple(self.result))
        if len({part.weight is None for part in self.result}) > 1:
            raise ValueError(
                f"preset {self.name!r}: pooled result parts need a weight path on every part "
                "(pooled by weight) or on none (an equal mean, e.g. over training seeds)"
            )
        try:
            self.train_config().validate()
        except ValueError as e:
            raise ValueError(f"preset {self.name!r}: {e}") from None

    def train_config(self, **overrides: Any) -> "TrainConfig":
        """The preset's :class:`~pyro_seq.train.TrainConfig`, with ``overrides`` (field
        values, as the flags a user gives) applied over the preset's values. Lists in the
        preset (JSON form) become the tuples the fields hold. Not validated."""
        from pyro_seq.train.config import TrainConfig

        values: Dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in self.train.items()
        }
        values.update(overrides)
        return TrainConfig(**values)

    def build(self, obs_dim: int, input_dim: int = 0, **options: Any) -> "ModelContract":
        """The preset's model for data of ``obs_dim`` features and ``input_dim`` known inputs
        per step, ``options`` replacing the preset's model options of the same name."""
        from pyro_seq.models import MODELS

        return MODELS[self.model].for_data(obs_dim, input_dim, **{**self.model_options, **options})

    @property
    def data_file(self) -> Optional[str]:
        """The file name of data the package cannot ship (a piano-roll pickle), else None."""
        return self.data if self.data.endswith(".pickle") else None

    def data_spec(self, path: Union[str, "os.PathLike[str]", None] = None) -> str:
        """What :func:`pyro_seq.data.load_dataset` reads for this preset: ``path`` when given
        (as it is: ``load_dataset`` reports a missing one), the data set name, or the path of
        :attr:`data_file` found in :func:`data_search_dirs`. Raises ``FileNotFoundError``
        naming the file, the folders searched and the two remedies (``--data PATH`` or
        ``$PYRO_SEQ_DATA``)."""
        if path is not None:
            return os.fspath(path)
        if self.data_file is None:
            return self.data
        dirs = data_search_dirs()
        for d in dirs:
            if (d / self.data_file).is_file():
                return str(d / self.data_file)
        raise FileNotFoundError(
            f"preset {self.name} needs {self.data_file}, not found in "
            f"{[str(d) for d in dirs]}; pass --data PATH (the file's path) or put its folder "
            "in $PYRO_SEQ_DATA (nothing is downloaded)"
        )

    def load_data(
        self,
        path: Union[str, "os.PathLike[str]", None] = None,
        splits: Sequence[str] = ("train", "valid", "test"),
    ) -> Dict[str, Any]:
        """The preset's data splits (:meth:`data_spec`, then
        :func:`pyro_seq.data.load_dataset`)."""
        from pyro_seq.data import load_dataset

        return load_dataset(self.data_spec(path), splits=splits)

    def measured(self, results_dir: Union[str, "os.PathLike[str]", None] = None) -> Optional[float]:
        """The number this package measured with the preset, read from its result file(s) now:
        the value at its ``key`` (:class:`ResultKey`), or for several parts their mean weighted by
        :attr:`ResultKey.weight` (e.g. per-step log-likelihoods of disjoint test slices,
        pooled over their steps; parts without a weight, e.g. training seeds, count equally).
        None when not measured, or a file or key is absent."""
        values, weights = [], []
        for part in self.result:
            payload = part.read(results_dir)
            value = _lookup(payload, part.key)
            weight = _lookup(payload, part.weight) if part.weight is not None else 1.0
            if value is None or weight is None:
                return None
            values.append(value)
            weights.append(weight)
        if not values or sum(weights) <= 0:
            return None
        return sum(v * w for v, w in zip(values, weights)) / sum(weights)

    def seconds(self, results_dir: Union[str, "os.PathLike[str]", None] = None) -> Optional[float]:
        """The training seconds of the measured run (one core unless the result file says
        otherwise), read from the first result part; None when not recorded."""
        if not self.result:
            return None
        return _lookup(self.result[0].read(results_dir), self.result[0].seconds, total=True)

    def summary(self, results_dir: Union[str, "os.PathLike[str]", None] = None) -> Dict[str, Any]:
        """The preset as ``pyro-seq presets --json`` prints it: exactly the keys ``name``,
        ``model``, ``data``, ``metric``, ``published``, ``measured`` (read now; None when
        absent) and ``source``."""
        return {
            "name": self.name,
            "model": self.model,
            "data": self.data,
            "metric": self.metric,
            "published": self.published,
            "measured": self.measured(results_dir),
            "source": self.source,
        }
