"""Timing compiled models against each other (`relay_tune.runtime.benchmark`): what is sampled, not how fast."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.runtime.benchmark import (
    LatencyComparison,
    calls_per_round,
    compare_latency,
    compare_many,
    interleaved_latency,
    interleaved_samples,
    interleaved_task_seconds,
    median_rank,
    steady_latency,
    warm_up,
)
from relay_tune.runtime.model import CompiledModel
from relay_tune.text import parse_module

MODEL = """#[version = "0.0.5"]
def @main(%x: Tensor[(3, 5), float32], %w: Tensor[(7, 5), float32]) {
  %0 = nn.dense(%x, %w);
  %1 = nn.relu(%0);
  nn.softmax(%1)
}"""


@pytest.fixture(scope="module")
def model() -> CompiledModel:
    w = np.random.default_rng(0).uniform(-1, 1, (7, 5)).astype("float32")
    return relay_tune.build(parse_module(MODEL), params={"w": w})


def test_every_round_samples_every_distinct_model_once(model: CompiledModel) -> None:
    samples = interleaved_samples([model, model], rounds=3, repeat=2)
    assert samples[0] is samples[1]  # one model passed twice is timed once
    assert len(samples[0]) == 3 * 2 and all(s > 0 for s in samples[0])
    (latency,) = interleaved_latency([model], rounds=3, repeat=2)
    assert latency > 0


def test_task_seconds_cover_the_tasks_that_run_kernels(model: CompiledModel) -> None:
    inputs = model.random_inputs(seed=0)
    (seconds,) = interleaved_task_seconds([model], inputs, rounds=2, statistic=min)
    kernels = {t.key for t in model.plan.tasks if t.kernel}
    assert kernels and set(seconds) == kernels
    assert all(s >= 0 for s in seconds.values())


def test_compare_latency_times_both_models_in_every_round(model: CompiledModel) -> None:
    timed = compare_latency(model, model, rounds=4, repeat=3, warmup_s=0.0)
    assert len(timed.baseline) == len(timed.candidate) == 4
    assert all(len(r) == 3 and all(s > 0 for s in r) for r in timed.baseline + timed.candidate)
    assert timed.ratio == pytest.approx(timed.baseline_s / timed.candidate_s)
    assert len(timed.round_ratios) == 4


def test_compare_many_times_every_model_in_every_round_against_the_first(model: CompiledModel) -> None:
    other = relay_tune.build(parse_module(MODEL), params={"w": np.ones((7, 5), "float32")})
    comparisons = compare_many([model, other, model], rounds=3, warmup_s=0.0, round_s=0.001)
    assert len(comparisons) == 2
    assert comparisons[0].baseline == comparisons[1].baseline  # the first model's rounds, timed once
    for comparison in comparisons:
        assert len(comparison.baseline) == len(comparison.candidate) == 3
        assert all(len(r) >= 5 and all(s > 0 for s in r) for r in comparison.candidate)


def test_a_ratio_is_given_only_where_the_rounds_agree() -> None:
    steady = LatencyComparison(((2.0e-3,), (2.1e-3,), (2.0e-3,), (2.05e-3,)),
                               ((1.0e-3,), (1.05e-3,), (1.0e-3,), (1.0e-3,)))
    assert steady.supports_ratio() and steady.ratio == pytest.approx(2.025 / 1.0, rel=0.02)
    assert steady.describe() == f"{steady.ratio:.2f}x faster"
    slower = LatencyComparison(((1e-3,),) * 3, ((1.25e-3,),) * 3)
    assert slower.describe() == "1.25x slower" and slower.spread == 0.0
    assert LatencyComparison(((1e-3,),) * 3, ((1.003e-3,),) * 3).describe() == "the same speed"
    # One cold round among few is what printed a 46x "speedup": the rounds disagree, so no ratio is printed.
    noisy = LatencyComparison(((2e-3,), (0.06e-3,), (0.055e-3,), (1e-3,)), ((0.045e-3,),) * 4)
    assert not noisy.supports_ratio()
    assert noisy.describe().startswith("timings too noisy for a ratio")
    # Two rounds cannot show agreement.
    assert not LatencyComparison(((1e-3,),) * 2, ((1e-3,),) * 2).supports_ratio()


def test_median_rank_bounds_the_median_with_95_percent_confidence() -> None:
    assert [median_rank(n) for n in (1, 2, 5)] == [0, 0, 0]  # too few samples for any bound
    assert median_rank(6) == 1 and median_rank(9) == 2 and median_rank(20) == 6 and median_rank(100) == 40


class _SteppedModel:
    """A stand-in model whose timed calls take the given seconds in turn (what `benchmark` reports)."""

    def __init__(self, seconds: list[float]) -> None:
        self.seconds = seconds
        self.calls = 0

    def benchmark(self, repeat: int, inputs: object = None) -> list[float]:
        out = [self.seconds[(self.calls + i) % len(self.seconds)] for i in range(repeat)]
        self.calls += repeat
        return out


def test_noisy_rounds_are_extended_until_their_median_ratio_is_known() -> None:
    rng = np.random.default_rng(2)
    noisy = list(2e-3 * np.exp(rng.normal(0.0, 0.12, 500)))
    first = compare_latency(_SteppedModel(noisy), _SteppedModel([1e-3]), rounds=9, repeat=1, warmup_s=0.0)
    assert len(first.round_ratios) == 9 and not first.supports_ratio()  # nine rounds disagree
    extended = compare_latency(_SteppedModel(noisy), _SteppedModel([1e-3]), rounds=9, repeat=1, warmup_s=0.0,
                               extend_s=5.0)
    assert 9 < len(extended.round_ratios) <= 72
    assert extended.supports_ratio() and extended.spread > 0.10  # known from the interval, not from the spread
    low, high = extended.ratio_interval()
    assert low <= 2.0 <= high and extended.uncertainty <= 0.05
    assert extended.describe().endswith("x faster")


def test_rounds_of_a_fast_model_fill_their_time() -> None:
    assert calls_per_round(50e-6, 0.05) == 1000  # a 50 us model: 1,000 calls fill 50 ms
    assert calls_per_round(20e-3, 0.05) == 5  # a slow model: still five calls a round
    assert calls_per_round(1e-6, 0.05) == 1000 and calls_per_round(0.0, 0.05) == 1000  # capped
    assert calls_per_round(1e-4, 1.0, least=10, most=100_000) == 10_000


def test_warmed_timings_are_many_single_calls(model: CompiledModel) -> None:
    per_call = warm_up(model, None, 0.01)
    assert per_call > 0
    costs = steady_latency(model, rounds=3, warmup_s=0.01, round_s=0.005)
    # three rounds of about 0.005 s of calls, at least five each, every one timed alone
    assert len(costs) >= 15 and all(c > 0 for c in costs)
    assert sum(costs) < 1.0


class _FixedCost:
    """A stand-in model whose every call 'takes' `seconds` (what its `benchmark` reports), counting its calls."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls: list[int] = []

    def benchmark(self, repeat: int, inputs: object = None) -> list[float]:
        self.calls.append(repeat)
        return [self.seconds] * repeat


