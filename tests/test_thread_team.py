"""The native thread team (`relay_tune.codegen.thread_team`): parallel kernels on it give the reference results, a
region completes on its caller alone when no worker comes (revocation), a late worker does nothing, regions nest and
run from several threads, a forked child runs regions, and many regions in a row lose no wake-up."""

from __future__ import annotations

import ctypes
import multiprocessing
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import relay_tune
from relay_tune.codegen.jit import (
    DEFAULT_GOMP_SPINCOUNT,
    THREADING_ENV,
    load_object,
    native_thread_team,
    resolve_threading_runtime,
)
from relay_tune.codegen.llvm import compile_object
from relay_tune.codegen.thread_team import NativeThreadTeam, native_team_supported, spin_count_from_environment
from relay_tune.errors import RelayTuneError
from relay_tune.interpreter import evaluate
from relay_tune.kernel.tir import Buffer, For, ForKind, LoopVar, PrimFunc, Store
from relay_tune.target import Target
from relay_tune.text import parse_module

pytestmark = pytest.mark.skipif(not native_team_supported(), reason="the native thread team needs Linux futexes")

HOST = Target.host()
RNG = np.random.default_rng(3)
_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_PARALLEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
_QUERY = ctypes.CFUNCTYPE(ctypes.c_int)


@pytest.fixture
def team() -> Iterator[NativeThreadTeam]:
    """The process's team; restarted as it was after the test changed its size or workers."""
    team = native_thread_team()
    size = team.size
    yield team
    team.start(size, spin_count_from_environment(DEFAULT_GOMP_SPINCOUNT))


def _scale_kernel(n: int, name: str) -> PrimFunc:
    i = LoopVar("i")
    a, out = Buffer("a", (n,)), Buffer("out", (n,))
    return PrimFunc(name, (a, out), For(i, n, Store(out, (i,), a[i] * 3.0 + 1.0), ForKind.PARALLEL))


class _Recorder:
    """A region body written in Python: records (thread number, team size, OS thread) for every call; `during`
    runs inside thread 0's call."""

    def __init__(self, team: NativeThreadTeam, during: Callable[[], None] | None = None) -> None:
        symbols = team.symbols()
        self.parallel = _PARALLEL(symbols["GOMP_parallel"])
        self.thread_num = _QUERY(symbols["omp_get_thread_num"])
        self.num_threads = _QUERY(symbols["omp_get_num_threads"])
        self.calls: list[tuple[int, int, int]] = []
        self.during = during
        self.body = _BODY(self._body)

    def _body(self, _data: int | None) -> None:
        number = self.thread_num()
        self.calls.append((number, self.num_threads(), threading.get_ident()))
        if number == 0 and self.during is not None:
            self.during()

    def run(self, threads: int) -> None:
        self.parallel(ctypes.cast(self.body, ctypes.c_void_p), None, threads, 0)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_parallel_kernel_is_correct_on_teams_of_any_size(team: NativeThreadTeam, threads: int) -> None:
    team.start(threads, spin=DEFAULT_GOMP_SPINCOUNT)
    func = _scale_kernel(1003, f"team_scale_{threads}")
    lib = load_object(compile_object([func], HOST.with_cores(4)), [func], threading_runtime="native")
    x = RNG.uniform(-5, 5, 1003).astype("float32")
    got = np.zeros(1003, np.float32)
    for _ in range(20):
        got[:] = 0
        lib.get(func.name)(x, got)
        np.testing.assert_allclose(got, x * 3 + 1, rtol=1e-6, atol=1e-5)


