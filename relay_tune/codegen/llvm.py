"""CPU code generation through LLVM: lower PrimFuncs, optimize at O3, emit object code, JIT-load it.

Compilation and loading are separate steps so that a tuner can compile in worker processes and run
the result elsewhere:

    obj = compile_object(funcs, target)            # bytes: a relocatable object file
    lib = load_object(obj, funcs)                  # KernelLibrary in this process
    lib.get("dense")(a, b, out)

`build_llvm` does both. `emit_llvm_ir` and `emit_assembly` show what is generated.

Calling convention: every PrimFunc becomes `void name(T0* p0, T1* p1, ...)`, one `noalias` pointer per
buffer parameter (bool buffers are bytes), a plain C function that ctypes calls with the GIL released.
For each kernel a companion `name__repeat(void** args, int64 n)` calls it `n` times, so timing loops
run without Python in between.

PARALLEL loops are outlined into a function run by every thread of a team through the OpenMP entry point
`GOMP_parallel`; each thread first runs its own contiguous, balanced share of the iterations, in chunks, then
takes the chunks other threads have not started (see `emit_parallel_loop`). Which team provides the entry points
(relay-tune's native team by default, libgomp, or a Python team) is chosen when the code is loaded (see
`relay_tune.codegen.jit`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass

import llvmlite.binding as llvm
import llvmlite.ir as ir

from relay_tune.codegen.jit import REPEAT_SUFFIX, KernelLibrary, KernelSignature, load_object
from relay_tune.codegen.llvm_base import (
    I8,
    I32,
    I64,
    VOID,
    CodegenOptions,
    FunctionContext,
    LLVMCodegenBase,
    dtype_info,
    memory_type,
)
from relay_tune.codegen.llvm_dot import DotFeatures, x86_dot2, x86_dot2_bf16, x86_dot4
from relay_tune.errors import CompileError, UnsupportedError
from relay_tune.kernel import tir
from relay_tune.target import Target

__all__ = [
    "CPUCodegen",
    "build_llvm",
    "codegen_options",
    "compile_object",
    "emit_assembly",
    "emit_llvm_ir",
    "load_object",
    "lower_module",
    "required_libraries",
]

# Local buffers up to this size live on the stack (so small ones become registers); larger scratch
# buffers and every GLOBAL-scope allocation come from the heap, because worker threads have small stacks.
STACK_ALLOCATION_LIMIT = 128 * 1024
# A parallel loop is cut into this many chunks per thread of the team (fewer when it has fewer iterations).
CHUNKS_PER_THREAD = 4
# Symbols generated code calls (directly, or through LLVM's lowering of intrinsics and loops): a kernel
# with one of these names would capture the calls meant for the C library or the OpenMP runtime.
RESERVED_SYMBOLS = frozenset(
    {
        "aligned_alloc", "free", "malloc", "memcpy", "memmove", "memset", "GOMP_parallel",
        "omp_get_thread_num", "omp_get_num_threads",
    }
    | {f"{name}{suffix}" for name in ("exp", "exp2", "log", "log2", "pow", "tanh", "erf", "sqrt", "floor", "ceil",
                                      "round", "roundeven", "rint", "fma", "fabs", "fmod", "sin", "cos", "tan",
                                      "asin", "acos", "atan")
       for suffix in ("", "f", "l")}
)
HEAP_ALIGNMENT = 64

_init_lock = threading.Lock()
_initialized = False
_machines = threading.local()


def ensure_llvm_initialized() -> None:
    """Initialize LLVM's native target, assembly printer and assembly parser once per process (MC emission needs
    the first two; object code with inline assembly, `llvm_dot.opaque_add`, the parser)."""
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            llvm.initialize_native_asmparser()
            _initialized = True


def codegen_options(target: Target, fast_math: bool = False) -> CodegenOptions:
    """Lowering options suited to `target` (vector chunks as wide as one SIMD register)."""
    return CodegenOptions(fast_math=fast_math, chunk_lanes=target.vector_lanes("float32"))


_OUTLINED_TYPE = ir.FunctionType(VOID, [I8.as_pointer()])  # a parallel loop's outlined body: void f(i8* captured)


@dataclass(frozen=True)
class _ParallelRegion:
    """A parallel loop as its outlined body sees it: what the body captures, and how the iterations are shared.

    Everything the body may refer to travels in one struct (`context_type`): loop variables and buffer pointers,
    then one claim counter per owner. Work sharing tolerates a late thread: the iterations are cut into `chunks`
    contiguous chunks and thread t owns the chunks of its static share (contiguous, balanced). A thread takes its
    own chunks in order, then whatever the other owners have not started. On a quiet machine every thread runs
    exactly its static share (the same rows as in the kernels before and after: caches stay warm); when a thread is
    descheduled (more runnable threads than cores, e.g. another library's spinning pool) or libgomp gives a smaller
    team, the running threads finish its share instead of waiting for it at the end of the region."""

    loop: tir.For
    threads: int
    chunks: int
    captured_vars: list[tuple[tir.LoopVar, ir.Value]]
    captured_buffers: list[tuple[tir.Buffer, ir.Value]]

    @classmethod
    def of(cls, loop: tir.For, threads: int, ctx: FunctionContext) -> _ParallelRegion:
        """The region of `loop` on `threads` threads, capturing what is in scope in `ctx`."""
        chunks = min(loop.extent, threads * CHUNKS_PER_THREAD)
        return cls(loop, threads, chunks, list(ctx.env.items()), list(ctx.buffers.items()))

    @property
    def captured_values(self) -> list[ir.Value]:
        """The captured loop variables' values, then the buffer pointers: the struct's fields before the counters."""
        return [v for _, v in self.captured_vars] + [p for _, p in self.captured_buffers]

    @property
    def counters_field(self) -> int:
        """The struct field of the claim counters (i64 x threads): the chunk each owner hands out next."""
        return len(self.captured_vars) + len(self.captured_buffers)

    @property
    def context_type(self) -> ir.LiteralStructType:
        """The struct the outlined body receives: the captured values, then the claim counters."""
        return ir.LiteralStructType([v.type for v in self.captured_values] + [ir.ArrayType(I64, self.threads)])


def _store_captured(b: ir.IRBuilder, region: _ParallelRegion, slot: ir.Value) -> None:
    """Stores the captured values into the struct at `slot`, and each owner's first chunk into its counter."""
    for i, value in enumerate(region.captured_values):
        b.store(value, b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
    for owner in range(region.threads):
        first_chunk = ir.Constant(I64, region.chunks * owner // region.threads)
        b.store(first_chunk, b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, region.counters_field),
                                         ir.Constant(I32, owner)]))


