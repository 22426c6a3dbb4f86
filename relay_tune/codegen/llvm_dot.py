"""The four-term uint8 x int8 dot products (`tir.DOT4_INTRINSICS`) as LLVM IR.

Operands arrive as `<4n x i8>` vectors, four bytes per int32 lane of the result (`n` lanes). Three lowerings:

- `vpdpbusd` (AVX512-VNNI, AVX-VNNI): one instruction per register of lanes, exact, and it adds into the
  accumulator itself;
- `vpmaddubsw` + `vpmaddwd` with ones (SSSE3 / AVX2 / AVX512BW): the first multiplies bytes and sums pairs into
  int16 with saturation, so it runs once for `dot4_u8s8_i32_pairs16`, whose pairs the caller proved to fit, and
  twice for `dot4_u8s8_i32`, on the two halves of the weight bytes (`b >> 1` and the rest: each in [-64, 64]);
  the sums are added to the accumulator by an inline-assembly vpaddd on VEX targets (`opaque_add`);
- generic IR (zero/sign extension, multiply, add of the four products) everywhere else, exact.

The two-term uint8 x int16 product (`tir.DOT2_INTRINSIC`, full-range int8 weights stored as int16 pairs) is one
`vpmaddwd` per register of lanes on x86 (exact: two int16 products summed into int32), added to its accumulator by
an inline-assembly vpaddd where the target has the VEX forms (`opaque_add`), generic IR elsewhere.

The two-term bfloat16 product into float32 (`tir.DOT2_BF16_INTRINSIC`, bf16 builds) is one vdpbf16ps per register
of lanes with AVX512_BF16, and elsewhere the pairs widened to float32 by a 16-bit shift and two fused multiply-adds.

The x86 forms work on whole registers: the operand bytes are padded with zeros to a multiple of the register (a
zero byte adds nothing) and the lanes of the result taken back.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.ir as ir

from relay_tune.target import DotFeatures

I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)

Declare = Callable[[str, ir.Type, list[ir.Type]], ir.Function]


def _vector(element: ir.Type, lanes: int) -> ir.VectorType:
    return ir.VectorType(element, lanes)


def _pick(builder: ir.IRBuilder, value: ir.Value, indices: list[int]) -> ir.Value:
    """Elements of `value` at `indices`; an index past its end reads zero."""
    size = value.type.count
    zero = ir.Constant(value.type, None)
    mask = ir.Constant(_vector(I32, len(indices)), [i if i < size else size for i in indices])
    return builder.shuffle_vector(value, zero, mask)


def generic_dot4(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, lanes: int) -> ir.Value:
    """`<lanes x i32>` sums of four u8 x s8 products, exact, as plain integer IR."""
    wide = _vector(I32, 4 * lanes)
    products = builder.mul(builder.zext(a, wide), builder.sext(b, wide))
    total: ir.Value | None = None
    for k in range(4):
        term = _pick(builder, products, [4 * lane + k for lane in range(lanes)])
        total = term if total is None else builder.add(total, term)
    assert total is not None
    return total


def x86_dot4(builder: ir.IRBuilder, declare: Declare, features: DotFeatures, a: ir.Value, b: ir.Value, lanes: int,
             pairs_fit_int16: bool, acc: ir.Value | None) -> ir.Value | None:
    """`acc + dot` (`acc` may be None) with vpdpbusd or vpmaddubsw + vpmaddwd on whole registers, or None when the
    target has neither for this intrinsic (the caller then lowers it generically)."""
    if not (features.vnni or features.pmaddubsw):
        return None
    if not features.vnni and not pairs_fit_int16:
        # b = high + low with high = b >> 1 (arithmetic) and low = b - high, both in [-64, 64]: every pair of either
        # half has |w0| + |w1| <= 128, so two saturating products are exact. The halves of a weight row are
        # computed once per row (the tile's columns share the row, and LLVM merges the copies).
        high = builder.ashr(b, ir.Constant(b.type, [1] * b.type.count))
        low = builder.sub(b, high)
        first = x86_dot4(builder, declare, features, a, high, lanes, True, acc)
        return x86_dot4(builder, declare, features, a, low, lanes, True, first)
    total_bytes = 4 * lanes
    width = 16
    while width < total_bytes and width < features.register_bytes:
        width *= 2
    chunks = -(-total_bytes // width)
    per = width // 4  # int32 lanes per register
    pieces: list[ir.Value] = []
    for chunk in range(chunks):
        span = list(range(chunk * width, (chunk + 1) * width))
        ca, cb = _pick(builder, a, span), _pick(builder, b, span)
        cacc = None
        if acc is not None:
            cacc = _pick(builder, acc, list(range(chunk * per, (chunk + 1) * per)))
        if features.vnni:
            pieces.append(_vpdpbusd(builder, declare, ca, cb, cacc, width))
            continue
        pairs = builder.call(declare(PMADDUBSW_INTRINSICS[width], _vector(I16, width // 2), [ca.type, cb.type]),
                             [ca, cb])
        ones = ir.Constant(_vector(I16, width // 2), [1] * (width // 2))
        sums = builder.call(declare(PMADDWD_INTRINSICS[width], _vector(I32, per), [pairs.type, pairs.type]),
                            [pairs, ones])
        if cacc is not None:
            sums = opaque_add(builder, cacc, sums) if features.vex else builder.add(cacc, sums)
        pieces.append(sums)
    return _joined(builder, pieces, lanes)


PMADDUBSW_INTRINSICS = {16: "llvm.x86.ssse3.pmadd.ub.sw.128", 32: "llvm.x86.avx2.pmadd.ub.sw",
                        64: "llvm.x86.avx512.pmaddubs.w.512"}
"""vpmaddubsw by register bytes."""
PMADDWD_INTRINSICS = {16: "llvm.x86.sse2.pmadd.wd", 32: "llvm.x86.avx2.pmadd.wd", 64: "llvm.x86.avx512.pmaddw.d.512"}
"""vpmaddwd by register bytes."""


def _vpdpbusd(builder: ir.IRBuilder, declare: Declare, a: ir.Value, b: ir.Value, acc: ir.Value | None,
              width: int) -> ir.Value:
    """vpdpbusd over one register: `acc` plus the four-byte dot products of every int32 lane (exact)."""
    per = width // 4
    acc_type = _vector(I32, per)
    if acc is None:
        acc = ir.Constant(acc_type, None)
    # LLVM 22 declares the byte operands as `<4n x i8>` (earlier versions as `<n x i32>`)
    fn = declare(f"llvm.x86.avx512.vpdpbusd.{width * 8}", acc_type, [acc_type, a.type, b.type])
    return builder.call(fn, [acc, a, b])


def generic_dot2(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, lanes: int) -> ir.Value:
    """`<lanes x i32>` sums of the two products per lane of `a` (`<2 lanes x i8>`, u8, or `<2 lanes x i16>`) and
    `b` (`<2 lanes x i16>` or `<2 lanes x i8>`, signed), exact, as plain integer IR."""
    wide = _vector(I32, 2 * lanes)
    products = builder.mul(builder.zext(a, wide) if a.type.element == I8 else builder.sext(a, wide),
                           builder.sext(b, wide))
    even = _pick(builder, products, [2 * lane for lane in range(lanes)])
    odd = _pick(builder, products, [2 * lane + 1 for lane in range(lanes)])
    return builder.add(even, odd)


def x86_dot2(builder: ir.IRBuilder, declare: Declare, features: DotFeatures, a: ir.Value, b: ir.Value, lanes: int,
             acc: ir.Value | None) -> ir.Value | None:
    """`acc + dot2` (`acc` may be None) with one vpmaddwd per register of lanes (`a` zero-extended to int16 when
    it is uint8, `b` sign-extended when it is int8), or None when the target has no vpmaddwd (the caller then
    lowers it generically)."""
    if not features.pmaddubsw:  # every x86 target with vpmaddubsw has vpmaddwd at the same width
        return None
    a16 = builder.zext(a, _vector(I16, 2 * lanes)) if a.type.element == I8 else a
    if b.type.element == I8:  # int8 weights, sign-extended on load (vpmovsxbw)
        b = builder.sext(b, _vector(I16, 2 * lanes))
    total_bytes = 4 * lanes  # two int16 per int32 lane
    width = 16
    while width < total_bytes and width < features.register_bytes:
        width *= 2
    per = width // 4
    pieces: list[ir.Value] = []
    for chunk in range(-(-total_bytes // width)):
        span = list(range(chunk * 2 * per, (chunk + 1) * 2 * per))
        ca, cb = _pick(builder, a16, span), _pick(builder, b, span)
        sums = builder.call(declare(PMADDWD_INTRINSICS[width], _vector(I32, per), [ca.type, cb.type]), [ca, cb])
        if acc is not None:
            chunk_acc = _pick(builder, acc, list(range(chunk * per, (chunk + 1) * per)))
            sums = opaque_add(builder, chunk_acc, sums) if features.vex else builder.add(chunk_acc, sums)
        pieces.append(sums)
    return _joined(builder, pieces, lanes)


def opaque_add(builder: ir.IRBuilder, acc: ir.Value, value: ir.Value) -> ir.Value:
    """`acc + value` (`<n x i32>` filling one register) as one vpaddd that LLVM cannot reassociate.

    An unrolled reduction adds each product to its accumulator in turn; LLVM's x86 machine combiner regroups such
    chains of integer adds (`((acc + p1) + p2)` into `acc + (p1 + p2)`) to shorten the dependency path, which keeps
    the products live longer and makes a register tile of int16 products spill (its option is process-wide, so it
    is not switched off). Inside an inline-assembly add there is nothing to regroup; the accumulator chain stays
    the one the schedule wrote."""
    typ = acc.type
    constraint = "v" if typ.count * 4 == 64 else "x"  # zmm registers take the AVX-512 class
    asm_type = ir.FunctionType(typ, [typ, typ])
    return builder.asm(asm_type, "vpaddd $2, $1, $0", f"={constraint},{constraint},{constraint}", [acc, value],
                       False)


def _joined(builder: ir.IRBuilder, pieces: list[ir.Value], lanes: int) -> ir.Value:
    """The first `lanes` lanes of the registers `pieces` (equal `<n x i32>` vectors) concatenated."""
    while len(pieces) > 1:  # pairs of equal width at a time
        if len(pieces) % 2:
            pieces.append(ir.Constant(pieces[0].type, None))
        size = pieces[0].type.count
        joined = ir.Constant(_vector(I32, 2 * size), list(range(2 * size)))
        pieces = [builder.shuffle_vector(pieces[i], pieces[i + 1], joined) for i in range(0, len(pieces), 2)]
    result = pieces[0]
    if result.type.count != lanes:
        result = _pick(builder, result, list(range(lanes)))
    return result


# -- bfloat16 pairs into float32 lanes (`tir.DOT2_BF16_INTRINSIC`) ------------------------------------------------

F32 = ir.FloatType()


class _BFloat16Type(ir.Type):
    """LLVM's `bfloat` element type (llvmlite has none): vdpbf16ps's intrinsic takes `<2n x bfloat>` operands."""

    def _to_string(self) -> str:
        return "bfloat"


BF16 = _BFloat16Type()

DPBF16PS_INTRINSICS = {16: "llvm.x86.avx512bf16.dpbf16ps.128", 32: "llvm.x86.avx512bf16.dpbf16ps.256",
                       64: "llvm.x86.avx512bf16.dpbf16ps.512"}
"""vdpbf16ps by register bytes."""


def widened_dot2_bf16(builder: ir.IRBuilder, declare: Declare, a: ir.Value, b: ir.Value, lanes: int,
                      acc: ir.Value | None) -> ir.Value:
    """`<lanes x float>` of `acc + a0*b0 + a1*b1` per lane, `a` and `b` `<2 lanes x i16>` bfloat16 codes (the pair
    of a lane adjacent), on any CPU: each pair is one 32-bit word, whose low code becomes a float32 by a 16-bit left
    shift and whose high code by masking off the low half; then two fused multiply-adds (each product is exact in
    float32, so only the additions round)."""
    words = _vector(I32, lanes)
    floats = _vector(F32, lanes)

    def halves(value: ir.Value) -> tuple[ir.Value, ir.Value]:
        word = builder.bitcast(value, words)
        low = builder.shl(word, ir.Constant(words, [16] * lanes))
        high = builder.and_(word, ir.Constant(words, [-65536] * lanes))  # 0xFFFF0000
        return builder.bitcast(low, floats), builder.bitcast(high, floats)

    a0, a1 = halves(a)
    b0, b1 = halves(b)
    fmuladd = declare(f"llvm.fmuladd.v{lanes}f32", floats, [floats, floats, floats])
    start = acc if acc is not None else ir.Constant(floats, [0.0] * lanes)
    return builder.call(fmuladd, [a1, b1, builder.call(fmuladd, [a0, b0, start])])


def x86_dot2_bf16(builder: ir.IRBuilder, declare: Declare, features: DotFeatures, a: ir.Value, b: ir.Value,
                  lanes: int, acc: ir.Value | None) -> ir.Value | None:
    """`acc + dot2` (`acc` may be None) with one vdpbf16ps per register of lanes (AVX512_BF16), or None when the
    target has no vdpbf16ps (the caller then widens the operands)."""
    if not features.bf16:
        return None
    total_bytes = 4 * lanes  # two bfloat16 per float32 lane
    width = 16
    while width < total_bytes and width < features.register_bytes:
        width *= 2
    per = width // 4
    acc_type = _vector(F32, per)
    pair_type = _vector(BF16, 2 * per)
    fn = declare(DPBF16PS_INTRINSICS[width], acc_type, [acc_type, pair_type, pair_type])
    pieces: list[ir.Value] = []
    for chunk in range(-(-total_bytes // width)):
        span = list(range(chunk * 2 * per, (chunk + 1) * 2 * per))
        ca = builder.bitcast(_pick(builder, a, span), pair_type)
        cb = builder.bitcast(_pick(builder, b, span), pair_type)
        start = ir.Constant(acc_type, [0.0] * per)
        if acc is not None:
            lane_span = list(range(chunk * per, (chunk + 1) * per))
            mask = ir.Constant(_vector(I32, per), [i if i < lanes else lanes for i in lane_span])
            start = builder.shuffle_vector(acc, ir.Constant(acc.type, [0.0] * lanes), mask)
        pieces.append(builder.call(fn, [start, ca, cb]))
    while len(pieces) > 1:
        if len(pieces) % 2:
            pieces.append(ir.Constant(pieces[0].type, [0.0] * pieces[0].type.count))
        size = pieces[0].type.count
        joined = ir.Constant(_vector(I32, 2 * size), list(range(2 * size)))
        pieces = [builder.shuffle_vector(pieces[i], pieces[i + 1], joined) for i in range(0, len(pieces), 2)]
    result = pieces[0]
    if result.type.count != lanes:
        result = builder.shuffle_vector(result, ir.Constant(result.type, [0.0] * result.type.count),
                                        ir.Constant(_vector(I32, lanes), list(range(lanes))))
    return result
