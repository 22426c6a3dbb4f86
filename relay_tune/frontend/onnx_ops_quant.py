"""ONNX converters for linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, the
integer products MatMulInteger and ConvInteger, QLinearMatMul and QLinearConv, and the com.microsoft operators
onnxruntime's quantizer emits (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat,
QLinearGlobalAveragePool, QGemm, DynamicQuantizeMatMul, MatMulIntegerToFloat).

All are compositions of existing Relay operators:

- quantizing is `clip(round(x / scale) + zero_point, lo, hi)` cast to the quantized type, where `round` rounds
  half to even and `lo, hi` is the range of the quantized integer type, derived from the dtype's name
  (`int8`, `uint16`, `int4`, ...) so every integer dtype Relay knows is covered;
- dequantizing is `(x - zero_point) * scale`;
- per-axis parameters are reshaped to broadcast along the axis, blocked ones are repeated `block_size` times
  along it (and cut to the axis' length);
- integer products subtract the zero points in int32 and run the ordinary `nn.dense` / `nn.batch_matmul` /
  `nn.conv2d` on int32 operands: those accumulate in int32, so the int32 results are exact (and wrap on
  overflow as onnxruntime's do). The QLinear operators requantize that int32 result in float32, as onnxruntime
  does.

Quantization to the float8 and 4-bit float types divides by the scale, adds the zero point and converts, the
conversion rounding to nearest even and saturating as `saturate` says.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from relay_tune.errors import UnsupportedError
from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode, normalize_axis, relay_dtype
from relay_tune.frontend.onnx_ops_recurrent import LSTM_PANEL, in_layout, lstm_loop, lstm_shape
from relay_tune.frontend.onnx_registry import CONVERTERS, REVIEWED_OPSET, converts
from relay_tune.ir.dtypes import LOW_PRECISION_FLOAT_DTYPES
from relay_tune.ir.expr import Constant, Expr, Tuple
from relay_tune.op.recurrent import LSTM_SEQUENCE_INT8, pack_int8_recurrent_weights

MICROSOFT = "com.microsoft"
_INTEGER_DTYPE = re.compile(r"(u?)int(\d+)")


def integer_range(dtype: str) -> tuple[int, int]:
    """The smallest and largest value of the integer dtype `dtype` (`int8` -> (-128, 127), `uint4` -> (0, 15))."""
    match = _INTEGER_DTYPE.fullmatch(dtype)
    if match is None:
        raise UnsupportedError(f"quantization to {dtype} (integer types are supported)")
    bits = int(match.group(2))
    if match.group(1):
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _is_integer(dtype: str) -> bool:
    return _INTEGER_DTYPE.fullmatch(dtype) is not None


# --- quantization parameters ----------------------------------------------------------------------


def broadcast_param(imp: Importer, value: Expr, x_shape: Sequence[int], axis: int, block_size: int,
                    what: str) -> Expr:
    """A scale or zero point reshaped to broadcast against a tensor of shape `x_shape`: a scalar (or a
    one-element vector) as a scalar, a vector along `axis` (per-axis), or a blocked tensor whose `axis`
    holds one entry per `block_size` elements, repeated to the full extent."""
    shape = imp.static_shape(value, what)
    rank = len(x_shape)
    if math.prod(shape) == 1 and len(shape) <= 1:
        return imp.reshape(value, [])
    if rank == 0:
        raise OnnxModelError(f"{what} of shape {shape} for a scalar input (a single value is expected)")
    axis = normalize_axis(axis, rank)
    extent = x_shape[axis]
    if block_size <= 0:
        if len(shape) != 1 or shape[0] != extent:
            raise OnnxModelError(
                f"{what} has shape {shape}; per-axis quantization along axis {axis} of a tensor of shape "
                f"{tuple(x_shape)} needs a vector of {extent} values (or give block_size for blocked quantization)")
        return imp.reshape(value, [extent if d == axis else 1 for d in range(rank)])
    blocks = -(-extent // block_size)
    expected = tuple(blocks if d == axis else x_shape[d] for d in range(rank))
    if tuple(shape) != expected:
        raise OnnxModelError(
            f"{what} has shape {shape}; blocked quantization of a tensor of shape {tuple(x_shape)} along axis "
            f"{axis} with block_size {block_size} needs shape {expected}")
    if isinstance(value, Constant):
        return Constant(np.ascontiguousarray(np.repeat(value.data, block_size, axis=axis).take(
            range(extent), axis=axis)))
    # (..., blocks, ...) -> (..., blocks, block_size, ...) -> (..., blocks * block_size, ...) -> cut to extent
    split = [*shape[:axis + 1], 1, *shape[axis + 1:]]
    repeated = imp.call("broadcast_to", [imp.reshape(value, split)],
                        shape=[*shape[:axis + 1], block_size, *shape[axis + 1:]])
    flat = imp.reshape(repeated, [*shape[:axis], blocks * block_size, *shape[axis + 1:]])
    if blocks * block_size == extent:
        return flat
    return imp.call("strided_slice", [flat], begin=[0], end=[extent], axes=[axis])


def quantize(imp: Importer, x: Expr, scale: Expr, zero_point: Expr | None, qdtype: str,
             compute_dtype: str = "float32") -> Expr:
    """`saturate(round(x / scale) + zero_point)` as `qdtype`, dividing in `compute_dtype`; `scale` and
    `zero_point` already broadcast against `x`."""
    lo, hi = integer_range(qdtype)
    q = imp.call("round", [imp.call("divide", [imp.cast(x, compute_dtype), imp.cast(scale, compute_dtype)])])
    # float16 holds neither every 16-bit zero point nor the uint16 range: add and saturate in float32
    q = imp.cast(q, "float64" if compute_dtype == "float64" else "float32")
    compute_dtype = imp.dtype(q)
    if zero_point is not None:
        q = imp.call("add", [q, imp.cast(zero_point, compute_dtype)])
    return imp.cast(imp.call("clip", [q], a_min=float(lo), a_max=float(hi)), qdtype)


def dequantize(imp: Importer, x: Expr, scale: Expr, zero_point: Expr | None, out_dtype: str = "float32") -> Expr:
    """`(x - zero_point) * scale` as `out_dtype`, computed in float32 (float64 for 32-bit integers, whose
    values float32 does not hold exactly)."""
    compute = "float64" if _is_integer(imp.dtype(x)) and np.dtype(imp.dtype(x)).itemsize >= 4 else "float32"
    value = imp.cast(x, compute)
    if zero_point is not None:
        value = imp.call("subtract", [value, imp.cast(zero_point, compute)])
    return imp.cast(imp.call("multiply", [value, imp.cast(scale, compute)]), out_dtype)


def _quantized_dtype(imp: Importer, node: OnnxNode, zero_point: Expr | None) -> str:
    """The quantized type of a QuantizeLinear: its zero point's, else `output_dtype`'s, else uint8."""
    attr = int(node.attrs.get("output_dtype", 0))
    named = relay_dtype(attr, "QuantizeLinear output_dtype") if attr else None
    if zero_point is not None:
        dtype = imp.dtype(zero_point)
        if named is not None and named != dtype:
            raise OnnxModelError(f"output_dtype {named} differs from the zero point's type {dtype}")
        return dtype
    return named or "uint8"


def _params(imp: Importer, node: OnnxNode, x: Expr, what: str) -> tuple[Expr, Expr | None]:
    """The scale and zero point (inputs 1 and 2) of a Quantize/DequantizeLinear, broadcast against `x`."""
    x_shape = imp.static_shape(x, f"the input of {what}")
    axis = int(node.attrs.get("axis", 1))
    block_size = int(node.attrs.get("block_size", 0))
    scale = broadcast_param(imp, node.required(1), x_shape, axis, block_size, "the scale")
    zero = node.input(2)
    if zero is not None:
        zero = broadcast_param(imp, zero, x_shape, axis, block_size, "the zero point")
    return scale, zero


def _float_dtype(*dtypes: str) -> str:
    """The floating-point type numpy computes `a / b` in for operands of `dtypes`."""
    result = np.result_type(*[np.dtype(d) for d in dtypes])
    return str(result) if result.kind == "f" else "float64"


# --- ONNX operators -------------------------------------------------------------------------------


@converts("QuantizeLinear", newest=REVIEWED_OPSET)
def _quantize_linear(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    qdtype = _quantized_dtype(imp, node, node.input(2))
    if not _is_integer(qdtype) and qdtype not in LOW_PRECISION_FLOAT_DTYPES:
        raise UnsupportedError(f"QuantizeLinear to {qdtype} (integer and 8- or 4-bit float types are supported)")
    scale, zero = _params(imp, node, x, "QuantizeLinear")
    precision = int(node.attrs.get("precision", 0))
    compute = (relay_dtype(precision, "QuantizeLinear precision") if precision
               else _float_dtype(imp.dtype(x), imp.dtype(node.required(1))))
    if qdtype in LOW_PRECISION_FLOAT_DTYPES:
        # to a float type: no rounding step of its own, the conversion rounds (to nearest even) and saturates
        # as the `saturate` attribute says
        q = imp.call("divide", [imp.cast(x, compute), imp.cast(scale, compute)])
        if zero is not None:
            q = imp.call("add", [q, imp.cast(zero, compute)])
        return imp.cast(q, qdtype, saturate=bool(int(node.attrs.get("saturate", 1))))
    return quantize(imp, x, scale, zero, qdtype, compute)


@converts("DequantizeLinear", newest=REVIEWED_OPSET)
def _dequantize_linear(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    if not _is_integer(imp.dtype(x)) and imp.dtype(x) not in LOW_PRECISION_FLOAT_DTYPES:
        raise UnsupportedError(f"DequantizeLinear of {imp.dtype(x)} (integer and 8- or 4-bit float types are "
                               "supported)")
    scale, zero = _params(imp, node, x, "DequantizeLinear")
    attr = int(node.attrs.get("output_dtype", 0))
    out = relay_dtype(attr, "DequantizeLinear output_dtype") if attr else imp.dtype(node.required(1))
    return dequantize(imp, x, scale, zero, out)


def _element(imp: Importer, vector: Expr, index: int) -> Expr:
    """Element `index` of a 1-D tensor, as a scalar."""
    return imp.reshape(imp.call("strided_slice", [vector], begin=[index], end=[index + 1], axes=[0]), [])


def dynamic_quantize(imp: Importer, x: Expr) -> tuple[Expr, Expr, Expr]:
    """DynamicQuantizeLinear of float32 `x`: uint8 values, the float32 scale and the uint8 zero point. The range
    `[min(x, 0), max(x, 0)]` maps onto [0, 255] (a scale of 1/255 when it is empty, all of x being 0)."""
    x = imp.cast(x, "float32")
    zero = imp.const(0.0, "float32")
    # both ends in one pass over x (`min_max`: one kernel instead of a `min` and a `max` reduction)
    ends = imp.call("min_max", [x])
    high = imp.call("maximum", [_element(imp, ends, 1), zero])
    low = imp.call("minimum", [_element(imp, ends, 0), zero])
    span = imp.call("subtract", [high, low])
    span = imp.call("where", [imp.call("equal", [span, zero]), imp.const(1.0, "float32"), span])
    scale = imp.call("divide", [span, imp.const(255.0, "float32")])
    # the zero point is the saturated, rounded image of 0
    zero_point = imp.call("round", [imp.call("clip", [imp.call("negative", [imp.call("divide", [low, scale])])],
                                             a_min=0.0, a_max=255.0)])
    y = quantize(imp, x, scale, zero_point, "uint8")
    return y, scale, imp.cast(zero_point, "uint8")


@converts("DynamicQuantizeLinear", newest=REVIEWED_OPSET)
def _dynamic_quantize_linear(imp: Importer, node: OnnxNode) -> list[Expr]:
    x = node.required(0)
    if imp.dtype(x) != "float32":
        raise OnnxModelError(f"DynamicQuantizeLinear takes float32, got {imp.dtype(x)}")
    return list(dynamic_quantize(imp, x))


def _as_int32(imp: Importer, x: Expr, zero_point: Expr | None) -> Expr:
    """`x - zero_point` in int32 (`zero_point` already broadcast against `x`)."""
    if not _is_integer(imp.dtype(x)):
        raise OnnxModelError(f"an integer operand is expected, got {imp.dtype(x)}")
    value = imp.cast(x, "int32")
    if zero_point is None:
        return value
    return imp.call("subtract", [value, imp.cast(zero_point, "int32")])


def _optional(value: Expr | None, convert: Callable[[Expr], Expr]) -> Expr | None:
    return None if value is None else convert(value)


def _row_param(imp: Importer, value: Expr, a: Expr, what: str) -> Expr:
    """A per-tensor or per-row parameter of the left operand `a (..., M, K)`, broadcast against it: a vector
    of M values becomes `(M, 1)`; a tensor of a's rank is used as it is."""
    shape = imp.static_shape(value, what)
    if math.prod(shape) == 1 and len(shape) <= 1:
        return imp.reshape(value, [])
    if len(shape) == 1:
        rows = imp.static_shape(a, "the left operand")[-2] if imp.rank(a) >= 2 else 1
        if shape[0] != rows:
            raise OnnxModelError(f"{what} has {shape[0]} values; the left operand has {rows} rows")
        return imp.reshape(value, [rows, 1])
    return value


