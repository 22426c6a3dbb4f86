"""Relay expressions.

Every node is immutable (frozen dataclass) and compares/hashes *structurally*: two separately built
`add(%x, 1f)` calls over the same `%x` are equal, and functions compare up to renaming of their
parameters and let-bound variables (alpha-equivalence). `Var` is the exception: a variable is a
binding site and compares by identity, so variables can key dictionaries (environments,
substitutions) without surprises.

Equality and hashing are implemented iteratively at the end of this module (beside the node types they
walk, so the two need no import of each other), and programs with tens of thousands of nested bindings never
hit Python's recursion limit.

The one mutable slot is `_checked_type`, filled in by type inference. It is a cache of a pure
function of the (immutable) node, exactly like TVM's `checked_type_`, and is excluded from equality.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from relay_tune.ir.attrs import EMPTY_ATTRS, Attrs
from relay_tune.ir.span import Span
from relay_tune.ir.types import DataType, TensorType, Type, TypeVar

if TYPE_CHECKING:
    from collections.abc import Sequence


class Expr:
    """Base class of Relay expressions."""

    __slots__ = ("_checked_type", "_hash_cache")

    # --- structure ------------------------------------------------------------------------
    def children(self) -> tuple[Expr, ...]:
        """Sub-expressions in evaluation order (binders included for Let/Function)."""
        return ()

    def with_children(self, children: Sequence[Expr]) -> Expr:
        """A copy of this node with `children` replacing `self.children()` (same order)."""
        assert not children
        return self

    # --- types ----------------------------------------------------------------------------
    @property
    def checked_type(self) -> Type:
        ty: Type | None = getattr(self, "_checked_type", None)
        if ty is None:
            raise ValueError(
                f"the type of this {type(self).__name__} is not known yet; run type inference "
                "(relay_tune.type_infer.infer_types) first"
            )
        return ty

    def has_type(self) -> bool:
        return getattr(self, "_checked_type", None) is not None

    def set_checked_type(self, ty: Type) -> None:
        object.__setattr__(self, "_checked_type", ty)

    # --- structural equality --------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Expr):
            return NotImplemented
        return structural_equal(self, other)

    def __hash__(self) -> int:
        return structural_hash(self)

    def __repr__(self) -> str:
        return short_repr(self)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Var(Expr):
    """A local variable: a function parameter or a let-bound name (`%x`)."""

    name_hint: str
    type_annotation: Type | None = None
    span: Span | None = field(default=None, compare=False)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class GlobalVar(Expr):
    """A reference to a module-level function (`@name`); compares by name."""

    name: str
    span: Span | None = field(default=None, compare=False)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Op(Expr):
    """A reference to a registered primitive operator, e.g. `nn.conv2d`."""

    name: str
    span: Span | None = field(default=None, compare=False)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Constant(Expr):
    """A tensor literal. Scalars come from number literals; tensors from `meta[relay.Constant][i]`."""

    data: np.ndarray
    span: Span | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        arr = np.asarray(self.data)
        if arr.flags.writeable:
            arr = arr.copy()
            arr.setflags(write=False)
        object.__setattr__(self, "data", arr)

    @classmethod
    def adopt(cls, data: np.ndarray) -> Constant:
        """A constant over `data` itself, made read-only instead of copied: for arrays a pass has just computed
        and hands over (a copy of a model's weights costs as much as computing them)."""
        arr = np.asarray(data)
        arr.setflags(write=False)
        return cls(arr)

    @property
    def tensor_type(self) -> TensorType:
        return TensorType(tuple(int(d) for d in self.data.shape), str(self.data.dtype))

    @property
    def is_scalar(self) -> bool:
        return self.data.ndim == 0


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Call(Expr):
    """`op(args..., key=value...)`: an operator, global function or function value applied."""

    op: Expr
    args: tuple[Expr, ...]
    attrs: Attrs = EMPTY_ATTRS
    span: Span | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))

    @property
    def op_name(self) -> str | None:
        """The operator name when the callee is a primitive operator, else None."""
        return self.op.name if isinstance(self.op, Op) else None

    def children(self) -> tuple[Expr, ...]:
        return (self.op, *self.args)

    def with_children(self, children: Sequence[Expr]) -> Call:
        return Call(children[0], tuple(children[1:]), self.attrs, self.span)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Tuple(Expr):
    fields: tuple[Expr, ...]
    span: Span | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))

    def children(self) -> tuple[Expr, ...]:
        return self.fields

    def with_children(self, children: Sequence[Expr]) -> Tuple:
        return Tuple(tuple(children), self.span)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class TupleGetItem(Expr):
    """`%t.0`: projection of a tuple field."""

    tuple_value: Expr
    index: int
    span: Span | None = field(default=None, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.tuple_value,)

    def with_children(self, children: Sequence[Expr]) -> TupleGetItem:
        return TupleGetItem(children[0], self.index, self.span)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Let(Expr):
    """`let %var = value; body`."""

    var: Var
    value: Expr
    body: Expr
    span: Span | None = field(default=None, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.var, self.value, self.body)

    def with_children(self, children: Sequence[Expr]) -> Let:
        var, value, body = children
        assert isinstance(var, Var), "a let binder must stay a Var"
        return Let(var, value, body, self.span)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class If(Expr):
    cond: Expr
    true_branch: Expr
    false_branch: Expr
    span: Span | None = field(default=None, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.true_branch, self.false_branch)

    def with_children(self, children: Sequence[Expr]) -> If:
        return If(children[0], children[1], children[2], self.span)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Function(Expr):
    """`fn (%p0: T0, ..., Key=value) -> R { body }`.

    `attrs` holds function attributes such as `Primitive=1` (set by operator fusion).
    """

    params: tuple[Var, ...]
    body: Expr
    ret_type: Type | None = None
    attrs: Attrs = EMPTY_ATTRS
    type_params: tuple[TypeVar, ...] = ()
    span: Span | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "type_params", tuple(self.type_params))
        if not isinstance(self.attrs, Attrs):
            object.__setattr__(self, "attrs", Attrs(self.attrs))

    @property
    def is_primitive(self) -> bool:
        return bool(self.attrs.get("Primitive", 0))

    def children(self) -> tuple[Expr, ...]:
        return (*self.params, self.body)

    def with_children(self, children: Sequence[Expr]) -> Function:
        *params, body = children
        assert all(isinstance(p, Var) for p in params), "function parameters must stay Vars"
        return Function(tuple(params), body, self.ret_type, self.attrs, self.type_params, self.span)  # type: ignore[arg-type]

    def with_attrs(self, **updates: Any) -> Function:
        return Function(
            self.params, self.body, self.ret_type, self.attrs.with_updates(**updates),
            self.type_params, self.span,
        )


