"""What executors need from a GPU (`GPUDevice`), device buffers, and running one generated function on a device.

A `GPUFunction` (one PrimFunc) may be several launches; `run_function` allocates its workspaces and launches its
kernels in order, `time_function` times all of them per call. Both work on any `GPUDevice`: the CUDA driver
(`relay_tune.runtime.cuda.driver`) or the emulator (`relay_tune.runtime.cuda.emulator`).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import GPUFunction, GPUKernel, PTXModule
from relay_tune.errors import RelayTuneError

DEVICE_ALIGNMENT = 256  # cuMemAlloc's alignment; arena offsets keep every tensor at least 64-byte aligned


@dataclass(frozen=True)
class DeviceBuffer:
    """Device memory: its address and size. Freed by the device that allocated it."""

    ptr: int
    nbytes: int


@dataclass
class LoadedModule:
    """A PTXModule loaded on a device: kernel handles by name and the launch plans."""

    module: PTXModule
    handles: dict[str, Any]
    native: Any = None

    def function(self, name: str) -> GPUFunction:
        return self.module.function(name)


class GPUDevice(ABC):
    """What executors need from a GPU (see the module docstring)."""

    name: str
    arch: str

    @abstractmethod
    def alloc(self, nbytes: int) -> DeviceBuffer: ...

    @abstractmethod
    def free(self, buffer: DeviceBuffer) -> None: ...

    @abstractmethod
    def upload(self, buffer: DeviceBuffer, array: np.ndarray, offset: int = 0) -> None: ...

    @abstractmethod
    def download(self, array: np.ndarray, buffer: DeviceBuffer, offset: int = 0) -> None: ...

    @abstractmethod
    def fill(self, buffer: DeviceBuffer, byte: int) -> None: ...

    @abstractmethod
    def load(self, module: PTXModule) -> LoadedModule: ...

    @abstractmethod
    def launch(self, loaded: LoadedModule, kernel: GPUKernel, pointers: Sequence[int]) -> None: ...

    @abstractmethod
    def synchronize(self) -> None: ...

    def time_launches(self, launch_all: Callable[[], None], number: int) -> float:
        """Seconds per call of `launch_all` (which only enqueues work) over `number` back-to-back calls."""
        self.synchronize()
        start = time.perf_counter()
        for _ in range(number):
            launch_all()
        self.synchronize()
        return (time.perf_counter() - start) / number



def _nbytes(shape: Sequence[int], dtype: str) -> int:
    return max(1, math.prod(shape)) * np.dtype(dtype).itemsize


@dataclass
class FunctionRunner:
    """Launches of one GPUFunction bound to device buffers: `launch_all()` enqueues its kernels in order."""

    device: GPUDevice
    loaded: LoadedModule
    function: GPUFunction
    params: list[int]
    workspaces: list[DeviceBuffer] = field(default_factory=list)

    @staticmethod
    def bind(device: GPUDevice, loaded: LoadedModule, name: str, params: Sequence[int],
             workspace: Sequence[DeviceBuffer] | None = None) -> FunctionRunner:
        function = loaded.function(name)
        if len(params) != function.num_params:
            raise RelayTuneError(f"{name} takes {function.num_params} buffers, got {len(params)}")
        spaces = list(workspace) if workspace is not None else [device.alloc(w.nbytes) for w in function.workspaces]
        return FunctionRunner(device, loaded, function, list(params), spaces)

    def launch_all(self) -> None:
        pointers = self.params + [w.ptr for w in self.workspaces]
        for kernel in self.function.kernels:
            self.device.launch(self.loaded, kernel, [pointers[i] for i in kernel.args])

    def release(self) -> None:
        for w in self.workspaces:
            self.device.free(w)
        self.workspaces = []


def _upload_all(device: GPUDevice, function: GPUFunction, arrays: Sequence[np.ndarray],
                fill_outputs: int | None = 0xFF) -> tuple[list[DeviceBuffer], list[np.ndarray]]:
    """Device buffers for every parameter: the given leading arrays uploaded, the rest (outputs) filled."""
    buffers: list[DeviceBuffer] = []
    outputs: list[np.ndarray] = []
    for i, (shape, dtype) in enumerate(zip(function.param_shapes, function.param_dtypes)):
        buf = device.alloc(_nbytes(shape, dtype))
        buffers.append(buf)
        if i < len(arrays):
            array = np.ascontiguousarray(arrays[i])
            if tuple(array.shape) != tuple(shape) or str(array.dtype) != dtype:
                raise RelayTuneError(f"{function.name} argument {i}: expected {dtype}{list(shape)}, got "
                                     f"{array.dtype}{list(array.shape)}")
            device.upload(buf, array)
        else:
            if fill_outputs is not None:
                device.fill(buf, fill_outputs)  # NaN for floats: an element the kernel skips shows up
            outputs.append(np.empty(shape, dtype))
    return buffers, outputs


def run_function(device: GPUDevice, loaded: LoadedModule, name: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run PrimFunc `name` of a loaded module on host `inputs` (its leading parameters); returns the rest."""
    function = loaded.function(name)
    buffers, outputs = _upload_all(device, function, inputs)
    runner = FunctionRunner.bind(device, loaded, name, [b.ptr for b in buffers])
    try:
        runner.launch_all()
        device.synchronize()
        for array, buf in zip(outputs, buffers[len(inputs):]):
            device.download(array, buf)
    finally:
        runner.release()
        for b in buffers:
            device.free(b)
    return outputs


def time_function(device: GPUDevice, loaded: LoadedModule, name: str, inputs: Sequence[np.ndarray],
                  number: int = 10, repeat: int = 3, min_repeat_ms: float = 20.0) -> list[float]:
    """Seconds per call of PrimFunc `name` (every kernel of it), `repeat` measurements of `number`+ calls."""
    function = loaded.function(name)
    buffers, _ = _upload_all(device, function, inputs)
    runner = FunctionRunner.bind(device, loaded, name, [b.ptr for b in buffers])
    try:
        per_call = device.time_launches(runner.launch_all, 1)  # warm-up and estimate
        if min_repeat_ms > 0:
            number = max(number, min(100_000, math.ceil(min_repeat_ms / 1000.0 / max(per_call, 1e-7))))
        return [device.time_launches(runner.launch_all, number) for _ in range(repeat)]
    finally:
        runner.release()
        for b in buffers:
            device.free(b)

