"""The numpy reference interpreter: the correctness oracle for everything the compiler produces.

`evaluate(mod, inputs)` runs a module's entry function on numpy arrays, calling each operator's
numpy reference (`OpDef.reference`). Values are numpy arrays, tuples of values, and closures
(function values: global functions, `fn` literals including fused `Primitive=1` functions).

How a function body is evaluated
--------------------------------
A body is compiled once into a *plan*: a flat list of steps in evaluation order, built with an
explicit stack (no recursion over expression depth):

- EVAL a node (an operator call, a tuple, a projection, a constant, a function value, a call);
- BIND a `let` variable once its value is ready (the body comes after);
- LET: a `let` node's value is its body's value.

The walk stops at function literals (their bodies run when called) and at `if` branches (only the
branch taken runs, in a plan of its own; evaluating both could recurse forever). Variables are not
steps: they are looked up in the environment when used.

For each step the plan also lists the intermediate values whose last use it is, and the executor
drops them right after, so a ResNet-50 run only holds the activations still needed. Calls between
functions recurse in Python (depth = call depth, not expression depth).

Every operator result is checked against the type inferred for its call, so a reference that
disagrees with its type relation is caught at once.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from relay_tune.errors import RelayTuneError, RelayTypeError, UnsupportedError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.expr import (
    Call,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    Tuple,
    TupleGetItem,
    Var,
)
from relay_tune.ir.module import IRModule
from relay_tune.ir.traversal import free_vars
from relay_tune.ir.types import ANY, FuncType, TensorType, TupleType, Type, TypeVar
from relay_tune.op.registry import get_op
from relay_tune.type_infer import infer_types

__all__ = ["ADTValue", "Closure", "InputError", "Interpreter", "ReferenceMismatchError", "Value", "evaluate"]


@dataclass(frozen=True, eq=False)
class Closure:
    """A function value: the function and the values of its free variables when it was created."""

    func: Function
    captured: dict[Var, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        params = ", ".join(f"%{p.name_hint}" for p in self.func.params)
        return f"Closure(fn ({params}))"


@dataclass(frozen=True, eq=False)
class ADTValue:
    """A value of an algebraic data type: the constructor that made it and its fields."""

    constructor: Constructor
    fields: tuple[Any, ...]

    @property
    def tag(self) -> int:
        return self.constructor.tag

    def __repr__(self) -> str:
        return f"{self.constructor.name}({', '.join(map(repr, self.fields))})"


Value = Union[np.ndarray, tuple, Closure, ADTValue]  # noqa: UP007 (a runtime alias, kept readable)


class InputError(RelayTypeError):
    """The inputs given to `evaluate` do not fit the entry function's parameters."""


class ReferenceMismatchError(RuntimeError):
    """An operator's numpy reference returned a value that contradicts its type relation (a bug)."""


# ================================================================================================
# Plans
# ================================================================================================

_EVAL, _BIND, _LET = 0, 1, 2
_UseKey = Union[int, Var]  # noqa: UP007  id(node) for node values, the Var itself for let-bound variables


@dataclass
class _Plan:
    root: Expr
    steps: list[tuple[int, Expr]]
    frees: list[list[_UseKey]]  # frees[i]: values whose last use is step i


def _step_uses(kind: int, node: Expr, fv_cache: dict[int, list[Var]]) -> list[Expr]:
    """The expressions whose values step (kind, node) reads."""
    if kind == _BIND:
        assert isinstance(node, Let)
        return [node.value]
    if kind == _LET:
        assert isinstance(node, Let)
        return [node.body]
    if isinstance(node, Call):
        callee = [] if isinstance(node.op, Op) else [node.op]
        return [*callee, *node.args]
    if isinstance(node, Tuple):
        return list(node.fields)
    if isinstance(node, TupleGetItem):
        return [node.tuple_value]
    if isinstance(node, If):
        # The branch runs in its own plan but reads this scope's variables.
        branches = (node.true_branch, node.false_branch)
        return [node.cond, *(v for b in branches for v in _free_vars_cached(b, fv_cache))]
    if isinstance(node, Match):
        # Each clause runs in its own plan, like a branch of `if`.
        return [node.data, *(v for _p, body in node.clauses for v in _free_vars_cached(body, fv_cache))]
    if isinstance(node, Function):
        return list(_free_vars_cached(node, fv_cache))
    return []


