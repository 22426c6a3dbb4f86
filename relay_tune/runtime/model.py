"""Compiled models: a graph plan of kernel calls over planned buffers, run from precomputed addresses.

A `CompiledModel` is what `relay_tune.build` returns and what `relay_tune.runtime.load` reads back:

    model = relay_tune.build(mod, target="llvm -mcpu=native")
    out = model.run(x=image)                  # or model.run(image); a tuple for tuple outputs
    model.benchmark(repeat=20)                # latency statistics of whole-model runs
    model.profile()                           # time per task (fused kernel), for the tuner's summary
    model.memory_report()                     # arena bytes against one buffer per tensor
    model.save("model.rtmod"); relay_tune.runtime.load("model.rtmod")

The graph plan (`GraphPlan`) is plain data:

- *values*: every tensor the model computes or reads, each with a shape, dtype and a *storage*;
- *storages*: where values live. `input` (the caller's array, or an aligned copy of it), `constant` (an array
  made at build time: weights, and weights already packed into the layout a kernel's schedule reads), `arena`
  (a slot of the one arena of intermediate tensors, placed by `relay_tune.runtime.memory_plan`) and `output`
  (a fresh array per run, handed to the caller). Several values share a storage when one is a pure reshape
  of another: the reshape is an alias, not a copy;
- *calls*: kernel invocations in topological order, each naming the values passed as the kernel's parameters.

Running writes the input and output addresses into the slot table of the model's native executor
(`relay_tune.runtime.executor`: generated code that calls every kernel in order) and makes one ctypes call
(which releases the GIL; the kernels spread their own work over the cores). Arena and constant addresses are
filled in once, when the model is loaded, and the executor is generated then from the plan. Runs are
serialised by a lock because they share the arena.

The saved file is a zip archive: `manifest.json` (format version, target, graph plan, kernel signatures),
`kernels/<i>.o` (relocatable object code, JIT-linked on load without recompiling) and `constants/<i>.npy`
(written and read with pickling disabled).
"""

from __future__ import annotations

import io
import json
import math
import mmap
import os
import statistics
import struct
import sys
import threading
import time
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import llvmlite.binding as llvm
import numpy as np

from relay_tune.codegen.jit import KernelLibrary, KernelSignature, ParamSpec, aligned_empty, load_object
from relay_tune.codegen.thread_team import NativeThreadTeam
from relay_tune.errors import RelayTuneError
from relay_tune.ir.dtypes import LOW_PRECISION_DTYPES, ml_dtypes_module
from relay_tune.op._shape import is_float_dtype, is_int_dtype, numpy_dtype
from relay_tune.runtime.executor import NativeExecutor
from relay_tune.runtime.memory_plan import DEFAULT_ALIGNMENT, MemoryPlan
from relay_tune.runtime.pages import pack
from relay_tune.target import Target
from relay_tune.version import __version__

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "CompiledModel",
    "GraphPlan",
    "InputInfo",
    "KernelCall",
    "LatencyStats",
    "MemoryReport",
    "ModelFormatError",
    "ModelInputError",
    "Storage",
    "TargetMismatchError",
    "TaskInfo",
    "TaskProfile",
    "Value",
    "check_target_compatible",
    "load",
]

_LOCAL_HEADER_BYTES = 30  # a zip member's local header before its name and extra field
_NPY_HEADER_LIMIT = 1 << 16  # an .npy header is at most this long (version 2 allows 4 GiB; numpy writes < 64 KiB)

FORMAT_NAME = "relay-tune-model"
FORMAT_VERSION = 1
STORAGE_KINDS = ("input", "constant", "arena", "output")
PACKING_TASK = -1  # `KernelCall.task` of helper kernels that pack run-time weights for a tuned kernel


class ModelInputError(RelayTuneError):
    """Inputs given to a compiled model do not match its parameters."""


class ModelFormatError(RelayTuneError):
    """A saved model file that cannot be read (not a model, damaged, or from an incompatible version)."""


class TargetMismatchError(RelayTuneError):
    """A saved model was compiled for a CPU whose features this machine lacks."""


# ---------------------------------------------------------------------------------------------------------------------
# The graph plan (plain data)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Storage:
    """Memory that one or more values live in.

    `index` is the input position (kind "input"), the constant number ("constant"), the buffer number of the
    memory plan ("arena") or the output buffer number ("output"). Several arena storages may lie in one buffer of
    the memory plan, at their `offset`s: the inputs of a concatenation that their producers write in place.
    """

    kind: str
    index: int
    nbytes: int
    offset: int = 0  # bytes into the arena buffer: a part of another tensor's buffer (a concatenation's input)

    def __post_init__(self) -> None:
        if self.kind not in STORAGE_KINDS:
            raise ValueError(f"unknown storage kind {self.kind!r}")
        if self.offset and self.kind != "arena":
            raise ValueError(f"only arena storages lie inside another buffer, not {self.kind!r} ones")


