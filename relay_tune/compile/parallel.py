"""Compiling a model's kernels: one LLVM module, or several compiled in parallel worker processes."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from collections.abc import Sequence

from relay_tune.codegen.llvm import compile_object
from relay_tune.errors import CompileError
from relay_tune.kernel import tir
from relay_tune.kernel.analysis import iter_stmts
from relay_tune.target import Target

PARALLEL_COMPILE_MIN_KERNELS = 8
"""Kernels from which a build compiles in worker processes by default (a fork costs a few milliseconds each)."""


def default_jobs() -> int:
    """Parallel compile processes: one per core up to 4, when a model has enough kernels to split."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def compile_chunk(funcs: Sequence[tir.PrimFunc], target: Target) -> tuple[bytes, dict[str, float]]:
    """Object code of one LLVM module holding `funcs`, and the code generator's timings."""
    timings: dict[str, float] = {}
    obj = compile_object(funcs, target, timings=timings)
    return obj, timings


def compile_all(funcs: Sequence[tir.PrimFunc], target: Target, jobs: int) -> list[tuple[bytes, list[tir.PrimFunc]]]:
    """Object code for `funcs`: one module, or `jobs` modules of about equal size compiled in worker processes."""
    jobs = max(1, min(jobs, len(funcs)))
    if multiprocessing.current_process().daemon:
        jobs = 1  # daemonic processes (e.g. pool workers) may not start children
    if jobs == 1:
        return [(compile_chunk(funcs, target)[0], list(funcs))]
    # Kernels dealt round-robin by estimated size, so each chunk takes about as long to optimise.
    order = sorted(funcs, key=lambda f: -stmt_count(f.body))
    chunks: list[list[tir.PrimFunc]] = [[] for _ in range(jobs)]
    for i, func in enumerate(order):
        chunks[i % jobs].append(func)
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    # "fork": workers start at once, with everything imported; they only run LLVM on their own modules.
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [pool.submit(compile_chunk, chunk, target) for chunk in chunks]
            return [(future.result()[0], chunk) for future, chunk in zip(futures, chunks)]
    except concurrent.futures.process.BrokenProcessPool as err:
        raise CompileError(f"a compile worker process died ({err}); retry with jobs=1 to see why") from None


def stmt_count(stmt: tir.Stmt) -> int:
    """Statements in a loop nest: the size estimate that balances the chunks."""
    return len(iter_stmts(stmt))
