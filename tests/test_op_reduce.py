"""Reductions and collapse_sum_like: type relations and numpy references."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_tune.errors import RelayTypeError
from relay_tune.ir.types import ANY, TensorType, Type
from relay_tune.op import get_op
from relay_tune.op.reduce import REDUCE_OPS

HYP = settings(max_examples=60, deadline=None)


def relation(name: str, arg_types: list[Type], **attrs: Any) -> Type:
    op = get_op(name)
    return op.type_relation(arg_types, op.make_attrs(attrs))


def run(name: str, inputs: list[Any], **attrs: Any) -> Any:
    op = get_op(name)
    return op.reference(inputs, op.make_attrs(attrs))


@st.composite
def reduction_case(draw: st.DrawFn) -> tuple[tuple[int, ...], Any, bool, bool]:
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    ndim = len(shape)
    kind = draw(st.sampled_from(("none", "int", "list")) if ndim else st.just("none"))
    if kind == "none":
        axis: Any = None
    elif kind == "int":
        axis = draw(st.integers(-ndim, ndim - 1))
    else:
        chosen = draw(st.lists(st.integers(0, ndim - 1), unique=True, min_size=1, max_size=ndim))
        # Mix positive and negative spellings of the same axes.
        axis = [a - ndim if draw(st.booleans()) else a for a in chosen]
    return shape, axis, draw(st.booleans()), draw(st.booleans())


def expected_axes(ndim: int, axis: Any, exclude: bool) -> tuple[int, ...]:
    """Which axes are reduced, computed independently of the implementation."""
    if axis is None or axis == []:
        return tuple(range(ndim))
    listed = {a % ndim for a in (axis if isinstance(axis, list) else [axis])}
    return tuple(a for a in range(ndim) if (a in listed) != exclude)


@HYP
@given(reduction_case(), st.sampled_from(REDUCE_OPS))
def test_reduction_relation_matches_reference(case: tuple, name: str) -> None:
    shape, axis, keepdims, exclude = case
    x = np.random.default_rng(0).standard_normal(shape)
    out_type = relation(name, [TensorType(shape, "float64")], axis=axis, keepdims=keepdims, exclude=exclude)
    out = run(name, [x], axis=axis, keepdims=keepdims, exclude=exclude)
    assert out_type == TensorType(out.shape, "float64")
    axes = expected_axes(len(shape), axis, exclude)
    numpy_fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[name]
    expected = numpy_fn(x, axis=axes, keepdims=keepdims)
    assert out.shape == np.shape(expected)
    assert np.allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_reduction_axis_forms() -> None:
    t = TensorType((2, 3, 4, 5))
    assert relation("sum", [t]) == TensorType(())
    assert relation("sum", [t], axis=[]) == TensorType(())  # an empty list reduces everything, as in TVM
    assert relation("sum", [t], axis=None, exclude=True) == TensorType(())
    assert relation("max", [t], axis=1) == TensorType((2, 4, 5))
    assert relation("max", [t], axis=[-1, 0]) == TensorType((3, 4))
    assert relation("mean", [t], axis=[-1], keepdims=True) == TensorType((2, 3, 4, 1))
    assert relation("min", [t], axis=[1, 2], exclude=True) == TensorType((3, 4))
    assert relation("prod", [t], axis=[1, 2], exclude=True, keepdims=True) == TensorType((1, 3, 4, 1))


def test_reduction_any_dims() -> None:
    t = TensorType((ANY, 3, ANY), "float16")
    assert relation("sum", [t], axis=1) == TensorType((ANY, ANY), "float16")
    assert relation("sum", [t], axis=0) == TensorType((3, ANY), "float16")
    assert relation("mean", [t], axis=[0, 2], keepdims=True) == TensorType((1, 3, 1), "float16")


def test_reduction_errors() -> None:
    with pytest.raises(RelayTypeError, match="axis 3 is out of range for a tensor of rank 3"):
        relation("sum", [TensorType((2, 3, 4))], axis=3)
    with pytest.raises(RelayTypeError, match="same axis twice"):
        relation("sum", [TensorType((2, 3, 4))], axis=[1, -2])
    with pytest.raises(RelayTypeError, match="unknown attribute"):
        get_op("sum").make_attrs({"axes": [1]})


def test_mean_of_integers_truncates() -> None:
    x = np.array([[1, 2, 2], [-1, -2, -2], [7, 7, 7], [-7, 0, 0]], dtype=np.int32)
    out = run("mean", [x], axis=1)
    assert out.dtype == np.int32
    assert out.tolist() == [math.trunc(Fraction(sum(row), 3)) for row in x.tolist()] == [1, -1, 7, -2]
    assert relation("mean", [TensorType((4, 3), "int32")], axis=1) == TensorType((4,), "int32")


def test_float16_reductions_stay_float16_and_accurate() -> None:
    x = np.full((4096,), 0.1, dtype=np.float16)
    total = run("sum", [x])
    mean = run("mean", [x])
    assert total.dtype == np.float16 and mean.dtype == np.float16
    exact = 4096 * float(np.float16(0.1))
    assert float(total) == float(np.float16(exact))  # a float16 running sum would stall far below this
    assert float(mean) == float(np.float16(0.1))


def test_integer_sum_and_prod_wrap_in_dtype() -> None:
    x = np.array([100, 100], dtype=np.int8)
    assert run("sum", [x]).tolist() == -56 and run("sum", [x]).dtype == np.int8
    assert run("prod", [x]).dtype == np.int8


# --------------------------------------------------------------------------------------------
# collapse_sum_like
# --------------------------------------------------------------------------------------------


@st.composite
def collapse_case(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    data = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))
    like = list(data[draw(st.integers(0, len(data))) :])
    like = [d if draw(st.booleans()) else 1 for d in like]
    return data, tuple(like)


@HYP
@given(collapse_case())
def test_collapse_sum_like_is_adjoint_of_broadcast(case: tuple) -> None:
    data_shape, like_shape = case
    rng = np.random.default_rng(2)
    data = rng.standard_normal(data_shape)
    like = rng.standard_normal(like_shape)
    out_type = relation("collapse_sum_like", [TensorType(data_shape, "float64"), TensorType(like_shape, "float64")])
    assert out_type == TensorType(like_shape, "float64")
    out = run("collapse_sum_like", [data, like])
    assert out.shape == like_shape
    # Summing is the adjoint of broadcasting: <collapse(d), y> == <d, broadcast(y)> for every y.
    y = rng.standard_normal(like_shape)
    assert np.isclose(np.sum(out * y), np.sum(data * np.broadcast_to(y, data_shape)), rtol=1e-10, atol=1e-10)
    # And element by element, each output sums exactly the data entries that broadcast from it.
    lead = len(data_shape) - len(like_shape)
    expected = np.zeros(like_shape)
    for idx in itertools.product(*(range(d) for d in data_shape)):
        target = tuple(0 if t == 1 else i for i, t in zip(idx[lead:], like_shape))
        expected[target] += data[idx]
    assert np.allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_collapse_sum_like_errors_and_any() -> None:
    with pytest.raises(RelayTypeError, match=r"cannot collapse shape \(2, 3\) to \(4,\)"):
        relation("collapse_sum_like", [TensorType((2, 3)), TensorType((4,))])
    with pytest.raises(RelayTypeError, match="float32 vs float16"):
        relation("collapse_sum_like", [TensorType((2, 3)), TensorType((3,), "float16")])
    assert relation("collapse_sum_like", [TensorType((ANY, 3)), TensorType((1, 3))]) == TensorType((1, 3))
    assert relation("collapse_sum_like", [TensorType((ANY, 3)), TensorType((5, 3))]) == TensorType((5, 3))
    # The corpus's gradient program collapses (1,) into (1,).
    assert relation("collapse_sum_like", [TensorType((1,)), TensorType((1,))]) == TensorType((1,))
