"""Tuning records and the JSON-lines log.

One measured candidate is one `TuningRecord`, which is exactly one JSON line (`to_json`/`from_json` are inverse).
Every line carries the schema version `"v"`, so old logs stay readable after the format grows. Besides records,
a log holds a few `LogEvent` lines (`"event"` key): a session header with seed, sampler and versions, task stop
reasons, and a session end marker, so a reader can tell a finished run from an interrupted one.

Appending is safe with several writer processes: each append opens the file with O_APPEND, takes an exclusive
`flock`, writes all its lines with one `os.write`, optionally fsyncs, and unlocks. A writer killed in the middle
of a line leaves a fragment without a newline; the next writer terminates that fragment first, so only the torn
line is lost and readers skip it with a warning.

The log is plain JSON (never pickle); `pandas.read_json(path, lines=True)` reads it too.
"""

from __future__ import annotations

import fcntl
import functools
import io
import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeAlias

import llvmlite.binding as llvm

from relay_tune.errors import RelayTuneError
from relay_tune.records.measure import OK_NUMBER, ErrorKind, MeasureResult, error_from_name, error_name
from relay_tune.resources import ResourceError
from relay_tune.version import __version__
from search_space import Config

SCHEMA_VERSION = 1


def _package_version() -> str:
    return __version__


class LogFormatError(RelayTuneError):
    """A log line that is not a valid record or event of a known schema version.

    `reason` sorts skipped lines for the one warning a reader gives: "not JSON" (a line torn by a kill, or
    garbage), "newer schema" (written by a later relay-tune), "invalid" (JSON, but not a record or event)."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class SkippedLines:
    """Counts the unreadable lines of one log by reason, for a single warning at the end of a read."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.by_reason: dict[str, int] = {}
        self.first: str = ""

    def add(self, lineno: int, err: LogFormatError) -> None:
        self.by_reason[err.reason] = self.by_reason.get(err.reason, 0) + 1
        if not self.first:
            self.first = f"{self.name}:{lineno}: {err}"

    def warn(self, stacklevel: int = 3) -> None:
        total = sum(self.by_reason.values())
        if total:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.by_reason.items()))
            warnings.warn(f"{self.name}: skipped {total} unreadable log line{'s' if total > 1 else ''} ({reasons}); "
                          f"first: {self.first}", LogWarning, stacklevel=stacklevel)


class LogWarning(UserWarning):
    """A log line was skipped while reading (torn by a crash, hand-edited, or from an unknown schema)."""


@functools.cache
def host_cpu_name() -> str:
    """The CPU model LLVM sees on this machine (e.g. "znver4"); part of every record."""
    try:
        return str(llvm.get_host_cpu_name())
    except Exception:  # a record without the CPU name is better than no record
        return "unknown"


