"""CPU schedule spaces: the knobs of each operator family, and the template that turns a config into schedule steps.

    workload = analyze(prim, target, constant_inputs)   # prim: relay_tune.kernel.compute.primitive_compute(func)
    space = cpu_space(workload)                          # knobs + constraints (invalid configs never get built)
    config = default_config(workload)                    # the untuned config, chosen by a rule from the shapes
    steps = config_to_steps(prim, config, target)        # replayable `Step`s for `lower_primitive`

This module is the only code that schedules a CPU kernel: one template per operator family below. The default
schedule an untuned build runs is the family's template at `default_config(workload)` (`search_space.defaults`),
and the tuner measures and logs that same config first.

A config is plain data; its `family` knob names the template. The template is deterministic: the same config gives
the same steps in every process, which is what makes a tuning log a recipe for the build. Tiles need not divide
their loops (lowering peels or guards the tails), so every config of a space is correct; constraints only reject
configs that cannot be fast (an accumulator tile that spills out of the vector registers) or that would describe
the same schedule as another config (a duplicate costs a measurement).

Families (`family_of`) and their knobs:

- **dense** / **batch_matmul**: `tile_m` and `tile_n` split the output rows / columns in three levels
  (blocks, register tiles per block, register tile); the inner column factor is the vector width and, for dense,
  the width of the weight panels (`pack_b`: the constant weight packed `NK -> NK<bn>n` once, so a tile reads
  consecutive floats at every step of the reduction). `tile_k` splits the reduction: the inner factor is
  unrolled. `k_block` (0: off) blocks the reduction around the row tiles: a column panel accumulates in scratch
  while K advances one block at a time, the block's weights staying in L1. `order` says whether column panels
  (`nm`) or row blocks (`mn`) are the outer loop, `parallel` how many outer block loops are fused into the
  parallel loop (0: none).
- **conv2d_nchw**: register tile of `tile_c` output channels (weights packed `OIHW -> OIHW<fc>o` with `pack_w`) by
  `tile_h` rows by `tile_w` output columns (vectorized); `order` of the outer loops (rows or channel blocks
  first), `parallel` fused outer loops, `reduce_order` (input channels or kernel taps outermost, or `blocked`:
  blocks of `tile_ic` input channels around the taps), `unroll_kw` (unroll the kernel-column loop), `pad` (the
  padded input computed once ahead, or read through a guard).
  1x1 stride-1 convolutions also have `row_vector`: a tile covers whole rows and one vector runs across them;
  and `tile_p` (flat mode when its inner factor is above 1): the convolution as the matrix product
  W[C_out, C_in] x X[C_in, H*W], the map one flat axis of positions tiled by `tile_p` (vectorized) under each
  block of `tile_c` channels, for maps whose rows are narrower than a few vectors (13x13: 169 positions fill 16-lane
  vectors, 13-lane rows do not).
- **conv2d_nhwc**: register tile of `tile_w` output columns (unrolled) by `tile_c` output channels (vectorized,
  contiguous in NHWC; weights packed `-> OHWI<bc>o`), plus `order`, `parallel`, `reduce_order`, `unroll_kw`, `pad`.
- **conv2d_nchw_cl** (NCHW convolutions on maps narrower than `relay_tune.op.nn.NARROW_MAP`, whose sums the
  compute keeps channel-innermost): the same knobs as NHWC (weights packed `OIHW -> OIHW<bc>o`); the tile is
  written back to NCHW with the epilogue.
- **depthwise_conv2d_nchw**: `tile_h` rows by `tile_w` columns per tile, `parallel`, `unroll_kw`, `pad`.
- **conv2d_nchwc** (`nn.contrib_conv2d_NCHWc` on `NCHW{bi}c` data, an `OIHW{bi}i{bo}o` weight, `NCHW{bo}c` output,
  the weight constant and already in that layout): register tile of `tile_w` output columns (unrolled) by
  `tile_cb` output channel blocks (unrolled) by the block's `bo` lanes (vectorized), each input value broadcast
  from `(n, icb, h, w, bi)` and each weight row read contiguously; `order`, `parallel`, `reduce_order` (input
  channel blocks outside or inside the kernel taps; the channels of a block innermost either way), `unroll_kw`,
  `pad`. Fused epilogues run on the tile's vectors.
- **depthwise_conv2d_nchwc** (grouped one channel per group, `OIHW1i{b}o` weight): `tile_h` rows by `tile_w`
  columns of one block (the block's lanes vectorized), `parallel`, `unroll_kw`, `pad`.
- **reduction** (pooling, reductions, softmax, normalisations, other convolutions): `vector` (tile width along
  the innermost output axis) where the reductions read it contiguously, `parallel`; on `NCHW{b}c` pooling that
  axis is the block, one vector of channels.
- **injective** (element-wise groups, transposes, concatenations...): `mode` (vectorize the innermost axis
  whole, split it by `vector`, fuse every axis and split by `vector`, or, for outputs in `NCHW{b}c`, fuse the
  columns and the block and split them by `vector`), `vector`, `parallel`. Layout transforms between NCHW and
  `NCHW{b}c` (or two blocks) also have mode `transpose` (`_transpose_loops`: every index affine in the vector's
  lanes), with `lanes` (along the block or the map's plane) and `unroll`.
- **winograd** (the Winograd transforms of `relay_tune.op.winograd`, an output transform with its fused epilogue):
  the transform positions unrolled and the channel block vectorized (`_template_winograd`); `order` (tiles or
  channel blocks outermost) and `parallel`.

`relay-tune tasks MODEL --spaces` prints each task's family and space size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relay_tune.kernel import te, tir
from relay_tune.kernel.compute import INLINABLE_TAGS
from relay_tune.kernel.schedule import ROOT, Schedule, ScheduleError
from search_space.config import Config, InvalidConfigError
from search_space.knobs import BoolKnob, ChoiceKnob, Knob, SplitKnob
from search_space.space import Constraint, Space

__all__ = [
    "FAMILIES",
    "CpuWorkload",
    "TileKnob",
    "accumulator_registers",
    "analyze",
    "config_to_steps",
    "cpu_space",
    "default_config",
    "family_of",
    "format_space_table",
    "input_index",
    "parameter_numbers",
    "task_workload",
    "vector_registers",
    "with_later_knobs",
]

FAMILIES = ("dense", "batch_matmul", "conv2d_nchw", "conv2d_nchw_cl", "conv2d_nhwc", "depthwise_conv2d_nchw",
            "conv2d_nchwc", "depthwise_conv2d_nchwc", "reduction", "injective", "winograd")

WINOGRAD_TAGS = ("winograd_input", "winograd_output")
"""Stage tags of the Winograd transforms (`relay_tune.op.winograd`): a fused function holding one is scheduled by
the `winograd` template."""

BLOCKED_CONVS = ("conv2d_nchwc", "depthwise_conv2d_nchwc")
"""Families of convolutions on channel-blocked layouts (`NCHW{b}c`): the output block is the vector."""

SPARE_REGISTERS = 4
"""Vector registers left for operands (broadcast inputs, weight vectors) besides the accumulator tile."""

MAX_TILE_ROWS = 16  # register rows of a matmul tile (unrolled)
MAX_VECTOR = 64  # lanes of a vectorized tile axis
MAX_K_UNROLL = 16
MAX_CONV_CHANNELS = 32  # output channels of a convolution register tile
MAX_CONV_ROWS = 8
MAX_CHANNEL_BLOCKS = 8  # output channel blocks of a blocked convolution's register tile
MAX_FLAT_TILES = 16
"""Position tiles of a pointwise convolution in flat mode, each one unrolled (the accumulator block must stay in
registers, see `_flat_pointwise`): bounds the code size, and keeps flat mode to the small maps it is for."""

PARALLEL_MIN_WORK = 1 << 14
"""Below this much work (output elements times reduction size) a default kernel runs on one core: starting a
parallel region costs more than it saves. 2^14 iterations take a few microseconds on one core, about what a
fork/join of libgomp's spinning team costs on an idle machine. Under heavy oversubscription (more runnable threads
than cores) every parallel region waits for a descheduled worker and serial kernels win far above this line
(`experiments/parallel_threshold.py` measures where the ratio crosses 1 on the machine at hand); the rule is
for a machine that runs the model, not one shared with other jobs."""


# ---------------------------------------------------------------------------------------------------------------
# What a space needs to know about a fused function
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuWorkload:
    """The facts about one fused function on one CPU target that its space depends on (plain data).

    dims: family-specific extents (see `analyze`). lanes: vector lanes of the anchor's dtype. registers: vector
    registers of the target. constant_weight: the operand a schedule may pack is a model constant (packing is
    then done once, ahead of time; a packed non-constant input would cost a copy the measurement cannot see).
    """

    family: str
    dims: Mapping[str, int]
    lanes: int
    registers: int
    cores: int
    constant_weight: bool = False
    has_pad: bool = False
    pointwise: bool = False
    weight_layout: str = ""
    default_parallel: bool = False
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def accumulator_budget(self) -> int:
        return max(1, self.registers - SPARE_REGISTERS)


def vector_registers(width: int, lanes: int) -> int:
    """Registers one row of `width` lanes occupies: whole vectors, then the power-of-two chunks the code generator
    cuts the rest into (each in a register of its own)."""
    return max(1, width // lanes + bin(width % lanes).count("1"))


def accumulator_registers(rows: int, width: int, lanes: int) -> int:
    return rows * vector_registers(width, lanes)


def _target_registers(target: Any) -> int:
    return 32 if target.vector_bits >= 512 else 16


def _anchor_stage(sch: Any, prim: Any) -> Any:
    """The stage of the anchor call that holds its main reduction (or its result when it has none)."""
    call = prim.anchor_call
    if call is None:
        return None
    stages = [st for st in (sch.stage_of_tensor(t) for t in call.tensors) if st is not None and st.op is not None]
    for st in reversed(stages):
        if st.op.is_reduction:
            return st
    return stages[-1] if stages else None


def _weight_input(anchor: Any) -> Any:
    """The 2-D placeholder a dense reduction reads as `w[j, k]` (j: the output column)."""
    column = anchor.op.axes[-1]
    for node in te.iter_exprs(anchor.op.body):
        if (isinstance(node, te.TensorRead) and node.tensor.is_placeholder and node.tensor.ndim == 2
                and node.indices[0] is column):
            return node.tensor
    return None


def _conv_weight(anchor: Any, channel_axis: int, ndim: int = 4) -> Any:
    """The weight placeholder of a convolution (4-D; 6-D blocked): the one read with the output channel (block)
    as an index."""
    channel = anchor.op.axes[channel_axis]
    for node in te.iter_exprs(anchor.op.body):
        if (isinstance(node, te.TensorRead) and node.tensor.is_placeholder and node.tensor.ndim == ndim
                and any(i is channel for i in node.indices)):
            return node.tensor
    return None


def _producers_tagged(sch: Any, stage: Any, tag: str) -> list[Any]:
    found = []
    for t in te.tensors_read(stage.op.body):
        producer = sch.stage_of_tensor(t)
        if producer is not None and producer.op is not None and producer.op.tag == tag:
            found.append(producer)
    return found


def _work(stage: Any) -> int:
    return math.prod(ax.extent for ax in stage.root_axes)


def _parallel_worthwhile(target: Any, work: int) -> bool:
    return target.num_cores > 1 and work >= PARALLEL_MIN_WORK


def input_index(tensor: Any) -> int | None:
    """The parameter number of a kernel input placeholder (`p3` -> 3, `p1.0` -> 1)."""
    name = str(tensor.name)
    if not name.startswith("p"):
        return None
    head = name[1:].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def parameter_numbers(prim: Any) -> tuple[int, ...]:
    """The parameter number of every kernel input (as constants: every weight a schedule may pack)."""
    return tuple(i for i in (input_index(t) for t in prim.inputs) if i is not None)


def family_of(prim: Any) -> str:
    """The template family of a fused function."""
    sch = Schedule(prim.outputs)
    if len(prim.outputs) == 1 and _winograd_stage(sch) is not None:
        return "winograd"
    anchor = _anchor_stage(sch, prim)
    if anchor is None or len(prim.outputs) != 1 or anchor.op is None or not anchor.op.is_reduction:
        return "injective"
    tag = anchor.op.tag
    if tag == "dense" and _weight_input(anchor) is not None:
        return "dense"
    if tag == "batch_matmul":
        return "batch_matmul"
    if tag in ("conv2d_nchw", "conv2d_nchw_cl", "conv2d_nhwc", "depthwise_conv2d_nchw", *BLOCKED_CONVS):
        return str(tag)
    return "reduction"


def _winograd_stage(sch: Any) -> Any:
    """The Winograd transform stage of a schedule's function, or None."""
    return next((st for st in sch.stages.values() if st.op is not None and st.op.tag in WINOGRAD_TAGS), None)


