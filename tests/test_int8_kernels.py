"""Integer convolutions and dense products (uint8/int8 x int8 -> int32) and the QuantizedProducts pass.

- compiled integer products on odd shapes equal numpy's int64 products exactly;
- the four-byte dot-product intrinsics (`tir.DOT4_INTRINSICS`) are exact on every lane count and operand layout, and
  lower to vpmaddubsw + vpmaddwd (AVX2: once when the pairs fit int16, else on the weight's two halves; their sums
  added to the accumulator by an inline-assembly vpaddd on VEX targets) or vpdpbusd (VNNI targets);
- the packed int8 convolution (`nn.contrib_conv2d_NCHWc_int8`, family `conv2d_nchwc_int8`) that PlanLayouts makes of
  8-bit convolutions is exact at its default config and at sampled configs of its space, on odd channel counts,
  odd maps, stride 2 and zero-point padding, on the saturation-safe and the exact path, and its default register tile
  does not spill on AVX2;
- `QuantizedProducts` rewrites the float products of a QDQ model into integer ones (the int8 weight recovered from
  its dequantized float constant), leaves float models alone, and a QDQ model built with it matches onnxruntime's
  unoptimised QDQ graph (the float semantics) and onnxruntime's int8 kernels within one quantization step.
"""

from __future__ import annotations

import platform
import re
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relay_tune import build
from relay_tune.codegen.llvm import build_llvm, emit_assembly, emit_llvm_ir
from relay_tune.compile import resolve_target
from relay_tune.compile.primitive import build_primitive
from relay_tune.frontend import from_onnx
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call
from relay_tune.ir.traversal import post_order
from relay_tune.kernel import te, tir, tir_eval
from relay_tune.op.quantized import OP_NAME as INT8_CONV
from relay_tune.op.quantized import pack_int8_weight, unpack_int8_weight
from relay_tune.passes.pipeline import optimize
from relay_tune.passes.quantized_products import pairs_fit_int16, recover_int8_weight
from relay_tune.text import parse_module
from relay_tune.tuning.relay_task import tasks_from_module

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(20261207)


def _conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """NCHW x OIHW in int64 (numpy's oracle)."""
    x64 = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = x64.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for dy in range(kh):
        for dx in range(kw):
            patch = x64[:, :, dy:dy + stride * oh:stride, dx:dx + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, dy, dx].astype(np.int64))
    return out


@pytest.mark.parametrize("data_dtype", ["uint8", "int8"])
@pytest.mark.parametrize(("cin", "cout", "k", "stride", "size"), [
    (13, 19, 1, 1, 9), (7, 24, 3, 1, 11), (20, 9, 3, 2, 13), (32, 16, 1, 2, 7),
])
def test_integer_conv_is_exact(data_dtype: str, cin: int, cout: int, k: int, stride: int, size: int) -> None:
    info = np.iinfo(data_dtype)
    x = RNG.integers(info.min, info.max + 1, (1, cin, size, size + 2)).astype(data_dtype)
    w = RNG.integers(-128, 128, (cout, cin, k, k)).astype(np.int8)
    pad = k // 2
    oh, ow = (size + 2 * pad - k) // stride + 1, (size + 2 + 2 * pad - k) // stride + 1
    mod = parse_module(f'''#[version = "0.0.5"]
def @main(%x: Tensor[(1, {cin}, {size}, {size + 2}), {data_dtype}]) -> Tensor[(1, {cout}, {oh}, {ow}), int32] {{
  nn.conv2d(%x, meta[relay.Constant][0], strides=[{stride}, {stride}], padding=[{pad}, {pad}, {pad}, {pad}],
            channels={cout}, kernel_size=[{k}, {k}], out_dtype="int32")
}}''', constants=[w])
    want = _conv(x, w, stride, pad)
    got = build(mod, "llvm", opt_level=4).run(x=x)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(evaluate(mod, {"x": x}), want)


