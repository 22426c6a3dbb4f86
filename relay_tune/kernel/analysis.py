"""Arithmetic analysis of index expressions: intervals, affine forms, simplification, printing.

Schedules produce index expressions such as `(i_o * 8 + i_i) // 8` or `floormod(f, 128) * 8 + ii`;
lowering needs to (a) simplify them so that they stay affine in the loop variables (`i_o`, `x*1+0` ->
`x`), which is what the code generator needs to emit contiguous vector accesses, (b) bound them over
the loop ranges (bound inference for `compute_at`, proving tail guards redundant, keeping speculative
reads in bounds) and (c) compare and print the lowered loop nests.

Everything here walks expressions with explicit stacks: an inlined chain of elementwise operators can
nest deeply.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from relay_tune.ir.dtypes import is_low_precision
from relay_tune.kernel import te, tir
from relay_tune.kernel.tir import PrimExpr

Interval = tuple[float, float]
"""Inclusive `(low, high)`; ints when known, `-inf`/`inf` when unbounded."""

UNBOUNDED: Interval = (-math.inf, math.inf)
Ranges = Mapping[tir.LoopVar, tuple[int, int]]
"""Inclusive value range of each loop variable."""

R = TypeVar("R")


def is_int_dtype(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


# ---------------------------------------------------------------------------------------------
# Generic bottom-up folding
# ---------------------------------------------------------------------------------------------


def fold(root: PrimExpr, visit: Callable[[PrimExpr, list[Any]], R]) -> R:
    """`visit(node, results_of_children)` bottom-up over the expression, each node object once."""
    results: dict[int, Any] = {}
    # (node, its children once expanded): each node's children are listed once
    stack: list[tuple[PrimExpr, tuple[PrimExpr, ...] | None]] = [(root, None)]
    while stack:
        node, children = stack.pop()
        if children is not None:
            results[id(node)] = visit(node, [results[id(c)] for c in children])
            continue
        if id(node) in results:
            continue
        children = te.expr_children(node)
        stack.append((node, children))
        for child in children:
            if id(child) not in results:
                stack.append((child, None))
    return results[id(root)]


def with_children(node: PrimExpr, children: list[PrimExpr]) -> PrimExpr:
    """A copy of `node` with new sub-expressions (the same object when nothing changed)."""
    old = te.expr_children(node)
    if len(old) == len(children) and all(a is b for a, b in zip(old, children)):
        return node
    if isinstance(node, tir.BinaryOp):
        return tir.BinaryOp(node.op, children[0], children[1], node.dtype)
    if isinstance(node, tir.Select):
        return tir.Select(children[0], children[1], children[2], node.dtype)
    if isinstance(node, tir.Cast):
        return dataclasses.replace(node, value=children[0])
    if isinstance(node, tir.Not):
        return tir.Not(children[0])
    if isinstance(node, tir.Call):
        return tir.Call(node.name, tuple(children), node.dtype)
    if isinstance(node, tir.Load):
        return tir.Load(node.buffer, tuple(children), node.dtype)
    if isinstance(node, te.TensorRead):
        return te.TensorRead(node.tensor, tuple(children), node.dtype)
    if isinstance(node, te.Reduce):
        return te.Reduce(node.combiner, children[0], node.axes, children[1], node.dtype)
    raise TypeError(f"unknown expression node {type(node).__name__}")


def substitute(
    expr: PrimExpr,
    var_map: Mapping[tir.LoopVar, PrimExpr],
    buffer_map: Mapping[tir.Buffer, tir.Buffer] | None = None,
) -> PrimExpr:
    """Replace loop variables (and the buffers of loads) in an expression."""
    bmap = buffer_map or {}

    def visit(node: PrimExpr, kids: list[PrimExpr]) -> PrimExpr:
        if isinstance(node, tir.LoopVar):
            return var_map.get(node, node)
        new = with_children(node, kids)
        if isinstance(new, tir.Load) and new.buffer in bmap:
            return tir.Load(bmap[new.buffer], new.indices, new.dtype)
        return new

    return fold(expr, visit)


def uses_vars(expr: PrimExpr) -> set[tir.LoopVar]:
    return {n for n in te.iter_exprs(expr) if isinstance(n, tir.LoopVar)}


# ---------------------------------------------------------------------------------------------
# Intervals
# ---------------------------------------------------------------------------------------------


def _mul_bound(a: float, b: float) -> float:
    # 0 * inf is 0 here: a zero coefficient never widens a bound
    if a == 0 or b == 0:
        return 0
    return a * b


def _floordiv_bound(a: float, c: int) -> float:
    if math.isinf(a):
        return a
    return int(a) // c


def _truncdiv_bound(a: float, c: int) -> float:
    if math.isinf(a):
        return a
    n = int(a)
    return n // c if n >= 0 else -((-n) // c)


def interval_of(node: PrimExpr, kids: list[Interval], ranges: Ranges) -> Interval:
    """The interval of one node from its children's intervals."""
    if isinstance(node, (tir.IntImm, tir.FloatImm)):
        return (node.value, node.value)
    if isinstance(node, tir.LoopVar):
        if node in ranges:
            return ranges[node]
        if isinstance(node, te.IterVar):
            return (0, node.extent - 1)
        return UNBOUNDED
    if isinstance(node, tir.BinaryOp):
        (alo, ahi), (blo, bhi) = kids
        op = node.op
        if op in tir.COMPARE_OPS or op in ("and", "or"):
            return (0, 1)
        if op == "add":
            return (alo + blo, ahi + bhi)
        if op == "sub":
            return (alo - bhi, ahi - blo)
        if op == "mul":
            corners = [_mul_bound(x, y) for x in (alo, ahi) for y in (blo, bhi)]
            return (min(corners), max(corners))
        if op == "min":
            return (min(alo, blo), min(ahi, bhi))
        if op == "max":
            return (max(alo, blo), max(ahi, bhi))
        if op in ("floordiv", "div") and blo == bhi and blo > 0 and is_int_dtype(node.dtype):
            c = int(blo)
            # both roundings are monotonic in the dividend, so the ends map to the ends
            div = _truncdiv_bound if op == "div" else _floordiv_bound
            return (div(alo, c), div(ahi, c))
        if op == "floormod" and blo == bhi and blo > 0 and is_int_dtype(node.dtype):
            c = int(blo)
            if not math.isinf(alo) and not math.isinf(ahi) and int(alo) // c == int(ahi) // c:
                return (int(alo) % c, int(ahi) % c)
            return (0, c - 1)
        return UNBOUNDED
    if isinstance(node, tir.Select):
        return (min(kids[1][0], kids[2][0]), max(kids[1][1], kids[2][1]))
    if isinstance(node, tir.Not):
        return (0, 1)
    if isinstance(node, tir.Cast):
        lo, hi = kids[0]
        if node.reinterpret or is_low_precision(node.dtype):  # bits kept, or wrapped/rounded coarsely
            return UNBOUNDED
        if is_int_dtype(node.dtype):
            return (math.floor(lo) if not math.isinf(lo) else lo, math.ceil(hi) if not math.isinf(hi) else hi)
        return (lo, hi)
    return UNBOUNDED


