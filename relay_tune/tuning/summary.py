"""What a tuning run did, per task and in total: the plain data `tune` returns and hands to `on_finish`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from relay_tune.records.log_format import TuningRecord
from relay_tune.tuning.scheduler import TaskProgress
from relay_tune.tuning.task import TuneTask
from search_space import Config


@dataclass(frozen=True)
class TaskSummary:
    key: str
    target: str
    description: str
    weight: int
    flops: float
    trials: int
    valid_trials: int
    errors: dict[str, int]
    best_cost: float | None
    best_config: Config | None
    default_cost: float | None
    stopped: str | None

    @property
    def best_gflops(self) -> float | None:
        if self.best_cost is None or self.best_cost <= 0 or self.flops <= 0:
            return None
        return self.flops / self.best_cost / 1e9

    @property
    def speedup_over_default(self) -> float | None:
        if self.best_cost is None or self.default_cost is None or self.best_cost <= 0:
            return None
        return self.default_cost / self.best_cost


@dataclass(frozen=True)
class TuneSummary:
    tasks: tuple[TaskSummary, ...]
    total_trials: int  # the budget
    trials_done: int  # records of these tasks in the log, all sessions
    trials_this_session: int
    interrupted: bool
    session: str
    log_path: str
    seconds: dict[str, float] = field(default_factory=dict)  # build / run / search / total

    @property
    def estimated_latency(self) -> float | None:
        """Sum of weight x best cost over tasks with a valid kernel (None when no task has one)."""
        parts = [t.weight * t.best_cost for t in self.tasks if t.best_cost is not None]
        return sum(parts) if parts else None

    @property
    def tasks_without_kernel(self) -> list[TaskSummary]:
        return [t for t in self.tasks if t.best_cost is None]


def summarise_task(task: TuneTask, state: TaskProgress, records: Sequence[TuningRecord],
                   default: Config) -> TaskSummary:
    """The summary of one task from its progress and its records in the database."""
    valid = [r for r in records if r.ok]
    best = min(valid, key=lambda r: r.cost or 0.0) if valid else None
    default_costs = [r.cost for r in valid if r.config == default and r.cost is not None]
    return TaskSummary(
        key=task.key, target=task.target, description=task.description, weight=task.weight, flops=task.flops,
        trials=len(records), valid_trials=len(valid),
        errors=dict(Counter(r.error_kind.name for r in records if r.error_kind is not None)),
        best_cost=best.cost if best else None, best_config=best.config if best else None,
        default_cost=min(default_costs) if default_costs else None, stopped=state.stopped)
