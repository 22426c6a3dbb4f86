"""The low-precision element types (bfloat16, float8, float4, int4/int2) end to end.

Conversions are checked bit for bit against ml_dtypes (and ONNX's `saturate`/`round_mode` rules) through the
reference interpreter and the compiled model: every code of each type to float32, and float32 values around
every rounding boundary (the midpoints between neighbouring codes and their float32 neighbours), subnormals,
overflow, infinities and NaN to the type. ONNX Cast, CastLike and BitCast models are compared with
`onnx.reference.ReferenceEvaluator`; arithmetic on bfloat16 compiles (in float32, rounded back).
"""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from relay_tune import build
from relay_tune.codegen.llvm import build_llvm, emit_llvm_ir
from relay_tune.errors import RelayTypeError
from relay_tune.frontend import from_onnx
from relay_tune.frontend.onnx import OnnxModelError
from relay_tune.interpreter import evaluate
from relay_tune.ir.dtypes import FLOAT_FORMATS
from relay_tune.kernel import tir
from relay_tune.kernel.tir import Buffer, For, ForKind, LoopVar, PrimFunc, Store
from relay_tune.op.low_precision import convert
from relay_tune.passes.extract_tasks import canonical_text, primitive_calls
from relay_tune.passes.pipeline import optimize
from relay_tune.runtime.model import load
from relay_tune.target import Target
from relay_tune.text import parse_module, print_module
from relay_tune.tuning.runner import DEFAULT_TOLERANCES, _sentinel_fill, compare_outputs, random_inputs
from relay_tune.tuning.task import TensorSpec
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(20261207)
FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"]
SMALL_FLOATS = [*FLOAT8, "float4_e2m1fn"]
SUB_BYTE_INTS = ["int4", "uint4", "int2", "uint2"]


def np_type(dtype: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, dtype))


def codes_of(x: np.ndarray) -> np.ndarray:
    """The raw codes of an ml_dtypes array (uint8, uint16 for bfloat16)."""
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint8)


def cast_module(src_dtype: str, dst_dtype: str, n: int, attrs: str = ""):
    text = f"""#[version = "0.0.5"]
def @main(%x: Tensor[({n}), {src_dtype}]) {{
  cast(%x, dtype="{dst_dtype}"{attrs})
}}"""
    return parse_module(text)


