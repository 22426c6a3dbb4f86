"""Processes that run parallel kernels exit cleanly: with the native team's workers idle or busy, without an explicit
shutdown, while another thread (daemon or not) is still inside a region, with libgomp and the native team both
loaded, after a library was collected, and after the arrays a packed argument vector points at went out of scope.

Each scenario runs in many short processes that leave through the interpreter's normal finalization (forked from a
driver that compiled the kernel once, and a few started fresh); every one must exit with status 0. Before packed
argument vectors kept their arrays alive, a thread still timing a kernel through one wrote into freed heap memory
and glibc aborted the process at exit ("munmap_chunk(): invalid pointer", "malloc(): unsorted double linked list
corrupted")."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

from relay_tune.codegen.jit import load_libgomp, load_object
from relay_tune.codegen.llvm import compile_object
from relay_tune.codegen.thread_team import native_team_supported
from relay_tune.kernel.tir import Buffer, For, ForKind, LoopVar, PrimFunc, Store
from relay_tune.target import Target

pytestmark = pytest.mark.skipif(not native_team_supported(), reason="the native thread team needs Linux futexes")

ROOT = Path(__file__).resolve().parent.parent

# The driver: `python driver.py fork N` forks N children (scenarios in turn), `python driver.py one SCENARIO` runs
# one scenario in this fresh process. Children return from `main` and exit through normal finalization.
DRIVER = r'''
import gc
import os
import sys
import threading
import time

import numpy as np

from relay_tune.codegen.jit import load_libgomp, load_object, native_thread_team
from relay_tune.codegen.llvm import compile_object
from relay_tune.kernel.tir import Buffer, For, ForKind, LoopVar, PrimFunc, Store
from relay_tune.target import Target

SCENARIOS = ["plain", "daemon_region", "thread_region", "stopped", "closed_then_load", "dropped_arrays", "cycle",
             "many_threads"]
if load_libgomp() is not None:
    SCENARIOS.append("both_runtimes")
N = 4099  # odd: the kernel's last chunk is partial


def kernel_object():
    i = LoopVar("i")
    a, out = Buffer("a", (N,)), Buffer("out", (N,))
    func = PrimFunc("exit_stress", (a, out), For(i, N, Store(out, (i,), a[i] * 3.0 + 1.0), ForKind.PARALLEL))
    return compile_object([func], Target.host().with_cores(4)), func


def packed_kernel(obj, func, runtime="native"):
    """A loaded kernel and an argument vector whose arrays only the vector holds."""
    kernel = load_object(obj, [func], threading_runtime=runtime).get(func.name)
    x = np.random.default_rng(1).uniform(-3, 3, N).astype(np.float32)
    y = np.zeros(N, np.float32)
    packed = kernel.pack([x, y])
    kernel.repeat(packed, 20)
    if not np.allclose(y, x * 3 + 1, rtol=1e-6, atol=1e-5):
        raise AssertionError("wrong result")
    return kernel, packed


def in_thread(kernel, packed, regions, daemon=True):
    thread = threading.Thread(target=lambda: kernel.repeat(packed, regions), daemon=daemon)
    thread.start()
    time.sleep(0.001)  # let it get inside a region
    return thread


def scenario(name, obj, func):
    if name == "closed_then_load":
        native_thread_team().close()
    kernel, packed = packed_kernel(obj, func)
    if name in ("daemon_region", "dropped_arrays"):
        in_thread(kernel, packed, 10**9)  # still starting regions when the process exits
    elif name == "thread_region":
        in_thread(kernel, packed, 3000, daemon=False)  # finalization waits for it
    elif name == "many_threads":
        for _ in range(3):
            in_thread(kernel, packed, 10**9)
    elif name == "stopped":
        native_thread_team().stop()
        kernel.repeat(packed, 5)
    elif name == "both_runtimes":
        other, other_packed = packed_kernel(obj, func, "openmp")
        in_thread(other, other_packed, 10**9)
        in_thread(kernel, packed, 10**9)
    elif name == "cycle":
        del kernel, packed  # the library sits in a reference cycle: freed by the collector, before exit
        gc.collect()
    if name == "dropped_arrays":
        gc.collect()  # the arrays are referenced by `packed` alone; nothing may free them under the thread


def main():
    obj, func = kernel_object()
    if sys.argv[1] == "one":
        scenario(sys.argv[2], obj, func)
        return 0
    failed = []
    for index in range(int(sys.argv[2])):
        name = SCENARIOS[index % len(SCENARIOS)]
        pid = os.fork()
        if pid == 0:
            scenario(name, obj, func)
            return 0
        _, status = os.waitpid(pid, 0)
        if status != 0:
            failed.append(f"{name}: wait status {status:#x}")
    print(f"{int(sys.argv[2]) - len(failed)} exited 0; failed: {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _run_driver(tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "exit_driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)


@pytest.mark.slow
def test_two_hundred_short_processes_exit_cleanly(tmp_path: Path) -> None:
    done = _run_driver(tmp_path, "fork", "200", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "200 exited 0" in done.stdout


@pytest.mark.parametrize("scenario", ["daemon_region", "dropped_arrays", "thread_region", "both_runtimes"])
def test_fresh_process_exits_cleanly_with_a_region_running(tmp_path: Path, scenario: str) -> None:
    if scenario == "both_runtimes" and load_libgomp() is None:
        pytest.skip("libgomp is not installed")
    done = _run_driver(tmp_path, "one", scenario, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_packed_arguments_keep_their_arrays_alive() -> None:
    """What the exits above depend on: a packed argument vector is enough to keep its arrays (the kernel writes
    through the addresses it holds)."""
    i = LoopVar("i")
    a, out = Buffer("a", (1001,)), Buffer("out", (1001,))
    func = PrimFunc("packed_alive", (a, out), For(i, 1001, Store(out, (i,), a[i] * 3.0 + 1.0), ForKind.PARALLEL))
    kernel = load_object(compile_object([func], Target.host().with_cores(2)), [func], "native").get(func.name)
    x = np.random.default_rng(5).uniform(-2, 2, 1001).astype(np.float32)
    expected = x * 3 + 1
    y = np.zeros(1001, np.float32)
    packed = kernel.pack([x, y])
    watch = weakref.ref(y)
    del x, y
    gc.collect()
    assert watch() is not None
    kernel.repeat(packed, 3)
    np.testing.assert_allclose(watch(), expected, rtol=1e-6, atol=1e-5)
    del packed
    gc.collect()
    assert watch() is None
