"""CUDA code generation through LLVM's NVPTX back end: loop-nest kernels become PTX text.

    module = build_ptx(funcs, Target.parse("cuda -arch=sm_90"))   # PTXModule: PTX + launch plans
    report = assemble_ptx(module.ptx, "sm_90")                     # registers / spills per kernel (ptxas -v)

From PrimFunc to launches
-------------------------
A PrimFunc is a whole fused operator; on a GPU it may need more than one launch. `plan_kernels` splits it:

- GLOBAL-scope buffers allocated at the top of the body (the intermediates of stages computed at the
  root) become *workspaces*: device buffers the runtime allocates and passes like parameters;
- each statement of the remaining top-level sequence becomes one kernel, launched in order on one stream.
  A stage computed at the root is finished by every block before the next stage's kernel starts, which
  no barrier inside one kernel could guarantee across blocks.

The launch shape of a kernel comes from its THREAD_BINDING loops: the grid/block extent of a thread tag is
the largest extent of a loop bound to it. A loop bound to a tag already bound by an enclosing loop reuses
that index (shared-memory fills inside a thread block); a binding shorter than its launch extent is guarded
(`if threadIdx.x < extent`). A kernel without bindings runs on one thread.

LLVM IR conventions
-------------------
Kernels use the `ptx_kernel` calling convention. Parameters are `addrspace(1)` (global) pointers, marked
`noalias` (buffers never overlap), which lets LLVM read inputs through the non-coherent cache; they are cast
to generic pointers for the body, and LLVM's address-space inference turns the accesses back into
`ld.global`/`st.global`. Thread indices are `llvm.nvvm.read.ptx.sreg.{tid,ctaid}.{x,y,z}`. SHARED buffers
are `addrspace(3)` globals (or slices of one dynamic shared array when a kernel needs more than the 48 KiB
of static shared memory), Barrier is `llvm.nvvm.barrier0`. LOCAL buffers are per-thread stack arrays,
which become registers when their indices are constant (unrolled loops). A contiguous access in a
VECTORIZED loop is one `<N x T>` load/store, aligned to its full width where the index arithmetic proves
it, which NVPTX emits as `ld.global.v4.f32`.

Math: NVPTX has no C library. float32 exp/log/tanh/erf/sigmoid use the CPU back end's polynomial code
(`llvm_math.Float32Math`); float64 ones and `pow` (any precision, computed in float64) are written here as
float64 polynomials and continued fractions.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field

import llvmlite.binding as llvm
import llvmlite.ir as ir

from relay_tune.codegen import affine
from relay_tune.codegen.llvm_base import (
    I1,
    I32,
    I64,
    LIBM_FUNCTIONS,
    CodegenOptions,
    LLVMCodegenBase,
    VectorLanes,
    dtype_info,
    memory_type,
)
from relay_tune.errors import CompileError, RelayTuneError, UnsupportedError
from relay_tune.kernel import tir
from relay_tune.target import KNOWN_ARCHS, Target

__all__ = [
    "DEFAULT_ARCH",
    "KNOWN_ARCHS",
    "MAX_LOCAL_BYTES_PER_THREAD",
    "STATIC_SHARED_LIMIT",
    "GPUFunction",
    "GPUKernel",
    "KernelResources",
    "LaunchConfig",
    "NVPTXCodegen",
    "PTXModule",
    "PtxasError",
    "PtxasNotFoundError",
    "PtxasReport",
    "WorkspaceSpec",
    "arch_of",
    "assemble_ptx",
    "build_ptx",
    "check_launch_resources",
    "emit_llvm_ir",
    "emit_ptx",
    "find_ptxas",
    "gpu_codegen_options",
    "launch_extents",
    "lower_module",
    "max_shared_bytes",
    "plan_kernels",
    "shared_bytes",
]

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
DEFAULT_ARCH = "sm_90"
STATIC_SHARED_LIMIT = 48 * 1024
"""Static shared memory per block; beyond it a kernel uses dynamic shared memory (opt-in at launch)."""
# The most shared memory one block can opt into, per architecture (CUDA programming guide, compute
# capabilities table). Architectures not listed get the 48 KiB every GPU offers.
_MAX_SHARED_PER_BLOCK = {
    "sm_70": 96 * 1024, "sm_72": 96 * 1024, "sm_75": 64 * 1024, "sm_80": 163 * 1024, "sm_86": 99 * 1024,
    "sm_87": 163 * 1024, "sm_89": 99 * 1024, "sm_90": 227 * 1024, "sm_100": 227 * 1024, "sm_101": 227 * 1024,
    "sm_103": 227 * 1024, "sm_120": 99 * 1024, "sm_121": 99 * 1024,
}
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIMS = {"x": 1024, "y": 1024, "z": 64}
MAX_GRID_DIMS = {"x": 2**31 - 1, "y": 65535, "z": 65535}
REGISTERS_PER_BLOCK = 65536
MAX_REGISTERS_PER_THREAD = 255
MAX_LOCAL_BYTES_PER_THREAD = 16 * 1024
"""Per-thread scratch beyond this is rejected: it would live in slow local memory and hint at a bad schedule."""
SHARED_ALIGN = 16
_AXES = ("x", "y", "z")
_DYNAMIC_SHARED_SYMBOL = "relay_tune_dynamic_shared"


class PtxasNotFoundError(RelayTuneError):
    """`ptxas` (from the CUDA toolkit) is not installed, so PTX cannot be assembled or checked here."""


class PtxasError(CompileError):
    """`ptxas` rejected generated PTX."""


def arch_of(target: Target | None) -> str:
    """The GPU architecture of a CUDA target ("sm_90" when the target names none)."""
    if target is None:
        return DEFAULT_ARCH
    if target.kind != "cuda":
        raise UnsupportedError(f"NVPTX code generation needs a cuda target, not {target}")
    arch = target.arch or DEFAULT_ARCH
    if arch not in KNOWN_ARCHS:
        raise UnsupportedError(f"unknown CUDA architecture {arch!r}; known: {', '.join(KNOWN_ARCHS)}")
    return arch


def max_shared_bytes(arch: str) -> int:
    """Shared memory one thread block may use on `arch` (with the dynamic shared memory opt-in)."""
    return _MAX_SHARED_PER_BLOCK.get(arch.rstrip("a"), STATIC_SHARED_LIMIT)


def gpu_codegen_options(fast_math: bool = False) -> CodegenOptions:
    """Lowering options for GPUs: vector chunks of 4 lanes (the widest `ld.global.v4` of 32-bit values)."""
    return CodegenOptions(fast_math=fast_math, max_unroll=256, max_vector_lanes=8, chunk_lanes=4)


# ---------------------------------------------------------------------------------------------------
# launch plans (plain data: they travel to measurement processes with the PTX)
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchConfig:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int = 0

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


@dataclass(frozen=True)
class WorkspaceSpec:
    """A device scratch buffer of one PrimFunc (an intermediate computed at the root)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return max(1, math.prod(self.shape)) * dtype_info(self.dtype).itemsize


