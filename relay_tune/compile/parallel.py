"""Compiling a model's kernels: one LLVM module, or several compiled in parallel worker processes."""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Mapping, Sequence

from relay_tune.codegen.jit import KernelLibrary, KernelSignature, load_object
from relay_tune.codegen.llvm import compile_object
from relay_tune.compile.kernel_cache import KernelObjectCache
from relay_tune.errors import CompileError
from relay_tune.kernel import tir
from relay_tune.kernel.te import expr_children
from relay_tune.target import Target

PARALLEL_COMPILE_MIN_KERNELS = 8
"""Kernels from which a build compiles in worker processes by default (a fork costs a few milliseconds each)."""
CHUNKS_PER_JOB = 4
"""Modules per compile process: a worker that finishes one takes the next, so that no core idles while another
still compiles a module that was estimated smaller than it is."""


def default_jobs() -> int:
    """Parallel compile processes: one per core up to 4, when a model has enough kernels to split."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def compile_and_load(
    funcs: Sequence[tir.PrimFunc], target: Target, jobs: int | None, kernel_cache: bool, threading_runtime: str,
    timings: dict[str, float], start: float, digests: Mapping[str, str] | None = None,
) -> tuple[list[tuple[bytes, list[KernelSignature]]], list[KernelLibrary]]:
    """A model's kernels compiled (`compile_all`; `jobs` None: worker processes from
    `PARALLEL_COMPILE_MIN_KERNELS` kernels on, the per-user kernel cache when `kernel_cache`) and loaded into this
    process: the objects with their kernels' signatures, and the loaded libraries. Adds `llvm_s`, `load_s` and
    `total_s` to `timings` (seconds since `start`), and the code generator's stages summed over the modules
    compiled (`llvm_lower_s`, `llvm_parse_s`, `llvm_optimize_s`, `llvm_emit_s`: worker processes' seconds, which
    overlap in time). `digests`: kernels' loop-nest digests by name, where known (`KernelObjectCache.key`)."""
    if jobs is None:
        # Worker processes pay off from a handful of kernels on (a fork costs a few milliseconds each).
        jobs = default_jobs() if len(funcs) >= PARALLEL_COMPILE_MIN_KERNELS else 1
    cache = KernelObjectCache.default() if kernel_cache else None
    stages: dict[str, float] = {}
    chunks = compile_all(funcs, target, jobs, cache, digests, stages) if funcs else []
    t_compile = time.perf_counter()
    timings["llvm_s"] = t_compile - start - sum(timings.values())
    timings.update({f"llvm_{name}": seconds for name, seconds in stages.items()})
    objects = [(obj, [KernelSignature.from_primfunc(f) for f in chunk]) for obj, chunk in chunks]
    libraries = [load_object(obj, sigs, threading_runtime=threading_runtime) for obj, sigs in objects]
    timings["load_s"] = time.perf_counter() - t_compile
    timings["total_s"] = time.perf_counter() - start
    return objects, libraries


def compile_chunk(funcs: Sequence[tir.PrimFunc], target: Target) -> tuple[bytes, dict[str, float]]:
    """Object code of one LLVM module holding `funcs`, and the code generator's timings."""
    timings: dict[str, float] = {}
    obj = compile_object(funcs, target, timings=timings)
    return obj, timings


def compile_all(funcs: Sequence[tir.PrimFunc], target: Target, jobs: int,
                cache: KernelObjectCache | None = None,
                digests: Mapping[str, str] | None = None,
                stages: dict[str, float] | None = None) -> list[tuple[bytes, list[tir.PrimFunc]]]:
    """Object code for `funcs`: one module, or several (`_chunks`) compiled by `jobs` worker processes. Modules
    found in `cache` are not compiled again; the ones compiled are stored there. `stages`, when given, receives
    the code generator's seconds per stage (`compile_object`'s timings), summed over the modules compiled."""
    chunks = _chunks(funcs, max(1, min(jobs, len(funcs))))
    keys = [cache.key(chunk, target, digests) for chunk in chunks] if cache is not None else []
    objects: list[bytes | None] = [cache.load(k) for k in keys] if cache is not None else [None] * len(chunks)
    missing = [i for i, obj in enumerate(objects) if obj is None]
    for i, (obj, timings) in zip(missing, _compile_chunks([chunks[i] for i in missing], target, jobs)):
        objects[i] = obj
        if stages is not None:
            for name, seconds in timings.items():
                stages[name] = stages.get(name, 0.0) + seconds
        if cache is not None:
            cache.store(keys[i], obj)
    if cache is not None and missing:
        cache.prune()
    return [(obj, chunk) for obj, chunk in zip(objects, chunks) if obj is not None]


