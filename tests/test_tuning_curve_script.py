"""experiments/tuning_curve.py: the tuning clock read from a log's timestamps (sessions summed), the curve
arithmetic, and a short end-to-end run on a tiny ResNet (real tuning, builds checked against the interpreter,
interleaved end-to-end timings, CSV and PNG)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from relay_tune.records.log_format import LogEvent, LogWriter, TuningRecord
from search_space import Config
from tests.experiment_scripts import load_experiment

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "tuning_curve.py"




def _record(i: int, session: str, at: float, cost: float | None = 1e-3) -> TuningRecord:
    return TuningRecord("k", "llvm", Config({"i": i}), (cost,) if cost is not None else (), None,
                        timestamp=at, session=session)


def test_the_tuning_clock_sums_sessions_and_skips_the_gaps(tmp_path: Path) -> None:
    script = load_experiment("tuning_curve")
    log = tmp_path / "run.jsonl"
    writer = LogWriter(log)
    # session a: 1000..1030, then an hour's pause, session b: 5000..5010 (a resumed run)
    writer.write_one(LogEvent("session_start", "a", 1000.0))
    writer.write([_record(0, "a", 1010.0), _record(1, "a", 1030.0)])
    writer.write_one(LogEvent("session_end", "a", 1031.0))
    writer.write_one(LogEvent("session_start", "b", 5000.0))
    writer.write([_record(2, "b", 5004.0), _record(3, "b", 5010.0)])
    clock = script.tuning_clock(log)
    assert [round(t, 6) for t, _ in clock] == [10.0, 30.0, 35.0, 41.0]
    assert [r.config["i"] for _, r in clock] == [0, 1, 2, 3]
    assert script.tuning_seconds(log) == pytest.approx(41.0)
    assert script.tuning_clock(tmp_path / "missing.jsonl") == []


def test_checkpoints_and_time_to_share() -> None:
    script = load_experiment("tuning_curve")
    assert script.checkpoints(130.0, 60.0) == [0.0, 60.0, 120.0, 130.0]
    assert script.checkpoints(120.0, 60.0) == [0.0, 60.0, 120.0]
    assert script.checkpoints(0.0, 60.0) == [0.0]

    def points(latencies: list[float]) -> list[object]:
        return [script.Point("m", "v", 60.0 * i, 10 * i, None, 0, None, e2e) for i, e2e in enumerate(latencies)]

    # default 10 ms, final 5 ms: 90% of the improvement is 5.5 ms, first reached at the third point
    assert script.time_to_share(points([10.0, 7.0, 5.4, 5.6, 5.0]), 10.0, 0.9) == 120.0
    assert script.time_to_share(points([10.0, 10.5]), 10.0, 0.9) is None  # no improvement to speak of


@pytest.mark.slow
def test_a_short_curve_run_on_a_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_experiment("tuning_curve")
    common = ["--models", "tiny_resnet18", "--variants", "gradient,round-robin", "--trials", "20",
              "--batch", "1", "--checkpoint-s", "2", "--rounds", "2", "--out", str(tmp_path)]
    # a piece of tuning that ends this invocation early; the same command continues
    assert script.main([*common, "--stage", "tune", "--piece-s", "0.5"]) == 0
    assert "run the same command again to continue" in capsys.readouterr().out
    assert not (tmp_path / "logs" / "tiny_resnet18.gradient.done").exists()
    assert script.main(common) == 0
    out = capsys.readouterr().out
    assert "tiny_resnet18: default schedules" in out and "90% of that improvement after" in out
    assert "scheduler's estimate" in out
    for variant in ("gradient", "round-robin"):
        assert (tmp_path / "logs" / f"tiny_resnet18.{variant}.done").exists()
    rows = list(csv.DictReader((tmp_path / "curve.csv").open()))
    assert {r["variant"] for r in rows} == {"gradient", "round-robin"}
    for variant in ("gradient", "round-robin"):
        mine = [r for r in rows if r["variant"] == variant]
        assert float(mine[0]["tuning_s"]) == 0.0 and int(mine[0]["trials"]) == 0
        assert int(mine[-1]["trials"]) == 20
        assert float(mine[0]["e2e_ms"]) == pytest.approx(float(mine[0]["default_e2e_ms"]))  # nothing tuned yet
        assert all(float(r["e2e_ms"]) > 0 for r in mine)
        assert mine[-1]["estimate_ms"] != ""  # every task has a record by the end
    assert (tmp_path / "tuning_curve.png").stat().st_size > 10_000
