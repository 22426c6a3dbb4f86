"""Tuning tasks of Relay models: one `RelayTuneTask` per distinct fused primitive function, on one CPU target.

    tasks = tasks_from_module(mod, target)        # the fused workloads the build compiles, as tuning tasks
    task = RelayTuneTask(spec, target)            # spec: relay_tune.passes.extract_tasks.TaskSpec
    artifact = task.build(task.default_config())  # lowered with the config's schedule, compiled to object code

A task is the `TuneTask` of its workload: `key` is the workload key the build looks records up by, `weight` how
often the model runs it, `space` the schedule space of its family (`search_space.cpu`), `reference` the numpy
interpreter run on the primitive function itself. Weights that are model constants (the same at every call site)
may be packed by a schedule: the build packs them once, and the runner packs them ahead of timing, like the model.

`search_space.decode.config_to_steps(func, config, target)` is how the build turns a logged config back into schedule
steps. Every config, the default one included, goes through its family's template (`search_space.families`); an
untuned build runs the template at the same default config (`search_space.defaults`), so the tuner's "default"
baseline, the log's record of it and what an untuned build runs are one kernel.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from cost_model.transfer import register_workload_kind
from relay_tune.codegen.jit import REPEAT_SUFFIX
from relay_tune.codegen.llvm import compile_object, required_libraries
from relay_tune.compile import model_tasks, resolve_target
from relay_tune.compile.primitive import OUTPUT, lower_primitive
from relay_tune.compile.tasks import packing_kernel
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Function, IRModule
from relay_tune.ir.types import TupleType
from relay_tune.kernel.compute import primitive_compute
from relay_tune.kernel.recurrent import fixed_kernel, fixed_kernel_inputs
from relay_tune.passes import full_range_int8_mode, layout_block, optimize, precision_mode
from relay_tune.passes.extract_tasks import constant_inputs
from relay_tune.text import parse_module, print_module
from relay_tune.tuning.task import BuildArtifact, KernelArg, LayoutStep, TensorSpec
from relay_tune.type_infer import infer_types
from search_space import Config, InvalidConfigError, Space
from search_space.cpu import cpu_space, task_workload, with_later_knobs
from search_space.families import family_named
from search_space.families.lstm import (
    LSTM_FAMILY,
    lstm_default,
    lstm_flops,
    lstm_schedule,
    lstm_space,
    lstm_steps,
    lstm_test_scales,
    lstm_workload,
)

__all__ = [
    "RelayTuneTask", "ReferenceWarning", "constant_inputs", "layout_steps", "tasks_from_module",
]

KERNEL_PREFIX = "tuned_"
WORKLOAD_KIND = "relay_function"


class ReferenceWarning(UserWarning):
    """A task's outputs cannot be checked: its reference failed or is not finite on the random test inputs."""


def _target(target: Any) -> Any:
    return resolve_target(target)


def _retyped(func: Any) -> Any:
    """`func` with its types inferred again (types are a cache that pickling drops)."""
    if func.body.has_type():
        return func

    mod = infer_types(IRModule({"main": Function(tuple(func.params), func.body, func.ret_type)}))
    return mod["main"].with_attrs(Primitive=1)


