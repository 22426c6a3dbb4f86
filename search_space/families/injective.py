"""The `injective` family: element-wise groups, transposes, concatenations, layout transforms (every fused
function without a reduction).

Knobs: `mode` (vectorize the innermost axis whole, split it by `vector`, fuse every axis and split by `vector`,
or, for outputs in `NCHW{b}c`, fuse the columns and the block and split them by `vector`), `vector`, `parallel`.
Layout transforms between NCHW and `NCHW{b}c` (or two blocks) also have mode `transpose` (`_transpose_loops`: every
index affine in the vector's lanes), with `lanes` (along the block or the map's plane) and `unroll`.
"""

from __future__ import annotations

import math
from typing import Any

from relay_tune.kernel import te, tir
from relay_tune.kernel.schedule import ROOT
from search_space.config import Config
from search_space.families.common import (
    CpuWorkload,
    Family,
    blocked_stage,
    default_parallel,
    flat_loops,
    inline_cheap,
    parallel_choices,
    parallel_worthwhile,
    stage_work,
    trailing_axes,
    vector_choices,
)
from search_space.knobs import ChoiceKnob, Knob
from search_space.space import Constraint

# -- analysis ----------------------------------------------------------------------------------------------------


def _matches(sch: Any, prim: Any, anchor: Any) -> bool:
    return anchor is None or len(prim.outputs) != 1 or anchor.op is None or not anchor.op.is_reduction


def _analyse(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int]) -> dict[str, Any]:
    """Every root stage gets flat loops: the facts are the narrowest innermost axis, the largest stage, the run
    length of a reshape, and whether the outputs are blocked or a layout transform."""
    stages = [st for st in sch.stages.values() if st.op is not None and st.attach == ROOT]
    inner = min((st.op.axes[-1].extent for st in stages if len(st.op.axes) >= 2), default=0)
    total = max((math.prod(ax.extent for ax in st.op.axes) for st in stages), default=1)
    lanes = min((target.vector_lanes(st.tensor.dtype) for st in stages),
                default=target.vector_lanes(sch[prim.outputs[0]].tensor.dtype))
    work = max((stage_work(st) for st in stages), default=1)
    written = [sch[t] for t in prim.outputs]  # the stages left after the template inlines the others
    period = math.gcd(*(_inner_period(st) for st in written if st.op is not None and len(st.op.axes) >= 2))
    dims = {"inner": inner, "total": total, "period": period}
    if 0 < inner < lanes and any(len(st.op.axes) >= 3 and
                                 trailing_axes([ax.extent for ax in st.op.axes], lanes) < len(st.op.axes) - 1
                                 for st in stages):
        dims["narrow_rows"] = 1  # rows narrower than a vector: the "inner" mode fuses trailing axes
    if written and all(st.op is not None and blocked_stage(st) for st in written):
        dims["blocked"] = 1  # NCHW{b}c outputs: the "rows" mode vectorizes a row's columns and blocks together
    transform = _transform_kind(prim)
    if transform is not None and lanes > 1:
        kind, block_in, block_out = transform
        dims.update(transform=TRANSFORM_KINDS.index(kind) + 1, block_in=block_in, block_out=block_out)
    return {"dims": dims, "lanes": lanes, "default_parallel": parallel_worthwhile(target, work)}


def _inner_period(stage: Any) -> int:
    """How many consecutive elements of the stage's innermost axis read consecutive elements of its inputs: the
    divisor where an index divides or takes the remainder of that axis (a reshape that splits it, as attention's
    head split 128x768 <- 12x128x64 does), 0 where no index does."""
    axis = stage.op.axes[-1]
    period = 0
    for node in te.iter_exprs(stage.op.body):
        if not (isinstance(node, tir.BinaryOp) and node.op in ("floordiv", "floormod")
                and isinstance(node.b, tir.IntImm) and 1 < int(node.b.value) < axis.extent):
            continue
        operand = list(te.iter_exprs(node.a))  # the axis itself, not a quotient of it: `(ax // 64) % 12` is not
        if any(n is axis for n in operand) and not any(
                isinstance(n, tir.BinaryOp) and n.op in ("floordiv", "floormod") for n in operand):
            period = math.gcd(period, int(node.b.value))
    return period


TRANSFORM_KINDS = ("pack", "unpack", "reblock")
"""Layout transforms the injective family's "transpose" mode schedules: NCHW -> NCHW{b}c, NCHW{b}c -> NCHW, and
NCHW{b}c -> NCHW{b'}c where one block divides the other."""


