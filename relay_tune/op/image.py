"""Image operators: `image.resize1d/2d/3d` (nearest, linear and cubic interpolation with every coordinate
transformation of ONNX Resize, antialiasing, crop-and-resize), `image.grid_sample` (nearest, bilinear, bicubic
sampling at normalised positions with zeros, border or reflection padding) and the depth/space rearrangements
`nn.depth_to_space` and `nn.space_to_depth`.

Resizing is separable: every spatial axis maps each output position to a few input taps with weights, and an
output element is the weighted sum over the product of the taps of its axes. The taps and weights of one axis
are written once (`_axis_taps`) over a small numeric interface that both the numpy reference (arrays of output
positions) and the tensor-expression compute (symbolic index expressions) implement, so the kernel computes
exactly what the reference does. The arithmetic follows the ONNX reference implementation: source coordinates
in float64, a tap window starting left of the coordinate (`ceil(x) - 1`, so the fraction lies in (0, 1]), edge
clamping, and the sum in float64 rounded once to the output dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_tune.errors import RelayTypeError, UnsupportedError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.types import ANY, AnyDim, Dim, TensorType, Type
from relay_tune.op._shape import (
    check_dtype,
    expect_arity,
    expect_tensor,
    format_shape,
    is_float_dtype,
    is_int_dtype,
)
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

Array = np.ndarray

RESIZE_METHODS = ("nearest_neighbor", "linear", "cubic")
COORDINATE_MODES = (
    "half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel", "tf_half_pixel_for_nearest",
    "tf_crop_and_resize", "half_pixel_symmetric",
)
ROUNDING_METHODS = ("round", "round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

# Spatial letters and accepted layouts per resize rank (channels first or last, as in TVM).
_RESIZE_LAYOUTS = {1: ("NCW", "NWC"), 2: ("NCHW", "NHWC"), 3: ("NCDHW", "NDHWC")}
_SPATIAL_LETTERS = {1: "W", 2: "HW", 3: "DHW"}
MAX_RESIZE_TAPS = 4096
"""The most input taps one output element of a compiled resize reads (antialiased downscaling by large factors
widens the window; beyond this the kernel would be one huge expression)."""


def _resize_attrs(rank: int) -> dict[str, Any]:
    return {
        "size": None, "roi": None, "layout": _RESIZE_LAYOUTS[rank][0], "method": "linear",
        "coordinate_transformation_mode": "half_pixel", "rounding_method": "", "cubic_alpha": -0.5,
        "cubic_exclude": 0, "extrapolation_value": 0.0, "out_dtype": "", "scales": None, "antialias": False,
    }


RESIZE_OPS = {1: "image.resize1d", 2: "image.resize2d", 3: "image.resize3d"}
for _rank, _name in RESIZE_OPS.items():
    register_op(
        _name, 1, OpPattern.INJECTIVE, _resize_attrs(_rank), f"relay.attrs.Resize{_rank}DAttrs", required=("size",),
        description=f"{_rank}-D resize; `scales` (one per spatial axis, default output/input) is the factor the "
                    "coordinate transformation divides by, as in ONNX Resize",
    )


@dataclass(frozen=True)
class AxisResize:
    """How one spatial axis is resized: its position, extents, scale factor and region of interest."""

    axis: int
    in_extent: int
    out_extent: int
    scale: float
    roi: tuple[float, float]


@dataclass(frozen=True)
class ResizeSpec:
    """A resize call's attributes, validated and resolved for one input shape."""

    axes: tuple[AxisResize, ...]
    method: str
    mode: str
    rounding: str
    cubic_alpha: float
    exclude_outside: bool
    extrapolation_value: float
    antialias: bool
    out_dtype: str


def _floats(value: Any, count: int, op_name: str, what: str) -> tuple[float, ...]:
    items = value if isinstance(value, tuple) else (value,)
    if len(items) != count or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        raise RelayTypeError(f"{what} must be {count} numbers, got {value!r}", op_name=op_name)
    return tuple(float(v) for v in items)


def _spatial_axes(op_name: str, rank: int, layout: Any) -> tuple[int, ...]:
    if layout not in _RESIZE_LAYOUTS[rank]:
        raise RelayTypeError(f"layout must be one of {', '.join(_RESIZE_LAYOUTS[rank])}, got {layout!r}",
                             op_name=op_name)
    return tuple(layout.index(letter) for letter in _SPATIAL_LETTERS[rank])


def _check_choice(value: Any, choices: Sequence[str], op_name: str, what: str) -> str:
    if value not in choices:
        raise RelayTypeError(f"{what} must be one of {', '.join(choices)}, got {value!r}", op_name=op_name)
    return str(value)


