"""A tuning round measured as one batch (`Runner.run_batch`): the kernels' repeats interleave, every fault is
blamed on its own kernel, and copies of weights that one prepared kernel reads stay put while the others are set
up."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from relay_tune.tuning import BuildArtifact, ErrorKind, LocalBuilder, LocalRunner
from relay_tune.tuning.runner import (
    WEIGHT_COPY_SETS,
    KernelLoader,
    TimingOptions,
    WeightCopies,
    _measure_batch,
    random_inputs,
)
from relay_tune.tuning.task import KernelArg, LayoutStep, TensorSpec
from relay_tune.tuning.testing import FaultyTask
from search_space import Config

FAULTY = FaultyTask(size=256)
NAMES = ["plain", "reversed", "segfault", "hang", "wrong", "partial"]


@pytest.fixture(scope="module")
def artifacts() -> dict[str, BuildArtifact]:
    with LocalBuilder(n_parallel=2, timeout=30.0) as builder:
        results = builder.build(FAULTY, [Config({"variant": n, "repeat": 1}) for n in NAMES])
    built = {}
    for name, result in zip(NAMES, results):
        assert isinstance(result.artifact, BuildArtifact), result.error_msg
        built[name] = result.artifact
    return built


@pytest.fixture()
def runner() -> Iterator[LocalRunner]:
    with LocalRunner(timeout=3.0, number=2, repeat=3, min_repeat_ms=5) as local:
        yield local  # type: ignore[misc]


def test_a_round_with_every_kind_of_fault_blames_each_kernel(
        runner: LocalRunner, artifacts: dict[str, BuildArtifact]) -> None:
    order = ["plain", "segfault", "reversed", "wrong", "hang", "partial", "plain"]
    results = runner.run_batch(FAULTY, [artifacts[n] for n in order])
    kinds = [r.error_kind for r in results]
    assert kinds == [None, ErrorKind.RUNTIME_ERROR, None, ErrorKind.WRONG_RESULT, ErrorKind.TIMEOUT,
                     ErrorKind.WRONG_RESULT, None], [r.error_msg for r in results]
    assert "SIGSEGV" in results[1].error_msg and "did not finish" in results[4].error_msg
    assert "never written" in results[5].error_msg
    for result in (results[0], results[2], results[6]):
        assert result.costs is not None and len(result.costs) == 3 and min(result.costs) > 0
    # the runner goes on with a fresh worker, batch or single run
    assert [r.error_kind for r in runner.run_batch(FAULTY, [artifacts["plain"], artifacts["reversed"]])] == [None] * 2
    assert runner.run(FAULTY, artifacts["reversed"]).error_kind is None


def test_single_runs_and_rounds_check_and_time_alike(artifacts: dict[str, BuildArtifact]) -> None:
    names = ["plain", "wrong", "reversed"]
    with LocalRunner(timeout=5.0, number=2, repeat=3, min_repeat_ms=5, interleave=False) as serial:
        one_by_one = serial.run_batch(FAULTY, [artifacts[n] for n in names])
    with LocalRunner(timeout=5.0, number=2, repeat=3, min_repeat_ms=5) as interleaved:
        batched = interleaved.run_batch(FAULTY, [artifacts[n] for n in names])
    assert [r.error_kind for r in one_by_one] == [r.error_kind for r in batched] == [None, ErrorKind.WRONG_RESULT,
                                                                                      None]
    assert all(len(r.costs or ()) == 3 for r in (one_by_one[0], one_by_one[2], batched[0], batched[2]))


class _Reports:
    """Stands in for the worker's pipe: keeps what `_measure_batch` reports."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send(self, message: tuple[Any, ...]) -> None:
        self.sent.append(message)


def test_repeats_are_interleaved_after_every_kernel_is_checked(artifacts: dict[str, BuildArtifact]) -> None:
    inputs = random_inputs(FAULTY.input_specs(), 0)
    expected = [np.asarray(e) for e in FAULTY.reference([a.copy() for a in inputs])]
    reports = _Reports()
    timing = TimingOptions(number=1, repeat=4, min_repeat_ms=1)
    batch = [artifacts["plain"], artifacts["wrong"], artifacts["reversed"]]
    replies = _measure_batch(reports, batch, timing,  # type: ignore[arg-type]
                             (inputs, expected, {"float32": (1e-4, 1e-5)}, ()), KernelLoader(), WeightCopies(), "t")
    steps = [message[1] for message in reports.sent]
    # every kernel checked first (the wrong one fails there), then four rounds of one repeat each of the others
    assert steps == [0, 1, 2] + [0, 2] * 4
    assert [r[0] for r in replies] == ["ok", "error", "ok"] and replies[1][1] == ErrorKind.WRONG_RESULT.name
    assert len(replies[0][1]) == len(replies[2][1]) == 4 and replies[0][3] > 0


def _artifact(weight: KernelArg) -> BuildArtifact:
    return BuildArtifact(code=b"", code_format="elf-object", kernel_name="k", args=(
        KernelArg(TensorSpec((4, 8), "float32"), "input", 0), weight,
        KernelArg(TensorSpec((4, 16), "float32"), "output", 0)))


def test_copies_a_prepared_kernel_reads_are_not_reused_while_its_batch_runs() -> None:
    """A round may hold more weight layouts than the store keeps: the sets pushed out while later kernels are set
    up must keep their bytes until the round is timed, and are never refilled with another layout's copies."""
    weight = np.arange(128, dtype="float32").reshape(16, 8) + 0.25
    copies = WeightCopies()
    tables = []
    with copies.pinned():
        for i in range(WEIGHT_COPY_SETS + 3):
            layout = (LayoutStep("reshape", (16, 8)),) * (i + 1)  # another layout key, the same bytes
            values = weight + i  # each layout's copies hold their own values
            buffers = [np.zeros((4, 8), "float32"), values, np.zeros((4, 16), "float32")]
            table = copies.argument_table("t", _artifact(KernelArg(TensorSpec((16, 8), "float32"), "input", 1,
                                                                   layout)),
                                          buffers, [b.ctypes.data for b in buffers], {1}, {}, cold_bytes=512 * 8)
            assert table is not None
            tables.append((table, values))
        for table, values in tables:  # every prepared kernel's copies still hold its weights
            for address in table[:, 1].tolist():
                copy = np.ctypeslib.as_array(
                    (np.ctypeslib.as_ctypes_type(np.float32) * values.size).from_address(address))
                assert np.array_equal(copy.reshape(values.shape), values)
    assert copies.refilled == 0
    # after the round the bound holds again and pushed-out blocks are refilled as before
    buffers = [np.zeros((4, 8), "float32"), weight, np.zeros((4, 16), "float32")]
    copies.argument_table("u", _artifact(KernelArg(TensorSpec((16, 8), "float32"), "input", 1)), buffers,
                          [b.ctypes.data for b in buffers], {1}, {}, cold_bytes=512 * 8)
    assert copies.refilled == 1
