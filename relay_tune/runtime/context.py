"""Timing a kernel in the context it runs in inside a model: its inputs just written by a parallel producer.

In a model, a kernel's activation inputs were written by the kernel before it, on every thread of the team: each
core holds its share of the lines dirty in its own cache. Called back to back on one buffer, as a timing loop calls
it, a kernel finds its inputs in the reading core's own cache instead; memory-bound kernels (pooling, Winograd
transforms, layout transforms) then ran 1.5-3x faster than in the model. So between two timed calls the timing loop
here runs a *producer step*, untimed: every thread of the persistent thread team (the one the kernels use,
`relay_tune.codegen.jit`) writes its share of each input buffer, as a parallel producer would, and the buffers the
kernel writes can be evicted from every cache first (clflush), as arena memory the rest of a model has pushed out
since it was last used (which buffers, and which thread writes which share: the runner's `context_step`). It copies
the values from a copy saved when the step was set up, so the kernel reads the same inputs at every call, the ones
its outputs were checked with (even a kernel that wrote into its inputs would find them restored), and each line
ends up dirty in the cache of the core that wrote it. The copy is made of volatile 64-byte loads and stores: a plain
loop LLVM turns into `memcpy`, whose large copies write around the caches.

One native function does the whole loop (no Python between calls), and takes a timestamp right before and right
after each kernel call, as the model's profiler does (`relay_tune.runtime.executor`, `run_profiled`), so only the
kernel's own time is summed:

    uint64 relay_tune_context_loop(repeat_fn, rows, row_bytes, nrows, first_row, count, touch, ntouch)
        for i in 0..count:
            produce(touch, ntouch)                          // untimed: every thread rewrites its share
            t0 = now(); repeat_fn(rows + ((first_row + i) % nrows) * row_bytes, 1); total += now() - t0
        return total                                        // nanoseconds

`rows` is a table of argument vectors (`void*[]`): one row per copy of the kernel's weights when the runner rotates
them (cold weights), else one row. `touch` lists (source, destination, bytes, chunk, shift, mode) rows: what the
producer step writes, and which thread writes which part (`production`); mode says whether a buffer is copied,
evicted (clflush) or only read (a scratch buffer each thread streams to push the kernel's outputs out of its core's
private caches into the shared one, without sending them to memory as clflush does).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np

from relay_tune.codegen.jit import _jit_lock, _lljit, aligned_empty, resolve_threading_runtime, threading_imports
from relay_tune.codegen.llvm import ensure_llvm_initialized
from relay_tune.errors import CompileError

__all__ = ["CONTEXT_LOOP", "COPY", "EVICT", "NOOP", "PRODUCE", "READ", "TOUCH_COLUMNS", "ContextLoop", "Production",
           "context_ir", "context_loop", "private_cache_bytes", "production", "scratch", "team_size"]

CONTEXT_LOOP = "relay_tune_context_loop"
PRODUCE = "relay_tune_context_produce"
NOOP = "relay_tune_context_noop"
TOUCH_COLUMNS = 6  # per buffer: source, destination, bytes, chunk bytes, shift, mode
# What the step does with a buffer's lines (the `mode` column): copy them from the source, evict them from every cache
# (clflush), or read them (a scratch buffer streamed through the private caches, pushing out what they held).
COPY, EVICT, READ = 0, 1, 2
LINE = 64  # bytes: the producer copies (or evicts) one cache line at a time
CLOCK_MONOTONIC = 1  # Linux

_ids = itertools.count()
_lock = threading.Lock()
_loops: dict[bool, ContextLoop] = {}


_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_I8P, _I64P = _I8.as_pointer(), _I64.as_pointer()
_VOID = ir.VoidType()
# the producer body's argument: {i64* touch, i64 ntouch}, `TOUCH_COLUMNS` values per buffer (see `production`)
_DATA_TYPE = ir.LiteralStructType([_I64P, _I64])
_LINE_TYPE = ir.VectorType(_I64, LINE // 8)
_REPEAT_TYPE = ir.FunctionType(_VOID, [_I8P, _I64])  # a kernel's repeat entry: (argument vector, repeat count)
_TIMESPEC = ir.LiteralStructType([_I64, _I64])


def _i64(value: int) -> ir.Constant:
    """An i64 constant."""
    return ir.Constant(_I64, value)


def _field(b: ir.IRBuilder, struct: ir.Value, index: int) -> ir.Value:
    """A pointer to field `index` of the struct `struct` points to."""
    return b.gep(struct, [ir.Constant(_I32, 0), ir.Constant(_I32, index)])


@dataclass(frozen=True)
class _Team:
    """The calling thread's place in the team that runs the producer step."""

    thread: ir.Value  # its number, 0 .. size - 1
    size: ir.Value
    is_last: ir.Value  # i1: whether it is thread size - 1


