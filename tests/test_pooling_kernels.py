"""Pooling kernels with and without element-wise epilogues, float32 and uint8, NCHW and NCHW8c.

- every config of a pooling kernel's space (vector tile, padded copy or guard, parallel) equals the reference
  interpreter on odd shapes (widths that are no multiple of the lanes, padding, strides, ceil_mode), float32 and
  uint8 input, plain and with an epilogue (a quantize to uint8 after a float pool, a relu after a uint8 one);
- whole builds with a dequantize + quantize epilogue after a uint8 pool (what `QuantizedPooling` leaves) equal it;
- the kernel tile is as wide as the type the kernel computes in: a float pool with a quantizing epilogue is one
  float32 vector per channel block (not a uint8 vector, which left it scalar); a uint8 NCHW8c pool on a target whose
  vector holds more than one block takes several output columns per vector;
- ResNet-50's stem pool (NCHW8c, 3x3 stride 2) compiles to vector max operations for float32 input with a quantizing
  epilogue, uint8 input, and uint8 input with a dequantize + quantize epilogue.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import relay_tune
from relay_tune.codegen.llvm import emit_llvm_ir
from relay_tune.compile import resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.interpreter import Interpreter
from relay_tune.ir import IRModule
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import RelayTuneTask, tasks_from_module
from relay_tune.type_infer import infer_types

HOST = resolve_target("llvm -num-cores=2")
AVX512 = resolve_target("llvm -mcpu=skylake-avx512 -num-cores=2")

POOLS = {
    "max s2 pad": 'nn.max_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], layout="{L}")',
    "max s1 pad": 'nn.max_pool2d(%x, pool_size=[3, 3], strides=[1, 1], padding=[1, 1, 1, 1], layout="{L}")',
    "max ceil": 'nn.max_pool2d(%x, pool_size=[2, 2], strides=[2, 2], layout="{L}", ceil_mode=True)',
    "avg s2 pad": 'nn.avg_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], layout="{L}")',
    "global max": 'nn.global_max_pool2d(%x, layout="{L}")',
    "global avg": 'nn.global_avg_pool2d(%x, layout="{L}")',
}
# after a float32 pool: onnxruntime's QuantizeLinear to uint8 (scale 1/20, zero point 3), as the importer writes it
QUANTIZE = '''
  %1 = divide(%0, 0.05f);
  %2 = round(%1);
  %3 = add(%2, 3f);
  %4 = clip(%3, a_min=0f, a_max=255f);
  cast(%4, dtype="uint8")'''
# after a uint8 pool: dequantize, then quantize to other parameters (with equal ones, QuantizedPooling's epilogue,
# SimplifyRequantize finds the identity and the kernel is a plain uint8 pool)
REQUANTIZE = '''
  %1 = cast(%0, dtype="float32");
  %2 = subtract(%1, 3f);
  %3 = multiply(%2, 0.05f);
  %4 = divide(%3, 0.07f);
  %5 = round(%4);
  %6 = add(%5, 5f);
  %7 = clip(%6, a_min=0f, a_max=255f);
  cast(%7, dtype="uint8")'''
SHAPES = {"NCHW": (1, 5, 13, 11), "NCHW8c": (2, 3, 11, 13, 8)}


def pool_module(pool: str, layout: str, dtype: str, epilogue: str = "", shape: tuple[int, ...] | None = None
                ) -> IRModule:
    shape = shape or SHAPES[layout]
    body = f"%0 = {POOLS[pool].format(L=layout)};{epilogue or chr(10) + '  %0'}"
    source = f'#[version = "0.0.5"]\ndef @main(%x: Tensor[{shape}, {dtype}]) {{\n  {body}\n}}\n'
    return infer_types(parse_module(source))


def data(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random non-zero values; uint8 over its whole range (its extremes included), float32 around zero."""
    rng = np.random.default_rng(seed)
    if dtype == "uint8":
        x = rng.integers(1, 256, shape).astype(np.uint8)
        x.reshape(-1)[:3] = (0, 255, 0)
        return x
    return (rng.standard_normal(shape) * 4).astype(np.float32)


def pool_task(mod: IRModule, target: object = HOST) -> RelayTuneTask:
    tasks = list(tasks_from_module(mod, target))
    assert len(tasks) == 1 and tasks[0].family == "reduction", [t.description for t in tasks]
    return tasks[0]


