"""Fixed kernels: operators whose whole loop nest is written here rather than scheduled from tensor expressions,
because their loops carry a dependence from one iteration to the next that tensor expressions cannot state.

    call = fixed_kernel_call(func)          # the fused function's one call of such an operator, else None
    prim_func = fixed_kernel(func, target, "k3_lstm")

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

A fixed kernel has no schedule space: the tuner passes over its task (`compile.task_list.ModelTasks.kernels`) and
the build lowers it here. Its parameters are the operator's arguments in order (`fixed_kernel_inputs`: the
fused function's parameter behind each), then its output.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from relay_tune.errors import CompileError
from relay_tune.ir import Call, Expr, Function, Op, TensorType, Var
from relay_tune.kernel import te, tir
from relay_tune.op.recurrent import LSTM_SEQUENCE, LSTM_SEQUENCE_INT8
from relay_tune.op.reduce import MIN_MAX
from relay_tune.target import Target

__all__ = ["FIXED_KERNELS", "MIN_MAX_VECTORS", "PARALLEL_MIN_MACS", "fixed_kernel", "fixed_kernel_call",
           "fixed_kernel_inputs", "lstm_sequence_int8_kernel", "lstm_sequence_kernel",
           "min_max_kernel"]

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


def _lstm_gates(xp: tir.Buffer, g: tir.Buffer, h: tir.Buffer, c: tir.Buffer, out: tir.Buffer, t: tir.PrimExpr,
                d: tir.PrimExpr, batch: int, hidden: int) -> tir.Stmt:
    """One step's gates from the input projection `xp[t]` and the recurrent products `g`: the new states into the
    scratch `h`, `c` and into `out[t, d]`."""
    b2, j = tir.LoopVar("b2"), tir.LoopVar("j")

    def pre(gate: int) -> tir.PrimExpr:
        return xp[t, b2, d, gate * hidden + j] + g[b2, gate * hidden + j]

    def sigmoid(x: tir.PrimExpr) -> tir.PrimExpr:
        return tir.Call("sigmoid", (x,), "float32")

    def tanh(x: tir.PrimExpr) -> tir.PrimExpr:
        return tir.Call("tanh", (x,), "float32")

    # gates i, o, f, c in ONNX order; the new cell state is written first and read back for the hidden state
    cell = out[t, d, b2, hidden + j]
    return tir.For(b2, batch, tir.For(j, hidden, tir.seq(
        tir.Store(out, (t, d, b2, hidden + j), sigmoid(pre(2)) * c[b2, j] + sigmoid(pre(0)) * tanh(pre(3))),
        tir.Store(c, (b2, j), cell),
        tir.Store(h, (b2, j), sigmoid(pre(1)) * tanh(cell)),
        tir.Store(out, (t, d, b2, j), h[b2, j])), tir.ForKind.VECTORIZED))


def _lstm_layer(call: Call, target: Target, name: str, params: tuple[tir.Buffer, ...],
                product: Callable[[tir.PrimExpr, tir.Buffer, tir.Buffer], tir.Stmt],
                scratch: tuple[tir.Buffer, ...], prologue: tir.Stmt | None, columns: int) -> tir.PrimFunc:
    """The loop nest shared by the LSTM kernels: per direction `d` (in parallel where it pays), the states from
    `h0`, `c0`, then per step `product(d, h, g)` (the recurrent products of the state `h` into `g (batch,
    columns)`) and the gates. `params` are the kernel's parameters, `xp` first and `h0`, `c0`, `out` last;
    `scratch` the product's own per-direction buffers, `prologue` what it does once per direction."""
    seq, batch, directions, gates = _shape(call.args[0])
    hidden = gates // 4
    reverse = [int(bool(r)) for r in call.attrs["reverse"]]
    xp, h0, c0, out = params[0], params[-3], params[-2], params[-1]
    # per-direction scratch: states, the step's recurrent products
    h = tir.Buffer("h", (batch, hidden), scope=tir.Scope.LOCAL)
    c = tir.Buffer("c", (batch, hidden), scope=tir.Scope.LOCAL)
    g = tir.Buffer("g", (batch, columns), scope=tir.Scope.LOCAL)

    d, s = tir.LoopVar("d"), tir.LoopVar("s")
    # the input step of iteration s: s for a forward direction, seq - 1 - s for a reverse one
    backwards: tir.PrimExpr = tir.as_expr(reverse[0])
    if directions == 2 and reverse[0] != reverse[1]:
        backwards = backwards + d * (reverse[1] - reverse[0])
    t = s + backwards * (seq - 1 - s * 2)

    b0, j0 = tir.LoopVar("b0"), tir.LoopVar("j0")
    init: tir.Stmt = tir.For(b0, batch, tir.For(j0, hidden, tir.seq(
        tir.Store(h, (b0, j0), h0[d, b0, j0]), tir.Store(c, (b0, j0), c0[d, b0, j0])), tir.ForKind.VECTORIZED))
    if prologue is not None:
        init = tir.seq(init, prologue)
    steps = tir.For(s, seq, tir.seq(product(d, h, g), _lstm_gates(xp, g, h, c, out, t, d, batch, hidden)))
    body: tir.Stmt = tir.seq(init, steps)
    for buffer in (*scratch, g, c, h):
        body = tir.Allocate(buffer, body)
    parallel = directions > 1 and target.num_cores > 1 and seq * batch * gates * hidden >= PARALLEL_MIN_MACS
    kind = tir.ForKind.PARALLEL if parallel else tir.ForKind.SERIAL
    return tir.PrimFunc(name, params, tir.For(d, directions, body, kind))


