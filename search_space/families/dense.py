"""The `dense` and `batch_matmul` families: a matrix product tiled for the vector registers.

Knobs: `tile_m` and `tile_n` split the output rows / columns in three levels (blocks, register tiles per block,
register tile); the inner column factor is the vector width and, for dense, the width of the weight panels
(`pack_b`: the constant weight packed `NK -> NK<bn>n` once, so a tile reads consecutive floats at every step of the
reduction). `tile_k` splits the reduction: the inner factor is unrolled. `k_block` (0: off) blocks the reduction
around the row tiles: a column panel accumulates in scratch while K advances one block at a time, the block's
weights staying in L1. `order` says whether column panels (`nm`) or row blocks (`mn`) are the outer loop,
`parallel` how many outer block loops are fused into the parallel loop (0: none).

A matrix-vector product (one output row, a weight of at least `MATVEC_MIN_WEIGHTS` elements: a dense layer at batch
1) is bound by memory bandwidth, not arithmetic: every weight is read once. Its default streams the packed weight
panel after panel (`NK<bn>n` puts each panel's K rows of `bn` columns one after the other, so the whole weight is
read front to back), the parallel loop gives each core a contiguous half of the panels, and a panel is
`MATVEC_CHAINS` vectors wide: as many independent accumulator chains as keep both FMA units busy, so the loop is
never bound by FMA latency, whatever rate the weights arrive at (the tiled default's two accumulators cap a core at
two vectors per FMA latency). `python -m experiments matvec` measures it against a STREAM triad.

A product of a few rows (at most `BLOCKED_MAX_ROWS`, more than one register tile of them) by such a streamed weight
whose panels overflow L1 (a classifier over time steps: 32 x 1024 by 8210 x 1024) defaults to the K-blocked order:
each block of a panel's weights (`k_block` x `bn` floats, at most `BLOCK_BYTES`) comes from memory once and serves
every row tile from L1, so the weight stream overlaps the arithmetic instead of stalling the first row tile of every
panel. `python -m
experiments kernels --only 8210` times it against numpy.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from relay_tune.kernel import te
from search_space.config import Config
from search_space.families.common import (
    MAX_K_UNROLL,
    MAX_TILE_ROWS,
    MAX_VECTOR,
    CpuWorkload,
    Family,
    TileKnob,
    accumulator_registers,
    anchor_stage,
    cache_accumulator,
    closest_factor,
    default_parallel,
    flat_loops,
    inline_cheap,
    inner_factor,
    input_index,
    mid_level_needs_outer,
    middle_factor,
    parallel_choices,
    parallel_worthwhile,
    producers_tagged,
    row_sizes,
    split_levels,
    split_value,
    stage_work,
    vector_registers,
    vector_sizes,
)
from search_space.knobs import BoolKnob, ChoiceKnob, Knob
from search_space.space import Constraint

K_BLOCKS = (32, 64, 128, 256, 512)
"""Reduction blocks of the K-blocked loop order (`k_block`), each at most half the reduction."""


MATVEC_CHAINS = 8
"""Accumulator vectors of a matrix-vector panel: FMA latency (4 cycles) times the FMA units (2) of current x86
cores, the independent chains it takes to retire one FMA per unit per cycle."""
MATVEC_MIN_WEIGHTS = 1 << 18
"""Weight elements (1 MiB of float32, a core's L2) from which a one-row dense counts as a streamed matrix-vector
product (`MATVEC_CHAINS`-wide panels); below it the weight is cache-resident and the tiled default applies."""
BLOCKED_MAX_ROWS = 64
"""Rows up to which a product by a streamed weight defaults to the K-blocked order: its scratch column panel (rows x
panel width floats) stays in L1 beside the weight block."""
BLOCK_BYTES = 16 * 1024
"""Bytes of weights one K block of a panel holds by default: half of the smallest L1 data cache of current x86
cores (32 KiB), the rest left to the rows' inputs and the scratch panel."""


def weight_input(anchor: Any) -> Any:
    """The 2-D placeholder a dense reduction reads as `w[j, k]` (j: the output column)."""
    column = anchor.op.axes[-1]
    for node in te.iter_exprs(anchor.op.body):
        if (isinstance(node, te.TensorRead) and node.tensor.is_placeholder and node.tensor.ndim == 2
                and node.indices[0] is column):
            return node.tensor
    return None


def _matches_dense(sch: Any, prim: Any, anchor: Any) -> bool:
    return bool(anchor.op.tag == "dense" and weight_input(anchor) is not None)


def _matches_batch_matmul(sch: Any, prim: Any, anchor: Any) -> bool:
    return bool(anchor.op.tag == "batch_matmul")


def _analyse(prim: Any, sch: Any, anchor: Any, target: Any, constants: frozenset[int], *, dense: bool
             ) -> dict[str, Any]:
    axes = anchor.op.axes
    weight = weight_input(anchor) if dense else None
    batched = weight is None and len(axes) == 3
    m = axes[-2].extent if batched else math.prod(ax.extent for ax in axes[:-1])
    dims = {"batch": axes[0].extent if batched else 1, "m": m, "n": axes[-1].extent,
            "k": anchor.op.reduce_axes[0].extent}
    index = input_index(weight) if weight is not None else None
    return {"dims": dims, "lanes": target.vector_lanes(anchor.tensor.dtype),
            "constant_weight": index is not None and index in constants,
            "default_parallel": parallel_worthwhile(target, stage_work(anchor))}


# -- space -------------------------------------------------------------------------------------------------------


def _matmul_registers_fit(config: Config, lanes: int, budget: int) -> bool:
    return accumulator_registers(inner_factor(config, "tile_m"), inner_factor(config, "tile_n"), lanes) <= budget


def _k_block_layout(config: Config) -> bool:
    """A K-blocked matmul accumulates a whole column panel: panels outermost (`nm`), parallel over panels at most,
    no middle tile levels, and blocks at least as long as the unrolled reduction step."""
    if not config["k_block"]:
        return True
    return (config["order"] == "nm" and int(config["parallel"]) < 2  # type: ignore[arg-type]
            and middle_factor(config, "tile_m") == 1 and middle_factor(config, "tile_n") == 1
            and int(config["k_block"]) >= inner_factor(config, "tile_k"))  # type: ignore[arg-type]


def _tile_m(workload: CpuWorkload) -> TileKnob:
    return TileKnob("tile_m", workload.dims["m"], 3, MAX_TILE_ROWS, row_sizes(MAX_TILE_ROWS))


def _column_limit(workload: CpuWorkload) -> int:
    """The widest column tile: `MAX_VECTOR` lanes, or `MATVEC_CHAINS` vectors for a one-row product (128 lanes at
    16 lanes a vector: a single output row needs that many lanes for as many chains)."""
    if workload.dims["m"] == 1:
        return max(MAX_VECTOR, MATVEC_CHAINS * workload.lanes)
    return MAX_VECTOR


def _tile_n(workload: CpuWorkload) -> TileKnob:
    limit = _column_limit(workload)
    return TileKnob("tile_n", workload.dims["n"], 3, limit, vector_sizes(workload.lanes, limit))


def _k_blocks(workload: CpuWorkload) -> list[int]:
    return [b for b in K_BLOCKS if 2 * b <= workload.dims["k"]]


def _knobs(workload: CpuWorkload) -> tuple[list[Knob], list[Constraint]]:
    lanes, budget = workload.lanes, workload.accumulator_budget
    knobs: list[Knob] = [
        _tile_m(workload),
        _tile_n(workload),
        TileKnob("tile_k", workload.dims["k"], 2, MAX_K_UNROLL),
        ChoiceKnob("order", ["nm", "mn"]),
        ChoiceKnob("parallel", parallel_choices(workload, 2)),
    ]
    constraints: list[Constraint] = []
    blocks = _k_blocks(workload)
    if blocks:
        knobs.append(ChoiceKnob("k_block", [0, *blocks]))
        constraints.append(Constraint("K blocks accumulate whole column panels", _k_block_layout))
    if workload.constant_weight:
        knobs.append(BoolKnob("pack_b"))
    constraints += [
        Constraint("accumulator tile fits the vector registers",
                   functools.partial(_matmul_registers_fit, lanes=lanes, budget=budget)),
        Constraint("row blocks only where there are several", functools.partial(
            mid_level_needs_outer, name="tile_m")),
        Constraint("column blocks only where there are several", functools.partial(
            mid_level_needs_outer, name="tile_n")),
    ]
    return knobs, constraints


# -- default -----------------------------------------------------------------------------------------------------


def default_columns(n: int, lanes: int) -> int:
    """Two vectors of columns, or three where those divide the row and two do not (24 of 24, 120 or 360 columns at
    8 lanes: a tail of half a panel costs its blocks a tested copy, 1.8-3x the time of whole 3-vector panels);
    a row narrower than two vectors whole, rounded up to vectors."""
    if n < 2 * lanes:
        return -(-n // lanes) * lanes if n > lanes // 2 else n
    if n % (2 * lanes) and n % (3 * lanes) == 0:
        return 3 * lanes
    return 2 * lanes


def is_matvec(workload: CpuWorkload) -> bool:
    """A dense layer at batch 1 whose weight streams from memory: one output row, a packable constant weight of at
    least `MATVEC_MIN_WEIGHTS` elements, at least two vectors of columns."""
    dims = workload.dims
    return (workload.family == "dense" and dims["m"] == 1 and workload.constant_weight
            and dims["n"] * dims["k"] >= MATVEC_MIN_WEIGHTS and dims["n"] >= 2 * workload.lanes)


def is_blocked_stream(workload: CpuWorkload, rows: int, columns: int) -> bool:
    """A product of a few rows by a streamed weight, for the K-blocked default: more than `rows` (one register tile)
    and at most `BLOCKED_MAX_ROWS` rows, a packable constant weight of at least `MATVEC_MIN_WEIGHTS` elements, and
    panels of `columns` whose weights overflow `BLOCK_BYTES` (a shorter panel stays in L1 for every row tile
    unblocked), with a reduction long enough for a block (`K_BLOCKS`)."""
    dims = workload.dims
    return (workload.family == "dense" and workload.constant_weight and rows < dims["m"] <= BLOCKED_MAX_ROWS
            and dims["n"] * dims["k"] >= MATVEC_MIN_WEIGHTS and dims["k"] * columns * 4 > BLOCK_BYTES
            and bool(_k_blocks(workload)))


def _default_k_block(workload: CpuWorkload, columns: int) -> int:
    """The longest K block (of `_k_blocks`) whose weights, `columns` wide, fit `BLOCK_BYTES` (the shortest one
    where none does)."""
    blocks = _k_blocks(workload)
    fitting = [b for b in blocks if b * columns * 4 <= BLOCK_BYTES]
    return max(fitting) if fitting else min(blocks)


def _matvec_columns(n: int, lanes: int, budget: int) -> int:
    """The panel width of a matrix-vector product: `MATVEC_CHAINS` vectors (fewer where the registers hold fewer),
    or the widest of half to all of those that divides the row (1000 columns at 8 lanes: 5 vectors, 40 columns,
    no tail panel)."""
    chains = min(MATVEC_CHAINS, budget)
    for vectors in range(chains, max(1, chains // 2) - 1, -1):
        if n % (vectors * lanes) == 0:
            return vectors * lanes
    return chains * lanes


def _default(workload: CpuWorkload) -> dict[str, Any]:
    """`default_columns` columns (`_matvec_columns` for a matrix-vector product), as many rows as the registers
    hold (8 at most), the reduction unrolled by 4, the weight packed; K-blocked and parallel over column panels for
    a few rows by a streamed weight (`is_blocked_stream`)."""
    lanes, dims = workload.lanes, workload.dims
    n, m, k = dims["n"], dims["m"], dims["k"]
    if is_matvec(workload):
        bn = _matvec_columns(n, lanes, workload.accumulator_budget)
    else:
        bn = default_columns(n, lanes)
    bn = closest_factor(_tile_n(workload), min(bn, n))
    mr = max(1, min(8, m, workload.accumulator_budget // vector_registers(bn, lanes)))
    mr = closest_factor(_tile_m(workload), mr)
    values: dict[str, Any] = {"tile_m": split_value(m, 1, mr), "tile_n": split_value(n, 1, bn),
                              "tile_k": split_value(k, 4 if k >= 8 else 1), "order": "nm",
                              "parallel": default_parallel(workload, 2)}
    if _k_blocks(workload):
        values["k_block"] = 0
        if is_blocked_stream(workload, mr, bn):
            # the K-blocked template accumulates whole column panels: parallel over panels at most
            values["k_block"] = _default_k_block(workload, bn)
            values["parallel"] = min(1, values["parallel"])
    if workload.constant_weight:
        values["pack_b"] = True
    return values


# -- template ----------------------------------------------------------------------------------------------------


def _template_matmul(sch: Any, prim: Any, config: Config, target: Any) -> None:
    anchor = anchor_stage(sch, prim)
    out = sch[prim.outputs[0]].name
    weight = weight_input(anchor) if config["family"] == "dense" else None
    batched = weight is None and len(anchor.op.axes) == 3
    tile_m, tile_n, tile_k = config["tile_m"], config["tile_n"], config["tile_k"]
    assert isinstance(tile_m, tuple) and isinstance(tile_n, tuple) and isinstance(tile_k, tuple)
    bn = int(tile_n[-1])
    packs = producers_tagged(sch, anchor, "pack")
    if weight is not None and config.get("pack_b"):
        sch.transform_layout(weight, "NK", f"NK{bn}n")
    acc = cache_accumulator(sch, anchor)
    inline_cheap(sch, keep={acc, *(p.name for p in packs)})
    for pack in packs:
        flat_loops(sch, pack, target)
    leaves = list(sch.leaves(out))
    if batched:
        batch, row, col = leaves
    else:
        batch = None
        row = leaves[0] if len(leaves) == 2 else sch.fuse(out, *leaves[:-1])
        col = leaves[-1]
    rows = split_levels(sch, out, row, tile_m)
    cols = split_levels(sch, out, col, tile_n)
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
    io, ii = sch.split(acc, i, factor=inner_factor(config, "tile_m"))
    ko, kin = sch.split(acc, k, factor=k_block)
    inner = list(sch.split(acc, kin, factor=ku)) if ku > 1 else [kin]
    sch.reorder(acc, ko, *batch_loops, io, *inner, ii, j)
    if ku > 1:
        sch.unroll(acc, inner[-1])
    for b in batch_loops:
        sch.unroll(acc, b)
    sch.unroll(acc, ii)
    sch.vectorize(acc, j)


DENSE = Family("dense", _matches_dense, functools.partial(_analyse, dense=True), _knobs, _default, _template_matmul)
BATCH_MATMUL = Family("batch_matmul", _matches_batch_matmul, functools.partial(_analyse, dense=False), _knobs,
                      _default, _template_matmul)
