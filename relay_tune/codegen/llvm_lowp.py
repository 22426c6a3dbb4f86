"""Conversions between float32 and the low-precision float types as LLVM IR integer arithmetic.

A value of a low-precision float type lives in registers and memory as its raw code (i16 for bfloat16, i8 for
the others); arithmetic on it is done in float32. `encode` and `decode` are written with integer and select
operations only (plus `llvm.rint`), so they work lane-wise on `<N x i32>` exactly like on scalars and vectorize.
They match ml_dtypes bit for bit (and ONNX Cast's `saturate`/`round_mode` on top), which the tests check for
every code and for float32 values around each rounding boundary.

One generic encoder serves every `FloatFormat` with a sign and a mantissa (float8 and float4 types):
normal results round the float32 bits to nearest even by integer addition, subnormal results are the float32
value scaled by a power of two and rounded with `rint` (exact: the scaled value is below 2^mantissa_bits).
Overflow, infinities and NaN are then replaced by the codes the format gives them.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.ir as ir

from relay_tune.ir.dtypes import FloatFormat

F32 = ir.FloatType()
I32 = ir.IntType(32)

Intrinsic = Callable[[str, ir.Type], ir.Function]


def _lanes(value: ir.Value) -> int:
    return value.type.count if isinstance(value.type, ir.VectorType) else 1


class LowPrecision:
    """Emits conversions with `builder`, for values of `lanes` lanes."""

    def __init__(self, builder: ir.IRBuilder, intrinsic: Intrinsic, lanes: int) -> None:
        self.b = builder
        self.intrinsic = intrinsic
        self.lanes = lanes

    def _type(self, element: ir.Type) -> ir.Type:
        return element if self.lanes == 1 else ir.VectorType(element, self.lanes)

    def i32(self, value: int) -> ir.Constant:
        value &= 0xFFFFFFFF
        if value >= 1 << 31:
            value -= 1 << 32
        typ = self._type(I32)
        return ir.Constant(typ, value) if self.lanes == 1 else ir.Constant(typ, [value] * self.lanes)

    def f32(self, value: float) -> ir.Constant:
        typ = self._type(F32)
        return ir.Constant(typ, value) if self.lanes == 1 else ir.Constant(typ, [value] * self.lanes)

    # -- float32 -> code ---------------------------------------------------------------------------------

    def encode(self, x: ir.Value, fmt: FloatFormat, saturate: bool = False, round_mode: str = "") -> ir.Value:
        """The codes (i8 or i16) of float32 `x` in `fmt`. `saturate` clamps overflow and infinities to the
        largest finite value (ONNX Cast on float8 types); `round_mode` is float8_e8m0fnu's ("" = nearest)."""
        b = self.b
        bits = b.bitcast(x, self._type(I32))
        if fmt.dtype == "bfloat16":
            code = self._encode_bfloat16(bits)
        elif fmt.specials == "e8m0":
            code = self._encode_e8m0(bits, saturate, round_mode or "nearest")
        else:
            code = self._encode_generic(bits, fmt, saturate)
        return b.trunc(code, self._type(ir.IntType(fmt.storage_bits)))

    def _encode_bfloat16(self, bits: ir.Value) -> ir.Value:
        b = self.b
        lsb = b.and_(b.lshr(bits, self.i32(16)), self.i32(1))
        rounded = b.lshr(b.add(b.add(bits, self.i32(0x7FFF)), lsb), self.i32(16))
        magnitude = b.and_(bits, self.i32(0x7FFFFFFF))
        is_nan = b.icmp_unsigned(">", magnitude, self.i32(0x7F800000))
        # NaN: the canonical quiet NaN with the input's sign, as ml_dtypes writes it
        quiet = b.or_(b.and_(b.lshr(bits, self.i32(16)), self.i32(0x8000)), self.i32(0x7FC0))
        return b.select(is_nan, quiet, rounded)

    def _encode_e8m0(self, bits: ir.Value, saturate: bool, round_mode: str) -> ir.Value:
        # ONNX's rounding (onnx.numpy_helper.to_float8e8m0): the float32 exponent, stepped up by the mantissa.
        b = self.b
        exponent = b.and_(b.lshr(bits, self.i32(23)), self.i32(0xFF))
        zero = self.i32(0)
        if round_mode == "up":
            up = b.icmp_unsigned("!=", b.and_(bits, self.i32(0x7FFFFF)), zero)
        elif round_mode == "nearest":
            guard = b.icmp_unsigned("!=", b.and_(bits, self.i32(0x400000)), zero)
            rest = b.icmp_unsigned("!=", b.and_(bits, self.i32(0x3FFFFF)), zero)
            up = b.and_(guard, b.or_(rest, b.icmp_unsigned("!=", exponent, zero)))
        else:
            up = b.icmp_unsigned("!=", zero, zero)
        if saturate:
            up = b.and_(up, b.icmp_unsigned("!=", exponent, self.i32(0xFE)))
        stepped = b.add(exponent, b.zext(up, self._type(I32)))  # 0xFE + 1 is NaN without saturation
        special = b.icmp_unsigned("==", exponent, self.i32(0xFF))
        return b.select(special, self.i32(0xFF), stepped)

    def _encode_generic(self, bits: ir.Value, fmt: FloatFormat, saturate: bool) -> ir.Value:
        b = self.b
        m = fmt.mantissa_bits
        emin = 1 - fmt.bias  # the smallest normal exponent
        sign = b.lshr(bits, self.i32(31))
        magnitude = b.and_(bits, self.i32(0x7FFFFFFF))
        # Normal results: round the float32 mantissa to `m` bits (ties to even) and rebias the exponent.
        shift = 23 - m
        lsb = b.and_(b.lshr(magnitude, self.i32(shift)), self.i32(1))
        rounded = b.add(b.add(magnitude, self.i32((1 << (shift - 1)) - 1)), lsb)
        normal = b.sub(b.lshr(rounded, self.i32(shift)), self.i32((127 - fmt.bias) << m))
        # Subnormal results: |x| / 2^(emin - m) rounded to an integer; 2^m there is the smallest normal code.
        absolute = b.bitcast(magnitude, self._type(F32))
        scaled = b.fmul(absolute, self.f32(2.0 ** (m - emin)))
        subnormal = b.fptoui(b.call(self.intrinsic("llvm.rint", scaled.type), [scaled]), self._type(I32))
        is_normal = b.icmp_unsigned(">=", magnitude, self.i32((emin + 127) << 23))
        code = b.select(is_normal, normal, subnormal)

        is_nan = b.icmp_unsigned(">", magnitude, self.i32(0x7F800000))
        beyond = b.icmp_signed(">", code, self.i32(fmt.max_code))  # overflow or infinity
        max_code = self.i32(fmt.max_code)
        sign_shifted = b.shl(sign, self.i32(fmt.sign_bit))
        nan_code = fmt.nan_code
        if fmt.specials == "none":  # float4_e2m1fn: overflow saturates; NaN gives the zero of the other sign
            code = b.select(beyond, max_code, code)
            signed = b.or_(code, sign_shifted)
            flipped_zero = b.shl(b.xor(sign, self.i32(1)), self.i32(fmt.sign_bit))
            return b.select(is_nan, flipped_zero, signed)
        assert nan_code is not None
        if saturate:
            code = b.select(beyond, max_code, code)
        elif fmt.specials == "ieee":
            assert fmt.inf_code is not None
            code = b.select(beyond, self.i32(fmt.inf_code), code)
        elif fmt.specials == "fn":
            code = b.select(beyond, self.i32(nan_code), code)
        signed = b.or_(code, sign_shifted)
        if fmt.specials == "fnuz":
            # No negative zero; the one NaN code (negative zero's) also stands for overflow without saturation.
            signed = b.select(b.icmp_unsigned("==", code, self.i32(0)), self.i32(0), signed)
            if not saturate:
                signed = b.select(beyond, self.i32(nan_code), signed)
            return b.select(is_nan, self.i32(nan_code), signed)
        return b.select(is_nan, b.or_(self.i32(nan_code), sign_shifted), signed)

    # -- code -> float32 ---------------------------------------------------------------------------------

    def decode(self, code: ir.Value, fmt: FloatFormat) -> ir.Value:
        """The float32 values of the codes `code` (i8 or i16) of `fmt` (exact: float32 holds them all)."""
        b = self.b
        c = b.zext(code, self._type(I32))
        if fmt.dtype == "bfloat16":
            return b.bitcast(b.shl(c, self.i32(16)), self._type(F32))
        nan = self.i32(0x7FC00000)
        if fmt.specials == "e8m0":
            bits = b.select(b.icmp_unsigned("==", c, self.i32(0)), self.i32(0x00400000), b.shl(c, self.i32(23)))
            bits = b.select(b.icmp_unsigned("==", c, self.i32(0xFF)), nan, bits)
            return b.bitcast(bits, self._type(F32))
        m = fmt.mantissa_bits
        magnitude = b.and_(c, self.i32((1 << fmt.sign_bit) - 1))
        exponent = b.lshr(magnitude, self.i32(m))
        mantissa = b.and_(magnitude, self.i32((1 << m) - 1))
        normal = b.add(b.shl(magnitude, self.i32(23 - m)), self.i32((127 - fmt.bias) << 23))
        subnormal = b.fmul(b.uitofp(mantissa, self._type(F32)), self.f32(2.0 ** (1 - fmt.bias - m)))
        bits = b.select(b.icmp_unsigned("==", exponent, self.i32(0)), b.bitcast(subnormal, self._type(I32)), normal)
        if fmt.specials == "ieee":
            inf_or_nan = b.select(b.icmp_unsigned("==", mantissa, self.i32(0)), self.i32(0x7F800000), nan)
            bits = b.select(b.icmp_unsigned("==", exponent, self.i32((1 << fmt.exponent_bits) - 1)), inf_or_nan, bits)
        elif fmt.specials == "fn":
            bits = b.select(b.icmp_unsigned("==", magnitude, self.i32((1 << fmt.sign_bit) - 1)), nan, bits)
        bits = b.or_(bits, b.shl(b.lshr(c, self.i32(fmt.sign_bit)), self.i32(31)))
        if fmt.specials == "fnuz":
            bits = b.select(b.icmp_unsigned("==", c, self.i32(1 << fmt.sign_bit)), nan, bits)
        return b.bitcast(bits, self._type(F32))
