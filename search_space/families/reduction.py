"""The `reduction` family: pooling, reductions, softmax, normalisations, and convolutions no other family takes.

Knobs: `vector` (tile width along the innermost output axis) where the reductions read it contiguously
(also where they run across another axis: softmax over channels),
`parallel`; on `NCHW{b}c` pooling that axis is the block, one vector of channels (where a block is narrower than a
vector of the type the kernel computes in, whole blocks of several output columns); `pad` where a pooling window is
padded (the padded input written ahead, or read through a guard).
"""

from __future__ import annotations

import math
from typing import Any

from relay_tune.kernel import te, tir
from relay_tune.kernel.schedule import ROOT, Schedule
from search_space.config import Config
from search_space.families.common import (
    CpuWorkload,
    Family,
    blocked_rows,
    blocked_stage,
    cache_accumulator,
    default_parallel,
    flat_loops,
    inline_cheap,
    pad_stages,
    parallel_choices,
    parallel_worthwhile,
    stage_work,
    vector_choices,
)
from search_space.knobs import ChoiceKnob, Knob
from search_space.space import Constraint

# -- analysis ----------------------------------------------------------------------------------------------------


def _matches(sch: Any, prim: Any, anchor: Any) -> bool:
    return True  # the last family of the table: every reduction the others leave


def _analyse(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int]) -> dict[str, Any]:
    out = sch[prim.outputs[0]]
    mode, last = _reduction_mode(prim, target)
    work = max(stage_work(st) for st in sch.stages.values() if st.op is not None)
    pads = pad_stages(sch)
    blocked = out.op is not None and blocked_stage(out)
    return {"dims": {"last": last}, "lanes": _compute_lanes(sch, target),
            "default_parallel": parallel_worthwhile(target, work),
            "has_pad": bool(pads) and mode != "scalar",
            "extras": {"mode": mode, "blocked": blocked, "columns": int(out.op.axes[-2].extent) if blocked else 0,
                       "dense_window": bool(pads) and _dense_window(pads[0], out)}}


def _compute_lanes(sch: Any, target: Any) -> int:
    """Vector lanes of the widest type the kernel computes in: a pool with a quantizing epilogue (float32 pooled,
    uint8 stored) runs on float32 vectors, so its tile is a float32 vector wide, not a uint8 one."""
    return min(target.vector_lanes(st.tensor.dtype) for st in sch.stages.values() if st.op is not None)


def _dense_window(pad: Any, out: Any) -> bool:
    """Whether a padded window slides by about one position (stride 1): the padded input has fewer than twice the
    output's elements, so every input value is read by each of the window's taps."""
    return math.prod(int(d) for d in pad.tensor.shape) < 2 * math.prod(int(d) for d in out.tensor.shape)


def _reads_contiguously(stage: Any, axis: Any) -> bool:
    for node in te.iter_exprs(stage.op.body):
        if isinstance(node, te.TensorRead) and node.tensor.ndim:
            last = node.indices[-1]
            if last is axis:
                continue
            if (isinstance(last, tir.BinaryOp) and last.op == "add" and (last.a is axis or last.b is axis)
                    and isinstance(last.b if last.a is axis else last.a, te.IterVar)):
                continue
            return False
    return True


def _reduction_mode(prim: Any, target: Any) -> tuple[str, int]:
    """How a reduction family function is tiled: "tiles" (reductions accumulate per vector tile of the innermost
    output axis), "rows" (they run along it, one row at a time), "flat" or "scalar"; and that axis' extent."""
    sch, out, inner = _prepare_reduction(prim)
    leaves = list(sch.leaves(out.name))
    if not leaves:
        return "scalar", 0
    last = out.op.axes[-1].extent
    reductions = [st for st in inner if st.op.is_reduction]
    aligned = all(len(st.op.axes) == len(out.op.axes) and st.op.axes[-1].extent == last
                  and _reads_contiguously(st, st.op.axes[-1]) for st in reductions)
    if last >= 4 and aligned and reductions:
        return "tiles", last
    if last >= 4 and len(leaves) == len(out.op.axes) and _across_axis(out, reductions) is not None:
        return "across", last
    if last >= 4 and len(leaves) >= 2:
        return "rows", last
    return "flat", last


def _across_axis(out: Any, reductions: list[Any]) -> int | None:
    """The output axis that every reduction runs across, where it is not the innermost one: softmax over the
    channels of [N, C, H, W], YOLOv8's box head (softmax over axis 1 of [1, 16, 4, A]). Each reduction has the
    output's axes but that one (matched by name, else by extent where that is unambiguous) and reads its own last
    axis contiguously; None otherwise."""
    axes = out.op.axes
    if not reductions:
        return None
    found: set[int] = set()
    for st in reductions:
        mine = st.op.axes
        if not mine or len(mine) != len(axes) - 1 or not _reads_contiguously(st, mine[-1]):
            return None
        names = [a.name for a in mine]
        by_name = [d for d in range(len(axes)) if [a.name for i, a in enumerate(axes) if i != d] == names]
        by_extent = [d for d in range(len(axes))
                     if [a.extent for i, a in enumerate(axes) if i != d] == [a.extent for a in mine]]
        candidates = by_name or (by_extent if len(by_extent) == 1 else [])
        if len(candidates) != 1:
            return None
        found.add(candidates[0])
    if len(found) != 1 or found == {len(axes) - 1}:
        return None
    return found.pop()


