"""The depthwise convolution families: `depthwise_conv2d_nchw`, and `depthwise_conv2d_nchwc` (grouped one channel
per group on `NCHW{b}c` data, an `OIHW1i{b}o` weight).

Knobs: `tile_h` rows by `tile_w` columns per tile (NCHW: the columns vectorized; blocked: one block, the block's
lanes vectorized), `parallel`, `unroll_kw`, `pad`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from relay_tune.kernel import te
from search_space.config import Config
from search_space.families.common import (
    MAX_CONV_ROWS,
    MAX_VECTOR,
    CpuWorkload,
    Family,
    TileKnob,
    accumulator_registers,
    anchor_stage,
    balanced,
    closest_factor,
    default_parallel,
    inner_factor,
    parallel_choices,
    producers_tagged,
    row_sizes,
    split_value,
    vector_registers,
    vector_sizes,
)
from search_space.families.convolution import (
    analyse_blocked_conv,
    analyse_conv,
    blocked_registers_fit,
    order_reduction,
    prepare_conv,
    tagged,
    tap_defaults,
    tap_knobs,
)
from search_space.knobs import ChoiceKnob, Knob
from search_space.space import Constraint

# -- spaces ------------------------------------------------------------------------------------------------------


def _depthwise_registers_fit(config: Config, lanes: int, budget: int) -> bool:
    return accumulator_registers(inner_factor(config, "tile_h"), inner_factor(config, "tile_w"), lanes) <= budget


def _tile_h(workload: CpuWorkload) -> TileKnob:
    return TileKnob("tile_h", workload.dims["h"], 2, MAX_CONV_ROWS, row_sizes(MAX_CONV_ROWS))


def _tile_w(workload: CpuWorkload) -> TileKnob:
    return TileKnob("tile_w", workload.dims["w"], 2, MAX_VECTOR, vector_sizes(workload.lanes, MAX_VECTOR))


def _blocked_tile_w(workload: CpuWorkload) -> TileKnob:
    budget = workload.accumulator_budget
    return TileKnob("tile_w", workload.dims["w"], 2, budget, row_sizes(budget))


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    knobs = [_tile_h(workload), _tile_w(workload), ChoiceKnob("parallel", parallel_choices(workload, 2)),
             *tap_knobs(workload)]
    return knobs, [Constraint("accumulator tile fits the vector registers", functools.partial(
        _depthwise_registers_fit, lanes=workload.lanes, budget=workload.accumulator_budget))]


def _blocked_knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    knobs = [_tile_h(workload), _blocked_tile_w(workload), ChoiceKnob("parallel", parallel_choices(workload, 2)),
             *tap_knobs(workload)]
    return knobs, [Constraint("accumulator tile fits the vector registers", functools.partial(
        blocked_registers_fit, lanes=workload.lanes, budget=workload.accumulator_budget,
        block=workload.dims["block"], rows="tile_h", columns="tile_w"))]


# -- defaults ----------------------------------------------------------------------------------------------------


def _default(workload: CpuWorkload) -> dict[str, Any]:
    dims = workload.dims
    vx = closest_factor(_tile_w(workload), min(dims["w"], 2 * workload.lanes))
    fit = workload.accumulator_budget // vector_registers(vx, workload.lanes)
    # Row tiles that divide the map: a tail tile is guarded inside the parallel loop at every tap (the 14-row
    # maps of MobileNet v2 in tiles of 4: 2.3-2.9x the best config). Small maps (two tiles of at most 8 rows) take
    # the taller tile: each tile re-reads two rows of input, and the best configs of 1,000 trials there have 6-8
    # rows. Where no tall tile divides the map (7 rows on 16 registers hold 4), the tile is the largest that does.
    rows = max(1, min(dims["h"], MAX_CONV_ROWS if dims["h"] <= 2 * MAX_CONV_ROWS else 4, fit))
    rows = dims["h"] if dims["h"] <= MAX_CONV_ROWS and dims["h"] <= fit else \
        max(c for c in _tile_h(workload).candidates if c <= rows and dims["h"] % c == 0)
    # Channels in parallel, each core's channels whole (`parallel` 1): the best config of every MobileNet v2
    # depthwise layer after 1,000 trials on 2 cores (the fused channel-row loop split maps between cores).
    # Padding read in place (masked vector loads at the borders) beats a padded copy on every MobileNet v2
    # depthwise layer: 1.2-12x on one core.
    return {"tile_h": split_value(dims["h"], rows), "tile_w": split_value(dims["w"], vx),
            "parallel": min(default_parallel(workload, 2), 1), **tap_defaults(workload, pad="inline")}


def _blocked_default(workload: CpuWorkload) -> dict[str, Any]:
    """Register tile of a blocked depthwise convolution: one row of at most 8 columns (balanced pieces) of one
    block. Each tap costs a vector load per FMA whatever the tile, so a larger tile only saves weight loads: on
    MobileNet v2's 3x3 layers (28-112 columns) one row of 8 was 2-9% faster than 2 rows of 7-8 or 4 rows of 4."""
    dims = workload.dims
    per = vector_registers(dims["block"], workload.lanes)
    tw = closest_factor(_blocked_tile_w(workload),
                        balanced(dims["w"], max(1, min(8, workload.accumulator_budget // per))))
    return {"tile_h": split_value(dims["h"], 1), "tile_w": split_value(dims["w"], tw),
            "parallel": default_parallel(workload, 2), **tap_defaults(workload)}


# -- templates ---------------------------------------------------------------------------------------------------


def depthwise_tiles(sch: Any, out: str, n: str, c: str, h: str, w: str, inner: Sequence[str], config: Config,
                     target: Any) -> tuple[str, str]:
    """A depthwise output's tiles of `tile_h` rows by `tile_w` columns (loops `inner` innermost), channels outermost;
    `parallel` 2 runs channels and row tiles in parallel, 1 channels only. Returns the column loops (tile, inside)."""
    ho, hi = sch.split(out, h, factor=inner_factor(config, "tile_h"))
    wo, wi = sch.split(out, w, factor=inner_factor(config, "tile_w"))
    sch.reorder(out, n, c, ho, wo, hi, wi, *inner)
    parallel = int(config["parallel"])  # type: ignore[arg-type]
    if parallel == 2 and target.num_cores > 1:
        sch.parallel(out, sch.fuse(out, n, c, ho))
    else:
        outer = sch.fuse(out, n, c)
        if parallel == 1 and target.num_cores > 1:
            sch.parallel(out, outer)
    return wo, wi


def _computed_input(sch: Any, anchor: Any) -> Any:
    """The stage that computes the convolution's data inside the fused function (a channel shuffle that FuseOps
    fused into it), or None when the data is a parameter."""
    pads = producers_tagged(sch, anchor, "pad")
    reader = pads[0] if pads else anchor
    for tensor in te.tensors_read(reader.op.body):
        producer = sch.stage_of_tensor(tensor)
        if producer is not None and producer.op is not None and tensor.ndim == 4 and not producer.op.is_reduction:
            return producer
    return None


def _template_depthwise(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """Channels outermost, row and column tiles inside, columns vectorized. A fused channel shuffle is computed one
    channel plane at a time at the channel loop when the padding is read in place: the permutation picks which
    input plane is copied, and the taps read the copy (inlined into every tap, its index arithmetic would run nine
    times per output); with a padded copy at the root, that copy reads through the shuffle."""
    anchor = anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    # With the padded copy at the root (`pad` "root"), the shuffle is inlined into that copy instead.
    padded_copy = config.get("pad", "root") == "root" and producers_tagged(sch, anchor, "pad")
    shuffled = None if padded_copy else _computed_input(sch, anchor)
    acc = prepare_conv(sch, anchor, config, target, keep=[shuffled.name] if shuffled is not None else [])
    n, c, h, w = sch.leaves(out)
    wo, wi = depthwise_tiles(sch, out, n, c, h, w, (), config, target)
    if shuffled is not None:
        sch.compute_at(shuffled.name, out, sch.leaves(out)[0])
    sch.vectorize(out, wi)
    sch.compute_at(acc, out, wo)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    order_reduction(sch, acc, [an, ac, ah, aw], reduce, config)
    sch.unroll(acc, ah)
    sch.vectorize(acc, aw)


def _template_depthwise_nchwc(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """Output `(n, cb, h, w, b)`: a tile of `tile_h` rows by `tile_w` columns (both unrolled) of one block, the
    block's lanes vectorized; each tap is one vector load of the input block and one FMA per tile position."""
    anchor = anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    acc = prepare_conv(sch, anchor, config, target, blocked=True)
    n, c, h, w, lane = sch.leaves(out)
    wo, _ = depthwise_tiles(sch, out, n, c, h, w, (lane,), config, target)
    sch.vectorize(out, lane)
    sch.compute_at(acc, out, wo)
    an, ac, ah, aw, alane, rh, rw = sch.leaves(acc)
    sch.reorder(acc, rh, rw, an, ac, ah, aw, alane)
    if config.get("unroll_kw"):
        sch.unroll(acc, rw)
    sch.unroll(acc, ah)
    sch.unroll(acc, aw)
    sch.vectorize(acc, alane)


DEPTHWISE_CONV2D_NCHW = Family("depthwise_conv2d_nchw", tagged("depthwise_conv2d_nchw"), analyse_conv, _knobs,
                               _default, _template_depthwise)
DEPTHWISE_CONV2D_NCHWC = Family("depthwise_conv2d_nchwc", tagged("depthwise_conv2d_nchwc"),
                                functools.partial(analyse_blocked_conv, depthwise=True), _blocked_knobs,
                                _blocked_default, _template_depthwise_nchwc)
