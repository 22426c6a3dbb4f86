"""Default CPU schedules: the untuned way to run each operator family, as replayable schedule steps.

`default_schedule(prim, target)` returns a list of `Step`s for the tensor expressions of a fused function
(`relay_tune.kernel.compute.primitive_compute`). The steps are plain data: `Schedule.replay(steps,
prim.outputs)` rebuilds the schedule, and a tuner may hand different steps to the build instead.

Every default first inlines the element-wise and injective stages into their readers (no intermediate
buffers inside a fused group), then schedules the anchor by family:

- dense / batch_matmul: weights packed into panels as wide as two vectors (`transform_layout`), a
  register tile of accumulators (`cache_write`: up to 8 rows x 2 vectors) computed at each (panel, row
  block) of the output, the reduction inside it with its rows unrolled and its columns vectorized; the
  fused epilogue (bias, activation, residual) is applied when the tile is written back; the tile loop
  runs in parallel.
- conv2d NCHW: the padded input computed once ahead (no bounds tests in the inner loop), a tile of up to
  8 output channels x 2 vectors of output columns accumulated in registers, the reduction over input
  channels and taps inside it; the epilogue on write-back; parallel over (batch, channel block, row).
- everything else: the output's loops fused into one, split by the vector width, parallel outside and
  vectorized inside (reductions: parallel over the output elements).

Defaults must be correct for every shape: splits that do not divide leave tails that lowering peels or
guards, and every choice below only depends on extents known at compile time.
"""

from __future__ import annotations

import math

from relay_tune.kernel import te
from relay_tune.kernel.compute import INLINABLE_TAGS, PrimitiveCompute
from relay_tune.kernel.schedule import Schedule, Stage, Step
from relay_tune.target import Target

PARALLEL_MIN_WORK = 1 << 14
"""Below this many output elements (times the reduction size) a kernel runs on one core: starting a
parallel region costs more than the work."""


def default_schedule(prim: PrimitiveCompute, target: Target) -> list[Step]:
    """The default schedule of a fused function's tensor expressions for `target`, as steps."""
    sch = Schedule(prim.outputs)
    anchor = _anchor_stage(sch, prim)
    tag = anchor.op.tag if anchor is not None and anchor.op is not None else ""
    if anchor is not None and tag == "dense" and _matmul_shape_ok(anchor):
        _schedule_dense(sch, prim, anchor, target)
    elif anchor is not None and tag == "conv2d_nchw":
        _schedule_conv2d_nchw(sch, prim, anchor, target)
    else:
        _schedule_generic(sch, prim, target)
    return list(sch.steps)


# ------------------------------------------------------------------------------------------------
# shared pieces
# ------------------------------------------------------------------------------------------------


def _anchor_stage(sch: Schedule, prim: PrimitiveCompute) -> Stage | None:
    """The stage of the anchor call that holds its main reduction (or its result when it has none)."""
    call = prim.anchor_call
    if call is None:
        return None
    # stages of the call that the outputs do not need (other fields of a split) are not in the schedule
    stages = [st for st in (sch.stage_of_tensor(t) for t in call.tensors) if st is not None and st.op is not None]
    for st in reversed(stages):
        if st.op is not None and st.op.is_reduction:
            return st
    return stages[-1] if stages else None


def _is_output(sch: Schedule, stage: Stage) -> bool:
    return stage.is_output


