"""ONNX converters for the transformer building blocks of the newer opsets: SwiGLU (opset 28), TensorScatter
(opset 24), CausalConvWithState and LinearAttention (opset 27), as compositions of existing Relay operators.

- SwiGLU is `A * sigmoid(alpha * A) * B`.
- TensorScatter writes `update` into the cache at each batch row's write index. It is a gather seen from the
  cache side: cache position `p` of batch row `b` takes update position `p - w[b]` (modulo the cache length in
  circular mode) where that lies in `[0, sequence_length)`, and keeps its old value elsewhere.
- CausalConvWithState is a depthwise `nn.conv1d` over the past state (zeros when absent) concatenated in front
  of the input; the present state is the last `k - 1` positions of that concatenation.
- LinearAttention computes in float32, chunk-parallel (`chunk_size` tokens a chunk) for every update rule: the
  products inside the chunks are batch matmuls over all chunks at once (the delta rules' corrections through the
  WY form, one small triangular solve a chunk), and only the state is handed from chunk to chunk.
"""

from __future__ import annotations

import math

import numpy as np

from relay_tune.frontend.onnx_importer import Importer, OnnxModelError, OnnxNode, batch_matmul, normalize_axis
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Expr, Tuple

# --- SwiGLU ---------------------------------------------------------------------------------------


@converts("SwiGLU", newest=REVIEWED_OPSET)
def _swiglu(imp: Importer, node: OnnxNode) -> Expr:
    gate, value = node.required(0), node.required(1)
    if imp.shape(gate) != imp.shape(value) or imp.dtype(gate) != imp.dtype(value):
        raise OnnxModelError(f"A {imp.tensor(gate)} and B {imp.tensor(value)} must have the same shape and type "
                             "(SwiGLU does not broadcast)")
    alpha = node.attr_float("alpha", 1.0)
    scaled = gate if alpha == 1.0 else imp.scalar_op("multiply", gate, alpha)
    swish = imp.call("multiply", [gate, imp.call("sigmoid", [scaled])])
    return imp.call("multiply", [swish, value])


# --- TensorScatter --------------------------------------------------------------------------------


@converts("TensorScatter", newest=REVIEWED_OPSET)
def _tensor_scatter(imp: Importer, node: OnnxNode) -> Expr:
    past, update, write_indices = node.required(0), node.required(1), node.input(2)
    shape = imp.static_shape(past, "past_cache")
    update_shape = imp.static_shape(update, "update")
    rank = len(shape)
    axis = normalize_axis(int(node.attrs.get("axis", -2)), rank)
    if axis == 0:
        raise OnnxModelError("axis must not be the batch axis 0")
    mode = node.attr_str("mode", "linear")
    if mode not in ("linear", "circular"):
        raise OnnxModelError(f"mode {mode!r} (expected 'linear' or 'circular')")
    if len(update_shape) != rank or any(u != s for d, (u, s) in enumerate(zip(update_shape, shape)) if d != axis) \
            or update_shape[axis] > shape[axis]:
        raise OnnxModelError(f"update of shape {update_shape} does not fit past_cache of shape {shape} "
                             f"(only axis {axis} may be shorter)")
    batch, length, steps = shape[0], shape[axis], update_shape[axis]
    inner, outer = math.prod(shape[1:axis]), math.prod(shape[axis + 1:])
    if steps == 0:
        return past
    positions = imp.const(np.arange(length, dtype=np.int64).reshape(1, length), "int64")
    if write_indices is None:
        source = imp.call("broadcast_to", [positions], shape=[batch, length])
    else:
        start = imp.reshape(imp.cast(write_indices, "int64"), [batch, 1])
        source = imp.call("subtract", [positions, start])  # (batch, length): the update position to read
    if mode == "circular":
        # Python's modulo by `length`: integer `divide` truncates, so shift a negative remainder up.
        cycle = imp.const(length, "int64")
        rem = imp.call("subtract", [source, imp.call("multiply", [imp.call("divide", [source, cycle]), cycle])])
        source = imp.call("where", [imp.call("less", [rem, imp.const(0, "int64")]),
                                    imp.call("add", [rem, cycle]), rem])
    clipped = imp.call("minimum", [imp.call("maximum", [source, imp.const(0, "int64")]),
                                   imp.const(steps - 1, "int64")])
    written = imp.call("equal", [clipped, source])  # the source position lies in [0, steps)
    # Row (b, i, s) of the update seen as (batch * inner * steps, outer) rows, for every (b, i, cache position).
    base = np.arange(batch * inner, dtype=np.int64).reshape(batch, inner, 1) * steps
    rows = imp.call("add", [imp.const(base, "int64"), imp.reshape(clipped, [batch, 1, length])])
    gathered = imp.call("take", [imp.reshape(update, [batch * inner * steps, outer]), rows], axis=0, mode="clip")
    keep = imp.reshape(written, [batch, 1, length, 1])
    out = imp.call("where", [keep, gathered, imp.reshape(past, [batch, inner, length, outer])])
    return imp.reshape(out, list(shape))


