"""The channel-last convolution families: `conv2d_nhwc`, and `conv2d_nchw_cl` (NCHW convolutions on maps narrower
than `relay_tune.op.nn.NARROW_MAP`, whose sums the compute keeps channel-innermost).

Knobs: a register tile of `tile_w` output columns (unrolled) by `tile_c` output channels (vectorized, contiguous
along the sums; weights packed `-> OHWI<bc>o` for NHWC, `OIHW -> OIHW<bc>o` for NCHW), plus `order`, `parallel`,
`reduce_order`, `unroll_kw`, `pad`. `conv2d_nchw_cl` writes the tile back to NCHW with the epilogue.
"""

from __future__ import annotations

import functools
from typing import Any

from search_space.config import Config
from search_space.families.common import (
    MAX_TILE_ROWS,
    MAX_VECTOR,
    CpuWorkload,
    Family,
    TileKnob,
    accumulator_registers,
    anchor_stage,
    balanced,
    closest_factor,
    default_parallel,
    fuse_outer,
    inner_factor,
    parallel_choices,
    row_sizes,
    split_value,
    vector_registers,
    vector_sizes,
)
from search_space.families.convolution import (
    analyse_conv,
    conv_reduction_defaults,
    conv_reduction_knobs,
    conv_weight,
    ic_blocks_only_when_blocked,
    order_reduction,
    pack_needs_block,
    prepare_conv,
    tagged,
)
from search_space.knobs import BoolKnob, ChoiceKnob, Knob
from search_space.space import Constraint

# -- space -------------------------------------------------------------------------------------------------------


def _conv_nhwc_registers_fit(config: Config, lanes: int, budget: int) -> bool:
    return accumulator_registers(inner_factor(config, "tile_w"), inner_factor(config, "tile_c"), lanes) <= budget


def _tile_w(workload: CpuWorkload) -> TileKnob:
    return TileKnob("tile_w", workload.dims["w"], 2, MAX_TILE_ROWS, row_sizes(MAX_TILE_ROWS))


def _tile_c(workload: CpuWorkload) -> TileKnob:
    return TileKnob("tile_c", workload.dims["c"], 2, MAX_VECTOR, vector_sizes(workload.lanes, MAX_VECTOR))


def _packs(workload: CpuWorkload) -> bool:
    return workload.constant_weight and sorted(workload.weight_layout) == sorted("OIHW")


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    knobs: list[Knob] = [
        _tile_w(workload),
        _tile_c(workload),
        ChoiceKnob("order", ["hc", "ch"]),
        ChoiceKnob("parallel", parallel_choices(workload, 2)),
        *conv_reduction_knobs(workload),
    ]
    constraints: list[Constraint] = []
    if any(k.name == "tile_ic" for k in knobs):
        constraints.append(Constraint("input-channel blocks only with the blocked order", ic_blocks_only_when_blocked))
    if _packs(workload):
        knobs.append(BoolKnob("pack_w"))
        constraints.append(Constraint("weight packing needs a channel block",
                                      functools.partial(pack_needs_block, knob="tile_c")))
    constraints.append(Constraint("accumulator tile fits the vector registers", functools.partial(
        _conv_nhwc_registers_fit, lanes=workload.lanes, budget=workload.accumulator_budget)))
    return knobs, constraints


# -- default -----------------------------------------------------------------------------------------------------


