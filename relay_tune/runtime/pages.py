"""Memory on huge pages, for data that kernels stream: a model's constants, the tuner's copies of weights.

A kernel that streams megabytes of weights from memory (ResNet-50's classifier reads 8 MiB per call) pays for
address translation as well as for the bytes. On 4 KiB pages every 4 KiB of weights needs its own TLB entry, and
under a hypervisor a TLB miss walks two page tables; on a 2 MiB page one entry covers 512 times as much. Whether
numpy's buffers get huge pages is left to chance: numpy asks for them (madvise) only for arrays of 4 MiB or more,
and only the 2 MiB-aligned part of a buffer can be backed by them; a buffer that malloc carves out of memory the
process touched before keeps the small pages it already has. Measured on the planned ResNet-50 (2-core AVX-512 VM,
transparent huge pages in `madvise` mode), the classifier's kernel took 356 us in the model reading weights the
model had loaded into ordinary numpy buffers, 327 us with the same bytes on 4 KiB pages and 242-248 us on huge
pages, which is what the tuner had measured (its copies of the weights sat in one 64 MiB numpy buffer, which got
huge pages): the log promised a time that the model's memory could not give.

`huge_page_empty` maps fresh anonymous memory, 2 MiB-aligned, and asks for huge pages before anything touches it,
so the kernel backs it with huge pages from the first write where it can (the request is a hint: with transparent
huge pages off, or no free 2 MiB frames, the memory works the same on small pages). `pack` places many arrays in
one such block, one after the other (cache-line aligned, not each on its own 2 MiB boundary: arrays that all
started at the same offset of a page would compete for the same cache sets).
"""

from __future__ import annotations

import contextlib
import importlib
import mmap
import re
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np

__all__ = ["HUGE_PAGE_BYTES", "huge_page_empty", "huge_pages_enabled", "huge_page_bytes_backing", "numpy_small_pages",
           "pack"]

HUGE_PAGE_BYTES = 2 << 20
_LINE = 64
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_enabled() -> bool:
    """Whether this kernel gives transparent huge pages to memory that asks for them ("always" or "madvise")."""
    try:
        with open(_THP_SETTING) as handle:
            setting = handle.read()
    except OSError:
        return False
    chosen = re.search(r"\[(\w+)\]", setting)
    return bool(chosen) and chosen.group(1) in ("always", "madvise")


def huge_page_empty(nbytes: int) -> np.ndarray:
    """An uninitialized uint8 array of `nbytes` starting on a 2 MiB boundary, asked to be backed by huge pages.

    The memory is an anonymous mapping of its own (never touched before, so nothing is already backed by small
    pages); the array keeps the mapping alive. Where `mmap` has no `madvise` the array is still 2 MiB-aligned."""
    nbytes = max(int(nbytes), 1)
    length = -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    # One huge page more than needed, so that a 2 MiB boundary falls inside whatever address the kernel picks.
    if not hasattr(mmap, "MAP_ANONYMOUS"):  # not a Unix: aligned, on whatever pages the allocator gives
        raw = np.empty(length + HUGE_PAGE_BYTES, dtype=np.uint8)
        start = -raw.__array_interface__["data"][0] % HUGE_PAGE_BYTES
        return raw[start : start + nbytes]
    mapping = mmap.mmap(-1, length + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(mapping, dtype=np.uint8)  # holds the mapping (its buffer export) as long as it lives
    start = -raw.__array_interface__["data"][0] % HUGE_PAGE_BYTES
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            mapping.madvise(advice, start, length)
        except OSError:
            pass  # a kernel without transparent huge pages: small pages it is
    return raw[start : start + nbytes]


def _numpy_madvise_switch() -> Callable[[bool], bool] | None:
    """numpy's switch of its huge-page requests (`_set_madvise_hugepage(on) -> previous`), or None where this
    numpy has none (the switch is private: numpy 2 keeps it in `numpy._core.multiarray`, numpy 1 in `numpy.core`)."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        switch = getattr(module, "_set_madvise_hugepage", None)
        if callable(switch):
            return switch  # type: ignore[no-any-return]
    return None


_numpy_switch = _numpy_madvise_switch()
_small_pages_lock = threading.Lock()
_small_pages_depth = 0
_numpy_setting_before = True


@contextlib.contextmanager
def numpy_small_pages() -> Iterator[None]:
    """Inside the block, numpy's new arrays of 4 MiB or more are not asked to be backed by huge pages; numpy's
    setting is restored when the last of (possibly nested or concurrent) blocks ends.

    For short-lived arrays that are written once and dropped, such as a build's folded and transformed weights:
    a huge page is cleared whole on its first write and may first need memory compacted for it, which for memory
    touched once costs more than the fewer TLB misses save (and far more on a VM that backs its memory lazily, where
    each first write faults into the hypervisor: `python -m experiments build-time`). Arrays that kernels stream
    for the life of a model (its constants, `pack`; its arena) must be allocated outside the block."""
    global _small_pages_depth, _numpy_setting_before
    switch = _numpy_switch
    if switch is None:
        yield
        return
    with _small_pages_lock:
        if _small_pages_depth == 0:
            _numpy_setting_before = bool(switch(False))
        _small_pages_depth += 1
    try:
        yield
    finally:
        with _small_pages_lock:
            _small_pages_depth -= 1
            if _small_pages_depth == 0:
                switch(_numpy_setting_before)


def pack(arrays: Sequence[np.ndarray], align: int = _LINE) -> list[np.ndarray]:
    """C-contiguous copies of `arrays` (same shapes and dtypes) laid one after another in one huge-page block,
    each starting on an `align`-byte boundary. The copies are writable views that keep the block alive."""
    if not arrays:
        return []
    offsets: list[int] = []
    total = 0
    for array in arrays:
        offsets.append(total)
        total += -(-max(array.nbytes, 1) // align) * align
    block = huge_page_empty(total)
    packed: list[np.ndarray] = []
    for array, offset in zip(arrays, offsets):
        array = np.asarray(array)
        view = block[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
        np.copyto(view, array)
        packed.append(view)
    return packed


def huge_page_bytes_backing(address: int, nbytes: int, smaps: str = "/proc/self/smaps") -> int | None:
    """Bytes of huge pages backing the mappings that overlap [address, address + nbytes) (None where the kernel
    does not report it). Counts whole mappings, so it can exceed `nbytes`; for tests and experiments."""
    total = 0
    overlapping = False
    try:
        with open(smaps) as handle:
            for line in handle:
                header = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
                if header:
                    low, high = int(header.group(1), 16), int(header.group(2), 16)
                    overlapping = low < address + nbytes and address < high
                elif overlapping and line.startswith("AnonHugePages:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return None
    return total