@dataclass(frozen=True)
class TypeDef:
    """An algebraic data type definition: `type List[A] { Cons(A, List[A]), Nil }`. Constructor `tag` i is
    `constructors[i]`: its name and field types (over `type_params`)."""

    name: str
    type_params: tuple[TypeVar, ...]
    constructors: tuple[tuple[str, tuple[Type, ...]], ...]

    def data_type(self) -> DataType:
        """The type its constructors make, over its own type parameters."""
        return DataType(self.name, self.type_params)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Constructor(Expr):
    """Constructor `tag` of algebraic data type `type_def`, as a value: calling it builds a value of the type."""

    type_def: TypeDef
    tag: int
    span: Span | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return self.type_def.constructors[self.tag][0]

    @property
    def field_types(self) -> tuple[Type, ...]:
        return self.type_def.constructors[self.tag][1]


@dataclass(frozen=True)
class PatternWildcard:
    """`_`: matches anything, binds nothing."""


@dataclass(frozen=True)
class PatternVar:
    """`%x`: matches anything and binds it to `var`."""

    var: Var


@dataclass(frozen=True)
class PatternConstructor:
    """`Cons(p0, p1)`: matches a value made by `constructor` whose fields match `patterns`."""

    constructor: Constructor
    patterns: tuple[Pattern, ...] = ()


@dataclass(frozen=True)
class PatternTuple:
    """`(p0, p1)`: matches a tuple whose fields match `patterns`."""

    patterns: tuple[Pattern, ...]


Pattern = PatternWildcard | PatternVar | PatternConstructor | PatternTuple


def pattern_vars(pattern: Pattern) -> list[Var]:
    """The variables a pattern binds, left to right."""
    if isinstance(pattern, PatternVar):
        return [pattern.var]
    if isinstance(pattern, PatternConstructor | PatternTuple):
        return [v for p in pattern.patterns for v in pattern_vars(p)]
    return []


def _rebind_pattern(pattern: Pattern, new_vars: list[Var]) -> Pattern:
    """`pattern` with its variables replaced by `new_vars` (consumed from the front)."""
    if isinstance(pattern, PatternVar):
        return PatternVar(new_vars.pop(0))
    if isinstance(pattern, PatternConstructor):
        return PatternConstructor(pattern.constructor, tuple(_rebind_pattern(p, new_vars) for p in pattern.patterns))
    if isinstance(pattern, PatternTuple):
        return PatternTuple(tuple(_rebind_pattern(p, new_vars) for p in pattern.patterns))
    return pattern


