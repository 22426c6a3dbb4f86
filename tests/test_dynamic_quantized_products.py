"""Dynamically quantized models (onnxruntime's `quantize_dynamic`): DynamicQuantizeLinear, then ConvInteger or
MatMulInteger with uint8 weights whose zero points leave `w - zw` outside int8.

- QuantizedProducts runs such int32 products as float32 products of the same small integers, cast back to int32:
  checked exact against numpy in int64 on odd shapes (within the exact bound 2^24, and beyond it on a reduction
  that stays exact), and left in int32 where the sums could overflow it; where the target multiplies int16 pairs
  exactly (`full_range_int8` "int16" or "dot4"), plain convolutions and dense products run on int16 operands
  instead (the packed int8 convolution with an int16 weight), exact with and without layout planning;
- FuseOps computes the scalar scale and zero point once, outside the per-element quantize kernel;
- DynamicQuantizeLinear reads its input once for both ends of the range (`min_max`, a fixed kernel), checked
  against numpy on odd sizes (below one accumulator row, with and without a tail, every value negative);
- PlanLayouts reads the blocked output of a convolution directly in the `min_max` of DynamicQuantizeLinear;
- the whole chain DynamicQuantizeLinear -> ConvInteger matches onnx's reference evaluator.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from relay_tune import build
from relay_tune.errors import RelayTypeError
from relay_tune.frontend import from_onnx
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Function, IRModule, TensorType, Var
from relay_tune.ir.traversal import post_order
from relay_tune.kernel.recurrent import MIN_MAX_VECTORS
from relay_tune.op.reduce import MIN_MAX
from relay_tune.passes.base import call_op
from relay_tune.passes.pipeline import optimize
from relay_tune.target import Target
from relay_tune.type_infer import infer_types

RNG = np.random.default_rng(20261208)


def _model(nodes: list[onnx.NodeProto], x_shape: list[int], out_type: int,
           initializers: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", out_type, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _conv_integer_model(x_shape: list[int], w: np.ndarray, w_zero: np.ndarray, pads: list[int], stride: int,
                        group: int = 1) -> onnx.ModelProto:
    """DynamicQuantizeLinear(x) -> ConvInteger with a constant uint8 weight and its zero point: int32 out."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
             helper.make_node("ConvInteger", ["q", "w", "qz", "wz"], ["y"], pads=pads, strides=[stride, stride],
                              group=group)]
    return _model(nodes, x_shape, TensorProto.INT32, {"w": w, "wz": w_zero})


def _matmul_integer_model(x_shape: list[int], w: np.ndarray, w_zero: np.ndarray) -> onnx.ModelProto:
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
             helper.make_node("MatMulInteger", ["q", "w", "qz", "wz"], ["y"])]
    return _model(nodes, x_shape, TensorProto.INT32, {"w": w, "wz": w_zero})


def _calls(mod: object, name: str) -> list[Call]:
    """Every call of operator `name` in the fused module's primitive functions."""
    found: list[Call] = []
    for node in post_order(mod["main"].body):  # type: ignore[index]
        if isinstance(node, Function):
            found += [c for c in post_order(node.body) if isinstance(c, Call) and c.op_name == name]
    return found


def _products(mod: object) -> list[Call]:
    return [c for name in ("nn.conv2d", "nn.contrib_conv2d_NCHWc", "nn.dense") for c in _calls(mod, name)]


