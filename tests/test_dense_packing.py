"""The run-time packing kernel (`relay_tune.compile.tasks.packing_kernel`, scheduled by
`LayoutTransform.pack_schedule`): every packed array equals numpy's (odd shapes, axes that are not multiples of
the panel width, padding), its loops are parallel and read the source a block at a time, and the model and the
tuner's runner run it alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.codegen.llvm import build_llvm
from relay_tune.compile import resolve_target
from relay_tune.compile.tasks import packing_kernel
from relay_tune.interpreter import Interpreter
from relay_tune.kernel import analysis, tir
from relay_tune.kernel.schedule import PACK_BLOCK, PACK_PARALLEL_MIN_ELEMENTS, LayoutTransform
from relay_tune.kernel.tir_eval import evaluate
from relay_tune.records.log_format import TuningRecord, append_lines
from relay_tune.records.measure import MeasureResult
from relay_tune.runtime.model import PACKING_TASK
from relay_tune.target import Target
from relay_tune.text import parse_module
from relay_tune.tuning import LocalRunner
from relay_tune.tuning.relay_task import tasks_from_module

HOST = resolve_target("llvm")

# (source layout, packed layout, source shape): panel widths that do not divide their axis (padding), reduction
# lengths that are not a multiple of the read block, panels wider than the unrolled limit, a packed layout whose
# last axis is the source's innermost one (a contiguous copy), convolution weights and a tensor below the size that
# runs in parallel.
LAYOUTS = [
    ("NK", "NK16n", (1000, 1023)),
    ("NK", "NK32n", (45, 70)),
    ("NK", "NK48n", (100, 37)),
    ("NK", "NK36n", (81, 129)),
    ("NK", "NK64n", (130, 300)),
    ("NK", "NK8k", (33, 100)),
    ("NK", "KN", (100, 70)),
    ("OIHW", "OIHW8o", (20, 13, 3, 3)),
    ("OIHW", "OIHW4i8o", (10, 6, 3, 3)),
    ("OIHW", "OIHW16o", (70, 33, 1, 7)),
    ("HWIO", "OHWI8o", (3, 3, 12, 20)),
    ("NK", "NK16n", (5, 7)),
]


def loops(func: tir.PrimFunc) -> list[tir.For]:
    return [s for s in analysis.iter_stmts(func.body) if isinstance(s, tir.For)]


def kinds(func: tir.PrimFunc) -> set[tir.ForKind]:
    return {loop.kind for loop in loops(func)}


@pytest.fixture(scope="module")
def compiled() -> dict[str, object]:
    """Every layout's packing kernel, compiled once into one library."""
    funcs = [packing_kernel(LayoutTransform("w", "w.packed", src, dst, shape, "float32"), f"pack{i}", HOST)
             for i, (src, dst, shape) in enumerate(LAYOUTS)]
    library = build_llvm(funcs, HOST)
    return {f.name: library.get(f.name) for f in funcs}


@pytest.mark.parametrize("number", range(len(LAYOUTS)), ids=[f"{s}->{d}:{'x'.join(map(str, shape))}"
                                                             for s, d, shape in LAYOUTS])
def test_the_compiled_packing_equals_numpy(compiled: dict[str, object], number: int) -> None:
    src_layout, dst_layout, shape = LAYOUTS[number]
    lt = LayoutTransform("w", "w.packed", src_layout, dst_layout, shape, "float32")
    rng = np.random.default_rng(number)
    for _ in range(2):  # a second source into the same buffer: every element is written again, padding included
        source = rng.standard_normal(shape).astype(np.float32)
        out = np.full(lt.packed_shape, np.nan, np.float32)  # an element the kernel skips stays NaN
        compiled[f"pack{number}"](source, out)
        np.testing.assert_array_equal(out, lt.pack(source))


def test_the_loop_nest_interpreter_agrees_on_a_padded_transposition() -> None:
    lt = LayoutTransform("w", "w.packed", "NK", "NK48n", (100, 37), "float32")
    func = packing_kernel(lt, "pack", HOST)
    source = np.random.default_rng(1).standard_normal((100, 37)).astype(np.float32)
    out = np.full(lt.packed_shape, np.nan, np.float32)
    evaluate(func, source, out)
    np.testing.assert_array_equal(out, lt.pack(source))


