"""The transformer operators of the newer ONNX opsets: SwiGLU, TensorScatter, CausalConvWithState,
LinearAttention, ai.onnx.preview FlexAttention, and float16 Attention / Softmax.

Each case is one node on random non-zero data of odd shapes, run by relay-tune twice (the reference interpreter
and the compiled model) and compared with `onnx.reference.ReferenceEvaluator`, and with onnxruntime where it has
a kernel for the operator. Bad attributes and shapes must raise relay-tune errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from relay_tune import build
from relay_tune.errors import RelayTuneError
from relay_tune.frontend import from_onnx
from relay_tune.frontend.onnx import supported_ops
from relay_tune.interpreter import evaluate
from relay_tune.text import print_module

RNG = np.random.default_rng(7)
PREVIEW = "ai.onnx.preview"


def rand(*shape: int, dtype: str = "float32", low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return RNG.uniform(low, high, size=shape).astype(dtype)


@dataclass
class Case:
    """One node `op(inputs..., **attrs)` with `outputs` outputs; None in `inputs` omits an optional input."""

    op: str
    inputs: list[tuple[str, np.ndarray | None]]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 27
    outputs: int = 1
    domain: str = ""
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # inputs given as initializers
    onnxruntime: bool = False  # compare with onnxruntime as well
    reference: bool = True  # compare with onnx.reference (its Softmax before opset 13 does not coerce to 2-D)
    rtol: float = 1e-5
    atol: float = 1e-5

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        return {n: a for n, a in self.inputs if a is not None and n not in self.consts}

    def model(self) -> onnx.ModelProto:
        names = [n if a is not None else "" for n, a in self.inputs]
        while names and not names[-1]:
            names.pop()
        outs = [f"y{i}" for i in range(self.outputs)]
        graph = helper.make_graph(
            [helper.make_node(self.op, names, outs, domain=self.domain, **self.attrs)], "case",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in self.feeds.items()],
            [helper.make_empty_tensor_value_info(o) for o in outs],
            initializer=[numpy_helper.from_array(a, n) for n, a in self.consts.items()],
        )
        imports = [helper.make_opsetid("", self.opset)]
        if self.domain:
            imports.append(helper.make_opsetid(self.domain, 1))
        model = helper.make_model(graph, opset_imports=imports)
        model.ir_version = 10
        return model


def check(case: Case) -> None:
    model = case.model()
    oracles = []
    if case.reference:
        oracles.append(("reference", [np.asarray(w) for w in ReferenceEvaluator(model).run(None, case.feeds)]))
    if case.onnxruntime:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        oracles.append(("onnxruntime", [np.asarray(w) for w in session.run(None, case.feeds)]))
    wants = oracles[0][1]
    mod, _ = from_onnx(model)
    interpreted = evaluate(mod, case.feeds)
    compiled = build(mod, "llvm").run(**case.feeds)
    for how, result in (("interpreter", interpreted), ("compiled", compiled)):
        gots = [np.asarray(r) for r in result] if isinstance(result, tuple) else [np.asarray(result)]
        assert len(gots) == len(wants), how
        for oracle, expected in oracles:
            for index, (got, want) in enumerate(zip(gots, expected)):
                assert got.dtype == want.dtype and got.shape == want.shape, (how, oracle, index, got.shape, want.shape)
                assert np.isfinite(got).all() or not np.isfinite(want).all(), (how, index)
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=case.rtol,
                                           atol=case.atol, err_msg=f"{how} vs {oracle}, output {index}")


def P(id: str, case: Case) -> Any:
    return pytest.param(case, id=id)


# --- SwiGLU ---------------------------------------------------------------------------------------

SWIGLU = [
    P("default", Case("SwiGLU", [("a", rand(3, 5, 7, low=-4, high=4)), ("b", rand(3, 5, 7))], opset=28)),
    P("alpha", Case("SwiGLU", [("a", rand(2, 9, low=-4, high=4)), ("b", rand(2, 9))], {"alpha": 1.702}, opset=28)),
    P("fp16", Case("SwiGLU", [("a", rand(4, 7, dtype="float16")), ("b", rand(4, 7, dtype="float16"))],
                   {"alpha": 0.5}, opset=28, rtol=1e-3, atol=1e-3)),
]

# --- TensorScatter --------------------------------------------------------------------------------

TENSOR_SCATTER = [
    P("prefill", Case("TensorScatter", [("past", rand(2, 3, 7, 5)), ("update", rand(2, 3, 4, 5))], opset=24,
                      onnxruntime=True)),
    P("decode-indices", Case("TensorScatter", [("past", rand(3, 2, 6, 3)), ("update", rand(3, 2, 1, 3)),
                                               ("idx", np.array([0, 5, 2], np.int64))], opset=24, onnxruntime=True)),
    P("circular-axis1", Case("TensorScatter", [("past", rand(2, 5, 3)), ("update", rand(2, 3, 3)),
                                               ("idx", np.array([4, 7], np.int64))],
                             {"mode": "circular", "axis": 1}, opset=24, onnxruntime=True)),
    P("axis-last", Case("TensorScatter", [("past", rand(2, 3, 9)), ("update", rand(2, 3, 2)),
                                          ("idx", np.array([7, 1], np.int64))], {"axis": -1}, opset=24)),
]

# --- CausalConvWithState --------------------------------------------------------------------------


def conv(b: int, c: int, length: int, k: int, *, bias: bool = False, past: bool = False, dtype: str = "float32",
         **attrs: Any) -> Case:
    loose = dtype == "float16"
    return Case("CausalConvWithState", [
        ("x", rand(b, c, length, dtype=dtype)), ("w", rand(c, 1, k, dtype=dtype)),
        ("bias", rand(c, dtype=dtype) if bias else None), ("past", rand(b, c, k - 1, dtype=dtype) if past else None),
    ], attrs, outputs=2, onnxruntime=not loose, rtol=3e-3 if loose else 1e-5, atol=3e-3 if loose else 1e-5)


CAUSAL_CONV = [
    P("plain", conv(2, 3, 7, 4)),
    P("bias-past-silu", conv(3, 5, 6, 3, bias=True, past=True, activation="silu")),
    P("swish-short-input", conv(1, 4, 2, 5, past=True, activation="swish")),
    P("decode", conv(2, 6, 1, 4, bias=True, past=True)),
    P("k1", conv(2, 3, 5, 1, bias=True)),
    P("fp16-silu", conv(2, 3, 9, 3, bias=True, past=True, dtype="float16", activation="silu")),
]

# --- LinearAttention ------------------------------------------------------------------------------


def linear(rule: str, b: int, t: int, hq: int, hkv: int, dk: int, dv: int, *, past: bool = True,
           decay_per_key: bool = False, beta_heads: int | None = None, dtype: str = "float32",
           **attrs: Any) -> Case:
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    key = rand(b, t, hkv * dk, dtype=dtype)
    if delta:  # the delta rules want unit keys
        heads = key.reshape(b, t, hkv, dk)
        key = (heads / np.linalg.norm(heads, axis=-1, keepdims=True)).reshape(b, t, hkv * dk).astype(dtype)
    decay = -rand(b, t, hkv * (dk if decay_per_key else 1), low=0.05, high=0.6, dtype=dtype) if gated else None
    beta = rand(b, t, beta_heads or hkv, low=0.1, high=0.9, dtype=dtype) if delta else None
    loose = dtype == "float16"
    return Case("LinearAttention", [
        ("q", rand(b, t, hq * dk, dtype=dtype)), ("k", key), ("v", rand(b, t, hkv * dv, dtype=dtype)),
        ("past", rand(b, hkv, dk, dv, dtype=dtype) if past else None), ("decay", decay), ("beta", beta),
    ], {"update_rule": rule, "q_num_heads": hq, "kv_num_heads": hkv, **attrs}, outputs=2, onnxruntime=True,
        rtol=2e-3 if loose else 1e-4, atol=2e-3 if loose else 1e-5)


LINEAR_ATTENTION = [
    P("linear-prefill", linear("linear", 2, 5, 3, 3, 4, 6)),
    P("linear-prefill-gqa-no-past", linear("linear", 1, 6, 4, 2, 3, 5, past=False, scale=0.3)),
    P("linear-decode", linear("linear", 2, 1, 2, 1, 5, 3)),
    # onnxruntime's function body cannot reshape zero tokens; the reference can
    P("gated-delta-no-tokens", replace(linear("gated_delta", 1, 0, 2, 2, 3, 3), onnxruntime=False)),
    P("gated-per-key", linear("gated", 2, 4, 2, 2, 3, 5, decay_per_key=True)),
    P("gated-per-head-gqa", linear("gated", 1, 3, 6, 2, 4, 3)),
    P("linear-chunks-padded", linear("linear", 2, 7, 2, 1, 3, 4, chunk_size=3)),
    P("gated-per-key-chunks-padded", linear("gated", 1, 11, 4, 2, 5, 3, decay_per_key=True, chunk_size=4)),
    P("gated-per-head-chunks", linear("gated", 2, 8, 3, 3, 4, 2, chunk_size=2, past=False)),
    P("delta", linear("delta", 2, 4, 2, 2, 4, 3)),
    P("gated-delta-mqa-beta1", linear("gated_delta", 1, 5, 3, 1, 4, 5, beta_heads=1, past=False)),
    P("delta-chunks-padded", linear("delta", 2, 9, 2, 2, 4, 3, chunk_size=4)),
    P("gated-delta-chunks-gqa", linear("gated_delta", 1, 13, 4, 2, 4, 5, chunk_size=5)),
    P("gated-delta-per-key-decay-chunks", linear("gated_delta", 2, 7, 2, 1, 3, 4, decay_per_key=True, chunk_size=3,
                                                 beta_heads=1)),
    P("gated-delta-long", linear("gated_delta", 1, 40, 2, 2, 8, 8, chunk_size=16, past=False)),
    P("gated-delta-fp16", linear("gated_delta", 2, 3, 2, 2, 4, 4, dtype="float16")),
]


# --- FlexAttention --------------------------------------------------------------------------------


def _mod_graph(name: str, nodes: list[onnx.NodeProto], inits: Sequence[onnx.TensorProto] = (),
               dtype: int = onnx.TensorProto.FLOAT) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info("s", dtype, None)],
                             [helper.make_tensor_value_info("out", dtype, None)], initializer=list(inits))


def _causal_score_mod(length: int, keys: int) -> onnx.GraphProto:
    allowed = np.arange(keys)[None, :] <= np.arange(length)[:, None] + (keys - length)
    return _mod_graph("causal", [helper.make_node("Where", ["allowed", "s", "ninf"], ["out"])],
                      [numpy_helper.from_array(allowed, "allowed"),
                       numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")])


def _tanh_cap(cap: float) -> onnx.GraphProto:
    return _mod_graph("softcap", [helper.make_node("Div", ["s", "c"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
                                  helper.make_node("Mul", ["t", "c"], ["out"])],
                      [numpy_helper.from_array(np.array(cap, np.float32), "c")])


def flex(b: int, hq: int, hkv: int, length: int, keys: int, e: int, ev: int, *, dtype: str = "float32",
         **attrs: Any) -> Case:
    loose = dtype == "float16"
    return Case("FlexAttention", [("Q", rand(b, hq, length, e, dtype=dtype)), ("K", rand(b, hkv, keys, e, dtype=dtype)),
                                  ("V", rand(b, hkv, keys, ev, dtype=dtype))], attrs, opset=26, domain=PREVIEW,
                rtol=2e-3 if loose else 1e-5, atol=2e-3 if loose else 1e-5)


FLEX_ATTENTION = [
    P("plain", flex(2, 3, 3, 5, 7, 4, 6)),
    P("gqa-scale", flex(1, 6, 2, 3, 4, 5, 3, scale=0.2)),
    P("causal-score-mod", flex(2, 2, 1, 4, 6, 3, 5, score_mod=_causal_score_mod(4, 6))),
    P("softcap-and-prob-mod", flex(1, 2, 2, 3, 5, 4, 4, score_mod=_tanh_cap(0.7), prob_mod=_mod_graph(
        "halve", [helper.make_node("Mul", ["s", "h"], ["out"])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "h")]))),
    P("fp16", flex(2, 2, 2, 3, 5, 8, 4, dtype="float16")),
    P("fp16-softmax-in-fp16", flex(1, 2, 1, 4, 3, 4, 4, dtype="float16", softmax_precision=10)),
    P("double", flex(1, 3, 3, 2, 5, 3, 2, dtype="float64")),
]

# --- float16 Attention and Softmax ----------------------------------------------------------------

ATTENTION_FP16 = [
    P("attention-causal", Case("Attention", [("Q", rand(2, 3, 5, 8, dtype="float16", low=0, high=1)),
                                             ("K", rand(2, 3, 7, 8, dtype="float16", low=0, high=1)),
                                             ("V", rand(2, 3, 7, 8, dtype="float16", low=0, high=1))],
                               {"is_causal": 1}, opset=23, rtol=1e-3, atol=1e-4)),
    P("attention-3d-gqa", Case("Attention", [("Q", rand(1, 4, 12, dtype="float16")),
                                             ("K", rand(1, 6, 6, dtype="float16")),
                                             ("V", rand(1, 6, 6, dtype="float16"))],
                               {"q_num_heads": 4, "kv_num_heads": 2}, opset=24, rtol=1e-3, atol=1e-4)),
    # over a middle axis numpy sums float16 step by step in float16: one or two ulps (2 ** -10 each) apart
    P("softmax-axis1", Case("Softmax", [("x", rand(3, 9, 5, dtype="float16", low=-3, high=3))], {"axis": 1},
                            opset=13, rtol=2.5e-3, atol=1e-4)),
    P("softmax-opset11-coerced", Case("Softmax", [("x", rand(2, 3, 4, dtype="float16", low=-3, high=3))],
                                      {"axis": 1}, opset=11, onnxruntime=True, reference=False, rtol=1e-3,
                                      atol=1e-4)),
]

# --- RotaryEmbedding and RMSNormalization at every opset that defines them ----------------------------

POSITIONS = np.array([[0, 5, 2, 7, 1], [3, 3, 6, 0, 4]], np.int64)
LATER_OPSETS = [
    *[P(f"rotary-4d-positions-opset{opset}", Case("RotaryEmbedding", [
        ("x", rand(2, 3, 5, 8)), ("cos", rand(8, 4)), ("sin", rand(8, 4)), ("pos", POSITIONS)], opset=opset))
      for opset in (23, 28)],
    *[P(f"rotary-3d-interleaved-partial-opset{opset}", Case("RotaryEmbedding", [
        ("x", rand(2, 5, 12)), ("cos", rand(2, 5, 2)), ("sin", rand(2, 5, 2))],
        {"interleaved": 1, "num_heads": 2, "rotary_embedding_dim": 4}, opset=opset)) for opset in (23, 26)],
    *[P(f"rms-norm-opset{opset}", Case("RMSNormalization", [("x", rand(3, 5, 7)), ("scale", rand(5, 7))],
                                       {"axis": -2, "epsilon": 1e-3}, opset=opset, rtol=1e-4))
      for opset in (23, 25, 28)],
]


@pytest.mark.parametrize("case", LATER_OPSETS)
def test_rotary_and_rms_norm_at_later_opsets(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", SWIGLU + TENSOR_SCATTER + CAUSAL_CONV + LINEAR_ATTENTION + FLEX_ATTENTION
                         + ATTENTION_FP16)
def test_matches_onnx(case: Case) -> None:
    check(case)


def test_float16_attention_rounds_like_the_reference() -> None:
    """The float16 softmax rounds each step to float16 as the ONNX reference does: the interpreter agrees with it
    exactly, where a float32-internal softmax is one float16 ulp off on some elements of this input."""
    q, k, v = (np.random.default_rng(0).random((2, 3, 4, 8)).astype(np.float16) for _ in range(3))
    case = Case("Attention", [("Q", q), ("K", k), ("V", v)], {"is_causal": 1}, opset=23)
    want = ReferenceEvaluator(case.model()).run(None, case.feeds)[0]
    mod, _ = from_onnx(case.model())
    np.testing.assert_array_equal(np.asarray(evaluate(mod, case.feeds)), want)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_prefill_is_chunked(rule: str) -> None:
    """Every rule runs chunk-parallel: the batch matmuls grow with the chunks (a few a chunk), not the tokens."""
    counts = []
    for steps in (16, 64, 112):
        mod, _ = from_onnx(linear(rule, 1, steps, 2, 2, 3, 3, chunk_size=16).model())
        counts.append(print_module(mod).count("nn.batch_matmul("))
    per_chunk = (counts[1] - counts[0]) // 3
    assert counts[1] - counts[0] == counts[2] - counts[1] == 3 * per_chunk, counts
    assert per_chunk == (4 if "delta" in rule else 1), counts


BAD = [
    P("swiglu-shapes", Case("SwiGLU", [("a", rand(2, 3)), ("b", rand(3))], opset=28)),
    P("scatter-mode", Case("TensorScatter", [("p", rand(2, 4, 3)), ("u", rand(2, 1, 3))], {"mode": "ring"},
                           opset=24)),
    P("scatter-axis0", Case("TensorScatter", [("p", rand(2, 4, 3)), ("u", rand(2, 4, 3))], {"axis": 0}, opset=24)),
    P("scatter-too-long", Case("TensorScatter", [("p", rand(2, 4, 3)), ("u", rand(2, 5, 3))], {"axis": 1},
                               opset=24)),
    P("conv-activation", Case("CausalConvWithState", [("x", rand(1, 2, 3)), ("w", rand(2, 1, 2))],
                              {"activation": "gelu"}, outputs=2)),
    P("conv-weight", Case("CausalConvWithState", [("x", rand(1, 2, 3)), ("w", rand(3, 1, 2))], outputs=2)),
    P("linear-rule", Case("LinearAttention", [("q", rand(1, 2, 4)), ("k", rand(1, 2, 4)), ("v", rand(1, 2, 4))],
                          {"update_rule": "mamba", "q_num_heads": 1, "kv_num_heads": 1}, outputs=2)),
    P("linear-heads", Case("LinearAttention", [("q", rand(1, 2, 6)), ("k", rand(1, 2, 6)), ("v", rand(1, 2, 6))],
                           {"update_rule": "linear", "q_num_heads": 3, "kv_num_heads": 2}, outputs=2)),
    P("linear-missing-decay", Case("LinearAttention", [("q", rand(1, 2, 4)), ("k", rand(1, 2, 4)),
                                                       ("v", rand(1, 2, 4))],
                                   {"update_rule": "gated", "q_num_heads": 1, "kv_num_heads": 1}, outputs=2)),
    P("flex-rank", Case("FlexAttention", [("Q", rand(2, 3, 4)), ("K", rand(2, 3, 4)), ("V", rand(2, 3, 4))],
                        opset=26, domain=PREVIEW)),
    P("flex-unsupported-score-mod", Case("FlexAttention", [("Q", rand(1, 1, 2, 4)), ("K", rand(1, 1, 2, 4)),
                                                           ("V", rand(1, 1, 2, 4))], {"score_mod": _mod_graph(
        "tfidf", [helper.make_node("TfIdfVectorizer", ["s"], ["out"])])}, opset=26, domain=PREVIEW)),
    P("flex-default-domain", Case("FlexAttention", [("Q", rand(1, 1, 2, 4)), ("K", rand(1, 1, 2, 4)),
                                                    ("V", rand(1, 1, 2, 4))], opset=26)),
    P("flex-heads", Case("FlexAttention", [("Q", rand(1, 3, 2, 4)), ("K", rand(1, 2, 2, 4)), ("V", rand(1, 2, 2, 4))],
                         opset=26, domain=PREVIEW)),
]


def test_preview_operators_are_listed_with_their_domain() -> None:
    ops = supported_ops()
    assert "ai.onnx.preview.FlexAttention" in ops and "FlexAttention" not in ops
    assert {"SwiGLU", "TensorScatter", "CausalConvWithState", "LinearAttention", "Attention"} <= set(ops)


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_a_clear_error(case: Case) -> None:
    with pytest.raises(RelayTuneError):
        from_onnx(case.model())