def _panel_products(acc: tir.Buffer, panels: int, batch: int, depth: int, zero: tir.PrimExpr,
                    term: Callable[[tir.PrimExpr, tir.PrimExpr, tir.PrimExpr, tir.PrimExpr], tir.PrimExpr],
                    result: Callable[[tir.PrimExpr, tir.PrimExpr, tir.PrimExpr, tir.PrimExpr], tir.Stmt]) -> tir.Stmt:
    """One step's recurrent products, a weight panel at a time: per panel `p` and batch row `b`, the panel's
    accumulators `acc` (one per column `j`, vectorized) start at `zero`, sum `term(p, b, k, j)` over `k < depth`
    (unrolled by `K_UNROLL` where it divides), and `result(p, b, j, column)` stores column `p * panel + j`."""
    panel = acc.shape[0]
    p, b, j1, j2, j3 = (tir.LoopVar(n) for n in ("p", "b1", "j1", "j2", "j3"))
    ko, ku = tir.LoopVar("ko"), tir.LoopVar("ku")
    unroll = K_UNROLL if depth % K_UNROLL == 0 else 1
    k = ko * unroll + ku
    vectorized = tir.ForKind.VECTORIZED
    update = tir.For(j2, panel, tir.Store(acc, (j2,), acc[j2] + term(p, b, k, j2)), vectorized)
    reduce = tir.For(ko, depth // unroll, tir.For(ku, unroll, update,
                                                  tir.ForKind.UNROLLED if unroll > 1 else tir.ForKind.SERIAL))
    return tir.For(p, panels, tir.For(b, batch, tir.seq(
        tir.For(j1, panel, tir.Store(acc, (j1,), zero), vectorized),
        reduce,
        tir.For(j3, panel, result(p, b, j3, p * panel + j3), vectorized))))


def lstm_sequence_kernel(call: Call, target: Target, name: str) -> tir.PrimFunc:
    """The loop nest of one `nn.lstm_sequence` call (see the module docstring); parameters xp, rp, h0, c0, out."""
    seq, batch, directions, gates = _shape(call.args[0])
    _, panels, hidden, panel = _shape(call.args[1])
    params = (tir.Buffer("xp", (seq, batch, directions, gates)), tir.Buffer("rp", (directions, panels, hidden, panel)),
              tir.Buffer("h0", (directions, batch, hidden)), tir.Buffer("c0", (directions, batch, hidden)),
              tir.Buffer("out", (seq, directions, batch, 2 * hidden)))
    rp = params[1]
    acc = tir.Buffer("acc", (panel,), scope=tir.Scope.LOCAL)  # one panel's accumulators

    def product(d: tir.PrimExpr, h: tir.Buffer, g: tir.Buffer) -> tir.Stmt:
        return _panel_products(acc, panels, batch, hidden, tir.FloatImm(0.0),
                               lambda p, b, k, j: h[b, k] * rp[d, p, k, j],
                               lambda p, b, j, column: tir.Store(g, (b, column), acc[j]))

    return _lstm_layer(call, target, name, params, product, (acc,), None, panels * panel)


