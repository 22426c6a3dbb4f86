"""`nn.contrib_conv2d_NCHWc_int8`: a uint8 x int8 -> int32 convolution on channel-blocked layouts with the weight
packed for four-byte dot products, or, where the int8 weight's pairs would saturate vpmaddubsw on a CPU without
VNNI, packed in pairs for two-term products (int8, widened to int16 by the kernel as it loads each row).

    data    (N, C / bi, H, W, bi)                     uint8, `NCHW{bi}c`, bi a multiple of 4 (int16 with an int16
                                                      weight: values already less their zero point)
    weight  (O / bo, C / bi, KH, KW, bi / 4, bo, 4)   int8: input channel `ci` of block `cb` and output channel
                                                      `o` at `[o // bo, cb, kh, kw, ci // 4, o % bo, ci % 4]`
         or (O / bo, C / bi, KH, KW, bi / 2, bo, 2)   int8 or int16: the same with pairs for quads
    output  (N, O / bo, OH, OW, bo)                   int32, `NCHW{bo}c`

Four consecutive input channels of one pixel are one 32-bit value, broadcast to every output lane; the weight row
of those four channels for `bo` output channels is `4 * bo` contiguous bytes, so one step of the reduction is one
dot-product instruction sequence per register of output lanes (`tir.DOT4_INTRINSICS`). With a weight in pairs a step
takes two channels: their uint8 values widened to an int16 pair and broadcast, the weight row `2 * bo` values (int8
ones sign-extended as loaded: vpmovsxbw), one vpmaddwd per register of lanes (`tir.DOT2_INTRINSIC`). The int8 form
streams half the weight bytes of the int16 one. The sums are exact either way.

Attributes: `strides`, `padding` (top, left, bottom, right) filled with `pad_value` (the data's zero point: the
padding of the float convolution this stands for is the quantized zero), `pairs_fit_int16` (every weight pair
`w[.., 2j]`, `w[.., 2j + 1]` of a quad has |w0| + |w1| <= 128, so the saturating vpmaddubsw is exact; checked by
`pack_int8_weight`, which also packs the weight at build time; always False for an int16 weight).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.types import ANY, TensorType, Type
from relay_tune.op.nn import _ints, _padding, _tensor_arg, fmt_shape
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

OP_NAME = "nn.contrib_conv2d_NCHWc_int8"
PAIR_LIMIT = 128
"""|w0| + |w1| <= 128 keeps `255 * (|w0| + |w1|)` inside int16: vpmaddubsw's pair sums never saturate."""

register_op(
    OP_NAME, 2, OpPattern.OUT_ELEMWISE_FUSABLE,
    {"strides": (1, 1), "padding": (0, 0, 0, 0), "pad_value": 0, "pairs_fit_int16": False},
    "relay.attrs.Conv2DInt8Attrs",
    description="uint8 x int8 -> int32 conv2d on NCHW[x]c data with a weight packed for 4-byte dot products",
)


