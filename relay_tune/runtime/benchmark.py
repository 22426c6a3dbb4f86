"""Timing compiled models against each other in interleaved rounds, so every model sees the same machine load."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
            costs[key].extend(_timed_calls(model, repeat, inputs))
    return [costs[id(model)] for model in models]


# A ratio is printed only when the middle half of the per-round ratios lies within this fraction of it.
RATIO_TOLERANCE = 0.10


@dataclass(frozen=True)
class LatencyComparison:
    """Two models timed in the same interleaved rounds: seconds per inference of every timed call, by round.

    Every round times the baseline and then the candidate, so both see the same machine state; the ratio of the
    medians is what a reader wants, and the per-round ratios say whether the timings support it."""

    baseline: tuple[tuple[float, ...], ...]  # per round, the baseline's timed calls (seconds)
    candidate: tuple[tuple[float, ...], ...]

    @property
    def baseline_s(self) -> float:
        """Median seconds per inference of the baseline over every round."""
        return statistics.median(s for r in self.baseline for s in r)

    @property
    def candidate_s(self) -> float:
        return statistics.median(s for r in self.candidate for s in r)

    @property
    def ratio(self) -> float:
        """Baseline over candidate median: above 1, the candidate is faster."""
        return self.baseline_s / self.candidate_s

    @property
    def round_ratios(self) -> tuple[float, ...]:
        return tuple(statistics.median(b) / statistics.median(c) for b, c in zip(self.baseline, self.candidate))

    @property
    def spread(self) -> float:
        """Interquartile range of the per-round ratios over their median (0 for fewer than three rounds is not
        claimed: it is infinite then)."""
        ratios = self.round_ratios
        if len(ratios) < 3:
            return float("inf")
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        return (q3 - q1) / statistics.median(ratios)

    def supports_ratio(self, tolerance: float = RATIO_TOLERANCE) -> bool:
        """Whether the rounds agree on the ratio: the middle half of the per-round ratios spans at most
        `tolerance` of it."""
        return self.spread <= tolerance

    def describe(self) -> str:
        """'1.17x faster' or '1.04x slower' (the candidate against the baseline), or why no ratio is given."""
        if not self.supports_ratio():
            return (f"timings too noisy for a ratio: rounds disagree by {self.spread:.0%}, per-round ratios "
                    f"{min(self.round_ratios):.2f}-{max(self.round_ratios):.2f}x")
        if round(self.ratio, 2) == 1.0 or round(1 / self.ratio, 2) == 1.0:
            return "the same speed"
        return f"{self.ratio:.2f}x faster" if self.ratio > 1 else f"{1 / self.ratio:.2f}x slower"


# How a build's latency is measured, by `relay-tune run` and by the tuner's before/after timing alike: run for
# WARMUP_S seconds, then ROUNDS rounds of single timed calls that fill ROUND_S seconds each (the median of every
# call). The same method on both sides lets the ratio the tuner prints be checked with `relay-tune run`
# (`python -m experiments quickstart`).
WARMUP_S = 0.2
ROUNDS = 9
ROUND_S = 1.0 / ROUNDS  # about a second of timed calls per build


def warm_up(model: Any, inputs: Mapping[str, Any] | None, seconds: float, min_calls: int = 3) -> float:
    """Run `model` for at least `seconds` and `min_calls` calls (cold caches, lazily mapped pages, a thread team
    still asleep and a clock still ramping up); the median seconds per call of the last half of those calls."""
    deadline = time.perf_counter() + seconds
    costs: list[float] = []
    while time.perf_counter() < deadline or len(costs) < min_calls:
        costs.extend(_timed_calls(model, 1, inputs))
    return statistics.median(costs[len(costs) // 2:])


def calls_per_round(per_call_s: float, round_s: float, least: int = 5, most: int = 1000) -> int:
    """How many timed calls fill `round_s` seconds, between `least` and `most`: a round of a 50 us model needs
    hundreds of calls before one descheduled thread or timer tick stops deciding its median."""
    if per_call_s <= 0:
        return most
    return max(least, min(most, math.ceil(round_s / per_call_s)))


def compare_latency(baseline: Any, candidate: Any, inputs: Mapping[str, Any] | None = None, rounds: int = ROUNDS,
                    repeat: int | None = None, warmup_s: float = WARMUP_S,
                    round_s: float = ROUND_S) -> LatencyComparison:
    """Time two models in `rounds` interleaved rounds, after running each for at least `warmup_s` seconds (one
    cold timing once decided a 40x "speedup" that a rerun measured at 1.2x). Each round times `repeat` calls of
    each model; by default as many as fill `round_s` seconds of that model (at least 5), so that each side is
    timed as `steady_latency` times a model alone."""
    base_rounds, cand_rounds = interleaved_rounds((baseline, candidate), inputs, rounds, repeat, warmup_s, round_s)
    return LatencyComparison(base_rounds, cand_rounds)


def compare_many(models: Sequence[Any], inputs: Mapping[str, Any] | None = None, rounds: int = ROUNDS,
                 warmup_s: float = WARMUP_S, round_s: float = ROUND_S) -> list[LatencyComparison]:
    """Every model after the first against the first, all timed in the same interleaved rounds (as
    `compare_latency` times two): what `relay-tune run A.rtmod B.rtmod ...` prints."""
    timed = interleaved_rounds(models, inputs, rounds, None, warmup_s, round_s)
    return [LatencyComparison(timed[0], other) for other in timed[1:]]


def interleaved_rounds(models: Sequence[Any], inputs: Mapping[str, Any] | None, rounds: int, repeat: int | None,
                       warmup_s: float, round_s: float) -> list[tuple[tuple[float, ...], ...]]:
    """Per model, its timed calls of each round (seconds): each model warmed for `warmup_s` first, then every round
    times each model in turn, `repeat` calls or as many as fill `round_s` seconds of it (at least 5)."""
    per_call = [warm_up(model, inputs, warmup_s) for model in models]
    repeats = [repeat if repeat is not None else calls_per_round(p, round_s) for p in per_call]
    timed: list[list[tuple[float, ...]]] = [[] for _ in models]
    for _ in range(rounds):
        for model, calls, out in zip(models, repeats, timed):
            out.append(_timed_calls(model, calls, inputs))
    return [tuple(t) for t in timed]


def steady_latency(model: Any, inputs: Mapping[str, Any] | None = None, rounds: int = ROUNDS,
                   warmup_s: float = WARMUP_S, round_s: float = ROUND_S) -> tuple[float, ...]:
    """Seconds of every timed call of a warmed model over `rounds` rounds of `round_s` seconds each (at least 5
    calls a round): what `relay-tune run` reports, measured as `compare_latency` measures each side."""
    per_call = warm_up(model, inputs, warmup_s)
    repeat = calls_per_round(per_call, round_s)
    return tuple(cost for _ in range(rounds) for cost in _timed_calls(model, repeat, inputs))


def _timed_calls(model: Any, repeat: int, inputs: Mapping[str, Any] | None) -> tuple[float, ...]:
    """Seconds of `repeat` timed inferences (GPU models' `benchmark` returns the list itself)."""
    stats = model.benchmark(repeat=repeat, inputs=inputs)
    return tuple(stats.costs if hasattr(stats, "costs") else stats)


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