@pytest.mark.parametrize(("x_shape", "cout", "k", "pads", "stride", "group"), [
    ([1, 5, 9, 7], 7, 3, [1, 1, 1, 1], 1, 1),
    ([2, 8, 11, 13], 16, 3, [1, 0, 2, 1], 2, 1),
    ([1, 16, 6, 5], 24, 1, [0, 0, 0, 0], 1, 1),
    ([1, 6, 7, 9], 9, 3, [1, 1, 1, 1], 1, 3),
])
def test_conv_integer_with_uint8_weights_runs_float_products_exactly(x_shape: list[int], cout: int, k: int,
                                                                    pads: list[int], stride: int,
                                                                    group: int) -> None:
    """w - zw spans [-178, 136] (zero point 178): no int8 weight, so the product is a float32 one, equal to the
    int32 reference: the sums' bound K * 255 * 178 stays below 2^24 here."""
    w = RNG.integers(0, 256, (cout, x_shape[1] // group, k, k)).astype(np.uint8)
    w.flat[0], w.flat[1] = 0, 255  # the weight's whole range
    model = _conv_integer_model(x_shape, w, np.array(178, np.uint8), pads, stride, group)
    mod, _ = from_onnx(model)
    products = _products(optimize(mod, opt_level=3, layout_block=8))
    assert products and all(str(p.checked_type.dtype) == "float32" for p in products)
    compiled = build(mod, "llvm")
    for _ in range(2):
        x = RNG.uniform(-3.0, 5.0, x_shape).astype(np.float32)
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        got = compiled.run(x=x)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(evaluate(mod, {"x": x}), want)


CONV_CASES = [
    ([1, 5, 9, 7], 7, 3, [1, 1, 1, 1], 1, 1),
    ([2, 8, 11, 13], 16, 3, [1, 0, 2, 1], 2, 1),
    ([1, 16, 6, 5], 24, 1, [0, 0, 0, 0], 1, 1),
]


@pytest.mark.parametrize(("x_shape", "cout", "k", "pads", "stride", "group"), CONV_CASES)
@pytest.mark.parametrize("layout_planning", [True, False])
def test_conv_integer_with_uint8_weights_runs_int16_products_exactly(x_shape: list[int], cout: int, k: int,
                                                                    pads: list[int], stride: int, group: int,
                                                                    layout_planning: bool) -> None:
    """Where the target multiplies int16 pairs (`full_range_int8="int16"`, x86 without VNNI), the same
    convolutions run on int16 operands, `q - zq` and `w - zw`, padded with zeros: the packed int8 convolution with
    an int16 weight (vpmaddwd) when layouts are planned, the plain int16 convolution otherwise; both exact."""
    w = RNG.integers(0, 256, (cout, x_shape[1] // group, k, k)).astype(np.uint8)
    w.flat[0], w.flat[1] = 0, 255
    model = _conv_integer_model(x_shape, w, np.array(178, np.uint8), pads, stride, group)
    mod, _ = from_onnx(model)
    fused = optimize(mod, opt_level=3, layout_block=8 if layout_planning else 0, full_range_int8="int16")
    if layout_planning:
        convs = _calls(fused, "nn.contrib_conv2d_NCHWc_int8")
        assert len(convs) == 1 and not _products(fused)
        assert convs[0].args[0].checked_type.dtype == "int16" and convs[0].args[1].checked_type.dtype == "int16"
    else:
        products = _products(fused)
        assert len(products) == 1 and products[0].args[0].checked_type.dtype == "int16"
    compiled = build(mod, "llvm", full_range_int8="int16", layout_planning=layout_planning)
    for _ in range(2):
        x = RNG.uniform(-3.0, 5.0, x_shape).astype(np.float32)
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        np.testing.assert_array_equal(compiled.run(x=x), want)


@pytest.mark.parametrize(("mode", "int16"), [("dot4", True), ("float", False)])
def test_int16_products_follow_the_targets_full_range_mode(mode: str, int16: bool) -> None:
    """A VNNI target ("dot4", x86: vpmaddwd too) takes the int16 products; a target without an exact fast path
    ("float") keeps the float32 ones."""
    w = RNG.integers(0, 256, (12, 5, 3, 3)).astype(np.uint8)
    model = _conv_integer_model([1, 5, 9, 7], w, np.array(120, np.uint8), [1, 1, 1, 1], 1)
    mod, _ = from_onnx(model)
    fused = optimize(mod, opt_level=3, layout_block=8, full_range_int8=mode)
    assert bool(_calls(fused, "nn.contrib_conv2d_NCHWc_int8")) == int16
    x = RNG.uniform(-2.0, 3.0, (1, 5, 9, 7)).astype(np.float32)
    got = build(mod, "llvm", full_range_int8=mode).run(x=x)
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_grouped_conv_integer_stays_a_float_product_with_int16_pairs() -> None:
    """The packed convolution has no groups: a grouped ConvInteger keeps the float32 product, still exact."""
    w = RNG.integers(0, 256, (9, 2, 3, 3)).astype(np.uint8)
    model = _conv_integer_model([1, 6, 7, 9], w, np.array(140, np.uint8), [1, 1, 1, 1], 1, 3)
    mod, _ = from_onnx(model)
    products = _products(optimize(mod, opt_level=3, layout_block=8, full_range_int8="int16"))
    assert products and all(str(p.checked_type.dtype) == "float32" for p in products)
    x = RNG.uniform(-1.0, 2.0, (1, 6, 7, 9)).astype(np.float32)
    got = build(mod, "llvm", full_range_int8="int16").run(x=x)
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize(("rows", "k", "n"), [(3, 37, 11), (32, 129, 70), (5, 1025, 9)])
def test_matmul_integer_with_uint8_weights_runs_float_products_exactly(rows: int, k: int, n: int) -> None:
    """MatMulInteger (a dense product after import) on uint8 weights with per-column zero points; the last shape's
    bound (1025 * 255 * 255) passes 2^24 while its sums, of mixed signs, stay exact."""
    w = RNG.integers(0, 256, (k, n)).astype(np.uint8)
    w_zero = RNG.integers(100, 140, (n,)).astype(np.uint8)
    model = _matmul_integer_model([rows, k], w, w_zero)
    mod, _ = from_onnx(model)
    products = _products(optimize(mod, opt_level=3, layout_block=8))
    assert products and all(str(p.checked_type.dtype) == "float32" for p in products)
    compiled = build(mod, "llvm")
    x = RNG.uniform(-2.0, 1.0, (rows, k)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(compiled.run(x=x), want)


@pytest.mark.parametrize(("rows", "k", "n"), [(1, 37, 11), (3, 37, 11), (32, 129, 70), (5, 1025, 9)])
@pytest.mark.parametrize("layout_planning", [True, False])
def test_matmul_integer_with_uint8_weights_runs_int16_products_exactly(rows: int, k: int, n: int,
                                                                      layout_planning: bool) -> None:
    """With int16 pairs, MatMulInteger's dense product runs on int16 operands: planned, the packed convolution
    of one map whose pixels are the rows (a single row: a 1x1 map); unplanned, the int16 dense. Exact."""
    w = RNG.integers(0, 256, (k, n)).astype(np.uint8)
    w_zero = RNG.integers(100, 140, (n,)).astype(np.uint8)
    model = _matmul_integer_model([rows, k], w, w_zero)
    mod, _ = from_onnx(model)
    fused = optimize(mod, opt_level=3, layout_block=8 if layout_planning else 0, full_range_int8="int16")
    if layout_planning:
        convs = _calls(fused, "nn.contrib_conv2d_NCHWc_int8")
        assert len(convs) == 1 and not _products(fused)
        assert convs[0].args[0].checked_type.shape[3] == (rows if rows > 1 else 1)
    else:
        products = _products(fused)
        assert len(products) == 1 and products[0].args[0].checked_type.dtype == "int16"
    compiled = build(mod, "llvm", full_range_int8="int16", layout_planning=layout_planning)
    x = RNG.uniform(-2.0, 1.0, (rows, k)).astype(np.float32)
    np.testing.assert_array_equal(compiled.run(x=x), ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_products_that_could_overflow_int32_stay_integer() -> None:
    """K * 255 * max|w| >= 2^31: the int32 sums may wrap (as onnxruntime's do), so the product stays int32."""
    k, n = 40, 3
    w = np.full((k, n), 30000, np.int32)  # int32 weights: MatMulInteger takes them as widened operands
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
             helper.make_node("Cast", ["q"], ["q32"], to=TensorProto.INT32),
             helper.make_node("Cast", ["qz"], ["qz32"], to=TensorProto.INT32),
             helper.make_node("Sub", ["q32", "qz32"], ["d"]),
             helper.make_node("MatMul", ["d", "w"], ["y"])]
    model = _model(nodes, [2, k], TensorProto.INT32, {"w": w * 9})
    mod, _ = from_onnx(model)
    products = _products(optimize(mod, opt_level=3, layout_block=8))
    assert products and all(str(p.checked_type.dtype) == "int32" for p in products)
    x = RNG.uniform(-1.0, 1.0, (2, k)).astype(np.float32)
    np.testing.assert_array_equal(build(mod, "llvm").run(x=x), ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_dynamic_quantize_computes_its_zero_point_once() -> None:
    """The scale and zero point are scalar kernels of their own: the per-element kernel divides by the scale and adds
    the zero point, and no longer derives the zero point (negative, clip) per element."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])]
    model = _model(nodes, [2, 7, 5, 9], TensorProto.UINT8, {})
    model.graph.output.extend([helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("z", TensorProto.UINT8, None)])
    mod, _ = from_onnx(model)
    fused = optimize(mod, opt_level=3, layout_block=8)
    for node in post_order(fused["main"].body):
        if isinstance(node, Function) and node.body.checked_type.shape:
            ops = {c.op_name for c in post_order(node.body) if isinstance(c, Call)}
            assert not ops & {"negative", "max", "min"}, ops
    compiled = build(mod, "llvm")
    for low, high in ((-3.0, 5.0), (0.5, 2.0), (-4.0, -1.0)):
        x = RNG.uniform(low, high, (2, 7, 5, 9)).astype(np.float32)
        for got, want in zip(compiled.run(x=x), ReferenceEvaluator(model).run(None, {"x": x})):
            np.testing.assert_array_equal(np.asarray(got), want)


def test_range_of_a_blocked_convolution_output_is_read_blocked() -> None:
    """Conv (float, planned NCHW8c) -> DynamicQuantizeLinear: min_max reads the blocked output, no transform."""
    w = RNG.uniform(-0.5, 0.5, (16, 8, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("DynamicQuantizeLinear", ["c"], ["y", "s", "z"])]
    model = _model(nodes, [1, 8, 9, 11], TensorProto.UINT8, {"w": w})
    mod, _ = from_onnx(model)
    fused = optimize(mod, opt_level=3, layout_block=8)
    reductions = _calls(fused, "min_max")
    assert len(reductions) == 1 and reductions[0].args[0].checked_type.ndim == 5
    compiled = build(mod, "llvm")
    x = RNG.uniform(-1.0, 1.0, (1, 8, 9, 11)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    diff = np.abs(compiled.run(x=x).astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1  # the float convolution's rounding may move a value across a rounding tie


_WIDTH = Target.host().vector_lanes("float32") * MIN_MAX_VECTORS  # elements per accumulator row of the kernel


@pytest.mark.parametrize("shape", [(1,), (3,), (_WIDTH - 1,), (_WIDTH,), (_WIDTH + 5,), (3, _WIDTH),
                                   (2, 7, 5, 9), (1, 3, 17, 19, 8)])
@pytest.mark.parametrize("low_high", [(-3.0, 5.0), (-4.0, -1.0), (0.5, 2.0)])
def test_min_max_kernel_matches_numpy(shape: tuple[int, ...], low_high: tuple[float, float]) -> None:
    """The fixed kernel's range equals numpy's min and max: sizes below one accumulator row, whole rows, rows
    with a tail; all-negative and all-positive values (no lane may start from a value not in the tensor)."""
    x = Var("x", TensorType(shape, "float32"))
    mod = infer_types(IRModule({"main": Function((x,), call_op(MIN_MAX, x))}))
    data = RNG.uniform(*low_high, shape).astype(np.float32)
    data.flat[RNG.integers(data.size)] = low_high[0] - 1.0  # one extreme anywhere, the tail included
    got = build(mod, "llvm").run(x=data)
    np.testing.assert_array_equal(got, np.array([data.min(), data.max()], dtype=np.float32))
    np.testing.assert_array_equal(got, evaluate(mod, {"x": data}))


@pytest.mark.parametrize(("ty", "match"), [(TensorType((4, 5), "float16"), "float32"),
                                           (TensorType((0, 5), "float32"), "no elements")])
def test_min_max_rejects_what_it_cannot_range(ty: TensorType, match: str) -> None:
    x = Var("x", ty)
    with pytest.raises(RelayTypeError, match=match):
        infer_types(IRModule({"main": Function((x,), call_op(MIN_MAX, x))}))
