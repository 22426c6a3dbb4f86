"""Hand-scheduled loop nests that exercise the code generator the way tuned schedules do.

They serve as performance baselines and as end-to-end tests of
vectorization, unrolling, register blocking and parallel loops, independently of the schedule layer.
"""

from __future__ import annotations

from relay_tune.errors import RelayTuneError
from relay_tune.kernel import tir


def packed_matmul(
    m: int,
    n: int,
    k: int,
    mr: int = 8,
    nr: int = 32,
    k_unroll: int = 4,
    name: str = "packed_matmul",
) -> tir.PrimFunc:
    """C[m, n] = A[m, k] @ B[k, n] in float32 with a register-blocked micro-kernel.

    B is first copied into column panels `Bp[n // nr, k, nr]`, so that the micro-kernel reads `nr`
    consecutive floats per step of the reduction. The micro-kernel keeps an `mr x nr` tile of C in a
    local accumulator (unrolled over rows, vectorized over columns: with mr=8, nr=32 and AVX-512 that is
    16 vector registers), broadcasting one element of A per row and step. Both the packing and the
    compute loop run in parallel over the column panels; each panel (k * nr floats) stays in the
    core's L2 cache while the loop sweeps over the rows of A.
    """
    if m % mr or n % nr or k % k_unroll:
        raise RelayTuneError(f"packed_matmul needs m % {mr} == n % {nr} == k % {k_unroll} == 0, got {m}x{n}x{k}")
    a = tir.Buffer("A", (m, k))
    b = tir.Buffer("B", (k, n))
    c = tir.Buffer("C", (m, n))
    panels = tir.Buffer("Bp", (n // nr, k, nr))
    acc = tir.Buffer("acc", (mr, nr), scope=tir.Scope.LOCAL)

    # packing: Bp[jo, kk, ji] = B[kk, jo * nr + ji]
    jo, kk, ji = tir.LoopVar("pack_jo"), tir.LoopVar("pack_k"), tir.LoopVar("pack_ji")
    pack = tir.For(
        jo, n // nr,
        tir.For(kk, k, tir.For(ji, nr, tir.Store(panels, (jo, kk, ji), b[kk, jo * nr + ji]), tir.ForKind.VECTORIZED)),
        tir.ForKind.PARALLEL,
    )

    # compute
    po, io = tir.LoopVar("jo"), tir.LoopVar("io")
    ko, ku = tir.LoopVar("ko"), tir.LoopVar("ku")
    i, j = tir.LoopVar("i"), tir.LoopVar("j")
    i0, j0, i1, j1 = tir.LoopVar("i0"), tir.LoopVar("j0"), tir.LoopVar("i1"), tir.LoopVar("j1")
    kv = ko * k_unroll + ku
    init = tir.For(i0, mr, tir.For(j0, nr, tir.Store(acc, (i0, j0), tir.FloatImm(0.0)), tir.ForKind.VECTORIZED),
                   tir.ForKind.UNROLLED)
    update = tir.Store(acc, (i, j), acc[i, j] + a[io * mr + i, kv] * panels[po, kv, j])
    reduce = tir.For(
        ko, k // k_unroll,
        tir.For(ku, k_unroll,
                tir.For(i, mr, tir.For(j, nr, update, tir.ForKind.VECTORIZED), tir.ForKind.UNROLLED),
                tir.ForKind.UNROLLED),
    )
    write = tir.For(
        i1, mr,
        tir.For(j1, nr, tir.Store(c, (io * mr + i1, po * nr + j1), acc[i1, j1]), tir.ForKind.VECTORIZED),
        tir.ForKind.UNROLLED,
    )
    tile = tir.Allocate(acc, tir.seq(init, reduce, write))
    compute = tir.For(po, n // nr, tir.For(io, m // mr, tile), tir.ForKind.PARALLEL)
    body = tir.Allocate(panels, tir.seq(pack, compute))
    return tir.PrimFunc(name, (a, b, c), body)


def conv2d_nchwc(
    batch: int,
    in_channels: int,
    height: int,
    width: int,
    out_channels: int,
    kernel: int = 3,
    ow_block: int = 8,
    channel_block: int = 16,
    name: str = "conv2d_nchwc",
) -> tir.PrimFunc:
    """A stride-1 convolution in the blocked NCHW[x]c layout, float32, with a register-blocked inner loop.

    Parameters (the input is already padded, so the loop nest needs no bounds checks):
      data    [batch, in_channels // cb, height + kernel - 1, width + kernel - 1, cb]
      weight  [out_channels // cb, in_channels // cb, kernel, kernel, cb (in), cb (out)]
      out     [batch, out_channels // cb, height, width, cb]
    The micro-kernel accumulates `ow_block` output pixels x `cb` output channels (one vector each) and
    runs in parallel over output-channel blocks and rows.
    """
    cb = channel_block
    if in_channels % cb or out_channels % cb or width % ow_block:
        raise RelayTuneError(
            f"conv2d_nchwc needs channels divisible by {cb} and width by {ow_block}, got "
            f"{in_channels}->{out_channels} channels, width {width}"
        )
    ic_chunks, oc_chunks = in_channels // cb, out_channels // cb
    data = tir.Buffer("data", (batch, ic_chunks, height + kernel - 1, width + kernel - 1, cb))
    weight = tir.Buffer("weight", (oc_chunks, ic_chunks, kernel, kernel, cb, cb))
    out = tir.Buffer("out", (batch, oc_chunks, height, width, cb))
    acc = tir.Buffer("acc", (ow_block, cb), scope=tir.Scope.LOCAL)
    n, fused, owo = tir.LoopVar("n"), tir.LoopVar("ko_oh"), tir.LoopVar("owo")
    ico, r, s, ici = tir.LoopVar("ico"), tir.LoopVar("r"), tir.LoopVar("s"), tir.LoopVar("ici")
    w0, c0, w1, c1, w2, c2 = (tir.LoopVar(x) for x in ("w0", "c0", "w1", "c1", "w2", "c2"))
    ko, oh = fused // height, fused % height
    init = tir.For(w0, ow_block, tir.For(c0, cb, tir.Store(acc, (w0, c0), tir.FloatImm(0.0)), tir.ForKind.VECTORIZED),
                   tir.ForKind.UNROLLED)
    pixel = data[n, ico, oh + r, owo * ow_block + w1 + s, ici]
    update = tir.Store(acc, (w1, c1), acc[w1, c1] + pixel * weight[ko, ico, r, s, ici, c1])
    reduce = tir.For(ico, ic_chunks, tir.For(r, kernel, tir.For(s, kernel, tir.For(
        ici, cb, tir.For(w1, ow_block, tir.For(c1, cb, update, tir.ForKind.VECTORIZED), tir.ForKind.UNROLLED)))))
    write = tir.For(w2, ow_block, tir.For(
        c2, cb, tir.Store(out, (n, ko, oh, owo * ow_block + w2, c2), acc[w2, c2]), tir.ForKind.VECTORIZED),
        tir.ForKind.UNROLLED)
    body = tir.For(owo, width // ow_block, tir.Allocate(acc, tir.seq(init, reduce, write)))
    nest = tir.For(n, batch, tir.For(fused, oc_chunks * height, body, tir.ForKind.PARALLEL))
    return tir.PrimFunc(name, (data, weight, out), nest)
