"""Tensor expressions: the mathematical definition of a kernel, before any decision on loop order.

A kernel is described as a small graph of tensors. A `placeholder` is an input; a `compute` defines
every element of a new tensor as a scalar expression of its index variables, reading other tensors by
indexing them (`A[i, k]` is an expression). A reduction (`sum`, `max`, `min` over `reduce_axis`
variables) may appear only as the whole body of a compute, which keeps the meaning of "the value of
element (i, j)" unambiguous whatever loop order a schedule later picks.

    A = placeholder((M, K), "float32", "A")
    B = placeholder((N, K), "float32", "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum(A[i, k] * B[j, k], axis=k), "C")

Scalar arithmetic reuses the loop-nest IR's expression nodes (`tir.PrimExpr`); this module adds only
what exists before lowering: index variables that know their extent (`IterVar`), reads of tensors
(`TensorRead`) and reductions (`Reduce`). Tensors compare by identity, everything else by value.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from relay_tune.errors import UnsupportedError
from relay_tune.ir.dtypes import FLOAT_FORMATS, ml_dtypes_module
from relay_tune.kernel import tir
from relay_tune.kernel.tir import ExprLike, PrimExpr

SPATIAL = "spatial"
REDUCE = "reduce"


@dataclass(frozen=True, slots=True, eq=False)
class IterVar(tir.LoopVar):
    """An index variable of a compute (`kind` "spatial") or a reduction axis (`kind` "reduce").

    It is a `LoopVar`, so it can be used directly in index arithmetic; it also carries the extent of
    the range it iterates over (always starting at 0).
    """

    extent: int = 0
    kind: str = SPATIAL

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True, eq=False)
class PlaceholderOp:
    """Marks a tensor as a kernel input."""


@dataclass(frozen=True, slots=True, eq=False)
class ComputeOp:
    """`tensor[axes] = body`; `body` may be a `Reduce` (then only at the top)."""

    axes: tuple[IterVar, ...]
    body: PrimExpr
    tag: str = ""

    @property
    def reduce_axes(self) -> tuple[IterVar, ...]:
        return self.body.axes if isinstance(self.body, Reduce) else ()

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.body, Reduce)


@dataclass(frozen=True, eq=False)
class Tensor:
    """A named, statically shaped tensor produced by an op. Compares by identity."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    op: PlaceholderOp | ComputeOp

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_placeholder(self) -> bool:
        return isinstance(self.op, PlaceholderOp)

    def __getitem__(self, indices: ExprLike | tuple[ExprLike, ...]) -> TensorRead:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise ValueError(
                f"tensor {self.name} has rank {len(self.shape)} but was indexed with {len(indices)} indices"
            )
        return TensorRead(self, tuple(_index(i) for i in indices))

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"


@dataclass(frozen=True, slots=True)
class TensorRead(PrimExpr):
    """`tensor[indices]`: one element of another tensor."""

    tensor: Tensor
    indices: tuple[PrimExpr, ...]
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(self.indices))
        if not self.dtype:
            object.__setattr__(self, "dtype", self.tensor.dtype)


COMBINERS = ("sum", "max", "min", "prod")


@dataclass(frozen=True, slots=True)
class Reduce(PrimExpr):
    """Combine `source` over every point of `axes`, starting from `init`."""

    combiner: str
    source: PrimExpr
    axes: tuple[IterVar, ...]
    init: PrimExpr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if self.combiner not in COMBINERS:
            raise ValueError(f"unknown reduction combiner {self.combiner!r}; expected one of {COMBINERS}")
        object.__setattr__(self, "axes", tuple(self.axes))
        if not self.dtype:
            object.__setattr__(self, "dtype", self.source.dtype)

    def combine(self, acc: PrimExpr, value: PrimExpr) -> PrimExpr:
        if self.combiner == "sum":
            return acc + value
        if self.combiner == "prod":
            return acc * value
        if self.combiner == "max":
            return tir.maximum(acc, value)
        return tir.minimum(acc, value)


# ---------------------------------------------------------------------------------------------
# Constructors
# ---------------------------------------------------------------------------------------------


def _index(value: ExprLike) -> PrimExpr:
    expr = tir.as_expr(value)
    if expr.dtype == "bool" or expr.dtype.startswith(("float", "bfloat")):
        raise TypeError(f"tensor index must be an integer expression, got {expr!r} of type {expr.dtype}")
    return expr


