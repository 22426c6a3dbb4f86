"""QuantizedProducts: float convolutions and dense products of dequantized 8-bit data run on the integers.

A QDQ model (onnxruntime's static quantizer) reaches the graph passes as

    xf = multiply(subtract(cast(q, "float32"), zx), sx)         # DequantizeLinear of uint8/int8 activations
    y  = nn.conv2d(xf, W) or nn.dense(xf, W)                   # W: a float constant, the dequantized int8 weight
    ... divide, round, add, clip, cast                         # QuantizeLinear of the result

The weight's integers are recovered exactly: `W` is accepted when `W / s` is an integer grid in [-127, 127] for
the whole-tensor scale `s = max|W| / 127` (`per_channel=False`) or for one such scale per output channel
(`per_channel=True`); a float weight that is not such a grid is left alone, so float models never change. The
product becomes

    acc = nn.conv2d(pad(q, zx), Wq, out_dtype="int32") - zx * sum(Wq)     # exact int32, uint8/int8 x int8
    y   = cast(acc, "float32") * (sx * s_c)

Zero-point padding is explicit (`nn.pad` with value `zx`, the quantized zero) so the convolution itself pads with
nothing; the correction `zx * sum(Wq)` per output channel is a constant. The requantization that follows (the
QuantizeLinear's divide, round, add, clip, cast) stays, except that a divide directly after the scale multiply is
folded into it (`cast(acc) * (sx * s_c / sy)`, one multiplier as in onnxruntime's requantization): FuseOps fuses it,
with the bias, into the integer product's kernel as its epilogue, and the next product reads the uint8 tensor
directly.

The int32 products the importer builds for ConvInteger, QLinearConv and MatMulInteger (`(cast(q, "int32") - zq)`
times a constant int32 weight) are narrowed the same way when the weight's values fit int8: the product reads the
8-bit tensors (a quarter of the bytes) and the zero point becomes padding and a constant correction.

Those whose weight does not fit int8 (onnxruntime's dynamically quantized models: uint8 weights with zero points
near 128, so `w - zw` spans about [-180, 140]) run as the float32 product of the same small integers, cast back to
int32: `cast(nn.conv2d(cast(q, "float32") - zq, float32(W)), "int32")`, the zero point constant or computed at run
time (DynamicQuantizeLinear's), so the fast float32 templates and layout planning take them. With K terms per sum,
the sums are exact while K * max|q - zq| * max|W| < 2^24 (every partial sum is then an integer float32 holds);
beyond that a sum may round, by a relative 2^-24 per addition, far below a quantization step of the requantized
result. Products whose bound reaches 2^31 stay int32, where the sums wrap as onnxruntime's do.

Where the target multiplies int16 pairs exactly and fast (`full_range_int8` "int16" or "dot4": x86), such a plain
convolution (groups and dilation 1) or dense product runs on int16 operands instead: `nn.conv2d(cast(cast(q,
"int32") - zq, "int16"), int16(W), out_dtype="int32")`, its padding zeros being the zero point's image, so a zero
point computed at run time needs neither a padding value nor a correction known at build time. Layout planning
makes it the packed int8 convolution with an int16 weight (vpmaddwd per channel pair, exact; a dense product of
M > 1 rows as one map of M pixels), which reads the int16 data the quantize kernel writes: on the dynamically
quantized CRNN (1 thread, in-graph, busy host) 0.61-0.67x the float products' time on its convolutions and
0.51-0.73x on its 32 x 1024 x 8210 classifier.

The result differs from the float graph only by float rounding (the integer sums are exact where the float
convolution rounds), well inside one quantization step.

Which products: at opt_level 4 every one it recognizes; at opt_level 3 (the default builds) those whose int8
weight has every pair of consecutive input channels within |w0| + |w1| <= 128 (onnxruntime's `reduce_range`
weights, |w| <= 64, always do), and the others too where the target multiplies full-range weights exactly and fast
(`PassConfig.full_range_int8`, from the target: `full_range_int8_mode`). Layout planning turns the integer products
into the packed int8 convolution (`relay_tune.op.quantized`), whose fitting pairs never saturate AVX2's vpmaddubsw:
one multiply-add sequence per four bytes, faster than the float products. Full-range weights take vpdpbusd with
VNNI ("dot4"); on x86 without VNNI ("int16") they are widened to int16 pairs and multiplied by vpmaddwd, exact and
faster than the float products (`python -m experiments int8` times both weight ranges). Elsewhere ("float") they
stay float by default; at opt_level 4 they take the exact two-halves vpmaddubsw path or generic code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relay_tune.ir import Call, Constant, Expr, Function, IRModule
from relay_tune.op.quantized import pairs_fit_int16
from relay_tune.passes.base import Pass, PassConfig, call_op, map_functions, register_pass, retype, rewrite_dataflow

# The largest weight magnitude of onnxruntime's symmetric int8 weights (-128 is never produced), and the grid ends
# tried when recovering them: the full range [-127, 127] and the reduced range [-64, 64] (`reduce_range=True`,
# weights that AVX2's saturating vpmaddubsw multiplies exactly).
_WEIGHT_MAX = 127
_GRID_PEAKS = (127, 64)
# Relative distance from the grid still taken as on it: the dequantized float32 weight is `q * s` rounded once.
_GRID_TOLERANCE = 1e-5
_QUANTIZED_DTYPES = ("uint8", "int8")
# Integer products whose sums could reach this are left in int32, whose sums wrap as onnxruntime's do.
_INT32_LIMIT = 2**31
_INT16_MAX = 2**15 - 1


@dataclass(frozen=True)
class Dequantized:
    """`(q - zero_point) * scale` of a quantized tensor `q` with scalar parameters."""

    q: Expr
    dtype: str
    zero_point: int
    scale: float

    def on(self, expr: Expr) -> Dequantized:
        """The same parameters with `q` taken from `expr`, a rebuilt copy of the matched dequantize (rewritten
        nodes carry no types, so matching runs on the typed original and the operand comes from the copy)."""
        inner = expr.args[0] if isinstance(expr, Call) and expr.op_name == "multiply" else expr
        if isinstance(inner, Call) and inner.op_name == "subtract":
            inner = inner.args[0]
        return Dequantized(inner.args[0], self.dtype, self.zero_point, self.scale)  # type: ignore[attr-defined]


def _scalar(expr: Expr) -> float | None:
    if isinstance(expr, Constant) and expr.data.size == 1:
        return float(expr.data.reshape(()))
    return None


def _dtype(expr: Expr) -> str | None:
    ty = expr.checked_type if expr.has_type() else None
    return getattr(ty, "dtype", None)


def match_dequantized(expr: Expr) -> Dequantized | None:
    """The quantized tensor, zero point and scale of `multiply(subtract(cast(q, f32), zp), s)` (the subtract may be
    absent) with scalar constant parameters and `q` uint8 or int8; None for anything else."""
    if not (isinstance(expr, Call) and expr.op_name == "multiply"):
        return None
    inner, scale = expr.args
    scale_value = _scalar(scale)
    if scale_value is None or not scale_value > 0:
        return None
    zero = 0.0
    if isinstance(inner, Call) and inner.op_name == "subtract":
        inner, zp = inner.args
        zp_value = _scalar(zp)
        if zp_value is None or zp_value != round(zp_value):
            return None
        zero = zp_value
    if not (isinstance(inner, Call) and inner.op_name == "cast" and _dtype(inner) == "float32"):
        return None
    q = inner.args[0]
    if _dtype(q) not in _QUANTIZED_DTYPES:
        return None
    dtype = str(_dtype(q))
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    if not lo <= zero <= hi:
        return None
    return Dequantized(q, dtype, int(zero), scale_value)


def match_widened(expr: Expr) -> Dequantized | None:
    """The 8-bit tensor and zero point of `subtract(cast(q, "int32"), zp)` (the subtract may be absent): the int32
    operands of the importer's ConvInteger/QLinearConv/MatMulInteger products. The scale is 1."""
    zero = 0
    if isinstance(expr, Call) and expr.op_name == "subtract":
        zp_value = _scalar(expr.args[1])
        if zp_value is None:
            return None
        expr, zero = expr.args[0], int(zp_value)
    if not (isinstance(expr, Call) and expr.op_name == "cast" and _dtype(expr) == "int32"):
        return None
    q = expr.args[0]
    dtype = str(_dtype(q))
    if dtype not in _QUANTIZED_DTYPES:
        return None
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    return Dequantized(q, dtype, zero, 1.0) if lo <= zero <= hi else None


