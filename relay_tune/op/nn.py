"""Neural-network operators: convolutions, dense/matmul, pooling, normalisation, softmax.

Each operator is declared with `register_op`, and its type relation and numpy reference are attached
next to the declaration. The references favour clarity over speed, but avoid Python loops over output
pixels (convolution is im2col + matmul) so that whole models run in seconds.

Layouts are handled generically: a layout string such as `NCHW`, `NHWC`, `OHWI` or `NCHW4c` names one
letter per axis; an upper-case letter is a logical ("primal") axis, a lower-case letter with a factor
is the inner part of a split primal axis (`NCHW4c`: the channel axis split into outer `C` and inner
`4c`). Relations and references convert to the primal order (`NCHW` / `OIHW`), do the work there, and
convert back.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from relay_tune.errors import RelayTypeError, UnsupportedError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.dtypes import LOW_PRECISION_FLOAT_DTYPES, ml_dtypes_module
from relay_tune.ir.types import ANY, Dim, TensorType, TupleType, Type
from relay_tune.op._shape import is_float_dtype, is_int_dtype
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

OUT_EW = OpPattern.OUT_ELEMWISE_FUSABLE

_CONV_COMMON = {
    "padding": (0, 0), "groups": 1, "channels": None, "kernel_size": None, "out_layout": "", "out_dtype": "",
}
register_op(
    "nn.conv2d", 2, OUT_EW,
    {"strides": (1, 1), "dilation": (1, 1), **_CONV_COMMON, "data_layout": "NCHW", "kernel_layout": "OIHW"},
    "relay.attrs.Conv2DAttrs",
)
register_op(
    "nn.contrib_conv2d_NCHWc", 2, OUT_EW,
    # Same attrs type (and defaults) as nn.conv2d, as in TVM; real uses always name packed layouts.
    {"strides": (1, 1), "dilation": (1, 1), **_CONV_COMMON, "data_layout": "NCHW", "kernel_layout": "OIHW"},
    "relay.attrs.Conv2DAttrs", description="conv2d on channel-blocked layouts (NCHW[x]c data, OIHW[x]i[y]o kernel)",
)
register_op(
    "nn.conv1d", 2, OUT_EW,
    {"strides": (1,), "dilation": (1,), **_CONV_COMMON, "data_layout": "NCW", "kernel_layout": "OIW"},
    "relay.attrs.Conv1DAttrs",
)
register_op("nn.dense", 2, OUT_EW, {"units": None, "out_dtype": ""}, "relay.attrs.DenseAttrs")
register_op(
    "nn.batch_matmul", 2, OUT_EW, {"out_dtype": "", "transpose_a": False, "transpose_b": False},
    "relay.attrs.BatchMatmulAttrs",
)
register_op(
    "nn.batch_norm", 5, OpPattern.OPAQUE, {"axis": 1, "epsilon": 1e-5, "center": True, "scale": True},
    "relay.attrs.BatchNormAttrs", description="inference-mode batch normalisation; returns (out, mean, var)",
)
register_op("nn.bias_add", 2, OpPattern.BROADCAST, {"axis": 1}, "relay.attrs.BiasAddAttrs")
register_op("nn.dropout", 1, OpPattern.OPAQUE, {"rate": 0.5}, "relay.attrs.DropoutAttrs")
register_op("nn.softmax", 1, OUT_EW, {"axis": -1}, "relay.attrs.SoftmaxAttrs")
register_op("nn.log_softmax", 1, OUT_EW, {"axis": -1}, "relay.attrs.SoftmaxAttrs")

_POOL = {
    "pool_size": None, "strides": (1, 1), "dilation": (1, 1), "padding": (0, 0),
    "layout": "NCHW", "out_layout": "", "ceil_mode": False,
}
register_op("nn.max_pool2d", 1, OUT_EW, _POOL, "relay.attrs.MaxPool2DAttrs", required=("pool_size",))
register_op(
    "nn.avg_pool2d", 1, OUT_EW, {**_POOL, "count_include_pad": False}, "relay.attrs.AvgPool2DAttrs",
    required=("pool_size",),
)
register_op("nn.global_avg_pool2d", 1, OUT_EW, {"layout": "NCHW", "out_layout": ""}, "relay.attrs.GlobalPool2DAttrs")
register_op("nn.global_max_pool2d", 1, OUT_EW, {"layout": "NCHW", "out_layout": ""}, "relay.attrs.GlobalPool2DAttrs")


# ================================================================================================
# Small helpers shared by the relations
# ================================================================================================


def fmt_shape(shape: Sequence[Dim]) -> str:
    """`1x64x56x56` (and `?` for dynamic dims, `scalar` for rank 0): compact shapes for messages."""
    if not shape:
        return "scalar"
    return "x".join("?" if d is ANY else str(d) for d in shape)


def _tensor_arg(ty: Type, op_name: str, what: str) -> TensorType:
    if not isinstance(ty, TensorType):
        raise RelayTypeError(f"{what} must be a tensor, got {ty}", op_name=op_name)
    return ty


def _ints(value: object, count: int, op_name: str, attr: str) -> tuple[int, ...]:
    """An int or a sequence of `count` ints (a single value is repeated; the text format allows both)."""
    if isinstance(value, bool):
        raise RelayTypeError(f"{attr} must be integers, got {value!r}", op_name=op_name)
    if isinstance(value, int):
        return (value,) * count
    if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if len(value) == count:
            return value
        if len(value) == 1:
            return value * count
    raise RelayTypeError(f"{attr} must be 1 or {count} integers, got {value!r}", op_name=op_name)


def _padding(value: object, spatial: int, op_name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Normalise `padding` to (before per spatial dim, after per spatial dim).

    1 value pads every side; `spatial` values pad both sides of each dim; `2 * spatial` values are all
    "before" pads followed by all "after" pads (`[top, left, bottom, right]` in 2-D).
    """
    pads = _ints(value, 1, op_name, "padding") if isinstance(value, int) else value
    if not isinstance(pads, tuple) or not all(isinstance(p, int) and not isinstance(p, bool) for p in pads):
        raise RelayTypeError(f"padding must be integers, got {value!r}", op_name=op_name)
    if len(pads) == 1:
        pads = pads * (2 * spatial)
    elif len(pads) == spatial:
        pads = pads + pads
    elif len(pads) != 2 * spatial:
        raise RelayTypeError(
            f"padding must have 1, {spatial} or {2 * spatial} values, got {len(pads)} ({list(pads)})", op_name=op_name
        )
    if any(p < 0 for p in pads):
        raise RelayTypeError(f"padding must be non-negative, got {list(pads)}", op_name=op_name)
    return tuple(pads[:spatial]), tuple(pads[spatial:])


def _dim_mul(a: Dim, b: Dim) -> Dim:
    return ANY if a is ANY or b is ANY else a * b  # type: ignore[operator]


def _out_dtype(attrs: Attrs, data_dtype: str) -> str:
    out_dtype = attrs.get("out_dtype") or ""
    return str(out_dtype) if out_dtype else data_dtype


def _dims_clash(a: Dim, b: Dim) -> bool:
    """Two dims that are both known and differ (a `?` matches anything)."""
    return a is not ANY and b is not ANY and a != b


# ================================================================================================
# Layouts
# ================================================================================================

_LAYOUT_TOKEN = re.compile(r"(\d*)([A-Za-z])")