def test_relay_tune_run_times_a_build_as_the_tuner_times_each_side() -> None:
    """`steady_latency` (`relay-tune run`) and `compare_latency` (the tuner's before/after) time a build the same
    way: the same warm-up, then the same rounds, each filled with that build's own calls."""
    slow, fast = _FixedCost(1e-3), _FixedCost(0.25e-3)
    timed = compare_latency(slow, fast, rounds=4, warmup_s=0.001, round_s=0.01)
    assert [len(r) for r in timed.baseline] == [10] * 4  # 10 calls of 1 ms fill 10 ms
    assert [len(r) for r in timed.candidate] == [40] * 4  # the faster build: its own 10 ms, not the slower's count
    alone = _FixedCost(0.25e-3)
    costs = steady_latency(alone, rounds=4, warmup_s=0.001, round_s=0.01)
    assert costs == tuple(c for r in timed.candidate for c in r)
    assert alone.calls[-4:] == fast.calls[-4:] == [40] * 4


def test_compare_latency_takes_a_fixed_repeat_for_both(model: CompiledModel) -> None:
    timed = compare_latency(model, model, rounds=3, repeat=6, warmup_s=0.01)
    assert {len(r) for r in timed.baseline + timed.candidate} == {6}
    sized = compare_latency(model, model, rounds=3, warmup_s=0.01, round_s=0.005)
    assert all(len(r) >= 5 for r in sized.baseline + sized.candidate)  # at least five calls every round