@dataclass(frozen=True)
class _BodyBlocks:
    """The producer body's loop blocks: over buffers, over this thread's chunks of one, over a chunk's lines, and
    over the bytes after the last whole line."""

    entry: ir.Block
    buffers: ir.Block
    chunks: ir.Block
    lines: ir.Block
    next_chunk: ir.Block
    after_lines: ir.Block
    tail: ir.Block
    next_buffer: ir.Block
    done: ir.Block


@dataclass(frozen=True)
class _TouchRow:
    """One row of the touch list as the body loads it, with how its lines split into chunks among the team."""

    index: ir.PhiInstr  # the row's number
    source: ir.Value  # i8*
    destination: ir.Value  # i8*
    nbytes: ir.Value
    mode: ir.Value  # COPY, EVICT or READ
    lines: ir.Value  # whole lines in the buffer
    chunk: ir.Value  # lines per chunk
    first: ir.Value  # this thread's first chunk


@dataclass(frozen=True)
class _Chunk:
    """One of this thread's chunks of a buffer: lines low .. high - 1."""

    number: ir.PhiInstr
    low: ir.Value
    high: ir.Value


def context_ir(parallel: bool) -> str:
    """LLVM IR of the producer step and the timing loop. `parallel`: the producer runs on the kernels' thread team
    (`GOMP_parallel`); False: on the calling thread alone (where only the Python team is available)."""
    module = ir.Module(name="relay_tune_context")
    body = _emit_body(module, parallel, _can_evict())
    produce = _emit_produce(module, body, parallel)
    _emit_loop(module, produce)
    # a kernel that does nothing: timed around it, the loop costs what it adds besides the kernel (producer step,
    # timestamps; experiments/README.md, "Kernels timed in their model context", compares subtracting that)
    noop = ir.Function(module, _REPEAT_TYPE, name=NOOP)
    ir.IRBuilder(noop.append_basic_block("entry")).ret_void()
    return _volatile(str(module))


def _emit_body(module: ir.Module, parallel: bool, evicts: bool) -> ir.Function:
    """body(data), the function each thread of the team runs: it copies its share of every buffer of the touch list
    in `data` (or evicts or reads it), 64 bytes (a cache line) at a time."""
    body = ir.Function(module, ir.FunctionType(_VOID, [_I8P]), name="relay_tune_context_body")
    body.linkage = "internal"
    b = ir.IRBuilder(body.append_basic_block("entry"))
    data = b.bitcast(body.args[0], _DATA_TYPE.as_pointer())
    touch = b.load(_field(b, data, 0))
    ntouch = b.load(_field(b, data, 1))
    clflush = ir.Function(module, ir.FunctionType(_VOID, [_I8P]), name="llvm.x86.sse2.clflush") if evicts else None
    team = _emit_team(module, b, parallel)
    blocks = _append_body_blocks(body, b.block)
    b.cbranch(b.icmp_signed(">", ntouch, _i64(0)), blocks.buffers, blocks.done)

    b.position_at_end(blocks.buffers)
    row = _emit_touch_row(b, blocks, touch, team)
    b.cbranch(b.icmp_signed("<", b.mul(row.first, row.chunk), row.lines), blocks.chunks, blocks.after_lines)
    chunk = _emit_chunk(b, blocks, row)
    _emit_lines(b, body, blocks, row, chunk, clflush)

    b.position_at_end(blocks.next_chunk)
    following_chunk = b.add(chunk.number, team.size)
    chunk.number.add_incoming(following_chunk, blocks.next_chunk)
    b.cbranch(b.icmp_signed("<", b.mul(following_chunk, row.chunk), row.lines), blocks.chunks, blocks.after_lines)

    _emit_tail(b, body, blocks, row, team, clflush)
    b.position_at_end(blocks.next_buffer)
    index_next = b.add(row.index, _i64(1))
    row.index.add_incoming(index_next, blocks.next_buffer)
    b.cbranch(b.icmp_signed("<", index_next, ntouch), blocks.buffers, blocks.done)
    b.position_at_end(blocks.done)
    b.ret_void()
    return body


