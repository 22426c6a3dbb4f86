"""ONNX linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger,
QLinearMatMul, QLinearConv and the com.microsoft operators onnxruntime's quantizer emits.

Each case is a one-node model with random non-zero data and odd shapes, run through the importer and both the
reference interpreter and the compiled model (`relay_tune.build`), and compared with `onnx.reference` (default
domain) or onnxruntime (com.microsoft). Integer results (the *Integer operators, quantizing) must be exact; results
requantized after an integer product may differ by one step where `acc * multiplier` lands within float32 rounding
of a tie (relay-tune requantizes in float32, as onnxruntime does; onnx's reference in float64). Whole models:
a small float CNN quantized by onnxruntime (QDQ and QOperator static quantization, dynamic quantization) and
compiled must match onnxruntime within one quantization step of the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from relay_tune import build
from relay_tune.errors import UnsupportedError
from relay_tune.frontend import from_onnx
from relay_tune.frontend.onnx import OnnxModelError, UnsupportedOperatorsError
from relay_tune.frontend.onnx_ops_quant import integer_range
from relay_tune.interpreter import evaluate

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20261207)
MS = "com.microsoft"


def floats(*shape: int, low: float = -4.0, high: float = 4.0) -> np.ndarray:
    values = RNG.uniform(low, high, size=shape).astype(np.float32)
    return np.where(values == 0, np.float32(0.5), values)


def ints(*shape: int, dtype: str = "uint8", low: int | None = None, high: int | None = None) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min if low is None else low, (info.max if high is None else high) + 1,
                        size=shape).astype(dtype)


def scales(*shape: int, low: float = 0.01, high: float = 0.2) -> np.ndarray:
    return RNG.uniform(low, high, size=shape).astype(np.float32)


def arr(value: Any, dtype: str) -> np.ndarray:
    return np.array(value, dtype=dtype)


@dataclass
class Case:
    """`op(inputs..., consts...)` as a one-node model: `inputs` are graph inputs, `consts` initializers; their
    order in the node is `order` (names, "" for an omitted input)."""

    id: str
    op: str
    order: list[str]
    inputs: dict[str, np.ndarray]
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 21
    outputs: int = 1
    domain: str = ""
    steps: int = 0  # how many quantization steps a quantized result may differ from the oracle's
    # onnxruntime for com.microsoft operators and where onnx's reference has no implementation (DequantizeLinear
    # before opset 19)
    oracle: str = "reference"

    def model(self) -> onnx.ModelProto:
        out_names = [f"y{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op, self.order, out_names, domain=self.domain, **self.attrs)
        graph = helper.make_graph(
            [node], self.id,
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in self.inputs.items()],
            [helper.make_empty_tensor_value_info(n) for n in out_names],
            initializer=[numpy_helper.from_array(a, n) for n, a in self.consts.items()],
        )
        opsets = [helper.make_opsetid("", self.opset)]
        if self.domain:
            opsets.append(helper.make_opsetid(self.domain, 1))
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 11 if self.opset >= 23 else 10 if self.opset >= 21 else 8
        return model

    def expected(self) -> list[np.ndarray]:
        model = self.model()
        if self.domain or self.oracle == "onnxruntime":
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return [np.asarray(v) for v in session.run(None, self.inputs)]
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, self.inputs)]


def C(id: str, op: str, order: list[str], inputs: dict[str, np.ndarray], **kw: Any) -> Any:
    return pytest.param(Case(id, op, order, inputs, **kw), id=id)


TIES = np.array([[0.25, 0.75, 1.25, -0.25, -0.75, -1.25, 300.0], [1.75, -1.75, 0.0, 2.25, -2.25, -400.0, 0.3]],
                np.float32)  # divided by 0.5: .5 ties both ways, saturation both ways

QUANTIZE = [
    C("quantize-opset10-uint8-no-zero-point", "QuantizeLinear", ["x", "s"], {"x": floats(3, 5)},
      consts={"s": arr(0.037, "float32")}, opset=10),
    C("quantize-ties-to-even-saturate-int8", "QuantizeLinear", ["x", "s", "z"], {"x": TIES},
      consts={"s": arr(0.5, "float32"), "z": arr(3, "int8")}, opset=13),
    C("quantize-ties-to-even-saturate-uint8", "QuantizeLinear", ["x", "s", "z"], {"x": TIES},
      consts={"s": arr([0.5], "float32"), "z": arr([128], "uint8")}, opset=19),
    C("quantize-per-axis-1", "QuantizeLinear", ["x", "s", "z"], {"x": floats(2, 5, 3)},
      consts={"s": scales(5), "z": ints(5, dtype="int8", low=-20, high=20)}, opset=13),
    C("quantize-per-axis-negative-runtime-scale", "QuantizeLinear", ["x", "s", "z"],
      {"x": floats(3, 2, 7), "s": scales(7), "z": ints(7, dtype="uint8", low=100, high=150)},
      attrs={"axis": -1}, opset=13),
    C("quantize-blocked-remainder", "QuantizeLinear", ["x", "s", "z"], {"x": floats(4, 7, 2)},
      consts={"s": scales(4, 3, 2), "z": ints(4, 3, 2, dtype="int8", low=-9, high=9)},
      attrs={"axis": 1, "block_size": 3}),
    C("quantize-blocked-runtime-params", "QuantizeLinear", ["x", "s", "z"],
      {"x": floats(5, 6), "s": scales(5, 3), "z": ints(5, 3, dtype="uint8", low=110, high=140)},
      attrs={"axis": 1, "block_size": 2}),
    C("quantize-int16", "QuantizeLinear", ["x", "s", "z"], {"x": floats(3, 9, low=-500, high=500)},
      consts={"s": arr(0.013, "float32"), "z": arr(-77, "int16")}),
    C("quantize-uint16-per-axis0", "QuantizeLinear", ["x", "s", "z"], {"x": floats(4, 5, low=-300, high=800)},
      consts={"s": scales(4, low=0.005, high=0.02), "z": ints(4, dtype="uint16", low=1000, high=30000)},
      attrs={"axis": 0}),
    C("quantize-output-dtype-int8", "QuantizeLinear", ["x", "s"], {"x": floats(2, 3, 5)},
      consts={"s": arr(0.05, "float32")}, attrs={"output_dtype": TensorProto.INT8}, opset=23),
    C("quantize-float16-scale", "QuantizeLinear", ["x", "s", "z"], {"x": floats(6, 5).astype(np.float16)},
      consts={"s": arr(0.0625, "float16"), "z": arr(7, "uint8")}),
    C("quantize-int32-input", "QuantizeLinear", ["x", "s", "z"], {"x": ints(4, 5, dtype="int32", low=-900, high=900)},
      consts={"s": arr(3.7, "float32"), "z": arr(-20, "int8")}, opset=13),
    C("quantize-precision-float16-uint16", "QuantizeLinear", ["x", "s", "z"], {"x": floats(3, 8, low=-30, high=300)},
      consts={"s": arr(0.0123, "float32"), "z": arr(60000, "uint16")}, attrs={"precision": TensorProto.FLOAT16},
      opset=23),
    C("quantize-opset25", "QuantizeLinear", ["x", "s", "z"], {"x": floats(3, 4)},
      consts={"s": scales(4), "z": ints(4, dtype="int8")}, attrs={"axis": 1}, opset=25),
]

DEQUANTIZE = [
    C("dequantize-opset10-uint8", "DequantizeLinear", ["x", "s", "z"], {"x": ints(3, 7)},
      consts={"s": arr(0.021, "float32"), "z": arr(131, "uint8")}, opset=10, oracle="onnxruntime"),
    C("dequantize-int32-no-zero-point", "DequantizeLinear", ["x", "s"],
      {"x": ints(5, 3, dtype="int32", low=-(2**30), high=2**30)}, consts={"s": arr(1.5e-6, "float32")}, opset=10,
      oracle="onnxruntime"),
    C("dequantize-int32-zero-point", "DequantizeLinear", ["x", "s", "z"],
      {"x": ints(5, 3, dtype="int32", low=-(2**30), high=2**30)},
      consts={"s": arr(1.5e-6, "float32"), "z": arr(123456789, "int32")}, opset=19),
    C("dequantize-per-axis-int8", "DequantizeLinear", ["x", "s", "z"], {"x": ints(2, 3, 5, dtype="int8")},
      consts={"s": scales(3), "z": ints(3, dtype="int8", low=-9, high=9)}, opset=13, oracle="onnxruntime"),
    C("dequantize-blocked-axis0", "DequantizeLinear", ["x", "s", "z"], {"x": ints(9, 4, dtype="int8")},
      consts={"s": scales(3, 4), "z": ints(3, 4, dtype="int8", low=-5, high=5)},
      attrs={"axis": 0, "block_size": 4}),
    C("dequantize-blocked-runtime-params", "DequantizeLinear", ["x", "s", "z"],
      {"x": ints(3, 10, dtype="uint8"), "s": scales(3, 4), "z": ints(3, 4, dtype="uint8")},
      attrs={"axis": -1, "block_size": 3}),
    C("dequantize-int16-uint16", "DequantizeLinear", ["x", "s", "z"], {"x": ints(4, 6, dtype="uint16")},
      consts={"s": arr(0.001, "float32"), "z": arr(40000, "uint16")}),
    C("dequantize-float16-scale", "DequantizeLinear", ["x", "s", "z"], {"x": ints(4, 3, dtype="int16")},
      consts={"s": arr(0.004, "float16"), "z": arr(-300, "int16")}),
    C("dequantize-output-dtype-float16", "DequantizeLinear", ["x", "s"], {"x": ints(7, dtype="int8")},
      consts={"s": arr(0.3, "float32")}, attrs={"output_dtype": TensorProto.FLOAT16}, opset=23),
]

DYNAMIC = [
    C("dynamic-quantize-mixed-signs", "DynamicQuantizeLinear", ["x"], {"x": floats(3, 7)}, outputs=3, opset=11),
    C("dynamic-quantize-all-positive", "DynamicQuantizeLinear", ["x"], {"x": floats(5, 4, low=0.5, high=9)},
      outputs=3, opset=11),
    C("dynamic-quantize-all-negative", "DynamicQuantizeLinear", ["x"], {"x": floats(2, 9, low=-7, high=-0.1)},
      outputs=3, opset=11),
    C("dynamic-quantize-zeros", "DynamicQuantizeLinear", ["x"], {"x": np.zeros((2, 3), np.float32)},
      outputs=3, opset=11),
]

INTEGER = [
    C("matmul-integer-uint8-per-column", "MatMulInteger", ["a", "b", "az", "bz"],
      {"a": ints(5, 13), "b": ints(13, 7)}, consts={"az": arr(77, "uint8"), "bz": ints(7)}, opset=10),
    C("matmul-integer-int8-uint8-batched-runtime-zero-points", "MatMulInteger", ["a", "b", "az", "bz"],
      {"a": ints(2, 3, 11, dtype="uint8"), "b": ints(2, 11, 6, dtype="int8"), "az": arr(17, "uint8"),
       "bz": arr(-3, "int8")}, opset=10),
    C("matmul-integer-constant-weight", "MatMulInteger", ["a", "b", "", "bz"], {"a": ints(3, 4, 9, dtype="int8")},
      consts={"b": ints(9, 5, dtype="int8"), "bz": ints(5, dtype="int8")}, opset=10),
    # a reduction far beyond float32's exact integers (2**24): 255 * 255 * 4099 > 2.6e8
    C("matmul-integer-large-reduction-exact", "MatMulInteger", ["a", "b"],
      {"a": ints(2, 4099, low=250), "b": ints(4099, 3, low=250)}, opset=10),
    C("conv-integer-padded-per-channel", "ConvInteger", ["x", "w", "xz", "wz"], {"x": ints(2, 3, 7, 6)},
      consts={"w": ints(5, 3, 3, 2, dtype="uint8"), "xz": arr(121, "uint8"), "wz": ints(5, dtype="uint8")},
      attrs={"pads": [1, 0, 2, 1], "strides": [2, 1]}, opset=10),
    C("conv-integer-int8-grouped-runtime-weight", "ConvInteger", ["x", "w", "xz"],
      {"x": ints(1, 4, 5, 9, dtype="int8"), "w": ints(6, 2, 3, 3, dtype="int8"), "xz": arr(-5, "int8")},
      attrs={"group": 2, "auto_pad": "SAME_UPPER", "dilations": [1, 2]}, opset=10),
    C("qlinear-matmul-uint8", "QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
      {"a": ints(4, 9), "b": ints(9, 6)},
      consts={"as": arr(0.021, "float32"), "az": arr(113, "uint8"), "bs": arr(0.013, "float32"),
              "bz": arr(127, "uint8"), "ys": arr(0.09, "float32"), "yz": arr(120, "uint8")}, opset=10, steps=1),
    C("qlinear-matmul-int8-per-column-batched", "QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
      {"a": ints(2, 3, 8, dtype="int8"), "b": ints(8, 5, dtype="int8")},
      consts={"as": arr(0.02, "float32"), "az": arr(3, "int8"), "bs": scales(5, low=0.005, high=0.02),
              "bz": ints(5, dtype="int8", low=-4, high=4), "ys": arr(0.2, "float32"), "yz": arr(-6, "int8")},
      steps=1),
    C("qlinear-conv-bias-per-channel", "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
      {"x": ints(2, 3, 6, 7)},
      consts={"xs": arr(0.02, "float32"), "xz": arr(128, "uint8"), "w": ints(4, 3, 3, 3, dtype="uint8"),
              "ws": scales(4, low=0.002, high=0.01), "wz": arr(130, "uint8"), "ys": arr(0.15, "float32"),
              "yz": arr(100, "uint8"), "b": ints(4, dtype="int32", low=-3000, high=3000)},
      attrs={"pads": [1, 1, 0, 2]}, opset=10, steps=1),
    C("qlinear-conv-int8-strided", "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
      {"x": ints(1, 2, 9, 8, dtype="int8")},
      consts={"xs": arr(0.03, "float32"), "xz": arr(-2, "int8"), "w": ints(3, 2, 2, 3, dtype="int8"),
              "ws": arr(0.004, "float32"), "wz": arr(0, "int8"), "ys": arr(0.05, "float32"), "yz": arr(5, "int8")},
      attrs={"strides": [2, 2]}, opset=10, steps=1),
]


def _q(name: str, shape: tuple[int, ...], dtype: str = "uint8") -> dict[str, np.ndarray]:
    """A quantized input `name` with its scale and zero point (as initializers `name_s`, `name_z`)."""
    return {name: ints(*shape, dtype=dtype), f"{name}_s": scales(low=0.01, high=0.05),
            f"{name}_z": ints(dtype=dtype, low=-10 if dtype == "int8" else 100, high=10 if dtype == "int8" else 150)}


def _ms(id: str, op: str, order: list[str], data: dict[str, np.ndarray], graph_inputs: tuple[str, ...],
        **kw: Any) -> Any:
    inputs = {k: v for k, v in data.items() if k in graph_inputs}
    consts = {k: v for k, v in data.items() if k not in graph_inputs}
    return C(id, op, order, inputs, consts=consts, domain=MS, **kw)


_ADD = {**_q("a", (2, 3, 5)), **_q("b", (3, 1)), "ys": arr(0.04, "float32"), "yz": arr(125, "uint8")}
_MUL = {**_q("a", (4, 6), "int8"), **_q("b", (6,), "int8"), "ys": arr(0.02, "float32"), "yz": arr(-3, "int8")}
_SIG = {**_q("x", (3, 7), "int8"), "ys": arr(1 / 256, "float32"), "yz": arr(-128, "int8")}
_LEAKY = {**_q("x", (2, 9)), "ys": arr(0.03, "float32"), "yz": arr(90, "uint8")}
_CAT = {"ys": arr(0.05, "float32"), "yz": arr(128, "uint8"), **_q("p", (2, 3, 4)), **_q("q", (2, 5, 4))}
_GAP = {**_q("x", (2, 3, 5, 7)), "ys": arr(0.02, "float32"), "yz": arr(120, "uint8")}
_GAP_NHWC = {**_q("x", (2, 4, 3, 5), "int8"), "ys": arr(0.02, "float32"), "yz": arr(1, "int8")}
# onnxruntime's uint8 x int8 kernels saturate pairs of products to int16 on AVX2 hosts (what its quantizer's
# reduce_range avoids): int8 weights in [-64, 63] keep it exact
W7 = {"dtype": "int8", "low": -64, "high": 63}
_MMF = {"a": ints(3, 10), "b": ints(10, 4, **W7), "as": arr(0.02, "float32"), "bs": scales(4),
        "az": arr(120, "uint8"), "bz": ints(4, dtype="int8", low=-3, high=3), "bias": floats(4)}
_DQMM = {"a": floats(2, 3, 12), "b": ints(12, 5, **W7), "bs": scales(5), "bz": ints(5, dtype="int8", low=-2, high=2),
         "bias": floats(5)}
_QGEMM = {"a": ints(4, 6), "as": arr(0.02, "float32"), "az": arr(125, "uint8"), "b": ints(5, 6, **W7),
          "bs": scales(5, low=0.01, high=0.03), "bz": np.zeros(5, np.int8),
          "c": ints(5, dtype="int32", low=-500, high=500), "ys": arr(0.1, "float32"), "yz": arr(128, "uint8")}

MICROSOFT = [
    _ms("ms-qlinear-add-broadcast", "QLinearAdd", ["a", "a_s", "a_z", "b", "b_s", "b_z", "ys", "yz"], _ADD,
        ("a", "b"), steps=1),
    _ms("ms-qlinear-mul-int8", "QLinearMul", ["a", "a_s", "a_z", "b", "b_s", "b_z", "ys", "yz"], _MUL, ("a", "b"),
        steps=1),
    _ms("ms-qlinear-sigmoid", "QLinearSigmoid", ["x", "x_s", "x_z", "ys", "yz"], _SIG, ("x",), steps=1),
    _ms("ms-qlinear-leaky-relu", "QLinearLeakyRelu", ["x", "x_s", "x_z", "ys", "yz"], _LEAKY, ("x",),
        attrs={"alpha": 0.13}, steps=1),
    _ms("ms-qlinear-concat", "QLinearConcat", ["ys", "yz", "p", "p_s", "p_z", "q", "q_s", "q_z"], _CAT, ("p", "q"),
        attrs={"axis": 1}, steps=1),
    _ms("ms-qlinear-global-average-pool", "QLinearGlobalAveragePool", ["x", "x_s", "x_z", "ys", "yz"], _GAP, ("x",),
        steps=1),
    _ms("ms-qlinear-global-average-pool-channels-last", "QLinearGlobalAveragePool",
        ["x", "x_s", "x_z", "ys", "yz"], _GAP_NHWC, ("x",), attrs={"channels_last": 1}, steps=1),
    _ms("ms-matmul-integer-to-float", "MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "bz", "bias"], _MMF,
        ("a",)),
    _ms("ms-dynamic-quantize-matmul", "DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], _DQMM, ("a",)),
    _ms("ms-qgemm-quantized-trans-b", "QGemm", ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], _QGEMM, ("a",),
        attrs={"transB": 1, "alpha": 0.75}, steps=1),
    _ms("ms-qgemm-float-output", "QGemm", ["a", "as", "az", "b", "bs", "bz", "c"],
        {k: v for k, v in _QGEMM.items() if k not in ("ys", "yz")}, ("a",), attrs={"transB": 1}),
]

CASES = QUANTIZE + DEQUANTIZE + DYNAMIC + INTEGER + MICROSOFT


def _outputs(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in result] if isinstance(result, tuple) else [np.asarray(r) for r in [result]]


def _check(case: Case, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, the oracle gives {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape}, the oracle gives {w.shape}"
        if w.dtype.kind in "iu":
            diff = np.abs(g.astype(np.int64) - w.astype(np.int64))
            assert diff.max(initial=0) <= case.steps, f"output {i}: off by {diff.max()} steps:\n{g}\n{w}"
            # a step off only at float32 rounding of a tie: rare
            assert np.count_nonzero(diff) <= max(1, diff.size // 20), f"output {i}: {np.count_nonzero(diff)} differ"
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max(initial=0))),
                                       err_msg=f"output {i}")


@pytest.mark.parametrize("case", CASES)
def test_interpreter_matches_oracle(case: Case) -> None:
    mod, _ = from_onnx(case.model())
    _check(case, _outputs(evaluate(mod, case.inputs)), case.expected())


@pytest.mark.parametrize("case", CASES)
def test_compiled_model_matches_oracle(case: Case) -> None:
    mod, _ = from_onnx(case.model())
    _check(case, _outputs(build(mod, "llvm").run(**case.inputs)), case.expected())


def test_integer_range_comes_from_the_dtype_name() -> None:
    assert integer_range("int8") == (-128, 127)
    assert integer_range("uint8") == (0, 255)
    assert integer_range("int16") == (-32768, 32767)
    assert integer_range("uint4") == (0, 15)
    assert integer_range("int4") == (-8, 7)
    with pytest.raises(UnsupportedError, match="float8_e4m3fn"):
        integer_range("float8_e4m3fn")


def test_per_row_and_per_column_zero_points_are_exact() -> None:
    """MatMulInteger with a zero point per row of A and per column of B, and a reduction beyond float32's exact
    integers, against numpy in int64 (neither onnx's reference nor onnxruntime takes per-row zero points)."""
    a, b = ints(2, 5, 2049), ints(2049, 7, dtype="int8")
    az, bz = ints(5), ints(7, dtype="int8")
    case = Case("rows", "MatMulInteger", ["a", "b", "az", "bz"], {"a": a, "b": b}, consts={"az": az, "bz": bz},
                opset=10)
    want = ((a.astype(np.int64) - az[:, None]) @ (b.astype(np.int64) - bz)).astype(np.int32)
    mod, _ = from_onnx(case.model())
    np.testing.assert_array_equal(evaluate(mod, case.inputs), want)
    np.testing.assert_array_equal(build(mod, "llvm").run(**case.inputs), want)


def test_integer_products_run_in_int32() -> None:
    from relay_tune.ir import Call, post_order

    case = INTEGER[0].values[0]
    mod, _ = from_onnx(case.model())
    products = [n for n in post_order(mod["main"].body) if isinstance(n, Call) and n.op.name == "nn.dense"]
    assert products and all(n.checked_type.dtype == "int32" for n in products)


def test_bad_scale_shape_is_a_clear_error() -> None:
    case = Case("bad", "QuantizeLinear", ["x", "s"], {"x": floats(3, 5)}, consts={"s": scales(4)}, opset=13)
    with pytest.raises(OnnxModelError, match=r"per-axis quantization along axis 1 .* needs a vector of 5 values"):
        from_onnx(case.model())
    blocked = Case("bad", "QuantizeLinear", ["x", "s"], {"x": floats(3, 5)}, consts={"s": scales(3, 2)},
                   attrs={"axis": 1, "block_size": 2})
    with pytest.raises(OnnxModelError, match=r"block_size 2 needs shape \(3, 3\)"):
        from_onnx(blocked.model())


def test_mismatched_output_dtype_is_a_clear_error() -> None:
    case = Case("bad", "QuantizeLinear", ["x", "s", "z"], {"x": floats(3)},
                consts={"s": arr(0.1, "float32"), "z": arr(1, "uint8")}, attrs={"output_dtype": TensorProto.INT8})
    with pytest.raises(OnnxModelError, match="output_dtype int8 differs from the zero point's type uint8"):
        from_onnx(case.model())


def test_float8_quantization_is_unsupported_naming_the_type() -> None:
    case = Case("f8", "QuantizeLinear", ["x", "s", "z"], {"x": floats(3)},
                consts={"s": arr(0.1, "float32"), "z": np.zeros((), np.float32)})
    case.consts["z"] = np.zeros((), np.float32)
    with pytest.raises(UnsupportedError, match="QuantizeLinear to float32"):
        from_onnx(case.model())


def test_unknown_microsoft_operator_is_listed_with_its_domain() -> None:
    node = helper.make_node("QAttention", ["x"], ["y"], domain=MS)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    with pytest.raises(UnsupportedOperatorsError, match=r"com\.microsoft\.QAttention"):
        from_onnx(model)


# --- whole quantized models ------------------------------------------------------------------------


def _float_cnn() -> onnx.ModelProto:
    """Conv-Relu-Conv-Add(residual)-Relu-GlobalAveragePool-Flatten-Gemm on (1, 3, 13, 11) images."""
    w1, b1 = RNG.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), RNG.normal(0, 0.1, 8).astype(np.float32)
    w2, b2 = RNG.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), RNG.normal(0, 0.1, 8).astype(np.float32)
    wf, bf = RNG.normal(0, 0.3, (5, 8)).astype(np.float32), RNG.normal(0, 0.1, 5).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in
             [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2), ("wf", wf), ("bf", bf)]]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 13, 11])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _float_mlp() -> onnx.ModelProto:
    w1 = RNG.normal(0, 0.3, (24, 16)).astype(np.float32)
    w2 = RNG.normal(0, 0.3, (16, 7)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
                              initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _output_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that produces the graph's output (one quantization step of it)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = producer[model.graph.output[0].name]
    assert node.op_type == "DequantizeLinear", node.op_type
    return float(inits[node.input[1]])


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_statically_quantized_cnn_matches_onnxruntime(tmp_path: Any, quant_format: str) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": floats(1, 3, 13, 11, low=-1, high=1)} for _ in range(8)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn.int8.onnx"
    onnx.save(_float_cnn(), str(src))
    # reduce_range: 7-bit weights, which onnxruntime's uint8 x int8 kernels multiply exactly on AVX2 hosts
    quantize_static(str(src), str(dst), Reader(), quant_format=getattr(QuantFormat, quant_format),
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                    reduce_range=True)
    model = onnx.load(str(dst))
    ops = {n.op_type for n in model.graph.node}
    if quant_format == "QDQ":
        assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    else:
        assert {"QLinearConv", "QLinearAdd", "QLinearGlobalAveragePool"} <= ops
    step = _output_step(model)
    mod, _ = from_onnx(model)
    compiled = build(mod, "llvm")
    for _ in range(3):
        x = floats(1, 3, 13, 11, low=-1, high=1)
        want = _run_ort(model, {"x": x})
        got = compiled.run(x=x)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=step * 1.01)
        np.testing.assert_allclose(evaluate(mod, {"x": x}), want, rtol=0, atol=step * 1.01)


