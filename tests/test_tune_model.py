"""Model-level tuning (relay_tune.tuning.tune_model): real tasks of real models, tuned, logged, built from the log.

The end-to-end checks are about wiring, not timings: the built model takes each task's best logged config (the
build's lookup gives exactly that config's steps) and agrees with the interpreter; the budget counts what the log
already holds (a rerun measures nothing, an interrupted run only what is left, a larger budget continues); a
time budget ends tuning but still builds; tasks can be filtered; CUDA targets fail clearly without a GPU.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from relay_tune.cli import load_model
from relay_tune.compile import resolve_target, task_lookup
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.testing import zoo
from relay_tune.text import parse_module
from relay_tune.tuning import LocalRunner, ProgressCallback, TrialEvent, apply_best, read_events, read_records
from relay_tune.tuning.relay_task import tasks_from_module
from relay_tune.tuning.tune_model import (
    SEARCH_STRATEGIES,
    BuildOptions,
    MeasureOptions,
    SearchOptions,
    default_log_path,
    make_search,
    tune_model,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "relay_tune" / "examples" / "small_cnn.relay"
HOST = resolve_target("llvm")


def fast_runner() -> LocalRunner:
    return LocalRunner(number=1, repeat=1, min_repeat_ms=2.0)


def check_against_interpreter(model: Any, mod: Any, rtol: float = 1e-3) -> None:
    inputs = model.random_inputs(seed=3)
    expected = evaluate(mod, inputs)
    got = model.run(**inputs)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)


def check_build_uses_best_records(result: Any, mod: Any) -> None:
    """Every task with a valid record is built from its best config's steps; the others use the default."""
    tasks = {t.key: t for t in tasks_from_module(mod, HOST)}
    best = {key: config for (key, target), config in apply_best([result.log_path]).items() if target == result.target}
    assert best, "no valid record in the log"
    lookup = task_lookup([result.log_path])
    assert lookup is not None
    for key, config in best.items():
        task = tasks[key]
        steps = lookup(SimpleNamespace(key=key, func=task.func), HOST)
        assert [s.to_json() for s in steps] == [s.to_json() for s in task.steps(config)], task.description
    built = {t.key: t.tuned for t in result.model.plan.tasks if t.kernel}
    # The build times tuned against default kernels in the model: a record slower there is not used, and the
    # default build is kept whole when it is faster end to end.
    check = result.model.build_info["tuned_check"]
    expected = set() if check["kept_default"] else (set(best) & set(built)) - set(check["rejected"])
    assert {key for key, tuned in built.items() if tuned} == expected


@pytest.fixture(scope="module")
def example() -> Any:
    return load_model(str(EXAMPLE))


@pytest.mark.slow
def test_inception_block_tuned_with_a_small_budget(tmp_path: Path) -> None:
    mod = zoo.small("inception_block")
    log = tmp_path / "inception.jsonl"
    # a first round of 3 configs per task (a task whose space is smaller takes fewer): 3 trials per task reach all
    trials = 3 * len(tasks_from_module(mod, HOST))
    assert trials > 0
    result = tune_model(mod, "llvm", trials, log, search=SearchOptions(batch_size=3),
                        measure=MeasureOptions(runner=fast_runner()),
                        build=BuildOptions(output=tmp_path / "inception.rtmod"))
    assert not result.interrupted and not result.timed_out
    assert result.summary.trials_done == trials == len(read_records(log))
    assert {r.target for r in read_records(log)} == {HOST.log_name}
    assert all(t.trials >= 1 and t.default_cost is not None for t in result.tasks)  # every task has a baseline
    check_build_uses_best_records(result, mod)
    check_against_interpreter(result.model, mod)
    assert result.latency_before and result.latency_after and result.model_path and result.model_path.is_file()
    assert (tmp_path / "inception.optuna.journal").is_file()  # the embedded Optuna storage beside the log


def test_budget_counts_what_the_log_holds(example: Any, tmp_path: Path) -> None:
    log = tmp_path / "cnn.jsonl"
    first = tune_model(example, "llvm", 10, log, search=SearchOptions(batch_size=3),
                       measure=MeasureOptions(runner=fast_runner()), build=BuildOptions(measure_latency=False))
    assert first.summary.trials_this_session == 10 and first.model is not None
    again = tune_model(example, "llvm", 10, log, search=SearchOptions(batch_size=3),
                       measure=MeasureOptions(runner=fast_runner()), build=BuildOptions(measure_latency=False))
    assert again.summary.trials_this_session == 0  # a finished run: nothing new to measure
    more = tune_model(example, "llvm", 14, log, search=SearchOptions(batch_size=3),
                      measure=MeasureOptions(runner=fast_runner()), build=BuildOptions(measure_latency=False))
    assert more.summary.trials_this_session == 4 and more.summary.trials_done == 14
    records = read_records(log)
    assert len(records) == 14
    repeats = Counter((r.workload_key, r.config_key) for r in records)
    assert max(repeats.values()) == 1  # no config measured twice across the three runs
    sessions = [e for e in read_events(log) if e.event == "session_end"]
    assert len(sessions) == 3 and not any(e.data["interrupted"] for e in sessions)


