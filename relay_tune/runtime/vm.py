"""The Relay virtual machine: compiled kernels with control flow (`if`, recursion, closures, tuples) between them.

A program whose entry function branches, calls other global functions or makes closures cannot be one static
list of kernel calls. `relay_tune.build` compiles it into a `VMProgram` instead (`relay_tune.compile.vm_compiler`):
every fused primitive function is a kernel exactly as in a static build, and a flat instruction list per function
says what runs between them. `VMModel` runs it:

    model = relay_tune.build(mod)           # a VMModel when `mod` has control flow, else a CompiledModel
    y = model.run(x=x)                      # same interface: run, benchmark, random_inputs, save
    relay_tune.runtime.vm.load_model(path)  # either kind of saved model

The program is plain data (JSON in the saved file). Registers are per call frame; a register holds a tensor
(`Tensor`: the array and its data address, taken once), a Python tuple of values, or a `VMClosure`.

Instructions (`Instr.op`; `dst` is the register written, `args` the registers read, `index` as noted):

- `kernel`: call kernel `kernels[index]` (inputs and output shapes in its `KernelCall`); dst gets the output, or a
  tuple of outputs.
- `pack`: like `kernel` for a run-time packing kernel (a weight that arrives as an argument, packed into the
  layout a tuned kernel reads), except that packing the very tensor it packed last time reuses that result: a
  loop that passes its weights along packs them once. (The cached source stays referenced, so no pool reuses
  and overwrites it meanwhile.)
- `view`: dst is `args[0]` reshaped to `shape` (a memory view fused group: no kernel).
- `move`: dst = args[0].
- `if`: when the 0-d boolean tensor args[0] is false, jump to instruction `index`. `jump`: go to `index`.
- `invoke`: call function `index` with args; its result goes to dst. `tail`: the same as the last thing this
  function does (the frame is replaced, so a recursive loop runs in constant stack). `ret`: return args[0].
- `tuple`: dst = tuple(args). `field`: dst = args[0][index].
- `closure`: dst = closure of function `index` over the captured values args (`self_slot`: the capture that is
  the closure itself, for a recursive let-bound function). `call_closure` / `tail_closure`: call closure args[0]
  with args[1:].
- `construct`: dst = the value of constructor `tag` of an algebraic data type over fields args (`VMData`).
  `if_tag`: when args[0] was not made by constructor `tag`, jump to `index` (a `match` clause that does not
  apply). `field` also reads the fields of such a value. `fail`: no clause of a `match` applied.

Execution is one Python loop over pre-decoded instruction tuples with an explicit frame stack (deep recursion
never touches Python's stack). Kernel outputs come from per-shape pools: a buffer is reused once nothing but its
pool references it (reference counts, as `CompiledModel` hands out output buffers), so a loop of any length runs
in the memory of a couple of iterations. Values returned to the caller are copies.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from relay_tune.codegen.jit import KernelLibrary, KernelSignature, aligned_empty, load_object
from relay_tune.errors import RelayTuneError
from relay_tune.runtime.memory_plan import DEFAULT_ALIGNMENT
from relay_tune.runtime.model import (
    CompiledModel,
    LatencyStats,
    ModelFormatError,
    ModelInputError,
    TaskInfo,
    _read_npy,
    check_target_compatible,
    load,
    signature_from_json,
    signature_to_json,
    write_archive,
)
from relay_tune.runtime.vm_loops import NativeLoop, find_loop
from relay_tune.target import Target
from relay_tune.version import __version__

__all__ = [
    "VM_FORMAT_NAME", "VM_FORMAT_VERSION", "Instr", "KernelCall", "Tensor", "VMClosure", "VMData", "VMFunction",
    "VMModel", "VMProgram", "load_model", "load_vm",
]

VM_FORMAT_NAME = "relay-tune-vm-model"
VM_FORMAT_VERSION = 1
OPS = ("kernel", "view", "move", "if", "jump", "invoke", "tail", "ret", "tuple", "field", "closure",
       "call_closure", "tail_closure", "pack", "construct", "if_tag", "fail")
_OP = {name: number for number, name in enumerate(OPS)}
(_KERNEL, _VIEW, _MOVE, _IF, _JUMP, _INVOKE, _TAIL, _RET, _TUPLE, _FIELD, _CLOSURE, _CALLC, _TAILC,
 _PACK, _CONSTRUCT, _IF_TAG, _FAIL) = range(len(OPS))


class VMError(RelayTuneError):
    """A program the virtual machine cannot run (a malformed program, or a value of the wrong kind at run time)."""


# ---------------------------------------------------------------------------------------------------------------------
# The program (plain data)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instr:
    """One instruction (see the module docstring for what each `op` does)."""

    op: str
    dst: int = -1
    args: tuple[int, ...] = ()
    index: int = -1
    shape: tuple[int, ...] = ()  # `view` only
    self_slot: int = -1  # `closure` only
    tag: int = -1  # `construct` and `if_tag` only

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"op": self.op}
        if self.dst >= 0:
            data["dst"] = self.dst
        if self.args:
            data["args"] = list(self.args)
        if self.index >= 0:
            data["index"] = self.index
        if self.op == "view":
            data["shape"] = list(self.shape)
        if self.self_slot >= 0:
            data["self_slot"] = self.self_slot
        if self.tag >= 0:
            data["tag"] = self.tag
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Instr:
        return Instr(str(data["op"]), int(data.get("dst", -1)), tuple(int(a) for a in data.get("args", ())),
                     int(data.get("index", -1)), tuple(int(d) for d in data.get("shape", ())),
                     int(data.get("self_slot", -1)), int(data.get("tag", -1)))


@dataclass(frozen=True)
class KernelCall:
    """A kernel call site: `params[i]` is the register passed as kernel parameter i, or output `-1 - params[i]`
    (`outputs[k]` is output k's shape and dtype); `tuple_result`: the result is a tuple of the outputs."""

    kernel: str
    task: int  # index into VMProgram.tasks, or -1 for a run-time packing kernel
    params: tuple[int, ...]
    outputs: tuple[tuple[tuple[int, ...], str], ...]
    tuple_result: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "task": self.task, "params": list(self.params),
                "outputs": [[list(s), d] for s, d in self.outputs], "tuple_result": self.tuple_result}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> KernelCall:
        return KernelCall(str(data["kernel"]), int(data["task"]), tuple(int(p) for p in data["params"]),
                          tuple((tuple(int(d) for d in s), str(t)) for s, t in data["outputs"]),
                          bool(data.get("tuple_result", False)))


