"""Checks of the machine's resources made before work starts: memory for a model, room for logs and outputs.

A model whose tensors cannot fit in memory, or a log that cannot be written, should stop a run with one clear
message before minutes of compiling or tuning, not with a MemoryError (or an OOM kill) half way, or a tuning
session that measures and then cannot record anything.

    check_model_memory(mod)                  # type level: a lower bound on what any executor needs
    check_memory(needed_bytes, breakdown)    # exact: what a memory plan needs (relay_tune.build)
    check_writable_file(path, "tuning log")  # the folder exists or can be made, the file opens, space is left
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from relay_tune.errors import RelayTuneError
from relay_tune.ir import Call, Constant, post_order
from relay_tune.ir.types import TensorType, TupleType

MIN_FREE_BYTES = 1 << 20  # a tuning log grows by about a kilobyte per trial: less than a megabyte free is full


class ResourceError(RelayTuneError):
    """The machine lacks what a run needs (memory, a writable folder, disk space)."""


def available_memory_bytes() -> int | None:
    """Memory this process may still allocate: MemAvailable (Linux), else free physical pages; None if unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB" if nbytes >= 1 << 28 else f"{nbytes / (1 << 20):.1f} MiB"


def check_memory(needed: int, breakdown: Mapping[str, int], what: str = "the model") -> None:
    """`ResourceError` when `needed` bytes exceed the memory available now (skipped when that is unknown)."""
    available = available_memory_bytes()
    if available is None or needed <= available:
        return
    parts = ", ".join(f"{name} {_gib(n)}" for name, n in breakdown.items() if n)
    raise ResourceError(f"{what} needs {_gib(needed)} of memory ({parts}) but this machine has {_gib(available)} "
                        "available")


def model_memory_lower_bound(mod: Any) -> tuple[int, dict[str, int]]:
    """Bytes any executor of a type-checked module's `main` needs at least: every constant, plus the model's
    inputs or the largest single operator call's inputs and output together (both are live while it runs),
    whichever is more."""
    def nbytes(ty: Any) -> int:
        if isinstance(ty, TensorType):
            if not ty.is_static:
                return 0
            count = math.prod(ty.static_shape)
            try:
                return count * np.dtype(ty.dtype).itemsize
            except TypeError:
                return count * 4
        if isinstance(ty, TupleType):
            return sum(nbytes(f) for f in ty.fields)
        return 0

    constants = 0
    largest_call = 0
    for node in post_order(mod["main"].body):
        if isinstance(node, Constant):
            constants += int(node.data.nbytes)
        elif isinstance(node, Call) and node.has_type():
            live = nbytes(node.checked_type) + sum(nbytes(a.checked_type) for a in node.args if a.has_type())
            largest_call = max(largest_call, live)
    params = sum(nbytes(p.checked_type) for p in mod["main"].params if p.has_type())
    if largest_call >= params:
        breakdown = {"constants": constants, "the largest operator's inputs and output": largest_call}
    else:
        breakdown = {"constants": constants, "inputs": params}
    return constants + max(params, largest_call), breakdown


def check_model_memory(mod: Any) -> None:
    """`ResourceError` when even the lower bound of `model_memory_lower_bound` does not fit in memory."""
    needed, breakdown = model_memory_lower_bound(mod)
    check_memory(needed, breakdown, "the model")


def check_writable_file(path: str | os.PathLike[str], what: str, append: bool = True) -> None:
    """`ResourceError` unless `path` can be written: a regular file (or none yet) whose folder exists or can be
    made, that opens for writing, on a file system with at least `MIN_FREE_BYTES` free. Creates the folder; an
    existing file is left as it is (opened for appending), a new one is removed again."""
    target = Path(path)
    if target.exists() and not target.is_file():
        raise ResourceError(f"the {what} {target} is not a regular file")
    folder = target.parent
    blocking = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise ResourceError(f"cannot create the folder {folder} for the {what}: {blocking} is a file")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ResourceError(f"cannot create the folder {folder} for the {what}: {err.strerror or err}") from None
    existed = target.exists()
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0), 0o644)
        os.close(fd)
    except OSError as err:
        raise ResourceError(f"cannot write the {what} {target}: {err.strerror or err}") from None
    finally:
        if not existed and target.exists():
            try:
                target.unlink()
            except OSError:
                pass
    try:
        stats = os.statvfs(folder)
    except OSError:
        return
    free = stats.f_bavail * stats.f_frsize
    if free < MIN_FREE_BYTES:
        raise ResourceError(f"no space left for the {what} {target}: {free} bytes free on its file system "
                            f"({os.strerror(errno.ENOSPC)})")