def _free_vars_cached(expr: Expr, cache: dict[int, list[Var]]) -> list[Var]:
    fvs = cache.get(id(expr))
    if fvs is None:
        fvs = cache[id(expr)] = free_vars(expr)
    return fvs


def _compile_plan(root: Expr, fv_cache: dict[int, list[Var]]) -> _Plan:
    steps: list[tuple[int, Expr]] = []
    seen: set[int] = set()
    # Stack entries: (node, phase). Phase 0 = first visit; other phases emit steps.
    stack: list[tuple[Expr, int]] = [(root, 0)]
    while stack:
        node, phase = stack.pop()
        if phase == 0:
            if id(node) in seen or isinstance(node, (Var, Op)):
                continue
            seen.add(id(node))
            if isinstance(node, Let):
                stack += [(node, _LET + 10), (node.body, 0), (node, _BIND + 10), (node.value, 0)]
            elif isinstance(node, If):
                stack += [(node, _EVAL + 10), (node.cond, 0)]
            elif isinstance(node, Match):
                stack += [(node, _EVAL + 10), (node.data, 0)]
            elif isinstance(node, Function):
                steps.append((_EVAL, node))
            else:
                stack.append((node, _EVAL + 10))
                stack.extend((child, 0) for child in reversed(node.children()))
        else:
            steps.append((phase - 10, node))

    let_vars = {id(node.var) for kind, node in steps if kind == _BIND}  # type: ignore[attr-defined]
    last_use: dict[_UseKey, int] = {}
    for index, (kind, node) in enumerate(steps):
        for used in _step_uses(kind, node, fv_cache):
            if isinstance(used, Var):
                if id(used) in let_vars:
                    last_use[used] = index
            elif not isinstance(used, Op):
                last_use[id(used)] = index
    last_use.pop(root if isinstance(root, Var) else id(root), None)  # the result outlives the plan
    frees: list[list[_UseKey]] = [[] for _ in steps]
    for key, index in last_use.items():
        frees[index].append(key)
    return _Plan(root, steps, frees)


# ================================================================================================
# The interpreter
# ================================================================================================


