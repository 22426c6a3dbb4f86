"""Value trees of the graph plan: a model value is a value number or a (nested) tuple of them, as its type is a
tensor type or a (nested) tuple type."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relay_tune.errors import UnsupportedError
from relay_tune.ir import Constant, Expr, TensorType, TupleType, Type
from relay_tune.runtime.model import OutputTree


def nbytes(shape: Sequence[int], dtype: str) -> int:
    """Bytes of a dense tensor of `shape` and `dtype`."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def flatten(tree: OutputTree) -> list[int]:
    """The value numbers of a value tree, left to right."""
    out: list[int] = []
    stack: list[OutputTree] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple):
            stack.extend(reversed(node))
        else:
            out.append(node)
    return out


def flatten_types(ty: Type | None) -> list[TensorType]:
    """The tensor types of a (nested) tuple type, left to right; each must have a static shape."""
    out: list[TensorType] = []
    stack: list[Type | None] = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(reversed(t.fields))
        elif isinstance(t, TensorType) and t.is_static:
            out.append(t)
        else:
            raise UnsupportedError(f"compiled models handle tensors of static shape and tuples of them, not {t}")
    return out


def structure(ty: Type | None, leaves: list[int]) -> OutputTree:
    """The value tree of type `ty` over value numbers `leaves` (in `flatten` order)."""
    queue = list(leaves)

    def build(t: Type | None) -> OutputTree:
        if isinstance(t, TupleType):
            return tuple(build(f) for f in t.fields)
        return queue.pop(0)

    return build(ty)


def constant_leaf(call_args: Sequence[Expr], leaf_index: int) -> Constant | None:
    """The constant that flattened argument `leaf_index` of a call is, if it is one."""
    position = 0
    for arg in call_args:
        ty = arg.checked_type if arg.has_type() else None
        width = len(flatten_types(ty)) if ty is not None else 1
        if leaf_index < position + width:
            return arg if isinstance(arg, Constant) and width == 1 else None
        position += width
    return None