def layout_steps(layout: Any) -> tuple[LayoutStep, ...]:
    """The numpy steps that pack an array like `layout.pack` (a `relay_tune.kernel.schedule.LayoutTransform`):
    pad split axes to a multiple of their factor, split them, transpose into the packed order."""
    pads: list[tuple[int, int]] = []
    split_shape: list[int] = []
    names: list[str] = []
    factors = {letter: f for letter, f in layout.tokens if f is not None}
    for letter, dim in zip(layout.src_layout, layout.src_shape):
        sub = factors.get(letter.lower())
        if sub is None:
            pads.append((0, 0))
            split_shape.append(dim)
            names.append(letter)
        else:
            outer = -(-dim // sub)
            pads.append((0, outer * sub - dim))
            split_shape += [outer, sub]
            names += [letter, letter.lower()]
    steps: list[LayoutStep] = []
    if any(after for _, after in pads):
        steps.append(LayoutStep("pad", tuple(pads)))
    steps.append(LayoutStep("reshape", tuple(split_shape)))
    order = tuple(names.index(t) for t, _ in layout.tokens)
    if order != tuple(range(len(order))):
        steps.append(LayoutStep("transpose", order))
    return tuple(steps)


class RelayTuneTask:
    """The tuning task of one fused primitive function on one CPU target (the `TuneTask` protocol).

    `target` is the target's log name (`Target.log_name`); `target_info` the full `Target` kernels compile for.
    Picklable: the tensor expressions are rebuilt in worker processes (cheap, deterministic).
    """

    def __init__(self, spec: Any, target: Any, *, constants: Sequence[int] | None = None) -> None:
        self.target_info = _target(target)
        if self.target_info.kind != "llvm":
            raise RelayTuneError(f"RelayTuneTask tunes CPU (llvm) targets; for {self.target_info} use "
                                 "relay_tune.tuning.gpu_task.gpu_tasks")
        self.key: str = spec.key
        self.description: str = spec.description
        self.flops: float = float(spec.flops)
        self.weight: int = int(spec.occurrences)
        self.target: str = self.target_info.log_name
        self.func = spec.func
        self.constants: tuple[int, ...] = tuple(constants) if constants is not None else constant_inputs(spec)
        self._setup()

    def _setup(self) -> None:
        lstm = lstm_workload(self.func, self.target_info)
        if lstm is not None:  # a fixed LSTM kernel: its loop nest is written by hand, its space is the lstm family's
            self._prim = None
            self.workload, self._default = lstm, lstm_default(lstm)
            self.space = lstm_space(lstm)
            self.flops = lstm_flops(lstm)  # the operator's own count is its output's size
            return
        self._prim = primitive_compute(self.func)
        # A dense weight received at run time may be packed on every run (`task_workload`): the artifact then
        # carries the packing kernel in its prologue, so the runner times packing and kernel together.
        self.workload, self._default = task_workload(self._prim, self.target_info, self.constants)
        self.space: Space = cpu_space(self.workload)

    @property
    def family(self) -> str:
        return str(self.workload.family)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_prim", "space", "_default", "workload"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.func = _retyped(self.func)
        self._setup()

    def __repr__(self) -> str:
        return f"RelayTuneTask({self.description!r}, {self.family}, key={self.key[:12]}, target={self.target!r})"

    # -- the TuneTask protocol ---------------------------------------------------------------------------------

    @property
    def weight_inputs(self) -> tuple[int, ...]:
        """The logical inputs that are model constants: weights that a model reads from memory at every call."""
        return self.constants

    def default_config(self) -> Config:
        return self._default

    # The inputs (by position) whose test values are non-negative: set by `check_references` for a function whose
    # reference is not finite on signed inputs (a normalisation whose input is a variance): their domain.
    nonnegative_inputs: frozenset[int] = frozenset()

    def input_specs(self) -> list[TensorSpec]:
        if self._prim is None:
            types = [p.checked_type for p in self.func.params]
            scales = lstm_test_scales(self.func)
            return [TensorSpec(tuple(t.shape), str(t.dtype), i in self.nonnegative_inputs, scales.get(i, 1.0))
                    for i, t in enumerate(types)]
        return [TensorSpec(tuple(t.shape), str(t.dtype), i in self.nonnegative_inputs)
                for i, t in enumerate(self._prim.inputs)]

    def reference(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        """The interpreter's outputs of the primitive function (flattened), or None when they cannot serve as a
        reference on these inputs (the check is skipped, with a `ReferenceWarning`)."""
        try:
            args = _structured_inputs(self.func, list(inputs))
            plain = Function(tuple(self.func.params), self.func.body, self.func.ret_type)
            result = evaluate(IRModule({"main": plain}), args)
        except Exception as err:  # the interpreter rejects these inputs (e.g. indices out of range)
            warnings.warn(f"task {self.description}: the reference interpreter fails on random inputs ({err}); "
                          "outputs are not checked", ReferenceWarning, stacklevel=2)
            return None
        outputs = [np.asarray(r) for r in _flatten(result)]
        if any(o.dtype.kind == "f" and not np.all(np.isfinite(o)) for o in outputs):
            warnings.warn(f"task {self.description}: the reference is not finite on random inputs; outputs are not "
                          "checked", ReferenceWarning, stacklevel=2)
            return None
        return outputs

    def logged_config(self, config: Config) -> Config | None:
        """A logged config as a point of this task's current space (knobs added since filled with the value that
        reproduces the logged schedule), or None when it belongs to another space (`CurrentSpaces`)."""
        if config.get("family") != self.family:
            return None
        if self.family == LSTM_FAMILY:
            return config if self.space.is_valid(config) else None
        current = with_later_knobs(self.workload, config)
        return current if self.space.is_valid(current) else None

    def steps(self, config: Config) -> list[Any]:
        """The schedule steps of a config: its family's template applied to it (an LSTM config's one step)."""
        if self._prim is None:
            self.space.validate(config)
            return lstm_steps(config)
        return family_named(self.family).steps(self._prim, config, self.target_info)

    def lower(self, config: Config) -> Any:
        """The loop nest (`tir.PrimFunc`) of a config, without compiling (what a cost model featurizes)."""
        return self._lower(config)[0]

    def _lower(self, config: Config) -> tuple[Any, Any]:
        if self._prim is None:  # `lstm_schedule` checks the config is a point of the space
            schedule = lstm_schedule(self.workload, config)
            return fixed_kernel(self.func, self.target_info, self.kernel_name, schedule), None
        self.space.validate(config)
        steps = self.steps(config)
        try:
            return lower_primitive(self.func, self.target_info, steps, name=self.kernel_name, prim=self._prim)
        except InvalidConfigError:
            raise
        except RelayTuneError as err:
            raise InvalidConfigError(f"the schedule of {config!r} does not apply: {err}") from err

    @property
    def kernel_name(self) -> str:
        return KERNEL_PREFIX + self.key[:16]

    def build(self, config: Config) -> BuildArtifact:
        if self._prim is None:
            return self._build_fixed(config)
        primfunc, packing = self._lower(config)
        funcs = [primfunc]
        args: list[KernelArg] = []
        prologue: list[tuple[str, int, int]] = []
        for position, param in enumerate(packing.params):
            spec = TensorSpec(tuple(param.shape), str(param.dtype))
            if param.role == OUTPUT:
                args.append(KernelArg(spec, "output", param.index))
                continue
            layout = layout_steps(param.layout) if param.layout is not None else ()
            args.append(KernelArg(spec, "input", param.index, layout))
            if param.layout is not None and param.index not in self.constants:
                # A run-time input packed by the model on every run: the same packing kernel the build makes.
                packer = packing_kernel(param.layout, f"{primfunc.name}_pack{position}")
                funcs.append(packer)
                prologue.append((packer.name, param.index, position))
        code = compile_object(funcs, self.target_info)
        return BuildArtifact(code, "elf-object", primfunc.name, tuple(args),
                             requires_libraries=required_libraries(funcs, self.target_info),
                             repeat_symbol=primfunc.name + REPEAT_SUFFIX, prologue=tuple(prologue))

    def _build_fixed(self, config: Config) -> BuildArtifact:
        """The artifact of a fixed LSTM kernel: its parameters are the call's arguments (each a function
        parameter, none packed), then the output."""
        primfunc = self.lower(config)
        args = [KernelArg(TensorSpec(tuple(b.shape), str(b.dtype)), "input", i)
                for i, b in zip(fixed_kernel_inputs(self.func), primfunc.params)]
        out = primfunc.params[-1]
        args.append(KernelArg(TensorSpec(tuple(out.shape), str(out.dtype)), "output", 0))
        code = compile_object([primfunc], self.target_info)
        return BuildArtifact(code, "elf-object", primfunc.name, tuple(args),
                             requires_libraries=required_libraries([primfunc], self.target_info),
                             repeat_symbol=primfunc.name + REPEAT_SUFFIX)

    def workload_spec(self) -> dict[str, Any]:
        """A JSON description to rebuild this task from (the function's Relay text, the target, constants)."""
        plain = Function(tuple(self.func.params), self.func.body, self.func.ret_type)
        return {"kind": WORKLOAD_KIND, "text": print_module(IRModule({"main": plain})),
                "target": str(self.target_info), "description": self.description, "flops": self.flops,
                "weight": self.weight, "constants": list(self.constants), "key": self.key}

    @staticmethod
    def from_workload_spec(data: Mapping[str, Any]) -> RelayTuneTask:
        """The task a `workload_spec()` describes (e.g. to re-lower configs of an old log)."""
        func = infer_types(parse_module(str(data["text"])))["main"].with_attrs(Primitive=1)
        spec = SimpleNamespace(key=str(data["key"]), description=str(data.get("description", "")), func=func,
                               flops=float(data.get("flops", 0.0)), occurrences=int(data.get("weight", 1)),
                               call_sites=())
        return RelayTuneTask(spec, str(data["target"]), constants=[int(c) for c in data.get("constants", ())])


def _structured_inputs(func: Any, flat: list[np.ndarray]) -> list[Any]:
    """Flattened kernel inputs regrouped by parameter (tuple-typed parameters take a tuple)."""
    def take(ty: Any) -> Any:
        if isinstance(ty, TupleType):
            return tuple(take(f) for f in ty.fields)
        return flat.pop(0)

    return [take(p.checked_type if p.has_type() else p.type_annotation) for p in func.params]


def _flatten(value: Any) -> list[Any]:
    out: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple | list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


# Logs of relay_function tasks can warm the cost model of other workloads (cost_model.transfer rebuilds them).
register_workload_kind(WORKLOAD_KIND, RelayTuneTask.from_workload_spec)


def tasks_from_module(mod: Any, target: Any, opt_level: int = 3,
                      layout_planning: bool | None = None, winograd: str | None = None,
                      precision: str | None = None) -> list[RelayTuneTask]:
    """One task per distinct fused function that `relay_tune.build(mod, target, layout_planning=...)` compiles into
    a kernel, in order of first use, weighted by the calls that run it (`relay_tune.compile.model_tasks`, the
    build's own rule: memory views, which become aliases, and concatenations written in place by their producers
    are left out). Tasks are extracted after layout planning, the same pipeline as the build's, so a kernel is
    tuned in the layout it runs in, and at the build's `precision` (bf16 products are other workloads, so their
    records never mix with fp32 ones)."""
    resolved = _target(target)
    fused = optimize(infer_types(mod), opt_level=opt_level, layout_block=layout_block(resolved, layout_planning),
                     winograd=winograd, full_range_int8=full_range_int8_mode(resolved),
                     precision=precision_mode(precision, resolved))
    return [RelayTuneTask(spec, resolved) for spec in model_tasks(fused, resolved).kernels]