# --- CausalConvWithState --------------------------------------------------------------------------


def _silu_f32(imp: Importer, x: Expr) -> Expr:
    """`x * sigmoid(x)` computed in float32 for narrower floats (as the ONNX reference does)."""
    dtype = imp.dtype(x)
    wide = imp.cast(x, "float32") if dtype == "float16" else x
    return imp.cast(imp.call("multiply", [wide, imp.call("sigmoid", [wide])]), dtype)


@converts("CausalConvWithState", newest=REVIEWED_OPSET)
def _causal_conv_with_state(imp: Importer, node: OnnxNode) -> list[Expr]:
    x, weight, bias, past = node.required(0), node.required(1), node.input(2), node.input(3)
    shape = imp.static_shape(x, "the input")
    w_shape = imp.static_shape(weight, "the weight")
    if len(shape) != 3 or len(w_shape) != 3 or w_shape[0] != shape[1] or w_shape[1] != 1:
        raise OnnxModelError(f"input {shape} and weight {w_shape} must be (batch, channels, length) and "
                             "(channels, 1, k)")
    batch, channels, _ = shape
    taps = w_shape[2]
    activation = node.attr_str("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise OnnxModelError(f"activation {activation!r} (expected 'none', 'silu' or 'swish')")
    dtype = imp.dtype(x)
    if past is None:
        past = imp.const(np.zeros((batch, channels, taps - 1)), dtype)
    elif imp.static_shape(past, "past_state") != (batch, channels, taps - 1):
        raise OnnxModelError(f"past_state of shape {imp.static_shape(past)} (expected {(batch, channels, taps - 1)})")
    padded = imp.call("concatenate", [Tuple((past, x))], axis=2) if taps > 1 else x
    out = imp.call("nn.conv1d", [padded, weight], strides=[1], padding=[0, 0], dilation=[1], groups=channels,
                   channels=channels, kernel_size=[taps], data_layout="NCW", kernel_layout="OIW")
    if bias is not None:
        out = imp.call("nn.bias_add", [out, bias], axis=1)
    if activation != "none":
        out = _silu_f32(imp, out)
    total = imp.static_shape(padded)[2]
    present = imp.call("strided_slice", [padded], begin=[total - (taps - 1)], end=[total], axes=[2])
    return [out, present]


# --- LinearAttention ------------------------------------------------------------------------------

_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


def _chunks(imp: Importer, x: Expr, dims: tuple[int, int, int, int], heads: int, width: int) -> Expr:
    """A packed `(B, T, heads * width)` tensor as `(B * heads, N, C, width)` chunks of C tokens, the tail padded
    with zeros to `N * C` tokens (`dims` is `(B, T, N, C)`)."""
    batch, steps, count, size = dims
    if count * size > steps:
        x = imp.call("nn.pad", [x, imp.const(0, imp.dtype(x))], pad_width=[[0, 0], [0, count * size - steps], [0, 0]])
    split = imp.reshape(x, [batch, count, size, heads, width])
    return imp.reshape(imp.call("transpose", [split], axes=[0, 3, 1, 2, 4]), [batch * heads, count, size, width])


def _chunk(imp: Importer, x: Expr, index: int) -> Expr:
    """Chunk `index` of a `(rows, N, ...)` tensor, as `(rows, ...)`."""
    shape = imp.static_shape(x)
    part = imp.call("take", [x, imp.const([index], "int64")], axis=1, mode="clip")  # one workload for every chunk
    return imp.reshape(part, [shape[0], *shape[2:]])


def _decayed_products(imp: Importer, x: Expr, y: Expr, cumulative: Expr | None, mask: np.ndarray) -> Expr:
    """`P[t, s] = sum_d x_t[d] y_s[d] exp(G_t[d] - G_s[d])` where `mask[t, s]`, else 0, for every chunk.

    `x` is `(rows, N, A, C, dk)`, `y` `(rows, N, C, dk)`, `cumulative` (G) `(rows, N, C, w)` with w 1 (one decay
    per head: a batch matmul scaled afterwards) or dk (the decay sits inside the dot product); None is no decay.
    The masked exponents are -inf before `exp`, so a pair the mask drops never overflows. Result `(rows, N, A, C,
    C)`."""
    rows, count, lead, size, d_k = imp.static_shape(x)
    allowed = imp.const(mask, "bool")
    if cumulative is not None and imp.static_shape(cumulative)[3] == d_k:
        g = imp.reshape(cumulative, [rows, count, 1, size, d_k])
        gap = imp.call("subtract", [imp.reshape(g, [rows, count, 1, size, 1, d_k]),
                                    imp.reshape(g, [rows, count, 1, 1, size, d_k])])
        gap = imp.call("where", [imp.reshape(allowed, [size, size, 1]), gap, imp.const(-np.inf, "float32")])
        terms = imp.call("multiply", [imp.reshape(x, [rows, count, lead, size, 1, d_k]),
                                      imp.reshape(y, [rows, count, 1, 1, size, d_k])])
        return imp.call("sum", [imp.call("multiply", [terms, imp.call("exp", [gap])])], axis=[5])
    flat = rows * count
    products = batch_matmul(imp, imp.reshape(x, [flat, lead * size, d_k]),
                            imp.call("transpose", [imp.reshape(y, [flat, size, d_k])], axes=[0, 2, 1]))
    products = imp.reshape(products, [rows, count, lead, size, size])
    if cumulative is None:
        return imp.call("where", [allowed, products, imp.const(0, "float32")])
    g = imp.reshape(cumulative, [rows, count, 1, size])
    gap = imp.call("subtract", [imp.reshape(g, [rows, count, 1, size, 1]), imp.reshape(g, [rows, count, 1, 1, size])])
    return imp.call("multiply", [products, imp.call("exp", [imp.call("where", [allowed, gap,
                                                                               imp.const(-np.inf, "float32")])])])


def _unit_lower_inverse(imp: Importer, strict: Expr) -> Expr:
    """`(I + M)^-1` of strictly lower triangular `M (batch, C, C)`, by forward substitution: row t of the inverse
    is `e_t - M[t, :] @ inverse`, which reads only the rows above it."""
    batch, size, _ = imp.static_shape(strict)
    inverse: Expr = imp.const(np.broadcast_to(np.eye(size), (batch, size, size)), "float32")
    for t in range(1, size):
        # `take` with the row index as a tensor constant: every step is the same workload (one task to tune),
        # where a strided_slice would differ in its attributes
        row = imp.call("take", [strict, imp.const([t], "int64")], axis=1, mode="clip")  # (batch, 1, C)
        unit = imp.const(np.eye(size)[t].reshape(1, 1, size), "float32")
        solved = imp.call("subtract", [unit, batch_matmul(imp, row, inverse)])
        picked = imp.const((np.arange(size) == t).reshape(1, size, 1), "bool")
        inverse = imp.call("where", [picked, solved, inverse])
    return inverse


def _chunked(imp: Importer, inputs: tuple[Expr, Expr, Expr, Expr | None, Expr | None], state: Expr,
             dims: tuple[int, ...], scale: float, chunk_size: int) -> tuple[Expr, Expr]:
    """Every update rule in chunk-parallel form: outputs `(B, T, Hq * dv)` and the final state `(B * Hkv, dk, dv)`.

    Inside a chunk G is the cumulative log decay (per key dimension or per head; 0 without decay), and the
    state the chunk starts from is S. Each token writes `k_t d_t^T` to the state, where d_t is v_t for the
    linear and gated rules; the delta rules' `d_t = beta_t (v_t - retrieved)` solve the unit lower triangular
    system `(I + diag(beta) L) D = diag(beta) (V - exp(G) K S)`, `L[t, s] = k_t . k_s exp(G_t - G_s)` for
    s < t (the WY form), so `D = U - W S` with U and W computed for all chunks at once. Token t reads
    `q_t exp(G_t)` from S plus `sum_{s <= t} (q_t . k_s exp(G_t - G_s)) d_s`, and the chunk leaves the state
    `exp(G_last) S + sum_s (k_s exp(G_last - G_s)) d_s^T`. Every exponent is a decay from an earlier token to a
    later one, so nothing overflows. Only the hand-over of S is sequential: a few batch matmuls a chunk."""
    q, k, v, decay, beta = inputs
    batch, steps, q_heads, kv_heads, d_k, d_v = dims
    group, rows = q_heads // kv_heads, batch * kv_heads
    size = max(1, min(chunk_size, steps))
    count = -(-steps // size)
    shape = (batch, steps, count, size)
    flat = rows * count
    qc = imp.reshape(_chunks(imp, q, shape, q_heads, d_k), [rows, group, count, size, d_k])
    qc = imp.call("transpose", [qc], axes=[0, 2, 1, 3, 4])  # (rows, N, group, C, dk)
    kc, vc = _chunks(imp, k, shape, kv_heads, d_k), _chunks(imp, v, shape, kv_heads, d_v)  # (rows, N, C, d)
    inclusive = np.tril(np.ones((size, size), bool))
    cumulative: Expr | None = None
    q_read, k_write, w_source = qc, kc, kc
    if decay is not None:
        width = imp.static_shape(decay)[2] // kv_heads
        cumulative = imp.call("cumsum", [_chunks(imp, decay, shape, kv_heads, width)], axis=2)  # (rows, N, C, w)
        last = imp.call("strided_slice", [cumulative], begin=[size - 1], end=[size], axes=[2])  # (rows, N, 1, w)
        growth = imp.call("exp", [cumulative])
        q_read = imp.call("multiply", [qc, imp.reshape(growth, [rows, count, 1, size, width])])
        k_write = imp.call("multiply", [kc, imp.call("exp", [imp.call("subtract", [last, cumulative])])])
        w_source = imp.call("multiply", [kc, growth])
        carry = imp.reshape(imp.call("exp", [last]), [rows, count, width, 1])  # the state's decay over a chunk
    reads = _decayed_products(imp, qc, kc, cumulative, inclusive)  # (rows, N, group, C, C)
    reads = imp.reshape(reads, [rows, count, group * size, size])
    q_read = imp.reshape(q_read, [rows, count, group * size, d_k])
    k_write_t = imp.call("transpose", [k_write], axes=[0, 1, 3, 2])  # (rows, N, dk, C)

    if beta is None:  # d = v: the chunks' own contributions do not depend on the state
        local = imp.reshape(batch_matmul(imp, imp.reshape(reads, [flat, group * size, size]),
                                         imp.reshape(vc, [flat, size, d_v])), [rows, count, group * size, d_v])
        writes = imp.reshape(batch_matmul(imp, imp.reshape(k_write_t, [flat, d_k, size]),
                                          imp.reshape(vc, [flat, size, d_v])), [rows, count, d_k, d_v])
    else:
        heads = imp.static_shape(beta)[2]
        rates = _chunks(imp, beta, shape, heads, 1)  # (B * heads, N, C, 1)
        if heads != kv_heads:  # one rate for every head
            rates = imp.reshape(imp.call("broadcast_to", [imp.reshape(rates, [batch, 1, count, size, 1])],
                                         shape=[batch, kv_heads, count, size, 1]), [rows, count, size, 1])
        strict = _decayed_products(imp, imp.reshape(kc, [rows, count, 1, size, d_k]), kc, cumulative,
                                   np.tril(np.ones((size, size), bool), -1))
        system = imp.call("multiply", [imp.reshape(strict, [rows, count, size, size]), rates])
        inverse = _unit_lower_inverse(imp, imp.reshape(system, [flat, size, size]))
        u = imp.reshape(batch_matmul(imp, inverse, imp.reshape(imp.call("multiply", [vc, rates]), [flat, size, d_v])),
                        [rows, count, size, d_v])
        w = imp.reshape(batch_matmul(imp, inverse, imp.reshape(imp.call("multiply", [w_source, rates]),
                                                               [flat, size, d_k])), [rows, count, size, d_k])

    outputs = []
    for n in range(count):
        read = batch_matmul(imp, _chunk(imp, q_read, n), state)  # (rows, group * C, dv)
        if beta is None:
            read = imp.call("add", [read, _chunk(imp, local, n)])
            written = _chunk(imp, writes, n)
        else:
            d = imp.call("subtract", [_chunk(imp, u, n), batch_matmul(imp, _chunk(imp, w, n), state)])
            read = imp.call("add", [read, batch_matmul(imp, _chunk(imp, reads, n), d)])
            written = batch_matmul(imp, _chunk(imp, k_write_t, n), d)
        outputs.append(imp.reshape(read, [rows, 1, group * size, d_v]))
        if decay is not None:
            state = imp.call("multiply", [state, _chunk(imp, carry, n)])
        state = imp.call("add", [state, written])
    out = outputs[0] if count == 1 else imp.call("concatenate", [Tuple(tuple(outputs))], axis=1)
    out = imp.scalar_op("multiply", out, scale)  # (rows, N, group * C, dv)
    out = imp.reshape(out, [batch, kv_heads, count, group, size, d_v])
    out = imp.reshape(imp.call("transpose", [out], axes=[0, 2, 4, 1, 3, 5]), [batch, count * size, q_heads * d_v])
    if count * size > steps:
        out = imp.call("strided_slice", [out], begin=[0], end=[steps], axes=[1])
    return out, state


@converts("LinearAttention", newest=REVIEWED_OPSET)
def _linear_attention(imp: Importer, node: OnnxNode) -> list[Expr]:
    query, key, value, past, decay, beta = (node.input(i) for i in range(6))
    if query is None or key is None or value is None:
        raise OnnxModelError("query, key and value are required")
    rule = node.attr_str("update_rule", "gated_delta")
    if rule not in _UPDATE_RULES:
        raise OnnxModelError(f"update_rule {rule!r} (expected one of {', '.join(_UPDATE_RULES)})")
    q_heads, kv_heads = int(node.attrs.get("q_num_heads", 0)), int(node.attrs.get("kv_num_heads", 0))
    if q_heads <= 0 or kv_heads <= 0 or q_heads % kv_heads:
        raise OnnxModelError(f"q_num_heads ({q_heads}) must be a positive multiple of kv_num_heads ({kv_heads})")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != (decay is not None):
        raise OnnxModelError(f"update_rule {rule!r} {'requires' if gated else 'forbids'} the decay input")
    if delta != (beta is not None):
        raise OnnxModelError(f"update_rule {rule!r} {'requires' if delta else 'forbids'} the beta input")
    shapes = [imp.static_shape(x, name) for x, name in ((query, "query"), (key, "key"), (value, "value"))]
    if any(len(s) != 3 for s in shapes):
        raise OnnxModelError(f"query, key and value must be rank 3 (B, T, H*D), got {shapes}")
    batch, steps, q_width = shapes[0]
    if q_width % q_heads or shapes[2][2] % kv_heads or shapes[1] != (batch, steps, kv_heads * (q_width // q_heads)):
        raise OnnxModelError(f"query {shapes[0]}, key {shapes[1]} and value {shapes[2]} do not split into "
                             f"{q_heads} query and {kv_heads} key/value heads")
    d_k, d_v = q_width // q_heads, shapes[2][2] // kv_heads
    out_dtype = imp.dtype(query)
    state_dtype = imp.dtype(past) if past is not None else out_dtype
    scale = node.attr_float("scale", 0.0) or 1.0 / math.sqrt(d_k)
    q, k, v = (imp.cast(x, "float32") for x in (query, key, value))
    rows = batch * kv_heads
    if past is None:
        state = imp.const(np.zeros((rows, d_k, d_v)), "float32")
    else:
        if imp.static_shape(past, "past_state") != (batch, kv_heads, d_k, d_v):
            raise OnnxModelError(f"past_state of shape {imp.static_shape(past)} (expected "
                                 f"{(batch, kv_heads, d_k, d_v)})")
        state = imp.reshape(imp.cast(past, "float32"), [rows, d_k, d_v])

    if steps == 0:  # no token: nothing to read, the state passes through
        empty = imp.const(np.zeros((batch, 0, q_heads * d_v)), out_dtype)
        return [empty, imp.cast(imp.reshape(state, [batch, kv_heads, d_k, d_v]), state_dtype)]
    if decay is not None:
        decay_shape = imp.static_shape(decay, "decay")
        if len(decay_shape) != 3 or decay_shape[:2] != (batch, steps) or decay_shape[2] not in (kv_heads,
                                                                                                  kv_heads * d_k):
            raise OnnxModelError(f"decay of shape {decay_shape} (expected ({batch}, {steps}, {kv_heads}) or "
                                 f"({batch}, {steps}, {kv_heads * d_k}))")
        decay = imp.cast(decay, "float32")
    if beta is not None:
        beta_shape = imp.static_shape(beta, "beta")
        if len(beta_shape) != 3 or beta_shape[:2] != (batch, steps) or beta_shape[2] not in (kv_heads, 1):
            raise OnnxModelError(f"beta of shape {beta_shape} (expected ({batch}, {steps}, {kv_heads}) or "
                                 f"({batch}, {steps}, 1))")
        beta = imp.cast(beta, "float32")
    chunk_size = int(node.attrs.get("chunk_size", 64))
    output, state = _chunked(imp, (q, k, v, decay, beta), state, (batch, steps, q_heads, kv_heads, d_k, d_v), scale,
                             chunk_size)
    return [imp.cast(output, out_dtype), imp.cast(imp.reshape(state, [batch, kv_heads, d_k, d_v]), state_dtype)]