@dataclass(frozen=True)
class TuningRecord:
    """One measured candidate, as stored in the log. `costs` is empty exactly when `error_kind` is set."""

    workload_key: str
    target: str
    config: Config
    costs: tuple[float, ...]
    error_kind: ErrorKind | None = None
    error_msg: str = ""
    description: str = ""
    flops: float = 0.0
    host_cpu: str = ""
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    timestamp: float = 0.0
    trial: int = -1
    strategy: str = ""
    session: str = ""
    # How the runner timed the kernel (`Runner.timing_kind`): "in_context" after a producer step, "back_to_back",
    # "cuda_events"; "" in records written before runners said. Times of different kinds are not compared.
    timing: str = ""
    version: str = field(default_factory=_package_version)
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "costs", tuple(float(c) for c in self.costs))
        if (not self.costs) != (self.error_kind is not None):
            raise ValueError("a record has costs exactly when it has no error kind")
        if not all(math.isfinite(c) and c >= 0 for c in self.costs):
            raise ValueError(f"costs must be finite non-negative seconds: {self.costs!r}")
        for name in ("flops", "build_seconds", "run_seconds", "timestamp"):
            value = float(getattr(self, name))
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
            object.__setattr__(self, name, value)

    # -- derived values ------------------------------------------------------------------------------------------

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def config_key(self) -> str:
        return self.config.key

    @property
    def cost(self) -> float | None:
        """The cost that ranks configs: the fastest repeat.

        Interference from other processes only ever slows a kernel down, so on a shared machine the
        fastest repeat is the cleanest estimate of the kernel's own speed (the mean follows the noise).
        """
        return self.min_cost

    @property
    def mean_cost(self) -> float | None:
        return sum(self.costs) / len(self.costs) if self.costs else None

    @property
    def min_cost(self) -> float | None:
        return min(self.costs) if self.costs else None

    @property
    def gflops(self) -> float | None:
        cost = self.cost
        if cost is None or cost <= 0 or self.flops <= 0:
            return None
        return self.flops / cost / 1e9

    @property
    def error_number(self) -> int:
        return OK_NUMBER if self.error_kind is None else self.error_kind.number

    def measure_result(self) -> MeasureResult:
        return MeasureResult(
            self.costs or None, self.error_kind, self.error_msg, self.build_seconds, self.run_seconds, self.timestamp
        )

    @classmethod
    def from_measurement(
        cls,
        task_key: str,
        target: str,
        config: Config,
        result: MeasureResult,
        *,
        description: str = "",
        flops: float = 0.0,
        trial: int = -1,
        strategy: str = "",
        session: str = "",
        timing: str = "",
    ) -> TuningRecord:
        return cls(
            workload_key=task_key,
            target=target,
            config=config,
            costs=result.costs or (),
            error_kind=result.error_kind,
            error_msg=result.error_msg,
            description=description,
            flops=flops,
            host_cpu=host_cpu_name(),
            build_seconds=result.build_seconds,
            run_seconds=result.run_seconds,
            timestamp=result.timestamp,
            trial=trial,
            strategy=strategy,
            session=session,
            timing=timing,
        )

    # -- JSON ----------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": self.schema,
            "workload_key": self.workload_key,
            "description": self.description,
            "target": self.target,
            "host_cpu": self.host_cpu,
            "flops": self.flops,
            "config": self.config.to_dict(),
            "config_key": self.config.key,
            "trial": self.trial,
            "strategy": self.strategy,
            "costs": list(self.costs),
            "mean_cost": self.mean_cost,
            "min_cost": self.min_cost,
            "error_kind": error_name(self.error_kind),
            "error_no": self.error_number,
            "error_msg": self.error_msg,
            "build_s": self.build_seconds,
            "run_s": self.run_seconds,
            "timestamp": self.timestamp,
            "session": self.session,
            "timing": self.timing,
            "relay_tune_version": self.version,
        }

    def to_json(self) -> str:
        """One line of JSON, no trailing newline."""
        return json.dumps(self.to_dict(), allow_nan=False, separators=(", ", ": "))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuningRecord:
        _check_schema(data)
        try:
            config = Config.from_dict(data["config"])
            if "config_key" in data and data["config_key"] != config.key:
                raise LogFormatError(f"config_key {data['config_key']!r} does not match its config {config!r}")
            kind = error_from_name(data.get("error_kind", "OK"))
            return cls(
                workload_key=str(data["workload_key"]),
                target=str(data["target"]),
                config=config,
                costs=tuple(data.get("costs") or ()),
                error_kind=kind,
                error_msg=str(data.get("error_msg", "")),
                description=str(data.get("description", "")),
                flops=float(data.get("flops", 0.0)),
                host_cpu=str(data.get("host_cpu", "")),
                build_seconds=float(data.get("build_s", 0.0)),
                run_seconds=float(data.get("run_s", 0.0)),
                timestamp=float(data.get("timestamp", 0.0)),
                trial=int(data.get("trial", -1)),
                strategy=str(data.get("strategy", "")),
                session=str(data.get("session", "")),
                timing=str(data.get("timing", "")),
                version=str(data.get("relay_tune_version", "")),
                schema=int(data["v"]),
            )
        except LogFormatError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError, RecursionError, RelayTuneError) as err:
            raise LogFormatError(f"not a valid tuning record: {err}") from err

    @classmethod
    def from_json(cls, line: str) -> TuningRecord:
        entry = parse_line(line)
        if not isinstance(entry, TuningRecord):
            raise LogFormatError(f"expected a tuning record, found a {entry.event!r} event")
        return entry