@dataclass(frozen=True)
class Value:
    """A tensor of the model: its type and the storage it lives in (at offset 0)."""

    shape: tuple[int, ...]
    dtype: str
    storage: int

    def __post_init__(self) -> None:
        if self.dtype in LOW_PRECISION_DTYPES:  # numpy knows its name once ml_dtypes is imported
            ml_dtypes_module()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class KernelCall:
    """One kernel invocation: `args[i]` is the value passed as the kernel's parameter i."""

    kernel: str
    task: int  # index into GraphPlan.tasks, or PACKING_TASK
    args: tuple[int, ...]


@dataclass(frozen=True)
class TaskInfo:
    """One distinct fused function of the model and the kernel compiled for it."""

    key: str
    description: str
    kernel: str
    tuned: bool
    occurrences: int
    flops: int


@dataclass(frozen=True)
class InputInfo:
    name: str
    value: int


OutputTree = Union[int, tuple["OutputTree", ...]]  # noqa: UP007 (recursive alias)


@dataclass(frozen=True)
class GraphPlan:
    inputs: tuple[InputInfo, ...]
    values: tuple[Value, ...]
    storages: tuple[Storage, ...]
    calls: tuple[KernelCall, ...]
    outputs: OutputTree
    tasks: tuple[TaskInfo, ...]
    memory: MemoryPlan

    def output_values(self) -> list[int]:
        """The output tree's values, depth first."""
        found: list[int] = []
        stack: list[OutputTree] = [self.outputs]
        while stack:
            node = stack.pop()
            if isinstance(node, tuple):
                stack.extend(reversed(node))
            else:
                found.append(node)
        return found

    def storages_of_kind(self, kind: str) -> list[int]:
        return [i for i, s in enumerate(self.storages) if s.kind == kind]

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": [{"name": i.name, "value": i.value} for i in self.inputs],
            "values": [{"shape": list(v.shape), "dtype": v.dtype, "storage": v.storage} for v in self.values],
            "storages": [{"kind": s.kind, "index": s.index, "nbytes": s.nbytes, **({"offset": s.offset} if s.offset
                                                                                  else {})} for s in self.storages],
            "calls": [{"kernel": c.kernel, "task": c.task, "args": list(c.args)} for c in self.calls],
            "outputs": _tree_to_json(self.outputs),
            "tasks": [
                {"key": t.key, "description": t.description, "kernel": t.kernel, "tuned": t.tuned,
                 "occurrences": t.occurrences, "flops": t.flops}
                for t in self.tasks
            ],
            "memory": self.memory.to_json(),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> GraphPlan:
        return GraphPlan(
            inputs=tuple(InputInfo(str(i["name"]), int(i["value"])) for i in data["inputs"]),
            values=tuple(
                Value(tuple(int(d) for d in v["shape"]), str(v["dtype"]), int(v["storage"])) for v in data["values"]
            ),
            storages=tuple(Storage(str(s["kind"]), int(s["index"]), int(s["nbytes"]), int(s.get("offset", 0)))
                           for s in data["storages"]),
            calls=tuple(
                KernelCall(str(c["kernel"]), int(c["task"]), tuple(int(a) for a in c["args"])) for c in data["calls"]
            ),
            outputs=_tree_from_json(data["outputs"]),
            tasks=tuple(
                TaskInfo(str(t["key"]), str(t["description"]), str(t["kernel"]), bool(t["tuned"]),
                         int(t["occurrences"]), int(t["flops"]))
                for t in data["tasks"]
            ),
            memory=MemoryPlan.from_json(data["memory"]),
        )


def _tree_to_json(tree: OutputTree) -> Any:
    return [_tree_to_json(t) for t in tree] if isinstance(tree, tuple) else tree


def _tree_from_json(data: Any) -> OutputTree:
    return tuple(_tree_from_json(d) for d in data) if isinstance(data, list) else int(data)


def signature_to_json(sig: KernelSignature) -> dict[str, Any]:
    assert sig.params is not None
    return {
        "name": sig.name,
        "align": sig.align,
        "params": [
            {"name": p.name, "shape": list(p.shape), "dtype": p.dtype, "written": p.written} for p in sig.params
        ],
    }


def signature_from_json(data: Mapping[str, Any]) -> KernelSignature:
    if any(p["dtype"] in LOW_PRECISION_DTYPES for p in data["params"]):  # numpy knows their names from then on
        ml_dtypes_module()
    params = tuple(
        ParamSpec(str(p["name"]), tuple(int(d) for d in p["shape"]), str(p["dtype"]), bool(p["written"]))
        for p in data["params"]
    )
    return KernelSignature(str(data["name"]), params, int(data["align"]))


