"""The model compiler, `relay_tune.build`: compile a whole model into a `CompiledModel`.

The package exports `build` and `bind_params` from here (`relay_tune.build(...)` is this module's `build`).

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

Targets: `"llvm"` (or `"native"`) is this machine: its CPU, features and cores. A target string without
`-mcpu` also gets the host's CPU and features, and without `-num-cores` the host's core count, so
`"llvm -num-cores=1"` is this machine on one core.

Tuning logs (`logs`): a path or list of paths of JSON-lines tuning logs, or a function
`(task_key, target) -> schedule steps | None` (`ScheduleLookup`). For logs, the best valid record per workload
and target is used (`relay_tune.tuning.apply_best`) and its config becomes steps through `steps_from_config`.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import os
import re
import statistics
import sys
import time
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from relay_tune.codegen.llvm import compile_object
from relay_tune.errors import CompileError, RelayTuneError, UnsupportedError
from relay_tune.ir import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    IRModule,
    Let,
    Op,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    Var,
    substitute,
)
from relay_tune.kernel import tir
from relay_tune.kernel.build import OUTPUT, lower_primitive
from relay_tune.kernel.lower import lower
from relay_tune.kernel.schedule import Schedule
from relay_tune.op.registry import get_op
from relay_tune.passes import layout_block, optimize
from relay_tune.passes.base import dataflow_post_order
from relay_tune.passes.extract_tasks import TaskSpec, constant_inputs, extract_tasks, workload_key
from relay_tune.passes.fuse_ops import RESHAPE_LIKE_OPS
from relay_tune.resources import check_memory
from relay_tune.runtime.cuda import gpu_model_from_plan
from relay_tune.codegen.jit import KernelSignature, load_object
from relay_tune.runtime.memory_plan import DEFAULT_ALIGNMENT, BufferLifetime, plan_memory
from relay_tune.runtime.model import (
    PACKING_TASK,
    CompiledModel,
    GraphPlan,
    InputInfo,
    KernelCall,
    OutputTree,
    Storage,
    TaskInfo,
    Value,
    host_triple,
)
from relay_tune.target import Target
from relay_tune.records.database import best_for_target
from relay_tune.type_infer import infer_types
from search_space.defaults import default_steps
from search_space.logged import ConfigNotInSpace, config_steps

__all__ = [
    "BuildWarning", "ScheduleLookup", "TaskLookup", "bind_params", "build", "interleaved_latency", "read_params",
    "resolve_target", "steps_from_config", "task_lookup",
]

ScheduleLookup = Callable[[str, Target], Sequence[Any] | None]
"""`(task_key, target) -> schedule steps (Step objects or their JSON dicts) | None` (None: default schedule)."""

KERNEL_NAME_LIMIT = 48
PARALLEL_COMPILE_MIN_KERNELS = 8


class BuildWarning(UserWarning):
    """Something about a build the user should know (untuned tasks, tuned steps that no longer apply)."""


# ---------------------------------------------------------------------------------------------------------------------
# Targets and tuning-log lookup
# ---------------------------------------------------------------------------------------------------------------------


def resolve_target(target: str | Target | None) -> Target:
    """The target to build for (see the module docstring for how host defaults fill a target string)."""
    if isinstance(target, Target):
        resolved = target
    else:
        text = (target or "llvm").strip()
        parsed = Target.parse(text)
        if parsed.kind == "cuda":  # NVIDIA GPUs: relay_tune.runtime.cuda runs the model
            return Target("cuda", arch=parsed.arch or "sm_90").validate()
        if parsed.kind != "llvm":
            raise UnsupportedError(f"relay_tune.build compiles for CPUs (llvm targets); got {parsed}")
        words = text.split()
        host = Target.host()
        has_cpu = any(w.startswith("-mcpu=") for w in words[1:]) or words[0] == "native"
        has_cores = any(w.startswith("-num-cores=") for w in words[1:]) or words[0] == "native"
        resolved = Target(
            kind="llvm",
            mcpu=parsed.mcpu if has_cpu else host.mcpu,
            mattr=parsed.mattr if (has_cpu or parsed.mattr) else host.mattr,
            num_cores=parsed.num_cores if has_cores else host.num_cores,
        )
    if resolved.kind not in ("llvm", "cuda"):
        raise UnsupportedError(f"relay_tune.build compiles for llvm and cuda targets; got {resolved}")
    return resolved.validate()  # before LLVM sees it: an unknown CPU can abort the process inside LLVM


def steps_from_config(func: Function, config: Mapping[str, Any], target: Target) -> list[Any]:
    """The schedule steps a tuning config stands for, for fused function `func`: its family's template at the
    config (`search_space.logged.config_steps`; a CPU config may carry its steps in a `"steps"` knob)."""
    return config_steps(func, config, target)


TaskLookup = Callable[[Any, Target], Sequence[Any] | None]
"""`(task spec, target) -> steps | None`: the form the build uses inside (the spec has the key and the function)."""


def task_lookup(logs: Any) -> TaskLookup | None:
    """The lookup `build` uses for `logs`: None, a `ScheduleLookup` function, or tuning-log path(s)."""
    if logs is None:
        return None
    if isinstance(logs, _SpecLookup):
        return logs.fn
    if callable(logs):
        hook: ScheduleLookup = logs
        return lambda spec, target: hook(spec.key, target)
    paths = [logs] if isinstance(logs, str | os.PathLike) else list(logs)
    if not paths:
        return None
    for path in paths:
        if not os.path.isfile(path):
            raise RelayTuneError(f"tuning log {os.fspath(path)}: no such file")

    cache: dict[str, Mapping[str, Sequence[Any]]] = {}

    def lookup(spec: Any, target: Target) -> Sequence[Any] | None:
        ranked = cache.get(str(target))
        if ranked is None:
            # logs name targets by `log_name`; records of other targets or CPUs are left out, counted in one warning
            ranked, skipped = best_for_target(paths, (target.log_name, str(target)), target.mcpu or None,
                                              k=LOOKUP_CANDIDATES)
            cache[str(target)] = ranked
            if skipped is not None:
                warnings.warn(skipped, BuildWarning, stacklevel=4)
        # The fastest record that is a point of the task's current space; records of an older space (another
        # version, or a compute that changed) are passed over, and with none left the task is untuned.
        for config in ranked.get(spec.key, ()):
            try:
                return steps_from_config(spec.func, config, target)
            except ConfigNotInSpace:
                continue
        return None

    return lookup


LOOKUP_CANDIDATES = 64
"""Records per task a log lookup considers, fastest first, for one that fits the task's current space."""


