"""ONNX converters for BitwiseAnd/Or/Xor (Relay's `bitwise_*`), Det (the permutation expansion, up to 4 x 4),
MeanVarianceNormalization, ReverseSequence,
AffineGrid (a batched matmul of theta with the constant grid of output coordinates), Col2Im (a gather of
each pixel's columns at constant indices, summed over the block offsets), MaxUnpool, and the operators whose
output shape depends on input values (NonZero, Unique, NonMaxSuppression, Compress): folded at import when their
inputs are constants (Compress: when its condition is), refused with the reason otherwise.

The converters register in the importer's table when `relay_tune.frontend.onnx` is imported.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from relay_tune.errors import UnsupportedError
from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode, batch_matmul, normalize_axis
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Constant, Expr
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


def _grid_axis(extent: int, align_corners: bool) -> np.ndarray:
    """The normalised coordinates [-1, 1] of `extent` samples: the centres of the cells, or (align_corners) the
    corners, as AffineGrid places them (a single corner-aligned sample sits at -1)."""
    if align_corners:
        return np.linspace(-1.0, 1.0, extent) if extent > 1 else np.full(extent, -1.0)
    return (2.0 * np.arange(extent) + 1.0) / extent - 1.0


@converts("AffineGrid", newest=REVIEWED_OPSET)
def _affine_grid(imp: Importer, node: OnnxNode) -> Expr:
    """theta (N, k, k + 1) applied to the homogeneous coordinates of every output point: one batched matmul of
    the constant grid (points, k + 1) with theta transposed, giving (N, *spatial, k) with x first."""
    theta = node.required(0)
    size = imp.static_ints(node.input(1), "size of AffineGrid")
    dims = len(size) - 2
    batch, *spatial = size[0], *size[2:]
    if dims not in (2, 3) or imp.shape(theta) != (batch, dims, dims + 1):
        raise OnnxModelError(f"AffineGrid needs size (N, C, H, W) or (N, C, D, H, W) and theta (N, {dims}, "
                             f"{dims + 1}), got size {size} and theta {list(imp.shape(theta))}")
    dtype = imp.dtype(theta)
    if not is_float_dtype(dtype):
        raise OnnxModelError(f"theta of AffineGrid must be floating point, got {dtype}")
    align = bool(node.attrs.get("align_corners", 0))
    axes = np.meshgrid(*(_grid_axis(n, align) for n in spatial), indexing="ij")  # (D,) H, W
    # homogeneous coordinates, x (the last spatial axis) first
    points = np.stack([*reversed(axes), np.ones(spatial)], axis=-1).reshape(-1, dims + 1)
    grid = batch_matmul(imp, imp.const(points, dtype), imp.call("transpose", [theta], axes=[0, 2, 1]))
    return imp.reshape(grid, [batch, *spatial, dims])


def _col2im_sources(image: Sequence[int], block: Sequence[int], dilations: Sequence[int], pads: Sequence[int],
                    strides: Sequence[int]) -> tuple[np.ndarray, np.ndarray, int]:
    """For each block offset k and image pixel p: the column `l` whose block covers p at offset k, and whether
    one does; plus the column count. Each pixel receives at most one column per offset."""
    dims = len(image)
    begin = pads[:dims]
    columns = [(image[d] + pads[d] + pads[d + dims] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
               for d in range(dims)]
    if any(c < 1 for c in columns):
        raise OnnxModelError(f"Col2Im: the blocks {list(block)} do not fit the padded image {list(image)}")
    offsets = np.indices(block).reshape(dims, -1)  # (dims, K)
    pixels = np.indices(image).reshape(dims, -1)  # (dims, P)
    # the block's start in padded coordinates: pixel + begin - offset * dilation, a multiple of the stride
    starts = pixels[:, None, :] + np.asarray(begin)[:, None, None] - offsets[:, :, None] * np.asarray(dilations)[
        :, None, None]
    stride = np.asarray(strides)[:, None, None]
    column = starts // stride
    valid = np.all((starts % stride == 0) & (column >= 0) & (column < np.asarray(columns)[:, None, None]), axis=0)
    flat = np.ravel_multi_index(tuple(np.where(valid, column, 0)), columns)  # (K, P)
    return flat, valid, math.prod(columns)


@converts("Col2Im", newest=REVIEWED_OPSET)
def _col2im(imp: Importer, node: OnnxNode) -> Expr:
    """Sums the columns (N, C * prod(block), L) back into images (N, C, *image_shape): per pixel, a gather of
    the one column each block offset contributes (constant indices), masked and summed over the offsets."""
    x = node.required(0)
    image = imp.static_ints(node.input(1), "image_shape of Col2Im")
    block = imp.static_ints(node.input(2), "block_shape of Col2Im")
    dims = len(image)
    dilations = [int(v) for v in node.attrs.get("dilations", [1] * dims)]
    pads = [int(v) for v in node.attrs.get("pads", [0] * 2 * dims)]
    strides = [int(v) for v in node.attrs.get("strides", [1] * dims)]
    if len(block) != dims or len(dilations) != dims or len(strides) != dims or len(pads) != 2 * dims:
        raise OnnxModelError(f"Col2Im: image_shape {image}, block_shape {block}, dilations {dilations}, strides "
                             f"{strides} and pads {pads} disagree on the number of spatial axes")
    shape = imp.static_shape(x, "the input of Col2Im")
    kernel = math.prod(block)
    flat, valid, columns = _col2im_sources(image, block, dilations, pads, strides)
    if len(shape) != 3 or shape[1] % kernel or shape[2] != columns:
        raise OnnxModelError(f"the input of Col2Im must have shape (N, C * {kernel}, {columns}), got {list(shape)}")
    batch, channels = shape[0], shape[1] // kernel
    rows = imp.reshape(x, [batch, channels, kernel * columns])  # (N, C, K * L): offset k's columns at k * L
    sources = flat + np.arange(kernel)[:, None] * columns
    gathered = imp.call("take", [rows, imp.const(sources, "int64")], axis=2, mode="clip")  # (N, C, K, P)
    dtype = imp.dtype(x)
    masked = imp.call("where", [imp.const(valid, "bool"), gathered, imp.const(0, dtype)])
    return imp.reshape(imp.call("sum", [masked], axis=[2]), [batch, channels, *image])


# --- operators whose output shape depends on input values -------------------------------------------------------

_DATA_DEPENDENT = {
    "NonZero": "the number of non-zero elements",
    "Unique": "the number of distinct values",
    "NonMaxSuppression": "the number of boxes kept",
    "Compress": "the number of true conditions",
}


def _fold_with_onnx_reference(imp: Importer, node: OnnxNode) -> list[Expr]:
    """The node evaluated at import time by onnx's reference evaluator, every input being a constant."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if value is not None else "" for i, value in enumerate(node.inputs)]
    feeds = {name: imp.static(value, f"input {i} of {node.op_type}")
             for i, (name, value) in enumerate(zip(names, node.inputs)) if value is not None}
    outputs = [f"out{i}" for i in range(len(node.outputs))]
    proto = helper.make_node(node.op_type, names, outputs, **node.attrs)
    results = ReferenceEvaluator(proto, opsets={"": imp.opset}).run(None, feeds)
    return [imp.const(value, np.asarray(value).dtype.name) for value in results]


