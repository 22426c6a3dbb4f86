"""Element-wise and broadcasting operators: unary math, binary arithmetic, comparisons, bitwise and/or/xor of
integers, `where`.

Semantics (type relations follow TVM; numpy references are the correctness oracle):

* Unary ops keep the input type. The transcendental ones (exp, log, sqrt, rsqrt, tanh, sigmoid,
  erf, sin, cos, tan, asin, acos, atan) require a floating-point input: on integers TVM type-checks
  them but cannot generate sensible code, so we reject them where the user can still see which call is at fault.
* Binary ops broadcast numpy-style from the trailing dimension and require both operands to have
  the same dtype (Relay never promotes). Comparisons return `bool`.
* `bitwise_and`, `bitwise_or` and `bitwise_xor` require integer operands (two's complement for signed ones).
* `divide` on integers truncates toward zero (C semantics, as TVM's `div`); integer division by
  zero is undefined in generated code and the reference returns 0 for it. `power` on integers
  with a negative exponent gives the truncated real result (0 unless the base is +-1; 0 for 0).
* References compute transcendental functions in float64 and round once to the input dtype, so
  float16 inputs give float16 results that are as accurate as float16 allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.dtypes import SATURATING_FLOAT8_DTYPES
from relay_tune.ir.types import TensorType, Type
from relay_tune.op._shape import (
    broadcast_shapes,
    check_dtype,
    expect_arity,
    expect_tensor,
    is_float_dtype,
    is_int_dtype,
    numpy_dtype,
    same_dtype,
)
from relay_tune.op.low_precision import check_round_mode, convert
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

E, B = OpPattern.ELEMWISE, OpPattern.BROADCAST

TRIG_OPS = ("sin", "cos", "tan", "asin", "acos", "atan")
UNARY_OPS = (
    "negative", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs", "copy",
    "zeros_like", "ones_like", "floor", "ceil", "round", *TRIG_OPS,
)
for _name in UNARY_OPS:
    register_op(_name, 1, E)

register_op("nn.relu", 1, E)
register_op("nn.leaky_relu", 1, E, {"alpha": 0.25}, "relay.attrs.LeakyReluAttrs")
register_op("clip", 1, E, {"a_min": None, "a_max": None}, "relay.attrs.ClipAttrs", required=("a_min", "a_max"))
# `saturate` and `round_mode` are ONNX Cast's; they only change conversions to float8 types (low_precision.py).
register_op("cast", 1, E, {"dtype": "", "saturate": True, "round_mode": "up"}, "relay.attrs.CastAttrs",
            required=("dtype",), unkeyed_defaults=("saturate", "round_mode"))

ARITH_OPS = ("add", "subtract", "multiply", "divide", "power", "maximum", "minimum")
COMPARE_OPS = ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")
BITWISE_OPS = ("bitwise_and", "bitwise_or", "bitwise_xor")
for _name in ARITH_OPS + COMPARE_OPS + BITWISE_OPS:
    register_op(_name, 2, B)

register_op("where", 3, B)

FLOAT_ONLY_OPS = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", *TRIG_OPS})

Array = np.ndarray
Relation = Callable[[Sequence[Type], Attrs], Type]


# --------------------------------------------------------------------------------------------
# type relations
# --------------------------------------------------------------------------------------------


def _identity_relation(op_name: str, float_only: bool) -> Relation:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
        expect_arity(arg_types, 1, op_name)
        x = expect_tensor(arg_types[0], op_name)
        if float_only and not is_float_dtype(x.dtype):
            raise RelayTypeError(f"requires a floating-point tensor, got {x}", op_name=op_name)
        if op_name == "negative" and x.dtype == "bool":  # no arithmetic negation of booleans (use logical_not)
            raise RelayTypeError(f"requires a numeric tensor, got {x}", op_name=op_name)
        return x

    return relation


for _name in (*UNARY_OPS, "nn.relu", "nn.leaky_relu", "clip"):
    type_relation(_name)(_identity_relation(_name, _name in FLOAT_ONLY_OPS))


@type_relation("cast")
def _cast_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 1, "cast")
    x = expect_tensor(arg_types[0], "cast")
    check_round_mode(attrs["round_mode"])
    return TensorType(x.shape, check_dtype(attrs["dtype"], "cast"))


def _broadcast_relation(op_name: str, result_dtype: str | None) -> Relation:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
        expect_arity(arg_types, 2, op_name)
        lhs = expect_tensor(arg_types[0], op_name, "left operand")
        rhs = expect_tensor(arg_types[1], op_name, "right operand")
        dtype = same_dtype((lhs, rhs), op_name)
        if op_name == "subtract" and dtype == "bool":  # no arithmetic difference of booleans (use logical_xor)
            raise RelayTypeError(f"requires numeric tensors, got {lhs} and {rhs}", op_name=op_name)
        if op_name in BITWISE_OPS and not is_int_dtype(dtype):
            raise RelayTypeError(f"requires integer tensors, got {lhs} and {rhs}", op_name=op_name)
        return TensorType(broadcast_shapes(lhs.shape, rhs.shape, op_name=op_name), result_dtype or dtype)

    return relation


for _name in ARITH_OPS + BITWISE_OPS:
    type_relation(_name)(_broadcast_relation(_name, None))
for _name in COMPARE_OPS:
    type_relation(_name)(_broadcast_relation(_name, "bool"))


@type_relation("where")
def _where_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 3, "where")
    # Any condition dtype is accepted: non-zero selects the first branch, as in TVM.
    cond = expect_tensor(arg_types[0], "where", "condition")
    x = expect_tensor(arg_types[1], "where", "first branch")
    y = expect_tensor(arg_types[2], "where", "second branch")
    dtype = same_dtype((x, y), "where")
    branches = broadcast_shapes(x.shape, y.shape, op_name="where")
    return TensorType(broadcast_shapes(cond.shape, branches, op_name="where"), dtype)


# --------------------------------------------------------------------------------------------
# numpy references
# --------------------------------------------------------------------------------------------


def _in_float64(fn: Callable[[Array], Array]) -> Callable[[Sequence[Array], Attrs], Array]:
    """A float-only unary op evaluated in float64 and rounded once to the input dtype."""

    def impl(inputs: Sequence[Array], attrs: Attrs) -> Array:
        x = np.asarray(inputs[0])
        with np.errstate(all="ignore"):
            return np.asarray(fn(x.astype(np.float64))).astype(x.dtype)

    return impl


def _sigmoid(x: Array) -> Array:
    # exp of a large |x| overflows to inf, which still yields the right limit (0 or 1).
    return 1.0 / (1.0 + np.exp(-x))


_ERF = np.frompyfunc(math.erf, 1, 1)


def _erf(x: Array) -> Array:
    # math.erf is accurate to a few ulp of float64; frompyfunc yields an object array.
    return np.asarray(_ERF(x), dtype=np.float64)


_FLOAT_UNARY: dict[str, Callable[[Array], Array]] = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "erf": _erf,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
}
for _name, _fn in _FLOAT_UNARY.items():
    reference(_name)(_in_float64(_fn))


def _same_dtype_unary(fn: Callable[[Array], Array]) -> Callable[[Sequence[Array], Attrs], Array]:
    def impl(inputs: Sequence[Array], attrs: Attrs) -> Array:
        x = np.asarray(inputs[0])
        with np.errstate(all="ignore"):
            return np.asarray(fn(x)).astype(x.dtype, copy=False)

    return impl


_ROUNDING: dict[str, Callable[[Array], Array]] = {
    # Integers are already whole; numpy would turn them into float64.
    "floor": lambda x: np.floor(x) if is_float_dtype(x.dtype.name) else x.copy(),
    "ceil": lambda x: np.ceil(x) if is_float_dtype(x.dtype.name) else x.copy(),
    # TVM's round lowers to nearbyint: ties go to the even neighbour, as np.rint does.
    "round": lambda x: np.rint(x) if is_float_dtype(x.dtype.name) else x.copy(),
}
_SIMPLE_UNARY: dict[str, Callable[[Array], Array]] = {
    "negative": np.negative,
    "abs": np.abs,
    "copy": np.copy,
    "zeros_like": np.zeros_like,
    "ones_like": np.ones_like,
    "nn.relu": lambda x: np.maximum(x, np.zeros((), x.dtype)),
    **_ROUNDING,
}
for _name, _fn in _SIMPLE_UNARY.items():
    reference(_name)(_same_dtype_unary(_fn))


@reference("nn.leaky_relu")
def _leaky_relu_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    alpha = float(attrs["alpha"])
    with np.errstate(all="ignore"):
        scaled = (x.astype(np.float64) * alpha).astype(x.dtype)
    return np.where(x > 0, x, scaled).astype(x.dtype, copy=False)


def _bound_in_dtype(value: float, dtype: np.dtype) -> Array:
    """A clip bound converted to the tensor dtype the way a C cast would (truncation, saturated)."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        value = min(max(math.trunc(value) if math.isfinite(value) else value, info.min), info.max)
        return np.asarray(int(value), dtype=dtype)
    with np.errstate(over="ignore"):
        return np.asarray(value, dtype=dtype)