# ---------------------------------------------------------------------------------------------------------------------
# Lowered tasks: which relay tensor feeds each kernel parameter
# ---------------------------------------------------------------------------------------------------------------------


def packing_kernel(layout: Any, name: str, target: Target | None = None) -> tir.PrimFunc:
    """The kernel `name(src, packed)` that packs a run-time input into `layout` (a `LayoutTransform`), as a model
    runs it before the kernel that reads it packed (and as the tuner's runner times it with that kernel).

    On a CPU target (`None`: a CPU) the copy runs on all cores and reads the source a cache line at a time
    (`LayoutTransform.pack_schedule`); a GPU build gets the plain loop nest (its back end runs it on one thread)."""
    if target is not None and target.kind != "llvm":
        _src, packed = layout.pack_compute()
        return lower(Schedule([packed]), name)
    return lower(layout.pack_schedule(), name)


@dataclass(frozen=True)
class ParamBinding:
    """Where one kernel parameter comes from: flattened input `index` of the fused function (`kind` "input"),
    the same input packed by `pack` ("packed"), or flattened output `index` ("output")."""

    kind: str
    index: int
    pack: Any = None  # a LayoutTransform-like object with `pack(array)` and `pack_compute()`


@dataclass
class LoweredTask:
    key: str
    description: str
    occurrences: int
    flops: int
    func: Function
    primfunc: tir.PrimFunc
    bindings: tuple[ParamBinding, ...]
    tuned: bool
    alias: bool = False  # a memory view (`is_memory_view`): no kernel, its output aliases its input
    kernel_name: str = ""
    lower_seconds: float = 0.0


