"""Recursion-free traversal and rewriting of expression DAGs.

All walks use an explicit stack and visit each node object once, so shared subexpressions (the
`%N = ...` graph bindings of the text format) are processed once and deep programs are safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from relay_tune.ir.expr import Expr, Function, Let, Match, Var, pattern_vars


def post_order(root: Expr) -> list[Expr]:
    """Every node reachable from `root`, children before parents, each node once (by identity)."""
    order: list[Expr] = []
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        # push in reverse so that the first child is finished first (evaluation order)
        for child in reversed(node.children()):
            if id(child) not in seen:
                stack.append((child, False))
    return order


def pre_order(root: Expr) -> Iterator[Expr]:
    """Every reachable node, parents before children, each node once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(node.children()))


RewriteFn = Callable[[Expr, Expr], Expr]


def rewrite(root: Expr, fn: RewriteFn, memo: dict[int, Expr] | None = None) -> Expr:
    """Rebuild `root` bottom-up.

    For each node (post-order), its children are replaced by their rewritten versions, giving
    `updated` (the very same object when no child changed), and `fn(original, updated)` returns
    the node's replacement. Shared nodes are rewritten once, so sharing survives.
    """
    mapped: dict[int, Expr] = memo if memo is not None else {}
    for node in post_order(root):
        if id(node) in mapped:
            continue
        children = node.children()
        if children:
            new_children = [mapped.get(id(c), c) for c in children]
            changed = any(n is not c for n, c in zip(new_children, children))
            updated = node.with_children(new_children) if changed else node
        else:
            updated = node
        mapped[id(node)] = fn(node, updated)
    return mapped[id(root)]


def substitute(root: Expr, mapping: dict[Var, Expr]) -> Expr:
    """Replace free occurrences of variables (by identity)."""
    if not mapping:
        return root
    return rewrite(root, lambda _orig, new: mapping.get(new, new) if isinstance(new, Var) else new)


def free_vars(root: Expr) -> list[Var]:
    """Variables used but not bound inside `root`, in first-use (post-order) order."""
    bound: set[int] = set()
    for node in post_order(root):
        if isinstance(node, Function):
            bound.update(id(p) for p in node.params)
        elif isinstance(node, Let):
            bound.add(id(node.var))
        elif isinstance(node, Match):
            bound.update(id(v) for pattern, _body in node.clauses for v in pattern_vars(pattern))
    result: list[Var] = []
    for node in post_order(root):
        if isinstance(node, Var) and id(node) not in bound:
            result.append(node)
    return result


def count_nodes(root: Expr) -> int:
    return len(post_order(root))
