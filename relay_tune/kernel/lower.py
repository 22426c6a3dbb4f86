"""Lowering: a scheduled tensor-expression kernel becomes a loop-nest `PrimFunc`.

`lower(schedule, name)` returns `PrimFunc(name, params, body)` whose parameters are, in this order:

1. the kernel inputs (placeholders that are still read), in the schedule's stage order (the order in
   which a depth-first walk from the outputs meets them);
2. the packed inputs created by `transform_layout`, in the order of those steps (the build fills them
   with `LayoutTransform.pack` of the original array);
3. the outputs, in the order given to `Schedule`.

`dict(func.attrs)` holds `"outputs"` (the output stage names) and `"layout_transforms"` (the
`LayoutTransform` of each packed parameter, in parameter order).

How the nest is built
---------------------
*Inlining*: stages marked `compute_inline` are substituted into their readers first, so a fused group
(pad -> conv2d -> bias -> relu) has no intermediate buffers.

*Structure*: every remaining stage gets one loop per leaf loop of its schedule. Root axes are rebuilt
from the leaves through the split/fuse relations (`i = i.0 * 8 + i.1`, `a = f // n_b`), and index
expressions are simplified so that they stay affine in the loop variables.

*Bound inference*: a stage placed with `compute_at(P, T, L)` computes, inside each iteration of loop
`L` of `T`, only the region of `P` that the loops inside `L` read. Each index of each read is split
into an outer part (fixed during one iteration of `L`) and an inner part whose interval is computed
from the inner loop ranges; the region is `outer + [min, max]` per dimension, and `P` is stored in a
buffer of the region's shape allocated at `L` (scope: the stage's cache scope; otherwise `local`
when at most 256 KiB, else `global`). Reads of `P` subtract the region's base. For a `shared` stage
the loops of `T` bound to `threadIdx` are relaxed too (the region covers the whole thread block).

*Reductions*: a reduction stage writes its init value just before its first reduction loop, looping
over the spatial loops that come after that point, then accumulates. So `reorder(k, i, j)` gives
`for i, j: C = 0` followed by `for k, i, j: C += ...`.

*Tails*: a split that does not divide its loop over-covers it; the statements are guarded by
`IfThenElse` at the innermost loop the condition involves. Wherever a guard is affine in a loop
variable, that loop is partitioned instead: a main part where the guard provably holds (no test) and
a tail, with the tail's constant substituted (so an inner vectorized loop gets a shorter constant
extent instead of a test per lane). Iterations where the guard can never hold are dropped. A non-reduction
stage's loops are also cut where a `Select` condition that is affine in them flips, the enclosing loops fixing
the rest of it (a concatenation's inputs along its axis): each part takes one branch, decided by the simplifier
from the part's range, so it copies from one input without a per-element choice.
Where the guard's offset is not fixed by the enclosing loops (a tail block under a fused loop:
`(f // 7) * 16 + j < 6625`), the nest below is versioned instead: `if` the guard holds at every
iteration of the loops below, a copy without the test runs, `else` the guarded copy (CPU kernels; a
GPU kernel keeps the guard rather than branch around its barriers).

*Speculative reads*: `te.if_then_else` becomes a `Select`, whose branches may both be evaluated, so
reads inside a branch whose index is not provably in bounds are clamped into the buffer (padding
reads `data[h - 1]` at `h = 0` read a valid element and discard it).

Statements produced: `For` (kinds from the loop annotations; extent-1 loops are elided except thread
bindings), `Store`, `IfThenElse`, `Seq`, `Allocate` (root intermediates: `global` at the top;
attached stages: at their loop), and `Barrier` around the fill of a `shared` stage. A loop bound to a
thread index inside another loop bound to the same index means "reuse that thread index" (the GPU
back end does not launch a new dimension); sequential execution of such nests is still correct.
"""

from __future__ import annotations

import itertools
import math
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass, field

from relay_tune.kernel import analysis, te, tir
from relay_tune.kernel.analysis import Interval, Lin, Simplifier
from relay_tune.kernel.schedule import (
    AT,
    INLINE,
    ROOT,
    FuseRel,
    Schedule,
    ScheduleError,
    SplitRel,
    Stage,
    rewrite_reads,
)
from relay_tune.kernel.tir import ForKind, PrimExpr, Scope

LOCAL_LIMIT_BYTES = 256 * 1024
"""An attached stage without a cache scope lives in `local` scratch up to this size."""

PEEL_BUDGET = 256
"""Loop partitions per kernel before lowering falls back to guards (bounds code growth)."""

VERSION_BUDGET = 16
"""Versioned nests (a guard-free copy beside the guarded one) per CPU kernel: each doubles a nest."""


