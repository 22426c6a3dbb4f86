"""LLVM CPU code generation: hand-built PrimFuncs compiled, JIT-loaded, run and compared with numpy."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from relay_tune.codegen import affine
from relay_tune.codegen.jit import (
    KernelArgumentError,
    KernelSignature,
    PythonThreadTeam,
    aligned_empty,
    python_thread_team,
    time_kernel,
)
from relay_tune.codegen.llvm import (
    build_llvm,
    codegen_options,
    compile_object,
    emit_assembly,
    emit_llvm_ir,
    load_object,
    required_libraries,
)
from relay_tune.codegen.reference_kernels import conv2d_nchwc, packed_matmul
from relay_tune.errors import CompileError, RelayTuneError, UnsupportedError
from relay_tune.kernel import tir
from relay_tune.kernel.tir import Buffer, Call, Cast, For, ForKind, LoopVar, PrimFunc, Select, Store
from relay_tune.target import Target

HOST = Target.host()
SERIAL_HOST = HOST.with_cores(1)
PARALLEL_HOST = HOST.with_cores(max(2, HOST.num_cores))
RNG = np.random.default_rng(0)
VEC = ForKind.VECTORIZED


def run(func: PrimFunc, *arrays: np.ndarray, target: Target = HOST, **kwargs: object) -> None:
    build_llvm([func], target, **kwargs).get(func.name)(*arrays)  # type: ignore[arg-type]


def random_array(shape: tuple[int, ...], dtype: str, low: float = -50, high: float = 50) -> np.ndarray:
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype.startswith("uint"):
        return RNG.integers(0, min(high, 255) if dtype == "uint8" else high, shape, endpoint=True).astype(dtype)
    if dtype.startswith("int"):
        info = np.iinfo(dtype)
        return RNG.integers(max(low, info.min), min(high, info.max), shape, endpoint=True).astype(dtype)
    return RNG.uniform(low, high, shape).astype(dtype)


def elementwise_1d(name: str, n: int, inputs: list[Buffer], outputs: list[tuple[Buffer, object]], kind: ForKind,
                   var: LoopVar) -> PrimFunc:
    stores = [Store(buf, (var,), value) for buf, value in outputs]  # type: ignore[arg-type]
    return PrimFunc(name, (*inputs, *(b for b, _ in outputs)), For(var, n, tir.seq(*stores), kind))


# ---------------------------------------------------------------------------------------------------
# elementwise arithmetic in every dtype
# ---------------------------------------------------------------------------------------------------

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8"]
FLOAT_DTYPES = ["float16", "float32", "float64"]


@pytest.mark.parametrize("kind", [ForKind.SERIAL, VEC])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES)
def test_elementwise_arithmetic_matches_numpy(dtype: str, kind: ForKind) -> None:
    n = 37
    i = LoopVar("i")
    a, b = Buffer("a", (n,), dtype), Buffer("b", (n,), dtype)
    ops = {
        "add": a[i] + b[i],
        "sub": a[i] - b[i],
        "mul": a[i] * b[i],
        "min": tir.minimum(a[i], b[i]),
        "max": tir.maximum(a[i], b[i]),
        "floordiv": a[i] // b[i],
        "floormod": a[i] % b[i],
    }
    if dtype.startswith("float"):
        ops["div"] = a[i] / b[i]
    outs = {name: Buffer(f"out_{name}", (n,), dtype) for name in ops}
    func = elementwise_1d(f"ew_{dtype}", n, [a, b], [(outs[k], v) for k, v in ops.items()], kind, i)
    x = random_array((n,), dtype)
    y = random_array((n,), dtype)
    y[y == 0] = 3  # no division by zero
    results = {k: np.zeros(n, dtype) for k in ops}
    run(func, x, y, *results.values())
    with np.errstate(over="ignore"):
        expected = {
            "add": x + y, "sub": x - y, "mul": x * y, "min": np.minimum(x, y), "max": np.maximum(x, y),
            "floordiv": x // y, "floormod": x % y, "div": x / y if dtype.startswith("float") else None,
        }
    for name, got in results.items():
        if dtype.startswith("float") and name in ("floordiv", "floormod", "div"):
            np.testing.assert_allclose(got, expected[name], rtol=2e-3 if dtype == "float16" else 1e-6,
                                       atol=0.05 if name == "floormod" and dtype == "float16" else 1e-5,
                                       err_msg=name)
        else:
            np.testing.assert_array_equal(got, expected[name], err_msg=name)


def test_bool_logic_and_comparisons() -> None:
    n = 37
    i = LoopVar("i")
    p, q = Buffer("p", (n,), "bool"), Buffer("q", (n,), "bool")
    x, y = Buffer("x", (n,), "int32"), Buffer("y", (n,), "int32")
    outs = [Buffer(f"o{k}", (n,), "bool") for k in range(5)]
    values = [
        tir.BinaryOp("and", p[i], q[i]),
        tir.BinaryOp("or", p[i], q[i]),
        tir.Not(p[i]),
        tir.BinaryOp("and", x[i] < y[i], tir.binary("ne", x[i], 0)),
        tir.BinaryOp("eq", x[i], y[i]),
    ]
    func = elementwise_1d("bools", n, [p, q, x, y], list(zip(outs, values)), VEC, i)
    pv, qv = random_array((n,), "bool"), random_array((n,), "bool")
    xv, yv = random_array((n,), "int32", -3, 3), random_array((n,), "int32", -3, 3)
    results = [np.zeros(n, bool) for _ in outs]
    run(func, pv, qv, xv, yv, *results)
    expected = [pv & qv, pv | qv, ~pv, (xv < yv) & (xv != 0), xv == yv]
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
@pytest.mark.parametrize("kind", [ForKind.SERIAL, VEC])
def test_floordiv_floormod_on_negatives(dtype: str, kind: ForKind) -> None:
    values = np.array([-7, -6, -5, -1, 0, 1, 5, 6, 7, -128 if dtype == "int8" else -100], dtype)
    divisors = np.array([3, -3, 2, -2, 5, -5, -2, 4, -7, 3], dtype)
    n = values.size
    i = LoopVar("i")
    a, d = Buffer("a", (n,), dtype), Buffer("d", (n,), dtype)
    q, r, qc, rc = (Buffer(name, (n,), dtype) for name in ("q", "r", "qc", "rc"))
    func = elementwise_1d(
        "divmod", n, [a, d],
        [(q, a[i] // d[i]), (r, a[i] % d[i]), (qc, a[i] // tir.IntImm(3, dtype)), (rc, a[i] % tir.IntImm(3, dtype))],
        kind, i,
    )
    outs = [np.zeros(n, dtype) for _ in range(4)]
    run(func, values, divisors, *outs)
    np.testing.assert_array_equal(outs[0], values // divisors)
    np.testing.assert_array_equal(outs[1], values % divisors)
    np.testing.assert_array_equal(outs[2], values // np.array(3, dtype))
    np.testing.assert_array_equal(outs[3], values % np.array(3, dtype))


def test_float_floormod_follows_divisor_sign() -> None:
    x = np.array([-7.5, -1.0, 0.0, 2.5, 7.25, -0.5], np.float32)
    y = np.array([2.0, -3.0, 1.5, -1.0, 2.0, 4.0], np.float32)
    n = x.size
    i = LoopVar("i")
    a, b, out = Buffer("a", (n,)), Buffer("b", (n,)), Buffer("out", (n,))
    got = np.zeros(n, np.float32)
    run(elementwise_1d("float_floormod", n, [a, b], [(out, a[i] % b[i])], VEC, i), x, y, got)
    np.testing.assert_allclose(got, np.mod(x, y), atol=1e-6)


def test_large_vectorized_loop_with_remainder_chunk() -> None:
    n = 1_000_003  # not a multiple of any vector width: exercises chunking plus a shorter last chunk
    i = LoopVar("i")
    a, b, c = Buffer("a", (n,)), Buffer("b", (n,)), Buffer("c", (n,))
    x, y = random_array((n,), "float32"), random_array((n,), "float32")
    got = np.zeros(n, np.float32)
    run(elementwise_1d("axpy", n, [a, b], [(c, a[i] * 2.0 + b[i])], VEC, i), x, y, got)
    np.testing.assert_allclose(got, x * 2 + y, rtol=1e-6)


def test_int8_vectorized_with_wraparound() -> None:
    n = 1_000_003
    i = LoopVar("i")
    a, b, c = Buffer("a", (n,), "int8"), Buffer("b", (n,), "int8"), Buffer("c", (n,), "int8")
    x, y = random_array((n,), "int8", -128, 127), random_array((n,), "int8", -128, 127)
    got = np.zeros(n, np.int8)
    run(elementwise_1d("i8", n, [a, b], [(c, a[i] * b[i] + 1)], VEC, i), x, y, got)
    np.testing.assert_array_equal(got, x * y + np.int8(1))


# ---------------------------------------------------------------------------------------------------
# casts and select
# ---------------------------------------------------------------------------------------------------


CAST_CASES = [
    ("float32", "int32", (-100, 100)),
    ("float32", "uint8", (0, 250)),
    ("float32", "int8", (-100, 100)),
    ("int32", "float32", (-1000, 1000)),
    ("int8", "int64", (-128, 127)),
    ("uint8", "int32", (0, 255)),
    ("uint8", "float32", (0, 255)),
    ("int64", "int8", (-100000, 100000)),
    ("int32", "uint8", (-1000, 1000)),
    ("float32", "bool", (-2, 2)),
    ("int32", "bool", (-2, 2)),
    ("bool", "float32", (0, 1)),
    ("bool", "int32", (0, 1)),
    ("float64", "float16", (-100, 100)),
    ("float16", "float32", (-100, 100)),
    ("float32", "float64", (-100, 100)),
    ("float64", "int64", (-1e6, 1e6)),
]


@pytest.mark.parametrize("kind", [ForKind.SERIAL, VEC])
def test_casts_match_numpy_astype(kind: ForKind) -> None:
    n = 37
    i = LoopVar("i")
    inputs, outputs, arrays, expected = [], [], [], []
    for k, (src, dst, (low, high)) in enumerate(CAST_CASES):
        a = Buffer(f"in{k}", (n,), src)
        inputs.append(a)
        outputs.append((Buffer(f"out{k}", (n,), dst), Cast(dst, a[i])))
        x = random_array((n,), src, low, high)
        if src.startswith("float") and dst in ("int32", "int8", "uint8", "int64"):
            x[:3] = np.array([-0.7, 0.7, 2.5], src) if dst != "uint8" else np.array([0.7, 1.5, 2.5], src)
        if src.startswith("float") and dst == "bool":
            x[:2] = 0.0
        arrays.append(x)
        with np.errstate(over="ignore", invalid="ignore"):
            expected.append(x.astype(dst))
    func = elementwise_1d("casts", n, inputs, outputs, kind, i)
    results = [np.zeros(n, dst) for _, dst, _ in CAST_CASES]
    run(func, *arrays, *results)
    for (src, dst, _), got, want in zip(CAST_CASES, results, expected):
        np.testing.assert_array_equal(got, want, err_msg=f"{src} -> {dst}")


def test_select_with_mixed_operands() -> None:
    n = 37
    i = LoopVar("i")
    a, b, out = Buffer("a", (n,)), Buffer("b", (n,)), Buffer("out", (n,))
    value = Select(a[i] > 0.0, a[i], b[i] * 2.0)
    index_dependent = Select(i < 10, Cast("float32", i), tir.FloatImm(-1.0))
    out2 = Buffer("out2", (n,))
    func = elementwise_1d("sel", n, [a, b], [(out, value), (out2, index_dependent)], VEC, i)
    x, y = random_array((n,), "float32"), random_array((n,), "float32")
    got, got2 = np.zeros(n, np.float32), np.zeros(n, np.float32)
    run(func, x, y, got, got2)
    np.testing.assert_array_equal(got, np.where(x > 0, x, y * 2))
    np.testing.assert_array_equal(got2, np.where(np.arange(n) < 10, np.arange(n), -1).astype(np.float32))


# ---------------------------------------------------------------------------------------------------
# intrinsics
# ---------------------------------------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


UNARY_REFERENCES = {
    "exp": (np.exp, (-80.0, 80.0)),
    "log": (np.log, (1e-30, 1e6)),
    "sqrt": (np.sqrt, (0.0, 1e4)),
    "rsqrt": (lambda v: 1.0 / np.sqrt(v), (1e-3, 1e4)),
    "tanh": (np.tanh, (-12.0, 12.0)),
    "erf": (_erf, (-5.0, 5.0)),
    "sigmoid": (lambda v: 1.0 / (1.0 + np.exp(-v)), (-30.0, 30.0)),
    "fabs": (np.abs, (-10.0, 10.0)),
    "floor": (np.floor, (-10.0, 10.0)),
    "ceil": (np.ceil, (-10.0, 10.0)),
    "round": (np.round, (-10.0, 10.0)),
}
TOLERANCE = {"float16": (2e-3, 1e-3), "float32": (3e-6, 1e-6), "float64": (1e-13, 1e-14)}


@pytest.mark.parametrize("kind", [ForKind.SERIAL, VEC])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_intrinsics_match_numpy(dtype: str, kind: ForKind) -> None:
    n = 1000 if kind is VEC else 37
    i = LoopVar("i")
    inputs, outputs, arrays = [], [], []
    for name, (_, (low, high)) in UNARY_REFERENCES.items():
        if dtype == "float16":
            low, high = max(low, -10.0), min(high, 10.0)
        x = Buffer(f"x_{name}", (n,), dtype)
        inputs.append(x)
        outputs.append((Buffer(f"y_{name}", (n,), dtype), Call(name, (x[i],), dtype)))
        values = RNG.uniform(low, high, n)
        if name == "log":
            values = np.exp(RNG.uniform(np.log(max(low, 1e-4 if dtype == "float16" else low)), np.log(high), n))
        if name == "round":
            values[:4] = [0.5, 1.5, 2.5, -0.5]
        arrays.append(values.astype(dtype))
    base, expo = Buffer("pb", (n,), dtype), Buffer("pe", (n,), dtype)
    inputs += [base, expo]
    outputs.append((Buffer("y_pow", (n,), dtype), Call("pow", (base[i], expo[i]), dtype)))
    outputs.append((Buffer("y_fma", (n,), dtype), Call("fma", (base[i], expo[i], base[i]), dtype)))
    arrays += [RNG.uniform(0.1, 4.0, n).astype(dtype), RNG.uniform(-3.0, 3.0, n).astype(dtype)]
    func = elementwise_1d(f"intrinsics_{dtype}", n, inputs, outputs, kind, i)
    results = [np.zeros(n, dtype) for _ in outputs]
    run(func, *arrays, *results)
    rtol, atol = TOLERANCE[dtype]
    for (name, (reference, _)), x, got in zip(UNARY_REFERENCES.items(), arrays, results):
        want = reference(x.astype(np.float64)).astype(dtype)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{name} {dtype}")
    b64, e64 = arrays[-2].astype(np.float64), arrays[-1].astype(np.float64)
    np.testing.assert_allclose(results[-2], (b64**e64).astype(dtype), rtol=rtol, atol=atol, err_msg="pow")
    np.testing.assert_allclose(results[-1], (b64 * e64 + b64).astype(dtype), rtol=rtol, atol=atol, err_msg="fma")


@pytest.mark.parametrize("kind", [ForKind.SERIAL, VEC])
def test_float32_math_special_values(kind: ForKind) -> None:
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 88.7, -88.7, 89.0, -104.0,
                         -200.0, 1.0, -1.0, 20.0, -20.0], np.float32)
    n = specials.size
    i = LoopVar("i")
    x = Buffer("x", (n,))
    names = ["exp", "log", "tanh", "erf", "sigmoid"]
    outs = [(Buffer(f"y_{k}", (n,)), Call(k, (x[i],), "float32")) for k in names]
    results = [np.zeros(n, np.float32) for _ in names]
    run(elementwise_1d("specials", n, [x], outs, kind, i), specials, *results)
    x64 = specials.astype(np.float64)
    with np.errstate(all="ignore"):
        references = [np.exp(x64), np.log(x64), np.tanh(x64), _erf(x64), 1 / (1 + np.exp(-x64))]
    for name, got, want in zip(names, results, references):
        with np.errstate(over="ignore"):
            want32 = want.astype(np.float32)
        # subnormal results carry only a few significant bits: compare them in absolute terms
        np.testing.assert_allclose(got, want32, rtol=5e-6, atol=1e-43, equal_nan=True, err_msg=name)


def test_vectorized_transcendentals_stay_vector_code() -> None:
    n = 1024
    i = LoopVar("i")
    x, y = Buffer("x", (n,)), Buffer("y", (n,))
    value = Call("tanh", (Call("exp", (x[i],), "float32"),), "float32") + Call("erf", (x[i],), "float32")
    func = elementwise_1d("vecmath", n, [x], [(y, value + Call("log", (x[i],), "float32"))], VEC, i)
    asm = emit_assembly([func], SERIAL_HOST)
    assert not re.search(r"call\w*\s+\W*(expf|logf|tanhf|erff)", asm), "math became scalar libm calls"
    if HOST.vector_bits == 512:
        assert "zmm" in asm


def test_fma_contraction_forms_fused_multiply_add() -> None:
    n = 64
    i = LoopVar("i")
    a, b, c, out = Buffer("a", (n,)), Buffer("b", (n,)), Buffer("c", (n,)), Buffer("out", (n,))
    func = elementwise_1d("fma_contract", n, [a, b, c], [(out, a[i] * b[i] + c[i])], VEC, i)
    if HOST.has_feature("fma") or HOST.vector_bits == 512:
        assert re.search(r"vfmadd\d+ps", emit_assembly([func], SERIAL_HOST))
    ir_text = emit_llvm_ir([func], SERIAL_HOST)
    assert "fmul contract" in ir_text and "fadd contract" in ir_text
    fast = emit_llvm_ir([PrimFunc("fma_fast", func.params, func.body, (("fast_math", True),))], SERIAL_HOST)
    assert "fmul fast" in fast


# ---------------------------------------------------------------------------------------------------
# loops, reductions, local buffers, tails, gathers
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast_math", [False, True])
def test_row_sum_reduction_with_vector_accumulator(fast_math: bool) -> None:
    rows, cols = 13, 1000
    a, out = Buffer("a", (rows, cols)), Buffer("out", (rows,))
    acc = Buffer("acc", (16,), scope=tir.Scope.LOCAL)
    r, v, jo, lane, total = LoopVar("r"), LoopVar("v"), LoopVar("jo"), LoopVar("lane"), Buffer("t", (1,),
                                                                                                scope=tir.Scope.LOCAL)
    jt = LoopVar("jt")
    body = tir.seq(
        For(v, 16, Store(acc, (v,), tir.FloatImm(0.0)), VEC),
        For(jo, cols // 16, For(v, 16, Store(acc, (v,), acc[v] + a[r, jo * 16 + v]), VEC)),
        Store(total, (0,), tir.FloatImm(0.0)),
        For(lane, 16, Store(total, (0,), total[0] + acc[lane]), ForKind.UNROLLED),
        For(jt, cols % 16, Store(total, (0,), total[0] + a[r, (cols // 16) * 16 + jt])),
        Store(out, (r,), total[0]),
    )
    func = PrimFunc("rowsum", (a, out), For(r, rows, tir.Allocate(acc, tir.Allocate(total, body)), ForKind.PARALLEL),
                    (("fast_math", fast_math),))
    x = random_array((rows, cols), "float32", -1, 1)
    got = np.zeros(rows, np.float32)
    run(func, x, got)
    np.testing.assert_allclose(got, x.astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["add", "max", "min"])
def test_serial_reduction_loops_become_vector_code(op: str) -> None:
    """A reduction written as a serial loop (`acc = acc + f(x[k])`: the reduction family's rows, keepdims
    outputs) may be reordered, so LLVM runs it on vectors with partial accumulators; the result still matches."""
    rows, cols = 7, 509  # a row length with a tail after any vector width
    a, out = Buffer("a", (rows, cols)), Buffer("out", (rows,))
    acc = Buffer("acc", (1,), scope=tir.Scope.LOCAL)
    r, k = LoopVar("r"), LoopVar("k")
    x = Call("tanh", (a[r, k],), "float32") * a[r, k]
    update = {"add": acc[0] + x, "max": tir.maximum(acc[0], x), "min": tir.minimum(acc[0], x)}[op]
    init = {"add": 0.0, "max": -np.inf, "min": np.inf}[op]
    body = tir.seq(Store(acc, (0,), tir.FloatImm(init)), For(k, cols, Store(acc, (0,), update)),
                   Store(out, (r,), acc[0]))
    func = PrimFunc(f"row_{op}", (a, out), For(r, rows, tir.Allocate(acc, body)))
    ir_text = emit_llvm_ir([func], SERIAL_HOST)
    assert ("fadd contract reassoc nsz" in ir_text) if op == "add" else (f"llvm.{op}num.f32" in ir_text)
    assert re.search(r"v(add|max|min)ps\s+%[yz]mm", emit_assembly([func], SERIAL_HOST)), "the loop stayed scalar"
    data = random_array((rows, cols), "float32", -3, 3)
    got = np.zeros(rows, np.float32)
    run(func, data, got)
    want = {"add": np.sum, "max": np.max, "min": np.min}[op](np.tanh(data) * data, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_nested_parallel_and_vectorized_loops() -> None:
    d0, d1, d2 = 7, 5, 40
    a, bias, out = Buffer("a", (d0, d1, d2)), Buffer("bias", (d2,)), Buffer("out", (d0, d1, d2))
    i, j, k = LoopVar("i"), LoopVar("j"), LoopVar("k")
    store = Store(out, (i, j, k), a[i, j, k] * 2.0 + bias[k] + Cast("float32", i * 100 + j))
    func = PrimFunc("nested", (a, bias, out),
                    For(i, d0, For(j, d1, For(k, d2, store, VEC), ForKind.PARALLEL), ForKind.PARALLEL))
    x, bv = random_array((d0, d1, d2), "float32"), random_array((d2,), "float32")
    got = np.zeros((d0, d1, d2), np.float32)
    run(func, x, bv, got, target=PARALLEL_HOST)
    expected = x * 2 + bv + (np.arange(d0)[:, None, None] * 100 + np.arange(d1)[None, :, None])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_parallel_loop_captures_outer_loop_variables_and_local_buffers() -> None:
    outer, inner = 3, 10
    out = Buffer("out", (outer, inner), "int64")
    scale = Buffer("scale", (1,), "int64", scope=tir.Scope.LOCAL)
    o, p = LoopVar("o"), LoopVar("p")
    body = tir.Allocate(scale, tir.seq(
        Store(scale, (0,), o + 1),
        For(p, inner, Store(out, (o, p), scale[0] * 1000 + p * (o + 1)), ForKind.PARALLEL),
    ))
    func = PrimFunc("capture", (out,), For(o, outer, body))
    got = np.zeros((outer, inner), np.int64)
    run(func, got, target=PARALLEL_HOST)
    ov, pv = np.arange(outer)[:, None], np.arange(inner)[None, :]
    np.testing.assert_array_equal(got, (ov + 1) * 1000 + pv * (ov + 1))


def test_local_buffer_indexed_by_vector_lane_becomes_registers() -> None:
    rows, cols = 9, 32
    a, out = Buffer("a", (rows, cols)), Buffer("out", (rows, cols))
    tmp = Buffer("tmp", (cols,), scope=tir.Scope.LOCAL)
    r, v, w = LoopVar("r"), LoopVar("v"), LoopVar("w")
    body = tir.Allocate(tmp, tir.seq(
        For(v, cols, Store(tmp, (v,), a[r, v] * 3.0), VEC),
        For(w, cols, Store(out, (r, w), tmp[w] + 1.0), VEC),
    ))
    func = PrimFunc("localvec", (a, out), For(r, rows, body))
    x = random_array((rows, cols), "float32")
    got = np.zeros((rows, cols), np.float32)
    run(func, x, got)
    np.testing.assert_allclose(got, x * 3 + 1, rtol=1e-6)
    optimized = emit_llvm_ir([func], SERIAL_HOST, optimize=True)
    assert "alloca" not in optimized, "the local buffer should have been promoted to registers"


def test_if_then_else_tail_becomes_masked_vector_code() -> None:
    n = 1_000_003
    lanes = 16
    a, b, c = Buffer("a", (n,)), Buffer("b", (n,)), Buffer("c", (n,))
    vo, vi = LoopVar("vo"), LoopVar("vi")
    index = vo * lanes + vi
    guarded = tir.IfThenElse(index < n, Store(c, (index,), a[index] + b[index] * Call("exp", (a[index],), "float32")))
    func = PrimFunc("tail", (a, b, c), For(vo, -(-n // lanes), For(vi, lanes, guarded, VEC), ForKind.PARALLEL))
    x, y = random_array((n,), "float32", -5, 5), random_array((n,), "float32")
    # The array ends exactly at element n: a masked-off lane that touched memory past it could fault.
    got = np.zeros(n, np.float32)
    run(func, x, y, got, target=PARALLEL_HOST)
    np.testing.assert_allclose(got, x + y * np.exp(x.astype(np.float64)), rtol=3e-6, atol=1e-5)
    assert "llvm.masked.store" in emit_llvm_ir([func], SERIAL_HOST)


def test_vector_condition_with_else_branch() -> None:
    n = 40
    a, out = Buffer("a", (n,)), Buffer("out", (n,))
    i = LoopVar("i")
    stmt = tir.IfThenElse(tir.binary("lt", i % 3, 1), Store(out, (i,), a[i] * 10.0), Store(out, (i,), -a[i]))
    func = PrimFunc("ifelse", (a, out), For(i, n, stmt, VEC))
    x = random_array((n,), "float32")
    got = np.zeros(n, np.float32)
    run(func, x, got)
    np.testing.assert_allclose(got, np.where(np.arange(n) % 3 < 1, x * 10, -x))


def test_uniform_condition_inside_vector_loop_branches() -> None:
    rows, cols = 6, 20
    a, out = Buffer("a", (rows, cols)), Buffer("out", (rows, cols))
    r, v = LoopVar("r"), LoopVar("v")
    stmt = tir.IfThenElse(r < 3, Store(out, (r, v), a[r, v] + 1.0), Store(out, (r, v), a[r, v] - 1.0))
    func = PrimFunc("uniform_if", (a, out), For(r, rows, For(v, cols, stmt, VEC)))
    x = random_array((rows, cols), "float32")
    got = np.zeros((rows, cols), np.float32)
    run(func, x, got)
    np.testing.assert_allclose(got, np.where(np.arange(rows)[:, None] < 3, x + 1, x - 1))


def _padding_kernel(rows: int, cols: int, before: int, after: int, bound_cols: bool) -> PrimFunc:
    """out = x zero-padded on both axes, written as lowering writes a padding stage: a Select whose reads are
    clamped into the buffer. With `bound_cols` False the condition does not bound the column index, so the
    column clamp is not redundant and must stay."""
    x = Buffer("x", (rows, cols))
    out_rows, out_cols = rows + before + after, cols + before + after
    out = Buffer("out", (out_rows, out_cols))
    r, w = LoopVar("r"), LoopVar("w")
    conds = [r >= before, r < before + rows]
    if bound_cols:
        conds += [w >= before, w < before + cols]
    cond = conds[0]
    for c in conds[1:]:
        cond = tir.BinaryOp("and", cond, c)
    row = tir.minimum(tir.maximum(r - before, 0), rows - 1)
    col = tir.minimum(tir.maximum(w - before, 0), cols - 1)
    value = Select(cond, x[row, col] * 2.0, tir.FloatImm(0.0, "float32"))
    return PrimFunc("pad2d", (x, out), For(r, out_rows, For(w, out_cols, Store(out, (r, w), value), VEC)))


@pytest.mark.parametrize(("rows", "cols", "before", "after"), [(5, 56, 1, 1), (3, 17, 2, 3), (4, 1, 1, 0)])
def test_padding_select_reads_with_masked_vector_loads(rows: int, cols: int, before: int, after: int) -> None:
    func = _padding_kernel(rows, cols, before, after, bound_cols=True)
    x = random_array((rows, cols), "float32")
    got = np.full((rows + before + after, cols + before + after), np.nan, np.float32)
    run(func, x, got)  # x ends where its last row ends: an unmasked read past it could fault
    np.testing.assert_array_equal(got, np.pad(x * 2, ((before, after), (before, after))))
    ir_text = emit_llvm_ir([func], SERIAL_HOST)
    assert "llvm.masked.load" in ir_text
    assert "llvm.masked.gather" not in ir_text


def test_clamp_the_condition_does_not_imply_is_kept() -> None:
    rows, cols = 4, 9
    func = _padding_kernel(rows, cols, 1, 1, bound_cols=False)
    x = random_array((rows, cols), "float32")
    got = np.zeros((rows + 2, cols + 2), np.float32)
    run(func, x, got)
    clamped = x[:, np.clip(np.arange(cols + 2) - 1, 0, cols - 1)]  # columns repeat the edge values
    np.testing.assert_array_equal(got, np.pad(clamped * 2, ((1, 1), (0, 0))))


@pytest.mark.parametrize("stride", [2, 3, 4])
@pytest.mark.parametrize("n", [16, 29])
def test_strided_loads_read_a_span_and_shuffle(stride: int, n: int) -> None:
    """out[i] = a[stride * i] (+ a tail guarded by a lane mask): no gather, and the input ends exactly at the last
    element read, so a load that touched the elements after it could fault."""
    lanes = 8
    a, out = Buffer("a", ((n - 1) * stride + 1,)), Buffer("out", (n,))
    vo, vi = LoopVar("vo"), LoopVar("vi")
    index = vo * lanes + vi
    body = tir.IfThenElse(index < n, Store(out, (index,), a[index * stride] + 1.0))
    func = PrimFunc("strided", (a, out), For(vo, -(-n // lanes), For(vi, lanes, body, VEC)))
    x = random_array(((n - 1) * stride + 1,), "float32")
    got = np.zeros(n, np.float32)
    run(func, x, got)
    np.testing.assert_array_equal(got, x[::stride] + 1)
    ir_text = emit_llvm_ir([func], SERIAL_HOST)
    assert "llvm.masked.gather" not in ir_text and "shufflevector" in ir_text


@pytest.mark.parametrize("pattern", ["block", "reversed", "every_other"])
@pytest.mark.parametrize("block", [4, 8])
def test_window_loads_repeat_a_pattern(pattern: str, block: int) -> None:
    """A row of `NCHW{b}c` blocks in vectors of four blocks reads a per-channel parameter at `[c, vi % b]` (or
    `[c, b - 1 - vi % b]`, `[c, 2 * (vi % b)]`): one load of the span and a shuffle, no gather; the parameter
    buffer ends at the last element read."""
    channels, width, lanes = 3, 5, 4 * block
    param_width = 2 * block - 1 if pattern == "every_other" else block
    a, p = Buffer("a", (channels, width * block)), Buffer("p", (channels, param_width))
    out = Buffer("out", (channels, width * block))
    c, vo, vi, vt = LoopVar("c"), LoopVar("vo"), LoopVar("vi"), LoopVar("vt")

    def column(v: LoopVar) -> tir.PrimExpr:
        return {"block": v % block, "reversed": (block - 1) - v % block, "every_other": (v % block) * 2}[pattern]

    row = width * block // lanes * lanes  # whole vectors; the rest of the row in a narrower vectorized loop
    body = tir.seq(
        For(vo, row // lanes, For(vi, lanes, Store(out, (c, vo * lanes + vi), a[c, vo * lanes + vi] * p[c, column(vi)]),
                                  VEC)),
        For(vt, width * block - row, Store(out, (c, vt + row), a[c, vt + row] * p[c, column(vt)]), VEC))
    func = PrimFunc("window", (a, p, out), For(c, channels, body))
    x, y = random_array((channels, width * block), "float32"), random_array((channels, param_width), "float32")
    got = np.zeros((channels, width * block), np.float32)
    run(func, x, y, got)
    columns = np.arange(width * block) % block
    picked = {"block": columns, "reversed": block - 1 - columns, "every_other": 2 * columns}[pattern]
    np.testing.assert_array_equal(got, x * y[:, picked])
    ir_text = emit_llvm_ir([func], SERIAL_HOST)
    assert "llvm.masked.gather" not in ir_text and "shufflevector" in ir_text


def test_window_loads_leave_masked_and_unknown_patterns_to_gathers() -> None:
    """Under a lane mask (a guarded tail) or where the lane pattern depends on another loop, a load gathers, and
    the results stay right."""
    n, lanes = 29, 16
    a, p, out = Buffer("a", (n,)), Buffer("p", (8,)), Buffer("out", (n,))
    vo, vi = LoopVar("vo"), LoopVar("vi")
    index = vo * lanes + vi
    guarded = tir.IfThenElse(index < n, Store(out, (index,), a[index] * p[vi % 8]))
    masked = For(vo, -(-n // lanes), For(vi, lanes, guarded, VEC))
    func = PrimFunc("masked_window", (a, p, out), masked)
    x, y = random_array((n,), "float32"), random_array((8,), "float32")
    got = np.zeros(n, np.float32)
    run(func, x, y, got)
    np.testing.assert_array_equal(got, x * y[np.arange(n) % 16 % 8])
    assert "llvm.masked.gather" in emit_llvm_ir([func], SERIAL_HOST)
    extents = {vo: 2, vi: lanes}
    assert affine.lane_deltas((index % 3,), (8,), vi, extents, range(lanes)) is None  # `vo` inside the atom
    assert affine.lane_deltas((vi % 8,), (8,), vi, extents, range(4, 8)) == [0, 1, 2, 3]
    assert affine.lane_deltas((vo, 7 - vi % 4), (2, 8), vi, extents, range(6)) == [0, -1, -2, -3, 0, -1]


def test_strip_implied_clamps_uses_the_condition() -> None:
    w = LoopVar("w")
    extents = {w: 58}
    x = Buffer("x", (56,))
    clamped = x[tir.minimum(tir.maximum(w - 1, 0), 55)]
    facts = affine.guard_facts(tir.BinaryOp("and", w >= 1, w < 57), extents)
    assert affine.strip_implied_clamps(clamped, facts, extents) == x[w - 1]
    only_low = affine.guard_facts(w >= 1, extents)  # w - 1 <= 55 is not implied: the min stays
    assert affine.strip_implied_clamps(clamped, only_low, extents) == x[tir.minimum(w - 1, 55)]
    assert affine.strip_implied_clamps(clamped, [], extents) is clamped


def test_4d_transpose_with_gathers_and_fused_lanes() -> None:
    shape = (2, 3, 5, 7)
    src = Buffer("src", shape)
    dst = Buffer("dst", (2, 7, 3, 5))
    dst2 = Buffer("dst2", (2, 7, 3, 5))
    a, b, c, d = (LoopVar(x) for x in "abcd")
    # vectorized over c: the source moves by 7 elements per lane (a gather), the destination by 1
    first = For(a, 2, For(d, 7, For(b, 3, For(c, 5, Store(dst, (a, d, b, c), src[a, b, c, d]), VEC))))
    # vectorized over the fused (b, c) axis: floordiv/floormod by 5 of a lane index
    a2, d2, f = LoopVar("a2"), LoopVar("d2"), LoopVar("f")
    second = For(a2, 2, For(d2, 7, For(f, 15, Store(dst2, (a2, d2, f // 5, f % 5), src[a2, f // 5, f % 5, d2]), VEC)))
    func = PrimFunc("transpose", (src, dst, dst2), tir.seq(first, second))
    x = random_array(shape, "float32")
    got, got2 = np.zeros((2, 7, 3, 5), np.float32), np.zeros((2, 7, 3, 5), np.float32)
    run(func, x, got, got2)
    np.testing.assert_array_equal(got, x.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(got2, x.transpose(0, 3, 1, 2))
    assert "llvm.masked.gather" in emit_llvm_ir([func], SERIAL_HOST)


def test_split_index_floordiv_stays_contiguous() -> None:
    n = 256
    a, out = Buffer("a", (n // 16, 16)), Buffer("out", (n,))
    vo, vi = LoopVar("vo"), LoopVar("vi")
    flat = vo * 16 + vi
    body = For(vi, 16, Store(out, (flat,), a[flat // 16, flat % 16]), VEC)
    func = PrimFunc("split", (a, out), For(vo, n // 16, body))
    text = emit_llvm_ir([func], SERIAL_HOST)
    assert "gather" not in text and "load <16 x float>" in text
    x = random_array((n // 16, 16), "float32")
    got = np.zeros(n, np.float32)
    run(func, x, got)
    np.testing.assert_array_equal(got, x.reshape(-1))


def test_unrolled_loops_and_uniform_store_in_vector_loop() -> None:
    n = 24
    a, out, last = Buffer("a", (4, n)), Buffer("out", (4, n)), Buffer("last", (1,))
    u, v = LoopVar("u"), LoopVar("v")
    body = tir.seq(Store(out, (u, v), a[u, v] * Cast("float32", u + 1)), Store(last, (0,), a[u, v]))
    func = PrimFunc("unrolled", (a, out, last), For(u, 4, For(v, n, body, VEC), ForKind.UNROLLED))
    x = random_array((4, n), "float32")
    got, got_last = np.zeros((4, n), np.float32), np.zeros(1, np.float32)
    run(func, x, got, got_last)
    np.testing.assert_allclose(got, x * np.arange(1, 5)[:, None])
    assert got_last[0] == x[3, n - 1]  # what the serial loop leaves behind: the last iteration's value


def test_heap_scratch_buffer_and_indirect_index() -> None:
    n = 50_000
    a, idx, out = Buffer("a", (n,)), Buffer("idx", (n,), "int32"), Buffer("out", (n,))
    scratch = Buffer("scratch", (n,))  # GLOBAL scope: on the heap
    i, j = LoopVar("i"), LoopVar("j")
    body = tir.Allocate(scratch, tir.seq(
        For(i, n, Store(scratch, (i,), a[i] * a[i]), VEC),
        For(j, n, Store(out, (j,), scratch[idx[j]]), VEC),
    ))
    func = PrimFunc("gather_heap", (a, idx, out), body)
    x = random_array((n,), "float32")
    perm = RNG.permutation(n).astype(np.int32)
    got = np.zeros(n, np.float32)
    run(func, x, perm, got)
    np.testing.assert_array_equal(got, (x * x)[perm])


def test_scatter_store_through_index_buffer() -> None:
    n = 100
    a, idx, out = Buffer("a", (n,)), Buffer("idx", (n,), "int64"), Buffer("out", (n,))
    i = LoopVar("i")
    func = PrimFunc("scatter", (a, idx, out), For(i, n, Store(out, (idx[i],), a[i] + 1.0), VEC))
    x = random_array((n,), "float32")
    perm = RNG.permutation(n).astype(np.int64)
    got = np.zeros(n, np.float32)
    run(func, x, perm, got)
    expected = np.zeros(n, np.float32)
    expected[perm] = x + 1
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------------------------------------------
# register-blocked matmul
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [SERIAL_HOST, PARALLEL_HOST], ids=["1core", "ncores"])
@pytest.mark.parametrize("shape", [(64, 96, 48), (16, 32, 8), (128, 128, 256)])
def test_packed_matmul_matches_numpy(shape: tuple[int, int, int], target: Target) -> None:
    m, n, k = shape
    func = packed_matmul(m, n, k)
    a, b = random_array((m, k), "float32", -1, 1), random_array((k, n), "float32", -1, 1)
    c = np.zeros((m, n), np.float32)
    run(func, a, b, c, target=target)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_packed_matmul_keeps_accumulators_in_vector_registers() -> None:
    asm = emit_assembly([packed_matmul(256, 256, 256)], SERIAL_HOST)
    if HOST.vector_bits != 512:
        pytest.skip("register budget checked for AVX-512 only")
    fmas = re.findall(r"vfmadd\d+ps\s+[^\n]*zmm", asm)
    assert len(fmas) >= 16 * 4  # 8x32 tile = 16 zmm accumulators, k unrolled 4x
    spills = re.findall(r"vmovups\s+%zmm\d+, -?\d*\(%rsp\)", asm)
    assert not spills, "accumulators spilled to the stack"


@pytest.mark.parametrize("target", [SERIAL_HOST, PARALLEL_HOST], ids=["1core", "ncores"])
def test_blocked_conv2d_matches_numpy(target: Target) -> None:
    n, c, h, w, k = 1, 32, 10, 16, 32
    func = conv2d_nchwc(n, c, h, w, k)
    data = random_array((n, c // 16, h + 2, w + 2, 16), "float32", -1, 1)
    weight = random_array((k // 16, c // 16, 3, 3, 16, 16), "float32", -1, 1)
    out = np.zeros((n, k // 16, h, w, 16), np.float32)
    run(func, data, weight, out, target=target)
    plain_data = data.transpose(0, 1, 4, 2, 3).reshape(n, c, h + 2, w + 2).astype(np.float64)
    plain_weight = weight.transpose(0, 5, 1, 4, 2, 3).reshape(k, c, 3, 3).astype(np.float64)
    expected = np.zeros((n, k, h, w))
    for r in range(3):
        for s in range(3):
            expected += np.einsum("nchw,kc->nkhw", plain_data[:, :, r:r + h, s:s + w], plain_weight[:, :, r, s])
    got = out.transpose(0, 1, 4, 2, 3).reshape(n, k, h, w)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_compile_time_of_a_conv_sized_kernel_is_small() -> None:
    timings: dict[str, float] = {}
    compile_object([conv2d_nchwc(1, 64, 56, 56, 64)], HOST, timings=timings)
    assert sum(timings.values()) < 1.0  # generous bound for loaded CI machines; typical is ~0.1 s
    assert set(timings) == {"lower_s", "parse_s", "optimize_s", "emit_s"}


# ---------------------------------------------------------------------------------------------------
# compile / load / runtime
# ---------------------------------------------------------------------------------------------------


def _scale_kernel(n: int = 100, name: str = "scale") -> PrimFunc:
    i = LoopVar("i")
    a, out = Buffer("a", (n,)), Buffer("out", (n,))
    return PrimFunc(name, (a, out), For(i, n, Store(out, (i,), a[i] * 3.0), ForKind.PARALLEL))


def test_object_compiled_in_another_process_loads_here(tmp_path: Path) -> None:
    path = tmp_path / "kernel.o"
    script = textwrap.dedent(f"""
        from relay_tune.kernel.tir import Buffer, For, ForKind, LoopVar, PrimFunc, Store
        from relay_tune.codegen.llvm import compile_object
        from relay_tune.target import Target
        i = LoopVar("i"); a = Buffer("a", (100,)); out = Buffer("out", (100,))
        f = PrimFunc("scale", (a, out), For(i, 100, Store(out, (i,), a[i] * 3.0), ForKind.PARALLEL))
        open({str(path)!r}, "wb").write(compile_object([f], Target.parse({str(PARALLEL_HOST)!r})))
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).resolve().parents[1])
    lib = load_object(path.read_bytes(), [_scale_kernel()])
    x = random_array((100,), "float32")
    got = np.zeros(100, np.float32)
    lib.get("scale")(x, got)
    np.testing.assert_allclose(got, x * 3)


