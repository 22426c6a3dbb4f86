"""Helpers shared by the benchmark scripts of experiments/: waiting for an idle process, writing result tables."""

from __future__ import annotations

import csv
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def settle(limit: float, window: float = 0.01, idle: float = 0.05) -> float:
    """Wait until the process's threads (`time.process_time` counts all of them, in nanoseconds, from the
    scheduler) stop using the CPUs (below `idle` of one core over `window` seconds), at most `limit` seconds; return
    the seconds waited. The spinning workers of the engine timed before (onnxruntime's, OpenBLAS's, libgomp's)
    would otherwise share the cores with the engine timed next."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        before, began = time.process_time(), time.perf_counter()
        time.sleep(window)
        if time.process_time() - before < idle * (time.perf_counter() - began):
            break
    return time.perf_counter() - start


def write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """`rows` as a CSV table at `path` (its folder made if need be; the columns are the first row's keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
