"""SimplifyRequantize: exact simplifications of quantize / dequantize chains.

- integer round trips `cast(cast(x, uint8/int8), float32)` go where `x` is provably whole, in range and never -0.0,
  and stay where it is not (no rounding, a clip wider than the type, a possible -0.0, another use of the integer);
- identity requantizations Q(DQ(q)) (equal scales and zero points, per-tensor or per-channel) become `q`; unequal
  ones (in any channel) stay;
- `add(x, 0f)` before a clip that is cast to an integer goes; one whose clip stays float stays; `add(x, -0f)` goes;
- every rewritten module equals the interpreter on the original bit for bit on random data with -0.0, ties and
  out-of-range values; compiled modules stay within one quantization step of the interpreter; a QDQ ONNX model
  built with the pass stays within one quantization step of onnxruntime's unoptimised session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import Interpreter
from relay_tune.ir import Call, IRModule, post_order
from relay_tune.passes import PassConfig, Sequential, SimplifyRequantize
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(20261207)
SHAPE = (1, 3, 5, 7)
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


def simplified(mod: IRModule) -> IRModule:
    """`mod` after SimplifyRequantize alone."""
    return Sequential((SimplifyRequantize(),)).run(infer_types(mod), PassConfig(opt_level=3))


def calls(mod: IRModule, name: str, **attrs: object) -> int:
    """How many calls of `name` with these attrs `mod`'s main function holds."""
    return sum(1 for node in post_order(mod["main"]) if isinstance(node, Call) and node.op_name == name
               and all(str(node.attrs.get(k)) == str(v) for k, v in attrs.items()))


def float_data(shape: tuple[int, ...] = SHAPE, spread: float = 8.0) -> np.ndarray:
    """Random floats with the awkward values of a quantizer: -0.0, +0.0, halves (ties), small negatives that round
    to -0.0, and values far outside the 8-bit range."""
    x = (RNG.standard_normal(shape) * spread).astype(np.float32)
    flat = x.reshape(-1)
    flat[:10] = [-0.0, 0.0, 0.5, -0.5, 1.5, 2.5, -0.3, 1e6, -1e6, 254.5]
    return x


def assert_same_bits(before: IRModule, after: IRModule, inputs: dict[str, np.ndarray]) -> None:
    want = np.asarray(Interpreter(before).run(inputs))
    got = np.asarray(Interpreter(after).run(inputs))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit for bit: +0.0 is not -0.0


def requantize_dequantize(dtype: str, zero: float, scale: float = 0.37, lo: float | None = None,
                          hi: float | None = None, rounding: str = "round", zero_add: bool = True,
                          second_use: bool = False) -> IRModule:
    """A requantize (divide, round, add zero point, clip, cast) followed by the dequantize of the same value."""
    lo = RANGES[dtype][0] if lo is None else lo
    hi = RANGES[dtype][1] if hi is None else hi
    rounded = f"{rounding}(%0)" if rounding else "%0"
    added = f"add(%1, {zero}f)" if zero_add else "%1"
    result = "(%7, %4)" if second_use else "%7"
    return parse_module(f'''#[version = "0.0.5"]
def @main(%x: Tensor[{SHAPE}, float32]) {{
  %0 = divide(%x, {scale}f);
  %1 = {rounded};
  %2 = {added};
  %3 = clip(%2, a_min={lo}f, a_max={hi}f);
  %4 = cast(%3, dtype="{dtype}");
  %5 = cast(%4, dtype="float32");
  %6 = subtract(%5, {zero}f);
  %7 = multiply(%6, 0.5f);
  {result}
}}''')


