"""Loading compiled kernels into this process, calling them, and timing them.

`load_object` links an object file produced by `relay_tune.codegen.llvm.compile_object` into this
process with LLVM's ORC JIT. Its undefined symbols resolve against the process (libm, libc) and, for
parallel loops, the three OpenMP entry points the generated code uses, from one of the threading runtimes
(`THREADING_RUNTIMES`):

- "native": `relay_tune.codegen.thread_team`, a thread team generated here that revokes the parts of a region no
  thread has started (the caller runs them) instead of waiting for descheduled threads, as libgomp does;
- "openmp": libgomp;
- "python": a thread team written in Python (tens of microseconds per parallel region instead of about one);
- "auto": the RELAY_TUNE_THREADING environment variable's choice when set, else "native" where this host can run
  it, else libgomp, else the Python team (with a warning).

    lib = load_object(obj, [KernelSignature.from_primfunc(f) for f in funcs])
    kernel = lib.get("dense")
    kernel(a, b, out)                        # checks dtypes, shapes, contiguity; then calls
    kernel.raw(a_addr, b_addr, out_addr)     # hot path: addresses taken once
    costs = time_kernel(kernel, [a, b, out], number=10, repeat=5)

Calls go through ctypes, which releases the GIL while the kernel runs.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import itertools
import math
import os
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from relay_tune.codegen.thread_team import (
    MAX_TEAM,
    NativeThreadTeam,
    native_team_supported,
    spin_count_from_environment,
)
from relay_tune.errors import CompileError, RelayTuneError
from relay_tune.kernel import tir
from relay_tune.kernel.analysis import iter_stmts

REPEAT_SUFFIX = "__repeat"
THREADING_RUNTIMES = ("auto", "native", "openmp", "python")
THREADING_ENV = "RELAY_TUNE_THREADING"  # what "auto" means: native, openmp or python
_OPENMP_SYMBOLS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")


class KernelArgumentError(RelayTuneError):
    """Arrays passed to a kernel do not match its parameters."""


# ---------------------------------------------------------------------------------------------------
# signatures
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """One kernel parameter: a dense row-major buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    written: bool  # the kernel stores into it (the array must be writeable)


@dataclass(frozen=True)
class KernelSignature:
    """What a caller must pass to a kernel; plain data, so it can travel between processes.

    `params` is None for a kernel known only by name: it is then called without argument checks.
    `align` is the byte alignment the code assumes for every parameter (0: only the element's own).
    """

    name: str
    params: tuple[ParamSpec, ...] | None = None
    align: int = 0

    @staticmethod
    def from_primfunc(func: tir.PrimFunc) -> KernelSignature:
        written = _stored_buffers(func.body)
        params = tuple(ParamSpec(p.name, p.shape, p.dtype, p in written) for p in func.params)
        align = func.param_align
        return KernelSignature(func.name, params, align)


def _stored_buffers(stmt: tir.Stmt) -> set[tir.Buffer]:
    return {node.buffer for node in iter_stmts(stmt) if isinstance(node, tir.Store)}


# ---------------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------------