class InterruptAfter(ProgressCallback):
    """Raises KeyboardInterrupt (as Ctrl-C would) once `count` trials are done."""

    def __init__(self, count: int) -> None:
        self.count = count

    def on_trial(self, event: TrialEvent) -> None:
        if event.trials_done >= self.count:
            raise KeyboardInterrupt


def test_interrupted_run_resumes_with_what_is_left(example: Any, tmp_path: Path) -> None:
    log = tmp_path / "cnn.jsonl"
    stopped = tune_model(example, "llvm", 12, log, progress=InterruptAfter(5), search=SearchOptions(batch_size=3),
                         measure=MeasureOptions(runner=fast_runner()))
    assert stopped.interrupted and stopped.model is None and stopped.latency_after is None
    kept = len(read_records(log))
    assert kept == 5
    resumed = tune_model(example, "llvm", 12, log, search=SearchOptions(batch_size=3),
                         measure=MeasureOptions(runner=fast_runner()), build=BuildOptions(measure_latency=False))
    assert not resumed.interrupted
    assert resumed.summary.trials_this_session == 12 - kept
    records = read_records(log)
    assert len(records) == 12
    assert max(Counter((r.workload_key, r.config_key) for r in records).values()) == 1


def test_timeout_ends_tuning_and_still_builds(example: Any, tmp_path: Path) -> None:
    result = tune_model(example, "llvm", 100, tmp_path / "cnn.jsonl", search=SearchOptions(timeout=0.0),
                        measure=MeasureOptions(runner=fast_runner()), build=BuildOptions(measure_latency=False))
    assert result.timed_out and not result.interrupted
    assert result.summary.trials_this_session == 0
    assert result.model is not None
    check_against_interpreter(result.model, example)


def test_task_filter_and_search_choice(example: Any, tmp_path: Path) -> None:
    result = tune_model(example, "llvm", 4, tmp_path / "dense.jsonl", search=SearchOptions(task_filter="dense",
                        strategy="random", batch_size=2), measure=MeasureOptions(runner=fast_runner()),
                        build=BuildOptions(measure_latency=False))
    assert [t.family for t in result.tasks] == ["dense"]
    assert result.summary.trials_this_session == 4
    assert {r.strategy for r in read_records(tmp_path / "dense.jsonl")} == {"default", "random"}
    check_build_uses_best_records(result, example)
    with pytest.raises(RelayTuneError, match="no task matches"):
        tune_model(example, "llvm", 4, tmp_path / "x.jsonl", search=SearchOptions(task_filter="no such workload"))
    with pytest.raises(RelayTuneError, match="unknown search strategy"):
        make_search("annealing")
    assert set(SEARCH_STRATEGIES) >= {"tpe", "random"}


def test_default_log_path_names_model_and_target() -> None:
    path = default_log_path("models/resnet50.relay", "llvm")
    assert path.parent == Path("logs") and path.name.startswith("resnet50.llvm-") and path.suffix == ".jsonl"


def test_cuda_target_without_a_gpu_fails_clearly(example: Any, tmp_path: Path) -> None:
    from relay_tune.runtime.cuda import CudaUnavailableError, cuda_available

    if cuda_available() is None:
        pytest.skip("a GPU is available here")
    with pytest.raises(CudaUnavailableError, match="cannot tune for cuda"):
        tune_model(example, "cuda", 4, tmp_path / "gpu.jsonl")
    assert not (tmp_path / "gpu.jsonl").exists()


@pytest.mark.slow
def test_resnet50_with_a_tiny_budget_per_task(tmp_path: Path) -> None:
    mod = zoo.full("resnet50")
    tasks = tasks_from_module(mod, HOST)
    log = tmp_path / "resnet50.jsonl"
    result = tune_model(mod, "llvm", 2 * len(tasks), log, search=SearchOptions(batch_size=2),
                        measure=MeasureOptions(runner=fast_runner()))
    assert not result.interrupted and result.summary.trials_done == 2 * len(tasks)
    assert all(t.trials == 2 for t in result.tasks)  # the warm-up round gives every task its share
    check_build_uses_best_records(result, mod)
    check_against_interpreter(result.model, mod, rtol=2e-3)
    assert result.latency_before and result.latency_after


SCALAR_TASKS = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 1, 9, 13), float32]) -> Tensor[(1, 1, 9, 13), float32] {
  %0 = max(%x);
  %1 = subtract(%0, 80f);
  %2 = maximum(%x, %1);
  minimum(%2, 100f)
}
"""


def test_tasks_with_0d_tensors_are_measured(tmp_path: Path) -> None:
    # A whole-tensor reduction's 0-d result, and a 0-d element-wise task, are kernel arguments of shape (): the
    # runner checks and times them as such (a log mel spectrogram's `max(x) - 80` floor).
    mod = parse_module(SCALAR_TASKS)
    log = tmp_path / "scalar.jsonl"
    result = tune_model(mod, "llvm", 6, log, search=SearchOptions(batch_size=3),
                        measure=MeasureOptions(runner=fast_runner()),
                        build=BuildOptions(output=tmp_path / "scalar.rtmod"))
    records = read_records(log)
    assert records and all(r.error_kind is None for r in records), {r.error_msg for r in records}
    assert {r.description.split()[0] for r in records} >= {"max", "subtract", "maximum+minimum"}
    check_against_interpreter(result.model, mod)
