"""The native executor: one call into generated code runs a whole model.

A model's graph plan is a list of kernel calls whose arguments are storages (inputs, constants, arena buffers,
outputs; every value lives at offset 0 of its storage). From it this module generates a small LLVM module of
three functions over one *slot table* (`void* slots[num_storages]`, the address of every storage):

    void run(void** slots)                        // every kernel call in order: k(slots[a], slots[b], ...)
    void run_repeat(void** slots, int64 n)        // run n times back to back (timing without Python between)
    void run_profiled(void** slots, int64* ns)    // run once, ns[0] before the first call, ns[i + 1] after call i

The kernels themselves stay in their own object code; the executor imports their addresses when it is
JIT-linked, so building it costs a few milliseconds whatever the kernels' size and is done when a model is loaded
(it is derived from the plan, which the model file already holds). Constant and arena slots are filled once;
a run writes the input and output addresses into their slots and makes one ctypes call, so a kernel call costs
what a C function call costs, not a Python loop iteration.

Parallel kernels share one persistent thread team (`relay_tune.codegen.jit`: relay-tune's native team by default,
or libgomp's), whose workers stay alive between parallel regions, spin briefly and then sleep, so a parallel kernel
starts with at most a futex wake-up; kernels too small to pay for that run serially
(`search_space.families.common.PARALLEL_MIN_WORK`).

Sharing the cores. Idle threads spin only briefly (`relay_tune.codegen.jit.DEFAULT_GOMP_SPINCOUNT`): libgomp's
default kept our workers spinning for milliseconds after a run, taking the cores from whatever ran next. A parallel
loop does not wait for a descheduled thread: each thread runs its own share in chunks, then takes the chunks the
others have not started (`relay_tune.codegen.llvm`), and the native team (`relay_tune.codegen.thread_team`) also
does not wait at the region's end for a thread that never started: its caller revokes that thread's part and runs
it, so when another library's threads (onnxruntime's pool spins for about 60 ms after each of its runs) or other
processes hold a core, a region costs the work of the threads that run instead of a scheduler time slice.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir

from relay_tune.codegen.jit import _jit_lock, _lljit
from relay_tune.codegen.llvm import ensure_llvm_initialized
from relay_tune.codegen.thread_team import HOLD, RELEASE
from relay_tune.errors import CompileError

__all__ = ["RUN", "RUN_PROFILED", "RUN_REPEAT", "NativeExecutor", "executor_ir"]

RUN = "relay_tune_run"
RUN_REPEAT = "relay_tune_run_repeat"
RUN_PROFILED = "relay_tune_run_profiled"
CLOCK_MONOTONIC = 1  # Linux

_ids = itertools.count()
_machine_lock = threading.Lock()
_machine: Any = None


def executor_ir(calls: Sequence[tuple[str, Sequence[int]]], num_slots: int, hold: bool = False) -> str:
    """LLVM IR of the executor for `calls`: (kernel symbol, slot of each argument) in execution order. With `hold`,
    every run is bracketed by the native thread team's `hold` and `release` (imported symbols of those names)."""
    i8p = ir.IntType(8).as_pointer()
    i32, i64 = ir.IntType(32), ir.IntType(64)
    void = ir.VoidType()
    slots_type = i8p.as_pointer()
    module = ir.Module(name="relay_tune_executor")
    kernels: dict[str, ir.Function] = {}
    for name, args in calls:
        if any(not 0 <= s < num_slots for s in args):
            raise CompileError(f"kernel call {name} refers to a storage the plan does not have")
        known = kernels.get(name)
        if known is None:
            kernels[name] = ir.Function(module, ir.FunctionType(void, [i8p] * len(args)), name=name)
        elif len(known.args) != len(args):
            raise CompileError(f"kernel {name} is called with {len(known.args)} and {len(args)} arguments")

    bracket = [ir.Function(module, ir.FunctionType(void, []), name=n) for n in (HOLD, RELEASE)] if hold else []

    def emit_calls(builder: ir.IRBuilder, slots: ir.Value, after: Any = None) -> None:
        # Each call loads its slots afresh: a kernel could not change them, but loads are cheap and this keeps
        # the code independent of LLVM proving that.
        if bracket:
            builder.call(bracket[0], [])
        for number, (name, args) in enumerate(calls):
            pointers = [builder.load(builder.gep(slots, [ir.Constant(i64, s)])) for s in args]
            builder.call(kernels[name], pointers)
            if after is not None:
                after(number)
        if bracket:
            builder.call(bracket[1], [])

    run = ir.Function(module, ir.FunctionType(void, [slots_type]), name=RUN)
    run.attributes.add("noinline")  # run_repeat must really call it n times
    builder = ir.IRBuilder(run.append_basic_block("entry"))
    emit_calls(builder, run.args[0])
    builder.ret_void()

    repeat = ir.Function(module, ir.FunctionType(void, [slots_type, i64]), name=RUN_REPEAT)
    entry = repeat.append_basic_block("entry")
    loop = repeat.append_basic_block("loop")
    done = repeat.append_basic_block("done")
    builder = ir.IRBuilder(entry)
    builder.cbranch(builder.icmp_signed(">", repeat.args[1], ir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    counter = builder.phi(i64)
    counter.add_incoming(ir.Constant(i64, 0), entry)
    builder.call(run, [repeat.args[0]])
    following = builder.add(counter, ir.Constant(i64, 1))
    counter.add_incoming(following, loop)
    builder.cbranch(builder.icmp_signed("<", following, repeat.args[1]), loop, done)
    builder.position_at_end(done)
    builder.ret_void()

    timespec = ir.LiteralStructType([i64, i64])
    clock_gettime = ir.Function(module, ir.FunctionType(i32, [i32, timespec.as_pointer()]), name="clock_gettime")
    profiled = ir.Function(module, ir.FunctionType(void, [slots_type, i64.as_pointer()]), name=RUN_PROFILED)
    builder = ir.IRBuilder(profiled.append_basic_block("entry"))
    stamp = builder.alloca(timespec)
    slots_arg, stamps = profiled.args

    def record(position: int) -> None:
        builder.call(clock_gettime, [ir.Constant(i32, CLOCK_MONOTONIC), stamp])
        seconds = builder.load(builder.gep(stamp, [ir.Constant(i32, 0), ir.Constant(i32, 0)]))
        nanos = builder.load(builder.gep(stamp, [ir.Constant(i32, 0), ir.Constant(i32, 1)]))
        total = builder.add(builder.mul(seconds, ir.Constant(i64, 1_000_000_000)), nanos)
        builder.store(total, builder.gep(stamps, [ir.Constant(i64, position)]))

    record(0)
    emit_calls(builder, slots_arg, after=lambda number: record(number + 1))
    builder.ret_void()
    return str(module)


def _target_machine() -> Any:
    """A target machine for this host. The executor is only calls and loads: no CPU features matter."""
    global _machine

    with _machine_lock:
        if _machine is None:
            ensure_llvm_initialized()
            triple = llvm.get_process_triple()
            _machine = llvm.Target.from_triple(triple).create_target_machine(opt=1, reloc="pic", codemodel="small")
        return _machine


class NativeExecutor:
    """A model's executor, JIT-linked against kernels already loaded in this process.

    `calls`: (kernel symbol, slot of each argument) in order; `addresses`: each kernel symbol's address;
    `libraries`: objects that keep those kernels mapped (held as long as the executor lives); `hold`: the native
    thread team's (hold, release) addresses (`NativeThreadTeam.hold_symbols`) when its kernels run on that team.
    """

    def __init__(
        self,
        calls: Sequence[tuple[str, Sequence[int]]],
        num_slots: int,
        addresses: Mapping[str, int],
        libraries: Sequence[Any] = (),
        hold: tuple[int, int] | None = None,
    ) -> None:
        self.num_calls = len(calls)
        self.holds_team = hold is not None
        self.slots = (ctypes.c_void_p * max(1, num_slots))()
        self._libraries = list(libraries)
        text = executor_ir(calls, num_slots, hold=hold is not None)
        try:
            parsed = llvm.parse_assembly(text)
            parsed.verify()
        except RuntimeError as err:
            raise CompileError(f"LLVM rejected the generated executor: {err}") from err
        obj = bytes(_target_machine().emit_object(parsed))
        with _jit_lock:
            jit = _lljit()
            builder = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
            for name in dict.fromkeys(name for name, _ in calls):
                builder.import_symbol(name, addresses[name])
            if hold is not None:
                builder.import_symbol(HOLD, hold[0])
                builder.import_symbol(RELEASE, hold[1])
            for symbol in (RUN, RUN_REPEAT, RUN_PROFILED):
                builder.export_symbol(symbol)
            try:
                self._tracker = builder.link(jit, f"relay_tune_executor_{os.getpid()}_{next(_ids)}")
            except RuntimeError as err:
                raise CompileError(f"cannot load the generated executor: {err}") from err
        self._run = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._tracker[RUN])
        self._repeat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(self._tracker[RUN_REPEAT])
        self._profiled = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(self._tracker[RUN_PROFILED])
        self._slots_address = ctypes.addressof(self.slots)
        self._stamps = (ctypes.c_int64 * (self.num_calls + 1))()

    def run(self) -> None:
        """Run every kernel once, in order (the slots must hold valid addresses)."""
        self._run(self._slots_address)

    def run_repeat(self, number: int) -> None:
        self._repeat(self._slots_address, number)

    def run_profiled(self) -> list[float]:
        """Run once and return the seconds each kernel call took (measured in the generated code)."""
        self._profiled(self._slots_address, ctypes.addressof(self._stamps))
        stamps = list(self._stamps)
        return [(stamps[i + 1] - stamps[i]) * 1e-9 for i in range(self.num_calls)]
