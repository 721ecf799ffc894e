"""``benchmarks/speed/epoch_speed.py``: the smoke run end to end (one cell per declared objective,
every epoch timed and finite, the medians the medians of the recorded epochs, the file written)
and the cell list read from each model's declared objectives (never timing values)."""

import json
import statistics
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path[:0] = [str(BENCHMARKS / "speed"), str(BENCHMARKS), str(BENCHMARKS / "paper")]

import epoch_speed  # noqa: E402

from pyro_seq.models import MODELS  # noqa: E402


def test_cells_follow_the_declared_objectives():
    cells = epoch_speed.cells(["dmm", "rnn"], ["elbo", "iwae", "fivo"])
    for name in ("dmm", "rnn"):
        declared = [o for o in ("elbo", "iwae", "fivo") if o in MODELS[name].objectives]
        assert [o for m, o in cells if m == name] == declared


def test_smoke_run_writes_every_cell(tmp_path):
    out = tmp_path / "epoch_speed.json"
    epoch_speed.main(["--smoke", "--output", str(out)])
    result = json.loads(out.read_text())
    assert set(result["cells"]) == {
        f"{m}/{o}" for m in ("dmm", "vrnn") for o in ("elbo", "iwae", "fivo")
    }
    for key, row in result["cells"].items():
        assert key == f"{row['model']}/{row['objective']}"
        assert len(row["cpu_seconds_per_epoch"]) == result["settings"]["repeats"] == 1
        assert all(t > 0 for t in row["cpu_seconds_per_epoch"] + row["wall_seconds_per_epoch"])
        assert row["median_cpu_seconds"] == statistics.median(row["cpu_seconds_per_epoch"])
        assert row["particles"] == (1 if row["objective"] == "elbo" else 4)
    assert result["settings"]["batches_per_epoch"] == 2 and "torch" in result["machine"]
