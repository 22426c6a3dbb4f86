"""CombineSiblingProducts: products that read the same input with the same attributes, computed as one.

Two or more `nn.dense` calls on the same data value (the same node: EliminateCommonSubexpr and
StridedRowConvAsFrames share equal values), or plain NCHW / OIHW `nn.conv2d` calls with one group on the same data
value, with equal attributes apart from their output channels and constant weights of one dtype and equal shapes
past the output axis, become one call whose weight is the siblings' weights concatenated along the output axis; each
sibling is then a `strided_slice` of its channels. The input is read once instead of once per sibling, and one
kernel call replaces several: an STFT's real and imaginary convolutions (257 + 257 channels over the same frames), a
transformer's query, key and value projections where they have no bias.

A product with an elementwise or broadcast consumer (a bias, an activation, a folded batch norm: what FuseOps puts
into the product's kernel as its epilogue) is not combined: behind a slice that epilogue would become a kernel of
its own, one more pass over the output, which costs about what reading the shared input once more saves (it also
leaves the biased query, key and value projections and an Inception block's 1x1 convolutions with their batch norms
alone). The products this takes are those followed by layout changes (the frames product of an STFT, reshaped back
to NCHW; bias-free projections reshaped into attention heads).

The pass runs after PlanLayouts: a convolution planned in a blocked layout (`NCHW8c`) is not plain and is left
alone, since a channel slice of a blocked result is not planned and would cost layout transforms. Calls with
different strides, padding, dilation, groups, kernel sizes, layouts or output dtypes, run-time (non-constant)
weights, or weights of different dtypes are not combined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule
from relay_tune.op.registry import OpPattern, get_op
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    call_op,
    dataflow_post_order,
    is_opaque_function,
    map_functions,
    register_pass,
    retype,
    rewrite_dataflow,
    tensor_type_of,
)
from relay_tune.passes.conv_geometry import plain_conv2d_types

_CHANNEL_ATTR = {"nn.dense": "units", "nn.conv2d": "channels"}


def _group_key(call: Call) -> tuple[object, ...] | None:
    """What siblings must share to be combined (the attributes but the output channels, the weight's dtype and its
    shape past the output axis), or None where `call` is not a product this pass combines."""
    name = call.op_name
    if name not in _CHANNEL_ATTR or not isinstance(call.args[1], Constant):
        return None
    data, out = tensor_type_of(call.args[0]), tensor_type_of(call)
    weight = call.args[1].data
    if data is None or out is None or not np.issubdtype(np.dtype(out.dtype), np.floating):
        return None
    if name == "nn.conv2d" and (plain_conv2d_types(call) is None or int(call.attrs["groups"]) != 1):  # type: ignore[call-overload]
        return None
    if name == "nn.dense" and weight.ndim != 2:
        return None
    attrs = tuple(sorted((k, repr(v)) for k, v in call.attrs.items() if k != _CHANNEL_ATTR[name]))
    return (name, attrs, str(weight.dtype), weight.shape[1:], out.dtype)


def _is_epilogue(node: Expr) -> bool:
    """Whether `node` is a call FuseOps would fuse into a product's kernel as its epilogue."""
    return (isinstance(node, Call) and node.op_name is not None
            and get_op(node.op_name).pattern <= OpPattern.BROADCAST)


def _siblings(func: Function) -> list[list[Call]]:
    """Groups of two or more calls this pass combines, each in post order (an input before its consumers)."""
    order = dataflow_post_order(func)
    with_epilogue: set[int] = set()
    for node in order:
        if _is_epilogue(node):
            with_epilogue.update(id(arg) for arg in node.children())
    groups: dict[tuple[object, ...], list[Call]] = {}
    for node in order:
        if isinstance(node, Call) and not is_opaque_function(node) and id(node) not in with_epilogue:
            key = _group_key(node)
            if key is not None:
                groups.setdefault((id(node.args[0]), *key), []).append(node)
    return [calls for calls in groups.values() if len(calls) > 1]


def _combined(calls: list[Call], data: Expr) -> list[Expr]:
    """Per sibling its slice of the one product of all of them over `data` (their data argument, rewritten)."""
    first = calls[0]
    name = first.op_name
    assert name is not None
    weights = [c.args[1].data for c in calls]  # type: ignore[attr-defined]  # constants: checked by `_group_key`
    attrs = dict(first.attrs.items())
    attrs[_CHANNEL_ATTR[name]] = sum(int(w.shape[0]) for w in weights)
    product = call_op(name, data, Constant(np.concatenate(weights, axis=0)), **attrs)
    out_shape = [int(d) for d in tensor_type_of(first).shape]  # type: ignore[union-attr]
    axis = 1 if name == "nn.conv2d" else len(out_shape) - 1  # the output channels: NCHW's C, dense's last axis
    slices: list[Expr] = []
    start = 0
    for weight in weights:
        stop = start + int(weight.shape[0])
        begin, end = [0] * len(out_shape), list(out_shape)
        begin[axis], end[axis] = start, stop
        slices.append(call_op("strided_slice", product, begin=begin, end=end))
        start = stop
    return slices


def combine_sibling_products(func: Function) -> Function:
    """`func` with every group of sibling products combined (see the module docstring)."""
    groups = _siblings(func)
    if not groups:
        return func
    group_of = {id(call): (index, position)
                for index, calls in enumerate(groups) for position, call in enumerate(calls)}
    built: dict[int, list[Expr]] = {}

    def replace(orig: Expr, new: Expr) -> Expr:
        found = group_of.get(id(orig))
        if found is None:
            return new
        index, position = found
        if index not in built:
            # Every sibling's data argument is the same node, rewritten once: the first sibling met supplies it.
            assert isinstance(new, Call)
            built[index] = _combined(groups[index], new.args[0])
        return built[index][position]

    new_func = rewrite_dataflow(func, replace)
    assert isinstance(new_func, Function)
    return new_func


@register_pass
@dataclass(frozen=True)
class CombineSiblingProducts(Pass):
    name: ClassVar[str] = "CombineSiblingProducts"
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        new_mod, changed = map_functions(mod, combine_sibling_products)
        return retype(new_mod, changed)
