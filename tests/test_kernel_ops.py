"""Every registered operator, compiled on its own, agrees with its numpy reference.

Each case goes through the whole path a model takes: a relay call wrapped in a primitive function ->
tensor expressions (the operator's `@compute`) -> default schedule -> loop nest -> LLVM -> run, and is
compared with the interpreter (the operators' numpy references). Shapes, strides, paddings, groups and
broadcasting are drawn by hypothesis, with odd sizes so that vector tails and partial tiles occur.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_tune.compile.primitive import build_primitive
from relay_tune.errors import UnsupportedError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, Tuple, TupleGetItem, Var, const, op
from relay_tune.kernel.compute import FAMILY_TAGS, INLINABLE_TAGS, primitive_compute
from relay_tune.kernel.recurrent import FIXED_KERNELS
from relay_tune.op.registry import all_ops, get_op
from relay_tune.type_infer import infer_types

FLOAT = "float32"


@dataclass
class Case:
    """One operator call: argument types (a list means a tuple argument), attrs, and how to fill inputs."""

    op_name: str
    args: list[TensorType | list[TensorType] | Constant]
    attrs: dict[str, Any] = field(default_factory=dict)
    fill: str = "normal"  # normal | positive | nonzero | small_int | index (integers in [0, 3))
    project: int | None = None  # for tuple results: compare field `project` only (else every field)
    rtol: float = 1e-4
    atol: float = 1e-4


def tt(*shape: int, dtype: str = FLOAT) -> TensorType:
    return TensorType(tuple(shape), dtype)


def fill_array(shape: tuple[int, ...], dtype: str, how: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith(("int", "uint")):
        if how == "index":
            return rng.integers(0, 3, shape).astype(dtype)
        low = 1 if how in ("positive", "nonzero") else -6
        values = rng.integers(low, 7, shape)
        if how == "nonzero":
            values = np.where(rng.random(shape) > 0.5, values, -values)
        return values.astype(dtype)
    x = rng.standard_normal(shape)
    if how == "positive":
        x = np.abs(x) + 0.1
    elif how == "nonzero":
        x = np.sign(x) * (np.abs(x) + 0.5)
    elif how == "small_int":
        x = np.round(x * 3)
    elif how == "unit":  # inside (-1, 1), the domain of asin and acos
        x = np.tanh(x)
    return x.astype(dtype)


def run_case(case: Case, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    params: list[Var] = []
    call_args: list[Expr] = []
    for arg in case.args:
        if isinstance(arg, Constant):
            call_args.append(arg)
        elif isinstance(arg, list):
            fields = [Var(f"p{len(params) + i}", t) for i, t in enumerate(arg)]
            params.extend(fields)
            call_args.append(Tuple(tuple(fields)))
        else:
            params.append(Var(f"p{len(params)}", arg))
            call_args.append(params[-1])
    body: Expr = Call(op(case.op_name), tuple(call_args), get_op(case.op_name).make_attrs(case.attrs))
    if case.project is not None:
        body = TupleGetItem(body, case.project)
    mod = infer_types(IRModule({"main": Function(tuple(params), body)}))
    func = mod["main"].with_attrs(Primitive=1)
    inputs = [fill_array(tuple(p.type_annotation.shape), p.type_annotation.dtype, case.fill, rng)  # type: ignore[union-attr,arg-type]
              for p in params]
    expected = evaluate(mod, inputs)
    for stage_call in primitive_compute(func).calls:  # every stage says what it is (the schedules read tags)
        assert all(t.op.tag in INLINABLE_TAGS | FAMILY_TAGS for t in stage_call.tensors), stage_call.op_name
    got = build_primitive(func)(*inputs)
    pairs = zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,))
    for g, e in pairs:
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, g.dtype, e.shape, e.dtype)
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g.astype("float64"), e.astype("float64"), rtol=case.rtol, atol=case.atol)


CASE_SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

dims = st.integers(1, 9)
shapes = st.lists(dims, min_size=1, max_size=4).map(tuple)


@st.composite
def broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast: the second drops leading dims and sets some dims to 1."""
    a = draw(shapes)
    keep = draw(st.integers(0, len(a)))
    b = tuple(1 if draw(st.booleans()) else d for d in a[len(a) - keep:])
    return (a, b) if draw(st.booleans()) else (b, a)