@dataclass(frozen=True)
class GPUKernel:
    """One launch: kernel `name` with `args` indexing the PrimFunc's buffers (params, then workspaces)."""

    name: str
    launch: LaunchConfig
    args: tuple[int, ...]
    static_shared_bytes: int
    local_bytes: int


@dataclass(frozen=True)
class GPUFunction:
    """How to run one PrimFunc on a GPU: allocate `workspaces`, then launch `kernels` in order."""

    name: str
    param_names: tuple[str, ...]
    param_shapes: tuple[tuple[int, ...], ...]
    param_dtypes: tuple[str, ...]
    workspaces: tuple[WorkspaceSpec, ...]
    kernels: tuple[GPUKernel, ...]

    @property
    def num_params(self) -> int:
        return len(self.param_names)


@dataclass(frozen=True)
class PTXModule:
    """Compiled PTX and the launch plans of the PrimFuncs it implements."""

    ptx: str
    arch: str
    functions: tuple[GPUFunction, ...]
    kernels: tuple[tir.PrimFunc, ...] = field(default=(), compare=False, repr=False)
    """The kernels' loop nests (what the emulated device runs); empty once shipped as PTX alone."""

    def function(self, name: str) -> GPUFunction:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(f"no function {name!r} in this module (have {', '.join(f.name for f in self.functions)})")

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(k.name for f in self.functions for k in f.kernels)


# ---------------------------------------------------------------------------------------------------
# splitting a PrimFunc into kernels
# ---------------------------------------------------------------------------------------------------


def _children(stmt: tir.Stmt) -> tuple[tir.Stmt, ...]:
    if isinstance(stmt, tir.Seq):
        return stmt.stmts
    if isinstance(stmt, (tir.For, tir.Allocate)):
        return (stmt.body,)
    if isinstance(stmt, tir.IfThenElse):
        return (stmt.then_body,) if stmt.else_body is None else (stmt.then_body, stmt.else_body)
    return ()


def _walk(stmt: tir.Stmt) -> Iterator[tir.Stmt]:
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        stack.extend(reversed(_children(s)))


def _exprs_of(stmt: tir.Stmt) -> Iterator[tir.PrimExpr]:
    if isinstance(stmt, tir.Store):
        yield from stmt.indices
        yield stmt.value
    elif isinstance(stmt, tir.IfThenElse):
        yield stmt.cond


def _buffers_used(stmt: tir.Stmt) -> list[tir.Buffer]:
    """Buffers loaded or stored in `stmt`, in order of first appearance."""
    seen: dict[tir.Buffer, None] = {}
    for s in _walk(stmt):
        if isinstance(s, tir.Store):
            seen.setdefault(s.buffer)
        for root in _exprs_of(s):
            stack = [root]
            while stack:
                e = stack.pop()
                if isinstance(e, tir.Load):
                    seen.setdefault(e.buffer)
                stack.extend(affine.operands(e))
    return list(seen)


_NAME_OK = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")


def _ptx_name(name: str) -> str:
    """A valid PTX identifier for a kernel name (PTX allows letters, digits, `_` and `$`)."""
    if _NAME_OK.match(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9_$]", "_", name)
    return cleaned if _NAME_OK.match(cleaned) else f"_{cleaned}"


def _shared_allocations(stmt: tir.Stmt) -> list[tir.Buffer]:
    return [s.buffer for s in _walk(stmt) if isinstance(s, tir.Allocate) and s.buffer.scope is tir.Scope.SHARED]


