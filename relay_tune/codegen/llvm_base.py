"""Target-neutral lowering of the loop-nest IR (`relay_tune.kernel.tir`) to LLVM IR with llvmlite.

`LLVMCodegenBase` turns expressions and statements into LLVM instructions: typed arithmetic with
int64 index math, casts, selects, math intrinsics, serial / unrolled / vectorized loops, conditionals
(masked when they depend on a vector lane) and local scratch buffers. Target back ends subclass it and
fill in what differs between machines through a handful of hooks:

    declare_kernel(func)        the function signature and calling convention of a kernel
    emit_parallel_loop(loop)    ForKind.PARALLEL (CPU: outlined body run by a thread team)
    emit_thread_binding(loop)   ForKind.THREAD_BINDING (GPU: thread/block indices)
    allocate(buffer)            storage for an Allocate that is not a small local buffer
    emit_barrier()              Barrier

Vectorization model. A VECTORIZED loop is not emitted as a loop: its variable becomes a vector of lane
indices and the body is evaluated once per chunk of lanes. Every value is then either a scalar (it does
not depend on the lane) or an `<N x T>` vector; scalars are broadcast where they meet vectors. Memory
accesses are classified with `affine.lane_stride`: stride 0 is a scalar access, stride 1 a contiguous
vector load/store, anything else a gather/scatter. An `IfThenElse` whose condition depends on the lane
narrows an execution mask, and the accesses inside become masked loads/stores, which is how tails
guarded by the schedule layer (`if vo * 16 + vi < n`) are handled without a scalar remainder loop. Accesses
to a buffer on the function's own stack whose every lane stays inside it are plain loads and blended stores
instead (`own_vector_access`), so that SROA can still keep such a buffer (an accumulator tile) in registers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import llvmlite.ir as ir
import numpy as np

from relay_tune.codegen import affine
from relay_tune.codegen.llvm_dot import generic_dot2, generic_dot4, widened_dot2_bf16
from relay_tune.codegen.llvm_lowp import LowPrecision
from relay_tune.codegen.llvm_math import Float32Math
from relay_tune.errors import CompileError, UnsupportedError
from relay_tune.ir.dtypes import FLOAT_FORMATS, SUB_BYTE_INT_DTYPES, sub_byte_bits
from relay_tune.kernel import tir
from relay_tune.kernel.analysis import bound
from relay_tune.op._shape import numpy_dtype

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
VOID = ir.VoidType()


# ---------------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DTypeInfo:
    """How a dtype lives in registers. "lowfloat" types (bfloat16, float8, float4) are their raw codes, `bits`
    wide, converted to float32 for arithmetic; sub-byte integers are i8 registers holding the value
    (sign-extended), `value_bits` wide in memory's low bits."""

    name: str
    kind: str  # "float" | "int" | "uint" | "bool" | "lowfloat"
    bits: int
    value_bits: int = 0  # sub-byte integers only

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_signed(self) -> bool:
        return self.kind in ("int", "float")

    @property
    def itemsize(self) -> int:
        return 1 if self.kind == "bool" else self.bits // 8


_DTYPES = {
    "float16": DTypeInfo("float16", "float", 16),
    "float32": DTypeInfo("float32", "float", 32),
    "float64": DTypeInfo("float64", "float", 64),
    "int8": DTypeInfo("int8", "int", 8),
    "int16": DTypeInfo("int16", "int", 16),
    "int32": DTypeInfo("int32", "int", 32),
    "int64": DTypeInfo("int64", "int", 64),
    "uint8": DTypeInfo("uint8", "uint", 8),
    "uint16": DTypeInfo("uint16", "uint", 16),
    "uint32": DTypeInfo("uint32", "uint", 32),
    "uint64": DTypeInfo("uint64", "uint", 64),
    "bool": DTypeInfo("bool", "bool", 1),
    **{name: DTypeInfo(name, "lowfloat", fmt.storage_bits) for name, fmt in FLOAT_FORMATS.items()},
    **{name: DTypeInfo(name, "uint" if name.startswith("u") else "int", 8, sub_byte_bits(name))
       for name in SUB_BYTE_INT_DTYPES},
}

SUPPORTED_DTYPES = tuple(_DTYPES)


def dtype_info(dtype: str) -> DTypeInfo:
    info = _DTYPES.get(dtype)
    if info is None:
        raise UnsupportedError(f"code generation does not support dtype {dtype!r}")
    return info


def scalar_type(dtype: str) -> ir.Type:
    """The LLVM type of a `dtype` value in registers (bool is i1)."""
    info = dtype_info(dtype)
    if info.is_float:
        return {16: ir.HalfType(), 32: F32, 64: ir.DoubleType()}[info.bits]
    return ir.IntType(info.bits)


def memory_type(dtype: str) -> ir.Type:
    """The LLVM type of a `dtype` element in memory (bool is one byte, like numpy's)."""
    return I8 if dtype == "bool" else scalar_type(dtype)


# Intrinsics lowered to the C library's functions, one lane at a time (float16 through float32).
LIBM_FUNCTIONS = frozenset({"sin", "cos", "tan", "asin", "acos", "atan"})


def unify_dtypes(a: str, b: str) -> str:
    """The dtype both operands of a comparison are converted to when they differ."""
    if a == b:
        return a
    ia, ib = dtype_info(a), dtype_info(b)
    if "lowfloat" in (ia.kind, ib.kind):  # compared as float32 values (float64 when the other side is)
        return "float64" if "float64" in (a, b) else "float32"
    if ia.is_float or ib.is_float:
        floats = [i for i in (ia, ib) if i.is_float]
        return max(floats, key=lambda i: i.bits).name
    if ia.kind == "bool":
        return b
    if ib.kind == "bool":
        return a
    return a if ia.bits >= ib.bits else b


def lanes_of(value: ir.Value) -> int:
    return value.type.count if isinstance(value.type, ir.VectorType) else 1


def with_lanes(typ: ir.Type, lanes: int) -> ir.Type:
    return typ if lanes == 1 else ir.VectorType(typ, lanes)


def splat_constant(typ: ir.Type, value: float | int, lanes: int = 1) -> ir.Constant:
    if lanes == 1:
        return ir.Constant(typ, value)
    return ir.Constant(ir.VectorType(typ, lanes), [value] * lanes)


def int_constant_value(value: ir.Value) -> int | None:
    """The Python int of a scalar integer constant, else None (used for folding index math)."""
    if isinstance(value, ir.Constant) and isinstance(value.type, ir.IntType) and isinstance(value.constant, int):
        return int(value.constant)
    return None


def _wrap(value: int, bits: int, signed: bool) -> int:
    value &= (1 << bits) - 1
    if signed and bits > 1 and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def intrinsic_suffix(typ: ir.Type) -> str:
    """LLVM's type mangling for overloaded intrinsics: f32, v16f32, i64, v8i1, p0, v16p0."""
    if isinstance(typ, ir.VectorType):
        return f"v{typ.count}{intrinsic_suffix(typ.element)}"
    if isinstance(typ, ir.HalfType):
        return "f16"
    if isinstance(typ, ir.FloatType):
        return "f32"
    if isinstance(typ, ir.DoubleType):
        return "f64"
    if isinstance(typ, ir.IntType):
        return f"i{typ.width}"
    if isinstance(typ, ir.PointerType):
        return "p0"
    raise CompileError(f"no intrinsic mangling for LLVM type {typ}")


class VectorGEP(ir.Instruction):
    """`getelementptr T, T* base, <N x i64> offsets` -> `<N x T*>` (llvmlite only builds scalar GEPs).

    Gathers and scatters keep real GEPs instead of integer address arithmetic so that LLVM's alias
    analysis still sees which buffer each lane points into.
    """

    def __init__(self, parent: ir.Block, pointer: ir.Value, offsets: ir.Value, name: str = "") -> None:
        super().__init__(parent, ir.VectorType(pointer.type, offsets.type.count), "getelementptr",
                         [pointer, offsets], name=name)
        self.element_type = pointer.type.pointee

    def descr(self, buf: list[str]) -> None:
        pointer, offsets = self.operands
        buf.append(
            f"getelementptr inbounds {self.element_type}, {pointer.type} {pointer.get_reference()}, "
            f"{offsets.type} {offsets.get_reference()}{self._stringify_metadata(leading_comma=True)}\n"
        )


# ---------------------------------------------------------------------------------------------------
# per-function state
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodegenOptions:
    """Knobs of the lowering that do not depend on the target.

    fast_math: allow full floating-point reassociation (`fast` flags) instead of only FMA contraction.
        Reductions then vectorize, but results change in the last bits; a PrimFunc can also ask for it
        with the attribute ("fast_math", True).
    max_unroll: an UNROLLED loop longer than this is emitted as a serial loop (compile-time guard).
    max_vector_lanes: a VECTORIZED loop up to this extent becomes one vector; longer loops are cut into
        chunks of `chunk_lanes` lanes plus one shorter chunk for the remainder.
    chunk_lanes: lanes per chunk for long vectorized loops (normally the target's SIMD width).
    """

    fast_math: bool = False
    max_unroll: int = 256
    max_vector_lanes: int = 64
    chunk_lanes: int = 16


@dataclass
class VectorLanes:
    """The vectorized loop being emitted: `var` is lane `l` of a chunk whose lane 0 has index `base`."""

    var: tir.LoopVar
    lanes: int
    base: ir.Value


