"""Convolutions over one row with a long stride (an STFT written as a convolution), rewritten so that neighbouring
vector lanes read neighbouring inputs: StridedRowConvAsFrames (frames gathered once, then one matrix product) where
a frame overlaps few strides, StridedRowConvAsPhases (a stride-1 convolution over the row's phases) elsewhere.

StridedRowConvAsFrames: with `Q = ceil(K / S)` and `out_w` output columns, the frames
`f[n*out_w + j, c*K + k] = x[n, c, S*j + k]` are `Q` shifted slices of the row cut into pieces of `S` samples,
concatenated (the input copied at most `Q` times), and the convolution is `dense(f, w.reshape(O, C*K))`, then
transposed back to NCHW (fused into the consumers). Unlike the phases it multiplies no zero taps (512 taps every 160
samples: the phases compute 640) and the product runs in the dense family, which blocks both operands. Leading and
trailing taps whose constant weights are zero in every channel are left out of the frames (openwakeword's STFT
windows 400 samples in 512 taps, the first of them zero: 399 products per output instead of 512); the products
dropped are `0 * x`, which differ from zero only where `x` is an infinity or NaN. It takes the convolutions
`rewritable` accepts with `Q <= MAX_FRAME_OVERLAP`.

StridedRowConvAsPhases:
A one-row convolution `y[o, j] = sum_{c, k} w[o, c, k] * x[c, S*j + k]` with stride `S` (an STFT written as a
convolution: 512 taps every 160 samples, one input channel) is, with `k = S*q + r` and the row cut into frames of
`S` samples (`x'[c*S + r, t] = x[c, S*t + r]`, `w'[o, c*S + r, q] = w[o, c, S*q + r]`, taps past `K` zero),

    y[o, j] = sum_{c, r, q} w'[o, c*S + r, q] * x'[c*S + r, j + q]

a stride-1 convolution of `C*S` channels with `ceil(K / S)` taps. The convolution families vectorize output
columns: at stride `S` neighbouring lanes read inputs `S` elements apart, so every load is a gather (openwakeword's
mel spectrogram: 2.4 of its 2.5 ms); after the rewrite they read neighbours. The frames cost one transpose of the
input, the weight is rearranged once at build time (FoldConstant), and the zero taps add at most `S - 1` of every
`K + S - 1` products. Only plain NCHW / OIHW convolutions over one row (height 1, kernel height 1), with one group,
no dilation, static shapes and a stride of at least `MIN_STRIDE` are rewritten.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, IRModule, Tuple
from relay_tune.passes.base import Pass, PassConfig, call_op, register_pass, rewrite_functions, tensor_type_of
from relay_tune.passes.conv_geometry import conv2d_padding, int_pair, plain_conv2d_types

MIN_STRIDE = 8
"""Shorter strides keep the convolution: the code generator reads lanes up to 4 elements apart as one wide load and
a shuffle, and at 8 a gather of 8 lanes costs about what the frames' transpose and zero taps do."""

MAX_FRAME_OVERLAP = 4
"""Most strides one frame spans for StridedRowConvAsFrames (the frames hold the input this many times over); longer
frames go to StridedRowConvAsPhases, whose zero taps are then a small share of the products."""


def rewritable(call: Call) -> bool:
    """Whether `call` (an `nn.conv2d`) is a plain one-row convolution with a stride of at least `MIN_STRIDE` (see
    the module docstring)."""
    types = plain_conv2d_types(call)
    if types is None:
        return False
    data, weight, _ = types
    attrs = call.attrs
    top, _, bottom, _ = conv2d_padding(attrs["padding"])
    return (int(attrs["groups"]) == 1  # type: ignore[call-overload]
            and data.shape[2] == 1 and weight.shape[2] == 1 and top == bottom == 0
            and int_pair(attrs["dilation"]) == (1, 1) and int_pair(attrs["strides"])[1] >= MIN_STRIDE
            and weight.shape[3] > 1 and np.issubdtype(np.dtype(data.dtype), np.floating))