@pytest.mark.parametrize(("m", "k", "n"), [(1, 37, 13), (5, 64, 24), (3, 200, 7)])
def test_integer_dense_is_exact(m: int, k: int, n: int) -> None:
    x = RNG.integers(0, 256, (m, k)).astype(np.uint8)
    w = RNG.integers(-128, 128, (n, k)).astype(np.int8)
    mod = parse_module(f'''#[version = "0.0.5"]
def @main(%x: Tensor[({m}, {k}), uint8]) -> Tensor[({m}, {n}), int32] {{
  nn.dense(%x, meta[relay.Constant][0], units={n}, out_dtype="int32")
}}''', constants=[w])
    want = x.astype(np.int64) @ w.astype(np.int64).T
    np.testing.assert_array_equal(build(mod, "llvm", opt_level=4).run(x=x), want)


def test_recover_int8_weight() -> None:
    q = RNG.integers(-127, 128, (6, 5, 3, 3)).astype(np.int8)
    q[:, 0, 0, 0] = 127  # every channel reaches the grid's end, as a symmetric quantizer's largest value does
    whole = q.astype(np.float32) * np.float32(0.0123)
    got_q, got_s = recover_int8_weight(whole)  # type: ignore[misc]
    np.testing.assert_array_equal(got_q, q)
    np.testing.assert_allclose(got_s, 0.0123, rtol=1e-6)
    q[2] = q[2] // 3  # one scale for the tensor: channel 2 spans a third of the grid and is still on it
    got_q, _ = recover_int8_weight(q.astype(np.float32) * np.float32(0.0123))  # type: ignore[misc]
    np.testing.assert_array_equal(got_q, q)
    q[2, 0, 0, 0] = -127  # one scale per channel, each channel reaching the grid's end
    channel_scales = RNG.uniform(0.01, 0.1, (6, 1, 1, 1)).astype(np.float32)
    got_q, got_s = recover_int8_weight(q.astype(np.float32) * channel_scales)  # type: ignore[misc]
    np.testing.assert_array_equal(got_q, q)
    np.testing.assert_allclose(got_s, channel_scales.ravel(), rtol=1e-6)
    assert recover_int8_weight(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)) is None


# -- QDQ models ------------------------------------------------------------------------------------------------


def _float_model(kind: str) -> onnx.ModelProto:
    if kind == "conv":
        shape, out = [1, 5, 11, 9], [1, 12, 6, 5]
        w = RNG.normal(0, 0.3, (12, 5, 3, 3)).astype(np.float32)
        b = RNG.normal(0, 0.1, 12).astype(np.float32)
        w2 = RNG.normal(0, 0.3, (12, 12, 1, 1)).astype(np.float32)
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
                 helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"])]
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(w2, "w2")]
    else:
        shape, out = [3, 37], [3, 11]
        w = RNG.normal(0, 0.3, (37, 11)).astype(np.float32)
        b = RNG.normal(0, 0.1, 11).astype(np.float32)
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"])]
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _inputs(model: onnx.ModelProto) -> np.ndarray:
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    values = RNG.uniform(-1.5, 1.0, dims).astype(np.float32)  # an asymmetric range: a non-zero input zero point
    return np.where(values == 0, np.float32(0.25), values)


def _quantized(tmp_path: Any, kind: str, per_channel: bool, reduce_range: bool) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model = _float_model(kind)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": _inputs(model)} for _ in range(6)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, str(src))
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=per_channel, reduce_range=reduce_range)
    return onnx.load(str(dst))


def _session(model: onnx.ModelProto, optimize_graph: bool) -> Any:
    options = ort.SessionOptions()
    if not optimize_graph:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _output_step(model: onnx.ModelProto) -> float:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = next(n for n in model.graph.node if model.graph.output[0].name in n.output)
    assert node.op_type == "DequantizeLinear"
    return float(inits[node.input[1]])