def lstm_sequence_int8_kernel(call: Call, target: Target, name: str) -> tir.PrimFunc:
    """The loop nest of one `nn.lstm_sequence_int8` call (see `relay_tune.op.recurrent`); parameters xp, rq,
    rscale, rsum, h0, c0, out.

    Each step first quantizes the state `h` to uint8 (its range in one scalar pass: a few hundred elements, next
    to a product of `4H` times as many), then streams the int8 weight panels with two-term dot products into int32
    accumulators (`tir.DOT2_INTRINSIC`: a pair of state values broadcast, each panel row's int8 pairs sign-extended
    on load, one vpmaddwd per register of lanes on x86) and scales each column's exact sum back to float32.
    vpmaddwd multiplies int16, so full-range int8 weights need no care: the four-byte vpmaddubsw would saturate on
    them (and, split into halves that do not, take two multiply sequences per weight register, twice vpmaddwd's
    multiply-port work on CPUs without VNNI)."""
    seq, batch, directions, gates = _shape(call.args[0])
    _, panels, pairs, panel, _ = _shape(call.args[1])
    hidden, columns = gates // 4, panels * panel
    params = (tir.Buffer("xp", (seq, batch, directions, gates)),
              tir.Buffer("rq", (directions, panels, pairs, panel, 2), "int8"),
              tir.Buffer("rscale", (directions, columns)), tir.Buffer("rsum", (directions, columns), "int32"),
              tir.Buffer("h0", (directions, batch, hidden)), tir.Buffer("c0", (directions, batch, hidden)),
              tir.Buffer("out", (seq, directions, batch, 2 * hidden)))
    rq, rscale, rsum = params[1:4]
    acc = tir.Buffer("acc", (panel,), "int32", scope=tir.Scope.LOCAL)  # one panel's accumulators
    # the quantized state; a row past an odd hidden size meets zero weights
    qh = tir.Buffer("qh", (batch, 2 * pairs), "uint8", scope=tir.Scope.LOCAL)
    ends = tir.Buffer("ends", (2,), scope=tir.Scope.LOCAL)  # the state's range, 0 included
    quant = tir.Buffer("quant", (2,), scope=tir.Scope.LOCAL)  # its scale and zero point
    vectorized = tir.ForKind.VECTORIZED

    # the padding row is cleared once so that it holds a value
    bz, jz = tir.LoopVar("bz"), tir.LoopVar("jz")
    clear = tir.For(bz, batch, tir.For(jz, 2 * pairs, tir.Store(qh, (bz, jz), tir.IntImm(0, "uint8")), vectorized))

    def quantize(h: tir.Buffer) -> tir.Stmt:
        bm, jm, bq, jq = (tir.LoopVar(n) for n in ("bm", "jm", "bq", "jq"))
        zero, top = tir.FloatImm(0.0), tir.FloatImm(255.0)
        span = ends[1] - ends[0]
        scale, zero_point = quant[0], quant[1]
        level = tir.minimum(tir.maximum(tir.Call("round", (h[bq, jq] / scale,), "float32") + zero_point, zero), top)
        return tir.seq(
            tir.Store(ends, (0,), zero), tir.Store(ends, (1,), zero),
            tir.For(bm, batch, tir.For(jm, hidden, tir.seq(
                tir.Store(ends, (0,), tir.minimum(ends[0], h[bm, jm])),
                tir.Store(ends, (1,), tir.maximum(ends[1], h[bm, jm]))))),
            # onnxruntime's parameters: scale 1 for an empty range, the zero point the rounded image of 0
            tir.Store(quant, (0,), tir.Select(tir.binary("eq", span, zero), tir.FloatImm(1.0), span / top)),
            tir.Store(quant, (1,), tir.Call("round", (tir.minimum(tir.maximum(-ends[0] / quant[0], zero), top),),
                                            "float32")),
            tir.For(bq, batch, tir.For(jq, hidden, tir.Store(qh, (bq, jq), tir.Cast("uint8", level)), vectorized)))

    def product(d: tir.PrimExpr, h: tir.Buffer, g: tir.Buffer) -> tir.Stmt:
        def term(p: tir.PrimExpr, b: tir.PrimExpr, k: tir.PrimExpr, j: tir.PrimExpr) -> tir.PrimExpr:
            return te.dot2_u8s16_i32([qh[b, k * 2], qh[b, k * 2 + 1]], [rq[d, p, k, j, 0], rq[d, p, k, j, 1]])

        def scaled(p: tir.PrimExpr, b: tir.PrimExpr, j: tir.PrimExpr, column: tir.PrimExpr) -> tir.Stmt:
            exact = tir.Cast("float32", acc[j] - tir.Cast("int32", quant[1]) * rsum[d, column])
            return tir.Store(g, (b, column), exact * (quant[0] * rscale[d, column]))

        return tir.seq(quantize(h), _panel_products(acc, panels, batch, pairs, tir.IntImm(0, "int32"), term, scaled))

    return _lstm_layer(call, target, name, params, product, (acc, qh, ends, quant), clear, columns)


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


def fixed_kernel(func: Function, target: Target, name: str) -> tir.PrimFunc:
    """The loop nest of a fused function that `fixed_kernel_call` accepts."""
    call = fixed_kernel_call(func)
    if call is None:
        raise CompileError("the fused function is not one call of an operator with a fixed kernel")
    assert isinstance(call.op, Op)
    return FIXED_KERNELS[call.op.name](call, target, name)
