"""Shape and data-movement (injective) operators.

Type relations follow TVM (see each rule's comment for the cases where we deliberately differ);
the numpy references are the correctness oracle and reuse the relations' shape computations so
the two can never disagree about the output shape.

Arguments that are tuples (the single argument of `concatenate` and `stack`) arrive at the
reference as a sequence of arrays in `inputs[0]`; `split` returns a tuple of arrays.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay_tune.errors import RelayTuneError, RelayTypeError, UnsupportedError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.types import ANY, AnyDim, Dim, TensorType, TupleType, Type
from relay_tune.op._shape import (
    Layout,
    as_int_tuple,
    check_rank,
    expect_arity,
    expect_tensor,
    expect_tensor_tuple,
    format_dim,
    format_shape,
    is_int_dtype,
    is_static,
    layout_transform_shape,
    merge_dims,
    normalize_axis,
    prod,
    same_dtype,
)
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

I = OpPattern.INJECTIVE  # noqa: E741

register_op("reshape", 1, I, {"newshape": None, "allowzero": 0}, "relay.attrs.ReshapeAttrs", required=("newshape",))
register_op("transpose", 1, I, {"axes": None}, "relay.attrs.TransposeAttrs")
register_op(
    "expand_dims", 1, OpPattern.BROADCAST, {"axis": None, "num_newaxis": 1}, "relay.attrs.ExpandDimsAttrs",
    required=("axis",),
)
register_op("squeeze", 1, I, {"axis": None}, "relay.attrs.SqueezeAttrs")
register_op("concatenate", 1, I, {"axis": 0}, "relay.attrs.ConcatenateAttrs")
register_op("stack", 1, I, {"axis": 0}, "relay.attrs.StackAttrs")
register_op(
    "split", 1, I, {"indices_or_sections": None, "axis": 0}, "relay.attrs.SplitAttrs",
    required=("indices_or_sections",),
)
register_op(
    "strided_slice", 1, I,
    {"begin": None, "end": None, "strides": None, "axes": None, "slice_mode": "end"},
    "relay.attrs.StridedSliceAttrs", required=("begin", "end"),
)
register_op("take", 2, I, {"axis": None, "batch_dims": 0, "mode": "clip"}, "relay.attrs.TakeAttrs")
register_op("nn.batch_flatten", 1, I)
register_op(
    "nn.pad", 2, I, {"pad_width": None, "pad_mode": "constant"}, "relay.attrs.PadAttrs", required=("pad_width",)
)
register_op(
    "layout_transform", 1, I, {"src_layout": "", "dst_layout": ""}, "relay.attrs.LayoutTransformAttrs",
    required=("src_layout", "dst_layout"),
)
register_op(
    "nn.upsampling", 1, I,
    {"scale_h": 1.0, "scale_w": 1.0, "layout": "NCHW", "method": "nearest_neighbor", "align_corners": False},
    "relay.attrs.UpSamplingAttrs",
)

Array = np.ndarray


MAX_SPLIT_SECTIONS = 1 << 16  # split parts of an axis of unknown extent

def _single_tensor(arg_types: Sequence[Type], op_name: str) -> TensorType:
    expect_arity(arg_types, 1, op_name)
    return expect_tensor(arg_types[0], op_name)


def _static_shape(shape: Sequence[Dim]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# reshape
# --------------------------------------------------------------------------------------------


def reshape_shape(shape: Sequence[Dim], newshape: Any, allowzero: bool = False) -> tuple[Dim, ...]:
    """Output shape of `reshape`, with the MXNet-style special values.

    0 copies the input dimension at the current position (a literal 0 when `allowzero`), -1 is
    inferred from the remaining elements, -2 copies all remaining input dimensions, -3 merges the
    next two input dimensions, -4 splits the next input dimension into the two values that follow
    it (one of which may be -1). Every value except -2 consumes one input position (-3 two).
    """
    reading = _NewshapeReading(tuple(shape), as_int_tuple(newshape, op_name="reshape", what="newshape"))
    spec = reading.spec
    while reading.i < len(spec):
        value = spec[reading.i]
        if value > 0 or (value == 0 and allowzero):
            reading.literal(value)
        elif value in _SPECIAL_VALUES:
            _SPECIAL_VALUES[value](reading)
        else:
            raise RelayTypeError(f"newshape {list(spec)}: unsupported special value {value}", op_name="reshape")
        reading.i += 1
    reading.infer()
    out = reading.out
    if is_static(shape) and is_static(out) and prod(shape) != prod(out):
        raise RelayTypeError(
            f"cannot reshape {format_shape(shape)} ({prod(shape)} elements) to {format_shape(out)} "
            f"({prod(out)} elements)",
            op_name="reshape",
        )
    return tuple(out)


@dataclass
class _NewshapeReading:
    """A reshape's newshape read left to right: the output dimensions so far, the newshape position `i` and input
    axis `src` reached, and the -1's output position. Dimensions copied straight from input to output (`used_in`,
    `used_out`) do not take part in inferring -1; that is what lets `reshape(x: (?, 3, 4), [0, -1])` give (?, 12)
    instead of an unknown."""

    shape: tuple[Dim, ...]
    spec: tuple[int, ...]
    out: list[Dim] = field(default_factory=list)
    used_in: set[int] = field(default_factory=set)
    used_out: set[int] = field(default_factory=set)
    infer_at: int | None = None
    src: int = 0
    i: int = 0

    def need_input(self, count: int, value: int) -> None:
        """Raises unless `count` input axes remain from `src` for the special value `value`."""
        if self.src + count > len(self.shape):
            raise RelayTypeError(
                f"newshape {list(self.spec)}: value {value} at position {self.i} needs input axis "
                f"{self.src + count - 1}, but the input shape {format_shape(self.shape)} has rank {len(self.shape)}",
                op_name="reshape",
            )

    def copy_input(self) -> None:
        """Copies input axis `src` to the output."""
        self.used_in.add(self.src)
        self.used_out.add(len(self.out))
        self.out.append(self.shape[self.src])
        self.src += 1

    def literal(self, value: int) -> None:
        """A dimension given as is (a positive value, or 0 with `allowzero`)."""
        self.out.append(value)
        self.src += 1

    def copy_one(self) -> None:
        """0: the input dimension at the current position."""
        self.need_input(1, 0)
        self.copy_input()

    def mark_inferred(self) -> None:
        """-1: a dimension inferred from the remaining elements (`infer`)."""
        if self.infer_at is not None:
            raise RelayTypeError(f"newshape {list(self.spec)} has more than one -1", op_name="reshape")
        self.infer_at = len(self.out)
        self.out.append(1)
        self.src += 1

    def copy_rest(self) -> None:
        """-2: all the remaining input dimensions."""
        while self.src < len(self.shape):
            self.copy_input()

    def merge_two(self) -> None:
        """-3: the product of the next two input dimensions."""
        self.need_input(2, -3)
        self.used_in.update((self.src, self.src + 1))
        self.used_out.add(len(self.out))
        self.out.append(prod(self.shape[self.src : self.src + 2]))
        self.src += 2

    def split_one(self) -> None:
        """-4 a b: the next input dimension split into a x b (one of them may be -1); consumes a and b too."""
        if self.i + 2 >= len(self.spec):
            raise RelayTypeError(f"newshape {list(self.spec)}: -4 must be followed by two values", op_name="reshape")
        self.need_input(1, -4)
        whole = self.shape[self.src]
        self.used_in.add(self.src)
        self.src += 1
        parts = [self.spec[self.i + 1], self.spec[self.i + 2]]
        self.i += 2
        for d in _split_dims(self.spec, whole, parts):
            self.used_out.add(len(self.out))
            self.out.append(d)

    def infer(self) -> None:
        """Fills in the -1's dimension, if there is one, from the elements the other dimensions leave."""
        if self.infer_at is None:
            return
        rest_in = prod(d for k, d in enumerate(self.shape) if k not in self.used_in)
        rest_out = prod(d for k, d in enumerate(self.out) if k not in self.used_out and k != self.infer_at)
        if isinstance(rest_in, AnyDim) or isinstance(rest_out, AnyDim):
            self.out[self.infer_at] = ANY
        elif rest_out == 0 or rest_in % rest_out != 0:
            raise RelayTypeError(
                f"cannot reshape {format_shape(self.shape)} to newshape {list(self.spec)}: "
                f"{rest_in} elements do not divide into dimensions of product {rest_out}",
                op_name="reshape",
            )
        else:
            self.out[self.infer_at] = rest_in // rest_out


