"""Tuning logs as tables, and log maintenance (merge, distill).

`load` turns one or more logs into a tidy pandas DataFrame, one row per measured candidate, ready for the analysis
notebooks: costs and GFLOPS, error kinds, and each task's best-so-far curve. Unreadable lines are skipped with a
warning, never an error, so a log cut short by a crash still loads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from relay_tune.records.database import top_k
from relay_tune.records.log_format import (
    LogEvent,
    LogSource,
    TuningRecord,
    _as_sources,
    append_lines,
    iter_log,
)

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = [
    "workload_key", "description", "target", "host_cpu", "flops", "config", "config_key", "trial", "strategy",
    "costs", "mean_cost", "min_cost", "ok", "gflops", "error_kind", "error_no", "error_msg", "build_s", "run_s",
    "timestamp", "session", "timing", "relay_tune_version", "source", "line", "task_trial", "best_cost_so_far",
    "best_gflops_so_far",
]


def load(paths: LogSource | Sequence[LogSource]) -> pd.DataFrame:
    """One row per record of the given logs (a path, a file object, lines, or a list of those).

    Rows are in time order. Per (workload_key, target): `task_trial` numbers the measurements from 0 and
    `best_cost_so_far` / `best_gflops_so_far` trace the best valid result up to each row (NaN before the first).
    """
    # start-up: pandas takes ~0.3 s to import; only the DataFrame of a log needs it
    import pandas as pd

    rows = []
    for source in _as_sources(paths):
        name = os.fspath(source) if isinstance(source, str | os.PathLike) else getattr(source, "name", "<stream>")
        for lineno, entry in iter_log(source):
            if not isinstance(entry, TuningRecord):
                continue
            row = entry.to_dict()
            del row["v"]
            row["ok"] = entry.ok
            row["gflops"] = entry.gflops if entry.gflops is not None else np.nan
            row["source"] = str(name)
            row["line"] = lineno
            rows.append(row)
    if not rows:
        return pd.DataFrame({column: pd.Series(dtype=object) for column in COLUMNS})
    frame = pd.DataFrame(rows)
    frame["mean_cost"] = frame["mean_cost"].astype(float)
    frame["min_cost"] = frame["min_cost"].astype(float)
    frame = frame.sort_values(["timestamp", "source", "line"], kind="stable").reset_index(drop=True)
    groups = frame.groupby(["workload_key", "target"], sort=False)
    frame["task_trial"] = groups.cumcount()
    task = [frame["workload_key"], frame["target"]]
    valid_cost = frame["min_cost"].where(frame["ok"].astype(bool))
    # cummin leaves NaN on failed rows; carry the best so far across them.
    frame["best_cost_so_far"] = valid_cost.groupby(task).cummin().groupby(task).ffill()
    with np.errstate(divide="ignore"):
        frame["best_gflops_so_far"] = frame["flops"] / frame["best_cost_so_far"] / 1e9
    return frame[COLUMNS]


def _identity(record: TuningRecord) -> tuple[object, ...]:
    return (record.workload_key, record.target, record.config_key, record.session, record.trial, record.timestamp,
            record.costs, record.error_kind)


def _check_output(inputs: Sequence[LogSource], output: str | os.PathLike[str], overwrite: bool) -> Path:
    out = Path(output)
    for source in inputs:
        if isinstance(source, str | os.PathLike) and Path(source).resolve() == out.resolve():
            raise ValueError(f"refusing to write {out} in place: it is also an input")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose another output or pass overwrite=True")
    if out.exists():
        out.unlink()
    return out


def merge(inputs: Sequence[LogSource], output: str | os.PathLike[str], overwrite: bool = False) -> int:
    """Write every record and event of `inputs` to `output`, dropping exact duplicates. Returns the record count.

    Never writes in place: `output` must not be one of the inputs.
    """
    sources = _as_sources(inputs)
    out = _check_output(sources, output, overwrite)
    seen_records: set[tuple[object, ...]] = set()
    seen_events: set[str] = set()
    lines: list[str] = []
    written = 0
    for source in sources:
        for _, entry in iter_log(source):
            if isinstance(entry, LogEvent):
                line = entry.to_json()
                if line not in seen_events:
                    seen_events.add(line)
                    lines.append(line)
                continue
            identity = _identity(entry)
            if identity not in seen_records:
                seen_records.add(identity)
                lines.append(entry.to_json())
                written += 1
    append_lines(out, lines)
    out.touch()
    return written


def distill(inputs: Sequence[LogSource], output: str | os.PathLike[str], top: int = 1,
            overwrite: bool = False) -> int:
    """Keep only the `top` fastest valid records per (workload key, target). Returns the record count."""
    sources = _as_sources(inputs)
    out = _check_output(sources, output, overwrite)
    by_task: dict[tuple[str, str], list[TuningRecord]] = {}
    for source in sources:
        for _, entry in iter_log(source):
            if isinstance(entry, TuningRecord):
                by_task.setdefault((entry.workload_key, entry.target), []).append(entry)
    kept = [record for records in by_task.values() for record in top_k(records, top)]
    append_lines(out, [r.to_json() for r in kept])
    out.touch()
    return len(kept)