@dataclass
class FunctionContext:
    """Everything the lowering of one LLVM function (a kernel or an outlined loop body) needs."""

    function: ir.Function
    builder: ir.IRBuilder
    entry: ir.Block
    env: dict[tir.LoopVar, ir.Value] = field(default_factory=dict)
    extents: dict[tir.LoopVar, int] = field(default_factory=dict)
    buffers: dict[tir.Buffer, ir.Value] = field(default_factory=dict)
    vector: VectorLanes | None = None
    mask: ir.Value | None = None
    in_parallel: bool = False
    # Values of already lowered sub-expressions, valid only within the statement being lowered
    # (id -> (node, value); the node is kept so that its id cannot be reused).
    memo: dict[int, tuple[tir.PrimExpr, ir.Value]] = field(default_factory=dict)
    memo_lane0: dict[int, tuple[tir.PrimExpr, ir.Value]] = field(default_factory=dict)
    # Buffers this function put on its own stack (`stack_allocate`): private to the thread running it.
    stack_buffers: set[tir.Buffer] = field(default_factory=set)
    # Integer instructions emitted in `values_block`, by (operation, operands): an index expression that several
    # statements of one block compute (the unrolled copies of a loop body) is emitted once. Only the block being
    # filled: an instruction dominates the rest of its own block, not necessarily other blocks.
    values_block: ir.Block | None = None
    block_values: dict[tuple[object, ...], tuple[ir.Value, ir.Value, ir.Value]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------
# the lowering
# ---------------------------------------------------------------------------------------------------


def _reads_memory(expr: tir.PrimExpr) -> bool:
    """Whether evaluating `expr` loads from a buffer."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, tir.Load):
            return True
        stack.extend(affine.operands(node))
    return False


class LLVMCodegenBase:
    """Lowers PrimFuncs into an llvmlite module. Subclasses provide the target-specific hooks."""

    # Loads whose lanes are this many elements apart or fewer (a stride-2 convolution or pooling window) read the
    # covering contiguous span and pick every stride-th element, instead of gathering lane by lane; 0 turns it off.
    max_strided_load = 4
    # Loads whose lanes read a fixed pattern within a span of at most this many vectors (a per-channel parameter
    # repeated along a row of NCHW{b}c blocks) read the span once and shuffle; 0 turns it off.
    max_window_load = 4

    def __init__(self, module: ir.Module, options: CodegenOptions | None = None) -> None:
        self.module = module
        self.options = options or CodegenOptions()
        self._ctx: FunctionContext | None = None
        self._declared: dict[str, ir.Function] = {}
        self._float_flags: tuple[str, ...] = ("contract",)
        self._func_name = ""
        # The same access is classified once per unrolled copy of its loop body and per vector chunk: its
        # analyses, by (ids of the index tuple and loop variable, ...) -> (the index tuple kept alive, result).
        self._varies_memo: dict[tuple[int, int], tuple[object, bool]] = {}
        self._stride_memo: dict[tuple[object, ...], tuple[object, int | None]] = {}
        # Constants by (dtype, lanes, value): llvmlite builds a vector constant lane by lane.
        self._constants: dict[tuple[str, int, object], ir.Constant] = {}
        # Vector constants by (id of the element type, lane values) and splats of scalar constants by (id of the
        # scalar, lanes); the type or scalar is kept alive with the result so that its id stays its own.
        self._vectors: dict[tuple[int, tuple[int, ...]], tuple[ir.Type, ir.Constant]] = {}
        self._splats: dict[tuple[int, int], tuple[ir.Constant, ir.Constant]] = {}

    # -- target hooks ---------------------------------------------------------------------------------

    def declare_kernel(self, func: tir.PrimFunc) -> ir.Function:
        """Create the LLVM function for `func`: one pointer argument per buffer parameter."""
        params = [memory_type(p.dtype).as_pointer() for p in func.params]
        fn = ir.Function(self.module, ir.FunctionType(VOID, params), name=func.name)
        for arg, buf in zip(fn.args, func.params):
            arg.name = buf.name
        return fn

    def emit_parallel_loop(self, loop: tir.For) -> None:
        """ForKind.PARALLEL. Without a thread runtime the loop simply runs serially."""
        self.emit_serial_loop(loop)

    def emit_thread_binding(self, loop: tir.For) -> None:
        raise UnsupportedError(
            f"loop {loop.var.name} is bound to {loop.thread_tag}, which this target ({type(self).__name__}) "
            "cannot run; GPU thread bindings need the CUDA target"
        )

    def allocate(self, buffer: tir.Buffer) -> tuple[ir.Value, Callable[[], None] | None]:
        """Storage for `Allocate(buffer)`: a pointer to its first element and an optional release action.

        The base version puts every buffer on the stack, in the entry block, so that SROA/mem2reg can turn
        small local accumulators into registers.
        """
        return self.stack_allocate(buffer), None

    def emit_barrier(self) -> None:
        """Barrier: a no-op on targets where one function body runs on one thread."""

    def contiguous_alignment(self, indices: tuple[tir.PrimExpr, ...], buf: tir.Buffer, vec: VectorLanes) -> int:
        """Byte alignment to claim for a contiguous vector access; the element's own size unless a target
        proves more (GPUs only issue wide loads for accesses aligned to their full width)."""
        return dtype_info(buf.dtype).itemsize

    def math_call(self, name: str, dtype: str, args: list[ir.Value]) -> ir.Value | None:
        """A chance for a target to lower an intrinsic itself (e.g. libdevice on NVPTX); None = default."""
        return None

    # -- entry point ----------------------------------------------------------------------------------

    def lower(self, func: tir.PrimFunc) -> ir.Function:
        attrs = dict(func.attrs)
        fast = bool(attrs.get("fast_math", self.options.fast_math))
        self._float_flags = ("fast",) if fast else ("contract",)
        self._func_name = func.name
        fn = self.declare_kernel(func)
        ctx = self.new_context(fn)
        for arg, buf in zip(fn.args, func.params):
            self._check_buffer(buf)
            ctx.buffers[buf] = arg
        self._ctx = ctx
        try:
            self.emit_stmt(func.body)
            ctx.builder.ret_void()
        except RecursionError as err:  # pragma: no cover - pathological nesting
            raise CompileError(f"kernel {func.name} is nested too deeply to compile") from err
        finally:
            self._ctx = None
        return fn

    def new_context(self, fn: ir.Function, in_parallel: bool = False) -> FunctionContext:
        # The entry block holds only allocas (see `entry_builder`); code starts in the next block. Inserting
        # into the block the main builder is filling would invalidate that builder's insertion point.
        entry = fn.append_basic_block("entry")
        start = fn.append_basic_block("start")
        ir.IRBuilder(entry).branch(start)
        return FunctionContext(function=fn, builder=ir.IRBuilder(start), entry=entry, in_parallel=in_parallel)

    def entry_builder(self) -> ir.IRBuilder:
        """A builder at the end of the entry block (before its branch): where allocas go, so that
        SROA/mem2reg can promote them."""
        entry = self.ctx.entry
        builder = ir.IRBuilder(entry)
        builder.position_before(entry.terminator)
        return builder

    @property
    def ctx(self) -> FunctionContext:
        assert self._ctx is not None, "no function is being lowered"
        return self._ctx

    @property
    def builder(self) -> ir.IRBuilder:
        return self.ctx.builder

    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """Declare (once) an external function or intrinsic."""
        fn = self._declared.get(name)
        if fn is None:
            existing = self.module.globals.get(name)
            fn = existing if isinstance(existing, ir.Function) else ir.Function(
                self.module, ir.FunctionType(ret, args), name=name
            )
            self._declared[name] = fn
        return fn

    def intrinsic(self, name: str, typ: ir.Type, nargs: int = 1) -> ir.Function:
        """An overloaded LLVM intrinsic over one type, e.g. ("llvm.sqrt", <16 x float>)."""
        return self.declare(f"{name}.{intrinsic_suffix(typ)}", typ, [typ] * nargs)

    # -- statements -------------------------------------------------------------------------------

    def emit_stmt(self, stmt: tir.Stmt) -> None:
        if isinstance(stmt, tir.Seq):
            for s in stmt.stmts:
                self.emit_stmt(s)
        elif isinstance(stmt, tir.For):
            self.emit_for(stmt)
        elif isinstance(stmt, tir.Store):
            self.emit_store(stmt)
        elif isinstance(stmt, tir.IfThenElse):
            self.emit_if(stmt)
        elif isinstance(stmt, tir.Allocate):
            self.emit_allocate(stmt)
        elif isinstance(stmt, tir.Barrier):
            self.emit_barrier()
        else:
            raise CompileError(f"cannot compile statement of type {type(stmt).__name__}")

    def emit_for(self, loop: tir.For) -> None:
        if loop.extent <= 0:
            return
        kind = loop.kind
        if kind is tir.ForKind.SERIAL:
            self.emit_serial_loop(loop)
        elif kind is tir.ForKind.UNROLLED:
            self.emit_unrolled_loop(loop)
        elif kind is tir.ForKind.VECTORIZED:
            self.emit_vectorized_loop(loop)
        elif kind is tir.ForKind.PARALLEL:
            if self.ctx.vector is not None:
                raise CompileError(f"parallel loop {loop.var.name} is nested inside a vectorized loop")
            self.emit_parallel_loop(loop)
        elif kind is tir.ForKind.THREAD_BINDING:
            self.emit_thread_binding(loop)
        else:  # pragma: no cover - exhaustive over ForKind
            raise CompileError(f"unknown loop kind {kind}")

    def bind(self, var: tir.LoopVar, value: ir.Value, extent: int) -> None:
        ctx = self.ctx
        if var in ctx.env:
            raise CompileError(f"loop variable {var.name} is bound twice (nested loops must use distinct variables)")
        ctx.env[var] = value
        ctx.extents[var] = extent

    def unbind(self, var: tir.LoopVar) -> None:
        del self.ctx.env[var]
        del self.ctx.extents[var]

    def emit_loop(self, start: ir.Value, stop: ir.Value, body: Callable[[ir.Value], None], name: str,
                  nonempty: bool = False) -> None:
        """`for i in range(start, stop): body(i)` over i64 values, in rotated (do-while) form."""
        ctx = self.ctx
        b = ctx.builder
        fn = ctx.function
        header = fn.append_basic_block(f"{name}.loop")
        exit_block = fn.append_basic_block(f"{name}.end")
        pre = b.block
        if nonempty:
            b.branch(header)
        else:
            b.cbranch(b.icmp_signed("<", start, stop), header, exit_block)
        b.position_at_end(header)
        iv = b.phi(I64, name=name)
        iv.add_incoming(start, pre)
        body(iv)
        b = ctx.builder
        nxt = b.add(iv, ir.Constant(I64, 1), name=f"{name}.next")
        iv.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_signed("<", nxt, stop), header, exit_block)
        b.position_at_end(exit_block)

    def emit_serial_loop(self, loop: tir.For) -> None:
        if loop.extent == 1:
            self.bind(loop.var, ir.Constant(I64, 0), 1)
            self.emit_stmt(loop.body)
            self.unbind(loop.var)
            return

        def body(iv: ir.Value) -> None:
            self.bind(loop.var, iv, loop.extent)
            self.emit_stmt(loop.body)
            self.unbind(loop.var)

        self.emit_loop(ir.Constant(I64, 0), ir.Constant(I64, loop.extent), body, loop.var.name, nonempty=True)

    def emit_unrolled_loop(self, loop: tir.For) -> None:
        if loop.extent > self.options.max_unroll:
            self.emit_serial_loop(loop)
            return
        for i in range(loop.extent):
            self.bind(loop.var, ir.Constant(I64, i), loop.extent)
            self.emit_stmt(loop.body)
            self.unbind(loop.var)

    def emit_vectorized_loop(self, loop: tir.For) -> None:
        ctx = self.ctx
        if ctx.vector is not None or loop.extent == 1:
            # One level of vectorization: an inner vectorized loop runs serially within each lane group.
            self.emit_serial_loop(loop)
            return
        extent = loop.extent
        if extent <= self.options.max_vector_lanes:
            self._emit_power_of_two_chunks(loop, 0, extent)
            return
        chunk = max(1, self.options.chunk_lanes)
        full, rest = divmod(extent, chunk)

        def body(iv: ir.Value) -> None:
            self._emit_vector_chunk(loop, self.int_op("mul", iv, ir.Constant(I64, chunk), "int64"), chunk)

        self.emit_loop(ir.Constant(I64, 0), ir.Constant(I64, full), body, f"{loop.var.name}.chunk", nonempty=True)
        if rest:
            self._emit_power_of_two_chunks(loop, full * chunk, rest)

    def _emit_power_of_two_chunks(self, loop: tir.For, start: int, count: int) -> None:
        """Lanes [start, start + count) as consecutive chunks whose widths are powers of two (28 -> 16, 8, 4).
        LLVM legalizes a vector of odd width (`<28 x float>`) element by element, which is many times
        slower than the same lanes in power-of-two pieces. A last single lane runs as a scalar iteration."""
        while count > 1:
            lanes = 1 << (count.bit_length() - 1)
            self._emit_vector_chunk(loop, ir.Constant(I64, start), lanes)
            start += lanes
            count -= lanes
        if count:
            self.bind(loop.var, ir.Constant(I64, start), loop.extent)
            self.emit_stmt(loop.body)
            self.unbind(loop.var)

    def _emit_vector_chunk(self, loop: tir.For, base: ir.Value, lanes: int) -> None:
        ctx = self.ctx
        base_value = int_constant_value(base)
        if base_value is not None:
            lane_index: ir.Value = self.vector_constant(I64, tuple(range(base_value, base_value + lanes)))
        else:
            ramp = self.vector_constant(I64, tuple(range(lanes)))
            lane_index = ctx.builder.add(self.broadcast(base, lanes), ramp, name=f"{loop.var.name}.lanes")
        ctx.vector = VectorLanes(loop.var, lanes, base)
        self.bind(loop.var, lane_index, loop.extent)
        try:
            self.emit_stmt(loop.body)
        finally:
            self.unbind(loop.var)
            ctx.vector = None

    def emit_if(self, stmt: tir.IfThenElse) -> None:
        ctx = self.ctx
        self.begin_statement()
        cond = self.as_condition(self.eval(stmt.cond), stmt.cond.dtype)
        if lanes_of(cond) > 1:
            outer = ctx.mask
            ctx.mask = cond if outer is None else ctx.builder.and_(outer, cond)
            self.emit_stmt(stmt.then_body)
            if stmt.else_body is not None:
                inverse = self.logical_not(cond)
                ctx.mask = inverse if outer is None else ctx.builder.and_(outer, inverse)
                self.emit_stmt(stmt.else_body)
            ctx.mask = outer
            return
        known = int_constant_value(cond)
        if known is not None:
            if known:
                self.emit_stmt(stmt.then_body)
            elif stmt.else_body is not None:
                self.emit_stmt(stmt.else_body)
            return
        b = ctx.builder
        if stmt.else_body is None:
            with b.if_then(cond):
                self.emit_stmt(stmt.then_body)
        else:
            with b.if_else(cond) as (then, otherwise):
                with then:
                    self.emit_stmt(stmt.then_body)
                with otherwise:
                    self.emit_stmt(stmt.else_body)

    def emit_allocate(self, stmt: tir.Allocate) -> None:
        buf = stmt.buffer
        self._check_buffer(buf)
        if buf in self.ctx.buffers:
            raise CompileError(f"buffer {buf.name} is allocated twice")
        pointer, release = self.allocate(buf)
        self.ctx.buffers[buf] = pointer
        self.emit_stmt(stmt.body)
        del self.ctx.buffers[buf]
        if release is not None:
            release()

    def stack_allocate(self, buffer: tir.Buffer) -> ir.Value:
        """An entry-block alloca of the whole buffer (aligned for vector access), as an element pointer."""
        entry_builder = self.entry_builder()
        slot = entry_builder.alloca(ir.ArrayType(memory_type(buffer.dtype), max(buffer.size, 1)), name=buffer.name)
        slot.align = 64
        self.ctx.stack_buffers.add(buffer)
        return entry_builder.bitcast(slot, memory_type(buffer.dtype).as_pointer(), name=f"{buffer.name}.ptr")

    def lane_varies(self, indices: tuple[tir.PrimExpr, ...], var: tir.LoopVar) -> bool:
        """Whether an access at `indices` moves with vector loop variable `var` (memoized)."""
        key = (id(indices), id(var))
        known = self._varies_memo.get(key)
        if known is None:
            known = self._varies_memo[key] = (indices, any(affine.contains_var(i, var) for i in indices))
        return known[1]

    def lane_stride(self, indices: tuple[tir.PrimExpr, ...], buf: tir.Buffer, var: tir.LoopVar) -> int | None:
        """`affine.lane_stride` of `buf[indices]` along `var` over the enclosing loops' extents (memoized: it
        depends only on the expressions, the shape and those extents)."""
        extents = self.ctx.extents
        key = (id(indices), buf.shape, id(var), tuple(extents.items()))
        known = self._stride_memo.get(key)
        if known is None:
            known = self._stride_memo[key] = (indices, affine.lane_stride(indices, buf.shape, var, extents))
        return known[1]

    def own_vector_access(self, buf: tir.Buffer, indices: tuple[tir.PrimExpr, ...]) -> bool:
        """Whether a contiguous vector access `buf[indices]` may touch its masked-off lanes: `buf` is on this
        function's stack (no other thread sees it) and every lane of every chunk of the vectorized loop, at every
        value of the enclosing loops, lies inside it. Such an access is then a plain load (and select) or a load,
        select and store: SROA cannot promote a buffer that a masked intrinsic reads or writes, and an
        accumulator tile left in memory costs a store per FMA (a dense tile with a column tail, 2x slower)."""
        ctx = self.ctx
        if buf not in ctx.stack_buffers:
            return False
        span = affine.bounds(affine.flat_form(indices, buf.shape, ctx.extents), ctx.extents)
        return span is not None and span[0] >= 0 and span[1] < buf.size

    def emit_store(self, stmt: tir.Store) -> None:
        ctx = self.ctx
        b = ctx.builder
        buf = stmt.buffer
        pointer = self.buffer_pointer(buf)
        self._check_rank(stmt.indices, buf)
        self.begin_statement()
        update = self._reduction_update(stmt)
        value = self.cast(update if update is not None else self.eval(stmt.value), stmt.value.dtype, buf.dtype)
        if buf.dtype == "bool":
            value = b.zext(value, with_lanes(I8, lanes_of(value)))
        value_bits = dtype_info(buf.dtype).value_bits
        if value_bits:  # the low bits only, as ml_dtypes stores the type
            value = b.and_(value, self.constant("uint8", (1 << value_bits) - 1, lanes_of(value)))
        align = dtype_info(buf.dtype).itemsize
        vec = ctx.vector
        varies = vec is not None and self.lane_varies(stmt.indices, vec.var)
        stride: int | None = 0
        if vec is not None and varies:
            stride = self.lane_stride(stmt.indices, buf, vec.var)
        if vec is None or stride == 0:
            offset = self.eval_lane0(stmt.indices, buf) if varies else self.offset(stmt.indices, buf)
            address = b.gep(pointer, [offset])
            if lanes_of(value) == 1 and ctx.mask is None:
                b.store(value, address, align=align)
            elif lanes_of(value) == 1:
                self._masked_store(value, address, self._any(ctx.mask), align)
            elif ctx.mask is None:
                # Every lane writes the same element: the last lane is the one a serial loop leaves behind.
                b.store(b.extract_element(value, ir.Constant(I32, lanes_of(value) - 1)), address, align=align)
            else:
                # A scatter writes lanes in order, so the last active lane wins, as in the serial loop.
                pointers = self.lane_pointers(address, self.broadcast(ir.Constant(I64, 0), lanes_of(value)))
                self._scatter(value, pointers, ctx.mask, align)
            return
        lanes = vec.lanes
        value = self.broadcast(value, lanes)
        if stride == 1:
            align = self.contiguous_alignment(stmt.indices, buf, vec)
            address = b.gep(pointer, [self.eval_lane0(stmt.indices, buf)])
            vector_pointer = b.bitcast(address, value.type.as_pointer())
            if ctx.mask is None:
                b.store(value, vector_pointer, align=align)
            elif self.own_vector_access(buf, stmt.indices):
                kept = b.load(vector_pointer, align=align)
                b.store(b.select(ctx.mask, value, kept), vector_pointer, align=align)
            else:
                self._masked_store(value, vector_pointer, ctx.mask, align)
        else:
            self._scatter(value, self.lane_pointers(pointer, self.lane_offsets(stmt.indices, buf, stride)),
                          ctx.mask, align)

    def _reduction_update(self, stmt: tir.Store) -> ir.Value | None:
        """`acc = acc + x` (or max, min) on a float accumulator, outside any vectorized loop: the update of a
        reduction. It is emitted with the freedom to reorder it (`reassoc` on the add, `maxnum` / `minnum` for
        max and min), so that LLVM's loop vectorizer can run the reduction loop on vectors with several
        partial accumulators, as a blocked sum does; None for any other store."""
        value = stmt.value
        if self.ctx.vector is not None or not isinstance(value, tir.BinaryOp) or value.op not in ("add", "max", "min"):
            return None
        if not dtype_info(value.dtype).is_float or value.dtype != stmt.buffer.dtype:
            return None
        acc, other = (value.a, value.b) if isinstance(value.a, tir.Load) else (value.b, value.a)
        if not (isinstance(acc, tir.Load) and acc.buffer is stmt.buffer and acc.indices == stmt.indices):
            return None
        a, x = self.eval(acc), self.eval(other)
        bld = self.builder
        if value.op == "add":
            return bld.fadd(a, x, flags=(*self._float_flags, "reassoc", "nsz"))
        name = "llvm.maxnum" if value.op == "max" else "llvm.minnum"
        return bld.call(self.intrinsic(name, a.type, 2), [a, x])

    # -- expressions ----------------------------------------------------------------------------------

    def begin_statement(self) -> None:
        """Forget values of the previous statement: they need not dominate the code emitted next."""
        self.ctx.memo = {}
        self.ctx.memo_lane0 = {}

    def eval(self, expr: tir.PrimExpr) -> ir.Value:
        """Lower `expr` at the builder's position (post-order with an explicit stack: no recursion limit)."""
        memo = self.ctx.memo
        hit = memo.get(id(expr))
        if hit is not None:
            return hit[1]
        stack: list[tuple[tir.PrimExpr, bool]] = [(expr, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in memo:
                continue
            if not expanded and isinstance(node, tir.Select):
                known = self.known_condition(node.cond)
                if known is not None:
                    # Decided by unrolled loop counters (a Winograd transform's position): only the chosen side
                    # is emitted, not both sides and a select that LLVM would have to fold away.
                    chosen = node.true_value if known else node.false_value
                    memo[id(node)] = (node, self.cast(self.eval(chosen), chosen.dtype, node.dtype))
                    continue
            if not expanded and isinstance(node, tir.Select) and self.ctx.vector is not None:
                memo[id(node)] = (node, self.lower_vector_select(node))
                continue
            if not expanded and not isinstance(node, tir.Load):
                stack.append((node, True))
                stack.extend((child, False) for child in affine.operands(node) if id(child) not in memo)
                continue
            memo[id(node)] = (node, self.lower_node(node))
        return memo[id(expr)][1]

    def known_condition(self, cond: tir.PrimExpr) -> bool | None:
        """The value of an integer condition made of constants and loop variables bound to constants (unrolled
        loops), or None when it depends on anything else."""
        def value(node: tir.PrimExpr) -> int | None:
            if isinstance(node, tir.IntImm):
                return int(node.value)
            if isinstance(node, tir.LoopVar):
                bound = self.ctx.env.get(node)
                return int(bound.constant) if isinstance(bound, ir.Constant) and isinstance(bound.constant, int) \
                    else None
            if isinstance(node, tir.BinaryOp) and node.op in _FOLDABLE:
                a, b = value(node.a), value(node.b)
                if a is None or b is None or (node.op in ("floordiv", "floormod") and b == 0):
                    return None
                return int(_FOLDABLE[node.op](a, b))
            return None

        if isinstance(cond, tir.BinaryOp) and cond.op in _FOLDABLE:
            result = value(cond)
            return None if result is None else bool(result)
        return None

    def value_of(self, expr: tir.PrimExpr) -> ir.Value:
        return self.ctx.memo[id(expr)][1]

    def eval_lane0(self, indices: tuple[tir.PrimExpr, ...], buf: tir.Buffer) -> ir.Value:
        """The flat offset of `buf[indices]` for lane 0 of the current vector chunk (a scalar)."""
        ctx = self.ctx
        vec = ctx.vector
        assert vec is not None
        saved_memo, saved_lanes = ctx.memo, ctx.env[vec.var]
        ctx.memo, ctx.env[vec.var] = ctx.memo_lane0, vec.base
        try:
            return self.offset(indices, buf)
        finally:
            ctx.memo, ctx.env[vec.var] = saved_memo, saved_lanes

    def lane_offsets(self, indices: tuple[tir.PrimExpr, ...], buf: tir.Buffer, stride: int | None) -> ir.Value:
        """The flat offset of every lane of a gather or scatter (a vector of i64). With a constant `stride`, lane
        0's offset plus `stride` per lane: the indices are evaluated once, as scalars, instead of lane by lane (a
        layout transform's `(f // 14, f % 14)` over a fused map axis is a vector division per index otherwise)."""
        vec = self.ctx.vector
        assert vec is not None
        if stride is None:
            return self.broadcast(self.offset(indices, buf), vec.lanes)
        steps = ir.Constant(ir.VectorType(I64, vec.lanes), [lane * stride for lane in range(vec.lanes)])
        return self.builder.add(self.broadcast(self.eval_lane0(indices, buf), vec.lanes), steps)

    def offset(self, indices: tuple[tir.PrimExpr, ...], buf: tir.Buffer) -> ir.Value:
        """Row-major flat element offset (i64, a vector if an index depends on the vector lane)."""
        total: ir.Value = self.constant("int64", 0)
        stride = 1
        for index, extent in zip(reversed(indices), reversed(buf.shape)):
            value = self.cast(self.eval(index), index.dtype, "int64")
            term = self.int_op("mul", value, self.constant("int64", stride, lanes_of(value)), "int64")
            total, term = self.match_lanes(total, term)
            total = self.int_op("add", total, term, "int64")
            stride *= extent
        return total

    def lower_node(self, node: tir.PrimExpr) -> ir.Value:
        if isinstance(node, tir.IntImm):
            return self.constant(node.dtype, node.value)
        if isinstance(node, tir.FloatImm):
            return self.constant(node.dtype, node.value)
        if isinstance(node, tir.LoopVar):
            value = self.ctx.env.get(node)
            if value is None:
                raise CompileError(
                    f"variable {node.name} is used outside the loop that defines it (symbolic sizes are not "
                    f"supported by code generation) in kernel {self._func_name}"
                )
            return value
        if isinstance(node, tir.BinaryOp):
            return self.lower_binary(node)
        if isinstance(node, tir.Not):
            return self.logical_not(self.as_condition(self.value_of(node.a), node.a.dtype))
        if isinstance(node, tir.Select):
            cond = self.as_condition(self.value_of(node.cond), node.cond.dtype)
            return self.select(node, cond, self.value_of(node.true_value), self.value_of(node.false_value))
        if isinstance(node, tir.Cast):
            if node.reinterpret:
                return self.reinterpret(self.value_of(node.value), node.value.dtype, node.dtype)
            return self.cast(self.value_of(node.value), node.value.dtype, node.dtype, node.saturate,
                             node.round_mode)
        if isinstance(node, tir.Call):
            return self.lower_call(node)
        if isinstance(node, tir.Load):
            return self.lower_load(node)
        raise CompileError(f"cannot compile expression of type {type(node).__name__}")

    def select(self, node: tir.Select, cond: ir.Value, t: ir.Value, f: ir.Value) -> ir.Value:
        t = self.cast(t, node.true_value.dtype, node.dtype)
        f = self.cast(f, node.false_value.dtype, node.dtype)
        lanes = max(lanes_of(cond), lanes_of(t), lanes_of(f))
        t, f = self.broadcast(t, lanes), self.broadcast(f, lanes)
        if lanes_of(cond) not in (1, lanes):  # pragma: no cover - lanes are uniform within a chunk
            raise CompileError("select condition and values have different vector widths")
        return self.builder.select(cond, t, f)

    def lower_vector_select(self, node: tir.Select) -> ir.Value:
        """A `Select` inside a vector loop. When the condition differs between lanes and the true branch reads
        through index clamps that the condition makes redundant (a padding stage's `x[min(max(w - 1, 0), 55)]`
        under `1 <= w < 57`), the branch is read without the clamps, under the condition as a mask: a masked
        contiguous load instead of a gather, and no lane outside the condition touches memory."""
        ctx = self.ctx
        split = self.split_uniform_guard(node)
        if split is not None:
            return split
        cond = self.as_condition(self.eval(node.cond), node.cond.dtype)
        if lanes_of(cond) == 1 and dtype_info(node.dtype).is_float and _reads_memory(node.true_value) \
                and _reads_memory(node.false_value):
            return self.branch_select(node, cond)
        true_value: tir.PrimExpr = node.true_value
        if lanes_of(cond) > 1:
            facts = affine.guard_facts(node.cond, ctx.extents)
            true_value = affine.strip_implied_clamps(node.true_value, facts, ctx.extents)
        if true_value is node.true_value:
            t = self.eval(true_value)
        else:
            # Values loaded under the narrowed mask are zero in the other lanes: keep them out of the memo that
            # the rest of the statement shares.
            saved = ctx.mask, ctx.memo, ctx.memo_lane0
            ctx.mask = cond if ctx.mask is None else ctx.builder.and_(ctx.mask, cond)
            ctx.memo, ctx.memo_lane0 = dict(ctx.memo), dict(ctx.memo_lane0)
            try:
                t = self.eval(true_value)
            finally:
                ctx.mask, ctx.memo, ctx.memo_lane0 = saved
        return self.select(node, cond, t, self.eval(node.false_value))

    def split_uniform_guard(self, node: tir.Select) -> ir.Value | None:
        """A guarded read whose condition is a conjunction of parts that are the same in every lane (a padding
        stage's row test `1 <= h < 28`) and parts that are not (its column test): a branch on the uniform parts,
        and the masked read under the others only inside it. As one mask, every out-of-range row issues masked
        loads with no lane set, at addresses outside the rows (on a Zen 3 host a padded 3x3 max pool on
        1x192x27x27 took 8 times as long as with the branch). None where the condition does not split so."""
        if not _reads_memory(node.true_value):
            return None
        conjuncts, stack = [], [node.cond]
        while stack:
            part = stack.pop()
            if isinstance(part, tir.BinaryOp) and part.op == "and":
                stack.extend((part.b, part.a))
            else:
                conjuncts.append(part)
        if len(conjuncts) < 2:
            return None
        uniform = [c for c in conjuncts if lanes_of(self.eval(c)) == 1]
        varying = [c for c in conjuncts if all(c is not u for u in uniform)]
        if not uniform or not varying:
            return None
        inner = tir.Select(functools.reduce(lambda a, b: tir.BinaryOp("and", a, b, "bool"), varying),
                           node.true_value, node.false_value, node.dtype)
        uniform_cond = functools.reduce(lambda a, b: tir.BinaryOp("and", a, b, "bool"), uniform)
        outer = tir.Select(uniform_cond, inner, node.false_value, node.dtype)
        return self.branch_select(outer, self.as_condition(self.eval(uniform_cond), "bool"))

    def branch_select(self, node: tir.Select, cond: ir.Value) -> ir.Value:
        """A `Select` whose condition is the same in every lane of the vector and whose both sides read memory
        (a concatenation: which input a channel comes from): a branch, so only the chosen side is read. As a
        `select` both sides would be loaded, twice the memory traffic of a copy."""
        ctx = self.ctx
        assert ctx.vector is not None
        lanes = ctx.vector.lanes
        fn = ctx.function
        then_block = fn.append_basic_block("select.then")
        else_block = fn.append_basic_block("select.else")
        merge = fn.append_basic_block("select.end")
        ctx.builder.cbranch(cond, then_block, else_block)
        saved = ctx.memo, ctx.memo_lane0
        incoming: list[tuple[ir.Value, ir.Block]] = []
        try:
            for block, value in ((then_block, node.true_value), (else_block, node.false_value)):
                # Values computed in one arm dominate neither the other arm nor the code after the merge.
                ctx.memo, ctx.memo_lane0 = dict(saved[0]), dict(saved[1])
                ctx.builder.position_at_end(block)
                result = self.broadcast(self.cast(self.eval(value), value.dtype, node.dtype), lanes)
                incoming.append((result, ctx.builder.block))  # the arm may have added blocks of its own
                ctx.builder.branch(merge)
        finally:
            ctx.memo, ctx.memo_lane0 = saved
        ctx.builder.position_at_end(merge)
        phi = ctx.builder.phi(incoming[0][0].type, name="select")
        for value, block in incoming:
            phi.add_incoming(value, block)
        return phi

    def constant(self, dtype: str, value: float | int, lanes: int = 1) -> ir.Constant:
        """`value` as a `dtype` constant of `lanes` lanes (one object per distinct constant: llvmlite values are
        immutable once made, and a vector constant costs one Python object per lane)."""
        # float.hex: -0.0 and 0.0 are different constants but equal keys as floats
        key = (dtype, lanes, int(value) if isinstance(value, int | np.integer) else float(value).hex())
        known = self._constants.get(key)
        if known is None:
            known = self._constants[key] = self._new_constant(dtype, value, lanes)
        return known

    def _new_constant(self, dtype: str, value: float | int, lanes: int) -> ir.Constant:
        info = dtype_info(dtype)
        if info.kind == "lowfloat":  # the code ml_dtypes gives the value
            code = np.asarray(value, dtype=np.float64).astype(numpy_dtype(dtype)).view(f"u{info.bits // 8}")
            return splat_constant(scalar_type(dtype), int(code), lanes)
        if info.value_bits:
            return splat_constant(I8, _wrap(int(value), info.value_bits, info.is_signed), lanes)
        if info.is_float:
            return splat_constant(scalar_type(dtype), float(value), lanes)
        if info.kind == "bool":
            return splat_constant(I1, int(bool(value)), lanes)
        return splat_constant(scalar_type(dtype), _wrap(int(value), info.bits, info.is_signed), lanes)

    def vector_constant(self, element: ir.Type, values: tuple[int, ...]) -> ir.Constant:
        """The integer vector constant `values` of `element` lanes (one object per distinct constant)."""
        key = (id(element), values)
        known = self._vectors.get(key)
        if known is None:
            known = self._vectors[key] = (element, ir.Constant(ir.VectorType(element, len(values)), list(values)))
        return known[1]

    def broadcast(self, value: ir.Value, lanes: int) -> ir.Value:
        current = lanes_of(value)
        if current == lanes:
            return value
        if current != 1:
            raise CompileError(f"cannot combine vectors of {current} and {lanes} lanes")
        if isinstance(value, ir.Constant) and not isinstance(value.constant, ir.values._Undefined):
            key = (id(value), lanes)
            known = self._splats.get(key)
            if known is None:
                known = self._splats[key] = (value, ir.Constant(ir.VectorType(value.type, lanes),
                                                                 [value.constant] * lanes))
            return known[1]
        b = self.builder
        vtype = ir.VectorType(value.type, lanes)
        undef = ir.Constant(vtype, ir.Undefined)
        single = b.insert_element(undef, value, ir.Constant(I32, 0))
        return b.shuffle_vector(single, undef, ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))

    def match_lanes(self, *values: ir.Value) -> list[ir.Value]:
        widths = [lanes_of(v) for v in values]
        lanes = max(widths)
        if min(widths) == lanes:  # the common case, operands of one width: nothing to broadcast
            return list(values)
        return [self.broadcast(v, lanes) for v in values]

    def logical_not(self, value: ir.Value) -> ir.Value:
        return self.builder.xor(value, splat_constant(I1, 1, lanes_of(value)))

    def as_condition(self, value: ir.Value, dtype: str) -> ir.Value:
        """A value as i1 (or a vector of i1): non-zero is true."""
        if dtype == "bool":
            return value
        if dtype_info(dtype).kind == "lowfloat":
            value, dtype = self.cast(value, dtype, "float32"), "float32"
        zero = self.constant(dtype, 0, lanes_of(value))
        if dtype_info(dtype).is_float:
            return self.builder.fcmp_unordered("!=", value, zero)
        return self.builder.icmp_unsigned("!=", value, zero)

    def lowp(self, lanes: int) -> LowPrecision:
        return LowPrecision(self.builder, lambda name, typ: self.intrinsic(name, typ), lanes)

    def cast(self, value: ir.Value, src: str, dst: str, saturate: bool = False, round_mode: str = "") -> ir.Value:
        """`value` converted from `src` to `dst`. Low-precision floats convert through float32 (float64 and
        integers wider than 16 bits through a float32 rounded to odd, so that they round once); `saturate` and
        `round_mode` apply to low-precision float targets (`tir.Cast`)."""
        if src == dst:
            return value
        si, di = dtype_info(src), dtype_info(dst)
        b = self.builder
        lanes = lanes_of(value)
        target_type = with_lanes(scalar_type(dst), lanes)
        if si.kind == "lowfloat":
            return self.cast(self.lowp(lanes).decode(value, FLOAT_FORMATS[src]), "float32", dst, saturate,
                             round_mode)
        if di.kind == "lowfloat":
            if (si.kind in ("int", "uint") and si.bits > 16) or si.name == "float64":
                wide = self._float32_round_to_odd(self.cast(value, src, "float64"))
            else:
                wide = self.cast(value, src, "float32")
            return self.lowp(lanes).encode(wide, FLOAT_FORMATS[dst], saturate, round_mode)
        if di.kind == "bool":
            return self.as_condition(value, src)
        if di.value_bits:
            return self._to_sub_byte(value, si, di)
        known = int_constant_value(value)
        if known is not None and not di.is_float and lanes == 1:
            source = known if si.is_signed or si.kind == "bool" else _wrap(known, si.bits, False)
            return self.constant(dst, source)
        if si.is_float and di.is_float:
            if si.bits == di.bits:
                return value
            return b.fpext(value, target_type) if di.bits > si.bits else b.fptrunc(value, target_type)
        if si.is_float:
            return b.fptosi(value, target_type) if di.is_signed else b.fptoui(value, target_type)
        if di.is_float:
            if si.kind == "bool" or not si.is_signed:
                return b.uitofp(value, target_type)
            return b.sitofp(value, target_type)
        if si.bits == di.bits:
            return value
        if di.bits < si.bits:
            return b.trunc(value, target_type)
        if si.kind == "bool" or not si.is_signed:
            return b.zext(value, target_type)
        return b.sext(value, target_type)

    def _float32_round_to_odd(self, value: ir.Value) -> ir.Value:
        """float64 `value` in float32, rounded to odd: truncated toward zero, the last bit set when inexact. A
        float32 so rounded rounds to any type at least two bits narrower as `value` itself would (rounding twice
        to nearest could move a value that lies just off a tie of the narrow type onto it)."""
        b = self.builder
        lanes = lanes_of(value)
        i32 = with_lanes(I32, lanes)
        single = b.fptrunc(value, with_lanes(F32, lanes))
        back = b.fpext(single, value.type)
        bits = b.bitcast(single, i32)
        inexact = b.fcmp_ordered("!=", back, value)
        fabs = self.intrinsic("llvm.fabs", value.type)
        away = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [value]))  # rounded away from zero
        one = splat_constant(I32, 1, lanes)
        truncated = b.select(away, b.sub(bits, one), bits)  # the neighbour toward zero (sign-magnitude bits)
        odd = b.select(inexact, b.or_(truncated, one), bits)
        return b.bitcast(odd, with_lanes(F32, lanes))

    def _to_sub_byte(self, value: ir.Value, si: DTypeInfo, di: DTypeInfo) -> ir.Value:
        """A conversion to a sub-byte integer as ml_dtypes makes it: integers wrap around; floats round toward
        zero, and those out of the type's range (NaN and infinities too) give 0."""
        b = self.builder
        lanes = lanes_of(value)
        if si.is_float:
            low = -(1 << (di.value_bits - 1)) if di.is_signed else 0
            high = (1 << (di.value_bits - 1)) - 1 if di.is_signed else (1 << di.value_bits) - 1
            zero = self.constant(si.name, 0, lanes)
            inside = b.and_(b.fcmp_ordered(">", value, self.constant(si.name, low - 1, lanes)),
                            b.fcmp_ordered("<", value, self.constant(si.name, high + 1, lanes)))
            # fptosi of a value out of range is poison: only values inside are converted
            return b.fptosi(b.select(inside, value, zero), with_lanes(I8, lanes))
        return self.wrap_sub_byte(self.cast(value, si.name, "int8" if di.is_signed else "uint8"), di.name)

    def reinterpret(self, value: ir.Value, src: str, dst: str) -> ir.Value:
        """The bits of `value` read as `dst`, a type of the same width (ONNX BitCast)."""
        si, di = dtype_info(src), dtype_info(dst)
        b = self.builder
        lanes = lanes_of(value)
        if si.kind == "bool":  # a byte 0 or 1
            value = b.zext(value, with_lanes(I8, lanes))
        if si.value_bits:  # memory's low bits, not the sign-extended register
            value = b.and_(value, self.constant("uint8", (1 << si.value_bits) - 1, lanes))
        if di.kind == "bool":
            return b.icmp_unsigned("!=", value, ir.Constant(value.type, 0) if lanes == 1
                                   else ir.Constant(value.type, [0] * lanes))
        result = b.bitcast(value, with_lanes(scalar_type(dst), lanes))
        return self.wrap_sub_byte(result, dst) if di.value_bits else result

    def lower_binary(self, node: tir.BinaryOp) -> ir.Value:
        op = node.op
        if op == "add" and node.dtype == "int32":
            for dot, other in ((node.b, node.a), (node.a, node.b)):
                if isinstance(dot, tir.Call) and self.dot_fuses_accumulator(dot.name):
                    # the dot product already emitted without the accumulator is left for LLVM to delete
                    return self.lower_dot(dot, self.cast(self.value_of(other), other.dtype, "int32"))
        if op == "add" and node.dtype == "float32":
            for dot, other in ((node.b, node.a), (node.a, node.b)):
                if isinstance(dot, tir.Call) and dot.name == tir.DOT2_BF16_INTRINSIC and other.dtype == "float32":
                    # the accumulator goes into the product's first multiply-add (vdpbf16ps adds it itself)
                    return self.lower_dot_bf16(dot, self.value_of(other))
        if op in tir.COMPARE_OPS:
            dtype = unify_dtypes(node.a.dtype, node.b.dtype)
        else:
            dtype = node.dtype
        a = self.cast(self.value_of(node.a), node.a.dtype, dtype)
        b = self.cast(self.value_of(node.b), node.b.dtype, dtype)
        a, b = self.match_lanes(a, b)
        info = dtype_info(dtype)
        if info.kind == "lowfloat":  # computed in float32, rounded back to the type
            wide = self.float_op(op, self.cast(a, dtype, "float32"), self.cast(b, dtype, "float32"))
            return wide if op in tir.COMPARE_OPS else self.cast(wide, "float32", dtype)
        if info.is_float:
            return self.float_op(op, a, b)
        if op in ("floordiv", "floormod") and info.is_signed and self._nonnegative_quotient(node):
            # Both operands are known non-negative: floor division is unsigned division (one instruction, not
            # the sign fix-up's nine).
            op = "udiv" if op == "floordiv" else "urem"
        result = self.int_op(op, a, b, dtype)
        if info.value_bits and op not in tir.COMPARE_OPS:
            return self.wrap_sub_byte(result, dtype)
        return result

    def float_op(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        bld = self.builder
        flags = self._float_flags
        if op == "add":
            return bld.fadd(a, b, flags=flags)
        if op == "sub":
            return bld.fsub(a, b, flags=flags)
        if op == "mul":
            return bld.fmul(a, b, flags=flags)
        if op == "div":
            return bld.fdiv(a, b, flags=flags)
        if op == "floordiv":
            return bld.call(self.intrinsic("llvm.floor", a.type), [bld.fdiv(a, b, flags=flags)])
        if op == "floormod":
            # Python/numpy semantics: the result has the sign of the divisor.
            quotient = bld.call(self.intrinsic("llvm.floor", a.type), [bld.fdiv(a, b, flags=flags)])
            return bld.fsub(a, bld.fmul(quotient, b, flags=flags), flags=flags)
        if op == "min":
            return bld.select(bld.fcmp_ordered("<", a, b), a, b)
        if op == "max":
            return bld.select(bld.fcmp_ordered(">", a, b), a, b)
        if op in ("eq", "lt", "le", "gt", "ge"):
            return bld.fcmp_ordered(_COMPARE_SYMBOL[op], a, b)
        if op == "ne":
            return bld.fcmp_unordered("!=", a, b)
        raise CompileError(f"operator {op} is not defined on floating-point values")

    def _nonnegative_quotient(self, node: tir.BinaryOp) -> bool:
        """Whether integer `node` (a floordiv or floormod) divides a dividend that the enclosing loops' ranges
        prove non-negative by a positive constant."""
        if not (isinstance(node.b, tir.IntImm) and node.b.value > 0):
            return False
        ranges = {var: (0, extent - 1) for var, extent in self.ctx.extents.items()}
        return bound(node.a, ranges)[0] >= 0

    def int_op(self, op: str, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
        """Integer (and bool) arithmetic with constant folding of scalar operands (index math); an operation the
        block being filled already computed is reused (`FunctionContext.block_values`). `udiv` and `urem` are
        floordiv and floormod of operands known to be non-negative."""
        info = dtype_info(dtype)
        ca, cb = int_constant_value(a), int_constant_value(b)
        if ca is not None and cb is not None:
            folded = _fold_int(_UNSIGNED_OPS.get(op, op), ca, cb, info)
            if folded is not None:
                return self.constant("bool" if op in tir.COMPARE_OPS else dtype, folded)
        if (op == "add" and cb == 0) or (op == "sub" and cb == 0) or (op == "mul" and cb == 1):
            return a
        if (op == "add" and ca == 0) or (op == "mul" and ca == 1):
            return b
        ka, kb = _operand_key(a), _operand_key(b)
        if ka is None or kb is None:
            return self._emit_int_op(op, a, b, info)
        ctx = self.ctx
        if ctx.values_block is not ctx.builder.block:
            ctx.values_block, ctx.block_values = ctx.builder.block, {}
        key = (op, dtype, ka, kb)
        known = ctx.block_values.get(key)
        if known is not None:
            return known[2]
        result = self._emit_int_op(op, a, b, info)
        ctx.block_values[key] = (a, b, result)  # the operands kept alive: their ids stay theirs
        return result

    def _emit_int_op(self, op: str, a: ir.Value, b: ir.Value, info: DTypeInfo) -> ir.Value:
        """The instructions of integer operation `op` (`int_op` without folding or reuse)."""
        signed = info.is_signed
        dtype = info.name
        bld = self.builder
        if op == "udiv":
            return bld.udiv(a, b)
        if op == "urem":
            return bld.urem(a, b)
        if op == "add":
            return bld.add(a, b)
        if op == "sub":
            return bld.sub(a, b)
        if op == "mul":
            return bld.mul(a, b)
        if op == "div":
            return bld.sdiv(a, b) if signed else bld.udiv(a, b)
        if op in ("floordiv", "floormod"):
            if not signed:
                return bld.udiv(a, b) if op == "floordiv" else bld.urem(a, b)
            # Truncating division, then step toward -inf when the remainder's sign differs from the divisor's.
            quotient, remainder = bld.sdiv(a, b), bld.srem(a, b)
            zero = ir.Constant(a.type, [0] * lanes_of(a)) if lanes_of(a) > 1 else ir.Constant(a.type, 0)
            differs = bld.icmp_signed("!=", bld.icmp_signed("<", remainder, zero), bld.icmp_signed("<", b, zero))
            adjust = bld.and_(bld.icmp_signed("!=", remainder, zero), differs)
            if op == "floordiv":
                return bld.sub(quotient, bld.zext(adjust, a.type))
            return bld.select(adjust, bld.add(remainder, b), remainder)
        if op in ("min", "max"):
            cmp = bld.icmp_signed if signed else bld.icmp_unsigned
            return bld.select(cmp("<" if op == "min" else ">", a, b), a, b)
        if op == "and":
            return bld.and_(a, b)
        if op == "or":
            return bld.or_(a, b)
        if op == "bitand":
            return bld.and_(a, b)
        if op == "bitor":
            return bld.or_(a, b)
        if op == "bitxor":
            return bld.xor(a, b)
        if op in tir.COMPARE_OPS:
            cmp = bld.icmp_signed if signed and info.kind != "bool" else bld.icmp_unsigned
            return cmp(_COMPARE_SYMBOL[op], a, b)
        raise CompileError(f"operator {op} is not defined on {dtype} values")

    # -- memory -----------------------------------------------------------------------------------------

    def buffer_pointer(self, buf: tir.Buffer) -> ir.Value:
        pointer = self.ctx.buffers.get(buf)
        if pointer is None:
            raise CompileError(
                f"buffer {buf.name} is accessed in kernel {self._func_name} but is neither a parameter nor "
                "allocated around the access"
            )
        return pointer

    def lower_load(self, node: tir.Load) -> ir.Value:
        ctx = self.ctx
        b = ctx.builder
        buf = node.buffer
        pointer = self.buffer_pointer(buf)
        self._check_rank(node.indices, buf)
        align = dtype_info(buf.dtype).itemsize
        vec = ctx.vector
        varies = vec is not None and self.lane_varies(node.indices, vec.var)
        stride: int | None = 0
        if vec is not None and varies:
            stride = self.lane_stride(node.indices, buf, vec.var)
        if vec is None or stride == 0:
            offset = self.eval_lane0(node.indices, buf) if varies else self.offset(node.indices, buf)
            address = b.gep(pointer, [offset])
            if vec is not None and ctx.mask is not None:
                value = self._masked_scalar_load(address, self._any(ctx.mask), align)
            else:
                value = b.load(address, align=align)
        elif stride == 1:
            align = self.contiguous_alignment(node.indices, buf, vec)
            address = b.gep(pointer, [self.eval_lane0(node.indices, buf)])
            vtype = ir.VectorType(memory_type(buf.dtype), vec.lanes)
            vector_pointer = b.bitcast(address, vtype.as_pointer())
            if ctx.mask is None:
                value = b.load(vector_pointer, align=align)
            elif self.own_vector_access(buf, node.indices):
                # masked-off lanes read as zero, as from a masked load
                value = b.select(ctx.mask, b.load(vector_pointer, align=align), ir.Constant(vtype, None))
            else:
                value = self._masked_load(vector_pointer, ctx.mask, align)
        elif stride is not None and 1 < stride <= self.max_strided_load and vec.lanes * stride <= 128:
            address = b.gep(pointer, [self.eval_lane0(node.indices, buf)])
            value = self._strided_load(address, stride, vec.lanes, memory_type(buf.dtype), ctx.mask, align)
        elif (window := self.load_window(node.indices, buf)) is not None:
            low, picks = window
            address = b.gep(pointer, [b.add(self.eval_lane0(node.indices, buf), ir.Constant(I64, low))])
            value = self._window_load(address, picks, memory_type(buf.dtype), align)
        else:
            value = self._gather(self.lane_pointers(pointer, self.lane_offsets(node.indices, buf, stride)),
                                 ctx.mask, align)
        if buf.dtype == "bool":
            value = b.icmp_unsigned("!=", value, ir.Constant(value.type, [0] * lanes_of(value))
                                    if lanes_of(value) > 1 else ir.Constant(value.type, 0))
        if dtype_info(buf.dtype).value_bits:
            value = self.wrap_sub_byte(value, buf.dtype)
        return value

    def wrap_sub_byte(self, value: ir.Value, dtype: str) -> ir.Value:
        """An i8 register reduced to a sub-byte integer's value: its low bits, sign-extended if signed (the
        wrap-around of integer arithmetic and conversions, and what a byte in memory holds)."""
        info = dtype_info(dtype)
        b = self.builder
        unused = self.constant("int8", 8 - info.value_bits, lanes_of(value))
        if info.is_signed:
            return b.ashr(b.shl(value, unused), unused)
        return b.and_(value, self.constant("int8", (1 << info.value_bits) - 1, lanes_of(value)))

    def lane_pointers(self, pointer: ir.Value, offsets: ir.Value) -> ir.Value:
        instr = VectorGEP(self.builder.block, pointer, offsets)
        self.builder._insert(instr)
        return instr

    def _all_lanes(self, lanes: int) -> ir.Constant:
        return ir.Constant(ir.VectorType(I1, lanes), [1] * lanes)

    def _any(self, mask: ir.Value) -> ir.Value:
        fn = self.declare(f"llvm.vector.reduce.or.{intrinsic_suffix(mask.type)}", I1, [mask.type])
        return self.builder.call(fn, [mask])

    def _masked_load(self, vector_pointer: ir.Value, mask: ir.Value, align: int) -> ir.Value:
        vtype = vector_pointer.type.pointee
        name = f"llvm.masked.load.{intrinsic_suffix(vtype)}.p0"
        fn = self.declare(name, vtype, [vector_pointer.type, I32, mask.type, vtype])
        zero = ir.Constant(vtype, None)
        return self.builder.call(fn, [vector_pointer, ir.Constant(I32, align), mask, zero])

    def _strided_load(self, address: ir.Value, stride: int, lanes: int, element: ir.Type, mask: ir.Value | None,
                      align: int) -> ir.Value:
        """Lanes `address[0], address[stride], ...`: one masked load of the span they cover, then a shuffle. Only
        the picked elements are enabled in the load's mask, so nothing past the last lane's element is touched."""
        b = self.builder
        span = lanes * stride
        wide = ir.VectorType(element, span)
        if mask is None:
            wide_mask: ir.Value = ir.Constant(ir.VectorType(I1, span), [int(j % stride == 0) for j in range(span)])
        else:
            # lane i of `mask` enables element i * stride of the span; the elements in between stay off
            off = ir.Constant(ir.VectorType(I1, lanes), [0] * lanes)
            picks = [(j // stride) if j % stride == 0 else lanes for j in range(span)]
            wide_mask = b.shuffle_vector(mask, off, ir.Constant(ir.VectorType(I32, span), picks))
        loaded = self._masked_load(b.bitcast(address, wide.as_pointer()), wide_mask, align)
        picks = ir.Constant(ir.VectorType(I32, lanes), [i * stride for i in range(lanes)])
        return b.shuffle_vector(loaded, ir.Constant(wide, ir.Undefined), picks)

    def load_window(self, indices: tuple[tir.PrimExpr, ...], buf: tir.Buffer) -> tuple[int, list[int]] | None:
        """(first element, element per lane) of a load whose lanes read a fixed pattern of a short span around lane
        0's element (`affine.lane_deltas`), or None. The span is at most `max_window_load` vectors (and 128
        elements) wide; the chunk must start at a constant lane and have no mask (a masked-off lane's element may
        lie outside the buffer). A pattern that is not contiguous (`[0..7]` four times, reversed, every other
        element) costs one load and a shuffle instead of a gather of single elements."""
        ctx = self.ctx
        vec = ctx.vector
        if vec is None or ctx.mask is not None or self.max_window_load <= 0:
            return None
        base = int_constant_value(vec.base)
        if base is None:
            return None
        deltas = affine.lane_deltas(indices, buf.shape, vec.var, ctx.extents, range(base, base + vec.lanes))
        if deltas is None:
            return None
        low = min(deltas)
        if max(deltas) - low + 1 > min(self.max_window_load * vec.lanes, 128):  # 128: as `_strided_load`'s span
            return None
        return low, [d - low for d in deltas]

    def _window_load(self, address: ir.Value, picks: list[int], element: ir.Type, align: int) -> ir.Value:
        """Lanes `address[picks[0]], address[picks[1]], ...`: one plain load of the span they cover, then a
        shuffle. The span's first and last elements are read by some lane, so every element between them lies in
        the same buffer: the load touches no memory the lanes do not own, and needs no mask (a masked byte load
        has no instruction on AVX2: LLVM splits it into one insert per element)."""
        b = self.builder
        span = max(picks) + 1
        wide = ir.VectorType(element, span)
        pointer = b.bitcast(address, wide.as_pointer())
        loaded = b.load(pointer, align=align)
        if picks == list(range(span)):
            return loaded
        order = ir.Constant(ir.VectorType(I32, len(picks)), picks)
        return b.shuffle_vector(loaded, ir.Constant(wide, ir.Undefined), order)

    def _masked_store(self, value: ir.Value, pointer: ir.Value, mask: ir.Value, align: int) -> None:
        if lanes_of(value) == 1:
            # A store that happens only if any lane is active: a one-lane masked store, no branch needed.
            vtype = ir.VectorType(value.type, 1)
            value = self.builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(I32, 0))
            pointer = self.builder.bitcast(pointer, vtype.as_pointer())
            mask = self.builder.insert_element(
                ir.Constant(ir.VectorType(I1, 1), ir.Undefined), mask, ir.Constant(I32, 0)
            )
        name = f"llvm.masked.store.{intrinsic_suffix(value.type)}.p0"
        fn = self.declare(name, VOID, [value.type, pointer.type, I32, mask.type])
        self.builder.call(fn, [value, pointer, ir.Constant(I32, align), mask])

    def _masked_scalar_load(self, address: ir.Value, active: ir.Value, align: int) -> ir.Value:
        """Load one element only if `active` (avoids touching memory a fully masked-off chunk may not own)."""
        b = self.builder
        vtype = ir.VectorType(address.type.pointee, 1)
        mask = b.insert_element(ir.Constant(ir.VectorType(I1, 1), ir.Undefined), active, ir.Constant(I32, 0))
        loaded = self._masked_load(b.bitcast(address, vtype.as_pointer()), mask, align)
        return b.extract_element(loaded, ir.Constant(I32, 0))

    def _gather(self, pointers: ir.Value, mask: ir.Value | None, align: int) -> ir.Value:
        lanes = pointers.type.count
        vtype = ir.VectorType(pointers.type.element.pointee, lanes)
        mask = mask if mask is not None else self._all_lanes(lanes)
        name = f"llvm.masked.gather.{intrinsic_suffix(vtype)}.v{lanes}p0"
        fn = self.declare(name, vtype, [pointers.type, I32, mask.type, vtype])
        return self.builder.call(fn, [pointers, ir.Constant(I32, align), mask, ir.Constant(vtype, None)])

    def _scatter(self, value: ir.Value, pointers: ir.Value, mask: ir.Value | None, align: int) -> None:
        lanes = pointers.type.count
        mask = mask if mask is not None else self._all_lanes(lanes)
        name = f"llvm.masked.scatter.{intrinsic_suffix(value.type)}.v{lanes}p0"
        fn = self.declare(name, VOID, [value.type, pointers.type, I32, mask.type])
        self.builder.call(fn, [value, pointers, ir.Constant(I32, align), mask])

    # -- intrinsics -------------------------------------------------------------------------------------

    def lower_call(self, node: tir.Call) -> ir.Value:
        name = node.name
        dtype = node.dtype
        if name in tir.DOT_INTRINSICS:
            return self.lower_dot(node)
        if name == tir.DOT2_BF16_INTRINSIC:
            return self.lower_dot_bf16(node)
        info = dtype_info(dtype)
        if info.kind == "lowfloat":  # computed in float32, rounded back to the type
            wide = self.lower_call(tir.Call(name, node.args, "float32"))
            return self.cast(wide, "float32", dtype)
        args = [self.cast(self.value_of(a), a.dtype, dtype) for a in node.args]
        args = self.match_lanes(*args)
        custom = self.math_call(name, dtype, args)
        if custom is not None:
            return custom
        b = self.builder
        expected = {"pow": 2, "fma": 3}.get(name, 1)
        if len(args) != expected:
            raise CompileError(f"intrinsic {name} takes {expected} argument(s), got {len(args)}")
        if info.value_bits:  # abs(-8) wraps to -8 in int4, as in ml_dtypes
            return self.wrap_sub_byte(self._integer_call(name, dtype, args), dtype)
        if not info.is_float:
            return self._integer_call(name, dtype, args)
        x = args[0]
        if name in ("sqrt", "fabs", "floor", "ceil"):
            return b.call(self.intrinsic(f"llvm.{name}", x.type), [x])
        if name == "round":  # numpy rounds halves to even
            return b.call(self.intrinsic("llvm.roundeven", x.type), [x])
        if name == "rsqrt":
            one = self.constant(dtype, 1.0, lanes_of(x))
            return b.fdiv(one, b.call(self.intrinsic("llvm.sqrt", x.type), [x]), flags=self._float_flags)
        if name == "fma":
            return b.call(self.intrinsic("llvm.fma", x.type, 3), args)
        if name == "pow":
            return self._in_float32(dtype, args, lambda v: b.call(self.intrinsic("llvm.pow", v[0].type, 2), v))
        if name in LIBM_FUNCTIONS:
            return self._in_float32(dtype, args, lambda v: self._libm_per_lane(name, v[0]))
        if name in ("exp", "log", "tanh", "erf", "sigmoid"):
            if info.bits == 64:
                return self._float64_math(name, x)
            math = Float32Math(b, lambda n, t: self.intrinsic(n, t))
            return self._in_float32(dtype, args, lambda v: getattr(math, name)(v[0]))
        raise CompileError(f"unknown intrinsic {name}")

    # -- integer dot products -----------------------------------------------------------------------

    def dot_fuses_accumulator(self, name: str) -> bool:
        """Whether the product of dot intrinsic `name` adds an accumulator itself: `acc + dot(...)` then passes `acc`
        in instead of adding after (vpdpbusd adds in the same instruction; see the CPU back end for the others)."""
        return False

    def lower_dot(self, node: tir.Call, acc: ir.Value | None = None) -> ir.Value:
        """`acc + dot(a, b)` (see `tir.DOT_INTRINSICS`) over the current vector's lanes (1 outside one)."""
        vec = self.ctx.vector
        lanes = vec.lanes if vec is not None else 1
        terms = len(node.args) // 2
        a = self._dot_operand(node.args[:terms], lanes)
        b = self._dot_operand(node.args[terms:], lanes)
        if acc is not None and lanes == 1:  # the products are computed as one-lane vectors
            acc = self.builder.insert_element(ir.Constant(ir.VectorType(I32, 1), None), acc, ir.Constant(I32, 0))
        elif acc is not None:
            acc = self.broadcast(acc, lanes)
        if node.name == tir.DOT2_INTRINSIC:
            value = self.dot2_product(a, b, lanes, acc)
        else:
            value = self.dot4_product(node.name, a, b, lanes, acc)
        if lanes == 1:
            return self.builder.extract_element(value, ir.Constant(I32, 0))
        return value

    def dot4_product(self, name: str, a: ir.Value, b: ir.Value, lanes: int, acc: ir.Value | None) -> ir.Value:
        """`<lanes x i32>` sums of the four byte products per lane of `a` (u8) and `b` (s8), plus `acc` when given;
        targets with dot-product instructions override this."""
        total = generic_dot4(self.builder, a, b, lanes)
        return total if acc is None else self.builder.add(acc, total)

    def dot2_product(self, a: ir.Value, b: ir.Value, lanes: int, acc: ir.Value | None) -> ir.Value:
        """`<lanes x i32>` sums of the two products per lane of `a` (`<2 lanes x i8>`, u8) and `b`
        (`<2 lanes x i16>` or `<2 lanes x i8>`, signed), plus `acc` when given; targets with vpmaddwd override this."""
        total = generic_dot2(self.builder, a, b, lanes)
        return total if acc is None else self.builder.add(acc, total)

    def lower_dot_bf16(self, node: tir.Call, acc: ir.Value | None = None) -> ir.Value:
        """`acc + a0*b0 + a1*b1` (`tir.DOT2_BF16_INTRINSIC`) over the current vector's lanes (1 outside one)."""
        vec = self.ctx.vector
        lanes = vec.lanes if vec is not None else 1
        a = self._dot_operand(node.args[:2], lanes)
        b = self._dot_operand(node.args[2:], lanes)
        floats = ir.VectorType(ir.FloatType(), lanes)
        if acc is not None and lanes == 1:  # the products are computed as one-lane vectors
            acc = self.builder.insert_element(ir.Constant(floats, None), acc, ir.Constant(I32, 0))
        elif acc is not None:
            acc = self.broadcast(acc, lanes)
        value = self.bf16_dot_product(a, b, lanes, acc)
        if lanes == 1:
            return self.builder.extract_element(value, ir.Constant(I32, 0))
        return value

    def bf16_dot_product(self, a: ir.Value, b: ir.Value, lanes: int, acc: ir.Value | None) -> ir.Value:
        """`<lanes x float>` of `acc + a0*b0 + a1*b1` per lane, `a` and `b` `<2 lanes x i16>` bfloat16 codes: the
        pairs widened to float32 and multiplied-added; targets with vdpbf16ps override this."""
        return widened_dot2_bf16(self.builder, self.declare, a, b, lanes, acc)

    def _dot_operand(self, args: tuple[tir.PrimExpr, ...], lanes: int) -> ir.Value:
        """The `k = len(args)` operands of every lane as one `<k * lanes x T>` vector, lane by lane (`T` the
        operands' integer type)."""
        b = self.builder
        k = len(args)
        contiguous = self._dot_contiguous(args, lanes)
        if contiguous is not None:
            return contiguous
        element = scalar_type(args[0].dtype)
        values = [self.value_of(arg) for arg in args]
        if all(lanes_of(v) == 1 for v in values):
            group: ir.Value = ir.Constant(ir.VectorType(element, k), None)
            for i, v in enumerate(values):
                group = b.insert_element(group, v, ir.Constant(I32, i))
            if lanes == 1:
                return group
            word = self.broadcast(b.bitcast(group, ir.IntType(k * element.width)), lanes)
            return b.bitcast(word, ir.VectorType(element, k * lanes))
        parts = [self.broadcast(v, lanes) for v in values]
        while len(parts) > 2:  # v0..v3 -> (v0 v1), (v2 v3): value i's lanes start at i * lanes throughout
            size = parts[0].type.count
            joined = ir.Constant(ir.VectorType(I32, 2 * size), list(range(2 * size)))
            parts = [b.shuffle_vector(parts[i], parts[i + 1], joined) for i in range(0, len(parts), 2)]
        # element k l + i of the result is lane l of value i, at i * lanes + l of the two parts joined
        order = [i * lanes + lane for lane in range(lanes) for i in range(k)]
        return b.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(I32, k * lanes), order))

    def _dot_contiguous(self, args: tuple[tir.PrimExpr, ...], lanes: int) -> ir.Value | None:
        """One load of the operands when the `k = len(args)` values are consecutive elements of one buffer and the
        lanes either share them (a `k`-element load broadcast) or step by `k` (a `k * lanes`-element vector load);
        else None."""
        ctx = self.ctx
        vec = ctx.vector
        if vec is None or ctx.mask is not None or not all(isinstance(a, tir.Load) for a in args):
            return None
        loads: list[tir.Load] = [a for a in args if isinstance(a, tir.Load)]
        buf = loads[0].buffer
        info = dtype_info(buf.dtype)
        # integer operands, or bfloat16 codes (`tir.DOT2_BF16_INTRINSIC`), whole bytes each
        if any(load.buffer is not buf for load in loads) or info.kind not in ("int", "uint", "lowfloat") \
                or info.value_bits:
            return None
        first = affine.flat_form(loads[0].indices, buf.shape, ctx.extents)
        for k, load in enumerate(loads[1:], start=1):
            step = affine.flat_form(load.indices, buf.shape, ctx.extents).plus(first, -1)
            if not (step.is_constant and step.const == k):
                return None
        count = len(loads)
        stride = affine.lane_stride(loads[0].indices, buf.shape, vec.var, ctx.extents)
        if stride not in (0, count):
            return None
        b = self.builder
        element = scalar_type(buf.dtype)
        pointer = self.buffer_pointer(buf)
        varies = any(affine.contains_var(i, vec.var) for i in loads[0].indices)
        offset = self.eval_lane0(loads[0].indices, buf) if varies else self.offset(loads[0].indices, buf)
        address = b.gep(pointer, [offset])
        if stride == count:
            return b.load(b.bitcast(address, ir.VectorType(element, count * lanes).as_pointer()), align=1)
        word_type = ir.IntType(count * element.width)
        word = b.load(b.bitcast(address, word_type.as_pointer()), align=1)
        return b.bitcast(self.broadcast(word, lanes), ir.VectorType(element, count * lanes))

    def _in_float32(self, dtype: str, args: list[ir.Value], emit: Callable[[list[ir.Value]], ir.Value]) -> ir.Value:
        """Compute half-precision math in float32 (as numpy does) and round the result back."""
        if dtype != "float16":
            return emit(args)
        widened = [self.cast(a, "float16", "float32") for a in args]
        return self.cast(emit(widened), "float32", "float16")

    def _float64_math(self, name: str, x: ir.Value) -> ir.Value:
        b = self.builder
        if name == "exp":
            return b.call(self.intrinsic("llvm.exp", x.type), [x])
        if name == "log":
            return b.call(self.intrinsic("llvm.log", x.type), [x])
        if name == "sigmoid":
            one = self.constant("float64", 1.0, lanes_of(x))
            e = b.call(self.intrinsic("llvm.exp", x.type), [b.fneg(x)])
            return b.fdiv(one, b.fadd(one, e))
        # tanh and erf: the C library, one lane at a time (double precision is not the fast path).
        return self._libm_per_lane(name, x)

    def _libm_per_lane(self, name: str, x: ir.Value) -> ir.Value:
        """The C library's `name` (`namef` on float32) applied to each lane of `x`."""
        b = self.builder
        scalar = x.type.element if isinstance(x.type, ir.VectorType) else x.type
        single = isinstance(scalar, ir.FloatType)
        libm = self.declare(f"{name}f" if single else name, scalar, [scalar])
        if lanes_of(x) == 1:
            return b.call(libm, [x])
        result: ir.Value = ir.Constant(x.type, ir.Undefined)
        for lane in range(lanes_of(x)):
            index = ir.Constant(I32, lane)
            result = b.insert_element(result, b.call(libm, [b.extract_element(x, index)]), index)
        return result

    def _integer_call(self, name: str, dtype: str, args: list[ir.Value]) -> ir.Value:
        b = self.builder
        x = args[0]
        if name in ("floor", "ceil", "round"):
            return x
        if name == "fabs" and dtype_info(dtype).is_signed:
            zero = self.constant(dtype, 0, lanes_of(x))
            return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
        if name == "fabs":
            return x
        raise CompileError(f"intrinsic {name} needs a floating-point argument, got {dtype}")

    # -- checks -----------------------------------------------------------------------------------------

    def _check_buffer(self, buf: tir.Buffer) -> None:
        dtype_info(buf.dtype)
        if any(s < 0 for s in buf.shape):
            raise CompileError(f"buffer {buf.name} has a negative dimension {buf.shape}")

    def _check_rank(self, indices: tuple[tir.PrimExpr, ...], buf: tir.Buffer) -> None:
        if len(indices) != len(buf.shape):
            raise CompileError(
                f"buffer {buf.name} has {len(buf.shape)} dimension(s) but is indexed with {len(indices)} in "
                f"kernel {self._func_name}"
            )


_FOLDABLE: dict[str, Callable[[int, int], int | bool]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b, "min": min, "max": max,
    "and": lambda a, b: bool(a) and bool(b), "or": lambda a, b: bool(a) or bool(b),
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
}
"""Integer operators `known_condition` evaluates on constants (Python's floor division and modulo: TIR's)."""

_COMPARE_SYMBOL = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


# `int_op`'s unsigned division of operands known to be non-negative folds as floor division.
_UNSIGNED_OPS = {"udiv": "floordiv", "urem": "floormod"}


def _operand_key(value: ir.Value) -> object | None:
    """What identifies `value` as an operand of `int_op`'s reused instructions: an integer constant by its type
    and value (constants are made anew at each use), any other value by identity; None for other constants."""
    if isinstance(value, ir.Constant):
        constant = value.constant
        if isinstance(value.type, ir.IntType) and isinstance(constant, int):
            return (value.type.width, constant)
        if isinstance(value.type, ir.VectorType) and isinstance(value.type.element, ir.IntType) \
                and isinstance(constant, list) and all(isinstance(c, int) for c in constant):
            return (value.type.element.width, tuple(constant))
        return None
    return id(value)


def _fold_int(op: str, a: int, b: int, info: DTypeInfo) -> int | None:
    bits, signed = info.bits, info.is_signed
    if op == "add":
        return _wrap(a + b, bits, signed)
    if op == "sub":
        return _wrap(a - b, bits, signed)
    if op == "mul":
        return _wrap(a * b, bits, signed)
    if b != 0 and op == "floordiv":
        return _wrap(a // b, bits, signed)
    if b != 0 and op == "floormod":
        return _wrap(a % b, bits, signed)
    if b != 0 and op == "div":
        quotient = abs(a) // abs(b)
        return _wrap(quotient if (a >= 0) == (b >= 0) else -quotient, bits, signed)
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    if op == "and":
        return a & b
    if op == "or":
        return a | b
    if op in tir.BITWISE_OPS:  # in-range operands give in-range results: no wrapping needed
        return {"bitand": a & b, "bitor": a | b, "bitxor": a ^ b}[op]
    if op in _COMPARE_SYMBOL:
        return int(
            {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[op]
        )
    return None