def _split_dims(spec: tuple[int, ...], whole: Dim, parts: list[int]) -> list[Dim]:
    """The two dimensions -4 splits the input dimension `whole` into, given as `parts` (one may be -1)."""
    if parts.count(-1) == 2 or any(p == 0 or p < -1 for p in parts):
        raise RelayTypeError(
            f"newshape {list(spec)}: the two values after -4 must be positive (one may be -1), got {parts}",
            op_name="reshape",
        )
    split: list[Dim] = list(parts)
    if -1 in parts:
        known = parts[1 - parts.index(-1)]
        if isinstance(whole, int) and whole % known != 0:
            raise RelayTypeError(
                f"newshape {list(spec)}: cannot split input dimension {whole} into blocks of {known}",
                op_name="reshape",
            )
        split[parts.index(-1)] = ANY if isinstance(whole, AnyDim) else whole // known
    elif isinstance(whole, int) and parts[0] * parts[1] != whole:
        raise RelayTypeError(
            f"newshape {list(spec)}: cannot split input dimension {whole} into {parts[0]} x {parts[1]}",
            op_name="reshape",
        )
    return split


# what each special value of a newshape does (0 only without `allowzero`)
_SPECIAL_VALUES: dict[int, Callable[[_NewshapeReading], None]] = {
    0: _NewshapeReading.copy_one,
    -1: _NewshapeReading.mark_inferred,
    -2: _NewshapeReading.copy_rest,
    -3: _NewshapeReading.merge_two,
    -4: _NewshapeReading.split_one,
}


@type_relation("reshape")
def _reshape_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "reshape")
    return TensorType(reshape_shape(x.shape, attrs["newshape"], bool(attrs["allowzero"])), x.dtype)


@reference("reshape")
def _reshape_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    return x.reshape(_static_shape(reshape_shape(x.shape, attrs["newshape"], bool(attrs["allowzero"]))))


# --------------------------------------------------------------------------------------------
# transpose, expand_dims, squeeze, batch_flatten
# --------------------------------------------------------------------------------------------


def transpose_axes(ndim: int, axes: Any) -> tuple[int, ...]:
    """The permutation `transpose` applies; None reverses the axes."""
    if axes is None:
        return tuple(reversed(range(ndim)))
    items = as_int_tuple(axes, op_name="transpose", what="axes")
    perm = tuple(normalize_axis(a, ndim, op_name="transpose", what="axes entry") for a in items)
    if sorted(perm) != list(range(ndim)):
        raise RelayTypeError(
            f"axes {list(items)} is not a permutation of the {ndim} axes of the input", op_name="transpose"
        )
    return perm


@type_relation("transpose")
def _transpose_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "transpose")
    return TensorType(tuple(x.shape[a] for a in transpose_axes(x.ndim, attrs["axes"])), x.dtype)


@reference("transpose")
def _transpose_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    return np.transpose(x, transpose_axes(x.ndim, attrs["axes"]))


def _expand_dims_shape(shape: Sequence[Dim], attrs: Attrs) -> tuple[Dim, ...]:
    count = attrs["num_newaxis"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise RelayTypeError(f"num_newaxis must be a non-negative integer, got {count!r}", op_name="expand_dims")
    check_rank(len(shape) + count, "expand_dims")  # before `[1] * count` is built
    # The new axes may go anywhere from before the first axis to after the last.
    axis = normalize_axis(attrs["axis"], len(shape) + 1, op_name="expand_dims")
    return (*shape[:axis], *([1] * count), *shape[axis:])


@type_relation("expand_dims")
def _expand_dims_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "expand_dims")
    return TensorType(_expand_dims_shape(x.shape, attrs), x.dtype)


@reference("expand_dims")
def _expand_dims_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    return x.reshape(_static_shape(_expand_dims_shape(x.shape, attrs)))


def _squeeze_shape(shape: Sequence[Dim], axis: Any) -> tuple[Dim, ...]:
    if axis is None:
        # A `?` dimension might be 1 at run time, but dropping it would change the rank: keep it.
        return tuple(d for d in shape if d != 1)
    items = as_int_tuple(axis, op_name="squeeze", what="axis")
    drop = {normalize_axis(a, len(shape), op_name="squeeze") for a in items}
    for a in sorted(drop):
        if isinstance(shape[a], int) and shape[a] != 1:
            raise RelayTypeError(
                f"cannot squeeze axis {a} of shape {format_shape(shape)}: its extent is {shape[a]}, not 1",
                op_name="squeeze",
            )
    return tuple(d for i, d in enumerate(shape) if i not in drop)


