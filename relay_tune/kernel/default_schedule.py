"""Default CPU schedules: the untuned way to run each operator family, as replayable schedule steps.

`default_schedule(prim, target)` returns a list of `Step`s for the tensor expressions of a fused function
(`relay_tune.kernel.compute.primitive_compute`). The steps are plain data: `Schedule.replay(steps,
prim.outputs)` rebuilds the schedule, and a tuner may hand different steps to the build instead.

Every default inlines the element-wise and injective stages into their readers (no intermediate buffers
inside a fused group), then schedules the anchor (the group's complex operator) by family:

- dense / batch_matmul: a register tile of accumulators (`cache_write`: up to 8 rows x 2 vectors)
  computed at each (column panel, row block) of the output, the reduction inside it (unrolled by 4) with
  the tile's rows unrolled and its columns vectorized; the fused epilogue (bias, activation, residual)
  applied when the tile is written back; the tile loop parallel. Dense weights are packed into panels
  two vectors wide (`transform_layout`, done once for constant weights); batch_matmul with `transpose_b`
  transposes its second operand once, ahead of the product.
- conv2d NCHW: the padded input computed once ahead (no bounds tests in the inner loop), weights packed
  by output-channel block, a register tile of up to 8 output channels x 2 vectors of output columns, the
  reduction over input channels and taps inside it; parallel over (batch, row, channel block). On narrow
  maps (rows shorter than a vector) a 1x1 convolution vectorizes across whole rows, and other
  convolutions accumulate channel-innermost (the compute's `conv2d_nchw_cl` stage): a tile of a few
  output columns x 2 vectors of output channels, scattered back to NCHW with the epilogue.
- conv2d NHWC: a register tile of 8 output columns x 2 vectors of output channels (contiguous in NHWC),
  input values broadcast, weights packed so a tile's channels are contiguous; parallel over rows.
- depthwise conv2d NCHW: vectorized over output columns, a few rows per tile, parallel over channels.
- pooling, reductions, softmax, normalisations: parallel over the outer output axes, vectorized along the
  innermost one where the reduction reads it contiguously; reductions accumulate per tile (`compute_at`).
- element-wise / injective groups: the output's loops fused into one, split by the vector width,
  parallel outside and vectorized inside.

Defaults must be correct for every shape: splits that do not divide leave tails that lowering peels or
guards, and every choice below only depends on extents known at compile time.
"""

from __future__ import annotations

import math
from typing import Any

from relay_tune.ir.expr import Function
from relay_tune.kernel import te, tir
from relay_tune.kernel.compute import INLINABLE_TAGS, PrimitiveCompute, primitive_compute
from relay_tune.kernel.schedule import ROOT, Schedule, Stage, Step
from relay_tune.target import Target

PARALLEL_MIN_WORK = 1 << 14
"""Below this much work (output elements times reduction size) a kernel runs on one core: starting a
parallel region costs more than it saves."""

REGISTER_BUDGET = 24
"""Vector accumulators a register tile may hold (AVX-512 has 32 registers; the rest hold operands)."""

def default_schedule(task: PrimitiveCompute | Function | Any, target: Target) -> list[Step]:
    """The default schedule for `target`, as steps, of a fused function: given as its tensor expressions
    (`primitive_compute(func)`), as the function itself, or as a task holding it in `.func` (a `TaskSpec`).
    Serialise with `[step.to_json() for step in steps]`; `lower_primitive(func, target, steps)` replays them."""
    if isinstance(task, PrimitiveCompute):
        prim = task
    else:
        prim = primitive_compute(task if isinstance(task, Function) else task.func)
    if target.kind == "cuda":
        from relay_tune.kernel.gpu_schedule import default_gpu_schedule

        return default_gpu_schedule(prim, target)
    sch = Schedule(prim.outputs)
    anchor = _anchor_stage(sch, prim)
    tag = anchor.op.tag if anchor is not None and anchor.op is not None else ""
    single = len(prim.outputs) == 1
    if anchor is None or not single or anchor.op is None or not anchor.op.is_reduction:
        _schedule_generic(sch, target)
    elif tag == "dense" and _weight_input(anchor) is not None:
        _schedule_matmul(sch, prim, anchor, target, _weight_input(anchor))
    elif tag == "batch_matmul":
        _schedule_matmul(sch, prim, anchor, target, None)
    elif tag == "conv2d_nchw":
        _schedule_conv2d_nchw(sch, prim, anchor, target)
    elif tag == "conv2d_nchw_cl":
        _schedule_conv2d_nchw_channels_last(sch, prim, anchor, target)
    elif tag == "conv2d_nhwc":
        _schedule_conv2d_nhwc(sch, prim, anchor, target)
    elif tag == "depthwise_conv2d_nchw":
        _schedule_depthwise_nchw(sch, prim, anchor, target)
    else:
        _schedule_reduction(sch, prim, target)
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


