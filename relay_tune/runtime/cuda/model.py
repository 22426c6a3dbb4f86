"""`GPUModel`: a whole compiled model on a GPU, from the graph plan `relay_tune.build` makes."""

from __future__ import annotations

import json
import os
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import (
    GPUFunction,
    GPUKernel,
    LaunchConfig,
    PtxasError,
    PTXModule,
    WorkspaceSpec,
    assemble_ptx,
    build_ptx,
    find_ptxas,
)
from relay_tune.errors import CompileError, RelayTuneError
from relay_tune.kernel import tir
from relay_tune.runtime.cuda import driver
from relay_tune.runtime.cuda.device import DEVICE_ALIGNMENT, DeviceBuffer, FunctionRunner, GPUDevice
from relay_tune.runtime.cuda.emulator import EmulatedDevice
from relay_tune.runtime.model import GraphPlan
from relay_tune.target import Target
from relay_tune.version import __version__


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
        self._host_constants = [np.ascontiguousarray(c) for c in constants]  # kept for `save`
        self._constants = [self._to_device(c) for c in self._host_constants]
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

    def save(self, path: str | os.PathLike[str]) -> Path:
        """The model file (`load_gpu_model` reads it back, on this or another machine with a GPU)."""
        return save_gpu_model(path, self.plan, self.module, self._host_constants, self.target, self.build_info)

    def __repr__(self) -> str:
        return f"GPUModel({len(self.plan.calls)} calls on {self.device.name}, {self.target})"


def gpu_model_from_plan(plan: Any, funcs: Sequence[tir.PrimFunc], constants: Sequence[np.ndarray], target: Any,
                        timings: dict[str, float] | None = None, start: float | None = None) -> GPUModel | PTXModel:
    """The last step of `relay_tune.build` for a cuda target: PTX for every kernel of the plan, then a model on
    the first GPU, or, on a machine without a usable GPU, a `PTXModel` to save and run elsewhere."""
    timings = dict(timings or {})
    begin = time.perf_counter()
    stages: dict[str, float] = {}
    module = build_ptx(list(funcs), target, timings=stages)
    timings["nvptx_s"] = time.perf_counter() - begin
    info = {"timings": timings, "kernels": len(module.kernel_names), "functions": len(funcs), "arch": module.arch,
            "codegen": stages}
    if driver.cuda_available() is not None:
        # Cross-compiling (no GPU or no cuda-python here): the PTX is the product, checked by ptxas when it is
        # installed, and saved for a machine with a GPU.
        info["ptxas"] = _check_with_ptxas(module)
        ptx_model = PTXModel(plan, module, list(constants), target, info)
        if start is not None:
            ptx_model.build_info["timings"]["total_s"] = time.perf_counter() - start
        return ptx_model  # type: ignore[return-value]
    device = driver.cuda_device()
    if device.arch != module.arch and not isinstance(device, EmulatedDevice):
        info["device_arch"] = device.arch  # the driver JIT-compiles the PTX for the device's own architecture
    model = GPUModel(plan, module, constants, target, info, device)
    if start is not None:
        model.build_info["timings"]["total_s"] = time.perf_counter() - start
    return model


# ---------------------------------------------------------------------------------------------------
# model files: PTX, launch plans, the graph plan and the constants, for a machine with a GPU
# ---------------------------------------------------------------------------------------------------

GPU_FORMAT_NAME = "relay-tune-gpu-model"
GPU_FORMAT_VERSION = 1


def _check_with_ptxas(module: PTXModule) -> str:
    """Assemble the PTX with ptxas when it is installed (a CompileError if it rejects it); what was checked."""
    tool = find_ptxas()
    if tool is None:
        return "not checked (ptxas is not installed)"
    try:
        report = assemble_ptx(module.ptx, module.arch, tool)
    except PtxasError as err:
        raise CompileError(f"ptxas rejects the generated PTX for {module.arch}: {err}") from None
    return f"assembled by {tool} for {module.arch}: {len(report.kernels)} kernels"


def _function_to_json(f: Any) -> dict[str, Any]:
    return {"name": f.name, "param_names": list(f.param_names), "param_shapes": [list(s) for s in f.param_shapes],
            "param_dtypes": list(f.param_dtypes),
            "workspaces": [{"name": w.name, "shape": list(w.shape), "dtype": w.dtype} for w in f.workspaces],
            "kernels": [{"name": k.name, "grid": list(k.launch.grid), "block": list(k.launch.block),
                         "dynamic_shared_bytes": k.launch.dynamic_shared_bytes, "args": list(k.args),
                         "static_shared_bytes": k.static_shared_bytes, "local_bytes": k.local_bytes}
                        for k in f.kernels]}