@dataclass(frozen=True)
class VMFunction:
    """One function: `params` are the registers its arguments arrive in (a closure's captured values first),
    `constants` the (register, constant number) pairs every frame starts with."""

    name: str
    params: tuple[int, ...]
    num_regs: int
    code: tuple[Instr, ...]
    constants: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": list(self.params), "num_regs": self.num_regs,
                "code": [i.to_json() for i in self.code], "constants": [list(c) for c in self.constants]}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> VMFunction:
        return VMFunction(str(data["name"]), tuple(int(p) for p in data["params"]), int(data["num_regs"]),
                          tuple(Instr.from_json(i) for i in data["code"]),
                          tuple((int(r), int(c)) for r, c in data["constants"]))


@dataclass(frozen=True)
class VMProgram:
    """A whole program: its functions (`entry` is `main`), kernel call sites, inputs and tasks."""

    functions: tuple[VMFunction, ...]
    entry: int
    kernels: tuple[KernelCall, ...]
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]  # name, shape, dtype of each entry parameter
    tasks: tuple[TaskInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "functions": [f.to_json() for f in self.functions], "entry": self.entry,
            "kernels": [k.to_json() for k in self.kernels],
            "inputs": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in self.inputs],
            "tasks": [{"key": t.key, "description": t.description, "kernel": t.kernel, "tuned": t.tuned,
                       "occurrences": t.occurrences, "flops": t.flops} for t in self.tasks],
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> VMProgram:
        return VMProgram(
            tuple(VMFunction.from_json(f) for f in data["functions"]), int(data["entry"]),
            tuple(KernelCall.from_json(k) for k in data["kernels"]),
            tuple((str(i["name"]), tuple(int(d) for d in i["shape"]), str(i["dtype"])) for i in data["inputs"]),
            tuple(TaskInfo(str(t["key"]), str(t["description"]), str(t["kernel"]), bool(t["tuned"]),
                           int(t["occurrences"]), int(t["flops"])) for t in data["tasks"]),
        )