# ---------------------------------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LatencyStats:
    """Seconds per model run, one entry per repeat (each the mean of `number` back-to-back runs)."""

    costs: tuple[float, ...]
    number: int

    @property
    def median(self) -> float:
        return statistics.median(self.costs)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.costs)

    @property
    def min(self) -> float:
        return min(self.costs)

    @property
    def max(self) -> float:
        return max(self.costs)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.costs)

    def __str__(self) -> str:
        return (f"median {self.median * 1e3:.3f} ms, min {self.min * 1e3:.3f} ms, max {self.max * 1e3:.3f} ms "
                f"({len(self.costs)} x {self.number} runs)")


@dataclass(frozen=True)
class TaskProfile:
    """Time one task's kernel takes in one model run (all its calls), median over the profiled runs."""

    task: int  # index into GraphPlan.tasks, or PACKING_TASK
    key: str
    description: str
    tuned: bool
    calls: int
    seconds: float
    share: float  # of the summed kernel time of a run

    @property
    def per_call(self) -> float:
        """Seconds per call: what a tuning log records for one run of the task's kernel."""
        return self.seconds / max(1, self.calls)


@dataclass(frozen=True)
class MemoryReport:
    """Bytes a model needs, intermediates planned into one arena against one buffer per intermediate tensor."""

    arena_bytes: int
    naive_bytes: int
    lower_bound_bytes: int
    intermediate_tensors: int
    aliased_tensors: int  # values that are views of another value (pure reshapes)
    constant_bytes: int
    input_bytes: int
    output_bytes: int

    @property
    def saving(self) -> float:
        return 1.0 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0

    def __str__(self) -> str:
        mib = 2.0**20
        return (
            f"intermediates: {self.arena_bytes / mib:.2f} MiB arena vs {self.naive_bytes / mib:.2f} MiB one buffer "
            f"per tensor ({self.saving:.0%} saved; live-set lower bound {self.lower_bound_bytes / mib:.2f} MiB), "
            f"{self.intermediate_tensors} tensors, {self.aliased_tensors} reshape aliases; "
            f"constants {self.constant_bytes / mib:.2f} MiB, inputs {self.input_bytes / mib:.2f} MiB, "
            f"outputs {self.output_bytes / mib:.2f} MiB"
        )


# ---------------------------------------------------------------------------------------------------------------------
# The compiled model
# ---------------------------------------------------------------------------------------------------------------------