def _function_from_json(data: Mapping[str, Any]) -> Any:
    return GPUFunction(
        str(data["name"]), tuple(data["param_names"]), tuple(tuple(int(d) for d in s) for s in data["param_shapes"]),
        tuple(data["param_dtypes"]),
        tuple(WorkspaceSpec(w["name"], tuple(int(d) for d in w["shape"]), w["dtype"]) for w in data["workspaces"]),
        tuple(GPUKernel(k["name"], LaunchConfig(tuple(k["grid"]), tuple(k["block"]), int(k["dynamic_shared_bytes"])),
                        tuple(int(a) for a in k["args"]), int(k["static_shared_bytes"]), int(k["local_bytes"]))
              for k in data["kernels"]))


def save_gpu_model(path: str | os.PathLike[str], plan: Any, module: PTXModule, constants: Sequence[np.ndarray],
                   target: Any, build_info: Mapping[str, Any]) -> Path:
    """One zip file: manifest.json (graph plan, launch plans, target), module.ptx, constants/<i>.npy."""

    path = Path(path)
    manifest = {"format": GPU_FORMAT_NAME, "format_version": GPU_FORMAT_VERSION, "relay_tune_version": __version__,
                "target": str(target), "arch": module.arch, "plan": plan.to_json(),
                "functions": [_function_to_json(f) for f in module.functions],
                "constants": [f"constants/{i}.npy" for i in range(len(constants))],
                "build_info": json.loads(json.dumps(dict(build_info), default=str))}
    temporary = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
            archive.writestr("manifest.json", json.dumps(manifest, indent=1))
            archive.writestr("module.ptx", module.ptx)
            for i, constant in enumerate(constants):
                with archive.open(f"constants/{i}.npy", "w", force_zip64=True) as out:
                    np.lib.format.write_array(out, np.ascontiguousarray(constant), allow_pickle=False)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    return path


def is_gpu_model_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a model file written by `save_gpu_model` (checked by its manifest, cheaply)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return json.loads(archive.read("manifest.json")).get("format") == GPU_FORMAT_NAME
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, AttributeError):
        return False


def read_gpu_model(path: str | os.PathLike[str]) -> PTXModel:
    """The contents of a GPU model file (no GPU needed to read it)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read("manifest.json"))
            if manifest.get("format") != GPU_FORMAT_NAME:
                raise RelayTuneError(f"{path}: not a relay-tune GPU model file")
            if manifest.get("format_version") != GPU_FORMAT_VERSION:
                raise RelayTuneError(f"{path}: GPU model format version {manifest.get('format_version')} is not "
                                     f"supported (this relay-tune reads version {GPU_FORMAT_VERSION}); rebuild it")
            module = PTXModule(archive.read("module.ptx").decode(), str(manifest["arch"]),
                               tuple(_function_from_json(f) for f in manifest["functions"]))
            constants = []
            for name in manifest["constants"]:
                with archive.open(name) as stream:
                    constants.append(np.lib.format.read_array(stream, allow_pickle=False))
            plan = GraphPlan.from_json(manifest["plan"])
            target = Target.parse(manifest["target"])
    except (OSError, zipfile.BadZipFile, KeyError, TypeError, ValueError, UnicodeDecodeError) as err:
        raise RelayTuneError(f"{path}: damaged GPU model file ({type(err).__name__}: {err})") from None
    return PTXModel(plan, module, constants, target, dict(manifest.get("build_info") or {}))


def load_gpu_model(path: str | os.PathLike[str], device: GPUDevice | None = None) -> GPUModel:
    """A GPU model file on this machine's GPU (`CudaUnavailableError`, saying a GPU is needed, without one)."""
    return read_gpu_model(path).to_device(device)


class PTXModel:
    """A model compiled for a CUDA target but not on a GPU: the PTX, launch plans, graph plan and constants.

    What `relay_tune.build(mod, "cuda ...")` returns on a machine without a usable GPU (a build machine):
    `save` writes the file that `relay-tune run` (or `load_gpu_model`) runs on a machine with one.
    """

    def __init__(self, plan: Any, module: PTXModule, constants: list[np.ndarray], target: Any,
                 build_info: Mapping[str, Any]) -> None:
        self.plan = plan
        self.module = module
        self.constants = constants
        self.target = target
        self.build_info = dict(build_info)

    def save(self, path: str | os.PathLike[str]) -> Path:
        return save_gpu_model(path, self.plan, self.module, self.constants, self.target, self.build_info)

    def to_device(self, device: GPUDevice | None = None) -> GPUModel:
        if device is None:
            reason = driver.cuda_available()
            if reason is not None:
                raise driver.CudaUnavailableError(f"this model was compiled for {self.target} (PTX): running it "
                                                  f"needs an NVIDIA GPU, and {reason}")
        return GPUModel(self.plan, self.module, self.constants, self.target, self.build_info, device)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.to_device().run(*args, **kwargs)

    __call__ = run

    def __repr__(self) -> str:
        return f"PTXModel({len(self.plan.calls)} calls, {len(self.module.kernel_names)} kernels, {self.target})"