# ------------------------------------------------------------------------------------------------
# element-wise and broadcast
# ------------------------------------------------------------------------------------------------

UNARY_FILL = {"log": "positive", "sqrt": "positive", "rsqrt": "positive", "asin": "unit", "acos": "unit"}
UNARY = ["negative", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs", "copy", "zeros_like",
         "ones_like", "floor", "ceil", "round", "nn.relu", "sin", "cos", "tan", "asin", "acos", "atan"]


@pytest.mark.parametrize("name", UNARY)
@CASE_SETTINGS
@given(shape=shapes)
def test_unary(name: str, shape: tuple[int, ...]) -> None:
    run_case(Case(name, [tt(*shape)], fill=UNARY_FILL.get(name, "normal"), rtol=2e-5 if name != "erf" else 1e-4,
                  atol=1e-5))


@pytest.mark.parametrize("name", ["negative", "abs", "copy", "zeros_like", "ones_like", "floor", "round", "nn.relu"])
def test_unary_on_integers(name: str) -> None:
    run_case(Case(name, [tt(5, 17, dtype="int32")]))


@CASE_SETTINGS
@given(shape=shapes, alpha=st.floats(0.01, 0.5), bounds=st.tuples(st.floats(-2, 0), st.floats(0, 2)))
def test_leaky_relu_and_clip(shape: tuple[int, ...], alpha: float, bounds: tuple[float, float]) -> None:
    run_case(Case("nn.leaky_relu", [tt(*shape)], {"alpha": alpha}))
    run_case(Case("clip", [tt(*shape)], {"a_min": bounds[0], "a_max": bounds[1]}))


@pytest.mark.parametrize(("src", "dst"), [("float32", "int32"), ("int32", "float32"), ("float32", "float16"),
                                          ("float32", "bool"), ("int32", "int8"), ("bool", "float32")])
def test_cast(src: str, dst: str) -> None:
    run_case(Case("cast", [tt(3, 37, dtype=src)], {"dtype": dst}, fill="small_int"))


@pytest.mark.parametrize(("src", "dst"), [("float32", "int32"), ("int16", "float16"), ("uint8", "int8")])
def test_reinterpret(src: str, dst: str) -> None:
    run_case(Case("reinterpret", [tt(3, 37, dtype=src)], {"dtype": dst}))


BINARY = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "less", "less_equal", "greater",
          "greater_equal", "equal", "not_equal"]


@pytest.mark.parametrize("name", BINARY)
@CASE_SETTINGS
@given(pair=broadcast_pair())
def test_binary_broadcast(name: str, pair: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    fill = {"divide": "nonzero", "power": "positive"}.get(name, "small_int" if name in BINARY[7:] else "normal")
    run_case(Case(name, [tt(*pair[0]), tt(*pair[1])], fill=fill, rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "maximum", "less", "power"])
def test_binary_on_integers(name: str) -> None:
    run_case(Case(name, [tt(4, 1, 19, dtype="int32"), tt(7, 1, dtype="int32")],
                  fill="positive" if name == "power" else "nonzero"))


@CASE_SETTINGS
@given(shape=shapes, data=st.data())
def test_where(shape: tuple[int, ...], data: st.DataObject) -> None:
    cond_shape = tuple(1 if data.draw(st.booleans()) else d for d in shape)
    run_case(Case("where", [tt(*cond_shape, dtype="bool"), tt(*shape), tt(*shape[1:] or (1,))]))
    run_case(Case("where", [tt(*cond_shape), tt(*shape), tt(*shape)], fill="small_int"))


# ------------------------------------------------------------------------------------------------
# reductions
# ------------------------------------------------------------------------------------------------


@st.composite
def reduce_case(draw: st.DrawFn) -> tuple[tuple[int, ...], Any, bool, bool]:
    shape = draw(st.lists(dims, min_size=1, max_size=4).map(tuple))
    axis = draw(st.one_of(st.none(), st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=2,
                                              unique_by=lambda a: a % len(shape)).map(tuple)))
    return shape, axis, draw(st.booleans()), draw(st.booleans())


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod"])
@CASE_SETTINGS
@given(case=reduce_case())
def test_reductions(name: str, case: tuple[tuple[int, ...], Any, bool, bool]) -> None:
    shape, axis, keepdims, exclude = case
    fill = "positive" if name == "prod" else "normal"
    run_case(Case(name, [tt(*shape)], {"axis": axis, "keepdims": keepdims, "exclude": exclude}, fill=fill,
                  rtol=1e-4 if name != "prod" else 1e-3))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "prod"])
