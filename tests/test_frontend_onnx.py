"""ONNX import: every converter against onnxruntime, opset-dependent semantics, errors, parameter files, CLI.

Each case builds a small model with `onnx.helper`, runs it with onnxruntime and with relay-tune (import +
reference interpreter), and compares the outputs. Data flows in through graph inputs wherever the
conversion allows it, so the converters are exercised rather than folded away at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relay_tune.errors import RelayTuneError, RelayTypeError, UnsupportedError
from relay_tune.frontend import from_onnx, load_params, params_path, save_params
from relay_tune.frontend.onnx import MAX_OPSET, OnnxModelError, UnsupportedOperatorsError, supported_ops
from relay_tune.frontend.params import ParamsFileError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Constant, post_order
from relay_tune.ir.types import ANY, TensorType
from relay_tune.op.registry import get_op
from relay_tune.text import load_module, print_module

RNG = np.random.default_rng(1234)


def rand(*shape: int, dtype: str = "float32", low: float = -2.0, high: float = 2.0) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(low), int(high), size=shape).astype(dtype)
    return RNG.uniform(low, high, size=shape).astype(dtype)


def make_model(
    nodes: Sequence[Any],
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str],
    opset: int = 17,
    initializers: dict[str, np.ndarray] | None = None,
) -> Any:
    graph = helper.make_graph(
        list(nodes),
        "test",
        [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in inputs.items()
        ],
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        initializer=[numpy_helper.from_array(a, name) for name, a in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    return model


def run_onnxruntime(model: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def run_onnx_reference(model: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnx's own Python reference evaluator: the oracle where onnxruntime has no kernel."""
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, inputs))


