"""Running generated GPU code: the CUDA driver API, an emulated device, model execution and GPU tuning.

    device = cuda_device()                                   # the first GPU (CudaUnavailableError without one)
    module = build_ptx(funcs, "cuda -arch=" + device.arch)   # relay_tune.codegen.nvptx
    loaded = device.load(module)
    outputs = run_function(device, loaded, "dense", [a, w])  # host arrays in, host arrays out
    seconds = time_function(device, loaded, "dense", [a, w]) # CUDA events, per call

Devices (`GPUDevice`) allocate, copy, load modules and launch kernels:

- `CudaDevice` talks to the driver through cuda-python (`pip install relay-tune[cuda]`): cuInit, the
  device's primary context, cuModuleLoadData of the PTX (the driver JIT-compiles it for the GPU),
  cuMemAlloc/cuMemcpy, cuLaunchKernel, CUDA events for timing. Without the package, a driver or a GPU,
  `cuda_device()` raises `CudaUnavailableError` with one clear sentence.
- `EmulatedDevice` runs the kernels' loop nests in Python with GPU semantics: every thread of a block is
  its own coroutine that stops at each barrier until all threads of the block reach it; LOCAL buffers
  are private to a thread, SHARED ones to a block; blocks run one after another, in reverse order by
  default, threads in reverse order between barriers. A schedule whose threads read what other threads
  (or blocks, or later kernels) have not written yet gives wrong results or NaN (scratch starts as NaN)
  here just as it would on a GPU, so schedules are checked without one. It is slow: small shapes only.

A `GPUFunction` (one PrimFunc) may be several launches; `run_function` allocates its workspaces and launches
its kernels in order. `GPUModel` runs a whole model from the graph plan `relay_tune.build` makes: the same
memory plan as on the CPU, in one device arena. `GPUTask` and `CudaRunner` tune fused functions on the GPU:
the task builds PTX for a config of `search_space.gpu`, the runner measures it in a worker process that owns
the CUDA context (a kernel that faults poisons its context; the worker is replaced).
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import GPUFunction, GPUKernel, PTXModule
from relay_tune.errors import RelayTuneError
from relay_tune.kernel import tir

__all__ = [
    "CudaDevice",
    "CudaError",
    "CudaRunner",
    "CudaUnavailableError",
    "DeviceBuffer",
    "EmulatedDevice",
    "GPUDevice",
    "GPUModel",
    "GPUTask",
    "LoadedModule",
    "cuda_available",
    "cuda_device",
    "driver_module",
    "gpu_model_from_plan",
    "gpu_tasks",
    "run_function",
    "time_function",
]

DEVICE_ALIGNMENT = 256  # cuMemAlloc's alignment; arena offsets keep every tensor at least 64-byte aligned


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


# ---------------------------------------------------------------------------------------------------
# the emulated device
# ---------------------------------------------------------------------------------------------------


class EmulationError(RelayTuneError):
    """A kernel misbehaved under emulation (threads of a block disagree on barriers, bad access)."""


def _simt_source(func: tir.PrimFunc) -> tuple[str, dict[str, Any]]:
    """Python source of a per-thread generator for a kernel: thread bindings read the thread's coordinates
    (guarded when shorter than the launch), barriers yield, SHARED buffers come from the block's store."""
    from relay_tune.kernel.tir_eval import _Translator  # the loop-nest interpreter's code generator

    class SIMTTranslator(_Translator):
        def __init__(self, f: tir.PrimFunc) -> None:
            super().__init__(f)
            self.bound: dict[str, str] = {}

        def stmt(self, s: tir.Stmt, depth: int) -> None:
            indent = "    " * depth
            if isinstance(s, tir.For) and s.kind is tir.ForKind.THREAD_BINDING:
                tag = s.thread_tag or ""
                kind, axis = tag.split(".")
                source = self.bound.get(tag) or f"{'_tid' if kind == 'threadIdx' else '_bid'}[{'xyz'.index(axis)}]"
                v = self.name_of(s.var, "_v")
                self.lines.append(f"{indent}if {source} < {s.extent}:")
                self.lines.append(f"{indent}    {v} = {source}")
                outer = self.bound.get(tag)
                self.bound[tag] = v
                self.stmt(s.body, depth + 1)
                if outer is None:
                    del self.bound[tag]
                else:
                    self.bound[tag] = outer
            elif isinstance(s, tir.Allocate) and s.buffer.scope is tir.Scope.SHARED:
                b = s.buffer
                fill = "_nan" if b.dtype.startswith("float") else "_UNINIT"
                name = self.name_of(b, "_b")
                self.lines.append(f"{indent}{name} = _shared.setdefault({name!r}, [{fill}] * {max(b.size, 1)})")
                self.stmt(s.body, depth)
            elif isinstance(s, tir.Barrier):
                self.lines.append(f"{indent}yield")
            else:
                super().stmt(s, depth)

        def translate(self) -> str:
            params = [self.name_of(b, "_b") for b in self.func.params]
            self.lines.append(f"def _kernel(_bid, _tid, _shared, {', '.join(params)}):")
            self.stmt(self.func.body, 1)
            self.lines.append("    return")
            self.lines.append("    yield")  # always a generator, even without barriers
            return "\n".join(self.lines)

    translator = SIMTTranslator(func)
    return translator.translate(), dict(translator.globals)


