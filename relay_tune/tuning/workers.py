"""Who a tuning worker is: host, process id and process start time, so that a restarted process (or a later one
that reuses the pid) is a different worker, and a worker on this host that no longer runs can be told apart.

Used by the Optuna searches (`relay_tune.tuning.search`) and the database driver (`relay_tune.tuning.distributed`)
alike; it sits below both.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

__all__ = ["worker_identity", "worker_is_gone"]


@functools.cache
def _process_start_ticks(pid: int) -> str:
    """Start time of a process (Linux), to tell a live process from a later one that reused its pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[19]
    except (OSError, IndexError):
        return "?"


def worker_identity() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process_start_ticks(pid)}"


def worker_is_gone(identity: str) -> bool:
    """True when `identity` names a process on this host that no longer exists."""
    try:
        host, pid_text, ticks = identity.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False  # cannot tell for other machines; their trials stay open
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    _process_start_ticks.cache_clear()
    return _process_start_ticks(pid) != ticks