def test_a_transposing_packing_runs_in_parallel_and_reads_rows_a_block_at_a_time() -> None:
    lt = LayoutTransform("b", "b.packed", "NK", "NK32n", (1024, 1024), "float32")
    func = packing_kernel(lt, "pack", HOST)
    nest = loops(func)
    assert nest[0].kind is tir.ForKind.PARALLEL and nest[0].extent == 1024 // 32  # one panel per iteration
    # innermost: the unrolled block of one source row (contiguous reads), inside the loop over the panel's rows
    assert nest[-1].kind is tir.ForKind.UNROLLED and nest[-1].extent == PACK_BLOCK
    assert nest[-2].extent == 32
    assert tir.ForKind.VECTORIZED not in kinds(func)  # no gathers: a gather per store is no faster than serial


def test_a_contiguous_packing_is_vectorized_and_small_ones_stay_on_one_thread() -> None:
    contiguous = packing_kernel(LayoutTransform("w", "w.packed", "NK", "NK16k", (512, 512), "float32"), "p", HOST)
    assert loops(contiguous)[-1].kind is tir.ForKind.VECTORIZED
    assert tir.ForKind.PARALLEL in kinds(contiguous)
    small = LayoutTransform("w", "w.packed", "NK", "NK16n", (16, 64), "float32")
    assert np.prod(small.packed_shape) < PACK_PARALLEL_MIN_ELEMENTS
    assert tir.ForKind.PARALLEL not in kinds(packing_kernel(small, "p", HOST))


def test_few_panels_fuse_with_the_row_blocks_to_feed_every_core() -> None:
    func = packing_kernel(LayoutTransform("w", "w.packed", "NK", "NK32n", (64, 2048), "float32"), "p", HOST)
    (parallel,) = [loop for loop in loops(func) if loop.kind is tir.ForKind.PARALLEL]
    assert parallel.extent == 2 * (2048 // PACK_BLOCK)  # 2 panels x 128 row blocks


def test_a_gpu_build_keeps_the_plain_loop_nest() -> None:
    lt = LayoutTransform("b", "b.packed", "NK", "NK32n", (256, 256), "float32")
    func = packing_kernel(lt, "pack", Target("cuda", arch="sm_80"))
    assert kinds(func) == {tir.ForKind.SERIAL}  # the GPU back end rejects CPU parallel loops


# ---------------------------------------------------------------------------------------------------------------------
# in a model and in the runner's measurement
# ---------------------------------------------------------------------------------------------------------------------

ODD_DENSE = """#[version = "0.0.5"]
def @main(%a: Tensor[(37, 203), float32], %b: Tensor[(171, 203), float32]) {
  nn.relu(nn.dense(%a, %b, units=171))
}
"""


@pytest.fixture(scope="module")
def task() -> object:
    (only,) = tasks_from_module(parse_module(ODD_DENSE), "llvm")
    return only


@pytest.fixture(scope="module")
def runner() -> Iterator[LocalRunner]:
    with LocalRunner(timeout=20.0, number=2, repeat=2, min_repeat_ms=1) as local:
        yield local


def test_the_runner_checks_a_packed_odd_dense_with_its_packing(task: object, runner: LocalRunner) -> None:
    # configs that pack the weight into panels of different widths (171 and 203 are multiples of none of them)
    rng = np.random.default_rng(0)
    by_width: dict[int, object] = {}
    for _ in range(200):
        config = task.space.sample(rng).replace(pack_b=True)
        if task.space.is_valid(config):
            by_width.setdefault(int(config["tile_n"][-1]), config)
    assert len(by_width) >= 2
    for width in sorted(by_width)[-2:]:
        artifact = task.build(by_width[width])
        assert artifact.prologue, "the weight input is packed before the kernel"
        result = runner.run(task, artifact)
        assert result.error_kind is None, result.error_msg  # outputs checked against the reference


def test_a_model_packs_an_odd_weight_input_in_parallel_every_run(task: object, tmp_path: Path) -> None:
    config = task.default_config().replace(pack_b=True)
    record = TuningRecord.from_measurement(task.key, task.target, config, MeasureResult((1e-5,)),
                                           description=task.description)
    log = tmp_path / "packed.jsonl"
    append_lines(log, [record.to_json()])
    mod = parse_module(ODD_DENSE)
    model = relay_tune.build(mod, target="llvm", logs=str(log), check_tuned=False)
    assert [c.task for c in model.plan.calls] == [PACKING_TASK, 0]
    rng = np.random.default_rng(5)
    for _ in range(2):  # a new weight each run is packed again
        a = rng.standard_normal((37, 203)).astype(np.float32)
        b = rng.standard_normal((171, 203)).astype(np.float32)
        want = np.asarray(Interpreter(mod).run({"a": a, "b": b}))
        np.testing.assert_allclose(want, np.maximum(a @ b.T, 0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(model.run(a=a, b=b), want, rtol=1e-4, atol=1e-4)