def _is_pointwise(sch: Any, anchor: Any) -> bool:
    """A 1x1, stride-1, unpadded NCHW convolution: input pixel (y, x) feeds output pixel (y, x) only."""
    if _producers_tagged(sch, anchor, "pad") or any(ax.extent != 1 for ax in anchor.op.reduce_axes[1:]):
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


def analyze(prim: Any, target: Any, constant_inputs: Iterable[int] = ()) -> CpuWorkload:
    """The `CpuWorkload` of a fused function's tensor expressions on `target`.

    constant_inputs: parameter numbers of the function that are model constants at every call site (weights).
    """
    constants = set(constant_inputs)
    family = family_of(prim)
    sch = Schedule(prim.outputs)
    anchor = _anchor_stage(sch, prim)
    registers = _target_registers(target)
    common: dict[str, Any] = {"family": family, "registers": registers, "cores": target.num_cores}
    if family in ("dense", "batch_matmul"):
        axes = anchor.op.axes
        weight = _weight_input(anchor) if family == "dense" else None
        batched = weight is None and len(axes) == 3
        m = axes[-2].extent if batched else math.prod(ax.extent for ax in axes[:-1])
        dims = {"batch": axes[0].extent if batched else 1, "m": m, "n": axes[-1].extent,
                "k": anchor.op.reduce_axes[0].extent}
        index = input_index(weight) if weight is not None else None
        return CpuWorkload(dims=dims, lanes=target.vector_lanes(anchor.tensor.dtype),
                           constant_weight=index is not None and index in constants,
                           default_parallel=_parallel_worthwhile(target, _work(anchor)), **common)
    if family in BLOCKED_CONVS:
        n, cb, h, w, block = anchor.shape
        # reduce axes as the compute orders them: (rcb, rh, rw, rci) dense, (rh, rw) depthwise
        reduce = [ax.extent for ax in anchor.op.reduce_axes]
        kh, kw = reduce[1:3] if family == "conv2d_nchwc" else reduce[:2]
        weight = _conv_weight(anchor, 1, ndim=6)
        index = input_index(weight) if weight is not None else None
        dims = {"n": n, "cb": cb, "h": h, "w": w, "block": block, "kh": kh, "kw": kw, "taps": kh * kw,
                "icb": reduce[0] if family == "conv2d_nchwc" else 1}
        return CpuWorkload(dims=dims, lanes=target.vector_lanes(anchor.tensor.dtype),
                           constant_weight=index is not None and index in constants,
                           has_pad=bool(_producers_tagged(sch, anchor, "pad")), weight_layout="blocked",
                           default_parallel=_parallel_worthwhile(target, _work(anchor)), **common)
    if family in ("conv2d_nchw", "conv2d_nchw_cl", "conv2d_nhwc", "depthwise_conv2d_nchw"):
        if family in ("conv2d_nhwc", "conv2d_nchw_cl"):  # sums kept channel-innermost
            n, h, w, c = anchor.shape
        else:
            n, c, h, w = anchor.shape
        reduce_extents = [ax.extent for ax in anchor.op.reduce_axes]
        taps = math.prod(reduce_extents[-2:]) if len(reduce_extents) >= 2 else 1
        weight = _conv_weight(anchor, 3 if family in ("conv2d_nhwc", "conv2d_nchw_cl") else 1)
        index = input_index(weight) if weight is not None else None
        call = prim.anchor_call
        layout = str(call.attrs.get("kernel_layout", "OIHW")) if call is not None else "OIHW"
        dims = {"n": n, "c": c, "h": h, "w": w, "taps": taps, "reduce_loops": len(reduce_extents),
                "kw": reduce_extents[-1] if reduce_extents else 1,
                "ic": reduce_extents[0] if len(reduce_extents) >= 3 else 1}
        return CpuWorkload(dims=dims, lanes=target.vector_lanes(anchor.tensor.dtype),
                           constant_weight=index is not None and index in constants,
                           has_pad=bool(_producers_tagged(sch, anchor, "pad")),
                           pointwise=family == "conv2d_nchw" and _is_pointwise(sch, anchor),
                           weight_layout=layout, default_parallel=_parallel_worthwhile(target, _work(anchor)),
                           **common)
    out = sch[prim.outputs[0]]
    lanes = target.vector_lanes(out.tensor.dtype)
    if family == "winograd":
        transform = _winograd_stage(sch)
        output_side = transform.op.tag == "winograd_output"
        dims = {"output": int(output_side), "block": out.op.axes[-1].extent if _blocked_stage(out) else 0}
        return CpuWorkload(dims=dims, lanes=lanes, default_parallel=_parallel_worthwhile(target, _work(transform)),
                           **common)
    if family == "reduction":
        mode, last = _reduction_mode(prim, target)
        work = max(_work(st) for st in sch.stages.values() if st.op is not None)
        return CpuWorkload(dims={"last": last}, lanes=lanes, default_parallel=_parallel_worthwhile(target, work),
                           has_pad=bool(_pad_stages(sch)) and mode != "scalar",
                           extras={"mode": mode, "blocked": out.op is not None and _blocked_stage(out)}, **common)
    # injective: every root stage gets flat loops
    stages = [st for st in sch.stages.values() if st.op is not None and st.attach == ROOT]
    inner = min((st.op.axes[-1].extent for st in stages if len(st.op.axes) >= 2), default=0)
    total = max((math.prod(ax.extent for ax in st.op.axes) for st in stages), default=1)
    lanes = min((target.vector_lanes(st.tensor.dtype) for st in stages), default=lanes)
    work = max((_work(st) for st in stages), default=1)
    written = [sch[t] for t in prim.outputs]  # the stages left after the template inlines the others
    period = math.gcd(*(_inner_period(st) for st in written if st.op is not None and len(st.op.axes) >= 2))
    dims = {"inner": inner, "total": total, "period": period}
    if 0 < inner < lanes and any(len(st.op.axes) >= 3 and
                                 _trailing_axes([ax.extent for ax in st.op.axes], lanes) < len(st.op.axes) - 1
                                 for st in stages):
        dims["narrow_rows"] = 1  # rows narrower than a vector: the "inner" mode fuses trailing axes
    if written and all(st.op is not None and _blocked_stage(st) for st in written):
        dims["blocked"] = 1  # NCHW{b}c outputs: the "rows" mode vectorizes a row's columns and blocks together
    transform = _transform_kind(prim)
    if transform is not None and lanes > 1:
        kind, block_in, block_out = transform
        dims.update(transform=TRANSFORM_KINDS.index(kind) + 1, block_in=block_in, block_out=block_out)
    return CpuWorkload(dims=dims, lanes=lanes,
                       default_parallel=_parallel_worthwhile(target, work), **common)


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
    if last >= 4 and len(leaves) >= 2:
        return "rows", last
    return "flat", last


# ---------------------------------------------------------------------------------------------------------------
# Constraints (module-level functions: spaces travel to build worker processes)
# ---------------------------------------------------------------------------------------------------------------


def _inner(config: Config, name: str) -> int:
    value = config[name]
    assert isinstance(value, tuple)
    return int(value[-1])


def _middle(config: Config, name: str) -> int:
    value = config[name]
    assert isinstance(value, tuple)
    return int(value[1]) if len(value) == 3 else 1


def _matmul_registers_fit(config: Config, lanes: int, budget: int) -> bool:
    return accumulator_registers(_inner(config, "tile_m"), _inner(config, "tile_n"), lanes) <= budget


def _conv_nchw_registers_fit(config: Config, lanes: int, budget: int, width: int) -> bool:
    rows, channels = _inner(config, "tile_h"), _inner(config, "tile_c")
    if _flat_positions(config) > 1:
        return channels * vector_registers(_flat_positions(config), lanes) <= budget
    if config.get("row_vector"):
        return channels * vector_registers(rows * width, lanes) <= budget
    return channels * rows * vector_registers(_inner(config, "tile_w"), lanes) <= budget


