"""One measurement at a time per machine, whichever tuning process it comes from.

Several workers on one host (several `relay-tune` processes on one storage, or a job array that places two
workers on one node) would otherwise time their kernels at the same moment, and each kernel's time would include
the other's load: the records would be wrong, not just noisy. `HostLockedRunner` takes an exclusive `flock` on a
host-wide lock file for the duration of each `run`; compiling needs no lock, so builds still overlap. The lock is
released by the kernel when the holder dies, however it dies.

The lock file is `$RELAY_TUNE_MEASURE_LOCK`, by default `relay-tune-measure.lock` in the system's temporary
folder (one per machine; a container with its own /tmp should get the host's file mounted, or use disjoint cores).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from relay_tune.records.measure import RunResult
from relay_tune.tuning.runner import Runner
from relay_tune.tuning.task import BuildArtifact, TuneTask

__all__ = ["HostLockedRunner", "default_lock_path", "measurement_lock"]


def default_lock_path() -> Path:
    override = os.environ.get("RELAY_TUNE_MEASURE_LOCK")
    return Path(override) if override else Path(tempfile.gettempdir()) / "relay-tune-measure.lock"


@contextlib.contextmanager
def measurement_lock(path: str | os.PathLike[str] | None = None) -> Iterator[float]:
    """Hold the host-wide measurement lock; yields the seconds spent waiting for it."""
    lock_path = Path(path) if path is not None else default_lock_path()
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        with contextlib.suppress(PermissionError):
            os.fchmod(fd, 0o666)  # other users' workers on this host must be able to take it too
        started = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class HostLockedRunner(Runner):
    """A runner whose measurements never overlap with another `HostLockedRunner`'s on this host."""

    def __init__(self, inner: Runner, lock_path: str | os.PathLike[str] | None = None) -> None:
        self.inner = inner
        self.lock_path = lock_path
        self.waited_s = 0.0  # time spent waiting for other processes' measurements

    @property
    def timing_kind(self) -> str:
        return self.inner.timing_kind

    def run(self, task: TuneTask, artifact: BuildArtifact) -> RunResult:
        with measurement_lock(self.lock_path) as waited:
            self.waited_s += waited
            return self.inner.run(task, artifact)

    def run_batch(self, task: TuneTask, artifacts: Sequence[BuildArtifact]) -> list[RunResult]:
        with measurement_lock(self.lock_path) as waited:
            self.waited_s += waited
            return self.inner.run_batch(task, artifacts)

    def close(self) -> None:
        self.inner.close()