def _slug(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_").lower()


VIEW_OPS = RESHAPE_LIKE_OPS | {"layout_transform", "transpose"}
"""Operators that only move elements: a fused group of them alone may leave every element where it is."""

VIEW_CHECK_LIMIT = 1 << 22
"""Largest tensor (elements) whose layout-moving group is checked for memory identity; larger ones stay kernels."""


def is_memory_view(func: Function) -> bool:
    """A fused group whose output has its input's elements in the same order in memory: a view, never a copy.

    Pure reshapes always are. A group with layout transforms or transposes is when its element permutation is the
    identity, e.g. NCHW16c -> NCHW on a 1x1 map (ResNet-50's tail after global pooling), or a transpose of unit
    axes. That is decided exactly by running the group's reference implementation on the element numbers
    0, 1, ... and comparing: cheap for any real activation (a few milliseconds at the cap), and right for every
    combination of blocking, unit axes and reshapes without a second, symbolic copy of each operator's rule."""
    if len(func.params) != 1:
        return False
    calls = [n for n in dataflow_post_order(func.body) if isinstance(n, Call)]
    if not calls or any(c.op_name not in VIEW_OPS for c in calls):
        return False
    param_type = func.params[0].checked_type if func.params[0].has_type() else func.params[0].type_annotation
    out_type = func.body.checked_type if func.body.has_type() else None
    if not (isinstance(param_type, TensorType) and isinstance(out_type, TensorType) and param_type.is_static
            and out_type.is_static and param_type.dtype == out_type.dtype and param_type.size == out_type.size):
        return False
    if all(c.op_name in RESHAPE_LIKE_OPS for c in calls):
        return True
    if param_type.size > VIEW_CHECK_LIMIT:
        return False
    shape = tuple(int(d) for d in param_type.shape)  # type: ignore[arg-type]
    numbers = np.arange(param_type.size, dtype=np.int64).reshape(shape)
    values: dict[int, np.ndarray] = {id(func.params[0]): numbers}
    for call in calls:
        if not all(id(a) in values for a in call.args) or not isinstance(call.op, Op):
            return False  # a constant or tuple operand: not a plain chain on the input
        opdef = get_op(call.op.name)
        if opdef.reference is None:
            return False
        values[id(call)] = np.asarray(opdef.reference([values[id(a)] for a in call.args],
                                                      opdef.make_attrs(call.attrs)))
    result = values[id(func.body)] if id(func.body) in values else None
    return result is not None and result.size == numbers.size and bool(np.array_equal(result.ravel(),
                                                                                       numbers.ravel()))


@dataclass(frozen=True)
class ModelTasks:
    """A fused model's tasks by what the build does with them: the one rule the build and the tuner share.

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
        """The tasks whose kernels the model calls: what tuning should spend its trials on."""
        return [s for s in self.specs if s.key not in self.views and s.key not in self.in_place]


def model_tasks(fused_main: Function, target: Target) -> ModelTasks:
    """The tasks of a fused entry function (`relay_tune.passes.optimize`) as `build` compiles them for `target`.

    Which concatenations are written in place is decided by the graph planner itself (`_Planner`, run here with
    kernel-less stand-ins for every task: the decision depends on values and storages, not on schedules), so
    tuning and the build cannot disagree about which kernels a model calls."""
    specs = extract_tasks(IRModule({"main": fused_main}))
    views = frozenset(s.key for s in specs if is_memory_view(s.func))
    sites = {id(site): s.key for s in specs for site in s.call_sites}
    planner = _Planner({s.key: _placeholder_task(s, alias=s.key in views) for s in specs}, target=target)
    if not planner.concat_in_place or not any(_bare_concatenation(s.func) is not None for s in specs):
        return ModelTasks(tuple(specs), views, frozenset(), sites)
    planner.task_index = {s.key: i for i, s in enumerate(specs)}
    planner.call_keys = sites
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


def _placeholder_task(spec: TaskSpec, alias: bool = False) -> LoweredTask:
    """A task with no kernel: a memory view (`alias`), or a concatenation written in place; each parameter is
    read as it is and each output written (what the planner needs to place values)."""
    out_type = spec.func.body.checked_type if spec.func.body.has_type() else spec.func.ret_type
    inputs = sum(len(_flatten_types(p.checked_type if p.has_type() else p.type_annotation))
                 for p in spec.func.params)
    bindings = tuple(ParamBinding("output", i) for i in range(len(_flatten_types(out_type))))
    bindings += tuple(ParamBinding("input", i) for i in range(inputs))
    return LoweredTask(spec.key, spec.description, spec.occurrences, spec.flops, spec.func,
                       tir.PrimFunc("", (), tir.Seq(())), bindings, tuned=False, alias=alias)


def lower_task(
    func: Function, target: Target, steps: Sequence[Any] | None, name: str
) -> tuple[tir.PrimFunc, tuple[ParamBinding, ...]]:
    """Lower one fused function with `steps` (None: its default schedule) into kernel `name`, and say where each
    kernel parameter comes from."""
    primfunc, packing = lower_primitive(func, target, steps, name=name)
    bindings = tuple(
        ParamBinding("output", p.index) if p.role == OUTPUT
        else ParamBinding("packed", p.index, p.layout) if p.layout is not None
        else ParamBinding("input", p.index)
        for p in packing.params
    )
    return primfunc, bindings


# ---------------------------------------------------------------------------------------------------------------------
# The graph plan
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class _StorageDraft:
    kind: str  # "input" | "constant" | "intermediate" (arena or output, decided at the end)
    index: int
    nbytes: int
    first: int = -1
    last: int = -1


@dataclass
class _Planner:
    """Walks the fused entry function in evaluation order and records values, storages and kernel calls."""

    tasks: Mapping[str, LoweredTask]
    values: list[Value] = field(default_factory=list)
    storages: list[_StorageDraft] = field(default_factory=list)
    calls: list[KernelCall] = field(default_factory=list)
    constants: list[np.ndarray] = field(default_factory=list)
    constant_ids: dict[tuple[int, str], int] = field(default_factory=dict)  # (id(Constant), packing) -> value
    packers: dict[str, tir.PrimFunc] = field(default_factory=dict)  # run-time packing kernels by name
    packed_at_run: dict[tuple[int, str], int] = field(default_factory=dict)
    task_index: dict[str, int] = field(default_factory=dict)
    call_keys: dict[int, str] = field(default_factory=dict)  # id(call site) -> workload key, from task extraction
    keep: list[Any] = field(default_factory=list)  # constants whose ids are keys of constant_ids
    target: Target | None = None  # what the run-time packing kernels are scheduled for
    concats: list[tuple[int, list[int], int, int]] = field(default_factory=list)  # (step, parts, result, id(call))

    @property
    def concat_in_place(self) -> bool:
        """Whether producers write a concatenation's parts into its buffer (`_in_place_concats`): on CPU targets;
        a GPU model's buffers are device allocations, not offsets in one arena."""
        return self.target is None or self.target.kind != "cuda"

    # -- values -------------------------------------------------------------------------------------------------
    def new_value(self, shape: tuple[int, ...], dtype: str, storage: int) -> int:
        self.values.append(Value(tuple(int(d) for d in shape), dtype, storage))
        return len(self.values) - 1

    def new_storage(self, kind: str, index: int, nbytes: int) -> int:
        self.storages.append(_StorageDraft(kind, index, nbytes))
        return len(self.storages) - 1

    def constant(self, array: np.ndarray, key: tuple[int, str]) -> int:
        found = self.constant_ids.get(key)
        if found is not None:
            return found
        array = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes a scalar 1-D
        storage = self.new_storage("constant", len(self.constants), array.nbytes)
        self.constants.append(array)
        value = self.new_value(array.shape, str(array.dtype), storage)
        self.constant_ids[key] = value
        return value

    def intermediate(self, shape: tuple[int, ...], dtype: str) -> int:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        storage = self.new_storage("intermediate", -1, nbytes)
        return self.new_value(shape, dtype, storage)

    def read(self, value: int, step: int) -> None:
        draft = self.storages[self.values[value].storage]
        draft.last = max(draft.last, step)

    def wrote(self, value: int, step: int) -> None:
        draft = self.storages[self.values[value].storage]
        draft.first = step if draft.first < 0 else min(draft.first, step)
        draft.last = max(draft.last, step)

    # -- walking ------------------------------------------------------------------------------------------------
    def run(self, main: Function) -> tuple[list[InputInfo], OutputTree]:
        inputs: list[InputInfo] = []
        env: dict[int, OutputTree] = {}  # id(expr) or id(var) -> value tree
        for position, param in enumerate(main.params):
            ty = param.checked_type
            if not isinstance(ty, TensorType) or not ty.is_static:
                raise UnsupportedError(
                    f"input %{param.name_hint} has type {ty}; compiled models take tensors of static shape"
                )
            shape = tuple(int(d) for d in ty.shape)  # type: ignore[arg-type]
            storage = self.new_storage("input", position, _nbytes(shape, ty.dtype))
            value = self.new_value(shape, ty.dtype, storage)
            env[id(param)] = value
            inputs.append(InputInfo(param.name_hint, value))
        self._walk(main.body, env)
        return inputs, env[id(main.body)]

    def _walk(self, root: Expr, env: dict[int, OutputTree]) -> None:
        stack: list[tuple[Expr, int]] = [(root, 0)]
        done: set[int] = set(env)
        while stack:
            node, phase = stack.pop()
            if phase == 0:
                if id(node) in done:
                    continue
                if isinstance(node, Let):
                    stack += [(node, 2), (node.body, 0), (node, 1), (node.value, 0)]
                elif isinstance(node, Call) and isinstance(node.op, Function):
                    stack.append((node, 2))
                    stack.extend((a, 0) for a in reversed(node.args))
                elif isinstance(node, Tuple):
                    stack.append((node, 2))
                    stack.extend((f, 0) for f in reversed(node.fields))
                elif isinstance(node, TupleGetItem):
                    stack += [(node, 2), (node.tuple_value, 0)]
                else:
                    stack.append((node, 2))
                continue
            if phase == 1:  # a let's value is ready: bind its variable
                assert isinstance(node, Let)
                env[id(node.var)] = env[id(node.value)]
                done.add(id(node.var))
                continue
            if id(node) in done:
                continue
            env[id(node)] = self._value_of(node, env)
            done.add(id(node))

    def _value_of(self, node: Expr, env: dict[int, OutputTree]) -> OutputTree:
        if isinstance(node, Var):
            if id(node) not in env:
                raise UnsupportedError(f"variable %{node.name_hint} is not bound to a value here")
            return env[id(node)]
        if isinstance(node, Constant):
            return self.constant(node.data, (id(node), ""))
        if isinstance(node, Tuple):
            return tuple(env[id(f)] for f in node.fields)
        if isinstance(node, TupleGetItem):
            tup = env[id(node.tuple_value)]
            if not isinstance(tup, tuple):
                raise CompileError("projection of a value that is not a tuple")
            return tup[node.index]
        if isinstance(node, Let):
            return env[id(node.body)]
        if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
            return self._kernel_call(node, env)
        if isinstance(node, If):
            raise UnsupportedError("compiled models cannot branch (`if`); run such programs with the interpreter")
        if isinstance(node, Call) and isinstance(node.op, GlobalVar):
            raise UnsupportedError(
                f"compiled models cannot call other global functions (@{node.op.name}); run such programs with the "
                "interpreter"
            )
        if isinstance(node, Call) and isinstance(node.op, Op):
            raise CompileError(f"operator call {node.op.name} outside any fused function (run the fusion passes)")
        raise UnsupportedError(f"compiled models cannot evaluate a {type(node).__name__} here")

    def _kernel_call(self, call: Call, env: dict[int, OutputTree]) -> OutputTree:
        func = call.op
        assert isinstance(func, Function)
        key = self.call_keys.get(id(call)) or workload_key(func)
        task = self.tasks.get(key)
        if task is None:
            raise CompileError(f"no kernel was compiled for fused function {key[:12]}")
        leaves: list[int] = []
        for arg in call.args:
            leaves.extend(_flatten(env[id(arg)]))
        out_type = func.body.checked_type if func.body.has_type() else func.ret_type
        if task.alias:
            source = self.values[leaves[0]]
            assert isinstance(out_type, TensorType)
            shape = tuple(int(d) for d in out_type.shape)  # type: ignore[arg-type]
            return self.new_value(shape, source.dtype, source.storage)
        outputs = [self.intermediate(tuple(int(d) for d in t.shape), t.dtype) for t in _flatten_types(out_type)]
        args: list[int] = []
        for binding in task.bindings:
            if binding.kind == "output":
                args.append(outputs[binding.index])
            elif binding.kind == "input":
                args.append(leaves[binding.index])
            else:
                args.append(self._packed(call.args, leaves, binding))
        step = len(self.calls)
        for binding, value in zip(task.bindings, args):
            if binding.kind == "output":
                self.wrote(value, step)
            else:
                self.read(value, step)
        # A concatenation written in place at every site has no kernel (`_placeholder_task`); `finish` drops it.
        index = self.task_index[key] if task.kernel_name else PACKING_TASK
        self.calls.append(KernelCall(task.kernel_name, index, tuple(args)))
        order = _bare_concatenation(func)
        if order is not None and len(leaves) == len(func.params) and len(outputs) == 1:
            self.concats.append((step, [leaves[i] for i in order], outputs[0], id(call)))
        return _structure(out_type, outputs)

    def _packed(self, call_args: Sequence[Expr], leaves: list[int], binding: ParamBinding) -> int:
        """The packed form of input `binding.index`: packed once now for a constant, else by a kernel each run."""
        lt = binding.pack
        layout_key = f"{lt.src_layout}->{lt.dst_layout}:{lt.dtype}:{list(lt.src_shape)}"
        source = leaves[binding.index]
        constant = _constant_leaf(call_args, binding.index)
        if constant is not None:
            self.keep.append(constant)
            found = self.constant_ids.get((id(constant), layout_key))
            if found is not None:
                return found
            return self.constant(np.asarray(lt.pack(constant.data)), (id(constant), layout_key))
        found_run = self.packed_at_run.get((source, layout_key))
        if found_run is not None:
            return found_run
        packer = self._packer(lt, layout_key)
        value = self.intermediate(lt.packed_shape, lt.dtype)
        step = len(self.calls)
        self.read(source, step)
        self.wrote(value, step)
        self.calls.append(KernelCall(packer.name, PACKING_TASK, (source, value)))
        self.packed_at_run[(source, layout_key)] = value
        return value

    def _packer(self, lt: Any, layout_key: str) -> tir.PrimFunc:
        name = f"pack_{len(self.packers)}_{_slug(lt.src_layout + '_' + lt.dst_layout)}"
        for existing in self.packers.values():
            if dict(existing.attrs).get("packing") == layout_key:
                return existing
        primfunc = packing_kernel(lt, name, self.target)
        primfunc = replace(primfunc, attrs=(*primfunc.attrs, ("packing", layout_key)))
        self.packers[name] = primfunc
        return primfunc

    # -- finishing ----------------------------------------------------------------------------------------------
    def in_place_sites(self, outputs: OutputTree) -> set[int]:
        """The call sites (ids) of the concatenations `finish` will have written in place (`_in_place_concats`)."""
        output_storages = {self.values[v].storage for v in _flatten(outputs)}
        _inside, dropped = self._in_place_concats(output_storages)
        return {site for step, _parts, _result, site in self.concats if step in dropped}

    def _in_place_concats(self, output_storages: set[int]) -> tuple[dict[int, tuple[int, int]], set[int]]:
        """Concatenations whose producers can write their parts straight into the result, and the parts' places.

        A concatenation along an axis with only unit axes before it (batch 1: NCHW or NCHW{b}c on channels) lays
        its inputs out one after the other, so the kernel producing input k can write it at byte offset
        sum(nbytes of inputs < k) of the result's buffer, and the concatenation kernel, a copy of every byte, is
        dropped. Taken where every input is an intermediate that lives alone in its storage (no model input,
        constant or output), appears once, and is no other concatenation's part already, and every part starts on
        an aligned byte. A result that is itself a part of a later concatenation nests (DenseNet's growing
        feature maps end up in one buffer, written once). Returns {storage: (buffer storage, byte offset)} and the
        steps of the dropped calls."""
        holders: dict[int, int] = {}
        for value in self.values:
            holders[value.storage] = holders.get(value.storage, 0) + 1
        parent: dict[int, tuple[int, int]] = {}  # storage -> (enclosing storage, offset in it)
        dropped: set[int] = set()
        def free(storage: int) -> bool:  # an intermediate no output or other concatenation has claimed
            return (self.storages[storage].kind == "intermediate" and storage not in output_storages
                    and storage not in parent)

        for step, parts, result, _site in self.concats:
            out = self.values[result]
            storages = [self.values[p].storage for p in parts]
            if (_concat_axis(out.shape, [self.values[p].shape for p in parts]) is None
                    or len(set(storages)) != len(storages) or not free(out.storage)
                    or any(not free(s) or holders[s] != 1 for s in storages)
                    or any(self.values[p].dtype != out.dtype for p in parts)):
                continue
            offsets = list(itertools.accumulate((self.values[p].nbytes for p in parts), initial=0))[:-1]
            if any(offset % DEFAULT_ALIGNMENT for offset in offsets):
                continue
            for storage, offset in zip(storages, offsets):
                parent[storage] = (out.storage, offset)
            dropped.add(step)
        inside: dict[int, tuple[int, int]] = {}
        for storage in parent:
            root, offset = storage, 0
            while root in parent:
                root, step_offset = parent[root]
                offset += step_offset
            inside[storage] = (root, offset)
        return inside, dropped

    def finish(
        self, inputs: list[InputInfo], outputs: OutputTree, task_infos: tuple[TaskInfo, ...]
    ) -> tuple[GraphPlan, list[np.ndarray]]:
        """The plan and its constants. Values nothing reads (e.g. a weight that is only read packed) and their
        storages are dropped; intermediates returned by the model become outputs, the rest go into the arena."""
        used = {i.value for i in inputs} | {v for c in self.calls for v in c.args} | set(_flatten(outputs))
        value_ids = sorted(used)
        new_value = {old: new for new, old in enumerate(value_ids)}
        storage_ids = sorted({self.values[v].storage for v in value_ids})
        new_storage = {old: new for new, old in enumerate(storage_ids)}
        output_storages = {self.values[v].storage for v in _flatten(outputs)}

        inside, dropped = self._in_place_concats(output_storages) if self.concat_in_place else ({}, set())
        calls = [c for step, c in enumerate(self.calls) if step not in dropped]
        if any(not c.kernel for c in calls):
            raise CompileError("a concatenation planned to be written in place still needs its kernel")
        # A buffer that holds other storages lives from the first write into any of them to the last read.
        spans: dict[int, tuple[int, int]] = {}
        for old in storage_ids:
            draft = self.storages[old]
            if draft.kind != "intermediate" or old in output_storages:
                continue
            root = inside[old][0] if old in inside else old
            written = max(draft.first, 0)
            first, last = spans.get(root, (written, draft.last))
            spans[root] = (min(first, written), max(last, draft.last))

        lifetimes: list[BufferLifetime] = []
        buffer_of: dict[int, int] = {}  # old storage -> arena buffer number
        storages: list[Storage] = []
        constants: list[np.ndarray] = []
        num_outputs = 0
        for old in storage_ids:
            draft = self.storages[old]
            if draft.kind == "constant":
                storages.append(Storage("constant", len(constants), draft.nbytes))
                constants.append(self.constants[draft.index])
            elif draft.kind == "input":
                storages.append(Storage("input", draft.index, draft.nbytes))
            elif old in output_storages:
                storages.append(Storage("output", num_outputs, draft.nbytes))
                num_outputs += 1
            else:
                root, offset = inside.get(old, (old, 0))
                if root not in buffer_of:
                    first, last = spans[root]
                    first = max(first, 0)
                    lifetimes.append(BufferLifetime(self.storages[root].nbytes, first, max(last, first)))
                    buffer_of[root] = len(lifetimes) - 1
                storages.append(Storage("arena", buffer_of[root], draft.nbytes, offset))
        values = [replace(self.values[v], storage=new_storage[self.values[v].storage]) for v in value_ids]

        def renumber(tree: OutputTree) -> OutputTree:
            return tuple(renumber(t) for t in tree) if isinstance(tree, tuple) else new_value[tree]

        plan = GraphPlan(
            inputs=tuple(InputInfo(i.name, new_value[i.value]) for i in inputs),
            values=tuple(values),
            storages=tuple(storages),
            calls=tuple(replace(c, args=tuple(new_value[a] for a in c.args)) for c in calls),
            outputs=renumber(outputs),
            tasks=task_infos,
            memory=plan_memory(lifetimes),
        )
        return plan, constants


def _bare_concatenation(func: Function) -> list[int] | None:
    """For a fused function that only concatenates its parameters (each once): the parameter numbers in the
    order of the concatenation; else None."""
    body = func.body
    if not (isinstance(body, Call) and isinstance(body.op, Op) and body.op.name == "concatenate"
            and len(body.args) == 1 and isinstance(body.args[0], Tuple)):
        return None
    position = {id(p): i for i, p in enumerate(func.params)}
    order = [position.get(id(f), -1) for f in body.args[0].fields]
    if -1 in order or len(set(order)) != len(order):
        return None
    return order


def _concat_axis(out_shape: Sequence[int], shapes: Sequence[Sequence[int]]) -> int | None:
    """The axis along which `shapes` are laid out one after the other in `out_shape`, when every axis before it
    has extent 1 (so each part is one contiguous run of bytes); else None."""
    if any(len(s) != len(out_shape) for s in shapes):
        return None
    for axis in range(len(out_shape)):
        if all(s[axis] == out_shape[axis] for s in shapes) and out_shape[axis] == 1:
            continue  # a unit axis before the concatenation's
        rest = tuple(out_shape[:axis]) + tuple(out_shape[axis + 1:])
        same_elsewhere = all(tuple(s[:axis]) + tuple(s[axis + 1:]) == rest for s in shapes)
        return axis if same_elsewhere and sum(s[axis] for s in shapes) == out_shape[axis] else None
    return None


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _flatten(tree: OutputTree) -> list[int]:
    out: list[int] = []
    stack: list[OutputTree] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple):
            stack.extend(reversed(node))
        else:
            out.append(node)
    return out


