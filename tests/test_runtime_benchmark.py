"""Timing compiled models against each other (`relay_tune.runtime.benchmark`): what is sampled, not how fast."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.runtime.benchmark import (
    LatencyComparison,
    calls_per_round,
    compare_latency,
    interleaved_latency,
    interleaved_samples,
    interleaved_task_seconds,
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


def test_rounds_of_a_fast_model_fill_their_time() -> None:
    assert calls_per_round(50e-6, 0.05) == 1000  # a 50 us model: 1,000 calls fill 50 ms
    assert calls_per_round(20e-3, 0.05) == 5  # a slow model: still five calls a round
    assert calls_per_round(1e-6, 0.05) == 1000 and calls_per_round(0.0, 0.05) == 1000  # capped
    assert calls_per_round(1e-4, 1.0, least=10, most=100_000) == 10_000


def test_warmed_timings_are_many_single_calls(model: CompiledModel) -> None:
    per_call = warm_up(model, None, 0.01)
    assert per_call > 0
    costs = steady_latency(model, seconds=0.02, warmup_s=0.01)
    # about 0.02 s of calls, at least ten, every one timed alone
    assert len(costs) >= 10 and all(c > 0 for c in costs)
    assert sum(costs) < 1.0


def test_compare_latency_sizes_rounds_from_the_slower_model(model: CompiledModel) -> None:
    timed = compare_latency(model, model, rounds=3, warmup_s=0.01, round_s=0.005)
    sizes = {len(r) for r in timed.baseline + timed.candidate}
    assert len(sizes) == 1 and sizes.pop() >= 5  # the same number of calls for both, every round