def _chunks(funcs: Sequence[tir.PrimFunc], jobs: int) -> list[list[tir.PrimFunc]]:
    """`funcs` in modules for `jobs` processes: one module for one process, else up to `CHUNKS_PER_JOB` per
    process, each kernel (most expensive first, by `compile_cost`) added to the module estimated cheapest so far;
    the modules come largest first, the order in which the workers take them."""
    if jobs == 1:
        return [list(funcs)]
    count = min(len(funcs), jobs * CHUNKS_PER_JOB)
    chunks: list[list[tir.PrimFunc]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for cost, func in sorted(((compile_cost(f), f) for f in funcs), key=lambda pair: -pair[0]):
        lightest = loads.index(min(loads))
        chunks[lightest].append(func)
        loads[lightest] += cost
    return [chunk for _, chunk in sorted(zip(loads, chunks), key=lambda pair: -pair[0])]


def _compile_chunks(chunks: Sequence[Sequence[tir.PrimFunc]], target: Target,
                    jobs: int) -> list[tuple[bytes, dict[str, float]]]:
    """One object per chunk, with the code generator's timings: in this process for one chunk or one job (or
    inside a daemonic process, which may not start children), else in up to `jobs` worker processes, each taking
    the next chunk when it finishes one."""
    if len(chunks) <= 1 or jobs <= 1 or multiprocessing.current_process().daemon:
        return [compile_chunk(chunk, target) for chunk in chunks]
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    # "fork": workers start at once, with everything imported; they only run LLVM on their own modules.
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(chunks)), mp_context=context) as pool:
            futures = [pool.submit(compile_chunk, chunk, target) for chunk in chunks]
            return [future.result() for future in futures]
    except concurrent.futures.process.BrokenProcessPool as err:
        raise CompileError(f"a compile worker process died ({err}); retry with jobs=1 to see why") from None


def compile_cost(func: tir.PrimFunc) -> float:
    """An estimate of the time LLVM takes over `func`, in no particular unit: the logarithm of the loads its
    statements perform as emitted (an unrolled loop's body once per iteration). Compile time grows far slower
    than the emitted code does (LLVM folds most of a large unrolled Winograd transform), hence the logarithm; the
    estimate only orders kernels, the workers' dynamic take-up of modules evens out what it misses."""
    return math.log2(2.0 + _emitted_loads(func.body))


def _emitted_loads(stmt: tir.Stmt) -> int:
    """Loads in `stmt` as the code generator emits them: an UNROLLED loop's body counts once per iteration."""
    if isinstance(stmt, tir.Seq):
        return sum(_emitted_loads(s) for s in stmt.stmts)
    if isinstance(stmt, tir.For):
        inner = _emitted_loads(stmt.body)
        return inner * stmt.extent if stmt.kind is tir.ForKind.UNROLLED else inner
    if isinstance(stmt, tir.Allocate):
        return _emitted_loads(stmt.body)
    if isinstance(stmt, tir.IfThenElse):
        return _emitted_loads(stmt.then_body) + (0 if stmt.else_body is None else _emitted_loads(stmt.else_body))
    if isinstance(stmt, tir.Store):
        return 1 + sum(isinstance(node, tir.Load) for node in _expr_nodes(stmt.value))
    return 1


def _expr_nodes(expr: tir.PrimExpr) -> list[tir.PrimExpr]:
    """The distinct nodes of `expr` (a sub-expression shared by several parents counts once)."""
    seen: set[int] = set()
    nodes, stack = [], [expr]
    while stack:  # an explicit stack: expression trees can be deeper than Python's recursion limit
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        stack.extend(expr_children(node))
    return nodes