def test_integer_reductions(name: str) -> None:
    run_case(Case(name, [tt(3, 7, 5, dtype="int32")], {"axis": (1,)}))


def test_float16_sum_accumulates_in_float32() -> None:
    run_case(Case("sum", [tt(2, 300, dtype="float16")], {"axis": (1,)}, rtol=2e-3, atol=1e-2))


def test_collapse_sum_like() -> None:
    run_case(Case("collapse_sum_like", [tt(3, 4, 5), tt(4, 1)]))
    run_case(Case("collapse_sum_like", [tt(3, 4, 5), tt(4, 5)]))


@pytest.mark.parametrize("name", ["nn.softmax", "nn.log_softmax"])
@CASE_SETTINGS
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple), data=st.data())
def test_softmax(name: str, shape: tuple[int, ...], data: st.DataObject) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    run_case(Case(name, [tt(*shape)], {"axis": axis}, rtol=1e-5, atol=1e-6))


# ------------------------------------------------------------------------------------------------
# matrix products
# ------------------------------------------------------------------------------------------------


@CASE_SETTINGS
@given(m=st.integers(1, 40), n=st.integers(1, 70), k=st.integers(1, 40), lead=st.booleans())
def test_dense(m: int, n: int, k: int, lead: bool) -> None:
    data = tt(2, m, k) if lead else tt(m, k)
    run_case(Case("nn.dense", [data, tt(n, k)]))


@CASE_SETTINGS
@given(b=st.integers(1, 3), m=st.integers(1, 20), n=st.integers(1, 40), k=st.integers(1, 20),
       ta=st.booleans(), tb=st.booleans(), broadcast=st.sampled_from(["none", "x", "y"]))
def test_batch_matmul(b: int, m: int, n: int, k: int, ta: bool, tb: bool, broadcast: str) -> None:
    bx, by = (1 if broadcast == "x" else b), (1 if broadcast == "y" else b)
    x = tt(bx, k, m) if ta else tt(bx, m, k)
    y = tt(by, n, k) if tb else tt(by, k, n)
    run_case(Case("nn.batch_matmul", [x, y], {"transpose_a": ta, "transpose_b": tb}))


def test_dense_with_integer_inputs_and_wider_output() -> None:
    run_case(Case("nn.dense", [tt(5, 9, dtype="int8"), tt(7, 9, dtype="int8")], {"out_dtype": "int32"}))


# ------------------------------------------------------------------------------------------------
# convolutions
# ------------------------------------------------------------------------------------------------


@st.composite
def conv2d_case(draw: st.DrawFn) -> tuple[TensorType, TensorType, dict[str, Any]]:
    groups = draw(st.sampled_from([1, 1, 2, 3, "depthwise"]))
    cin_per = draw(st.integers(1, 4))
    if groups == "depthwise":
        cin = draw(st.integers(1, 6))
        groups_n, cout = cin, cin * draw(st.sampled_from([1, 1, 2]))
        cin_per = 1
    else:
        groups_n = int(groups)
        cin = cin_per * groups_n
        cout = groups_n * draw(st.integers(1, 5))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), 1)
    padding = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers((kh - 1) * dilation[0] + 1, 12))
    w = draw(st.integers(kw, 20))
    layout = draw(st.sampled_from(["NCHW", "NCHW", "NHWC"]))
    attrs: dict[str, Any] = {"strides": strides, "dilation": dilation, "padding": padding, "groups": groups_n}
    batch = draw(st.integers(1, 2))
    if layout == "NCHW":
        data, weight = tt(batch, cin, h, w), tt(cout, cin_per, kh, kw)
    else:
        data, weight = tt(batch, h, w, cin), tt(kh, kw, cin_per, cout)
        attrs.update(data_layout="NHWC", kernel_layout="HWIO")
    return data, weight, attrs


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv2d_case())
def test_conv2d(case: tuple[TensorType, TensorType, dict[str, Any]]) -> None:
    data, weight, attrs = case
    run_case(Case("nn.conv2d", [data, weight], attrs))