class Interpreter:
    """Evaluates functions of a module on numpy arrays. The module is type-checked on construction."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = infer_types(mod)
        self._plans: dict[int, _Plan] = {}
        self._free_vars: dict[int, list[Var]] = {}
        self._attrs: dict[tuple[str, Attrs], Attrs] = {}
        self._globals: dict[str, Closure] = {}

    # --- public API ---------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, Any] | Sequence[Any] = (), entry: str = "main") -> Value:
        """Run `entry` on `inputs` (by parameter name, or positionally) and return its value."""
        if entry not in self.mod:
            raise InputError(f"the module has no function @{entry} (it has {', '.join('@' + n for n in self.mod)})")
        func = self.mod[entry]
        args = self._check_inputs(func, inputs, entry)
        return self.call(self.global_closure(entry), args)

    def call(self, closure: Closure, args: Sequence[Value]) -> Value:
        """Apply a function value to argument values."""
        func = closure.func
        if len(args) != len(func.params):
            raise InputError(f"function takes {len(func.params)} argument(s), got {len(args)}")
        env: MutableMapping[Var, Value] = ChainMap(dict(zip(func.params, args)), closure.captured)
        return self._run(func.body, env)

    def global_closure(self, name: str) -> Closure:
        closure = self._globals.get(name)
        if closure is None:
            closure = self._globals[name] = Closure(self.mod[name])
        return closure

    # --- evaluation ---------------------------------------------------------------------------
    def _plan(self, root: Expr) -> _Plan:
        plan = self._plans.get(id(root))
        if plan is None or plan.root is not root:
            plan = self._plans[id(root)] = _compile_plan(root, self._free_vars)
        return plan

    def _run(self, root: Expr, env: MutableMapping[Var, Value]) -> Value:
        plan = self._plan(root)
        memo: dict[int, Value] = {}

        def get(node: Expr) -> Value:
            if isinstance(node, Var):
                try:
                    return env[node]
                except KeyError:
                    raise UnsupportedError(f"variable %{node.name_hint} has no value here (unbound)") from None
            return memo[id(node)]

        for index, (kind, node) in enumerate(plan.steps):
            if kind == _EVAL:
                memo[id(node)] = self._eval(node, get, env)
            elif kind == _BIND:
                assert isinstance(node, Let)
                value = get(node.value)
                env[node.var] = value
                if isinstance(value, Closure) and node.var in self._free_vars.get(id(value.func), ()):
                    value.captured[node.var] = value  # a recursive local function refers to itself
            else:
                assert isinstance(node, Let)
                memo[id(node)] = get(node.body)
            for key in plan.frees[index]:
                if isinstance(key, Var):
                    env.pop(key, None)
                else:
                    memo.pop(key, None)
        return get(plan.root)

    def _eval(self, node: Expr, get: Any, env: MutableMapping[Var, Value]) -> Value:
        if isinstance(node, Constant):
            return node.data
        if isinstance(node, Call):
            args = [get(a) for a in node.args]
            if isinstance(node.op, Op):
                return self._apply_op(node, node.op.name, args)
            callee = get(node.op)
            if isinstance(callee, Constructor):
                return ADTValue(callee, tuple(args))
            if not isinstance(callee, Closure):
                raise UnsupportedError(f"cannot call a value of type {type(callee).__name__}")
            return self.call(callee, args)
        if isinstance(node, Tuple):
            return tuple(get(f) for f in node.fields)
        if isinstance(node, TupleGetItem):
            return get(node.tuple_value)[node.index]
        if isinstance(node, Function):
            fvs = _free_vars_cached(node, self._free_vars)
            # A variable not bound yet can only be the `let` this function is the value of (recursion);
            # it is filled in when that `let` binds.
            return Closure(node, {v: env[v] for v in fvs if v in env})
        if isinstance(node, GlobalVar):
            return self.global_closure(node.name)
        if isinstance(node, Constructor):
            return node  # a constructor is a function value: calling it builds an `ADTValue`
        if isinstance(node, Match):
            value = get(node.data)
            for pattern, body in node.clauses:
                bound: dict[Var, Value] = {}
                if _matches(pattern, value, bound):
                    return self._run(body, ChainMap(bound, env))
            raise RelayTuneError(f"no clause of the match{_at(node)} applies to {value!r}")
        if isinstance(node, If):
            cond = np.asarray(get(node.cond))
            branch = node.true_branch if bool(cond.reshape(())) else node.false_branch
            return self._run(branch, ChainMap({}, env))
        raise UnsupportedError(f"the interpreter cannot evaluate {type(node).__name__} nodes")

    def _apply_op(self, call: Call, name: str, args: list[Value]) -> Value:
        opdef = get_op(name)
        if opdef.reference is None:
            raise UnsupportedError(f"operator `{name}` has no numpy reference implementation")
        key = (name, call.attrs)
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = self._attrs[key] = opdef.make_attrs(call.attrs)
        try:
            result = _as_value(opdef.reference(args, attrs))
        except MemoryError as err:
            # A well-typed program can still need more memory than this machine has (a pooling window padded to
            # 2^31 columns): that is the program's size, said as such, not a crash of the interpreter.
            where = f" at {call.span}" if call.span is not None else ""
            raise RelayTuneError(f"`{name}`{where}: the reference interpreter ran out of memory evaluating it "
                                 f"({err})") from None
        if call.has_type():
            problem = _mismatch(result, call.checked_type)
            if problem:
                where = f" at {call.span}" if call.span is not None else ""
                raise ReferenceMismatchError(
                    f"the reference of `{name}`{where} returned {problem}; its type relation says "
                    f"{call.checked_type}"
                )
        return result

    # --- inputs -------------------------------------------------------------------------------
    def _check_inputs(self, func: Function, inputs: Mapping[str, Any] | Sequence[Any], entry: str) -> list[Value]:
        params = func.params
        if isinstance(inputs, Mapping):
            names = [p.name_hint for p in params]
            missing = [n for n in names if n not in inputs]
            unknown = [n for n in inputs if n not in names]
            if missing or unknown:
                parts = []
                if missing:
                    parts.append(f"missing input(s) {', '.join('%' + n for n in missing)}")
                if unknown:
                    parts.append(f"unknown input(s) {', '.join(map(repr, unknown))}")
                raise InputError(f"@{entry}: {'; '.join(parts)} (parameters: {', '.join('%' + n for n in names)})")
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
            if len(values) != len(params):
                raise InputError(f"@{entry} takes {len(params)} input(s), got {len(values)}")
        # After type inference every parameter has its type (inferred ones included).
        return [
            _coerce_input(value, p.checked_type, f"@{entry}: input %{p.name_hint}") for p, value in zip(params, values)
        ]


def _matches(pattern: Pattern, value: Value, bound: dict[Var, Value]) -> bool:
    """Whether `value` matches `pattern`; the variables it binds go into `bound`."""
    if isinstance(pattern, PatternVar):
        bound[pattern.var] = value
        return True
    if isinstance(pattern, PatternConstructor):
        return (isinstance(value, ADTValue) and value.tag == pattern.constructor.tag
                and all(_matches(p, v, bound) for p, v in zip(pattern.patterns, value.fields)))
    if isinstance(pattern, PatternTuple):
        return all(_matches(p, v, bound) for p, v in zip(pattern.patterns, value))  # type: ignore[arg-type]
    return True  # wildcard


def _at(node: Expr) -> str:
    span = getattr(node, "span", None)
    return f" at {span}" if span is not None else ""


def _coerce_input(value: Any, ty: Type | None, what: str) -> Value:
    """Check an input against its parameter type; plain Python numbers/lists are converted."""
    if ty is None or isinstance(ty, (TypeVar, FuncType)):
        return value
    if isinstance(ty, TupleType):
        if not isinstance(value, (tuple, list)) or len(value) != len(ty.fields):
            raise InputError(f"{what}: expected a tuple of {len(ty.fields)} values ({ty})")
        return tuple(_coerce_input(v, t, f"{what}.{i}") for i, (v, t) in enumerate(zip(value, ty.fields)))
    if not isinstance(ty, TensorType):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        # numpy values say what dtype they are, so a different one is a mistake, not something to cast.
        array = np.asarray(value)
        if str(array.dtype) != ty.dtype:
            raise InputError(f"{what}: expected dtype {ty.dtype} ({ty}), got an array of dtype {array.dtype}")
    elif isinstance(value, (int, float, bool, list, tuple)):
        array = np.asarray(value, dtype=ty.dtype)
    else:
        raise InputError(f"{what}: expected an array for {ty}, got {type(value).__name__}")
    if array.ndim != ty.ndim or any(d is not ANY and d != s for d, s in zip(ty.shape, array.shape)):
        raise InputError(f"{what}: expected shape {_shape_str(ty.shape)} ({ty}), got {array.shape}")
    return array


def _shape_str(shape: Sequence[Any]) -> str:
    return "(" + ", ".join("?" if d is ANY else str(d) for d in shape) + ")"


def _as_value(result: Any) -> Value:
    if isinstance(result, tuple):
        return tuple(_as_value(r) for r in result)
    if isinstance(result, Closure):
        return result
    return np.asarray(result)


def _mismatch(value: Value, ty: Type) -> str | None:
    """A description of how `value` disagrees with `ty`, or None."""
    if isinstance(ty, TupleType):
        if not isinstance(value, tuple) or len(value) != len(ty.fields):
            return f"a {type(value).__name__} instead of a tuple of {len(ty.fields)}"
        for i, (v, t) in enumerate(zip(value, ty.fields)):
            problem = _mismatch(v, t)
            if problem:
                return f"field {i}: {problem}"
        return None
    if isinstance(ty, TensorType):
        if not isinstance(value, np.ndarray):
            return f"a {type(value).__name__} instead of an array"
        if str(value.dtype) != ty.dtype:
            return f"an array of dtype {value.dtype}"
        if value.ndim != ty.ndim or any(d is not ANY and d != s for d, s in zip(ty.shape, value.shape)):
            return f"an array of shape {value.shape}"
    return None


def evaluate(
    mod: IRModule, inputs: Mapping[str, Any] | Sequence[Any] = (), entry: str = "main"
) -> Value:
    """Run `mod`'s `entry` function on numpy inputs (by parameter name or position)."""
    return Interpreter(mod).run(inputs, entry)