def dtype_bytes(dtype: str) -> int:
    if dtype == "bool":
        return 1
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return max(1, int(digits) // 8) if digits else 4


@dataclass
class _LoopSpec:
    name: str
    extent: int
    svar: tir.LoopVar
    kind: ForKind
    thread_tag: str | None
    is_reduce: bool


@dataclass
class _Guard:
    """The condition `lin <= 0` over structural loop variables."""

    lin: Lin
    expr: PrimExpr
    stage_vars: frozenset[tir.LoopVar]
    nested: frozenset[tir.LoopVar]
    involves_reduce: bool


@dataclass
class _StageCtx:
    """One computed stage, described over *structural* loop variables: one per leaf loop, standing for
    that loop's value wherever the nest ends up being emitted. The emitter substitutes the emitted loop
    variable, the constant of a peeled tail, or an offset variable. `abs_axes` gives each root axis of
    the compute (absolute, i.e. region base included); `store_index` the position in the stage's own
    buffer (relative to the region)."""

    stage: Stage
    loops: list[_LoopSpec]
    abs_axes: dict[tir.LoopVar, PrimExpr]
    base: list[PrimExpr]
    region: tuple[int, ...]
    buffer: tir.Buffer
    guards: list[_Guard]
    abs_body: PrimExpr
    reduce_start: int | None
    store_index: list[PrimExpr] = field(default_factory=list)
    value: PrimExpr | None = None  # non-reduction stages
    init: PrimExpr | None = None  # reduction stages
    update: PrimExpr | None = None
    attached: dict[str, list[_StageCtx]] = field(default_factory=dict)
    # Comparisons `lin <= threshold` that choose a `Select` branch (a concatenation's "which input"): loops are
    # cut where one flips, so each part reads one input without a per-element choice.
    select_cuts: list[tuple[Lin, int]] = field(default_factory=list)


@dataclass
class _Env:
    """What is known at one point of the nest being emitted: structural loop variable -> emitted
    expression and its interval, structural buffer -> allocated buffer."""

    vmap: dict[tir.LoopVar, PrimExpr]
    ivals: dict[tir.LoopVar, tuple[int, int]]
    bmap: dict[tir.Buffer, tir.Buffer]
    versioned: frozenset[int] = frozenset()  # ids of the guards whose guarded copy this is

    def bind(self, svar: tir.LoopVar, value: PrimExpr, ival: tuple[int, int]) -> _Env:
        vmap = dict(self.vmap)
        vmap[svar] = value
        ivals = dict(self.ivals)
        ivals[svar] = ival
        return _Env(vmap, ivals, self.bmap, self.versioned)

    def with_buffer(self, structural: tir.Buffer, actual: tir.Buffer) -> _Env:
        bmap = dict(self.bmap)
        bmap[structural] = actual
        return _Env(self.vmap, self.ivals, bmap, self.versioned)

    def guarded_copy(self, guard: _Guard) -> _Env:
        return _Env(self.vmap, self.ivals, self.bmap, self.versioned | {id(guard)})


_DEAD = object()


def lower(schedule: Schedule, name: str = "main") -> tir.PrimFunc:
    """Lower a schedule to a loop-nest kernel (see the module docstring for the parameter order)."""
    return _Lowering(schedule, name).run()


def lower_te(outputs: te.Tensor | list[te.Tensor], name: str = "main") -> tir.PrimFunc:
    """Lower tensor expressions with the default schedule (one loop nest per compute)."""
    return lower(Schedule(outputs), name)


class _Lowering:
    def __init__(self, schedule: Schedule, name: str) -> None:
        self.sch = schedule
        self.name = name
        self.struct_ranges: dict[tir.LoopVar, tuple[int, int]] = {}
        self.var_ranges: dict[tir.LoopVar, tuple[int, int]] = {}
        self.ssimp = Simplifier(self.struct_ranges)
        self.esimp = Simplifier(self.var_ranges)
        self.peels_left = PEEL_BUDGET
        self.versions_left = VERSION_BUDGET
        self.ctx: dict[str, _StageCtx] = {}
        self.param_buffers: dict[str, tir.Buffer] = {}

    # ------------------------------------------------------------------ analysis of the schedule
    def run(self) -> tir.PrimFunc:
        stages = self.sch.stages
        live, inputs = self._live()
        eff = self._effective_bodies(live)
        readers = self._effective_readers(live, eff)
        self._validate(live, readers)

        order = [n for n in stages if n in live]  # producers first
        packed = [lt.packed for lt in self.sch.layout_transforms if lt.packed in inputs]
        plain = [n for n in stages if n in inputs and n not in packed]
        outputs = [self.sch.stage_name(t) for t in self.sch.outputs]
        for n in [*plain, *packed]:
            st = stages[n]
            self.param_buffers[n] = tir.Buffer(n, st.shape, st.tensor.dtype, Scope.GLOBAL)
        for n in outputs:
            st = stages[n]
            self.param_buffers[n] = tir.Buffer(n, st.shape, st.tensor.dtype, Scope.GLOBAL)

        for n in reversed(order):  # consumers first: a region depends on its readers
            self.ctx[n] = self._structure(stages[n], eff[n], readers[n])
        if any(lp.kind is ForKind.THREAD_BINDING for c in self.ctx.values() for lp in c.loops):
            # a GPU kernel: a version test on a thread index would split a block around its barriers
            self.versions_left = 0
        for n in order:
            self._templates(self.ctx[n])
            st = stages[n]
            if st.attach == AT:
                assert st.attach_target is not None and st.attach_loop is not None
                self.ctx[st.attach_target].attached.setdefault(st.attach_loop, []).append(self.ctx[n])

        env = _Env({}, {}, {})
        body_parts: list[tir.Stmt] = []
        for n in order:
            if stages[n].attach == ROOT:
                nest = self._emit_stage(self.ctx[n], env)
                if nest is not None:
                    body_parts.append(nest)
        body: tir.Stmt = tir.seq(*body_parts) if body_parts else tir.Seq(())
        for n in reversed(order):
            if stages[n].attach == ROOT and n not in outputs:
                body = tir.Allocate(self.ctx[n].buffer, body)
        self._check_parallel_nesting(body)
        params = tuple(self.param_buffers[n] for n in [*plain, *packed, *outputs])
        layouts = tuple(lt for lt in self.sch.layout_transforms if lt.packed in packed)
        attrs = (("outputs", tuple(outputs)), ("layout_transforms", layouts))
        return tir.PrimFunc(self.name, params, body, attrs)

    def _live(self) -> tuple[set[str], set[str]]:
        """Computed (not inlined) stages and inputs reachable from the outputs."""
        stages = self.sch.stages
        live: set[str] = set()
        inputs: set[str] = set()
        seen: set[str] = set()
        stack = [self.sch.stage_name(t) for t in self.sch.outputs]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            st = stages[n]
            if st.op is None:
                inputs.add(n)
                continue
            if st.attach != INLINE:
                live.add(n)
            for t in te.tensors_read(st.op.body):
                producer = self.sch.stage_of_tensor(t)
                if producer is None:
                    raise ScheduleError(f"stage {n} reads tensor {t.name}, which is not part of the schedule")
                stack.append(producer.name)
        return live, inputs

    def _effective_bodies(self, live: set[str]) -> dict[str, PrimExpr]:
        """Bodies with inlined stages substituted (producers are handled before their readers)."""
        eff: dict[str, PrimExpr] = {}
        for n, st in self.sch.stages.items():
            if st.op is None:
                continue

            def inline(read: te.TensorRead) -> PrimExpr | None:
                producer = self.sch.stage_of_tensor(read.tensor)
                if producer is None or producer.attach != INLINE or producer.op is None:
                    return None
                mapping = dict(zip(producer.op.axes, read.indices))
                return analysis.substitute(eff[producer.name], mapping)  # type: ignore[arg-type]

            eff[n] = rewrite_reads(st.op.body, inline)
        return {n: eff[n] for n in live}

    def _effective_readers(self, live: set[str], eff: dict[str, PrimExpr]) -> dict[str, list[str]]:
        readers: dict[str, list[str]] = {n: [] for n in self.sch.stages}
        for n in self.sch.stages:
            if n not in live:
                continue
            for t in te.tensors_read(eff[n]):
                producer = self.sch.stage_of_tensor(t)
                assert producer is not None
                if n not in readers[producer.name]:
                    readers[producer.name].append(n)
        return readers

    def _validate(self, live: set[str], readers: dict[str, list[str]]) -> None:
        stages = self.sch.stages
        for n in live:
            st = stages[n]
            for i, leaf in enumerate(st.leaves):
                loop = st.loops[leaf]
                if loop.kind is ForKind.VECTORIZED and i != len(st.leaves) - 1:
                    raise ScheduleError(
                        f"vectorized loop {leaf!r} of {n} must be the innermost loop (loops: {', '.join(st.leaves)})"
                    )
            if st.attach != AT:
                continue
            target_name, loop_name = st.attach_target, st.attach_loop
            assert target_name is not None and loop_name is not None
            target = stages[target_name]
            if target.attach == INLINE:
                raise ScheduleError(f"{n} is computed at {target_name}, which is inlined")
            if target_name not in live:
                raise ScheduleError(f"{n} is computed at {target_name}, which the outputs do not need")
            if loop_name not in target.leaves:
                raise ScheduleError(
                    f"{n} is computed at loop {loop_name!r} of {target_name}, which is no longer a loop"
                )
            if target.loops[loop_name].kind is ForKind.VECTORIZED:
                raise ScheduleError(f"{n} is computed at vectorized loop {loop_name!r} of {target_name}")
            position = target.leaves.index(loop_name)
            for r in readers[n]:
                if not self._nested_within(r, target_name, position):
                    raise ScheduleError(
                        f"{n} is computed at {target_name}.{loop_name} but is also read by {r}, which runs outside "
                        f"that loop; compute {r} inside it too, or keep {n} at the root"
                    )

    def _nested_within(self, reader: str, target: str, position: int) -> bool:
        """Whether `reader` runs inside loop number `position` (or deeper) of `target`."""
        if reader == target:
            return True
        st = self.sch.stages[reader]
        while st.attach == AT:
            assert st.attach_target is not None and st.attach_loop is not None
            outer = self.sch.stages[st.attach_target]
            if outer.name == target:
                return outer.leaves.index(st.attach_loop) >= position
            st = outer
        return False

    # ------------------------------------------------------------------ per-stage structure
    def _structure(self, st: Stage, eff_body: PrimExpr, readers: list[str]) -> _StageCtx:
        assert st.op is not None
        spatial = st.op.axes
        if st.attach == AT:
            base, region = self._infer_region(st, readers)
        else:
            base = [tir.IntImm(0) for _ in spatial]
            region = st.shape
        extents = st.loop_extents(region)
        svars: dict[str, tir.LoopVar] = {}
        loops: list[_LoopSpec] = []
        for leaf in st.leaves:
            v = tir.LoopVar(f"{st.name}/{leaf}")
            svars[leaf] = v
            self.struct_ranges[v] = (0, extents[leaf] - 1)
            lp = st.loops[leaf]
            loops.append(_LoopSpec(leaf, extents[leaf], v, lp.kind, lp.thread_tag, lp.is_reduce))

        rel = self._relation_exprs(st, svars, extents)
        abs_axes: dict[tir.LoopVar, PrimExpr] = {}
        for d, (ax, name) in enumerate(zip(st.root_axes, st.axis_names)):
            value = rel[name] + base[d] if d < len(spatial) else rel[name]
            abs_axes[ax] = self.ssimp.simplify(value)

        leaf_vars = set(svars.values())
        reduce_vars = {svars[leaf] for leaf in st.leaves if st.loops[leaf].is_reduce}
        guards: list[_Guard] = []
        for r in st.relations:
            if isinstance(r, SplitRel):
                covered = 1
                for c in r.children:
                    covered *= extents[c]
                if covered > extents[r.parent]:
                    lin = self._lin(rel[r.parent]).add(Lin({}, extents[r.parent] - 1), -1)
                    guards.append(self._guard(lin, leaf_vars, reduce_vars))
        if st.attach == AT:
            for d, ax in enumerate(spatial):
                lin = self._lin(abs_axes[ax])
                lo, hi = self.ssimp.lin_interval(lin)
                if hi > st.shape[d] - 1:
                    guards.append(self._guard(lin.add(Lin({}, st.shape[d] - 1), -1), leaf_vars, reduce_vars))
                if lo < 0:
                    guards.append(self._guard(lin.scale(-1), leaf_vars, reduce_vars))

        abs_body = analysis.substitute(eff_body, abs_axes)  # type: ignore[arg-type]
        reduce_start = next((i for i, lp in enumerate(loops) if lp.is_reduce), None)
        if st.attach == AT:
            scope = st.scope
            if scope is None:
                size = dtype_bytes(st.tensor.dtype)
                for r_ in region:
                    size *= r_
                scope = Scope.LOCAL if size <= LOCAL_LIMIT_BYTES else Scope.GLOBAL
            buffer = tir.Buffer(st.name, region, st.tensor.dtype, scope)
        elif st.name in self.param_buffers:
            buffer = self.param_buffers[st.name]
        else:
            buffer = tir.Buffer(st.name, st.shape, st.tensor.dtype, st.scope or Scope.GLOBAL)
        ctx = _StageCtx(st, loops, abs_axes, base, tuple(region), buffer, guards, abs_body, reduce_start)
        if reduce_start is None:
            ctx.select_cuts = self._select_cuts(abs_body, leaf_vars)
        ctx.store_index = [self.ssimp.simplify(rel[name]) for name in st.axis_names[: len(spatial)]]
        return ctx

    def _lin(self, expr: PrimExpr) -> Lin:
        value = self.ssimp.linear(expr)
        assert isinstance(value, Lin)
        return value

    def _guard(self, lin: Lin, leaf_vars: set[tir.LoopVar], reduce_vars: set[tir.LoopVar]) -> _Guard:
        direct = {a for a in lin.coeffs if isinstance(a, tir.LoopVar)}
        nested: set[tir.LoopVar] = set()
        for a in lin.coeffs:
            if not isinstance(a, tir.LoopVar):
                nested |= analysis.uses_vars(a)
        mentioned = (direct | nested) & leaf_vars
        return _Guard(lin, lin.to_expr(), frozenset(mentioned), frozenset(nested), bool(mentioned & reduce_vars))

    def _select_cuts(self, body: PrimExpr, leaf_vars: set[tir.LoopVar]) -> list[tuple[Lin, int]]:
        """The `Select` conditions of `body` that compare an affine function of the stage's loops with a bound, as
        (lin, threshold): the branch taken is the true one where `lin <= threshold`."""
        thresholds = {"lt": -1, "ge": -1, "le": 0, "gt": 0}  # `a < b` is `a - b <= -1`; `ge` and `gt` flip them
        cuts: list[tuple[Lin, int]] = []
        for node in te.iter_exprs(body):
            cond = node.cond if isinstance(node, tir.Select) else None
            if not (isinstance(cond, tir.BinaryOp) and cond.op in thresholds and cond.a.dtype != "bool"):
                continue
            a, b = self.ssimp.linear(cond.a), self.ssimp.linear(cond.b)
            if not (isinstance(a, Lin) and isinstance(b, Lin)):
                continue
            diff = a.add(b, -1)
            if any(isinstance(atom, tir.LoopVar) and atom in leaf_vars for atom in diff.coeffs):
                cuts.append((diff, thresholds[cond.op]))
        return cuts

    def _relation_exprs(
        self, st: Stage, svars: dict[str, tir.LoopVar], extents: dict[str, int]
    ) -> dict[str, PrimExpr]:
        """Expression of every loop (root axes included) in terms of the leaf loop variables."""
        exprs: dict[str, PrimExpr] = dict(svars)
        for r in reversed(st.relations):
            if isinstance(r, SplitRel):
                total: PrimExpr | None = None
                stride = 1
                for child in reversed(r.children):
                    term = exprs[child] * stride if stride != 1 else exprs[child]
                    total = term if total is None else term + total
                    stride *= extents[child]
                assert total is not None
                exprs[r.parent] = total
            else:
                assert isinstance(r, FuseRel)
                fused = exprs[r.fused]
                stride = 1
                for k in range(len(r.children) - 1, -1, -1):
                    child = r.children[k]
                    value = fused if stride == 1 else fused // stride
                    if k > 0:
                        value = value % extents[child]
                    exprs[child] = value
                    stride *= extents[child]
        return exprs

    def _infer_region(self, st: Stage, readers: list[str]) -> tuple[list[PrimExpr], tuple[int, ...]]:
        """Base (in the loop variables outside the attach point) and extent of the region of `st` read
        inside one iteration of its attach loop."""
        assert st.attach_target is not None and st.attach_loop is not None
        target = self.ctx[st.attach_target]
        position = target.stage.leaves.index(st.attach_loop)
        inner: set[tir.LoopVar] = {lp.svar for lp in target.loops[position + 1 :]}
        if st.scope is Scope.SHARED:
            # one copy serves the whole thread block: relax every enclosing threadIdx loop
            enclosing, upto = target, position
            while True:
                inner |= {
                    lp.svar for lp in enclosing.loops[: upto + 1]
                    if lp.kind is ForKind.THREAD_BINDING and (lp.thread_tag or "").startswith("threadIdx")
                }
                outer_stage = enclosing.stage
                if outer_stage.attach != AT:
                    break
                assert outer_stage.attach_target is not None and outer_stage.attach_loop is not None
                enclosing = self.ctx[outer_stage.attach_target]
                upto = enclosing.stage.leaves.index(outer_stage.attach_loop)
        for other_name, other in self.ctx.items():
            if other_name != target.stage.name and self._nested_within(other_name, target.stage.name, position):
                inner |= {lp.svar for lp in other.loops}

        accesses: list[tuple[PrimExpr, ...]] = []
        for r in readers:
            for node in te.iter_exprs(self.ctx[r].abs_body):
                if isinstance(node, te.TensorRead) and node.tensor is st.tensor:
                    accesses.append(node.indices)
        base: list[PrimExpr] = []
        region: list[int] = []
        for d, full in enumerate(st.shape):
            b, ext = self._dim_region([acc[d] for acc in accesses], inner, full)
            base.append(b)
            region.append(ext)
        return base, tuple(region)

    def _dim_region(self, indices: list[PrimExpr], inner: set[tir.LoopVar], full: int) -> tuple[PrimExpr, int]:
        whole = (tir.IntImm(0), full)
        if not indices:
            return whole
        parts: list[tuple[Lin, float, float]] = []
        for e in indices:
            lin = self._lin(e)
            outer = Lin({}, 0)
            inner_part = Lin({}, lin.const)
            for atom, c in lin.coeffs.items():
                vars_in = {atom} if isinstance(atom, tir.LoopVar) else analysis.uses_vars(atom)
                target = inner_part if vars_in & inner else outer
                target.coeffs[atom] = c
            lo, hi = self.ssimp.lin_interval(inner_part)
            parts.append((outer, lo, hi))
        ref = parts[0][0]
        lows: list[float] = []
        highs: list[float] = []
        for outer, lo, hi in parts:
            diff = outer.add(ref, -1)
            if not diff.is_const:
                return self._numeric_region(indices, full)
            lows.append(lo + diff.const)
            highs.append(hi + diff.const)
        lo, hi = min(lows), max(highs)
        if math.isinf(lo) or math.isinf(hi) or hi - lo + 1 >= full:
            return whole
        ext = int(hi - lo + 1)
        base = ref.add(Lin({}, int(lo)))
        if base.is_const:  # a fixed window: keep it inside the tensor
            start = max(0, base.const)
            stop = min(full - 1, base.const + ext - 1)
            return tir.IntImm(start), stop - start + 1
        return base.to_expr(), ext

    def _numeric_region(self, indices: list[PrimExpr], full: int) -> tuple[PrimExpr, int]:
        lo: float = math.inf
        hi: float = -math.inf
        for e in indices:
            a, b = analysis.bound(e, self.struct_ranges)
            lo, hi = min(lo, a), max(hi, b)
        lo, hi = max(lo, 0), min(hi, full - 1)
        if math.isinf(lo) or math.isinf(hi) or hi < lo:
            return tir.IntImm(0), full
        return tir.IntImm(int(lo)), int(hi - lo + 1)

    # ------------------------------------------------------------------ templates
    def _templates(self, ctx: _StageCtx) -> None:
        """Loop-nest expressions of the stage over structural loop variables."""

        def to_load(read: te.TensorRead) -> PrimExpr | None:
            producer = self.sch.stage_of_tensor(read.tensor)
            assert producer is not None
            if producer.op is None:
                return tir.Load(self.param_buffers[producer.name], read.indices, read.dtype)
            pctx = self.ctx[producer.name]
            idx = tuple(i - b if not (isinstance(b, tir.IntImm) and b.value == 0) else i
                        for i, b in zip(read.indices, pctx.base))
            return tir.Load(pctx.buffer, idx, read.dtype)

        body = rewrite_reads(ctx.abs_body, to_load)
        if isinstance(body, te.Reduce):
            acc = tir.Load(ctx.buffer, tuple(ctx.store_index))
            ctx.init = self.ssimp.simplify(body.init)
            ctx.update = self.ssimp.simplify(body.combine(acc, body.source))
        else:
            ctx.value = self.ssimp.simplify(body)

    # ------------------------------------------------------------------ emission
    def _emit_stage(self, ctx: _StageCtx, env: _Env) -> tir.Stmt | None:
        checked = self._check_guards(env, list(ctx.guards))
        if checked is _DEAD:
            return None
        conds, pending = checked  # type: ignore[misc]
        if ctx.reduce_start is None:
            body = self._emit_loops(ctx, ctx.loops, 0, env, pending, lambda e, _: self._store(ctx, e, ctx.value), True)
        else:
            p = ctx.reduce_start

            def at_reduction(e: _Env, pend: list[_Guard]) -> tir.Stmt | None:
                spatial_after = [lp for lp in ctx.loops[p:] if not lp.is_reduce]
                init_pending = [g for g in pend if not g.involves_reduce]
                init = self._emit_loops(
                    ctx, spatial_after, 0, e, init_pending, lambda e2, _: self._store(ctx, e2, ctx.init), False
                )
                update = self._emit_loops(
                    ctx, ctx.loops[p:], 0, e, pend, lambda e2, _: self._store(ctx, e2, ctx.update), True
                )
                parts = [s for s in (init, update) if s is not None]
                return tir.seq(*parts) if parts else None

            body = self._emit_loops(ctx, ctx.loops[:p], 0, env, pending, at_reduction, True)
        if body is None:
            return None
        return self._wrap_conds(conds, body)

    def _emit_loops(
        self,
        ctx: _StageCtx,
        loops: list[_LoopSpec],
        i: int,
        env: _Env,
        pending: list[_Guard],
        inner: Callable[[_Env, list[_Guard]], tir.Stmt | None],
        attach: bool,
    ) -> tir.Stmt | None:
        if i == len(loops):
            return inner(env, pending)
        versioned = self._version(ctx, loops, i, env, pending, inner, attach)
        if versioned is not None:
            return versioned[0]
        spec = loops[i]
        out: list[tir.Stmt] = []
        for start, stop in self._cut_at_selects(spec, env, self._partition(spec, env, pending), ctx.select_cuts):
            n = stop - start
            var: tir.LoopVar | None = None
            if n == 1 and spec.kind is not ForKind.THREAD_BINDING:
                value: PrimExpr = tir.IntImm(start)
            else:
                var = tir.LoopVar(spec.name)
                self.var_ranges[var] = (0, n - 1)
                value = var if start == 0 else var + start
            env2 = env.bind(spec.svar, value, (start, stop - 1))
            checked = self._check_guards(env2, pending)
            if checked is _DEAD:
                continue
            conds, rest = checked  # type: ignore[misc]
            pre: list[tir.Stmt] = []
            allocs: list[tir.Buffer] = []
            if attach and spec.name in ctx.attached:
                env2, pre, allocs = self._emit_attached(ctx.attached[spec.name], env2)
            body = self._emit_loops(ctx, loops, i + 1, env2, rest, inner, attach)
            if body is None:
                continue
            body = tir.seq(*pre, body)
            for buf in reversed(allocs):
                body = tir.Allocate(buf, body)
            body = self._wrap_conds(conds, body)
            if var is not None:
                body = tir.For(var, n, body, spec.kind, spec.thread_tag)
            out.append(body)
        return tir.seq(*out) if out else None

    def _emit_attached(
        self, children: list[_StageCtx], env: _Env
    ) -> tuple[_Env, list[tir.Stmt], list[tir.Buffer]]:
        pre: list[tir.Stmt] = []
        allocs: list[tir.Buffer] = []
        for child in children:
            buf = tir.Buffer(child.buffer.name, child.buffer.shape, child.buffer.dtype, child.buffer.scope)
            env = env.with_buffer(child.buffer, buf)
            allocs.append(buf)
            nest = self._emit_stage(child, env)
            if nest is None:
                continue
            if buf.scope is Scope.SHARED:
                # wait for readers of the previous fill, then for every thread's part of this fill
                pre += [tir.Barrier(), nest, tir.Barrier()]
            else:
                pre.append(nest)
        return env, pre, allocs

    def _version(
        self,
        ctx: _StageCtx,
        loops: list[_LoopSpec],
        i: int,
        env: _Env,
        pending: list[_Guard],
        inner: Callable[[_Env, list[_Guard]], tir.Stmt | None],
        attach: bool,
    ) -> tuple[tir.Stmt | None] | None:
        """`(if all-hold: nest without the guard else: nest with it,)` for the first pending guard whose
        offset the enclosing loops leave symbolic; None where no guard is versioned here."""
        if self.versions_left <= 0:
            return None
        for g in pending:
            cond = self._holds_throughout(g, loops[i:], env)
            if cond is None:
                continue
            self.versions_left -= 1
            fast = self._emit_loops(ctx, loops, i, env, [p for p in pending if p is not g], inner, attach)
            slow = self._emit_loops(ctx, loops, i, env.guarded_copy(g), pending, inner, attach)
            if fast is None or slow is None:
                return (fast if slow is None else slow,)
            return (tir.IfThenElse(cond, fast, slow),)
        return None

    def _holds_throughout(self, g: _Guard, loops: list[_LoopSpec], env: _Env) -> PrimExpr | None:
        """The condition that guard `g` holds at every iteration of `loops`, where the enclosing loops
        bind its offset through an opaque atom (`f // 7` of a fused loop), so partitioning cannot split
        it off and the guard would be tested at every iteration; None for any other guard."""
        if id(g) in env.versioned or not g.nested:
            return None
        inner = {lp.svar: lp for lp in loops}
        corner = Lin({}, g.lin.const, g.lin.dtype)
        for atom, c in g.lin.coeffs.items():
            if isinstance(atom, tir.LoopVar) and atom in inner:
                lo, hi = self.struct_ranges[atom]
                corner.const += c * (hi if c > 0 else lo)
            elif analysis.uses_vars(atom) <= env.vmap.keys():
                corner.coeffs[atom] = c
            else:
                return None
        lo, hi = self._lin_interval(corner, env)
        if not lo <= 0 < hi:  # always holds (no test needed) or holds nowhere at the corner (no fast copy)
            return None
        cond = self.esimp.simplify(tir.BinaryOp("lt", corner.to_expr(), tir.IntImm(1)), env.vmap)
        return None if isinstance(cond, tir.IntImm) else cond

    def _partition(self, spec: _LoopSpec, env: _Env, pending: list[_Guard]) -> list[tuple[int, int]]:
        """Ranges of the loop to emit separately: a main part where the affine guards on this loop
        provably hold, then the part where they may hold. Beyond that they never hold."""
        ext = spec.extent
        if spec.kind is ForKind.THREAD_BINDING:
            return [(0, ext)]
        main, possible = ext, ext
        for g in pending:
            c = g.lin.coeffs.get(spec.svar, 0)
            if c <= 0 or spec.svar in g.nested:
                continue
            others = Lin({a: k for a, k in g.lin.coeffs.items() if a is not spec.svar}, g.lin.const)
            lo, hi = self._lin_interval(others, env)
            if math.isinf(lo) or math.isinf(hi):
                continue
            possible = min(possible, max(0, int(-lo) // c + 1))
            # Split off a guard-free main part only when the enclosing loops fix the guard's offset
            # (a constant tail position); with a symbolic offset (e.g. a fused outer loop) the main
            # part would have an arbitrary length, so keep the test instead.
            outer = Lin({a: k for a, k in others.coeffs.items() if analysis.uses_vars(a) <= env.vmap.keys()}, 0)
            olo, ohi = self._lin_interval(outer, env)
            if olo == ohi:
                main = min(main, max(0, int(-hi) // c + 1))
        main = min(main, possible)
        if possible <= 0:
            return []
        if main in (0, possible) or self.peels_left <= 0:
            return [(0, possible)]
        self.peels_left -= 1
        return [(0, main), (main, possible)]

    def _cut_at_selects(self, spec: _LoopSpec, env: _Env, ranges: list[tuple[int, int]],
                        cuts: list[tuple[Lin, int]]) -> list[tuple[int, int]]:
        """`ranges` cut further where a `Select` condition of the stage flips along this loop, the enclosing
        loops fixing the rest of it (a concatenation's inputs along its axis): each part then takes one branch,
        which the simplifier decides from the part's range."""
        if not cuts or spec.kind is ForKind.THREAD_BINDING:
            return ranges
        points: set[int] = set()
        for lin, threshold in cuts:
            c = lin.coeffs.get(spec.svar, 0)
            if not c:
                continue
            lo, hi = self._lin_interval(Lin({a: k for a, k in lin.coeffs.items() if a is not spec.svar}, lin.const),
                                        env)
            if lo != hi or math.isinf(lo):
                continue  # the rest of the condition varies inside this loop: no single cut
            bound = threshold - int(lo)  # the condition is c * v <= bound
            # the part where it holds ends (c > 0: v <= bound / c) or starts (c < 0: v >= bound / c) here
            points.add(bound // c + 1 if c > 0 else -(-bound // c))
        if not points:
            return ranges
        cut: list[tuple[int, int]] = []
        for start, stop in ranges:
            inner = sorted(p for p in points if start < p < stop)
            if len(inner) > self.peels_left:
                cut.append((start, stop))
                continue
            self.peels_left -= len(inner)
            edges = [start, *inner, stop]
            cut += list(itertools.pairwise(edges))
        return cut

    def _lin_interval(self, lin: Lin, env: _Env) -> Interval:
        ranges = ChainMap(env.ivals, self.struct_ranges)  # type: ignore[arg-type]

        def atom_interval(atom: PrimExpr) -> Interval:
            if isinstance(atom, tir.LoopVar):
                return ranges.get(atom, analysis.UNBOUNDED)
            return analysis.bound(atom, ranges)

        return lin.interval(atom_interval)

    def _check_guards(self, env: _Env, pending: list[_Guard]) -> object:
        """`_DEAD` when a guard can never hold here; else (conditions to test now, guards still open)."""
        conds: list[PrimExpr] = []
        rest: list[_Guard] = []
        for g in pending:
            lo, hi = self._lin_interval(g.lin, env)
            if hi <= 0:
                continue
            if lo > 0:
                return _DEAD
            if all(v in env.vmap for v in g.stage_vars):
                cond = self.esimp.simplify(tir.BinaryOp("lt", g.expr, tir.IntImm(1)), env.vmap)
                if isinstance(cond, tir.IntImm):
                    if cond.value:
                        continue
                    return _DEAD
                conds.append(cond)
            else:
                rest.append(g)
        return conds, rest

    @staticmethod
    def _wrap_conds(conds: list[PrimExpr], body: tir.Stmt) -> tir.Stmt:
        if not conds:
            return body
        cond = conds[0]
        for c in conds[1:]:
            cond = tir.BinaryOp("and", cond, c)
        return tir.IfThenElse(cond, body)

    def _store(self, ctx: _StageCtx, env: _Env, value: PrimExpr | None) -> tir.Stmt:
        assert value is not None
        buffer = env.bmap.get(ctx.buffer, ctx.buffer)
        indices = tuple(self.esimp.simplify(i, env.vmap) for i in ctx.store_index)
        emitted = self.esimp.simplify(value, env.vmap, env.bmap)
        return tir.Store(buffer, indices, self._protect_speculative_loads(emitted))

    def _protect_speculative_loads(self, expr: PrimExpr) -> PrimExpr:
        """Clamp the indices of loads in `Select` branches that are not provably in bounds."""
        speculative: set[int] = set()
        stack: list[tuple[PrimExpr, bool]] = [(expr, False)]
        visited: set[tuple[int, bool]] = set()
        while stack:
            node, in_branch = stack.pop()
            if (id(node), in_branch) in visited:
                continue
            visited.add((id(node), in_branch))
            if isinstance(node, tir.Select):
                stack += [(node.cond, in_branch), (node.true_value, True), (node.false_value, True)]
                continue
            if in_branch and isinstance(node, tir.Load):
                speculative.add(id(node))
            stack += [(c, in_branch) for c in te.expr_children(node)]
        if not speculative:
            return expr

        def visit(node: PrimExpr, kids: list[PrimExpr]) -> PrimExpr:
            new = analysis.with_children(node, kids)
            if id(node) not in speculative or not isinstance(new, tir.Load):
                return new
            clamped: list[PrimExpr] = []
            for idx, dim in zip(new.indices, new.buffer.shape):
                lo, hi = analysis.bound(idx, self.var_ranges)
                if lo < 0:
                    idx = tir.maximum(idx, 0)
                if hi > dim - 1:
                    idx = tir.minimum(idx, dim - 1)
                clamped.append(idx)
            return tir.Load(new.buffer, tuple(clamped), new.dtype)

        return analysis.fold(expr, visit)

    @staticmethod
    def _check_parallel_nesting(body: tir.Stmt) -> None:
        stack: list[tuple[tir.Stmt, bool]] = [(body, False)]
        while stack:
            s, in_parallel = stack.pop()
            if isinstance(s, tir.For):
                if s.kind is ForKind.PARALLEL:
                    if in_parallel:
                        raise ScheduleError(
                            f"parallel loop {s.var.name!r} is nested inside another parallel loop; parallelise one "
                            f"loop level per nest"
                        )
                    in_parallel = True
                stack.append((s.body, in_parallel))
            elif isinstance(s, tir.Allocate):
                stack.append((s.body, in_parallel))
            elif isinstance(s, tir.Seq):
                stack += [(x, in_parallel) for x in s.stmts]
            elif isinstance(s, tir.IfThenElse):
                stack.append((s.then_body, in_parallel))
                if s.else_body is not None:
                    stack.append((s.else_body, in_parallel))


__all__ = ["LOCAL_LIMIT_BYTES", "PEEL_BUDGET", "lower", "lower_te"]
