"""Timing compiled models against each other (`relay_tune.runtime.benchmark`): what is sampled, not how fast."""

from __future__ import annotations

import numpy as np
import pytest

import relay_tune
from relay_tune.runtime.benchmark import interleaved_latency, interleaved_samples, interleaved_task_seconds
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
