"""FoldScaleAxis: fold a per-channel multiply into the weights of the convolution or dense layer that produces it.

After SimplifyInference and FoldConstant an inference batch norm is `add(multiply(conv2d(x, W), s), b)` with
constant `s` and `b` of shape `(C, 1, 1)`. Scaling output channel `c` of a convolution is the same as scaling its
filter `c`, so the multiply disappears:

    multiply(conv2d(x, W), s)  ->  conv2d(x, multiply(W, s'))      s' = s as (C, 1, 1, 1) along the kernel's O axis

and the following `add(..., b)` is left as a plain per-channel bias add, which fusion attaches to the convolution.
The next FoldConstant turns `multiply(W, s')` into a new weight constant. `nn.dense` works the same way along its
output (last) axis with `s'` of shape `(units, 1)`.

This is the backward half of TVM's FoldScaleAxis, applied to the producers that matter for inference networks.
The scale travels backwards through
- `add`/`subtract` of two scalable values (a residual sum of two convolutions: both get the scale),
- `add`/`subtract`/`nn.bias_add` of a constant (the bias is scaled too: `(y + b) * s = y * s + b * s`),
down to `nn.conv2d`/`nn.dense` leaves. A multiply is folded only when
- the scale is a constant that varies along the channel axis only (scalars fold too) and does not broadcast the
  result to a bigger shape,
- every node between the multiply and the leaves has the same shape as the multiply and no other user (otherwise
  another consumer would see the scaled value),
- the weights are constants, dtypes are floating point and layouts are plain (no blocked `NCHW4c` layouts).
Chains of multiplies are folded one per round; the pass repeats until nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, op
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    dataflow_post_order,
    float_constant_operand,
    map_functions,
    register_pass,
    retype,
    rewrite_dataflow,
    tensor_type_of,
    use_counts,
)

MAX_ROUNDS = 8

_BIAS_OPS = ("add", "subtract")


def _plain_layout(layout: str) -> bool:
    return layout.isalpha() and layout.isupper() and len(set(layout)) == len(layout)


def _is_constant_weight(weight: Expr) -> bool:
    """A constant, or a constant already scaled by an earlier round (`multiply(W, s)`, folded later)."""
    while isinstance(weight, Call) and weight.op_name == "multiply" and isinstance(weight.args[1], Constant):
        weight = weight.args[0]
    return isinstance(weight, Constant)


def _leaf_channel_axis(node: Call, out_type: TensorType) -> int | None:
    """Output channel axis of a conv2d/dense leaf, or None when its weight cannot absorb a scale.

    Only constant weights qualify: scaling a weight that arrives at run time would trade a multiply over the
    output for one over the (often larger) weight, instead of removing it.
    """
    name = node.op_name
    if not _is_constant_weight(node.args[1]):
        return None
    weight_type = tensor_type_of(node.args[1])
    if weight_type is None or not np.issubdtype(np.dtype(weight_type.dtype), np.floating):
        return None
    if weight_type.dtype != out_type.dtype:
        return None
    if name == "nn.conv2d":
        out_layout = node.attrs.get("out_layout") or node.attrs.get("data_layout", "NCHW")
        kernel_layout = node.attrs.get("kernel_layout", "OIHW")
        if not (_plain_layout(out_layout) and _plain_layout(kernel_layout)) or "C" not in out_layout:
            return None
        if "O" not in kernel_layout:
            return None
        return out_layout.index("C")
    if name == "nn.dense":
        return out_type.ndim - 1
    return None


@dataclass
class _Plan:
    """What one foldable multiply changes: scale vectors per leaf, scale constants per bias."""

    axis: int
    channels: int
    scale: Constant
    leaves: list[Call] = field(default_factory=list)
    biases: list[tuple[Call, int]] = field(default_factory=list)  # (add/subtract/bias_add, index of constant)

    def scale_vector(self) -> np.ndarray:
        return np.broadcast_to(self.scale.data.reshape(-1), (self.channels,))


def _scale_per_channel(scale: Constant, out_type: TensorType, axis: int) -> bool:
    """True when `scale` broadcast to `out_type` varies only along `axis` and does not enlarge the result."""
    shape = scale.data.shape
    if len(shape) > out_type.ndim:
        return False
    padded = (1,) * (out_type.ndim - len(shape)) + tuple(shape)
    for i, (s, d) in enumerate(zip(padded, out_type.shape)):
        if i == axis:
            if s not in (1, d):
                return False
        elif s != 1:
            return False
    return True


def _plan_multiply(
    mul: Call, uses: dict[int, int]
) -> tuple[_Plan, int] | None:
    """A plan for folding `mul` and the index of its scaled (non-constant) operand, or None."""
    found = float_constant_operand(mul) if mul.op_name == "multiply" else None
    if found is None:
        return None
    data_index, scale = found
    out_type = tensor_type_of(mul)

    leaves: list[Call] = []
    biases: list[tuple[Call, int]] = []
    axis: int | None = None
    stack: list[Expr] = [mul.args[data_index]]
    while stack:
        node = stack.pop()
        if not isinstance(node, Call) or uses.get(id(node), 0) != 1 or tensor_type_of(node) != out_type:
            return None
        name = node.op_name
        if name in ("nn.conv2d", "nn.dense"):
            leaf_axis = _leaf_channel_axis(node, out_type)
            if leaf_axis is None or (axis is not None and leaf_axis != axis):
                return None
            axis = leaf_axis
            leaves.append(node)
        elif name in _BIAS_OPS or name == "nn.bias_add":
            constants = [i for i, a in enumerate(node.args) if isinstance(a, Constant)]
            if len(constants) == 2:
                return None
            if name == "nn.bias_add" and constants != [1]:
                return None
            for i, arg in enumerate(node.args):
                if i not in constants:
                    stack.append(arg)
            biases.extend((node, i) for i in constants)
        else:
            return None
    if axis is None or not _scale_per_channel(scale, out_type, axis):
        return None
    channels = out_type.shape[axis]
    assert isinstance(channels, int)
    for bias_call, _ in biases:
        if bias_call.op_name == "nn.bias_add":
            bias_axis = int(bias_call.attrs.get("axis", 1))
            if bias_axis % out_type.ndim != axis:
                return None
    return _Plan(axis, channels, scale, leaves, biases), data_index


def _scaled_weight(leaf: Call, weight: Expr, vector: np.ndarray) -> Expr:
    weight_type = tensor_type_of(leaf.args[1])
    assert weight_type is not None
    if leaf.op_name == "nn.conv2d":
        o_axis = str(leaf.attrs.get("kernel_layout", "OIHW")).index("O")
    else:
        o_axis = 0
    shape = [1] * weight_type.ndim
    shape[o_axis] = vector.shape[0]
    factor = Constant(np.ascontiguousarray(vector.reshape(shape)).astype(weight_type.dtype))
    return Call(op("multiply"), (weight, factor))


def fold_scale_axis_once(func: Function) -> Function:
    uses = use_counts(func)
    skip_multiply: dict[int, int] = {}  # id(multiply) -> index of the operand that replaces it
    leaf_vectors: dict[int, np.ndarray] = {}
    bias_scales: dict[int, list[tuple[int, Expr]]] = {}
    for node in dataflow_post_order(func):
        if not isinstance(node, Call):
            continue
        planned = _plan_multiply(node, uses)
        if planned is None:
            continue
        plan, data_index = planned
        skip_multiply[id(node)] = data_index
        vector = plan.scale_vector()
        for leaf in plan.leaves:
            leaf_vectors[id(leaf)] = vector
        for bias_call, index in plan.biases:
            factor: Expr = plan.scale
            if bias_call.op_name == "nn.bias_add":
                factor = Constant(np.ascontiguousarray(vector))
            bias_scales.setdefault(id(bias_call), []).append((index, factor))
    if not skip_multiply:
        return func

    def apply(orig: Expr, new: Expr) -> Expr:
        if not isinstance(new, Call):
            return new
        key = id(orig)
        if key in skip_multiply:
            return new.args[skip_multiply[key]]
        if key in leaf_vectors:
            assert isinstance(orig, Call)
            weight = _scaled_weight(orig, new.args[1], leaf_vectors[key])
            return Call(new.op, (new.args[0], weight, *new.args[2:]), new.attrs, new.span)
        if key in bias_scales:
            args = list(new.args)
            for index, factor in bias_scales[key]:
                args[index] = Call(op("multiply"), (args[index], factor))
            return Call(new.op, tuple(args), new.attrs, new.span)
        return new

    new_func = rewrite_dataflow(func, apply)
    assert isinstance(new_func, Function)
    return new_func


@register_pass
@dataclass(frozen=True)
class FoldScaleAxis(Pass):
    name: ClassVar[str] = "FoldScaleAxis"
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        for _ in range(MAX_ROUNDS):
            new_mod, changed = map_functions(mod, fold_scale_axis_once)
            if not changed:
                break
            mod = retype(new_mod, changed)
        return mod
