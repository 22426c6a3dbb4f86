"""Kernels timed in their model context (`relay_tune.runtime.context`): before every timed call a parallel producer
step rewrites the kernel's activation inputs from a saved copy, and only the kernel's own time is summed. The step
must really run between timed calls, and must leave the inputs the correctness check used."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import relay_tune
from relay_tune.runtime.context import (
    COPY,
    EVICT,
    READ,
    ContextLoop,
    _cpus,
    context_ir,
    context_loop,
    private_cache_bytes,
    production,
    scratch,
    team_size,
)
from relay_tune.text import parse_module
from relay_tune.tuning import BuildArtifact, ErrorKind, KernelArg, LocalRunner, TensorSpec, apply_layout
from relay_tune.tuning.relay_task import tasks_from_module
from relay_tune.tuning.runner import (
    DEFAULT_TOLERANCES,
    OUTPUT_CONTEXT,
    PRIVATE_EVICT_FACTOR,
    PRODUCER_SHIFT,
    KernelLoader,
    OutputContext,
    TimingOptions,
    WeightCopies,
    _prepare,
    _produced_positions,
    _Timed,
    context_step,
    random_inputs,
)
from relay_tune.tuning.testing import DoublingTask, compile_c_library
from relay_tune.tuning.tune_model import default_runner


@pytest.mark.parametrize("size", [1, 63, 64, 65, 4097, 100_003])
def test_the_producer_step_writes_each_buffer_back_from_its_saved_copy(size: int) -> None:
    rng = np.random.default_rng(size)
    block = rng.standard_normal(size + 3).astype("float32")
    buffer = block[1:size + 1]  # not on a cache line, not a whole number of lines
    original, guard = buffer.copy(), (block[0], block[-2], block[-1])
    step = production([buffer, np.empty(0, "float32")])
    assert len(step.table) == 1  # the empty buffer is left out
    buffer[:] = 0.0
    context_loop().produce(step)
    assert np.array_equal(buffer, original)
    assert (block[0], block[-2], block[-1]) == guard  # nothing written outside the buffer


def test_the_producers_copies_are_volatile_so_llvm_keeps_them_in_the_caches() -> None:
    # a plain copy loop would become memcpy, whose large copies bypass the caches
    for parallel in (True, False):
        text = context_ir(parallel)
        # a line, a byte; and the scratch read, whose value nothing uses
        assert text.count("load volatile") == 3 and text.count("store volatile") == 2
        assert ("GOMP_parallel" in text) is parallel


def test_without_libgomp_the_calling_thread_writes_everything() -> None:
    serial = ContextLoop(parallel=False)
    buffer = np.random.default_rng(1).standard_normal(10_001).astype("float32")
    original = buffer.copy()
    step = production([buffer], shift=1)
    buffer[:] = 0.0
    serial.produce(step)
    assert np.array_equal(buffer, original)


def test_the_loop_runs_the_producer_before_every_call_and_rotates_the_argument_rows() -> None:
    x = np.random.default_rng(0).standard_normal(1001).astype("float32")
    original = x.copy()
    step = production([x])
    seen: list[tuple[int, bool]] = []

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
    def kernel(args: int, count: int) -> None:  # a "kernel" that ruins its input at every call
        seen.append((int(ctypes.cast(args, ctypes.POINTER(ctypes.c_uint64))[0]), np.array_equal(x, original)))
        x[:] = -1.0

    rows = np.array([[10], [11], [12]], dtype=np.uint64)
    spent = context_loop().run(kernel, rows, 1, 7, step)
    assert seen == [(r, True) for r in (11, 12, 10, 11, 12, 10, 11)]  # every call found its input restored
    assert spent > 0


CONV = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 24, 13, 11), float32], %w: Tensor[(40, 24, 3, 3), float32], %b: Tensor[(40), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=40, kernel_size=[3, 3]);
  %1 = nn.bias_add(%0, %b);
  nn.relu(%1)
}
"""


def _conv_task() -> object:
    rng = np.random.default_rng(3)
    mod = relay_tune.bind_params(parse_module(CONV), {
        "w": rng.uniform(-1, 1, (40, 24, 3, 3)).astype("float32"),
        "b": rng.uniform(-1, 1, (40,)).astype("float32"),
    })
    (task,) = [t for t in tasks_from_module(mod, "llvm") if "conv2d" in t.description]
    return task


