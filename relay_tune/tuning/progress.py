"""Progress and timing of a tuning run, as plain data handed to callbacks (the CLI renders progress with rich).

`tune` reports to one `ProgressCallback`: the caller's, fanned out with the run's own `PhaseTimes` (the seconds
its summary and its log's `session_end` line carry) through `Callbacks`. The loop times its phases with a
`PhaseTimer`, which reports each timed span to `on_phase`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TextIO

from relay_tune.records.measure import MeasureResult
from relay_tune.tuning.summary import TuneSummary
from search_space import Config


@dataclass(frozen=True)
class TaskInfo:
    index: int
    key: str
    description: str
    weight: int
    flops: float
    space_size: int


@dataclass(frozen=True)
class TunePlan:
    """Announced before tuning starts."""

    tasks: tuple[TaskInfo, ...]
    total_trials: int
    trials_already_done: int  # found in the log (a resumed run)
    batch_size: int
    log_path: str
    session: str


@dataclass(frozen=True)
class TrialEvent:
    """One measured candidate."""

    trials_done: int  # across the whole budget, including earlier sessions
    total_trials: int
    task_index: int
    task_description: str
    config: Config
    result: MeasureResult
    gflops: float | None  # of this candidate
    best_gflops: float | None  # of the task so far
    best_cost: float | None
    estimated_latency: float | None  # sum of weight x best cost over tasks that have a valid kernel
    tasks_without_kernel: int  # tasks whose cost is not yet in the estimate
    elapsed_seconds: float


class ProgressCallback:
    """Receives progress; every method is optional. Call order: on_start, (on_round, on_trial*)*,
    on_task_stopped and on_phase at any point, on_finish."""

    def on_start(self, plan: TunePlan) -> None:
        pass

    def on_round(self, task_index: int, candidates: int) -> None:
        pass

    def on_trial(self, event: TrialEvent) -> None:
        pass

    def on_task_stopped(self, task_index: int, reason: str) -> None:
        pass

    def on_phase(self, phase: str, seconds: float) -> None:
        """The loop spent `seconds` in `phase` ("search", "build", "run", "storage", "claim"; "total" once, at
        the end)."""

    def on_finish(self, summary: TuneSummary) -> None:
        pass


class Callbacks(ProgressCallback):
    """Hands every call on to each of `callbacks`, in order."""

    def __init__(self, callbacks: Sequence[ProgressCallback]) -> None:
        self.callbacks = tuple(callbacks)

    def on_start(self, plan: TunePlan) -> None:
        for callback in self.callbacks:
            callback.on_start(plan)

    def on_round(self, task_index: int, candidates: int) -> None:
        for callback in self.callbacks:
            callback.on_round(task_index, candidates)

    def on_trial(self, event: TrialEvent) -> None:
        for callback in self.callbacks:
            callback.on_trial(event)

    def on_task_stopped(self, task_index: int, reason: str) -> None:
        for callback in self.callbacks:
            callback.on_task_stopped(task_index, reason)

    def on_phase(self, phase: str, seconds: float) -> None:
        for callback in self.callbacks:
            callback.on_phase(phase, seconds)

    def on_finish(self, summary: TuneSummary) -> None:
        for callback in self.callbacks:
            callback.on_finish(summary)


class PhaseTimes(ProgressCallback):
    """Adds up the seconds of each phase; a run on a shared budget also counts its claim rounds ("rounds")."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls = Counter[str]()

    def on_phase(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
        self.calls[phase] += 1

    def as_dict(self) -> dict[str, float]:
        """Seconds by phase, and the number of claim rounds when there were any (`TuneSummary.seconds`)."""
        times = dict(self.seconds)
        if self.calls["claim"]:  # a count, not seconds; the log's session_end carries it here
            times["rounds"] = self.calls["claim"]
        return times


class PhaseTimer:
    """Times spans of a tuning loop and reports each to `callback.on_phase`, once per phase it counts towards."""

    def __init__(self, callback: ProgressCallback) -> None:
        self.callback = callback

    @contextlib.contextmanager
    def __call__(self, *phases: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            elapsed = time.monotonic() - started
            for phase in phases:
                self.callback.on_phase(phase, elapsed)


class RecordingProgress(ProgressCallback):
    """Keeps every callback as data (tests, notebooks)."""

    def __init__(self) -> None:
        self.plan: TunePlan | None = None
        self.rounds: list[tuple[int, int]] = []
        self.trials: list[TrialEvent] = []
        self.stopped: list[tuple[int, str]] = []
        self.phases: list[tuple[str, float]] = []
        self.summary: TuneSummary | None = None

    def on_start(self, plan: TunePlan) -> None:
        self.plan = plan

    def on_round(self, task_index: int, candidates: int) -> None:
        self.rounds.append((task_index, candidates))

    def on_trial(self, event: TrialEvent) -> None:
        self.trials.append(event)

    def on_task_stopped(self, task_index: int, reason: str) -> None:
        self.stopped.append((task_index, reason))

    def on_phase(self, phase: str, seconds: float) -> None:
        self.phases.append((phase, seconds))

    def on_finish(self, summary: TuneSummary) -> None:
        self.summary = summary


class PrintProgress(ProgressCallback):
    """One plain line per trial, in the familiar AutoTVM shape."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._tasks = 0

    def on_start(self, plan: TunePlan) -> None:
        self._tasks = len(plan.tasks)
        print(f"tuning {len(plan.tasks)} tasks, {plan.total_trials} trials in total "
              f"({plan.trials_already_done} already in {plan.log_path})", file=self.stream)

    def on_trial(self, event: TrialEvent) -> None:
        current = f"{event.gflops:.2f}" if event.gflops is not None else event.result.error_kind.name  # type: ignore[union-attr]
        best = f"{event.best_gflops:.2f}" if event.best_gflops is not None else "-"
        latency = f"{event.estimated_latency * 1e3:.3f} ms" if event.estimated_latency is not None else "-"
        print(f"[Task {event.task_index + 1}/{self._tasks}] Current/Best: {current}/{best} GFLOPS | "
              f"Progress: ({event.trials_done}/{event.total_trials}) | est. latency {latency} | "
              f"{event.elapsed_seconds:.1f} s", file=self.stream)

    def on_task_stopped(self, task_index: int, reason: str) -> None:
        print(f"[Task {task_index + 1}/{self._tasks}] stopped: {reason}", file=self.stream)
