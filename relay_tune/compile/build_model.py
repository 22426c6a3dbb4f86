"""`relay_tune.build`: compile a whole model into a `CompiledModel`, optionally checking its tuned records in the
graph."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from relay_tune.compile.build_cache import BuildCache, build_key, cached_build
from relay_tune.compile.check_tuned import check_tuned_records
from relay_tune.compile.pipeline import compile_model
from relay_tune.compile.target import resolve_target
from relay_tune.ir import Function, IRModule
from relay_tune.runtime.model import CompiledModel
from relay_tune.runtime.vm import VMModel
from relay_tune.target import Target


def build(
    mod: IRModule | Function,
    target: str | Target | None = "llvm",
    params: Mapping[str, Any] | None = None,
    logs: Any = None,
    opt_level: int = 3,
    *,
    jobs: int | None = None,
    require_tuned: bool = False,
    threading_runtime: str = "auto",
    check_tuned: bool = False,
    layout_planning: bool | None = None,
    winograd: str | None = None,
    kernel_cache: bool = True,
    build_cache: bool = True,
    full_range_int8: str | None = None,
    precision: str | None = None,
) -> CompiledModel | VMModel:
    """Compile `mod`'s `main` function into a `CompiledModel` (see `relay_tune.compile`); a program with control
    flow (`if`, calls of other global functions such as recursive loops, closures) into a `VMModel`, its kernels
    run by the virtual machine of `relay_tune.runtime.vm` (same interface: `run`, `benchmark`, `random_inputs`,
    `save`).

    target: "llvm" (this machine), a target string, or a `Target` (`resolve_target`).
    params: values for entry-function inputs, bound as constants (weights).
    logs: tuning log path(s) or a `ScheduleLookup`; tasks without a record use their default schedule.
    jobs: compile processes (default: one per core, at most 4, for models of 8 kernels or more; 1 compiles in this
        process).
    require_tuned: raise instead of warning when a task has no tuning record.
    check_tuned: also build the model with default schedules, time every task in both models where it runs (the
        executor's in-graph profile), and keep a tuned record only where its kernel is faster in the graph than
        the default's; the result is never slower end to end than the default build (CPU targets; see
        `check_tuned_records`). Costs a second build and a few model runs.
    layout_planning: plan channel-blocked activation layouts on CPU targets (`relay_tune.passes.PlanLayouts`);
        None: the pipeline's default (`relay_tune.passes.LAYOUT_PLANNING_DEFAULT`). Tuning must have used the same
        setting (`tune_model(..., layout_planning=...)`): the records are of the workloads it produces.
    winograd: which blocked 3x3 stride-1 convolutions run in Winograd form ("off", "auto", "on", "f2", "f4"; see
        `relay_tune.passes.winograd`); None: `relay_tune.passes.WINOGRAD_DEFAULT`. Like `layout_planning`, tuning
        must have used the same setting.
    kernel_cache: take object code compiled before on this machine from the per-user kernel cache, and store what
        is compiled there (`relay_tune.compile.kernel_cache`; `RELAY_TUNE_KERNEL_CACHE=0` turns it off everywhere).
    build_cache: load the finished model from the per-user build cache when the same module, weights, tuning
        records, target and options were built before on this machine, and store what is built there
        (`relay_tune.compile.build_cache`; `RELAY_TUNE_BUILD_CACHE=0` turns it off everywhere).
    full_range_int8: how int8 weights whose pairs would saturate vpmaddubsw are multiplied ("float", "dot4",
        "int16": `relay_tune.passes.PassConfig`); None: from the target (`relay_tune.passes.full_range_int8_mode`).
        Tuning derives it from the target, so records of another setting may not match.
    precision: "fp32" (None: the default), "bf16" (convolutions and dense products on bfloat16 weights and
        activations with float32 sums, vdpbf16ps; a target without AVX512_BF16 raises `UnsupportedError`) or
        "bf16-emulated" (the same products on any CPU, the pairs widened to float32: bf16's numerics without its
        speed); see `relay_tune.passes.bf16`. Tuning must have used the same precision: the bf16 tasks are other
        workloads.
    """
    options: dict[str, Any] = dict(jobs=jobs, require_tuned=require_tuned, threading_runtime=threading_runtime,
                                   layout_planning=layout_planning, winograd=winograd, kernel_cache=kernel_cache,
                                   full_range_int8=full_range_int8, precision=precision)

    checked = check_tuned and logs is not None

    def compile_it() -> CompiledModel | VMModel:
        if checked:
            return check_tuned_records(mod, target, params, logs, opt_level, **options)
        return compile_model(mod, target, params, logs, opt_level, **options)

    module = IRModule({"main": mod}) if isinstance(mod, Function) else mod
    cache = BuildCache.default() if build_cache and "main" in module else None
    if cache is not None:
        start = time.perf_counter()
        # What changes the code; `jobs`, `kernel_cache` and `threading_runtime` do not.
        decisive = dict(opt_level=opt_level, require_tuned=require_tuned, check_tuned=checked,
                        layout_planning=layout_planning, winograd=winograd, full_range_int8=full_range_int8,
                        precision=precision)
        key = build_key(module, resolve_target(target), params, logs, decisive)
        if key is not None:
            return cached_build(cache, key, compile_it, threading_runtime, start)
    return compile_it()