def _on_grid(weight: np.ndarray, scales: np.ndarray) -> np.ndarray | None:
    """`weight / scales` rounded to int8 when every value lies on that grid, else None."""
    q = np.rint(weight / scales)
    if np.abs(q).max(initial=0) > _WEIGHT_MAX:
        return None
    if np.abs(q * scales - weight).max(initial=0) > _GRID_TOLERANCE * np.abs(scales).max(initial=1.0):
        return None
    return q.astype(np.int8)


def recover_int8_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`(q, s)` with `weight == q * s` (to float32 rounding), `q` int8 in [-127, 127] and `s` one scale per output
    channel (axis 0): the largest magnitude of the tensor (one scale for it) or of each channel (one scale per
    channel) is taken as a grid end of `_GRID_PEAKS`. None when `weight` is no such grid."""
    w = weight.astype(np.float64)
    rows = w.reshape(w.shape[0], -1)
    peak = np.abs(rows).max(axis=1)
    for grid_end in _GRID_PEAKS:
        whole = np.full_like(peak, np.abs(rows).max(initial=0) / grid_end)
        each = np.where(peak > 0, peak / grid_end, 1.0)
        for scales in (whole, each):
            if not np.all(scales > 0):
                continue
            q = _on_grid(rows, scales[:, None])
            if q is not None:
                return q.reshape(weight.shape), scales
    return None


def _integer_conv(call: Call, dq: Dequantized, q_weight: np.ndarray) -> Expr | None:
    attrs = call.attrs
    layouts = (str(attrs.get("data_layout", "NCHW")), str(attrs.get("kernel_layout", "OIHW")),
               str(attrs.get("out_layout", "") or "NCHW"))
    if int(attrs.get("groups", 1)) != 1 or layouts != ("NCHW", "OIHW", "NCHW"):
        return None
    padding = [int(p) for p in attrs.get("padding", (0, 0))]  # type: ignore[union-attr]
    if len(padding) == 2:
        padding = padding * 2
    data = dq.q
    if dq.zero_point and any(padding):
        # the float convolution pads with 0.0, which is the quantized zero point, not 0
        top, left, bottom, right = padding
        data = call_op("nn.pad", data, Constant(np.asarray(dq.zero_point, dtype=dq.dtype)),
                       pad_width=[[0, 0], [0, 0], [top, bottom], [left, right]])
        padding = [0, 0, 0, 0]
    new_attrs = {key: attrs.get(key) for key in ("strides", "dilation", "channels", "kernel_size")}
    acc: Expr = call_op("nn.conv2d", data, Constant(q_weight), padding=padding, groups=1, out_dtype="int32",
                        **{k: v for k, v in new_attrs.items() if v is not None})
    if dq.zero_point:
        correction = dq.zero_point * q_weight.astype(np.int64).sum(axis=(1, 2, 3))
        acc = call_op("subtract", acc, Constant(correction.astype(np.int32).reshape(-1, 1, 1)))
    return acc


def _integer_dense(call: Call, dq: Dequantized, q_weight: np.ndarray) -> Expr:
    acc: Expr = call_op("nn.dense", dq.q, Constant(q_weight), units=int(q_weight.shape[0]), out_dtype="int32")
    if dq.zero_point:
        correction = dq.zero_point * q_weight.astype(np.int64).sum(axis=1)
        acc = call_op("subtract", acc, Constant(correction.astype(np.int32)))
    return acc


def integer_product(call: Call, rebuilt: Call | None = None, fitting_pairs_only: bool = False,
                    int16_products: bool = False) -> Expr | None:
    """The integer form of `call` (a typed `nn.conv2d` or `nn.dense` of dequantized data and an int8-grid float
    weight, float32 out), built on the arguments of `rebuilt` (a copy of `call` with rewritten arguments; `call`
    itself when None), or None when `call` is not one (or, with `fitting_pairs_only`, when its weight's pairs do
    not fit int16: see `pairs_fit_int16`). An int32 product whose weight does not fit int8 becomes an int16 one
    with `int16_products` (the target multiplies int16 pairs exactly and fast), else a float32 one."""
    if call.op_name not in ("nn.conv2d", "nn.dense"):
        return None
    if _dtype(call) == "int32":
        narrowed = _narrowed_product(call, rebuilt or call, fitting_pairs_only)
        if narrowed is None and int16_products:
            narrowed = _int16_product(call, rebuilt or call)
        return narrowed if narrowed is not None else _float_product(call, rebuilt or call)
    if _dtype(call) != "float32" or str(call.attrs.get("out_dtype") or "float32") != "float32":
        return None
    dq = match_dequantized(call.args[0])
    weight = call.args[1]
    if dq is None or not isinstance(weight, Constant) or weight.data.dtype != np.float32:
        return None
    expected_ndim = 4 if call.op_name == "nn.conv2d" else 2
    if weight.data.ndim != expected_ndim:
        return None
    recovered = recover_int8_weight(weight.data)
    if recovered is None:
        return None
    q_weight, scales = recovered
    if fitting_pairs_only and not pairs_fit_int16(q_weight):
        return None
    dq = dq.on((rebuilt or call).args[0])
    acc = _integer_conv(call, dq, q_weight) if call.op_name == "nn.conv2d" else _integer_dense(call, dq, q_weight)
    if acc is None:
        return None
    multiplier = (dq.scale * scales).astype(np.float32)
    if call.op_name == "nn.conv2d":
        multiplier = multiplier.reshape(-1, 1, 1)
    return call_op("multiply", call_op("cast", acc, dtype="float32"), Constant(multiplier))


def _narrowed_product(call: Call, rebuilt: Call, fitting_pairs_only: bool) -> Expr | None:
    """An int32 product of widened 8-bit operands (`(cast(q) - zq) * (w - zw)` with `w - zw` an int32 constant)
    on the 8-bit operands themselves, when the weight's values fit int8."""
    dq = match_widened(call.args[0])
    weight = call.args[1]
    expected_ndim = 4 if call.op_name == "nn.conv2d" else 2
    if dq is None or not isinstance(weight, Constant) or weight.data.dtype != np.int32 \
            or weight.data.ndim != expected_ndim:
        return None
    if weight.data.size and (weight.data.min() < -128 or weight.data.max() > 127):
        return None
    q_weight = weight.data.astype(np.int8)
    if fitting_pairs_only and not pairs_fit_int16(q_weight):
        return None
    dq = dq.on(rebuilt.args[0])
    return _integer_conv(call, dq, q_weight) if call.op_name == "nn.conv2d" else _integer_dense(call, dq, q_weight)


