"""Type inference: compute the type of every expression of a module and check every annotation.

How it works
------------
Unknown types are `IncompleteType` holes; a small union-find (`_Unifier`) binds holes as equalities
are discovered (`unify`). Every function body is walked once in post-order (`relay_tune.ir.traversal`,
no recursion over expression depth) and each node's type is computed from its children's:

- an operator call asks the operator's type relation (`OpDef.type_relation`) for the result type as
  soon as all argument types are known; if some argument type is still a hole (an unannotated
  parameter, say), the call becomes a *pending constraint* solved later, once unification elsewhere
  (a call site, a `let` annotation, a return annotation) has filled the hole in;
- calls of functions (globals, function literals, closures in variables) unify argument types with
  parameter types; polymorphic signatures (`def @id[A](%x: A) -> A`) are instantiated with fresh holes
  at every call; inside their own body type parameters are rigid;
- a `let`-bound variable takes the type of its value (checked against its annotation, if any);
- global functions get their signature from their annotations up front, so forward references and
  mutual recursion work; missing annotations become holes inferred from the bodies.

After all pending constraints are solved, holes are substituted away; any that remain (a parameter
nothing constrains) are an error. Types are written into each node's `checked_type` cache. `Op` nodes
are not given a type: an operator is only meaningful applied, through its relation.

Functions whose parameter annotations or return type were missing are rebuilt (with
`relay_tune.ir.traversal.rewrite`) with the inferred types filled in, so later stages can read the
signatures directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
from relay_tune.ir.span import Span
from relay_tune.ir.traversal import post_order, rewrite
from relay_tune.ir.types import ANY, DataType, FuncType, IncompleteType, TensorType, TupleType, Type, TypeVar
from relay_tune.op._shape import DTYPES, INT64_MAX, check_rank
from relay_tune.op.registry import OpDef, get_op

__all__ = ["infer_expr", "infer_expr_type", "infer_types"]

BOOL_SCALAR = TensorType((), "bool")


# ================================================================================================
# Unification
# ================================================================================================


class _Mismatch(Exception):
    """Two types cannot be made equal; `detail` says where they differ."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _Unifier:
    """Union-find over `IncompleteType` holes."""

    def __init__(self) -> None:
        self._bound: dict[IncompleteType, Type] = {}

    def fresh(self, hint: str = "") -> IncompleteType:
        return IncompleteType(hint)

    def resolve(self, ty: Type) -> Type:
        """Follow hole bindings at the top level only (with path compression)."""
        chain: list[IncompleteType] = []
        while isinstance(ty, IncompleteType) and ty in self._bound:
            chain.append(ty)
            ty = self._bound[ty]
        for hole in chain[:-1]:
            self._bound[hole] = ty
        return ty

    def zonk(self, ty: Type) -> Type:
        """`ty` with every bound hole replaced by its binding, all the way down."""
        ty = self.resolve(ty)
        if isinstance(ty, TupleType):
            fields = tuple(self.zonk(f) for f in ty.fields)
            return ty if all(a is b for a, b in zip(fields, ty.fields)) else TupleType(fields)
        if isinstance(ty, FuncType):
            args = tuple(self.zonk(a) for a in ty.arg_types)
            ret = self.zonk(ty.ret_type)
            if ret is ty.ret_type and all(a is b for a, b in zip(args, ty.arg_types)):
                return ty
            return FuncType(args, ret, ty.type_params)
        if isinstance(ty, DataType):
            data_args = tuple(self.zonk(a) for a in ty.args)
            return ty if all(a is b for a, b in zip(data_args, ty.args)) else DataType(ty.name, data_args)
        return ty

    def unify(self, a: Type, b: Type) -> Type:
        a, b = self.resolve(a), self.resolve(b)
        if a is b:
            return a
        if isinstance(a, IncompleteType):
            return self._bind(a, b)
        if isinstance(b, IncompleteType):
            return self._bind(b, a)
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            return _unify_tensors(a, b)
        if isinstance(a, TupleType) and isinstance(b, TupleType):
            if len(a.fields) != len(b.fields):
                raise _Mismatch(f"tuples of {len(a.fields)} and {len(b.fields)} fields")
            fields = []
            for i, (fa, fb) in enumerate(zip(a.fields, b.fields)):
                try:
                    fields.append(self.unify(fa, fb))
                except _Mismatch as err:
                    raise _Mismatch(f"tuple field {i}: {err.detail}") from None
            return TupleType(tuple(fields))
        if isinstance(a, FuncType) and isinstance(b, FuncType):
            return self._unify_funcs(a, b)
        if isinstance(a, DataType) and isinstance(b, DataType):
            if a.name != b.name or len(a.args) != len(b.args):
                raise _Mismatch(f"{self.zonk(a)} is not {self.zonk(b)}")
            return DataType(a.name, tuple(self.unify(x, y) for x, y in zip(a.args, b.args)))
        if isinstance(a, TypeVar) and isinstance(b, TypeVar) and a.name == b.name:
            return a
        raise _Mismatch(f"{self.zonk(a)} is not {self.zonk(b)}")

    def _bind(self, hole: IncompleteType, ty: Type) -> Type:
        if self._occurs(hole, ty):
            raise _Mismatch(f"a type cannot contain itself ({self.zonk(ty)})")
        self._bound[hole] = ty
        return ty

    def _occurs(self, hole: IncompleteType, ty: Type) -> bool:
        ty = self.resolve(ty)
        if ty is hole:
            return True
        if isinstance(ty, TupleType):
            return any(self._occurs(hole, f) for f in ty.fields)
        if isinstance(ty, FuncType):
            return any(self._occurs(hole, a) for a in (*ty.arg_types, ty.ret_type))
        if isinstance(ty, DataType):
            return any(self._occurs(hole, a) for a in ty.args)
        return False

    def _unify_funcs(self, a: FuncType, b: FuncType) -> FuncType:
        if len(a.arg_types) != len(b.arg_types):
            raise _Mismatch(f"functions of {len(a.arg_types)} and {len(b.arg_types)} parameters")
        if len(a.type_params) != len(b.type_params):
            raise _Mismatch("a polymorphic and a monomorphic function type")
        # Compare polymorphic types up to renaming of their type parameters.
        renaming = {q: p for p, q in zip(a.type_params, b.type_params)}
        b_args = [substitute_type_vars(t, renaming) for t in b.arg_types]
        b_ret = substitute_type_vars(b.ret_type, renaming)
        args = []
        for i, (ta, tb) in enumerate(zip(a.arg_types, b_args)):
            try:
                args.append(self.unify(ta, tb))
            except _Mismatch as err:
                raise _Mismatch(f"parameter {i}: {err.detail}") from None
        try:
            ret = self.unify(a.ret_type, b_ret)
        except _Mismatch as err:
            raise _Mismatch(f"return type: {err.detail}") from None
        return FuncType(tuple(args), ret, a.type_params)

    def status(self, ty: Type) -> tuple[bool, bool]:
        """(contains an unbound hole, contains a type variable) for a zonked type."""
        if isinstance(ty, IncompleteType):
            return True, False
        if isinstance(ty, TypeVar):
            return False, True
        children: tuple[Type, ...] = ()
        if isinstance(ty, TupleType):
            children = ty.fields
        elif isinstance(ty, FuncType):
            children = (*ty.arg_types, ty.ret_type)
        elif isinstance(ty, DataType):
            children = ty.args
        holes = tvars = False
        for child in children:
            h, t = self.status(child)
            holes, tvars = holes or h, tvars or t
        return holes, tvars