@pytest.mark.parametrize("cold_bytes", [0, 1 << 20])
def test_a_kernel_timed_in_context_keeps_its_inputs_and_still_passes_the_check(cold_bytes: int) -> None:
    """In this process, as the measurement worker does it: check, time in context (weights warm, or rotating), then
    the activation input still holds the checked values and the kernel still computes the reference."""
    task = _conv_task()
    artifact = task.build(task.space.sample(np.random.default_rng(5)))
    inputs = random_inputs(task.input_specs(), 0)
    expected = [np.asarray(e) for e in task.reference([a.copy() for a in inputs])]
    loader = KernelLoader()
    function, repeat_entry = loader.load(artifact)
    assert repeat_entry is not None
    weights = set(task.weight_inputs)
    timing = TimingOptions(number=3, repeat=2, min_repeat_ms=1.0, cold_weights_bytes=cold_bytes)
    assert timing.in_context  # the runner's default
    timed = _prepare(artifact, function, repeat_entry, inputs, expected, DEFAULT_TOLERANCES, timing,
                     loader.prologue, sorted(weights), WeightCopies(), task.key)
    assert isinstance(timed, _Timed), timed
    costs = [timed.time_repeat(warm_call=True) for _ in range(3)]
    assert all(c > 0 for c in costs)
    buffers = timed.keep[0]
    (produced,) = _produced_positions(artifact, weights, {})
    assert np.array_equal(buffers[produced], apply_layout(inputs[artifact.args[produced].index].copy(),
                                                          artifact.args[produced].layout))
    (out,) = [p for p, a in enumerate(artifact.args) if a.role == "output"]
    buffers[out][...] = np.nan
    function(*[b.ctypes.data for b in buffers])
    np.testing.assert_allclose(apply_layout(buffers[out], artifact.args[out].layout), expected[0],
                               rtol=1e-4, atol=1e-4)
    loader.release()


def test_the_tuners_runner_times_in_context_and_its_results_pass_the_check() -> None:
    task = _conv_task()
    with default_runner() as runner:
        assert runner.timing.in_context
        artifacts = [task.build(task.space.sample(np.random.default_rng(s))) for s in (1, 2)]
        for result in [runner.run(task, artifacts[0]), *runner.run_batch(task, artifacts)]:
            assert result.error_kind is None, result.error_msg
            assert result.costs is not None and len(result.costs) == 3 and min(result.costs) > 0


