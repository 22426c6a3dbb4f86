"""experiments/search_efficiency.py end to end on its smallest workload: real builds, real timings, the shared
measurement cache, the joint re-measurement of the leading configs, and its CSV/PNG outputs."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from relay_tune.tuning import read_records
from tests.experiment_scripts import load_experiment

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "experiments" / "search_efficiency.py"




@pytest.mark.slow
def test_search_efficiency_runs_caches_and_remeasures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_experiment("search_efficiency")
    argv = ["--trials", "10", "--seeds", "1", "--workloads", "depthwise", "--strategies", "random,xgb",
            "--warmup", "4", "--batch", "4", "--build-jobs", "1", "--remeasure-rounds", "2", "--out", str(tmp_path)]
    assert script.main(argv) == 0
    first_out = capsys.readouterr().out
    assert "trials to reach 95%" in first_out
    assert "re-measuring depthwise" in first_out

    rows = list(csv.DictReader((tmp_path / "curves.csv").open()))
    assert {r["strategy"] for r in rows} == {"random", "xgb"}
    for strategy in ("random", "xgb"):
        curve = [float(r["best_gflops"]) for r in rows if r["strategy"] == strategy]
        assert len(curve) == 10
        assert curve == sorted(curve) and curve[-1] > 0  # best-so-far never drops
    summary = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert {r["strategy"] for r in summary} == {"random", "xgb"}
    assert (tmp_path / "search_efficiency.png").stat().st_size > 0
    cache = tmp_path / "measurements" / "depthwise-relay.jsonl"
    measured = len(cache.read_text().splitlines())
    assert 10 <= measured <= 20
    remeasured = tmp_path / "measurements" / "depthwise-relay-remeasured.jsonl"
    entries = [json.loads(line) for line in remeasured.read_text().splitlines()]
    assert entries
    for entry in entries:  # the value is the median of the rounds' timings (here 2: their mean)
        assert len(entry["rounds"]) == 2
        assert entry["gflops"] == pytest.approx(sum(entry["rounds"]) / 2)
    # as relay-tune does, every run measures the task's default schedule first, whatever its strategy
    task = script.relay_task("depthwise", 1)
    for strategy in ("random", "xgb"):
        records = read_records(tmp_path / "logs" / "depthwise" / f"{strategy}-s0.jsonl")
        assert records[0].config == task.default_config()

    # A second invocation is answered from the caches: nothing new is measured or re-measured, same curves.
    assert script.main(argv) == 0
    second_out = capsys.readouterr().out
    assert len(cache.read_text().splitlines()) == measured
    assert "already done" in second_out
    rows_again = list(csv.DictReader((tmp_path / "curves.csv").open()))
    random_rows = [r for r in rows if r["strategy"] == "random"]
    assert [r for r in rows_again if r["strategy"] == "random"] == random_rows


def test_whole_model_workloads_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_experiment("search_efficiency")
    tasks = script.model_tasks("mobilenet_v1", 1)
    assert len(tasks) > 10
    names = script.model_workloads(["mobilenet_v1:top3", "mobilenet_v1:02", "dense"], 1)
    top = sorted(range(len(tasks)), key=lambda i: -tasks[i].weight * tasks[i].flops)[:3]
    assert names[:3] == [f"mobilenet_v1:{i:02d}" for i in sorted(top)] and names[-1] == "dense"
    assert script.model_workloads(["mobilenet_v1:*"], 1) == [f"mobilenet_v1:{i:02d}" for i in range(len(tasks))]
    assert script.relay_task("mobilenet_v1:02", 1).key == tasks[2].key
    with pytest.raises(ValueError, match="no task 99"):
        script.model_workloads(["mobilenet_v1:99"], 1)

    # Two tasks, two seeds: "xgb-transfer" reaches the best estimate after 2 trials per task, "xgb" after 4.
    workloads = [f"mobilenet_v1:{i:02d}" for i in sorted(top[:2])]
    slow, fast = [1.0, 2.0, 5.0, 10.0, 10.0], [5.0, 10.0, 10.0, 10.0, 10.0]
    outcomes = [script.RunOutcome(w, strategy, seed, list(curve), 0.0, 0.0, 0.0)
                for w in workloads for seed in (0, 1)
                for strategy, curve in (("xgb", slow), ("xgb-transfer", fast))]
    args = argparse.Namespace(workloads=workloads, strategies=["xgb", "xgb-transfer"], transfer_sources=[], cores=1)
    rows = script.whole_model_table(outcomes, args)
    assert [(r["strategy"], r["median_trials_to_95pct"]) for r in rows] == [("xgb", 8), ("xgb-transfer", 4)]
    assert "2.00x fewer than xgb" in capsys.readouterr().out