@pytest.mark.parametrize(("data", "weight", "attrs"), [
    (tt(1, 16, 9, 9), tt(32, 16, 3, 3), {"padding": (1, 1)}),  # several channel blocks, 2-vector tiles
    (tt(1, 8, 7, 35), tt(10, 8, 1, 1), {}),  # width 35: vector chunks 16+16+2+1
    (tt(1, 3, 23, 23), tt(8, 3, 7, 7), {"strides": (2, 2), "padding": (3, 3)}),
    (tt(1, 24, 10, 10), tt(24, 1, 3, 3), {"groups": 24, "padding": (1, 1)}),
    (tt(1, 24, 11, 11), tt(24, 1, 3, 3), {"groups": 24, "padding": (1, 1), "strides": (2, 2)}),
    (tt(2, 9, 9, 5), tt(3, 3, 5, 40), {"data_layout": "NHWC", "kernel_layout": "HWIO", "padding": (1, 1)}),
    (tt(1, 9, 9, 5), tt(40, 3, 3, 5), {"data_layout": "NHWC", "kernel_layout": "OHWI", "padding": (1, 1)}),
    (tt(1, 5, 6, 7), tt(4, 5, 3, 3), {"out_dtype": "float32", "padding": (0, 1, 2, 0)}),
    (tt(1, 1, 28, 28), tt(8, 1, 5, 5), {"padding": (2, 2)}),  # one input channel (MNIST's first layer)
    (tt(1, 1, 12, 12), tt(1, 1, 3, 3), {}),  # one channel in and out
])
def test_conv2d_default_schedule_shapes(data: TensorType, weight: TensorType, attrs: dict[str, Any]) -> None:
    run_case(Case("nn.conv2d", [data, weight], attrs))


def test_conv2d_nchwc_layout() -> None:
    run_case(Case("nn.contrib_conv2d_NCHWc", [tt(1, 2, 5, 6, 4), tt(3, 2, 3, 3, 4, 4)],
                  {"data_layout": "NCHW4c", "kernel_layout": "OIHW4i4o", "padding": (1, 1)}))


@CASE_SETTINGS
@given(c=st.integers(1, 4), o=st.integers(1, 4), w=st.integers(3, 20), k=st.integers(1, 3), s=st.integers(1, 3),
       pad=st.tuples(st.integers(0, 2), st.integers(0, 2)), d=st.integers(1, 2))
def test_conv1d(c: int, o: int, w: int, k: int, s: int, pad: tuple[int, int], d: int) -> None:
    run_case(Case("nn.conv1d", [tt(1, c, w + (k - 1) * d), tt(o, c, k)],
                  {"strides": (s,), "padding": pad, "dilation": (d,)}))


def test_conv3d() -> None:
    run_case(Case("nn.conv3d", [tt(1, 2, 4, 5, 6), tt(3, 2, 2, 3, 2)], {"padding": (1, 0, 1), "strides": (1, 2, 1)}))


@CASE_SETTINGS
@given(groups=st.sampled_from([1, 2]), s=st.integers(1, 3), pad=st.integers(0, 1), out_pad=st.integers(0, 1),
       d=st.integers(1, 2), h=st.integers(2, 6), w=st.integers(2, 7))
def test_conv2d_transpose(groups: int, s: int, pad: int, out_pad: int, d: int, h: int, w: int) -> None:
    out_pad = min(out_pad, max(s, d) - 1)
    run_case(Case("nn.conv2d_transpose", [tt(1, 2 * groups, h, w), tt(2 * groups, 3, 3, 2)],
                  {"strides": (s, s), "padding": (pad, pad), "output_padding": (out_pad, out_pad),
                   "dilation": (d, d), "groups": groups}))