def _unify_tensors(a: TensorType, b: TensorType) -> TensorType:
    if a.dtype != b.dtype:
        raise _Mismatch(f"dtype {a.dtype} is not {b.dtype}")
    if a.ndim != b.ndim:
        raise _Mismatch(f"rank {a.ndim} ({a}) is not rank {b.ndim} ({b})")
    dims = []
    for axis, (da, db) in enumerate(zip(a.shape, b.shape)):
        if da is ANY or db is ANY:
            # A dynamic dim is compatible with any size; the unified dim stays dynamic (as in TVM).
            dims.append(ANY)
        elif da != db:
            raise _Mismatch(f"dimension {axis} is {da} in {a} but {db} in {b}")
        else:
            dims.append(da)
    return a if tuple(dims) == a.shape else TensorType(tuple(dims), a.dtype)


def substitute_type_vars(ty: Type, mapping: Mapping[TypeVar, Type]) -> Type:
    """Replace type variables (by name) in `ty`."""
    if not mapping:
        return ty
    if isinstance(ty, TypeVar):
        return mapping.get(ty, ty)
    if isinstance(ty, TupleType):
        return TupleType(tuple(substitute_type_vars(f, mapping) for f in ty.fields))
    if isinstance(ty, FuncType):
        # Inner type parameters shadow outer ones of the same name.
        inner = {k: v for k, v in mapping.items() if k not in ty.type_params}
        return FuncType(
            tuple(substitute_type_vars(a, inner) for a in ty.arg_types),
            substitute_type_vars(ty.ret_type, inner),
            ty.type_params,
        )
    if isinstance(ty, DataType):
        return DataType(ty.name, tuple(substitute_type_vars(a, mapping) for a in ty.args))
    return ty


