"""Small self-contained tasks for exercising the tuning machinery (and as examples of the task protocol).

`MatmulTask` is a real tunable workload: a float32 matmul kernel generated as LLVM IR with llvmlite, with a loop
order and two tile splits as knobs (non-divisor tiles leave tails that the kernel handles), compiled to relocatable
object code exactly like the compiler's own kernels. `FaultyTask` is an elementwise add whose `variant` knob picks
a correct kernel or a deliberately broken one: a kernel that segfaults, one that never returns, one that computes
a wrong value, one that leaves an element unwritten, a build that fails, a config the template rejects, a build
that hangs in native code and one that crashes the compiler process. Both are module-level, picklable classes.
`DoublingTask` is the task of a C kernel the tests compile with the system's C compiler (`compile_c_library`):
`2 * A` on a 4x8 float32 input, no knobs.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

from relay_tune.errors import CompileError
from relay_tune.tuning.task import BuildArtifact, KernelArg, TensorSpec
from search_space import ChoiceKnob, Config, Constraint, IntKnob, InvalidConfigError, Space, SplitKnob

HOST_TARGET = "llvm -keys=cpu"


# ---------------------------------------------------------------------------------------------------------------
# LLVM helpers
# ---------------------------------------------------------------------------------------------------------------


@functools.cache
def _initialise_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def compile_llvm_ir(ir_text: str, kernel_name: str, args: Sequence[KernelArg], opt_level: int = 3) -> BuildArtifact:
    """Optimise LLVM IR for the host CPU and emit relocatable object code as a `BuildArtifact`."""
    _initialise_llvm()
    module = llvm.parse_assembly(ir_text)
    module.verify()
    target = llvm.Target.from_default_triple()
    machine = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=opt_level,
        reloc="pic", codemodel="default",
    )
    module.triple = machine.triple
    module.data_layout = str(machine.target_data)
    tuning = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(module, passes)
    return BuildArtifact(machine.emit_object(module), "elf-object", kernel_name, tuple(args))


class _LoopEmitter:
    """Emits counted loops with llvmlite's IR builder (`for i in range(count)`)."""

    def __init__(self, builder: object) -> None:
        self.ir = ir
        self.b = builder
        self.i64 = ir.IntType(64)

    def const(self, value: int) -> object:
        return self.ir.Constant(self.i64, value)

    def loop(self, count: object, body: Callable[[object], None], name: str) -> None:
        b = self.b
        preheader = b.block
        header = b.append_basic_block(f"{name}.head")
        inner = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.done")
        b.branch(header)
        b.position_at_end(header)
        index = b.phi(self.i64, name=name)
        index.add_incoming(self.const(0), preheader)
        b.cbranch(b.icmp_signed("<", index, count), inner, done)
        b.position_at_end(inner)
        body(index)
        index.add_incoming(b.add(index, self.const(1), name=f"{name}.next"), b.block)
        b.branch(header)
        b.position_at_end(done)


def _task_key(kind: str, **fields: object) -> str:
    text = kind + "(" + ",".join(f"{k}={fields[k]!r}" for k in sorted(fields)) + ")"
    return kind + "-" + hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# A tunable matmul
# ---------------------------------------------------------------------------------------------------------------


def tile_fits(config: Config, limit: int = 16384) -> bool:
    """Constraint: the (n, k) tile must stay a reasonable size (rejected before building)."""
    tile_n = config["tile_n"]
    tile_k = config["tile_k"]
    assert isinstance(tile_n, tuple) and isinstance(tile_k, tuple)
    return int(tile_n[-1]) * int(tile_k[-1]) <= limit


