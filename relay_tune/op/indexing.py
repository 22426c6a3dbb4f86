"""Operators defined by index arithmetic: `arange` (a sequence), `one_hot`, `trilu` (triangle masks),
`cumsum` and `cumprod` (a running sum or product along an axis, inclusive or exclusive, forward or reversed).

`cumsum` and `cumprod` compile as a reduction over a triangular window (each output element combines the
input elements at or before it along the axis): O(n^2) in the axis length, which suits the short axes models scan
(sequence lengths, anchor counts) and keeps the kernel within the generic reduction schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.types import ANY, TensorType, Type
from relay_tune.op._shape import (
    check_dtype,
    expect_arity,
    expect_tensor,
    format_shape,
    is_float_dtype,
    is_int_dtype,
    normalize_axis,
)
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

Array = np.ndarray

register_op("arange", 0, OpPattern.INJECTIVE, {"start": 0, "stop": None, "step": 1, "dtype": "float32"},
            "relay.attrs.ArangeAttrs", required=("stop",),
            description="`start + i * step` for every i with the value before `stop` (static bounds)")
register_op("one_hot", 3, OpPattern.INJECTIVE, {"depth": None, "axis": -1, "dtype": ""}, "relay.attrs.OneHotAttrs",
            required=("depth",),
            description="(indices, on_value, off_value): on where the new axis equals the index (negative "
                        "indices count from `depth`; out-of-range ones give an all-off row)")
register_op("trilu", 1, OpPattern.INJECTIVE, {"k": 0, "upper": True}, "relay.attrs.TriluAttrs",
            description="keeps the upper (or lower) triangle of the last two axes from diagonal `k`, zeroes the rest")
register_op("cumsum", 1, OpPattern.OUT_ELEMWISE_FUSABLE, {"axis": None, "dtype": "", "exclusive": False,
                                                          "reverse": False}, "relay.attrs.ScanopAttrs",
            description="running sum along `axis` (flattened when None); exclusive leaves the element itself out")
register_op("cumprod", 1, OpPattern.OUT_ELEMWISE_FUSABLE, {"axis": None, "dtype": "", "exclusive": False,
                                                           "reverse": False}, "relay.attrs.ScanopAttrs",
            description="running product along `axis` (flattened when None); exclusive leaves the element itself "
                        "out (the first product is 1)")


# ------------------------------------------------------------------------------------------------
# arange
# ------------------------------------------------------------------------------------------------


def _number(value: Any, op_name: str, what: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RelayTypeError(f"{what} must be a number, got {value!r}", op_name=op_name)
    return value


def arange_length(start: float, stop: float, step: float) -> int:
    """The element count of `arange`: ceil((stop - start) / step), at least 0 (ONNX Range's formula)."""
    if step == 0:
        raise RelayTypeError("step must not be 0", op_name="arange")
    return max(math.ceil((stop - start) / step), 0)


def _arange_args(attrs: Attrs) -> tuple[float | int, float | int, float | int, str]:
    op = "arange"
    dtype = check_dtype(attrs["dtype"], op, "dtype")
    if not (is_float_dtype(dtype) or is_int_dtype(dtype)):
        raise RelayTypeError(f"dtype must be a number type, got {dtype}", op_name=op)
    values = [_number(attrs[k], op, k) for k in ("start", "stop", "step")]
    return values[0], values[1], values[2], dtype


@type_relation("arange")
def _arange_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 0, "arange")
    start, stop, step, dtype = _arange_args(attrs)
    return TensorType((arange_length(start, stop, step),), dtype)


@reference("arange")
def _arange_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    start, stop, step, dtype = _arange_args(attrs)
    n = arange_length(start, stop, step)
    if is_float_dtype(dtype):  # in float64, rounded once to the dtype (as numpy's arange of Python floats)
        return (float(start) + np.arange(n, dtype=np.float64) * float(step)).astype(dtype)
    dt = np.dtype(dtype)
    return (dt.type(start) + np.arange(n).astype(dt) * dt.type(step)).astype(dt)


# ------------------------------------------------------------------------------------------------
# one_hot
# ------------------------------------------------------------------------------------------------