def _emit_team(module: ir.Module, b: ir.IRBuilder, parallel: bool) -> _Team:
    """The calling thread's number and team size: the team's where `parallel`, else thread 0 of 1."""
    if parallel:
        thread_num = ir.Function(module, ir.FunctionType(_I32, []), name="omp_get_thread_num")
        num_threads = ir.Function(module, ir.FunctionType(_I32, []), name="omp_get_num_threads")
        thread = b.sext(b.call(thread_num, []), _I64)
        size = b.sext(b.call(num_threads, []), _I64)
    else:
        thread, size = _i64(0), _i64(1)
    return _Team(thread, size, b.icmp_signed("==", thread, b.sub(size, _i64(1))))


def _append_body_blocks(body: ir.Function, entry: ir.Block) -> _BodyBlocks:
    """The body's loop blocks, appended to it after `entry`."""
    names = ("buffers", "chunks", "lines", "next_chunk", "after_lines", "tail", "next_buffer", "done")
    return _BodyBlocks(entry, *(body.append_basic_block(name) for name in names))


def _emit_touch_row(b: ir.IRBuilder, blocks: _BodyBlocks, touch: ir.Value, team: _Team) -> _TouchRow:
    """Loads of the next row of the touch list, and its split into chunks. A buffer's lines come in chunks of `chunk`
    bytes, chunk j written by thread (j + shift) % team; chunk 0: one contiguous share per thread, as a parallel loop
    splits its iterations."""
    index = b.phi(_I64)
    index.add_incoming(_i64(0), blocks.entry)
    row = b.mul(index, _i64(TOUCH_COLUMNS))
    source = b.inttoptr(b.load(b.gep(touch, [row])), _I8P)
    destination = b.inttoptr(b.load(b.gep(touch, [b.add(row, _i64(1))])), _I8P)
    nbytes = b.load(b.gep(touch, [b.add(row, _i64(2))]))
    chunk_bytes = b.load(b.gep(touch, [b.add(row, _i64(3))]))
    shift = b.load(b.gep(touch, [b.add(row, _i64(4))]))
    mode = b.load(b.gep(touch, [b.add(row, _i64(5))]))
    lines = b.lshr(nbytes, _i64(6))
    share = b.sdiv(b.add(lines, b.sub(team.size, _i64(1))), team.size)
    chunk_lines = b.lshr(chunk_bytes, _i64(6))
    chunk = b.select(b.icmp_signed(">", chunk_lines, _i64(0)), chunk_lines, share)
    first = b.srem(b.add(b.sub(team.thread, b.srem(shift, team.size)), team.size), team.size)
    return _TouchRow(index, source, destination, nbytes, mode, lines, chunk, first)


def _emit_chunk(b: ir.IRBuilder, blocks: _BodyBlocks, row: _TouchRow) -> _Chunk:
    """The chunks block: the bounds of this thread's next chunk of the buffer."""
    b.position_at_end(blocks.chunks)
    number = b.phi(_I64)
    number.add_incoming(row.first, blocks.buffers)
    low = b.mul(number, row.chunk)
    high_wanted = b.add(low, row.chunk)
    high = b.select(b.icmp_signed("<", high_wanted, row.lines), high_wanted, row.lines)
    b.branch(blocks.lines)
    return _Chunk(number, low, high)


