"""The `Database` of tuning records: what was measured, and the best config per (workload, target).

Queries are always by workload key *and* target string: a record measured for one target never answers for
another. Only successful records compete for "best"; errors, timeouts and wrong results never win. When several
logs are merged, the fastest valid record per (workload key, target) wins, whichever file it came from.
"""

from __future__ import annotations

import dataclasses
import os
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from relay_tune.records.log_format import (
    LogEntry,
    LogEvent,
    LogTail,
    LogWriter,
    TuningRecord,
    comparable_records,
    read_records,
)
from search_space import Config

TaskTarget = tuple[str, str]  # (workload key, target string)


class Database(ABC):
    """Stores tuning records.

    Call order: `commit` each record as soon as it is measured; `records`/`best` may be called at any time and see
    every committed record (for file-backed databases, also those appended by other processes).
    """

    @abstractmethod
    def commit(self, record: TuningRecord) -> bool | None:
        """Store one record (durably, for persistent databases). False: a shared database refused it (another
        worker recorded that config, or this worker's claim on it was given away)."""

    @abstractmethod
    def records(self, task_key: str, target: str) -> list[TuningRecord]:
        """Every record of this workload on this target, in commit order."""

    def best(self, task_key: str, target: str, k: int = 1) -> list[TuningRecord]:
        """The `k` fastest valid records (by fastest repeat, `TuningRecord.cost`), one per distinct config."""
        return top_k(self.records(task_key, target), k)

    def log_event(self, event: LogEvent) -> None:  # noqa: B027 - optional hook; databases without a log ignore it
        """Store a non-measurement event (session header, task stop reason). Optional."""

    def keys(self) -> list[TaskTarget]:
        """Every (workload key, target) that has records."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its workloads")


def top_k(records: Iterable[TuningRecord], k: int) -> list[TuningRecord]:
    """The `k` fastest valid records of one workload, keeping only the fastest measurement of each config.

    Times taken in different ways are not compared (`comparable_records`): where the records were timed in more
    than one way, only the records timed the way of the newest one compete."""
    valid = [record for record in comparable_records(records) if record.ok]
    fastest: dict[str, TuningRecord] = {}
    for record in valid:
        held = fastest.get(record.config_key)
        if held is None or _cost(record) < _cost(held):
            fastest[record.config_key] = record
    ranked = sorted(fastest.values(), key=lambda r: (_cost(r), r.timestamp))
    return ranked[:k]


def _cost(record: TuningRecord) -> float:
    cost = record.cost
    assert cost is not None
    return cost


class MemoryDatabase(Database):
    """Records held in memory only (tests, dry runs)."""

    def __init__(self, records: Iterable[TuningRecord] = ()) -> None:
        self._by_task: dict[TaskTarget, list[TuningRecord]] = defaultdict(list)
        self.events: list[LogEvent] = []
        for record in records:
            self.commit(record)

    def commit(self, record: TuningRecord) -> None:
        self._by_task[(record.workload_key, record.target)].append(record)

    def records(self, task_key: str, target: str) -> list[TuningRecord]:
        return list(self._by_task.get((task_key, target), ()))

    def log_event(self, event: LogEvent) -> None:
        self.events.append(event)

    def keys(self) -> list[TaskTarget]:
        return [key for key, records in self._by_task.items() if records]


def current_config(task: Any, config: Config) -> Config | None:
    """`config` as a point of `task`'s current schedule space, or None when it belongs to another space: the task's
    own `logged_config(config)` when it has one (e.g. filling knobs added since), else `config` if
    `task.space.is_valid(config)`."""
    reader = getattr(task, "logged_config", None)
    if reader is not None:
        return reader(config)
    return config if task.space.is_valid(config) else None


class CurrentSpaces(Database):
    """A view of `database` in which each task's records are only those whose config is a point of the task's
    current schedule space (`tasks`: `TuneTask`s by key and target), as the task would decode them.

    A log written under another space (another version, or an operator whose compute changed) keeps its lines, but
    they neither count against a run's budget nor warm its search: the task is tuned anew. A task may say how it
    reads an old config (`current_config`). Records of workloads that are not among `tasks` pass
    unchanged. Writes and events go to `database`.
    """

    def __init__(self, database: Database, tasks: Iterable[Any]) -> None:
        self.inner = database
        self._tasks = {(t.key, t.target): t for t in tasks}
        self._decoded: dict[tuple[str, str, str], Config | None] = {}

    def _current(self, task: Any, record: TuningRecord) -> TuningRecord | None:
        memo = (task.key, task.target, record.config_key)
        if memo not in self._decoded:
            self._decoded[memo] = current_config(task, record.config)
        config = self._decoded[memo]
        if config is None:
            return None
        return record if config == record.config else dataclasses.replace(record, config=config)

    def records(self, task_key: str, target: str) -> list[TuningRecord]:
        found = self.inner.records(task_key, target)
        task = self._tasks.get((task_key, target))
        if task is None:
            return found
        return [r for r in (self._current(task, record) for record in found) if r is not None]

    def commit(self, record: TuningRecord) -> bool | None:
        return self.inner.commit(record)

    def log_event(self, event: LogEvent) -> None:
        self.inner.log_event(event)

    def keys(self) -> list[TaskTarget]:
        return self.inner.keys()


class JsonLinesDatabase(Database):
    """Records in one or more JSON-lines logs.

    `paths`: the logs to read (merged). New records are appended to `write_path` (default: the first path).
    Queries first pick up lines appended since the last query, by this or any other process.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        write_path: str | os.PathLike[str] | None = None,
        fsync: bool = False,
    ) -> None:
        path_list = [Path(paths)] if isinstance(paths, str | os.PathLike) else [Path(p) for p in paths]
        if write_path is None:
            if not path_list:
                raise ValueError("JsonLinesDatabase needs at least one log path")
            write_path = path_list[0]
        self.write_path = Path(write_path)
        if self.write_path not in path_list:
            path_list.append(self.write_path)
        self.paths = path_list
        self._writer = LogWriter(self.write_path, fsync=fsync)
        self._tails = [LogTail(p) for p in self.paths]
        self._memory = MemoryDatabase()
        self.refresh()

    def refresh(self) -> None:
        """Read lines appended to any of the logs since the last refresh."""
        for tail in self._tails:
            for entry in tail.read_new():
                self._ingest(entry)

    def _ingest(self, entry: LogEntry) -> None:
        if isinstance(entry, TuningRecord):
            self._memory.commit(entry)
        else:
            self._memory.log_event(entry)

    def commit(self, record: TuningRecord) -> None:
        # The record enters the in-memory index through `refresh`, like everybody else's lines, so nothing is
        # counted twice.
        self._writer.write_one(record)
        self.refresh()

    def log_event(self, event: LogEvent) -> None:
        self._writer.write_one(event)
        self.refresh()

    def records(self, task_key: str, target: str) -> list[TuningRecord]:
        self.refresh()
        return self._memory.records(task_key, target)

    def keys(self) -> list[TaskTarget]:
        self.refresh()
        return self._memory.keys()

    @property
    def events(self) -> list[LogEvent]:
        self.refresh()
        return list(self._memory.events)