def _small_integers(orig: Expr, new: Expr) -> tuple[Expr, int, int] | None:
    """`new` (a rebuilt copy of the typed `orig`) computed in float32, with the bounds of its values, when it is
    made of 8-bit tensors widened to int32, integer scalar constants and their differences (`cast(q, "int32")`,
    `cast(q, "int32") - zq` with a constant or a dynamic 8-bit zero point): None for anything else."""
    if isinstance(orig, Constant) and isinstance(new, Constant) and orig.data.size == 1 \
            and orig.data.dtype.kind in "iu":
        value = int(orig.data.reshape(()))
        return Constant(np.asarray(value, dtype=np.float32)), value, value
    if not (isinstance(orig, Call) and isinstance(new, Call) and orig.op_name == new.op_name):
        return None
    if orig.op_name == "cast" and _dtype(orig) == "int32" and _dtype(orig.args[0]) in _QUANTIZED_DTYPES:
        lo, hi = (0, 255) if _dtype(orig.args[0]) == "uint8" else (-128, 127)
        return call_op("cast", new.args[0], dtype="float32"), lo, hi
    if orig.op_name == "subtract":
        left = _small_integers(orig.args[0], new.args[0])
        right = _small_integers(orig.args[1], new.args[1])
        if left is None or right is None:
            return None
        return call_op("subtract", left[0], right[0]), left[1] - right[2], left[2] - right[1]
    return None


