"""Signal-processing operators: `signal.window` (Hann, Hamming and Blackman windows) and `signal.dft` (a discrete
Fourier transform along one axis).

Complex tensors are real tensors whose last axis holds (real, imaginary), or only the real part (extent 1), as
ONNX's DFT and STFT take them.

`signal.dft` compiles as a direct O(n^2) reduction over the input samples (each output frequency sums every
sample times its twiddle factor), which suits the short frames of audio front ends and keeps the kernel within
the generic reduction schedule. Twiddle angles are taken from `(f * k) mod n`, so they stay within one turn, and
twiddles and sums are float64, rounded once to the signal's dtype, as the reference does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.types import TensorType, Type
from relay_tune.op._shape import check_dtype, expect_arity, expect_tensor, format_shape, is_float_dtype
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

Array = np.ndarray

# Generalised cosine windows: w[n] = sum_j (-1)^j a_j cos(2 pi j n / N) (ONNX's coefficients).
WINDOW_COEFFICIENTS: dict[str, tuple[float, ...]] = {
    "hann": (0.5, 0.5),
    "hamming": (25.0 / 46.0, 21.0 / 46.0),
    "blackman": (0.42, 0.5, 0.08),
}

register_op("signal.window", 0, OpPattern.INJECTIVE, {"kind": "hann", "size": None, "periodic": True,
                                                      "dtype": "float32"}, "relay.attrs.WindowAttrs",
            required=("size",),
            description="a Hann, Hamming or Blackman window of `size` samples (periodic: the first `size` of a "
                        "window of `size + 1`)")
register_op("signal.dft", 1, OpPattern.OUT_ELEMWISE_FUSABLE, {"axis": 0, "length": None, "inverse": False,
                                                              "onesided": False}, "relay.attrs.DFTAttrs",
            required=("length",),
            description="(signal): the DFT of `length` samples along `axis` (the input cut or zero-padded to "
                        "`length`); the last axis holds (real, imaginary) or only the real part; inverse divides "
                        "by `length`; onesided keeps the first length // 2 + 1 frequencies, or with inverse takes "
                        "them and gives the real signal (an inverse real FFT)")


# ------------------------------------------------------------------------------------------------
# signal.window
# ------------------------------------------------------------------------------------------------


def _window_args(attrs: Attrs) -> tuple[tuple[float, ...], int, int, str]:
    """(coefficients, size, period N of the cosines, dtype)."""
    op = "signal.window"
    kind = attrs["kind"]
    if kind not in WINDOW_COEFFICIENTS:
        raise RelayTypeError(f"kind must be one of {', '.join(WINDOW_COEFFICIENTS)}, got {kind!r}", op_name=op)
    size = attrs["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise RelayTypeError(f"size must be a non-negative integer, got {size!r}", op_name=op)
    dtype = check_dtype(attrs["dtype"], op, "dtype")
    if dtype == "bool":
        raise RelayTypeError("dtype must be a number type, got bool", op_name=op)
    period = size if attrs["periodic"] else size - 1
    return WINDOW_COEFFICIENTS[kind], size, period, dtype


@type_relation("signal.window")
def _window_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 0, "signal.window")
    _, size, _, dtype = _window_args(attrs)
    return TensorType((size,), dtype)


@reference("signal.window")
def _window_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    coefficients, size, period, dtype = _window_args(attrs)
    n = np.arange(size, dtype=np.float64)
    # A window of one sample has period 0: the angle is 0 (ONNX's reference gives 0 / 0 = nan there; a
    # symmetric window of one sample is 1 in numpy, scipy and torch, which this follows).
    angle = 2.0 * math.pi * n / period if period > 0 else np.zeros_like(n)
    total = sum((-1) ** j * a * np.cos(j * angle) for j, a in enumerate(coefficients))
    return np.asarray(total, dtype=np.float64).astype(dtype)


# ------------------------------------------------------------------------------------------------
# signal.dft
# ------------------------------------------------------------------------------------------------


def _dft_layout(x: TensorType, attrs: Attrs) -> tuple[int, int, int, int, int]:
    """(axis, length, frequencies out, samples read, components out) of a DFT of `x`."""
    op = "signal.dft"
    if not is_float_dtype(x.dtype):
        raise RelayTypeError(f"requires a floating-point signal, got {x}", op_name=op)
    if x.ndim < 2 or not x.is_static or x.shape[-1] not in (1, 2):
        raise RelayTypeError(f"the signal must have a static shape (..., n, 1 or 2), got {format_shape(x.shape)}",
                             op_name=op)
    axis = attrs["axis"]
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < x.ndim - 1:
        raise RelayTypeError(f"axis must be a signal axis in [0, {x.ndim - 2}], got {axis!r}", op_name=op)
    length = attrs["length"]
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise RelayTypeError(f"length must be a positive integer, got {length!r}", op_name=op)
    extent = int(x.shape[axis])  # type: ignore[arg-type]
    inverse, onesided = bool(attrs["inverse"]), bool(attrs["onesided"])
    if inverse and onesided:  # an inverse real FFT: the first length // 2 + 1 frequencies give a real signal
        return axis, length, length, min(extent, length // 2 + 1), 1
    frequencies = length // 2 + 1 if onesided else length
    return axis, length, frequencies, min(extent, length), 2


@type_relation("signal.dft")
def _dft_relation(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    expect_arity(arg_types, 1, "signal.dft")
    x = expect_tensor(arg_types[0], "signal.dft", "signal")
    axis, _, frequencies, _, components = _dft_layout(x, attrs)
    shape = list(x.shape)
    shape[axis], shape[-1] = frequencies, components
    return TensorType(tuple(shape), x.dtype)


@reference("signal.dft")
def _dft_ref(inputs: Sequence[Array], attrs: Attrs) -> Array:
    x = np.asarray(inputs[0])
    axis, length, frequencies, _, _ = _dft_layout(TensorType(x.shape, x.dtype.name), attrs)
    wide = x.astype(np.float64)
    signal = wide[..., 0] + 1j * wide[..., 1] if x.shape[-1] == 2 else wide[..., 0]
    if attrs["inverse"] and attrs["onesided"]:
        result = np.fft.irfft(signal, n=length, axis=axis)[..., np.newaxis]
    else:
        transform = np.fft.ifft if attrs["inverse"] else np.fft.fft
        spectrum = np.take(transform(signal, n=length, axis=axis), np.arange(frequencies), axis=axis)
        result = np.stack([spectrum.real, spectrum.imag], axis=-1)
    return np.ascontiguousarray(result.astype(x.dtype))


# ------------------------------------------------------------------------------------------------
# tensor-expression computes (kernels)
# ------------------------------------------------------------------------------------------------
# Imported here, not at the top: the kernel layer is only needed once kernels are built.
from relay_tune.kernel import te, tir  # noqa: E402
from relay_tune.kernel.compute_blocks import (  # noqa: E402
    INJECTIVE,
    axis_names,
    const_expr,
    named,
    static_shape,
)
from relay_tune.op.registry import compute  # noqa: E402


@compute("signal.window")
def _window_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    coefficients, _, period, dtype = _window_args(attrs)
    step = 2.0 * math.pi / period if period > 0 else 0.0

    def body(n: Any) -> Any:  # in float64 and rounded once, as the reference does
        angle = te.cast("float64", n) * const_expr(step, "float64")
        total = const_expr(coefficients[0], "float64")
        for j, a in enumerate(coefficients[1:], start=1):
            term = const_expr(a, "float64") * te.cos(angle * const_expr(float(j), "float64"))
            total = total - term if j % 2 else total + term
        return te.cast(dtype, total)

    return te.compute(static_shape(out_type), named(["n"], body), "window", INJECTIVE)


@compute("signal.dft")
def _dft_compute(inputs: Sequence[te.Tensor], attrs: Attrs, out_type: Type) -> te.Tensor:
    (x,) = inputs
    axis, length, _, samples, components = _dft_layout(TensorType(x.shape, x.dtype), attrs)
    inverse, onesided = bool(attrs["inverse"]), bool(attrs["onesided"])
    dtype = x.dtype
    # Twiddles and sums in float64: a float32 angle's error grows with the frequency and cancellation leaves
    # near-zero outputs (the imaginary parts of real signals' symmetric bins) off by more than float32's step.
    acc = "float64"
    sign = 1.0 if inverse else -1.0  # the twiddle factor is exp(sign * 2 pi i f k / length)
    step = const_expr(2.0 * math.pi / length, acc)
    scale = 1.0 / length if inverse else 1.0
    complex_input = x.shape[-1] == 2
    k = te.reduce_axis(samples, "k")

    def weight(kk: Any) -> Any:
        if not (inverse and onesided):
            return const_expr(scale, acc)
        # An inverse real FFT counts each frequency k and its mirror length - k, except 0 and length / 2.
        doubled = te.all_of(kk > 0, te.not_equal(kk * 2, length))
        return te.if_then_else(doubled, const_expr(2.0 * scale, acc), const_expr(scale, acc))

    def body(*idx: Any) -> Any:
        f, c = idx[axis], idx[-1]
        angle = te.cast(acc, tir.binary("floormod", f * k, length)) * step
        cos, sin = te.cos(angle), te.sin(angle) * const_expr(sign, acc)
        at = (*idx[:axis], k, *idx[axis + 1:-1])
        re = te.cast(acc, x[(*at, 0)])
        if complex_input:
            im = te.cast(acc, x[(*at, 1)])
            real, imag = re * cos - im * sin, re * sin + im * cos
        else:
            real, imag = re * cos, re * sin
        value = real if components == 1 else te.if_then_else(te.equal(c, 0), real, imag)
        return te.sum(value * weight(k), axis=k)

    shape = static_shape(out_type)
    total = te.compute(shape, named(axis_names(len(shape)), body), "dft", "reduce")
    if acc == dtype:
        return total
    return te.compute(shape, named(axis_names(len(shape)), lambda *i: te.cast(dtype, total[i])), "dft_cast",
                      "elemwise")
