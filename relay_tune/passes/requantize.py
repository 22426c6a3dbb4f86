"""SimplifyRequantize: exact simplifications of the quantize / dequantize chains of QDQ models.

A QDQ graph (ONNX QuantizeLinear / DequantizeLinear, as the importer writes them) leaves chains like

    q = cast(clip(add(round(divide(y, s1)), z1), 0, 255), "uint8")        # quantize
    v = multiply(subtract(cast(q, "float32"), z2), s2)                      # dequantize

between and inside the kernels that fusion makes. Four rewrites remove work from them, each giving exactly the
reference interpreter's result (float32, ties of round to even) on every input that holds no NaN. The default
pipeline runs the pass after FuseOps, on each fused kernel's function alone (on an unfused module it rewrites the
global functions' dataflow): a kernel's result is its boundary, so an 8-bit value that a kernel returns (FuseOps
leaves its dequantize to the consumers) stays 8-bit, and only the round trips inside a kernel go.

1. Integer round trips. `cast(cast(x, D), "float32")` is `x` when `x` is a float32 value that is provably whole,
   inside the range of the integer type `D` (8 or 16 bits: every such integer is a float32) and never -0.0 (the
   round trip turns -0.0 into +0.0). The facts come from the expression: round / floor / ceil and casts from
   integers give whole values, adding or subtracting whole constants keeps them whole (a float32 sum of whole
   values rounds to a whole value), clip to whole bounds gives the range; `x + c` is never -0.0 when no element of
   `c` is -0.0 (IEEE round to nearest gives -0.0 only for -0.0 + -0.0). Only where the integer tensor has no other
   use: with another use, the fused kernel would have to compute both the float and the integer tensor.
2. Identity requantization. An elementwise chain from an 8-bit tensor `q` (cast to float32, then calls with
   constant operands: add, subtract, multiply, divide, round, floor, ceil, clip, relu, maximum, minimum) back to a
   cast to the same 8-bit type is decided exhaustively: the reference interpreter evaluates it on every one of the
   256 values at every position of the constants' broadcast shape (per-channel constants included); when it maps
   each value to itself, the chain's result is `q`. Another map stays as it is.
3. `add(x, 0)` whose every use is a clip whose every use is a cast to an integer type is `x`: adding +0.0 only
   turns -0.0 into +0.0, which no integer cast can tell apart. `add(x, -0.0)` is `x` everywhere.
4. `nn.relu(v)` whose only use is a nondecreasing elementwise chain (divide or multiply by positive constants, add
   or subtract constants, round / floor / ceil, clip) into a clip whose every use is a cast to an integer type, and
   whose chain maps 0 to at most that clip's `a_min` at every position, is `v`: the chain maps every v <= 0 to at
   most `a_min` too, so the clip gives `a_min` with or without the ReLU (the requantize of a ReLU output with zero
   point 0). Where the two differ at all, it is -0.0 against +0.0 (v = -0.0), which the integer cast cannot see.

NaN: the reference casts NaN to an integer as numpy does (an undefined conversion), where rewrite 1 keeps the NaN;
the rewrites are exact for every other float, infinities included.

Not done: folding consecutive constant multiplies or divides (float rounding makes them inexact in general), and
replacing a non-identity 8-bit chain by a per-channel table (a possible later step).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule
from relay_tune.passes.base import (
    Pass,
    PassConfig,
    call_op_name,
    map_functions,
    register_pass,
    retype,
    rewrite_dataflow,
    tensor_type_of,
    use_counts,
)
from relay_tune.passes.fold_constant import evaluate_constants
from relay_tune.type_infer import infer_types

# Integer types every value of which a float32 holds exactly (rewrite 1).
_SMALL_INTS = ("uint8", "int8", "uint16", "int16")
# Integer types whose every value rewrite 2 tries.
_BYTE_INTS = ("uint8", "int8")
# Elementwise calls rewrite 2 follows: each result element depends only on the same element of its one tensor
# operand (the other operand, if any, is a constant).
_UNARY_CHAIN = ("round", "floor", "ceil", "clip", "nn.relu")
_BINARY_CHAIN = ("add", "subtract", "multiply", "divide", "maximum", "minimum")
_ROUNDING = ("round", "floor", "ceil")
# Rewrite 2 evaluates 256 values at each position of the constants' broadcast shape: at most this many positions
# (a per-channel constant has a few thousand at most; a constant as large as an activation is not worth it).
_MAX_TABLE_POSITIONS = 1 << 16


@dataclass(frozen=True)
class _Facts:
    """What is known of every non-NaN element of a float32 expression."""

    whole: bool  # an integer (or an infinity)
    lo: float  # smallest possible value
    hi: float  # largest possible value
    no_negative_zero: bool  # never -0.0


_UNKNOWN = _Facts(False, -math.inf, math.inf, False)


def _is_float32(node: Expr) -> bool:
    ty = tensor_type_of(node)
    return ty is not None and ty.dtype == "float32"


def _constant_operand(call: Call) -> tuple[Expr, np.ndarray] | None:
    """(the tensor operand, the constant's value) of a binary call with one constant operand; None otherwise."""
    if len(call.args) != 2:
        return None
    lhs, rhs = call.args
    if isinstance(rhs, Constant) and not isinstance(lhs, Constant):
        return lhs, np.asarray(rhs.data)
    if isinstance(lhs, Constant) and not isinstance(rhs, Constant):
        return rhs, np.asarray(lhs.data)
    return None


def _whole(values: np.ndarray) -> bool:
    return bool(values.size) and bool(np.all(np.isfinite(values)) and np.all(values == np.round(values)))


def _has_zero(values: np.ndarray, negative: bool) -> bool:
    return bool(np.any((values == 0) & (np.signbit(values) == negative)))


class _FactFinder:
    """`_Facts` of the float32 nodes of one typed function, memoised by node identity."""

    def __init__(self) -> None:
        self._memo: dict[int, _Facts] = {}

    def facts(self, node: Expr) -> _Facts:
        key = id(node)
        if key not in self._memo:
            self._memo[key] = self._compute(node) if _is_float32(node) else _UNKNOWN
        return self._memo[key]

    def _compute(self, node: Expr) -> _Facts:
        if not isinstance(node, Call):
            return _UNKNOWN
        name = node.op_name
        if name == "cast":
            source = tensor_type_of(node.args[0])
            if source is not None and source.dtype in _SMALL_INTS:
                info = np.iinfo(source.dtype)
                return _Facts(True, float(info.min), float(info.max), True)
            return _UNKNOWN
        if name in _ROUNDING:
            inner = self.facts(node.args[0])
            # floor / ceil / round of a value in [lo, hi] lie in [floor(lo), ceil(hi)]
            lo = math.floor(inner.lo) if math.isfinite(inner.lo) else inner.lo
            hi = math.ceil(inner.hi) if math.isfinite(inner.hi) else inner.hi
            return _Facts(True, lo, hi, False)  # round(-0.3) is -0.0
        if name == "clip":
            return self._clip(node)
        if name == "nn.relu":
            inner = self.facts(node.args[0])
            return _Facts(inner.whole, max(inner.lo, 0.0), max(inner.hi, 0.0), inner.no_negative_zero)
        if name in ("add", "subtract"):
            operands = _constant_operand(node)
            if operands is None or (name == "subtract" and isinstance(node.args[0], Constant)):
                return _UNKNOWN
            tensor, constant = operands
            inner = self.facts(tensor)
            whole = inner.whole and _whole(constant)
            if name == "add":
                # x + c is -0.0 only when both are -0.0
                no_negative_zero = not _has_zero(constant, negative=True) or inner.no_negative_zero
            else:
                # x - c is -0.0 only when x is -0.0 and c is +0.0
                no_negative_zero = not _has_zero(constant, negative=False) or inner.no_negative_zero
            # bounds are not tracked through sums (float rounding would need care); clip gives them again
            return _Facts(whole, -math.inf, math.inf, no_negative_zero)
        return _UNKNOWN

    def _clip(self, node: Call) -> _Facts:
        inner = self.facts(node.args[0])
        a_min, a_max = float(node.attrs["a_min"]), float(node.attrs["a_max"])  # type: ignore[arg-type]
        bounds = np.asarray([a_min, a_max], dtype=np.float32)
        if not _whole(bounds) or a_min > a_max:
            return _Facts(False, -math.inf, math.inf, False)
        lo, hi = max(inner.lo, a_min), min(inner.hi, a_max)
        if lo > hi:
            lo, hi = a_min, a_max
        # the result is x, a_min or a_max: never -0.0 when none of them is, or when 0 is outside [a_min, a_max]
        bounds_positive_zero = not _has_zero(bounds, negative=True)
        no_negative_zero = (inner.no_negative_zero and bounds_positive_zero) or a_min > 0 or a_max < 0
        return _Facts(inner.whole, lo, hi, no_negative_zero)


def _round_trip_source(node: Call, counts: dict[int, int], finder: _FactFinder) -> Expr | None:
    """`x` where `node` is `cast(cast(x, D), "float32")` and rewrite 1 applies (see the module docstring)."""
    if node.op_name != "cast" or not _is_float32(node):
        return None
    inner = node.args[0]
    if not isinstance(inner, Call) or inner.op_name != "cast" or counts.get(id(inner), 0) != 1:
        return None
    int_type = tensor_type_of(inner)
    source = inner.args[0]
    if int_type is None or int_type.dtype not in _SMALL_INTS or not _is_float32(source):
        return None
    facts = finder.facts(source)
    info = np.iinfo(int_type.dtype)
    if facts.whole and facts.no_negative_zero and facts.lo >= info.min and facts.hi <= info.max:
        return source
    return None


def _byte_chain(node: Call) -> tuple[Expr, list[Call]] | None:
    """(`q`, the calls from `cast(q, "float32")` up to `node`) where `node` is `cast(v, D)` (D 8-bit) of an
    elementwise float32 chain with constant operands that starts at `cast(q, "float32")`, `q` of type D and of
    `node`'s shape; None otherwise."""
    out_type = tensor_type_of(node)
    if node.op_name != "cast" or out_type is None or out_type.dtype not in _BYTE_INTS:
        return None
    chain: list[Call] = [node]
    current = node.args[0]
    while True:
        if not isinstance(current, Call) or not _is_float32(current):
            return None
        chain.append(current)
        name = current.op_name
        if name == "cast":
            q = current.args[0]
            q_type = tensor_type_of(q)
            if q_type is None or q_type != out_type:
                return None
            chain.reverse()
            return q, chain
        if name in _UNARY_CHAIN:
            current = current.args[0]
        elif name in _BINARY_CHAIN:
            operands = _constant_operand(current)
            if operands is None:
                return None
            current = operands[0]
        else:
            return None


def _constants_shape(chain: list[Call]) -> tuple[int, ...] | None:
    """The broadcast shape of the constant operands of `chain`; None when it has more than `_MAX_TABLE_POSITIONS`
    positions."""
    shapes = [np.shape(arg.data) for call in chain for arg in call.args if isinstance(arg, Constant)]
    broadcast = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
    return broadcast if math.prod(broadcast) <= _MAX_TABLE_POSITIONS else None


def _evaluate_chain(chain: list[Call], values: np.ndarray) -> np.ndarray:
    """`chain` (elementwise calls, each with one non-constant operand: the previous call's result) applied by the
    reference interpreter to `values`."""
    rebuilt: Expr = Constant(values)
    for call in chain:
        args = tuple(arg if isinstance(arg, Constant) else rebuilt for arg in call.args)
        rebuilt = Call(call.op, args, call.attrs)
    (result,) = evaluate_constants([rebuilt])
    return np.asarray(result)


def _is_identity(chain: list[Call], dtype: str) -> bool:
    """Whether the reference interpreter maps every value of `dtype` to itself through `chain` (elementwise calls,
    the first one reading the 8-bit tensor) at every position of the constants' broadcast shape."""
    broadcast = _constants_shape(chain)
    if broadcast is None:
        return False
    info = np.iinfo(dtype)
    values = np.arange(int(info.min), int(info.max) + 1).astype(dtype)
    every = np.ascontiguousarray(np.broadcast_to(values.reshape((-1,) + (1,) * len(broadcast)),
                                                 values.shape + broadcast))
    result = _evaluate_chain(chain, every)
    return result.dtype == every.dtype and result.shape == every.shape and bool(np.array_equal(result, every))


def _nondecreasing_step(node: Expr, source: Expr) -> bool:
    """Whether `node` is a nondecreasing elementwise float32 function of its operand `source` (rewrite 4)."""
    if not isinstance(node, Call) or not _is_float32(node) or tensor_type_of(node) != tensor_type_of(source):
        return False
    name = node.op_name
    if name in _ROUNDING or name == "clip":
        return True
    operands = _constant_operand(node)
    if operands is None or operands[0] is not source:
        return False
    constant = operands[1]
    if name in ("add", "subtract"):
        return name == "add" or node.args[0] is source  # c - x decreases
    if name in ("multiply", "divide"):
        positive = bool(constant.size) and bool(np.all(np.isfinite(constant)) and np.all(constant > 0))
        return positive and (name == "multiply" or node.args[0] is source)
    return False


def _relu_absorbed(node: Call, uses: dict[int, list[Expr]]) -> bool:
    """Whether `node` is a ReLU that rewrite 4 drops (see the module docstring)."""
    if node.op_name != "nn.relu" or not _is_float32(node):
        return False
    chain: list[Call] = []
    current: Expr = node
    while True:
        users = uses.get(id(current), [])
        if len(users) != 1 or not _nondecreasing_step(users[0], current):
            return False
        user = users[0]
        assert isinstance(user, Call)
        if user.op_name == "clip":
            clip_users = uses.get(id(user), [])
            integer_casts = bool(clip_users) and all(
                call_op_name(u) == "cast" and (t := tensor_type_of(u)) is not None
                and np.issubdtype(np.dtype(t.dtype), np.integer) for u in clip_users)
            if integer_casts:
                break
        chain.append(user)
        current = user
    a_min = float(user.attrs["a_min"])  # type: ignore[arg-type]
    if not chain:
        return a_min >= 0  # clip(relu(v), a_min >= 0, ...) is clip(v, ...)
    broadcast = _constants_shape(chain)
    if broadcast is None:
        return False
    mapped = _evaluate_chain(chain, np.zeros(broadcast, dtype=np.float32))
    return bool(np.all(mapped <= np.float32(a_min)))


def _dropped_zero_add(node: Call, uses: dict[int, list[Expr]]) -> Expr | None:
    """`x` where `node` is `add(x, 0)` and rewrite 3 applies (see the module docstring)."""
    if node.op_name != "add" or not _is_float32(node):
        return None
    operands = _constant_operand(node)
    if operands is None:
        return None
    tensor, constant = operands
    if constant.size == 0 or np.any(constant != 0) or tensor_type_of(tensor) != tensor_type_of(node):
        return None
    if np.all(np.signbit(constant)):
        return tensor  # x + -0.0 is x for every x
    for user in uses.get(id(node), []):
        if call_op_name(user) != "clip":
            return None
        for clip_user in uses.get(id(user), []):
            cast_type = tensor_type_of(clip_user)
            if call_op_name(clip_user) != "cast" or cast_type is None or not np.issubdtype(
                    np.dtype(cast_type.dtype), np.integer):
                return None
        if not uses.get(id(user)):
            return None  # the clip is the function's result
    return tensor if uses.get(id(node)) else None


def _users(func: Function) -> dict[int, list[Expr]]:
    """The nodes that use each node of `func` as an argument (the function's result has no listed user)."""
    result: dict[int, list[Expr]] = {}
    seen: set[int] = set()
    stack: list[Expr] = [func.body]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Function):
            continue
        for child in node.children():
            result.setdefault(id(child), []).append(node)
            stack.append(child)
    result.setdefault(id(func.body), []).append(func)  # the result escapes: a use that is no clip or cast
    return result


