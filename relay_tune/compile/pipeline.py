"""The model compiler's pipeline: graph passes, tasks, graph plan, one compile, loaded model.

`compile_model` is `relay_tune.build` without the in-graph check of tuned records (`check_tuned`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from relay_tune.compile.lookup import BuildWarning, TaskLookup, task_lookup
from relay_tune.compile.parallel import compile_and_load
from relay_tune.compile.params import bind_params
from relay_tune.compile.planner import Planner
from relay_tune.compile.target import resolve_target
from relay_tune.compile.task_list import ModelTasks, model_tasks
from relay_tune.compile.tasks import LoweredCache, LoweredTask, lower_one, placeholder_task, slug
from relay_tune.compile.vm_compiler import compile_vm_model, needs_vm
from relay_tune.errors import RelayTuneError
from relay_tune.ir import Function, IRModule
from relay_tune.kernel import tir
from relay_tune.passes import full_range_int8_mode, layout_block, optimize, precision_mode
from relay_tune.resources import check_memory
from relay_tune.runtime.cuda import gpu_model_from_plan
from relay_tune.runtime.model import CompiledModel, GraphPlan, TaskInfo, host_triple
from relay_tune.runtime.pages import numpy_small_pages
from relay_tune.runtime.vm import VMModel
from relay_tune.target import Target
from relay_tune.type_infer import infer_types

KERNEL_NAME_LIMIT = 48


def compile_model(
    mod: IRModule | Function,
    target: str | Target | None = "llvm",
    params: Mapping[str, Any] | None = None,
    logs: Any = None,
    opt_level: int = 3,
    *,
    jobs: int | None = None,
    require_tuned: bool = False,
    threading_runtime: str = "auto",
    layout_planning: bool | None = None,
    winograd: str | None = None,
    kernel_cache: bool = True,
    full_range_int8: str | None = None,
    precision: str | None = None,
) -> CompiledModel | VMModel:
    """Compile `mod`'s `main` function into a `CompiledModel`, or a `VMModel` when it has control flow (the
    arguments are `relay_tune.build`'s)."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    resolved = resolve_target(target)
    mode = precision_mode(precision, resolved)  # before anything is compiled: a clear error for bf16 without it
    lookup = task_lookup(logs)
    if isinstance(mod, Function):
        mod = IRModule({"main": mod})
    if "main" not in mod:
        raise RelayTuneError("the module has no @main function to build")
    # The passes and the plan write the weights several times over (folded, laid out, Winograd-transformed),
    # each copy written once and dropped: on small pages (`numpy_small_pages`). The model's constants and arena
    # are allocated after the block (`CompiledModel`, `compile_vm_model`), on huge pages where kernels want them.
    with numpy_small_pages():
        mod = infer_types(mod)
        mod = infer_types(bind_params(mod, params or {}))
        fused = optimize(mod, opt_level=opt_level, layout_block=layout_block(resolved, layout_planning),
                         winograd=winograd, full_range_int8=full_range_int8 or full_range_int8_mode(resolved),
                         precision=mode)
        timings["passes_s"] = time.perf_counter() - start

        found = model_tasks(fused, resolved)
        lowered = _lower_tasks(found, resolved, lookup, require_tuned,
                               LoweredCache.default() if kernel_cache else None)
        timings["lower_s"] = time.perf_counter() - start - sum(timings.values())
    if needs_vm(fused):  # control flow: kernels under a virtual machine instead of a static graph plan
        return compile_vm_model(fused, lowered, found.sites, resolved, jobs=jobs,
                                threading_runtime=threading_runtime, kernel_cache=kernel_cache, timings=timings,
                                start=start, opt_level=opt_level)

    task_list = [t for t in lowered.values() if t.key not in found.in_place]
    with numpy_small_pages():
        plan, constants, packers = _plan(fused["main"], found, lowered, task_list, resolved)
    timings["plan_s"] = time.perf_counter() - start - sum(timings.values())

    called = {c.kernel for c in plan.calls}
    funcs = [t.primfunc for t in task_list if not t.alias and t.kernel_name in called]
    funcs += [f for f in packers if f.name in called]
    if resolved.kind == "cuda":
        return gpu_model_from_plan(plan, funcs, constants, resolved, timings, start)  # type: ignore[return-value]
    digests = {t.kernel_name: t.digest for t in task_list if t.digest}
    objects, libraries = compile_and_load(funcs, resolved, jobs, kernel_cache, threading_runtime, timings, start,
                                          digests)
    info: dict[str, Any] = {
        "triple": host_triple(),
        "opt_level": opt_level,
        "precision": precision or "fp32",
        "timings": timings,
        "kernels": len(funcs),
        "tuned_tasks": sum(t.tuned for t in task_list),
        "default_tasks": sum(not t.tuned and not t.alias for t in task_list),
        "alias_tasks": sum(t.alias for t in task_list),
        "lower_seconds": {t.key: t.lower_seconds for t in task_list},
    }
    return CompiledModel(plan, objects, constants, resolved, info, threading_runtime, libraries=libraries)


