"""ONNX converters for element-wise math, logic, activations, reductions and normalisations.

Each operator here is a composition of existing Relay operators (as TVM's front end converts them), so
the interpreter, the fusion pass and the generic injective/reduction schedules handle them with no new
Relay operator:

- CastLike, Mod (`fmod` both ways), And/Or/Xor/Not, BitShift (unsigned: multiplying or dividing by a
  power of two), IsNaN/IsInf, the hyperbolic functions and their inverses (through exp/log/sqrt),
- HardSwish, Mish, Celu, ThresholdedRelu,
- ReduceL1/L2/LogSum/LogSumExp/SumSquare, LpNormalization, GroupNormalization, RMSNormalization.

The converters register in the importer's table when `relay_tune.frontend.onnx` is imported.
"""

from __future__ import annotations

import math

import numpy as np

from relay_tune.frontend.onnx_importer import (
    Importer,
    OnnxModelError,
    OnnxNode,
    cast_options,
    legacy_broadcast,
    normalize_axis,
)
from relay_tune.frontend.onnx_registry import CONVERTERS, REVIEWED_OPSET, converts
from relay_tune.ir.expr import Expr
from relay_tune.op._shape import is_float_dtype

# --- casts and integer arithmetic ---------------------------------------------------------------


@converts("CastLike", newest=REVIEWED_OPSET)
def _cast_like(imp: Importer, node: OnnxNode) -> Expr:
    return imp.cast(node.required(0), imp.dtype(node.required(1)), *cast_options(node))


def _trunc(imp: Importer, x: Expr) -> Expr:
    """`x` rounded toward zero (floating point)."""
    negative = imp.call("less", [x, imp.const(0, imp.dtype(x))])
    return imp.call("where", [negative, imp.call("ceil", [x]), imp.call("floor", [x])])


@converts("Mod", newest=REVIEWED_OPSET)
def _mod(imp: Importer, node: OnnxNode) -> Expr:
    a, b = node.required(0), node.required(1)
    fmod = bool(node.attrs.get("fmod", 0))
    if is_float_dtype(imp.dtype(a)):
        return _float_mod(imp, a, b, fmod)
    # Integer `divide` truncates toward zero, so this is C's remainder (the sign of the dividend).
    dtype = imp.dtype(a)
    remainder = imp.call("subtract", [a, imp.call("multiply", [imp.call("divide", [a, b]), b])])
    if fmod or dtype.startswith("uint"):
        return remainder
    # Python's modulo takes the divisor's sign: shift a non-zero remainder of the other sign by b.
    zero = imp.const(0, dtype)
    nonzero = imp.call("not_equal", [remainder, zero])
    signs_differ = imp.call("not_equal", [imp.call("less", [remainder, zero]), imp.call("less", [b, zero])])
    adjust = logical_and(imp, nonzero, signs_differ)
    return imp.call("where", [adjust, imp.call("add", [remainder, b]), remainder])


def _float_mod(imp: Importer, a: Expr, b: Expr, fmod: bool) -> Expr:
    """`a - trunc(a / b) * b` (fmod) or `a - floor(a / b) * b`, in float64 so the quotient's rounding cannot
    move the truncation; an infinite divisor leaves a finite dividend alone (or gives the divisor, for the
    floor form when the signs differ), as the ONNX definition says."""
    dtype = imp.dtype(a)
    wide_a, wide_b = imp.cast(a, "float64"), imp.cast(b, "float64")
    ratio = imp.call("divide", [wide_a, wide_b])
    quotient = _trunc(imp, ratio) if fmod else imp.call("floor", [ratio])
    remainder = imp.call("subtract", [wide_a, imp.call("multiply", [quotient, wide_b])])
    infinite_b = imp.call("equal", [imp.call("abs", [wide_b]), imp.const(np.inf, "float64")])
    finite_a = imp.call("less", [imp.call("abs", [wide_a]), imp.const(np.inf, "float64")])
    keep_a = wide_a
    if not fmod:
        zero = imp.const(0, "float64")
        signs_differ = imp.call("not_equal", [imp.call("less", [wide_a, zero]), imp.call("less", [wide_b, zero])])
        nonzero_a = imp.call("not_equal", [wide_a, zero])
        keep_a = imp.call("where", [logical_and(imp, signs_differ, nonzero_a), wide_b, wide_a])
    result = imp.call("where", [logical_and(imp, infinite_b, finite_a), keep_a, remainder])
    return imp.cast(result, dtype)


