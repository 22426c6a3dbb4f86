"""Import ONNX models (default-domain opsets 6 to the newest of the installed onnx package) into a Relay module.

    mod, params = from_onnx("model.onnx")                      # or an onnx.ModelProto
    mod, params = from_onnx(model, shape_overrides={"input": (1, 3, 224, 224)})

How the import works
--------------------
1. Every operator type of the graph is checked against the converter table first: a model using
   operators relay-tune cannot import fails at once with one `UnsupportedOperatorsError` listing each
   of them with its count, before any tensor is read. Then each node's operator version (the newest
   definition at the model's opset) is checked against the newest version its converter was written
   for: a newer definition fails with a message naming the node.
2. Graph inputs become the parameters of `@main` (named as in the model; dimensions that are
   symbolic or unknown become `?` unless `shape_overrides` gives them). Initializers become
   `Constant` nodes, so the module is self-contained.
3. Nodes are converted in graph order. A converter maps one ONNX node onto Relay operator calls,
   reading what it needs (ranks, static shapes, the values of shape/axes inputs) from the types
   computed as the graph is built: each call's type comes from its operator's type relation at once,
   so shape errors name the ONNX node at fault.
4. A call whose arguments are all constants is evaluated on the spot with the operator's numpy
   reference (constant folding). That is what makes the shape arithmetic exporters emit
   (`Shape -> Gather -> Concat -> Reshape`) static, and it pre-transposes weights for `Gemm`/`MatMul`.

Operators beyond the core ones convert in their own modules, each registering its converters in the table of
`relay_tune.frontend.onnx_registry` when imported (this module imports them all): image operators, Range,
Trilu, CumSum, CumProd and OneHot (`onnx_image`), element-wise math, logic and normalisations (`onnx_ops_math`),
arg reductions, TopK, gathers, scatters and Einsum (`onnx_ops_index`), losses (`onnx_ops_loss`), Attention,
FlexAttention and RotaryEmbedding (`onnx_ops_attention`), SwiGLU, TensorScatter, CausalConvWithState and
LinearAttention (`onnx_ops_transformer`), bitwise operators, Det, MeanVarianceNormalization, ReverseSequence,
AffineGrid, Col2Im, MaxUnpool and the data-dependent NonZero, Unique, NonMaxSuppression and Compress
(`onnx_ops_misc`), windows, DFT and STFT (`onnx_ops_signal`), linear quantization: QuantizeLinear,
DequantizeLinear, the QLinear and Integer operators and the com.microsoft ones onnxruntime's quantizer emits
(`onnx_ops_quant`), RNN, GRU and LSTM unrolled over the sequence (`onnx_ops_recurrent`), If, Loop and Scan resolved
at import time (`onnx_control_flow`). Most are compositions of existing Relay operators. Nodes of another domain
than the default one convert when a converter is registered as `DOMAIN.OpType`. The node walk itself
(`onnx_graph`) also converts the subgraphs of control-flow nodes, which see the names of their enclosing graphs,
and those that FlexAttention inlines.

`params` maps `const_0, const_1, ...` to the values of `meta[relay.Constant][0], [1], ...` in the
text `relay_tune.text.print_module(mod)` writes: exactly what `relay-tune import` stores in
`model.params.npz` (see `relay_tune.frontend.params`). The module itself already holds these values,
so `relay_tune.build(mod, target)` needs no `params` (its `params` bind inputs of `@main` by name).

ONNX semantics that differ from Relay's and are handled here: Softmax/LogSoftmax before opset 13
(coerce to 2-D at `axis`), pooling `ceil_mode` (a last window starting in the end padding is
dropped), LRN with an even `size` (window `[c - (size-1)//2, c + size//2]`), negative Gather
indices, Slice clamping, `auto_pad`, legacy (opset < 7) `broadcast`/`axis` attributes, and 1-D/3-D
pooling (expressed with 2-D pooling on reshaped tensors).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from relay_tune.errors import RelayTuneError, UnsupportedError

# The converter modules register their converters in the table when imported.
from relay_tune.frontend import (  # noqa: F401
    onnx_control_flow,
    onnx_image,
    onnx_ops_attention,
    onnx_ops_index,
    onnx_ops_loss,
    onnx_ops_math,
    onnx_ops_misc,
    onnx_ops_quant,
    onnx_ops_recurrent,
    onnx_ops_signal,
    onnx_ops_transformer,
)
from relay_tune.frontend.onnx_graph import all_nodes, convert_nodes, convert_subgraph, initializer_values
from relay_tune.frontend.onnx_importer import (
    Importer,
    OnnxModelError,
    OnnxNode,
    batch_matmul,
    cast_options,
    flatten_2d,
    format_shape,
    is_empty,
    legacy_broadcast,
    normalize_axis,
    onnx_softmax,
    relay_dtype,
    restore_shape,
)
from relay_tune.frontend.onnx_registry import (
    BASE_OPSET,
    CONVERTERS,
    DEFAULT_DOMAINS,
    MAX_OPSET,
    MIN_OPSET,
    REVIEWED_OPSET,
    converter_key,
    converts,
    newest_version,
)
from relay_tune.frontend.params import params_dict
from relay_tune.ir.expr import Constant, Expr, Function, Tuple, Var
from relay_tune.ir.module import IRModule
from relay_tune.ir.types import ANY, Dim, TensorType, TupleType
from relay_tune.op._shape import broadcast_shapes
from relay_tune.op.registry import get_op
from relay_tune.text import print_module
from relay_tune.type_infer import infer_types

__all__ = [
    "BASE_OPSET", "MAX_OPSET", "MIN_OPSET", "REVIEWED_OPSET", "OnnxModelError", "UnsupportedOperatorsError",
    "from_onnx", "supported_ops",
]

_DEFAULT_DOMAINS = DEFAULT_DOMAINS


class UnsupportedOperatorsError(UnsupportedError):
    """The model uses operator types the importer does not know; `counts` maps each to its node count."""

    def __init__(self, counts: Mapping[str, int], first_nodes: Mapping[str, str] | None = None,
                 opset: int | None = None) -> None:
        self.counts = dict(counts)
        self.first_nodes = dict(first_nodes or {})  # operator type -> the first node using it, described
        self.opset = opset
        listing = ", ".join(
            f"{name} (x{n})" + (f" first at {self.first_nodes[name]}" if name in self.first_nodes else "")
            for name, n in sorted(self.counts.items()))
        total = len(self.counts)
        at_opset = f" at opset {opset}" if opset is not None else ""
        super().__init__(f"the ONNX model uses {total} unsupported operator type{'s' if total != 1 else ''}"
                         f"{at_opset}: {listing}")


# ================================================================================================
# Converters
# ================================================================================================


def supported_ops() -> list[str]:
    """The ONNX operator types the importer converts: default-domain ones by name, others as `DOMAIN.OpType`."""
    return sorted(CONVERTERS)


# --- element-wise -------------------------------------------------------------------------------

_UNARY = {
    "Relu": "nn.relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp", "Sqrt": "sqrt",
    "Log": "log", "Neg": "negative", "Abs": "abs", "Floor": "floor", "Ceil": "ceil", "Round": "round",
}


@converts(*_UNARY)
def _unary(imp: Importer, node: OnnxNode) -> Expr:
    return imp.call(_UNARY[node.op_type], [node.required(0)])


_BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Pow": "power",
    "Equal": "equal", "Less": "less", "Greater": "greater", "LessOrEqual": "less_equal",
    "GreaterOrEqual": "greater_equal",
}


@converts(*_BINARY)
def _binary(imp: Importer, node: OnnxNode) -> Expr:
    lhs, rhs = node.required(0), node.required(1)
    rhs = legacy_broadcast(imp, node, lhs, rhs)
    if node.op_type == "Pow":
        # The exponent may have its own dtype (since opset 12); the result has the base's.
        rhs = imp.cast(rhs, imp.dtype(lhs))
    return imp.call(_BINARY[node.op_type], [lhs, rhs])


@converts("Max", "Min", "Sum", "Mean")
def _variadic(imp: Importer, node: OnnxNode) -> Expr:
    operands = [x for x in node.inputs if x is not None]
    if not operands:
        raise OnnxModelError("needs at least one input")
    op_name = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[node.op_type]
    result = operands[0]
    for operand in operands[1:]:
        result = imp.call(op_name, [result, operand])
    if node.op_type == "Mean" and len(operands) > 1:
        result = imp.scalar_op("divide", result, len(operands))
    return result


@converts("Reciprocal")
def _reciprocal(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    return imp.call("divide", [imp.const(1, imp.dtype(x)), x])


@converts("Sign")
def _sign(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    dtype = imp.dtype(x)
    zero = imp.const(0, dtype)
    positive = imp.cast(imp.call("greater", [x, zero]), dtype)
    negative = imp.cast(imp.call("less", [x, zero]), dtype)
    return imp.call("subtract", [positive, negative])


@converts("Where")
def _where(imp: Importer, node: OnnxNode) -> Expr:
    return imp.call("where", [node.required(0), node.required(1), node.required(2)])


@converts("Cast")
def _cast(imp: Importer, node: OnnxNode) -> Expr:
    dtype = relay_dtype(int(node.attrs["to"]), "Cast target")
    return imp.cast(node.required(0), dtype, *cast_options(node))


@converts("BitCast", newest=REVIEWED_OPSET)
def _bitcast(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    dtype = relay_dtype(int(node.attrs["to"]), "BitCast target")
    return x if imp.dtype(x) == dtype else imp.call("reinterpret", [x], dtype=dtype)


@converts("Identity", "Dropout")
def _identity(imp: Importer, node: OnnxNode) -> Expr | list[Expr]:
    x = node.required(0)
    training = node.input(2)
    if node.op_type == "Dropout" and (training is not None or node.attrs.get("is_test", 1) == 0):
        if not isinstance(training, Constant) or bool(training.data.reshape(-1)[0]):
            raise UnsupportedError("training-mode Dropout (random masks); only inference is supported")
    if node.op_type == "Dropout" and node.output_used(1):
        # Inference: nothing is dropped, so the mask is all true.
        mask = imp.cast(imp.call("ones_like", [x]), "bool")
        return [x, mask]
    return x


# --- activations expressed with element-wise operators ------------------------------------------


@converts("LeakyRelu")
def _leaky_relu(imp: Importer, node: OnnxNode) -> Expr:
    return imp.call("nn.leaky_relu", [node.required(0)], alpha=node.attr_float("alpha", 0.01))


@converts("PRelu")
def _prelu(imp: Importer, node: OnnxNode) -> Expr:
    x, slope = node.required(0), node.required(1)
    slope = _legacy_unidirectional(imp, x, slope)
    positive = imp.call("greater", [x, imp.const(0, imp.dtype(x))])
    return imp.call("where", [positive, x, imp.call("multiply", [x, slope])])


def _legacy_unidirectional(imp: Importer, x: Expr, slope: Expr) -> Expr:
    """PRelu before opset 7 gave a per-channel slope as `(C,)` for any rank of x; align it with axis 1."""
    slope_shape = imp.shape(slope)
    rank = imp.rank(x)
    if imp.opset < 7 and len(slope_shape) == 1 and rank > 2 and slope_shape[0] != 1:
        return imp.reshape(slope, [int(slope_shape[0]), *[1] * (rank - 2)])  # type: ignore[call-overload]
    return slope


def _elu_core(imp: Importer, x: Expr, alpha: float) -> Expr:
    dtype = imp.dtype(x)
    negative_part = imp.scalar_op("multiply", imp.scalar_op("subtract", imp.call("exp", [x]), 1.0), alpha)
    return imp.call("where", [imp.call("greater", [x, imp.const(0, dtype)]), x, negative_part])


@converts("Elu")
def _elu(imp: Importer, node: OnnxNode) -> Expr:
    return _elu_core(imp, node.required(0), node.attr_float("alpha", 1.0))


@converts("Selu")
def _selu(imp: Importer, node: OnnxNode) -> Expr:
    alpha = node.attr_float("alpha", 1.67326319217681884765625)
    gamma = node.attr_float("gamma", 1.05070102214813232421875)
    return imp.scalar_op("multiply", _elu_core(imp, node.required(0), alpha), gamma)


@converts("Softplus")
def _softplus(imp: Importer, node: OnnxNode) -> Expr:
    # log(1 + e^x) computed as max(x, 0) + log(1 + e^-|x|), which never overflows.
    x = node.required(0)
    dtype = imp.dtype(x)
    relu = imp.call("maximum", [x, imp.const(0, dtype)])
    tail = imp.call("exp", [imp.call("negative", [imp.call("abs", [x])])])
    return imp.call("add", [relu, imp.call("log", [imp.scalar_op("add", tail, 1.0)])])


@converts("Softsign")
def _softsign(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    return imp.call("divide", [x, imp.scalar_op("add", imp.call("abs", [x]), 1.0)])


@converts("HardSigmoid")
def _hard_sigmoid(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    alpha, beta = node.attr_float("alpha", 0.2), node.attr_float("beta", 0.5)
    linear = imp.scalar_op("add", imp.scalar_op("multiply", x, alpha), beta)
    return imp.call("clip", [linear], a_min=0.0, a_max=1.0)


@converts("Shrink")
def _shrink(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    lambd, bias = node.attr_float("lambd", 0.5), node.attr_float("bias", 0.0)
    dtype = imp.dtype(x)
    below = imp.call("less", [x, imp.const(-lambd, dtype)])
    above = imp.call("greater", [x, imp.const(lambd, dtype)])
    zero = imp.call("zeros_like", [x])
    return imp.call("where", [below, imp.scalar_op("add", x, bias),
                              imp.call("where", [above, imp.scalar_op("subtract", x, bias), zero])])


@converts("Gelu")
def _gelu(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    approximate = node.attr_str("approximate", "none")
    if approximate == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = imp.call("multiply", [imp.call("multiply", [x, x]), x])
        inner = imp.scalar_op("multiply", imp.call("add", [x, imp.scalar_op("multiply", cube, 0.044715)]),
                              math.sqrt(2.0 / math.pi))
        gate = imp.scalar_op("add", imp.call("tanh", [inner]), 1.0)
    elif approximate == "none":
        # 0.5 x (1 + erf(x / sqrt(2)))
        gate = imp.scalar_op("add", imp.call("erf", [imp.scalar_op("multiply", x, 1.0 / math.sqrt(2.0))]), 1.0)
    else:
        raise UnsupportedError(f"approximate={approximate!r} (expected 'none' or 'tanh')")
    return imp.scalar_op("multiply", imp.call("multiply", [x, gate]), 0.5)


@converts("Clip")
def _clip(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    dtype = imp.dtype(x)
    if "min" in node.attrs or "max" in node.attrs or imp.opset < 11:
        low: Expr | None = imp.const(node.attrs["min"], dtype) if "min" in node.attrs else None
        high: Expr | None = imp.const(node.attrs["max"], dtype) if "max" in node.attrs else None
    else:
        low, high = node.input(1), node.input(2)
    if isinstance(low, Constant) and isinstance(high, Constant):
        return imp.call("clip", [x], a_min=low.data.item(), a_max=high.data.item())
    # One bound, or bounds computed at run time: maximum/minimum (a bound's shape is a scalar).
    if low is not None:
        x = imp.call("maximum", [x, imp.reshape(imp.cast(low, dtype), [])])
    if high is not None:
        x = imp.call("minimum", [x, imp.reshape(imp.cast(high, dtype), [])])
    return x


# --- softmax ------------------------------------------------------------------------------------


@converts("Softmax", "LogSoftmax")
def _softmax(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    rank = imp.rank(x)

    def normalise(data: Expr, axis: int) -> Expr:
        if node.op_type == "Softmax":
            return onnx_softmax(imp, data, axis)
        return imp.call("nn.log_softmax", [data], axis=axis)

    if imp.opset >= 13:
        return normalise(x, normalize_axis(int(node.attrs.get("axis", -1)), rank))
    # Before opset 13 the input is coerced to 2-D at `axis` and normalised over the whole second part.
    axis = normalize_axis(int(node.attrs.get("axis", 1)), rank)
    if axis == rank - 1:
        return normalise(x, axis)
    shape = imp.shape(x)
    return restore_shape(imp, normalise(flatten_2d(imp, x, axis), 1), shape)


# --- convolution --------------------------------------------------------------------------------


def _spatial_pads(
    node: OnnxNode, in_sizes: Sequence[Dim], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> tuple[list[int], list[int]]:
    """(pads before, pads after) per spatial axis from `pads` or `auto_pad`."""
    nsp = len(kernel)
    auto_pad = node.attr_str("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        pads = [int(p) for p in node.attrs.get("pads", [0] * (2 * nsp))]
        if len(pads) != 2 * nsp:
            raise OnnxModelError(f"pads {pads} must have {2 * nsp} values")
        return pads[:nsp], pads[nsp:]
    if auto_pad == "VALID":
        return [0] * nsp, [0] * nsp
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise OnnxModelError(f"unknown auto_pad {auto_pad!r}")
    before, after = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
        if not isinstance(size, int):
            raise UnsupportedError(f"auto_pad={auto_pad} on a dynamic spatial dimension")
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        # SAME_UPPER puts the odd extra pixel at the end, SAME_LOWER at the beginning.
        before.append(small if auto_pad == "SAME_UPPER" else large)
        after.append(large if auto_pad == "SAME_UPPER" else small)
    return before, after


def _ints_attr(node: OnnxNode, name: str, count: int, default: int = 1) -> list[int]:
    values = [int(v) for v in node.attrs.get(name, [default] * count)]
    if len(values) != count:
        raise OnnxModelError(f"{name} {values} must have {count} values")
    return values


_CONV_OPS = {1: ("nn.conv1d", "NCW", "OIW"), 2: ("nn.conv2d", "NCHW", "OIHW"), 3: ("nn.conv3d", "NCDHW", "OIDHW")}


@converts("Conv")
def _conv(imp: Importer, node: OnnxNode) -> Expr:
    x, w, bias = node.required(0), node.required(1), node.input(2)
    w_shape = imp.static_shape(w, "the weight")
    nsp = len(w_shape) - 2
    if nsp not in _CONV_OPS:
        raise UnsupportedError(f"{nsp}-D convolution (1-D, 2-D and 3-D are supported)")
    kernel = [int(k) for k in node.attrs.get("kernel_shape", w_shape[2:])]
    strides = _ints_attr(node, "strides", nsp)
    dilations = _ints_attr(node, "dilations", nsp)
    before, after = _spatial_pads(node, imp.shape(x)[2:], kernel, strides, dilations)
    op_name, data_layout, kernel_layout = _CONV_OPS[nsp]
    out = imp.call(
        op_name, [x, w], strides=strides, padding=[*before, *after], dilation=dilations,
        groups=int(node.attrs.get("group", 1)), channels=w_shape[0], kernel_size=kernel,
        data_layout=data_layout, kernel_layout=kernel_layout,
    )
    if bias is not None:
        out = imp.call("nn.bias_add", [out, bias], axis=1)
    return out


_CONV_TRANSPOSE_OPS = {1: ("nn.conv1d_transpose", "NCW", "IOW"), 2: ("nn.conv2d_transpose", "NCHW", "IOHW")}


@converts("ConvTranspose")
def _conv_transpose(imp: Importer, node: OnnxNode) -> Expr:
    x, w, bias = node.required(0), node.required(1), node.input(2)
    w_shape = imp.static_shape(w, "the weight")
    nsp = len(w_shape) - 2
    if nsp not in _CONV_TRANSPOSE_OPS:
        raise UnsupportedError(f"{nsp}-D transposed convolution (1-D and 2-D are supported)")
    groups = int(node.attrs.get("group", 1))
    kernel = [int(k) for k in node.attrs.get("kernel_shape", w_shape[2:])]
    strides = _ints_attr(node, "strides", nsp)
    dilations = _ints_attr(node, "dilations", nsp)
    output_padding = _ints_attr(node, "output_padding", nsp, 0)
    auto_pad = node.attr_str("auto_pad", "NOTSET")
    in_sizes = imp.shape(x)[2:]
    if "output_shape" in node.attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # The padding is whatever makes the output have the requested size (the input size times the
        # stride for SAME); the odd pixel goes at the end for SAME_UPPER, at the beginning otherwise.
        if not all(isinstance(d, int) for d in in_sizes):
            raise UnsupportedError("output_shape / auto_pad SAME on a dynamic spatial dimension")
        wanted = [int(v) for v in node.attrs.get("output_shape", [])][-nsp:] or [
            int(size) * s for size, s in zip(in_sizes, strides)  # type: ignore[call-overload]
        ]
        before, after = [], []
        for size, k, s, d, op_, out_size in zip(in_sizes, kernel, strides, dilations, output_padding, wanted):
            total = s * (int(size) - 1) + op_ + (k - 1) * d + 1 - out_size  # type: ignore[call-overload]
            if total < 0:  # an output larger than the full result grows at the end (onnxruntime, ONNX's cases)
                before.append(0)
                after.append(total)
            elif auto_pad == "SAME_UPPER":
                before.append(total // 2)
                after.append(total - total // 2)
            else:
                before.append(total - total // 2)
                after.append(total // 2)
    elif auto_pad == "VALID":
        before, after = [0] * nsp, [0] * nsp
    else:
        before, after = _spatial_pads(node, in_sizes, kernel, strides, dilations)
    op_name, data_layout, kernel_layout = _CONV_TRANSPOSE_OPS[nsp]
    # A negative pad (an output_shape larger than the full result) extends the output by positions no input
    # reaches: zeros, added after the transposed convolution, before the bias (which covers them too).
    out = imp.call(
        op_name, [x, w], channels=w_shape[1] * groups, kernel_size=kernel, strides=strides,
        padding=[*(max(p, 0) for p in before), *(max(p, 0) for p in after)], output_padding=output_padding,
        dilation=dilations, groups=groups, data_layout=data_layout, kernel_layout=kernel_layout,
    )
    if any(p < 0 for p in (*before, *after)):
        widths = [[0, 0], [0, 0], *([max(-b, 0), max(-a, 0)] for b, a in zip(before, after))]
        out = imp.call("nn.pad", [out, imp.const(0, imp.dtype(out))], pad_width=widths, pad_mode="constant")
    if bias is not None:
        out = imp.call("nn.bias_add", [out, bias], axis=1)
    return out


# --- dense / matmul -----------------------------------------------------------------------------


def _dense(imp: Importer, a: Expr, weight: Expr) -> Expr:
    """`a (..., K)` times `weight (N, K)`; inputs of rank > 2 are flattened to 2-D around the dense."""
    shape = imp.shape(a)
    if len(shape) <= 2 or not all(isinstance(d, int) for d in shape[:-1]):
        return imp.call("nn.dense", [a, weight])
    lead = [int(d) for d in shape[:-1]]  # type: ignore[call-overload]
    flat = imp.reshape(a, [math.prod(lead), int(shape[-1])])  # type: ignore[call-overload]
    out = imp.call("nn.dense", [flat, weight])
    return imp.reshape(out, [*lead, int(imp.shape(weight)[0])])  # type: ignore[call-overload]


@converts("Gemm")
def _gemm(imp: Importer, node: OnnxNode) -> Expr:
    a, b, c = node.required(0), node.required(1), node.input(2)
    alpha, beta = node.attr_float("alpha", 1.0), node.attr_float("beta", 1.0)
    if imp.rank(a) != 2 or imp.rank(b) != 2:
        raise OnnxModelError(f"A and B must be 2-D, got {format_shape(imp.shape(a))} and {format_shape(imp.shape(b))}")
    if node.attrs.get("transA", 0):
        a = imp.call("transpose", [a], axes=[1, 0])
    # nn.dense wants the weight as (N, K): that is B itself when transB=1.
    weight = b if node.attrs.get("transB", 0) else imp.call("transpose", [b], axes=[1, 0])
    if alpha != 1.0 and isinstance(weight, Constant):
        weight = imp.scalar_op("multiply", weight, alpha)  # folded into the constant
        alpha = 1.0
    out = imp.call("nn.dense", [a, weight])
    if alpha != 1.0:
        out = imp.scalar_op("multiply", out, alpha)
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = imp.scalar_op("multiply", c, beta)
        out = imp.call("add", [out, c])
    return out


@converts("MatMul")
def _matmul(imp: Importer, node: OnnxNode) -> Expr:
    a, b = node.required(0), node.required(1)
    if imp.rank(a) == 0 or imp.rank(b) == 0:
        raise OnnxModelError("MatMul operands must have rank >= 1")
    a_vector, b_vector = imp.rank(a) == 1, imp.rank(b) == 1
    if a_vector:
        a = imp.call("expand_dims", [a], axis=0)
    if b_vector:
        b = imp.call("expand_dims", [b], axis=1)
    if imp.rank(b) == 2:
        out = _dense(imp, a, imp.call("transpose", [b], axes=[1, 0]))
    else:
        out = batch_matmul(imp, a, b)
    if a_vector:
        out = imp.call("squeeze", [out], axis=[imp.rank(out) - 2])
    if b_vector:
        out = imp.call("squeeze", [out], axis=[imp.rank(out) - 1])
    return out




@converts("BatchNormalization")
def _batch_norm(imp: Importer, node: OnnxNode) -> Expr:
    if any(node.output_used(i) for i in range(1, 5)) or node.attrs.get("training_mode", 0):
        raise UnsupportedError("training-mode BatchNormalization (running statistics outputs)")
    if not node.attrs.get("spatial", 1):
        raise UnsupportedError("BatchNormalization with spatial=0 (per-activation statistics)")
    x = node.required(0)
    dtype = imp.dtype(x)
    vectors = [imp.cast(node.required(i), dtype) for i in range(1, 5)]
    out = imp.call("nn.batch_norm", [x, *vectors], axis=1, epsilon=node.attr_float("epsilon", 1e-5))
    return imp.item(out, 0)


def _channel_vector(imp: Importer, vec: Expr, rank: int) -> Expr:
    """A `(C,)` vector reshaped to broadcast along axis 1 of a rank-`rank` tensor."""
    return imp.reshape(vec, [-1, *[1] * (rank - 2)])


@converts("InstanceNormalization")
def _instance_norm(imp: Importer, node: OnnxNode) -> Expr:
    x, scale, bias = node.required(0), node.required(1), node.required(2)
    rank = imp.rank(x)
    axes = list(range(2, rank))
    eps = node.attr_float("epsilon", 1e-5)
    mean = imp.call("mean", [x], axis=axes, keepdims=True)
    centered = imp.call("subtract", [x, mean])
    var = imp.call("mean", [imp.call("multiply", [centered, centered])], axis=axes, keepdims=True)
    normed = imp.call("divide", [centered, imp.call("sqrt", [imp.scalar_op("add", var, eps)])])
    scaled = imp.call("multiply", [normed, _channel_vector(imp, scale, rank)])
    return imp.call("add", [scaled, _channel_vector(imp, bias, rank)])


@converts("LayerNormalization")
def _layer_norm(imp: Importer, node: OnnxNode) -> Expr | list[Expr]:
    if node.output_used(1) or node.output_used(2):
        return _layer_norm_statistics(imp, node)
    x, scale, bias = node.required(0), node.required(1), node.input(2)
    shape = imp.shape(x)
    rank = len(shape)
    axis = normalize_axis(int(node.attrs.get("axis", -1)), rank)
    normalized = shape[axis:]
    if not all(isinstance(d, int) for d in normalized):
        raise UnsupportedError(f"LayerNormalization over the dynamic dimensions {format_shape(normalized)}")
    size = math.prod(normalized)  # type: ignore[arg-type]
    dtype = imp.dtype(x)

    def as_vector(param: Expr | None, fill: float) -> Expr:
        if param is None:
            return imp.const(np.full((size,), fill), dtype)
        param = imp.cast(param, dtype)
        if imp.shape(param) != normalized:
            param = imp.call("broadcast_to", [param], shape=list(normalized))
        return imp.reshape(param, [size])

    gamma, beta = as_vector(scale, 1.0), as_vector(bias, 0.0)
    eps = node.attr_float("epsilon", 1e-5)
    if axis == rank - 1:
        return imp.call("nn.layer_norm", [x, gamma, beta], axis=-1, epsilon=eps)
    # Normalising over several trailing axes is normalising their flattened product.
    flat = imp.call("reshape", [x], newshape=[*[0] * axis, -1])
    out = imp.call("nn.layer_norm", [flat, gamma, beta], axis=-1, epsilon=eps)
    return imp.call("reshape", [out], newshape=[*[0] * axis, *normalized])


def _layer_norm_statistics(imp: Importer, node: OnnxNode) -> list[Expr]:
    """LayerNormalization with its Mean and InvStdDev outputs (computed in `stash_type`, float32 by default)."""
    x, scale, bias = node.required(0), node.required(1), node.input(2)
    rank = imp.rank(x)
    axes = list(range(normalize_axis(int(node.attrs.get("axis", -1)), rank), rank))
    dtype = imp.dtype(x)
    stash = "float32" if int(node.attrs.get("stash_type", 1)) == 1 else dtype
    wide = imp.cast(x, stash)
    mean = imp.call("mean", [wide], axis=axes, keepdims=True)
    centered = imp.call("subtract", [wide, mean])
    var = imp.call("mean", [imp.call("multiply", [centered, centered])], axis=axes, keepdims=True)
    inv_std = imp.call("divide", [imp.const(1, stash), imp.call("sqrt", [
        imp.scalar_op("add", var, node.attr_float("epsilon", 1e-5))])])
    y = imp.call("multiply", [imp.cast(imp.call("multiply", [centered, inv_std]), dtype), imp.cast(scale, dtype)])
    if bias is not None:
        y = imp.call("add", [y, imp.cast(bias, dtype)])
    return [y, mean, inv_std]


@converts("LRN")
def _lrn(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    size = int(node.attrs["size"])
    alpha, beta = node.attr_float("alpha", 1e-4), node.attr_float("beta", 0.75)
    bias = node.attr_float("bias", 1.0)
    if size % 2 == 1:
        return imp.call("nn.lrn", [x], size=size, axis=1, alpha=alpha, beta=beta, bias=bias)
    # An even window is lopsided, [c - (size-1)//2, c + size//2], which nn.lrn (centred like TVM's)
    # cannot express: sum shifted copies of the padded squares instead.
    rank = imp.rank(x)
    channels = imp.static_shape(x)[1]
    squares = imp.call("multiply", [x, x])
    pad_width = [[0, 0] for _ in range(rank)]
    pad_width[1] = [(size - 1) // 2, size // 2]
    padded = imp.call("nn.pad", [squares, imp.const(0, imp.dtype(x))], pad_width=pad_width)
    total: Expr | None = None
    for offset in range(size):
        part = imp.call("strided_slice", [padded], begin=[offset], end=[offset + channels], axes=[1])
        total = part if total is None else imp.call("add", [total, part])
    assert total is not None
    denom = imp.scalar_op("add", imp.scalar_op("multiply", total, alpha / size), bias)
    return imp.call("divide", [x, imp.scalar_op("power", denom, beta)])


# --- pooling ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PoolSpec:
    kind: str  # "max" or "avg"
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    before: list[int]
    after: list[int]
    ceil_mode: bool
    count_include_pad: bool


def _onnx_pool_size(size: int, i: int, p: _PoolSpec) -> int:
    effective = (p.kernel[i] - 1) * p.dilations[i] + 1
    span = size + p.before[i] + p.after[i] - effective
    if not p.ceil_mode:
        return span // p.strides[i] + 1
    out = -(-span // p.strides[i]) + 1
    # A last window that would start in the end padding is dropped (as onnxruntime and PyTorch do).
    if (out - 1) * p.strides[i] >= size + p.before[i]:
        out -= 1
    return out


def _pool2d(imp: Importer, x: Expr, p: _PoolSpec, axes: tuple[int, int]) -> Expr:
    """Pool the two spatial axes `axes` (the H and W of an NCHW-like 4-D tensor) of `x`."""
    shape = imp.static_shape(x, "the pooled tensor")
    sizes = [shape[a] for a in axes]
    op_name = "nn.max_pool2d" if p.kind == "max" else "nn.avg_pool2d"
    extra = {"count_include_pad": p.count_include_pad} if p.kind == "avg" else {}
    out = imp.call(
        op_name, [x], pool_size=p.kernel, strides=p.strides, dilation=p.dilations,
        padding=[*p.before, *p.after], ceil_mode=p.ceil_mode, layout="NCHW", **extra,
    )
    wanted = [_onnx_pool_size(s, i, p) for i, s in enumerate(sizes)]
    got = [imp.shape(out)[a] for a in axes]
    if wanted != got:
        out = imp.call("strided_slice", [out], begin=[0, 0], end=wanted, axes=list(axes))
    return out


def _pool_spec(imp: Importer, node: OnnxNode, kind: str, in_sizes: Sequence[Dim]) -> _PoolSpec:
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    nsp = len(kernel)
    strides = _ints_attr(node, "strides", nsp)
    dilations = _ints_attr(node, "dilations", nsp)
    before, after = _spatial_pads(node, in_sizes, kernel, strides, dilations)
    return _PoolSpec(kind, kernel, strides, dilations, before, after, bool(node.attrs.get("ceil_mode", 0)),
                     bool(node.attrs.get("count_include_pad", 0)))


def _axis_spec(p: _PoolSpec, i: int) -> _PoolSpec:
    """The 1-D pooling along spatial axis `i` of `p`, as a 2-D pooling with a 1-wide first axis."""
    return _PoolSpec(p.kind, [1, p.kernel[i]], [1, p.strides[i]], [1, p.dilations[i]], [0, p.before[i]],
                     [0, p.after[i]], p.ceil_mode, p.count_include_pad)


def _sub_spec(p: _PoolSpec, axes: Sequence[int]) -> _PoolSpec:
    pick = lambda values: [values[a] for a in axes]
    return _PoolSpec(p.kind, pick(p.kernel), pick(p.strides), pick(p.dilations), pick(p.before), pick(p.after),
                     p.ceil_mode, p.count_include_pad)


@converts("MaxPool", "AveragePool")
def _pool(imp: Importer, node: OnnxNode) -> Expr:
    if node.op_type == "MaxPool" and node.output_used(1):
        raise UnsupportedError("MaxPool's Indices output")
    x = node.required(0)
    shape = imp.static_shape(x, "the pooled tensor")
    p = _pool_spec(imp, node, "max" if node.op_type == "MaxPool" else "avg", shape[2:])
    nsp = len(p.kernel)
    if nsp != len(shape) - 2:
        raise OnnxModelError(f"kernel_shape {p.kernel} does not fit an input of shape {format_shape(shape)}")
    n, c = shape[:2]
    if nsp == 2:
        return _pool2d(imp, x, p, (2, 3))
    if nsp == 1:
        # (N, C, W) -> (N, C, 1, W): pool a 1-high image.
        out = _pool2d(imp, imp.reshape(x, [n, c, 1, shape[2]]), _axis_spec(p, 0), (2, 3))
        return imp.reshape(out, [n, c, imp.static_shape(out)[3]])
    if nsp == 3:
        # Max and average pooling over a box are separable: pool (H, W) for every depth slice, then pool
        # the depth axis. Average divisors multiply too, because the valid part of a box is a box.
        d, h, w = shape[2:]
        planes = _pool2d(imp, imp.reshape(x, [n, c * d, h, w]), _sub_spec(p, [1, 2]), (2, 3))
        oh, ow = imp.static_shape(planes)[2:]
        columns = imp.reshape(planes, [n, c, d, oh * ow])
        depth = _sub_spec(p, [0])
        depth_2d = _PoolSpec(p.kind, [depth.kernel[0], 1], [depth.strides[0], 1], [depth.dilations[0], 1],
                             [depth.before[0], 0], [depth.after[0], 0], p.ceil_mode, p.count_include_pad)
        out = _pool2d(imp, columns, depth_2d, (2, 3))
        return imp.reshape(out, [n, c, imp.static_shape(out)[2], oh, ow])
    raise UnsupportedError(f"{nsp}-D pooling (1-D, 2-D and 3-D are supported)")


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    rank = imp.rank(x)
    average = node.op_type == "GlobalAveragePool"
    if rank == 4:
        return imp.call("nn.global_avg_pool2d" if average else "nn.global_max_pool2d", [x])
    return imp.call("mean" if average else "max", [x], axis=list(range(2, rank)), keepdims=True)


# --- reductions ---------------------------------------------------------------------------------

_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod"}


@converts(*_REDUCE)
def _reduce(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    rank = imp.rank(x)
    if node.input(1) is not None:
        axes: list[int] | None = imp.static_ints(node.input(1), "the axes input")
    else:
        axes = [int(a) for a in node.attrs["axes"]] if "axes" in node.attrs else None
    keepdims = bool(node.attrs.get("keepdims", 1))
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(rank))
    axes = [normalize_axis(a, rank) for a in axes]
    shape = imp.shape(x)
    if node.op_type in ("ReduceMax", "ReduceMin") and any(shape[a] == 0 for a in axes):
        # The maximum of no elements is the identity of max: the lowest value of the type (-inf, False, ...).
        return _empty_extreme(imp, x, axes, keepdims, lowest=node.op_type == "ReduceMax")
    return imp.call(_REDUCE[node.op_type], [x], axis=axes, keepdims=keepdims)


def _empty_extreme(imp: Importer, x: Expr, axes: list[int], keepdims: bool, lowest: bool) -> Expr:
    shape = imp.static_shape(x, "the reduced tensor")
    out_shape = [1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes]
    dtype = np.dtype(imp.dtype(x))
    if dtype.kind == "f":
        value: Any = -np.inf if lowest else np.inf
    elif dtype.kind == "b":
        value = not lowest
    else:
        value = np.iinfo(dtype).min if lowest else np.iinfo(dtype).max
    return imp.const(np.full(out_shape, value), imp.dtype(x))


# --- shape manipulation -------------------------------------------------------------------------


@converts("Reshape")
def _reshape(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    if "shape" in node.attrs:  # opset < 5
        spec = [int(v) for v in node.attrs["shape"]]
    else:
        spec = imp.static_ints(node.input(1), "the shape input")
    allowzero = bool(node.attrs.get("allowzero", 0))
    shape = imp.shape(x)
    if not all(isinstance(d, int) for d in shape):
        return imp.call("reshape", [x], newshape=spec, allowzero=int(allowzero))
    # Resolve 0 (copy) and -1 (infer) here, so the program states the shape it means.
    out = [int(shape[i]) if v == 0 and not allowzero else v for i, v in enumerate(spec)]  # type: ignore[call-overload]
    if out.count(-1) > 1:
        raise OnnxModelError(f"shape {spec} has more than one -1")
    if -1 in out:
        known = math.prod([d for d in out if d != -1])
        total = math.prod(shape)  # type: ignore[arg-type]
        if known == 0 or total % known:
            raise OnnxModelError(f"cannot reshape {format_shape(shape)} to {spec}")
        out[out.index(-1)] = total // known
    if math.prod(out) != math.prod(shape):  # type: ignore[arg-type]
        raise OnnxModelError(f"cannot reshape {format_shape(shape)} ({math.prod(shape)} elements) to {spec}")  # type: ignore[arg-type]
    if 0 in out:  # a literal zero-sized dimension (Relay's reshape would read 0 as "copy")
        return imp.call("reshape", [x], newshape=out, allowzero=1)
    return imp.reshape(x, out)


@converts("Flatten")
def _flatten(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    rank = imp.rank(x)
    axis = int(node.attrs.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        raise OnnxModelError(f"axis {axis} is out of range for rank {rank}")
    return flatten_2d(imp, x, axis)


@converts("Transpose")
def _transpose(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    perm = [int(a) for a in node.attrs.get("perm", reversed(range(imp.rank(x))))]
    if perm == list(range(len(perm))):
        return x
    return imp.call("transpose", [x], axes=perm)


def _axes_arg(imp: Importer, node: OnnxNode, what: str) -> list[int] | None:
    """`axes` from the second input (newer opsets) or the attribute (older ones); None when absent."""
    if node.input(1) is not None:
        return imp.static_ints(node.input(1), f"the {what} input")
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    return None


@converts("Squeeze")
def _squeeze(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    shape = imp.shape(x)
    axes = _axes_arg(imp, node, "axes")
    if axes is None:
        if not all(isinstance(d, int) for d in shape):
            raise UnsupportedError(f"Squeeze without axes on the dynamic shape {format_shape(shape)}")
        axes = [i for i, d in enumerate(shape) if d == 1]
    if not axes:
        return x
    return imp.call("squeeze", [x], axis=sorted(normalize_axis(a, len(shape)) for a in axes))


@converts("Unsqueeze")
def _unsqueeze(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    axes = _axes_arg(imp, node, "axes")
    if axes is None:
        raise OnnxModelError("Unsqueeze needs axes")
    out_rank = imp.rank(x) + len(axes)
    # Axes are positions in the output; inserting them in increasing order keeps each position right.
    for axis in sorted(normalize_axis(a, out_rank) for a in axes):
        x = imp.call("expand_dims", [x], axis=axis)
    return x


@converts("Expand")
def _expand(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    target = imp.static_ints(node.input(1), "the shape input")
    shape = imp.static_shape(x)
    out = tuple(int(d) for d in broadcast_shapes(shape, target, op_name="Expand"))  # type: ignore[call-overload]
    if out == shape:
        return x
    return imp.call("broadcast_to", [x], shape=list(out))


@converts("Tile")
def _tile(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    repeats = imp.static_ints(node.input(1), "the repeats input")
    shape = imp.static_shape(x)
    if len(repeats) != len(shape):
        raise OnnxModelError(f"repeats {repeats} must have one entry per axis of {format_shape(shape)}")
    if all(r == 1 for r in repeats):
        return x
    # Tiling is broadcasting along a new axis in front of each axis, then merging each pair.
    interleaved = [v for d in shape for v in (1, d)]
    spread = [v for r, d in zip(repeats, shape) for v in (r, d)]
    tiled = imp.call("broadcast_to", [imp.reshape(x, interleaved)], shape=spread)
    return imp.reshape(tiled, [r * d for r, d in zip(repeats, shape)])


@converts("Concat")
def _concat(imp: Importer, node: OnnxNode) -> Expr:
    operands = [x for x in node.inputs if x is not None]
    if not operands:
        raise OnnxModelError("Concat needs at least one input")
    axis = normalize_axis(int(node.attrs["axis"]), imp.rank(operands[0]))
    if len(operands) > 1 and any(is_empty(imp.type_of(x)) for x in operands):
        # Empty operands add nothing (and zero-size tensors are not compiled): type-check them all, then drop them.
        opdef = get_op("concatenate")
        assert opdef.type_relation is not None
        opdef.type_relation([TupleType(tuple(imp.type_of(x) for x in operands))], opdef.make_attrs({"axis": axis}))
        operands = [x for x in operands if not is_empty(imp.type_of(x))] or operands[:1]
    if len(operands) == 1:
        return operands[0]
    return imp.call("concatenate", [Tuple(tuple(operands))], axis=axis)


@converts("Split")
def _split(imp: Importer, node: OnnxNode) -> list[Expr]:
    x = node.required(0)
    shape = imp.shape(x)
    axis = normalize_axis(int(node.attrs.get("axis", 0)), len(shape))
    count = len(node.outputs)
    if node.input(1) is not None:
        sizes: list[int] | None = imp.static_ints(node.input(1), "the split input")
    elif "split" in node.attrs:
        sizes = [int(s) for s in node.attrs["split"]]
    else:
        sizes = None
    extent = shape[axis]
    if sizes is None:
        if "num_outputs" in node.attrs:
            count = int(node.attrs["num_outputs"])
        if not isinstance(extent, int):
            raise UnsupportedError("Split into equal parts along a dynamic axis")
        # Equal parts; since opset 18 the last part may be smaller (ceil division).
        step = -(-extent // count)
        sizes = [min(step, extent - k * step) for k in range(count)]
    if isinstance(extent, int) and sum(sizes) != extent:
        raise OnnxModelError(f"split sizes {sizes} do not add up to the axis extent {extent}")
    if len(sizes) == 1:
        return [x]
    if 0 in sizes:
        # `split` wants strictly increasing cut points: slice each part; an empty part holds no data, so it is
        # a constant (zero-size tensors are not compiled).
        starts = [0, *np.cumsum(sizes)[:-1]]
        parts = []
        for begin, size in zip(starts, sizes):
            part = imp.call("strided_slice", [x], begin=[int(begin)], end=[int(begin) + size], axes=[axis])
            empty = size == 0 and all(isinstance(d, int) for d in imp.shape(part))
            parts.append(imp.const(np.zeros(imp.static_shape(part)), imp.dtype(x)) if empty else part)
        return parts
    indices = list(np.cumsum(sizes)[:-1])
    out = imp.call("split", [x], indices_or_sections=[int(i) for i in indices], axis=axis)
    return [imp.item(out, i) for i in range(len(sizes))]


def _slice_bound(value: int, extent: int, step: int, is_end: bool) -> int:
    """An ONNX slice start/end clamped into range, expressed so strided_slice reads it the same way."""
    if value < 0:
        value += extent
    if step > 0:
        return min(max(value, 0), extent)
    clamped = min(max(value, -1), extent - 1)
    # strided_slice reads a negative end as counting from the back; -extent-1 means "past index 0".
    return -extent - 1 if is_end and clamped == -1 else clamped


@converts("Slice")
def _slice(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    shape = imp.shape(x)
    if "starts" in node.attrs:  # opset < 10
        starts = [int(v) for v in node.attrs["starts"]]
        ends = [int(v) for v in node.attrs["ends"]]
        axes = [int(v) for v in node.attrs.get("axes", range(len(starts)))]
        steps = [1] * len(starts)
    else:
        starts = imp.static_ints(node.input(1), "the starts input")
        ends = imp.static_ints(node.input(2), "the ends input")
        axes = imp.static_ints(node.input(3), "the axes input") if node.input(3) is not None else list(
            range(len(starts)))
        steps = imp.static_ints(node.input(4), "the steps input") if node.input(4) is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise OnnxModelError(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    if any(s == 0 for s in steps):
        raise OnnxModelError("a slice step of 0")
    axes = [normalize_axis(a, len(shape)) for a in axes]
    begin, end = [], []
    for axis, s, e, step in zip(axes, starts, ends, steps):
        extent = shape[axis]
        if isinstance(extent, int):
            s, e = _slice_bound(s, extent, step, False), _slice_bound(e, extent, step, True)
        begin.append(s)
        end.append(e)
    return imp.call("strided_slice", [x], begin=begin, end=end, strides=steps, axes=axes)


@converts("Gather")
def _gather(imp: Importer, node: OnnxNode) -> Expr:
    data, indices = node.required(0), node.required(1)
    axis = normalize_axis(int(node.attrs.get("axis", 0)), imp.rank(data))
    extent = imp.shape(data)[axis]
    if isinstance(indices, Constant) and isinstance(extent, int):
        # Negative indices count from the end in ONNX; resolve them now.
        values = indices.data.astype(np.int64)
        values = np.where(values < 0, values + extent, values)
        return imp.call("take", [data, imp.const(values, str(indices.data.dtype))], axis=axis, mode="clip")
    # At run time, wrapping maps every valid ONNX index (-extent .. extent-1) to the right element.
    return imp.call("take", [data, indices], axis=axis, mode="wrap")


@converts("Pad")
def _pad(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    shape = imp.shape(x)
    rank = len(shape)
    mode = node.attr_str("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise OnnxModelError(f"Pad mode {mode!r} is not one of constant, reflect, edge and wrap")
    value: Expr = imp.const(0, imp.dtype(x))
    if "pads" in node.attrs or "paddings" in node.attrs:  # opset < 11
        pads = [int(p) for p in node.attrs.get("pads", node.attrs.get("paddings"))]
        value = imp.const(node.attr_float("value", 0.0), imp.dtype(x))
        axes = list(range(rank))
    else:
        pads = imp.static_ints(node.input(1), "the pads input")
        if node.input(2) is not None:
            value = imp.reshape(imp.cast(node.required(2), imp.dtype(x)), [])
        axes = [normalize_axis(a, rank) for a in imp.static_ints(node.input(3), "the axes input")] if node.input(
            3) is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise OnnxModelError(f"pads {pads} must have {2 * len(axes)} values")
    widths = [[0, 0] for _ in range(rank)]
    for k, axis in enumerate(axes):
        widths[axis] = [pads[k], pads[k + len(axes)]]
    if mode == "wrap":
        return _wrap_pad(imp, x, widths)
    # Negative pads crop: pad by the positive parts, then slice the negative ones away.
    positive = [[max(b, 0), max(a, 0)] for b, a in widths]
    out = x
    if any(b or a for b, a in positive):
        out = imp.call("nn.pad", [x, value], pad_width=positive, pad_mode=mode)
    crops = [(axis, -b, -a) for axis, (b, a) in enumerate(widths) if b < 0 or a < 0]
    if crops:
        padded = imp.static_shape(out)
        begin = [max(b, 0) for _, b, _ in crops]
        end = [padded[axis] - max(a, 0) for axis, _, a in crops]
        out = imp.call("strided_slice", [out], begin=begin, end=end, axes=[axis for axis, _, _ in crops])
    return out


def _wrap_pad(imp: Importer, x: Expr, widths: Sequence[Sequence[int]]) -> Expr:
    """Pad mode `wrap`: along each padded axis a gather at (j - before) mod extent, so the padding repeats the
    tensor periodically (and a negative pad crops)."""
    out = x
    for axis, (before, after) in enumerate(widths):
        if not before and not after:
            continue
        extent = imp.static_shape(out, "the input of a wrap Pad")[axis]
        length = extent + before + after
        if extent == 0 or length < 0:
            raise OnnxModelError(f"wrap padding {before, after} does not fit an axis of {extent}")
        sources = (np.arange(length, dtype=np.int64) - before) % extent
        out = imp.call("take", [out, imp.const(sources, "int64")], axis=axis, mode="clip")
    return out


# --- constants and shapes -----------------------------------------------------------------------


@converts("Constant")
def _constant(imp: Importer, node: OnnxNode) -> Expr:
    attrs = node.attrs
    if "value" in attrs:
        tensor = attrs["value"]
        relay_dtype(tensor.data_type, "Constant")
        return Constant(numpy_helper.to_array(tensor))
    if "value_float" in attrs:
        return imp.const(attrs["value_float"], "float32")
    if "value_floats" in attrs:
        return imp.const(list(attrs["value_floats"]), "float32")
    if "value_int" in attrs:
        return imp.const(attrs["value_int"], "int64")
    if "value_ints" in attrs:
        return imp.const(list(attrs["value_ints"]), "int64")
    raise UnsupportedError(f"Constant with attribute(s) {', '.join(attrs)}")


@converts("ConstantOfShape")
def _constant_of_shape(imp: Importer, node: OnnxNode) -> Expr:
    shape = imp.static_ints(node.input(0), "the shape input")
    if "value" in node.attrs:
        fill = numpy_helper.to_array(node.attrs["value"]).reshape(-1)
        relay_dtype(node.attrs["value"].data_type, "ConstantOfShape value")
    else:
        fill = np.zeros(1, np.float32)
    return Constant(np.full(shape, fill[0], dtype=fill.dtype))


@converts("Shape")
def _shape(imp: Importer, node: OnnxNode) -> Expr:
    shape = imp.static_shape(node.required(0), "the input of Shape")
    rank = len(shape)
    start = int(node.attrs.get("start", 0))
    end = int(node.attrs.get("end", rank))
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return imp.const(list(shape[start:end]), "int64")


@converts("Size")
def _size(imp: Importer, node: OnnxNode) -> Expr:
    return imp.const(math.prod(imp.static_shape(node.required(0), "the input of Size")), "int64")


# ================================================================================================
# The graph walk
# ================================================================================================


def read_model(model_or_path: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """The `onnx.ModelProto` at a path (or the one given); not a file or not ONNX is one `RelayTuneError`."""
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    path = Path(model_or_path)
    if not path.is_file():
        raise RelayTuneError(f"{path}: no such file")
    try:
        return onnx.load(str(path))
    except Exception as err:  # onnx raises DecodeError and friends for files that are not ONNX
        raise OnnxModelError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") from None


def _check_operators(graph: onnx.GraphProto, opset: int | None = None) -> None:
    unsupported: Counter[str] = Counter()
    first: dict[str, str] = {}
    for place, node in all_nodes(graph):
        name = converter_key(node.domain, node.op_type)
        if name in CONVERTERS:
            continue
        unsupported[name] += 1
        first.setdefault(name, place)
    if unsupported:
        raise UnsupportedOperatorsError(unsupported, first, opset)


@functools.cache
def _operator_version(op_type: str, opset: int) -> int | None:
    """The `since_version` of `op_type`'s definition in effect at `opset` (None if onnx does not define it)."""
    try:
        return int(onnx.defs.get_schema(op_type, opset, "").since_version)
    except onnx.defs.SchemaError:
        return None


