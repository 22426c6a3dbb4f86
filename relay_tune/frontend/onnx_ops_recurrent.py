"""The ONNX recurrent layers RNN, GRU and LSTM (every opset: `layout` since 14) as Relay operators.

An LSTM with the default gates (sigmoid, tanh, tanh; no clip, peepholes or coupled input-forget gate) whose
sequences all run the full length becomes one input projection over every step and direction (one `nn.dense`,
both biases added once) and one `nn.lstm_sequence` (`relay_tune.op.recurrent`): every step inside one kernel, the
directions of a bidirectional layer on separate cores. Every other layer is unrolled over the model's static
sequence length:

Per direction, the input projection of all steps is one `nn.dense` over `(seq * batch, input)` (with both biases
added once), so the heaviest product is a single tuned task; each step then takes its slice of the projection,
one recurrent `nn.dense` of the hidden state and the element-wise gate arithmetic, which the graph passes fuse
into a few kernels per step. A reverse direction runs the same steps from the last to the first.

`sequence_lens` (constant or computed at run time) masks the steps past each sequence's end: those steps leave
the state unchanged and write zeros to `Y`, so `Y_h` / `Y_c` hold the state after the last valid step (for the
reverse direction, each sequence starts from its own last element). Activations are the ONNX set (Sigmoid, Tanh,
Relu, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus); `activation_alpha`
and `activation_beta` are consumed in order by the activations that take an alpha or a beta (as onnxruntime
reads them), the others keeping their defaults. `clip` bounds the input of every gate activation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relay_tune.errors import UnsupportedError
from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Constant, Expr, Tuple
from relay_tune.op.recurrent import LSTM_SEQUENCE

LSTM_PANEL = 64
"""Columns of one packed panel of an LSTM's recurrent weights (`nn.lstm_sequence`): 64 float32 are four cache lines
and as many accumulators as keep the FMA units busy at 8 or 16 lanes; the code generator cuts them into the
target's vectors."""

# Per activation (lower case): its default alpha and beta, None where it takes none.
_ACTIVATION_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "sigmoid": (None, None), "tanh": (None, None), "relu": (None, None), "softsign": (None, None),
    "softplus": (None, None), "affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
    "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}


@dataclass(frozen=True)
class Activation:
    """One gate activation of a recurrent layer, with its alpha and beta where it takes them."""

    name: str  # lower case
    alpha: float = 0.0
    beta: float = 0.0

    def __call__(self, imp: Importer, x: Expr) -> Expr:
        dtype = imp.dtype(x)
        if self.name == "sigmoid":
            return imp.call("sigmoid", [x])
        if self.name == "tanh":
            return imp.call("tanh", [x])
        if self.name == "relu":
            return imp.call("nn.relu", [x])
        if self.name == "affine":
            return imp.scalar_op("add", imp.scalar_op("multiply", x, self.alpha), self.beta)
        if self.name == "leakyrelu":
            return imp.call("nn.leaky_relu", [x], alpha=self.alpha)
        if self.name == "thresholdedrelu":
            above = imp.call("greater", [x, imp.const(self.alpha, dtype)])
            return imp.call("where", [above, x, imp.const(0, dtype)])
        if self.name == "scaledtanh":
            return imp.scalar_op("multiply", imp.call("tanh", [imp.scalar_op("multiply", x, self.beta)]), self.alpha)
        if self.name == "hardsigmoid":
            linear = imp.scalar_op("add", imp.scalar_op("multiply", x, self.alpha), self.beta)
            return imp.call("clip", [linear], a_min=0.0, a_max=1.0)
        if self.name == "elu":
            negative = imp.scalar_op("multiply", imp.scalar_op("subtract", imp.call("exp", [x]), 1.0), self.alpha)
            return imp.call("where", [imp.call("greater", [x, imp.const(0, dtype)]), x, negative])
        if self.name == "softsign":
            return imp.call("divide", [x, imp.scalar_op("add", imp.call("abs", [x]), 1.0)])
        assert self.name == "softplus", self.name
        # log(1 + e^x) as max(x, 0) + log(1 + e^-|x|), which never overflows
        tail = imp.call("exp", [imp.call("negative", [imp.call("abs", [x])])])
        return imp.call("add", [imp.call("maximum", [x, imp.const(0, dtype)]),
                                imp.call("log", [imp.scalar_op("add", tail, 1.0)])])