class Kernel:
    """A compiled kernel in this process. Keeps its library (and so its machine code) alive."""

    def __init__(self, signature: KernelSignature, address: int, repeat_address: int, library: Any) -> None:
        self.signature = signature
        self.name = signature.name
        self.address = address
        self._library = library
        nparams = len(signature.params) if signature.params is not None else None
        self._nparams = nparams
        self._fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (nparams or 0)))(address) if nparams is not None \
            else None
        self._repeat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(repeat_address)

    def __repr__(self) -> str:
        return f"Kernel({self.name})"

    @property
    def entry(self) -> Any:
        """The callable that takes the parameters' data addresses, with no checks (the fastest way in; ctypes
        releases the GIL while the kernel runs)."""
        return self._fn if self._fn is not None else self._call_unchecked_varargs

    def _call_unchecked_varargs(self, *addresses: int) -> None:
        self._call_unchecked(addresses)

    def addresses(self, arrays: Sequence[np.ndarray]) -> list[int]:
        """Check `arrays` against the parameters and return their data addresses."""
        params = self.signature.params
        if params is None:
            return [_address_of(a) for a in arrays]
        if len(arrays) != len(params):
            raise KernelArgumentError(f"kernel {self.name} takes {len(params)} arrays, got {len(arrays)}")
        result = []
        align = self.signature.align
        for array, param in zip(arrays, params):
            where = f"kernel {self.name}, parameter {param.name}"
            if not isinstance(array, np.ndarray):
                raise KernelArgumentError(f"{where}: expected a numpy array, got {type(array).__name__}")
            if array.dtype != np.dtype(param.dtype):
                raise KernelArgumentError(f"{where}: expected dtype {param.dtype}, got {array.dtype}")
            if array.shape != param.shape:
                raise KernelArgumentError(f"{where}: expected shape {param.shape}, got {array.shape}")
            if not array.flags.c_contiguous:
                raise KernelArgumentError(f"{where}: the array must be C-contiguous")
            if param.written and not array.flags.writeable:
                raise KernelArgumentError(f"{where}: the kernel writes this array but it is read-only")
            address = array.ctypes.data
            if align > 1 and address % align:
                raise KernelArgumentError(
                    f"{where}: the kernel assumes {align}-byte aligned data (allocate with aligned_empty)"
                )
            result.append(address)
        return result

    def __call__(self, *arrays: np.ndarray) -> None:
        self.raw(*self.addresses(arrays))

    def raw(self, *addresses: int) -> None:
        """Call with data addresses, no checks (the caller guarantees them)."""
        if self._fn is None or len(addresses) != self._nparams:
            self._call_unchecked(addresses)
            return
        self._fn(*addresses)

    def _call_unchecked(self, addresses: Sequence[int]) -> None:
        fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(addresses)))(self.address)
        fn(*addresses)

    def pack(self, arrays: Sequence[np.ndarray]) -> ctypes.Array[ctypes.c_void_p]:
        """The `void*` argument vector the repeat entry point takes (checked once, reused for every call). It keeps
        `arrays` alive as long as it lives: it holds their addresses, and a vector kept beyond the arrays (a timing
        closure that captured only it) once had kernels writing into freed heap memory, which glibc reported at
        exit ("munmap_chunk(): invalid pointer")."""
        addresses = self.addresses(arrays)
        packed = (ctypes.c_void_p * max(1, len(addresses)))(*addresses)
        packed.arrays = tuple(arrays)  # type: ignore[attr-defined]  # ctypes instances take attributes
        return packed

    def repeat(self, packed: ctypes.Array[ctypes.c_void_p], number: int) -> None:
        """Run the kernel `number` times back to back inside generated code (no Python in between)."""
        self._repeat(ctypes.addressof(packed), number)


def _address_of(array: np.ndarray) -> int:
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        raise KernelArgumentError("kernel arguments must be C-contiguous numpy arrays")
    return array.ctypes.data


class KernelLibrary:
    """The kernels of one loaded object file."""

    def __init__(self, name: str, tracker: Any, signatures: Iterable[KernelSignature], team: Any = None) -> None:
        self.name = name
        self._tracker = tracker  # keeps the JIT-linked code mapped
        self._team = team  # keeps the thread team (and the Python team's callbacks) alive
        self._kernels = {
            s.name: Kernel(s, tracker[s.name], tracker[s.name + REPEAT_SUFFIX], self) for s in signatures
        }
        _live_libraries.add(self)

    @property
    def names(self) -> list[str]:
        return list(self._kernels)

    @property
    def team(self) -> Any:
        """The thread team this library's parallel kernels run on (None: no parallel kernel, or libgomp's)."""
        return self._team

    def detach(self) -> None:
        """Never free this library's machine code (the process keeps it until it ends)."""
        self._tracker.detach()

    def get(self, name: str) -> Kernel:
        kernel = self._kernels.get(name)
        if kernel is None:
            raise RelayTuneError(f"no kernel named {name!r} in this library (it has: {', '.join(self._kernels)})")
        return kernel

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._kernels

    def __repr__(self) -> str:
        return f"KernelLibrary({self.name}: {', '.join(self._kernels)})"


# ---------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------

_jit_lock = threading.Lock()
_jit: Any = None
_live_libraries: weakref.WeakSet[KernelLibrary] = weakref.WeakSet()
_library_ids = itertools.count()
_libgomp: ctypes.CDLL | None = None
_libgomp_tried = False