def _check_operator_versions(graph: onnx.GraphProto, opset: int) -> None:
    """Rejects the first node whose operator definition at `opset` is newer than its converter handles."""
    if opset <= BASE_OPSET:
        return
    for place, node in all_nodes(graph):
        if node.domain not in _DEFAULT_DOMAINS:  # the opset versions the default domain only
            continue
        version = _operator_version(node.op_type, opset)
        newest = newest_version(node.op_type)
        if version is not None and version > newest:
            raise UnsupportedError(
                f"ONNX {place} ({node.op_type}): {node.op_type}-{version} (the definition at opset {opset}) is newer "
                f"than the versions relay-tune converts (up to {node.op_type}-{newest}); export the model at "
                f"opset {version - 1} or lower"
            )


def _opset(model: onnx.ModelProto) -> int:
    """The opset the converters follow. A model of an older opset than `MIN_OPSET` imports as `MIN_OPSET` when
    every operator it uses has the same definition at both (`Not`, `Relu`, ... of opset 1)."""
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    opset = max(versions) if versions else MIN_OPSET
    if 1 <= opset < MIN_OPSET and all(
            _operator_version(node.op_type, opset) == _operator_version(node.op_type, MIN_OPSET) is not None
            for node in model.graph.node if node.domain in _DEFAULT_DOMAINS):
        return MIN_OPSET
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedError(f"ONNX opset {opset} (relay-tune imports opsets {MIN_OPSET} to {MAX_OPSET}, and "
                               f"older ones whose operators are defined as at opset {MIN_OPSET})")
    return opset


