"""Layout transform kernels between NCHW and NCHW{b}c (and between two block sizes): the injective family's
"transpose" mode, compiled and compared with the reference interpreter, on odd map sizes and channel counts.

The mode splits the channel axis by the block so that every index of the vectorized loop is affine in its lanes;
each kernel's vectorized accesses are checked to be whole vectors or constant-stride ones (no per-lane division).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from relay_tune.codegen import affine
from relay_tune.codegen.llvm import emit_assembly
from relay_tune.compile import resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.kernel import tir
from relay_tune.kernel.analysis import fold
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types

HOST = resolve_target("llvm -num-cores=2")

TRANSFORMS = [  # input shape, source layout, destination layout
    ((1, 3, 13, 17), "NCHW", "NCHW3c"),          # the RGB image into a stem convolution
    ((1, 3, 7, 7), "NCHW", "NCHW3c"),
    ((1, 32, 7, 7), "NCHW", "NCHW16c"),
    ((1, 48, 13, 17), "NCHW", "NCHW16c"),
    ((1, 24, 7, 7), "NCHW", "NCHW8c"),
    ((1, 40, 13, 17), "NCHW", "NCHW8c"),
    ((1, 64, 28, 28), "NCHW", "NCHW16c"),        # large enough to run in parallel
    ((1, 2, 7, 7, 16), "NCHW16c", "NCHW"),
    ((1, 3, 13, 17, 16), "NCHW16c", "NCHW"),
    ((1, 5, 7, 7, 8), "NCHW8c", "NCHW"),        # C = 40
    ((1, 3, 13, 17, 8), "NCHW8c", "NCHW"),      # C = 24
    ((1, 4, 28, 28, 16), "NCHW16c", "NCHW"),
    ((1, 2, 13, 17, 16), "NCHW16c", "NCHW8c"),
    ((1, 3, 7, 7, 16), "NCHW16c", "NCHW8c"),
    ((1, 4, 7, 7, 8), "NCHW8c", "NCHW16c"),
    ((1, 6, 13, 17, 8), "NCHW8c", "NCHW16c"),
]


def transform_task(shape: tuple[int, ...], src: str, dst: str, body: str = "") -> RelayTuneTask:
    expr = f"layout_transform(%x, src_layout=\"{src}\", dst_layout=\"{dst}\")"
    source = (f"#[version = \"0.0.5\"]\ndef @main(%x: Tensor[{shape}, float32]) {{\n  "
              f"{body.replace('$', expr) if body else expr}\n}}\n")
    (task,) = tasks_from_module(infer_types(parse_module(source)), HOST)
    return task


def transpose_configs(task: RelayTuneTask) -> list[Any]:
    """The default config, then every transpose-mode combination of `lanes` and `unroll` (1, 4) on and off the
    parallel loop."""
    default = task.default_config()
    space = task.space
    configs = [default]
    for lanes, unroll, parallel in itertools.product(space.knob("lanes").values(), (1, 4),
                                                     space.knob("parallel").values()):
        config = default.replace(mode="transpose", lanes=lanes, unroll=unroll, parallel=parallel)
        if config != default:
            configs.append(config)
    return configs


def check(task: RelayTuneTask, configs: list[Any]) -> None:
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(spec.shape).astype(spec.dtype) for spec in task.input_specs()]
    expected = task.reference(inputs)
    assert expected is not None
    for config in configs:
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
        np.testing.assert_array_equal(got, expected[0], err_msg=f"{task.description} {config}")


def vector_strides(func: tir.PrimFunc) -> list[int | None]:
    """The lane stride of every load and store inside a vectorized loop (None: not a constant, a per-lane index)."""
    strides: list[int | None] = []

    def walk(stmt: tir.Stmt, extents: dict[tir.LoopVar, int], vector: tir.LoopVar | None) -> None:
        if isinstance(stmt, tir.For):
            inner = {**extents, stmt.var: stmt.extent}
            walk(stmt.body, inner, stmt.var if stmt.kind is tir.ForKind.VECTORIZED else vector)
        elif isinstance(stmt, tir.Seq):
            for s in stmt.stmts:
                walk(s, extents, vector)
        elif isinstance(stmt, tir.IfThenElse):
            walk(stmt.then_body, extents, vector)
            if stmt.else_body is not None:
                walk(stmt.else_body, extents, vector)
        elif isinstance(stmt, tir.Allocate):
            walk(stmt.body, extents, vector)
        elif isinstance(stmt, tir.Store) and vector is not None:
            strides.append(affine.lane_stride(stmt.indices, stmt.buffer.shape, vector, extents))
            loads: list[tir.Load] = []
            fold(stmt.value, lambda node, _kids: loads.append(node) if isinstance(node, tir.Load) else None)
            strides.extend([affine.lane_stride(ld.indices, ld.buffer.shape, vector, extents) for ld in loads])

    walk(func.body, {}, None)
    return strides


@pytest.mark.parametrize(("shape", "src", "dst"), TRANSFORMS)
def test_transform_matches_reference(shape: tuple[int, ...], src: str, dst: str) -> None:
    task = transform_task(shape, src, dst)
    assert task.family == "injective"
    default = task.default_config()
    assert default["mode"] == "transpose"
    configs = transpose_configs(task)
    check(task, configs)
    for config in configs:  # vectorized, every access a vector or a constant stride: no division per lane
        strides = vector_strides(task.lower(config))
        assert strides and None not in strides, f"{config}: {strides}"


@pytest.mark.parametrize(("shape", "src", "dst"), [TRANSFORMS[3], TRANSFORMS[8], TRANSFORMS[12]])
def test_random_configs_of_the_space(shape: tuple[int, ...], src: str, dst: str) -> None:
    """The other modes stay in the space (a log's records keep applying) and compute right too."""
    task = transform_task(shape, src, dst)
    rng = np.random.default_rng(3)
    configs = [task.space.sample(rng) for _ in range(4)]
    check(task, configs)


def test_reblocking_is_contiguous_on_both_sides() -> None:
    """NCHW16c <-> NCHW8c: the smaller block is the vector, read and written whole; no gather nor scatter."""
    for shape, src, dst in (((1, 2, 13, 17, 16), "NCHW16c", "NCHW8c"), ((1, 4, 7, 7, 8), "NCHW8c", "NCHW16c")):
        task = transform_task(shape, src, dst)
        func = task.lower(task.default_config())
        assert set(vector_strides(func)) == {1}
        code = emit_assembly([func], HOST).lower()
        assert "gather" not in code and "scatter" not in code
        assert "ymm" in code or "xmm" in code  # the 8 lanes of a block as one vector register


def test_space_of_a_transform() -> None:
    task = transform_task((1, 3, 13, 17), "NCHW", "NCHW3c")
    assert "transpose" in task.space.knob("mode").values()
    assert list(task.space.knob("lanes").values()) == ["block", "columns"]
    reblock = transform_task((1, 2, 7, 7, 16), "NCHW16c", "NCHW8c")
    assert list(reblock.space.knob("lanes").values()) == ["block"]
    # other modes keep one config per (mode, vector, parallel): lanes and unroll only vary under "transpose"
    flat = task.default_config().replace(mode="flat", lanes="columns")
    assert not task.space.is_valid(flat)


@pytest.mark.parametrize(("shape", "src", "dst", "body"), [
    ((1, 32, 7, 7), "NCHW", "NCHW16c", "nn.relu($)"),
    ((1, 3, 13, 17, 16), "NCHW16c", "NCHW", "nn.relu($)"),
    ((1, 2, 13, 17, 16), "NCHW16c", "NCHW8c", "clip($, a_min=0f, a_max=6f)"),
])
def test_transform_fused_with_an_elementwise_op(shape: tuple[int, ...], src: str, dst: str, body: str) -> None:
    """An epilogue fused after the transform keeps the transpose schedule (the relation is told from shapes)."""
    task = transform_task(shape, src, dst, body)
    assert task.default_config()["mode"] == "transpose"
    check(task, transpose_configs(task))
    assert None not in vector_strides(task.lower(task.default_config()))


def test_concatenation_into_nchw() -> None:
    """SqueezeNet's fire modules: two NCHW16c branches concatenated and transformed to NCHW in one kernel."""
    source = """#[version = "0.0.5"]
def @main(%a: Tensor[(1, 2, 13, 13, 16), float32], %b: Tensor[(1, 2, 13, 13, 16), float32]) {
  layout_transform(concatenate((%a, %b), axis=1), src_layout="NCHW16c", dst_layout="NCHW")
}"""
    (task,) = tasks_from_module(infer_types(parse_module(source)), HOST)
    assert task.default_config()["mode"] == "transpose"
    check(task, transpose_configs(task))


def test_packing_a_concatenation_keeps_the_rows_mode() -> None:
    """Into NCHW16c from several inputs (ShuffleNet's concatenation + channel shuffle), a block's lanes come from
    different inputs: no transpose mode there, its vector along the block measured slower than the "rows" mode."""
    source = """#[version = "0.0.5"]
def @main(%a: Tensor[(1, 16, 7, 7), float32], %b: Tensor[(1, 16, 7, 7), float32]) {
  layout_transform(concatenate((%a, %b), axis=1), src_layout="NCHW", dst_layout="NCHW16c")
}"""
    (task,) = tasks_from_module(infer_types(parse_module(source)), HOST)
    assert "transpose" not in task.space.knob("mode").values()
    assert task.default_config()["mode"] == "rows"
    check(task, [task.default_config()])
