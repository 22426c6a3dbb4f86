"""What the convolution families share: the analysis of a convolution's shapes, the knobs over its reduction and
kernel taps (with their defaults and constraints), and the template's start (accumulator, padded input) and
reduction order."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from relay_tune.kernel import te, tir
from search_space.config import Config
from search_space.families.common import (
    CpuWorkload,
    TileKnob,
    blocked_rows,
    cache_accumulator,
    flat_loops,
    inline_cheap,
    inner_factor,
    input_index,
    outer_factor,
    parallel_worthwhile,
    producers_tagged,
    split_value,
    stage_work,
    vector_registers,
)
from search_space.knobs import BoolKnob, ChoiceKnob, Knob

# -- analysis ----------------------------------------------------------------------------------------------------


def conv_weight(anchor: Any, channel_axis: int, ndim: int = 4) -> Any:
    """The weight placeholder of a convolution (4-D; 6-D blocked): the one read with the output channel (block)
    as an index."""
    channel = anchor.op.axes[channel_axis]
    for node in te.iter_exprs(anchor.op.body):
        if (isinstance(node, te.TensorRead) and node.tensor.is_placeholder and node.tensor.ndim == ndim
                and any(i is channel for i in node.indices)):
            return node.tensor
    return None


def is_pointwise(sch: Any, anchor: Any) -> bool:
    """A 1x1, stride-1, unpadded NCHW convolution: input pixel (y, x) feeds output pixel (y, x) only."""
    if producers_tagged(sch, anchor, "pad") or any(ax.extent != 1 for ax in anchor.op.reduce_axes[1:]):
        return False
    _, _, oh, ow = anchor.op.axes
    taps = {id(ax) for ax in anchor.op.reduce_axes[1:]}

    def plain(index: Any, axis: Any) -> bool:  # `axis`, or `axis + tap` with a tap of extent 1
        if index is axis:
            return True
        return (isinstance(index, tir.BinaryOp) and index.op == "add" and index.a is axis
                and id(index.b) in taps)

    for node in te.iter_exprs(anchor.op.body):
        if isinstance(node, te.TensorRead) and node.tensor.ndim == 4 and plain(node.indices[2], oh):
            return plain(node.indices[3], ow) and node.tensor.shape[2:] == anchor.shape[2:]
    return False


def analyse_conv(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int], *,
                 channel_last: bool = False, pointwise: bool = False) -> dict[str, Any]:
    """The workload fields of a 4-D convolution: `channel_last` where the compute keeps its sums channel-innermost
    (`n, h, w, c`), `pointwise` where the family has a mode for 1x1 stride-1 convolutions."""
    if channel_last:
        n, h, w, c = anchor.shape
    else:
        n, c, h, w = anchor.shape
    reduce_extents = [ax.extent for ax in anchor.op.reduce_axes]
    taps = math.prod(reduce_extents[-2:]) if len(reduce_extents) >= 2 else 1
    weight = conv_weight(anchor, 3 if channel_last else 1)
    index = input_index(weight) if weight is not None else None
    call = prim.anchor_call
    layout = str(call.attrs.get("kernel_layout", "OIHW")) if call is not None else "OIHW"
    dims = {"n": n, "c": c, "h": h, "w": w, "taps": taps, "reduce_loops": len(reduce_extents),
            "kw": reduce_extents[-1] if reduce_extents else 1,
            "ic": reduce_extents[0] if len(reduce_extents) >= 3 else 1}
    return {"dims": dims, "lanes": target.vector_lanes(anchor.tensor.dtype),
            "constant_weight": index is not None and index in constants,
            "has_pad": bool(producers_tagged(sch, anchor, "pad")),
            "pointwise": pointwise and is_pointwise(sch, anchor), "weight_layout": layout,
            "default_parallel": parallel_worthwhile(target, stage_work(anchor))}


def analyse_blocked_conv(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int], *,
                         depthwise: bool) -> dict[str, Any]:
    """The workload fields of a convolution on channel-blocked layouts (`NCHW{b}c`, the output block the
    vector)."""
    n, cb, h, w, block = anchor.shape
    # reduce axes as the compute orders them: (rcb, rh, rw, rci) dense, (rh, rw) depthwise
    reduce = [ax.extent for ax in anchor.op.reduce_axes]
    kh, kw = reduce[:2] if depthwise else reduce[1:3]
    weight = conv_weight(anchor, 1, ndim=6)
    index = input_index(weight) if weight is not None else None
    dims = {"n": n, "cb": cb, "h": h, "w": w, "block": block, "kh": kh, "kw": kw, "taps": kh * kw,
            "icb": 1 if depthwise else reduce[0]}
    return {"dims": dims, "lanes": target.vector_lanes(anchor.tensor.dtype),
            "constant_weight": index is not None and index in constants,
            "has_pad": bool(producers_tagged(sch, anchor, "pad")), "weight_layout": "blocked",
            "default_parallel": parallel_worthwhile(target, stage_work(anchor))}


def tagged(tag: str) -> Any:
    """A family's `matches`: the anchor's tag is `tag`."""
    def matches(sch: Any, prim: Any, anchor: Any) -> bool:
        return bool(anchor.op.tag == tag)

    return matches


# -- knobs, constraints and defaults -----------------------------------------------------------------------------


def pack_needs_block(config: Config, knob: str) -> bool:
    """Packing a weight by blocks of one output channel changes nothing (the same schedule as unpacked)."""
    return not config.get("pack_w") or inner_factor(config, knob) > 1


def ic_blocks_only_when_blocked(config: Config) -> bool:
    """Input-channel blocks (`tile_ic`) belong to the `blocked` reduction order, which needs a real split."""
    inner = inner_factor(config, "tile_ic")
    if config["reduce_order"] == "blocked":
        return 1 < inner and outer_factor(config, "tile_ic") > 1
    return inner == 1


def blocked_registers_fit(config: Config, lanes: int, budget: int, block: int, rows: str, columns: str,
                           registers: int = 0) -> bool:
    """A blocked convolution's accumulators: `rows` x `columns` tiles of one output block each. With `registers`
    (the dense blocked convolution) the operands count too: one weight vector per channel block and the broadcast
    input value, all live at once in the tile's innermost step (7 columns by 4 blocks: 28 + 4 + 1 = 33 of 32
    registers spilled, 1.8x slower than any tile that fits)."""
    per = vector_registers(block, lanes)
    accumulators = inner_factor(config, rows) * inner_factor(config, columns) * per
    if registers:
        return accumulators + inner_factor(config, rows) * per + 1 <= registers
    return accumulators <= budget


def conv_reduction_knobs(workload: CpuWorkload) -> list[Knob]:
    knobs: list[Knob] = []
    dims = workload.dims
    if dims["reduce_loops"] >= 3 and dims["taps"] > 1:
        blocked = dims["ic"] >= 4
        knobs.append(ChoiceKnob("reduce_order", ["c_hw", "hw_c", *(["blocked"] if blocked else [])]))
        if blocked:
            knobs.append(TileKnob("tile_ic", dims["ic"], 2, max(2, dims["ic"] // 2)))
    return knobs + tap_knobs(workload)


def tap_knobs(workload: CpuWorkload) -> list[Knob]:
    """A convolution's knobs over its kernel taps: unroll the kernel-column loop (`unroll_kw`, kernels wider than
    one column), and the padded input computed once ahead or read through a guard (`pad`, padded convolutions)."""
    knobs: list[Knob] = []
    if workload.dims["kw"] > 1:
        knobs.append(BoolKnob("unroll_kw"))
    if workload.has_pad:
        knobs.append(ChoiceKnob("pad", ["root", "inline"]))
    return knobs


def conv_reduction_defaults(workload: CpuWorkload, pad: str = "root") -> dict[str, Any]:
    """The defaults of `conv_reduction_knobs`: input channels outermost, taps rolled, the padded input (`pad`)."""
    dims = workload.dims
    values: dict[str, Any] = {}
    if dims["reduce_loops"] >= 3 and dims["taps"] > 1:
        values["reduce_order"] = "c_hw"
        if dims["ic"] >= 4:
            values["tile_ic"] = split_value(dims["ic"], 1)
    return {**values, **tap_defaults(workload, pad)}


def tap_defaults(workload: CpuWorkload, pad: str = "root") -> dict[str, Any]:
    """The defaults of `tap_knobs`: the kernel-column loop rolled, the padded input as `pad` says."""
    values: dict[str, Any] = {}
    if workload.dims["kw"] > 1:
        values["unroll_kw"] = False
    if workload.has_pad:
        values["pad"] = pad
    return values


# -- template ----------------------------------------------------------------------------------------------------


def prepare_conv(sch: Any, anchor: Any, config: Config, target: Any, blocked: bool = False,
                 keep: Sequence[str] = ()) -> str:
    """Accumulator tile; the padded input computed once at the root (or inlined into the reads); the rest
    inlined. `blocked`: the padded input is `(n, c, h, w, b)`, its rows written one at a time (the loop over
    columns kept apart from the parallel loop over rows, each column one vector of the block): with every axis
    but the block fused, the index arithmetic of each 16-lane copy cost as much as a depthwise convolution's
    FMAs. `keep`: stages the caller schedules itself (not inlined)."""
    pads = producers_tagged(sch, anchor, "pad")
    acc = cache_accumulator(sch, anchor)
    at_root = config.get("pad", "root") == "root"
    inline_cheap(sch, keep={acc, *(p.name for p in pads), *keep})
    for pad in pads:
        if not at_root:
            sch.compute_inline(pad.name)
        elif blocked:
            blocked_rows(sch, pad, target)
        else:
            flat_loops(sch, pad, target)
    return acc


def order_reduction(sch: Any, acc: str, spatial: Sequence[str], reduce: Sequence[str], config: Config) -> None:
    """Reduction loops outside the tile's spatial loops: input channels first (`c_hw`), last (`hw_c`), or blocked
    around the kernel taps (`blocked`: channel blocks, taps, channels of a block); the kernel-column loop unrolled
    with `unroll_kw`."""
    reduce = list(reduce)
    kw = reduce[-1] if reduce else None  # the kernel-column loop (last in compute order)
    order = config.get("reduce_order")
    if order == "hw_c" and len(reduce) >= 3:
        reduce = [*reduce[1:], reduce[0]]
    elif order == "blocked" and len(reduce) >= 3:
        outer, inner = sch.split(acc, reduce[0], factor=inner_factor(config, "tile_ic"))
        reduce = [outer, *reduce[1:], inner]
    sch.reorder(acc, *reduce, *spatial)
    if config.get("unroll_kw") and kw is not None:
        sch.unroll(acc, kw)
