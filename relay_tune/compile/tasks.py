"""Lowered tasks: each fused function's kernel, and which relay tensor feeds each kernel parameter.

A task is lowered with tuned schedule steps when the tuning-log lookup has them for its workload, else with its
default schedule; a fused group that only moves elements without moving them in memory (`is_memory_view`) gets
no kernel at all (its output aliases its input).

Lowered kernels are kept on disk beside the compiled objects (`LoweredCache`, the kernel cache's `lowered/`
folder): a task lowered before on this machine with the same steps, target and compiler is read back (a pickle of
its loop nest and bindings, checksummed) instead of lowered again, and a default schedule is not even derived. The
key is the task's workload key, its constant inputs, the steps (or "default"), the kernel name, the target and
`compiler_identity` (the sources of relay-tune and its schedule templates), so a changed compiler never reads an
old loop nest. Like the object files, these are this user's own cache: a pickle read from it is code this user's
builds wrote.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_tune.compile.kernel_cache import KernelObjectCache, compiler_identity, kernel_cache_enabled, loop_nest_digest
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
from relay_tune.records.cache import default_cache_dir
from relay_tune.target import Target
from search_space.defaults import default_steps
from search_space.families.lstm import lstm_call, lstm_kernel_from_steps

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
    digest: str = ""  # `loop_nest_digest(primfunc)` when known (the kernel cache's key reads it)


class LoweredCache:
    """Lowered kernels of tasks by key (see the module docstring), in checksummed files of a `KernelObjectCache`."""

    def __init__(self, store: KernelObjectCache) -> None:
        self.store = store

    @classmethod
    def default(cls) -> LoweredCache | None:
        """The per-user cache (the kernel cache's `lowered/` folder), or None when the kernel cache is off."""
        if not kernel_cache_enabled():
            return None
        return cls(KernelObjectCache(default_cache_dir() / "lowered", suffix=".pickle"))

    def key(self, spec: TaskSpec, target: Target, steps: Sequence[Any] | None, kernel_name: str) -> str:
        """The key of `spec` lowered into `kernel_name` with `steps` (None: its default schedule)."""
        parts = (compiler_identity(), str(target), target.mcpu or "", target.llvm_features or "",
                 str(target.num_cores), spec.key, repr(constant_inputs(spec)), kernel_name,
                 "default" if steps is None else repr(list(steps)))
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()

    def load(self, key: str) -> tuple[tir.PrimFunc, tuple[ParamBinding, ...], str] | None:
        """The kernel, bindings and loop-nest digest stored under `key`, or None (also for anything unreadable)."""
        data = self.store.load(key)
        if data is None:
            return None
        try:
            primfunc, bindings, digest = pickle.loads(data)
        except Exception:  # an entry of another layout of these classes: lower again
            return None
        if not isinstance(primfunc, tir.PrimFunc) or not isinstance(digest, str):
            return None
        return primfunc, tuple(bindings), digest

    def store_lowered(self, key: str, primfunc: tir.PrimFunc, bindings: tuple[ParamBinding, ...]) -> str:
        """Keep a lowered kernel under `key`; its loop-nest digest."""
        digest = loop_nest_digest(primfunc)
        try:
            data = pickle.dumps((primfunc, bindings, digest), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError):
            return digest  # a binding that cannot be pickled: this task is lowered every time
        self.store.store(key, data)
        return digest


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
    view: bool | None = None, cache: LoweredCache | None = None,
) -> LoweredTask:
    """Task `spec` lowered for `target`: tuned steps from `lookup` when it has them (else the default schedule,
    and the task is named in `untuned`), no kernel for a memory view (`view`; None: decided here). With `cache`,
    a kernel lowered before with the same steps is read from it, and what is lowered is stored there."""
    begin = time.perf_counter()
    common = dict(key=spec.key, description=spec.description, occurrences=spec.occurrences, flops=spec.flops,
                  func=spec.func)
    if is_memory_view(spec.func) if view is None else view:
        empty = tir.PrimFunc(kernel_name, (), tir.Seq(()))
        return LoweredTask(**common, primfunc=empty, bindings=(), tuned=False, alias=True)  # type: ignore[arg-type]
    if fixed_kernel_call(spec.func) is not None:  # a loop nest written by hand: an LSTM's may have tuned steps
        primfunc, tuned = _fixed_kernel(spec, target, lookup, kernel_name, untuned)
        bindings = (*(ParamBinding("input", i) for i in fixed_kernel_inputs(spec.func)), ParamBinding("output", 0))
        return LoweredTask(**common, primfunc=primfunc, bindings=bindings, tuned=tuned, kernel_name=kernel_name,  # type: ignore[arg-type]
                           lower_seconds=time.perf_counter() - begin)
    steps = lookup(spec, target) if lookup is not None else None
    tuned = steps is not None
    if steps is None and lookup is not None:
        untuned.append(f"{spec.key[:12]} {spec.description}")
    key = cache.key(spec, target, steps, kernel_name) if cache is not None else ""
    found = cache.load(key) if cache is not None else None
    if found is not None:
        primfunc, bindings, digest = found
        return LoweredTask(**common, primfunc=primfunc, bindings=bindings, tuned=tuned,  # type: ignore[arg-type]
                           kernel_name=kernel_name, lower_seconds=time.perf_counter() - begin, digest=digest)
    if steps is None:
        steps = task_default_steps(spec, target)
    try:
        primfunc, bindings = lower_task(spec.func, target, steps, kernel_name)
        digest = cache.store_lowered(key, primfunc, bindings) if cache is not None else ""
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
        digest = ""  # the tuned key's entry would not be this kernel: not stored, warned about again next time
    return LoweredTask(**common, primfunc=primfunc, bindings=bindings, tuned=tuned, kernel_name=kernel_name,  # type: ignore[arg-type]
                       lower_seconds=time.perf_counter() - begin, digest=digest)


def _fixed_kernel(spec: TaskSpec, target: Target, lookup: TaskLookup | None, kernel_name: str,
                  untuned: list[str]) -> tuple[tir.PrimFunc, bool]:
    """A fixed kernel's loop nest and whether it is tuned: an LSTM kernel with the steps `lookup` has for it (its
    `lstm` family config), else (and for a fixed kernel without a space) the kernel's default."""
    if lstm_call(spec.func) is None:
        return fixed_kernel(spec.func, target, kernel_name), False
    steps = lookup(spec, target) if lookup is not None else None
    if steps is None:
        if lookup is not None:
            untuned.append(f"{spec.key[:12]} {spec.description}")
        return fixed_kernel(spec.func, target, kernel_name), False
    try:
        return lstm_kernel_from_steps(spec.func, target, kernel_name, steps), True
    except RelayTuneError as err:
        warnings.warn(f"the tuned schedule of task {spec.key[:12]} ({spec.description}) does not apply ({err}); "
                      "using its default schedule", BuildWarning, stacklevel=6)
        return fixed_kernel(spec.func, target, kernel_name), False


def task_default_steps(spec: TaskSpec, target: Target) -> list[Any]:
    """The default schedule of a task: its family template at the default config of its workload, weights that
    are constants at every call site counted as constants (the same config the tuner measures and logs first)."""
    return default_steps(spec.func, target, constant_inputs(spec))