# ================================================================================================
# Pending constraints (solved once the types they need are known)
# ================================================================================================


@dataclass
class _OpConstraint:
    call: Call
    opdef: OpDef
    attrs: Attrs
    arg_types: tuple[Type, ...]
    out: Type


@dataclass
class _ProjectionConstraint:
    node: TupleGetItem
    tuple_type: Type
    out: Type


_Constraint = _OpConstraint | _ProjectionConstraint


# ================================================================================================
# The inferencer
# ================================================================================================


class _Inferencer:
    def __init__(self, mod: IRModule | None) -> None:
        self.u = _Unifier()
        self.mod = mod
        self.types: dict[int, Type] = {}  # id(node) -> type, possibly with holes until `finish`
        self.nodes: dict[int, Expr] = {}  # keeps every typed node alive (ids stay unique) and in order
        self.let_of: dict[int, Let] = {}  # id(let-bound var) -> its Let
        self.pending: list[_Constraint] = []
        self.global_sigs: dict[str, FuncType] = {}
        self.global_of_function: dict[int, str] = {}
        self.visited: set[int] = set()
        self.fixed: set[int] = set()  # ids of operator calls whose types the graph fixes (`_fixed`)
        self._attrs_cache: dict[tuple[str, Attrs], Attrs] = {}
        self._relation_cache: dict[tuple[str, tuple[Type, ...], Attrs], Type] = {}
        if mod is not None:
            for name, func in mod.items():
                self.global_of_function[id(func)] = name
                params = tuple(self.var_type(p) for p in func.params)
                ret = func.ret_type if func.ret_type is not None else self.u.fresh(f"@{name} return")
                self.global_sigs[name] = FuncType(params, ret, func.type_params)

    # --- bookkeeping --------------------------------------------------------------------------
    def _record(self, node: Expr, ty: Type) -> Type:
        self.types[id(node)] = ty
        self.nodes[id(node)] = node
        return ty

    def var_type(self, var: Var) -> Type:
        ty = self.types.get(id(var))
        if ty is not None:
            return ty
        let = self.let_of.get(id(var))
        if let is not None and id(let.value) in self.types and var.type_annotation is None:
            # The common case: the value is already typed, so the variable simply has its type.
            return self._record(var, self.types[id(let.value)])
        ann = var.type_annotation
        if ann is not None:
            _check_annotation_size(ann, var)
        return self._record(var, ann if ann is not None else self.u.fresh(var.name_hint))

    def type_of(self, node: Expr) -> Type:
        if isinstance(node, Var):
            return self.var_type(node)
        if isinstance(node, Op):
            raise UnsupportedError(
                f"{_where(_span_of(node))}operator `{node.name}` is used as a value; operators can only be called"
            )
        return self.types[id(node)]

    # --- walking ------------------------------------------------------------------------------
    def check_module(self) -> None:
        assert self.mod is not None
        for func in self.mod.values():
            self.walk(func)

    def walk(self, root: Expr) -> None:
        order = post_order(root)
        for node in order:
            if isinstance(node, Let):
                self.let_of[id(node.var)] = node
        for node in order:
            if id(node) in self.visited:
                continue
            self.visited.add(id(node))
            # Variables are typed where they are bound (parameters, `let`) or first used: a let-bound
            # variable is reached here before its value, so typing it now would only create a hole.
            if not isinstance(node, (Var, Op)):
                self._record(node, self._visit(node))

    def _visit(self, node: Expr) -> Type:
        if isinstance(node, Constant):
            return node.tensor_type
        if isinstance(node, Call):
            return self._visit_call(node)
        if isinstance(node, Tuple):
            return TupleType(tuple(self.type_of(f) for f in node.fields))
        if isinstance(node, TupleGetItem):
            return self._visit_projection(node)
        if isinstance(node, Let):
            return self._visit_let(node)
        if isinstance(node, If):
            return self._visit_if(node)
        if isinstance(node, Function):
            return self._visit_function(node)
        if isinstance(node, Constructor):
            type_def = node.type_def
            return FuncType(node.field_types, type_def.data_type(), type_def.type_params)
        if isinstance(node, Match):
            return self._visit_match(node)
        if isinstance(node, GlobalVar):
            sig = self.global_sigs.get(node.name)
            if sig is None:
                raise RelayTypeError(f"unknown global function @{node.name}", _span_of(node))
            return sig
        raise UnsupportedError(f"type inference does not handle {type(node).__name__} nodes")

    def _unify_or_raise(self, a: Type, b: Type, what: str, span: Span | None, op_name: str | None = None) -> Type:
        try:
            return self.u.unify(a, b)
        except _Mismatch as err:
            raise RelayTypeError(
                f"{what}: expected {self.u.zonk(a)}, got {self.u.zonk(b)} ({err.detail})", span, op_name
            ) from None

    def _visit_let(self, let: Let) -> Type:
        value_ty = self.type_of(let.value)
        var = let.var
        var_ty = self.types.get(id(var))
        what = f"let %{var.name_hint}"
        if var_ty is None:
            if var.type_annotation is not None:
                self._unify_or_raise(var.type_annotation, value_ty, f"{what} is annotated", let.span or var.span)
                self._record(var, var.type_annotation)
            else:
                self._record(var, value_ty)
        elif var_ty is not value_ty:
            annotated = " is annotated" if var.type_annotation is not None else ""
            self._unify_or_raise(var_ty, value_ty, f"{what}{annotated}", let.span or var.span)
        return self.type_of(let.body)

    def _visit_if(self, node: If) -> Type:
        cond = self.type_of(node.cond)
        self._unify_or_raise(BOOL_SCALAR, cond, "the condition of `if` must be a boolean scalar", node.span)
        return self._unify_or_raise(
            self.type_of(node.true_branch), self.type_of(node.false_branch),
            "the branches of `if` have different types (then-branch vs else-branch)", node.span,
        )

    def _visit_match(self, node: Match) -> Type:
        data = self.type_of(node.data)
        result: Type | None = None
        for pattern, body in node.clauses:
            self._check_pattern(pattern, data, node)
            body_ty = self.type_of(body)
            result = body_ty if result is None else self._unify_or_raise(
                result, body_ty, "the clauses of `match` have different types", node.span)
        if result is None:
            raise RelayTypeError("a `match` needs at least one clause", node.span)
        return result

    def _check_pattern(self, pattern: Pattern, expected: Type, node: Match) -> None:
        """Unify `expected` with what `pattern` matches, and type the variables it binds."""
        if isinstance(pattern, PatternVar):
            self._unify_or_raise(self.var_type(pattern.var), expected, f"pattern %{pattern.var.name_hint}",
                                 node.span)
        elif isinstance(pattern, PatternTuple):
            fields = tuple(self.u.fresh() for _ in pattern.patterns)
            self._unify_or_raise(expected, TupleType(fields), "a tuple pattern", node.span)
            for sub, field_ty in zip(pattern.patterns, fields):
                self._check_pattern(sub, field_ty, node)
        elif isinstance(pattern, PatternConstructor):
            ctor = pattern.constructor
            fresh = {tv: self.u.fresh(tv.name) for tv in ctor.type_def.type_params}
            made = substitute_type_vars(ctor.type_def.data_type(), fresh)
            self._unify_or_raise(expected, made, f"pattern {ctor.name}", node.span)
            if len(pattern.patterns) != len(ctor.field_types):
                raise RelayTypeError(f"pattern {ctor.name} has {len(pattern.patterns)} fields, its constructor "
                                     f"{len(ctor.field_types)}", node.span)
            for sub, field_ty in zip(pattern.patterns, ctor.field_types):
                self._check_pattern(sub, substitute_type_vars(field_ty, fresh), node)

    def _visit_function(self, func: Function) -> Type:
        params = tuple(self.var_type(p) for p in func.params)
        body = self.type_of(func.body)
        name = self.global_of_function.get(id(func))
        label = f"function @{name}" if name else "function"
        if name is not None:
            sig = self.global_sigs[name]
            self._unify_or_raise(sig.ret_type, body, f"the body of {label} does not match its return type", func.span)
            return sig
        if func.ret_type is not None:
            self._unify_or_raise(
                func.ret_type, body, f"the body of {label} does not match its return type", func.span
            )
            return FuncType(params, func.ret_type, func.type_params)
        return FuncType(params, body, func.type_params)

    def _visit_projection(self, node: TupleGetItem) -> Type:
        tuple_ty = self.u.resolve(self.type_of(node.tuple_value))
        if isinstance(tuple_ty, IncompleteType):
            out = self.u.fresh("projection")
            self.pending.append(_ProjectionConstraint(node, tuple_ty, out))
            return out
        return self._project(node, tuple_ty)

    def _project(self, node: TupleGetItem, tuple_ty: Type) -> Type:
        if not isinstance(tuple_ty, TupleType):
            raise RelayTypeError(
                f"cannot take field .{node.index} of a value of non-tuple type {self.u.zonk(tuple_ty)}", node.span
            )
        if not 0 <= node.index < len(tuple_ty.fields):
            raise RelayTypeError(
                f"tuple index .{node.index} is out of range for a tuple of {len(tuple_ty.fields)} fields "
                f"({self.u.zonk(tuple_ty)})",
                node.span,
            )
        return tuple_ty.fields[node.index]

    # --- calls --------------------------------------------------------------------------------
    def _visit_call(self, call: Call) -> Type:
        if isinstance(call.op, Op):
            return self._visit_op_call(call, call.op.name)
        callee_node = call.op
        callee = self.u.resolve(self.type_of(callee_node))
        label = _callee_label(callee_node)
        if isinstance(callee, IncompleteType):
            shape = FuncType(tuple(self.u.fresh() for _ in call.args), self.u.fresh())
            callee = self._unify_or_raise(callee, shape, f"calling {label}", call.span)
        if not isinstance(callee, FuncType):
            raise RelayTypeError(f"cannot call {label}: its type {self.u.zonk(callee)} is not a function", call.span)
        if callee.type_params:
            fresh = {tv: self.u.fresh(tv.name) for tv in callee.type_params}
            callee = FuncType(
                tuple(substitute_type_vars(a, fresh) for a in callee.arg_types),
                substitute_type_vars(callee.ret_type, fresh),
            )
        if len(callee.arg_types) != len(call.args):
            raise RelayTypeError(
                f"{label} takes {len(callee.arg_types)} argument(s) but is called with {len(call.args)}", call.span
            )
        params = _param_names(callee_node, self.mod)
        for i, (param_ty, arg) in enumerate(zip(callee.arg_types, call.args)):
            pname = f" (%{params[i]})" if params else ""
            self._unify_or_raise(param_ty, self.type_of(arg), f"argument {i}{pname} of the call to {label}", call.span)
        return callee.ret_type

    def _visit_op_call(self, call: Call, name: str) -> Type:
        if all(self._fixed(a) for a in call.args):
            # Over arguments whose types the graph fixes, the call's type is a pure function of the call node: one
            # checked before keeps its type, so a pass that rebuilt the graph around it need not run the relation
            # again (and either way the call's type is fixed for the calls that use it).
            self.fixed.add(id(call))
            if call.has_type():
                return call.checked_type
        opdef = get_op(name)
        if opdef.num_inputs is not None and len(call.args) != opdef.num_inputs:
            raise RelayTypeError(
                f"expects {opdef.num_inputs} argument(s), got {len(call.args)}", call.span, name
            )
        attrs = self._full_attrs(opdef, call)
        if opdef.type_relation is None:
            raise RelayTypeError("the operator has no type relation, so its result type is unknown", call.span, name)
        constraint = _OpConstraint(call, opdef, attrs, tuple(self.type_of(a) for a in call.args), self.u.fresh(name))
        result = self._try_op(constraint)
        if result is None:
            self.pending.append(constraint)
            return constraint.out
        return result

    def _fixed(self, arg: Expr) -> bool:
        """Whether `arg`'s type is fixed by the graph alone, the same in every inference: a constant, a variable
        annotated with a tensor type, or an operator call over such arguments (`fixed`). A variable without one
        takes its type from wherever it is bound, which a pass may change, and so does every call over it."""
        if isinstance(arg, Var):
            return isinstance(arg.type_annotation, TensorType)
        return isinstance(arg, Constant) or id(arg) in self.fixed

    def _full_attrs(self, opdef: OpDef, call: Call) -> Attrs:
        key = (opdef.name, call.attrs)
        attrs = self._attrs_cache.get(key)
        if attrs is None:
            try:
                attrs = opdef.make_attrs(call.attrs)
            except RelayTypeError as err:
                raise RelayTypeError(err.message, call.span, opdef.name) from None
            self._attrs_cache[key] = attrs
        return attrs

    def _try_op(self, c: _OpConstraint) -> Type | None:
        """The result type of an operator call, or None while some argument type is unknown."""
        arg_types = tuple(self.u.zonk(t) for t in c.arg_types)
        name, span = c.opdef.name, c.call.span
        for i, ty in enumerate(arg_types):
            holes, tvars = self.u.status(ty)
            if holes:
                return None
            if tvars:
                raise RelayTypeError(
                    f"argument {i} has the polymorphic type {ty}; operators need concrete tensor types", span, name
                )
        key = (name, arg_types, c.attrs)
        result = self._relation_cache.get(key)
        if result is None:
            result = _apply_relation(c.opdef, arg_types, c.attrs, span)
            self._relation_cache[key] = result
        self._unify_or_raise(c.out, result, "result type", span, name)
        return result

    # --- solving and finishing ----------------------------------------------------------------
    def solve_pending(self) -> None:
        while self.pending:
            remaining: list[_Constraint] = []
            for c in self.pending:
                if isinstance(c, _OpConstraint):
                    solved = self._try_op(c) is not None
                else:
                    tuple_ty = self.u.resolve(c.tuple_type)
                    solved = not isinstance(tuple_ty, IncompleteType)
                    if solved:
                        self._unify_or_raise(c.out, self._project(c.node, tuple_ty), "projection", c.node.span)
                if not solved:
                    remaining.append(c)
            if len(remaining) == len(self.pending):
                break
            self.pending = remaining
        if self.pending:
            self._report_unsolved(self.pending[0])

    def _report_unsolved(self, c: _Constraint) -> None:
        if isinstance(c, _ProjectionConstraint):
            raise RelayTypeError(
                f"cannot infer the type of the tuple in the projection .{c.node.index}; add a type annotation",
                c.node.span,
            )
        unknown = [
            f"argument {i} ({_describe(arg)})"
            for i, (arg, ty) in enumerate(zip(c.call.args, c.arg_types))
            if self.u.status(self.u.zonk(ty))[0]
        ]
        raise RelayTypeError(
            f"cannot infer the type of {', '.join(unknown)}; annotate the parameters it comes from",
            c.call.span, c.opdef.name,
        )

    def finish(self) -> dict[int, Type]:
        """Solve what is left, check that every type is complete and fill `checked_type`."""
        self.solve_pending()
        final: dict[int, Type] = {}
        for key, ty in self.types.items():
            full = self.u.zonk(ty)
            if self.u.status(full)[0]:
                node = self.nodes[key]
                if isinstance(node, Var):
                    raise RelayTypeError(
                        f"cannot infer the type of %{node.name_hint}: nothing constrains it; add a type annotation",
                        node.span,
                    )
                raise RelayTypeError(f"cannot infer the type of {_describe(node)} (got {full})", _span_of(node))
            final[key] = full
        for key, ty in final.items():
            self.nodes[key].set_checked_type(ty)
        return final

    def fill_annotations(self, root: Expr, final: dict[int, Type]) -> Expr:
        """`root` rebuilt so that every function has parameter annotations and a return type."""
        params = {id(p) for node in post_order(root) if isinstance(node, Function) for p in node.params}
        if not _needs_annotations(root):
            return root

        def fill(orig: Expr, updated: Expr) -> Expr:
            new = updated
            if id(orig) in params and id(orig) in final and _incomplete_annotation(orig.type_annotation):
                assert isinstance(orig, Var)
                new = Var(orig.name_hint, final[id(orig)], orig.span)
            elif isinstance(updated, Function) and _incomplete_annotation(updated.ret_type):
                func_ty = final[id(orig)]
                assert isinstance(func_ty, FuncType)
                new = Function(
                    updated.params, updated.body, func_ty.ret_type, updated.attrs, updated.type_params, updated.span
                )
            if new is not orig and id(orig) in final:
                new.set_checked_type(final[id(orig)])
            return new

        return rewrite(root, fill)