def _flatten_types(ty: Type | None) -> list[TensorType]:
    out: list[TensorType] = []
    stack: list[Type | None] = [ty]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(reversed(t.fields))
        elif isinstance(t, TensorType) and t.is_static:
            out.append(t)
        else:
            raise UnsupportedError(f"compiled models handle tensors of static shape and tuples of them, not {t}")
    return out


def _structure(ty: Type | None, leaves: list[int]) -> OutputTree:
    queue = list(leaves)

    def build(t: Type | None) -> OutputTree:
        if isinstance(t, TupleType):
            return tuple(build(f) for f in t.fields)
        return queue.pop(0)

    return build(ty)


def _constant_leaf(call_args: Sequence[Expr], leaf_index: int) -> Constant | None:
    """The constant that flattened argument `leaf_index` of a call is, if it is one."""
    position = 0
    for arg in call_args:
        ty = arg.checked_type if arg.has_type() else None
        width = len(_flatten_types(ty)) if ty is not None else 1
        if leaf_index < position + width:
            return arg if isinstance(arg, Constant) and width == 1 else None
        position += width
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Compiling
# ---------------------------------------------------------------------------------------------------------------------


def _compile_chunk(funcs: Sequence[tir.PrimFunc], target: Target) -> tuple[bytes, dict[str, float]]:
    timings: dict[str, float] = {}
    obj = compile_object(funcs, target, timings=timings)
    return obj, timings