def _inline_cheap(sch: Schedule, keep: frozenset[str] | set[str] = frozenset()) -> None:
    """Inline every element-wise / injective stage that is not an output (nor listed in `keep`)."""
    for name, stage in list(sch.stages.items()):
        op = stage.op
        if op is None or stage.is_output or name in keep or op.is_reduction or stage.attach != ROOT:
            continue
        if op.tag in INLINABLE_TAGS or not op.tag:
            sch.compute_inline(name)


def _cache_accumulator(sch: Schedule, anchor: Stage) -> str:
    """Accumulate the anchor's reduction in a local tile (`<anchor>.local`); the anchor stage becomes the
    copy out of it, which is inlined into the epilogue unless it is the output itself."""
    acc = sch.cache_write(anchor.name, "local")
    if not anchor.is_output:
        sch.compute_inline(anchor.name)
    return acc


def _work(stage: Stage) -> int:
    """Output elements times reduction size: the inner-loop iterations of a stage."""
    return math.prod(ax.extent for ax in stage.root_axes)


def _parallel_worthwhile(target: Target, work: int) -> bool:
    return target.num_cores > 1 and work >= PARALLEL_MIN_WORK


def _vector_pieces(width: int, lanes: int) -> int:
    """Registers one row of `width` lanes takes: full vectors, then the power-of-two chunks the code
    generator cuts the rest into."""
    return max(1, width // lanes + bin(width % lanes).count("1"))


def _vector_width(extent: int, lanes: int) -> int:
    """Lanes per tile along a vectorized axis: two vectors, or the whole (shorter) axis."""
    return min(extent, 2 * lanes)


def _flat_loops(sch: Schedule, stage: Stage, target: Target, work: int | None = None) -> None:
    """Loops of a root stage without reduction: the innermost axis vectorized on its own when it is at
    least a vector wide (lane indices then need no division: padding tests, broadcasts and gathers stay
    cheap), else every axis fused into one flat loop split by the vector width; the outer part parallel.
    A stage with a reduction gets its spatial loops fused and parallelised."""
    name = stage.name
    spatial = [lp for lp in sch.leaves(name) if not stage.loops[lp].is_reduce]
    if not spatial:
        return
    has_reduce = len(sch.leaves(name)) > len(spatial)
    lanes = target.vector_lanes(stage.tensor.dtype)
    assert stage.op is not None
    extents = [ax.extent for ax in stage.op.axes]
    outer: str | None
    if has_reduce or lanes == 1:
        outer = spatial[0] if len(spatial) == 1 else sch.fuse(name, *spatial)
    elif len(spatial) >= 2 and extents[-1] >= lanes:
        outer = spatial[0] if len(spatial) == 2 else sch.fuse(name, *spatial[:-1])
        sch.vectorize(name, spatial[-1])
    else:
        flat = spatial[0] if len(spatial) == 1 else sch.fuse(name, *spatial)
        if math.prod(extents) >= lanes:
            outer, inner = sch.split(name, flat, factor=lanes)
            sch.vectorize(name, inner)
        else:
            outer = None
            sch.vectorize(name, flat)
    if outer is not None and _parallel_worthwhile(target, work if work is not None else _work(stage)):
        sch.parallel(name, outer)


def _schedule_generic(sch: Schedule, target: Target) -> None:
    """Inline the cheap stages, then give every remaining root stage flat, vectorized, parallel loops."""
    _inline_cheap(sch)
    for stage in list(sch.stages.values()):
        if stage.op is not None and stage.attach == ROOT:
            _flat_loops(sch, stage, target)


def _single_output(sch: Schedule, prim: PrimitiveCompute) -> Stage:
    return sch[prim.outputs[0]]


def _producers_tagged(sch: Schedule, stage: Stage, tag: str) -> list[Stage]:
    """Stages with `tag` that `stage` reads directly."""
    assert stage.op is not None
    found: list[Stage] = []
    for t in te.tensors_read(stage.op.body):
        producer = sch.stage_of_tensor(t)
        if producer is not None and producer.op is not None and producer.op.tag == tag:
            found.append(producer)
    return found


# ------------------------------------------------------------------------------------------------
# dense and batch_matmul
# ------------------------------------------------------------------------------------------------


def _weight_input(anchor: Stage) -> te.Tensor | None:
    """The 2-D placeholder a dense reduction reads as `w[j, k]` (j: the output column)."""
    assert anchor.op is not None
    column = anchor.op.axes[-1]
    for node in te.iter_exprs(anchor.op.body):
        if (isinstance(node, te.TensorRead) and node.tensor.is_placeholder and node.tensor.ndim == 2
                and node.indices[0] is column):
            return node.tensor
    return None


def _panel_width(n: int, lanes: int) -> int:
    """Columns per register tile: two vectors when the output is that wide, else whole vectors covering it."""
    if n >= 2 * lanes:
        return 2 * lanes
    if n > lanes // 2:
        return -(-n // lanes) * lanes
    return n


def _schedule_matmul(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, target: Target,
                     weight: te.Tensor | None) -> None:
    """Register-blocked matrix product. `weight` (dense) is packed into column panels; without it (batch
    matmul) the second operand is read in place, after its transpose stage, if any, ran ahead."""
    assert anchor.op is not None
    out = _single_output(sch, prim)
    lanes = target.vector_lanes(anchor.tensor.dtype)
    axes = anchor.op.axes
    n = axes[-1].extent
    k_extent = anchor.op.reduce_axes[0].extent
    batched = weight is None and len(axes) == 3
    m = axes[-2].extent if batched else math.prod(ax.extent for ax in axes[:-1])
    bn = _panel_width(n, lanes)
    mr = max(1, min(8, m, REGISTER_BUDGET // _vector_pieces(bn, lanes)))
    ku = 4 if k_extent >= 8 else 1

    packs = _producers_tagged(sch, anchor, "pack")
    if weight is not None:
        sch.transform_layout(weight, "NK", f"NK{bn}n")
    acc = _cache_accumulator(sch, anchor)
    _inline_cheap(sch, keep={acc, *(p.name for p in packs)})
    for pack in packs:
        _flat_loops(sch, pack, target)

    leaves = list(sch.leaves(out.name))
    if batched:
        batch, row, col = leaves
    else:
        batch = None
        row = leaves[0] if len(leaves) == 2 else sch.fuse(out.name, *leaves[:-1])
        col = leaves[-1]
    io, jo, ii, ji = sch.tile(out.name, row, col, mr, bn)
    # column panels outside row blocks: a panel (K x bn) stays in cache while the row blocks sweep over it
    sch.reorder(out.name, jo, io, ii, ji)
    outer = [batch, jo, io] if batch is not None else [jo, io]
    tile = sch.fuse(out.name, *outer)
    if _parallel_worthwhile(target, _work(anchor)):
        sch.parallel(out.name, tile)
    sch.vectorize(out.name, ji)
    sch.compute_at(acc, out.name, tile)
    acc_leaves = list(sch.leaves(acc))
    spatial, kname = acc_leaves[:-1], acc_leaves[-1]
    if ku > 1:
        ko, ki = sch.split(acc, kname, factor=ku)
        sch.reorder(acc, ko, ki, *spatial)
        sch.unroll(acc, ki)
    else:
        sch.reorder(acc, kname, *spatial)
    for r in spatial[:-1]:
        sch.unroll(acc, r)
    sch.vectorize(acc, spatial[-1])


# ------------------------------------------------------------------------------------------------
# convolutions
# ------------------------------------------------------------------------------------------------


def _conv_weight(anchor: Stage, channel_axis: int) -> te.Tensor | None:
    """The 4-D weight placeholder of a convolution: the one read with the output channel as an index."""
    assert anchor.op is not None
    channel = anchor.op.axes[channel_axis]
    for node in te.iter_exprs(anchor.op.body):
        if (isinstance(node, te.TensorRead) and node.tensor.is_placeholder and node.tensor.ndim == 4
                and any(i is channel for i in node.indices)):
            return node.tensor
    return None


def _prepare_conv(sch: Schedule, anchor: Stage, target: Target, inline_pad: bool = False) -> str:
    """Accumulator tile for the convolution; padding computed once at the root (or read in place with
    `inline_pad`); the rest inlined."""
    pads = _producers_tagged(sch, anchor, "pad")
    acc = _cache_accumulator(sch, anchor)
    _inline_cheap(sch, keep={acc, *(p.name for p in pads)})
    for pad in pads:
        if inline_pad:
            sch.compute_inline(pad.name)
        else:
            _flat_loops(sch, pad, target)
    return acc


def _schedule_conv2d_nchw(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, target: Target) -> None:
    assert anchor.op is not None
    out = _single_output(sch, prim)
    lanes = target.vector_lanes(anchor.tensor.dtype)
    _, channels, _, width = anchor.shape
    weight = _conv_weight(anchor, 1)
    vx = _vector_width(width, lanes)
    fc = max(1, min(channels, 8, REGISTER_BUDGET // _vector_pieces(vx, lanes)))
    if weight is not None and fc > 1:
        # the tile's output channels side by side: one cache line per tap instead of one per channel
        sch.transform_layout(weight, "OIHW", f"OIHW{fc}o")
    acc = _prepare_conv(sch, anchor, target)
    n, c, h, w = sch.leaves(out.name)
    if _is_pointwise(sch, anchor) and width < lanes:
        _pointwise_rows(sch, out.name, acc, anchor, target, fc, lanes)
        return
    co, ci = sch.split(out.name, c, factor=fc)
    wo, wi = sch.split(out.name, w, factor=vx)
    # channel blocks innermost among the parallel loops: consecutive tiles reuse the same input rows from cache
    sch.reorder(out.name, n, h, co, wo, ci, wi)
    outer = sch.fuse(out.name, n, h, co)
    if _parallel_worthwhile(target, _work(anchor)):
        sch.parallel(out.name, outer)
    sch.vectorize(out.name, wi)
    sch.compute_at(acc, out.name, wo)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    sch.reorder(acc, *reduce, an, ac, ah, aw)
    sch.unroll(acc, ac)
    sch.vectorize(acc, aw)


def _is_pointwise(sch: Schedule, anchor: Stage) -> bool:
    """A 1x1, stride-1, unpadded convolution: input pixel (y, x) feeds output pixel (y, x) only."""
    assert anchor.op is not None
    if _producers_tagged(sch, anchor, "pad") or any(ax.extent != 1 for ax in anchor.op.reduce_axes[1:]):
        return False
    _, _, oh, ow = anchor.op.axes
    for node in te.iter_exprs(anchor.op.body):
        if isinstance(node, te.TensorRead) and node.tensor.ndim == 4 and node.indices[2] is oh:
            return node.indices[3] is ow and node.tensor.shape[2:] == anchor.shape[2:]
    return False


def _pointwise_rows(sch: Schedule, out: str, acc: str, anchor: Stage, target: Target, fc: int, lanes: int) -> None:
    """Narrow 1x1 convolutions (14x14, 7x7 maps): a tile covers whole rows, whose pixels are contiguous in
    both the input and the output, so one vector runs across row ends (two 14-wide rows: 28 lanes)."""
    _, _, height, width = anchor.shape
    # whole rows that divide the map (no partial tiles, whose lane masks would keep the tile in memory)
    rows = max(r for r in range(1, height + 1) if height % r == 0 and (r == 1 or r * width <= 4 * lanes))
    pieces = _vector_pieces(rows * width, lanes)
    fc = max(1, min(fc, REGISTER_BUDGET // pieces))
    n, c, h, w = sch.leaves(out)
    co, ci = sch.split(out, c, factor=fc)
    ho, hi = sch.split(out, h, factor=rows)
    sch.reorder(out, n, ho, co, ci, hi, w)
    outer = sch.fuse(out, n, ho, co)
    if _parallel_worthwhile(target, _work(anchor)):
        sch.parallel(out, outer)
    pixels = sch.fuse(out, hi, w)
    sch.vectorize(out, pixels)
    sch.compute_at(acc, out, outer)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    sch.reorder(acc, *reduce, an, ac, ah, aw)
    sch.unroll(acc, ac)
    sch.vectorize(acc, sch.fuse(acc, ah, aw))


def _schedule_conv2d_nchw_channels_last(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, target: Target) -> None:
    """NCHW convolution on a narrow map whose sums are computed channel-innermost: a register tile of a few
    output columns x 2 vectors of output channels, input values broadcast, weights packed so that a tile's
    channels are contiguous; the tile is scattered back to NCHW with the epilogue."""
    out = _single_output(sch, prim)
    lanes = target.vector_lanes(anchor.tensor.dtype)
    _, _, width, channels = anchor.shape
    bc = _panel_width(channels, lanes)
    budget = max(1, REGISTER_BUDGET // _vector_pieces(bc, lanes))
    tw = max(d for d in range(1, width + 1) if width % d == 0 and d <= budget)
    weight = _conv_weight(anchor, 3)
    if weight is not None:
        sch.transform_layout(weight, "OIHW", f"OIHW{bc}o")
    acc = _prepare_conv(sch, anchor, target)
    n, c, h, w = sch.leaves(out.name)
    co, ci = sch.split(out.name, c, factor=bc)
    wo, wi = sch.split(out.name, w, factor=tw)
    # rows inside channel blocks: on a narrow map the weights outweigh the input, so consecutive tiles
    # share one block of weights (the whole padded input stays in cache anyway)
    sch.reorder(out.name, n, co, h, wo, wi, ci)
    outer = sch.fuse(out.name, n, co, h)
    if _parallel_worthwhile(target, _work(anchor)):
        sch.parallel(out.name, outer)
    sch.vectorize(out.name, ci)
    sch.compute_at(acc, out.name, wo)
    an, ah, aw, ac, *reduce = sch.leaves(acc)
    sch.reorder(acc, *reduce, an, ah, aw, ac)
    sch.unroll(acc, aw)
    sch.vectorize(acc, ac)


def _schedule_conv2d_nhwc(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, target: Target) -> None:
    assert anchor.op is not None
    out = _single_output(sch, prim)
    call = prim.anchor_call
    assert call is not None
    lanes = target.vector_lanes(anchor.tensor.dtype)
    _, _, width, channels = anchor.shape
    bc = _panel_width(channels, lanes)
    tw = max(1, min(width, 8, REGISTER_BUDGET // _vector_pieces(bc, lanes)))
    weight = _conv_weight(anchor, 3)
    kernel_layout = str(call.attrs["kernel_layout"])
    if weight is not None and sorted(kernel_layout) == sorted("OIHW") and channels > bc:
        # a tile's output channels contiguous for every (tap, input channel)
        sch.transform_layout(weight, kernel_layout, f"OHWI{bc}o")
    acc = _prepare_conv(sch, anchor, target)
    n, h, w, c = sch.leaves(out.name)
    wo, wi = sch.split(out.name, w, factor=tw)
    co, ci = sch.split(out.name, c, factor=bc)
    sch.reorder(out.name, n, h, co, wo, wi, ci)
    outer = sch.fuse(out.name, n, h, co)
    if _parallel_worthwhile(target, _work(anchor)):
        sch.parallel(out.name, outer)
    sch.vectorize(out.name, ci)
    sch.compute_at(acc, out.name, wo)
    an, ah, aw, ac, *reduce = sch.leaves(acc)
    sch.reorder(acc, *reduce, an, ah, aw, ac)
    sch.unroll(acc, aw)
    sch.vectorize(acc, ac)


def _schedule_depthwise_nchw(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, target: Target) -> None:
    out = _single_output(sch, prim)
    lanes = target.vector_lanes(anchor.tensor.dtype)
    _, _, height, width = anchor.shape
    vx = _vector_width(width, lanes)
    rows = max(1, min(height, 4, REGISTER_BUDGET // _vector_pieces(vx, lanes)))
    # Each input element feeds only 9 multiply-adds: a padded copy costs about as much as the convolution, while
    # reading the padding in place costs a mask at the borders.
    acc = _prepare_conv(sch, anchor, target, inline_pad=True)
    n, c, h, w = sch.leaves(out.name)
    ho, hi = sch.split(out.name, h, factor=rows)
    wo, wi = sch.split(out.name, w, factor=vx)
    sch.reorder(out.name, n, c, ho, wo, hi, wi)
    outer = sch.fuse(out.name, n, c)
    if _parallel_worthwhile(target, _work(anchor)):
        sch.parallel(out.name, outer)
    sch.vectorize(out.name, wi)
    sch.compute_at(acc, out.name, wo)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    sch.reorder(acc, *reduce, an, ac, ah, aw)
    sch.unroll(acc, ah)
    sch.vectorize(acc, aw)


# ------------------------------------------------------------------------------------------------
# pooling, reductions, softmax, normalisation
# ------------------------------------------------------------------------------------------------


def _reads_contiguously(stage: Stage, axis: te.IterVar) -> bool:
    """Whether every tensor `stage` reads has `axis` (alone, or plus a reduction variable) as its last
    index, so that consecutive values of `axis` read consecutive elements."""
    assert stage.op is not None
    for node in te.iter_exprs(stage.op.body):
        if isinstance(node, te.TensorRead) and node.tensor.ndim:
            last = node.indices[-1]
            if last is axis:
                continue
            if (isinstance(last, tir.BinaryOp) and last.op == "add"
                    and (last.a is axis or last.b is axis)
                    and isinstance(last.b if last.a is axis else last.a, te.IterVar)):
                continue
            return False
    return True


def _schedule_reduction(sch: Schedule, prim: PrimitiveCompute, target: Target) -> None:
    """Reductions with their neighbours: the work is split over the output's outer axes (parallel), every
    reduction (and any other stage kept out of line, e.g. softmax's exponentials) is computed inside
    that loop for just the part it covers, and the innermost axis is vectorized where that is contiguous."""
    out = _single_output(sch, prim)
    pads = [st for st in sch.stages.values() if st.op is not None and st.op.tag == "pad" and not st.is_output]
    keep = {p.name for p in pads}
    if out.op is not None and out.op.is_reduction:
        keep.add(_cache_accumulator(sch, out))
    _inline_cheap(sch, keep=keep)
    for pad in pads:
        _flat_loops(sch, pad, target)
    inner = [st for st in sch.stages.values()
             if st.op is not None and st is not out and st.attach == ROOT and st.name not in {p.name for p in pads}]
    work = max([_work(out), *(_work(st) for st in inner)])
    leaves = list(sch.leaves(out.name))
    if not leaves:  # a scalar result: everything runs once, at the root
        for st in inner:
            _flat_loops(sch, st, target)
        return
    assert out.op is not None
    lanes = target.vector_lanes(out.tensor.dtype)
    last_extent = out.op.axes[-1].extent
    reductions = [st for st in inner if st.op is not None and st.op.is_reduction]
    aligned = all(
        st.op is not None and len(st.op.axes) == len(out.op.axes) and st.op.axes[-1].extent == last_extent
        and _reads_contiguously(st, st.op.axes[-1])
        for st in reductions
    )
    if last_extent >= 4 and aligned and reductions:
        # each tile of the innermost axis accumulates in vector registers
        vx = _vector_width(last_extent, lanes)
        wo, wi = sch.split(out.name, leaves[-1], factor=vx)
        outer = leaves[0] if len(leaves) == 2 else (sch.fuse(out.name, *leaves[:-1]) if len(leaves) > 2 else wo)
        if _parallel_worthwhile(target, work):
            sch.parallel(out.name, outer)
        sch.vectorize(out.name, wi)
        for st in inner:
            sch.compute_at(st.name, out.name, wo)
            _reduction_inside(sch, st, vectorize=True)
        return
    if last_extent >= 4 and len(leaves) >= 2:
        # the reductions run along the innermost axis (softmax, layer norm): one row at a time
        row = leaves[0] if len(leaves) == 2 else sch.fuse(out.name, *leaves[:-1])
        split = sch.split(out.name, leaves[-1], factor=lanes) if last_extent > lanes else (None, leaves[-1])
        if _parallel_worthwhile(target, work):
            sch.parallel(out.name, row)
        sch.vectorize(out.name, split[1])
        for st in inner:
            sch.compute_at(st.name, out.name, row)
            _reduction_inside(sch, st, vectorize=not (st.op is not None and st.op.is_reduction))
        return
    fused = leaves[0] if len(leaves) == 1 else sch.fuse(out.name, *leaves)
    if _parallel_worthwhile(target, work):
        sch.parallel(out.name, fused)
    for st in inner:
        sch.compute_at(st.name, out.name, fused)


def _reduction_inside(sch: Schedule, stage: Stage, vectorize: bool) -> None:
    """Loops of a stage computed inside a tile: reduction loops outermost, its innermost spatial loop
    vectorized (when it has one worth it)."""
    leaves = list(sch.leaves(stage.name))
    spatial = [lp for lp in leaves if not stage.loops[lp].is_reduce]
    reduce = [lp for lp in leaves if stage.loops[lp].is_reduce]
    if reduce:
        sch.reorder(stage.name, *reduce, *spatial)
    if vectorize and spatial:
        sch.vectorize(stage.name, spatial[-1])


__all__ = ["PARALLEL_MIN_WORK", "REGISTER_BUDGET", "default_schedule"]