def test_conv1d_transpose() -> None:
    run_case(Case("nn.conv1d_transpose", [tt(2, 4, 5), tt(4, 3, 3)], {"strides": (2,), "padding": (1,),
                                                                       "output_padding": (1,)}))


# ------------------------------------------------------------------------------------------------
# pooling and normalisation
# ------------------------------------------------------------------------------------------------


@st.composite
def pool_case(draw: st.DrawFn) -> tuple[TensorType, dict[str, Any]]:
    pool = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), 1)
    padding = tuple(draw(st.integers(0, p - 1)) for p in (pool[0], pool[1], pool[0], pool[1]))
    h = draw(st.integers((pool[0] - 1) * dilation[0] + 1, 14))
    w = draw(st.integers(pool[1], 20))
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    shape = (1, 3, h, w) if layout == "NCHW" else (1, h, w, 3)
    return tt(*shape), {"pool_size": pool, "strides": strides, "dilation": dilation, "padding": padding,
                        "layout": layout, "ceil_mode": draw(st.booleans())}


@CASE_SETTINGS
@given(case=pool_case(), include=st.booleans())
def test_pools(case: tuple[TensorType, dict[str, Any]], include: bool) -> None:
    data, attrs = case
    run_case(Case("nn.max_pool2d", [data], attrs))
    run_case(Case("nn.avg_pool2d", [data], {**attrs, "count_include_pad": include}))


def test_integer_avg_pool_truncates() -> None:
    run_case(Case("nn.avg_pool2d", [tt(1, 2, 7, 7, dtype="int32")], {"pool_size": (3, 3), "padding": (1, 1)}))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("name", ["nn.global_avg_pool2d", "nn.global_max_pool2d"])
def test_global_pools(name: str, layout: str) -> None:
    shape = (2, 5, 7, 9) if layout == "NCHW" else (2, 7, 9, 5)
    run_case(Case(name, [tt(*shape)], {"layout": layout}))


def test_bias_add_on_every_axis() -> None:
    for axis in (-1, 0, 1, 2):
        shape = (3, 5, 7)
        run_case(Case("nn.bias_add", [tt(*shape), tt(shape[axis])], {"axis": axis}))


def test_lrn_and_layer_norm() -> None:
    run_case(Case("nn.lrn", [tt(1, 9, 4, 5)], {"size": 5, "alpha": 0.5}))
    run_case(Case("nn.lrn", [tt(2, 6, 7)], {"size": 4, "axis": 2}))
    run_case(Case("nn.layer_norm", [tt(3, 4, 33), tt(33), tt(33)], {}))
    run_case(Case("nn.layer_norm", [tt(3, 4, 6), tt(4), tt(4)], {"axis": 1, "center": False}))


@pytest.mark.parametrize("name", ["nn.batch_norm", "nn.dropout"])
def test_inference_only_ops_ask_for_simplify_inference(name: str) -> None:
    args: list[Any] = [tt(2, 3)] + ([tt(3)] * 4 if name == "nn.batch_norm" else [])
    with pytest.raises(UnsupportedError, match="SimplifyInference"):
        run_case(Case(name, args, project=0))


# ------------------------------------------------------------------------------------------------
# transforms
# ------------------------------------------------------------------------------------------------


@CASE_SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=4).map(tuple), data=st.data())
def test_reshape_transpose_expand_squeeze(shape: tuple[int, ...], data: st.DataObject) -> None:
    run_case(Case("reshape", [tt(*shape)], {"newshape": (-1,)}))
    run_case(Case("reshape", [tt(*shape)], {"newshape": (*shape[:-1], 1, shape[-1])}))
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    run_case(Case("transpose", [tt(*shape)], {"axes": perm}))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    run_case(Case("expand_dims", [tt(*shape)], {"axis": axis, "num_newaxis": data.draw(st.integers(0, 2))}))
    with_ones = tuple(d for s in shape for d in ((s, 1) if data.draw(st.booleans()) else (s,)))
    run_case(Case("squeeze", [tt(*with_ones)], {"axis": None}))
    run_case(Case("nn.batch_flatten", [tt(*with_ones)]))
    run_case(Case("broadcast_to", [tt(*with_ones)], {"shape": (2, *(d if d != 1 else 3 for d in with_ones))}))