def _compile_all(funcs: Sequence[tir.PrimFunc], target: Target, jobs: int) -> list[tuple[bytes, list[tir.PrimFunc]]]:
    """Object code for `funcs`: one module, or `jobs` modules of about equal size compiled in worker processes."""
    jobs = max(1, min(jobs, len(funcs)))
    if multiprocessing.current_process().daemon:
        jobs = 1  # daemonic processes (e.g. pool workers) may not start children
    if jobs == 1:
        return [(_compile_chunk(funcs, target)[0], list(funcs))]
    # Kernels dealt round-robin by estimated size, so each chunk takes about as long to optimise.
    order = sorted(funcs, key=lambda f: -_stmt_count(f.body))
    chunks: list[list[tir.PrimFunc]] = [[] for _ in range(jobs)]
    for i, func in enumerate(order):
        chunks[i % jobs].append(func)
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    # "fork": workers start at once, with everything imported; they only run LLVM on their own modules.
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = [pool.submit(_compile_chunk, chunk, target) for chunk in chunks]
            return [(future.result()[0], chunk) for future, chunk in zip(futures, chunks)]
    except concurrent.futures.process.BrokenProcessPool as err:
        raise CompileError(f"a compile worker process died ({err}); retry with jobs=1 to see why") from None


def _stmt_count(stmt: tir.Stmt) -> int:
    count = 0
    stack: list[tir.Stmt] = [stmt]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, tir.Seq):
            stack.extend(node.stmts)
        elif isinstance(node, tir.For | tir.Allocate):
            stack.append(node.body)
        elif isinstance(node, tir.IfThenElse):
            stack.append(node.then_body)
            if node.else_body is not None:
                stack.append(node.else_body)
    return count


