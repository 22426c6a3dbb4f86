"""Progress reporting for a tuning run, as plain data handed to a callback (the CLI renders it with rich)."""

from __future__ import annotations

import sys
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
    on_task_stopped at any point, on_finish."""

    def on_start(self, plan: TunePlan) -> None:
        pass

    def on_round(self, task_index: int, candidates: int) -> None:
        pass

    def on_trial(self, event: TrialEvent) -> None:
        pass

    def on_task_stopped(self, task_index: int, reason: str) -> None:
        pass

    def on_finish(self, summary: TuneSummary) -> None:
        pass


class RecordingProgress(ProgressCallback):
    """Keeps every callback as data (tests, notebooks)."""

    def __init__(self) -> None:
        self.plan: TunePlan | None = None
        self.rounds: list[tuple[int, int]] = []
        self.trials: list[TrialEvent] = []
        self.stopped: list[tuple[int, str]] = []
        self.summary: TuneSummary | None = None

    def on_start(self, plan: TunePlan) -> None:
        self.plan = plan

    def on_round(self, task_index: int, candidates: int) -> None:
        self.rounds.append((task_index, candidates))

    def on_trial(self, event: TrialEvent) -> None:
        self.trials.append(event)

    def on_task_stopped(self, task_index: int, reason: str) -> None:
        self.stopped.append((task_index, reason))

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
