"""The model compiler, `relay_tune.build`: compile a whole model into a `CompiledModel`.

The package `relay_tune` exports `build` and `bind_params` from here (`relay_tune.build(...)` is this package's
`build`).

    import relay_tune
    model = relay_tune.build(mod, target="llvm", params={"weight": w}, logs="logs/resnet.jsonl")
    y = model.run(x=image)

What happens:

1. **Graph passes.** `params` are bound into the entry function as constants; the module is type-checked,
   optimised and fused (`relay_tune.passes.optimize`): the entry function now calls one `Primitive=1` function
   per fused group. With `layout_planning` on a CPU target, convolution chains run on channel-blocked
   activations (`relay_tune.passes.PlanLayouts`, block = the target's float32 lanes) and constant weights are
   packed into their blocked layouts here, once.
2. **Tasks.** Every distinct fused function (`relay_tune.passes.extract_tasks`: same workload key) is lowered
   once, with tuned schedule steps when the tuning logs have a record for its key on this target, else with
   its default schedule. Tasks without a record are named in one warning.
3. **One compile.** All kernels go into one LLVM module (a few when `jobs` > 1, compiled in parallel worker
   processes), optimised and emitted in one go, then JIT-linked.
4. **Graph plan.** The entry function becomes a list of kernel calls in topological order over tensors:
   inputs, constants (weights that a schedule reads packed are packed here, once), intermediates (placed by
   the memory planner in one arena) and outputs. A fused group that leaves every element where it is in memory
   (a pure reshape, or a layout transform of a 1x1 map: `is_memory_view`) becomes an alias of its input (no
   kernel, no copy). See `relay_tune.runtime.model`.

Targets: `"llvm"` (or `"native"`) is this machine: its CPU, features and cores (`resolve_target`).

Tuning logs (`logs`): a path or list of paths of JSON-lines tuning logs, or a function
`(task_key, target) -> schedule steps | None` (`ScheduleLookup`). For logs, the best valid record per workload
and target is used (`relay_tune.records.database.best_for_target`) and its config becomes steps through
`search_space.decode.config_to_steps`.

Modules, in the order a build runs them: `target` (target strings), `lookup` (tuning-log lookup), `task_list`
and `tasks` (which tasks a model has, each lowered with `primitive`, the one-kernel compiler), the graph planner
(`planner` over `storage`, `kernel_calls`, `concat` and `plan_finish`), `parallel` (LLVM in worker processes),
`pipeline` (all of it, `compile_model`), `vm_compiler` (a program with control flow, `if`, recursion, closures,
as a `relay_tune.runtime.vm.VMModel` over the same kernels), `check_tuned` (the in-graph check of tuned records),
`build_cache` (finished builds kept on disk: a model built before loads instead of compiling) and `build_model`
(`build`). Timing models against each other is the runtime's (`relay_tune.runtime.benchmark`).
"""

from relay_tune.compile.build_model import build
from relay_tune.compile.check_tuned import check_tuned_records
from relay_tune.compile.lookup import BuildWarning, ScheduleLookup, TaskLookup, task_lookup
from relay_tune.compile.params import bind_params, read_params
from relay_tune.compile.pipeline import compile_model
from relay_tune.compile.target import resolve_target
from relay_tune.compile.task_list import ModelTasks, model_tasks

__all__ = [
    "BuildWarning", "ModelTasks", "ScheduleLookup", "TaskLookup", "bind_params", "build", "check_tuned_records",
    "compile_model", "model_tasks", "read_params", "resolve_target", "task_lookup",
]
