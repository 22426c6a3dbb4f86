"""Object code of compiled kernels kept on disk, so that building a model compiled before on this machine skips
LLVM (lowering to LLVM IR, the O3 pipeline and code emission: about nine tenths of a build).

An entry is one object file, keyed by a digest of

* the kernels' loop nests, structurally (`loop_nest_digest`: loop variables and buffers numbered by first use,
  so the key does not depend on object identity, only on what the code computes and the kernels' names);
* the target (CPU, features, cores) and the host triple;
* the code generator itself: llvmlite's and LLVM's versions and the source text of `relay_tune.codegen`, so a
  changed code generator never returns objects the old one emitted.

The folder is `kernels/` in the tuning cache's folder (`relay_tune.records.cache.default_cache_dir`). Files are
written atomically (a temporary file renamed into place), so concurrent builds at worst compile the same kernel
twice. `RELAY_TUNE_KERNEL_CACHE=0` turns the cache off; it is pruned to `DEFAULT_MAX_BYTES`, least recently used
first, whenever a build adds to it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

import relay_tune.codegen as codegen_package
import search_space
from relay_tune.kernel import tir
from relay_tune.records.cache import default_cache_dir
from relay_tune.target import Target
from relay_tune.version import __version__

KERNEL_CACHE_ENV = "RELAY_TUNE_KERNEL_CACHE"
DEFAULT_MAX_BYTES = 512 << 20
_SUFFIX = ".o"
_CHECKSUM_BYTES = 32  # each file: the sha256 of the object, then the object


class KernelObjectCache:
    """Object files by key (`key`) in one folder (or other checksummed blobs: files end in `suffix`)."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES,
                 suffix: str = _SUFFIX) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.suffix = suffix

    @classmethod
    def default(cls) -> KernelObjectCache | None:
        """The per-user cache, or None when `RELAY_TUNE_KERNEL_CACHE` is 0 (or off/false/no)."""
        if not kernel_cache_enabled():
            return None
        return cls(default_cache_dir() / "kernels")

    def key(self, funcs: Sequence[tir.PrimFunc], target: Target, digests: Mapping[str, str] | None = None) -> str:
        """The key of one object holding `funcs`; `digests` may give a kernel's `loop_nest_digest` by name (known
        from its lowering), which saves walking its loop nest again."""
        known = digests or {}
        digest = hashlib.sha256()
        for part in (_codegen_identity(), llvm.get_process_triple(), str(target), target.mcpu or "",
                     target.llvm_features or "", str(target.num_cores)):
            digest.update(part.encode())
            digest.update(b"\x00")
        for func in funcs:
            digest.update((known.get(func.name) or loop_nest_digest(func)).encode())
        return digest.hexdigest()

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / (key + self.suffix)

    def load(self, key: str) -> bytes | None:
        """The object file stored under `key`, or None (also for an entry whose checksum does not match: a
        damaged file is compiled again, never linked)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        checksum, obj = data[:_CHECKSUM_BYTES], data[_CHECKSUM_BYTES:]
        if hashlib.sha256(obj).digest() != checksum:
            return None
        try:
            os.utime(path)  # recently used: pruned last
        except OSError:
            pass
        return obj

    def store(self, key: str, obj: bytes) -> None:
        """Keep `obj` under `key`; a cache that cannot be written is skipped (a build never fails for it)."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as tmp:
                tmp.write(hashlib.sha256(obj).digest() + obj)
            os.replace(tmp.name, path)
        except OSError:
            return

    def entries(self) -> list[Path]:
        return [p for p in self.folder.glob(f"*/*{self.suffix}") if p.is_file()]

    def prune(self, max_bytes: int | None = None) -> int:
        """Delete the least recently used objects until the folder holds at most `max_bytes`; the number deleted."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        sized = []
        for path in self.entries():
            try:
                stat = path.stat()
            except OSError:
                continue
            sized.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in sized)
        removed = 0
        for _, size, path in sorted(sized, key=lambda entry: entry[0]):
            if total <= limit:
                break
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            removed += 1
        return removed


def cache_enabled(variable: str) -> bool:
    """Whether the environment variable `variable` leaves its cache on (unset, or anything but 0/off/false/no)."""
    return os.environ.get(variable, "").strip().lower() not in ("0", "off", "false", "no")


def kernel_cache_enabled() -> bool:
    """Whether `RELAY_TUNE_KERNEL_CACHE` leaves the kernel cache on."""
    return cache_enabled(KERNEL_CACHE_ENV)


def loop_nest_digest(func: tir.PrimFunc) -> str:
    """A digest of what `func` computes: its name, parameters and loop nest, with loop variables and buffers
    numbered in order of first use (they compare by identity, so their names alone could be ambiguous)."""
    numbers: dict[int, int] = {}
    parts: list[str] = []
    add = parts.append
    stack: list[object] = [func]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:  # an explicit stack: expression trees can be deeper than Python's recursion limit
        node = pop()
        kind = type(node)
        if kind is str:
            add(node)  # type: ignore[arg-type]
        elif kind is tir.LoopVar:
            add(f"v{numbers.setdefault(id(node), len(numbers))}:{node.dtype};")  # type: ignore[attr-defined]
        elif kind is tir.Buffer:
            first = id(node) not in numbers
            number = numbers.setdefault(id(node), len(numbers))
            add(f"b{number}({node.name},{node.shape},{node.dtype},{node.scope.value});" if first  # type: ignore[attr-defined]
                else f"b{number};")
        elif kind is tuple or kind is list:
            add("[")
            push("]")
            extend(reversed(node))  # type: ignore[call-overload]
        else:
            names = _FIELDS.get(kind)
            if names is None:
                names = _FIELDS[kind] = _field_names(kind)
            if names:
                add(kind.__name__ + "(")
                push(")")
                extend([getattr(node, name) for name in reversed(names)])
            else:
                add(f"{kind.__name__}:{node.value if isinstance(node, enum.Enum) else node!r};")
    return hashlib.sha256("".join(parts).encode()).hexdigest()


# Field names of each loop-nest node type (empty for leaves: numbers, enums, None), filled on first sight.
_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(kind) and not issubclass(kind, enum.Enum):
        return tuple(f.name for f in dataclasses.fields(kind))
    return ()


@functools.cache
def compiler_identity() -> str:
    """relay-tune's version, a digest of its sources and the schedule templates', llvmlite's and LLVM's versions:
    what decides every step from a Relay module to object code."""
    digest = hashlib.sha256()
    for root in (Path(__file__).parents[1], Path(search_space.__file__).parent):
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return f"relay-tune {__version__}, llvmlite {llvmlite.__version__}, LLVM {llvm.llvm_version_info}, " \
           f"sources {digest.hexdigest()}"


@functools.cache
def _codegen_identity() -> str:
    """llvmlite's and LLVM's versions and a digest of the code generator's sources."""
    digest = hashlib.sha256()
    for path in sorted(_sources(Path(codegen_package.__file__).parent)):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return f"llvmlite {llvmlite.__version__}, LLVM {llvm.llvm_version_info}, codegen {digest.hexdigest()}"


def _sources(folder: Path) -> Iterable[Path]:
    return folder.rglob("*.py")