def _resize_rank(op_name: str) -> int:
    return next(r for r, n in RESIZE_OPS.items() if n == op_name)


def _resize_out_shape(op_name: str, shape: Sequence[Dim], attrs: Attrs) -> tuple[Dim, ...]:
    rank = _resize_rank(op_name)
    axes = _spatial_axes(op_name, rank, attrs["layout"])
    if len(shape) != rank + 2:
        raise RelayTypeError(f"layout {attrs['layout']} needs a rank-{rank + 2} input, got shape "
                             f"{format_shape(shape)}", op_name=op_name)
    size = attrs["size"]
    items = size if isinstance(size, tuple) else (size,)
    if len(items) != rank or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in items):
        raise RelayTypeError(f"size must be {rank} positive integers, got {size!r}", op_name=op_name)
    out = list(shape)
    for axis, extent in zip(axes, items):
        out[axis] = extent
    return tuple(out)


def resize_spec(op_name: str, shape: Sequence[Dim], attrs: Attrs) -> ResizeSpec:
    """The validated resize of an input of `shape` (spatial extents must be known for scales and coordinates)."""
    rank = _resize_rank(op_name)
    out_shape = _resize_out_shape(op_name, shape, attrs)
    spatial = _spatial_axes(op_name, rank, attrs["layout"])
    method = _check_choice(attrs["method"], RESIZE_METHODS, op_name, "method")
    mode = _check_choice(attrs["coordinate_transformation_mode"], COORDINATE_MODES, op_name,
                         "coordinate_transformation_mode")
    rounding = attrs["rounding_method"] or (
        "round" if mode in ("align_corners", "tf_half_pixel_for_nearest") else "floor")
    rounding = _check_choice(rounding, ROUNDING_METHODS, op_name, "rounding_method")
    antialias = bool(attrs["antialias"])
    if antialias and method == "nearest_neighbor":
        raise RelayTypeError("antialias applies to linear and cubic resizing, not nearest_neighbor", op_name=op_name)
    roi = (0.0,) * rank + (1.0,) * rank if attrs["roi"] is None else _floats(attrs["roi"], 2 * rank, op_name, "roi")
    scales = None if attrs["scales"] is None else _floats(attrs["scales"], rank, op_name, "scales")
    axes = []
    for i, axis in enumerate(spatial):
        extent, out_extent = shape[axis], out_shape[axis]
        if isinstance(extent, AnyDim) or isinstance(out_extent, AnyDim):
            raise RelayTypeError(f"spatial axis {axis} of {format_shape(shape)} must have a known extent",
                                 op_name=op_name)
        if extent <= 0:
            raise RelayTypeError(f"cannot resize the empty axis {axis} of {format_shape(shape)}", op_name=op_name)
        scale = out_extent / extent if scales is None else scales[i]
        if not scale > 0 or not math.isfinite(scale):
            raise RelayTypeError(f"scales must be positive, got {scales}", op_name=op_name)
        axes.append(AxisResize(axis, int(extent), int(out_extent), scale, (roi[i], roi[rank + i])))
    out_dtype = check_dtype(attrs["out_dtype"], op_name, "out_dtype") if attrs["out_dtype"] else ""
    return ResizeSpec(tuple(axes), method, mode, rounding, float(attrs["cubic_alpha"]), bool(attrs["cubic_exclude"]),
                      float(attrs["extrapolation_value"]), antialias, out_dtype)


def _make_resize_relation(op_name: str) -> Callable[[Sequence[Type], Attrs], Type]:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
        expect_arity(arg_types, 1, op_name)
        x = expect_tensor(arg_types[0], op_name, "data")
        out_shape = _resize_out_shape(op_name, x.shape, attrs)
        if all(isinstance(shape_dim, int) for shape_dim in x.shape):
            spec = resize_spec(op_name, x.shape, attrs)
        else:  # validate the attributes; coordinates are checked once the shape is known
            spec = resize_spec(op_name, tuple(1 if isinstance(d, AnyDim) else d for d in x.shape), attrs)
        dtype = spec.out_dtype or x.dtype
        if not (is_float_dtype(x.dtype) or is_int_dtype(x.dtype)):
            raise RelayTypeError(f"data must be a float or integer tensor, got {x.dtype}", op_name=op_name)
        return TensorType(out_shape, dtype)

    return relation


for _name in RESIZE_OPS.values():
    type_relation(_name)(_make_resize_relation(_name))


# ------------------------------------------------------------------------------------------------
# One axis: source coordinates, taps and weights, over numpy arrays or tensor expressions
# ------------------------------------------------------------------------------------------------


