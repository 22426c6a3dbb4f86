"""The `conv2d_nchwc` family: `nn.contrib_conv2d_NCHWc` on `NCHW{bi}c` data, an `OIHW{bi}i{bo}o` weight and a
`NCHW{bo}c` output, the weight constant and already in that layout.

Knobs: a register tile of `tile_w` output columns (unrolled) by `tile_cb` output channel blocks (unrolled) by the
block's `bo` lanes (vectorized), each input value broadcast from `(n, icb, h, w, bi)` and each weight row read
contiguously; `order`, `parallel`, `reduce_order` (input channel blocks outside or inside the kernel taps; the
channels of a block innermost either way), `unroll_kw`, `pad`. Fused epilogues run on the tile's vectors.

A 1x1 convolution may carry an element-wise prologue on its input (`FuseOps` fuses a pre-activation scale, shift
and ReLU read by nothing else into it: DenseNet's BN-ReLU-Conv). The template computes the prologue one input row
(every channel) at a time, in a buffer the row's channel-block tiles all read: rows are then the outermost loop
(`order` "hc"), and `parallel` is 1 (rows in parallel) or 0. Inlined into the reduction instead, the prologue
would run once per output channel block for every input value.
"""

from __future__ import annotations

import functools
from typing import Any

from relay_tune.kernel import te
from search_space.config import Config
from search_space.families.common import (
    MAX_CHANNEL_BLOCKS,
    CpuWorkload,
    Family,
    TileKnob,
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
)
from search_space.families.convolution import (
    analyse_blocked_conv,
    blocked_registers_fit,
    prepare_conv,
    tagged,
    tap_defaults,
    tap_knobs,
)
from search_space.knobs import ChoiceKnob, Knob
from search_space.space import Constraint

# -- space -------------------------------------------------------------------------------------------------------


def _divides(config: Config, knob: str, extent: int) -> bool:
    """A tile of channel blocks divides the blocks: a tail tile of blocks is guarded inside the reduction (a
    third of the speed on ResNet-50's 256-channel 3x3 convolution in tiles of 3 blocks)."""
    return extent % inner_factor(config, knob) == 0


def _order_needs_channel_tiles(config: Config, blocks: int, prologue: bool = False) -> bool:
    """With one tile of channel blocks, rows-first (`hc`) and blocks-first (`ch`) outer loops are the same loop nest:
    only `ch` is kept, so the search never measures one schedule twice (with a prologue only `hc` exists)."""
    return prologue or config["order"] == "ch" or inner_factor(config, "tile_cb") < blocks


def _has_prologue(workload: CpuWorkload) -> bool:
    return bool(workload.extras.get("prologue", False))


def prologue_stage(sch: Any, anchor: Any) -> Any:
    """The computed stage a float32 blocked 1x1 convolution reads as its data (a fused element-wise prologue), or
    None when the data is a kernel input or padded (or the anchor is another blocked convolution)."""
    if anchor.op.tag != "conv2d_nchwc" or any(ax.extent != 1 for ax in anchor.op.reduce_axes[1:3]):
        return None
    for tensor in te.tensors_read(anchor.op.body):
        stage = sch.stage_of_tensor(tensor)
        if tensor.ndim == 5 and stage is not None and stage.op is not None:
            return None if stage.op.tag == "pad" else stage
    return None


def _analyse(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int]) -> dict[str, Any]:
    fields = analyse_blocked_conv(prim, sch, anchor, target, constants, depthwise=False)
    return {**fields, "extras": {"prologue": prologue_stage(sch, anchor) is not None}}


def _tile_w(workload: CpuWorkload) -> TileKnob:
    budget = workload.accumulator_budget
    return TileKnob("tile_w", workload.dims["w"], 2, budget, row_sizes(budget))


def _has_reduce_order(workload: CpuWorkload) -> bool:
    return workload.dims["taps"] > 1 and workload.dims["icb"] > 1


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    dims = workload.dims
    prologue = _has_prologue(workload)
    knobs: list[Knob] = [
        _tile_w(workload),
        TileKnob("tile_cb", dims["cb"], 2, MAX_CHANNEL_BLOCKS, row_sizes(MAX_CHANNEL_BLOCKS)),
        ChoiceKnob("order", ["hc"] if prologue else ["hc", "ch"]),
        ChoiceKnob("parallel", parallel_choices(workload, 1 if prologue else 2)),
    ]
    if _has_reduce_order(workload):
        knobs.append(ChoiceKnob("reduce_order", ["c_hw", "hw_c"]))
    knobs += tap_knobs(workload)
    constraints = [
        Constraint("accumulator tile and its operands fit the vector registers", functools.partial(
            blocked_registers_fit, lanes=workload.lanes, budget=workload.accumulator_budget, block=dims["block"],
            rows="tile_cb", columns="tile_w", registers=workload.registers)),
        Constraint("channel-block tiles divide the blocks", functools.partial(
            _divides, knob="tile_cb", extent=dims["cb"])),
        Constraint("loop order only with several channel-block tiles", functools.partial(
            _order_needs_channel_tiles, blocks=dims["cb"], prologue=prologue)),
    ]
    return knobs, constraints


# -- default -----------------------------------------------------------------------------------------------------