def test_model_on_the_native_team_matches_the_interpreter(team: NativeThreadTeam) -> None:
    team.start(4, spin=DEFAULT_GOMP_SPINCOUNT)
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(1, 5, 13, 11), float32], %w: Tensor[(7, 5, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=7, kernel_size=[3, 3]);
  %1 = nn.relu(%0);
  nn.max_pool2d(%1, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
}
""")
    w = RNG.standard_normal((7, 5, 3, 3)).astype("float32")
    model = relay_tune.build(mod, HOST.with_cores(4), params={"w": w}, threading_runtime="native",
                             build_cache=False)
    x = RNG.standard_normal((1, 5, 13, 11)).astype("float32")
    expected = evaluate(mod, {"x": x, "w": w})
    np.testing.assert_allclose(model.run(x), expected, rtol=1e-4, atol=1e-4)


def test_region_completes_on_the_caller_when_no_worker_comes(team: NativeThreadTeam) -> None:
    """Revocation: a team of 4 whose workers never arrive; the caller runs every thread number itself, each once."""
    team.start(4, spin=0, workers=0)
    joins = team.joins
    recorder = _Recorder(team)
    recorder.run(4)
    caller = threading.get_ident()
    assert sorted(recorder.calls) == [(n, 4, caller) for n in range(4)]
    assert team.joins == joins
    func = _scale_kernel(777, "team_revoked")
    lib = load_object(compile_object([func], HOST.with_cores(4)), [func], threading_runtime="native")
    x = RNG.uniform(-5, 5, 777).astype("float32")
    got = np.zeros(777, np.float32)
    lib.get(func.name)(x, got)
    np.testing.assert_allclose(got, x * 3 + 1, rtol=1e-6, atol=1e-5)
    assert team.joins == joins


def test_worker_that_joins_an_open_region_runs_its_number_and_a_late_one_nothing(team: NativeThreadTeam) -> None:
    team.start(3, spin=0, workers=0)
    joined: list[bool] = []

    def join_from_another_thread() -> None:
        helper = threading.Thread(target=lambda: joined.append(team.join()))
        helper.start()
        helper.join()

    recorder = _Recorder(team, during=join_from_another_thread)
    recorder.run(3)
    caller = threading.get_ident()
    assert joined == [True]
    by_number = {number: (size, ident) for number, size, ident in recorder.calls}
    assert len(recorder.calls) == 3 and sorted(by_number) == [0, 1, 2]
    assert by_number[1][1] != caller and by_number[0] == by_number[2] == (3, caller)
    # after the close: a worker that comes now claims nothing and never calls the body (its data is gone)
    assert team.join() is False
    assert len(recorder.calls) == 3


def test_queries_outside_a_region_and_nested_regions(team: NativeThreadTeam) -> None:
    team.start(2, spin=DEFAULT_GOMP_SPINCOUNT)
    inner = _Recorder(team)
    outer = _Recorder(team, during=lambda: inner.run(2))
    assert (outer.thread_num(), outer.num_threads()) == (0, 1)
    outer.run(2)
    assert sorted(n for n, _, _ in outer.calls) == [0, 1]
    # the nested region runs on its caller alone, as a team of one
    assert [(n, size) for n, size, _ in inner.calls] == [(0, 1)]
    assert (outer.thread_num(), outer.num_threads()) == (0, 1)


def test_regions_from_several_threads_at_once(team: NativeThreadTeam) -> None:
    team.start(4, spin=DEFAULT_GOMP_SPINCOUNT)
    func = _scale_kernel(4099, "team_concurrent")
    lib = load_object(compile_object([func], HOST.with_cores(4)), [func], threading_runtime="native")
    kernel = lib.get(func.name)
    x = RNG.uniform(-5, 5, 4099).astype("float32")
    failures: list[str] = []

    def work() -> None:
        out = np.zeros(4099, np.float32)
        packed = kernel.pack([x, out])
        for _ in range(50):
            out[:] = 0
            kernel.repeat(packed, 20)
            if not np.allclose(out, x * 3 + 1, rtol=1e-6, atol=1e-5):
                failures.append("wrong result")

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


@pytest.mark.parametrize("spin", [0, DEFAULT_GOMP_SPINCOUNT])
def test_many_tiny_regions_lose_no_wake_up(team: NativeThreadTeam, spin: int) -> None:
    """100,000 regions back to back in native code; with spin 0 every worker sleeps between them, so each region
    goes through the futex wake-up. A lost wake-up would hang a worker that joined (the test would time out) or
    leave the workers asleep for good (they would join no region afterwards)."""
    team.start(2, spin=spin)
    func = _scale_kernel(64, f"team_tiny_{spin}")
    lib = load_object(compile_object([func], HOST.with_cores(2)), [func], threading_runtime="native")
    kernel = lib.get(func.name)
    x = RNG.uniform(-5, 5, 64).astype("float32")
    out = np.zeros(64, np.float32)
    kernel.repeat(kernel.pack([x, out]), 100_000)
    np.testing.assert_allclose(out, x * 3 + 1, rtol=1e-6, atol=1e-5)
    joins = team.joins
    recorder = _Recorder(team, during=lambda: _wait_for(lambda: team.joins > joins))
    recorder.run(2)
    assert team.joins == joins + 1  # a worker still wakes for a region


def _wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    event = threading.Event()
    for _ in range(int(seconds * 100)):
        if condition():
            return
        event.wait(0.01)


def _child_runs_a_region(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    func = _scale_kernel(513, "team_after_fork")
    lib = load_object(compile_object([func], HOST.with_cores(4)), [func], threading_runtime="native")
    x = np.arange(513, dtype=np.float32)
    got = np.zeros(513, np.float32)
    for _ in range(100):
        lib.get(func.name)(x, got)
    team = native_thread_team()
    queue.put((bool(np.allclose(got, x * 3 + 1)), team.workers, team.size))


def test_forked_child_runs_regions_on_its_own_workers(team: NativeThreadTeam) -> None:
    team.start(4, spin=DEFAULT_GOMP_SPINCOUNT)
    recorder = _Recorder(team)
    recorder.run(4)  # the parent's team has run a region
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_runs_a_region, args=(queue,))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung on the thread team")
    assert child.exitcode == 0
    assert queue.get(timeout=10) == (True, 3, 4)


def test_runtime_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADING_ENV, raising=False)
    assert resolve_threading_runtime("auto") == "native"  # the module is skipped where the host cannot run it
    monkeypatch.setenv(THREADING_ENV, "native")
    assert resolve_threading_runtime("auto") == "native"
    monkeypatch.setenv(THREADING_ENV, "openmp")
    assert resolve_threading_runtime("auto") == "openmp"
    assert resolve_threading_runtime("native") == "native"
    monkeypatch.setenv(THREADING_ENV, "tbb")
    with pytest.raises(RelayTuneError, match=THREADING_ENV):
        resolve_threading_runtime("auto")
    with pytest.raises(RelayTuneError, match="threading runtime"):
        resolve_threading_runtime("tbb")


def test_spin_count_follows_libgomp_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert spin_count_from_environment(123) == 123
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert spin_count_from_environment(123) == 0
    monkeypatch.setenv("GOMP_SPINCOUNT", "5k")
    assert spin_count_from_environment(123) == 5000


def test_team_size_is_checked(team: NativeThreadTeam) -> None:
    with pytest.raises(RelayTuneError, match="1 to 256"):
        team.start(0, spin=0)
    with pytest.raises(RelayTuneError, match="workers"):
        team.start(2, spin=0, workers=2)


def _wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Poll `condition` until it holds or `seconds` pass; whether it held."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.001)
    return condition()


def _hold_calls(team: NativeThreadTeam) -> tuple[Callable[[], None], Callable[[], None]]:
    hold, release = team.hold_symbols()
    return ctypes.CFUNCTYPE(None)(hold), ctypes.CFUNCTYPE(None)(release)


def test_hold_wakes_sleeping_workers_and_keeps_them_up_until_released(team: NativeThreadTeam) -> None:
    """With spin 0 idle workers sleep at once; a hold wakes them and they stay awake (spinning) while it lasts,
    also across regions; nested holds count; after the last release they sleep again."""
    team.start(3, spin=0)
    hold, release = _hold_calls(team)
    assert _wait_for(lambda: team.sleeping == 2)
    hold()
    hold()
    assert team.held == 2
    assert _wait_for(lambda: team.sleeping == 0)
    recorder = _Recorder(team)
    for _ in range(20):
        recorder.run(3)
    assert sorted({number for number, _, _ in recorder.calls}) == [0, 1, 2]
    release()
    assert team.held == 1
    # still held: nobody goes back to sleep (a worker that did would count itself in `sleeping` for good)
    assert not _wait_for(lambda: team.sleeping > 0, seconds=0.05)
    release()
    assert team.held == 0
    assert _wait_for(lambda: team.sleeping == 2)


def test_spinning_workers_yield_their_cores(team: NativeThreadTeam) -> None:
    """An idle worker that spins calls sched_yield every YIELD_EVERY pauses (so that it gives its core to a caller
    the scheduler put beside it)."""
    team.start(2, spin=2**31 - 1)
    before = team.yields
    assert _wait_for(lambda: team.yields > before)


def test_model_runs_hold_the_native_team(team: NativeThreadTeam) -> None:
    """A model with parallel kernels on the native team brackets every run with hold and release (its results stay
    right, and no hold outlasts a run); a model without parallel kernels does not."""
    team.start(2, spin=0)
    mod = parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(64, 61, 67), float32]) {
  %0 = multiply(%x, 0.5f);
  %1 = nn.relu(%0);
  add(%1, %x)
}
""")
    model = relay_tune.build(mod, HOST.with_cores(2), threading_runtime="native", opt_level=0, build_cache=False)
    assert model._executor.holds_team
    x = RNG.standard_normal((64, 61, 67)).astype("float32")
    expected = evaluate(mod, {"x": x})
    for _ in range(5):
        np.testing.assert_allclose(model.run(x), expected, rtol=1e-6, atol=1e-6)
        assert team.held == 0
    serial = relay_tune.build(parse_module("""#[version = "0.0.5"]
def @main(%x: Tensor[(3, 5), float32]) { add(%x, 1f) }
"""), HOST.with_cores(2), threading_runtime="native", build_cache=False)
    assert not serial._executor.holds_team  # no parallel kernel: nothing to wake