# -- space and default -------------------------------------------------------------------------------------------


def _column_tiles(workload: CpuWorkload) -> bool:
    """Whether the `vector` tile may span output columns: a blocked pooling (`NCHW{b}c`) whose block is narrower
    than one vector (uint8 NCHW8c on AVX2: 8 of 32 lanes) takes whole blocks of several columns, where the output
    has several (a global pool has one)."""
    return (workload.extras["mode"] == "tiles" and bool(workload.extras.get("blocked"))
            and workload.dims["last"] < workload.lanes and workload.extras.get("columns", 0) > 1)


def _vector_choices(workload: CpuWorkload) -> list[int] | None:
    """The `vector` knob's choices, None where the space has no such knob. A choice wider than a blocked output's
    block is that many whole blocks, one per output column (`_column_tiles`)."""
    mode, last, lanes = workload.extras["mode"], workload.dims["last"], workload.lanes
    if _column_tiles(workload):
        most = workload.extras["columns"]
        return [last * columns for columns in (1, 2, 4, 8) if last * columns <= lanes and columns <= most]
    if mode in ("tiles", "across"):
        if last < lanes // 2 and workload.extras.get("blocked"):
            return [last]  # one partial vector: the whole block (uint8 NCHW8c global pooling on AVX2)
        return vector_choices(last, lanes)
    if mode == "rows" and last > lanes:
        return vector_choices(last - 1, lanes)
    return None


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    knobs: list[Knob] = []
    vectors = _vector_choices(workload)
    if vectors is not None:
        knobs.append(ChoiceKnob("vector", vectors))
    if workload.extras["mode"] != "scalar":
        knobs.append(ChoiceKnob("parallel", parallel_choices(workload, 1)))
    if workload.has_pad:  # a padded pooling window: the padded input written ahead, or read through a guard
        knobs.append(ChoiceKnob("pad", ["root", "inline"]))
    return knobs, []


def _later_knobs(workload: CpuWorkload, config: Config) -> Config:
    """`pad` written ahead: pooling configs logged before the knob existed."""
    if workload.has_pad and "pad" not in config:
        return config.replace(pad="root")
    return config


def _default(workload: CpuWorkload) -> dict[str, Any]:
    values: dict[str, Any] = {}
    lanes, mode = workload.lanes, workload.extras["mode"]
    vectors = _vector_choices(workload)
    if vectors is not None:
        # Column tiles by default where a block fills less than half a vector (uint8 NCHW8c on AVX2: 0.13 ms against
        # 0.14 for one block per vector, ResNet-50's stem pool); a float32 NCHW8c block on AVX-512 stays one
        # half-vector per tile, as measured before column tiles existed.
        columns = _column_tiles(workload) and workload.dims["last"] < lanes // 2
        wanted = (lanes if columns else
                  min(workload.dims["last"], 2 * lanes) if mode in ("tiles", "across") else lanes)
        values["vector"] = max((c for c in vectors if c <= wanted), default=vectors[0])
    if mode != "scalar":
        values["parallel"] = default_parallel(workload, 1)
    if workload.has_pad:
        # Read through a guard where rows are not vectorized (pools over 28 columns and less in Inception:
        # 1.05-1.6x faster than a padded copy); a padded copy where they are (3-7x slower inlined: the guard
        # turns each vector load into a masked one). On a blocked layout (NCHW16c) the guard is one condition for
        # the whole vector of a block: read through it where the window strides (ResNet-50's 3x3 stride-2 max
        # pool, 1x256x112x112: 2.4x faster than a padded copy), but copy where it slides by one (Inception's 3x3
        # stride-1 pools on NCHW8c, 6x6 to 56x56: the copy 1.8-2.1x faster, every value read nine times).
        # Tiles of several columns (`_column_tiles`) read the padded copy: through the guard, each lane's clamped
        # column is a gather (uint8 NCHW8c, 3x3 stride 2: about 17x slower than the copy).
        blocked = workload.extras.get("blocked")
        values["pad"] = ("root" if (vectors is not None and not blocked)
                         or (blocked and workload.extras.get("dense_window"))
                         or values.get("vector", 0) > workload.dims["last"] else "inline")
    return values


# -- template ----------------------------------------------------------------------------------------------------


def _prepare_reduction(prim: Any) -> tuple[Any, Any, list[Any]]:
    """A schedule with the reduction family's common start: the output's reduction (if any) accumulated in a
    local tile, cheap stages inlined, pads kept. Returns (schedule, output stage, the other root stages)."""
    sch = Schedule(prim.outputs)
    out = sch[prim.outputs[0]]
    pads = pad_stages(sch)
    keep = {p.name for p in pads}
    if out.op is not None and out.op.is_reduction:
        keep.add(cache_accumulator(sch, out))
    inline_cheap(sch, keep=keep)
    pad_names = {p.name for p in pads}
    inner = [st for st in sch.stages.values()
             if st.op is not None and st is not out and st.attach == ROOT and st.name not in pad_names]
    return sch, out, inner


