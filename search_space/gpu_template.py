"""GPU schedule templates: how each operator family runs on an NVIDIA GPU, as replayable schedule steps.

The GPU counterpart of the CPU family templates in `search_space/families/`, and like them the only code that
schedules its families: `search_space.gpu` is its space (knobs, launch-limit constraints, default config) and
`search_space.defaults` applies it for untuned builds.

`gpu_schedule(prim, params)` is the one template per family: it schedules the tensor expressions of a fused
function (`relay_tune.kernel.compute.primitive_compute`) with explicit parameters. `default_params(prim)` is the
rule that picks the untuned parameters from the shapes; `default_gpu_schedule(prim)` is the template at them. The
search space (`search_space.gpu`) maps its configs onto these parameters, and its `default_config(prim)` is exactly
`default_params(prim)` (tests/test_default_schedules.py), so the default the tuner logs is what an untuned build
runs (`search_space.defaults`). Steps are plain data (`Schedule.replay`-able). Every schedule first inlines the
element-wise and injective stages into their readers, so a fused epilogue (bias, activation, residual) costs no
extra pass.

Families (`family_of`):

- **matmul** (dense, batch_matmul): a thread block computes a `block_m x block_n` tile of the output and
  each of its `(block_m / thread_m) x (block_n / thread_n)` threads a `thread_m x thread_n` register tile
  (`cache_write` to local, computed at the thread loop). The reduction is split by `block_k`; for each
  step both operand tiles are staged through shared memory (`cache_read`), filled cooperatively by all
  threads of the block with `vector`-wide loads, between barriers. Dense weights are read through a
  `KN` layout (`transform_layout`, packed once at build time) so that consecutive threads read
  consecutive shared-memory words. Tiles divide the output (a tail would put a barrier under a
  thread-dependent condition); shapes without suitable divisors use the direct variant below.
- **matmul direct** and **conv** (every convolution of rank-4 output): each thread accumulates a small
  tile (two axes of the output) in registers, reading its inputs from global memory (through the
  read-only cache); no shared memory, so any shape works. The padded input is inlined (a select).
- **flat** (everything else: injective, reductions, softmax, pooling, normalisation): every stage that
  is not inlined is computed at the root with its output elements spread over `threads`-wide blocks,
  `work` consecutive elements per thread (vectorized when the stage has no reduction). Reductions run
  serially per output element. The NVPTX back end launches each root stage as its own kernel, so a
  stage sees every element of the one before it (softmax: max, then sum, then the output).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from relay_tune.errors import CompileError
from relay_tune.kernel import te
from relay_tune.kernel.compute import INLINABLE_TAGS, PrimitiveCompute
from relay_tune.kernel.schedule import Schedule, Stage, Step
from relay_tune.target import Target

__all__ = [
    "CONV_TAGS",
    "MATMUL_TAGS",
    "ConvParams",
    "FlatParams",
    "MatmulParams",
    "ScheduleParams",
    "anchor_stage",
    "default_gpu_schedule",
    "default_params",
    "family_of",
    "gpu_schedule",
    "matmul_dims",
    "params_from_dict",
]

MATMUL_TAGS = frozenset({"dense", "batch_matmul"})
CONV_TAGS = frozenset({"conv2d", "conv2d_nchw", "conv2d_nhwc", "depthwise_conv2d_nchw", "group_conv2d_nchw", "conv",
                       "conv_transpose"})
WARP = 32


@dataclass(frozen=True)
class MatmulParams:
    """Tiled matmul. `shared`: stage operand tiles through shared memory (else each thread reads global
    memory directly, and block_k / vector are unused)."""

    block_m: int
    block_n: int
    thread_m: int
    thread_n: int
    block_k: int = 16
    vector: int = 1
    unroll_k: bool = True
    shared: bool = True
    pack_weight: bool = True
    family: str = "matmul"

    @property
    def threads(self) -> int:
        return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)

    def shared_bytes(self, itemsize: int = 4) -> int:
        if not self.shared:
            return 0
        return (self.block_m + self.block_n) * self.block_k * itemsize


@dataclass(frozen=True)
class ConvParams:
    """Direct convolution: a thread computes `tile_c x tile_w` outputs (axis 1 x axis 3 of the output);
    a block has `threads_c x threads_w` threads."""

    tile_c: int
    tile_w: int
    threads_c: int
    threads_w: int
    family: str = "conv"

    @property
    def threads(self) -> int:
        return self.threads_c * self.threads_w


@dataclass(frozen=True)
class FlatParams:
    """Every root stage's output elements: `threads` per block, `work` consecutive ones per thread."""

    threads: int = 256
    work: int = 1
    family: str = "flat"


ScheduleParams = MatmulParams | ConvParams | FlatParams