def _column_param(imp: Importer, value: Expr, b: Expr, what: str) -> Expr:
    """A per-tensor or per-column parameter of the right operand `b (..., K, N)`, broadcast against it."""
    shape = imp.static_shape(value, what)
    if math.prod(shape) == 1 and len(shape) <= 1:
        return imp.reshape(value, [])
    columns = imp.static_shape(b, "the right operand")[-1]
    if len(shape) == 1 and shape[0] != columns:
        raise OnnxModelError(f"{what} has {shape[0]} values; the right operand has {columns} columns")
    return value


def _sub_node(node: OnnxNode, op_type: str, inputs: list[Expr | None], **attrs: object) -> OnnxNode:
    return OnnxNode(op_type=op_type, name=node.name, inputs=inputs, input_names=[""] * len(inputs),
                    outputs=node.outputs[:1], attrs=attrs)


def integer_matmul(imp: Importer, node: OnnxNode, a: Expr, b: Expr, a_zero: Expr | None,
                   b_zero: Expr | None) -> Expr:
    """`(a - a_zero) @ (b - b_zero)` in int32, numpy matmul broadcasting; per-row `a_zero`, per-column
    `b_zero`."""
    a32 = _as_int32(imp, a, _optional(a_zero, lambda v: _row_param(imp, v, a, "the zero point of A")))
    b32 = _as_int32(imp, b, _optional(b_zero, lambda v: _column_param(imp, v, b, "the zero point of B")))
    out = CONVERTERS["MatMul"](imp, _sub_node(node, "MatMul", [a32, b32]))
    assert isinstance(out, Expr)
    return out


