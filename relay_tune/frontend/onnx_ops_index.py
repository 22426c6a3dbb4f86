"""ONNX converters for index-computing operators: ArgMax/ArgMin, Hardmax, TopK, GatherElements, GatherND,
ScatterElements (and the older Scatter), ScatterND and Einsum.

They are compositions of existing Relay operators over static shapes, so the interpreter and the generic
injective/reduction schedules handle them with no new Relay operator:

- arg reductions compare with the reduced extreme and take the smallest (largest, for
  `select_last_index`) position that reaches it, from a constant index ramp;
- TopK ranks every element of a row against the others (`O(n^2)` comparisons per row: meant for the
  small `n` of detection heads and tests) and gathers the first `k` ranks;
- gathers compute flat element offsets and `take` from the flattened data;
- scatters compare every output position with every update's target (`O(N * M)`): for `reduction`
  `none` the last update to a position wins, as the ONNX reference does;
- Einsum lowers a two-operand contraction onto transposes, reshapes and `nn.batch_matmul`; any other
  equation becomes a broadcast product summed over the contracted letters.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

import numpy as np

from relay_tune.errors import UnsupportedError
from relay_tune.frontend.onnx_importer import (
    Importer,
    OnnxModelError,
    OnnxNode,
    batch_matmul,
    flatten_2d,
    normalize_axis,
    relay_dtype,
    restore_shape,
)
from relay_tune.frontend.onnx_ops_math import logical_and, logical_or
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Expr
from relay_tune.op._shape import is_float_dtype, numpy_dtype


def _ramp(n: int, axis: int, rank: int) -> np.ndarray:
    """`arange(n)` (int64) shaped to broadcast along `axis` of a rank-`rank` tensor."""
    shape = [1] * rank
    shape[axis] = n
    return np.arange(n, dtype=np.int64).reshape(shape)


def _row_major_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return strides[::-1]


def _wrap_negative(imp: Importer, indices: Expr, extents: Expr | int) -> Expr:
    """int64 indices with negative values counted from the end of `extents` (a scalar or a broadcast vector)."""
    idx = imp.cast(indices, "int64")
    ext = imp.const(extents, "int64") if isinstance(extents, int) else extents
    negative = imp.call("less", [idx, imp.const(0, "int64")])
    return imp.call("where", [negative, imp.call("add", [idx, ext]), idx])


# --- arg reductions -------------------------------------------------------------------------------


def arg_extreme(imp: Importer, x: Expr, axis: int, largest: bool, last: bool, keepdims: bool) -> Expr:
    """The int64 position of the maximum (`largest`) or minimum along `axis`; the first or last on ties."""
    shape = imp.static_shape(x, "the input")
    rank = len(shape)
    extent = shape[axis]
    if extent == 0:
        raise OnnxModelError(f"arg reduction along the empty axis {axis}")
    peak = imp.call("max" if largest else "min", [x], axis=[axis], keepdims=True)
    hit = imp.call("equal", [x, peak])
    ramp = imp.const(_ramp(extent, axis, rank), "int64")
    fill = imp.const(-1 if last else extent, "int64")
    return imp.call("max" if last else "min", [imp.call("where", [hit, ramp, fill])], axis=[axis], keepdims=keepdims)


@converts("ArgMax", "ArgMin", newest=REVIEWED_OPSET)
def _arg_max_min(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    axis = normalize_axis(int(node.attrs.get("axis", 0)), imp.rank(x))
    return arg_extreme(imp, x, axis, node.op_type == "ArgMax", bool(node.attrs.get("select_last_index", 0)),
                       bool(node.attrs.get("keepdims", 1)))


@converts("Hardmax", newest=REVIEWED_OPSET)
def _hardmax(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    rank = imp.rank(x)
    if imp.opset >= 13:
        axis = normalize_axis(int(node.attrs.get("axis", -1)), rank)
        return _one_hot_of_max(imp, x, axis)
    # Before opset 13 the input is coerced to 2-D at `axis` and the maximum taken over the second part.
    axis = normalize_axis(int(node.attrs.get("axis", 1)), rank)
    shape = imp.shape(x)
    return restore_shape(imp, _one_hot_of_max(imp, flatten_2d(imp, x, axis), 1), shape)


def _one_hot_of_max(imp: Importer, x: Expr, axis: int) -> Expr:
    position = arg_extreme(imp, x, axis, largest=True, last=False, keepdims=True)
    shape = imp.static_shape(x)
    ramp = imp.const(_ramp(shape[axis], axis, len(shape)), "int64")
    return imp.cast(imp.call("equal", [ramp, position]), imp.dtype(x))


# --- TopK -----------------------------------------------------------------------------------------


@converts("TopK", newest=REVIEWED_OPSET)
def _top_k(imp: Importer, node: OnnxNode) -> list[Expr]:
    x = node.required(0)
    shape = imp.static_shape(x, "the input of TopK")
    rank = len(shape)
    axis = normalize_axis(int(node.attrs.get("axis", -1)), rank)
    k = int(node.attrs["k"]) if imp.opset < 10 else imp.static_ints(node.input(1), "the K input")[0]
    n = shape[axis]
    if not 0 <= k <= n:
        raise OnnxModelError(f"k={k} is not within the axis extent {n}")
    largest = bool(node.attrs.get("largest", 1))
    perm = [a for a in range(rank) if a != axis] + [axis]
    moved = perm != list(range(rank))
    rows = imp.call("transpose", [x], axes=perm) if moved else x
    # rank of element i = how many elements come before it: better ones, and equal ones at smaller indices
    mine = imp.call("expand_dims", [rows], axis=rank)  # (..., n, 1): element i
    theirs = imp.call("expand_dims", [rows], axis=rank - 1)  # (..., 1, n): element j
    better = imp.call("greater" if largest else "less", [theirs, mine])
    earlier = imp.const(np.arange(n)[None, :] < np.arange(n)[:, None], "bool")  # [i, j]: j < i
    before = logical_or(imp, better, logical_and(imp, imp.call("equal", [theirs, mine]), earlier))
    order = imp.call("sum", [imp.cast(before, "int64")], axis=[rank], keepdims=False)  # (..., n)
    picks = imp.call("equal", [imp.call("expand_dims", [order], axis=rank),
                               imp.const(np.arange(k, dtype=np.int64), "int64")])  # (..., n, k)
    dtype = imp.dtype(x)
    values = imp.call("sum", [imp.call("where", [picks, mine, imp.const(0, dtype)])], axis=[rank - 1])
    positions = imp.const(np.arange(n, dtype=np.int64).reshape(n, 1), "int64")
    indices = imp.call("sum", [imp.call("where", [picks, positions, imp.const(0, "int64")])], axis=[rank - 1])
    if moved:
        back = [perm.index(a) for a in range(rank)]
        values = imp.call("transpose", [values], axes=back)
        indices = imp.call("transpose", [indices], axes=back)
    return [values, indices]


# --- gathers --------------------------------------------------------------------------------------


def _element_offsets(imp: Importer, data_shape: Sequence[int], indices: Expr, axis: int) -> Expr:
    """Flat offsets into `data` of GatherElements/ScatterElements indices along `axis` (shape of `indices`)."""
    index_shape = imp.static_shape(indices, "the indices")
    strides = _row_major_strides(data_shape)
    rank = len(data_shape)
    others = sum((_ramp(index_shape[d], d, rank) * strides[d] for d in range(rank) if d != axis),
                 np.zeros([1] * rank, np.int64))
    idx = _wrap_negative(imp, indices, int(data_shape[axis]))
    return imp.call("add", [imp.call("multiply", [idx, imp.const(strides[axis], "int64")]),
                            imp.const(np.broadcast_to(others, index_shape), "int64")])


@converts("GatherElements", newest=REVIEWED_OPSET)
def _gather_elements(imp: Importer, node: OnnxNode) -> Expr:
    data, indices = node.required(0), node.required(1)
    shape = imp.static_shape(data, "the data")
    axis = normalize_axis(int(node.attrs.get("axis", 0)), len(shape))
    offsets = _element_offsets(imp, shape, indices, axis)
    return imp.call("take", [imp.reshape(data, [math.prod(shape)]), offsets], axis=0, mode="clip")


def _nd_offsets(imp: Importer, data_shape: Sequence[int], indices: Expr, batch_dims: int) -> Expr:
    """Row offsets of GatherND/ScatterND index tuples into data reshaped to (rows, *slice) (shape indices[:-1])."""
    index_shape = imp.static_shape(indices, "the indices")
    depth = index_shape[-1]
    addressed = list(data_shape[batch_dims:batch_dims + depth])
    if batch_dims + depth > len(data_shape):
        raise OnnxModelError(f"index tuples of length {depth} do not fit data of rank {len(data_shape)}")
    idx = _wrap_negative(imp, indices, imp.const(np.asarray(addressed, np.int64), "int64"))
    weighted = imp.call("multiply", [idx, imp.const(np.asarray(_row_major_strides(addressed), np.int64), "int64")])
    rows = imp.call("sum", [weighted], axis=[len(index_shape) - 1], keepdims=False)
    if batch_dims:
        outer = index_shape[:-1]
        batch = np.arange(math.prod(outer[:batch_dims]), dtype=np.int64).reshape(
            [*outer[:batch_dims], *[1] * (len(outer) - batch_dims)]) * math.prod(addressed)
        rows = imp.call("add", [rows, imp.const(batch, "int64")])
    return rows


@converts("GatherND", newest=REVIEWED_OPSET)
def _gather_nd(imp: Importer, node: OnnxNode) -> Expr:
    data, indices = node.required(0), node.required(1)
    shape = imp.static_shape(data, "the data")
    batch_dims = int(node.attrs.get("batch_dims", 0))
    depth = imp.static_shape(indices, "the indices")[-1]
    rows = _nd_offsets(imp, shape, indices, batch_dims)
    table = imp.reshape(data, [math.prod(shape[:batch_dims + depth]), *shape[batch_dims + depth:]])
    return imp.call("take", [table, rows], axis=0, mode="clip")


# --- scatters -------------------------------------------------------------------------------------


def _extreme(dtype: str, lowest: bool) -> float | int:
    np_dtype = np.dtype(numpy_dtype(dtype))
    if is_float_dtype(dtype):
        return -np.inf if lowest else np.inf
    info = np.iinfo(np_dtype)
    return int(info.min if lowest else info.max)


def _scatter_rows(imp: Importer, table: Expr, targets: Expr, updates: Expr, reduction: str) -> Expr:
    """`table (N, S)` with rows `targets (M,)` replaced by (or combined with) `updates (M, S)`."""
    rows, width = imp.static_shape(table)
    count = imp.static_shape(targets)[0]
    dtype = imp.dtype(table)
    if count == 0:
        return table
    hits = imp.call("equal", [imp.const(np.arange(rows, dtype=np.int64).reshape(rows, 1), "int64"),
                              imp.reshape(targets, [1, count])])  # (N, M)
    if reduction == "none":
        # The last update aimed at a row wins; rows no update aims at keep their value.
        ramp = imp.const(np.arange(count, dtype=np.int64).reshape(1, count), "int64")
        last = imp.call("max", [imp.call("where", [hits, ramp, imp.const(-1, "int64")])], axis=[1])
        chosen = imp.call("take", [updates, imp.call("maximum", [last, imp.const(0, "int64")])], axis=0, mode="clip")
        written = imp.reshape(imp.call("greater_equal", [last, imp.const(0, "int64")]), [rows, 1])
        return imp.call("where", [written, chosen, table])
    hits3 = imp.reshape(hits, [rows, count, 1])
    updates3 = imp.reshape(updates, [1, count, width])
    if reduction == "add":
        return imp.call("add", [table, imp.call("sum", [imp.call("where", [hits3, updates3, imp.const(0, dtype)])],
                                                axis=[1])])
    if reduction == "mul":
        return imp.call("multiply", [table, imp.call(
            "prod", [imp.call("where", [hits3, updates3, imp.const(1, dtype)])], axis=[1])])
    if reduction in ("max", "min"):
        fill = imp.const(_extreme(dtype, lowest=reduction == "max"), dtype)
        combined = imp.call(reduction, [imp.call("where", [hits3, updates3, fill])], axis=[1])
        return imp.call("maximum" if reduction == "max" else "minimum", [table, combined])
    raise OnnxModelError(f"reduction {reduction!r} (expected none, add, mul, max or min)")


@converts("ScatterElements", "Scatter", newest=REVIEWED_OPSET)
def _scatter_elements(imp: Importer, node: OnnxNode) -> Expr:
    data, indices, updates = node.required(0), node.required(1), node.required(2)
    shape = imp.static_shape(data, "the data")
    axis = normalize_axis(int(node.attrs.get("axis", 0)), len(shape))
    count = math.prod(imp.static_shape(indices, "the indices"))
    targets = imp.reshape(_element_offsets(imp, shape, indices, axis), [count])
    table = imp.reshape(data, [math.prod(shape), 1])
    out = _scatter_rows(imp, table, targets, imp.reshape(updates, [count, 1]), node.attr_str("reduction", "none"))
    return imp.reshape(out, list(shape))


@converts("ScatterND", newest=REVIEWED_OPSET)
def _scatter_nd(imp: Importer, node: OnnxNode) -> Expr:
    data, indices, updates = node.required(0), node.required(1), node.required(2)
    shape = imp.static_shape(data, "the data")
    index_shape = imp.static_shape(indices, "the indices")
    depth = index_shape[-1]
    count = math.prod(index_shape[:-1])
    width = math.prod(shape[depth:])
    targets = imp.reshape(_nd_offsets(imp, shape, indices, 0), [count])
    table = imp.reshape(data, [math.prod(shape[:depth]), width])
    out = _scatter_rows(imp, table, targets, imp.reshape(updates, [count, width]), node.attr_str("reduction", "none"))
    return imp.reshape(out, list(shape))


# --- Einsum ---------------------------------------------------------------------------------------


def _parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """The operands' letter strings and the output's, with `...` spelled out as letters the equation lacks."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise OnnxModelError(f"equation {equation!r} names {len(terms)} operands, the node has {len(ranks)}")
    spare = [c for c in string.ascii_letters if c not in equation]
    widths = [rank - (len(t) - 3) for t, rank in zip(terms, ranks) if "..." in t]
    ellipsis = "".join(spare[:max(widths, default=0)])
    expanded = []
    for term, rank in zip(terms, ranks):
        if "..." in term:
            width = rank - (len(term) - 3)
            term = term.replace("...", ellipsis[len(ellipsis) - width:] if width else "")
        if len(term) != rank or not all(c.isalpha() for c in term):
            raise OnnxModelError(f"einsum term {term!r} does not fit an operand of rank {rank}")
        expanded.append(term)
    if arrow:
        output = rhs.replace("...", ellipsis)
    else:
        counts = "".join(expanded)
        output = ellipsis + "".join(sorted(c for c in set(counts) if counts.count(c) == 1 and c not in ellipsis))
    return expanded, output