def _pattern_shape(pattern: Pattern) -> Any:
    """A pattern's structure without its variables (what equality and hashing compare)."""
    if isinstance(pattern, PatternVar):
        return ("var", pattern.var.type_annotation)
    if isinstance(pattern, PatternConstructor):
        return ("ctor", pattern.constructor.type_def, pattern.constructor.tag,
                tuple(_pattern_shape(p) for p in pattern.patterns))
    if isinstance(pattern, PatternTuple):
        return ("tuple", tuple(_pattern_shape(p) for p in pattern.patterns))
    return ("_",)


@dataclass(frozen=True, eq=False, repr=False, slots=True)
class Match(Expr):
    """`match (data) { pattern => body, ... }`: the body of the first clause whose pattern matches `data`."""

    data: Expr
    clauses: tuple[tuple[Pattern, Expr], ...]
    span: Span | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "clauses", tuple((p, b) for p, b in self.clauses))

    def children(self) -> tuple[Expr, ...]:
        binders = [v for pattern, _body in self.clauses for v in pattern_vars(pattern)]
        return (self.data, *binders, *(body for _pattern, body in self.clauses))

    def with_children(self, children: Sequence[Expr]) -> Match:
        data, rest = children[0], list(children[1:])
        count = sum(len(pattern_vars(p)) for p, _b in self.clauses)
        binders, bodies = rest[:count], rest[count:]
        assert all(isinstance(v, Var) for v in binders), "pattern variables must stay Vars"
        clauses = tuple((_rebind_pattern(p, binders), b)  # type: ignore[arg-type]
                        for (p, _old), b in zip(self.clauses, bodies))
        return Match(data, clauses, self.span)


def const(value: Any, dtype: str | None = None) -> Constant:
    """Build a constant from a Python scalar or array (float32 unless told otherwise)."""
    arr = np.asarray(value)
    if dtype is not None:
        arr = arr.astype(dtype)
    elif arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    elif arr.dtype == np.int64 and arr.ndim == 0:
        arr = arr.astype(np.int32)
    return Constant(arr)


_OP_CACHE: dict[str, Op] = {}


def op(name: str) -> Op:
    """The (shared) `Op` node for an operator name."""
    node = _OP_CACHE.get(name)
    if node is None:
        node = _OP_CACHE[name] = Op(name)
    return node

# ---------------------------------------------------------------------------------------------------------------------
# Structural equality and hashing
# ---------------------------------------------------------------------------------------------------------------------
# Structural equality (alpha-equivalence) and hashing of expressions, without recursion.
#
# Rules:
# - Constants compare by dtype, shape and bytes; operators and globals by name.
# - A variable bound by a `Function` parameter or a `Let` on the left matches the variable at the same
#   binding site on the right (names do not matter, type annotations do). Free variables match only
#   themselves, unless `map_free_vars=True` (then the first free occurrence pairs them up).
# - Hashing is consistent with that: a variable contributes its type annotation, never its name or
#   identity, so alpha-equivalent terms hash alike.
#
# Both walks are explicit-stack loops and memoise on node identity, so shared sub-DAGs are visited once
# and 10,000-deep let chains are fine.

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
    if isinstance(node, Constructor):
        return hash(("Constructor", node.type_def, node.tag))
    if isinstance(node, Match):
        return hash(("Match", tuple(_pattern_shape(p) for p, _b in node.clauses)))
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
    return root._hash_cache  # type: ignore[attr-defined]


def _child_hash(node: Expr) -> int:
    # Vars are leaves whose cache is the same value every time; computing it inline keeps
    # the main loop simple.
    cached = getattr(node, "_hash_cache", None)
    if cached is None:
        cached = hash((_local_hash(node), ()))
        object.__setattr__(node, "_hash_cache", cached)
    return cached


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
    if isinstance(a, Constructor):
        assert isinstance(b, Constructor)
        return a.type_def == b.type_def and a.tag == b.tag
    if isinstance(a, Match):
        assert isinstance(b, Match)
        shapes_a = [_pattern_shape(p) for p, _body in a.clauses]
        if shapes_a != [_pattern_shape(p) for p, _body in b.clauses]:
            return False
        vars_a = [v for p, _body in a.clauses for v in pattern_vars(p)]
        vars_b = [v for p, _body in b.clauses for v in pattern_vars(p)]
        return all(_bind(va, vb, var_map) for va, vb in zip(vars_a, vars_b))
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
