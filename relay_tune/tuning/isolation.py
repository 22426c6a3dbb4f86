"""Helpers for the worker processes that build and run candidate kernels."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to kill this process when the process that started it dies, even by SIGKILL.

    Pool workers otherwise outlive a killed driver: they hold both ends of their own task pipe, so they never see
    end-of-file and wait forever. (The signal fires when the starting *thread* exits; pools start their workers
    from threads that live as long as the pool.) A parent that died before the request (while this worker was still
    starting: a spawned worker imports for a second or two) sends no signal: such a worker is an orphan already and
    exits here.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)


def ignore_interrupts() -> None:
    """Ctrl-C reaches the whole process group; only the driver should react (it shuts its workers down)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def describe_exit(exitcode: int | None) -> str:
    """"killed by SIGSEGV", "exited with code 3", ..."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