@reference("clip")
def _clip_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    lo = _bound_in_dtype(float(attrs["a_min"]), x.dtype)
    hi = _bound_in_dtype(float(attrs["a_max"]), x.dtype)
    # Same order as TVM (min(max(x, lo), hi)) so a_min > a_max gives a_max everywhere.
    return np.minimum(np.maximum(x, lo), hi).astype(x.dtype, copy=False)


@reference("cast")
def _cast_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    dtype = check_dtype(attrs["dtype"], "cast")
    # Out-of-range float -> int conversions are undefined in generated code; numpy's result stands in.
    return convert(x, dtype, bool(attrs["saturate"]), str(attrs["round_mode"]))


def _trunc_divide(a: Array, b: Array) -> Array:
    """Integer division rounding toward zero; division by zero yields 0."""
    safe_b = np.where(b == 0, np.ones((), b.dtype), b)
    with np.errstate(all="ignore"):
        q = np.floor_divide(a, safe_b)
        r = a - q * safe_b
        # floor and trunc differ exactly when the remainder is non-zero and the signs differ.
        adjust = (r != 0) & ((a < 0) != (safe_b < 0))
        q = q + adjust.astype(q.dtype)
    return np.where(b == 0, np.zeros((), q.dtype), q)


def _divide(a: Array, b: Array) -> Array:
    if is_int_dtype(a.dtype.name):
        return _trunc_divide(a, b)
    return np.divide(a, b)