def _emit_lines(b: ir.IRBuilder, body: ir.Function, blocks: _BodyBlocks, row: _TouchRow, chunk: _Chunk,
                clflush: ir.Function | None) -> None:
    """The loop over a chunk's lines: each one copied, evicted or read, as the row's mode says."""
    b.position_at_end(blocks.lines)
    line = b.phi(_I64)
    line.add_incoming(chunk.low, blocks.chunks)
    offset = b.mul(line, _i64(LINE))
    copy_line = body.append_basic_block("copy_line")
    other_line = body.append_basic_block("other_line")
    read_line = body.append_basic_block("read_line")
    line_done = body.append_basic_block("line_done")
    b.cbranch(b.icmp_signed("==", row.mode, _i64(COPY)), copy_line, other_line)
    b.position_at_end(other_line)
    if clflush is not None:
        evict_line = body.append_basic_block("evict_line")
        b.cbranch(b.icmp_signed("==", row.mode, _i64(EVICT)), evict_line, read_line)
        b.position_at_end(evict_line)
        b.call(clflush, [b.gep(row.destination, [offset])])
        b.branch(line_done)
    else:
        b.branch(read_line)  # `production` writes no evict rows where there is no clflush
    b.position_at_end(read_line)
    b.load(b.bitcast(b.gep(row.destination, [offset]), _LINE_TYPE.as_pointer()), name=_READ_LOAD, align=1)
    b.branch(line_done)
    b.position_at_end(copy_line)
    value = b.load(b.bitcast(b.gep(row.source, [offset]), _LINE_TYPE.as_pointer()), name=_LINE_LOAD, align=1)
    b.store(value, b.bitcast(b.gep(row.destination, [offset]), _LINE_TYPE.as_pointer()), align=1)
    b.branch(line_done)
    b.position_at_end(line_done)
    following = b.add(line, _i64(1))
    line.add_incoming(following, line_done)
    b.cbranch(b.icmp_signed("<", following, chunk.high), blocks.lines, blocks.next_chunk)


def _emit_tail(b: ir.IRBuilder, body: ir.Function, blocks: _BodyBlocks, row: _TouchRow, team: _Team,
               clflush: ir.Function | None) -> None:
    """The bytes after the buffer's last whole line: the last thread's, whose share ends there."""
    b.position_at_end(blocks.after_lines)
    tail_start = b.mul(row.lines, _i64(LINE))
    # only a copied buffer has a source to copy its tail from (a read buffer is whole lines: `scratch`)
    has_tail = b.and_(b.and_(team.is_last, b.icmp_signed("<", tail_start, row.nbytes)),
                      b.icmp_signed("==", row.mode, _i64(COPY)))
    if clflush is not None:
        # an evicted buffer's last line (the buffer need not start on a line) is evicted instead
        evict_tail = body.append_basic_block("evict_tail")
        copy_tail = body.append_basic_block("copy_tail")
        b.cbranch(b.and_(team.is_last, b.icmp_signed("==", row.mode, _i64(EVICT))), evict_tail, copy_tail)
        b.position_at_end(evict_tail)
        b.call(clflush, [b.gep(row.destination, [b.sub(row.nbytes, _i64(1))])])
        b.branch(blocks.next_buffer)
        b.position_at_end(copy_tail)
    tail_entry = b.block
    b.cbranch(has_tail, blocks.tail, blocks.next_buffer)
    b.position_at_end(blocks.tail)
    byte = b.phi(_I64)
    byte.add_incoming(tail_start, tail_entry)
    b.store(b.load(b.gep(row.source, [byte]), name=_BYTE_LOAD), b.gep(row.destination, [byte]))
    byte_next = b.add(byte, _i64(1))
    byte.add_incoming(byte_next, blocks.tail)
    b.cbranch(b.icmp_signed("<", byte_next, row.nbytes), blocks.tail, blocks.next_buffer)