def as_phases(call: Call, data: Expr, weight: Expr) -> Expr:
    """The stride-1 convolution over phases equal to `call` (see the module docstring), on its rewritten args."""
    n, c, _, width = tensor_type_of(call.args[0]).shape  # type: ignore[union-attr]
    o, _, _, taps = tensor_type_of(call.args[1]).shape  # type: ignore[union-attr]
    out_width = tensor_type_of(call).shape[3]  # type: ignore[union-attr]
    dtype = tensor_type_of(call.args[0]).dtype  # type: ignore[union-attr]
    stride = int_pair(call.attrs["strides"])[1]
    _, left, _, right = conv2d_padding(call.attrs["padding"])
    frames = -(-(left + width + right) // stride)
    phases_per_tap = -(-taps // stride)  # q: taps of the new convolution
    zero = Constant(np.asarray(0, dtype=dtype))
    x = call_op("nn.pad", data, zero, pad_width=[[0, 0], [0, 0], [0, 0], [left, frames * stride - width - left]])
    x = call_op("reshape", x, newshape=[n, c, frames, stride])
    x = call_op("transpose", x, axes=[0, 1, 3, 2])  # [n, c, r, t]
    x = call_op("reshape", x, newshape=[n, c * stride, 1, frames])
    w = _phase_weight(weight, zero, o, c, taps, stride, phases_per_tap)
    conv = call_op("nn.conv2d", x, w, channels=o, kernel_size=[1, phases_per_tap],
                   out_dtype=str(call.attrs["out_dtype"] or ""))
    if frames - phases_per_tap + 1 == out_width:
        return conv
    return call_op("strided_slice", conv, begin=[0, 0, 0, 0], end=[n, o, 1, out_width])


def used_taps(weight: Expr, taps: int) -> tuple[int, int]:
    """(first, end) of the `taps` taps of a one-row OIHW `weight` that can be non-zero: for a constant weight the
    range outside which every output and input channel's weight is zero (a 400-sample window in 512 taps), else
    all."""
    if not isinstance(weight, Constant):
        return 0, taps
    nonzero = np.flatnonzero(np.any(weight.data != 0, axis=(0, 1, 2)))
    return (int(nonzero[0]), int(nonzero[-1]) + 1) if nonzero.size else (0, taps)


FramesCache = dict[tuple[int, ...], Expr]
"""Frames built so far in one pass run, by (id of the data, frame start, taps, stride, output width): convolutions
of one row with the same geometry (an STFT's real and imaginary parts) share one value, which
CombineSiblingProducts then finds as the one input of their products."""


def as_frames(call: Call, data: Expr, weight: Expr, used: tuple[int, int], cache: FramesCache | None = None) -> Expr:
    """`call` as a product of its frames with the flattened weight (see the module docstring), on its rewritten
    args; the result in `call`'s NCHW shape. Frames cover only the taps `used` (`used_taps` of the weight: the
    products left out are `0 * x`, which differ from zero only where `x` is not finite); `cache` shares frames
    between calls."""
    n, c, _, width = (int(d) for d in tensor_type_of(call.args[0]).shape)  # type: ignore[union-attr]
    o = int(tensor_type_of(call.args[1]).shape[0])  # type: ignore[union-attr]
    out_width = int(tensor_type_of(call).shape[3])  # type: ignore[union-attr]
    dtype = tensor_type_of(call.args[0]).dtype  # type: ignore[union-attr]
    stride = int_pair(call.attrs["strides"])[1]
    _, left, _, _ = conv2d_padding(call.attrs["padding"])
    first, end = used
    taps = end - first
    start = first - left  # where frame 0 starts in the unpadded row (negative: in the left padding)
    key = (id(data), start, taps, stride, out_width)
    frames = cache.get(key) if cache is not None else None
    if frames is None:
        frames = _frames(data, dtype, (n, c, width), start, taps, stride, out_width)
        if cache is not None:
            cache[key] = frames
    if isinstance(weight, Constant):
        flat: Expr = Constant(np.ascontiguousarray(weight.data[..., first:end].reshape(o, c * taps)))
    else:
        flat = call_op("reshape", weight, newshape=[o, c * taps])
    product = call_op("nn.dense", frames, flat, units=o, out_dtype=str(call.attrs["out_dtype"] or ""))
    product = call_op("reshape", product, newshape=[n, 1, out_width, o])
    return call_op("transpose", product, axes=[0, 3, 1, 2])


def _frames(data: Expr, dtype: str, shape: tuple[int, int, int], start: int, taps: int, stride: int,
            out_width: int) -> Expr:
    """`f[n*out_width + j, c*taps + k] = data[n, c, 0, start + stride*j + k]` (zero outside the row) of a row of
    `shape` (N, C, W)."""
    n, c, width = shape
    overlap = -(-taps // stride)
    pieces = out_width + overlap - 1  # rows of `stride` samples the frames read
    right = start + pieces * stride - width  # negative: the row's tail no frame reads
    zero = Constant(np.asarray(0, dtype=dtype))
    x = data
    if start < 0 or right > 0:
        x = call_op("nn.pad", x, zero, pad_width=[[0, 0], [0, 0], [0, 0], [max(-start, 0), max(right, 0)]])
    if start > 0 or right < 0:
        begin = max(start, 0)
        x = call_op("strided_slice", x, begin=[0, 0, 0, begin], end=[n, c, 1, begin + pieces * stride])
    x = call_op("reshape", x, newshape=[n, c, pieces, stride])
    shifted = [call_op("strided_slice", x, begin=[0, 0, q, 0],
                       end=[n, c, q + out_width, min(stride, taps - q * stride)]) for q in range(overlap)]
    frames = shifted[0] if overlap == 1 else call_op("concatenate", Tuple(tuple(shifted)), axis=3)  # [n, c, j, k]
    if c > 1:
        frames = call_op("transpose", frames, axes=[0, 2, 1, 3])
    return call_op("reshape", frames, newshape=[n * out_width, c * taps])


def _phase_weight(weight: Expr, zero: Constant, o: int, c: int, taps: int, stride: int, phases: int) -> Expr:
    """`w'[o, c*S + r, 0, q] = w[o, c, 0, S*q + r]` (zero past the last tap): computed here for a constant weight (the
    zero taps make it larger than the weight, which FoldConstant's size rule would not fold), else in the graph."""
    pad = phases * stride - taps
    if isinstance(weight, Constant):
        padded = np.pad(weight.data, [(0, 0), (0, 0), (0, 0), (0, pad)])
        phased = padded.reshape(o, c, phases, stride).transpose(0, 1, 3, 2).reshape(o, c * stride, 1, phases)
        return Constant(np.ascontiguousarray(phased))
    w = call_op("nn.pad", weight, zero, pad_width=[[0, 0], [0, 0], [0, 0], [0, pad]])
    w = call_op("reshape", w, newshape=[o, c, phases, stride])
    w = call_op("transpose", w, axes=[0, 1, 3, 2])  # [o, c, r, q]
    return call_op("reshape", w, newshape=[o, c * stride, 1, phases])


def _frames_rewrite() -> Callable[[Expr, Expr], Expr]:
    """The node rewrite of StridedRowConvAsFrames, with its own `FramesCache`."""
    cache: FramesCache = {}

    def rewrite(orig: Expr, new: Expr) -> Expr:
        if isinstance(new, Call) and new.op_name == "nn.conv2d":
            assert isinstance(orig, Call)
            if rewritable(orig):
                all_taps = int(tensor_type_of(orig.args[1]).shape[3])  # type: ignore[union-attr]
                first, end = used_taps(new.args[1], all_taps)
                overlap = -(-(end - first) // int_pair(orig.attrs["strides"])[1])  # strides one frame spans
                if overlap <= MAX_FRAME_OVERLAP:
                    return as_frames(orig, new.args[0], new.args[1], (first, end), cache)
        return new

    return rewrite


def _rewrite_phases(orig: Expr, new: Expr) -> Expr:
    if isinstance(new, Call) and new.op_name == "nn.conv2d":
        assert isinstance(orig, Call)
        if rewritable(orig):
            return as_phases(orig, new.args[0], new.args[1])
    return new


@register_pass
@dataclass(frozen=True)
class StridedRowConvAsFrames(Pass):
    name: ClassVar[str] = "StridedRowConvAsFrames"
    opt_level: ClassVar[int] = 1
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        return rewrite_functions(mod, _frames_rewrite())


@register_pass
@dataclass(frozen=True)
class StridedRowConvAsPhases(Pass):
    name: ClassVar[str] = "StridedRowConvAsPhases"
    opt_level: ClassVar[int] = 1
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        return rewrite_functions(mod, _rewrite_phases)
