"""A model's in-graph kernel times beside the times its tuning logs recorded for the same kernels.

    rows = compare_with_logs(model, ["logs/resnet50.jsonl"])
    for row in rows:
        print(row.profile.description, row.profile.per_call, row.logged, row.ratio)

The tuner times a kernel alone, back to back with itself; in the model the same kernel runs between others, with
other data in its caches. `CompiledModel.profile` measures the model's kernels where they run (timestamps taken by
the executor between calls), so the ratio in-graph / logged says how well the log predicts the model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from relay_tune.records.database import CurrentSpaces, JsonLinesDatabase
from relay_tune.runtime.model import CompiledModel, TaskProfile

__all__ = ["ProfileComparison", "compare_with_logs"]


@dataclass(frozen=True)
class ProfileComparison:
    profile: TaskProfile
    logged: float | None  # seconds per call of the log's best record for this task and target (None: no record)

    @property
    def ratio(self) -> float | None:
        """In-graph seconds per call / logged seconds (above 1: slower in the model than the tuner measured)."""
        return self.profile.per_call / self.logged if self.logged else None


def compare_with_logs(
    model: CompiledModel, logs: Sequence[str | os.PathLike[str]], repeat: int = 10, inputs: Any = None,
    tasks: Sequence[Any] = (),
) -> list[ProfileComparison]:
    """The model's profile (slowest task first), each task beside its best logged time on the model's target.

    The logged time is the fastest repeat of the fastest valid record, what the build would have picked; for a
    task built with its default schedule it is still shown (the best the tuner found, not what runs). `tasks`:
    the model's tuning tasks, when known; their records written under another schedule space (which the build
    passes over) are then left out here too."""
    database: Any = JsonLinesDatabase([os.fspath(p) for p in logs])
    if tasks:
        database = CurrentSpaces(database, tasks)
    names = list(dict.fromkeys((model.target.log_name, str(model.target))))
    rows: list[ProfileComparison] = []
    for row in model.profile(repeat=repeat, inputs=inputs):
        logged = None
        if row.key:
            for name in names:
                best = database.best(row.key, name, k=1)
                if best and best[0].cost is not None:
                    logged = float(best[0].cost)
                    break
        rows.append(ProfileComparison(row, logged))
    return rows
