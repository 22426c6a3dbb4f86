"""Features of candidate schedules for the cost model.

Two kinds, both fixed-length float32 vectors:

* **Loop-nest features** (`loop_nest_features`, the default) are computed from the lowered loop nest
  (`tir.PrimFunc`) of a candidate, not from its knob values, so one vector layout serves every workload and every
  search space: a model trained on one task's measurements ranks another task's candidates (transfer). They follow
  AutoTVM's itervar/curve features and Ansor's per-store features. For each store statement of the nest:

  - execution count, arithmetic per execution (float add/mul/FMA/div/min-max/select/intrinsics, index arithmetic),
    whether it accumulates into its own target, the storage scope written;
  - loop context: depth, guards (tails that lowering could not peel), vectorized lanes and whether the vector loop
    is innermost and a multiple of the native width, unrolled extent, parallel extent;
  - per buffer access (the written buffer, then the reads by bytes touched): scope, stride of the innermost loop
    and of the vector loop (0 = broadcast, 1 = contiguous, else gather), bytes and 64-byte lines touched by the
    whole nest, a *touch curve* and a *reuse curve* (over the innermost loops whose iteration count reaches 2^0,
    2^3, ..., 2^27: the bytes touched, and the uses per touched element), and reuse (the innermost loop that does
    not move the access: its extent, the iterations and bytes between two uses);
  - a roofline estimate: for cache capacities of 4 KiB (registers), 32 KiB (L1), 1 MiB (L2) and 32 MiB (L3), the
    bytes that must move into a cache of that size (footprint of the outermost loop level that fits, times the
    iterations around it) and the arithmetic intensity (flops per such byte);
  - the innermost loops, itervar style: extent, kind (serial/vectorized/unrolled/parallel), whether the loop moves
    the store target (spatial) or not (reduction), products of the extents above and below.

  The three heaviest stores (by float operations) fill three blocks; sums over all stores and kernel-wide values
  (scratch allocation sizes, the outer parallel extent, total flops and traffic) complete the vector. Counts and
  sizes are `log2(1 + x)`.

* **Knob features** (`knob_features`): the config's knob values flattened (split factors as log2, choices as their
  index, booleans as 0/1). Cheap, but tied to one space: a baseline, and a fallback for tasks that cannot be
  lowered without compiling.

`Featurizer` computes features for (task, config) pairs with a cache per config key. A task whose configs can be
lowered provides `lower(config) -> tir.PrimFunc` (lowering only, no LLVM).
"""

from __future__ import annotations

import math
import multiprocessing
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from relay_tune.errors import RelayTuneError, UnsupportedError
from relay_tune.kernel import tir
from relay_tune.kernel.tir import ForKind, Scope
from search_space import BoolKnob, ChoiceKnob, Config, IntKnob, Knob, Space, SplitKnob

LOOP_NEST_SCHEMA = "loopnest-v2"
KNOB_SCHEMA_PREFIX = "knob-v1"

STORE_SLOTS = 3  # heaviest stores described one by one
BUFFER_SLOTS = 4  # accesses per store: the written buffer, then the three reads touching the most bytes
ITERVAR_SLOTS = 6  # innermost loops per store
CURVE_POINTS = tuple(range(0, 28, 3))  # log2 of iteration counts at which the touch curve is sampled
CACHE_BYTES = (4 << 10, 32 << 10, 1 << 20, 32 << 20)
NATIVE_LANES = 16  # float32 lanes of a 512-bit vector: the widest the targets here have
CACHE_LINE = 64

_LOOP_KINDS = (ForKind.SERIAL, ForKind.VECTORIZED, ForKind.UNROLLED, ForKind.PARALLEL)


def _log(x: float) -> float:
    return math.log2(1.0 + x) if x > 0 else 0.0


# ---------------------------------------------------------------------------------------------------------------
# Feature layout
# ---------------------------------------------------------------------------------------------------------------