class CompiledModel:
    """A model compiled to kernels, with its graph plan, constants and memory arena (see the module docstring)."""

    def __init__(
        self,
        plan: GraphPlan,
        objects: Sequence[tuple[bytes, Sequence[KernelSignature]]],
        constants: Sequence[np.ndarray],
        target: Target,
        build_info: Mapping[str, Any] | None = None,
        threading_runtime: str = "auto",
        libraries: Sequence[KernelLibrary] | None = None,
    ) -> None:
        """`objects`: object code and the kernels it defines. `libraries`, when given, are those objects already
        loaded in this process (the builder loads them itself to time the load)."""
        self.plan = plan
        self.target = target
        self.build_info: dict[str, Any] = dict(build_info or {})
        self._objects = [(bytes(obj), tuple(sigs)) for obj, sigs in objects]
        # One block on huge pages for all constants: kernels stream them, and on small pages address translation
        # made the weight-bound classifier of ResNet-50 1.4x slower than the tuner measured (`pages`).
        self._constants = pack(constants)
        self._validate()
        if libraries is None:
            libraries = [load_object(obj, sigs, threading_runtime=threading_runtime) for obj, sigs in self._objects]
        self._libraries = list(libraries)
        self._kernels = {name: lib.get(name) for lib in self._libraries for name in lib.names}
        self._lock = threading.Lock()
        self._input_names = [i.name for i in plan.inputs]
        self._input_values = [plan.values[i.value] for i in plan.inputs]
        self._input_storage = [plan.values[i.value].storage for i in plan.inputs]
        self._output_storages = plan.storages_of_kind("output")
        self._arena = aligned_empty(max(plan.memory.arena_bytes, DEFAULT_ALIGNMENT), "uint8", DEFAULT_ALIGNMENT)
        self._staging: dict[int, np.ndarray] = {}
        self._bound_inputs: list[np.ndarray] = []
        # Output buffers of the last run, per output storage: (the array that owns the memory, its aligned view).
        self._handed_out: dict[int, tuple[np.ndarray, np.ndarray, tuple[int, int]]] = {}
        self._executor = self._prepare()
        self._input_align = self._input_alignment()

    # -- set-up ---------------------------------------------------------------------------------------------------
    def _validate(self) -> None:
        """Every value fits its storage and every storage its memory: a damaged plan must not let kernels write
        out of bounds."""
        plan = self.plan
        memory = plan.memory
        counts = {"input": len(plan.inputs), "constant": len(self._constants), "arena": len(memory.offsets),
                  "output": len(plan.storages_of_kind("output"))}
        for number, storage in enumerate(plan.storages):
            if not 0 <= storage.index < counts[storage.kind]:
                raise ModelFormatError(f"storage {number} refers to missing {storage.kind} {storage.index}")
            if storage.kind == "constant" and self._constants[storage.index].nbytes != storage.nbytes:
                raise ModelFormatError(f"constant {storage.index} does not have the {storage.nbytes} bytes planned")
            if storage.kind == "arena" and (
                storage.offset < 0
                or storage.offset + storage.nbytes > memory.sizes[storage.index]
                or memory.offsets[storage.index] + memory.sizes[storage.index] > memory.arena_bytes
                or (memory.offsets[storage.index] + storage.offset) % DEFAULT_ALIGNMENT
            ):
                raise ModelFormatError(f"arena buffer {storage.index} lies outside the arena or is misaligned")
        for number, value in enumerate(plan.values):
            if not 0 <= value.storage < len(plan.storages) or value.nbytes > plan.storages[value.storage].nbytes:
                raise ModelFormatError(f"value {number} does not fit its storage")
        referenced = [i.value for i in plan.inputs] + plan.output_values() + [a for c in plan.calls for a in c.args]
        if any(not 0 <= v < len(plan.values) for v in referenced):
            raise ModelFormatError("the graph plan refers to values it does not define")
        for info in plan.inputs:
            storage = plan.storages[plan.values[info.value].storage]
            if storage.kind != "input" or storage.nbytes != plan.values[info.value].nbytes:
                raise ModelFormatError(f"input {info.name!r} is not bound to its own input storage")

    def _prepare(self) -> NativeExecutor:
        """Check every call against its kernel's parameters, then generate the executor over the slot table
        (one slot per storage: a value lives at offset 0 of its storage) and fill the slots that never change."""
        plan = self.plan
        calls: list[tuple[str, list[int]]] = []
        for call in plan.calls:
            kernel = self._kernels.get(call.kernel)
            if kernel is None:
                raise ModelFormatError(f"the graph plan calls kernel {call.kernel!r}, which no object code defines")
            params = kernel.signature.params
            if params is not None:
                if len(params) != len(call.args):
                    raise ModelFormatError(
                        f"kernel {call.kernel} takes {len(params)} parameters but the plan passes {len(call.args)}"
                    )
                for param, value_id in zip(params, call.args):
                    value = plan.values[value_id]
                    if value.nbytes != math.prod(param.shape) * np.dtype(param.dtype).itemsize:
                        raise ModelFormatError(
                            f"kernel {call.kernel}, parameter {param.name}: the plan passes a {value.dtype}"
                            f"{list(value.shape)} tensor where {param.dtype}{list(param.shape)} is expected"
                        )
            calls.append((call.kernel, [plan.values[v].storage for v in call.args]))
        addresses = {name: kernel.address for name, kernel in self._kernels.items()}
        # Parallel kernels on the native team: each run wakes its workers once, at its start, and keeps them
        # spinning until its end (`NativeThreadTeam.hold_symbols`), instead of one wake-up per parallel kernel
        # whose workers fell asleep during the serial kernels before it, or while the process idled between runs.
        team = next((lib.team for lib in self._libraries if isinstance(lib.team, NativeThreadTeam)), None)
        hold = team.hold_symbols() if team is not None else None
        executor = NativeExecutor(calls, len(plan.storages), addresses, self._libraries, hold=hold)
        arena_base = self._arena.ctypes.data
        for index, storage in enumerate(plan.storages):
            if storage.kind == "constant":
                executor.slots[index] = self._constants[storage.index].ctypes.data
            elif storage.kind == "arena":
                executor.slots[index] = arena_base + plan.memory.offsets[storage.index] + storage.offset
        return executor

    # -- running --------------------------------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return list(self._input_names)

    def input_info(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype) of every input, in parameter order."""
        return [(n, v.shape, v.dtype) for n, v in zip(self._input_names, self._input_values)]

    def output_info(self) -> OutputTree:
        return self.plan.outputs

    def run(self, *args: Any, **kwargs: Any) -> np.ndarray | tuple[Any, ...]:
        """Run the model on inputs given positionally (parameter order) and/or by name; returns fresh arrays."""
        return self._run_checked(self._check_inputs(args, kwargs))

    __call__ = run

    def _run_checked(self, arrays: Sequence[np.ndarray]) -> np.ndarray | tuple[Any, ...]:
        """One inference on checked inputs: fresh outputs, one call into the executor. `benchmark` times exactly
        this, so what it reports is what `run` costs (less the input checks, done once there)."""
        with self._lock:
            outputs = self._new_outputs()
            self._bind(arrays, outputs)
            self._executor.run()
            return self._collect(outputs)

    def _check_inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[np.ndarray]:
        names = self._input_names
        if len(args) > len(names):
            raise ModelInputError(f"the model takes {len(names)} input(s) ({_name_list(names)}), got {len(args)}")
        given: dict[str, Any] = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise ModelInputError(f"unknown input {name!r}; the model's inputs are {_name_list(names)}")
            if name in given:
                raise ModelInputError(f"input {name!r} given both by position and by name")
            given[name] = value
        missing = [n for n in names if n not in given]
        if missing:
            raise ModelInputError(f"missing input(s) {_name_list(missing)}; the model's inputs are {_name_list(names)}")
        return [_check_input(name, given[name], spec) for name, spec in zip(names, self._input_values)]

    def _new_outputs(self) -> dict[int, np.ndarray]:
        """Output buffers for one run: the previous run's buffer where the caller no longer holds it, else a fresh
        one. Fresh memory costs a page fault per page when the kernels first write it (a 4 MiB output: about a
        millisecond here, a quarter of a dense 1024^3 kernel), which the tuner's measurement never pays; a caller
        that drops each result (a serving loop, `benchmark`) now runs into memory already mapped and in cache."""
        outputs: dict[int, np.ndarray] = {}
        for storage in self._output_storages:
            previous = self._handed_out.get(storage)
            if previous is None or not _unreferenced(previous):
                previous = self._handed_out[storage] = _output_entry(self.plan.storages[storage].nbytes)
            outputs[storage] = previous[1]
        return outputs

    def _input_alignment(self) -> list[int]:
        """Per input, the byte alignment the kernels that read it assume (1: none beyond the element's own)."""
        needed: dict[int, int] = {}
        for call in self.plan.calls:
            align = self._kernels[call.kernel].signature.align
            for value_id in call.args:
                storage = self.plan.values[value_id].storage
                needed[storage] = max(needed.get(storage, 1), align)
        return [max(needed.get(storage, 1), 1) for storage in self._input_storage]

    def _bind(self, arrays: Sequence[np.ndarray], outputs: Mapping[int, np.ndarray]) -> None:
        """Write the input and output addresses into the executor's slots (data addresses through
        `__array_interface__`: `ndarray.ctypes.data` costs microseconds a call)."""
        slots = self._executor.slots
        self._bound_inputs = list(arrays)  # keeps the arrays alive while their addresses are in use
        for position, (array, storage) in enumerate(zip(arrays, self._input_storage)):
            address = array.__array_interface__["data"][0]
            if address % self._input_align[position] or not array.flags.c_contiguous or not array.flags.aligned:
                # A kernel that assumes more alignment than the array has, or a strided array: copy into an
                # aligned buffer kept for reuse. Kernels that assume only element alignment (every kernel the
                # templates make) read the caller's array in place, as the tuner measured them: a copy of the
                # input on every run would cost as much as a small kernel.
                staging = self._staging.get(position)
                if staging is None:
                    staging = self._staging[position] = aligned_empty(array.shape, array.dtype)
                np.copyto(staging, array)
                address = staging.__array_interface__["data"][0]
            slots[storage] = address
        for storage, buffer in outputs.items():
            slots[storage] = buffer.__array_interface__["data"][0]

    def _collect(self, outputs: Mapping[int, np.ndarray]) -> np.ndarray | tuple[Any, ...]:
        # No nested recursive closure here: a function that refers to itself is a reference cycle, which would
        # keep `outputs` (and so the output buffers) alive until the garbage collector runs, and a buffer still
        # referenced cannot be reused by the next run (`_new_outputs`).
        return self._collect_tree(self.plan.outputs, outputs, set())

    def _collect_tree(self, tree: OutputTree, outputs: Mapping[int, np.ndarray], handed_out: set[int]) -> Any:
        if isinstance(tree, tuple):
            return tuple(self._collect_tree(t, outputs, handed_out) for t in tree)
        value = self.plan.values[tree]
        storage = self.plan.storages[value.storage]
        if storage.kind == "output" and value.storage not in handed_out:
            handed_out.add(value.storage)
            return outputs[value.storage][: value.nbytes].view(value.dtype).reshape(value.shape)
        # The model returns an input, a constant, or the same tensor twice: every result gets its own array.
        return np.array(self._view(tree, outputs), copy=True)

    def _view(self, value_id: int, outputs: Mapping[int, np.ndarray]) -> np.ndarray:
        value = self.plan.values[value_id]
        storage = self.plan.storages[value.storage]
        if storage.kind == "output":
            raw = outputs[value.storage]
        elif storage.kind == "input":
            raw = self._bound_inputs[storage.index].reshape(-1).view(np.uint8)
        elif storage.kind == "constant":
            raw = self._constants[storage.index].reshape(-1).view(np.uint8)
        else:
            offset = self.plan.memory.offsets[storage.index] + storage.offset
            raw = self._arena[offset : offset + storage.nbytes]
        return raw[: value.nbytes].view(value.dtype).reshape(value.shape)

    # -- measuring ------------------------------------------------------------------------------------------------
    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded random inputs: normal floats, small non-negative integers (safe as indices), coin-flip bools."""
        rng = np.random.default_rng(seed)
        inputs: dict[str, np.ndarray] = {}
        for name, value in zip(self._input_names, self._input_values):
            dtype = numpy_dtype(value.dtype)
            if is_float_dtype(value.dtype):
                normal = rng.standard_normal(value.shape)
                # float8_e8m0fnu holds only positive powers of two
                inputs[name] = (np.abs(normal) if value.dtype == "float8_e8m0fnu" else normal).astype(dtype)
            elif is_int_dtype(value.dtype):
                inputs[name] = rng.integers(0, 2 if value.dtype == "int2" else 4, value.shape).astype(dtype)
            else:
                inputs[name] = rng.random(value.shape) < 0.5
        return inputs

    def benchmark(
        self, repeat: int = 10, number: int = 1, inputs: Mapping[str, Any] | None = None, warmup: int = 1
    ) -> LatencyStats:
        """Whole-model latency: `repeat` timings, each the mean of `number` back-to-back inferences.

        Every inference is what `run` does after checking its inputs (fresh outputs, one call into the executor),
        so the figure is the latency a caller of `run` sees."""
        if repeat < 1 or number < 1 or warmup < 0:
            raise RelayTuneError("benchmark needs repeat >= 1, number >= 1 and warmup >= 0")
        arrays = self._check_inputs((), inputs if inputs is not None else self.random_inputs())
        once = self._run_checked
        for _ in range(warmup):
            once(arrays)
        costs: list[float] = []
        clock = time.perf_counter
        for _ in range(repeat):
            start = clock()
            for _ in range(number):
                once(arrays)
            costs.append((clock() - start) / number)
        return LatencyStats(tuple(costs), number)

    def profile_calls(self, repeat: int = 5, inputs: Mapping[str, Any] | None = None) -> list[float]:
        """Seconds each kernel call takes inside a model run (the plan's call order), median over `repeat` runs.

        The times come from timestamps the executor takes between its calls, in generated code: they are the
        kernels' times in the model, with their real neighbours in cache, and they add up to the run."""
        if repeat < 1:
            raise RelayTuneError("profile needs repeat >= 1")
        arrays = self._check_inputs((), inputs if inputs is not None else self.random_inputs())
        runs: list[list[float]] = []
        with self._lock:
            outputs = self._new_outputs()  # held until the profiled runs are over: the kernels write into it
            self._bind(arrays, outputs)
            self._executor.run()  # warm-up
            for _ in range(repeat):
                runs.append(self._executor.run_profiled())
        return [statistics.median(run[i] for run in runs) for i in range(len(self.plan.calls))]

    def profile(self, repeat: int = 5, inputs: Mapping[str, Any] | None = None) -> list[TaskProfile]:
        """Time per task in one model run (summed over the task's calls; median over `repeat` runs), slowest first.

        See `profile_calls`: these are in-graph times, comparable with the times a tuning log records for the
        same kernels (`TaskProfile.per_call`)."""
        per_call = self.profile_calls(repeat, inputs)
        spent: dict[int, float] = {}
        counts: dict[int, int] = {}
        for call, seconds in zip(self.plan.calls, per_call):
            spent[call.task] = spent.get(call.task, 0.0) + seconds
            counts[call.task] = counts.get(call.task, 0) + 1
        total = sum(spent.values()) or 1.0
        rows: list[TaskProfile] = []
        for task, seconds in spent.items():
            if task == PACKING_TASK:
                key, description, tuned = "", "weight packing", False
            else:
                info = self.plan.tasks[task]
                key, description, tuned = info.key, info.description, info.tuned
            rows.append(TaskProfile(task, key, description, tuned, counts[task], seconds, seconds / total))
        rows.sort(key=lambda r: -r.seconds)
        return rows

    def memory_report(self) -> MemoryReport:
        plan = self.plan
        per_storage: dict[int, int] = {}
        for value in plan.values:
            per_storage[value.storage] = per_storage.get(value.storage, 0) + 1
        arena = plan.storages_of_kind("arena")
        return MemoryReport(
            arena_bytes=plan.memory.arena_bytes,
            naive_bytes=plan.memory.naive_bytes,
            lower_bound_bytes=plan.memory.lower_bound_bytes,
            intermediate_tensors=sum(per_storage.get(s, 0) for s in arena),
            aliased_tensors=sum(count - 1 for count in per_storage.values()),
            constant_bytes=sum(c.nbytes for c in self._constants),
            input_bytes=sum(v.nbytes for v in self._input_values),
            output_bytes=sum(plan.storages[s].nbytes for s in self._output_storages),
        )

    @property
    def num_kernel_calls(self) -> int:
        return len(self.plan.calls)

    @property
    def object_code(self) -> list[bytes]:
        return [obj for obj, _ in self._objects]

    def __repr__(self) -> str:
        inputs = ", ".join(f"{n}: {v.dtype}{list(v.shape)}" for n, v in zip(self._input_names, self._input_values))
        kernels = len({c.kernel for c in self.plan.calls})
        return f"CompiledModel(({inputs}) -> {len(self.plan.calls)} calls of {kernels} kernels)"

    # -- saving ---------------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model to one file (a zip archive; see the module docstring). Returns the path written."""

        path = Path(path)
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "relay_tune_version": __version__,
            "target": str(self.target),
            "triple": self.build_info.get("triple", ""),
            "objects": [
                {"file": f"kernels/{i}.o", "kernels": [signature_to_json(s) for s in sigs]}
                for i, (_, sigs) in enumerate(self._objects)
            ],
            "constants": [f"constants/{i}.npy" for i in range(len(self._constants))],
            "plan": self.plan.to_json(),
            "build_info": self.build_info,
        }
        return write_archive(path, manifest, [obj for obj, _ in self._objects], self._constants)


def _name_list(names: Sequence[str]) -> str:
    return ", ".join(f"%{n}" for n in names) or "none"


def _check_input(name: str, value: Any, spec: Value) -> np.ndarray:
    expected = f"{spec.dtype}{list(spec.shape)}"
    if isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
        if str(array.dtype) != spec.dtype:
            raise ModelInputError(f"input %{name}: expected dtype {spec.dtype} ({expected}), got {array.dtype}")
    elif isinstance(value, int | float | bool | list | tuple):
        try:
            array = np.asarray(value, dtype=spec.dtype)
        except (TypeError, ValueError) as err:
            raise ModelInputError(f"input %{name}: cannot convert to {expected}: {err}") from None
    else:
        raise ModelInputError(f"input %{name}: expected a numpy array ({expected}), got {type(value).__name__}")
    if array.shape != spec.shape:
        raise ModelInputError(f"input %{name}: expected shape {spec.shape} ({expected}), got {array.shape}")
    return array


def _output_entry(nbytes: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """A fresh output buffer: (the array owning the memory, its aligned byte view, their reference counts now,
    while nothing but the entry holds them)."""
    view = aligned_empty(max(nbytes, 1), "uint8", DEFAULT_ALIGNMENT)
    pair = (view.base if view.base is not None else view, view)
    del view
    counts = _reference_counts(pair)  # before anything else (a tuple being built) holds the arrays
    return pair[0], pair[1], counts


def _reference_counts(entry: tuple[np.ndarray, ...]) -> tuple[int, int]:
    return sys.getrefcount(entry[0]), sys.getrefcount(entry[1])


def _unreferenced(entry: tuple[np.ndarray, np.ndarray, tuple[int, int]]) -> bool:
    """Whether nothing outside the model holds an output buffer: every array handed to a caller, and any view of
    it, keeps the owning array referenced through `.base`, so its reference count is above the one taken when the
    buffer was made (counted the same way, so the check does not depend on how the interpreter counts)."""
    owner_count, view_count = _reference_counts(entry)
    return owner_count <= entry[2][0] and view_count <= entry[2][1]


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------


def host_triple() -> str:
    return str(llvm.get_process_triple())


def check_target_compatible(target: Target, triple: str = "", host: Target | None = None) -> None:
    """Raise `TargetMismatchError` unless code compiled for `target` (and `triple`) can run on this machine."""
    if target.kind != "llvm":
        raise TargetMismatchError(f"the model was compiled for {target}; only llvm (CPU) models can run here")
    if triple:
        here = host_triple()
        if triple.split("-")[0] != here.split("-")[0]:
            raise TargetMismatchError(
                f"the model was compiled for {triple.split('-')[0]} processors; this machine is {here.split('-')[0]}"
            )
    host = host or Target.host()
    wanted = [f[1:] for f in target.mattr if f.startswith("+")]
    if not wanted and target.mcpu:
        # No explicit features: the CPU name implies the ones that matter for generated code.
        wanted = [f for f in ("avx512f", "avx2", "avx", "fma") if target.has_feature(f)]
    missing = sorted(f for f in wanted if not host.has_feature(f))
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise TargetMismatchError(
            f"the model was compiled for {target.mcpu or 'a CPU'} with features this CPU ({host.mcpu}) lacks: "
            f"{shown}. Rebuild it on this machine (relay-tune build ... --target native)"
        )


def load(path: str | os.PathLike[str], threading_runtime: str = "auto", check_target: bool = True) -> CompiledModel:
    """Load a model written by `CompiledModel.save`: JIT-links its object code (no recompilation)."""
    path = Path(path)
    start = time.perf_counter()
    if not path.is_file():
        raise ModelFormatError(f"{path}: no such file")
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise ModelFormatError(f"{path}: not a relay-tune model file (not a zip archive)") from None
    with archive:
        try:
            manifest = json.loads(archive.read("manifest.json"))
        except KeyError:
            raise ModelFormatError(f"{path}: not a relay-tune model file (no manifest.json)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ModelFormatError(f"{path}: damaged manifest: {err}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
            raise ModelFormatError(f"{path}: not a relay-tune model file")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise ModelFormatError(
                f"{path}: model format version {version} is not supported (this relay-tune reads version "
                f"{FORMAT_VERSION}); rebuild the model"
            )
        try:
            target = Target.parse(manifest["target"])
            if check_target:
                check_target_compatible(target, manifest.get("triple", ""))
            plan = GraphPlan.from_json(manifest["plan"])
            objects = [
                (archive.read(entry["file"]), [signature_from_json(s) for s in entry["kernels"]])
                for entry in manifest["objects"]
            ]
            with open(path, "rb") as handle:
                mapped = _map_file(handle)
            constants = [_mapped_npy(archive, name, mapped) if mapped is not None else None
                         for name in manifest["constants"]]
            for i, name in enumerate(manifest["constants"]):
                if constants[i] is None:  # a compressed member (or no mapping): read through the zip stream
                    with archive.open(name) as stream:
                        constants[i] = _read_npy(stream)
        except (KeyError, TypeError, ValueError, zipfile.BadZipFile, EOFError, OSError) as err:
            raise ModelFormatError(f"{path}: damaged model file ({type(err).__name__}: {err})") from None
    info = dict(manifest.get("build_info") or {})
    model = CompiledModel(plan, objects, constants, target, info, threading_runtime=threading_runtime)
    model.build_info["load_seconds"] = time.perf_counter() - start
    return model


def _map_file(handle: Any) -> mmap.mmap | None:
    """The whole file mapped read-only, or None where it cannot be mapped (an empty file, no mmap)."""
    try:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def _mapped_npy(archive: zipfile.ZipFile, name: str, mapped: mmap.mmap) -> np.ndarray | None:
    """The .npy member `name` of an archive written uncompressed, as a read-only array over the file's mapping
    (no copy: the model copies it once, into its constants' block), its CRC-32 checked; None for a compressed
    member. Raises `zipfile.BadZipFile` or `ValueError` for a damaged one."""
    info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    header = mapped[info.header_offset : info.header_offset + _LOCAL_HEADER_BYTES]
    if len(header) != _LOCAL_HEADER_BYTES or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"bad local header of {name}")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    start = info.header_offset + _LOCAL_HEADER_BYTES + name_length + extra_length
    member = memoryview(mapped)[start : start + info.file_size]
    if len(member) != info.file_size:
        raise EOFError(f"truncated member {name}")
    if zlib.crc32(member) != info.CRC:
        raise zipfile.BadZipFile(f"bad CRC-32 of {name}")
    stream = io.BytesIO(member[: min(len(member), _NPY_HEADER_LIMIT)])
    shape, fortran, dtype = _npy_header(stream)
    count = math.prod(shape)
    if stream.tell() + count * dtype.itemsize != len(member):
        raise ValueError(f"{name}: the array does not fill its member")
    array = np.frombuffer(member, dtype=dtype, count=count, offset=stream.tell())
    if fortran:
        return np.ascontiguousarray(array.reshape(shape[::-1]).T)
    return array.reshape(shape)


def _npy_header(stream: Any) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """Shape, Fortran order and dtype of the .npy array `stream` starts with (object arrays refused)."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed in a model file")
    return shape, fortran, dtype


def _read_npy(stream: Any) -> np.ndarray:
    """Read one .npy array (pickled object arrays are refused). The model copies it into its constants' block
    (`relay_tune.runtime.pages.pack`), which gives the alignment kernels need."""
    shape, fortran, dtype = _npy_header(stream)
    array = np.empty(shape, dtype)
    view = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")
    filled = 0
    while filled < len(view):
        got = stream.readinto(view[filled:])
        if not got:
            raise EOFError("truncated constant array")
        filled += got
    if fortran:
        array = np.ascontiguousarray(array.reshape(shape[::-1]).T)
    return array


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a saved model, without loading its code (for inspection)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return dict(json.loads(archive.read("manifest.json")))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as err:
        raise ModelFormatError(f"{path}: not a readable relay-tune model file ({err})") from None



def write_archive(path: Path, manifest: Mapping[str, Any], objects: Sequence[bytes],
                  constants: Sequence[np.ndarray]) -> Path:
    """Write a saved model's zip file: `manifest.json`, `kernels/<i>.o`, `constants/<i>.npy` (uncompressed, so
    loading can map the constants), through a temporary file renamed into place. Returns `path`."""
    temporary = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            archive.writestr("manifest.json", json.dumps(manifest, indent=1))
            for i, obj in enumerate(objects):
                archive.writestr(f"kernels/{i}.o", obj)
            for i, constant in enumerate(constants):
                with archive.open(f"constants/{i}.npy", "w", force_zip64=True) as out:
                    np.lib.format.write_array(out, constant, allow_pickle=False)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    return path
