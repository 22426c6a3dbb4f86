"""Transcendental functions written as inline LLVM IR arithmetic (float32, scalar or vector).

LLVM has no vector form of exp/log/tanh/erf on the CPU: `llvm.exp.v16f32` is split into sixteen `expf`
calls, which would turn a vectorized epilogue back into scalar code. These functions are therefore
written as range reduction plus polynomials using only add/mul/select/bit operations, which work on
`<N x float>` exactly like on `float` and lower on any LLVM target (the NVPTX back end reuses them).

Accuracy (checked against float64 references in the tests): exp/log/sigmoid within a few ulp over the
finite range, tanh within about 4e-7, erf within about 4e-7 absolute. Special values follow C: exp(-inf)
= 0, exp(+inf) = inf, log(0) = -inf, log(x < 0) = NaN, NaN in gives NaN out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import llvmlite.ir as ir

F32 = ir.FloatType()
I32 = ir.IntType(32)

# Cephes-style constants. ln(2) is split into a part exactly representable with few mantissa bits and a
# small correction so that `x - n*ln2` loses no precision during range reduction.
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_LOG2E = 1.44269504088896341
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_LOG_POLY = (
    7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
    -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1,
)
# Rational minimax approximations (odd numerator / even denominator in x^2), as used by Eigen and XLA.
_TANH_CLAMP = 7.90531110763549805
_TANH_NUM = (
    -2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
    1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03,
)
_TANH_DEN = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
_ERF_NUM = (
    -2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
    -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02,
)
_ERF_DEN = (
    -1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
    -1.42647390514189e-02,
)


class Float32Math:
    """Emits float32 math at the builder's position. Works on scalars and on vectors of any width.

    `flags` are the fast-math flags for the arithmetic; they must not include `nnan`/`ninf` (the special
    value handling relies on them), so callers pass `("contract",)`.
    """

    def __init__(self, builder: ir.IRBuilder, intrinsic: Callable[[str, ir.Type], ir.Function]) -> None:
        self.b = builder
        self.intrinsic = intrinsic
        self.flags = ("contract",)

    # -- small helpers ------------------------------------------------------------------------------

    def const(self, value: float, like: ir.Value) -> ir.Constant:
        return _splat(like.type, value)

    def iconst(self, value: int, like: ir.Type) -> ir.Constant:
        return _splat(like, value)

    def int_type(self, like: ir.Value) -> ir.Type:
        if isinstance(like.type, ir.VectorType):
            return ir.VectorType(I32, like.type.count)
        return I32

    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fadd(a, b, flags=self.flags)

    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fsub(a, b, flags=self.flags)

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fmul(a, b, flags=self.flags)

    def div(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fdiv(a, b, flags=self.flags)

    def madd(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        """a * b + c; `contract` lets LLVM fuse it into one FMA."""
        return self.add(self.mul(a, b), c)

    def horner(self, x: ir.Value, coefficients: Sequence[float]) -> ir.Value:
        acc: ir.Value = self.const(coefficients[0], x)
        for c in coefficients[1:]:
            acc = self.madd(acc, x, self.const(c, x))
        return acc

    def clamp(self, x: ir.Value, low: float, high: float) -> ir.Value:
        # Ordered compares are false for NaN, so NaN passes through unchanged.
        x = self.b.select(self.b.fcmp_ordered(">", x, self.const(high, x)), self.const(high, x), x)
        return self.b.select(self.b.fcmp_ordered("<", x, self.const(low, x)), self.const(low, x), x)

    def call(self, name: str, *args: ir.Value) -> ir.Value:
        return self.b.call(self.intrinsic(name, args[0].type), list(args))

    def pow2i(self, n: ir.Value) -> ir.Value:
        """2**n for int32 n in the normal exponent range, built from the exponent bits."""
        biased = self.b.add(n, self.iconst(127, n.type))
        return self.b.bitcast(self.b.shl(biased, self.iconst(23, n.type)), _float_like(n.type))

    # -- functions ------------------------------------------------------------------------------------

    def exp(self, x: ir.Value) -> ir.Value:
        # exp(x) = 2**n * exp(r), n = round(x / ln2), |r| <= ln2 / 2.
        xc = self.clamp(x, -104.0, 88.8)
        n = self.call("llvm.roundeven", self.mul(xc, self.const(_LOG2E, xc)))
        r = self.madd(n, self.const(-_LN2_HI, xc), xc)
        r = self.madd(n, self.const(-_LN2_LO, xc), r)
        p = self.horner(r, _EXP_POLY)
        y = self.add(self.madd(p, self.mul(r, r), r), self.const(1.0, xc))
        ni = self.b.fptosi(n, self.int_type(xc))
        # 2**n can fall outside the normal range at the ends (n in [-150, 128]): scale in two halves.
        half = self.b.ashr(ni, self.iconst(1, ni.type))
        rest = self.b.sub(ni, half)
        y = self.mul(self.mul(y, self.pow2i(half)), self.pow2i(rest))
        return self.b.select(self.b.fcmp_unordered("uno", x, x), x, y)

    def log(self, x: ir.Value) -> ir.Value:
        b = self.b
        itype = self.int_type(x)
        # Subnormal inputs: scale into the normal range first and correct the exponent.
        subnormal = b.fcmp_ordered("<", x, self.const(1.17549435e-38, x))
        xs = b.select(subnormal, self.mul(x, self.const(8388608.0, x)), x)
        exponent_fix = b.select(subnormal, self.iconst(-23, itype), self.iconst(0, itype))
        bits = b.bitcast(xs, itype)
        exponent = b.and_(b.lshr(bits, self.iconst(23, itype)), self.iconst(0xFF, itype))
        exponent = b.add(b.sub(exponent, self.iconst(126, itype)), exponent_fix)
        # mantissa m in [0.5, 1): x = m * 2**exponent
        m = b.bitcast(b.or_(b.and_(bits, self.iconst(0x807FFFFF, itype)), self.iconst(0x3F000000, itype)), x.type)
        small = b.fcmp_ordered("<", m, self.const(0.707106781186547524, x))
        exponent = b.sub(exponent, b.zext(small, itype))
        f = b.select(small, self.sub(self.add(m, m), self.const(1.0, x)), self.sub(m, self.const(1.0, x)))
        fe = b.sitofp(exponent, x.type)
        z = self.mul(f, f)
        y = self.mul(self.mul(self.horner(f, _LOG_POLY), f), z)
        y = self.madd(fe, self.const(_LN2_LO, x), y)
        y = self.madd(z, self.const(-0.5, x), y)
        result = self.madd(fe, self.const(_LN2_HI, x), self.add(f, y))
        inf = self.const(float("inf"), x)
        result = b.select(b.fcmp_ordered("==", x, inf), inf, result)
        result = b.select(b.fcmp_ordered("==", x, self.const(0.0, x)), self.const(float("-inf"), x), result)
        # x < 0 and NaN: NaN
        return b.select(b.fcmp_unordered("<", x, self.const(0.0, x)), self.const(float("nan"), x), result)

    def tanh(self, x: ir.Value) -> ir.Value:
        xc = self.clamp(x, -_TANH_CLAMP, _TANH_CLAMP)
        x2 = self.mul(xc, xc)
        ratio = self.div(self.mul(self.horner(x2, _TANH_NUM), xc), self.horner(x2, _TANH_DEN))
        # Very small |x|: tanh(x) == x to float precision, and the ratio would lose relative accuracy.
        tiny = self.b.fcmp_ordered("<", self.call("llvm.fabs", x), self.const(0.0004, x))
        return self.b.select(tiny, x, ratio)

    def erf(self, x: ir.Value) -> ir.Value:
        # Outside [-4, 4] erf is +-1 in float32.
        xc = self.clamp(x, -4.0, 4.0)
        x2 = self.mul(xc, xc)
        return self.div(self.mul(self.horner(x2, _ERF_NUM), xc), self.horner(x2, _ERF_DEN))

    def sigmoid(self, x: ir.Value) -> ir.Value:
        one = self.const(1.0, x)
        return self.div(one, self.add(one, self.exp(self.b.fneg(x))))


def _float_like(int_type: ir.Type) -> ir.Type:
    if isinstance(int_type, ir.VectorType):
        return ir.VectorType(F32, int_type.count)
    return F32


def _splat(typ: ir.Type, value: float | int) -> ir.Constant:
    if isinstance(typ, ir.VectorType):
        return ir.Constant(typ, [value] * typ.count)
    return ir.Constant(typ, value)