def _conv_weight_param(imp: Importer, value: Expr, w: Expr, what: str) -> Expr:
    """A per-tensor or per-output-channel parameter of a convolution weight `(M, C/group, k...)`, broadcast
    against it."""
    shape = imp.static_shape(value, what)
    if math.prod(shape) == 1 and len(shape) <= 1:
        return imp.reshape(value, [])
    w_shape = imp.static_shape(w, "the weight")
    if len(shape) != 1 or shape[0] != w_shape[0]:
        raise OnnxModelError(f"{what} has shape {shape}; per-channel values need one per output channel "
                             f"({w_shape[0]})")
    return imp.reshape(value, [w_shape[0], *[1] * (len(w_shape) - 1)])


def _scalar_param(imp: Importer, value: Expr, what: str) -> Expr:
    shape = imp.static_shape(value, what)
    if math.prod(shape) != 1:
        raise OnnxModelError(f"{what} must be a single value, got shape {shape}")
    return imp.reshape(value, [])


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def integer_conv(imp: Importer, node: OnnxNode, x: Expr, w: Expr, x_zero: Expr | None,
                 w_zero: Expr | None) -> Expr:
    """The convolution of `x - x_zero` with `w - w_zero` in int32 (padding with `x_zero`, as ONNX says); a
    per-output-channel `w_zero` is allowed."""
    x32 = _as_int32(imp, x, _optional(x_zero, lambda v: _scalar_param(imp, v, "the zero point of x")))
    w32 = _as_int32(imp, w, _optional(w_zero, lambda v: _conv_weight_param(imp, v, w, "the zero point of w")))
    attrs = {k: v for k, v in node.attrs.items() if k in _CONV_ATTRS}
    out = CONVERTERS["Conv"](imp, _sub_node(node, "Conv", [x32, w32], **attrs))
    assert isinstance(out, Expr)
    return out