def run_relay(model: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    mod, _ = from_onnx(model)
    result = evaluate(mod, inputs)
    return list(result) if isinstance(result, tuple) else [result]


def assert_matches_onnxruntime(
    model: Any, inputs: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-5, oracle: str = "onnxruntime"
) -> None:
    expected = run_onnxruntime(model, inputs) if oracle == "onnxruntime" else run_onnx_reference(model, inputs)
    actual = run_relay(model, inputs)
    assert len(actual) == len(expected)
    for i, (got, want) in enumerate(zip(actual, expected)):
        assert got.dtype == want.dtype, f"output {i}: dtype {got.dtype}, onnxruntime gives {want.dtype}"
        assert got.shape == want.shape, f"output {i}: shape {got.shape}, onnxruntime gives {want.shape}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"output {i}")


@dataclass
class Case:
    """One single-node model: `op(inputs..., **attrs)`, with some inputs possibly constant initializers."""

    id: str
    op: str
    inputs: dict[str, np.ndarray]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 17
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    input_order: list[str] | None = None  # node input names, "" for an omitted optional input
    outputs: int = 1
    rtol: float = 1e-5
    atol: float = 1e-5
    oracle: str = "onnxruntime"  # or "reference" (onnx.reference) where onnxruntime refuses the model

    def model(self) -> Any:
        names = self.input_order if self.input_order is not None else [*self.inputs, *self.consts]
        out_names = [f"y{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op, names, out_names, **self.attrs)
        return make_model([node], self.inputs, out_names, self.opset, self.consts)


def C(id: str, op: str, inputs: dict[str, np.ndarray], **kw: Any) -> Any:
    return pytest.param(Case(id, op, inputs, **kw), id=id)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


X4 = rand(2, 3, 7, 8)
W3 = rand(4, 3, 3, 3)

CONV_CASES = [
    C("conv2d-bias", "Conv", {"x": X4}, consts={"w": W3, "b": rand(4)}, rtol=1e-4, atol=1e-4),
    C("conv2d-stride-pad-dilation", "Conv", {"x": X4}, consts={"w": W3},
      attrs={"strides": [2, 1], "pads": [1, 2, 0, 1], "dilations": [1, 2]}, rtol=1e-4, atol=1e-4),
    C("conv2d-groups", "Conv", {"x": rand(1, 4, 6, 6)}, consts={"w": rand(6, 2, 3, 3)}, attrs={"group": 2},
      rtol=1e-4, atol=1e-4),
    C("conv2d-depthwise", "Conv", {"x": rand(1, 4, 6, 6)}, consts={"w": rand(4, 1, 3, 3)}, attrs={"group": 4},
      rtol=1e-4, atol=1e-4),
    C("conv2d-same-upper", "Conv", {"x": X4}, consts={"w": rand(4, 3, 4, 4)},
      attrs={"auto_pad": "SAME_UPPER", "strides": [2, 3]}, rtol=1e-4, atol=1e-4),
    C("conv2d-same-lower", "Conv", {"x": X4}, consts={"w": rand(4, 3, 4, 4)},
      attrs={"auto_pad": "SAME_LOWER", "strides": [2, 2]}, rtol=1e-4, atol=1e-4),
    C("conv2d-valid", "Conv", {"x": X4}, consts={"w": W3}, attrs={"auto_pad": "VALID", "strides": [2, 2]},
      rtol=1e-4, atol=1e-4),
    C("conv2d-weight-as-input", "Conv", {"x": X4, "w": W3}, rtol=1e-4, atol=1e-4),
    C("conv1d", "Conv", {"x": rand(2, 3, 11)}, consts={"w": rand(5, 3, 3), "b": rand(5)},
      attrs={"strides": [2], "pads": [1, 1]}, rtol=1e-4, atol=1e-4),
    C("conv3d", "Conv", {"x": rand(1, 2, 5, 6, 4)}, consts={"w": rand(3, 2, 2, 3, 2)},
      attrs={"pads": [1, 0, 1, 0, 1, 0], "strides": [1, 2, 1]}, rtol=1e-4, atol=1e-4),
    C("convtranspose2d", "ConvTranspose", {"x": rand(1, 3, 5, 4)}, consts={"w": rand(3, 2, 3, 3), "b": rand(2)},
      attrs={"strides": [2, 3], "pads": [1, 0, 0, 1], "output_padding": [1, 1]}, rtol=1e-4, atol=1e-4),
    C("convtranspose2d-groups-dilation", "ConvTranspose", {"x": rand(2, 4, 4, 4)}, consts={"w": rand(4, 3, 2, 3)},
      attrs={"group": 2, "dilations": [2, 1], "strides": [1, 2]}, rtol=1e-4, atol=1e-4),
    C("convtranspose2d-output-shape", "ConvTranspose", {"x": rand(1, 2, 4, 4)}, consts={"w": rand(2, 3, 3, 3)},
      attrs={"strides": [2, 2], "output_shape": [9, 8]}, rtol=1e-4, atol=1e-4),
    C("convtranspose2d-same-upper", "ConvTranspose", {"x": rand(1, 2, 4, 5)}, consts={"w": rand(2, 3, 3, 3)},
      attrs={"strides": [2, 2], "auto_pad": "SAME_UPPER"}, rtol=1e-4, atol=1e-4),
    C("convtranspose2d-same-lower", "ConvTranspose", {"x": rand(1, 2, 3, 5)}, consts={"w": rand(2, 3, 4, 3)},
      attrs={"strides": [2, 2], "auto_pad": "SAME_LOWER"}, rtol=1e-4, atol=1e-4),
    C("convtranspose1d", "ConvTranspose", {"x": rand(2, 3, 6)}, consts={"w": rand(3, 2, 4)},
      attrs={"strides": [3], "pads": [1, 2]}, rtol=1e-4, atol=1e-4),
]

MATMUL_CASES = [
    C("gemm", "Gemm", {"a": rand(4, 5)}, consts={"b": rand(5, 3), "c": rand(3)}, rtol=1e-4),
    C("gemm-trans-alpha-beta", "Gemm", {"a": rand(5, 4)}, consts={"b": rand(3, 5), "c": rand(4, 3)},
      attrs={"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, rtol=1e-4),
    C("gemm-all-inputs", "Gemm", {"a": rand(4, 5), "b": rand(5, 3), "c": rand(1, 3)}, attrs={"alpha": 1.5},
      rtol=1e-4),
    C("gemm-no-c", "Gemm", {"a": rand(4, 5)}, consts={"b": rand(3, 5)}, attrs={"transB": 1}, opset=13, rtol=1e-4),
    C("matmul-2d", "MatMul", {"a": rand(4, 5)}, consts={"b": rand(5, 3)}, rtol=1e-4),
    C("matmul-3d-by-2d", "MatMul", {"a": rand(2, 4, 5)}, consts={"b": rand(5, 3)}, rtol=1e-4),
    C("matmul-vector-left", "MatMul", {"a": rand(5), "b": rand(5, 3)}, rtol=1e-4),
    C("matmul-vector-right", "MatMul", {"a": rand(2, 4, 5), "b": rand(5)}, rtol=1e-4),
    C("matmul-vector-by-batch", "MatMul", {"a": rand(5), "b": rand(2, 5, 3)}, rtol=1e-4),
    C("matmul-batch", "MatMul", {"a": rand(3, 4, 5), "b": rand(3, 5, 2)}, rtol=1e-4),
    C("matmul-batch-broadcast", "MatMul", {"a": rand(2, 1, 4, 5), "b": rand(3, 5, 2)}, rtol=1e-4),
    C("matmul-batch-one-side", "MatMul", {"a": rand(1, 4, 5), "b": rand(2, 3, 5, 2)}, rtol=1e-4),
    C("matmul-int32", "MatMul", {"a": rand(3, 4, dtype="int32", low=-5, high=5),
                                 "b": rand(4, 2, dtype="int32", low=-5, high=5)}),
]

NORM_CASES = [
    C("batchnorm", "BatchNormalization", {"x": X4},
      consts={"s": rand(3), "bias": rand(3), "m": rand(3), "v": rand(3, low=0.5, high=2)},
      attrs={"epsilon": 1e-3}, rtol=1e-4, atol=1e-4),
    C("batchnorm-2d-input", "BatchNormalization", {"x": rand(4, 3)},
      consts={"s": rand(3), "bias": rand(3), "m": rand(3), "v": rand(3, low=0.5, high=2)}, rtol=1e-4, atol=1e-4),
    C("layernorm-last", "LayerNormalization", {"x": rand(2, 3, 8)}, consts={"s": rand(8), "b": rand(8)},
      rtol=1e-4, atol=1e-4),
    C("layernorm-two-axes-no-bias", "LayerNormalization", {"x": rand(2, 3, 4, 5)}, consts={"s": rand(4, 5)},
      attrs={"axis": -2, "epsilon": 1e-3}, rtol=1e-4, atol=1e-4),
    C("instancenorm", "InstanceNormalization", {"x": rand(2, 3, 4, 5)}, consts={"s": rand(3), "b": rand(3)},
      rtol=1e-4, atol=1e-4),
    C("lrn-odd", "LRN", {"x": rand(2, 7, 3, 3)}, attrs={"size": 3, "alpha": 0.1, "beta": 0.6, "bias": 1.5},
      rtol=1e-4, atol=1e-5),
    C("softmax-opset11-flattens", "Softmax", {"x": rand(2, 3, 4)}, attrs={"axis": 1}, opset=11),
    C("softmax-opset11-default-axis", "Softmax", {"x": rand(2, 3, 4)}, opset=11),
    C("softmax-opset13-axis", "Softmax", {"x": rand(2, 3, 4)}, attrs={"axis": 1}, opset=13),
    C("logsoftmax-opset9-axis0", "LogSoftmax", {"x": rand(2, 3, 4)}, attrs={"axis": 0}, opset=9),
    C("logsoftmax-opset13-default", "LogSoftmax", {"x": rand(2, 3, 4)}, opset=13),
]

POOL_CASES = [
    C("maxpool", "MaxPool", {"x": X4}, attrs={"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    C("maxpool-ceil", "MaxPool", {"x": rand(1, 2, 7, 7)},
      attrs={"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    C("maxpool-ceil-drops-window-in-padding", "MaxPool", {"x": rand(1, 1, 5, 5)},
      attrs={"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    C("maxpool-dilation", "MaxPool", {"x": rand(1, 2, 9, 9)},
      attrs={"kernel_shape": [3, 3], "dilations": [2, 2]}),
    C("maxpool-same-upper", "MaxPool", {"x": X4}, attrs={"kernel_shape": [3, 3], "strides": [2, 2],
                                                        "auto_pad": "SAME_UPPER"}),
    C("maxpool-1d", "MaxPool", {"x": rand(2, 3, 10)}, attrs={"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    C("maxpool-3d", "MaxPool", {"x": rand(1, 2, 5, 6, 7)}, attrs={"kernel_shape": [2, 3, 2], "strides": [2, 1, 2],
                                                                  "pads": [1, 0, 1, 0, 1, 1]}),
    C("avgpool", "AveragePool", {"x": X4}, attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    C("avgpool-count-pad", "AveragePool", {"x": X4},
      attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    C("avgpool-ceil", "AveragePool", {"x": rand(1, 2, 7, 6)},
      attrs={"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    C("avgpool-ceil-count-pad", "AveragePool", {"x": rand(1, 2, 7, 6)},
      attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
             "count_include_pad": 1}),
    C("avgpool-same-lower", "AveragePool", {"x": X4}, attrs={"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}),
    C("avgpool-1d", "AveragePool", {"x": rand(2, 3, 9)}, attrs={"kernel_shape": [4], "strides": [2]}),
    C("avgpool-3d-count-pad", "AveragePool", {"x": rand(1, 2, 4, 5, 6)},
      attrs={"kernel_shape": [3, 2, 3], "strides": [2, 2, 2], "pads": [1, 1, 0, 1, 0, 1], "count_include_pad": 1}),
    C("avgpool-3d", "AveragePool", {"x": rand(1, 2, 4, 5, 6)},
      attrs={"kernel_shape": [3, 2, 3], "strides": [1, 2, 2], "pads": [1, 1, 0, 1, 0, 1]}),
    C("global-avgpool", "GlobalAveragePool", {"x": X4}),
    C("global-maxpool", "GlobalMaxPool", {"x": X4}),
    C("global-avgpool-3d-tensor", "GlobalAveragePool", {"x": rand(2, 3, 5)}),
]

ELEMENTWISE_CASES = [
    *[C(op.lower(), op, {"x": rand(3, 4)}) for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs",
                                                       "Floor", "Ceil", "Softsign", "Sign")],
    C("sqrt", "Sqrt", {"x": rand(3, 4, low=0.1)}),
    C("log", "Log", {"x": rand(3, 4, low=0.1)}),
    C("reciprocal", "Reciprocal", {"x": rand(3, 4, low=0.5)}),
    C("round", "Round", {"x": np.array([0.5, 1.5, -0.5, 2.4, -2.6], np.float32)}),
    C("leakyrelu-default", "LeakyRelu", {"x": rand(3, 4)}),
    C("leakyrelu", "LeakyRelu", {"x": rand(3, 4)}, attrs={"alpha": 0.3}),
    C("prelu", "PRelu", {"x": rand(2, 3, 4, 4)}, consts={"slope": rand(3, 1, 1)}),
    C("elu", "Elu", {"x": rand(3, 4)}, attrs={"alpha": 0.7}),
    C("selu", "Selu", {"x": rand(3, 4)}),
    C("softplus", "Softplus", {"x": rand(3, 4, low=-30, high=30)}),
    C("hardsigmoid", "HardSigmoid", {"x": rand(3, 4, low=-5, high=5)}, attrs={"alpha": 0.3}),
    C("shrink", "Shrink", {"x": rand(10)}, attrs={"lambd": 0.7, "bias": 0.2}),
    C("gelu", "Gelu", {"x": rand(3, 4)}, opset=20),
    C("gelu-tanh", "Gelu", {"x": rand(3, 4)}, attrs={"approximate": "tanh"}, opset=20),
    C("clip-opset6-attrs", "Clip", {"x": rand(3, 4)}, attrs={"min": -0.5, "max": 0.7}, opset=6),
    C("clip-opset6-max-only", "Clip", {"x": rand(3, 4)}, attrs={"max": 0.7}, opset=6),
    C("clip-opset11-inputs", "Clip", {"x": rand(3, 4)}, consts={"lo": np.array(-0.5, np.float32),
                                                               "hi": np.array(0.7, np.float32)}, opset=11),
    C("clip-opset13-min-only", "Clip", {"x": rand(3, 4)}, consts={"lo": np.array(0.1, np.float32)}, opset=13),
    C("clip-opset13-max-only", "Clip", {"x": rand(3, 4)}, consts={"hi": np.array(0.1, np.float32)},
      input_order=["x", "", "hi"], opset=13),
    C("clip-runtime-bounds", "Clip", {"x": rand(3, 4), "lo": np.array(-0.2, np.float32),
                                      "hi": np.array(0.4, np.float32)}, opset=13),
    C("clip-int", "Clip", {"x": rand(3, 4, dtype="int32", low=-9, high=9)},
      consts={"lo": np.array(-3, np.int32), "hi": np.array(4, np.int32)}, opset=13),
    C("add-broadcast", "Add", {"a": rand(2, 3, 4), "b": rand(3, 1)}),
    C("sub-broadcast", "Sub", {"a": rand(4), "b": rand(2, 3, 4)}),
    C("mul", "Mul", {"a": rand(2, 3), "b": rand(2, 3)}),
    C("div", "Div", {"a": rand(2, 3), "b": rand(2, 3, low=0.5)}),
    C("div-int-truncates", "Div", {"a": np.array([7, -7, 7, -7], np.int32), "b": np.array([2, 2, -2, -2], np.int32)}),
    C("pow", "Pow", {"a": rand(2, 3, low=0.1), "b": rand(2, 3)}),
    C("pow-int-exponent", "Pow", {"a": rand(2, 3)}, consts={"b": np.array(3, np.int64)}),
    C("sum-3", "Sum", {"a": rand(2, 3), "b": rand(3), "c": rand(2, 1)}),
    C("max-3", "Max", {"a": rand(2, 3), "b": rand(3), "c": rand(2, 1)}),
    C("min-2", "Min", {"a": rand(2, 3), "b": rand(2, 3)}),
    C("mean-2", "Mean", {"a": rand(2, 3), "b": rand(2, 3)}),
    C("max-single", "Max", {"a": rand(2, 3)}),
    C("equal-where", "Equal", {"a": np.array([1, 2, 3], np.int64), "b": np.array([1, 0, 3], np.int64)}),
    C("less", "Less", {"a": rand(5), "b": rand(5)}),
    C("greater-or-equal", "GreaterOrEqual", {"a": rand(5), "b": rand(5)}),
    C("where", "Where", {"c": rand(3, 4) > 0, "a": rand(3, 4), "b": rand(4)}),
    C("cast-float-to-int", "Cast", {"x": rand(3, 4, low=-5, high=5)}, attrs={"to": TensorProto.INT32}),
    C("cast-int-to-float", "Cast", {"x": rand(3, 4, dtype="int64", low=-5, high=5)}, attrs={"to": TensorProto.FLOAT}),
    C("cast-to-bool", "Cast", {"x": rand(3, 4)}, attrs={"to": TensorProto.BOOL}),
    C("identity", "Identity", {"x": rand(3, 4)}),
    C("dropout", "Dropout", {"x": rand(3, 4)}, opset=13),
    C("dropout-opset7-ratio", "Dropout", {"x": rand(3, 4)}, attrs={"ratio": 0.3}, opset=7),
    C("dropout-opset13-inference-flag", "Dropout", {"x": rand(3, 4)},
      consts={"r": np.array(0.5, np.float32), "t": np.array(False)}, opset=13),
]

SHAPE_CASES = [
    C("concat", "Concat", {"a": rand(2, 3), "b": rand(2, 5), "c": rand(2, 1)}, attrs={"axis": -1}),
    C("split-equal", "Split", {"x": rand(6, 4)}, attrs={"axis": 0}, outputs=3),
    C("split-attr-opset11", "Split", {"x": rand(2, 7)}, attrs={"axis": 1, "split": [2, 5]}, outputs=2, opset=11),
    C("split-input-opset13", "Split", {"x": rand(2, 7)}, consts={"s": i64(3, 1, 3)}, attrs={"axis": 1},
      outputs=3, opset=13),
    C("split-num-outputs-uneven-opset18", "Split", {"x": rand(7, 2)}, attrs={"num_outputs": 3}, outputs=3,
      opset=18),
    C("slice-opset9-attrs", "Slice", {"x": rand(5, 6, 7)}, attrs={"starts": [1, -3], "ends": [4, 1000],
                                                               "axes": [0, 2]}, opset=9),
    C("slice-inputs", "Slice", {"x": rand(5, 6, 7)},
      consts={"s": i64(1, 0), "e": i64(-1, 5), "a": i64(0, 1), "st": i64(2, 2)}),
    C("slice-negative-step", "Slice", {"x": rand(5, 6)},
      consts={"s": i64(-1, 4), "e": i64(-2**63, 0), "a": i64(0, 1), "st": i64(-2, -1)}),
    C("slice-defaults", "Slice", {"x": rand(5, 6)}, consts={"s": i64(2), "e": i64(2**62)}),
    C("gather-const-negative", "Gather", {"x": rand(5, 4)}, consts={"i": i64(-1, 0, 2, -5)}, attrs={"axis": 0}),
    C("gather-runtime-indices", "Gather", {"x": rand(5, 4), "i": i64(3, -2, -4)}, attrs={"axis": 1}),
    C("gather-scalar-index", "Gather", {"x": rand(5, 4, 3)}, consts={"i": np.array(-2, np.int64)}, attrs={"axis": 1}),
    C("gather-2d-indices", "Gather", {"x": rand(5, 4), "i": np.array([[0, 4], [3, 1]], np.int32)}),
    C("reshape", "Reshape", {"x": rand(2, 3, 4)}, consts={"s": i64(0, -1, 2)}),
    C("reshape-zero-copies", "Reshape", {"x": rand(2, 3, 4)}, consts={"s": i64(4, 0, 2)}, opset=14),
    C("reshape-allowzero", "Reshape", {"x": rand(0, 3)}, consts={"s": i64(3, 0)}, attrs={"allowzero": 1},
      opset=14),
    C("flatten-axis2", "Flatten", {"x": rand(2, 3, 4, 5)}, attrs={"axis": 2}),
    C("flatten-axis0", "Flatten", {"x": rand(2, 3, 4)}, attrs={"axis": 0}),
    C("flatten-negative-axis", "Flatten", {"x": rand(2, 3, 4)}, attrs={"axis": -1}, opset=13),
    C("transpose", "Transpose", {"x": rand(2, 3, 4)}, attrs={"perm": [1, 2, 0]}),
    C("transpose-default", "Transpose", {"x": rand(2, 3, 4)}),
    C("squeeze-opset11", "Squeeze", {"x": rand(1, 3, 1, 4)}, attrs={"axes": [-2]}, opset=11),
    C("squeeze-opset13-input", "Squeeze", {"x": rand(1, 3, 1, 4)}, consts={"a": i64(0, 2)}, opset=13),
    C("squeeze-all", "Squeeze", {"x": rand(1, 3, 1, 4)}, opset=13),
    C("unsqueeze-opset11", "Unsqueeze", {"x": rand(3, 4)}, attrs={"axes": [0, 3]}, opset=11),
    C("unsqueeze-opset13-input", "Unsqueeze", {"x": rand(3, 4)}, consts={"a": i64(-1, 1)}, opset=13),
    C("expand", "Expand", {"x": rand(3, 1)}, consts={"s": i64(2, 1, 4)}),
    C("expand-noop-dims", "Expand", {"x": rand(2, 3)}, consts={"s": i64(1, 3)}),
    C("tile", "Tile", {"x": rand(2, 3)}, consts={"r": i64(2, 3)}),
    C("pad-constant", "Pad", {"x": rand(2, 3, 4)}, consts={"p": i64(0, 1, 2, 0, 2, 1), "v": np.array(1.5, np.float32)},
      opset=13),
    C("pad-negative-crops", "Pad", {"x": rand(3, 5)}, consts={"p": i64(-1, 2, 1, -2)}, opset=13),
    C("pad-reflect", "Pad", {"x": rand(2, 4, 5)}, consts={"p": i64(0, 2, 1, 0, 1, 3)}, attrs={"mode": "reflect"},
      opset=13),
    C("pad-edge", "Pad", {"x": rand(2, 4, 5)}, consts={"p": i64(0, 2, 1, 0, 1, 3)}, attrs={"mode": "edge"},
      opset=13),
    C("pad-opset2-attrs", "Pad", {"x": rand(2, 3)}, attrs={"pads": [1, 0, 0, 2], "value": -1.0}, opset=9),
    C("pad-axes-opset18", "Pad", {"x": rand(2, 3, 4)}, consts={"p": i64(1, 2, 3, 0), "a": i64(0, 2)},
      input_order=["x", "p", "", "a"], opset=18),
    C("reducemean-attr", "ReduceMean", {"x": rand(2, 3, 4)}, attrs={"axes": [1, -1]}, opset=13),
    C("reducemean-input-opset18", "ReduceMean", {"x": rand(2, 3, 4)}, consts={"a": i64(0)},
      attrs={"keepdims": 0}, opset=18),
    C("reducesum-attr-opset11", "ReduceSum", {"x": rand(2, 3, 4)}, attrs={"axes": [2], "keepdims": 0}, opset=11),
    C("reducesum-input-opset13", "ReduceSum", {"x": rand(2, 3, 4)}, consts={"a": i64(1)}, opset=13),
    C("reducesum-all", "ReduceSum", {"x": rand(2, 3, 4)}, opset=13),
    C("reducesum-noop-empty-axes", "ReduceSum", {"x": rand(2, 3, 4)}, attrs={"noop_with_empty_axes": 1}, opset=13),
    C("reducemax", "ReduceMax", {"x": rand(2, 3, 4)}, attrs={"axes": [0, 2]}, opset=13),
    C("reducemin-int", "ReduceMin", {"x": rand(2, 3, 4, dtype="int64", low=-9, high=9)}, attrs={"axes": [1]},
      opset=13),
    C("reduceprod", "ReduceProd", {"x": rand(2, 3, 4, low=0.5, high=1.5)}, attrs={"axes": [1]}, opset=13),
]

ALL_CASES = CONV_CASES + MATMUL_CASES + NORM_CASES + POOL_CASES + ELEMENTWISE_CASES + SHAPE_CASES


@pytest.mark.parametrize("case", ALL_CASES)
def test_single_operator_matches_onnxruntime(case: Case) -> None:
    assert_matches_onnxruntime(case.model(), case.inputs, rtol=case.rtol, atol=case.atol, oracle=case.oracle)


def test_converters_keep_runtime_inputs_unfolded() -> None:
    """A conv fed by a graph input stays a conv call (folding only touches constants)."""
    mod, _ = from_onnx(CONV_CASES[0].values[0].model())
    ops = [n.op_name for n in post_order(mod["main"].body) if isinstance(n, Call)]
    assert ops == ["nn.conv2d", "nn.bias_add"]


def test_lrn_even_size_follows_the_onnx_window() -> None:
    """onnxruntime refuses even sizes; the ONNX definition sums channels [c - (size-1)//2, c + size//2]."""
    x = rand(2, 7, 3, 3)
    size, alpha, beta, bias = 4, 0.2, 0.75, 2.0
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    (got,) = run_relay(make_model([node], {"x": x}, ["y"]), {"x": x})
    square = x.astype(np.float64) ** 2
    total = np.stack([square[:, max(0, c - 1):c + 3].sum(axis=1) for c in range(7)], axis=1)
    np.testing.assert_allclose(got, x / (bias + alpha / size * total) ** beta, rtol=1e-5, atol=1e-6)


def test_opset6_legacy_broadcast_attributes() -> None:
    """Before opset 7, `broadcast=1, axis=k` aligned the second operand at axis k, and PRelu's `(C,)` slope
    was per channel (onnxruntime has no kernels for these opsets, so the expectation is written out)."""
    a, b = rand(2, 3, 4, 5), rand(3, 4)
    node = helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1)
    (got,) = run_relay(make_model([node], {"a": a, "b": b}, ["y"], opset=6), {"a": a, "b": b})
    np.testing.assert_allclose(got, a + b.reshape(1, 3, 4, 1), rtol=1e-6)
    node = helper.make_node("Mul", ["a", "c"], ["y"], broadcast=1)
    c = rand(5)
    (got,) = run_relay(make_model([node], {"a": a, "c": c}, ["y"], opset=6), {"a": a, "c": c})
    np.testing.assert_allclose(got, a * c, rtol=1e-6)
    x, slope = rand(2, 3, 4, 4), rand(3)
    node = helper.make_node("PRelu", ["x", "slope"], ["y"])
    (got,) = run_relay(make_model([node], {"x": x}, ["y"], opset=6, initializers={"slope": slope}), {"x": x})
    np.testing.assert_allclose(got, np.where(x > 0, x, x * slope.reshape(3, 1, 1)), rtol=1e-6)


def test_pool_ceil_mode_drops_window_starting_in_padding() -> None:
    """ONNX and TVM disagree on ceil_mode output sizes; ONNX's rule wins (5 + 2 pad, k2 s2 -> 3, not 4)."""
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1],
                            ceil_mode=1)
    mod, _ = from_onnx(make_model([node], {"x": rand(1, 1, 5, 5)}, ["y"]))
    assert mod["main"].body.checked_type == TensorType((1, 1, 3, 3), "float32")


# --------------------------------------------------------------------------------------------
# multi-node graphs
# --------------------------------------------------------------------------------------------


def test_shape_arithmetic_is_folded_to_a_static_reshape() -> None:
    """`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`, as PyTorch exports `x.view(x.size(0), -1)`."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "minus_one"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    consts = {"zero": np.array(0, np.int64), "axes": i64(0), "minus_one": i64(-1)}
    x = rand(2, 3, 4)
    model = make_model(nodes, {"x": x}, ["y"], opset=13, initializers=consts)
    mod, params = from_onnx(model)
    ops = [n.op_name for n in post_order(mod["main"].body) if isinstance(n, Call)]
    assert ops == ["reshape", "nn.relu"]
    assert params == {}
    assert_matches_onnxruntime(model, {"x": x})


@pytest.mark.parametrize("opset", range(7, 22))
def test_small_network_at_every_opset(opset: int) -> None:
    """Operators whose spelling is the same in every opset from 7 to 21, end to end."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
        helper.make_node("LeakyRelu", ["n"], ["r"], alpha=0.1),
        helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["g"], transB=1),
        helper.make_node("Sigmoid", ["g"], ["y"]),
    ]
    consts = {"w": rand(4, 3, 3, 3), "b": rand(4), "s": rand(4), "bb": rand(4), "m": rand(4),
              "v": rand(4, low=0.5, high=1.5), "fc": rand(6, 4 * 2 * 2), "fcb": rand(6)}
    x = rand(2, 3, 8, 8)
    model = make_model(nodes, {"x": x}, ["y"], opset=opset, initializers=consts)
    assert_matches_onnxruntime(model, {"x": x}, rtol=1e-4, atol=1e-5)


def test_constant_nodes_and_constant_of_shape() -> None:
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(rand(3, 4), "c")),
        helper.make_node("Constant", [], ["f"], value_float=2.5),
        helper.make_node("Constant", [], ["ints"], value_ints=[3, 4]),
        helper.make_node("ConstantOfShape", ["ints"], ["ones"], value=numpy_helper.from_array(np.array([1.0],
                                                                                                  np.float32))),
        helper.make_node("Add", ["x", "c"], ["t0"]),
        helper.make_node("Mul", ["t0", "f"], ["t1"]),
        helper.make_node("Sub", ["t1", "ones"], ["y"]),
        helper.make_node("ConstantOfShape", ["ints"], ["zeros"]),
        helper.make_node("Shape", ["x"], ["tail"], start=-1),
        helper.make_node("Size", ["x"], ["size"]),
    ]
    model = make_model(nodes, {"x": rand(3, 4)}, ["y", "zeros", "tail", "size"], opset=15)
    assert_matches_onnxruntime(model, {"x": rand(3, 4)})


def test_multiple_outputs_and_dropout_mask() -> None:
    nodes = [
        helper.make_node("Dropout", ["x"], ["y", "mask"]),
        helper.make_node("Split", ["x"], ["a", "b"], axis=1),
    ]
    model = make_model(nodes, {"x": rand(2, 4)}, ["y", "mask", "b"], opset=13)
    assert_matches_onnxruntime(model, {"x": rand(2, 4)})


def test_small_cnn_matches_onnxruntime() -> None:
    from relay_tune.testing.onnx_zoo import small_cnn

    model = small_cnn(batch=2)
    x = rand(2, 3, 32, 32)
    assert_matches_onnxruntime(model, {"input": x}, rtol=1e-4, atol=1e-4)


def test_float64_and_float16_models() -> None:
    for dtype, tol in (("float64", 1e-10), ("float16", 2e-3)):
        x = rand(2, 3, dtype=dtype)
        nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Add", ["t", "x"], ["y"])]
        assert_matches_onnxruntime(make_model(nodes, {"x": x}, ["y"]), {"x": x}, rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------------
# inputs, shapes, errors
# --------------------------------------------------------------------------------------------


def _dynamic_model() -> Any:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_empty_tensor_value_info("y")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_symbolic_dims_become_dynamic_unless_overridden() -> None:
    mod, _ = from_onnx(_dynamic_model())
    assert mod["main"].params[0].type_annotation == TensorType((ANY, 3), "float32")
    mod, _ = from_onnx(_dynamic_model(), shape_overrides={"x": (5, 3)})
    assert mod["main"].params[0].type_annotation == TensorType((5, 3), "float32")
    out = evaluate(mod, {"x": -np.ones((5, 3), np.float32)})
    assert np.all(out == 0)


def test_shape_override_naming_unknown_input_is_an_error() -> None:
    with pytest.raises(RelayTuneError, match=r"unknown input\(s\) nope.*inputs: x"):
        from_onnx(_dynamic_model(), shape_overrides={"nope": (1, 3)})


def test_static_shape_needed_error_mentions_overrides() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["y"])]
    model = _dynamic_model()
    model.graph.node.pop()
    model.graph.node.extend(nodes)
    with pytest.raises(UnsupportedError, match=r"Shape.*dynamic shape \(\?, 3\).*shape_overrides"):
        from_onnx(model)


def test_unsupported_operators_listed_once_with_counts_before_anything_else() -> None:
    nodes = [
        helper.make_node("ImageDecoder", ["x", "k"], ["v"]),
        helper.make_node("TfIdfVectorizer", ["x"], ["nz"]),
        helper.make_node("ImageDecoder", ["v", "k"], ["v2"]),
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("FusedThing", ["x"], ["z"], domain="com.example"),
    ]
    model = make_model(nodes, {"x": rand(4)}, ["y"], initializers={"k": i64(2)})
    # An unsupported opset and a broken node would each fail too; the operator check comes first.
    model.opset_import[0].version = 99
    with pytest.raises(UnsupportedOperatorsError) as info:
        from_onnx(model)
    assert info.value.counts == {"ImageDecoder": 2, "TfIdfVectorizer": 1, "com.example.FusedThing": 1}
    message = str(info.value)
    assert "3 unsupported operator types at opset 99" in message
    assert "ImageDecoder (x2) first at node #" in message and "TfIdfVectorizer (x1) first at node #" in message
    assert isinstance(info.value, RelayTuneError)


@pytest.mark.parametrize("opset", [5, MAX_OPSET + 1])
def test_opsets_outside_the_supported_range_are_rejected(opset: int) -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": rand(2)}, ["y"], opset=opset)
    with pytest.raises(UnsupportedError, match=f"opset {opset}.*6 to {MAX_OPSET}"):
        from_onnx(model)


def test_an_older_opset_imports_when_its_operators_are_defined_as_at_opset_6() -> None:
    # Not-1 is still the definition at opset 6 (Relu-1 of the test above is not: Relu-6 replaced it)
    x = np.array([[True, False, True]])
    model = make_model([helper.make_node("Not", ["x"], ["y"])], {"x": x}, ["y"], opset=1)
    mod, _ = from_onnx(model)
    np.testing.assert_array_equal(evaluate(mod, {"x": x}), ~x)


def test_node_errors_name_the_node() -> None:
    node = helper.make_node("Add", ["a", "b"], ["y"], name="bad_add")
    model = make_model([node], {"a": rand(2, 3), "b": rand(4)}, ["y"])
    with pytest.raises(OnnxModelError, match=r"node #0 'bad_add' \(Add\).*cannot be broadcast"):
        from_onnx(model)


def test_unsupported_attribute_values_are_unsupported_errors() -> None:
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])
    model = make_model([node], {"x": rand(1, 1, 4, 4)}, ["y", "i"], opset=12)
    with pytest.raises(UnsupportedError, match="MaxPool's Indices output"):
        from_onnx(model)