def _one_hot_type(arg_types: Sequence[Type], attrs: Attrs) -> tuple[int, int, TensorType]:
    op = "one_hot"
    expect_arity(arg_types, 3, op)
    indices = expect_tensor(arg_types[0], op, "indices")
    on, off = expect_tensor(arg_types[1], op, "on_value"), expect_tensor(arg_types[2], op, "off_value")
    if not is_int_dtype(indices.dtype):
        raise RelayTypeError(f"indices must be an integer tensor, got {indices}", op_name=op)
    if on.ndim or off.ndim or on.dtype != off.dtype:
        raise RelayTypeError(f"on_value and off_value must be scalars of one dtype, got {on} and {off}", op_name=op)
    depth = attrs["depth"]
    if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
        raise RelayTypeError(f"depth must be a positive integer, got {depth!r}", op_name=op)
    axis = normalize_axis(attrs["axis"], indices.ndim + 1, op_name=op)
    dtype = check_dtype(attrs["dtype"], op) if attrs["dtype"] else on.dtype
    shape = (*indices.shape[:axis], depth, *indices.shape[axis:])
    return depth, axis, TensorType(shape, dtype)


@type_relation("one_hot")
def _one_hot_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _one_hot_type(arg_types, attrs)[2]


@reference("one_hot")
def _one_hot_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    indices, on, off = (np.asarray(a) for a in inputs)
    types = [TensorType(a.shape, a.dtype.name) for a in (indices, on, off)]
    depth, axis, out = _one_hot_type(types, attrs)
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    positions = np.arange(depth).reshape((depth,) + (1,) * (indices.ndim - axis))
    hot = np.expand_dims(idx, axis) == positions
    return np.where(hot, on, off).astype(out.dtype)


# ------------------------------------------------------------------------------------------------
# trilu
# ------------------------------------------------------------------------------------------------


@type_relation("trilu")
def _trilu_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 1, "trilu")
    x = expect_tensor(arg_types[0], "trilu", "data")
    if x.ndim < 2:
        raise RelayTypeError(f"expects a tensor of rank 2 or more, got shape {format_shape(x.shape)}", op_name="trilu")
    if isinstance(attrs["k"], bool) or not isinstance(attrs["k"], int):
        raise RelayTypeError(f"k must be an integer, got {attrs['k']!r}", op_name="trilu")
    return x


@reference("trilu")
def _trilu_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    k = int(attrs["k"])
    return np.triu(x, k) if attrs["upper"] else np.tril(x, k)


# ------------------------------------------------------------------------------------------------
# cumsum, cumprod
# ------------------------------------------------------------------------------------------------

_SCANS = ("cumsum", "cumprod")


def _scan_axis(x: TensorType, attrs: Attrs, op_name: str) -> int | None:
    return None if attrs["axis"] is None else normalize_axis(attrs["axis"], x.ndim, op_name=op_name)


def _scan_relation(op_name: str) -> Callable[[Sequence[Type], Attrs], Type]:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
        expect_arity(arg_types, 1, op_name)
        x = expect_tensor(arg_types[0], op_name, "data")
        axis = _scan_axis(x, attrs, op_name)
        dtype = check_dtype(attrs["dtype"], op_name) if attrs["dtype"] else x.dtype
        if dtype == "bool":
            raise RelayTypeError("cannot sum or multiply booleans; give a number dtype", op_name=op_name)
        if axis is None:
            return TensorType((math.prod(x.shape),) if x.is_static else (ANY,), dtype)  # type: ignore[arg-type]
        return TensorType(x.shape, dtype)

    return relation


def _scan_ref(op_name: str) -> Callable[[Sequence[Array], Attrs], Array]:
    product = op_name == "cumprod"

    def ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
        x = np.asarray(inputs[0])
        axis = _scan_axis(TensorType(x.shape, x.dtype.name), attrs, op_name)
        dtype = attrs["dtype"] or x.dtype.name
        if axis is None:
            x, axis = x.reshape(-1), 0
        acc = "float32" if dtype == "float16" else dtype  # float16 accumulates in float32, as the kernel's do
        data = x.astype(dtype).astype(acc)
        if attrs["reverse"]:
            data = np.flip(data, axis)
        with np.errstate(over="ignore"):  # integer products wrap, as the kernel's do
            total = np.cumprod(data, axis=axis, dtype=acc) if product else np.cumsum(data, axis=axis, dtype=acc)
        if attrs["exclusive"]:  # the result of the elements before: the inclusive results shifted by one
            first = np.ones_like if product else np.zeros_like
            total = np.concatenate([first(np.take(total, [0], axis=axis)),
                                    np.take(total, np.arange(total.shape[axis] - 1), axis=axis)], axis=axis)
        if attrs["reverse"]:
            total = np.flip(total, axis)
        return np.ascontiguousarray(total.astype(dtype))

    return ref