class _NumpyMath:
    """The numeric interface over numpy float64 arrays of output positions."""

    @staticmethod
    def const(like: Array, value: float) -> Array:
        return np.full(np.shape(like), float(value))

    floor = staticmethod(np.floor)
    ceil = staticmethod(np.ceil)
    fabs = staticmethod(np.abs)

    @staticmethod
    def where(cond: Array, a: Any, b: Any) -> Array:
        return np.where(cond, a, b)

    @staticmethod
    def either(a: Array, b: Array) -> Array:
        return a | b

    @staticmethod
    def both(a: Array, b: Array) -> Array:
        return a & b

    @staticmethod
    def clamp_index(x: Array, extent: int) -> Array:
        return np.minimum(np.where(x > 0, x, 0.0), extent - 1).astype(np.int64)  # NaN -> 0, as the kernel

    @staticmethod
    def to_float(cond: Array) -> Array:
        return cond.astype(np.float64)

    @staticmethod
    def is_zero(x: Array) -> Array:
        return x == 0.0

    rint = staticmethod(np.rint)
    trunc = staticmethod(np.trunc)

    @staticmethod
    def minimum(a: Array, b: float) -> Array:
        return np.minimum(a, b)

    @staticmethod
    def maximum(a: Array, b: float) -> Array:
        return np.maximum(a, b)


class _TeMath:
    """The same interface over float64 tensor expressions (`te` is imported below, with the kernel layer)."""

    @staticmethod
    def const(like: Any, value: float) -> Any:
        return tir.FloatImm(float(value), "float64")

    floor = staticmethod(lambda x: te.floor(x))
    ceil = staticmethod(lambda x: te.ceil(x))
    fabs = staticmethod(lambda x: te.fabs(x))

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        return te.if_then_else(cond, tir.as_expr(a, "float64"), tir.as_expr(b, "float64"))

    @staticmethod
    def either(a: Any, b: Any) -> Any:
        return te.any_of(a, b)

    @staticmethod
    def both(a: Any, b: Any) -> Any:
        return te.all_of(a, b)

    @staticmethod
    def clamp_index(x: Any, extent: int) -> Any:
        # clamped as a float: converting a float beyond the integer range (a huge grid position) is undefined
        inside = te.minimum(te.maximum(x, tir.FloatImm(0.0, "float64")), tir.FloatImm(extent - 1.0, "float64"))
        return te.cast(tir.INDEX_DTYPE, inside)

    @staticmethod
    def to_float(cond: Any) -> Any:
        return te.if_then_else(cond, tir.FloatImm(1.0, "float64"), tir.FloatImm(0.0, "float64"))

    @staticmethod
    def is_zero(x: Any) -> Any:
        return te.equal(x, 0.0)

    rint = staticmethod(lambda x: te.round(x))  # halves to even, as numpy's rint
    trunc = staticmethod(lambda x: te.if_then_else(x < 0.0, te.ceil(x), te.floor(x)))

    @staticmethod
    def minimum(a: Any, b: float) -> Any:
        return te.minimum(a, tir.FloatImm(float(b), "float64"))

    @staticmethod
    def maximum(a: Any, b: float) -> Any:
        return te.maximum(a, tir.FloatImm(float(b), "float64"))


