"""Fixed kernels: operators whose whole loop nest is written here rather than scheduled from tensor expressions,
because their loops carry a dependence from one iteration to the next that tensor expressions cannot state.

    call = fixed_kernel_call(func)          # the fused function's one call of such an operator, else None
    prim_func = fixed_kernel(func, target, "k3_lstm")                   # an LSTM's default schedule
    prim_func = fixed_kernel(func, target, "k3_lstm", LstmSchedule(32, 4, parallel=True))

`nn.lstm_sequence` (`relay_tune.op.recurrent`) is one: its kernel runs the directions of an LSTM layer in
parallel (one core each, where the target has them and the layer is worth a parallel region) and, within a
direction, every step in turn: the recurrent matrix-vector product from the packed weight panels (each panel's
accumulators in registers while the panel streams front to back), then the gates. The states stay in per-thread
scratch between steps, so a layer of `seq` steps is one kernel call and at most one parallel region instead of
`seq` calls of two or more kernels, each with its own region.

`nn.lstm_sequence_int8` is its twin with int8 recurrent weights (onnxruntime's DynamicQuantizeLSTM): the same
loop, each step's product on the state quantized to uint8 (`lstm_sequence_int8_kernel`).

`min_max` (`relay_tune.op.reduce`) is another: the range of a tensor, both ends in one pass. A reduction of every
element to one value has no output axis to vectorize or parallelize along, so its scheduled form is one scalar
dependence chain per end, and `min` and `max` are two passes over the tensor; this kernel keeps `MIN_MAX_VECTORS`
vector accumulators per end (independent chains: vector min/max take a few cycles each) and folds them at the end.
It runs on one core: a parallel region costs a few microseconds on an idle host and up to a scheduler time slice
on a busy one, about the time this kernel takes for a tensor of a megabyte.

The LSTM kernels take an `LstmSchedule` (block width of the recurrent product, reduction unroll, directions in
parallel, in turn or interleaved on one core); its space and default rule are the `lstm` family
(`search_space.families.lstm`), so they are tuned like other tasks. `min_max` has no schedule space: the tuner
passes over its task (`compile.task_list.ModelTasks.kernels`). The build lowers them all here. Its parameters are
the operator's arguments in order (`fixed_kernel_inputs`: the fused function's parameter behind each), then its
output. """

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from relay_tune.errors import CompileError
from relay_tune.ir import Call, Expr, Function, Op, TensorType, Var
from relay_tune.kernel import te, tir
from relay_tune.op.recurrent import LSTM_SEQUENCE, LSTM_SEQUENCE_INT8
from relay_tune.op.reduce import MIN_MAX
from relay_tune.target import Target

__all__ = ["FIXED_KERNELS", "MIN_MAX_VECTORS", "PARALLEL_MIN_MACS", "SCHEDULED_KERNELS", "LstmSchedule",
           "default_lstm_schedule", "fixed_kernel", "fixed_kernel_call", "fixed_kernel_inputs",
           "lstm_sequence_int8_kernel", "lstm_sequence_kernel", "min_max_kernel", "parallel_worthwhile"]

PARALLEL_MIN_MACS = 1 << 18
"""Multiply-accumulates per direction (all steps) below which the directions run in turn on one core: a parallel
region costs a few microseconds on an idle host and up to a scheduler time slice on a busy one, more than a small
layer's whole work."""

MIN_MAX_VECTORS = 4
"""Vector accumulators per end of `min_max`: enough independent chains to cover a vector min/max's latency."""

K_UNROLL = 4
"""Reduction steps of the recurrent product per loop iteration (fewer branches; the panel loads stay in order)."""


def _shape(value: Expr) -> tuple[int, ...]:
    """The static shape of a typed argument (the type relation has checked that it is static)."""
    ty = value.checked_type
    assert isinstance(ty, TensorType)
    return tuple(d for d in ty.shape if isinstance(d, int))


