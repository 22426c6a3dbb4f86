"""FoldConstant: evaluate, ahead of time, every computation whose inputs are all constants.

A node is *foldable* when it is
- a call of a registered operator that has a numpy reference, whose arguments are all constants or foldable, and
  whose static result is not much bigger than its inputs (the size rule below);
- a tuple whose fields are all constants or foldable; or
- a projection (`.i`) of a foldable tuple value.

Function parameters and let-bound variables are never constants (folding does not look through bindings), constant
leaves (scalars included) are kept exactly as they are, and calls of functions (fused primitives, globals) are not
evaluated.

Size rule: folding replaces a computation by its result, so a call that *creates* data (a broadcast of a scalar to a
large tensor, an outer product) would make the program bigger and slower to load. A call is folded only when its
result has at most as many elements as all of its tensor arguments together, or at most
`PassConfig.fold_small_result_elements` elements (4096 by default). Calls that fail the rule stay in the program and
their constant inputs are still folded.

The maximal foldable nodes (those used by something that is not foldable) are evaluated together by the reference
interpreter in one go, as the fields of one tuple, so shared constant subexpressions are computed once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, Tuple, TupleGetItem, TupleType, Type
from relay_tune.op.registry import get_op, has_op
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    dataflow_post_order,
    is_opaque_function,
    map_functions,
    register_pass,
    retype,
    rewrite_dataflow,
)


def _static_elements(ty: Type) -> int | None:
    """Total element count of a (possibly tuple) type with static shapes, else None."""
    if isinstance(ty, TensorType):
        return ty.size if ty.is_static else None
    if isinstance(ty, TupleType):
        total = 0
        for field_type in ty.fields:
            n = _static_elements(field_type)
            if n is None:
                return None
            total += n
        return total
    return None


def _is_static_value_type(ty: Type) -> bool:
    if isinstance(ty, TensorType):
        return ty.is_static
    if isinstance(ty, TupleType):
        return all(_is_static_value_type(f) for f in ty.fields)
    return False


def _operator_is_evaluable(call: Call) -> bool:
    name = call.op_name
    return name is not None and has_op(name) and get_op(name).reference is not None


def find_foldable(root: Expr, small_result_elements: int) -> set[int]:
    """Ids of the nodes under `root` that can be replaced by their value (see the module docstring)."""
    foldable: set[int] = set()

    def constant_like(node: Expr) -> bool:
        return isinstance(node, Constant) or id(node) in foldable

    for node in dataflow_post_order(root):
        if is_opaque_function(node) or not node.has_type():
            continue
        if not _is_static_value_type(node.checked_type):
            continue
        if isinstance(node, Call):
            if not _operator_is_evaluable(node) or not all(constant_like(a) for a in node.args):
                continue
            result = _static_elements(node.checked_type)
            inputs = sum(_static_elements(a.checked_type) or 0 for a in node.args if a.has_type())
            if result is None or (result > inputs and result > small_result_elements):
                continue
            foldable.add(id(node))
        elif isinstance(node, Tuple):
            if node.fields and all(constant_like(f) for f in node.fields):
                foldable.add(id(node))
        elif isinstance(node, TupleGetItem) and id(node.tuple_value) in foldable:
            foldable.add(id(node))
    return foldable


def _maximal(root: Expr, foldable: set[int]) -> list[Expr]:
    """Foldable nodes that some non-foldable node (or the function itself) uses, in evaluation order."""
    order = dataflow_post_order(root)
    candidates: list[Expr] = [root] if id(root) in foldable else []
    for node in order:
        if id(node) in foldable or is_opaque_function(node):
            continue
        candidates.extend(c for c in node.children() if id(c) in foldable)
    wanted: set[int] = set()
    while candidates:
        node = candidates.pop()
        if isinstance(node, Tuple):
            # A tuple literal is already a value; folding its fields is enough (and keeps constant leaves as they are).
            candidates.extend(f for f in node.fields if id(f) in foldable)
        else:
            wanted.add(id(node))
    return [n for n in order if id(n) in wanted]


def _to_expr(value: Any, ty: Type) -> Expr:
    """A constant (or tuple of constants) holding `value`, with the dtype the type checker gave the node."""
    if isinstance(ty, TupleType):
        values = tuple(value)
        return Tuple(tuple(_to_expr(v, t) for v, t in zip(values, ty.fields)))
    assert isinstance(ty, TensorType)
    arr = np.asarray(value)
    if str(arr.dtype) != ty.dtype:
        arr = arr.astype(ty.dtype)
    if arr.shape != tuple(ty.shape):
        raise RelayTuneError(
            f"constant folding produced shape {arr.shape} where type inference expects {tuple(ty.shape)}"
        )
    # The interpreter's result belongs to no one else: hand it over rather than copy it.
    return Constant.adopt(arr)


def evaluate_constants(exprs: list[Expr]) -> list[Any]:
    """Values of closed expressions (no free variables), computed together by the reference interpreter."""
    if not exprs:
        return []
    body: Expr = Tuple(tuple(exprs))
    result = evaluate(IRModule({"main": Function((), body)}), {}, entry="main")  # the interpreter type-checks it
    return list(result)


@register_pass
@dataclass(frozen=True)
class FoldConstant(Pass):
    name: ClassVar[str] = "FoldConstant"
    opt_level: ClassVar[int] = 2
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        new_mod, changed = map_functions(mod, lambda f: self._fold_function(f, config))
        return retype(new_mod, changed)

    def _fold_function(self, func: Function, config: PassConfig) -> Function:
        foldable = find_foldable(func, config.fold_small_result_elements)
        roots = [n for n in _maximal(func, foldable) if not isinstance(n, Function)]
        values = evaluate_constants(roots)
        replacement: dict[int, Expr] = {id(n): _to_expr(v, n.checked_type) for n, v in zip(roots, values)}

        def replace(orig: Expr, new: Expr) -> Expr:
            folded = replacement.get(id(orig))
            if folded is not None:
                return folded
            # `(a, b).0` is `a`: projections of tuple literals need no evaluation at all.
            if isinstance(new, TupleGetItem) and isinstance(new.tuple_value, Tuple):
                return new.tuple_value.fields[new.index]
            return new

        new_func = rewrite_dataflow(func, replace)
        assert isinstance(new_func, Function)
        return new_func
