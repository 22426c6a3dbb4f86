"""DeadCodeElimination: drop let bindings whose variable is never used (and, optionally, unused globals).

Graph-style bindings (`%5 = ...` in the text format) need nothing: an expression nobody refers to is simply not part
of the program. Let bindings are different because `let %v = value; body` keeps `value` alive even when `body`
never mentions `%v`.

Liveness is found in one forward sweep instead of repeated clean-ups: the value of a let is only explored once its
variable has been seen in live code, so a chain `let %a = ...; let %b = f(%a); body` where `body` ignores `%b`
loses both bindings at once. Every operator is pure, so removing unused computations never changes results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from relay_tune.ir import Expr, Function, GlobalVar, IRModule, Let, Var
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


def live_let_vars(root: Expr) -> set[int]:
    """Ids of the let-bound variables whose value is needed to compute `root`."""
    live_vars: set[int] = set()
    waiting: dict[int, list[Expr]] = {}  # id(let var) -> values to explore once that var is live
    seen: set[int] = set()
    stack: list[Expr] = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Var):
            if id(node) not in live_vars:
                live_vars.add(id(node))
                stack.extend(waiting.pop(id(node), ()))
        elif isinstance(node, Let):
            stack.append(node.body)
            if id(node.var) in live_vars:
                stack.append(node.value)
            else:
                waiting.setdefault(id(node.var), []).append(node.value)
        elif isinstance(node, Function):
            if not is_opaque_function(node):
                stack.append(node.body)
        else:
            stack.extend(node.children())
    return live_vars


def eliminate_dead_lets(func: Function) -> Function:
    if not any(isinstance(n, Let) for n in dataflow_post_order(func)):
        return func
    live = live_let_vars(func)

    def drop(_orig: Expr, new: Expr) -> Expr:
        if isinstance(new, Let) and id(new.var) not in live:
            return new.body
        return new

    new_func = rewrite_dataflow(func, drop)
    assert isinstance(new_func, Function)
    return new_func


def reachable_globals(mod: IRModule, entry: str = "main") -> set[str]:
    """Names of the global functions `entry` can call, directly or not (entry included)."""
    reached = {entry}
    work = [entry]
    while work:
        func = mod[work.pop()]
        for node in dataflow_post_order(func):
            # A global is reached whether it is called or passed around as a value.
            if isinstance(node, GlobalVar) and node.name in mod and node.name not in reached:
                reached.add(node.name)
                work.append(node.name)
    return reached


@register_pass
@dataclass(frozen=True)
class DeadCodeElimination(Pass):
    """Removes unused let bindings; with `remove_unused_globals`, also globals `main` never reaches."""

    remove_unused_globals: bool = False

    name: ClassVar[str] = "DeadCodeElimination"
    opt_level: ClassVar[int] = 1
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        new_mod, changed = map_functions(mod, eliminate_dead_lets)
        if self.remove_unused_globals and "main" in new_mod:
            keep = reachable_globals(new_mod)
            if len(keep) < len(new_mod):
                new_mod = IRModule({name: f for name, f in new_mod.items() if name in keep})
        return retype(new_mod, changed)