_STORE_SCALARS = (
    "present", "exec", "float_ops", "adds", "muls", "fmas", "divs", "minmax", "selects", "intrinsics", "int_ops",
    "accumulates", "writes_local", "is_constant", "depth", "guards", "vec_lanes", "vec_innermost", "vec_native",
    "vec_depth", "unroll_product", "unroll_loops", "unroll_inner", "parallel_extent", "parallel_loops",
)
_BUFFER_SCALARS = (
    "present", "written", "read", "local", "dtype_bytes", "buffer_bytes", "inner_stride0", "inner_stride1",
    "inner_stride", "vec_stride0", "vec_stride1", "vec_gather", "bytes", "lines", "reuse_count", "reuse_iters",
    "reuse_bytes",
)
_ITERVAR_SCALARS = ("present", "extent", *(f"kind_{k.value}" for k in _LOOP_KINDS), "spatial", "above", "below")
_ROOFLINE_SCALARS = tuple(f"{what}_{c >> 10}k" for c in CACHE_BYTES for what in ("traffic", "intensity"))
_GLOBAL_SCALARS = (
    "stores", "loops", "float_ops", "fmas", "traffic_l1", "traffic_l2", "intensity_l1", "intensity_l2",
    "local_bytes", "local_max", "local_allocs", "global_scratch_bytes", "outer_parallel", "guards",
    "vectorized_fraction", "param_bytes",
)


def _store_names(slot: int) -> list[str]:
    prefix = f"s{slot}."
    names = [prefix + n for n in _STORE_SCALARS]
    for b in range(BUFFER_SLOTS):
        names += [f"{prefix}b{b}.{n}" for n in _BUFFER_SCALARS]
        names += [f"{prefix}b{b}.curve{p}" for p in CURVE_POINTS]
        names += [f"{prefix}b{b}.reuse_curve{p}" for p in CURVE_POINTS]
    names += [prefix + n for n in _ROOFLINE_SCALARS]
    for v in range(ITERVAR_SLOTS):
        names += [f"{prefix}loop{v}.{n}" for n in _ITERVAR_SCALARS]
    return names


def loop_nest_feature_names() -> list[str]:
    """Names of the loop-nest features, in vector order."""
    names = [f"all.{n}" for n in _GLOBAL_SCALARS]
    for slot in range(STORE_SLOTS):
        names += _store_names(slot)
    return names


_STORE_WIDTH = len(_store_names(0))
_GLOBAL_WIDTH = len(_GLOBAL_SCALARS)
LOOP_NEST_WIDTH = _GLOBAL_WIDTH + STORE_SLOTS * _STORE_WIDTH


# ---------------------------------------------------------------------------------------------------------------
# Affine views of index expressions
# ---------------------------------------------------------------------------------------------------------------


def _coefficients(expr: tir.PrimExpr) -> dict[tir.LoopVar, float]:
    """Approximate coefficient of each loop variable in an index expression.

    Exact for affine expressions; `x // c` divides and `x % c` keeps the coefficients of `x`; `min`/`max` (the
    clamps of padded reads) and selects take the union of their operands. Good enough to tell strides and
    footprints apart, which is all the features need.
    """
    out: dict[tir.LoopVar, float] = {}
    stack: list[tuple[tir.PrimExpr, float]] = [(expr, 1.0)]
    while stack:
        node, scale = stack.pop()
        if isinstance(node, tir.LoopVar):
            out[node] = out.get(node, 0.0) + scale
        elif isinstance(node, tir.BinaryOp):
            op = node.op
            if op == "add":
                stack.append((node.a, scale))
                stack.append((node.b, scale))
            elif op == "sub":
                stack.append((node.a, scale))
                stack.append((node.b, -scale))
            elif op == "mul":
                if isinstance(node.b, tir.IntImm):
                    stack.append((node.a, scale * node.b.value))
                elif isinstance(node.a, tir.IntImm):
                    stack.append((node.b, scale * node.a.value))
                else:
                    stack.append((node.a, scale))
                    stack.append((node.b, scale))
            elif op in ("floordiv", "div"):
                divisor = node.b.value if isinstance(node.b, tir.IntImm) and node.b.value else 1
                stack.append((node.a, scale / divisor))
            elif op in ("floormod", "min", "max"):
                stack.append((node.a, scale))
                if op != "floormod":
                    stack.append((node.b, scale))
        elif isinstance(node, tir.Select):
            stack.append((node.true_value, scale))
            stack.append((node.false_value, scale))
        elif isinstance(node, tir.Cast):
            stack.append((node.value, scale))
    return {v: c for v, c in out.items() if c != 0.0}


