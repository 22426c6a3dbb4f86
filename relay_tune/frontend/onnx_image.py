"""ONNX converters for image and index-generating operators: Resize (opsets 10 to 19), Upsample (7, 9),
GridSample (16, 20), DepthToSpace, SpaceToDepth, Range, Trilu, CumSum, CumProd, OneHot.

The converters register in the table of `relay_tune.frontend.onnx_registry`, each with the newest operator version
(`since_version`) it follows: SpaceToDepth-28's `mode`, OneHot-28's all-off rows for out-of-range indices,
Range-27's `stash_type` (float16 ranges are computed wider, in float64), GridSample-22 and DepthToSpace-28 (new
element types only). Converters receive the importer and the node, and raise `RelayTuneError`, which the importer
(`relay_tune.frontend.onnx`) reports as an `OnnxModelError` naming the node.
Inputs that only decide shapes (Resize's roi/scales/sizes, Range's start/limit/delta, OneHot's
depth) must be constants once shapes are known; the importer's constant folding makes them so in exported graphs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from relay_tune.errors import RelayTuneError, UnsupportedError
from relay_tune.frontend.onnx_importer import Importer, OnnxNode
from relay_tune.frontend.onnx_registry import converts
from relay_tune.ir.expr import Expr
from relay_tune.op.image import RESIZE_OPS

# ------------------------------------------------------------------------------------------------
# Resize and Upsample
# ------------------------------------------------------------------------------------------------

_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}
_METHODS = {"nearest": "nearest_neighbor", "linear": "linear", "bilinear": "linear", "cubic": "cubic"}


def _optional_static(imp: Importer, node: OnnxNode, index: int, what: str) -> np.ndarray | None:
    """A shape-deciding optional input: None when omitted or empty."""
    expr = node.input(index)
    if expr is None:
        return None
    value = imp.static(expr, what)
    return value if value.size else None


def _per_axis(values: np.ndarray | None, axes: Sequence[int], rank: int, fill: float, what: str) -> list[float] | None:
    """Values given for `axes` (or for every axis) spread over all `rank` axes, `fill` elsewhere."""
    if values is None:
        return None
    flat = [float(v) for v in values.reshape(-1)]
    if len(flat) != len(axes):
        raise RelayTuneError(f"{what} has {len(flat)} values for {len(axes)} axes")
    full = [fill] * rank
    for axis, value in zip(axes, flat):
        full[axis] = value
    return full


def _resize_axes(imp: Importer, node: OnnxNode, rank: int) -> list[int]:
    if "axes" not in node.attrs:
        return list(range(rank))
    axes = [int(a) + rank if int(a) < 0 else int(a) for a in node.attrs["axes"]]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        raise RelayTuneError(f"axes {list(node.attrs['axes'])} are not distinct axes of a rank-{rank} tensor")
    return axes


def _output_geometry(
    node: OnnxNode, shape: Sequence[int], axes: Sequence[int], scales: list[float] | None, sizes: np.ndarray | None
) -> tuple[list[int], list[float]]:
    """Output extents and scale factors of every axis, from `scales` or from `sizes` (with the aspect-ratio
    policy of opset 18), as the ONNX reference computes them."""
    rank = len(shape)
    if sizes is not None:
        given = [int(v) for v in sizes.reshape(-1)]
        if len(given) != len(axes):
            raise RelayTuneError(f"sizes has {len(given)} values for {len(axes)} axes")
        out = list(shape)
        for axis, extent in zip(axes, given):
            out[axis] = extent
        factors = [out[i] / shape[i] for i in range(rank)]
        policy = node.attr_str("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise RelayTuneError(f"keep_aspect_ratio_policy {policy!r} is not one of stretch, not_larger, "
                                     "not_smaller")
            pick = min if policy == "not_larger" else max
            common = pick(factors[a] for a in axes)
            factors = [common if i in axes else 1.0 for i in range(rank)]
            out = [int(common * shape[i] + 0.5) if i in axes else shape[i] for i in range(rank)]
        return out, factors
    if scales is None:
        raise RelayTuneError("one of scales and sizes must be given")
    if any(not s > 0 for s in scales):
        raise RelayTuneError(f"scales must be positive, got {scales}")
    return [int(s * d) for s, d in zip(scales, shape)], scales


def _resize_call(
    imp: Importer, x: Expr, out: Sequence[int], factors: Sequence[float], roi: Sequence[float] | None,
    **attrs: object,
) -> Expr:
    """Resize the axes of `x` whose extent, scale or region change, through `image.resizeNd` on a view of `x`
    with those axes (and the unchanged ones between them) as its spatial axes: channels first when they end the
    shape, else channels last with the trailing axes folded into C; leading axes fold into N."""
    shape = imp.static_shape(x, "the input of Resize")
    rank = len(shape)
    full_roi = list(roi) if roi is not None else [0.0] * rank + [1.0] * rank
    changed = [i for i in range(rank)
               if out[i] != shape[i] or not math.isclose(factors[i], 1.0)
               or (attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
                   and (full_roi[i], full_roi[rank + i]) != (0.0, 1.0))]
    if any(e <= 0 for e in out):
        raise RelayTuneError(f"the output shape {list(out)} has an empty axis")
    if not changed:
        return x
    first, last = min(changed), max(changed)
    spatial = list(range(first, last + 1))
    if len(spatial) > 3:
        raise UnsupportedError(f"Resize of axes {changed}: at most three consecutive axes can be resized together")
    lead, trail = math.prod(shape[:first]), math.prod(shape[last + 1:])
    channels_last = last < rank - 1
    if channels_last:
        view = [lead, *shape[first:last + 1], trail]
    else:  # the axis before the spatial ones is C and those before it fold into N (NCHW stays as it is)
        view = [math.prod(shape[:first - 1]), shape[first - 1], *shape[first:]] if first else [1, 1, *shape]
    d = len(spatial)
    layout = ("NWC", "NHWC", "NDHWC")[d - 1] if channels_last else ("NCW", "NCHW", "NCDHW")[d - 1]
    resized = imp.call(
        RESIZE_OPS[d], [imp.reshape(x, view)], size=[int(out[a]) for a in spatial], layout=layout,
        scales=[float(factors[a]) for a in spatial],
        roi=[float(full_roi[a]) for a in spatial] + [float(full_roi[rank + a]) for a in spatial], **attrs,
    )
    return imp.reshape(resized, [int(e) for e in out])


def _legacy_resize(imp: Importer, node: OnnxNode, x: Expr, scales: list[float]) -> Expr:
    """Upsample and Resize-10: asymmetric coordinates; nearest truncates when upscaling and rounds up when
    downscaling (onnxruntime's rule for these opsets)."""
    shape = imp.static_shape(x, f"the input of {node.op_type}")
    if len(scales) != len(shape):
        raise RelayTuneError(f"scales has {len(scales)} values for an input of rank {len(shape)}")
    method = _method(node)
    out, factors = _output_geometry(node, shape, list(range(len(shape))), scales, None)
    changed = [s for s in scales if s != 1.0]
    rounding = "ceil" if changed and all(s < 1.0 for s in changed) else "floor"
    if any(s < 1.0 for s in changed) and any(s > 1.0 for s in changed) and method == "nearest_neighbor":
        raise UnsupportedError(f"{node.op_type} nearest with scales {scales} both up and down")
    return _resize_call(imp, x, out, factors, None, method=method, coordinate_transformation_mode="asymmetric",
                        rounding_method=rounding)


def _method(node: OnnxNode) -> str:
    mode = node.attr_str("mode", "nearest")
    if mode not in _METHODS:
        raise RelayTuneError(f"mode {mode!r} is not one of nearest, linear, cubic")
    return _METHODS[mode]


@converts("Upsample", newest=10)
def _upsample(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    if "scales" in node.attrs:  # opset 7
        scales = [float(s) for s in node.attrs["scales"]]
    else:
        scales = [float(s) for s in imp.static(node.required(1), "scales of Upsample").reshape(-1)]
    return _legacy_resize(imp, node, x, scales)


@converts("Resize", newest=19)
def _resize(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    if imp.opset < 11:
        scales = [float(s) for s in imp.static(node.required(1), "scales of Resize").reshape(-1)]
        return _legacy_resize(imp, node, x, scales)
    shape = imp.static_shape(x, "the input of Resize")
    rank = len(shape)
    axes = _resize_axes(imp, node, rank)
    mode = node.attr_str("coordinate_transformation_mode", "half_pixel")
    roi: list[float] | None = None
    raw_roi = _optional_static(imp, node, 1, "roi of Resize") if mode == "tf_crop_and_resize" else None
    if raw_roi is not None:
        flat = [float(v) for v in raw_roi.reshape(-1)]
        if len(flat) != 2 * len(axes):
            raise RelayTuneError(f"roi has {len(flat)} values for {len(axes)} axes (two per axis)")
        starts = _per_axis(np.array(flat[:len(axes)]), axes, rank, 0.0, "roi")
        ends = _per_axis(np.array(flat[len(axes):]), axes, rank, 1.0, "roi")
        roi = [*(starts or []), *(ends or [])]
    elif mode == "tf_crop_and_resize":
        raise RelayTuneError("coordinate_transformation_mode tf_crop_and_resize needs the roi input")
    scales = _per_axis(_optional_static(imp, node, 2, "scales of Resize"), axes, rank, 1.0, "scales")
    sizes = _optional_static(imp, node, 3, "sizes of Resize")
    if scales is not None and sizes is not None:
        raise RelayTuneError("only one of scales and sizes may be given")
    out, factors = _output_geometry(node, shape, axes, scales, sizes)
    method = _method(node)
    nearest_mode = node.attr_str("nearest_mode", "round_prefer_floor")
    if nearest_mode not in _NEAREST_MODES:
        raise RelayTuneError(f"nearest_mode {nearest_mode!r} is not one of {', '.join(sorted(_NEAREST_MODES))}")
    antialias = bool(node.attrs.get("antialias", 0)) and method != "nearest_neighbor"
    return _resize_call(
        imp, x, out, factors, roi, method=method, coordinate_transformation_mode=mode,
        rounding_method=nearest_mode, cubic_alpha=node.attr_float("cubic_coeff_a", -0.75),
        cubic_exclude=int(node.attrs.get("exclude_outside", 0)),
        extrapolation_value=node.attr_float("extrapolation_value", 0.0), antialias=antialias,
    )


# ------------------------------------------------------------------------------------------------
# DepthToSpace, SpaceToDepth
# ------------------------------------------------------------------------------------------------


@converts("DepthToSpace", "SpaceToDepth", newest=28)
def _depth_space(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    if imp.rank(x) != 4:
        raise RelayTuneError(f"{node.op_type} needs a rank-4 NCHW input, got shape {imp.shape(x)}")
    mode = node.attr_str("mode", "DCR").upper()
    op_name = "nn.depth_to_space" if node.op_type == "DepthToSpace" else "nn.space_to_depth"
    return imp.call(op_name, [x], block_size=int(node.attrs["blocksize"]), mode=mode)


# ------------------------------------------------------------------------------------------------
# Range, Trilu, CumSum, CumProd, OneHot
# ------------------------------------------------------------------------------------------------


def _scalar(imp: Importer, node: OnnxNode, index: int, what: str) -> np.ndarray:
    value = imp.static(node.required(index), f"{what} of {node.op_type}")
    if value.size != 1:
        raise RelayTuneError(f"{what} must be a scalar, got shape {value.shape}")
    return value.reshape(())


@converts("Range", newest=27)
def _range(imp: Importer, node: OnnxNode) -> Expr:
    start, limit, delta = (_scalar(imp, node, i, w) for i, w in enumerate(("start", "limit", "delta")))
    dtype = imp.dtype(node.required(0))
    as_number = float if np.issubdtype(start.dtype, np.floating) else int
    if as_number(delta) == 0:
        raise RelayTuneError("delta of Range must not be 0")
    return imp.call("arange", [], start=as_number(start), stop=as_number(limit), step=as_number(delta), dtype=dtype)


@converts("Trilu", newest=14)
def _trilu(imp: Importer, node: OnnxNode) -> Expr:
    k = int(_scalar(imp, node, 1, "k")) if node.input(1) is not None else 0
    return imp.call("trilu", [node.required(0)], k=k, upper=bool(node.attrs.get("upper", 1)))


@converts("CumSum", newest=14)
@converts("CumProd", newest=26)
def _cumulative(imp: Importer, node: OnnxNode) -> Expr:
    """CumSum (11, 14) and CumProd (26): the same attributes and axis input."""
    x = node.required(0)
    axis = int(_scalar(imp, node, 1, "axis"))
    rank = imp.rank(x)
    if not -rank <= axis < rank:
        raise RelayTuneError(f"axis {axis} is out of range for a tensor of rank {rank}")
    op_name = "cumsum" if node.op_type == "CumSum" else "cumprod"
    return imp.call(op_name, [x], axis=axis % rank, exclusive=bool(node.attrs.get("exclusive", 0)),
                    reverse=bool(node.attrs.get("reverse", 0)))


@converts("OneHot", newest=28)
def _one_hot(imp: Importer, node: OnnxNode) -> Expr:
    indices = node.required(0)
    depth = int(_scalar(imp, node, 1, "depth"))
    values = node.required(2)
    if imp.shape(values) != (2,):
        raise RelayTuneError(f"values of OneHot must hold two elements [off, on], got shape {imp.shape(values)}")
    if not imp.dtype(indices).startswith(("int", "uint")):
        indices = imp.cast(indices, "int64")
    off, on = (imp.call("take", [values, imp.const(i, "int64")], axis=0) for i in (0, 1))
    return imp.call("one_hot", [indices, on, off], depth=depth, axis=int(node.attrs.get("axis", -1)))


# ------------------------------------------------------------------------------------------------
# GridSample
# ------------------------------------------------------------------------------------------------

_GRID_METHODS = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest", "bicubic": "bicubic",
                 "cubic": "bicubic"}


@converts("GridSample", newest=22)
def _grid_sample(imp: Importer, node: OnnxNode) -> Expr:
    """Opset 16 (4-D; bilinear, nearest, bicubic) and 20 (N-D; linear, nearest, cubic)."""
    x, grid = node.required(0), node.required(1)
    mode = node.attr_str("mode", "linear" if imp.opset >= 20 else "bilinear")
    if mode not in _GRID_METHODS:
        raise RelayTuneError(f"mode {mode!r} is not one of {', '.join(_GRID_METHODS)}")
    rank = imp.rank(x)
    if rank not in (4, 5):
        raise UnsupportedError(f"GridSample of a rank-{rank} input (rank 4 and 5 are supported)")
    return imp.call("image.grid_sample", [x, grid], method=_GRID_METHODS[mode],
                    layout="NCHW" if rank == 4 else "NCDHW", padding_mode=node.attr_str("padding_mode", "zeros"),
                    align_corners=bool(node.attrs.get("align_corners", 0)))