def _inline_cheap(sch: Schedule, keep: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Inline every element-wise / injective stage that is not an output (and not listed in `keep`)."""
    for name, stage in list(sch.stages.items()):
        op = stage.op
        if op is None or stage.is_output or name in keep or op.is_reduction:
            continue
        if op.tag in INLINABLE_TAGS or op.tag == "pad" or not op.tag:
            sch.compute_inline(name)


def _cache_accumulator(sch: Schedule, anchor: Stage) -> str:
    """Accumulate the anchor's reduction in a local tile (`<anchor>.local`); the anchor stage becomes the
    copy out of it, which is inlined into the epilogue unless it is the output itself."""
    acc = sch.cache_write(anchor.name, "local")
    if not anchor.is_output:
        sch.compute_inline(anchor.name)
    return acc


def _work(stage: Stage) -> int:
    n = 1
    for ax in stage.root_axes:
        n *= ax.extent
    return n


def _flat_loops(sch: Schedule, stage: Stage, target: Target, vectorize: bool = True) -> str | None:
    """Fuse the spatial loops of a root stage, split off a vector-wide inner loop (when the stage has no
    reduction), parallelise the outer part. Returns the outer loop (None for a rank-0 stage)."""
    name = stage.name
    spatial = [lp for lp in sch.leaves(name) if not stage.loops[lp].is_reduce]
    if not spatial:
        return None
    outer = spatial[0] if len(spatial) == 1 else sch.fuse(name, *spatial)
    extent = math.prod(ax.extent for ax in stage.op.axes) if stage.op is not None else 1
    lanes = target.vector_lanes(stage.tensor.dtype)
    has_reduce = any(stage.loops[lp].is_reduce for lp in sch.leaves(name))
    if vectorize and not has_reduce and lanes > 1 and extent >= lanes:
        outer, inner = sch.split(name, outer, factor=lanes)
        sch.vectorize(name, inner)
    if target.num_cores > 1 and _work(stage) >= PARALLEL_MIN_WORK:
        sch.parallel(name, outer)
    return outer


def _schedule_generic(sch: Schedule, prim: PrimitiveCompute, target: Target) -> None:
    _inline_cheap(sch)
    for stage in sch.stages.values():
        if stage.op is None or stage.attach != "root":
            continue
        _flat_loops(sch, stage, target)


# ------------------------------------------------------------------------------------------------
# dense
# ------------------------------------------------------------------------------------------------


def _matmul_shape_ok(anchor: Stage) -> bool:
    assert anchor.op is not None
    return len(anchor.op.axes) >= 2 and len(anchor.op.reduce_axes) == 1


def _schedule_dense(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, target: Target) -> None:
    assert anchor.op is not None
    call = prim.anchor_call
    assert call is not None
    weight = _weight_input(anchor)
    out = sch[prim.outputs[0]] if len(prim.outputs) == 1 else None
    if out is None or weight is None:
        _schedule_generic(sch, prim, target)
        return
    lanes = target.vector_lanes(anchor.tensor.dtype)
    n = anchor.op.axes[-1].extent
    k_extent = anchor.op.reduce_axes[0].extent
    m = math.prod(ax.extent for ax in anchor.op.axes[:-1])
    bn = _panel_width(n, lanes)
    mr = min(8, m)
    ku = 4 if k_extent >= 4 else 1

    sch.transform_layout(weight, "NK", f"NK{bn}n")
    acc = _cache_accumulator(sch, anchor)
    _inline_cheap(sch, keep={acc})
    leaves = list(sch.leaves(out.name))
    row = leaves[0] if len(leaves) == 2 else sch.fuse(out.name, *leaves[:-1])
    col = sch.leaves(out.name)[-1]
    io, jo, ii, ji = sch.tile(out.name, row, col, mr, bn)
    sch.reorder(out.name, jo, io, ii, ji)
    tile = sch.fuse(out.name, jo, io)
    if target.num_cores > 1 and m * n * k_extent >= PARALLEL_MIN_WORK:
        sch.parallel(out.name, tile)
    sch.vectorize(out.name, ji)
    sch.compute_at(acc, out.name, tile)
    acc_leaves = list(sch.leaves(acc))
    spatial = acc_leaves[:-1]
    kname = acc_leaves[-1]
    rows = spatial[:-1]
    if ku > 1:
        ko, ki = sch.split(acc, kname, factor=ku)
        sch.reorder(acc, ko, ki, *spatial)
        sch.unroll(acc, ki)
    else:
        sch.reorder(acc, kname, *spatial)
    for r in rows:
        sch.unroll(acc, r)
    sch.vectorize(acc, spatial[-1])


def _weight_input(anchor: Stage) -> te.Tensor | None:
    """The 2-D placeholder read as `w[j, k]` (j: the output column) by a dense reduction."""
    assert anchor.op is not None
    column = anchor.op.axes[-1]
    for node in te.iter_exprs(anchor.op.body):
        if (isinstance(node, te.TensorRead) and node.tensor.is_placeholder and node.tensor.ndim == 2
                and node.indices[0] is column):
            return node.tensor
    return None


def _panel_width(n: int, lanes: int) -> int:
    """Columns per register tile: two vectors when the output is that wide, else the vectors it needs."""
    if n >= 2 * lanes:
        return 2 * lanes
    return max(1, -(-n // lanes)) * lanes if n > lanes // 2 else n


# ------------------------------------------------------------------------------------------------
# conv2d NCHW
# ------------------------------------------------------------------------------------------------


def _schedule_conv2d_nchw(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, target: Target) -> None:
    assert anchor.op is not None
    out = sch[prim.outputs[0]] if len(prim.outputs) == 1 else None
    if out is None:
        _schedule_generic(sch, prim, target)
        return
    pad = _pad_producer(sch, anchor)
    lanes = target.vector_lanes(anchor.tensor.dtype)
    _, channels, _, width = anchor.shape
    acc = _cache_accumulator(sch, anchor)
    keep = {acc} | ({pad.name} if pad is not None else set())
    _inline_cheap(sch, keep=keep)
    if pad is not None:
        _flat_loops(sch, pad, target)

    vx = min(width, 2 * lanes)
    vectors = -(-vx // lanes)
    fc = min(channels, 8 if vectors >= 2 else 12)
    weight = _conv_weight(anchor)
    if weight is not None and fc > 1:
        # the tile's output channels side by side: one cache line per tap instead of one per channel
        sch.transform_layout(weight, "OIHW", f"OIHW{fc}o")
    n, c, h, w = sch.leaves(out.name)
    co, ci = sch.split(out.name, c, factor=fc)
    wo, wi = sch.split(out.name, w, factor=vx)
    # channel blocks innermost among the parallel loops: consecutive tiles reuse the same input rows from cache
    sch.reorder(out.name, n, h, co, wo, ci, wi)
    outer = sch.fuse(out.name, n, h, co)
    if target.num_cores > 1:
        sch.parallel(out.name, outer)
    sch.vectorize(out.name, wi)
    sch.compute_at(acc, out.name, wo)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    sch.reorder(acc, *reduce, an, ac, ah, aw)
    sch.unroll(acc, ac)
    sch.vectorize(acc, aw)


def _conv_weight(anchor: Stage) -> te.Tensor | None:
    """The 4-D weight placeholder of a convolution (read with the output channel first)."""
    assert anchor.op is not None
    channel = anchor.op.axes[1]
    for node in te.iter_exprs(anchor.op.body):
        if (isinstance(node, te.TensorRead) and node.tensor.is_placeholder and node.tensor.ndim == 4
                and node.indices[0] is channel):
            return node.tensor
    return None


def _pad_producer(sch: Schedule, anchor: Stage) -> Stage | None:
    assert anchor.op is not None
    for t in te.tensors_read(anchor.op.body):
        stage = sch.stage_of_tensor(t)
        if stage is not None and stage.op is not None and stage.op.tag == "pad":
            return stage
    return None


__all__ = ["PARALLEL_MIN_WORK", "default_schedule"]