@dataclass(frozen=True)
class Layout:
    """A parsed layout string. `axes[i]` is `(letter, factor)`; factor is None for primal axes."""

    name: str
    axes: tuple[tuple[str, int | None], ...]

    @staticmethod
    def parse(name: str, op_name: str) -> Layout:
        axes: list[tuple[str, int | None]] = []
        pos = 0
        for match in _LAYOUT_TOKEN.finditer(name):
            if match.start() != pos:
                break
            pos = match.end()
            digits, letter = match.groups()
            if letter.isupper():
                if digits:
                    raise RelayTypeError(
                        f"layout {name!r}: a primal axis ({letter}) cannot have a factor", op_name=op_name
                    )
                axes.append((letter, None))
            else:
                if not digits or int(digits) <= 0:
                    raise RelayTypeError(
                        f"layout {name!r}: split axis {letter} needs a positive factor", op_name=op_name
                    )
                axes.append((letter, int(digits)))
        letters = [a for a, _ in axes]
        if pos != len(name) or not name or len(set(letters)) != len(letters):
            raise RelayTypeError(f"invalid layout {name!r}", op_name=op_name)
        for letter, factor in axes:
            if factor is not None and letter.upper() not in letters:
                raise RelayTypeError(
                    f"layout {name!r}: split axis {letter} without primal {letter.upper()}", op_name=op_name
                )
        return Layout(name, tuple(axes))

    @property
    def primal(self) -> str:
        return "".join(a for a, f in self.axes if f is None)

    def index(self, letter: str) -> int:
        return [a for a, _ in self.axes].index(letter)

    def factor(self, primal_letter: str) -> int | None:
        for a, f in self.axes:
            if a == primal_letter.lower() and f is not None:
                return f
        return None

    def check_primal(self, expected: str, op_name: str, role: str) -> None:
        if sorted(self.primal) != sorted(expected):
            raise UnsupportedError(
                f"{op_name}: {role} layout {self.name!r} is not a rearrangement of {expected!r}"
            )

    def to_primal_shape(self, shape: Sequence[Dim], order: str, op_name: str, role: str) -> tuple[Dim, ...]:
        """The logical dims, in `order` (e.g. `NCHW`), of a tensor stored in this layout."""
        if len(shape) != len(self.axes):
            raise RelayTypeError(
                f"{role} {fmt_shape(shape)} has rank {len(shape)} but layout {self.name} needs rank {len(self.axes)}",
                op_name=op_name,
            )
        dims: list[Dim] = []
        for letter in order:
            dim = shape[self.index(letter)]
            factor = self.factor(letter)
            if factor is not None:
                inner = shape[self.index(letter.lower())]
                if _dims_clash(inner, factor):
                    raise RelayTypeError(
                        f"{role} {fmt_shape(shape)}: axis {factor}{letter.lower()} of layout {self.name} has size "
                        f"{inner}", op_name=op_name,
                    )
                dim = _dim_mul(dim, factor)
            dims.append(dim)
        return tuple(dims)

    def from_primal_shape(self, dims: Sequence[Dim], order: str, op_name: str, role: str) -> tuple[Dim, ...]:
        """The stored shape in this layout of a tensor with logical dims `dims` (in `order`)."""
        by_letter = dict(zip(order, dims))
        shape: list[Dim] = []
        for letter, factor in self.axes:
            if factor is not None:
                shape.append(factor)
                continue
            dim = by_letter[letter]
            inner = self.factor(letter)
            if inner is not None and dim is not ANY:
                if dim % inner:  # type: ignore[operator]
                    raise RelayTypeError(
                        f"{role}: axis {letter} of size {dim} cannot be split by {inner} for layout {self.name}",
                        op_name=op_name,
                    )
                dim = dim // inner  # type: ignore[operator]
            shape.append(dim)
        return tuple(shape)

    # --- the same conversions on arrays (used by references) -----------------------------------
    def to_primal_array(self, arr: np.ndarray, order: str) -> np.ndarray:
        letters = [a for a, _ in self.axes]
        perm: list[int] = []
        for letter in order:
            perm.append(letters.index(letter))
            if self.factor(letter) is not None:
                perm.append(letters.index(letter.lower()))
        moved = arr.transpose(perm)
        merged = [math.prod(moved.shape[i] for i in group) for group in self._groups(order)]
        return moved.reshape(merged)

    def from_primal_array(self, arr: np.ndarray, order: str) -> np.ndarray:
        split: list[int] = []
        split_letters: list[str] = []
        for letter, dim in zip(order, arr.shape):
            factor = self.factor(letter)
            if factor is None:
                split += [dim]
                split_letters += [letter]
            else:
                split += [dim // factor, factor]
                split_letters += [letter, letter.lower()]
        expanded = arr.reshape(split)
        perm = [split_letters.index(a) for a, _ in self.axes]
        return expanded.transpose(perm)

    def _groups(self, order: str) -> list[list[int]]:
        groups: list[list[int]] = []
        pos = 0
        for letter in order:
            size = 2 if self.factor(letter) is not None else 1
            groups.append(list(range(pos, pos + size)))
            pos += size
        return groups


# ================================================================================================
# Convolution
# ================================================================================================


def _conv_rel(arg_types: Sequence[Type], attrs: Attrs, op_name: str, spatial_letters: str) -> Type:
    """Shared N-d convolution relation. `spatial_letters` is `HW` for 2-D and `W` for 1-D."""
    data_order, kernel_order = "NC" + spatial_letters, "OI" + spatial_letters
    nsp = len(spatial_letters)
    data = _tensor_arg(arg_types[0], op_name, "data")
    weight = _tensor_arg(arg_types[1], op_name, "weight")
    data_layout = Layout.parse(str(attrs["data_layout"]), op_name)
    kernel_layout = Layout.parse(str(attrs["kernel_layout"]), op_name)
    out_layout = Layout.parse(str(attrs["out_layout"] or attrs["data_layout"]), op_name)
    data_layout.check_primal(data_order, op_name, "data")
    kernel_layout.check_primal(kernel_order, op_name, "kernel")
    out_layout.check_primal(data_order, op_name, "output")

    n, c, *spatial = data_layout.to_primal_shape(data.shape, data_order, op_name, "data")
    o, i, *ksize = kernel_layout.to_primal_shape(weight.shape, kernel_order, op_name, "weight")
    strides = _ints(attrs["strides"], nsp, op_name, "strides")
    dilation = _ints(attrs["dilation"], nsp, op_name, "dilation")
    pad_before, pad_after = _padding(attrs["padding"], nsp, op_name)
    groups = attrs["groups"]
    if not isinstance(groups, int) or groups < 1:
        raise RelayTypeError(f"groups must be a positive integer, got {groups!r}", op_name=op_name)
    if any(s < 1 for s in strides) or any(d < 1 for d in dilation):
        raise RelayTypeError(f"strides {list(strides)} and dilation {list(dilation)} must be >= 1", op_name=op_name)
    data_desc = f"data {fmt_shape(data.shape)} ({data_layout.name})"
    weight_desc = f"weight {fmt_shape(weight.shape)} ({kernel_layout.name})"

    if attrs["kernel_size"] is not None:
        kernel_size = _ints(attrs["kernel_size"], nsp, op_name, "kernel_size")
        if any(_dims_clash(k, w) for k, w in zip(kernel_size, ksize)):
            raise RelayTypeError(
                f"kernel_size {list(kernel_size)} does not match {weight_desc}", op_name=op_name
            )
    channels = attrs["channels"]
    if channels is not None:
        if not isinstance(channels, int) or channels < 1:
            raise RelayTypeError(f"channels must be a positive integer, got {channels!r}", op_name=op_name)
        if _dims_clash(o, channels):
            raise RelayTypeError(
                f"channels={channels} does not match {weight_desc}, which has {o} output channels", op_name=op_name
            )
    out_channels: Dim = channels if channels is not None else o
    if c is not ANY:
        if c % groups:  # type: ignore[operator]
            raise RelayTypeError(
                f"input channels {c} of {data_desc} are not divisible by groups={groups}", op_name=op_name
            )
        expected_i = c // groups  # type: ignore[operator]
        if _dims_clash(i, expected_i):
            group_note = f" with groups={groups}" if groups != 1 else ""
            raise RelayTypeError(
                f"input channels {c} of {data_desc} do not match {weight_desc}: "
                f"expected {expected_i} input channels per group{group_note}, the weight has {i}",
                op_name=op_name,
            )
    if out_channels is not ANY and out_channels % groups:  # type: ignore[operator]
        raise RelayTypeError(f"output channels {out_channels} are not divisible by groups={groups}", op_name=op_name)

    out_spatial: list[Dim] = []
    for axis, (size, k, s, d, pb, pa) in enumerate(zip(spatial, ksize, strides, dilation, pad_before, pad_after)):
        if size is ANY or k is ANY:
            out_spatial.append(ANY)
            continue
        extent = size + pb + pa - ((k - 1) * d + 1)  # type: ignore[operator]
        if extent < 0:
            raise RelayTypeError(
                f"kernel {fmt_shape(ksize)} (dilation {list(dilation)}) is larger than the padded input along "
                f"{spatial_letters[axis]} ({size} + padding {pb}+{pa}) for {data_desc}",
                op_name=op_name,
            )
        out_spatial.append(extent // s + 1)
    out_dims = (n, out_channels, *out_spatial)
    out_shape = out_layout.from_primal_shape(out_dims, data_order, op_name, "output")
    return TensorType(out_shape, _out_dtype(attrs, data.dtype))


@type_relation("nn.conv2d")
def conv2d_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _conv_rel(arg_types, attrs, "nn.conv2d", "HW")


@type_relation("nn.contrib_conv2d_NCHWc")
def conv2d_nchwc_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _conv_rel(arg_types, attrs, "nn.contrib_conv2d_NCHWc", "HW")


@type_relation("nn.conv1d")
def conv1d_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _conv_rel(arg_types, attrs, "nn.conv1d", "W")


def accumulator_dtype(out_dtype: str) -> np.dtype:
    """The dtype a reference accumulates in: float32 for half/single, float64 for double, int64 for ints."""
    if out_dtype in LOW_PRECISION_FLOAT_DTYPES:
        return np.dtype(np.float32)
    dt = np.dtype(out_dtype)
    if dt.kind == "f":
        return np.dtype(np.float64) if dt.itemsize > 4 else np.dtype(np.float32)
    if dt.kind in "iu":
        return np.dtype(np.int64)
    if dt.kind == "b":
        return np.dtype(np.int64)
    raise UnsupportedError(f"no numpy reference for dtype {out_dtype}")


def conv_nd_primal(
    data: np.ndarray,
    weight: np.ndarray,
    strides: Sequence[int],
    dilation: Sequence[int],
    pad_before: Sequence[int],
    pad_after: Sequence[int],
    groups: int,
    acc: np.dtype,
) -> np.ndarray:
    """Grouped N-d convolution on `(N, C, *spatial)` data and `(O, C/groups, *k)` weight, via im2col.

    The padded input is viewed as sliding windows (no copy), strided/dilated by slicing, gathered into
    columns `(N, G, out_pixels, C/G * prod(k))` and multiplied with the weight `(G, O/G, C/G * prod(k))`.
    """
    nsp = data.ndim - 2
    n = data.shape[0]
    o, cg = weight.shape[:2]
    ksize = weight.shape[2:]
    g = groups
    og = o // g
    padded = np.pad(data.astype(acc, copy=False), [(0, 0), (0, 0), *zip(pad_before, pad_after)])
    effective = tuple((k - 1) * d + 1 for k, d in zip(ksize, dilation))
    windows = np.lib.stride_tricks.sliding_window_view(padded, effective, axis=tuple(range(2, 2 + nsp)))
    # windows: (N, C, *positions, *effective) -> keep every stride-th position and every dilation-th tap
    index = (
        slice(None), slice(None), *(slice(None, None, s) for s in strides), *(slice(None, None, d) for d in dilation)
    )
    windows = windows[index]
    out_spatial = windows.shape[2:2 + nsp]
    pixels = math.prod(out_spatial)
    taps = math.prod(ksize)
    # (N, G, Cg, *out, *k) -> (N, G, *out, Cg, *k) -> (N, G, pixels, Cg*taps)
    grouped = windows.reshape(n, g, cg, *out_spatial, *ksize)
    perm = (0, 1, *range(3, 3 + nsp), 2, *range(3 + nsp, 3 + 2 * nsp))
    cols = grouped.transpose(perm).reshape(n, g, pixels, cg * taps)
    kernel = weight.astype(acc, copy=False).reshape(g, og, cg * taps)
    out = np.matmul(cols, kernel.transpose(0, 2, 1))  # (N, G, pixels, Og)
    return out.transpose(0, 1, 3, 2).reshape(n, o, *out_spatial)


def _conv_ref(inputs: Sequence[np.ndarray], attrs: Attrs, op_name: str, spatial_letters: str) -> np.ndarray:
    data, weight = inputs
    data_order, kernel_order = "NC" + spatial_letters, "OI" + spatial_letters
    nsp = len(spatial_letters)
    data_layout = Layout.parse(str(attrs["data_layout"]), op_name)
    kernel_layout = Layout.parse(str(attrs["kernel_layout"]), op_name)
    out_layout = Layout.parse(str(attrs["out_layout"] or attrs["data_layout"]), op_name)
    pad_before, pad_after = _padding(attrs["padding"], nsp, op_name)
    out_dtype = _out_dtype(attrs, str(data.dtype))
    out = conv_nd_primal(
        data_layout.to_primal_array(data, data_order),
        kernel_layout.to_primal_array(weight, kernel_order),
        _ints(attrs["strides"], nsp, op_name, "strides"),
        _ints(attrs["dilation"], nsp, op_name, "dilation"),
        pad_before,
        pad_after,
        int(attrs["groups"]),
        accumulator_dtype(out_dtype),
    )
    return np.ascontiguousarray(out_layout.from_primal_array(out, data_order)).astype(out_dtype, copy=False)


@reference("nn.conv2d", "nn.contrib_conv2d_NCHWc")
def conv2d_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    return _conv_ref(inputs, attrs, "nn.conv2d", "HW")


@reference("nn.conv1d")
def conv1d_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    return _conv_ref(inputs, attrs, "nn.conv1d", "W")


# ================================================================================================
# Dense and batch_matmul
# ================================================================================================


@type_relation("nn.dense")
def dense_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    """`data (..., K)` x `weight (units, K)` -> `(..., units)`."""
    data = _tensor_arg(arg_types[0], "nn.dense", "data")
    weight = _tensor_arg(arg_types[1], "nn.dense", "weight")
    if data.ndim < 1:
        raise RelayTypeError("data must have rank >= 1, got a scalar", op_name="nn.dense")
    if weight.ndim != 2:
        raise RelayTypeError(f"weight must be 2-D (units, K), got {fmt_shape(weight.shape)}", op_name="nn.dense")
    k, (w_units, w_k) = data.shape[-1], weight.shape
    if _dims_clash(k, w_k):
        raise RelayTypeError(
            f"reduction dims differ: data {fmt_shape(data.shape)} has K={k} but weight {fmt_shape(weight.shape)} "
            f"has K={w_k} (weight is (units, K))",
            op_name="nn.dense",
        )
    units = attrs["units"]
    if units is not None and _dims_clash(units, w_units):
        raise RelayTypeError(
            f"units={units} does not match weight {fmt_shape(weight.shape)} (weight is (units, K))", op_name="nn.dense"
        )
    out_units = units if units is not None else w_units
    return TensorType((*data.shape[:-1], out_units), _out_dtype(attrs, data.dtype))


@reference("nn.dense")
def dense_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    data, weight = inputs
    out_dtype = _out_dtype(attrs, str(data.dtype))
    acc = accumulator_dtype(out_dtype)
    return np.matmul(data.astype(acc, copy=False), weight.astype(acc, copy=False).T).astype(out_dtype, copy=False)


@type_relation("nn.batch_matmul")
def batch_matmul_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    """`x (B, M, K)`, `y (B, K, N)` (or `(B, N, K)` with transpose_b) -> `(B, M, N)`; B may broadcast from 1."""
    op_name = "nn.batch_matmul"
    x = _tensor_arg(arg_types[0], op_name, "x")
    y = _tensor_arg(arg_types[1], op_name, "y")
    ta, tb = bool(attrs["transpose_a"]), bool(attrs["transpose_b"])
    if x.ndim != 3 or y.ndim != 3:
        raise RelayTypeError(
            f"both operands must be 3-D, got x {fmt_shape(x.shape)} and y {fmt_shape(y.shape)}", op_name=op_name
        )
    bx, x_rows, x_cols = x.shape
    by, y_rows, y_cols = y.shape
    m, kx = (x_cols, x_rows) if ta else (x_rows, x_cols)
    ky, n = (y_cols, y_rows) if tb else (y_rows, y_cols)
    layouts = f"(transpose_a={ta}, transpose_b={tb})"
    if _dims_clash(kx, ky):
        raise RelayTypeError(
            f"reduction dims differ: x {fmt_shape(x.shape)} has K={kx} but y {fmt_shape(y.shape)} has K={ky} {layouts}",
            op_name=op_name,
        )
    if _dims_clash(bx, by) and bx != 1 and by != 1:
        raise RelayTypeError(
            f"batch dims {bx} (x {fmt_shape(x.shape)}) and {by} (y {fmt_shape(y.shape)}) differ and neither is 1",
            op_name=op_name,
        )
    if bx == 1:
        batch = by
    elif by == 1:
        batch = bx
    else:
        batch = bx if bx is not ANY else by
    return TensorType((batch, m, n), _out_dtype(attrs, x.dtype))


@reference("nn.batch_matmul")
def batch_matmul_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    x, y = inputs
    out_dtype = _out_dtype(attrs, str(x.dtype))
    acc = accumulator_dtype(out_dtype)
    xa = x.astype(acc, copy=False)
    ya = y.astype(acc, copy=False)
    if attrs["transpose_a"]:
        xa = xa.transpose(0, 2, 1)
    if attrs["transpose_b"]:
        ya = ya.transpose(0, 2, 1)
    return np.matmul(xa, ya).astype(out_dtype, copy=False)


# ================================================================================================
# Normalisation, bias, dropout, softmax
# ================================================================================================


def _axis(axis: object, ndim: int, op_name: str, data: TensorType) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool) or not -ndim <= axis < ndim:
        raise RelayTypeError(f"axis={axis!r} is out of range for data {fmt_shape(data.shape)}", op_name=op_name)
    return axis % ndim


@type_relation("nn.batch_norm")
def batch_norm_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    """`(data, gamma, beta, moving_mean, moving_var)` -> `(out, mean, var)`; the vectors are `(C,)`."""
    op_name = "nn.batch_norm"
    data = _tensor_arg(arg_types[0], op_name, "data")
    axis = _axis(attrs["axis"], data.ndim, op_name, data)
    channels = data.shape[axis]
    for name, ty in zip(("gamma", "beta", "moving_mean", "moving_var"), arg_types[1:]):
        vec = _tensor_arg(ty, op_name, name)
        if vec.ndim != 1 or _dims_clash(vec.shape[0], channels):
            raise RelayTypeError(
                f"{name} {fmt_shape(vec.shape)} must have shape ({channels},) to match axis {axis} of data "
                f"{fmt_shape(data.shape)}",
                op_name=op_name,
            )
        if vec.dtype != data.dtype:
            raise RelayTypeError(f"{name} has dtype {vec.dtype} but data has dtype {data.dtype}", op_name=op_name)
    vector = TensorType((channels,), data.dtype)
    return TupleType((data, vector, vector))


def _along(vec: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """Reshape a `(C,)` vector so that it broadcasts along `axis` of an `ndim`-D tensor."""
    shape = [1] * ndim
    shape[axis] = vec.shape[0]
    return vec.reshape(shape)


@reference("nn.batch_norm")
def batch_norm_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    data, gamma, beta, mean, var = inputs
    axis = int(attrs["axis"]) % data.ndim
    acc = accumulator_dtype(str(data.dtype))
    x = data.astype(acc, copy=False)
    inv_std = 1.0 / np.sqrt(var.astype(acc) + acc.type(attrs["epsilon"]))
    out = (x - _along(mean.astype(acc), axis, x.ndim)) * _along(inv_std, axis, x.ndim)
    if attrs["scale"]:
        out = out * _along(gamma.astype(acc), axis, x.ndim)
    if attrs["center"]:
        out = out + _along(beta.astype(acc), axis, x.ndim)
    # Inference mode: the statistics returned are the moving ones, unchanged.
    return out.astype(data.dtype, copy=False), mean.copy(), var.copy()


@type_relation("nn.bias_add")
def bias_add_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    op_name = "nn.bias_add"
    data = _tensor_arg(arg_types[0], op_name, "data")
    bias = _tensor_arg(arg_types[1], op_name, "bias")
    axis = _axis(attrs["axis"], data.ndim, op_name, data)
    if bias.ndim != 1 or _dims_clash(bias.shape[0], data.shape[axis]):
        raise RelayTypeError(
            f"bias {fmt_shape(bias.shape)} must have shape ({data.shape[axis]},) to match axis {axis} of data "
            f"{fmt_shape(data.shape)}",
            op_name=op_name,
        )
    if bias.dtype != data.dtype:
        raise RelayTypeError(f"bias has dtype {bias.dtype} but data has dtype {data.dtype}", op_name=op_name)
    return data


@reference("nn.bias_add")
def bias_add_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    data, bias = inputs
    axis = int(attrs["axis"]) % data.ndim
    return (data + _along(bias, axis, data.ndim)).astype(data.dtype, copy=False)


@type_relation("nn.dropout")
def dropout_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    """Like TVM, dropout returns `(out, mask)`, both of the data's type; models use `.0`."""
    data = _tensor_arg(arg_types[0], "nn.dropout", "data")
    rate = attrs["rate"]
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate < 1:
        raise RelayTypeError(f"rate must be in [0, 1), got {rate!r}", op_name="nn.dropout")
    return TupleType((data, data))


@reference("nn.dropout")
def dropout_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
    # Inference semantics: the identity, with an all-ones mask.
    (data,) = inputs
    return data.copy(), np.ones_like(data)


@type_relation("nn.softmax", "nn.log_softmax")
def softmax_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    data = _tensor_arg(arg_types[0], "nn.softmax", "data")
    if data.ndim == 0:
        raise RelayTypeError("softmax needs a tensor of rank >= 1, got a scalar", op_name="nn.softmax")
    _axis(attrs["axis"], data.ndim, "nn.softmax", data)
    if not is_float_dtype(data.dtype):
        raise RelayTypeError(f"softmax needs a floating-point tensor, got {data.dtype}", op_name="nn.softmax")
    return data


def _shifted(data: np.ndarray, axis: int) -> np.ndarray:
    x = data.astype(accumulator_dtype(str(data.dtype)), copy=False)
    return x - x.max(axis=axis, keepdims=True)


@reference("nn.softmax")
def softmax_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    (data,) = inputs
    e = np.exp(_shifted(data, int(attrs["axis"])))
    return (e / e.sum(axis=int(attrs["axis"]), keepdims=True)).astype(data.dtype, copy=False)


@reference("nn.log_softmax")
def log_softmax_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    (data,) = inputs
    axis = int(attrs["axis"])
    shifted = _shifted(data, axis)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(data.dtype, copy=False)


# ================================================================================================
# Pooling
# ================================================================================================


@dataclass(frozen=True)
class _PoolGeometry:
    rank: int
    h_axis: int
    w_axis: int
    pool: tuple[int, int]
    strides: tuple[int, int]
    dilation: tuple[int, int]
    pad_before: tuple[int, int]
    pad_after: tuple[int, int]
    ceil_mode: bool


def _pool_geometry(attrs: Attrs, op_name: str) -> _PoolGeometry:
    layout = Layout.parse(str(attrs["layout"]), op_name)
    out_layout = str(attrs.get("out_layout") or "")
    if out_layout and out_layout != layout.name:
        raise UnsupportedError(f"{op_name}: out_layout {out_layout!r} different from layout {layout.name!r}")
    if "H" not in layout.primal or "W" not in layout.primal or layout.factor("H") or layout.factor("W"):
        raise UnsupportedError(f"{op_name}: layout {layout.name!r} needs unsplit H and W axes")
    pad_before, pad_after = _padding(attrs["padding"], 2, op_name)
    geometry = _PoolGeometry(
        rank=len(layout.axes),
        h_axis=layout.index("H"),
        w_axis=layout.index("W"),
        pool=_ints(attrs["pool_size"], 2, op_name, "pool_size"),  # type: ignore[arg-type]
        strides=_ints(attrs["strides"], 2, op_name, "strides"),  # type: ignore[arg-type]
        dilation=_ints(attrs["dilation"], 2, op_name, "dilation"),  # type: ignore[arg-type]
        pad_before=pad_before,  # type: ignore[arg-type]
        pad_after=pad_after,  # type: ignore[arg-type]
        ceil_mode=bool(attrs["ceil_mode"]),
    )
    if min(geometry.pool + geometry.strides + geometry.dilation) < 1:
        raise RelayTypeError(
            f"pool_size {list(geometry.pool)}, strides {list(geometry.strides)} and dilation "
            f"{list(geometry.dilation)} must be >= 1",
            op_name=op_name,
        )
    return geometry


def _pool_out_dim(size: int, i: int, g: _PoolGeometry) -> int:
    effective = (g.pool[i] - 1) * g.dilation[i] + 1
    # TVM's rule: plain ceil division in ceil mode (no "last window must start inside" correction).
    extent = size + g.pad_before[i] + g.pad_after[i] - effective + (g.strides[i] - 1 if g.ceil_mode else 0)
    return extent // g.strides[i] + 1


def _pool_rel(arg_types: Sequence[Type], attrs: Attrs, op_name: str) -> Type:
    data = _tensor_arg(arg_types[0], op_name, "data")
    g = _pool_geometry(attrs, op_name)
    if data.ndim != g.rank:
        raise RelayTypeError(f"data {fmt_shape(data.shape)} does not fit layout {attrs['layout']}", op_name=op_name)
    shape = list(data.shape)
    for i, axis in enumerate((g.h_axis, g.w_axis)):
        size = shape[axis]
        if size is ANY:
            continue
        effective = (g.pool[i] - 1) * g.dilation[i] + 1
        if size + g.pad_before[i] + g.pad_after[i] < effective:  # type: ignore[operator]
            raise RelayTypeError(
                f"pool window {list(g.pool)} (dilation {list(g.dilation)}) is larger than the padded input "
                f"{fmt_shape(data.shape)} ({attrs['layout']})",
                op_name=op_name,
            )
        shape[axis] = _pool_out_dim(size, i, g)  # type: ignore[arg-type]
    return TensorType(tuple(shape), data.dtype)


@type_relation("nn.max_pool2d")
def max_pool2d_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _pool_rel(arg_types, attrs, "nn.max_pool2d")


@type_relation("nn.avg_pool2d")
def avg_pool2d_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _pool_rel(arg_types, attrs, "nn.avg_pool2d")


def _pool_windows(padded: np.ndarray, g: _PoolGeometry, out_hw: tuple[int, int]) -> np.ndarray:
    """Windows `(..., OH, OW, KH, KW)` over the last two axes of an already padded array."""
    effective = tuple((k - 1) * d + 1 for k, d in zip(g.pool, g.dilation))
    windows = np.lib.stride_tricks.sliding_window_view(padded, effective, axis=(-2, -1))
    windows = windows[..., :: g.strides[0], :: g.strides[1], :: g.dilation[0], :: g.dilation[1]]
    return windows[..., : out_hw[0], : out_hw[1], :, :]


def _pool_padding(x_hw: tuple[int, int], g: _PoolGeometry) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Output size and, per spatial dim, (before, after) padding including the ceil-mode extra rows."""
    out = (_pool_out_dim(x_hw[0], 0, g), _pool_out_dim(x_hw[1], 1, g))
    pads = []
    for i in range(2):
        effective = (g.pool[i] - 1) * g.dilation[i] + 1
        needed = (out[i] - 1) * g.strides[i] + effective
        extra = max(0, needed - (x_hw[i] + g.pad_before[i] + g.pad_after[i]))
        pads.append((g.pad_before[i], g.pad_after[i] + extra))
    return out, pads[0], pads[1]


@reference("nn.max_pool2d")
def max_pool2d_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    (data,) = inputs
    g = _pool_geometry(attrs, "nn.max_pool2d")
    x = np.moveaxis(data, (g.h_axis, g.w_axis), (-2, -1))
    out_hw, pad_h, pad_w = _pool_padding(x.shape[-2:], g)
    # Padding never wins a max: use -inf (or the smallest value of an integer type or of a float type
    # without infinities, where ml_dtypes would turn -inf into NaN).
    if data.dtype.kind == "f":
        lowest: float = -np.inf
    elif is_float_dtype(data.dtype.name) or is_int_dtype(data.dtype.name):
        ml_dtypes = ml_dtypes_module()
        lowest = float(ml_dtypes.finfo(data.dtype).min if is_float_dtype(data.dtype.name)
                       else ml_dtypes.iinfo(data.dtype).min)
    else:
        lowest = float(np.iinfo(data.dtype).min)
    padded = np.pad(x, [(0, 0)] * (x.ndim - 2) + [pad_h, pad_w], constant_values=lowest)
    out = _pool_windows(padded, g, out_hw).max(axis=(-2, -1))
    return np.ascontiguousarray(np.moveaxis(out, (-2, -1), (g.h_axis, g.w_axis)))


@reference("nn.avg_pool2d")
def avg_pool2d_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    (data,) = inputs
    g = _pool_geometry(attrs, "nn.avg_pool2d")
    acc = accumulator_dtype(str(data.dtype))
    x = np.moveaxis(data, (g.h_axis, g.w_axis), (-2, -1)).astype(acc, copy=False)
    out_hw, pad_h, pad_w = _pool_padding(x.shape[-2:], g)
    pad_width = [(0, 0)] * (x.ndim - 2) + [pad_h, pad_w]
    total = _pool_windows(np.pad(x, pad_width), g, out_hw).sum(axis=(-2, -1))
    # The divisor counts the window taps that fall on the input, plus (count_include_pad) those on the
    # explicit padding; the ceil-mode extra rows never count.
    counted = np.ones(x.shape[-2:], dtype=np.int64)
    if attrs["count_include_pad"]:
        counted = np.pad(counted, [(g.pad_before[0], g.pad_after[0]), (g.pad_before[1], g.pad_after[1])],
                         constant_values=1)
        counted = np.pad(counted, [(0, pad_h[1] - g.pad_after[0]), (0, pad_w[1] - g.pad_after[1])])
    else:
        counted = np.pad(counted, [pad_h, pad_w])
    divisor = np.maximum(_pool_windows(counted, g, out_hw).sum(axis=(-2, -1)), 1)
    if acc.kind == "f":
        out = total / divisor
    else:  # integer average truncates toward zero, like TVM's integer division
        out = np.sign(total) * (np.abs(total) // divisor)
    out = out.astype(data.dtype, copy=False)
    return np.ascontiguousarray(np.moveaxis(out, (-2, -1), (g.h_axis, g.w_axis)))


def _global_pool_axes(attrs: Attrs, op_name: str, ndim: int | None = None) -> tuple[int, int]:
    layout = Layout.parse(str(attrs["layout"]), op_name)
    if "H" not in layout.primal or "W" not in layout.primal or layout.factor("H") or layout.factor("W"):
        raise UnsupportedError(f"{op_name}: layout {layout.name!r} needs unsplit H and W axes")
    out_layout = str(attrs.get("out_layout") or "")
    if out_layout and out_layout != layout.name:
        raise UnsupportedError(f"{op_name}: out_layout {out_layout!r} different from layout {layout.name!r}")
    if ndim is not None and ndim != len(layout.axes):
        raise RelayTypeError(f"data of rank {ndim} does not fit layout {layout.name}", op_name=op_name)
    return layout.index("H"), layout.index("W")


@type_relation("nn.global_avg_pool2d", "nn.global_max_pool2d")
def global_pool2d_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    data = _tensor_arg(arg_types[0], "nn.global_pool2d", "data")
    h, w = _global_pool_axes(attrs, "nn.global_pool2d", data.ndim)
    shape = list(data.shape)
    shape[h] = shape[w] = 1
    return TensorType(tuple(shape), data.dtype)


@reference("nn.global_avg_pool2d")
def global_avg_pool2d_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    (data,) = inputs
    axes = _global_pool_axes(attrs, "nn.global_avg_pool2d")
    acc = accumulator_dtype(str(data.dtype))
    mean = data.astype(acc, copy=False).mean(axis=axes, keepdims=True)
    if acc.kind != "f":
        mean = np.trunc(mean)
    return mean.astype(data.dtype)


@reference("nn.global_max_pool2d")
def global_max_pool2d_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    (data,) = inputs
    return data.max(axis=_global_pool_axes(attrs, "nn.global_max_pool2d"), keepdims=True)


# ================================================================================================
# 3-D convolution, transposed convolution, local response normalisation, layer normalisation
# (operators the ONNX importer maps onto; same attribute schemas and defaults as TVM)
# ================================================================================================

register_op(
    "nn.conv3d", 2, OUT_EW,
    {"strides": (1, 1, 1), "dilation": (1, 1, 1), **_CONV_COMMON, "padding": (0, 0, 0),
     "data_layout": "NCDHW", "kernel_layout": "OIDHW"},
    "relay.attrs.Conv3DAttrs",
)

_CONV_TRANSPOSE_COMMON = {"channels": None, "kernel_size": None}
register_op(
    "nn.conv2d_transpose", 2, OUT_EW,
    {**_CONV_TRANSPOSE_COMMON, "strides": (1, 1), "padding": (0, 0), "output_padding": (0, 0),
     "dilation": (1, 1), "groups": 1, "data_layout": "NCHW", "kernel_layout": "IOHW", "out_layout": "",
     "out_dtype": ""},
    "relay.attrs.Conv2DTransposeAttrs",
    description="conv2d's gradient with respect to its input ('deconvolution'); weight is (in, out/groups, kh, kw)",
)
register_op(
    "nn.conv1d_transpose", 2, OUT_EW,
    {**_CONV_TRANSPOSE_COMMON, "strides": (1,), "padding": (0,), "output_padding": (0,),
     "dilation": (1,), "groups": 1, "data_layout": "NCW", "kernel_layout": "IOW", "out_layout": "",
     "out_dtype": ""},
    "relay.attrs.Conv1DTransposeAttrs",
)
register_op(
    "nn.lrn", 1, OpPattern.OPAQUE, {"size": 5, "axis": 1, "bias": 2.0, "alpha": 0.0001, "beta": 0.75},
    "relay.attrs.LRNAttrs", description="local response normalisation across `axis`",
)
register_op(
    "nn.layer_norm", 3, OpPattern.OPAQUE, {"axis": -1, "epsilon": 1e-5, "center": True, "scale": True},
    "relay.attrs.LayerNormAttrs", description="normalise over `axis`, then scale by gamma and shift by beta",
)


@type_relation("nn.conv3d")
def conv3d_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _conv_rel(arg_types, attrs, "nn.conv3d", "DHW")


@reference("nn.conv3d")
def conv3d_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    return _conv_ref(inputs, attrs, "nn.conv3d", "DHW")


@dataclass(frozen=True)
class _TransposeGeometry:
    strides: tuple[int, ...]
    dilation: tuple[int, ...]
    pad_before: tuple[int, ...]
    pad_after: tuple[int, ...]
    output_padding: tuple[int, ...]
    groups: int


def _transpose_geometry(attrs: Attrs, op_name: str, nsp: int) -> _TransposeGeometry:
    pad_before, pad_after = _padding(attrs["padding"], nsp, op_name)
    geometry = _TransposeGeometry(
        strides=_ints(attrs["strides"], nsp, op_name, "strides"),
        dilation=_ints(attrs["dilation"], nsp, op_name, "dilation"),
        pad_before=pad_before,
        pad_after=pad_after,
        output_padding=_ints(attrs["output_padding"], nsp, op_name, "output_padding"),
        groups=attrs["groups"],
    )
    if not isinstance(geometry.groups, int) or geometry.groups < 1:
        raise RelayTypeError(f"groups must be a positive integer, got {geometry.groups!r}", op_name=op_name)
    if min(geometry.strides + geometry.dilation) < 1 or min(geometry.output_padding) < 0:
        raise RelayTypeError(
            f"strides {list(geometry.strides)} and dilation {list(geometry.dilation)} must be >= 1 and "
            f"output_padding {list(geometry.output_padding)} >= 0",
            op_name=op_name,
        )
    return geometry


def _conv_transpose_rel(arg_types: Sequence[Type], attrs: Attrs, op_name: str, spatial_letters: str) -> Type:
    """`data (N, C, *S)` and `weight (C, O/groups, *K)` (IO layout) -> `(N, O, *S')` where, per axis,
    `S' = (S - 1) * stride - pad_before - pad_after + (K - 1) * dilation + 1 + output_padding`."""
    data_order, kernel_order = "NC" + spatial_letters, "IO" + spatial_letters
    nsp = len(spatial_letters)
    data = _tensor_arg(arg_types[0], op_name, "data")
    weight = _tensor_arg(arg_types[1], op_name, "weight")
    data_layout = Layout.parse(str(attrs["data_layout"]), op_name)
    kernel_layout = Layout.parse(str(attrs["kernel_layout"]), op_name)
    out_layout = Layout.parse(str(attrs["out_layout"] or attrs["data_layout"]), op_name)
    data_layout.check_primal(data_order, op_name, "data")
    kernel_layout.check_primal(kernel_order, op_name, "kernel")
    out_layout.check_primal(data_order, op_name, "output")
    n, c, *spatial = data_layout.to_primal_shape(data.shape, data_order, op_name, "data")
    i, o_group, *ksize = kernel_layout.to_primal_shape(weight.shape, kernel_order, op_name, "weight")
    g = _transpose_geometry(attrs, op_name, nsp)
    if _dims_clash(c, i):
        raise RelayTypeError(
            f"data {fmt_shape(data.shape)} has {c} input channels but weight {fmt_shape(weight.shape)} "
            f"({kernel_layout.name}) expects {i}",
            op_name=op_name,
        )
    if c is not ANY and c % g.groups:  # type: ignore[operator]
        raise RelayTypeError(f"input channels {c} are not divisible by groups={g.groups}", op_name=op_name)
    out_channels = _dim_mul(o_group, g.groups)
    channels = attrs["channels"]
    if channels is not None and _dims_clash(out_channels, channels):
        raise RelayTypeError(
            f"channels={channels} does not match weight {fmt_shape(weight.shape)} with groups={g.groups} "
            f"({out_channels} output channels)",
            op_name=op_name,
        )
    if attrs["kernel_size"] is not None:
        kernel_size = _ints(attrs["kernel_size"], nsp, op_name, "kernel_size")
        if any(_dims_clash(k, w) for k, w in zip(kernel_size, ksize)):
            raise RelayTypeError(f"kernel_size {list(kernel_size)} does not match weight {fmt_shape(weight.shape)}",
                                 op_name=op_name)
    out_spatial: list[Dim] = []
    for size, k, s, d, pb, pa, op in zip(spatial, ksize, g.strides, g.dilation, g.pad_before, g.pad_after,
                                         g.output_padding):
        if size is ANY or k is ANY:
            out_spatial.append(ANY)
            continue
        extent = (size - 1) * s - pb - pa + (k - 1) * d + 1 + op  # type: ignore[operator]
        if extent <= 0:
            raise RelayTypeError(
                f"padding {list(g.pad_before)}+{list(g.pad_after)} leaves no output for data {fmt_shape(data.shape)} "
                f"and weight {fmt_shape(weight.shape)}",
                op_name=op_name,
            )
        out_spatial.append(extent)
    out_shape = out_layout.from_primal_shape((n, out_channels, *out_spatial), data_order, op_name, "output")
    return TensorType(out_shape, _out_dtype(attrs, data.dtype))


@type_relation("nn.conv2d_transpose")
def conv2d_transpose_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _conv_transpose_rel(arg_types, attrs, "nn.conv2d_transpose", "HW")


@type_relation("nn.conv1d_transpose")
def conv1d_transpose_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    return _conv_transpose_rel(arg_types, attrs, "nn.conv1d_transpose", "W")


def conv_transpose_nd_primal(data: np.ndarray, weight: np.ndarray, g: _TransposeGeometry, acc: np.dtype) -> np.ndarray:
    """Transposed convolution on `(N, C, *S)` data and `(C, O/groups, *K)` weight.

    Every input pixel scatters `x * w[:, :, tap]` to output position `pixel * stride + tap * dilation`; done
    one kernel tap at a time (a matmul over input channels each) into the full, uncropped output, which is
    then cropped by the padding. `output_padding` extends the far end of each axis.
    """
    nsp = data.ndim - 2
    n, c = data.shape[:2]
    o_group = weight.shape[1]
    ksize = weight.shape[2:]
    groups = g.groups
    cg = c // groups
    full = [(size - 1) * s + (k - 1) * d + 1 + op
            for size, k, s, d, op in zip(data.shape[2:], ksize, g.strides, g.dilation, g.output_padding)]
    # Room for a negative crop: the full output must reach at least pad_before + out extent.
    out_extent = [f - pb - pa for f, pb, pa in zip(full, g.pad_before, g.pad_after)]
    canvas = np.zeros((n, groups, o_group, *[max(f, pb + e) for f, pb, e in zip(full, g.pad_before, out_extent)]),
                      dtype=acc)
    x = data.astype(acc, copy=False).reshape(n, groups, cg, *data.shape[2:])
    w = weight.astype(acc, copy=False).reshape(groups, cg, o_group, *ksize)
    for tap in itertools.product(*(range(k) for k in ksize)):
        # (N, G, Cg, *S) x (G, Cg, Og) -> (N, G, Og, *S)
        contribution = np.einsum("ngc...,gco->ngo...", x, w[(slice(None), slice(None), slice(None), *tap)])
        index = tuple(
            slice(t * d, t * d + (size - 1) * s + 1, s)
            for t, d, size, s in zip(tap, g.dilation, data.shape[2:], g.strides)
        )
        canvas[(slice(None), slice(None), slice(None), *index)] += contribution
    crop = tuple(slice(pb, pb + e) for pb, e in zip(g.pad_before, out_extent))
    out = canvas[(slice(None), slice(None), slice(None), *crop)]
    return out.reshape(n, groups * o_group, *out.shape[3:3 + nsp])


def _conv_transpose_ref(inputs: Sequence[np.ndarray], attrs: Attrs, op_name: str, spatial_letters: str) -> np.ndarray:
    data, weight = inputs
    data_order, kernel_order = "NC" + spatial_letters, "IO" + spatial_letters
    data_layout = Layout.parse(str(attrs["data_layout"]), op_name)
    kernel_layout = Layout.parse(str(attrs["kernel_layout"]), op_name)
    out_layout = Layout.parse(str(attrs["out_layout"] or attrs["data_layout"]), op_name)
    out_dtype = _out_dtype(attrs, str(data.dtype))
    out = conv_transpose_nd_primal(
        data_layout.to_primal_array(data, data_order),
        kernel_layout.to_primal_array(weight, kernel_order),
        _transpose_geometry(attrs, op_name, len(spatial_letters)),
        accumulator_dtype(out_dtype),
    )
    return np.ascontiguousarray(out_layout.from_primal_array(out, data_order)).astype(out_dtype, copy=False)


@reference("nn.conv2d_transpose")
def conv2d_transpose_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    return _conv_transpose_ref(inputs, attrs, "nn.conv2d_transpose", "HW")


@reference("nn.conv1d_transpose")
def conv1d_transpose_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    return _conv_transpose_ref(inputs, attrs, "nn.conv1d_transpose", "W")


def _float_data(arg_types: Sequence[Type], op_name: str) -> TensorType:
    data = _tensor_arg(arg_types[0], op_name, "data")
    if not is_float_dtype(data.dtype):
        raise RelayTypeError(f"needs a floating-point tensor, got {data.dtype}", op_name=op_name)
    return data


@type_relation("nn.lrn")
def lrn_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    data = _float_data(arg_types, "nn.lrn")
    _axis(attrs["axis"], data.ndim, "nn.lrn", data)
    size = attrs["size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise RelayTypeError(f"size must be a positive integer, got {size!r}", op_name="nn.lrn")
    # A window longer than twice the axis covers the whole axis at every position; anything longer is a mistake,
    # and the reference and the kernel would loop (and pad) over all of it.
    extent = data.shape[int(attrs["axis"]) % data.ndim]
    limit = 2 * extent + 1 if isinstance(extent, int) else 1 << 16
    if size > limit:
        raise RelayTypeError(f"size={size} is longer than the window of an axis of extent {extent} "
                             f"can be (at most {limit})", op_name="nn.lrn")
    return data


@reference("nn.lrn")
def lrn_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    """`x / (bias + alpha * sum(x^2 over the window) / size) ** beta`.

    As in TVM, the window of position `c` along `axis` is `[c - size // 2, c - size // 2 + size)` (symmetric
    for odd sizes), clipped to the axis.
    """
    (data,) = inputs
    axis = int(attrs["axis"]) % data.ndim
    size = int(attrs["size"])
    x = data.astype(np.float64)
    radius = size // 2
    pad = [(0, 0)] * x.ndim
    pad[axis] = (radius, size - 1 - radius)
    squares = np.pad(x * x, pad)
    windows = np.lib.stride_tricks.sliding_window_view(squares, size, axis=axis)
    total = windows.sum(axis=-1)
    scale = (float(attrs["bias"]) + float(attrs["alpha"]) * total / size) ** float(attrs["beta"])
    return (x / scale).astype(data.dtype)


@type_relation("nn.layer_norm")
def layer_norm_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    """`(data, gamma, beta)` -> data's type; gamma and beta are `(data.shape[axis],)`."""
    op_name = "nn.layer_norm"
    data = _float_data(arg_types, op_name)
    axis = _axis(attrs["axis"], data.ndim, op_name, data)
    for name, ty in zip(("gamma", "beta"), arg_types[1:]):
        vec = _tensor_arg(ty, op_name, name)
        if vec.ndim != 1 or _dims_clash(vec.shape[0], data.shape[axis]):
            raise RelayTypeError(
                f"{name} {fmt_shape(vec.shape)} must have shape ({data.shape[axis]},) to match axis {axis} of data "
                f"{fmt_shape(data.shape)}",
                op_name=op_name,
            )
        if vec.dtype != data.dtype:
            raise RelayTypeError(f"{name} has dtype {vec.dtype} but data has dtype {data.dtype}", op_name=op_name)
    return data


@reference("nn.layer_norm")
def layer_norm_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    data, gamma, beta = inputs
    axis = int(attrs["axis"]) % data.ndim
    x = data.astype(np.float64)
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    out = (x - mean) / np.sqrt(var + float(attrs["epsilon"]))
    if attrs["scale"]:
        out = out * _along(gamma.astype(np.float64), axis, x.ndim)
    if attrs["center"]:
        out = out + _along(beta.astype(np.float64), axis, x.ndim)
    return out.astype(data.dtype)


# ================================================================================================
# Tensor-expression computes (kernels)
# ================================================================================================
# Imported here, not at the top: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import (  # noqa: E402
    BROADCAST,
    LayoutMap,
    accumulate_dtype,
    axis_names,
    const_expr,
    named,
    static_shape,
)
from relay_tune.op.registry import compute  # noqa: E402


def conv_pad_stage(
    data: te.Tensor, layout: LayoutMap, pad_before: Sequence[int], pad_after: Sequence[int], spatial_letters: str,
) -> te.Tensor:
    """`data` zero-padded on its spatial axes, in its own layout: a separate, injective stage that the
    schedule computes ahead of the convolution (or inlines into it). `data` itself when nothing is padded."""
    pads: dict[int, tuple[int, int]] = {}
    for letter, b, a in zip(spatial_letters, pad_before, pad_after):
        if layout.factor(letter) is not None:
            raise UnsupportedError(f"padding a split spatial axis {letter} of layout {layout.name}")
        axis = next(i for i, (ax, factor) in enumerate(layout.axes) if ax == letter and factor is None)
        pads[axis] = (b, a)
    return _pad_axes(data, pads, const_expr(0, data.dtype), layout)


def _conv_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type, op_name: str,
                  spatial_letters: str) -> te.Tensor:
    data, weight = inputs
    nsp = len(spatial_letters)
    data_order, kernel_order = "NC" + spatial_letters, "OI" + spatial_letters
    dl = LayoutMap.parse(str(attrs["data_layout"]), "data layout")
    kl = LayoutMap.parse(str(attrs["kernel_layout"]), "kernel layout")
    ol = LayoutMap.parse(str(attrs["out_layout"] or attrs["data_layout"]), "output layout")
    for layout, order in ((dl, data_order), (kl, kernel_order), (ol, data_order)):
        if sorted(layout.primal) != sorted(order):
            raise UnsupportedError(f"{op_name}: layout {layout.name!r} is not a rearrangement of {order!r}")
    strides = _ints(attrs["strides"], nsp, op_name, "strides")
    dilation = _ints(attrs["dilation"], nsp, op_name, "dilation")
    pad_before, pad_after = _padding(attrs["padding"], nsp, op_name)
    groups = int(attrs["groups"])
    out_ty = out_type if isinstance(out_type, TensorType) else None
    assert out_ty is not None
    out_shape = static_shape(out_ty)
    out_dtype = out_ty.dtype
    acc = accumulate_dtype(out_dtype)

    logical_data = _logical_dims(dl, data.shape)
    logical_weight = _logical_dims(kl, weight.shape)
    in_channels = logical_data["C"]
    cg = in_channels // groups
    out_channels = logical_weight["O"]
    og = out_channels // groups
    ksize = [logical_weight[s] for s in spatial_letters]

    padded = conv_pad_stage(data, dl, pad_before, pad_after, spatial_letters)
    if op_name == "nn.contrib_conv2d_NCHWc":
        blocked = _blocked_conv_compute(padded, weight, dl, kl, ol, groups, strides, dilation, out_ty)
        if blocked is not None:
            return blocked
    rc = te.reduce_axis(cg, "rc")
    rk = [te.reduce_axis(k, f"r{s.lower()}") for s, k in zip(spatial_letters, ksize)]
    depthwise = groups > 1 and cg == 1 and og == 1
    reduce_axes = ([] if cg == 1 else [rc]) + rk
    if not reduce_axes:  # a 1x1 depthwise convolution: one product per output
        reduce_axes = [rc]

    names = ol.axis_names({"N": "n", "C": "oc", **{s: f"o{s.lower()}" for s in spatial_letters}})

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        pos = ol.logical(idx)
        oc = pos["C"]
        # With one channel per group rc may not be a reduce axis: its only value is 0.
        rc_value: tir.PrimExpr = rc if rc in reduce_axes else tir.IntImm(0)
        if groups == 1:
            ic: tir.PrimExpr = rc_value
        elif depthwise:
            ic = oc
        else:
            ic = (oc // og) * cg + rc_value
        src = {"N": pos["N"], "C": ic}
        wpos = {"O": oc, "I": rc if cg > 1 else tir.IntImm(0)}
        for s, r, st, dil in zip(spatial_letters, rk, strides, dilation):
            tap = r * dil if dil != 1 else r
            src[s] = (pos[s] * st if st != 1 else pos[s]) + tap
            wpos[s] = r
        x = padded[dl.index(src)]
        w = weight[kl.index(wpos)]
        return te.sum(te.cast(acc, x) * te.cast(acc, w), axis=reduce_axes)

    tag = "conv"
    if nsp == 2 and op_name != "nn.contrib_conv2d_NCHWc":
        if depthwise and dl.name == "NCHW" and kl.name == "OIHW" and ol.name == "NCHW":
            tag = "depthwise_conv2d_nchw"
        elif groups == 1 and dl.name == "NCHW" and kl.name == "OIHW" and ol.name == "NCHW":
            tag = "conv2d_nchw"
        elif groups > 1 and dl.name == "NCHW" and kl.name == "OIHW" and ol.name == "NCHW":
            # Grouped, not depthwise: the input channel `(oc // og) * cg + rc` is invariant in the spatial and
            # reduction loops, so a channel tile inside one group reads it once per tile.
            tag = "group_conv2d_nchw"
        elif groups == 1 and dl.name == "NHWC" and ol.name == "NHWC":
            tag = "conv2d_nhwc"
    pointwise = padded is data and all(k == 1 for k in ksize) and all(st == 1 for st in strides)
    if tag == "conv2d_nchw" and out_shape[3] < NARROW_MAP and out_channels >= CHANNEL_LAST_MIN_CHANNELS \
            and not pointwise:
        # Rows narrower than a few vectors (56, 28, 14, 7 columns) fill vector registers badly (28 = 16 + 12 lanes,
        # 14 of 16), so the sums are kept channel innermost (`nhwc`), where a vector spans output channels and each
        # input value is broadcast, and transposed back to NCHW on write-out.
        n, c, h, w = out_shape
        total = te.compute((n, h, w, c), named(["n", "oh", "ow", "oc"], lambda b, y, x, f: body(b, f, y, x)),
                           "nhwc", "conv2d_nchw_cl")
        return te.compute(out_shape, named(names, lambda b, f, y, x: te.cast(out_dtype, total[b, y, x, f])),
                          "conv", "injective")
    return _conv_output(out_shape, names, body, tag, acc, out_dtype)


def _conv_output(shape: Sequence[int], names: Sequence[str], body: Callable[..., tir.PrimExpr], tag: str, acc: str,
                 out_dtype: str) -> te.Tensor:
    """The convolution stage tagged `tag`, summing in `acc`; cast to `out_dtype` by an element-wise stage when the
    two differ."""
    if acc == out_dtype:
        return te.compute(shape, named(names, body), "conv", tag)
    total = te.compute(shape, named(names, body), "acc", tag)
    return te.compute(shape, named(names, lambda *i: te.cast(out_dtype, total[i])), "conv", "elemwise")


def _blocked_factors(dl: LayoutMap, kl: LayoutMap, ol: LayoutMap) -> tuple[int, int, int, int] | None:
    """(data block, kernel input block, kernel output block, output block) when the layouts are exactly
    `NCHW{a}c`, `OIHW{b}i{c}o` and `NCHW{d}c`; None for any other arrangement."""
    data = re.fullmatch(r"NCHW(\d+)c", dl.name)
    kernel = re.fullmatch(r"OIHW(\d+)i(\d+)o", kl.name)
    out = re.fullmatch(r"NCHW(\d+)c", ol.name)
    if not (data and kernel and out):
        return None
    return int(data[1]), int(kernel[1]), int(kernel[2]), int(out[1])


def _blocked_conv_compute(padded: te.Tensor, weight: te.Tensor, dl: LayoutMap, kl: LayoutMap, ol: LayoutMap,
                          groups: int, strides: Sequence[int], dilation: Sequence[int],
                          out_ty: TensorType) -> te.Tensor | None:
    """A 2-D convolution on channel-blocked layouts, indexed block by block (no division in any read), or None
    when the layouts are not the blocked ones its templates schedule (the generic compute then serves).

    Dense (groups 1; `NCHW{bi}c` x `OIHW{bi}i{bo}o` -> `NCHW{bo}c`): the input-channel reduction is two axes, the
    block `rcb` and the channel inside it `rci`, in the order the template reads them (`rcb, rh, rw, rci`): an
    input value is `x[n, rcb, y, x, rci]` and a weight row `w[ocb, rcb, rh, rw, rci, 0:bo]`, contiguous along the
    output block, which is the vector. Grouped (blocks inside every group): the same, each output block reading
    its group's input blocks. Depthwise (groups = channels; `NCHW{b}c` x `OIHW1i{b}o` -> `NCHW{b}c`): each output
    block reads the same block of the input, lane for lane."""
    factors = _blocked_factors(dl, kl, ol)
    if factors is None:
        return None
    bi, ki, ko, bo = factors
    out_shape = static_shape(out_ty)
    out_dtype = out_ty.dtype
    acc = accumulate_dtype(out_dtype)
    icb = padded.shape[1]
    _, _, kh, kw, _, _ = weight.shape
    channels = icb * bi
    rh, rw = te.reduce_axis(kh, "rh"), te.reduce_axis(kw, "rw")
    sh, sw = strides
    dh, dw = dilation

    def position(y: tir.PrimExpr, x: tir.PrimExpr) -> tuple[tir.PrimExpr, tir.PrimExpr]:
        return ((y * sh if sh != 1 else y) + (rh * dh if dh != 1 else rh),
                (x * sw if sw != 1 else x) + (rw * dw if dw != 1 else rw))

    if groups == 1 and bi == ki and ko == bo:
        tag = "conv2d_nchwc"
        rcb, rci = te.reduce_axis(icb, "rcb"), te.reduce_axis(bi, "rci")

        def body(b: tir.PrimExpr, f: tir.PrimExpr, y: tir.PrimExpr, x: tir.PrimExpr,
                 c: tir.PrimExpr) -> tir.PrimExpr:
            iy, ix = position(y, x)
            return te.sum(te.cast(acc, padded[b, rcb, iy, ix, rci]) * te.cast(acc, weight[f, rcb, rh, rw, rci, c]),
                          axis=[rcb, rh, rw, rci])
    elif (1 < groups < channels and bi == ki and ko == bo and channels % (groups * bi) == 0
          and out_shape[1] % groups == 0):
        # Grouped (AlexNet's two-group 5x5 and 3x3 convolutions): output block `f` belongs to group
        # `f // out_blocks`, whose input channels are the `in_blocks` blocks from `group * in_blocks` on; the same
        # loops and reads as the dense case, offset by the group.
        tag = "conv2d_nchwc"
        in_blocks, out_blocks = icb // groups, out_shape[1] // groups
        rcb, rci = te.reduce_axis(in_blocks, "rcb"), te.reduce_axis(bi, "rci")

        def body(b: tir.PrimExpr, f: tir.PrimExpr, y: tir.PrimExpr, x: tir.PrimExpr,
                 c: tir.PrimExpr) -> tir.PrimExpr:
            iy, ix = position(y, x)
            block = (f // out_blocks) * in_blocks + rcb
            return te.sum(te.cast(acc, padded[b, block, iy, ix, rci]) * te.cast(acc, weight[f, rcb, rh, rw, rci, c]),
                          axis=[rcb, rh, rw, rci])
    elif groups == channels and ki == 1 and bi == ko == bo and out_shape[1] == icb:
        tag = "depthwise_conv2d_nchwc"

        def body(b: tir.PrimExpr, f: tir.PrimExpr, y: tir.PrimExpr, x: tir.PrimExpr,
                 c: tir.PrimExpr) -> tir.PrimExpr:
            iy, ix = position(y, x)
            zero = tir.IntImm(0)
            return te.sum(te.cast(acc, padded[b, f, iy, ix, c]) * te.cast(acc, weight[f, zero, rh, rw, zero, c]),
                          axis=[rh, rw])
    else:
        return None
    names = ol.axis_names({"N": "n", "C": "oc", "H": "oh", "W": "ow"})
    return _conv_output(out_shape, names, body, tag, acc, out_dtype)


NARROW_MAP = 64
"""NCHW convolutions whose output rows are narrower than this (four 16-lane vectors) accumulate channel-innermost
(see above). Measured with default schedules on ResNet-50, VGG-16 and SqueezeNet (in-graph profile, interleaved):
channel-innermost sums made 28-column 3x3 convolutions 1.3-1.6x faster (128x28x28 3x3: 1.97 -> 1.33 ms per call)
and stride-2 1x1 convolutions onto 28 columns 1.4x; 55- and 56-column maps 0-7%; on 112 columns it was a wash and on
224 columns (3 input channels) 6x slower, so wide maps keep vectors along the row."""

CHANNEL_LAST_MIN_CHANNELS = 16
"""Channel-innermost sums need at least one vector of output channels."""


def _logical_dims(layout: LayoutMap, shape: Sequence[int]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for (letter, _f), size in zip(layout.axes, shape):
        dims[letter] = dims.get(letter, 1) * size
    return dims


@compute("nn.conv2d")
def _conv2d_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _conv_compute(inputs, attrs, out_type, "nn.conv2d", "HW")


@compute("nn.contrib_conv2d_NCHWc")
def _conv2d_nchwc_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _conv_compute(inputs, attrs, out_type, "nn.contrib_conv2d_NCHWc", "HW")


@compute("nn.conv1d")
def _conv1d_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _conv_compute(inputs, attrs, out_type, "nn.conv1d", "W")


@compute("nn.conv3d")
def _conv3d_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _conv_compute(inputs, attrs, out_type, "nn.conv3d", "DHW")


@compute("nn.dense")
def _dense_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    data, weight = inputs
    assert isinstance(out_type, TensorType)
    out_shape = static_shape(out_type)
    acc = accumulate_dtype(out_type.dtype)
    k = te.reduce_axis(data.shape[-1], "k")
    lead = len(out_shape) - 1
    names = ["i", "j"] if lead == 1 else [*axis_names(lead, "b"), "j"]

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        x = data[(*idx[:-1], k)]
        return te.sum(te.cast(acc, x) * te.cast(acc, weight[idx[-1], k]), axis=k)

    if acc == out_type.dtype:
        return te.compute(out_shape, named(names, body), "dense", "dense")
    total = te.compute(out_shape, named(names, body), "acc", "dense")
    return te.compute(out_shape, named(names, lambda *i: te.cast(out_type.dtype, total[i])), "dense", "elemwise")


@compute("nn.bias_add")
def _bias_add_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    data, bias = inputs
    axis = int(attrs["axis"]) % data.ndim
    shape = static_shape(out_type)

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        return data[idx] + bias[idx[axis]]

    return te.compute(shape, named(axis_names(len(shape)), body), "bias_add", BROADCAST)


@compute("nn.batch_norm", "nn.dropout")
def _removed_by_simplify_inference(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    raise UnsupportedError(
        "nn.batch_norm and nn.dropout have no kernel: run SimplifyInference (part of the default pass pipeline) "
        "to rewrite them into element-wise operations before building"
    )


@compute("nn.batch_matmul")
def _batch_matmul_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, y = inputs
    assert isinstance(out_type, TensorType)
    out_shape = static_shape(out_type)
    acc = accumulate_dtype(out_type.dtype)
    ta, tb = bool(attrs["transpose_a"]), bool(attrs["transpose_b"])
    k_extent = x.shape[1] if ta else x.shape[2]
    k = te.reduce_axis(k_extent, "k")
    if tb:
        # y as (batch, K, N): the inner product then reads N contiguously. A separate stage, which the default
        # schedule computes ahead (a transpose of one operand costs far less than the product).
        yt = te.compute((y.shape[0], y.shape[2], y.shape[1]), named(["b", "k", "n"], lambda b, kk, n: y[b, n, kk]),
                        "transpose_b", "pack")
    else:
        yt = y

    def batch(t: te.Tensor, b: tir.PrimExpr) -> tir.PrimExpr:
        return tir.IntImm(0) if t.shape[0] == 1 else b

    def body(b: tir.PrimExpr, i: tir.PrimExpr, j: tir.PrimExpr) -> tir.PrimExpr:
        lhs = x[batch(x, b), k, i] if ta else x[batch(x, b), i, k]
        rhs = yt[batch(yt, b), k, j]
        return te.sum(te.cast(acc, lhs) * te.cast(acc, rhs), axis=k)

    if acc == out_type.dtype:
        return te.compute(out_shape, named(["b", "i", "j"], body), "batch_matmul", "batch_matmul")
    total = te.compute(out_shape, named(["b", "i", "j"], body), "acc", "batch_matmul")
    return te.compute(out_shape, named(["b", "i", "j"], lambda *i: te.cast(out_type.dtype, total[i])),
                      "batch_matmul", "elemwise")


def _softmax_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type, log: bool) -> te.Tensor:
    (x,) = inputs
    dtype = x.dtype
    axis = int(attrs["axis"]) % x.ndim
    acc = str(accumulator_dtype(dtype))
    shape = x.shape
    reduced = tuple(s for d, s in enumerate(shape) if d != axis)
    names = axis_names(x.ndim)
    rnames = [n for d, n in enumerate(names) if d != axis]
    k1, k2 = te.reduce_axis(shape[axis], "k"), te.reduce_axis(shape[axis], "k")

    def at(idx: Sequence[tir.PrimExpr], value: tir.PrimExpr) -> tuple[tir.PrimExpr, ...]:
        return (*idx[:axis], value, *idx[axis:])

    def drop(idx: Sequence[tir.PrimExpr]) -> tuple[tir.PrimExpr, ...]:
        return (*idx[:axis], *idx[axis + 1:])

    xmax = te.compute(reduced, named(rnames, lambda *i: te.max(te.cast(acc, x[at(i, k1)]), axis=k1)), "max", "softmax")
    shifted = te.compute(shape, named(names, lambda *i: te.exp(te.cast(acc, x[i]) - xmax[drop(i)])), "exp", "softmax")
    total = te.compute(reduced, named(rnames, lambda *i: te.sum(shifted[at(i, k2)], axis=k2)), "sum", "softmax")
    if log:
        def body(*i: tir.PrimExpr) -> tir.PrimExpr:
            return te.cast(dtype, te.cast(acc, x[i]) - xmax[drop(i)] - te.log(total[drop(i)]))
    else:
        def body(*i: tir.PrimExpr) -> tir.PrimExpr:
            return te.cast(dtype, shifted[i] / total[drop(i)])
    return te.compute(shape, named(names, body), "softmax", "softmax")


@compute("nn.softmax")
def _softmax(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _softmax_compute(inputs, attrs, out_type, log=False)


@compute("nn.log_softmax")
def _log_softmax(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _softmax_compute(inputs, attrs, out_type, log=True)


def _tap_count(start: tir.PrimExpr, taps: int, dilation: int, lo: int, hi: int) -> tir.PrimExpr:
    """How many of the positions `start + t * dilation` (0 <= t < taps) fall in [lo, hi)."""
    if dilation == 1:
        first = te.maximum(start, lo)
        last = te.minimum(start + (taps - 1), hi - 1)
    else:
        # first t with start + t*d >= lo is ceil((lo - start) / d); last t with start + t*d <= hi - 1 is a floor
        t_first = te.maximum(tir.IntImm(0) - tir.binary("floordiv", start - lo, dilation), 0)
        t_last = te.minimum(tir.binary("floordiv", hi - 1 - start, dilation), taps - 1)
        return te.maximum(t_last - t_first + 1, 0)
    return te.maximum(last - first + 1, 0)


def _pool_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type, op_name: str) -> te.Tensor:
    (x,) = inputs
    g = _pool_geometry(attrs, op_name)
    is_max = op_name == "nn.max_pool2d"
    dtype = x.dtype
    out_shape = static_shape(out_type)
    hw = (x.shape[g.h_axis], x.shape[g.w_axis])
    _, pad_h, pad_w = _pool_padding(hw, g)
    fill = te.min_value(dtype) if is_max else const_expr(0, dtype)
    layout = LayoutMap.parse(str(attrs["layout"]))
    padded = _pad_axes(x, {g.h_axis: pad_h, g.w_axis: pad_w}, fill, layout)
    acc = dtype if is_max else str(accumulator_dtype(dtype))
    rh, rw = te.reduce_axis(g.pool[0], "rh"), te.reduce_axis(g.pool[1], "rw")
    names = layout.axis_names({"N": "n", "C": "c", "H": "oh", "W": "ow"})

    def src(idx: Sequence[tir.PrimExpr]) -> tuple[tir.PrimExpr, ...]:
        out = list(idx)
        out[g.h_axis] = idx[g.h_axis] * g.strides[0] + rh * g.dilation[0]
        out[g.w_axis] = idx[g.w_axis] * g.strides[1] + rw * g.dilation[1]
        return tuple(out)

    if is_max:
        return te.compute(out_shape, named(names, lambda *i: te.max(padded[src(i)], axis=[rh, rw])), "pool", "pool")
    total = te.compute(out_shape, named(names, lambda *i: te.sum(te.cast(acc, padded[src(i)]), axis=[rh, rw])),
                       "sum", "pool")
    include = bool(attrs["count_include_pad"])

    def average(*idx: tir.PrimExpr) -> tir.PrimExpr:
        counts = []
        for d, (axis, size, pb, pa) in enumerate(((g.h_axis, hw[0], g.pad_before[0], g.pad_after[0]),
                                                  (g.w_axis, hw[1], g.pad_before[1], g.pad_after[1]))):
            # window start in input coordinates; the ceil-mode rows past the explicit padding never count
            start = idx[axis] * g.strides[d] - pb
            lo, hi = (-pb, size + pa) if include else (0, size)
            counts.append(_tap_count(start, g.pool[d], g.dilation[d], lo, hi))
        divisor = te.maximum(counts[0] * counts[1], 1)
        value = tir.BinaryOp("div", total[idx], te.cast(acc, divisor))
        return te.cast(dtype, value)

    return te.compute(out_shape, named(names, average), "pool", "elemwise")


def _pad_axes(x: te.Tensor, pads: dict[int, tuple[int, int]], fill: tir.PrimExpr, layout: LayoutMap) -> te.Tensor:
    """`x` padded by `(before, after)` on the given axes with the value `fill` (an injective stage); a negative
    `after` crops (Winograd tiles never read the rows past the last tile)."""
    if not any(b or a for b, a in pads.values()):
        return x
    shape = tuple(s + sum(pads.get(d, (0, 0))) for d, s in enumerate(x.shape))

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        conds: list[tir.PrimExpr] = []
        src: list[tir.PrimExpr] = []
        for d, i in enumerate(idx):
            before, after = pads.get(d, (0, 0))
            if before:
                conds.append(i >= before)
            if after > 0:
                conds.append(i < before + x.shape[d])
            src.append(i - before if before else i)
        if not conds:
            return x[tuple(src)]
        return te.if_then_else(te.all_of(*conds), x[tuple(src)], fill)

    names = layout.axis_names({"N": "n", "C": "c", "D": "d", "H": "h", "W": "w"})
    return te.compute(shape, named(names, body), "pad", "pad")


@compute("nn.max_pool2d")
def _max_pool2d_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _pool_compute(inputs, attrs, out_type, "nn.max_pool2d")


@compute("nn.avg_pool2d")
def _avg_pool2d_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _pool_compute(inputs, attrs, out_type, "nn.avg_pool2d")


def _global_pool_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type, op_name: str) -> te.Tensor:
    (x,) = inputs
    h, w = _global_pool_axes(attrs, op_name, x.ndim)
    shape = static_shape(out_type)
    rh, rw = te.reduce_axis(x.shape[h], "rh"), te.reduce_axis(x.shape[w], "rw")
    names = LayoutMap.parse(str(attrs["layout"])).axis_names({"N": "n", "C": "c", "H": "oh", "W": "ow"})

    def src(idx: Sequence[tir.PrimExpr]) -> tuple[tir.PrimExpr, ...]:
        out = list(idx)
        out[h], out[w] = rh, rw
        return tuple(out)

    if op_name == "nn.global_max_pool2d":
        return te.compute(shape, named(names, lambda *i: te.max(x[src(i)], axis=[rh, rw])), "pool", "global_pool")
    acc = str(accumulator_dtype(x.dtype))
    total = te.compute(shape, named(names, lambda *i: te.sum(te.cast(acc, x[src(i)]), axis=[rh, rw])), "sum",
                       "global_pool")
    count = const_expr(x.shape[h] * x.shape[w], acc)
    return te.compute(shape, named(names, lambda *i: te.cast(x.dtype, tir.BinaryOp("div", total[i], count))),
                      "pool", "elemwise")


@compute("nn.global_avg_pool2d")
def _global_avg_pool2d_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _global_pool_compute(inputs, attrs, out_type, "nn.global_avg_pool2d")


@compute("nn.global_max_pool2d")
def _global_max_pool2d_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _global_pool_compute(inputs, attrs, out_type, "nn.global_max_pool2d")


def _conv_transpose_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type, op_name: str,
                            spatial_letters: str) -> te.Tensor:
    """Each output position gathers the input pixels that scatter onto it: `y = i * stride + t * dilation -
    pad_before` for input pixel `i` and tap `t`, so `i = (y + pad_before - t * dilation) / stride` when that
    divides exactly and lands inside the input."""
    data, weight = inputs
    nsp = len(spatial_letters)
    dl = LayoutMap.parse(str(attrs["data_layout"]), "data layout")
    kl = LayoutMap.parse(str(attrs["kernel_layout"]), "kernel layout")
    ol = LayoutMap.parse(str(attrs["out_layout"] or attrs["data_layout"]), "output layout")
    g = _transpose_geometry(attrs, op_name, nsp)
    assert isinstance(out_type, TensorType)
    out_shape = static_shape(out_type)
    acc = accumulate_dtype(out_type.dtype)
    ddims, wdims = _logical_dims(dl, data.shape), _logical_dims(kl, weight.shape)
    cg = ddims["C"] // g.groups
    og = wdims["O"]
    rc = te.reduce_axis(cg, "rc")
    rk = [te.reduce_axis(wdims[s], f"r{s.lower()}") for s in spatial_letters]
    names = ol.axis_names({"N": "n", "C": "oc", **{s: f"o{s.lower()}" for s in spatial_letters}})

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        pos = ol.logical(idx)
        oc = pos["C"]
        ic = (oc // og) * cg + rc if g.groups > 1 else rc
        src: dict[str, tir.PrimExpr] = {"N": pos["N"], "C": ic}
        conds: list[tir.PrimExpr] = []
        for s, r, st, dil, pb in zip(spatial_letters, rk, g.strides, g.dilation, g.pad_before):
            t = pos[s] + pb - r * dil
            i = tir.binary("floordiv", t, st) if st != 1 else t
            conds += [t >= 0, i < ddims[s]]
            if st != 1:
                conds.append(te.equal(tir.binary("floormod", t, st), 0))
            src[s] = i
        wpos: dict[str, tir.PrimExpr] = {"I": ic, "O": oc % og if g.groups > 1 else oc}
        wpos.update(zip(spatial_letters, rk))
        product = te.cast(acc, data[dl.index(src)]) * te.cast(acc, weight[kl.index(wpos)])
        return te.sum(te.if_then_else(te.all_of(*conds), product, const_expr(0, acc)), axis=[rc, *rk])

    if acc == out_type.dtype:
        return te.compute(out_shape, named(names, body), "conv_transpose", "conv_transpose")
    total = te.compute(out_shape, named(names, body), "acc", "conv_transpose")
    return te.compute(out_shape, named(names, lambda *i: te.cast(out_type.dtype, total[i])), "conv_transpose",
                      "elemwise")


@compute("nn.conv2d_transpose")
def _conv2d_transpose_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _conv_transpose_compute(inputs, attrs, out_type, "nn.conv2d_transpose", "HW")


@compute("nn.conv1d_transpose")
def _conv1d_transpose_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    return _conv_transpose_compute(inputs, attrs, out_type, "nn.conv1d_transpose", "W")


@compute("nn.lrn")
def _lrn_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    axis = int(attrs["axis"]) % x.ndim
    size = int(attrs["size"])
    radius = size // 2
    extent = x.shape[axis]
    r = te.reduce_axis(size, "r")
    names = axis_names(x.ndim)
    acc = "float64" if x.dtype == "float64" else "float32"

    def window(*idx: tir.PrimExpr) -> tir.PrimExpr:
        pos = idx[axis] - radius + r
        value = te.cast(acc, x[(*idx[:axis], pos, *idx[axis + 1:])])
        return te.sum(te.if_then_else(te.all_of(pos >= 0, pos < extent), value * value, const_expr(0, acc)), axis=r)

    total = te.compute(x.shape, named(names, window), "sum", "norm")
    bias, alpha, beta = float(attrs["bias"]), float(attrs["alpha"]), float(attrs["beta"])
    positive = bias > 0 and alpha >= 0  # the base is then positive: its power needs no C library pow

    def denominator(base: tir.PrimExpr) -> tir.PrimExpr:
        # base ** beta without `pow`, which LLVM computes one lane at a time through the C library. The usual
        # beta = 0.75 (AlexNet, ZFNet, Inception v1) is sqrt(base * sqrt(base)): two vector square roots, several
        # times faster than exp(beta * log(base)), which covers every other positive base.
        if beta == 0.75:
            return te.sqrt(base * te.sqrt(base))
        if beta == 0.5:
            return te.sqrt(base)
        if beta == 1.0:
            return base
        if positive:
            return te.exp(const_expr(beta, acc) * te.log(base))
        return te.power(base, const_expr(beta, acc))

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        base = const_expr(bias, acc) + const_expr(alpha / size, acc) * total[idx]
        return te.cast(x.dtype, te.cast(acc, x[idx]) / denominator(base))

    return te.compute(x.shape, named(names, body), "lrn", "norm")


@compute("nn.layer_norm")
def _layer_norm_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    x, gamma, beta = inputs
    axis = int(attrs["axis"]) % x.ndim
    acc = "float64" if x.dtype == "float64" else "float32"
    n = x.shape[axis]
    names = axis_names(x.ndim)
    rnames = [a for d, a in enumerate(names) if d != axis]
    reduced = tuple(s for d, s in enumerate(x.shape) if d != axis)
    k1, k2 = te.reduce_axis(n, "k"), te.reduce_axis(n, "k")

    def at(idx: Sequence[tir.PrimExpr], value: tir.PrimExpr) -> tuple[tir.PrimExpr, ...]:
        return (*idx[:axis], value, *idx[axis:])

    def drop(idx: Sequence[tir.PrimExpr]) -> tuple[tir.PrimExpr, ...]:
        return (*idx[:axis], *idx[axis + 1:])

    inv_n = const_expr(1.0 / n, acc)
    mean = te.compute(reduced, named(rnames, lambda *i: te.sum(te.cast(acc, x[at(i, k1)]), axis=k1)), "sum", "norm")

    def squares(*i: tir.PrimExpr) -> tir.PrimExpr:
        centred = te.cast(acc, x[at(i, k2)]) - mean[i] * inv_n
        return te.sum(centred * centred, axis=k2)

    var = te.compute(reduced, named(rnames, squares), "var", "norm")
    eps = const_expr(float(attrs["epsilon"]), acc)

    def body(*i: tir.PrimExpr) -> tir.PrimExpr:
        r = drop(i)
        out = (te.cast(acc, x[i]) - mean[r] * inv_n) * te.rsqrt(var[r] * inv_n + eps)
        if attrs["scale"]:
            out = out * te.cast(acc, gamma[i[axis]])
        if attrs["center"]:
            out = out + te.cast(acc, beta[i[axis]])
        return te.cast(x.dtype, out)

    return te.compute(x.shape, named(names, body), "layer_norm", "norm")
