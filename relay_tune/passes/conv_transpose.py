"""ConvTransposeAsConv: a transposed convolution whose taps do not overlap as a 1x1 convolution and a pixel shuffle.

With `strides == kernel_size`, no padding, no output padding, dilation 1 and one group, every output pixel
`(y, x)` receives exactly one tap, `(y % kh, x % kw)`, of exactly one input pixel, `(y // kh, x // kw)` (the
upsampling heads of DBNet / FPN detectors). So an NCHW `nn.conv2d_transpose(x, w)` with an IOHW weight
`(I, O, kh, kw)` is

    y = nn.conv2d(x, reshape(transpose(w, [1, 2, 3, 0]), [O * kh * kw, I, 1, 1]))      # (N, O*kh*kw, H, W)
    reshape(transpose(reshape(y, [N, O, kh, kw, H, W]), [0, 1, 4, 2, 5, 3]), [N, O, H * kh, W * kw])

a matrix product over the input channels that the convolution families tile and vectorize, followed by a copy;
the direct form gathers with a divisibility test at every tap. A constant weight is folded into the 1x1 layout at
build time by the FoldConstant that follows. Other transposed convolutions are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from relay_tune.ir import Call, Expr, IRModule
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    call_op,
    register_pass,
    rewrite_functions,
    tensor_type_of,
)
from relay_tune.passes.conv_geometry import int_pair


def non_overlapping(call: Call) -> tuple[int, int] | None:
    """`(kh, kw)` when `call` (an `nn.conv2d_transpose`) scatters each input pixel onto its own output block, in the
    plain NCHW / IOHW layouts with static shapes; None otherwise."""
    attrs = call.attrs
    data_type, weight_type = tensor_type_of(call.args[0]), tensor_type_of(call.args[1])
    if data_type is None or weight_type is None or tensor_type_of(call) is None:
        return None
    if (str(attrs["data_layout"]), str(attrs["kernel_layout"]), str(attrs["out_layout"] or "NCHW")) != (
            "NCHW", "IOHW", "NCHW"):
        return None
    kernel = tuple(int(k) for k in weight_type.shape[2:])
    if int(attrs["groups"]) != 1 or int_pair(attrs["strides"]) != kernel or any(int_pair(attrs["dilation"])[i] != 1
                                                                            for i in range(2)):
        return None
    if any(int_pair(attrs["output_padding"])) or any(int(p) for p in attrs["padding"]):  # type: ignore[union-attr]
        return None
    return kernel[0], kernel[1]


def as_conv_and_shuffle(call: Call, data: Expr, weight: Expr, kernel: tuple[int, int]) -> Expr:
    """The 1x1 convolution and pixel shuffle equal to `call` (see the module docstring), on its rewritten args."""
    data_type, weight_type = tensor_type_of(call.args[0]), tensor_type_of(call.args[1])
    assert data_type is not None and weight_type is not None
    n, _, h, w = (int(d) for d in data_type.shape)
    in_channels, out_channels = (int(d) for d in weight_type.shape[:2])
    kh, kw = kernel
    taps = out_channels * kh * kw
    weight_1x1 = call_op("reshape", call_op("transpose", weight, axes=[1, 2, 3, 0]), newshape=[taps, in_channels, 1, 1])
    conv = call_op("nn.conv2d", data, weight_1x1, channels=taps, kernel_size=[1, 1],
                 out_dtype=str(call.attrs["out_dtype"] or ""))
    blocks = call_op("reshape", conv, newshape=[n, out_channels, kh, kw, h, w])
    shuffled = call_op("transpose", blocks, axes=[0, 1, 4, 2, 5, 3])
    return call_op("reshape", shuffled, newshape=[n, out_channels, h * kh, w * kw])


def _rewrite_node(orig: Expr, new: Expr) -> Expr:
    if isinstance(new, Call) and new.op_name == "nn.conv2d_transpose":
        assert isinstance(orig, Call)
        kernel = non_overlapping(orig)
        if kernel is not None:
            return as_conv_and_shuffle(orig, new.args[0], new.args[1], kernel)
    return new


@register_pass
@dataclass(frozen=True)
class ConvTransposeAsConv(Pass):
    name: ClassVar[str] = "ConvTransposeAsConv"
    opt_level: ClassVar[int] = 1
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        return rewrite_functions(mod, _rewrite_node)