def test_training_mode_nodes_are_unsupported() -> None:
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y"])
    model = make_model([node], {"x": rand(3)}, ["y"], opset=13,
                       initializers={"r": np.array(0.5, np.float32), "t": np.array(True)})
    with pytest.raises(UnsupportedError, match="training-mode Dropout"):
        from_onnx(model)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "mean", "var"])
    vec = rand(3)
    model = make_model([node], {"x": rand(2, 3, 4)}, ["y"], opset=13,
                       initializers={"s": vec, "b": vec, "m": vec, "v": vec})
    with pytest.raises(UnsupportedError, match="training-mode BatchNormalization"):
        from_onnx(model)


def test_split_sizes_must_cover_the_axis() -> None:
    node = helper.make_node("Split", ["x", "s"], ["a", "b"], axis=0)
    model = make_model([node], {"x": rand(6)}, ["a"], opset=13, initializers={"s": i64(2, 3)})
    with pytest.raises(OnnxModelError, match="do not add up"):
        from_onnx(model)


def test_runtime_shape_input_is_reported() -> None:
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    model = make_model([node], {"x": rand(2, 3), "s": i64(3, 2)}, ["y"])
    with pytest.raises(UnsupportedError, match="shape input is computed at run time"):
        from_onnx(model)


def test_missing_file_and_garbage_file(tmp_path: Path) -> None:
    with pytest.raises(RelayTuneError, match="no such file"):
        from_onnx(tmp_path / "missing.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\x01not a protobuf at all\xff" * 10)
    with pytest.raises(RelayTuneError):
        from_onnx(garbage)


