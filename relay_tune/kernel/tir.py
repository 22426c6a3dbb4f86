"""The loop-nest IR: what a scheduled kernel looks like just before code generation.

A `PrimFunc` is a function over flat buffers whose body is a tree of statements: loops (`For`, with an
annotation saying how the loop runs: serial, parallel across cores, vectorized, unrolled, or bound to a
GPU thread/block index), stores, conditionals, scratch allocations and barriers. Scalar and index
arithmetic is a small expression language (`PrimExpr`).

The IR is target-neutral: the LLVM CPU back end turns `PARALLEL` loops into work shared across
threads and `VECTORIZED` loops into SIMD code; the NVPTX back end turns `THREAD_BINDING` loops into
`threadIdx`/`blockIdx` reads and `shared` buffers into shared memory. Nothing in here names a target.

Nodes are immutable. `LoopVar` and `Buffer` compare by identity (they are binding sites); every other
node compares by value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from relay_tune.ir.dtypes import LOW_PRECISION_DTYPES, ml_dtypes_module

# ---------------------------------------------------------------------------------------------
# Scalar expressions
# ---------------------------------------------------------------------------------------------

INDEX_DTYPE = "int64"


class PrimExpr:
    """Base class of scalar expressions. Every expression has a `dtype` (e.g. "float32", "int64", "bool")."""

    __slots__ = ()
    dtype: str

    # Operator sugar keeps schedules and computes readable: `i * 16 + j`.
    def __add__(self, other: ExprLike) -> PrimExpr:
        return binary("add", self, other)

    def __radd__(self, other: ExprLike) -> PrimExpr:
        return binary("add", other, self)

    def __sub__(self, other: ExprLike) -> PrimExpr:
        return binary("sub", self, other)

    def __rsub__(self, other: ExprLike) -> PrimExpr:
        return binary("sub", other, self)

    def __mul__(self, other: ExprLike) -> PrimExpr:
        return binary("mul", self, other)

    def __rmul__(self, other: ExprLike) -> PrimExpr:
        return binary("mul", other, self)

    def __truediv__(self, other: ExprLike) -> PrimExpr:
        return binary("div", self, other)

    def __floordiv__(self, other: ExprLike) -> PrimExpr:
        return binary("floordiv", self, other)

    def __mod__(self, other: ExprLike) -> PrimExpr:
        return binary("floormod", self, other)

    def __neg__(self) -> PrimExpr:
        return binary("sub", const_like(0, self.dtype), self)

    def __lt__(self, other: ExprLike) -> PrimExpr:  # type: ignore[override]
        return binary("lt", self, other)

    def __le__(self, other: ExprLike) -> PrimExpr:  # type: ignore[override]
        return binary("le", self, other)

    def __gt__(self, other: ExprLike) -> PrimExpr:  # type: ignore[override]
        return binary("gt", self, other)

    def __ge__(self, other: ExprLike) -> PrimExpr:  # type: ignore[override]
        return binary("ge", self, other)


ExprLike = PrimExpr | int | float | bool


@dataclass(frozen=True, slots=True)
class IntImm(PrimExpr):
    value: int
    dtype: str = INDEX_DTYPE


@dataclass(frozen=True, slots=True)
class FloatImm(PrimExpr):
    value: float
    dtype: str = "float32"


@dataclass(frozen=True, slots=True, eq=False)
class LoopVar(PrimExpr):
    """A loop induction variable (or a symbolic size). Compares by identity."""

    name: str
    dtype: str = INDEX_DTYPE

    def __repr__(self) -> str:
        return self.name


BITWISE_OPS = frozenset({"bitand", "bitor", "bitxor"})
"""Bitwise operators on integers (two's complement). `and` and `or` are logical: on booleans."""
BINARY_OPS = frozenset(
    {"add", "sub", "mul", "div", "floordiv", "floormod", "min", "max", "and", "or",
     "eq", "ne", "lt", "le", "gt", "ge", *BITWISE_OPS}
)
COMPARE_OPS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


@dataclass(frozen=True, slots=True)
class BinaryOp(PrimExpr):
    """`op(a, b)`. `div` is true division for floats and truncating division for ints; `floordiv` and
    `floormod` round toward negative infinity (what index arithmetic wants)."""

    op: str
    a: PrimExpr
    b: PrimExpr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"unknown binary op {self.op}")
        if not self.dtype:
            dtype = "bool" if self.op in COMPARE_OPS else self.a.dtype
            object.__setattr__(self, "dtype", dtype)


