"""QuantizedPooling (default builds, opt_level 3): max pooling of dequantized uint8/int8 data runs on the 8-bit tensor.

- the rewritten module pools the 8-bit tensor (and dequantizes after) for plain, strided, padded and global max
  pools, and leaves pools it cannot prove exact (ceil_mode, padding as wide as the window, dilation) in float;
- built models equal the interpreter on the original float graph on odd shapes and random non-zero data: exactly
  with a QuantizeLinear after the pool (what a QDQ model has), to the ulp for the dequantized float result;
- a QDQ ONNX model (onnxruntime's quantize_static) with a max pool gets a uint8 pool and stays within one
  quantization step of onnxruntime's unoptimised QDQ graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import relay_tune
from relay_tune.interpreter import Interpreter
from relay_tune.ir import Call, IRModule, post_order
from relay_tune.passes import PassConfig, QuantizedPooling, Sequential
from relay_tune.text import parse_module
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(20261207)

POOLS = [
    'nn.max_pool2d(%2, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])',  # ResNet's stem pool
    'nn.max_pool2d(%2, pool_size=[2, 2], strides=[2, 2])',
    'nn.max_pool2d(%2, pool_size=[3, 2], strides=[1, 1], padding=[2, 0, 1, 1])',
    'nn.global_max_pool2d(%2)',
]
NOT_TAKEN = [
    'nn.max_pool2d(%2, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], ceil_mode=True)',
    'nn.max_pool2d(%2, pool_size=[2, 2], strides=[1, 1], padding=[2, 2, 2, 2])',
    'nn.max_pool2d(%2, pool_size=[2, 2], strides=[1, 1], dilation=[2, 2])',
]


def qdq_pool(pool: str, dtype: str, zero: int, scale: float, quantize_after: bool,
             shape: tuple[int, ...] = (1, 5, 13, 11)) -> IRModule:
    """`pool(dequantize(x))`, optionally quantized again with the same parameters (the importer's QDQ forms)."""
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    tail = (f'''
  %4 = divide(%3, {scale}f);
  %5 = round(%4);
  %6 = add(%5, {zero}f);
  %7 = clip(%6, a_min={lo}f, a_max={hi}f);
  cast(%7, dtype="{dtype}")''' if quantize_after else "\n  %3")
    return parse_module(f'''#[version = "0.0.5"]
def @main(%x: Tensor[{shape}, {dtype}]) {{
  %0 = cast(%x, dtype="float32");
  %1 = subtract(%0, {zero}f);
  %2 = multiply(%1, {scale}f);
  %3 = {pool};{tail}
}}''')


def rewritten(mod: IRModule, opt_level: int = 3) -> IRModule:
    """`mod` after QuantizedPooling alone (it runs from opt_level 3 on)."""
    return Sequential((QuantizedPooling(),)).run(infer_types(mod), PassConfig(opt_level=opt_level))


def pooled_dtypes(mod: IRModule) -> list[str]:
    """The input dtype of every max pool of `mod`'s main function."""
    return [str(node.args[0].checked_type.dtype) for node in post_order(infer_types(mod)["main"])  # type: ignore[attr-defined]
            if isinstance(node, Call) and node.op_name in ("nn.max_pool2d", "nn.global_max_pool2d")]


def _data(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    x = RNG.integers(lo, hi, shape).astype(dtype)
    x[0, 0, 0, :3] = (lo, hi - 1, lo)  # the type's extremes
    return x


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize(("dtype", "zero"), [("uint8", 131), ("uint8", 0), ("int8", -7)])
def test_max_pool_reads_the_quantized_tensor(pool: str, dtype: str, zero: int) -> None:
    mod = qdq_pool(pool, dtype, zero, 0.0371, quantize_after=True)
    assert pooled_dtypes(mod) == ["float32"]
    assert pooled_dtypes(rewritten(mod)) == [dtype]
    assert pooled_dtypes(rewritten(mod, opt_level=2)) == ["float32"]  # not below the default builds


@pytest.mark.parametrize("pool", NOT_TAKEN)
def test_pools_not_proven_exact_stay_float(pool: str) -> None:
    mod = qdq_pool(pool, "uint8", 9, 0.05, quantize_after=False)
    assert pooled_dtypes(rewritten(mod)) == ["float32"]


@pytest.mark.parametrize("pool", POOLS + NOT_TAKEN[:1])
@pytest.mark.parametrize(("dtype", "zero", "quantize_after"), [
    ("uint8", 131, True), ("uint8", 3, False), ("int8", -7, True), ("int8", 0, False)])
@pytest.mark.parametrize("shape", [(1, 5, 13, 11), (2, 3, 7, 9)])
def test_compiled_equals_the_float_graph(pool: str, dtype: str, zero: int, quantize_after: bool,
                                         shape: tuple[int, ...]) -> None:
    mod = qdq_pool(pool, dtype, zero, 0.0371, quantize_after, shape)
    x = _data(dtype, shape)
    want = np.asarray(Interpreter(mod).run({"x": x}))
    got = np.asarray(relay_tune.build(mod, "llvm", build_cache=False).run(x=x))
    assert got.dtype == want.dtype
    if quantize_after:  # exact: the maximum commutes with the monotonic dequantize
        np.testing.assert_array_equal(got, want)
    else:  # the compiled dequantize's multiply-add may round differently from the interpreter's, by one ulp
        np.testing.assert_array_max_ulp(got, want, maxulp=1)


def test_qdq_onnx_model_pools_uint8(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from relay_tune.frontend import from_onnx

    rng = np.random.default_rng(3)
    weight = helper.make_tensor("w", TensorProto.FLOAT, (6, 3, 3, 3), rng.standard_normal(162).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["p", "w2"], ["y"])],
        "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 15, 13))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, helper.make_tensor("w2", TensorProto.FLOAT, (4, 6, 1, 1), rng.standard_normal(24).astype(np.float32))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    src, dst = tmp_path / "pool.onnx", tmp_path / "pool.int8.onnx"
    onnx.save(model, str(src))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal((1, 3, 15, 13)).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    mod = from_onnx(onnx.load(str(dst)))[0]
    assert pooled_dtypes(rewritten(mod)) == ["uint8"]
    x = rng.standard_normal((1, 3, 15, 13)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = np.asarray(relay_tune.build(mod, "llvm", build_cache=False).run(x=x))
    scale = float(onnx.numpy_helper.to_array(next(i for i in onnx.load(str(dst)).graph.initializer
                                                  if i.name.startswith("y") and i.name.endswith("scale"))))
    assert np.abs(got - want).max() <= scale * 1.01  # one step of the output's quantization
