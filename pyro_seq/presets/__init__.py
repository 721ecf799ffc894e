"""Paper presets: every published configuration the package reproduces, by name.

``pyro-seq presets`` lists them with the published number beside the one this package
measured; ``pyro-seq train --preset NAME [--data PATH]`` trains one. :class:`Preset` (in
:mod:`pyro_seq.presets.preset`) says what a preset holds; :data:`PRESETS` and
:func:`get_preset` (in :mod:`pyro_seq.presets.catalogue`) are the presets themselves.
"""

from pyro_seq.presets.catalogue import PRESETS, get_preset
from pyro_seq.presets.preset import (
    EVALUATION_METHODS,
    RESULTS_DIR,
    Evaluation,
    Preset,
    ResultKey,
    data_search_dirs,
)

__all__ = [
    "EVALUATION_METHODS",
    "PRESETS",
    "RESULTS_DIR",
    "Evaluation",
    "Preset",
    "ResultKey",
    "data_search_dirs",
    "get_preset",
]