@type_relation("squeeze")
def _squeeze_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "squeeze")
    return TensorType(_squeeze_shape(x.shape, attrs["axis"]), x.dtype)


@reference("squeeze")
def _squeeze_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    return x.reshape(_static_shape(_squeeze_shape(x.shape, attrs["axis"])))


def _batch_flatten_shape(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    if not shape:
        raise RelayTypeError("requires a tensor of rank >= 1, got a scalar", op_name="nn.batch_flatten")
    return (shape[0], prod(shape[1:]))


@type_relation("nn.batch_flatten")
def _batch_flatten_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "nn.batch_flatten")
    return TensorType(_batch_flatten_shape(x.shape), x.dtype)


@reference("nn.batch_flatten")
def _batch_flatten_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    return x.reshape(_static_shape(_batch_flatten_shape(x.shape)))


# --------------------------------------------------------------------------------------------
# concatenate, stack, split
# --------------------------------------------------------------------------------------------


def _concatenate_type(fields: tuple[TensorType, ...], axis_attr: Any) -> TensorType:
    op = "concatenate"
    dtype = same_dtype(fields, op)
    ndim = fields[0].ndim
    if ndim == 0:
        raise RelayTypeError("cannot concatenate scalars (rank-0 tensors)", op_name=op)
    shapes = ", ".join(format_shape(f.shape) for f in fields)
    if any(f.ndim != ndim for f in fields):
        raise RelayTypeError(f"all inputs must have the same rank, got shapes {shapes}", op_name=op)
    axis = normalize_axis(axis_attr, ndim, op_name=op)
    out: list[Dim] = []
    for k in range(ndim):
        if k == axis:
            out.append(_sum_dims(f.shape[k] for f in fields))
            continue
        merged: Dim | None = fields[0].shape[k]
        for f in fields[1:]:
            merged = None if merged is None else merge_dims(merged, f.shape[k])
        if merged is None:
            raise RelayTypeError(
                f"inputs must agree on every axis except the concatenation axis {axis}; "
                f"got shapes {shapes} (axis {k} differs)",
                op_name=op,
            )
        out.append(merged)
    return TensorType(tuple(out), dtype)


def _sum_dims(dims: Any) -> Dim:
    total = 0
    for d in dims:
        if isinstance(d, AnyDim):
            return ANY
        total += d
    return total


@type_relation("concatenate")
def _concatenate_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 1, "concatenate")
    return _concatenate_type(expect_tensor_tuple(arg_types[0], "concatenate"), attrs["axis"])


@reference("concatenate")
def _concatenate_ref(inputs: Sequence[Any], attrs: Attrs) -> Array:
    arrays = [np.asarray(a) for a in inputs[0]]
    axis = normalize_axis(attrs["axis"], arrays[0].ndim, op_name="concatenate")
    return np.concatenate(arrays, axis=axis)


@type_relation("stack")
def _stack_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    op = "stack"
    expect_arity(arg_types, 1, op)
    fields = expect_tensor_tuple(arg_types[0], op)
    dtype = same_dtype(fields, op)
    shape: list[Dim] | None = list(fields[0].shape)
    for f in fields[1:]:
        if shape is None or f.ndim != len(shape):
            shape = None
            break
        merged = [merge_dims(a, b) for a, b in zip(shape, f.shape)]
        shape = None if any(m is None for m in merged) else merged  # type: ignore[assignment]
    if shape is None:
        shapes = ", ".join(format_shape(f.shape) for f in fields)
        raise RelayTypeError(f"all inputs must have the same shape, got {shapes}", op_name=op)
    axis = normalize_axis(attrs["axis"], len(shape) + 1, op_name=op)
    return TensorType((*shape[:axis], len(fields), *shape[axis:]), dtype)


@reference("stack")
def _stack_ref(inputs: Sequence[Any], attrs: Attrs) -> Array:
    arrays = [np.asarray(a) for a in inputs[0]]
    axis = normalize_axis(attrs["axis"], arrays[0].ndim + 1, op_name="stack")
    return np.stack(arrays, axis=axis)


def split_points(extent: Dim, indices_or_sections: Any) -> list[tuple[Dim, Dim]]:
    """(start, stop) of each part along the split axis; `stop` is ANY when the extent is unknown."""
    op = "split"
    if isinstance(indices_or_sections, int) and not isinstance(indices_or_sections, bool):
        sections = indices_or_sections
        if sections <= 0:
            raise RelayTypeError(
                f"indices_or_sections must be a positive number of sections, got {sections}", op_name=op
            )
        if isinstance(extent, AnyDim):
            if sections > MAX_SPLIT_SECTIONS:  # the type would be a tuple of that many tensors
                raise RelayTypeError(f"indices_or_sections={sections} is more parts than any axis holds", op_name=op)
            return [(ANY, ANY)] * sections
        if extent % sections != 0:
            raise RelayTypeError(f"an axis of extent {extent} cannot be split into {sections} equal parts", op_name=op)
        step = extent // sections
        return [(k * step, (k + 1) * step) for k in range(sections)]
    indices = as_int_tuple(indices_or_sections, op_name=op, what="indices_or_sections")
    # TVM requires strictly increasing split points inside the axis (no empty parts).
    bounds = [0, *indices]
    for prev, cur in itertools.pairwise(bounds):
        if cur <= prev:
            raise RelayTypeError(
                f"split indices {list(indices)} must be strictly increasing and positive", op_name=op
            )
    if isinstance(extent, int) and indices and indices[-1] >= extent:
        raise RelayTypeError(
            f"split indices {list(indices)} must lie inside the axis of extent {extent}", op_name=op
        )
    return [*itertools.pairwise(bounds), (bounds[-1], extent)]


@type_relation("split")
def _split_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "split")
    axis = normalize_axis(attrs["axis"], x.ndim, op_name="split")
    fields = []
    for start, stop in split_points(x.shape[axis], attrs["indices_or_sections"]):
        length: Dim = ANY if isinstance(stop, AnyDim) or isinstance(start, AnyDim) else stop - start
        fields.append(TensorType((*x.shape[:axis], length, *x.shape[axis + 1 :]), x.dtype))
    return TupleType(tuple(fields))


