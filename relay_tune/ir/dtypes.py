"""The low-precision element types: floats narrower than float16 and integers narrower than a byte.

Arrays of these types are numpy arrays of the ml_dtypes type of the same name, one element per byte (two for
bfloat16), a sub-byte element in the low bits of its byte. `FloatFormat` describes each float type by its bit
fields and special values, which is what the generic conversions of the code generator are parameterised by.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

LOW_PRECISION_FLOAT_DTYPES = frozenset({
    "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn",
})
SUB_BYTE_INT_DTYPES = frozenset({"int4", "uint4", "int2", "uint2"})
# The float8 types whose conversions take ONNX Cast's `saturate` (clamp overflow to the largest finite value).
SATURATING_FLOAT8_DTYPES = frozenset({"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"})
E8M0_ROUND_MODES = ("up", "down", "nearest")


LOW_PRECISION_DTYPES = LOW_PRECISION_FLOAT_DTYPES | SUB_BYTE_INT_DTYPES



def ml_dtypes_module() -> ModuleType:
    """The ml_dtypes module, imported on first use; from then on numpy knows the low-precision types by name
    (`np.dtype("bfloat16")`). The IR's tensor and buffer types call this when they see such a type, so a program
    without one never pays for the import."""
    # A model without low-precision types never needs ml_dtypes, which registers every cast between its types and
    # numpy's when imported.
    import ml_dtypes  # start-up: about a second to import

    return ml_dtypes


def is_low_precision(dtype: str) -> bool:
    """A float narrower than float16 or an integer narrower than a byte (an ml_dtypes type)."""
    return dtype in LOW_PRECISION_FLOAT_DTYPES or dtype in SUB_BYTE_INT_DTYPES


def sub_byte_bits(dtype: str) -> int:
    """The value bits of a sub-byte integer type (4 or 2)."""
    return int(dtype.removeprefix("u").removeprefix("int"))


@dataclass(frozen=True)
class FloatFormat:
    """A small binary float: sign bit (unless `unsigned`), `exponent_bits`, `mantissa_bits`, `bias`.

    `specials` says how infinities and NaNs are encoded:
    - "ieee": an all-ones exponent is inf (zero mantissa) or NaN (float8_e5m2, bfloat16),
    - "fn": finite only, all-ones exponent and mantissa is NaN (float8_e4m3fn),
    - "fnuz": finite only, no negative zero, the negative-zero code is the only NaN (the fnuz types),
    - "none": finite only, without NaN (float4_e2m1fn: ml_dtypes turns NaN into -0, overflow saturates),
    - "e8m0": unsigned powers of two, the all-ones code is NaN (float8_e8m0fnu).
    """

    dtype: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    specials: str

    @property
    def unsigned(self) -> bool:
        return self.specials == "e8m0"

    @property
    def storage_bits(self) -> int:
        return 16 if self.dtype == "bfloat16" else 8

    @property
    def sign_bit(self) -> int:
        return self.exponent_bits + self.mantissa_bits

    @property
    def max_code(self) -> int:
        """The magnitude code of the largest finite value."""
        all_ones = (1 << (self.exponent_bits + self.mantissa_bits)) - 1
        if self.specials == "ieee":
            return all_ones - (1 << self.mantissa_bits)  # the exponent below all ones, mantissa all ones
        if self.specials == "fn":
            return all_ones - 1
        return all_ones

    @property
    def nan_code(self) -> int | None:
        """The code of a positive NaN (the quiet NaN ml_dtypes writes), or None when there is no NaN."""
        if self.specials == "ieee":
            return (((1 << self.exponent_bits) - 1) << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))
        if self.specials == "fn":
            return (1 << (self.exponent_bits + self.mantissa_bits)) - 1
        if self.specials == "fnuz":
            return 1 << self.sign_bit
        if self.specials == "e8m0":
            return 0xFF
        return None

    @property
    def inf_code(self) -> int | None:
        if self.specials == "ieee":
            return ((1 << self.exponent_bits) - 1) << self.mantissa_bits
        return None


FLOAT_FORMATS: dict[str, FloatFormat] = {f.dtype: f for f in (
    FloatFormat("bfloat16", 8, 7, 127, "ieee"),
    FloatFormat("float8_e4m3fn", 4, 3, 7, "fn"),
    FloatFormat("float8_e4m3fnuz", 4, 3, 8, "fnuz"),
    FloatFormat("float8_e5m2", 5, 2, 15, "ieee"),
    FloatFormat("float8_e5m2fnuz", 5, 2, 16, "fnuz"),
    FloatFormat("float8_e8m0fnu", 8, 0, 127, "e8m0"),
    FloatFormat("float4_e2m1fn", 2, 1, 1, "none"),
)}
