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


# A ratio is printed only when the middle half of the per-round ratios lies within this fraction of it, or the
# 95% confidence interval of their median lies within half of it on either side.
RATIO_TOLERANCE = 0.10
# Seconds of further interleaved rounds a comparison may take when its first rounds do not support a ratio: on a
# 2-core host a ~2 ms model's per-round ratios spread by 20% (another process's bursts), which nine rounds cannot
# narrow to a ratio worth printing but a few dozen can.
EXTEND_S = 6.0
# At most this many times the first rounds, however fast the models.
MAX_ROUNDS_FACTOR = 8


def median_rank(n: int, confidence: float = 0.95) -> int:
    """The order statistic `k` (1-based) such that the `k`-th smallest and `k`-th largest of `n` samples bound
    their median with at least `confidence` (distribution-free: each sample lies below the median with probability
    1/2); 0 where `n` is too small for any such bound (below 6 samples at 95%)."""
    tail = (1.0 - confidence) / 2
    below, k = 0.0, 0
    while k < n // 2:
        below += math.comb(n, k) / 2**n  # P(fewer than k + 1 samples below the median)
        if below > tail:
            break
        k += 1
    return k


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

    def ratio_interval(self) -> tuple[float, float]:
        """A 95% confidence interval of the median per-round ratio from the per-round ratios' order statistics
        (`median_rank`); (0, inf) for fewer than six rounds."""
        ratios = sorted(self.round_ratios)
        k = median_rank(len(ratios))
        if k == 0:
            return 0.0, float("inf")
        return ratios[k - 1], ratios[len(ratios) - k]

    @property
    def uncertainty(self) -> float:
        """Half the width of `ratio_interval` over the median per-round ratio."""
        low, high = self.ratio_interval()
        return (high - low) / 2 / statistics.median(self.round_ratios) if self.round_ratios else float("inf")

    def supports_ratio(self, tolerance: float = RATIO_TOLERANCE) -> bool:
        """Whether the rounds agree on the ratio: the middle half of the per-round ratios spans at most
        `tolerance` of it, or enough rounds put the median ratio within `tolerance / 2` of it with 95%
        confidence."""
        return self.spread <= tolerance or self.uncertainty <= tolerance / 2

    def describe(self) -> str:
        """'1.17x faster' or '1.04x slower' (the candidate against the baseline), or why no ratio is given."""
        if not self.supports_ratio():
            return (f"timings too noisy for a ratio: {len(self.round_ratios)} rounds disagree by "
                    f"{self.spread:.0%}, per-round ratios {min(self.round_ratios):.2f}-{max(self.round_ratios):.2f}x")
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
                    repeat: int | None = None, warmup_s: float = WARMUP_S, round_s: float = ROUND_S,
                    extend_s: float = 0.0) -> LatencyComparison:
    """Time two models in `rounds` interleaved rounds, after running each for at least `warmup_s` seconds (one
    cold timing once decided a 40x "speedup" that a rerun measured at 1.2x). Each round times `repeat` calls of
    each model; by default as many as fill `round_s` seconds of that model (at least 5), so that each side is
    timed as `steady_latency` times a model alone. Where those rounds do not support a ratio, further rounds
    follow for up to `extend_s` seconds (`EXTEND_S` for what is printed), until they do."""
    def agreed(timed: Sequence[Sequence[tuple[float, ...]]]) -> bool:
        return LatencyComparison(tuple(timed[0]), tuple(timed[1])).supports_ratio()

    base_rounds, cand_rounds = interleaved_rounds((baseline, candidate), inputs, rounds, repeat, warmup_s, round_s,
                                                  extend_s, agreed)
    return LatencyComparison(base_rounds, cand_rounds)


def compare_many(models: Sequence[Any], inputs: Mapping[str, Any] | None = None, rounds: int = ROUNDS,
                 warmup_s: float = WARMUP_S, round_s: float = ROUND_S,
                 extend_s: float = 0.0) -> list[LatencyComparison]:
    """Every model after the first against the first, all timed in the same interleaved rounds (as
    `compare_latency` times two, further rounds until every comparison supports its ratio or `extend_s` has
    passed): what `relay-tune run A.rtmod B.rtmod ...` prints."""
    def agreed(timed: Sequence[Sequence[tuple[float, ...]]]) -> bool:
        return all(LatencyComparison(tuple(timed[0]), tuple(t)).supports_ratio() for t in timed[1:])

    timed = interleaved_rounds(models, inputs, rounds, None, warmup_s, round_s, extend_s, agreed)
    return [LatencyComparison(timed[0], other) for other in timed[1:]]


def interleaved_rounds(
    models: Sequence[Any], inputs: Mapping[str, Any] | None, rounds: int, repeat: int | None, warmup_s: float,
    round_s: float, extend_s: float = 0.0,
    agreed: Callable[[Sequence[Sequence[tuple[float, ...]]]], bool] | None = None,
) -> list[tuple[tuple[float, ...], ...]]:
    """Per model, its timed calls of each round (seconds): each model warmed for `warmup_s` first, then every round
    times each model in turn, `repeat` calls or as many as fill `round_s` seconds of it (at least 5). After
    `rounds` rounds, while `agreed` says the rounds so far do not agree, further rounds for up to `extend_s`
    seconds (at most `MAX_ROUNDS_FACTOR` times `rounds` in all)."""
    per_call = [warm_up(model, inputs, warmup_s) for model in models]
    repeats = [repeat if repeat is not None else calls_per_round(p, round_s) for p in per_call]
    timed: list[list[tuple[float, ...]]] = [[] for _ in models]

    def one_round() -> None:
        for model, calls, out in zip(models, repeats, timed):
            out.append(_timed_calls(model, calls, inputs))

    for _ in range(rounds):
        one_round()
    if agreed is not None and extend_s > 0:
        deadline = time.perf_counter() + extend_s
        while (not agreed(timed) and time.perf_counter() < deadline
               and len(timed[0]) < MAX_ROUNDS_FACTOR * rounds):
            one_round()
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