def _input_var(value_info: onnx.ValueInfoProto, overrides: Mapping[str, Sequence[int]]) -> Var:
    name = value_info.name
    if not value_info.type.HasField("tensor_type"):
        raise UnsupportedError(f"graph input {name!r} is not a tensor")
    tensor_type = value_info.type.tensor_type
    dtype = relay_dtype(tensor_type.elem_type, f"graph input {name!r}")
    if name in overrides:
        shape: tuple[Dim, ...] = tuple(int(d) for d in overrides[name])
    elif not tensor_type.HasField("shape"):
        raise UnsupportedError(f"graph input {name!r} has no shape; give it with shape_overrides")
    else:
        # an open size is a dim_param, no value, or (as some exporters write it) a negative value
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else ANY
                      for d in tensor_type.shape.dim)
    return Var(name, TensorType(shape, dtype))


def _inline_graph(imp: Importer, outer: Mapping[str, Expr], graph: onnx.GraphProto,
                  inputs: Sequence[Expr]) -> list[Expr]:
    """The outputs of subgraph `graph` (a GRAPH attribute, e.g. FlexAttention's score_mod) applied to `inputs`,
    names it does not define itself resolving in the enclosing graph's `outer` values."""
    return convert_subgraph(imp, graph, outer, inputs)