def placeholder(shape: Sequence[int], dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """A kernel input of a fixed shape."""
    _check_shape(shape, name)
    return Tensor(name, tuple(shape), dtype, PlaceholderOp())


def reduce_axis(extent: int, name: str = "k") -> IterVar:
    """A reduction variable ranging over `[0, extent)`."""
    if int(extent) <= 0:
        raise ValueError(f"reduce axis {name} needs a positive extent, got {extent}")
    return IterVar(name, tir.INDEX_DTYPE, int(extent), REDUCE)


def compute(
    shape: Sequence[int],
    fcompute: Callable[..., ExprLike],
    name: str = "compute",
    tag: str = "",
    dtype: str | None = None,
) -> Tensor:
    """A tensor whose element at index `(i, j, ...)` is `fcompute(i, j, ...)`.

    The index variables are named after `fcompute`'s parameters (`lambda n, c, h, w: ...` gives axes
    `n, c, h, w`), which makes schedules readable; a `*args` function gets `ax0, ax1, ...`. `dtype`
    casts the body when given; by default the tensor has the body's dtype.
    """
    _check_shape(shape, name)
    axes = tuple(IterVar(n, tir.INDEX_DTYPE, int(e), SPATIAL) for n, e in zip(_axis_names(fcompute, len(shape)), shape))
    body = tir.as_expr(fcompute(*axes))
    if dtype is not None and body.dtype != dtype:
        if isinstance(body, Reduce):
            raise ValueError(f"compute {name}: cast the reduction source, not the reduction, to {dtype}")
        body = tir.Cast(dtype, body)
    _check_body(body, name)
    return Tensor(name, tuple(shape), body.dtype, ComputeOp(axes, body, tag))


class TensorShapeError(UnsupportedError, ValueError):
    """A tensor the kernel layer cannot compute: a zero-size (or non-integer) dimension. Type inference allows
    empty tensors; code generation does not, and says so as a user-facing error."""


def _check_shape(shape: Sequence[int], name: str) -> None:
    for s in shape:
        if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
            raise TensorShapeError(f"tensor {name}: shape must be positive integers, got {tuple(shape)} "
                                   "(zero-size tensors cannot be compiled)")


def _axis_names(fcompute: Callable[..., ExprLike], rank: int) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) <= rank <= len(positional):  # parameters with defaults may follow the indices
        return [p.name for p in positional[:rank]]
    if any(p.kind is p.VAR_POSITIONAL for p in params) and len(required) <= rank:
        return [p.name for p in positional] + [f"ax{i}" for i in range(len(positional), rank)]
    if params:
        raise ValueError(f"compute function takes {len(required)} index arguments but the shape has rank {rank}")
    return [f"ax{i}" for i in range(rank)]


def _check_body(body: PrimExpr, name: str) -> None:
    """A reduction may only be the whole body: its value for one output element must be well defined."""
    top = body.source if isinstance(body, Reduce) else body
    for node in iter_exprs(top):
        if isinstance(node, Reduce):
            raise ValueError(f"compute {name}: a reduction must be the whole body of a compute, not part of it")
    if isinstance(body, Reduce):
        for ax in body.axes:
            if not isinstance(ax, IterVar) or ax.kind != REDUCE:
                raise ValueError(f"compute {name}: reduction axes must come from reduce_axis()")


# ---------------------------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------------------------


def _reduce(combiner: str, expr: ExprLike, axis: IterVar | Sequence[IterVar], init: ExprLike | None) -> Reduce:
    source = tir.as_expr(expr)
    axes = (axis,) if isinstance(axis, IterVar) else tuple(axis)
    if not axes:
        raise ValueError(f"{combiner} needs at least one reduce axis")
    for ax in axes:
        if not isinstance(ax, IterVar) or ax.kind != REDUCE:
            raise ValueError(f"{combiner}: {ax!r} is not a reduce_axis")
    if init is None:
        init_expr = _identity(combiner, source.dtype)
    else:
        init_expr = tir.as_expr(init, source.dtype)
        if init_expr.dtype != source.dtype:
            init_expr = tir.Cast(source.dtype, init_expr)
    return Reduce(combiner, source, axes, init_expr, source.dtype)


