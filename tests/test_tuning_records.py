"""Tuning records and the JSON-lines log: round trips, concurrent appends, torn lines, readers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_tune import logs
from relay_tune.records.log_format import LogTail, parse_line
from relay_tune.tuning import (
    SCHEMA_VERSION,
    ErrorKind,
    LogEvent,
    LogFormatError,
    LogWarning,
    LogWriter,
    MeasureResult,
    TuningRecord,
    append_lines,
    iter_log,
    read_events,
    read_records,
)
from search_space import Config

REPO_ROOT = Path(__file__).resolve().parents[1]

# -- strategies -------------------------------------------------------------------------------------------------

finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=12),
                    st.floats(allow_nan=False, allow_infinity=False))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=8)
configs = st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=5).map(Config)


@st.composite
def records(draw: st.DrawFn) -> TuningRecord:
    error = draw(st.one_of(st.none(), st.sampled_from(list(ErrorKind))))
    costs = () if error is not None else tuple(draw(st.lists(finite, min_size=1, max_size=5)))
    return TuningRecord(
        workload_key=draw(st.text(min_size=1, max_size=30)),
        target=draw(st.text(max_size=30)),
        config=draw(configs),
        costs=costs,
        error_kind=error,
        error_msg=draw(st.text(max_size=50)) if error is not None else "",
        description=draw(st.text(max_size=30)),
        flops=draw(finite),
        host_cpu=draw(st.text(max_size=10)),
        build_seconds=draw(finite),
        run_seconds=draw(finite),
        timestamp=draw(finite),
        trial=draw(st.integers(-1, 10**6)),
        strategy=draw(st.text(max_size=10)),
        session=draw(st.text(max_size=12)),
        version=draw(st.text(max_size=8)),
    )


def sample_record(index: int = 0, cost: float | None = 1e-3, key: str = "dense-1", target: str = "llvm",
                  error: ErrorKind | None = None, config: Config | None = None) -> TuningRecord:
    return TuningRecord(
        workload_key=key, target=target, config=config or Config({"tile": (index + 1, 4), "order": "ikj"}),
        costs=() if cost is None else (cost, cost * 1.1), error_kind=error if cost is None else None,
        error_msg="boom" if cost is None else "", description="dense 4x4", flops=1e6, timestamp=1000.0 + index,
        trial=index, strategy="optuna-tpe", session="s1",
    )


# -- round trip -------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(records())
def test_record_json_round_trip_is_one_to_one(record: TuningRecord) -> None:
    line = record.to_json()
    assert "\n" not in line and line.isascii()
    again = TuningRecord.from_json(line)
    assert again == record
    assert again.to_json() == line


def test_record_line_fields() -> None:
    record = sample_record(3)
    data = json.loads(record.to_json())
    assert data["v"] == SCHEMA_VERSION
    assert data["config"] == {"tile": [4, 4], "order": "ikj"}
    assert data["config_key"] == record.config.key
    assert data["costs"] == [1e-3, 1.1e-3]
    assert data["mean_cost"] == pytest.approx(1.05e-3) and data["min_cost"] == 1e-3
    assert data["error_kind"] == "OK" and data["error_no"] == 0
    assert record.gflops == pytest.approx(1e6 / 1e-3 / 1e9)  # ranked by the fastest repeat


@pytest.mark.parametrize(("kind", "number"), [
    (ErrorKind.INVALID_CONFIG, 1), (ErrorKind.COMPILE_ERROR, 2), (ErrorKind.RUNTIME_ERROR, 4),
    (ErrorKind.WRONG_RESULT, 5), (ErrorKind.BUILD_TIMEOUT, 6), (ErrorKind.TIMEOUT, 7),
])
def test_error_numbers_follow_autotvm(kind: ErrorKind, number: int) -> None:
    record = sample_record(cost=None, error=kind)
    data = json.loads(record.to_json())
    assert (data["error_kind"], data["error_no"], data["costs"], data["mean_cost"]) == (kind.name, number, [], None)
    assert not record.ok and record.gflops is None


def test_records_and_results_reject_inconsistent_costs() -> None:
    with pytest.raises(ValueError):
        TuningRecord("k", "t", Config({}), costs=(1.0,), error_kind=ErrorKind.TIMEOUT)
    with pytest.raises(ValueError):
        TuningRecord("k", "t", Config({}), costs=())
    with pytest.raises(ValueError):
        TuningRecord("k", "t", Config({}), costs=(float("nan"),))
    with pytest.raises(ValueError):
        MeasureResult(None, None)


def test_from_measurement_and_back() -> None:
    result = MeasureResult((2e-3, 4e-3), None, "", 0.5, 0.25, timestamp=123.0)
    record = TuningRecord.from_measurement("k", "llvm", Config({"a": 1}), result, flops=8e6, trial=7)
    assert record.mean_cost == pytest.approx(3e-3) and record.trial == 7 and record.host_cpu
    assert record.measure_result() == result


@pytest.mark.parametrize("line", [
    '{"v": 99, "workload_key": "k"}',
    '{"v": 1, "workload_key": "k", "target": "t", "config": {"a": 1}, "config_key": "nope", "costs": [1.0]}',
    '{"v": 1, "workload_key": "k", "target": "t", "config": {"a": 1}, "costs": [], "error_kind": "MELTDOWN"}',
    '[1, 2, 3]',
    '{"v": 1, "workload_ke',
])
def test_bad_lines_raise_log_format_errors(line: str) -> None:
    with pytest.raises(LogFormatError):
        parse_line(line)


def test_events_round_trip() -> None:
    event = LogEvent("session_start", "abc", 5.0, {"seed": 3, "tasks": [{"k": 1}]})
    assert parse_line(event.to_json()) == event
    with pytest.raises(LogFormatError, match="event"):
        TuningRecord.from_json(event.to_json())


# -- appending --------------------------------------------------------------------------------------------------


def test_append_creates_parent_folders_and_writes_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "deep" / "dir" / "log.jsonl"
    writer = LogWriter(log, fsync=True)
    writer.write([sample_record(0), sample_record(1)])
    writer.write_one(LogEvent("session_end", "s1"))
    assert log.read_text().count("\n") == 3
    assert [r.trial for r in read_records(log)] == [0, 1]
    assert [e.event for e in read_events(log)] == ["session_end"]
    with pytest.raises(ValueError):
        append_lines(log, ["two\nlines"])


_APPENDER = textwrap.dedent("""
    import sys
    from relay_tune.tuning import LogWriter, TuningRecord
    from search_space import Config
    path, writer_id, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    writer = LogWriter(path)
    padding = "x" * 70000  # each line is far larger than PIPE_BUF and than one page
    for i in range(count):
        writer.write_one(TuningRecord("w%d" % writer_id, "llvm", Config({"i": i, "pad": padding}), (1e-3,),
                                      trial=i, session=str(writer_id)))