def _aligned_bytes(buf: tir.Buffer) -> int:
    nbytes = max(1, buf.size) * dtype_info(buf.dtype).itemsize
    return -(-nbytes // SHARED_ALIGN) * SHARED_ALIGN


def shared_bytes(stmt: tir.Stmt) -> int:
    """Shared memory a kernel body allocates (every SHARED allocation gets its own 16-byte aligned slot)."""
    return sum(_aligned_bytes(b) for b in _shared_allocations(stmt))


def _local_bytes(stmt: tir.Stmt) -> int:
    return sum(max(1, s.buffer.size) * dtype_info(s.buffer.dtype).itemsize for s in _walk(stmt)
               if isinstance(s, tir.Allocate) and s.buffer.scope is tir.Scope.LOCAL)


def launch_extents(body: tir.Stmt, name: str = "kernel") -> dict[str, int]:
    """Launch extent of each thread tag used in a kernel body (the longest loop bound to it).

    A loop bound to a tag that an enclosing loop already binds reuses the enclosing index, so it may not be
    longer than the enclosing loop (its extra iterations would have no thread to run them).
    """
    extents: dict[str, int] = {}
    stack: list[tuple[tir.Stmt, dict[str, int]]] = [(body, {})]
    while stack:
        s, bound = stack.pop()
        if isinstance(s, tir.For) and s.kind is tir.ForKind.THREAD_BINDING:
            tag = s.thread_tag
            assert tag is not None
            if tag in bound:
                if s.extent > bound[tag]:
                    raise CompileError(
                        f"kernel {name}: loop {s.var.name} bound to {tag} has extent {s.extent}, more than the "
                        f"enclosing loop bound to {tag} ({bound[tag]}); split it so that it fits the thread block"
                    )
            else:
                extents[tag] = max(extents.get(tag, 0), s.extent)
            stack.append((s.body, {**bound, tag: s.extent}))
            continue
        stack.extend((c, bound) for c in _children(s))
    return extents


def _launch_config(extents: dict[str, int], dynamic_shared: int, name: str) -> LaunchConfig:
    grid = tuple(extents.get(f"blockIdx.{a}", 1) for a in _AXES)
    block = tuple(extents.get(f"threadIdx.{a}", 1) for a in _AXES)
    for axis, g, b in zip(_AXES, grid, block):
        if g > MAX_GRID_DIMS[axis]:
            raise CompileError(f"kernel {name}: grid dimension {axis} = {g} exceeds the limit {MAX_GRID_DIMS[axis]}")
        if b > MAX_BLOCK_DIMS[axis]:
            raise CompileError(f"kernel {name}: block dimension {axis} = {b} exceeds the limit {MAX_BLOCK_DIMS[axis]}")
    threads = math.prod(block)
    if threads > MAX_THREADS_PER_BLOCK:
        raise CompileError(
            f"kernel {name}: {threads} threads per block ({' x '.join(map(str, block))}) exceed the limit of "
            f"{MAX_THREADS_PER_BLOCK}"
        )
    return LaunchConfig(grid, block, dynamic_shared)  # type: ignore[arg-type]


def plan_kernels(func: tir.PrimFunc, arch: str = DEFAULT_ARCH) -> tuple[list[tir.PrimFunc], GPUFunction]:
    """Split a PrimFunc into kernels (see the module docstring); returns the kernels and their launch plan."""
    body = func.body
    workspaces: list[tir.Buffer] = []
    while isinstance(body, tir.Allocate) and body.buffer.scope is tir.Scope.GLOBAL:
        workspaces.append(body.buffer)
        body = body.body
    parts: list[tir.Stmt] = []
    pending: list[tir.Stmt] = [body]
    while pending:  # flatten nested top-level sequences and hoist global allocations found between them
        s = pending.pop(0)
        if isinstance(s, tir.Seq):
            pending[:0] = list(s.stmts)
        elif isinstance(s, tir.Allocate) and s.buffer.scope is tir.Scope.GLOBAL:
            workspaces.append(s.buffer)
            pending.insert(0, s.body)
        else:
            parts.append(s)
    for s in _walk(body):
        if isinstance(s, tir.Allocate) and s.buffer.scope is tir.Scope.GLOBAL and s.buffer not in workspaces:
            raise CompileError(
                f"kernel {func.name}: buffer {s.buffer.name} is a global scratch buffer allocated inside a loop; "
                "GPU kernels cannot allocate device memory (compute that stage at the root or in local/shared scope)"
            )
    all_buffers = list(func.params) + workspaces
    index_of = {b: i for i, b in enumerate(all_buffers)}
    base = _ptx_name(func.name)
    kernels: list[tir.PrimFunc] = []
    plans: list[GPUKernel] = []
    limit = max_shared_bytes(arch)
    for i, part in enumerate(parts):
        kname = base if len(parts) == 1 else f"{base}_k{i}"
        used = _buffers_used(part)
        for b in used:
            if b.scope is tir.Scope.GLOBAL and b not in index_of:
                raise CompileError(f"kernel {func.name}: buffer {b.name} is neither a parameter nor allocated")
        args = tuple(sorted(index_of[b] for b in used if b in index_of))
        extents = launch_extents(part, kname)
        smem = shared_bytes(part)
        if smem > limit:
            raise CompileError(
                f"kernel {kname}: needs {smem} bytes of shared memory, more than the {limit} bytes a thread block "
                f"can use on {arch}"
            )
        local = _local_bytes(part)
        if local > MAX_LOCAL_BYTES_PER_THREAD:
            raise CompileError(
                f"kernel {kname}: needs {local} bytes of per-thread scratch, more than {MAX_LOCAL_BYTES_PER_THREAD}"
            )
        dynamic = smem if smem > STATIC_SHARED_LIMIT else 0
        launch = _launch_config(extents, dynamic, kname)
        kernels.append(tir.PrimFunc(kname, tuple(all_buffers[j] for j in args), part,
                                    (*func.attrs, ("dynamic_shared", dynamic > 0))))
        plans.append(GPUKernel(kname, launch, args, smem - dynamic, local))
    plan = GPUFunction(
        func.name,
        tuple(p.name for p in func.params),
        tuple(p.shape for p in func.params),
        tuple(p.dtype for p in func.params),
        tuple(WorkspaceSpec(w.name, w.shape, w.dtype) for w in workspaces),
        tuple(plans),
    )
    return kernels, plan


# ---------------------------------------------------------------------------------------------------
# the code generator
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Binding:
    value: ir.Value
    extent: int


@dataclass
class _KernelState:
    launch: dict[str, int]
    bound: dict[str, _Binding] = field(default_factory=dict)
    thread_vars: set[tir.LoopVar] = field(default_factory=set)
    divergent: int = 0
    dynamic_shared: bool = False
    shared_offset: int = 0


class NVPTXCodegen(LLVMCodegenBase):
    """The NVIDIA GPU back end: `ptx_kernel` functions over global pointers, thread indices, shared memory."""

    max_strided_load = 0  # a GPU thread's lanes are few; a strided gather is what its loads are anyway
    max_window_load = 0  # likewise: a short pattern of lanes is read element by element

    def __init__(self, module: ir.Module, arch: str = DEFAULT_ARCH, options: CodegenOptions | None = None) -> None:
        super().__init__(module, options or gpu_codegen_options())
        self.arch = arch
        self._state: _KernelState | None = None
        self._kernel_names: set[str] = set()

    @property
    def state(self) -> _KernelState:
        assert self._state is not None, "no kernel is being lowered"
        return self._state

    # -- kernels ------------------------------------------------------------------------------------

    def declare_kernel(self, func: tir.PrimFunc) -> ir.Function:
        if func.name in self._kernel_names or func.name in self.module.globals:
            raise CompileError(f"two kernels are named {func.name!r}; kernel names must be unique per module")
        self._kernel_names.add(func.name)
        params = [memory_type(p.dtype).as_pointer(1) for p in func.params]
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), params), name=func.name)
        fn.calling_convention = "ptx_kernel"
        fn.attributes.add("nounwind")
        for arg, buf in zip(fn.args, func.params):
            arg.name = buf.name
            arg.add_attribute("noalias")
        return fn

    def lower(self, func: tir.PrimFunc) -> ir.Function:
        """Lower one kernel (a part made by `plan_kernels`)."""
        attrs = dict(func.attrs)
        fast = bool(attrs.get("fast_math", self.options.fast_math))
        self._float_flags = ("fast",) if fast else ("contract",)
        self._func_name = func.name
        fn = self.declare_kernel(func)
        ctx = self.new_context(fn)
        self._state = _KernelState(launch_extents(func.body, func.name), dynamic_shared=bool(attrs.get(
            "dynamic_shared", False)))
        self._ctx = ctx
        try:
            b = ctx.builder
            for arg, buf in zip(fn.args, func.params):
                self._check_buffer(buf)
                ctx.buffers[buf] = b.addrspacecast(arg, memory_type(buf.dtype).as_pointer(), name=buf.name)
            self.emit_stmt(func.body)
            ctx.builder.ret_void()
        finally:
            self._ctx = None
            self._state = None
        return fn

    # -- thread indices -----------------------------------------------------------------------------

    def _read_index(self, tag: str) -> ir.Value:
        kind, axis = tag.split(".")
        register = "tid" if kind == "threadIdx" else "ctaid"
        fn = self.declare(f"llvm.nvvm.read.ptx.sreg.{register}.{axis}", I32, [])
        value = self.builder.call(fn, [], name=tag.replace(".", "_"))
        return self.builder.zext(value, I64)

    def emit_thread_binding(self, loop: tir.For) -> None:
        state = self.state
        ctx = self.ctx
        if ctx.vector is not None:
            raise CompileError(f"loop {loop.var.name} is bound to {loop.thread_tag} inside a vectorized loop")
        tag = loop.thread_tag
        assert tag is not None
        outer = state.bound.get(tag)
        if outer is not None:
            value, available = outer.value, outer.extent
            if loop.extent > available:  # launch_extents already refuses this; kept as a guard for callers
                raise CompileError(f"loop {loop.var.name} bound to {tag} is longer than the enclosing binding")
        else:
            value, available = self._read_index(tag), state.launch[tag]
        guarded = loop.extent < available
        divergent = guarded and tag.startswith("threadIdx")
        state.bound[tag] = _Binding(value, loop.extent)
        if tag.startswith("threadIdx"):
            state.thread_vars.add(loop.var)
        self.bind(loop.var, value, loop.extent)
        try:
            if guarded:
                cond = self.builder.icmp_unsigned("<", value, ir.Constant(I64, loop.extent))
                state.divergent += divergent
                with self.builder.if_then(cond):
                    self.emit_stmt(loop.body)
                state.divergent -= divergent
            else:
                self.emit_stmt(loop.body)
        finally:
            self.unbind(loop.var)
            state.thread_vars.discard(loop.var)
            if outer is None:
                del state.bound[tag]
            else:
                state.bound[tag] = outer

    def emit_if(self, stmt: tir.IfThenElse) -> None:
        state = self.state
        divergent = any(affine.contains_var(stmt.cond, v) for v in state.thread_vars)
        state.divergent += divergent
        try:
            super().emit_if(stmt)
        finally:
            state.divergent -= divergent

    def emit_barrier(self) -> None:
        if self.state.divergent:
            raise CompileError(
                f"kernel {self._func_name}: a barrier sits inside a condition that depends on the thread index; "
                "threads that skip it would deadlock the block"
            )
        if self.ctx.vector is not None:
            raise CompileError(f"kernel {self._func_name}: a barrier inside a vectorized loop")
        self.builder.call(self.declare("llvm.nvvm.barrier0", ir.VoidType(), []), [])

    def emit_parallel_loop(self, loop: tir.For) -> None:
        raise CompileError(
            f"loop {loop.var.name} is a CPU parallel loop; GPU schedules bind loops to blockIdx/threadIdx instead"
        )

    # -- memory ---------------------------------------------------------------------------------------

    def allocate(self, buffer: tir.Buffer) -> tuple[ir.Value, Callable[[], None] | None]:
        if buffer.scope is tir.Scope.SHARED:
            return self._shared(buffer), None
        if buffer.scope is tir.Scope.LOCAL:
            return self.stack_allocate(buffer), None
        raise CompileError(f"kernel {self._func_name}: cannot allocate global buffer {buffer.name} inside a kernel")

    def _shared(self, buffer: tir.Buffer) -> ir.Value:
        state = self.state
        elem = memory_type(buffer.dtype)
        b = self.entry_builder()
        generic = elem.as_pointer()
        if state.dynamic_shared:
            symbol = self.module.globals.get(_DYNAMIC_SHARED_SYMBOL)
            if symbol is None:
                symbol = ir.GlobalVariable(self.module, ir.ArrayType(ir.IntType(8), 0), _DYNAMIC_SHARED_SYMBOL,
                                           addrspace=3)
                symbol.linkage = "external"
                symbol.align = SHARED_ALIGN
            raw = b.gep(symbol, [ir.Constant(I64, 0), ir.Constant(I64, state.shared_offset)])
            state.shared_offset += _aligned_bytes(buffer)
            return b.addrspacecast(b.bitcast(raw, elem.as_pointer(3)), generic, name=buffer.name)
        name = _ptx_name(f"{self._func_name}__{buffer.name}")
        suffix = 0
        while f"{name}{suffix or ''}" in self.module.globals:
            suffix += 1
        array = ir.ArrayType(elem, max(1, buffer.size))
        var = ir.GlobalVariable(self.module, array, f"{name}{suffix or ''}", addrspace=3)
        var.linkage = "internal"
        var.align = SHARED_ALIGN
        var.initializer = ir.Constant(array, ir.Undefined)
        return b.addrspacecast(b.bitcast(var, elem.as_pointer(3)), generic, name=buffer.name)

    def contiguous_alignment(self, indices: tuple[tir.PrimExpr, ...], buf: tir.Buffer, vec: VectorLanes) -> int:
        """The largest power of two (up to 16 bytes) that provably divides the address of lane 0.

        Every buffer starts at least 16-byte aligned (device allocations are 256-byte aligned, shared and
        local arrays are declared 16-byte aligned), so it suffices that the element offset is a multiple
        of the vector width: every coefficient of the offset and its constant must be, and the chunk base
        of the vectorized loop.
        """
        itemsize = dtype_info(buf.dtype).itemsize
        form = affine.flat_form(indices, buf.shape, self.ctx.extents)
        g = form.const
        for atom, coef in form.terms.values():
            if atom is not vec.var:
                g = math.gcd(g, coef)
        chunk_base = vec.base.constant if isinstance(vec.base, ir.Constant) else self.options.chunk_lanes
        g = math.gcd(g, int(chunk_base))
        elements = 1
        while elements * 2 <= vec.lanes and (g == 0 or g % (elements * 2) == 0) and elements * 2 * itemsize <= 16:
            elements *= 2
        return elements * itemsize

    # -- math -----------------------------------------------------------------------------------------

    def math_call(self, name: str, dtype: str, args: list[ir.Value]) -> ir.Value | None:
        info = dtype_info(dtype)
        if not info.is_float:
            return None
        if name in LIBM_FUNCTIONS:  # NVPTX has no C library to call
            raise CompileError(f"{name} is not available on NVPTX targets (the CPU target computes it)")
        if name == "pow":
            wide = [self._to_f64(a, dtype) for a in args]
            return self._from_f64(Float64Math(self.builder, self.intrinsic).pow(*wide), dtype)
        if info.bits == 64 and name in ("exp", "log", "tanh", "erf", "sigmoid"):
            return getattr(Float64Math(self.builder, self.intrinsic), name)(args[0])
        return None

    def _to_f64(self, value: ir.Value, dtype: str) -> ir.Value:
        return value if dtype == "float64" else self.cast(value, dtype, "float64")

    def _from_f64(self, value: ir.Value, dtype: str) -> ir.Value:
        return value if dtype == "float64" else self.cast(value, "float64", dtype)