def _data_dependent_error(node: OnnxNode, needed: str = "its inputs are constants") -> UnsupportedError:
    return UnsupportedError(
        f"the output shape of {node.op_type} depends on the values of its inputs ({_DATA_DEPENDENT[node.op_type]}) "
        f"and relay-tune compiles static shapes: it converts this node only when {needed}")


@converts("NonZero", "Unique", "NonMaxSuppression", newest=REVIEWED_OPSET)
def _data_dependent(imp: Importer, node: OnnxNode) -> list[Expr]:
    """Folded at import when every input is a constant, and refused with the reason otherwise."""
    if all(value is None or isinstance(value, Constant) for value in node.inputs):
        return _fold_with_onnx_reference(imp, node)
    raise _data_dependent_error(node)


@converts("Compress", newest=REVIEWED_OPSET)
def _compress(imp: Importer, node: OnnxNode) -> Expr | list[Expr]:
    """A `take` of the selected positions when the condition is a constant (whatever the data); refused when
    the condition is computed at run time."""
    x, condition = node.required(0), node.required(1)
    if not isinstance(condition, Constant):
        raise _data_dependent_error(node, "its condition is a constant")
    selected = np.flatnonzero(np.asarray(condition.data).reshape(-1)).astype(np.int64)
    if "axis" not in node.attrs:
        shape = imp.static_shape(x, "the input of Compress")
        if selected.size and selected[-1] >= math.prod(shape):
            raise OnnxModelError(f"the condition of Compress selects position {selected[-1]} of a tensor of "
                                 f"{math.prod(shape)} elements")
        return imp.call("take", [imp.reshape(x, [math.prod(shape)]), imp.const(selected, "int64")], axis=0)
    rank = imp.rank(x)
    axis = normalize_axis(int(node.attrs["axis"]), rank)
    extent = imp.shape(x)[axis]
    if selected.size and isinstance(extent, int) and selected[-1] >= extent:
        raise OnnxModelError(f"the condition of Compress selects position {selected[-1]} of an axis of {extent}")
    return imp.call("take", [x, imp.const(selected, "int64")], axis=axis)