def _source_coordinate(m: Any, y: Any, ax: AxisResize, mode: str) -> Any:
    """The input coordinate output position `y` samples (ONNX Resize's coordinate transformations)."""
    in_w, scale = ax.in_extent, ax.scale
    out_w = scale * in_w  # the reference uses the unrounded output length
    if mode == "align_corners":
        return m.const(y, 0.0) if out_w == 1 else y * float(in_w - 1) / (out_w - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nearest":
        return (y + 0.5) / scale
    if mode == "tf_crop_and_resize":
        lo, hi = ax.roi
        if out_w == 1:
            x = m.const(y, (hi - lo) * (in_w - 1) / 2)
        else:
            x = y * (hi - lo) * float(in_w - 1) / (out_w - 1)
        return x + lo * (in_w - 1)
    if mode == "pytorch_half_pixel":
        return m.const(y, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_w / 2 * (1 - ax.out_extent / out_w)
        return (y + 0.5) / scale - 0.5 + offset
    return (y + 0.5) / scale - 0.5


def _nearest(m: Any, x: Any, rounding: str) -> Any:
    if rounding == "floor":
        return m.floor(x)
    if rounding == "ceil":
        return m.ceil(x)
    if rounding == "round_prefer_ceil":
        return m.floor(x + 0.5)
    if rounding == "round_prefer_floor":
        return m.ceil(x - 0.5)
    return m.where(x < 0.0, m.ceil(x - 0.5), m.floor(x + 0.5))  # round: halves away from zero


def _cubic(m: Any, t: Any, a: float) -> Any:
    """The cubic convolution kernel at distance `t` >= 0 (Keys, coefficient `a`)."""
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return m.where(t <= 1.0, near, m.where(t < 2.0, far, m.const(t, 0.0)))


def _kernel_offsets(spec: ResizeSpec, scale: float) -> range:
    """Tap offsets relative to `ceil(x) - 1` for linear/cubic (antialiasing widens them when downscaling)."""
    s = min(scale, 1.0)
    if spec.method == "linear":
        start = math.floor(-1 / s) + 1 if spec.antialias else 0
    else:
        start = math.floor(-2 / s) + 1 if spec.antialias else -1
    return range(start, 2 - start)


@dataclass
class AxisTaps:
    """Taps of one axis: clamped input indices with weights (None: nearest, a single unweighted tap), the
    weight sum to divide by (None: the weights already sum to 1) and the extrapolated positions (or None)."""

    taps: list[tuple[Any, Any]]
    norm: Any
    outside: Any


def _integer_factor(ax: AxisResize, spec: ResizeSpec) -> int | None:
    """k when nearest upscaling by the integer k maps output position y to input y // k exactly.

    That holds for asymmetric coordinates rounded down (y / k = y // k + r / k with r / k in [0, 1)) and for the
    half-pixel family rounded to nearest ((y + 0.5) / k - 0.5 = y // k + f with f strictly inside (-0.5, 0.5),
    never a tie). The integer form replaces a float64 division, rounding and clamp per element.
    """
    k = ax.scale
    if spec.method != "nearest_neighbor" or k != int(k) or k < 1 or ax.out_extent != int(k) * ax.in_extent:
        return None
    half_pixel = spec.mode in ("half_pixel", "half_pixel_symmetric") or (
        spec.mode == "pytorch_half_pixel" and ax.out_extent > 1)
    if (spec.mode == "asymmetric" and spec.rounding == "floor") or (
            half_pixel and spec.rounding in ("round", "round_prefer_floor", "round_prefer_ceil")):
        return int(k)
    return None


def _axis_taps(m: Any, y: Any, ax: AxisResize, spec: ResizeSpec, position: Any = None) -> AxisTaps:
    """Taps of the output positions whose float64 value is `y`. Given their integer form `position` (the kernel
    does), nearest upscaling by an integer factor uses integer arithmetic; the reference keeps the float
    formula, so the kernel tests check the two agree."""
    factor = None if position is None else _integer_factor(ax, spec)
    if factor is not None:
        return AxisTaps([(position // factor if factor > 1 else position, None)], None, None)
    x = _source_coordinate(m, y, ax, spec.mode)
    outside = m.either(x < 0.0, x > float(ax.in_extent - 1)) if spec.mode == "tf_crop_and_resize" else None
    if spec.method == "nearest_neighbor":
        return AxisTaps([(m.clamp_index(_nearest(m, x, spec.rounding), ax.in_extent), None)], None, outside)
    left = m.ceil(x) - 1.0  # the fraction `x - left` lies in (0, 1]: the tap left of an integer x comes first
    ratio = x - left
    s = min(ax.scale, 1.0)
    taps: list[tuple[Any, Any]] = []
    for offset in _kernel_offsets(spec, ax.scale):
        if spec.method == "linear":
            if spec.antialias:
                weight = m.fabs((offset - ratio) * s)
                weight = m.where(weight < 1.0, 1.0 - weight, m.const(y, 0.0))
            else:
                weight = ratio if offset == 1 else 1.0 - ratio
        elif spec.antialias:
            weight = _cubic(m, m.fabs((offset - ratio) * s), spec.cubic_alpha)
        else:
            weight = _cubic(m, ratio - offset if offset <= 0 else offset - ratio, spec.cubic_alpha)
        position = left + float(offset)
        if spec.exclude_outside:
            inside = m.both(position >= 0.0, position < float(ax.in_extent))
            weight = weight * m.to_float(inside)
        taps.append((m.clamp_index(position, ax.in_extent), weight))
    norm = None
    if spec.antialias or spec.exclude_outside:
        norm = taps[0][1]
        for _, w in taps[1:]:
            norm = norm + w
        norm = m.where(m.is_zero(norm), 1.0, norm)  # every tap outside: the result is 0, as in the reference
    return AxisTaps(taps, norm, outside)


def _round_to(values: Array, dtype: str) -> Array:
    """float64 results in the output dtype: integers are rounded (halves to even) and saturated."""
    if is_int_dtype(dtype):
        info = np.iinfo(dtype)
        return np.clip(np.round(values), info.min, info.max).astype(dtype)
    return values.astype(dtype)


def _resize_reference(op_name: str) -> Callable[[Sequence[Array], Attrs], Array]:
    def ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
        x = np.asarray(inputs[0])
        spec = resize_spec(op_name, x.shape, attrs)
        out_dtype = spec.out_dtype or x.dtype.name
        result = x if spec.method == "nearest_neighbor" else x.astype(np.float64)
        outside_any: Array | None = None
        for ax in spec.axes:
            axis = _axis_taps(_NumpyMath, np.arange(ax.out_extent, dtype=np.float64), ax, spec)
            bshape = [1] * x.ndim
            bshape[ax.axis] = ax.out_extent
            if spec.method == "nearest_neighbor":
                result = np.take(result, axis.taps[0][0], axis=ax.axis)
            else:
                total = sum(np.take(result, i, axis=ax.axis) * w.reshape(bshape) for i, w in axis.taps)
                result = total if axis.norm is None else total / axis.norm.reshape(bshape)
            if axis.outside is not None:
                mask = axis.outside.reshape(bshape)
                outside_any = mask if outside_any is None else outside_any | mask
        if outside_any is not None:
            result = np.where(outside_any, spec.extrapolation_value, result)
        if spec.method == "nearest_neighbor" and outside_any is None:
            return result.astype(out_dtype)
        return _round_to(np.asarray(result, dtype=np.float64), out_dtype)

    return ref


for _name in RESIZE_OPS.values():
    reference(_name)(_resize_reference(_name))


# ------------------------------------------------------------------------------------------------
# tensor-expression computes (kernels)
# ------------------------------------------------------------------------------------------------
# Imported here, not at the top: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import INJECTIVE, axis_names, named, static_shape  # noqa: E402
from relay_tune.op.registry import compute  # noqa: E402


def _injective(name: str, shape: Sequence[int], body: Callable[..., Any]) -> te.Tensor:
    return te.compute(tuple(shape), named(axis_names(len(shape)), body), name, INJECTIVE)


def _round_expr(value: Any, dtype: str) -> Any:
    if is_int_dtype(dtype):
        info = np.iinfo(dtype)
        value = te.minimum(te.maximum(te.round(value), float(info.min)), float(info.max))
    return te.cast(dtype, value)


def _resize_compute(op_name: str) -> Callable[..., te.Tensor]:
    def impl(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
        (x,) = inputs
        spec = resize_spec(op_name, x.shape, attrs)
        shape = static_shape(out_type)
        out_dtype = spec.out_dtype or x.dtype
        taps_count = 1
        for ax in spec.axes:
            taps_count *= 1 if spec.method == "nearest_neighbor" else len(_kernel_offsets(spec, ax.scale))
        if taps_count > MAX_RESIZE_TAPS:
            raise UnsupportedError(f"{op_name}: one output element would read {taps_count} input taps "
                                   f"(at most {MAX_RESIZE_TAPS} compile); the downscaling is too strong")

        def body(*idx: Any) -> Any:
            per_axis = [_axis_taps(_TeMath, te.cast("float64", idx[ax.axis]), ax, spec, idx[ax.axis])
                        for ax in spec.axes]
            combos: list[tuple[dict[int, Any], Any]] = [({}, None)]
            for ax, axis in zip(spec.axes, per_axis):
                combos = [({**where, ax.axis: i}, w if weight is None else (weight if w is None else weight * w))
                          for where, weight in combos for i, w in axis.taps]

            def read(where: dict[int, Any]) -> Any:
                return x[tuple(where.get(d, i) for d, i in enumerate(idx))]

            if spec.method == "nearest_neighbor":
                value = read(combos[0][0])
                if x.dtype != out_dtype:
                    value = te.cast(out_dtype, value)
            else:
                total = None
                for where, weight in combos:
                    term = te.cast("float64", read(where)) * weight
                    total = term if total is None else total + term
                for axis in per_axis:
                    if axis.norm is not None:
                        total = total / axis.norm
                value = _round_expr(total, out_dtype)
            outside = [a.outside for a in per_axis if a.outside is not None]
            if outside:
                fill = _round_expr(tir.FloatImm(spec.extrapolation_value, "float64"), out_dtype)
                value = te.if_then_else(te.any_of(*outside), fill, value)
            return value

        return _injective(op_name.split(".")[-1], shape, body)

    return impl


for _name in RESIZE_OPS.values():
    compute(_name)(_resize_compute(_name))


# ------------------------------------------------------------------------------------------------
# nn.depth_to_space, nn.space_to_depth
# ------------------------------------------------------------------------------------------------

DEPTH_SPACE_MODES = ("DCR", "CRD")
_DEPTH_SPACE_ATTRS = {"block_size": None, "layout": "NCHW", "mode": "DCR"}
register_op("nn.depth_to_space", 1, OpPattern.INJECTIVE, _DEPTH_SPACE_ATTRS, "relay.attrs.SubPixelAttrs",
            required=("block_size",), description="moves blocks of channels into space; DCR or CRD channel order")
register_op("nn.space_to_depth", 1, OpPattern.INJECTIVE, _DEPTH_SPACE_ATTRS, "relay.attrs.SubPixelAttrs",
            required=("block_size",), description="moves blocks of space into channels; DCR or CRD channel order")


@dataclass(frozen=True)
class SubPixel:
    """A depth/space rearrangement resolved for one input: axis positions, block size, mode."""

    c: int
    h: int
    w: int
    block: int
    mode: str


def _sub_pixel(op_name: str, x: TensorType, attrs: Attrs) -> tuple[SubPixel, tuple[Dim, ...]]:
    layout = attrs["layout"]
    if layout not in ("NCHW", "NHWC"):
        raise RelayTypeError(f"layout must be NCHW or NHWC, got {layout!r}", op_name=op_name)
    block = attrs["block_size"]
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise RelayTypeError(f"block_size must be a positive integer, got {block!r}", op_name=op_name)
    mode = _check_choice(attrs["mode"], DEPTH_SPACE_MODES, op_name, "mode")
    if x.ndim != 4:
        raise RelayTypeError(f"expects a rank-4 {layout} input, got shape {format_shape(x.shape)}", op_name=op_name)
    sp = SubPixel(layout.index("C"), layout.index("H"), layout.index("W"), block, mode)
    out = list(x.shape)
    c, h, w = x.shape[sp.c], x.shape[sp.h], x.shape[sp.w]
    if op_name == "nn.depth_to_space":
        if isinstance(c, int) and c % (block * block):
            raise RelayTypeError(f"{c} channels do not split into blocks of {block}x{block}", op_name=op_name)
        out[sp.c] = ANY if isinstance(c, AnyDim) else c // (block * block)
        out[sp.h] = ANY if isinstance(h, AnyDim) else h * block
        out[sp.w] = ANY if isinstance(w, AnyDim) else w * block
    else:
        for axis, extent in ((sp.h, h), (sp.w, w)):
            if isinstance(extent, int) and extent % block:
                raise RelayTypeError(f"axis {axis} of {format_shape(x.shape)} is not a multiple of the block size "
                                     f"{block}", op_name=op_name)
        out[sp.c] = ANY if isinstance(c, AnyDim) else c * block * block
        out[sp.h] = ANY if isinstance(h, AnyDim) else h // block
        out[sp.w] = ANY if isinstance(w, AnyDim) else w // block
    return sp, tuple(out)


def _sub_pixel_relation(op_name: str) -> Callable[[Sequence[Type], Attrs], Type]:
    def relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
        expect_arity(arg_types, 1, op_name)
        x = expect_tensor(arg_types[0], op_name, "data")
        return TensorType(_sub_pixel(op_name, x, attrs)[1], x.dtype)

    return relation


def _depth_channel(sp: SubPixel, channel: Any, bh: Any, bw: Any, channels: int) -> Any:
    """The channel of the deep tensor holding channel `channel` of the shallow one at block offset (bh, bw)."""
    b = sp.block
    if sp.mode == "DCR":
        return (bh * b + bw) * channels + channel
    return channel * (b * b) + bh * b + bw


def _depth_to_space_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    sp, out_shape = _sub_pixel("nn.depth_to_space", TensorType(x.shape, x.dtype.name), attrs)
    out = np.empty(tuple(int(d) for d in out_shape), x.dtype)
    b, channels = sp.block, out_shape[sp.c]
    for bh in range(b):
        for bw in range(b):
            for c in range(int(channels)):
                src = np.take(x, _depth_channel(sp, c, bh, bw, int(channels)), axis=sp.c)
                dst = [slice(None)] * 4
                dst[sp.c], dst[sp.h], dst[sp.w] = c, slice(bh, None, b), slice(bw, None, b)
                out[tuple(dst)] = src
    return out


def _space_to_depth_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    sp, out_shape = _sub_pixel("nn.space_to_depth", TensorType(x.shape, x.dtype.name), attrs)
    out = np.empty(tuple(int(d) for d in out_shape), x.dtype)
    b, channels = sp.block, x.shape[sp.c]
    for bh in range(b):
        for bw in range(b):
            for c in range(channels):
                src = [slice(None)] * 4
                src[sp.c], src[sp.h], src[sp.w] = c, slice(bh, None, b), slice(bw, None, b)
                dst = [slice(None)] * 4
                dst[sp.c] = _depth_channel(sp, c, bh, bw, channels)
                out[tuple(dst)] = x[tuple(src)]
    return out


type_relation("nn.depth_to_space")(_sub_pixel_relation("nn.depth_to_space"))
type_relation("nn.space_to_depth")(_sub_pixel_relation("nn.space_to_depth"))
reference("nn.depth_to_space")(_depth_to_space_ref)
reference("nn.space_to_depth")(_space_to_depth_ref)


@compute("nn.depth_to_space")
def _depth_to_space_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    sp, _ = _sub_pixel("nn.depth_to_space", TensorType(x.shape, x.dtype), attrs)
    shape = static_shape(out_type)
    b = sp.block

    def body(*idx: Any) -> Any:
        src = list(idx)
        src[sp.h], src[sp.w] = idx[sp.h] // b, idx[sp.w] // b
        src[sp.c] = _depth_channel(sp, idx[sp.c], idx[sp.h] % b, idx[sp.w] % b, shape[sp.c])
        return x[tuple(src)]

    return _injective("depth_to_space", shape, body)


@compute("nn.space_to_depth")
def _space_to_depth_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    sp, _ = _sub_pixel("nn.space_to_depth", TensorType(x.shape, x.dtype), attrs)
    shape = static_shape(out_type)
    b, channels = sp.block, x.shape[sp.c]

    def body(*idx: Any) -> Any:
        oc = idx[sp.c]
        if sp.mode == "DCR":
            block, channel = oc // channels, oc % channels
        else:
            block, channel = oc % (b * b), oc // (b * b)
        src = list(idx)
        src[sp.c] = channel
        src[sp.h] = idx[sp.h] * b + block // b
        src[sp.w] = idx[sp.w] * b + block % b
        return x[tuple(src)]

    return _injective("space_to_depth", shape, body)


# ------------------------------------------------------------------------------------------------
# image.grid_sample
# ------------------------------------------------------------------------------------------------

GRID_METHODS = ("nearest", "bilinear", "bicubic")
PADDING_MODES = ("zeros", "border", "reflection")
_GRID_LAYOUTS = {4: "NCHW", 5: "NCDHW"}
register_op(
    "image.grid_sample", 2, OpPattern.INJECTIVE,
    {"method": "bilinear", "layout": "NCHW", "padding_mode": "zeros", "align_corners": True},
    "relay.attrs.GridSampleAttrs",
    description="samples data (N, C, *in) at the normalised positions grid (N, *out, k) (ONNX's grid layout: the "
                "last axis holds x, y[, z], innermost spatial axis first) -> (N, C, *out)",
)


def _grid_sample_type(arg_types: Sequence[Type], attrs: Attrs) -> TensorType:
    op = "image.grid_sample"
    expect_arity(arg_types, 2, op)
    data, grid = expect_tensor(arg_types[0], op, "data"), expect_tensor(arg_types[1], op, "grid")
    _check_choice(attrs["method"], GRID_METHODS, op, "method")
    _check_choice(attrs["padding_mode"], PADDING_MODES, op, "padding_mode")
    layout = _GRID_LAYOUTS.get(data.ndim)
    if layout is None or attrs["layout"] != layout:
        raise RelayTypeError(f"data of shape {format_shape(data.shape)} needs layout NCHW (rank 4) or NCDHW "
                             f"(rank 5), got layout {attrs['layout']!r}", op_name=op)
    spatial = data.ndim - 2
    if grid.ndim != data.ndim or grid.shape[-1] not in (spatial, ANY):
        raise RelayTypeError(f"grid must have shape (N, *out, {spatial}) for data {format_shape(data.shape)}, got "
                             f"{format_shape(grid.shape)}", op_name=op)
    if not is_float_dtype(grid.dtype):
        raise RelayTypeError(f"grid must be a float tensor, got {grid.dtype}", op_name=op)
    if isinstance(data.shape[0], int) and isinstance(grid.shape[0], int) and data.shape[0] != grid.shape[0]:
        raise RelayTypeError(f"data {format_shape(data.shape)} and grid {format_shape(grid.shape)} differ in batch",
                             op_name=op)
    return TensorType((data.shape[0], data.shape[1], *grid.shape[1:-1]), data.dtype)


type_relation("image.grid_sample")(_grid_sample_type)


def _reflect(m: Any, x: Any, lo: float, hi: float) -> Any:
    """`x` reflected off the borders [lo, hi] until it lies between them."""
    span = hi - lo
    if span <= 0:
        return m.const(x, lo)
    below = x < lo
    dx = m.where(below, lo - x, x - hi)
    folds = m.floor(dx / span)
    rest = dx - folds * span
    even = m.is_zero(folds - 2.0 * m.floor(folds / 2.0))
    inner = m.where(even, lo + rest, hi - rest)
    outer = m.where(even, hi - rest, lo + rest)
    return m.where(below, inner, m.where(x > hi, outer, x))


def _grid_axis_taps(m: Any, g: Any, extent: int, attrs: Attrs) -> list[tuple[Any, Any, Any]]:
    """(clamped index, weight or None, validity or None) taps of one spatial axis at the denormalised position
    `g` (float64). Nearest and bilinear sampling pad the position (clamp or reflect it into the image), then
    each tap; bicubic pads each tap only, as PyTorch, whose models these are, and onnxruntime do."""
    align, padding, method = bool(attrs["align_corners"]), attrs["padding_mode"], attrs["method"]
    lo, hi = (0.0, extent - 1.0) if align else (-0.5, extent - 0.5)
    x = m.rint(g) if method == "nearest" else g
    if method != "bicubic":  # bicubic pads each tap, not the position (onnx's reference clamps the position)
        if padding == "border":
            x = m.where(m.either(x < lo, x > hi), m.minimum(m.maximum(x, 0.0), float(extent - 1)), x)
        elif padding == "reflection":
            x = _reflect(m, x, lo, hi)

    def tap(position: Any, weight: Any) -> tuple[Any, Any, Any]:
        if padding == "reflection":
            position = m.trunc(_reflect(m, position, lo, hi))
        valid = m.both(position >= 0.0, position < float(extent)) if padding == "zeros" else None
        return m.clamp_index(position, extent), weight, valid

    if method == "nearest":
        return [tap(m.trunc(x), None)]
    left = m.floor(x)
    t = x - left
    if method == "bilinear":
        return [tap(left, 1.0 - t), tap(left + 1.0, t)]
    distances = (t + 1.0, t, 1.0 - t, 2.0 - t)
    return [tap(left + float(k - 1), _cubic(m, d, -0.75)) for k, d in enumerate(distances)]


def _denormalized(g: Any, extent: int, align: bool) -> Any:
    return (g + 1.0) / 2.0 * float(extent - 1) if align else ((g + 1.0) * float(extent) - 1.0) / 2.0


@reference("image.grid_sample")
def _grid_sample_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    data, grid = np.asarray(inputs[0]), np.asarray(inputs[1])
    out_type = _grid_sample_type([TensorType(data.shape, data.dtype.name), TensorType(grid.shape, grid.dtype.name)],
                                 attrs)
    spatial = data.ndim - 2
    per_axis = []
    for d in range(spatial):  # grid's last axis lists x (innermost spatial axis) first
        g = _denormalized(grid[..., spatial - 1 - d], data.shape[2 + d], bool(attrs["align_corners"]))
        per_axis.append(_grid_axis_taps(_NumpyMath, np.asarray(g).astype(np.float64), data.shape[2 + d], attrs))
    batch = np.arange(data.shape[0]).reshape((-1,) + (1,) * spatial)
    total = np.zeros((*grid.shape[:-1], data.shape[1]), np.float64)
    combos: list[tuple[list[Array], Array, Array]] = [([], np.ones(grid.shape[:-1]), np.ones(grid.shape[:-1], bool))]
    for taps in per_axis:
        combos = [([*idx, i], weight * (1.0 if w is None else w), ok & (True if v is None else v))
                  for idx, weight, ok in combos for i, w, v in taps]
    for idx, weight, ok in combos:
        picked = np.moveaxis(data, 1, -1)[(batch, *idx)].astype(np.float64)  # (N, *out, C)
        total += np.where(ok[..., None], picked * weight[..., None], 0.0)
    result = np.moveaxis(total, -1, 1)
    if is_int_dtype(out_type.dtype):
        return _round_to(result, out_type.dtype)
    return result.astype(out_type.dtype)


@compute("image.grid_sample")
def _grid_sample_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    data, grid = inputs
    spatial = data.ndim - 2
    shape = static_shape(out_type)
    align = bool(attrs["align_corners"])

    def body(*idx: Any) -> Any:
        n, c, out = idx[0], idx[1], idx[2:]
        per_axis = []
        for d in range(spatial):
            g = _denormalized(grid[(n, *out, spatial - 1 - d)], data.shape[2 + d], align)
            per_axis.append(_grid_axis_taps(_TeMath, te.cast("float64", g), data.shape[2 + d], attrs))
        combos: list[tuple[list[Any], Any, list[Any]]] = [([], None, [])]
        for taps in per_axis:
            combos = [([*where, i], weight if w is None else (w if weight is None else weight * w),
                       [*ok, *([] if v is None else [v])])
                      for where, weight, ok in combos for i, w, v in taps]
        total = None
        for where, weight, ok in combos:
            value = te.cast("float64", data[(n, c, *where)])
            term = value if weight is None else value * weight
            if ok:
                term = te.if_then_else(te.all_of(*ok), term, tir.FloatImm(0.0, "float64"))
            total = term if total is None else total + term
        return _round_expr(total, data.dtype)

    return _injective("grid_sample", shape, body)