for _name in _SCANS:
    type_relation(_name)(_scan_relation(_name))
    reference(_name)(_scan_ref(_name))


# ------------------------------------------------------------------------------------------------
# tensor-expression computes (kernels)
# ------------------------------------------------------------------------------------------------
# Imported here, not at the top: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import (  # noqa: E402
    INJECTIVE,
    accumulate_dtype,
    axis_names,
    const_expr,
    named,
    static_shape,
)
from relay_tune.op.registry import compute  # noqa: E402


@compute("arange")
def _arange_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    start, _, step, dtype = _arange_args(attrs)
    work = "float64" if is_float_dtype(dtype) else dtype
    first, delta = const_expr(start, work), const_expr(step, work)
    return te.compute(static_shape(out_type), named(["i"], lambda i: te.cast(dtype, first + te.cast(work, i) * delta)),
                      "arange", INJECTIVE)


@compute("one_hot")
def _one_hot_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    indices, on, off = inputs
    depth, axis, out = _one_hot_type([TensorType(t.shape, t.dtype) for t in inputs], attrs)

    def body(*idx: Any) -> Any:
        index = te.cast(tir.INDEX_DTYPE, indices[(*idx[:axis], *idx[axis + 1:])])
        index = te.if_then_else(index < 0, index + depth, index)
        return te.if_then_else(te.equal(index, idx[axis]), te.cast(out.dtype, on[()]), te.cast(out.dtype, off[()]))

    shape = static_shape(out_type)
    return te.compute(shape, named(axis_names(len(shape)), body), "one_hot", INJECTIVE)


@compute("trilu")
def _trilu_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    k, upper = int(attrs["k"]), bool(attrs["upper"])
    zero = const_expr(0, x.dtype)

    def body(*idx: Any) -> Any:
        offset = idx[-1] - idx[-2]
        keep = offset >= k if upper else offset <= k
        return te.if_then_else(keep, x[idx], zero)

    return te.compute(x.shape, named(axis_names(x.ndim), body), "trilu", INJECTIVE)


def _scan_compute(op_name: str) -> Callable[[Sequence[te.Tensor], Attrs, Type], te.Tensor]:
    product = op_name == "cumprod"

    def scan(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        (x,) = inputs
        axis = _scan_axis(TensorType(x.shape, x.dtype), attrs, op_name)
        shape = static_shape(out_type)
        assert isinstance(out_type, TensorType)
        dtype = out_type.dtype
        if axis is None:  # the flattened tensor: read it through its row-major unravelling
            flat = te.compute(shape, named(["i"], lambda i: x[_unravel(i, x.shape)]), "flatten", INJECTIVE)
            x, axis = flat, 0
        n = x.shape[axis]
        acc = accumulate_dtype(dtype)
        r = te.reduce_axis(n, "r")
        exclusive, reverse = bool(attrs["exclusive"]), bool(attrs["reverse"])
        identity = const_expr(1 if product else 0, acc)

        def window(*idx: Any) -> Any:
            i = idx[axis]
            if reverse:
                inside = r > i if exclusive else r >= i
            else:
                inside = r < i if exclusive else r <= i
            value = te.if_then_else(inside, te.cast(acc, x[(*idx[:axis], r, *idx[axis + 1:])]), identity)
            return te.prod(value, axis=r) if product else te.sum(value, axis=r)

        total = te.compute(shape, named(axis_names(len(shape)), window), op_name, "reduce")
        if acc == dtype:
            return total
        return te.compute(shape, named(axis_names(len(shape)), lambda *i: te.cast(dtype, total[i])),
                          f"{op_name}_cast", "elemwise")

    return scan


for _name in _SCANS:
    compute(_name)(_scan_compute(_name))


def _unravel(flat: Any, shape: Sequence[int]) -> tuple[Any, ...]:
    out: list[Any] = []
    stride = 1
    for extent in reversed(shape):
        value = flat if stride == 1 else tir.binary("floordiv", flat, stride)
        out.append(tir.binary("floormod", value, extent) if extent != 1 else tir.IntImm(0))
        stride *= extent
    return tuple(reversed(out))
