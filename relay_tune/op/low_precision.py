"""Conversions to the low-precision element types with ONNX Cast semantics, and `reinterpret` (ONNX BitCast).

`convert` is the numpy reference of `cast`: ml_dtypes' conversion (round to nearest even; overflow gives inf or
NaN where the type has them, float4_e2m1fn saturates; a float out of a sub-byte integer's range gives 0), with
ONNX Cast's two attributes on top:

* `saturate` (float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz targets): values beyond the largest
  finite value, infinities included, clamp to it; NaN stays NaN.
* `round_mode` (float8_e8m0fnu targets, which hold powers of two): "up" rounds any value that is not a power of
  two to the next one, "down" truncates, "nearest" rounds by the bits below the exponent. Without `saturate` the
  step past 2^127 gives NaN. Signs are dropped (the type is unsigned); NaN and infinities give NaN.

`reinterpret(x, dtype)` keeps the bits of each element and reads them as `dtype`, of the same width.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.dtypes import E8M0_ROUND_MODES, SATURATING_FLOAT8_DTYPES, ml_dtypes_module
from relay_tune.ir.types import TensorType, Type
from relay_tune.op._shape import check_dtype, expect_arity, expect_tensor, numpy_dtype
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

register_op("reinterpret", 1, OpPattern.ELEMWISE, {"dtype": ""}, "relay.attrs.CastAttrs", required=("dtype",),
            description="the bits of each element read as another type of the same width (ONNX BitCast)")


def check_round_mode(round_mode: object, op_name: str = "cast") -> str:
    if round_mode not in E8M0_ROUND_MODES:
        raise RelayTypeError(f"round_mode must be one of {', '.join(E8M0_ROUND_MODES)}, got {round_mode!r}",
                             op_name=op_name)
    return str(round_mode)


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float8_e8m0fnu codes of `x` (as ONNX's reference rounds them), computed on the float32 bits."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)  # wide enough for the step past 0xFE
    special = exponent == 0xFF
    if round_mode == "nearest":
        guard = (bits & 0x400000) != 0
        rest = (bits & 0x3FFFFF) != 0
        up = guard & (rest | (exponent > 0))
    elif round_mode == "up":
        up = (bits & 0x7FFFFF) != 0
    else:
        up = np.zeros(bits.shape, dtype=bool)
    if saturate:
        up &= exponent != 0xFE
    codes = np.where(special, 0xFF, exponent + up).astype(np.uint8)
    return codes.view(ml_dtypes_module().float8_e8m0fnu)


def convert(x: np.ndarray, dtype: str, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """`x` converted to `dtype` as ONNX Cast converts (see the module docstring)."""
    target = numpy_dtype(dtype)
    x = np.asarray(x)
    if x.dtype == target:
        return x.copy()
    with np.errstate(all="ignore"):
        if dtype == "float8_e8m0fnu":
            return _to_e8m0(x.astype(np.float32), saturate, round_mode)
        if dtype in SATURATING_FLOAT8_DTYPES and saturate and x.dtype != np.bool_:
            info = ml_dtypes_module().finfo(target)
            wide = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
            return np.clip(wide, float(info.min), float(info.max)).astype(target)
        return x.astype(target)


@type_relation("reinterpret")
def _reinterpret_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 1, "reinterpret")
    x = expect_tensor(arg_types[0], "reinterpret")
    dtype = check_dtype(attrs["dtype"], "reinterpret")
    source, target = numpy_dtype(x.dtype), numpy_dtype(dtype)
    if source.itemsize != target.itemsize or _value_bits(x.dtype) != _value_bits(dtype):
        raise RelayTypeError(f"cannot reinterpret {x.dtype} as {dtype}: the types differ in width",
                             op_name="reinterpret")
    return TensorType(x.shape, dtype)


def _value_bits(dtype: str) -> int:
    """The bits one element holds: 8 per byte, the declared width of sub-byte types (bool is one byte)."""
    if dtype in ("int4", "uint4", "float4_e2m1fn"):
        return 4
    if dtype in ("int2", "uint2"):
        return 2
    return numpy_dtype(dtype).itemsize * 8


@reference("reinterpret")
def _reinterpret_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    # a C-ordered copy (np.ascontiguousarray would make a scalar one-dimensional)
    return np.array(inputs[0], order="C").view(numpy_dtype(attrs["dtype"]))
