"""Databases of tuning records (one conformance suite for every implementation), apply_best, log tools."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from relay_tune import logs
from relay_tune.tuning import (
    Database,
    ErrorKind,
    JsonLinesDatabase,
    LogEvent,
    LogWriter,
    MemoryDatabase,
    TuningRecord,
    apply_best,
    read_records,
)
from search_space import Config


def record(key: str, cost: float | None, tile: int, target: str = "llvm", timestamp: float = 0.0,
           error: ErrorKind = ErrorKind.RUNTIME_ERROR, flops: float = 2e6) -> TuningRecord:
    return TuningRecord(
        workload_key=key, target=target, config=Config({"tile": tile}),
        costs=() if cost is None else (cost,), error_kind=None if cost is not None else error,
        error_msg="" if cost is not None else "failed", flops=flops, timestamp=timestamp, trial=tile,
    )


DATABASES: dict[str, Callable[[Path], Database]] = {
    "memory": lambda tmp: MemoryDatabase(),
    "jsonl": lambda tmp: JsonLinesDatabase(tmp / "log.jsonl"),
}


@pytest.fixture(params=sorted(DATABASES))
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    return DATABASES[request.param](tmp_path)


# -- conformance: every Database ---------------------------------------------------------------------------------


def test_records_are_returned_per_workload_and_target_in_commit_order(database: Database) -> None:
    database.commit(record("a", 3.0, 1))
    database.commit(record("a", 2.0, 2))
    database.commit(record("a", 1.0, 3, target="cuda"))
    database.commit(record("b", 5.0, 1))
    assert [r.trial for r in database.records("a", "llvm")] == [1, 2]
    assert [r.trial for r in database.records("a", "cuda")] == [3]
    assert database.records("a", "rocm") == []
    assert sorted(database.keys()) == [("a", "cuda"), ("a", "llvm"), ("b", "llvm")]


def test_best_ignores_errors_and_keeps_one_record_per_config(database: Database) -> None:
    for kind in (ErrorKind.WRONG_RESULT, ErrorKind.TIMEOUT, ErrorKind.RUNTIME_ERROR, ErrorKind.COMPILE_ERROR):
        database.commit(record("a", None, 9, error=kind))
    database.commit(record("a", 4.0, 1))
    database.commit(record("a", 2.0, 2))
    database.commit(record("a", 3.0, 2))  # the same config again, slower: its best measurement counts
    database.commit(record("a", 1.5, 3))
    best = database.best("a", "llvm", k=5)
    assert [(r.config["tile"], r.mean_cost) for r in best] == [(3, 1.5), (2, 2.0), (1, 4.0)]
    assert database.best("a", "cuda") == []


def test_only_errors_means_no_best(database: Database) -> None:
    database.commit(record("a", None, 1, error=ErrorKind.WRONG_RESULT))
    assert database.best("a", "llvm") == []


# -- JSON-lines specifics ---------------------------------------------------------------------------------------


def test_jsonl_database_survives_reopening_and_sees_other_writers(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    first = JsonLinesDatabase(log)
    first.commit(record("a", 2.0, 1))
    first.log_event(LogEvent("session_start", "s"))
    other = LogWriter(log)  # another process appending to the same file
    other.write_one(record("a", 1.0, 2))
    assert [r.trial for r in first.records("a", "llvm")] == [1, 2]
    assert [e.event for e in first.events] == ["session_start"]
    reopened = JsonLinesDatabase(log)
    assert reopened.best("a", "llvm")[0].trial == 2


def test_merging_logs_fastest_valid_record_wins(tmp_path: Path) -> None:
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    LogWriter(one).write([record("a", 2.0, 1), record("b", 1.0, 1), record("b", None, 2, error=ErrorKind.TIMEOUT)])
    LogWriter(two).write([record("a", 1.0, 5), record("b", None, 3, error=ErrorKind.WRONG_RESULT),
                          record("c", 9.0, 1, target="cuda")])
    database = JsonLinesDatabase([one, two])
    assert database.best("a", "llvm")[0].config == Config({"tile": 5})
    assert database.best("b", "llvm")[0].config == Config({"tile": 1})
    chosen = apply_best([one, two])
    assert chosen == {("a", "llvm"): Config({"tile": 5}), ("b", "llvm"): Config({"tile": 1}),
                      ("c", "cuda"): Config({"tile": 1})}
    assert apply_best([one, two], target="cuda") == {("c", "cuda"): Config({"tile": 1})}
    assert apply_best([]) == {}


def test_wrong_results_never_win_even_alone(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    LogWriter(log).write([record("a", None, 1, error=ErrorKind.WRONG_RESULT)])
    assert apply_best(log) == {}


def test_commit_goes_to_the_write_path_only(tmp_path: Path) -> None:
    shared, mine = tmp_path / "shared.jsonl", tmp_path / "mine.jsonl"
    LogWriter(shared).write_one(record("a", 1.0, 1))
    database = JsonLinesDatabase([shared], write_path=mine)
    database.commit(record("a", 0.5, 2))
    assert len(read_records(shared)) == 1 and len(read_records(mine)) == 1
    assert database.best("a", "llvm")[0].trial == 2


# -- log tools --------------------------------------------------------------------------------------------------


def test_merge_dedupes_and_never_writes_in_place(tmp_path: Path) -> None:
    one, two, out = tmp_path / "one.jsonl", tmp_path / "two.jsonl", tmp_path / "out.jsonl"
    shared = record("a", 1.0, 1, timestamp=5.0)
    LogWriter(one).write([shared, record("a", 2.0, 2), LogEvent("session_start", "s1", 1.0)])
    LogWriter(two).write([shared, record("b", 3.0, 1)])
    assert logs.merge([one, two], out) == 3
    assert len(read_records(out)) == 3
    with pytest.raises(ValueError, match="in place"):
        logs.merge([one, two], one)
    with pytest.raises(FileExistsError):
        logs.merge([one], out)
    assert logs.merge([one], out, overwrite=True) == 2


def test_distill_keeps_the_top_k_per_workload(tmp_path: Path) -> None:
    log, out = tmp_path / "log.jsonl", tmp_path / "best.jsonl"
    LogWriter(log).write([record("a", c, i) for i, c in enumerate([5.0, 1.0, 3.0, 2.0])]
                         + [record("b", None, 1), record("b", 4.0, 2)])
    assert logs.distill([log], out, top=2) == 3
    kept = {(r.workload_key, r.mean_cost) for r in read_records(out)}
    assert kept == {("a", 1.0), ("a", 2.0), ("b", 4.0)}


def test_load_gives_a_tidy_frame_with_best_so_far(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    costs = [4.0, None, 2.0, 3.0, 1.0]
    LogWriter(log).write([record("a", c, i, timestamp=float(i)) for i, c in enumerate(costs)]
                         + [record("b", 8.0, 0, timestamp=2.5)])
    frame = logs.load(log)
    assert list(frame.columns) == logs.COLUMNS
    a = frame[frame["workload_key"] == "a"]
    assert list(a["task_trial"]) == [0, 1, 2, 3, 4]
    assert list(a["best_cost_so_far"]) == [4.0, 4.0, 2.0, 2.0, 1.0]
    assert list(a["ok"]) == [True, False, True, True, True]
    assert np.isnan(a["gflops"].iloc[1])
    assert a["best_gflops_so_far"].iloc[-1] == pytest.approx(2e6 / 1.0 / 1e9)
    assert list(frame["timestamp"]) == sorted(frame["timestamp"])
    empty = logs.load([])
    assert list(empty.columns) == logs.COLUMNS and len(empty) == 0


def test_load_reads_folders_and_glob_patterns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    LogWriter(folder / "one.jsonl").write([record("a", 1.0, 1)])
    LogWriter(folder / "two.jsonl").write([record("b", 2.0, 1), record("b", 3.0, 2)])
    (folder / "notes.txt").write_text("not a log\n")
    assert len(logs.load(folder)) == 3
    assert len(logs.load(str(folder / "*.jsonl"))) == 3
    assert len(logs.load([folder / "one.jsonl", str(folder / "t*.jsonl")])) == 3
    monkeypatch.chdir(tmp_path)
    assert len(logs.load("logs/*.jsonl")) == 3  # a relative pattern
    with pytest.raises(FileNotFoundError, match="no tuning log matches"):
        logs.load(str(folder / "missing-*.jsonl"))


# -- timing kinds ------------------------------------------------------------------------------------------------


def test_times_of_different_kinds_are_not_ranked_together(database: Database) -> None:
    """A log written before the runner timed kernels in context, topped up after: the old back-to-back times are
    shorter by the way they were taken, so only the records of the newest record's kind compete."""
    from dataclasses import replace

    database.commit(replace(record("a", 1.0, 1, timestamp=10.0), timing=""))
    database.commit(replace(record("a", 3.0, 2, timestamp=20.0), timing="in_context"))
    database.commit(replace(record("a", 2.0, 3, timestamp=30.0), timing="in_context"))
    database.commit(replace(record("a", None, 4, timestamp=40.0), timing="back_to_back"))  # errors do not count
    assert [r.trial for r in database.best("a", "llvm", k=3)] == [3, 2]
    database.commit(replace(record("b", 1.0, 1, timestamp=30.0), timing=""))
    database.commit(replace(record("b", 3.0, 2, timestamp=20.0), timing="in_context"))
    assert [r.trial for r in database.best("b", "llvm", k=3)] == [1]  # the newest record is of the old kind
    database.commit(replace(record("c", 2.0, 1, timestamp=1.0), timing="in_context"))
    database.commit(replace(record("c", 1.0, 2, timestamp=2.0), timing="in_context"))
    assert [r.trial for r in database.best("c", "llvm", k=3)] == [2, 1]


