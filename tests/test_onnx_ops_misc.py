"""ONNX math, logic, normalisation, indexing and Einsum converters against onnx's reference evaluator.

Each case is a one-node model with odd shapes and non-default attributes; it runs through the importer and
both the reference interpreter and the compiled model (`relay_tune.build`), and must match
`onnx.reference.ReferenceEvaluator` in dtype, shape and value. Data enters through graph inputs wherever
the conversion allows it (only shape-deciding inputs such as axes and K are initializers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from relay_tune import build
from relay_tune.errors import UnsupportedError
from relay_tune.frontend import from_onnx
from relay_tune.frontend.onnx import MAX_OPSET, OnnxModelError
from relay_tune.interpreter import evaluate

RNG = np.random.default_rng(20261206)


def rand(*shape: int, dtype: str = "float32", low: float = -3.0, high: float = 3.0) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(low), int(high), size=shape).astype(dtype)
    return RNG.uniform(low, high, size=shape).astype(dtype)


def nonzero(*shape: int, dtype: str = "int32", low: int = -9, high: int = 10) -> np.ndarray:
    values = rand(*shape, dtype=dtype, low=low, high=high)
    return np.where(values == 0, np.ones((), values.dtype), values)


def boolean(*shape: int) -> np.ndarray:
    return RNG.random(shape) < 0.5


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@dataclass
class Case:
    """`op(inputs..., consts..., **attrs)` as a one-node model at `opset`."""

    id: str
    op: str
    inputs: dict[str, np.ndarray]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 18
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    outputs: int = 1
    rtol: float = 1e-5
    atol: float = 1e-5
    # "onnxruntime" where onnx's reference evaluator departs from the operator's definition (LpNormalization
    # p=1 without the absolute value, or axis 0 read as the default; Hardmax before opset 13 without coercion;
    # no GlobalLpPool at all)
    oracle: str = "reference"

    def model(self) -> onnx.ModelProto:
        out_names = [f"y{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op, [*self.inputs, *self.consts], out_names, **self.attrs)
        graph = helper.make_graph(
            [node], self.id,
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in self.inputs.items()],
            [helper.make_empty_tensor_value_info(n) for n in out_names],
            initializer=[numpy_helper.from_array(a, n) for n, a in self.consts.items()],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 11 if self.opset >= 23 else 10 if self.opset >= 21 else 8
        return model


def C(id: str, op: str, inputs: dict[str, np.ndarray], **kw: Any) -> Any:
    return pytest.param(Case(id, op, inputs, **kw), id=id)


X = rand(3, 5, 7)
TIES = np.array([[3, 1, 3, 0, 1], [2, 2, 2, 2, 2], [0, 5, 5, -1, 5]], np.int32)
SPECIAL = np.array([[1.0, np.inf, -np.inf, np.nan], [0.0, -2.5, np.inf, 3.0]], np.float32)

ELEMENTWISE = [
    C("castlike-float-to-int32", "CastLike", {"x": rand(3, 5), "like": np.zeros(2, np.int32)}),
    C("castlike-int-to-float16", "CastLike", {"x": rand(4, 3, dtype="int64", low=-50, high=50),
                                              "like": np.zeros(1, np.float16)}),
    C("mod-int32-python", "Mod", {"a": rand(4, 5, dtype="int32", low=-20, high=20), "b": nonzero(5)}),
    C("mod-int32-fmod", "Mod", {"a": rand(4, 5, dtype="int32", low=-20, high=20), "b": nonzero(4, 5)},
      attrs={"fmod": 1}),
    C("mod-int64-broadcast", "Mod", {"a": rand(3, 1, 5, dtype="int64", low=-99, high=99), "b": nonzero(2, 1,
                                                                                                          dtype="int64")}),
    C("mod-uint8", "Mod", {"a": rand(6, dtype="uint8", low=0, high=250), "b": nonzero(6, dtype="uint8", low=1)}),
    C("mod-float32-fmod", "Mod", {"a": rand(3, 7), "b": rand(3, 7, low=0.5, high=2.0) * np.sign(rand(3, 7))},
      attrs={"fmod": 1}),
    C("mod-float64-floor-opset28", "Mod", {"a": rand(2, 9, dtype="float64"), "b": rand(9, dtype="float64",
                                                                                      low=0.5, high=2.0) * -1},
      opset=28),
    C("and-broadcast", "And", {"a": boolean(2, 3, 4), "b": boolean(4)}),
    C("or", "Or", {"a": boolean(3, 5), "b": boolean(3, 5)}),
    C("xor-broadcast", "Xor", {"a": boolean(3, 1), "b": boolean(1, 6)}),
    C("not", "Not", {"x": boolean(2, 7)}),
    C("bitshift-left-uint8", "BitShift", {"x": rand(9, dtype="uint8", low=0, high=255),
                                          "s": rand(9, dtype="uint8", low=0, high=8)}, attrs={"direction": "LEFT"},
      opset=11),
    C("bitshift-right-uint32", "BitShift", {"x": rand(3, 4, dtype="uint32", low=0, high=2**31),
                                            "s": rand(4, dtype="uint32", low=0, high=31)},
      attrs={"direction": "RIGHT"}, opset=11),
    C("bitshift-right-int8-signed-out-of-range", "BitShift",
      {"x": np.array([-128, -7, -1, 5, 127, -100], np.int8), "s": np.array([1, 2, 9, -1, 7, 6], np.int8)},
      attrs={"direction": "RIGHT"}, opset=28),
    C("bitshift-left-int32-overflow", "BitShift",
      {"x": np.array([-5, 7, 1, 3, -1], np.int32), "s": np.array([3, 30, 31, 32, -2], np.int32)},
      attrs={"direction": "LEFT"}, opset=28),
    C("bitwise-not-int16", "BitwiseNot", {"x": rand(3, 5, dtype="int16", low=-30000, high=30000)}),
    C("bitwise-not-uint8", "BitwiseNot", {"x": rand(7, dtype="uint8", low=0, high=255)}),
    C("eye-like-offset-dtype", "EyeLike", {"x": rand(4, 6)}, attrs={"k": -1, "dtype": onnx.TensorProto.INT32}),
    C("isnan", "IsNaN", {"x": SPECIAL}),
    C("isinf-both", "IsInf", {"x": SPECIAL}),
    C("isinf-positive-only", "IsInf", {"x": SPECIAL}, attrs={"detect_negative": 0}),
    C("sin-vector-lanes", "Sin", {"x": rand(3, 17, low=-20, high=20)}),
    C("cos-float64", "Cos", {"x": rand(2, 9, dtype="float64", low=-20, high=20)}),
    C("tan-float16", "Tan", {"x": rand(5, 3, dtype="float16", low=-1.5, high=1.5)}, rtol=2e-3, atol=2e-3),
    C("asin", "Asin", {"x": rand(4, 5, low=-1, high=1)}),
    C("acos", "Acos", {"x": rand(11, low=-1, high=1)}),
    C("atan", "Atan", {"x": rand(3, 3, 3, low=-50, high=50)}),
    C("sinh", "Sinh", {"x": rand(3, 4)}),
    C("cosh", "Cosh", {"x": rand(5)}),
    C("asinh", "Asinh", {"x": rand(2, 3, 3, low=-20, high=20)}),
    C("acosh", "Acosh", {"x": rand(7, low=1.0, high=30.0)}),
    C("atanh", "Atanh", {"x": rand(3, 3, low=-0.95, high=0.95)}),
    C("hardswish", "HardSwish", {"x": rand(4, 5, low=-5, high=5)}),
    C("mish", "Mish", {"x": rand(3, 7, low=-10, high=10)}),
    C("celu-alpha", "Celu", {"x": rand(2, 9)}, attrs={"alpha": 0.7}),
    C("thresholded-relu", "ThresholdedRelu", {"x": rand(6, 5)}, attrs={"alpha": 0.3}),
]

REDUCTIONS = [
    C("reduce-l1-attr-axes", "ReduceL1", {"x": X}, attrs={"axes": [1], "keepdims": 0}, opset=13),
    C("reduce-l2-axes-input", "ReduceL2", {"x": X}, consts={"axes": i64(-1, 0)}, opset=18),
    C("reduce-sum-square-int64", "ReduceSumSquare", {"x": rand(3, 4, dtype="int64", low=-9, high=9)},
      consts={"axes": i64(1)}, attrs={"keepdims": 0}),
    C("reduce-log-sum", "ReduceLogSum", {"x": rand(4, 6, low=0.1, high=4.0)}, consts={"axes": i64(0)}),
    C("reduce-log-sum-exp-all", "ReduceLogSumExp", {"x": rand(3, 4, 5, low=-60, high=90)}, rtol=1e-5),
    C("reduce-l1-noop-empty-axes", "ReduceL1", {"x": rand(2, 3)}, attrs={"noop_with_empty_axes": 1}),
    C("lp-normalization-l1-axis0", "LpNormalization", {"x": rand(4, 3)}, attrs={"p": 1, "axis": 0},
      oracle="onnxruntime"),
    C("lp-normalization-l2", "LpNormalization", {"x": rand(2, 3, 5)}),
    C("group-norm-opset18-per-group", "GroupNormalization", {"x": rand(2, 6, 5, 3)},
      consts={"s": rand(3), "b": rand(3)}, attrs={"num_groups": 3, "epsilon": 1e-3}, opset=18, rtol=1e-4,
      atol=1e-4),
    C("group-norm-opset21-per-channel", "GroupNormalization", {"x": rand(2, 6, 7)},
      consts={"s": rand(6), "b": rand(6)}, attrs={"num_groups": 2}, opset=21, rtol=1e-4, atol=1e-4),
    C("rms-norm-last-axis", "RMSNormalization", {"x": rand(2, 3, 8)}, consts={"s": rand(8)}, opset=23,
      rtol=1e-4, atol=1e-5),
    C("rms-norm-axis1", "RMSNormalization", {"x": rand(2, 3, 4)}, consts={"s": rand(3, 4)},
      attrs={"axis": 1, "epsilon": 1e-2}, opset=23, rtol=1e-4, atol=1e-5),
    C("layer-norm-statistics", "LayerNormalization", {"x": rand(2, 3, 5)}, consts={"s": rand(3, 5), "b": rand(3, 5)},
      attrs={"axis": 1}, opset=17, outputs=3, rtol=1e-4, atol=1e-5),
]

INDEXING = [
    C("argmax-axis1-dropdims", "ArgMax", {"x": X}, attrs={"axis": 1, "keepdims": 0}),
    C("argmax-last-index-ties", "ArgMax", {"x": TIES}, attrs={"axis": 1, "select_last_index": 1}),
    C("argmin-first-index-ties", "ArgMin", {"x": TIES}, attrs={"axis": 0}),
    C("argmin-negative-axis", "ArgMin", {"x": X}, attrs={"axis": -1, "select_last_index": 1}),
    C("hardmax-opset13-axis1", "Hardmax", {"x": X}, attrs={"axis": 1}, opset=13),
    C("hardmax-opset11-coerced", "Hardmax", {"x": X}, attrs={"axis": 1}, opset=11, oracle="onnxruntime"),
    C("topk-largest", "TopK", {"x": X}, consts={"k": i64(3)}, outputs=2),
    C("topk-smallest-axis0-ties", "TopK", {"x": TIES}, consts={"k": i64(2)}, attrs={"axis": 0, "largest": 0},
      outputs=2),
    C("gather-elements-negative", "GatherElements",
      {"x": rand(3, 4, 5), "i": rand(3, 2, 5, dtype="int64", low=-4, high=4)}, attrs={"axis": 1}),
    C("gather-elements-int32-axis0", "GatherElements",
      {"x": rand(4, 3), "i": rand(6, 3, dtype="int32", low=0, high=4)}),
    C("gather-nd", "GatherND", {"x": rand(4, 3, 5), "i": rand(2, 3, 2, dtype="int64", low=-3, high=3)}),
    C("gather-nd-batch-dims", "GatherND", {"x": rand(2, 4, 3), "i": rand(2, 5, 1, dtype="int64", low=0, high=4)},
      attrs={"batch_dims": 1}),
    C("scatter-elements-none", "ScatterElements",
      {"x": rand(3, 5), "i": np.array([[4, 0, -2], [1, 3, 2], [0, 1, 4]], np.int64), "u": rand(3, 3)},
      attrs={"axis": 1}),
    *[C(f"scatter-elements-{r}-duplicates", "ScatterElements",
        {"x": rand(4, 3), "i": np.array([[1, 0, 3], [1, 0, 3], [2, 0, -1]], np.int64), "u": rand(3, 3)},
        attrs={"axis": 0, "reduction": r}) for r in ("add", "mul", "max", "min")],
    C("scatter-nd-rows", "ScatterND", {"x": rand(5, 4), "i": np.array([[3], [0], [-1]], np.int64),
                                       "u": rand(3, 4)}),
    C("scatter-nd-add-elements", "ScatterND",
      {"x": rand(3, 4, 2), "i": np.array([[0, 1], [2, 3], [0, 1]], np.int64), "u": rand(3, 2)},
      attrs={"reduction": "add"}),
]

EINSUM = [
    C(f"einsum-{name}", "Einsum", inputs, attrs={"equation": equation}, opset=12, rtol=1e-4, atol=1e-5)
    for name, equation, inputs in [
        ("batch-matmul", "bij,bjk->bik", {"a": rand(3, 2, 5), "b": rand(3, 5, 4)}),
        ("attention-scores", "bhqd,bhkd->bhqk", {"a": rand(2, 3, 4, 5), "b": rand(2, 3, 6, 5)}),
        ("implicit-matmul", "ij,jk", {"a": rand(3, 4), "b": rand(4, 2)}),
        ("transpose", "ij->ji", {"a": rand(3, 5)}),
        ("row-sum", "ij->i", {"a": rand(4, 6)}),
        ("inner", "i,i", {"a": rand(7), "b": rand(7)}),
        ("outer", "i,j->ij", {"a": rand(3), "b": rand(4)}),
        ("batch-diagonal", "...ii->...i", {"a": rand(2, 3, 4, 4)}),
        ("three-operands", "ij,jk,kl->il", {"a": rand(2, 3), "b": rand(3, 4), "c": rand(4, 5)}),
        ("summed-free-letter", "ijk,jl->il", {"a": rand(2, 3, 4), "b": rand(3, 5)}),
    ]
]

LABELS = np.array([[2, 0, 4], [1, -1, 3]], np.int64)  # -1: ignored below

NN = [
    C("swish-alpha", "Swish", {"x": rand(3, 5)}, attrs={"alpha": 0.6}, opset=24),
    C("nll-loss-mean-weighted-ignore", "NegativeLogLikelihoodLoss", {"x": rand(2, 5, 3), "t": LABELS},
      consts={"w": rand(5, low=0.1, high=1.0)}, attrs={"ignore_index": -1}, opset=13),
    C("nll-loss-none", "NegativeLogLikelihoodLoss", {"x": rand(4, 3), "t": np.array([0, 2, 1, 2], np.int64)},
      attrs={"reduction": "none"}, opset=13),
    C("softmax-cross-entropy-sum-with-log-prob", "SoftmaxCrossEntropyLoss", {"x": rand(2, 5, 3), "t": LABELS},
      attrs={"reduction": "sum", "ignore_index": -1}, outputs=2, opset=13, rtol=1e-4),
    C("softmax-cross-entropy-mean", "SoftmaxCrossEntropyLoss", {"x": rand(3, 4), "t": np.array([3, 0, 1], np.int64)},
      opset=13, rtol=1e-4),
    C("lp-pool-p3-strided-padded", "LpPool", {"x": rand(1, 2, 6, 7)},
      attrs={"kernel_shape": [3, 2], "p": 3, "strides": [2, 1], "pads": [1, 0, 1, 1]}, rtol=1e-4),
    C("lp-pool-1d", "LpPool", {"x": rand(2, 3, 9)}, attrs={"kernel_shape": [4], "strides": [2]}, rtol=1e-4),
    C("global-lp-pool", "GlobalLpPool", {"x": rand(2, 3, 4, 5)}, attrs={"p": 1}, rtol=1e-4, oracle="onnxruntime"),
    C("center-crop-pad-mixed", "CenterCropPad", {"x": rand(5, 4, 3)}, consts={"s": i64(2, 7)},
      attrs={"axes": [0, -1]}),
    C("split-with-empty-part", "Split", {"x": rand(3, 4)}, consts={"s": i64(4, 0)}, attrs={"axis": 1}, outputs=2),
    C("concat-with-empty-operand", "Concat", {"x": rand(2, 3), "e": np.zeros((2, 0), np.float32), "y": rand(2, 2)},
      attrs={"axis": 1}),
    C("slice-to-empty", "Slice", {"x": rand(4, 3)}, consts={"b": i64(5), "e": i64(9), "a": i64(0)}),
    C("reduce-max-empty-axis", "ReduceMax", {"x": np.zeros((2, 0, 3), np.float32)}, consts={"a": i64(1)}),
]

ATTENTION = [
    C("attention-4d-gqa-causal", "Attention", {"q": rand(2, 4, 3, 8), "k": rand(2, 2, 5, 8), "v": rand(2, 2, 5, 6)},
      attrs={"is_causal": 1}, opset=23, rtol=1e-4, atol=1e-5),
    C("attention-3d-bool-mask-softcap", "Attention",
      {"q": rand(2, 3, 12), "k": rand(2, 4, 12), "v": rand(2, 4, 6), "m": boolean(3, 4) | np.eye(3, 4, dtype=bool)},
      attrs={"q_num_heads": 3, "kv_num_heads": 3, "softcap": 2.0, "scale": 0.3}, opset=23, rtol=1e-4, atol=1e-5),
    C("attention-past-present-float-mask-qk-bias", "Attention",
      {"q": rand(1, 2, 3, 4), "k": rand(1, 2, 3, 4), "v": rand(1, 2, 3, 4), "m": rand(3, 5),
       "pk": rand(1, 2, 2, 4), "pv": rand(1, 2, 2, 4)},
      attrs={"qk_matmul_output_mode": 2}, outputs=4, opset=23, rtol=1e-4, atol=1e-5),
    C("attention-window-fully-masked-row", "Attention", {"q": rand(1, 1, 4, 4), "k": rand(1, 1, 6, 4),
                                                         "v": rand(1, 1, 6, 4), "m": np.array([False, True, True,
                                                                                               True, True, True])},
      attrs={"left_window_size": 1, "is_causal": 1, "qk_matmul_output_mode": 3}, outputs=4, opset=25,
      rtol=1e-4, atol=1e-5),
    C("rotary-embedding-4d-position-ids-partial", "RotaryEmbedding",
      {"x": rand(2, 3, 4, 8), "cos": rand(10, 3), "sin": rand(10, 3),
       "p": rand(2, 4, dtype="int64", low=0, high=10)}, attrs={"rotary_embedding_dim": 6}, opset=23),
    C("rotary-embedding-3d-interleaved", "RotaryEmbedding",
      {"x": rand(2, 5, 12), "cos": rand(2, 5, 3), "sin": rand(2, 5, 3)},
      attrs={"interleaved": 1, "num_heads": 2}, opset=23),
]

CASES = ELEMENTWISE + REDUCTIONS + INDEXING + EINSUM + NN + ATTENTION


def _reference(case: Case, model: onnx.ModelProto) -> list[np.ndarray]:
    if case.oracle == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return [np.asarray(v) for v in session.run(None, case.inputs)]
    return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, case.inputs)]


def _check(case: Case, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype}, the reference gives {w.dtype}"
        assert g.shape == w.shape, f"output {i}: shape {g.shape}, the reference gives {w.shape}"
        np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol, err_msg=f"output {i}")


def _outputs(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in result] if isinstance(result, tuple) else [np.asarray(result)]


@pytest.mark.parametrize("case", CASES)
def test_interpreter_matches_onnx_reference(case: Case) -> None:
    model = case.model()
    mod, _ = from_onnx(model)
    with np.errstate(all="ignore"):
        _check(case, _outputs(evaluate(mod, case.inputs)), _reference(case, model))


@pytest.mark.parametrize("case", CASES)
def test_compiled_model_matches_onnx_reference(case: Case) -> None:
    model = case.model()
    mod, _ = from_onnx(model)
    _check(case, _outputs(build(mod, "llvm").run(**case.inputs)), _reference(case, model))


def test_einsum_contraction_becomes_a_batch_matmul() -> None:
    model = Case("e", "Einsum", {"a": rand(3, 2, 5), "b": rand(3, 5, 4)}, attrs={"equation": "bij,bjk->bik"},
                 opset=12).model()
    mod, _ = from_onnx(model)
    from relay_tune.ir import Call, post_order

    ops = {node.op.name for node in post_order(mod["main"].body) if isinstance(node, Call)}
    assert "nn.batch_matmul" in ops and "multiply" not in ops


def test_newest_opset_is_imported() -> None:
    model = Case("relu", "Relu", {"x": rand(3)}, opset=MAX_OPSET).model()
    mod, _ = from_onnx(model)
    np.testing.assert_array_equal(evaluate(mod, {"x": np.array([-1, 0, 2], np.float32)}), [0, 0, 2])


def test_operator_version_newer_than_its_converter_is_rejected_naming_the_node(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from relay_tune.frontend import onnx_registry

    # Pretend the converter of Mod was written before Mod-28 changed the floating-point semantics.
    monkeypatch.setitem(onnx_registry.NEWEST_VERSION, "Mod", 13)
    node = helper.make_node("Mod", ["a", "b"], ["y"], name="the_mod")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, onnx.TensorProto.INT32, [3])
                                            for n in "ab"], [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
    expected = r"node #0 'the_mod' \(Mod\): Mod-28 \(the definition at opset 28\).*up to Mod-13"
    with pytest.raises(UnsupportedError, match=expected):
        from_onnx(model)
    model.opset_import[0].version = 27  # Mod-13 is the definition in effect: accepted
    from_onnx(model)


@pytest.mark.parametrize(("op", "attrs", "inputs", "message"), [
    ("BitShift", {"direction": "UP"}, {"x": np.ones(2, np.uint8), "s": np.ones(2, np.uint8)}, "direction 'UP'"),
    ("Einsum", {"equation": "ij,jk->iz"}, {"a": rand(2, 3), "b": rand(3, 4)}, "output letters"),
    ("TopK", {}, {"x": rand(4)}, "k=5 is not within"),
])
def test_bad_nodes_get_one_clear_error(op: str, attrs: dict[str, Any], inputs: dict[str, np.ndarray],
                                       message: str) -> None:
    consts = {"k": i64(5)} if op == "TopK" else {}
    model = Case("bad", op, inputs, attrs=attrs, consts=consts, outputs=2 if op == "TopK" else 1).model()
    with pytest.raises(OnnxModelError, match=message):
        from_onnx(model)


@pytest.mark.parametrize("op", ["Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint32", "uint64", "int16"])
def test_compiled_integer_comparisons_do_not_wrap(op: str, dtype: str) -> None:
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, 0, 1, info.max // 2 + 3, 5], dtype)
    b = np.array([info.min, info.max, info.max, 0, 2, 5], dtype)  # differences that overflow the type
    model = Case("cmp", op, {"a": a, "b": b}, opset=16).model()
    mod, _ = from_onnx(model)
    expected = ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0]
    np.testing.assert_array_equal(build(mod, "llvm").run(a=a, b=b), expected)