def check(got: np.ndarray, want: np.ndarray, pool: str, message: str) -> None:
    assert got.dtype == want.dtype, message
    if want.dtype == np.float32 and "avg" in pool:  # a sum in another order: the last bits
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=message)
    elif "avg" in pool and want.dtype == np.uint8 and "float" in message:  # quantized sums: x.5 may round apart
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, message
    else:
        np.testing.assert_array_equal(got, want, err_msg=message)


@pytest.mark.parametrize("pool", list(POOLS))
@pytest.mark.parametrize("layout", ["NCHW", "NCHW8c"])
@pytest.mark.parametrize(("dtype", "epilogue"), [
    ("float32", ""), ("float32", QUANTIZE), ("uint8", ""), ("uint8", "\n  nn.relu(%0)")])
def test_every_config_matches_the_interpreter(pool: str, layout: str, dtype: str, epilogue: str) -> None:
    mod = pool_module(pool, layout, dtype, epilogue)
    task = pool_task(mod)
    x = data(dtype, SHAPES[layout])
    want = np.asarray(Interpreter(mod).run({"x": x}))
    configs = list(task.space.enumerate())
    assert task.default_config() in configs
    for config in configs:
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(x)
        check(np.asarray(got), want, pool, f"{task.description} {config} {dtype}")


@pytest.mark.parametrize("pool", ["max s2 pad", "max s1 pad", "max ceil", "global max"])
@pytest.mark.parametrize("layout", ["NCHW", "NCHW8c"])
@pytest.mark.parametrize("shape_index", [0, 1])
def test_requantizing_epilogue_after_a_uint8_pool_is_exact(pool: str, layout: str, shape_index: int) -> None:
    shape = [SHAPES[layout], (1, 2, 9, 7, 8) if layout == "NCHW8c" else (2, 3, 7, 9)][shape_index]
    mod = pool_module(pool, layout, "uint8", REQUANTIZE, shape)
    x = data("uint8", shape, seed=shape_index)
    want = np.asarray(Interpreter(mod).run({"x": x}))
    got = np.asarray(relay_tune.build(mod, "llvm", build_cache=False).run(x=x))
    np.testing.assert_array_equal(got, want)


def test_tile_is_as_wide_as_the_compute_type() -> None:
    lanes = HOST.vector_lanes("float32")
    stem = (1, 8, 112, 112, 8)
    quantized = pool_task(pool_module("max s2 pad", "NCHW8c", "float32", QUANTIZE, stem))
    assert quantized.default_config()["vector"] == min(8, lanes)  # float32 vectors, though the output is uint8
    requantized = pool_task(pool_module("max s2 pad", "NCHW8c", "uint8", REQUANTIZE, stem))
    assert requantized.default_config()["vector"] == min(8, lanes)
    plain = pool_task(pool_module("max s2 pad", "NCHW8c", "uint8", "", stem))
    # uint8 lanes hold several 8-channel blocks: whole blocks of as many output columns (the padded copy read)
    assert plain.default_config()["vector"] == HOST.vector_lanes("uint8")
    assert plain.default_config()["pad"] == "root"
    wide = pool_task(pool_module("max s2 pad", "NCHW8c", "uint8", "", stem), AVX512)
    assert wide.default_config()["vector"] == AVX512.vector_lanes("uint8")
    # a float32 block of 8 on AVX-512 (half a vector) stays one block per tile by default; two columns may be tuned
    half = pool_task(pool_module("max s2 pad", "NCHW8c", "float32", "", stem), AVX512)
    assert half.default_config()["vector"] == 8 and 16 in half.space.knob("vector").choices
    single = pool_task(pool_module("global max", "NCHW8c", "uint8", "", stem))  # one column: the block alone
    assert single.default_config()["vector"] == 8


@pytest.mark.parametrize(("dtype", "epilogue", "vector_max"), [
    ("float32", QUANTIZE, r"fcmp ogt <\d+ x float>"),
    ("uint8", "", r"icmp ugt <\d+ x i8>"),
    ("uint8", REQUANTIZE, r"icmp ugt <\d+ x i8>"),
])
def test_stem_pool_compiles_to_vector_max(dtype: str, epilogue: str, vector_max: str) -> None:
    task = pool_task(pool_module("max s2 pad", "NCHW8c", dtype, epilogue, (1, 8, 112, 112, 8)))
    ir = emit_llvm_ir([task.lower(task.default_config())], HOST)
    assert re.search(vector_max, ir), task.description  # the window's maximum on vectors, not lane by lane