def _float32(value: float) -> float:
    """The shortest decimal of the float32 ONNX stored (as `OnnxNode.attr_float` reads attributes)."""
    return float(str(np.float32(value)))


def activations(node: OnnxNode, defaults: list[str], directions: int) -> list[Activation]:
    """The node's activations, `len(defaults)` per direction, forward direction first."""
    raw = node.attrs.get("activations")
    names = [(n.decode() if isinstance(n, bytes) else str(n)) for n in raw] if raw else defaults * directions
    if len(names) != len(defaults) * directions:
        raise OnnxModelError(f"{len(names)} activations given; {node.op_type} needs {len(defaults)} per direction "
                             f"({len(defaults) * directions} in all)")
    alphas = [_float32(a) for a in node.attrs.get("activation_alpha", [])]
    betas = [_float32(b) for b in node.attrs.get("activation_beta", [])]
    result = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATION_PARAMS:
            raise UnsupportedError(f"activation {name!r} (ONNX recurrent layers allow "
                                   "Sigmoid, Tanh, Relu, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, "
                                   "Elu, Softsign and Softplus)")
        alpha, beta = _ACTIVATION_PARAMS[key]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        result.append(Activation(key, alpha or 0.0, beta or 0.0))
    return result


@dataclass(frozen=True)
class _Layer:
    """What every step of one direction needs."""

    kind: str  # "RNN", "GRU" or "LSTM"
    hidden: int
    batch: int
    dtype: str
    acts: list[Activation]  # this direction's
    clip: float | None
    input_forget: bool
    linear_before_reset: bool


def _pick(imp: Importer, tensor: Expr, index: int, axis: int = 0) -> Expr:
    """`tensor[index]` along `axis`, that axis dropped."""
    shape = imp.static_shape(tensor)
    part = imp.call("strided_slice", [tensor], begin=[index], end=[index + 1], axes=[axis])
    return imp.reshape(part, [*shape[:axis], *shape[axis + 1:]])


def _columns(imp: Importer, x: Expr, start: int, stop: int) -> Expr:
    """`x[:, start:stop]` of a 2-D tensor."""
    if (start, stop) == (0, imp.static_shape(x)[1]):
        return x
    return imp.call("strided_slice", [x], begin=[start], end=[stop], axes=[1])


def _gate(imp: Importer, layer: _Layer, act: Activation, pre: Expr) -> Expr:
    if layer.clip is not None:
        pre = imp.call("clip", [pre], a_min=-layer.clip, a_max=layer.clip)
    return act(imp, pre)


def _rnn_step(imp: Importer, layer: _Layer, xt: Expr, h: Expr, r: Expr) -> Expr:
    return _gate(imp, layer, layer.acts[0], imp.call("add", [xt, imp.call("nn.dense", [h, r])]))


def _gru_step(imp: Importer, layer: _Layer, xt: Expr, h: Expr, r: Expr, rb_h: Expr | None) -> Expr:
    n = layer.hidden
    f, g = layer.acts
    r_zr = imp.call("strided_slice", [r], begin=[0], end=[2 * n], axes=[0])  # gates z and r
    rec_zr = imp.call("nn.dense", [h, r_zr])
    z = _gate(imp, layer, f, imp.call("add", [_columns(imp, xt, 0, n), _columns(imp, rec_zr, 0, n)]))
    reset = _gate(imp, layer, f, imp.call("add", [_columns(imp, xt, n, 2 * n), _columns(imp, rec_zr, n, 2 * n)]))
    r_h = imp.call("strided_slice", [r], begin=[2 * n], end=[3 * n], axes=[0])
    if layer.linear_before_reset:
        rec_h = imp.call("nn.dense", [h, r_h])
        if rb_h is not None:
            rec_h = imp.call("add", [rec_h, rb_h])
        candidate_pre = imp.call("add", [_columns(imp, xt, 2 * n, 3 * n), imp.call("multiply", [reset, rec_h])])
    else:
        rec_h = imp.call("nn.dense", [imp.call("multiply", [reset, h]), r_h])
        candidate_pre = imp.call("add", [_columns(imp, xt, 2 * n, 3 * n), rec_h])
    candidate = _gate(imp, layer, g, candidate_pre)
    # H = (1 - z) * candidate + z * H_prev = candidate + z * (H_prev - candidate)
    return imp.call("add", [candidate, imp.call("multiply", [z, imp.call("subtract", [h, candidate])])])


