"""Integer convolutions and dense products (uint8/int8 x int8 -> int32) and the QuantizedProducts pass.

- compiled integer products on odd shapes equal numpy's int64 products exactly;
- `QuantizedProducts` rewrites the float products of a QDQ model into integer ones (the int8 weight recovered from
  its dequantized float constant), leaves float models alone, and a QDQ model built with it matches onnxruntime's
  unoptimised QDQ graph (the float semantics) and onnxruntime's int8 kernels within one quantization step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relay_tune import build
from relay_tune.frontend import from_onnx
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call
from relay_tune.ir.traversal import post_order
from relay_tune.passes.pipeline import optimize
from relay_tune.passes.quantized_products import recover_int8_weight
from relay_tune.text import parse_module

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
            and node.op_name in ("nn.conv2d", "nn.contrib_conv2d_NCHWc", "nn.dense")]


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
