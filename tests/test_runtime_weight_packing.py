"""A dense weight that the model receives at run time: schedules that read it packed are in the space, the model
packs it with a packing kernel on every run, and the tuner's measurement runs (and checks) that same packing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.records.log_format import TuningRecord, append_lines
from relay_tune.records.measure import MeasureResult
from relay_tune.runtime.model import PACKING_TASK
from relay_tune.text import parse_module
from relay_tune.tuning import ErrorKind, LocalRunner
from relay_tune.tuning.relay_task import tasks_from_module

DENSE_INPUT_WEIGHT = """#[version = "0.0.5"]
def @main(%a: Tensor[(24, 48), float32], %b: Tensor[(40, 48), float32]) {
  nn.dense(%a, %b, units=40)
}
"""


@pytest.fixture(scope="module")
def runner() -> Iterator[LocalRunner]:
    with LocalRunner(timeout=10.0, number=2, repeat=2, min_repeat_ms=1) as local:
        yield local


@pytest.fixture(scope="module")
def task() -> object:
    (only,) = tasks_from_module(parse_module(DENSE_INPUT_WEIGHT), "llvm")
    return only


def test_a_run_time_weight_may_be_packed_and_the_artifact_packs_it_before_the_kernel(task: object) -> None:
    assert "pack_b" in task.space.names
    assert task.constants == ()  # the weight is an input of the model, not a constant
    assert task.default_config()["pack_b"] is True  # the default packs it too: what an untuned build runs
    packed = task.build(task.default_config().replace(pack_b=True))
    ((symbol, index, position),) = packed.prologue
    assert index == 1 and packed.args[position].index == 1 and packed.args[position].layout  # the weight, packed
    assert symbol != packed.kernel_name
    assert task.build(task.default_config().replace(pack_b=False)).prologue == ()


def test_the_runner_checks_and_times_the_packing_with_the_kernel(task: object, runner: LocalRunner) -> None:
    packed = task.build(task.default_config().replace(pack_b=True))
    result = runner.run(task, packed)
    assert result.error_kind is None, result.error_msg
    # The packing kernel fills the argument the kernel reads: pointed at the wrong logical input, the kernel
    # computes a @ a-packed-as-weight and the reference check fails, so the packing really runs before the kernel.
    a_spec = task.input_specs()[0]
    assert a_spec.shape != task.input_specs()[1].shape
    square = parse_module(DENSE_INPUT_WEIGHT.replace("(40, 48)", "(24, 48)").replace("units=40", "units=24"))
    (sq_task,) = tasks_from_module(square, "llvm")
    sq = sq_task.build(sq_task.default_config().replace(pack_b=True))
    (symbol, _index, position), = sq.prologue
    wrong = dataclasses.replace(sq, prologue=((symbol, 0, position),))
    bad = runner.run(sq_task, wrong)
    assert bad.error_kind is ErrorKind.WRONG_RESULT
    assert runner.run(sq_task, sq).error_kind is None


def test_a_model_built_from_a_packed_record_packs_its_weight_input_every_run(task: object, tmp_path: Path) -> None:
    config = task.default_config().replace(pack_b=True)
    record = TuningRecord.from_measurement(task.key, task.target, config, MeasureResult((1e-5,)),
                                           description=task.description)
    log = tmp_path / "packed.jsonl"
    append_lines(log, [record.to_json()])
    mod = parse_module(DENSE_INPUT_WEIGHT)
    model = relay_tune.build(mod, target="llvm", logs=str(log))
    assert [c.task for c in model.plan.calls] == [PACKING_TASK, 0]
    rng = np.random.default_rng(3)
    for _ in range(2):  # a new weight each run: packed again, not cached from the first run
        a = rng.standard_normal((24, 48)).astype(np.float32)
        b = rng.standard_normal((40, 48)).astype(np.float32)
        np.testing.assert_allclose(model.run(a=a, b=b), a @ b.T, rtol=1e-4, atol=1e-4)


def test_the_measurement_process_gives_libgomp_the_settings_of_a_model_process() -> None:
    from relay_tune.codegen.jit import DEFAULT_GOMP_SPINCOUNT
    from relay_tune.tuning.runner import model_thread_team

    environ: dict[str, str] = {}
    model_thread_team(environ)
    assert environ == {"GOMP_SPINCOUNT": str(DEFAULT_GOMP_SPINCOUNT)}
    for own in ({"GOMP_SPINCOUNT": "7"}, {"OMP_WAIT_POLICY": "passive"}):
        kept = dict(own)
        model_thread_team(kept)
        assert kept == own  # a user's own setting applies to models and measurements alike


def test_the_untuned_build_packs_a_run_time_weight_before_every_call() -> None:
    """The untuned build runs the task's default config, which packs the weight before every call with the
    packing kernel the runner times with the dense (tests/test_default_schedules.py compares the steps; this
    checks the model end to end)."""
    rows = 67
    source = DENSE_INPUT_WEIGHT.replace("(24, 48)", f"({rows}, 48)")
    (tall,) = tasks_from_module(parse_module(source), "llvm")
    assert tall.default_config()["pack_b"] is True
    model = relay_tune.build(parse_module(source), target="llvm")
    assert [c.task for c in model.plan.calls] == [PACKING_TASK, 0]  # the packing kernel, then the dense
    rng = np.random.default_rng(4)
    a = rng.standard_normal((rows, 48)).astype("float32")
    b = rng.standard_normal((40, 48)).astype("float32")
    np.testing.assert_allclose(model.run(a=a, b=b), a @ b.T, rtol=1e-4, atol=1e-4)
    b2 = rng.standard_normal((40, 48)).astype("float32")  # packed again on the next run, not cached
    np.testing.assert_allclose(model.run(a=a, b=b2), a @ b2.T, rtol=1e-4, atol=1e-4)