def _lstm_step(imp: Importer, layer: _Layer, xt: Expr, h: Expr, c: Expr, r: Expr,
               peep: tuple[Expr, Expr, Expr] | None) -> tuple[Expr, Expr]:
    n = layer.hidden
    f, g, hact = layer.acts
    pre = imp.call("add", [xt, imp.call("nn.dense", [h, r])])  # gates i, o, f, c
    pre_i, pre_o, pre_f, pre_c = (_columns(imp, pre, k * n, (k + 1) * n) for k in range(4))
    if peep is not None:
        pre_i = imp.call("add", [pre_i, imp.call("multiply", [peep[0], c])])
        pre_f = imp.call("add", [pre_f, imp.call("multiply", [peep[2], c])])
    i = _gate(imp, layer, f, pre_i)
    forget = (imp.call("subtract", [imp.const(1, layer.dtype), i]) if layer.input_forget
              else _gate(imp, layer, f, pre_f))
    cell = imp.call("add", [imp.call("multiply", [forget, c]), imp.call("multiply", [i, _gate(imp, layer, g, pre_c)])])
    if peep is not None:
        pre_o = imp.call("add", [pre_o, imp.call("multiply", [peep[1], cell])])
    o = _gate(imp, layer, f, pre_o)
    return imp.call("multiply", [o, hact(imp, cell)]), cell


def _state(imp: Importer, initial: Expr | None, direction: int, layer: _Layer) -> Expr:
    if initial is None:
        return imp.const(np.zeros((layer.batch, layer.hidden)), layer.dtype)
    return _pick(imp, initial, direction)


def _step_masks(imp: Importer, lens: Expr | None, seq: int, batch: int) -> list[Expr] | None:
    """Per step, `(batch, 1)` true where the step is within the sequence; None when every sequence is full."""
    if lens is None:
        return None
    if isinstance(lens, Constant) and bool(np.all(lens.data >= seq)):
        return None
    lens = imp.reshape(imp.cast(lens, "int32"), [batch, 1])
    return [imp.call("less", [imp.const(t, "int32"), lens]) for t in range(seq)]


def _loop_kernel_fits(node: OnnxNode, acts: list[Activation], clip: float | None, masks: list[Expr] | None,
                      peepholes: Expr | None, dtype: str) -> bool:
    """Whether an LSTM runs as one `nn.lstm_sequence` (its steps looped inside one kernel): float32, the default
    gates, no clip, peepholes, coupled input-forget gate or sequence shorter than the input."""
    return (dtype == "float32" and all(a.name == want for a, want in zip(acts, ["sigmoid", "tanh", "tanh"] * 2))
            and clip is None and masks is None and peepholes is None and not node.attrs.get("input_forget", 0))


