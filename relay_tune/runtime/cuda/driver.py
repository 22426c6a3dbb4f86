"""The CUDA driver API through cuda-python: `CudaDevice`, and `cuda_device()` for the device of this process.

cuInit, the device's primary context, cuModuleLoadData of the PTX (the driver JIT-compiles it for the GPU),
cuMemAlloc/cuMemcpy, cuLaunchKernel, CUDA events for timing. Without the package (`pip install relay-tune[cuda]`),
a driver or a GPU, `cuda_device()` raises `CudaUnavailableError` with one clear sentence.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import GPUKernel, PTXModule
from relay_tune.errors import RelayTuneError
from relay_tune.runtime.cuda.device import DeviceBuffer, GPUDevice, LoadedModule


class CudaUnavailableError(RelayTuneError):
    """No usable CUDA GPU: cuda-python, the NVIDIA driver or a device is missing."""


class CudaError(RelayTuneError):
    """A CUDA driver call failed."""


# ---------------------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------------------


def driver_module() -> Any:
    """cuda-python's driver bindings (`cuda.bindings.driver`, or `cuda.cuda` in older releases)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # type: ignore[no-redef]
        except ImportError:
            raise CudaUnavailableError(
                "running on a GPU needs NVIDIA's cuda-python (pip install 'relay-tune[cuda]'), which is not installed"
            ) from None
    return driver


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda-python result tuple `(CUresult, values...)`; raise CudaError unless it is success."""
    if not isinstance(result, tuple):
        result = (result,)
    err, *values = result
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise CudaError(f"{what} failed: {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def cuda_available() -> str | None:
    """None when a CUDA GPU can be used, else why not (one sentence)."""
    try:
        cuda_device()
    except CudaUnavailableError as err:
        return str(err)
    return None


_DEVICES: dict[int, CudaDevice] = {}


def cuda_device(ordinal: int = 0) -> CudaDevice:
    """The CUDA device `ordinal` with its primary context current on this thread (created once per process)."""
    device = _DEVICES.get(ordinal)
    if device is None:
        device = _DEVICES[ordinal] = CudaDevice(ordinal)
    else:
        device.make_current()
    return device



class CudaDevice(GPUDevice):
    """An NVIDIA GPU through the CUDA driver API (cuda-python)."""

    def __init__(self, ordinal: int = 0) -> None:
        drv = driver_module()
        self.drv = drv
        try:
            _check(drv.cuInit(0), "cuInit")
            count = _check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        except CudaError as err:
            raise CudaUnavailableError(f"no usable CUDA GPU: {err}") from None
        except Exception as err:  # the bindings raise their own errors when libcuda itself is missing
            raise CudaUnavailableError(f"no usable CUDA GPU: the NVIDIA driver could not be loaded ({err})") from None
        if int(count) <= ordinal:
            raise CudaUnavailableError(f"no usable CUDA GPU: {int(count)} device(s) found, device {ordinal} asked for")
        self.device = _check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = _check(drv.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.make_current()
        raw_name = _check(drv.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace")
        attr = drv.CUdevice_attribute
        major = _check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device),
                       "cuDeviceGetAttribute")
        minor = _check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device),
                       "cuDeviceGetAttribute")
        self.arch = f"sm_{int(major)}{int(minor)}"
        self._keep: list[Any] = []

    def make_current(self) -> None:
        _check(self.drv.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = _check(self.drv.cuMemAlloc(max(1, int(nbytes))), f"cuMemAlloc({nbytes})")
        return DeviceBuffer(int(ptr), int(nbytes))

    def free(self, buffer: DeviceBuffer) -> None:
        _check(self.drv.cuMemFree(buffer.ptr), "cuMemFree")

    def upload(self, buffer: DeviceBuffer, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        if data.nbytes:
            _check(self.drv.cuMemcpyHtoD(buffer.ptr + offset, data.ctypes.data, data.nbytes), "cuMemcpyHtoD")

    def download(self, array: np.ndarray, buffer: DeviceBuffer, offset: int = 0) -> None:
        if not array.flags.c_contiguous:
            raise CudaError("download needs a C-contiguous host array")
        if array.nbytes:
            _check(self.drv.cuMemcpyDtoH(array.ctypes.data, buffer.ptr + offset, array.nbytes), "cuMemcpyDtoH")

    def fill(self, buffer: DeviceBuffer, byte: int) -> None:
        _check(self.drv.cuMemsetD8(buffer.ptr, int(byte) & 0xFF, buffer.nbytes), "cuMemsetD8")

    def load(self, module: PTXModule) -> LoadedModule:
        drv = self.drv
        image = np.frombuffer(module.ptx.encode() + b"\0", dtype=np.uint8)
        native = _check(drv.cuModuleLoadData(image.ctypes.data), "cuModuleLoadData (driver JIT of the PTX)")
        handles: dict[str, Any] = {}
        for func in module.functions:
            for kernel in func.kernels:
                handle = _check(drv.cuModuleGetFunction(native, kernel.name.encode()),
                                f"cuModuleGetFunction({kernel.name})")
                if kernel.launch.dynamic_shared_bytes:
                    _check(drv.cuFuncSetAttribute(
                        handle, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        kernel.launch.dynamic_shared_bytes), "cuFuncSetAttribute")
                handles[kernel.name] = handle
        return LoadedModule(module, handles, native)

    def unload(self, loaded: LoadedModule) -> None:
        if loaded.native is not None:
            _check(self.drv.cuModuleUnload(loaded.native), "cuModuleUnload")
            loaded.native = None

    def launch(self, loaded: LoadedModule, kernel: GPUKernel, pointers: Sequence[int]) -> None:
        # kernelParams is a void** array whose entries point at the argument values (here: device pointers)
        values = np.array(pointers, dtype=np.uint64)
        slots = np.array([values.ctypes.data + 8 * i for i in range(len(values))], dtype=np.uint64)
        g, b = kernel.launch.grid, kernel.launch.block
        _check(self.drv.cuLaunchKernel(loaded.handles[kernel.name], g[0], g[1], g[2], b[0], b[1], b[2],
                                       kernel.launch.dynamic_shared_bytes, 0, slots.ctypes.data if len(values) else 0,
                                       0), f"cuLaunchKernel({kernel.name})")

    def synchronize(self) -> None:
        _check(self.drv.cuCtxSynchronize(), "cuCtxSynchronize (a kernel failed)")

    def time_launches(self, launch_all: Callable[[], None], number: int) -> float:
        drv = self.drv
        start = _check(drv.cuEventCreate(0), "cuEventCreate")
        stop = _check(drv.cuEventCreate(0), "cuEventCreate")
        try:
            _check(drv.cuEventRecord(start, 0), "cuEventRecord")
            for _ in range(number):
                launch_all()
            _check(drv.cuEventRecord(stop, 0), "cuEventRecord")
            _check(drv.cuEventSynchronize(stop), "cuEventSynchronize (a kernel failed)")
            ms = _check(drv.cuEventElapsedTime(start, stop), "cuEventElapsedTime")
        finally:
            drv.cuEventDestroy(start)
            drv.cuEventDestroy(stop)
        return float(ms) / 1000.0 / number


def gpu_status_line() -> str:
    """A one-line description of the GPU this process would use, or why there is none."""
    reason = cuda_available()
    if reason is not None:
        return reason
    device = cuda_device()
    return f"{device.name} ({device.arch}), pid {os.getpid()}"
