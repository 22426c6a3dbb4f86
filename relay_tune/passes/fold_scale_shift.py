"""FoldScaleShift: merge a chain of element-wise multiplies and adds by constants into one multiply and one add.

Networks converted from Caffe2 follow every batch norm with a separate per-channel scale and shift (DenseNet-121's
`BatchNormalization` then `Mul` and `Add`), so after SimplifyInference the graph holds `((x * a + b) * c + d)`.
Where FoldScaleAxis cannot push the scales into a convolution's weights (a pre-activation batch norm reads a
concatenation, not a convolution), each of them stays an operation of the fused element-wise kernel. This pass
computes the chain's coefficients at compile time:

    ((x * a + b) * c + d)  ->  x * (a * c) + (b * c + d)

Every step of a chain is `multiply`, `add` or `subtract` of a non-constant operand and a `Constant` of the same
floating-point dtype, whose result has the non-constant operand's type (the constant broadcasts without
enlarging it); every step but the last has no other user. A chain of one step is left as it is. The merged
coefficients are computed in the tensor's dtype, so results may differ from the chain's in the last bits, as with
any reassociation (FoldScaleAxis does the same).

A dequantize is never merged: `(cast(q) - zero_point) * scale` of an integer `q` (and integral constants) computes
the integer difference exactly and rounds once, and a QuantizeLinear downstream rounds to an integer again, so a
last-bit change there moves results by a whole quantization step at ties (and such steps compound through a
network). The steps on the integer values stay as they are, and a chain may start only after the multiply by the
scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    call_op,
    float_constant_operand,
    map_functions,
    register_pass,
    retype,
    rewrite_dataflow,
    tensor_type_of,
    use_counts,
)

_AFFINE_OPS = ("multiply", "add", "subtract")


@dataclass(frozen=True)
class _Affine:
    """`base * scale + shift` (a None coefficient is absent: scale 1, shift 0)."""

    base: Expr
    scale: np.ndarray | None
    shift: np.ndarray | None

    def then(self, name: str, constant: np.ndarray, constant_first: bool) -> _Affine:
        """This value followed by `name` with `constant` (the first operand when `constant_first`)."""
        scale, shift = self.scale, self.shift
        if name == "multiply":
            return _Affine(self.base, constant if scale is None else scale * constant,
                           None if shift is None else shift * constant)
        if name == "add":
            return _Affine(self.base, scale, constant if shift is None else shift + constant)
        if constant_first:  # constant - value
            return _Affine(self.base, np.asarray(-1, constant.dtype) if scale is None else -scale,
                           constant if shift is None else constant - shift)
        return _Affine(self.base, scale, -constant if shift is None else shift - constant)

    def expr(self) -> Expr:
        out = self.base
        if self.scale is not None:
            out = call_op("multiply", out, Constant(np.ascontiguousarray(self.scale)))
        if self.shift is not None:
            out = call_op("add", out, Constant(np.ascontiguousarray(self.shift)))
        return out


def _step(node: Call) -> tuple[int, Constant] | None:
    """(index of the non-constant operand, the constant) when `node` is one step of a chain, else None."""
    if node.op_name not in _AFFINE_OPS:
        return None
    found = float_constant_operand(node)
    if found is None or tensor_type_of(node.args[found[0]]) != tensor_type_of(node):
        return None
    return found


def _integer_cast(node: Call) -> bool:
    """Whether `node` casts an integer tensor to a floating-point one (its values are integers)."""
    if node.op_name != "cast":
        return False
    source, result = tensor_type_of(node.args[0]), tensor_type_of(node)
    return (source is not None and result is not None and str(source.dtype).startswith(("int", "uint", "bool"))
            and str(result.dtype).startswith("float"))


def fold_scale_shift(func: Function) -> Function:
    """`func` with every chain of two or more constant multiplies and adds merged (see the module docstring)."""
    uses = use_counts(func)
    chains: dict[int, _Affine] = {}  # id(rewritten node) -> the chain it ends, when it is a step of one
    integral: set[int] = set()  # ids of rewritten nodes holding integer values: a dequantize's operand
    merged = False

    def apply(orig: Expr, new: Expr) -> Expr:
        nonlocal merged
        if not isinstance(orig, Call) or not isinstance(new, Call):
            return new
        if _integer_cast(orig):
            integral.add(id(new))
            return new
        step = _step(orig)
        if step is None:
            return new
        data_index, constant = step
        data = new.args[data_index]
        if id(data) in integral:  # a dequantize's steps on the integers: exact, and kept out of any chain
            if orig.op_name != "multiply" and bool(np.all(np.mod(constant.data, 1) == 0)):
                integral.add(id(new))
            return new
        inner = chains.get(id(data)) if uses.get(id(orig.args[data_index]), 0) == 1 else None
        chain = (inner or _Affine(data, None, None)).then(str(orig.op_name), constant.data, data_index == 1)
        if inner is None:
            chains[id(new)] = chain
            return new
        merged = True
        out = chain.expr()
        chains[id(out)] = chain
        return out

    out = rewrite_dataflow(func, apply)
    assert isinstance(out, Function)
    return out if merged else func


@register_pass
@dataclass(frozen=True)
class FoldScaleShift(Pass):
    name: ClassVar[str] = "FoldScaleShift"
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        return retype(*map_functions(mod, fold_scale_shift))
