"""`EmulatedDevice`: runs the kernels' loop nests in Python with GPU semantics, so schedules are checked without a GPU.

Every thread of a block is its own coroutine that stops at each barrier until all threads of the block reach it;
LOCAL buffers are private to a thread, SHARED ones to a block; blocks run one after another, in reverse order by
default, threads in reverse order between barriers. A schedule whose threads read what other threads (or blocks,
or later kernels) have not written yet gives wrong results or NaN (scratch starts as NaN) here just as it would on
a GPU. It is slow: small shapes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import GPUKernel, PTXModule
from relay_tune.errors import RelayTuneError
from relay_tune.kernel import tir
from relay_tune.kernel.tir_eval import _Translator
from relay_tune.runtime.cuda.device import DEVICE_ALIGNMENT, DeviceBuffer, GPUDevice, LoadedModule


class EmulationError(RelayTuneError):
    """A kernel misbehaved under emulation (threads of a block disagree on barriers, bad access)."""


def _simt_source(func: tir.PrimFunc) -> tuple[str, dict[str, Any]]:
    """Python source of a per-thread generator for a kernel: thread bindings read the thread's coordinates
    (guarded when shorter than the launch), barriers yield, SHARED buffers come from the block's store."""
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