@reference("split")
def _split_ref(inputs: Sequence[Array], attrs: Attrs) -> tuple[Array, ...]:
    x = np.asarray(inputs[0])
    axis = normalize_axis(attrs["axis"], x.ndim, op_name="split")
    parts = []
    for start, stop in split_points(x.shape[axis], attrs["indices_or_sections"]):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        parts.append(x[tuple(index)])
    return tuple(parts)


# --------------------------------------------------------------------------------------------
# strided_slice
# --------------------------------------------------------------------------------------------


def _canonical_index(index: int, extent: int, stride: int) -> int:
    """Negative indices count from the end; then clamp into the range a slice can reach."""
    low, high = (-1, extent - 1) if stride < 0 else (0, extent)
    if index < 0:
        index += extent
    return min(max(index, low), high)


_TO_END = 2**63 - 1


def _slice_specs(shape: Sequence[Dim], attrs: Attrs) -> list[tuple[int, int, int, int]]:
    """(axis, begin, end, stride) per sliced axis, with `size` mode converted to end/stride 1.

    `begin`/`end` are raw (not canonicalised) because the extent may be `?`.
    """
    op = "strided_slice"
    ndim = len(shape)
    begin = as_int_tuple(attrs["begin"], op_name=op, what="begin")
    end = as_int_tuple(attrs["end"], op_name=op, what="end")
    strides = () if attrs["strides"] is None else as_int_tuple(attrs["strides"], op_name=op, what="strides")
    mode = attrs["slice_mode"]
    if mode not in ("end", "size"):
        raise RelayTypeError(f"slice_mode must be 'end' or 'size', got {mode!r}", op_name=op)
    if attrs["axes"] is None:
        if max(len(begin), len(end), len(strides)) > ndim:
            raise RelayTypeError(
                f"begin {list(begin)} / end {list(end)} / strides {list(strides)} are longer than the rank of "
                f"the input shape {format_shape(shape)}",
                op_name=op,
            )
        axes = tuple(range(ndim))
        # Missing trailing entries take the whole axis.
        begin = begin + (0,) * (ndim - len(begin))
        end = end + (_TO_END,) * (ndim - len(end))
    else:
        raw_axes = as_int_tuple(attrs["axes"], op_name=op, what="axes")
        axes = tuple(normalize_axis(a, ndim, op_name=op, what="axes entry") for a in raw_axes)
        if len(set(axes)) != len(axes):
            raise RelayTypeError(f"axes {list(raw_axes)} names the same axis twice", op_name=op)
        if not len(begin) == len(end) == len(axes) or len(strides) > len(axes):
            raise RelayTypeError(
                f"with axes {list(raw_axes)}, begin {list(begin)} and end {list(end)} need one entry per axis",
                op_name=op,
            )
    strides = strides + (1,) * (len(axes) - len(strides))
    specs = []
    for axis, b, e, s in zip(axes, begin, end, strides):
        if mode == "size":
            # The size counts from the begin position; -1 means "to the end". Strides are ignored.
            s = 1
            if e < 0:
                e = _TO_END
            else:
                extent = shape[axis]
                start = b + extent if b < 0 and isinstance(extent, int) else b
                e = start + e if start >= 0 else _TO_END
        if s == 0:
            raise RelayTypeError(f"stride of axis {axis} is 0", op_name=op)
        specs.append((axis, b, e, s))
    return specs


def _slice_range(extent: int, begin: int, end: int, stride: int) -> range:
    return range(_canonical_index(begin, extent, stride), _canonical_index(end, extent, stride), stride)


def _strided_slice_shape(shape: Sequence[Dim], attrs: Attrs) -> tuple[Dim, ...]:
    out = list(shape)
    for axis, b, e, s in _slice_specs(shape, attrs):
        extent = shape[axis]
        out[axis] = ANY if isinstance(extent, AnyDim) else len(_slice_range(extent, b, e, s))
    return tuple(out)


@type_relation("strided_slice")
def _strided_slice_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "strided_slice")
    return TensorType(_strided_slice_shape(x.shape, attrs), x.dtype)


@reference("strided_slice")
def _strided_slice_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    index: list[slice] = [slice(None)] * x.ndim
    for axis, b, e, s in _slice_specs(x.shape, attrs):
        r = _slice_range(x.shape[axis], b, e, s)
        # A stop of -1 (walking backwards past index 0) must become None: -1 means "last" to numpy.
        index[axis] = slice(r.start, r.stop, s) if r and r.stop >= 0 else (
            slice(r.start, None, s) if r else slice(0, 0)
        )
    return x[tuple(index)]


# --------------------------------------------------------------------------------------------
# take
# --------------------------------------------------------------------------------------------

TAKE_MODES = ("clip", "wrap", "fast")


def _take_type(data: TensorType, indices: TensorType, attrs: Attrs) -> TensorType:
    op = "take"
    if not is_int_dtype(indices.dtype):
        raise RelayTypeError(f"indices must be an integer tensor, got {indices}", op_name=op)
    if attrs["mode"] not in TAKE_MODES:
        raise RelayTypeError(f"mode must be one of {', '.join(TAKE_MODES)}, got {attrs['mode']!r}", op_name=op)
    if attrs["axis"] is None:
        return TensorType(indices.shape, data.dtype)
    if data.ndim == 0:
        raise RelayTypeError("cannot take along an axis of a scalar", op_name=op)
    axis = normalize_axis(attrs["axis"], data.ndim, op_name=op)
    batch_dims = _batch_dims(attrs["batch_dims"], indices.ndim, axis)
    batch: list[Dim] = []
    for k in range(batch_dims):
        merged = merge_dims(data.shape[k], indices.shape[k])
        if merged is None:
            raise RelayTypeError(
                f"with batch_dims={batch_dims}, data {format_shape(data.shape)} and indices "
                f"{format_shape(indices.shape)} must agree on axis {k}",
                op_name=op,
            )
        batch.append(merged)
    shape = (*batch, *data.shape[batch_dims:axis], *indices.shape[batch_dims:], *data.shape[axis + 1 :])
    return TensorType(shape, data.dtype)


