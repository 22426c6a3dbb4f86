"""Bfloat16Products: in a bf16 build (`PassConfig.precision == "bf16"`), float32 convolutions and dense products run
on bfloat16 weights and activations with float32 sums.

Each product becomes `nn.contrib_conv2d_NCHWc_bf16` (`relay_tune.op.bf16`): the constant weight rounded to
bfloat16 (nearest even) and packed in pairs of input channels once at build time, the activation cast to bfloat16
just before it. FuseOps fuses that cast into the kernel that produces the activation where the activation has no
other consumer, so the producer writes half the bytes; where other consumers need float32 (a residual branch) the
cast is fused into the product's kernel instead. Outputs stay float32, so everything between the products (bias,
batch-norm shifts, activations, residual additions, pooling, softmax) runs in float32 as in the fp32 build.

- `nn.contrib_conv2d_NCHWc` (what PlanLayouts makes of float32 convolutions) with one group, no dilation, an even
  input block and a constant weight (packed by the FoldConstant before this pass) is rewritten in its layouts.
  Convolutions left in NCHW (no block for their channels, grouped, depthwise) and the odd-block stem (`NCHW3c`)
  stay float32.
- `nn.dense` of float32 rows `(M, K)` by a constant `(N, K)` weight, with K even and N a multiple of half the
  layout block (at least 8), runs as the same convolution over the rows as a batch of 1x1 maps: the rows and the
  sums are reshaped (views, no copies), the reduction taken in blocks of the layout block's width (or of 2).
- Nothing else changes; Winograd-form convolutions (`WinogradConv`) stay float32, which is why bf16 builds turn
  Winograd off unless asked for.

The results differ from the fp32 build by bfloat16's rounding of the operands (8-bit mantissas: a relative 2^-9 per
operand), accumulated over each sum; builds report that difference (`relay_tune.compile.precision`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule
from relay_tune.op.bf16 import OP_NAME as BF16_CONV
from relay_tune.op.bf16 import pack_bf16_weight
from relay_tune.passes.base import Pass, PassConfig, call_op, map_functions, register_pass, retype, rewrite_dataflow

_DEFAULT_BLOCK = 8  # output block of bf16 dense products when layout planning is off (no target block known)


def _static_shape(expr: Expr) -> tuple[int, ...] | None:
    ty = expr.checked_type if expr.has_type() else None
    shape = getattr(ty, "shape", None)
    if shape is None or getattr(ty, "dtype", None) != "float32" or not all(isinstance(s, int) for s in shape):
        return None
    return tuple(int(s) for s in shape)


def _four(padding: object) -> list[int]:
    values = [int(p) for p in padding]  # type: ignore[attr-defined]
    return values * (4 // len(values)) if len(values) in (1, 2) else values


class _Rewriter:
    """Rewrites one function's products; casts of one value to bfloat16 are shared by all its products."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.casts: dict[int, Expr] = {}

    def bf16(self, value: Expr) -> Expr:
        cast = self.casts.get(id(value))
        if cast is None:
            cast = self.casts[id(value)] = call_op("cast", value, dtype="bfloat16")
        return cast

    def visit(self, orig: Expr, new: Expr) -> Expr:
        if not (isinstance(orig, Call) and isinstance(new, Call)) or _static_shape(orig) is None:
            return new
        if orig.op_name == "nn.contrib_conv2d_NCHWc":
            return self._blocked_conv(orig, new) or new
        if orig.op_name == "nn.dense":
            return self._dense(orig, new) or new
        return new

    def _blocked_conv(self, orig: Call, new: Call) -> Expr | None:
        attrs = orig.attrs
        weight = new.args[1]
        if int(attrs.get("groups", 1)) != 1 or tuple(int(d) for d in attrs.get("dilation", (1, 1))) != (1, 1) \
                or not isinstance(weight, Constant) or weight.data.ndim != 6 or weight.data.dtype != np.float32:
            return None
        ob, cb, kh, kw, bi, bo = weight.data.shape
        data_shape = _static_shape(orig.args[0])
        if bi % 2 or data_shape is None or len(data_shape) != 5 or data_shape[4] != bi:
            return None
        if str(attrs.get("out_layout", "")) not in ("", f"NCHW{bo}c"):
            return None
        oihw = weight.data.transpose(0, 5, 1, 4, 2, 3).reshape(ob * bo, cb * bi, kh, kw)
        packed = pack_bf16_weight(oihw, bi, bo)
        return call_op(BF16_CONV, self.bf16(new.args[0]), Constant(packed),
                       strides=tuple(int(s) for s in attrs.get("strides", (1, 1))),
                       padding=tuple(_four(attrs.get("padding", (0, 0)))))

    def _dense(self, orig: Call, new: Call) -> Expr | None:
        weight = new.args[1]
        rows = _static_shape(orig.args[0])
        if rows is None or len(rows) != 2 or not isinstance(weight, Constant) or weight.data.ndim != 2 \
                or weight.data.dtype != np.float32:
            return None
        m, k = rows
        n = int(weight.data.shape[0])
        block = self.block or _DEFAULT_BLOCK
        bo = next((b for b in (block, block // 2) if b >= _DEFAULT_BLOCK and n % b == 0), 0)
        bi = block if k % block == 0 else 2
        if not bo or k % 2:
            return None
        packed = pack_bf16_weight(weight.data.reshape(n, k, 1, 1), bi, bo)
        data = call_op("reshape", self.bf16(new.args[0]), newshape=(m, k // bi, 1, 1, bi))
        out = call_op(BF16_CONV, data, Constant(packed))
        return call_op("reshape", out, newshape=(m, n))


@register_pass
@dataclass(frozen=True)
class Bfloat16Products(Pass):
    """Rewrite float32 convolutions and dense products into bfloat16 products with float32 sums when
    `PassConfig.precision` is "bf16" (see the module docstring); a no-op otherwise."""

    name: ClassVar[str] = "Bfloat16Products"
    opt_level: ClassVar[int] = 0
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        if config.precision != "bf16":
            return mod

        def rewrite(func: Function) -> Function:
            result = rewrite_dataflow(func, _Rewriter(config.layout_block).visit)
            assert isinstance(result, Function)
            return result

        return retype(*map_functions(mod, rewrite))