# ---------------------------------------------------------------------------------------------------------------
# Walking the nest
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Loop:
    var: tir.LoopVar
    extent: int
    kind: ForKind


@dataclass
class _Access:
    buffer: tir.Buffer
    coeffs: list[dict[tir.LoopVar, float]]  # per buffer dimension
    written: bool
    read: bool


@dataclass
class _Ops:
    adds: int = 0
    muls: int = 0
    fmas: int = 0
    divs: int = 0
    minmax: int = 0
    selects: int = 0
    intrinsics: int = 0
    int_ops: int = 0

    @property
    def float_ops(self) -> int:
        return self.adds + self.muls + self.divs + self.minmax + self.selects + self.intrinsics


@dataclass
class _StoreInfo:
    store: tir.Store
    loops: list[_Loop]  # enclosing loops with extent > 1, outermost first
    guards: int
    ops: _Ops
    accesses: list[_Access]
    exec_count: float
    accumulates: bool

    @property
    def weight(self) -> float:
        return self.exec_count * max(1, self.ops.float_ops)


def _count_value(value: tir.PrimExpr, store: tir.Store) -> tuple[_Ops, list[tir.Load], bool]:
    """Arithmetic in a stored value, its loads, and whether it reads the location it stores to."""
    ops = _Ops()
    loads: list[tir.Load] = []
    stack: list[tuple[tir.PrimExpr, bool]] = [(value, False)]
    while stack:
        node, in_index = stack.pop()
        if isinstance(node, tir.Load):
            loads.append(node)
            stack.extend((i, True) for i in node.indices)
        elif isinstance(node, tir.BinaryOp):
            is_float = node.dtype.startswith("float")
            if in_index or not is_float:
                ops.int_ops += 1
            elif node.op in ("add", "sub"):
                ops.adds += 1
                if any(isinstance(x, tir.BinaryOp) and x.op == "mul" for x in (node.a, node.b)):
                    ops.fmas += 1
            elif node.op == "mul":
                ops.muls += 1
            elif node.op in ("div", "floordiv", "floormod"):
                ops.divs += 1
            elif node.op in ("min", "max"):
                ops.minmax += 1
            else:
                ops.selects += 1
            stack.append((node.a, in_index))
            stack.append((node.b, in_index))
        elif isinstance(node, tir.Select):
            ops.selects += 1
            stack.extend(((node.cond, True), (node.true_value, in_index), (node.false_value, in_index)))
        elif isinstance(node, tir.Call):
            if node.name == "fma":
                ops.fmas += 1
                ops.adds += 1
                ops.muls += 1
            else:
                ops.intrinsics += 1
            stack.extend((a, in_index) for a in node.args)
        elif isinstance(node, tir.Cast):
            stack.append((node.value, in_index))
        elif isinstance(node, tir.Not):
            ops.int_ops += 1
            stack.append((node.a, True))
    for index in store.indices:
        ops.int_ops += _count_index_ops(index)
    accumulates = any(ld.buffer is store.buffer and ld.indices == store.indices for ld in loads)
    return ops, loads, accumulates


def _count_index_ops(expr: tir.PrimExpr) -> int:
    count = 0
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, tir.BinaryOp):
            count += 1
            stack.append(node.a)
            stack.append(node.b)
        elif isinstance(node, tir.Select):
            count += 1
            stack.extend((node.cond, node.true_value, node.false_value))
        elif isinstance(node, tir.Cast):
            stack.append(node.value)
    return count


@dataclass
class _NestSummary:
    stores: list[_StoreInfo]
    loops: int
    allocations: list[tir.Buffer]
    outer_parallel: int


