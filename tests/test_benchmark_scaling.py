"""The data-parallel benchmarks: ``benchmarks/scaling.py`` end to end in its smoke mode (the
JSON's fields and the arithmetic between them, never timing values), and the "within noise"
rule of ``benchmarks/nproc_curve.py``."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import nproc_curve  # noqa: E402
import scaling  # noqa: E402


def test_scaling_smoke_writes_the_documented_json(tmp_path, capsys):
    out = tmp_path / "scaling.json"
    scaling.main(["--smoke", "--output", str(out)])
    printed = capsys.readouterr().out
    assert "srnn N=2" in printed and "about" in printed  # progress lines
    result = json.loads(out.read_text())
    assert result["benchmark"] == "scaling" and result["smoke"] is True
    state = result["machine_state"]
    assert state["cores"] >= 1 and 1 <= state["usable_cores"] <= state["cores"]
    assert len(state["load_average_start"]) == 3 and len(state["load_average_end"]) == 3
    assert {"python", "torch", "pyro"} <= set(result["versions"])
    assert {"cpu", "cores", "date"} <= set(result["machine"])
    settings = result["settings"]
    assert settings["nprocs"] == [1, 2] and settings["threads_per_process"] == 1
    assert settings["warmup_epochs"] == 1 and settings["repeats"] == 1
    assert set(result["results"]) == {"srnn", "dmm"}
    for name, r in result["results"].items():
        assert r["num_parameters"] > 0 and r["batch_size"] == 4
        assert r["train"]["batch_size"] == 4
        per_n = r["per_nproc"]
        assert set(per_n) == {"1", "2"}
        one = per_n["1"]
        assert one["efficiency"] == pytest.approx(1.0) and one["speedup"] == pytest.approx(1.0)
        assert "allreduce_seconds_per_update" not in one
        for n, entry in per_n.items():
            n = int(n)
            (cell,) = entry["cells"]
            # warm-up excluded: the measured epoch only, sequences over its seconds
            assert len(cell["epoch_seconds"]) == 2 and cell["measured_epochs"] == 1
            assert cell["sequences_per_epoch"] == result["num_train_sequences"] == 16
            assert cell["updates_per_epoch"] == 4  # 16 sequences in minibatches of 4
            assert cell["sequences_per_second"] == pytest.approx(16 / cell["epoch_seconds"][1])
            assert entry["sequences_per_second_median"] == cell["sequences_per_second"]
            assert entry["efficiency"] == pytest.approx(
                entry["sequences_per_second_median"] / (n * one["sequences_per_second_median"]))
            assert entry["speedup"] == pytest.approx(n * entry["efficiency"])
        two = per_n["2"]
        assert two["allreduce_seconds_per_update"] > 0
        assert two["allreduce_share_of_epoch"] == pytest.approx(
            two["allreduce_seconds_per_update"] * 4 / two["cells"][0]["epoch_seconds"][1])


def test_scaling_smoke_without_output_writes_nothing(monkeypatch, tmp_path):
    written = []
    monkeypatch.setattr(scaling, "write_result", lambda *a, **k: written.append(a))
    monkeypatch.setattr(scaling, "measure", lambda models, *a, **k: {})
    scaling.main(["--smoke"])
    assert written == []


def test_nproc_curve_rule():
    a = [-11.0, -10.0, -9.0, -8.5]
    b = [-11.1, -10.05, -9.1, -8.45]  # |a-b| max 0.1, mean 0.075
    c = [-11.5, -10.2, -9.0, -8.6]  # |a-c| max 0.5, mean 0.2
    v = nproc_curve.judge(a, b, c)
    assert v["epochs_compared"] == 4 and v["within_noise"]
    assert v["max_abs_diff_ab"] == pytest.approx(0.1) and v["epoch_of_max_ab"] in (1, 3)
    assert v["mean_abs_diff_ab"] == pytest.approx(0.075)
    assert v["max_abs_diff_ac"] == pytest.approx(0.5) and v["epoch_of_max_ac"] == 1
    assert v["best_valid"] == {"a": -8.5, "b": -8.45, "c": -8.6}
    assert v["best_diff_ab"] == pytest.approx(0.05) and v["best_diff_ac"] == pytest.approx(0.1)
    assert v["last_diff_ab"] == pytest.approx(0.05)
    # two processes further from a than the other seed, in the max: not within noise
    assert not nproc_curve.judge(a, [-12.0] + b[1:], c)["within_noise"]
    # small max but a larger mean difference: not within noise either
    assert not nproc_curve.judge(a, [x - 0.3 for x in a], c)["within_noise"]
    # only the epochs all three completed are compared (a run may stop early)
    assert nproc_curve.judge(a, b[:2], c)["epochs_compared"] == 2
    with pytest.raises(ValueError):
        nproc_curve.judge(a, [], c)
