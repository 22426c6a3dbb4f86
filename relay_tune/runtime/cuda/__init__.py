"""Running generated GPU code: the CUDA driver API, an emulated device and model execution.

    device = cuda_device()                                   # the first GPU (CudaUnavailableError without one)
    module = build_ptx(funcs, "cuda -arch=" + device.arch)   # relay_tune.codegen.nvptx
    loaded = device.load(module)
    outputs = run_function(device, loaded, "dense", [a, w])  # host arrays in, host arrays out
    seconds = time_function(device, loaded, "dense", [a, w]) # CUDA events, per call

The package is split by responsibility:

- `device`: the `GPUDevice` interface (allocate, copy, load modules, launch kernels), device buffers, and
  `run_function` / `time_function` for one generated function on any device;
- `driver`: `CudaDevice`, an NVIDIA GPU through cuda-python's driver API, and `cuda_device()`;
- `emulator`: `EmulatedDevice`, which runs the kernels' loop nests in Python with GPU semantics (barriers,
  SHARED/LOCAL scopes), so schedules are checked without a GPU;
- `model`: `GPUModel`, a whole model from the graph plan of `relay_tune.build` in one device arena, and
  `PTXModel`, the same compiled on a machine without a GPU (cross-compiling): saved as one file of PTX, launch
  plans and constants that `load_gpu_model` / `relay-tune run` runs where there is a GPU;

Every name is importable from `relay_tune.runtime.cuda`. Tuning for GPUs sits a layer up, in the tuner:
`relay_tune.tuning.gpu_task` (`GPUTask`, a tuning task per fused function building PTX for a config of
`search_space.gpu`) and `relay_tune.tuning.cuda_runner` (`CudaRunner`, the GPU `relay_tune.tuning.Runner`).
"""

from __future__ import annotations

from relay_tune.runtime.cuda.device import (
    DEVICE_ALIGNMENT,
    DeviceBuffer,
    FunctionRunner,
    GPUDevice,
    LoadedModule,
    run_function,
    time_function,
)
from relay_tune.runtime.cuda.driver import (
    CudaDevice,
    CudaError,
    CudaUnavailableError,
    cuda_available,
    cuda_device,
    driver_module,
    gpu_status_line,
)
from relay_tune.runtime.cuda.emulator import EmulatedDevice, EmulationError
from relay_tune.runtime.cuda.model import (
    GPUModel,
    PTXModel,
    gpu_model_from_plan,
    is_gpu_model_file,
    load_gpu_model,
    read_gpu_model,
    save_gpu_model,
)

__all__ = [
    "DEVICE_ALIGNMENT",
    "CudaDevice",
    "CudaError",
    "CudaUnavailableError",
    "DeviceBuffer",
    "EmulatedDevice",
    "EmulationError",
    "FunctionRunner",
    "GPUDevice",
    "GPUModel",
    "LoadedModule",
    "PTXModel",
    "cuda_available",
    "cuda_device",
    "driver_module",
    "gpu_model_from_plan",
    "gpu_status_line",
    "is_gpu_model_file",
    "load_gpu_model",
    "read_gpu_model",
    "run_function",
    "save_gpu_model",
    "time_function",
]
