"""The per-user tuning cache: every valid record any tuning run measured on this machine, in one JSON-lines file.

Like TVM's tophub, but local and filled by the user's own runs. The folder is `$RELAY_TUNE_CACHE`, else
`$XDG_CACHE_HOME/relay-tune`, else `~/.cache/relay-tune`; the records are `<folder>/records.jsonl`, in the tuning
log's own format (`pandas.read_json(path, lines=True)` or `relay_tune.logs.load` read it in one call).

- A tuning run appends its valid records when it ends (also when interrupted), with the log's atomic appends,
  so runs in parallel never tear each other's lines.
- A tuning run skips a task whose workload already has a valid record in the cache for the same target and CPU
  model, unless its own log already holds records of it (then the log's state decides, as without a cache: a
  larger budget continues) or the user asks to tune again (`retune`).
- A build (`relay-tune build`, the tuner's final build) also takes the fastest records of the cache for its
  target and CPU. Records of other targets or CPU models stay in the cache, unused, until pruned.

An unreadable line (a hand edit, a crash of an older writer) is skipped with one warning; it never stops a run.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from relay_tune.errors import RelayTuneError
from relay_tune.records.database import top_k
from relay_tune.records.log_format import LogWarning, TuningRecord, append_lines, host_cpu_name, iter_log

__all__ = [
    "CACHE_ENV",
    "CacheEntry",
    "TuningCache",
    "default_cache_dir",
    "fastest_per_workload",
    "records_since",
]

CACHE_ENV = "RELAY_TUNE_CACHE"
RECORDS_FILE = "records.jsonl"


def default_cache_dir() -> Path:
    """$RELAY_TUNE_CACHE, else $XDG_CACHE_HOME/relay-tune, else ~/.cache/relay-tune."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "relay-tune"


def _identity(record: TuningRecord) -> tuple[object, ...]:
    # The same measurement reaches the cache once per run that saw it appended (two runs on one log); one copy counts.
    return (record.workload_key, record.target, record.config_key, record.session, record.trial, record.timestamp)


def _same_cpu(record: TuningRecord, cpu: str | None) -> bool:
    return not cpu or not record.host_cpu or record.host_cpu in (cpu, "unknown")


