"""Commutative reductions: sum, mean, max, min, prod and `collapse_sum_like`.

Semantics (TVM's ReduceRel):

* `axis=None` or an empty list reduces every axis (whatever `exclude` says); an int or a list
  selects axes, negative values count from the end; with `exclude=True` the *other* axes are
  reduced. Listing an axis twice is an error.
* `keepdims=True` keeps reduced axes as size 1.
* The result keeps the input dtype. `mean` of an integer tensor is the integer sum divided by the
  element count, truncated toward zero (TVM computes `sum / count` in the input dtype).
* Integer sums accumulate in the input dtype (wrapping like generated code would); float16 sums
  accumulate in float32 and round once, which is the accuracy an oracle should have.
* `collapse_sum_like(data, like)` sums `data` down to the shape of `like` (the reverse of
  broadcasting `like` up to `data`); its type is the type of `like`.
* `min_max(data)`: `[min(data), max(data)]` over every element of a float32 tensor, as one `(2,)` float32 tensor
  (the range DynamicQuantizeLinear quantizes to). Its kernel is a fixed loop nest
  (`relay_tune.kernel.recurrent.FIXED_KERNELS`) that reads the tensor once with vector accumulators for both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.dtypes import LOW_PRECISION_FLOAT_DTYPES
from relay_tune.ir.types import TensorType, Type
from relay_tune.op._shape import (
    expect_arity,
    expect_tensor,
    format_shape,
    is_int_dtype,
    merge_dims,
    normalize_axis,
    same_dtype,
)
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

REDUCE_ATTRS = {"axis": None, "keepdims": False, "exclude": False}
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
for _name in REDUCE_OPS:
    register_op(_name, 1, OpPattern.COMM_REDUCE, REDUCE_ATTRS, "relay.attrs.ReduceAttrs")

register_op("collapse_sum_like", 2, OpPattern.COMM_REDUCE)

MIN_MAX = "min_max"
# OPAQUE: the fixed kernel takes its input as it is, fused with nothing (`kernel.recurrent.fixed_kernel_call`).
register_op(MIN_MAX, 1, OpPattern.OPAQUE, description="[min, max] of every element of a float32 tensor")

Array = np.ndarray


def reduce_axes(ndim: int, axis: Any, exclude: bool, op_name: str | None = None) -> tuple[int, ...]:
    """The sorted, non-negative axes a reduction with these attributes reduces over."""
    if axis is None or axis == ():
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    chosen = [normalize_axis(a, ndim, op_name=op_name) for a in items]
    if len(set(chosen)) != len(chosen):
        raise RelayTypeError(f"axis {list(items)} names the same axis twice", op_name=op_name)
    if exclude:
        return tuple(i for i in range(ndim) if i not in chosen)
    return tuple(sorted(chosen))


def _reduce_relation(op_name: str) -> Callable[[Sequence[Type], Attrs], Type]:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
        expect_arity(arg_types, 1, op_name)
        x = expect_tensor(arg_types[0], op_name)
        axes = reduce_axes(x.ndim, attrs["axis"], bool(attrs["exclude"]), op_name)
        if op_name == "mean" and x.dtype == "bool":  # a mean of booleans is no boolean (cast to a number first)
            raise RelayTypeError(f"requires a numeric tensor, got {x}", op_name=op_name)
        if op_name in ("max", "min") and any(x.shape[a] == 0 for a in axes):
            raise RelayTypeError(f"reduces an empty axis of {x}: {op_name} of no elements has no value",
                                 op_name=op_name)
        if bool(attrs["keepdims"]):
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return TensorType(shape, x.dtype)

    return relation


for _name in REDUCE_OPS:
    type_relation(_name)(_reduce_relation(_name))


def _accumulate_dtype(dtype: np.dtype) -> np.dtype:
    # float16 and the narrower floats (ml_dtypes types) sum in float32
    return np.dtype(np.float32) if dtype == np.float16 or dtype.name in LOW_PRECISION_FLOAT_DTYPES else dtype


def _sum(x: Array, axes: tuple[int, ...]) -> Array:
    return np.sum(x, axis=axes, dtype=_accumulate_dtype(x.dtype), keepdims=True)


def _prod(x: Array, axes: tuple[int, ...]) -> Array:
    return np.prod(x, axis=axes, dtype=_accumulate_dtype(x.dtype), keepdims=True)


def _max(x: Array, axes: tuple[int, ...]) -> Array:
    return np.max(x, axis=axes, keepdims=True)


def _min(x: Array, axes: tuple[int, ...]) -> Array:
    return np.min(x, axis=axes, keepdims=True)


def _mean(x: Array, axes: tuple[int, ...]) -> Array:
    count = 1
    for a in axes:
        count *= x.shape[a]
    total = _sum(x, axes)
    if is_int_dtype(x.dtype.name):
        if count == 0:
            return np.zeros_like(total)
        # Truncate toward zero, as C integer division does.
        quotient = np.abs(total.astype(np.int64)) // count
        return np.where(total < 0, -quotient, quotient).astype(x.dtype)
    return total / count


_REDUCERS: dict[str, Callable[[Array, tuple[int, ...]], Array]] = {
    "sum": _sum, "mean": _mean, "max": _max, "min": _min, "prod": _prod,
}


def _reduce_reference(op_name: str) -> Callable[[Sequence[Array], Attrs], Array]:
    reducer = _REDUCERS[op_name]

    def impl(inputs: Sequence[Array], attrs: Attrs) -> Array:
        x = np.asarray(inputs[0])
        axes = reduce_axes(x.ndim, attrs["axis"], bool(attrs["exclude"]), op_name)
        with np.errstate(all="ignore"):
            out = np.asarray(reducer(x, axes)).astype(x.dtype)
        if not bool(attrs["keepdims"]):
            out = out.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))
        return out

    return impl


for _name in REDUCE_OPS:
    reference(_name)(_reduce_reference(_name))


@type_relation(MIN_MAX)
def _min_max_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 1, MIN_MAX)
    x = expect_tensor(arg_types[0], MIN_MAX)
    if x.dtype != "float32":
        raise RelayTypeError(f"requires a float32 tensor, got {x}", op_name=MIN_MAX)
    if not all(isinstance(d, int) for d in x.shape):
        raise RelayTypeError(f"requires a static shape, got {x}", op_name=MIN_MAX)
    if any(d == 0 for d in x.shape):
        raise RelayTypeError(f"{x} has no elements: their range has no value", op_name=MIN_MAX)
    return TensorType((2,), "float32")


@reference(MIN_MAX)
def _min_max_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = inputs[0]
    return np.array([x.min(), x.max()], dtype=np.float32)


@type_relation("collapse_sum_like")
def _collapse_sum_like_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 2, "collapse_sum_like")
    data = expect_tensor(arg_types[0], "collapse_sum_like", "data")
    like = expect_tensor(arg_types[1], "collapse_sum_like", "target")
    same_dtype((data, like), "collapse_sum_like")
    # `data` must be what broadcasting `like` up to it would produce.
    # That holds when each target dim is 1 or equal to the data dim (`?` is equal to anything).
    compatible = like.ndim <= data.ndim and all(
        t == 1 or merge_dims(d, t) is not None for d, t in zip(data.shape[data.ndim - like.ndim :], like.shape)
    )
    if not compatible:
        raise RelayTypeError(
            f"cannot collapse shape {format_shape(data.shape)} to {format_shape(like.shape)}: "
            f"the target does not broadcast to the data shape",
            op_name="collapse_sum_like",
        )
    return like


@reference("collapse_sum_like")
def _collapse_sum_like_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    data, like = np.asarray(inputs[0]), np.asarray(inputs[1])
    lead = data.ndim - like.ndim
    axes = tuple(range(lead)) + tuple(
        lead + i for i, t in enumerate(like.shape) if t == 1 and data.shape[lead + i] != 1
    )
    with np.errstate(all="ignore"):
        total = np.sum(data, axis=axes, dtype=_accumulate_dtype(data.dtype), keepdims=True)
    return total.reshape(like.shape).astype(data.dtype)


# --------------------------------------------------------------------------------------------
# tensor-expression computes (kernels)
# --------------------------------------------------------------------------------------------
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

_TE_REDUCERS: dict[str, Callable[..., te.Reduce]] = {
    "sum": te.sum, "mean": te.sum, "max": te.max, "min": te.min, "prod": te.prod,
}


def reduce_tensor(
    x: te.Tensor, axes: Sequence[int], keepdims: bool, combiner: str, acc_dtype: str, name: str = "reduce",
    tag: str = "reduce",
) -> te.Tensor:
    """`combiner` of `x` over `axes` (sorted), in `acc_dtype`; reduced axes are kept as size 1 with
    `keepdims`. The reduce axes are named `k<axis>`."""
    axes = sorted(axes)
    if keepdims:
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    else:
        shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    raxes = [te.reduce_axis(x.shape[a], f"k{a}") for a in axes]
    reducer = _TE_REDUCERS[combiner]

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        src: list[tir.PrimExpr] = []
        spatial = iter(idx)
        reduced = iter(raxes)
        for d in range(x.ndim):
            if d in axes:
                src.append(next(reduced))
                if keepdims:
                    next(spatial)
            else:
                src.append(next(spatial))
        return reducer(te.cast(acc_dtype, x[tuple(src)]), axis=raxes)

    return te.compute(shape, named(axis_names(len(shape)), body), name, tag)


def _reduce_compute(op_name: str) -> Callable[..., te.Tensor]:
    def impl(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        (x,) = inputs
        assert isinstance(out_type, TensorType)
        out_shape = static_shape(out_type)
        dtype = out_type.dtype
        axes = reduce_axes(x.ndim, attrs["axis"], bool(attrs["exclude"]), op_name)
        if not axes:  # a scalar: reducing over nothing is the value itself
            return te.compute(out_shape, named(axis_names(len(out_shape)), lambda *i: x[i]), op_name, INJECTIVE)
        acc = accumulate_dtype(dtype) if op_name in ("sum", "mean", "prod") else dtype
        total = reduce_tensor(x, axes, bool(attrs["keepdims"]), "sum" if op_name == "mean" else op_name, acc)
        if op_name == "mean":
            count = 1
            for a in axes:
                count *= x.shape[a]
            # `div` truncates integers toward zero, as the reference's integer mean does
            return te.compute(
                out_shape,
                named(axis_names(len(out_shape)),
                      lambda *i: te.cast(dtype, tir.BinaryOp("div", total[i], const_expr(count, acc)))),
                "mean", "elemwise",
            )
        if acc == dtype:
            return total
        return te.compute(out_shape, named(axis_names(len(out_shape)), lambda *i: te.cast(dtype, total[i])),
                          op_name, "elemwise")

    return impl


for _name in REDUCE_OPS:
    compute(_name)(_reduce_compute(_name))


@compute("collapse_sum_like")
def _collapse_sum_like_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    data, like = inputs
    assert isinstance(out_type, TensorType)
    lead = data.ndim - like.ndim
    axes = list(range(lead)) + [lead + i for i, t in enumerate(like.shape) if t == 1 and data.shape[lead + i] != 1]
    shape = static_shape(out_type)
    if not axes:
        return te.compute(shape, named(axis_names(len(shape)), lambda *i: data[i]), "collapse_sum_like", INJECTIVE)
    acc = accumulate_dtype(out_type.dtype)
    total = reduce_tensor(data, axes, False, "sum", acc)
    # the reduced result drops the summed axes; the output keeps the like-shaped ones as size 1
    kept = [d for d in range(lead, data.ndim) if d not in axes]

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        return te.cast(out_type.dtype, total[tuple(idx[d - lead] for d in kept)])

    return te.compute(shape, named(axis_names(len(shape)), body), "collapse_sum_like", "elemwise")


@compute(MIN_MAX)
def _min_max_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """Two whole-tensor reductions and a select: the generic form other targets (NVPTX) build. CPU builds run the
    fixed kernel (`relay_tune.kernel.recurrent`), which finds both ends in one pass."""
    (x,) = inputs
    axes = list(range(x.ndim))
    low = reduce_tensor(x, axes, False, "min", "float32", name="min_max_low")
    high = reduce_tensor(x, axes, False, "max", "float32", name="min_max_high")
    return te.compute((2,), named(["i"], lambda i: te.if_then_else(te.equal(i, 0), low[()], high[()])), MIN_MAX,
                      INJECTIVE)