def _transform_kind(prim: Any) -> tuple[str, int, int] | None:
    """(kind, input block, output block) when the function's one output is an input (or a concatenation of inputs)
    in another channel blocking: same batch and map, the channels regrouped (`(1, 64, 56, 56)` ->
    `(1, 4, 56, 56, 16)`: "pack", blocks 1, 16).
    Told from shapes alone: a fused epilogue (`relu(layout_transform(x))`) keeps the relation, and a kernel that
    only looks like one still computes right under the mode, which merely orders and vectorizes its loops."""
    if len(prim.outputs) != 1:
        return None
    out = tuple(int(d) for d in prim.outputs[0].shape)
    for tensor in prim.inputs:
        shape = tuple(int(d) for d in tensor.shape)
        if len(shape) not in (4, 5) or len(out) not in (4, 5) or shape[0] != out[0] or shape[2:4] != out[2:4]:
            continue
        block_in = shape[4] if len(shape) == 5 else 1
        block_out = out[4] if len(out) == 5 else 1
        # fewer channels than the output: the transform reads a concatenation of several inputs (SqueezeNet's fire
        # modules end in `layout_transform(concatenate(...))`)
        if shape[1] * block_in > out[1] * block_out or block_in == block_out:
            continue
        if block_in == 1 and shape[1] == out[1] * block_out:
            # packing exactly one input: ShuffleNet's concatenation + channel shuffle into NCHW16c interleaves two
            # inputs lane by lane, and runs 1.2-1.5x slower with its vector along the block than in the "rows" mode
            return "pack", 1, block_out
        if block_in == 1:
            continue
        if block_out == 1:
            return "unpack", block_in, 1
        if max(block_in, block_out) % min(block_in, block_out) == 0:
            return "reblock", block_in, block_out
    return None


# -- space -------------------------------------------------------------------------------------------------------


def _modes(workload: CpuWorkload) -> list[str]:
    dims, lanes = workload.dims, workload.lanes
    modes = ["flat"]
    if dims["inner"] >= lanes > 1:
        modes = ["inner", "split", "flat"]
    elif dims.get("narrow_rows") and lanes > 1:
        modes = ["inner", "flat"]
    if dims.get("blocked") and lanes > 1:
        modes = [*modes, "rows"]
    if dims.get("transform"):
        modes = [*modes, "transpose"]
    return modes


def _transpose_knobs_used(config: Config) -> bool:
    # the other modes ignore `lanes` and `unroll`: one config each, not eight copies of the same schedule
    return config["mode"] == "transpose" or (config["lanes"] == "block" and config["unroll"] == 1)


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    dims, lanes = workload.dims, workload.lanes
    knobs: list[Knob] = [ChoiceKnob("mode", _modes(workload))]
    constraints: list[Constraint] = []
    if lanes > 1:
        knobs.append(ChoiceKnob("vector", vector_choices(dims["total"], lanes)))
    knobs.append(ChoiceKnob("parallel", parallel_choices(workload, 1)))
    if dims.get("transform"):
        # "transpose" mode: which side's contiguous axis the vector runs along, and how many of the other
        # axis' steps one loop iteration unrolls (see `_transpose_loops`)
        kind = TRANSFORM_KINDS[dims["transform"] - 1]
        knobs.append(ChoiceKnob("lanes", ["block", "columns"] if kind != "reblock" else ["block"]))
        knobs.append(ChoiceKnob("unroll", [1, 2, 4, 8]))
        constraints.append(Constraint("transpose knobs only in transpose mode", _transpose_knobs_used))
    return knobs, constraints


# -- default -----------------------------------------------------------------------------------------------------


def _default(workload: CpuWorkload) -> dict[str, Any]:
    dims, lanes = workload.dims, workload.lanes
    modes = _modes(workload)
    values: dict[str, Any] = {"mode": "inner" if "inner" in modes else "flat"}
    if lanes > 1:
        choices = vector_choices(dims["total"], lanes)
        values["vector"] = lanes if lanes in choices else choices[0]
        # An innermost axis read in runs of `period` elements (a reshape splits it): vectorized whole, every
        # vector straddles runs and its loads become gathers (BERT's head merge 12x128x64 -> 128x768: 4x
        # slower than the best config). Split it by the widest vector that divides the run instead.
        period = dims.get("period", 0)
        dividing = [c for c in choices if period and period % c == 0 and c >= lanes]
        if "split" in modes and dividing:
            values.update(mode="split", vector=max(dividing))
        if "rows" in modes:
            # Blocked tensors (layout transforms into NCHW16c, concatenations of blocks): a row's columns and
            # blocks are one contiguous run, vectorized four vectors at a time. One 16-lane vector per
            # column ("inner") paid the index arithmetic of the fused outer loop per vector: concatenating two
            # 1x128x56x56 in NCHW16c 3.1x slower than "rows", NCHW -> NCHW16c 1.7x.
            values.update(mode="rows", vector=max(c for c in choices if c <= 4 * lanes))
    values["parallel"] = default_parallel(workload, 1)
    if dims.get("transform"):
        values.update(_transpose_default(workload))
    return values


def _transpose_default(workload: CpuWorkload) -> dict[str, Any]:
    """A layout transform's default: the transpose mode (every index affine in the vector's lanes, see
    `_transpose_loops`). Into NCHW the vector runs along the map's plane, four vectors an iteration, gathered a
    block apart (NCHW16c -> NCHW of 1x1280x7x7 1.2x faster than vectors along the block, scattered a plane apart);
    otherwise along the block (into NCHW3c: 2.5x faster than a vector of the plane's columns scattered three apart)."""
    if TRANSFORM_KINDS[workload.dims["transform"] - 1] == "unpack":
        return {"mode": "transpose", "lanes": "columns", "unroll": 4}
    return {"mode": "transpose", "lanes": "block", "unroll": 1}