def default_jobs() -> int:
    """Parallel compile processes: one per core up to 4, when a model has enough kernels to split."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


# ---------------------------------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------------------------------


def bind_params(mod: IRModule, params: Mapping[str, Any], entry: str = "main") -> IRModule:
    """Replace entry-function parameters named in `params` by constants (weights become foldable and packable).

    A weight that is an input is packed into the layout its kernel's schedule reads by a packing kernel on every
    run; bound as a constant, it is packed once, at build time, and the packing kernel disappears."""
    if not params:
        return mod
    func = mod[entry]
    by_name = {p.name_hint: p for p in func.params}
    unknown = [n for n in params if n not in by_name]
    if unknown:
        raise RelayTuneError(
            f"params name unknown input(s) {', '.join(map(repr, unknown))}; the inputs of @{entry} are "
            + ", ".join(f"%{n}" for n in by_name)
        )
    mapping: dict[Var, Expr] = {}
    for name, value in params.items():
        param = by_name[name]
        ty = param.checked_type if param.has_type() else param.type_annotation
        array = np.asarray(value)
        if isinstance(ty, TensorType):
            if str(array.dtype) != ty.dtype:
                raise RelayTuneError(f"param {name!r}: expected dtype {ty.dtype} ({ty}), got {array.dtype}")
            if ty.is_static and tuple(int(d) for d in ty.shape) != array.shape:  # type: ignore[arg-type]
                raise RelayTuneError(f"param {name!r}: expected shape {ty.shape} ({ty}), got {array.shape}")
        mapping[param] = Constant(array)
    body = substitute(func.body, mapping)
    new_params = tuple(p for p in func.params if p not in mapping)
    new_func = Function(new_params, body, func.ret_type, func.attrs, func.type_params)
    return mod.with_function(entry, new_func)


def read_params(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Values for entry-function inputs from an `.npz` file, keyed by input name (read without pickling), for
    `bind_params` (`relay-tune ... --params weights.npz`)."""
    if not os.path.isfile(path):
        raise RelayTuneError(f"params file {os.fspath(path)}: no such file")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: np.asarray(archive[name]) for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise RelayTuneError(f"params file {os.fspath(path)}: not a readable .npz archive ({err})") from None


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
) -> CompiledModel:
    """Compile `mod`'s `main` function into a `CompiledModel` (see the module docstring).

    target: "llvm" (this machine), a target string, or a `Target`.
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
    """
    if check_tuned and logs is not None:
        return check_tuned_records(mod, target, params, logs, opt_level, jobs=jobs, require_tuned=require_tuned,
                                   threading_runtime=threading_runtime, layout_planning=layout_planning,
                                   winograd=winograd)

    timings: dict[str, float] = {}
    start = time.perf_counter()
    resolved = resolve_target(target)
    lookup = task_lookup(logs)
    if isinstance(mod, Function):
        mod = IRModule({"main": mod})
    if "main" not in mod:
        raise RelayTuneError("the module has no @main function to build")
    mod = infer_types(mod)
    mod = infer_types(bind_params(mod, params or {}))
    fused = optimize(mod, opt_level=opt_level, layout_block=layout_block(resolved, layout_planning),
                     winograd=winograd)
    t_passes = time.perf_counter()
    timings["passes_s"] = t_passes - start

    found = model_tasks(fused["main"], resolved)
    lowered: dict[str, LoweredTask] = {}
    untuned: list[str] = []
    for number, spec in enumerate(found.specs):
        if spec.key in found.in_place:  # written in place by its producers wherever it runs: nothing to compile
            lowered[spec.key] = _placeholder_task(spec)
            continue
        kernel_name = f"k{number}_{_slug(spec.description)}"[:KERNEL_NAME_LIMIT]
        task = _lower_one(spec, resolved, lookup, kernel_name, untuned, view=spec.key in found.views)
        lowered[spec.key] = task
    t_lower = time.perf_counter()
    timings["lower_s"] = t_lower - t_passes
    if lookup is not None and untuned:
        kernels = sum(not t.alias and t.key not in found.in_place for t in lowered.values())
        message = (f"{len(untuned)} of {kernels} tasks have no tuning record "
                   f"for this target ({resolved.mcpu or 'generic CPU'}, {resolved.num_cores} cores) and use the "
                   "default schedule: " + "; ".join(untuned))
        if require_tuned:
            raise RelayTuneError(message)
        warnings.warn(message, BuildWarning, stacklevel=2)

    task_list = [t for t in lowered.values() if t.key not in found.in_place]
    task_infos = tuple(
        TaskInfo(t.key, t.description, "" if t.alias else t.kernel_name, t.tuned, t.occurrences, t.flops)
        for t in task_list
    )
    planner = _Planner(lowered, target=resolved)
    planner.task_index = {t.key: i for i, t in enumerate(task_list)}
    planner.call_keys = dict(found.sites)
    inputs, outputs = planner.run(fused["main"])
    plan, constants = planner.finish(inputs, outputs, task_infos)
    _check_plan_fits(plan, constants)  # before LLVM compiles anything
    t_plan = time.perf_counter()
    timings["plan_s"] = t_plan - t_lower

    called = {c.kernel for c in plan.calls}
    funcs = [t.primfunc for t in task_list if not t.alias and t.kernel_name in called]
    funcs += [f for f in planner.packers.values() if f.name in called]
    if resolved.kind == "cuda":
        return gpu_model_from_plan(plan, funcs, constants, resolved, timings, start)  # type: ignore[return-value]
    if jobs is None:
        # Worker processes pay off from a handful of kernels on (a fork costs a few milliseconds each).
        jobs = default_jobs() if len(funcs) >= PARALLEL_COMPILE_MIN_KERNELS else 1
    chunks = _compile_all(funcs, resolved, jobs) if funcs else []
    t_compile = time.perf_counter()
    timings["llvm_s"] = t_compile - t_plan

    objects = [(obj, [KernelSignature.from_primfunc(f) for f in chunk]) for obj, chunk in chunks]
    libraries = [load_object(obj, sigs, threading_runtime=threading_runtime) for obj, sigs in objects]
    timings["load_s"] = time.perf_counter() - t_compile
    timings["total_s"] = time.perf_counter() - start
    info: dict[str, Any] = {
        "triple": host_triple(),
        "opt_level": opt_level,
        "timings": timings,
        "kernels": len(funcs),
        "tuned_tasks": sum(t.tuned for t in task_list),
        "default_tasks": sum(not t.tuned and not t.alias for t in task_list),
        "alias_tasks": sum(t.alias for t in task_list),
        "lower_seconds": {t.key: t.lower_seconds for t in task_list},
    }
    return CompiledModel(plan, objects, constants, resolved, info, threading_runtime, libraries=libraries)