def _emit_produce(module: ir.Module, body: ir.Function, parallel: bool) -> ir.Function:
    """produce(touch, ntouch): runs `body` on the touch list, on the kernels' thread team where `parallel`."""
    produce = ir.Function(module, ir.FunctionType(_VOID, [_I64P, _I64]), name=PRODUCE)
    b = ir.IRBuilder(produce.append_basic_block("entry"))
    slot = b.alloca(_DATA_TYPE)
    b.store(produce.args[0], _field(b, slot, 0))
    b.store(produce.args[1], _field(b, slot, 1))
    if parallel:
        gomp_parallel = ir.Function(module, ir.FunctionType(_VOID, [body.type, _I8P, _I32, _I32]),
                                    name="GOMP_parallel")
        # 0 threads: the team's default size, the team the kernels' parallel loops run on
        b.call(gomp_parallel, [body, b.bitcast(slot, _I8P), ir.Constant(_I32, 0), ir.Constant(_I32, 0)])
    else:
        b.call(body, [b.bitcast(slot, _I8P)])
    b.ret_void()
    return produce


def _emit_loop(module: ir.Module, produce: ir.Function) -> None:
    """loop(repeat_fn, rows, row_bytes, nrows, first_row, count, touch, ntouch) -> nanoseconds in the kernel."""
    clock_gettime = ir.Function(module, ir.FunctionType(_I32, [_I32, _TIMESPEC.as_pointer()]), name="clock_gettime")
    loop_fn = ir.Function(module, ir.FunctionType(_I64, [_REPEAT_TYPE.as_pointer(), _I8P, _I64, _I64, _I64, _I64,
                                                         _I64P, _I64]), name=CONTEXT_LOOP)
    repeat_fn, rows, row_bytes, nrows, first_row, count, touch, ntouch = loop_fn.args
    entry = loop_fn.append_basic_block("entry")
    body_block = loop_fn.append_basic_block("call")
    exit_block = loop_fn.append_basic_block("exit")
    b = ir.IRBuilder(entry)
    stamp = b.alloca(_TIMESPEC)
    b.cbranch(b.icmp_signed(">", count, _i64(0)), body_block, exit_block)
    b.position_at_end(body_block)
    i = b.phi(_I64)
    total = b.phi(_I64)
    i.add_incoming(_i64(0), entry)
    total.add_incoming(_i64(0), entry)
    b.call(produce, [touch, ntouch])
    row = b.urem(b.add(first_row, i), nrows)
    args = b.gep(rows, [b.mul(row, row_bytes)])
    before = _emit_now(b, clock_gettime, stamp)
    b.call(repeat_fn, [args, _i64(1)])
    after = _emit_now(b, clock_gettime, stamp)
    total_next = b.add(total, b.sub(after, before))
    i_next = b.add(i, _i64(1))
    i.add_incoming(i_next, body_block)
    total.add_incoming(total_next, body_block)
    b.cbranch(b.icmp_signed("<", i_next, count), body_block, exit_block)
    b.position_at_end(exit_block)
    result = b.phi(_I64)
    result.add_incoming(_i64(0), entry)
    result.add_incoming(total_next, body_block)
    b.ret(result)


def _emit_now(b: ir.IRBuilder, clock_gettime: ir.Function, stamp: ir.Value) -> ir.Value:
    """The monotonic clock, in nanoseconds, read through the timespec `stamp`."""
    b.call(clock_gettime, [ir.Constant(_I32, CLOCK_MONOTONIC), stamp])
    seconds = b.load(_field(b, stamp, 0))
    nanos = b.load(_field(b, stamp, 1))
    return b.add(b.mul(seconds, _i64(1_000_000_000)), nanos)


_LINE_LOAD = "relay_tune_line"
_BYTE_LOAD = "relay_tune_byte"
_READ_LOAD = "relay_tune_read"


