"""Static memory planning: intermediate tensors of a compiled model share one arena.

A compiled model runs its kernels in a fixed order, so the lifetime of every intermediate buffer is known
before the first run: it is written by one step and last read by another. Two buffers whose lifetimes do not
overlap may occupy the same bytes. `plan_memory` assigns every buffer an offset into one arena:

- **greedy by size**: buffers are placed largest first (ties: earlier first), each at the lowest offset
  where it fits beside the already placed buffers whose lifetimes overlap its own (the best-fitting gap
  between them, else after the last of them). Large buffers placed first leave gaps that smaller ones fill.
- lifetimes are *inclusive* step ranges `[first, last]`: a kernel's output is never placed over one of its own
  inputs, because both are live at the step that runs the kernel (kernels do not compute in place).
- every offset and size is a multiple of `alignment` (64 bytes: one cache line, the widest vector load).

The plan also reports what it saved: `arena_bytes` against `naive_bytes` (one buffer per tensor) and
`lower_bound_bytes` (the most bytes live at any one step, which no placement can beat).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_ALIGNMENT = 64


@dataclass(frozen=True)
class BufferLifetime:
    """One buffer to place: `nbytes` live from step `first` (written) to step `last` (last read), inclusive."""

    nbytes: int
    first: int
    last: int

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            raise ValueError(f"a buffer cannot have {self.nbytes} bytes")
        if self.last < self.first:
            raise ValueError(f"buffer lifetime [{self.first}, {self.last}] ends before it starts")

    def overlaps(self, other: BufferLifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class MemoryPlan:
    """Where each buffer lives in the arena (`offsets[i]` for buffer i) and how big the arena is."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]  # aligned sizes
    arena_bytes: int
    naive_bytes: int
    lower_bound_bytes: int
    alignment: int = DEFAULT_ALIGNMENT

    @property
    def saving(self) -> float:
        """Fraction of the one-buffer-per-tensor memory the arena saves (0 when there is nothing to save)."""
        return 1.0 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "offsets": list(self.offsets),
            "sizes": list(self.sizes),
            "arena_bytes": self.arena_bytes,
            "naive_bytes": self.naive_bytes,
            "lower_bound_bytes": self.lower_bound_bytes,
            "alignment": self.alignment,
        }

    @staticmethod
    def from_json(data: dict[str, object]) -> MemoryPlan:
        return MemoryPlan(
            offsets=tuple(int(v) for v in data["offsets"]),  # type: ignore[attr-defined]
            sizes=tuple(int(v) for v in data["sizes"]),  # type: ignore[attr-defined]
            arena_bytes=int(data["arena_bytes"]),  # type: ignore[arg-type]
            naive_bytes=int(data["naive_bytes"]),  # type: ignore[arg-type]
            lower_bound_bytes=int(data["lower_bound_bytes"]),  # type: ignore[arg-type]
            alignment=int(data["alignment"]),  # type: ignore[arg-type]
        )


def align_up(nbytes: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


def plan_memory(buffers: Sequence[BufferLifetime], alignment: int = DEFAULT_ALIGNMENT) -> MemoryPlan:
    """Place `buffers` in one arena, greedily by size over their lifetimes (see the module docstring)."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    # A zero-byte buffer still gets its own (empty) slot: an address must exist even if nothing is stored.
    sizes = [align_up(max(b.nbytes, 1), alignment) for b in buffers]
    order = sorted(range(len(buffers)), key=lambda i: (-sizes[i], buffers[i].first, i))
    offsets = [0] * len(buffers)
    placed: list[int] = []  # indices of placed buffers
    for i in order:
        live = sorted(
            ((offsets[j], offsets[j] + sizes[j]) for j in placed if buffers[j].overlaps(buffers[i])),
        )
        offsets[i] = _best_gap(live, sizes[i])
        placed.append(i)
    arena = max((offsets[i] + sizes[i] for i in range(len(buffers))), default=0)
    return MemoryPlan(
        offsets=tuple(offsets),
        sizes=tuple(sizes),
        arena_bytes=arena,
        naive_bytes=sum(sizes),
        lower_bound_bytes=_peak_live_bytes(buffers, sizes),
        alignment=alignment,
    )


def _best_gap(occupied: list[tuple[int, int]], size: int) -> int:
    """The offset of the smallest free gap of at least `size` bytes among sorted `occupied` ranges, else the end."""
    best: int | None = None
    best_slack = 0
    cursor = 0
    for start, end in occupied:
        if start - cursor >= size:
            slack = start - cursor - size
            if best is None or slack < best_slack:
                best, best_slack = cursor, slack
        cursor = max(cursor, end)
    return cursor if best is None else best


def _peak_live_bytes(buffers: Sequence[BufferLifetime], sizes: Sequence[int]) -> int:
    """The largest total size of buffers live at the same step (sweep over lifetime starts and ends)."""
    events: list[tuple[int, int]] = []
    for buffer, size in zip(buffers, sizes):
        events.append((buffer.first, size))
        events.append((buffer.last + 1, -size))
    # At equal steps, ends (negative) come before starts: a buffer ending at step s-1 is dead at step s.
    events.sort(key=lambda e: (e[0], e[1]))
    peak = live = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def check_plan(buffers: Sequence[BufferLifetime], plan: MemoryPlan) -> None:
    """Raise AssertionError when two buffers with overlapping lifetimes overlap in the arena (for tests)."""
    n = len(buffers)
    for i in range(n):
        if plan.offsets[i] % plan.alignment or plan.offsets[i] + plan.sizes[i] > plan.arena_bytes:
            raise AssertionError(f"buffer {i} is misaligned or outside the arena")
        for j in range(i + 1, n):
            if not buffers[i].overlaps(buffers[j]):
                continue
            a0, a1 = plan.offsets[i], plan.offsets[i] + plan.sizes[i]
            b0, b1 = plan.offsets[j], plan.offsets[j] + plan.sizes[j]
            if a0 < b1 and b0 < a1:
                raise AssertionError(f"buffers {i} and {j} are live together but share bytes")
