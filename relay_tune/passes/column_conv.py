"""ColumnConvAsRow: a 2-D convolution over a map one column wide, as the same convolution over one row.

A `[N, C, H, 1]` map convolved with `[O, I, KH, 1]` kernels (a 1-D convolution along the height: byte and audio
models exported with `(k, 1)` kernels) equals

    reshape(nn.conv2d(reshape(x, [N, C, 1, H]), reshape(w, [O, I, 1, KH]), strides=[1, sh], dilation=[1, dh],
                      padding=[0, top, 0, bottom], kernel_size=[1, KH]), [N, O, OH, 1])

because a unit axis can move without moving a byte. The convolution families tile the output columns into their
register tiles; with one column the tile is one column wide and the FMAs wait on each other (magika's 5x1
convolution over 512 rows ran at a quarter of the FMA peak). Over one row, the height becomes the tiled width. The
reshapes are memory views, and constant weights are reshaped once at build time by the FoldConstant that follows.
Only plain NCHW / OIHW convolutions with static shapes, a kernel one column wide and no padding of the width are
rewritten (groups are kept: the channels do not move).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from relay_tune.ir import Call, Expr, IRModule
from relay_tune.passes.base import Pass, PassConfig, call_op, register_pass, rewrite_functions, tensor_type_of
from relay_tune.passes.conv_geometry import conv2d_padding, int_pair, plain_conv2d_types


def rewritable(call: Call) -> bool:
    """Whether `call` (an `nn.conv2d`) convolves a static NCHW map one column wide with an OIHW kernel one column
    wide and no width padding: see the module docstring."""
    types = plain_conv2d_types(call)
    if types is None:
        return False
    data, weight, _ = types
    _, left, _, right = conv2d_padding(call.attrs["padding"])
    return data.shape[3] == 1 and weight.shape[3] == 1 and left == right == 0 and data.shape[2] > 1


def as_row_conv(call: Call, data: Expr, weight: Expr) -> Expr:
    """The one-row convolution equal to `call` (see the module docstring), on its rewritten args."""
    attrs = call.attrs
    n, c, h, _ = tensor_type_of(call.args[0]).shape  # type: ignore[union-attr]
    o, i, kh, _ = tensor_type_of(call.args[1]).shape  # type: ignore[union-attr]
    out_h = tensor_type_of(call).shape[2]  # type: ignore[union-attr]
    top, _, bottom, _ = conv2d_padding(attrs["padding"])
    row_data = call_op("reshape", data, newshape=[n, c, 1, h])
    row_weight = call_op("reshape", weight, newshape=[o, i, 1, kh])
    conv = call_op(
        "nn.conv2d", row_data, row_weight,
        strides=[1, int_pair(attrs["strides"])[0]], dilation=[1, int_pair(attrs["dilation"])[0]],
        padding=[0, top, 0, bottom], groups=attrs["groups"], channels=attrs["channels"], kernel_size=[1, kh],
        out_dtype=str(attrs["out_dtype"] or ""))
    return call_op("reshape", conv, newshape=[n, o, out_h, 1])


def _rewrite_node(orig: Expr, new: Expr) -> Expr:
    if isinstance(new, Call) and new.op_name == "nn.conv2d":
        assert isinstance(orig, Call)
        if rewritable(orig):
            return as_row_conv(orig, new.args[0], new.args[1])
    return new


@register_pass
@dataclass(frozen=True)
class ColumnConvAsRow(Pass):
    name: ClassVar[str] = "ColumnConvAsRow"
    opt_level: ClassVar[int] = 1
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        return rewrite_functions(mod, _rewrite_node)
