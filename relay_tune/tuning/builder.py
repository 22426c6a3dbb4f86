"""Builders: compile candidate configs into `BuildArtifact`s, in parallel worker processes.

`LocalBuilder` uses a `ProcessPoolExecutor` whose workers are recycled after about `max_tasks_per_child` builds each
(LLVM's JIT and compiler state grow with every kernel). The builder retires the whole pool itself, between builds,
instead of the executor's own `max_tasks_per_child`: that one starts a replacement the moment a worker exits, which
is right after a batch's last build, while the runner times the batch, and a new worker's start-up (a Python
process importing the compiler, a second or two of one core) made those measurements up to 2.6x slower (a
parallel kernel got one core); logged defaults of ResNet-50's 3x3 convolutions read 2.1-2.9 ms, 1.1 ms in the
model. Each build has its own timeout, counted from the moment a worker starts it: the worker reports the start
(a fresh worker first starts Python and imports the compiler and the task's modules, seconds on a busy machine,
which no build's clock counts), and at most `n_parallel` builds are in flight, so no build waits in a queue while
its clock runs. A build that overruns is stopped twice over: inside the worker a timer interrupts Python-level
work, and if the worker is stuck in native code the parent kills the pool's processes and starts a fresh pool. A
worker that dies (e.g. the compiler segfaults) breaks the pool; the builds that were in flight are retried one at a
time, so only the config that really crashes the compiler is recorded as a compile error.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import signal
import time
import traceback
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from types import FrameType, TracebackType
from typing import Any

from relay_tune.errors import CompileError
from relay_tune.records.measure import BuildResult, ErrorKind
from relay_tune.tuning.isolation import die_with_parent, ignore_interrupts
from relay_tune.tuning.task import BuildArtifact, TuneTask
from search_space import Config, InvalidConfigError


class Builder(ABC):
    """Compiles configs of one task. `build` returns one `BuildResult` per config, in order; `close` frees workers."""

    @abstractmethod
    def build(self, task: TuneTask, configs: Sequence[Config]) -> list[BuildResult]: ...

    def close(self) -> None:  # noqa: B027 - builders without resources need not override
        """Release worker processes. The builder may be used again afterwards (it restarts them)."""

    def __enter__(self) -> Builder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class _SoftTimeout(Exception):
    pass


def _raise_soft_timeout(signum: int, frame: FrameType | None) -> None:
    raise _SoftTimeout


def _short_error(err: BaseException) -> str:
    lines = traceback.format_exception_only(type(err), err)
    return "".join(lines).strip()[-2000:]


def build_one(task: TuneTask, config: Config, timeout: float | None = None) -> BuildResult:
    """Build one config, turning every failure into an error kind. Runs in a worker process (or inline)."""
    start = time.perf_counter()
    use_alarm = timeout is not None and timeout > 0 and hasattr(signal, "setitimer")
    if use_alarm:
        previous = signal.signal(signal.SIGALRM, _raise_soft_timeout)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        task.space.validate(config)
        artifact = task.build(config)
        if not isinstance(artifact, BuildArtifact):
            raise TypeError(f"task.build returned {type(artifact).__name__}, expected BuildArtifact")
        return BuildResult(artifact, None, "", time.perf_counter() - start)
    except _SoftTimeout:
        return BuildResult(None, ErrorKind.BUILD_TIMEOUT, f"build exceeded {timeout:g} s", time.perf_counter() - start)
    except InvalidConfigError as err:
        return BuildResult(None, ErrorKind.INVALID_CONFIG, _short_error(err), time.perf_counter() - start)
    except Exception as err:
        return BuildResult(None, ErrorKind.COMPILE_ERROR, _short_error(err), time.perf_counter() - start)
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def _ping() -> str:
    return "pong"


START_POLL_SECONDS = 0.05
"""How often the parent looks for the start of a build it handed to the pool (its clock starts there)."""
WORKER_START_ALLOWANCE = 120.0
"""Seconds a build handed to the pool may wait for a worker to start it (a fresh worker's interpreter start and
imports) before the pool counts as stuck and is killed."""

_started: Any = None  # in a worker process: where it reports the builds it starts (a multiprocessing SimpleQueue)


def _worker_init(started: Any = None) -> None:
    global _started
    ignore_interrupts()
    die_with_parent()
    _started = started


def _started_build(token: int, task: TuneTask, config: Config, timeout: float | None) -> BuildResult:
    """`build_one` in a worker, after telling the parent when it starts (time.monotonic is one clock for every
    process of the machine)."""
    if _started is not None:
        _started.put((token, time.monotonic()))
    return build_one(task, config, timeout)


class InlineBuilder(Builder):
    """Builds in the calling process, one at a time (debugging; no isolation from compiler crashes)."""

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = timeout

    def build(self, task: TuneTask, configs: Sequence[Config]) -> list[BuildResult]:
        return [build_one(task, config, self.timeout) for config in configs]


class LocalBuilder(Builder):
    """Parallel builds in a recycled process pool, with per-build timeouts (see the module docstring)."""

    def __init__(
        self,
        n_parallel: int | None = None,
        timeout: float = 30.0,
        max_tasks_per_child: int = 64,
        kill_grace: float = 2.0,
    ) -> None:
        self.n_parallel = max(1, n_parallel or os.cpu_count() or 1)
        self.timeout = timeout
        self.max_tasks_per_child = max_tasks_per_child
        self.kill_grace = kill_grace
        self._pool: ProcessPoolExecutor | None = None
        self._pool_builds = 0  # builds handed to the current pool
        self._started: Any = None  # the current pool's reports of started builds: (token, monotonic start time)
        self._tokens = itertools.count()

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # "spawn": workers must not inherit the driver's threads or LLVM state. A spawn-context pool starts
            # its workers on demand, in `submit`: during a build, never while the runner times kernels.
            context = multiprocessing.get_context("spawn")
            self._started = context.SimpleQueue()
            self._pool = ProcessPoolExecutor(
                max_workers=self.n_parallel,
                mp_context=context,
                initializer=_worker_init,
                initargs=(self._started,),
            )
            self._pool_builds = 0
        return self._pool

    def _pool_worn_out(self) -> bool:
        return self.max_tasks_per_child > 0 and self._pool_builds >= self.max_tasks_per_child * self.n_parallel

    def _kill_pool(self) -> None:
        pool, self._pool = self._pool, None
        self._started = None  # a worker killed while reporting may leave half a message behind
        if pool is None:
            return
        # A running future cannot be cancelled, so a worker stuck in native code has to be killed. The executor
        # has no public way to reach its processes; `_processes` has been stable since Python 3.2.
        processes = list(getattr(pool, "_processes", {}).values())
        for process in processes:
            if process.is_alive():
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join(timeout=5)

    def _check_workers_start(self) -> None:
        self._kill_pool()
        try:
            ok = self._get_pool().submit(_ping).result(timeout=120) == "pong"
        except Exception as err:
            self._kill_pool()
            raise CompileError(f"build worker processes cannot start or run anything ({err!r}); if this is a "
                               f"script, guard its entry point with `if __name__ == '__main__':`") from err
        if not ok:
            raise CompileError("build worker processes do not respond")

    def close(self) -> None:
        pool, self._pool = self._pool, None
        self._started = None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def build(self, task: TuneTask, configs: Sequence[Config]) -> list[BuildResult]:
        try:
            pickle.dumps(task)
        except Exception as err:
            raise CompileError(
                f"task {task.description or task.key!r} cannot be sent to build workers (not picklable: {err}); "
                f"tasks and their space constraints must be module-level classes and functions"
            ) from err
        results: list[BuildResult | None] = [None] * len(configs)
        attempts = [0] * len(configs)
        queue: deque[int] = deque(range(len(configs)))
        in_flight: dict[Future[BuildResult], tuple[int, int, float]] = {}  # future: (config, token, submitted)
        starts: dict[int, float] = {}  # token: when a worker started that build

        while queue or in_flight:
            self._submit_ready(task, configs, queue, attempts, in_flight)
            self._read_starts(starts)
            deadlines = [self._deadline(token, submitted, starts) for _, token, submitted in in_flight.values()]
            wait_for = min(deadlines) - time.monotonic()
            if any(token not in starts for _, token, _ in in_flight.values()):
                wait_for = min(wait_for, START_POLL_SECONDS)  # a start changes that build's deadline
            done, _ = wait(in_flight, timeout=max(0.0, wait_for), return_when=FIRST_COMPLETED)
            broken = False
            for future in done:
                index, _, _ = in_flight.pop(future)
                broken |= self._collect(future, index, results, attempts, queue)
            if broken:
                # Every other build in flight died with the pool; collect them, then start a fresh pool.
                for future, (index, _, _) in list(in_flight.items()):
                    wait([future], timeout=self.kill_grace)
                    in_flight.pop(future)
                    if future.done():
                        self._collect(future, index, results, attempts, queue)
                    else:
                        attempts[index] += 1
                        queue.appendleft(index)
                self._kill_pool()
                continue
            self._read_starts(starts)
            now = time.monotonic()
            expired = [f for f, (_, token, submitted) in in_flight.items()
                       if self._deadline(token, submitted, starts) <= now]
            if expired:
                for future in expired:
                    index, _, _ = in_flight.pop(future)
                    results[index] = BuildResult(None, ErrorKind.BUILD_TIMEOUT,
                                                 f"build exceeded {self.timeout:g} s (worker killed)", self.timeout)
                # Killing the pool also kills innocent builds in flight: run those again, not counted as failures.
                for index, _, _ in in_flight.values():
                    queue.appendleft(index)
                in_flight.clear()
                self._kill_pool()
        return [r if r is not None else BuildResult(None, ErrorKind.COMPILE_ERROR, "build lost") for r in results]

    def _deadline(self, token: int, submitted: float, starts: dict[int, float]) -> float:
        """When a build in flight counts as stuck: its timeout and the grace after its start, or, while no worker
        has started it, after the worker start-up allowance."""
        hard_timeout = self.timeout + self.kill_grace
        if token in starts:
            return starts[token] + hard_timeout
        return submitted + WORKER_START_ALLOWANCE + hard_timeout

    def _read_starts(self, starts: dict[int, float]) -> None:
        """Take the current pool's reports of started builds."""
        while self._started is not None and not self._started.empty():
            token, started = self._started.get()
            starts[token] = started

    def _submit_ready(self, task: TuneTask, configs: Sequence[Config], queue: deque[int], attempts: list[int],
                      in_flight: dict[Future[BuildResult], tuple[int, int, float]]) -> None:
        while queue and len(in_flight) < self.n_parallel:
            index = queue[0]
            retry = attempts[index] > 0
            if retry and in_flight:
                return  # a retry after a worker crash runs alone, so a second crash identifies the culprit
            if any(attempts[i] > 0 for i, _, _ in in_flight.values()):
                return
            if self._pool_worn_out():
                if in_flight:
                    return  # retired once its builds in flight are done
                self.close()
            queue.popleft()
            token = next(self._tokens)
            future = self._get_pool().submit(_started_build, token, task, configs[index], self.timeout)
            self._pool_builds += 1
            in_flight[future] = (index, token, time.monotonic())
            if retry:
                return

    def _collect(self, future: Future[BuildResult], index: int, results: list[BuildResult | None],
                 attempts: list[int], queue: deque[int]) -> bool:
        """Store a finished build's result; return True when the pool broke under it."""
        try:
            results[index] = future.result()
            return False
        except BrokenProcessPool:
            attempts[index] += 1
            if attempts[index] >= 2:
                # Crashed again while building alone: blame the config, unless no worker can run anything at all
                # (then every record would be a false compile error).
                self._check_workers_start()
                results[index] = BuildResult(None, ErrorKind.COMPILE_ERROR,
                                             "the build worker process died while compiling this config")
            else:
                queue.appendleft(index)
            return True
        except Exception as err:  # e.g. an artifact that cannot be pickled back to the driver
            results[index] = BuildResult(None, ErrorKind.COMPILE_ERROR, _short_error(err))
            return False