def _reduction_inside(sch: Any, stage: Any, vectorize: bool, columns: bool = False) -> None:
    """Reduction loops of an attached stage outside its spatial ones, the innermost spatial loop vectorized (with
    `columns`, the last two fused first: a tile of whole channel blocks of several output columns)."""
    leaves = list(sch.leaves(stage.name))
    spatial = [lp for lp in leaves if not stage.loops[lp].is_reduce]
    reduce = [lp for lp in leaves if stage.loops[lp].is_reduce]
    if reduce:
        sch.reorder(stage.name, *reduce, *spatial)
    if columns and len(spatial) >= 2:
        spatial = [*spatial[:-2], sch.fuse(stage.name, *spatial[-2:])]
    if vectorize and spatial:
        sch.vectorize(stage.name, spatial[-1])


def _template_reduction(sch: Any, prim: Any, config: Config, target: Any) -> None:
    # The steps are recorded on the schedule `_prepare_reduction` makes; copy them onto `sch` at the end.
    mine, out, inner = _prepare_reduction(prim)
    mode, last = _reduction_mode(prim, target)
    parallel = bool(config.get("parallel", 0)) and target.num_cores > 1
    for pad in pad_stages(mine):
        if config.get("pad", "root") == "inline":
            mine.compute_inline(pad.name)
        elif blocked_stage(pad):
            blocked_rows(mine, pad, target)  # a blocked pooling's input (NCHW16c)
        else:
            flat_loops(mine, pad, target)
    leaves = list(mine.leaves(out.name))
    if mode == "scalar":
        for st in inner:
            flat_loops(mine, st, target)
    elif mode == "tiles" and int(config["vector"]) > last:  # type: ignore[arg-type]
        # Whole channel blocks of `columns` output columns per vector (`_column_tiles`): the window's loads are
        # strided spans of the input row, which the code generator reads as one load and a shuffle.
        columns = int(config["vector"]) // last  # type: ignore[arg-type]
        co, ci = mine.split(out.name, leaves[-2], factor=columns)
        tile = mine.fuse(out.name, ci, leaves[-1])
        outer = mine.fuse(out.name, *leaves[:-2], co)
        if parallel:
            mine.parallel(out.name, outer)
        mine.vectorize(out.name, tile)
        for st in inner:
            mine.compute_at(st.name, out.name, outer)
            _reduction_inside(mine, st, vectorize=True, columns=True)
    elif mode == "tiles":
        vx = int(config["vector"])  # type: ignore[arg-type]
        wo, wi = mine.split(out.name, leaves[-1], factor=vx)
        outer = leaves[0] if len(leaves) == 2 else (mine.fuse(out.name, *leaves[:-1]) if len(leaves) > 2 else wo)
        if parallel:
            mine.parallel(out.name, outer)
        mine.vectorize(out.name, wi)
        for st in inner:
            mine.compute_at(st.name, out.name, wo)
            _reduction_inside(mine, st, vectorize=True)
    elif mode == "across":
        # One tile of the innermost axis at a time, every position of the reduced axis inside it: the reductions
        # (max, sum) and the element-wise stages are computed once per tile, vectorised along the innermost axis,
        # instead of once per output row (which repeats them for every position of the reduced axis).
        vx = int(config["vector"])  # type: ignore[arg-type]
        across = leaves[_across_axis(out, [st for st in inner if st.op.is_reduction])]  # type: ignore[index]
        wo, wi = mine.split(out.name, leaves[-1], factor=vx)
        outer = [lp for lp in leaves[:-1] if lp != across]
        mine.reorder(out.name, *outer, wo, across, wi)
        tile = mine.fuse(out.name, *outer, wo) if outer else wo
        if parallel:
            mine.parallel(out.name, tile)
        mine.vectorize(out.name, wi)
        for st in inner:
            mine.compute_at(st.name, out.name, tile)
            _reduction_inside(mine, st, vectorize=True)
    elif mode == "rows":
        lanes = int(config["vector"]) if "vector" in config else target.vector_lanes(out.tensor.dtype)  # type: ignore[arg-type]
        row = leaves[0] if len(leaves) == 2 else mine.fuse(out.name, *leaves[:-1])
        split = mine.split(out.name, leaves[-1], factor=lanes) if last > lanes else (None, leaves[-1])
        if parallel:
            mine.parallel(out.name, row)
        mine.vectorize(out.name, split[1])
        for st in inner:
            mine.compute_at(st.name, out.name, row)
            _reduction_inside(mine, st, vectorize=not st.op.is_reduction)
    else:
        fused = leaves[0] if len(leaves) == 1 else mine.fuse(out.name, *leaves)
        if parallel:
            mine.parallel(out.name, fused)
        for st in inner:
            mine.compute_at(st.name, out.name, fused)
    for step in mine.steps:
        sch.apply(step)


REDUCTION = Family("reduction", _matches, _analyse, _knobs, _default, _template_reduction, _later_knobs)