# How long libgomp's idle threads spin before they sleep, in its spin iterations (a `pause` each). Both the idle
# workers between parallel regions and the first thread at a region's closing barrier spin this long. On an idle
# host a short spin lets the next parallel region start without a futex wake-up: with 0 (sleep at once), the eight
# zoo CNNs took 1.14x onnxruntime's time in geometric mean against 0.85x with 10,000 (`experiments/ab` runs of
# `python -m experiments models`, 2026-12-07). On a host with more runnable threads than cores any spin of a few
# thousand iterations up makes each region cost about a scheduler time slice instead (a 1 ms classifier took 70 ms
# with 10,000, 6.8 ms with 0: `python -m experiments spin-policy`); the idle host is what latency is measured and
# deployed on. Used only when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set, and only if this process had not
# loaded libgomp already (it reads them at start-up): `GOMP_SPINCOUNT=0` suits a shared, oversubscribed host.
DEFAULT_GOMP_SPINCOUNT = 10_000
_fallback_warned = False


def _lljit() -> Any:
    global _jit
    if _jit is None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        # LLVM lowers some operations to calls into the compiler's runtime library (float16 conversions:
        # __truncdfhf2, __extendhfsf2 ...), which the JIT resolves among the symbols the process has loaded
        # globally. Python has libgcc_s loaded only on some paths, so a model with float16 casts loaded in a fresh
        # process failed with "Symbols not found"; make it resolvable for every process.
        for name in ("libgcc_s.so.1", ctypes.util.find_library("gcc_s")):
            if name:
                try:
                    llvm.load_library_permanently(name)
                    break
                except RuntimeError:
                    continue
        _jit = llvm.create_lljit_compiler()
        atexit.register(_keep_code_at_exit)
    return _jit


def _keep_code_at_exit() -> None:
    """At exit (before interpreter teardown): end the native team's workers, then detach the JIT and every loaded
    library from their Python objects, so that teardown frees no machine code. A thread still inside a kernel when
    the process exits (a daemon thread, or one the interpreter has not joined yet) keeps running mapped code until
    the process ends, and no library is disposed after its JIT, whatever order teardown collects them in."""
    if _native_team is not None:
        _native_team.close()
    with _jit_lock:
        for library in list(_live_libraries):
            library.detach()
        if _jit is not None:
            _jit.detach()


def load_libgomp() -> ctypes.CDLL | None:
    """Load libgomp with its symbols visible to JIT-linked code; None when it is not installed."""
    global _libgomp, _libgomp_tried
    if not _libgomp_tried:
        _libgomp_tried = True
        if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
            os.environ["GOMP_SPINCOUNT"] = str(DEFAULT_GOMP_SPINCOUNT)
        for name in ("libgomp.so.1", ctypes.util.find_library("gomp")):
            if not name:
                continue
            try:
                _libgomp = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError:
                continue
    return _libgomp


class PythonThreadTeam:
    """Stands in for libgomp: `GOMP_parallel` runs the outlined body on a pool of Python threads.

    Each thread calls the body through ctypes, which releases the GIL, so the threads really run in
    parallel; only the dispatch (tens of microseconds) holds the GIL.
    """

    def __init__(self, max_threads: int | None = None) -> None:
        self.max_threads = max_threads or len(os.sched_getaffinity(0))
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self.regions = 0  # parallel regions run so far (for diagnostics)
        self._lock = threading.Lock()
        self._body_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        self._parallel_cb = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)(
            self._parallel
        )
        self._thread_num_cb = ctypes.CFUNCTYPE(ctypes.c_int)(self._thread_num)
        self._num_threads_cb = ctypes.CFUNCTYPE(ctypes.c_int)(self._num_threads)

    def symbols(self) -> dict[str, int]:
        return {
            "GOMP_parallel": _callback_address(self._parallel_cb),
            "omp_get_thread_num": _callback_address(self._thread_num_cb),
            "omp_get_num_threads": _callback_address(self._num_threads_cb),
        }

    def _parallel(self, fn: int, data: int, num_threads: int, flags: int) -> None:
        team = min(num_threads or self.max_threads, self.max_threads)
        body = self._body_type(fn)
        self.regions += 1

        def run(thread: int) -> None:
            self._local.thread, self._local.team = thread, team
            try:
                body(data)
            finally:
                self._local.thread, self._local.team = 0, 1

        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=max(1, self.max_threads - 1),
                                                thread_name_prefix="relay_tune_team")
            pool = self._pool
        helpers = [pool.submit(run, t) for t in range(1, team)]
        run(0)
        for helper in helpers:
            helper.result()

    def _thread_num(self) -> int:
        return getattr(self._local, "thread", 0)

    def _num_threads(self) -> int:
        return getattr(self._local, "team", 1)


