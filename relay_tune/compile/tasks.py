"""Lowered tasks: each fused function's kernel, and which relay tensor feeds each kernel parameter.

A task is lowered with tuned schedule steps when the tuning-log lookup has them for its workload, else with its
default schedule; a fused group that only moves elements without moving them in memory (`is_memory_view`) gets
no kernel at all (its output aliases its input).
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_tune.compile.lookup import BuildWarning, TaskLookup
from relay_tune.compile.primitive import OUTPUT, lower_primitive
from relay_tune.compile.trees import flatten_types
from relay_tune.errors import CompileError, RelayTuneError
from relay_tune.ir import Call, Function, Op, TensorType
from relay_tune.kernel import tir
from relay_tune.kernel.lower import lower
from relay_tune.kernel.recurrent import fixed_kernel, fixed_kernel_call, fixed_kernel_inputs
from relay_tune.kernel.schedule import Schedule
from relay_tune.op.registry import get_op
from relay_tune.passes.base import dataflow_post_order
from relay_tune.passes.extract_tasks import TaskSpec, constant_inputs
from relay_tune.passes.fuse_ops import RESHAPE_LIKE_OPS
from relay_tune.target import Target
from search_space.defaults import default_steps

VIEW_OPS = RESHAPE_LIKE_OPS | {"layout_transform", "transpose"}
"""Operators that only move elements: a fused group of them alone may leave every element where it is."""

VIEW_CHECK_LIMIT = 1 << 22
"""Largest tensor (elements) whose layout-moving group is checked for memory identity; larger ones stay kernels."""


@dataclass(frozen=True)
class ParamBinding:
    """Where one kernel parameter comes from: flattened input `index` of the fused function (`kind` "input"),
    the same input packed by `pack` ("packed"), or flattened output `index` ("output")."""

    kind: str
    index: int
    pack: Any = None  # a LayoutTransform-like object with `pack(array)` and `pack_compute()`


@dataclass
class LoweredTask:
    """One task as the build compiles it: its kernel (`primfunc`, named `kernel_name`) and parameter bindings."""

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


def slug(text: str) -> str:
    """`text` as a lower-case identifier fragment (for kernel names)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_").lower()


def packing_kernel(layout: Any, name: str, target: Target | None = None) -> tir.PrimFunc:
    """The kernel `name(src, packed)` that packs a run-time input into `layout` (a `LayoutTransform`), as a model
    runs it before the kernel that reads it packed (and as the tuner's runner times it with that kernel).

    On a CPU target (`None`: a CPU) the copy runs on all cores and reads the source a cache line at a time
    (`LayoutTransform.pack_schedule`); a GPU build gets the plain loop nest (its back end runs it on one thread)."""
    if target is not None and target.kind != "llvm":
        _src, packed = layout.pack_compute()
        return lower(Schedule([packed]), name)
    return lower(layout.pack_schedule(), name)


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
    return _permutes_nothing(func, calls, param_type.static_shape)


def _permutes_nothing(func: Function, calls: Sequence[Call], shape: tuple[int, ...]) -> bool:
    """Whether the chain of `calls` over `func`'s one input leaves the numbers 0, 1, ... in order."""
    numbers = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
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


def placeholder_task(spec: TaskSpec, alias: bool = False) -> LoweredTask:
    """A task with no kernel: a memory view (`alias`), or a concatenation written in place; each parameter is
    read as it is and each output written (what the planner needs to place values)."""
    out_type = spec.func.body.checked_type if spec.func.body.has_type() else spec.func.ret_type
    inputs = sum(len(flatten_types(p.checked_type if p.has_type() else p.type_annotation))
                 for p in spec.func.params)
    bindings = tuple(ParamBinding("output", i) for i in range(len(flatten_types(out_type))))
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


def lower_one(
    spec: TaskSpec, target: Target, lookup: TaskLookup | None, kernel_name: str, untuned: list[str],
    view: bool | None = None,
) -> LoweredTask:
    """Task `spec` lowered for `target`: tuned steps from `lookup` when it has them (else the default schedule,
    and the task is named in `untuned`), no kernel for a memory view (`view`; None: decided here)."""
    begin = time.perf_counter()
    common = dict(key=spec.key, description=spec.description, occurrences=spec.occurrences, flops=spec.flops,
                  func=spec.func)
    if is_memory_view(spec.func) if view is None else view:
        empty = tir.PrimFunc(kernel_name, (), tir.Seq(()))
        return LoweredTask(**common, primfunc=empty, bindings=(), tuned=False, alias=True)  # type: ignore[arg-type]
    if fixed_kernel_call(spec.func) is not None:  # a loop nest written by hand: no schedule to look up
        primfunc = fixed_kernel(spec.func, target, kernel_name)
        bindings = (*(ParamBinding("input", i) for i in fixed_kernel_inputs(spec.func)), ParamBinding("output", 0))
        return LoweredTask(**common, primfunc=primfunc, bindings=bindings, tuned=False, kernel_name=kernel_name,  # type: ignore[arg-type]
                           lower_seconds=time.perf_counter() - begin)
    steps = lookup(spec, target) if lookup is not None else None
    tuned = steps is not None
    if steps is None and lookup is not None:
        untuned.append(f"{spec.key[:12]} {spec.description}")
    if steps is None:
        steps = task_default_steps(spec, target)
    try:
        primfunc, bindings = lower_task(spec.func, target, steps, kernel_name)
    except RelayTuneError as err:
        if not tuned:
            raise CompileError(f"cannot compile fused function {spec.description}: {err}") from err
        warnings.warn(
            f"the tuned schedule of task {spec.key[:12]} ({spec.description}) does not apply ({err}); using its "
            "default schedule",
            BuildWarning,
            stacklevel=5,  # past the build to its caller
        )
        tuned = False
        primfunc, bindings = lower_task(spec.func, target, task_default_steps(spec, target), kernel_name)
    return LoweredTask(**common, primfunc=primfunc, bindings=bindings, tuned=tuned, kernel_name=kernel_name,  # type: ignore[arg-type]
                       lower_seconds=time.perf_counter() - begin)


def task_default_steps(spec: TaskSpec, target: Target) -> list[Any]:
    """The default schedule of a task: its family template at the default config of its workload, weights that
    are constants at every call site counted as constants (the same config the tuner measures and logs first)."""
    return default_steps(spec.func, target, constant_inputs(spec))
