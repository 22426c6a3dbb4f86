"""Index arithmetic in the LLVM code generator: integer operations reused within their block, floor division of
operands known non-negative as unsigned division, and the results still those of numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest

from relay_tune.codegen.llvm import build_llvm, emit_llvm_ir
from relay_tune.kernel import tir
from relay_tune.kernel.tir import Buffer, For, ForKind, LoopVar, PrimFunc, Seq, Store
from relay_tune.target import Target

HOST = Target.host().with_cores(1)


def _count(ir_text: str, opcode: str) -> int:
    return len(re.findall(rf"= {opcode} ", ir_text))


def _gather_rows(rows: int, cols: int, unroll: int, offset: int) -> tuple[PrimFunc, Buffer, Buffer]:
    """out[f, u] = a[(f + offset) // cols, ((f + offset) % cols + u) % cols] over f in [0, rows * cols - offset) and
    an UNROLLED u: every unrolled copy divides the same fused index."""
    f, u = LoopVar("f"), LoopVar("u")
    a = Buffer("a", (rows + 2, cols), "float32")  # rows -1 .. rows + 1 of the shifted index, moved up one
    n = rows * cols
    out = Buffer("out", (n, unroll), "float32")
    shifted = f + tir.IntImm(offset, "int64") if offset >= 0 else f - tir.IntImm(-offset, "int64")
    row = tir.BinaryOp("floordiv", shifted, tir.IntImm(cols, "int64"))
    col = tir.BinaryOp("floormod", tir.BinaryOp("floormod", shifted, tir.IntImm(cols, "int64")) + u,
                       tir.IntImm(cols, "int64"))
    body = For(f, n, For(u, unroll, Store(out, (f, u), tir.Load(a, (row + tir.IntImm(1, "int64"), col))),
                         ForKind.UNROLLED))
    return PrimFunc("gather_rows", (a, out), body), a, out


def _expected(values: np.ndarray, rows: int, cols: int, unroll: int, offset: int) -> np.ndarray:
    f = np.arange(rows * cols)[:, None] + offset
    u = np.arange(unroll)[None, :]
    return values[f // cols + 1, (f % cols + u) % cols]


@pytest.mark.parametrize("offset", [0, 3, -5])
def test_floor_division_of_loop_indices_matches_numpy(offset: int) -> None:
    rows, cols, unroll = 6, 7, 4
    func, a, out = _gather_rows(rows, cols, unroll, offset)
    values = np.random.default_rng(1).standard_normal(a.shape).astype(np.float32)
    got = np.zeros(out.shape, np.float32)
    build_llvm([func], HOST).get(func.name)(values, got)
    np.testing.assert_array_equal(got, _expected(values, rows, cols, unroll, offset))


def test_non_negative_dividends_divide_unsigned_and_once_per_block() -> None:
    func, _, _ = _gather_rows(6, 7, 4, 3)
    text = emit_llvm_ir([func], HOST)
    # (f + 3) // 7 and (f + 3) % 7 of the four unrolled copies: one udiv and one urem; no signed fix-up (the outer
    # % 7 divides (f + 3) % 7 + u, in [0, 9]: non-negative too, once per copy since u differs).
    assert _count(text, "udiv") == 1
    assert _count(text, "sdiv") == 0 and _count(text, "srem") == 0
    assert _count(text, "urem") == 1 + 4


def test_a_possibly_negative_dividend_keeps_floor_semantics() -> None:
    func, _, _ = _gather_rows(6, 7, 4, -5)
    text = emit_llvm_ir([func], HOST)
    # f - 5 may be negative: (f - 5) // 7 and (f - 5) % 7 divide signed (each an sdiv and an srem), once for the
    # four copies; the outer % 7 of a floormod plus u is non-negative
    assert _count(text, "udiv") == 0 and _count(text, "sdiv") == 2 and _count(text, "srem") == 2
    assert _count(text, "urem") == 4


def test_reuse_does_not_cross_blocks() -> None:
    """An index computed inside one serial loop is computed again in the next loop's block, not taken from a block
    that does not dominate it (LLVM's verifier would reject the module; the results would be wrong)."""
    i, j = LoopVar("i"), LoopVar("j")
    a, out = Buffer("a", (12,), "float32"), Buffer("out", (2, 12), "float32")
    first = For(i, 12, Store(out, (tir.IntImm(0, "int64"), i),
                             tir.Load(a, (tir.BinaryOp("floormod", i + tir.IntImm(5, "int64"),
                                                       tir.IntImm(12, "int64")),))))
    second = For(j, 12, Store(out, (tir.IntImm(1, "int64"), j),
                              tir.Load(a, (tir.BinaryOp("floormod", j + tir.IntImm(5, "int64"),
                                                        tir.IntImm(12, "int64")),))))
    func = PrimFunc("two_loops", (a, out), Seq((first, second)))
    values = np.arange(12, dtype=np.float32) + 0.5
    got = np.zeros((2, 12), np.float32)
    build_llvm([func], HOST).get(func.name)(values, got)
    want = values[(np.arange(12) + 5) % 12]
    np.testing.assert_array_equal(got, np.stack([want, want]))