def _take_diagonals(imp: Importer, x: Expr, letters: str) -> tuple[Expr, str]:
    """`x` with every repeated letter of `letters` reduced to its diagonal."""
    while True:
        repeated = next((c for c in letters if letters.count(c) > 1), None)
        if repeated is None:
            return x, letters
        first = letters.index(repeated)
        second = letters.index(repeated, first + 1)
        shape = imp.static_shape(x, "an Einsum operand")
        mask_shape = [1] * len(shape)
        mask_shape[first] = mask_shape[second] = shape[first]
        mask = np.eye(shape[first]).reshape(mask_shape)
        x = imp.call("sum", [imp.call("multiply", [x, imp.const(mask, imp.dtype(x))])], axis=[second])
        letters = letters[:second] + letters[second + 1:]


def _sum_away(imp: Importer, x: Expr, letters: str, keep: set[str]) -> tuple[Expr, str]:
    axes = [i for i, c in enumerate(letters) if c not in keep]
    if not axes:
        return x, letters
    return imp.call("sum", [x], axis=axes), "".join(c for c in letters if c in keep)


def _arrange(imp: Importer, x: Expr, letters: str, order: str) -> Expr:
    """`x` transposed so its letters follow `order` (a permutation of `letters`)."""
    perm = [letters.index(c) for c in order]
    return x if perm == list(range(len(perm))) else imp.call("transpose", [x], axes=perm)