def _check_attr_values(opdef: OpDef, attrs: Attrs) -> None:
    """Reject attribute values no operator can mean, before a relation computes with them: integers beyond int64
    (no tensor has that many elements; the text format could not even write them back) and dtypes that are not
    dtypes. Relations check what each value means to their operator; this is the floor under all of them."""
    def ints(value: Any) -> Any:
        if isinstance(value, bool):
            return
        if isinstance(value, int):
            yield value
        elif isinstance(value, tuple | list):
            for item in value:
                yield from ints(item)

    for key, value in attrs.items():
        for number in ints(value):
            if not -INT64_MAX - 1 <= number <= INT64_MAX:
                raise RelayTypeError(f"attribute {key}={number} is out of the int64 range", op_name=opdef.name)
        if key.endswith("dtype") and isinstance(value, str) and value and value not in DTYPES:
            raise RelayTypeError(f"attribute {key}={value!r} is not a dtype (supported: {', '.join(sorted(DTYPES))})",
                                 op_name=opdef.name)


MAX_NOMINAL_ELEMENTS = 1 << 40  # elements of a tensor, counting a zero dimension as one: 4 TiB of float32


def _nominal_elements(shape: tuple[Any, ...]) -> int:
    """Elements of `shape` with zero (and unknown) dimensions counted as one: what a computation that walks one
    dimension at a time (a window, a padding, a loop nest) may touch although the tensor itself is empty."""
    total = 1
    for d in shape:
        if isinstance(d, int) and d > 1:
            total *= d
    return total