def _batch_dims(value: Any, indices_ndim: int, axis: int) -> int:
    op = "take"
    if isinstance(value, bool) or not isinstance(value, int):
        raise RelayTypeError(f"batch_dims must be an integer, got {value!r}", op_name=op)
    batch_dims = value + indices_ndim if value < 0 else value
    if not 0 <= batch_dims <= indices_ndim:
        raise RelayTypeError(f"batch_dims {value} is out of range for indices of rank {indices_ndim}", op_name=op)
    if batch_dims > axis:
        raise RelayTypeError(f"batch_dims {value} must not exceed axis {axis}", op_name=op)
    return batch_dims


@type_relation("take")
def _take_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 2, "take")
    data = expect_tensor(arg_types[0], "take", "data")
    indices = expect_tensor(arg_types[1], "take", "indices")
    return _take_type(data, indices, attrs)


def _resolve_indices(indices: Array, extent: int, mode: str) -> Array:
    """Map raw indices into [0, extent) the way each mode does."""
    idx = indices.astype(np.int64)
    if mode == "clip":
        # Negative indices clip to 0 (they do *not* count from the end).
        return np.clip(idx, 0, extent - 1)
    if mode == "wrap":
        return np.mod(idx, extent)
    bad = (idx < 0) | (idx >= extent)
    if bad.any():
        raise RelayTuneError(
            f"take(mode='fast'): index {int(idx[bad].flat[0])} is out of range for an axis of extent {extent}; "
            "fast mode assumes in-range indices"
        )
    return idx


@reference("take")
def _take_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    data, indices = np.asarray(inputs[0]), np.asarray(inputs[1])
    out_type = _take_type(TensorType(data.shape, data.dtype.name), TensorType(indices.shape, indices.dtype.name), attrs)
    mode = attrs["mode"]
    if attrs["axis"] is None:
        flat = data.reshape(-1)
        if flat.size == 0 and indices.size:
            raise RelayTuneError("take: cannot index into an empty tensor")
        return flat[_resolve_indices(indices, flat.size, mode)] if indices.size else np.zeros(indices.shape, data.dtype)
    axis = normalize_axis(attrs["axis"], data.ndim, op_name="take")
    batch_dims = _batch_dims(attrs["batch_dims"], indices.ndim, axis)
    out_shape = _static_shape(out_type.shape)
    if indices.size == 0:
        return np.zeros(out_shape, data.dtype)
    if data.shape[axis] == 0:
        raise RelayTuneError(f"take: cannot index into axis {axis} of extent 0")
    idx = _resolve_indices(indices, data.shape[axis], mode)
    if batch_dims == 0:
        return np.take(data, idx, axis=axis)
    out = np.empty(out_shape, data.dtype)
    for b in np.ndindex(*data.shape[:batch_dims]):
        out[b] = np.take(data[b], idx[b], axis=axis - batch_dims)
    return out


# --------------------------------------------------------------------------------------------
# nn.pad
# --------------------------------------------------------------------------------------------

PAD_MODES = ("constant", "edge", "reflect")


def _pad_widths(shape: Sequence[Dim], attrs: Attrs) -> list[tuple[int, int]]:
    op = "nn.pad"
    raw = attrs["pad_width"]
    mode = attrs["pad_mode"]
    if mode not in PAD_MODES:
        raise RelayTypeError(f"pad_mode must be one of {', '.join(PAD_MODES)}, got {mode!r}", op_name=op)
    if not isinstance(raw, tuple) or len(raw) != len(shape):
        raise RelayTypeError(
            f"pad_width {raw!r} must hold one [before, after] pair per axis of {format_shape(shape)}", op_name=op
        )
    widths = []
    for axis, pair in enumerate(raw):
        pair_ints = as_int_tuple(pair, op_name=op, what=f"pad_width[{axis}]")
        if len(pair_ints) != 2 or min(pair_ints) < 0:
            raise RelayTypeError(
                f"pad_width[{axis}] must be a [before, after] pair of non-negative integers, got {pair!r}", op_name=op
            )
        extent = shape[axis]
        if isinstance(extent, int) and max(pair_ints) > 0:
            # Edge padding needs an element to copy; reflection (which excludes the edge element
            # itself) can reach at most extent - 1 elements in.
            if mode == "edge" and extent == 0:
                raise RelayTypeError(f"edge padding of axis {axis}, which is empty", op_name=op)
            if mode == "reflect" and max(pair_ints) > extent - 1:
                raise RelayTypeError(
                    f"reflect padding of {max(pair_ints)} on axis {axis} of extent {extent} "
                    f"is larger than {extent - 1}",
                    op_name=op,
                )
        widths.append((pair_ints[0], pair_ints[1]))
    return widths


def _pad_shape(shape: Sequence[Dim], widths: list[tuple[int, int]]) -> tuple[Dim, ...]:
    return tuple(ANY if isinstance(d, AnyDim) else d + b + a for d, (b, a) in zip(shape, widths))


@type_relation("nn.pad")
def _pad_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 2, "nn.pad")
    data = expect_tensor(arg_types[0], "nn.pad", "data")
    # The pad value's dtype need not match: it is converted (programs pad float16 data with `0`).
    value = expect_tensor(arg_types[1], "nn.pad", "pad value")
    if value.ndim != 0:
        raise RelayTypeError(f"the pad value must be a scalar, got {value}", op_name="nn.pad")
    return TensorType(_pad_shape(data.shape, _pad_widths(data.shape, attrs)), data.dtype)


@reference("nn.pad")
def _pad_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    data = np.asarray(inputs[0])
    widths = _pad_widths(data.shape, attrs)
    mode = attrs["pad_mode"]
    if mode == "constant":
        with np.errstate(all="ignore"):
            fill = np.asarray(inputs[1]).astype(data.dtype)
        return np.pad(data, widths, mode="constant", constant_values=fill)
    return np.pad(data, widths, mode=mode)


# --------------------------------------------------------------------------------------------
# layout_transform
# --------------------------------------------------------------------------------------------


def _layouts(attrs: Attrs) -> tuple[Layout, Layout]:
    op = "layout_transform"
    return Layout.parse(attrs["src_layout"], op), Layout.parse(attrs["dst_layout"], op)


@type_relation("layout_transform")
def _layout_transform_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "layout_transform")
    src, dst = _layouts(attrs)
    return TensorType(layout_transform_shape(x.shape, src, dst, "layout_transform"), x.dtype)