def _contract_pair(imp: Importer, a: Expr, la: str, b: Expr, lb: str, output: str) -> Expr | None:
    """The two-operand contraction as one batch matmul, or None when the equation is not of that form."""
    a, la = _sum_away(imp, a, la, set(lb) | set(output))
    b, lb = _sum_away(imp, b, lb, set(la) | set(output))
    batch = [c for c in output if c in la and c in lb]
    contracted = [c for c in la if c in lb and c not in output]
    free_a = [c for c in output if c in la and c not in lb]
    free_b = [c for c in output if c in lb and c not in la]
    shape_a, shape_b = imp.static_shape(a, "an Einsum operand"), imp.static_shape(b, "an Einsum operand")
    extent = {**{c: shape_b[i] for i, c in enumerate(lb)}, **{c: shape_a[i] for i, c in enumerate(la)}}
    if not contracted or any(shape_a[la.index(c)] != shape_b[lb.index(c)] for c in batch + contracted):
        return None  # an outer product, or broadcasting letters: the general form handles those
    dims = lambda letters: [extent[c] for c in letters]
    lhs = imp.reshape(_arrange(imp, a, la, "".join(batch + free_a + contracted)),
                      [*dims(batch), math.prod(dims(free_a)), math.prod(dims(contracted))])
    rhs = imp.reshape(_arrange(imp, b, lb, "".join(batch + contracted + free_b)),
                      [*dims(batch), math.prod(dims(contracted)), math.prod(dims(free_b))])
    product = imp.reshape(batch_matmul(imp, lhs, rhs), dims(batch + free_a + free_b))
    return _arrange(imp, product, "".join(batch + free_a + free_b), output)