@converts("MatMulInteger", newest=REVIEWED_OPSET)
def _matmul_integer(imp: Importer, node: OnnxNode) -> Expr:
    return integer_matmul(imp, node, node.required(0), node.required(1), node.input(2), node.input(3))


@converts("ConvInteger", newest=REVIEWED_OPSET)
def _conv_integer(imp: Importer, node: OnnxNode) -> Expr:
    return integer_conv(imp, node, node.required(0), node.required(1), node.input(2), node.input(3))


def requantize(imp: Importer, acc: Expr, multiplier: Expr, zero_point: Expr | None, qdtype: str) -> Expr:
    """`saturate(round(acc * multiplier) + zero_point)` as `qdtype`, in float32."""
    lo, hi = integer_range(qdtype)
    value = imp.call("round", [imp.call("multiply", [imp.cast(acc, "float32"), imp.cast(multiplier, "float32")])])
    if zero_point is not None:
        value = imp.call("add", [value, imp.cast(zero_point, "float32")])
    return imp.cast(imp.call("clip", [value], a_min=float(lo), a_max=float(hi)), qdtype)


def _product(imp: Importer, *factors: Expr) -> Expr:
    out = imp.cast(factors[0], "float32")
    for f in factors[1:]:
        out = imp.call("multiply", [out, imp.cast(f, "float32")])
    return out