class EmulatedDevice(GPUDevice):
    """Runs kernels' loop nests with GPU semantics in Python (see the module docstring). `reverse`: blocks
    and threads run in reverse order (the order least likely to hide a missing dependency)."""

    def __init__(self, arch: str = "sm_90", reverse: bool = True) -> None:
        self.name = "emulated GPU"
        self.arch = arch
        self.reverse = reverse
        self._memory: dict[int, bytearray] = {}
        self._next = DEVICE_ALIGNMENT

    # memory: one bytearray per allocation, addressed by a fake, aligned device address
    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = self._next
        self._next += -(-max(1, nbytes) // DEVICE_ALIGNMENT) * DEVICE_ALIGNMENT + DEVICE_ALIGNMENT
        self._memory[ptr] = bytearray(max(1, nbytes))
        return DeviceBuffer(ptr, nbytes)

    def free(self, buffer: DeviceBuffer) -> None:
        del self._memory[buffer.ptr]

    def _view(self, ptr: int, nbytes: int) -> memoryview:
        for base, mem in self._memory.items():
            if base <= ptr and ptr + nbytes <= base + len(mem):
                return memoryview(mem)[ptr - base : ptr - base + nbytes]
        raise EmulationError(f"address {ptr:#x} (+{nbytes} bytes) is not inside any allocation")

    def upload(self, buffer: DeviceBuffer, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        self._view(buffer.ptr + offset, data.nbytes)[:] = data.tobytes()

    def download(self, array: np.ndarray, buffer: DeviceBuffer, offset: int = 0) -> None:
        raw = self._view(buffer.ptr + offset, array.nbytes)
        array.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, dtype=np.uint8)

    def fill(self, buffer: DeviceBuffer, byte: int) -> None:
        self._view(buffer.ptr, buffer.nbytes)[:] = bytes([int(byte) & 0xFF]) * buffer.nbytes

    def load(self, module: PTXModule) -> LoadedModule:
        if not module.kernels:
            raise EmulationError("the module carries no loop nests to emulate (built without them)")
        handles: dict[str, Any] = {}
        for kernel in module.kernels:
            source, namespace = _simt_source(kernel)
            exec(compile(source, f"<simt {kernel.name}>", "exec"), namespace)
            handles[kernel.name] = (kernel, namespace["_kernel"])
        return LoadedModule(module, handles)

    def launch(self, loaded: LoadedModule, kernel: GPUKernel, pointers: Sequence[int]) -> None:
        func, generator = loaded.handles[kernel.name]
        flats: list[list[Any]] = []
        views: list[tuple[np.ndarray, tir.Buffer]] = []
        for buf, ptr in zip(func.params, pointers):
            nbytes = max(1, buf.size) * np.dtype(buf.dtype).itemsize
            array = np.frombuffer(self._view(ptr, nbytes), dtype=buf.dtype)
            views.append((array, buf))
            flats.append(array.tolist())
        grid, block = kernel.launch.grid, kernel.launch.block
        blocks = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
        threads = [(x, y, z) for z in range(block[2]) for y in range(block[1]) for x in range(block[0])]
        if self.reverse:
            blocks.reverse()
            threads.reverse()
        for bid in blocks:
            shared: dict[str, list[Any]] = {}
            running = [generator(bid, tid, shared, *flats) for tid in threads]
            while running:
                waiting = []
                for gen in running:
                    try:
                        next(gen)
                        waiting.append(gen)
                    except StopIteration:
                        pass
                if waiting and len(waiting) != len(running):
                    raise EmulationError(
                        f"kernel {kernel.name}: {len(running) - len(waiting)} thread(s) of block {bid} finished "
                        f"while {len(waiting)} wait at a barrier"
                    )
                running = waiting
        for (array, buf), flat in zip(views, flats):
            # computed in Python floats/ints (as the loop-nest interpreter does), rounded to the dtype here
            array[:] = np.asarray(flat, dtype=np.float64 if buf.dtype.startswith("float") else None).astype(buf.dtype)

    def synchronize(self) -> None:
        """Launches complete before `launch` returns."""


# ---------------------------------------------------------------------------------------------------
# running functions
# ---------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------
# whole models
# ---------------------------------------------------------------------------------------------------


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
        self.device = device or cuda_device()
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
    device = cuda_device()
    if device.arch != module.arch and not isinstance(device, EmulatedDevice):
        info["device_arch"] = device.arch  # the driver JIT-compiles the PTX for the device's own architecture
    model = GPUModel(plan, module, constants, target, info, device)
    if start is not None:
        model.build_info["timings"]["total_s"] = time.perf_counter() - start
    return model


def gpu_tasks(mod: Any, target: str = "cuda -arch=sm_90", check_ptxas: bool = True) -> list[GPUTask]:
    """One GPU tuning task per distinct fused function of a type-checked module (after the graph passes)."""
    from relay_tune.passes import optimize
    from relay_tune.passes.extract_tasks import extract_tasks

    fused = optimize(mod)
    return [GPUTask.from_spec(spec, target, check_ptxas) for spec in extract_tasks(fused)]


# ---------------------------------------------------------------------------------------------------
# tuning: a task per fused function, and a runner measuring on the GPU
# ---------------------------------------------------------------------------------------------------


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
        from relay_tune.kernel.compute import primitive_compute
        from search_space.gpu import gpu_space

        self._prim = primitive_compute(self.func)
        self.space = gpu_space(self._prim, self.arch)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_prim", None)  # tensor expressions are rebuilt on the other side (cheap, deterministic)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        from relay_tune.kernel.compute import primitive_compute

        self.__dict__.update(state)
        self.func = _retyped(self.func)
        self._prim = primitive_compute(self.func)

    @property
    def arch(self) -> str:
        from relay_tune.codegen.nvptx import arch_of
        from relay_tune.target import Target

        return arch_of(Target.parse(self.target))

    @staticmethod
    def from_spec(spec: Any, target: str = "cuda -arch=sm_90", check_ptxas: bool = True) -> GPUTask:
        """The task of a `relay_tune.passes.extract_tasks.TaskSpec`."""
        return GPUTask(spec.key, spec.description, float(spec.flops), int(spec.occurrences), target, spec.func,
                       check_ptxas)

    def default_config(self) -> Any:
        from search_space.gpu import default_config

        return default_config(self._prim, self.arch)

    def input_specs(self) -> list[Any]:
        from relay_tune.tuning.task import TensorSpec

        return [TensorSpec(t.shape, t.dtype) for t in self._prim.inputs]

    def reference(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        from relay_tune.interpreter import evaluate
        from relay_tune.ir import Function, IRModule

        params = self.func.params
        plain = Function(params, self.func.body, self.func.ret_type)
        result = evaluate(IRModule({"main": plain}), list(inputs))
        return [np.asarray(r) for r in (result if isinstance(result, tuple) else (result,))]

    def steps(self, config: Any) -> list[Any]:
        from relay_tune.kernel.gpu_schedule import gpu_schedule
        from search_space.gpu import config_to_params

        return gpu_schedule(self._prim, config_to_params(self._prim, config))

    def build(self, config: Any) -> Any:
        from relay_tune.codegen.nvptx import assemble_ptx, build_ptx, check_launch_resources, find_ptxas
        from relay_tune.kernel.build import lower_primitive
        from relay_tune.target import Target
        from relay_tune.tuning.task import BuildArtifact, KernelArg, LayoutStep, TensorSpec
        from search_space import InvalidConfigError

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
    from relay_tune.ir import Function, IRModule
    from relay_tune.type_infer import infer_types

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


def _cuda_worker(conn: multiprocessing.connection.Connection, ordinal: int) -> None:
    """Measurement worker: owns the CUDA context; one request at a time."""
    from relay_tune.tuning.runner import compare_outputs
    from relay_tune.tuning.task import apply_layout

    try:
        device = cuda_device(ordinal)
    except RelayTuneError as err:
        conn.send(("unavailable", str(err)))
        return
    conn.send(("ready", device.name, device.arch))
    data: dict[str, Any] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "load":
            _, key, inputs, expected, tolerances = message
            data.clear()
            data[key] = (inputs, expected, tolerances)
            continue
        _, key, artifact, number, repeat, min_repeat_ms = message
        inputs, expected, tolerances = data[key]
        loaded = None
        try:
            function: GPUFunction = artifact.info["gpu_function"]
            module = PTXModule(artifact.code.decode(), artifact.info.get("arch", device.arch), (function,))
            try:
                loaded = device.load(module)
            except CudaError as err:
                conn.send(("error", "COMPILE_ERROR", f"the driver rejected the PTX: {err}"))
                continue
            arrays = [apply_layout(inputs[a.index].copy(), a.layout) for a in artifact.args if a.role == "input"]
            outs = run_function(device, loaded, function.name, arrays)
            if expected is not None:
                out_args = [a for a in artifact.args if a.role == "output"]
                for arg, got in zip(out_args, outs):
                    problem = compare_outputs(apply_layout(got, arg.layout), expected[arg.index], tolerances, arg.index)
                    if problem is not None:
                        raise _WrongResult(problem)
            costs = time_function(device, loaded, function.name, arrays, number, repeat, min_repeat_ms)
            conn.send(("ok", costs, ""))
        except _WrongResult as err:
            conn.send(("error", "WRONG_RESULT", str(err)))
        except CudaError as err:
            # a faulting kernel leaves the context unusable: report, then exit so that a fresh worker takes over
            conn.send(("error", "RUNTIME_ERROR", str(err)))
            return
        except Exception as err:
            conn.send(("error", "RUNTIME_ERROR", "".join(traceback.format_exception_only(type(err), err)).strip()))
        finally:
            if loaded is not None and isinstance(device, CudaDevice):
                try:
                    device.unload(loaded)
                except CudaError:
                    pass


class _WrongResult(Exception):
    pass


class CudaRunner:
    """Measures GPU artifacts (from `GPUTask.build`) on a CUDA device, in a worker process (a `Runner`).

    Without a usable GPU the first `run` raises `CudaUnavailableError` (the tuning session cannot go on).
    """

    def __init__(self, timeout: float = 30.0, number: int = 10, repeat: int = 3, min_repeat_ms: float = 20.0,
                 check_correctness: bool = True, seed: int = 0, device: int = 0,
                 tolerances: dict[str, tuple[float, float]] | None = None, startup_timeout: float = 120.0) -> None:
        from relay_tune.tuning.runner import DEFAULT_TOLERANCES

        self.timeout = timeout
        self.number, self.repeat, self.min_repeat_ms = number, repeat, min_repeat_ms
        self.check_correctness = check_correctness
        self.seed = seed
        self.ordinal = device
        self.tolerances = {**DEFAULT_TOLERANCES, **(tolerances or {})}
        self.startup_timeout = startup_timeout
        self._process: Any = None
        self._conn: Any = None
        self._loaded_key: str | None = None
        self._data: dict[str, Any] = {}

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(target=_cuda_worker, args=(child, self.ordinal), daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        self._loaded_key = None
        if not parent.poll(self.startup_timeout):
            self.close()
            raise CudaUnavailableError("the GPU measurement worker did not start")
        reply = parent.recv()
        if reply[0] != "ready":
            self.close()
            raise CudaUnavailableError(reply[1])

    def _data_for(self, task: Any) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        from relay_tune.tuning.runner import random_inputs

        if task.key not in self._data:
            inputs = random_inputs(task.input_specs(), self.seed)
            expected = None
            if self.check_correctness:
                ref = task.reference([a.copy() for a in inputs])
                expected = None if ref is None else [np.asarray(r) for r in ref]
            self._data = {task.key: (inputs, expected)}
        return self._data[task.key]

    def run(self, task: Any, artifact: Any) -> Any:
        from relay_tune.tuning.measure import ErrorKind, RunResult

        inputs, expected = self._data_for(task)
        if self._process is None or not self._process.is_alive():
            self._start()
        start = time.monotonic()
        try:
            if self._loaded_key != task.key:
                self._conn.send(("load", task.key, inputs, expected, self.tolerances))
                self._loaded_key = task.key
            self._conn.send(("run", task.key, artifact, self.number, self.repeat, self.min_repeat_ms))
            ready = self._conn.poll(self.timeout)
        except (BrokenPipeError, EOFError, OSError):
            ready = False
        elapsed = time.monotonic() - start
        if not ready:
            alive = self._process is not None and self._process.is_alive()
            self.close()
            if alive:
                return RunResult(None, ErrorKind.TIMEOUT, f"kernel did not finish within {self.timeout:g} s", elapsed)
            return RunResult(None, ErrorKind.RUNTIME_ERROR, "the GPU worker died", elapsed)
        try:
            status, payload, message = self._conn.recv()
        except (EOFError, OSError):
            self.close()
            return RunResult(None, ErrorKind.RUNTIME_ERROR, "the GPU worker died", elapsed)
        if status == "ok":
            return RunResult(tuple(float(c) for c in payload), None, "", time.monotonic() - start)
        if payload == "RUNTIME_ERROR":
            self.close()  # the worker exits after a driver error; make sure the next run starts a fresh one
        return RunResult(None, ErrorKind[payload], message, time.monotonic() - start)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
        if self._process is not None:
            self._process.join(timeout=2)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(timeout=2)
        self._process = None
        self._conn = None
        self._loaded_key = None

    def __enter__(self) -> CudaRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gpu_status_line() -> str:
    """A one-line description of the GPU this process would use, or why there is none."""
    reason = cuda_available()
    if reason is not None:
        return reason
    device = cuda_device()
    return f"{device.name} ({device.arch}), pid {os.getpid()}"
