"""Finished builds kept on disk, as OpenVINO's CACHE_DIR keeps compiled models: building a model that was built
before on this machine, with the same weights, tuning records, target and options, loads the saved model
(`CompiledModel.save`'s archive) instead of compiling it again.

An entry's key is a digest of

* the input module as text (`relay_tune.text.print_module`) and the bytes of every constant in it;
* the parameters bound by the build (`params`): names, dtypes, shapes and raw bytes;
* the contents of the tuning logs (which decide the records the build selects); a lookup function cannot be
  digested, so a build given one is never cached;
* the target (string, CPU, features, cores) and the host triple;
* the build options that change the code (`opt_level`, `layout_planning`, `winograd`, `require_tuned`,
  `check_tuned`);
* relay-tune's version and a digest of its sources and of `search_space` (a changed compiler never returns a model
  the old one built), llvmlite's and LLVM's versions.

An entry is a folder `<key>/` holding `model.rtmod` and the build warnings to repeat on a hit (`warnings.json`).
Every member of the archive carries its CRC-32, which the loader checks as it reads (a second digest of the whole
file would cost a hit more than the key). An entry is written as a temporary folder renamed into place, so
concurrent builds never see half an entry (the second writer's folder is dropped). An entry that does not load
(damaged, truncated, a member whose CRC does not match) is deleted and the model built again.

A build writes its entry in a background thread (`store_in_background`): writing a model's weights costs about a
second per hundred megabytes on a slow disk, which the caller need not wait for. The thread is not a daemon, so the
process's exit waits for it; a later build of the same key in the same process waits for it before it looks
(`BuildCache.load`), and `wait_for_stores` waits for every entry being written.

The folder is `models/` in the tuning cache's folder (`relay_tune.records.cache.default_cache_dir`);
`RELAY_TUNE_BUILD_CACHE=0` turns the cache off, and it is pruned to `DEFAULT_MAX_BYTES`, least recently used
first, whenever a build adds to it. Only CPU (llvm) builds are kept.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import numpy as np

from relay_tune.compile.kernel_cache import cache_enabled, compiler_identity
from relay_tune.compile.lookup import BuildWarning, SpecLookup
from relay_tune.errors import RelayTuneError
from relay_tune.ir import IRModule
from relay_tune.records.cache import default_cache_dir
from relay_tune.runtime.vm import load_model
from relay_tune.target import Target
from relay_tune.text.printer import print_module

BUILD_CACHE_ENV = "RELAY_TUNE_BUILD_CACHE"
DEFAULT_MAX_BYTES = 4 << 30
"""Bytes the cache keeps (models hold their weights: VGG-19's entry alone is over 500 MB)."""

MODEL_FILE = "model.rtmod"
WARNINGS_FILE = "warnings.json"
_READ_CHUNK = 8 << 20


class BuildCache:
    """Saved models by key (`key`) in one folder, one sub-folder per entry."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes

    @classmethod
    def default(cls) -> BuildCache | None:
        """The per-user cache, or None when `RELAY_TUNE_BUILD_CACHE` is 0 (or off/false/no)."""
        if not cache_enabled(BUILD_CACHE_ENV):
            return None
        return cls(default_cache_dir() / "models")

    def _entry(self, key: str) -> Path:
        return self.folder / key[:2] / key

    def load(self, key: str, threading_runtime: str = "auto") -> tuple[Any, list[str]] | None:
        """The model saved under `key`, loaded, and the build warnings it had; None when there is none. A damaged
        entry (a member whose CRC does not match, a truncated archive) is deleted and reported as missing. An
        entry this process is still writing is waited for."""
        entry = self._entry(key)
        with _writers_lock:
            writer = _writers.get(entry)
        if writer is not None:
            writer.join()
        if not entry.is_dir():
            return None
        try:
            messages = json.loads((entry / WARNINGS_FILE).read_text())
            model = load_model(entry / MODEL_FILE, threading_runtime)
        except Exception:  # whatever a damaged entry provokes, building again is the answer
            self.remove(key)
            return None
        try:
            os.utime(entry)  # recently used: pruned last
        except OSError:
            pass
        return model, [str(m) for m in messages] if isinstance(messages, list) else []

    def store(self, key: str, model: Any, messages: Iterable[str] = ()) -> None:
        """Keep `model` (anything with `save(path)`) under `key`; a cache that cannot be written is skipped (a
        build never fails for it)."""
        entry = self._entry(key)
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
        except OSError:
            return
        try:
            model.save(staging / MODEL_FILE)
            (staging / WARNINGS_FILE).write_text(json.dumps(list(messages)))
            try:
                os.rename(staging, entry)  # atomic; fails when another build stored the entry first
            except OSError:
                if not (entry / WARNINGS_FILE).is_file():  # a damaged leftover: replace it
                    self.remove(key)
                    os.rename(staging, entry)
        except (OSError, RelayTuneError):
            pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def store_in_background(self, key: str, model: Any, messages: Iterable[str] = ()) -> None:
        """`store` and `prune` in a thread of their own, on a snapshot of `model` (its `build_info` copied, so the
        caller may go on changing it; the weights and code it shares are never written to). The thread is not a
        daemon: the process exits once the entry is written."""
        snapshot = copy.copy(model)
        snapshot.build_info = copy.deepcopy(model.build_info)
        entry = self._entry(key)
        texts = [str(m) for m in messages]

        def write() -> None:
            try:
                self.store(key, snapshot, texts)
                self.prune()
            finally:
                with _writers_lock:
                    if _writers.get(entry) is threading.current_thread():
                        del _writers[entry]

        writer = threading.Thread(target=write, name=f"relay-tune build cache {key[:12]}")
        with _writers_lock:
            _writers[entry] = writer
        writer.start()

    def remove(self, key: str) -> None:
        shutil.rmtree(self._entry(key), ignore_errors=True)

    def entries(self) -> list[Path]:
        return [p for p in self.folder.glob("*/*") if p.is_dir() and not p.name.startswith(".tmp-")]

    def prune(self, max_bytes: int | None = None) -> int:
        """Delete the least recently used entries until the folder holds at most `max_bytes`; the number deleted."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        sized = []
        for entry in self.entries():
            try:
                size = sum(f.stat().st_size for f in entry.iterdir())
                sized.append((entry.stat().st_mtime, size, entry))
            except OSError:
                continue
        total = sum(size for _, size, _ in sized)
        removed = 0
        for _, size, entry in sorted(sized, key=lambda item: item[0]):
            if total <= limit:
                break
            shutil.rmtree(entry, ignore_errors=True)
            total -= size
            removed += 1
        return removed


# Entries being written by `store_in_background`, by folder: the threads writing them.
_writers: dict[Path, threading.Thread] = {}
_writers_lock = threading.Lock()


def wait_for_stores() -> None:
    """Return once every build-cache entry that this process writes in the background is written."""
    with _writers_lock:
        writers = list(_writers.values())
    for writer in writers:
        writer.join()


def build_key(
    mod: IRModule, target: Target, params: Mapping[str, Any] | None, logs: Any, options: Mapping[str, Any]
) -> str | None:
    """The cache key of one build (see the module docstring), or None when it cannot be cached (a lookup function
    as `logs`, a GPU target)."""
    if target.kind != "llvm":
        return None
    log_paths = _log_paths(logs)
    if log_paths is None:
        return None
    digest = hashlib.sha256()

    def add(text: str) -> None:
        digest.update(text.encode())
        digest.update(b"\x00")

    for part in (compiler_identity(), llvm.get_process_triple(), str(target), target.mcpu or "",
                 target.llvm_features or "", str(target.num_cores), json.dumps(dict(options), sort_keys=True,
                                                                               default=str)):
        add(part)
    constants: list[np.ndarray] = []
    add(print_module(mod, constants_out=constants))
    for array in constants:
        _add_array(digest, np.asarray(array))
    for name in sorted(params or {}):
        add(name)
        _add_array(digest, np.asarray((params or {})[name]))
    for path in log_paths:
        add(os.fspath(path))
        try:
            with open(path, "rb") as stream:
                for block in iter(functools.partial(stream.read, _READ_CHUNK), b""):
                    digest.update(block)
        except OSError:
            return None  # the build itself reports a missing log
    return digest.hexdigest()


def cached_build(cache: BuildCache, key: str, build: Callable[[], Any], threading_runtime: str = "auto",
                 start: float | None = None) -> Any:
    """The model stored under `key` in `cache`, or `build()`, stored there. Build warnings are repeated on a hit.
    `build_info["build_cache"]` says which it was, a hit's `build_info["timings"]` what it cost (seconds since
    `start`, the key included). Called by `relay_tune.build`, whose caller every warning names."""
    begin = time.perf_counter()
    start = begin if start is None else start
    key_s = begin - start
    found = cache.load(key, threading_runtime)
    if found is not None:
        model, messages = found
        for message in messages:
            warnings.warn(message, BuildWarning, stacklevel=3)  # past `build` to its caller
        seconds = time.perf_counter() - start
        # the stages a build reports, none of which ran, and what the hit cost
        model.build_info["timings"] = {"key_s": key_s, "passes_s": 0.0, "lower_s": 0.0, "plan_s": 0.0,
                                       "llvm_s": 0.0, "load_s": seconds - key_s, "total_s": seconds}
        model.build_info["build_cache"] = {"hit": True, "key": key}
        return model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build()
    for warning in caught:  # to the caller, as a hit repeats them
        warnings.warn(warning.message, warning.category, stacklevel=3)
    stored = time.perf_counter()
    model.build_info["build_cache"] = {"hit": False, "key": key, "key_s": key_s}
    cache.store_in_background(key, model, [str(w.message) for w in caught if issubclass(w.category, BuildWarning)])
    # what the build waited for: the snapshot and the writer's start, not the writing
    model.build_info["build_cache"]["store_s"] = time.perf_counter() - stored
    return model


def _log_paths(logs: Any) -> list[Any] | None:
    """The tuning-log paths of `logs` (empty for none), or None for a lookup function."""
    if logs is None:
        return []
    if isinstance(logs, SpecLookup) or callable(logs):
        return None
    return [logs] if isinstance(logs, str | os.PathLike) else list(logs)


def _add_array(digest: Any, array: np.ndarray) -> None:
    digest.update(f"{array.dtype.str}{array.shape};".encode())
    digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