# ---------------------------------------------------------------------------------------------------
# float64 math (NVPTX has no libm; llvm.exp.f64 and friends would become unresolved calls)
# ---------------------------------------------------------------------------------------------------

F64 = ir.DoubleType()
_LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of ln 2: n * _LN2_HI is exact for |n| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_LOG2E = 1.4426950408889634
_EXP_MAX = 709.782712893384
_EXP_MIN = -745.2
_TWO_OVER_SQRT_PI = 1.1283791670955126
_INV_SQRT_PI = 0.5641895835477563
_ERF_TAYLOR = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(32, -1, -1))
_ERFC_CF_TERMS = 48
_TANH_TAYLOR = (21844 / 6081075, -1382 / 155925, 62 / 2835, -17 / 315, 2 / 15, -1 / 3, 1.0)


class Float64Math:
    """float64 exp/log/tanh/erf/sigmoid/pow from arithmetic alone, scalar or vector, accurate to a few ulp.

    exp: Taylor polynomial on |r| <= ln2/2 after range reduction; log: the atanh series of (m-1)/(m+1) on
    m in [sqrt(1/2), sqrt(2)); erf: its Taylor series below 2 and the continued fraction of erfc above.
    """

    def __init__(self, builder: ir.IRBuilder, intrinsic: Callable[..., ir.Function]) -> None:
        self.b = builder
        self.intrinsic = intrinsic

    def const(self, value: float, like: ir.Value) -> ir.Constant:
        t = like.type
        return ir.Constant(t, [value] * t.count) if isinstance(t, ir.VectorType) else ir.Constant(t, value)

    def iconst(self, value: int, like: ir.Type) -> ir.Constant:
        return ir.Constant(like, [value] * like.count) if isinstance(like, ir.VectorType) else ir.Constant(like, value)

    def itype(self, like: ir.Value) -> ir.Type:
        return ir.VectorType(I64, like.type.count) if isinstance(like.type, ir.VectorType) else I64

    def fadd(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fadd(a, b, flags=("contract",))

    def fmul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fmul(a, b, flags=("contract",))

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        return self.b.call(self.intrinsic("llvm.fma", a.type, 3), [a, b, c])

    def horner(self, x: ir.Value, coefficients: Sequence[float]) -> ir.Value:
        acc: ir.Value = self.const(coefficients[0], x)
        for c in coefficients[1:]:
            acc = self.fma(acc, x, self.const(c, x))
        return acc

    def select_lt(self, x: ir.Value, bound: float, then: ir.Value, other: ir.Value) -> ir.Value:
        return self.b.select(self.b.fcmp_ordered("<", x, self.const(bound, x)), then, other)

    def pow2i(self, n: ir.Value) -> ir.Value:
        """2**n for int64 n in [-1022, 1023], from the exponent bits."""
        biased = self.b.add(n, self.iconst(1023, n.type))
        bits = self.b.shl(biased, self.iconst(52, n.type))
        ftype = ir.VectorType(F64, n.type.count) if isinstance(n.type, ir.VectorType) else F64
        return self.b.bitcast(bits, ftype)

    def fabs(self, x: ir.Value) -> ir.Value:
        return self.b.call(self.intrinsic("llvm.fabs", x.type), [x])

    def exp(self, x: ir.Value) -> ir.Value:
        b = self.b
        xc = self.select_lt(x, _EXP_MIN, self.const(_EXP_MIN, x), x)
        xc = b.select(b.fcmp_ordered(">", xc, self.const(_EXP_MAX, x)), self.const(_EXP_MAX, x), xc)
        n = b.call(self.intrinsic("llvm.roundeven", x.type), [self.fmul(xc, self.const(_LOG2E, x))])
        r = self.fma(n, self.const(-_LN2_HI, x), xc)
        r = self.fma(n, self.const(-_LN2_LO, x), r)
        poly = self.horner(r, [1.0 / math.factorial(k) for k in range(13, -1, -1)])
        ni = b.fptosi(n, self.itype(x))
        half = b.ashr(ni, self.iconst(1, ni.type))
        y = self.fmul(self.fmul(poly, self.pow2i(half)), self.pow2i(b.sub(ni, half)))
        y = b.select(b.fcmp_ordered(">", x, self.const(_EXP_MAX, x)), self.const(math.inf, x), y)
        y = self.select_lt(x, _EXP_MIN, self.const(0.0, x), y)
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def log(self, x: ir.Value) -> ir.Value:
        b = self.b
        it = self.itype(x)
        subnormal = b.fcmp_ordered("<", x, self.const(2.2250738585072014e-308, x))
        xs = b.select(subnormal, self.fmul(x, self.const(2.0**54, x)), x)
        bits = b.bitcast(xs, it)
        exponent = b.sub(b.and_(b.lshr(bits, self.iconst(52, it)), self.iconst(0x7FF, it)), self.iconst(1022, it))
        exponent = b.sub(exponent, b.select(subnormal, self.iconst(54, it), self.iconst(0, it)))
        mantissa = b.or_(b.and_(bits, self.iconst(0x800FFFFFFFFFFFFF, it)), self.iconst(0x3FE0000000000000, it))
        m = b.bitcast(mantissa, x.type)  # in [0.5, 1)
        small = self.select_lt(m, 0.7071067811865476, self.iconst(1, it), self.iconst(0, it))
        exponent = b.sub(exponent, small)
        m = b.select(b.icmp_signed("!=", small, self.iconst(0, it)), self.fadd(m, m), m)
        f = b.fsub(m, self.const(1.0, x))
        s = b.fdiv(f, self.fadd(f, self.const(2.0, x)))
        z = self.fmul(s, s)
        series = self.horner(z, [1.0 / (2 * k + 1) for k in range(10, -1, -1)])
        e = b.sitofp(exponent, x.type)
        # log(m) = 2 s series(z); small terms first so that e * ln2 (large) is added last
        result = self.fma(e, self.const(_LN2_HI, x), self.fma(e, self.const(_LN2_LO, x), self.fmul(
            self.fadd(s, s), series)))
        result = b.select(b.fcmp_ordered("==", x, self.const(math.inf, x)), x, result)
        result = b.select(b.fcmp_ordered("==", x, self.const(0.0, x)), self.const(-math.inf, x), result)
        return b.select(b.fcmp_unordered("<", x, self.const(0.0, x)), self.const(math.nan, x), result)

    def _copysign(self, magnitude: ir.Value, sign_of: ir.Value) -> ir.Value:
        return self.b.call(self.intrinsic("llvm.copysign", magnitude.type, 2), [magnitude, sign_of])

    def tanh(self, x: ir.Value) -> ir.Value:
        b = self.b
        ax = self.fabs(x)
        x2 = self.fmul(x, x)
        small = self.fmul(x, self.horner(x2, _TANH_TAYLOR))
        e = self.exp(self.fadd(ax, ax))
        large = b.fsub(self.const(1.0, x), b.fdiv(self.const(2.0, x), self.fadd(e, self.const(1.0, x))))
        large = self._copysign(large, x)
        return self.select_lt(ax, 0.1, small, large)  # NaN: the comparison is false, and large is NaN

    def erf(self, x: ir.Value) -> ir.Value:
        b = self.b
        ax = self.fabs(x)
        taylor = self.fmul(self.fmul(x, self.const(_TWO_OVER_SQRT_PI, x)), self.horner(self.fmul(x, x), _ERF_TAYLOR))
        # erfc(a) = exp(-a^2) / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...)))), evaluated backwards
        a = b.select(b.fcmp_ordered("<", ax, self.const(2.0, x)), self.const(2.0, x), ax)
        t = a
        for k in range(_ERFC_CF_TERMS, 0, -1):
            t = self.fadd(a, b.fdiv(self.const(k / 2, x), t))
        erfc = b.fdiv(self.fmul(self.exp(b.fneg(self.fmul(a, a))), self.const(_INV_SQRT_PI, x)), t)
        tail = self._copysign(b.fsub(self.const(1.0, x), erfc), x)
        return self.select_lt(ax, 2.0, taylor, b.select(b.fcmp_unordered("uno", x, x), x, tail))

    def sigmoid(self, x: ir.Value) -> ir.Value:
        one = self.const(1.0, x)
        return self.b.fdiv(one, self.fadd(one, self.exp(self.b.fneg(x))))

    def pow(self, x: ir.Value, y: ir.Value) -> ir.Value:
        """x**y with C's special cases: negative x needs an integer y (odd y keeps the sign), 0**negative = inf."""
        b = self.b
        magnitude = self.exp(self.fmul(y, self.log(self.fabs(x))))
        y_int = b.fcmp_ordered("==", b.call(self.intrinsic("llvm.floor", y.type), [y]), y)
        half = self.fmul(y, self.const(0.5, y))
        y_odd = b.and_(y_int, b.fcmp_ordered("!=", b.call(self.intrinsic("llvm.floor", y.type), [half]), half))
        negative = b.fcmp_ordered("<", x, self.const(0.0, x))
        signed = b.select(b.and_(negative, y_odd), b.fneg(magnitude), magnitude)
        result = b.select(b.and_(negative, b.xor(y_int, self._true(y_int))), self.const(math.nan, x), signed)
        result = b.select(b.fcmp_ordered("==", y, self.const(0.0, y)), self.const(1.0, x), result)  # x**0 == 1
        return b.select(b.fcmp_ordered("==", x, self.const(1.0, x)), self.const(1.0, x), result)  # 1**y == 1

    def _true(self, like: ir.Value) -> ir.Constant:
        t = like.type
        return ir.Constant(t, [1] * t.count) if isinstance(t, ir.VectorType) else ir.Constant(I1, 1)


# ---------------------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------------------

_init_lock = threading.Lock()
_initialized = False
_machines = threading.local()


def _ensure_initialized() -> None:
    global _initialized
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


def _target_machine(arch: str) -> llvm.TargetMachine:
    """One NVPTX target machine per (thread, arch). No PTX version is forced: LLVM picks the lowest one
    the architecture needs (forcing one that is too old aborts the process)."""
    _ensure_initialized()
    cache = getattr(_machines, "by_arch", None)
    if cache is None:
        cache = _machines.by_arch = {}
    machine = cache.get(arch)
    if machine is None:
        machine = llvm.Target.from_triple(NVPTX_TRIPLE).create_target_machine(cpu=arch, features="", opt=3)
        cache[arch] = machine
    return machine


def _resolve_arch(target: Target | str | None) -> str:
    if isinstance(target, str) and target.startswith("sm_"):
        if target not in KNOWN_ARCHS:
            raise UnsupportedError(f"unknown CUDA architecture {target!r}; known: {', '.join(KNOWN_ARCHS)}")
        return target
    if isinstance(target, str):
        target = Target.parse(target)
    return arch_of(target)


def lower_module(
    funcs: Sequence[tir.PrimFunc], target: Target | str | None = None, options: CodegenOptions | None = None
) -> tuple[ir.Module, tuple[GPUFunction, ...]]:
    """The unoptimized LLVM module of every kernel of `funcs`, and the launch plan of each PrimFunc."""
    module, plans, _ = _lower(funcs, target, options)
    return module, plans


def _lower(
    funcs: Sequence[tir.PrimFunc], target: Target | str | None, options: CodegenOptions | None
) -> tuple[ir.Module, tuple[GPUFunction, ...], tuple[tir.PrimFunc, ...]]:
    if not funcs:
        raise CompileError("nothing to compile: no kernels given")
    arch = _resolve_arch(target)
    machine = _target_machine(arch)
    module = ir.Module(name="relay_tune_gpu_kernels")
    module.triple = NVPTX_TRIPLE
    module.data_layout = str(machine.target_data)
    codegen = NVPTXCodegen(module, arch, options)
    plans: list[GPUFunction] = []
    all_kernels: list[tir.PrimFunc] = []
    names: set[str] = set()
    for func in funcs:
        if func.name in names:
            raise CompileError(f"two functions are named {func.name!r}; names must be unique per build")
        names.add(func.name)
        kernels, plan = plan_kernels(func, arch)
        for kernel in kernels:
            codegen.lower(kernel)
        plans.append(plan)
        all_kernels.extend(kernels)
    return module, tuple(plans), tuple(all_kernels)


def _optimized(module: ir.Module, arch: str, timings: MutableMapping[str, float] | None) -> llvm.ModuleRef:

    t0 = time.perf_counter()
    try:
        parsed = llvm.parse_assembly(str(module))
        parsed.verify()
    except RuntimeError as err:
        raise CompileError(f"LLVM rejected the generated GPU code: {err}") from err
    t1 = time.perf_counter()
    machine = _target_machine(arch)
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = False  # the schedule decides vector widths; SLP still merges adjacent accesses
    tuning.slp_vectorization = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(parsed, passes)
    if timings is not None:
        timings["parse_s"] = t1 - t0
        timings["optimize_s"] = time.perf_counter() - t1
    return parsed


def emit_llvm_ir(funcs: Sequence[tir.PrimFunc], target: Target | str | None = None, optimize: bool = False,
                 options: CodegenOptions | None = None) -> str:
    """LLVM IR text of the kernels for the NVPTX target, before or after the O3 pipeline."""
    module, _ = lower_module(funcs, target, options)
    if not optimize:
        return str(module)
    return str(_optimized(module, _resolve_arch(target), None))


def build_ptx(
    funcs: Sequence[tir.PrimFunc],
    target: Target | str | None = None,
    options: CodegenOptions | None = None,
    timings: MutableMapping[str, float] | None = None,
) -> PTXModule:
    """Compile PrimFuncs to one PTX module (O3) with the launch plan of each.

    `timings`, when given, receives lower_s, parse_s, optimize_s and emit_s.
    """
    arch = _resolve_arch(target)
    t0 = time.perf_counter()
    module, plans, kernels = _lower(funcs, arch, options)
    if timings is not None:
        timings["lower_s"] = time.perf_counter() - t0
    parsed = _optimized(module, arch, timings)
    t1 = time.perf_counter()
    ptx = _target_machine(arch).emit_assembly(parsed)
    if timings is not None:
        timings["emit_s"] = time.perf_counter() - t1
    return PTXModule(ptx, arch, plans, kernels)


def emit_ptx(funcs: Sequence[tir.PrimFunc], target: Target | str | None = None,
             options: CodegenOptions | None = None) -> str:
    """PTX text of the kernels."""
    return build_ptx(funcs, target, options).ptx


# ---------------------------------------------------------------------------------------------------
# ptxas
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one kernel."""

    name: str
    registers: int
    shared_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    barriers: int = 0

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


@dataclass(frozen=True)
class PtxasReport:
    arch: str
    kernels: dict[str, KernelResources]
    log: str
    cubin: bytes = b""

    def __getitem__(self, name: str) -> KernelResources:
        return self.kernels[name]


def find_ptxas() -> str | None:
    """Path of `ptxas`: $RELAY_TUNE_PTXAS, then PATH, then the usual CUDA install places; None if absent."""
    candidates = [os.environ.get("RELAY_TUNE_PTXAS", ""), shutil.which("ptxas") or ""]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.append(os.path.join(cuda_home, "bin", "ptxas"))
    candidates += ["/usr/local/cuda/bin/ptxas", "/usr/local/bin/ptxas"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def _parse_ptxas_log(log: str) -> dict[str, KernelResources]:
    """Per-kernel figures from `ptxas -v` output (the lines of one kernel follow its "Compiling entry" line)."""
    found: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group(1)
            found.setdefault(current, {})
            continue
        m = _PROPS.search(line)
        if m:
            current = m.group(1)
            found.setdefault(current, {})
            continue
        if current is None:
            continue
        fields = found[current]
        m = _FRAME.search(line)
        if m:
            fields["stack"], fields["spill_store"], fields["spill_load"] = (int(g) for g in m.groups())
        m = _USED.search(line)
        if m:
            fields["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            fields["smem"] = int(s.group(1)) if s else 0
            bars = _BARRIERS.search(line)
            fields["barriers"] = int(bars.group(1)) if bars else 0
    return {
        name: KernelResources(name, f.get("registers", 0), f.get("smem", 0), f.get("spill_store", 0),
                              f.get("spill_load", 0), f.get("stack", 0), f.get("barriers", 0))
        for name, f in found.items() if "registers" in f
    }


def assemble_ptx(ptx: str, arch: str = DEFAULT_ARCH, ptxas: str | None = None, timeout: float = 300.0,
                 keep_cubin: bool = False) -> PtxasReport:
    """Assemble PTX with `ptxas -arch=<arch> -v`: raises `PtxasError` if ptxas rejects it, and
    `PtxasNotFoundError` if ptxas is not installed. Returns registers, shared memory and spills per kernel
    (and the cubin when `keep_cubin`)."""
    tool = ptxas or find_ptxas()
    if tool is None:
        raise PtxasNotFoundError("ptxas (CUDA toolkit) is not installed: set RELAY_TUNE_PTXAS or add it to PATH")
    with tempfile.TemporaryDirectory(prefix="relay_tune_ptx_") as tmp:
        src = os.path.join(tmp, "kernels.ptx")
        out = os.path.join(tmp, "kernels.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        try:
            proc = subprocess.run([tool, f"-arch={arch}", "-v", src, "-o", out], capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise PtxasError(f"ptxas did not finish within {timeout:g} s") from err
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise PtxasError(f"ptxas -arch={arch} rejected the PTX:\n{log.strip()[-4000:]}")
        cubin = b""
        if keep_cubin:
            with open(out, "rb") as f:
                cubin = f.read()
    return PtxasReport(arch, _parse_ptxas_log(log), log, cubin)


def check_launch_resources(kernel: GPUKernel, resources: KernelResources, arch: str = DEFAULT_ARCH) -> None:
    """Raise CompileError when a kernel cannot launch with its block size: too many registers for the
    block, or more shared memory than the architecture allows."""
    threads = kernel.launch.threads_per_block
    if resources.registers * threads > REGISTERS_PER_BLOCK:
        raise CompileError(
            f"kernel {kernel.name}: {resources.registers} registers x {threads} threads exceed the "
            f"{REGISTERS_PER_BLOCK} registers of a thread block"
        )
    total_shared = resources.shared_bytes + kernel.launch.dynamic_shared_bytes
    if total_shared > max_shared_bytes(arch):
        raise CompileError(f"kernel {kernel.name}: {total_shared} bytes of shared memory exceed {arch}'s limit")