def _check_annotation_size(ty: Type, var: Var) -> None:
    if isinstance(ty, TupleType):
        for field_type in ty.fields:
            _check_annotation_size(field_type, var)
    elif isinstance(ty, TensorType) and _nominal_elements(ty.shape) > MAX_NOMINAL_ELEMENTS:
        raise RelayTypeError(f"%{var.name_hint} is annotated {ty}: more elements than any tensor can have "
                             f"(at most 2^40, counting empty dimensions as 1)", var.span)


def _check_result(opdef: OpDef, ty: Type) -> Type:
    """A relation's result must be a type a tensor can have: a bounded rank and no negative dimension."""
    if isinstance(ty, TensorType):
        check_rank(len(ty.shape), opdef.name)
        bad = [d for d in ty.shape if isinstance(d, int) and d < 0]
        if bad:
            raise RelayTypeError(f"the result would have a negative dimension: {ty}", op_name=opdef.name)
        if _nominal_elements(ty.shape) > MAX_NOMINAL_ELEMENTS:
            raise RelayTypeError(f"the result {ty} would have more elements than any tensor can have",
                                 op_name=opdef.name)
    elif isinstance(ty, TupleType):
        for field_type in ty.fields:
            _check_result(opdef, field_type)
    return ty


def _apply_relation(opdef: OpDef, arg_types: tuple[Type, ...], attrs: Attrs, span: Span | None) -> Type:
    assert opdef.type_relation is not None
    try:
        _check_attr_values(opdef, attrs)
        return _check_result(opdef, opdef.type_relation(arg_types, attrs))
    except RelayTypeError as err:
        if err.span is not None:
            raise
        raise RelayTypeError(err.message, span, err.op_name or opdef.name) from None
    except RelayTuneError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError, OverflowError, MemoryError) as err:
        # A relation tripping over malformed attributes (say, a string where ints belong): report it as
        # the user's type error rather than an internal crash.
        args = ", ".join(str(t) for t in arg_types)
        raise RelayTypeError(
            f"invalid arguments or attributes ({type(err).__name__}: {err}); argument types: {args}", span, opdef.name
        ) from err


