"""`GPUModel`: a whole compiled model on a GPU, from the graph plan `relay_tune.build` makes."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import PTXModule
from relay_tune.errors import RelayTuneError
from relay_tune.kernel import tir
from relay_tune.runtime.cuda import driver
from relay_tune.runtime.cuda.device import DEVICE_ALIGNMENT, DeviceBuffer, FunctionRunner, GPUDevice
from relay_tune.runtime.cuda.emulator import EmulatedDevice


class GPUModel:
    """A compiled model on a GPU: the graph plan of `relay_tune.build` with every tensor in device memory.

    Inputs are copied to the device, the kernels of every call launched in order on one stream, outputs
    copied back. Constants are uploaded once; intermediates live in one device arena laid out by the same
    memory plan as on the CPU (offsets are multiples of 64 bytes, so vector accesses stay aligned); one
    workspace arena serves every function's root-stage scratch (calls run one after another).
    """

    def __init__(self, plan: Any, module: PTXModule, constants: Sequence[np.ndarray], target: Any,
                 build_info: Mapping[str, Any] | None = None, device: GPUDevice | None = None) -> None:
        self.plan = plan
        self.module = module
        self.target = target
        self.build_info = dict(build_info or {})
        self.device = device or driver.cuda_device()
        self.loaded = self.device.load(module)
        self._constants = [self._to_device(np.ascontiguousarray(c)) for c in constants]
        self._arena = self.device.alloc(max(plan.memory.arena_bytes, 1))
        workspace_bytes = 0
        for f in module.functions:
            offset = 0
            for w in f.workspaces:
                offset += -(-w.nbytes // DEVICE_ALIGNMENT) * DEVICE_ALIGNMENT
            workspace_bytes = max(workspace_bytes, offset)
        self._workspace = self.device.alloc(max(workspace_bytes, 1))
        self._inputs = [self.device.alloc(plan.values[i.value].nbytes) for i in plan.inputs]
        self._outputs = {s: self.device.alloc(plan.storages[s].nbytes) for s in plan.storages_of_kind("output")}
        self._runners = [self._runner(call) for call in plan.calls]

    def _to_device(self, array: np.ndarray) -> DeviceBuffer:
        buf = self.device.alloc(array.nbytes)
        self.device.upload(buf, array)
        return buf

    def _address(self, storage_index: int) -> int:
        storage = self.plan.storages[storage_index]
        if storage.kind == "constant":
            return self._constants[storage.index].ptr
        if storage.kind == "arena":
            return self._arena.ptr + self.plan.memory.offsets[storage.index]
        if storage.kind == "input":
            return self._inputs[storage.index].ptr
        return self._outputs[storage_index].ptr

    def _runner(self, call: Any) -> FunctionRunner:
        function = self.loaded.function(call.kernel)
        spaces: list[DeviceBuffer] = []
        offset = 0
        for w in function.workspaces:
            spaces.append(DeviceBuffer(self._workspace.ptr + offset, w.nbytes))
            offset += -(-w.nbytes // DEVICE_ALIGNMENT) * DEVICE_ALIGNMENT
        params = [self._address(self.plan.values[v].storage) for v in call.args]
        return FunctionRunner.bind(self.device, self.loaded, call.kernel, params, spaces)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.plan.inputs]

    def _launch_all(self) -> None:
        for runner in self._runners:
            runner.launch_all()

    def _set_inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        names = self.input_names
        given = dict(zip(names, args))
        given.update(kwargs)
        missing = [n for n in names if n not in given]
        unknown = [n for n in given if n not in names]
        if missing or unknown or len(args) > len(names):
            raise RelayTuneError(f"the model takes inputs {', '.join(names)}; missing {missing}, unknown {unknown}")
        for info, buf in zip(self.plan.inputs, self._inputs):
            value = self.plan.values[info.value]
            array = np.ascontiguousarray(given[info.name])
            if tuple(array.shape) != tuple(value.shape) or str(array.dtype) != value.dtype:
                raise RelayTuneError(f"input {info.name}: expected {value.dtype}{list(value.shape)}, got "
                                     f"{array.dtype}{list(array.shape)}")
            self.device.upload(buf, array)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run on host inputs (positionally and/or by name); returns host arrays (a tuple for tuple outputs)."""
        self._set_inputs(args, kwargs)
        self._launch_all()
        self.device.synchronize()
        return self._collect()

    __call__ = run

    def _collect(self) -> Any:
        plan = self.plan

        def leaf(value_id: int) -> np.ndarray:
            value = plan.values[value_id]
            storage = plan.storages[value.storage]
            out = np.empty(value.shape, value.dtype)
            if storage.kind == "output":
                self.device.download(out, self._outputs[value.storage])
            elif storage.kind == "constant":
                self.device.download(out, self._constants[storage.index])
            elif storage.kind == "input":
                self.device.download(out, self._inputs[storage.index])
            else:
                self.device.download(out, self._arena, plan.memory.offsets[storage.index])
            return out

        def build(tree: Any) -> Any:
            return tuple(build(t) for t in tree) if isinstance(tree, tuple) else leaf(tree)

        return build(plan.outputs)

    def benchmark(self, repeat: int = 10, number: int = 10, inputs: Mapping[str, Any] | None = None) -> list[float]:
        """Seconds per whole-model run on the device (inputs uploaded once, not timed)."""
        if inputs is None:
            rng = np.random.default_rng(0)
            inputs = {i.name: rng.standard_normal(self.plan.values[i.value].shape).astype(
                self.plan.values[i.value].dtype) for i in self.plan.inputs}
        self._set_inputs((), inputs)
        self._launch_all()
        return [self.device.time_launches(self._launch_all, number) for _ in range(repeat)]

    def __repr__(self) -> str:
        return f"GPUModel({len(self.plan.calls)} calls on {self.device.name}, {self.target})"


def gpu_model_from_plan(plan: Any, funcs: Sequence[tir.PrimFunc], constants: Sequence[np.ndarray], target: Any,
                        timings: dict[str, float] | None = None, start: float | None = None) -> GPUModel:
    """The last step of `relay_tune.build` for a cuda target: PTX for every kernel of the plan, then a model on
    the first GPU (`CudaUnavailableError` without one, after compiling, so compile errors come first)."""
    from relay_tune.codegen.nvptx import build_ptx

    timings = dict(timings or {})
    begin = time.perf_counter()
    stages: dict[str, float] = {}
    module = build_ptx(list(funcs), target, timings=stages)
    timings["nvptx_s"] = time.perf_counter() - begin
    info = {"timings": timings, "kernels": len(module.kernel_names), "functions": len(funcs), "arch": module.arch,
            "codegen": stages}
    device = driver.cuda_device()
    if device.arch != module.arch and not isinstance(device, EmulatedDevice):
        info["device_arch"] = device.arch  # the driver JIT-compiles the PTX for the device's own architecture
    model = GPUModel(plan, module, constants, target, info, device)
    if start is not None:
        model.build_info["timings"]["total_s"] = time.perf_counter() - start
    return model