def _integer_products(mod: Any) -> list[Call]:
    """The convolutions and dense products inside the fused functions of `mod`."""
    return [node for _, func in mod.items() for node in post_order(func) if isinstance(node, Call)
            and node.op_name in ("nn.conv2d", "nn.contrib_conv2d_NCHWc", "nn.contrib_conv2d_NCHWc_int8", "nn.dense")]


@pytest.mark.parametrize("kind", ["conv", "dense"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_model_runs_integer_products(tmp_path: Any, kind: str, per_channel: bool) -> None:
    qmodel = _quantized(tmp_path, kind, per_channel, reduce_range=True)
    mod, _ = from_onnx(qmodel)
    products = _integer_products(optimize(mod, opt_level=4, layout_block=8))
    assert products and all(str(p.checked_type.dtype) == "int32" for p in products)
    assert all(str(p.args[1].checked_type.dtype) == "int8" for p in products)
    compiled = build(mod, "llvm", opt_level=4)
    step = _output_step(qmodel)
    exact, fast = _session(qmodel, False), _session(qmodel, True)
    for _ in range(3):
        x = _inputs(_float_model(kind))
        got = compiled.run(x=x)
        np.testing.assert_allclose(got, exact.run(None, {"x": x})[0], rtol=0, atol=step * 1.01)
        np.testing.assert_allclose(got, fast.run(None, {"x": x})[0], rtol=0, atol=step * 1.01)
        np.testing.assert_allclose(evaluate(mod, {"x": x}), got, rtol=0, atol=step * 1.01)


def test_float_model_keeps_float_products() -> None:
    mod, _ = from_onnx(_float_model("conv"))
    products = _integer_products(optimize(mod, opt_level=4, layout_block=8))
    assert products and all(str(p.checked_type.dtype) == "float32" for p in products)


@pytest.mark.parametrize(("op", "stride", "x_zero"), [("QLinearConv", 1, 131), ("QLinearConv", 2, 0),
                                                      ("ConvInteger", 1, 77)])
def test_integer_operators_read_8_bit_operands(op: str, stride: int, x_zero: int) -> None:
    """QLinearConv and ConvInteger (int32 products of widened operands in the importer) run on the uint8 data and an
    int8 weight, padded with the zero point, exactly as onnx's reference says."""
    from onnx.reference import ReferenceEvaluator

    w = RNG.integers(-128, 128, (6, 5, 3, 3)).astype(np.int8)
    params = {"xs": np.array(0.05, np.float32), "xz": np.array(x_zero, np.uint8), "w": w,
              "ws": np.array(0.01, np.float32), "wz": np.array(0, np.int8), "ys": np.array(0.7, np.float32),
              "yz": np.array(120, np.uint8)}
    order = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"] if op == "QLinearConv" else ["x", "w", "xz", "wz"]
    out_type = TensorProto.UINT8 if op == "QLinearConv" else TensorProto.INT32
    node = helper.make_node(op, order, ["y"], pads=[1, 1, 1, 1], strides=[stride, stride])
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 5, 9, 7])],
                              [helper.make_tensor_value_info("y", out_type, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in params.items() if k in order])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    mod, _ = from_onnx(model)
    products = _integer_products(optimize(mod, opt_level=4, layout_block=8))
    assert products and all(str(p.args[0].checked_type.dtype) == "uint8" for p in products)
    assert all(str(p.args[1].checked_type.dtype) == "int8" for p in products)
    compiled = build(mod, "llvm", opt_level=4)
    for _ in range(2):
        x = RNG.integers(0, 256, (1, 5, 9, 7)).astype(np.uint8)
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        np.testing.assert_array_equal(compiled.run(x=x), want)
        np.testing.assert_array_equal(evaluate(mod, {"x": x}), want)


# -- the dot-product intrinsic -----------------------------------------------------------------------------------

X86 = platform.machine().lower() in ("x86_64", "amd64")


