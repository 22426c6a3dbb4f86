"""Schedule primitives, lowering and replay.

Every schedule is checked against numpy through the strict loop-nest interpreter, and, when the LLVM
CPU back end is available, through compiled code as well. Sizes are deliberately odd (37x53x29) so
that splits leave tails.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_tune.codegen.llvm import build_llvm
from relay_tune.kernel import analysis, te, tir
from relay_tune.kernel.lower import lower
from relay_tune.kernel.schedule import LayoutTransform, Schedule, ScheduleError, Split, step_from_json
from relay_tune.kernel.tir_eval import evaluate

RNG = np.random.default_rng(1)
M, N, K = 37, 53, 29


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def stmts_of(func: tir.PrimFunc, kind: type) -> list[tir.Stmt]:
    return [s for s in analysis.iter_stmts(func.body) if isinstance(s, kind)]


def fors(func: tir.PrimFunc) -> list[tir.For]:
    return stmts_of(func, tir.For)  # type: ignore[return-value]


def check(func: tir.PrimFunc, inputs: Sequence[np.ndarray], expected: Sequence[np.ndarray], compiled: bool = True,
          rtol: float = 1e-4, atol: float = 1e-4) -> None:
    """Run `func` on `inputs` (outputs are the remaining parameters) and compare with `expected`."""
    outs = [np.zeros(p.shape, p.dtype) for p in func.params[len(inputs):]]
    evaluate(func, *inputs, *outs)
    for got, want in zip(outs, expected):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    if compiled:
        outs = [np.zeros(p.shape, p.dtype) for p in func.params[len(inputs):]]
        build_llvm([func]).get(func.name)(*inputs, *outs)
        for got, want in zip(outs, expected):
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------------
# workloads
# ------------------------------------------------------------------------------------------------


def matmul(m: int = M, n: int = N, k_: int = K) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    a = te.placeholder((m, k_), "float32", "A")
    b = te.placeholder((k_, n), "float32", "B")
    k = te.reduce_axis(k_, "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), "C")
    return a, b, c


A_NP, B_NP = rand(M, K), rand(K, N)
C_NP = A_NP @ B_NP


def check_matmul(s: Schedule, compiled: bool = True) -> tir.PrimFunc:
    func = lower(s, "matmul")
    check(func, [A_NP, B_NP], [C_NP], compiled)
    return func


def dense_bias_relu(m: int, n: int, k_: int) -> tuple[te.Tensor, ...]:
    a = te.placeholder((m, k_), "float32", "A")
    w = te.placeholder((n, k_), "float32", "W")
    bias = te.placeholder((n,), "float32", "bias")
    k = te.reduce_axis(k_, "k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, k] * w[j, k], axis=k), "C")
    d = te.compute((m, n), lambda i, j: te.maximum(c[i, j] + bias[j], 0.0), "D")
    return a, w, bias, c, d


def schedule_dense_packed(
    a: te.Tensor, w: te.Tensor, c: te.Tensor, out: te.Tensor, bn: int = 32, mr: int = 8, ku: int = 4,
    parallel: bool = True,
) -> Schedule:
    """The register-blocked dense schedule: weight packed into `bn`-wide panels, an `mr x bn` tile of
    accumulators (cache_write) per (panel, row block), K unrolled by `ku`, the tile's rows unrolled and
    its columns vectorized, row blocks x panels fused and parallel. Only schedule primitives."""
    s = Schedule(out)
    s.transform_layout(w, "NK", f"NK{bn}n")
    acc = s.cache_write(c, "local")
    if out is not c:
        s.compute_inline(c)  # the epilogue reads the accumulator tile directly
    io, jo, ii, ji = s.tile(out, "i", "j", mr, bn)
    s.reorder(out, jo, io, ii, ji)
    tile = s.fuse(out, jo, io)
    if parallel:
        s.parallel(out, tile)
    s.vectorize(out, ji)
    s.compute_at(acc, out, tile)
    ko, ki = s.split(acc, "k", factor=ku)
    s.reorder(acc, ko, ki, "i", "j")
    s.unroll(acc, ki)
    s.unroll(acc, "i")
    s.vectorize(acc, "j")
    return s


def conv2d_relu(
    batch: int, chans: int, height: int, width: int, filters: int, ksize: int, pad: int, stride: int
) -> tuple[te.Tensor, ...]:
    data = te.placeholder((batch, chans, height, width), "float32", "data")
    weight = te.placeholder((filters, chans, ksize, ksize), "float32", "weight")
    bias = te.placeholder((filters,), "float32", "bias")
    hp, wp = height + 2 * pad, width + 2 * pad
    padded = te.compute(
        (batch, chans, hp, wp),
        lambda n, c, y, x: te.if_then_else(
            te.all_of(y >= pad, y < height + pad, x >= pad, x < width + pad), data[n, c, y - pad, x - pad], 0.0
        ),
        "pad",
    )
    oh, ow = (hp - ksize) // stride + 1, (wp - ksize) // stride + 1
    rc, ry, rx = te.reduce_axis(chans, "rc"), te.reduce_axis(ksize, "ry"), te.reduce_axis(ksize, "rx")
    conv = te.compute(
        (batch, filters, oh, ow),
        lambda n, f, y, x: te.sum(
            padded[n, rc, y * stride + ry, x * stride + rx] * weight[f, rc, ry, rx], axis=[rc, ry, rx]
        ),
        "conv",
    )
    relu = te.compute((batch, filters, oh, ow), lambda n, f, y, x: te.maximum(conv[n, f, y, x] + bias[f], 0.0), "relu")
    return data, weight, bias, padded, conv, relu


def conv2d_relu_ref(d: np.ndarray, wt: np.ndarray, b: np.ndarray, pad: int, stride: int) -> np.ndarray:
    n, _, h, w = d.shape
    f, _, kh, kw = wt.shape
    dp = np.pad(d.astype("float64"), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
    out = np.zeros((n, f, oh, ow))
    for ry in range(kh):
        for rx in range(kw):
            patch = dp[:, :, ry : ry + stride * oh : stride, rx : rx + stride * ow : stride]
            out += np.einsum("nchw,fc->nfhw", patch, wt[:, :, ry, rx])
    return np.maximum(out + b[None, :, None, None], 0).astype("float32")


def schedule_conv(padded: te.Tensor, conv: te.Tensor, relu: te.Tensor, pad_mode: str) -> Schedule:
    s = Schedule(relu)
    acc = s.cache_write(conv, "local")
    s.compute_inline(conv)
    fo, fi = s.split(relu, "f", factor=8)
    xo, xi = s.split(relu, "x", factor=4)
    s.reorder(relu, "n", fo, "y", xo, fi, xi)
    s.vectorize(relu, xi)
    s.parallel(relu, fo)
    s.compute_at(acc, relu, xo)
    s.reorder(acc, "rc", "ry", "rx", "n", "f", "y", "x")
    s.unroll(acc, "f")
    s.vectorize(acc, "x")
    if pad_mode == "inline":
        s.compute_inline(padded)
    else:
        s.compute_at(padded, relu, xo)
    return s


# ------------------------------------------------------------------------------------------------
# each primitive alone
# ------------------------------------------------------------------------------------------------


def test_split_by_factor_with_a_tail() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    assert s.split(c, "i", factor=8) == ("i.0", "i.1")
    assert s.leaves(c) == ("i.0", "i.1", "j", "k")
    assert s.steps == [Split("C", "i", (None, 8))]
    check_matmul(s)


def test_split_by_nparts_and_multi_level() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    s.split(c, "j", nparts=3)
    assert s["C"].loop_extents()["j.1"] == 18 and s["C"].loop_extents()["j.0"] == 3
    s.split(c, "i", factors=(None, 3, 4))
    assert s.leaves(c) == ("i.0", "i.1", "i.2", "j.0", "j.1", "k")
    assert s["C"].loop_extents()["i.0"] == 4  # ceil(37 / 12)
    check_matmul(s)


def test_split_of_a_split_loop_and_of_the_reduction() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    s.split(c, "i", factor=16)
    s.split(c, "i.1", factor=3)  # 16 is not a multiple of 3 either
    s.split(c, "k", factor=16)
    check_matmul(s)


def test_reorder_reduction_outside_places_the_init_first() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    s.reorder(c, "k", "i", "j")
    func = check_matmul(s)
    text = analysis.format_func(func).splitlines()
    # the init nest (i, j) comes before the accumulation nest (k, i, j)
    assert text[1].strip() == "for i in range(37):" and "= 0.0f" in text[3]
    assert text[4].strip() == "for k in range(29):"


def test_reduction_split_between_spatial_loops() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    ko, ki = s.split(c, "k", factor=8)
    s.reorder(c, "i", ko, "j", ki)
    check_matmul(s)


def test_tile() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    assert s.tile(c, "i", "j", 8, 16) == ("i.0", "j.0", "i.1", "j.1")
    assert s.leaves(c) == ("i.0", "j.0", "i.1", "j.1", "k")
    check_matmul(s)


def test_fuse_with_tails() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    s.tile(c, "i", "j", 8, 16)
    fused = s.fuse(c, "i.0", "j.0")
    assert fused == "i.0.j.0.fused" and s["C"].loop_extents()[fused] == 5 * 4
    s.fuse(c, "i.1", "j.1")
    check_matmul(s)


def test_vectorize_unroll_parallel_become_loop_kinds() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    io, jo, ii, ji = s.tile(c, "i", "j", 8, 16)
    s.reorder(c, io, jo, "k", ii, ji)
    s.parallel(c, io)
    s.unroll(c, ii)
    s.vectorize(c, ji)
    func = check_matmul(s)
    kinds = {f.var.name: f.kind for f in fors(func)}
    assert kinds["i.0"] is tir.ForKind.PARALLEL
    assert kinds["i.1"] is tir.ForKind.UNROLLED and kinds["j.1"] is tir.ForKind.VECTORIZED


def test_bind_records_thread_tags() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    bx, tx = s.split(c, "j", factor=16)
    s.bind(c, bx, "blockIdx.x")
    s.bind(c, tx, "threadIdx.x")
    func = check_matmul(s, compiled=False)
    tags = {f.var.name: (f.kind, f.thread_tag) for f in fors(func)}
    assert tags["j.0"] == (tir.ForKind.THREAD_BINDING, "blockIdx.x")
    assert tags["j.1"] == (tir.ForKind.THREAD_BINDING, "threadIdx.x")
    assert stmts_of(func, tir.IfThenElse)  # bound loops keep their extent: the tail is a guard


def test_cache_write_at_a_tile() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    acc = s.cache_write(c, "local")
    assert acc == "C.local" and s.leaves(acc) == ("i", "j", "k") and s.leaves(c) == ("i", "j")
    _, jo, _, _ = s.tile(c, "i", "j", 8, 16)
    s.compute_at(acc, c, jo)
    func = check_matmul(s)
    first = next(iter(stmts_of(func, tir.Allocate)))
    assert (first.buffer.name, first.buffer.shape, first.buffer.scope) == ("C.local", (8, 16), tir.Scope.LOCAL)


def test_compute_inline_and_compute_root() -> None:
    a = te.placeholder((5, 7), "float32", "A")
    b = te.compute((5, 7), lambda i, j: a[i, j] * 3.0, "B")
    c = te.compute((5, 7), lambda i, j: b[i, j] + 1.0, "C")
    x = rand(5, 7)
    s = Schedule(c)
    s.compute_inline(b)
    func = lower(s)
    assert not stmts_of(func, tir.Allocate)
    check(func, [x], [x * 3 + 1])
    s.compute_root(b)
    check(lower(s), [x], [x * 3 + 1])
    assert [st.KIND for st in s.steps] == ["compute_inline", "compute_root"]


def test_compute_at_infers_the_region_of_a_stencil() -> None:
    a = te.placeholder((20,), "float32", "A")
    b = te.compute((20,), lambda i: a[i] * 2.0, "B")
    k = te.reduce_axis(3, "k")
    c = te.compute((18,), lambda i: te.sum(b[i + k], axis=k), "C")
    s = Schedule(c)
    io, _ = s.split(c, "i", factor=4)
    s.compute_at(b, c, io)
    func = lower(s)
    allocs = stmts_of(func, tir.Allocate)  # one per version of the loop: main part and tail
    assert len(allocs) == 2 and {a.buffer.shape for a in allocs} == {(6,)}  # 4 outputs read 4 + 3 - 1 inputs
    x = rand(20)
    check(func, [x], [np.convolve(x * 2, np.ones(3), "valid")])


def test_cache_read_to_shared_with_barriers() -> None:
    _, _, c = matmul(20, 24, 18)
    a_np, b_np = rand(20, 18), rand(18, 24)
    s = Schedule(c)
    a_s = s.cache_read("A", "shared", [c])
    assert a_s == "A.shared"
    acc = s.cache_write(c, "local")
    bi, ti = s.split(c, "i", factor=4)
    bj, tj = s.split(c, "j", factor=8)
    s.reorder(c, bi, bj, ti, tj)
    s.bind(c, bi, "blockIdx.y")
    s.bind(c, bj, "blockIdx.x")
    s.bind(c, ti, "threadIdx.y")
    s.bind(c, tj, "threadIdx.x")
    s.compute_at(acc, c, tj)
    ko, _ = s.split(acc, "k", factor=4)
    s.compute_at(a_s, acc, ko)
    fused = s.fuse(a_s, "ax0", "ax1")
    _, t = s.split(a_s, fused, factor=8)
    s.bind(a_s, t, "threadIdx.x")
    func = lower(s)
    shared = [a.buffer for a in stmts_of(func, tir.Allocate) if a.buffer.scope is tir.Scope.SHARED]
    assert shared and shared[0].shape == (4, 4)  # the block's 4 rows (threadIdx.y relaxed) x 4 k
    assert len(stmts_of(func, tir.Barrier)) == 4  # before and after each fill (main part and k tail)
    check(func, [a_np, b_np], [a_np @ b_np], compiled=False)


def test_transform_layout_packs_dense_weights() -> None:
    _, w, _, c, _ = dense_bias_relu(M, N, K)
    s = Schedule(c)
    packed = s.transform_layout(w, "NK", "NK16n")
    assert packed == "W.packed"
    (lt,) = s.layout_transforms
    assert lt.packed_shape == (4, K, 16)
    func = lower(s)
    assert [p.name for p in func.params] == ["A", "W.packed", "C"]
    assert dict(func.attrs)["layout_transforms"] == (lt,)
    x, wt = rand(M, K), rand(N, K)
    check(func, [x, lt.pack(wt)], [x @ wt.T])


def test_layout_transform_pack_matches_its_tensor_expression() -> None:
    lt = LayoutTransform("weight", "weight.packed", "OIHW", "OIHW4i8o", (10, 6, 3, 3), "float32")
    assert lt.packed_shape == (2, 2, 3, 3, 4, 8)
    _, packed = lt.pack_compute()
    func = lower(Schedule(packed))
    wt = rand(10, 6, 3, 3)
    check(func, [wt], [lt.pack(wt)])
    # element (o, i, h, w) lands at (o // 8, i // 4, h, w, i % 4, o % 8)
    assert lt.pack(wt)[1, 1, 2, 0, 1, 1] == wt[9, 5, 2, 0]


def test_conv2d_with_packed_weight_layout() -> None:
    _, weight, _, padded, _, relu = conv2d_relu(1, 6, 6, 7, 10, 3, 1, 1)
    s = Schedule(relu)
    s.transform_layout(weight, "OIHW", "OIHW4i8o")
    s.compute_inline(padded)
    (lt,) = s.layout_transforms
    d, wt, b = rand(1, 6, 6, 7), rand(10, 6, 3, 3), rand(10)
    func = lower(s)
    assert [p.name for p in func.params] == ["data", "bias", "weight.packed", "relu"]
    check(func, [d, b, lt.pack(wt)], [conv2d_relu_ref(d, wt, b, 1, 1)])


# ------------------------------------------------------------------------------------------------
# combinations on real workloads
# ------------------------------------------------------------------------------------------------


def test_matmul_full_combination() -> None:
    """Non-dividing splits 8/16, k split and moved outside, cache_write at a tile, vectorize + unroll +
    parallel."""
    _, _, c = matmul()
    s = Schedule(c)
    acc = s.cache_write(c, "local")
    io, jo, _, ji = s.tile(c, "i", "j", 8, 16)
    s.parallel(c, io)
    s.vectorize(c, ji)
    s.compute_at(acc, c, jo)
    ko, ki = s.split(acc, "k", factor=16)
    s.reorder(acc, ko, ki, "i", "j")
    s.unroll(acc, "i")
    s.vectorize(acc, "j")
    check_matmul(s)


@pytest.mark.parametrize("shape", [(16, 64, 12), (37, 53, 29), (8, 32, 5)])
def test_dense_bias_relu_register_tile(shape: tuple[int, int, int]) -> None:
    m, n, k_ = shape
    a, w, _, c, d = dense_bias_relu(m, n, k_)
    s = schedule_dense_packed(a, w, c, d)
    func = lower(s, "dense")
    text = analysis.format_func(func)
    assert "alloc C.local: float32[8x32] local" in text
    assert len([st for st in stmts_of(func, tir.Store) if st.buffer.name == "D"]) >= 1
    x, wt, b = rand(m, k_), rand(n, k_), rand(n)
    (lt,) = s.layout_transforms
    check(func, [x, b, lt.pack(wt)], [np.maximum(x @ wt.T + b, 0)])


def test_dense_register_tile_reads_panels_contiguously() -> None:
    """With dividing sizes the packed weight read in the micro-kernel is `W.packed[panel, k, j]`:
    the vectorized loop variable appears alone in the last index (a contiguous vector load)."""
    a, w, _, c, d = dense_bias_relu(64, 64, 16)
    func = lower(schedule_dense_packed(a, w, c, d), "dense")
    assert not stmts_of(func, tir.IfThenElse)
    inner = [f for f in fors(func) if f.kind is tir.ForKind.VECTORIZED and isinstance(f.body, tir.Store)
             and f.body.buffer.name == "C.local"]
    assert inner
    loads = [n for n in te.iter_exprs(inner[-1].body.value) if isinstance(n, tir.Load)]  # type: ignore[attr-defined]
    panel = next(ld for ld in loads if ld.buffer.name == "W.packed")
    assert panel.indices[2] is inner[-1].var


@pytest.mark.parametrize("pad_mode", ["inline", "at"])
@pytest.mark.parametrize("geometry", [(1, 3, 7, 9, 10, 3, 1, 1), (2, 4, 9, 8, 6, 3, 1, 2)])
def test_conv2d_bias_relu(pad_mode: str, geometry: tuple[int, ...]) -> None:
    n, c, h, w, f, kh, pad, stride = geometry
    _, _, _, padded, conv, relu = conv2d_relu(n, c, h, w, f, kh, pad, stride)
    func = lower(schedule_conv(padded, conv, relu, pad_mode))
    buffers = {a.buffer.name: a.buffer for a in stmts_of(func, tir.Allocate)}
    if pad_mode == "inline":
        assert "pad" not in buffers
    else:
        # one output row x 4 columns needs (kh) rows and 4*stride + kh - stride columns of padding
        assert buffers["pad"].shape == (1, c, kh, 3 * stride + kh)
    d, wt, b = rand(n, c, h, w), rand(f, c, kh, kh), rand(f)
    check(func, [d, wt, b], [conv2d_relu_ref(d, wt, b, pad, stride)])


def test_softmax_with_reductions_computed_at_the_row() -> None:
    rows, cols = 5, 19
    a = te.placeholder((rows, cols), "float32", "A")
    k1, k2 = te.reduce_axis(cols, "k1"), te.reduce_axis(cols, "k2")
    mx = te.compute((rows,), lambda i: te.max(a[i, k1], axis=k1), "max")
    ex = te.compute((rows, cols), lambda i, j: te.exp(a[i, j] - mx[i]), "exp")
    sm = te.compute((rows,), lambda i: te.sum(ex[i, k2], axis=k2), "sum")
    out = te.compute((rows, cols), lambda i, j: ex[i, j] / sm[i], "softmax")
    x = rand(rows, cols)
    ref = np.exp(x - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    check(lower(Schedule(out)), [x], [ref], rtol=1e-5, atol=1e-6)
    s = Schedule(out)
    for stage in (mx, ex, sm):
        s.compute_at(stage, out, "i")
    s.parallel(out, "i")
    _, ji = s.split(out, "j", factor=8)
    s.vectorize(out, ji)
    func = lower(s)
    assert {a.buffer.name: a.buffer.shape for a in stmts_of(func, tir.Allocate)} == {
        "max": (1,), "exp": (1, cols), "sum": (1,)
    }
    check(func, [x], [ref], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# tails: peeling instead of guards
# ------------------------------------------------------------------------------------------------


def test_tails_are_peeled_not_guarded() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    io, jo, ii, ji = s.tile(c, "i", "j", 8, 16)
    ko, ki = s.split(c, "k", factor=16)
    s.reorder(c, io, jo, ko, ki, ii, ji)
    s.unroll(c, ii)
    s.vectorize(c, ji)
    func = check_matmul(s)
    assert not stmts_of(func, tir.IfThenElse)
    vector_extents = sorted({f.extent for f in fors(func) if f.kind is tir.ForKind.VECTORIZED})
    assert vector_extents == [5, 16]  # 53 = 3 * 16 + 5: main part and tail, both constant
    assert sorted({f.extent for f in fors(func) if f.kind is tir.ForKind.UNROLLED}) == [5, 8]


def _selects(func: tir.PrimFunc) -> int:
    return sum(isinstance(e, tir.Select) for st in stmts_of(func, tir.Store) for e in te.iter_exprs(st.value))


def test_concatenation_loops_are_cut_where_the_input_changes() -> None:
    """A concatenation along its innermost axis (then along a middle one) is a chain of selects on the loop
    variable: lowering cuts the loop at each input's edge, so every part copies from one input, vectorised, with
    no per-element choice; where the edge moves with an enclosing loop (`i + j < 7`), the selects stay."""
    a, b, c = te.placeholder((3, 5), "float32", "A"), te.placeholder((3, 11), "float32", "B"), \
        te.placeholder((3, 2), "float32", "C")

    # reads in a branch not taken are clamped into their buffer by lowering (speculative loads)
    out = te.compute((3, 18), lambda i, j: te.if_then_else(j < 5, a[i, j], te.if_then_else(j < 16, b[i, j - 5],
                                                                                             c[i, j - 16])), "cat")
    s = Schedule(out)
    s.vectorize(out, "j")
    func = lower(s)
    x, y, z = rand(3, 5), rand(3, 11), rand(3, 2)
    check(func, [x, y, z], [np.concatenate([x, y, z], axis=1)])
    assert _selects(func) == 0
    assert sorted(f.extent for f in fors(func) if f.kind is tir.ForKind.VECTORIZED) == [2, 5, 11]
    moving = te.compute((3, 18), lambda i, j: te.if_then_else(i + j < 7, a[i, j % 5], 0.0), "moving")
    func = lower(Schedule(moving))
    want = np.where(np.add.outer(np.arange(3), np.arange(18)) < 7, x[:, np.arange(18) % 5], 0.0)
    check(func, [x], [want.astype(np.float32)])
    assert _selects(func) == 1


def _versions(func: tir.PrimFunc) -> list[tir.IfThenElse]:
    return [s for s in stmts_of(func, tir.IfThenElse) if s.else_body is not None]  # type: ignore[misc]


def _guarded_vector_loops(stmt: tir.Stmt) -> int:
    """Vectorized loops with a test inside them."""
    return sum(isinstance(s, tir.For) and s.kind is tir.ForKind.VECTORIZED
               and any(isinstance(t, tir.IfThenElse) for t in analysis.iter_stmts(s.body))
               for s in analysis.iter_stmts(stmt))


def test_tails_under_a_fused_loop_are_versioned() -> None:
    """A fused outer loop makes the tail position symbolic (`f // 5 * 16 + j < 53`): the nest below is versioned,
    a guard-free copy for the whole tiles and the guarded one for the tail, both correct."""
    _, _, c = matmul()
    s = Schedule(c)
    io, jo, ii, ji = s.tile(c, "i", "j", 8, 16)
    s.reorder(c, jo, io, "k", ii, ji)
    s.parallel(c, s.fuse(c, jo, io))
    s.vectorize(c, ji)
    func = check_matmul(s)
    versions = _versions(func)
    assert versions
    assert any(_guarded_vector_loops(v.then_body) == 0 and fors_in(v.then_body, tir.ForKind.VECTORIZED)
               for v in versions)


def fors_in(stmt: tir.Stmt, kind: tir.ForKind) -> list[tir.For]:
    return [s for s in analysis.iter_stmts(stmt) if isinstance(s, tir.For) and s.kind is kind]


@pytest.mark.parametrize("m,n,k,tile_m,tile_n", [
    (40, 6625 % 97, 12, 6, 16),  # both tails (40 = 6 * 6 + 4, 29 = 16 + 13)
    (13, 32, 5, 4, 16),  # a row tail only
    (16, 17, 3, 8, 16),  # a one-column tail
    (24, 48, 7, 8, 16),  # tiles divide: nothing to version
])
def test_versioned_accumulator_tiles_match_numpy(m: int, n: int, k: int, tile_m: int, tile_n: int) -> None:
    """The dense template's nest: a register accumulator computed at the fused parallel block loop, with row and
    column tails under it; init, update and the copy-out are each versioned."""
    *_, c, d = dense_bias_relu(m, n, k)
    s = Schedule(d)
    acc = s.cache_write(c, "local")
    io, jo, ii, ji = s.tile(d, "i", "j", tile_m, tile_n)
    s.reorder(d, jo, io, ii, ji)
    fused = s.fuse(d, jo, io)
    s.parallel(d, fused)
    s.vectorize(d, ji)
    s.compute_at(acc, d, fused)
    s.compute_inline(c)
    *spatial, kk = s.leaves(acc)
    s.reorder(acc, kk, *spatial)
    s.vectorize(acc, spatial[-1])
    func = lower(s, "dense")
    x, wt, b = rand(m, k), rand(n, k), rand(n)
    check(func, [x, wt, b], [np.maximum(x @ wt.T + b, 0.0)])
    tails = m % tile_m or n % tile_n
    assert bool(_versions(func)) == bool(tails)
    if n % tile_n == 0:
        assert _guarded_vector_loops(func.body) == 0


def test_extent_one_loops_are_elided() -> None:
    _, _, c = matmul(16, 16, 4)
    s = Schedule(c)
    s.split(c, "i", factor=16)
    func = lower(s)
    assert "i.0" not in {f.var.name for f in fors(func)}


# ------------------------------------------------------------------------------------------------
# random schedules
# ------------------------------------------------------------------------------------------------

SMALL = (11, 13, 7)
SMALL_A, SMALL_B = rand(SMALL[0], SMALL[2]), rand(SMALL[2], SMALL[1])


@st.composite
def matmul_schedules(draw: st.DrawFn) -> list[dict[str, object]]:
    """Random but valid step lists for the small matmul, as JSON dicts."""
    _, _, c = matmul(*SMALL)
    s = Schedule(c)
    stage = "C"
    if draw(st.booleans()):  # schedule an accumulator stage computed at a loop of the output
        stage = s.cache_write(c, "local")
        if draw(st.booleans()):
            s.tile("C", "i", "j", draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    for axis in ("i", "j", "k"):
        levels = draw(st.integers(1, 3))
        if levels == 2:
            s.split(stage, axis, factor=draw(st.integers(1, 9)))
        elif levels == 3:
            s.split(stage, axis, factors=(None, draw(st.integers(1, 4)), draw(st.integers(1, 5))))
    leaves = list(s.leaves(stage))
    s.reorder(stage, *draw(st.permutations(leaves)))
    leaves = list(s.leaves(stage))
    spatial = [lp for lp in leaves if not s[stage].loops[lp].is_reduce]
    if len(spatial) >= 2 and draw(st.booleans()):
        pos = leaves.index(spatial[0])
        if pos + 1 < len(leaves) and leaves[pos + 1] in spatial:
            s.fuse(stage, spatial[0], leaves[pos + 1])
            leaves = list(s.leaves(stage))
    if not s[stage].loops[leaves[-1]].is_reduce and draw(st.booleans()):
        s.vectorize(stage, leaves[-1])
    if not s[stage].loops[leaves[0]].is_reduce and draw(st.booleans()):
        s.parallel(stage, leaves[0])
    if len(leaves) > 2 and draw(st.booleans()):
        s.unroll(stage, leaves[1])
    if "C.local" in s.stages:
        out_loops = s.leaves("C")
        s.compute_at("C.local", "C", draw(st.sampled_from(out_loops)))
    return s.steps_json()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(matmul_schedules())
def test_random_schedules_preserve_results(steps: list[dict[str, object]]) -> None:
    _, _, c = matmul(*SMALL)
    s = Schedule.replay(steps, c)
    func = lower(s)
    out = np.zeros((SMALL[0], SMALL[1]), "float32")
    evaluate(func, SMALL_A, SMALL_B, out)
    np.testing.assert_allclose(out, SMALL_A @ SMALL_B, rtol=1e-4, atol=1e-4)


@st.composite
def conv_schedules(draw: st.DrawFn) -> tuple[tuple[int, ...], list[dict[str, object]]]:
    """A small conv2d (random padding and stride) with random splits and loop orders, an optional
    accumulator stage at a random output loop, and the padding inlined, at a random loop, or at the root."""
    geometry = (1, 3, 7, 6, 5, 3, draw(st.sampled_from([0, 1, 2])), draw(st.sampled_from([1, 2])))
    _, _, _, padded, conv, relu = conv2d_relu(*geometry)
    s = Schedule(relu)
    reduction = "conv"
    if draw(st.booleans()):
        reduction = s.cache_write(conv, "local")
        s.compute_inline(conv)
    for axis in ("f", "y", "x"):
        if draw(st.booleans()):
            s.split("relu", axis, factor=draw(st.integers(1, 4)))
    s.reorder("relu", *draw(st.permutations(s.leaves("relu"))))
    if reduction != "conv":
        s.compute_at(reduction, "relu", draw(st.sampled_from(s.leaves("relu"))))
    for axis in ("rc", "ry", "x"):
        if draw(st.booleans()):
            s.split(reduction, axis, factor=draw(st.integers(1, 3)))
    s.reorder(reduction, *draw(st.permutations(s.leaves(reduction))))
    placement = draw(st.sampled_from(["inline", "at", "root"]))
    if placement == "inline":
        s.compute_inline(padded)
    elif placement == "at":
        s.compute_at(padded, reduction, draw(st.sampled_from(s.leaves(reduction))))
    return geometry, s.steps_json()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_schedules())
def test_random_conv2d_schedules_preserve_results(case: tuple[tuple[int, ...], list[dict[str, object]]]) -> None:
    geometry, steps = case
    _, _, _, _, _, relu = conv2d_relu(*geometry)
    n, c, h, w, f, kh, pad, stride = geometry
    d, wt, b = rand(n, c, h, w), rand(f, c, kh, kh), rand(f)
    check(lower(Schedule.replay(steps, relu)), [d, wt, b], [conv2d_relu_ref(d, wt, b, pad, stride)], compiled=False)


# ------------------------------------------------------------------------------------------------
# replay
# ------------------------------------------------------------------------------------------------


def _build_schedules() -> list[tuple[Callable[[], tuple[te.Tensor, ...]], Callable[..., Schedule]]]:
    def dense() -> tuple[te.Tensor, ...]:
        return dense_bias_relu(37, 53, 29)

    def conv() -> tuple[te.Tensor, ...]:
        return conv2d_relu(1, 4, 9, 8, 6, 3, 1, 2)

    return [
        (dense, lambda a, w, bias, c, d: schedule_dense_packed(a, w, c, d)),
        (conv, lambda data, weight, bias, padded, conv, relu: schedule_conv(padded, conv, relu, "at")),
    ]


@pytest.mark.parametrize("case", range(2))
def test_replay_from_json_gives_the_same_kernel(case: int) -> None:
    make, schedule = _build_schedules()[case]
    original = schedule(*make())
    text = json.dumps(original.steps_json())
    steps = [step_from_json(d) for d in json.loads(text)]
    assert steps == original.steps
    fresh = make()  # a new, identical tensor graph (as a tuning worker would build)
    replayed = Schedule.replay(steps, fresh[-1])
    assert analysis.structurally_equal(lower(original), lower(replayed))
    assert replayed.layout_transforms == original.layout_transforms


def test_step_json_is_plain_data() -> None:
    step = Split("C", "i", (None, 8))
    assert step.to_json() == {"kind": "split", "stage": "C", "loop": "i", "factors": [None, 8]}
    assert step_from_json(step.to_json()) == step
    with pytest.raises(ScheduleError, match="unknown schedule step"):
        step_from_json({"kind": "teleport"})
    with pytest.raises(ScheduleError, match="missing field"):
        step_from_json({"kind": "split", "stage": "C"})


# ------------------------------------------------------------------------------------------------
# invalid schedules
# ------------------------------------------------------------------------------------------------


def _fresh() -> tuple[Schedule, te.Tensor]:
    _, _, c = matmul()
    return Schedule(c), c


@pytest.mark.parametrize(
    ("apply", "message"),
    [
        (lambda s, c: s.split(c, "q", factor=4), "no loop 'q'"),
        (lambda s, c: (s.split(c, "i", factor=4), s.split(c, "i", factor=2)), "already split"),
        (lambda s, c: s.split(c, "i", factor=0), "positive"),
        (lambda s, c: s.split(c, "i", factors=(4, 4)), "exactly one None"),
        (lambda s, c: s.split(c, "i"), "exactly one of"),
        (lambda s, c: s.vectorize(c, "k"), "reduction loop"),
        (lambda s, c: s.parallel(c, "k"), "reduction loop"),
        (lambda s, c: s.bind(c, "k", "threadIdx.x"), "reduction loop"),
        (lambda s, c: s.bind(c, "i", "warp.x"), "unknown thread tag"),
        (lambda s, c: (s.bind(c, "i", "threadIdx.x"), s.bind(c, "j", "threadIdx.x")), "already bound"),
        (lambda s, c: s.fuse(c, "i", "k"), "not adjacent"),
        (lambda s, c: s.fuse(c, "j", "k"), "spatial and reduction"),
        (lambda s, c: s.reorder(c, "i", "i"), "twice"),
        (lambda s, c: s.compute_inline(c), "output"),
        (lambda s, c: s.split("A", "i", factor=2), "input"),
        (lambda s, c: s.transform_layout(c, "MN", "MN8n"), "only kernel inputs"),
        (lambda s, c: s.transform_layout("B", "KN", "KN8x"), "distinct axis"),
        (lambda s, c: s.transform_layout("B", "KN", "K4n"), "each axis"),
        (lambda s, c: s.cache_write(c, "texture"), "memory scope"),
        (lambda s, c: (s.split(c, "i", factor=4), s.cache_write(c, "local")), "already scheduled"),
        (lambda s, c: s.cache_read("A", "shared", ["B"]), "only computed stages|does not read"),
        (lambda s, c: s.stage_name("Z"), "no stage named"),
        (lambda s, c: (s.vectorize(c, "j"), s.split(c, "j", factor=4)), "split before annotating"),
    ],
)
def test_invalid_steps_raise_schedule_errors(apply: Callable[[Schedule, te.Tensor], object], message: str) -> None:
    s, c = _fresh()
    with pytest.raises(ScheduleError, match=message):
        apply(s, c)


def test_schedule_error_is_a_user_error() -> None:
    from relay_tune.errors import RelayTuneError

    assert issubclass(ScheduleError, RelayTuneError)


def test_outputs_must_be_distinct_computed_tensors() -> None:
    a, _, c = matmul()
    with pytest.raises(ScheduleError, match="listed twice"):
        Schedule([c, c])
    with pytest.raises(ScheduleError, match="input placeholder"):
        Schedule([a])
    with pytest.raises(ScheduleError, match="at least one"):
        Schedule([])


def test_reduction_cannot_be_inlined() -> None:
    _, _, c = matmul()
    d = te.compute(c.shape, lambda i, j: c[i, j] * 2.0, "D")
    s = Schedule(d)
    with pytest.raises(ScheduleError, match="reduction"):
        s.compute_inline(c)


def test_errors_found_when_lowering() -> None:
    _, _, c = matmul()
    s = Schedule(c)
    s.vectorize(c, "i")
    with pytest.raises(ScheduleError, match="innermost"):
        lower(s)

    s = Schedule(c)
    s.split(c, "i", factor=4)
    s.parallel(c, "i.0")
    s.parallel(c, "i.1")
    with pytest.raises(ScheduleError, match="nested inside another parallel"):
        lower(s)

    # a producer computed inside one consumer but also read by another stage at the root
    a = te.placeholder((8,), "float32", "A")
    b = te.compute((8,), lambda i: a[i] + 1.0, "B")
    c1 = te.compute((8,), lambda i: b[i] * 2.0, "C1")
    c2 = te.compute((8,), lambda i: b[i] + c1[i], "C2")
    s = Schedule(c2)
    s.compute_at(b, c1, "i")
    with pytest.raises(ScheduleError, match="also read by C2"):
        lower(s)

    # compute_at a loop that was transformed afterwards is refused at the step
    s = Schedule(c2)
    s.compute_at(b, c2, "i")
    with pytest.raises(ScheduleError, match="computed at loop"):
        s.split(c2, "i", factor=2)


def test_compute_at_needs_a_consumer() -> None:
    a = te.placeholder((8,), "float32", "A")
    b = te.compute((8,), lambda i: a[i] + 1.0, "B")
    c = te.compute((8,), lambda i: a[i] * 2.0, "C")
    d = te.compute((8,), lambda i: b[i] + c[i], "D")
    s = Schedule(d)
    with pytest.raises(ScheduleError, match="does not read"):
        s.compute_at(b, c, "i")


# ------------------------------------------------------------------------------------------------
# compiled code (needs the LLVM CPU back end)
# ------------------------------------------------------------------------------------------------

def test_dense_1024_packed_schedule_computes_the_product() -> None:
    """The dense schedule built only from schedule primitives, compiled serial and parallel, on a 1024^3 product
    (tails none, packing and k-blocking real). Its speed against numpy is a benchmark's job
    (`python -m experiments kernels --only dense`), not a test's: timings on a shared machine would make this
    flaky."""
    size = 1024
    a, w, _, c, _ = dense_bias_relu(size, size, size)
    x, wt = rand(size, size), rand(size, size)
    for parallel in (False, True):
        s = schedule_dense_packed(a, w, c, c, parallel=parallel)
        kernel = build_llvm([lower(s, "dense")]).get("dense")
        out = np.full((size, size), np.nan, "float32")
        kernel(x, s.layout_transforms[0].pack(wt), out)
        np.testing.assert_allclose(out, x @ wt.T, rtol=1e-3, atol=1e-2)
