"""Schedules: how the loops of a tensor-expression kernel are arranged, as replayable plain data.

A `Schedule` is made for the output tensors of a kernel. Every tensor of the kernel has a *stage*
named after it; a compute stage starts as one loop per axis (spatial axes, then reduction axes, named
after the compute's index variables). Primitives then transform stages and their loops:

- loop structure: `split` (by an inner `factor`, by `nparts`, or into several levels), `tile` (2-D
  split + reorder), `reorder`, `fuse`;
- loop annotations: `vectorize`, `unroll`, `parallel`, `bind` (a GPU thread/block index);
- placement: `compute_inline` (substitute an injective stage into its consumers), `compute_at`
  (compute a producer inside a loop of its consumer, just the region that loop iteration needs),
  `compute_root` (undo either);
- new stages: `cache_write` (compute a stage into a scratch buffer, e.g. a register tile of
  accumulators, and copy it out), `cache_read` (stage a tensor through `shared` memory for its
  readers), `transform_layout` (read an input through a packed layout such as `NK` -> `NK32n`; the
  packed array becomes a kernel parameter and `LayoutTransform.pack` prepares it once).

Loops are named deterministically: splitting `i` gives `i.0` (outer) and `i.1` (inner), fusing `a`
and `b` gives `a.b.fused`, `cache_write("C", "local")` creates stage `C.local`. Every call is recorded
as a `Step` (a frozen dataclass of names, ints and strings) in `schedule.steps`; steps serialise to
JSON-able dicts and `Schedule.replay(steps, outputs)` rebuilds the same schedule. Invalid steps raise
`ScheduleError` immediately; a few properties that only make sense for the final schedule (e.g. a
vectorized loop must end up innermost) are checked by `lower`.

Loop extents are not fixed by the steps: a stage placed with `compute_at` only iterates over the
region its consumer needs, which bound inference decides when the schedule is lowered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from relay_tune.errors import RelayTuneError
from relay_tune.kernel import analysis, te, tir
from relay_tune.kernel.tir import ForKind, PrimExpr, Scope


class ScheduleError(RelayTuneError):
    """A schedule step that is invalid for the kernel it is applied to."""


# ---------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------

_STEP_TYPES: dict[str, type[Step]] = {}


@dataclass(frozen=True)
class Step:
    """One recorded schedule primitive. Subclasses hold only names, ints and strings."""

    KIND: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.KIND:
            _STEP_TYPES[cls.KIND] = cls

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.KIND}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def step_from_json(data: dict[str, Any]) -> Step:
    """The step a `Step.to_json()` dict describes."""
    try:
        cls = _STEP_TYPES[data["kind"]]
    except KeyError:
        raise ScheduleError(f"unknown schedule step {data.get('kind')!r}") from None
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            raise ScheduleError(f"schedule step {cls.KIND!r} is missing field {f.name!r}")
        value = data[f.name]
        kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


@dataclass(frozen=True)
class Split(Step):
    """`factors` lists the extents of the new loops, outermost first, with one `None` for the part
    derived from the loop's extent: `(None, 8)` splits by an inner factor 8, `(4, None)` into 4 outer
    parts, `(None, 4, 16)` into three levels."""

    KIND: ClassVar[str] = "split"
    stage: str
    loop: str
    factors: tuple[int | None, ...]


@dataclass(frozen=True)
class Fuse(Step):
    KIND: ClassVar[str] = "fuse"
    stage: str
    loops: tuple[str, ...]


@dataclass(frozen=True)
class Reorder(Step):
    KIND: ClassVar[str] = "reorder"
    stage: str
    order: tuple[str, ...]


@dataclass(frozen=True)
class Vectorize(Step):
    KIND: ClassVar[str] = "vectorize"
    stage: str
    loop: str


@dataclass(frozen=True)
class Unroll(Step):
    KIND: ClassVar[str] = "unroll"
    stage: str
    loop: str


@dataclass(frozen=True)
class Parallel(Step):
    KIND: ClassVar[str] = "parallel"
    stage: str
    loop: str


@dataclass(frozen=True)
class Bind(Step):
    KIND: ClassVar[str] = "bind"
    stage: str
    loop: str
    thread_tag: str


@dataclass(frozen=True)
class ComputeInline(Step):
    KIND: ClassVar[str] = "compute_inline"
    stage: str


@dataclass(frozen=True)
class ComputeAt(Step):
    KIND: ClassVar[str] = "compute_at"
    stage: str
    target: str
    loop: str


@dataclass(frozen=True)
class ComputeRoot(Step):
    KIND: ClassVar[str] = "compute_root"
    stage: str


@dataclass(frozen=True)
class CacheWrite(Step):
    KIND: ClassVar[str] = "cache_write"
    stage: str
    scope: str


@dataclass(frozen=True)
class CacheRead(Step):
    KIND: ClassVar[str] = "cache_read"
    tensor: str
    scope: str
    readers: tuple[str, ...]


@dataclass(frozen=True)
class TransformLayout(Step):
    KIND: ClassVar[str] = "transform_layout"
    tensor: str
    src_layout: str
    dst_layout: str


# ---------------------------------------------------------------------------------------------
# Loop relations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitRel:
    parent: str
    children: tuple[str, ...]
    factors: tuple[int | None, ...]

    def child_extents(self, parent_extent: int) -> tuple[int, ...]:
        """Extents of the new loops; the derived one is the ceiling division (tails are guarded)."""
        if self.factors[0] is None:
            inner = [int(f) for f in self.factors[1:]]  # type: ignore[arg-type]
            prod = 1
            for f in inner:
                prod *= f
            return (-(-parent_extent // prod), *inner)
        nparts = int(self.factors[0])
        inner_extent = -(-parent_extent // nparts)
        # never more outer iterations than needed to cover the extent (no all-empty iterations)
        return (-(-parent_extent // inner_extent), inner_extent)


@dataclass(frozen=True)
class FuseRel:
    children: tuple[str, ...]
    fused: str


Relation = SplitRel | FuseRel


def derive_extents(root_extents: dict[str, int], relations: Sequence[Relation]) -> dict[str, int]:
    """Extent of every loop (root and derived) from the extents of the root axes."""
    extents = dict(root_extents)
    for rel in relations:
        if isinstance(rel, SplitRel):
            for name, ext in zip(rel.children, rel.child_extents(extents[rel.parent])):
                extents[name] = ext
        else:
            n = 1
            for c in rel.children:
                n *= extents[c]
            extents[rel.fused] = n
    return extents


# ---------------------------------------------------------------------------------------------
# Layout transforms (packing of inputs)
# ---------------------------------------------------------------------------------------------

_LAYOUT_TOKEN = re.compile(r"(\d*)([A-Za-z])")


def _parse_dst_layout(src: str, dst: str) -> tuple[tuple[str, int | None], ...]:
    """Tokens of the packed layout: `(letter, None)` for a primal axis, `(letter, factor)` for the inner
    part of a split one (`NK32n` -> N/32, K, 32)."""
    if not src or not src.isalpha() or not src.isupper() or len(set(src)) != len(src):
        raise ScheduleError(f"source layout {src!r} must be distinct upper-case letters, one per axis (e.g. 'NK')")
    tokens: list[tuple[str, int | None]] = []
    pos = 0
    for m in _LAYOUT_TOKEN.finditer(dst):
        if m.start() != pos:
            break
        pos = m.end()
        digits, letter = m.groups()
        if letter.isupper():
            if digits:
                raise ScheduleError(f"layout {dst!r}: primal axis {letter} cannot have a factor")
            tokens.append((letter, None))
        else:
            if not digits or int(digits) <= 0:
                raise ScheduleError(f"layout {dst!r}: split axis {letter} needs a positive factor")
            tokens.append((letter, int(digits)))
    if pos != len(dst) or not dst:
        raise ScheduleError(f"invalid layout {dst!r}")
    primals = [t for t, f in tokens if f is None]
    subs = [t for t, f in tokens if f is not None]
    if sorted(primals) != sorted(src):
        raise ScheduleError(f"layout {dst!r} must name each axis of {src!r} once in upper case")
    if len(set(subs)) != len(subs) or any(s.upper() not in src for s in subs):
        raise ScheduleError(f"layout {dst!r}: each split axis must be a distinct axis of {src!r}")
    return tuple(tokens)


@dataclass(frozen=True)
class LayoutTransform:
    """An input read through a packed layout. `pack` turns the source array into the packed kernel
    argument (padding split axes with zeros up to a multiple of the factor)."""

    source: str
    packed: str
    src_layout: str
    dst_layout: str
    src_shape: tuple[int, ...]
    dtype: str

    @property
    def tokens(self) -> tuple[tuple[str, int | None], ...]:
        return _parse_dst_layout(self.src_layout, self.dst_layout)

    def _factor(self, letter: str) -> int | None:
        for t, f in self.tokens:
            if f is not None and t == letter.lower():
                return f
        return None

    @property
    def packed_shape(self) -> tuple[int, ...]:
        dims = dict(zip(self.src_layout, self.src_shape))
        shape: list[int] = []
        for t, f in self.tokens:
            if f is None:
                sub = self._factor(t)
                shape.append(dims[t] if sub is None else -(-dims[t] // sub))
            else:
                shape.append(f)
        return tuple(shape)

    def index_map(self, indices: Sequence[PrimExpr]) -> tuple[PrimExpr, ...]:
        """Packed-array index of the source element at `indices`."""
        by_letter = dict(zip(self.src_layout, indices))
        out: list[PrimExpr] = []
        for t, f in self.tokens:
            if f is None:
                sub = self._factor(t)
                out.append(by_letter[t] if sub is None else by_letter[t] // sub)
            else:
                out.append(by_letter[t.upper()] % f)
        return tuple(out)

    def pack(self, array: np.ndarray) -> np.ndarray:
        """The packed array for a source array (apply once to constant weights)."""
        a = np.asarray(array)
        if tuple(a.shape) != self.src_shape:
            raise ScheduleError(f"pack {self.source}: expected shape {self.src_shape}, got {a.shape}")
        pads = []
        split_shape: list[int] = []
        axis_names: list[str] = []
        for letter, dim in zip(self.src_layout, self.src_shape):
            sub = self._factor(letter)
            if sub is None:
                pads.append((0, 0))
                split_shape.append(dim)
                axis_names.append(letter)
            else:
                outer = -(-dim // sub)
                pads.append((0, outer * sub - dim))
                split_shape += [outer, sub]
                axis_names += [letter, letter.lower()]
        padded = np.pad(a, pads) if any(p for _, p in pads) else a
        order = [axis_names.index(t) for t, _ in self.tokens]
        return np.ascontiguousarray(padded.reshape(split_shape).transpose(order))

    def pack_compute(self) -> tuple[te.Tensor, te.Tensor]:
        """The packing as a tensor expression `(source placeholder, packed tensor)`, for packing at run
        time (lower it with `Schedule([packed])`)."""
        src = te.placeholder(self.src_shape, self.dtype, self.source)
        names = [t if f is None else f"{t}{f}" for t, f in self.tokens]
        dims = dict(zip(self.src_layout, self.src_shape))

        def fcompute(*idx: PrimExpr) -> PrimExpr:
            pos = {names[i]: idx[i] for i in range(len(names))}
            source_index: list[PrimExpr] = []
            conds: list[PrimExpr] = []
            for letter in self.src_layout:
                sub = self._factor(letter)
                if sub is None:
                    source_index.append(pos[letter])
                else:
                    value = pos[letter] * sub + pos[f"{letter.lower()}{sub}"]
                    source_index.append(value)
                    if dims[letter] % sub:
                        conds.append(value < dims[letter])
            read = src[tuple(source_index)]
            if not conds:
                return read
            return te.if_then_else(te.all_of(*conds), read, te.const(0, self.dtype))

        packed = te.compute(self.packed_shape, fcompute, self.packed)
        return src, packed

    def pack_schedule(self) -> Schedule:
        """The CPU schedule of the run-time packing kernel (`pack_compute`), lowered with `lower(...)`.

        Packing a weight that is a model input runs before its kernel on every call, so it is scheduled, not left
        as one serial loop nest (experiments/README.md has the variants' times):

        - when the last packed axis is the source's innermost axis the copy is contiguous on both sides: that
          loop is vectorized;
        - otherwise (e.g. `NK -> NK16n`) the packing is a transposition: the last packed axis walks the source
          with a large stride. Vectorizing it turns every store into a gather of 16 rows (measured no faster
          than the serial nest), and walking source rows one element at a time misses the caches (rows 4 KiB
          apart all map to the same L1 sets). So the loop over the source's innermost axis is blocked by
          `PACK_BLOCK` elements (a 64-byte line of fp32) and that block is unrolled innermost, each row read a
          line at a time; a last packed axis wider than `PACK_PANEL_MAX` is split in two so the unrolled body
          stays small;
        - the outer loops (fused while fewer than `PACK_PARALLEL_MIN_EXTENT` iterations) run in parallel,
          when the packed tensor has at least `PACK_PARALLEL_MIN_ELEMENTS` elements (smaller ones cost less
          than waking the thread team).
        """
        _src, packed = self.pack_compute()
        sch = Schedule([packed])
        stage = packed.name
        rank = len(self.tokens)
        extents = list(self.packed_shape)
        leaves = [f"ax{i}" for i in range(rank)]
        # the packed axis that walks the source with stride 1: the source's innermost axis (its sub-axis if split)
        inner = self.src_layout[-1]
        wanted = (inner.lower(), self._factor(inner)) if self._factor(inner) is not None else (inner, None)
        contiguous = self.tokens.index(wanted)
        outer = leaves[: rank - 1]  # the loops that may run in parallel, outermost first
        if contiguous == rank - 1:
            if extents[-1] > 1:
                sch.vectorize(stage, leaves[-1])
        elif extents[contiguous] > 1:
            block_loops = [leaves[contiguous]]
            if extents[contiguous] > PACK_BLOCK:
                block_loops = list(sch.split(stage, leaves[contiguous], factor=PACK_BLOCK))
            panel_loops = [leaves[-1]]
            if extents[-1] > PACK_PANEL_MAX:
                panel_loops = list(sch.split(stage, leaves[-1], factor=PACK_PANEL_SPLIT))
                sch.unroll(stage, panel_loops[-1])
            between = leaves[contiguous + 1 : rank - 1]
            sch.reorder(stage, *block_loops[:-1], *between, *panel_loops, block_loops[-1])
            sch.unroll(stage, block_loops[-1])
            outer = leaves[:contiguous] + block_loops[:-1]
        if outer and math.prod(extents) >= PACK_PARALLEL_MIN_ELEMENTS:
            fused, extent = outer[0], sch[stage].loop_extents()[outer[0]]
            for name in outer[1:]:
                if extent >= PACK_PARALLEL_MIN_EXTENT:
                    break
                extent *= sch[stage].loop_extents()[name]
                fused = sch.fuse(stage, fused, name)
            if extent > 1:
                sch.parallel(stage, fused)
        return sch


# Run-time packing kernels (`LayoutTransform.pack_schedule`): elements of a source row read per unrolled block
# (16 fp32: one cache line), the widest last packed axis unrolled whole and the part it is split into beyond that,
# and when the outer loops run on a thread team.
PACK_BLOCK = 16
PACK_PANEL_MAX = 32
PACK_PANEL_SPLIT = 8
PACK_PARALLEL_MIN_EXTENT = 8
PACK_PARALLEL_MIN_ELEMENTS = 4096


# ---------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------


@dataclass
class Loop:
    name: str
    is_reduce: bool
    kind: ForKind = ForKind.SERIAL
    thread_tag: str | None = None


ROOT = "root"
INLINE = "inline"
AT = "at"


@dataclass
class Stage:
    """The schedule state of one tensor. `op` is the stage's current definition (cache steps rewrite
    it); `tensor` is what consumers read."""

    name: str
    tensor: te.Tensor
    op: te.ComputeOp | None
    axis_names: tuple[str, ...] = ()
    leaves: list[str] = field(default_factory=list)
    loops: dict[str, Loop] = field(default_factory=dict)
    relations: list[Relation] = field(default_factory=list)
    attach: str = ROOT
    attach_target: str | None = None
    attach_loop: str | None = None
    scope: Scope | None = None  # None: chosen by lowering (global at the root, local when attached)
    is_output: bool = False
    layout: LayoutTransform | None = None  # set on a packed input

    @property
    def is_placeholder(self) -> bool:
        return self.op is None

    @property
    def root_axes(self) -> tuple[te.IterVar, ...]:
        if self.op is None:
            return ()
        return tuple(self.op.axes) + tuple(self.op.reduce_axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape

    def root_extents(self) -> dict[str, int]:
        return {n: ax.extent for n, ax in zip(self.axis_names, self.root_axes)}

    def loop_extents(self, spatial_extents: Sequence[int] | None = None) -> dict[str, int]:
        """Extents of every loop; the spatial root axes take `spatial_extents` when given (the region
        of an attached stage), the full shape otherwise."""
        roots = self.root_extents()
        if spatial_extents is not None:
            for name, ext in zip(self.axis_names, spatial_extents):
                roots[name] = ext
        return derive_extents(roots, self.relations)

    def _reset_loops(self) -> None:
        names: list[str] = []
        for ax in self.root_axes:
            name, n = ax.name, 0
            while name in names:
                n += 1
                name = f"{ax.name}_{n}"
            names.append(name)
        self.axis_names = tuple(names)
        self.leaves = list(names)
        self.loops = {n: Loop(n, ax.kind == te.REDUCE) for n, ax in zip(names, self.root_axes)}
        self.relations = []


def rewrite_reads(expr: PrimExpr, fn: Callable[[te.TensorRead], PrimExpr | None]) -> PrimExpr:
    """Rebuild `expr` with every tensor read replaced by `fn(read)` (or kept when it returns None)."""

    def visit(node: PrimExpr, kids: list[PrimExpr]) -> PrimExpr:
        new = analysis.with_children(node, kids)
        if isinstance(new, te.TensorRead):
            replaced = fn(new)
            if replaced is not None:
                return replaced
        return new

    return analysis.fold(expr, visit)


def _rewrite_op(op: te.ComputeOp, fn: Callable[[te.TensorRead], PrimExpr | None]) -> te.ComputeOp:
    body = rewrite_reads(op.body, fn)
    return op if body is op.body else te.ComputeOp(op.axes, body, op.tag)


# ---------------------------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------------------------

StageRef = str | te.Tensor


class Schedule:
    """Schedule state for a kernel computing `outputs`; see the module docstring."""

    def __init__(self, outputs: te.Tensor | Sequence[te.Tensor]) -> None:
        outs = (outputs,) if isinstance(outputs, te.Tensor) else tuple(outputs)
        if not outs:
            raise ScheduleError("a schedule needs at least one output tensor")
        for i, t in enumerate(outs):
            if t.is_placeholder:
                raise ScheduleError(f"output {t.name} is an input placeholder; outputs must be computed tensors")
            if any(t is other for other in outs[:i]):
                raise ScheduleError(f"output {t.name} is listed twice")
        self.outputs: tuple[te.Tensor, ...] = outs
        self.steps: list[Step] = []
        self.layout_transforms: list[LayoutTransform] = []
        self._last_created = ""  # name of the stage the last cache/layout step created
        self.stages: dict[str, Stage] = {}  # insertion order is a topological order (producers first)
        self._by_tensor: dict[int, str] = {}
        for tensor in te.post_order_tensors(outs):
            stage = Stage(self._unique_name(tensor.name), tensor, None if tensor.is_placeholder else tensor.op)
            stage._reset_loops()
            stage.is_output = any(tensor is o for o in outs)
            self._add_stage(stage)

    # -- construction helpers
    def _unique_name(self, base: str) -> str:
        name, n = base, 0
        while name in self.stages:
            n += 1
            name = f"{base}_{n}"
        return name

    def _add_stage(self, stage: Stage, before: str | None = None, after: str | None = None) -> None:
        self._by_tensor[id(stage.tensor)] = stage.name
        if before is None and after is None:
            self.stages[stage.name] = stage
            return
        items = list(self.stages.items())
        anchor = before if before is not None else after
        index = [n for n, _ in items].index(anchor) + (0 if before is not None else 1)
        items.insert(index, (stage.name, stage))
        self.stages = dict(items)

    @classmethod
    def replay(cls, steps: Sequence[Step | dict[str, Any]], outputs: te.Tensor | Sequence[te.Tensor]) -> Schedule:
        """Rebuild a schedule from recorded steps (or their JSON dicts)."""
        sch = cls(outputs)
        for step in steps:
            sch.apply(step_from_json(step) if isinstance(step, dict) else step)
        return sch

    def steps_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.steps]

    # -- queries
    def stage_name(self, ref: StageRef) -> str:
        if isinstance(ref, te.Tensor):
            try:
                return self._by_tensor[id(ref)]
            except KeyError:
                raise ScheduleError(f"tensor {ref.name} is not part of this schedule") from None
        if ref not in self.stages:
            raise ScheduleError(f"no stage named {ref!r} (stages: {', '.join(self.stages)})")
        return ref

    def __getitem__(self, ref: StageRef) -> Stage:
        return self.stages[self.stage_name(ref)]

    def stage_of_tensor(self, tensor: te.Tensor) -> Stage | None:
        name = self._by_tensor.get(id(tensor))
        return None if name is None else self.stages[name]

    def leaves(self, ref: StageRef) -> tuple[str, ...]:
        """The current loops of a stage, outermost first."""
        return tuple(self[ref].leaves)

    def readers(self, ref: StageRef) -> list[str]:
        """Stages whose definition reads this stage's tensor directly."""
        tensor = self[ref].tensor
        out = []
        for stage in self.stages.values():
            if stage.op is not None and any(t is tensor for t in te.tensors_read(stage.op.body)):
                out.append(stage.name)
        return out

    def _producers_closure(self, name: str) -> set[str]:
        """All stages `name` depends on (through definitions)."""
        seen: set[str] = set()
        stack = [name]
        while stack:
            st = self.stages[stack.pop()]
            if st.op is None:
                continue
            for t in te.tensors_read(st.op.body):
                p = self._by_tensor.get(id(t))
                if p is not None and p not in seen:
                    seen.add(p)
                    stack.append(p)
        return seen

    # -- validation helpers
    def _compute_stage(self, ref: str, what: str) -> Stage:
        stage = self[ref]
        if stage.op is None:
            raise ScheduleError(f"{what}: {stage.name} is an input; only computed stages can be scheduled")
        return stage

    def _leaf(self, stage: Stage, loop: str, what: str) -> Loop:
        if loop not in stage.loops:
            raise ScheduleError(f"{what}: stage {stage.name} has no loop {loop!r} (loops: {', '.join(stage.leaves)})")
        if loop not in stage.leaves:
            raise ScheduleError(
                f"{what}: loop {loop!r} of {stage.name} was already split or fused (loops: {', '.join(stage.leaves)})"
            )
        return stage.loops[loop]

    def _check_not_inlined(self, stage: Stage, what: str) -> None:
        if stage.attach == INLINE:
            raise ScheduleError(f"{what}: stage {stage.name} is inlined and has no loops of its own")

    def _check_no_attachments(self, stage: Stage, loop: str, what: str) -> None:
        for other in self.stages.values():
            if other.attach == AT and other.attach_target == stage.name and other.attach_loop == loop:
                raise ScheduleError(
                    f"{what}: stage {other.name} is computed at loop {loop!r} of {stage.name}; "
                    f"transform the loop before compute_at"
                )

    def _new_loop_name(self, stage: Stage, name: str) -> str:
        if name in stage.loops:
            raise ScheduleError(f"stage {stage.name} already has a loop named {name!r}")
        return name

    # -- public primitives
    def apply(self, step: Step) -> None:
        """Validate and apply one step, then record it."""
        handler = getattr(self, f"_apply_{step.KIND}", None)
        if handler is None:
            raise ScheduleError(f"unknown schedule step {step.KIND!r}")
        handler(step)
        self.steps.append(step)

    def split(
        self,
        stage: StageRef,
        loop: str,
        factor: int | None = None,
        nparts: int | None = None,
        factors: Sequence[int | None] | None = None,
    ) -> tuple[str, ...]:
        """Split a loop; returns the new loop names, outermost first. Give exactly one of `factor`
        (inner extent), `nparts` (outer extent) or `factors` (see `Split`). Factors need not divide
        the extent: the last partial iteration is guarded (and peeled by lowering)."""
        given = [x is not None for x in (factor, nparts, factors)]
        if sum(given) != 1:
            raise ScheduleError("split needs exactly one of factor=, nparts= or factors=")
        if factor is not None:
            fs: tuple[int | None, ...] = (None, factor)
        elif nparts is not None:
            fs = (nparts, None)
        else:
            fs = tuple(factors)  # type: ignore[arg-type]
        name = self.stage_name(stage)
        self.apply(Split(name, loop, fs))
        return tuple(f"{loop}.{i}" for i in range(len(fs)))

    def tile(
        self, stage: StageRef, x: str, y: str, x_factor: int, y_factor: int
    ) -> tuple[str, str, str, str]:
        """Split `x` and `y` and order the loops `x.0, y.0, x.1, y.1` (recorded as two splits and a reorder)."""
        xo, xi = self.split(stage, x, factor=x_factor)
        yo, yi = self.split(stage, y, factor=y_factor)
        self.reorder(stage, xo, yo, xi, yi)
        return xo, yo, xi, yi

    def reorder(self, stage: StageRef, *loops: str) -> None:
        """Put the given loops in this order, in the positions they occupy together."""
        self.apply(Reorder(self.stage_name(stage), tuple(loops)))

    def fuse(self, stage: StageRef, *loops: str) -> str:
        """Fuse adjacent loops (outermost first) into one; returns its name."""
        self.apply(Fuse(self.stage_name(stage), tuple(loops)))
        return ".".join(loops) + ".fused"

    def vectorize(self, stage: StageRef, loop: str) -> None:
        self.apply(Vectorize(self.stage_name(stage), loop))

    def unroll(self, stage: StageRef, loop: str) -> None:
        self.apply(Unroll(self.stage_name(stage), loop))

    def parallel(self, stage: StageRef, loop: str) -> None:
        self.apply(Parallel(self.stage_name(stage), loop))

    def bind(self, stage: StageRef, loop: str, thread_tag: str) -> None:
        self.apply(Bind(self.stage_name(stage), loop, thread_tag))

    def compute_inline(self, stage: StageRef) -> None:
        self.apply(ComputeInline(self.stage_name(stage)))

    def compute_at(self, stage: StageRef, target: StageRef, loop: str) -> None:
        self.apply(ComputeAt(self.stage_name(stage), self.stage_name(target), loop))

    def compute_root(self, stage: StageRef) -> None:
        self.apply(ComputeRoot(self.stage_name(stage)))

    def cache_write(self, stage: StageRef, scope: str = "local") -> str:
        """Compute `stage` into a new stage `<stage>.<scope>`; `stage` becomes a copy out of it."""
        name = self.stage_name(stage)
        self.apply(CacheWrite(name, scope))
        return f"{name}.{scope}"

    def cache_read(self, tensor: StageRef, scope: str, readers: Sequence[StageRef]) -> str:
        """Stage `tensor` through a copy `<tensor>.<scope>` that `readers` read instead."""
        name = self.stage_name(tensor)
        step = CacheRead(name, scope, tuple(self.stage_name(r) for r in readers))
        self.apply(step)
        return self._last_created

    def transform_layout(self, tensor: StageRef, src_layout: str, dst_layout: str) -> str:
        """Read input `tensor` through a packed copy in `dst_layout`; returns the packed stage name."""
        name = self.stage_name(tensor)
        self.apply(TransformLayout(name, src_layout, dst_layout))
        return self._last_created

    # -- step handlers
    def _apply_split(self, step: Split) -> None:
        stage = self._compute_stage(step.stage, "split")
        self._check_not_inlined(stage, "split")
        loop = self._leaf(stage, step.loop, "split")
        fs = tuple(step.factors)
        if len(fs) < 2:
            raise ScheduleError(f"split of {step.loop!r}: give at least two factors, got {list(fs)}")
        nones = [i for i, f in enumerate(fs) if f is None]
        if len(nones) != 1 or not (nones[0] == 0 or (nones[0] == 1 and len(fs) == 2)):
            raise ScheduleError(
                f"split of {step.loop!r}: factors {list(fs)} need exactly one None, first (inner factors given) "
                f"or second of two (number of outer parts given)"
            )
        for f in fs:
            if f is not None and (not isinstance(f, int) or isinstance(f, bool) or f < 1):
                raise ScheduleError(f"split of {step.loop!r}: factors must be positive integers, got {list(fs)}")
        if loop.kind is not ForKind.SERIAL:
            raise ScheduleError(
                f"split of {step.loop!r}: the loop is already {loop.kind.value}; split before annotating"
            )
        self._check_no_attachments(stage, step.loop, "split")
        children = tuple(self._new_loop_name(stage, f"{step.loop}.{i}") for i in range(len(fs)))
        stage.relations.append(SplitRel(step.loop, children, fs))
        pos = stage.leaves.index(step.loop)
        stage.leaves[pos : pos + 1] = list(children)
        for c in children:
            stage.loops[c] = Loop(c, loop.is_reduce)

    def _apply_fuse(self, step: Fuse) -> None:
        stage = self._compute_stage(step.stage, "fuse")
        self._check_not_inlined(stage, "fuse")
        if len(step.loops) < 2:
            raise ScheduleError("fuse needs at least two loops")
        loops = [self._leaf(stage, n, "fuse") for n in step.loops]
        positions = [stage.leaves.index(n) for n in step.loops]
        if positions != list(range(positions[0], positions[0] + len(positions))):
            raise ScheduleError(
                f"fuse: loops {list(step.loops)} of {stage.name} are not adjacent in this order "
                f"(loops: {', '.join(stage.leaves)})"
            )
        if len({lp.is_reduce for lp in loops}) != 1:
            raise ScheduleError(f"fuse: cannot fuse spatial and reduction loops ({', '.join(step.loops)})")
        for lp in loops:
            if lp.kind is not ForKind.SERIAL:
                raise ScheduleError(f"fuse: loop {lp.name!r} is already {lp.kind.value}; fuse before annotating")
            self._check_no_attachments(stage, lp.name, "fuse")
        fused = self._new_loop_name(stage, ".".join(step.loops) + ".fused")
        stage.relations.append(FuseRel(tuple(step.loops), fused))
        stage.leaves[positions[0] : positions[-1] + 1] = [fused]
        stage.loops[fused] = Loop(fused, loops[0].is_reduce)

    def _apply_reorder(self, step: Reorder) -> None:
        stage = self._compute_stage(step.stage, "reorder")
        self._check_not_inlined(stage, "reorder")
        for n in step.order:
            self._leaf(stage, n, "reorder")
        if len(set(step.order)) != len(step.order):
            raise ScheduleError(f"reorder: a loop is listed twice in {list(step.order)}")
        positions = sorted(stage.leaves.index(n) for n in step.order)
        for pos, name in zip(positions, step.order):
            stage.leaves[pos] = name

    def _annotate(self, stage_name: str, loop_name: str, kind: ForKind, tag: str | None, what: str) -> None:
        stage = self._compute_stage(stage_name, what)
        self._check_not_inlined(stage, what)
        loop = self._leaf(stage, loop_name, what)
        if loop.is_reduce and kind is ForKind.VECTORIZED:
            raise ScheduleError(
                f"vectorize: {loop_name!r} of {stage.name} is a reduction loop; its lanes would race on one "
                f"accumulator (vectorize a spatial loop, placed innermost)"
            )
        if loop.is_reduce and kind is ForKind.PARALLEL:
            raise ScheduleError(f"parallel: {loop_name!r} of {stage.name} is a reduction loop; threads would race")
        if loop.is_reduce and kind is ForKind.THREAD_BINDING:
            raise ScheduleError(f"bind: {loop_name!r} of {stage.name} is a reduction loop (cross-thread reduction "
                                f"is not supported)")
        if kind is ForKind.THREAD_BINDING:
            if tag not in tir.THREAD_TAGS:
                raise ScheduleError(f"bind: unknown thread tag {tag!r}; expected one of {sorted(tir.THREAD_TAGS)}")
            for other in stage.leaves:
                if other != loop_name and stage.loops[other].thread_tag == tag:
                    raise ScheduleError(f"bind: {tag} is already bound to loop {other!r} of {stage.name}")
        loop.kind = kind
        loop.thread_tag = tag

    def _apply_vectorize(self, step: Vectorize) -> None:
        self._annotate(step.stage, step.loop, ForKind.VECTORIZED, None, "vectorize")

    def _apply_unroll(self, step: Unroll) -> None:
        self._annotate(step.stage, step.loop, ForKind.UNROLLED, None, "unroll")

    def _apply_parallel(self, step: Parallel) -> None:
        self._annotate(step.stage, step.loop, ForKind.PARALLEL, None, "parallel")

    def _apply_bind(self, step: Bind) -> None:
        self._annotate(step.stage, step.loop, ForKind.THREAD_BINDING, step.thread_tag, "bind")

    def _check_movable(self, stage: Stage, what: str) -> None:
        if stage.is_output:
            raise ScheduleError(f"{what}: {stage.name} is an output of the kernel; it must be computed at the root")

    def _apply_compute_inline(self, step: ComputeInline) -> None:
        stage = self._compute_stage(step.stage, "compute_inline")
        self._check_movable(stage, "compute_inline")
        assert stage.op is not None
        if stage.op.is_reduction:
            raise ScheduleError(f"compute_inline: {stage.name} is a reduction; only injective stages can be inlined")
        for loop in stage.leaves:
            self._check_no_attachments(stage, loop, "compute_inline")
        stage.attach, stage.attach_target, stage.attach_loop = INLINE, None, None

    def _apply_compute_at(self, step: ComputeAt) -> None:
        stage = self._compute_stage(step.stage, "compute_at")
        self._check_movable(stage, "compute_at")
        target = self._compute_stage(step.target, "compute_at")
        if target is stage:
            raise ScheduleError(f"compute_at: cannot compute {stage.name} inside itself")
        self._check_not_inlined(target, "compute_at")
        loop = self._leaf(target, step.loop, "compute_at")
        if stage.name not in self._producers_closure(target.name):
            raise ScheduleError(f"compute_at: {target.name} does not read {stage.name}; attach a stage to a consumer")
        if loop.kind is ForKind.VECTORIZED:
            raise ScheduleError(f"compute_at: loop {step.loop!r} of {target.name} is vectorized")
        stage.attach, stage.attach_target, stage.attach_loop = AT, target.name, step.loop

    def _apply_compute_root(self, step: ComputeRoot) -> None:
        stage = self._compute_stage(step.stage, "compute_root")
        stage.attach, stage.attach_target, stage.attach_loop = ROOT, None, None

    def _parse_scope(self, scope: str, what: str) -> Scope:
        try:
            return Scope(scope)
        except ValueError:
            raise ScheduleError(f"{what}: unknown memory scope {scope!r} (global, local, shared)") from None

    def _apply_cache_write(self, step: CacheWrite) -> None:
        stage = self._compute_stage(step.stage, "cache_write")
        scope = self._parse_scope(step.scope, "cache_write")
        fresh = Stage(stage.name, stage.tensor, stage.op)
        fresh._reset_loops()
        if (stage.relations or stage.attach != ROOT or stage.leaves != fresh.leaves
                or any(lp.kind is not ForKind.SERIAL for lp in stage.loops.values())):
            raise ScheduleError(f"cache_write: {stage.name} was already scheduled; apply cache_write first")
        cache_name = f"{stage.name}.{step.scope}"
        if cache_name in self.stages:
            raise ScheduleError(f"cache_write: stage {cache_name} already exists")
        assert stage.op is not None
        cache_tensor = te.Tensor(cache_name, stage.shape, stage.tensor.dtype, stage.op)
        cache = Stage(cache_name, cache_tensor, stage.op, scope=scope)
        cache._reset_loops()
        # the original stage becomes a plain copy out of the cache (which an epilogue can inline)
        axes = tuple(te.IterVar(n, tir.INDEX_DTYPE, ax.extent, te.SPATIAL) for n, ax in zip(stage.axis_names,
                                                                                           stage.op.axes))
        stage.op = te.ComputeOp(axes, cache_tensor[axes], stage.op.tag)
        stage._reset_loops()
        self._add_stage(cache, before=stage.name)
        self._last_created = cache_name

    def _apply_cache_read(self, step: CacheRead) -> None:
        source = self[step.tensor]
        scope = self._parse_scope(step.scope, "cache_read")
        if not step.readers:
            raise ScheduleError("cache_read needs at least one reader stage")
        direct = set(self.readers(source.name))
        for r in step.readers:
            self._compute_stage(r, "cache_read")
            if r not in direct:
                raise ScheduleError(f"cache_read: {r} does not read {source.name}")
        name = self._unique_name(f"{source.name}.{step.scope}")
        axes = tuple(te.IterVar(f"ax{i}", tir.INDEX_DTYPE, e, te.SPATIAL) for i, e in enumerate(source.shape))
        copy_tensor = te.Tensor(name, source.shape, source.tensor.dtype, te.ComputeOp(axes, source.tensor[axes]))
        copy = Stage(name, copy_tensor, copy_tensor.op, scope=scope)  # type: ignore[arg-type]
        copy._reset_loops()
        src_tensor = source.tensor

        def redirect(read: te.TensorRead) -> PrimExpr | None:
            return te.TensorRead(copy_tensor, read.indices, read.dtype) if read.tensor is src_tensor else None

        for r in step.readers:
            reader = self.stages[r]
            assert reader.op is not None
            reader.op = _rewrite_op(reader.op, redirect)
        self._add_stage(copy, after=source.name)
        self._last_created = name

    def _apply_transform_layout(self, step: TransformLayout) -> None:
        source = self[step.tensor]
        if not source.is_placeholder:
            raise ScheduleError(f"transform_layout: {source.name} is computed; only kernel inputs can be packed")
        if len(step.src_layout) != len(source.shape):
            raise ScheduleError(
                f"transform_layout: layout {step.src_layout!r} has {len(step.src_layout)} axes but {source.name} "
                f"has shape {source.shape}"
            )
        _parse_dst_layout(step.src_layout, step.dst_layout)
        name = self._unique_name(f"{source.name}.packed")
        lt = LayoutTransform(source.name, name, step.src_layout, step.dst_layout, source.shape, source.tensor.dtype)
        packed = te.placeholder(lt.packed_shape, source.tensor.dtype, name)
        stage = Stage(name, packed, None, layout=lt)
        src_tensor = source.tensor

        def to_packed(read: te.TensorRead) -> PrimExpr | None:
            if read.tensor is not src_tensor:
                return None
            return te.TensorRead(packed, lt.index_map(read.indices), read.dtype)

        for other in self.stages.values():
            if other.op is not None:
                other.op = _rewrite_op(other.op, to_packed)
        self._add_stage(stage, after=source.name)
        self.layout_transforms.append(lt)
        self._last_created = name


__all__ = [
    "AT", "INLINE", "ROOT", "Bind", "CacheRead", "CacheWrite", "ComputeAt", "ComputeInline", "ComputeRoot", "Fuse",
    "FuseRel", "LayoutTransform", "Loop", "Parallel", "Reorder", "Schedule", "ScheduleError", "Split", "SplitRel",
    "Stage", "Step", "TransformLayout", "Unroll", "Vectorize", "derive_extents", "rewrite_reads", "step_from_json",
]