def _broadcast_product(imp: Importer, operands: Sequence[tuple[Expr, str]], output: str) -> Expr:
    """The product of all operands over the union of their letters, summed over the letters not in `output`."""
    seen = "".join(letters for _, letters in operands)
    full = output + "".join(dict.fromkeys(c for c in seen if c not in output))
    product: Expr | None = None
    for x, letters in operands:
        arranged = _arrange(imp, x, letters, "".join(c for c in full if c in letters))
        shape = imp.static_shape(x, "an Einsum operand")
        spread = [shape[letters.index(c)] if c in letters else 1 for c in full]
        arranged = imp.reshape(arranged, spread)
        product = arranged if product is None else imp.call("multiply", [product, arranged])
    assert product is not None
    contracted = list(range(len(output), len(full)))
    return imp.call("sum", [product], axis=contracted) if contracted else product


@converts("Einsum", newest=REVIEWED_OPSET)
def _einsum(imp: Importer, node: OnnxNode) -> Expr:
    operands = [x for x in node.inputs if x is not None]
    if not operands:
        raise OnnxModelError("Einsum needs at least one operand")
    terms, output = _parse_einsum(node.attr_str("equation", ""), [imp.rank(x) for x in operands])
    unknown = set(output) - set("".join(terms))
    if unknown or len(set(output)) != len(output):
        raise OnnxModelError(f"the output letters {output!r} must be distinct letters of the operands")
    reduced = [_take_diagonals(imp, x, letters) for x, letters in zip(operands, terms)]
    if len(reduced) == 2 and is_float_dtype(imp.dtype(operands[0])):
        (a, la), (b, lb) = reduced
        contraction = _contract_pair(imp, a, la, b, lb, output)
        if contraction is not None:
            return contraction
    if any(not isinstance(d, int) for x in operands for d in imp.shape(x)):
        raise UnsupportedError("Einsum on dynamic shapes")
    return _broadcast_product(imp, reduced, output)