def run_both(mod: Any, **inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(interpreter result, compiled result)."""
    interpreted = np.asarray(evaluate(mod, inputs))
    compiled = np.asarray(build(mod, "llvm").run(**inputs))
    return interpreted, compiled


@np.errstate(over="ignore")  # values past float32's range on purpose
def boundary_values(dtype: str) -> np.ndarray:
    """float32 values that probe every rounding decision of `dtype`: each finite code's value, the midpoints
    between neighbouring codes (ties), their float32 neighbours, values past the largest finite value,
    float32 subnormals, signed zeros, infinities, NaN and random values across the range."""
    if dtype == "bfloat16":
        codes = np.arange(0, 65536, 97, dtype=np.uint16)
    else:
        codes = np.arange(16 if dtype == "float4_e2m1fn" else 256, dtype=np.uint8)
    values = codes.view(np_type(dtype)).astype(np.float32)
    finite = np.unique(np.abs(values[np.isfinite(values)]))
    mids = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    big = float(finite[-1])
    extra = np.array([big * 1.0625, big * 1.125, big * 1.5, big * 2, 3.0e38, 1e-45, 1e-40, 1.2e-38, 0.0,
                      np.inf, np.nan], dtype=np.float32)
    pool = np.concatenate([finite, mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(0)), extra,
                           RNG.uniform(-big * 1.2, big * 1.2, 300).astype(np.float32),
                           np.exp2(RNG.uniform(-140, 130, 300)).astype(np.float32)])
    signed = np.concatenate([pool, -pool])
    nan_payloads = np.array([0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0xFFBFFFFF], dtype=np.uint32).view(np.float32)
    return np.concatenate([signed, nan_payloads]).astype(np.float32)


# --- code -> float32 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [*SMALL_FLOATS, "float8_e8m0fnu", "bfloat16"])
def test_every_code_converts_to_float32_exactly(dtype: str) -> None:
    count = {"bfloat16": 65536, "float4_e2m1fn": 16}.get(dtype, 256)  # float4: a byte's low 4 bits
    codes = np.arange(count, dtype=np.uint16 if count > 256 else np.uint8)
    x = codes.view(np_type(dtype))
    expected = x.astype(np.float32)
    for got in run_both(cast_module(dtype, "float32", count), x=x):
        assert got.dtype == np.float32
        assert np.array_equal(np.isnan(got), np.isnan(expected))
        finite = ~np.isnan(expected)
        # bit patterns, so that the sign of zero counts
        assert np.array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32))


# --- float32 -> code ----------------------------------------------------------------------------------


def expected_codes(x: np.ndarray, dtype: str, saturate: bool) -> np.ndarray:
    target = np_type(dtype)
    if dtype in FLOAT8 and saturate:
        info = ml_dtypes.finfo(target)
        with np.errstate(all="ignore"):
            return codes_of(np.clip(x, float(info.min), float(info.max)).astype(target))
    with np.errstate(all="ignore"):
        return codes_of(x.astype(target))


@pytest.mark.parametrize("dtype", [*SMALL_FLOATS, "bfloat16"])
@pytest.mark.parametrize("saturate", [True, False])
def test_float32_converts_bit_exactly(dtype: str, saturate: bool) -> None:
    x = boundary_values(dtype)
    mod = cast_module("float32", dtype, x.size, f", saturate={saturate}")
    want = expected_codes(x, dtype, saturate)
    for got in run_both(mod, x=x):
        assert got.dtype == np_type(dtype)
        bad = codes_of(got) != want
        assert not bad.any(), f"{dtype}: {x[bad][:8]} gave {codes_of(got)[bad][:8]}, expected {want[bad][:8]}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2fnuz", "float4_e2m1fn"])
def test_float64_and_integers_round_once(dtype: str) -> None:
    # values just off the narrow type's ties by less than float32 resolves: rounding through float32 to
    # nearest would land on the tie and round to even, the wrong way for half of them
    x32 = boundary_values(dtype)
    x32 = x32[np.isfinite(x32)]
    x64 = np.concatenate([x32.astype(np.float64) * (1 + 2.0**-30), x32.astype(np.float64) * (1 - 2.0**-30),
                          np.array([1e300, -1e300, 5e-324])])
    with np.errstate(all="ignore"):
        want = codes_of(x64.astype(np_type(dtype)))
        for got in run_both(cast_module("float64", dtype, x64.size, ", saturate=False"), x=x64):
            assert np.array_equal(codes_of(got), want)
        ints = np.concatenate([np.arange(-70000, 70000, 997), [2**24 + 1, 2**31 - 1, -(2**31)]]).astype(np.int32)
        for got in run_both(cast_module("int32", dtype, ints.size, ", saturate=False"), x=ints):
            assert np.array_equal(codes_of(got), codes_of(ints.astype(np_type(dtype))))


def test_saturate_clamps_and_overflow_follows_the_type() -> None:
    x = np.array([1e6, -1e6, np.inf, -np.inf, 500.0], dtype=np.float32)
    clamped = run_both(cast_module("float32", "float8_e4m3fn", 5), x=x)[1].astype(np.float32)
    assert list(clamped) == [448, -448, 448, -448, 448]
    overflowed = run_both(cast_module("float32", "float8_e5m2", 5, ", saturate=False"), x=x * 100)[1]
    assert list(overflowed.astype(np.float32)[:4]) == [np.inf, -np.inf, np.inf, -np.inf]
    nan_only = run_both(cast_module("float32", "float8_e4m3fnuz", 5, ", saturate=False"), x=x)[1]
    assert np.isnan(nan_only.astype(np.float32)[:4]).all() and codes_of(nan_only)[0] == 0x80


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [True, False])
def test_e8m0_rounds_as_onnx(round_mode: str, saturate: bool) -> None:
    x = boundary_values("float8_e8m0fnu")
    x = np.concatenate([x, np.float32(2.0) ** np.arange(-149, 128, dtype=np.float32) * np.float32(1.5)])
    mod = cast_module("float32", "float8_e8m0fnu", x.size, f', saturate={saturate}, round_mode="{round_mode}"')
    want = codes_of(onnx.numpy_helper.to_float8e8m0(x, saturate, round_mode))
    for got in run_both(mod, x=x):
        assert np.array_equal(codes_of(got), want)


def test_bfloat16_keeps_nan_quiet_and_rounds_ties_to_even() -> None:
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, np.nan, -np.inf], dtype=np.float32)  # ties: down, then up
    for got in run_both(cast_module("float32", "bfloat16", 4), x=x):
        assert list(codes_of(got)[:2]) == [0x3F80, 0x3F82]
        assert np.isnan(got[2].astype(np.float32)) and got[3].astype(np.float32) == -np.inf


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e8m0fnu", "int4"])
def test_conversions_stay_vector_code(dtype: str) -> None:
    # a vectorized loop converting both ways: every lane's conversion in one vector instruction stream,
    # no scalar calls (the lane count comes from the target, whatever its vector width)
    n = 1024
    i = LoopVar("i")
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    narrow = tir.Cast(dtype, x[i], saturate=True, round_mode="up" if dtype == "float8_e8m0fnu" else "")
    func = PrimFunc("lowp_round_trip", (x, y), For(i, n, Store(y, (i,), tir.Cast("float32", narrow)),
                                                     ForKind.VECTORIZED))
    text = emit_llvm_ir([func], Target.host().with_cores(1), optimize=True)
    assert re.search(r"<\d+ x i(8|32)>", text) and "call float @" not in text
    values = RNG.uniform(-500, 500, n).astype(np.float32)
    out = np.empty(n, np.float32)
    build_llvm([func], Target.host().with_cores(1)).get(func.name)(values, out)  # type: ignore[arg-type]
    with np.errstate(invalid="ignore"):
        want = convert(values, dtype, True, "up").astype(np.float32)
    np.testing.assert_array_equal(out, want)


# --- sub-byte integers --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", SUB_BYTE_INTS)
def test_sub_byte_integers_convert_as_ml_dtypes(dtype: str) -> None:
    floats = np.concatenate([np.arange(-12, 20, 0.25), [np.nan, np.inf, -np.inf, 1e10]]).astype(np.float32)
    with np.errstate(invalid="ignore"):
        want = floats.astype(np_type(dtype))
    for got in run_both(cast_module("float32", dtype, floats.size), x=floats):
        assert np.array_equal(codes_of(got), codes_of(want))
    ints = np.arange(-300, 301, 7, dtype=np.int32)  # wrap around
    for got in run_both(cast_module("int32", dtype, ints.size), x=ints):
        assert np.array_equal(codes_of(got), codes_of(ints.astype(np_type(dtype))))
    values = np.arange(1 << int(dtype[-1]), dtype=np.uint8).view(np_type(dtype))  # every code back
    for target in ("float32", "int8"):
        for got in run_both(cast_module(dtype, target, values.size), x=values):
            assert np.array_equal(got, values.astype(target))


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int2"])
def test_sub_byte_arithmetic_wraps_as_ml_dtypes(dtype: str) -> None:
    mod = parse_module(f"""#[version = "0.0.5"]
def @main(%a: Tensor[(37), {dtype}], %b: Tensor[(37), {dtype}]) {{
  %0 = add(%a, %b);
  %1 = multiply(%0, %b);
  (%1, abs(%a), less(%0, %a))
}}""")
    info = ml_dtypes.iinfo(np_type(dtype))
    a, b = (RNG.integers(int(info.min), int(info.max) + 1, 37).astype(np_type(dtype)) for _ in range(2))
    interpreted = evaluate(mod, {"a": a, "b": b})
    compiled = build(mod, "llvm").run(a=a, b=b)
    for got, want in zip(compiled, interpreted):
        assert np.array_equal(np.asarray(got), np.asarray(want))
    assert np.array_equal(np.asarray(compiled[0]), (a + b) * b)


# --- ONNX models --------------------------------------------------------------------------------------


def onnx_model(op: str, inputs: dict[str, np.ndarray], out_type: int, **attrs: Any) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in inputs.items()]
    out = helper.make_tensor_value_info("y", out_type, None)
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    graph = helper.make_graph([node], "g", ins, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)], ir_version=11)


@np.errstate(invalid="ignore")  # out-of-range float -> int4 conversions, which give 0
def check_onnx(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> None:
    (want,) = ReferenceEvaluator(model).run(None, inputs)
    mod, _ = from_onnx(model)
    for got in run_both(mod, **inputs):
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.dtype.kind == "V":  # ml_dtypes values, as float32 (NaNs of any payload are equal)
            np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
        else:
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("dtype", "to"), [
    ("bfloat16", onnx.TensorProto.BFLOAT16), ("float8_e4m3fn", onnx.TensorProto.FLOAT8E4M3FN),
    ("float8_e5m2fnuz", onnx.TensorProto.FLOAT8E5M2FNUZ), ("float4_e2m1fn", onnx.TensorProto.FLOAT4E2M1),
    ("int4", onnx.TensorProto.INT4), ("uint2", onnx.TensorProto.UINT2),
])
def test_onnx_cast_and_cast_like_round_trip(dtype: str, to: int) -> None:
    x = (RNG.standard_normal((3, 5, 7)) * 4).astype(np.float32)
    check_onnx(onnx_model("Cast", {"x": x}, to, to=to), {"x": x})
    with np.errstate(invalid="ignore"):
        narrow = x.astype(np_type(dtype))
    check_onnx(onnx_model("Cast", {"x": narrow}, onnx.TensorProto.FLOAT, to=onnx.TensorProto.FLOAT), {"x": narrow})
    like = np.zeros((1,), np_type(dtype))
    check_onnx(onnx_model("CastLike", {"x": x, "like": like}, to), {"x": x, "like": like})


def test_onnx_cast_without_saturation_and_e8m0_rounding() -> None:
    x = np.array([[0.3, 700.0, -1e5], [np.inf, -2.5, 1e-9]], dtype=np.float32)
    to = onnx.TensorProto.FLOAT8E4M3FN
    check_onnx(onnx_model("Cast", {"x": x}, to, to=to, saturate=0), {"x": x})
    e8m0 = onnx.TensorProto.FLOAT8E8M0
    check_onnx(onnx_model("Cast", {"x": np.abs(x)}, e8m0, to=e8m0, round_mode="nearest"), {"x": np.abs(x)})


@pytest.mark.parametrize(("value", "to"), [
    (np.array([[1.5, -2.25, 3.0]], dtype=ml_dtypes.bfloat16), onnx.TensorProto.INT16),
    (np.arange(0, 256, 3, dtype=np.uint8).reshape(1, 86), onnx.TensorProto.FLOAT8E5M2),
    (np.array([-7, 3, 8, 100], dtype=np.int8), onnx.TensorProto.UINT8),
    (np.array([True, False, True]), onnx.TensorProto.UINT8),
    (RNG.standard_normal((5, 3)).astype(np.float16), onnx.TensorProto.BFLOAT16),
    (np.array([-8, -1, 0, 7, 3], dtype=ml_dtypes.int4), onnx.TensorProto.UINT4),
    (np.array([0.5, -6, 1.5], dtype=ml_dtypes.float4_e2m1fn), onnx.TensorProto.INT4),
])
def test_onnx_bitcast(value: np.ndarray, to: int) -> None:
    check_onnx(onnx_model("BitCast", {"x": value}, to, to=to), {"x": value})


# --- arithmetic, text, errors -------------------------------------------------------------------------


def test_bfloat16_arithmetic_compiles_in_float32() -> None:
    text = """#[version = "0.0.5"]
def @main(%a: Tensor[(5, 33), bfloat16], %b: Tensor[(7, 33), bfloat16], %c: Tensor[(5, 7), bfloat16]) {
  %0 = nn.dense(%a, %b);
  %1 = add(%0, %c);
  %2 = exp(%1);
  multiply(%2, %c)
}"""
    mod = parse_module(text)
    inputs = {"a": RNG.standard_normal((5, 33)).astype(ml_dtypes.bfloat16),
              "b": RNG.standard_normal((7, 33)).astype(ml_dtypes.bfloat16),
              "c": RNG.uniform(-1, 1, (5, 7)).astype(ml_dtypes.bfloat16)}
    interpreted, compiled = run_both(mod, **inputs)
    assert compiled.dtype == np_type("bfloat16")
    np.testing.assert_allclose(compiled.astype(np.float32), interpreted.astype(np.float32), rtol=0.05, atol=0.05)
    # an element-wise sum is float32 addition rounded once: exact against ml_dtypes
    add = parse_module("""#[version = "0.0.5"]
def @main(%c: Tensor[(5, 7), bfloat16], %d: Tensor[(5, 7), bfloat16]) { add(%c, %d) }""")
    d = RNG.standard_normal((5, 7)).astype(ml_dtypes.bfloat16)
    for got in run_both(add, c=inputs["c"], d=d):
        assert np.array_equal(codes_of(got), codes_of(inputs["c"] + d))


def test_text_round_trip_of_types_attributes_and_constants() -> None:
    text = """#[version = "0.0.5"]
def @main(%x: Tensor[(3), float8_e4m3fnuz], %y: Tensor[(3), bfloat16], %z: Tensor[(2), int4]) {
  %0 = cast(%x, dtype="bfloat16", saturate=False);
  %1 = add(%0, %y);
  %2 = add(%1, meta[relay.Constant][0]);
  %3 = cast(%z, dtype="float8_e8m0fnu", round_mode="down");
  (%2, %3, reinterpret(%y, dtype="float16"))
}"""
    constant = np.array([0.5, -1.25, 3.0], dtype=ml_dtypes.bfloat16)
    mod = parse_module(text, constants=[constant])
    consts: list[np.ndarray] = []
    printed = print_module(mod, constants_out=consts)
    assert printed == print_module(parse_module(printed, constants=consts))
    assert "float8_e4m3fnuz" in printed and 'round_mode="down"' in printed and consts[0].dtype == constant.dtype
    assert set(FLOAT_FORMATS) <= {"bfloat16", *SMALL_FLOATS, "float8_e8m0fnu"}


def test_compiled_model_saves_and_loads_low_precision_buffers(tmp_path: Any) -> None:
    constant = np.array([0.5, -1.25, 3.0], dtype=ml_dtypes.bfloat16)
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(3), bfloat16], %q: Tensor[(3), int4]) {
  (add(%x, meta[relay.Constant][0]), cast(%q, dtype="float8_e4m3fn"))
}""", constants=[constant])
    x, q = np.array([1, 2, 3], ml_dtypes.bfloat16), np.array([-8, 7, 1], ml_dtypes.int4)
    loaded = load(build(mod, "llvm").save(tmp_path / "m.rtmod"))
    total, converted = loaded.run(x=x, q=q)
    assert total.dtype == constant.dtype and list(total.astype(np.float32)) == [1.5, 0.75, 6.0]
    assert converted.dtype == np_type("float8_e4m3fn") and list(converted.astype(np.float32)) == [-8, 7, 1]


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint2",
                                   "int2"])