def _walk(func: tir.PrimFunc) -> _NestSummary:
    stores: list[_StoreInfo] = []
    allocations: list[tir.Buffer] = []
    loop_count = 0
    outer_parallel = 0
    stack: list[tuple[tir.Stmt, tuple[_Loop, ...], int]] = [(func.body, (), 0)]
    while stack:
        stmt, loops, guards = stack.pop()
        if isinstance(stmt, tir.For):
            loop_count += 1
            if stmt.kind is ForKind.PARALLEL and not any(lp.kind is ForKind.PARALLEL for lp in loops):
                outer_parallel = max(outer_parallel, stmt.extent)
            inner = (*loops, _Loop(stmt.var, stmt.extent, stmt.kind)) if stmt.extent > 1 else loops
            stack.append((stmt.body, inner, guards))
        elif isinstance(stmt, tir.Seq):
            stack.extend((s, loops, guards) for s in reversed(stmt.stmts))
        elif isinstance(stmt, tir.Store):
            ops, loads, accumulates = _count_value(stmt.value, stmt)
            accesses = [_Access(stmt.buffer, [_coefficients(i) for i in stmt.indices], True, accumulates)]
            for load in loads:
                if accumulates and load.buffer is stmt.buffer and load.indices == stmt.indices:
                    continue
                accesses.append(_Access(load.buffer, [_coefficients(i) for i in load.indices], False, True))
            exec_count = float(math.prod(lp.extent for lp in loops))
            stores.append(_StoreInfo(stmt, list(loops), guards, ops, _merge_accesses(accesses), exec_count,
                                     accumulates))
        elif isinstance(stmt, tir.IfThenElse):
            stack.append((stmt.then_body, loops, guards + 1))
            if stmt.else_body is not None:
                stack.append((stmt.else_body, loops, guards + 1))
        elif isinstance(stmt, tir.Allocate):
            allocations.append(stmt.buffer)
            stack.append((stmt.body, loops, guards))
    return _NestSummary(stores, loop_count, allocations, outer_parallel)


def _merge_accesses(accesses: list[_Access]) -> list[_Access]:
    """One access per buffer: several reads of one buffer (e.g. an unrolled stencil) touch one region."""
    merged: dict[int, _Access] = {}
    for access in accesses:
        held = merged.get(id(access.buffer))
        if held is None:
            merged[id(access.buffer)] = _Access(access.buffer, [dict(c) for c in access.coeffs], access.written,
                                                access.read)
            continue
        held.written |= access.written
        held.read |= access.read
        for mine, theirs in zip(held.coeffs, access.coeffs):
            for var, c in theirs.items():
                if abs(c) > abs(mine.get(var, 0.0)):
                    mine[var] = c
    return list(merged.values())


# ---------------------------------------------------------------------------------------------------------------
# Per-store features
# ---------------------------------------------------------------------------------------------------------------


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return strides


class _Footprints:
    """Distinct elements (and 64-byte lines) an access touches over the loops inside each level."""

    def __init__(self, access: _Access, loops: list[_Loop]) -> None:
        self.access = access
        self.loops = loops
        buffer = access.buffer
        self.item = tir_dtype_bytes(buffer.dtype)
        self.flat = [0.0] * len(loops)
        strides = _strides(buffer.shape)
        for coeffs, stride in zip(access.coeffs, strides):
            for j, lp in enumerate(loops):
                c = coeffs.get(lp.var)
                if c:
                    self.flat[j] += c * stride
        # elements[level] for level = 0..len(loops): loops[level:] vary, the others are fixed. Built from the
        # innermost level outwards, keeping per dimension the product of moving extents and the index span.
        n = len(loops)
        dims = len(access.coeffs)
        counts = [1.0] * dims
        spans = [1.0] * dims
        sizes = [float(s) for s in buffer.shape]
        elements = [0.0] * (n + 1)
        lines = [0.0] * (n + 1)
        per_line = CACHE_LINE / self.item
        for level in range(n, -1, -1):
            if level < n:
                lp = loops[level]
                for d, coeffs in enumerate(access.coeffs):
                    c = coeffs.get(lp.var)
                    if c:
                        counts[d] *= lp.extent
                        spans[d] += abs(c) * (lp.extent - 1)
            total = 1.0
            line_count = 1.0
            for d in range(dims):
                span = min(math.ceil(spans[d]), sizes[d])
                distinct = min(counts[d], span)
                total *= distinct
                line_count *= max(1.0, math.ceil(span / per_line)) if d == dims - 1 else distinct
            elements[level] = total
            lines[level] = line_count
        self.elements = elements
        self.lines = lines

    def bytes_at(self, level: int) -> float:
        return self.elements[level] * self.item


