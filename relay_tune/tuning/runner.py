"""Runners: load a built kernel, check its outputs, and time it, isolated from the tuning process.

`LocalRunner` keeps one measurement worker process and sends it one artifact, or one tuning round's artifacts
(`run_batch`), at a time (measurements run serially, so each kernel has every core to itself, as in the final
model). Generated code can crash or hang, and
the driver must survive both: a worker that dies (SIGSEGV, abort...) yields RUNTIME_ERROR, one that does not answer
within the run timeout is killed (SIGTERM, then SIGKILL) and yields TIMEOUT; either way a fresh worker takes over.
The timeout starts when the artifact is sent, after the worker reported ready, so start-up time never counts.

Per task the runner generates seeded random inputs (values that are neither zero nor round, so a kernel that
drops terms or swaps operands shows up) and asks the task's numpy `reference` for the expected outputs; both are
sent to the worker once and cached there. For each artifact the worker:

1. fills output buffers with NaN (integers: a sentinel) so that a kernel that skips elements cannot pass because
   an earlier kernel wrote them, calls the kernel once on fresh copies of the inputs, and compares the outputs
   with the reference under a dtype-dependent tolerance (mismatch: WRONG_RESULT, never timed);
2. runs `warmup` calls (and more until `warmup_ms` passed), then raises `number` until one repeat lasts at least
   `min_repeat_ms` (of wall time, producer steps included, so a measurement's cost stays bounded), and records
   `repeat` costs (seconds per call, averaged over `number` calls), in context (below) or optionally evicting
   caches before each call.

A round's artifacts are timed interleaved (`run_batch`): all are checked and sized, then each repeat round times
every kernel once (after one untimed call). This machine's class of host (a shared VM) has slow spells: a 2 ms
probe on each core ran >1.3x slow in 13-18% of its windows, one spell lasted 0.8 s, and a ResNet-50 tuning log
recorded the defaults of 4 of its 26 tasks at 1.5-2x their time in the model, all three back-to-back repeats
inside one spell. Interleaved, a spell hits one repeat of several kernels instead of every repeat of one, and the
minimum over repeats, which the tuner ranks by, stays true.

Cold weights (`cold_weights_bytes`). In a model each kernel reads its weights from memory: between two uses of
a convolution's weights the other layers stream the rest of the model's weights (ResNet-50: 100 MB) through the
caches. Called back to back on one buffer, the kernel finds its weights in cache, and the log then promises a
time the model never sees (most ResNet-50 convolutions ran 1.2-1.7x their logged time in the model). So the
runner gives the task's weight arguments (the inputs that are model constants, `TuneTask.weight_inputs`) that
many bytes of copies and rotates through them, call by call: every call reads weights that are not in cache.
The worker keeps the copies from one config of a task to the next (`WeightCopies`).

In context (`in_context`, on by default). In a model a kernel's activation inputs were just written by the kernel
before it, each core's share dirty in that core's cache; called back to back, a kernel finds them in its own cache,
and memory-bound kernels (pooling, Winograd transforms, the image's layout transform) ran 1.5-3x their logged
time in the model. So a kernel is timed by one native loop (`relay_tune.runtime.context`) that, before each call and
untimed, runs a producer step on the thread team (`context_step`: each thread rewrites a share of every activation
input, from a copy saved before the check, so the values stay the checked ones, and the outputs' lines are pushed
out of the cores' private caches into the shared one, as arena memory a few kernels used last; `OUTPUT_CONTEXT`),
and sums the time between
timestamps taken right around each kernel call, as the model's profiler does. Weights rotate as above. A logged
cost is therefore a kernel's own time in that context, without the Python call (about 1 us) that the previous
timing loop added per call where weights rotated. Kernels with prologue packers, or timed with `flush_cache`, or
without a repeat entry point, are timed as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing
import multiprocessing.connection
import os
import tempfile
import time
import traceback
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import ml_dtypes
import numpy as np
from llvmlite import binding as llvm
from llvmlite.binding import orcjit
from threadpoolctl import threadpool_limits

from relay_tune.codegen.jit import DEFAULT_GOMP_SPINCOUNT, threading_imports
from relay_tune.ir.dtypes import LOW_PRECISION_FLOAT_DTYPES
from relay_tune.op._shape import numpy_dtype
from relay_tune.records.measure import ErrorKind, RunResult
from relay_tune.runtime.context import Production, context_loop, private_cache_bytes, production
from relay_tune.runtime.pages import huge_page_empty
from relay_tune.tuning.isolation import describe_exit, die_with_parent, ignore_interrupts
from relay_tune.tuning.task import BuildArtifact, TensorSpec, TuneTask, apply_layout

# (rtol, atol) per dtype; atol is scaled by the largest expected magnitude (at least 1).
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-2, 1e-2),
    "float32": (1e-4, 1e-5),
    "float64": (1e-9, 1e-12),
    # the narrow floats: two steps of the type's resolution (a sum in another order may round the other way)
    **{name: (2 * float(ml_dtypes.finfo(getattr(ml_dtypes, name)).eps),) * 2 for name in LOW_PRECISION_FLOAT_DTYPES},
}


def _kind(dtype: np.dtype) -> str:
    """numpy's kind letter, also for the ml_dtypes types (kind "V"): "f" for their floats, "i"/"u" for their
    integers."""
    if dtype.kind != "V":
        return dtype.kind
    if dtype.name in LOW_PRECISION_FLOAT_DTYPES:
        return "f"
    return "u" if dtype.name.startswith("u") else "i"


class Runner(ABC):
    """Measures artifacts of a task, one at a time. `run` never raises for a bad kernel: errors are results."""

    @property
    def timing_kind(self) -> str:
        """How this runner times kernels, written into every record (`TuningRecord.timing`); records of different
        kinds are never ranked against each other. "" where a runner does not say."""
        return ""

    @abstractmethod
    def run(self, task: TuneTask, artifact: BuildArtifact) -> RunResult: ...

    def run_batch(self, task: TuneTask, artifacts: Sequence[BuildArtifact]) -> list[RunResult]:
        """Measure several artifacts of one task (a tuning round); one result each, in order. Runners that can
        interleave the configs' repeats override this (`LocalRunner`)."""
        return [self.run(task, artifact) for artifact in artifacts]

    def close(self) -> None:  # noqa: B027 - runners without resources need not override
        """Release worker processes (the runner restarts them if used again)."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class TimingOptions:
    number: int = 3
    repeat: int = 3
    min_repeat_ms: float = 50.0
    warmup: int = 1
    flush_cache: bool = False
    flush_bytes: int = 64 << 20  # larger than any last-level cache we target
    cold_weights_bytes: int = 0  # 0: weights stay in one buffer (warm); else rotate copies of this many bytes
    warmup_ms: float = 0.0  # untimed warm-up calls go on (after `warmup` calls) until they took this long
    reuse_weight_copies: bool = True  # keep the copies across configs of a task (`WeightCopies`); False: per run
    in_context: bool = True  # a parallel producer step rewrites the activation inputs before each timed call


MAX_WEIGHT_COPIES = 4096  # small weights: the copies' count, not their bytes, bounds the set-up time


def random_inputs(specs: Sequence[TensorSpec], seed: int) -> list[np.ndarray]:
    """Seeded inputs with irregular values: floats in [-1, 1) away from 0 (times the spec's `scale`), small non-zero
    integers, random bools. A spec marked `nonnegative` gets the magnitudes alone (the same draws, so other inputs
    keep their values)."""
    rng = np.random.default_rng(seed)
    arrays: list[np.ndarray] = []
    for spec in specs:
        dtype = numpy_dtype(spec.dtype)
        kind = _kind(dtype)
        # at most 7, and no more than a narrow integer type holds (int2: 1, uint2: 3)
        high = min(8, int(ml_dtypes.iinfo(dtype).max) + 1) if kind in "iu" else 8
        if kind == "f":
            magnitude = rng.uniform(0.05, 1.0, size=spec.shape)
            sign = rng.choice(np.array([-1.0, 1.0]), size=spec.shape)
            unsigned = spec.nonnegative or spec.dtype == "float8_e8m0fnu"
            arrays.append(((magnitude if unsigned else magnitude * sign) * spec.scale).astype(dtype))
        elif kind == "b":
            arrays.append(rng.integers(0, 2, size=spec.shape).astype(dtype))
        elif kind == "u":
            arrays.append(rng.integers(1, high, size=spec.shape).astype(dtype))
        elif kind == "i":
            values = rng.integers(1, high, size=spec.shape)
            sign = rng.choice(np.array([-1, 1]), size=spec.shape)
            arrays.append((values if spec.nonnegative else values * sign).astype(dtype))
        else:
            raise ValueError(f"cannot generate inputs of dtype {spec.dtype}")
    return arrays


class LocalRunner(Runner):
    """Serial, process-isolated measurement on this machine (see the module docstring)."""

    def __init__(
        self,
        timeout: float = 10.0,
        number: int = 3,
        repeat: int = 3,
        min_repeat_ms: float = 50.0,
        warmup: int = 1,
        flush_cache: bool = False,
        cold_weights_bytes: int = 0,
        reuse_weight_copies: bool = True,
        warmup_ms: float = 0.0,
        cooldown_s: float = 0.0,
        check_correctness: bool = True,
        seed: int = 0,
        tolerances: dict[str, tuple[float, float]] | None = None,
        max_runs_per_worker: int = 200,
        startup_timeout: float = 120.0,
        interleave: bool = True,
        in_context: bool = True,
    ) -> None:
        if number < 1 or repeat < 1:
            raise ValueError("number and repeat must be >= 1")
        self.timeout = timeout
        self.timing = TimingOptions(number, repeat, min_repeat_ms, warmup, flush_cache,
                                    cold_weights_bytes=cold_weights_bytes,
                                    warmup_ms=warmup_ms, reuse_weight_copies=reuse_weight_copies,
                                    in_context=in_context)
        self.cooldown_s = cooldown_s
        self.check_correctness = check_correctness
        self.seed = seed
        self.tolerances = {**DEFAULT_TOLERANCES, **(tolerances or {})}
        self.max_runs_per_worker = max_runs_per_worker
        self.startup_timeout = startup_timeout
        self.interleave = interleave
        self._worker: _WorkerHandle | None = None
        self._task_data: OrderedDict[str, tuple[list[np.ndarray], list[np.ndarray] | None]] = OrderedDict()

    # -- task data -----------------------------------------------------------------------------------------------

    @property
    def timing_kind(self) -> str:
        if self.timing.flush_cache:
            return "flush_cache"
        return "in_context" if self.timing.in_context else "back_to_back"

    def _data_for(self, task: TuneTask) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        cached = self._task_data.get(task.key)
        if cached is not None:
            self._task_data.move_to_end(task.key)
            return cached
        inputs = random_inputs(task.input_specs(), self.seed)
        expected: list[np.ndarray] | None = None
        if self.check_correctness:
            # numpy's BLAS on one thread: its pool threads busy-wait for about 0.1 s after a call, and the kernel
            # measured next (on the same cores) ran 1.5-3x slower in its first repeats while they did.
            with threadpool_limits(limits=1, user_api="blas"):
                reference = task.reference([a.copy() for a in inputs])
            expected = None if reference is None else [np.asarray(r) for r in reference]
        self._task_data[task.key] = (inputs, expected)
        # Kept while they fit in `_TASK_DATA_BYTES`: the scheduler returns to a task after others, and computing
        # its reference again costs time (and, before, a disturbed first measurement).
        while len(self._task_data) > 1 and sum(_nbytes(entry) for entry in self._task_data.values()) \
                > _TASK_DATA_BYTES:
            self._task_data.popitem(last=False)
        return inputs, expected

    # -- running -------------------------------------------------------------------------------------------------

    def _send_task(self, worker: _WorkerHandle, task: TuneTask) -> None:
        """Give the worker the task's inputs and expected outputs, unless it holds them already."""
        if task.key in worker.loaded:
            return
        inputs, expected = self._data_for(task)
        weights = tuple(getattr(task, "weight_inputs", ()))
        worker.send(("load", task.key, inputs, expected, self.tolerances, weights))
        worker.loaded[task.key] = None
        while len(worker.loaded) > _WORKER_TASKS:  # the worker drops its oldest task data likewise
            del worker.loaded[next(iter(worker.loaded))]

    def _count_runs(self, worker: _WorkerHandle, runs: int) -> None:
        worker.runs += runs
        if worker.runs >= self.max_runs_per_worker:
            self._discard_worker()  # JIT'd code accumulates in the worker; start clean

    def run(self, task: TuneTask, artifact: BuildArtifact) -> RunResult:
        self._data_for(task)  # the reference is computed before the clock starts
        if self.cooldown_s > 0:
            time.sleep(self.cooldown_s)
        worker = self._ready_worker()
        start = time.monotonic()
        try:
            self._send_task(worker, task)
            worker.send(("run", task.key, artifact, self.timing))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            return self._worker_died(worker, time.monotonic() - start)
        reply = worker.receive(self.timeout - (time.monotonic() - start))
        elapsed = time.monotonic() - start
        if reply is _DIED:
            return self._worker_died(worker, elapsed)
        if reply is _TIMED_OUT:
            self._discard_worker()
            return self._timed_out(elapsed)
        self._count_runs(worker, 1)
        status, payload, message = reply
        return _run_result(status, payload, message, elapsed)

    def run_batch(self, task: TuneTask, artifacts: Sequence[BuildArtifact]) -> list[RunResult]:
        """Measure a round's artifacts in one worker, their repeats interleaved: each is checked and sized first,
        then every repeat round times each once. The machine's slow spells (a busy neighbour on the host can halve
        a parallel kernel's speed for up to a second) then fall on one repeat of several configs, not on every
        repeat of one, and the minimum over repeats stays true. A kernel that crashes or hangs is found by the
        worker's progress reports: it gets the error, the others are measured again without it."""
        artifacts = list(artifacts)
        if not self.interleave or len(artifacts) < 2 or self.timing.repeat < 2:
            return [self.run(task, artifact) for artifact in artifacts]
        self._data_for(task)
        if self.cooldown_s > 0:
            time.sleep(self.cooldown_s)
        worker = self._ready_worker()
        start = time.monotonic()
        current: int | None = None  # the artifact the worker reported working on last
        try:
            self._send_task(worker, task)
            worker.send(("run_batch", task.key, artifacts, self.timing))
            while True:
                # Every step (checking one kernel, or one repeat of one) must finish within the timeout of a run.
                reply = worker.receive(self.timeout)
                if reply is _DIED or reply is _TIMED_OUT or reply[0] != "step":
                    break
                current = reply[1]
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            reply = _DIED
        elapsed = time.monotonic() - start
        if reply is _DIED or reply is _TIMED_OUT:
            if reply is _DIED:
                failed = self._worker_died(worker, elapsed)
            else:
                self._discard_worker()
                failed = self._timed_out(self.timeout)
            if current is None:  # lost before any kernel ran: measure them one by one
                return [self.run(task, artifact) for artifact in artifacts]
            others = [a for i, a in enumerate(artifacts) if i != current]
            rest = iter(self.run_batch(task, others))
            return [failed if i == current else next(rest) for i in range(len(artifacts))]
        self._count_runs(worker, len(artifacts))
        return [_run_result(status, payload, message, seconds) for status, payload, message, seconds in reply[1]]

    def _timed_out(self, elapsed: float) -> RunResult:
        return RunResult(None, ErrorKind.TIMEOUT, f"kernel did not finish within {self.timeout:g} s (killed)",
                         elapsed)

    def worker_stats(self) -> dict[str, float]:
        """Counters of the current measurement worker (empty when none runs): "copy_sets_built" (of which
        "copy_sets_refilled" in the pages of an older set) and "copy_sets_reused", the cold-weight copy sets it
        filled and reused (`WeightCopies`), "copy_bytes" held, "copy_seconds" spent making copies."""
        worker = self._worker
        if worker is None or not worker.process.is_alive():
            return {}
        try:
            worker.send(("stats",))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            return {}
        reply = worker.receive(self.timeout)
        if reply is _DIED or reply is _TIMED_OUT or reply[0] != "stats":
            return {}
        return dict(reply[1])

    def _ready_worker(self) -> _WorkerHandle:
        if self._worker is None or not self._worker.process.is_alive():
            self._discard_worker()
            self._worker = _WorkerHandle.start(self.startup_timeout)
        return self._worker

    def _worker_died(self, worker: _WorkerHandle, elapsed: float) -> RunResult:
        worker.process.join(timeout=5)
        message = f"kernel crashed the measurement process ({describe_exit(worker.process.exitcode)})"
        self._discard_worker()
        return RunResult(None, ErrorKind.RUNTIME_ERROR, message, elapsed)

    def _discard_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    def close(self) -> None:
        self._discard_worker()


def _run_result(status: str, payload: Any, message: str, elapsed: float) -> RunResult:
    if status == "ok":
        return RunResult(tuple(float(c) for c in payload), None, "", elapsed)
    return RunResult(None, ErrorKind[payload], message, elapsed)


def _nbytes(entry: tuple[list[np.ndarray], list[np.ndarray] | None]) -> int:
    inputs, expected = entry
    return sum(a.nbytes for a in inputs) + sum(a.nbytes for a in expected or ())


_TASK_DATA_BYTES = 512 << 20  # inputs and expected outputs the runner keeps per task, all tasks together
_WORKER_TASKS = 4  # tasks whose inputs and expected outputs a measurement worker keeps
_DIED = object()
_TIMED_OUT = object()


class _WorkerHandle:
    """The driver's side of one measurement worker process."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: multiprocessing.connection.Connection):
        self.process = process
        self.conn = conn
        self.loaded: dict[str, None] = {}  # task data held by the worker, oldest first
        self.runs = 0

    @classmethod
    def start(cls, startup_timeout: float) -> _WorkerHandle:
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe(duplex=True)
        process = context.Process(target=worker_main, args=(child_end,), name="relay-tune-runner", daemon=True)
        process.start()
        child_end.close()
        handle = cls(process, parent_end)
        reply = handle.receive(startup_timeout)
        if reply is _DIED or reply is _TIMED_OUT or reply[0] != "ready":
            handle.stop()
            raise RuntimeError(f"the measurement worker failed to start ({describe_exit(process.exitcode)})")
        return handle

    def send(self, message: tuple[Any, ...]) -> None:
        self.conn.send(message)

    def receive(self, timeout: float) -> Any:
        try:
            if not self.conn.poll(max(0.0, timeout)):
                return _DIED if not self.process.is_alive() else _TIMED_OUT
            return self.conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            return _DIED

    def stop(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=1.0)
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5.0)


# ---------------------------------------------------------------------------------------------------------------
# Worker process
# ---------------------------------------------------------------------------------------------------------------

class KernelLoader:
    """Turns artifacts into callables inside the worker. Keeps loaded code alive while it is used."""

    def __init__(self) -> None:
        self._jit: Any = None
        self._counter = 0
        self._keep: list[Any] = []
        self._libraries: set[str] = set()
        self.prologue: list[tuple[Callable[..., Any], int, int]] = []  # of the artifact loaded last

    def load(self, artifact: BuildArtifact) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
        """The kernel, and its repeat entry point when the artifact has one (prologue kernels: `prologue`)."""
        for name in artifact.requires_libraries:
            if name not in self._libraries:
                ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)  # make e.g. libgomp's symbols visible to JIT'd code
                self._libraries.add(name)
        restype = ctypes.c_int32 if artifact.returns_status else None
        prototype = ctypes.CFUNCTYPE(restype, *([ctypes.c_void_p] * len(artifact.args)))
        if artifact.code_format == "elf-object":
            addresses = self._load_object(artifact)
        elif artifact.code_format == "shared-library":
            addresses = self._load_shared(artifact)
        else:
            raise ValueError(f"unknown artifact code format {artifact.code_format!r}")
        repeat = None
        if artifact.repeat_symbol is not None:
            repeat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(addresses[artifact.repeat_symbol])
        packer = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
        self.prologue = [(packer(addresses[symbol]), index, position)
                         for symbol, index, position in artifact.prologue]
        return prototype(addresses[artifact.kernel_name]), repeat

    @staticmethod
    def _symbols(artifact: BuildArtifact) -> list[str]:
        return ([artifact.kernel_name] + ([artifact.repeat_symbol] if artifact.repeat_symbol else [])
                + [symbol for symbol, _, _ in artifact.prologue])

    def _load_object(self, artifact: BuildArtifact) -> dict[str, int]:
        if self._jit is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            self._jit = orcjit.create_lljit_compiler()
        self._counter += 1
        builder = orcjit.JITLibraryBuilder().add_object_img(artifact.code).add_current_process()
        # the thread team models run their parallel loops on (`load_object`'s default runtime)
        imports, team = threading_imports(artifact.code)
        for symbol, address in imports.items():
            builder.import_symbol(symbol, address)
        if team is not None:
            self._keep.append(team)
        for symbol in self._symbols(artifact):
            builder.export_symbol(symbol)
        library = builder.link(self._jit, f"candidate_{self._counter}")
        self._keep.append(library)
        return {symbol: int(library[symbol]) for symbol in self._symbols(artifact)}

    def _load_shared(self, artifact: BuildArtifact) -> dict[str, int]:
        handle, path = tempfile.mkstemp(suffix=".so", prefix="relay_tune_kernel_")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(artifact.code)
            library = ctypes.CDLL(path)
        finally:
            os.unlink(path)  # the mapping stays valid after the file is gone
        self._keep.append(library)
        return {symbol: int(ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value or 0)
                for symbol in self._symbols(artifact)}

    def release(self) -> None:
        # Loaded code stays mapped (LLVM frees little); the runner recycles the worker after a number of runs.
        self._keep.clear()


def _sentinel_fill(spec: TensorSpec) -> np.ndarray:
    dtype = numpy_dtype(spec.dtype)
    kind = _kind(dtype)
    if kind == "f" and spec.dtype == "float4_e2m1fn":  # no NaN: its largest value
        return np.full(spec.shape, float(ml_dtypes.finfo(dtype).max), dtype=dtype)
    if kind == "f":
        return np.full(spec.shape, np.nan, dtype=dtype)
    if kind == "b":
        return np.ones(spec.shape, dtype=dtype)
    info = ml_dtypes.iinfo(dtype)
    return np.full(spec.shape, min(int(info.min) + 17, int(info.max)), dtype=dtype)


def compare_outputs(
    actual: np.ndarray, expected: np.ndarray, tolerances: dict[str, tuple[float, float]], index: int
) -> str | None:
    """None when `actual` matches `expected` within the dtype's tolerance, else a description of the mismatch."""
    if actual.shape != expected.shape:
        return f"output {index}: shape {actual.shape} != expected {expected.shape}"
    if _kind(actual.dtype) in "iub" or _kind(expected.dtype) in "iub":
        bad = actual != expected
        detail = ""
    else:
        rtol, atol = tolerances.get(str(actual.dtype), DEFAULT_TOLERANCES["float32"])
        expected64 = expected.astype(np.float64)
        scale = max(1.0, float(np.max(np.abs(expected64))) if expected64.size else 1.0)
        actual64 = actual.astype(np.float64)
        bad = ~np.isclose(actual64, expected64, rtol=rtol, atol=atol * scale, equal_nan=False)
        detail = f" (rtol={rtol:g}, atol={atol * scale:g})"
    count = int(np.count_nonzero(bad))
    if count == 0:
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    unwritten = int(np.count_nonzero(np.isnan(actual.astype(np.float64)))) if _kind(actual.dtype) == "f" else 0
    note = f"; {unwritten} never written" if unwritten else ""
    return (f"output {index}: {count} of {actual.size} elements differ{detail}{note}; first at {first}: "
            f"got {actual[first]!r}, expected {expected[first]!r}")


@dataclass
class _Timed:
    """A checked kernel ready to be timed: `run_many(count)` makes `count` calls (`number` per repeat). `keep`
    holds what its argument pointers point into (copies of weights, loaded code) while it is timed."""

    run_many: Callable[[int], float | None]  # the calls' own seconds where it times them itself, else None
    number: int
    flush: np.ndarray | None
    keep: tuple[Any, ...]
    seconds: float = 0.0  # spent preparing and timing this kernel

    def time_repeat(self, warm_call: bool = False) -> float:
        """One repeat: seconds per call, averaged over `number` calls. `warm_call`: one untimed call first (another
        kernel ran since this one's last call, so its activations are no longer where its previous call left them)."""
        started = time.perf_counter()
        if warm_call:
            self.run_many(1)
        clock = time.perf_counter
        if self.flush is None:
            start = clock()
            spent = self.run_many(self.number)
            cost = (clock() - start if spent is None else spent) / self.number
        else:
            total = 0.0
            for _ in range(self.number):
                self.flush += 1.0  # touch every line of a buffer larger than the caches
                start = clock()
                self.run_many(1)
                total += clock() - start
            cost = total / self.number
        self.seconds += time.perf_counter() - started
        return cost


# a packed argument's kernel and logical input, by argument position (from a `prologue`)
_PackedBy = dict[int, tuple[Callable[..., Any], int]]
_ErrorReply = tuple[str, Any, str]  # ("error", ErrorKind name, message)


@dataclass(frozen=True)
class _Arguments:
    """A kernel's argument buffers, in argument order, and the logical inputs its packed arguments are packed from
    (by argument position)."""

    buffers: list[np.ndarray]
    sources: dict[int, np.ndarray]


def _prepare(artifact: BuildArtifact, function: Callable[..., Any], repeat_entry: Callable[..., Any] | None,
             inputs: list[np.ndarray], expected: list[np.ndarray] | None,
             tolerances: dict[str, tuple[float, float]], timing: TimingOptions,
             prologue: Sequence[tuple[Callable[..., Any], int, int]] = (),
             weights: Sequence[int] = (), copies: WeightCopies | None = None,
             task_key: str = "") -> _Timed | _ErrorReply:
    """Check one artifact's outputs, warm it up and size its repeats (see the module docstring); the error reply
    when it fails. A single run then times its repeats back to back, a batch interleaves them with the other
    kernels' (`_measure_batch`). `prologue`: packing kernels
    (function, logical input, argument position) that fill a packed argument from its logical input; they run
    before the kernel on every call, as in the model, and their time counts. `weights`: the logical inputs that
    are model constants, rotated through copies when `timing.cold_weights_bytes` is set: `copies` keeps them
    across the runs of task `task_key` (None, or `timing.reuse_weight_copies` False: built for this run only)."""
    started = time.perf_counter()
    packed_by: _PackedBy = {position: (packer, index) for packer, index, position in prologue}
    arguments = _argument_buffers(artifact, inputs, packed_by)
    if not isinstance(arguments, _Arguments):
        return arguments
    buffers, sources = arguments.buffers, arguments.sources
    pointers = [b.ctypes.data for b in buffers]
    in_context = timing.in_context and repeat_entry is not None and not packed_by and not timing.flush_cache
    # The producer step's saved copy of the activations is taken before the kernel first runs: the values the check
    # reads are the ones every timed call reads, whatever a kernel does to its inputs.
    step = context_step(artifact, buffers, set(weights), packed_by) if in_context else None
    problem = _check_run(artifact, function(*pointers), buffers, expected, tolerances)
    if problem is not None:
        return problem
    flush = np.zeros(timing.flush_bytes // 8) if timing.flush_cache else None
    packing = [(packer, sources[position].ctypes.data, pointers[position])
               for position, (packer, _) in packed_by.items()]
    # Without reuse the copies are built for this run only, in a store of their own that lives while they are used.
    store = copies if copies is not None and timing.reuse_weight_copies else WeightCopies()
    table = store.argument_table(task_key, artifact, buffers, pointers, set(weights), packed_by,
                                 timing.cold_weights_bytes)
    if copies is not None and store is not copies:
        copies.seconds += store.seconds
    run_many = _calls(function, repeat_entry, pointers, step, packing, table)
    return _Timed(run_many, _calls_per_repeat(run_many, timing), flush, (buffers, table, store, sources),
                  seconds=time.perf_counter() - started)


def _argument_buffers(artifact: BuildArtifact, inputs: list[np.ndarray],
                      packed_by: _PackedBy) -> _Arguments | _ErrorReply:
    """The kernel's argument buffers: inputs in the kernel's layout, packed arguments filled by their packing
    kernels, outputs filled with a sentinel (`_sentinel_fill`), the rest zeros; the error reply when an input does
    not match its argument."""
    buffers: list[np.ndarray] = []
    sources: dict[int, np.ndarray] = {}
    for position, arg in enumerate(artifact.args):
        if position in packed_by:
            packer, index = packed_by[position]
            source = np.array(inputs[index], order="C")  # a copy, 0-d kept 0-d
            sources[position] = source
            buffer = _sentinel_fill(arg.spec)
            packer(source.ctypes.data, buffer.ctypes.data)  # the kernel's check covers the packing too
        elif arg.role == "input":
            buffer = apply_layout(inputs[arg.index].copy(), arg.layout)
            if buffer.shape != arg.spec.shape or str(buffer.dtype) != arg.spec.dtype:
                return ("error", ErrorKind.COMPILE_ERROR.name,
                        f"input {arg.index} after layout is {buffer.shape}/{buffer.dtype}, kernel expects "
                        f"{arg.spec.shape}/{arg.spec.dtype}")
        elif arg.role == "output":
            buffer = _sentinel_fill(arg.spec)
        else:
            buffer = np.zeros(arg.spec.shape, dtype=arg.spec.dtype)
        buffers.append(buffer)
    return _Arguments(buffers, sources)


def _check_run(artifact: BuildArtifact, status: Any, buffers: list[np.ndarray], expected: list[np.ndarray] | None,
               tolerances: dict[str, tuple[float, float]]) -> _ErrorReply | None:
    """The error reply when the kernel's first call returned an error `status` or wrote outputs other than
    `expected` (None: not checked); None when it passes."""
    if artifact.returns_status and status != 0:
        return ("error", ErrorKind.RUNTIME_ERROR.name, f"kernel returned status {status}")
    if expected is None:
        return None
    outputs = [(arg, buffer) for arg, buffer in zip(artifact.args, buffers) if arg.role == "output"]
    covered = {arg.index for arg, _ in outputs}
    if covered != set(range(len(expected))):
        return ("error", ErrorKind.WRONG_RESULT.name,
                f"kernel writes outputs {sorted(covered)}, the reference has {len(expected)}")
    for arg, buffer in outputs:
        problem = compare_outputs(apply_layout(buffer, arg.layout), expected[arg.index], tolerances, arg.index)
        if problem is not None:
            return ("error", ErrorKind.WRONG_RESULT.name, problem)
    return None


def _calls(function: Callable[..., Any], repeat_entry: Callable[..., Any] | None, pointers: list[int],
           step: Production | None, packing: list[tuple[Callable[..., Any], int, int]],
           table: np.ndarray | None) -> Callable[[int], float | None]:
    """`run_many(count)`: `count` calls of the kernel, the way this run times them (see `_Timed`)."""
    if step is not None:
        assert repeat_entry is not None  # `_prepare` times in context only a kernel with a repeat entry
        return _calls_in_context(repeat_entry, pointers, step, table)
    if packing:
        return _calls_with_packing(function, pointers, packing)
    if table is not None:
        return _calls_rotating_weights(function, repeat_entry, table)
    if repeat_entry is not None:
        return _calls_by_repeat_entry(repeat_entry, pointers)
    return _calls_one_by_one(function, pointers)


def _calls_in_context(repeat_entry: Callable[..., Any], pointers: list[int], step: Production,
                      table: np.ndarray | None) -> Callable[[int], float | None]:
    """Calls in the model's context (`relay_tune.runtime.context`): before each call, untimed, every thread of the
    team rewrites its share of the activation inputs, as the kernel before this one in a model has; one native
    loop, timestamps around each kernel call only. Weights rotate through their copies as in
    `_calls_rotating_weights`."""
    loop = context_loop()
    rows = table if table is not None else np.asarray([pointers], dtype=np.uint64)
    cursor = [0]

    def run_many(count: int) -> float | None:
        first = cursor[0]
        cursor[0] = (first + count) % len(rows)
        return loop.run(repeat_entry, rows, first, count, step) * 1e-9
    return run_many


def _calls_with_packing(function: Callable[..., Any], pointers: list[int],
                        packing: list[tuple[Callable[..., Any], int, int]]) -> Callable[[int], float | None]:
    """Calls that each run the packing kernels (kernel, source address, packed address) first, as the model does."""
    def run_many(count: int) -> float | None:
        for _ in range(count):
            for packer, source_address, packed_address in packing:
                packer(source_address, packed_address)
            function(*pointers)
        return None
    return run_many


def _calls_rotating_weights(function: Callable[..., Any], repeat_entry: Callable[..., Any] | None,
                            table: np.ndarray) -> Callable[[int], float | None]:
    """Calls that rotate through the rows of `table`, one row of argument pointers per copy of the weights; the
    repeat entry runs each once (a Python call per kernel call, ~1 us, which only the smallest kernels notice: their
    weights are no bigger than that cost)."""
    first, stride = table.ctypes.data, table.strides[0]
    rows = [first + i * stride for i in range(len(table))]
    cursor = [0]

    def run_many(count: int) -> float | None:
        for _ in range(count):
            row = cursor[0]
            cursor[0] = (row + 1) % len(rows)
            if repeat_entry is not None:
                repeat_entry(rows[row], 1)
            else:
                function(*table[row].tolist())
        return None
    return run_many


def _calls_by_repeat_entry(repeat_entry: Callable[..., Any], pointers: list[int]) -> Callable[[int], float | None]:
    """Calls made by the kernel's repeat entry, all `count` in one native call."""
    packed = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)

    def run_many(count: int) -> float | None:
        repeat_entry(ctypes.addressof(packed), count)
        return None
    return run_many


def _calls_one_by_one(function: Callable[..., Any], pointers: list[int]) -> Callable[[int], float | None]:
    """Calls of the kernel's entry point from Python, one at a time."""
    def run_many(count: int) -> float | None:
        for _ in range(count):
            function(*pointers)
        return None
    return run_many


def _calls_per_repeat(run_many: Callable[[int], float | None], timing: TimingOptions) -> int:
    """The calls per repeat, `timing.number` or more to make a repeat last `timing.min_repeat_ms`, as measured while
    `run_many` warms the kernel up (`timing.warmup` calls, then more for `timing.warmup_ms`)."""
    clock = time.perf_counter
    start = clock()
    run_many(max(1, timing.warmup))
    calls = max(1, timing.warmup)
    per_call = max((clock() - start) / calls, 1e-9)
    if timing.warmup_ms > 0:
        budget = timing.warmup_ms / 1000.0
        while clock() - start < budget:
            batch = max(1, min(10_000_000, math.ceil((budget - (clock() - start)) / per_call)))
            run_many(batch)
            calls += batch
        # the later calls ran warm: they, not the first, say how many calls a repeat needs
        per_call = max((clock() - start) / calls, 1e-9)
    number = timing.number
    if timing.min_repeat_ms > 0:
        number = max(number, min(10_000_000, math.ceil(timing.min_repeat_ms / 1000.0 / per_call)))
    return number


def _weight_positions(artifact: BuildArtifact, weights: set[int], packed_by: Mapping[int, Any]) -> list[int]:
    """Argument positions of the weight inputs that rotate (a weight packed by a prologue kernel does not)."""
    return [p for p, arg in enumerate(artifact.args)
            if arg.role == "input" and arg.index in weights and p not in packed_by]


def _produced_positions(artifact: BuildArtifact, weights: set[int], packed_by: Mapping[int, Any]) -> list[int]:
    """Argument positions of the activation inputs, which a producer kernel writes in a model (not the weights,
    model constants, nor an argument a prologue kernel packs)."""
    return [p for p, arg in enumerate(artifact.args)
            if arg.role == "input" and arg.index not in weights and p not in packed_by]


# The producer step's split: the contiguous share that thread t of the kernel would read is written by thread t + 1
# (see `context_step`).
PRODUCER_SHIFT = 1


# What the producer step does with a kernel's outputs: "flushed", every line evicted from every cache (clflush);
# "private", pushed out of the cores' private caches only (each thread reads `PRIVATE_EVICT_FACTOR` times its private
# cache of scratch), so that they sit in the shared cache, as arena memory a few kernels used last does in a model;
# "half_flushed", the first half of each output flushed, then the private caches emptied. experiments/README.md
# compares them (see `context_step`). "private": over six runs on ResNet-50 it had the smaller error on memory-bound
# kernels in all six (0.21-0.26 against 0.29-0.46 on a normal host) and placed more tasks within 15% of the graph in
# five (the sixth lost by one task to a noise spike on one convolution); flushing sent the outputs to memory and timed
# the large Winograd transforms at 0.49-0.73 of their time in the model. It is also the cheaper step.
OutputContext = Literal["flushed", "private", "half_flushed"]
OUTPUT_CONTEXT: OutputContext = "private"
PRIVATE_EVICT_FACTOR = 2


def context_step(artifact: BuildArtifact, buffers: Sequence[np.ndarray], weights: set[int],
                 packed_by: Mapping[int, Any], outputs_in: OutputContext = OUTPUT_CONTEXT) -> Production:
    """The producer step a kernel is timed after (`relay_tune.runtime.context`): its activation inputs rewritten by the
    thread team, the share that thread t of a kernel split into contiguous shares reads written by thread t + 1
    (`PRODUCER_SHIFT`), and its outputs put out of the kernel's reach (`outputs_in`, below). Measured against the
    model's profile (experiments/README.md, ResNet-50): a consumer split like its producer read every line
    from its own core's cache and ran up to 2x faster than in the model (global pooling 3.0 against 5.4 us); with
    the shares shifted it matched (5.1). And in a model a kernel's output buffer is arena memory that other kernels
    used long before, pushed out since by the weights streamed in between: with its lines left in cache by its
    previous call, the Winograd transforms ran 1.4-3x faster than in the graph, with them evicted within 0.77-1.2x
    of it. `outputs_in` chooses how the outputs are put out of reach (`OutputContext`): flushed to memory, or only
    out of the cores' private caches (a few kernels of a model since, the arena's lines sit in the shared cache: the
    three Winograd transforms with the largest outputs were timed at 0.52-1.16 of their in-graph time, 11 of 12
    ratios from 0.70 up, against 0.49-0.73 flushed; four runs,
    experiments/results/context_timing_resnet50_outputs_run3-6)."""
    produced = _produced_positions(artifact, weights, packed_by)
    activations = [buffers[p] for p in produced]
    outputs = [buffers[p].reshape(-1) for p, arg in enumerate(artifact.args) if arg.role == "output"]
    if outputs_in == "flushed":
        return production(activations, shift=PRODUCER_SHIFT, evicted=outputs)
    aged = PRIVATE_EVICT_FACTOR * private_cache_bytes()
    evicted = [o[:o.size // 2] for o in outputs] if outputs_in == "half_flushed" else []
    return production(activations, shift=PRODUCER_SHIFT, evicted=evicted, private_evict=aged)


def _copy_count(weight_bytes: int, cold_bytes: int) -> int:
    return max(2, min(MAX_WEIGHT_COPIES, math.ceil(cold_bytes / weight_bytes)))


WEIGHT_COPY_SETS = 4  # layouts of one task's weights whose copies a worker keeps (LRU), within the byte bound


_COPY_ALIGN = 64  # bytes: every copy of a weight starts on a cache line, as numpy's own buffers of that size do


@dataclass
class _CopySet:
    """`count` copies of some weight arguments in one block: row i holds copy i of each, at `offsets`."""

    block: np.ndarray  # uint8, `_COPY_ALIGN` bytes longer than the rows, so that they can start aligned
    rows: np.ndarray  # (count, row bytes) view of the block
    offsets: list[int]
    sizes: list[int]
    addresses: np.ndarray  # (count, arguments) uint64: where each copy of each argument starts


class WeightCopies:
    """The copies of a task's weight arguments that a measurement worker rotates through, kept across configs.

    Building `cold_bytes` of copies cost 10-80 ms per measurement (64 MiB copied into fresh pages, and thousands
    of arrays when the weights are small), and the copies of two configs of a task are the same bytes when their
    weight arguments are laid out alike. So copies are keyed by task and by each rotated argument's position and
    `KernelArg` (shape, dtype, layout): a config whose kernel reads packed weights in another layout gets copies
    in that layout, and a config with the same layout reuses them without copying anything. At most
    `WEIGHT_COPY_SETS` layouts of the current task are kept, and at most `limit_factor` x `cold_bytes` in all; a
    set pushed out, and the sets of the previous task, leave their blocks as spares (within the same bound), and a
    new set is copied into a spare block large enough: a copy into pages already mapped, 5-10 ms for 64 MiB, where
    a fresh block first took its page faults (100+ ms). The copies of a set lie in one block, filled by
    whole-array copies (no Python work per copy); their pages are written when built, so a timed call never takes
    their first-touch faults."""

    def __init__(self, limit_factor: int = 4) -> None:
        self.limit_factor = limit_factor
        self._task: str | None = None
        self._sets: OrderedDict[tuple[Any, ...], _CopySet] = OrderedDict()
        self._spare: list[np.ndarray] = []  # blocks of sets pushed out, to copy new sets into
        self.built = 0  # copy sets filled since the worker started (the runner's tests count them) ...
        self.refilled = 0  # ... of which in the pages of a set pushed out
        self.reused = 0
        self.seconds = 0.0  # spent making copies and argument tables, reused or not (the per-run path too)
        self._pinned: list[np.ndarray] | None = None  # blocks a batch's prepared kernels point into (`pinned`)

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """While a batch of kernels is prepared and timed, every block an argument table hands out stays alive and
        is never refilled with other copies (a later config of the batch may push its set out of the store): the
        kernels prepared earlier still read their weights from it."""
        self._pinned = []
        try:
            yield
        finally:
            self._pinned = None

    @property
    def held_bytes(self) -> int:
        return sum(entry.block.nbytes for entry in self._sets.values()) + sum(b.nbytes for b in self._spare)

    def argument_table(self, task_key: str, artifact: BuildArtifact, buffers: Sequence[np.ndarray],
                       pointers: Sequence[int], weights: set[int], packed_by: Mapping[int, Any],
                       cold_bytes: int) -> np.ndarray | None:
        """The argument pointers for each copy of the weight arguments, one row per copy (uint64, C order: a row
        is the `void **args` of the kernel's repeat entry); None: no rotation. `buffers` are the artifact's
        checked arguments (C-contiguous), the weights among them in the kernel's layout; `pointers` theirs."""
        positions = _weight_positions(artifact, weights, packed_by)
        weight_bytes = sum(buffers[p].nbytes for p in positions)
        if cold_bytes <= 0 or not positions or weight_bytes == 0:
            return None
        started = time.perf_counter()
        if task_key != self._task:
            self._spare += [entry.block for entry in self._sets.values()]  # a new task: the last one's blocks
            self._sets.clear()
            self._task = task_key
        sources = [np.ascontiguousarray(buffers[p]).reshape(-1).view(np.uint8) for p in positions]
        key = (cold_bytes, *((p, artifact.args[p]) for p in positions))
        entry = self._sets.get(key)
        # The key says the copies hold these bytes; checking one copy against the checked buffers (as cheap as one
        # weight read) keeps a kernel from being timed on weights other than the ones its outputs were checked
        # with, should a layout ever produce other values under an equal key.
        if entry is not None and entry.sizes == [s.nbytes for s in sources] and all(
                np.array_equal(entry.rows[0, o:o + s.nbytes], s) for o, s in zip(entry.offsets, sources)):
            self._sets.move_to_end(key)
            self.reused += 1
        else:
            if entry is not None:
                self._spare.append(self._sets.pop(key).block)
            entry = self._fill(key, sources, _copy_count(weight_bytes, cold_bytes), cold_bytes)
        if self._pinned is not None:
            self._pinned.append(entry.block)
        table = np.empty((len(entry.addresses), len(pointers)), dtype=np.uint64)
        table[:] = np.asarray(pointers, dtype=np.uint64)
        table[:, positions] = entry.addresses
        self.seconds += time.perf_counter() - started
        return table

    def _fill(self, key: tuple[Any, ...], sources: list[np.ndarray], count: int, cold_bytes: int) -> _CopySet:
        sizes = [s.nbytes for s in sources]
        offsets: list[int] = []
        row = 0
        for size in sizes:
            offsets.append(row)
            row += -(-size // _COPY_ALIGN) * _COPY_ALIGN
        length = count * row + _COPY_ALIGN
        while len(self._sets) >= WEIGHT_COPY_SETS:
            self._spare.append(self._sets.popitem(last=False)[1].block)
        pinned = {id(b) for b in self._pinned or ()}
        fitting = [b for b in self._spare if b.nbytes >= length and id(b) not in pinned]
        block = min(fitting, key=lambda b: b.nbytes) if fitting else None
        if block is not None:
            self._spare = [b for b in self._spare if b is not block]
            self.refilled += 1
        # Within the bound: spare blocks go first (largest first), then the least recently used sets.
        limit = self.limit_factor * max(cold_bytes, length)
        self._spare.sort(key=lambda b: b.nbytes)
        while (self._spare or self._sets) and self.held_bytes + (0 if block is not None else length) > limit:
            if self._spare:
                self._spare.pop()
            else:
                self._sets.popitem(last=False)
        if block is None:
            # Huge pages, as the model's constants have (`relay_tune.runtime.pages`): on small pages streaming
            # the copies also paid for address translation, which the model does not.
            block = huge_page_empty(length)
        base = block.__array_interface__["data"][0]
        skip = -base % _COPY_ALIGN
        rows = block[skip:skip + count * row].reshape(count, row)
        for offset, source in zip(offsets, sources):
            rows[:, offset:offset + source.nbytes] = source  # every copy at once
        addresses = (np.uint64(base + skip) + np.arange(count, dtype=np.uint64)[:, None] * np.uint64(row)
                     + np.asarray(offsets, dtype=np.uint64)[None, :])
        entry = _CopySet(block, rows, offsets, sizes, addresses)
        self._sets[key] = entry
        self.built += 1
        return entry

    def clear(self) -> None:
        self._sets.clear()
        self._spare.clear()
        self._task = None


def _error_reply(kind: ErrorKind, err: BaseException) -> tuple[str, Any, str]:
    return ("error", kind.name, "".join(traceback.format_exception_only(type(err), err)).strip())


def _load_and_prepare(artifact: BuildArtifact, timing: TimingOptions, task_data: tuple[Any, ...],
                      loader: KernelLoader, copies: WeightCopies, task_key: str) -> _Timed | tuple[str, Any, str]:
    """Load an artifact into the worker and `_prepare` it (checked, warmed up, sized); the error reply when either
    fails. `task_data`: the task's (inputs, expected outputs, tolerances, weight inputs)."""
    inputs, expected, tolerances, weights = task_data
    try:
        function, repeat_entry = loader.load(artifact)
    except Exception as err:
        return ("error", ErrorKind.COMPILE_ERROR.name, f"failed to load the kernel: {err}")
    try:
        return _prepare(artifact, function, repeat_entry, inputs, expected, tolerances, timing, loader.prologue,
                        weights, copies, task_key)
    except Exception as err:
        return _error_reply(ErrorKind.RUNTIME_ERROR, err)


def _measure_batch(conn: multiprocessing.connection.Connection, artifacts: Sequence[BuildArtifact],
                   timing: TimingOptions, task_data: tuple[Any, ...], loader: KernelLoader, copies: WeightCopies,
                   task_key: str) -> list[tuple[str, Any, str, float]]:
    """The worker's side of `LocalRunner.run_batch`: check and size every artifact, then `timing.repeat` rounds
    that time each once. Before each step it reports ("step", index), so that the driver knows which kernel
    crashed or hung."""
    replies: list[tuple[str, Any, str]] = [("error", ErrorKind.RUNTIME_ERROR.name, "not measured")] * len(artifacts)
    prepared: dict[int, _Timed] = {}
    costs: dict[int, list[float]] = {}
    with copies.pinned():
        for index, artifact in enumerate(artifacts):
            conn.send(("step", index))
            result = _load_and_prepare(artifact, timing, task_data, loader, copies, task_key)
            if isinstance(result, _Timed):
                prepared[index], costs[index] = result, []
            else:
                replies[index] = result
        for _ in range(timing.repeat):
            for index, timed in prepared.items():
                conn.send(("step", index))
                # another kernel ran since this one's last call: one untimed call puts its data back in place
                costs[index].append(timed.time_repeat(warm_call=True))
    for index in prepared:
        replies[index] = ("ok", costs[index], "")
    return [(*reply, prepared[i].seconds if i in prepared else 0.0) for i, reply in enumerate(replies)]


def model_thread_team(environ: MutableMapping[str, str]) -> None:
    """Give the thread team the settings it has in a model's process (`relay_tune.codegen.jit.load_libgomp`; the
    native team reads the same spin count); call before libgomp is loaded (it reads them once). With libgomp's own
    default its workers spin some hundred times longer between parallel regions than in a model, so the runner timed
    kernels under other conditions than the ones they run in. A user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY applies
    to both alike."""
    if "GOMP_SPINCOUNT" not in environ and "OMP_WAIT_POLICY" not in environ:
        environ["GOMP_SPINCOUNT"] = str(DEFAULT_GOMP_SPINCOUNT)


def worker_main(conn: multiprocessing.connection.Connection) -> None:
    """Entry point of the measurement worker process."""
    ignore_interrupts()
    die_with_parent()
    model_thread_team(os.environ)
    loader = KernelLoader()
    copies = WeightCopies()
    data: OrderedDict[str, tuple[list[np.ndarray], list[np.ndarray] | None, dict[str, tuple[float, float]]]]
    data = OrderedDict()
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the driver went away
        kind = message[0]
        if kind == "load":
            _, key, inputs, expected, tolerances, weights = message
            data[key] = (inputs, expected, tolerances, weights)
            while len(data) > _WORKER_TASKS:
                data.popitem(last=False)
            continue
        if kind == "stats":
            conn.send(("stats", {"copy_sets_built": copies.built, "copy_sets_refilled": copies.refilled,
                                 "copy_sets_reused": copies.reused, "copy_bytes": copies.held_bytes,
                                 "copy_seconds": copies.seconds}))
            continue
        if kind == "run_batch":
            _, key, artifacts, timing = message
            try:
                replies = _measure_batch(conn, artifacts, timing, data[key], loader, copies, key)
            except Exception as err:  # e.g. the task's data is missing; a kernel's failure is its own reply
                replies = [(*_error_reply(ErrorKind.RUNTIME_ERROR, err), 0.0)] * len(artifacts)
            finally:
                loader.release()
            try:
                conn.send(("batch", replies))
            except (BrokenPipeError, OSError):
                return
            continue
        if kind != "run":
            conn.send(("error", ErrorKind.RUNTIME_ERROR.name, f"unknown message {kind!r}"))
            continue
        _, key, artifact, timing = message
        try:
            prepared = _load_and_prepare(artifact, timing, data[key], loader, copies, key)
            # one kernel: its repeats back to back
            reply = (("ok", [prepared.time_repeat() for _ in range(timing.repeat)], "")
                     if isinstance(prepared, _Timed) else prepared)
        except Exception as err:  # e.g. the task's data is missing
            reply = _error_reply(ErrorKind.RUNTIME_ERROR, err)
        finally:
            loader.release()
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