# -- a kernel that ruins its input: only the producer step between calls lets it run twice ---------------------

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
void doubled_ruin(const float *in, float *out) {
    if (in[0] != in[0]) abort();         /* NaN: the input ruined by the previous call was not written back */
    for (int i = 0; i < 32; ++i) out[i] = in[i] * 2.0f;
    ((float *)in)[0] = __builtin_nanf("");
}
void doubled_ruin__repeat(void **args, int64_t n) {
    for (int64_t i = 0; i < n; ++i) doubled_ruin(args[0], args[1]);
}
"""


@pytest.fixture(scope="module")
def ruinous_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    library = compile_c_library(C_SOURCE, tmp_path_factory.mktemp("ruin"), "-O1")
    if library is None:
        pytest.skip("no C compiler")
    return library


def test_the_runner_writes_the_inputs_back_between_every_two_timed_calls(ruinous_library: bytes) -> None:
    artifact = BuildArtifact(ruinous_library, "shared-library", "doubled_ruin", (
        KernelArg(TensorSpec((4, 8), "float32"), "input", 0), KernelArg(TensorSpec((4, 8), "float32"), "output", 0),
    ), repeat_symbol="doubled_ruin__repeat")
    task = DoublingTask("doubled")
    options = {"timeout": 10.0, "number": 5, "repeat": 3, "min_repeat_ms": 2.0}
    with LocalRunner(**options) as runner:  # type: ignore[arg-type]
        result = runner.run(task, artifact)  # type: ignore[arg-type]
        assert result.error_kind is None, result.error_msg  # checked, then thousands of calls, each on good input
        assert result.costs is not None and len(result.costs) == 3
    with LocalRunner(in_context=False, **options) as back_to_back:  # type: ignore[arg-type]
        result = back_to_back.run(task, artifact)  # type: ignore[arg-type]
        assert result.error_kind is ErrorKind.RUNTIME_ERROR  # the second call found the input the first one ruined


@pytest.mark.parametrize(("chunk", "shift"), [(0, 0), (0, 1), (128, 1), (4096, 0), (64, 3)])
def test_any_split_of_the_producer_writes_every_byte_and_eviction_changes_nothing(chunk: int, shift: int) -> None:
    rng = np.random.default_rng(chunk + shift)
    for size in (1, 65, 4097, 100_003):
        buffer, evicted = rng.standard_normal(size).astype("float32"), rng.standard_normal(size + 5)
        original, kept = buffer.copy(), evicted.copy()
        step = production([buffer], chunk=chunk, shift=shift, evicted=[evicted[3:]])
        buffer[:] = 0.0
        context_loop().produce(step)
        assert np.array_equal(buffer, original) and np.array_equal(evicted, kept)
    with pytest.raises(ValueError, match="whole number of 64-byte lines"):
        production([buffer], chunk=100)


@pytest.mark.parametrize("parallel", [True, False])
def test_aging_the_outputs_reads_scratch_first_and_writes_nothing_but_the_inputs(parallel: bool) -> None:
    loop = context_loop() if parallel else ContextLoop(parallel=False)
    rng = np.random.default_rng(7)
    block = rng.standard_normal(100_010).astype("float32")
    buffer, output = block[1:100_001], rng.standard_normal(5003)
    original, kept, guard = buffer.copy(), output.copy(), (block[0], *block[100_001:])
    step = production([buffer], shift=1, evicted=[output[:2500]], private_evict=3000)  # not whole lines
    assert step.table[0, 5] == READ  # the scratch first, so the inputs written after it stay in the caches
    region = scratch(3000, team_size())
    assert step.table[0, 1] == region.ctypes.data and region.ctypes.data % 64 == 0
    assert region.nbytes == 3008 * team_size() and step.table[0, 3] == 3008  # a region of whole lines per thread
    before = region.copy()
    buffer[:] = 0.0
    loop.produce(step)
    assert np.array_equal(buffer, original) and (block[0], *block[100_001:]) == guard
    assert np.array_equal(output, kept) and np.array_equal(region, before)  # evicted or read, never written


def test_the_private_cache_size_and_cpu_lists() -> None:
    assert _cpus("0-3,8\n") == {0, 1, 2, 3, 8} and _cpus("5") == {5}
    size = private_cache_bytes()
    assert size >= 64 << 10 and size % 64 == 0


@pytest.mark.parametrize("outputs_in", ["flushed", "private", "half_flushed"])
def test_each_output_context_evicts_or_ages_the_outputs(outputs_in: OutputContext) -> None:
    task = _conv_task()
    artifact = task.build(task.default_config())
    buffers = [np.zeros(a.spec.shape, a.spec.dtype) for a in artifact.args]
    weights = set(task.weight_inputs)
    step = context_step(artifact, buffers, weights, {}, outputs_in)
    (out,) = [b for a, b in zip(artifact.args, buffers) if a.role == "output"]
    written = {int(r[1]) for r in step.table if r[5] == COPY}
    assert written == {buffers[p].ctypes.data for p in _produced_positions(artifact, weights, {})}
    evicted = [(int(r[1]), int(r[2])) for r in step.table if r[5] == EVICT]
    reads = [r for r in step.table if r[5] == READ]
    if outputs_in == "flushed":
        assert evicted in ([(out.ctypes.data, out.nbytes)], []) and not reads
    else:
        assert len(reads) == 1 and int(reads[0][3]) >= PRIVATE_EVICT_FACTOR * private_cache_bytes()
        half = [(out.ctypes.data, out.size // 2 * out.itemsize)]
        assert evicted in ((half, []) if outputs_in == "half_flushed" else ([],))
    original = [b.copy() for b in buffers]
    context_loop().produce(step)
    assert all(np.array_equal(a, b) for a, b in zip(original, buffers))


def test_the_runners_step_writes_the_activations_and_evicts_the_outputs() -> None:
    task = _conv_task()
    artifact = task.build(task.default_config())
    buffers = [np.zeros(a.spec.shape, a.spec.dtype) for a in artifact.args]
    weights = set(task.weight_inputs)
    step = context_step(artifact, buffers, weights, {})
    written = {int(r[1]) for r in step.table if r[5] == COPY}
    assert written == {buffers[p].ctypes.data for p in _produced_positions(artifact, weights, {})}
    assert all(r[4] == PRODUCER_SHIFT for r in step.table if r[5] == COPY)
    # the default treats the outputs as `OUTPUT_CONTEXT` says (the test above checks each treatment)
    chosen = context_step(artifact, buffers, weights, {}, OUTPUT_CONTEXT)
    assert np.array_equal(step.table[:, 1:], chosen.table[:, 1:])  # all but the saved copies' addresses