@dataclass(frozen=True)
class LstmSchedule:
    """How an LSTM kernel runs its steps (a point of the `lstm` family's space, `search_space.families.lstm`).

    width: accumulator columns of one block of the recurrent product, in registers while the block's weights
    stream front to back: a divisor of the panel width (the block reads a slice of each panel row) or a multiple
    of it (several panels side by side, more independent accumulator chains). k_unroll: reduction steps per loop
    iteration (a remainder loop takes what it does not divide). parallel: the directions on separate cores.
    interleave: with the directions on one core, both advance a step at a time in one loop (two independent
    dependence chains, the weights of both directions streamed in turn) instead of one direction after the other.
    """

    width: int
    k_unroll: int
    parallel: bool
    interleave: bool = False

    def check(self, call: Call) -> None:
        """Raises CompileError where this schedule does not fit `call`'s shapes."""
        directions, panel, columns = _panel_shape(call)
        if self.width < 1 or self.k_unroll < 1:
            raise CompileError(f"LSTM schedule {self}: width and k_unroll must be positive")
        if not (panel % self.width == 0 or (self.width % panel == 0 and columns % self.width == 0)):
            raise CompileError(f"LSTM schedule {self}: width {self.width} neither divides the panel ({panel}) nor "
                               f"is a multiple of it dividing the {columns} columns")
        if self.interleave and (self.parallel or directions < 2):
            raise CompileError(f"LSTM schedule {self}: only two directions on one core interleave")


def _panel_shape(call: Call) -> tuple[int, int, int]:
    """Directions, panel width and padded columns of an LSTM call's packed recurrent weights."""
    weights = _shape(call.args[1])
    directions, panels, panel = weights[0], weights[1], weights[3]
    return directions, panel, panels * panel


