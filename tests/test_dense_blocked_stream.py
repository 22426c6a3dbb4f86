"""Dense products of a few rows by a streamed weight (a classifier over time steps: 32 x 1024 by 8210 x 1024): the
K-blocked default of `search_space.families.dense` and the column-tail code of the tiled order, checked against numpy
on random non-zero inputs of odd shapes (no tile divides the rows or the columns), as single kernels and inside
compiled models (against the reference interpreter)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import relay_tune
from relay_tune.codegen.llvm import emit_llvm_ir
from relay_tune.compile import bind_params, resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import Interpreter
from relay_tune.target import Target
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types
from search_space.families.common import inner_factor, split_value
from search_space.families.dense import BLOCK_BYTES, BLOCKED_MAX_ROWS, is_blocked_stream

HOST = resolve_target("llvm -num-cores=2")
AVX512 = resolve_target("llvm -mcpu=skylake-avx512 -num-cores=2")  # loop nests lowered, never run


def _source(m: int, n: int, k: int, epilogue: bool = False) -> str:
    body = "nn.relu(nn.bias_add(nn.dense(%x, %w), %b))" if epilogue else "nn.dense(%x, %w)"
    bias = f", %b: Tensor[({n}), float32]" if epilogue else ""
    return f"""#[version = "0.0.5"]
def @main(%x: Tensor[({m}, {k}), float32], %w: Tensor[({n}, {k}), float32]{bias}) {{
  {body}
}}"""


def _weights(n: int, k: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # uniform away from zero: a schedule that drops or repeats a term cannot hide behind a zero
    signs = rng.choice([-1.0, 1.0], size=(n, k))
    return {"w": (signs * rng.uniform(0.25, 1.0, (n, k))).astype(np.float32),
            "b": rng.uniform(-1.0, 1.0, n).astype(np.float32)}


def _task(m: int, n: int, k: int, target: Target, weight: np.ndarray) -> RelayTuneTask:
    mod = infer_types(bind_params(infer_types(parse_module(_source(m, n, k))), {"w": weight}))
    (task,) = tasks_from_module(mod, target, layout_planning=False, winograd="off")
    return task


def _run(task: RelayTuneTask, config: object, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    built = build_primitive(task.func, task.target_info, task.steps(config))  # type: ignore[arg-type]
    inputs = [w if i in task.weight_inputs else x for i in range(len(built.packing.input_shapes))]
    return np.asarray(built(*inputs))


@pytest.mark.parametrize("target", [HOST, AVX512], ids=["host", "avx512"])
def test_crnn_classifier_defaults_to_k_blocked_panels(target: Target) -> None:
    """32 x 1024 by 8210 x 1024 (8210 = 2 x 5 x 821: no panel width divides it): K-blocked, parallel over column
    panels, a weight block within `BLOCK_BYTES`; the config is a point of the tuning space and lowers."""
    m, n, k = 32, 8210, 1024
    task = _task(m, n, k, target, np.ones((n, k), np.float32))
    config = task.default_config()
    rows, columns = inner_factor(config, "tile_m"), inner_factor(config, "tile_n")
    assert is_blocked_stream(task.workload, rows, columns), dict(config)
    block = int(config["k_block"])  # type: ignore[arg-type]
    assert block and block * columns * 4 <= BLOCK_BYTES and 2 * block <= k, dict(config)
    assert config["parallel"] == 1 and config["order"] == "nm" and config["pack_b"], dict(config)
    task.space.validate(config)
    task.lower(config)


@pytest.mark.parametrize("m,n,k", [(1, 8210, 1024), (4, 8210, 1024), (BLOCKED_MAX_ROWS + 1, 4099, 512),
                                   (32, 37, 1001), (40, 6625, 120)])
def test_other_products_keep_the_tiled_order(m: int, n: int, k: int) -> None:
    """One row (the matrix-vector rule), one register tile of rows, more than `BLOCKED_MAX_ROWS` rows, a
    cache-resident weight, panels short enough for L1 (PP-OCRv4's classifier head): no K blocking."""
    task = _task(m, n, k, HOST, np.ones((n, k), np.float32))
    config = task.default_config()
    assert not is_blocked_stream(task.workload, inner_factor(config, "tile_m"), inner_factor(config, "tile_n"))
    assert not config.get("k_block"), dict(config)


def _blocked_configs(task: RelayTuneTask) -> list[object]:
    """The default and its neighbours in the K-blocked part of the space: every block length, row tiles of 1, 4
    and 7 rows, panels of one, two and three vectors, the reduction unrolled by 1, 3 (a tail in every block) and 4,
    serial and parallel; those the space rejects are left out."""
    default = task.default_config()
    lanes, dims = task.workload.lanes, task.workload.dims
    configs = []
    for block in task.space.knob("k_block").values():  # type: ignore[attr-defined]
        for rows, columns, unroll, parallel in [(4, lanes, 4, 1), (7, lanes, 3, 1), (1, 3 * lanes, 1, 0),
                                                (6, 2 * lanes, 4, 0)]:
            config = default.replace(k_block=block, tile_m=split_value(dims["m"], 1, rows),
                                     tile_n=split_value(dims["n"], 1, columns),
                                     tile_k=split_value(dims["k"], unroll), parallel=parallel)
            if task.space.is_valid(config):
                configs.append(config)
    return configs


@pytest.mark.parametrize("m,n,k", [(32, 1031, 263), (9, 2053, 257), (33, 821, 515), (BLOCKED_MAX_ROWS, 1031, 258)])
def test_blocked_schedules_of_odd_shapes_equal_numpy(m: int, n: int, k: int) -> None:
    """The K-blocked default and its neighbours on shapes where neither rows, columns, reduction nor block divide:
    the kernel equals numpy's product."""
    weights = _weights(n, k, seed=m + n + k)
    x = np.random.default_rng(k).uniform(0.5, 1.5, (m, k)).astype(np.float32)
    task = _task(m, n, k, HOST, weights["w"])
    assert task.default_config()["k_block"], dict(task.default_config())
    configs = _blocked_configs(task)
    assert len(configs) >= 4, "too few K-blocked configs of the space are valid"
    want = x.astype(np.float64) @ weights["w"].T.astype(np.float64)
    for config in [task.default_config(), *configs]:
        got = _run(task, config, x, weights["w"])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k), err_msg=str(dict(config)))


