"""QuantizedPooling: max pooling of dequantized 8-bit data runs on the 8-bit tensor.

A QDQ model (onnxruntime's static quantizer) pools in float between a DequantizeLinear and a QuantizeLinear:

    y = nn.max_pool2d(multiply(subtract(cast(q, "float32"), zp), s))      # q: uint8 or int8, s > 0

Dequantizing is non-decreasing in `q` (float rounding is monotonic too), so the maximum of the dequantized values is
the dequantized maximum, exactly:

    y = multiply(subtract(cast(nn.max_pool2d(q), "float32"), zp), s)

The pool then reads the 8-bit tensor (a quarter of the bytes) instead of a float copy made by a kernel of its own,
and the dequantize and the QuantizeLinear that follows are an elementwise epilogue of the pooling kernel after
fusion. The pass is in the default builds (opt_level 3): in ResNet-50's QDQ graph the vectorized 8-bit pool kernel
and the stem convolution whose epilogue now ends at its 8-bit cast both measured faster than with the float pool
(experiments/README.md, "Pooling kernels"). Padding: the float pool pads with -inf, the 8-bit one with the type's
smallest value; both never win a window that holds an input element, which every window does when each padding is
narrower than the undilated window and `ceil_mode` is off (the only pools taken). Global max pooling has no padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from relay_tune.ir import Call, Expr, Function, IRModule
from relay_tune.passes.base import Pass, PassConfig, call_op, map_functions, register_pass, retype, rewrite_dataflow
from relay_tune.passes.quantized_products import match_dequantized

_POOLS = ("nn.max_pool2d", "nn.global_max_pool2d")


def _every_window_holds_input(call: Call) -> bool:
    """Whether every window of the max pool `call` covers at least one input element (see the module docstring)."""
    if call.op_name == "nn.global_max_pool2d":
        return True
    attrs = call.attrs
    if bool(attrs.get("ceil_mode", False)) or any(int(d) != 1 for d in attrs.get("dilation", (1, 1))):  # type: ignore[union-attr]
        return False
    pool = [int(p) for p in attrs.get("pool_size")]  # type: ignore[union-attr]
    if len(pool) == 1:
        pool = pool * 2
    padding = [int(p) for p in attrs.get("padding", (0, 0))]  # type: ignore[union-attr]
    if len(padding) == 1:
        padding = padding * 4
    elif len(padding) == 2:
        padding = padding * 2
    return all(pad < pool[i % 2] for i, pad in enumerate(padding))


def pooled_quantized(orig: Call, new: Call) -> Expr | None:
    """The dequantized 8-bit max pool for a max pool `orig` (typed) of dequantized data, rebuilt from `new` (its
    copy with rewritten arguments); None when `orig` is anything else."""
    if orig.op_name not in _POOLS or not _every_window_holds_input(orig):
        return None
    if match_dequantized(orig.args[0]) is None:
        return None
    dequantize = new.args[0]
    # `multiply(subtract(cast(q), zp), s)` or `multiply(cast(q), s)`, as `match_dequantized` accepted it
    assert isinstance(dequantize, Call) and dequantize.op_name == "multiply"
    inner, scale = dequantize.args
    zero = None
    if isinstance(inner, Call) and inner.op_name == "subtract":
        inner, zero = inner.args
    assert isinstance(inner, Call) and inner.op_name == "cast"
    pooled = Call(orig.op, (inner.args[0],), orig.attrs)
    value: Expr = call_op("cast", pooled, dtype="float32")
    if zero is not None:
        value = call_op("subtract", value, zero)
    return call_op("multiply", value, scale)


@register_pass
@dataclass(frozen=True)
class QuantizedPooling(Pass):
    """Rewrite max pooling of dequantized 8-bit data into max pooling of the 8-bit data, dequantized after (exact;
    see the module docstring)."""

    name: ClassVar[str] = "QuantizedPooling"
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        new_mod, changed = map_functions(mod, self._rewrite_function)
        return retype(new_mod, changed)

    def _rewrite_function(self, func: Function) -> Function:
        def visit(orig: Expr, new: Expr) -> Expr:
            # match on the typed original (its arguments carry checked types); rebuild from the new arguments
            if isinstance(orig, Call) and isinstance(new, Call):
                rewritten = pooled_quantized(orig, new)
                if rewritten is not None:
                    return rewritten
            return new

        result = rewrite_dataflow(func, visit)
        assert isinstance(result, Function)
        return result