@pytest.mark.parametrize(("dtype", "zero"), [("uint8", 126), ("uint8", 0), ("int8", -3), ("int8", 0)])
@pytest.mark.parametrize("rounding", ["round", "floor", "ceil"])
def test_round_trip_of_a_whole_in_range_value_goes(dtype: str, zero: int, rounding: str) -> None:
    mod = infer_types(requantize_dequantize(dtype, zero, rounding=rounding))
    after = simplified(mod)
    assert calls(mod, "cast", dtype=dtype) == 1 and calls(after, "cast", dtype=dtype) == 0
    assert_same_bits(mod, after, {"x": float_data()})


@pytest.mark.parametrize(("variant", "options"), [
    ("no rounding: not whole", {"rounding": ""}),
    ("clip wider than uint8", {"hi": 300}),
    ("clip bound not whole", {"hi": 254.5}),
    ("round may give -0.0 and no add removes it", {"zero_add": False}),
    ("the integer tensor has another use", {"second_use": True}),
])
def test_round_trip_that_is_not_provably_exact_stays(variant: str, options: dict[str, object]) -> None:
    mod = infer_types(requantize_dequantize("uint8", 0, **options))  # type: ignore[arg-type]
    after = simplified(mod)
    assert calls(after, "cast", dtype="uint8") == 1, variant
    assert_same_bits(mod, after, {"x": float_data()})


def test_int8_round_trip_without_zero_add_keeps_negative_zero() -> None:
    # round(-0.3) is -0.0 and clip(-128, 127) keeps it; the int8 round trip gives +0.0: it must stay
    mod = infer_types(requantize_dequantize("int8", 0, zero_add=False))
    after = simplified(mod)
    assert calls(after, "cast", dtype="int8") == 1
    assert_same_bits(mod, after, {"x": float_data()})


def qdq_requantize(dtype: str, dq_scale: str, dq_zero: str, q_scale: str, q_zero: str,
                   consts: tuple[np.ndarray, ...] = ()) -> IRModule:
    """Q(DQ(q)): `q` dequantized with (dq_scale, dq_zero) and quantized again with (q_scale, q_zero); the four are
    Relay constants in text (`0.5f`) or `meta[relay.Constant][i]` of `consts`."""
    lo, hi = RANGES[dtype]
    text = f'''#[version = "0.0.5"]
def @main(%q: Tensor[{SHAPE}, {dtype}]) {{
  %0 = cast(%q, dtype="float32");
  %1 = subtract(%0, {dq_zero});
  %2 = multiply(%1, {dq_scale});
  %3 = divide(%2, {q_scale});
  %4 = round(%3);
  %5 = add(%4, {q_zero});
  %6 = clip(%5, a_min={lo}f, a_max={hi}f);
  cast(%6, dtype="{dtype}")
}}'''
    mod = parse_module(text, constants=list(consts)) if consts else parse_module(text)
    return infer_types(mod)


def byte_data(dtype: str) -> np.ndarray:
    lo, hi = RANGES[dtype]
    x = RNG.integers(lo, hi + 1, SHAPE).astype(dtype)
    x.reshape(-1)[:2] = (lo, hi)
    return x


@pytest.mark.parametrize(("dtype", "zero"), [("uint8", "131f"), ("uint8", "0f"), ("int8", "-7f"), ("int8", "0f")])
@pytest.mark.parametrize("scale", ["0.0371f", "0.1f", "3f", "1e-06f"])
def test_identity_requantize_becomes_its_input(dtype: str, zero: str, scale: str) -> None:
    mod = qdq_requantize(dtype, scale, zero, scale, zero)
    after = simplified(mod)
    assert calls(after, "cast") == 0 and calls(after, "round") == 0
    assert_same_bits(mod, after, {"q": byte_data(dtype)})


def per_channel(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).reshape(3, 1, 1)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_per_channel_identity_requantize_becomes_its_input(dtype: str) -> None:
    scale = per_channel([0.0371, 0.25, 0.0062])
    zero = per_channel([3, 0, 17] if dtype == "uint8" else [-3, 0, 5])
    mod = qdq_requantize(dtype, "meta[relay.Constant][0]", "meta[relay.Constant][1]",
                         "meta[relay.Constant][0]", "meta[relay.Constant][1]", (scale, zero))
    after = simplified(mod)
    assert calls(after, "cast") == 0
    assert_same_bits(mod, after, {"q": byte_data(dtype)})


