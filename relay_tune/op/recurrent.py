"""`nn.lstm_sequence`: every step of an LSTM layer (one or two directions) as one operator, so that the step loop
runs inside one kernel (`relay_tune.kernel.recurrent`) instead of as a chain of per-step kernel calls.

    out = nn.lstm_sequence(xp, rp, h0, c0, hidden=H, reverse=[0, 1])

- `xp (seq, batch, directions, 4H)`: the input projection of every step with both biases added, gates in ONNX
  order (input, output, forget, cell);
- `rp (directions, panels, H, P)`: the recurrent weights `R (directions, 4H, H)` packed into column panels
  (`rp[d, p, k, j] = R[d, p * P + j, k]`, the columns past 4H zero), so that one step's product streams each
  panel front to back (`pack_recurrent_weights`);
- `h0`, `c0 (directions, batch, H)`: the initial states;
- `out (seq, directions, batch, 2H)`: per step and direction the hidden state (`[..., :H]`) and the cell state
  (`[..., H:]`) after that step. A direction with `reverse[d]` set runs from the last step to the first; its state
  after input step `t` is stored at `out[t]`, as ONNX's `Y` stores it.

The gates are ONNX's defaults (sigmoid, tanh, tanh; no clip, peepholes or coupled input-forget gate), and every
sequence runs the full length; the importer keeps other LSTMs unrolled.

`nn.lstm_sequence_int8` is the same layer with int8 recurrent weights (onnxruntime's DynamicQuantizeLSTM):

    out = nn.lstm_sequence_int8(xp, rq, rscale, rsum, h0, c0, hidden=H, reverse=[0, 1])

- `rq (directions, panels, K / 2, P, 2)` int8: `R (directions, H, 4H)` (DynamicQuantizeLSTM's layout, zero point
  0) packed for two-term dot products, `rq[d, p, k // 2, j, k % 2] = R[d, k, p * P + j]`, with a zero row up to
  `K`, the hidden size rounded up to even, and zero columns past 4H (`pack_int8_recurrent_weights`);
- `rscale (directions, panels * P)` float32: each column's weight scale; `rsum (directions, panels * P)` int32:
  each column's sum of `R` over `k`.

Each step quantizes the hidden state as onnxruntime does before its u8s8 product (per direction, over the whole
`(batch, H)` state: the range `[min(h, 0), max(h, 0)]` onto [0, 255], scale 1 when it is empty, zero point and
values rounded half to even) and computes the recurrent product on the integers:
`(sum_k qh[k] * R[k, j] - zp * rsum[j]) * (scale_h * rscale[j])`, exact up to the final float multiply (the
reference takes `rsum` as given, so it defines the operator on any inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.types import TensorType, Type
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

LSTM_SEQUENCE = "nn.lstm_sequence"

LSTM_SEQUENCE_INT8 = "nn.lstm_sequence_int8"

register_op(LSTM_SEQUENCE, 4, OpPattern.OPAQUE, {"hidden": None, "reverse": ()}, required=("hidden",),
            description="all steps of a one- or two-direction LSTM layer (default gates), states per step")
register_op(LSTM_SEQUENCE_INT8, 6, OpPattern.OPAQUE, {"hidden": None, "reverse": ()}, required=("hidden",),
            description="nn.lstm_sequence with int8 recurrent weights, the hidden state quantized to uint8 per step")


def _static(arg: Type, what: str, rank: int, dtype: str = "float32", op: str = LSTM_SEQUENCE) -> tuple[int, ...]:
    if not isinstance(arg, TensorType):
        raise RelayTypeError(f"{what} must be a tensor, got {arg}", op_name=op)
    if len(arg.shape) != rank or not all(isinstance(d, int) for d in arg.shape):
        raise RelayTypeError(f"{what} must have a static shape of rank {rank}, got {arg.shape}", op_name=op)
    if arg.dtype != dtype:
        raise RelayTypeError(f"{what} must be {dtype}, got {arg.dtype}", op_name=op)
    return tuple(d for d in arg.shape if isinstance(d, int))


@type_relation(LSTM_SEQUENCE)
def lstm_sequence_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    """`xp (S, B, D, 4H)`, `rp (D, panels, H, P)`, `h0`, `c0 (D, B, H)` -> `(S, D, B, 2H)`."""
    hidden = int(attrs["hidden"])
    seq, batch, directions, gates = _static(arg_types[0], "xp", 4)
    rp = _static(arg_types[1], "rp", 4)
    reverse = tuple(attrs["reverse"])
    if gates != 4 * hidden or len(reverse) != directions:
        raise RelayTypeError(f"xp {arg_types[0]} does not hold 4 x {hidden} gates of {len(reverse)} direction(s)",
                             op_name=LSTM_SEQUENCE)
    if rp[0] != directions or rp[2] != hidden or rp[1] * rp[3] < gates or (rp[1] - 1) * rp[3] >= gates:
        raise RelayTypeError(f"rp {arg_types[1]} is not {directions} direction(s) of {gates} x {hidden} recurrent "
                             "weights packed into column panels", op_name=LSTM_SEQUENCE)
    for index, name in ((2, "h0"), (3, "c0")):
        if _static(arg_types[index], name, 3) != (directions, batch, hidden):
            raise RelayTypeError(f"{name} must have shape {(directions, batch, hidden)}, got {arg_types[index]}",
                                 op_name=LSTM_SEQUENCE)
    return TensorType((seq, directions, batch, 2 * hidden), "float32")


@type_relation(LSTM_SEQUENCE_INT8)
def lstm_sequence_int8_rel(arg_types: Sequence[Type], attrs: Attrs) -> Type:
    """`xp (S, B, D, 4H)`, `rq (D, panels, K / 2, P, 2)` int8, `rscale`, `rsum (D, panels * P)`, `h0`, `c0
    (D, B, H)` -> `(S, D, B, 2H)`."""
    op = LSTM_SEQUENCE_INT8
    hidden = int(attrs["hidden"])
    seq, batch, directions, gates = _static(arg_types[0], "xp", 4, op=op)
    rq = _static(arg_types[1], "rq", 5, "int8", op)
    reverse = tuple(attrs["reverse"])
    if gates != 4 * hidden or len(reverse) != directions:
        raise RelayTypeError(f"xp {arg_types[0]} does not hold 4 x {hidden} gates of {len(reverse)} direction(s)",
                             op_name=op)
    if (rq[0] != directions or rq[2] != -(-hidden // 2) or rq[4] != 2 or rq[1] * rq[3] < gates
            or (rq[1] - 1) * rq[3] >= gates):
        raise RelayTypeError(f"rq {arg_types[1]} is not {directions} direction(s) of {hidden} x {gates} int8 "
                             "recurrent weights packed into column panels of pairs", op_name=op)
    columns = (directions, rq[1] * rq[3])
    for index, name, dtype in ((2, "rscale", "float32"), (3, "rsum", "int32")):
        if _static(arg_types[index], name, 2, dtype, op) != columns:
            raise RelayTypeError(f"{name} must have shape {columns}, got {arg_types[index]}", op_name=op)
    for index, name in ((4, "h0"), (5, "c0")):
        if _static(arg_types[index], name, 3, op=op) != (directions, batch, hidden):
            raise RelayTypeError(f"{name} must have shape {(directions, batch, hidden)}, got {arg_types[index]}",
                                 op_name=op)
    return TensorType((seq, directions, batch, 2 * hidden), "float32")


def pack_int8_recurrent_weights(r: np.ndarray, panel: int) -> np.ndarray:
    """DynamicQuantizeLSTM's int8 `R (directions, H, 4H)` as `rq (directions, panels, ceil(H / 2), panel, 2)`."""
    directions, hidden, gates = r.shape
    panels, pairs = -(-gates // panel), -(-hidden // 2)
    padded = np.zeros((directions, 2 * pairs, panels * panel), np.int8)
    padded[:, :hidden, :gates] = r
    return np.ascontiguousarray(padded.reshape(directions, pairs, 2, panels, panel).transpose(0, 3, 1, 4, 2))


def unpack_int8_recurrent_weights(rq: np.ndarray, hidden: int, gates: int) -> np.ndarray:
    """`rq (directions, panels, K / 2, P, 2)` back to `R (directions, H, gates)`."""
    directions, panels, pairs, panel, _ = rq.shape
    return rq.transpose(0, 2, 4, 1, 3).reshape(directions, 2 * pairs, panels * panel)[:, :hidden, :gates]


def quantize_state(h: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """`h` as onnxruntime's recurrent layers quantize it before a u8s8 product: uint8 values (as int32), the
    scale and the zero point."""
    low = np.float32(min(float(h.min()), 0.0))
    high = np.float32(max(float(h.max()), 0.0))
    scale = np.float32(1.0) if high == low else np.float32((high - low) / np.float32(255.0))
    zero = int(np.round(np.clip(-low / scale, 0.0, 255.0)))
    q = np.clip(np.round(h / scale) + zero, 0, 255).astype(np.int32)
    return q, scale, zero


def pack_recurrent_weights(r: np.ndarray, panel: int) -> np.ndarray:
    """`R (directions, 4H, H)` as `rp (directions, panels, H, panel)` (the numpy twin of the importer's packing)."""
    directions, gates, hidden = r.shape
    panels = -(-gates // panel)
    padded = np.zeros((directions, panels * panel, hidden), r.dtype)
    padded[:, :gates] = r
    return np.ascontiguousarray(padded.reshape(directions, panels, panel, hidden).transpose(0, 1, 3, 2))


def unpack_recurrent_weights(rp: np.ndarray, gates: int) -> np.ndarray:
    """`rp (directions, panels, H, P)` back to `R (directions, gates, H)`."""
    directions, panels, hidden, panel = rp.shape
    return rp.transpose(0, 1, 3, 2).reshape(directions, panels * panel, hidden)[:, :gates]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _lstm_steps(xp: np.ndarray, h0: np.ndarray, c0: np.ndarray, hidden: int, reverse: Sequence[int],
                recurrent: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
    """Every step of every direction, `recurrent(d, h)` giving direction d's `(batch, 4H)` recurrent product."""
    seq, batch, directions, _ = xp.shape
    out = np.zeros((seq, directions, batch, 2 * hidden), np.float32)
    for d in range(directions):
        h, c = h0[d], c0[d]
        for t in (reversed(range(seq)) if reverse[d] else range(seq)):
            pre = xp[t, :, d] + recurrent(d, h)
            i, o, f, g = (pre[:, k * hidden:(k + 1) * hidden] for k in range(4))
            c = (_sigmoid(f) * c + _sigmoid(i) * np.tanh(g)).astype(np.float32)
            h = (_sigmoid(o) * np.tanh(c)).astype(np.float32)
            out[t, d, :, :hidden], out[t, d, :, hidden:] = h, c
    return out


@reference(LSTM_SEQUENCE)
def lstm_sequence_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    xp, rp, h0, c0 = (np.asarray(a, np.float32) for a in inputs)
    r = unpack_recurrent_weights(rp, xp.shape[3])
    return _lstm_steps(xp, h0, c0, int(attrs["hidden"]), attrs["reverse"], lambda d, h: h @ r[d].T)


@reference(LSTM_SEQUENCE_INT8)
def lstm_sequence_int8_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    xp, h0, c0 = (np.asarray(inputs[i], np.float32) for i in (0, 4, 5))
    hidden, gates = int(attrs["hidden"]), xp.shape[3]
    r = unpack_int8_recurrent_weights(np.asarray(inputs[1]), hidden, gates).astype(np.int64)
    rscale = np.asarray(inputs[2], np.float32)[:, :gates]
    rsum = np.asarray(inputs[3], np.int64)[:, :gates]

    def recurrent(d: int, h: np.ndarray) -> np.ndarray:
        q, scale, zero = quantize_state(h)
        # exact, as the kernel's int32 sums; the zero point's share from `rsum` as given (R's column sums in a
        # model), so that the reference is the operator's definition on any inputs
        acc = q.astype(np.int64) @ r[d] - zero * rsum[d]
        return (acc.astype(np.float32) * (scale * rscale[d])).astype(np.float32)

    return _lstm_steps(xp, h0, c0, hidden, attrs["reverse"], recurrent)