# ---------------------------------------------------------------------------------------------------------------------
# Run-time values
# ---------------------------------------------------------------------------------------------------------------------


class Tensor:
    """A tensor in a register: its array and data address (taken once: `ndarray.ctypes` costs microseconds).
    `owner` keeps the buffer a view was made of referenced, so its pool does not reuse it while the view lives."""

    __slots__ = ("addr", "array", "owner")

    def __init__(self, array: np.ndarray, addr: int, owner: Tensor | None = None) -> None:
        self.array = array
        self.addr = addr
        self.owner = owner


class VMData(tuple):
    """A value of an algebraic data type: its fields, and `tag`, the number of the constructor that made it."""

    tag: int

    def __new__(cls, tag: int, fields: list[Any]) -> VMData:
        value = super().__new__(cls, fields)
        value.tag = tag
        return value


class VMClosure:
    """A function value: function number and the values it captured."""

    __slots__ = ("captured", "func")

    def __init__(self, func: int, captured: list[Any]) -> None:
        self.func = func
        self.captured = captured


def _wrap(array: np.ndarray, align: int) -> Tensor:
    """`array` as a register value, copied to aligned contiguous memory when it is not already."""
    if not array.flags.c_contiguous or array.ctypes.data % align:
        copy = aligned_empty(array.shape, array.dtype, align)
        copy[...] = array
        array = copy
    return Tensor(array, array.ctypes.data)


def _take(spec: tuple[tuple[int, ...], np.dtype[Any], int, list[Tensor]], held: list[Tensor]) -> int:
    """A free buffer of `spec`'s pool (made when none is), appended to `held`; its address."""
    shape, dtype, align, pool = spec
    for buf in pool:
        if sys.getrefcount(buf) == _FREE:
            break
    else:
        array = aligned_empty(shape, dtype, align)
        buf = Tensor(array, array.ctypes.data)
        pool.append(buf)
    held.append(buf)
    return buf.addr


def _free_count() -> int:
    """The reference count of a pooled buffer that nothing else holds, counted exactly as the executor does."""
    pool = [Tensor(np.empty(1), 0)]
    for buf in pool:
        return sys.getrefcount(buf)
    raise AssertionError("unreachable")


_FREE = _free_count()


# ---------------------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------------------