def _volatile(text: str) -> str:
    """Make the producer's loads and stores volatile. llvmlite's builder cannot say so, and without it LLVM turns
    the copy loops into a call of `memcpy`, which on large buffers writes around the caches (non-temporal stores):
    the lines would not end up in the writing cores' caches as a producer kernel's output does."""
    for name, kind in ((_LINE_LOAD, f"<{LINE // 8} x i64>"), (_BYTE_LOAD, "i8")):
        load, store = f'%"{name}" = load {kind}, ', f'store {kind} %"{name}", '
        if text.count(load) != 1 or text.count(store) != 1:
            raise CompileError("the timing loop's IR does not have the expected producer loads and stores")
        text = text.replace(load, f'%"{name}" = load volatile {kind}, ')
        text = text.replace(store, f'store volatile {kind} %"{name}", ')
    # the scratch reads: a load whose value nothing uses, which LLVM would delete unless it is volatile
    read = f'%"{_READ_LOAD}" = load <{LINE // 8} x i64>, '
    if text.count(read) != 1:
        raise CompileError("the timing loop's IR does not have the expected scratch read")
    return text.replace(read, f'%"{_READ_LOAD}" = load volatile <{LINE // 8} x i64>, ')


@functools.cache  # the host does not change: asked once per kernel the runner times
def _can_evict() -> bool:
    """Whether this host has an instruction that evicts a line from every cache (x86's clflush)."""
    return llvm.get_process_triple().split("-")[0] in ("x86_64", "i386", "i686")


class ContextLoop:
    """The JIT-linked producer step and timing loop (one per process and threading mode: `context_loop`)."""

    def __init__(self, parallel: bool) -> None:
        self.parallel = parallel
        ensure_llvm_initialized()
        try:
            parsed = llvm.parse_assembly(context_ir(parallel))
            parsed.verify()
        except RuntimeError as err:
            raise CompileError(f"LLVM rejected the timing loop: {err}") from err
        triple = llvm.get_process_triple()
        machine = llvm.Target.from_triple(triple).create_target_machine(opt=2, reloc="pic", codemodel="small")
        obj = bytes(machine.emit_object(parsed))
        with _jit_lock:
            builder = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
            imports, self._team = threading_imports(obj)
            for symbol, address in imports.items():
                builder.import_symbol(symbol, address)
            for symbol in (CONTEXT_LOOP, PRODUCE, NOOP):
                builder.export_symbol(symbol)
            try:
                self._tracker = builder.link(_lljit(), f"relay_tune_context_{os.getpid()}_{next(_ids)}")
            except RuntimeError as err:
                raise CompileError(f"cannot load the timing loop: {err}") from err
        self._loop = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                      ctypes.c_int64)(self._tracker[CONTEXT_LOOP])
        self._produce = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(self._tracker[PRODUCE])
        self.noop = int(self._tracker[NOOP])  # the address of a repeat entry that does nothing

    def produce(self, step: Production) -> None:
        """Run the producer step once."""
        self._produce(step.table.ctypes.data, len(step.table))

    def run(self, repeat_entry: Any, rows: np.ndarray, first_row: int, count: int, step: Production) -> int:
        """`count` calls of `repeat_entry` (a kernel's `name__repeat`, as a ctypes function or an address), call i
        on row (first_row + i) % len(rows) of the argument table `rows` (uint64, C order), each after the producer
        step `step`; the nanoseconds the calls themselves took, summed."""
        address = repeat_entry if isinstance(repeat_entry, int) else ctypes.cast(repeat_entry, ctypes.c_void_p).value
        return int(self._loop(address, rows.ctypes.data, rows.strides[0], len(rows), first_row, count,
                              step.table.ctypes.data, len(step.table)))


def context_loop() -> ContextLoop:
    """This process's timing loop: the producer on the kernels' thread team (`load_object`'s default runtime), on
    the caller alone where that is the Python team."""
    parallel = resolve_threading_runtime("auto") != "python"
    with _lock:
        loop = _loops.get(parallel)
        if loop is None:
            loop = _loops[parallel] = ContextLoop(parallel)
        return loop


@dataclass
class Production:
    """What the producer step writes: each buffer from a saved copy of its values, or evicts (`table`: one row of
    `TOUCH_COLUMNS` int64 per buffer). Holds the copies; the buffers must outlive it."""

    table: np.ndarray
    sources: list[np.ndarray]