def _lower_tasks(
    found: ModelTasks, target: Target, lookup: TaskLookup | None, require_tuned: bool,
    cache: LoweredCache | None = None,
) -> dict[str, LoweredTask]:
    """Every task lowered (tuned where `lookup` has a record; read from `cache` where lowered before), by key;
    tasks without a record are named in one warning (an error with `require_tuned`)."""
    lowered: dict[str, LoweredTask] = {}
    untuned: list[str] = []
    for number, spec in enumerate(found.specs):
        if spec.key in found.in_place:  # written in place by its producers wherever it runs: nothing to compile
            lowered[spec.key] = placeholder_task(spec)
            continue
        kernel_name = f"k{number}_{slug(spec.description)}"[:KERNEL_NAME_LIMIT]
        lowered[spec.key] = lower_one(spec, target, lookup, kernel_name, untuned, view=spec.key in found.views,
                                      cache=cache)
    if lookup is not None and untuned:
        kernels = sum(not t.alias and t.key not in found.in_place for t in lowered.values())
        message = (f"{len(untuned)} of {kernels} tasks have no tuning record "
                   f"for this target ({target.mcpu or 'generic CPU'}, {target.num_cores} cores) and use the "
                   "default schedule: " + "; ".join(untuned))
        if require_tuned:
            raise RelayTuneError(message)
        warnings.warn(message, BuildWarning, stacklevel=4)
    return lowered


def _plan(
    main: Function, found: ModelTasks, lowered: Mapping[str, LoweredTask], task_list: Sequence[LoweredTask],
    target: Target,
) -> tuple[GraphPlan, list[np.ndarray], list[tir.PrimFunc]]:
    """The graph plan of fused entry function `main`, its constants, and the run-time packing kernels; checked
    against the memory available before LLVM compiles anything."""
    task_infos = tuple(
        TaskInfo(t.key, t.description, "" if t.alias else t.kernel_name, t.tuned, t.occurrences, t.flops)
        for t in task_list
    )
    planner = Planner(tasks=lowered, target=target, task_index={t.key: i for i, t in enumerate(task_list)},
                      call_keys=dict(found.sites))
    inputs, outputs = planner.run(main)
    plan, constants = planner.finish(inputs, outputs, task_infos)
    _check_plan_fits(plan, constants)
    return plan, constants, list(planner.packers.values())


def _check_plan_fits(plan: GraphPlan, constants: Sequence[Any]) -> None:
    """A clear error when the memory plan (arena, constants, inputs, outputs) exceeds the memory available."""
    parts = {
        "intermediates": int(plan.memory.arena_bytes),
        "constants": sum(int(getattr(c, "nbytes", 0)) for c in constants),
        "inputs": sum(int(plan.values[i.value].nbytes) for i in plan.inputs),
        "outputs": sum(int(plan.storages[s].nbytes) for s in plan.storages_of_kind("output")),
    }
    check_memory(sum(parts.values()), parts, "the model's memory plan")