def _dot4_kernel(rows: int, quads: int, lanes: int, pairs: bool, weight_rows: bool) -> tir.PrimFunc:
    """`O[r, l] = sum_c dot4(X[r, 4c:4c+4], W[c, l, 0:4])` over a vectorized `l`; with `weight_rows=False` the
    weight is `V[c, k, l]` (the four bytes of a lane 'lanes' apart: the generic interleaving path)."""
    x = tir.Buffer("X", (rows, 4 * quads), "uint8")
    w = tir.Buffer("W", (quads, lanes, 4) if weight_rows else (quads, 4, lanes), "int8")
    o = tir.Buffer("O", (rows, lanes), "int32")
    r, lane, c = tir.LoopVar("r"), tir.LoopVar("l"), tir.LoopVar("c")
    row = [w[c, lane, k] if weight_rows else w[c, k, lane] for k in range(4)]
    dot = te.dot4_u8s8_i32([x[r, c * 4 + k] for k in range(4)], row, pairs)
    body = tir.seq(tir.Store(o, (r, lane), tir.IntImm(0, "int32")),
                   tir.For(c, quads, tir.Store(o, (r, lane), o[r, lane] + dot)))
    return tir.PrimFunc("dot4", (x, w, o), tir.For(r, rows, tir.For(lane, lanes, body, tir.ForKind.VECTORIZED)))


# x86-64: generic IR; core2: vpmaddubsw with plain adds (no VEX); sandybridge: 128-bit VEX, the accumulator added by
# inline-assembly vpaddd on xmm; the host (AVX2 or AVX-512): ymm or zmm
@pytest.mark.parametrize("target", ["llvm", *(["llvm -mcpu=x86-64", "llvm -mcpu=core2", "llvm -mcpu=sandybridge"]
                                              if X86 else [])])
@pytest.mark.parametrize("lanes", [1, 3, 8, 13, 16, 32])
@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("weight_rows", [True, False])
def test_dot4_intrinsic_is_exact(target: str, lanes: int, pairs: bool, weight_rows: bool) -> None:
    rows, quads = 3, 5
    func = _dot4_kernel(rows, quads, lanes, pairs, weight_rows)
    x = RNG.integers(0, 256, (rows, 4 * quads)).astype(np.uint8)
    limit = 64 if pairs else 128  # |w0| + |w1| <= 128 where the pairs must fit int16
    w = RNG.integers(-limit, limit, (quads, lanes, 4)).astype(np.int8)
    w[0, 0] = (-limit, -limit, limit - 1, -limit)  # the extremes
    x[0, :4] = 255
    o = np.zeros((rows, lanes), np.int32)
    build_llvm([func], resolve_target(target)).get("dot4")(x, w if weight_rows else w.transpose(0, 2, 1).copy(), o)
    want = np.einsum("rck,clk->rl", x.reshape(rows, quads, 4).astype(np.int64), w.astype(np.int64))
    np.testing.assert_array_equal(o, want)
    np.testing.assert_array_equal(evaluate_tir(func, x, w if weight_rows else w.transpose(0, 2, 1).copy()), want)


