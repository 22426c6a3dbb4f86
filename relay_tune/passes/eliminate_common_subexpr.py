"""EliminateCommonSubexpr: compute each distinct operation once.

Two calls (or tuples, or projections) are the same computation when they apply the same callee with equal
attributes to the same argument values. The pass rebuilds the program bottom-up, so arguments are already
deduplicated when a node is looked at and comparing them by identity is enough; constant arguments of up to
`SMALL_CONSTANT_ELEMENTS` elements compare by value so that `add(%x, 1f)` written twice is found too.

Constant nodes themselves are never merged: a shared scalar literal would look like one value used by many groups
to operator fusion, which would then pass it as a parameter instead of inlining it. Every operator in relay-tune is
pure (inference-mode dropout included), so merging never changes results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from relay_tune.ir import Call, Constant, Expr, Function, GlobalVar, IRModule, Op, Tuple, TupleGetItem
from relay_tune.passes.base import Pass, PassConfig, map_functions, register_pass, retype, rewrite_dataflow

SMALL_CONSTANT_ELEMENTS = 64

_Key = tuple[object, ...]


def _operand_key(node: Expr) -> object:
    if isinstance(node, Constant) and node.data.size <= SMALL_CONSTANT_ELEMENTS:
        data = node.data
        return ("const", str(data.dtype), data.shape, data.tobytes())
    if isinstance(node, (Op, GlobalVar)):
        return (type(node).__name__, node.name)
    return id(node)


def _node_key(node: Expr) -> _Key | None:
    if isinstance(node, Call):
        return ("call", _operand_key(node.op), node.attrs, *(_operand_key(a) for a in node.args))
    if isinstance(node, Tuple):
        return ("tuple", *(_operand_key(f) for f in node.fields))
    if isinstance(node, TupleGetItem):
        return ("get", node.index, _operand_key(node.tuple_value))
    return None


def eliminate_common_subexpr(func: Function) -> Function:
    seen: dict[_Key, Expr] = {}

    def dedup(_orig: Expr, new: Expr) -> Expr:
        key = _node_key(new)
        if key is None:
            return new
        return seen.setdefault(key, new)

    new_func = rewrite_dataflow(func, dedup)
    assert isinstance(new_func, Function)
    return new_func


@register_pass
@dataclass(frozen=True)
class EliminateCommonSubexpr(Pass):
    name: ClassVar[str] = "EliminateCommonSubexpr"
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        new_mod, changed = map_functions(mod, eliminate_common_subexpr)
        return retype(new_mod, changed)