def comparable_records(records: Iterable[TuningRecord]) -> list[TuningRecord]:
    """The records of one workload whose times may be compared: where successful records were timed in more than one
    way (`TuningRecord.timing`; e.g. a log from before the runner timed kernels in their model context, topped up
    after), only the successful records timed the way of the newest one, and every failure (a config that fails is
    bad however it was timed). A back-to-back time of a memory-bound kernel can be 3x shorter than its time in
    context, so ranking, searching or training on both kinds would favour configs by the way they were measured.
    """
    records = list(records)
    kinds = {record.timing for record in records if record.ok}
    if len(kinds) <= 1:
        return records
    newest = max((record for record in records if record.ok), key=lambda record: record.timestamp).timing
    return [record for record in records if not record.ok or record.timing == newest]


@dataclass(frozen=True)
class LogEvent:
    """A non-measurement line: "session_start", "task_stopped", "session_end", ..."""

    event: str
    session: str = ""
    timestamp: float = field(default_factory=time.time)
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        payload = {"v": SCHEMA_VERSION, "event": self.event, "session": self.session, "timestamp": self.timestamp,
                   "data": self.data}
        return json.dumps(payload, allow_nan=False, separators=(", ", ": "), default=str)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LogEvent:
        _check_schema(data)
        return cls(str(data["event"]), str(data.get("session", "")), float(data.get("timestamp", 0.0)),
                   dict(data.get("data") or {}))


LogEntry: TypeAlias = TuningRecord | LogEvent


def _check_schema(data: Mapping[str, Any]) -> None:
    version = data.get("v")
    if version != SCHEMA_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        raise LogFormatError(f"unsupported log schema version {version!r} (this relay-tune reads v{SCHEMA_VERSION})",
                             "newer schema" if newer else "invalid")