def _lstm_sequence(imp: Importer, x2d: Expr, w: Expr, r: Expr, b: Expr | None, initial_h: Expr | None,
                   initial_c: Expr | None, seq: int, batch: int, hidden: int,
                   reverse: list[bool]) -> tuple[Expr, Expr, Expr]:
    """`Y (seq, directions, batch, hidden)`, `Y_h` and `Y_c` of an LSTM as one `nn.lstm_sequence`: the input
    projection of both directions and every step is one dense, the steps one kernel."""
    directions, gates = len(reverse), 4 * hidden
    input_size = imp.static_shape(x2d)[1]
    proj = imp.call("nn.dense", [x2d, imp.reshape(w, [directions * gates, input_size])])
    panel = min(LSTM_PANEL, gates)
    panels = -(-gates // panel)
    if panels * panel > gates:  # zero columns fill the last panel
        r = imp.call("concatenate", [Tuple((r, imp.const(np.zeros((directions, panels * panel - gates, hidden)),
                                                            "float32")))], axis=1)
    rp = imp.call("transpose", [imp.reshape(r, [directions, panels, panel, hidden])], axes=[0, 1, 3, 2])
    return lstm_loop(imp, proj, b, LSTM_SEQUENCE, [rp], initial_h, initial_c, seq, batch, hidden, reverse)


def lstm_loop(imp: Importer, proj: Expr, b: Expr | None, op: str, weights: list[Expr], initial_h: Expr | None,
              initial_c: Expr | None, seq: int, batch: int, hidden: int,
              reverse: list[bool]) -> tuple[Expr, Expr, Expr]:
    """`Y`, `Y_h` and `Y_c` of an LSTM whose steps run as one call of `op` (`nn.lstm_sequence` or
    `nn.lstm_sequence_int8`, its packed recurrent weights `weights`), from the float32 input projection `proj
    (seq * batch, directions * 4 * hidden)` of every step and direction, before the biases `b`."""
    directions, gates = len(reverse), 4 * hidden
    if b is not None:  # W's and R's biases, summed once
        halves = imp.reshape(b, [directions, 2, gates])
        summed = imp.call("add", [imp.call("strided_slice", [halves], begin=[k], end=[k + 1], axes=[1])
                                  for k in range(2)])
        proj = imp.call("add", [proj, imp.reshape(summed, [directions * gates])])
    xp = imp.reshape(proj, [seq, batch, directions, gates])
    zeros = imp.const(np.zeros((directions, batch, hidden)), "float32")
    h0 = initial_h if initial_h is not None else zeros
    c0 = initial_c if initial_c is not None else zeros
    out = imp.call(op, [xp, *weights, h0, c0], hidden=hidden, reverse=[int(v) for v in reverse])
    y = imp.call("strided_slice", [out], begin=[0], end=[hidden], axes=[3])

    def last(start: int) -> Expr:
        """The state after each direction's last step (step 0 for a reverse direction), `(directions, batch, H)`."""
        parts = [imp.call("strided_slice", [out], begin=[0 if rev else seq - 1, d, start],
                          end=[1 if rev else seq, d + 1, start + hidden], axes=[0, 1, 3])
                 for d, rev in enumerate(reverse)]
        both = parts[0] if len(parts) == 1 else imp.call("concatenate", [Tuple(tuple(parts))], axis=1)
        return imp.reshape(both, [directions, batch, hidden])

    return y, last(0), last(hidden)


@dataclass(frozen=True)
class LstmShape:
    """An LSTM node's inputs brought to layout 0, its sizes, and whether its steps fit one looped kernel."""

    x2d: Expr  # (seq * batch, input)
    seq: int
    batch: int
    hidden: int
    reverse: list[bool]  # per direction
    initial_h: Expr | None  # (directions, batch, hidden)
    initial_c: Expr | None
    layout: int
    loop_fits: bool  # `_loop_kernel_fits`


def _sequence_input(imp: Importer, node: OnnxNode) -> tuple[Expr, int, str, int]:
    """A recurrent node's X in (seq, batch, input) order (transposed from `layout` 1), its layout, direction and
    number of directions, each checked."""
    x = node.required(0)
    layout = int(node.attrs.get("layout", 0))
    if layout not in (0, 1):
        raise OnnxModelError(f"layout {layout} (expected 0 or 1)")
    if imp.rank(x) != 3:
        raise OnnxModelError(f"X must have rank 3, got shape {imp.shape(x)}")
    if layout:
        x = imp.call("transpose", [x], axes=[1, 0, 2])
    direction = node.attr_str("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise OnnxModelError(f"direction {direction!r} (expected forward, reverse or bidirectional)")
    return x, layout, direction, 2 if direction == "bidirectional" else 1


def lstm_shape(imp: Importer, node: OnnxNode, hidden: int) -> LstmShape:
    """What `nn.lstm_sequence` and its int8 twin need of an LSTM-like node (X, sequence_lens, initial_h,
    initial_c, P at inputs 0, 4 to 7; `hidden_size`, `direction`, `layout`, activations, `clip`)."""
    x, layout, direction, directions = _sequence_input(imp, node)
    seq, batch, input_size = imp.static_shape(x, "X")
    acts = activations(node, ["Sigmoid", "Tanh", "Tanh"], directions)
    clip = node.attr_float("clip", 0.0) if "clip" in node.attrs else None
    initial_h, initial_c = node.input(5), node.input(6)
    if layout:  # initial states come as (batch, directions, hidden)
        initial_h = imp.call("transpose", [initial_h], axes=[1, 0, 2]) if initial_h is not None else None
        initial_c = imp.call("transpose", [initial_c], axes=[1, 0, 2]) if initial_c is not None else None
    masks = _step_masks(imp, node.input(4), seq, batch)
    fits = _loop_kernel_fits(node, acts, clip, masks, node.input(7), imp.dtype(x))
    reverse = [direction == "reverse" or d == 1 for d in range(directions)]
    return LstmShape(imp.reshape(x, [seq * batch, input_size]), seq, batch, hidden, reverse, initial_h, initial_c,
                     layout, fits)


def _recurrent(imp: Importer, node: OnnxNode, kind: str) -> list[Expr]:
    gates, defaults = {"RNN": (1, ["Tanh"]), "GRU": (3, ["Sigmoid", "Tanh"]),
                       "LSTM": (4, ["Sigmoid", "Tanh", "Tanh"])}[kind]
    w, r = node.required(1), node.required(2)
    x, layout, direction, directions = _sequence_input(imp, node)
    seq, batch, input_size = imp.static_shape(x, "X")
    w_shape, r_shape = imp.static_shape(w, "W"), imp.static_shape(r, "R")
    hidden = int(node.attrs.get("hidden_size", r_shape[-1]))
    if w_shape != (directions, gates * hidden, input_size) or r_shape != (directions, gates * hidden, hidden):
        raise OnnxModelError(f"W {w_shape} and R {r_shape} do not fit {directions} direction(s) of {gates} gate(s) "
                             f"of hidden size {hidden} over inputs of size {input_size}")
    dtype = imp.dtype(x)
    acts = activations(node, defaults, directions)
    clip = node.attr_float("clip", 0.0) if "clip" in node.attrs else None
    b, lens, initial_h = node.input(3), node.input(4), node.input(5)
    initial_c = node.input(6) if kind == "LSTM" else None
    peepholes = node.input(7) if kind == "LSTM" else None
    if layout:  # initial states come as (batch, directions, hidden)
        initial_h = imp.call("transpose", [initial_h], axes=[1, 0, 2]) if initial_h is not None else None
        initial_c = imp.call("transpose", [initial_c], axes=[1, 0, 2]) if initial_c is not None else None
    masks = _step_masks(imp, lens, seq, batch)
    x2d = imp.reshape(x, [seq * batch, input_size])
    if kind == "LSTM" and _loop_kernel_fits(node, acts, clip, masks, peepholes, dtype):
        looped = _lstm_sequence(imp, x2d, w, r, b, initial_h, initial_c, seq, batch, hidden,
                                [direction == "reverse" or d == 1 for d in range(directions)])
        return in_layout(imp, *looped, layout)

    ys, hs, cs = [], [], []
    for d in range(directions):
        layer = _Layer(kind, hidden, batch, dtype, acts[d * len(defaults):(d + 1) * len(defaults)], clip,
                       bool(node.attrs.get("input_forget", 0)), bool(node.attrs.get("linear_before_reset", 0)))
        w_d, r_d = _pick(imp, w, d), _pick(imp, r, d)
        proj = imp.call("nn.dense", [x2d, w_d])  # all steps at once: (seq * batch, gates * hidden)
        rb_h: Expr | None = None
        if b is not None:
            b_d = _pick(imp, b, d)
            wb = imp.call("strided_slice", [b_d], begin=[0], end=[gates * hidden], axes=[0])
            rb = imp.call("strided_slice", [b_d], begin=[gates * hidden], end=[2 * gates * hidden], axes=[0])
            if kind == "GRU" and layer.linear_before_reset:
                # R's bias of the candidate gate is multiplied by the reset gate: it stays in the step
                rb_h = imp.call("strided_slice", [rb], begin=[2 * hidden], end=[3 * hidden], axes=[0])
                rb = imp.call("concatenate", [Tuple((
                    imp.call("strided_slice", [rb], begin=[0], end=[2 * hidden], axes=[0]),
                    imp.const(np.zeros(hidden), dtype)))], axis=0)
            proj = imp.call("add", [proj, imp.call("add", [wb, rb])])
        proj = imp.reshape(proj, [seq, batch, gates * hidden])
        h = _state(imp, initial_h, d, layer)
        c = _state(imp, initial_c, d, layer) if kind == "LSTM" else None
        peep: tuple[Expr, Expr, Expr] | None = None
        if peepholes is not None:  # P holds the input, output and forget gates' weights
            p_d = _pick(imp, peepholes, d)
            p_i, p_o, p_f = (imp.call("strided_slice", [p_d], begin=[k * hidden], end=[(k + 1) * hidden], axes=[0])
                             for k in range(3))
            peep = (p_i, p_o, p_f)
        reverse = direction == "reverse" or d == 1
        outputs: list[Expr | None] = [None] * seq
        for t in (reversed(range(seq)) if reverse else range(seq)):
            xt = _pick(imp, proj, t)
            new_c: Expr | None = None
            if kind == "RNN":
                new_h = _rnn_step(imp, layer, xt, h, r_d)
            elif kind == "GRU":
                new_h = _gru_step(imp, layer, xt, h, r_d, rb_h)
            else:
                assert c is not None
                new_h, new_c = _lstm_step(imp, layer, xt, h, c, r_d, peep)
            if masks is None:
                h, c, outputs[t] = new_h, new_c, new_h
            else:
                h = imp.call("where", [masks[t], new_h, h])
                if new_c is not None and c is not None:
                    c = imp.call("where", [masks[t], new_c, c])
                outputs[t] = imp.call("where", [masks[t], new_h, imp.const(0, dtype)])
        ys.append(imp.call("stack", [Tuple(tuple(o for o in outputs if o is not None))], axis=0))  # (seq, batch, H)
        hs.append(h)
        if c is not None:
            cs.append(c)

    y = imp.call("stack", [Tuple(tuple(ys))], axis=1)  # (seq, directions, batch, hidden)
    y_h = imp.call("stack", [Tuple(tuple(hs))], axis=0)  # (directions, batch, hidden)
    y_c = imp.call("stack", [Tuple(tuple(cs))], axis=0) if cs else None
    return in_layout(imp, y, y_h, y_c, layout)


def in_layout(imp: Importer, y: Expr, y_h: Expr, y_c: Expr | None, layout: int) -> list[Expr]:
    """The node's outputs from `Y (seq, directions, batch, hidden)` and the states `(directions, batch, hidden)`:
    with `layout` 1, Y as (batch, seq, directions, hidden) and the states as (batch, directions, hidden)."""
    if layout:
        y = imp.call("transpose", [y], axes=[2, 0, 1, 3])
        y_h = imp.call("transpose", [y_h], axes=[1, 0, 2])
        y_c = imp.call("transpose", [y_c], axes=[1, 0, 2]) if y_c is not None else None
    return [y, y_h] if y_c is None else [y, y_h, y_c]


@converts("RNN", newest=REVIEWED_OPSET)
def _rnn(imp: Importer, node: OnnxNode) -> list[Expr]:
    return _recurrent(imp, node, "RNN")


@converts("GRU", newest=REVIEWED_OPSET)
def _gru(imp: Importer, node: OnnxNode) -> list[Expr]:
    return _recurrent(imp, node, "GRU")


@converts("LSTM", newest=REVIEWED_OPSET)
def _lstm(imp: Importer, node: OnnxNode) -> list[Expr]:
    return _recurrent(imp, node, "LSTM")