def to_logical(x: Array, layout: Layout) -> Array:
    """Undo the blocking of `layout`: one axis per primal axis, in the layout's primal order."""
    perm: list[int] = []
    merged: list[int] = []
    for name in layout.primal_names:
        outer = layout.primal_index(name)
        inner = layout.sub_index(name)
        perm.append(outer)
        if inner is None:
            merged.append(x.shape[outer])
        else:
            # Block index is the slow part, position within the block the fast part.
            perm.append(inner)
            merged.append(x.shape[outer] * x.shape[inner])
    return x.transpose(perm).reshape(merged)


def from_logical(y: Array, names: Sequence[str], layout: Layout) -> Array:
    """Lay out `y` (one axis per primal axis, ordered as `names`) in `layout`."""
    y = y.transpose([list(names).index(n) for n in layout.primal_names])
    split_shape: list[int] = []
    positions: list[int] = []
    for k, name in enumerate(layout.primal_names):
        factor = layout.factor_of(name)
        if factor is None:
            split_shape.append(y.shape[k])
            positions.append(layout.primal_index(name))
        else:
            split_shape += [y.shape[k] // factor, factor]
            positions += [layout.primal_index(name), layout.sub_index(name)]  # type: ignore[list-item]
    z = y.reshape(split_shape)
    return z.transpose([positions.index(j) for j in range(layout.ndim)])


@reference("layout_transform")
def _layout_transform_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    src, dst = _layouts(attrs)
    layout_transform_shape(x.shape, src, dst, "layout_transform")  # validates divisibility
    return np.ascontiguousarray(from_logical(to_logical(x, src), src.primal_names, dst))


# --------------------------------------------------------------------------------------------
# nn.upsampling
# --------------------------------------------------------------------------------------------

UPSAMPLING_METHODS = ("nearest_neighbor", "bilinear", "bicubic")


def _upsampling_layout(attrs: Attrs) -> tuple[int, int]:
    """Positions of the H and W axes; the layout must be NCHW-like with unblocked H and W."""
    op = "nn.upsampling"
    layout = Layout.parse(attrs["layout"], op)
    if sorted(layout.primal_names) != sorted("NCHW") or layout.factor_of("H") or layout.factor_of("W"):
        raise RelayTypeError(
            f"layout {layout} is not convertible to NCHW with unsplit H and W axes", op_name=op
        )
    if attrs["method"] not in UPSAMPLING_METHODS:
        raise RelayTypeError(
            f"method must be one of {', '.join(UPSAMPLING_METHODS)}, got {attrs['method']!r}", op_name=op
        )
    return layout.primal_index("H"), layout.primal_index("W")


def _scaled(extent: Dim, scale: Any) -> Dim:
    if isinstance(extent, AnyDim):
        return ANY
    # TVM rounds the scaled extent with nearbyint (ties to even), as Python's round does.
    return round(extent * float(scale))


def _upsampling_shape(shape: Sequence[Dim], attrs: Attrs) -> tuple[Dim, ...]:
    h_axis, w_axis = _upsampling_layout(attrs)
    out = list(shape)
    layout = Layout.parse(attrs["layout"], "nn.upsampling")
    if len(shape) != layout.ndim:
        raise RelayTypeError(
            f"layout {layout} has {layout.ndim} axes but the input has shape {format_shape(shape)}",
            op_name="nn.upsampling",
        )
    out[h_axis] = _scaled(shape[h_axis], attrs["scale_h"])
    out[w_axis] = _scaled(shape[w_axis], attrs["scale_w"])
    for axis in (h_axis, w_axis):
        if isinstance(out[axis], int) and out[axis] <= 0:
            raise RelayTypeError(
                f"scaling axis {axis} of {format_shape(shape)} gives extent {format_dim(out[axis])}",
                op_name="nn.upsampling",
            )
    return tuple(out)


@type_relation("nn.upsampling")
def _upsampling_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "nn.upsampling")
    return TensorType(_upsampling_shape(x.shape, attrs), x.dtype)


def source_coordinates(out_extent: int, in_extent: int, align_corners: bool) -> Array:
    """Input coordinate sampled by each output position (TVM's asymmetric / align_corners maps)."""
    positions = np.arange(out_extent, dtype=np.float64)
    if align_corners:
        return positions * ((in_extent - 1) / (out_extent - 1) if out_extent > 1 else 0.0)
    return positions * (in_extent / out_extent)


def _nearest_indices(out_extent: int, in_extent: int, align_corners: bool) -> Array:
    coords = source_coordinates(out_extent, in_extent, align_corners)
    # align_corners rounds to nearest (ties to even); asymmetric floors, with TVM's small epsilon
    # guarding against coordinates like 2.9999999 that should be 3.
    idx = np.rint(coords) if align_corners else np.floor(coords + 1e-5)
    return np.clip(idx.astype(np.int64), 0, in_extent - 1)


def _linear_along(x: Array, axis: int, out_extent: int, align_corners: bool) -> Array:
    in_extent = x.shape[axis]
    coords = source_coordinates(out_extent, in_extent, align_corners)
    low = np.clip(np.floor(coords).astype(np.int64), 0, in_extent - 1)
    high = np.minimum(low + 1, in_extent - 1)
    frac_shape = [1] * x.ndim
    frac_shape[axis] = out_extent
    frac = (coords - np.floor(coords)).reshape(frac_shape)
    return np.take(x, low, axis=axis) * (1.0 - frac) + np.take(x, high, axis=axis) * frac


@reference("nn.upsampling")
def _upsampling_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    h_axis, w_axis = _upsampling_layout(attrs)
    out_shape = _static_shape(_upsampling_shape(x.shape, attrs))
    align = bool(attrs["align_corners"])
    method = attrs["method"]
    if method == "nearest_neighbor":
        y = np.take(x, _nearest_indices(out_shape[h_axis], x.shape[h_axis], align), axis=h_axis)
        return np.take(y, _nearest_indices(out_shape[w_axis], x.shape[w_axis], align), axis=w_axis)
    if method == "bilinear":
        # Bilinear interpolation is separable: interpolate rows, then columns, in float64.
        y = _linear_along(x.astype(np.float64), h_axis, out_shape[h_axis], align)
        y = _linear_along(y, w_axis, out_shape[w_axis], align)
        return y.astype(x.dtype)
    raise UnsupportedError(f"nn.upsampling with method={method!r} has no reference implementation")



# --------------------------------------------------------------------------------------------
# broadcast_to
# --------------------------------------------------------------------------------------------

register_op("broadcast_to", 1, OpPattern.BROADCAST, {"shape": None, "dtype": ""}, "relay.attrs.InitOpAttrs",
            required=("shape",))


