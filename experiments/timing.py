"""The one way every benchmark of experiments/ times things: interleaved, warmed, repeated; medians and spread.

Engines (compiled models, kernels, numpy, onnxruntime, OpenVINO, ...) are timed in rounds, every engine once per
round in the same order, so a slow spell of a shared host falls on all of them alike; within a round each engine
warms up (untimed calls) and is then timed `repeat` times, each timing the mean of `number` calls. The rounds are
the library's `interleaved_samples` (what `relay-tune build --log` compares builds with); this module adapts plain
callables to it and summarises the samples.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from relay_tune.compile.build_cache import wait_for_stores
from relay_tune.runtime.benchmark import interleaved_samples


class Benchmarkable(Protocol):
    """What `interleaved_samples` times: `CompiledModel` and anything with the same `benchmark` method."""

    def benchmark(self, repeat: int = ..., inputs: Any = ...) -> Any: ...


@dataclass(frozen=True)
class Samples:
    """Seconds per call of every timed sample of one engine."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median (0.05: the middle half of the samples lie within 5%)."""
        if len(self.seconds) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.seconds, n=4, method="inclusive")
        return (q3 - q1) / self.median if self.median > 0 else 0.0

    def describe(self, unit: float = 1e-3, label: str = "ms") -> str:
        """`12.345 ms ±2.1%`: the median and the spread."""
        return f"{self.median / unit:.3f} {label} ±{100 * self.spread / 2:.1f}%"


class TimedCallable:
    """A callable with `CompiledModel.benchmark`'s interface: `warmup` calls, then `repeat` samples, each the mean
    of `number` calls. `before` runs first, untimed (e.g. waiting for another engine's spinning threads). The
    warm-up calls are timed apart: `first` holds, per turn, the seconds of the turn's first call (the call after
    the other engines' turns). With `gap_s`, the process sleeps that long before every sample (a stream of calls
    spaced apart, as a wake-word model called every 80 ms is: each sample is a call after an idle gap)."""

    def __init__(self, call: Callable[[], object], number: int = 1, warmup: int = 1,
                 before: Callable[[], object] | None = None, gap_s: float = 0.0) -> None:
        self.call, self.number, self.warmup, self.before, self.gap_s = call, number, warmup, before, gap_s
        self.first: list[float] = []

    def benchmark(self, repeat: int = 3, inputs: Any = None) -> list[float]:
        if self.before is not None:
            self.before()
        call, number, gap = self.call, self.number, self.gap_s
        clock = time.perf_counter
        for index in range(self.warmup):
            start = clock()
            call()
            if index == 0:
                self.first.append(clock() - start)
        samples = []
        for _ in range(repeat):
            if gap > 0:
                time.sleep(gap)
            start = clock()
            for _ in range(number):
                call()
            samples.append((clock() - start) / number)
        return samples


def interleaved(engines: Mapping[str, Callable[[], object] | Benchmarkable], rounds: int = 5, repeat: int = 3,
                inputs: Mapping[str, Any] | None = None, settle_s: float = 0.0, gap_s: float = 0.0,
                first: dict[str, Samples] | None = None) -> dict[str, Samples]:
    """Per engine name, its samples over `rounds` interleaved rounds. An engine is a plain callable (one call is
    one sample) or has a `benchmark(repeat, inputs)` method (a `CompiledModel`, timed on `inputs`). With
    `settle_s`, every engine waits before its turn until the process is idle (`settle`), at most that long. With
    `gap_s` (plain callables only), every sample is one call after the process slept that long (`TimedCallable`).
    `first`, when given, receives per plain-callable engine the times of each turn's first call."""
    if rounds < 1 or repeat < 1:
        raise ValueError("timing needs at least one round and one repeat")
    if gap_s > 0 and any(hasattr(e, "benchmark") for e in engines.values()):
        raise ValueError("an idle gap before every call needs engines that are plain callables")
    wait = (lambda: settle(settle_s)) if settle_s > 0 else None
    timed = [TimedCallable(e, before=wait, gap_s=gap_s) if not hasattr(e, "benchmark") else
             (_Settled(e, wait) if wait else e) for e in engines.values()]
    wait_for_stores()  # build-cache entries still being written would share the cores with the timed calls
    samples = interleaved_samples(timed, inputs, rounds=rounds, repeat=repeat)
    if first is not None:
        first.update({name: Samples(tuple(t.first)) for name, t in zip(engines, timed)
                      if isinstance(t, TimedCallable) and t.first})
    return {name: Samples(tuple(s)) for name, s in zip(engines, samples)}


class _Settled:
    """A benchmarkable engine that waits for an idle process before each turn."""

    def __init__(self, engine: Benchmarkable, wait: Callable[[], object]) -> None:
        self.engine, self.wait = engine, wait

    def benchmark(self, repeat: int = 3, inputs: Any = None) -> Any:
        self.wait()
        return self.engine.benchmark(repeat=repeat, inputs=inputs)


def settle(limit: float, window: float = 0.01, idle: float = 0.05) -> float:
    """Wait until the process's threads stop using the CPUs (below `idle` of one core over `window` seconds; the
    process CPU clock counts every thread), at most `limit` seconds; return the seconds waited. The spinning
    workers of the engine timed before (onnxruntime's, OpenBLAS's, libgomp's) would otherwise share the cores with
    the engine timed next."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        before, began = time.process_time(), time.perf_counter()
        time.sleep(window)
        if time.process_time() - before < idle * (time.perf_counter() - began):
            break
    return time.perf_counter() - start


def write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """`rows` as a CSV table at `path` (its folder made if need be; the columns are the first row's keys)."""
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")
