"""The data-parallel benchmarks: ``benchmarks/speed/scaling.py`` end to end in its smoke mode (the
JSON's fields and the arithmetic between them, never timing values), and the "within noise"
rule of ``benchmarks/speed/nproc_curve.py``."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path[:0] = [str(BENCHMARKS / "speed"), str(BENCHMARKS)]

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
    for _name, r in result["results"].items():
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
                entry["sequences_per_second_median"] / (n * one["sequences_per_second_median"])
            )
            assert entry["speedup"] == pytest.approx(n * entry["efficiency"])
        two = per_n["2"]
        assert two["allreduce_seconds_per_update"] > 0
        assert two["allreduce_share_of_epoch"] == pytest.approx(
            two["allreduce_seconds_per_update"] * 4 / two["cells"][0]["epoch_seconds"][1]
        )


def test_scaling_smoke_without_output_writes_nothing(monkeypatch, tmp_path):
    written = []
    monkeypatch.setattr(scaling, "write_result", lambda *a, **k: written.append(a))
    monkeypatch.setattr(scaling, "measure", lambda models, *a, **k: {})
    scaling.main(["--smoke"])
    assert written == []


def test_nproc_curve_permutation_test_is_exact():
    # two groups of two: 6 splits; the observed split has the largest gap, as does its mirror
    gap, p = nproc_curve.permutation_test(
        [0.0, 0.1], [1.0, 1.1], lambda a, b: abs(sum(a) / len(a) - sum(b) / len(b))
    )
    assert gap == pytest.approx(1.0) and p == pytest.approx(2 / 6)
    # interleaved groups: the smallest gap, every split at least as large
    gap, p = nproc_curve.permutation_test(
        [0.0, 1.1], [0.1, 1.0], lambda a, b: abs(sum(a) / len(a) - sum(b) / len(b))
    )
    assert gap == pytest.approx(0.0) and p == pytest.approx(1.0)
    with pytest.raises(ValueError):
        nproc_curve.permutation_test([], [1.0], lambda a, b: 0.0)


def test_nproc_curve_rule():
    base = [-11.0, -10.0, -9.0, -8.5]
    noise = [0.05, -0.04, 0.02, -0.03]
    # runs a..h: 1 process a c e g, 2 processes b d f h; per-seed offsets, no process effect
    curves = {
        k: [v + noise[i // 2] * (1 + 0.1 * e) for e, v in enumerate(base)]
        for i, k in enumerate("abcdefgh")
    }
    v = nproc_curve.judge(curves)
    assert v["epochs_compared"] == 4 and v["splits"] == 70
    assert v["runs_1_process"] == list("aceg") and v["runs_2_processes"] == list("bdfh")
    assert v["curve_gap"] == pytest.approx(0.0, abs=1e-12) and v["p_curve"] == 1.0
    assert v["within_noise"]
    # hand check of the statistic: shift every 2-process run by 0.2 -> gap 0.2, the largest of
    # all 70 splits (only it and its mirror reach it): p = 2/70, not within noise
    shifted = {
        k: [x - 0.2 for x in c] if nproc_curve.RUNS[k][0] == 2 else c for k, c in curves.items()
    }
    v = nproc_curve.judge(shifted)
    assert v["curve_gap"] == pytest.approx(0.2) and v["p_curve"] == pytest.approx(2 / 70)
    assert not v["within_noise"]
    assert v["best_valid_2_processes"]["mean"] == pytest.approx(
        v["best_valid_1_process"]["mean"] - 0.2
    )
    # only the epochs every run completed (or --compare-epochs) are compared
    short = dict(curves, b=curves["b"][:2])
    assert nproc_curve.judge(short)["epochs_compared"] == 2
    assert nproc_curve.judge(curves, compare_epochs=3)["epochs_compared"] == 3
    with pytest.raises(ValueError):
        nproc_curve.judge(dict(curves, b=[]))