def _conv_nhwc_registers_fit(config: Config, lanes: int, budget: int) -> bool:
    return accumulator_registers(_inner(config, "tile_w"), _inner(config, "tile_c"), lanes) <= budget


def _depthwise_registers_fit(config: Config, lanes: int, budget: int) -> bool:
    return accumulator_registers(_inner(config, "tile_h"), _inner(config, "tile_w"), lanes) <= budget


def _blocked_registers_fit(config: Config, lanes: int, budget: int, block: int, rows: str, columns: str,
                           registers: int = 0) -> bool:
    """A blocked convolution's accumulators: `rows` x `columns` tiles of one output block each. With `registers`
    (the dense blocked convolution) the operands count too: one weight vector per channel block and the broadcast
    input value, all live at once in the tile's innermost step (7 columns by 4 blocks: 28 + 4 + 1 = 33 of 32
    registers spilled, 1.8x slower than any tile that fits)."""
    per = vector_registers(block, lanes)
    accumulators = _inner(config, rows) * _inner(config, columns) * per
    if registers:
        return accumulators + _inner(config, rows) * per + 1 <= registers
    return accumulators <= budget


def _divides(config: Config, knob: str, extent: int) -> bool:
    """A tile of channel blocks divides the blocks: a tail tile of blocks is guarded inside the reduction (a
    third of the speed on ResNet-50's 256-channel 3x3 convolution in tiles of 3 blocks)."""
    return extent % _inner(config, knob) == 0


def _order_needs_channel_tiles(config: Config, blocks: int) -> bool:
    """With one tile of channel blocks, rows-first (`hc`) and blocks-first (`ch`) outer loops are the same loop nest:
    only `ch` is kept, so the search never measures one schedule twice."""
    return config["order"] == "ch" or _inner(config, "tile_cb") < blocks


def _pack_needs_block(config: Config, knob: str) -> bool:
    """Packing a weight by blocks of one output channel changes nothing (the same schedule as unpacked)."""
    return not config.get("pack_w") or _inner(config, knob) > 1


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
    return _inner(config, "tile_w") == width and height % _inner(config, "tile_h") == 0


def _k_block_layout(config: Config) -> bool:
    """A K-blocked matmul accumulates a whole column panel: panels outermost (`nm`), parallel over panels at most,
    no middle tile levels, and blocks at least as long as the unrolled reduction step."""
    if not config["k_block"]:
        return True
    return (config["order"] == "nm" and int(config["parallel"]) < 2  # type: ignore[arg-type]
            and _middle(config, "tile_m") == 1 and _middle(config, "tile_n") == 1
            and int(config["k_block"]) >= _inner(config, "tile_k"))  # type: ignore[arg-type]


def _ic_blocks_only_when_blocked(config: Config) -> bool:
    """Input-channel blocks (`tile_ic`) belong to the `blocked` reduction order, which needs a real split."""
    inner = _inner(config, "tile_ic")
    if config["reduce_order"] == "blocked":
        return 1 < inner and _outer(config, "tile_ic") > 1
    return inner == 1


def _outer(config: Config, name: str) -> int:
    value = config[name]
    assert isinstance(value, tuple)
    return int(value[0])


def _mid_level_needs_outer(config: Config, name: str) -> bool:
    """A middle split level only matters when the outer level has more than one iteration."""
    value = config[name]
    assert isinstance(value, tuple)
    return len(value) < 3 or int(value[1]) == 1 or int(value[0]) > 1


# ---------------------------------------------------------------------------------------------------------------
# Spaces
# ---------------------------------------------------------------------------------------------------------------


class TileKnob(SplitKnob):
    """A multi-level split whose inner factors are the "verbose" candidates (divisors and powers of two) plus
    `extra` sizes that matter for registers whatever the extent: 6 or 12 rows of accumulators, 48 lanes (three
    AVX-512 vectors). A factor need not divide the extent; the tail is peeled or guarded by lowering."""

    def __init__(self, name: str, extent: int, levels: int, max_factor: int, extra: Iterable[int] = ()) -> None:
        super().__init__(name, extent, levels=levels, policy="verbose", max_factor=max_factor)
        chosen = set(self.candidates) | {int(e) for e in extra if 1 <= int(e) <= min(extent, max_factor)}
        self._candidates = tuple(sorted(chosen | {1}))
        self._index = {c: i for i, c in enumerate(self._candidates)}
        self._materialised = None


def _row_sizes(limit: int) -> range:
    return range(1, limit + 1)