def _incomplete_annotation(ty: Type | None) -> bool:
    if ty is None or isinstance(ty, IncompleteType):
        return True
    if isinstance(ty, TupleType):
        return any(_incomplete_annotation(f) for f in ty.fields)
    if isinstance(ty, FuncType):
        return any(_incomplete_annotation(a) for a in (*ty.arg_types, ty.ret_type))
    return False


def _needs_annotations(root: Expr) -> bool:
    for node in post_order(root):
        if isinstance(node, Function) and (
            _incomplete_annotation(node.ret_type) or any(_incomplete_annotation(p.type_annotation) for p in node.params)
        ):
            return True
    return False


def _span_of(node: Expr) -> Span | None:
    return getattr(node, "span", None)


def _where(span: Span | None) -> str:
    return f"{span}: " if span is not None else ""


def _describe(node: Expr) -> str:
    if isinstance(node, Var):
        return f"%{node.name_hint}"
    if isinstance(node, GlobalVar):
        return f"@{node.name}"
    if isinstance(node, Call) and isinstance(node.op, Op):
        return f"the result of {node.op.name}"
    return f"this {type(node).__name__}"


def _callee_label(node: Expr) -> str:
    if isinstance(node, GlobalVar):
        return f"@{node.name}"
    if isinstance(node, Var):
        return f"%{node.name_hint}"
    if isinstance(node, Function):
        return "a function literal"
    return f"a {type(node).__name__} value"