@register_pass
@dataclass(frozen=True)
class SimplifyRequantize(Pass):
    """Remove integer round trips, identity requantizations, dead zero additions and ReLUs that a requantize
    absorbs from quantize / dequantize chains, exactly (see the module docstring)."""

    name: ClassVar[str] = "SimplifyRequantize"
    opt_level: ClassVar[int] = 2
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        mod, changed = map_functions(mod, self._in_kernels)
        mod = retype(mod, changed)
        # Two rounds: rewrite 3 must see the casts rewrite 1 removed (an add of 0 is what proves a value is never
        # -0.0 for rewrite 1, and stays needed where the integer cast goes). The module is retyped between them as
        # a whole: a global function may call another.
        mod, changed = map_functions(mod, self._round_trips)
        mod = retype(mod, changed)
        mod, changed = map_functions(mod, self._zero_adds)
        return retype(mod, changed)

    @classmethod
    def simplify_function(cls, func: Function) -> Function:
        """`func` (typed, calling no other global function) with the four rewrites applied, in `transform`'s two
        rounds."""
        rounded = cls._round_trips(func)
        if rounded is not func:
            rounded = infer_types(IRModule({"main": rounded}))["main"]
        return cls._zero_adds(rounded)

    @classmethod
    def _in_kernels(cls, func: Function) -> Function:
        """`func` with every fused kernel's function (a `Primitive=1` literal) simplified on its own: after fusion
        a kernel's parameters and result are its boundary, so an 8-bit value a kernel returns stays 8-bit, and only
        the round trips inside a kernel go."""

        def visit(orig: Expr, new: Expr) -> Expr:
            if not (isinstance(new, Function) and new.is_primitive):
                return new
            plain = Function(new.params, new.body, new.ret_type)
            simplified = cls.simplify_function(infer_types(IRModule({"main": plain}))["main"])
            if simplified.body is plain.body:
                return new
            return Function(new.params, simplified.body, new.ret_type, new.attrs, new.type_params)

        out = rewrite_dataflow(func, visit)
        assert isinstance(out, Function)
        return out

    @staticmethod
    def _round_trips(func: Function) -> Function:
        counts = use_counts(func)
        finder = _FactFinder()

        def source_of(call: Call) -> Expr | None:
            source = _round_trip_source(call, counts, finder)
            if source is None:
                chain = _byte_chain(call)
                if chain is not None and _is_identity(chain[1], chain[1][-1].checked_type.dtype):  # type: ignore[attr-defined]
                    source = chain[0]
            return source

        return _bypass_calls(func, source_of)

    @staticmethod
    def _zero_adds(func: Function) -> Function:
        uses = _users(func)

        def source_of(call: Call) -> Expr | None:
            source = _dropped_zero_add(call, uses)
            if source is None and _relu_absorbed(call, uses):
                source = call.args[0]
            return source

        return _bypass_calls(func, source_of)


def _bypass_calls(func: Function, source_of: Callable[[Call], Expr | None]) -> Function:
    """`func` with every call for which `source_of` (given the typed original call) names an earlier value replaced
    by that value (as rewritten itself)."""
    memo: dict[int, Expr] = {}

    def visit(orig: Expr, new: Expr) -> Expr:
        result = new
        if isinstance(orig, Call):
            source = source_of(orig)
            if source is not None:
                result = memo.get(id(source), source)
        memo[id(orig)] = result
        return result

    out = rewrite_dataflow(func, visit)
    assert isinstance(out, Function)
    return out