def test_dynamically_quantized_mlp_matches_onnxruntime(tmp_path: Any) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = tmp_path / "mlp.onnx", tmp_path / "mlp.int8.onnx"
    onnx.save(_float_mlp(), str(src))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, reduce_range=True)
    model = onnx.load(str(dst))
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in model.graph.node}
    mod, _ = from_onnx(model)
    compiled = build(mod, "llvm")
    x = floats(3, 24, low=-2, high=2)
    want = _run_ort(model, {"x": x})
    np.testing.assert_allclose(compiled.run(x=x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(evaluate(mod, {"x": x}), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("qtype", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2, TensorProto.FLOAT4E2M1])
def test_float8_and_float4_quantization_round_trips_like_the_reference(qtype: int, saturate: int) -> None:
    from onnx.reference import ReferenceEvaluator

    x = (np.random.default_rng(7).standard_normal((3, 7)) * 40).astype(np.float32)  # beyond e4m3's 448: saturates
    scale = np.array([0.5, 0.25, 2.0], np.float32)
    zero = helper.make_tensor("z", qtype, [3], [0.0, 0.0, 0.0])
    attrs = {"axis": 0} if qtype == TensorProto.FLOAT4E2M1 else {"axis": 0, "saturate": saturate}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
                              [onnx.numpy_helper.from_array(scale, "s"), zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    mod, _ = from_onnx(model)
    np.testing.assert_array_equal(np.asarray(evaluate(mod, {"x": x})), want)
    np.testing.assert_array_equal(build(mod, "llvm").run(x), want)


def test_dynamically_quantized_lstm_runs_on_its_integers(tmp_path: Any) -> None:
    """onnxruntime's quantize_dynamic turns an LSTM into com.microsoft.DynamicQuantizeLSTM (int8 weights in another
    layout): imported, it quantizes the input and the state on the fly as onnxruntime does and multiplies the
    integers (`nn.lstm_sequence_int8`), so it agrees with onnxruntime (on one thread) to float rounding, far
    closer than the float LSTM of the dequantized weights. The cases of that kernel are in
    tests/test_lstm_sequence_int8.py."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(5)
    seq, batch, size, hidden = 6, 2, 10, 7
    w = (0.3 * rng.standard_normal((2, 4 * hidden, size))).astype(np.float32)
    r = (0.3 * rng.standard_normal((2, 4 * hidden, hidden))).astype(np.float32)
    b = (0.1 * rng.standard_normal((2, 8 * hidden))).astype(np.float32)
    node = helper.make_node("LSTM", ["x", "w", "r", "b"], ["y"], hidden_size=hidden, direction="bidirectional")
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, size])
    graph = helper.make_graph([node], "lstm", [x_info],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, 2, batch, hidden])],
                              [onnx.numpy_helper.from_array(v, n) for v, n in ((w, "w"), (r, "r"), (b, "b"))])
    src, dst = tmp_path / "lstm.onnx", tmp_path / "lstm.int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(src))
    # reduce_range: 7-bit weights, which onnxruntime's u8 x s8 kernels multiply without saturating on every CPU
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["LSTM"], reduce_range=True)
    model = onnx.load(str(dst))
    assert "DynamicQuantizeLSTM" in {n.op_type for n in model.graph.node}
    x = floats(seq, batch, size, low=-1, high=1)
    mod, _ = from_onnx(model)
    got = build(mod, "llvm").run(x=x)
    np.testing.assert_allclose(evaluate(mod, {"x": x}), got, rtol=1e-5, atol=1e-6)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # with more, onnxruntime quantizes each thread's rows of the state apart
    want = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
    float_lstm = _run_ort(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), {"x": x})
    assert np.abs(float_lstm - want).max() > 100 * np.abs(got - want).max()