@pytest.mark.parametrize(("variant", "dq", "q"), [
    ("unequal scales", ("0.05f", "3f"), ("0.1f", "3f")),
    ("unequal zero points", ("0.05f", "3f"), ("0.05f", "4f")),
    ("scales one ulp apart", ("0.05f", "3f"), ("0.050000004f", "3f")),
])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_requantize_that_is_not_the_identity_stays(variant: str, dq: tuple[str, str], q: tuple[str, str],
                                                   dtype: str) -> None:
    mod = qdq_requantize(dtype, dq[0], dq[1], q[0], q[1])
    after = simplified(mod)
    # "scales one ulp apart" may or may not be the identity; whichever the pass decides, it must be exact
    if variant != "scales one ulp apart":
        assert calls(after, "cast", dtype=dtype) == 1, variant
    assert_same_bits(mod, after, {"q": byte_data(dtype)})


def test_per_channel_requantize_with_one_channel_off_stays() -> None:
    scale = per_channel([0.0371, 0.25, 0.0062])
    other = per_channel([0.0371, 0.25, 0.0124])  # the last channel halves: not the identity there
    zero = per_channel([3, 0, 17])
    mod = qdq_requantize("uint8", "meta[relay.Constant][0]", "meta[relay.Constant][2]",
                         "meta[relay.Constant][1]", "meta[relay.Constant][2]", (scale, other, zero))
    after = simplified(mod)
    assert calls(after, "cast", dtype="uint8") == 1
    assert_same_bits(mod, after, {"q": byte_data("uint8")})


def zero_add_program(zero: str, tail: str) -> IRModule:
    return infer_types(parse_module(f'''#[version = "0.0.5"]
def @main(%x: Tensor[{SHAPE}, float32]) {{
  %0 = divide(%x, 0.3f);
  %1 = round(%0);
  %2 = add(%1, {zero});
  %3 = clip(%2, a_min=-128f, a_max=127f);
  {tail}
}}'''))


@pytest.mark.parametrize(("zero", "tail", "dropped"), [
    ("0f", 'cast(%3, dtype="int8")', True),  # -0.0 or +0.0: the int8 cast cannot tell
    ("0f", 'cast(%3, dtype="int32")', True),
    ("0f", '%3', False),  # the clip's float result keeps the sign of zero the add gave it
    ("0f", '(cast(%3, dtype="int8"), %3)', False),
    ("-0f", '%3', True),  # x + -0.0 is x for every x
    ("1f", 'cast(%3, dtype="int8")', False),
])
def test_zero_add_before_an_integer_clip(zero: str, tail: str, dropped: bool) -> None:
    mod = zero_add_program(zero, tail)
    after = simplified(mod)
    assert calls(after, "add") == (0 if dropped else 1)
    assert_same_bits(mod, after, {"x": float_data()})