@CASE_SETTINGS
@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), count=st.integers(1, 3), data=st.data())
def test_concatenate_stack_split(shape: tuple[int, ...], count: int, data: st.DataObject) -> None:
    axis = data.draw(st.integers(0, len(shape) - 1))
    parts = [tuple(data.draw(dims) if d == axis else s for d, s in enumerate(shape)) for _ in range(count)]
    run_case(Case("concatenate", [[tt(*p) for p in parts]], {"axis": axis}))
    run_case(Case("stack", [[tt(*shape)] * count], {"axis": data.draw(st.integers(-len(shape) - 1, len(shape)))}))
    total = sum(p[axis] for p in parts)
    whole = tuple(total if d == axis else s for d, s in enumerate(shape))
    run_case(Case("split", [tt(*whole)], {"indices_or_sections": count if total % count == 0 else 1, "axis": axis}))
    if total > 1:
        point = data.draw(st.integers(1, total - 1))
        run_case(Case("split", [tt(*whole)], {"indices_or_sections": (point,), "axis": axis},
                      project=data.draw(st.integers(0, 1))))


@CASE_SETTINGS
@given(shape=st.lists(st.integers(1, 12), min_size=1, max_size=3).map(tuple), data=st.data())
def test_strided_slice(shape: tuple[int, ...], data: st.DataObject) -> None:
    begin = tuple(data.draw(st.integers(-s, s - 1)) for s in shape)
    strides = tuple(data.draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in shape)
    end = tuple(data.draw(st.integers(-s - 1, s + 1)) for s in shape)
    attrs = {"begin": begin, "end": end, "strides": strides}
    out_type = infer_types(IRModule({"main": Function((v := Var("x", tt(*shape)),), Call(
        op("strided_slice"), (v,), get_op("strided_slice").make_attrs(attrs)))}))["main"].body.checked_type
    if 0 in out_type.shape:  # type: ignore[attr-defined]
        return  # an empty slice has no kernel (static shapes are positive)
    run_case(Case("strided_slice", [tt(*shape)], attrs))


@pytest.mark.parametrize("mode", ["clip", "wrap", "fast"])
@pytest.mark.parametrize(("axis", "batch_dims"), [(None, 0), (0, 0), (1, 0), (2, 1)])
def test_take(mode: str, axis: int | None, batch_dims: int) -> None:
    data = tt(3, 5, 7)
    indices = tt(3, 4, dtype="int32") if batch_dims else tt(4, 2, dtype="int64")
    case = Case("take", [data, indices], {"axis": axis, "batch_dims": batch_dims, "mode": mode},
                fill="index" if mode == "fast" else "small_int")
    run_case(case)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
@CASE_SETTINGS
@given(shape=st.lists(st.integers(3, 8), min_size=1, max_size=3).map(tuple), data=st.data())
def test_pad(mode: str, shape: tuple[int, ...], data: st.DataObject) -> None:
    widths = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
    run_case(Case("nn.pad", [tt(*shape), const(np.float32(data.draw(st.floats(-2, 2))))],
                  {"pad_width": widths, "pad_mode": mode}))


@pytest.mark.parametrize(("src", "dst", "shape"), [
    ("NCHW", "NHWC", (2, 3, 4, 5)), ("NCHW", "NCHW4c", (1, 8, 3, 5)), ("NCHW8c", "NCHW", (1, 2, 3, 3, 8)),
    ("NCHW4c", "NCHW2c", (1, 2, 3, 3, 4)), ("OIHW", "OIHW4i8o", (16, 8, 3, 3)),
])
def test_layout_transform(src: str, dst: str, shape: tuple[int, ...]) -> None:
    run_case(Case("layout_transform", [tt(*shape)], {"src_layout": src, "dst_layout": dst}))


