"""WinogradConv: 3x3 stride-1 convolutions on blocked layouts as Winograd transforms around a batched product.

After `PlanLayouts`, an eligible `nn.contrib_conv2d_NCHWc` (3x3 kernel, stride 1, dilation 1, groups 1, float32,
`NCHW{bi}c` data, a constant `OIHW{bi}i{bo}o` kernel, `NCHW{bo}c` output, any padding) becomes

    v = nn.winograd_input_transform(x, tile_size=m, padding=..., data_layout="NCHW{bi}c")   # (alpha^2, P, C)
    p = nn.batch_matmul(v, U)                       # U = G g G^T: a constant (alpha^2, C, K), computed here once
    y = nn.winograd_output_transform(p, tile_size=m, out_height=OH, out_width=OW, out_layout="NCHW{bo}c")

(`relay_tune.op.winograd`). The fuser keeps the three apart: the input transform is opaque (a kernel of its own,
never fused with the previous convolution's epilogue) and the output transform, like a convolution, fuses only
with the element-wise ops after it (bias, activation, residual add: its epilogue), not into the product.

Which convolutions, and with which tile size m, is the `winograd` setting (`PassConfig.winograd`):

- "off": none;
- "on": every eligible convolution, F(4x4, 3x3) where the output map is at least 8x8, else F(2x2, 3x3);
- "f2", "f4": every eligible convolution with that tile size (for experiments);
- "auto": the rule `auto_tile_size` below, measured on ResNet-50's 3x3 layers (experiments/README.md).

A convolution whose kernel is not a constant (a model input) is left alone: its transform would run on every call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule, Var, post_order
from relay_tune.op.nn import _padding
from relay_tune.op.winograd import weight_transform
from relay_tune.passes.base import (
    WINOGRAD_MODES,
    Pass,
    PassConfig,
    call_op,
    map_functions,
    register_pass,
    retype,
    rewrite_dataflow,
    tensor_type_of,
)
from relay_tune.passes.fold_constant import evaluate_constants


def auto_tile_size(height: int, width: int, in_channels: int, out_channels: int) -> int:
    """The tile size "auto" uses for a convolution with an output map of `height` x `width` (0: the direct
    convolution): F(4x4) on maps of at least 14x14 with at least 64 input channels.

    Measured with default schedules (experiments/README.md, in-graph profiles of whole networks): C -> C
    layers of ResNet-50 with F(4x4) against the direct blocked convolution, 64x56x56 2.1x faster, 128x28x28 2.1x,
    256x14x14 1.5x, 512x7x7 0.64x (2x2 tiles of a 7x7 map: the tiles cover 8x8, and the 36 weight matrices of
    512x512 are read for 4 tiles; F(2x2) 1.02x, no gain); SqueezeNet's 16 -> 64 channels on 55x55 1.2x slower
    and 32 -> 128 on 27x27 even (the transforms cost per channel what the product saves per channel pair)."""
    if min(height, width) >= 14 and in_channels >= 64:
        return 4
    return 0


def _tile_size(mode: str, height: int, width: int, in_channels: int, out_channels: int) -> int:
    if mode == "f2":
        return 2
    if mode == "f4":
        return 4
    if mode == "on":
        return 4 if min(height, width) >= 8 else 2
    if mode == "auto":
        return auto_tile_size(height, width, in_channels, out_channels)
    return 0


def _constant_oihw(weight: Expr, kernel_layout: str) -> np.ndarray | None:
    """The OIHW value of a convolution's kernel when it is a constant: PlanLayouts'
    `layout_transform(w, "OIHW", kernel_layout)` (or `w` itself in OIHW) where `w` is a `Constant` or a closed
    expression of constants (a batch-norm scale folded into the weight, which the FoldConstant after this pass would
    fold), evaluated here; the packed copy is never needed."""
    oihw: Expr | None = weight if kernel_layout == "OIHW" else None
    if (isinstance(weight, Call) and weight.op_name == "layout_transform"
            and weight.attrs.get("src_layout") == "OIHW" and weight.attrs.get("dst_layout") == kernel_layout):
        oihw = weight.args[0]
    if oihw is None:
        return None
    if isinstance(oihw, Constant):
        return np.asarray(oihw.data)
    if any(isinstance(node, (Var, Function)) for node in post_order(oihw)):
        return None  # a model input (or anything but constants) reaches the kernel
    return np.asarray(evaluate_constants([oihw])[0])


def _rewrite(call: Call, args: tuple[Expr, ...], mode: str) -> Expr | None:
    """The Winograd form of `call` (typed; `args`: its rewritten arguments), or None when it is not eligible (or
    the mode leaves it direct)."""
    attrs = call.attrs
    if call.op_name != "nn.contrib_conv2d_NCHWc":
        return None
    if tuple(attrs.get("strides", (1, 1))) != (1, 1) or tuple(attrs.get("dilation", (1, 1))) != (1, 1):  # type: ignore[arg-type]
        return None
    if int(attrs.get("groups", 1)) != 1 or attrs.get("out_dtype") not in ("", None, "float32"):  # type: ignore[arg-type]
        return None
    data_layout, kernel_layout = str(attrs.get("data_layout")), str(attrs.get("kernel_layout"))
    out_layout = str(attrs.get("out_layout") or data_layout)
    if not (re.fullmatch(r"NCHW\d+c", data_layout) and re.fullmatch(r"NCHW\d+c", out_layout)
            and re.fullmatch(r"OIHW\d+i\d+o", kernel_layout)):
        return None
    data_ty, out_ty = tensor_type_of(call.args[0]), tensor_type_of(call)
    if data_ty is None or out_ty is None or data_ty.dtype != "float32" or out_ty.dtype != "float32":
        return None
    weight = _constant_oihw(call.args[1], kernel_layout)
    if weight is None or weight.ndim != 4 or weight.shape[2:] != (3, 3) or weight.dtype != np.float32:
        return None
    out_channels, in_channels = int(weight.shape[0]), int(weight.shape[1])
    out_h, out_w = int(out_ty.shape[2]), int(out_ty.shape[3])  # type: ignore[call-overload]
    m = _tile_size(mode, out_h, out_w, in_channels, out_channels)
    if not m:
        return None
    # four numbers whatever form the convolution had, so equal convolutions give one workload
    (top, left), (bottom, right) = _padding(attrs.get("padding", (0, 0)), 2, call.op_name)
    padding = (top, left, bottom, right)
    v = call_op("nn.winograd_input_transform", *(args[0],), tile_size=m, padding=padding, data_layout=data_layout)
    u = Constant.adopt(weight_transform(weight, m))
    product = call_op("nn.batch_matmul", *(v, u))
    return call_op("nn.winograd_output_transform", *(product,), tile_size=m, out_height=out_h, out_width=out_w,
                 out_layout=out_layout)



def winograd_function(func: Function, mode: str) -> Function:
    """`func` with its eligible convolutions in Winograd form (module docstring)."""
    if mode == "off":
        return func

    def visit(original: Expr, updated: Expr) -> Expr:
        if isinstance(original, Call) and isinstance(updated, Call) and original.op_name == "nn.contrib_conv2d_NCHWc":
            new = _rewrite(original, updated.args, mode)
            if new is not None:
                return new
        return updated

    body = rewrite_dataflow(func.body, visit)
    if body is func.body:
        return func
    return Function(func.params, body, func.ret_type, func.attrs, func.type_params, func.span)


@register_pass
@dataclass(frozen=True)
class WinogradConv(Pass):
    """Rewrite eligible 3x3 stride-1 blocked convolutions into Winograd form (module docstring). `mode`: one of
    `WINOGRAD_MODES`; None takes `PassConfig.winograd`."""

    mode: str | None = None
    name: ClassVar[str] = "WinogradConv"
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in WINOGRAD_MODES:
            raise ValueError(f"WinogradConv mode must be one of {WINOGRAD_MODES}, got {self.mode!r}")

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        mode = config.winograd if self.mode is None else self.mode
        if mode == "off":
            return mod
        new_mod, changed = map_functions(mod, lambda f: winograd_function(f, mode))
        return retype(new_mod, changed)


__all__ = ["WINOGRAD_MODES", "WinogradConv", "auto_tile_size", "winograd_function"]
