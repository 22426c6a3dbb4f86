"""The ONNX Attention operator (opsets 23 to 25) as a composition of batch matmuls, softmax and masks.

Q, K and V come as `(batch, heads, seq, head_size)` or as `(batch, seq, heads * head_size)` with
`q_num_heads` / `kv_num_heads`. `past_key` / `past_value` are concatenated in front of K and V (and returned
as the present cache); grouped-query heads share each K/V head among `q_heads / kv_heads` query heads.

The mask that does not depend on run-time values (the causal frontier with its cache offset, the sliding
window, the padding given by a constant `nonpad_kv_seqlen`) is built at import time as one constant bias
of 0 and -inf; `attn_mask` (boolean: allowed positions; float: added) is combined with it at run time.
A query row with no allowed key yields zeros, not NaN. The fourth output holds the scores after softcap
(modes 0 and 1), with the bias (mode 2) or the probabilities (mode 3).
"""

from __future__ import annotations

import math

import numpy as np

from relay_tune.frontend.onnx_importer import (
    Importer,
    OnnxModelError,
    OnnxNode,
    batch_matmul,
    onnx_softmax,
    relay_dtype,
)
from relay_tune.frontend.onnx_registry import REVIEWED_OPSET, converts
from relay_tune.ir.expr import Expr, Tuple


