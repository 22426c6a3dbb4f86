"""`CudaRunner`: measures GPU artifacts behind the same `Runner` interface as the CPU's `LocalRunner`, on a
device of `relay_tune.runtime.cuda`.

The runner measures in a worker process that owns the CUDA context: a kernel that faults poisons its context,
so the worker reports the error and exits, and a fresh one takes over for the next artifact.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time
import traceback
from typing import Any

import numpy as np

from relay_tune.codegen.nvptx import GPUFunction, PTXModule
from relay_tune.errors import RelayTuneError
from relay_tune.records.measure import ErrorKind, RunResult
from relay_tune.runtime.cuda.device import run_function, time_function
from relay_tune.runtime.cuda.driver import CudaDevice, CudaError, CudaUnavailableError, cuda_device
from relay_tune.tuning.runner import DEFAULT_TOLERANCES, Runner, compare_outputs, random_inputs
from relay_tune.tuning.task import BuildArtifact, TuneTask, apply_layout


def _cuda_worker(conn: multiprocessing.connection.Connection, ordinal: int) -> None:
    """Measurement worker: owns the CUDA context; one request at a time."""
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


class CudaRunner(Runner):
    """Measures GPU artifacts (from `GPUTask.build`) on a CUDA device, in a worker process (a `Runner`).

    Without a usable GPU the first `run` raises `CudaUnavailableError` (the tuning session cannot go on).
    """

    def __init__(self, timeout: float = 30.0, number: int = 10, repeat: int = 3, min_repeat_ms: float = 20.0,
                 check_correctness: bool = True, seed: int = 0, device: int = 0,
                 tolerances: dict[str, tuple[float, float]] | None = None, startup_timeout: float = 120.0) -> None:
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

    @property
    def timing_kind(self) -> str:
        return "cuda_events"

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

    def _data_for(self, task: TuneTask) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        if task.key not in self._data:
            inputs = random_inputs(task.input_specs(), self.seed)
            expected = None
            if self.check_correctness:
                ref = task.reference([a.copy() for a in inputs])
                expected = None if ref is None else [np.asarray(r) for r in ref]
            self._data = {task.key: (inputs, expected)}
        return self._data[task.key]

    def run(self, task: TuneTask, artifact: BuildArtifact) -> RunResult:
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