def _param_names(callee: Expr, mod: IRModule | None) -> list[str]:
    if isinstance(callee, Function):
        return [p.name_hint for p in callee.params]
    if isinstance(callee, GlobalVar) and mod is not None and callee.name in mod:
        return [p.name_hint for p in mod[callee.name].params]
    return []


# ================================================================================================
# Public API
# ================================================================================================


def infer_types(mod: IRModule) -> IRModule:
    """Type-check every function of `mod`, filling `checked_type` on every expression node.

    Returns `mod` itself when every function was fully annotated, otherwise a module whose functions
    carry the inferred parameter annotations and return types. Raises `RelayTypeError` (naming the
    operator, source location and clashing shapes/dtypes) on the first type error.
    """
    inferencer = _Inferencer(mod)
    inferencer.check_module()
    final = inferencer.finish()
    functions: dict[str, Function] = {}
    changed = False
    for name, func in mod.items():
        filled = inferencer.fill_annotations(func, final)
        assert isinstance(filled, Function)
        changed = changed or filled is not func
        functions[name] = filled
    return IRModule(functions) if changed else mod


def infer_expr(expr: Expr, mod: IRModule | None = None) -> Expr:
    """Type-check a standalone expression (free variables take their annotations; globals come from `mod`).

    Returns the expression, rebuilt with inferred annotations where function parameters or return types
    were missing.
    """
    inferencer = _Inferencer(mod)
    if mod is not None:
        inferencer.check_module()
    inferencer.walk(expr)
    final = inferencer.finish()
    return inferencer.fill_annotations(expr, final)


def infer_expr_type(expr: Expr, mod: IRModule | None = None) -> Type:
    """The type of `expr` (see `infer_expr`); every node of `expr` gets its `checked_type`."""
    inferencer = _Inferencer(mod)
    if mod is not None:
        inferencer.check_module()
    inferencer.walk(expr)
    if isinstance(expr, Op):
        raise UnsupportedError(f"operator `{expr.name}` has no type of its own; call it")
    if isinstance(expr, Var):
        inferencer.var_type(expr)
    final = inferencer.finish()
    return final[id(expr)]