def evaluate_tir(func: tir.PrimFunc, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The loop-nest interpreter's output of a `_dot4_kernel`."""
    out = np.zeros(func.params[2].shape, np.int32)
    tir_eval.evaluate(func, x, w, out)
    return out


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize(("target", "pairs", "present", "absent"), [
    ("llvm -mcpu=haswell", True, ("vpmaddubsw", "vpmaddwd"), ("vpdpbusd",)),
    ("llvm -mcpu=haswell", False, ("vpmaddubsw", "vpsrlw"), ("vpdpbusd",)),   # exact: the weight's two halves
    ("llvm -mcpu=skylake-avx512", True, ("vpmaddubsw", "zmm"), ("vpdpbusd",)),
    ("llvm -mcpu=icelake-server", False, ("vpdpbusd",), ("vpmaddubsw",)),   # VNNI is exact
    ("llvm -mcpu=alderlake", False, ("{vex}", "vpdpbusd"), ("vpmaddubsw",)),   # AVX-VNNI
])
def test_dot4_intrinsic_instructions(target: str, pairs: bool, present: tuple[str, ...],
                                     absent: tuple[str, ...]) -> None:
    lanes = 16 if "avx512" in target or "icelake" in target else 8
    asm = emit_assembly([_dot4_kernel(2, 8, lanes, pairs, True)], resolve_target(target))
    for instruction in present:
        assert instruction in asm, instruction
    for instruction in absent:
        assert instruction not in asm, instruction


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize(("target", "register", "opaque"), [
    ("llvm -mcpu=core2", "xmm", False), ("llvm -mcpu=sandybridge", "xmm", True), ("llvm -mcpu=haswell", "ymm", True),
    ("llvm -mcpu=skylake-avx512", "zmm", True)])
@pytest.mark.parametrize("pairs", [False, True])
def test_dot4_accumulator_add_is_opaque_where_vex(target: str, register: str, opaque: bool, pairs: bool) -> None:
    # vpmaddubsw + vpmaddwd sums are added by inline assembly on VEX targets, so the machine combiner cannot regroup
    # the accumulation of unrolled quads (which kept the products live and made the register tile spill)
    lanes = {"xmm": 4, "ymm": 8, "zmm": 16}[register]
    func = _dot4_kernel(2, 8, lanes, pairs, True)
    ir_text = emit_llvm_ir([func], resolve_target(target))
    assert ("asm" in ir_text and "vpaddd $2, $1, $0" in ir_text) == opaque
    asm = emit_assembly([func], resolve_target(target))
    assert re.search(rf"vpaddd\s+%{register}", asm) if opaque else "vpaddd" not in asm and "paddd" in asm


# -- the packed int8 convolution -------------------------------------------------------------------------------

HOST = resolve_target("llvm -num-cores=2")


def _zero_point_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int, zero: int) -> np.ndarray:
    """`_conv` with the map padded by `zero` (the quantized zero point) instead of 0."""
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=zero)
    return _conv(padded, w, stride, 0)


def _padded_conv_module(x_shape: tuple[int, ...], w: np.ndarray, stride: int, pad: int, zero: int) -> Any:
    _, cin, h, wd = x_shape
    cout, _, k, _ = w.shape
    return parse_module(f'''#[version = "0.0.5"]
def @main(%x: Tensor[(1, {cin}, {h}, {wd}), uint8]) {{
  %0 = nn.pad(%x, meta[relay.Constant][1], pad_width=[[0, 0], [0, 0], [{pad}, {pad}], [{pad}, {pad}]]);
  nn.conv2d(%0, meta[relay.Constant][0], strides=[{stride}, {stride}], channels={cout}, kernel_size=[{k}, {k}],
            out_dtype="int32")
}}''', constants=[w, np.asarray(zero, np.uint8)])


PACKED_CONVS = [  # cin, cout, kernel, stride, height, width, zero point, weight limit (|w| < limit)
    (13, 19, 3, 2, 9, 11, 7, 65),      # odd channels (padded to blocks), zero-point padding, stride 2
    (16, 24, 1, 1, 7, 5, 0, 128),      # full-range weights: the exact path
    (8, 8, 3, 1, 5, 7, 200, 128),
    (3, 16, 7, 2, 23, 21, 5, 65),      # an image stem: blocks of 4 channels
    (32, 16, 1, 2, 7, 9, 0, 65),       # stride-2 1x1
    (24, 40, 3, 1, 6, 13, 255, 65),
    (40, 32, 1, 1, 19, 23, 0, 65),     # more output pixels than output channels, odd map
    (12, 32, 3, 1, 21, 17, 9, 128),    # the same with taps, zero-point padding and full-range weights
]