# --- CenterCropPad --------------------------------------------------------------------------------


@converts("CenterCropPad", newest=REVIEWED_OPSET)
def _center_crop_pad(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    shape = imp.static_shape(x, "the input")
    rank = len(shape)
    sizes = imp.static_ints(node.input(1), "the shape input")
    axes = [normalize_axis(int(a), rank) for a in node.attrs.get("axes", range(rank))]
    if len(sizes) != len(axes):
        raise OnnxModelError(f"shape {sizes} must give one size per axis of {axes}")
    widths = [[0, 0] for _ in range(rank)]
    begin, end, cropped = [], [], []
    for axis, size in zip(axes, sizes):
        extent = shape[axis]
        if size < extent:  # the centre, the odd element left out at the end
            start = (extent - size) // 2
            begin.append(start)
            end.append(start + size)
            cropped.append(axis)
        elif size > extent:  # zeros around, the odd one at the end
            widths[axis] = [(size - extent) // 2, size - extent - (size - extent) // 2]
    if cropped:
        x = imp.call("strided_slice", [x], begin=begin, end=end, axes=cropped)
    if any(b or a for b, a in widths):
        x = imp.call("nn.pad", [x, imp.const(0, imp.dtype(x))], pad_width=widths)
    return x


@converts("EyeLike", newest=REVIEWED_OPSET)
def _eye_like(imp: Importer, node: OnnxNode) -> Expr:
    """Ones on the `k`-th diagonal of a matrix shaped like the input: a constant (only the shape is read)."""
    rows, cols = imp.static_shape(node.required(0), "the input of EyeLike")
    dtype = relay_dtype(int(node.attrs["dtype"]), "EyeLike dtype") if "dtype" in node.attrs else imp.dtype(
        node.required(0))
    return imp.const(np.eye(rows, cols, k=int(node.attrs.get("k", 0))), dtype)