def _callback_address(callback: Any) -> int:
    address = ctypes.cast(callback, ctypes.c_void_p).value
    assert address is not None
    return address


_python_team: PythonThreadTeam | None = None
_native_team: NativeThreadTeam | None = None
_native_lock = threading.Lock()
ThreadTeam = PythonThreadTeam | NativeThreadTeam


def resolve_threading_runtime(runtime: str) -> str:
    """The runtime `runtime` names: "auto" becomes RELAY_TUNE_THREADING's choice, else the native team where this
    host can run it, else libgomp, else the Python team (with a warning).

    The native team is the default because a region never waits for a thread that has not started its part: on a
    host with more runnable threads than cores, libgomp's regions wait for a descheduled thread (a scheduler time
    slice), so the same build measures very differently from one process or minute to the next (Silero VAD
    0.20-0.69 ms per step on libgomp in separate idle runs against 0.12 ms on the native team; 7.7 against
    0.13 ms in the same rounds on a loaded host, `python -m experiments trained --runtimes openmp,native`); on an
    idle host whole networks measured the same on both (`python -m experiments thread-team`)."""
    global _fallback_warned
    if runtime not in THREADING_RUNTIMES:
        raise RelayTuneError(
            f"unknown threading runtime {runtime!r}; expected one of {', '.join(THREADING_RUNTIMES)}"
        )
    if runtime != "auto":
        return runtime
    chosen = os.environ.get(THREADING_ENV, "").strip().lower()
    if chosen:
        if chosen not in THREADING_RUNTIMES or chosen == "auto":
            raise RelayTuneError(f"{THREADING_ENV}={chosen!r}: expected one of native, openmp, python")
        return chosen
    if native_team_supported():
        return "native"
    if load_libgomp() is not None:
        return "openmp"
    if not _fallback_warned:
        _fallback_warned = True
        warnings.warn("neither the native thread team nor libgomp is available: parallel loops run on a Python "
                      "thread team (slower dispatch)", RuntimeWarning, stacklevel=4)
    return "python"


def _threading_symbols(runtime: str) -> tuple[dict[str, int], ThreadTeam | None]:
    """Symbols to define for the parallel runtime: none for libgomp (the process provides them), the team's
    otherwise."""
    resolved = resolve_threading_runtime(runtime)
    if resolved == "openmp":
        if load_libgomp() is None:
            raise RelayTuneError("the OpenMP runtime (libgomp.so.1) cannot be loaded; install libgomp1 or use "
                                 "threading_runtime='native' or 'python'")
        return {}, None
    team: ThreadTeam = native_thread_team() if resolved == "native" else python_thread_team()
    return team.symbols(), team


def threading_imports(obj: bytes, runtime: str = "auto") -> tuple[dict[str, int], ThreadTeam | None]:
    """The OpenMP entry points to import when JIT-linking `obj` on `runtime` (none where it has no parallel loop or
    the runtime is libgomp, whose symbols the process provides), and the team that must outlive the code."""
    # Only objects with outlined parallel loops reference the OpenMP entry points (NUL-delimited in the
    # object's string table).
    if b"\x00GOMP_parallel\x00" not in obj:
        return {}, None
    return _threading_symbols(runtime)


def native_thread_team() -> NativeThreadTeam:
    """The process-wide native thread team, started on first use with as many threads as libgomp's default team
    (OMP_NUM_THREADS where set, else the CPUs this process may run on); its workers spin as libgomp's do
    (`DEFAULT_GOMP_SPINCOUNT`, or GOMP_SPINCOUNT / OMP_WAIT_POLICY)."""
    global _native_team
    with _native_lock:
        if _native_team is None:
            _native_team = NativeThreadTeam()
        if not _native_team.started and not _native_team.closed:
            wanted = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
            threads = int(wanted) if wanted.isdigit() and int(wanted) > 0 else len(os.sched_getaffinity(0))
            threads = min(threads, MAX_TEAM)
            _native_team.start(threads, spin_count_from_environment(DEFAULT_GOMP_SPINCOUNT))
        return _native_team


