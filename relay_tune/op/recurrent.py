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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relay_tune.errors import RelayTypeError
from relay_tune.ir.attrs import Attrs
from relay_tune.ir.types import TensorType, Type
from relay_tune.op.registry import OpPattern, reference, register_op, type_relation

LSTM_SEQUENCE = "nn.lstm_sequence"

register_op(LSTM_SEQUENCE, 4, OpPattern.OPAQUE, {"hidden": None, "reverse": ()}, required=("hidden",),
            description="all steps of a one- or two-direction LSTM layer (default gates), states per step")


def _static(arg: Type, what: str, rank: int) -> tuple[int, ...]:
    if not isinstance(arg, TensorType):
        raise RelayTypeError(f"{what} must be a tensor, got {arg}", op_name=LSTM_SEQUENCE)
    if len(arg.shape) != rank or not all(isinstance(d, int) for d in arg.shape):
        raise RelayTypeError(f"{what} must have a static shape of rank {rank}, got {arg.shape}", op_name=LSTM_SEQUENCE)
    if arg.dtype != "float32":
        raise RelayTypeError(f"{what} must be float32, got {arg.dtype}", op_name=LSTM_SEQUENCE)
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


@reference(LSTM_SEQUENCE)
def lstm_sequence_ref(inputs: Sequence[np.ndarray], attrs: Attrs) -> np.ndarray:
    xp, rp, h0, c0 = (np.asarray(a, np.float32) for a in inputs)
    hidden = int(attrs["hidden"])
    seq, batch, directions, gates = xp.shape
    r = unpack_recurrent_weights(rp, gates)
    out = np.zeros((seq, directions, batch, 2 * hidden), np.float32)
    for d in range(directions):
        h, c = h0[d], c0[d]
        for t in (reversed(range(seq)) if attrs["reverse"][d] else range(seq)):
            pre = xp[t, :, d] + h @ r[d].T
            i, o, f, g = (pre[:, k * hidden:(k + 1) * hidden] for k in range(4))
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
            out[t, d, :, :hidden], out[t, d, :, hidden:] = h, c
    return out