def _power(a: Array, b: Array) -> Array:
    if not is_int_dtype(a.dtype.name):
        return np.power(a.astype(np.float64), b.astype(np.float64))
    negative = b < 0
    # numpy refuses negative integer exponents; evaluate those entries in float64 and truncate.
    whole = np.power(a, np.where(negative, np.zeros((), b.dtype), b))
    real = np.power(a.astype(np.float64), b.astype(np.float64))
    real = np.where(np.isfinite(real), np.trunc(real), 0.0)
    return np.where(negative, real.astype(a.dtype), whole)


_BINARY: dict[str, Callable[[Array, Array], Array]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": _divide,
    "power": _power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
}


def _binary_reference(op_name: str, fn: Callable[[Array, Array], Array]) -> Callable[[Sequence[Array], Attrs], Array]:
    result_bool = op_name in COMPARE_OPS

    def impl(inputs: Sequence[Array], attrs: Attrs) -> Array:
        a, b = np.asarray(inputs[0]), np.asarray(inputs[1])
        if a.dtype != b.dtype:
            raise RelayTypeError(f"operand dtypes differ: {a.dtype} vs {b.dtype}", op_name=op_name)
        with np.errstate(all="ignore"):
            out = np.asarray(fn(a, b))
        return out.astype(np.bool_ if result_bool else a.dtype, copy=False)

    return impl


for _name, _fn2 in _BINARY.items():
    reference(_name)(_binary_reference(_name, _fn2))


@reference("where")
def _where_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    cond, x, y = (np.asarray(v) for v in inputs)
    return np.asarray(np.where(cond != 0, x, y)).astype(x.dtype, copy=False)


# --------------------------------------------------------------------------------------------
# tensor-expression computes (kernels)
# --------------------------------------------------------------------------------------------
# Imported here, not at the top: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import BROADCAST, const_expr, elementwise, is_float  # noqa: E402
from relay_tune.op.registry import compute  # noqa: E402

_TE_FLOAT_UNARY: dict[str, Callable[[tir.PrimExpr], tir.PrimExpr]] = {
    "exp": te.exp, "log": te.log, "sqrt": te.sqrt, "rsqrt": te.rsqrt, "tanh": te.tanh, "sigmoid": te.sigmoid,
    "erf": te.erf, "sin": te.sin, "cos": te.cos, "tan": te.tan, "asin": te.asin, "acos": te.acos, "atan": te.atan,
}


