"""The lock of Optuna's journal file, safe against Ctrl-C.

Optuna's `JournalFileSymlinkLock` (its default for journal files) takes the lock by creating the symbolic link
`JOURNAL.lock` and releases it by renaming and removing that link. A KeyboardInterrupt that lands between those
steps (a user pressing Ctrl-C while the tuner writes a trial) leaves the link behind, so the resumed run waits out
Optuna's 30 s grace period, or makes Optuna's clean-up remove a file that is not there: the FileNotFoundError then
replaces the KeyboardInterrupt, and the command line reported "No such file or directory" with exit code 1 instead
of stopping cleanly with 130.

Here the interrupt is deferred while the lock is taken or released (file operations of microseconds; a wait for
another process's lock defers it until the lock is ours) and raised right after, with the lock released.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from optuna.storages.journal import JournalFileSymlinkLock


class _Deferred:
    hit = False


@contextlib.contextmanager
def sigint_deferred() -> Iterator[_Deferred]:
    """Within the block a SIGINT is only noted (`.hit`); the caller raises it after. Only the main thread can
    change signal handlers, and only there does Python raise KeyboardInterrupt: elsewhere this does nothing."""
    deferred = _Deferred()
    if threading.current_thread() is not threading.main_thread():
        yield deferred
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield deferred  # a handler of the caller's (or SIGINT ignored): leave it in charge
        return

    def note(signum: int, frame: FrameType | None) -> None:
        deferred.hit = True

    signal.signal(signal.SIGINT, note)
    try:
        yield deferred
    finally:
        signal.signal(signal.SIGINT, previous)


class InterruptSafeSymlinkLock(JournalFileSymlinkLock):
    """`JournalFileSymlinkLock` whose acquire and release finish before a Ctrl-C takes effect."""

    def acquire(self) -> bool:
        with sigint_deferred() as deferred:
            acquired = super().acquire()
        if deferred.hit:
            if acquired:
                self.release()
            raise KeyboardInterrupt
        return acquired

    def release(self) -> None:
        with sigint_deferred() as deferred:
            super().release()
        if deferred.hit:
            raise KeyboardInterrupt