def test_timing_kind_round_trips_and_old_lines_read_as_unknown() -> None:
    import json
    from dataclasses import replace

    line = replace(record("a", 1.0, 1), timing="in_context").to_json()
    assert json.loads(line)["timing"] == "in_context"
    assert TuningRecord.from_json(line).timing == "in_context"
    old = json.loads(line)
    del old["timing"]
    assert TuningRecord.from_json(json.dumps(old)).timing == ""


def test_the_tuner_writes_its_runners_timing_kind(tmp_path: Path) -> None:
    from relay_tune.tuning.driver import tune
    from relay_tune.tuning.simulated import SimulatedBuilder, SleepRunner, simulated_tasks

    class Kind(SleepRunner):
        @property
        def timing_kind(self) -> str:
            return "in_context"

    log = tmp_path / "log.jsonl"
    tune(simulated_tasks()[:1], 4, log, storage=None, builder=SimulatedBuilder(), runner=Kind(0.0))
    kinds = {r.timing for r in read_records(log)}
    assert kinds == {"in_context"}


def test_runners_say_how_they_time() -> None:
    from relay_tune.tuning.cuda_runner import CudaRunner
    from relay_tune.tuning.hostlock import HostLockedRunner
    from relay_tune.tuning.runner import LocalRunner

    assert LocalRunner().timing_kind == "in_context"
    assert LocalRunner(in_context=False).timing_kind == "back_to_back"
    assert LocalRunner(flush_cache=True).timing_kind == "flush_cache"
    assert HostLockedRunner(LocalRunner(in_context=False)).timing_kind == "back_to_back"
    assert CudaRunner().timing_kind == "cuda_events"


def test_comparable_records_keep_failures_and_the_newest_kind() -> None:
    from dataclasses import replace

    from relay_tune.records.log_format import comparable_records
    from relay_tune.tuning.search import FAILURE_VALUE, measured_values

    old = [replace(record("a", 1.0, tile, timestamp=float(tile)), timing="back_to_back") for tile in (1, 2)]
    new = [replace(record("a", 3.0, tile, timestamp=10.0 + tile), timing="in_context") for tile in (2, 3)]
    failed = replace(record("a", None, 4, timestamp=1.0), timing="back_to_back")
    assert comparable_records([*old, failed]) == [*old, failed]  # one kind: everything
    kept = comparable_records(old + new + [failed])
    assert kept == [*new, failed]
    # The search is told only the times of the newest kind: config 1 (timed back to back only) may be measured
    # again; config 2's shorter back-to-back time does not hide its in-context time.
    assert measured_values(old + new + [failed]) == {
        Config({"tile": 2}).key: 3.0, Config({"tile": 3}).key: 3.0, Config({"tile": 4}).key: FAILURE_VALUE,
    }