def _default(workload: CpuWorkload) -> dict[str, Any]:
    """Register tile of a blocked convolution: `tile_w` columns (unrolled) by `tile_cb` output blocks, each
    accumulator one vector of the block. Per input channel the tile loads `tile_cb` weight vectors and broadcasts
    `tile_w` input values for `tile_w * tile_cb` FMAs: two blocks share every broadcast (three where the blocks
    are an odd multiple of 3: 24 channels in blocks of 8, 8x3 tiles 1.25x faster than 14x1), the columns fill the
    rest of the registers in balanced row pieces, and rows shorter than that (7 columns) take a third block where
    the blocks divide by 3.

    Loop order: blocks-first (`ch`) streams the whole input once per tile of output blocks, rows-first (`hc`) the
    whole weight once per row, each re-read from cache while the row or the weight fits. Rows go first where the
    input is the larger (more output pixels than output channels times taps): a 256 -> 64 channel 1x1 convolution
    on a 100x76 map ran 2x faster rows-first, DenseNet's 224 -> 128 on 56x56 2.6x. The int8 and bf16 families,
    which share this rule, keep blocks first."""
    dims, budget, registers = workload.dims, workload.accumulator_budget, workload.registers
    per = vector_registers(dims["block"], workload.lanes)

    def widest(blocks: int) -> int:  # columns whose accumulators, weights and broadcast fit the registers
        return max(1, min(budget // (blocks * per), (registers - 1 - blocks * per) // (blocks * per)))

    blocks = 2 if dims["cb"] % 2 == 0 else max(b for b in (1, 3) if dims["cb"] % b == 0)
    tw = closest_factor(_tile_w(workload), balanced(dims["w"], widest(blocks)))
    blocks = max(b for b in range(1, min(dims["cb"], 4) + 1) if dims["cb"] % b == 0 and widest(b) >= tw)
    prologue = _has_prologue(workload)
    # float32 only: the int8 and bf16 families share this rule, and their order was not measured
    rows_first = prologue or (workload.family == "conv2d_nchwc" and dims["cb"] > blocks
                              and dims["h"] * dims["w"] > dims["cb"] * dims["block"] * dims["taps"])
    values: dict[str, Any] = {"tile_w": split_value(dims["w"], tw), "tile_cb": split_value(dims["cb"], blocks),
                              "order": "hc" if rows_first else "ch",
                              "parallel": default_parallel(workload, 1 if prologue else 2)}
    if _has_reduce_order(workload):
        values["reduce_order"] = "c_hw"
    return {**values, **tap_defaults(workload)}


# -- template ----------------------------------------------------------------------------------------------------


def _template_conv2d_nchwc(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """Output `(n, cb, h, w, b)`: a tile of `tile_w` columns (unrolled) by `tile_cb` channel blocks (unrolled) by
    the block's `b` lanes (vectorized); the reduction outside the tile, input channels of a block innermost, so
    every step broadcasts `x[n, rcb, y, x, rci]` and loads the contiguous weight row `w[f, rcb, rh, rw, rci, :]`.
    The epilogue (bias, activation, residual) runs on the tile's vectors as they leave the registers; a prologue
    (module docstring) is computed one input row at a time at the loop over rows, its channel block vectorized."""
    anchor = anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    prologue = prologue_stage(sch, anchor)
    acc = prepare_conv(sch, anchor, config, target, blocked=True, keep=[prologue.name] if prologue else [])
    n, c, h, w, lane = sch.leaves(out)
    co, ci = sch.split(out, c, factor=inner_factor(config, "tile_cb"))
    wo, wi = sch.split(out, w, factor=inner_factor(config, "tile_w"))
    outer = [n, h, co] if config["order"] == "hc" else [n, co, h]
    sch.reorder(out, *outer, wo, ci, wi, lane)
    if prologue is not None:
        if config["order"] != "hc" or int(config["parallel"]) > 1:  # type: ignore[arg-type]
            raise ValueError("a convolution with a prologue runs rows outermost (order hc, parallel 0 or 1)")
        rows = sch.fuse(out, n, h)
        if int(config["parallel"]) and target.num_cores > 1:  # type: ignore[arg-type]
            sch.parallel(out, rows)
        sch.compute_at(prologue.name, out, rows)
        sch.vectorize(prologue.name, sch.leaves(prologue.name)[-1])
    else:
        fuse_outer(sch, out, outer, int(config["parallel"]), target)  # type: ignore[arg-type]
    sch.vectorize(out, lane)
    sch.compute_at(acc, out, wo)
    an, ac, ah, aw, alane, rcb, rh, rw, rci = sch.leaves(acc)
    reduce = [rh, rw, rcb, rci] if config.get("reduce_order") == "hw_c" else [rcb, rh, rw, rci]
    # Columns outside the channel blocks: one broadcast input value feeds the blocks' FMAs and dies (blocks outside
    # the columns keep every column's broadcast live across them, and the tile spills).
    sch.reorder(acc, *reduce, an, ah, aw, ac, alane)
    if config.get("unroll_kw"):
        sch.unroll(acc, rw)
    sch.unroll(acc, ac)
    sch.unroll(acc, aw)
    sch.vectorize(acc, alane)


CONV2D_NCHWC = Family("conv2d_nchwc", tagged("conv2d_nchwc"), _analyse, _knobs, _default, _template_conv2d_nchwc)