def test_supported_ops_cover_the_required_list() -> None:
    required = {
        "Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "Relu", "LeakyRelu", "Clip", "Sigmoid",
        "Tanh", "Erf", "Gelu", "Softmax", "LogSoftmax", "MaxPool", "AveragePool", "GlobalAveragePool", "LRN",
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Sum", "Max", "Min", "Concat", "Split", "Slice",
        "Gather", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Expand", "Pad", "Constant",
        "ConstantOfShape", "Shape", "Cast", "Dropout", "Identity", "ReduceMean", "ReduceSum", "ReduceMax",
        "LayerNormalization", "Where",
    }
    assert required <= set(supported_ops())


# --------------------------------------------------------------------------------------------
# parameters and text round trip
# --------------------------------------------------------------------------------------------


def _weighted_model() -> tuple[Any, np.ndarray]:
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    consts = {"w": rand(4, 3, 3, 3), "b": rand(4), "fc_w": rand(5, 4 * 6 * 6), "fc_b": rand(5)}
    x = rand(1, 3, 6, 6)
    return make_model(nodes, {"x": x}, ["y"], initializers=consts), x


def test_params_are_the_meta_constants_in_print_order() -> None:
    model, _ = _weighted_model()
    mod, params = from_onnx(model)
    constants: list[np.ndarray] = []
    text = print_module(mod, constants_out=constants)
    assert list(params) == [f"const_{i}" for i in range(len(constants))]
    for i, c in enumerate(constants):
        np.testing.assert_array_equal(params[f"const_{i}"], c)
        assert f"meta[relay.Constant][{i}]" in text
    # The module embeds exactly these values: the weights, with the dense weight as given (transB=1).
    embedded = [n.data for n in post_order(mod["main"].body) if isinstance(n, Constant) and n.data.ndim > 0]
    assert len(embedded) == len(params) == 4