def _float_product(call: Call, rebuilt: Call) -> Expr | None:
    """An int32 product of widened 8-bit data (`cast(q, "int32") - zq`, see `_small_integers`) and an int32
    constant weight as the float32 product of the same small integers, cast back to int32, when the sums cannot
    overflow int32 (see the module docstring: exact while their bound is below 2^24)."""
    weight = call.args[1]
    expected_ndim = 4 if call.op_name == "nn.conv2d" else 2
    if not isinstance(weight, Constant) or weight.data.dtype != np.int32 or weight.data.ndim != expected_ndim \
            or not weight.data.size:
        return None
    data = _small_integers(call.args[0], rebuilt.args[0])
    if data is None:
        return None
    data_f, lo, hi = data
    terms = int(np.prod(weight.data.shape[1:]))  # per output: the input channels (of a group) times the taps
    if terms * max(abs(lo), abs(hi)) * int(np.abs(weight.data.astype(np.int64)).max()) >= _INT32_LIMIT:
        return None  # the int32 sums could wrap (as onnxruntime's do); the float32 ones would not
    attrs = {key: value for key, value in call.attrs.items() if key != "out_dtype"}
    product = call_op(call.op_name, data_f, Constant(weight.data.astype(np.float32)), **attrs)
    return call_op("cast", product, dtype="int32")


