"""A reference interpreter for loop-nest kernels: slow, exact, and strict.

`evaluate(func, *arrays)` runs a `PrimFunc` on numpy arrays (one per parameter, in order) and writes
the results into them. It exists to check schedules and lowering independently of any code
generator, so it is deliberately strict where generated code would silently misbehave:

- every load and store checks each index against its dimension (a negative or too-large index
  raises `TirEvalError`, even if the flat offset would land inside the buffer);
- both branches of a `Select` are evaluated, as compiled code may do, so a speculative read out of
  bounds is caught too;
- scratch buffers (`Allocate`) start filled with NaN (floats) or a sentinel (ints), so a read of a
  value that was never written shows up in the results.

Loops run sequentially whatever their annotation (parallel, vectorized, unrolled or bound to a GPU
thread index); barriers do nothing. Arithmetic is done in Python floats and ints (float64 and
unbounded integers) and rounded to the buffer's dtype when the results are copied back, so results
are compared with a tolerance.

Internally the kernel is translated to a Python function once (`compile_func`); the result can be
called many times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from relay_tune.errors import RelayTuneError
from relay_tune.ir.dtypes import is_low_precision
from relay_tune.kernel import analysis, tir

UNINITIALIZED_INT = -123456789
"""Value of never-written integer scratch elements (floats get NaN)."""

_MAX_NESTING = 24  # Python's parser limits nesting: deeper sub-expressions go to temporaries


class TirEvalError(RelayTuneError):
    """The kernel did something invalid (out-of-bounds access) while being interpreted."""


def _oob(buffer: str, dim: int, index: int, extent: int) -> Any:
    raise TirEvalError(f"out-of-bounds access {buffer}[..., {index}, ...] in dimension {dim} (extent {extent})")


def _tdiv(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise TirEvalError("integer division by zero")
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q
    return _fdiv(a, b)


def _fdiv(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _floordiv(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise TirEvalError("integer division by zero")
        return a // b
    return math.floor(_fdiv(a, b))


def _floormod(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise TirEvalError("integer modulo by zero")
        return a % b
    return a - math.floor(_fdiv(a, b)) * b


def _select(cond: Any, a: Any, b: Any) -> Any:
    return a if cond else b


def _fmax(a: Any, b: Any) -> Any:
    if a != a or b != b:  # NaN propagates, as in the numpy reference
        return math.nan
    return a if a >= b else b


def _fmin(a: Any, b: Any) -> Any:
    if a != a or b != b:
        return math.nan
    return a if a <= b else b


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _log(x: float) -> float:
    if x != x:
        return x
    if x < 0:
        return math.nan
    return -math.inf if x == 0 else math.log(x)


def _sqrt(x: float) -> float:
    return math.nan if x < 0 or x != x else math.sqrt(x)


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + _exp(-x))
    e = _exp(x)
    return e / (1.0 + e)


def _pow(x: float, y: float) -> float:
    try:
        return math.pow(x, y)
    except (OverflowError, ValueError):
        return float(np.power(np.float64(x), np.float64(y)))


def _round(x: float) -> float:
    # round half away from zero, like C's roundf
    return math.copysign(math.floor(abs(x) + 0.5), x) if x == x and not math.isinf(x) else x


def _reinterpret(x: Any, src: str, dst: str) -> Any:
    """The bits of `x`, a value of dtype `src`, read as `dst` (of the same width)."""
    return np.array(x, dtype=src).view(dst).item()


def _to_int(x: Any) -> int:
    if isinstance(x, float):
        if x != x or math.isinf(x):
            raise TirEvalError(f"cast of {x} to an integer")
        return int(x)  # truncation toward zero, as C casts
    return int(x)


_INTRINSICS: dict[str, Callable[..., Any]] = {
    "exp": _exp, "log": _log, "sqrt": _sqrt, "rsqrt": lambda x: _fdiv(1.0, _sqrt(x)), "tanh": math.tanh,
    "sigmoid": _sigmoid, "erf": math.erf, "fabs": abs, "pow": _pow,
    "floor": lambda x: float(math.floor(x)) if math.isfinite(x) else x,
    "ceil": lambda x: float(math.ceil(x)) if math.isfinite(x) else x,
    "round": _round, "fma": lambda a, b, c: a * b + c,
    "sin": lambda x: math.sin(x) if math.isfinite(x) else math.nan,
    "cos": lambda x: math.cos(x) if math.isfinite(x) else math.nan,
    "tan": lambda x: math.tan(x) if math.isfinite(x) else math.nan,
    "asin": lambda x: math.asin(x) if -1.0 <= x <= 1.0 else math.nan,
    "acos": lambda x: math.acos(x) if -1.0 <= x <= 1.0 else math.nan,
    "atan": lambda x: math.atan(x) if x == x else math.nan,
    "dot4_u8s8_i32": lambda *v: sum(int(a) * int(b) for a, b in zip(v[:4], v[4:])),
    "dot4_u8s8_i32_pairs16": lambda *v: sum(int(a) * int(b) for a, b in zip(v[:4], v[4:])),
    "dot2_u8s16_i32": lambda *v: sum(int(a) * int(b) for a, b in zip(v[:2], v[2:])),
    "dot2_bf16_f32": lambda *v: v[0] * v[2] + v[1] * v[3],
}

_PY_OPS = {
    "add": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "and": "and", "or": "or",
    # Python's bitwise operators on in-range integers give in-range two's-complement results
    "bitand": "&", "bitor": "|", "bitxor": "^",
}


class _Translator:
    def __init__(self, func: tir.PrimFunc) -> None:
        self.func = func
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.globals: dict[str, Any] = {
            "_oob": _oob, "_tdiv": _tdiv, "_fdiv": _fdiv, "_floordiv": _floordiv, "_floormod": _floormod,
            "_select": _select, "_fmax": _fmax, "_fmin": _fmin, "_to_int": _to_int, "_reinterpret": _reinterpret,
            "_nan": math.nan, "_inf": math.inf, "_UNINIT": UNINITIALIZED_INT,
        }
        for name, fn in _INTRINSICS.items():
            self.globals[f"_i_{name}"] = fn
        self.counter = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def name_of(self, obj: tir.LoopVar | tir.Buffer, prefix: str) -> str:
        key = id(obj)
        if key not in self.names:
            self.names[key] = self.fresh(prefix)
        return self.names[key]

    # -- expressions: returns (python source, nesting depth); deep parts are hoisted into temporaries
    def expr(self, e: tir.PrimExpr, indent: str) -> str:
        def visit(node: tir.PrimExpr, kids: list[tuple[str, int]]) -> tuple[str, int]:
            src = self._node(node, [k[0] for k in kids])
            depth = 1 + max((k[1] for k in kids), default=0)
            if depth >= _MAX_NESTING:
                tmp = self.fresh("_t")
                self.lines.append(f"{indent}{tmp} = {src}")
                return tmp, 1
            return src, depth

        return analysis.fold(e, visit)[0]

    def _index(self, buffer: tir.Buffer, idx: list[str]) -> str:
        if len(idx) != len(buffer.shape):
            raise TirEvalError(f"buffer {buffer.name} has rank {len(buffer.shape)} but is indexed with {len(idx)}")
        if not buffer.shape:
            return "0"
        flat = ""
        for d, (src, extent) in enumerate(zip(idx, buffer.shape)):
            t = self.fresh("_x")
            checked = f"({t} if 0 <= ({t} := {src}) < {extent} else _oob({buffer.name!r}, {d}, {t}, {extent}))"
            stride = 1
            for s in buffer.shape[d + 1 :]:
                stride *= s
            term = checked if stride == 1 else f"{checked} * {stride}"
            flat = term if not flat else f"{flat} + {term}"
        return flat

    def _node(self, node: tir.PrimExpr, kids: list[str]) -> str:
        if isinstance(node, tir.IntImm):
            return ("True" if node.value else "False") if node.dtype == "bool" else str(node.value)
        if isinstance(node, tir.FloatImm):
            v = node.value
            if v != v:
                return "_nan"
            if math.isinf(v):
                return "_inf" if v > 0 else "(-_inf)"
            return repr(float(v))
        if isinstance(node, tir.LoopVar):
            if id(node) not in self.names:
                raise TirEvalError(f"loop variable {node.name} is used outside of its loop")
            return self.names[id(node)]
        if isinstance(node, tir.BinaryOp):
            a, b = kids
            is_float = node.a.dtype.startswith("float")
            if node.op in _PY_OPS:
                return f"({a} {_PY_OPS[node.op]} {b})"
            if node.op == "div":
                return f"_fdiv({a}, {b})" if is_float else f"_tdiv({a}, {b})"
            if node.op == "floordiv":
                return f"_floordiv({a}, {b})"
            if node.op == "floormod":
                return f"_floormod({a}, {b})"
            if node.op == "min":
                return f"_fmin({a}, {b})" if is_float else f"min({a}, {b})"
            if node.op == "max":
                return f"_fmax({a}, {b})" if is_float else f"max({a}, {b})"
            raise TirEvalError(f"unknown binary op {node.op}")
        if isinstance(node, tir.Not):
            return f"(not {kids[0]})"
        if isinstance(node, tir.Select):
            return f"_select({kids[0]}, {kids[1]}, {kids[2]})"
        if isinstance(node, tir.Cast):
            if is_low_precision(node.dtype) or is_low_precision(node.value.dtype):
                # Python floats and ints cannot round to these types: refused, not approximated
                raise TirEvalError(f"the loop-nest interpreter does not evaluate conversions between "
                                   f"{node.value.dtype} and {node.dtype}")
            if node.reinterpret:
                return f"_reinterpret({kids[0]}, {node.value.dtype!r}, {node.dtype!r})"
            if node.dtype.startswith("float"):
                return f"float({kids[0]})"
            if node.dtype == "bool":
                return f"bool({kids[0]})"
            return f"_to_int({kids[0]})"
        if isinstance(node, tir.Call):
            return f"_i_{node.name}({', '.join(kids)})"
        if isinstance(node, tir.Load):
            return f"{self.name_of(node.buffer, '_b')}[{self._index(node.buffer, kids)}]"
        raise TirEvalError(f"cannot interpret expression node {type(node).__name__}")

    # -- statements (loop nests are shallow: recursion over statements is fine)
    def stmt(self, s: tir.Stmt, depth: int) -> None:
        indent = "    " * depth
        if isinstance(s, tir.For):
            if s.extent <= 0:
                return
            v = self.name_of(s.var, "_v")
            self.lines.append(f"{indent}for {v} in range({s.extent}):")
            self.stmt(s.body, depth + 1)
        elif isinstance(s, tir.Store):
            idx = [self.expr(i, indent) for i in s.indices]
            value = self.expr(s.value, indent)
            target = self.name_of(s.buffer, "_b")
            self.lines.append(f"{indent}{target}[{self._index(s.buffer, idx)}] = {value}")
        elif isinstance(s, tir.Seq):
            if not s.stmts:
                self.lines.append(f"{indent}pass")
            for x in s.stmts:
                self.stmt(x, depth)
        elif isinstance(s, tir.IfThenElse):
            cond = self.expr(s.cond, indent)
            self.lines.append(f"{indent}if {cond}:")
            self.stmt(s.then_body, depth + 1)
            if s.else_body is not None:
                self.lines.append(f"{indent}else:")
                self.stmt(s.else_body, depth + 1)
        elif isinstance(s, tir.Allocate):
            b = s.buffer
            fill = "_nan" if b.dtype.startswith("float") else ("False" if b.dtype == "bool" else "_UNINIT")
            self.lines.append(f"{indent}{self.name_of(b, '_b')} = [{fill}] * {max(b.size, 1)}")
            self.stmt(s.body, depth)
        elif isinstance(s, tir.Barrier):
            self.lines.append(f"{indent}pass  # barrier")
        else:
            raise TirEvalError(f"cannot interpret statement {type(s).__name__}")

    def translate(self) -> str:
        params = [self.name_of(b, "_b") for b in self.func.params]
        self.lines.append(f"def _kernel({', '.join(params)}):")
        start = len(self.lines)
        self.stmt(self.func.body, 1)
        if len(self.lines) == start:
            self.lines.append("    pass")
        return "\n".join(self.lines)


class CompiledFunc:
    """A kernel translated to Python; call it with one numpy array per parameter."""

    def __init__(self, func: tir.PrimFunc) -> None:
        self.func = func
        translator = _Translator(func)
        self.source = translator.translate()
        namespace = dict(translator.globals)
        exec(compile(self.source, f"<tir {func.name}>", "exec"), namespace)
        self._kernel = namespace["_kernel"]
        self._written = _written_params(func)

    def __call__(self, *arrays: np.ndarray) -> None:
        params = self.func.params
        if len(arrays) != len(params):
            raise TirEvalError(f"{self.func.name} takes {len(params)} arrays, got {len(arrays)}")
        flats: list[list[Any]] = []
        for buf, arr in zip(params, arrays):
            if tuple(arr.shape) != buf.shape:
                raise TirEvalError(f"argument {buf.name}: expected shape {buf.shape}, got {tuple(arr.shape)}")
            if np.dtype(arr.dtype) != np.dtype(buf.dtype):
                raise TirEvalError(f"argument {buf.name}: expected dtype {buf.dtype}, got {arr.dtype}")
            flats.append(arr.reshape(-1).tolist())
        self._kernel(*flats)
        for i, (buf, arr) in enumerate(zip(params, arrays)):
            if i in self._written:
                arr[...] = np.asarray(flats[i], dtype=np.float64 if buf.dtype.startswith("float") else None).astype(
                    arr.dtype
                ).reshape(arr.shape)


def _written_params(func: tir.PrimFunc) -> set[int]:
    stored = {id(s.buffer) for s in analysis.iter_stmts(func.body) if isinstance(s, tir.Store)}
    return {i for i, b in enumerate(func.params) if id(b) in stored}


def compile_func(func: tir.PrimFunc) -> CompiledFunc:
    return CompiledFunc(func)


def evaluate(func: tir.PrimFunc, *arrays: np.ndarray) -> None:
    """Run `func` on `arrays` (one per parameter, in order); outputs are written in place."""
    CompiledFunc(func)(*arrays)


def run(func: tir.PrimFunc, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run `func` on its leading input arrays; returns fresh arrays for the remaining parameters."""
    params = func.params
    if len(inputs) > len(params):
        raise TirEvalError(f"{func.name} takes {len(params)} arrays, got {len(inputs)} inputs")
    outs = [np.zeros(b.shape, dtype=b.dtype) for b in params[len(inputs) :]]
    evaluate(func, *inputs, *outs)
    return outs


__all__ = ["UNINITIALIZED_INT", "CompiledFunc", "TirEvalError", "compile_func", "evaluate", "run"]