@converts("MaxUnpool", newest=REVIEWED_OPSET)
def _max_unpool(imp: Importer, node: OnnxNode) -> Expr:
    """Each value written at its index into a zero tensor of the shape pooling came from, as ONNX's reference
    does: the indices address that (inferred) shape, and a larger `output_shape` pads it at the end. Per
    (batch, channel) plane every output position finds the last input whose index names it (O(P * M) per plane)."""
    x, indices = node.required(0), node.required(1)
    shape = imp.static_shape(x, "the input of MaxUnpool")
    dims = len(shape) - 2
    kernel = [int(v) for v in node.attrs.get("kernel_shape", [])]
    strides = [int(v) for v in node.attrs.get("strides", [1] * dims)]
    pads = [int(v) for v in node.attrs.get("pads", [0] * 2 * dims)]
    if dims < 1 or len(kernel) != dims or len(strides) != dims or len(pads) != 2 * dims:
        raise OnnxModelError(f"MaxUnpool: kernel_shape {kernel}, strides {strides} and pads {pads} do not match an "
                             f"input of shape {list(shape)}")
    if imp.shape(indices) != tuple(shape):
        raise OnnxModelError(f"the indices of MaxUnpool must have the input's shape {list(shape)}, got "
                             f"{list(imp.shape(indices))}")
    spatial = [(shape[d + 2] - 1) * strides[d] - pads[d] - pads[d + dims] + kernel[d] for d in range(dims)]
    planes, inputs, outputs = shape[0] * shape[1], math.prod(shape[2:]), math.prod(spatial)
    # position p of plane q is the flat index q * outputs + p
    targets = np.arange(planes * outputs, dtype=np.int64).reshape(planes, outputs, 1)
    named = imp.call("equal", [imp.reshape(imp.cast(indices, "int64"), [planes, 1, inputs]),
                               imp.const(targets, "int64")])  # (planes, outputs, inputs)
    order = np.arange(1, inputs + 1, dtype=np.int64).reshape(1, 1, inputs)
    last = imp.call("max", [imp.call("where", [named, imp.const(order, "int64"), imp.const(0, "int64")])],
                    axis=[2])  # (planes, outputs): 1 + the last input written there, 0 for none
    offsets = imp.call("add", [imp.call("subtract", [last, imp.const(1, "int64")]),
                               imp.const(np.arange(planes, dtype=np.int64).reshape(planes, 1) * inputs, "int64")])
    dtype = imp.dtype(x)
    values = imp.call("take", [imp.reshape(x, [planes * inputs]), offsets], axis=0, mode="clip")
    written = imp.call("greater", [last, imp.const(0, "int64")])
    out = imp.reshape(imp.call("where", [written, values, imp.const(0, dtype)]), [*shape[:2], *spatial])
    if node.input(2) is None:
        return out
    wanted = imp.static_ints(node.input(2), "output_shape of MaxUnpool")
    if len(wanted) != len(shape) or wanted[:2] != list(shape[:2]) or any(
            w < s for w, s in zip(wanted[2:], spatial)):
        raise OnnxModelError(f"output_shape {wanted} of MaxUnpool must keep N and C and hold the unpooled shape "
                             f"{[*shape[:2], *spatial]}")
    if wanted[2:] == spatial:
        return out
    widths = [[0, 0], [0, 0], *([0, w - s] for w, s in zip(wanted[2:], spatial))]
    return imp.call("nn.pad", [out, imp.const(0, dtype)], pad_width=widths, pad_mode="constant")


_DET_MAX = 4  # 4! = 24 products of 4 factors; beyond that the permutation expansion stops being sensible


@converts("Det", newest=REVIEWED_OPSET)
def _det(imp: Importer, node: OnnxNode) -> Expr:
    """The determinant of each trailing (n, n) matrix by its permutation (Leibniz) expansion, for n up to 4."""
    x = node.required(0)
    shape = imp.static_shape(x, "the input of Det")
    dtype = imp.dtype(x)
    if len(shape) < 2 or shape[-1] != shape[-2] or not is_float_dtype(dtype):
        raise OnnxModelError(f"Det needs floating-point square matrices (..., n, n), got {dtype}{list(shape)}")
    n = shape[-1]
    if not 1 <= n <= _DET_MAX:
        raise UnsupportedError(f"Det of {n} x {n} matrices (relay-tune expands determinants up to {_DET_MAX} x "
                               f"{_DET_MAX})")
    flat = imp.reshape(x, [*shape[:-2], n * n])
    entries = [imp.call("take", [flat, imp.const(i, "int64")], axis=len(shape) - 2) for i in range(n * n)]
    total: Expr | None = None
    for perm in itertools.permutations(range(n)):
        inversions = sum(perm[i] > perm[j] for i in range(n) for j in range(i + 1, n))
        product = entries[perm[0]]
        for row in range(1, n):
            product = imp.call("multiply", [product, entries[row * n + perm[row]]])
        if total is None:
            total = product
        else:
            total = imp.call("subtract" if inversions % 2 else "add", [total, product])
    assert total is not None
    return total