@pytest.mark.parametrize(("dtype", "zero"), [("uint8", 126), ("int8", -3)])
def test_compiled_chains_equal_the_interpreter(dtype: str, zero: int) -> None:
    lo, hi = RANGES[dtype]
    mod = infer_types(parse_module(f'''#[version = "0.0.5"]
def @main(%x: Tensor[(2, 5, 9, 11), float32], %q: Tensor[(2, 5, 9, 11), {dtype}]) {{
  %0 = divide(%x, 0.37f);
  %1 = round(%0);
  %2 = add(%1, {zero}f);
  %3 = clip(%2, a_min={lo}f, a_max={hi}f);
  %4 = cast(%3, dtype="{dtype}");
  %5 = cast(%4, dtype="float32");
  %6 = subtract(%5, {zero}f);
  %7 = multiply(%6, 0.37f);
  %8 = cast(%q, dtype="float32");
  %9 = subtract(%8, {zero}f);
  %10 = multiply(%9, 0.21f);
  %11 = divide(%10, 0.21f);
  %12 = round(%11);
  %13 = add(%12, {zero}f);
  %14 = clip(%13, a_min={lo}f, a_max={hi}f);
  %15 = cast(%14, dtype="{dtype}");
  %16 = cast(%15, dtype="float32");
  %17 = subtract(%16, {zero}f);
  %18 = multiply(%17, 0.21f);
  %19 = add(%7, %18);
  %20 = nn.relu(%19);
  %21 = divide(%20, 0.5f);
  %22 = round(%21);
  %23 = add(%22, 0f);
  %24 = clip(%23, a_min={lo}f, a_max={hi}f);
  cast(%24, dtype="{dtype}")
}}'''))
    assert calls(simplified(mod), "cast", dtype=dtype) == 1
    x = float_data((2, 5, 9, 11), spread=30.0)
    q = RNG.integers(lo, hi + 1, (2, 5, 9, 11)).astype(dtype)
    want = np.asarray(Interpreter(mod).run({"x": x, "q": q}))
    got = np.asarray(relay_tune.build(mod, "llvm", opt_level=3, build_cache=False).run(x=x, q=q))
    assert got.dtype == want.dtype
    # the compiled dequantize-and-add may contract to a fused multiply-add (with or without the pass): a value on a
    # rounding tie can land one step away from the interpreter's
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1
    assert np.count_nonzero(got != want) <= got.size // 100