def _unique_records(source: str | os.PathLike[str] | Sequence[str]) -> list[TuningRecord]:
    """The records of a log file or of its lines, each measurement once (see `_identity`)."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for _, entry in iter_log(source):
        if isinstance(entry, TuningRecord) and (ident := _identity(entry)) not in seen:
            seen.add(ident)
            out.append(entry)
    return out


def _by_workload(records: Iterable[TuningRecord]) -> dict[tuple[str, str, str], list[TuningRecord]]:
    """`records` grouped by (workload, target, CPU model): what one cache entry stands for."""
    groups: dict[tuple[str, str, str], list[TuningRecord]] = {}
    for record in records:
        groups.setdefault((record.workload_key, record.target, record.host_cpu), []).append(record)
    return groups


def fastest_per_workload(records: Sequence[TuningRecord], n: int) -> list[TuningRecord]:
    """The `n` fastest valid records of each (workload, target, CPU model) in `records` (the fastest measurement
    of each config, as `top_k`), in their order."""
    chosen = {id(r) for group in _by_workload(records).values() for r in top_k(group, n)}
    return [r for r in records if id(r) in chosen]


@dataclass(frozen=True)
class CacheEntry:
    """One (workload, target, CPU model) of the cache: what `relay-tune cache list` shows."""

    workload_key: str
    description: str
    target: str
    host_cpu: str
    records: int
    best_cost: float | None
    best_gflops: float | None
    last_timestamp: float


class TuningCache:
    """The cache folder `folder` (created on the first write)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).expanduser()
        self.path = self.folder / RECORDS_FILE

    @classmethod
    def default(cls) -> TuningCache:
        return cls(default_cache_dir())

    def __repr__(self) -> str:
        return f"TuningCache({os.fspath(self.folder)!r})"

    # -- reading -----------------------------------------------------------------------------------------------

    def records(self) -> list[TuningRecord]:
        """Every readable record, duplicates dropped (unreadable lines: one `LogWarning`)."""
        return _unique_records(self.path) if self.path.is_file() else []

    def usable(self, targets: Sequence[str], cpu: str | None = None) -> list[TuningRecord]:
        """The valid records a run for one of `targets` (the names one target goes by) on CPU `cpu` may use."""
        wanted = set(targets)
        cpu = host_cpu_name() if cpu is None else cpu
        return [r for r in self.records() if r.ok and r.target in wanted and _same_cpu(r, cpu)]

    def tuned_keys(self, targets: Sequence[str], cpu: str | None = None) -> set[str]:
        """Workload keys that have a valid record for these targets on this CPU model."""
        return {r.workload_key for r in self.usable(targets, cpu)}

    def entries(self) -> list[CacheEntry]:
        out = []
        for (key, target, cpu), records in _by_workload(self.records()).items():
            best = top_k(records, 1)
            out.append(CacheEntry(key, records[-1].description, target, cpu, len(records),
                                  best[0].cost if best else None, best[0].gflops if best else None,
                                  max(r.timestamp for r in records)))
        return sorted(out, key=lambda e: (e.target, e.description, e.workload_key))

    # -- writing -----------------------------------------------------------------------------------------------

    def add(self, records: Iterable[TuningRecord]) -> int:
        """Append the valid ones of `records` (errors teach a build nothing) that are not there yet. Returns how
        many were added."""
        valid = [r for r in records if r.ok]
        if valid and self.path.is_file():
            # a measurement already there (a second run that saw the same log lines) is not written twice; two
            # processes racing past this check can still both append it, which readers drop
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LogWarning)  # unreadable lines are reported when the cache is read
                known = {_identity(r) for r in self.records()}
            valid = [r for r in valid if _identity(r) not in known]
        if not valid:
            return 0
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RelayTuneError(f"cannot create the tuning cache folder {self.folder}: {err.strerror or err}") \
                from None
        append_lines(self.path, [r.to_json() for r in valid])
        return len(valid)

    def prune(self, *, keep_best: int | None = None, cpu: str | None = None,
              before: float | None = None) -> tuple[int, int]:
        """Drop records: keep only the `keep_best` fastest per (workload, target, CPU); with `cpu`, drop those of
        other CPU models; with `before` (a Unix time), drop those measured earlier. Returns (kept, dropped).

        The file is rewritten in place under the appenders' own lock, so a tuning run appending meanwhile waits
        and its lines land after the rewrite instead of being lost."""
        if not self.path.is_file():
            return 0, 0
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read()
            lines = data.decode("utf-8", errors="replace").splitlines()
            kept = [r for r in _unique_records(lines)
                    if r.ok and _same_cpu(r, cpu) and (before is None or r.timestamp >= before)]
            if keep_best is not None:
                kept = fastest_per_workload(kept, keep_best)
            payload = "".join(r.to_json() + "\n" for r in kept).encode("utf-8")
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)  # closing drops the lock
        return len(kept), len(lines) - len(kept)

    def export(self, output: str | os.PathLike[str], records: Sequence[TuningRecord]) -> int:
        out = Path(output)
        if out.resolve() == self.path.resolve():
            raise RelayTuneError(f"refusing to export the cache onto itself ({out})")
        append_lines(out, [r.to_json() for r in records])
        out.touch()
        return len(records)


def records_since(path: str | os.PathLike[str], offset: int) -> list[TuningRecord]:
    """The records of a log appended after byte `offset` (its size before a run): what that run measured (and
    what other processes appended to the same log meanwhile, which were measured on this machine too)."""
    path = Path(path)
    if not path.is_file():
        return []
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read()
    end = data.rfind(b"\n")
    lines = data[: end + 1].decode("utf-8", errors="replace").splitlines() if end >= 0 else []
    return [entry for _, entry in iter_log(lines) if isinstance(entry, TuningRecord)]


def parse_date(text: str) -> float:
    """A Unix time from "YYYY-MM-DD" (midnight UTC) or an ISO date-time; a user mistake otherwise."""
    try:
        moment = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise RelayTuneError(f"not a date: {text!r} (use YYYY-MM-DD)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.UTC)
    return moment.timestamp()