def check_tuned_records(
    mod: IRModule | Function,
    target: str | Target | None,
    params: Mapping[str, Any] | None,
    logs: Any,
    opt_level: int = 3,
    rounds: int = 5,
    default: CompiledModel | None = None,
    **options: Any,
) -> CompiledModel:
    """`build(..., check_tuned=True)`: the tuned build, less the records that are slower in the graph.

    A record is measured alone by the tuner; in the model its kernel runs between others, with other data in cache
    and the thread team in another state. So the tuned and the default model are both built and profiled in
    interleaved rounds (`CompiledModel.profile_calls`: times taken in generated code between kernel calls); a task
    whose tuned kernel is slower in the graph than its default one falls back to the default schedule, and the
    model is rebuilt without those records. Last, the result is timed end to end against the default build, in
    interleaved rounds, and the default build is returned if it is faster. `build_info["tuned_check"]` says what
    was compared and decided. `default`: the same model already built with default schedules (the tuner has one
    from timing the model before tuning), used instead of building it again.
    """
    tuned = build(mod, target, params, logs, opt_level, **options)
    if resolve_target(target).kind != "llvm" or not any(t.tuned for t in tuned.plan.tasks):
        return tuned  # GPU models have no in-graph profile to compare with
    # The default build has no records by design, and the rebuild below none for the rejected tasks.
    relaxed = {k: v for k, v in options.items() if k != "require_tuned"}
    if default is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BuildWarning)
            default = build(mod, target, params, None, opt_level, **relaxed)
    inputs = tuned.random_inputs(seed=0)
    # Decisions compare the fastest of the interleaved samples: interference only ever adds time, and on a shared
    # 2-core machine one slow burst moved a median by 10-60% (two identical builds, or a tuned build "1.67x
    # slower" than the default it had only a few records apart from). Medians are what the check reports.
    in_tuned, in_default = _task_seconds((tuned, default), inputs, rounds, statistic=min)
    slower = {t.key for t in tuned.plan.tasks
              if t.tuned and t.key in in_default and in_tuned.get(t.key, 0.0) > in_default[t.key]}
    check: dict[str, Any] = {
        "tasks": {t.key: {"tuned_s": in_tuned.get(t.key), "default_s": in_default.get(t.key)}
                  for t in tuned.plan.tasks if t.tuned},
        "rejected": sorted(slower),
    }
    result = tuned
    if slower:
        lookup = task_lookup(logs)
        assert lookup is not None

        def without_slower(spec: Any, target: Target) -> Sequence[Any] | None:
            return None if spec.key in slower else lookup(spec, target)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BuildWarning)
            result = build(mod, target, params, _SpecLookup(without_slower), opt_level, **relaxed)
    # End to end: tuned <= default, measured here rather than assumed from the per-task sums.
    samples = interleaved_samples((result, default), inputs, rounds)
    mine, theirs = (statistics.median(x) for x in samples)
    kept_default = min(samples[0]) > min(samples[1])
    check.update(tuned_e2e_s=mine, default_e2e_s=theirs, kept_default=kept_default)
    chosen = default if kept_default else result
    chosen.build_info["tuned_check"] = check
    return chosen