def _vector_sizes(lanes: int, limit: int) -> list[int]:
    step = max(1, lanes // 2)
    return list(range(step, limit + 1, step))


def _parallel_choices(workload: CpuWorkload, levels: int) -> list[int]:
    return [0] if workload.cores <= 1 else list(range(levels + 1))


def _vector_choices(extent: int, lanes: int) -> list[int]:
    choices = [v for v in (lanes // 2, lanes, 2 * lanes, 4 * lanes) if 1 <= v <= max(extent, 1)]
    return sorted(set(choices)) or [1]


def cpu_space(workload: CpuWorkload) -> Space:
    """The search space of one fused function on one CPU target (see the module docstring)."""
    lanes, budget, dims = workload.lanes, workload.accumulator_budget, workload.dims
    family = workload.family
    knobs: list[Knob] = [ChoiceKnob("family", [family])]
    constraints: list[Constraint] = []
    if family in ("dense", "batch_matmul"):
        knobs += [
            TileKnob("tile_m", dims["m"], 3, MAX_TILE_ROWS, _row_sizes(MAX_TILE_ROWS)),
            TileKnob("tile_n", dims["n"], 3, MAX_VECTOR, _vector_sizes(lanes, MAX_VECTOR)),
            TileKnob("tile_k", dims["k"], 2, MAX_K_UNROLL),
            ChoiceKnob("order", ["nm", "mn"]),
            ChoiceKnob("parallel", _parallel_choices(workload, 2)),
        ]
        blocks = [b for b in (32, 64, 128, 256, 512) if 2 * b <= dims["k"]]
        if blocks:
            knobs.append(ChoiceKnob("k_block", [0, *blocks]))
            constraints.append(Constraint("K blocks accumulate whole column panels", _k_block_layout))
        if workload.constant_weight:
            knobs.append(BoolKnob("pack_b"))
        constraints += [
            Constraint("accumulator tile fits the vector registers",
                       functools.partial(_matmul_registers_fit, lanes=lanes, budget=budget)),
            Constraint("row blocks only where there are several", functools.partial(
                _mid_level_needs_outer, name="tile_m")),
            Constraint("column blocks only where there are several", functools.partial(
                _mid_level_needs_outer, name="tile_n")),
        ]
    elif family == "conv2d_nchw":
        knobs += [
            TileKnob("tile_c", dims["c"], 2, MAX_CONV_CHANNELS, _row_sizes(MAX_TILE_ROWS)),
            TileKnob("tile_h", dims["h"], 2, MAX_CONV_ROWS, _row_sizes(MAX_CONV_ROWS)),
            TileKnob("tile_w", dims["w"], 2, MAX_VECTOR, _vector_sizes(lanes, MAX_VECTOR)),
            ChoiceKnob("order", ["hc", "ch"]),
            ChoiceKnob("parallel", _parallel_choices(workload, 2)),
        ]
        knobs += _conv_reduction_knobs(workload)
        if any(k.name == "tile_ic" for k in knobs):
            constraints.append(Constraint("input-channel blocks only with the blocked order",
                                          _ic_blocks_only_when_blocked))
        if workload.constant_weight:
            knobs.append(BoolKnob("pack_w"))
            constraints.append(Constraint("weight packing needs a channel block",
                                          functools.partial(_pack_needs_block, knob="tile_c")))
        if workload.pointwise:
            knobs.append(BoolKnob("row_vector"))
            constraints.append(Constraint("row vectors cover whole rows", functools.partial(
                _row_vector_whole_rows, width=dims["w"], height=dims["h"])))
            knobs.append(TileKnob("tile_p", dims["h"] * dims["w"], 2, MAX_VECTOR, _vector_sizes(lanes, MAX_VECTOR)))
            constraints.append(Constraint("flat tiles leave the row and column tiles unused", functools.partial(
                _flat_alone, width=dims["w"], height=dims["h"])))
        constraints.append(Constraint("accumulator tile fits the vector registers", functools.partial(
            _conv_nchw_registers_fit, lanes=lanes, budget=budget, width=dims["w"])))
    elif family in ("conv2d_nhwc", "conv2d_nchw_cl"):
        knobs += [
            TileKnob("tile_w", dims["w"], 2, MAX_TILE_ROWS, _row_sizes(MAX_TILE_ROWS)),
            TileKnob("tile_c", dims["c"], 2, MAX_VECTOR, _vector_sizes(lanes, MAX_VECTOR)),
            ChoiceKnob("order", ["hc", "ch"]),
            ChoiceKnob("parallel", _parallel_choices(workload, 2)),
        ]
        knobs += _conv_reduction_knobs(workload)
        if any(k.name == "tile_ic" for k in knobs):
            constraints.append(Constraint("input-channel blocks only with the blocked order",
                                          _ic_blocks_only_when_blocked))
        if workload.constant_weight and sorted(workload.weight_layout) == sorted("OIHW"):
            knobs.append(BoolKnob("pack_w"))
            constraints.append(Constraint("weight packing needs a channel block",
                                          functools.partial(_pack_needs_block, knob="tile_c")))
        constraints.append(Constraint("accumulator tile fits the vector registers", functools.partial(
            _conv_nhwc_registers_fit, lanes=lanes, budget=budget)))
    elif family == "depthwise_conv2d_nchw":
        knobs += [
            TileKnob("tile_h", dims["h"], 2, MAX_CONV_ROWS, _row_sizes(MAX_CONV_ROWS)),
            TileKnob("tile_w", dims["w"], 2, MAX_VECTOR, _vector_sizes(lanes, MAX_VECTOR)),
            ChoiceKnob("parallel", _parallel_choices(workload, 2)),
        ]
        knobs += _tap_knobs(workload)
        constraints.append(Constraint("accumulator tile fits the vector registers", functools.partial(
            _depthwise_registers_fit, lanes=lanes, budget=budget)))
    elif family == "conv2d_nchwc":
        knobs += [
            TileKnob("tile_w", dims["w"], 2, budget, _row_sizes(budget)),
            TileKnob("tile_cb", dims["cb"], 2, MAX_CHANNEL_BLOCKS, _row_sizes(MAX_CHANNEL_BLOCKS)),
            ChoiceKnob("order", ["hc", "ch"]),
            ChoiceKnob("parallel", _parallel_choices(workload, 2)),
        ]
        if dims["taps"] > 1 and dims["icb"] > 1:
            knobs.append(ChoiceKnob("reduce_order", ["c_hw", "hw_c"]))
        knobs += _tap_knobs(workload)
        constraints += [
            Constraint("accumulator tile and its operands fit the vector registers", functools.partial(
                _blocked_registers_fit, lanes=lanes, budget=budget, block=dims["block"], rows="tile_cb",
                columns="tile_w", registers=workload.registers)),
            Constraint("channel-block tiles divide the blocks", functools.partial(
                _divides, knob="tile_cb", extent=dims["cb"])),
            Constraint("loop order only with several channel-block tiles", functools.partial(
                _order_needs_channel_tiles, blocks=dims["cb"])),
        ]
    elif family == "depthwise_conv2d_nchwc":
        knobs += [
            TileKnob("tile_h", dims["h"], 2, MAX_CONV_ROWS, _row_sizes(MAX_CONV_ROWS)),
            TileKnob("tile_w", dims["w"], 2, budget, _row_sizes(budget)),
            ChoiceKnob("parallel", _parallel_choices(workload, 2)),
        ]
        knobs += _tap_knobs(workload)
        constraints.append(Constraint("accumulator tile fits the vector registers", functools.partial(
            _blocked_registers_fit, lanes=lanes, budget=budget, block=dims["block"], rows="tile_h",
            columns="tile_w")))
    elif family == "winograd":
        # which loop is outermost (and parallel): tiles (`pc`) or channel blocks (`cp`)
        knobs += [ChoiceKnob("order", ["pc", "cp"]), ChoiceKnob("parallel", _parallel_choices(workload, 1))]
    elif family == "reduction":
        mode = workload.extras["mode"]
        if mode == "tiles":
            knobs.append(ChoiceKnob("vector", _vector_choices(dims["last"], lanes)))
        elif mode == "rows" and dims["last"] > lanes:
            knobs.append(ChoiceKnob("vector", _vector_choices(dims["last"] - 1, lanes)))
        if mode != "scalar":
            knobs.append(ChoiceKnob("parallel", _parallel_choices(workload, 1)))
        if workload.has_pad:  # a padded pooling window: the padded input written ahead, or read through a guard
            knobs.append(ChoiceKnob("pad", ["root", "inline"]))
    else:
        modes = ["flat"]
        if dims["inner"] >= lanes > 1:
            modes = ["inner", "split", "flat"]
        elif dims.get("narrow_rows") and lanes > 1:
            modes = ["inner", "flat"]
        if dims.get("blocked") and lanes > 1:
            modes = [*modes, "rows"]
        if dims.get("transform"):
            modes = [*modes, "transpose"]
        knobs.append(ChoiceKnob("mode", modes))
        if lanes > 1:
            knobs.append(ChoiceKnob("vector", _vector_choices(dims["total"], lanes)))
        knobs.append(ChoiceKnob("parallel", _parallel_choices(workload, 1)))
        if dims.get("transform"):
            # "transpose" mode: which side's contiguous axis the vector runs along, and how many of the other
            # axis' steps one loop iteration unrolls (see `_transpose_loops`)
            kind = TRANSFORM_KINDS[dims["transform"] - 1]
            knobs.append(ChoiceKnob("lanes", ["block", "columns"] if kind != "reblock" else ["block"]))
            knobs.append(ChoiceKnob("unroll", [1, 2, 4, 8]))
            constraints.append(Constraint("transpose knobs only in transpose mode", _transpose_knobs_used))
    return Space(knobs, constraints)


def _transpose_knobs_used(config: Config) -> bool:
    # the other modes ignore `lanes` and `unroll`: one config each, not eight copies of the same schedule
    return config["mode"] == "transpose" or (config["lanes"] == "block" and config["unroll"] == 1)


def _conv_reduction_knobs(workload: CpuWorkload) -> list[Knob]:
    knobs: list[Knob] = []
    dims = workload.dims
    if dims["reduce_loops"] >= 3 and dims["taps"] > 1:
        blocked = dims["ic"] >= 4
        knobs.append(ChoiceKnob("reduce_order", ["c_hw", "hw_c", *(["blocked"] if blocked else [])]))
        if blocked:
            knobs.append(TileKnob("tile_ic", dims["ic"], 2, max(2, dims["ic"] // 2)))
    return knobs + _tap_knobs(workload)


def _tap_knobs(workload: CpuWorkload) -> list[Knob]:
    """A convolution's knobs over its kernel taps: unroll the kernel-column loop (`unroll_kw`, kernels wider than
    one column), and the padded input computed once ahead or read through a guard (`pad`, padded convolutions)."""
    knobs: list[Knob] = []
    if workload.dims["kw"] > 1:
        knobs.append(BoolKnob("unroll_kw"))
    if workload.has_pad:
        knobs.append(ChoiceKnob("pad", ["root", "inline"]))
    return knobs


def with_later_knobs(workload: CpuWorkload, config: Config) -> Config:
    """`config` with the knobs added to the space after it may have been logged, at the value that gives the
    schedule it described then (`tile_p` off: pointwise configs logged before flat mode existed)."""
    if workload.family == "conv2d_nchw" and workload.pointwise and "tile_p" not in config:
        return config.replace(tile_p=_split_value(workload.dims["h"] * workload.dims["w"], 1))
    if workload.family == "reduction" and workload.has_pad and "pad" not in config:
        return config.replace(pad="root")  # pooling configs logged before the knob existed
    return config


# ---------------------------------------------------------------------------------------------------------------
# Default configs: the rule that picks the untuned config from a workload's shapes
# ---------------------------------------------------------------------------------------------------------------


def _split_value(extent: int, *inner: int) -> tuple[int, ...]:
    return (-(-extent // math.prod(inner)), *inner)


def _closest_factor(knob: SplitKnob, wanted: int) -> int:
    """The largest candidate factor of a split knob that is at most `wanted` (1 at least)."""
    return max((c for c in knob.candidates if c <= max(1, wanted)), default=1)


def _dividing_factor(knob: SplitKnob, wanted: int) -> int:
    """The largest candidate factor at most `wanted` that divides the knob's extent, unless that is less than half
    of `wanted` (then the closest factor, tail and all). A tile that leaves a tail gets its last block peeled by
    lowering; when the blocks are few (8 channels in tiles of 7), the peeled copy is most of the loop and the
    parallel loop over blocks disappears with it (the 1x1 convolution 1x32x8x8 by 8x32 ran on one core)."""
    limit = max(1, wanted)
    dividing = max((c for c in knob.candidates if c <= limit and knob.extent % c == 0), default=1)
    return dividing if 2 * dividing >= limit else _closest_factor(knob, wanted)


def task_workload(prim: Any, target: Any, constants: Iterable[int]) -> tuple[CpuWorkload, Config]:
    """The workload a task's space comes from and its default config (what an untuned build runs).

    `analyze` with the model constants, except for a dense whose weight the model receives at run time: its space
    also holds schedules that read the weight packed, the model packing it with a packing kernel before every call
    (the build and the runner both put that kernel in front of the dense), and the default packs it as it would
    pack a constant weight. Packing on every run beat reading the weight across the vector lanes (a gather) at
    every size measured, packing included: N = K = 1024, 4 / 64 / 512 rows: 1.13 / 12.6 / 75.0 ms unpacked,
    0.28 / 1.33 / 6.3 ms packed; N = K = 768, 4 rows: 0.19 against 0.16 ms."""
    workload = analyze(prim, target, constants)
    default = default_config(workload)
    if workload.family != "dense" or workload.constant_weight:
        return workload, default
    packable = analyze(prim, target, parameter_numbers(prim))
    if not packable.constant_weight:
        return workload, default
    space = cpu_space(packable)
    packed = default_config(packable)
    if space.is_valid(packed):
        return packable, packed
    unpacked = Config({**default, "pack_b": False})
    return (packable, unpacked) if space.is_valid(unpacked) else (workload, default)


def default_config(workload: CpuWorkload) -> Config:
    """The untuned config of a workload, valid in `cpu_space(workload)`: the rule below picks each knob from the
    shapes (register tiles as large as the vector registers allow, parallel wherever the work pays for a parallel
    region). The default schedule is the family template at this config, and the tuner's first measurement."""
    space = cpu_space(workload)
    values = _default_values(workload, space)
    config = Config({name: values[name] for name in space.names})
    if space.is_valid(config):
        return config
    # The default's shape-derived choices fell outside a knob's candidates or a constraint: take the nearest valid
    # config by shrinking the register tile.
    for knob in space.knobs:
        if isinstance(knob, SplitKnob) and knob.name in values:
            for smaller in sorted((c for c in knob.candidates if c < _inner(config, knob.name)), reverse=True):
                candidate = config.replace(**{knob.name: (*values[knob.name][:-1], smaller)})
                candidate = candidate.replace(**{knob.name: _split_value(
                    knob.extent, *[int(f) for f in candidate[knob.name][1:]])})  # type: ignore[index]
                if space.is_valid(candidate):
                    return candidate

    return space.sample(np.random.default_rng(0))


def _default_values(workload: CpuWorkload, space: Space) -> dict[str, Any]:
    lanes, dims = workload.lanes, workload.dims
    family = workload.family
    values: dict[str, Any] = {"family": family}
    parallel = max(space.knob("parallel").values()) if "parallel" in space.names and workload.default_parallel \
        else 0
    if family in ("dense", "batch_matmul"):
        n, m, k = dims["n"], dims["m"], dims["k"]
        bn = 2 * lanes if n >= 2 * lanes else (-(-n // lanes) * lanes if n > lanes // 2 else n)
        bn = _closest_factor(space.knob("tile_n"), min(bn, n))  # type: ignore[arg-type]
        mr = max(1, min(8, m, workload.accumulator_budget // vector_registers(bn, lanes)))
        mr = _closest_factor(space.knob("tile_m"), mr)  # type: ignore[arg-type]
        ku = 4 if k >= 8 else 1
        values.update(tile_m=_split_value(m, 1, mr), tile_n=_split_value(n, 1, bn), tile_k=_split_value(k, ku),
                      order="nm", parallel=parallel, pack_b=True, k_block=0)
    elif family == "conv2d_nchw":
        vx = _closest_factor(space.knob("tile_w"), min(dims["w"], 2 * lanes))  # type: ignore[arg-type]
        # The last column tile is peeled into power-of-two pieces, each a register per channel: 55 columns in
        # tiles of 32 leave 23 = 16+4+2+1, and 8 channels of 4 pieces spill. Take the first width whose tail
        # needs no more registers than a whole tile (55: tiles of 48, tail 7; 1.4x on SqueezeNet's 3x3 at 55x55).
        for wider in (2 * lanes, 3 * lanes, lanes):
            if vx == 2 * lanes and wider in space.knob("tile_w").candidates and dims["w"] > wider:  # type: ignore[attr-defined]
                if vector_registers(dims["w"] % wider or wider, lanes) <= vector_registers(wider, lanes):
                    vx = wider
                    break
        fc = max(1, min(dims["c"], 8, workload.accumulator_budget // vector_registers(vx, lanes)))
        fc = _dividing_factor(space.knob("tile_c"), fc)  # type: ignore[arg-type]
        values.update(tile_c=_split_value(dims["c"], fc), tile_h=_split_value(dims["h"], 1),
                      tile_w=_split_value(dims["w"], vx), order="hc", parallel=parallel, reduce_order="c_hw",
                      tile_ic=_split_value(dims["ic"], 1), unroll_kw=False, pad="root", pack_w=fc > 1,
                      row_vector=False, tile_p=_split_value(dims["h"] * dims["w"], 1))
        if workload.pointwise and dims["w"] < lanes:
            rows = max(r for r in range(1, dims["h"] + 1)
                       if dims["h"] % r == 0 and (r == 1 or r * dims["w"] <= 4 * lanes))
            rows = _closest_factor(space.knob("tile_h"), rows)  # type: ignore[arg-type]
            fc = max(1, min(fc, workload.accumulator_budget // vector_registers(rows * dims["w"], lanes)))
            fc = _dividing_factor(space.knob("tile_c"), fc)  # type: ignore[arg-type]
            values.update(tile_c=_split_value(dims["c"], fc), tile_h=_split_value(dims["h"], rows),
                          tile_w=_split_value(dims["w"], dims["w"]), row_vector=True, pack_w=fc > 1)
        positions = dims["h"] * dims["w"]
        if (workload.pointwise and dims["w"] < 2 * lanes and positions > 4 * lanes
                and -(-positions // (3 * lanes)) <= MAX_FLAT_TILES):
            # Narrow maps (13x13 to 27x27): the flat matrix product. 8 channels by two vectors of positions (three
            # when two would need more tiles than unrolling allows): 1.2-1.7x the row and column modes on the
            # 13x13 and 27x27 layers of SqueezeNet, 1.06-1.16x on 14x14 (experiments/pointwise_flat.py). Maps of
            # at most four vectors (7x7) stay in row mode, which covers them in one tile already (flat: 0.95-1.03x).
            vp = min(positions, 2 * lanes if -(-positions // (2 * lanes)) <= MAX_FLAT_TILES else 3 * lanes)
            fit = workload.accumulator_budget // vector_registers(vp, lanes)
            # channel blocks are the parallel loop: at least one per core
            share = max(1, dims["c"] // workload.cores) if parallel else dims["c"]
            fc = _dividing_factor(space.knob("tile_c"), min(share, 8, fit))  # type: ignore[arg-type]
            values.update(tile_c=_split_value(dims["c"], fc), tile_h=_split_value(dims["h"], 1),
                          tile_w=_split_value(dims["w"], dims["w"]), row_vector=False, pack_w=fc > 1, order="ch",
                          parallel=min(parallel, 1), tile_p=_split_value(positions, vp))
    elif family in ("conv2d_nhwc", "conv2d_nchw_cl"):
        c = dims["c"]
        bc = 2 * lanes if c >= 2 * lanes else (-(-c // lanes) * lanes if c > lanes // 2 else c)
        bc = _closest_factor(space.knob("tile_c"), min(bc, c))  # type: ignore[arg-type]
        tw = max(1, min(dims["w"], 8, workload.accumulator_budget // vector_registers(bc, lanes)))
        if family == "conv2d_nchw_cl":
            # Balanced row pieces: the fewest tiles of at most `tw` columns, as even as they go (13 columns: 7 + 6).
            # Only divisors of the width, as this rule took before, leave one column per tile on a prime width
            # (2 accumulators of 28): 2.1-2.3x slower on SqueezeNet's 13x13 3x3 convolutions.
            tw = _balanced(dims["w"], tw)
        tw = _closest_factor(space.knob("tile_w"), tw)  # type: ignore[arg-type]
        values.update(tile_w=_split_value(dims["w"], tw), tile_c=_split_value(c, bc),
                      order="ch" if family == "conv2d_nchw_cl" else "hc", parallel=parallel, reduce_order="c_hw",
                      tile_ic=_split_value(dims["ic"], 1), unroll_kw=False, pad="root",
                      pack_w=bc > 1 and (c > bc or family == "conv2d_nchw_cl"))
    elif family == "depthwise_conv2d_nchw":
        vx = _closest_factor(space.knob("tile_w"), min(dims["w"], 2 * lanes))  # type: ignore[arg-type]
        fit = workload.accumulator_budget // vector_registers(vx, lanes)
        # Row tiles that divide the map: a tail tile is guarded inside the parallel loop at every tap (the 14-row
        # maps of MobileNet v2 in tiles of 4). Small maps (two tiles of at most 8 rows) take the taller tile: each
        # tile re-reads two rows of input, and the best configs of 1,000 trials there have 6-8 rows.
        rows = max(1, min(dims["h"], MAX_CONV_ROWS if dims["h"] <= 2 * MAX_CONV_ROWS else 4, fit))
        rows = dims["h"] if dims["h"] <= MAX_CONV_ROWS and dims["h"] <= fit else \
            _dividing_factor(space.knob("tile_h"), rows)  # type: ignore[arg-type]
        # Channels in parallel, each core's channels whole (`parallel` 1): the best config of every MobileNet v2
        # depthwise layer after 1,000 trials on 2 cores (the fused channel-row loop split maps between cores).
        # Padding read in place (masked vector loads at the borders) beats a padded copy on every MobileNet v2
        # depthwise layer: 1.2-12x on one core.
        values.update(tile_h=_split_value(dims["h"], rows), tile_w=_split_value(dims["w"], vx),
                      parallel=min(parallel, 1), unroll_kw=False, pad="inline")
    elif family == "conv2d_nchwc":
        values.update(_nchwc_default(workload, space), order="ch", parallel=parallel, reduce_order="c_hw",
                      unroll_kw=False, pad="root")
    elif family == "depthwise_conv2d_nchwc":
        values.update(_depthwise_nchwc_default(workload, space), parallel=parallel, unroll_kw=False, pad="root")
    elif family == "winograd":
        # Output transforms loop over channel blocks outside the tiles: each tile reads alpha^2 rows of the product
        # a whole row apart, and walking tiles of one block reuses their cache sets (ResNet-50's 36x16x256 product
        # into 14x14 maps, isolated: 60 us against 148 us tiles outermost; 36x196x64 73 against 89; 36x49x128 36
        # against 28). Input transforms: tiles outermost (within noise of the other order).
        values.update(order="cp" if dims["output"] else "pc", parallel=1 if parallel else 0)
    elif family == "reduction":
        mode = workload.extras["mode"]
        wanted = min(dims["last"], 2 * lanes) if mode == "tiles" else lanes
        if "vector" in space.names:
            choices = list(space.knob("vector").values())
            values["vector"] = max((c for c in choices if c <= wanted), default=choices[0])  # type: ignore[operator]
        values["parallel"] = 1 if parallel else 0
        if "pad" in space.names:
            # Read through a guard where rows are not vectorized (pools over 28 columns and less in Inception:
            # 1.05-1.6x faster than a padded copy); a padded copy where they are (3-7x slower inlined: the guard
            # turns each vector load into a masked one).
            values["pad"] = "root" if "vector" in space.names else "inline"
            if workload.extras.get("blocked"):
                # On a blocked layout (NCHW16c) the guard is one condition for the whole vector of a block: read
                # through it (ResNet-50's 3x3 stride-2 max pool, 1x256x112x112: 2.4x faster than a padded copy).
                values["pad"] = "inline"
    else:
        modes = list(space.knob("mode").values())
        values["mode"] = "inner" if "inner" in modes else "flat"
        if "vector" in space.names:
            choices = list(space.knob("vector").values())
            values["vector"] = lanes if lanes in choices else choices[0]
            # An innermost axis read in runs of `period` elements (a reshape splits it): vectorized whole, every
            # vector straddles runs and its loads become gathers (BERT's head merge 12x128x64 -> 128x768: 4x
            # slower than the best config). Split it by the widest vector that divides the run instead.
            period = dims.get("period", 0)
            dividing = [c for c in choices if period and period % c == 0 and c >= lanes]  # type: ignore[operator]
            if "split" in modes and dividing:
                values.update(mode="split", vector=max(dividing))  # type: ignore[type-var]
            if "rows" in modes:
                # Blocked tensors (layout transforms into NCHW16c, concatenations of blocks): a row's columns and
                # blocks are one contiguous run, vectorized four vectors at a time. One 16-lane vector per
                # column ("inner") paid the index arithmetic of the fused outer loop per vector: concatenating two
                # 1x128x56x56 in NCHW16c 3.1x slower than "rows", NCHW -> NCHW16c 1.7x.
                values.update(mode="rows", vector=max(c for c in choices if c <= 4 * lanes))  # type: ignore[operator]
        values["parallel"] = 1 if parallel else 0
        if "lanes" in space.names:
            values.update(lanes="block", unroll=1)
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


def _balanced(extent: int, most: int) -> int:
    """The widest piece of the fewest pieces of at most `most` that cover `extent`, as even as they go (13 in
    pieces of at most 8: 7 + 6)."""
    most = max(1, min(extent, most))
    return -(-extent // -(-extent // most))


def _nchwc_default(workload: CpuWorkload, space: Space) -> dict[str, Any]:
    """Register tile of a blocked convolution: `tile_w` columns (unrolled) by `tile_cb` output blocks, each
    accumulator one vector of the block. Per input channel the tile loads `tile_cb` weight vectors and broadcasts
    `tile_w` input values for `tile_w * tile_cb` FMAs: two blocks share every broadcast (three where the blocks
    are an odd multiple of 3: 24 channels in blocks of 8, 8x3 tiles 1.25x faster than 14x1), the columns fill the
    rest of the registers in balanced row pieces, and rows shorter than that (7 columns) take a third block where
    the blocks divide by 3."""
    dims, budget, registers = workload.dims, workload.accumulator_budget, workload.registers
    per = vector_registers(dims["block"], workload.lanes)

    def widest(blocks: int) -> int:  # columns whose accumulators, weights and broadcast fit the registers
        return max(1, min(budget // (blocks * per), (registers - 1 - blocks * per) // (blocks * per)))

    blocks = 2 if dims["cb"] % 2 == 0 else max(b for b in (1, 3) if dims["cb"] % b == 0)
    tw = _balanced(dims["w"], widest(blocks))
    tw = _closest_factor(space.knob("tile_w"), tw)  # type: ignore[arg-type]
    blocks = max(b for b in range(1, min(dims["cb"], 4) + 1) if dims["cb"] % b == 0 and widest(b) >= tw)
    return {"tile_w": _split_value(dims["w"], tw), "tile_cb": _split_value(dims["cb"], blocks)}


def _depthwise_nchwc_default(workload: CpuWorkload, space: Space) -> dict[str, Any]:
    """Register tile of a blocked depthwise convolution: one row of at most 8 columns (balanced pieces) of one
    block. Each tap costs a vector load per FMA whatever the tile, so a larger tile only saves weight loads: on
    MobileNet v2's 3x3 layers (28-112 columns) one row of 8 was 2-9% faster than 2 rows of 7-8 or 4 rows of 4."""
    dims = workload.dims
    per = vector_registers(dims["block"], workload.lanes)
    tw = _closest_factor(space.knob("tile_w"),  # type: ignore[arg-type]
                         _balanced(dims["w"], max(1, min(8, workload.accumulator_budget // per))))
    return {"tile_h": _split_value(dims["h"], 1), "tile_w": _split_value(dims["w"], tw)}


# ---------------------------------------------------------------------------------------------------------------
# Templates: config -> schedule steps
# ---------------------------------------------------------------------------------------------------------------


def config_to_steps(prim: Any, config: Config | Mapping[str, Any], target: Any) -> list[Any]:
    """The schedule steps of a config of `cpu_space(analyze(prim, target, ...))` for the fused function's tensor
    expressions `prim`. Raises `InvalidConfigError` for a config of another family."""
    if not isinstance(config, Config):
        config = Config(dict(config))
    family = family_of(prim)
    if config.get("family") != family:
        raise InvalidConfigError(f"a {config.get('family')!r} config does not apply to a {family} workload")
    sch = Schedule(prim.outputs)
    try:
        _TEMPLATES[family](sch, prim, config, target)
    except ScheduleError as err:
        raise InvalidConfigError(f"the {family} template rejects {config!r}: {err}") from err
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidConfigError(f"not a complete {family} config ({err}): {config!r}") from err
    return list(sch.steps)


def _inline_cheap(sch: Any, keep: Iterable[str] = ()) -> None:
    """Inline every element-wise / injective stage that is not an output (nor listed in `keep`)."""
    kept = set(keep)
    for name, stage in list(sch.stages.items()):
        op = stage.op
        if op is None or stage.is_output or name in kept or op.is_reduction or stage.attach != ROOT:
            continue
        if op.tag in INLINABLE_TAGS or not op.tag:
            sch.compute_inline(name)


def _cache_accumulator(sch: Any, anchor: Any) -> str:
    acc = sch.cache_write(anchor.name, "local")
    if not anchor.is_output:
        sch.compute_inline(anchor.name)
    return str(acc)


def _flat_loops(sch: Any, stage: Any, target: Any, mode: str = "inner", vector: int | None = None,
                parallel: bool | None = None) -> None:
    """Loops of a root stage without reduction.

    mode "inner": the innermost axis vectorized whole when it is at least a vector wide, else as "flat";
    "rows": the two innermost axes fused and split by `vector` (vectorized inside), the others fused outside;
    "split": the innermost axis split by `vector` (vectorized inside), the other axes fused outside;
    "flat": every axis fused into one loop split by `vector`. The outer loop is parallel when `parallel` (None:
    when the work is large enough). A stage with a reduction gets its spatial loops fused (and parallel).
    """
    name = stage.name
    spatial = [lp for lp in sch.leaves(name) if not stage.loops[lp].is_reduce]
    if not spatial:
        return
    has_reduce = len(sch.leaves(name)) > len(spatial)
    lanes = target.vector_lanes(stage.tensor.dtype)
    width = vector or lanes
    extents = [ax.extent for ax in stage.op.axes]
    outer: str | None
    if has_reduce or lanes == 1:
        outer = spatial[0] if len(spatial) == 1 else sch.fuse(name, *spatial)
    elif mode == "inner" and len(spatial) >= 2 and extents[-1] >= lanes:
        outer = spatial[0] if len(spatial) == 2 else sch.fuse(name, *spatial[:-1])
        sch.vectorize(name, spatial[-1])
    elif mode == "inner" and len(spatial) >= 3 and _trailing_axes(extents, width) < len(spatial) - 1:
        # Rows narrower than a vector (a 14x14 or 7x7 map): fuse the fewest trailing axes that fill a vector and
        # vectorize those in pieces of `width`; the leading axes (channels) stay outside. Fusing every axis
        # instead lets one vector span two channels, and a kernel that moves channels (concatenation, channel
        # shuffle, split) then gathers lane by lane; here a vector reads one channel, contiguously.
        count = _trailing_axes(extents, width)
        rows = spatial[-1] if count == 1 else sch.fuse(name, *spatial[-count:])  # one axis wide enough: no fuse
        _, ii = sch.split(name, rows, factor=width)
        lead = spatial[:-count]
        outer = lead[0] if len(lead) == 1 else sch.fuse(name, *lead)
        sch.vectorize(name, ii)
    elif mode == "rows" and len(spatial) >= 3:
        # the two innermost axes (columns and channel block of NCHW{b}c) as one run, in vectors of `width`
        row = sch.fuse(name, spatial[-2], spatial[-1])
        inner = sch.split(name, row, factor=width)[1] if extents[-2] * extents[-1] > width else row
        lead = spatial[:-2]
        outer = lead[0] if len(lead) == 1 else sch.fuse(name, *lead)
        sch.vectorize(name, inner)
    elif mode == "split" and len(spatial) >= 2 and extents[-1] > width:
        _, ii = sch.split(name, spatial[-1], factor=width)
        outer = spatial[0] if len(spatial) == 2 else sch.fuse(name, *spatial[:-1])
        sch.vectorize(name, ii)
    else:
        flat = spatial[0] if len(spatial) == 1 else sch.fuse(name, *spatial)
        if math.prod(extents) >= width:
            outer, inner = sch.split(name, flat, factor=width)
            sch.vectorize(name, inner)
        else:
            outer = None
            sch.vectorize(name, flat)
    if parallel is None:
        parallel = _parallel_worthwhile(target, _work(stage))
    if outer is not None and parallel and target.num_cores > 1:
        sch.parallel(name, outer)


def _trailing_axes(extents: Sequence[int], width: int) -> int:
    """How many trailing axes together reach `width` elements (all of them when none do)."""
    total = 1
    for count, extent in enumerate(reversed(extents), 1):
        total *= extent
        if total >= width:
            return count
    return len(extents)


def _split_levels(sch: Any, stage: str, loop: str, value: tuple[int, ...]) -> list[str]:
    """Split `loop` by a split-knob value (outer, [middle,] inner), leaving out middle levels of 1."""
    inner = [int(f) for f in value[1:]]
    kept = [f for f in inner[:-1] if f > 1] + [inner[-1]]
    if len(kept) == 1:
        return list(sch.split(stage, loop, factor=kept[0]))
    return list(sch.split(stage, loop, factors=(None, *kept)))


def _template_matmul(sch: Any, prim: Any, config: Config, target: Any) -> None:
    anchor = _anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    weight = _weight_input(anchor) if config["family"] == "dense" else None
    batched = weight is None and len(anchor.op.axes) == 3
    tile_m, tile_n, tile_k = config["tile_m"], config["tile_n"], config["tile_k"]
    assert isinstance(tile_m, tuple) and isinstance(tile_n, tuple) and isinstance(tile_k, tuple)
    bn = int(tile_n[-1])
    packs = _producers_tagged(sch, anchor, "pack")
    if weight is not None and config.get("pack_b"):
        sch.transform_layout(weight, "NK", f"NK{bn}n")
    acc = _cache_accumulator(sch, anchor)
    _inline_cheap(sch, keep={acc, *(p.name for p in packs)})
    for pack in packs:
        _flat_loops(sch, pack, target)
    leaves = list(sch.leaves(out))
    if batched:
        batch, row, col = leaves
    else:
        batch = None
        row = leaves[0] if len(leaves) == 2 else sch.fuse(out, *leaves[:-1])
        col = leaves[-1]
    rows = _split_levels(sch, out, row, tile_m)
    cols = _split_levels(sch, out, col, tile_n)
    k_block = int(config.get("k_block", 0))  # type: ignore[arg-type]
    if k_block:
        _matmul_k_blocked(sch, out, acc, batch, rows, cols, int(tile_k[-1]), k_block, config, target)
        return
    outer_pair = [cols[0], rows[0]] if config["order"] == "nm" else [rows[0], cols[0]]
    row_mid, col_mid = rows[1:-1], cols[1:-1]
    middle = [*col_mid, *row_mid] if config["order"] == "nm" else [*row_mid, *col_mid]
    sch.reorder(out, *outer_pair, *middle, rows[-1], cols[-1])
    parallel = int(config["parallel"])  # type: ignore[arg-type]
    outer = [batch, *outer_pair] if batch is not None else outer_pair
    if parallel == 1 and batch is not None:
        head = sch.fuse(out, batch, outer_pair[0])
        sch.parallel(out, head)
        at = outer_pair[1]
    elif parallel == 1:
        sch.parallel(out, outer_pair[0])
        at = outer_pair[1]
    else:
        at = sch.fuse(out, *outer)
        if parallel == 2 and target.num_cores > 1:
            sch.parallel(out, at)
    if middle:
        at = middle[-1]
    sch.vectorize(out, cols[-1])
    sch.compute_at(acc, out, at)
    acc_leaves = list(sch.leaves(acc))
    spatial, k = acc_leaves[:-1], acc_leaves[-1]
    ku = int(tile_k[-1])
    if ku > 1:
        ko, ki = sch.split(acc, k, factor=ku)
        sch.reorder(acc, ko, ki, *spatial)
        sch.unroll(acc, ki)
    else:
        sch.reorder(acc, k, *spatial)
    for r in spatial[:-1]:
        sch.unroll(acc, r)
    sch.vectorize(acc, spatial[-1])


def _matmul_k_blocked(sch: Any, out: str, acc: str, batch: str | None, rows: list[str], cols: list[str], ku: int,
                      k_block: int, config: Config, target: Any) -> None:
    """K blocked around the row tiles: a whole column panel (every row, `bn` columns) accumulates in a scratch
    buffer while the reduction advances `k_block` at a time; within a block each register tile of rows reads the
    panel's `k_block x bn` slice of the weights from L1 (GotoBLAS' loop order). Column panels are the parallel
    loop."""
    ro, ri = rows[0], rows[-1]
    co, ci = cols[0], cols[-1]
    sch.reorder(out, co, ro, ri, ci)
    head = sch.fuse(out, batch, co) if batch is not None else co
    if int(config["parallel"]) == 1 and target.num_cores > 1:  # type: ignore[arg-type]
        sch.parallel(out, head)
    sch.vectorize(out, ci)
    sch.compute_at(acc, out, head)
    *batch_loops, i, j, k = sch.leaves(acc)
    io, ii = sch.split(acc, i, factor=_inner(config, "tile_m"))
    ko, kin = sch.split(acc, k, factor=k_block)
    inner = list(sch.split(acc, kin, factor=ku)) if ku > 1 else [kin]
    sch.reorder(acc, ko, *batch_loops, io, *inner, ii, j)
    if ku > 1:
        sch.unroll(acc, inner[-1])
    for b in batch_loops:
        sch.unroll(acc, b)
    sch.unroll(acc, ii)
    sch.vectorize(acc, j)


def _prepare_conv(sch: Any, anchor: Any, config: Config, target: Any, blocked: bool = False) -> str:
    """Accumulator tile; the padded input computed once at the root (or inlined into the reads); the rest
    inlined. `blocked`: the padded input is `(n, c, h, w, b)`, its rows written one at a time (the loop over
    columns kept apart from the parallel loop over rows, each column one vector of the block): with every axis
    but the block fused, the index arithmetic of each 16-lane copy cost as much as a depthwise convolution's
    FMAs."""
    pads = _producers_tagged(sch, anchor, "pad")
    acc = _cache_accumulator(sch, anchor)
    at_root = config.get("pad", "root") == "root"
    _inline_cheap(sch, keep={acc, *(p.name for p in pads)})
    for pad in pads:
        if not at_root:
            sch.compute_inline(pad.name)
        elif blocked:
            _blocked_rows(sch, pad, target)
        else:
            _flat_loops(sch, pad, target)
    return acc


def _blocked_rows(sch: Any, stage: Any, target: Any) -> None:
    """Loops of a root stage `(n, c, h, w, b)` on a blocked layout: rows in parallel, the columns of a row a
    serial loop, each column one vector of the block. `_flat_loops` fuses every axis but the block, and the index
    arithmetic of one 16-lane copy then costs more than the copy."""
    leaves = list(sch.leaves(stage.name))
    if len(leaves) != 5:
        _flat_loops(sch, stage, target)
        return
    n, c, h, _w, lane = leaves
    rows = sch.fuse(stage.name, n, c, h)
    if _parallel_worthwhile(target, _work(stage)):
        sch.parallel(stage.name, rows)
    sch.vectorize(stage.name, lane)


def _order_reduction(sch: Any, acc: str, spatial: Sequence[str], reduce: Sequence[str], config: Config) -> None:
    """Reduction loops outside the tile's spatial loops: input channels first (`c_hw`), last (`hw_c`), or blocked
    around the kernel taps (`blocked`: channel blocks, taps, channels of a block); the kernel-column loop unrolled
    with `unroll_kw`."""
    reduce = list(reduce)
    kw = reduce[-1] if reduce else None  # the kernel-column loop (last in compute order)
    order = config.get("reduce_order")
    if order == "hw_c" and len(reduce) >= 3:
        reduce = [*reduce[1:], reduce[0]]
    elif order == "blocked" and len(reduce) >= 3:
        outer, inner = sch.split(acc, reduce[0], factor=_inner(config, "tile_ic"))
        reduce = [outer, *reduce[1:], inner]
    sch.reorder(acc, *reduce, *spatial)
    if config.get("unroll_kw") and kw is not None:
        sch.unroll(acc, kw)


def _template_conv2d_nchw(sch: Any, prim: Any, config: Config, target: Any) -> None:
    anchor = _anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    fc = _inner(config, "tile_c")
    rows = _inner(config, "tile_h")
    weight = _conv_weight(anchor, 1)
    if weight is not None and config.get("pack_w") and fc > 1:
        sch.transform_layout(weight, "OIHW", f"OIHW{fc}o")
    acc = _prepare_conv(sch, anchor, config, target)
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
        at = _fuse_outer(sch, out, outer, parallel, target)
        sch.vectorize(out, sch.fuse(out, hi, w))
        sch.compute_at(acc, out, at)
        an, ac, ah, aw, *reduce = sch.leaves(acc)
        _order_reduction(sch, acc, [an, ac, ah, aw], reduce, config)
        sch.unroll(acc, ac)
        sch.vectorize(acc, sch.fuse(acc, ah, aw))
        return
    if rows > 1:
        ho, hi = sch.split(out, h, factor=rows)
    else:
        ho, hi = h, None
    wo, wi = sch.split(out, w, factor=_inner(config, "tile_w"))
    outer = [n, ho, co] if config["order"] == "hc" else [n, co, ho]
    sch.reorder(out, *outer, wo, *([hi] if hi else []), ci, wi)
    _fuse_outer(sch, out, outer, parallel, target)
    sch.vectorize(out, wi)
    sch.compute_at(acc, out, wo)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    _order_reduction(sch, acc, [an, ac, ah, aw], reduce, config)
    sch.unroll(acc, ac)
    if rows > 1:
        sch.unroll(acc, ah)
    sch.vectorize(acc, aw)


def _flat_positions(config: Config) -> int:
    """The positions per register tile of a pointwise convolution in flat mode (`tile_p`), 1 when off."""
    return _inner(config, "tile_p") if "tile_p" in config else 1


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


def _fuse_outer(sch: Any, out: str, outer: Sequence[str], parallel: int, target: Any) -> str:
    """Fuse a conv's outer loops `[n, a, b]`: parallel 2 (or serial 0) fuses all three into one loop, parallel 1
    makes `n.a` the parallel loop and leaves `b` serial inside it. Returns the innermost outer loop."""
    n, a, b = outer
    if parallel == 1 and target.num_cores > 1:
        head = sch.fuse(out, n, a)
        sch.parallel(out, head)
        return b
    fused = sch.fuse(out, n, a, b)
    if parallel == 2 and target.num_cores > 1:
        sch.parallel(out, fused)
    return str(fused)


def _template_conv2d_nhwc(sch: Any, prim: Any, config: Config, target: Any) -> None:
    anchor = _anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    call = prim.anchor_call
    bc = _inner(config, "tile_c")
    tw = _inner(config, "tile_w")
    weight = _conv_weight(anchor, 3)
    layout = str(call.attrs["kernel_layout"])
    if weight is not None and config.get("pack_w") and bc > 1:
        sch.transform_layout(weight, layout, f"OHWI{bc}o")
    acc = _prepare_conv(sch, anchor, config, target)
    n, h, w, c = sch.leaves(out)
    wo, wi = sch.split(out, w, factor=tw)
    co, ci = sch.split(out, c, factor=bc)
    outer = [n, h, co] if config["order"] == "hc" else [n, co, h]
    sch.reorder(out, *outer, wo, wi, ci)
    _fuse_outer(sch, out, outer, int(config["parallel"]), target)  # type: ignore[arg-type]
    sch.vectorize(out, ci)
    sch.compute_at(acc, out, wo)
    an, ah, aw, ac, *reduce = sch.leaves(acc)
    _order_reduction(sch, acc, [an, ah, aw, ac], reduce, config)
    sch.unroll(acc, aw)
    sch.vectorize(acc, ac)


def _template_conv2d_nchw_cl(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """NCHW output, sums computed channel-innermost (`n, h, w, c`): a tile of `tile_w` columns (unrolled) by
    `tile_c` channels (vectorized), scattered back to NCHW with the epilogue."""
    anchor = _anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    bc = _inner(config, "tile_c")
    weight = _conv_weight(anchor, 3)
    if weight is not None and config.get("pack_w") and bc > 1:
        sch.transform_layout(weight, "OIHW", f"OIHW{bc}o")
    acc = _prepare_conv(sch, anchor, config, target)
    n, c, h, w = sch.leaves(out)
    co, ci = sch.split(out, c, factor=bc)
    wo, wi = sch.split(out, w, factor=_inner(config, "tile_w"))
    outer = [n, h, co] if config["order"] == "hc" else [n, co, h]
    sch.reorder(out, *outer, wo, wi, ci)
    _fuse_outer(sch, out, outer, int(config["parallel"]), target)  # type: ignore[arg-type]
    sch.vectorize(out, ci)
    sch.compute_at(acc, out, wo)
    an, ah, aw, ac, *reduce = sch.leaves(acc)
    _order_reduction(sch, acc, [an, ah, aw, ac], reduce, config)
    sch.unroll(acc, aw)
    sch.vectorize(acc, ac)


def _depthwise_tiles(sch: Any, out: str, n: str, c: str, h: str, w: str, inner: Sequence[str], config: Config,
                     target: Any) -> tuple[str, str]:
    """A depthwise output's tiles of `tile_h` rows by `tile_w` columns (loops `inner` innermost), channels outermost;
    `parallel` 2 runs channels and row tiles in parallel, 1 channels only. Returns the column loops (tile, inside)."""
    ho, hi = sch.split(out, h, factor=_inner(config, "tile_h"))
    wo, wi = sch.split(out, w, factor=_inner(config, "tile_w"))
    sch.reorder(out, n, c, ho, wo, hi, wi, *inner)
    parallel = int(config["parallel"])  # type: ignore[arg-type]
    if parallel == 2 and target.num_cores > 1:
        sch.parallel(out, sch.fuse(out, n, c, ho))
    else:
        outer = sch.fuse(out, n, c)
        if parallel == 1 and target.num_cores > 1:
            sch.parallel(out, outer)
    return wo, wi


def _template_depthwise(sch: Any, prim: Any, config: Config, target: Any) -> None:
    anchor = _anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    acc = _prepare_conv(sch, anchor, config, target)
    n, c, h, w = sch.leaves(out)
    wo, wi = _depthwise_tiles(sch, out, n, c, h, w, (), config, target)
    sch.vectorize(out, wi)
    sch.compute_at(acc, out, wo)
    an, ac, ah, aw, *reduce = sch.leaves(acc)
    _order_reduction(sch, acc, [an, ac, ah, aw], reduce, config)
    sch.unroll(acc, ah)
    sch.vectorize(acc, aw)


def _template_conv2d_nchwc(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """Output `(n, cb, h, w, b)`: a tile of `tile_w` columns (unrolled) by `tile_cb` channel blocks (unrolled) by
    the block's `b` lanes (vectorized); the reduction outside the tile, input channels of a block innermost, so
    every step broadcasts `x[n, rcb, y, x, rci]` and loads the contiguous weight row `w[f, rcb, rh, rw, rci, :]`.
    The epilogue (bias, activation, residual) runs on the tile's vectors as they leave the registers."""
    anchor = _anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    acc = _prepare_conv(sch, anchor, config, target, blocked=True)
    n, c, h, w, lane = sch.leaves(out)
    co, ci = sch.split(out, c, factor=_inner(config, "tile_cb"))
    wo, wi = sch.split(out, w, factor=_inner(config, "tile_w"))
    outer = [n, h, co] if config["order"] == "hc" else [n, co, h]
    sch.reorder(out, *outer, wo, ci, wi, lane)
    _fuse_outer(sch, out, outer, int(config["parallel"]), target)  # type: ignore[arg-type]
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


def _template_depthwise_nchwc(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """Output `(n, cb, h, w, b)`: a tile of `tile_h` rows by `tile_w` columns (both unrolled) of one block, the
    block's lanes vectorized; each tap is one vector load of the input block and one FMA per tile position."""
    anchor = _anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    acc = _prepare_conv(sch, anchor, config, target, blocked=True)
    n, c, h, w, lane = sch.leaves(out)
    wo, _ = _depthwise_tiles(sch, out, n, c, h, w, (lane,), config, target)
    sch.vectorize(out, lane)
    sch.compute_at(acc, out, wo)
    an, ac, ah, aw, alane, rh, rw = sch.leaves(acc)
    sch.reorder(acc, rh, rw, an, ac, ah, aw, alane)
    if config.get("unroll_kw"):
        sch.unroll(acc, rw)
    sch.unroll(acc, ah)
    sch.unroll(acc, aw)
    sch.vectorize(acc, alane)


def _blocked_stage(stage: Any) -> bool:
    """A 5-D stage whose innermost axis looks like a channel block (`NCHW{b}c`: a power of two from 4 to
    `MAX_VECTOR` lanes; a 5-D channel shuffle `(n, g, c/g, h, w)` on maps of 7, 14, 28... columns does not)."""
    axes = stage.op.axes
    block = axes[-1].extent if len(axes) == 5 else 0
    return 4 <= block <= MAX_VECTOR and block & (block - 1) == 0


def _pad_stages(sch: Any) -> list[Any]:
    """The stages of `sch` that pad an input (a pooling window's border), not the output."""
    return [st for st in sch.stages.values() if st.op is not None and st.op.tag == "pad" and not st.is_output]


def _prepare_reduction(prim: Any) -> tuple[Any, Any, list[Any]]:
    """A schedule with the reduction family's common start: the output's reduction (if any) accumulated in a
    local tile, cheap stages inlined, pads kept. Returns (schedule, output stage, the other root stages)."""
    sch = Schedule(prim.outputs)
    out = sch[prim.outputs[0]]
    pads = _pad_stages(sch)
    keep = {p.name for p in pads}
    if out.op is not None and out.op.is_reduction:
        keep.add(_cache_accumulator(sch, out))
    _inline_cheap(sch, keep=keep)
    pad_names = {p.name for p in pads}
    inner = [st for st in sch.stages.values()
             if st.op is not None and st is not out and st.attach == ROOT and st.name not in pad_names]
    return sch, out, inner


def _reduction_inside(sch: Any, stage: Any, vectorize: bool) -> None:
    leaves = list(sch.leaves(stage.name))
    spatial = [lp for lp in leaves if not stage.loops[lp].is_reduce]
    reduce = [lp for lp in leaves if stage.loops[lp].is_reduce]
    if reduce:
        sch.reorder(stage.name, *reduce, *spatial)
    if vectorize and spatial:
        sch.vectorize(stage.name, spatial[-1])


def _template_reduction(sch: Any, prim: Any, config: Config, target: Any) -> None:
    # The steps are recorded on the schedule `_prepare_reduction` makes; copy them onto `sch` at the end.
    mine, out, inner = _prepare_reduction(prim)
    mode, last = _reduction_mode(prim, target)
    parallel = bool(config.get("parallel", 0)) and target.num_cores > 1
    for pad in _pad_stages(mine):
        if config.get("pad", "root") == "inline":
            mine.compute_inline(pad.name)
        elif _blocked_stage(pad):
            _blocked_rows(mine, pad, target)  # a blocked pooling's input (NCHW16c)
        else:
            _flat_loops(mine, pad, target)
    leaves = list(mine.leaves(out.name))
    if mode == "scalar":
        for st in inner:
            _flat_loops(mine, st, target)
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


def _template_injective(sch: Any, prim: Any, config: Config, target: Any) -> None:
    _inline_cheap(sch)
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
            _flat_loops(sch, stage, target, mode="inner" if mode == "transpose" else mode, vector=vector,
                        parallel=parallel)


def _template_winograd(sch: Any, prim: Any, config: Config, target: Any) -> None:
    """A Winograd transform (`relay_tune.op.winograd`) and what is fused with it: every other stage inlined into
    the output, whose transform positions are unrolled, so that each position's `Select` on it leaves one sum with
    literal coefficients and the partial sums positions share are computed once; the channel block (or a vector of
    channels) is the vector.

    Input side, output `(alpha^2, tiles, C)`: loops tiles x channel blocks (`order`), then the alpha^2 positions
    (unrolled), then the block's channels (vectorized): one tile's alpha x alpha input vectors feed all positions.
    Output side, `(n, K/b, H, W, b)`: rows and columns split into tiles of m, loops over blocks and tiles
    (`order`), the m x m positions of a tile unrolled, the block vectorized; a fused epilogue (bias, activation,
    residual) runs on those vectors. An NCHW output (no block) keeps scalar code."""
    transform = _winograd_stage(sch)
    out = sch[prim.outputs[0]]
    for name, stage in list(sch.stages.items()):
        if stage.op is not None and not stage.is_output and stage.attach == ROOT and (
                stage.op.tag in INLINABLE_TAGS or not stage.op.tag or stage.op.tag == "pad" or stage is transform):
            sch.compute_inline(name)
    parallel = bool(config["parallel"]) and target.num_cores > 1
    name = out.name
    leaves = list(sch.leaves(name))
    if transform.op.tag == "winograd_input":
        e, p, c = leaves
        block = _winograd_input_block(transform)
        lanes = target.vector_lanes(out.tensor.dtype)
        co, ci = sch.split(name, c, factor=block or lanes)
        outer = [p, co] if config["order"] == "pc" else [co, p]
        sch.reorder(name, *outer, e, ci)
        head = sch.fuse(name, *outer)
        if parallel:
            sch.parallel(name, head)
        sch.unroll(name, e)
        sch.vectorize(name, ci)
        return
    m = _winograd_tile(transform)
    if len(leaves) == 5:
        n, k, h, w, lane = leaves
    else:
        (n, k, h, w), lane = leaves, None
    ho, hi = sch.split(name, h, factor=m)
    wo, wi = sch.split(name, w, factor=m)
    outer = [n, k, ho] if config["order"] == "cp" else [n, ho, k]
    sch.reorder(name, *outer, wo, hi, wi, *([lane] if lane else []))
    head = sch.fuse(name, *outer)
    if parallel:
        sch.parallel(name, head)
    sch.unroll(name, hi)
    sch.unroll(name, wi)
    if lane is not None:
        sch.vectorize(name, lane)


def _winograd_input_block(transform: Any) -> int:
    """The channel block the input transform reads (`NCHW{b}c` data: its 5-D input's last axis), 0 for NCHW."""
    for t in te.tensors_read(transform.op.body):
        if t.ndim == 5:
            return int(t.shape[-1])
    return 0


def _winograd_tile(transform: Any) -> int:
    """m of the output transform's F(m x m, 3 x 3): alpha^2 = (m + 2)^2 rows in its input."""
    alpha_sq = next(t.shape[0] for t in te.tensors_read(transform.op.body) if t.ndim == 3)
    return round(alpha_sq ** 0.5) - 2


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


_TEMPLATES: dict[str, Callable[[Any, Any, Config, Any], None]] = {
    "dense": _template_matmul,
    "batch_matmul": _template_matmul,
    "conv2d_nchw": _template_conv2d_nchw,
    "conv2d_nchw_cl": _template_conv2d_nchw_cl,
    "conv2d_nhwc": _template_conv2d_nhwc,
    "depthwise_conv2d_nchw": _template_depthwise,
    "conv2d_nchwc": _template_conv2d_nchwc,
    "depthwise_conv2d_nchwc": _template_depthwise_nchwc,
    "reduction": _template_reduction,
    "injective": _template_injective,
    "winograd": _template_winograd,
}


# ---------------------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------------------


def format_space_table(rows: Sequence[tuple[str, str, Space]]) -> str:
    """A plain-text table of (description, family, space): knob combinations and valid configs (when small
    enough to count)."""
    lines = [f"{'family':22}  {'knobs':>5}  {'combinations':>12}  {'valid':>10}  workload"]
    for description, family, space in rows:
        valid = space.count_valid(limit=200_000)
        lines.append(f"{family:22}  {len(space.knobs):>5}  {space.size():>12,}  "
                     f"{(f'{valid:,}' if valid is not None else '-'):>10}  {description}")
    return "\n".join(lines)