def parse_line(line: str) -> LogEntry:
    """Parse one log line into a record or an event; raise `LogFormatError` for anything else."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        raise LogFormatError(f"not JSON ({err.msg} at column {err.colno})", "not JSON") from err
    except RecursionError as err:  # "[[[[...": nesting deeper than the parser's stack
        raise LogFormatError("not a log line (JSON nested too deeply)", "not JSON") from err
    if not isinstance(data, dict):
        raise LogFormatError("a log line must be a JSON object")
    if "event" in data:
        try:
            return LogEvent.from_dict(data)
        except LogFormatError:
            raise
        except (TypeError, ValueError, OverflowError) as err:
            raise LogFormatError(f"not a valid log event: {err}") from err
    return TuningRecord.from_dict(data)


# ---------------------------------------------------------------------------------------------------------------
# Appending
# ---------------------------------------------------------------------------------------------------------------


def append_lines(path: str | os.PathLike[str], lines: Sequence[str], fsync: bool = False) -> None:
    """Append whole lines to `path` atomically with respect to other appenders (see the module docstring)."""
    if not lines:
        return
    if any("\n" in line for line in lines):
        raise ValueError("log lines must not contain newlines")
    try:
        _append_payload(path, "".join(line + "\n" for line in lines).encode("utf-8"), fsync)
    except OSError as err:  # a full disk, a folder made read-only: one message naming the log, not a traceback

        raise ResourceError(f"cannot append to the tuning log {os.fspath(path)}: {err.strerror or err}") from None


def _append_payload(path: str | os.PathLike[str], payload: bytes, fsync: bool) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
                payload = b"\n" + payload  # end a fragment left by a writer that died mid-line
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if fsync:
                os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class LogWriter:
    """Appends records and events to one log file."""

    def __init__(self, path: str | os.PathLike[str], fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync

    def write(self, entries: Iterable[LogEntry]) -> None:
        append_lines(self.path, [e.to_json() for e in entries], fsync=self.fsync)

    def write_one(self, entry: LogEntry) -> None:
        self.write([entry])


# ---------------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------------

LogSource: TypeAlias = "str | os.PathLike[str] | IO[str] | IO[bytes] | Iterable[str] | Iterable[LogEntry]"


def _read_locked(path: Path, offset: int = 0) -> bytes:
    """Read from `offset` to the end under a shared lock, so no appender is half-way through a write."""
    with open(path, "rb") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        try:
            handle.seek(offset)
            return handle.read()
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _lines_of(source: LogSource) -> tuple[str, Iterator[str | LogEntry]]:
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        text = _read_locked(path).decode("utf-8", errors="replace")
        return str(path), iter(text.splitlines())
    if isinstance(source, io.IOBase) or hasattr(source, "read"):
        content = source.read()
        if isinstance(content, bytes):
            content = content.decode("utf-8", errors="replace")
        return getattr(source, "name", "<stream>"), iter(content.splitlines())
    return "<lines>", (item if isinstance(item, TuningRecord | LogEvent) else item.rstrip("\n")
                       for item in source)


def iter_log(source: LogSource) -> Iterator[tuple[int, LogEntry]]:
    """Yield (line number, record or event) for each readable line (or each record of an in-memory iterable).

    Blank lines and `#` comments are ignored; unreadable lines (torn by a crash, garbled, a newer schema) are
    skipped, never an exception, and counted by reason in one `LogWarning` per source that names the first.
    """
    name, lines = _lines_of(source)
    skipped = SkippedLines(name)
    try:
        for lineno, raw in enumerate(lines, start=1):
            if isinstance(raw, TuningRecord | LogEvent):
                yield lineno, raw  # an in-memory record: nothing to parse
                continue
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entry = parse_line(line)
            except LogFormatError as err:
                skipped.add(lineno, err)
                continue
            yield lineno, entry
    finally:
        skipped.warn()


def read_records(sources: LogSource | Sequence[LogSource]) -> list[TuningRecord]:
    """All tuning records of one or more logs, in file order (events left out)."""
    return [e for source in _as_sources(sources) for _, e in iter_log(source) if isinstance(e, TuningRecord)]


def read_events(sources: LogSource | Sequence[LogSource]) -> list[LogEvent]:
    return [e for source in _as_sources(sources) for _, e in iter_log(source) if isinstance(e, LogEvent)]


def expand_log_paths(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Log files named by paths, folders (their `*.jsonl`) and glob patterns the shell did not expand."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    out: list[Path] = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            out += sorted(path.glob("*.jsonl"))
        elif not path.exists() and any(ch in str(item) for ch in "*?["):
            pattern = str(path.relative_to(path.anchor)) if path.anchor else str(path)
            matches = sorted(Path(path.anchor or ".").glob(pattern))
            if not matches:
                raise FileNotFoundError(f"no tuning log matches {os.fspath(item)}")
            out += matches
        else:
            out.append(path)
    return out


def _as_sources(sources: LogSource | Sequence[LogSource]) -> list[LogSource]:
    if hasattr(sources, "read"):
        return [sources]  # type: ignore[list-item]
    if isinstance(sources, str | os.PathLike):
        return list(expand_log_paths(sources))
    items: list[Any] = list(sources)
    if items and all(isinstance(item, TuningRecord | LogEvent)
                     or (isinstance(item, str) and (item.lstrip().startswith("{") or not item.strip()))
                     for item in items):
        return [items]  # one source made of JSON lines or records, not a list of paths
    return [path for item in items
            for path in (expand_log_paths(item) if isinstance(item, str | os.PathLike) else [item])]


class LogTail:
    """Incrementally reads new complete lines of a log that other processes may be appending to."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offset = 0
        self._lineno = 0

    def read_new(self) -> list[LogEntry]:
        if not self.path.exists():
            return []
        data = _read_locked(self.path, self._offset)
        end = data.rfind(b"\n")
        if end < 0:
            return []  # only an incomplete line so far: wait for its newline
        chunk = data[: end + 1]
        self._offset += len(chunk)
        entries: list[LogEntry] = []
        skipped = SkippedLines(str(self.path))
        for raw in chunk.decode("utf-8", errors="replace").splitlines():
            self._lineno += 1
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entries.append(parse_line(line))
            except LogFormatError as err:
                skipped.add(self._lineno, err)
        skipped.warn()
        return entries
