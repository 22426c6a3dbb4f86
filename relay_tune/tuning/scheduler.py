"""Task schedulers: how a global trial budget is shared between the tasks of a model.

The objective is the model's estimated latency, sum over tasks of weight x best cost. After a warm-up round for
every task, `GradientScheduler` (Ansor's and MetaSchedule's gradient-based strategy) gives the next round to the
task expected to cut that sum the most: weight x (alpha x recent improvement per round + (1 - alpha) x best cost /
rounds so far). Ties are broken by a seeded generator, so a run is reproducible given the same measurements.

Tasks stop for good when their best has not improved (by more than `min_improvement`, relative) for
`early_stopping` trials, after `max_consecutive_failures` failed trials in a row, when they reach
`max_trials_per_task`, or when the search has no unvisited config left. The driver owns `TaskProgress` and updates
it after every measurement; a resumed run rebuilds it from the log with `TaskProgress.from_records`.

`warmup_trials` sets the size of the warm-up round. A full round for every task spends `tasks x batch` trials
before the objective decides anything, many of them on tasks whose weight x time is a sliver of the model. With
`warmup_trials=1` the warm-up measures only each task's default schedule, and from then on every round goes where
weight x (improvement) is largest, so a task too small to matter gets rounds only once the big ones pay less.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from relay_tune.records.log_format import TuningRecord
from relay_tune.records.measure import MeasureResult


@dataclass
class TaskProgress:
    """What the scheduler knows about one task."""

    index: int
    weight: float
    trials: int = 0
    valid_trials: int = 0
    best_cost: float | None = None
    best_history: list[float | None] = field(default_factory=list)  # best cost after each round
    trials_since_improvement: int = 0
    consecutive_failures: int = 0
    stopped: str | None = None  # why the task stopped, None while it is live
    min_improvement: float = 0.01

    @property
    def rounds(self) -> int:
        return len(self.best_history)

    @property
    def live(self) -> bool:
        return self.stopped is None

    def observe(self, result: MeasureResult) -> None:
        self.trials += 1
        cost = result.cost
        if cost is None:
            self.consecutive_failures += 1
            self.trials_since_improvement += 1
            return
        self.valid_trials += 1
        self.consecutive_failures = 0
        if self.best_cost is None or cost < self.best_cost * (1.0 - self.min_improvement):
            self.trials_since_improvement = 0
        else:
            self.trials_since_improvement += 1
        if self.best_cost is None or cost < self.best_cost:
            self.best_cost = cost

    def end_round(self) -> None:
        self.best_history.append(self.best_cost)

    @classmethod
    def from_records(cls, index: int, weight: float, records: Iterable[TuningRecord], round_size: int,
                     min_improvement: float = 0.01) -> TaskProgress:
        """Replay a task's logged measurements, in log order, as rounds of `round_size`."""
        progress = cls(index=index, weight=weight, min_improvement=min_improvement)
        in_round = 0
        for record in records:
            progress.observe(record.measure_result())
            in_round += 1
            if in_round == round_size:
                progress.end_round()
                in_round = 0
        if in_round:
            progress.end_round()
        return progress


class TaskScheduler(ABC):
    """Picks the task that gets the next round of trials, and decides when a task is finished.

    Call order: `next_task(progress)` -> the driver measures a round of that task, updating its `TaskProgress` ->
    `stop_reason(that progress)` (the driver marks the task stopped when a reason is returned) -> `next_task` ...
    `next_task` returns None when no task is live.
    """

    def __init__(
        self,
        early_stopping: int | None = None,
        max_consecutive_failures: int = 64,
        max_trials_per_task: int | None = None,
        warmup_trials: int | None = None,
    ) -> None:
        if warmup_trials is not None and warmup_trials < 1:
            raise ValueError("warmup_trials must be at least 1 (or None: a full round)")
        self.early_stopping = early_stopping
        self.max_consecutive_failures = max_consecutive_failures
        self.max_trials_per_task = max_trials_per_task
        self.warmup_trials = warmup_trials

    def next_task(self, progress: Sequence[TaskProgress]) -> int | None:
        live = [p for p in progress if p.live]
        if not live:
            return None
        warming = [p for p in live if p.rounds == 0]
        if warming:
            # warm-up: every task gets one round before any comparison, in task order (the tasks' weights are
            # known before anything is measured, their times are not)
            return warming[0].index
        return self._pick(live)

    @abstractmethod
    def _pick(self, live: Sequence[TaskProgress]) -> int:
        """Choose among live tasks that all finished their warm-up round."""

    def stop_reason(self, progress: TaskProgress) -> str | None:
        if self.max_trials_per_task is not None and progress.trials >= self.max_trials_per_task:
            return f"reached the per-task limit of {self.max_trials_per_task} trials"
        if progress.consecutive_failures >= self.max_consecutive_failures:
            return f"{progress.consecutive_failures} consecutive failed trials"
        if self.early_stopping is not None and progress.best_cost is not None \
                and progress.trials_since_improvement >= self.early_stopping:
            return f"no improvement in the last {progress.trials_since_improvement} trials"
        return None

    def allowance(self, progress: TaskProgress) -> int | None:
        """The most trials the task's next round may have (None: no limit but the batch size): what is left of
        the per-task limit, and `warmup_trials` for the warm-up round."""
        limits = []
        if self.max_trials_per_task is not None:
            limits.append(max(0, self.max_trials_per_task - progress.trials))
        if self.warmup_trials is not None and progress.rounds == 0:
            limits.append(self.warmup_trials)
        return min(limits) if limits else None


class RoundRobinScheduler(TaskScheduler):
    """Every live task in turn (the fewest rounds first)."""

    def _pick(self, live: Sequence[TaskProgress]) -> int:
        return min(live, key=lambda p: (p.rounds, p.index)).index


class GradientScheduler(TaskScheduler):
    """Ansor-style gradient-based allocation (see the module docstring)."""

    def __init__(
        self,
        alpha: float = 0.2,
        window: int = 3,
        seed: int = 0,
        early_stopping: int | None = None,
        max_consecutive_failures: int = 64,
        max_trials_per_task: int | None = None,
        warmup_trials: int | None = None,
    ) -> None:
        super().__init__(early_stopping, max_consecutive_failures, max_trials_per_task, warmup_trials)
        self.alpha = alpha
        self.window = window
        self._rng = np.random.default_rng(seed)

    def score(self, progress: TaskProgress) -> float:
        """Expected reduction of the weighted latency sum from one more round of this task."""
        history = progress.best_history
        current = history[-1] if history else None
        if current is None:
            # No valid kernel yet: as urgent as it gets (the failure limit stops a hopeless task).
            return float("inf")
        backward = 0.0
        if len(history) > self.window:
            earlier = history[-1 - self.window]
            if earlier is not None:
                backward = (earlier - current) / self.window
        forward = current / len(history)
        return progress.weight * (self.alpha * backward + (1.0 - self.alpha) * forward)

    def _pick(self, live: Sequence[TaskProgress]) -> int:
        scores = np.array([self.score(p) for p in live])
        best = np.flatnonzero(scores == scores.max())
        return live[int(best[self._rng.integers(len(best))]) if len(best) > 1 else int(best[0])].index
