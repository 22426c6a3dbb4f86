"""Values the LLVM code generator makes once and shares (constants, vector constants, an access's lane stride): what
is shared must be the same value wherever it is used, so the kernels still compute what numpy does."""

from __future__ import annotations

import numpy as np

from relay_tune.codegen.llvm import build_llvm, emit_llvm_ir
from relay_tune.kernel import tir
from relay_tune.kernel.tir import Buffer, For, ForKind, LoopVar, PrimFunc, Seq, Store
from relay_tune.target import Target

HOST = Target.host().with_cores(1)


def _signed_zeros() -> PrimFunc:
    """out[i, 0] = a[i] * 0.0 and out[i, 1] = a[i] * -0.0: equal as floats, different constants."""
    i = LoopVar("i")
    a, out = Buffer("a", (13,), "float32"), Buffer("out", (13, 2), "float32")
    body = For(i, 13, Seq((
        Store(out, (i, tir.IntImm(0, "int64")), tir.Load(a, (i,)) * tir.FloatImm(0.0, "float32")),
        Store(out, (i, tir.IntImm(1, "int64")), tir.Load(a, (i,)) * tir.FloatImm(-0.0, "float32")),
    )), ForKind.VECTORIZED)
    return PrimFunc("signed_zeros", (a, out), body)


def test_zero_and_negative_zero_stay_different_constants() -> None:
    a = np.random.default_rng(0).standard_normal(13).astype("float32")
    a[:4] = np.abs(a[:4]) + 0.5  # positive lanes: x * -0.0 is -0.0, x * 0.0 is +0.0
    out = np.full((13, 2), 7.0, dtype="float32")
    build_llvm([_signed_zeros()], HOST).get("signed_zeros")(a, out)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(np.stack([a * np.float32(0.0),
                                                                         a * np.float32(-0.0)], axis=1)))


def _one_read_two_nests(cols: int) -> PrimFunc:
    """The same `Load` object read by two loop nests whose vectorized loops have different extents: its lane
    stride and addresses are those of each nest (out1[r, c] = a[r, c] + 1 over c < cols, out2 over c < 3)."""
    r, c = LoopVar("r"), LoopVar("c")
    a = Buffer("a", (5, cols), "float32")
    out1, out2 = Buffer("out1", (5, cols), "float32"), Buffer("out2", (5, cols), "float32")
    read = tir.Load(a, (r, c))
    value = read + tir.FloatImm(1.0, "float32")
    first = For(r, 5, For(c, cols, Store(out1, (r, c), value), ForKind.VECTORIZED), ForKind.UNROLLED)
    second = For(r, 5, For(c, 3, Store(out2, (r, c), value), ForKind.VECTORIZED))
    return PrimFunc("two_nests", (a, out1, out2), Seq((first, second)))


def test_a_shared_read_in_two_nests_reads_each_nests_elements() -> None:
    cols = 11
    a = np.random.default_rng(1).standard_normal((5, cols)).astype("float32") + 0.25
    out1 = np.zeros((5, cols), dtype="float32")
    out2 = np.zeros((5, cols), dtype="float32")
    build_llvm([_one_read_two_nests(cols)], HOST).get("two_nests")(a, out1, out2)
    np.testing.assert_array_equal(out1, a + np.float32(1.0))
    np.testing.assert_array_equal(out2[:, :3], a[:, :3] + np.float32(1.0))
    np.testing.assert_array_equal(out2[:, 3:], 0.0)


def test_lowering_twice_gives_the_same_ir() -> None:
    """Shared values are per module: a second lowering prints exactly the first's text."""
    funcs = [_signed_zeros(), _one_read_two_nests(9)]
    assert emit_llvm_ir(funcs, HOST) == emit_llvm_ir(funcs, HOST)