class VMModel:
    """A compiled program with control flow: its kernels, constants and `VMProgram` (see the module docstring)."""

    def __init__(
        self,
        program: VMProgram,
        objects: Sequence[tuple[bytes, Sequence[KernelSignature]]],
        constants: Sequence[np.ndarray],
        target: Target,
        build_info: Mapping[str, Any] | None = None,
        threading_runtime: str = "auto",
        libraries: Sequence[KernelLibrary] | None = None,
        native_loops: bool = True,
    ) -> None:
        """`native_loops`: run the functions that are plain loops as generated code (`relay_tune.runtime.vm_loops`);
        False runs every function instruction by instruction (same results, for comparison)."""
        self.program = program
        self.native_loops = native_loops
        self.target = target
        self.build_info: dict[str, Any] = dict(build_info or {})
        self._objects = [(bytes(o), list(s)) for o, s in objects]
        self._constants = [np.ascontiguousarray(c) for c in constants]
        self._libraries = list(libraries) if libraries is not None else [
            load_object(obj, sigs, threading_runtime=threading_runtime) for obj, sigs in self._objects]
        self._lock = threading.Lock()
        self._decode()

    def with_native_loops(self, enabled: bool) -> VMModel:
        """The same program and kernels (shared, not reloaded), its plain loops run natively or not."""
        return VMModel(self.program, self._objects, self._constants, self.target, self.build_info,
                       libraries=self._libraries, native_loops=enabled)

    # -- decoding -------------------------------------------------------------------------------------------------
    def _decode(self) -> None:
        """Instruction tuples the executor reads without attribute lookups: (op, dst, args, index, payload)."""
        kernels: dict[str, Any] = {}
        aligns: dict[str, int] = {}
        for library in self._libraries:
            for name in library.names:
                kernel = library.get(name)
                kernels[name] = kernel
                aligns[name] = max(DEFAULT_ALIGNMENT, kernel.signature.align)
        constants = [_wrap(c, DEFAULT_ALIGNMENT) for c in self._constants]
        pools: dict[tuple[tuple[int, ...], str, int], list[Tensor]] = {}
        self._pools = pools
        decoded_calls = []
        for call in self.program.kernels:
            kernel = kernels.get(call.kernel)
            if kernel is None:
                raise VMError(f"the program calls kernel {call.kernel!r}, which no object file defines")
            align = aligns[call.kernel]
            outs = tuple((s, np.dtype(d), align, pools.setdefault((s, d, align), [])) for s, d in call.outputs)
            # kernel parameters as (register or -1 - output) in order: the executor fills one address list
            decoded_calls.append((kernel.entry, call.params, outs,
                                  call.tuple_result))
        functions = []
        for func in self.program.functions:
            template: list[Any] = [None] * func.num_regs
            for register, number in func.constants:
                template[register] = constants[number]
            code = []
            for ins in func.code:
                op = _OP.get(ins.op)
                if op is None:
                    raise VMError(f"unknown instruction {ins.op!r} in function {func.name}")
                payload: Any = None
                if op == _KERNEL:
                    payload = decoded_calls[ins.index]
                elif op == _PACK:
                    payload = (*decoded_calls[ins.index], [None, None])
                elif op == _VIEW:
                    payload = ins.shape
                elif op == _CLOSURE:
                    payload = ins.self_slot
                elif op in (_CONSTRUCT, _IF_TAG):
                    payload = ins.tag
                code.append((op, ins.dst, ins.args, ins.index, payload))
            functions.append((tuple(code), template, func.params))
        self._functions = functions
        self._loops = self._native_loops(kernels, constants, pools)

    def _native_loops(self, kernels: Mapping[str, Any], constants: Sequence[Tensor],
                      pools: dict[tuple[tuple[int, ...], str, int], list[Tensor]]) -> list[Any]:
        """Per function: how to run it as a native loop (`relay_tune.runtime.vm_loops`), or None."""
        calls = self.program.kernels
        single_output = {k: len(c.outputs) == 1 and not c.tuple_result for k, c in enumerate(calls)}
        addresses = {name: kernel.address for name, kernel in kernels.items()}
        loops: list[Any] = []
        for number, func in enumerate(self.program.functions):
            if not self.native_loops:
                loops.append(None)
                continue
            constant_regs = [r for r, _c in func.constants]
            shape = find_loop(number, func.params, func.code, constant_regs, single_output)
            if shape is None:
                loops.append(None)
                continue
            native = NativeLoop(shape, func.code, func.params, func.num_regs, calls, addresses)
            outputs: dict[int, Any] = {}
            for ins in func.code:
                if ins.op in ("kernel", "pack"):
                    out_shape, dtype = calls[ins.index].outputs[0]
                    align = max(DEFAULT_ALIGNMENT, kernels[calls[ins.index].kernel].signature.align)
                    outputs[ins.dst] = (out_shape, dtype, align, pools.setdefault((out_shape, dtype, align), []))
            fixed = [(r, constants[c]) for r, c in func.constants]
            loops.append((native, func.params, fixed, [(r, outputs[r], native.alternate[r]) for r in shape.double],
                          [(r, outputs[r]) for r in shape.single], shape.result))
        return loops

    def _run_loop(self, loop: Any, values: Sequence[Any]) -> Tensor | None:
        """Run a native loop on parameter values `values`; None when one is not a tensor (the caller then runs
        the function instruction by instruction)."""
        native, params, fixed, double, single, result = loop
        slots = native.slots
        by_address: dict[int, Tensor] = {}
        for register, value in zip(params, values):
            if not isinstance(value, Tensor):
                return None
            slots[register] = value.addr
            by_address[value.addr] = value
        for register, constant in fixed:
            slots[register] = constant.addr
        held: list[Tensor] = []  # the buffers this run uses: referenced, so no pool hands them out twice
        for register, spec, alternate in double:
            slots[register] = _take(spec, held)
            slots[alternate] = _take(spec, held)
        for register, spec in single:
            slots[register] = _take(spec, held)
        for buf in held:
            by_address[buf.addr] = buf
        native.run()
        return by_address[slots[result]]

    # -- running --------------------------------------------------------------------------------------------------
    def input_names(self) -> list[str]:
        return [name for name, _s, _d in self.program.inputs]

    def input_info(self) -> list[tuple[str, tuple[int, ...], str]]:
        return list(self.program.inputs)

    @property
    def tasks(self) -> tuple[TaskInfo, ...]:
        return self.program.tasks

    def _check_inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Tensor]:
        names = self.input_names()
        if len(args) > len(names):
            raise ModelInputError(f"the model takes {len(names)} inputs, got {len(args)} positional arguments")
        given = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise ModelInputError(f"unknown input %{name}; the model's inputs are "
                                      + (", ".join(f"%{n}" for n in names) or "none"))
            if name in given:
                raise ModelInputError(f"input %{name} given twice")
            given[name] = value
        missing = [n for n in names if n not in given]
        if missing:
            raise ModelInputError("missing input(s) " + ", ".join(f"%{n}" for n in missing))
        tensors = []
        for name, shape, dtype in self.program.inputs:
            value = given[name]
            try:
                array = np.asarray(value)
            except (TypeError, ValueError) as err:
                raise ModelInputError(f"input %{name}: not an array ({err})") from None
            if not isinstance(value, np.ndarray | np.generic):
                array = array.astype(dtype)
            if str(array.dtype) != dtype:
                raise ModelInputError(f"input %{name}: expected dtype {dtype}, got {array.dtype}")
            if array.shape != shape:
                raise ModelInputError(f"input %{name}: expected shape {shape}, got {array.shape}")
            tensors.append(_wrap(array, DEFAULT_ALIGNMENT))
        return tensors

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run the program on inputs given by position or name; a tensor, or a tuple (tree) of tensors."""
        return self._run_checked(self._check_inputs(args, kwargs))

    def _run_checked(self, inputs: list[Tensor]) -> Any:
        with self._lock:
            result = self._execute(inputs)
        return _hand_out(result)

    def _execute(self, inputs: list[Tensor]) -> Any:
        """The executor loop (see the module docstring). Hot path: keep it free of calls and attribute lookups."""
        functions = self._functions
        getrefcount = sys.getrefcount
        free = _FREE
        loops = self._loops
        run_loop = self._run_loop
        code, template, params = functions[self.program.entry]
        regs = template.copy()
        for register, value in zip(params, inputs):
            regs[register] = value
        frames: list[tuple[Any, list[Any], int, int]] = []
        pc = 0
        while True:
            op, dst, args, index, payload = code[pc]
            pc += 1
            if op == _KERNEL:
                fn, kparams, outs, tuple_result = payload
                results = []
                for shape, dtype, align, pool in outs:
                    for buf in pool:
                        if getrefcount(buf) == free:
                            break
                    else:
                        array = aligned_empty(shape, dtype, align)
                        buf = Tensor(array, array.ctypes.data)
                        pool.append(buf)
                    results.append(buf)
                fn(*[regs[p].addr if p >= 0 else results[-1 - p].addr for p in kparams])
                regs[dst] = tuple(results) if tuple_result else results[0]
                del buf, results
            elif op == _PACK:
                fn, kparams, outs, _tuple_result, cell = payload
                source = regs[kparams[0]]
                if cell[0] is not source:
                    shape, dtype, align, _pool = outs[0]
                    array = aligned_empty(shape, dtype, align)
                    cell[1] = Tensor(array, array.ctypes.data)
                    cell[0] = source
                    fn(source.addr, cell[1].addr)
                regs[dst] = cell[1]
            elif op == _IF:
                if not regs[args[0]].array:
                    pc = index
            elif op == _JUMP:
                pc = index
            elif op == _MOVE:
                regs[dst] = regs[args[0]]
            elif op == _TAIL or op == _TAILC:
                if op == _TAIL and loops[index] is not None:
                    value = run_loop(loops[index], [regs[a] for a in args])
                    if value is not None:
                        if not frames:
                            return value
                        code, regs, pc, dst = frames.pop()
                        regs[dst] = value
                        continue
                if op == _TAILC:
                    closure = regs[args[0]]
                    code, template, params = functions[closure.func]
                    values = [*closure.captured, *[regs[a] for a in args[1:]]]
                else:
                    code, template, params = functions[index]
                    values = [regs[a] for a in args]
                regs = template.copy()
                for register, value in zip(params, values):
                    regs[register] = value
                pc = 0
            elif op == _RET:
                value = regs[args[0]]
                if not frames:
                    return value
                code, regs, pc, dst = frames.pop()
                regs[dst] = value
            elif op == _INVOKE or op == _CALLC:
                if op == _INVOKE and loops[index] is not None:
                    value = run_loop(loops[index], [regs[a] for a in args])
                    if value is not None:
                        regs[dst] = value
                        continue
                frames.append((code, regs, pc, dst))
                if op == _CALLC:
                    closure = regs[args[0]]
                    code, template, params = functions[closure.func]
                    values = [*closure.captured, *[regs[a] for a in args[1:]]]
                else:
                    code, template, params = functions[index]
                    values = [regs[a] for a in args]
                regs = template.copy()
                for register, value in zip(params, values):
                    regs[register] = value
                pc = 0
            elif op == _TUPLE:
                regs[dst] = tuple([regs[a] for a in args])
            elif op == _FIELD:
                regs[dst] = regs[args[0]][index]
            elif op == _VIEW:
                source = regs[args[0]]
                regs[dst] = Tensor(source.array.reshape(payload), source.addr, source)
            elif op == _CONSTRUCT:
                regs[dst] = VMData(payload, [regs[a] for a in args])
            elif op == _IF_TAG:
                if regs[args[0]].tag != payload:
                    pc = index
            elif op == _FAIL:
                raise VMError("no clause of a match applies to the value")
            elif op == _CLOSURE:
                closure = VMClosure(index, [regs[a] for a in args])
                if payload >= 0:
                    closure.captured[payload] = closure
                regs[dst] = closure
            else:
                raise VMError(f"unknown instruction {op}")

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded random inputs: normal floats, small non-negative integers (safe as indices), coin-flip bools."""
        rng = np.random.default_rng(seed)
        inputs: dict[str, np.ndarray] = {}
        for name, shape, dtype_name in self.program.inputs:
            dtype = np.dtype(dtype_name)
            if dtype.kind == "f":
                inputs[name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind in "iu":
                inputs[name] = rng.integers(0, 4, shape).astype(dtype)
            else:
                inputs[name] = rng.random(shape) < 0.5
        return inputs

    def benchmark(
        self, repeat: int = 10, number: int = 1, inputs: Mapping[str, Any] | None = None, warmup: int = 1
    ) -> LatencyStats:
        """Whole-program latency: `repeat` timings, each the mean of `number` back-to-back runs (as `run`)."""
        if repeat < 1 or number < 1 or warmup < 0:
            raise RelayTuneError("benchmark needs repeat >= 1, number >= 1 and warmup >= 0")
        tensors = self._check_inputs((), inputs if inputs is not None else self.random_inputs())
        once = self._run_checked
        for _ in range(warmup):
            once(tensors)
        costs: list[float] = []
        clock = time.perf_counter
        for _ in range(repeat):
            start = clock()
            for _ in range(number):
                once(tensors)
            costs.append((clock() - start) / number)
        return LatencyStats(tuple(costs), number)

    def profile(self, repeat: int = 5, inputs: Mapping[str, Any] | None = None) -> list[Any]:
        """Per-kernel profiles come from the static graph executor; a program with control flow has none."""
        raise VMError("per-kernel profiles are available for static graphs only, not for programs with control "
                      "flow (time the whole program with benchmark)")

    def memory_report(self) -> str:
        """The kernel output buffers pooled so far (they grow to the most values alive at once)."""
        buffers = sum(len(p) for p in self._pools.values())
        nbytes = sum(b.array.nbytes for p in self._pools.values() for b in p)
        return f"{buffers} pooled buffers, {nbytes / 2**20:.2f} MiB (virtual machine: buffers reused once dead)"

    def __repr__(self) -> str:
        return (f"VMModel({len(self.program.functions)} functions, {len(self.program.kernels)} kernel call sites, "
                f"{len(self.program.tasks)} tasks)")

    # -- saving ---------------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model to one zip file: manifest (program, kernel signatures), object code, constants."""
        path = Path(path)
        manifest = {
            "format": VM_FORMAT_NAME,
            "format_version": VM_FORMAT_VERSION,
            "relay_tune_version": __version__,
            "target": str(self.target),
            "triple": self.build_info.get("triple", ""),
            "objects": [{"file": f"kernels/{i}.o", "kernels": [signature_to_json(s) for s in sigs]}
                        for i, (_, sigs) in enumerate(self._objects)],
            "constants": [f"constants/{i}.npy" for i in range(len(self._constants))],
            "program": self.program.to_json(),
            "build_info": self.build_info,
        }
        return write_archive(path, manifest, [obj for obj, _ in self._objects], self._constants)


def _hand_out(value: Any) -> Any:
    """A result for the caller: tensors copied out of the pools (and constants), tuples as tuples."""
    if isinstance(value, Tensor):
        return value.array.copy()
    if isinstance(value, VMData):
        raise VMError("the program returned a value of an algebraic data type; compiled programs return tensors "
                      "or tuples")
    if isinstance(value, tuple):
        return tuple(_hand_out(v) for v in value)
    raise VMError(f"the program returned a {type(value).__name__}; compiled programs return tensors or tuples")


# ---------------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------------


def load_vm(path: str | os.PathLike[str], threading_runtime: str = "auto", check_target: bool = True,
            native_loops: bool = True) -> VMModel:
    """Load a model written by `VMModel.save` (JIT-links its object code, no recompilation)."""
    path = Path(path)
    start = time.perf_counter()
    manifest = _manifest(path)
    if manifest.get("format") != VM_FORMAT_NAME:
        raise ModelFormatError(f"{path}: not a relay-tune virtual-machine model file")
    if manifest.get("format_version") != VM_FORMAT_VERSION:
        raise ModelFormatError(f"{path}: model format version {manifest.get('format_version')} is not supported "
                               f"(this relay-tune reads version {VM_FORMAT_VERSION}); rebuild the model")
    try:
        with zipfile.ZipFile(path) as archive:
            target = Target.parse(manifest["target"])
            if check_target:
                check_target_compatible(target, manifest.get("triple", ""))
            program = VMProgram.from_json(manifest["program"])
            objects = [(archive.read(entry["file"]), [signature_from_json(s) for s in entry["kernels"]])
                       for entry in manifest["objects"]]
            constants = []
            for name in manifest["constants"]:
                with archive.open(name) as stream:
                    constants.append(_read_npy(stream))
    except (KeyError, TypeError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ModelFormatError(f"{path}: damaged model file ({type(err).__name__}: {err})") from None
    model = VMModel(program, objects, constants, target, manifest.get("build_info"), threading_runtime,
                    native_loops=native_loops)
    model.build_info["load_seconds"] = time.perf_counter() - start
    return model


def _manifest(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelFormatError(f"{path}: no such file")
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read("manifest.json"))
    except zipfile.BadZipFile:
        raise ModelFormatError(f"{path}: not a relay-tune model file (not a zip archive)") from None
    except KeyError:
        raise ModelFormatError(f"{path}: not a relay-tune model file (no manifest.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFormatError(f"{path}: damaged manifest: {err}") from None
    if not isinstance(manifest, dict):
        raise ModelFormatError(f"{path}: not a relay-tune model file")
    return manifest


def load_model(
    path: str | os.PathLike[str], threading_runtime: str = "auto", check_target: bool = True
) -> CompiledModel | VMModel:
    """Load either kind of saved CPU model: a static graph (`CompiledModel`) or a program with control flow."""
    if _manifest(Path(path)).get("format") == VM_FORMAT_NAME:
        return load_vm(path, threading_runtime, check_target)
    return load(path, threading_runtime, check_target)