@pytest.mark.parametrize(("cin", "cout", "k", "stride", "h", "w", "zero", "limit"), PACKED_CONVS)
def test_packed_int8_conv_is_exact(cin: int, cout: int, k: int, stride: int, h: int, w: int, zero: int,
                                   limit: int) -> None:
    weight = RNG.integers(-limit + 1, limit, (cout, cin, k, k)).astype(np.int8)
    pad = k // 2
    mod = _padded_conv_module((1, cin, h, w), weight, stride, pad, zero)
    tasks = [t for t in tasks_from_module(mod, HOST) if t.family != "injective"]
    assert [t.family for t in tasks] == ["conv2d_nchwc_int8"]
    task = tasks[0]
    (anchor,) = [n for n in post_order(task.func) if isinstance(n, Call) and n.op_name == INT8_CONV]
    assert bool(anchor.attrs["pairs_fit_int16"]) == (limit <= 65)
    # every sampled config of the space against the numpy reference, on random data and weights of the same range
    rng = np.random.default_rng(cin * 100 + cout)
    inputs = [rng.integers(0, 256, spec.shape).astype(np.uint8) if spec.dtype == "uint8"
              else rng.integers(-limit + 1, limit, spec.shape).astype(spec.dtype)  # int8, or int16 pairs
              for spec in task.input_specs()]
    expected = task.reference(inputs)[0]
    for config in [task.default_config()] + [task.space.sample(rng) for _ in range(4)]:
        got = build_primitive(task.func, task.target_info, schedule_steps=task.steps(config))(*inputs)
        np.testing.assert_array_equal(got, expected, err_msg=str(config))
    # the whole build (channel padding, layout transforms, the slice of padded output channels) against int64 numpy
    x = RNG.integers(0, 256, (1, cin, h, w)).astype(np.uint8)
    want = _zero_point_conv(x, weight, stride, pad, zero)
    np.testing.assert_array_equal(build(mod, "llvm").run(x=x), want)
    np.testing.assert_array_equal(evaluate(mod, {"x": x}), want)


def _innermost_loops(asm: str) -> list[list[str]]:
    """The bodies of the loops in `asm` that contain no other loop (a label, then the lines up to the jump back)."""
    lines, labels, loops = asm.splitlines(), {}, []
    for i, line in enumerate(lines):
        if (label := re.match(r"^(\.LBB\S+):", line)) is not None:
            labels[label.group(1)] = i
        jump = re.match(r"\s+j\w+\s+(\.LBB\S+)", line)
        if jump is not None and jump.group(1) in labels:
            body = lines[labels[jump.group(1)]:i + 1]
            if not any(re.match(r"^\.LBB", x) for x in body[1:]):
                loops.append(body)
    return loops


@pytest.mark.skipif(not X86, reason="x86 instructions")
@pytest.mark.parametrize("limit", [65, 128])
def test_packed_int8_conv_inner_loops_do_not_spill(limit: int) -> None:
    # the default register tile of a 3x3 convolution on AVX2 (16 ymm registers) stays in registers: no stack access
    # in the innermost loops that hold its products
    weight = RNG.integers(-limit + 1, limit, (64, 64, 3, 3)).astype(np.int8)
    mod = _padded_conv_module((1, 64, 14, 14), weight, 1, 1, 0)
    target = resolve_target("llvm -mcpu=haswell -num-cores=2")
    (task,) = [t for t in tasks_from_module(mod, target) if t.family == "conv2d_nchwc_int8"]
    asm = emit_assembly([task.lower(task.default_config())], task.target_info)
    loops = [body for body in _innermost_loops(asm) if any("vpmadd" in line for line in body)]
    assert loops
    for body in loops:
        assert not [line for line in body if "(%rsp)" in line], "\n".join(body)


