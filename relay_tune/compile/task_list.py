"""A fused model's tasks by what the build does with them: the one rule the build and the tuner share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from relay_tune.compile.concat import bare_concatenation
from relay_tune.compile.planner import Planner
from relay_tune.compile.tasks import is_memory_view, placeholder_task
from relay_tune.compile.vm_compiler import needs_vm
from relay_tune.errors import RelayTuneError
from relay_tune.ir import Function, IRModule
from relay_tune.kernel.recurrent import fixed_kernel_call
from relay_tune.passes.extract_tasks import TaskSpec, extract_tasks
from relay_tune.target import Target
from search_space.families.lstm import lstm_call


@dataclass(frozen=True)
class ModelTasks:
    """A fused model's tasks by what the build does with them.

    `specs`: every distinct fused function in order of first use; `occurrences` and `call_sites` count only the
    calls that run a kernel. `views`: keys of memory views (`is_memory_view`: aliases, no kernel). `in_place`: keys
    of concatenations that producers write in place at every call site (no kernel). `sites`: the task key of every
    call site, those written in place included."""

    specs: tuple[TaskSpec, ...]
    views: frozenset[str]
    in_place: frozenset[str]
    sites: Mapping[int, str]

    @property
    def kernels(self) -> list[TaskSpec]:
        """The tasks whose kernels the model calls and that have a schedule space: what tuning should spend its
        trials on (of the fixed kernels, `kernel.recurrent`, only the LSTMs have one: `search_space.families.lstm`)."""
        return [s for s in self.specs if s.key not in self.views and s.key not in self.in_place
                and (fixed_kernel_call(s.func) is None or lstm_call(s.func) is not None)]


def model_tasks(fused_main: Function | IRModule, target: Target) -> ModelTasks:
    """The tasks of a fused entry function (`relay_tune.passes.optimize`) as `build` compiles them for `target`.

    Given the whole fused module, a program with control flow (`vm_compiler.needs_vm`) has the tasks of every
    function it runs: the kernels inside branches, other global functions and closures (the virtual machine
    writes no concatenation in place); a program without has its entry function's.

    Which concatenations are written in place is decided by the graph planner itself (`Planner`, run here with
    kernel-less stand-ins for every task: the decision depends on values and storages, not on schedules), so
    tuning and the build cannot disagree about which kernels a model calls."""
    if isinstance(fused_main, IRModule):
        if needs_vm(fused_main):
            specs = extract_tasks(fused_main)
            views = frozenset(s.key for s in specs if is_memory_view(s.func))
            return ModelTasks(tuple(specs), views, frozenset(), {id(c): s.key for s in specs for c in s.call_sites})
        fused_main = fused_main["main"]
    specs = extract_tasks(IRModule({"main": fused_main}))
    views = frozenset(s.key for s in specs if is_memory_view(s.func))
    sites = {id(site): s.key for s in specs for site in s.call_sites}
    planner = Planner(tasks={s.key: placeholder_task(s, alias=s.key in views) for s in specs}, target=target,
                      task_index={s.key: i for i, s in enumerate(specs)}, call_keys=sites)
    if not planner.concat_in_place or not any(bare_concatenation(s.func) is not None for s in specs):
        return ModelTasks(tuple(specs), views, frozenset(), sites)
    try:
        _inputs, outputs = planner.run(fused_main)
    except RelayTuneError:
        return ModelTasks(tuple(specs), views, frozenset(), sites)  # the build reports what it cannot compile
    in_place_sites = planner.in_place_sites(outputs)
    kept: list[TaskSpec] = []
    in_place: set[str] = set()
    for spec in specs:
        running = tuple(c for c in spec.call_sites if id(c) not in in_place_sites)
        if not running:
            in_place.add(spec.key)
        kept.append(replace(spec, occurrences=len(running), call_sites=running))
    return ModelTasks(tuple(kept), views, frozenset(in_place), sites)