@functools.cache  # read once per process: the runner asks for every kernel it times
def private_cache_bytes() -> int:
    """The size of a core's largest private cache (L2 on most x86 hosts; sysfs), 2 MiB where it cannot be read."""
    cpu = Path("/sys/devices/system/cpu/cpu0")
    best = 0
    try:
        core = _cpus((cpu / "topology" / "thread_siblings_list").read_text())
        for index in sorted((cpu / "cache").glob("index*")):
            size = (index / "size").read_text().strip()
            # one core's own cache: shared by that core's hardware threads at most
            if _cpus((index / "shared_cpu_list").read_text()) <= core:
                scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
                best = max(best, int(size.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        pass
    return best or 2 << 20


def _cpus(text: str) -> set[int]:
    """A sysfs CPU list ("0-3,8") as a set."""
    found: set[int] = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def team_size() -> int:
    """Threads in the kernels' default team: OMP_NUM_THREADS where set, else the CPUs this process may run on."""
    wanted = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(wanted) if wanted.isdigit() and int(wanted) > 0 else len(os.sched_getaffinity(0))


_scratch: dict[tuple[int, int], np.ndarray] = {}


def scratch(per_thread: int, threads: int) -> np.ndarray:
    """This process's scratch buffer for aging outputs: `threads` regions of `per_thread` bytes (whole lines)."""
    per_thread = -(-per_thread // LINE) * LINE
    with _lock:
        buffer = _scratch.get((per_thread, threads))
        if buffer is None:
            # line-aligned (the step reads whole lines only) and written once, so that its pages are real memory
            # rather than the kernel's shared zero page, which reading would leave in cache
            buffer = _scratch[(per_thread, threads)] = aligned_empty(per_thread * threads, "uint8", LINE)
            buffer.fill(1)
        return buffer


def production(buffers: Sequence[np.ndarray], chunk: int = 0, shift: int = 0,
               evicted: Sequence[np.ndarray] = (), private_evict: int = 0) -> Production:
    """The producer step for `buffers` (C-contiguous; empty ones left out): each rewritten from a copy of the values
    it holds now, so the kernel reads the same inputs at every call, whatever it did to them. `chunk` (bytes, a
    multiple of 64) and `shift`: chunk j of each buffer is written by thread (j + shift) % team; chunk 0: one
    contiguous share per thread. `evicted`: buffers whose lines the step evicts from every cache first (clflush,
    where the host has it; elsewhere they are left alone), as memory the rest of a model has since pushed out.
    `private_evict` (bytes): before anything else each thread reads that many bytes of a scratch region of its own,
    pushing what its core's private caches held (the kernel's outputs from its previous call) out to the shared
    cache, as arena memory a few kernels of a model used last; about twice the private cache (`private_cache_bytes`)
    empties it. The scratch is only read: no buffer but those in `buffers` is ever written."""
    if chunk < 0 or chunk % LINE:
        raise ValueError(f"a producer chunk is a whole number of {LINE}-byte lines, not {chunk} bytes")
    rows: list[tuple[int, ...]] = []
    kept: list[np.ndarray] = []
    if private_evict > 0:
        # thread t reads chunk t (shift 0), its own region: both cores' caches fill with scratch lines
        threads = team_size()
        region = scratch(private_evict, threads)
        kept.append(region)
        rows.append((0, region.ctypes.data, region.nbytes, region.nbytes // threads, 0, READ))
    if _can_evict():
        rows += [(0, b.ctypes.data, b.nbytes, 0, 0, EVICT) for b in evicted if b.nbytes]
    chosen = [b for b in buffers if b.nbytes]
    sources = [np.array(b, copy=True, order="C") for b in chosen]
    rows += [(s.ctypes.data, b.ctypes.data, b.nbytes, chunk, shift, COPY) for s, b in zip(sources, chosen)]
    return Production(np.asarray(rows, dtype=np.int64).reshape(-1, TOUCH_COLUMNS), sources + kept)
