"""Runners: isolated measurement, crash and hang recovery, correctness checks, timing, artifact formats."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from relay_tune.tuning import (
    BuildArtifact,
    ErrorKind,
    KernelArg,
    LayoutStep,
    LocalBuilder,
    LocalRunner,
    TensorSpec,
    apply_layout,
    random_inputs,
)
from relay_tune.tuning.runner import compare_outputs
from relay_tune.tuning.testing import DoublingTask, FaultyTask, MatmulTask, compile_c_library
from search_space import Config


@pytest.fixture(scope="module")
def runner() -> Iterator[LocalRunner]:
    with LocalRunner(timeout=3.0, number=2, repeat=3, min_repeat_ms=5) as local:
        yield local  # type: ignore[misc]


@pytest.fixture(scope="module")
def faulty_artifacts() -> dict[str, BuildArtifact]:
    task = FaultyTask(size=256)
    names = ["plain", "reversed", "segfault", "hang", "wrong", "partial"]
    with LocalBuilder(n_parallel=2, timeout=30.0) as builder:
        results = builder.build(task, [Config({"variant": n, "repeat": 1}) for n in names])
    artifacts = {}
    for name, result in zip(names, results):
        assert isinstance(result.artifact, BuildArtifact), result.error_msg
        artifacts[name] = result.artifact
    return artifacts


FAULTY = FaultyTask(size=256)


def test_measures_a_correct_kernel(runner: LocalRunner, faulty_artifacts: dict[str, BuildArtifact]) -> None:
    result = runner.run(FAULTY, faulty_artifacts["plain"])
    assert result.error_kind is None, result.error_msg
    assert result.costs is not None and len(result.costs) == 3 and all(c > 0 for c in result.costs)


@pytest.mark.parametrize(("name", "kind", "message"), [
    ("segfault", ErrorKind.RUNTIME_ERROR, "SIGSEGV"),
    ("hang", ErrorKind.TIMEOUT, "did not finish"),
    ("wrong", ErrorKind.WRONG_RESULT, "1 of 256 elements differ"),
    ("partial", ErrorKind.WRONG_RESULT, "never written"),
])
def test_fault_kernels_are_recorded_and_the_runner_recovers(
    runner: LocalRunner, faulty_artifacts: dict[str, BuildArtifact], name: str, kind: ErrorKind, message: str
) -> None:
    result = runner.run(FAULTY, faulty_artifacts[name])
    assert result.error_kind is kind and result.costs is None
    assert message in result.error_msg
    after = runner.run(FAULTY, faulty_artifacts["reversed"])  # a fresh worker took over if the old one died
    assert after.error_kind is None, after.error_msg


def test_matmul_kernels_match_the_reference() -> None:
    task = MatmulTask(24, 40, 36)
    configs = [task.default_config(), Config({"order": "ikj", "tile_n": (3, 16), "tile_k": (5, 8)})]
    with LocalBuilder(n_parallel=2) as builder, LocalRunner(timeout=10.0, min_repeat_ms=5) as runner:
        for result in builder.build(task, configs):
            assert result.artifact is not None, result.error_msg
            measured = runner.run(task, result.artifact)  # type: ignore[arg-type]
            assert measured.error_kind is None, measured.error_msg


def test_timing_options_and_cache_flush(faulty_artifacts: dict[str, BuildArtifact]) -> None:
    with LocalRunner(timeout=20.0, number=1, repeat=5, min_repeat_ms=0, flush_cache=True) as runner:
        result = runner.run(FAULTY, faulty_artifacts["plain"])
    assert result.costs is not None and len(result.costs) == 5


def test_worker_is_recycled_after_max_runs(faulty_artifacts: dict[str, BuildArtifact]) -> None:
    with LocalRunner(timeout=10.0, min_repeat_ms=1, max_runs_per_worker=2) as runner:
        first = None
        for _ in range(5):
            assert runner.run(FAULTY, faulty_artifacts["plain"]).error_kind is None
            pid = runner._worker.process.pid if runner._worker is not None else None
            first = first or pid
        assert runner._worker is None or runner._worker.process.pid != first


# -- inputs and checks -----------------------------------------------------------------------------------------


def test_random_inputs_are_seeded_irregular_and_typed() -> None:
    specs = [TensorSpec((64, 8), "float32"), TensorSpec((100,), "int32"), TensorSpec((10,), "bool"),
             TensorSpec((5,), "uint8"), TensorSpec((3,), "float64")]
    first, second = random_inputs(specs, 1), random_inputs(specs, 1)
    for a, b, spec in zip(first, second, specs):
        assert a.shape == spec.shape and str(a.dtype) == spec.dtype
        np.testing.assert_array_equal(a, b)
    floats, ints = first[0], first[1]
    assert np.all(np.abs(floats) >= 0.05) and np.all(np.abs(floats) <= 1)
    assert (floats < 0).any() and (floats > 0).any()
    assert np.all(ints != 0)
    assert not np.array_equal(random_inputs(specs, 2)[0], floats)


def test_compare_outputs_tolerance_by_dtype() -> None:
    tolerances = {"float32": (1e-4, 1e-5)}
    expected = np.linspace(-100, 100, 50).astype(np.float32)
    assert compare_outputs(expected * (1 + 1e-6), expected, tolerances, 0) is None
    assert "differ" in str(compare_outputs(expected * 1.01, expected, tolerances, 0))
    ints = np.arange(5, dtype=np.int32)
    assert compare_outputs(ints, ints.copy(), tolerances, 0) is None
    assert "1 of 5" in str(compare_outputs(ints + (ints == 2), ints, tolerances, 0))
    assert "shape" in str(compare_outputs(ints[:4], ints, tolerances, 0))


def test_apply_layout_steps() -> None:
    weight = np.arange(20, dtype=np.float32).reshape(5, 4)
    # pack (N=5, K=4) into (N/2 rounded up, K, 2) with padding, then unpack
    packed = apply_layout(weight, [LayoutStep("pad", ((0, 1), (0, 0))), LayoutStep("reshape", (3, 2, 4)),
                                   LayoutStep("transpose", (0, 2, 1))])
    assert packed.shape == (3, 4, 2) and packed.flags.c_contiguous
    assert packed[1, 3, 0] == weight[2, 3]
    back = apply_layout(packed, [LayoutStep("transpose", (0, 2, 1)), LayoutStep("reshape", (6, 4)),
                                 LayoutStep("slice", (5, 4)), LayoutStep("astype", ("float64",))])
    np.testing.assert_array_equal(back, weight.astype(np.float64))


# -- shared-library artifacts (C compiled with the system compiler) ---------------------------------------------

C_SOURCE = r"""
#include <stdint.h>
/* at: A transposed (8 x 4), out_t: the output transposed (8 x 4) */
void twice_transposed(const float *at, float *out_t) {
    for (int i = 0; i < 32; ++i) out_t[i] = at[i] * 2.0f;
}
int32_t failing(const float *at, float *out_t) { return 3; }
"""


@pytest.fixture(scope="module")
def shared_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    library = compile_c_library(C_SOURCE, tmp_path_factory.mktemp("ckernel"))
    if library is None:
        pytest.skip("no C compiler")
    return library


TRANSPOSE = (LayoutStep("transpose", (1, 0)),)


def _c_artifact(code: bytes, name: str, layouts: bool, status: bool = False) -> BuildArtifact:
    layout = TRANSPOSE if layouts else ()
    return BuildArtifact(code, "shared-library", name, (
        KernelArg(TensorSpec((8, 4) if layouts else (4, 8), "float32"), "input", 0, layout),
        KernelArg(TensorSpec((8, 4) if layouts else (4, 8), "float32"), "output", 0, layout),
    ), returns_status=status)


def test_shared_library_kernel_with_input_and_output_layouts(runner: LocalRunner, shared_library: bytes) -> None:
    task = DoublingTask()
    good = runner.run(task, _c_artifact(shared_library, "twice_transposed", layouts=True))  # type: ignore[arg-type]
    assert good.error_kind is None, good.error_msg
    # Declared without its output layout, the transposed buffer is compared as if it were in A's layout: the
    # check must fail, which shows the layout steps are really applied.
    artifact = BuildArtifact(shared_library, "shared-library", "twice_transposed", (
        KernelArg(TensorSpec((8, 4), "float32"), "input", 0, TRANSPOSE),
        KernelArg(TensorSpec((4, 8), "float32"), "output", 0),
    ))
    wrong = runner.run(task, artifact)  # type: ignore[arg-type]
    assert wrong.error_kind is ErrorKind.WRONG_RESULT


def test_nonzero_status_is_a_runtime_error(runner: LocalRunner, shared_library: bytes) -> None:
    result = runner.run(DoublingTask(), _c_artifact(shared_library, "failing", True, status=True))  # type: ignore[arg-type]
    assert result.error_kind is ErrorKind.RUNTIME_ERROR and "status 3" in result.error_msg


def test_missing_symbol_is_a_load_error(runner: LocalRunner, shared_library: bytes) -> None:
    result = runner.run(DoublingTask(), _c_artifact(shared_library, "no_such_kernel", True))  # type: ignore[arg-type]
    assert result.error_kind is ErrorKind.COMPILE_ERROR and "load" in result.error_msg


# -- kernels from the compiler's own code generator ----------------------------------------------------------------


def test_runs_loop_nest_kernels_from_the_llvm_code_generator(runner: LocalRunner) -> None:
    from relay_tune.codegen import llvm as codegen
    from relay_tune.codegen import reference_kernels as kernels
    from relay_tune.target import Target

    func = kernels.packed_matmul(32, 64, 16, mr=8, nr=32, k_unroll=4, name="pm")
    code = codegen.compile_object([func], Target.host())
    specs = [TensorSpec(tuple(p.shape), p.dtype) for p in func.params]
    artifact = BuildArtifact(code, "elf-object", "pm", (
        KernelArg(specs[0], "input", 0), KernelArg(specs[1], "input", 1), KernelArg(specs[2], "output", 0),
    ), requires_libraries=("libgomp.so.1",), repeat_symbol="pm__repeat")
    task = MatmulTask(32, 64, 16)  # the same workload: its numpy reference checks the generated kernel
    result = runner.run(task, artifact)
    assert result.error_kind is None, result.error_msg


def test_unknown_code_format_is_a_load_error(runner: LocalRunner, tmp_path: Path) -> None:
    artifact = BuildArtifact(b"", "wasm", "k", ())  # type: ignore[arg-type]
    result = runner.run(DoublingTask(), artifact)  # type: ignore[arg-type]
    assert result.error_kind is ErrorKind.COMPILE_ERROR