@pytest.mark.parametrize("method", ["nearest_neighbor", "bilinear"])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize(("layout", "shape", "scales"), [
    ("NCHW", (1, 2, 5, 7), (2.0, 1.5)), ("NHWC", (2, 3, 4, 2), (0.5, 3.0)), ("NCHW", (1, 1, 1, 6), (3.0, 0.75)),
])
def test_upsampling(method: str, align: bool, layout: str, shape: tuple[int, ...], scales: tuple[float, float]) -> None:
    run_case(Case("nn.upsampling", [tt(*shape)], {"scale_h": scales[0], "scale_w": scales[1], "layout": layout,
                                                  "method": method, "align_corners": align}))


@pytest.mark.parametrize(("shape", "m", "padding", "layout"), [
    ((1, 2, 7, 7, 16), 2, 1, "NCHW16c"), ((1, 1, 13, 11, 16), 4, 1, "NCHW16c"), ((1, 1, 9, 9, 8), 4, 0, "NCHW8c"),
    ((2, 5, 13, 9), 4, 0, "NCHW"), ((1, 3, 7, 7), 2, 1, "NCHW"),
])
def test_winograd_input_transform(shape: tuple[int, ...], m: int, padding: int, layout: str) -> None:
    run_case(Case("nn.winograd_input_transform", [tt(*shape)],
                  {"tile_size": m, "padding": (padding,) * 4, "data_layout": layout}))


@pytest.mark.parametrize(("shape", "m", "out", "layout"), [
    ((16, 16, 32), 2, (7, 7), "NCHW16c"), ((36, 12, 32), 4, (13, 11), "NCHW16c"), ((36, 8, 5), 4, (5, 7), "NCHW"),
    ((16, 18, 4), 2, (6, 5), "NCHW"),
])
def test_winograd_output_transform(shape: tuple[int, ...], m: int, out: tuple[int, int], layout: str) -> None:
    run_case(Case("nn.winograd_output_transform", [tt(*shape)],
                  {"tile_size": m, "out_height": out[0], "out_width": out[1], "out_layout": layout}))


# ------------------------------------------------------------------------------------------------
# coverage
# ------------------------------------------------------------------------------------------------

TESTED = {
    *UNARY, *BINARY, "nn.leaky_relu", "clip", "cast", "reinterpret", "where", "sum", "mean", "max", "min", "prod",
    "collapse_sum_like", "nn.softmax", "nn.log_softmax", "nn.dense", "nn.batch_matmul", "nn.conv2d",
    "nn.contrib_conv2d_NCHWc", "nn.conv1d", "nn.conv3d", "nn.conv2d_transpose", "nn.conv1d_transpose",
    "nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d", "nn.bias_add", "nn.lrn",
    "nn.layer_norm", "nn.batch_norm", "nn.dropout", "reshape", "transpose", "expand_dims", "squeeze",
    "nn.batch_flatten", "broadcast_to", "concatenate", "stack", "split", "strided_slice", "take", "nn.pad",
    "layout_transform", "nn.upsampling", "nn.winograd_input_transform", "nn.winograd_output_transform",
    # kernel tests in test_onnx_image_ops.py
    "image.resize1d", "image.resize2d", "image.resize3d", "image.grid_sample", "nn.depth_to_space",
    "nn.space_to_depth", "arange", "one_hot", "trilu", "cumsum",
    # kernel tests in test_onnx_ops_more.py
    "cumprod", "bitwise_and", "bitwise_or", "bitwise_xor", "signal.window", "signal.dft",
    # kernel tests in test_int8_kernels.py, test_lstm_sequence.py, test_dynamic_quantized_products.py, test_bf16.py,
    # test_lstm_sequence_int8.py
    "nn.contrib_conv2d_NCHWc_int8", "nn.lstm_sequence", "min_max", "nn.contrib_conv2d_NCHWc_bf16",
    "nn.lstm_sequence_int8",
}


def test_every_registered_operator_has_a_compute_and_a_test() -> None:
    names = {o.name for o in all_ops()}
    assert names - TESTED == set(), "operators without kernel tests"
    # a hand-written loop kernel stands in for a compute (`relay_tune.kernel.recurrent.FIXED_KERNELS`)
    assert [o.name for o in all_ops() if o.compute is None and o.name not in FIXED_KERNELS] == []
