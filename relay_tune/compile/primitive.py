"""Building one fused primitive function into a kernel: compute -> schedule -> loop nest -> machine code.

    prim_func, packing = lower_primitive(func, target)            # loop nest + how to call it
    kernel = build_primitive(func, target)                         # compiled and loaded in this process
    out = kernel(x, w, b)                                          # logical inputs -> logical output(s)

`func` is a type-checked `Function` with `Primitive=1` as FuseOps produces (any function whose body is a
DAG of operator calls over its parameters works). `steps` / `schedule_steps` are schedule steps (or
their JSON dicts) for the function's tensor expressions; None uses the default schedule
(`search_space.defaults.default_steps`: the family template at its default config).

Kernel arguments are flat buffers: the logical inputs (tuple parameters flattened), some of them packed
into a blocked layout by the schedule (`transform_layout`, e.g. dense weights into column panels), then
the outputs. `PackingInfo` says which logical tensor each kernel parameter is and how to pack it; a model
runtime packs constant weights once with `PackingInfo.pack_input` and calls the kernel on the packed
arrays, while `CompiledPrimitive.__call__` packs on every call (convenient for tests).

This is the one-kernel compiler: it uses the kernel layer, the templates (`search_space`) and the code generator,
and the model compiler (`relay_tune.compile`) and the tuner use it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_tune.codegen.jit import KernelSignature, load_object
from relay_tune.codegen.llvm import compile_object
from relay_tune.errors import CompileError, RelayTuneError
from relay_tune.ir.expr import Call, Function, Op
from relay_tune.ir.traversal import post_order
from relay_tune.ir.types import TupleType
from relay_tune.kernel import tir
from relay_tune.kernel.compute import PrimitiveCompute, primitive_compute
from relay_tune.kernel.lower import lower
from relay_tune.kernel.schedule import LayoutTransform, Schedule, Step
from relay_tune.passes.extract_tasks import workload_key
from relay_tune.target import Target
from search_space.defaults import default_steps

StepLike = Step | Mapping[str, Any]

INPUT = "input"
OUTPUT = "output"


@dataclass(frozen=True)
class KernelParam:
    """One kernel parameter: logical input or output number `index` (flattened), possibly packed."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str  # INPUT or OUTPUT
    index: int
    layout: LayoutTransform | None = None  # inputs read through a packed layout: the kernel takes layout.pack(x)


@dataclass(frozen=True)
class PackingInfo:
    """How the kernel's parameters relate to the function's logical inputs and outputs (plain data)."""

    params: tuple[KernelParam, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]

    @property
    def packed_inputs(self) -> tuple[int, ...]:
        """Logical inputs the kernel reads in a packed layout."""
        return tuple(p.index for p in self.params if p.role == INPUT and p.layout is not None)

    def pack_input(self, index: int, array: np.ndarray) -> np.ndarray:
        """The kernel argument for logical input `index` (packed when the schedule packs it)."""
        for p in self.params:
            if p.role == INPUT and p.index == index:
                if p.layout is not None:
                    return p.layout.pack(array)
                return _contiguous(array)
        raise RelayTuneError(f"logical input {index} is not a kernel argument (the kernel does not read it)")

    def kernel_arguments(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                         packed: Mapping[int, np.ndarray] | None = None) -> list[np.ndarray]:
        """Arrays to pass to the kernel, in parameter order. `packed` holds already packed inputs by index."""
        if len(inputs) != len(self.input_shapes):
            raise RelayTuneError(f"the kernel takes {len(self.input_shapes)} inputs, got {len(inputs)}")
        if len(outputs) != len(self.output_shapes):
            raise RelayTuneError(f"the kernel has {len(self.output_shapes)} outputs, got {len(outputs)}")
        args: list[np.ndarray] = []
        for p in self.params:
            if p.role == OUTPUT:
                args.append(outputs[p.index])
            elif packed is not None and p.index in packed:
                args.append(packed[p.index])
            else:
                array = np.asarray(inputs[p.index])
                if tuple(array.shape) != self.input_shapes[p.index] or str(array.dtype) != self.input_dtypes[p.index]:
                    raise RelayTuneError(
                        f"input {p.index}: expected {self.input_dtypes[p.index]}{list(self.input_shapes[p.index])}, "
                        f"got {array.dtype}{list(array.shape)}"
                    )
                args.append(p.layout.pack(array) if p.layout is not None else _contiguous(array))
        return args


def _contiguous(array: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray turns a 0-d array into shape (1,); kernels check shapes exactly
    a = np.asarray(array)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)


def kernel_name(func: Function) -> str:
    """A readable, valid symbol for a primitive function: `fused_<ops>_<workload key prefix>`."""
    ops = [n.op.name for n in post_order(func.body) if isinstance(n, Call) and isinstance(n.op, Op)]
    words = [re.sub(r"[^0-9A-Za-z]+", "_", o.removeprefix("nn.")) for o in ops]
    head = "_".join(words)[:48] or "copy"
    digest = workload_key(func)[:8]
    return f"fused_{head}_{digest}"


def _as_steps(steps: Sequence[StepLike]) -> list[Step | dict[str, Any]]:
    return [s if isinstance(s, Step) else dict(s) for s in steps]