@pytest.mark.parametrize("m,n,k", [(32, 1031, 263), (17, 4099, 300)])
def test_compiled_few_row_dense_with_epilogue_matches_the_interpreter(m: int, n: int, k: int) -> None:
    """Whole models (dense, bias, ReLU: a scaled-down CRNN classifier) built untuned take the K-blocked default and
    equal the reference interpreter and numpy."""
    weights = _weights(n, k, seed=5 * n + k)
    mod = infer_types(parse_module(_source(m, n, k, epilogue=True)))
    task = _task(m, n, k, HOST, weights["w"])
    assert task.default_config()["k_block"], dict(task.default_config())
    x = np.random.default_rng(n).uniform(-1.0, 1.0, (m, k)).astype(np.float32)
    got = relay_tune.build(mod, HOST, params=weights).run(x=x)
    got = np.asarray(got[0] if isinstance(got, (list, tuple)) else got)
    want = np.asarray(Interpreter(mod).run({"x": x, **weights}))
    np.testing.assert_allclose(want, np.maximum(x @ weights["w"].T + weights["b"], 0.0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("m,n,k", [(32, 1031, 263), (30, 8210, 64)])
def test_column_tail_keeps_the_accumulator_tile_out_of_memory(m: int, n: int, k: int) -> None:
    """The tiled order parallel over panels and row tiles fused, with a column tail: the tail's guarded accesses
    to the accumulator tile (a stack buffer of each thread) are plain loads and blended stores, so LLVM promotes
    the tile to registers (no `alloca` of it is left after optimisation; a masked store to it kept the tile in
    memory and cost a store per FMA); and the kernel equals numpy."""
    weights = _weights(n, k, seed=n - k)
    x = np.random.default_rng(m).uniform(0.5, 1.5, (m, k)).astype(np.float32)
    task = _task(m, n, k, HOST, weights["w"])
    lanes = task.workload.lanes
    config = task.default_config().replace(k_block=0, parallel=2, tile_m=split_value(m, 1, 6),
                                           tile_n=split_value(n, 1, 2 * lanes))
    task.space.validate(config)
    assert n % (2 * lanes)  # a column tail (and, for 32 rows, a row tail)
    ir_text = emit_llvm_ir([task.lower(config)], HOST, optimize=True)
    assert not re.search(r"%\"?dense\.local[\w.]*\"? = alloca", ir_text), "the accumulator tile stayed in memory"
    got = _run(task, config, x, weights["w"])
    want = x.astype(np.float64) @ weights["w"].T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
