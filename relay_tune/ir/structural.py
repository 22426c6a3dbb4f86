"""Structural equality (alpha-equivalence) and hashing of expressions, without recursion.

Rules:
- Constants compare by dtype, shape and bytes; operators and globals by name.
- A variable bound by a `Function` parameter or a `Let` on the left matches the variable at the same
  binding site on the right (names do not matter, type annotations do). Free variables match only
  themselves, unless `map_free_vars=True` (then the first free occurrence pairs them up).
- Hashing is consistent with that: a variable contributes its type annotation, never its name or
  identity, so alpha-equivalent terms hash alike.

Both walks are explicit-stack loops and memoise on node identity, so shared sub-DAGs are visited once
and 10,000-deep let chains are fine.
"""

from __future__ import annotations

import numpy as np

from relay_tune.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Op,
    Tuple,
    TupleGetItem,
    Var,
)

_SMALL_CONSTANT = 4096  # constants up to this many elements hash their bytes too


def _local_hash(node: Expr) -> int:
    """Hash of a node's own (non-child) data."""
    if isinstance(node, Var):
        return hash(("Var", node.type_annotation))
    if isinstance(node, GlobalVar):
        return hash(("GlobalVar", node.name))
    if isinstance(node, Op):
        return hash(("Op", node.name))
    if isinstance(node, Constant):
        data = node.data
        extra = data.tobytes() if data.size <= _SMALL_CONSTANT else b""
        return hash(("Constant", data.shape, str(data.dtype), extra))
    if isinstance(node, Call):
        return hash(("Call", node.attrs, len(node.args)))
    if isinstance(node, Tuple):
        return hash(("Tuple", len(node.fields)))
    if isinstance(node, TupleGetItem):
        return hash(("TupleGetItem", node.index))
    if isinstance(node, Let):
        return hash("Let")
    if isinstance(node, If):
        return hash("If")
    if isinstance(node, Function):
        return hash(("Function", node.ret_type, node.attrs, len(node.params), node.type_params))
    return hash(type(node).__name__)


def structural_hash(root: Expr) -> int:
    cached = getattr(root, "_hash_cache", None)
    if cached is not None:
        return cached
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if getattr(node, "_hash_cache", None) is not None:
            continue
        children = node.children()
        if not expanded and children:
            stack.append((node, True))
            stack.extend((c, False) for c in children if getattr(c, "_hash_cache", None) is None)
            continue
        h = hash((_local_hash(node), tuple(_child_hash(c) for c in children)))
        object.__setattr__(node, "_hash_cache", h)
    return root._hash_cache  # type: ignore[attr-defined,no-any-return]


def _child_hash(node: Expr) -> int:
    # Vars are leaves whose cache is the same value every time; computing it inline keeps
    # the main loop simple.
    cached = getattr(node, "_hash_cache", None)
    if cached is None:
        cached = hash((_local_hash(node), ()))
        object.__setattr__(node, "_hash_cache", cached)
    return cached  # type: ignore[no-any-return]


def structural_equal(lhs: Expr, rhs: Expr, map_free_vars: bool = False) -> bool:
    """True when `lhs` and `rhs` are the same program up to renaming of bound variables."""
    var_map: dict[int, Var] = {}  # id(lhs var) -> rhs var it is bound to
    mapped_to: set[int] = set()  # ids of rhs vars already paired with some lhs var
    done: set[tuple[int, int]] = set()
    stack: list[tuple[Expr, Expr]] = [(lhs, rhs)]
    while stack:
        a, b = stack.pop()
        key = (id(a), id(b))
        if key in done:
            continue
        done.add(key)
        if type(a) is not type(b):
            return False
        if isinstance(a, Var):
            assert isinstance(b, Var)
            bound = var_map.get(id(a))
            if bound is not None:
                if bound is not b:
                    return False
                continue
            if a is b:
                continue
            if not map_free_vars or id(b) in mapped_to:
                return False
            if a.type_annotation != b.type_annotation:
                return False
            var_map[id(a)] = b
            mapped_to.add(id(b))
            continue
        if not _local_equal(a, b, var_map):
            return False
        ca, cb = a.children(), b.children()
        if len(ca) != len(cb):
            return False
        stack.extend(reversed(list(zip(ca, cb))))
    return True


def _bind(a: Var, b: Var, var_map: dict[int, Var]) -> bool:
    if a.type_annotation != b.type_annotation:
        return False
    var_map[id(a)] = b
    return True


def _local_equal(a: Expr, b: Expr, var_map: dict[int, Var]) -> bool:
    if isinstance(a, (GlobalVar, Op)):
        return a.name == b.name  # type: ignore[attr-defined]
    if isinstance(a, Constant):
        assert isinstance(b, Constant)
        da, db = a.data, b.data
        if da.dtype != db.dtype or da.shape != db.shape:
            return False
        return bool(np.array_equal(da, db, equal_nan=da.dtype.kind == "f"))
    if isinstance(a, Call):
        assert isinstance(b, Call)
        return a.attrs == b.attrs and len(a.args) == len(b.args)
    if isinstance(a, Tuple):
        assert isinstance(b, Tuple)
        return len(a.fields) == len(b.fields)
    if isinstance(a, TupleGetItem):
        assert isinstance(b, TupleGetItem)
        return a.index == b.index
    if isinstance(a, Let):
        assert isinstance(b, Let)
        return _bind(a.var, b.var, var_map)
    if isinstance(a, Function):
        assert isinstance(b, Function)
        if (
            len(a.params) != len(b.params)
            or a.ret_type != b.ret_type
            or a.attrs != b.attrs
            or a.type_params != b.type_params
        ):
            return False
        return all(_bind(pa, pb, var_map) for pa, pb in zip(a.params, b.params))
    return True  # If: no local data


def short_repr(node: Expr) -> str:
    """A one-line description for debugging; the text printer gives the full program."""
    if isinstance(node, Var):
        ann = f": {node.type_annotation}" if node.type_annotation is not None else ""
        return f"%{node.name_hint}{ann}"
    if isinstance(node, GlobalVar):
        return f"@{node.name}"
    if isinstance(node, Op):
        return node.name
    if isinstance(node, Constant):
        if node.data.ndim == 0:
            return f"{node.data.item()!r}:{node.data.dtype}"
        return f"Constant({node.data.shape}, {node.data.dtype})"
    if isinstance(node, Call):
        return f"Call({short_repr(node.op)}, {len(node.args)} args)"
    if isinstance(node, Tuple):
        return f"Tuple({len(node.fields)} fields)"
    if isinstance(node, TupleGetItem):
        return f"TupleGetItem(.{node.index})"
    if isinstance(node, Function):
        return f"Function({len(node.params)} params)"
    return type(node).__name__