def _broadcast_to_shape(shape: Sequence[Dim], attrs: Attrs) -> tuple[int, ...]:
    op = "broadcast_to"
    target = as_int_tuple(attrs["shape"], op_name=op, what="shape")
    if any(d < 0 for d in target):
        raise RelayTypeError(f"shape {list(target)} has a negative dimension", op_name=op)
    # Broadcasting is one-way: the input must broadcast to exactly the target shape.
    ok = len(shape) <= len(target) and all(
        isinstance(d, AnyDim) or d == 1 or d == t for d, t in zip(shape[::-1], target[::-1])
    )
    if not ok:
        raise RelayTypeError(f"cannot broadcast {format_shape(shape)} to {format_shape(target)}", op_name=op)
    return target


@type_relation("broadcast_to")
def _broadcast_to_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    x = _single_tensor(arg_types, "broadcast_to")
    return TensorType(_broadcast_to_shape(x.shape, attrs), x.dtype)


@reference("broadcast_to")
def _broadcast_to_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    return np.ascontiguousarray(np.broadcast_to(x, _broadcast_to_shape(x.shape, attrs)))


# --------------------------------------------------------------------------------------------
# tensor-expression computes (kernels)
# --------------------------------------------------------------------------------------------
# Imported here, not at the top: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import (  # noqa: E402
    BROADCAST,
    INJECTIVE,
    LayoutMap,
    axis_names,
    broadcast_read,
    named,
    static_shape,
)
from relay_tune.op.registry import compute  # noqa: E402

TeFn = Any  # a compute body: indices -> expression


def _injective(name: str, shape: Sequence[int], body: TeFn, tag: str = INJECTIVE) -> te.Tensor:
    return te.compute(tuple(shape), named(axis_names(len(shape)), body), name, tag)


def _unravel(flat: tir.PrimExpr, shape: Sequence[int]) -> list[tir.PrimExpr]:
    """Row-major indices into `shape` of the element at flat position `flat`."""
    out: list[tir.PrimExpr] = []
    stride = 1
    for extent in reversed(shape):
        value = flat if stride == 1 else tir.binary("floordiv", flat, stride)
        out.append(tir.binary("floormod", value, extent) if extent != 1 else tir.IntImm(0))
        stride *= extent
    return list(reversed(out))


def _ravel(idx: Sequence[tir.PrimExpr], shape: Sequence[int]) -> tir.PrimExpr:
    flat: tir.PrimExpr = tir.IntImm(0)
    for i, extent in zip(idx, shape):
        flat = flat * extent + i
    return flat


def reshape_tensor(x: te.Tensor, shape: Sequence[int], name: str) -> te.Tensor:
    """`x` read as row-major `shape` (same element count)."""
    return _injective(name, shape, lambda *idx: x[tuple(_unravel(_ravel(idx, shape), x.shape))])


