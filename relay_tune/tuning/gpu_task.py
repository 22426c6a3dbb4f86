"""GPU tuning tasks: one `GPUTask` per fused function, building PTX for a config of `search_space.gpu`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import arch_of, assemble_ptx, build_ptx, check_launch_resources, find_ptxas
from relay_tune.compile.primitive import lower_primitive
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.ir import Function, IRModule
from relay_tune.kernel.compute import primitive_compute
from relay_tune.passes import optimize
from relay_tune.passes.extract_tasks import extract_tasks
from relay_tune.target import Target
from relay_tune.tuning.task import BuildArtifact, KernelArg, LayoutStep, TensorSpec
from relay_tune.type_infer import infer_types
from search_space import InvalidConfigError
from search_space.gpu import default_config, gpu_space, steps_of_prim


def gpu_tasks(mod: Any, target: str = "cuda -arch=sm_90", check_ptxas: bool = True) -> list[GPUTask]:
    """One GPU tuning task per distinct fused function of a type-checked module (after the graph passes)."""
    fused = optimize(mod)
    return [GPUTask.from_spec(spec, target, check_ptxas) for spec in extract_tasks(fused)]



@dataclass
class GPUTask:
    """A tuning task for one fused primitive function on a CUDA target (the `TuneTask` protocol).

    Configs come from `search_space.gpu.gpu_space`; `build` turns one into PTX (checked by ptxas when it is
    installed: launches that need too many registers, or that spill, are rejected before measurement).
    """

    key: str
    description: str
    flops: float
    weight: int
    target: str
    func: Any  # the type-checked Primitive=1 Function
    check_ptxas: bool = True

    def __post_init__(self) -> None:
        self._prim = primitive_compute(self.func)
        self.space = gpu_space(self._prim, self.arch)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_prim", None)  # tensor expressions are rebuilt on the other side (cheap, deterministic)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.func = _retyped(self.func)
        self._prim = primitive_compute(self.func)

    @property
    def arch(self) -> str:
        return arch_of(Target.parse(self.target))

    @staticmethod
    def from_spec(spec: Any, target: str = "cuda -arch=sm_90", check_ptxas: bool = True) -> GPUTask:
        """The task of a `relay_tune.passes.extract_tasks.TaskSpec`."""
        return GPUTask(spec.key, spec.description, float(spec.flops), int(spec.occurrences), target, spec.func,
                       check_ptxas)

    def default_config(self) -> Any:
        return default_config(self._prim, self.arch)

    def input_specs(self) -> list[Any]:
        return [TensorSpec(t.shape, t.dtype) for t in self._prim.inputs]

    def reference(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        params = self.func.params
        plain = Function(params, self.func.body, self.func.ret_type)
        result = evaluate(IRModule({"main": plain}), list(inputs))
        return [np.asarray(r) for r in (result if isinstance(result, tuple) else (result,))]

    def steps(self, config: Any) -> list[Any]:
        # the GPU family template at the config: the same function untuned builds and logged configs go through
        return steps_of_prim(self._prim, config)

    def build(self, config: Any) -> Any:
        target = Target.parse(self.target)
        try:
            primfunc, packing = lower_primitive(self.func, target, self.steps(config), name="kernel", prim=self._prim)
        except RelayTuneError as err:
            raise InvalidConfigError(f"schedule does not apply: {err}") from err
        module = build_ptx([primfunc], target)
        function = module.functions[0]
        resources: dict[str, Any] = {}
        if self.check_ptxas and find_ptxas() is not None:
            report = assemble_ptx(module.ptx, module.arch)
            for kernel in function.kernels:
                res = report.kernels.get(kernel.name)
                if res is not None:
                    check_launch_resources(kernel, res, module.arch)
                    resources[kernel.name] = {"registers": res.registers, "spill_bytes": res.spill_bytes}
        args: list[Any] = []
        for p in packing.params:
            spec = TensorSpec(p.shape, p.dtype)
            if p.role == "output":
                args.append(KernelArg(spec, "output", p.index))
            else:
                layout: tuple[Any, ...] = ()
                if p.layout is not None:
                    layout = (LayoutStep("transpose", _transpose_axes(p.layout)),)
                args.append(KernelArg(spec, "input", p.index, layout))
        return BuildArtifact(module.ptx.encode(), "ptx", "kernel", tuple(args),  # type: ignore[arg-type]
                             info={"gpu_function": function, "arch": module.arch, "resources": resources})


def _retyped(func: Any) -> Any:
    """`func` with its types inferred again (types are a cache that pickling drops)."""
    if func.body.has_type():
        return func

    params = tuple(func.params)
    for p in params:
        if p.type_annotation is None:
            raise RelayTuneError(f"parameter %{p.name_hint} of a tuning task's function has no type annotation")
    mod = infer_types(IRModule({"main": Function(params, func.body, func.ret_type)}))
    return mod["main"].with_attrs(Primitive=1)


def _transpose_axes(layout: Any) -> tuple[int, ...]:
    """The transpose that packs a source tensor into `layout` (only pure permutations are tuned on GPUs)."""
    tokens = layout.tokens
    if any(f is not None for _, f in tokens):
        raise RelayTuneError(f"GPU tasks only pack weights by permutation, not {layout.dst_layout}")
    return tuple(layout.src_layout.index(t) for t, _ in tokens)
