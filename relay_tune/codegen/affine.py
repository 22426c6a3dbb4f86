"""Affine analysis of index expressions, used by the vectorizer to classify memory accesses.

For a load or store inside a vectorized loop over `v`, the code generator needs to know how the flat
element offset moves from one lane to the next: not at all (a broadcast), by one element (a contiguous
vector access), or irregularly (a gather/scatter). `lane_stride` answers that question by writing the
offset as `sum(coefficient * atom) + constant`, where atoms are loop variables or sub-expressions the
analysis cannot see through.

Floor division and modulo by a positive constant are common in split/fused loop nests
(`(vo * 16 + vi) // 16`); they stay affine when loop ranges prove the remainder part stays inside
`[0, divisor)`, which is checked with the extents of the enclosing loops.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from relay_tune.kernel import tir
from relay_tune.kernel.analysis import fold, with_children


@dataclass
class AffineForm:
    """`const + sum(coefficient * atom)`; `terms` maps a key of the atom -> (atom, coefficient). Keys are
    the atoms themselves (structural equality; loop variables by identity), so the same sub-expression
    written twice is one atom and its terms can cancel."""

    terms: dict[object, tuple[tir.PrimExpr, int]] = field(default_factory=dict)
    const: int = 0

    def scaled(self, factor: int) -> AffineForm:
        if factor == 0:
            return AffineForm()
        return AffineForm({k: (a, c * factor) for k, (a, c) in self.terms.items()}, self.const * factor)

    def plus(self, other: AffineForm, sign: int = 1) -> AffineForm:
        terms = dict(self.terms)
        for key, (atom, coef) in other.terms.items():
            total = terms.get(key, (atom, 0))[1] + sign * coef
            if total:
                terms[key] = (atom, total)
            else:
                terms.pop(key, None)
        return AffineForm(terms, self.const + sign * other.const)

    @property
    def is_constant(self) -> bool:
        return not self.terms


def _atom(expr: tir.PrimExpr) -> AffineForm:
    return AffineForm({expr: (expr, 1)}, 0)


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def bounds(form: AffineForm, extents: Mapping[tir.LoopVar, int]) -> tuple[int, int] | None:
    """Inclusive [min, max] of the form over the loop ranges, or None when an atom has no known range."""
    low = high = form.const
    for atom, coef in form.terms.values():
        if not isinstance(atom, tir.LoopVar) or atom not in extents:
            return None
        span = coef * (extents[atom] - 1)
        low += min(0, span)
        high += max(0, span)
    return low, high


def affine_form(expr: tir.PrimExpr, extents: Mapping[tir.LoopVar, int]) -> AffineForm:
    """Decompose an integer expression; anything non-affine becomes an opaque atom."""
    # Index expressions are shallow (a few levels per buffer dimension), so plain recursion is fine here.
    if isinstance(expr, tir.IntImm) and _is_int(expr.dtype):
        return AffineForm({}, expr.value)
    if isinstance(expr, tir.LoopVar):
        return _atom(expr)
    if isinstance(expr, tir.Cast) and _is_int(expr.dtype) and _is_int(expr.value.dtype):
        # Index casts (int32 <-> int64) keep the value as long as nothing overflows, which index math assumes.
        return affine_form(expr.value, extents)
    if isinstance(expr, tir.BinaryOp) and _is_int(expr.dtype):
        if expr.op in ("add", "sub"):
            a, b = affine_form(expr.a, extents), affine_form(expr.b, extents)
            return a.plus(b, 1 if expr.op == "add" else -1)
        if expr.op == "mul":
            a, b = affine_form(expr.a, extents), affine_form(expr.b, extents)
            if b.is_constant:
                return a.scaled(b.const)
            if a.is_constant:
                return b.scaled(a.const)
            return _atom(expr)
        if expr.op in ("floordiv", "floormod"):
            divisor = affine_form(expr.b, extents)
            if divisor.is_constant and divisor.const > 0:
                inner = expr.a
                if expr.op == "floordiv" and isinstance(inner, tir.BinaryOp) and inner.op == "floordiv":
                    first = affine_form(inner.b, extents)
                    if first.is_constant and first.const > 0:
                        # (x // p) // q == x // (p * q): one canonical atom for the quotients of fused loops
                        combined = tir.IntImm(first.const * divisor.const, expr.b.dtype)
                        return affine_form(tir.BinaryOp("floordiv", inner.a, combined, expr.dtype), extents)
                split = _split_by_divisor(affine_form(inner, extents), divisor.const, extents)
                if split is not None:
                    quotient, remainder = split
                    return quotient if expr.op == "floordiv" else remainder
                if expr.op == "floormod":
                    # x % c == x - c * (x // c): the terms of x stay visible, so the row-major recomposition
                    # of a fused loop's indices (`(f // 7) * 7 + f % 7`) cancels back to `f`
                    quotient_atom = affine_form(tir.BinaryOp("floordiv", inner, expr.b, expr.dtype), extents)
                    return affine_form(inner, extents).plus(quotient_atom.scaled(divisor.const), -1)
    return _atom(expr)


def _split_by_divisor(
    form: AffineForm, divisor: int, extents: Mapping[tir.LoopVar, int]
) -> tuple[AffineForm, AffineForm] | None:
    """Write form = divisor * quotient + remainder with 0 <= remainder < divisor, when the ranges prove it."""
    if divisor == 1:
        return form, AffineForm()
    quotient = AffineForm()
    remainder = AffineForm()
    for key, (atom, coef) in form.terms.items():
        q, r = divmod(coef, divisor)
        if q:
            quotient.terms[key] = (atom, q)
        if r:
            remainder.terms[key] = (atom, r)
    quotient.const, remainder.const = divmod(form.const, divisor)
    span = bounds(remainder, extents)
    if span is None or span[0] < 0 or span[1] >= divisor:
        return None
    return quotient, remainder


def contains_var(expr: tir.PrimExpr, var: tir.LoopVar) -> bool:
    """Whether `var` occurs anywhere in `expr` (including inside load indices)."""
    stack: list[tir.PrimExpr] = [expr]
    while stack:
        node = stack.pop()
        if node is var:
            return True
        stack.extend(operands(node))
    return False


def operands(node: tir.PrimExpr) -> Sequence[tir.PrimExpr]:
    """The direct sub-expressions of an expression node (load indices included)."""
    if isinstance(node, tir.BinaryOp):
        return (node.a, node.b)
    if isinstance(node, tir.Select):
        return (node.cond, node.true_value, node.false_value)
    if isinstance(node, tir.Cast):
        return (node.value,)
    if isinstance(node, tir.Not):
        return (node.a,)
    if isinstance(node, tir.Call):
        return node.args
    if isinstance(node, tir.Load):
        return node.indices
    return ()


def flat_form(
    indices: Sequence[tir.PrimExpr], shape: Sequence[int], extents: Mapping[tir.LoopVar, int]
) -> AffineForm:
    """Affine form of the row-major element offset of `buffer[indices]`."""
    total = AffineForm()
    stride = 1
    for index, extent in zip(reversed(indices), reversed(shape)):
        total = total.plus(affine_form(index, extents).scaled(stride))
        stride *= extent
    return total


def lane_stride(
    indices: Sequence[tir.PrimExpr],
    shape: Sequence[int],
    var: tir.LoopVar,
    extents: Mapping[tir.LoopVar, int],
) -> int | None:
    """How many elements the access moves per step of `var`; None when that is not a constant."""
    form = flat_form(indices, shape, extents)
    stride = 0
    for atom, coef in form.terms.values():
        if atom is var:
            stride = coef
        elif not isinstance(atom, tir.LoopVar) and contains_var(atom, var):
            return None
    return stride


_LANE_OPS: dict[str, Callable[[int, int], int]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "floormod": operator.mod, "min": min, "max": max,
}  # Python's // and % round towards minus infinity, as floordiv and floormod do


def _value_at(expr: tir.PrimExpr, var: tir.LoopVar, value: int) -> int | None:
    """The integer `expr` evaluates to where `var` is `value`, or None when it reads anything else (another loop
    variable, memory) or divides by zero."""
    if isinstance(expr, tir.IntImm) and _is_int(expr.dtype):
        return int(expr.value)
    if expr is var:
        return value
    if isinstance(expr, tir.Cast) and _is_int(expr.dtype) and _is_int(expr.value.dtype):
        return _value_at(expr.value, var, value)
    if isinstance(expr, tir.BinaryOp) and _is_int(expr.dtype) and expr.op in _LANE_OPS:
        a, b = _value_at(expr.a, var, value), _value_at(expr.b, var, value)
        if a is None or b is None or (b == 0 and expr.op in ("floordiv", "floormod")):
            return None
        return _LANE_OPS[expr.op](a, b)
    return None


def lane_deltas(
    indices: Sequence[tir.PrimExpr],
    shape: Sequence[int],
    var: tir.LoopVar,
    extents: Mapping[tir.LoopVar, int],
    values: Sequence[int],
) -> list[int] | None:
    """The flat offset of `buffer[indices]` where `var` takes each of `values`, less the offset at the first, when
    every part of the offset that depends on `var` depends on nothing else (so the differences are constants);
    None otherwise.

    An access whose stride is not constant can still be a fixed pattern: a vector of 32 lanes over a row of
    `NCHW8c` blocks reads a per-channel parameter at `[c, vi % 8]`, the same 8 elements four times over."""
    form = flat_form(indices, shape, extents)
    totals = [0] * len(values)
    for atom, coef in form.terms.values():
        if atom is var:
            lane_values: list[int | None] = list(values)
        elif contains_var(atom, var):
            lane_values = [_value_at(atom, var, v) for v in values]
        else:
            continue
        for i, lane_value in enumerate(lane_values):
            if lane_value is None:
                return None
            totals[i] += coef * lane_value
    return [t - totals[0] for t in totals]


_FACT_OPS = ("ge", "gt", "le", "lt", "eq")


def guard_facts(cond: tir.PrimExpr, extents: Mapping[tir.LoopVar, int]) -> list[AffineForm]:
    """Integer facts `form >= 0` that hold wherever `cond` is true (its conjuncts that compare integers)."""
    facts: list[AffineForm] = []
    stack = [cond]
    while stack:
        node = stack.pop()
        if not isinstance(node, tir.BinaryOp):
            continue
        if node.op == "and":
            stack += [node.a, node.b]
            continue
        if node.op not in _FACT_OPS or not (_is_int(node.a.dtype) and _is_int(node.b.dtype)):
            continue
        a, b = affine_form(node.a, extents), affine_form(node.b, extents)
        a_minus_b, b_minus_a = a.plus(b, -1), b.plus(a, -1)
        if node.op == "ge":
            facts.append(a_minus_b)
        elif node.op == "gt":
            facts.append(a_minus_b.plus(AffineForm({}, 1), -1))
        elif node.op == "le":
            facts.append(b_minus_a)
        elif node.op == "lt":
            facts.append(b_minus_a.plus(AffineForm({}, 1), -1))
        else:
            facts += [a_minus_b, b_minus_a]
    return facts


def _implied_nonnegative(form: AffineForm, facts: Sequence[AffineForm], extents: Mapping[tir.LoopVar, int]) -> bool:
    span = bounds(form, extents)
    if span is not None and span[0] >= 0:
        return True
    for fact in facts:
        gap = form.plus(fact, -1)  # form = fact + gap >= gap
        if gap.is_constant and gap.const >= 0:
            return True
    return False


def strip_implied_clamps(
    expr: tir.PrimExpr, facts: Sequence[AffineForm], extents: Mapping[tir.LoopVar, int]
) -> tir.PrimExpr:
    """`expr` with every index clamp `max(e, lo)` / `min(e, hi)` inside load indices removed where `facts` prove
    it changes nothing (e >= lo, e <= hi).

    Lowering clamps the indices of reads in a branch of a `Select` (both branches may be evaluated), e.g. the
    `x[min(max(w - 1, 0), 55)]` of a padding stage. Inside a vector loop such an index defeats the contiguous
    access check and becomes a gather; under the branch's own condition (`1 <= w < 57`) the clamp is the
    identity, so the code generator reads `x[w - 1]` with a masked vector load instead.
    """
    if not facts:
        return expr

    def index(node: tir.PrimExpr) -> tir.PrimExpr:
        if isinstance(node, tir.BinaryOp) and node.op in ("max", "min"):
            inner = index(node.a)
            bound = affine_form(node.b, extents)
            if bound.is_constant:
                value = affine_form(inner, extents)
                if node.op == "max":
                    needed = value.plus(bound, -1)  # e - lo >= 0
                else:
                    needed = bound.plus(value, -1)  # hi - e >= 0
                if _implied_nonnegative(needed, facts, extents):
                    return inner
            return node if inner is node.a else tir.BinaryOp(node.op, inner, node.b, node.dtype)
        return node

    def visit(node: tir.PrimExpr, kids: list[tir.PrimExpr]) -> tir.PrimExpr:
        node = with_children(node, kids)
        if isinstance(node, tir.Load):
            indices = tuple(index(i) for i in node.indices)
            if any(new is not old for new, old in zip(indices, node.indices)):
                return tir.Load(node.buffer, indices, node.dtype)
        return node

    return fold(expr, visit)