def sum(expr: ExprLike, axis: IterVar | Sequence[IterVar], init: ExprLike | None = None) -> Reduce:
    """Sum of `expr` over the reduce axes (starting from `init`, default 0)."""
    return _reduce("sum", expr, axis, init)


def max(expr: ExprLike, axis: IterVar | Sequence[IterVar], init: ExprLike | None = None) -> Reduce:
    """Maximum of `expr` over the reduce axes (default start: the lowest value of the dtype)."""
    return _reduce("max", expr, axis, init)


def min(expr: ExprLike, axis: IterVar | Sequence[IterVar], init: ExprLike | None = None) -> Reduce:
    """Minimum of `expr` over the reduce axes (default start: the highest value of the dtype)."""
    return _reduce("min", expr, axis, init)


def prod(expr: ExprLike, axis: IterVar | Sequence[IterVar], init: ExprLike | None = None) -> Reduce:
    """Product of `expr` over the reduce axes (starting from `init`, default 1)."""
    return _reduce("prod", expr, axis, init)


_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1),
    "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3),
}


def _finite_range(dtype: str) -> tuple[float, float] | None:
    """The lowest and highest value of a low-precision float type without infinities, else None."""
    if dtype not in FLOAT_FORMATS or FLOAT_FORMATS[dtype].inf_code is not None:
        return None
    ml_dtypes = ml_dtypes_module()
    info = ml_dtypes.finfo(getattr(ml_dtypes, dtype))
    return float(info.min), float(info.max)


def min_value(dtype: str) -> PrimExpr:
    finite = _finite_range(dtype)
    if finite is not None:  # -inf would become NaN (or the lowest value) in a type without infinities
        return tir.FloatImm(finite[0], dtype)
    if dtype.startswith(("float", "bfloat")):
        return tir.FloatImm(-math.inf, dtype)
    if dtype == "bool":
        return tir.IntImm(0, "bool")
    return tir.IntImm(_INT_RANGES[dtype][0], dtype)


def max_value(dtype: str) -> PrimExpr:
    finite = _finite_range(dtype)
    if finite is not None:
        return tir.FloatImm(finite[1], dtype)
    if dtype.startswith(("float", "bfloat")):
        return tir.FloatImm(math.inf, dtype)
    if dtype == "bool":
        return tir.IntImm(1, "bool")
    return tir.IntImm(_INT_RANGES[dtype][1], dtype)


def _identity(combiner: str, dtype: str) -> PrimExpr:
    if combiner == "sum":
        return tir.const_like(0, dtype)
    if combiner == "prod":
        return tir.const_like(1, dtype)
    if combiner == "max":
        return min_value(dtype)
    return max_value(dtype)


# ---------------------------------------------------------------------------------------------
# Scalar helpers
# ---------------------------------------------------------------------------------------------


def const(value: int | float, dtype: str = "float32") -> PrimExpr:
    return tir.const_like(value, dtype)


def cast(dtype: str, value: ExprLike) -> PrimExpr:
    expr = tir.as_expr(value)
    return expr if expr.dtype == dtype else tir.Cast(dtype, expr)


def if_then_else(cond: ExprLike, true_value: ExprLike, false_value: ExprLike) -> PrimExpr:
    """`cond ? a : b`. Reads in the branch not taken may be evaluated: lowering keeps their indices in
    bounds, so guarding an out-of-range read (padding) with a condition is safe."""
    c = tir.as_expr(cond)
    if c.dtype != "bool":
        raise TypeError(f"if_then_else condition must be boolean, got {c.dtype}")
    a = tir.as_expr(true_value) if isinstance(true_value, PrimExpr) else None
    b = tir.as_expr(false_value) if isinstance(false_value, PrimExpr) else None
    if a is None and b is None:
        a, b = tir.as_expr(true_value), tir.as_expr(false_value)
    elif a is None:
        a = tir.as_expr(true_value, b.dtype)  # type: ignore[union-attr]
    elif b is None:
        b = tir.as_expr(false_value, a.dtype)
    if a.dtype != b.dtype:  # type: ignore[union-attr]
        raise TypeError(f"if_then_else branches differ in type: {a.dtype} vs {b.dtype}")  # type: ignore[union-attr]
    return tir.Select(c, a, b)  # type: ignore[arg-type]


def equal(a: ExprLike, b: ExprLike) -> PrimExpr:
    return tir.binary("eq", a, b)