def convert_graph(model: onnx.ModelProto, shape_overrides: Mapping[str, Sequence[int]] | None = None) -> Function:
    """The Relay function computing `model`'s graph (see the module docstring)."""
    graph = model.graph
    if not graph.output:
        raise OnnxModelError("the ONNX model has no graph outputs (an empty or truncated file?)")
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    _check_operators(graph, max(versions) if versions else None)  # before the opset check: name what is missing
    opset = _opset(model)
    _check_operator_versions(graph, opset)
    overrides = dict(shape_overrides or {})
    initializer_names = {t.name for t in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in initializer_names]
    unknown = sorted(set(overrides) - {vi.name for vi in inputs})
    if unknown:
        names = ", ".join(vi.name for vi in inputs)
        raise RelayTuneError(f"shape_overrides names unknown input(s) {', '.join(unknown)} (inputs: {names})")

    imp = Importer(opset)
    values: dict[str, Expr] = {}
    params = [_input_var(vi, overrides) for vi in inputs]
    values.update((p.name_hint, p) for p in params)
    values.update(initializer_values(graph))
    imp.graph_inliner = functools.partial(_inline_graph, imp, values)
    convert_nodes(imp, graph.node, values)

    missing_outputs = [o.name for o in graph.output if o.name not in values]
    if missing_outputs:
        raise OnnxModelError(f"graph output(s) {', '.join(map(repr, missing_outputs))} are never computed")
    results = [values[o.name] for o in graph.output]
    body = results[0] if len(results) == 1 else Tuple(tuple(results))
    return Function(tuple(params), body)


def from_onnx(
    model_or_path: onnx.ModelProto | str | Path, shape_overrides: Mapping[str, Sequence[int]] | None = None
) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Import an ONNX model: the type-checked module (`@main`) and its parameters.

    `shape_overrides` fixes the shapes of graph inputs by name (needed when a model has symbolic
    dimensions that conversions must know). `params["const_i"]` is the value of
    `meta[relay.Constant][i]` in `print_module(mod)`.
    """
    model = read_model(model_or_path)
    mod = infer_types(IRModule.from_expr(convert_graph(model, shape_overrides)))
    constants: list[np.ndarray] = []
    print_module(mod, constants_out=constants)
    return mod, params_dict(constants)