@dataclass(frozen=True, slots=True)
class Not(PrimExpr):
    a: PrimExpr
    dtype: str = "bool"


@dataclass(frozen=True, slots=True)
class Select(PrimExpr):
    """`cond ? true_value : false_value` (both sides may be evaluated)."""

    cond: PrimExpr
    true_value: PrimExpr
    false_value: PrimExpr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.true_value.dtype)


@dataclass(frozen=True, slots=True)
class Cast(PrimExpr):
    """`value` converted to `dtype`. The conversion rounds to nearest-even into floats; `saturate` and
    `round_mode` only matter for the low-precision float targets (ONNX Cast: `saturate` clamps float8
    overflow to the largest finite value, `round_mode` ("up", "down", "nearest") rounds to float8_e8m0fnu;
    "" is nearest, not saturating). `reinterpret` keeps the bits instead (both types of the same width)."""

    dtype: str
    value: PrimExpr
    saturate: bool = False
    round_mode: str = ""
    reinterpret: bool = False


INTRINSICS = frozenset(
    {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "fabs", "pow", "floor", "ceil", "round",
     "fma", "sin", "cos", "tan", "asin", "acos", "atan", *("dot4_u8s8_i32", "dot4_u8s8_i32_pairs16", "dot2_u8s16_i32"),
     "dot2_bf16_f32"}
)

DOT4_INTRINSICS = frozenset({"dot4_u8s8_i32", "dot4_u8s8_i32_pairs16"})
"""Four-term integer dot products: `Call(name, (a0, a1, a2, a3, b0, b1, b2, b3), "int32")` is
`a0*b0 + a1*b1 + a2*b2 + a3*b3`, exact in int32, with every `a` uint8 and every `b` int8. In a vectorized loop the
CPU back end lowers it to one multiply-add instruction sequence over 4 bytes per lane (vpdpbusd with VNNI;
vpmaddubsw + vpmaddwd without) when `a` and `b` are four consecutive elements of a buffer. `dot4_u8s8_i32_pairs16`
promises more: each pair `a0*b0 + a1*b1` and `a2*b2 + a3*b3` lies in int16 (so |b0| + |b1| <= 128 suffices), which
lets the back end use the saturating vpmaddubsw; the value is the same."""

DOT2_INTRINSIC = "dot2_u8s16_i32"
"""The two-term dot product `Call("dot2_u8s16_i32", (a0, a1, b0, b1), "int32")`: `a0*b0 + a1*b1`, exact, with `a`
uint8 (or int16 holding uint8 values: widened already) and `b` int16 (or int8, widened on load). With `b` two
consecutive elements per lane the x86 back ends lower it to one vpmaddwd per register of lanes (a uint8 pair widened
to int16 on load): exact for any int8 weight, where a full-range weight pair may saturate vpmaddubsw."""

DOT_INTRINSICS = DOT4_INTRINSICS | {DOT2_INTRINSIC}
"""Every integer dot-product intrinsic: `len(args) // 2` products of `a = args[:k]` and `b = args[k:]`, summed."""

DOT2_BF16_INTRINSIC = "dot2_bf16_f32"
"""The two-term bfloat16 dot product `Call("dot2_bf16_f32", (a0, a1, b0, b1), "float32")`: `a0*b0 + a1*b1` in
float32, every operand bfloat16 (each product is exact in float32: 8-bit mantissas). With `a` and `b` two
consecutive bfloat16 elements per lane the CPU back end lowers it to one vdpbf16ps per register of lanes on
AVX512_BF16 targets (the accumulator added in the same instruction), and elsewhere to the operands widened to
float32 by a 16-bit shift and two fused multiply-adds."""


@dataclass(frozen=True, slots=True)
class Call(PrimExpr):
    """A math intrinsic, e.g. `Call("exp", (x,), "float32")`."""

    name: str
    args: tuple[PrimExpr, ...]
    dtype: str

    def __post_init__(self) -> None:
        if self.name not in INTRINSICS:
            raise ValueError(f"unknown intrinsic {self.name}")
        object.__setattr__(self, "args", tuple(self.args))


@dataclass(frozen=True, slots=True)
class Load(PrimExpr):
    buffer: Buffer
    indices: tuple[PrimExpr, ...]
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(as_expr(i) for i in self.indices))
        if not self.dtype:
            object.__setattr__(self, "dtype", self.buffer.dtype)


# ---------------------------------------------------------------------------------------------
# Buffers
# ---------------------------------------------------------------------------------------------