def test_qdq_onnx_model_equals_onnxruntime(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from relay_tune.frontend import from_onnx
    from relay_tune.passes import optimize

    rng = np.random.default_rng(5)
    shape = (1, 6, 11, 9)

    def weight(name: str, dims: tuple[int, ...]) -> object:
        return helper.make_tensor(name, TensorProto.FLOAT, dims, rng.standard_normal(int(np.prod(dims))).astype(
            np.float32) * 0.3)

    # a residual block: the block's 1x1 convs requantize, the add reads two dequantized tensors
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2"], ["c2"]),
         helper.make_node("Conv", ["x", "w3"], ["c3"]),
         helper.make_node("Add", ["c2", "c3"], ["s"]),
         helper.make_node("Relu", ["s"], ["r"]),
         helper.make_node("Conv", ["r", "w4"], ["y"])],
        "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight("w1", (8, 6, 3, 3)), weight("w2", (8, 8, 1, 1)), weight("w3", (8, 6, 1, 1)),
         weight("w4", (5, 8, 1, 1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    src, dst = tmp_path / "block.onnx", tmp_path / "block.int8.onnx"
    onnx.save(model, str(src))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, extra_options={"WeightSymmetric": True})
    mod = infer_types(from_onnx(onnx.load(str(dst)))[0])
    with_pass = optimize(mod, opt_level=3, config=PassConfig(disabled_passes=frozenset({"FuseOps"})))
    without = optimize(mod, opt_level=3, config=PassConfig(disabled_passes=frozenset({"FuseOps",
                                                                                      "SimplifyRequantize"})))
    assert calls(with_pass, "cast", dtype="uint8") < calls(without, "cast", dtype="uint8")
    x = rng.standard_normal(shape).astype(np.float32)
    assert_same_bits(without, with_pass, {"x": x})
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = np.asarray(relay_tune.build(mod, "llvm", opt_level=3, build_cache=False).run(x=x))
    scale = float(onnx.numpy_helper.to_array(next(i for i in onnx.load(str(dst)).graph.initializer
                                                  if i.name.startswith("y") and i.name.endswith("scale"))))
    assert np.abs(got - want).max() <= scale * 1.01  # one step of the output's quantization


@pytest.mark.parametrize(("dtype", "zero"), [("uint8", 131), ("int8", -7)])
def test_pooled_identity_requantize_leaves_the_8bit_pool_alone(dtype: str, zero: int) -> None:
    # QuantizedPooling moves the pool onto the 8-bit tensor; the requantize after it is then Q(DQ(q)), the identity
    from relay_tune.passes import QuantizedPooling

    lo, hi = RANGES[dtype]
    mod = infer_types(parse_module(f'''#[version = "0.0.5"]
def @main(%x: Tensor[(1, 5, 13, 11), {dtype}]) {{
  %0 = cast(%x, dtype="float32");
  %1 = subtract(%0, {zero}f);
  %2 = multiply(%1, 0.0371f);
  %3 = nn.max_pool2d(%2, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1]);
  %4 = divide(%3, 0.0371f);
  %5 = round(%4);
  %6 = add(%5, {zero}f);
  %7 = clip(%6, a_min={lo}f, a_max={hi}f);
  cast(%7, dtype="{dtype}")
}}'''))
    after = Sequential((QuantizedPooling(), SimplifyRequantize())).run(mod, PassConfig(opt_level=4))
    assert calls(after, "cast") == 0 and calls(after, "nn.max_pool2d") == 1
    x = RNG.integers(lo, hi + 1, (1, 5, 13, 11)).astype(dtype)
    assert_same_bits(mod, after, {"x": x})


def relu_requantize(scale: str, zero: str, tail: str = 'cast(%5, dtype="uint8")', scale_op: str = "divide",
                    consts: tuple[np.ndarray, ...] = (), extra_use: bool = False) -> IRModule:
    """The requantize of a ReLU output: relu, scale, round, zero point, clip to uint8, `tail`."""
    result = f"({tail}, %0)" if extra_use else tail
    text = f'''#[version = "0.0.5"]
def @main(%x: Tensor[{SHAPE}, float32]) {{
  %0 = nn.relu(%x);
  %1 = {scale_op}(%0, {scale});
  %2 = round(%1);
  %3 = add(%2, {zero});
  %4 = add(%3, 0f);
  %5 = clip(%4, a_min=0f, a_max=255f);
  {result}
}}'''
    return infer_types(parse_module(text, constants=list(consts)) if consts else parse_module(text))


@pytest.mark.parametrize(("variant", "options", "dropped"), [
    ("zero point 0", {"scale": "0.37f", "zero": "0f"}, True),
    ("multiply by a positive scale", {"scale": "2.7f", "zero": "0f", "scale_op": "multiply"}, True),
    ("negative zero point", {"scale": "0.37f", "zero": "-3f"}, True),
    ("per-channel scales, zero points 0", {"scale": "meta[relay.Constant][0]", "zero": "meta[relay.Constant][1]",
                                           "consts": (per_channel([0.1, 0.37, 2.0]), per_channel([0, 0, 0]))}, True),
    ("zero point 5: relu(v) maps v < 0 to 5", {"scale": "0.37f", "zero": "5f"}, False),
    ("one channel's zero point 2", {"scale": "meta[relay.Constant][0]", "zero": "meta[relay.Constant][1]",
                                    "consts": (per_channel([0.1, 0.37, 2.0]), per_channel([0, 2, 0]))}, False),
    ("negative scale: not nondecreasing", {"scale": "-0.37f", "zero": "0f"}, False),
    ("the clip stays float", {"scale": "0.37f", "zero": "0f", "tail": "%5"}, False),
    ("the relu has another use", {"scale": "0.37f", "zero": "0f", "extra_use": True}, False),
])
def test_relu_before_a_requantize(variant: str, options: dict[str, object], dropped: bool) -> None:
    mod = relu_requantize(**options)  # type: ignore[arg-type]
    after = simplified(mod)
    assert calls(after, "nn.relu") == (0 if dropped else 1), variant
    assert_same_bits(mod, after, {"x": float_data(spread=30.0)})