def not_equal(a: ExprLike, b: ExprLike) -> PrimExpr:
    return tir.binary("ne", a, b)


def all_of(*conds: ExprLike) -> PrimExpr:
    """Logical and of boolean expressions."""
    result = tir.as_expr(conds[0])
    for c in conds[1:]:
        result = tir.BinaryOp("and", result, tir.as_expr(c))
    return result


def any_of(*conds: ExprLike) -> PrimExpr:
    result = tir.as_expr(conds[0])
    for c in conds[1:]:
        result = tir.BinaryOp("or", result, tir.as_expr(c))
    return result


def maximum(a: ExprLike, b: ExprLike) -> PrimExpr:
    return tir.maximum(a, b)


def minimum(a: ExprLike, b: ExprLike) -> PrimExpr:
    return tir.minimum(a, b)


def _unary(name: str) -> Callable[[ExprLike], PrimExpr]:
    def intrinsic(x: ExprLike) -> PrimExpr:
        e = tir.as_expr(x)
        return tir.Call(name, (e,), e.dtype)

    intrinsic.__name__ = name
    intrinsic.__doc__ = f"Elementwise `{name}` intrinsic."
    return intrinsic


exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
erf = _unary("erf")
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
asin = _unary("asin")
acos = _unary("acos")
atan = _unary("atan")
fabs = _unary("fabs")
floor = _unary("floor")
ceil = _unary("ceil")
round = _unary("round")


def abs(x: ExprLike) -> PrimExpr:
    e = tir.as_expr(x)
    if e.dtype.startswith(("float", "bfloat")):
        return tir.Call("fabs", (e,), e.dtype)
    return tir.Select(e < 0, -e, e)


def power(x: ExprLike, y: ExprLike) -> PrimExpr:
    a = tir.as_expr(x)
    return tir.Call("pow", (a, tir.as_expr(y, a.dtype)), a.dtype)


def dot4_u8s8_i32(a: Sequence[PrimExpr], b: Sequence[PrimExpr], pairs_fit_int16: bool = False) -> PrimExpr:
    """`sum(a[k] * b[k] for k < 4)` in int32, `a` four uint8 values and `b` four int8 values (the dot-product
    intrinsic, see `tir.DOT4_INTRINSICS`). `pairs_fit_int16`: the caller has checked that `a[0]*b[0] + a[1]*b[1]`
    and `a[2]*b[2] + a[3]*b[3]` fit int16 for every value `a` can take (the b's are constants)."""
    if len(a) != 4 or len(b) != 4:
        raise ValueError("dot4_u8s8_i32 takes four values on each side")
    if any(x.dtype != "uint8" for x in a) or any(x.dtype != "int8" for x in b):
        raise ValueError("dot4_u8s8_i32 multiplies uint8 values by int8 values")
    name = "dot4_u8s8_i32_pairs16" if pairs_fit_int16 else "dot4_u8s8_i32"
    return tir.Call(name, (*a, *b), "int32")


def dot2_u8s16_i32(a: Sequence[PrimExpr], b: Sequence[PrimExpr]) -> PrimExpr:
    """`a[0] * b[0] + a[1] * b[1]` in int32, `a` two uint8 values (or int16 values in [0, 255]: uint8 widened
    already) and `b` two int16 (or int8) values (exact; one vpmaddwd per register of lanes on x86, see
    `tir.DOT2_INTRINSIC`)."""
    if len(a) != 2 or len(b) != 2:
        raise ValueError("dot2_u8s16_i32 takes two values on each side")
    if (len({x.dtype for x in a}) != 1 or a[0].dtype not in ("uint8", "int16") or len({x.dtype for x in b}) != 1
            or b[0].dtype not in ("int8", "int16")):
        raise ValueError("dot2_u8s16_i32 multiplies uint8 (or widened int16) values by int16 (or int8) values")
    return tir.Call(tir.DOT2_INTRINSIC, (*a, *b), "int32")


def dot2_bf16_f32(a: Sequence[PrimExpr], b: Sequence[PrimExpr]) -> PrimExpr:
    """`a[0] * b[0] + a[1] * b[1]` in float32 of four bfloat16 values (see `tir.DOT2_BF16_INTRINSIC`)."""
    if len(a) != 2 or len(b) != 2:
        raise ValueError("dot2_bf16_f32 takes two values on each side")
    if any(x.dtype != "bfloat16" for x in (*a, *b)):
        raise ValueError("dot2_bf16_f32 multiplies bfloat16 values")
    return tir.Call(tir.DOT2_BF16_INTRINSIC, (*a, *b), "float32")