def _to_heads(imp: Importer, x: Expr, heads: int | None, what: str) -> Expr:
    """A 3-D `(batch, seq, heads * size)` tensor as `(batch, heads, seq, size)`; 4-D tensors unchanged."""
    shape = imp.static_shape(x, what)
    if len(shape) == 4:
        return x
    if len(shape) != 3 or not heads or shape[2] % heads:
        raise OnnxModelError(f"{what} of shape {shape} needs rank 4, or rank 3 with a head count dividing its last "
                             "axis")
    split = imp.reshape(x, [shape[0], shape[1], heads, shape[2] // heads])
    return imp.call("transpose", [split], axes=[0, 2, 1, 3])


def _structural_bias(node: OnnxNode, batch: int, queries: int, keys: int, past: int,
                     nonpad: list[int] | None) -> np.ndarray | None:
    """The import-time part of the bias, (batch or 1, 1, queries, keys) of 0 and -inf; None when all is allowed."""
    query = np.arange(queries).reshape(1, queries, 1)
    key = np.arange(keys).reshape(1, 1, keys)
    # the count of valid keys before the query block: per batch for an external cache
    offset = (np.asarray(nonpad) - queries).reshape(-1, 1, 1) if nonpad is not None and not past else np.full(
        (1, 1, 1), past)
    allowed = np.ones((offset.shape[0], queries, keys), bool)
    if int(node.attrs.get("is_causal", 0)):
        allowed &= key <= query + offset
    distance = query + offset - key
    left, right = int(node.attrs.get("left_window_size", -1)), int(node.attrs.get("right_window_size", -1))
    if left >= 0:
        allowed &= distance <= left
    if right >= 0:
        allowed &= -distance <= right
    if nonpad is not None:
        allowed &= key < np.asarray(nonpad).reshape(-1, 1, 1)
    if allowed.all():
        return None
    return np.where(allowed, 0.0, -np.inf)[:, None]


def _mask_bias(imp: Importer, mask: Expr, keys: int, dtype: str) -> Expr:
    """`attn_mask` as an additive bias in `dtype`, its last axis padded to `keys` with -inf."""
    if imp.dtype(mask) == "bool":
        mask = imp.call("where", [mask, imp.const(0, dtype), imp.const(-np.inf, dtype)])
    else:
        mask = imp.cast(mask, dtype)
    shape = imp.static_shape(mask, "attn_mask")
    if shape[-1] < keys:
        widths = [[0, 0]] * (len(shape) - 1) + [[0, keys - shape[-1]]]
        mask = imp.call("nn.pad", [mask, imp.const(-np.inf, dtype)], pad_width=widths)
    return mask


def _repeat_heads(imp: Importer, x: Expr, repeats: int) -> Expr:
    """(B, H, T, D) -> (B, H * repeats, T, D), each head repeated `repeats` times in place."""
    if repeats == 1:
        return x
    b, h, t, d = imp.static_shape(x)
    spread = imp.call("broadcast_to", [imp.reshape(x, [b, h, 1, t, d])], shape=[b, h, repeats, t, d])
    return imp.reshape(spread, [b, h * repeats, t, d])


@converts("Attention", newest=REVIEWED_OPSET)
def _attention(imp: Importer, node: OnnxNode) -> list[Expr]:
    q_heads_attr, kv_heads_attr = node.attrs.get("q_num_heads"), node.attrs.get("kv_num_heads")
    q = _to_heads(imp, node.required(0), q_heads_attr, "Q")
    k = _to_heads(imp, node.required(1), kv_heads_attr, "K")
    v = _to_heads(imp, node.required(2), kv_heads_attr, "V")
    three_d = imp.rank(node.required(0)) == 3
    dtype = imp.dtype(q)
    past_key, past_value = node.input(4), node.input(5)
    if (past_key is None) != (past_value is None):
        raise OnnxModelError("past_key and past_value must be given together")
    past = 0
    if past_key is not None and past_value is not None:
        past = imp.static_shape(past_key, "past_key")[2]
        k = imp.call("concatenate", [Tuple((past_key, k))], axis=2)
        v = imp.call("concatenate", [Tuple((past_value, v))], axis=2)
    present_key, present_value = k, v
    batch, q_heads, queries, head_size = imp.static_shape(q, "Q")
    kv_heads, keys = imp.static_shape(k, "K")[1:3]
    if q_heads % kv_heads:
        raise OnnxModelError(f"{q_heads} query heads cannot share {kv_heads} key/value heads")
    nonpad = imp.static_ints(node.input(6), "the nonpad_kv_seqlen input") if node.input(6) is not None else None

    scale = node.attr_float("scale", 1.0 / math.sqrt(head_size))
    root = math.sqrt(scale)
    k = _repeat_heads(imp, k, q_heads // kv_heads)
    v = _repeat_heads(imp, v, q_heads // kv_heads)
    scores = batch_matmul(imp, imp.scalar_op("multiply", q, root),
                           imp.call("transpose", [imp.scalar_op("multiply", k, root)], axes=[0, 1, 3, 2]))
    softcap = node.attr_float("softcap", 0.0)
    if softcap > 0:
        scores = imp.scalar_op("multiply", imp.call("tanh", [imp.scalar_op("divide", scores, softcap)]), softcap)
    capped = scores

    bias: Expr | None = None
    structural = _structural_bias(node, batch, queries, keys, past, nonpad)
    if structural is not None:
        bias = imp.const(structural, dtype)
    if node.input(3) is not None:
        mask = _mask_bias(imp, node.required(3), keys, dtype)
        bias = mask if bias is None else imp.call("add", [bias, mask])
    if bias is not None:
        scores = imp.call("add", [scores, bias])

    precision = node.attrs.get("softmax_precision")
    soft_dtype = relay_dtype(int(precision), "softmax_precision") if precision is not None else dtype
    probs = onnx_softmax(imp, imp.cast(scores, soft_dtype), 3)
    if bias is not None:
        # A row with no allowed key gets zeros (softmax of all -inf would be NaN).
        row_peak = imp.call("max", [bias], axis=[-1], keepdims=True)
        empty = imp.call("equal", [row_peak, imp.const(-np.inf, dtype)])
        probs = imp.call("where", [empty, imp.const(0, soft_dtype), probs])
    probs = imp.cast(probs, dtype)
    y = batch_matmul(imp, probs, v)
    if three_d:
        dv = imp.static_shape(y)[3]
        y = imp.reshape(imp.call("transpose", [y], axes=[0, 2, 1, 3]), [batch, queries, q_heads * dv])
    mode = int(node.attrs.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise OnnxModelError(f"qk_matmul_output_mode {mode} (expected 0 to 3)")
    qk_output = {0: capped, 1: capped, 2: scores, 3: probs}[mode]
    return [y, present_key, present_value, qk_output]



@converts("RotaryEmbedding", newest=REVIEWED_OPSET)
def _rotary_embedding(imp: Importer, node: OnnxNode) -> Expr:
    x, cos, sin, position_ids = node.required(0), node.required(1), node.required(2), node.input(3)
    in_shape = imp.static_shape(x, "the input")
    if len(in_shape) == 4:  # (batch, heads, seq, size) -> (batch, seq, heads, size)
        x = imp.call("transpose", [x], axes=[0, 2, 1, 3])
    elif len(in_shape) == 3:
        heads = int(node.attrs.get("num_heads", 0))
        if not heads or in_shape[2] % heads:
            raise OnnxModelError(f"a 3-D input of shape {in_shape} needs num_heads dividing its last axis")
        x = imp.reshape(x, [in_shape[0], in_shape[1], heads, in_shape[2] // heads])
    else:
        raise OnnxModelError(f"the input must have rank 3 or 4, got shape {in_shape}")
    size = imp.static_shape(x)[3]
    rotated = int(node.attrs.get("rotary_embedding_dim", 0)) or size
    if position_ids is not None:  # caches indexed by position: (positions, rotated / 2) -> (batch, seq, rotated / 2)
        cos = imp.call("take", [cos, position_ids], axis=0, mode="clip")
        sin = imp.call("take", [sin, position_ids], axis=0, mode="clip")
    cos = imp.call("expand_dims", [cos], axis=2)
    sin = imp.call("expand_dims", [sin], axis=2)
    part = imp.call("strided_slice", [x], begin=[0], end=[rotated], axes=[3]) if rotated < size else x
    interleaved = bool(node.attrs.get("interleaved", 0))
    if interleaved:  # pairs (x[2i], x[2i + 1])
        first = imp.call("strided_slice", [part], begin=[0], end=[rotated], strides=[2], axes=[3])
        second = imp.call("strided_slice", [part], begin=[1], end=[rotated], strides=[2], axes=[3])
    else:  # pairs (x[i], x[i + rotated / 2])
        first = imp.call("strided_slice", [part], begin=[0], end=[rotated // 2], axes=[3])
        second = imp.call("strided_slice", [part], begin=[rotated // 2], end=[rotated], axes=[3])
    real = imp.call("subtract", [imp.call("multiply", [cos, first]), imp.call("multiply", [sin, second])])
    imag = imp.call("add", [imp.call("multiply", [sin, first]), imp.call("multiply", [cos, second])])
    if interleaved:
        pairs = imp.call("concatenate", [Tuple((imp.call("expand_dims", [real], axis=4),
                                                imp.call("expand_dims", [imag], axis=4)))], axis=4)
        out = imp.reshape(pairs, imp.static_shape(part))
    else:
        out = imp.call("concatenate", [Tuple((real, imag))], axis=3)
    if rotated < size:
        rest = imp.call("strided_slice", [x], begin=[rotated], end=[size], axes=[3])
        out = imp.call("concatenate", [Tuple((out, rest))], axis=3)
    if len(in_shape) == 4:
        return imp.call("transpose", [out], axes=[0, 2, 1, 3])
    return imp.reshape(out, list(in_shape))


# ONNX TensorProto element types that FlexAttention's softmax_precision may name.
_SOFTMAX_PRECISIONS = {1: "float32", 10: "float16", 11: "float64"}


def _modifier(imp: Importer, node: OnnxNode, name: str, x: Expr) -> Expr:
    """`x` through the subgraph attribute `name` (score_mod or prob_mod), or unchanged when it is absent."""
    graph = node.attrs.get(name)
    if graph is None:
        return x
    outputs = imp.inline_graph(graph, [x])
    if len(outputs) != 1 or imp.shape(outputs[0]) != imp.shape(x):
        raise OnnxModelError(f"{name} must give one tensor of the shape it takes {imp.shape(x)}")
    return imp.cast(outputs[0], imp.dtype(x))


@converts("ai.onnx.preview.FlexAttention", newest=1)
def _flex_attention(imp: Importer, node: OnnxNode) -> Expr:
    """ai.onnx.preview FlexAttention: scaled dot-product attention with score_mod / prob_mod subgraphs inlined."""
    q, k, v = node.required(0), node.required(1), node.required(2)
    shapes = [imp.static_shape(x, name) for x, name in ((q, "Q"), (k, "K"), (v, "V"))]
    if any(len(s) != 4 for s in shapes):
        raise OnnxModelError(f"Q, K and V must have rank 4, got shapes {shapes}")
    (_, q_heads, _, head_size), (_, kv_heads, keys, k_size), (_, v_heads, v_keys, _) = shapes
    if k_size != head_size or v_heads != kv_heads or v_keys != keys or kv_heads <= 0 or q_heads % kv_heads:
        raise OnnxModelError(f"Q {shapes[0]}, K {shapes[1]} and V {shapes[2]} do not fit (query heads must be a "
                             "multiple of the key/value heads, K and V must agree)")
    dtype = imp.dtype(q)
    precision = node.attrs.get("softmax_precision")
    if precision is not None:
        if int(precision) not in _SOFTMAX_PRECISIONS:
            raise OnnxModelError(f"softmax_precision {precision} (expected FLOAT, FLOAT16 or DOUBLE)")
        soft_dtype = _SOFTMAX_PRECISIONS[int(precision)]
    else:
        soft_dtype = "float32" if dtype == "float16" else dtype
    scale = node.attr_float("scale", 1.0 / math.sqrt(head_size))
    # Q and K are each scaled by sqrt(scale), the root taken in float32 and rounded to the input type.
    root = float(np.asarray(np.sqrt(np.float32(scale)), dtype=dtype))
    k = _repeat_heads(imp, k, q_heads // kv_heads)
    v = _repeat_heads(imp, v, q_heads // kv_heads)
    scores = batch_matmul(imp, imp.scalar_op("multiply", q, root),
                          imp.call("transpose", [imp.scalar_op("multiply", k, root)], axes=[0, 1, 3, 2]))
    scores = _modifier(imp, node, "score_mod", imp.cast(scores, soft_dtype))
    probs = _modifier(imp, node, "prob_mod", onnx_softmax(imp, scores, 3))
    return imp.cast(batch_matmul(imp, probs, imp.cast(v, soft_dtype)), imp.dtype(v))