def test_tuning_runner_inputs_sentinels_and_checks(dtype: str) -> None:
    spec = TensorSpec((5, 7), dtype)
    (values,) = random_inputs([spec], seed=3)
    assert values.dtype == np_type(dtype)
    wide = values.astype(np.float64)
    info = ml_dtypes.finfo(values.dtype) if dtype.startswith(("float", "bfloat")) else ml_dtypes.iinfo(values.dtype)
    assert np.isfinite(wide).all() and (wide >= float(info.min)).all() and (wide <= float(info.max)).all()
    assert (wide != 0).any()
    assert compare_outputs(values, values.copy(), DEFAULT_TOLERANCES, 0) is None
    # never-written outputs are caught (the sentinel differs from the values)
    assert compare_outputs(_sentinel_fill(spec), values, DEFAULT_TOLERANCES, 0) is not None


def test_workload_keys_of_default_casts_are_unchanged() -> None:
    # `saturate` and `round_mode` came after tuning logs keyed casts without them: at their defaults they stay
    # out of the key (existing records still match); set, they are part of it
    def canonical(attrs: str) -> str:
        mod = optimize(parse_module(f"""#[version = "0.0.5"]
def @main(%x: Tensor[(4, 8), float32]) {{ nn.relu(cast(%x, dtype="float8_e4m3fn"{attrs})) }}"""))
        (func,) = {call.op for call in primitive_calls(mod)}
        return canonical_text(func)

    assert "cast(" in canonical("") and "saturate" not in canonical("") and "round_mode" not in canonical("")
    assert "saturate=bool:False" in canonical(", saturate=False")


def test_clear_errors() -> None:
    with pytest.raises(RelayTypeError, match="differ in width"):
        infer_types(parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(3), float32]) { reinterpret(%x, dtype="bfloat16") }"""))
    with pytest.raises(RelayTypeError, match="round_mode"):
        infer_types(parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(3), float32]) { cast(%x, dtype="float8_e8m0fnu", round_mode="sideways") }"""))
    x = np.ones((2,), np.float32)
    bad = onnx_model("Cast", {"x": x}, onnx.TensorProto.FLOAT8E8M0, to=onnx.TensorProto.FLOAT8E8M0,
                     round_mode="sideways")
    with pytest.raises(OnnxModelError, match="round_mode"):
        from_onnx(bad)
    # an initializer of a low-precision type imports as a constant of that type
    weights = numpy_helper.from_array(np.array([1, -2, 7], dtype=ml_dtypes.int4), "w")
    graph = helper.make_graph([helper.make_node("Cast", ["w"], ["y"], to=onnx.TensorProto.FLOAT)], "g", [],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])], [weights])
    mod, _ = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)]))
    assert list(np.asarray(evaluate(mod, {}))) == [1, -2, 7]
