"""Builders: parallel compilation in worker processes, per-build timeouts, compiler crashes."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from relay_tune.errors import CompileError
from relay_tune.tuning import BuildArtifact, ErrorKind, InlineBuilder, LocalBuilder, TensorSpec
from relay_tune.tuning.testing import FaultyTask, MatmulTask
from search_space import Config, Constraint, IntKnob, Space


@pytest.fixture(scope="module")
def builder() -> Iterator[LocalBuilder]:
    # A generous timeout: the builds that must succeed share two cores with other test processes; one hangs for it.
    with LocalBuilder(n_parallel=2, timeout=10.0, kill_grace=1.0) as local:
        yield local  # type: ignore[misc]


def variant(name: str) -> Config:
    return Config({"variant": name, "repeat": 1})


def test_builds_matmul_configs_into_object_code(builder: LocalBuilder) -> None:
    task = MatmulTask(16, 20, 12)
    configs = [task.default_config(), Config({"order": "ikj", "tile_n": (2, 16), "tile_k": (3, 4)})]
    results = builder.build(task, configs)
    for result in results:
        assert result.error_kind is None, result.error_msg
        artifact = result.artifact
        assert isinstance(artifact, BuildArtifact)
        assert artifact.code_format == "elf-object" and artifact.code[:4] == b"\x7fELF"
        assert [a.role for a in artifact.args] == ["input", "input", "output"]
        assert result.build_seconds > 0


def test_failures_become_error_kinds_and_spare_the_other_builds(builder: LocalBuilder) -> None:
    task = FaultyTask(size=64)
    names = ["plain", "compile_error", "invalid", "build_crash", "reversed", "build_hang", "plain"]
    results = builder.build(task, [variant(n) for n in names])
    kinds = [None if r.error_kind is None else r.error_kind.name for r in results]
    assert kinds == [None, "COMPILE_ERROR", "INVALID_CONFIG", "COMPILE_ERROR", None, "BUILD_TIMEOUT", None]
    assert "LLVM rejected" in results[1].error_msg
    assert "died" in results[3].error_msg
    assert "killed" in results[5].error_msg
    # The builder recovers: the next batch builds normally in fresh workers.
    assert builder.build(task, [variant("plain")])[0].artifact is not None


def test_configs_outside_the_space_are_rejected_before_building(builder: LocalBuilder) -> None:
    task = MatmulTask(16, 20, 12)
    (result,) = builder.build(task, [Config({"order": "ikj", "tile_n": (1, 64), "tile_k": (3, 4)})])
    assert result.error_kind is ErrorKind.INVALID_CONFIG and "tile_n" in result.error_msg


def test_workers_are_recycled() -> None:
    task = FaultyTask(size=64, variants=("plain", "reversed"))
    configs = list(task.space.enumerate())
    with LocalBuilder(n_parallel=2, timeout=30.0, max_tasks_per_child=1) as recycling:
        results = recycling.build(task, configs)
    assert len(results) == 6 and all(r.artifact is not None for r in results)


def test_workers_are_retired_between_builds_not_while_kernels_are_timed() -> None:
    """A worker that exits after its quota is replaced at once by the executor, and the replacement's start-up
    (a second or two of one core) fell on the measurements of the batch just built; so the builder retires the
    whole pool at its next build instead, and between builds no worker exits or starts."""
    task = FaultyTask(size=64, variants=("plain", "reversed"))
    configs = list(task.space.enumerate())
    with LocalBuilder(n_parallel=2, timeout=30.0, max_tasks_per_child=1) as builder:
        assert all(r.artifact is not None for r in builder.build(task, configs[:2]))
        pool = builder._pool
        assert pool is not None
        workers = set(pool._processes)
        time.sleep(1.0)  # a worker retired by the executor would have been replaced by now
        assert set(pool._processes) == workers and all(p.is_alive() for p in pool._processes.values())
        assert all(r.artifact is not None for r in builder.build(task, configs[2:4]))
        assert builder._pool is not pool  # worn out: retired before the next build's first submit


class _Unpicklable:
    """A task whose space holds a lambda constraint: it cannot travel to worker processes."""

    key = "unpicklable"
    description = "unpicklable"
    flops = 1.0
    weight = 1
    target = "llvm"

    def __init__(self) -> None:
        self.space = Space([IntKnob("x", 0, 1)], [Constraint("lambda", lambda config: True)])


def test_unpicklable_tasks_are_a_clear_error(builder: LocalBuilder) -> None:
    with pytest.raises(CompileError, match="picklable"):
        builder.build(_Unpicklable(), [Config({"x": 0})])  # type: ignore[arg-type]


@dataclass
class _SlowPythonTask:
    """Builds by sleeping in Python: the in-worker timer interrupts it."""

    key: str = "slow"
    description: str = "slow"
    flops: float = 1.0
    weight: int = 1
    target: str = "llvm"
    space: Space = field(default_factory=lambda: Space([IntKnob("seconds", 0, 10)]))
    finished: list[int] = field(default_factory=list)  # the `seconds` of each build that slept to its end

    def build(self, config: Config) -> BuildArtifact:
        time.sleep(float(config["seconds"]))  # type: ignore[arg-type]
        self.finished.append(int(config["seconds"]))  # type: ignore[arg-type]
        return BuildArtifact(b"", "elf-object", "k", ())

    def default_config(self) -> Config:
        return Config({"seconds": 0})

    def input_specs(self) -> Sequence[TensorSpec]:
        return ()

    def reference(self, inputs: Sequence[np.ndarray]) -> None:
        return None


def test_soft_timeout_interrupts_python_level_builds() -> None:
    builder = InlineBuilder(timeout=0.2)
    task = _SlowPythonTask()
    fast, slow = builder.build(task, [Config({"seconds": 0}), Config({"seconds": 5})])  # type: ignore[arg-type]
    assert fast.error_kind is None
    assert slow.error_kind is ErrorKind.BUILD_TIMEOUT
    assert task.finished == [0]  # the slow build was stopped mid-sleep, not waited out


@dataclass
class _SlowToLoadTask(_SlowPythonTask):
    """Takes `load_seconds` to arrive in a worker, as a fresh worker's start-up and imports of the task's modules do
    (the arguments of a build are unpickled in the worker before the build starts)."""

    load_seconds: float = 0.0

    def __setstate__(self, state: dict[str, object]) -> None:
        time.sleep(float(state["load_seconds"]))  # type: ignore[arg-type]
        self.__dict__.update(state)


def test_build_timeouts_count_from_the_start_of_the_build_not_of_the_worker() -> None:
    """A build's clock starts when a worker starts it: a worker that takes longer to start than the timeout (a busy
    machine starting Python and importing the compiler) neither kills the build nor its pool."""
    task = _SlowToLoadTask(load_seconds=1.5)
    with LocalBuilder(n_parallel=2, timeout=0.5, kill_grace=0.2) as builder:
        results = builder.build(task, [Config({"seconds": 0}), Config({"seconds": 0})])  # type: ignore[arg-type]
        assert [r.error_kind for r in results] == [None, None], [r.error_msg for r in results]
        # a build that overruns once started is still stopped
        (slow,) = builder.build(_SlowToLoadTask(), [Config({"seconds": 5})])  # type: ignore[arg-type]
        assert slow.error_kind is ErrorKind.BUILD_TIMEOUT
