"""The JSB training scripts (``benchmarks/paper/jsb_dmm.py``, ``jsb_srnn.py``) take their
settings from the presets (:mod:`pyro_seq.presets`), so that the docs' tables, the scripts and
``pyro-seq train --preset`` cannot drift apart."""

import re
import sys
from pathlib import Path

import pytest

from pyro_seq.presets import get_preset

PAPER = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path[:0] = [str(PAPER), str(PAPER.parent)]

import jsb_dmm  # noqa: E402
import jsb_srnn  # noqa: E402


@pytest.mark.parametrize("script", [jsb_dmm, jsb_srnn])
def test_the_scripts_train_with_the_presets_settings(script):
    default = get_preset(script.PRESETS[0])  # names this script as the source of its number
    assert default.script.startswith(f"benchmarks/paper/{Path(script.__file__).name}")
    assert script.MODEL == dict(default.model_options)
    assert script.CONFIG == default.train_config()
    assert default.result and default.result[0].file == f"{Path(script.__file__).stem}.json"
    # no settings of its own: no TrainConfig or model sizes written in the script
    source = Path(script.__file__).read_text()
    assert "TrainConfig(" not in source and not re.search(r"\b(z_dim|lr)=", source)