def pack_int8_weight(weight: np.ndarray, bi: int, bo: int) -> tuple[np.ndarray, bool]:
    """An OIHW int8 weight packed as `(O / bo, I / bi, KH, KW, bi / 4, bo, 4)`, with zeros appended to its output
    and input channels up to multiples of `bo` and `bi`; and whether every pair of a quad satisfies
    |w0| + |w1| <= PAIR_LIMIT."""
    if bi % 4:
        raise ValueError(f"the input channel block {bi} is not a multiple of 4")
    o, i, kh, kw = weight.shape
    full = np.zeros((-(-o // bo) * bo, -(-i // bi) * bi, kh, kw), dtype=np.int8)
    full[:o, :i] = weight
    ob, cb = full.shape[0] // bo, full.shape[1] // bi
    packed = full.reshape(ob, bo, cb, bi // 4, 4, kh, kw).transpose(0, 2, 5, 6, 3, 1, 4)
    # a quad's pairs are input channels (2j, 2j + 1): the pairs `pairs_fit_int16` checks
    return np.ascontiguousarray(packed), pairs_fit_int16(full)


def pairs_fit_int16(weight: np.ndarray) -> bool:
    """Whether every pair of consecutive input channels (axis 1: channels 2j and 2j + 1) of an OIHW (or OI) int8
    weight has |w0| + |w1| <= PAIR_LIMIT at every output channel and tap: vpmaddubsw's int16 pair sums of uint8
    data then never saturate."""
    w = np.abs(weight.astype(np.int32))
    if w.shape[1] % 2:
        w = np.concatenate([w, np.zeros_like(w[:, :1])], axis=1)
    return bool((w[:, 0::2] + w[:, 1::2]).max(initial=0) <= PAIR_LIMIT)


def pack_int16_weight(weight: np.ndarray, bi: int, bo: int) -> np.ndarray:
    """An OIHW int8 (or int16) weight widened to int16 and packed as `(O / bo, I / bi, KH, KW, bi / 2, bo, 2)` (pairs
    of input channels for vpmaddwd), with zeros appended to its output and input channels up to multiples of `bo`
    and `bi`."""
    return _pack_pairs(weight, bi, bo, np.int16)


def pack_int8_pairs(weight: np.ndarray, bi: int, bo: int) -> np.ndarray:
    """An OIHW int8 weight packed as pairs like `pack_int16_weight` but kept int8: the kernel widens each weight row
    as it loads it (vpmovsxbw), so the weight streams half the bytes of its int16 form."""
    if weight.dtype != np.int8:
        raise ValueError(f"int8 pairs need an int8 weight, got {weight.dtype}")
    return _pack_pairs(weight, bi, bo, np.int8)


def _pack_pairs(weight: np.ndarray, bi: int, bo: int, dtype: type[np.integer]) -> np.ndarray:
    if bi % 2:
        raise ValueError(f"the input channel block {bi} is not a multiple of 2")
    o, i, kh, kw = weight.shape
    full = np.zeros((-(-o // bo) * bo, -(-i // bi) * bi, kh, kw), dtype=dtype)
    full[:o, :i] = weight
    ob, cb = full.shape[0] // bo, full.shape[1] // bi
    return np.ascontiguousarray(full.reshape(ob, bo, cb, bi // 2, 2, kh, kw).transpose(0, 2, 5, 6, 3, 1, 4))


def unpack_int8_weight(packed: np.ndarray) -> np.ndarray:
    """The OIHW weight of a packed one, int8 or int16 (channels as packed, padding included)."""
    ob, cb, kh, kw, groups, bo, terms = packed.shape
    return packed.transpose(0, 5, 1, 4, 6, 2, 3).reshape(ob * bo, cb * groups * terms, kh, kw)


_TERMS = {"int8": (4, 2), "int16": (2,)}
"""Input channels per dot-product step by weight dtype: quads or pairs of int8, pairs of int16."""


@type_relation(OP_NAME)
def conv2d_nchwc_int8_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    data = _tensor_arg(arg_types[0], OP_NAME, "data")
    weight = _tensor_arg(arg_types[1], OP_NAME, "weight")
    if (data.dtype, weight.dtype) not in (("uint8", "int8"), ("uint8", "int16"), ("int16", "int16")):
        raise RelayTypeError(f"needs uint8 data and an int8 (or int16) weight, or int16 data and an int16 weight, "
                             f"got {data.dtype} and {weight.dtype}", op_name=OP_NAME)
    if data.ndim != 5 or weight.ndim != 7:
        raise RelayTypeError(f"needs 5-D data (N, C/b, H, W, b) and a 7-D packed weight, got "
                             f"{fmt_shape(data.shape)} and {fmt_shape(weight.shape)}", op_name=OP_NAME)
    n, cb, h, w, bi = data.shape
    ob, wcb, kh, kw, groups, bo, terms = weight.shape
    k = terms if terms in _TERMS[weight.dtype] else _TERMS[weight.dtype][0]
    if (bi is not ANY and (bi % 4 or (groups is not ANY and groups * k != bi))) or terms != k \
            or (cb is not ANY and wcb is not ANY and cb != wcb):
        raise RelayTypeError(f"data {fmt_shape(data.shape)} and packed {weight.dtype} weight "
                             f"{fmt_shape(weight.shape)} do not match: the weight must be "
                             f"(O/bo, C/bi, KH, KW, bi/{k}, bo, {k})", op_name=OP_NAME)
    sh, sw = _ints(attrs["strides"], 2, OP_NAME, "strides")
    (pt, pl), (pb, pr) = _padding(attrs["padding"], 2, OP_NAME)
    if sh < 1 or sw < 1:
        raise RelayTypeError(f"strides must be >= 1, got {[sh, sw]}", op_name=OP_NAME)
    if h is ANY or w is ANY or kh is ANY or kw is ANY:
        return TensorType((n, ob, ANY, ANY, bo), "int32")
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    if oh < 1 or ow < 1:
        raise RelayTypeError(f"the {kh}x{kw} kernel does not fit the padded {h}x{w} map", op_name=OP_NAME)
    return TensorType((n, ob, oh, ow, bo), "int32")


@reference(OP_NAME)
def conv2d_nchwc_int8_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    data, packed = inputs
    n, cb, h, w, bi = data.shape
    weight = unpack_int8_weight(packed).astype(np.int64)
    x = data.transpose(0, 1, 4, 2, 3).reshape(n, cb * bi, h, w).astype(np.int64)
    pad_value = int(attrs["pad_value"])  # type: ignore[arg-type]
    return blocked_conv_reference(x, weight, packed.shape[5], attrs, OP_NAME, pad_value).astype(np.int32)


def blocked_conv_reference(x: np.ndarray, weight: np.ndarray, block: int, attrs: Attrs, op_name: str,
                           pad_value: float = 0) -> np.ndarray:
    """The NCHW{block}c result of NCHW `x` convolved with OIHW `weight` in their own dtype (`strides` and `padding`
    from `attrs`, padded with `pad_value`): the packed int8 and bf16 convolutions' references."""
    n, o, kh, kw = x.shape[0], weight.shape[0], weight.shape[2], weight.shape[3]
    sh, sw = _ints(attrs["strides"], 2, op_name, "strides")
    (pt, pl), (pb, pr) = _padding(attrs["padding"], 2, op_name)
    x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=pad_value)
    windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    out = np.einsum("ncyxhw,ochw->noyx", windows, weight, optimize=True)
    oh, ow = out.shape[2:]
    return out.reshape(n, o // block, block, oh, ow).transpose(0, 1, 3, 4, 2)


# ================================================================================================
# Tensor-expression compute
# ================================================================================================
# Imported here, not at the top: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import LayoutMap, const_expr, named, static_shape  # noqa: E402
from relay_tune.op.nn import _pad_axes  # noqa: E402
from relay_tune.op.registry import compute  # noqa: E402

TAG = "conv2d_nchwc_int8"


@compute(OP_NAME)
def _conv2d_nchwc_int8_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    """Sums over `(rcb, rh, rw, rq)`: channel blocks, kernel taps, quads (int16 weight: pairs) of a block; each step
    one dot product of the quad `x[n, rcb, iy, ix, 4 rq : 4 rq + 4]` with `w[f, rcb, rh, rw, rq, c, 0:4]` (pairs:
    2 for 4)."""
    data, weight = inputs
    sh, sw = _ints(attrs["strides"], 2, OP_NAME, "strides")
    (pt, pl), (pb, pr) = _padding(attrs["padding"], 2, OP_NAME)
    fill = const_expr(int(attrs["pad_value"]), data.dtype)  # type: ignore[arg-type]
    _, cb, kh, kw, groups, _, terms = weight.shape
    layout = LayoutMap.parse(f"NCHW{data.shape[4]}c")
    if terms == 2 and (data.dtype != "int16" or any((pt, pb, pl, pr))):
        padded = _padded_int16(data, {2: (pt, pb), 3: (pl, pr)}, fill, layout)
    elif terms == 2:  # int16 data without padding: its channel pairs are read where they are, no copy
        padded = data
    else:
        padded = _pad_axes(data, {2: (pt, pb), 3: (pl, pr)}, fill, layout)
    rcb, rh, rw, rq = (te.reduce_axis(cb, "rcb"), te.reduce_axis(kh, "rh"), te.reduce_axis(kw, "rw"),
                       te.reduce_axis(groups, "rq"))
    pairs = bool(attrs["pairs_fit_int16"])

    def body(b: tir.PrimExpr, f: tir.PrimExpr, y: tir.PrimExpr, x: tir.PrimExpr, c: tir.PrimExpr) -> tir.PrimExpr:
        iy = (y * sh if sh != 1 else y) + rh
        ix = (x * sw if sw != 1 else x) + rw
        group = [padded[b, rcb, iy, ix, rq * terms + k] for k in range(terms)]
        row = [weight[f, rcb, rh, rw, rq, c, k] for k in range(terms)]
        dot = te.dot2_u8s16_i32(group, row) if terms == 2 else te.dot4_u8s8_i32(group, row, pairs)
        return te.sum(dot, axis=[rcb, rh, rw, rq])

    shape = static_shape(out_type, "output")
    return te.compute(shape, named(["n", "oc", "oh", "ow", "oc_i"], body), "conv", TAG)


def _padded_int16(x: te.Tensor, pads: dict[int, tuple[int, int]], fill: tir.PrimExpr,
                  layout: LayoutMap) -> te.Tensor:
    """`x` padded by `(before, after)` on the given axes with `fill` and widened to int16, a "pad" stage even without
    padding: computed once at the root (the template's default), it holds every channel pair as one 32-bit value,
    which the int16 weight's steps broadcast straight from memory (widening the uint8 pair at each step costs the
    broadcast a shuffle and a vpmovzxbw)."""
    shape = tuple(s + sum(pads.get(d, (0, 0))) for d, s in enumerate(x.shape))

    def body(*idx: tir.PrimExpr) -> tir.PrimExpr:
        conds: list[tir.PrimExpr] = []
        src: list[tir.PrimExpr] = []
        for d, i in enumerate(idx):
            before, after = pads.get(d, (0, 0))
            if before:
                conds.append(i >= before)
            if after:
                conds.append(i < before + x.shape[d])
            src.append(i - before if before else i)
        value = x[tuple(src)] if not conds else te.if_then_else(te.all_of(*conds), x[tuple(src)], fill)
        return te.cast("int16", value)

    names = layout.axis_names({"N": "n", "C": "c", "D": "d", "H": "h", "W": "w"})
    return te.compute(shape, named(names, body), "pad", "pad")
