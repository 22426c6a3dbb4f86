"""ONNX converters for BitwiseAnd/Or/Xor (Relay's `bitwise_*`), MeanVarianceNormalization and ReverseSequence.

The converters register in the importer's table when `relay_tune.frontend.onnx` is imported.
"""

from __future__ import annotations

import math

import numpy as np

from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode, normalize_axis
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Expr
from relay_tune.op._shape import is_float_dtype, is_int_dtype

_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


@converts(*_BITWISE, newest=REVIEWED_OPSET)
def _bitwise(imp: Importer, node: OnnxNode) -> Expr:
    a, b = node.required(0), node.required(1)
    if not is_int_dtype(imp.dtype(a)) or imp.dtype(a) != imp.dtype(b):
        raise OnnxModelError(f"{node.op_type} needs two integer tensors of one type, got {imp.dtype(a)} and "
                             f"{imp.dtype(b)}")
    return imp.call(_BITWISE[node.op_type], [a, b])


@converts("MeanVarianceNormalization", newest=REVIEWED_OPSET)
def _mean_variance_normalization(imp: Importer, node: OnnxNode) -> Expr:
    """(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9) over `axes`, as the ONNX function body defines it."""
    x = node.required(0)
    dtype = imp.dtype(x)
    if not is_float_dtype(dtype):
        raise OnnxModelError(f"MeanVarianceNormalization needs a floating-point tensor, got {dtype}")
    rank = imp.rank(x)
    axes = sorted({normalize_axis(int(a), rank) for a in node.attrs.get("axes", [0, 2, 3])})
    mean = imp.call("mean", [x], axis=axes, keepdims=True)
    mean_of_squares = imp.call("mean", [imp.call("multiply", [x, x])], axis=axes, keepdims=True)
    variance = imp.call("subtract", [mean_of_squares, imp.call("multiply", [mean, mean])])
    std = imp.call("add", [imp.call("sqrt", [variance]), imp.const(1e-9, dtype)])
    return imp.call("divide", [imp.call("subtract", [x, mean]), std])


def _ramp(extent: int, axis: int, rank: int) -> np.ndarray:
    """0 .. extent-1 along `axis` of a rank-`rank` array of ones elsewhere."""
    return np.arange(extent, dtype=np.int64).reshape([extent if d == axis else 1 for d in range(rank)])


@converts("ReverseSequence", newest=REVIEWED_OPSET)
def _reverse_sequence(imp: Importer, node: OnnxNode) -> Expr:
    """Each batch entry's first `sequence_lens[b]` time steps reversed: a gather from the flattened input at
    offsets computed from the (run-time) lengths."""
    x, lens = node.required(0), node.required(1)
    shape = imp.static_shape(x, "the input")
    rank = len(shape)
    if rank < 2:
        raise OnnxModelError(f"ReverseSequence needs a tensor of rank 2 or more, got shape {list(shape)}")
    batch_axis, time_axis = int(node.attrs.get("batch_axis", 1)), int(node.attrs.get("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        raise OnnxModelError(f"batch_axis and time_axis must be 0 and 1 (one each), got {batch_axis} and "
                             f"{time_axis}")
    if imp.shape(lens) != (shape[batch_axis],):
        raise OnnxModelError(f"sequence_lens must have shape ({shape[batch_axis]},), got {list(imp.shape(lens))}")
    lens = imp.reshape(imp.cast(lens, "int64"), [shape[batch_axis] if d == batch_axis else 1 for d in range(rank)])
    steps = imp.const(_ramp(shape[time_axis], time_axis, rank), "int64")
    reversed_step = imp.call("subtract", [imp.call("subtract", [lens, imp.const(1, "int64")]), steps])
    source_step = imp.call("where", [imp.call("less", [steps, lens]), reversed_step, steps])
    strides = [math.prod(shape[d + 1:]) for d in range(rank)]
    others = sum((_ramp(shape[d], d, rank) * strides[d] for d in range(rank) if d != time_axis),
                 np.zeros([1] * rank, np.int64))
    offsets = imp.call("add", [imp.call("multiply", [source_step, imp.const(strides[time_axis], "int64")]),
                               imp.const(np.broadcast_to(others, shape), "int64")])
    return imp.call("take", [imp.reshape(x, [math.prod(shape)]), offsets], axis=0, mode="clip")