def _int16_product(call: Call, rebuilt: Call) -> Expr | None:
    """An int32 product of widened 8-bit data (`cast(q, "int32") - zq`, see `_small_integers`) and an int32 constant
    weight, both within int16, as the same product on int16 operands (`cast(data, "int16")`, zero padding being
    the zero point's image): the packed int8 convolution multiplies int16 pairs with vpmaddwd, exactly (see the
    module docstring). Plain convolutions (groups and dilation 1, NCHW/OIHW) and dense products only; None when the
    sums could overflow int32."""
    weight = call.args[1]
    expected_ndim = 4 if call.op_name == "nn.conv2d" else 2
    if not isinstance(weight, Constant) or weight.data.dtype != np.int32 or weight.data.ndim != expected_ndim \
            or not weight.data.size:
        return None
    attrs = call.attrs
    if call.op_name == "nn.conv2d" and (
            int(attrs.get("groups", 1)) != 1  # type: ignore[arg-type]
            or any(int(d) != 1 for d in attrs.get("dilation", (1, 1)))  # type: ignore[union-attr]
            or (str(attrs.get("data_layout", "NCHW")), str(attrs.get("kernel_layout", "OIHW")),
                str(attrs.get("out_layout", "") or "NCHW")) != ("NCHW", "OIHW", "NCHW")):
        return None
    data = _small_integers(call.args[0], rebuilt.args[0])
    if data is None:
        return None
    _, lo, hi = data
    peak = int(np.abs(weight.data.astype(np.int64)).max())
    if max(abs(lo), abs(hi)) > _INT16_MAX or peak > _INT16_MAX:
        return None
    terms = int(np.prod(weight.data.shape[1:]))
    if terms * max(abs(lo), abs(hi)) * peak >= _INT32_LIMIT:
        return None  # the int32 sums could wrap (as onnxruntime's do); the float32 ones would not
    data16 = call_op("cast", rebuilt.args[0], dtype="int16")
    new_attrs = {key: value for key, value in attrs.items() if key != "out_dtype"}
    return call_op(call.op_name, data16, Constant(weight.data.astype(np.int16)), out_dtype="int32", **new_attrs)


def _fold_requantize_divide(call: Call, scaled: set[int]) -> Expr | None:
    """`cast(acc) * (m / s)` for `divide(cast(acc) * m, s)` with `s` a positive scalar constant, where `cast(acc) * m`
    is an integer product built here: the QuantizeLinear that follows a product divides by its output scale, and one
    multiplier is what onnxruntime's requantization applies too (a float division per output element cost about as
    much as a 64-channel 1x1 convolution's products). Rounding can differ from the division's only at ties of the
    following `round`, within one quantization step."""
    if call.op_name != "divide" or id(call.args[0]) not in scaled:
        return None
    divisor = _scalar(call.args[1])
    product = call.args[0]
    if divisor is None or not divisor > 0 or not isinstance(product, Call):
        return None
    multiplier = product.args[1]
    if not isinstance(multiplier, Constant):
        return None
    folded = (multiplier.data.astype(np.float64) / divisor).astype(np.float32)
    return call_op("multiply", product.args[0], Constant(folded))


@register_pass
@dataclass(frozen=True)
class QuantizedProducts(Pass):
    """Rewrite float convolutions and dense products of dequantized 8-bit data into int8 products with int32 sums
    (see the module docstring)."""

    name: ClassVar[str] = "QuantizedProducts"
    # At opt_level 3 only the products whose weight pairs fit int16 unless the target has an exact fast path for
    # the others (see the module docstring: both measured faster than the float products on AVX2); every product
    # from opt_level 4 on.
    opt_level: ClassVar[int] = 3
    required: ClassVar[tuple[str, ...]] = ("InferType",)

    def transform(self, mod: IRModule, config: PassConfig) -> IRModule:
        fitting_only = config.opt_level < 4 and config.full_range_int8 == "float"
        # vpmaddwd multiplies the int16 pairs wherever the target has an exact fast path for full-range weights
        int16 = config.full_range_int8 in ("int16", "dot4")
        new_mod, changed = map_functions(mod, lambda f: self._rewrite_function(f, fitting_only, int16))
        return retype(new_mod, changed)

    def _rewrite_function(self, func: Function, fitting_pairs_only: bool, int16_products: bool) -> Function:
        scaled: set[int] = set()  # ids of the `cast(acc) * multiplier` expressions built here

        def visit(orig: Expr, new: Expr) -> Expr:
            # match on the typed original (its arguments carry checked types); rebuild from the new arguments
            if isinstance(orig, Call) and isinstance(new, Call):
                rewritten = integer_product(orig, new, fitting_pairs_only, int16_products)
                if rewritten is not None:
                    scaled.add(id(rewritten))
                    return rewritten
                folded = _fold_requantize_divide(new, scaled)
                if folded is not None:
                    return folded
            return new

        result = rewrite_dataflow(func, visit)
        assert isinstance(result, Function)
        return result
