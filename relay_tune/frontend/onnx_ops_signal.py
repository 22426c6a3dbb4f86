"""ONNX converters for the signal-processing operators: HannWindow, HammingWindow, BlackmanWindow (Relay's
`signal.window`), DFT (opsets 17 and 20; Relay's `signal.dft`) and STFT (frames gathered from the signal,
weighted by the window, then `signal.dft` along each frame).

Sizes, lengths and steps decide output shapes, so they must be constants known at import time; the signal and
STFT's window may be computed at run time. The converters register in the importer's table when
`relay_tune.frontend.onnx` is imported.
"""

from __future__ import annotations

import numpy as np

from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode, relay_dtype
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Expr
from relay_tune.op._shape import is_float_dtype

_WINDOWS = {"HannWindow": "hann", "HammingWindow": "hamming", "BlackmanWindow": "blackman"}


def _static_int(imp: Importer, node: OnnxNode, index: int, what: str) -> int:
    value = imp.static(node.input(index), f"{what} of {node.op_type}")
    if value.size != 1 or value.dtype.kind not in "iu":
        raise OnnxModelError(f"{what} of {node.op_type} must be an integer scalar, got {value.dtype}{value.shape}")
    return int(value.reshape(()))


@converts(*_WINDOWS, newest=REVIEWED_OPSET)
def _window(imp: Importer, node: OnnxNode) -> Expr:
    size = _static_int(imp, node, 0, "size")
    if size < 0:
        raise OnnxModelError(f"size of {node.op_type} must not be negative, got {size}")
    dtype = relay_dtype(int(node.attrs.get("output_datatype", 1)), f"output_datatype of {node.op_type}")
    return imp.call("signal.window", [], kind=_WINDOWS[node.op_type], size=size,
                    periodic=bool(node.attrs.get("periodic", 1)), dtype=dtype)


def _float_signal(imp: Importer, x: Expr, what: str) -> tuple[int, ...]:
    shape = imp.static_shape(x, what)
    if not is_float_dtype(imp.dtype(x)):
        raise OnnxModelError(f"{what} must be floating point, got {imp.dtype(x)}")
    if len(shape) < 2 or shape[-1] not in (1, 2):
        raise OnnxModelError(f"{what} must have shape (..., 1 or 2) (real or complex samples), got {list(shape)}")
    return shape


@converts("DFT", newest=REVIEWED_OPSET)
def _dft(imp: Importer, node: OnnxNode) -> Expr:
    """DFT-17 (axis an attribute, default 1) and DFT-20 (axis an input, default -2)."""
    x = node.required(0)
    shape = _float_signal(imp, x, "the input of DFT")
    rank = len(shape)
    if imp.opset >= 20:
        axis = _static_int(imp, node, 2, "axis") if node.input(2) is not None else -2
    else:
        axis = int(node.attrs.get("axis", 1))
    if not -rank <= axis < rank or axis % rank == rank - 1:
        raise OnnxModelError(f"axis {axis} of DFT is not a signal axis of a rank-{rank} input")
    axis %= rank
    inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))
    if node.input(1) is not None:
        length = _static_int(imp, node, 1, "dft_length")
    else:  # ONNX's default: the input's length, or the even signal length a one-sided spectrum gives
        length = 2 * (shape[axis] - 1) if inverse and onesided else shape[axis]
    if length < 1:
        raise OnnxModelError(f"the DFT length must be positive, got {length}")
    if onesided and not inverse and shape[-1] == 2:
        raise OnnxModelError("a one-sided DFT needs a real input (last dimension 1)")
    return imp.call("signal.dft", [x], axis=axis, length=length, inverse=inverse, onesided=onesided)


@converts("STFT", newest=REVIEWED_OPSET)
def _stft(imp: Importer, node: OnnxNode) -> Expr:
    x = node.required(0)
    shape = _float_signal(imp, x, "the signal of STFT")
    if len(shape) != 3:
        raise OnnxModelError(f"the signal of STFT must have shape (batch, length, 1 or 2), got {list(shape)}")
    batch, samples, parts = shape
    step = _static_int(imp, node, 1, "frame_step")
    window = node.input(2)
    if node.input(3) is not None:
        frame_length = _static_int(imp, node, 3, "frame_length")
    elif window is not None:
        frame_length = int(imp.static_shape(window, "the window of STFT")[0])
    else:
        raise OnnxModelError("STFT needs a window or a frame_length")
    if window is not None and imp.shape(window) != (frame_length,):
        raise OnnxModelError(f"the window of STFT must have shape ({frame_length},), got {list(imp.shape(window))}")
    if step < 1 or not 1 <= frame_length <= samples:
        raise OnnxModelError(f"STFT needs frame_step >= 1 and 1 <= frame_length <= {samples} (the signal "
                             f"length), got {step} and {frame_length}")
    onesided = bool(node.attrs.get("onesided", 1))
    if onesided and parts == 2:
        raise OnnxModelError("a one-sided STFT needs a real signal (last dimension 1)")
    frames = 1 + (samples - frame_length) // step
    starts = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(frame_length, dtype=np.int64)
    framed = imp.call("take", [x, imp.const(starts, "int64")], axis=1, mode="clip")  # (batch, frames, len, parts)
    if window is not None:
        framed = imp.call("multiply", [framed, imp.reshape(imp.cast(window, imp.dtype(x)),
                                                            [1, 1, frame_length, 1])])
    assert imp.shape(framed) == (batch, frames, frame_length, parts)
    return imp.call("signal.dft", [framed], axis=2, length=frame_length, inverse=False, onesided=onesided)