def python_thread_team() -> PythonThreadTeam:
    """The process-wide stand-in thread team used when kernels cannot use libgomp."""
    global _python_team
    if _python_team is None:
        _python_team = PythonThreadTeam()
    return _python_team


def load_object(
    obj: bytes,
    kernels: Sequence[KernelSignature | tir.PrimFunc | str],
    threading_runtime: str = "auto",
) -> KernelLibrary:
    """JIT-link an object file from `compile_object` into this process and look up its kernels.

    kernels: the kernels to expose, as signatures (argument checks), PrimFuncs, or bare names.
    threading_runtime: "native" (the native thread team), "openmp" (libgomp, required), "python" (the Python
        thread team), or "auto" (see `resolve_threading_runtime`).
    """
    signatures = [_as_signature(k) for k in kernels]
    resolve_threading_runtime(threading_runtime)  # an unknown name is an error even for serial kernels
    imports, team = threading_imports(obj, threading_runtime)
    with _jit_lock:
        jit = _lljit()
        name = f"relay_tune_kernels_{os.getpid()}_{next(_library_ids)}"
        builder = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process()
        for symbol, address in imports.items():
            builder.import_symbol(symbol, address)
        for signature in signatures:
            builder.export_symbol(signature.name)
            builder.export_symbol(signature.name + REPEAT_SUFFIX)
        try:
            tracker = builder.link(jit, name)
        except RuntimeError as err:
            names = ", ".join(s.name for s in signatures)
            raise CompileError(f"cannot load the compiled kernels ({names}): {err}") from err
    return KernelLibrary(name, tracker, signatures, team)


def _as_signature(kernel: KernelSignature | tir.PrimFunc | str) -> KernelSignature:
    if isinstance(kernel, KernelSignature):
        return kernel
    if isinstance(kernel, tir.PrimFunc):
        return KernelSignature.from_primfunc(kernel)
    if isinstance(kernel, str):
        return KernelSignature(kernel)
    raise TypeError(f"expected a KernelSignature, PrimFunc or name, got {type(kernel).__name__}")


# ---------------------------------------------------------------------------------------------------
# timing and memory
# ---------------------------------------------------------------------------------------------------


def time_kernel(
    kernel: Kernel,
    arrays: Sequence[np.ndarray],
    number: int = 1,
    repeat: int = 3,
    min_repeat_ms: float = 0.0,
) -> list[float]:
    """Seconds per call, one value per repeat. Each repeat runs the kernel `number` times back to back.

    With `min_repeat_ms`, `number` grows (after one warm-up call) until a repeat lasts at least that
    long, so that very fast kernels are not dominated by timer resolution.
    """
    if number < 1 or repeat < 1:
        raise RelayTuneError("time_kernel needs number >= 1 and repeat >= 1")
    packed = kernel.pack(arrays)
    kernel.repeat(packed, 1)  # warm-up: page faults, instruction cache, thread team start-up

    def run(n: int) -> float:
        start = time.perf_counter()
        kernel.repeat(packed, n)
        return time.perf_counter() - start

    if min_repeat_ms > 0:
        target = min_repeat_ms / 1000.0
        while True:
            elapsed = run(number)
            if elapsed >= target:
                break
            # Aim a little past the target, but never grow more than 10x per step (timings are noisy).
            wanted = number * target / max(elapsed, 1e-9) * 1.1
            number = max(number + 1, min(math.ceil(wanted), number * 10))
    return [run(number) / number for _ in range(repeat)]


def aligned_empty(shape: Sequence[int] | int, dtype: str | np.dtype[Any] = "float32", align: int = 64) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an `align`-byte boundary."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize  # math.prod: np.prod costs microseconds (models call this per run)
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.__array_interface__["data"][0]) % align
    return raw[start : start + nbytes].view(dtype).reshape(shape)