class Scope(StrEnum):
    GLOBAL = "global"  # a kernel argument or a buffer in main memory
    LOCAL = "local"  # per-thread scratch (registers / stack); CPU accumulators
    SHARED = "shared"  # GPU shared memory, visible to one thread block


@dataclass(frozen=True, slots=True, eq=False)
class Buffer:
    """A dense row-major array. Compares by identity: two buffers with the same name are different."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    scope: Scope = Scope.GLOBAL

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.dtype in LOW_PRECISION_DTYPES:  # arrays of this type are ml_dtypes arrays
            ml_dtypes_module()

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __getitem__(self, indices: ExprLike | tuple[ExprLike, ...]) -> Load:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return Load(self, tuple(as_expr(i) for i in indices))

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.shape}, {self.dtype}, {self.scope.value})"


# ---------------------------------------------------------------------------------------------
# Statements
# ---------------------------------------------------------------------------------------------


class Stmt:
    __slots__ = ()


class ForKind(StrEnum):
    SERIAL = "serial"
    PARALLEL = "parallel"  # iterations spread over CPU cores
    VECTORIZED = "vectorized"  # iterations become SIMD lanes
    UNROLLED = "unrolled"  # the body is replicated `extent` times
    THREAD_BINDING = "thread_binding"  # GPU: the loop variable is a thread/block index (see `thread_tag`)


THREAD_TAGS = frozenset(
    {"blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z"}
)


@dataclass(frozen=True, slots=True)
class For(Stmt):
    """`for var in range(extent): body` (loops always start at 0)."""

    var: LoopVar
    extent: int
    body: Stmt
    kind: ForKind = ForKind.SERIAL
    thread_tag: str | None = None

    def __post_init__(self) -> None:
        if self.kind is ForKind.THREAD_BINDING and self.thread_tag not in THREAD_TAGS:
            raise ValueError(f"thread binding needs a thread tag, one of {sorted(THREAD_TAGS)}")


@dataclass(frozen=True, slots=True)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[PrimExpr, ...]
    value: PrimExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(as_expr(i) for i in self.indices))


@dataclass(frozen=True, slots=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stmts", tuple(self.stmts))


@dataclass(frozen=True, slots=True)
class IfThenElse(Stmt):
    cond: PrimExpr
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True, slots=True)
class Allocate(Stmt):
    """Scratch storage (scope LOCAL or SHARED) live for the duration of `body`."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, slots=True)
class Barrier(Stmt):
    """All threads of a GPU block wait here (shared-memory staging)."""


@dataclass(frozen=True, slots=True)
class PrimFunc:
    """A kernel: `name(params...)` where every param is a global buffer; outputs are params too."""

    name: str
    params: tuple[Buffer, ...]
    body: Stmt
    attrs: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))

    @property
    def param_align(self) -> int:
        """Bytes every buffer parameter's address is a multiple of (the `param_align` attr); 0: not known."""
        value = dict(self.attrs).get("param_align", 0)
        return value if isinstance(value, int) else 0


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def as_expr(value: ExprLike, dtype: str | None = None) -> PrimExpr:
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, bool):
        return IntImm(int(value), "bool")
    if isinstance(value, int):
        return IntImm(value, dtype or INDEX_DTYPE)
    if isinstance(value, float):
        return FloatImm(value, dtype or "float32")
    raise TypeError(f"cannot make an expression of {value!r}")


def const_like(value: int | float, dtype: str) -> PrimExpr:
    if dtype.startswith(("float", "bfloat")):
        return FloatImm(float(value), dtype)
    return IntImm(int(value), dtype)


def binary(op: str, a: ExprLike, b: ExprLike) -> PrimExpr:
    ea = a if isinstance(a, PrimExpr) else None
    eb = b if isinstance(b, PrimExpr) else None
    # a Python number takes the dtype of the expression on the other side
    if ea is None:
        ea = const_like(a, eb.dtype) if eb is not None and not isinstance(a, bool) else as_expr(a)  # type: ignore[arg-type]
    if eb is None:
        eb = const_like(b, ea.dtype) if not isinstance(b, bool) else as_expr(b)  # type: ignore[arg-type]
    return BinaryOp(op, ea, eb)


def minimum(a: ExprLike, b: ExprLike) -> PrimExpr:
    return binary("min", a, b)


def maximum(a: ExprLike, b: ExprLike) -> PrimExpr:
    return binary("max", a, b)


def seq(*stmts: Stmt) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))