def _default(workload: CpuWorkload, *, nchw: bool) -> dict[str, Any]:
    """Two vectors of channels (or all of them, rounded up to vectors), as many columns as the registers hold (8
    at most)."""
    lanes, dims = workload.lanes, workload.dims
    c = dims["c"]
    bc = 2 * lanes if c >= 2 * lanes else (-(-c // lanes) * lanes if c > lanes // 2 else c)
    bc = closest_factor(_tile_c(workload), min(bc, c))
    tw = max(1, min(dims["w"], 8, workload.accumulator_budget // vector_registers(bc, lanes)))
    if nchw:
        # Balanced row pieces: the fewest tiles of at most `tw` columns, as even as they go (13 columns: 7 + 6).
        # Only divisors of the width, as this rule took before, leave one column per tile on a prime width
        # (2 accumulators of 28): 2.1-2.3x slower on SqueezeNet's 13x13 3x3 convolutions.
        tw = balanced(dims["w"], tw)
    tw = closest_factor(_tile_w(workload), tw)
    values: dict[str, Any] = {"tile_w": split_value(dims["w"], tw), "tile_c": split_value(c, bc),
                              "order": "ch" if nchw else "hc", "parallel": default_parallel(workload, 2),
                              **conv_reduction_defaults(workload)}
    if _packs(workload):
        values["pack_w"] = bc > 1 and (c > bc or nchw)
    return values


# -- templates ---------------------------------------------------------------------------------------------------


def _template_conv2d_nhwc(sch: Any, prim: Any, config: Config, target: Any) -> None:
    anchor = anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    call = prim.anchor_call
    bc = inner_factor(config, "tile_c")
    tw = inner_factor(config, "tile_w")
    weight = conv_weight(anchor, 3)
    layout = str(call.attrs["kernel_layout"])
    if weight is not None and config.get("pack_w") and bc > 1:
        sch.transform_layout(weight, layout, f"OHWI{bc}o")
    acc = prepare_conv(sch, anchor, config, target)
    n, h, w, c = sch.leaves(out)
    wo, wi = sch.split(out, w, factor=tw)
    co, ci = sch.split(out, c, factor=bc)
    outer = [n, h, co] if config["order"] == "hc" else [n, co, h]
    sch.reorder(out, *outer, wo, wi, ci)
    fuse_outer(sch, out, outer, int(config["parallel"]), target)  # type: ignore[arg-type]
    sch.vectorize(out, ci)
    sch.compute_at(acc, out, wo)
    an, ah, aw, ac, *reduce = sch.leaves(acc)
    order_reduction(sch, acc, [an, ah, aw, ac], reduce, config)
    sch.unroll(acc, aw)
    sch.vectorize(acc, ac)


def _template_conv2d_nchw_cl(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """NCHW output, sums computed channel-innermost (`n, h, w, c`): a tile of `tile_w` columns (unrolled) by
    `tile_c` channels (vectorized), scattered back to NCHW with the epilogue."""
    anchor = anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    bc = inner_factor(config, "tile_c")
    weight = conv_weight(anchor, 3)
    if weight is not None and config.get("pack_w") and bc > 1:
        sch.transform_layout(weight, "OIHW", f"OIHW{bc}o")
    acc = prepare_conv(sch, anchor, config, target)
    n, c, h, w = sch.leaves(out)
    co, ci = sch.split(out, c, factor=bc)
    wo, wi = sch.split(out, w, factor=inner_factor(config, "tile_w"))
    outer = [n, h, co] if config["order"] == "hc" else [n, co, h]
    sch.reorder(out, *outer, wo, wi, ci)
    fuse_outer(sch, out, outer, int(config["parallel"]), target)  # type: ignore[arg-type]
    sch.vectorize(out, ci)
    sch.compute_at(acc, out, wo)
    an, ah, aw, ac, *reduce = sch.leaves(acc)
    order_reduction(sch, acc, [an, ah, aw, ac], reduce, config)
    sch.unroll(acc, aw)
    sch.vectorize(acc, ac)


CONV2D_NHWC = Family("conv2d_nhwc", tagged("conv2d_nhwc"), functools.partial(analyse_conv, channel_last=True),
                     _knobs, functools.partial(_default, nchw=False), _template_conv2d_nhwc)
CONV2D_NCHW_CL = Family("conv2d_nchw_cl", tagged("conv2d_nchw_cl"), functools.partial(analyse_conv, channel_last=True),
                        _knobs, functools.partial(_default, nchw=True), _template_conv2d_nchw_cl)