def _load_captured(ctx: FunctionContext, region: _ParallelRegion, fields: ir.Value) -> None:
    """Binds, in the outlined body's `ctx`, the captured loop variables and buffers to their loads from `fields`."""
    b = ctx.builder
    for i, (var, _) in enumerate(region.captured_vars):
        ctx.env[var] = b.load(b.gep(fields, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
    offset = len(region.captured_vars)
    for i, (buf, _) in enumerate(region.captured_buffers):
        ctx.buffers[buf] = b.load(b.gep(fields, [ir.Constant(I32, 0), ir.Constant(I32, offset + i)]))


class CPUCodegen(LLVMCodegenBase):
    """The host CPU back end: C-ABI kernels, OpenMP-style parallel loops, heap scratch buffers."""

    def __init__(self, module: ir.Module, target: Target, options: CodegenOptions | None = None) -> None:
        if target.kind != "llvm":
            raise UnsupportedError(f"the CPU code generator needs an llvm target, not {target}")
        super().__init__(module, options or codegen_options(target))
        self.target = target
        self._outlined = 0
        self.dot_features = DotFeatures.for_target(target)

    def dot_fuses_accumulator(self, name: str) -> bool:
        """vpdpbusd adds the accumulator itself; the sums of vpmaddwd (int16 weights) and of vpmaddubsw + vpmaddwd
        are added by `x86_dot2` / `x86_dot4` as one opaque vpaddd per register where the target has the VEX forms
        (`llvm_dot.opaque_add`: the machine combiner regrouped their adds across the unrolled quads of a block, and
        the register tiles spilled: a third of the int8 3x3 convolutions' inner-loop instructions were spills)."""
        if name in tir.DOT4_INTRINSICS:
            return self.dot_features.vnni or (self.dot_features.pmaddubsw and self.dot_features.vex)
        return name == tir.DOT2_INTRINSIC and self.dot_features.pmaddubsw and self.dot_features.vex

    def dot4_product(self, name: str, a: ir.Value, b: ir.Value, lanes: int, acc: ir.Value | None) -> ir.Value:
        """vpdpbusd (VNNI) or vpmaddubsw + vpmaddwd (when the intrinsic's pairs fit int16), else generic IR."""
        fast = x86_dot4(self.builder, self.declare, self.dot_features, a, b, lanes,
                        name == "dot4_u8s8_i32_pairs16", acc)
        return fast if fast is not None else super().dot4_product(name, a, b, lanes, acc)

    def dot2_product(self, a: ir.Value, b: ir.Value, lanes: int, acc: ir.Value | None) -> ir.Value:
        """vpmaddwd on x86, else generic IR."""
        fast = x86_dot2(self.builder, self.declare, self.dot_features, a, b, lanes, acc)
        return fast if fast is not None else super().dot2_product(a, b, lanes, acc)

    def bf16_dot_product(self, a: ir.Value, b: ir.Value, lanes: int, acc: ir.Value | None) -> ir.Value:
        """vdpbf16ps (AVX512_BF16), else the widened pairs' fused multiply-adds."""
        fast = x86_dot2_bf16(self.builder, self.declare, self.dot_features, a, b, lanes, acc)
        return fast if fast is not None else super().bf16_dot_product(a, b, lanes, acc)

    # -- kernels ------------------------------------------------------------------------------------

    def declare_kernel(self, func: tir.PrimFunc) -> ir.Function:
        if func.name in self.module.globals:
            raise CompileError(f"two kernels are named {func.name!r}; kernel names must be unique per build")
        if func.name in RESERVED_SYMBOLS or func.name.startswith("llvm.") or not func.name.strip() \
                or any(c in func.name for c in " \t\n\"\\"):
            raise CompileError(f"{func.name!r} cannot be a kernel name (empty, blank or a C library symbol)")
        fn = super().declare_kernel(func)
        # Callers reach kernels only through the C ABI; keeping them out of line also keeps the timing
        # wrapper honest (LLVM cannot merge or hoist work across repeated calls it cannot see into).
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")
        align = func.param_align
        for arg in fn.args:
            arg.add_attribute("noalias")
            if align > 1:
                arg.attributes.align = align
        return fn

    def lower_kernel(self, func: tir.PrimFunc) -> ir.Function:
        self._outlined = 0
        fn = self.lower(func)
        self.emit_repeat_wrapper(fn)
        return fn

    def emit_repeat_wrapper(self, kernel: ir.Function) -> ir.Function:
        """`void name__repeat(void** args, int64 n)`: call the kernel n times with args[i] as parameter i."""
        argv_type = I8.as_pointer().as_pointer()
        fn = ir.Function(self.module, ir.FunctionType(VOID, [argv_type, I64]), name=kernel.name + REPEAT_SUFFIX)
        fn.attributes.add("nounwind")
        argv, count = fn.args
        self._ctx = self.new_context(fn)
        try:
            b = self.builder
            params = []
            for i, param in enumerate(kernel.args):
                raw = b.load(b.gep(argv, [ir.Constant(I64, i)]))
                params.append(b.bitcast(raw, param.type))
            self.emit_loop(ir.Constant(I64, 0), count, lambda _: self.builder.call(kernel, params), "repeat")
            self.builder.ret_void()
        finally:
            self._ctx = None
        return fn

    # -- parallel loops -----------------------------------------------------------------------------

    def emit_parallel_loop(self, loop: tir.For) -> None:
        """ForKind.PARALLEL: the body outlined into a function every thread of a libgomp team runs
        (`GOMP_parallel`), sharing the iterations as `_ParallelRegion` says; serial inside another parallel loop
        or where the loop or the target has a single thread's worth of work."""
        ctx = self.ctx
        threads = min(self.target.num_cores, loop.extent)
        if ctx.in_parallel or threads <= 1:
            # Nested parallel loops run serially inside the enclosing team's share of the work.
            self.emit_serial_loop(loop)
            return
        region = _ParallelRegion.of(loop, threads, ctx)
        slot = self.entry_builder().alloca(region.context_type, name=f"{loop.var.name}.captured")
        b = ctx.builder
        _store_captured(b, region, slot)
        outlined = self._emit_outlined(region)
        data_type = I8.as_pointer()
        gomp_parallel = self.declare("GOMP_parallel", VOID, [_OUTLINED_TYPE.as_pointer(), data_type, I32, I32])
        b.call(gomp_parallel, [outlined, b.bitcast(slot, data_type), ir.Constant(I32, threads), ir.Constant(I32, 0)])

    def _emit_outlined(self, region: _ParallelRegion) -> ir.Function:
        """The function each thread of the team runs: `void f(i8* captured)`, which loads what the loop body
        captured and takes chunks of iterations until none is left."""
        ctx = self.ctx
        self._outlined += 1
        outlined = ir.Function(self.module, _OUTLINED_TYPE, name=f"{ctx.function.name}__parallel{self._outlined}")
        outlined.linkage = "internal"
        outlined.attributes.add("nounwind")
        body_ctx = self.new_context(outlined, in_parallel=True)
        body_ctx.extents = dict(ctx.extents)
        saved, self._ctx = self._ctx, body_ctx
        try:
            fields = body_ctx.builder.bitcast(outlined.args[0], region.context_type.as_pointer())
            _load_captured(body_ctx, region, fields)
            self._emit_work_sharing(region, fields)
        finally:
            self._ctx = saved
        return outlined

    def _emit_work_sharing(self, region: _ParallelRegion, fields: ir.Value) -> None:
        """The outlined function's loops: over owners, this thread first, and over the chunks it can claim from each
        owner's counter in `fields`."""
        ob = self.builder
        outlined = self.ctx.function
        thread = ob.sext(ob.call(self.declare("omp_get_thread_num", I32, []), []), I64)
        team, total = ir.Constant(I64, region.threads), ir.Constant(I64, region.chunks)
        name = region.loop.var.name
        entry = ob.block
        owners = outlined.append_basic_block(f"{name}.owner")
        claim = outlined.append_basic_block(f"{name}.claim")
        work = outlined.append_basic_block(f"{name}.chunk")
        next_owner = outlined.append_basic_block(f"{name}.next_owner")
        done = outlined.append_basic_block(f"{name}.done")
        ob.branch(owners)
        # for step in range(team): owner = (thread + step) % team
        ob.position_at_end(owners)
        step = ob.phi(I64, name=f"{name}.step")
        step.add_incoming(ir.Constant(I64, 0), entry)
        owner = ob.urem(ob.add(thread, step), team)
        limit = ob.sdiv(ob.mul(total, ob.add(owner, ir.Constant(I64, 1))), team)
        counter = ob.gep(fields, [ir.Constant(I32, 0), ir.Constant(I32, region.counters_field), owner])
        ob.branch(claim)
        # while (chunk = counter++) < limit: run the chunk's iterations
        ob.position_at_end(claim)
        chunk = ob.atomic_rmw("add", counter, ir.Constant(I64, 1), "monotonic")
        ob.cbranch(ob.icmp_signed("<", chunk, limit), work, next_owner)
        ob.position_at_end(work)
        self._emit_chunk(region, chunk)
        self.builder.branch(claim)
        ob = self.builder
        ob.position_at_end(next_owner)
        following = ob.add(step, ir.Constant(I64, 1))
        step.add_incoming(following, next_owner)
        ob.cbranch(ob.icmp_signed("<", following, team), owners, done)
        ob.position_at_end(done)
        ob.ret_void()

    def _emit_chunk(self, region: _ParallelRegion, chunk: ir.Value) -> None:
        """The loop body over the iterations of chunk number `chunk`."""
        ob = self.builder
        loop = region.loop
        total, extent = ir.Constant(I64, region.chunks), ir.Constant(I64, loop.extent)
        start = ob.sdiv(ob.mul(extent, chunk), total)
        stop = ob.sdiv(ob.mul(extent, ob.add(chunk, ir.Constant(I64, 1))), total)

        def body(iv: ir.Value) -> None:
            self.bind(loop.var, iv, loop.extent)
            self.emit_stmt(loop.body)
            self.unbind(loop.var)

        # chunks <= extent: every chunk has at least one iteration
        self.emit_loop(start, stop, body, loop.var.name, nonempty=True)


    # -- scratch memory -------------------------------------------------------------------------------

    def allocate(self, buffer: tir.Buffer) -> tuple[ir.Value, Callable[[], None] | None]:
        nbytes = buffer.size * dtype_info(buffer.dtype).itemsize
        if buffer.scope is not tir.Scope.GLOBAL and nbytes <= STACK_ALLOCATION_LIMIT:
            return super().allocate(buffer)
        size = max(HEAP_ALIGNMENT, -(-nbytes // HEAP_ALIGNMENT) * HEAP_ALIGNMENT)
        aligned_alloc = self.declare("aligned_alloc", I8.as_pointer(), [I64, I64])
        free = self.declare("free", VOID, [I8.as_pointer()])
        b = self.builder
        raw = b.call(aligned_alloc, [ir.Constant(I64, HEAP_ALIGNMENT), ir.Constant(I64, size)], name=buffer.name)
        pointer = b.bitcast(raw, memory_type(buffer.dtype).as_pointer())

        def release() -> None:
            self.builder.call(free, [raw])

        return pointer, release


# ---------------------------------------------------------------------------------------------------
# compile / load
# ---------------------------------------------------------------------------------------------------


def lower_module(
    funcs: Sequence[tir.PrimFunc], target: Target, options: CodegenOptions | None = None
) -> ir.Module:
    """The unoptimized llvmlite module holding every kernel of `funcs` (and their repeat wrappers)."""
    ensure_llvm_initialized()
    if not funcs:
        raise CompileError("nothing to compile: no kernels given")
    machine = _target_machine(target)
    module = ir.Module(name="relay_tune_kernels")
    module.triple = machine.triple
    module.data_layout = str(machine.target_data)
    codegen = CPUCodegen(module, target, options)
    for func in funcs:
        codegen.lower_kernel(func)
    return module


def _target_machine(target: Target) -> llvm.TargetMachine:
    """One target machine per (thread, target): it is only used to optimize and emit, never handed to a JIT."""
    if target.kind != "llvm":
        raise UnsupportedError(f"LLVM CPU compilation needs an llvm target, got {target}")
    cache = getattr(_machines, "by_target", None)
    if cache is None:
        cache = _machines.by_target = {}
    key = str(target)
    machine = cache.get(key)
    if machine is None:
        ensure_llvm_initialized()
        triple = llvm.get_process_triple()
        try:
            machine = llvm.Target.from_triple(triple).create_target_machine(
                cpu=target.mcpu, features=target.llvm_features, opt=3, reloc="pic", codemodel="small"
            )
        except RuntimeError as err:
            raise CompileError(f"LLVM cannot create a target machine for {target}: {err}") from err
        cache[key] = machine
    return machine


def _optimized(
    funcs: Sequence[tir.PrimFunc],
    target: Target,
    options: CodegenOptions | None,
    timings: MutableMapping[str, float] | None,
) -> llvm.ModuleRef:
    t0 = time.perf_counter()
    module = lower_module(funcs, target, options)
    text = str(module)
    t1 = time.perf_counter()
    try:
        parsed = llvm.parse_assembly(text)
        parsed.verify()
    except RuntimeError as err:
        names = ", ".join(f.name for f in funcs)
        raise CompileError(f"LLVM rejected the code generated for {names}: {err}") from err
    t2 = time.perf_counter()
    machine = _target_machine(target)
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(parsed, passes)
    t3 = time.perf_counter()
    if timings is not None:
        timings["lower_s"] = t1 - t0
        timings["parse_s"] = t2 - t1
        timings["optimize_s"] = t3 - t2
    return parsed


def emit_llvm_ir(
    funcs: Sequence[tir.PrimFunc], target: Target, optimize: bool = False, options: CodegenOptions | None = None
) -> str:
    """LLVM IR text of the kernels, before or after the O3 pipeline."""
    if not optimize:
        return str(lower_module(funcs, target, options))
    return str(_optimized(funcs, target, options, None))


def emit_assembly(funcs: Sequence[tir.PrimFunc], target: Target, options: CodegenOptions | None = None) -> str:
    """Optimized machine assembly of the kernels (for inspection and tests)."""
    module = _optimized(funcs, target, options, None)
    return _target_machine(target).emit_assembly(module)


def compile_object(
    funcs: Sequence[tir.PrimFunc],
    target: Target,
    options: CodegenOptions | None = None,
    timings: MutableMapping[str, float] | None = None,
) -> bytes:
    """Compile kernels to a relocatable object file for `target` (O3, the target's CPU and features).

    `timings`, when given, receives the seconds spent in each stage: lower_s, parse_s, optimize_s, emit_s.
    """
    module = _optimized(funcs, target, options, timings)
    t0 = time.perf_counter()
    obj = bytes(_target_machine(target).emit_object(module))
    if timings is not None:
        timings["emit_s"] = time.perf_counter() - t0
    return obj


def required_libraries(funcs: Sequence[tir.PrimFunc], target: Target) -> tuple[str, ...]:
    """Shared libraries the compiled object expects in the loading process: libgomp when a parallel loop is
    outlined (`load_object` loads it, or substitutes its own thread team when it is missing)."""
    if target.num_cores <= 1:
        return ()
    for func in funcs:
        stack: list[tir.Stmt] = [func.body]
        while stack:
            node = stack.pop()
            if isinstance(node, tir.For):
                if node.kind is tir.ForKind.PARALLEL and node.extent > 1:
                    return ("libgomp.so.1",)
                stack.append(node.body)
            elif isinstance(node, tir.Seq):
                stack.extend(node.stmts)
            elif isinstance(node, tir.Allocate):
                stack.append(node.body)
            elif isinstance(node, tir.IfThenElse):
                stack.extend(b for b in (node.then_body, node.else_body) if b is not None)
    return ()


def build_llvm(
    funcs: Sequence[tir.PrimFunc],
    target: Target | None = None,
    options: CodegenOptions | None = None,
    threading_runtime: str = "auto",
) -> KernelLibrary:
    """Compile and load in one step: a library of callable kernels for this process."""
    target = target or Target.host()
    obj = compile_object(funcs, target, options)
    return load_object(obj, [KernelSignature.from_primfunc(f) for f in funcs], threading_runtime=threading_runtime)