def bound(expr: PrimExpr, ranges: Ranges) -> Interval:
    """Inclusive interval of `expr` when every loop variable stays in its range."""
    return fold(expr, lambda node, kids: interval_of(node, kids, ranges))


def _product_extent(values: list[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


# ---------------------------------------------------------------------------------------------
# Affine forms
# ---------------------------------------------------------------------------------------------


# Integer types whose arithmetic is treated as exact (index arithmetic). Narrow and unsigned types wrap within
# reach of ordinary data, where rewriting `a > b` as `a - b > 0` would be wrong (200 > 100 in uint8, say).
_LINEAR_DTYPES = frozenset({"int32", "int64"})


class Lin:
    """`const + sum(coeff * atom)` over integers. Atoms are loop variables or opaque sub-expressions,
    keyed by structural equality (so `i // 8` met twice is one atom); insertion order is kept so that
    rebuilt expressions read in the order they were written."""

    __slots__ = ("coeffs", "const", "dtype")

    def __init__(self, coeffs: dict[PrimExpr, int] | None = None, const: int = 0, dtype: str = tir.INDEX_DTYPE):
        self.coeffs = coeffs if coeffs is not None else {}
        self.const = const
        self.dtype = dtype

    @staticmethod
    def atom(expr: PrimExpr) -> Lin:
        return Lin({expr: 1}, 0, expr.dtype)

    @property
    def is_const(self) -> bool:
        return not self.coeffs

    def add(self, other: Lin, sign: int = 1) -> Lin:
        coeffs = dict(self.coeffs)
        for atom, c in other.coeffs.items():
            total = coeffs.get(atom, 0) + sign * c
            if total:
                coeffs[atom] = total
            else:
                coeffs.pop(atom, None)
        return Lin(coeffs, self.const + sign * other.const, self.dtype)

    def scale(self, factor: int) -> Lin:
        if factor == 0:
            return Lin({}, 0, self.dtype)
        return Lin({a: c * factor for a, c in self.coeffs.items()}, self.const * factor, self.dtype)

    def interval(self, atom_interval: Callable[[PrimExpr], Interval]) -> Interval:
        lo: float = self.const
        hi: float = self.const
        for atom, c in self.coeffs.items():
            alo, ahi = atom_interval(atom)
            x, y = _mul_bound(alo, c), _mul_bound(ahi, c)
            lo += min(x, y)
            hi += max(x, y)
        return (lo, hi)

    def to_expr(self) -> PrimExpr:
        """Positive terms first (in insertion order), then negative ones, then the constant."""
        dtype = self.dtype
        expr: PrimExpr | None = None
        negatives: list[tuple[PrimExpr, int]] = []
        for atom, c in self.coeffs.items():
            if c < 0:
                negatives.append((atom, -c))
                continue
            term = atom if c == 1 else tir.BinaryOp("mul", atom, tir.IntImm(c, dtype))
            expr = term if expr is None else tir.BinaryOp("add", expr, term)
        const = self.const
        if expr is None:
            expr = tir.IntImm(const, dtype)
            const = 0
        for atom, c in negatives:
            term = atom if c == 1 else tir.BinaryOp("mul", atom, tir.IntImm(c, dtype))
            expr = tir.BinaryOp("sub", expr, term)
        if const > 0:
            expr = tir.BinaryOp("add", expr, tir.IntImm(const, dtype))
        elif const < 0:
            expr = tir.BinaryOp("sub", expr, tir.IntImm(-const, dtype))
        return expr

    def __repr__(self) -> str:
        return f"Lin({self.to_expr()!r})"


def _const(value: int | float | bool, dtype: str) -> PrimExpr:
    if dtype == "bool":
        return tir.IntImm(int(bool(value)), "bool")
    if dtype.startswith("float"):
        return tir.FloatImm(float(value), dtype)
    return tir.IntImm(int(value), dtype)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _fold_compare(op: str, a: float, b: float) -> bool:
    return {
        "eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b,
    }[op]


_FLOAT_FOLD: dict[str, Callable[[float, float], float]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "min": min, "max": max,
}


class Simplifier:
    """Canonicalises integer index arithmetic into affine forms and folds constants.

    With loop ranges it also removes `floordiv`/`floormod` whose remainder part provably stays in one
    period (`(io*8 + ii) // 8 -> io` when `0 <= ii < 8`), picks the side of `min`/`max` and decides
    comparisons whose outcome the ranges fix. Float arithmetic is only constant-folded (reassociating
    it would change results).
    """

    def __init__(self, ranges: Ranges | None = None) -> None:
        self.ranges: Ranges = ranges if ranges is not None else {}
        self._atom_intervals: dict[PrimExpr, Interval] = {}

    # -- intervals of atoms (memoised: the same atom recurs in many terms)
    def atom_interval(self, atom: PrimExpr) -> Interval:
        if isinstance(atom, tir.LoopVar):
            return interval_of(atom, [], self.ranges)
        cached = self._atom_intervals.get(atom)
        if cached is None:
            cached = bound(atom, self.ranges)
            self._atom_intervals[atom] = cached
        return cached

    def lin_interval(self, lin: Lin) -> Interval:
        return lin.interval(self.atom_interval)

    def simplify(
        self,
        expr: PrimExpr,
        var_map: Mapping[tir.LoopVar, PrimExpr] | None = None,
        buffer_map: Mapping[tir.Buffer, tir.Buffer] | None = None,
    ) -> PrimExpr:
        """Simplify `expr` after substituting `var_map` (and the buffers of `buffer_map`)."""
        return self._materialize(self.linear(expr, var_map, buffer_map))

    def linear(
        self,
        expr: PrimExpr,
        var_map: Mapping[tir.LoopVar, PrimExpr] | None = None,
        buffer_map: Mapping[tir.Buffer, tir.Buffer] | None = None,
    ) -> Lin | PrimExpr:
        """The canonical form: a `Lin` for integer expressions, a simplified `PrimExpr` otherwise."""
        vmap = var_map or {}
        bmap = buffer_map or {}

        def visit(node: PrimExpr, kids: list[Lin | PrimExpr]) -> Lin | PrimExpr:
            if isinstance(node, tir.LoopVar) and node in vmap:
                replacement = vmap[node]
                if isinstance(replacement, tir.LoopVar) or isinstance(replacement, tir.IntImm):
                    return self._leaf(replacement)
                return self.linear(replacement)
            return self._visit(node, kids, bmap)

        return fold(expr, visit)

    # -- materialisation
    def _materialize(self, value: Lin | PrimExpr) -> PrimExpr:
        return value.to_expr() if isinstance(value, Lin) else value

    def _leaf(self, node: PrimExpr) -> Lin | PrimExpr:
        if isinstance(node, tir.IntImm) and node.dtype != "bool":
            return Lin({}, node.value, node.dtype)
        if isinstance(node, tir.LoopVar) and is_int_dtype(node.dtype):
            return Lin({node: 1}, 0, node.dtype)
        return node

    def _visit(
        self, node: PrimExpr, kids: list[Lin | PrimExpr], bmap: Mapping[tir.Buffer, tir.Buffer]
    ) -> Lin | PrimExpr:
        if not kids:
            if isinstance(node, tir.Load) and node.buffer in bmap:  # a rank-0 load: no indices to visit
                return tir.Load(bmap[node.buffer], (), node.dtype)
            return self._leaf(node)
        if isinstance(node, tir.BinaryOp):
            return self._binary(node, kids[0], kids[1])
        mats = [self._materialize(k) for k in kids]
        if isinstance(node, tir.Select):
            cond = mats[0]
            if isinstance(cond, tir.IntImm):
                return kids[1] if cond.value else kids[2]
            if mats[1] == mats[2]:
                return kids[1]
            return self._wrap(tir.Select(cond, mats[1], mats[2], node.dtype))
        if isinstance(node, tir.Not):
            if isinstance(mats[0], tir.IntImm):
                return tir.IntImm(int(not mats[0].value), "bool")
            return tir.Not(mats[0])
        if isinstance(node, tir.Cast):
            value = mats[0]
            if value.dtype == node.dtype:
                return kids[0]
            if isinstance(value, (tir.IntImm, tir.FloatImm)) and not (
                    node.reinterpret or is_low_precision(node.dtype) or is_low_precision(value.dtype)):
                if is_int_dtype(node.dtype):
                    folded: int | float = math.trunc(value.value)
                else:
                    folded = value.value
                return self._leaf(_const(folded, node.dtype))
            return self._wrap(dataclasses.replace(node, value=value))
        if isinstance(node, tir.Load):
            buffer = bmap.get(node.buffer, node.buffer)
            return self._wrap(tir.Load(buffer, tuple(mats), node.dtype))
        return self._wrap(with_children(node, mats))

    def _wrap(self, expr: PrimExpr) -> Lin | PrimExpr:
        """Integer-valued opaque nodes become atoms so that they can take part in sums."""
        if is_int_dtype(expr.dtype):
            return Lin.atom(expr)
        return expr

    def _binary(self, node: tir.BinaryOp, a: Lin | PrimExpr, b: Lin | PrimExpr) -> Lin | PrimExpr:
        op = node.op
        if isinstance(a, Lin) and isinstance(b, Lin) and a.dtype == b.dtype and a.dtype in _LINEAR_DTYPES:
            result = self._int_binary(op, a, b, node.dtype)
            if result is not None:
                return result
        ea, eb = self._materialize(a), self._materialize(b)
        if op in ("and", "or"):
            for x, y in ((ea, eb), (eb, ea)):
                if isinstance(x, tir.IntImm):
                    if op == "and":
                        return y if x.value else tir.IntImm(0, "bool")
                    return tir.IntImm(1, "bool") if x.value else y
            return tir.BinaryOp(op, ea, eb, node.dtype)
        if isinstance(ea, tir.FloatImm) and isinstance(eb, tir.FloatImm):
            if op in tir.COMPARE_OPS:
                return tir.IntImm(int(_fold_compare(op, ea.value, eb.value)), "bool")
            if op in _FLOAT_FOLD:
                return tir.FloatImm(float(_FLOAT_FOLD[op](ea.value, eb.value)), node.dtype)
        return self._wrap(tir.BinaryOp(op, ea, eb, node.dtype))

    def _int_binary(self, op: str, a: Lin, b: Lin, dtype: str) -> Lin | PrimExpr | None:
        if op == "add":
            return a.add(b)
        if op == "sub":
            return a.add(b, -1)
        if op == "mul":
            if b.is_const:
                return a.scale(b.const)
            if a.is_const:
                return b.scale(a.const)
            return None
        if op in tir.COMPARE_OPS:
            return self._compare(op, a, b)
        if op in ("floordiv", "floormod", "div") and b.is_const and b.const > 0:
            c = b.const
            if op == "div":
                if a.is_const:
                    return Lin({}, _trunc_div(a.const, c), dtype)
                if self.lin_interval(a)[0] < 0:
                    return None
                op = "floordiv"  # truncation equals flooring for non-negative dividends
            return self._floordiv(a, c) if op == "floordiv" else self._floormod(a, c)
        if op in ("min", "max"):
            alo, ahi = self.lin_interval(a)
            blo, bhi = self.lin_interval(b)
            if op == "min":
                if ahi <= blo:
                    return a
                if bhi <= alo:
                    return b
            else:
                if alo >= bhi:
                    return a
                if blo >= ahi:
                    return b
            diff = a.add(b, -1)
            if diff.is_const:  # same terms, different constants
                return a if (diff.const <= 0) == (op == "min") else b
            return None
        return None

    def _compare(self, op: str, a: Lin, b: Lin) -> PrimExpr:
        diff = a.add(b, -1)
        lo, hi = self.lin_interval(diff)
        # decide from the interval of a - b
        decided: bool | None = None
        if op == "lt":
            decided = True if hi < 0 else (False if lo >= 0 else None)
        elif op == "le":
            decided = True if hi <= 0 else (False if lo > 0 else None)
        elif op == "gt":
            decided = True if lo > 0 else (False if hi <= 0 else None)
        elif op == "ge":
            decided = True if lo >= 0 else (False if hi < 0 else None)
        elif op == "eq":
            decided = True if lo == hi == 0 else (False if lo > 0 or hi < 0 else None)
        elif op == "ne":
            decided = False if lo == hi == 0 else (True if lo > 0 or hi < 0 else None)
        if decided is not None:
            return tir.IntImm(int(decided), "bool")
        # canonical form: terms on the left, the constant on the right (`8*io + ii < 37`)
        lhs = Lin(dict(diff.coeffs), 0, diff.dtype)
        return tir.BinaryOp(op, lhs.to_expr(), tir.IntImm(-diff.const, diff.dtype))

    def _floordiv(self, a: Lin, c: int) -> Lin:
        if c == 1:
            return a
        if a.is_const:
            return Lin({}, a.const // c, a.dtype)
        quotient = Lin({}, 0, a.dtype)
        rest = Lin({}, 0, a.dtype)
        for atom, k in a.coeffs.items():
            if k % c == 0:
                quotient.coeffs[atom] = k // c
            else:
                rest.coeffs[atom] = k
        quotient.const = a.const // c
        rest.const = a.const % c
        lo, hi = self.lin_interval(rest)
        if not math.isinf(lo) and not math.isinf(hi) and int(lo) // c == int(hi) // c:
            quotient.const += int(lo) // c
            return quotient
        # Mixed radix: with d dividing c, a == d*Q + R where every coefficient of Q's terms is a multiple of d and
        # R stays in one period [q0*d, (q0+1)*d); then a // c == (Q + q0) // (c // d). Channel shuffles and
        # concatenations meet this: (784*f + 28*h + w) // 1568 == f // 2 for h, w < 28.
        stepped = self._floordiv_mixed_radix(a, c)
        if stepped is not None:
            return stepped
        # floordiv(floordiv(x, m), c) == floordiv(x, m * c)
        if len(rest.coeffs) == 1 and rest.const == 0:
            (atom, k), = rest.coeffs.items()
            if k == 1 and isinstance(atom, tir.BinaryOp) and atom.op == "floordiv" and isinstance(atom.b, tir.IntImm):
                inner = tir.BinaryOp("floordiv", atom.a, tir.IntImm(atom.b.value * c, a.dtype), a.dtype)
                return quotient.add(Lin.atom(inner))
        return quotient.add(Lin.atom(tir.BinaryOp("floordiv", rest.to_expr(), tir.IntImm(c, a.dtype), a.dtype)))

    def _radix_split(self, a: Lin, c: int) -> tuple[int, Lin, Lin, int] | None:
        """The largest d (1 < d < c, d divides c) with a == d*Q + R, Q's terms those whose coefficients d divides
        and R provably in [q0*d, (q0+1)*d): (d, Q, R, q0); None when there is none."""
        candidates = sorted({math.gcd(c, abs(k)) for k in a.coeffs.values()} - {1, c}, reverse=True)
        for d in candidates:
            high = Lin({atom: k // d for atom, k in a.coeffs.items() if k % d == 0}, 0, a.dtype)
            low = Lin({atom: k for atom, k in a.coeffs.items() if k % d != 0}, a.const, a.dtype)
            if not high.coeffs:
                continue
            lo, hi = self.lin_interval(low)
            if not math.isinf(lo) and not math.isinf(hi) and int(lo) // d == int(hi) // d:
                return d, high, low, int(lo) // d
        return None

    def _floordiv_mixed_radix(self, a: Lin, c: int) -> Lin | None:
        split = self._radix_split(a, c)
        if split is None:
            return None
        d, high, _low, q0 = split
        return self._floordiv(high.add(Lin({}, q0, a.dtype)), c // d)

    def _floormod(self, a: Lin, c: int) -> Lin:
        if c == 1:
            return Lin({}, 0, a.dtype)
        if a.is_const:
            return Lin({}, a.const % c, a.dtype)
        rest = Lin({atom: k for atom, k in a.coeffs.items() if k % c != 0}, a.const % c, a.dtype)
        lo, hi = self.lin_interval(rest)
        if not math.isinf(lo) and not math.isinf(hi) and int(lo) // c == int(hi) // c:
            return rest.add(Lin({}, (int(lo) // c) * c, a.dtype), -1)
        # Mixed radix (see `_floordiv`): (d*Q + R) % c == d * ((Q + q0) % (c // d)) + (R - q0*d)
        split = self._radix_split(rest, c)
        if split is not None:
            d, high, low, q0 = split
            wrapped = self._floormod(high.add(Lin({}, q0, a.dtype)), c // d).scale(d)
            return wrapped.add(low).add(Lin({}, -q0 * d, a.dtype))
        return Lin.atom(tir.BinaryOp("floormod", rest.to_expr(), tir.IntImm(c, a.dtype), a.dtype))


def simplify(expr: PrimExpr, ranges: Ranges | None = None) -> PrimExpr:
    """Simplify an expression given the ranges of its loop variables (see `Simplifier`)."""
    return Simplifier(ranges).simplify(expr)


def linear_form(expr: PrimExpr, ranges: Ranges | None = None) -> Lin | None:
    """`expr` as an affine form over atoms, or None when it is not an integer expression."""
    value = Simplifier(ranges).linear(expr)
    return value if isinstance(value, Lin) else None


# ---------------------------------------------------------------------------------------------
# Printing and structural comparison of loop nests
# ---------------------------------------------------------------------------------------------

_INFIX = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "and": "&&", "or": "||",
    "bitand": "&", "bitor": "|", "bitxor": "^",
}


class _Namer:
    """Gives loop variables and buffers stable, unique printed names (`i.0`, `i.0_1`, ...)."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()

    def name(self, obj: tir.LoopVar | tir.Buffer) -> str:
        key = id(obj)
        if key not in self.names:
            base = obj.name
            name, n = base, 0
            while name in self.used:
                n += 1
                name = f"{base}_{n}"
            self.used.add(name)
            self.names[key] = name
        return self.names[key]


def format_expr(expr: PrimExpr, namer: _Namer | None = None) -> str:
    names = namer or _Namer()

    def visit(node: PrimExpr, kids: list[str]) -> str:
        if isinstance(node, tir.IntImm):
            return ("true" if node.value else "false") if node.dtype == "bool" else str(node.value)
        if isinstance(node, tir.FloatImm):
            return repr(node.value) + ("f" if node.dtype == "float32" else "")
        if isinstance(node, tir.LoopVar):
            return names.name(node)
        if isinstance(node, tir.BinaryOp):
            if node.op in ("min", "max"):
                return f"{node.op}({kids[0]}, {kids[1]})"
            return f"({kids[0]} {_INFIX[node.op]} {kids[1]})"
        if isinstance(node, tir.Select):
            return f"select({kids[0]}, {kids[1]}, {kids[2]})"
        if isinstance(node, tir.Not):
            return f"!{kids[0]}"
        if isinstance(node, tir.Cast):
            return f"{node.dtype}({kids[0]})"
        if isinstance(node, tir.Call):
            return f"{node.name}({', '.join(kids)})"
        if isinstance(node, tir.Load):
            return f"{names.name(node.buffer)}[{', '.join(kids)}]"
        if isinstance(node, te.TensorRead):
            return f"{node.tensor.name}[{', '.join(kids)}]"
        if isinstance(node, te.Reduce):
            return f"{node.combiner}({kids[0]}, axis=[{', '.join(a.name for a in node.axes)}], init={kids[1]})"
        return repr(node)

    return fold(expr, visit)


def format_stmt(stmt: tir.Stmt, namer: _Namer | None = None, indent: int = 0) -> list[str]:
    """Lines of a readable listing of a statement (loop nests are shallow: plain recursion is fine)."""
    names = namer or _Namer()
    pad = "  " * indent
    if isinstance(stmt, tir.For):
        kind = "" if stmt.kind is tir.ForKind.SERIAL else f" {stmt.kind.value}"
        tag = f" [{stmt.thread_tag}]" if stmt.thread_tag else ""
        head = f"{pad}for {names.name(stmt.var)} in range({stmt.extent}){kind}{tag}:"
        return [head, *format_stmt(stmt.body, names, indent + 1)]
    if isinstance(stmt, tir.Store):
        idx = ", ".join(format_expr(i, names) for i in stmt.indices)
        return [f"{pad}{names.name(stmt.buffer)}[{idx}] = {format_expr(stmt.value, names)}"]
    if isinstance(stmt, tir.Seq):
        return [line for s in stmt.stmts for line in format_stmt(s, names, indent)]
    if isinstance(stmt, tir.IfThenElse):
        lines = [f"{pad}if {format_expr(stmt.cond, names)}:", *format_stmt(stmt.then_body, names, indent + 1)]
        if stmt.else_body is not None:
            lines += [f"{pad}else:", *format_stmt(stmt.else_body, names, indent + 1)]
        return lines
    if isinstance(stmt, tir.Allocate):
        b = stmt.buffer
        shape = "x".join(str(s) for s in b.shape) or "scalar"
        head = f"{pad}alloc {names.name(b)}: {b.dtype}[{shape}] {b.scope.value}"
        return [head, *format_stmt(stmt.body, names, indent)]
    if isinstance(stmt, tir.Barrier):
        return [f"{pad}barrier()"]
    raise TypeError(f"unknown statement {type(stmt).__name__}")


def format_func(func: tir.PrimFunc) -> str:
    """A deterministic text listing of a kernel; equal listings mean structurally equal kernels."""
    names = _Namer()
    params = ", ".join(
        f"{names.name(b)}: {b.dtype}[{'x'.join(str(s) for s in b.shape) or 'scalar'}]" for b in func.params
    )
    lines = [f"def {func.name}({params}):", *format_stmt(func.body, names, 1)]
    return "\n".join(lines)


def structurally_equal(a: tir.PrimFunc, b: tir.PrimFunc) -> bool:
    """Equal up to the identity of loop variables and buffers (which are binding sites)."""
    return format_func(a) == format_func(b)


def iter_stmts(stmt: tir.Stmt) -> list[tir.Stmt]:
    """Every statement of a nest, parents before children."""
    out: list[tir.Stmt] = []
    stack = [stmt]
    while stack:
        s = stack.pop()
        out.append(s)
        if isinstance(s, (tir.For, tir.Allocate)):
            stack.append(s.body)
        elif isinstance(s, tir.Seq):
            stack.extend(reversed(s.stmts))
        elif isinstance(s, tir.IfThenElse):
            if s.else_body is not None:
                stack.append(s.else_body)
            stack.append(s.then_body)
    return out


__all__ = [
    "UNBOUNDED", "Interval", "Lin", "Ranges", "Simplifier", "bound", "fold", "format_expr", "format_func",
    "format_stmt", "interval_of", "is_int_dtype", "iter_stmts", "linear_form", "simplify", "structurally_equal",
    "substitute", "uses_vars", "with_children",
]