def _unary_compute(op_name: str, fn: Callable[[tir.PrimExpr], tir.ExprLike]) -> Callable[..., te.Tensor]:
    def impl(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        return elementwise(op_name, inputs, out_type, fn)

    return impl


def _round_like(name: str) -> Callable[[tir.PrimExpr], tir.PrimExpr]:
    intrinsic = getattr(te, name)
    return lambda x: intrinsic(x) if is_float(x.dtype) else x


_TE_UNARY: dict[str, Callable[[tir.PrimExpr], tir.ExprLike]] = {
    **_TE_FLOAT_UNARY,
    "negative": lambda x: -x,
    "abs": te.abs,
    "copy": lambda x: x,
    "zeros_like": lambda x: const_expr(0, x.dtype),
    "ones_like": lambda x: const_expr(1, x.dtype),
    "nn.relu": lambda x: te.maximum(x, const_expr(0, x.dtype)),
    "floor": _round_like("floor"),
    "ceil": _round_like("ceil"),
    "round": _round_like("round"),
}
for _name, _fn3 in _TE_UNARY.items():
    compute(_name)(_unary_compute(_name, _fn3))


@compute("nn.leaky_relu")
def _leaky_relu_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    alpha = float(attrs["alpha"])

    def fn(x: tir.PrimExpr) -> tir.PrimExpr:
        return te.if_then_else(x > const_expr(0, x.dtype), x, x * const_expr(alpha, x.dtype))

    return elementwise("nn.leaky_relu", inputs, out_type, fn)


def _bound_const(value: float, dtype: str) -> tir.PrimExpr:
    # the same conversion as the reference's (truncation and saturation for integer tensors)
    return const_expr(_bound_in_dtype(value, np.dtype(numpy_dtype(dtype))).item(), dtype)


@compute("clip")
def _clip_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    dtype = inputs[0].dtype
    lo, hi = _bound_const(float(attrs["a_min"]), dtype), _bound_const(float(attrs["a_max"]), dtype)
    return elementwise("clip", inputs, out_type, lambda x: te.minimum(te.maximum(x, lo), hi))


@compute("cast")
def _cast_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    dtype = check_dtype(attrs["dtype"], "cast")
    saturate, round_mode = bool(attrs["saturate"]), check_round_mode(attrs["round_mode"])

    def convert_one(x: tir.PrimExpr) -> tir.PrimExpr:
        if x.dtype == dtype:
            return x
        if dtype in SATURATING_FLOAT8_DTYPES or dtype == "float8_e8m0fnu":
            return tir.Cast(dtype, x, saturate=saturate, round_mode=round_mode if dtype == "float8_e8m0fnu" else "")
        return te.cast(dtype, x)

    return elementwise("cast", inputs, out_type, convert_one)


@compute("reinterpret")
def _reinterpret_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    dtype = check_dtype(attrs["dtype"], "reinterpret")
    return elementwise("reinterpret", inputs, out_type,
                       lambda x: x if x.dtype == dtype else tir.Cast(dtype, x, reinterpret=True))


def _te_divide(a: tir.PrimExpr, b: tir.PrimExpr) -> tir.PrimExpr:
    # `div` is true division on floats and truncating division on integers, as the reference does
    return tir.BinaryOp("div", a, b)


def _te_power(a: tir.PrimExpr, b: tir.PrimExpr) -> tir.PrimExpr:
    if is_float(a.dtype):
        return te.power(a, b)
    # Integers: the real power truncated toward zero (a negative exponent gives 0 unless the base is +-1),
    # computed in float64, which is exact for every result an int32 can hold; 0 ** negative is 0.
    real = te.power(te.cast("float64", a), te.cast("float64", b))
    zero = const_expr(0, a.dtype)
    return te.if_then_else(te.all_of(b < zero, te.equal(a, zero)), zero, te.cast(a.dtype, real))


_TE_BINARY: dict[str, Callable[[tir.PrimExpr, tir.PrimExpr], tir.PrimExpr]] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": _te_divide,
    "power": _te_power,
    "maximum": te.maximum,
    "minimum": te.minimum,
    "less": lambda a, b: a < b,
    "less_equal": lambda a, b: a <= b,
    "greater": lambda a, b: a > b,
    "greater_equal": lambda a, b: a >= b,
    "equal": te.equal,
    "not_equal": te.not_equal,
    "bitwise_and": lambda a, b: tir.BinaryOp("bitand", a, b),
    "bitwise_or": lambda a, b: tir.BinaryOp("bitor", a, b),
    "bitwise_xor": lambda a, b: tir.BinaryOp("bitxor", a, b),
}


def _binary_compute(op_name: str, fn: Callable[[tir.PrimExpr, tir.PrimExpr], tir.PrimExpr]) -> Callable[..., te.Tensor]:
    def impl(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        return elementwise(op_name, inputs, out_type, fn, BROADCAST)

    return impl


for _name, _fn4 in _TE_BINARY.items():
    compute(_name)(_binary_compute(_name, _fn4))


@compute("where")
def _where_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    def fn(cond: tir.PrimExpr, x: tir.PrimExpr, y: tir.PrimExpr) -> tir.PrimExpr:
        test = cond if cond.dtype == "bool" else te.not_equal(cond, const_expr(0, cond.dtype))
        return te.if_then_else(test, x, y)

    return elementwise("where", inputs, out_type, fn, BROADCAST)
