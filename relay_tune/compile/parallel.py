"""Compiling a model's kernels: one LLVM module, or several compiled in parallel worker processes."""

from __future__ import annotations

import concurrent.futures
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
from relay_tune.kernel.analysis import iter_stmts
from relay_tune.target import Target

PARALLEL_COMPILE_MIN_KERNELS = 8
"""Kernels from which a build compiles in worker processes by default (a fork costs a few milliseconds each)."""


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
    `total_s` to `timings` (seconds since `start`). `digests`: kernels' loop-nest digests by name, where known
    (`KernelObjectCache.key`)."""
    if jobs is None:
        # Worker processes pay off from a handful of kernels on (a fork costs a few milliseconds each).
        jobs = default_jobs() if len(funcs) >= PARALLEL_COMPILE_MIN_KERNELS else 1
    cache = KernelObjectCache.default() if kernel_cache else None
    chunks = compile_all(funcs, target, jobs, cache, digests) if funcs else []
    t_compile = time.perf_counter()
    timings["llvm_s"] = t_compile - start - sum(timings.values())
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
                digests: Mapping[str, str] | None = None) -> list[tuple[bytes, list[tir.PrimFunc]]]:
    """Object code for `funcs`: one module, or `jobs` modules of about equal size compiled in worker processes.
    Modules found in `cache` are not compiled again; the ones compiled are stored there."""
    chunks = _chunks(funcs, max(1, min(jobs, len(funcs))))
    keys = [cache.key(chunk, target, digests) for chunk in chunks] if cache is not None else []
    objects: list[bytes | None] = [cache.load(k) for k in keys] if cache is not None else [None] * len(chunks)
    missing = [i for i, obj in enumerate(objects) if obj is None]
    for i, obj in zip(missing, _compile_chunks([chunks[i] for i in missing], target)):
        objects[i] = obj
        if cache is not None:
            cache.store(keys[i], obj)
    if cache is not None and missing:
        cache.prune()
    return [(obj, chunk) for obj, chunk in zip(objects, chunks) if obj is not None]


def _chunks(funcs: Sequence[tir.PrimFunc], jobs: int) -> list[list[tir.PrimFunc]]:
    """`funcs` in `jobs` modules: dealt round-robin by estimated size, so each takes about as long to optimise."""
    if jobs == 1:
        return [list(funcs)]
    order = sorted(funcs, key=lambda f: -stmt_count(f.body))
    chunks: list[list[tir.PrimFunc]] = [[] for _ in range(jobs)]
    for i, func in enumerate(order):
        chunks[i % jobs].append(func)
    return chunks


def _compile_chunks(chunks: Sequence[Sequence[tir.PrimFunc]], target: Target) -> list[bytes]:
    """One object per chunk: in this process for one chunk (or inside a daemonic process, which may not start
    children), else in worker processes."""
    if len(chunks) <= 1 or multiprocessing.current_process().daemon:
        return [compile_chunk(chunk, target)[0] for chunk in chunks]
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    # "fork": workers start at once, with everything imported; they only run LLVM on their own modules.
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=len(chunks), mp_context=context) as pool:
            futures = [pool.submit(compile_chunk, chunk, target) for chunk in chunks]
            return [future.result()[0] for future in futures]
    except concurrent.futures.process.BrokenProcessPool as err:
        raise CompileError(f"a compile worker process died ({err}); retry with jobs=1 to see why") from None


def stmt_count(stmt: tir.Stmt) -> int:
    """Statements in a loop nest: the size estimate that balances the chunks."""
    return len(iter_stmts(stmt))
