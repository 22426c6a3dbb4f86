"""Conv1dAsConv2d: a 1-D convolution as a 2-D convolution over a map of height 1.

An NCW `nn.conv1d(x, w)` with an OIW weight equals

    squeeze(nn.conv2d(expand_dims(x, 2), expand_dims(w, 2), strides=[1, s], dilation=[1, d],
                      padding=[0, left, 0, right], kernel_size=[1, k]), axis=[2])

and the 2-D convolution families tile, vectorize and parallelise that over its output channels and width, where a
1-D convolution has no family of its own and falls to the generic reduction schedule (a strided STFT-style
convolution, 258 filters of 256 taps, ran about twenty times slower there). The expand_dims and squeeze only
insert and drop a unit axis; a constant weight is folded into its 4-D shape at build time by the FoldConstant that
follows. Grouped 1-D convolutions and other layouts are left alone.
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


def _ints(value: object) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)  # type: ignore[attr-defined]


def rewritable(call: Call) -> bool:
    """Whether `call` (an `nn.conv1d`) is in the plain NCW / OIW layouts with static shapes and one group."""
    attrs = call.attrs
    if tensor_type_of(call.args[0]) is None or tensor_type_of(call.args[1]) is None or tensor_type_of(call) is None:
        return False
    layouts = (str(attrs["data_layout"]), str(attrs["kernel_layout"]), str(attrs["out_layout"] or "NCW"))
    return layouts == ("NCW", "OIW", "NCW") and int(attrs["groups"]) == 1  # type: ignore[call-overload]


def as_conv2d(call: Call, data: Expr, weight: Expr) -> Expr:
    """The height-1 2-D convolution equal to `call` (see the module docstring), on its rewritten args."""
    attrs = call.attrs
    pads = _ints(attrs["padding"])
    left, right = (pads[0], pads[0]) if len(pads) == 1 else pads[:2]
    kernel = attrs["kernel_size"]
    conv = call_op(
        "nn.conv2d", call_op("expand_dims", data, axis=2), call_op("expand_dims", weight, axis=2),
        strides=[1, _ints(attrs["strides"])[0]], dilation=[1, _ints(attrs["dilation"])[0]],
        padding=[0, left, 0, right], channels=attrs["channels"],
        kernel_size=None if kernel is None else [1, _ints(kernel)[0]], out_dtype=str(attrs["out_dtype"] or ""))
    return call_op("squeeze", conv, axis=[2])


def _rewrite_node(orig: Expr, new: Expr) -> Expr:
    if isinstance(new, Call) and new.op_name == "nn.conv1d":
        assert isinstance(orig, Call)
        if rewritable(orig):
            return as_conv2d(orig, new.args[0], new.args[1])
    return new


@register_pass
@dataclass(frozen=True)
class Conv1dAsConv2d(Pass):
    name: ClassVar[str] = "Conv1dAsConv2d"
    opt_level: ClassVar[int] = 1
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        return rewrite_functions(mod, _rewrite_node)