def test_pack_int8_weight_checks_pairs() -> None:
    weight = RNG.integers(-64, 65, (8, 8, 1, 1)).astype(np.int8)
    packed, pairs = pack_int8_weight(weight, 8, 8)
    assert pairs and packed.shape == (1, 1, 1, 1, 2, 8, 4)
    np.testing.assert_array_equal(unpack_int8_weight(packed), weight)
    weight[3, 5, 0, 0], weight[3, 4, 0, 0] = 100, -29  # channels 4 and 5 are one pair: 129 > 128
    assert not pack_int8_weight(weight, 8, 8)[1]


def test_int8_dense_runs_as_packed_conv() -> None:
    """An 8-bit dense product is the packed convolution over its rows (1x1 maps), exact on odd sizes."""
    w = RNG.integers(-128, 128, (13, 37)).astype(np.int8)
    mod = parse_module('''#[version = "0.0.5"]
def @main(%x: Tensor[(3, 37), uint8]) -> Tensor[(3, 13), int32] {
  nn.dense(%x, meta[relay.Constant][0], units=13, out_dtype="int32")
}''', constants=[w])
    assert "conv2d_nchwc_int8" in [t.family for t in tasks_from_module(mod, HOST)]
    x = RNG.integers(0, 256, (3, 37)).astype(np.uint8)
    np.testing.assert_array_equal(build(mod, "llvm").run(x=x), x.astype(np.int64) @ w.astype(np.int64).T)


@pytest.mark.parametrize("reduce_range", [True, False])
def test_default_builds_take_integer_products_whose_pairs_fit(tmp_path: Any, reduce_range: bool) -> None:
    """At opt_level 3 QuantizedProducts rewrites a product when its int8 weight's channel pairs fit int16 (always
    with reduce_range), and leaves the float product otherwise; the output is within one step of onnxruntime's
    unoptimised QDQ graph (its optimised AVX2 int8 kernels saturate on full-range weights: they are not)."""
    qmodel = _quantized(tmp_path, "conv", per_channel=False, reduce_range=reduce_range)
    mod, _ = from_onnx(qmodel)
    products = _integer_products(optimize(mod, opt_level=3, layout_block=8))
    weights = [numpy_helper.to_array(t) for t in qmodel.graph.initializer if numpy_helper.to_array(t).ndim == 4]
    fits = [pairs_fit_int16(w) for w in weights]
    assert len(products) == len(weights) == 2
    if reduce_range:
        assert all(fits)
    integer = [str(p.checked_type.dtype) == "int32" for p in products]
    assert sorted(integer) == sorted(fits)
    compiled = build(mod, "llvm")
    x = _inputs(_float_model("conv"))
    np.testing.assert_allclose(compiled.run(x=x), _session(qmodel, False).run(None, {"x": x})[0], rtol=0,
                               atol=_output_step(qmodel) * 1.01)


def test_requantization_divides_fold_into_the_product_scale(tmp_path: Any) -> None:
    """The QuantizeLinear's divide right after an integer product's scale multiply becomes one multiplier: no divide
    reads `cast(int32 sums) * m` any more (the outputs stay within one step: test_qdq_model_runs_integer_products)."""
    mod, _ = from_onnx(_quantized(tmp_path, "conv", per_channel=True, reduce_range=True))
    optimized = optimize(mod, opt_level=4, layout_block=8)

    def reads_scaled_sums(node: Call) -> bool:
        arg = node.args[0]
        return (isinstance(arg, Call) and arg.op_name == "multiply" and isinstance(arg.args[0], Call)
                and arg.args[0].op_name == "cast" and str(arg.args[0].args[0].checked_type.dtype) == "int32")

    calls = [n for _, f in optimized.items() for n in post_order(f) if isinstance(n, Call)]
    assert any(c.op_name == "multiply" and isinstance(c.args[0], Call) and c.args[0].op_name == "cast" for c in calls)
    assert not [c for c in calls if c.op_name == "divide" and reads_scaled_sums(c)]