def test_text_and_params_file_round_trip(tmp_path: Path) -> None:
    model, x = _weighted_model()
    mod, params = from_onnx(model)
    constants: list[np.ndarray] = []
    relay_path = tmp_path / "net.relay"
    relay_path.write_text(print_module(mod, constants_out=constants))
    assert len(params) == len(constants)
    save_params(params_path(relay_path), constants)
    assert params_path(relay_path).name == "net.params.npz"
    loaded = load_module(relay_path)  # picks up net.params.npz beside the file
    expected = run_onnxruntime(model, {"x": x})[0]
    np.testing.assert_allclose(evaluate(loaded, {"x": x}), expected, rtol=1e-4, atol=1e-4)


def test_params_file_preferred_over_consts_sidecar(tmp_path: Path) -> None:
    model, x = _weighted_model()
    mod, _ = from_onnx(model)
    constants: list[np.ndarray] = []
    relay_path = tmp_path / "net.relay"
    relay_path.write_text(print_module(mod, constants_out=constants))
    # A sidecar with the right shapes but random values: loading must not use it when params exist.
    import json

    sidecar = {"relay.Constant": [{"dtype": str(c.dtype), "shape": list(c.shape)} for c in constants]}
    (tmp_path / "net.consts.json").write_text(json.dumps(sidecar))
    random_valued = evaluate(load_module(relay_path), {"x": x})
    save_params(params_path(relay_path), constants)
    exact = evaluate(load_module(relay_path), {"x": x})
    expected = run_onnxruntime(model, {"x": x})[0]
    np.testing.assert_allclose(exact, expected, rtol=1e-4, atol=1e-4)
    assert not np.allclose(random_valued, expected, rtol=1e-4, atol=1e-4)