def _output_dtype(imp: Importer, zero_point: Expr | None, fallback: Expr) -> str:
    dtype = imp.dtype(zero_point) if zero_point is not None else imp.dtype(fallback)
    if not _is_integer(dtype):
        raise UnsupportedError(f"quantized outputs of type {dtype} (integer types are supported)")
    return dtype


@converts("QLinearMatMul", newest=REVIEWED_OPSET)
def _qlinear_matmul(imp: Importer, node: OnnxNode) -> Expr:
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale = (node.required(i) for i in range(7))
    y_zero = node.input(7)
    acc = integer_matmul(imp, node, a, b, a_zero, b_zero)
    multiplier = imp.call("divide", [
        _product(imp, _row_param(imp, a_scale, a, "the scale of A"),
                 _column_param(imp, b_scale, b, "the scale of B")),
        imp.cast(_scalar_param(imp, y_scale, "the output scale"), "float32")])
    return requantize(imp, acc, multiplier, _optional(y_zero, lambda v: _scalar_param(imp, v, "the output zero point")),
                      _output_dtype(imp, y_zero, a))


def _channel_vector(imp: Importer, value: Expr, x: Expr) -> Expr:
    """A per-output-channel vector (or scalar) of a convolution, broadcast against its output `(N, M, d...)`."""
    shape = imp.static_shape(value, "a per-channel parameter")
    if math.prod(shape) == 1 and len(shape) <= 1:
        return imp.reshape(value, [])
    return imp.reshape(value, [shape[0], *[1] * (imp.rank(x) - 2)])


@converts("QLinearConv", newest=REVIEWED_OPSET)
def _qlinear_conv(imp: Importer, node: OnnxNode) -> Expr:
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale = (node.required(i) for i in range(7))
    y_zero, bias = node.input(7), node.input(8)
    acc = integer_conv(imp, node, x, w, x_zero, w_zero)
    if bias is not None:
        acc = imp.call("add", [acc, _channel_vector(imp, imp.cast(bias, "int32"), x)])
    _conv_weight_param(imp, w_scale, w, "the scale of w")  # checks its shape
    multiplier = imp.call("divide", [
        _product(imp, _scalar_param(imp, x_scale, "the scale of x"),
                 _channel_vector(imp, w_scale, x)),
        imp.cast(_scalar_param(imp, y_scale, "the output scale"), "float32")])
    return requantize(imp, acc, multiplier, _optional(y_zero, lambda v: _scalar_param(imp, v, "the output zero point")),
                      _output_dtype(imp, y_zero, x))