def _reshape_compute(op_name: str) -> Any:
    def impl(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        return reshape_tensor(inputs[0], static_shape(out_type), op_name)

    return impl


for _name in ("reshape", "nn.batch_flatten"):
    compute(_name)(_reshape_compute(_name))


@compute("squeeze")
def _squeeze_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    shape = static_shape(out_type)
    if attrs["axis"] is None:
        kept = [d for d, s in enumerate(x.shape) if s != 1]
    else:
        drop = {normalize_axis(a, x.ndim) for a in as_int_tuple(attrs["axis"])}
        kept = [d for d in range(x.ndim) if d not in drop]

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        src: list[tir.PrimExpr] = [tir.IntImm(0)] * x.ndim
        for i, d in zip(idx, kept):
            src[d] = i
        return x[tuple(src)]

    return _injective("squeeze", shape, body)


@compute("expand_dims")
def _expand_dims_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    axis = normalize_axis(attrs["axis"], x.ndim + 1)
    count = int(attrs["num_newaxis"])
    return _injective("expand_dims", static_shape(out_type),
                      lambda *idx: x[(*idx[:axis], *idx[axis + count:])], BROADCAST)


@compute("transpose")
def _transpose_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    perm = transpose_axes(x.ndim, attrs["axes"])

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        src: list[tir.PrimExpr] = [tir.IntImm(0)] * x.ndim
        for j, p in enumerate(perm):
            src[p] = idx[j]
        return x[tuple(src)]

    return _injective("transpose", static_shape(out_type), body)


@compute("broadcast_to")
def _broadcast_to_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    return _injective("broadcast_to", static_shape(out_type), lambda *idx: broadcast_read(x, idx), BROADCAST)


def _select_chain(parts: Sequence[tuple[tir.PrimExpr | None, tir.PrimExpr]]) -> tir.PrimExpr:
    """`c0 ? v0 : c1 ? v1 : ... : vn` from (condition, value) pairs; the last condition is ignored."""
    result = parts[-1][1]
    for cond, value in reversed(parts[:-1]):
        assert cond is not None
        result = te.if_then_else(cond, value, result)
    return result


@compute("concatenate")
def _concatenate_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    axis = normalize_axis(attrs["axis"], inputs[0].ndim)

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        parts: list[tuple[tir.PrimExpr | None, tir.PrimExpr]] = []
        offset = 0
        for t in inputs:
            local = idx[axis] - offset if offset else idx[axis]
            parts.append((idx[axis] < offset + t.shape[axis], t[(*idx[:axis], local, *idx[axis + 1:])]))
            offset += t.shape[axis]
        return _select_chain(parts)

    return _injective("concatenate", static_shape(out_type), body)


@compute("stack")
def _stack_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    axis = normalize_axis(attrs["axis"], inputs[0].ndim + 1)

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        rest = (*idx[:axis], *idx[axis + 1:])
        return _select_chain([(te.equal(idx[axis], k), t[rest]) for k, t in enumerate(inputs)])

    return _injective("stack", static_shape(out_type), body)


@compute("split")
def _split_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> tuple[te.Tensor, ...]:
    (x,) = inputs
    axis = normalize_axis(attrs["axis"], x.ndim)
    assert isinstance(out_type, TupleType)
    parts = []
    for (start, _), field_type in zip(split_points(x.shape[axis], attrs["indices_or_sections"]), out_type.fields):
        def body(*idx: tir.PrimExpr, begin: int = int(start)) -> tir.PrimExpr:  # type: ignore[arg-type]
            return x[(*idx[:axis], idx[axis] + begin if begin else idx[axis], *idx[axis + 1:])]

        parts.append(_injective("split", static_shape(field_type), body))
    return tuple(parts)


@compute("strided_slice")
def _strided_slice_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    starts: dict[int, tuple[int, int]] = {}
    for axis, b, e, s in _slice_specs(x.shape, attrs):
        r = _slice_range(x.shape[axis], b, e, s)
        starts[axis] = (r.start, s)

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        src = []
        for d, i in enumerate(idx):
            start, step = starts.get(d, (0, 1))
            src.append(i * step + start if (start or step != 1) else i)
        return x[tuple(src)]

    return _injective("strided_slice", static_shape(out_type), body)


def _resolve_index(value: tir.PrimExpr, extent: int, mode: str) -> tir.PrimExpr:
    i = te.cast(tir.INDEX_DTYPE, value)
    if mode == "wrap":
        return tir.binary("floormod", i, extent)
    # "clip" clamps; "fast" promises in-range indices, and clamping keeps a broken promise inside the buffer
    return te.minimum(te.maximum(i, 0), extent - 1)


@compute("take")
def _take_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    data, indices = inputs
    shape = static_shape(out_type)
    mode = attrs["mode"]
    if attrs["axis"] is None:
        size = 1
        for s in data.shape:
            size *= s

        def flat_body(*idx: tir.PrimExpr) -> tir.PrimExpr:
            return data[tuple(_unravel(_resolve_index(indices[idx], size, mode), data.shape))]

        return _injective("take", shape, flat_body)
    axis = normalize_axis(attrs["axis"], data.ndim)
    batch_dims = _batch_dims(attrs["batch_dims"], indices.ndim, axis)
    n_mid = axis - batch_dims
    n_ind = indices.ndim - batch_dims

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        batch = idx[:batch_dims]
        mid = idx[batch_dims:batch_dims + n_mid]
        ind = idx[batch_dims + n_mid:batch_dims + n_mid + n_ind]
        rest = idx[batch_dims + n_mid + n_ind:]
        position = _resolve_index(indices[(*batch, *ind)], data.shape[axis], mode)
        return data[(*batch, *mid, position, *rest)]

    return _injective("take", shape, body)


@compute("nn.pad")
def _pad_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    data, pad_value = inputs
    widths = _pad_widths(data.shape, attrs)
    mode = attrs["pad_mode"]
    fill = te.cast(data.dtype, pad_value[()])

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        conds: list[tir.PrimExpr] = []
        src: list[tir.PrimExpr] = []
        for d, (i, (before, after)) in enumerate(zip(idx, widths)):
            n = data.shape[d]
            j = i - before if before else i
            if mode == "edge":
                j = te.minimum(te.maximum(j, 0), n - 1) if (before or after) else j
            elif mode == "reflect" and (before or after):
                j = (n - 1) - te.abs((n - 1) - te.abs(j))
            elif before or after:
                if before:
                    conds.append(i >= before)
                if after:
                    conds.append(i < before + n)
            src.append(j)
        value = data[tuple(src)]
        return te.if_then_else(te.all_of(*conds), value, fill) if conds else value

    return _injective("pad", static_shape(out_type), body)


@compute("layout_transform")
def _layout_transform_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    src = LayoutMap.parse(str(attrs["src_layout"]))
    dst = LayoutMap.parse(str(attrs["dst_layout"]))
    return _injective("layout_transform", static_shape(out_type), lambda *idx: x[src.index(dst.logical(idx))])


def _source_coordinate(i: tir.PrimExpr, out_extent: int, in_extent: int, align_corners: bool) -> tir.PrimExpr:
    """The float64 input coordinate sampled by output position `i` (the reference's arithmetic, in order)."""
    position = te.cast("float64", i)
    if align_corners:
        ratio = (in_extent - 1) / (out_extent - 1) if out_extent > 1 else 0.0
    else:
        ratio = in_extent / out_extent
    return position * tir.FloatImm(ratio, "float64")


@compute("nn.upsampling")
def _upsampling_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    h_axis, w_axis = _upsampling_layout(attrs)
    shape = static_shape(out_type)
    align = bool(attrs["align_corners"])
    method = attrs["method"]
    axes = ((h_axis, shape[h_axis], x.shape[h_axis]), (w_axis, shape[w_axis], x.shape[w_axis]))

    def nearest(i: tir.PrimExpr, out_extent: int, in_extent: int) -> tir.PrimExpr:
        coord = _source_coordinate(i, out_extent, in_extent, align)
        rounded = te.round(coord) if align else te.floor(coord + tir.FloatImm(1e-5, "float64"))
        return te.minimum(te.maximum(te.cast(tir.INDEX_DTYPE, rounded), 0), in_extent - 1)

    if method == "nearest_neighbor":
        def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
            src = list(idx)
            for axis, out_extent, in_extent in axes:
                src[axis] = nearest(idx[axis], out_extent, in_extent)
            return x[tuple(src)]

        return _injective("upsampling", shape, body)
    if method != "bilinear":
        raise UnsupportedError(f"nn.upsampling with method={method!r} has no kernel")

    def linear(i: tir.PrimExpr, out_extent: int, in_extent: int) -> tuple[tir.PrimExpr, tir.PrimExpr, tir.PrimExpr]:
        coord = _source_coordinate(i, out_extent, in_extent, align)
        floor = te.floor(coord)
        low = te.minimum(te.maximum(te.cast(tir.INDEX_DTYPE, floor), 0), in_extent - 1)
        high = te.minimum(low + 1, in_extent - 1)
        return low, high, coord - floor

    def bilinear(*idx: tir.PrimExpr) -> tir.PrimExpr:
        (lh, hh, fh), (lw, hw, fw) = (linear(idx[a], o, n) for a, o, n in axes)
        one = tir.FloatImm(1.0, "float64")

        def at(hi: tir.PrimExpr, wi: tir.PrimExpr) -> tir.PrimExpr:
            src = list(idx)
            src[h_axis], src[w_axis] = hi, wi
            return te.cast("float64", x[tuple(src)])

        # rows first, then columns: the order in which the reference interpolates
        def row(wi: tir.PrimExpr) -> tir.PrimExpr:
            return at(lh, wi) * (one - fh) + at(hh, wi) * fh

        return te.cast(x.dtype, row(lw) * (one - fw) + row(hw) * fw)

    return _injective("upsampling", shape, bilinear)