def lower_primitive(
    func: Function,
    target: Target | None = None,
    steps: Sequence[StepLike] | None = None,
    name: str | None = None,
    prim: PrimitiveCompute | None = None,
) -> tuple[tir.PrimFunc, PackingInfo]:
    """The loop-nest kernel of a primitive function and how to call it.

    `steps` replace the default schedule; `prim` (the function's tensor expressions, when the caller
    already built them) saves recomputing them. The default treats every input as a constant the schedule
    may pack (a kernel called on its own packs on every call); `relay_tune.build` says which inputs are model
    constants and passes the default steps of the model's task instead.
    """
    target = target or Target.host()
    prim = prim or primitive_compute(func)
    if steps is None:
        # Schedules are made by the templates of search_space; `None` is a convenience for callers (tests,
        # benchmarks) that want the default without asking for it.
        steps = default_steps(prim, target, constants=None)
    chosen = _as_steps(steps)
    schedule = Schedule.replay(chosen, prim.outputs)
    prim_func = lower(schedule, name or kernel_name(func))
    return prim_func, _packing_info(prim, schedule, prim_func)


def _packing_info(prim: PrimitiveCompute, schedule: Schedule, prim_func: tir.PrimFunc) -> PackingInfo:
    input_index = {t.name: i for i, t in enumerate(prim.inputs)}
    output_index = {schedule.stage_name(t): i for i, t in enumerate(prim.outputs)}
    layouts = {lt.packed: lt for lt in schedule.layout_transforms}
    params: list[KernelParam] = []
    for buf in prim_func.params:
        if buf.name in output_index:
            params.append(KernelParam(buf.name, buf.shape, buf.dtype, OUTPUT, output_index[buf.name]))
        elif buf.name in layouts:
            lt = layouts[buf.name]
            params.append(KernelParam(buf.name, buf.shape, buf.dtype, INPUT, input_index[lt.source], lt))
        elif buf.name in input_index:
            params.append(KernelParam(buf.name, buf.shape, buf.dtype, INPUT, input_index[buf.name]))
        else:
            raise CompileError(f"kernel parameter {buf.name} is neither an input nor an output (a bug)")
    return PackingInfo(
        tuple(params),
        tuple(t.shape for t in prim.inputs),
        tuple(t.dtype for t in prim.inputs),
        tuple(t.shape for t in prim.outputs),
        tuple(t.dtype for t in prim.outputs),
    )


class CompiledPrimitive:
    """A primitive function compiled and loaded in this process.

    `kernel` is the raw kernel (flat, packed arguments, see `packing`); calling the object itself takes
    the logical inputs, packs what needs packing, and returns freshly allocated outputs (a tuple when the
    function returns a tuple).
    """

    def __init__(self, kernel: Any, prim_func: tir.PrimFunc, packing: PackingInfo, returns_tuple: bool,
                 timings: Mapping[str, float] | None = None) -> None:
        self.kernel = kernel
        self.prim_func = prim_func
        self.packing = packing
        self.returns_tuple = returns_tuple
        self.timings = dict(timings or {})

    @property
    def name(self) -> str:
        return self.prim_func.name

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
            packed: Mapping[int, np.ndarray] | None = None) -> None:
        """Compute into preallocated `outputs` (C-contiguous, of the output shapes and dtypes)."""
        self.kernel(*self.packing.kernel_arguments(inputs, outputs, packed))

    def __call__(self, *inputs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        flat = _flatten_inputs(inputs)
        outputs = [np.empty(s, d) for s, d in zip(self.packing.output_shapes, self.packing.output_dtypes)]
        self.run(flat, outputs)
        return tuple(outputs) if self.returns_tuple else outputs[0]

    def __repr__(self) -> str:
        return f"CompiledPrimitive({self.name})"


def _flatten_inputs(inputs: Sequence[Any]) -> list[np.ndarray]:
    flat: list[np.ndarray] = []
    stack: list[Any] = list(reversed(inputs))
    while stack:
        item = stack.pop()
        if isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        else:
            flat.append(np.asarray(item))
    return flat


def build_primitive(
    func: Function,
    target: Target | None = None,
    schedule_steps: Sequence[StepLike] | None = None,
    name: str | None = None,
    threading_runtime: str = "auto",
    timings: MutableMapping[str, float] | None = None,
) -> CompiledPrimitive:
    """Compile a primitive function for `target` (default: this host) and load it.

    `timings`, when given, receives seconds per stage: compute_s, schedule_s (default schedule, lowering),
    and the code generator's lower_s, parse_s, optimize_s, emit_s, plus load_s.
    """
    target = target or Target.host()
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    prim = primitive_compute(func)
    t1 = time.perf_counter()
    prim_func, packing = lower_primitive(func, target, schedule_steps, name, prim)
    t2 = time.perf_counter()
    obj = compile_object([prim_func], target, timings=stages)
    t3 = time.perf_counter()
    library = load_object(obj, [KernelSignature.from_primfunc(prim_func)], threading_runtime=threading_runtime)
    t4 = time.perf_counter()
    stages.update(compute_s=t1 - t0, schedule_s=t2 - t1, codegen_s=t3 - t2, load_s=t4 - t3)
    if timings is not None:
        timings.update(stages)
    body_type = func.body.checked_type if func.body.has_type() else func.ret_type
    return CompiledPrimitive(library.get(prim_func.name), prim_func, packing, isinstance(body_type, TupleType),
                             stages)


__all__ = [
    "INPUT", "OUTPUT", "CompiledPrimitive", "KernelParam", "PackingInfo", "build_primitive", "kernel_name",
    "lower_primitive",
]