# --- com.microsoft operators ----------------------------------------------------------------------


def _dequantized(imp: Importer, node: OnnxNode, index: int) -> Expr:
    """Input `index` of a com.microsoft QLinear operator (followed by its scale and zero point) in float32."""
    x = node.required(index)
    if not _is_integer(imp.dtype(x)):
        raise OnnxModelError(f"input {index} must be an integer tensor, got {imp.dtype(x)}")
    scale = _scalar_param(imp, node.required(index + 1), f"the scale of input {index}")
    zero = _optional(node.input(index + 2), lambda v: _scalar_param(imp, v, f"the zero point of input {index}"))
    return dequantize(imp, x, scale, zero)


def _quantized(imp: Importer, node: OnnxNode, value: Expr, index: int, like: Expr) -> Expr:
    """`value` quantized with the scale and zero point at inputs `index`, `index + 1` (a missing zero point:
    0 of `like`'s type)."""
    scale = _scalar_param(imp, node.required(index), "the output scale")
    zero = _optional(node.input(index + 1), lambda v: _scalar_param(imp, v, "the output zero point"))
    return quantize(imp, value, scale, zero, _output_dtype(imp, zero, like))


_QLINEAR_BINARY = {"QLinearAdd": "add", "QLinearMul": "multiply"}


@converts(*(f"{MICROSOFT}.{name}" for name in _QLINEAR_BINARY))
def _qlinear_binary(imp: Importer, node: OnnxNode) -> Expr:
    value = imp.call(_QLINEAR_BINARY[node.op_type], [_dequantized(imp, node, 0), _dequantized(imp, node, 3)])
    return _quantized(imp, node, value, 6, node.required(0))


@converts(f"{MICROSOFT}.QLinearSigmoid")
def _qlinear_sigmoid(imp: Importer, node: OnnxNode) -> Expr:
    return _quantized(imp, node, imp.call("sigmoid", [_dequantized(imp, node, 0)]), 3, node.required(0))


@converts(f"{MICROSOFT}.QLinearLeakyRelu")
def _qlinear_leaky_relu(imp: Importer, node: OnnxNode) -> Expr:
    value = imp.call("nn.leaky_relu", [_dequantized(imp, node, 0)], alpha=node.attr_float("alpha", 0.01))
    return _quantized(imp, node, value, 3, node.required(0))


@converts(f"{MICROSOFT}.QLinearConcat")
def _qlinear_concat(imp: Importer, node: OnnxNode) -> Expr:
    """Inputs: Y_scale, Y_zero_point, then (tensor, scale, zero point) per operand."""
    if len(node.inputs) < 5 or (len(node.inputs) - 2) % 3:
        raise OnnxModelError(f"QLinearConcat takes Y_scale, Y_zero_point and triples of (tensor, scale, zero "
                             f"point), got {len(node.inputs)} inputs")
    first = node.required(2)
    axis = normalize_axis(int(node.attrs["axis"]), imp.rank(first))
    parts = [_dequantized(imp, node, i) for i in range(2, len(node.inputs), 3)]
    joined = imp.call("concatenate", [Tuple(tuple(parts))], axis=axis)
    return _quantized(imp, node, joined, 0, first)