def test_explicit_consts_argument_accepts_npz_and_json(tmp_path: Path) -> None:
    model, x = _weighted_model()
    mod, _ = from_onnx(model)
    constants: list[np.ndarray] = []
    relay_path = tmp_path / "net.relay"
    relay_path.write_text(print_module(mod, constants_out=constants))
    elsewhere = save_params(tmp_path / "weights.npz", constants)
    save_params(params_path(relay_path), [np.zeros_like(c) for c in constants])
    expected = run_onnxruntime(model, {"x": x})[0]
    # An explicit file wins over the one beside the model.
    np.testing.assert_allclose(evaluate(load_module(relay_path, consts=elsewhere), {"x": x}), expected,
                               rtol=1e-4, atol=1e-4)
    assert np.all(evaluate(load_module(relay_path), {"x": x}) == np.zeros(5, np.float32))
    import json

    sidecar = tmp_path / "shapes.consts.json"
    sidecar.write_text(json.dumps({"relay.Constant": [{"dtype": "float32", "shape": list(c.shape)}
                                                      for c in constants]}))
    synthesised = load_module(relay_path, consts=sidecar)
    assert evaluate(synthesised, {"x": x}).shape == (1, 5)


def test_load_params_validates_keys(tmp_path: Path) -> None:
    good = tmp_path / "good.params.npz"
    save_params(good, [np.arange(3), np.ones((2, 2), np.float32)])
    values = load_params(good)
    assert [v.shape for v in values] == [(3,), (2, 2)]
    stray = tmp_path / "stray.params.npz"
    np.savez(stray, const_0=np.zeros(1), weights=np.zeros(2))
    with pytest.raises(ParamsFileError, match="unexpected array 'weights'"):
        load_params(stray)
    gap = tmp_path / "gap.params.npz"
    np.savez(gap, const_0=np.zeros(1), const_2=np.zeros(2))
    with pytest.raises(ParamsFileError, match="const_1 is missing"):
        load_params(gap)
    pickled = tmp_path / "pickled.params.npz"
    np.savez(pickled, const_0=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ParamsFileError, match="cannot read"):
        load_params(pickled)
    not_zip = tmp_path / "bad.params.npz"
    not_zip.write_bytes(b"junk")
    with pytest.raises(ParamsFileError):
        load_params(not_zip)