# -- template ----------------------------------------------------------------------------------------------------


def _template_injective(sch: Any, prim: Any, config: Config, target: Any) -> None:
    inline_cheap(sch)
    vector = int(config["vector"]) if "vector" in config else None  # type: ignore[arg-type]
    parallel = bool(config.get("parallel", 0))
    mode = str(config.get("mode", "flat"))
    transform = _transform_kind(prim) if mode == "transpose" else None
    for stage in list(sch.stages.values()):
        if stage.op is None or stage.attach != ROOT:
            continue
        if transform is not None and stage.is_output:
            _transpose_loops(sch, stage, transform, str(config["lanes"]), int(config["unroll"]),  # type: ignore[arg-type]
                             target.vector_lanes(stage.tensor.dtype), parallel and target.num_cores > 1)
        else:
            flat_loops(sch, stage, target, mode="inner" if mode == "transpose" else mode, vector=vector,
                        parallel=parallel)


def _transpose_loops(sch: Any, stage: Any, transform: tuple[str, int, int], lanes: str, unroll: int,
                     width: int, parallel: bool) -> None:
    """Loops of a layout transform between NCHW and NCHW{b}c (or two block sizes) whose every index is affine in
    the vectorized loop, so that its accesses are whole vectors or constant-stride gathers and scatters. The
    channel axis is split by the block where the other side has one (`c // 16`, `c % 16` become the outer and
    inner loops); rows `(n, channel block, h)` run in parallel.

    pack (`(n, cb, h, w, b)` from NCHW): lanes "block": a vector along the block, gathered from `b` channel planes,
    `unroll` columns per iteration (neighbouring columns share the cache lines of those planes); "columns": a vector
    of `width` columns read contiguously from one plane, written every `b`-th element, the block's channels
    unrolled.
    unpack (`(n, c, h, w)` from `NCHW{b}c`): "block": a vector of the block's channels read contiguously, written
    one per plane, `unroll` columns per iteration; "columns": a vector of a plane's columns gathered every `b`-th
    element. reblock (`NCHW16c -> NCHW8c`, `NCHW8c -> NCHW16c`): the smaller block is the vector, contiguous on
    both sides.

    The fused index `(w, c)` the flat modes vectorize needs a vector division and remainder per lane, which cost
    several times the copy (NCHW -> NCHW3c 7x a copy, NCHW16c -> NCHW 7x)."""
    kind, block_in, block_out = transform
    name = stage.name
    leaves = list(sch.leaves(name))

    def columns(loop: str) -> list[str]:  # `loop` in pieces of `unroll`, the inner piece unrolled
        if unroll <= 1:
            return [loop]
        outer, inner = sch.split(name, loop, factor=unroll)
        sch.unroll(name, inner)
        return [outer, inner]

    if kind == "unpack":
        n, c, h, w = leaves
        co, ci = sch.split(name, c, factor=block_in)
        if lanes == "columns":  # the plane `(h, w)`, one run in both layouts, in vectors of `width`
            sch.reorder(name, n, co, ci, h, w)
            plane = sch.split(name, sch.fuse(name, h, w), factor=width)
            columns(plane[0])
            vector, rows = plane[1], sch.fuse(name, n, co, ci)
            sch.vectorize(name, vector)
            if parallel:
                sch.parallel(name, rows)
            return
        else:
            sch.reorder(name, n, co, h, w, ci)
            columns(w)
            vector = ci
        rows = sch.fuse(name, n, co, h)
    else:
        n, cb, h, w, lane = leaves
        if kind == "reblock" and block_in > block_out:  # NCHW16c -> NCHW8c: output blocks in pairs
            co, ci = sch.split(name, cb, factor=block_in // block_out)
            sch.reorder(name, n, co, h, w, ci, lane)
            columns(w)
            sch.unroll(name, ci)
            rows, vector = sch.fuse(name, n, co, h), lane
        elif kind == "reblock":  # NCHW8c -> NCHW16c: the block in halves, one input block each
            lo, li = sch.split(name, lane, factor=block_in)
            columns(w)
            sch.unroll(name, lo)
            rows, vector = sch.fuse(name, n, cb, h), li
        elif lanes == "columns":  # the plane `(h, w)` in vectors of `width`, the block's channels unrolled
            sch.reorder(name, n, cb, h, w, lane)
            po, pi = sch.split(name, sch.fuse(name, h, w), factor=width)
            sch.reorder(name, po, lane, pi)
            if block_out <= 16:
                sch.unroll(name, lane)
            rows, vector = sch.fuse(name, n, cb), pi
        else:
            columns(w)
            rows, vector = sch.fuse(name, n, cb, h), lane
    sch.vectorize(name, vector)
    if parallel:
        sch.parallel(name, rows)


INJECTIVE = Family("injective", _matches, _analyse, _knobs, _default, _template_injective)
