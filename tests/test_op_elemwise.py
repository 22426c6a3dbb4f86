"""Element-wise / broadcast operators: type relations, numpy references, shared shape helpers."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_tune.errors import RelayTypeError
from relay_tune.ir.types import ANY, TensorType, TupleType, Type
from relay_tune.op import elemwise, get_op, reduce
from relay_tune.op._shape import (
    broadcast_shapes,
    format_shape,
    merge_dims,
    normalize_axis,
    prod,
)

FLOATS = ("float16", "float32", "float64")
HYP = settings(max_examples=60, deadline=None)


def relation(name: str, arg_types: list[Type], **attrs: Any) -> Type:
    op = get_op(name)
    return op.type_relation(arg_types, op.make_attrs(attrs))


def run(name: str, inputs: list[Any], **attrs: Any) -> Any:
    op = get_op(name)
    return op.reference(inputs, op.make_attrs(attrs))


def tensor_type(a: np.ndarray) -> TensorType:
    return TensorType(a.shape, a.dtype.name)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -50), min(info.max, 50), size=shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------------------------
# registry coverage
# --------------------------------------------------------------------------------------------

DECLARED = (
    *elemwise.UNARY_OPS, "nn.relu", "nn.leaky_relu", "clip", "cast", *elemwise.ARITH_OPS, *elemwise.COMPARE_OPS,
    *elemwise.BITWISE_OPS,
    "where", *reduce.REDUCE_OPS, "collapse_sum_like", "min_max", "reshape", "transpose", "expand_dims", "squeeze",
    "concatenate", "stack", "split", "strided_slice", "take", "nn.batch_flatten", "nn.pad", "layout_transform",
    "nn.upsampling",
    "broadcast_to",
)


@pytest.mark.parametrize("name", DECLARED)
def test_every_declared_op_has_relation_and_reference(name: str) -> None:
    op = get_op(name)
    assert op.type_relation is not None, name
    assert op.reference is not None, name


def test_declared_list_matches_the_family_modules() -> None:
    from relay_tune.op.registry import all_ops

    family = {"relay_tune.op.elemwise", "relay_tune.op.reduce", "relay_tune.op.transform"}
    # Every op whose relation lives in one of the three family modules is in DECLARED, and vice versa.
    in_modules = {op.name for op in all_ops() if op.type_relation and op.type_relation.__module__ in family}
    assert in_modules == set(DECLARED)


# --------------------------------------------------------------------------------------------
# shape helpers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((), (), ()),
        ((3,), (), (3,)),
        ((2, 1, 4), (3, 1), (2, 3, 4)),
        ((1,), (7, 5), (7, 5)),
        ((ANY, 3), (4, 1), (4, 3)),
        ((ANY,), (ANY,), (ANY,)),
        ((ANY,), (1,), (ANY,)),
        ((1,), (ANY,), (ANY,)),
        ((5,), (ANY,), (5,)),
        ((ANY, 1), (1, ANY), (ANY, ANY)),
    ],
)
def test_broadcast_shapes_table(a: tuple, b: tuple, expected: tuple) -> None:
    assert broadcast_shapes(a, b) == expected
    assert broadcast_shapes(b, a) == expected


def test_broadcast_shapes_error_names_both_shapes() -> None:
    with pytest.raises(RelayTypeError) as info:
        broadcast_shapes((2, 3, 5), (4, 5), op_name="add")
    message = str(info.value)
    assert "(2, 3, 5)" in message and "(4, 5)" in message and "add" in message
    assert "3 vs 4" in message


@st.composite
def broadcastable_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    full = draw(st.lists(st.integers(1, 7), min_size=0, max_size=4))
    a = [d if draw(st.booleans()) else 1 for d in full]
    b = [d if draw(st.booleans()) else 1 for d in full]
    a = a[draw(st.integers(0, len(a))) :]
    b = b[draw(st.integers(0, len(b))) :]
    return tuple(a), tuple(b)


@HYP
@given(broadcastable_pair())
def test_broadcast_shapes_agrees_with_numpy(pair: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a, b = pair
    assert broadcast_shapes(a, b) == np.broadcast_shapes(a, b)


def test_normalize_axis_and_prod() -> None:
    assert normalize_axis(-1, 3) == 2
    assert normalize_axis(0, 1) == 0
    with pytest.raises(RelayTypeError, match="out of range for a tensor of rank 2"):
        normalize_axis(2, 2)
    with pytest.raises(RelayTypeError, match="must be an integer"):
        normalize_axis(1.0, 2)
    assert prod(()) == 1
    assert prod((2, 3, 4)) == 24
    assert prod((2, ANY)) is ANY
    assert merge_dims(ANY, 3) == 3 and merge_dims(3, 4) is None and merge_dims(ANY, ANY) is ANY
    assert format_shape((5,)) == "(5,)" and format_shape((ANY, 2)) == "(?, 2)" and format_shape(()) == "()"


# --------------------------------------------------------------------------------------------
# binary broadcasting operators
# --------------------------------------------------------------------------------------------

BINARY = (*elemwise.ARITH_OPS, *elemwise.COMPARE_OPS)


@HYP
@given(broadcastable_pair(), st.sampled_from(BINARY), st.sampled_from(("float16", "float32", "int32", "int8")))
def test_binary_relation_matches_reference(pair: tuple, name: str, dtype: str) -> None:
    rng = np.random.default_rng(0)
    a = random_array(rng, pair[0], dtype)
    b = random_array(rng, pair[1], dtype)
    if name == "power" and dtype.startswith("int"):
        b = np.abs(b) % 4
    out_type = relation(name, [tensor_type(a), tensor_type(b)])
    out = run(name, [a, b])
    assert isinstance(out, np.ndarray)
    assert out_type == TensorType(out.shape, out.dtype.name)
    assert out.dtype == (np.bool_ if name in elemwise.COMPARE_OPS else np.dtype(dtype))


@pytest.mark.parametrize("name", BINARY)
def test_binary_dtype_mismatch_names_both_dtypes(name: str) -> None:
    with pytest.raises(RelayTypeError) as info:
        relation(name, [TensorType((2, 3), "float32"), TensorType((2, 3), "float16")])
    assert "float32" in str(info.value) and "float16" in str(info.value) and name in str(info.value)


def test_binary_shape_mismatch_and_any() -> None:
    with pytest.raises(RelayTypeError, match=r"\(2, 3\) and \(4, 3\)"):
        relation("multiply", [TensorType((2, 3)), TensorType((4, 3))])
    assert relation("add", [TensorType((ANY, 1, 3)), TensorType((5, 1))]) == TensorType((ANY, 5, 3))
    assert relation("less", [TensorType((ANY, 3), "int64"), TensorType((), "int64")]) == TensorType((ANY, 3), "bool")


def test_binary_rejects_non_tensors() -> None:
    with pytest.raises(RelayTypeError, match="must be a tensor"):
        relation("add", [TupleType((TensorType((1,)),)), TensorType((1,))])
    with pytest.raises(RelayTypeError, match="expects 2 arguments"):
        relation("add", [TensorType((1,))])


@HYP
@given(
    st.lists(st.integers(-10_000, 10_000), min_size=1, max_size=30),
    st.lists(st.integers(-50, 50), min_size=1, max_size=30),
)
def test_integer_divide_truncates_toward_zero(nums: list[int], dens: list[int]) -> None:
    n = min(len(nums), len(dens))
    a = np.array(nums[:n], dtype=np.int32)
    b = np.array(dens[:n], dtype=np.int32)
    got = run("divide", [a, b])
    expected = [0 if d == 0 else math.trunc(Fraction(x, d)) for x, d in zip(nums[:n], dens[:n])]
    assert got.dtype == np.int32
    assert got.tolist() == expected


def test_integer_power_with_negative_exponents() -> None:
    base = np.array([2, -1, -1, 1, 0, 3, -2], dtype=np.int64)
    expo = np.array([-1, -1, -2, -5, -1, 2, 3], dtype=np.int64)
    assert run("power", [base, expo]).tolist() == [0, -1, 1, 1, 0, 9, -8]


def test_float16_arithmetic_stays_float16() -> None:
    a = np.array([1.0, 2.5, 65000.0], dtype=np.float16)
    b = np.array([3.0, 0.5, 1000.0], dtype=np.float16)
    out = run("add", [a, b])
    assert out.dtype == np.float16
    assert out[0] == 4.0 and out[1] == 3.0 and np.isinf(out[2])  # overflow to inf, as float16 does
    assert run("divide", [a, b]).dtype == np.float16


def test_comparisons_values() -> None:
    a = np.array([1, 2, 3], dtype=np.int32)
    b = np.array([2, 2, 2], dtype=np.int32)
    assert run("less", [a, b]).tolist() == [True, False, False]
    assert run("less_equal", [a, b]).tolist() == [True, True, False]
    assert run("greater", [a, b]).tolist() == [False, False, True]
    assert run("greater_equal", [a, b]).tolist() == [False, True, True]
    assert run("equal", [a, b]).tolist() == [False, True, False]
    assert run("not_equal", [a, b]).tolist() == [True, False, True]
    assert run("maximum", [a, b]).tolist() == [2, 2, 3]
    assert run("minimum", [a, b]).tolist() == [1, 2, 2]


# --------------------------------------------------------------------------------------------
# where
# --------------------------------------------------------------------------------------------


@st.composite
def three_broadcastable(draw: st.DrawFn) -> tuple[tuple[int, ...], ...]:
    full = draw(st.lists(st.integers(1, 5), min_size=0, max_size=4))
    shapes = []
    for _ in range(3):
        s = [d if draw(st.booleans()) else 1 for d in full]
        shapes.append(tuple(s[draw(st.integers(0, len(s))) :]))
    return tuple(shapes)


@HYP
@given(three_broadcastable(), st.sampled_from(("bool", "int32")))
def test_where_three_way_broadcast(shapes: tuple, cond_dtype: str) -> None:
    rng = np.random.default_rng(1)
    cond = random_array(rng, shapes[0], cond_dtype)
    x = random_array(rng, shapes[1], "float32")
    y = random_array(rng, shapes[2], "float32")
    out_type = relation("where", [tensor_type(cond), tensor_type(x), tensor_type(y)])
    out = run("where", [cond, x, y])
    assert out_type == TensorType(out.shape, "float32") == TensorType(np.broadcast_shapes(*shapes), "float32")
    # Independent check, element by element.
    cb, xb, yb = np.broadcast_arrays(cond, x, y)
    for idx in np.ndindex(out.shape):
        assert out[idx] == (xb[idx] if cb[idx] != 0 else yb[idx])


def test_where_errors() -> None:
    with pytest.raises(RelayTypeError, match="float32 vs int32"):
        relation("where", [TensorType((2,), "bool"), TensorType((2,)), TensorType((2,), "int32")])
    with pytest.raises(RelayTypeError, match=r"\(3,\) and \(2,\)"):
        relation("where", [TensorType((3,), "bool"), TensorType((2,)), TensorType((2,))])


# --------------------------------------------------------------------------------------------
# unary operators
# --------------------------------------------------------------------------------------------

UNARY_SAMPLE = np.array([-3.5, -2.5, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.5, 2.5, 4.0], dtype=np.float64)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", (*elemwise.UNARY_OPS, "nn.relu"))
def test_unary_type_and_dtype_preserved(name: str, dtype: str) -> None:
    x = np.abs(UNARY_SAMPLE).astype(dtype) + 0.5 if name in ("log", "sqrt", "rsqrt") else UNARY_SAMPLE.astype(dtype)
    if name in ("asin", "acos"):  # defined on [-1, 1]
        x = np.clip(x, -1, 1)
    x = x.reshape(1, 11)
    t = tensor_type(x)
    assert relation(name, [t]) == t
    out = run(name, [x])
    assert out.dtype == np.dtype(dtype) and out.shape == x.shape
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("name", sorted(elemwise.FLOAT_ONLY_OPS))
def test_transcendental_ops_reject_integers(name: str) -> None:
    with pytest.raises(RelayTypeError, match="floating-point"):
        relation(name, [TensorType((3,), "int32")])


def test_unary_values_against_independent_formulas() -> None:
    x = UNARY_SAMPLE
    assert np.allclose(run("erf", [x]), [math.erf(v) for v in x], rtol=0, atol=1e-15)
    assert np.allclose(run("sigmoid", [x]), 0.5 * (1.0 + np.tanh(x / 2.0)), rtol=1e-14)
    assert np.allclose(run("rsqrt", [x + 4.0]), (x + 4.0) ** -0.5, rtol=1e-14)
    assert run("nn.relu", [x]).tolist() == [max(v, 0.0) for v in x]
    assert run("negative", [x]).tolist() == [-v for v in x]
    assert run("abs", [x]).tolist() == [abs(v) for v in x]
    # round: ties to even (nearbyint), unlike C's round().
    assert run("round", [x]).tolist() == [-4.0, -2.0, -1.0, -0.0, -0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 4.0]
    assert run("floor", [x]).tolist() == [math.floor(v) for v in x]
    assert run("ceil", [x]).tolist() == [math.ceil(v) for v in x]
    assert run("zeros_like", [x]).tolist() == [0.0] * 11 and run("ones_like", [x]).tolist() == [1.0] * 11
    big = np.array([-1000.0, 1000.0], dtype=np.float32)
    assert run("sigmoid", [big]).tolist() == [0.0, 1.0]


def test_erf_float16_is_correctly_rounded() -> None:
    x = np.linspace(-3, 3, 241).astype(np.float16)
    expected = np.array([math.erf(float(v)) for v in x]).astype(np.float16)
    assert np.array_equal(run("erf", [x]), expected)


def test_integer_unary_ops_keep_integers() -> None:
    x = np.array([-3, 0, 7], dtype=np.int32)
    for name in ("floor", "ceil", "round", "copy", "nn.relu", "negative", "abs"):
        assert run(name, [x]).dtype == np.int32, name
    assert run("nn.relu", [x]).tolist() == [0, 0, 7]
    assert run("round", [x]).tolist() == [-3, 0, 7]


def test_leaky_relu() -> None:
    x = np.array([-2.0, -0.5, 0.0, 3.0], dtype=np.float16)
    assert relation("nn.leaky_relu", [tensor_type(x)], alpha=0.1) == tensor_type(x)
    out = run("nn.leaky_relu", [x], alpha=0.1)
    assert out.dtype == np.float16
    assert out.tolist() == pytest.approx([-0.2, -0.05, 0.0, 3.0], rel=1e-3)
    assert run("nn.leaky_relu", [x]).tolist() == pytest.approx([-0.5, -0.125, 0.0, 3.0])  # default alpha 0.25


def test_clip() -> None:
    x = np.array([-5.0, -1.0, 0.5, 2.0, 9.0], dtype=np.float32)
    assert relation("clip", [tensor_type(x)], a_min=-1.0, a_max=2.0) == tensor_type(x)
    assert run("clip", [x], a_min=-1.0, a_max=2.0).tolist() == [-1.0, -1.0, 0.5, 2.0, 2.0]
    ints = np.array([-5, -1, 0, 2, 9, 127], dtype=np.int8)
    # Bounds convert to the tensor dtype like a C cast: -0.5 -> 0, 2.9 -> 2, 1e9 saturates.
    assert run("clip", [ints], a_min=-0.5, a_max=2.9).tolist() == [0, 0, 0, 2, 2, 2]
    assert run("clip", [ints], a_min=-1e9, a_max=1e9).tolist() == ints.tolist()
    with pytest.raises(RelayTypeError, match="missing required"):
        get_op("clip").make_attrs({"a_min": 0.0})


def test_cast() -> None:
    x = np.array([-1.7, 0.2, 2.9], dtype=np.float32)
    assert relation("cast", [TensorType((ANY, 3))], dtype="float16") == TensorType((ANY, 3), "float16")
    assert run("cast", [x], dtype="int32").tolist() == [-1, 0, 2]
    assert run("cast", [x], dtype="bool").tolist() == [True, True, True]
    assert run("cast", [x], dtype="float16").dtype == np.float16
    with pytest.raises(RelayTypeError, match="unknown dtype 'float13'"):
        relation("cast", [TensorType((3,))], dtype="float13")
    with pytest.raises(RelayTypeError, match="unknown dtype 'float13'"):
        run("cast", [x], dtype="float13")


def test_any_dims_propagate_through_unary() -> None:
    t = TensorType((ANY, 3), "int64")
    assert relation("copy", [t]) == t
    assert relation("zeros_like", [t]) == t