@converts(f"{MICROSOFT}.QLinearGlobalAveragePool")
def _qlinear_global_average_pool(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    rank = imp.rank(x)
    if rank < 3:
        raise OnnxModelError(f"QLinearGlobalAveragePool needs an input of rank >= 3, got rank {rank}")
    spatial = list(range(1, rank - 1)) if int(node.attrs.get("channels_last", 0)) else list(range(2, rank))
    mean = imp.call("mean", [_dequantized(imp, node, 0)], axis=spatial, keepdims=True)
    return _quantized(imp, node, mean, 3, x)


def _float_matmul_result(imp: Importer, acc: Expr, scale: Expr, bias: Expr | None) -> Expr:
    out = imp.call("multiply", [imp.cast(acc, "float32"), scale])
    return out if bias is None else imp.call("add", [out, imp.cast(bias, "float32")])


@converts(f"{MICROSOFT}.MatMulIntegerToFloat")
def _matmul_integer_to_float(imp: Importer, node: OnnxNode) -> Expr:
    """Inputs: A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias; a float32 result."""
    a, b = node.required(0), node.required(1)
    acc = integer_matmul(imp, node, a, b, node.input(4), node.input(5))
    scale = _product(imp, _row_param(imp, node.required(2), a, "the scale of A"),
                     _column_param(imp, node.required(3), b, "the scale of B"))
    return _float_matmul_result(imp, acc, scale, node.input(6))


@converts(f"{MICROSOFT}.DynamicQuantizeMatMul")
def _dynamic_quantize_matmul(imp: Importer, node: OnnxNode) -> Expr:
    """Inputs: A (float32, quantized to uint8 at run time as DynamicQuantizeLinear does), B, b_scale,
    b_zero_point, bias; a float32 result."""
    a, b = node.required(0), node.required(1)
    qa, a_scale, a_zero = dynamic_quantize(imp, a)
    acc = integer_matmul(imp, node, qa, b, a_zero, node.input(3))
    scale = _product(imp, a_scale, _column_param(imp, node.required(2), b, "the scale of B"))
    return _float_matmul_result(imp, acc, scale, node.input(4))


@converts(f"{MICROSOFT}.QGemm")
def _qgemm(imp: Importer, node: OnnxNode) -> Expr:
    """Inputs: A, a_scale, a_zero_point, B, b_scale, b_zero_point, C (int32, scaled as a_scale * b_scale),
    y_scale, y_zero_point. `alpha * (A' B' + C)` dequantized; quantized again when y_scale is given."""
    a, a_scale, a_zero, b, b_scale, b_zero = (node.required(i) for i in range(6))
    bias, y_scale, y_zero = node.input(6), node.input(7), node.input(8)
    if imp.rank(a) != 2 or imp.rank(b) != 2:
        raise OnnxModelError("QGemm operands must be 2-D")
    if int(node.attrs.get("transA", 0)):
        a = imp.call("transpose", [a], axes=[1, 0])
    if int(node.attrs.get("transB", 0)):
        b = imp.call("transpose", [b], axes=[1, 0])
    acc = integer_matmul(imp, node, a, b, _scalar_param(imp, a_zero, "the zero point of A"), b_zero)
    if bias is not None:
        acc = imp.call("add", [acc, imp.cast(bias, "int32")])
    scale = _product(imp, _scalar_param(imp, a_scale, "the scale of A"),
                     _column_param(imp, b_scale, b, "the scale of B"),
                     imp.const(node.attr_float("alpha", 1.0), "float32"))
    if y_scale is None:
        return imp.call("multiply", [imp.cast(acc, "float32"), scale])
    multiplier = imp.call("divide", [scale, imp.cast(_scalar_param(imp, y_scale, "the output scale"),
                                                     "float32")])
    return requantize(imp, acc, multiplier, _optional(y_zero, lambda v: _scalar_param(imp, v, "the output zero point")),
                      _output_dtype(imp, y_zero, a))


__all__ = ["MICROSOFT", "broadcast_param", "dequantize", "dynamic_quantize", "integer_range", "quantize"]


def _int8_lstm(imp: Importer, node: OnnxNode) -> list[Expr] | None:
    """DynamicQuantizeLSTM on its integers, as onnxruntime computes it: the input projection of every step as one
    product of X quantized to uint8 (DynamicQuantizeLinear over the whole input) and W's int8 values, the steps
    as one `nn.lstm_sequence_int8` (the state quantized to uint8 per step, R's int8 values). None where that does
    not apply: weights or scales not constants, a weight zero point other than 0, or a layer that does not fit
    the looped kernel (`onnx_ops_recurrent.lstm_shape`)."""
    w, r = node.required(1), node.required(2)
    params = [node.input(i) for i in (8, 9, 10, 11)]
    if not all(isinstance(v, Constant) for v in (w, r, params[0], params[2])):
        return None
    if any(z is not None and (not isinstance(z, Constant) or np.any(z.data != 0)) for z in (params[1], params[3])):
        return None
    assert isinstance(w, Constant) and isinstance(r, Constant)
    if w.data.dtype != np.int8 or r.data.dtype != np.int8 or r.data.ndim != 3 or w.data.ndim != 3:
        return None
    directions, hidden, gates = r.data.shape
    if gates != 4 * hidden or int(node.attrs.get("hidden_size", hidden)) != hidden:
        return None  # the float path reports the mismatch
    shape = lstm_shape(imp, node, hidden)
    if not shape.loop_fits or len(shape.reverse) != directions \
            or w.data.shape != (directions, imp.static_shape(shape.x2d)[1], gates):
        return None

    def column_scales(scale: Expr) -> np.ndarray | None:
        """A weight's scales per direction and column; None unless given per direction or per direction and
        column."""
        assert isinstance(scale, Constant)
        values = np.asarray(scale.data, np.float32)
        if values.size not in (directions, directions * gates):
            return None
        return np.broadcast_to(values.reshape(directions, -1), (directions, gates))

    w_scale, r_scales = column_scales(params[0]), column_scales(params[2])
    if w_scale is None or r_scales is None:
        return None

    # the projection: (seq * batch, input) x (input, directions * 4H), X quantized once for every direction
    qx, x_scale, x_zero = dynamic_quantize(imp, shape.x2d)
    w_all = np.ascontiguousarray(w.data.transpose(1, 0, 2).reshape(w.data.shape[1], directions * gates))
    acc = integer_matmul(imp, node, qx, imp.const(w_all, "int8"), x_zero, None)
    proj = _float_matmul_result(imp, acc, _product(imp, x_scale, imp.const(w_scale.reshape(-1), "float32")), None)
    panel = min(LSTM_PANEL, gates)
    columns = -(-gates // panel) * panel
    r_scale = np.zeros((directions, columns), np.float32)
    r_scale[:, :gates] = r_scales
    r_sum = np.zeros((directions, columns), np.int32)
    r_sum[:, :gates] = r.data.astype(np.int32).sum(axis=1)
    weights = [imp.const(pack_int8_recurrent_weights(r.data, panel), "int8"), imp.const(r_scale, "float32"),
               imp.const(r_sum, "int32")]
    looped = lstm_loop(imp, proj, node.input(3), LSTM_SEQUENCE_INT8, weights, shape.initial_h, shape.initial_c,
                       shape.seq, shape.batch, hidden, shape.reverse)
    return in_layout(imp, *looped, shape.layout)


@converts(f"{MICROSOFT}.DynamicQuantizeLSTM")
def _dynamic_quantize_lstm(imp: Importer, node: OnnxNode) -> list[Expr]:
    """onnxruntime's LSTM with int8 weights: `W (directions, input, 4*hidden)` and `R (directions, hidden,
    4*hidden)` with a scale and zero point per direction (or per direction and column), the other inputs and the
    attributes as LSTM's. A layer that fits the looped kernel runs on the integers as onnxruntime does
    (`_int8_lstm`); any other is the float LSTM of its dequantized weights (constants: folded at build time),
    which differs from onnxruntime's, which also quantizes the activations on the fly, by about that
    quantisation's error."""
    quantized = _int8_lstm(imp, node)
    if quantized is not None:
        return quantized
    weights = []
    for index, scale_index in ((1, 8), (2, 10)):
        q = node.required(index)
        shape = imp.static_shape(q, f"DynamicQuantizeLSTM input {index}")
        scale, zero = node.required(scale_index), node.input(scale_index + 1)
        columns = [shape[0], 1, shape[2]] if len(imp.static_shape(scale, "a weight scale")) == 2 else [shape[0], 1, 1]
        scale = imp.reshape(scale, columns)
        zero = imp.reshape(zero, columns) if zero is not None else None
        weights.append(imp.call("transpose", [dequantize(imp, q, scale, zero)], axes=[0, 2, 1]))
    inputs = [node.required(0), *weights, *[node.input(i) for i in range(3, 8)]]
    lstm = OnnxNode(op_type="LSTM", name=node.name, inputs=inputs, input_names=node.input_names[:8],
                    outputs=node.outputs, attrs=node.attrs, scope=node.scope)
    return CONVERTERS["LSTM"](imp, lstm)