def apply_best(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], target: str | None = None
) -> dict[TaskTarget, Config]:
    """The best config per (workload key, target) across the given logs, for building a model.

    Workloads that have no valid record are absent (the build falls back to the default schedule and says so).
    `target` restricts the result to one target string.
    """
    database = JsonLinesDatabase(paths) if isinstance(paths, str | os.PathLike) or paths else None
    if database is None:
        return {}
    chosen: dict[TaskTarget, Config] = {}
    for key, record_target in database.keys():
        if target is not None and record_target != target:
            continue
        best = database.best(key, record_target, 1)
        if best:
            chosen[(key, record_target)] = best[0].config
    return chosen


def best_for_target(
    paths: Sequence[str | os.PathLike[str]], targets: Sequence[str], cpu: str | None = None, k: int = 1
) -> tuple[dict[str, list[Config]], str | None]:
    """The `k` best configs per workload key (fastest first, distinct configs) among the records of the logs that a
    build for `targets` (the names one target goes by) may use, and one sentence on the records it left out (None
    when it left none out). A build takes the first config that is a point of the task's current space.

    A record is left out when it is for another target, or when it was measured on a CPU other than `cpu`, the
    one being built for (its timings say nothing about this CPU). Unreadable lines are counted by the reader's
    own single warning per log.
    """
    wanted = set(targets)
    other_targets: dict[str, int] = {}
    other_hosts: dict[str, int] = {}
    usable: dict[str, list[TuningRecord]] = {}
    for record in read_records(list(paths)):
        if record.target not in wanted:
            other_targets[record.target] = other_targets.get(record.target, 0) + 1
        elif cpu and record.host_cpu and record.host_cpu not in (cpu, "unknown"):
            other_hosts[record.host_cpu] = other_hosts.get(record.host_cpu, 0) + 1
        else:
            usable.setdefault(record.workload_key, []).append(record)
    chosen = {key: [r.config for r in best] for key, records in usable.items() if (best := top_k(records, k))}
    parts = []
    if other_targets:
        names = sorted(other_targets, key=lambda t: -other_targets[t])
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        parts.append(f"{sum(other_targets.values())} of other targets ({shown})")
    if other_hosts:
        parts.append(f"{sum(other_hosts.values())} measured on other CPUs ({', '.join(sorted(other_hosts))})")
    if not parts:
        return chosen, None
    return chosen, f"tuning logs: skipped {' and '.join(parts)}; building for {targets[0]}"