""")


def _python(code: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env)


def test_concurrent_appenders_never_interleave_or_lose_lines(tmp_path: Path) -> None:
    log = tmp_path / "shared.jsonl"
    writers, count = 4, 40
    processes = [_python(_APPENDER, str(log), str(w), str(count)) for w in range(writers)]
    assert all(p.wait(timeout=120) == 0 for p in processes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LogWarning)  # a single torn or interleaved line fails the test
        found = read_records(log)
    assert len(found) == writers * count
    for w in range(writers):
        trials = [r.trial for r in found if r.workload_key == f"w{w}"]
        assert trials == list(range(count))  # each writer's lines complete and in its own order


# -- torn and garbled lines -------------------------------------------------------------------------------------


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    LogWriter(log).write([sample_record(i) for i in range(3)])
    whole = sample_record(3).to_json()
    with open(log, "a") as handle:
        handle.write(whole[: len(whole) // 2])  # a writer killed mid-line
    with pytest.warns(LogWarning, match=r"log.jsonl:4"):
        found = read_records(log)
    assert [r.trial for r in found] == [0, 1, 2]
    with pytest.warns(LogWarning):
        frame = logs.load(log)
    assert len(frame) == 3


def test_append_after_a_torn_line_starts_a_fresh_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    LogWriter(log).write_one(sample_record(0))
    with open(log, "a") as handle:
        handle.write('{"v": 1, "workload_key": "torn')
    LogWriter(log).write_one(sample_record(1))
    with pytest.warns(LogWarning, match=":2:"):
        assert [r.trial for r in read_records(log)] == [0, 1]


def test_garbled_and_unknown_lines_in_the_middle_are_skipped(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    lines = [sample_record(0).to_json(), "# a comment", "", "not json at all",
             '{"v": 7, "workload_key": "future"}', sample_record(1).to_json()]
    log.write_text("\n".join(lines) + "\n")
    with pytest.warns(LogWarning) as caught:
        assert [r.trial for r in read_records(log)] == [0, 1]
    assert len(caught) == 1  # one warning per log, counting by reason
    assert "skipped 2 unreadable log lines (1 newer schema, 1 not JSON)" in str(caught[0].message)
    assert "log.jsonl:4" in str(caught[0].message)


def test_readers_accept_paths_file_objects_and_lines(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    LogWriter(log).write([sample_record(0), sample_record(1)])
    text = log.read_text()
    assert len(read_records(str(log))) == 2
    assert len(read_records(io.StringIO(text))) == 2
    assert len(read_records(io.BytesIO(text.encode()))) == 2
    assert len(read_records(text.splitlines())) == 2
    assert len(read_records([log, log])) == 4
    assert read_records([sample_record(0), LogEvent("x"), sample_record(1)]) == [sample_record(0), sample_record(1)]
    assert len(logs.load([sample_record(0), sample_record(1)])) == 2
    assert [n for n, _ in iter_log(log)] == [1, 2]


def test_log_tail_reads_only_complete_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    tail = LogTail(log)
    assert tail.read_new() == []
    LogWriter(log).write_one(sample_record(0))
    assert len(tail.read_new()) == 1
    line = sample_record(1).to_json()
    with open(log, "a") as handle:
        handle.write(line[:20])
    assert tail.read_new() == []  # an unfinished line waits for its newline
    with open(log, "a") as handle:
        handle.write(line[20:] + "\n")
    assert [r.trial for r in tail.read_new()] == [1]  # type: ignore[union-attr]


def test_pandas_read_json_reads_a_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    writer = LogWriter(log)
    writer.write_one(LogEvent("session_start", "s1", data={"seed": 0}))
    writer.write([sample_record(0), sample_record(1, cost=None, error=ErrorKind.TIMEOUT)])
    frame = pd.read_json(log, lines=True)
    assert len(frame) == 3
    measured = frame[frame["workload_key"].notna()]
    assert list(measured["error_kind"]) == ["OK", "TIMEOUT"]
    assert list(measured["error_no"]) == [0, 7]