def params_from_dict(data: Mapping[str, Any]) -> ScheduleParams:
    """Parameters from their `asdict` form (as stored in tuning configs)."""
    family = data.get("family", "flat")
    cls = {"matmul": MatmulParams, "conv": ConvParams, "flat": FlatParams}.get(str(family))
    if cls is None:
        raise CompileError(f"unknown GPU schedule family {family!r}")
    return cls(**dict(data))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# analysis of the fused function
# ------------------------------------------------------------------------------------------------


def anchor_stage(sch: Schedule, prim: PrimitiveCompute) -> Stage | None:
    """The stage holding the anchor call's main reduction (or its result when it has none)."""
    call = prim.anchor_call
    if call is None:
        return None
    for t in reversed(call.tensors):
        if not t.is_placeholder and isinstance(t.op, te.ComputeOp) and t.op.is_reduction:
            return sch[t]
    return sch[call.result[0]] if call.result and not call.result[0].is_placeholder else None


def _single_output_like_anchor(prim: PrimitiveCompute, anchor: Stage) -> bool:
    return len(prim.outputs) == 1 and prim.outputs[0].shape == anchor.shape


def matmul_dims(anchor: Stage) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of a matmul-shaped reduction: spatial axes (batch..., i, j), one reduce axis."""
    op = anchor.op
    if op is None or len(op.axes) < 2 or len(op.reduce_axes) != 1 or len(te.tensors_read(op.body)) != 2:
        return None
    batch = math.prod(ax.extent for ax in op.axes[:-2])
    return batch, op.axes[-2].extent, op.axes[-1].extent, op.reduce_axes[0].extent


def family_of(prim: PrimitiveCompute) -> str:
    """Which schedule family a fused function gets: "matmul", "conv" or "flat"."""
    sch = Schedule(prim.outputs)
    anchor = anchor_stage(sch, prim)
    if anchor is None or anchor.op is None or not _single_output_like_anchor(prim, anchor):
        return "flat"
    tag = anchor.op.tag
    if tag in MATMUL_TAGS and matmul_dims(anchor) is not None:
        return "matmul"
    if tag in CONV_TAGS and anchor.op.is_reduction and len(anchor.op.axes) == 4:
        return "conv"
    return "flat"


# ------------------------------------------------------------------------------------------------
# default parameters
# ------------------------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pick_tile(extent: int, preferred: Sequence[int]) -> int | None:
    """The first preferred tile size that divides `extent`."""
    for t in preferred:
        if t <= extent and extent % t == 0:
            return t
    return None


def _fitting(extent: int, bound: int) -> int:
    """The largest count at most `bound` that divides `extent` or is a power of two."""
    return max(d for d in range(1, bound + 1) if extent % d == 0 or d & (d - 1) == 0)


def default_params(prim: PrimitiveCompute, target: Target | None = None) -> ScheduleParams:
    """Shape-based parameters for `prim`'s family (valid for every shape of that family)."""
    family = family_of(prim)
    sch = Schedule(prim.outputs)
    anchor = anchor_stage(sch, prim)
    if family == "matmul":
        assert anchor is not None
        dims = matmul_dims(anchor)
        assert dims is not None
        _, m, n, k = dims
        tm = _pick_tile(m, (4, 2, 1)) or 1
        tn = _pick_tile(n, (4, 2, 1)) or 1
        bm = _pick_tile(m, [t for t in (64, 32, 16, 8, 4, 2, 1) if t % tm == 0 and t // tm <= 16]) or tm
        bn = _pick_tile(n, [t for t in (64, 32, 16, 8, 4) if t % tn == 0 and t // tn <= 32]) or 0
        threads = (bm // tm) * (bn // tn) if bn else 0
        if bn and threads >= 16:
            bk = _pick_tile(k, (16, 8, 4)) or 16
            vector = 4 if bk % 4 == 0 and k % 4 == 0 else 1
            return MatmulParams(bm, bn, tm, tn, bk, vector, True, True, True)
        # no divisor gives a useful thread block: direct variant with guarded tails; a power-of-two count of
        # column threads, so that the config is a point of the search space (`search_space.gpu`)
        tn = 4 if n >= 4 else 1
        tm = 1
        bn = (1 << (min(32, -(-n // tn)).bit_length() - 1)) * tn
        bm = max(1, min(8, m, 256 // (bn // tn)))
        return MatmulParams(bm, bn, tm, tn, 16, 1, True, False, False)
    if family == "conv":
        assert anchor is not None and anchor.op is not None
        c, w = anchor.shape[1], anchor.shape[3]
        tile_c = 4 if c >= 16 else 1
        tile_w = 2 if w >= 8 else 1
        # thread counts that divide their axis or are powers of two: points of the search space's splits
        threads_w = _fitting(w, min(32, max(1, -(-w // tile_w))))
        threads_c = _fitting(c, max(1, min(-(-c // tile_c), 128 // threads_w, 16)))
        return ConvParams(tile_c, tile_w, threads_c, threads_w)
    return FlatParams(256, 1)


def default_gpu_schedule(prim: PrimitiveCompute, target: Target | None = None) -> list[Step]:
    """The default GPU schedule of a fused function's tensor expressions, as steps."""
    return gpu_schedule(prim, default_params(prim, target))


# ------------------------------------------------------------------------------------------------
# schedules
# ------------------------------------------------------------------------------------------------


def gpu_schedule(prim: PrimitiveCompute, params: ScheduleParams | Mapping[str, Any]) -> list[Step]:
    """Schedule `prim` with explicit parameters; raises `ScheduleError`/`CompileError` when they do not apply."""
    if not isinstance(params, (MatmulParams, ConvParams, FlatParams)):
        params = params_from_dict(params)
    sch = Schedule(prim.outputs)
    anchor = anchor_stage(sch, prim)
    if isinstance(params, FlatParams):
        _schedule_flat(sch, params)
        return list(sch.steps)
    if anchor is None or not _single_output_like_anchor(prim, anchor):
        raise CompileError(f"{params.family} schedule needs one output shaped like the anchor operator")
    if isinstance(params, MatmulParams):
        _schedule_matmul(sch, prim, anchor, params)
    else:
        _schedule_conv(sch, prim, anchor, params)
    return list(sch.steps)


def _inline_cheap(sch: Schedule, keep: frozenset[str] = frozenset()) -> None:
    for name, stage in list(sch.stages.items()):
        op = stage.op
        if op is None or stage.is_output or name in keep or op.is_reduction:
            continue
        if op.tag in INLINABLE_TAGS or op.tag == "pad" or not op.tag:
            sch.compute_inline(name)


def _schedule_flat(sch: Schedule, params: FlatParams) -> None:
    if params.threads < 1 or params.threads > 1024 or params.work < 1:
        raise CompileError(f"flat GPU schedule: bad threads={params.threads} / work={params.work}")
    _inline_cheap(sch)
    for name, stage in list(sch.stages.items()):
        if stage.op is None or stage.attach != "root":
            continue
        spatial = [lp for lp in sch.leaves(name) if not stage.loops[lp].is_reduce]
        if not spatial:
            continue  # a rank-0 result: one thread computes it
        fused = spatial[0] if len(spatial) == 1 else sch.fuse(name, *spatial)
        extent = math.prod(ax.extent for ax in stage.op.axes)
        has_reduce = bool(stage.op.reduce_axes)
        work = params.work if extent >= params.work else 1
        threads = max(1, min(params.threads, -(-extent // work)))
        if work > 1:
            block, thread, inner = sch.split(name, fused, factors=(None, threads, work))
            if has_reduce:
                # the reduction loops are inside; the per-thread outputs loop stays outside them
                sch.unroll(name, inner)
            else:
                sch.vectorize(name, inner)
        else:
            block, thread = sch.split(name, fused, factors=(None, threads))
        sch.bind(name, block, "blockIdx.x")
        sch.bind(name, thread, "threadIdx.x")


def _schedule_matmul(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, p: MatmulParams) -> None:
    dims = matmul_dims(anchor)
    if dims is None:
        raise CompileError("matmul schedule: the anchor is not a matmul-shaped reduction")
    _, m, n, _ = dims
    if p.block_m % p.thread_m or p.block_n % p.thread_n:
        raise CompileError(f"matmul schedule: thread tile {p.thread_m}x{p.thread_n} must divide the block tile "
                           f"{p.block_m}x{p.block_n}")
    ty, tx = p.block_m // p.thread_m, p.block_n // p.thread_n
    if ty * tx > 1024:
        raise CompileError(f"matmul schedule: {ty * tx} threads per block exceed 1024")
    if p.shared and (m % p.block_m or n % p.block_n):
        raise CompileError(f"matmul schedule: shared-memory tiles {p.block_m}x{p.block_n} must divide the output "
                           f"{m}x{n}")
    assert anchor.op is not None
    x_tensor, w_tensor = te.tensors_read(anchor.op.body)
    if p.pack_weight and p.shared and w_tensor.is_placeholder and w_tensor.ndim == 2 and anchor.op.tag == "dense":
        w_name = sch.transform_layout(w_tensor, "NK", "KN")
    else:
        w_name = sch.stage_name(w_tensor)
    x_name = sch.stage_name(x_tensor)
    acc = sch.cache_write(anchor.name, "local")
    if not anchor.is_output:
        sch.compute_inline(anchor.name)
    _inline_cheap(sch, keep=frozenset({acc}))
    out = sch[prim.outputs[0]].name

    leaves = list(sch.leaves(out))
    batch, row, col = leaves[:-2], leaves[-2], leaves[-1]
    io, ti, ii = sch.split(out, row, factors=(None, ty, p.thread_m))
    jo, tj, ji = sch.split(out, col, factors=(None, tx, p.thread_n))
    bb = (batch[0] if len(batch) == 1 else sch.fuse(out, *batch)) if batch else None
    sch.reorder(out, *([bb] if bb else []), io, jo, ti, tj, ii, ji)
    if bb is not None:
        sch.bind(out, bb, "blockIdx.z")
    sch.bind(out, io, "blockIdx.y")
    sch.bind(out, jo, "blockIdx.x")
    sch.bind(out, ti, "threadIdx.y")
    sch.bind(out, tj, "threadIdx.x")
    sch.unroll(out, ii)
    if p.thread_n in (2, 4) and n % p.thread_n == 0:
        sch.vectorize(out, ji)
    else:
        sch.unroll(out, ji)
    sch.compute_at(acc, out, tj)

    acc_leaves = list(sch.leaves(acc))
    spatial, kname = acc_leaves[:-1], acc_leaves[-1]
    if p.shared:
        ko, ki = sch.split(acc, kname, factor=p.block_k)
        sch.reorder(acc, ko, ki, *spatial)
        if p.unroll_k:
            sch.unroll(acc, ki)
    else:
        sch.reorder(acc, kname, *spatial)
    for s in spatial[:-1]:
        sch.unroll(acc, s)
    if p.thread_n in (2, 4) and n % p.thread_n == 0:
        sch.vectorize(acc, spatial[-1])  # one vector read of the weight tile per row and k
    else:
        sch.unroll(acc, spatial[-1])
    if not p.shared:
        return
    for source in (x_name, w_name):
        staged = sch.cache_read(source, "shared", [acc])
        sch.compute_at(staged, acc, ko)
        _cooperative_fill(sch, staged, ty, tx, p.vector)


def _cooperative_fill(sch: Schedule, stage: str, ty: int, tx: int, vector: int) -> None:
    """All threads of the block copy the shared tile: the loops fused, spread over (threadIdx.y, threadIdx.x),
    the innermost axis read `vector` elements at a time."""
    leaves = list(sch.leaves(stage))
    inner = leaves[-1]
    if vector > 1:
        outer_part, lanes = sch.split(stage, inner, factor=vector)
        leaves = [*leaves[:-1], outer_part]
    fused = leaves[0] if len(leaves) == 1 else sch.fuse(stage, *leaves)
    _, y, x = sch.split(stage, fused, factors=(None, ty, tx))
    sch.bind(stage, y, "threadIdx.y")
    sch.bind(stage, x, "threadIdx.x")
    if vector > 1:
        sch.vectorize(stage, lanes)


def _schedule_conv(sch: Schedule, prim: PrimitiveCompute, anchor: Stage, p: ConvParams) -> None:
    if p.threads > 1024 or min(p.tile_c, p.tile_w, p.threads_c, p.threads_w) < 1:
        raise CompileError(f"conv schedule: bad parameters {asdict(p)}")
    acc = sch.cache_write(anchor.name, "local")
    if not anchor.is_output:
        sch.compute_inline(anchor.name)
    _inline_cheap(sch, keep=frozenset({acc}))
    out = sch[prim.outputs[0]].name
    a0, a1, a2, a3 = sch.leaves(out)
    c_o, c_t, c_i = sch.split(out, a1, factors=(None, p.threads_c, p.tile_c))
    w_o, w_t, w_i = sch.split(out, a3, factors=(None, p.threads_w, p.tile_w))
    sch.reorder(out, a0, c_o, a2, w_o, c_t, w_t, c_i, w_i)
    outer = sch.fuse(out, a0, c_o)
    sch.bind(out, outer, "blockIdx.z")
    sch.bind(out, a2, "blockIdx.y")
    sch.bind(out, w_o, "blockIdx.x")
    sch.bind(out, c_t, "threadIdx.y")
    sch.bind(out, w_t, "threadIdx.x")
    sch.unroll(out, c_i)
    sch.unroll(out, w_i)
    sch.compute_at(acc, out, w_t)
    acc_leaves = list(sch.leaves(acc))
    stage = sch[acc]
    spatial = [lp for lp in acc_leaves if not stage.loops[lp].is_reduce]
    reduce = [lp for lp in acc_leaves if stage.loops[lp].is_reduce]
    sch.reorder(acc, *reduce, *spatial)
    sch.unroll(acc, spatial[1])
    sch.unroll(acc, spatial[3])
