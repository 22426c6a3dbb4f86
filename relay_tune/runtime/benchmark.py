"""Timing compiled models against each other in interleaved rounds, so every model sees the same machine load."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relay_tune.runtime.model import CompiledModel


def interleaved_latency(models: Sequence[Any], inputs: Mapping[str, Any] | None = None, rounds: int = 5,
                        repeat: int = 3) -> list[float]:
    """Per model, median seconds per inference over interleaved rounds of `benchmark` (`interleaved_samples`)."""
    return [statistics.median(s) for s in interleaved_samples(models, inputs, rounds, repeat)]


def interleaved_samples(models: Sequence[Any], inputs: Mapping[str, Any] | None = None, rounds: int = 5,
                        repeat: int = 3) -> list[list[float]]:
    """Per model, seconds of every timed inference over interleaved rounds of `benchmark` (which warms up first),
    so every model sees the same machine load; a model passed twice is timed once. GPU models' `benchmark` returns
    the costs as a list."""
    distinct = {id(model): model for model in models}
    costs: dict[int, list[float]] = {key: [] for key in distinct}
    for _ in range(rounds):
        for key, model in distinct.items():
            stats = model.benchmark(repeat=repeat, inputs=inputs)
            costs[key].extend(stats.costs if hasattr(stats, "costs") else stats)
    return [costs[id(model)] for model in models]


def interleaved_task_seconds(
    models: Sequence[CompiledModel], inputs: Mapping[str, Any], rounds: int,
    statistic: Callable[[Sequence[float]], float] = statistics.median,
) -> list[dict[str, float]]:
    """Per model, per task key: seconds the task's calls take in one run (the in-graph profile,
    `CompiledModel.profile_calls`), `statistic` over interleaved rounds."""
    per_round: list[list[dict[str, float]]] = [[] for _ in models]
    for _ in range(rounds):
        for model, rows in zip(models, per_round):
            spent: dict[str, float] = {}
            for call, seconds in zip(model.plan.calls, model.profile_calls(repeat=1, inputs=inputs)):
                if call.task >= 0:  # packing calls belong to no task; an end-to-end timing covers them
                    key = model.plan.tasks[call.task].key
                    spent[key] = spent.get(key, 0.0) + seconds
            rows.append(spent)
    return [{key: statistic([r[key] for r in rows]) for key in rows[0]} for rows in per_round]