def parallel_worthwhile(call: Call, target: Target) -> bool:
    """Whether the directions of an LSTM call may run on separate cores: two of them, a target with several cores,
    and at least `PARALLEL_MIN_MACS` multiply-accumulates per direction."""
    seq, batch, directions, gates = _shape(call.args[0])
    return directions > 1 and target.num_cores > 1 and seq * batch * gates * (gates // 4) >= PARALLEL_MIN_MACS


def default_lstm_schedule(call: Call, target: Target) -> LstmSchedule:
    """The untuned schedule: one panel per block, the reduction unrolled by `K_UNROLL` where that divides it, the
    directions in parallel where `parallel_worthwhile`, in turn otherwise."""
    _, panel, _ = _panel_shape(call)
    depth = _shape(call.args[1])[2]
    return LstmSchedule(panel, K_UNROLL if depth % K_UNROLL == 0 else 1, parallel_worthwhile(call, target))


def _lstm_gates(xp: tir.Buffer, g: tir.Buffer, h: tir.Buffer, c: tir.Buffer, out: tir.Buffer, t: tir.PrimExpr,
                d: tir.PrimExpr, slot: tir.PrimExpr, batch: int, hidden: int) -> tir.Stmt:
    """One step's gates from the input projection `xp[t]` and the recurrent products `g[slot]`: the new states
    into the scratch `h[slot]`, `c[slot]` and into `out[t, d]`."""
    b2, j = tir.LoopVar("b2"), tir.LoopVar("j")

    def pre(gate: int) -> tir.PrimExpr:
        return xp[t, b2, d, gate * hidden + j] + g[slot, b2, gate * hidden + j]

    def sigmoid(x: tir.PrimExpr) -> tir.PrimExpr:
        return tir.Call("sigmoid", (x,), "float32")

    def tanh(x: tir.PrimExpr) -> tir.PrimExpr:
        return tir.Call("tanh", (x,), "float32")

    # gates i, o, f, c in ONNX order; the new cell state is written first and read back for the hidden state
    cell = out[t, d, b2, hidden + j]
    return tir.For(b2, batch, tir.For(j, hidden, tir.seq(
        tir.Store(out, (t, d, b2, hidden + j), sigmoid(pre(2)) * c[slot, b2, j] + sigmoid(pre(0)) * tanh(pre(3))),
        tir.Store(c, (slot, b2, j), cell),
        tir.Store(h, (slot, b2, j), sigmoid(pre(1)) * tanh(cell)),
        tir.Store(out, (t, d, b2, j), h[slot, b2, j])), tir.ForKind.VECTORIZED))


Product = Callable[[tir.PrimExpr, tir.PrimExpr, tir.Buffer, tir.Buffer], tir.Stmt]
"""`product(d, slot, h, g)`: one step's recurrent products of direction `d`'s state `h[slot]` into `g[slot]`."""


def _lstm_layer(call: Call, target: Target, name: str, params: tuple[tir.Buffer, ...], product: Product,
                scratch: tuple[tir.Buffer, ...], prologue: tir.Stmt | None, columns: int,
                schedule: LstmSchedule) -> tir.PrimFunc:
    """The loop nest shared by the LSTM kernels: per direction `d` the states from `h0`, `c0`, then per step
    `product(d, slot, h, g)` (the recurrent products of the state `h[slot]` into `g[slot] (batch, columns)`) and
    the gates; the directions in parallel, in turn, or interleaved step by step (`schedule`). `params` are the
    kernel's parameters, `xp` first and `h0`, `c0`, `out` last; `scratch` the product's own buffers, `prologue`
    what it does once before the steps."""
    seq, batch, directions, gates = _shape(call.args[0])
    hidden = gates // 4
    reverse = [int(bool(r)) for r in call.attrs["reverse"]]
    xp, h0, c0, out = params[0], params[-3], params[-2], params[-1]
    interleave = schedule.interleave and directions > 1 and not schedule.parallel
    slots = directions if interleave else 1
    # the states and the step's recurrent products: one slot per direction that is live at the same time
    h = tir.Buffer("h", (slots, batch, hidden), scope=tir.Scope.LOCAL)
    c = tir.Buffer("c", (slots, batch, hidden), scope=tir.Scope.LOCAL)
    g = tir.Buffer("g", (slots, batch, columns), scope=tir.Scope.LOCAL)

    d, s = tir.LoopVar("d"), tir.LoopVar("s")
    slot: tir.PrimExpr = d if interleave else tir.as_expr(0)
    # the input step of iteration s: s for a forward direction, seq - 1 - s for a reverse one
    backwards: tir.PrimExpr = tir.as_expr(reverse[0])
    if directions == 2 and reverse[0] != reverse[1]:
        backwards = backwards + d * (reverse[1] - reverse[0])
    t = s + backwards * (seq - 1 - s * 2)

    b0, j0 = tir.LoopVar("b0"), tir.LoopVar("j0")
    init: tir.Stmt = tir.For(b0, batch, tir.For(j0, hidden, tir.seq(
        tir.Store(h, (slot, b0, j0), h0[d, b0, j0]), tir.Store(c, (slot, b0, j0), c0[d, b0, j0])),
        tir.ForKind.VECTORIZED))
    step = tir.seq(product(d, slot, h, g), _lstm_gates(xp, g, h, c, out, t, d, slot, batch, hidden))
    body: tir.Stmt
    if interleave:
        body = tir.seq(tir.For(d, directions, init), tir.For(s, seq, tir.For(d, directions, step)))
    else:
        body = tir.seq(init, tir.For(s, seq, step))
    if prologue is not None:
        body = tir.seq(prologue, body)
    for buffer in (*scratch, g, c, h):
        body = tir.Allocate(buffer, body)
    if interleave:
        return tir.PrimFunc(name, params, body)
    parallel = schedule.parallel and directions > 1 and target.num_cores > 1
    kind = tir.ForKind.PARALLEL if parallel else tir.ForKind.SERIAL
    return tir.PrimFunc(name, params, tir.For(d, directions, body, kind))


def _panel_products(acc: tir.Buffer, panel: int, columns: int, batch: int, depth: int, k_unroll: int,
                    zero: tir.PrimExpr,
                    term: Callable[[tir.PrimExpr, tir.PrimExpr, tir.PrimExpr, tir.PrimExpr], tir.PrimExpr],
                    result: Callable[[tir.PrimExpr, tir.PrimExpr, tir.PrimExpr], tir.Stmt]) -> tir.Stmt:
    """One step's recurrent products, a block of `width = acc.shape[0]` columns at a time: per block `q` and batch
    row `b`, the block's accumulators `acc` (vectorized) start at `zero`, sum `term(p, b, k, j)` (panel `p`,
    column `j` of that panel) over `k < depth` (`k_unroll` steps per iteration, a remainder loop after), and
    `result(b, i, column)` stores accumulator `i` as column `q * width + i`. A block narrower than a panel reads
    a slice of each panel row; a wider one reads `width / panel` panels side by side."""
    width = acc.shape[0]
    sub = min(width, panel)
    groups, per = width // sub, panel // sub
    q, b, j1, jo, ji, j3 = (tir.LoopVar(n) for n in ("q", "b1", "j1", "jo", "ji", "j3"))
    ko, ku, kt = tir.LoopVar("ko"), tir.LoopVar("ku"), tir.LoopVar("kt")
    vectorized = tir.ForKind.VECTORIZED
    if groups > 1:  # whole panels side by side
        p: tir.PrimExpr = q * groups + jo
        offset: tir.PrimExpr = tir.as_expr(0)
    elif per > 1:  # a slice of one panel
        p, offset = q // per, (q % per) * sub
    else:
        p, offset = q, tir.as_expr(0)

    def update(k: tir.PrimExpr) -> tir.Stmt:
        inner = tir.For(ji, sub, tir.Store(acc, (jo * sub + ji,), acc[jo * sub + ji] + term(p, b, k, offset + ji)),
                        vectorized)
        return tir.For(jo, groups, inner, tir.ForKind.UNROLLED if groups > 1 else tir.ForKind.SERIAL)

    unroll = max(1, min(k_unroll, depth))
    main, tail = divmod(depth, unroll)
    stmts: list[tir.Stmt] = [tir.For(j1, width, tir.Store(acc, (j1,), zero), vectorized)]
    if main:
        stmts.append(tir.For(ko, main, tir.For(ku, unroll, update(ko * unroll + ku),
                                               tir.ForKind.UNROLLED if unroll > 1 else tir.ForKind.SERIAL)))
    if tail:
        stmts.append(tir.For(kt, tail, update(main * unroll + kt)))
    stmts.append(tir.For(j3, width, result(b, j3, q * width + j3), vectorized))
    return tir.For(q, columns // width, tir.For(b, batch, tir.seq(*stmts)))


def lstm_sequence_kernel(call: Call, target: Target, name: str, schedule: LstmSchedule | None = None
                         ) -> tir.PrimFunc:
    """The loop nest of one `nn.lstm_sequence` call (see the module docstring) under `schedule` (None: the
    default); parameters xp, rp, h0, c0, out."""
    schedule = schedule or default_lstm_schedule(call, target)
    schedule.check(call)
    seq, batch, directions, gates = _shape(call.args[0])
    _, panels, hidden, panel = _shape(call.args[1])
    params = (tir.Buffer("xp", (seq, batch, directions, gates)), tir.Buffer("rp", (directions, panels, hidden, panel)),
              tir.Buffer("h0", (directions, batch, hidden)), tir.Buffer("c0", (directions, batch, hidden)),
              tir.Buffer("out", (seq, directions, batch, 2 * hidden)))
    rp = params[1]
    acc = tir.Buffer("acc", (schedule.width,), scope=tir.Scope.LOCAL)  # one block's accumulators

    def product(d: tir.PrimExpr, slot: tir.PrimExpr, h: tir.Buffer, g: tir.Buffer) -> tir.Stmt:
        return _panel_products(acc, panel, panels * panel, batch, hidden, schedule.k_unroll, tir.FloatImm(0.0),
                               lambda p, b, k, j: h[slot, b, k] * rp[d, p, k, j],
                               lambda b, j, column: tir.Store(g, (slot, b, column), acc[j]))

    return _lstm_layer(call, target, name, params, product, (acc,), None, panels * panel, schedule)


def lstm_sequence_int8_kernel(call: Call, target: Target, name: str, schedule: LstmSchedule | None = None
                              ) -> tir.PrimFunc:
    """The loop nest of one `nn.lstm_sequence_int8` call (see `relay_tune.op.recurrent`) under `schedule` (None:
    the default); parameters xp, rq, rscale, rsum, h0, c0, out.

    Each step first quantizes the state `h` to uint8 (its range in one scalar pass: a few hundred elements, next
    to a product of `4H` times as many), then streams the int8 weight panels with two-term dot products into int32
    accumulators (`tir.DOT2_INTRINSIC`: a pair of state values broadcast, each panel row's int8 pairs sign-extended
    on load, one vpmaddwd per register of lanes on x86) and scales each column's exact sum back to float32.
    vpmaddwd multiplies int16, so full-range int8 weights need no care: the four-byte vpmaddubsw would saturate on
    them (and, split into halves that do not, take two multiply sequences per weight register, twice vpmaddwd's
    multiply-port work on CPUs without VNNI)."""
    schedule = schedule or default_lstm_schedule(call, target)
    schedule.check(call)
    seq, batch, directions, gates = _shape(call.args[0])
    _, panels, pairs, panel, _ = _shape(call.args[1])
    hidden, columns = gates // 4, panels * panel
    params = (tir.Buffer("xp", (seq, batch, directions, gates)),
              tir.Buffer("rq", (directions, panels, pairs, panel, 2), "int8"),
              tir.Buffer("rscale", (directions, columns)), tir.Buffer("rsum", (directions, columns), "int32"),
              tir.Buffer("h0", (directions, batch, hidden)), tir.Buffer("c0", (directions, batch, hidden)),
              tir.Buffer("out", (seq, directions, batch, 2 * hidden)))
    rq, rscale, rsum = params[1:4]
    acc = tir.Buffer("acc", (schedule.width,), "int32", scope=tir.Scope.LOCAL)  # one block's accumulators
    # the quantized state; a row past an odd hidden size meets zero weights
    qh = tir.Buffer("qh", (batch, 2 * pairs), "uint8", scope=tir.Scope.LOCAL)
    ends = tir.Buffer("ends", (2,), scope=tir.Scope.LOCAL)  # the state's range, 0 included
    quant = tir.Buffer("quant", (2,), scope=tir.Scope.LOCAL)  # its scale and zero point
    vectorized = tir.ForKind.VECTORIZED

    # the padding row is cleared once so that it holds a value
    bz, jz = tir.LoopVar("bz"), tir.LoopVar("jz")
    clear = tir.For(bz, batch, tir.For(jz, 2 * pairs, tir.Store(qh, (bz, jz), tir.IntImm(0, "uint8")), vectorized))

    def quantize(slot: tir.PrimExpr, h: tir.Buffer) -> tir.Stmt:
        bm, jm, bq, jq = (tir.LoopVar(n) for n in ("bm", "jm", "bq", "jq"))
        zero, top = tir.FloatImm(0.0), tir.FloatImm(255.0)
        span = ends[1] - ends[0]
        scale, zero_point = quant[0], quant[1]
        level = tir.minimum(tir.maximum(tir.Call("round", (h[slot, bq, jq] / scale,), "float32") + zero_point, zero),
                            top)
        return tir.seq(
            tir.Store(ends, (0,), zero), tir.Store(ends, (1,), zero),
            tir.For(bm, batch, tir.For(jm, hidden, tir.seq(
                tir.Store(ends, (0,), tir.minimum(ends[0], h[slot, bm, jm])),
                tir.Store(ends, (1,), tir.maximum(ends[1], h[slot, bm, jm]))))),
            # onnxruntime's parameters: scale 1 for an empty range, the zero point the rounded image of 0
            tir.Store(quant, (0,), tir.Select(tir.binary("eq", span, zero), tir.FloatImm(1.0), span / top)),
            tir.Store(quant, (1,), tir.Call("round", (tir.minimum(tir.maximum(-ends[0] / quant[0], zero), top),),
                                            "float32")),
            tir.For(bq, batch, tir.For(jq, hidden, tir.Store(qh, (bq, jq), tir.Cast("uint8", level)), vectorized)))

    def product(d: tir.PrimExpr, slot: tir.PrimExpr, h: tir.Buffer, g: tir.Buffer) -> tir.Stmt:
        def term(p: tir.PrimExpr, b: tir.PrimExpr, k: tir.PrimExpr, j: tir.PrimExpr) -> tir.PrimExpr:
            return te.dot2_u8s16_i32([qh[b, k * 2], qh[b, k * 2 + 1]], [rq[d, p, k, j, 0], rq[d, p, k, j, 1]])

        def scaled(b: tir.PrimExpr, j: tir.PrimExpr, column: tir.PrimExpr) -> tir.Stmt:
            exact = tir.Cast("float32", acc[j] - tir.Cast("int32", quant[1]) * rsum[d, column])
            return tir.Store(g, (slot, b, column), exact * (quant[0] * rscale[d, column]))

        return tir.seq(quantize(slot, h), _panel_products(acc, panel, columns, batch, pairs, schedule.k_unroll,
                                                          tir.IntImm(0, "int32"), term, scaled))

    return _lstm_layer(call, target, name, params, product, (acc, qh, ends, quant), clear, columns, schedule)


def min_max_kernel(call: Call, target: Target, name: str) -> tir.PrimFunc:
    """The loop nest of one `min_max` call (see the module docstring); parameters x (flat), out `[min, max]`."""
    n = math.prod(_shape(call.args[0]))
    width = target.vector_lanes("float32") * MIN_MAX_VECTORS
    rows, tail = divmod(n, width)
    x = tir.Buffer("x", (n,))
    out = tir.Buffer("out", (2,))
    low = tir.Buffer("low", (width,), scope=tir.Scope.LOCAL)
    high = tir.Buffer("high", (width,), scope=tir.Scope.LOCAL)
    vectorized = tir.ForKind.VECTORIZED
    i, r, j, t, k = (tir.LoopVar(v) for v in ("i", "r", "j", "t", "k"))

    def update(lane: tir.PrimExpr, value: tir.PrimExpr) -> tir.Stmt:
        return tir.seq(tir.Store(low, (lane,), tir.minimum(low[lane], value)),
                       tir.Store(high, (lane,), tir.maximum(high[lane], value)))

    # every lane starts from the first element, so lanes that see no element (n < width) leave the result alone
    first = x[0]
    stmts: list[tir.Stmt] = [tir.For(i, width, tir.seq(tir.Store(low, (i,), first), tir.Store(high, (i,), first)),
                                     vectorized)]
    if rows:
        stmts.append(tir.For(r, rows, tir.For(j, width, update(j, x[r * width + j]), vectorized)))
    if tail:
        stmts.append(tir.For(t, tail, update(t, x[rows * width + t])))
    stmts.append(tir.Store(out, (0,), low[0]))
    stmts.append(tir.Store(out, (1,), high[0]))
    stmts.append(tir.For(k, width, tir.seq(tir.Store(out, (0,), tir.minimum(out[0], low[k])),
                                           tir.Store(out, (1,), tir.maximum(out[1], high[k])))))
    body: tir.Stmt = tir.seq(*stmts)
    for scratch in (low, high):
        body = tir.Allocate(scratch, body)
    return tir.PrimFunc(name, (x, out), body)


FIXED_KERNELS: dict[str, Callable[[Call, Target, str], tir.PrimFunc]] = {
    LSTM_SEQUENCE: lstm_sequence_kernel, LSTM_SEQUENCE_INT8: lstm_sequence_int8_kernel, MIN_MAX: min_max_kernel}
"""Per operator with a fixed kernel, the function that writes its loop nest."""

SCHEDULED_KERNELS: dict[str, Callable[[Call, Target, str, LstmSchedule | None], tir.PrimFunc]] = {
    LSTM_SEQUENCE: lstm_sequence_kernel, LSTM_SEQUENCE_INT8: lstm_sequence_int8_kernel}
"""The fixed kernels with a schedule space (`LstmSchedule`, the `lstm` family of `search_space.families`)."""


def fixed_kernel_call(func: Function) -> Call | None:
    """The call of `func` when `func` (a fused function) is one call of an operator with a fixed kernel whose
    arguments are all parameters of the function (in any order, one parameter may feed several); else None."""
    body = func.body
    if not (isinstance(body, Call) and isinstance(body.op, Op) and body.op.name in FIXED_KERNELS):
        return None
    if not all(isinstance(a, Var) and any(a is p for p in func.params) for a in body.args):
        return None
    return body


def fixed_kernel_inputs(func: Function) -> tuple[int, ...]:
    """Per kernel parameter before the output (the call's arguments), the function parameter that feeds it."""
    call = fixed_kernel_call(func)
    if call is None:
        raise CompileError("the fused function is not one call of an operator with a fixed kernel")
    return tuple(next(i for i, p in enumerate(func.params) if p is a) for a in call.args)


def fixed_kernel(func: Function, target: Target, name: str, schedule: LstmSchedule | None = None) -> tir.PrimFunc:
    """The loop nest of a fused function that `fixed_kernel_call` accepts, under `schedule` (an LSTM's; None: the
    kernel's default)."""
    call = fixed_kernel_call(func)
    if call is None:
        raise CompileError("the fused function is not one call of an operator with a fixed kernel")
    assert isinstance(call.op, Op)
    if schedule is None:
        return FIXED_KERNELS[call.op.name](call, target, name)
    if call.op.name not in SCHEDULED_KERNELS:
        raise CompileError(f"the fixed kernel of {call.op.name} takes no schedule")
    return SCHEDULED_KERNELS[call.op.name](call, target, name, schedule)