class _SpecLookup:
    """A lookup that takes the task spec itself (`TaskLookup`), passed through `task_lookup` unchanged."""

    def __init__(self, fn: TaskLookup) -> None:
        self.fn = fn


def _task_seconds(models: Sequence[CompiledModel], inputs: Mapping[str, Any], rounds: int,
                  statistic: Callable[[Sequence[float]], float] = statistics.median) -> list[dict[str, float]]:
    """Per model, per task key: seconds the task's calls take in one run, `statistic` over interleaved rounds."""
    per_round: list[list[dict[str, float]]] = [[] for _ in models]
    for _ in range(rounds):
        for model, rows in zip(models, per_round):
            spent: dict[str, float] = {}
            for call, seconds in zip(model.plan.calls, model.profile_calls(repeat=1, inputs=inputs)):
                if call.task >= 0:  # packing calls belong to no task; the end-to-end check covers them
                    key = model.plan.tasks[call.task].key
                    spent[key] = spent.get(key, 0.0) + seconds
            rows.append(spent)
    return [{key: statistic([r[key] for r in rows]) for key in rows[0]} for rows in per_round]


def interleaved_latency(models: Sequence[Any], inputs: Mapping[str, Any] | None = None, rounds: int = 5,
                        repeat: int = 3) -> list[float]:
    """Per model, median seconds per inference over interleaved rounds of `benchmark` (`interleaved_samples`)."""
    return [statistics.median(s) for s in interleaved_samples(models, inputs, rounds, repeat)]


def interleaved_samples(models: Sequence[Any], inputs: Mapping[str, Any] | None = None, rounds: int = 5,
                        repeat: int = 3) -> list[list[float]]:
    """Per model, seconds of every timed inference over interleaved rounds of `benchmark` (which warms up first),
    so every model sees the same machine load; a model passed twice is timed once. GPU models' `benchmark` returns
    the costs as a list."""
    distinct = {id(model): model for model in models}
    costs: dict[int, list[float]] = {key: [] for key in distinct}
    for _ in range(rounds):
        for key, model in distinct.items():
            stats = model.benchmark(repeat=repeat, inputs=inputs)
            costs[key].extend(stats.costs if hasattr(stats, "costs") else stats)
    return [costs[id(model)] for model in models]


def _check_plan_fits(plan: Any, constants: Sequence[Any]) -> None:
    """A clear error when the memory plan (arena, constants, inputs, outputs) exceeds the memory available."""
    parts = {
        "intermediates": int(plan.memory.arena_bytes),
        "constants": sum(int(getattr(c, "nbytes", 0)) for c in constants),
        "inputs": sum(int(plan.values[i.value].nbytes) for i in plan.inputs),
        "outputs": sum(int(plan.storages[s].nbytes) for s in plan.storages_of_kind("output")),
    }
    check_memory(sum(parts.values()), parts, "the model's memory plan")


def _lower_one(
    spec: Any, target: Target, lookup: TaskLookup | None, kernel_name: str, untuned: list[str],
    view: bool | None = None,
) -> LoweredTask:
    begin = time.perf_counter()
    common = dict(key=spec.key, description=spec.description, occurrences=spec.occurrences, flops=spec.flops,
                  func=spec.func)
    if is_memory_view(spec.func) if view is None else view:
        empty = tir.PrimFunc(kernel_name, (), tir.Seq(()))
        return LoweredTask(**common, primfunc=empty, bindings=(), tuned=False, alias=True)  # type: ignore[arg-type]
    steps = lookup(spec, target) if lookup is not None else None
    tuned = steps is not None
    if steps is None and lookup is not None:
        untuned.append(f"{spec.key[:12]} {spec.description}")
    if steps is None:
        steps = _default_steps(spec, target)
    try:
        primfunc, bindings = lower_task(spec.func, target, steps, kernel_name)
    except RelayTuneError as err:
        if not tuned:
            raise CompileError(f"cannot compile fused function {spec.description}: {err}") from err
        warnings.warn(
            f"the tuned schedule of task {spec.key[:12]} ({spec.description}) does not apply ({err}); using its "
            "default schedule",
            BuildWarning,
            stacklevel=3,
        )
        tuned = False
        primfunc, bindings = lower_task(spec.func, target, _default_steps(spec, target), kernel_name)
    return LoweredTask(**common, primfunc=primfunc, bindings=bindings, tuned=tuned, kernel_name=kernel_name,  # type: ignore[arg-type]
                       lower_seconds=time.perf_counter() - begin)


def _default_steps(spec: Any, target: Target) -> list[Any]:
    """The default schedule of a task: its family template at the default config of its workload, weights that
    are constants at every call site counted as constants (the same config the tuner measures and logs first)."""
    return default_steps(spec.func, target, constant_inputs(spec))