def test_python_thread_team_runs_parallel_loops() -> None:
    func = _scale_kernel(10_000, "scale_team")
    obj = compile_object([func], PARALLEL_HOST)
    lib = load_object(obj, [func], threading_runtime="python")
    x = random_array((10_000,), "float32")
    got = np.zeros(10_000, np.float32)
    regions = python_thread_team().regions
    lib.get("scale_team")(x, got)
    assert python_thread_team().regions == regions + 1
    np.testing.assert_allclose(got, x * 3)
    with pytest.raises(RelayTuneError, match="threading runtime"):
        load_object(obj, [func], threading_runtime="tbb")
    team = PythonThreadTeam(max_threads=3)
    assert set(team.symbols()) == {"GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads"}


@pytest.mark.parametrize("team_size", [1, 2, 3])
def test_parallel_loop_is_complete_when_the_team_is_smaller_than_asked(
    team_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that never runs its share (descheduled, or a team smaller than the loop asked for) leaves its chunks
    to the threads that run: every iteration is still done, once."""
    import relay_tune.codegen.jit as jit

    team = PythonThreadTeam(max_threads=team_size)
    monkeypatch.setattr(jit, "_python_team", team)
    func = _scale_kernel(1001, f"scale_team_of_{team_size}")
    lib = load_object(compile_object([func], HOST.with_cores(4)), [func], threading_runtime="python")
    x = random_array((1001,), "float32")
    got = np.zeros(1001, np.float32)
    lib.get(func.name)(x, got)
    assert team.regions == 1
    np.testing.assert_allclose(got, x * 3)


class _LateTeam(PythonThreadTeam):
    """A team of two whose second thread starts only after the first has returned (as when the second thread
    is descheduled for the whole region); `after_first` runs in between."""

    def __init__(self, after_first: Callable[[], None]) -> None:
        super().__init__(max_threads=2)
        self.after_first = after_first

    def _parallel(self, fn: int, data: int, num_threads: int, flags: int) -> None:
        body = self._body_type(fn)
        self.regions += 1
        for thread in range(2):
            self._local.thread, self._local.team = thread, 2
            body(data)
            if thread == 0:
                self.after_first()
        self._local.thread, self._local.team = 0, 1


def test_a_late_thread_share_is_done_by_the_thread_that_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The region does not wait for a descheduled thread's share: the first thread to run takes it too."""
    import relay_tune.codegen.jit as jit

    x = random_array((1001,), "float32")
    got = np.zeros(1001, np.float32)
    seen: list[np.ndarray] = []
    team = _LateTeam(lambda: seen.append(got.copy()))
    monkeypatch.setattr(jit, "_python_team", team)
    func = _scale_kernel(1001, "scale_late_team")
    lib = load_object(compile_object([func], HOST.with_cores(2)), [func], threading_runtime="python")
    lib.get(func.name)(x, got)
    assert team.regions == 1
    np.testing.assert_allclose(seen[0], x * 3)  # complete before the second thread ran
    np.testing.assert_allclose(got, x * 3)


def test_select_between_two_reads_under_a_uniform_condition_branches() -> None:
    """A concatenation along channels inside a vectorized loop: the condition (which input) is the same in every
    lane, so only the chosen input is read (a branch), not both (a select of two loads)."""
    c, w = LoopVar("c"), LoopVar("w")
    a, b, out = Buffer("a", (3, 32)), Buffer("b", (5, 32)), Buffer("out", (8, 32))
    value = Select(c < 3, a[tir.minimum(c, 2), w], b[tir.maximum(c - 3, 0), w])
    func = PrimFunc("concat_rows", (a, b, out), For(c, 8, For(w, 32, Store(out, (c, w), value), VEC)))
    text = emit_llvm_ir([func], SERIAL_HOST)
    assert "select.then" in text and "select.else" in text
    x, y, got = random_array((3, 32), "float32"), random_array((5, 32), "float32"), np.zeros((8, 32), np.float32)
    run(func, x, y, got)
    np.testing.assert_array_equal(got, np.concatenate([x, y]))
    # a condition that differs between lanes stays a select
    lanes = PrimFunc("mix", (a, b, out), For(c, 3, For(w, 32, Store(out, (c, w), Select(
        w < 16, a[c, w], b[c, w])), VEC)))
    assert "select.then" not in emit_llvm_ir([lanes], SERIAL_HOST)


def test_kernel_checks_its_arguments() -> None:
    lib = build_llvm([_scale_kernel()], SERIAL_HOST)
    kernel = lib.get("scale")
    good = np.zeros(100, np.float32)
    with pytest.raises(KernelArgumentError, match="dtype"):
        kernel(np.zeros(100, np.float64), good)
    with pytest.raises(KernelArgumentError, match="shape"):
        kernel(np.zeros(99, np.float32), good)
    with pytest.raises(KernelArgumentError, match="takes 2"):
        kernel(good)
    with pytest.raises(KernelArgumentError, match="contiguous"):
        kernel(np.zeros(200, np.float32)[::2], good)
    readonly = np.zeros(100, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(KernelArgumentError, match="read-only"):
        kernel(good, readonly)
    kernel(readonly, good)  # read-only inputs are fine
    with pytest.raises(RelayTuneError, match="no kernel named"):
        lib.get("missing")


def test_raw_call_and_alignment_requirement() -> None:
    base = _scale_kernel(64, "scale_aligned")
    func = PrimFunc(base.name, base.params, base.body, (("param_align", 64),))
    assert "align 64" in emit_llvm_ir([func], SERIAL_HOST)
    kernel = build_llvm([func], SERIAL_HOST).get(func.name)
    x, out = aligned_empty(64), aligned_empty(64)
    assert x.ctypes.data % 64 == 0
    x[:] = np.arange(64, dtype=np.float32)
    kernel.raw(x.ctypes.data, out.ctypes.data)
    np.testing.assert_allclose(out, x * 3)
    misaligned = aligned_empty(65)[1:]
    with pytest.raises(KernelArgumentError, match="aligned"):
        kernel(misaligned, out)


def test_time_kernel_reports_every_repeat() -> None:
    func = _scale_kernel(100_000, "scale_timed")
    kernel = build_llvm([func], SERIAL_HOST).get(func.name)
    arrays = [random_array((100_000,), "float32"), np.zeros(100_000, np.float32)]
    costs = time_kernel(kernel, arrays, number=2, repeat=4)
    assert len(costs) == 4 and all(0 < c < 1 for c in costs)
    started = __import__("time").perf_counter()
    costs = time_kernel(kernel, arrays, repeat=2, min_repeat_ms=20)
    assert __import__("time").perf_counter() - started >= 0.04
    assert len(costs) == 2
    np.testing.assert_allclose(arrays[1], arrays[0] * 3)


def test_several_kernels_per_object_and_signatures_by_name() -> None:
    f1, f2 = _scale_kernel(10, "first"), _scale_kernel(10, "second")
    obj = compile_object([f1, f2], SERIAL_HOST)
    lib = load_object(obj, ["first", KernelSignature.from_primfunc(f2)])
    assert set(lib.names) == {"first", "second"} and "first" in lib
    x, out = np.ones(10, np.float32), np.zeros(10, np.float32)
    lib.get("first")(x, out)
    np.testing.assert_allclose(out, 3)
    assert KernelSignature.from_primfunc(f2).params[1].written  # type: ignore[index]
    assert not KernelSignature.from_primfunc(f2).params[0].written  # type: ignore[index]


def test_unresolved_symbol_is_a_clean_error() -> None:
    import llvmlite.binding as llvm

    from relay_tune.codegen.llvm import _target_machine

    machine = _target_machine(SERIAL_HOST)
    module = llvm.parse_assembly(textwrap.dedent("""
        declare void @relay_tune_no_such_symbol()
        define void @broken() {
          call void @relay_tune_no_such_symbol()
          ret void
        }
        define void @broken__repeat(ptr %args, i64 %n) {
          ret void
        }
    """))
    obj = machine.emit_object(module)
    with pytest.raises(CompileError, match="cannot load"):
        load_object(obj, ["broken"])


# ---------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------


def test_errors_name_the_problem() -> None:
    i, free = LoopVar("i"), LoopVar("free")
    a = Buffer("a", (4,))
    with pytest.raises(CompileError, match="free"):
        compile_object([PrimFunc("k1", (a,), For(i, 4, Store(a, (i,), Cast("float32", free))))], HOST)
    stray = Buffer("stray", (4,))
    with pytest.raises(CompileError, match="stray"):
        compile_object([PrimFunc("k2", (a,), For(i, 4, Store(a, (i,), stray[i])))], HOST)
    with pytest.raises(CompileError, match="dimension"):
        compile_object([PrimFunc("k3", (a,), For(i, 4, Store(a, (i, i), 1.0)))], HOST)
    with pytest.raises(CompileError, match="unique"):
        compile_object([_scale_kernel(4, "dup"), _scale_kernel(4, "dup")], HOST)
    for reserved in ("expf", "free", "GOMP_parallel", "", "two words"):
        with pytest.raises(CompileError, match="kernel name"):
            compile_object([_scale_kernel(4, reserved)], HOST)
    with pytest.raises(UnsupportedError):
        compile_object([PrimFunc("k4", (Buffer("c", (4,), "complex64"),), For(i, 4, tir.seq()))], HOST)
    bound = For(i, 4, Store(a, (i,), 1.0), ForKind.THREAD_BINDING, "threadIdx.x")
    with pytest.raises(UnsupportedError, match=r"threadIdx\.x"):
        compile_object([PrimFunc("k5", (a,), bound)], HOST)
    with pytest.raises(UnsupportedError):
        compile_object([_scale_kernel()], Target.parse("cuda -arch=sm_90"))
    with pytest.raises(CompileError, match="nothing to compile"):
        compile_object([], HOST)


def test_parallel_inside_vectorized_loop_is_rejected() -> None:
    a = Buffer("a", (4, 4))
    v, p = LoopVar("v"), LoopVar("p")
    nest = For(v, 4, For(p, 4, Store(a, (p, v), 1.0), ForKind.PARALLEL), VEC)
    with pytest.raises(CompileError, match="inside a vectorized loop"):
        compile_object([PrimFunc("bad_nest", (a,), nest)], PARALLEL_HOST)


def test_required_libraries_name_libgomp_only_for_parallel_code() -> None:
    assert required_libraries([_scale_kernel()], PARALLEL_HOST) == ("libgomp.so.1",)
    assert required_libraries([_scale_kernel()], SERIAL_HOST) == ()
    i = LoopVar("i")
    a = Buffer("a", (4,))
    assert required_libraries([PrimFunc("serial", (a,), For(i, 4, Store(a, (i,), 1.0)))], PARALLEL_HOST) == ()


def test_codegen_options_follow_target_width() -> None:
    assert codegen_options(HOST).chunk_lanes == HOST.vector_lanes("float32")
    assert codegen_options(Target.parse("llvm -mcpu=haswell")).chunk_lanes == 8


# ---------------------------------------------------------------------------------------------------
# affine index analysis
# ---------------------------------------------------------------------------------------------------


def test_lane_stride_classifies_accesses() -> None:
    i, v, w = LoopVar("i"), LoopVar("v"), LoopVar("w")
    extents = {i: 10, v: 16, w: 4}
    assert affine.lane_stride((i, v), (10, 16), v, extents) == 1
    assert affine.lane_stride((v, i), (16, 10), v, extents) == 10
    assert affine.lane_stride((i, tir.IntImm(3)), (10, 16), v, extents) == 0
    flat = i * 16 + v
    assert affine.lane_stride((flat // 16, flat % 16), (10, 16), v, extents) == 1
    # (w * 8 + v) // 16 is not affine: v's range crosses a multiple of 16
    assert affine.lane_stride((((w * 8) + v) // 16,), (100,), v, extents) is None
    idx = Buffer("idx", (16,), "int64")
    assert affine.lane_stride((idx[v],), (100,), v, extents) is None
    assert affine.lane_stride((idx[i] + v,), (100,), v, extents) == 1
    assert affine.lane_stride((Cast("int32", v * 2),), (100,), v, extents) == 2


def test_affine_form_cancels_and_bounds() -> None:
    i, v = LoopVar("i"), LoopVar("v")
    form = affine.affine_form(i * 4 + v - v + 3, {i: 5, v: 4})
    assert {atom.name: coef for atom, coef in form.terms.values()} == {"i": 4}  # type: ignore[attr-defined]
    assert form.const == 3
    assert affine.bounds(form, {i: 5, v: 4}) == (3, 19)
    assert affine.bounds(affine.affine_form(i * -2, {i: 5}), {i: 5}) == (-8, 0)


# ---------------------------------------------------------------------------------------------------
# end to end: tensor expressions -> schedule -> lowering -> code generation
# ---------------------------------------------------------------------------------------------------


def _compiled_matches_interpreter(func: PrimFunc, arrays: list[np.ndarray], outputs: list[int],
                                  rtol: float = 1e-4) -> None:
    from relay_tune.kernel import tir_eval

    compiled = [a.copy() for a in arrays]
    build_llvm([func], PARALLEL_HOST).get(func.name)(*compiled)
    interpreted = [a.copy() for a in arrays]
    tir_eval.evaluate(func, *interpreted)
    for index in outputs:
        np.testing.assert_allclose(compiled[index], interpreted[index], rtol=rtol, atol=1e-4)


def test_lowered_elementwise_with_split_tail() -> None:
    from relay_tune.kernel import te
    from relay_tune.kernel.lower import lower
    from relay_tune.kernel.schedule import Schedule

    n = 1003
    a = te.placeholder((n,), "float32", "A")
    b = te.compute((n,), lambda i: te.exp(a[i]) * 2.0 + a[i], "B")
    sch = Schedule(b)
    outer, inner = sch.split(b, "i", factor=16)
    sch.vectorize(b, inner)
    sch.parallel(b, outer)
    _compiled_matches_interpreter(lower(sch, "ew_tail"), [random_array((n,), "float32", -3, 3),
                                                          np.zeros(n, np.float32)], [1])


def test_lowered_tiled_dense_with_local_accumulator() -> None:
    from relay_tune.kernel import te
    from relay_tune.kernel.lower import lower
    from relay_tune.kernel.schedule import Schedule

    m, n, k = 40, 64, 24
    a = te.placeholder((m, k), "float32", "A")
    b = te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis(k, "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), "C")
    sch = Schedule(c)
    local = sch.cache_write(c, "local")
    io, jo, _, ji = sch.tile(c, "i", "j", 8, 32)
    sch.parallel(c, io)
    sch.vectorize(c, ji)
    sch.compute_at(local, c, jo)
    sch.reorder(local, "k", "i", "j")
    sch.unroll(local, "i")
    sch.vectorize(local, "j")
    arrays = [random_array((m, k), "float32", -1, 1), random_array((k, n), "float32", -1, 1),
              np.zeros((m, n), np.float32)]
    _compiled_matches_interpreter(lower(sch, "dense_tiled"), arrays, [2])


def test_lowered_padded_conv2d_with_relu() -> None:
    from relay_tune.kernel import te
    from relay_tune.kernel.lower import lower
    from relay_tune.kernel.schedule import Schedule

    n, c, h, w, k = 1, 4, 6, 7, 8
    data = te.placeholder((n, c, h, w), "float32", "data")
    weight = te.placeholder((k, c, 3, 3), "float32", "weight")
    inside = lambda y, x: te.all_of(y >= 1, y <= h, x >= 1, x <= w)
    pad = te.compute((n, c, h + 2, w + 2),
                     lambda b, ch, y, x: te.if_then_else(inside(y, x), data[b, ch, y - 1, x - 1], 0.0), "pad")
    rc, ry, rx = te.reduce_axis(c, "rc"), te.reduce_axis(3, "ry"), te.reduce_axis(3, "rx")
    conv = te.compute((n, k, h, w), lambda b, f, y, x: te.sum(pad[b, rc, y + ry, x + rx] * weight[f, rc, ry, rx],
                                                               axis=[rc, ry, rx]), "conv")
    relu = te.compute((n, k, h, w), lambda b, f, y, x: te.maximum(conv[b, f, y, x], 0.0), "relu")
    sch = Schedule(relu)
    sch.compute_inline(pad)
    sch.compute_at(conv, relu, "f")
    sch.vectorize(relu, "x")
    sch.parallel(relu, "f")
    arrays = [random_array((n, c, h, w), "float32", -1, 1), random_array((k, c, 3, 3), "float32", -1, 1),
              np.zeros((n, k, h, w), np.float32)]
    _compiled_matches_interpreter(lower(sch, "conv_relu"), arrays, [2])


# ---------------------------------------------------------------------------------------------------
# property: vectorized index arithmetic agrees with the reference interpreter
# ---------------------------------------------------------------------------------------------------

_R_EXTENT, _V_EXTENT = 5, 24


def _index_expressions(r: LoopVar, v: LoopVar):  # -> hypothesis strategy of non-negative int64 expressions
    from hypothesis import strategies as st

    leaves = st.one_of(st.just(r), st.just(v), st.integers(0, 40).map(lambda c: tir.IntImm(c)))

    def extend(children):  # type: ignore[no-untyped-def]
        constant = st.integers(1, 33).map(lambda c: tir.IntImm(c))
        return st.one_of(
            st.tuples(children, children).map(lambda ab: ab[0] + ab[1]),
            st.tuples(children, constant).map(lambda ab: ab[0] * ab[1]),
            st.tuples(children, constant).map(lambda ab: ab[0] // ab[1]),
            st.tuples(children, constant).map(lambda ab: ab[0] % ab[1]),
            st.tuples(children, children).map(lambda ab: tir.maximum(ab[0], ab[1])),
        )

    return st.recursive(leaves, extend, max_leaves=8)


def test_vectorized_index_arithmetic_matches_interpreter() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from relay_tune.kernel import tir_eval

    r, v = LoopVar("r"), LoopVar("v")

    @settings(max_examples=40, deadline=None)
    @given(_index_expressions(r, v), _index_expressions(r, v), _index_expressions(r, v), st.integers(0, 30))
    def check(load_index: tir.PrimExpr, value_term: tir.PrimExpr, guard: tir.PrimExpr, threshold: int) -> None:
        grid_r, grid_v = np.meshgrid(np.arange(_R_EXTENT), np.arange(_V_EXTENT), indexing="ij")
        reach = tir_eval_max(load_index, r, v, grid_r, grid_v)
        source = Buffer("src", (reach + 1,), "float32")
        out = Buffer("out", (_R_EXTENT, _V_EXTENT), "float32")
        value = source[load_index] + Cast("float32", value_term)
        # a guard that depends on the lane masks the loads and stores; one that does not is a branch
        store = tir.IfThenElse(guard < threshold, Store(out, (r, v), value))
        body = For(r, _R_EXTENT, For(v, _V_EXTENT, store, VEC), ForKind.UNROLLED)
        func = PrimFunc("prop", (source, out), body)
        src = np.arange(reach + 1, dtype=np.float32) * 0.5
        got, want = np.zeros((_R_EXTENT, _V_EXTENT), np.float32), np.zeros((_R_EXTENT, _V_EXTENT), np.float32)
        build_llvm([func], SERIAL_HOST).get("prop")(src, got)
        tir_eval.evaluate(func, src.copy(), want)
        np.testing.assert_array_equal(got, want)

    check()


def tir_eval_max(expr: tir.PrimExpr, r: LoopVar, v: LoopVar, grid_r: np.ndarray, grid_v: np.ndarray) -> int:
    """Largest value of an index expression over the loop grid (numpy evaluation of the same tree)."""
    def value(node: tir.PrimExpr) -> np.ndarray:
        if node is r:
            return grid_r
        if node is v:
            return grid_v
        if isinstance(node, tir.IntImm):
            return np.full(grid_r.shape, node.value)
        assert isinstance(node, tir.BinaryOp)
        a, b = value(node.a), value(node.b)
        return {"add": a + b, "mul": a * b, "floordiv": a // np.maximum(b, 1), "floormod": a % np.maximum(b, 1),
                "max": np.maximum(a, b)}[node.op]

    return int(value(expr).max())


def test_float16_casts_load_in_a_fresh_process() -> None:
    """LLVM lowers float16 conversions to calls into the compiler's runtime library (__truncdfhf2 ...); a model with
    such casts must load in a process that has not happened to load that library globally before (it failed with
    "Symbols not found" when this test file ran alone)."""
    script = textwrap.dedent("""
        import numpy as np
        import relay_tune
        from relay_tune.text import parse_module
        mod = parse_module('#[version = "0.0.5"]\\n'
                           'def @main(%x: Tensor[(3, 17), float64]) { cast(%x, dtype="float16") }')
        x = np.random.default_rng(0).standard_normal((3, 17))
        got = relay_tune.build(mod, target="llvm").run(x=x)
        assert got.dtype == np.float16, got.dtype
        np.testing.assert_array_equal(got, x.astype(np.float16))
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).resolve().parents[1])
