"""Relay expressions.

Every node is immutable (frozen dataclass) and compares/hashes *structurally*: two separately built
`add(%x, 1f)` calls over the same `%x` are equal, and functions compare up to renaming of their
parameters and let-bound variables (alpha-equivalence). `Var` is the exception: a variable is a
binding site and compares by identity, so variables can key dictionaries (environments,
substitutions) without surprises.

Equality and hashing are implemented iteratively in `relay_tune.ir.structural`, so programs with
tens of thousands of nested bindings never hit Python's recursion limit.

The one mutable slot is `_checked_type`, filled in by type inference. It is a cache of a pure
function of the (immutable) node, exactly like TVM's `checked_type_`, and is excluded from equality.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from relay_tune.ir.attrs import EMPTY_ATTRS, Attrs
from relay_tune.ir.span import Span
from relay_tune.ir.types import TensorType, Type, TypeVar

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
        try:
            ty = self._checked_type
        except AttributeError:
            ty = None
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
        from relay_tune.ir.structural import structural_equal

        return structural_equal(self, other)

    def __hash__(self) -> int:
        from relay_tune.ir.structural import structural_hash

        return structural_hash(self)

    def __repr__(self) -> str:
        from relay_tune.ir.structural import short_repr

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