def tir_dtype_bytes(dtype: str) -> int:
    if dtype == "bool":
        return 1
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return max(1, int(digits) // 8) if digits else 4


def _stride_of(fp: _Footprints, loop_index: int | None) -> float | None:
    if loop_index is None:
        return None
    return fp.flat[loop_index]


def _store_block(info: _StoreInfo) -> list[float]:
    loops = info.loops
    ops = info.ops
    exec_count = info.exec_count
    vec = next((j for j in range(len(loops) - 1, -1, -1) if loops[j].kind is ForKind.VECTORIZED), None)
    lanes = loops[vec].extent if vec is not None else 1
    unrolled = [lp.extent for lp in loops if lp.kind is ForKind.UNROLLED]
    parallel = [lp.extent for lp in loops if lp.kind is ForKind.PARALLEL]
    innermost = len(loops) - 1 if loops else None
    block: list[float] = [
        1.0, _log(exec_count), _log(exec_count * ops.float_ops), _log(exec_count * ops.adds),
        _log(exec_count * ops.muls), _log(exec_count * ops.fmas), _log(exec_count * ops.divs),
        _log(exec_count * ops.minmax), _log(exec_count * ops.selects), _log(exec_count * ops.intrinsics),
        _log(exec_count * ops.int_ops), float(info.accumulates), float(info.store.buffer.scope is not Scope.GLOBAL),
        float(isinstance(info.store.value, tir.IntImm | tir.FloatImm)), float(len(loops)), float(info.guards),
        _log(lanes), float(vec is not None and vec == innermost),
        float(vec is not None and lanes % NATIVE_LANES == 0), float(vec if vec is not None else -1),
        _log(math.prod(unrolled)), float(len(unrolled)), _log(unrolled[-1] if unrolled else 0),
        _log(math.prod(parallel)), float(len(parallel)),
    ]
    # accesses: the written buffer first, then reads by bytes touched over the whole nest
    footprints = [_Footprints(a, loops) for a in info.accesses]
    written = [fp for fp in footprints if fp.access.written]
    reads = sorted((fp for fp in footprints if not fp.access.written),
                   key=lambda fp: (-fp.bytes_at(0), fp.access.buffer.name))
    ordered = (written + reads)[:BUFFER_SLOTS]
    cumulative = _inner_iteration_counts(loops)
    for slot in range(BUFFER_SLOTS):
        if slot < len(ordered):
            block += _buffer_block(ordered[slot], loops, vec, innermost, cumulative)
        else:
            block += [0.0] * (len(_BUFFER_SCALARS) + 2 * len(CURVE_POINTS))
    block += _roofline(footprints, loops, exec_count * max(1, ops.float_ops))
    block += _itervar_block(info)
    return block


def _inner_iteration_counts(loops: list[_Loop]) -> list[float]:
    """cumulative[level] = iterations of loops[level:] (cumulative[len] = 1)."""
    out = [1.0] * (len(loops) + 1)
    for j in range(len(loops) - 1, -1, -1):
        out[j] = out[j + 1] * loops[j].extent
    return out


def _buffer_block(fp: _Footprints, loops: list[_Loop], vec: int | None, innermost: int | None,
                  cumulative: list[float]) -> list[float]:
    access = fp.access
    inner_stride = _stride_of(fp, innermost)
    vec_stride = _stride_of(fp, vec)
    # reuse: the innermost loop that leaves the access where it is
    reuse_level = next((j for j in range(len(loops) - 1, -1, -1) if fp.flat[j] == 0.0), None)
    if reuse_level is None:
        reuse = [0.0, 0.0, 0.0]
    else:
        reuse = [_log(loops[reuse_level].extent), _log(cumulative[reuse_level + 1]),
                 _log(fp.bytes_at(reuse_level + 1))]
    block = [
        1.0, float(access.written), float(access.read), float(access.buffer.scope is not Scope.GLOBAL),
        float(fp.item), _log(access.buffer.size * fp.item),
        float(inner_stride == 0.0) if inner_stride is not None else 0.0,
        float(abs(inner_stride) == 1.0) if inner_stride is not None else 0.0,
        _log(abs(inner_stride)) if inner_stride is not None else 0.0,
        float(vec_stride == 0.0) if vec_stride is not None else 0.0,
        float(abs(vec_stride) == 1.0) if vec_stride is not None else 0.0,
        float(abs(vec_stride) > 1.0) if vec_stride is not None else 0.0,
        _log(fp.bytes_at(0)), _log(fp.lines[0]), *reuse,
    ]
    # touch and reuse curves: over the innermost loops whose iterations reach 2^p, the bytes touched, and how many
    # times each touched element is used (iterations per distinct element)
    level = len(loops)
    reuse_curve: list[float] = []
    for p in CURVE_POINTS:
        target = float(1 << p)
        while level > 0 and cumulative[level] < target:
            level -= 1
        block.append(_log(fp.bytes_at(level)))
        reuse_curve.append(_log(cumulative[level] / max(1.0, fp.elements[level]) - 1.0))
    return block + reuse_curve


def _traffic(footprints: list[_Footprints], loops: list[_Loop], capacity: int) -> float:
    """Bytes moved into a cache of `capacity` bytes: the footprint of the outermost loop level that fits,
    once per iteration of the loops around it (each footprint counted in whole lines)."""
    outer = 1.0
    for level in range(len(loops) + 1):
        total = sum(fp.lines[level] for fp in footprints) * CACHE_LINE
        if total <= capacity:
            return total * outer
        if level < len(loops):
            outer *= loops[level].extent
    return sum(fp.item for fp in footprints) * outer  # not even one iteration fits: every access misses


def _roofline(footprints: list[_Footprints], loops: list[_Loop], flops: float) -> list[float]:
    out: list[float] = []
    for capacity in CACHE_BYTES:
        traffic = _traffic(footprints, loops, capacity)
        out += [_log(traffic), math.log2(flops / traffic) if traffic > 0 and flops > 0 else 0.0]
    return out


def _itervar_block(info: _StoreInfo) -> list[float]:
    loops = info.loops
    store_vars: set[tir.LoopVar] = set()
    for index in info.store.indices:
        store_vars.update(_coefficients(index))
    block: list[float] = []
    above = 1.0
    aboves: list[float] = []
    for lp in loops:
        aboves.append(above)
        above *= lp.extent
    below = _inner_iteration_counts(loops)
    chosen = list(range(max(0, len(loops) - ITERVAR_SLOTS), len(loops)))
    for slot in range(ITERVAR_SLOTS):
        if slot < len(chosen):
            j = chosen[-1 - slot]  # slot 0 is the innermost loop
            lp = loops[j]
            block += [1.0, _log(lp.extent), *(float(lp.kind is k) for k in _LOOP_KINDS),
                      float(lp.var in store_vars), _log(aboves[j]), _log(below[j + 1])]
        else:
            block += [0.0] * len(_ITERVAR_SCALARS)
    return block


# ---------------------------------------------------------------------------------------------------------------
# The whole vector
# ---------------------------------------------------------------------------------------------------------------


def loop_nest_features(func: tir.PrimFunc) -> np.ndarray:
    """The fixed-length loop-nest feature vector of a lowered kernel (see the module docstring)."""
    summary = _walk(func)
    stores = summary.stores
    ranked = sorted(stores, key=lambda s: (-s.weight, -s.exec_count, s.store.buffer.name))
    l1 = l2 = 0.0
    float_ops = fmas = 0.0
    vectorized = 0.0
    total_exec = 0.0
    blocks: list[list[float]] = []
    for position, info in enumerate(ranked):
        flops = info.exec_count * info.ops.float_ops
        float_ops += flops
        fmas += info.exec_count * info.ops.fmas
        total_exec += info.exec_count
        if any(lp.kind is ForKind.VECTORIZED for lp in info.loops):
            vectorized += info.exec_count
        if position < STORE_SLOTS:
            blocks.append(_store_block(info))
        # Light stores (tails, copies) still move data: count their traffic without describing them.
        footprints = [_Footprints(a, info.loops) for a in info.accesses]
        l1 += _traffic(footprints, info.loops, CACHE_BYTES[1])
        l2 += _traffic(footprints, info.loops, CACHE_BYTES[2])
    local = [b.size * tir_dtype_bytes(b.dtype) for b in summary.allocations if b.scope is not Scope.GLOBAL]
    global_scratch = [b.size * tir_dtype_bytes(b.dtype) for b in summary.allocations if b.scope is Scope.GLOBAL]
    guards = sum(1 for s in stores if s.guards)
    values: list[float] = [
        _log(len(stores)), _log(summary.loops), _log(float_ops), _log(fmas), _log(l1), _log(l2),
        math.log2(float_ops / l1) if l1 > 0 and float_ops > 0 else 0.0,
        math.log2(float_ops / l2) if l2 > 0 and float_ops > 0 else 0.0,
        _log(sum(local)), _log(max(local, default=0)), float(len(local)), _log(sum(global_scratch)),
        _log(summary.outer_parallel), _log(guards), vectorized / total_exec if total_exec else 0.0,
        _log(sum(p.size * tir_dtype_bytes(p.dtype) for p in func.params)),
    ]
    for slot in range(STORE_SLOTS):
        values += blocks[slot] if slot < len(blocks) else [0.0] * _STORE_WIDTH
    vector = np.asarray(values, dtype=np.float32)
    assert vector.shape == (LOOP_NEST_WIDTH,)
    return vector


# ---------------------------------------------------------------------------------------------------------------
# Knob features
# ---------------------------------------------------------------------------------------------------------------


def _knob_width(knob: Knob) -> int:
    return knob.levels if isinstance(knob, SplitKnob) else 1


def knob_feature_names(space: Space) -> list[str]:
    names: list[str] = []
    for knob in space.knobs:
        if isinstance(knob, SplitKnob):
            names += [f"{knob.name}[{i}]" for i in range(knob.levels)]
        else:
            names.append(knob.name)
    return names


def knob_schema(space: Space) -> str:
    """Knob features only mean something within one space: the schema names the knobs."""
    return f"{KNOB_SCHEMA_PREFIX}:" + ",".join(f"{k.name}/{type(k).__name__}/{_knob_width(k)}" for k in space.knobs)


def knob_features(space: Space, config: Config) -> np.ndarray:
    """The config's knob values as numbers, in knob order (split factors as log2)."""
    values: list[float] = []
    for knob in space.knobs:
        value = config[knob.name]
        if isinstance(knob, SplitKnob):
            assert isinstance(value, tuple)
            values += [math.log2(max(1, int(f))) if isinstance(f, int | float) else 0.0 for f in value]
        elif isinstance(knob, BoolKnob):
            values.append(float(bool(value)))
        elif isinstance(knob, IntKnob):
            values.append(float(value))  # type: ignore[arg-type]
        elif isinstance(knob, ChoiceKnob):
            values.append(float(knob.choices.index(value)))
        else:
            values.append(float(hash(repr(value)) % 1024))
    return np.asarray(values, dtype=np.float32)


# ---------------------------------------------------------------------------------------------------------------
# Featurizers: (task, config) -> vector, cached
# ---------------------------------------------------------------------------------------------------------------


@runtime_checkable
class LowerableTask(Protocol):
    """A task whose configs can be lowered to a loop nest without compiling."""

    key: str
    space: Space

    def lower(self, config: Config) -> tir.PrimFunc: ...


class FeatureError(RelayTuneError):
    """Features cannot be computed (the task cannot be lowered, or a model and features disagree)."""


Lowerer = Callable[[Any, Config], tir.PrimFunc]


def default_lowerer(task: Any, config: Config) -> tir.PrimFunc:
    lower = getattr(task, "lower", None)
    if lower is None:
        raise UnsupportedError(f"task {getattr(task, 'description', task)!r} cannot lower a config without compiling "
                               f"it (no `lower(config)` method); use knob features")
    return lower(config)


def _compute(kind: str, lowerer: Lowerer, task: Any, config: Config) -> np.ndarray | None:
    try:
        if kind == "knob":
            return knob_features(task.space, config)
        return loop_nest_features(lowerer(task, config))
    except (RelayTuneError, ValueError, AssertionError):
        return None  # the template rejects the config: it is never a good candidate


def _compute_chunk(kind: str, task: Any, configs: list[dict[str, Any]]) -> list[np.ndarray | None]:
    """Worker-process entry: features of a chunk of configs (sent as plain dicts)."""
    return [_compute(kind, default_lowerer, task, Config(c)) for c in configs]


class Featurizer:
    """Feature vectors of configs of tasks, cached per (task, config).

    kind "loopnest": lowered loop-nest features (transferable across tasks); "knob": knob values (one space only).
    Configs that fail to lower (a template rejecting them) get no vector (`None`) and are counted in `failures`.
    jobs > 1 lowers large batches in that many worker processes (tasks must be picklable, as for the builder).
    """

    PARALLEL_MIN = 48  # below this many uncached configs, shipping them to workers costs more than it saves

    def __init__(self, kind: str = "loopnest", lowerer: Lowerer = default_lowerer, cache_limit: int = 200_000,
                 jobs: int = 1) -> None:
        if kind not in ("loopnest", "knob"):
            raise ValueError(f"unknown feature kind {kind!r} (expected 'loopnest' or 'knob')")
        self.kind = kind
        self.lowerer = lowerer
        self.cache_limit = cache_limit
        self.jobs = max(1, jobs)
        self._pool: Any = None
        self._cache: dict[tuple[str, str], np.ndarray | None] = {}
        self.seconds = 0.0  # time spent computing (not looking up) features
        self.computed = 0
        self.failures = 0

    def schema(self, space: Space | None = None) -> str:
        if self.kind == "loopnest":
            return LOOP_NEST_SCHEMA
        if space is None:
            raise ValueError("knob features need the space to name their schema")
        return knob_schema(space)

    @property
    def transferable(self) -> bool:
        return self.kind == "loopnest"

    def supports(self, task: Any) -> bool:
        return self.kind == "knob" or self.lowerer is not default_lowerer or isinstance(task, LowerableTask)

    def _store(self, key: tuple[str, str], vector: np.ndarray | None) -> None:
        self.computed += 1
        if vector is None:
            self.failures += 1
        if len(self._cache) >= self.cache_limit:
            self._cache.clear()
        self._cache[key] = vector

    def one(self, task: Any, config: Config) -> np.ndarray | None:
        key = (task.key, config.key)
        if key in self._cache:
            return self._cache[key]
        start = time.perf_counter()
        vector = _compute(self.kind, self.lowerer, task, config)
        self.seconds += time.perf_counter() - start
        self._store(key, vector)
        return vector

    def _fill_in_parallel(self, task: Any, configs: Sequence[Config]) -> None:
        missing = list({c.key: c for c in configs if (task.key, c.key) not in self._cache}.values())
        if (self.jobs < 2 or self.kind != "loopnest" or self.lowerer is not default_lowerer
                or len(missing) < self.PARALLEL_MIN):
            return
        start = time.perf_counter()
        pool = self._get_pool()
        size = -(-len(missing) // self.jobs)
        chunks = [missing[i : i + size] for i in range(0, len(missing), size)]
        futures = [pool.submit(_compute_chunk, self.kind, task, [c.to_dict() for c in chunk]) for chunk in chunks]
        width = self.width(task)
        for chunk, future in zip(chunks, futures):
            for config, vector in zip(chunk, future.result()):
                if vector is not None and vector.shape != (width,):
                    # a worker running other code (the package changed on disk since this process started)
                    vector = _compute(self.kind, self.lowerer, task, config)
                self._store((task.key, config.key), vector)
        self.seconds += time.perf_counter() - start

    def _get_pool(self) -> Any:
        if self._pool is None:
            # "spawn": workers must not inherit the tuner's threads or LLVM state (as the builder's workers)
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def many(self, task: Any, configs: Sequence[Config]) -> tuple[np.ndarray, list[int]]:
        """(matrix of the configs that have features, their positions in `configs`)."""
        self._fill_in_parallel(task, configs)
        rows: list[np.ndarray] = []
        kept: list[int] = []
        for i, config in enumerate(configs):
            vector = self.one(task, config)
            if vector is not None:
                rows.append(vector)
                kept.append(i)
        if not rows:
            return np.zeros((0, self.width(task)), dtype=np.float32), kept
        return np.stack(rows), kept

    def width(self, task: Any) -> int:
        if self.kind == "loopnest":
            return LOOP_NEST_WIDTH
        return sum(_knob_width(k) for k in task.space.knobs)

    def names(self, task: Any = None) -> Sequence[str]:
        if self.kind == "loopnest":
            return loop_nest_feature_names()
        return knob_feature_names(task.space)

    @property
    def mean_ms(self) -> float:
        return 1e3 * self.seconds / self.computed if self.computed else 0.0


__all__ = [
    "LOOP_NEST_SCHEMA",
    "LOOP_NEST_WIDTH",
    "FeatureError",
    "Featurizer",
    "LowerableTask",
    "default_lowerer",
    "knob_feature_names",
    "knob_features",
    "knob_schema",
    "loop_nest_feature_names",
    "loop_nest_features",
]
