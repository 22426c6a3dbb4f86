"""The `conv2d_nchw` family: a direct NCHW convolution tiled for the vector registers.

Knobs: a register tile of `tile_c` output channels (weights packed `OIHW -> OIHW<fc>o` with `pack_w`) by `tile_h`
rows by `tile_w` output columns (vectorized); `order` of the outer loops (rows or channel blocks first), `parallel`
fused outer loops, `reduce_order` (input channels or kernel taps outermost, or `blocked`: blocks of `tile_ic` input
channels around the taps), `unroll_kw` (unroll the kernel-column loop), `pad` (the padded input computed once ahead,
or read through a guard).

1x1 stride-1 convolutions also have `row_vector`: a tile covers whole rows and one vector runs across them; and
`tile_p` (flat mode when its inner factor is above 1): the convolution as the matrix product
W[C_out, C_in] x X[C_in, H*W], the map one flat axis of positions tiled by `tile_p` (vectorized) under each block
of `tile_c` channels, for maps whose rows are narrower than a few vectors (13x13: 169 positions fill 16-lane
vectors, 13-lane rows do not).
"""

from __future__ import annotations

import functools
from typing import Any

from search_space.config import Config
from search_space.families.common import (
    MAX_CONV_CHANNELS,
    MAX_CONV_ROWS,
    MAX_TILE_ROWS,
    MAX_VECTOR,
    CpuWorkload,
    Family,
    TileKnob,
    anchor_stage,
    closest_factor,
    default_parallel,
    dividing_factor,
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

MAX_FLAT_TILES = 16
"""Position tiles of a pointwise convolution in flat mode, each one unrolled (the accumulator block must stay in
registers, see `_flat_pointwise`): bounds the code size, and keeps flat mode to the small maps it is for."""


# -- space -------------------------------------------------------------------------------------------------------


def _flat_positions(config: Config) -> int:
    """The positions per register tile of a pointwise convolution in flat mode (`tile_p`), 1 when off."""
    return inner_factor(config, "tile_p") if "tile_p" in config else 1


def _conv_nchw_registers_fit(config: Config, lanes: int, budget: int, width: int) -> bool:
    rows, channels = inner_factor(config, "tile_h"), inner_factor(config, "tile_c")
    if _flat_positions(config) > 1:
        return channels * vector_registers(_flat_positions(config), lanes) <= budget
    if config.get("row_vector"):
        return channels * vector_registers(rows * width, lanes) <= budget
    return channels * rows * vector_registers(inner_factor(config, "tile_w"), lanes) <= budget


def _flat_alone(config: Config, width: int, height: int) -> bool:
    """In flat mode (`tile_p` > 1) the rows, columns and loop order of the other modes mean nothing: they stay
    at one value (no row tile, whole rows, channel blocks outermost), so no two configs give the same schedule."""
    if _flat_positions(config) == 1:
        return True
    tiles = -(-height * width // _flat_positions(config))
    return (tiles <= MAX_FLAT_TILES and not config.get("row_vector") and config["tile_h"] == (height, 1)
            and config["tile_w"] == (1, width) and config["order"] == "ch"
            and int(config["parallel"]) < 2)  # type: ignore[arg-type]


def _row_vector_whole_rows(config: Config, width: int, height: int) -> bool:
    """`row_vector` tiles whole rows: the column split must be (1, width), and the rows must divide the map (a
    partial tile would keep its lanes masked)."""
    if not config.get("row_vector"):
        return True
    return inner_factor(config, "tile_w") == width and height % inner_factor(config, "tile_h") == 0


def _tile_c(workload: CpuWorkload) -> TileKnob:
    return TileKnob("tile_c", workload.dims["c"], 2, MAX_CONV_CHANNELS, row_sizes(MAX_TILE_ROWS))


def _tile_h(workload: CpuWorkload) -> TileKnob:
    return TileKnob("tile_h", workload.dims["h"], 2, MAX_CONV_ROWS, row_sizes(MAX_CONV_ROWS))


def _tile_w(workload: CpuWorkload) -> TileKnob:
    return TileKnob("tile_w", workload.dims["w"], 2, MAX_VECTOR, vector_sizes(workload.lanes, MAX_VECTOR))


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    lanes, budget, dims = workload.lanes, workload.accumulator_budget, workload.dims
    knobs: list[Knob] = [
        _tile_c(workload),
        _tile_h(workload),
        _tile_w(workload),
        ChoiceKnob("order", ["hc", "ch"]),
        ChoiceKnob("parallel", parallel_choices(workload, 2)),
        *conv_reduction_knobs(workload),
    ]
    constraints: list[Constraint] = []
    if any(k.name == "tile_ic" for k in knobs):
        constraints.append(Constraint("input-channel blocks only with the blocked order", ic_blocks_only_when_blocked))
    if workload.constant_weight:
        knobs.append(BoolKnob("pack_w"))
        constraints.append(Constraint("weight packing needs a channel block",
                                      functools.partial(pack_needs_block, knob="tile_c")))
    if workload.pointwise:
        knobs.append(BoolKnob("row_vector"))
        constraints.append(Constraint("row vectors cover whole rows", functools.partial(
            _row_vector_whole_rows, width=dims["w"], height=dims["h"])))
        knobs.append(TileKnob("tile_p", dims["h"] * dims["w"], 2, MAX_VECTOR, vector_sizes(lanes, MAX_VECTOR)))
        constraints.append(Constraint("flat tiles leave the row and column tiles unused", functools.partial(
            _flat_alone, width=dims["w"], height=dims["h"])))
    constraints.append(Constraint("accumulator tile fits the vector registers", functools.partial(
        _conv_nchw_registers_fit, lanes=lanes, budget=budget, width=dims["w"])))
    return knobs, constraints


def _later_knobs(workload: CpuWorkload, config: Config) -> Config:
    """`tile_p` off: pointwise configs logged before flat mode existed."""
    if workload.pointwise and "tile_p" not in config:
        return config.replace(tile_p=split_value(workload.dims["h"] * workload.dims["w"], 1))
    return config


# -- default -----------------------------------------------------------------------------------------------------


def _column_tile(workload: CpuWorkload) -> int:
    """Two vectors of columns, or wider where the last tile's tail then needs fewer registers."""
    lanes, dims = workload.lanes, workload.dims
    tile_w = _tile_w(workload)
    vx = closest_factor(tile_w, min(dims["w"], 2 * lanes))
    # The last column tile is peeled into power-of-two pieces, each a register per channel: 55 columns in
    # tiles of 32 leave 23 = 16+4+2+1, and 8 channels of 4 pieces spill. Take the first width whose tail
    # needs no more registers than a whole tile (55: tiles of 48, tail 7; 1.4x on SqueezeNet's 3x3 at 55x55).
    for wider in (2 * lanes, 3 * lanes, lanes):
        if vx == 2 * lanes and wider in tile_w.candidates and dims["w"] > wider:
            if vector_registers(dims["w"] % wider or wider, lanes) <= vector_registers(wider, lanes):
                return wider
    return vx


def _default(workload: CpuWorkload) -> dict[str, Any]:
    lanes, dims = workload.lanes, workload.dims
    parallel = default_parallel(workload, 2)
    tile_c = _tile_c(workload)
    vx = _column_tile(workload)
    fc = max(1, min(dims["c"], 8, workload.accumulator_budget // vector_registers(vx, lanes)))
    fc = dividing_factor(tile_c, fc)
    values: dict[str, Any] = {
        "tile_c": split_value(dims["c"], fc), "tile_h": split_value(dims["h"], 1),
        "tile_w": split_value(dims["w"], vx), "order": "hc", "parallel": parallel,
        **conv_reduction_defaults(workload)}
    if workload.constant_weight:
        values["pack_w"] = fc > 1
    if not workload.pointwise:
        return values
    values.update(row_vector=False, tile_p=split_value(dims["h"] * dims["w"], 1))
    if dims["w"] < lanes:
        # Whole rows that divide the map (`_row_vector_whole_rows`), at most the row tile's largest candidate.
        rows = max(r for r in _tile_h(workload).candidates
                   if dims["h"] % r == 0 and (r == 1 or r * dims["w"] <= 4 * lanes))
        fc = max(1, min(fc, workload.accumulator_budget // vector_registers(rows * dims["w"], lanes)))
        fc = dividing_factor(tile_c, fc)
        values.update(tile_c=split_value(dims["c"], fc), tile_h=split_value(dims["h"], rows),
                      tile_w=split_value(dims["w"], dims["w"]), row_vector=True)
        if workload.constant_weight:
            values["pack_w"] = fc > 1
    positions = dims["h"] * dims["w"]
    if dims["w"] < 2 * lanes and positions > 4 * lanes and -(-positions // (3 * lanes)) <= MAX_FLAT_TILES:
        # Narrow maps (13x13 to 27x27): the flat matrix product. 8 channels by two vectors of positions (three
        # when two would need more tiles than unrolling allows): 1.2-1.7x the row and column modes on the
        # 13x13 and 27x27 layers of SqueezeNet, 1.06-1.16x on 14x14 (experiments/README.md, "Flat pointwise
        # convolutions"). Maps of at most four vectors (7x7) stay in row mode, which covers them in one tile already
        # (flat: 0.95-1.03x).
        vp = min(positions, 2 * lanes if -(-positions // (2 * lanes)) <= MAX_FLAT_TILES else 3 * lanes)
        fit = workload.accumulator_budget // vector_registers(vp, lanes)
        # channel blocks are the parallel loop: at least one per core
        share = max(1, dims["c"] // workload.cores) if parallel else dims["c"]
        fc = dividing_factor(tile_c, min(share, 8, fit))
        values.update(tile_c=split_value(dims["c"], fc), tile_h=split_value(dims["h"], 1),
                      tile_w=split_value(dims["w"], dims["w"]), row_vector=False, order="ch",
                      parallel=min(parallel, 1), tile_p=split_value(positions, vp))
        if workload.constant_weight:
            values["pack_w"] = fc > 1
    return values


# -- template ----------------------------------------------------------------------------------------------------


def _template_conv2d_nchw(sch: Any, prim: Any, config: Config, target: Any) -> None:
    anchor = anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    fc = inner_factor(config, "tile_c")
    rows = inner_factor(config, "tile_h")
    weight = conv_weight(anchor, 1)
    if weight is not None and config.get("pack_w") and fc > 1:
        sch.transform_layout(weight, "OIHW", f"OIHW{fc}o")
    acc = prepare_conv(sch, anchor, config, target)
    n, c, h, w = sch.leaves(out)
    parallel = int(config["parallel"])  # type: ignore[arg-type]
    co, ci = sch.split(out, c, factor=fc)
    if _flat_positions(config) > 1:
        _flat_pointwise(sch, out, acc, n, co, ci, h, w, config, target)
        return
    if config.get("row_vector"):
        ho, hi = sch.split(out, h, factor=rows)
        outer = [n, ho, co] if config["order"] == "hc" else [n, co, ho]
        sch.reorder(out, *outer, ci, hi, w)
        at = fuse_outer(sch, out, outer, parallel, target)
        sch.vectorize(out, sch.fuse(out, hi, w))
        sch.compute_at(acc, out, at)
        an, ac, ah, aw, *reduce = sch.leaves(acc)
        order_reduction(sch, acc, [an, ac, ah, aw], reduce, config)
        sch.unroll(acc, ac)
        sch.vectorize(acc, sch.fuse(acc, ah, aw))
        return
    if rows > 1:
        ho, hi = sch.split(out, h, factor=rows)
    else:
        ho, hi = h, None
    wo, wi = sch.split(out, w, factor=inner_factor(config, "tile_w"))
    outer = [n, ho, co] if config["order"] == "hc" else [n, co, ho]
    sch.reorder(out, *outer, wo, *([hi] if hi else []), ci, wi)
    fuse_outer(sch, out, outer, parallel, target)
    sch.vectorize(out, wi)
    sch.compute_at(acc, out, wo)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    order_reduction(sch, acc, [an, ac, ah, aw], reduce, config)
    sch.unroll(acc, ac)
    if rows > 1:
        sch.unroll(acc, ah)
    sch.vectorize(acc, aw)


def _flat_pointwise(sch: Any, out: str, acc: str, n: str, co: str, ci: str, h: str, w: str, config: Config,
                    target: Any) -> None:
    """A 1x1 stride-1 NCHW convolution as the matrix product W[C_out, C_in] x X[C_in, H*W]: the accumulator of a
    block of `tile_c` channels covers the whole map (in L1), and inside it the map is one flat axis of H*W
    positions, tiled by `tile_p` (vectorized, the last tile shorter), so a 13x13 map fills 16-lane vectors
    instead of one 13-lane row each. The epilogue then runs over the block's positions, flat as well.

    Every tile loop is unrolled (`MAX_FLAT_TILES` bounds them), in the accumulation and in the epilogue alike:
    with constant offsets only, LLVM splits the block's scratch buffer into registers; a loop over tiles left it
    in memory, with a store after every FMA (4x slower)."""
    head = sch.fuse(out, n, co)
    if int(config["parallel"]) and target.num_cores > 1:  # type: ignore[arg-type]
        sch.parallel(out, head)
    flat = sch.fuse(out, h, w)
    po, pi = sch.split(out, flat, factor=_flat_positions(config))
    sch.unroll(out, ci)
    sch.unroll(out, po)
    sch.vectorize(out, pi)
    sch.compute_at(acc, out, head)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    positions = sch.fuse(acc, ah, aw)
    po, pi = sch.split(acc, positions, factor=_flat_positions(config))
    sch.reorder(acc, an, po, *reduce, ac, pi)
    sch.unroll(acc, po)
    sch.unroll(acc, ac)
    sch.vectorize(acc, pi)


CONV2D_NCHW = Family("conv2d_nchw", tagged("conv2d_nchw"), functools.partial(analyse_conv, pointwise=True), _knobs,
                     _default, _template_conv2d_nchw, _later_knobs)
