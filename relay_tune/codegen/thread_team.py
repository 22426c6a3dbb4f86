"""A native thread team for parallel kernels, with revocation: a parallel region never waits for a thread that has
not started its part.

Generated kernels run their parallel loops through three OpenMP entry points (`GOMP_parallel`,
`omp_get_thread_num`, `omp_get_num_threads`). libgomp's team waits at every region's closing barrier for each member,
so on a host with more runnable threads than cores a region whose helper thread was descheduled costs a scheduler time
slice (milliseconds) instead of microseconds. This team, like onnxruntime's thread pool, revokes the parts no thread
has started: the caller runs them itself and waits only for the threads that joined.

The team is LLVM IR (built here with llvmlite, JIT-compiled once per process) over a handful of globals:

- `state`, one 32-bit word: generation (bits 17-31), open flag (bit 16), the number of thread numbers offered to
  workers in this region (`limit`, bits 8-15) and how many of them workers have claimed (bits 0-7). It is also the
  word idle workers sleep on (futex).
- `fn`, `data`: the region's body and argument, written by the caller before it opens the region.
- `done`: how many workers that joined have finished; the caller sleeps on it when it has to wait.

A region (`GOMP_parallel(fn, data, n, flags)`): the caller takes the team (a try-lock: a region begun while another
runs, from another thread or nested in a body, runs on its caller alone), publishes `fn` and `data`, opens the region
offering thread numbers 1 .. n-1, wakes sleeping workers, and runs `fn(data)` as thread 0. It then closes the region
with one atomic operation, which also tells it how many numbers workers claimed (k), runs the body itself for each
number k+1 .. n-1 nobody claimed, and waits until the k workers are done. A worker joins by a compare-and-swap that
claims the next number while the region is open; it reads `fn` and `data` only after that succeeded, so a worker that
comes late (after the close) never touches `data`, which lives on the caller's stack. Every thread number 0 .. n-1
runs exactly once, so bodies that split work statically by `omp_get_num_threads` stay complete; the kernels' bodies
(`relay_tune.codegen.llvm`) also take the chunks of numbers not started yet, so the parts the caller runs after its
own are almost always empty.

Idle workers spin for a bounded number of `pause` iterations (the spin count libgomp is given,
`relay_tune.codegen.jit.DEFAULT_GOMP_SPINCOUNT`, unless GOMP_SPINCOUNT or OMP_WAIT_POLICY say otherwise), then sleep
on `state` with a futex. Every `YIELD_EVERY` iterations a spinning thread (an idle worker, or a caller waiting for
the workers that joined) calls `sched_yield`: on a host with more runnable threads than cores the scheduler often
puts a woken worker on its caller's core, and a worker spinning there kept the caller, with the rest of the model
run, off the core until the scheduler preempted it (on a loaded host the first call of openwakeword's mel
spectrogram after an idle gap had its caller preempted about twice and took 1.6-4x a warm call;
`python -m experiments first-calls`, `experiments/README.md`, "First calls after idle").
Where nothing else wants the core, the yield returns at once.

`hold` and `release` bracket a run of regions (the native executor calls them around each model run,
`relay_tune.runtime.executor`): `hold` wakes the sleeping workers once, at the start of the run, and while any hold
is in progress idle workers spin whatever the spin count, so a model whose serial kernels outlast the spin does not
pay a futex wake-up at each parallel kernel; after the release they spin the spin count, then sleep.

A thread's number and team size live in thread-specific data (`pthread_setspecific`), one
pointer-sized value `team_size << 32 | number`; no value means thread 0 of 1.

Workers are Python threads that call the native worker loop through ctypes (which releases the GIL) and stay in it
until the team stops. After `fork` the child starts its own workers (`os.register_at_fork`): the parent's do not
exist there. At exit (atexit, before interpreter teardown) the team is closed: its workers are joined and it never
starts again, so a thread still running regions then runs them on its own.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import platform
import threading
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir

from relay_tune.errors import CompileError, RelayTuneError

__all__ = ["MAX_TEAM", "YIELD_EVERY", "NativeThreadTeam", "native_team_supported", "spin_count_from_environment"]

# Thread numbers offered to workers are 8 bits of the state word: teams of at most 256 threads.
MAX_TEAM = 256
_CLAIMED_MASK = 0xFF
_LIMIT_SHIFT = 8
_OPEN = 1 << 16
_GEN_SHIFT = 17
_GEN_ONE = 1 << _GEN_SHIFT

# syscall numbers of futex(2) per machine; futex operations on memory private to this process
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98, "ppc64le": 221, "s390x": 238}
_FUTEX_WAIT_PRIVATE = 128
_FUTEX_WAKE_PRIVATE = 129

# Exported symbols of the team's module.
PARALLEL = "GOMP_parallel"
THREAD_NUM = "omp_get_thread_num"
NUM_THREADS = "omp_get_num_threads"
WORKER = "relay_tune_team_worker"
JOIN = "relay_tune_team_join"
STOP = "relay_tune_team_stop"
HOLD = "relay_tune_team_hold"
RELEASE = "relay_tune_team_release"
_GLOBALS = ("state", "sleepers", "done", "waiting", "fn", "data", "busy", "shutdown", "spin", "key", "joins", "held",
            "yields")
# An idle worker (or a caller waiting for workers) yields its core every this many `pause` iterations: a spinning
# thread that the scheduler put on the same core as the thread it waits for (the caller still running its part,
# or a worker still running a chunk) would otherwise keep that thread off the core for a time slice.
YIELD_EVERY = 256
_COUNTERS = ("joins", "yields")  # 64-bit globals

_I1, _I8, _I32, _I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
_VOID = ir.VoidType()
_I8P = _I8.as_pointer()
_BODY = ir.FunctionType(_VOID, [_I8P])


def _machine() -> str:
    return platform.machine().lower()


def native_team_supported() -> bool:
    """Whether this host can run the native team: Linux (futex, pthreads) on a machine whose futex syscall is known."""
    return os.name == "posix" and platform.system() == "Linux" and _machine() in _SYS_FUTEX


def spin_count_from_environment(default: int) -> int:
    """Idle spin iterations before a worker sleeps: GOMP_SPINCOUNT when set (the same knob as libgomp's), 0 for
    OMP_WAIT_POLICY=passive, a large count for OMP_WAIT_POLICY=active, else `default`."""
    value = os.environ.get("GOMP_SPINCOUNT", "").strip().lower()
    if value:
        if value == "infinite":
            return 2**31 - 1
        try:
            # libgomp accepts suffixes k, M, G; the plain number is what users set in practice
            scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(value[-1], 1)
            count = int(value[:-1] if scale > 1 else value) * scale
            return max(0, min(count, 2**31 - 1))
        except ValueError:
            pass
    policy = os.environ.get("OMP_WAIT_POLICY", "").strip().lower()
    if policy == "passive":
        return 0
    if policy == "active":
        return 30_000_000_000 // 1000  # libgomp's active policy spins about this long (bounded here to an i32)
    return default


# ---------------------------------------------------------------------------------------------------
# the team's IR
# ---------------------------------------------------------------------------------------------------


class _TeamIR:
    """Builds the team's LLVM module (one instance per build)."""

    def __init__(self, machine: str) -> None:
        self.module = ir.Module(name="relay_tune_thread_team")
        self.machine = machine
        m = self.module
        self.g: dict[str, ir.GlobalVariable] = {}
        for name in _GLOBALS:
            kind = _I8P if name in ("fn", "data") else _I64 if name in _COUNTERS else _I32
            var = ir.GlobalVariable(m, kind, name=f"relay_tune_team_{name}")
            var.initializer = ir.Constant(kind, None)
            var.align = 64  # one cache line each: workers spin on `state`, the caller on `done`
            var.linkage = "internal"
            self.g[name] = var
        self.syscall = ir.Function(m, ir.FunctionType(_I64, [_I64], var_arg=True), name="syscall")
        self.getspecific = ir.Function(m, ir.FunctionType(_I8P, [_I32]), name="pthread_getspecific")
        self.setspecific = ir.Function(m, ir.FunctionType(_I32, [_I32, _I8P]), name="pthread_setspecific")
        self.sched_yield = ir.Function(m, ir.FunctionType(_I32, []), name="sched_yield")
        self.sys_futex = ir.Constant(_I64, _SYS_FUTEX.get(machine, -1))

    # -- helpers ----------------------------------------------------------------------------------

    def pause(self, b: ir.IRBuilder) -> None:
        """A spin-wait hint to the core (x86 `pause`, ARM `yield`)."""
        # intrinsics, not inline assembly: the JIT's object emission has no assembly parser
        if self.machine in ("x86_64", "amd64"):
            b.call(self.intrinsic("llvm.x86.sse2.pause", ir.FunctionType(_VOID, [])), [])
        elif self.machine in ("aarch64", "arm64"):
            b.call(self.intrinsic("llvm.aarch64.hint", ir.FunctionType(_VOID, [_I32])), [ir.Constant(_I32, 1)])

    def spin_step(self, b: ir.IRBuilder, count: ir.Value) -> None:
        """One iteration of a spin-wait, `count` the iterations so far: a `pause`, and every `YIELD_EVERY`
        iterations a `sched_yield` (immediate when nothing else wants this core)."""
        self.pause(b)
        mask = ir.Constant(_I32, YIELD_EVERY - 1)
        due = b.icmp_unsigned("==", b.and_(count, mask), mask)
        with b.if_then(due):
            b.call(self.sched_yield, [])
            b.atomic_rmw("add", self.g["yields"], ir.Constant(_I64, 1), "monotonic")

    def intrinsic(self, name: str, ftype: ir.FunctionType) -> ir.Function:
        known = self.module.globals.get(name)
        return known if isinstance(known, ir.Function) else ir.Function(self.module, ftype, name=name)

    def load(self, b: ir.IRBuilder, name: str, ordering: str = "seq_cst") -> ir.Value:
        var = self.g[name]
        return b.load_atomic(var, ordering, 8 if var.type.pointee in (_I8P, _I64) else 4)

    def store(self, b: ir.IRBuilder, name: str, value: ir.Value, ordering: str = "seq_cst") -> None:
        var = self.g[name]
        b.store_atomic(value, var, ordering, 8 if var.type.pointee in (_I8P, _I64) else 4)

    def futex(self, b: ir.IRBuilder, word: str, op: int, value: ir.Value) -> None:
        address = b.ptrtoint(self.g[word], _I64)
        b.call(self.syscall, [self.sys_futex, address, ir.Constant(_I32, op), value, ir.Constant(_I8P, None)])

    def set_thread(self, b: ir.IRBuilder, number: ir.Value, size: ir.Value) -> ir.Value:
        """Make this thread `number` of `size` (i32 each); returns the previous value (to restore)."""
        key = self.load(b, "key", "monotonic")
        previous = b.call(self.getspecific, [key])
        value = b.or_(b.shl(b.zext(size, _I64), ir.Constant(_I64, 32)), b.zext(number, _I64))
        b.call(self.setspecific, [key, b.inttoptr(value, _I8P)])
        return previous

    def restore_thread(self, b: ir.IRBuilder, previous: ir.Value) -> None:
        b.call(self.setspecific, [self.load(b, "key", "monotonic"), previous])

    def function(self, name: str, ftype: ir.FunctionType, internal: bool = False) -> ir.Function:
        fn = ir.Function(self.module, ftype, name=name)
        fn.attributes.add("nounwind")
        if internal:
            fn.linkage = "internal"
        return fn

    # -- the entry points ---------------------------------------------------------------------------

    def thread_queries(self) -> None:
        """omp_get_thread_num, omp_get_num_threads: from this thread's specific value (none: thread 0 of 1)."""
        for name, shift, default in ((THREAD_NUM, 0, 0), (NUM_THREADS, 32, 1)):
            fn = self.function(name, ir.FunctionType(_I32, []))
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            value = b.ptrtoint(b.call(self.getspecific, [self.load(b, "key", "monotonic")]), _I64)
            field = b.trunc(b.lshr(value, ir.Constant(_I64, shift)), _I32)
            unset = b.icmp_unsigned("==", value, ir.Constant(_I64, 0))
            b.ret(b.select(unset, ir.Constant(_I32, default), field))

    def join(self) -> ir.Function:
        """i32 join(): claim a thread number of the open region and run the body as it; 1 if it ran, 0 if no region
        was open or every number was claimed. Never reads `fn` or `data` unless the claim succeeded."""
        fn = self.function(JOIN, ir.FunctionType(_I32, []))
        entry, retry, claim, run, none = (fn.append_basic_block(n) for n in ("entry", "retry", "claim", "run", "none"))
        b = ir.IRBuilder(entry)
        b.branch(retry)
        b.position_at_end(retry)
        state = self.load(b, "state", "acquire")
        b.cbranch(self.joinable(b, state), claim, none)
        b.position_at_end(claim)
        pair = b.cmpxchg(self.g["state"], state, b.add(state, ir.Constant(_I32, 1)), "acq_rel", "acquire")
        b.cbranch(b.extract_value(pair, 1), run, retry)
        b.position_at_end(run)
        number = b.add(b.and_(state, ir.Constant(_I32, _CLAIMED_MASK)), ir.Constant(_I32, 1))
        size = b.add(self.limit(b, state), ir.Constant(_I32, 1))
        body = b.bitcast(self.load(b, "fn", "monotonic"), _BODY.as_pointer())
        data = self.load(b, "data", "monotonic")
        previous = self.set_thread(b, number, size)
        b.call(body, [data])
        self.restore_thread(b, previous)
        b.atomic_rmw("add", self.g["joins"], ir.Constant(_I64, 1), "monotonic")
        b.atomic_rmw("add", self.g["done"], ir.Constant(_I32, 1), "seq_cst")
        # the caller sleeps on `done` only after saying so in `waiting` (and re-reading `done`): no lost wake-up
        waiting = b.icmp_unsigned("!=", self.load(b, "waiting"), ir.Constant(_I32, 0))
        with b.if_then(waiting):
            self.futex(b, "done", _FUTEX_WAKE_PRIVATE, ir.Constant(_I32, 1))
        b.ret(ir.Constant(_I32, 1))
        b.position_at_end(none)
        b.ret(ir.Constant(_I32, 0))
        return fn

    def limit(self, b: ir.IRBuilder, state: ir.Value) -> ir.Value:
        return b.and_(b.lshr(state, ir.Constant(_I32, _LIMIT_SHIFT)), ir.Constant(_I32, 0xFF))

    def joinable(self, b: ir.IRBuilder, state: ir.Value) -> ir.Value:
        """Whether `state` is an open region with a thread number left to claim."""
        is_open = b.icmp_unsigned("!=", b.and_(state, ir.Constant(_I32, _OPEN)), ir.Constant(_I32, 0))
        claimed = b.and_(state, ir.Constant(_I32, _CLAIMED_MASK))
        return b.and_(is_open, b.icmp_unsigned("<", claimed, self.limit(b, state)))

    def worker(self, join: ir.Function) -> None:
        """void worker(): join regions until the team stops; between regions spin `spin` times, then sleep on
        `state` (a futex) after counting itself in `sleepers`."""
        fn = self.function(WORKER, ir.FunctionType(_VOID, []))
        names = ("entry", "loop", "try", "idle", "spin", "sleep", "exit")
        entry, loop, attempt, idle, spin, sleep, leave = (fn.append_basic_block(n) for n in names)
        b = ir.IRBuilder(entry)
        initial = self.load(b, "state", "monotonic")
        b.branch(loop)
        b.position_at_end(loop)
        spins = b.phi(_I32, name="spins")
        seen = b.phi(_I32, name="seen")  # the state word when the spin began
        ticks = b.phi(_I32, name="ticks")  # spin iterations since the last sleep (paces the yields)
        spins.add_incoming(ir.Constant(_I32, 0), entry)
        seen.add_incoming(initial, entry)
        ticks.add_incoming(ir.Constant(_I32, 0), entry)
        stopped = b.icmp_unsigned("!=", self.load(b, "shutdown", "acquire"), ir.Constant(_I32, 0))
        b.cbranch(stopped, leave, attempt)
        b.position_at_end(attempt)
        joined = b.icmp_unsigned("!=", b.call(join, []), ir.Constant(_I32, 0))
        b.cbranch(joined, loop, idle)
        spins.add_incoming(ir.Constant(_I32, 0), attempt)
        seen.add_incoming(seen, attempt)
        ticks.add_incoming(ticks, attempt)
        b.position_at_end(idle)
        # A region came and went since the spin began (one this thread was too late for): regions keep coming, so
        # spin afresh, as after a region joined, rather than sleep and cost the next region's caller a wake-up.
        # While a caller holds the team (a model run in progress: `hold`), spin on whatever the spin count.
        now = self.load(b, "state", "monotonic")
        held = b.icmp_unsigned("!=", self.load(b, "held", "monotonic"), ir.Constant(_I32, 0))
        fresh = b.select(b.or_(b.icmp_unsigned("!=", now, seen), held), ir.Constant(_I32, 0), spins)
        keep = b.or_(held, b.icmp_unsigned("<", fresh, self.load(b, "spin", "monotonic")))
        b.cbranch(keep, spin, sleep)
        b.position_at_end(spin)
        self.spin_step(b, ticks)
        spins.add_incoming(b.add(fresh, ir.Constant(_I32, 1)), b.block)
        seen.add_incoming(now, b.block)
        ticks.add_incoming(b.add(ticks, ir.Constant(_I32, 1)), b.block)
        b.branch(loop)
        b.position_at_end(sleep)
        # Dekker with the caller: it stores `state` then reads `sleepers`; this thread counts itself in `sleepers`
        # then reads `state`. One of the two sees the other's write, so a region opened now is never slept through.
        # `hold` changes `state` too, after counting itself in `held`: a hold begun now is not slept through either.
        b.atomic_rmw("add", self.g["sleepers"], ir.Constant(_I32, 1), "seq_cst")
        state = self.load(b, "state")
        quiet = b.and_(b.not_(self.joinable(b, state)),
                       b.icmp_unsigned("==", self.load(b, "shutdown"), ir.Constant(_I32, 0)))
        quiet = b.and_(quiet, b.icmp_unsigned("==", self.load(b, "held"), ir.Constant(_I32, 0)))
        with b.if_then(quiet):
            self.futex(b, "state", _FUTEX_WAIT_PRIVATE, state)
        b.atomic_rmw("sub", self.g["sleepers"], ir.Constant(_I32, 1), "seq_cst")
        spins.add_incoming(ir.Constant(_I32, 0), b.block)
        seen.add_incoming(self.load(b, "state", "monotonic"), b.block)
        ticks.add_incoming(ir.Constant(_I32, 0), b.block)
        b.branch(loop)
        b.position_at_end(leave)
        b.ret_void()

    def parallel(self) -> None:
        """void GOMP_parallel(fn, data, num_threads, flags): see the module's docstring."""
        fn = self.function(PARALLEL, ir.FunctionType(_VOID, [_BODY.as_pointer(), _I8P, _I32, _I32]))
        body, data, requested, _flags = fn.args
        blocks = ("entry", "team", "alone", "open", "revoked", "revoked_run", "wait", "wait_check", "wait_spin",
                  "wait_sleep", "finish")
        entry, team, alone, opened, revoked, revoked_run, wait, wait_check, wait_spin, wait_sleep, finish = (
            fn.append_basic_block(n) for n in blocks)
        b = ir.IRBuilder(entry)
        # the region's size: the team's (workers + 1), or fewer where the caller asks for fewer
        size = b.load(self.team_size)
        wanted = b.select(b.icmp_unsigned("==", requested, ir.Constant(_I32, 0)), size, requested)
        size = b.select(b.icmp_unsigned("<", wanted, size), wanted, size)
        several = b.icmp_unsigned(">", size, ir.Constant(_I32, 1))
        b.cbranch(several, team, alone)

        # a team of one, or the team is busy (another thread's region, or this call is nested in a body)
        b.position_at_end(alone)
        previous = self.set_thread(b, ir.Constant(_I32, 0), ir.Constant(_I32, 1))
        b.call(body, [data])
        self.restore_thread(b, previous)
        b.ret_void()

        b.position_at_end(team)
        taken = b.cmpxchg(self.g["busy"], ir.Constant(_I32, 0), ir.Constant(_I32, 1), "acquire", "monotonic")
        b.cbranch(b.extract_value(taken, 1), opened, alone)

        b.position_at_end(opened)
        limit = b.sub(size, ir.Constant(_I32, 1))
        self.store(b, "fn", b.bitcast(body, _I8P), "monotonic")
        self.store(b, "data", data, "monotonic")
        self.store(b, "done", ir.Constant(_I32, 0), "monotonic")
        old = self.load(b, "state", "monotonic")
        generation = b.and_(b.add(old, ir.Constant(_I32, _GEN_ONE)), ir.Constant(_I32, ~(_GEN_ONE - 1) & 0xFFFFFFFF))
        state = b.or_(b.or_(generation, ir.Constant(_I32, _OPEN)), b.shl(limit, ir.Constant(_I32, _LIMIT_SHIFT)))
        self.store(b, "state", state)  # seq_cst: ordered before the read of `sleepers` (see `worker`)
        asleep = b.icmp_unsigned("!=", self.load(b, "sleepers"), ir.Constant(_I32, 0))
        with b.if_then(asleep):
            self.futex(b, "state", _FUTEX_WAKE_PRIVATE, limit)
        previous = self.set_thread(b, ir.Constant(_I32, 0), size)
        b.call(body, [data])
        # close: from here no worker can claim a number; `claimed` is how many did
        closed = b.atomic_rmw("and", self.g["state"], ir.Constant(_I32, ~_OPEN & 0xFFFFFFFF), "seq_cst")
        claimed = b.and_(closed, ir.Constant(_I32, _CLAIMED_MASK))
        first_revoked = b.add(claimed, ir.Constant(_I32, 1))
        opened_end = b.block
        b.branch(revoked)

        # the numbers nobody claimed: run by the caller, one after another
        b.position_at_end(revoked)
        number = b.phi(_I32, name="number")
        number.add_incoming(first_revoked, opened_end)
        b.cbranch(b.icmp_unsigned("<", number, size), revoked_run, wait)
        b.position_at_end(revoked_run)
        self.set_thread(b, number, size)
        b.call(body, [data])
        number.add_incoming(b.add(number, ir.Constant(_I32, 1)), revoked_run)
        b.branch(revoked)

        # wait for the workers that joined: spin, then sleep on `done`
        b.position_at_end(wait)
        spins = b.phi(_I32, name="spins")
        spins.add_incoming(ir.Constant(_I32, 0), revoked)
        finished = b.icmp_unsigned(">=", self.load(b, "done"), claimed)
        b.cbranch(finished, finish, wait_check)
        b.position_at_end(wait_check)
        b.cbranch(b.icmp_unsigned("<", spins, self.load(b, "spin", "monotonic")), wait_spin, wait_sleep)
        b.position_at_end(wait_spin)
        self.spin_step(b, spins)
        spins.add_incoming(b.add(spins, ir.Constant(_I32, 1)), b.block)
        b.branch(wait)
        b.position_at_end(wait_sleep)
        self.store(b, "waiting", ir.Constant(_I32, 1))
        done = self.load(b, "done")
        with b.if_then(b.icmp_unsigned("<", done, claimed)):
            self.futex(b, "done", _FUTEX_WAIT_PRIVATE, done)
        self.store(b, "waiting", ir.Constant(_I32, 0))
        spins.add_incoming(ir.Constant(_I32, 0), b.block)
        b.branch(wait)

        b.position_at_end(finish)
        self.restore_thread(b, previous)
        self.store(b, "busy", ir.Constant(_I32, 0), "release")
        b.ret_void()

    def hold(self) -> None:
        """void hold(): a caller is about to run regions back to back (a model run): wake the sleeping workers now,
        so that they are up by its first region, and keep them spinning until the matching `release`."""
        fn = self.function(HOLD, ir.FunctionType(_VOID, []))
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.atomic_rmw("add", self.g["held"], ir.Constant(_I32, 1), "seq_cst")
        # A new generation changes the futex word, so a worker between its check of `held` and its futex wait
        # does not sleep (see `worker`). A region caller's store of `state` may overwrite it: that changes the
        # word as well. Claims compare and swap the whole word, so they retry.
        b.atomic_rmw("add", self.g["state"], ir.Constant(_I32, _GEN_ONE), "seq_cst")
        asleep = b.icmp_unsigned("!=", self.load(b, "sleepers"), ir.Constant(_I32, 0))
        with b.if_then(asleep):
            self.futex(b, "state", _FUTEX_WAKE_PRIVATE, ir.Constant(_I32, 2**31 - 1))
        b.ret_void()

    def release(self) -> None:
        """void release(): the end of a `hold`; the workers spin the spin count from now, then sleep."""
        fn = self.function(RELEASE, ir.FunctionType(_VOID, []))
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.atomic_rmw("sub", self.g["held"], ir.Constant(_I32, 1), "release")
        b.ret_void()

    def stop(self) -> None:
        """void stop(): tell every worker to leave its loop, and wake the sleeping ones."""
        fn = self.function(STOP, ir.FunctionType(_VOID, []))
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.store(b, "shutdown", ir.Constant(_I32, 1), "release")
        b.atomic_rmw("add", self.g["state"], ir.Constant(_I32, _GEN_ONE), "seq_cst")  # changes the futex word
        self.futex(b, "state", _FUTEX_WAKE_PRIVATE, ir.Constant(_I32, 2**31 - 1))
        b.ret_void()

    def build(self) -> str:
        size = ir.GlobalVariable(self.module, _I32, name="relay_tune_team_size")
        size.initializer = ir.Constant(_I32, 1)
        size.linkage = "internal"
        self.team_size = size
        self.thread_queries()
        self.worker(self.join())
        self.parallel()
        self.hold()
        self.release()
        self.stop()
        # the Python side reads and writes the globals: one accessor returning their addresses
        addresses = self.function("relay_tune_team_globals", ir.FunctionType(_VOID, [_I64.as_pointer()]))
        b = ir.IRBuilder(addresses.append_basic_block("entry"))
        for index, var in enumerate([*self.g.values(), size]):
            b.store(b.ptrtoint(var, _I64), b.gep(addresses.args[0], [ir.Constant(_I32, index)]))
        b.ret_void()
        return str(self.module)


# ---------------------------------------------------------------------------------------------------
# the team in this process
# ---------------------------------------------------------------------------------------------------


class NativeThreadTeam:
    """The process's native thread team. Its state is the JIT-compiled module's globals, so there is one per process
    (`relay_tune.codegen.jit.native_thread_team`); `start` sizes it, `stop` ends its workers.

    `symbols()` are the addresses of the three OpenMP entry points for `load_object` to import.
    """

    def __init__(self) -> None:
        if not native_team_supported():
            raise RelayTuneError(f"the native thread team needs Linux on one of {', '.join(sorted(_SYS_FUTEX))}; "
                                 f"this host is {platform.system()} on {platform.machine()}")
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        text = _TeamIR(_machine()).build()
        try:
            parsed = llvm.parse_assembly(text)
            parsed.verify()
        except RuntimeError as err:
            raise CompileError(f"LLVM rejected the thread team: {err}") from err
        target = llvm.Target.from_triple(llvm.get_process_triple())
        machine = target.create_target_machine(opt=2, reloc="pic", codemodel="small")
        obj = bytes(machine.emit_object(parsed))
        self._jit = llvm.create_lljit_compiler()
        exported = (PARALLEL, THREAD_NUM, NUM_THREADS, WORKER, JOIN, STOP, HOLD, RELEASE, "relay_tune_team_globals")
        builder = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
        for symbol in exported:
            builder.export_symbol(symbol)
        try:
            self._tracker = builder.link(self._jit, f"relay_tune_thread_team_{os.getpid()}")
        except RuntimeError as err:
            raise CompileError(f"cannot load the thread team: {err}") from err
        self._addresses = {symbol: int(self._tracker[symbol]) for symbol in exported}
        # The team lives as long as the process: its workers run in this code, and kernels linked against its entry
        # points may run until the very end. Never freed, so no teardown order can free the JIT before the library
        # it holds (a tracker does not keep its JIT alive; disposing of them in the wrong order corrupts the heap).
        self._tracker.detach()
        self._jit.detach()
        table = (ctypes.c_int64 * (len(_GLOBALS) + 1))()
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._addresses["relay_tune_team_globals"])(table)
        self._globals = {name: int(table[i]) for i, name in enumerate([*_GLOBALS, "size"])}
        libc = ctypes.CDLL(None, use_errno=True)
        key = ctypes.c_uint(0)
        if libc.pthread_key_create(ctypes.byref(key), None) != 0:
            raise RelayTuneError("the native thread team cannot create its thread-specific key")
        self._word("key").value = key.value
        self._worker = ctypes.CFUNCTYPE(None)(self._addresses[WORKER])  # ctypes releases the GIL for the call
        self._join = ctypes.CFUNCTYPE(ctypes.c_int32)(self._addresses[JOIN])
        self._stop = ctypes.CFUNCTYPE(None)(self._addresses[STOP])
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._config: tuple[int, int, int] | None = None  # (size, spin, workers) of the running team
        self._closed = False
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        # Workers are joined at exit, before interpreter teardown: none is left inside this code, or waiting for the
        # GIL that a finalizing interpreter no longer hands out (atexit runs before either).
        atexit.register(self.close)

    def _word(self, name: str) -> Any:
        kind = ctypes.c_int64 if name in _COUNTERS else ctypes.c_uint32
        return kind.from_address(self._globals[name])

    def symbols(self) -> dict[str, int]:
        """GOMP_parallel, omp_get_thread_num, omp_get_num_threads of this team."""
        return {name: self._addresses[name] for name in (PARALLEL, THREAD_NUM, NUM_THREADS)}

    def hold_symbols(self) -> tuple[int, int]:
        """Addresses of `void hold(void)` and `void release(void)`: a caller that runs parallel kernels back to back
        (the native executor, once per model run) brackets them with these, so that the workers are woken once, at
        its start, and spin until its end instead of sleeping between kernels. Holds from several threads nest."""
        return self._addresses[HOLD], self._addresses[RELEASE]

    @property
    def yields(self) -> int:
        """Times a spinning thread (an idle worker, or a caller waiting for workers) has yielded its core so far."""
        return int(self._word("yields").value)

    @property
    def sleeping(self) -> int:
        """Workers asleep (or about to sleep) on the team's futex now."""
        return int(self._word("sleepers").value)

    @property
    def held(self) -> int:
        """Holds in progress (0 between model runs)."""
        return int(self._word("held").value)

    @property
    def size(self) -> int:
        """Threads of a region (the caller and its workers); 1 before `start`."""
        return int(self._word("size").value)

    @property
    def workers(self) -> int:
        """Worker threads running."""
        return len(self._threads)

    @property
    def joins(self) -> int:
        """Thread numbers that workers have run so far (the caller's own and revoked ones are not counted)."""
        return int(self._word("joins").value)

    @property
    def started(self) -> bool:
        return self._config is not None

    @property
    def closed(self) -> bool:
        """Whether `close` ended the team for good (at exit): regions run on their caller alone from then on."""
        return self._closed

    @property
    def spin(self) -> int:
        """Idle spin iterations before a worker (or a caller waiting for workers) sleeps."""
        return int(self._word("spin").value)

    @spin.setter
    def spin(self, count: int) -> None:
        # workers read it at every idle iteration: takes effect at once, no restart
        self._word("spin").value = max(0, min(int(count), 2**31 - 1))

    def start(self, threads: int, spin: int, workers: int | None = None) -> None:
        """(Re)start the team: regions of up to `threads` threads, workers that spin `spin` pause iterations before
        they sleep. `workers` (default threads - 1) may be fewer: the caller then runs the numbers no worker takes
        (tests use this for a team whose workers never come)."""
        if not 1 <= threads <= MAX_TEAM:
            raise RelayTuneError(f"a native thread team has 1 to {MAX_TEAM} threads, not {threads}")
        count = threads - 1 if workers is None else workers
        if not 0 <= count <= threads - 1:
            raise RelayTuneError(f"a team of {threads} threads has 0 to {threads - 1} workers, not {count}")
        with self._lock:
            if self._closed:
                return  # the process is exiting: no new threads (regions still complete, on their callers)
            self._stop_workers()
            self.spin = spin
            self._word("size").value = threads
            self._start_workers(count)
            self._config = (threads, int(spin), count)

    def stop(self) -> None:
        """End the workers (a region begun later runs on its caller alone)."""
        with self._lock:
            self._stop_workers()
            self._config = None

    def close(self) -> None:
        """End the workers for good (the process is exiting): `start` does nothing afterwards. A thread still running
        regions completes them on its own."""
        with self._lock:
            self._closed = True
            self._stop_workers()
            self._config = None

    def join(self) -> bool:
        """Join the open region from this thread as a worker would: run the body under the next free thread number;
        False (and nothing run) when no region is open or every number is taken."""
        return bool(self._join())

    def _start_workers(self, count: int) -> None:
        for index in range(count):
            thread = threading.Thread(target=self._worker, name=f"relay_tune_team_{index + 1}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _stop_workers(self) -> None:
        if not self._threads:
            return
        self._stop()
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._word("shutdown").value = 0

    def _after_fork_in_child(self) -> None:
        """The parent's workers do not exist in a forked child, and a region another parent thread was running
        never ends here: start over with the same configuration."""
        self._lock = threading.Lock()
        self._threads = []
        self._closed = False
        for name in ("state", "sleepers", "done", "waiting", "busy", "shutdown", "held"):
            self._word(name).value = 0
        if self._config is not None:
            self._start_workers(self._config[2])