def fma(a: ExprLike, b: ExprLike, c: ExprLike) -> PrimExpr:
    x = tir.as_expr(a)
    return tir.Call("fma", (x, tir.as_expr(b, x.dtype), tir.as_expr(c, x.dtype)), x.dtype)


# ---------------------------------------------------------------------------------------------
# Graph helpers
# ---------------------------------------------------------------------------------------------


def expr_children(node: PrimExpr) -> tuple[PrimExpr, ...]:
    """Sub-expressions of a scalar expression node (tensor-expression and loop-nest nodes alike)."""
    # Lowering and feature extraction walk millions of nodes: one dict lookup by exact type.
    children = _CHILDREN_BY_TYPE.get(type(node))
    if children is None:
        children = _children_of_subclass(type(node))
    return children(node)


def _children_of_subclass(cls: type) -> Callable[[Any], tuple[PrimExpr, ...]]:
    """The entry of the nearest registered base class (a leaf if none), remembered for `cls`."""
    children = next((_CHILDREN_BY_TYPE[base] for base in cls.__mro__ if base in _CHILDREN_BY_TYPE), _no_children)
    _CHILDREN_BY_TYPE[cls] = children
    return children


def _no_children(node: Any) -> tuple[PrimExpr, ...]:
    return ()


_CHILDREN_BY_TYPE: dict[type, Callable[[Any], tuple[PrimExpr, ...]]] = {
    tir.BinaryOp: lambda n: (n.a, n.b),
    tir.Select: lambda n: (n.cond, n.true_value, n.false_value),
    tir.Cast: lambda n: (n.value,),
    tir.Not: lambda n: (n.a,),
    tir.Call: lambda n: n.args,
    tir.Load: lambda n: n.indices,
    tir.IntImm: _no_children,
    tir.FloatImm: _no_children,
    tir.LoopVar: _no_children,
    TensorRead: lambda n: n.indices,
    Reduce: lambda n: (n.source, n.init),
}


def iter_exprs(root: PrimExpr) -> Iterator[PrimExpr]:
    """Every node reachable from `root`, each node object once, without recursion."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(expr_children(node))


def tensors_read(expr: PrimExpr) -> list[Tensor]:
    """Tensors read by an expression, in a deterministic order (first read first), each once."""
    out: list[Tensor] = []
    seen: set[int] = set()
    # a pre-order walk that visits children left to right gives "first read" order
    stack = [expr]
    visited: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, TensorRead) and id(node.tensor) not in seen:
            seen.add(id(node.tensor))
            out.append(node.tensor)
        stack.extend(reversed(expr_children(node)))
    return out


def input_tensors(tensor: Tensor) -> list[Tensor]:
    return [] if isinstance(tensor.op, PlaceholderOp) else tensors_read(tensor.op.body)


def post_order_tensors(outputs: Sequence[Tensor]) -> list[Tensor]:
    """All tensors the outputs depend on, producers before consumers, deterministic, without recursion."""
    order: list[Tensor] = []
    done: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(t, False) for t in reversed(list(outputs))]
    while stack:
        tensor, expanded = stack.pop()
        if expanded:
            if id(tensor) not in done:
                done.add(id(tensor))
                order.append(tensor)
            continue
        if id(tensor) in done:
            continue
        stack.append((tensor, True))
        for t in reversed(input_tensors(tensor)):
            if id(t) not in done:
                stack.append((t, False))
    return order


__all__ = [
    "COMBINERS", "ComputeOp", "IterVar", "PlaceholderOp", "REDUCE", "Reduce", "SPATIAL", "Tensor", "TensorRead",
    "abs", "acos", "all_of", "any_of", "asin", "atan", "cast", "ceil", "compute", "const", "cos", "equal", "erf",
    "exp", "expr_children", "fabs", "floor", "fma", "if_then_else", "input_tensors", "iter_exprs", "log", "max",
    "max_value", "maximum", "min", "min_value", "minimum", "not_equal", "placeholder", "post_order_tensors",
    "power", "prod", "reduce_axis", "round", "rsqrt", "sigmoid", "sin", "sqrt", "sum", "tan", "tanh",
    "tensors_read",
]