def test_cli_import_writes_text_and_params(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from relay_tune.cli import main

    model, x = _weighted_model()
    onnx_path = tmp_path / "net.onnx"
    onnx.save(model, str(onnx_path))
    out = tmp_path / "out" / "net.relay"
    assert main(["import", str(onnx_path), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith('#[version = "0.0.5"]')
    assert "nn.conv2d(" in text and "meta[relay.Constant][0]" in text
    assert (tmp_path / "out" / "net.params.npz").is_file()
    # `check` on the written text uses the parameter file beside it.
    assert main(["check", str(out), "--summary"]) == 0
    np.testing.assert_allclose(
        evaluate(load_module(out), {"x": x}), run_onnxruntime(model, {"x": x})[0], rtol=1e-4, atol=1e-4
    )
    # An ONNX model goes straight into `check` as well.
    assert main(["check", str(onnx_path), "--summary"]) == 0


def test_cli_import_shape_option_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from relay_tune.cli import main

    path = tmp_path / "dyn.onnx"
    onnx.save(_dynamic_model(), str(path))
    out = tmp_path / "dyn.relay"
    assert main(["import", str(path), "-o", str(out), "--shape", "x=4,3"]) == 0
    assert "Tensor[(4, 3), float32]" in out.read_text()
    with pytest.raises(SystemExit) as usage:
        main(["import", str(path), "-o", str(out), "--shape", "x=4;3"])
    assert usage.value.code == 2
    assert "--shape" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    onnx.save(make_model([helper.make_node("ImageDecoder", ["x", "k"], ["v"])], {"x": rand(4)}, ["v"],
                         initializers={"k": i64(2)}), str(bad))
    assert main(["import", str(bad), "-o", str(tmp_path / "bad.relay")]) == 1
    assert "ImageDecoder (x1)" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# operators added for the importer: references against direct formulations, relations
# --------------------------------------------------------------------------------------------


def _naive_conv_transpose_2d(x: np.ndarray, w: np.ndarray, strides: Sequence[int], pads: Sequence[int],
                             output_padding: Sequence[int], dilation: Sequence[int], groups: int) -> np.ndarray:
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = c // groups
    full_h = (h - 1) * strides[0] + (kh - 1) * dilation[0] + 1 + output_padding[0]
    full_w = (wd - 1) * strides[1] + (kw - 1) * dilation[1] + 1 + output_padding[1]
    full = np.zeros((n, og * groups, full_h, full_w))
    for b in range(n):
        for ci in range(c):
            g = ci // cg
            for o in range(og):
                for i in range(h):
                    for j in range(wd):
                        for ki in range(kh):
                            for kj in range(kw):
                                full[b, g * og + o, i * strides[0] + ki * dilation[0],
                                     j * strides[1] + kj * dilation[1]] += x[b, ci, i, j] * w[ci, o, ki, kj]
    return full[:, :, pads[0]:full_h - pads[2], pads[1]:full_w - pads[3]]


def test_conv2d_transpose_reference_against_loops() -> None:
    opdef = get_op("nn.conv2d_transpose")
    x, w = rand(2, 4, 3, 4), rand(4, 3, 2, 3)
    settings = {"strides": (2, 1), "padding": (1, 0, 0, 1), "output_padding": (1, 0), "dilation": (1, 2),
                "groups": 2}
    attrs = opdef.make_attrs(settings)
    got = opdef.reference([x, w], attrs)
    want = _naive_conv_transpose_2d(x, w, (2, 1), (1, 0, 0, 1), (1, 0), (1, 2), 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ty = opdef.type_relation([TensorType(x.shape, "float32"), TensorType(w.shape, "float32")], attrs)
    assert ty == TensorType(got.shape, "float32")


def test_new_operator_relations_reject_bad_shapes() -> None:
    f32 = lambda *s: TensorType(s, "float32")
    conv_t = get_op("nn.conv2d_transpose")
    with pytest.raises(RelayTypeError, match="input channels"):
        conv_t.type_relation([f32(1, 3, 4, 4), f32(2, 5, 3, 3)], conv_t.make_attrs({}))
    bcast = get_op("broadcast_to")
    assert bcast.type_relation([f32(3, 1)], bcast.make_attrs({"shape": (2, 3, 4)})) == f32(2, 3, 4)
    with pytest.raises(RelayTypeError, match="cannot broadcast"):
        bcast.type_relation([f32(3, 2)], bcast.make_attrs({"shape": (3, 4)}))
    layer_norm = get_op("nn.layer_norm")
    with pytest.raises(RelayTypeError, match="gamma"):
        layer_norm.type_relation([f32(2, 5), f32(4), f32(5)], layer_norm.make_attrs({}))
    lrn = get_op("nn.lrn")
    with pytest.raises(RelayTypeError, match="floating-point"):
        lrn.type_relation([TensorType((1, 3, 2, 2), "int32")], lrn.make_attrs({}))
    conv3d = get_op("nn.conv3d")
    assert conv3d.type_relation([f32(1, 2, 5, 6, 7), f32(4, 2, 3, 3, 3)],
                                conv3d.make_attrs({"padding": (1, 1, 1)})) == f32(1, 4, 5, 6, 7)


def test_lrn_and_layer_norm_references() -> None:
    x = rand(2, 5, 3, 3)
    lrn = get_op("nn.lrn")
    got = lrn.reference([x], lrn.make_attrs({"size": 3, "alpha": 0.3, "beta": 0.5, "bias": 1.0}))
    sq = x.astype(np.float64) ** 2
    window = np.stack([np.pad(sq, [(0, 0), (1, 1), (0, 0), (0, 0)])[:, k:k + 5] for k in range(3)]).sum(0)
    np.testing.assert_allclose(got, x / (1.0 + 0.3 * window / 3) ** 0.5, rtol=1e-5)
    ln = get_op("nn.layer_norm")
    y = rand(4, 6)
    gamma, beta = rand(6), rand(6)
    got = ln.reference([y, gamma, beta], ln.make_attrs({"epsilon": 1e-3}))
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    np.testing.assert_allclose(got, (y - mean) / np.sqrt(var + 1e-3) * gamma + beta, rtol=1e-4, atol=1e-5)