@dataclass
class MatmulTask:
    """C[m, n] = A[m, k] @ B[k, n] in float32, with knobs `order`, `tile_n`, `tile_k`."""

    m: int
    n: int
    k: int
    weight: int = 1
    target: str = HOST_TARGET
    tile_limit: int = 16384
    key: str = field(init=False)
    description: str = field(init=False)
    flops: float = field(init=False)
    space: Space = field(init=False)

    def __post_init__(self) -> None:
        self.key = _task_key("matmul", m=self.m, n=self.n, k=self.k)
        self.description = f"matmul {self.m}x{self.k} @ {self.k}x{self.n} float32"
        self.flops = 2.0 * self.m * self.n * self.k
        self.space = Space(
            [
                ChoiceKnob("order", ["ijk", "ikj"]),
                SplitKnob("tile_n", self.n, 2),
                SplitKnob("tile_k", self.k, 2),
            ],
            [Constraint("tile_fits", functools.partial(tile_fits, limit=self.tile_limit))],
        )

    def default_config(self) -> Config:
        return Config({"order": "ijk", "tile_n": (self.n, 1), "tile_k": (self.k, 1)})

    def input_specs(self) -> Sequence[TensorSpec]:
        return (TensorSpec((self.m, self.k), "float32"), TensorSpec((self.k, self.n), "float32"))

    def reference(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        a, b = inputs
        return (np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32),)

    def kernel_args(self) -> tuple[KernelArg, ...]:
        a, b = self.input_specs()
        return (KernelArg(a, "input", 0), KernelArg(b, "input", 1),
                KernelArg(TensorSpec((self.m, self.n), "float32"), "output", 0))

    def build(self, config: Config) -> BuildArtifact:
        order = config["order"]
        tile_n = config["tile_n"]
        tile_k = config["tile_k"]
        assert isinstance(tile_n, tuple) and isinstance(tile_k, tuple)
        tn, tk = int(tile_n[-1]), int(tile_k[-1])
        f32 = ir.FloatType()
        ptr = ir.PointerType()
        module = ir.Module(name="matmul")
        function = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr]), name="matmul_kernel")
        for arg in function.args:
            arg.add_attribute("noalias")
        a_ptr, b_ptr, c_ptr = function.args
        builder = ir.IRBuilder(function.append_basic_block("entry"))
        emit = _LoopEmitter(builder)
        m, n, k = emit.const(self.m), emit.const(self.n), emit.const(self.k)
        zero = ir.Constant(f32, 0.0)

        def element(base: object, row: object, col: object, cols: object) -> object:
            return builder.gep(base, [builder.add(builder.mul(row, cols), col)], inbounds=True, source_etype=f32)

        def fma(acc: object, x: object, y: object) -> object:
            return builder.fadd(acc, builder.fmul(x, y, flags=("contract",)), flags=("contract",))

        if order == "ijk":
            def ij(i: object) -> None:
                def j_body(j: object) -> None:
                    # Accumulating in memory is fine: with noalias arguments LLVM keeps the sum in a register.
                    builder.store(zero, element(c_ptr, i, j, n))

                    def k_body(kk: object) -> None:
                        c_slot = element(c_ptr, i, j, n)
                        a_val = builder.load(element(a_ptr, i, kk, k), typ=f32)
                        b_val = builder.load(element(b_ptr, kk, j, n), typ=f32)
                        total = fma(builder.load(c_slot, typ=f32), a_val, b_val)
                        builder.store(total, c_slot)

                    emit.loop(k, k_body, "k")

                emit.loop(n, j_body, "j")

            emit.loop(m, ij, "i")
        elif order == "ikj":
            def zero_row(i: object) -> None:
                emit.loop(n, lambda j: builder.store(zero, element(c_ptr, i, j, n)), "z")

            emit.loop(m, zero_row, "zi")
            tn_c, tk_c = emit.const(tn), emit.const(tk)

            def jo_body(jo: object) -> None:
                j0 = builder.mul(jo, tn_c)
                jn = _min(builder, tn_c, builder.sub(n, j0))

                def ko_body(ko: object) -> None:
                    k0 = builder.mul(ko, tk_c)
                    kn = _min(builder, tk_c, builder.sub(k, k0))

                    def i_body(i: object) -> None:
                        def kk_body(kk: object) -> None:
                            kidx = builder.add(k0, kk)
                            a_val = builder.load(element(a_ptr, i, kidx, k), typ=f32)

                            def jj_body(jj: object) -> None:
                                j = builder.add(j0, jj)
                                c_slot = element(c_ptr, i, j, n)
                                b_val = builder.load(element(b_ptr, kidx, j, n), typ=f32)
                                total = fma(builder.load(c_slot, typ=f32), a_val, b_val)
                                builder.store(total, c_slot)

                            emit.loop(jn, jj_body, "jj")

                        emit.loop(kn, kk_body, "kk")

                    emit.loop(m, i_body, "i")

                emit.loop(emit.const(-(-self.k // tk)), ko_body, "ko")

            emit.loop(emit.const(-(-self.n // tn)), jo_body, "jo")
        else:
            raise InvalidConfigError(f"unknown loop order {order!r}")
        builder.ret_void()
        return compile_llvm_ir(str(module), "matmul_kernel", self.kernel_args())


def _min(builder: object, x: object, y: object) -> object:
    return builder.select(builder.icmp_signed("<", x, y), x, y)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------------------------
# Fault injection
# ---------------------------------------------------------------------------------------------------------------

GOOD_VARIANTS = ("plain", "reversed")
FAULT_VARIANTS = ("segfault", "hang", "wrong", "partial", "compile_error", "invalid", "build_hang", "build_crash")


@dataclass
class FaultyTask:
    """out = a + b over `size` float32 elements; the `variant` knob picks a correct or a broken kernel.

    `repeat` (1..max_repeat) recomputes the sum that many times: correct, but slower, so tuning has something to
    find.
    """

    size: int = 4096
    variants: tuple[str, ...] = GOOD_VARIANTS + FAULT_VARIANTS
    max_repeat: int = 3
    weight: int = 1
    target: str = HOST_TARGET
    key: str = field(init=False)
    description: str = field(init=False)
    flops: float = field(init=False)
    space: Space = field(init=False)

    def __post_init__(self) -> None:
        self.key = _task_key("faulty_add", size=self.size, variants=self.variants, max_repeat=self.max_repeat)
        self.description = f"add {self.size} float32 (fault injection)"
        self.flops = float(self.size)
        self.space = Space([ChoiceKnob("variant", list(self.variants)), IntKnob("repeat", 1, self.max_repeat)])

    def default_config(self) -> Config:
        return Config({"variant": self.variants[0], "repeat": 1})

    def input_specs(self) -> Sequence[TensorSpec]:
        return (TensorSpec((self.size,), "float32"), TensorSpec((self.size,), "float32"))

    def reference(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        return (inputs[0] + inputs[1],)

    def build(self, config: Config) -> BuildArtifact:
        variant = str(config["variant"])
        repeat = int(config["repeat"])  # type: ignore[arg-type]
        if variant == "invalid":
            raise InvalidConfigError("the template rejects this variant")
        if variant == "build_hang":
            # Stuck in native code: the soft timer signal is blocked, so only killing the worker ends this.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            while True:
                time.sleep(3600)
        if variant == "build_crash":
            ctypes.string_at(0)  # segfaults the build worker, like a compiler crash
        spec = TensorSpec((self.size,), "float32")
        args = (KernelArg(spec, "input", 0), KernelArg(spec, "input", 1), KernelArg(spec, "output", 0))
        ir_text = _add_kernel_ir(self.size, variant, repeat)
        try:
            return compile_llvm_ir(ir_text, "add_kernel", args)
        except RuntimeError as err:  # llvmlite reports IR errors as RuntimeError
            raise CompileError(f"LLVM rejected the kernel: {str(err).splitlines()[0]}") from err


def _add_kernel_ir(size: int, variant: str, repeat: int) -> str:
    """Textual LLVM IR for the add kernel variants (text keeps the deliberate faults easy to read)."""
    count = size - 1 if variant == "partial" else size
    if variant == "hang":
        # The loop has a volatile side effect, so LLVM must keep it; it never exits.
        return """
define void @add_kernel(ptr %a, ptr %b, ptr %out) {
entry:
  br label %spin
spin:
  store volatile float 1.0, ptr %out
  br label %spin
}
"""
    if variant == "segfault":
        return """
define void @add_kernel(ptr %a, ptr %b, ptr %out) {
entry:
  store volatile float 1.0, ptr inttoptr (i64 16 to ptr)
  ret void
}
"""
    if variant == "compile_error":
        return "define void @add_kernel(ptr %a, ptr %b, ptr %out) {\nentry:\n  %x = fadd float %undefined, 1.0\n}\n"
    index_expr = "%i" if variant != "reversed" else "%ri"
    bump = "1.0" if variant == "wrong" else "0.0"
    return f"""
define void @add_kernel(ptr noalias %a, ptr noalias %b, ptr noalias %out) {{
entry:
  br label %outer
outer:
  %r = phi i64 [0, %entry], [%r.next, %outer.latch]
  br label %loop
loop:
  %i = phi i64 [0, %outer], [%i.next, %loop]
  %ri = sub i64 {count - 1}, %i
  %idx = add i64 {index_expr}, 0
  %pa = getelementptr inbounds float, ptr %a, i64 %idx
  %pb = getelementptr inbounds float, ptr %b, i64 %idx
  %po = getelementptr inbounds float, ptr %out, i64 %idx
  %x = load float, ptr %pa
  %y = load float, ptr %pb
  %s = fadd float %x, %y
  %is.mid = icmp eq i64 %idx, {size // 2}
  %extra = select i1 %is.mid, float {bump}, float 0.0
  %v = fadd float %s, %extra
  store volatile float %v, ptr %po
  %i.next = add i64 %i, 1
  %more = icmp slt i64 %i.next, {count}
  br i1 %more, label %loop, label %outer.latch
outer.latch:
  %r.next = add i64 %r, 1
  %again = icmp slt i64 %r.next, {repeat}
  br i1 %again, label %outer, label %exit
exit:
  ret void
}}
"""


def expected_error(variant: str) -> str | None:
    """The error kind name a `FaultyTask` variant must be recorded with (None: a valid measurement)."""
    return {
        "segfault": "RUNTIME_ERROR",
        "hang": "TIMEOUT",
        "wrong": "WRONG_RESULT",
        "partial": "WRONG_RESULT",
        "compile_error": "COMPILE_ERROR",
        "invalid": "INVALID_CONFIG",
        "build_hang": "BUILD_TIMEOUT",
        "build_crash": "COMPILE_ERROR",
    }.get(variant)


def small_tasks() -> list[MatmulTask]:
    """Two small matmul tasks with different weights (a tiny "model")."""
    return [MatmulTask(48, 40, 32, weight=2), MatmulTask(24, 64, 40, weight=1)]


def compile_c_library(source: str, folder: Path, opt_level: str = "-O2") -> bytes | None:
    """`source` compiled into a shared library with the system's C compiler: its bytes (the runner's "shared-library"
    artifacts), or None where there is no C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    (folder / "k.c").write_text(source)
    subprocess.run([compiler, "-shared", "-fPIC", opt_level, "-o", str(folder / "k.so"), str(folder / "k.c")],
                   check=True)
    return (folder / "k.so").read_bytes()


@dataclass
class DoublingTask:
    """`2 * A` for a 4x8 float32 `A`: the task of hand-written C kernels (no schedule space)."""

    key: str = "twice"
    description: str = "2 * A"
    flops: float = 32.0
    weight: int = 1
    target: str = "llvm"
    space: Space = field(default_factory=lambda: Space([]))

    def input_specs(self) -> Sequence[TensorSpec]:
        return (TensorSpec((4, 8), "float32"),)

    def reference(self, inputs: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
        return (inputs[0] * 2,)
