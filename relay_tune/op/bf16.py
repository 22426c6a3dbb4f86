"""`nn.contrib_conv2d_NCHWc_bf16`: a bfloat16 x bfloat16 -> float32 convolution on channel-blocked layouts, the
weight packed in pairs of input channels for two-term dot products (what bf16 builds run convolutions and dense
products as; `relay_tune.passes.bf16`).

    data    (N, C / bi, H, W, bi)                     bfloat16, `NCHW{bi}c`, bi even
    weight  (O / bo, C / bi, KH, KW, bi / 2, bo, 2)   bfloat16: input channel `ci` of block `cb` and output channel
                                                      `o` at `[o // bo, cb, kh, kw, ci // 2, o % bo, ci % 2]`
    output  (N, O / bo, OH, OW, bo)                   float32, `NCHW{bo}c`

Two consecutive input channels of one pixel are one 32-bit value, broadcast to every output lane; the weight row of
those two channels for `bo` output channels is `2 * bo` contiguous bfloat16, so one step of the reduction is one
vdpbf16ps per register of output lanes (`tir.DOT2_BF16_INTRINSIC`; the same pair layout as the int16 weight of
`nn.contrib_conv2d_NCHWc_int8`). Products are exact in float32 and the sums are float32.

Attributes: `strides`, `padding` (top, left, bottom, right; filled with zeros).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.dtypes import ml_dtypes_module
from relay_tune.ir.types import ANY, TensorType, Type
from relay_tune.op.nn import _ints, _padding, _tensor_arg, fmt_shape
from relay_tune.op.quantized import blocked_conv_reference
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

OP_NAME = "nn.contrib_conv2d_NCHWc_bf16"

register_op(
    OP_NAME, 2, OpPattern.OUT_ELEMWISE_FUSABLE,
    {"strides": (1, 1), "padding": (0, 0, 0, 0)},
    "relay.attrs.Conv2DBf16Attrs",
    description="bfloat16 x bfloat16 -> float32 conv2d on NCHW[x]c data with a weight packed in channel pairs",
)


def pack_bf16_weight(weight: np.ndarray, bi: int, bo: int) -> np.ndarray:
    """An OIHW float weight rounded to bfloat16 (to nearest even) and packed as `(O / bo, I / bi, KH, KW, bi / 2,
    bo, 2)`, with zeros appended to its output and input channels up to multiples of `bo` and `bi`."""
    if bi % 2:
        raise ValueError(f"the input channel block {bi} is not a multiple of 2")
    bfloat16 = ml_dtypes_module().bfloat16
    o, i, kh, kw = weight.shape
    full = np.zeros((-(-o // bo) * bo, -(-i // bi) * bi, kh, kw), dtype=bfloat16)
    full[:o, :i] = weight.astype(np.float32).astype(bfloat16)
    ob, cb = full.shape[0] // bo, full.shape[1] // bi
    return np.ascontiguousarray(full.reshape(ob, bo, cb, bi // 2, 2, kh, kw).transpose(0, 2, 5, 6, 3, 1, 4))


def unpack_bf16_weight(packed: np.ndarray) -> np.ndarray:
    """The OIHW weight of a packed one (channels as packed, padding included), in its own dtype."""
    ob, cb, kh, kw, pairs, bo, two = packed.shape
    return packed.transpose(0, 5, 1, 4, 6, 2, 3).reshape(ob * bo, cb * pairs * two, kh, kw)


@type_relation(OP_NAME)
def conv2d_nchwc_bf16_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    data = _tensor_arg(arg_types[0], OP_NAME, "data")
    weight = _tensor_arg(arg_types[1], OP_NAME, "weight")
    if data.dtype != "bfloat16" or weight.dtype != "bfloat16":
        raise RelayTypeError(f"needs bfloat16 data and weight, got {data.dtype} and {weight.dtype}", op_name=OP_NAME)
    if data.ndim != 5 or weight.ndim != 7:
        raise RelayTypeError(f"needs 5-D data (N, C/b, H, W, b) and a 7-D packed weight, got "
                             f"{fmt_shape(data.shape)} and {fmt_shape(weight.shape)}", op_name=OP_NAME)
    n, cb, h, w, bi = data.shape
    ob, wcb, kh, kw, pairs, bo, two = weight.shape
    if (bi is not ANY and (bi % 2 or (pairs is not ANY and pairs * 2 != bi))) or two != 2 \
            or (cb is not ANY and wcb is not ANY and cb != wcb):
        raise RelayTypeError(f"data {fmt_shape(data.shape)} and packed weight {fmt_shape(weight.shape)} do not "
                             "match: the weight must be (O/bo, C/bi, KH, KW, bi/2, bo, 2)", op_name=OP_NAME)
    sh, sw = _ints(attrs["strides"], 2, OP_NAME, "strides")
    (pt, pl), (pb, pr) = _padding(attrs["padding"], 2, OP_NAME)
    if sh < 1 or sw < 1:
        raise RelayTypeError(f"strides must be >= 1, got {[sh, sw]}", op_name=OP_NAME)
    if h is ANY or w is ANY or kh is ANY or kw is ANY:
        return TensorType((n, ob, ANY, ANY, bo), "float32")
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    if oh < 1 or ow < 1:
        raise RelayTypeError(f"the {kh}x{kw} kernel does not fit the padded {h}x{w} map", op_name=OP_NAME)
    return TensorType((n, ob, oh, ow, bo), "float32")


@reference(OP_NAME)
def conv2d_nchwc_bf16_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    """The products of the bfloat16 values summed in float64 and rounded to float32 once."""
    data, packed = inputs
    n, cb, h, w, bi = data.shape
    weight = unpack_bf16_weight(packed).astype(np.float64)
    x = data.astype(np.float64).transpose(0, 1, 4, 2, 3).reshape(n, cb * bi, h, w)
    return blocked_conv_reference(x, weight, packed.shape[5], attrs, OP_NAME).astype(np.float32)


# ================================================================================================
# Tensor-expression compute
# ================================================================================================
# Imported here, not at the top: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import LayoutMap, const_expr, named, static_shape  # noqa: E402
from relay_tune.op.nn import _pad_axes  # noqa: E402
from relay_tune.op.registry import compute  # noqa: E402

TAG = "conv2d_nchwc_bf16"


@compute(OP_NAME)
def _conv2d_nchwc_bf16_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """Sums over `(rcb, rh, rw, rp)`: channel blocks, kernel taps, pairs of a block; each step one two-term
    product of the pair `x[n, rcb, iy, ix, 2 rp : 2 rp + 2]` with `w[f, rcb, rh, rw, rp, c, 0:2]`."""
    data, weight = inputs
    sh, sw = _ints(attrs["strides"], 2, OP_NAME, "strides")
    (pt, pl), (pb, pr) = _padding(attrs["padding"], 2, OP_NAME)
    _, cb, kh, kw, pairs, _, _ = weight.shape
    layout = LayoutMap.parse(f"NCHW{data.shape[4]}c")
    padded = _pad_axes(data, {2: (pt, pb), 3: (pl, pr)}, const_expr(0.0, "bfloat16"), layout)
    rcb, rh, rw, rp = (te.reduce_axis(cb, "rcb"), te.reduce_axis(kh, "rh"), te.reduce_axis(kw, "rw"),
                       te.reduce_axis(pairs, "rq"))

    def body(b: tir.PrimExpr, f: tir.PrimExpr, y: tir.PrimExpr, x: tir.PrimExpr, c: tir.PrimExpr) -> tir.PrimExpr:
        iy = (y * sh if sh != 1 else y) + rh
        ix = (x * sw if sw != 1 else x) + rw
        pair = [padded[b, rcb, iy, ix, rp * 2 + k] for k in range(2)]
        row = [weight[f, rcb, rh, rw, rp, c, k] for k in range(2)]
        return te.sum(te.dot2_bf16_f32(pair, row), axis=[rcb, rh, rw, rp])

    shape = static_shape(out_type, "output")
    return te.compute(shape, named(["n", "oc", "oh", "ow", "oc_i"], body), "conv", TAG)