_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}


@converts("BitShift", newest=REVIEWED_OPSET)
def _bit_shift(imp: Importer, node: OnnxNode) -> Expr:
    x, shift = node.required(0), node.required(1)
    dtype = imp.dtype(x)
    if dtype not in _INT_BITS:
        raise OnnxModelError(f"BitShift needs integers, got {dtype}")
    direction = node.attr_str("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise OnnxModelError(f"direction {direction!r} (expected 'LEFT' or 'RIGHT')")
    bits = _INT_BITS[dtype]
    signed = not dtype.startswith("uint")
    zero = imp.const(0, dtype)
    shift = imp.cast(shift, dtype)
    # Shifts outside [0, bits) give what the sign fill alone gives; so does an arithmetic right shift by
    # bits - 1, which keeps 2 ** shift representable in the signed type.
    limit = bits - 1 if signed and direction == "RIGHT" else bits
    in_range = logical_and(imp, imp.call("greater_equal", [shift, zero]),
                           imp.call("less", [shift, imp.const(limit, dtype)]))
    safe_shift = imp.call("where", [in_range, shift, zero])
    unsigned = "u" + dtype if signed else dtype
    # A shift is a product or a flooring quotient by 2 ** shift; a left shift wraps like unsigned arithmetic.
    factor = imp.call("power", [imp.const(2, unsigned), imp.cast(safe_shift, unsigned)])
    if direction == "LEFT":
        shifted = imp.cast(imp.call("multiply", [imp.cast(x, unsigned), factor]), dtype)
        return imp.call("where", [in_range, shifted, zero])
    if not signed:
        return imp.call("where", [in_range, imp.call("divide", [x, factor]), zero])
    factor = imp.cast(factor, dtype)
    quotient = imp.call("divide", [x, factor])  # truncates toward zero; an arithmetic shift floors
    inexact = imp.call("not_equal", [imp.call("multiply", [quotient, factor]), x])
    negative = imp.call("less", [x, zero])
    floored = imp.call("where", [logical_and(imp, negative, inexact),
                                 imp.call("subtract", [quotient, imp.const(1, dtype)]), quotient])
    sign_fill = imp.call("where", [negative, imp.const(-1, dtype), zero])
    return imp.call("where", [in_range, floored, sign_fill])


@converts("BitwiseNot", newest=REVIEWED_OPSET)
def _bitwise_not(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    dtype = imp.dtype(x)
    if dtype not in _INT_BITS:
        raise OnnxModelError(f"BitwiseNot needs integers, got {dtype}")
    if dtype.startswith("uint"):  # ~x = max - x
        return imp.call("subtract", [imp.const(np.iinfo(dtype).max, dtype), x])
    return imp.call("subtract", [imp.call("negative", [x]), imp.const(1, dtype)])  # ~x = -x - 1 (two's complement)


# --- logic ----------------------------------------------------------------------------------------


def logical_and(imp: Importer, a: Expr, b: Expr) -> Expr:
    return imp.call("where", [a, b, imp.const(False, "bool")])


def logical_or(imp: Importer, a: Expr, b: Expr) -> Expr:
    return imp.call("where", [a, imp.const(True, "bool"), b])


def _as_bool(imp: Importer, x: Expr) -> Expr:
    return x if imp.dtype(x) == "bool" else imp.call("not_equal", [x, imp.const(0, imp.dtype(x))])


@converts("And", "Or", "Xor", newest=REVIEWED_OPSET)
def _logical_binary(imp: Importer, node: OnnxNode) -> Expr:
    a = _as_bool(imp, node.required(0))
    b = _as_bool(imp, legacy_broadcast(imp, node, node.required(0), node.required(1)))
    if node.op_type == "And":
        return logical_and(imp, a, b)
    if node.op_type == "Or":
        return logical_or(imp, a, b)
    return imp.call("not_equal", [a, b])


@converts("Not", newest=REVIEWED_OPSET)
def _logical_not(imp: Importer, node: OnnxNode) -> Expr:
    return imp.call("equal", [_as_bool(imp, node.required(0)), imp.const(False, "bool")])


@converts("IsNaN", newest=REVIEWED_OPSET)
def _is_nan(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    return imp.call("not_equal", [x, x])  # NaN is the only value unequal to itself


@converts("IsInf", newest=REVIEWED_OPSET)
def _is_inf(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    dtype = imp.dtype(x)
    positive = imp.call("equal", [x, imp.const(np.inf, dtype)])
    negative = imp.call("equal", [x, imp.const(-np.inf, dtype)])
    detect_positive = bool(node.attrs.get("detect_positive", 1))
    detect_negative = bool(node.attrs.get("detect_negative", 1))
    if detect_positive and detect_negative:
        return logical_or(imp, positive, negative)
    if detect_positive:
        return positive
    if detect_negative:
        return negative
    return imp.cast(imp.call("zeros_like", [x]), "bool")


# --- trigonometric and hyperbolic functions -------------------------------------------------------

_TRIG = {"Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan"}


@converts(*_TRIG, newest=REVIEWED_OPSET)
def _trig(imp: Importer, node: OnnxNode) -> Expr:
    return imp.call(_TRIG[node.op_type], [node.required(0)])



def _exp_pair(imp: Importer, x: Expr) -> tuple[Expr, Expr]:
    return imp.call("exp", [x]), imp.call("exp", [imp.call("negative", [x])])


@converts("Sinh", "Cosh", newest=REVIEWED_OPSET)
def _sinh_cosh(imp: Importer, node: OnnxNode) -> Expr:
    up, down = _exp_pair(imp, node.required(0))
    combined = imp.call("subtract" if node.op_type == "Sinh" else "add", [up, down])
    return imp.scalar_op("multiply", combined, 0.5)


@converts("Asinh", newest=REVIEWED_OPSET)
def _asinh(imp: Importer, node: OnnxNode) -> Expr:
    # sign(x) * log(|x| + sqrt(x^2 + 1)): the odd symmetry keeps negative arguments accurate.
    x = node.required(0)
    magnitude = imp.call("abs", [x])
    root = imp.call("sqrt", [imp.scalar_op("add", imp.call("multiply", [x, x]), 1.0)])
    value = imp.call("log", [imp.call("add", [magnitude, root])])
    negative = imp.call("less", [x, imp.const(0, imp.dtype(x))])
    return imp.call("where", [negative, imp.call("negative", [value]), value])


@converts("Acosh", newest=REVIEWED_OPSET)
def _acosh(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    root = imp.call("sqrt", [imp.scalar_op("subtract", imp.call("multiply", [x, x]), 1.0)])
    return imp.call("log", [imp.call("add", [x, root])])


@converts("Atanh", newest=REVIEWED_OPSET)
def _atanh(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    one = imp.const(1, imp.dtype(x))
    ratio = imp.call("divide", [imp.call("add", [one, x]), imp.call("subtract", [one, x])])
    return imp.scalar_op("multiply", imp.call("log", [ratio]), 0.5)


# --- activations ----------------------------------------------------------------------------------


def _softplus(imp: Importer, x: Expr) -> Expr:
    # max(x, 0) + log(1 + e^-|x|), which never overflows
    relu = imp.call("maximum", [x, imp.const(0, imp.dtype(x))])
    tail = imp.call("exp", [imp.call("negative", [imp.call("abs", [x])])])
    return imp.call("add", [relu, imp.call("log", [imp.scalar_op("add", tail, 1.0)])])


@converts("HardSwish", newest=REVIEWED_OPSET)
def _hard_swish(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    gate = imp.call("clip", [imp.scalar_op("add", imp.scalar_op("multiply", x, 1.0 / 6.0), 0.5)], a_min=0.0, a_max=1.0)
    return imp.call("multiply", [x, gate])


@converts("Mish", newest=REVIEWED_OPSET)
def _mish(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    return imp.call("multiply", [x, imp.call("tanh", [_softplus(imp, x)])])


@converts("Celu", newest=REVIEWED_OPSET)
def _celu(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    alpha = node.attr_float("alpha", 1.0)
    zero = imp.const(0, imp.dtype(x))
    negative = imp.scalar_op("multiply", imp.scalar_op("subtract", imp.call("exp", [
        imp.scalar_op("divide", x, alpha)]), 1.0), alpha)
    return imp.call("add", [imp.call("maximum", [x, zero]), imp.call("minimum", [negative, zero])])


@converts("Swish", newest=REVIEWED_OPSET)
def _swish(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    return imp.call("multiply", [x, imp.call("sigmoid", [imp.scalar_op("multiply", x, node.attr_float("alpha", 1.0))])])


@converts("ThresholdedRelu", newest=REVIEWED_OPSET)
def _thresholded_relu(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    above = imp.call("greater", [x, imp.const(node.attr_float("alpha", 1.0), imp.dtype(x))])
    return imp.call("where", [above, x, imp.call("zeros_like", [x])])


# --- reductions -----------------------------------------------------------------------------------


def reduce_axes(imp: Importer, node: OnnxNode, x: Expr) -> list[int] | None:
    """The axes an ONNX Reduce* node reduces (from its input or attribute); None: it is the identity."""
    rank = imp.rank(x)
    if node.input(1) is not None:
        axes: list[int] | None = imp.static_ints(node.input(1), "the axes input")
    else:
        axes = [int(a) for a in node.attrs["axes"]] if "axes" in node.attrs else None
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return None
        axes = list(range(rank))
    return sorted({normalize_axis(a, rank) for a in axes})


def _sum(imp: Importer, x: Expr, axes: list[int], keepdims: bool) -> Expr:
    return imp.call("sum", [x], axis=axes, keepdims=keepdims)


@converts("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
           newest=REVIEWED_OPSET)
def _reduce_composite(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    axes = reduce_axes(imp, node, x)
    keepdims = bool(node.attrs.get("keepdims", 1))
    op_type = node.op_type
    if axes is None:  # noop_with_empty_axes: the element-wise part only
        axes, keepdims = [], True
    dtype = imp.dtype(x)
    if op_type == "ReduceL1":
        return _sum(imp, imp.call("abs", [x]), axes, keepdims) if axes else imp.call("abs", [x])
    if op_type == "ReduceSumSquare":
        square = imp.call("multiply", [x, x])
        return _sum(imp, square, axes, keepdims) if axes else square
    if op_type == "ReduceL2":
        wide = x if is_float_dtype(dtype) else imp.cast(x, "float64")
        square = imp.call("multiply", [wide, wide])
        total = _sum(imp, square, axes, keepdims) if axes else square
        return imp.cast(imp.call("sqrt", [total]), dtype)
    if op_type == "ReduceLogSum":
        total = _sum(imp, x, axes, keepdims) if axes else x
        return imp.call("log", [total])
    # ReduceLogSumExp: shifted by the maximum so exp cannot overflow (unless an axis is empty: -inf then).
    shape = imp.shape(x)
    if not axes:
        return x
    if any(shape[a] == 0 for a in axes):
        return imp.call("log", [_sum(imp, imp.call("exp", [x]), axes, keepdims)])
    peak = imp.call("max", [x], axis=axes, keepdims=True)
    # An all -inf row has -inf for its maximum; shifting by 0 there keeps exp finite (the sum is 0, log -inf).
    finite_peak = imp.call("where", [imp.call("equal", [peak, imp.const(-np.inf, dtype)]), imp.const(0, dtype), peak])
    shifted = imp.call("exp", [imp.call("subtract", [x, finite_peak])])
    out = imp.call("add", [imp.call("log", [_sum(imp, shifted, axes, True)]), finite_peak])
    return out if keepdims else imp.call("squeeze", [out], axis=axes)


# --- normalisations -------------------------------------------------------------------------------


@converts("LpNormalization", newest=REVIEWED_OPSET)
def _lp_normalization(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    axis = normalize_axis(int(node.attrs.get("axis", -1)), imp.rank(x))
    p = int(node.attrs.get("p", 2))
    if p == 1:
        norm = _sum(imp, imp.call("abs", [x]), [axis], True)
    elif p == 2:
        norm = imp.call("sqrt", [_sum(imp, imp.call("multiply", [x, x]), [axis], True)])
    else:
        raise OnnxModelError(f"p={p} (LpNormalization defines p=1 and p=2)")
    # A zero norm gives zeros (as the ONNX reference does), not NaN.
    zero = imp.const(0, imp.dtype(x))
    is_zero = imp.call("equal", [norm, zero])
    safe = imp.call("where", [is_zero, imp.const(1, imp.dtype(x)), norm])
    return imp.call("where", [is_zero, imp.call("zeros_like", [x]), imp.call("divide", [x, safe])])


def _normalize(imp: Importer, x: Expr, axes: list[int], epsilon: float) -> Expr:
    """(x - mean) / sqrt(var + epsilon) over `axes` (population variance)."""
    mean = imp.call("mean", [x], axis=axes, keepdims=True)
    centered = imp.call("subtract", [x, mean])
    var = imp.call("mean", [imp.call("multiply", [centered, centered])], axis=axes, keepdims=True)
    return imp.call("divide", [centered, imp.call("sqrt", [imp.scalar_op("add", var, epsilon)])])


def _stash_dtype(node: OnnxNode, dtype: str) -> str:
    """The dtype statistics are computed in (`stash_type` 1, the default, is float32)."""
    return "float32" if int(node.attrs.get("stash_type", 1)) == 1 and dtype == "float16" else dtype


@converts("GroupNormalization", newest=REVIEWED_OPSET)
def _group_normalization(imp: Importer, node: OnnxNode) -> Expr:
    x, scale, bias = node.required(0), node.required(1), node.required(2)
    shape = imp.static_shape(x, "the input of GroupNormalization")
    groups = int(node.attrs["num_groups"])
    n, channels = shape[0], shape[1]
    if groups <= 0 or channels % groups:
        raise OnnxModelError(f"num_groups {groups} does not divide the {channels} channels")
    dtype = imp.dtype(x)
    stash = _stash_dtype(node, dtype)
    grouped = imp.reshape(imp.cast(x, stash), [n, groups, math.prod(shape[1:]) // groups])
    normed = imp.reshape(_normalize(imp, grouped, [2], node.attr_float("epsilon", 1e-5)), list(shape))
    normed = imp.cast(normed, dtype)
    broadcast = [channels, *[1] * (len(shape) - 2)]

    def per_channel(param: Expr) -> Expr:
        count = imp.static_shape(param, "the scale / bias")[0]
        if count == groups and groups != channels:  # opset 18: one value per group
            repeated = imp.call("broadcast_to", [imp.reshape(param, [groups, 1])], shape=[groups, channels // groups])
            param = imp.reshape(repeated, [channels])
        return imp.reshape(imp.cast(param, dtype), broadcast)

    return imp.call("add", [imp.call("multiply", [normed, per_channel(scale)]), per_channel(bias)])


@converts("RMSNormalization", newest=REVIEWED_OPSET)
def _rms_normalization(imp: Importer, node: OnnxNode) -> Expr:
    x, scale = node.required(0), node.required(1)
    rank = imp.rank(x)
    axis = normalize_axis(int(node.attrs.get("axis", -1)), rank)
    dtype = imp.dtype(x)
    stash = _stash_dtype(node, dtype)
    wide = imp.cast(x, stash)
    mean_square = imp.call("mean", [imp.call("multiply", [wide, wide])], axis=list(range(axis, rank)), keepdims=True)
    rms = imp.call("sqrt", [imp.scalar_op("add", mean_square, node.attr_float("epsilon", 1e-5))])
    normed = imp.cast(imp.call("divide", [wide, rms]), dtype)
    return imp.call("multiply", [normed, imp.cast(scale, dtype)])


# --- Lp pooling -----------------------------------------------------------------------------------


def _lp_power(imp: Importer, node: OnnxNode) -> tuple[Expr, float]:
    x = node.required(0)
    p = float(node.attrs.get("p", 2))
    if p <= 0:
        raise OnnxModelError(f"p={p} must be positive")
    return imp.scalar_op("power", imp.call("abs", [x]), p), p


@converts("LpPool", newest=REVIEWED_OPSET)
def _lp_pool(imp: Importer, node: OnnxNode) -> Expr:
    """(sum of |x|^p over each window)^(1/p): an average pool counting the padding, times the window size."""
    powered, p = _lp_power(imp, node)
    attrs = {k: v for k, v in node.attrs.items() if k != "p"}
    attrs["count_include_pad"] = 1
    average = OnnxNode("AveragePool", node.name, [powered], node.input_names[:1], node.outputs[:1], attrs)
    pooled = CONVERTERS["AveragePool"](imp, average)
    assert isinstance(pooled, Expr)
    window = math.prod([int(k) for k in node.attrs["kernel_shape"]])
    return imp.scalar_op("power", imp.scalar_op("multiply", pooled, float(window)), 1.0 / p)


@converts("GlobalLpPool", newest=REVIEWED_OPSET)
def _global_lp_pool(imp: Importer, node: OnnxNode) -> Expr:
    powered, p = _lp_power(imp, node)
    total = _sum(imp, powered, list(range(2, imp.rank(powered))), True)
    return imp.scalar_op("power", total, 1.0 / p)
