"""Tensor expressions, index arithmetic analysis, default lowering and the loop-nest interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_tune.kernel import analysis, te, tir
from relay_tune.kernel.lower import lower, lower_te
from relay_tune.kernel.schedule import Schedule
from relay_tune.kernel.tir_eval import TirEvalError, compile_func, evaluate, run

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def stmts_of(func: tir.PrimFunc, kind: type) -> list[tir.Stmt]:
    return [s for s in analysis.iter_stmts(func.body) if isinstance(s, kind)]


# ------------------------------------------------------------------------------------------------
# construction
# ------------------------------------------------------------------------------------------------


def test_compute_names_axes_after_the_function_parameters() -> None:
    a = te.placeholder((4, 5), "float32", "A")
    b = te.compute((4, 5), lambda row, col: a[row, col] * 2.0, "B")
    assert [ax.name for ax in b.op.axes] == ["row", "col"]
    assert [ax.extent for ax in b.op.axes] == [4, 5]
    assert b.dtype == "float32" and b.shape == (4, 5)
    star = te.compute((4, 5), lambda *idx: a[idx], "S")
    assert [ax.name for ax in star.op.axes] == ["ax0", "ax1"]


def test_reduce_axis_is_usable_in_index_arithmetic() -> None:
    a = te.placeholder((10,), "float32", "A")
    k = te.reduce_axis(5, "k")
    c = te.compute((5,), lambda i: te.sum(a[i + k], axis=k), "C")
    body = c.op.body
    assert isinstance(body, te.Reduce) and body.axes == (k,)
    assert isinstance(body.init, tir.FloatImm) and body.init.value == 0.0
    assert c.op.reduce_axes == (k,)


def test_reduction_inits_default_to_the_identity() -> None:
    a = te.placeholder((3, 4), "float32", "A")
    k = te.reduce_axis(4, "k")
    assert te.max(a[0, k], axis=k).init.value == -math.inf
    assert te.min(a[0, k], axis=k).init.value == math.inf
    i = te.placeholder((3,), "int32", "I")
    r = te.reduce_axis(3, "r")
    assert te.max(i[r], axis=r).init.value == -(2**31)
    assert te.sum(a[0, k], axis=k, init=1.5).init.value == 1.5


def test_invalid_expressions_are_rejected() -> None:
    a = te.placeholder((4, 4), "float32", "A")
    k = te.reduce_axis(4, "k")
    with pytest.raises(ValueError, match="rank"):
        _ = a[1]
    with pytest.raises(TypeError, match="integer"):
        _ = a[0, 1.5]
    with pytest.raises(ValueError, match="whole body"):
        te.compute((4,), lambda i: te.sum(a[i, k], axis=k) + 1.0, "bad")
    with pytest.raises(ValueError, match="reduce_axis"):
        te.sum(a[0, 0], axis=[te.IterVar("x", "int64", 4, te.SPATIAL)])
    with pytest.raises(ValueError, match="positive"):
        te.placeholder((4, 0), "float32", "Z")
    with pytest.raises(ValueError, match="rank"):
        te.compute((4, 4), lambda i: a[i, i], "wrong_rank")
    with pytest.raises(TypeError, match="boolean"):
        te.if_then_else(a[0, 0], 1.0, 0.0)


def test_post_order_lists_producers_first_and_each_tensor_once() -> None:
    a = te.placeholder((4,), "float32", "A")
    b = te.compute((4,), lambda i: a[i] + 1.0, "B")
    c = te.compute((4,), lambda i: a[i] * b[i], "C")
    d = te.compute((4,), lambda i: b[i] - c[i], "D")
    order = [t.name for t in te.post_order_tensors([d])]
    assert order == ["A", "B", "C", "D"]


# ------------------------------------------------------------------------------------------------
# analysis
# ------------------------------------------------------------------------------------------------


def test_simplify_keeps_split_indices_affine_and_folds_trivia() -> None:
    io, ii, x, f = (tir.LoopVar(n) for n in ("io", "ii", "x", "f"))
    ranges = {io: (0, 4), ii: (0, 7), x: (0, 99), f: (0, 4095)}

    def s(e: tir.PrimExpr) -> str:
        return analysis.format_expr(analysis.simplify(e, ranges))

    assert s(x * 1 + 0) == "x"
    assert s(io * 8 + ii) == "((io * 8) + ii)"
    assert s((io * 8 + ii) // 8) == "io"
    assert s((io * 8 + ii) % 8) == "ii"
    assert s(((f // 128) * 32 + ii) // 32) == "(f // 128)"
    assert s((f // 128) // 4) == "(f // 512)"
    assert s(io * 8 + ii < 40) == "true"
    assert s(io * 8 + ii < 37) == "(((io * 8) + ii) < 37)"
    assert s(io * 8 + 3 - io * 8) == "3"
    assert s(tir.minimum(ii, 10)) == "ii"
    assert s(tir.maximum(ii - 8, 0)) == "0"
    assert s((x * 6 + 4) % 3) == "1"
    assert s(tir.Select(ii < 8, x, x + 1)) == "x"
    assert s(tir.FloatImm(2.0) * tir.FloatImm(3.0)) == "6.0f"


def test_simplify_never_changes_values() -> None:
    """The simplified expression evaluates to the same integer at every point of the ranges."""
    a, b = tir.LoopVar("a"), tir.LoopVar("b")
    ranges = {a: (0, 6), b: (0, 4)}
    exprs = [
        (a * 5 + b) // 5, (a * 5 + b) % 5, (a * 3 + b * 2 + 7) // 4, (a * 3 + b * 2 + 7) % 4,
        ((a * 5 + b) // 3) * 2 - a, tir.minimum(a * 2, b + 3), tir.maximum(a - b, 1), (a + b) // 1,
        ((a * 7) // 2) // 3, (a - 10) // 4, (a - 10) % 4, tir.BinaryOp("div", a * 2 + 1, tir.IntImm(3)),
    ]

    for e in exprs:
        simple = analysis.simplify(e, ranges)
        for va in range(7):
            for vb in range(5):
                env = {a: va, b: vb}
                assert _eval_int(e, env) == _eval_int(simple, env), analysis.format_expr(e)


def test_simplify_divides_mixed_radix_indices() -> None:
    """A channel shuffle's source channel: (784*c + 28*h + w) // 1568 is c // 2 when h, w < 28, so the index
    no longer depends on the vectorized w (contiguous loads instead of a gather)."""
    c, h, w = tir.LoopVar("c"), tir.LoopVar("h"), tir.LoopVar("w")
    ranges = {c: (0, 115), h: (0, 27), w: (0, 27)}

    def s(e: tir.PrimExpr) -> str:
        return analysis.format_expr(analysis.simplify(e, ranges))

    assert s((c * 784 + h * 28 + w) // 1568) == "(c // 2)"
    assert s((c * 784 + h * 28 + w) % 1568) == "((((c % 2) * 784) + (h * 28)) + w)"
    assert s((c * 784 + h * 28 + w + 784) // 1568) == "((c + 1) // 2)"
    assert s((c * 784 + h * 28 + w + 800) // 1568) == "(((((c * 784) + (h * 28)) + w) + 800) // 1568)"
    # exhaustively, with offsets that push the low part across a period
    for offset in (0, 5, 783, 784, -3):
        for e in ((c * 784 + h * 28 + w + offset) // 1568, (c * 784 + h * 28 + w + offset) % 1568,
                  (c * 12 + w + offset) // 24, (c * 12 + w + offset) % 24):
            simple = analysis.simplify(e, {c: (0, 5), h: (0, 27), w: (0, 11)})
            for vc in range(6):
                for vh in (0, 13, 27):
                    for vw in range(12):
                        env = {c: vc, h: vh, w: vw}
                        assert _eval_int(simple, env) == _eval_int(e, env), analysis.format_expr(e)


def test_bound_of_index_expressions() -> None:
    i, j = tir.LoopVar("i"), tir.LoopVar("j")
    ranges = {i: (0, 9), j: (0, 3)}
    assert analysis.bound(i * 4 + j, ranges) == (0, 39)
    assert analysis.bound(i - j * 2, ranges) == (-6, 9)
    assert analysis.bound((i * 4 + j) // 8, ranges) == (0, 4)
    assert analysis.bound((i + 16) % 8, ranges) == (0, 7)
    assert analysis.bound(j % 8, ranges) == (0, 3)
    truncating = tir.BinaryOp("div", i - 15, tir.IntImm(2))  # C division rounds toward zero
    assert analysis.bound(truncating, ranges) == (-7, -3)
    lo, hi = analysis.bound(tir.Load(tir.Buffer("B", (4,), "int64"), (i,)), ranges)
    assert math.isinf(lo) and math.isinf(hi)


_VARS = (tir.LoopVar("a"), tir.LoopVar("b"))


@st.composite
def index_exprs(draw: st.DrawFn, depth: int = 0) -> tir.PrimExpr:
    """Random integer index expressions over two loop variables."""
    if depth >= 3 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from([*_VARS, tir.IntImm(draw(st.integers(-9, 9)))]))
    op = draw(st.sampled_from(["add", "sub", "mul", "floordiv", "floormod", "div", "min", "max"]))
    left = draw(index_exprs(depth + 1))
    if op in ("mul", "floordiv", "floormod", "div"):
        return tir.BinaryOp(op, left, tir.IntImm(draw(st.integers(1, 7))))
    return tir.BinaryOp(op, left, draw(index_exprs(depth + 1)))


def _eval_int(e: tir.PrimExpr, env: dict[tir.LoopVar, int]) -> int:
    """Plain Python evaluation (independent of the simplifier): floor semantics for floordiv/floormod,
    truncation for div."""
    if isinstance(e, tir.IntImm):
        return e.value
    if isinstance(e, tir.LoopVar):
        return env[e]
    assert isinstance(e, tir.BinaryOp)
    x, y = _eval_int(e.a, env), _eval_int(e.b, env)
    ops = {
        "add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "floordiv": lambda: x // y,
        "floormod": lambda: x % y, "div": lambda: int(x / y), "min": lambda: min(x, y), "max": lambda: max(x, y),
    }
    return ops[e.op]()


@settings(max_examples=150, deadline=None)
@given(index_exprs(), st.integers(-4, 3), st.integers(0, 5), st.integers(0, 6))
def test_simplify_and_bound_are_sound(expr: tir.PrimExpr, a_lo: int, a_len: int, b_hi: int) -> None:
    a, b = _VARS
    ranges = {a: (a_lo, a_lo + a_len), b: (0, b_hi)}
    simple = analysis.simplify(expr, ranges)
    lo, hi = analysis.bound(expr, ranges)
    for va in range(a_lo, a_lo + a_len + 1):
        for vb in range(b_hi + 1):
            env = {a: va, b: vb}
            value = _eval_int(expr, env)
            assert _eval_int(simple, env) == value, analysis.format_expr(expr)
            assert lo <= value <= hi, analysis.format_expr(expr)


def test_format_and_structural_equality_ignore_object_identity() -> None:
    def make() -> tir.PrimFunc:
        a = te.placeholder((3,), "float32", "A")
        b = te.compute((3,), lambda i: a[i] + 1.0, "B")
        return lower_te(b)

    f1, f2 = make(), make()
    assert f1.params[0] is not f2.params[0]
    assert analysis.structurally_equal(f1, f2)
    assert analysis.format_func(f1).splitlines()[0] == "def main(A: float32[3], B: float32[3]):"


# ------------------------------------------------------------------------------------------------
# default lowering (no schedule) + interpreter
# ------------------------------------------------------------------------------------------------


def test_matmul_default_schedule() -> None:
    m, n, k_ = 7, 5, 6
    a = te.placeholder((m, k_), "float32", "A")
    b = te.placeholder((k_, n), "float32", "B")
    k = te.reduce_axis(k_, "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), "C")
    func = lower_te(c, "matmul")
    assert func.name == "matmul" and [p.name for p in func.params] == ["A", "B", "C"]
    x, y = rand(m, k_), rand(k_, n)
    (out,) = run(func, [x, y])
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-5)


def test_each_compute_gets_its_own_nest_and_intermediate_buffer() -> None:
    a = te.placeholder((6, 4), "float32", "A")
    b = te.compute((6, 4), lambda i, j: a[i, j] * 2.0, "B")
    c = te.compute((6, 4), lambda i, j: b[i, j] + 1.0, "C")
    func = lower_te(c)
    allocs = stmts_of(func, tir.Allocate)
    assert [s.buffer.name for s in allocs] == ["B"] and allocs[0].buffer.scope is tir.Scope.GLOBAL
    assert len(stmts_of(func, tir.Store)) == 2
    x = rand(6, 4)
    np.testing.assert_allclose(run(func, [x])[0], x * 2 + 1, rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "max", "min"])
def test_reductions_over_several_axes(combiner: str) -> None:
    a = te.placeholder((3, 4, 5), "float32", "A")
    r1, r2 = te.reduce_axis(3, "r1"), te.reduce_axis(5, "r2")
    reducer = {"sum": te.sum, "max": te.max, "min": te.min}[combiner]
    out = te.compute((4,), lambda j: reducer(a[r1, j, r2], axis=[r1, r2]), "out")
    x = rand(3, 4, 5)
    expected = {"sum": x.sum(axis=(0, 2)), "max": x.max(axis=(0, 2)), "min": x.min(axis=(0, 2))}[combiner]
    np.testing.assert_allclose(run(lower_te(out), [x])[0], expected, rtol=1e-5, atol=1e-6)


def test_reduction_with_init_and_scalar_output() -> None:
    a = te.placeholder((4, 5), "float32", "A")
    k1, k2 = te.reduce_axis(4, "a"), te.reduce_axis(5, "b")
    total = te.compute((), lambda: te.sum(a[k1, k2], axis=[k1, k2], init=10.0), "total")
    x = rand(4, 5)
    (out,) = run(lower_te(total), [x])
    assert out.shape == () and out == pytest.approx(x.sum() + 10.0, rel=1e-5)


def test_injective_chain_transpose_reshape_inlined_has_no_intermediates() -> None:
    a = te.placeholder((4, 6), "float32", "A")
    t = te.compute((6, 4), lambda i, j: a[j, i], "transpose")
    r = te.compute((3, 8), lambda i, j: t[(i * 8 + j) // 4, (i * 8 + j) % 4], "reshape")
    e = te.compute((3, 8), lambda i, j: te.exp(r[i, j]) * 0.5, "scale")
    s = Schedule(e)
    s.compute_inline(t)
    s.compute_inline(r)
    func = lower(s)
    assert not stmts_of(func, tir.Allocate)
    assert len(stmts_of(func, tir.Store)) == 1
    x = rand(4, 6)
    np.testing.assert_allclose(run(func, [x])[0], np.exp(x.T.reshape(3, 8)) * 0.5, rtol=1e-5)


def test_math_intrinsics_match_numpy() -> None:
    a = te.placeholder((9,), "float32", "A")
    x = np.linspace(0.1, 2.5, 9).astype("float32")
    cases = {
        "exp": (te.exp, np.exp), "log": (te.log, np.log), "sqrt": (te.sqrt, np.sqrt),
        "rsqrt": (te.rsqrt, lambda v: 1 / np.sqrt(v)), "tanh": (te.tanh, np.tanh),
        "sigmoid": (te.sigmoid, lambda v: 1 / (1 + np.exp(-v))), "erf": (te.erf, np.vectorize(math.erf)),
        "abs": (lambda v: te.abs(v - 1.0), lambda v: np.abs(v - 1)), "floor": (te.floor, np.floor),
        "ceil": (te.ceil, np.ceil), "round": (te.round, lambda v: np.floor(v + 0.5)),
        "power": (lambda v: te.power(v, 1.5), lambda v: v**1.5),
        "fma": (lambda v: te.fma(v, v, 1.0), lambda v: v * v + 1),
    }
    for name, (fn, ref) in cases.items():
        out = te.compute((9,), lambda i, fn=fn: fn(a[i]), name)
        np.testing.assert_allclose(run(lower_te(out), [x])[0], ref(x).astype("float32"), rtol=1e-5, err_msg=name)


def test_integer_and_boolean_tensors() -> None:
    i = te.placeholder((6,), "int32", "I")
    j = te.compute((6,), lambda n: i[n] * 3 - te.const(1, "int32"), "J")
    b = te.compute((6,), lambda n: j[n] > 4, "B")
    (out_j, out_b) = run(lower_te([j, b]), [np.arange(6, dtype="int32")])
    np.testing.assert_array_equal(out_j, np.arange(6) * 3 - 1)
    np.testing.assert_array_equal(out_b, np.arange(6) * 3 - 1 > 4)


def test_padding_reads_are_kept_in_bounds() -> None:
    """`if_then_else` branches may both run: the read under the condition is clamped, and the strict
    interpreter (which evaluates both branches and checks every index) passes."""
    a = te.placeholder((5,), "float32", "A")
    p = te.compute((9,), lambda i: te.if_then_else(te.all_of(i >= 2, i < 7), a[i - 2], 0.0), "P")
    func = lower_te(p)
    x = rand(5)
    np.testing.assert_allclose(run(func, [x])[0], np.pad(x, 2), rtol=1e-6)
    text = analysis.format_func(func)
    assert "max((i - 2), 0)" in text and "min(" in text


# ------------------------------------------------------------------------------------------------
# interpreter strictness
# ------------------------------------------------------------------------------------------------


def _manual(body_for: object) -> tir.PrimFunc:
    a = tir.Buffer("A", (4,), "float32")
    out = tir.Buffer("O", (4,), "float32")
    i = tir.LoopVar("i")
    return tir.PrimFunc("f", (a, out), tir.For(i, 4, body_for(a, out, i)))  # type: ignore[operator]


def test_interpreter_rejects_out_of_bounds_indices() -> None:
    func = _manual(lambda a, out, i: tir.Store(out, (i,), a[i + 1]))
    with pytest.raises(TirEvalError, match="out-of-bounds"):
        evaluate(func, rand(4), np.zeros(4, "float32"))
    # a negative index is caught even though python lists would accept it
    func = _manual(lambda a, out, i: tir.Store(out, (i,), a[i - 1]))
    with pytest.raises(TirEvalError, match="out-of-bounds"):
        evaluate(func, rand(4), np.zeros(4, "float32"))


def test_interpreter_evaluates_both_select_branches() -> None:
    func = _manual(lambda a, out, i: tir.Store(out, (i,), tir.Select(i > 0, a[i - 1], tir.FloatImm(0.0))))
    with pytest.raises(TirEvalError, match="out-of-bounds"):
        evaluate(func, rand(4), np.zeros(4, "float32"))


def test_interpreter_exposes_reads_of_unwritten_scratch() -> None:
    a = tir.Buffer("A", (4,), "float32")
    out = tir.Buffer("O", (4,), "float32")
    tmp = tir.Buffer("T", (4,), "float32", tir.Scope.LOCAL)
    i, j = tir.LoopVar("i"), tir.LoopVar("j")
    body = tir.Allocate(
        tmp,
        tir.seq(
            tir.For(i, 3, tir.Store(tmp, (i,), a[i])),  # element 3 is never written
            tir.For(j, 4, tir.Store(out, (j,), tmp[j])),
        ),
    )
    o = np.zeros(4, "float32")
    compiled = compile_func(tir.PrimFunc("f", (a, out), body))
    compiled(rand(4), o)
    assert np.isnan(o[3]) and not np.isnan(o[:3]).any()


def test_interpreter_checks_argument_shapes_and_dtypes() -> None:
    func = _manual(lambda a, out, i: tir.Store(out, (i,), a[i]))
    with pytest.raises(TirEvalError, match="shape"):
        evaluate(func, rand(5), np.zeros(4, "float32"))
    with pytest.raises(TirEvalError, match="dtype"):
        evaluate(func, rand(4).astype("float64"), np.zeros(4, "float32"))
